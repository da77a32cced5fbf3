# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Bindings of the C core (csrc/): the model struct, sequences, and kernel entry points for tests.

Everything that reaches C here has been validated by the Python layer (formats/, arch/): addresses
point inside live mmaps or numpy arrays that the objects below keep referenced.
"""
from libc.stdint cimport int32_t, int64_t, uint16_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

import threading

import numpy as np

from cpython.pycapsule cimport PyCapsule_GetName, PyCapsule_GetPointer
from cpython.unicode cimport PyUnicode_DecodeUTF8

cdef extern from "pyllm.h" nogil:
    ctypedef void (*pl_to_f32_fn)(const void *src, float *dst, int64_t n)
    ctypedef void (*pl_from_f32_fn)(const float *src, void *dst, int64_t n)
    ctypedef float (*pl_vec_dot_fn)(const void *w, const void *x, int64_t n)
    ctypedef struct pl_type_traits:
        const char *name
        int64_t block_size
        int64_t type_size
        int vec_dot_type
        pl_to_f32_fn to_f32
        pl_from_f32_fn from_f32
        pl_vec_dot_fn vec_dot
    ctypedef struct pl_vec_kernels:
        void (*softmax)(float *x, int n) noexcept nogil
        void (*swiglu)(float *gate, const float *up, int n) noexcept nogil
        void (*geglu)(float *gate, const float *up, int n) noexcept nogil
        void (*gelu)(float *x, int n) noexcept nogil
        float (*dot_f16)(const float *a, const uint16_t *b, int64_t n) noexcept nogil
        void (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n) noexcept nogil
        float (*dot_f32)(const float *a, const float *b, int64_t n) noexcept nogil
        void (*axpy_f32)(float *y, float a, const float *x, int64_t n) noexcept nogil
        void (*dot_f32_qk)(const float *const *qs, int nq, const float *k, int64_t ldk, int nk, int64_t n,
                           float *out, int64_t ldo) noexcept nogil
        void (*axpy_f32_qk)(float *const *ys, int nq, const float *ws, int64_t ldw, const int *first,
                            const int *end, const float *x, int64_t ldx, int64_t n) noexcept nogil
        void (*dot_f16_qk)(const float *const *qs, int nq, const uint16_t *k, int64_t ldk, int nk, int64_t n,
                           float *out, int64_t ldo) noexcept nogil
        void (*axpy_f16_qk)(float *const *ys, int nq, const float *ws, int64_t ldw, const int *first,
                            const int *end, const uint16_t *x, int64_t ldx, int64_t n) noexcept nogil
    pl_vec_kernels pl_vec
    const pl_type_traits *pl_traits(int type)
    int64_t pl_row_size(int type, int64_t n)
    void pl_vec_dot_rows(const pl_type_traits *t, const void *w, const void *x, int64_t x_stride, int n_rows,
                         int64_t n, float *out, int64_t out_stride)

    int pl_cpu_best_isa()
    int pl_set_isa(int isa)
    int pl_current_isa()
    const char *pl_isa_name(int isa)
    int pl_cpu_has_vnni()
    int pl_cpu_has_avx_vnni()

    ctypedef struct pl_pool:
        pass
    pl_pool *pl_pool_create(int n_threads)
    void pl_pool_free(pl_pool *pool)
    int pl_pool_size(const pl_pool *pool)

    ctypedef void (*pl_sgemm_fn)(char *transa, char *transb, int *m, int *n, int *k, float *alpha,
                                 float *a, int *lda, float *b, int *ldb, float *beta, float *c,
                                 int *ldc)
    ctypedef struct pl_blas_threads:
        void (*set_threads)(int n) noexcept nogil
        int (*get_threads)() noexcept nogil
    ctypedef struct pl_tensor:
        int type
        int64_t rows
        int64_t cols
        const void *data
        void *packed
    ctypedef struct pl_norm:
        const float *w
        const float *b
        int kind
    # The slot fields are reached through pl_layer_slot()/pl_model_slot() offsets, not by name.
    ctypedef struct pl_layer:
        int sliding_window
        int rope
    ctypedef struct pl_slot:
        const char *name
        int kind
        int rows
        int cols
        int required
        size_t offset
    int pl_layer_slot_count()
    const pl_slot *pl_layer_slot(int i)
    int pl_model_slot_count()
    const pl_slot *pl_model_slot(int i)
    ctypedef struct pl_rope_table:
        const float *inv_freq
        float scale
    enum: PL_MAX_ROPES
    ctypedef struct pl_model:
        int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size, n_positions
        float norm_eps, attn_scale, attn_softcap, logit_softcap, embed_scale
        int activation, n_rot, rope_interleaved, n_ropes
        pl_rope_table ropes[PL_MAX_ROPES]
        pl_layer *layers
        pl_sgemm_fn sgemm
        pl_blas_threads blas
        void *weights_block
        size_t weights_block_bytes
    const char *pl_model_check(const pl_model *m)
    int pl_model_quantized(const pl_model *m)
    int pl_model_reserve_weights(pl_model *m, pl_tensor *const *ts, int n, void **places)
    int pl_tensor_pack(pl_tensor *t, pl_pool *pool, int64_t g0, int64_t g1)
    void pl_model_unpack(pl_model *m)
    int pl_convert_tensor(pl_pool *pool, const pl_tensor *src, int dst_type, void *dst)

    ctypedef struct pl_state:
        pass
    pl_state *pl_state_create(const pl_model *m, int n_ctx, int n_batch, int n_threads, int kv_type)
    int pl_kv_type_fits(const pl_model *m, int kv_type)
    int64_t pl_state_cache_bytes(const pl_state *s)
    void pl_state_free(pl_state *s)
    int pl_state_pos(const pl_state *s)
    int pl_state_n_ctx(const pl_state *s)
    int pl_state_truncate(pl_state *s, int pos)
    int pl_forward(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
                   float *logits, int all_logits)
    enum: PL_TRACE_POINTS
    ctypedef struct pl_trace:
        int pos0, n_rows, n_keys
        float *embed
        float *out_norm
        float **layers
    int pl_forward_traced(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
                          float *logits, int all_logits, const pl_trace *trace)
    int pl_head(const pl_model *m, pl_state *s, pl_pool *pool, const float *x, int n, float *logits)
    ctypedef struct pl_vocab_split_list:
        int64_t *which
        int64_t *cut
        int64_t *left
        int64_t *right
        int64_t n
    int pl_vocab_splits(const char *bytes, const int64_t *offsets, int64_t n, pl_vocab_split_list *out)
    void pl_vocab_split_list_free(pl_vocab_split_list *out)
    int pl_forward_batch(const pl_model *m, pl_state *work, pl_state *const *seqs, int n_seqs, pl_pool *pool,
                         const int32_t *tokens, float *logits)

cdef extern from "kernels.h" nogil:
    ctypedef struct pl_matmul_out:
        const pl_tensor *w
        float *y
        int64_t ldy
        const float *bias
    ctypedef struct pl_matmul_scratch:
        void *xq
        int64_t xq_region
        float *wtile
        int64_t tile_floats
        pl_sgemm_fn sgemm
        int per_thread_blas
    void pl_matmul(const pl_matmul_out *outs, int n_outs, const float *x, int n, int batch,
                   const pl_matmul_scratch *scratch, pl_pool *pool, int ith, int nth)
    int64_t pl_matmul_xq_bytes(int type, int64_t cols, int n)
    enum: PL_BLAS_MIN_TOKENS
    void pl_pool_run(pl_pool *pool, void (*fn)(void *arg, int ith, int nth) noexcept nogil, void *arg)
    void pl_trim_heap()
    int pl_swept_on_huge_pages()

cdef extern from "packed.h" nogil:
    enum: PL_PACK_ROWS
    int pl_packed_type(int type)
    const char *pl_packed_kernels_name()
    int pl_packed_avxvnni_compiled()
    int64_t pl_packed_bytes(int type, int64_t rows, int64_t cols)
    int pl_pack_groups(int type, const void *src, int64_t rows, int64_t cols, void *dst, int64_t g0, int64_t g1)
    int pl_gemm_packed(int type, const void *packed, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                       const void *x, int64_t x_stride, int n, float *y, int64_t ldy)

# From this many tokens on, a forward pass multiplies with sgemm on float32 activations.
BLAS_MIN_TOKENS = PL_BLAS_MIN_TOKENS
# A layer's traceable points, in enum pl_trace_point's order.
TRACE_POINTS = ("attn_norm", "q", "k", "v", "probs", "attn_out", "resid_attn", "ffn_norm", "mlp_out",
                "hidden")

ISA_NAMES = {0: "scalar", 1: "avx2", 2: "avx512", 3: "neon"}
_ISA_IDS = {v: k for k, v in ISA_NAMES.items()}

pl_set_isa(pl_cpu_best_isa())


cdef pl_sgemm_fn _sgemm = NULL


cdef pl_sgemm_fn scipy_sgemm() except NULL:
    """SciPy's sgemm, looked up the first time a model or op needs it: importing scipy.linalg
    is most of what `import pyllm` would otherwise cost."""
    global _sgemm
    if _sgemm == NULL:
        from scipy.linalg import cython_blas

        capsule = cython_blas.__pyx_capi__["sgemm"]
        _sgemm = <pl_sgemm_fn>PyCapsule_GetPointer(capsule, PyCapsule_GetName(capsule))
    return _sgemm


def best_isa() -> str:
    """The fastest kernel set this CPU and OS support."""
    return ISA_NAMES[pl_cpu_best_isa()]


def current_isa() -> str:
    return ISA_NAMES[pl_current_isa()]


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


def set_isa(name: str) -> str:
    """Installs the kernels of an ISA ("best" for the fastest); returns what was installed.
    Only call it while no forward pass runs."""
    if name == "best":
        return ISA_NAMES[pl_set_isa(pl_cpu_best_isa())]
    if name not in _ISA_IDS:
        raise ValueError(f"unknown ISA {name!r}; expected one of {sorted(_ISA_IDS)} or 'best'")
    return ISA_NAMES[pl_set_isa(_ISA_IDS[name])]


cdef const pl_type_traits *_traits(int wtype) except NULL:
    cdef const pl_type_traits *t = pl_traits(wtype)
    if t == NULL:
        raise ValueError(f"weight type {wtype} is unknown to the C core")
    return t


def supports(int wtype) -> bool:
    """Whether the core can multiply by weights of this type."""
    cdef const pl_type_traits *t = pl_traits(wtype)
    return t != NULL and t.vec_dot != NULL


def vec_dot_type(int wtype) -> int:
    return _traits(wtype).vec_dot_type


def block_size(int wtype) -> int:
    """Elements per block of a type (1 for f32/f16/bf16)."""
    return _traits(wtype).block_size


def row_size(int wtype, int64_t n) -> int:
    cdef int64_t r = pl_row_size(wtype, n)
    if r < 0:
        raise ValueError(f"{n} elements are not whole blocks of type {wtype}")
    return r


def to_f32(int wtype, const unsigned char[::1] data, int64_t n):
    """Dequantizes / widens n elements stored as wtype."""
    cdef const pl_type_traits *t = _traits(wtype)
    if data.shape[0] < row_size(wtype, n):
        raise ValueError("buffer shorter than n elements")
    out = np.empty(n, dtype=np.float32)
    cdef float[::1] o = out
    if n:
        t.to_f32(&data[0], &o[0], n)
    return out


def from_f32(int wtype, const float[::1] x):
    """Quantizes / narrows a float32 vector to wtype; returns the bytes."""
    cdef const pl_type_traits *t = _traits(wtype)
    cdef int64_t n = x.shape[0]
    out = np.empty(row_size(wtype, n), dtype=np.uint8)
    cdef unsigned char[::1] o = out
    if t.from_f32 == NULL:
        raise ValueError(f"type {wtype} cannot be produced from float32")
    if n:
        t.from_f32(&x[0], &o[0], n)
    return out


def vec_dot(int wtype, const unsigned char[::1] w, const unsigned char[::1] x, int64_t n) -> float:
    """Dot of a row stored as wtype with a row stored as its vec_dot_type (raw bytes)."""
    cdef const pl_type_traits *t = _traits(wtype)
    if t.vec_dot == NULL:
        raise ValueError(f"type {wtype} has no dot kernel")
    if w.shape[0] < row_size(wtype, n) or x.shape[0] < row_size(t.vec_dot_type, n):
        raise ValueError("buffers shorter than n elements")
    return t.vec_dot(&w[0], &x[0], n)


def vec_dot_rows(int wtype, const unsigned char[::1] w, const unsigned char[::1] x, int n_rows, int64_t n):
    """Dots of a row stored as wtype with n_rows rows of its vec_dot_type, back to back in x (raw
    bytes), through the multi-row kernel the matmul uses; float32 array of n_rows."""
    cdef const pl_type_traits *t = _traits(wtype)
    if t.vec_dot == NULL:
        raise ValueError(f"type {wtype} has no dot kernel")
    cdef int64_t xrow = row_size(t.vec_dot_type, n)
    if n_rows < 0 or w.shape[0] < row_size(wtype, n) or x.shape[0] < n_rows * xrow:
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


cdef pl_blas_threads _blas_controls(tuple controls):
    cdef pl_blas_threads b
    b.set_threads = <void (*)(int) noexcept nogil><uintptr_t>controls[0]
    b.get_threads = <int (*)() noexcept nogil><uintptr_t>controls[1]
    if b.set_threads == NULL or b.get_threads == NULL:
        b.set_threads = NULL
        b.get_threads = NULL
    return b


def matmul(int wtype, const unsigned char[::1] w, int64_t rows, int64_t cols, const float[:, ::1] x,
           int threads=1, bint blas=True, int64_t tile_floats=1 << 18, tuple blas_controls=(0, 0),
           bint packed=False):
    """y (n, rows) = x (n, cols) · Wᵀ through the engine's matmul (for tests of every path:
    vec_dot, sgemm from thread 0, per-thread sgemm when blas_controls are given, and with packed
    the interleaved copy a model gives types that have a packed kernel)."""
    cdef const pl_type_traits *t = _traits(wtype)
    if t.vec_dot == NULL:
        raise ValueError(f"type {wtype} has no dot kernel")
    if x.shape[1] != cols or w.shape[0] < rows * row_size(wtype, cols):
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
    cdef pl_blas_threads bt = _blas_controls(blas_controls)
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


def convert_tensor(int src_type, const unsigned char[::1] data, int64_t rows, int64_t cols,
                   int dst_type, int threads=1):
    """Re-encodes a (rows, cols) matrix stored as src_type into dst_type, in parallel; returns the
    bytes (quantize-on-load)."""
    _traits(src_type)
    _traits(dst_type)
    if data.shape[0] < rows * row_size(src_type, cols):
        raise ValueError("buffer shorter than the matrix")
    out = np.empty(rows * row_size(dst_type, cols), dtype=np.uint8)
    if rows == 0 or cols == 0:
        return out
    cdef unsigned char[::1] o = out
    cdef pl_tensor t
    t.type = src_type
    t.rows = rows
    t.cols = cols
    t.data = &data[0]
    t.packed = NULL
    cdef pl_pool *pool = pl_pool_create(threads)
    if pool == NULL:
        raise MemoryError("could not start threads")
    cdef int rc
    with nogil:
        rc = pl_convert_tensor(pool, &t, dst_type, &o[0])
    pl_pool_free(pool)
    if rc != 0:
        raise ValueError(f"cannot convert type {src_type} to type {dst_type}")
    return out



def packed_type(int wtype) -> bool:
    """Whether a model keeps a packed copy of matrices of this type (csrc/packed.h)."""
    return bool(pl_packed_type(wtype))


def weights_on_huge_pages() -> bool:
    """Whether a model's block of weights is asked onto huge pages here (Linux; csrc/memory.c):
    only then does a plain copy of a matrix that lies in a file's mapping pay."""
    return bool(pl_swept_on_huge_pages())


cdef int64_t _packed_bytes(int wtype, int64_t rows, int64_t cols) except -1:
    if not pl_packed_type(wtype):
        raise ValueError(f"weight type {wtype} has no packed kernel")
    cdef int64_t size = pl_packed_bytes(wtype, rows, cols)
    if rows < 0 or size < 0:
        raise ValueError(f"a ({rows}, {cols}) matrix cannot be packed: cols must be whole blocks of "
                         f"{_traits(wtype).block_size}")
    return size


def pack_weights(int wtype, const unsigned char[::1] w, int64_t rows, int64_t cols):
    """Repacks a (rows, cols) matrix stored as wtype (the file's bytes) into the 8-row interleaved
    layout of csrc/packed.h; returns the packed bytes (rows padded to a multiple of 8)."""
    cdef int64_t size = _packed_bytes(wtype, rows, cols)
    if w.shape[0] != rows * row_size(wtype, cols):
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
    cdef int64_t xrow = row_size(_traits(wtype).vec_dot_type, cols)
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
    xq = from_f32(_traits(wtype).vec_dot_type, np.asarray(x).reshape(-1))
    return gemm_packed_quantized(wtype, packed, rows, cols, xq, x.shape[0], r0, r1)


def dot_rows_matrix(int wtype, const unsigned char[::1] w, int64_t rows, int64_t cols,
                    const unsigned char[::1] xq, int n, int repeat=1):
    """y (n, rows) = xq · Wᵀ the way matmul.c's vec_dot path computes it (vec_dot for one activation
    row, vec_dot_rows for several), on activations already quantized: the packed kernel's
    benchmark baseline. repeat as in gemm_packed_quantized."""
    cdef const pl_type_traits *t = _traits(wtype)
    if t.vec_dot == NULL:
        raise ValueError(f"type {wtype} has no dot kernel")
    cdef int64_t wrow = row_size(wtype, cols), xrow = row_size(t.vec_dot_type, cols)
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

cdef inline const float *_f32_ptr(object arr):
    return <const float *><uintptr_t>arr.ctypes.data if arr is not None else NULL


SLOT_KINDS = ("matrix", "norm", "vector")
SLOT_DIMS = ("one", "dim", "q", "kv", "ffn", "head", "vocab", "pos")
NORM_KINDS = {"rms": 0, "layer": 1}
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


cdef tuple _slot_table(int count, const pl_slot *(*get)(int) noexcept nogil):
    out = []
    cdef const pl_slot *slot
    for i in range(count):
        slot = get(i)
        out.append((slot.name.decode(), SLOT_KINDS[slot.kind], SLOT_DIMS[slot.rows], SLOT_DIMS[slot.cols],
                    bool(slot.required)))
    return tuple(out)


# The one slot list of csrc/pyllm.h, as (name, kind, rows, cols, required): what the binder checks.
LAYER_SLOTS = _slot_table(pl_layer_slot_count(), pl_layer_slot)
MODEL_SLOTS = _slot_table(pl_model_slot_count(), pl_model_slot)


cdef int _fill_slot(char *owner, const pl_slot *slot, object value, list keep) except -1:
    """Writes a bound value into the slot's field: (type, rows, cols, address) for a matrix,
    (w, b or None, kind) float32 arrays for a norm, a float32 array for a vector."""
    cdef char *field = owner + slot.offset
    cdef pl_tensor *t
    cdef pl_norm *nrm
    if slot.kind == 0:
        t = <pl_tensor *>field
        t.type, t.rows, t.cols = value[0], value[1], value[2]
        t.data = <const void *><uintptr_t>value[3]
    elif slot.kind == 1:
        w, b, kind = value
        for arr in (w, b):
            if arr is not None and (arr.dtype != np.float32 or not arr.flags.c_contiguous or arr.ndim != 1):
                raise ValueError(f"{slot.name.decode()} must be C-contiguous float32 vectors")
        nrm = <pl_norm *>field
        nrm.w, nrm.b, nrm.kind = _f32_ptr(w), _f32_ptr(b), NORM_KINDS[kind]
        keep.append((w, b))
    else:
        if value.dtype != np.float32 or not value.flags.c_contiguous or value.ndim != 1:
            raise ValueError(f"{slot.name.decode()} must be a C-contiguous float32 vector")
        (<const float **>field)[0] = _f32_ptr(value)
        keep.append(value)
    return 0


# One forward at a time in the process: a thread pool runs one job at a time, a sequence's cache is
# written in place, and the BLAS thread count that prefill lowers and restores is process-wide.
# Python threads sharing a model queue here (the wait releases the GIL) instead of racing in C.
_forward_lock = threading.Lock()


cdef class CoreModel:
    """The C model struct over weights in place, and the thread pool that runs it.

    hparams: ints/floats named as pl_model's fields (activation by name, see ACTIVATIONS).
    slots: "tok_embd", "out_norm", ... and "layers.{i}.wq", ... -> a value for _fill_slot; a slot
    left out is absent. layers: per layer (sliding_window, rope index). ropes: (inv_freq float32
    (n_rot / 2,), scale) per rotary table. keep: objects (mmaps, arrays) that own the memory the
    matrix addresses point into. place: matrix slot -> None or release(start, nbytes): the matrices
    the model copies into its one block of weights (csrc/pyllm.h), packed where the type has a
    packed kernel (csrc/packed.h), and release is called for each piece of the source's bytes once
    copied.
    """
    cdef pl_model m
    cdef pl_pool *pool
    cdef object keep
    cdef readonly int n_threads
    cdef readonly tuple weight_types  # the types of every matrix, as bound
    cdef readonly frozenset slot_names  # the slots present in some layer or the model ("bq", "pos_embd", ...)
    cdef str _kv_dtype  # the cache type of the sequences made for this model unless they name one

    def __cinit__(self, dict hparams, dict slots, list layers, list ropes, object keep, int threads,
                  bint use_blas=True, object blas_controls=None, dict place=None):
        cdef list held = []
        self.keep = (keep, held)
        self._kv_dtype = "f32"
        self.weight_types = tuple(sorted({int(v[0]) for k, v in slots.items()
                                          if _is_matrix(k)}))
        self.slot_names = frozenset(k.rpartition(".")[2] for k in slots)
        m = &self.m
        for name in ("n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size",
                     "n_positions", "n_rot"):
            if not isinstance(hparams[name], int):
                raise ValueError(f"{name} must be an int")
        m.n_layers, m.dim, m.n_heads = hparams["n_layers"], hparams["dim"], hparams["n_heads"]
        m.n_kv_heads, m.head_dim, m.ffn_dim = hparams["n_kv_heads"], hparams["head_dim"], hparams["ffn_dim"]
        m.vocab_size, m.n_positions = hparams["vocab_size"], hparams["n_positions"]
        m.norm_eps, m.attn_scale = hparams["norm_eps"], hparams["attn_scale"]
        m.attn_softcap, m.logit_softcap = hparams["attn_softcap"], hparams["logit_softcap"]
        m.embed_scale = hparams["embed_scale"]
        m.activation = ACTIVATIONS[hparams["activation"]]
        m.n_rot, m.rope_interleaved = hparams["n_rot"], int(hparams["rope_interleaved"])
        if len(layers) != m.n_layers:
            raise ValueError("one (sliding_window, rope) per layer")
        if len(ropes) > PL_MAX_ROPES:
            raise ValueError(f"at most {PL_MAX_ROPES} rotary tables")
        m.n_ropes = len(ropes)
        for r, (inv_freq, scale) in enumerate(ropes):
            if inv_freq.dtype != np.float32 or not inv_freq.flags.c_contiguous or inv_freq.shape != (m.n_rot // 2,):
                raise ValueError("a rotary table must hold n_rot / 2 float32 frequencies")
            m.ropes[r].inv_freq = _f32_ptr(inv_freq)
            m.ropes[r].scale = scale
            held.append(inv_freq)
        cdef const pl_slot *slot
        place = place or {}
        # (address of a pl_tensor named in place, its callable), in the order the forward reads
        # them: the layers', then the model's (the head)
        cdef list to_place = [], model_to_place = []
        for i in range(pl_model_slot_count()):
            slot = pl_model_slot(i)
            name = slot.name.decode()
            if name in slots:
                _fill_slot(<char *>m, slot, slots[name], held)
                if name in place:
                    model_to_place.append((<uintptr_t>(<char *>m + slot.offset), place[name]))
        m.layers = <pl_layer *>calloc(m.n_layers, sizeof(pl_layer))
        if m.layers == NULL:
            raise MemoryError()
        cdef pl_layer *L
        for l in range(m.n_layers):
            L = &m.layers[l]
            L.sliding_window, L.rope = layers[l]
            for i in range(pl_layer_slot_count()):
                slot = pl_layer_slot(i)
                name = f"layers.{l}.{slot.name.decode()}"
                if name in slots:
                    _fill_slot(<char *>L, slot, slots[name], held)
                    if name in place:
                        to_place.append((<uintptr_t>(<char *>L + slot.offset), place[name]))
        to_place += model_to_place
        self._check_vector_lengths(slots)
        # sgemm serves only a model whose every matrix is float: a quantized one never loads SciPy's
        # BLAS (~30 MB resident, a thread pool of its own). blas_controls() gives OpenBLAS's thread
        # controls, (set, get) addresses, asked for only then.
        use_blas = use_blas and not pl_model_quantized(m)
        m.sgemm = scipy_sgemm() if use_blas else NULL
        m.blas = _blas_controls(blas_controls() if use_blas and blas_controls is not None else (0, 0))
        cdef const char *err = pl_model_check(m)
        if err != NULL:
            raise ValueError(err.decode())
        self.pool = pl_pool_create(threads)
        if self.pool == NULL:
            raise MemoryError("could not start threads")
        self.n_threads = pl_pool_size(self.pool)
        places = self._reserve_weights([address for address, _ in to_place])
        for (address, release), at in zip(to_place, places):
            self._place(<pl_tensor *><uintptr_t>address, at, release)

    cdef list _reserve_weights(self, list addresses):
        """The places of the matrices' copies in the model's one block, in the order given
        (csrc/pyllm.h)."""
        cdef int n = len(addresses)
        cdef pl_tensor **ts = <pl_tensor **>malloc(max(1, n) * sizeof(pl_tensor *))
        cdef void **places = <void **>malloc(max(1, n) * sizeof(void *))
        if ts == NULL or places == NULL:
            free(ts)
            free(places)
            raise MemoryError()
        for i, address in enumerate(addresses):
            ts[i] = <pl_tensor *><uintptr_t>address
        cdef int rc = pl_model_reserve_weights(&self.m, ts, n, places)
        out = [<uintptr_t>places[i] for i in range(n)] if rc == 0 else []
        free(ts)
        free(places)
        if rc == 4:  # PL_ERR_NOMEM
            raise MemoryError("could not allocate the copies of the weights")
        if rc != 0:
            raise ValueError("a weight cannot be packed")
        return out

    cdef _place(self, pl_tensor *t, uintptr_t place, object release):
        """Fills t's place in the block (its packed copy, or its rows as stored, then its data
        pointed there) in pieces of about 4 MB of its bytes, each released (if asked) once copied:
        the source and the copy are never both resident whole."""
        cdef int64_t row_bytes = row_size(t.type, t.cols), total = t.rows * row_bytes
        cdef bint packed = pl_packed_type(t.type)
        cdef int64_t rows = PL_PACK_ROWS if packed else 1  # the rows one unit of a piece holds
        cdef int64_t units = (t.rows + rows - 1) // rows
        cdef int64_t step = max(1, (4 << 20) // (rows * row_bytes)), u0, u1, start, end
        for u0 in range(0, units, step):
            u1 = min(units, u0 + step)
            start, end = u0 * rows * row_bytes, min(u1 * rows * row_bytes, total)
            if packed:
                if pl_tensor_pack(t, self.pool, u0, u1) != 0:
                    raise ValueError("a weight cannot be packed")
            else:
                with nogil:
                    memcpy(<char *>place + start, <const char *>t.data + start, end - start)
            if release is not None:
                release(start, end - start)
        if not packed:
            t.data = <const void *>place

    def _check_vector_lengths(self, dict slots):
        """Norms and biases are read as far as the slot's size: shorter arrays never reach C."""
        sizes = {"one": 1, "dim": self.m.dim, "q": self.m.n_heads * self.m.head_dim,
                 "kv": self.m.n_kv_heads * self.m.head_dim, "ffn": self.m.ffn_dim,
                 "head": self.m.head_dim}
        table = {name: rows for name, kind, rows, _, _ in LAYER_SLOTS + MODEL_SLOTS if kind != "matrix"}
        for key, value in slots.items():
            base = key.rpartition(".")[2]
            if base not in table:
                continue
            arrays = value[:2] if isinstance(value, tuple) else (value,)
            for arr in arrays:
                if arr is not None and arr.shape[0] != sizes[table[base]]:
                    raise ValueError(f"{key} has {arr.shape[0]} values, expected {sizes[table[base]]}")

    @property
    def weights_block(self) -> tuple:
        """(address, bytes) of the one block that holds the copies of the matrices the forward
        multiplies by, (0, 0) where it keeps none (csrc/pyllm.h)."""
        return <uintptr_t>self.m.weights_block, self.m.weights_block_bytes

    @property
    def kv_dtype(self) -> str:
        return self._kv_dtype

    @kv_dtype.setter
    def kv_dtype(self, value):
        self._kv_dtype = self.check_kv_dtype(value)

    def check_kv_dtype(self, kv_dtype) -> str:
        """kv_dtype if this model's caches can hold it, else a ValueError that says why."""
        check_kv_dtype(kv_dtype)
        if not pl_kv_type_fits(&self.m, KV_DTYPES[kv_dtype]):
            raise ValueError(f"a {kv_dtype} KV cache needs a head_dim that is a multiple of 32 (at most 4096), "
                             f"not {self.m.head_dim}")
        return kv_dtype

    def __dealloc__(self):
        if self.pool != NULL:
            pl_pool_free(self.pool)
        pl_model_unpack(&self.m)
        free(self.m.layers)

    @property
    def vocab_size(self) -> int:
        return self.m.vocab_size


_MATRIX_SLOTS = {name for name, kind, *_ in LAYER_SLOTS + MODEL_SLOTS if kind == "matrix"}


def _is_matrix(key: str) -> bool:
    return key.rpartition(".")[2] in _MATRIX_SLOTS


KV_DTYPES = {"f32": 0, "f16": 1, "q8_0": 8}  # the cache's element type → its pl_type


def trim_heap() -> None:
    """Returns the C heap's free pages to the system (glibc; elsewhere nothing): what a loader's
    short-lived objects (a large vocabulary's merge list) leave behind once freed."""
    pl_trim_heap()


def vocab_splits(list tokens):
    """Every split of a token into two of tokens (csrc/vocab.c), by token, then cut: four int64
    arrays, the token, the cut (its left part's characters) and the tokens of the two parts (of
    equal tokens, the first)."""
    encoded = [t.encode("utf-8", "surrogatepass") for t in tokens]  # a str may hold a lone surrogate
    cdef bytes data = b"".join(encoded)
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    del encoded
    cdef const int64_t[::1] off = offsets
    cdef const char *base = data
    cdef pl_vocab_split_list found
    cdef int64_t n = len(tokens)
    cdef int rc
    with nogil:
        rc = pl_vocab_splits(base, &off[0], n, &found)
    if rc == 4:  # PL_ERR_NOMEM
        raise MemoryError("no memory to split the vocabulary's tokens")
    if rc != 0:
        raise ValueError("a vocabulary of over 2^31 tokens, or a token of over 2^31 bytes")
    out = np.empty((4, found.n), dtype=np.int64)
    cdef int64_t[:, ::1] o = out
    if found.n:
        memcpy(&o[0, 0], found.which, found.n * sizeof(int64_t))
        memcpy(&o[1, 0], found.cut, found.n * sizeof(int64_t))
        memcpy(&o[2, 0], found.left, found.n * sizeof(int64_t))
        memcpy(&o[3, 0], found.right, found.n * sizeof(int64_t))
    pl_vocab_split_list_free(&found)
    return tuple(out)


def gguf_strings(const unsigned char[::1] buf, Py_ssize_t pos, Py_ssize_t count, Py_ssize_t end):
    """GGUF's array of count strings from buf[pos] (each a little-endian u64 length, then that
    many bytes of UTF-8), none past end, for pyllm.formats.gguf (a vocabulary's 262k strings
    took 0.3 s in a Python loop). Returns (strings, the position after them, None, 0, ""), or
    where it fails (None, the byte of the failing string's length, the problem, its index, and
    for "utf-8" the decoder's reason; "truncated": no room for the length; "claims": n past end)."""
    cdef list out = [None] * count
    cdef Py_ssize_t i, at
    cdef unsigned long long n
    cdef int b
    if pos < 0 or end > buf.shape[0] or pos > end:
        raise ValueError(f"bytes [{pos}, {end}) are not inside a buffer of {buf.shape[0]}")
    for i in range(count):
        at = pos
        if end - pos < 8:
            return None, at, "truncated", i, ""
        n = 0
        for b in range(8):
            n |= (<unsigned long long>buf[pos + b]) << (8 * b)
        pos += 8
        if n > <unsigned long long>(end - pos):
            return None, at, "claims", i, str(n)
        if n == 0:
            out[i] = ""
            continue
        try:
            out[i] = PyUnicode_DecodeUTF8(<const char *>&buf[pos], <Py_ssize_t>n, NULL)
        except UnicodeDecodeError as e:
            return None, at, "utf-8", i, e.reason
        pos += <Py_ssize_t>n
    return out, pos, None, 0, ""


def check_kv_dtype(kv_dtype) -> str:
    """kv_dtype if it names a cache type pyllm has, else a ValueError naming kv_dtype."""
    if not isinstance(kv_dtype, str) or kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {', '.join(map(repr, KV_DTYPES))}, not {kv_dtype!r}")
    return kv_dtype


cdef class CoreSequence:
    """A KV cache and the buffers for one sequence of up to n_ctx tokens; kv_dtype is the cache's
    element type ("f32", "f16" at half the bytes, "q8_0" at 34 bytes per 32 values), by default the
    model's."""
    cdef pl_state *s
    cdef CoreModel model
    cdef readonly int n_ctx, n_batch
    cdef readonly str kv_dtype
    cdef readonly long long tokens_processed  # every token ever fed through forward

    def __cinit__(self, CoreModel model, int n_ctx, int n_batch=512, kv_dtype=None):
        self.model = model
        self.kv_dtype = model.kv_dtype if kv_dtype is None else model.check_kv_dtype(kv_dtype)
        self.s = pl_state_create(&model.m, n_ctx, n_batch, model.n_threads, KV_DTYPES[self.kv_dtype])
        if self.s == NULL:
            raise MemoryError(f"could not allocate a sequence of {n_ctx} tokens")
        self.n_ctx = n_ctx
        self.n_batch = min(n_batch, n_ctx)

    @property
    def cache_bytes(self) -> int:
        """Bytes of the K and V caches together."""
        return pl_state_cache_bytes(self.s)

    def __dealloc__(self):
        if self.s != NULL:
            pl_state_free(self.s)

    @property
    def pos(self) -> int:
        return pl_state_pos(self.s)

    def truncate(self, int pos):
        """Forgets every cached position from pos on."""
        cdef int rc
        with _forward_lock:
            rc = pl_state_truncate(self.s, pos)
        if rc != 0:
            raise ValueError(f"cannot truncate to {pos}: the cache holds {pl_state_pos(self.s)} tokens")

    def forward(self, tokens, bint all_logits=False):
        """Appends tokens; returns float32 logits (n, vocab) if all_logits else (vocab,)."""
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        cdef const int32_t[::1] tv = arr
        cdef int n = tv.shape[0]
        if n == 0:
            raise ValueError("no tokens to process")
        cdef int vocab = self.model.m.vocab_size
        out = np.empty([n, vocab] if all_logits else [vocab], dtype=np.float32)
        cdef float[::1] ov = out.reshape(-1)
        cdef int rc
        with _forward_lock:
            with nogil:
                rc = pl_forward(&self.model.m, self.s, self.model.pool, &tv[0], n, &ov[0], all_logits)
        self._check_status(rc, n)
        return out

    def forward_batch(self, list seqs, tokens):
        """One decode step of every sequence in seqs (CoreSequences of this model, each its own),
        tokens[b] appended to seqs[b]; this sequence lends its buffers (n_batch >= len(seqs)) and
        is not advanced. Returns float32 logits (len(seqs), vocab), row b equal to what
        seqs[b].forward([tokens[b]]) would give."""
        cdef int n = len(seqs)
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        if n == 0 or arr.shape != (n,):
            raise ValueError("one token per sequence, and at least one sequence")
        if n > self.n_batch:
            raise ValueError(f"{n} sequences in one step: this buffer holds {self.n_batch}")
        cdef const int32_t[::1] tv = arr
        cdef CoreSequence seq
        cdef pl_state **states = <pl_state **>malloc(n * sizeof(pl_state *))
        if states == NULL:
            raise MemoryError()
        try:
            for b in range(n):
                seq = seqs[b]
                if seq.model is not self.model:
                    raise ValueError("every sequence must belong to this model")
                states[b] = seq.s
            out = np.empty((n, self.model.m.vocab_size), dtype=np.float32)
            rc = self._batch_step(states, n, &tv[0], out)
        finally:
            free(states)
        if rc == 1:
            raise ValueError(f"a token id is outside [0, {self.model.m.vocab_size})")
        if rc == 2:
            raise OverflowError("a sequence's context is full")
        if rc != 0:
            raise ValueError("the sequences must be distinct, of this model, and fit this buffer's context")
        for b in range(n):
            seq = seqs[b]
            seq.tokens_processed += 1
        return out

    cdef int _batch_step(self, pl_state **states, int n, const int32_t *tokens, object out):
        cdef float[:, ::1] ov = out
        cdef int rc
        with _forward_lock:
            with nogil:
                rc = pl_forward_batch(&self.model.m, self.s, states, n, self.model.pool, tokens, &ov[0, 0])
        return rc

    def head(self, const float[:, ::1] x):
        """Logits (n, vocab) of residual rows x (n, dim) through the final norm and the head, in
        batches of the sequence's n_batch rows; the cache is left as it is."""
        if x.shape[1] != self.model.m.dim:
            raise ValueError(f"rows must have the model's width {self.model.m.dim}")
        cdef int n = x.shape[0]
        out = np.empty((n, self.model.m.vocab_size), dtype=np.float32)
        cdef float[:, ::1] ov = out
        cdef int done, chunk, rc = 0
        with _forward_lock:
            with nogil:
                done = 0
                while done < n and rc == 0:
                    chunk = min(n - done, self.n_batch)
                    rc = pl_head(&self.model.m, self.s, self.model.pool, &x[done, 0], chunk, &ov[done, 0])
                    done += chunk
        if rc != 0:
            raise RuntimeError(f"head failed with status {rc}")
        return out

    def _check_status(self, int rc, int n):
        if rc == 1:
            raise ValueError(f"a token id is outside [0, {self.model.m.vocab_size})")
        if rc == 2:
            raise OverflowError(
                f"{n} tokens do not fit: {pl_state_pos(self.s)} of {self.n_ctx} positions are used")
        if rc != 0:
            raise RuntimeError(f"forward failed with status {rc}")
        self.tokens_processed += n

    def forward_traced(self, tokens, dict wanted, bint logits=True):
        """Appends tokens as forward(all_logits=True) does, copying out intermediates on the way.

        wanted: "embed" and "out_norm" -> True; a TRACE_POINTS name -> the layers to trace. Returns
        (logits (n, vocab), {name: array}): embed and out_norm (n, dim); a layer point
        (len(layers), n, width), the layers in the order given, with probs (len(layers), n_heads,
        n, pos + n) over every cached key. logits=False (out_norm wanted) skips the head: None.
        """
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        cdef const int32_t[::1] tv = arr
        cdef int n = tv.shape[0]
        if n == 0:
            raise ValueError("no tokens to process")
        m = &self.model.m
        cdef pl_trace tr
        tr.pos0 = pl_state_pos(self.s)
        tr.n_rows, tr.n_keys = n, tr.pos0 + n
        widths = {"q": m.n_heads * m.head_dim, "k": m.n_kv_heads * m.head_dim,
                  "v": m.n_kv_heads * m.head_dim}
        out = {}
        for name in ("embed", "out_norm"):
            if wanted.get(name):
                out[name] = np.zeros((n, m.dim), dtype=np.float32)
        tr.embed = <float *><uintptr_t>out["embed"].ctypes.data if "embed" in out else NULL
        tr.out_norm = <float *><uintptr_t>out["out_norm"].ctypes.data if "out_norm" in out else NULL
        table = np.zeros(m.n_layers * PL_TRACE_POINTS, dtype=np.uintp)
        for point, layers in wanted.items():
            if point in ("embed", "out_norm"):
                continue
            index = TRACE_POINTS.index(point)
            layers = list(layers)
            if any(not 0 <= l < m.n_layers for l in layers) or len(set(layers)) != len(layers):
                raise ValueError(f"layers to trace must be distinct, in [0, {m.n_layers})")
            if point == "probs":
                buf = np.zeros((len(layers), m.n_heads, n, tr.n_keys), dtype=np.float32)
            else:
                buf = np.zeros((len(layers), n, widths.get(point, m.dim)), dtype=np.float32)
            out[point] = buf
            for i, l in enumerate(layers):
                table[l * PL_TRACE_POINTS + index] = buf[i].ctypes.data
        tr.layers = <float **><uintptr_t>table.ctypes.data if table.any() else NULL
        if not logits and "out_norm" not in out:
            raise ValueError("a forward without logits must trace out_norm")
        result = np.empty((n, m.vocab_size), dtype=np.float32) if logits else None
        cdef float *lp = <float *><uintptr_t>result.ctypes.data if logits else NULL
        cdef int rc
        with _forward_lock:
            with nogil:
                rc = pl_forward_traced(m, self.s, self.model.pool, &tv[0], n, lp, 1, &tr)
        self._check_status(rc, n)
        return result, out


# ---------------------------------------------------------------- ops, for tests against numpy

cdef extern from "kernels.h" nogil:
    void pl_norm_apply(float *out, const float *x, const pl_norm *norm, int n, float eps)
    void pl_rope(float *x, int n_heads, int head_dim, int n_rot, const float *cos, const float *sin,
                 int interleaved)
    void pl_softcap(float *x, int64_t n, float cap)
    ctypedef struct pl_probs_out:
        float *data
        int row0, n_rows, n_keys
    ctypedef struct pl_kv_view:
        const void *k
        const void *v
        int type
        int64_t ld, head_stride
    void pl_attention(const pl_model *m, const float *q, const pl_kv_view *kv, int pos0, int n, int window,
                      float *out, float *scores, int64_t n_scores, const pl_probs_out *probs, int ith, int nth)
    int64_t pl_attention_scores_floats(const pl_model *m, int n_ctx, int sgemm)
    void pl_attention_per_query(const pl_model *m, const float *q, const pl_kv_view *kv, int pos0, int n,
                                int window, float *out, float *scores, const pl_probs_out *probs, int ith, int nth)
    void pl_attention_decode(const pl_model *m, const float *q, const pl_kv_view *kv, int pos, int window,
                             float *out, float *scores, const pl_probs_out *probs, pl_pool *pool, int ith, int nth)
    void pl_attention_blas(const pl_model *m, const float *q, const pl_kv_view *kv, int pos0, int n, int window,
                           float *out, float *scores, float *kv_wide, pl_sgemm_fn sgemm, const pl_probs_out *probs,
                           int ith, int nth)
    enum: PL_ATTN_QBLOCK
    ctypedef struct pl_attn_row:
        const float *q
        float *out
        pl_kv_view kv
        int pos
    ctypedef void (*pl_attn_row_fn)(const void *ctx, int t, pl_attn_row *row) noexcept nogil
    void pl_attention_rows(const pl_model *m, pl_attn_row_fn row_of, const void *ctx, int n, int window,
                           float *scores, int64_t n_scores, int ith, int nth)


def norm(const float[::1] x, const float[::1] w, b=None, str kind="rms", float eps=1e-6):
    """The engine's RMSNorm or LayerNorm of one row."""
    if w.shape[0] != x.shape[0] or x.shape[0] == 0:
        raise ValueError("x and w must have the same, non-zero length")
    cdef const float[::1] bv
    cdef pl_norm nrm
    nrm.w = &w[0]
    nrm.b = NULL
    nrm.kind = NORM_KINDS[kind]
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
