# cython: language_level=3
"""The C core's declarations (csrc/pyllm.h, kernels.h, packed.h) for the modules built over it
(_core, _kernels, _strings), and the few helpers they share. Cython reads these, not the headers:
the C compiler checks each against them."""
from libc.stdint cimport int32_t, int64_t, uint16_t, uintptr_t

from cpython.pycapsule cimport PyCapsule_GetName, PyCapsule_GetPointer

cdef extern from "pyllm.h" nogil:
    enum:
        PL_TYPE_F32
        PL_TYPE_F16
        PL_TYPE_Q8_0
        PL_TYPE_COUNT
        PL_ISA_COUNT
        PL_HPARAM_FLOAT
        PL_SLOT_MATRIX
        PL_SLOT_NORM
        PL_MAX_ROPES
        PL_TRACE_POINTS
        PL_ERR_NOMEM

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
    const char *pl_type_layout(int type, int64_t *block_size, int64_t *type_size)
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
    void pl_pool_set_decode_threads(pl_pool *pool, int nth)
    int pl_pool_decode_threads(const pl_pool *pool)

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
    const char *pl_activation_name(int i)
    const char *pl_norm_kind_name(int i)
    const char *pl_slot_kind_name(int i)
    const char *pl_dim_name(int i)
    const char *pl_trace_point_name(int i)
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
    ctypedef struct pl_hparam:
        const char *name
        int type
        const char *(*names)(int i) noexcept nogil
        size_t offset
    int pl_hparam_count()
    const pl_hparam *pl_hparam_at(int i)
    ctypedef struct pl_rope_table:
        const float *inv_freq
        float scale
    # The hyper-parameters are filled through pl_hparam_at() offsets; the ones read by name here:
    ctypedef struct pl_model:
        int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size, n_rot
        float attn_scale, attn_softcap
        int n_ropes
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
    ctypedef struct pl_trace:
        int pos0, n_rows, n_keys
        float *embed
        float *out_norm
        float **layers
    int pl_forward_traced(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
                          float *logits, int all_logits, const pl_trace *trace)
    int pl_forward_layers(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
                          float *logits, int all_logits, const pl_trace *trace, int n_layers)
    int pl_head(const pl_model *m, pl_state *s, pl_pool *pool, const float *x, int n, float *logits)
    ctypedef struct pl_vocab_split_list:
        int64_t *which
        int64_t *cut
        int64_t *left
        int64_t *right
        int64_t n
    int pl_vocab_splits(const char *bytes, const int64_t *offsets, int64_t n, pl_vocab_split_list *out)
    void pl_vocab_split_list_free(pl_vocab_split_list *out)
    int pl_forward_batch(const pl_model *m, pl_state *work, pl_state *const *seqs, int n_seqs, const int *n_tokens,
                         pl_pool *pool, const int32_t *tokens, float *logits)

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

cdef extern from "packed.h" nogil:
    enum: PL_PACK_ROWS
    int pl_packed_type(int type)
    const char *pl_packed_kernels_name()
    int pl_packed_avxvnni_compiled()
    int64_t pl_packed_bytes(int type, int64_t rows, int64_t cols)
    int pl_pack_groups(int type, const void *src, int64_t rows, int64_t cols, void *dst, int64_t g0, int64_t g1)
    int pl_gemm_packed(int type, const void *packed, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                       const void *x, int64_t x_stride, int n, float *y, int64_t ldy)


cdef inline const pl_type_traits *traits_of(int wtype) except NULL:
    cdef const pl_type_traits *t = pl_traits(wtype)
    if t == NULL:
        raise ValueError(f"weight type {wtype} is unknown to the C core")
    return t


cdef inline int64_t checked_row_size(int wtype, int64_t n) except -1:
    cdef int64_t r = pl_row_size(wtype, n)
    if r < 0:
        raise ValueError(f"{n} elements are not whole blocks of type {wtype}")
    return r


cdef inline pl_sgemm_fn scipy_sgemm() except NULL:
    """SciPy's sgemm, imported the first time something needs it: importing scipy.linalg is most of
    what `import pyllm` would otherwise cost."""
    from scipy.linalg import cython_blas

    capsule = cython_blas.__pyx_capi__["sgemm"]
    return <pl_sgemm_fn>PyCapsule_GetPointer(capsule, PyCapsule_GetName(capsule))


cdef inline pl_blas_threads blas_threads_of(tuple controls):
    """OpenBLAS's (set, get) thread controls from their addresses; both NULL unless both are given."""
    cdef pl_blas_threads b
    b.set_threads = <void (*)(int) noexcept nogil><uintptr_t>controls[0]
    b.get_threads = <int (*)() noexcept nogil><uintptr_t>controls[1]
    if b.set_threads == NULL or b.get_threads == NULL:
        b.set_threads = NULL
        b.get_threads = NULL
    return b


cdef inline tuple enum_names(const char *(*name)(int) noexcept nogil):
    """An enum's names, by value, from its pl_*_name function (csrc/pyllm.h)."""
    cdef list out = []
    cdef const char *s = name(0)
    while s != NULL:
        out.append(s.decode())
        s = name(len(out))
    return tuple(out)
