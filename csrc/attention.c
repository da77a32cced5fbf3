/* attention.c — causal grouped-query attention of a batch of queries over the KV cache. */
#include <string.h>

#include "kernels.h"

/* A query's probabilities over keys [first, first + len) into a trace's buffer. */
static void copy_probs(const pl_probs_out *probs, int h, int t, int first, const float *p, int len) {
    float *dst = probs->data + ((int64_t)h * probs->n_rows + probs->row0 + t) * probs->n_keys + first;
    memcpy(dst, p, (size_t)len * sizeof *p);
}

/* Queries that read the same K/V rows go through the multi-query kernels together: up to
 * ATTN_TOKENS consecutive tokens times the heads of a KV group, ATTN_MAX_Q at most (the registers
 * and L1 gain nothing from more; each needs a row of scores). */
#define ATTN_TOKENS 4
#define ATTN_MAX_Q 16

int64_t pl_attention_scores_floats(const pl_model *m, int n_ctx, int sgemm) {
    int group = m->n_heads / m->n_kv_heads;
    int heads = group < ATTN_MAX_Q ? group : ATTN_MAX_Q;
    int tokens = ATTN_MAX_Q / heads < ATTN_TOKENS ? ATTN_MAX_Q / heads : ATTN_TOKENS;
    int64_t rows = (int64_t)heads * tokens;
    if (sgemm && rows < PL_ATTN_QBLOCK) rows = PL_ATTN_QBLOCK;
    return rows * n_ctx;
}

/* One item of work: tokens [t0, t0 + nt) of the batch × query heads [h0, h0 + nh), one KV head's. */
typedef struct {
    int t0, nt, h0, nh;
} attn_item;

/* How the batch is cut into items: tb tokens × hq heads each, blocks of tokens outermost. */
typedef struct {
    int tb, hq, chunks, n_kv, n_items;
} attn_split;

static attn_item item_at(const attn_split *sp, int n, int group, int i) {
    int c = i % sp->chunks, g = i / sp->chunks % sp->n_kv, b = i / sp->chunks / sp->n_kv;
    attn_item it = {b * sp->tb, n - b * sp->tb < sp->tb ? n - b * sp->tb : sp->tb, g * group + c * sp->hq, 0};
    it.nh = group - c * sp->hq < sp->hq ? group - c * sp->hq : sp->hq;
    return it;
}

/* The keys query t of the batch sees: [lo, p], p = pos0 + t. */
static int window_lo(int p, int window) { return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0; }

/* Work of an item, in key reads: later tokens see more keys. The constant stands for a query's
 * softmax and setup. */
static int64_t item_cost(const attn_item *it, int pos0, int window) {
    int64_t keys = 0;
    for (int t = it->t0; t < it->t0 + it->nt; t++) keys += pos0 + t - window_lo(pos0 + t, window) + 1 + 16;
    return keys * it->nh;
}

/* The largest items the scores scratch holds (each query a row over the keys the block sees), then
 * smaller ones while there are fewer than two per thread, so that the threads can be balanced. */
static attn_split split_batch(const pl_model *m, int pos0, int n, int window, int64_t n_scores, int nth) {
    const int group = m->n_heads / m->n_kv_heads;
    int64_t span = window > 0 && window + ATTN_TOKENS - 1 < pos0 + n ? window + ATTN_TOKENS - 1 : pos0 + n;
    int64_t rows = n_scores / span;
    if (rows > ATTN_MAX_Q) rows = ATTN_MAX_Q;
    if (rows < 1) rows = 1; /* the caller's scratch holds one query's keys at least */
    attn_split sp = {0, group < rows ? group : (int)rows, 0, m->n_kv_heads, 0};
    sp.tb = rows / sp.hq < ATTN_TOKENS ? (int)(rows / sp.hq) : ATTN_TOKENS;
    if (sp.tb > n) sp.tb = n;
    for (;;) {
        sp.chunks = (group + sp.hq - 1) / sp.hq;
        sp.n_items = (n + sp.tb - 1) / sp.tb * sp.n_kv * sp.chunks;
        if (sp.n_items >= 2 * nth) break;
        if (sp.tb > 1) sp.tb--;
        else if (sp.hq > 1) sp.hq--;
        else break;
    }
    return sp;
}

/* Where row j of KV head g's keys (which = 0) or values (1) starts. */
static inline const char *kv_row(const pl_kv_view *kv, int which, int g, int64_t j) {
    return (const char *)(which ? kv->v : kv->k) + pl_row_size(kv->type, g * kv->head_stride + j * kv->ld);
}

/* Rows [j, j + nr) of KV head g widened into f32 rows of head_dim at dst. Exact for f16 and q8_0
 * (an f16 scale times a small integer), so the f32 kernels over them give every path's bits. */
static void widen_rows(const pl_kv_view *kv, int which, int g, int64_t j, int nr, int hd, float *dst) {
    const pl_type_traits *t = pl_traits(kv->type);
    const char *src = kv_row(kv, which, g, j);
    if (kv->ld == hd) { /* head-major: the rows are one run */
        t->to_f32(src, dst, (int64_t)nr * hd);
        return;
    }
    const int64_t stride = pl_row_size(kv->type, kv->ld);
    for (int r = 0; r < nr; r++) t->to_f32(src + r * stride, dst + (int64_t)r * hd, hd);
}

/* scores[i · ld + j] = qs[i] · K[j0 + j] for j in [0, count), keys of KV head g. A q8_0 cache's
 * keys are widened a block of rows at a time on the stack, each block used by every query. */
static void key_dots(const pl_kv_view *kv, int g, int j0, int count, int hd, const float *const *qs, int nq,
                     float *scores, int64_t ld) {
    if (kv->type == PL_TYPE_Q8_0) {
        float wide[PL_ATTN_WIDE_FLOATS];
        const int rows = PL_ATTN_WIDE_FLOATS / hd;
        for (int c = 0; c < count; c += rows) {
            int nr = count - c < rows ? count - c : rows;
            widen_rows(kv, 0, g, j0 + c, nr, hd, wide);
            pl_vec.dot_f32_qk(qs, nq, wide, hd, nr, hd, scores + c, ld);
        }
    } else if (kv->type == PL_TYPE_F16) {
        pl_vec.dot_f16_qk(qs, nq, (const uint16_t *)kv_row(kv, 0, g, j0), kv->ld, count, hd, scores, ld);
    } else {
        pl_vec.dot_f32_qk(qs, nq, (const float *)kv_row(kv, 0, g, j0), kv->ld, count, hd, scores, ld);
    }
}

/* ys[i][0, width) += Σ ws[i · span + j] · V[j0 + j][d0, d0 + width) over j in [first[i], end[i]) in
 * order, values of KV head g; a q8_0 cache's rows widened a block at a time, as key_dots. Every
 * element's sum is the same whatever columns come with it. */
static void value_sums(const pl_kv_view *kv, int g, int j0, int span, int hd, int d0, int width, float *const *ys,
                       int nq, const float *ws, const int *first, const int *end) {
    if (kv->type == PL_TYPE_Q8_0) {
        float wide[PL_ATTN_WIDE_FLOATS];
        const int rows = PL_ATTN_WIDE_FLOATS / hd;
        int f[ATTN_MAX_Q], e[ATTN_MAX_Q];
        for (int c = 0; c < span; c += rows) {
            int nr = span - c < rows ? span - c : rows, lo = nr, hi = 0;
            for (int i = 0; i < nq; i++) { /* each query's rows of this block, and the block's used rows */
                f[i] = first[i] - c < 0 ? 0 : first[i] - c < nr ? first[i] - c : nr;
                e[i] = end[i] - c < 0 ? 0 : end[i] - c < nr ? end[i] - c : nr;
                if (f[i] < e[i]) lo = f[i] < lo ? f[i] : lo, hi = e[i] > hi ? e[i] : hi;
            }
            if (lo >= hi) continue;
            widen_rows(kv, 1, g, j0 + c + lo, hi - lo, hd, wide + (int64_t)lo * hd);
            pl_vec.axpy_f32_qk(ys, nq, ws + c, span, f, e, wide + d0, hd, width);
        }
    } else if (kv->type == PL_TYPE_F16) {
        pl_vec.axpy_f16_qk(ys, nq, ws, span, first, end, (const uint16_t *)kv_row(kv, 1, g, j0) + d0, kv->ld, width);
    } else {
        pl_vec.axpy_f32_qk(ys, nq, ws, span, first, end, (const float *)kv_row(kv, 1, g, j0) + d0, kv->ld, width);
    }
}

/* Scores, softmax and weighted sum of one item's queries (token-major: query i is token t0 + i / nh,
 * head h0 + i % nh), every query's operations those of pl_attention_per_query. */
static void attend_item(const pl_model *m, const attn_item *it, const float *q, const pl_kv_view *kv, int pos0,
                        int window, float *out, float *scores, const pl_probs_out *probs) {
    const int hd = m->head_dim, qd = m->n_heads * hd;
    const int group = m->n_heads / m->n_kv_heads;
    const int nq = it->nt * it->nh;
    const int j0 = window_lo(pos0 + it->t0, window), span = pos0 + it->t0 + it->nt - j0; /* keys [j0, j0 + span) */
    const int g = it->h0 / group;
    const float *qs[ATTN_MAX_Q] = {0};
    float *ys[ATTN_MAX_Q] = {0};
    int first[ATTN_MAX_Q], end[ATTN_MAX_Q];
    for (int i = 0; i < nq; i++) {
        int t = it->t0 + i / it->nh, h = it->h0 + i % it->nh;
        qs[i] = q + (int64_t)t * qd + (int64_t)h * hd;
        ys[i] = out + (int64_t)t * qd + (int64_t)h * hd;
        first[i] = window_lo(pos0 + t, window) - j0, end[i] = pos0 + t - j0 + 1;
    }
    /* every query's dots with every key of the block; each uses its own [first, end) */
    key_dots(kv, g, j0, span, hd, qs, nq, scores, span);
    for (int i = 0; i < nq; i++) {
        float *row = scores + (int64_t)i * span + first[i];
        int len = end[i] - first[i];
        for (int j = 0; j < len; j++) row[j] = m->attn_scale * row[j];
        if (m->attn_softcap > 0) pl_softcap(row, len, m->attn_softcap);
        pl_softmax(row, len);
        if (probs) copy_probs(probs, it->h0 + i % it->nh, it->t0 + i / it->nh, j0 + first[i], row, len);
        for (int e = 0; e < hd; e++) ys[i][e] = 0.0f;
    }
    value_sums(kv, g, j0, span, hd, 0, hd, ys, nq, scores, first, end);
}

/* Whether thread ith owns the item that follows items of cost before, out of total: the one whose
 * share of total the middle of the item's cost falls in. */
static int dealt_to(int64_t before, int64_t cost, int64_t total, int ith, int nth) {
    int64_t owner = (2 * before + cost) * nth / (2 * total);
    return owner == ith || (owner >= nth && ith == nth - 1);
}

/* Items are cut by split_batch and dealt in order as contiguous runs of about equal cost: each
 * thread an item's share by where the middle of its cost falls. */
void pl_attention(const pl_model *m, const float *q, const pl_kv_view *kv, int pos0, int n, int window, float *out,
                  float *scores, int64_t n_scores, const pl_probs_out *probs, int ith, int nth) {
    const int group = m->n_heads / m->n_kv_heads;
    attn_split sp = split_batch(m, pos0, n, window, n_scores, nth);
    int64_t total = 0;
    for (int i = 0; i < sp.n_items; i++) {
        attn_item it = item_at(&sp, n, group, i);
        total += item_cost(&it, pos0, window);
    }
    int64_t before = 0;
    for (int i = 0; i < sp.n_items; i++) {
        attn_item it = item_at(&sp, n, group, i);
        int64_t cost = item_cost(&it, pos0, window);
        int mine = dealt_to(before, cost, total, ith, nth);
        before += cost;
        if (mine)
            attend_item(m, &it, q, kv, pos0, window, out, scores, probs);
    }
}

/* How many rows from t on are consecutive tokens of one sequence: the same cache, each at the
 * position after the one before, their query and output rows consecutive too (a speculative
 * round's rows in a batched step), so that they can share key reads as pl_attention's tokens do. */
static int run_at(const pl_model *m, pl_attn_row_fn row_of, const void *ctx, int t, int n, pl_attn_row *first) {
    const int64_t qd = (int64_t)m->n_heads * m->head_dim;
    pl_attn_row next;
    row_of(ctx, t, first);
    int len = 1;
    for (; t + len < n; len++) {
        row_of(ctx, t + len, &next);
        if (next.kv.k != first->kv.k || next.pos != first->pos + len || next.q != first->q + len * qd ||
            next.out != first->out + len * qd)
            break;
    }
    return len;
}

void pl_attention_rows(const pl_model *m, pl_attn_row_fn row_of, const void *ctx, int n, int window, float *scores,
                       int64_t n_scores, int ith, int nth) {
    const int group = m->n_heads / m->n_kv_heads;
    pl_attn_row row;
    int64_t longest = 1, total = 0; /* keys of the longest row; the cost of all (as item_cost counts it) */
    for (int t = 0; t < n; t++) {
        row_of(ctx, t, &row);
        int64_t keys = row.pos - window_lo(row.pos, window) + 1;
        longest = keys > longest ? keys : longest;
        total += (keys + 16) * m->n_heads;
    }
    /* the widest items the scratch holds for the longest row: up to tb tokens of a run (each row
     * its own run where the rows are other sequences') times hq of one KV head's queries */
    int64_t fit = n_scores / (longest + (window > 0 ? ATTN_TOKENS - 1 : 0)); /* a block's keys, windowed */
    if (fit > ATTN_MAX_Q) fit = ATTN_MAX_Q;
    int hq = group < fit ? group : fit > 1 ? (int)fit : 1;
    int tb = fit / hq < ATTN_TOKENS ? (int)(fit / hq) : ATTN_TOKENS;
    if (tb < 1) tb = 1;
    for (;;) { /* items to balance: smaller ones while there are fewer than two a thread */
        int64_t items = 0;
        for (int t = 0, len; t < n; t += len) {
            len = run_at(m, row_of, ctx, t, n, &row);
            items += (len + tb - 1) / tb;
        }
        items *= (int64_t)m->n_kv_heads * ((group + hq - 1) / hq);
        if (items >= 2 * nth) break;
        if (tb > 1) tb--;
        else if (hq > 1) hq--;
        else break;
    }
    const int chunks = (group + hq - 1) / hq;
    /* items in order (run, block of tb of its tokens, KV head, chunk of its queries); each thread
     * the items whose cost's middle falls in its share, as pl_attention deals */
    int64_t before = 0;
    for (int t = 0, len; t < n; t += len) {
        len = run_at(m, row_of, ctx, t, n, &row);
        for (int b = 0; b < len; b += tb)
            for (int g = 0; g < m->n_kv_heads; g++)
                for (int c = 0; c < chunks; c++) {
                    attn_item it = {b, len - b < tb ? len - b : tb, g * group + c * hq,
                                    group - c * hq < hq ? group - c * hq : hq};
                    int64_t cost = item_cost(&it, row.pos, window);
                    int mine = dealt_to(before, cost, total, ith, nth);
                    before += cost;
                    if (mine)
                        attend_item(m, &it, row.q, &row.kv, row.pos, window, row.out, scores, NULL);
                }
    }
}

void pl_attention_decode(const pl_model *m, const float *q, const pl_kv_view *kv, int pos, int window, float *out,
                         float *scores, const pl_probs_out *probs, pl_pool *pool, int ith, int nth) {
    const int hd = m->head_dim, group = m->n_heads / m->n_kv_heads;
    const int j0 = window_lo(pos, window), span = pos - j0 + 1; /* keys [j0, pos] */
    const float *qs[ATTN_MAX_Q];
    float *ys[ATTN_MAX_Q];
    int first[ATTN_MAX_Q] = {0}, end[ATTN_MAX_Q];
    for (int i = 0; i < ATTN_MAX_Q; i++) end[i] = span;

    /* 1. Scores: the keys of every KV head as one range (each head's padded to whole blocks of 8,
     * the kernels' unit), each thread a run of it against all of the head's queries. */
    const int64_t padded = (span + 7) / 8 * 8;
    int64_t lo, hi;
    pl_share(m->n_kv_heads * padded, 8, ith, nth, &lo, &hi);
    for (int64_t f = lo; f < hi;) {
        int g = (int)(f / padded), j = (int)(f % padded);
        int64_t stop = (g + 1) * padded < hi ? (g + 1) * padded : hi;
        int count = (int)(stop - g * padded < span ? stop - g * padded : span) - j;
        for (int h0 = g * group; h0 < (g + 1) * group && count > 0; h0 += ATTN_MAX_Q) {
            int nq = (g + 1) * group - h0 < ATTN_MAX_Q ? (g + 1) * group - h0 : ATTN_MAX_Q;
            for (int i = 0; i < nq; i++) qs[i] = q + (int64_t)(h0 + i) * hd;
            key_dots(kv, g, j0 + j, count, hd, qs, nq, scores + (int64_t)h0 * span + j, span);
        }
        f = stop;
    }
    pl_barrier(pool);

    /* 2. Each query's softmax, the heads dealt to the threads. */
    pl_share(m->n_heads, 1, ith, nth, &lo, &hi);
    for (int64_t h = lo; h < hi; h++) {
        float *row = scores + h * span;
        for (int j = 0; j < span; j++) row[j] = m->attn_scale * row[j];
        if (m->attn_softcap > 0) pl_softcap(row, span, m->attn_softcap);
        pl_softmax(row, span);
        if (probs) copy_probs(probs, (int)h, 0, j0, row, span);
    }
    pl_barrier(pool);

    /* 3. The weighted sums: every KV head's columns as one range of 8-column chunks, each thread a
     * run of it over all the head's keys and queries. */
    const int chunks = (hd + 7) / 8;
    pl_share((int64_t)m->n_kv_heads * chunks, 1, ith, nth, &lo, &hi);
    for (int64_t c = lo; c < hi;) {
        int g = (int)(c / chunks), c0 = (int)(c % chunks);
        int64_t stop = (g + 1) * (int64_t)chunks < hi ? (g + 1) * (int64_t)chunks : hi;
        int d0 = c0 * 8, d1 = (int)(stop - (int64_t)g * chunks) * 8 < hd ? (int)(stop - (int64_t)g * chunks) * 8 : hd;
        for (int h0 = g * group; h0 < (g + 1) * group; h0 += ATTN_MAX_Q) {
            int nq = (g + 1) * group - h0 < ATTN_MAX_Q ? (g + 1) * group - h0 : ATTN_MAX_Q;
            for (int i = 0; i < nq; i++) {
                ys[i] = out + (int64_t)(h0 + i) * hd + d0;
                for (int e = 0; e < d1 - d0; e++) ys[i][e] = 0.0f;
            }
            value_sums(kv, g, j0, span, hd, d0, d1 - d0, ys, nq, scores + (int64_t)h0 * span, first, end);
        }
        c = stop;
    }
}

/* The reference pl_attention is tested against, bit for bit: one query at a time, each score one
 * dot_f32 / dot_f16 call, the output one axpy per key in key order. For token t of the batch
 * (absolute position p = pos0 + t) and query head h:
 *   out[t, h] = softmax(scale · q[t, h] · K[j]ᵀ for j in the window) · V[j]
 * where the window is (p - W, p] with W = window, or [0, p] when window is 0, and K/V are the
 * head's KV group. With a soft-cap, scores become cap·tanh(score / cap) before the softmax. */
void pl_attention_per_query(const pl_model *m, const float *q, const pl_kv_view *kv, int pos0, int n, int window,
                            float *out, float *scores, const pl_probs_out *probs, int ith, int nth) {
    const int hd = m->head_dim, n_heads = m->n_heads;
    const int64_t ld = kv->ld;
    const int group = n_heads / m->n_kv_heads;
    float row[PL_ATTN_WIDE_FLOATS]; /* a q8_0 key or value, widened */
    for (int item = ith; item < n * n_heads; item += nth) {
        int t = item / n_heads, h = item % n_heads, g = h / group;
        int p = pos0 + t;
        int lo = window_lo(p, window);
        const float *qh = q + (int64_t)t * n_heads * hd + (int64_t)h * hd;
        int len = p - lo + 1;
        const void *kh = kv_row(kv, 0, g, lo), *vh = kv_row(kv, 1, g, lo);
        for (int j = 0; j < len; j++) {
            float dot;
            if (kv->type == PL_TYPE_Q8_0) {
                widen_rows(kv, 0, g, lo + j, 1, hd, row);
                dot = pl_vec.dot_f32(qh, row, hd);
            } else if (kv->type == PL_TYPE_F16) {
                dot = pl_vec.dot_f16(qh, (const uint16_t *)kh + j * ld, hd);
            } else {
                dot = pl_vec.dot_f32(qh, (const float *)kh + j * ld, hd);
            }
            scores[j] = m->attn_scale * dot;
        }
        if (m->attn_softcap > 0) pl_softcap(scores, len, m->attn_softcap);
        pl_softmax(scores, len);
        if (probs) copy_probs(probs, h, t, lo, scores, len);
        float *oh = out + (int64_t)t * n_heads * hd + (int64_t)h * hd;
        for (int i = 0; i < hd; i++) oh[i] = 0.0f;
        for (int j = 0; j < len; j++) {
            if (kv->type == PL_TYPE_Q8_0) {
                widen_rows(kv, 1, g, lo + j, 1, hd, row);
                pl_vec.axpy_f32(oh, scores[j], row, hd);
            } else if (kv->type == PL_TYPE_F16) {
                pl_vec.axpy_f16(oh, scores[j], (const uint16_t *)vh + j * ld, hd);
            } else {
                pl_vec.axpy_f32(oh, scores[j], (const float *)vh + j * ld, hd);
            }
        }
    }
}

/* The same attention for a prefill batch, as two sgemm calls per (head, block of queries):
 *   S = scale · Q_h K_hᵀ over the keys the block can see, masked and softmaxed row by row,
 *   O_h = S V_h.
 * (head, block) pairs are dealt round-robin; each thread's sgemm runs single-threaded. */
void pl_attention_blas(const pl_model *m, const float *q, const pl_kv_view *kv, int pos0, int n, int window,
                       float *out, float *scores, float *kv_wide, pl_sgemm_fn sgemm, const pl_probs_out *probs,
                       int ith, int nth) {
    const int hd = m->head_dim, n_heads = m->n_heads;
    const int qd = n_heads * hd;
    const int group = n_heads / m->n_kv_heads;
    const int n_blocks = (n + PL_ATTN_QBLOCK - 1) / PL_ATTN_QBLOCK;
    for (int item = ith; item < n_heads * n_blocks; item += nth) {
        int h = item % n_heads, b = item / n_heads;
        int t0 = b * PL_ATTN_QBLOCK, nq = n - t0 < PL_ATTN_QBLOCK ? n - t0 : PL_ATTN_QBLOCK;
        int p_first = pos0 + t0, p_last = p_first + nq - 1;
        int j0 = window > 0 && p_first - window + 1 > 0 ? p_first - window + 1 : 0;
        int len = p_last - j0 + 1; /* keys any query of the block sees */
        const float *qh = q + (int64_t)t0 * qd + (int64_t)h * hd;
        const float *kh, *vh;
        int ld_kv;
        if (kv->type != PL_TYPE_F32) {
            /* sgemm reads f32: the block's K/V rows of this head, widened into (len, hd) each */
            float *kw = kv_wide, *vw = kv_wide + (int64_t)len * hd;
            widen_rows(kv, 0, h / group, j0, len, hd, kw);
            widen_rows(kv, 1, h / group, j0, len, hd, vw);
            kh = kw, vh = vw, ld_kv = hd;
        } else {
            kh = (const float *)kv_row(kv, 0, h / group, j0), vh = (const float *)kv_row(kv, 1, h / group, j0);
            ld_kv = (int)kv->ld;
        }
        /* column-major: Sᵀ (len, nq) = K_h (len, hd) · Q_hᵀ (hd, nq) */
        char tr = 'T', nt = 'N';
        float scale = m->attn_scale, zero = 0.0f, one = 1.0f;
        int mm = len, nn = nq, kk = hd, lda = ld_kv, ldb = qd, ldc = len;
        sgemm(&tr, &nt, &mm, &nn, &kk, &scale, (float *)kh, &lda, (float *)qh, &ldb, &zero, scores, &ldc);
        for (int t = 0; t < nq; t++) {
            float *row = scores + (int64_t)t * len;
            int p = p_first + t;
            int lo = window > 0 && p - window + 1 > j0 ? p - window + 1 - j0 : 0, hi = p - j0 + 1;
            if (m->attn_softcap > 0) pl_softcap(row + lo, hi - lo, m->attn_softcap);
            pl_softmax(row + lo, hi - lo);
            for (int j = 0; j < lo; j++) row[j] = 0.0f;
            for (int j = hi; j < len; j++) row[j] = 0.0f;
            if (probs) copy_probs(probs, h, t0 + t, j0 + lo, row + lo, hi - lo);
        }
        /* column-major: O_hᵀ (hd, nq) = V_hᵀ (hd, len) · Sᵀ (len, nq) */
        float *oh = out + (int64_t)t0 * qd + (int64_t)h * hd;
        mm = hd, nn = nq, kk = len, lda = ld_kv, ldb = len, ldc = qd;
        sgemm(&nt, &nt, &mm, &nn, &kk, &one, (float *)vh, &lda, scores, &ldb, &zero, oh, &ldc);
    }
}
