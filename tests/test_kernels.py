"""Float kernels of the C core against numpy/torch references, for every ISA this CPU runs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pyllm import _core, _kernels
from pyllm.blas import openblas_thread_controls
from pyllm.dtypes import WeightType

F32, F16, BF16 = int(WeightType.F32), int(WeightType.F16), int(WeightType.BF16)



def _bf16_bytes(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).bfloat16().view(torch.int16).numpy().view(np.uint8).reshape(-1)


def test_every_f16_value_widens_exactly(isa):
    bits = np.arange(1 << 16, dtype=np.uint16)
    got = _core.to_f32(F16, bits.view(np.uint8), bits.size)
    want = bits.view(np.float16).astype(np.float32)
    assert np.array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()


def test_f32_narrows_to_f16_rounding_to_nearest_even(isa, rng):
    x = np.concatenate([rng.standard_normal(4096).astype(np.float32) * 10.0 ** rng.integers(-9, 6, 4096),
                        np.array([0.0, -0.0, 65504, 65520, 65519.99, 1e-8, 6e-8, 3e-8, 2.98e-8,
                                  np.inf, -np.inf], np.float32)]).astype(np.float32)
    got = _kernels.from_f32(F16, x).view(np.float16)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_every_bf16_value_widens_exactly(isa):
    bits = np.arange(1 << 16, dtype=np.uint16)
    got = _core.to_f32(BF16, bits.view(np.uint8), bits.size)
    want = (bits.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_f32_narrows_to_bf16_as_torch_rounds(rng):
    x = (rng.standard_normal(10000) * 10.0 ** rng.integers(-30, 30, 10000)).astype(np.float32)
    assert np.array_equal(_kernels.from_f32(BF16, x), _bf16_bytes(x))


@pytest.mark.parametrize("wtype", [F32, F16, BF16])
@pytest.mark.parametrize("n", [1, 7, 64, 576, 1000])
def test_vec_dot_matches_float64(isa, wtype, n, rng):
    w = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    wb = {F32: w.view(np.uint8), F16: w.astype(np.float16).view(np.uint8), BF16: _bf16_bytes(w)}[wtype]
    wf = _core.to_f32(wtype, wb, n).astype(np.float64)
    got = _kernels.vec_dot(wtype, wb, x.view(np.uint8), n)
    assert got == pytest.approx(float(wf @ x.astype(np.float64)), rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("wtype", [F32, F16, BF16])
@pytest.mark.parametrize("n_tokens", [1, 3, 15, 16, 40])
@pytest.mark.parametrize("path", ["vec_dot", "sgemm_thread0", "sgemm_per_thread"])
def test_matmul_paths_match_numpy(isa, wtype, n_tokens, path, rng):
    rows, cols = 70, 96
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    wb = {F32: w.view(np.uint8), F16: w.astype(np.float16).view(np.uint8), BF16: _bf16_bytes(w)}[wtype]
    wf = _core.to_f32(wtype, wb.reshape(-1), rows * cols).reshape(rows, cols)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    for threads in (1, 2, 3):
        # a small tile forces several sgemm tiles per matrix
        controls = openblas_thread_controls() if path == "sgemm_per_thread" else (0, 0)
        y = _kernels.matmul(wtype, wb.reshape(-1), rows, cols, x, threads=threads,
                         blas=path != "vec_dot", tile_floats=cols * 9, blas_controls=controls)
        np.testing.assert_allclose(y, x @ wf.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 7, 8, 64, 1000])
def test_softmax_matches_float64(isa, n, rng):
    x = (rng.standard_normal(n) * 20).astype(np.float32)
    want = np.exp(x.astype(np.float64) - x.max())
    want /= want.sum()
    np.testing.assert_allclose(_kernels.softmax(x), want, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("n", [1, 9, 64, 1536])
def test_swiglu_matches_float64(isa, n, rng):
    g = (rng.standard_normal(n) * 8).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32)
    g64 = g.astype(np.float64)
    want = g64 / (1 + np.exp(-g64)) * u
    np.testing.assert_allclose(_kernels.swiglu(g, u), want, rtol=2e-6, atol=1e-7)


def test_scipy_openblas_thread_control_is_found():
    """Without it prefill falls back to one sgemm caller; SciPy's wheels on Linux ship OpenBLAS."""
    import sys

    if sys.platform.startswith("linux"):
        assert all(openblas_thread_controls())


def test_best_isa_is_installed_at_import():
    assert _core.current_isa() == _core.best_isa()


def test_unknown_isa_name_raises():
    with pytest.raises(ValueError, match="unknown ISA"):
        _core.set_isa("sse9")
