/* forward.c — one forward pass over a batch of tokens: the layer loop, driven by the model's
 * flags rather than copied per architecture.
 *
 * Every pool thread runs forward_task; each step takes the thread's share (rows, heads or weight
 * rows) and ends at a barrier, so a whole decode step is one dispatch to the pool.
 */
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
} forward_args;

/* x += tmp (when the previous block left an output there), then out = rmsnorm(x) · w. */
static void residual_norm(const forward_args *a, int add_tmp, const float *w, int t0, int ith, int nth) {
    const pl_model *m = a->m;
    pl_state *s = a->s;
    for (int t = t0 + ith; t < a->n; t += nth) {
        float *x = s->x + (int64_t)t * m->dim;
        if (add_tmp) {
            const float *d = s->tmp + (int64_t)t * m->dim;
            for (int i = 0; i < m->dim; i++) x[i] += d[i];
        }
        if (w) pl_rmsnorm(s->xn + (int64_t)t * m->dim, x, w, m->dim, m->norm_eps);
    }
}

static void forward_task(void *raw, int ith, int nth) {
    const forward_args *a = raw;
    const pl_model *m = a->m;
    pl_state *s = a->s;
    pl_pool *pool = a->pool;
    const int n = a->n, pos0 = s->pos, dim = m->dim, half = m->head_dim / 2;
    const int64_t qd = (int64_t)m->n_heads * m->head_dim, kvd = s->kv_dim;
    const pl_type_traits *et = pl_traits(m->tok_embd.type);
    const int64_t erow = pl_row_size(m->tok_embd.type, dim);

    for (int t = ith; t < n; t += nth) {
        float *x = s->x + (int64_t)t * dim;
        et->to_f32((const char *)m->tok_embd.data + (int64_t)a->tokens[t] * erow, x, dim);
        if (m->embed_scale != 1.0f)
            for (int i = 0; i < dim; i++) x[i] *= m->embed_scale;
    }
    pl_barrier(pool);

    for (int l = 0; l < m->n_layers; l++) {
        const pl_layer *L = &m->layers[l];
        float *kc = s->k_cache + (int64_t)l * s->n_ctx * kvd;
        float *vc = s->v_cache + (int64_t)l * s->n_ctx * kvd;

        residual_norm(a, l > 0, L->attn_norm, 0, ith, nth);
        pl_barrier(pool);

        /* k and v are written straight into the cache at their positions */
        pl_matmul_out qkv[3] = {{&L->wq, s->q, qd, L->bq},
                                {&L->wk, kc + (int64_t)pos0 * kvd, kvd, L->bk},
                                {&L->wv, vc + (int64_t)pos0 * kvd, kvd, L->bv}};
        pl_matmul(qkv, 3, s->xn, n, a->batch, &s->mm, pool, ith, nth);
        pl_barrier(pool);

        for (int t = ith; t < n; t += nth) {
            const float *cos = s->rope_cos + (int64_t)(pos0 + t) * half;
            const float *sin = s->rope_sin + (int64_t)(pos0 + t) * half;
            pl_rope(s->q + t * qd, m->n_heads, m->head_dim, cos, sin, m->rope_interleaved);
            pl_rope(kc + (pos0 + t) * kvd, m->n_kv_heads, m->head_dim, cos, sin, m->rope_interleaved);
        }
        pl_barrier(pool);

        if (s->mm.sgemm && s->mm.per_thread_blas && a->batch >= PL_BLAS_MIN_TOKENS)
            pl_attention_blas(m, s->q, kc, vc, pos0, n, L->sliding_window, s->att,
                              s->scores + (int64_t)ith * PL_ATTN_QBLOCK * s->n_ctx, s->mm.sgemm, ith, nth);
        else
            pl_attention(m, s->q, kc, vc, pos0, n, L->sliding_window, s->att,
                         s->scores + (int64_t)ith * s->n_ctx, ith, nth);
        pl_barrier(pool);

        pl_matmul_out o[1] = {{&L->wo, s->tmp, dim, NULL}};
        pl_matmul(o, 1, s->att, n, a->batch, &s->mm, pool, ith, nth);
        pl_barrier(pool);

        residual_norm(a, 1, L->ffn_norm, 0, ith, nth);
        pl_barrier(pool);

        pl_matmul_glu(&L->w_gate, &L->w_up, s->xn, n, a->batch, m->activation, s->gate, s->up, m->ffn_dim,
                      &s->mm, pool, ith, nth);
        pl_barrier(pool);

        pl_matmul_out d[1] = {{&L->w_down, s->tmp, dim, NULL}};
        pl_matmul(d, 1, s->gate, n, a->batch, &s->mm, pool, ith, nth);
        pl_barrier(pool);
    }

    if (!a->logits) {
        residual_norm(a, 1, NULL, 0, ith, nth);
        return;
    }
    /* Only the rows whose logits are wanted go through the final norm and the head. */
    int first = a->all_logits ? 0 : n - 1;
    residual_norm(a, 1, m->out_norm, first, ith, nth);
    pl_barrier(pool);
    pl_matmul_out head[1] = {{&m->lm_head, a->logits, m->vocab_size, NULL}};
    pl_matmul(head, 1, s->xn + (int64_t)first * dim, n - first, a->batch, &s->mm, pool, ith, nth);
}

int pl_forward(const pl_model *m, pl_state *s, pl_pool *pool, const int32_t *tokens, int n,
               float *logits, int all_logits) {
    if (n < 1 || !tokens || !logits) return PL_ERR_ARGS;
    if (n > s->n_ctx - s->pos) return PL_ERR_CONTEXT;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->vocab_size) return PL_ERR_TOKEN;
    /* Batches longer than the buffers go through in chunks; only the last one's final token
     * matters unless every row's logits are wanted. */
    for (int done = 0; done < n;) {
        int chunk = n - done < s->n_batch ? n - done : s->n_batch;
        int last = done + chunk == n;
        float *out = all_logits ? logits + (int64_t)done * m->vocab_size : (last ? logits : NULL);
        forward_args a = {m, s, pool, tokens + done, chunk, out, all_logits, n};
        int blas_chunk = s->mm.sgemm && s->mm.per_thread_blas && n >= PL_BLAS_MIN_TOKENS;
        int blas_threads = blas_chunk ? m->blas.get_threads() : 0;
        if (blas_chunk) m->blas.set_threads(1);
        pl_pool_run(pool, forward_task, &a);
        if (blas_chunk) m->blas.set_threads(blas_threads);
        s->pos += chunk;
        done += chunk;
    }
    return PL_OK;
}
