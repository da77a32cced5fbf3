/* matmul.c — y = x · Wᵀ with W in its stored type, for one token (decode) or many (prefill).
 *
 * Decode is memory-bound: each weight row is read once, converted inside the dot kernel, and the
 * rows of every output of a group (q, k, v) are split over the threads as one range. Prefill is
 * compute-bound: weight tiles are widened to f32 and handed to SciPy's sgemm.
 */
#include "kernels.h"

int64_t pl_matmul_xq_bytes(int type, int64_t cols, int n) {
    const pl_type_traits *t = pl_traits(type);
    if (!t || t->vec_dot_type == PL_TYPE_F32) return 0;
    return (int64_t)n * pl_row_size(t->vec_dot_type, cols);
}

static void matmul_blas(const pl_matmul_out *o, const float *x, int n,
                        const pl_matmul_scratch *sc, pl_pool *pool, int ith, int nth) {
    const pl_tensor *w = o->w;
    const pl_type_traits *t = pl_traits(w->type);
    int cols = (int)w->cols, ldy = (int)o->ldy;
    int64_t wrow = pl_row_size(w->type, w->cols);
    int64_t tile_rows = sc->tile_floats / w->cols;
    if (w->type == PL_TYPE_F32) tile_rows = w->rows; /* used where it lies */
    for (int64_t r0 = 0; r0 < w->rows; r0 += tile_rows) {
        int m = (int)(w->rows - r0 < tile_rows ? w->rows - r0 : tile_rows);
        float *a = (float *)w->data + r0 * w->cols;
        if (w->type != PL_TYPE_F32) {
            a = sc->wtile;
            for (int64_t r = ith; r < m; r += nth)
                t->to_f32((const char *)w->data + (r0 + r) * wrow, a + r * w->cols, w->cols);
            pl_barrier(pool);
        }
        if (ith == 0) {
            float *y = o->y + r0, one = 1.0f, beta = o->bias ? 1.0f : 0.0f;
            if (o->bias)
                for (int tok = 0; tok < n; tok++)
                    for (int r = 0; r < m; r++) y[(int64_t)tok * ldy + r] = o->bias[r0 + r];
            char tr = 'T', nt = 'N';
            int nn = n, kk = cols, lda = cols, ldb = cols, ldc = ldy;
            /* column-major: yᵀ (m, n) = W_tile (m, cols) · xᵀ (cols, n) */
            sc->sgemm(&tr, &nt, &m, &nn, &kk, &one, a, &lda, (float *)x, &ldb, &beta, y, &ldc);
        }
        if (w->type != PL_TYPE_F32) pl_barrier(pool); /* the tile is reused */
    }
}

void pl_matmul(const pl_matmul_out *outs, int n_outs, const float *x, int n, int batch,
               const pl_matmul_scratch *sc, pl_pool *pool, int ith, int nth) {
    if (sc->sgemm && batch >= PL_BLAS_MIN_TOKENS) {
        for (int i = 0; i < n_outs; i++) matmul_blas(&outs[i], x, n, sc, pool, ith, nth);
        return;
    }
    /* Activations converted once per distinct vec_dot_type of the group. */
    const void *xv[PL_MATMUL_MAX_OUTS];
    int64_t xrow[PL_MATMUL_MAX_OUTS];
    int converted = 0;
    for (int i = 0; i < n_outs; i++) {
        const pl_tensor *w = outs[i].w;
        int vt = pl_traits(w->type)->vec_dot_type;
        xrow[i] = pl_row_size(vt, w->cols);
        xv[i] = x;
        if (vt == PL_TYPE_F32) continue;
        int same = -1;
        for (int j = 0; j < i; j++)
            if (xv[j] != x && pl_traits(outs[j].w->type)->vec_dot_type == vt &&
                outs[j].w->cols == w->cols)
                same = j;
        if (same >= 0) {
            xv[i] = xv[same];
            continue;
        }
        char *dst = (char *)sc->xq + i * sc->xq_region;
        const pl_type_traits *vtt = pl_traits(vt);
        for (int tok = ith; tok < n; tok += nth)
            vtt->from_f32(x + (int64_t)tok * w->cols, dst + tok * xrow[i], w->cols);
        xv[i] = dst;
        converted = 1;
    }
    if (converted) pl_barrier(pool);

    /* The group's rows as one range, cut in blocks of 16 so threads never share a cache line of y. */
    int64_t total = 0;
    for (int i = 0; i < n_outs; i++) total += outs[i].w->rows;
    int64_t blocks = (total + 15) / 16;
    int64_t begin = blocks * ith / nth * 16, end = blocks * (ith + 1) / nth * 16;
    if (end > total) end = total;
    int64_t base = 0;
    for (int i = 0; i < n_outs && begin < end; i++) {
        const pl_matmul_out *o = &outs[i];
        const pl_tensor *w = o->w;
        int64_t lo = begin > base ? begin - base : 0;
        int64_t hi = end - base < w->rows ? end - base : w->rows;
        pl_vec_dot_fn dot = pl_traits(w->type)->vec_dot;
        int64_t wrow = pl_row_size(w->type, w->cols);
        for (int64_t r = lo; r < hi; r++) {
            const void *wr = (const char *)w->data + r * wrow;
            float b = o->bias ? o->bias[r] : 0.0f;
            for (int tok = 0; tok < n; tok++)
                o->y[tok * o->ldy + r] = dot(wr, (const char *)xv[i] + tok * xrow[i], w->cols) + b;
        }
        base += w->rows;
    }
}
