# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Bindings of the C core (csrc/): the model struct, sequences, and kernel entry points for tests.

Everything that reaches C here has been validated by the Python layer (formats/, arch/): addresses
point inside live mmaps or numpy arrays that the objects below keep referenced.
"""
from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

import threading

import numpy as np

from scipy.linalg.cython_blas cimport sgemm as scipy_sgemm

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
    pl_vec_kernels pl_vec
    const pl_type_traits *pl_traits(int type)
    int64_t pl_row_size(int type, int64_t n)

    int pl_cpu_best_isa()
    int pl_set_isa(int isa)
    int pl_current_isa()
    const char *pl_isa_name(int isa)

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
    ctypedef struct pl_layer:
        const float *attn_norm
        pl_tensor wq, wk, wv
        const float *bq
        const float *bk
        const float *bv
        pl_tensor wo
        const float *ffn_norm
        pl_tensor w_gate, w_up, w_down
        int sliding_window
    ctypedef struct pl_model:
        int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size
        float norm_eps, attn_scale, embed_scale
        int activation, rope_interleaved
        const float *rope_inv_freq
        pl_tensor tok_embd
        const float *out_norm
        pl_tensor lm_head
        pl_layer *layers
        pl_sgemm_fn sgemm
        pl_blas_threads blas
    const char *pl_model_check(const pl_model *m)
    int pl_convert_tensor(pl_pool *pool, const pl_tensor *src, int dst_type, void *dst)

    ctypedef struct pl_state:
        pass
    pl_state *pl_state_create(const pl_model *m, int n_ctx, int n_batch, int n_threads)
    void pl_state_free(pl_state *s)
    int pl_state_pos(const pl_state *s)
    int pl_state_n_ctx(const pl_state *s)
    int pl_state_truncate(pl_state *s, int pos)
    int pl_forward(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
                   float *logits, int all_logits)

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

# From this many tokens on, a forward pass multiplies with sgemm on float32 activations.
BLAS_MIN_TOKENS = PL_BLAS_MIN_TOKENS

ISA_NAMES = {0: "scalar", 1: "avx2", 2: "avx512", 3: "neon"}
_ISA_IDS = {v: k for k, v in ISA_NAMES.items()}

pl_set_isa(pl_cpu_best_isa())


def best_isa() -> str:
    """The fastest kernel set this CPU and OS support."""
    return ISA_NAMES[pl_cpu_best_isa()]


def current_isa() -> str:
    return ISA_NAMES[pl_current_isa()]


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


def softmax(const float[::1] x):
    """The engine's softmax of a float32 vector (for tests of each ISA's kernel)."""
    out = np.array(x, dtype=np.float32)
    cdef float[::1] o = out
    if o.shape[0]:
        pl_vec.softmax(&o[0], <int>o.shape[0])
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
           int threads=1, bint blas=True, int64_t tile_floats=1 << 18, tuple blas_controls=(0, 0)):
    """y (n, rows) = x (n, cols) · Wᵀ through the engine's matmul (for tests of every path:
    vec_dot, sgemm from thread 0, and per-thread sgemm when blas_controls are given)."""
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
    cdef pl_matmul_scratch sc
    sc.xq_region = pl_matmul_xq_bytes(wtype, cols, n)
    xq = np.empty(3 * sc.xq_region + 64, dtype=np.uint8)
    cdef unsigned char[::1] xqv = xq
    sc.xq = &xqv[0]
    sc.tile_floats = max(tile_floats, cols)
    tile = np.empty(sc.tile_floats * threads, dtype=np.float32)
    cdef float[::1] tv = tile
    sc.wtile = &tv[0]
    sc.sgemm = <pl_sgemm_fn>scipy_sgemm if blas else NULL
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


cdef inline const float *_f32_ptr(object arr):
    return <const float *><uintptr_t>arr.ctypes.data if arr is not None else NULL


cdef pl_tensor _tensor(tuple spec):
    cdef pl_tensor t
    t.type, t.rows, t.cols = spec[0], spec[1], spec[2]
    t.data = <const void *><uintptr_t>spec[3]
    return t


# One forward at a time in the process: a thread pool runs one job at a time, a sequence's cache is
# written in place, and the BLAS thread count that prefill lowers and restores is process-wide.
# Python threads sharing a model queue here (the wait releases the GIL) instead of racing in C.
_forward_lock = threading.Lock()


cdef class CoreModel:
    """The C model struct over weights in place, and the thread pool that runs it.

    hparams: ints/floats named as pl_model's fields; tensors: name -> (type, rows, cols, address)
    for tok_embd, lm_head and layers.{i}.{wq,wk,wv,wo,w_gate,w_up,w_down}; vectors: name -> float32
    C-contiguous numpy array for rope_inv_freq, out_norm, layers.{i}.{attn_norm,ffn_norm,bq,bk,bv}.
    keep: objects (mmaps, arrays) that own the memory the addresses point into.
    """
    cdef pl_model m
    cdef pl_pool *pool
    cdef object keep
    cdef readonly int n_threads
    cdef readonly tuple weight_types  # the types of every matrix, as bound

    def __cinit__(self, dict hparams, dict tensors, dict vectors, list sliding_windows, object keep,
                  int threads, bint use_blas=True, tuple blas_controls=(0, 0)):
        self.keep = (keep, vectors)
        self.weight_types = tuple(sorted({int(spec[0]) for spec in tensors.values()}))
        for name, arr in vectors.items():
            if arr is not None and (arr.dtype != np.float32 or not arr.flags.c_contiguous):
                raise ValueError(f"{name} must be a C-contiguous float32 array")
        m = &self.m
        m.n_layers = hparams["n_layers"]
        m.dim = hparams["dim"]
        m.n_heads = hparams["n_heads"]
        m.n_kv_heads = hparams["n_kv_heads"]
        m.head_dim = hparams["head_dim"]
        m.ffn_dim = hparams["ffn_dim"]
        m.vocab_size = hparams["vocab_size"]
        m.norm_eps = hparams["norm_eps"]
        m.attn_scale = hparams["attn_scale"]
        m.embed_scale = hparams["embed_scale"]
        m.activation = hparams["activation"]
        m.rope_interleaved = hparams["rope_interleaved"]
        if len(sliding_windows) != m.n_layers:
            raise ValueError("one sliding window per layer")
        if vectors["rope_inv_freq"].shape[0] != m.head_dim // 2:
            raise ValueError("rope_inv_freq must hold head_dim / 2 frequencies")
        for name, arr in vectors.items():
            if arr is not None and name.endswith("norm") and arr.shape[0] != m.dim:
                raise ValueError(f"{name} has {arr.shape[0]} values, expected {m.dim}")
        m.rope_inv_freq = _f32_ptr(vectors["rope_inv_freq"])
        m.out_norm = _f32_ptr(vectors["out_norm"])
        m.tok_embd = _tensor(tensors["tok_embd"])
        m.lm_head = _tensor(tensors["lm_head"])
        m.layers = <pl_layer *>calloc(m.n_layers, sizeof(pl_layer))
        if m.layers == NULL:
            raise MemoryError()
        cdef pl_layer *L
        for i in range(m.n_layers):
            L = &m.layers[i]
            p = f"layers.{i}."
            L.attn_norm = _f32_ptr(vectors[p + "attn_norm"])
            L.ffn_norm = _f32_ptr(vectors[p + "ffn_norm"])
            L.bq = _f32_ptr(vectors.get(p + "bq"))
            L.bk = _f32_ptr(vectors.get(p + "bk"))
            L.bv = _f32_ptr(vectors.get(p + "bv"))
            L.wq = _tensor(tensors[p + "wq"])
            L.wk = _tensor(tensors[p + "wk"])
            L.wv = _tensor(tensors[p + "wv"])
            L.wo = _tensor(tensors[p + "wo"])
            L.w_gate = _tensor(tensors[p + "w_gate"])
            L.w_up = _tensor(tensors[p + "w_up"])
            L.w_down = _tensor(tensors[p + "w_down"])
            L.sliding_window = sliding_windows[i] or 0
        m.sgemm = <pl_sgemm_fn>scipy_sgemm if use_blas else NULL
        m.blas = _blas_controls(blas_controls)
        cdef const char *err = pl_model_check(m)
        if err != NULL:
            raise ValueError(err.decode())
        self.pool = pl_pool_create(threads)
        if self.pool == NULL:
            raise MemoryError("could not start threads")
        self.n_threads = pl_pool_size(self.pool)

    def __dealloc__(self):
        if self.pool != NULL:
            pl_pool_free(self.pool)
        free(self.m.layers)

    @property
    def vocab_size(self) -> int:
        return self.m.vocab_size


cdef class CoreSequence:
    """A KV cache and the buffers for one sequence of up to n_ctx tokens."""
    cdef pl_state *s
    cdef CoreModel model
    cdef readonly int n_ctx, n_batch
    cdef readonly long long tokens_processed  # every token ever fed through forward

    def __cinit__(self, CoreModel model, int n_ctx, int n_batch=512):
        self.model = model
        self.s = pl_state_create(&model.m, n_ctx, n_batch, model.n_threads)
        if self.s == NULL:
            raise MemoryError(f"could not allocate a sequence of {n_ctx} tokens")
        self.n_ctx = n_ctx
        self.n_batch = min(n_batch, n_ctx)

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
        if rc == 1:
            raise ValueError(f"a token id is outside [0, {vocab})")
        if rc == 2:
            raise OverflowError(
                f"{n} tokens do not fit: {pl_state_pos(self.s)} of {self.n_ctx} positions are used")
        if rc != 0:
            raise RuntimeError(f"forward failed with status {rc}")
        self.tokens_processed += n
        return out
