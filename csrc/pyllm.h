/* pyllm.h — the C core's public structs and entry points.
 *
 * Shapes are written outermost first: a weight "(rows, cols)" is rows output features, each a
 * contiguous row of cols input features in its stored type. Activations are float32, row-major,
 * one row per token.
 */
#ifndef PYLLM_H
#define PYLLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- weight types (dtypes.c) */

/* Numbered as ggml numbers them, so a GGUF tensor type id is used as it is. */
enum pl_type {
    PL_TYPE_F32 = 0,
    PL_TYPE_F16 = 1,
    PL_TYPE_Q4_0 = 2,
    PL_TYPE_Q4_1 = 3,
    PL_TYPE_Q5_0 = 6,
    PL_TYPE_Q5_1 = 7,
    PL_TYPE_Q8_0 = 8,
    PL_TYPE_Q8_1 = 9,
    PL_TYPE_Q2_K = 10, /* read from files, never multiplied */
    PL_TYPE_Q3_K = 11, /* read from files, never multiplied */
    PL_TYPE_Q4_K = 12,
    PL_TYPE_Q5_K = 13,
    PL_TYPE_Q6_K = 14,
    PL_TYPE_Q8_K = 15,
    PL_TYPE_BF16 = 30,
    PL_TYPE_COUNT = 31
};

typedef void (*pl_to_f32_fn)(const void *src, float *dst, int64_t n);
typedef void (*pl_from_f32_fn)(const float *src, void *dst, int64_t n);
/* Dot product of one weight row (its stored type) with one activation row already converted to
 * the weight type's vec_dot_type. n is a whole number of blocks. */
typedef float (*pl_vec_dot_fn)(const void *w, const void *x, int64_t n);
/* The same dot of one weight row with n_rows activation rows x_stride bytes apart:
 * out[t·out_stride] = vec_dot(w, x + t·x_stride, n), bit for bit, each weight block unpacked once
 * for all the rows (a batch of decode steps, a short prefill). */
typedef void (*pl_vec_dot_rows_fn)(const void *w, const void *x, int64_t x_stride, int n_rows, int64_t n,
                                   float *out, int64_t out_stride);

typedef struct {
    const char *name;
    int64_t block_size;     /* elements per block */
    int64_t type_size;      /* bytes per block */
    int vec_dot_type;       /* what activations are converted to before vec_dot */
    pl_to_f32_fn to_f32;    /* dequantize / widen n elements */
    pl_from_f32_fn from_f32; /* quantize / narrow n elements (activations, quantize-on-load) */
    pl_vec_dot_fn vec_dot;  /* NULL where the type is only ever an activation format */
    pl_from_f32_fn quantize_weights; /* a slower, lower-error encoder for weights at load; or NULL */
    pl_vec_dot_rows_fn vec_dot_rows; /* NULL where the ISA has none: pl_vec_dot_rows loops vec_dot */
} pl_type_traits;

/* NULL for a type pyllm does not know. */
const pl_type_traits *pl_traits(int type);
/* The name of every type a file may hold (the numbers of enum pl_type, kernels or none), with its
 * block's elements and bytes as ggml's block structs lay them out; NULL for any other number.
 * What pyllm's readers size tensors by (pyllm/dtypes.py builds WeightType from it). */
const char *pl_type_layout(int type, int64_t *block_size, int64_t *type_size);
/* vec_dot_rows where the type has one, else vec_dot row by row: the reference every multi-row
 * kernel equals bit for bit. */
void pl_vec_dot_rows(const pl_type_traits *t, const void *w, const void *x, int64_t x_stride, int n_rows,
                     int64_t n, float *out, int64_t out_stride);
/* Bytes of a row of n elements; -1 if n is not a whole number of blocks or the type is unknown. */
int64_t pl_row_size(int type, int64_t n);

/* Scalar conversions, exact as IEEE and bfloat16 define them (round to nearest even). */
float pl_f16_to_f32(uint16_t h);
uint16_t pl_f32_to_f16(float f);
float pl_bf16_to_f32(uint16_t h);
uint16_t pl_f32_to_bf16(float f);

/* ---------------------------------------------------------------- kernels by CPU (cpu.c) */

enum pl_isa { PL_ISA_SCALAR = 0, PL_ISA_AVX2 = 1, PL_ISA_AVX512 = 2, PL_ISA_NEON = 3, PL_ISA_COUNT };

/* The best ISA this CPU and OS support (registers enabled by the OS included). */
int pl_cpu_best_isa(void);
/* Point every kernel at the variants for isa; returns the isa actually installed (an isa the CPU
 * lacks falls back to scalar). Not thread-safe with running models: call between forwards. */
int pl_set_isa(int isa);
int pl_current_isa(void);
const char *pl_isa_name(int isa);
/* Whether this AVX-512 CPU has VNNI, and whether this AVX2 CPU has AVX-VNNI: the avx512 (avx2) ISA
 * then runs the packed kernels' vpdpbusd build. */
int pl_cpu_has_vnni(void);
int pl_cpu_has_avx_vnni(void);

/* The few vector kernels the ops and attention share, switched with the ISA. */
typedef struct {
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n); /* y += a·x */
    void (*softmax)(float *x, int n);                             /* in place */
    void (*swiglu)(float *gate, const float *up, int n);          /* gate = silu(gate)·up */
    void (*geglu)(float *gate, const float *up, int n);           /* gate = gelu_tanh(gate)·up */
    void (*gelu)(float *x, int n);                                /* x = gelu_tanh(x) */
    float (*dot_f16)(const float *a, const uint16_t *b, int64_t n);  /* an f32 query · an f16 key */
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n); /* y += a·x, x in f16 */
    /* Several queries against several keys, for attention: queries that share K/V rows (the heads
     * of a KV group, consecutive tokens) read each row once. Every result is bit for bit what the
     * single kernel above gives for it: out[i·ldo + j] = dot_f32(qs[i], k + j·ldk, n) for i < nq,
     * j < nk; and ys[i] gets axpy_f32(ys[i], ws[i·ldw + j], x + j·ldx, n) for j = first[i] ..
     * end[i] - 1 in that order. The _f16 pair: the same with dot_f16 / axpy_f16. */
    void (*dot_f32_qk)(const float *const *qs, int nq, const float *k, int64_t ldk, int nk, int64_t n,
                       float *out, int64_t ldo);
    void (*axpy_f32_qk)(float *const *ys, int nq, const float *ws, int64_t ldw, const int *first,
                        const int *end, const float *x, int64_t ldx, int64_t n);
    void (*dot_f16_qk)(const float *const *qs, int nq, const uint16_t *k, int64_t ldk, int nk, int64_t n,
                       float *out, int64_t ldo);
    void (*axpy_f16_qk)(float *const *ys, int nq, const float *ws, int64_t ldw, const int *first,
                        const int *end, const uint16_t *x, int64_t ldx, int64_t n);
} pl_vec_kernels;
extern pl_vec_kernels pl_vec;

/* Installed per ISA by dtypes.c (and quants.c) from cpu.c. */
void pl_install_type_kernels(int isa);
void pl_install_quant_kernels(int isa);

/* ---------------------------------------------------------------- thread pool (threadpool.c) */

typedef struct pl_pool pl_pool;
typedef void (*pl_task_fn)(void *arg, int ith, int nth);

pl_pool *pl_pool_create(int n_threads);
void pl_pool_free(pl_pool *pool);
int pl_pool_size(const pl_pool *pool);
/* Runs fn(arg, ith, n) on every thread of the pool (the caller is thread 0) and returns when all
 * have finished. */
void pl_pool_run(pl_pool *pool, pl_task_fn fn, void *arg);
/* The same on the first nth threads (1 to the pool's size; another value: all of them); the others
 * sleep through it. Every task splits its work by (ith, nth) with the same reduction order
 * whatever nth is, so the bits do not depend on it. */
void pl_pool_run_n(pl_pool *pool, pl_task_fn fn, void *arg, int nth);
/* The threads a forward call of at most PL_DECODE_ROWS rows (a decode step, a speculative round, a
 * few jobs' steps together: bound by reading the weights, as one row is) runs on: the pool's size
 * until set; a value outside [1, size] sets it back to the size. pyllm.threads.DecodeThreads sets
 * it to the count measured fastest for one row. Below sgemm's threshold (kernels.h), where a call's
 * bits do not depend on the thread count: float weights multiply through sgemm from 16 rows on,
 * each thread's tiles cut by the count. */
#define PL_DECODE_ROWS 15
void pl_pool_set_decode_threads(pl_pool *pool, int nth);
int pl_pool_decode_threads(const pl_pool *pool);
/* Inside a task: wait until every thread of the pool reaches this point. */
void pl_barrier(pl_pool *pool);
/* Work dealt from ranges of the threads' own, one piece of dealt work between two barriers: thread t
 * owns items [0, size) of a range of its own (each caller knows every thread's size, below 2^31).
 * pl_pool_claim takes a run of owner's range, half of what is left (at least least items): from its
 * front for the owner itself (from_back 0), which so walks its range in order, or from its back for a
 * thread that has finished its own (from_back 1). Returns the run's length, 0 when the range is
 * all claimed, and its first item in *first. A thread the system stops for a while then holds the
 * others back by one run, not by its whole share. Each barrier starts the claims afresh for the
 * phase it opens. */
int64_t pl_pool_claim(pl_pool *pool, int owner, int64_t size, int64_t least, int from_back, int64_t *first);

/* ---------------------------------------------------------------- BLAS from SciPy */

/* Fortran sgemm as scipy.linalg.cython_blas exports it (column-major, 32-bit ints). */
typedef void (*pl_sgemm_fn)(char *transa, char *transb, int *m, int *n, int *k, float *alpha,
                            float *a, int *lda, float *b, int *ldb, float *beta, float *c,
                            int *ldc);
/* OpenBLAS's thread count: with it set to 1 for a prefill, each pool thread calls sgemm on its
 * own rows; without these (NULL), thread 0 makes every call and the BLAS threads itself. */
typedef struct {
    void (*set_threads)(int n);
    int (*get_threads)(void);
} pl_blas_threads;

/* ---------------------------------------------------------------- tensors */

typedef struct {
    int type;         /* enum pl_type */
    int64_t rows;     /* output features */
    int64_t cols;     /* input features, a whole number of blocks */
    const void *data; /* rows × pl_row_size(type, cols) bytes, in the mmap or an owned buffer */
    void *packed;     /* the same rows interleaved for the packed kernels (packed.h), in the model's
                         weights_block (pl_model_reserve_weights); NULL where it has none */
} pl_tensor;

/* Re-encodes src (rows × cols) into dst_type at dst (rows × pl_row_size(dst_type, cols) bytes),
 * rows split over the pool; PL_OK, or PL_ERR_ARGS for types that cannot convert. */
int pl_convert_tensor(pl_pool *pool, const pl_tensor *src, int dst_type, void *dst);

/* ---------------------------------------------------------------- model (forward.c) */

/* The block is a recipe: every step below runs only where its slot is present (non-NULL).
 *
 *   x = tok_embd[token] · embed_scale (+ pos_embd[pos])
 *   per layer:  h = attn_norm(x)
 *               q, k, v = h·wq (+bq), h·wk (+bk), h·wv (+bv)
 *               q, k = q_norm(q), k_norm(k)          per head, before rope
 *               q, k = rope(q, k)                    the layer's table, the first n_rot dims
 *               a = attention(q, K, V)               scale, soft-cap, sliding window
 *               a = post_attn_norm(a·wo (+bo))
 *               x = x + a                            the residual add, a step of its own
 *               h = ffn_norm(x)
 *               f = act(h·w_gate) ⊙ (h·w_up + b_up)  or act(h·w_up + b_up) without w_gate
 *               f = post_ffn_norm(f·w_down (+b_down))
 *               x = x + f
 *   logits = softcap(out_norm(x)·lm_head)
 *
 * Each flag is a branch per layer, never per element of a row. */

/* The enums that Python names too are lists X(constant, name): a list makes its enum and its
 * pl_*_name function (model.c; NULL past the last value), from which the binding builds its names. */
#define PL_ENUM_CONSTANT(constant, name) constant,

#define PL_ACTIVATION_LIST(X) X(PL_ACT_SILU, silu) X(PL_ACT_GELU_TANH, gelu_tanh)
#define PL_NORM_KIND_LIST(X) X(PL_NORM_RMS, rms) X(PL_NORM_LAYER, layer)
enum pl_activation { PL_ACTIVATION_LIST(PL_ENUM_CONSTANT) };
enum pl_norm_kind { PL_NORM_KIND_LIST(PL_ENUM_CONSTANT) };
const char *pl_activation_name(int i);
const char *pl_norm_kind_name(int i);

/* A norm step: RMS (x / rms(x) · w; Gemma's (1 + w) is folded into w at load) or LayerNorm
 * ((x - mean) / std · w + b). w == NULL: the step is absent. */
typedef struct {
    const float *w; /* (n) */
    const float *b; /* (n) or NULL */
    int kind;       /* enum pl_norm_kind */
} pl_norm;

/* What a slot holds: a weight matrix, a norm, or a float32 bias vector. */
#define PL_SLOT_KIND_LIST(X) X(PL_SLOT_MATRIX, matrix) X(PL_SLOT_NORM, norm) X(PL_SLOT_VECTOR, vector)
enum pl_slot_kind { PL_SLOT_KIND_LIST(PL_ENUM_CONSTANT) };
const char *pl_slot_kind_name(int i);
/* The sizes slot shapes are written in. */
#define PL_DIM_LIST(X)                                                                            \
    X(PL_DIM_ONE, one) X(PL_DIM_DIM, dim) X(PL_DIM_Q, q) X(PL_DIM_KV, kv) X(PL_DIM_FFN, ffn)       \
    X(PL_DIM_HEAD, head) X(PL_DIM_VOCAB, vocab) X(PL_DIM_POS, pos)
enum pl_dim { PL_DIM_LIST(PL_ENUM_CONSTANT) };
const char *pl_dim_name(int i);

/* The tensors of a layer, declared once: this list makes pl_layer's fields, the table the binding
 * fills them from (pl_layer_slots) and the shapes pl_model_check and the Python binder check.
 * X(kind, name, rows, cols, required) — rows/cols are pl_dim names: DIM = dim, Q = n_heads·head_dim,
 * KV = n_kv_heads·head_dim, FFN = ffn_dim, HEAD = head_dim; a norm or vector has cols ONE. */
#define PL_LAYER_SLOTS(X)                                                                  \
    X(NORM, attn_norm, DIM, ONE, 1)                                                         \
    X(MATRIX, wq, Q, DIM, 1)                                                                \
    X(MATRIX, wk, KV, DIM, 1)                                                               \
    X(MATRIX, wv, KV, DIM, 1)                                                               \
    X(VECTOR, bq, Q, ONE, 0)                                                                \
    X(VECTOR, bk, KV, ONE, 0)                                                               \
    X(VECTOR, bv, KV, ONE, 0)                                                               \
    X(NORM, q_norm, HEAD, ONE, 0)         /* per head, before rope (Qwen3, Gemma 3) */      \
    X(NORM, k_norm, HEAD, ONE, 0)                                                           \
    X(MATRIX, wo, DIM, Q, 1)                                                                \
    X(VECTOR, bo, DIM, ONE, 0)                                                              \
    X(NORM, post_attn_norm, DIM, ONE, 0)  /* on the attention output (Gemma 2/3) */         \
    X(NORM, ffn_norm, DIM, ONE, 1)                                                          \
    X(MATRIX, w_gate, FFN, DIM, 0)        /* absent: a plain MLP, act(h·w_up) (GPT-2) */    \
    X(MATRIX, w_up, FFN, DIM, 1)                                                            \
    X(VECTOR, b_up, FFN, ONE, 0)                                                            \
    X(MATRIX, w_down, DIM, FFN, 1)                                                          \
    X(VECTOR, b_down, DIM, ONE, 0)                                                          \
    X(NORM, post_ffn_norm, DIM, ONE, 0)   /* on the MLP output (Gemma 2/3) */

/* The model's own tensors, in the same form. */
#define PL_MODEL_SLOTS(X)                                                                  \
    X(MATRIX, tok_embd, VOCAB, DIM, 1)                                                      \
    X(MATRIX, pos_embd, POS, DIM, 0)      /* learned positions (GPT-2); rows bound n_ctx */  \
    X(NORM, out_norm, DIM, ONE, 1)                                                          \
    X(MATRIX, lm_head, VOCAB, DIM, 1)     /* may be tok_embd itself */

#define PL_SLOT_TYPE_MATRIX pl_tensor
#define PL_SLOT_TYPE_NORM pl_norm
#define PL_SLOT_TYPE_VECTOR const float *
#define PL_SLOT_FIELD(kind, name, rows, cols, required) PL_SLOT_TYPE_##kind name;

typedef struct {
    PL_LAYER_SLOTS(PL_SLOT_FIELD)
    int sliding_window; /* a query at q sees keys in (q - W, q]; 0 = the whole past */
    int rope;           /* index into pl_model.ropes */
} pl_layer;

/* One slot of the lists above, for code that walks them (the binding, the checks). */
typedef struct {
    const char *name;
    int kind;     /* enum pl_slot_kind */
    int rows;     /* enum pl_dim */
    int cols;     /* enum pl_dim */
    int required;
    size_t offset; /* of the field in pl_layer or pl_model */
} pl_slot;

int pl_layer_slot_count(void);
const pl_slot *pl_layer_slot(int i);
int pl_model_slot_count(void);
const pl_slot *pl_model_slot(int i);

/* A rotary table: angle(pos, i) = pos · inv_freq[i]; cos and sin are multiplied by scale (the
 * attention factor of longrope/yarn; 1 otherwise). */
typedef struct {
    const float *inv_freq; /* (n_rot / 2) after any scaling */
    float scale;
} pl_rope_table;

#define PL_MAX_ROPES 4

/* The model's hyper-parameters, declared once: this list makes pl_model's first fields and the
 * table the binding fills them from (pl_hparam), each from the field of the same name of pyllm's
 * ModelSpec (pyllm/arch/spec.py). X(type, name, names): type INT or FLOAT; names, for an enum, its
 * pl_*_name function (ModelSpec holds the value's name), else NULL. */
#define PL_HPARAMS(X)                                                                             \
    X(INT, n_layers, NULL)                                                                        \
    X(INT, dim, NULL)                                                                             \
    X(INT, n_heads, NULL)                                                                         \
    X(INT, n_kv_heads, NULL)                                                                      \
    X(INT, head_dim, NULL)                                                                        \
    X(INT, ffn_dim, NULL)                                                                         \
    X(INT, vocab_size, NULL)                                                                      \
    X(INT, n_positions, NULL)     /* rows of pos_embd; 0 without learned positions */             \
    X(FLOAT, norm_eps, NULL)                                                                      \
    X(FLOAT, attn_scale, NULL)    /* multiplies q·k: 1/sqrt(head_dim), or query_pre_attn_scalar^-1/2 */ \
    X(FLOAT, attn_softcap, NULL)  /* scores = cap·tanh(scores / cap) before the mask; 0 = none */ \
    X(FLOAT, logit_softcap, NULL) /* the same on the final logits; 0 = none */                    \
    X(FLOAT, embed_scale, NULL)   /* multiplies embeddings; 1 but for Gemma (sqrt(dim) in f32) */ \
    X(INT, activation, pl_activation_name) /* enum pl_activation */                               \
    X(INT, n_rot, NULL)           /* leading dims of each head that rotate; 0 = no rope */        \
    X(INT, rope_interleaved, NULL) /* 0: rotate halves (HF); 1: rotate adjacent pairs (GGUF llama) */

#define PL_HPARAM_TYPE_INT int
#define PL_HPARAM_TYPE_FLOAT float
#define PL_HPARAM_FIELD(type, name, names) PL_HPARAM_TYPE_##type name;

enum pl_hparam_type { PL_HPARAM_INT = 0, PL_HPARAM_FLOAT = 1 };

/* One hyper-parameter of the list above, for the binding that fills them. */
typedef struct {
    const char *name;
    int type;                    /* enum pl_hparam_type */
    const char *(*names)(int i); /* an enum's pl_*_name, or NULL */
    size_t offset;               /* of the field in pl_model */
} pl_hparam;

int pl_hparam_count(void);
const pl_hparam *pl_hparam_at(int i);

typedef struct {
    PL_HPARAMS(PL_HPARAM_FIELD)
    int n_ropes;
    pl_rope_table ropes[PL_MAX_ROPES];
    PL_MODEL_SLOTS(PL_SLOT_FIELD)
    pl_layer *layers;          /* (n_layers) */
    pl_sgemm_fn sgemm;         /* NULL: prefill uses the vec_dot kernels */
    pl_blas_threads blas;      /* both NULL if the BLAS's threads cannot be controlled */
    void *weights_block;       /* the copies of the matrices, side by side (pl_model_reserve_weights) */
    size_t weights_block_bytes;
} pl_model;

/* Checks the model's shapes and types agree; 0 or a message for the caller to raise. */
const char *pl_model_check(const pl_model *m);
/* Whether a matrix the forward multiplies by (a layer's or the head) is quantized: then every state
 * multiplies 8-bit activations at every batch size and m->sgemm serves nothing (pl_state_create). */
int pl_model_quantized(const pl_model *m);
/* Lays out copies of the n matrices ts side by side, in the order given (the order the forward reads
 * them), in one block the model owns, on 2 MB pages where the system gives them (memory.c says why):
 * where the type has a packed kernel (packed.h) its interleaved copy, which t->packed then points at
 * and pl_tensor_pack fills; otherwise its rows as stored, which the loader copies to places[i] before
 * pointing t->data there. Once per model: PL_OK, PL_ERR_NOMEM, or PL_ERR_ARGS (reserved before, or a
 * matrix absent, already packed or of a shape that cannot be packed). */
int pl_model_reserve_weights(pl_model *m, pl_tensor *const *ts, int n, void **places);
/* Packs row groups [g0, g1) of a reserved matrix into its interleaved copy on the pool's threads, a
 * piece at a time as the loader likes (it releases the source's pages piece by piece, and the
 * block's pages cost memory only once written): PL_OK (also where the type has no packed kernel) or
 * PL_ERR_ARGS (not reserved, or groups out of range). */
int pl_tensor_pack(pl_tensor *t, pl_pool *pool, int64_t g0, int64_t g1);
/* Frees the weights block and forgets the packed copies (idempotent); a matrix whose data was
 * pointed into the block must not be read after. */
void pl_model_unpack(pl_model *m);

/* One sequence: its KV cache, rotary tables and every activation buffer, allocated once. */
typedef struct pl_state pl_state;

/* kv_type: the cache's element type, PL_TYPE_F32, PL_TYPE_F16 (half the bytes; keys and values
 * rounded to f16 as they are stored) or PL_TYPE_Q8_0 (about a quarter: each head's row of a key or
 * value quantized to blocks of 32 as stored). NULL for a type pl_kv_type_fits refuses. */
pl_state *pl_state_create(const pl_model *m, int n_ctx, int n_batch, int n_threads, int kv_type);
/* Whether m's caches can hold kv_type: q8_0 needs whole blocks per head (head_dim % 32 == 0). */
int pl_kv_type_fits(const pl_model *m, int kv_type);
void pl_state_free(pl_state *s);
int pl_state_pos(const pl_state *s);
int pl_state_n_ctx(const pl_state *s);
/* Bytes of the K and V caches together. */
int64_t pl_state_cache_bytes(const pl_state *s);
/* Forget cached positions >= pos (0 starts afresh); returns -1 if pos is outside [0, current]. */
int pl_state_truncate(pl_state *s, int pos);

enum pl_status {
    PL_OK = 0,
    PL_ERR_TOKEN = 1,   /* a token id outside [0, vocab_size) */
    PL_ERR_CONTEXT = 2, /* the tokens do not fit in the rest of the context */
    PL_ERR_ARGS = 3,
    PL_ERR_NOMEM = 4    /* an allocation failed */
};

/* Appends n tokens at the state's position and computes logits: for every token (logits is
 * (n, vocab_size)) when all_logits, else for the last token only (logits is (vocab_size)). */
int pl_forward(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
               float *logits, int all_logits);

/* One step of several sequences at once: n_tokens[b] tokens (one each where n_tokens is NULL) are
 * appended to seqs[b] at its own position, tokens holding each sequence's in turn, and logits
 * (rows, vocab_size) get every row's next-token logits, rows in the same order. The weights are read
 * once for every row; each attends over its own cache, a sequence's later rows over its earlier
 * ones too. work lends its activation buffers (rows <= its n_batch, and no sequence's n_ctx above
 * its own) and is not advanced. Each row takes the decode path, so a row gets the numbers of its own
 * one-token pl_forward (a speculative round of several sequences: each one's proposed tokens). */
int pl_forward_batch(const pl_model *m, pl_state *work, pl_state *const *seqs, int n_seqs, const int *n_tokens,
                     pl_pool *pool, const int32_t *tokens, float *logits);

/* ---------------------------------------------------------------- tracing (forward.c) */

/* What a layer's steps can hand back, each copied out where the recipe computes it. Widths:
 * q (n_heads·head_dim) and k, v (n_kv_heads·head_dim) after q/k norm and rope, as the cache holds
 * them; probs (n_heads, rows, n_keys), key j in column j, 0 outside a query's window; the rest
 * (dim): attn_out and mlp_out are what the residual adds (after any post-norm), resid_attn the
 * residual after attention, hidden after the whole block. */
#define PL_TRACE_POINT_LIST(X)                                                                    \
    X(PL_TRACE_ATTN_NORM, attn_norm)                                                              \
    X(PL_TRACE_Q, q)                                                                              \
    X(PL_TRACE_K, k)                                                                              \
    X(PL_TRACE_V, v)                                                                              \
    X(PL_TRACE_PROBS, probs)                                                                      \
    X(PL_TRACE_ATTN_OUT, attn_out)                                                                \
    X(PL_TRACE_RESID_ATTN, resid_attn)                                                            \
    X(PL_TRACE_FFN_NORM, ffn_norm)                                                                \
    X(PL_TRACE_MLP_OUT, mlp_out)                                                                  \
    X(PL_TRACE_HIDDEN, hidden)
enum pl_trace_point { PL_TRACE_POINT_LIST(PL_ENUM_CONSTANT) PL_TRACE_POINTS };
const char *pl_trace_point_name(int i);

/* Where a traced forward copies its intermediates: buffers of rows for positions
 * [pos0, pos0 + n_rows), a NULL buffer is a point not wanted. The forward checks only whether a
 * layer's buffers are there, so an untraced forward pays one pointer test per layer. */
typedef struct {
    int pos0, n_rows;
    int n_keys;        /* columns of a probs buffer: pos0 + n_rows */
    float *embed;      /* (n_rows, dim) the embeddings as the first layer sees them */
    float *out_norm;   /* (n_rows, dim) the final norm's output */
    float **layers;    /* (n_layers, PL_TRACE_POINTS) buffers; the whole pointer NULL: no layer */
} pl_trace;

/* pl_forward with a trace (NULL: none). The tokens must fall inside the trace's rows; PL_ERR_ARGS
 * otherwise. With out_norm traced every row goes through the final norm, and logits may be NULL
 * (no head: sentence embeddings). */
/* The final norm, head and soft-cap applied to n (<= the state's n_batch) rows of a residual
 * stream x (n, dim), such as a traced layer's hidden: the logit lens. The cache is untouched. */
int pl_head(const pl_model *m, pl_state *s, pl_pool *pool, const float *x, int n, float *logits);

int pl_forward_traced(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
                      float *logits, int all_logits, const pl_trace *trace);

/* pl_forward_traced through the first n_layers layers only (in [1, n_layers]), then the final norm
 * and head: a self-draft's early exit. Those layers' keys and values at the new positions are the
 * ones the whole forward writes there; the layers above are left as they were. */
int pl_forward_layers(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
                      float *logits, int all_logits, const pl_trace *trace, int n_layers);

/* ---------------------------------------------------------------- vocabularies (vocab.c) */

/* Every split of a token into two tokens of the vocabulary: token t is bytes[offsets[t],
 * offsets[t + 1]) in UTF-8, and a split cuts it between two code points. Splits are listed by
 * token, then cut: the token, the cut in code points, and the tokens of its left and right parts
 * (of equal tokens, the first). Linear in the bytes. */
typedef struct {
    int64_t *which, *cut, *left, *right; /* n of each, malloc'd: pl_vocab_split_list_free */
    int64_t n;
} pl_vocab_split_list;
/* PL_OK with out filled; PL_ERR_NOMEM or PL_ERR_ARGS (over 2^31 tokens, or a token of over 2^31
 * bytes) with out empty. */
int pl_vocab_splits(const char *bytes, const int64_t *offsets, int64_t n, pl_vocab_split_list *out);
void pl_vocab_split_list_free(pl_vocab_split_list *out);

#ifdef __cplusplus
}
#endif
#endif
