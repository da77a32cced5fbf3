/* f32_activations.c — what multiplying a quantized model's stored weights by f32 activations would
 * cost a decode step, against pyllm's 8-bit activations (issue 33 item 5: the 8-bit rounding flips
 * near-ties such as SmolLM2 Q4_1's "Paris"; dtype="f32" avoids it by widening the weights, at 4-8x
 * the bytes read per token).
 *
 * The matrices of one SmolLM2-135M Q4_1 decode step (30 layers of q, k, v, o, gate, up and down in
 * q4_1, the tied 49,152-row head in q8_0; random blocks, finite scales: speed does not depend on the
 * values), multiplied by one activation row three ways, best of 15 sweeps (~96 MB each, far past the
 * caches, as in decode), on 1 and 2 threads:
 *   8-bit activations: the row quantized to q8_1/q8_0, then the packed kernel (what pyllm runs);
 *   f32, dequantize + dot: each weight row widened by the type's to_f32 into L1, then dot_f32;
 *   f32, fused (AVX-512 only): each block's nibbles or bytes widened in registers and multiplied in.
 *
 *     gcc -O3 -std=gnu11 -march=native -Icsrc -o /tmp/f32_activations benchmarks/f32_activations.c \
 *         csrc/[a-z]*.c -lm -lpthread && /tmp/f32_activations
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include "kernels.h"
#include "packed.h"
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
typedef struct { int type; int64_t rows, cols; char *w, *packed; } mat;
#if defined(__AVX512F__)
#define HAVE_FUSED 1
#else
#define HAVE_FUSED 0
#endif
static mat M[256]; static int nm; static float *X, *Y;
static int path, nth; /* the sweep's way and thread count */
#if defined(__AVX512F__)
#include <immintrin.h>
/* One row by one f32 activation row, every block widened in registers: d·Σq·x (+ m·Σx for q4_1). */
static float fused_row(int type, const char *w, const float *x, const float *sx, int64_t cols) {
    __m512 acc = _mm512_setzero_ps(); float accm = 0;
    int64_t nb = cols / 32;
    if (type == PL_TYPE_Q4_1) {
        for (int64_t b = 0; b < nb; b++) {
            const char *blk = w + b * 20; uint16_t dh, mh; memcpy(&dh, blk, 2); memcpy(&mh, blk + 2, 2);
            __m128i q = _mm_loadu_si128((const __m128i *)(blk + 4));
            __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, _mm_set1_epi8(15))));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(15))));
            __m512 s = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 32 * b + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(x + 32 * b)));
            acc = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(dh)), s, acc);
            accm += _cvtsh_ss(mh) * sx[b];
        }
    } else {
        for (int64_t b = 0; b < nb; b++) {
            const char *blk = w + b * 34; uint16_t dh; memcpy(&dh, blk, 2);
            __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18))));
            __m512 s = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 32 * b + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(x + 32 * b)));
            acc = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(dh)), s, acc);
        }
    }
    return _mm512_reduce_add_ps(acc) + accm;
}
#endif

static void *work(void *arg) {
    long ith = (long)arg;
    float buf[4096], sx[128]; /* a widened row; the activation's block sums, which q4_1's mins multiply */
    for (int i = 0; i < nm; i++) {
        mat *m = &M[i]; const pl_type_traits *t = pl_traits(m->type);
        int64_t r0 = m->rows * ith / nth / 8 * 8, r1 = ith == nth - 1 ? m->rows : m->rows * (ith + 1) / nth / 8 * 8;
        if (path == 0) {
            const pl_type_traits *vt = pl_traits(t->vec_dot_type);
            char xq[8192]; vt->from_f32(X, xq, m->cols);
            pl_gemm_packed(m->type, m->packed, m->rows, m->cols, r0, r1, xq, 0, 1, Y, m->rows);
        } else if (path == 2) {
#if defined(__AVX512F__)
            int64_t rs = pl_row_size(m->type, m->cols);
            for (int64_t b = 0; b < m->cols / 32; b++) { float t = 0; for (int e = 0; e < 32; e++) t += X[32 * b + e]; sx[b] = t; }
            for (int64_t r = r0; r < r1; r++) Y[r] = fused_row(m->type, m->w + r * rs, X, sx, m->cols);
#endif
        } else {
            int64_t rs = pl_row_size(m->type, m->cols);
            for (int64_t r = r0; r < r1; r++) { t->to_f32(m->w + r * rs, buf, m->cols); Y[r] = pl_vec.dot_f32(buf, X, m->cols); }
        }
    }
    return 0;
}
static void add(int type, int64_t rows, int64_t cols) {
    mat *m = &M[nm++]; m->type = type; m->rows = rows; m->cols = cols;
    int64_t rs = pl_row_size(type, cols); m->w = malloc(rs * rows);
    for (int64_t i = 0; i < rs * rows; i++) m->w[i] = rand();
    int bs = type == PL_TYPE_Q4_1 ? 20 : 34; /* f16 scales small and finite */
    for (int64_t b = 0; b < rs * rows / bs; b++) { uint16_t h = 0x2000 | (rand() & 0x3ff); memcpy(m->w + b * bs, &h, 2); if (type == PL_TYPE_Q4_1) memcpy(m->w + b * bs + 2, &h, 2); }
    m->packed = malloc(pl_packed_bytes(type, rows, cols));
    pl_pack_groups(type, m->w, rows, cols, m->packed, 0, (rows + 7) / 8);
}
int main(void) {
    pl_set_isa(pl_cpu_best_isa());
    for (int l = 0; l < 30; l++) {
        add(PL_TYPE_Q4_1, 576, 576); add(PL_TYPE_Q4_1, 192, 576); add(PL_TYPE_Q4_1, 192, 576); add(PL_TYPE_Q4_1, 576, 576);
        add(PL_TYPE_Q4_1, 1536, 576); add(PL_TYPE_Q4_1, 1536, 576); add(PL_TYPE_Q4_1, 576, 1536);
    }
    add(PL_TYPE_Q8_0, 49152, 576);
    X = malloc(4096 * 4); for (int i = 0; i < 4096; i++) X[i] = (rand() % 1000) / 500.0f - 1; Y = malloc(49152 * 4);
    for (nth = 1; nth <= 2; nth++)
        for (int rep = 0; rep < 3; rep++)
            for (path = 0; path < (HAVE_FUSED ? 3 : 2); path++) {
                double best = 1e9;
                for (int it = 0; it < 15; it++) {
                    double t = now(); pthread_t th[2];
                    for (long k = 1; k < nth; k++) pthread_create(&th[k], 0, work, (void *)k);
                    work(0);
                    for (long k = 1; k < nth; k++) pthread_join(th[k], 0);
                    t = now() - t; if (t < best) best = t;
                }
                printf("threads %d %s: %.2f ms\n", nth, path == 2 ? "f32 activations (fused)" : path ? "f32 activations (to_f32 + dot_f32)" : "8-bit activations (packed)", best * 1e3);
            }
}
