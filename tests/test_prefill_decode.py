"""Prefill computes what decode does. With quantized weights every matmul multiplies activations
quantized per row, and attention runs query by query, at any batch size: a position's logits are
the same bits whether its prompt went through in one call, in chunks of any length, a token at a
time, or as a row of a batched step — for every quantized type, both cache types, and the real
files. (Float weights prefill through sgemm and agree within rounding, tested elsewhere.)"""
from __future__ import annotations

import numpy as np
import pytest

import pyllm
from conftest import make_tiny_checkpoint
from families import convert_to_gguf, make_family_checkpoint
from pyllm import _core, _kernels

QUANTIZED = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]


def _feed(llm, ids, cuts, kv_dtype="f32"):
    """Logits after feeding ids in pieces cut at cuts, on a fresh sequence."""
    seq = _core.CoreSequence(llm._core, len(ids) + 1, kv_dtype=kv_dtype)
    bounds = [0, *cuts, len(ids)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        out = seq.forward(ids[lo:hi])
    return out


def _one_at_a_time(llm, ids, kv_dtype="f32"):
    return _feed(llm, ids, list(range(1, len(ids))), kv_dtype)


@pytest.fixture(scope="module")
def k_quant_checkpoint(tmp_path_factory):
    # widths of whole 256-element super-blocks, so the k-quants quantize every matrix themselves
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("kq")), hidden_size=256, intermediate_size=512,
                                num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
@pytest.mark.parametrize("dtype", QUANTIZED)
def test_one_batch_chunks_and_single_tokens_give_the_same_bits(k_quant_checkpoint, dtype, kv_dtype):
    llm = pyllm.load(k_quant_checkpoint, dtype=dtype, threads=2)
    ids = list(np.random.default_rng(3).integers(3, llm.vocab_size, 40))
    whole = _feed(llm, ids, [], kv_dtype)
    assert np.isfinite(whole).all() and whole.std() > 0
    np.testing.assert_array_equal(_one_at_a_time(llm, ids, kv_dtype), whole)
    np.testing.assert_array_equal(_feed(llm, ids, [5, 21, 22], kv_dtype), whole)


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_a_q8_0_file_s_packed_matrices_give_the_same_bits(tmp_path, kv_dtype):
    """q8_0 matrices in a file (llama.cpp's converter) are packed at load, 8 rows interleaved: one
    kernel for every batch size."""
    folder = make_family_checkpoint(str(tmp_path / "hf"), "llama", hidden_size=64, intermediate_size=160)
    llm = pyllm.load(convert_to_gguf(folder, str(tmp_path / "q8_0.gguf"), "q8_0"), threads=2)
    ids = list(np.random.default_rng(5).integers(3, llm.vocab_size, 40))
    whole = _feed(llm, ids, [], kv_dtype)
    np.testing.assert_array_equal(_one_at_a_time(llm, ids, kv_dtype), whole)
    np.testing.assert_array_equal(_feed(llm, ids, [3, 19], kv_dtype), whole)
    reference = pyllm.load(folder, dtype="f32", threads=2).logits(ids)[-1]
    assert np.corrcoef(whole, reference)[0, 1] > 0.99


@pytest.mark.parametrize("wtype", [2, 3, 6, 8, 12, 13, 14], ids=["q4_0", "q4_1", "q5_0", "q8_0", "q4_K", "q5_K", "q6_K"])
@pytest.mark.parametrize("threads", [1, 3])
def test_the_engine_s_matmul_on_packed_weights_is_the_kernel_s_for_any_split(wtype, threads):
    rng = np.random.default_rng(6)
    rows, cols = 45, 512  # whole k-quant super-blocks
    w = _kernels.from_f32(wtype, rng.standard_normal(rows * cols).astype(np.float32))
    x = rng.standard_normal((9, cols)).astype(np.float32)
    packed = _kernels.matmul(wtype, w, rows, cols, x, threads=threads, blas=False, packed=True)
    rowwise = _kernels.matmul(wtype, w, rows, cols, x, threads=threads, blas=False)
    if _core.packed_type(wtype):
        np.testing.assert_array_equal(packed, _kernels.gemm_packed(wtype, _kernels.pack_weights(wtype, w, rows, cols),
                                                                rows, cols, x))
        for t in range(len(x)):  # each token alone: the same bits
            np.testing.assert_array_equal(
                _kernels.matmul(wtype, w, rows, cols, x[t:t + 1], threads=threads, blas=False, packed=True), packed[t:t + 1])
    else:
        np.testing.assert_array_equal(packed, rowwise)  # no packed kernel: the row kernels
    np.testing.assert_allclose(packed, rowwise, rtol=1e-4, atol=1e-4 * np.abs(rowwise).max())


def test_every_row_of_a_batch_with_all_logits_equals_its_step(k_quant_checkpoint):
    llm = pyllm.load(k_quant_checkpoint, dtype="q4_1", threads=2)
    ids = list(np.random.default_rng(4).integers(3, llm.vocab_size, 24))
    rows = llm.logits(ids)
    seq = _core.CoreSequence(llm._core, len(ids))
    for i, token in enumerate(ids):
        np.testing.assert_array_equal(seq.forward([token]), rows[i])


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])  # f16: the default cache of quantized weights
def test_the_real_q4_1_file_prefills_what_it_decodes(smollm2_gguf, kv_dtype):
    llm = pyllm.load(smollm2_gguf, threads=2, kv_dtype=kv_dtype)
    ids = llm.tokenize("The history of the city begins with a small settlement by the river. " * 30)[:300]
    assert len(ids) == 300
    whole = _feed(llm, ids, [], kv_dtype)
    np.testing.assert_array_equal(_one_at_a_time(llm, ids, kv_dtype), whole)
    np.testing.assert_array_equal(_feed(llm, ids, [128, 129, 256], kv_dtype), whole)
    # and what greedy decoding then does: a fresh prompt of prompt + generated tokens prefills to
    # the logits the last step gave
    out = llm.generate(ids[:100], max_tokens=20, temperature=0)
    again = _feed(llm, ids[:100] + list(out.token_ids[:-1]), [], kv_dtype)
    assert int(np.argmax(again)) == out.token_ids[-1]


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_the_real_gemma3_file_prefills_what_it_decodes(gemma3_gguf, kv_dtype):
    """Q4_K, Q6_K and q8_0 matrices, sliding-window layers, two rope tables."""
    llm = pyllm.load(gemma3_gguf, threads=2, kv_dtype=kv_dtype)
    ids = llm.tokenize("The history of the city begins with a small settlement by the river. " * 8)[:150]
    whole = _feed(llm, ids, [], kv_dtype)
    np.testing.assert_array_equal(_one_at_a_time(llm, ids, kv_dtype), whole)


@pytest.mark.parametrize("threads", [2, 3])
def test_float_weights_give_the_same_bits_on_any_thread_count(family_checkpoint, threads):
    """Float matrices' rows are dealt in chunks too (README): decode steps and a short prompt (under
    sgemm's 16 tokens) give one thread's bits on any thread count."""
    folder = family_checkpoint("llama")
    one, many = pyllm.load(folder, threads=1), pyllm.load(folder, threads=threads)
    assert many._core.n_threads == threads
    ids = list(np.random.default_rng(7).integers(3, one.vocab_size, 12))
    mine, theirs = (_core.CoreSequence(m._core, 64) for m in (one, many))
    np.testing.assert_array_equal(theirs.forward(ids[:9]), mine.forward(ids[:9]))
    for token in ids[9:]:
        np.testing.assert_array_equal(theirs.forward([token]), mine.forward([token]))
