# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The runtime's binding of the C core (csrc/): the model struct over a ModelSpec and its weights,
sequences, the kernels installed (the ISA), and the names of the core's enums and tables.

Everything that reaches C here has been validated by the Python layer (formats/, arch/): addresses
point inside live mmaps or numpy arrays that the objects below keep referenced. The kernels on
their own are pyllm._kernels (for tests), the loaders' string work pyllm._strings.
"""
from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.math cimport INFINITY
from libc.string cimport memcpy

import threading
import time

import numpy as np

from pyllm.threads import DecodeThreads

from pyllm._csrc cimport *

# From this many tokens on, a forward pass multiplies with sgemm on float32 activations.
BLAS_MIN_TOKENS = PL_BLAS_MIN_TOKENS

# The names of csrc/pyllm.h's enums, by value.
ISA_NAMES = {isa: pl_isa_name(isa).decode() for isa in range(PL_ISA_COUNT)}
_ISA_IDS = {v: k for k, v in ISA_NAMES.items()}
SLOT_KINDS = enum_names(pl_slot_kind_name)
SLOT_DIMS = enum_names(pl_dim_name)
NORM_KINDS = enum_names(pl_norm_kind_name)
ACTIVATIONS = enum_names(pl_activation_name)
TRACE_POINTS = enum_names(pl_trace_point_name)  # a layer's traceable points


cdef dict _type_layouts():
    cdef int64_t block, size
    cdef const char *name
    out = {}
    for wtype in range(PL_TYPE_COUNT):
        name = pl_type_layout(wtype, &block, &size)
        if name != NULL:
            out[wtype] = (name.decode(), block, size)
    return out


# type number -> (name, elements per block, bytes per block): every type a file may hold, as
# csrc/dtypes.c lays them out (pyllm/dtypes.py makes WeightType of it).
TYPE_LAYOUTS = _type_layouts()
# the cache's element type -> its type number
KV_DTYPES = {TYPE_LAYOUTS[t][0]: t for t in (PL_TYPE_F32, PL_TYPE_F16, PL_TYPE_Q8_0)}

pl_set_isa(pl_cpu_best_isa())
# install(isa) of each module that links its own copy of the core (pyllm._kernels), called by set_isa
_followers = []


def follow_isa(install) -> int:
    """Has set_isa call install(isa number) from now on; returns the number of the ISA installed now.
    For a module that links its own copy of the C core and must run the kernels this one runs."""
    _followers.append(install)
    return pl_current_isa()


def best_isa() -> str:
    """The fastest kernel set this CPU and OS support."""
    return ISA_NAMES[pl_cpu_best_isa()]


def current_isa() -> str:
    return ISA_NAMES[pl_current_isa()]


def set_isa(name: str) -> str:
    """Installs the kernels of an ISA ("best" for the fastest), here and in every follower; returns
    what was installed. Only call it while no forward pass runs."""
    if name != "best" and name not in _ISA_IDS:
        raise ValueError(f"unknown ISA {name!r}; expected one of {sorted(_ISA_IDS)} or 'best'")
    cdef int isa = pl_set_isa(pl_cpu_best_isa() if name == "best" else _ISA_IDS[name])
    for install in _followers:
        install(isa)
    return ISA_NAMES[isa]


def supports(int wtype) -> bool:
    """Whether the core can multiply by weights of this type."""
    cdef const pl_type_traits *t = pl_traits(wtype)
    return t != NULL and t.vec_dot != NULL


def vec_dot_type(int wtype) -> int:
    return traits_of(wtype).vec_dot_type


def block_size(int wtype) -> int:
    """Elements per block of a type (1 for f32/f16/bf16)."""
    return traits_of(wtype).block_size


def row_size(int wtype, int64_t n) -> int:
    return checked_row_size(wtype, n)


def to_f32(int wtype, const unsigned char[::1] data, int64_t n):
    """Dequantizes / widens n elements stored as wtype."""
    cdef const pl_type_traits *t = traits_of(wtype)
    if data.shape[0] < checked_row_size(wtype, n):
        raise ValueError("buffer shorter than n elements")
    out = np.empty(n, dtype=np.float32)
    cdef float[::1] o = out
    if n:
        t.to_f32(&data[0], &o[0], n)
    return out


def convert_tensor(int src_type, const unsigned char[::1] data, int64_t rows, int64_t cols,
                   int dst_type, int threads=1):
    """Re-encodes a (rows, cols) matrix stored as src_type into dst_type, in parallel; returns the
    bytes (quantize-on-load)."""
    traits_of(src_type)
    traits_of(dst_type)
    if data.shape[0] < rows * checked_row_size(src_type, cols):
        raise ValueError("buffer shorter than the matrix")
    out = np.empty(rows * checked_row_size(dst_type, cols), dtype=np.uint8)
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


cdef inline const float *_f32_ptr(object arr):
    return <const float *><uintptr_t>arr.ctypes.data if arr is not None else NULL


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
    if slot.kind == PL_SLOT_MATRIX:
        t = <pl_tensor *>field
        t.type, t.rows, t.cols = value[0], value[1], value[2]
        t.data = <const void *><uintptr_t>value[3]
    elif slot.kind == PL_SLOT_NORM:
        w, b, kind = value
        for arr in (w, b):
            if arr is not None and (arr.dtype != np.float32 or not arr.flags.c_contiguous or arr.ndim != 1):
                raise ValueError(f"{slot.name.decode()} must be C-contiguous float32 vectors")
        nrm = <pl_norm *>field
        nrm.w, nrm.b, nrm.kind = _f32_ptr(w), _f32_ptr(b), NORM_KINDS.index(kind)
        keep.append((w, b))
    else:
        if value.dtype != np.float32 or not value.flags.c_contiguous or value.ndim != 1:
            raise ValueError(f"{slot.name.decode()} must be a C-contiguous float32 vector")
        (<const float **>field)[0] = _f32_ptr(value)
        keep.append(value)
    return 0


cdef int _fill_hparams(pl_model *m, spec) except -1:
    """Every hyper-parameter of csrc/pyllm.h's list from spec's field of the same name (a ModelSpec,
    which has validated them); an enum's by its name."""
    cdef const pl_hparam *h
    cdef char *field
    for i in range(pl_hparam_count()):
        h = pl_hparam_at(i)
        name = h.name.decode()
        value = getattr(spec, name)
        if h.names != NULL:
            value = enum_names(h.names).index(value)
        field = <char *>m + h.offset
        if h.type == PL_HPARAM_FLOAT:
            (<float *>field)[0] = value
        elif isinstance(value, int):  # a bool too
            (<int *>field)[0] = value
        else:
            raise ValueError(f"{name} must be an int, not {value!r}")
    return 0


# One forward at a time in the process: a thread pool runs one job at a time, a sequence's cache is
# written in place, and the BLAS thread count that prefill lowers and restores is process-wide.
# Python threads sharing a model queue here (the wait releases the GIL) instead of racing in C.
_forward_lock = threading.Lock()


cdef class CoreModel:
    """The C model struct over weights in place, and the thread pool that runs it.

    spec: a ModelSpec (pyllm/arch/spec.py): the hyper-parameters, the rotary tables and each layer's
    sliding window and table. slots: "tok_embd", "out_norm", ... and "layers.{i}.wq", ... -> a value
    for _fill_slot; a slot left out is absent. kv_dtype: the cache type of the sequences made for
    this model unless they name one (KV_DTYPES). keep: objects (mmaps, arrays) that own the memory the
    matrix addresses point into. place: matrix slot -> None or release(start, nbytes): the matrices
    the model copies into its one block of weights (csrc/pyllm.h), packed where the type has a
    packed kernel (csrc/packed.h), and release is called for each piece of the source's bytes once
    copied.
    """
    cdef pl_model m
    cdef pl_pool *pool
    cdef bint borrowed_pool  # another model's pool (share_pool), freed by that model
    cdef object keep
    cdef readonly int n_threads
    cdef readonly object decode_threads  # a DecodeThreads: the threads of its decode calls
    cdef bint measures_decode  # its one-row calls time decode_threads (not when it follows another model's)
    cdef readonly tuple weight_types  # the types of every matrix, as bound
    cdef readonly frozenset slot_names  # the slots present in some layer or the model ("bq", "pos_embd", ...)
    cdef readonly str kv_dtype  # the cache type of its sequences unless they name one

    def __cinit__(self, spec, dict slots, object keep, int threads, kv_dtype="f32", bint use_blas=True,
                  object blas_controls=None, dict place=None):
        cdef list held = []
        self.keep = (keep, held)
        self.weight_types = tuple(sorted({int(v[0]) for k, v in slots.items() if is_matrix(k)}))
        self.slot_names = frozenset(k.rpartition(".")[2] for k in slots)
        m = &self.m
        _fill_hparams(m, spec)
        layers = list(zip(spec.sliding_windows, spec.layer_ropes))
        if len(layers) != m.n_layers:
            raise ValueError("one (sliding_window, rope) per layer")
        if len(spec.ropes) > PL_MAX_ROPES:
            raise ValueError(f"at most {PL_MAX_ROPES} rotary tables")
        m.n_ropes = len(spec.ropes)
        for r, rope in enumerate(spec.ropes):
            inv_freq = np.ascontiguousarray(rope.inv_freq, dtype=np.float32)
            if inv_freq.shape != (m.n_rot // 2,):
                raise ValueError("a rotary table must hold n_rot / 2 frequencies")
            m.ropes[r].inv_freq = _f32_ptr(inv_freq)
            m.ropes[r].scale = rope.scale
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
        m.blas = blas_threads_of(blas_controls() if use_blas and blas_controls is not None else (0, 0))
        cdef const char *err = pl_model_check(m)
        if err != NULL:
            raise ValueError(err.decode())
        self.kv_dtype = self.check_kv_dtype(kv_dtype)
        self.pool = pl_pool_create(threads)
        if self.pool == NULL:
            raise MemoryError("could not start threads")
        self.n_threads = pl_pool_size(self.pool)
        self.decode_threads = DecodeThreads(self.n_threads)
        self.measures_decode = True
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
        if rc == PL_ERR_NOMEM:
            raise MemoryError("could not allocate the copies of the weights")
        if rc != 0:
            raise ValueError("a weight cannot be packed")
        return out

    cdef _place(self, pl_tensor *t, uintptr_t place, object release):
        """Fills t's place in the block (its packed copy, or its rows as stored, then its data
        pointed there) in pieces of about 4 MB of its bytes, each released (if asked) once copied:
        the source and the copy are never both resident whole."""
        cdef int64_t row_bytes = checked_row_size(t.type, t.cols), total = t.rows * row_bytes
        cdef bint packed = pl_packed_type(t.type)
        cdef int64_t rows = PL_PACK_ROWS if packed else 1  # the rows one unit of a piece holds
        cdef int64_t units = (t.rows + rows - 1) // rows
        cdef int64_t step = max(1, (4 << 20) // (rows * row_bytes)), u0, u1, start, end
        cdef int rc
        for u0 in range(0, units, step):
            u1 = min(units, u0 + step)
            start, end = u0 * rows * row_bytes, min(u1 * rows * row_bytes, total)
            if packed:
                with nogil:
                    rc = pl_tensor_pack(t, self.pool, u0, u1)
                if rc != 0:
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

    def check_kv_dtype(self, kv_dtype) -> str:
        """kv_dtype if this model's caches can hold it, else a ValueError that says why."""
        return check_kv_dtype(kv_dtype, self.m.head_dim)

    def _decode_step(self, int rows, bint timed=True):
        """Sets the pool's decode threads to this model's (a shared pool serves two models) before a
        forward call of rows: (the DecodeThreads to tell the call's time, the count, the start)
        while it measures a one-row call, else (None, count, 0). Under _forward_lock."""
        threads = self.decode_threads.next(rows)
        pl_pool_set_decode_threads(self.pool, threads)
        if rows != 1 or not timed or not self.measures_decode or self.decode_threads.chosen is not None:
            return None, threads, 0.0
        return self.decode_threads, threads, time.perf_counter()

    def share_pool(self, CoreModel other):
        """Runs this model on other's thread pool from now on (a draft model beside its target: one
        set of workers, none spinning while the other model runs), its decode calls on other's
        decode threads (a draft's steps, timed among the target's, would confuse the measure). Both
        must have the same thread count, which sized this model's sequences' buffers; other is kept
        alive with this one."""
        if other.n_threads != self.n_threads:
            raise ValueError(f"a shared pool needs the same thread count: {self.n_threads} here, {other.n_threads} there")
        if other is self or self.pool == other.pool:
            return
        with _forward_lock:
            if not self.borrowed_pool:
                pl_pool_free(self.pool)
            self.pool = other.pool
            self.borrowed_pool = True
            self.decode_threads, self.measures_decode = other.decode_threads, False
            self.keep = (self.keep, other)

    def __dealloc__(self):
        if self.pool != NULL and not self.borrowed_pool:
            pl_pool_free(self.pool)
        pl_model_unpack(&self.m)
        free(self.m.layers)

    @property
    def vocab_size(self) -> int:
        return self.m.vocab_size


_MATRIX_SLOTS = {name for name, kind, *_ in LAYER_SLOTS + MODEL_SLOTS if kind == "matrix"}


def is_matrix(key: str) -> bool:
    """Whether a slot key ("lm_head", "layers.3.wq", ...) names a matrix."""
    return key.rpartition(".")[2] in _MATRIX_SLOTS


def masked_logits(const float[::1] logits, const int32_t[::1] bits, float[::1] out) -> None:
    """out[i] = logits[i] where bit i of bits (little-endian words, as llguidance's masks) is set, else
    -inf: a constrained step's logits. A word at a time: most are all clear or all set."""
    cdef Py_ssize_t n = logits.shape[0], w, i, end
    cdef unsigned int word
    if bits.shape[0] * 32 < n or out.shape[0] != n:
        raise ValueError("the mask or the output is not as long as the logits")
    with nogil:
        for w in range((n + 31) // 32):
            word, end = <unsigned int>bits[w], min(32 * w + 32, n)
            if word == 0:
                for i in range(32 * w, end):
                    out[i] = -INFINITY
            elif word == <unsigned int>0xFFFFFFFF:
                memcpy(&out[32 * w], &logits[32 * w], (end - 32 * w) * sizeof(float))
            else:
                for i in range(32 * w, end):
                    out[i] = logits[i] if (word >> (i - 32 * w)) & 1 else -INFINITY


def trim_heap() -> None:
    """Returns the C heap's free pages to the system (glibc; elsewhere nothing): what a loader's
    short-lived objects (a large vocabulary's merge list) leave behind once freed."""
    pl_trim_heap()


def check_kv_dtype(kv_dtype, head_dim=None) -> str:
    """kv_dtype if it names a cache type pyllm has (and the caches of a model of head_dim can hold it,
    where head_dim is given), else a ValueError that says why."""
    if not isinstance(kv_dtype, str) or kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {', '.join(map(repr, KV_DTYPES))}, not {kv_dtype!r}")
    cdef pl_model m
    if head_dim is not None:
        m.head_dim = head_dim
        if not pl_kv_type_fits(&m, KV_DTYPES[kv_dtype]):
            raise ValueError(f"a {kv_dtype} KV cache needs a head_dim that is a multiple of 32 (at most 4096), "
                             f"not {head_dim}")
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

    def forward(self, tokens, bint all_logits=False, int n_layers=0):
        """Appends tokens; returns float32 logits (n, vocab) if all_logits else (vocab,). n_layers
        (in [1, the model's]) runs the first layers only, then the final norm and head: a
        self-draft's early exit, whose positions hold keys and values in those layers alone."""
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        cdef const int32_t[::1] tv = arr
        cdef int n = tv.shape[0]
        if n == 0:
            raise ValueError("no tokens to process")
        if n_layers == 0:
            n_layers = self.model.m.n_layers
        if not 1 <= n_layers <= self.model.m.n_layers:
            raise ValueError(f"n_layers must be in [1, {self.model.m.n_layers}], got {n_layers}")
        cdef int vocab = self.model.m.vocab_size
        out = np.empty([n, vocab] if all_logits else [vocab], dtype=np.float32)
        cdef float[::1] ov = out.reshape(-1)
        cdef int rc
        with _forward_lock:
            tuner, threads, start = self.model._decode_step(n)
            with nogil:
                rc = pl_forward_layers(&self.model.m, self.s, self.model.pool, &tv[0], n, &ov[0], all_logits,
                                       NULL, n_layers)
            if tuner is not None and rc == 0:
                tuner.record(threads, time.perf_counter() - start)
        self._check_status(rc, n)
        return out

    @property
    def exact_rows(self) -> int:
        """The most tokens one forward call may take so that each row's logits are the bits of that
        token's own one-token step: any number where every matmul multiplies quantized activations,
        else fewer than sgemm's threshold (sgemm's f32 activations round differently)."""
        return self.n_ctx if self.model.m.sgemm == NULL else PL_BLAS_MIN_TOKENS - 1  # state.c's choice

    def forward_batch(self, list seqs, tokens, counts=None):
        """One step of every sequence in seqs (CoreSequences of this model, each its own): counts[b]
        tokens (one each without counts) appended to seqs[b], tokens holding each sequence's in
        turn; this sequence lends its buffers (n_batch >= the tokens in all) and is not advanced.
        Returns float32 logits (tokens, vocab), each row equal to that token's own one-token
        seqs[b].forward: a batched decode step, or several speculative rounds in one call."""
        cdef int n = len(seqs)
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        per_seq = np.ones(n, dtype=np.intc) if counts is None else np.ascontiguousarray(counts, dtype=np.intc)
        if n == 0 or per_seq.shape != (n,) or (per_seq < 1).any() or arr.shape != (int(per_seq.sum()),):
            raise ValueError("at least one sequence, at least one token for each, and as many tokens as counted")
        cdef int rows = arr.shape[0]
        if rows > self.n_batch:
            raise ValueError(f"{rows} tokens in one step: this buffer holds {self.n_batch}")
        cdef const int32_t[::1] tv = arr
        cdef const int[::1] cv = per_seq
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
            out = np.empty((rows, self.model.m.vocab_size), dtype=np.float32)
            rc = self._batch_step(states, n, &cv[0], &tv[0], out)
        finally:
            free(states)
        if rc == 1:
            raise ValueError(f"a token id is outside [0, {self.model.m.vocab_size})")
        if rc == 2:
            raise OverflowError("a sequence's context is full")
        if rc == 4:
            raise MemoryError()
        if rc != 0:
            raise ValueError("the sequences must be distinct, of this model, and fit this buffer's context")
        for b in range(n):
            seq = seqs[b]
            seq.tokens_processed += per_seq[b]
        return out

    cdef int _batch_step(self, pl_state **states, int n, const int *counts, const int32_t *tokens, object out):
        cdef float[:, ::1] ov = out
        cdef int rc
        with _forward_lock:
            tuner, threads, start = self.model._decode_step(out.shape[0])
            with nogil:
                rc = pl_forward_batch(&self.model.m, self.s, states, n, counts, self.model.pool, tokens, &ov[0, 0])
            if tuner is not None and rc == 0:
                tuner.record(threads, time.perf_counter() - start)
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
        cdef int rc = 0
        with _forward_lock:
            self.model._decode_step(n, timed=False)
            with nogil:
                rc = pl_forward_traced(m, self.s, self.model.pool, &tv[0], n, lp, 1, &tr)
        self._check_status(rc, n)
        return result, out
