/* attention.c — causal grouped-query attention of a batch of queries over the KV cache. */
#include <string.h>

#include "kernels.h"

/* A query's probabilities over keys [first, first + len) into a trace's buffer. */
static void copy_probs(const pl_probs_out *probs, int h, int t, int first, const float *p, int len) {
    float *dst = probs->data + ((int64_t)h * probs->n_rows + probs->row0 + t) * probs->n_keys + first;
    memcpy(dst, p, (size_t)len * sizeof *p);
}

/* For token t of the batch (absolute position pos0 + t) and query head h:
 *   out[t, h] = softmax(scale · q[t, h] · K[j]ᵀ for j in the window) · V[j]
 * where the window is (p - W, p] with W = window, or [0, p] when window is 0, and K/V are the
 * head's KV group. With a soft-cap, scores become cap·tanh(score / cap) before the softmax. (t, h) pairs are dealt round-robin to the threads: later tokens cost more. */
void pl_attention(const pl_model *m, const float *q, const void *k_cache, const void *v_cache, int kv_type,
                  int pos0, int n, int window, float *out, float *scores, const pl_probs_out *probs,
                  int ith, int nth) {
    const int hd = m->head_dim, n_heads = m->n_heads;
    const int kv_dim = m->n_kv_heads * hd;
    const int group = n_heads / m->n_kv_heads;
    for (int item = ith; item < n * n_heads; item += nth) {
        int t = item / n_heads, h = item % n_heads;
        int p = pos0 + t;
        int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        const float *qh = q + (int64_t)t * n_heads * hd + (int64_t)h * hd;
        const int64_t head = (int64_t)(h / group) * hd;
        int len = p - lo + 1;
        if (kv_type == PL_TYPE_F16) {
            const uint16_t *kh = (const uint16_t *)k_cache + head + (int64_t)lo * kv_dim;
            for (int j = 0; j < len; j++) scores[j] = m->attn_scale * pl_vec.dot_f16(qh, kh + (int64_t)j * kv_dim, hd);
        } else {
            const float *kh = (const float *)k_cache + head + (int64_t)lo * kv_dim;
            for (int j = 0; j < len; j++) scores[j] = m->attn_scale * pl_vec.dot_f32(qh, kh + (int64_t)j * kv_dim, hd);
        }
        if (m->attn_softcap > 0) pl_softcap(scores, len, m->attn_softcap);
        pl_softmax(scores, len);
        if (probs) copy_probs(probs, h, t, lo, scores, len);
        float *oh = out + (int64_t)t * n_heads * hd + (int64_t)h * hd;
        for (int i = 0; i < hd; i++) oh[i] = 0.0f;
        if (kv_type == PL_TYPE_F16) {
            const uint16_t *vh = (const uint16_t *)v_cache + head + (int64_t)lo * kv_dim;
            for (int j = 0; j < len; j++) pl_vec.axpy_f16(oh, scores[j], vh + (int64_t)j * kv_dim, hd);
        } else {
            const float *vh = (const float *)v_cache + head + (int64_t)lo * kv_dim;
            for (int j = 0; j < len; j++) pl_vec.axpy_f32(oh, scores[j], vh + (int64_t)j * kv_dim, hd);
        }
    }
}

/* The same attention for a prefill batch, as two sgemm calls per (head, block of queries):
 *   S = scale · Q_h K_hᵀ over the keys the block can see, masked and softmaxed row by row,
 *   O_h = S V_h.
 * (head, block) pairs are dealt round-robin; each thread's sgemm runs single-threaded. */
void pl_attention_blas(const pl_model *m, const float *q, const void *k_cache, const void *v_cache, int kv_type,
                       int pos0, int n, int window, float *out, float *scores, float *kv_wide, pl_sgemm_fn sgemm,
                       const pl_probs_out *probs, int ith, int nth) {
    const int hd = m->head_dim, n_heads = m->n_heads;
    const int qd = n_heads * hd, kv_dim = m->n_kv_heads * hd;
    const int group = n_heads / m->n_kv_heads;
    const int n_blocks = (n + PL_ATTN_QBLOCK - 1) / PL_ATTN_QBLOCK;
    for (int item = ith; item < n_heads * n_blocks; item += nth) {
        int h = item % n_heads, b = item / n_heads;
        int t0 = b * PL_ATTN_QBLOCK, nq = n - t0 < PL_ATTN_QBLOCK ? n - t0 : PL_ATTN_QBLOCK;
        int p_first = pos0 + t0, p_last = p_first + nq - 1;
        int j0 = window > 0 && p_first - window + 1 > 0 ? p_first - window + 1 : 0;
        int len = p_last - j0 + 1; /* keys any query of the block sees */
        const float *qh = q + (int64_t)t0 * qd + (int64_t)h * hd;
        const int64_t at = (int64_t)j0 * kv_dim + (int64_t)(h / group) * hd;
        const float *kh, *vh;
        int ld_kv;
        if (kv_type == PL_TYPE_F16) {
            /* sgemm reads f32: the block's K/V rows of this head, widened into (len, hd) each */
            const pl_type_traits *f16 = pl_traits(PL_TYPE_F16);
            float *kw = kv_wide, *vw = kv_wide + (int64_t)len * hd;
            for (int j = 0; j < len; j++) {
                f16->to_f32((const uint16_t *)k_cache + at + (int64_t)j * kv_dim, kw + (int64_t)j * hd, hd);
                f16->to_f32((const uint16_t *)v_cache + at + (int64_t)j * kv_dim, vw + (int64_t)j * hd, hd);
            }
            kh = kw, vh = vw, ld_kv = hd;
        } else {
            kh = (const float *)k_cache + at, vh = (const float *)v_cache + at, ld_kv = kv_dim;
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
