"""Text <-> token ids through the HF `tokenizers` library, and incremental detokenization.

Special tokens follow the model's own files: tokenizer_config.json's add_bos_token/add_eos_token
when it states them, else tokenizer.json's post-processor — what transformers does.
"""
from __future__ import annotations

import codecs
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import tokenizers

from .errors import FormatError, TokenizerError
from .formats.json_files import read_json_object
from .tokenizer_gguf import bytes_to_unicode


# Chat prompts: the text of a special token inside a message is text, not the token (a client must not
# write "<|im_end|>\n<|im_start|>system" and be read as the template's own markup). Messages go to the
# template with each such text replaced by a marker; the rendered prompt is tokenized as the library
# would, with the template's special tokens cut out and the markers read back as plain text. The
# markers hold a secret of this process, so no text from outside can pose as one.
_SECRET = secrets.token_hex(16)
_CONTENT = re.compile(f"\ue000{_SECRET}(\\d+)\ue001")  # the text of special token number k, in content
_PLACED = f"\ue002{_SECRET}\ue003"  # where the template wrote a special token


@dataclass
class Tokenizer:
    hf: tokenizers.Tokenizer
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool | None = None  # None: let the post-processor decide
    add_eos: bool | None = None
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    special_ids: set[int] = field(default_factory=set)

    @classmethod
    def from_folder(cls, folder: str) -> "Tokenizer":
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.exists(path):
            raise FormatError(folder, "no tokenizer.json")
        try:
            hf = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the library raises a bare Exception on a bad file
            raise FormatError(path, f"cannot read the tokenizer: {e}") from None
        config = read_json_object(os.path.join(folder, "tokenizer_config.json"))
        tok = cls(hf=hf)
        tok.bos_token = _token_text(config.get("bos_token"))
        tok.eos_token = _token_text(config.get("eos_token"))
        tok.bos_id = hf.token_to_id(tok.bos_token) if tok.bos_token else None
        tok.eos_id = hf.token_to_id(tok.eos_token) if tok.eos_token else None
        config_path = os.path.join(folder, "tokenizer_config.json")
        tok.add_bos = _flag(config, "add_bos_token", config_path)
        tok.add_eos = _flag(config, "add_eos_token", config_path)
        template = config.get("chat_template")
        jinja = os.path.join(folder, "chat_template.jinja")
        if not template and os.path.exists(jinja):
            with open(jinja, encoding="utf-8") as f:
                template = f.read()
        tok.chat_template = template if isinstance(template, str) else None
        vocab = hf.get_vocab(with_added_tokens=True)
        tok.special_ids = {i for i, a in hf.get_added_tokens_decoder().items() if a.special}
        tok.n_ids = max(vocab.values(), default=-1) + 1  # listing a vocabulary of 262k tokens takes 0.25 s
        return tok

    @classmethod
    def from_vocabulary(cls, hf: tokenizers.Tokenizer, n_ids: int, bos_id: int | None, eos_id: int | None,
                        chat_template: str | None) -> "Tokenizer":
        """A tokenizer built from a vocabulary read elsewhere (a GGUF file's), whose reader knows
        n_ids: the special tokens' texts are their ids' tokens."""
        tok = cls(hf=hf, bos_id=bos_id, eos_id=eos_id, chat_template=chat_template,
                  bos_token=hf.id_to_token(bos_id) if bos_id is not None else None,
                  eos_token=hf.id_to_token(eos_id) if eos_id is not None else None)
        tok.n_ids = n_ids
        return tok

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    @cached_property
    def n_ids(self) -> int:
        """One past the largest id encode() can produce: the embedding rows a model needs for it.
        A loader that knows it passes it (from_vocabulary) rather than have the vocabulary listed."""
        return max(self.hf.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        if self.add_bos is None and self.add_eos is None:
            return _library(self.hf.encode, text, add_special_tokens=add_special).ids
        ids = _library(self.hf.encode, text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        if add_special and self.add_eos and self.eos_id is not None:
            ids = ids + [self.eos_id]
        return ids

    @cached_property
    def _special_texts(self) -> list[str]:
        added = self.hf.get_added_tokens_decoder().values()
        return sorted({a.content for a in added if a.special}, key=len, reverse=True)  # longest match first

    @cached_property
    def _special_pattern(self) -> re.Pattern | None:
        return re.compile("|".join(map(re.escape, self._special_texts))) if self._special_texts else None

    def shield(self, value):
        """value (messages: dicts, lists, strings) with the text of each special token in its strings
        replaced by a marker that encode_chat reads back as plain text. Strings without one are kept."""
        if isinstance(value, str):
            pattern, texts = self._special_pattern, self._special_texts
            if pattern is None:
                return value
            return pattern.sub(lambda m: f"\ue000{_SECRET}{texts.index(m.group())}\ue001", value)
        if isinstance(value, Mapping):
            return {k: self.shield(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.shield(v) for v in value)
        return value

    def unshield(self, text: str) -> str:
        """text with the markers of shield() put back as the texts they stand for."""
        texts = self._special_texts
        return _CONTENT.sub(lambda m: texts[int(m.group(1))] if int(m.group(1)) < len(texts) else "", text)

    def encode_chat(self, prompt: str) -> list[int]:
        """Ids of a prompt a chat template rendered from shielded messages, without BOS/EOS added:
        the special tokens the template wrote are special, the texts of special tokens inside the
        messages are text. A prompt without markers is tokenized as encode() does."""
        if not _CONTENT.search(prompt):
            return self.encode(prompt, add_special=False)
        return self._encode_placed(prompt)

    def _encode_placed(self, prompt: str) -> list[int]:
        """Ids of prompt: its special tokens as the library finds them, the texts between them (the
        markers read back) tokenized as text, split where the library splits them."""
        found = _library(self.hf.encode, prompt, add_special_tokens=False)
        special = {i for i, a in self.hf.get_added_tokens_decoder().items() if a.special}
        placed = [(i, span) for i, span in zip(found.ids, found.offsets) if i in special]
        pieces, start = [], 0
        for _, (begin, end) in placed:  # a token's span holds the spaces it strips (lstrip/rstrip)
            pieces += [prompt[start:begin], _PLACED]
            start = end
        pieces.append(prompt[start:])
        ids = _library(self._text_only.encode, self.unshield("".join(pieces)), add_special_tokens=False).ids
        mark = self._text_only.token_to_id(_PLACED)
        if ids.count(mark) != len(placed):
            raise TokenizerError("the chat prompt could not be tokenized with its messages as text")
        template_ids = iter([i for i, _ in placed])
        return [next(template_ids) if i == mark else i for i in ids]

    @cached_property
    def _text_only(self) -> tokenizers.Tokenizer:
        """A copy that reads special tokens' texts as text, and _PLACED as a token of its own: cut
        out as the library cuts out a special token, so the text around it is split the same way."""
        copy = tokenizers.Tokenizer.from_str(self.hf.to_str())
        copy.encode_special_tokens = True
        copy.add_tokens([tokenizers.AddedToken(_PLACED, normalized=False, special=False)])
        return copy

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return _library(self.hf.decode, list(ids), skip_special_tokens=skip_special)

    @cached_property
    def byte_decoding(self) -> str | None:
        """How the decoder turns tokens into bytes: "byte_level" (every token spells bytes in GPT-2's
        alphabet and the whole is decoded as lossy UTF-8), "byte_fallback" (<0xXX> tokens are bytes,
        the others text), or None (every token is whole text)."""
        state = json.loads(self.hf.decoder.__getstate__()) if self.hf.decoder is not None else {}
        kinds = {d.get("type") for d in state.get("decoders", [state])}
        if "ByteLevel" in kinds:
            return "byte_level"
        if "ByteFallback" in kinds:
            return "byte_fallback"
        return None

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token adds to decoded text (a special token's own text, a <0xXX> token's byte)."""
        token = self.hf.id_to_token(int(token_id)) or ""
        if self.byte_decoding == "byte_level":
            table = _gpt2_bytes()
            if all(c in table for c in token):
                return bytes(table[c] for c in token)
        elif self.byte_decoding == "byte_fallback":
            if _BYTE_TOKEN.fullmatch(token):
                return bytes([int(token[3:5], 16)])
            token = token.replace("\u2581", " ")
        return token.encode("utf-8")


def _library(call, *args, **kwargs):
    """call(*args, **kwargs) into the tokenizers library, whose failures inside Rust (a regex of
    the file past its backtracking limit) reach Python as a pyo3 PanicException, a BaseException
    that `except Exception` lets through: a TokenizerError instead."""
    try:
        return call(*args, **kwargs)
    except BaseException as e:
        if type(e).__module__ != "pyo3_runtime":
            raise
        raise TokenizerError(f"the tokenizer failed on this text: {e}") from None


def _flag(config: dict, key: str, path: str) -> bool | None:
    """A true/false setting, None when absent; files written by hand spell it "false" too."""
    value = config.get(key)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if value is None or isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return None if value is None else bool(value)
    raise FormatError(path, f"{key} should be true or false, got {value!r}")


def _token_text(value) -> str | None:
    """tokenizer_config writes special tokens as a string or as an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@lru_cache(maxsize=1)
def _gpt2_bytes() -> dict[str, int]:
    """GPT-2's printable character -> byte table, the inverse of what byte-level vocabularies spell."""
    return {c: b for b, c in bytes_to_unicode().items()}


def incomplete_utf8_tail(data: bytes) -> int:
    """How many bytes at the end of data begin a UTF-8 character that they do not finish."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoder.decode(data, final=False)
    return len(decoder.getstate()[0])


class IncrementalDecoder:
    """Turns a stream of ids into text pieces, holding back bytes of an unfinished UTF-8 character.

    Decoding each token alone is wrong for byte-level and SentencePiece vocabularies (spaces and
    multi-byte characters span tokens), so the text of a short window of ids is decoded and only
    what it adds past the previous window is emitted — once it no longer ends in U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self.ids: list[int] = []
        self.prefix = 0  # start of the window whose text has been emitted up to `read`
        self.read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        decode = self.tokenizer.decode
        prefix_text = decode(self.ids[self.prefix : self.read], self.skip_special)
        full_text = decode(self.ids[self.prefix :], self.skip_special)
        if full_text.endswith("\ufffd") or len(full_text) <= len(prefix_text):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        """What is still held back, less the bytes of a character left unfinished at the very end
        (generation stopped in the middle of it: those bytes are no text, and decoding them would
        write U+FFFD). The ids keep every token."""
        held = self.ids[self.prefix :]
        prefix_text = self.tokenizer.decode(self.ids[self.prefix : self.read], self.skip_special)
        full_text = self.tokenizer.decode(held, self.skip_special)
        self.prefix = self.read = len(self.ids)
        kind = self.tokenizer.byte_decoding
        if kind is not None and full_text.endswith("\ufffd"):
            special = self.tokenizer.special_ids if self.skip_special else set()
            pending = incomplete_utf8_tail(b"".join(self.tokenizer.token_bytes(i) for i in held
                                                    if i not in special))
            if pending and kind == "byte_level":
                full_text = full_text[:-1]  # lossy UTF-8 writes one U+FFFD for an unfinished tail
            elif pending and kind == "byte_fallback" and all(
                    _BYTE_TOKEN.fullmatch(self.tokenizer.hf.id_to_token(i) or "") for i in held[-pending:]):
                # every byte of a run that is not valid UTF-8 becomes U+FFFD: decode without them
                full_text = self.tokenizer.decode(held[:-pending], self.skip_special)
        return full_text[len(prefix_text) :]
