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

typedef struct {
    const char *name;
    int64_t block_size;     /* elements per block */
    int64_t type_size;      /* bytes per block */
    int vec_dot_type;       /* what activations are converted to before vec_dot */
    pl_to_f32_fn to_f32;    /* dequantize / widen n elements */
    pl_from_f32_fn from_f32; /* quantize / narrow n elements (activations, quantize-on-load) */
    pl_vec_dot_fn vec_dot;  /* NULL where the type is only ever an activation format */
    pl_from_f32_fn quantize_weights; /* a slower, lower-error encoder for weights at load; or NULL */
} pl_type_traits;

/* NULL for a type pyllm does not know. */
const pl_type_traits *pl_traits(int type);
/* Bytes of a row of n elements; -1 if n is not a whole number of blocks or the type is unknown. */
int64_t pl_row_size(int type, int64_t n);

/* Scalar conversions, exact as IEEE and bfloat16 define them (round to nearest even). */
float pl_f16_to_f32(uint16_t h);
uint16_t pl_f32_to_f16(float f);
float pl_bf16_to_f32(uint16_t h);
uint16_t pl_f32_to_bf16(float f);

/* ---------------------------------------------------------------- kernels by CPU (cpu.c) */

enum pl_isa { PL_ISA_SCALAR = 0, PL_ISA_AVX2 = 1, PL_ISA_AVX512 = 2, PL_ISA_NEON = 3 };

/* The best ISA this CPU and OS support (registers enabled by the OS included). */
int pl_cpu_best_isa(void);
/* Point every kernel at the variants for isa; returns the isa actually installed (an isa the CPU
 * lacks falls back to scalar). Not thread-safe with running models: call between forwards. */
int pl_set_isa(int isa);
int pl_current_isa(void);
const char *pl_isa_name(int isa);

/* The few vector kernels the ops and attention share, switched with the ISA. */
typedef struct {
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n); /* y += a·x */
    void (*softmax)(float *x, int n);                             /* in place */
    void (*swiglu)(float *gate, const float *up, int n);          /* gate = silu(gate)·up */
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
/* Inside a task: wait until every thread of the pool reaches this point. */
void pl_barrier(pl_pool *pool);

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
} pl_tensor;

/* Re-encodes src (rows × cols) into dst_type at dst (rows × pl_row_size(dst_type, cols) bytes),
 * rows split over the pool; PL_OK, or PL_ERR_ARGS for types that cannot convert. */
int pl_convert_tensor(pl_pool *pool, const pl_tensor *src, int dst_type, void *dst);

/* ---------------------------------------------------------------- model (forward.c) */

enum pl_activation { PL_ACT_SILU = 0, PL_ACT_GELU_TANH = 1 };

typedef struct {
    const float *attn_norm; /* (dim) */
    pl_tensor wq;           /* (n_heads * head_dim, dim) */
    pl_tensor wk;           /* (n_kv_heads * head_dim, dim) */
    pl_tensor wv;           /* (n_kv_heads * head_dim, dim) */
    const float *bq;        /* (n_heads * head_dim) or NULL */
    const float *bk;        /* (n_kv_heads * head_dim) or NULL */
    const float *bv;        /* (n_kv_heads * head_dim) or NULL */
    pl_tensor wo;           /* (dim, n_heads * head_dim) */
    const float *ffn_norm;  /* (dim) */
    pl_tensor w_gate;       /* (ffn_dim, dim) */
    pl_tensor w_up;         /* (ffn_dim, dim) */
    pl_tensor w_down;       /* (dim, ffn_dim) */
    int sliding_window;     /* a query at q sees keys in (q - W, q]; 0 = the whole past */
} pl_layer;

typedef struct {
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size;
    float norm_eps;
    float attn_scale;          /* multiplies q·k; 1/sqrt(head_dim) for Llama */
    float embed_scale;         /* multiplies embeddings; 1 for Llama */
    int activation;            /* enum pl_activation, gates the MLP */
    int rope_interleaved;      /* 0: rotate halves (HF); 1: rotate adjacent pairs (GGUF llama) */
    const float *rope_inv_freq; /* (head_dim / 2) frequencies after any scaling */
    pl_tensor tok_embd;        /* (vocab_size, dim) */
    const float *out_norm;     /* (dim) */
    pl_tensor lm_head;         /* (vocab_size, dim); may be tok_embd itself */
    pl_layer *layers;          /* (n_layers) */
    pl_sgemm_fn sgemm;         /* NULL: prefill uses the vec_dot kernels */
    pl_blas_threads blas;      /* both NULL if the BLAS's threads cannot be controlled */
} pl_model;

/* Checks the model's shapes and types agree; 0 or a message for the caller to raise. */
const char *pl_model_check(const pl_model *m);

/* One sequence: its KV cache, rotary tables and every activation buffer, allocated once. */
typedef struct pl_state pl_state;

pl_state *pl_state_create(const pl_model *m, int n_ctx, int n_batch, int n_threads);
void pl_state_free(pl_state *s);
int pl_state_pos(const pl_state *s);
int pl_state_n_ctx(const pl_state *s);
/* Forget cached positions >= pos (0 starts afresh); returns -1 if pos is outside [0, current]. */
int pl_state_truncate(pl_state *s, int pos);

enum pl_status {
    PL_OK = 0,
    PL_ERR_TOKEN = 1,   /* a token id outside [0, vocab_size) */
    PL_ERR_CONTEXT = 2, /* the tokens do not fit in the rest of the context */
    PL_ERR_ARGS = 3
};

/* Appends n tokens at the state's position and computes logits: for every token (logits is
 * (n, vocab_size)) when all_logits, else for the last token only (logits is (vocab_size)). */
int pl_forward(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
               float *logits, int all_logits);

#ifdef __cplusplus
}
#endif
#endif
