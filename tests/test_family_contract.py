"""The contract every family keeps, one test per clause run over every case of families.CASES (tiny seeded
random checkpoints, bf16 on disk, float32 compute on both sides):

- logits equal transformers' over 48 tokens (the sgemm prefill) and over 12 (the vec_dot one);
- greedy continuations equal transformers', step by step and with the end of sequence;
- a prefill equals token-by-token decoding on both matmul paths;
- where llama.cpp's converter can state the checkpoint's function, its f32 file gives the folder's logits
  and transformers', its f16 file transformers' on the f16-rounded weights, its prefill its decoding, and
  its metadata the folder's recipe.

The families' own differences (soft-caps, windows, rope variants, fused projections, learned positions,
configs and files that must be refused) are proven in their own files.
"""
from __future__ import annotations

import numpy as np
import pytest

import pyllm
from pyllm import _core

from conftest import hf_float32
from families import CASES

pytestmark = pytest.mark.slow  # transformers is the oracle of every test here

N_TOKENS = 48
SHORT = 12  # fewer than _core.BLAS_MIN_TOKENS: a prefill on the vec_dot path
assert SHORT < _core.BLAS_MIN_TOKENS <= N_TOKENS
N_GREEDY = 20
GGUF_CASES = sorted(name for name, c in CASES.items() if c.gguf)


def oracle_model(name: str, folder: str):
    """transformers' float32 model; GPT-2's with eager attention, the only one that honours
    reorder_and_upcast_attn."""
    if CASES[name].family != "gpt2":
        return hf_float32(folder)
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()


def oracle_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def oracle_greedy(model, prompt: list[int], n: int) -> list[int]:
    """transformers' argmax continuation, recomputed from scratch at every step, through any end of sequence."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(oracle_logits(model, ids)[-1].argmax()))
    return ids[len(prompt):]


class Built:
    """A case's checkpoint, its token ids and transformers' logits of them."""

    def __init__(self, name: str, folder: str):
        self.name, self.folder, self.tol = name, folder, CASES[name].tol
        self.oracle = oracle_model(name, folder)
        vocab = self.oracle.config.vocab_size
        # above every family's special ids (Gemma's 0-3), below GPT-2's end of text (its last id)
        self.ids = np.random.default_rng(7).integers(4, vocab - 1, N_TOKENS).tolist()
        self.expected = oracle_logits(self.oracle, self.ids)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, checkpoint) -> Built:
    """One case at a time (the parameter groups the tests), its oracle run once."""
    c = CASES[request.param]
    return Built(request.param, checkpoint(c.family, **c.overrides))


@pytest.fixture(scope="module", params=GGUF_CASES)
def gguf_case(request, checkpoint) -> Built:
    """One case whose function a GGUF file can state at a time."""
    c = CASES[request.param]
    return Built(request.param, checkpoint(c.family, **c.overrides))


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    return float(np.abs(a - b).max())


# ---------------------------------------------------------------- the Hugging Face folder

def test_logits_match_transformers_on_the_sgemm_and_vec_paths(case):
    llm = pyllm.load(case.folder, threads=2)
    got = llm.logits(case.ids)
    assert got.dtype == np.float32 and got.shape == (N_TOKENS, llm.vocab_size)
    assert max_diff(got, case.expected) <= case.tol, case.name
    assert max_diff(llm.logits(case.ids[:SHORT]), oracle_logits(case.oracle, case.ids[:SHORT])) <= case.tol, \
        case.name


def test_greedy_continuation_matches_transformers(case):
    """Every step compared with the end of sequence ignored, then the run that stops at the first one."""
    prompt = case.ids[:8]
    expected = oracle_greedy(case.oracle, prompt, N_GREEDY)
    llm = pyllm.load(case.folder, threads=2)
    eos = set(llm.eos_ids)
    llm.eos_ids = set()
    assert llm.generate(prompt, max_tokens=N_GREEDY).token_ids == expected, case.name
    llm.eos_ids = eos
    stops = [i for i, t in enumerate(expected[:16]) if t in eos]
    assert llm.generate(prompt, max_tokens=16).token_ids == expected[:stops[0] if stops else 16], case.name


def test_prefill_equals_token_by_token_decoding_on_both_matmul_paths(case):
    llm = pyllm.load(case.folder, threads=2)
    sgemm = llm.logits(case.ids)
    vec = llm.logits(case.ids[:SHORT])
    llm.reset()
    steps = np.stack([llm._step(t) for t in case.ids])
    assert max_diff(sgemm, steps) <= 1e-4, case.name
    assert max_diff(vec, steps[:SHORT]) <= 1e-4, case.name


# ---------------------------------------------------------------- GGUF from llama.cpp's converter

def test_f32_gguf_gives_the_folders_and_transformers_logits(gguf_case, converted_gguf):
    b, name = gguf_case, gguf_case.name
    llm = pyllm.load(converted_gguf(b.folder, "f32"), threads=2)
    assert llm.spec.family == CASES[name].family
    got = llm.logits(b.ids)
    assert max_diff(got, pyllm.load(b.folder, threads=2).logits(b.ids)) <= 1e-4, name
    assert max_diff(got, b.expected) <= 1e-4, name
    assert max_diff(llm.logits(b.ids[:SHORT]), b.expected[:SHORT]) <= 1e-4, name


def test_f16_gguf_matches_transformers_on_f16_rounded_weights(gguf_case, converted_gguf):
    """The converter rounds every matrix to f16 and keeps vectors f32: transformers given the same rounding
    is the oracle (bf16 values below f16's normal range lose bits in that rounding)."""
    import torch

    b, name = gguf_case, gguf_case.name
    oracle = oracle_model(name, b.folder)
    with torch.no_grad():
        for p in oracle.parameters():
            if p.ndim == 2:
                p.copy_(p.half().float())
    got = pyllm.load(converted_gguf(b.folder, "f16"), threads=2).logits(b.ids)
    assert max_diff(got, oracle_logits(oracle, b.ids)) <= 1e-4, name


def test_gguf_prefill_equals_token_by_token_decoding(gguf_case, converted_gguf):
    b, name = gguf_case, gguf_case.name
    llm = pyllm.load(converted_gguf(b.folder, "f16"), threads=2)
    batch = llm.logits(b.ids)
    llm.reset()
    assert max_diff(batch, np.stack([llm._step(t) for t in b.ids])) <= 1e-4, name


def test_gguf_spec_equals_the_folders_spec(gguf_case, converted_gguf):
    """The GGUF's metadata and tensors say the same recipe: sizes, rotary dims and tables (LongRoPE's short
    factors and attention factor included), windows, soft-caps, biases, head, context limit, positions."""
    import json
    import os

    b, name = gguf_case, gguf_case.name
    a = pyllm.load(b.folder, threads=1).spec
    g = pyllm.load(converted_gguf(b.folder, "f32"), threads=1).spec
    for field in ("family", "n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size",
                  "n_rot", "sliding_windows", "layer_ropes", "tied_embeddings", "qkv_bias", "o_bias", "max_ctx",
                  "max_seq_len", "n_positions", "norm_kind", "activation", "attn_softcap", "logit_softcap",
                  "embed_scale"):
        assert getattr(g, field) == getattr(a, field), (name, field)
    with open(os.path.join(b.folder, "config.json")) as f:
        config = json.load(f)
    assert g.tied_embeddings == config.get("tie_word_embeddings", True), name  # absent: the default
    assert g.n_positions == config.get("n_positions", 0), name
    # llama.cpp permutes the q/k rows of llama files only: their pairs rotate interleaved
    assert a.rope_interleaved is False and g.rope_interleaved == (CASES[name].family in ("llama", "mistral"))
    assert np.float32(g.norm_eps) == np.float32(a.norm_eps), name  # the file holds a float32
    assert g.attn_scale == pytest.approx(a.attn_scale, rel=1e-7), name
    assert len(g.ropes) == len(a.ropes), name
    for x, y in zip(g.ropes, a.ropes):
        np.testing.assert_array_equal(x.inv_freq, y.inv_freq, err_msg=name)
        assert np.float32(x.scale) == np.float32(y.scale), name
