/* convert.c — re-encoding a whole weight matrix into another type (quantize-on-load), row by row
 * over the thread pool: each row is widened to f32, then narrowed or quantized. */
#include <stdlib.h>

#include "kernels.h"

typedef struct {
    const pl_tensor *src;
    int dst_type;
    void *dst;
    float *scratch; /* (n_threads, src->cols) */
} convert_args;

static void convert_task(void *raw, int ith, int nth) {
    const convert_args *a = raw;
    const pl_tensor *w = a->src;
    const pl_type_traits *from = pl_traits(w->type), *to = pl_traits(a->dst_type);
    int64_t src_row = pl_row_size(w->type, w->cols), dst_row = pl_row_size(a->dst_type, w->cols);
    float *row = a->scratch + (int64_t)ith * w->cols;
    for (int64_t r = w->rows * ith / nth; r < w->rows * (ith + 1) / nth; r++) {
        from->to_f32((const char *)w->data + r * src_row, row, w->cols);
        pl_from_f32_fn encode = to->quantize_weights ? to->quantize_weights : to->from_f32;
        encode(row, (char *)a->dst + r * dst_row, w->cols);
    }
}

int pl_convert_tensor(pl_pool *pool, const pl_tensor *src, int dst_type, void *dst) {
    const pl_type_traits *from = pl_traits(src->type), *to = pl_traits(dst_type);
    if (!from || !to || !from->to_f32 || !to->from_f32) return PL_ERR_ARGS;
    if (pl_row_size(src->type, src->cols) < 0 || pl_row_size(dst_type, src->cols) < 0) return PL_ERR_ARGS;
    float *scratch = malloc((size_t)pl_pool_size(pool) * (size_t)src->cols * sizeof(float));
    if (!scratch) return PL_ERR_ARGS;
    convert_args a = {src, dst_type, dst, scratch};
    pl_pool_run(pool, convert_task, &a);
    free(scratch);
    return PL_OK;
}
