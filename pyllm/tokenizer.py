"""Text <-> token ids through the HF `tokenizers` library, and incremental detokenization.

Special tokens follow the model's own files: tokenizer_config.json's add_bos_token/add_eos_token
when it states them, else tokenizer.json's post-processor — what transformers does.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import tokenizers

from .errors import FormatError
from .formats.json_files import read_json_object


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
        if "add_bos_token" in config:
            tok.add_bos = bool(config["add_bos_token"])
        if "add_eos_token" in config:
            tok.add_eos = bool(config["add_eos_token"])
        template = config.get("chat_template")
        jinja = os.path.join(folder, "chat_template.jinja")
        if not template and os.path.exists(jinja):
            with open(jinja, encoding="utf-8") as f:
                template = f.read()
        tok.chat_template = template if isinstance(template, str) else None
        tok.special_ids = {i for t, i in hf.get_vocab(with_added_tokens=True).items()
                           if t in {a.content for a in hf.get_added_tokens_decoder().values() if a.special}}
        return tok

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        if self.add_bos is None and self.add_eos is None:
            return self.hf.encode(text, add_special_tokens=add_special).ids
        ids = self.hf.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        if add_special and self.add_eos and self.eos_id is not None:
            ids = ids + [self.eos_id]
        return ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special)


def _token_text(value) -> str | None:
    """tokenizer_config writes special tokens as a string or as an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


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
        """What is still held back (an incomplete character at the very end), as decoded."""
        prefix_text = self.tokenizer.decode(self.ids[self.prefix : self.read], self.skip_special)
        full_text = self.tokenizer.decode(self.ids[self.prefix :], self.skip_special)
        self.prefix = self.read = len(self.ids)
        return full_text[len(prefix_text) :]
