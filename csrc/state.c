/* state.c — one sequence's memory: KV cache, rotary tables and activation buffers, allocated once
 * when the sequence starts so that decoding allocates nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* Calls fn on every matrix the forward multiplies by (tok_embd and pos_embd are only read by row). */
static void for_each_weight(const pl_model *m, void (*fn)(const pl_tensor *, void *), void *arg) {
    for (int l = 0; l < m->n_layers; l++)
        for (int i = 0; i < pl_layer_slot_count(); i++) {
            const pl_slot *slot = pl_layer_slot(i);
            const pl_tensor *t = (const pl_tensor *)((const char *)&m->layers[l] + slot->offset);
            if (slot->kind == PL_SLOT_MATRIX && t->data) fn(t, arg);
        }
    fn(&m->lm_head, arg);
}

typedef struct {
    int n_batch;
    int64_t xq_region, max_cols;
    int any_converted;
} scratch_needs;

static void measure(const pl_tensor *w, void *arg) {
    scratch_needs *need = arg;
    int64_t b = pl_matmul_xq_bytes(w->type, w->cols, need->n_batch);
    if (b > need->xq_region) need->xq_region = b;
    if (w->cols > need->max_cols) need->max_cols = w->cols;
    if (w->type != PL_TYPE_F32) need->any_converted = 1;
}

static void find_quantized(const pl_tensor *w, void *arg) {
    if (pl_traits(w->type)->vec_dot_type != PL_TYPE_F32) *(int *)arg = 1;
}

int pl_model_quantized(const pl_model *m) {
    int any = 0;
    for_each_weight(m, find_quantized, &any);
    return any;
}

void pl_state_free(pl_state *s) {
    if (!s) return;
    void *bufs[] = {s->k_cache, s->v_cache, s->kv_wide, s->rope_cos, s->rope_sin, s->x, s->xn, s->q, s->pos_row,
                     s->att, s->tmp, s->gate, s->up, s->scores, s->mm.wtile, s->kstage, s->vstage};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) pl_free_aligned(bufs[i]);
    pl_free_aligned(s->mm.xq);
    free(s);
}

pl_state *pl_state_create(const pl_model *m, int n_ctx, int n_batch, int n_threads, int kv_type) {
    if (n_ctx < 1 || n_batch < 1 || n_threads < 1) return NULL;
    if (!pl_kv_type_fits(m, kv_type)) return NULL;
    if (m->pos_embd.data && n_ctx > m->n_positions) return NULL; /* no position past the table */
    if (n_batch > n_ctx) n_batch = n_ctx;
    pl_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    s->n_threads = n_threads;
    s->kv_dim = m->n_kv_heads * m->head_dim;
    s->kv_type = kv_type;
    size_t f = sizeof(float), half = (size_t)m->n_rot / 2, qd = (size_t)m->n_heads * m->head_dim;
    size_t n_ropes = m->n_rot ? (size_t)m->n_ropes : 0;
    size_t cache = (size_t)m->n_layers * n_ctx * (size_t)pl_row_size(kv_type, s->kv_dim);
    s->cache_bytes = (int64_t)cache;
    s->k_cache = pl_alloc_aligned(cache);
    s->v_cache = pl_alloc_aligned(cache);
    s->rope_cos = pl_alloc_aligned(n_ropes * n_ctx * half * f);
    s->rope_sin = pl_alloc_aligned(n_ropes * n_ctx * half * f);
    s->pos_row = pl_alloc_aligned((size_t)n_threads * m->dim * f);
    /* a one-token step keeps a residual row and a normed row per thread (forward.c), and converts
     * its row for the matmuls once per thread (matmul.c) */
    const int rows = n_batch > n_threads ? n_batch : n_threads;
    s->x = pl_alloc_aligned((size_t)rows * m->dim * f);
    s->xn = pl_alloc_aligned((size_t)rows * m->dim * f);
    s->q = pl_alloc_aligned(n_batch * qd * f);
    s->att = pl_alloc_aligned(n_batch * qd * f);
    s->tmp = pl_alloc_aligned((size_t)n_batch * m->dim * f);
    s->gate = pl_alloc_aligned((size_t)n_batch * m->ffn_dim * f);
    s->up = pl_alloc_aligned((size_t)n_batch * m->ffn_dim * f);
    s->kstage = pl_alloc_aligned((size_t)n_batch * s->kv_dim * f);
    s->vstage = pl_alloc_aligned((size_t)n_batch * s->kv_dim * f);

    scratch_needs need = {rows, 0, 0, 0};
    for_each_weight(m, measure, &need);
    s->mm.xq_region = (need.xq_region + 63) / 64 * 64;
    s->mm.xq = pl_alloc_aligned((size_t)(PL_MATMUL_MAX_OUTS * s->mm.xq_region));
    /* Quantized weights multiply 8-bit activations at every batch size, and attention takes the
     * per-query path: a position's numbers are then the same in a prefill of any length, a decode
     * step and a batched step (sgemm's f32 activations would differ, and requantizing the next
     * layer's input amplifies any difference). Float weights keep sgemm from PL_BLAS_MIN_TOKENS. */
    s->mm.sgemm = pl_model_quantized(m) ? NULL : m->sgemm;
    s->mm.per_thread_blas = m->blas.set_threads && m->blas.get_threads;
    int64_t scores = (int64_t)n_threads * pl_attention_scores_floats(m, n_ctx, s->mm.sgemm != NULL);
    if (scores < (int64_t)m->n_heads * n_ctx) scores = (int64_t)m->n_heads * n_ctx; /* pl_attention_decode */
    s->scores = pl_alloc_aligned((size_t)scores * f);
    if (s->mm.sgemm && kv_type != PL_TYPE_F32) {
        s->kv_wide = pl_alloc_aligned((size_t)n_threads * 2 * n_ctx * m->head_dim * f);
        if (!s->kv_wide) goto fail;
    }
    if (s->mm.sgemm && need.any_converted) {
        /* 1 MB per thread: a tile stays in cache between being widened and multiplied. */
        s->mm.tile_floats = need.max_cols > (1 << 18) ? need.max_cols : (1 << 18);
        s->mm.wtile = pl_alloc_aligned((size_t)n_threads * (size_t)s->mm.tile_floats * f);
        if (!s->mm.wtile) goto fail;
    }
    if (!s->k_cache || !s->v_cache || !s->rope_cos || !s->rope_sin || !s->pos_row || !s->x || !s->xn || !s->q ||
        !s->att || !s->tmp || !s->gate || !s->up || !s->scores || !s->mm.xq || !s->kstage || !s->vstage)
        goto fail;

    return s;
fail:
    pl_state_free(s);
    return NULL;
}

void pl_state_rope_upto(pl_state *s, const pl_model *m, int end) {
    const size_t half = (size_t)m->n_rot / 2, n_ropes = m->n_rot ? (size_t)m->n_ropes : 0;
    if (end > s->n_ctx) end = s->n_ctx;
    /* Angles in float32, as transformers computes them (position × inv_freq, then cos/sin, then
     * the attention scale of scaled variants): each row depends on its position alone. */
    for (size_t r = 0; r < n_ropes; r++) {
        const pl_rope_table *rope = &m->ropes[r];
        float *cs = s->rope_cos + r * s->n_ctx * half, *sn = s->rope_sin + r * s->n_ctx * half;
        for (int p = s->rope_rows; p < end; p++)
            for (size_t i = 0; i < half; i++) {
                float angle = (float)p * rope->inv_freq[i];
                cs[p * half + i] = cosf(angle) * rope->scale;
                sn[p * half + i] = sinf(angle) * rope->scale;
            }
    }
    if (end > s->rope_rows) s->rope_rows = end;
}

int pl_kv_type_fits(const pl_model *m, int kv_type) {
    if (kv_type == PL_TYPE_F32 || kv_type == PL_TYPE_F16) return 1;
    /* a q8_0 row of a head is whole blocks, and attention widens it on the stack (attention.c) */
    return kv_type == PL_TYPE_Q8_0 && m->head_dim % 32 == 0 && m->head_dim <= PL_ATTN_WIDE_FLOATS;
}

int pl_state_pos(const pl_state *s) { return s->pos; }
int pl_state_n_ctx(const pl_state *s) { return s->n_ctx; }

int64_t pl_state_cache_bytes(const pl_state *s) { return 2 * s->cache_bytes; }

int pl_state_truncate(pl_state *s, int pos) {
    if (pos < 0 || pos > s->pos) return -1;
    s->pos = pos;
    return 0;
}
