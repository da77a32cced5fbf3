/* attention.c — causal grouped-query attention of a batch of queries over the KV cache. */
#include "kernels.h"

/* For token t of the batch (absolute position pos0 + t) and query head h:
 *   out[t, h] = softmax(scale · q[t, h] · K[j]ᵀ for j in the window) · V[j]
 * where the window is (p - W, p] with W = window, or [0, p] when window is 0, and K/V are the
 * head's KV group. (t, h) pairs are dealt round-robin to the threads: later tokens cost more. */
void pl_attention(const pl_model *m, const float *q, const float *k_cache, const float *v_cache,
                  int pos0, int n, int window, float *out, float *scores, int ith, int nth) {
    const int hd = m->head_dim, n_heads = m->n_heads;
    const int kv_dim = m->n_kv_heads * hd;
    const int group = n_heads / m->n_kv_heads;
    for (int item = ith; item < n * n_heads; item += nth) {
        int t = item / n_heads, h = item % n_heads;
        int p = pos0 + t;
        int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        const float *qh = q + (int64_t)t * n_heads * hd + (int64_t)h * hd;
        const float *kh = k_cache + (int64_t)(h / group) * hd;
        const float *vh = v_cache + (int64_t)(h / group) * hd;
        int len = p - lo + 1;
        for (int j = 0; j < len; j++)
            scores[j] = m->attn_scale * pl_vec.dot_f32(qh, kh + (int64_t)(lo + j) * kv_dim, hd);
        pl_softmax(scores, len);
        float *oh = out + (int64_t)t * n_heads * hd + (int64_t)h * hd;
        for (int i = 0; i < hd; i++) oh[i] = 0.0f;
        for (int j = 0; j < len; j++) pl_vec.axpy_f32(oh, scores[j], vh + (int64_t)(lo + j) * kv_dim, hd);
    }
}
