"""The tokenizer rebuilt from GGUF metadata: the same ids as transformers' own GGUF tokenizer on real
files (SmolLM2: byte-level BPE; Gemma 3: SentencePiece with byte fallback) and on tiny vocabularies
written here, lossless decoding, each pre-tokenizer type doing what llama.cpp's does, and a
FormatError for every kind of broken tokenizer metadata."""
from __future__ import annotations

import gc
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as VT
from tokenizers.pre_tokenizers import ByteLevel

from pyllm.errors import FormatError, UnsupportedModelError
from pyllm.formats.gguf import GGUFFile
from pyllm import _strings, tokenizer_gguf
from pyllm.tokenizer_gguf import PRE_TOKENIZERS, tokenizer_from_gguf


# Prose, accents, CJK, emoji (ZWJ families, flags, skin tones), code with tabs, runs of spaces and
# newlines, digits, chat markup written as text, and the degenerate cases.
TEXTS = [
    "The quick brown fox jumps over the lazy dog. It's 9:41, isn't it? They'll say \"we'd\" won't.",
    "Café, niño, über, façade, naïve, crème brûlée; ÉCOLE Ñandú Ärger — «quotes» and ‘curly’ ones…",
    "日本語のテキストと中文文本，한국어도 있어요。Смешанный текст ελληνικά العربية हिन्दी",
    "Emoji: 😀👍🏽 👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 ❤️‍🔥 🇫🇷 ✨",
    "def f(x):\n\tif x:\n\t\treturn [i ** 2 for i in range(10)]  # tab-indented\n    else:\n        return None\n",
    "  two leading spaces, then     a run,\n\n\n\nfour newlines,\r\nCRLF, \t tab mix   and trailing spaces   ",
    "Digits 0 12 345 6789 1234567890 3.14159 1,000,000 2024-01-31 0x1F 1e-5 v2.0",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "",
    " ",
    "\n",
    "a",
]
GEMMA_TEXTS = TEXTS + ["<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "x\n\n\ny"]


# ---- metadata from a file, through gguf.GGUFReader ------------------------------------------------


def reader_metadata(path: Path) -> dict:
    """GGUF metadata as Python values: strings and string arrays as str, scalars as int/float/bool,
    numeric arrays as numpy arrays (tokenizer_from_gguf accepts lists or arrays)."""
    out = {}
    for key, field in gguf.GGUFReader(path).fields.items():
        if key.startswith("GGUF."):
            continue
        kind = field.types[0]
        if kind == VT.ARRAY:
            if field.types[-1] == VT.STRING:
                out[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            elif field.types[-1] == VT.ARRAY:
                continue  # nested arrays: no tokenizer key uses them
            else:
                out[key] = np.concatenate([field.parts[i] for i in field.data]) if field.data else np.zeros(0)
        elif kind == VT.STRING:
            out[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            value = field.parts[field.data[0]][0].item()
            out[key] = bool(value) if kind == VT.BOOL else value
    return out


# ---- real files against transformers ------------------------------------------------------------


class RealModel:
    def __init__(self, path: Path):
        from transformers import AutoTokenizer

        self.path = path
        self.metadata = reader_metadata(path)
        self.info = tokenizer_from_gguf(self.metadata, source=str(path))
        self.hf = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf) -> RealModel:
    return RealModel(Path(smollm2_gguf))


@pytest.fixture(scope="module")
def gemma3(gemma3_gguf) -> RealModel:
    return RealModel(Path(gemma3_gguf))


def assert_same_as_transformers(model: RealModel, texts: list[str]) -> None:
    mine, hf = model.info.tokenizer, model.hf
    for text in texts:
        for add_special in (True, False):
            expected = hf(text, add_special_tokens=add_special)["input_ids"]
            got = mine.encode(text, add_special_tokens=add_special).ids
            assert got == expected, f"{text!r} (add_special_tokens={add_special})"
        ids = mine.encode(text).ids
        for skip in (True, False):
            assert mine.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), repr(text)


def test_smollm2_ids_match_transformers_gguf_tokenizer(smollm2):
    assert_same_as_transformers(smollm2, TEXTS)


def test_smollm2_decode_of_encode_is_the_text(smollm2):
    tok = smollm2.info.tokenizer
    for text in TEXTS:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


def test_smollm2_chat_markup_is_single_special_tokens_and_skipped_in_decoding(smollm2):
    tok = smollm2.info.tokenizer
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ids[0] == 1 and ids[-1] == 2  # <|im_start|>, <|im_end|>
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_smollm2_splits_off_every_numeral_as_llama_cpp_smollm_pre_does(smollm2):
    """The one place we part from transformers on this file: llama.cpp's "smollm" pre-tokenizer (like
    SmolLM2's own tokenizer.json, Digits then ByteLevel) cuts every \\p{N} character off, non-ASCII
    numerals too; transformers' GGUF conversion uses the bare GPT-2 regex, which keeps " ½" together.
    On ASCII digits the two agree (the vocabulary has no multi-digit or space-digit token)."""
    tok = smollm2.info.tokenizer
    assert tok.encode(" ½ ٣").tokens == ["Ġ", "Â½", "Ġ", "Ù", "£"]
    assert tok.encode(" 12").ids == smollm2.hf(" 12")["input_ids"]
    assert not any(t.startswith("Ġ") and t[1:].isdigit() for t in tok.get_vocab())


def test_smollm2_special_ids_and_flags_come_from_the_file(smollm2):
    info = smollm2.info
    assert (info.bos_id, info.eos_id, info.unk_id, info.pad_id) == (1, 2, 0, 2)
    assert info.eos_ids == [2]
    assert not info.add_bos and not info.add_eos
    assert info.chat_template == smollm2.metadata["tokenizer.chat_template"]
    assert "<|im_start|>" in info.special_tokens and len(info.special_tokens) == 17
    assert info.tokenizer.get_vocab_size() == 49152


def test_gemma3_ids_match_transformers_gguf_tokenizer(gemma3):
    assert_same_as_transformers(gemma3, GEMMA_TEXTS)


def test_gemma3_decode_of_encode_is_the_text(gemma3):
    tok = gemma3.info.tokenizer
    for text in GEMMA_TEXTS:
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text


def test_gemma3_adds_bos_and_falls_back_to_bytes(gemma3):
    info = gemma3.info
    assert (info.bos_id, info.eos_id, info.unk_id, info.pad_id) == (2, 1, 3, 0)
    assert info.add_bos and info.chat_template is None
    assert info.tokenizer.encode("").ids == [2]
    # A character outside the vocabulary is spelled in <0xXX> byte tokens and decodes back whole.
    ids = info.tokenizer.encode("\U0001fbf9", add_special_tokens=False).ids
    pieces = [info.tokenizer.id_to_token(i) for i in ids]
    assert all(p.startswith("<0x") for p in pieces), pieces
    assert info.tokenizer.decode(ids) == "\U0001fbf9"


def test_gemma3_tokenizer_is_the_one_transformers_builds(gemma3):
    """Same normalizer, pre-tokenizer, decoder, post-processor, vocabulary, 514,906 rebuilt merges
    in the same order, and the same added tokens."""
    assert json.loads(gemma3.info.tokenizer.to_str()) == json.loads(gemma3.hf.backend_tokenizer.to_str())


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_pyllm_gguf_reader_metadata_builds_the_same_tokenizer(model, request):
    real = request.getfixturevalue(model)
    metadata = GGUFFile(real.path).metadata
    info = tokenizer_from_gguf(metadata, source=str(real.path))
    assert info.tokenizer.to_str() == real.info.tokenizer.to_str()
    assert (info.bos_id, info.eos_ids, info.add_bos, info.chat_template) == (
        real.info.bos_id,
        real.info.eos_ids,
        real.info.add_bos,
        real.info.chat_template,
    )


# ---- tiny byte-level vocabulary ("gpt2") ----------------------------------------------------------

BYTE_TOKENS = sorted(ByteLevel.alphabet())  # the 256 byte spellings: every text is encodable
BPE_MERGES = ["Ġ h", "h i", "Ġh i", "a b", "1 2"]
BPE_EXTRA = ["Ġh", "hi", "Ġhi", "ab", "abc", "12", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"]


def byte_level_metadata(**overrides) -> dict:
    tokens = BYTE_TOKENS + BPE_EXTRA
    types = [1] * len(tokens)
    for control in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        types[tokens.index(control)] = 3
    types[tokens.index("<think>")] = 4
    meta = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": BPE_MERGES,
        "tokenizer.ggml.bos_token_id": tokens.index("<|im_start|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
    }
    meta.update(overrides)
    return {k: v for k, v in meta.items() if v is not None}


def pieces(info, text: str, add_special_tokens: bool = False) -> list[str]:
    ids = info.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
    return [info.tokenizer.id_to_token(i) for i in ids]


def test_byte_level_bpe_applies_the_file_merges():
    assert pieces(tokenizer_from_gguf(byte_level_metadata()), "hi hi") == ["hi", "Ġhi"]


def test_byte_level_decode_of_encode_is_the_text_for_any_unicode():
    tok = tokenizer_from_gguf(byte_level_metadata()).tokenizer
    for text in TEXTS:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


def test_control_tokens_match_whole_and_are_dropped_by_skip_special_tokens():
    info = tokenizer_from_gguf(byte_level_metadata())
    text = "<|im_start|>hi<|im_end|>"
    assert pieces(info, text) == ["<|im_start|>", "hi", "<|im_end|>"]
    ids = info.tokenizer.encode(text).ids
    assert info.tokenizer.decode(ids, skip_special_tokens=True) == "hi"
    assert info.tokenizer.decode(ids, skip_special_tokens=False) == text
    assert info.special_tokens == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def test_user_defined_tokens_match_whole_and_survive_skip_special_tokens():
    info = tokenizer_from_gguf(byte_level_metadata())
    assert pieces(info, "<think>hi") == ["<think>", "hi"]
    ids = info.tokenizer.encode("<think>hi").ids
    assert info.tokenizer.decode(ids, skip_special_tokens=True) == "<think>hi"


def test_byte_level_vocab_adds_bos_only_when_the_file_says_so():
    default = tokenizer_from_gguf(byte_level_metadata())
    assert not default.add_bos and pieces(default, "hi", True) == ["hi"]
    on = tokenizer_from_gguf(byte_level_metadata(**{"tokenizer.ggml.add_bos_token": True}))
    assert on.add_bos and pieces(on, "hi", True) == ["<|im_start|>", "hi"]
    both = tokenizer_from_gguf(
        byte_level_metadata(**{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True})
    )
    assert pieces(both, "hi", True) == ["<|im_start|>", "hi", "<|im_end|>"]
    assert pieces(both, "hi", False) == ["hi"]


def test_a_special_id_on_a_normal_token_does_not_make_it_special():
    info = tokenizer_from_gguf(byte_level_metadata(**{"tokenizer.ggml.padding_token_id": BYTE_TOKENS.index("!")}))
    assert info.pad_id == BYTE_TOKENS.index("!") and "!" not in info.special_tokens
    ids = info.tokenizer.encode("hi!").ids
    assert info.tokenizer.decode(ids, skip_special_tokens=True) == "hi!"


def test_bos_and_eos_may_be_any_text():
    """The post-processor names BOS/EOS by their text; ":" and "$" must not confuse it."""
    tokens = BYTE_TOKENS + ["<s:1>", "$B"]
    meta = byte_level_metadata(
        **{
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [1] * 256 + [3, 3],
            "tokenizer.ggml.merges": [],
            "tokenizer.ggml.bos_token_id": 256,
            "tokenizer.ggml.eos_token_id": 257,
            "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_eos_token": True,
        }
    )
    info = tokenizer_from_gguf(meta)
    assert info.tokenizer.encode("a").ids == [256, tokens.index("a"), 257]
    assert [e.ids for e in info.tokenizer.encode_batch([("a", "b")])] == [
        [256, tokens.index("a"), 257, 256, tokens.index("b"), 257]
    ]


def test_eos_ids_are_eos_then_eot_and_eom_without_repeats():
    tokens = BYTE_TOKENS + BPE_EXTRA
    eot, eos = tokens.index("<|endoftext|>"), tokens.index("<|im_end|>")
    info = tokenizer_from_gguf(
        byte_level_metadata(**{"tokenizer.ggml.eot_token_id": eot, "tokenizer.ggml.eom_token_id": eos})
    )
    assert info.eos_id == eos and info.eos_ids == [eos, eot]


def test_numeric_arrays_may_be_numpy_arrays():
    meta = byte_level_metadata()
    meta["tokenizer.ggml.token_type"] = np.asarray(meta["tokenizer.ggml.token_type"], dtype=np.int32)
    meta["tokenizer.ggml.bos_token_id"] = np.uint32(meta["tokenizer.ggml.bos_token_id"])
    meta["tokenizer.ggml.add_bos_token"] = np.bool_(True)
    info = tokenizer_from_gguf(meta)
    assert pieces(info, "<think>hi", True) == ["<|im_start|>", "<think>", "hi"]


@pytest.mark.parametrize(
    "pre, text, expected",
    [
        ("gpt2", "12", ["12"]),  # GPT-2: digits run together, merged by the merges
        ("smollm", "12", ["1", "2"]),  # StarCoder family: every digit its own piece
        ("qwen2", "12", ["1", "2"]),
        ("llama-bpe", "12", ["12"]),  # Llama 3: digits in groups of up to three
        ("gpt-4o", "12", ["12"]),
        ("tekken", "12", ["1", "2"]),
        ("gpt2", "abc", ["ab", "c"]),  # "abc" is a token, but no merge makes it
        ("qwen2", "abc", ["ab", "c"]),
        ("llama-bpe", "abc", ["abc"]),  # Llama 3 and Tekken keep a piece that is a token whole
        ("tekken", "abc", ["abc"]),
        (None, "12 hi", ["12", "Ġhi"]),  # no pre key: GPT-2
    ],
)
def test_pre_tokenizer_type_decides_how_text_is_cut(pre, text, expected):
    assert pieces(tokenizer_from_gguf(byte_level_metadata(**{"tokenizer.ggml.pre": pre})), text) == expected


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_every_supported_pre_type_round_trips_text(pre):
    tok = tokenizer_from_gguf(byte_level_metadata(**{"tokenizer.ggml.pre": pre})).tokenizer
    for text in TEXTS:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("pre", ["deepseek-llm", "falcon", "chatglm-bpe", "bloom", "no-such-pre"])
def test_unknown_pre_type_is_an_unsupported_model_error(pre):
    with pytest.raises(UnsupportedModelError, match=pre):
        tokenizer_from_gguf(byte_level_metadata(**{"tokenizer.ggml.pre": pre}))


# ---- tiny SentencePiece vocabulary ("llama") ------------------------------------------------------

BYTE_PIECES = [f"<0x{b:02X}>" for b in range(256)]
SP_PIECES = {  # piece: score (higher merges first)
    "▁": -1.0,
    "a": -2.0,
    "b": -2.0,
    "c": -2.0,
    "h": -2.0,
    "i": -2.0,
    "ab": -3.0,
    "bc": -4.0,
    "▁a": -10.0,
    "▁h": -5.0,
    "hi": -6.0,
    "▁hi": -4.5,
    "  ": -7.0,  # two real spaces: how Gemma files store a run of spaces
    "<|x|>": 0.0,
    "<ud>": 0.0,
}


def sentencepiece_metadata(scores: dict | None = None, **overrides) -> dict:
    table = dict(SP_PIECES, **(scores or {}))
    tokens = ["<unk>", "<s>", "</s>"] + BYTE_PIECES + list(table)
    types = [2, 3, 3] + [6] * 256 + [1] * len(table)
    types[tokens.index("<|x|>")] = 3
    types[tokens.index("<ud>")] = 4
    meta = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * 259 + list(table.values()),
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    meta.update(overrides)
    return {k: v for k, v in meta.items() if v is not None}


def test_sentencepiece_merges_follow_the_scores():
    # "▁abc": "ab" (-3) beats "bc" (-4); raising "bc" to -2.5 turns the result around.
    assert pieces(tokenizer_from_gguf(sentencepiece_metadata()), "abc") == ["▁", "ab", "c"]
    assert pieces(tokenizer_from_gguf(sentencepiece_metadata({"bc": -2.5})), "abc") == ["▁a", "bc"]


def test_sentencepiece_falls_back_to_utf8_bytes():
    info = tokenizer_from_gguf(sentencepiece_metadata())
    assert pieces(info, "hé") == ["▁h", "<0xC3>", "<0xA9>"]
    assert info.tokenizer.decode(info.tokenizer.encode("hé").ids) == "hé"


def test_sentencepiece_dummy_prefix_follows_add_space_prefix():
    default = tokenizer_from_gguf(sentencepiece_metadata())
    assert pieces(default, "hi hi") == ["▁hi", "▁hi"]
    off = tokenizer_from_gguf(sentencepiece_metadata(**{"tokenizer.ggml.add_space_prefix": False}))
    assert pieces(off, "hi hi") == ["hi", "▁hi"]
    for info in (default, off):
        assert info.tokenizer.decode(info.tokenizer.encode("hi hi").ids) == "hi hi"


def test_sentencepiece_adds_bos_unless_the_file_says_not_to():
    info = tokenizer_from_gguf(sentencepiece_metadata())
    assert info.add_bos and pieces(info, "hi", True) == ["<s>", "▁hi"]
    assert pieces(info, "", True) == ["<s>"]
    off = tokenizer_from_gguf(sentencepiece_metadata(**{"tokenizer.ggml.add_bos_token": False}))
    assert not off.add_bos and pieces(off, "hi", True) == ["▁hi"]


def test_sentencepiece_defaults_to_llama_special_ids():
    meta = sentencepiece_metadata()
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"):
        del meta[key]
    info = tokenizer_from_gguf(meta)
    assert (info.unk_id, info.bos_id, info.eos_id, info.pad_id) == (0, 1, 2, None)


def test_sentencepiece_control_and_user_tokens_match_whole():
    # the text after an added token gets the dummy prefix again, as llama.cpp (and Llama 2's own
    # tokenizer.json) give it; transformers' GGUF conversion does not
    info = tokenizer_from_gguf(sentencepiece_metadata())
    assert pieces(info, "hi<|x|>hi <ud>") == ["▁hi", "<|x|>", "▁hi", "▁", "<ud>"]
    ids = info.tokenizer.encode("hi<|x|>hi <ud>").ids
    assert info.tokenizer.decode(ids, skip_special_tokens=True) == "hi hi <ud>"


def test_gemma_vocab_respells_space_runs_and_merges_in_file_order():
    meta = sentencepiece_metadata({"bc": -2.5}, **{"general.architecture": "gemma3"})
    info = tokenizer_from_gguf(meta)
    # No dummy prefix; "ab" comes before "bc" in the file, so it merges first whatever the scores say.
    assert pieces(info, "abc") == ["ab", "c"]
    # The stored "  " is the text's "▁▁".
    assert pieces(info, "a  b") == ["a", "▁▁", "b"]
    assert info.tokenizer.decode(info.tokenizer.encode("a  b").ids, skip_special_tokens=True) == "a  b"


@pytest.mark.parametrize("metadata", [
    pytest.param(byte_level_metadata(), id="gpt2"),
    pytest.param(byte_level_metadata(**{"tokenizer.ggml.tokens": BYTE_TOKENS + BPE_EXTRA + ["hi"],
                                        "tokenizer.ggml.token_type": None}), id="gpt2-repeated-token"),
    pytest.param(sentencepiece_metadata(), id="llama"),
    pytest.param(sentencepiece_metadata(**{"general.architecture": "gemma3"}), id="gemma3"),
])
def test_n_ids_is_one_past_the_largest_id_in_the_vocabulary(metadata):
    info = tokenizer_from_gguf(metadata)
    assert info.n_ids == max(info.tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def test_sentencepiece_with_an_empty_merge_list_merges_by_its_scores():
    """llama.cpp never reads the merges of a SentencePiece vocabulary; an empty list must not leave
    the tokenizer unable to merge at all."""
    meta = sentencepiece_metadata(**{"tokenizer.ggml.merges": []})
    assert pieces(tokenizer_from_gguf(meta), "abc") == ["▁", "ab", "c"]


def test_sentencepiece_scores_may_be_a_numpy_array():
    meta = sentencepiece_metadata()
    meta["tokenizer.ggml.scores"] = np.asarray(meta["tokenizer.ggml.scores"], dtype=np.float32)
    assert pieces(tokenizer_from_gguf(meta), "abc") == ["▁", "ab", "c"]


# ---- tiny vocabularies written to GGUF files, against transformers --------------------------------


def write_gguf(path: Path, metadata: dict) -> None:
    """A GGUF holding metadata plus the smallest llama config and tensor transformers will load."""
    writer = gguf.GGUFWriter(path, metadata.get("general.architecture", "llama"))
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(4)
    for key, value in metadata.items():
        if key == "general.architecture":
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif key == "tokenizer.ggml.token_type":
            writer.add_array(key, [int(v) for v in value])
        else:
            writer.add_array(key, [float(v) for v in value] if key == "tokenizer.ggml.scores" else list(value))
    writer.add_tensor("token_embd.weight", np.zeros((len(metadata["tokenizer.ggml.tokens"]), 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param(byte_level_metadata(), id="gpt2"),
        pytest.param(byte_level_metadata(**{"tokenizer.ggml.pre": "qwen2"}), id="gpt2-qwen2"),
        pytest.param(byte_level_metadata(**{"tokenizer.ggml.pre": None}), id="gpt2-no-pre"),
        pytest.param(sentencepiece_metadata(), id="llama"),
        pytest.param(sentencepiece_metadata({"bc": -2.5}), id="llama-other-scores"),
        pytest.param(sentencepiece_metadata({"bc": -2.5}, **{"general.architecture": "gemma3"}), id="gemma3"),
        pytest.param(sentencepiece_metadata(**{"general.architecture": "phi3"}), id="phi3"),
    ],
)
def test_tiny_vocab_matches_transformers_gguf_tokenizer(metadata, tmp_path):
    """Where we follow llama.cpp over transformers -- pre types smollm, llama-bpe, ...; a "llama"
    vocabulary with add_space_prefix false; the dummy prefix of a Llama-style vocabulary before
    leading spaces and after added tokens -- ids differ on purpose; the tests above and
    test_llama_cpp_vocabularies.py cover those."""
    import transformers

    write_gguf(tmp_path / "tiny.gguf", metadata)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    info = tokenizer_from_gguf(reader_metadata(tmp_path / "tiny.gguf"))
    texts = TEXTS + ["abc hi 12 a  b", "hi<|x|>hi <ud> <unk> <s>x", "<think>hi<|im_end|>hé"]
    if metadata["tokenizer.ggml.model"] == metadata["general.architecture"] == "llama":
        kinds = metadata["tokenizer.ggml.token_type"]
        added = [t for t, kind in zip(metadata["tokenizer.ggml.tokens"], kinds) if kind in (2, 3, 4)]
        texts = [t for t in texts if not t[:1].isspace() and not any(a in t for a in added)]
    for text in texts:
        assert info.tokenizer.encode(text).ids == hf(text)["input_ids"], repr(text)
        ids = info.tokenizer.encode(text).ids
        assert info.tokenizer.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


# ---- broken metadata ------------------------------------------------------------------------------


def without(meta: dict, key: str) -> dict:
    return {k: v for k, v in meta.items() if k != key}


def changed(meta: dict, key: str, value) -> dict:
    return dict(meta, **{key: value})


BPE = byte_level_metadata()
SP = sentencepiece_metadata()
N_BPE = len(BPE["tokenizer.ggml.tokens"])


@pytest.mark.parametrize(
    "metadata, problem",
    [
        pytest.param(without(BPE, "tokenizer.ggml.model"), "no tokenizer.ggml.model", id="no-model"),
        pytest.param(changed(BPE, "tokenizer.ggml.model", 7), "tokenizer.ggml.model", id="model-not-a-string"),
        pytest.param(without(BPE, "tokenizer.ggml.tokens"), "no tokenizer.ggml.tokens", id="no-tokens"),
        pytest.param(changed(BPE, "tokenizer.ggml.tokens", []), "tokenizer.ggml.tokens is empty", id="empty-tokens"),
        pytest.param(changed(BPE, "tokenizer.ggml.tokens", "abc"), "array of strings", id="tokens-a-string"),
        pytest.param(
            changed(BPE, "tokenizer.ggml.tokens", BPE["tokenizer.ggml.tokens"][:-1] + [5]),
            r"tokenizer.ggml.tokens\[\d+\]",
            id="token-not-a-string",
        ),
        pytest.param(
            changed(BPE, "tokenizer.ggml.token_type", [1, 1]), "token_type has 2 entries", id="token-type-length"
        ),
        pytest.param(changed(BPE, "tokenizer.ggml.bos_token_id", N_BPE), "outside the vocabulary", id="bos-too-big"),
        pytest.param(changed(BPE, "tokenizer.ggml.eos_token_id", -1), "outside the vocabulary", id="eos-negative"),
        pytest.param(changed(BPE, "tokenizer.ggml.padding_token_id", 1.5), "integer", id="pad-not-an-int"),
        pytest.param(changed(BPE, "tokenizer.ggml.eot_token_id", 10**6), "eot_token_id", id="eot-too-big"),
        pytest.param(without(BPE, "tokenizer.ggml.merges"), "needs tokenizer.ggml.merges", id="bpe-no-merges"),
        pytest.param(changed(BPE, "tokenizer.ggml.merges", ["Ġ h", "x y"]), "not a token", id="merge-unknown-token"),
        pytest.param(changed(BPE, "tokenizer.ggml.merges", ["Ġh"]), "separated by a space", id="merge-no-space"),
        pytest.param(changed(BPE, "tokenizer.ggml.merges", []), "merges is empty.*'Ġh'", id="bpe-empty-merges"),
        pytest.param(
            changed(BPE, "tokenizer.ggml.token_type", [math.inf] * N_BPE), "token_type holds a value that is not a number",
            id="token-type-infinite",
        ),
        pytest.param(changed(BPE, "tokenizer.ggml.add_bos_token", "yes"), "boolean", id="flag-not-a-bool"),
        pytest.param(changed(SP, "tokenizer.ggml.scores", [0.0] * 3), "scores has 3 entries", id="scores-length"),
        pytest.param(
            changed(SP, "tokenizer.ggml.scores", [math.nan] * len(SP["tokenizer.ggml.scores"])), "NaN", id="scores-nan"
        ),
        pytest.param(without(SP, "tokenizer.ggml.scores"), "needs tokenizer.ggml.scores", id="sentencepiece-no-scores"),
    ],
)
def test_broken_tokenizer_metadata_is_a_format_error(metadata, problem):
    with pytest.raises(FormatError, match=problem) as raised:
        tokenizer_from_gguf(metadata, source="model.gguf")
    assert raised.value.path == "model.gguf"


def test_format_error_names_gguf_metadata_when_no_source_is_given():
    with pytest.raises(FormatError) as raised:
        tokenizer_from_gguf(without(BPE, "tokenizer.ggml.tokens"))
    assert raised.value.path == "<gguf metadata>"


@pytest.mark.parametrize("model", ["bert", "t5", "rwkv", "none"])
def test_other_tokenizer_models_are_unsupported(model):
    with pytest.raises(UnsupportedModelError, match=repr(model)):
        tokenizer_from_gguf(changed(BPE, "tokenizer.ggml.model", model))


# ---- merges rebuilt from a vocabulary without them -------------------------------------------------

def every_split(vocab: dict, priority: dict) -> list:
    """The obvious reference: try every cut of every token (quadratic in token length)."""
    found = []
    for token, score in priority.items():
        for k in range(1, len(token)):
            if token[:k] in vocab and token[k:] in vocab:
                found.append((score, k, len(token) - k, token[:k], token[k:]))
    found.sort(key=lambda f: f[:3], reverse=True)
    return [(left, right) for _, _, _, left, right in found]


@pytest.mark.parametrize("alphabet", ["ab", "aé日\U0001F600", "a\0b"], ids=["ascii", "multibyte", "nul"])
def test_merges_rebuilt_are_every_split_into_two_tokens(alphabet):
    rng = np.random.default_rng(7)
    for _ in range(50):
        lengths = rng.integers(1, 12, size=60)
        tokens = {"".join(rng.choice(list(alphabet), size=n)) for n in lengths} | set(alphabet)
        tokens |= {t + t for t in list(tokens)[:10]}  # longer ones made of two tokens
        vocab = {t: i for i, t in enumerate(sorted(tokens))}
        priority = {t: float(rng.integers(0, 5)) for t in vocab}
        scores = np.array([priority[t] for t in vocab])  # by id: vocab's ids are 0, 1, ... in order
        assert tokenizer_gguf._merges_from_vocab(vocab, scores) == every_split(vocab, priority)


def test_vocab_splits_cut_between_characters_and_name_the_first_of_equal_tokens():
    tokens = ["a", "é", "aé", "a", "日本", "日", "本", "x\ud800", "\ud800", "x", ""]
    which, cut, left, right = _strings.vocab_splits(tokens)
    assert list(zip(which, cut, left, right)) == [(2, 1, 0, 1), (4, 1, 5, 6), (7, 1, 9, 8)]
    assert [len(a) for a in _strings.vocab_splits([])] == [0, 0, 0, 0]


def test_a_sentencepiece_vocabulary_with_a_huge_token_loads_in_linear_time():
    """One 2,000,000-character token: trying every cut hashes ~4·10¹² characters (hours; 400,000
    characters took half a minute). Run apart, with a deadline far above the linear time."""
    code = textwrap.dedent("""
        from pyllm.tokenizer_gguf import tokenizer_from_gguf
        tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", "aa", "a" * 1_999_999, "a" * 2_000_000]
        info = tokenizer_from_gguf({
            "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -19.0, -20.0],
            "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1]})
        print(info.tokenizer.token_to_id("a" * 2_000_000))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "7\n"


@pytest.mark.parametrize("enabled", [True, False])
def test_the_build_leaves_the_garbage_collector_as_it_found_it(enabled):
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert pieces(tokenizer_from_gguf(byte_level_metadata()), "hi hi") == ["hi", "Ġhi"]
        assert gc.isenabled() is enabled
        with pytest.raises(FormatError):  # a failed build restores it too
            tokenizer_from_gguf(byte_level_metadata(**{"tokenizer.ggml.merges": ["h x"]}))
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
