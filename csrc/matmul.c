/* matmul.c — y = x · Wᵀ with W in its stored type, for one token (decode) or many (prefill).
 *
 * Quantized weights multiply activations quantized per row (the weight type's vec_dot_type) at
 * every batch size, through the packed kernels where the type has one (packed.h) and the dot
 * kernels otherwise: a row's result never depends on how many rows came with it. The rows of
 * every output of a group (q, k, v) are dealt to the threads as one range, each thread its own
 * part run by run, then what the others have left (row_deal), whatever the weights' type. Float
 * weights prefill through SciPy's sgemm (tiles widened to f32) from PL_BLAS_MIN_TOKENS tokens on.
 */
#include "kernels.h"
#include "packed.h"

int64_t pl_matmul_xq_bytes(int type, int64_t cols, int n) {
    const pl_type_traits *t = pl_traits(type);
    if (!t || t->vec_dot_type == PL_TYPE_F32) return 0;
    return (int64_t)n * pl_row_size(t->vec_dot_type, cols);
}

/* yᵀ (m, n) = W_rows (m, cols) · xᵀ (cols, n) in column-major terms, bias first if any. */
static void sgemm_rows(const pl_matmul_out *o, const float *a, int64_t r0, int m, const float *x, int n,
                       pl_sgemm_fn sgemm) {
    float *y = o->y + r0, one = 1.0f, beta = o->bias ? 1.0f : 0.0f;
    if (o->bias)
        for (int tok = 0; tok < n; tok++)
            for (int r = 0; r < m; r++) y[(int64_t)tok * o->ldy + r] = o->bias[r0 + r];
    char tr = 'T', nt = 'N';
    int nn = n, kk = (int)o->w->cols, lda = kk, ldb = kk, ldc = (int)o->ldy;
    sgemm(&tr, &nt, &m, &nn, &kk, &one, (float *)a, &lda, (float *)x, &ldb, &beta, y, &ldc);
}

/* Each thread takes a slice of the weight rows and, tile by tile, widens them into its own buffer
 * and multiplies: no thread waits for another until the matmul ends. */
static void row_range(int64_t rows, int ith, int nth, int64_t *begin, int64_t *end);

static void matmul_blas_per_thread(const pl_matmul_out *o, const float *x, int n,
                                   const pl_matmul_scratch *sc, int ith, int nth) {
    const pl_tensor *w = o->w;
    int64_t begin, end;
    row_range(w->rows, ith, nth, &begin, &end);
    if (w->type == PL_TYPE_F32) {
        if (end > begin) sgemm_rows(o, (const float *)w->data + begin * w->cols, begin, (int)(end - begin), x, n, sc->sgemm);
        return;
    }
    const pl_type_traits *t = pl_traits(w->type);
    int64_t wrow = pl_row_size(w->type, w->cols);
    int64_t tile_rows = sc->tile_floats / w->cols;
    float *tile = sc->wtile + (int64_t)ith * sc->tile_floats;
    for (int64_t r0 = begin; r0 < end; r0 += tile_rows) {
        int m = (int)(end - r0 < tile_rows ? end - r0 : tile_rows);
        for (int r = 0; r < m; r++)
            t->to_f32((const char *)w->data + (r0 + r) * wrow, tile + (int64_t)r * w->cols, w->cols);
        sgemm_rows(o, tile, r0, m, x, n, sc->sgemm);
    }
}

/* Without control of the BLAS's threads: all threads widen a tile, thread 0 multiplies it. */
static void matmul_blas_shared(const pl_matmul_out *o, const float *x, int n,
                               const pl_matmul_scratch *sc, pl_pool *pool, int ith, int nth) {
    const pl_tensor *w = o->w;
    if (w->type == PL_TYPE_F32) {
        if (ith == 0) sgemm_rows(o, w->data, 0, (int)w->rows, x, n, sc->sgemm);
        return;
    }
    const pl_type_traits *t = pl_traits(w->type);
    int64_t wrow = pl_row_size(w->type, w->cols);
    int64_t tile_rows = sc->tile_floats * nth / w->cols; /* the per-thread tiles, pooled */
    for (int64_t r0 = 0; r0 < w->rows; r0 += tile_rows) {
        int m = (int)(w->rows - r0 < tile_rows ? w->rows - r0 : tile_rows);
        for (int64_t r = ith; r < m; r += nth)
            t->to_f32((const char *)w->data + (r0 + r) * wrow, sc->wtile + r * w->cols, w->cols);
        pl_barrier(pool);
        if (ith == 0) sgemm_rows(o, sc->wtile, r0, m, x, n, sc->sgemm);
        pl_barrier(pool); /* the tile is reused */
    }
}

/* Rows [begin, end) of a matrix for thread ith: blocks of 16 rows, so threads never share a cache
 * line of y, and the same cut for every matrix of the same height. */
static void row_range(int64_t rows, int ith, int nth, int64_t *begin, int64_t *end) {
    pl_share(rows, 16, ith, nth, begin, end);
}

/* Converts x into each out's vec_dot_type (once per distinct type). Several rows: each thread the
 * rows t % nth, and the caller meets the other threads at a barrier before reading xv. One row:
 * every thread converts it into a row of the region of its own (the regions hold a row per thread),
 * the same bits, which it alone reads. */
static void prepare_activations(const pl_matmul_out *outs, int n_outs, const float *x, int n,
                               const pl_matmul_scratch *sc, int ith, int nth, const void **xv,
                               int64_t *xrow) {
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
        if (n == 1) {
            dst += ith * xrow[i];
            vtt->from_f32(x, dst, w->cols);
        } else {
            for (int tok = ith; tok < n; tok += nth)
                vtt->from_f32(x + (int64_t)tok * w->cols, dst + tok * xrow[i], w->cols);
        }
        xv[i] = dst;
    }
}

/* Rows [lo, hi) of a packed matrix. The kernel starts at a group of PL_PACK_ROWS rows: a range that
 * begins inside one (where outputs of unusual heights meet in a group's range) has that group
 * computed whole into scratch and its wanted rows copied — the same bits, as the kernel's results
 * do not depend on the rows computed with them. */
static void packed_rows(const pl_matmul_out *o, int64_t lo, int64_t hi, const void *xv, int64_t xrow, int n) {
    enum { TOKENS = 64 };
    const pl_tensor *w = o->w;
    int64_t aligned = (lo + PL_PACK_ROWS - 1) / PL_PACK_ROWS * PL_PACK_ROWS;
    int64_t head_end = aligned < hi ? aligned : hi;
    if (head_end > lo) {
        int64_t g0 = lo / PL_PACK_ROWS * PL_PACK_ROWS;
        int64_t g1 = g0 + PL_PACK_ROWS < w->rows ? g0 + PL_PACK_ROWS : w->rows;
        float group[PL_PACK_ROWS * TOKENS];
        for (int t0 = 0; t0 < n; t0 += TOKENS) {
            int nt = n - t0 < TOKENS ? n - t0 : TOKENS;
            pl_gemm_packed(w->type, w->packed, w->rows, w->cols, g0, g1, (const char *)xv + t0 * xrow, xrow, nt,
                           group, PL_PACK_ROWS);
            for (int t = 0; t < nt; t++)
                for (int64_t r = lo; r < head_end; r++)
                    o->y[(int64_t)(t0 + t) * o->ldy + r] = group[t * PL_PACK_ROWS + (r - g0)];
        }
    }
    if (hi > aligned) pl_gemm_packed(w->type, w->packed, w->rows, w->cols, aligned, hi, xv, xrow, n, o->y, o->ldy);
}

/* The bytes [from + ROW_PREFETCH_BYTES, + len) below end: a row's worth of the rows a few KiB
 * ahead, so that a range of short rows streams at a plain read's speed. */
enum { ROW_PREFETCH_BYTES = 4096 };
static inline void prefetch_ahead(const char *from, const char *end, int64_t len) {
    const int64_t left = end - from; /* offsets, not pointers: none is formed past the range */
    for (int64_t o = ROW_PREFETCH_BYTES; o < ROW_PREFETCH_BYTES + len && o < left; o += 64) PL_PREFETCH(from + o);
}

/* Rows [lo, hi) of o for n activation rows. A packed matrix goes through its GEMM, whose every
 * (row, token) result is the same for any n and any row range. Otherwise, with n ≥ 2 each weight
 * row goes through the multi-row kernel, which unpacks a weight block once for all n; its results
 * are vec_dot's bit for bit. Either way a row of a batch (or of a prefill) equals that token's
 * step alone. */
static void dot_rows(const pl_matmul_out *o, int64_t lo, int64_t hi, const void *xv, int64_t xrow, int n) {
    const pl_tensor *w = o->w;
    if (w->packed) {
        packed_rows(o, lo, hi, xv, xrow, n);
        for (int tok = 0; o->bias && tok < n; tok++)
            for (int64_t r = lo; r < hi; r++) o->y[tok * o->ldy + r] += o->bias[r];
        return;
    }
    pl_vec_dot_fn dot = pl_traits(w->type)->vec_dot;
    pl_vec_dot_rows_fn dot_n = n > 1 ? pl_traits(w->type)->vec_dot_rows : NULL;
    int64_t wrow = pl_row_size(w->type, w->cols);
    const char *range_end = (const char *)w->data + hi * wrow;
    for (int64_t r = lo; r < hi; r++) {
        const void *wr = (const char *)w->data + r * wrow;
        prefetch_ahead(wr, range_end, wrow);
        float b = o->bias ? o->bias[r] : 0.0f;
        if (dot_n) {
            float *y = o->y + r; /* y[tok · ldy], tok < n */
            dot_n(wr, xv, xrow, n, w->cols, y, o->ldy);
            for (int tok = 0; tok < n; tok++) y[tok * o->ldy] += b;
        } else {
            for (int tok = 0; tok < n; tok++)
                o->y[tok * o->ldy + r] = dot(wr, (const char *)xv + tok * xrow, w->cols) + b;
        }
    }
}

/* The float32 path for a few rows of a batch (the head of a prefill's last token): each weight row
 * widened once and dotted with every x row, so a matrix is not widened whole for one sgemm column. */
static void matmul_f32_few_rows(const pl_matmul_out *o, const float *x, int n, const pl_matmul_scratch *sc,
                                int ith, int nth) {
    const pl_tensor *w = o->w;
    int64_t begin, end;
    row_range(w->rows, ith, nth, &begin, &end);
    const pl_type_traits *t = pl_traits(w->type);
    int64_t wrow = pl_row_size(w->type, w->cols);
    float *row = sc->wtile ? sc->wtile + (int64_t)ith * sc->tile_floats : NULL;
    for (int64_t r = begin; r < end; r++) {
        const float *wr = (const float *)((const char *)w->data + r * wrow);
        if (w->type != PL_TYPE_F32) {
            t->to_f32((const char *)w->data + r * wrow, row, w->cols);
            wr = row;
        }
        float b = o->bias ? o->bias[r] : 0.0f;
        for (int tok = 0; tok < n; tok++)
            o->y[tok * o->ldy + r] = pl_vec.dot_f32(wr, x + (int64_t)tok * w->cols, w->cols) + b;
    }
}

/* Rows [begin, end) of the outputs taken as one range of sum(rows). */
static void group_rows(const pl_matmul_out *outs, int n_outs, int64_t begin, int64_t end, const void **xv,
                       const int64_t *xrow, int n) {
    int64_t base = 0;
    for (int i = 0; i < n_outs && begin < end; i++) {
        int64_t lo = begin > base ? begin - base : 0;
        int64_t hi = end - base < outs[i].w->rows ? end - base : outs[i].w->rows;
        if (hi > lo) dot_rows(&outs[i], lo, hi, xv[i], xrow[i], n);
        base += outs[i].w->rows;
    }
}

/* Rows dealt in 16-row blocks (row_range's, so that threads never share a cache line of y and
 * packed groups stay whole). Thread t owns the blocks row_range gives it and claims them front
 * first, half of what is left each time (pl_pool_claim), so that its runs follow each other in
 * memory and the hardware prefetcher streams them as one read (SmolLM2's decode matmuls ran 3-7%
 * faster than with one shared sequence of runs, which took turns between the threads). A thread that
 * has finished its own claims the back half of what another has left, so a thread the system stops
 * holds the others back by a run (each thread claiming its whole part at once streamed faster still
 * and lost more at the barriers). Runs are never under ~2^14 multiply-adds, against which a claim
 * costs little. Which thread computes a row changes none of its bits. */
typedef struct {
    pl_pool *pool;
    int64_t rows, blocks, least; /* the matrix (or group) rows, its blocks, the fewest blocks a run takes */
    int ith, nth, k;             /* k: the k-th range this thread claims from, its own first */
} row_deal;

static row_deal deal_rows(pl_pool *pool, int64_t rows, int64_t cols, int n, int ith, int nth) {
    int64_t least = (1 << 14) / (cols * n * 16);
    row_deal d = {pool, rows, (rows + 15) / 16, least > 1 ? least : 1, ith, nth, 0};
    return d;
}

/* The rows [lo, hi) of this thread's next run; 0 when every range is claimed. */
static int next_rows(row_deal *d, int64_t *lo, int64_t *hi) {
    for (; d->k < d->nth; d->k++) {
        const int owner = (d->ith + d->k) % d->nth;
        int64_t b0, b1, first;
        pl_share(d->blocks, 1, owner, d->nth, &b0, &b1);
        int64_t take = pl_pool_claim(d->pool, owner, b1 - b0, d->least, owner != d->ith, &first);
        if (take > 0) {
            *lo = (b0 + first) * 16;
            *hi = (b0 + first + take) * 16 < d->rows ? (b0 + first + take) * 16 : d->rows;
            return 1;
        }
    }
    return 0;
}

/* The activations in the weights' vec_dot types. Several rows: each thread its own rows of x, and a
 * barrier ends the conversion and completes x for the kernels that read it as is. One row (a decode
 * step): each thread converts it for itself, without a barrier (x is whole on entry). The rows are
 * then dealt (row_deal), whatever the weights' type, so that a stalled thread holds the others back
 * by a run, not by its share. */
static void start_rows(const pl_matmul_out *outs, int n_outs, const float *x, int n, const pl_matmul_scratch *sc,
                       pl_pool *pool, int ith, int nth, const void **xv, int64_t *xrow) {
    prepare_activations(outs, n_outs, x, n, sc, ith, nth, xv, xrow);
    if (n > 1) pl_barrier(pool);
}

void pl_matmul(const pl_matmul_out *outs, int n_outs, const float *x, int n, int batch,
               const pl_matmul_scratch *sc, pl_pool *pool, int ith, int nth) {
    if (sc->sgemm && batch >= PL_BLAS_MIN_TOKENS) {
        pl_barrier(pool); /* sgemm reads every row of x */
        for (int i = 0; i < n_outs; i++) {
            if (n < PL_FEW_ROWS)
                matmul_f32_few_rows(&outs[i], x, n, sc, ith, nth);
            else if (sc->per_thread_blas)
                matmul_blas_per_thread(&outs[i], x, n, sc, ith, nth);
            else
                matmul_blas_shared(&outs[i], x, n, sc, pool, ith, nth);
        }
        return;
    }
    const void *xv[PL_MATMUL_MAX_OUTS];
    int64_t xrow[PL_MATMUL_MAX_OUTS];
    start_rows(outs, n_outs, x, n, sc, pool, ith, nth, xv, xrow);

    /* The group's rows as one range: q, k and v together balance better than each alone. */
    int64_t total = 0, begin, end;
    for (int i = 0; i < n_outs; i++) total += outs[i].w->rows;
    row_deal deal = deal_rows(pool, total, outs[0].w->cols, n, ith, nth);
    while (next_rows(&deal, &begin, &end)) group_rows(outs, n_outs, begin, end, xv, xrow, n);
}

/* The MLP's activation on columns [begin, end) of every token's gate (and up) row. */
static void activate(int gated, int activation, float *gate, const float *up, int64_t ld, int n, int64_t begin,
                     int64_t end) {
    int rows = (int)(end - begin);
    for (int tok = 0; tok < n && rows > 0; tok++) {
        float *g = gate + tok * ld + begin;
        const float *u = up + tok * ld + begin;
        if (!gated)
            pl_vec.gelu(g, rows); /* pl_model_check allows a plain MLP with gelu_tanh only */
        else if (activation == PL_ACT_GELU_TANH)
            pl_vec.geglu(g, u, rows);
        else
            pl_swiglu(g, u, rows);
    }
}

void pl_matmul_glu(const pl_tensor *w_gate, const pl_tensor *w_up, const float *b_up, const float *x,
                   int n, int batch, int activation, float *gate, float *up, int64_t ld,
                   const pl_matmul_scratch *sc, pl_pool *pool, int ith, int nth) {
    /* Without a gate the up product is written where the activation runs: gate. */
    pl_matmul_out outs[2] = {{w_up, w_gate ? up : gate, ld, b_up}, {w_gate, gate, ld, NULL}};
    int n_outs = w_gate ? 2 : 1;
    if (sc->sgemm && batch >= PL_BLAS_MIN_TOKENS) {
        pl_barrier(pool); /* sgemm reads every row of x */
        for (int i = 0; i < n_outs; i++) {
            if (sc->per_thread_blas)
                matmul_blas_per_thread(&outs[i], x, n, sc, ith, nth); /* rows cut by row_range */
            else
                matmul_blas_shared(&outs[i], x, n, sc, pool, ith, nth);
        }
        if (!sc->per_thread_blas) pl_barrier(pool);
        int64_t begin, end;
        row_range(w_up->rows, ith, nth, &begin, &end);
        activate(w_gate != NULL, activation, gate, up, ld, n, begin, end);
        return;
    }
    const void *xv[2];
    int64_t xrow[2], lo, hi;
    start_rows(outs, n_outs, x, n, sc, pool, ith, nth, xv, xrow);
    row_deal deal = deal_rows(pool, w_up->rows, w_up->cols, n_outs * n, ith, nth);
    while (next_rows(&deal, &lo, &hi)) {
        for (int i = 0; i < n_outs; i++) dot_rows(&outs[i], lo, hi, xv[i], xrow[i], n);
        activate(w_gate != NULL, activation, gate, up, ld, n, lo, hi);
    }
}
