"""A KV cache in f16 (kv_dtype="f16"): keys and values rounded to f16 as they are stored, half the
bytes of the f32 cache, logits within a stated tolerance of it on the vec path (prompts under 16
tokens, decode steps) and the sgemm path (prompts of 16 on), the same greedy text on SmolLM2 Q4_1,
and batched decode steps over f16 caches equal to the solo steps bit for bit.

Observed max |Δlogit| f16 vs f32 (2 threads, AVX2), prompt / decode steps:
  tiny bf16 families  vec path (9-token prompt)   llama 4.3e-3/3.7e-3, gemma2 1.7e-3/2.5e-3,
                                                  qwen3 4.0e-3/3.8e-3, gpt2 1.5e-3/2.1e-3
                      sgemm path (40 tokens)      llama 4.3e-3/4.2e-3, gemma2 2.5e-3/1.8e-3,
                                                  qwen3 5.7e-3/5.1e-3, gpt2 3.2e-3/3.3e-3
  SmolLM2-135M Q4_1   vec path                    up to 1.0 / 1.9 (logits up to ~35)
                      sgemm path                  0.017 / 0.99
SmolLM2 Q4_1's vec path quantizes every activation row to q8_1, so a rounding-sized change flips
some of those roundings: its f32 cache moves by as much (up to 1.9) with the scalar kernels instead
of AVX2. Where activations stay f32 (its sgemm prefill) the f16 cache moves logits by 0.017.

kv_dtype="q8_0" (the last section): each head's row of a key or value quantized to blocks of 32 as
stored, attention over the rows widened exactly. SmolLM2 Q4_1 max |Δlogit| against the f32 cache
1.8 / 1.3 (within the 8-bit activations' tolerance above); widened to f32 weights, 0.46."""
from __future__ import annotations


import numpy as np
import pytest

import pyllm
from pyllm import _core, _kernels


FAMILY_ATOL = 2e-2    # tiny bf16 families: observed ≤ 5.7e-3
SMOLLM2_ATOL = 2.5    # SmolLM2 Q4_1 through q8_1 activations: observed 1.9, as scalar vs AVX2 kernels
SMOLLM2_F32_ACT_ATOL = 0.05  # its weights widened, activations in f32: observed 0.017
GREEDY_MARGIN = 0.5



def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint16)


@pytest.mark.parametrize("n", [1, 7, 8, 31, 64, 65, 128, 256, 1000])
def test_dot_f16_matches_float64_and_the_scalar_reference(isa, n, rng):
    q = rng.standard_normal(n).astype(np.float32)
    k = _f16(rng.standard_normal(n).astype(np.float32))
    want = float(np.dot(q.astype(np.float64), k.view(np.float16).astype(np.float64)))
    got = _kernels.dot_f16(q, k)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-4)
    _core.set_isa("scalar")
    assert got == pytest.approx(_kernels.dot_f16(q, k), rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("n", [1, 7, 8, 31, 64, 65, 128, 256, 1000])
def test_axpy_f16_matches_float64_and_the_scalar_reference(isa, n, rng):
    y = rng.standard_normal(n).astype(np.float32)
    x = _f16(rng.standard_normal(n).astype(np.float32))
    a = float(rng.standard_normal())
    want = y.astype(np.float64) + np.float32(a) * x.view(np.float16).astype(np.float64)
    got = _kernels.axpy_f16(y, a, x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    _core.set_isa("scalar")
    np.testing.assert_allclose(got, _kernels.axpy_f16(y, a, x), rtol=1e-6, atol=1e-6)


def test_f16_kernels_are_exact_on_small_integers(isa, rng):
    q = rng.integers(-4, 5, 200).astype(np.float32)
    k = _f16(rng.integers(-4, 5, 200).astype(np.float32))
    assert _kernels.dot_f16(q, k) == float(np.dot(q, k.view(np.float16).astype(np.float32)))
    assert np.array_equal(_kernels.axpy_f16(q, 3.0, k), q + 3.0 * k.view(np.float16).astype(np.float32))


def _max_diffs(llm, n_prompt: int, steps: int, seed: int = 0, kv_dtype: str = "f16") -> tuple[float, float]:
    """(max |Δ| over the prompt's logits, over the decode steps'), an f16 (or kv_dtype) cache
    against f32, the same random tokens fed to both."""
    rng = np.random.default_rng(seed)
    ids = [int(t) for t in rng.integers(3, llm.vocab_size, n_prompt + steps)]
    a = _core.CoreSequence(llm._core, 128, kv_dtype="f32")
    b = _core.CoreSequence(llm._core, 128, kv_dtype=kv_dtype)
    prompt = np.abs(a.forward(ids[:n_prompt], all_logits=True) - b.forward(ids[:n_prompt], all_logits=True)).max()
    step = max(np.abs(a.forward([t]) - b.forward([t])).max() for t in ids[n_prompt:])
    return float(prompt), float(step)


@pytest.mark.parametrize("family", ["llama", "gemma2", "qwen3", "gpt2"])
@pytest.mark.parametrize("n_prompt", [9, 40], ids=["vec", "sgemm"])
def test_f16_cache_logits_are_within_tolerance_of_f32(family_checkpoint, family, n_prompt):
    """gemma2: soft-caps and an 8-token window shorter than the sequence; qwen3: q/k norm; gpt2:
    learned positions, biases. 40 prompt tokens take the sgemm attention, 9 the vec one."""
    llm = pyllm.load(family_checkpoint(family), threads=2)
    prompt, step = _max_diffs(llm, n_prompt, 12)
    print(f"{family} n_prompt={n_prompt}: max |dlogit| prompt {prompt:.2e}, decode {step:.2e}")
    assert 0 < max(prompt, step) and prompt < FAMILY_ATOL and step < FAMILY_ATOL


@pytest.mark.parametrize("n_prompt", [9, 40])
def test_smollm2_f16_cache_logits_are_within_tolerance_of_f32(smollm2_gguf, n_prompt):
    """8-bit activations at every prompt length: the requantization's tolerance throughout."""
    llm = pyllm.load(smollm2_gguf, threads=2, n_ctx=128)
    for seed in range(3):
        prompt, step = _max_diffs(llm, n_prompt, 16, seed)
        print(f"smollm2 n_prompt={n_prompt} seed={seed}: max |dlogit| prompt {prompt:.3f}, decode {step:.3f}")
        assert prompt < SMOLLM2_ATOL and step < SMOLLM2_ATOL


def test_smollm2_widened_f16_cache_logits_are_within_float_tolerance_of_f32(smollm2_gguf):
    """With float32 activations (the weights widened) an f16 cache only rounds keys and values."""
    llm = pyllm.load(smollm2_gguf, threads=2, n_ctx=128, dtype="f32")
    prompt, step = _max_diffs(llm, 40, 16)
    assert prompt < SMOLLM2_F32_ACT_ATOL and step < SMOLLM2_F32_ACT_ATOL


def _greedy(llm, ids: list[int], kv_dtype: str, n: int) -> tuple[list[int], list[float]]:
    """n greedy tokens after ids, and at each step the margin of the top logit over the next."""
    seq = _core.CoreSequence(llm._core, 128, kv_dtype=kv_dtype)
    logits, tokens, margins = seq.forward(ids), [], []
    for _ in range(n):
        top2 = np.sort(logits)[-2:]
        tokens.append(int(np.argmax(logits)))
        margins.append(float(top2[1] - top2[0]))
        logits = seq.forward([tokens[-1]])
    return tokens, margins


@pytest.mark.parametrize("prompt", [
    "Water boils at a temperature of 100 degrees Celsius, which is",
    "Once upon a time, there was a little",
    "The capital of France is",
    "The three primary colors are"])
def test_smollm2_greedy_tokens_are_the_same_with_an_f16_cache(smollm2_gguf, prompt):
    """24 greedy tokens: the same until a step where the f32 cache's top two logits are within
    GREEDY_MARGIN of each other (a tie that the rounding may break either way), and never before the
    fifth. Where the ties fall depends on the ISA: the 8-bit activations' rounding differs with each
    kernel's float order. Measured 2026-11-28: first differences at steps (none, none, 5, 11) on AVX2,
    (none, 12, 19, 8) on AVX-512, none on the scalar kernels; margins there 0.03-0.22."""
    llm = pyllm.load(smollm2_gguf, threads=2, n_ctx=128)
    ids = llm.tokenizer.encode(prompt)
    want, margins = _greedy(llm, ids, "f32", 24)
    got, _ = _greedy(llm, ids, "f16", 24)
    first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
    if first is not None:
        assert first >= 4 and margins[first] < GREEDY_MARGIN


def test_load_takes_kv_dtype_and_generates(smollm2_gguf):
    llm = pyllm.load(smollm2_gguf, threads=2, n_ctx=128, kv_dtype="f16")
    assert llm.kv_dtype == "f16"
    assert llm.generate("Once upon a time, there was a little", max_tokens=8, temperature=0).text == \
        pyllm.load(smollm2_gguf, threads=2, n_ctx=128, kv_dtype="f32").generate(
            "Once upon a time, there was a little", max_tokens=8, temperature=0).text


def test_the_default_cache_is_f16_for_quantized_weights_and_f32_for_float_ones(smollm2_gguf, family_checkpoint):
    # kv_dtype=None: f16 where the matmuls take 8-bit activations (llama.cpp's default cache type),
    # f32 where every matrix is float, as stored or as re-encoded at load; a named type always wins.
    folder = family_checkpoint("llama")
    cases = [(smollm2_gguf, {}, "f16"), (smollm2_gguf, {"dtype": "f32"}, "f32"), (folder, {}, "f32"),
             (smollm2_gguf, {"dtype": "q8_0"}, "f16"), (folder, {"dtype": "f16"}, "f32"),
             (smollm2_gguf, {"kv_dtype": "f32"}, "f32"), (folder, {"kv_dtype": "f16"}, "f16")]
    for source, options, want in cases:
        llm = pyllm.load(source, threads=2, n_ctx=64, **options)
        assert (llm.kv_dtype, _core.CoreSequence(llm._core, 8).kv_dtype) == (want, want), (source, options)


def _assert_batched_steps_are_each_sequence_s_own(llm, kv_dtype, steps, seed):
    """Three sequences stepped together through one forward_batch give each its solo logits, bit
    for bit, over caches of kv_dtype."""
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(3, llm.vocab_size, n)) for n in (1, 23, 9)]
    feeds = [list(rng.integers(3, llm.vocab_size, steps)) for _ in prompts]
    solo = []
    for prompt, feed in zip(prompts, feeds):
        seq = _core.CoreSequence(llm._core, 64)
        seq.forward(prompt)
        solo.append(np.stack([seq.forward([t]) for t in feed]))
    seqs = [_core.CoreSequence(llm._core, 64) for _ in prompts]
    assert all(s.kv_dtype == kv_dtype for s in seqs)
    for seq, prompt in zip(seqs, prompts):
        seq.forward(prompt)
    work = _core.CoreSequence(llm._core, 64, n_batch=len(prompts))
    batched = np.stack([work.forward_batch(seqs, [f[step] for f in feeds]) for step in range(steps)], axis=1)
    for a, b in zip(solo, batched):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("family", ["llama", "gemma2", "qwen3"])
def test_a_batched_step_over_f16_caches_is_each_sequence_s_own_step(family_checkpoint, family):
    llm = pyllm.load(family_checkpoint(family), threads=2, kv_dtype="f16")
    _assert_batched_steps_are_each_sequence_s_own(llm, "f16", steps=10, seed=1)


def test_the_f16_cache_is_half_the_bytes(family_checkpoint):
    llm = pyllm.load(family_checkpoint("llama"), threads=2)
    spec = llm.spec
    f32 = _core.CoreSequence(llm._core, 100, kv_dtype="f32")
    f16 = _core.CoreSequence(llm._core, 100, kv_dtype="f16")
    assert f32.cache_bytes == 2 * spec.n_layers * 100 * spec.n_kv_heads * spec.head_dim * 4
    assert f16.cache_bytes * 2 == f32.cache_bytes


def test_every_cache_of_a_model_takes_its_kv_dtype(family_checkpoint):
    llm = pyllm.load(family_checkpoint("llama"), threads=2, kv_dtype="f16", parallel=2)
    assert [c.seq.kv_dtype for c in llm.pool.caches] == ["f16"]
    assert _core.CoreSequence(llm._core, 8).kv_dtype == "f16"
    from pyllm.scheduler import Engine
    assert Engine(llm)._work.kv_dtype == "f16"


@pytest.mark.parametrize("bad", ["f8", "F16", "Q8_0", "q4_0", "", 16])
def test_a_bad_kv_dtype_is_refused(family_checkpoint, bad):
    folder = family_checkpoint("llama")
    with pytest.raises(ValueError, match="kv_dtype"):
        pyllm.load(folder, threads=2, kv_dtype=bad)
    llm = pyllm.load(folder, threads=2)
    with pytest.raises(ValueError, match="kv_dtype"):
        _core.CoreSequence(llm._core, 8, kv_dtype=bad if bad != "" else "bf16")


@pytest.mark.parametrize("n_tokens", [9, 24], ids=["vec", "sgemm"])
def test_a_trace_over_an_f16_cache_gives_f32_keys_and_values(family_checkpoint, n_tokens):
    """Keys and values come back in f32 as computed, before their rounding into the cache: layer 0's
    are the f32 cache's bit for bit (nothing before them reads the cache), later ones close."""
    folder = family_checkpoint("qwen3")
    m32, m16 = pyllm.load(folder, threads=2), pyllm.load(folder, threads=2, kv_dtype="f16")
    ids = [int(i) for i in np.random.default_rng(3).integers(3, m32.vocab_size, n_tokens)]
    t32 = m32.trace(ids, capture=("k", "v", "logits"))
    t16 = m16.trace(ids, capture=("k", "v", "logits"))
    for name in ("k", "v"):
        assert t16[name].dtype == np.float32
        np.testing.assert_array_equal(t16[name][0], t32[name][0])
        np.testing.assert_allclose(t16[name], t32[name], rtol=0, atol=FAMILY_ATOL)
    np.testing.assert_array_equal(t16["logits"], m16.logits(ids))


# ---------------------------------------------------------------- the q8_0 cache

Q8_0_F32_ACT_ATOL = 1.0  # SmolLM2 widened, float activations: observed 0.46 (f16: 0.017)


def test_a_q8_0_cache_needs_whole_blocks_per_head(family_checkpoint):
    folder = family_checkpoint("llama")  # head_dim 18
    with pytest.raises(ValueError, match="head_dim that is a multiple of 32.*not 18"):
        pyllm.load(folder, threads=2, kv_dtype="q8_0")
    llm = pyllm.load(folder, threads=2)
    with pytest.raises(ValueError, match="multiple of 32"):
        _core.CoreSequence(llm._core, 8, kv_dtype="q8_0")


def test_smollm2_q8_0_cache_bytes_and_logits(smollm2_gguf):
    """34 bytes per 32 values; logits within the 8-bit activations' tolerance of the f32 cache, as
    the f16 cache's; a prompt fed whole or token by token, the same bits."""
    llm = pyllm.load(smollm2_gguf, threads=2, n_ctx=128, kv_dtype="q8_0")
    spec = llm.spec
    seq = _core.CoreSequence(llm._core, 100)
    assert seq.kv_dtype == "q8_0"
    assert seq.cache_bytes == 2 * spec.n_layers * 100 * spec.n_kv_heads * spec.head_dim // 32 * 34
    for seed in range(2):
        prompt, step = _max_diffs(llm, 9, 16, seed, kv_dtype="q8_0")
        print(f"smollm2 q8_0 seed={seed}: max |dlogit| prompt {prompt:.3f}, decode {step:.3f}")
        assert 0 < max(prompt, step) and prompt < SMOLLM2_ATOL and step < SMOLLM2_ATOL
    ids = [int(t) for t in np.random.default_rng(5).integers(3, llm.vocab_size, 40)]
    whole = seq.forward(ids, all_logits=True)
    one = _core.CoreSequence(llm._core, 100)
    np.testing.assert_array_equal(whole, np.stack([one.forward([t]) for t in ids]))


def test_smollm2_widened_q8_0_cache_logits_are_within_tolerance_of_f32(smollm2_gguf):
    """Float activations and the sgemm attention (40-token prompt) over widened q8_0 rows."""
    llm = pyllm.load(smollm2_gguf, threads=2, n_ctx=128, dtype="f32")
    prompt, step = _max_diffs(llm, 40, 16, kv_dtype="q8_0")
    print(f"smollm2 f32 weights, q8_0 cache: max |dlogit| prompt {prompt:.3f}, decode {step:.3f}")
    assert prompt < Q8_0_F32_ACT_ATOL and step < Q8_0_F32_ACT_ATOL


def test_smollm2_batched_steps_over_q8_0_caches_are_each_sequence_s_own(smollm2_gguf):
    llm = pyllm.load(smollm2_gguf, threads=2, n_ctx=64, kv_dtype="q8_0")
    _assert_batched_steps_are_each_sequence_s_own(llm, "q8_0", steps=6, seed=2)


def test_smollm2_chats_and_generates_with_a_q8_0_cache_as_with_f32(smollm2_gguf):
    llm = pyllm.load(smollm2_gguf, threads=2, n_ctx=128, kv_dtype="q8_0")
    f32 = pyllm.load(smollm2_gguf, threads=2, n_ctx=128)
    assert llm.kv_dtype == "q8_0"
    messages = [{"role": "user", "content": "Name the capital of France."}]
    assert llm.chat(messages, max_tokens=12, temperature=0).text == "The capital of France is Paris."
    prompt = "Once upon a time, there was a little"
    assert llm.generate(prompt, max_tokens=12, temperature=0).text == \
        f32.generate(prompt, max_tokens=12, temperature=0).text
