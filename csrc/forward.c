/* forward.c — one forward pass over a batch of tokens: the layer loop, driven by the model's
 * recipe (pyllm.h) rather than copied per architecture.
 *
 * Every pool thread runs forward_task; each step takes the thread's share (rows, heads or weight
 * rows) and ends at a barrier, so a whole decode step is one dispatch to the pool. A step whose slot
 * is absent is skipped by a branch per layer.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

typedef struct {
    const pl_model *m;
    pl_state *s;
    pl_pool *pool;
    const int32_t *tokens;
    int n;
    float *logits;    /* (n, vocab) or (vocab) or NULL: no logits for this chunk */
    int all_logits;
    int batch;        /* tokens of the whole call: picks the matmul path for every chunk alike */
    const pl_trace *trace; /* or NULL */
    int trace_row;    /* the trace row of this chunk's first token */
    pl_state *const *seqs; /* a batched step: row t is a token of seqs[t]; else NULL */
    const int *offsets;    /* with seqs: row t's position is seqs[t]->pos + offsets[t] */
    int own_rows;     /* one token (a decode step): each thread keeps its own copy of the residual
                         row and its normed row (x's and xn's row ith), so that it needs no barrier
                         to norm them and start the next matmul */
    int n_layers;     /* the layers run, the first ones (a self-draft's early exit); 0: all */
} forward_args;

/* Where row t of the batch belongs: its sequence and its position there. Without seqs every row
 * is the next position of s; with them (a batched step) each row is a token of its own sequence,
 * one sequence's rows consecutive, and s lends only its activation buffers. */
static inline pl_state *seq_of(const forward_args *a, int t) { return a->seqs ? a->seqs[t] : a->s; }
static inline int pos_of(const forward_args *a, int t) {
    return a->seqs ? a->seqs[t]->pos + a->offsets[t] : a->s->pos + t;
}

/* Where layer l's cache (which = 0: keys, 1: values) of s holds KV head g's row of position pos:
 * head-major, so that attention reads each head's keys and values as one contiguous run. */
static inline void *cache_at(const pl_state *s, const pl_model *m, int which, int l, int g, int pos) {
    int64_t i = (((int64_t)l * m->n_kv_heads + g) * s->n_ctx + pos) * m->head_dim;
    return (char *)(which ? s->v_cache : s->k_cache) + pl_row_size(s->kv_type, i);
}

/* Layer l's keys and values in s, as attention reads them. */
static inline pl_kv_view layer_cache(const pl_state *s, const pl_model *m, int l) {
    pl_kv_view kv = {cache_at(s, m, 0, l, 0, 0), cache_at(s, m, 1, l, 0, 0), s->kv_type, m->head_dim,
                     (int64_t)s->n_ctx * m->head_dim};
    return kv;
}

/* KV head g of row t's key and value, computed into the staging rows, into its sequence's cache, in
 * the cache's type (a q8_0 head row is whole blocks: pl_kv_type_fits). */
static void store_kv(const forward_args *a, int l, int t, int g, const float *k, const float *v) {
    const pl_model *m = a->m;
    pl_state *q = seq_of(a, t);
    const int hd = m->head_dim, pos = pos_of(a, t);
    void *kc = cache_at(q, m, 0, l, g, pos), *vc = cache_at(q, m, 1, l, g, pos);
    if (q->kv_type == PL_TYPE_F32) {
        memcpy(kc, k + g * hd, (size_t)hd * sizeof *k);
        memcpy(vc, v + g * hd, (size_t)hd * sizeof *v);
    } else {
        pl_traits(q->kv_type)->from_f32(k + g * hd, kc, hd);
        pl_traits(q->kv_type)->from_f32(v + g * hd, vc, hd);
    }
}

/* A trace's copy of rows [0, n) of src (row stride width) into buf, this thread's rows: the same
 * t % nth ownership as the step that computed them, so it needs no barrier of its own. */
static void trace_rows(const forward_args *a, float *buf, const float *src, int64_t width, int ith,
                       int nth) {
    if (!buf) return;
    for (int t = ith; t < a->n; t += nth)
        memcpy(buf + (int64_t)(a->trace_row + t) * width, src + (int64_t)t * width, (size_t)width * sizeof *src);
}

/* The first token this thread computes the residual rows of, and the row of x (and xn) token t's
 * goes to: tokens t % nth == ith in their own rows, or with own_rows the one token in row ith. */
static inline int first_token(const forward_args *a, int ith) { return a->own_rows ? 0 : ith; }
static inline int64_t row_of(const forward_args *a, int t, int ith) { return a->own_rows ? ith : t; }

/* x = tok_embd[token] · embed_scale (+ pos_embd[pos]) for this thread's tokens. */
static void embed(const forward_args *a, int ith, int nth) {
    const pl_model *m = a->m;
    pl_state *s = a->s;
    const pl_type_traits *et = pl_traits(m->tok_embd.type);
    const int64_t erow = pl_row_size(m->tok_embd.type, m->dim);
    float *pos_row = s->pos_row + (int64_t)ith * m->dim;
    for (int t = first_token(a, ith); t < a->n; t += nth) {
        float *x = s->x + row_of(a, t, ith) * m->dim;
        et->to_f32((const char *)m->tok_embd.data + (int64_t)a->tokens[t] * erow, x, m->dim);
        if (m->embed_scale != 1.0f)
            for (int i = 0; i < m->dim; i++) x[i] *= m->embed_scale;
        if (m->pos_embd.data) {
            int64_t prow = pl_row_size(m->pos_embd.type, m->dim);
            pl_traits(m->pos_embd.type)->to_f32((const char *)m->pos_embd.data + (int64_t)pos_of(a, t) * prow,
                                                pos_row, m->dim);
            for (int i = 0; i < m->dim; i++) x[i] += pos_row[i];
        }
    }
    if (a->trace) trace_rows(a, a->trace->embed, s->x, m->dim, ith, nth);
}

/* out = norm(in) for rows [t0, n) of width dim, this thread's share. Row t belongs to thread
 * t % nth in embed, norm_rows and residual_add alike (with own_rows, row ith to thread ith), so these
 * need no barrier between them. */
static void norm_rows(const forward_args *a, const pl_norm *norm, float *out, const float *in, int t0,
                      int ith, int nth) {
    const int dim = a->m->dim;
    if (a->own_rows) {
        pl_norm_apply(out + (int64_t)ith * dim, in + (int64_t)ith * dim, norm, dim, a->m->norm_eps);
        return;
    }
    for (int t = ith + (t0 - ith + nth - 1) / nth * nth; t < a->n; t += nth)
        pl_norm_apply(out + (int64_t)t * dim, in + (int64_t)t * dim, norm, dim, a->m->norm_eps);
}

/* x += f, where f is a block's output; a post-norm (Gemma 2/3) is applied to f first. A trace
 * gets f as added (f_out) and x after the add (x_out). With own_rows every thread adds the one row
 * of f to its own copy of x, the post-norm into a row of its own (f is everyone's to read). */
static void residual_add(const forward_args *a, const pl_norm *post_norm, float *f, float *f_out, float *x_out,
                         int ith, int nth) {
    const int dim = a->m->dim;
    if (a->own_rows) {
        const float *d = f;
        if (post_norm->w) {
            float *normed = a->s->pos_row + (int64_t)ith * dim;
            pl_norm_apply(normed, f, post_norm, dim, a->m->norm_eps);
            d = normed;
        }
        float *x = a->s->x + (int64_t)ith * dim;
        for (int i = 0; i < dim; i++) x[i] += d[i];
        trace_rows(a, f_out, d, dim, ith, nth); /* thread 0's rows: row 0 */
        trace_rows(a, x_out, a->s->x, dim, ith, nth);
        return;
    }
    for (int t = ith; t < a->n; t += nth) {
        float *x = a->s->x + (int64_t)t * dim, *d = f + (int64_t)t * dim;
        if (post_norm->w) pl_norm_apply(d, d, post_norm, dim, a->m->norm_eps);
        for (int i = 0; i < dim; i++) x[i] += d[i];
    }
    trace_rows(a, f_out, f, dim, ith, nth);
    trace_rows(a, x_out, a->s->x, dim, ith, nth);
}

/* The tokens and heads of position_heads (and prefetch_kv_rows) that thread ith takes: tokens
 * t % nth with all their heads, or in a one-token step the heads h % nth, so every thread has a share. */
typedef struct {
    int t0, t_step, h0, h_step;
} head_share;

static head_share share_heads(const forward_args *a, int ith, int nth) {
    head_share h = {ith, nth, 0, 1};
    if (a->own_rows) h = (head_share){0, 1, ith, nth};
    return h;
}

/* Per-head RMSNorm of q and k (Qwen3, Gemma 3), then rope on the first n_rot dims of each head;
 * then row t's key and value go from the staging rows to their sequence's cache. */
static void position_heads(const forward_args *a, const pl_layer *L, int l, int ith, int nth) {
    const pl_model *m = a->m;
    pl_state *s = a->s;
    const int hd = m->head_dim, half = m->n_rot / 2;
    const int64_t qd = (int64_t)m->n_heads * hd, kvd = s->kv_dim;
    const head_share sh = share_heads(a, ith, nth);
    for (int t = sh.t0; t < a->n; t += sh.t_step) {
        const pl_state *seq = seq_of(a, t);
        const float *cos = NULL, *sin = NULL;
        if (m->n_rot) {
            const int64_t at = ((int64_t)L->rope * seq->n_ctx + pos_of(a, t)) * half;
            cos = seq->rope_cos + at;
            sin = seq->rope_sin + at;
        }
        float *q = s->q + t * qd, *k = s->kstage + t * kvd;
        for (int h = sh.h0; h < m->n_heads; h += sh.h_step) {
            if (L->q_norm.w) pl_norm_apply(q + h * hd, q + h * hd, &L->q_norm, hd, m->norm_eps);
            if (m->n_rot) pl_rope(q + h * hd, 1, hd, m->n_rot, cos, sin, m->rope_interleaved);
        }
        for (int g = sh.h0; g < m->n_kv_heads; g += sh.h_step) {
            if (L->k_norm.w) pl_norm_apply(k + g * hd, k + g * hd, &L->k_norm, hd, m->norm_eps);
            if (m->n_rot) pl_rope(k + g * hd, 1, hd, m->n_rot, cos, sin, m->rope_interleaved);
            store_kv(a, l, t, g, k, s->vstage + t * kvd);
        }
    }
}

/* The cache lines that this thread's rows of a short step (decode, a batched step) will store their
 * keys and values to, fetched while the q/k/v matmul runs: a new position's lines are cold, and
 * position_heads' stores waited on them (SmolLM2 decode: ~1.1 k cycles a layer, ~0.35 k fetched). */
static void prefetch_kv_rows(const forward_args *a, int l, int ith, int nth) {
    enum { FEW_ROWS = 8 };
    const pl_model *m = a->m;
    if (a->n > FEW_ROWS * nth) return;
    const head_share sh = share_heads(a, ith, nth);
    for (int t = sh.t0; t < a->n; t += sh.t_step) {
        const pl_state *q = seq_of(a, t);
        const int pos = pos_of(a, t);
        const int64_t bytes = pl_row_size(q->kv_type, m->head_dim);
        for (int g = sh.h0; g < m->n_kv_heads; g += sh.h_step)
            for (int which = 0; which < 2; which++) {
                const char *p = cache_at(q, m, which, l, g, pos);
                for (int64_t c = 0; c < bytes; c += 64) PL_PREFETCH(p + c);
            }
    }
}

/* Floats of s->scores each thread owns, as state.c sizes them. */
static int64_t scores_per_thread(const pl_model *m, const pl_state *s) {
    return pl_attention_scores_floats(m, s->n_ctx, s->mm.sgemm != NULL);
}

/* Row t of a batched step's attention in layer l: its query and output rows in a's work state, its
 * own sequence's cache and position. */
typedef struct {
    const forward_args *a;
    int l;
} batch_layer;

static void batch_row(const void *ctx, int t, pl_attn_row *row) {
    const batch_layer *b = ctx;
    const pl_model *m = b->a->m;
    const int64_t qd = (int64_t)m->n_heads * m->head_dim;
    const pl_state *seq = seq_of(b->a, t);
    row->q = b->a->s->q + t * qd;
    row->out = b->a->s->att + t * qd;
    row->kv = layer_cache(seq, m, b->l);
    row->pos = pos_of(b->a, t);
}

/* tr: the layer's PL_TRACE_POINTS buffers, or NULL when it is not traced. */
static void layer(const forward_args *a, const pl_layer *L, int l, float *const *tr, int ith, int nth) {
    static float *const untraced[PL_TRACE_POINTS];
    const pl_model *m = a->m;
    pl_state *s = a->s;
    pl_pool *pool = a->pool;
    const int n = a->n, pos0 = s->pos, dim = m->dim;
    const int64_t qd = (int64_t)m->n_heads * m->head_dim, kvd = s->kv_dim;
    float *xn = s->xn + row_of(a, 0, ith) * dim; /* the matmuls' input: row 0, or this thread's own */
    if (!tr) tr = untraced;

    /* the matmuls read a normed row only once the thread that normed it has met the others (or,
     * with own_rows, the thread that reads it normed it) */
    norm_rows(a, &L->attn_norm, s->xn, s->x, 0, ith, nth);
    prefetch_kv_rows(a, l, ith, nth);
    trace_rows(a, tr[PL_TRACE_ATTN_NORM], s->xn, dim, ith, nth);

    pl_matmul_out qkv[3] = {{&L->wq, s->q, qd, L->bq}, {&L->wk, s->kstage, kvd, L->bk},
                            {&L->wv, s->vstage, kvd, L->bv}};
    pl_matmul(qkv, 3, xn, n, a->batch, &s->mm, pool, ith, nth);
    pl_barrier(pool);

    position_heads(a, L, l, ith, nth);
    pl_barrier(pool);
    /* attention only reads q and the cache: copying q, k and v out needs no barrier */
    trace_rows(a, tr[PL_TRACE_Q], s->q, qd, ith, nth);
    trace_rows(a, tr[PL_TRACE_K], s->kstage, kvd, ith, nth);
    trace_rows(a, tr[PL_TRACE_V], s->vstage, kvd, ith, nth);

    pl_probs_out probs_out = {tr[PL_TRACE_PROBS], a->trace_row, a->trace ? a->trace->n_rows : 0,
                              a->trace ? a->trace->n_keys : 0};
    const pl_probs_out *probs = probs_out.data ? &probs_out : NULL;
    pl_kv_view kv = layer_cache(s, m, l);
    if (a->seqs) {
        batch_layer rows = {a, l};
        pl_attention_rows(m, batch_row, &rows, n, L->sliding_window, s->scores + ith * scores_per_thread(m, s),
                          scores_per_thread(m, s), ith, nth);
    } else if (s->mm.sgemm && s->mm.per_thread_blas && a->batch >= PL_BLAS_MIN_TOKENS)
        pl_attention_blas(m, s->q, &kv, pos0, n, L->sliding_window, s->att, s->scores + ith * scores_per_thread(m, s),
                          s->kv_wide ? s->kv_wide + (int64_t)ith * 2 * s->n_ctx * m->head_dim : NULL, s->mm.sgemm,
                          probs, ith, nth);
    else if (n == 1 && nth > 1)
        pl_attention_decode(m, s->q, &kv, pos0, L->sliding_window, s->att, s->scores, probs, pool, ith, nth);
    else
        pl_attention(m, s->q, &kv, pos0, n, L->sliding_window, s->att, s->scores + ith * scores_per_thread(m, s),
                     scores_per_thread(m, s), probs, ith, nth);
    pl_barrier(pool);

    pl_matmul_out o[1] = {{&L->wo, s->tmp, dim, L->bo}};
    pl_matmul(o, 1, s->att, n, a->batch, &s->mm, pool, ith, nth);
    pl_barrier(pool);

    residual_add(a, &L->post_attn_norm, s->tmp, tr[PL_TRACE_ATTN_OUT], tr[PL_TRACE_RESID_ATTN], ith, nth);
    norm_rows(a, &L->ffn_norm, s->xn, s->x, 0, ith, nth);
    trace_rows(a, tr[PL_TRACE_FFN_NORM], s->xn, dim, ith, nth);

    pl_matmul_glu(L->w_gate.data ? &L->w_gate : NULL, &L->w_up, L->b_up, xn, n, a->batch, m->activation,
                  s->gate, s->up, m->ffn_dim, &s->mm, pool, ith, nth);
    pl_barrier(pool);

    pl_matmul_out d[1] = {{&L->w_down, s->tmp, dim, L->b_down}};
    pl_matmul(d, 1, s->gate, n, a->batch, &s->mm, pool, ith, nth);
    pl_barrier(pool);

    /* the next norm reads only this thread's rows */
    residual_add(a, &L->post_ffn_norm, s->tmp, tr[PL_TRACE_MLP_OUT], tr[PL_TRACE_HIDDEN], ith, nth);
}

static void forward_task(void *raw, int ith, int nth) {
    const forward_args *a = raw;
    const pl_model *m = a->m;
    pl_state *s = a->s;
    const int n = a->n, dim = m->dim;

    embed(a, ith, nth); /* the first norm reads only this thread's rows */

    float *const *traced = a->trace && a->trace->layers ? a->trace->layers : NULL;
    const int n_layers = a->n_layers ? a->n_layers : m->n_layers;
    for (int l = 0; l < n_layers; l++)
        layer(a, &m->layers[l], l, traced ? traced + l * PL_TRACE_POINTS : NULL, ith, nth);

    float *out_norm = a->trace ? a->trace->out_norm : NULL;
    if (!a->logits && !out_norm) return;
    /* Only the rows whose logits are wanted go through the final norm and the head. */
    int first = a->all_logits || out_norm ? 0 : n - 1;
    norm_rows(a, &m->out_norm, s->xn, s->x, first, ith, nth);
    trace_rows(a, out_norm, s->xn, dim, ith, nth);
    if (!a->own_rows) pl_barrier(a->pool); /* the head reads every row */
    if (!a->logits) return;
    if (!a->all_logits) first = n - 1;
    pl_matmul_out head[1] = {{&m->lm_head, a->logits, m->vocab_size, NULL}};
    pl_matmul(head, 1, s->xn + row_of(a, first, ith) * dim, n - first, a->batch, &s->mm, a->pool, ith, nth);
    if (m->logit_softcap > 0) {
        pl_barrier(a->pool);
        int64_t total = (int64_t)(n - first) * m->vocab_size;
        int64_t lo = total * ith / nth, hi = total * (ith + 1) / nth;
        pl_softcap(a->logits + lo, hi - lo, m->logit_softcap);
    }
}

typedef struct {
    forward_args fa;
    const float *x;
} head_args;

static void head_task(void *raw, int ith, int nth) {
    const head_args *h = raw;
    const forward_args *a = &h->fa;
    const pl_model *m = a->m;
    norm_rows(a, &m->out_norm, a->s->xn, h->x, 0, ith, nth);
    pl_barrier(a->pool);
    pl_matmul_out head[1] = {{&m->lm_head, a->logits, m->vocab_size, NULL}};
    pl_matmul(head, 1, a->s->xn, a->n, a->batch, &a->s->mm, a->pool, ith, nth);
    if (m->logit_softcap > 0) {
        pl_barrier(a->pool);
        int64_t total = (int64_t)a->n * m->vocab_size;
        int64_t lo = total * ith / nth, hi = total * (ith + 1) / nth;
        pl_softcap(a->logits + lo, hi - lo, m->logit_softcap);
    }
}

int pl_head(const pl_model *m, pl_state *s, pl_pool *pool, const float *x, int n, float *logits) {
    if (n < 1 || n > s->n_batch || !x || !logits) return PL_ERR_ARGS;
    head_args h = {{m, s, pool, NULL, n, logits, 1, n, NULL, 0, NULL, NULL, 0, 0}, x};
    pl_pool_run(pool, head_task, &h);
    return PL_OK;
}

int pl_forward(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
               float *logits, int all_logits) {
    return pl_forward_traced(m, s, pool, tokens, n, logits, all_logits, NULL);
}

int pl_forward_traced(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
                      float *logits, int all_logits, const pl_trace *trace) {
    return pl_forward_layers(m, s, pool, tokens, n, logits, all_logits, trace, m->n_layers);
}

_Static_assert(PL_DECODE_ROWS < PL_BLAS_MIN_TOKENS, "a decode call's bits must not depend on its thread count");

int pl_forward_layers(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
                      float *logits, int all_logits, const pl_trace *trace, int n_layers) {
    if (n_layers < 1 || n_layers > m->n_layers) return PL_ERR_ARGS;
    if (n < 1 || !tokens || (!logits && !(trace && trace->out_norm))) return PL_ERR_ARGS;
    if (trace && (s->pos < trace->pos0 || s->pos + n > trace->pos0 + trace->n_rows ||
                  trace->n_keys < trace->pos0 + trace->n_rows))
        return PL_ERR_ARGS;
    if (n > s->n_ctx - s->pos) return PL_ERR_CONTEXT;
    if (m->pos_embd.data && s->pos + n > m->n_positions) return PL_ERR_CONTEXT;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->vocab_size) return PL_ERR_TOKEN;
    pl_state_rope_upto(s, m, s->pos + n);
    /* Batches longer than the buffers go through in chunks; only the last one's final token
     * matters unless every row's logits are wanted. */
    for (int done = 0; done < n;) {
        int chunk = n - done < s->n_batch ? n - done : s->n_batch;
        int last = done + chunk == n;
        float *out = !logits ? NULL : all_logits ? logits + (int64_t)done * m->vocab_size : (last ? logits : NULL);
        forward_args a = {m, s, pool, tokens + done, chunk, out, all_logits, n, trace,
                          trace ? s->pos - trace->pos0 : 0, NULL, NULL, chunk == 1, n_layers};
        int blas_chunk = s->mm.sgemm && s->mm.per_thread_blas && n >= PL_BLAS_MIN_TOKENS;
        int blas_threads = blas_chunk ? m->blas.get_threads() : 0;
        if (blas_chunk) m->blas.set_threads(1);
        pl_pool_run_n(pool, forward_task, &a, chunk <= PL_DECODE_ROWS ? pl_pool_decode_threads(pool) : pl_pool_size(pool));
        if (blas_chunk) m->blas.set_threads(blas_threads);
        s->pos += chunk;
        done += chunk;
    }
    return PL_OK;
}

int pl_forward_batch(const pl_model *m, pl_state *work, pl_state *const *seqs, int n_seqs, const int *n_tokens,
                     pl_pool *pool, const int32_t *tokens, float *logits) {
    if (n_seqs < 1 || !seqs || !tokens || !logits) return PL_ERR_ARGS;
    int rows = 0;
    for (int b = 0; b < n_seqs; b++) {
        const pl_state *q = seqs[b];
        const int count = n_tokens ? n_tokens[b] : 1;
        if (!q || q == work || q->kv_dim != work->kv_dim || q->n_ctx > work->n_ctx || count < 1) return PL_ERR_ARGS;
        for (int c = 0; c < b; c++)
            if (seqs[c] == q) return PL_ERR_ARGS;
        if (count > q->n_ctx - q->pos || (m->pos_embd.data && q->pos + count > m->n_positions))
            return PL_ERR_CONTEXT;
        rows += count;
        if (rows > work->n_batch) return PL_ERR_ARGS;
    }
    for (int t = 0; t < rows; t++)
        if (tokens[t] < 0 || tokens[t] >= m->vocab_size) return PL_ERR_TOKEN;
    /* row t's sequence and its place after that sequence's position */
    pl_state **row_seqs = malloc((size_t)rows * sizeof *row_seqs);
    int *offsets = malloc((size_t)rows * sizeof *offsets);
    if (!row_seqs || !offsets) {
        free(row_seqs);
        free(offsets);
        return PL_ERR_NOMEM;
    }
    for (int b = 0, t = 0; b < n_seqs; b++) {
        const int count = n_tokens ? n_tokens[b] : 1;
        pl_state_rope_upto(seqs[b], m, seqs[b]->pos + count);
        for (int i = 0; i < count; i++, t++) {
            row_seqs[t] = seqs[b];
            offsets[t] = i;
        }
    }
    /* batch 1: every row takes the decode path, so each row's numbers are its solo step's */
    forward_args a = {m, work, pool, tokens, rows, logits, 1, 1, NULL, 0, row_seqs, offsets, rows == 1, 0};
    pl_pool_run_n(pool, forward_task, &a, rows <= PL_DECODE_ROWS ? pl_pool_decode_threads(pool) : pl_pool_size(pool));
    for (int b = 0; b < n_seqs; b++) seqs[b]->pos += n_tokens ? n_tokens[b] : 1;
    free(row_seqs);
    free(offsets);
    return PL_OK;
}
