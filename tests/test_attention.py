"""pl_attention's multi-query path: every query bit for bit the one-query-at-a-time reference
(pl_attention_per_query) on every ISA this CPU runs, whatever the batch, the threads and the scratch;
within tolerance of float64; and the multi-query pl_vec kernels bit for bit their ISA's single ones."""
from __future__ import annotations

import numpy as np
import pytest

from pyllm import _core, _kernels
from test_ops import attention_ref, by_head




def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint32)


def inputs(rng, n_heads, n_kv, hd, pos0, n, kv_dtype):
    q = rng.normal(0, 1.5, (n, n_heads * hd)).astype(np.float32)
    k = rng.normal(0, 1.5, (pos0 + n, n_kv * hd)).astype(kv_dtype)
    v = rng.normal(0, 1, (pos0 + n, n_kv * hd)).astype(kv_dtype)
    return q, k, v


# (query heads, KV heads, head_dim): groups 1, 3 (SmolLM2's 9/3 at head_dim 64) and 4; head_dims
# that leave a tail past the last multiple of 8 (and of 16, AVX-512's width)
SHAPES = [(4, 4, 16), (9, 3, 64), (8, 2, 20), (4, 1, 36)]


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (24, 0.0), (0, 5.0), (24, 5.0)])
@pytest.mark.parametrize("n_heads,n_kv,hd", SHAPES)
def test_attention_of_a_batch_is_bit_identical_to_one_query_at_a_time(isa, rng, n_heads, n_kv, hd, window,
                                                                       softcap, kv_dtype):
    pos0, n = 37, 64
    q, k, v = inputs(rng, n_heads, n_kv, hd, pos0, n, kv_dtype)
    want, want_probs = _kernels.attention(q, k, v, n_heads, n_kv, 0.3, pos0=pos0, window=window, softcap=softcap,
                                       per_query=True, with_probs=True)
    for threads in (1, 2, 3):
        got, probs = _kernels.attention(q, k, v, n_heads, n_kv, 0.3, pos0=pos0, window=window, softcap=softcap,
                                     threads=threads, with_probs=True)
        assert np.array_equal(bits(got), bits(want)), threads
        assert np.array_equal(bits(probs), bits(want_probs)), threads
    # a model state's head-major cache: the same numbers from either layout, on either path
    for per_query in (False, True):
        got, probs = _kernels.attention(q, by_head(k, n_kv), by_head(v, n_kv), n_heads, n_kv, 0.3, pos0=pos0,
                                     window=window, softcap=softcap, threads=2, with_probs=True, per_query=per_query,
                                     head_major=True)
        assert np.array_equal(bits(got), bits(want)), per_query
        assert np.array_equal(bits(probs), bits(want_probs)), per_query
    # a scratch that holds fewer queries at once: other blocks, the same numbers
    for per in (pos0 + n, 2 * (pos0 + n) + 5, 7 * (pos0 + n)):
        got = _kernels.attention(q, k, v, n_heads, n_kv, 0.3, pos0=pos0, window=window, softcap=softcap,
                              threads=2, scores_per_thread=per)
        assert np.array_equal(bits(got), bits(want)), per


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (40, 0.0), (0, 5.0)])
@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (9, 3), (8, 2)])
def test_a_position_gets_the_same_bits_in_a_prefill_of_any_length_and_in_a_decode_step(isa, rng, n_heads, n_kv,
                                                                                      window, softcap, kv_dtype):
    hd, total = 32, 301  # positions 0..300
    q, k, v = inputs(rng, n_heads, n_kv, hd, 0, total, kv_dtype)
    whole = _kernels.attention(q, k, v, n_heads, n_kv, 0.25, window=window, softcap=softcap, threads=2)
    for t in range(total):  # each position as a decode step over the cache before it
        one = _kernels.attention(q[t:t + 1], k[:t + 1], v[:t + 1], n_heads, n_kv, 0.25, pos0=t, window=window,
                              softcap=softcap, threads=1 + t % 2)
        assert np.array_equal(bits(one[0]), bits(whole[t])), t
    for pos0, n in [(0, 5), (17, 64), (250, 51)]:  # and in chunks of a prefill
        part = _kernels.attention(q[pos0:pos0 + n], k[:pos0 + n], v[:pos0 + n], n_heads, n_kv, 0.25, pos0=pos0,
                               window=window, softcap=softcap, threads=2)
        assert np.array_equal(bits(part), bits(whole[pos0:pos0 + n])), (pos0, n)
    want = attention_ref(q, k.astype(np.float32), v.astype(np.float32), n_heads, n_kv, 0.25, 0, window, softcap)
    np.testing.assert_allclose(whole, want, rtol=1e-4, atol=1e-5)


# group 20 is more queries than a multi-query kernel call takes (16); head_dim 20 leaves a tail (and
# no q8_0 cache: its head rows are whole blocks of 32)
DECODE_SHAPES = [(9, 3, 64), (4, 1, 32), (8, 2, 96), (4, 4, 32), (20, 1, 32), (6, 2, 20)]


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (40, 0.0), (0, 5.0)])
@pytest.mark.parametrize("n_heads,n_kv,hd,cache", [(*shape, cache) for shape in DECODE_SHAPES
                                                   for cache in ("f32", "f16", "q8_0") if cache != "q8_0" or shape[2] % 32 == 0])
def test_a_decode_step_shared_by_the_threads_is_bit_identical_to_one_query_at_a_time(isa, rng, n_heads, n_kv,
                                                                                   hd, cache, window, softcap):
    for pos in (0, 5, 130, 301):  # keys short of a block of 8, and many blocks cut between threads
        q, k, v = inputs(rng, n_heads, n_kv, hd, pos, 1, np.float16 if cache == "f16" else np.float32)
        k, v = by_head(k, n_kv), by_head(v, n_kv)
        kw = dict(pos0=pos, window=window, softcap=softcap, head_major=True, q8_0=cache == "q8_0", with_probs=True)
        want, want_probs = _kernels.attention(q, k, v, n_heads, n_kv, 0.3, per_query=True, **kw)
        for threads in (1, 2, 3, 5):
            got, probs = _kernels.attention(q, k, v, n_heads, n_kv, 0.3, threads=threads, decode=True, **kw)
            assert np.array_equal(bits(got), bits(want)), (pos, threads)
            assert np.array_equal(bits(probs), bits(want_probs)), (pos, threads)


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (40, 0.0), (0, 5.0)])
@pytest.mark.parametrize("n_heads,n_kv,hd,cache", [(*shape, cache) for shape in DECODE_SHAPES
                                                   for cache in ("f32", "f16", "q8_0") if cache != "q8_0" or shape[2] % 32 == 0])
def test_a_batched_step_over_many_caches_gives_each_row_its_own_bits(isa, rng, n_heads, n_kv, hd, cache, window,
                                                                     softcap):
    """pl_attention_rows (a batched decode step: each row over its own sequence's cache, the items
    of all rows dealt together) against each row alone through the one-query reference."""
    dtype = np.float16 if cache == "f16" else np.float32
    rows, want = [], []
    for pos in (0, 5, 130, 301, 7, 64):  # rows of very different lengths, some shorter than a block of 8
        q, k, v = inputs(rng, n_heads, n_kv, hd, pos, 1, dtype)
        k, v = by_head(k, n_kv), by_head(v, n_kv)
        rows.append((q[0], k, v, pos))
        want.append(_kernels.attention(q, k, v, n_heads, n_kv, 0.3, pos0=pos, window=window, softcap=softcap,
                                    head_major=True, q8_0=cache == "q8_0", per_query=True)[0])
    want = np.stack(want)
    kw = dict(window=window, softcap=softcap, q8_0=cache == "q8_0")
    for count in (1, 2, len(rows)):  # one row (its queries cut into items for the threads), a few, all
        for threads in (1, 2, 3, 5):
            got = _kernels.attention_rows(rows[:count], n_heads, n_kv, 0.3, threads=threads, **kw)
            assert np.array_equal(bits(got), bits(want[:count])), (count, threads)
    # a scratch that holds one query of the longest row: items of single queries, the same numbers
    got = _kernels.attention_rows(rows, n_heads, n_kv, 0.3, threads=2, scores_per_thread=302, **kw)
    assert np.array_equal(bits(got), bits(want))


def test_a_batched_step_refuses_rows_that_do_not_fit(rng):
    q, k, v = inputs(rng, 4, 2, 32, 9, 1, np.float32)
    k, v = by_head(k, 2), by_head(v, 2)
    good = (q[0], k, v, 9)
    with pytest.raises(ValueError):
        _kernels.attention_rows([good, (q[0], k, v, 8)], 4, 2, 0.3)  # a cache of other than pos + 1 keys
    with pytest.raises(ValueError):
        _kernels.attention_rows([(q[0], k[:, :0], v[:, :0], -1)], 4, 2, 0.3)  # a negative position
    with pytest.raises(ValueError):
        _kernels.attention_rows([good, (q[0, :64], k, v, 9)], 4, 2, 0.3)  # another head_dim
    with pytest.raises(ValueError):
        _kernels.attention_rows([good], 4, 2, 0.3, scores_per_thread=9)  # scratch short of the keys
    with pytest.raises(ValueError):
        _kernels.attention_rows([], 4, 2, 0.3)


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [1, 7, 8, 16, 20, 36, 64, 72, 128])
def test_multi_query_kernels_are_bit_identical_to_the_single_ones(isa, rng, n, kv_dtype):
    nq, nk = 5, 29  # eight keys at a time and a rest
    qs = rng.normal(0, 1, (nq, n)).astype(np.float32)
    k = rng.normal(0, 1, (nk, n)).astype(kv_dtype)
    got = _kernels.dot_qk(qs, k)
    assert np.array_equal(bits(got), bits(_kernels.dot_qk(qs, k, single=True)))
    np.testing.assert_allclose(got, qs.astype(np.float64) @ k.astype(np.float64).T, rtol=1e-5, atol=1e-4)

    ys = rng.normal(0, 1, (nq, n)).astype(np.float32)
    ws = rng.uniform(0, 1, (nq, 150)).astype(np.float32)
    x = rng.normal(0, 1, (150, n)).astype(kv_dtype)
    first, end = [0, 3, 70, 64, 149], [150, 67, 140, 128, 150]  # ragged, across row chunks
    got = _kernels.axpy_qk(ys, ws, first, end, x)
    assert np.array_equal(bits(got), bits(_kernels.axpy_qk(ys, ws, first, end, x, single=True)))
    want = ys.astype(np.float64)
    for i in range(nq):
        want[i] += ws[i, first[i]:end[i]].astype(np.float64) @ x[first[i]:end[i]].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (24, 5.0)])
@pytest.mark.parametrize("n_heads,n_kv,hd", [(9, 3, 64), (4, 1, 32), (8, 2, 96)])
def test_attention_over_a_q8_0_cache_is_the_same_in_any_batch_and_exact_over_its_values(isa, rng, n_heads, n_kv,
                                                                                       hd, window, softcap):
    """kv_dtype="q8_0": each head's key and value rows quantized to blocks of 32; attention widens
    them (exactly: an f16 scale times a small integer), so every path gives the per-query bits and
    the result is attention over the dequantized values."""
    pos0, n = 37, 64
    q, k, v = inputs(rng, n_heads, n_kv, hd, pos0, n, np.float32)
    kh, vh = by_head(k, n_kv), by_head(v, n_kv)
    args = dict(pos0=pos0, window=window, softcap=softcap, q8_0=True)
    want = _kernels.attention(q, kh, vh, n_heads, n_kv, 0.3, per_query=True, head_major=True, **args)
    for threads in (1, 2, 3):
        got = _kernels.attention(q, kh, vh, n_heads, n_kv, 0.3, threads=threads, head_major=True, **args)
        assert np.array_equal(bits(got), bits(want)), threads
    got = _kernels.attention(q, k, v, n_heads, n_kv, 0.3, threads=2, **args)  # position-major rows, same blocks
    assert np.array_equal(bits(got), bits(want))
    q8 = _core.KV_DTYPES["q8_0"]
    deq = [_core.to_f32(q8, _kernels.from_f32(q8, x.ravel()), x.size).reshape(x.shape) for x in (k, v)]
    exact = attention_ref(q, deq[0], deq[1], n_heads, n_kv, 0.3, pos0, window, softcap)
    np.testing.assert_allclose(want, exact, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_kernels.attention(q, kh, vh, n_heads, n_kv, 0.3, blas=True, threads=2, head_major=True,
                                               **args), exact, rtol=1e-4, atol=1e-5)
    assert np.abs(deq[0] - k).max() > 0  # the cache did round
