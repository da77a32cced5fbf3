/* kernels.h — what the core's own files share and the bindings need not see.
 *
 * Every kernel has a scalar reference; SIMD variants live one file per ISA (simd_avx2.c,
 * simd_avx512.c, simd_neon.c, quants_*.c), compiled on every machine but with bodies only where the
 * compiler targets that architecture. Their functions carry a target attribute, so nothing is built
 * with -march and cpu.c picks among them at run time.
 */
#ifndef PYLLM_KERNELS_H
#define PYLLM_KERNELS_H

#include "pyllm.h"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
#define PL_X86 1
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
#define PL_ARM64 1
#endif

#if defined(__GNUC__) || defined(__clang__)
#define PL_TARGET(s) __attribute__((target(s)))
#else
#define PL_TARGET(s)
#endif
#define PL_TARGET_AVX2 PL_TARGET("avx2,fma,f16c")
#define PL_TARGET_AVX512 PL_TARGET("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

/* A hint to bring the cache line at p into every cache level ahead of its use. GCC 12 compiled
 * _mm_prefetch inside packed_avx2.c's target functions to nothing (seen in the disassembly), so the
 * builtin where there is one. */
#if defined(__GNUC__) || defined(__clang__)
#define PL_PREFETCH(p) __builtin_prefetch((p), 0, 3)
#elif defined(_MSC_VER) && defined(PL_X86)
#include <intrin.h>
#define PL_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#else
#define PL_PREFETCH(p) ((void)(p))
#endif

/* Thread ith's share [lo, hi) of total units, cut at multiples of align (the last one ending at
 * total): the static split of rows, heads and columns. */
static inline void pl_share(int64_t total, int64_t align, int ith, int nth, int64_t *lo, int64_t *hi) {
    int64_t units = (total + align - 1) / align;
    *lo = units * ith / nth * align;
    *hi = units * (ith + 1) / nth * align;
    if (*lo > total) *lo = total;
    if (*hi > total) *hi = total;
}

/* The traits table, writable by the install functions only. */
pl_type_traits *pl_traits_slot(int type);

/* Scalar references (dtypes.c). */
float pl_dot_f32_scalar(const float *a, const float *b, int64_t n);
void pl_axpy_f32_scalar(float *y, float a, const float *x, int64_t n);
float pl_dot_f16_scalar(const float *a, const uint16_t *b, int64_t n);
void pl_axpy_f16_scalar(float *y, float a, const uint16_t *x, int64_t n);

/* pl_vec's multi-query attention kernels made of an ISA's single ones, called in an order that
 * keeps a block of K rows (8 keys) or V rows (PL_QK_ROWS) in L1 while every query uses it: each
 * result is the single kernel's own, so bit for bit. An ISA with faster ones (simd_avx2.c) writes
 * its own. */
#define PL_QK_ROWS 64
#define PL_DOT_QK_FROM(NAME, ATTR, KT, DOT)                                                            \
    ATTR static void NAME(const float *const *qs, int nq, const KT *k, int64_t ldk, int nk, int64_t n, \
                          float *out, int64_t ldo) {                                                  \
        for (int j0 = 0; j0 < nk; j0 += 8)                                                             \
            for (int i = 0; i < nq; i++)                                                               \
                for (int j = j0; j < nk && j < j0 + 8; j++) out[i * ldo + j] = DOT(qs[i], k + j * ldk, n); \
    }
#define PL_AXPY_QK_FROM(NAME, ATTR, XT, AXPY)                                                          \
    ATTR static void NAME(float *const *ys, int nq, const float *ws, int64_t ldw, const int *first,   \
                          const int *end, const XT *x, int64_t ldx, int64_t n) {                       \
        int last = 0;                                                                                  \
        for (int i = 0; i < nq; i++) last = end[i] > last ? end[i] : last;                             \
        for (int r0 = 0; r0 < last; r0 += PL_QK_ROWS)                                                  \
            for (int i = 0; i < nq; i++) {                                                             \
                int lo = first[i] > r0 ? first[i] : r0;                                                \
                int hi = end[i] < r0 + PL_QK_ROWS ? end[i] : r0 + PL_QK_ROWS;                          \
                for (int j = lo; j < hi; j++) AXPY(ys[i], ws[i * ldw + j], x + j * ldx, n);            \
            }                                                                                          \
    }

/* Per-ISA installers of the f32/f16/bf16 kernels: each returns 0 where not compiled in. */
int pl_install_simd_avx2(void);
int pl_install_simd_avx512(void);
int pl_install_simd_neon(void);

/* ---------------------------------------------------------------- ops.c, attention.c */

void pl_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
void pl_layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps);
/* out = norm(x) by the norm's kind; norm->w must be set. */
void pl_norm_apply(float *out, const float *x, const pl_norm *norm, int n, float eps);
void pl_rope(float *x, int n_heads, int head_dim, int n_rot, const float *cos, const float *sin,
             int interleaved);
void pl_softcap(float *x, int64_t n, float cap);
void pl_softmax_scalar(float *x, int n);
void pl_swiglu_scalar(float *gate, const float *up, int n);
void pl_geglu_scalar(float *gate, const float *up, int n);
void pl_gelu_scalar(float *x, int n);
#define pl_softmax(x, n) pl_vec.softmax(x, n)
#define pl_swiglu(g, u, n) pl_vec.swiglu(g, u, n)

/* Where attention copies its probabilities for a trace: query t of the batch, head h, key j goes to
 * data[(h · n_rows + row0 + t) · n_keys + j]. A NULL pl_probs_out: not wanted. */
typedef struct {
    float *data;
    int row0, n_rows, n_keys;
} pl_probs_out;

/* Where a layer's keys and values lie, of type PL_TYPE_F32, PL_TYPE_F16 or PL_TYPE_Q8_0: the key of
 * position j in KV head g starts g · head_stride + j · ld values into k (pl_row_size of that in
 * bytes: q8_0 offsets are whole blocks), its value likewise in v. A state's cache is head-major
 * (ld = head_dim, head_stride = n_ctx · head_dim: one head's keys are one contiguous run);
 * position-major rows (ld = n_kv_heads · head_dim, head_stride = head_dim) work the same. */
typedef struct {
    const void *k, *v;
    int type;
    int64_t ld, head_stride;
} pl_kv_view;

/* Floats of stack a thread's attention widens q8_0 rows into: rows of head_dim, a block of them. */
#define PL_ATTN_WIDE_FLOATS 4096

/* Causal GQA attention of n queries at positions pos0.. over a layer's keys and values kv: for
 * token t of the batch (position p = pos0 + t) and query head h,
 * out[t, h] = softmax(scale · q[t, h] · K[j]ᵀ for j in the window) · V[j], the window
 * (p - window, p] or [0, p] when window is 0, scores soft-capped first where the model caps them.
 * The thread's scores hold n_scores floats, at least pos0 + n; up to pl_attention_scores_floats
 * lets it batch queries. Every query's result is bit for bit pl_attention_per_query's, whatever
 * n, pos0, n_scores and the thread count: a position's numbers do not depend on the batch. */
void pl_attention(const pl_model *m, const float *q, const pl_kv_view *kv, int pos0, int n, int window, float *out,
                  float *scores, int64_t n_scores, const pl_probs_out *probs, int ith, int nth);
/* pl_attention of one query token at position pos (a decode step) on all nth threads together,
 * the same bits: each thread reads its own part of the cache, whatever the number of KV heads.
 * The scores of every key of a KV head go into one range dealt to the threads, each run against
 * all of the head's queries; a barrier; each query's softmax; a barrier; then the weighted sums,
 * the columns of the values dealt (every element's sum runs over the keys in order whichever
 * columns come with it). pl_attention deals whole (KV head, queries) items instead: with SmolLM2's
 * 3 KV heads of 3 queries one thread got 5 queries' work and the other 4, and a KV head read by
 * both. scores: n_heads × (pos + 1) floats shared by the threads. Called by every pool thread;
 * the caller places a barrier before out is read. */
void pl_attention_decode(const pl_model *m, const float *q, const pl_kv_view *kv, int pos, int window, float *out,
                         float *scores, const pl_probs_out *probs, pl_pool *pool, int ith, int nth);
/* One row of a batched decode step: its query heads q and output out (n_heads · head_dim each), its
 * own sequence's cache kv and the position pos it attends from. */
typedef struct {
    const float *q;
    float *out;
    pl_kv_view kv;
    int pos;
} pl_attn_row;
/* Row t of a batched decode step, as the caller lays its sequences out. */
typedef void (*pl_attn_row_fn)(const void *ctx, int t, pl_attn_row *row);
/* pl_attention of n rows that each attend over their own cache: items of (row, KV head, the head's
 * queries up to the scores' room) dealt to the threads in runs of about equal cost over the whole
 * step, so that every row reads each KV head once (pl_attention of one row cuts SmolLM2's 3 queries
 * a head into 2 + 1 to have items for two threads, and reads each head twice). Consecutive rows that
 * are consecutive tokens of one sequence (a speculative round) share items as pl_attention's tokens
 * do, up to ATTN_TOKENS of them reading each key once. The same bits as pl_attention of each row
 * alone. scores: this thread's n_scores floats, at least the longest row's keys;
 * pl_attention_scores_floats for its context lets an item take all of a KV head's queries. */
void pl_attention_rows(const pl_model *m, pl_attn_row_fn row_of, const void *ctx, int n, int window, float *scores,
                       int64_t n_scores, int ith, int nth);
/* Floats of scores per thread that pl_attention uses in full (and, with sgemm, pl_attention_blas). */
int64_t pl_attention_scores_floats(const pl_model *m, int n_ctx, int sgemm);
/* The one-query-at-a-time reference of pl_attention (scores: pos0 + n floats). */
void pl_attention_per_query(const pl_model *m, const float *q, const pl_kv_view *kv, int pos0, int n, int window,
                            float *out, float *scores, const pl_probs_out *probs, int ith, int nth);

/* The same for a prefill batch through sgemm; scores holds PL_ATTN_QBLOCK × n_ctx floats. An f16
 * or q8_0 cache's rows are widened first into kv_wide, 2 × n_ctx × head_dim floats (NULL for f32). */
#define PL_ATTN_QBLOCK 64
void pl_attention_blas(const pl_model *m, const float *q, const pl_kv_view *kv, int pos0, int n, int window,
                       float *out, float *scores, float *kv_wide, pl_sgemm_fn sgemm, const pl_probs_out *probs,
                       int ith, int nth);

/* ---------------------------------------------------------------- matmul.c */

/* One product of a matmul group: y (n, ldy)[:, 0:w->rows] = x · wᵀ (+ bias). */
typedef struct {
    const pl_tensor *w;
    float *y;
    int64_t ldy;
    const float *bias; /* (w->rows) or NULL */
} pl_matmul_out;

typedef struct {
    void *xq;            /* activations in the weights' vec_dot_type: PL_MATMUL_MAX_OUTS regions */
    int64_t xq_region;   /* bytes of one region: rows for max(tokens, threads) */
    float *wtile;        /* dequantized weight tiles for sgemm: one of tile_floats per thread */
    int64_t tile_floats;
    pl_sgemm_fn sgemm;   /* NULL: the vec_dot kernels for every batch size */
    int per_thread_blas; /* each thread calls a single-threaded sgemm on its own rows */
} pl_matmul_scratch;

#define PL_MATMUL_MAX_OUTS 3
/* From this many tokens on, a matmul dequantizes weight tiles and calls sgemm. */
#define PL_BLAS_MIN_TOKENS 16
/* Below this many rows, a batch-path matmul dots widened weight rows instead of calling sgemm. */
#define PL_FEW_ROWS 4

/* Computes every out of a group that shares its input x (n, w->cols): q/k/v, or gate/up. Called by
 * every pool thread. With n ≥ 2, x may still be in the making on entry, as long as row t is written
 * by thread t % nth (embed, norm_rows and residual_add's rows): a thread reads only its own rows of x
 * before it meets the others at a barrier, so no barrier is needed between those steps and the
 * matmul. With n = 1 no barrier comes first: every thread reads x whole at once, so it must be
 * complete for each thread on entry (x may differ between threads, if its bits do not: a decode
 * step's threads each norm their own copy of the row). The caller places a barrier after the call,
 * before the outputs are read and before the next dealt matmul. batch is the number
 * of tokens of the forward pass: it picks the path (sgemm from PL_BLAS_MIN_TOKENS on), so every
 * row of a prefill — the last one's logits included — is computed the same way. */
void pl_matmul(const pl_matmul_out *outs, int n_outs, const float *x, int n, int batch,
               const pl_matmul_scratch *scratch, pl_pool *pool, int ith, int nth);
/* The MLP's first half. With w_gate: gate (n, ld) = act(x · w_gateᵀ) ⊙ (x · w_upᵀ + b_up), up holding
 * the second product; without (a plain MLP): gate = act(x · w_upᵀ + b_up). Every thread owns the
 * same rows of both products, so it applies the activation to them without a barrier. */
void pl_matmul_glu(const pl_tensor *w_gate, const pl_tensor *w_up, const float *b_up, const float *x,
                   int n, int batch, int activation, float *gate, float *up, int64_t ld,
                   const pl_matmul_scratch *sc, pl_pool *pool, int ith, int nth);
/* Bytes of one xq region for n rows of cols inputs of a weight type. */
int64_t pl_matmul_xq_bytes(int type, int64_t cols, int n);

/* ---------------------------------------------------------------- memory.c */

/* 64-byte aligned blocks (a cache line; every SIMD width), freed with pl_free_aligned. */
void *pl_alloc_aligned(size_t bytes);
void pl_free_aligned(void *p);
/* A block read end to end by every step (the model's matrices): 2 MB aligned, on huge pages where
 * the system gives them; freed with pl_free_swept(p, the same bytes). */
void *pl_alloc_swept(size_t bytes);
void pl_free_swept(void *p, size_t bytes);
/* Whether pl_alloc_swept asks for huge pages on this system (Linux): elsewhere a copy into it gains
 * nothing. */
int pl_swept_on_huge_pages(void);
/* Hands the heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing): a
 * loader's large, short-lived Python objects would otherwise stay resident after they are freed. */
void pl_trim_heap(void);

/* ---------------------------------------------------------------- state.c */

/* Computes the rotary tables' rows of positions [s->rope_rows, end) (end ≤ n_ctx): a forward call
 * asks for the positions it is about to use, so a state holds and computes only the rows it has
 * reached (a 4,096-position Gemma 3 state's two tables are 8.4 MB, most never read). */
void pl_state_rope_upto(pl_state *s, const pl_model *m, int end);

struct pl_state {
    int n_ctx, n_batch, n_threads;
    int pos;               /* tokens in the cache */
    int kv_dim;            /* n_kv_heads * head_dim */
    int kv_type;           /* PL_TYPE_F32, PL_TYPE_F16 or PL_TYPE_Q8_0: the caches' elements */
    void *k_cache;         /* (n_layers, n_kv_heads, n_ctx, head_dim) of kv_type: a head's keys are one run */
    void *v_cache;         /* (n_layers, n_kv_heads, n_ctx, head_dim) of kv_type */
    int64_t cache_bytes;   /* of each of the two */
    float *rope_cos;       /* (n_ropes, n_ctx, n_rot / 2), the table's scale applied */
    float *rope_sin;       /* (n_ropes, n_ctx, n_rot / 2) */
    int rope_rows;         /* positions of the tables computed so far (pl_state_rope_upto) */
    float *x;              /* (max(n_batch, n_threads), dim) the residual stream: a row per token, or in a
                              one-token step a copy per thread */
    float *xn;             /* (max(n_batch, n_threads), dim) a block's normed input, rows as x's */
    float *q;              /* (n_batch, n_heads * head_dim) */
    float *pos_row;        /* (n_threads, dim) a learned position row widened to f32; a one-token
                              step's post-norm output */
    float *att;            /* (n_batch, n_heads * head_dim) attention output */
    float *tmp;            /* (n_batch, dim) a block's output before the residual add */
    float *gate;           /* (n_batch, ffn_dim) */
    float *up;             /* (n_batch, ffn_dim) */
    float *kstage;         /* (n_batch, kv_dim) keys as computed, before they go to their heads' rows in the cache */
    float *vstage;         /* (n_batch, kv_dim) and values */
    float *scores;         /* (n_threads, pl_attention_scores_floats(m, n_ctx, sgemm)), and at least
                              n_heads × n_ctx: pl_attention_decode's */
    float *kv_wide;        /* (n_threads, 2, n_ctx, head_dim) an f16 or q8_0 cache's rows widened for sgemm, or NULL */
    pl_matmul_scratch mm;  /* xq: (PL_MATMUL_MAX_OUTS, xq_region); wtile: (tile_floats) */
};

#endif
