"""A Hugging Face `tokenizers.Tokenizer` rebuilt from the tokenizer a GGUF file describes.

A GGUF carries no tokenizer.json: llama.cpp's converter stores the vocabulary, scores, token types,
merges and special token ids as metadata. This module turns that metadata back into the tokenizer the
model was trained with, token for token the one transformers builds for the same file
(`AutoTokenizer.from_pretrained(folder, gguf_file=name)`), without importing transformers:

    info = tokenizer_from_gguf(GGUFFile(path).metadata)
    info.tokenizer.encode("Hello").ids      # BOS first when the file asks for it
    info.tokenizer.decode(ids, skip_special_tokens=True)

Two vocabularies exist in the files pyllm runs (`tokenizer.ggml.model`):

- "gpt2": byte-level BPE (SmolLM, Qwen2, Llama 3, ...). Merges come from the file; how text is cut
  into pieces before merging is named by `tokenizer.ggml.pre` and looked up in `PRE_TOKENIZERS`.
- "llama": SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Gemma, ...). The file has
  scores, not merges; the merges are rebuilt from the vocabulary, best first.

Where transformers' GGUF conversion and llama.cpp disagree, we follow llama.cpp (the files are its own):
a `tokenizer.ggml.pre` it does not know is an error rather than a silent GPT-2 split; the Llama 3
and Tekken vocabularies keep a piece whole when it is already a token (`ignore_merges`, as their
tokenizer.json and tiktoken do); pieces of the StarCoder/SmolLM family split digits one by one; and a
"llama" vocabulary honours `tokenizer.ggml.add_space_prefix`. On the files we test the ids are the same.
"""
from __future__ import annotations

import gc
import json
import math
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

import numpy as np

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from ._strings import vocab_splits
from .arch import gguf_vocabulary
from .arch.common import SentencePieceRules
from .errors import FormatError, UnsupportedModelError

METADATA = "<gguf metadata>"
# The per-token arrays tokenizer_from_gguf reads: once it has built the tokenizer, nothing needs them.
VOCABULARY_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                     "tokenizer.ggml.merges")

# llama.cpp's token types (`tokenizer.ggml.token_type`, enum llama_token_type).
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3  # <|im_start|>, <bos>: matched whole in text, dropped by skip_special_tokens
TOKEN_USER_DEFINED = 4  # <think>, "\n\n" in Gemma: matched whole in text, kept when decoding


@dataclass
class GGUFTokenizerInfo:
    """The tokenizer of a GGUF file and the special ids a generator needs.

    Example:
        >>> info = tokenizer_from_gguf(metadata)
        >>> ids = info.tokenizer.encode("<|im_start|>user\\nhi<|im_end|>").ids
        >>> stop = set(info.eos_ids)
    """

    tokenizer: Tokenizer
    bos_id: Optional[int]
    eos_id: Optional[int]
    eos_ids: List[int]  # eos, then the end-of-turn / end-of-message ids where the file names them
    pad_id: Optional[int]
    unk_id: Optional[int]
    add_bos: bool  # encode() already puts BOS first (post-processor); do not add it again
    add_eos: bool
    chat_template: Optional[str]
    special_tokens: List[str] = field(default_factory=list)  # the added tokens marked special, by id
    n_ids: int = 0  # one past the largest id encode() can produce


@dataclass(frozen=True)
class PreTokenizer:
    """How a byte-level vocabulary cuts text into pieces before merging (llama.cpp's pre types)."""

    split: Optional[str]  # regex of the pieces; None: the GPT-2 regex built into ByteLevel
    digits: bool = False  # split every digit off first (llama.cpp's extra "\p{N}" rule)
    ignore_merges: bool = False  # a piece that is a token as a whole stays whole


# The regexes as transformers' GGUF conversion and the models' own tokenizer.json spell them;
# llama.cpp writes the same ones with (?:'[sS]|...) for its regex engine.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_GPT2 = PreTokenizer(None)
_STARCODER = PreTokenizer(None, digits=True)
_LLAMA3 = PreTokenizer(_LLAMA3_SPLIT, ignore_merges=True)
_LLAMA3_REGEX = PreTokenizer(_LLAMA3_SPLIT)
_QWEN2 = PreTokenizer(_QWEN2_SPLIT)
_TEKKEN = PreTokenizer(_TEKKEN_SPLIT, ignore_merges=True)
_GPT4O = PreTokenizer(_GPT4O_SPLIT)

# `tokenizer.ggml.pre` → pieces, grouped as llama.cpp's llm_tokenizer_bpe groups them. A file without
# the key is "default"; like transformers we read that as GPT-2 (llama.cpp guesses a regex of its own).
PRE_TOKENIZERS: Dict[str, PreTokenizer] = {
    **dict.fromkeys(
        ("default", "gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "gigachat", "exaone4", "mellum",
         "a.x-4.0"),
        _GPT2,
    ),
    **dict.fromkeys(
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"), _STARCODER
    ),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"), _LLAMA3
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _LLAMA3_REGEX),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2"), _QWEN2),
    "tekken": _TEKKEN,
    **dict.fromkeys(("gpt-4o", "llama4"), _GPT4O),
}

def tokenizer_from_gguf(metadata: Mapping[str, object], source: str = METADATA) -> GGUFTokenizerInfo:
    """Build the tokenizer a GGUF file's metadata describes.

    metadata: keyed as in the file (`tokenizer.ggml.tokens`, ...); string arrays as lists of str,
    numeric arrays as lists or numpy arrays. source: the file, named in errors.

    Raises FormatError for missing or inconsistent tokenizer metadata, UnsupportedModelError for a
    vocabulary or pre-tokenizer type pyllm does not build.

    Example:
        >>> info = tokenizer_from_gguf(GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf").metadata)
        >>> info.tokenizer.encode("<|im_start|>user").ids
        [1, 4093]
    """
    with _no_cycle_collection():
        return _tokenizer_from_gguf(metadata, source)


@contextmanager
def _no_cycle_collection():
    """The cyclic garbage collector off for a vocabulary's build: it makes hundreds of thousands of
    tuples and strings (Gemma 3's 514,847 merges), none of them in a cycle, and every collection
    their allocations set off walks them and everything else alive: ~0.13 s of Gemma 3's ~1.2 s
    tokenizer build (benchmarks/RESULTS.md). Left as it was found."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _tokenizer_from_gguf(metadata: Mapping[str, object], source: str) -> GGUFTokenizerInfo:
    meta = _Metadata(metadata, source)
    model = meta.string("tokenizer.ggml.model", required=True)
    if model not in ("gpt2", "llama"):
        raise UnsupportedModelError(
            f"{source}: tokenizer model {model!r} is not supported (pyllm builds 'gpt2' and 'llama')"
        )
    tokens = meta.strings("tokenizer.ggml.tokens")
    n = len(tokens)
    token_types = meta.numbers("tokenizer.ggml.token_type", n, int)
    merges = meta.merges("tokenizer.ggml.merges") if "tokenizer.ggml.merges" in metadata else None

    # llama.cpp's defaults for a sentencepiece vocabulary that names no ids: <unk> <s> </s>.
    default = {"bos": 1, "eos": 2, "unk": 0} if model == "llama" and n > 2 else {}
    ids = {
        name: meta.token_id(f"tokenizer.ggml.{key}", n, default.get(name))
        for name, key in (
            ("bos", "bos_token_id"),
            ("eos", "eos_token_id"),
            ("unk", "unknown_token_id"),
            ("pad", "padding_token_id"),
            ("eot", "eot_token_id"),
            ("eom", "eom_token_id"),
        )
    }
    # bos/eos/unk/pad are special tokens too (transformers adds them), unless the file calls one a
    # normal token: a pad id pointing at "!" must not make every "!" vanish from decoded text.
    special = [
        tokens[i]
        for i in (ids["bos"], ids["eos"], ids["unk"], ids["pad"])
        if i is not None and (token_types is None or token_types[i] != TOKEN_NORMAL)
    ]

    if model == "gpt2":
        if merges is None:
            raise FormatError(source, "a 'gpt2' (byte-level BPE) vocabulary needs tokenizer.ggml.merges")
        if not merges:
            _check_nothing_to_merge(tokens, token_types, source)
        pre = meta.string("tokenizer.ggml.pre") or "default"
        if pre not in PRE_TOKENIZERS:
            raise UnsupportedModelError(
                f"{source}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; "
                f"known: {', '.join(sorted(PRE_TOKENIZERS))}"
            )
        tokenizer, vocab_tokens = _byte_level(tokens, token_types, merges, PRE_TOKENIZERS[pre], source)
        add_bos_default = False
    else:
        # llama.cpp builds a SentencePiece vocabulary from its scores and never reads its merges
        merges = merges or None
        scores = meta.numbers("tokenizer.ggml.scores", n, float)
        if merges is None and scores is None:
            raise FormatError(
                source, "a 'llama' vocabulary needs tokenizer.ggml.scores or tokenizer.ggml.merges"
            )
        if scores is not None and any(map(math.isnan, scores)):
            raise FormatError(source, "tokenizer.ggml.scores holds NaN")
        rules = gguf_vocabulary(meta.string("general.architecture") or "")
        add_space_prefix = meta.flag("tokenizer.ggml.add_space_prefix", True)
        tokenizer, vocab_tokens = _sentencepiece(tokens, scores, merges, rules, add_space_prefix, source)
        special += [t for t in rules.extra_special if t in vocab_tokens]
        add_bos_default = True

    _add_special_tokens(tokenizer, model, tokens, token_types, special, vocab_tokens)

    add_bos = meta.flag("tokenizer.ggml.add_bos_token", add_bos_default) and ids["bos"] is not None
    add_eos = meta.flag("tokenizer.ggml.add_eos_token", False) and ids["eos"] is not None
    bos = tokens[ids["bos"]] if add_bos else None
    eos = tokens[ids["eos"]] if add_eos else None
    tokenizer.post_processor = _template(bos, ids["bos"], eos, ids["eos"])

    eos_ids: List[int] = []
    for name in ("eos", "eot", "eom"):
        if ids[name] is not None and ids[name] not in eos_ids:
            eos_ids.append(ids[name])
    added = tokenizer.get_added_tokens_decoder()
    return GGUFTokenizerInfo(
        tokenizer=tokenizer,
        bos_id=ids["bos"],
        eos_id=ids["eos"],
        eos_ids=eos_ids,
        pad_id=ids["pad"],
        unk_id=ids["unk"],
        add_bos=add_bos,
        add_eos=add_eos,
        chat_template=meta.string("tokenizer.chat_template"),
        special_tokens=[added[i].content for i in sorted(added) if added[i].special],
        # the vocabulary's ids are 0..n-1 (a repeated token keeps its last); an added token that
        # it lacks gets an id past them
        n_ids=max([n, *(i + 1 for i in added)]),
    )


def _byte_level(
    tokens: List[str], token_types: Optional[List[int]], merges: List[Tuple[str, str]], pre: PreTokenizer,
    source: str,
) -> Tuple[Tokenizer, Dict[str, int]]:
    """Byte-level BPE: every token is spelled in GPT-2's byte alphabet (Ġ for a space)."""
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # A token written in plain text (a llama.cpp mislabel) is respelled byte by byte, as transformers does.
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): i
        for i, token in enumerate(tokens)
    }
    # llama.cpp's converter writes a user-defined token as the text it matches (GPT-NeoX's runs of
    # spaces, "  "), and llama.cpp matches that text whole: the text names the token too, so that the
    # added token made of it (_add_special_tokens) gets its id. Merges never make such a spelling.
    for i, (token, kind) in enumerate(zip(tokens, token_types or ())):
        if kind == TOKEN_USER_DEFINED and not set(token) <= alphabet:
            vocab.setdefault(token, i)
    _check_merges(merges, vocab, source)
    tokenizer = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            ignore_merges=pre.ignore_merges,
        )
    )
    if pre.split is not None:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pre.split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif pre.digits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, vocab


def _sentencepiece(
    tokens: List[str],
    scores: Optional[List[float]],
    merges: Optional[List[Tuple[str, str]]],
    rules: SentencePieceRules,
    add_space_prefix: bool,
    source: str,
) -> Tuple[Tokenizer, Dict[str, int]]:
    """SentencePiece-style BPE over ▁-spelled text, with <0xXX> byte fallback, built as rules (the
    family's, from pyllm/arch/) say where transformers builds a family's vocabulary its own way."""
    if rules.spaces_as_pieces:
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: i for i, token in enumerate(tokens)}
    unk = rules.unk_token if rules.unk_token in vocab else None
    if merges is None:
        order = -np.arange(len(tokens)) if rules.merges_by_id else scores
        by_id = np.asarray(order, dtype=np.float64)
        merges = _merges_from_vocab(vocab, by_id)
    else:
        _check_merges(merges, vocab, source)
    tokenizer = Tokenizer(
        BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None, unk_token=unk)
    )
    fused = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    strip = [decoders.Strip(" ", 1, 0)] if add_space_prefix else []  # the dummy prefix's space
    if rules.spaces_as_pieces:
        tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
        tokenizer.decoder = decoders.Sequence(fused)
    else:
        # llama.cpp puts the dummy prefix before the text as it is, leading spaces and all (" Hello"
        # is "▁▁Hello"), and again after every added token: a normalizer does both
        prefix = [normalizers.Prepend("\u2581")] if add_space_prefix else []
        tokenizer.normalizer = normalizers.Sequence(prefix + [normalizers.Replace(" ", "\u2581")])
        tokenizer.decoder = decoders.Sequence(fused + strip)
    return tokenizer, vocab


def _check_nothing_to_merge(tokens: List[str], token_types: Optional[List[int]], source: str) -> None:
    """A byte-level vocabulary with no merges can only produce its single bytes and added tokens: a
    normal token of two or more bytes in it means the merges were lost."""
    types = token_types or [TOKEN_NORMAL] * len(tokens)
    merged = [t for t, kind in zip(tokens, types) if len(t) > 1 and kind not in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    if merged:
        raise FormatError(source, f"tokenizer.ggml.merges is empty, so none of the {len(merged)} tokens made by "
                                  f"merging (such as {merged[0]!r}) can ever be produced")


def _check_merges(merges: List[Tuple[str, str]], vocab: Dict[str, int], source: str) -> None:
    for i, (left, right) in enumerate(merges):
        for part in (left, right, left + right):
            if part not in vocab:
                problem = f"tokenizer.ggml.merges[{i}] = '{left} {right}': {part!r} is not a token"
                raise FormatError(source, problem)


def _merges_from_vocab(vocab: Dict[str, int], scores: np.ndarray) -> List[Tuple[str, str]]:
    """Every split of a token of vocab into two of its tokens, the best-scored token's first (a
    token's score is scores[vocab[token]]: for a token the file lists twice, its last entry's).

    The order is that of transformers' `generate_merges`: priority, then the longer left part, then
    the longer right part; ties keep vocabulary order (two splits of one token never tie, so
    generate_merges' per-token sort changes nothing). BPE with these merges reproduces
    SentencePiece's "merge the adjacent pair whose union scores best".

    The splits come from the C core (csrc/vocab.c: linear in the vocabulary's bytes; a slice and
    two lookups per cut in Python took 2.4 s of Gemma 3's 2.9 s load) as numbers, sorted as
    arrays; each pair is made of the two tokens' own strings.
    """
    ordered = list(vocab)
    which, cut, left, right = vocab_splits(ordered)
    lengths = np.fromiter(map(len, ordered), dtype=np.int64, count=len(ordered))
    priority = scores[np.fromiter(vocab.values(), dtype=np.int64, count=len(ordered))]
    # descending (priority, left length, right length); ties in vocabulary order, cut by cut
    order = np.lexsort((cut - lengths[which], -cut, -priority[which]))
    get = ordered.__getitem__
    return list(zip(map(get, left[order].tolist()), map(get, right[order].tolist())))


def _add_special_tokens(
    tokenizer: Tokenizer,
    model: str,
    tokens: List[str],
    token_types: Optional[List[int]],
    special: List[str],
    vocab: Dict[str, int],
) -> None:
    """Control tokens (and bos/eos/unk/pad) become special added tokens, user-defined ones plain added
    tokens: both are then matched whole in text instead of being cut into pieces."""
    types = token_types or ()
    if model == "gpt2":
        # A control token spelled outside the byte alphabet is a llama.cpp mislabel (transformers skips it).
        alphabet = set(bytes_to_unicode().values())
        control = [t for t, kind in zip(tokens, types) if kind == TOKEN_CONTROL and set(t) <= alphabet]
    else:
        control = [t for t, kind in zip(tokens, types) if kind == TOKEN_CONTROL]
    control += [t for t in special if t in vocab and t not in control]
    if control:
        tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, kind in zip(tokens, types) if kind == TOKEN_USER_DEFINED and t in vocab]
    if user:
        tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _template(bos: Optional[str], bos_id: Optional[int], eos: Optional[str], eos_id: Optional[int]):
    """BOS/EOS around each sequence, as transformers' update_post_processor writes it.

    Built from JSON: TemplateProcessing's string form cannot name a token holding ":" or starting with "$".
    """

    def special(token: str, type_id: int) -> dict:
        return {"SpecialToken": {"id": token, "type_id": type_id}}

    def sequence(type_id: int) -> list:
        return (
            ([special(bos, type_id)] if bos else [])
            + [{"Sequence": {"id": "AB"[type_id], "type_id": type_id}}]
            + ([special(eos, type_id)] if eos else [])
        )

    known = {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in ((bos, bos_id), (eos, eos_id)) if t}
    spec = {
        "type": "TemplateProcessing",
        "single": sequence(0),
        "pair": sequence(0) + sequence(1),
        "special_tokens": known,
    }
    holder = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": spec,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {}, "unk_token": "<unk>"},
    }
    return Tokenizer.from_str(json.dumps(holder)).post_processor


@lru_cache(maxsize=1)
def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's byte → printable character table (a space is "Ġ", a newline "Ċ")."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


class _Metadata:
    """Typed, validated reads of the tokenizer keys; every problem is a FormatError naming the key."""

    def __init__(self, metadata: Mapping[str, object], source: str):
        self.metadata = metadata
        self.source = source

    def fail(self, problem: str) -> FormatError:
        return FormatError(self.source, problem)

    def string(self, key: str, required: bool = False) -> Optional[str]:
        value = self.metadata.get(key)
        if value is None:
            if required:
                raise self.fail(f"no {key}")
            return None
        if isinstance(value, bytes):
            value = self._decode(value, key)
        if not isinstance(value, str):
            raise self.fail(f"{key} should be a string, not {type(value).__name__}")
        return value

    def strings(self, key: str, allow_empty: bool = False) -> List[str]:
        value = self.metadata.get(key)
        if value is None:
            raise self.fail(f"no {key}")
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise self.fail(f"{key} should be an array of strings, not {type(value).__name__}")
        if not value and not allow_empty:
            raise self.fail(f"{key} is empty")
        out = list(value)
        if set(map(type, out)) == {str}:  # the common case, without a Python loop over 262k entries
            return out
        for i, s in enumerate(out):
            if not isinstance(s, str):
                if not isinstance(s, bytes):
                    raise self.fail(f"{key}[{i}] should be a string, not {type(s).__name__}")
                out[i] = self._decode(s, f"{key}[{i}]")
        return out

    def numbers(self, key: str, n: int, kind: type) -> Optional[list]:
        """A numeric array (list or numpy array) of exactly n entries, as Python ints or floats."""
        value = self.metadata.get(key)
        if value is None:
            return None
        if hasattr(value, "tolist"):  # numpy array: one C-speed conversion
            value = value.tolist()
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise self.fail(f"{key} should be an array of numbers, not {type(value).__name__}")
        if len(value) != n:
            raise self.fail(f"{key} has {len(value)} entries for {n} tokens")
        try:
            return list(map(kind, value))
        except (TypeError, ValueError, OverflowError):  # int(inf) overflows
            raise self.fail(f"{key} holds a value that is not a number") from None

    def merges(self, key: str) -> List[Tuple[str, str]]:
        out = []
        for i, merge in enumerate(self.strings(key, allow_empty=True)):
            # llama.cpp splits at the first space after the first character.
            cut = merge.find(" ", 1)
            if cut < 0 or cut == len(merge) - 1:
                raise self.fail(f"{key}[{i}] = {merge!r} is not two tokens separated by a space")
            out.append((merge[:cut], merge[cut + 1 :]))
        return out

    def token_id(self, key: str, n: int, default: Optional[int]) -> Optional[int]:
        value = self.metadata.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise self.fail(f"{key} should be an integer, not {type(value).__name__}")
        value = int(value)
        if not 0 <= value < n:
            raise self.fail(f"{key} = {value} is outside the vocabulary of {n} tokens")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.metadata.get(key)
        if value is None:
            return default
        if isinstance(value, (str, bytes, float)) or hasattr(value, "__len__") or value not in (0, 1):
            raise self.fail(f"{key} should be a boolean, not {value!r}")
        return bool(value)

    def _decode(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None
