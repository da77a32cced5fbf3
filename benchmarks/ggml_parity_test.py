"""pyllm's block formats and kernels against ggml itself (llama-cpp-python's bundled libggml):
quantize/dequantize bytes and CPU dot kernels. Not part of the test suite, since llama.cpp is a
benchmark reference only; run it with `python -m pytest benchmarks/ggml_parity_test.py` where
llama-cpp-python is installed."""
import ctypes
import importlib.util
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_quants import (  # noqa: F401  (isa is a fixture)
    isa,  # noqa: E402
    ACTIVATION_OF, ISAS, QK_K, WEIGHT_TYPES, W, _core, _kernels, bits_of, block_size, dot_reference,
    dot_tolerance, gaussian, random_blocks, type_size, weight_row,
)


# ---------------------------------------------------------------- ggml itself, where installed


def load_libggml():
    """llama-cpp-python's bundled libggml-base and libggml-cpu, or None."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    libdir = os.path.join(os.path.dirname(spec.origin), "lib")
    try:
        base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
        cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"))
    except OSError:
        return None
    return base, cpu


LIBGGML = load_libggml()
if LIBGGML is None:
    pytest.skip("needs llama-cpp-python (libggml)", allow_module_level=True)


def ggml_name(t: W) -> str:
    return t.name.lower()[:-1] + "K" if t.name.endswith("K") else t.name.lower()


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("t", WEIGHT_TYPES + [W.Q8_K], ids=lambda t: t.name)
def test_quantize_and_dequantize_match_libggml_bytes(t):
    base, _ = LIBGGML
    x = gaussian(64 * QK_K, 20 + int(t))
    x[:QK_K] = 0.0
    want = np.zeros(x.size // block_size(t) * type_size(t), dtype=np.uint8)
    getattr(base, f"quantize_row_{ggml_name(t)}_ref")(ptr(x), ptr(want), ctypes.c_int64(x.size))
    for isa in ISAS:
        _core.set_isa(isa)
        np.testing.assert_array_equal(_kernels.from_f32(int(t), x), want, err_msg=isa)
    _core.set_isa("best")
    blocks = random_blocks(t, 64, np.random.default_rng(int(t)), extreme=False)
    deq = np.zeros(64 * block_size(t), dtype=np.float32)
    getattr(base, f"dequantize_row_{ggml_name(t)}")(ptr(blocks), ptr(deq), ctypes.c_int64(deq.size))
    np.testing.assert_array_equal(bits_of(_core.to_f32(int(t), blocks, deq.size)), bits_of(deq))


class GgmlCpuTraits(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


GGML_VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
                                ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_int)


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("t", [W.Q4_0, W.Q5_0, W.Q8_0, W.Q4_K, W.Q5_K, W.Q6_K], ids=lambda t: t.name)
def test_vec_dot_matches_libggml_cpu_kernel(t, isa):
    # (q4_1/q5_1 multiply q8_1, whose block pyllm keeps in f32: not ggml's bytes.)
    _, cpu = LIBGGML
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(GgmlCpuTraits)
    traits = cpu.ggml_get_type_traits_cpu(int(t)).contents
    assert traits.vec_dot_type == int(ACTIVATION_OF[t])
    dot = GGML_VEC_DOT(traits.vec_dot)
    n = 8 * QK_K
    for seed in range(4):
        w = weight_row(t, n, 300 + seed)
        xq = _kernels.from_f32(int(ACTIVATION_OF[t]), gaussian(n, 400 + seed))
        out = ctypes.c_float()
        dot(n, ctypes.byref(out), 0, ptr(w), 0, ptr(xq), 0, 1)
        _, scale = dot_reference(t, w, xq, n)
        assert abs(_kernels.vec_dot(int(t), w, xq, n) - out.value) <= dot_tolerance(scale, n)

