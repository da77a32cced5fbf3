"""Quantized block formats (csrc/quants*.c) against independent numpy references.

Every format is dequantized here from its description (ggml's block layouts, as GGUF files store
them), vectorized over blocks, and compared with the C core bit for bit; quantizers are compared
with gguf-py's where it implements the same reference; every dot kernel of every ISA this CPU runs
is compared with float64 dot products of the dequantized operands, and with the scalar kernel.
Where llama-cpp-python is installed (the benchmarks build it), its libggml is the final word:
quantizers, dequantizers and dot products must give its bytes and values.
"""
from __future__ import annotations


import numpy as np
import pytest

from pyllm import _core, _kernels
from pyllm.dtypes import BLOCK_LAYOUT, WeightType as W

import gguf  # a test dependency: the reference of the block formats
import gguf.quants

QK, QK_K = 32, 256
WEIGHT_TYPES = [W.Q4_0, W.Q4_1, W.Q5_0, W.Q5_1, W.Q8_0, W.Q4_K, W.Q5_K, W.Q6_K]
ACTIVATION_OF = {W.Q4_0: W.Q8_0, W.Q4_1: W.Q8_1, W.Q5_0: W.Q8_0, W.Q5_1: W.Q8_1, W.Q8_0: W.Q8_0,
                 W.Q4_K: W.Q8_K, W.Q5_K: W.Q8_K, W.Q6_K: W.Q8_K}
ALL_TYPES = WEIGHT_TYPES + [W.Q8_1, W.Q8_K]


def block_size(t: W) -> int:
    return BLOCK_LAYOUT[t][0]


def type_size(t: W) -> int:
    return BLOCK_LAYOUT[t][1]


def supported_isas() -> list[str]:
    """Every ISA the CPU runs, scalar first (set_isa returns what it installed)."""
    found = []
    try:
        for name in _core.ISA_NAMES.values():
            if _core.set_isa(name) == name:
                found.append(name)
    finally:
        _core.set_isa("best")
    return found


ISAS = supported_isas()


@pytest.fixture
def isa(request):
    got = _core.set_isa(request.param)
    assert got == request.param
    yield request.param
    _core.set_isa("best")


# ---------------------------------------------------------------- numpy reference dequantizers


def f16_at(blocks: np.ndarray, off: int) -> np.ndarray:
    return blocks[:, off:off + 2].copy().view("<f2").astype(np.float32)[:, 0]


def f32_at(blocks: np.ndarray, off: int) -> np.ndarray:
    return blocks[:, off:off + 4].copy().view("<f4")[:, 0]


def nibbles(qs: np.ndarray) -> np.ndarray:
    """(nb, 16) bytes → (nb, 32): element j is the low nibble of byte j, j + 16 the high one."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int32)


def bits32(qh: np.ndarray) -> np.ndarray:
    """(nb, 4) bytes, a little-endian u32 → (nb, 32) bits."""
    word = qh.copy().view("<u4")[:, 0]
    return ((word[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32)


def k4_scales_mins(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes → 8 six-bit scales and 8 mins. Sub-blocks 0..3: low 6 bits of bytes 0..3 (scales)
    and 4..7 (mins); 4..7: low/high nibble of bytes 8..11, topped with the 2 high bits of bytes
    0..3 (scales) and 4..7 (mins)."""
    sc = sc.astype(np.int32)
    scales = np.concatenate([sc[:, 0:4] & 63, (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)], axis=1)
    mins = np.concatenate([sc[:, 4:8] & 63, (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)], axis=1)
    return scales, mins


def k_chunks_q(qs: np.ndarray) -> np.ndarray:
    """128 bytes → 256 4-bit values: each 32 bytes hold 64 elements, low nibbles first."""
    q = qs.reshape(-1, 4, 32).astype(np.int32)
    return np.concatenate([q & 0xF, q >> 4], axis=2).reshape(-1, 256)


def deq_q4_0(b):
    return f16_at(b, 0)[:, None] * (nibbles(b[:, 2:18]) - 8).astype(np.float32)


def deq_q4_1(b):
    return nibbles(b[:, 4:20]).astype(np.float32) * f16_at(b, 0)[:, None] + f16_at(b, 2)[:, None]


def deq_q5_0(b):
    q = nibbles(b[:, 6:22]) | (bits32(b[:, 2:6]) << 4)
    return f16_at(b, 0)[:, None] * (q - 16).astype(np.float32)


def deq_q5_1(b):
    q = nibbles(b[:, 8:24]) | (bits32(b[:, 4:8]) << 4)
    return q.astype(np.float32) * f16_at(b, 0)[:, None] + f16_at(b, 2)[:, None]


def deq_q8_0(b):
    return f16_at(b, 0)[:, None] * b[:, 2:34].view(np.int8).astype(np.float32)


def deq_q8_1(b):  # f32 d, f32 s = d·Σq, 32 × i8
    return f32_at(b, 0)[:, None] * b[:, 8:40].view(np.int8).astype(np.float32)


def deq_q4_K(b):
    d, dmin = f16_at(b, 0), f16_at(b, 2)
    sc, mn = k4_scales_mins(b[:, 4:16])
    ds = (d[:, None] * sc.astype(np.float32))[:, :, None]     # (nb, 8, 1)
    dm = (dmin[:, None] * mn.astype(np.float32))[:, :, None]
    q = k_chunks_q(b[:, 16:144]).reshape(-1, 8, 32).astype(np.float32)
    return (ds * q - dm).reshape(-1, 256)


def deq_q5_K(b):
    d, dmin = f16_at(b, 0), f16_at(b, 2)
    sc, mn = k4_scales_mins(b[:, 4:16])
    ds = (d[:, None] * sc.astype(np.float32))[:, :, None]
    dm = (dmin[:, None] * mn.astype(np.float32))[:, :, None]
    # qh[l] bit s: the 5th bit of element l of sub-block s (each sub-block is 32 elements)
    qh = b[:, 16:48].astype(np.int32)
    high = (qh[:, None, :] >> np.arange(8)[None, :, None]) & 1             # (nb, 8, 32)
    q = k_chunks_q(b[:, 48:176]).reshape(-1, 8, 32) | (high << 4)
    return (ds * q.astype(np.float32) - dm).reshape(-1, 256)


def deq_q6_K(b):
    ql, qh = b[:, 0:128].astype(np.int32), b[:, 128:192].astype(np.int32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = f16_at(b, 208)
    # Per half of 128: ql bytes [0,32) low nibbles → elements 0..31, [32,64) → 32..63, their high
    # nibbles → 64..95 and 96..127; qh byte l holds bits 4..5 of elements l, l+32, l+64, l+96.
    ql = ql.reshape(-1, 2, 2, 32)
    low = np.stack([ql[:, :, 0] & 0xF, ql[:, :, 1] & 0xF, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], axis=2)
    high = (qh.reshape(-1, 2, 1, 32) >> (2 * np.arange(4)).reshape(1, 1, 4, 1)) & 3
    q = ((low | (high << 4)) - 32).reshape(-1, 16, 16).astype(np.float32)
    return ((d[:, None] * sc)[:, :, None] * q).reshape(-1, 256)


def deq_q8_K(b):  # f32 d, 256 × i8, 16 × i16 bsums
    return f32_at(b, 0)[:, None] * b[:, 4:260].view(np.int8).astype(np.float32)


DEQUANT = {W.Q4_0: deq_q4_0, W.Q4_1: deq_q4_1, W.Q5_0: deq_q5_0, W.Q5_1: deq_q5_1,
           W.Q8_0: deq_q8_0, W.Q8_1: deq_q8_1, W.Q4_K: deq_q4_K, W.Q5_K: deq_q5_K,
           W.Q6_K: deq_q6_K, W.Q8_K: deq_q8_K}


def np_dequantize(t: W, data: np.ndarray) -> np.ndarray:
    return DEQUANT[t](data.reshape(-1, type_size(t))).astype(np.float32).ravel()


# ---------------------------------------------------------------- random blocks


# Where each format keeps its f16 scales (d, and m / dmin) and f32 ones.
F16_FIELDS = {W.Q4_0: [0], W.Q4_1: [0, 2], W.Q5_0: [0], W.Q5_1: [0, 2], W.Q8_0: [0],
              W.Q4_K: [0, 2], W.Q5_K: [0, 2], W.Q6_K: [208]}
F32_FIELDS = {W.Q8_1: [0, 4], W.Q8_K: [0]}

EXTREME_F16 = np.array([0x7BFF, 0xFBFF, 0x0400, 0x8400, 0x0001, 0x03FF, 0x8001, 0x0000, 0x8000,
                        0x3C00], dtype=np.uint16)  # max, −max, min normal, subnormals, ±0, 1


def random_blocks(t: W, nb: int, rng: np.random.Generator, extreme: bool = False) -> np.ndarray:
    """Random bytes, then scales set to normal values (or cycled through extreme f16 values)."""
    b = rng.integers(0, 256, size=(nb, type_size(t)), dtype=np.uint8)
    for off in F16_FIELDS.get(t, []):
        if extreme:
            h = EXTREME_F16[(np.arange(nb) + off) % len(EXTREME_F16)]
        else:
            mag = rng.uniform(1e-3, 0.1, nb) * rng.choice([-1.0, 1.0], nb)
            h = mag.astype(np.float16).view(np.uint16)
        b[:, off:off + 2] = h.astype("<u2").view(np.uint8).reshape(nb, 2)
    for off in F32_FIELDS.get(t, []):
        v = (rng.uniform(1e-3, 0.1, nb) if not extreme else
             np.resize(np.array([1e36, -1e36, 1.2e-38, 1e-45, 0.0, 1.0]), nb)).astype("<f4")
        b[:, off:off + 4] = v.view(np.uint8).reshape(nb, 4)
    if t == W.Q8_K:  # the bsums as a quantizer would leave them
        qs = b[:, 4:260].view(np.int8).astype(np.int16).reshape(nb, 16, 16).sum(axis=2)
        b[:, 260:292] = qs.astype("<i2").view(np.uint8).reshape(nb, 32)
    return b.ravel()


def bits_of(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# ---------------------------------------------------------------- layouts and traits


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_block_sizes_match_ggml_layouts(t):
    assert _core.row_size(int(t), 4 * block_size(t)) == 4 * type_size(t)
    if gguf is not None and t != W.Q8_1:  # q8_1 is pyllm's own f32 activation layout
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(t))] == BLOCK_LAYOUT[t]
    assert _core.supports(int(t)) == (t in WEIGHT_TYPES)
    if t in WEIGHT_TYPES:
        assert _core.vec_dot_type(int(t)) == int(ACTIVATION_OF[t])


# ---------------------------------------------------------------- dequantization


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("extreme", [False, True], ids=["normal_scales", "extreme_scales"])
@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_numpy_reference_bit_exactly(t, extreme, isa):
    rng = np.random.default_rng(int(t) * 7 + extreme)
    nb = 64
    data = random_blocks(t, nb, rng, extreme)
    got = _core.to_f32(int(t), data, nb * block_size(t))
    want = np_dequantize(t, data)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(bits_of(got), bits_of(want))


@pytest.mark.parametrize("extreme", [False, True], ids=["normal_scales", "extreme_scales"])
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_py(t, extreme):
    rng = np.random.default_rng(100 + int(t) * 7 + extreme)
    nb = 64
    data = random_blocks(t, nb, rng, extreme)
    got = _core.to_f32(int(t), data, nb * block_size(t))
    want = gguf.quants.dequantize(data.reshape(nb, -1), gguf.GGMLQuantizationType(int(t))).ravel()
    np.testing.assert_array_equal(bits_of(got), bits_of(want))


# ---------------------------------------------------------------- quantization


def gaussian(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.integers(0, n, n // 64)] *= 8  # some outliers, as real weights have
    return x


def _gguf_py_quantizes(t) -> bool:
    try:
        gguf.quants.quantize(np.zeros(QK_K, np.float32), gguf.GGMLQuantizationType(int(t)))
        return True
    except NotImplementedError:
        return False


# gguf-py implements the reference quantizers of the 32-element formats; the k-quants' encoders
# are checked against ggml itself in benchmarks/ggml_parity_test.py (it needs llama-cpp-python).
GGUF_PY_QUANTIZED = [t for t in WEIGHT_TYPES if _gguf_py_quantizes(t)]


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("t", GGUF_PY_QUANTIZED, ids=lambda t: t.name)
def test_quantize_bytes_match_gguf_py_reference(t, isa):
    x = gaussian(64 * QK_K, int(t))
    x[:QK] = 0.0  # an all-zero block
    want = gguf.quants.quantize(x, gguf.GGMLQuantizationType(int(t)))
    np.testing.assert_array_equal(_kernels.from_f32(int(t), x), want.ravel())


# Largest |x − dequantize(quantize(x))| per block, in units of the block's quantization step:
# round to nearest gives ½ step; q4_0/q5_0 clip the side opposite the max to one level short
# (a full step); the f16 rounding of the scales adds a little.
STEP_BOUND = {W.Q4_0: (8, 1.02), W.Q5_0: (16, 1.02), W.Q8_0: (127, 0.57), W.Q4_1: (15, 0.52),
              W.Q5_1: (31, 0.53)}


@pytest.mark.parametrize("t", list(STEP_BOUND), ids=lambda t: t.name)
def test_quantize_error_within_half_step_of_block_scale(t):
    x = gaussian(256 * QK, 1 + int(t))
    deq = _core.to_f32(int(t), _kernels.from_f32(int(t), x), x.size)
    xb, err = x.reshape(-1, QK), np.abs(deq - x).reshape(-1, QK).max(axis=1)
    levels, bound = STEP_BOUND[t]
    if t in (W.Q4_1, W.Q5_1):
        step = (xb.max(axis=1) - xb.min(axis=1)) / levels
        slack = 2.0 ** -10 * np.abs(xb).max(axis=1)  # the min's f16 rounding
    else:
        step = np.abs(xb).max(axis=1) / levels
        slack = 0
    assert (err <= bound * step + slack).all()


# Relative RMS error on gaussian data with outliers: ggml's reference quantizers measure about
# 0.145 / 0.10 / 0.072 / 0.049 / 0.009 (q4_0 … q8_0) and 0.094 / 0.047 / 0.027 (q4_K … q6_K).
RMSE_BOUND = {W.Q4_0: 0.16, W.Q4_1: 0.115, W.Q5_0: 0.08, W.Q5_1: 0.055, W.Q8_0: 0.0105,
              W.Q4_K: 0.105, W.Q5_K: 0.052, W.Q6_K: 0.03}


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_quantize_roundtrip_rms_error_within_format_bound(t):
    x = gaussian(64 * QK_K, 2 + int(t))
    q = _kernels.from_f32(int(t), x)
    deq = _core.to_f32(int(t), q, x.size)
    np.testing.assert_array_equal(bits_of(deq), bits_of(np_dequantize(t, q)))
    rel = np.sqrt(np.mean((deq - x) ** 2) / np.mean(x ** 2))
    assert rel < RMSE_BOUND[t], rel


def test_k_quants_beat_same_bit_block_formats():
    x = gaussian(64 * QK_K, 3)

    def rmse(t):
        return np.sqrt(np.mean((_core.to_f32(int(t), _kernels.from_f32(int(t), x), x.size) - x) ** 2))

    assert rmse(W.Q4_K) < min(rmse(W.Q4_0), rmse(W.Q4_1))
    assert rmse(W.Q5_K) < min(rmse(W.Q5_0), rmse(W.Q5_1))
    assert rmse(W.Q6_K) < rmse(W.Q5_K)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_quantize_of_zeros_and_constant_blocks_is_exact(t):
    x = np.zeros(2 * QK_K, dtype=np.float32)
    x[QK_K:] = 0.25  # a power of two: exact at every format's step
    deq = _core.to_f32(int(t), _kernels.from_f32(int(t), x), x.size)
    np.testing.assert_array_equal(deq[:QK_K], 0)
    np.testing.assert_allclose(deq[QK_K:], 0.25, rtol=2e-3)


# ---------------------------------------------------------------- activation quantizers


def np_roundf(v: np.ndarray) -> np.ndarray:
    """C roundf in float32: to nearest, ties away from zero."""
    a = np.abs(v)
    f = np.floor(a)
    return np.copysign(f + np.floor(2 * (a - f)), v)


def np_quantize_q8_1(x: np.ndarray) -> np.ndarray:
    xb = x.reshape(-1, QK)
    d = (np.abs(xb).max(axis=1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np_roundf(xb * inv[:, None]).astype(np.int8)
    s = (q.astype(np.int32).sum(axis=1).astype(np.float32) * d).astype(np.float32)
    head = np.stack([d, s], axis=1).astype("<f4").view(np.uint8)
    return np.concatenate([head, q.view(np.uint8)], axis=1).ravel()


def np_quantize_q8_K(x: np.ndarray) -> np.ndarray:
    xb = x.reshape(-1, QK_K)
    imax = np.abs(xb).argmax(axis=1)  # the first of the largest magnitude
    mx = xb[np.arange(len(xb)), imax]
    out = np.zeros((len(xb), type_size(W.Q8_K)), dtype=np.uint8)
    nz = mx != 0
    iscale = (np.float32(-127) / mx[nz]).astype(np.float32)
    q = np.minimum(np.rint(xb[nz] * iscale[:, None]), 127).astype(np.int8)
    bsums = q.astype(np.int16).reshape(-1, 16, 16).sum(axis=2).astype("<i2")
    out[nz, 0:4] = (np.float32(1) / iscale).astype("<f4").view(np.uint8).reshape(-1, 4)
    out[nz, 4:260] = q.view(np.uint8)
    out[nz, 260:292] = bsums.view(np.uint8).reshape(-1, 32)
    return out.ravel()


def activation_inputs(n: int, seed: int) -> np.ndarray:
    x = gaussian(n, seed) * np.float32(3.7)
    x[:QK_K] = 0.0                                          # an all-zero block
    x[QK_K:2 * QK_K] = np.arange(QK_K) % 64 - 31.5          # ties: x·(1/d) lands on k + ½ …
    x[QK_K + 5:2 * QK_K:QK] = 127.0                         # … with d = 1 (q8_0/q8_1)
    x[2 * QK_K:3 * QK_K] = np.arange(QK_K) % 128 - 63.5     # ties for q8_K's iscale = 1
    x[2 * QK_K + 7] = -127.0
    big = 2 * np.abs(x[3 * QK_K:4 * QK_K]).max()
    x[3 * QK_K + 9] = -big                                  # the max is negative, not first …
    x[3 * QK_K + 200] = big                                 # … and ties with a later positive
    return x.astype(np.float32)


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("t", [W.Q8_0, W.Q8_1, W.Q8_K], ids=lambda t: t.name)
def test_activation_quantizers_match_reference_bytes_on_every_isa(t, isa):
    x = activation_inputs(16 * QK_K, int(t))
    got = _kernels.from_f32(int(t), x)
    if t == W.Q8_0:
        assert gguf is not None
        want = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0).ravel()
    elif t == W.Q8_1:
        want = np_quantize_q8_1(x)
    else:
        want = np_quantize_q8_K(x)
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- dot products


def weight_row(t: W, n: int, seed: int) -> np.ndarray:
    """Half quantized from gaussian data, half random bytes with normal scales."""
    rng = np.random.default_rng(seed)
    half = n // 2 // block_size(t) * block_size(t)
    q = _kernels.from_f32(int(t), gaussian(half, seed)) if half else np.empty(0, np.uint8)
    r = random_blocks(t, (n - half) // block_size(t), rng)
    return np.concatenate([q, r])


def dot_reference(t: W, w: np.ndarray, xq: np.ndarray, n: int) -> tuple[float, float]:
    """float64 dot of the dequantized operands, and Σ|w·x| to scale the tolerance."""
    a = np_dequantize(t, w).astype(np.float64)
    b = np_dequantize(ACTIVATION_OF[t], xq).astype(np.float64)
    return float(a @ b), float(np.abs(a) @ np.abs(b))


def dot_tolerance(scale: float, n: int) -> float:
    # Integer sums are exact within a block; the float scaling and accumulation across blocks
    # cost a few ulps each.
    return 4e-7 * (n // QK + 4) * scale + 1e-30


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("n_blocks", [1, 3, 18], ids=lambda b: f"{b}blocks")
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_vec_dot_matches_float64_dot_of_dequantized_operands(t, n_blocks, isa):
    n = n_blocks * block_size(t)
    w = weight_row(t, n, 10 * int(t) + n_blocks)
    xq = _kernels.from_f32(int(ACTIVATION_OF[t]), gaussian(n, 7 + n_blocks))
    want, scale = dot_reference(t, w, xq, n)
    got = _kernels.vec_dot(int(t), w, xq, n)
    assert abs(got - want) <= dot_tolerance(scale, n), (got, want)


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "scalar"] or ["scalar"], indirect=True)
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_vec_dot_simd_agrees_with_scalar(t, isa):
    n = 16 * QK_K + (QK if block_size(t) == QK else 0)  # an odd number of blocks of 32
    rng = np.random.default_rng(int(t))
    rows = [weight_row(t, n, 50 + int(t) + r) for r in range(6)]
    rows.append(random_blocks(t, n // block_size(t), rng, extreme=False))
    x = gaussian(n, 5)
    x[: n // 4] *= 100  # blocks of very different activation scales
    xq = _kernels.from_f32(int(ACTIVATION_OF[t]), x)
    simd = [_kernels.vec_dot(int(t), w, xq, n) for w in rows]
    _core.set_isa("scalar")
    assert np.array_equal(_kernels.from_f32(int(ACTIVATION_OF[t]), x), xq)
    ref = [_kernels.vec_dot(int(t), w, xq, n) for w in rows]
    for w, s, r in zip(rows, simd, ref):
        _, scale = dot_reference(t, w, xq, n)
        assert abs(s - r) <= dot_tolerance(scale, n), (s, r)


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_vec_dot_rows_equals_vec_dot_of_each_row_bit_for_bit(t, isa):
    # The matmul dots each weight row with all rows of a batch at once; each result must be the
    # single kernel's bits, or a batched decode step would differ from the sequence's solo step.
    # Row counts cover passes of 8 and every remainder; widths the 8-block groups and their tails
    # (576 = 18 blocks of 32) and one to three k-quant super-blocks.
    blocks = [1, 2, 3] if block_size(t) == QK_K else [1, 7, 8, 9, 17, 18, 33]
    rng = np.random.default_rng(int(t))
    for nb in blocks:
        n = nb * block_size(t)
        weights = [weight_row(t, n, 100 + int(t) + nb), random_blocks(t, nb, rng, extreme=True)]
        x = np.stack([gaussian(n, 200 + r) * np.float32(10.0 ** (r % 5 - 2)) for r in range(17)])
        xq = np.concatenate([_kernels.from_f32(int(ACTIVATION_OF[t]), row) for row in x])
        row_bytes = xq.size // len(x)
        for w in weights:
            want = np.array([_kernels.vec_dot(int(t), w, xq[r * row_bytes:(r + 1) * row_bytes], n)
                             for r in range(len(x))], np.float32)
            for n_rows in range(1, len(x) + 1):
                got = _kernels.vec_dot_rows(int(t), w, xq[:n_rows * row_bytes], n_rows, n)
                np.testing.assert_array_equal(got.view(np.uint32), want[:n_rows].view(np.uint32),
                                              err_msg=f"{nb} blocks, {n_rows} rows")


def test_vec_dot_of_extreme_f16_scales_stays_finite_and_exact_enough():
    rng = np.random.default_rng(4)
    for t in WEIGHT_TYPES:
        n = 4 * QK_K
        w = random_blocks(t, n // block_size(t), rng, extreme=True)
        xq = _kernels.from_f32(int(ACTIVATION_OF[t]), gaussian(n, 4) * np.float32(1e-3))
        want, scale = dot_reference(t, w, xq, n)
        for isa in ISAS:
            _core.set_isa(isa)
            got = _kernels.vec_dot(int(t), w, xq, n)
            assert abs(got - want) <= dot_tolerance(scale, n), (t.name, isa, got, want)
        _core.set_isa("best")


# ---------------------------------------------------------------- matmul


def matmul_references(t: W, w: np.ndarray, rows: int, cols: int, x: np.ndarray):
    """(f32 activations, quantized activations) references in float64, and Σ|w·x| per output."""
    wd = np_dequantize(t, w).reshape(rows, cols).astype(np.float64)
    act = ACTIVATION_OF[t]
    xq = np.stack([np_dequantize(act, _kernels.from_f32(int(act), row)) for row in x]).astype(np.float64)
    return x.astype(np.float64) @ wd.T, xq @ wd.T, np.abs(x.astype(np.float64)) @ np.abs(wd).T


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("blas", [False, True], ids=["vec_dot", "blas"])
@pytest.mark.parametrize("n", [1, 5, 40])
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_matmul_matches_dequantized_numpy_matmul(t, n, blas, threads):
    rows, cols = 37, 2 * QK_K  # rows not a multiple of the 16-row split
    w = _kernels.from_f32(int(t), gaussian(rows * cols, int(t)) * np.float32(0.05))
    x = np.ascontiguousarray(gaussian(n * cols, 9 + n).reshape(n, cols))
    y = _kernels.matmul(int(t), w, rows, cols, x, threads=threads, blas=blas, tile_floats=8 * cols)
    ref_f32, ref_q, scale = matmul_references(t, w, rows, cols, x)
    tol_q = 4e-7 * (cols // QK + 4) * scale
    if not blas:
        assert (np.abs(y - ref_q) <= tol_q).all()
    else:
        # Batches from kernels.h's PL_BLAS_MIN_TOKENS on go through sgemm with f32 activations
        # (f32 accumulation over cols); smaller ones through the vec_dot kernels.
        f32_ok = (np.abs(y - ref_f32) <= 2e-6 * cols ** 0.5 * scale + 1e-6).all()
        q_ok = (np.abs(y - ref_q) <= tol_q).all()
        assert f32_ok or q_ok
        if n >= 40:
            assert f32_ok
