"""The packed GEMM (csrc/packed*.c): weights repacked 8 rows interleaved, one kernel for any number
of activation rows.

What it must hold: the layout is the one csrc/packed.h documents (unpacked here by numpy from that
description, it gives back the file's bytes); the product is the float64 product of the dequantized
operands within the quant dot tolerance; each (weight row, activation row) result has the same bits
whatever the batch, the activation rows beside it, the row range it is computed in and the ISA; and
it agrees with the row kernels' vec_dot within the tolerance that separates two float orders.
"""
from __future__ import annotations

import numpy as np
import pytest

from pyllm import _core, _kernels
from pyllm.dtypes import WeightType as W

from test_quants import (ACTIVATION_OF, ISAS, block_size, dot_tolerance, gaussian, np_dequantize, random_blocks,
                         type_size)

PACKED_TYPES = [W.Q4_0, W.Q4_1, W.Q5_0, W.Q8_0, W.Q4_K, W.Q5_K, W.Q6_K]


def some_cols(t: W, cols: int) -> int:
    """cols, or the next whole number of the type's blocks (the k-quants' super-blocks are 256)."""
    return -(-cols // block_size(t)) * block_size(t)


@pytest.fixture
def isa(request):
    got = _core.set_isa(request.param)
    assert got == request.param
    yield request.param
    _core.set_isa("best")


def weight_matrix(t: W, rows: int, cols: int, seed: int, extreme: bool = False) -> np.ndarray:
    """rows rows: quantized gaussian rows alternating with random-byte blocks (normal or extreme
    scales), the file's bytes."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rows):
        if r % 2 == 0 and not extreme:
            out.append(_kernels.from_f32(int(t), gaussian(cols, seed * 1000 + r)))
        else:
            out.append(random_blocks(t, cols // block_size(t), rng, extreme=extreme))
    return np.concatenate(out)


def activations(n: int, cols: int, seed: int) -> np.ndarray:
    """n rows of gaussian activations, at magnitudes 10^-2 … 10^2."""
    return np.stack([gaussian(cols, seed + t) * np.float32(10.0 ** (t % 5 - 2)) for t in range(n)])


def quantized(t: W, x: np.ndarray) -> np.ndarray:
    return _kernels.from_f32(int(ACTIVATION_OF[t]), np.ascontiguousarray(x).reshape(-1))


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def unpack(t: W, packed: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The file's bytes from the packed layout, by csrc/packed.h's description."""
    nb, groups = cols // block_size(t), (rows + 7) // 8
    if t == W.Q4_0:  # d[8] (f16), qs[128] as q4_1's: qs[32k + 4r + i] = the row's qs[4k + i]
        p = packed.reshape(groups, nb, 144)
        d = p[:, :, 0:16].reshape(groups, nb, 8, 2)
        file_qs = p[:, :, 16:].reshape(groups, nb, 4, 8, 4).transpose(0, 3, 1, 2, 4).reshape(groups, 8, nb, 16)
        blocks = np.concatenate([d.transpose(0, 2, 1, 3), file_qs], axis=3)
    elif t == W.Q4_1:  # d[8], m[8] (f16), qs[128]: qs[32k + 4r + i] = q[r][4k+i] | q[r][16+4k+i] << 4
        p = packed.reshape(groups, nb, 160)
        d, m = p[:, :, 0:16].reshape(groups, nb, 8, 2), p[:, :, 16:32].reshape(groups, nb, 8, 2)
        qs = p[:, :, 32:].reshape(groups, nb, 4, 8, 4)                       # g, b, k, r, i
        lo, hi = qs & 0xF, qs >> 4                                           # elements 4k+i, 16+4k+i
        file_qs = (lo | hi << 4).transpose(0, 3, 1, 2, 4).reshape(groups, 8, nb, 16)  # qs[4k+i]
        blocks = np.concatenate([d.transpose(0, 2, 1, 3), m.transpose(0, 2, 1, 3), file_qs], axis=3)
    elif t == W.Q5_0:  # d[8] (f16), qh[32], qs[128] as q4_1's: bits k, 4+k of qh[4r + i] = bit 4 of
        p = packed.reshape(groups, nb, 176)  # elements 4k+i, 16+4k+i
        d = p[:, :, 0:16].reshape(groups, nb, 8, 2)
        qh = p[:, :, 16:48].reshape(groups, nb, 8, 4).astype(np.uint32)     # g, b, r, i
        qs = p[:, :, 48:].reshape(groups, nb, 4, 8, 4)                       # g, b, k, r, i
        file_qs = qs.transpose(0, 3, 1, 2, 4).reshape(groups, 8, nb, 16)
        i = np.arange(4, dtype=np.uint32)
        h = np.zeros((groups, nb, 8), np.uint32)
        for kk in range(4):
            low = (qh >> kk) & 1                                             # g, b, r, i: element 4kk+i
            high = (qh >> (4 + kk)) & 1                                      # element 16+4kk+i
            h |= (low << (4 * kk + i)).sum(axis=3, dtype=np.uint32)
            h |= (high << (16 + 4 * kk + i)).sum(axis=3, dtype=np.uint32)
        file_qh = h.transpose(0, 2, 1)[..., None].view(np.uint8)            # little-endian u32
        blocks = np.concatenate([d.transpose(0, 2, 1, 3), file_qh.reshape(groups, 8, nb, 4), file_qs], axis=3)
    elif t in (W.Q4_K, W.Q5_K):  # d[8], dmin[8] (f16), scales[3][8] (u32 words of 4 scale bytes), qs[1024]:
        size = 1152 if t == W.Q4_K else 1408  # qs[256c + 32k + 4r + i] = the row's qs[32c + 4k + i]; q5_K then
        p = packed.reshape(groups, nb, size)  # qh[256]: qh[32k + 4r + i] = the row's qh[4k + i]
        d, dmin = p[:, :, 0:16].reshape(groups, nb, 8, 2), p[:, :, 16:32].reshape(groups, nb, 8, 2)
        scales = p[:, :, 32:128].reshape(groups, nb, 3, 8, 4).transpose(0, 1, 3, 2, 4).reshape(groups, nb, 8, 12)
        qs = p[:, :, 128:1152].reshape(groups, nb, 4, 8, 8, 4)              # g, b, c, k, r, i
        file_qs = qs.transpose(0, 4, 1, 2, 3, 5).reshape(groups, 8, nb, 128)
        parts = [d.transpose(0, 2, 1, 3), dmin.transpose(0, 2, 1, 3), scales.transpose(0, 2, 1, 3)]
        if t == W.Q5_K:
            qh = p[:, :, 1152:].reshape(groups, nb, 8, 8, 4)                 # g, b, k, r, i
            parts.append(qh.transpose(0, 3, 1, 2, 4).reshape(groups, 8, nb, 32))
        blocks = np.concatenate(parts + [file_qs], axis=3)
    elif t == W.Q6_K:  # d[8] (f16), scales[16][8] (int8), ql[1024], qh[512]: ql[256m + 32k + 4r + i] = the
        p = packed.reshape(groups, nb, 1680)  # row's ql[32m + 4k + i], qh[256h + 32k + 4r + i] its qh[32h + 4k + i]
        d = p[:, :, 0:16].reshape(groups, nb, 8, 2)
        scales = p[:, :, 16:144].reshape(groups, nb, 16, 8)                  # g, b, s, r
        ql = p[:, :, 144:1168].reshape(groups, nb, 4, 8, 8, 4)              # g, b, m, k, r, i
        qh = p[:, :, 1168:].reshape(groups, nb, 2, 8, 8, 4)                 # g, b, h, k, r, i
        file_ql = ql.transpose(0, 4, 1, 2, 3, 5).reshape(groups, 8, nb, 128)
        file_qh = qh.transpose(0, 4, 1, 2, 3, 5).reshape(groups, 8, nb, 64)
        blocks = np.concatenate([file_ql, file_qh, scales.transpose(0, 3, 1, 2), d.transpose(0, 2, 1, 3)], axis=3)
    else:  # d[8] (f16), qs[256]: qs[32k + 4r + i] = q[r][4k + i]
        p = packed.reshape(groups, nb, 272)
        d = p[:, :, 0:16].reshape(groups, nb, 8, 2)
        qs = p[:, :, 16:].reshape(groups, nb, 8, 8, 4).transpose(0, 3, 1, 2, 4).reshape(groups, 8, nb, 32)
        blocks = np.concatenate([d.transpose(0, 2, 1, 3), qs], axis=3)
    return np.ascontiguousarray(blocks).reshape(groups * 8, -1)[:rows].ravel()


@pytest.mark.parametrize("rows", [1, 7, 8, 9, 37])
@pytest.mark.parametrize("t", PACKED_TYPES, ids=lambda t: t.name)
def test_packed_layout_unpacks_to_the_file_bytes_with_zero_padding(t, rows):
    cols = some_cols(t, 576)
    w = weight_matrix(t, rows, cols, seed=rows)
    packed = _kernels.pack_weights(int(t), w, rows, cols)
    groups = (rows + 7) // 8
    assert packed.size == groups * (cols // block_size(t)) * type_size(t) * 8
    np.testing.assert_array_equal(unpack(t, packed, rows, cols), w)
    padded = unpack(t, packed, groups * 8, cols).reshape(groups * 8, -1)
    assert not padded[rows:].any()


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("t", PACKED_TYPES, ids=lambda t: t.name)
def test_packed_gemm_matches_float64_product_of_dequantized_operands(t, isa):
    rows, cols, n = 37, some_cols(t, 576), 5
    w = weight_matrix(t, rows, cols, seed=int(t))
    x = activations(n, cols, seed=3)
    got = _kernels.gemm_packed(int(t), _kernels.pack_weights(int(t), w, rows, cols), rows, cols, x)
    wf = np_dequantize(t, w).astype(np.float64).reshape(rows, cols)
    xf = np_dequantize(ACTIVATION_OF[t], quantized(t, x)).astype(np.float64).reshape(n, cols)
    want, scale = xf @ wf.T, np.abs(xf) @ np.abs(wf).T
    assert np.all(np.abs(got - want) <= dot_tolerance(1.0, cols) * scale + 1e-30), np.abs(got - want).max()


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("t", PACKED_TYPES, ids=lambda t: t.name)
def test_packed_gemm_result_is_the_same_bits_for_any_batch_subset_and_row_range(t, isa):
    # Prefill (many rows), a batch of decode steps (a few) and one step (one row) must give one
    # sequence the same logits: each result may depend on its own weight row and activation row only.
    rows, cols, n = 45, some_cols(t, 576), 130
    w = weight_matrix(t, rows, cols, seed=7 + int(t))
    packed = _kernels.pack_weights(int(t), w, rows, cols)
    x = activations(n, cols, seed=11)
    full = bits(_kernels.gemm_packed(int(t), packed, rows, cols, x))
    for i in range(n):
        np.testing.assert_array_equal(bits(_kernels.gemm_packed(int(t), packed, rows, cols, x[i:i + 1]))[0], full[i],
                                      err_msg=f"activation row {i} alone")
    rng = np.random.default_rng(0)
    for size in (2, 3, 4, 5, 8, 17, 64):
        pick = np.sort(rng.choice(n, size, replace=False))
        np.testing.assert_array_equal(bits(_kernels.gemm_packed(int(t), packed, rows, cols, x[pick])), full[pick],
                                      err_msg=f"{size} activation rows")
    for r0, r1 in ((0, 8), (8, 24), (16, 45), (40, 45), (0, 45), (24, 37)):
        part = bits(_kernels.gemm_packed(int(t), packed, rows, cols, x[:9], r0=r0, r1=r1))
        np.testing.assert_array_equal(part[:, r0:r1], full[:9, r0:r1], err_msg=f"rows [{r0}, {r1})")
        assert not part[:, :r0].any() and not part[:, r1:].any(), "wrote outside its rows"


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "scalar"] or ["scalar"], indirect=True)
@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme"])
@pytest.mark.parametrize("t", PACKED_TYPES, ids=lambda t: t.name)
def test_packed_gemm_of_every_isa_equals_scalar_bit_for_bit(t, extreme, isa):
    rows, cols, n = 37, 1536, 17
    w = weight_matrix(t, rows, cols, seed=20 + int(t), extreme=extreme)
    packed = _kernels.pack_weights(int(t), w, rows, cols)
    x = activations(n, cols, seed=5)
    got = _kernels.gemm_packed(int(t), packed, rows, cols, x)
    _core.set_isa("scalar")
    want = _kernels.gemm_packed(int(t), packed, rows, cols, x)
    np.testing.assert_array_equal(bits(got), bits(want))


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_each_isa_installs_its_build_of_the_packed_kernels(isa):
    # The avx512 ISA runs the vpdpbusd build (csrc/packed_vnni.c) where the CPU has VNNI, else the AVX2
    # one; the avx2 ISA the AVX-VNNI build (csrc/packed_avxvnni.c) where the CPU has that and the core's
    # compiler knew it. Every test of this file then checks the build installed.
    flags = cpu_flags()
    if flags:
        assert _kernels.cpu_has_vnni() == ("avx512_vnni" in flags and _core.best_isa() == "avx512")
        assert _kernels.cpu_has_avx_vnni() == ("avx_vnni" in flags and _core.best_isa() in ("avx2", "avx512"))
    avx_vnni = _kernels.cpu_has_avx_vnni() and _kernels.packed_avxvnni_compiled()
    want = {"scalar": "scalar", "neon": "neon", "avx2": "avxvnni" if avx_vnni else "avx2",
            "avx512": "vnni" if _kernels.cpu_has_vnni() else "avx2"}[isa]
    assert _kernels.packed_kernels() == want


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "scalar"] or ["scalar"], indirect=True)
@pytest.mark.parametrize("cols,n", [(1536, 300), (262176, 2)], ids=["batch-in-parts", "wider-than-the-stack"])
@pytest.mark.parametrize("t", PACKED_TYPES, ids=lambda t: t.name)
def test_packed_gemm_of_long_batches_and_wide_rows_equals_scalar(t, cols, n, isa):
    # The AVX2 q5_0 kernel sums each activation block once per call into 8,192 ints of stack: 300 rows
    # of 48 blocks pass over the groups in two parts, and a row of 8,193 blocks goes to the reference.
    rows, cols = 9, some_cols(t, cols)
    w = weight_matrix(t, rows, cols, seed=40 + int(t))
    packed = _kernels.pack_weights(int(t), w, rows, cols)
    x = activations(n, cols, seed=13)
    got = _kernels.gemm_packed(int(t), packed, rows, cols, x)
    _core.set_isa("scalar")
    np.testing.assert_array_equal(bits(got), bits(_kernels.gemm_packed(int(t), packed, rows, cols, x)))


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("t", PACKED_TYPES, ids=lambda t: t.name)
def test_packed_gemm_agrees_with_vec_dot_within_the_quant_dot_tolerance(t, isa):
    # Same integer block sums, another order of the float scaling and accumulation.
    rows, cols, n = 24, 1536, 3
    w = weight_matrix(t, rows, cols, seed=30 + int(t))
    x = activations(n, cols, seed=9)
    xq = quantized(t, x)
    got = _kernels.gemm_packed(int(t), _kernels.pack_weights(int(t), w, rows, cols), rows, cols, x)
    want = _kernels.dot_rows_matrix(int(t), w, rows, cols, xq, n)
    wf = np.abs(np_dequantize(t, w).astype(np.float64).reshape(rows, cols))
    xf = np.abs(np_dequantize(ACTIVATION_OF[t], xq).astype(np.float64).reshape(n, cols))
    assert np.all(np.abs(got - want) <= dot_tolerance(1.0, cols) * (xf @ wf.T) + 1e-30)


@pytest.mark.parametrize("t", PACKED_TYPES, ids=lambda t: t.name)
def test_packed_ops_reject_bad_shapes_lengths_and_ranges(t):
    rows, cols = 9, 2 * block_size(t)
    w = weight_matrix(t, rows, cols, seed=1)
    packed = _kernels.pack_weights(int(t), w, rows, cols)
    x = activations(2, cols, seed=1)
    with pytest.raises(ValueError, match=f"whole blocks of {block_size(t)}"):
        _kernels.pack_weights(int(t), w, rows, cols * 3 // 4)
    with pytest.raises(ValueError, match="bytes"):
        _kernels.pack_weights(int(t), w[:-1], rows, cols)
    with pytest.raises(ValueError, match="bytes"):
        _kernels.gemm_packed(int(t), packed[:-1], rows, cols, x)
    with pytest.raises(ValueError, match="bytes"):
        _kernels.gemm_packed(int(t), packed, rows + 8, cols, x)
    with pytest.raises(ValueError, match="columns"):
        _kernels.gemm_packed(int(t), packed, rows, cols, activations(2, 32, seed=1))
    for r0, r1 in ((4, 9), (0, 10), (8, 4), (-8, 4)):
        with pytest.raises(ValueError, match="range"):
            _kernels.gemm_packed(int(t), packed, rows, cols, x, r0=r0, r1=r1)
    with pytest.raises(ValueError, match="bytes"):
        _kernels.gemm_packed_quantized(int(t), packed, rows, cols, quantized(t, x)[:-1], 2)
    with pytest.raises(ValueError, match="no packed kernel"):
        _kernels.pack_weights(int(W.Q5_1), np.zeros(rows * 48, np.uint8), rows, cols)
