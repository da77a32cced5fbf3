"""Every op of the block against a numpy reference, on every ISA this CPU runs (ggml's
test-backend-ops habit): norms, both rope layouts and partial rope, soft-caps, the GLU activations,
and causal attention with windows and soft-caps on the vec and the sgemm path."""
from __future__ import annotations

import numpy as np
import pytest

from pyllm import _core, _kernels

ISAS = [isa for isa in _core.ISA_NAMES.values()
        if isa == "scalar" or _core.set_isa(isa) == isa]
_core.set_isa("best")


@pytest.fixture(params=ISAS)
def isa(request):
    _core.set_isa(request.param)
    yield request.param
    _core.set_isa("best")


def rms_ref(x, w, eps):
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt((x64 ** 2).mean() + eps) * w).astype(np.float32)


def layernorm_ref(x, w, b, eps):
    x64 = x.astype(np.float64)
    out = (x64 - x64.mean()) / np.sqrt(x64.var() + eps) * w
    return (out + (b if b is not None else 0)).astype(np.float32)


def gelu_tanh_ref(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("n", [1, 7, 64, 333])
def test_rmsnorm_matches_numpy(isa, rng, n):
    x = rng.normal(0, 3, n).astype(np.float32)
    w = rng.normal(1, 0.3, n).astype(np.float32)
    np.testing.assert_allclose(_kernels.norm(x, w, kind="rms", eps=1e-6), rms_ref(x, w, 1e-6), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("n,with_bias", [(5, True), (64, True), (333, False)])
def test_layernorm_matches_numpy(isa, rng, n, with_bias):
    x = (rng.normal(0, 2, n) + 50).astype(np.float32)  # a large mean must not cancel the variance away
    w = rng.normal(1, 0.3, n).astype(np.float32)
    b = rng.normal(0, 0.1, n).astype(np.float32) if with_bias else None
    got = _kernels.norm(x, w, b, kind="layer", eps=1e-5)
    np.testing.assert_allclose(got, layernorm_ref(x, w, b, 1e-5), rtol=1e-4, atol=1e-4)


def rope_ref(x, n_heads, n_rot, cos, sin, interleaved):
    out = x.astype(np.float64).copy()
    hd = x.shape[1] // n_heads
    half = n_rot // 2
    for h in range(n_heads):
        v = out[:, h * hd:(h + 1) * hd]
        a = np.arange(half) * 2 if interleaved else np.arange(half)
        b = a + 1 if interleaved else a + half
        x0, x1 = v[:, a].copy(), v[:, b].copy()
        v[:, a] = x0 * cos[:half] - x1 * sin[:half]
        v[:, b] = x1 * cos[:half] + x0 * sin[:half]
    return out.astype(np.float32)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("head_dim,n_rot", [(16, 16), (16, 8), (24, 6), (16, 0)])
def test_rope_matches_numpy_in_both_layouts_and_partially(isa, rng, interleaved, head_dim, n_rot):
    x = rng.normal(0, 1, (3, 4 * head_dim)).astype(np.float32)
    angles = (7 * 10000.0 ** (-np.arange(max(n_rot, 2) // 2) * 2 / max(n_rot, 2))).astype(np.float32)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    got = _kernels.rope(x, 4, n_rot, cos, sin, interleaved)
    np.testing.assert_allclose(got, rope_ref(x, 4, n_rot, cos, sin, interleaved), rtol=1e-5, atol=1e-6)
    if n_rot < head_dim:  # the dims past n_rot pass unchanged
        tail = np.concatenate([np.arange(h * head_dim + n_rot, (h + 1) * head_dim) for h in range(4)])
        assert np.array_equal(got[:, tail], x[:, tail])


def test_softcap_matches_numpy(isa, rng):
    x = rng.normal(0, 40, 1000).astype(np.float32)
    got = _kernels.softcap(x, 30.0)
    np.testing.assert_allclose(got, (30.0 * np.tanh(x.astype(np.float64) / 30.0)), rtol=1e-6, atol=1e-5)
    assert np.abs(got).max() < 30.0


@pytest.mark.parametrize("n", [1, 8, 13, 1000])
def test_gelu_and_geglu_match_numpy(isa, rng, n):
    g = rng.normal(0, 3, n).astype(np.float32)
    u = rng.normal(0, 1, n).astype(np.float32)
    np.testing.assert_allclose(_kernels.gelu(g), gelu_tanh_ref(g), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_kernels.geglu(g, u), gelu_tanh_ref(g) * u, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 8, 13, 1000])
def test_swiglu_matches_numpy(isa, rng, n):
    g = rng.normal(0, 3, n).astype(np.float32)
    u = rng.normal(0, 1, n).astype(np.float32)
    g64 = g.astype(np.float64)
    np.testing.assert_allclose(_kernels.swiglu(g, u), g64 / (1 + np.exp(-g64)) * u, rtol=1e-5, atol=1e-6)


def attention_ref(q, k, v, n_heads, n_kv, scale, pos0, window, softcap, probs=None):
    """The attention output; probs, if given (n_heads, n, pos0 + n), receives the probabilities."""
    n, hd = q.shape[0], q.shape[1] // n_heads
    group = n_heads // n_kv
    out = np.zeros(q.shape, np.float64)
    for t in range(n):
        p = pos0 + t
        lo = max(0, p - window + 1) if window else 0
        for h in range(n_heads):
            kv = h // group
            qh = q[t, h * hd:(h + 1) * hd].astype(np.float64)
            kh = k[lo:p + 1, kv * hd:(kv + 1) * hd].astype(np.float64)
            s = kh @ qh * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            s = np.exp(s - s.max())
            s /= s.sum()
            if probs is not None:
                probs[h, t, lo:p + 1] = s
            out[t, h * hd:(h + 1) * hd] = s @ v[lo:p + 1, kv * hd:(kv + 1) * hd]
    return out.astype(np.float32)


def by_head(rows: np.ndarray, n_kv: int) -> np.ndarray:
    """A cache's (positions, n_kv · hd) rows laid out as a model state keeps them: (n_kv, positions, hd)."""
    return np.ascontiguousarray(rows.reshape(rows.shape[0], n_kv, -1).transpose(1, 0, 2))


@pytest.mark.parametrize("blas", [False, True])
@pytest.mark.parametrize("n_heads,n_kv,pos0,n,window,softcap", [
    (4, 4, 0, 40, 0, 0.0),     # multi-head, whole past
    (4, 2, 0, 70, 8, 0.0),     # GQA, a window shorter than the sequence, two query blocks
    (4, 1, 5, 33, 0, 0.0),     # MQA, a prefix already cached
    (4, 2, 3, 40, 16, 5.0),    # a soft-cap that bends the scores, and a window
    (2, 1, 60, 1, 12, 0.0),    # one decoded token past the window
])
def test_attention_matches_numpy(isa, rng, blas, n_heads, n_kv, pos0, n, window, softcap):
    hd = 16
    q = rng.normal(0, 1.5, (n, n_heads * hd)).astype(np.float32)
    k = rng.normal(0, 1.5, (pos0 + n, n_kv * hd)).astype(np.float32)
    v = rng.normal(0, 1, (pos0 + n, n_kv * hd)).astype(np.float32)
    scale = 0.3
    got = _kernels.attention(q, k, v, n_heads, n_kv, scale, pos0=pos0, window=window, softcap=softcap,
                          blas=blas, threads=2)
    want = attention_ref(q, k, v, n_heads, n_kv, scale, pos0, window, softcap)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # a trace's copy of the probabilities: the same output, and 0 outside each query's window
    got_again, probs = _kernels.attention(q, k, v, n_heads, n_kv, scale, pos0=pos0, window=window,
                                       softcap=softcap, blas=blas, threads=2, with_probs=True)
    want_probs = np.zeros((n_heads, n, pos0 + n))
    attention_ref(q, k, v, n_heads, n_kv, scale, pos0, window, softcap, want_probs)
    np.testing.assert_array_equal(got_again, got)
    np.testing.assert_allclose(probs, want_probs, rtol=1e-4, atol=1e-6)
    # the head-major cache a model state keeps
    got = _kernels.attention(q, by_head(k, n_kv), by_head(v, n_kv), n_heads, n_kv, scale, pos0=pos0, window=window,
                          softcap=softcap, blas=blas, threads=2, head_major=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
