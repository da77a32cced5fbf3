"""pyllm's GGUF tokenizers against llama.cpp's own vocabulary tests: the vocabulary-only GGUF files in
the llama-cpp-python sdist (vendor/llama.cpp/models/ggml-vocab-*.gguf), each with inputs (.inp) and
the ids llama.cpp's test-tokenizer-0 expects for them (.out). The sdist is fetched once through pip
into the tests' cache (tests/families.py), never into the repository.

test-tokenizer-0 tokenizes with add_special=false and parse_special=false: no BOS, and the text of a
control token is text. Every vocabulary whose tokenizer pyllm builds must match case for case and
decode back to the text; the others must be refused, not tokenized some other way. (aquila,
baichuan, gpt-neox and nomic-bert-moe ship without .inp/.out files: llama.cpp has no cases for them.)
"""
from __future__ import annotations

import os

import pytest

from families import llama_cpp_converter
from pyllm.errors import UnsupportedModelError
from pyllm.formats.gguf import GGUFFile
from pyllm.tokenizer_gguf import tokenizer_from_gguf

SEPARATOR = "\n__ggml_vocab_test__\n"

MATCHING = [
    "llama-spm",    # "llama" SentencePiece: Llama 2, TinyLlama, Mistral v0.1
    "phi-3",        # "llama" SentencePiece as Phi-3 writes it
    "llama-bpe",    # Llama 3
    "qwen2",        # Qwen 2, Qwen 3
    "gpt-2",        # GPT-2
    "starcoder",    # the StarCoder / SmolLM split (digits one by one)
    "refact",
    "command-r",
    "mpt",          # GPT-NeoX's vocabulary: runs of spaces are user-defined tokens, written as plain text
]

# Tokenizers of families pyllm does not run: building one is an UnsupportedModelError.
REFUSED = {
    "bert-bge": "tokenizer model 'bert'",
    "gemma-4": "tokenizer model 'gemma4'",
    "deepseek-coder": "pre-tokenizer 'deepseek-coder'",
    "deepseek-llm": "pre-tokenizer 'deepseek-llm'",
    "falcon": "pre-tokenizer 'falcon'",
    "qwen35": "pre-tokenizer 'qwen35'",
}


def models_folder() -> str:
    return os.path.join(os.path.dirname(llama_cpp_converter()), "models")


def cases(name: str) -> list[tuple[str, list[int]]]:
    """The (text, ids) pairs of llama.cpp's test for a vocabulary, read as test-tokenizer-0 reads them."""
    path = os.path.join(models_folder(), f"ggml-vocab-{name}.gguf")
    with open(path + ".inp", encoding="utf-8", newline="") as f:
        raw = f.read()
    texts = raw[: -len(SEPARATOR)].split(SEPARATOR) if raw.endswith(SEPARATOR) else raw.split(SEPARATOR)
    with open(path + ".out", encoding="utf-8") as f:
        outs = f.read().splitlines()
    assert len(texts) == len(outs), name
    return [(text, [int(i) for i in out.split()]) for text, out in zip(texts, outs)]


def tokenizer(name: str):
    info = tokenizer_from_gguf(GGUFFile(os.path.join(models_folder(), f"ggml-vocab-{name}.gguf")).metadata)
    info.tokenizer.encode_special_tokens = True  # parse_special=false
    return info.tokenizer


@pytest.mark.parametrize("name", MATCHING)
def test_gguf_tokenizer_matches_llama_cpp_vocabulary_test(name):
    tok = tokenizer(name)
    pairs = cases(name)
    assert len(pairs) > 30
    wrong = [(text, tok.encode(text, add_special_tokens=False).ids, ids) for text, ids in pairs
             if tok.encode(text, add_special_tokens=False).ids != ids]
    assert not wrong
    assert [text for text, ids in pairs if tok.decode(ids) != text] == []


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_tokenizers_of_families_pyllm_does_not_run_are_refused(name):
    path = os.path.join(models_folder(), f"ggml-vocab-{name}.gguf")
    with pytest.raises(UnsupportedModelError, match=REFUSED[name]):
        tokenizer_from_gguf(GGUFFile(path).metadata)


def test_sentencepiece_keeps_the_dummy_prefix_before_leading_spaces():
    tok = tokenizer("llama-spm")
    assert tok.encode(" Hello", add_special_tokens=False).ids == [29871, 15043]
    assert tok.encode("  Hello", add_special_tokens=False).ids == [259, 15043]
    assert tok.decode(tok.encode("  Hello", add_special_tokens=False).ids) == "  Hello"
