# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Every kernel of the C core (csrc/) on its own, over numpy arrays: what the tests check against
numpy and gguf-py references on every ISA (tests/test_quants.py, test_ops.py, ...) and what the
benchmarks time. The runtime never imports it (to_f32, which the loader widens norms with, is
pyllm._core's).

This module links its own copy of the core, so of its kernel tables too: it installs whatever ISA
pyllm._core installs, set_isa there switching both.
"""
from libc.stdint cimport int64_t, uint16_t, uintptr_t

import numpy as np

from pyllm._csrc cimport *

from pyllm import _core

KV_DTYPES = _core.KV_DTYPES
NORM_KINDS = enum_names(pl_norm_kind_name)


def _install(int isa) -> None:
    """pyllm._core.set_isa calls this with each ISA it installs."""
    pl_set_isa(isa)


pl_set_isa(_core.follow_isa(_install))


def packed_kernels() -> str:
    """Which build of the packed GEMM kernels the current ISA installed: "scalar", "avx2", "vnni"
    (the avx512 ISA on a CPU with VNNI), "avxvnni" (the avx2 ISA on a CPU with AVX-VNNI) or "neon"."""
    return pl_packed_kernels_name().decode()


def cpu_has_vnni() -> bool:
    """Whether this AVX-512 CPU has VNNI, whose packed kernels (csrc/packed_vnni.c) the avx512 ISA
    then installs."""
    return bool(pl_cpu_has_vnni())


def cpu_has_avx_vnni() -> bool:
    """Whether this CPU has AVX-VNNI, whose packed kernels (csrc/packed_avxvnni.c) the avx2 ISA then
    installs."""
    return bool(pl_cpu_has_avx_vnni())


def packed_avxvnni_compiled() -> bool:
    """Whether this core was built with the AVX-VNNI kernels (its compiler knew AVX-VNNI); without
    them the avx2 ISA installs the AVX2 build on an AVX-VNNI CPU too."""
    return bool(pl_packed_avxvnni_compiled())


def from_f32(int wtype, const float[::1] x):
    """Quantizes / narrows a float32 vector to wtype; returns the bytes."""
    cdef const pl_type_traits *t = traits_of(wtype)
    cdef int64_t n = x.shape[0]
    out = np.empty(checked_row_size(wtype, n), dtype=np.uint8)
    cdef unsigned char[::1] o = out
    if t.from_f32 == NULL:
        raise ValueError(f"type {wtype} cannot be produced from float32")
    if n:
        t.from_f32(&x[0], &o[0], n)
    return out


def vec_dot(int wtype, const unsigned char[::1] w, const unsigned char[::1] x, int64_t n) -> float:
    """Dot of a row stored as wtype with a row stored as its vec_dot_type (raw bytes)."""
    cdef const pl_type_traits *t = traits_of(wtype)
    if t.vec_dot == NULL:
        raise ValueError(f"type {wtype} has no dot kernel")
    if w.shape[0] < checked_row_size(wtype, n) or x.shape[0] < checked_row_size(t.vec_dot_type, n):
        raise ValueError("buffers shorter than n elements")
    return t.vec_dot(&w[0], &x[0], n)


def vec_dot_rows(int wtype, const unsigned char[::1] w, const unsigned char[::1] x, int n_rows, int64_t n):
    """Dots of a row stored as wtype with n_rows rows of its vec_dot_type, back to back in x (raw
    bytes), through the multi-row kernel the matmul uses; float32 array of n_rows."""
    cdef const pl_type_traits *t = traits_of(wtype)
    if t.vec_dot == NULL:
        raise ValueError(f"type {wtype} has no dot kernel")
    cdef int64_t xrow = checked_row_size(t.vec_dot_type, n)
    if n_rows < 0 or w.shape[0] < checked_row_size(wtype, n) or x.shape[0] < n_rows * xrow:
        raise ValueError("buffers shorter than n_rows rows of n elements")
    out = np.empty(n_rows, dtype=np.float32)
    cdef float[::1] o = out
    if n_rows:
        pl_vec_dot_rows(t, &w[0], &x[0], xrow, n_rows, n, &o[0], 1)
    return out


def softmax(const float[::1] x):
    """The engine's softmax of a float32 vector (for tests of each ISA's kernel)."""
    out = np.array(x, dtype=np.float32)
    cdef float[::1] o = out
    if o.shape[0]:
        pl_vec.softmax(&o[0], <int>o.shape[0])
    return out


def dot_f16(const float[::1] q, const uint16_t[::1] k):
    """q · k with k in f16 (as uint16 bits), the attention's kernel for an f16 cache."""
    if q.shape[0] != k.shape[0]:
        raise ValueError("q and k differ in length")
    if q.shape[0] == 0:
        return 0.0
    return pl_vec.dot_f16(&q[0], &k[0], q.shape[0])


def axpy_f16(const float[::1] y, float a, const uint16_t[::1] x):
    """y + a·x with x in f16 (as uint16 bits), the attention's kernel for an f16 cache."""
    if y.shape[0] != x.shape[0]:
        raise ValueError("y and x differ in length")
    out = np.array(y, dtype=np.float32)
    cdef float[::1] o = out
    if o.shape[0]:
        pl_vec.axpy_f16(&o[0], a, &x[0], o.shape[0])
    return out


def swiglu(const float[::1] gate, const float[::1] up):
    """silu(gate) · up through the engine's kernel (for tests of each ISA's kernel)."""
    if gate.shape[0] != up.shape[0]:
        raise ValueError("gate and up differ in length")
    out = np.array(gate, dtype=np.float32)
    cdef float[::1] o = out
    if o.shape[0]:
        pl_vec.swiglu(&o[0], &up[0], <int>o.shape[0])
    return out


cdef struct _matmul_job:
    pl_matmul_out out
    const float *x
    int n
    pl_matmul_scratch *scratch
    pl_pool *pool


cdef void _matmul_task(void *arg, int ith, int nth) noexcept nogil:
    cdef _matmul_job *job = <_matmul_job *>arg
    pl_matmul(&job.out, 1, job.x, job.n, job.n, job.scratch, job.pool, ith, nth)


def matmul(int wtype, const unsigned char[::1] w, int64_t rows, int64_t cols, const float[:, ::1] x,
           int threads=1, bint blas=True, int64_t tile_floats=1 << 18, tuple blas_controls=(0, 0),
           bint packed=False):
    """y (n, rows) = x (n, cols) · Wᵀ through the engine's matmul (for tests of every path:
    vec_dot, sgemm from thread 0, per-thread sgemm when blas_controls are given, and with packed
    the interleaved copy a model gives types that have a packed kernel)."""
    cdef const pl_type_traits *t = traits_of(wtype)
    if t.vec_dot == NULL:
        raise ValueError(f"type {wtype} has no dot kernel")
    if x.shape[1] != cols or w.shape[0] < rows * checked_row_size(wtype, cols):
        raise ValueError("shapes do not match")
    cdef int n = x.shape[0]
    y = np.zeros((n, rows), dtype=np.float32)
    cdef float[:, ::1] yv = y
    if n == 0 or rows == 0:
        return y
    cdef pl_tensor wt
    wt.type = wtype
    wt.rows = rows
    wt.cols = cols
    wt.data = &w[0]
    wt.packed = NULL
    cdef unsigned char[::1] packed_view
    if packed and pl_packed_type(wtype):
        packed_copy = np.empty(pl_packed_bytes(wtype, rows, cols) + 64, dtype=np.uint8)
        packed_view = packed_copy
        wt.packed = <void *>(((<uintptr_t>&packed_view[0]) + 63) // 64 * 64)
        pl_pack_groups(wtype, &w[0], rows, cols, wt.packed, 0, (rows + PL_PACK_ROWS - 1) // PL_PACK_ROWS)
    cdef pl_matmul_scratch sc
    sc.xq_region = pl_matmul_xq_bytes(wtype, cols, max(n, threads))  # a row per thread when n == 1
    xq = np.empty(3 * sc.xq_region + 64, dtype=np.uint8)
    cdef unsigned char[::1] xqv = xq
    sc.xq = &xqv[0]
    sc.tile_floats = max(tile_floats, cols)
    tile = np.empty(sc.tile_floats * threads, dtype=np.float32)
    cdef float[::1] tv = tile
    sc.wtile = &tv[0]
    sc.sgemm = scipy_sgemm() if blas else NULL
    cdef pl_blas_threads bt = blas_threads_of(blas_controls)
    sc.per_thread_blas = bt.set_threads != NULL
    cdef _matmul_job job
    job.out.w = &wt
    job.out.y = &yv[0, 0]
    job.out.ldy = rows
    job.out.bias = NULL
    job.x = &x[0, 0]
    job.n = n
    job.scratch = &sc
    cdef pl_pool *pool = pl_pool_create(threads)
    if pool == NULL:
        raise MemoryError("could not start threads")
    job.pool = pool
    cdef int saved = 0
    with nogil:
        if sc.per_thread_blas:
            saved = bt.get_threads()
            bt.set_threads(1)
        pl_pool_run(pool, _matmul_task, &job)
        if sc.per_thread_blas:
            bt.set_threads(saved)
    pl_pool_free(pool)
    return y


cdef int64_t _packed_bytes(int wtype, int64_t rows, int64_t cols) except -1:
    if not pl_packed_type(wtype):
        raise ValueError(f"weight type {wtype} has no packed kernel")
    cdef int64_t size = pl_packed_bytes(wtype, rows, cols)
    if rows < 0 or size < 0:
        raise ValueError(f"a ({rows}, {cols}) matrix cannot be packed: cols must be whole blocks of "
                         f"{traits_of(wtype).block_size}")
    return size


def pack_weights(int wtype, const unsigned char[::1] w, int64_t rows, int64_t cols):
    """Repacks a (rows, cols) matrix stored as wtype (the file's bytes) into the 8-row interleaved
    layout of csrc/packed.h; returns the packed bytes (rows padded to a multiple of 8)."""
    cdef int64_t size = _packed_bytes(wtype, rows, cols)
    if w.shape[0] != rows * checked_row_size(wtype, cols):
        raise ValueError(f"{w.shape[0]} bytes are not a ({rows}, {cols}) matrix of type {wtype}")
    out = np.zeros(size, dtype=np.uint8)
    if size == 0:
        return out
    cdef unsigned char[::1] o = out
    cdef int64_t groups = (rows + PL_PACK_ROWS - 1) // PL_PACK_ROWS
    with nogil:
        pl_pack_groups(wtype, &w[0], rows, cols, &o[0], 0, groups)
    return out


cdef _check_rows(int64_t rows, int64_t r0, int64_t r1):
    if r0 < 0 or r0 % PL_PACK_ROWS or r1 < r0 or r1 > rows:
        raise ValueError(f"rows [{r0}, {r1}) are not a range of the matrix starting on a group of 8")


def gemm_packed_quantized(int wtype, const unsigned char[::1] packed, int64_t rows, int64_t cols,
                          const unsigned char[::1] xq, int n, int64_t r0=0, int64_t r1=-1, int repeat=1):
    """y (n, rows) = xq · Wᵀ through the packed kernel, W as pack_weights returns it and xq n rows of
    the weight type's vec_dot_type back to back (raw bytes). Only rows [r0, r1) of y are computed
    (r1 = -1: to the last row; r0 a multiple of 8), the rest left 0. repeat runs the kernel that
    many times (benchmarks: no Python between the runs)."""
    cdef int64_t size = _packed_bytes(wtype, rows, cols)
    if packed.shape[0] != size:
        raise ValueError(f"{packed.shape[0]} bytes are not a packed ({rows}, {cols}) matrix of type {wtype}")
    cdef int64_t xrow = checked_row_size(traits_of(wtype).vec_dot_type, cols)
    if n < 0 or xq.shape[0] != n * xrow:
        raise ValueError(f"{xq.shape[0]} bytes are not {n} activation rows of {cols} elements")
    if r1 == -1:
        r1 = rows
    _check_rows(rows, r0, r1)
    y = np.zeros((n, rows), dtype=np.float32)
    if n == 0 or r1 == r0:
        return y
    cdef float[:, ::1] yv = y
    cdef int i, rc = 0
    with nogil:
        for i in range(repeat):
            rc = pl_gemm_packed(wtype, &packed[0] if size else NULL, rows, cols, r0, r1,
                                &xq[0] if xrow else NULL, xrow, n, &yv[0, 0], rows)
    if rc != 0:
        raise ValueError("the packed kernel refused its arguments")
    return y


def gemm_packed(int wtype, const unsigned char[::1] packed, int64_t rows, int64_t cols, const float[:, ::1] x,
                int64_t r0=0, int64_t r1=-1):
    """gemm_packed_quantized of x (n, cols) float32, quantized row by row to the weight type's
    vec_dot_type with its from_f32, as the matmul quantizes activations."""
    if x.shape[1] != cols:
        raise ValueError(f"x has {x.shape[1]} columns, the matrix {cols}")
    _packed_bytes(wtype, rows, cols)
    xq = from_f32(traits_of(wtype).vec_dot_type, np.asarray(x).reshape(-1))
    return gemm_packed_quantized(wtype, packed, rows, cols, xq, x.shape[0], r0, r1)


def dot_rows_matrix(int wtype, const unsigned char[::1] w, int64_t rows, int64_t cols,
                    const unsigned char[::1] xq, int n, int repeat=1):
    """y (n, rows) = xq · Wᵀ the way matmul.c's vec_dot path computes it (vec_dot for one activation
    row, vec_dot_rows for several), on activations already quantized: the packed kernel's
    benchmark baseline. repeat as in gemm_packed_quantized."""
    cdef const pl_type_traits *t = traits_of(wtype)
    if t.vec_dot == NULL:
        raise ValueError(f"type {wtype} has no dot kernel")
    cdef int64_t wrow = checked_row_size(wtype, cols), xrow = checked_row_size(t.vec_dot_type, cols)
    if rows < 0 or n < 0 or w.shape[0] != rows * wrow or xq.shape[0] != n * xrow:
        raise ValueError("buffers do not hold the matrix and n activation rows")
    y = np.zeros((n, rows), dtype=np.float32)
    if n == 0 or rows == 0 or cols == 0:
        return y
    cdef float[:, ::1] yv = y
    cdef int i
    cdef int64_t r
    with nogil:
        for i in range(repeat):
            for r in range(rows):
                if n == 1:
                    yv[0, r] = t.vec_dot(&w[r * wrow], &xq[0], cols)
                else:
                    pl_vec_dot_rows(t, &w[r * wrow], &xq[0], xrow, n, cols, &yv[0, r], rows)
    return y

def norm(const float[::1] x, const float[::1] w, b=None, str kind="rms", float eps=1e-6):
    """The engine's RMSNorm or LayerNorm of one row."""
    if w.shape[0] != x.shape[0] or x.shape[0] == 0:
        raise ValueError("x and w must have the same, non-zero length")
    cdef const float[::1] bv
    cdef pl_norm nrm
    nrm.w = &w[0]
    nrm.b = NULL
    nrm.kind = NORM_KINDS.index(kind)
    if b is not None:
        bv = b
        if bv.shape[0] != x.shape[0]:
            raise ValueError("b must have x's length")
        nrm.b = &bv[0]
    out = np.empty(x.shape[0], dtype=np.float32)
    cdef float[::1] o = out
    pl_norm_apply(&o[0], &x[0], &nrm, <int>x.shape[0], eps)
    return out


def rope(const float[:, ::1] x, int n_heads, int n_rot, const float[::1] cos, const float[::1] sin,
         bint interleaved=False):
    """The engine's rotation of each row of x (n_heads heads each) by one position's cos/sin."""
    if x.shape[1] % n_heads or n_rot > x.shape[1] // n_heads or n_rot % 2 or n_rot < 0:
        raise ValueError("bad head layout")
    if cos.shape[0] < n_rot // 2 or sin.shape[0] < n_rot // 2:
        raise ValueError("cos/sin must hold n_rot / 2 values")
    out = np.array(x, dtype=np.float32)
    cdef float[:, ::1] o = out
    for r in range(o.shape[0]):
        pl_rope(&o[r, 0], n_heads, <int>(x.shape[1] // n_heads), n_rot, &cos[0], &sin[0], interleaved)
    return out


def softcap(const float[::1] x, float cap):
    out = np.array(x, dtype=np.float32)
    cdef float[::1] o = out
    if cap <= 0:
        raise ValueError("cap must be positive")
    if o.shape[0]:
        pl_softcap(&o[0], o.shape[0], cap)
    return out


def geglu(const float[::1] gate, const float[::1] up):
    """gelu_tanh(gate) · up through the engine's kernel."""
    if gate.shape[0] != up.shape[0]:
        raise ValueError("gate and up differ in length")
    out = np.array(gate, dtype=np.float32)
    cdef float[::1] o = out
    if o.shape[0]:
        pl_vec.geglu(&o[0], &up[0], <int>o.shape[0])
    return out


def gelu(const float[::1] x):
    """gelu_tanh(x) through the engine's kernel."""
    out = np.array(x, dtype=np.float32)
    cdef float[::1] o = out
    if o.shape[0]:
        pl_vec.gelu(&o[0], <int>o.shape[0])
    return out


cdef struct _attention_job:
    pl_model *m
    const float *q
    pl_kv_view kv
    int pos0, n, window
    float *out
    float *scores
    int64_t scores_per_thread
    int path  # 0: pl_attention, 1: pl_attention_blas, 2: pl_attention_per_query, 3: pl_attention_decode
    pl_pool *pool
    pl_sgemm_fn sgemm
    float *kv_wide
    int64_t kv_wide_per_thread
    const pl_probs_out *probs


cdef void _attention_task(void *arg, int ith, int nth) noexcept nogil:
    cdef _attention_job *j = <_attention_job *>arg
    cdef float *scores = j.scores + ith * j.scores_per_thread
    if j.path == 1:
        pl_attention_blas(j.m, j.q, &j.kv, j.pos0, j.n, j.window, j.out, scores,
                          j.kv_wide + ith * j.kv_wide_per_thread if j.kv_wide != NULL else NULL, j.sgemm, j.probs,
                          ith, nth)
    elif j.path == 2:
        pl_attention_per_query(j.m, j.q, &j.kv, j.pos0, j.n, j.window, j.out, scores, j.probs, ith, nth)
    elif j.path == 3:  # the threads share one scratch
        pl_attention_decode(j.m, j.q, &j.kv, j.pos0, j.window, j.out, j.scores, j.probs, j.pool, ith, nth)
    else:
        pl_attention(j.m, j.q, &j.kv, j.pos0, j.n, j.window, j.out, scores, j.scores_per_thread, j.probs, ith, nth)


def attention(const float[:, ::1] q, k, v, int n_heads, int n_kv_heads, float scale, int pos0=0, int window=0,
              float softcap=0.0, bint blas=False, int threads=1, bint with_probs=False, bint per_query=False,
              scores_per_thread=None, bint head_major=False, bint q8_0=False, bint decode=False):
    """The engine's causal attention of q (n, n_heads·hd) at positions pos0.. over the cache k, v
    (pos0 + n, n_kv_heads·hd), float32 or float16 (an f16 cache): the vec path, the sgemm path with
    blas=True, the one-query-at-a-time reference with per_query=True, or a decode step's path
    (pl_attention_decode: n == 1, the threads sharing each KV head) with decode=True.
    head_major: k and v are laid out as a model state keeps them, (n_kv_heads, pos0 + n, hd).
    q8_0: float32 k and v go into a q8_0 cache first, each head's row quantized as a state stores
    it (head_dim a multiple of 32).
    scores_per_thread: the vec path's scratch in floats (at least pos0 + n; by default what a model
    state gives it). with_probs: returns (out, probabilities (n_heads, n, pos0 + n)) as a trace
    copies them."""
    cdef int n = q.shape[0]
    if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads or q.shape[1] % n_heads:
        raise ValueError("bad head counts")
    cdef int hd = q.shape[1] // n_heads
    k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)
    if k.dtype != v.dtype or k.dtype not in (np.float32, np.float16) or (q8_0 and (k.dtype != np.float32 or hd % 32)):
        raise ValueError("k and v must be both float32 or both float16 (float32 for q8_0, head_dim a multiple of 32)")
    shape = [n_kv_heads, pos0 + n, hd] if head_major else [pos0 + n, n_kv_heads * hd]
    if v.shape != k.shape or list(k.shape) != shape:
        raise ValueError("k and v must hold pos0 + n rows of n_kv_heads · head_dim")
    if q8_0:  # whole blocks per head row, so quantizing the lot is quantizing each row
        k, v = from_f32(KV_DTYPES["q8_0"], k.ravel()), from_f32(KV_DTYPES["q8_0"], v.ravel())
    if n == 0 or window < 0 or softcap < 0 or (decode and (n != 1 or blas or per_query)):
        raise ValueError("bad arguments")
    cdef pl_model m
    m.n_heads, m.n_kv_heads, m.head_dim = n_heads, n_kv_heads, hd
    m.attn_scale, m.attn_softcap = scale, softcap
    out = np.zeros((n, q.shape[1]), dtype=np.float32)
    cdef float[:, ::1] o = out
    cdef int64_t per
    if scores_per_thread is None:
        per = pl_attention_scores_floats(&m, pos0 + n, blas)
    else:
        per = scores_per_thread
        if per < (PL_ATTN_QBLOCK if blas else 1) * (pos0 + n):
            raise ValueError("scores_per_thread too small")
    scores = np.zeros(max(per * threads, n_heads * (pos0 + n)), dtype=np.float32)
    cdef float[::1] sv = scores
    cdef _attention_job job
    job.m, job.q = &m, &q[0, 0]
    job.kv.k, job.kv.v = <const void *><uintptr_t>k.ctypes.data, <const void *><uintptr_t>v.ctypes.data
    job.kv.type = KV_DTYPES["q8_0" if q8_0 else "f16" if k.dtype == np.float16 else "f32"]
    job.kv.ld = hd if head_major else n_kv_heads * hd
    job.kv.head_stride = (pos0 + n) * hd if head_major else hd
    job.pos0, job.n, job.window, job.out = pos0, n, window, &o[0, 0]
    job.scores, job.scores_per_thread = &sv[0], per
    job.path = 1 if blas else 2 if per_query else 3 if decode else 0
    job.sgemm = scipy_sgemm() if blas else NULL
    # the sgemm path widens an f16 or q8_0 cache's rows of a head first
    wide = np.zeros(threads * 2 * (pos0 + n) * hd if blas and job.kv.type != 0 else 1, dtype=np.float32)
    job.kv_wide = <float *><uintptr_t>wide.ctypes.data if blas and job.kv.type != 0 else NULL
    job.kv_wide_per_thread = 2 * (pos0 + n) * hd
    probs = np.zeros((n_heads, n, pos0 + n), dtype=np.float32)
    cdef pl_probs_out po
    po.data, po.row0, po.n_rows, po.n_keys = <float *><uintptr_t>probs.ctypes.data, 0, n, pos0 + n
    job.probs = &po if with_probs else NULL
    cdef pl_pool *pool = pl_pool_create(threads)
    if pool == NULL:
        raise MemoryError("could not start threads")
    job.pool = pool
    with nogil:
        pl_pool_run(pool, _attention_task, &job)
    pl_pool_free(pool)
    return (out, probs) if with_probs else out


cdef struct _rows_job:
    pl_model *m
    pl_attn_row *rows
    int n, window
    float *scores
    int64_t per


cdef void _row_of(const void *ctx, int t, pl_attn_row *row) noexcept nogil:
    row[0] = (<_rows_job *>ctx).rows[t]


cdef void _rows_task(void *arg, int ith, int nth) noexcept nogil:
    cdef _rows_job *j = <_rows_job *>arg
    pl_attention_rows(j.m, _row_of, j, j.n, j.window, j.scores + ith * j.per, j.per, ith, nth)


def attention_rows(rows, int n_heads, int n_kv_heads, float scale, int window=0, float softcap=0.0, int threads=1,
                   scores_per_thread=None, bint q8_0=False):
    """pl_attention_rows: the attention of a batched decode step whose rows each attend over their
    own cache. rows: (q (n_heads·hd,) float32, k, v (n_kv_heads, pos + 1, hd) head-major, float32 or
    float16, pos) each; q8_0: float32 k and v go into a q8_0 cache first. scores_per_thread: the
    scratch in floats (at least the longest row's keys; by default what a model state gives it).
    Returns (len(rows), n_heads·hd)."""
    cdef int n = len(rows), t
    if n < 1 or n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads or window < 0 or softcap < 0:
        raise ValueError("bad arguments")
    cdef pl_model m
    m.n_heads, m.n_kv_heads = n_heads, n_kv_heads
    m.attn_scale, m.attn_softcap = scale, softcap
    keep = []
    table = np.zeros(n * sizeof(pl_attn_row), dtype=np.uint8)
    cdef pl_attn_row *r = <pl_attn_row *><uintptr_t>table.ctypes.data
    out = np.zeros((n, 0), dtype=np.float32)
    cdef int hd = 0, longest = 1
    for t, (q, k, v, pos) in enumerate(rows):
        q, k, v = np.ascontiguousarray(q, np.float32), np.ascontiguousarray(k), np.ascontiguousarray(v)
        if t == 0:
            hd = q.shape[0] // n_heads
            out = np.zeros((n, n_heads * hd), dtype=np.float32)
        if (hd < 1 or pos < 0 or q.shape != (n_heads * hd,) or k.shape != (n_kv_heads, pos + 1, hd) or v.shape != k.shape
                or k.dtype != v.dtype or k.dtype not in (np.float32, np.float16)
                or (q8_0 and (k.dtype != np.float32 or hd % 32))):
            raise ValueError(f"row {t}: q, k or v has the wrong shape or type")
        if q8_0:
            k, v = from_f32(KV_DTYPES["q8_0"], k.ravel()), from_f32(KV_DTYPES["q8_0"], v.ravel())
        keep += [q, k, v]
        r[t].q = <const float *><uintptr_t>q.ctypes.data
        r[t].out = <float *><uintptr_t>out[t].ctypes.data
        r[t].kv.k, r[t].kv.v = <const void *><uintptr_t>k.ctypes.data, <const void *><uintptr_t>v.ctypes.data
        r[t].kv.type = KV_DTYPES["q8_0" if q8_0 else "f16" if k.dtype == np.float16 else "f32"]
        r[t].kv.ld, r[t].kv.head_stride = hd, (pos + 1) * hd
        r[t].pos = pos
        longest = max(longest, pos + 1)
    m.head_dim = hd
    cdef int64_t per = pl_attention_scores_floats(&m, longest, 0) if scores_per_thread is None else scores_per_thread
    if per < longest:
        raise ValueError("scores_per_thread too small")
    scores = np.zeros(per * threads, dtype=np.float32)
    cdef _rows_job job
    job.m, job.rows, job.n, job.window = &m, r, n, window
    job.scores, job.per = <float *><uintptr_t>scores.ctypes.data, per
    cdef pl_pool *pool = pl_pool_create(threads)
    if pool == NULL:
        raise MemoryError("could not start threads")
    with nogil:
        pl_pool_run(pool, _rows_task, &job)
    pl_pool_free(pool)
    return out


def dot_qk(const float[:, ::1] qs, k, bint single=False):
    """qs (nq, n) · every row of k (nk, n), float32 or float16 (as float16), through pl_vec's
    multi-query kernel, or with single=True one dot_f32 / dot_f16 call each: (nq, nk) float32."""
    k = np.ascontiguousarray(k)
    if k.dtype not in (np.float32, np.float16) or k.ndim != 2 or k.shape[1] != qs.shape[1]:
        raise ValueError("k must be (nk, n) float32 or float16")
    cdef int nq = qs.shape[0], nk = k.shape[0], i, j
    cdef int64_t n = qs.shape[1]
    out = np.zeros((nq, nk), dtype=np.float32)
    if nq == 0 or nk == 0 or n == 0:
        return out
    cdef float[:, ::1] o = out
    cdef bint f16 = k.dtype == np.float16
    cdef const float *kf = <const float *><uintptr_t>k.ctypes.data
    cdef const uint16_t *kh = <const uint16_t *><uintptr_t>k.ctypes.data
    pointers = np.array([<uintptr_t>&qs[i, 0] for i in range(nq)], dtype=np.uintp)
    cdef const float **qp = <const float **><uintptr_t>pointers.ctypes.data
    with nogil:
        if single:
            for i in range(nq):
                for j in range(nk):
                    o[i, j] = pl_vec.dot_f16(&qs[i, 0], kh + j * n, n) if f16 else pl_vec.dot_f32(&qs[i, 0], kf + j * n, n)
        elif f16:
            pl_vec.dot_f16_qk(qp, nq, kh, n, nk, n, &o[0, 0], nk)
        else:
            pl_vec.dot_f32_qk(qp, nq, kf, n, nk, n, &o[0, 0], nk)
    return out


def axpy_qk(const float[:, ::1] ys, const float[:, ::1] ws, first, end, x, bint single=False):
    """ys[i] + Σ ws[i, j]·x[j] over j = first[i] .. end[i] - 1 in order, x (nk, n) float32 or float16,
    through pl_vec's multi-query kernel, or with single=True one axpy_f32 / axpy_f16 call per row."""
    x = np.ascontiguousarray(x)
    cdef int nq = ys.shape[0], i, j
    cdef int64_t n = ys.shape[1]
    if x.dtype not in (np.float32, np.float16) or x.ndim != 2 or x.shape[1] != n or ws.shape[0] != nq:
        raise ValueError("x must be (nk, n) float32 or float16, ws one row per y")
    cdef int nk = x.shape[0]
    fi, en = np.asarray(first, dtype=np.int32), np.asarray(end, dtype=np.int32)
    if fi.shape != (nq,) or en.shape != (nq,) or (fi < 0).any() or (en > min(nk, ws.shape[1])).any():
        raise ValueError("bad ranges")
    out = np.array(ys, dtype=np.float32)
    if nq == 0 or n == 0:
        return out
    cdef float[:, ::1] o = out
    cdef int[::1] fv = fi, ev = en
    cdef bint f16 = x.dtype == np.float16
    cdef const float *xf = <const float *><uintptr_t>x.ctypes.data
    cdef const uint16_t *xh = <const uint16_t *><uintptr_t>x.ctypes.data
    pointers = np.array([<uintptr_t>&o[i, 0] for i in range(nq)], dtype=np.uintp)
    cdef float **yp = <float **><uintptr_t>pointers.ctypes.data
    with nogil:
        if single:
            for i in range(nq):
                for j in range(fv[i], ev[i]):
                    if f16:
                        pl_vec.axpy_f16(&o[i, 0], ws[i, j], xh + j * n, n)
                    else:
                        pl_vec.axpy_f32(&o[i, 0], ws[i, j], xf + j * n, n)
        elif f16:
            pl_vec.axpy_f16_qk(yp, nq, &ws[0, 0], ws.shape[1], &fv[0], &ev[0], xh, n, n)
        else:
            pl_vec.axpy_f32_qk(yp, nq, &ws[0, 0], ws.shape[1], &fv[0], &ev[0], xf, n, n)
    return out
