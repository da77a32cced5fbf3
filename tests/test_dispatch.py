"""The kernel set is switched at run time (csrc/cpu.c): a whole model runs on every ISA this CPU has
and gives what the scalar kernels give, and forced scalar kernels still run a model end to end.

Not bit for bit: the SIMD kernels sum in other orders and fuse multiply-adds, and their exp is a
polynomial, so float32 results differ in the last bits (tests/native/isa_check.c bounds every
kernel). Where the activations stay float32 (float weights) that stays at the rounding level
through the whole model: logits within 1e-4 of the largest (observed 1e-6 to 2e-5). Quantized weights
meet activations re-quantized to 8 bits at every prompt length (prefill computes what decode does):
there a last-bit difference upstream now and then moves an activation across a rounding boundary, by
a whole 8-bit step, and the logits after it by up to a few percent (llama.cpp behaves the same
between its ISAs): bounded there, not equal.
"""
from __future__ import annotations

import numpy as np
import pytest

import pyllm
from pyllm import _core
from pyllm.system import supported_isas

from conftest import make_tiny_checkpoint
from families import make_family_checkpoint

ISAS = supported_isas()
SIMD_ISAS = [isa for isa in ISAS if isa != "scalar"]
PROMPTS = [[5, 17, 42, 9, 100, 3, 250, 77], [64, 64, 2, 300, 1, 150, 12, 8, 99, 7]]
LONG_PROMPT = [int(i) for i in np.random.default_rng(3).integers(2, 300, 2 * _core.BLAS_MIN_TOKENS)]
# float32 activations throughout: |Δ logits| within this share of the largest logit
FLOAT_RTOL = 1e-4
QUANTIZED = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]


@pytest.fixture(autouse=True)
def restore_isa():
    """Every test leaves the kernels it found (the best, or what PYLLM_ISA chose)."""
    before = _core.current_isa()
    yield
    _core.set_isa(before)


@pytest.fixture(scope="module", params=["llama", "gemma"])
def float_model(request, tmp_path_factory):
    """bf16 weights, float32 activations: llama's MLP is gated SiLU, gemma's gated GELU (tanh)."""
    folder = str(tmp_path_factory.mktemp(request.param))
    if request.param == "llama":
        return make_tiny_checkpoint(folder)
    return make_family_checkpoint(folder, "gemma")


@pytest.fixture(scope="module")
def k_quant_model(tmp_path_factory):
    """Rows of whole 256-blocks, so that q4_k/q5_k/q6_k are k-quants here, not their fallbacks."""
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("llama256")), hidden_size=256, intermediate_size=512)


def assert_float_rounding(logits: dict) -> None:
    ref = logits["scalar"]
    for isa in SIMD_ISAS:
        np.testing.assert_allclose(logits[isa], ref, rtol=0, atol=FLOAT_RTOL * np.abs(ref).max(), err_msg=isa)


def on_each_isa(fn) -> dict:
    """fn() with each ISA's kernels installed."""
    out = {}
    for isa in ISAS:
        assert _core.set_isa(isa) == isa
        out[isa] = fn()
    return out


def test_every_isa_the_cpu_reports_is_installable():
    assert ISAS[0] == "scalar" and _core.best_isa() in ISAS
    for isa in ISAS:
        assert _core.set_isa(isa) == isa and _core.current_isa() == isa


@pytest.mark.skipif(not SIMD_ISAS, reason="this CPU runs only the scalar kernels")
@pytest.mark.parametrize("prompt", [PROMPTS[0], LONG_PROMPT], ids=["vec_dot_prefill", "sgemm_prefill"])
def test_float_model_logits_agree_across_isas_within_float_rounding(float_model, prompt):
    llm = pyllm.load(float_model, threads=2)
    assert_float_rounding(on_each_isa(lambda: llm.logits(prompt)))


@pytest.mark.skipif(not SIMD_ISAS, reason="this CPU runs only the scalar kernels")
def test_float_model_greedy_tokens_are_identical_across_isas(float_model):
    llm = pyllm.load(float_model, threads=2)
    for prompt in PROMPTS:
        tokens = on_each_isa(lambda: llm.generate(prompt, max_tokens=24, temperature=0).token_ids)
        for isa in SIMD_ISAS:
            assert tokens[isa] == tokens["scalar"], isa


@pytest.mark.skipif(not SIMD_ISAS, reason="this CPU runs only the scalar kernels")
@pytest.mark.parametrize("dtype", QUANTIZED)
def test_quantized_model_vec_dot_logits_agree_across_isas_up_to_activation_requantization(k_quant_model, dtype):
    llm = pyllm.load(k_quant_model, threads=2, dtype=dtype)
    for prompt in [*PROMPTS, LONG_PROMPT]:
        logits = on_each_isa(lambda: llm.logits(prompt))
        ref = logits["scalar"]
        # a few moved 8-bit steps at most (observed: up to 7% of the largest logit with q8_0, often
        # nothing beyond rounding); a wrong kernel gives unrelated logits
        for isa in SIMD_ISAS:
            diff = np.abs(logits[isa] - ref).max()
            assert diff <= 0.25 * np.abs(ref).max(), (isa, diff)
            assert np.corrcoef(logits[isa].ravel(), ref.ravel())[0, 1] > 0.99, isa


def test_forced_scalar_kernels_run_a_model_end_to_end(float_model):
    _core.set_isa("best")
    want = pyllm.load(float_model, threads=2).generate("The sky is", max_tokens=12, temperature=0)
    assert _core.set_isa("scalar") == "scalar"
    got = pyllm.load(float_model, threads=2).generate("The sky is", max_tokens=12, temperature=0)
    assert _core.current_isa() == "scalar"
    assert got.text and got.token_ids == want.token_ids


def test_forced_scalar_kernels_run_a_quantized_model_end_to_end(k_quant_model):
    assert _core.set_isa("scalar") == "scalar"
    llm = pyllm.load(k_quant_model, threads=2, dtype="q4_k")  # quantized at load by the scalar kernels
    got = llm.generate("The sky is", max_tokens=12, temperature=0)
    assert _core.current_isa() == "scalar"
    assert got.token_ids and isinstance(got.text, str)
