/* simd_avx512.c — f32/f16/bf16 kernels for x86-64 with AVX-512 (F, BW, VL, DQ). */
#include "kernels.h"

#if defined(PL_X86) && (defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER))
#include <immintrin.h>

PL_TARGET_AVX512 static inline __m512 load_bf16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

PL_TARGET_AVX512 static inline __m512 load_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

#define DOT_BODY(LOAD_W)                                                                \
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                     \
    __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();                     \
    int64_t i = 0;                                                                      \
    for (; i + 64 <= n; i += 64) {                                                      \
        acc0 = _mm512_fmadd_ps(LOAD_W(a + i), _mm512_loadu_ps(b + i), acc0);            \
        acc1 = _mm512_fmadd_ps(LOAD_W(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);  \
        acc2 = _mm512_fmadd_ps(LOAD_W(a + i + 32), _mm512_loadu_ps(b + i + 32), acc2);  \
        acc3 = _mm512_fmadd_ps(LOAD_W(a + i + 48), _mm512_loadu_ps(b + i + 48), acc3);  \
    }                                                                                   \
    for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(LOAD_W(a + i), _mm512_loadu_ps(b + i), acc0); \
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));

/* An f32 dot product is _mm512_reduce_add_ps of these lanes (DOT_BODY's accumulators summed),
 * then the scalar steps past the last multiple of 16: the single kernel and the multi-query ones
 * below share them, so they do the same operations. */
PL_TARGET_AVX512 static inline __m512 dot_f32_lanes(const float *k, const float *q, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), _mm512_loadu_ps(k + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 32), _mm512_loadu_ps(k + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 48), _mm512_loadu_ps(k + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), a0);
    return _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
}

PL_TARGET_AVX512 static inline float dot_f32_tail(float s, const float *q, const float *k, int64_t n) {
    for (int64_t i = n / 16 * 16; i < n; i++) s += q[i] * k[i];
    return s;
}

PL_TARGET_AVX512 static float dot_f32_avx512(const float *a, const float *b, int64_t n) {
    return dot_f32_tail(_mm512_reduce_add_ps(dot_f32_lanes(b, a, n)), a, b, n);
}

PL_TARGET_AVX512 static float vec_dot_f32_avx512(const void *w, const void *x, int64_t n) {
    return dot_f32_avx512(w, x, n);
}

PL_TARGET_AVX512 static float vec_dot_bf16_avx512(const void *w, const void *x, int64_t n) {
    const uint16_t *a = w;
    const float *b = x;
    DOT_BODY(load_bf16)
    for (; i < n; i++) s += pl_bf16_to_f32(a[i]) * b[i];
    return s;
}

PL_TARGET_AVX512 static float vec_dot_f16_avx512(const void *w, const void *x, int64_t n) {
    const uint16_t *a = w;
    const float *b = x;
    DOT_BODY(load_f16)
    for (; i < n; i++) s += pl_f16_to_f32(a[i]) * b[i];
    return s;
}

/* Every element by one fused multiply-add, the tail's under a mask: an element's bits do not depend on
 * where the range it lies in starts or ends (a decode step cuts the columns into runs of 8 between the
 * threads; a scalar tail would round a·x and the sum apart for some of them). */
PL_TARGET_AVX512 static void axpy_f32_avx512(float *y, float a, const float *x, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 sum = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, sum);
    }
}

/* ---------------------------------------------------------------- attention's multi-query kernels */

/* dot_f32_lanes for two queries against the same key, each key chunk loaded once for both. */
PL_TARGET_AVX512 static inline void dot_f32_lanes_pair(const float *k, const float *q0, const float *q1, int64_t n,
                                                       __m512 *out0, __m512 *out1) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps(), b2 = _mm512_setzero_ps(), b3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 k0 = _mm512_loadu_ps(k + i), k1 = _mm512_loadu_ps(k + i + 16);
        __m512 k2 = _mm512_loadu_ps(k + i + 32), k3 = _mm512_loadu_ps(k + i + 48);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + i), k0, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + i + 16), k1, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + i + 32), k2, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + i + 48), k3, a3);
        b0 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + i), k0, b0);
        b1 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + i + 16), k1, b1);
        b2 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + i + 32), k2, b2);
        b3 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + i + 48), k3, b3);
    }
    for (; i + 16 <= n; i += 16) {
        __m512 k0 = _mm512_loadu_ps(k + i);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + i), k0, a0);
        b0 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + i), k0, b0);
    }
    *out0 = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
    *out1 = _mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3));
}

/* _mm512_reduce_add_ps of sixteen vectors at once, bit for bit: it halves a vector three times
 * (lane l + lane l + 8, then l + 4, then l + 2) and adds the last two lanes; here each halving is
 * done for several vectors by one pair of shuffles (a + b and b + a round alike), and a last
 * permutation puts vector u's sum in lane u. */
PL_TARGET_AVX512 static inline __m512 reduce_add_x16(const __m512 *v) {
    __m512 h1[8], h2[4], h3[2];
    for (int p = 0; p < 8; p++) /* [v_p halved | v_{p+8} halved] */
        h1[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[p], v[p + 8], 0x44), _mm512_shuffle_f32x4(v[p], v[p + 8], 0xee));
    for (int p = 0; p < 4; p++) /* quarters: v_p, v_{p+8}, v_{p+4}, v_{p+12}, each halved twice */
        h2[p] = _mm512_add_ps(_mm512_shuffle_f32x4(h1[p], h1[p + 4], 0x88), _mm512_shuffle_f32x4(h1[p], h1[p + 4], 0xdd));
    for (int p = 0; p < 2; p++) /* in each quarter, two vectors' lanes 0 + 2 and 1 + 3 */
        h3[p] = _mm512_add_ps(_mm512_shuffle_ps(h2[p], h2[p + 2], 0x44), _mm512_shuffle_ps(h2[p], h2[p + 2], 0xee));
    __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(h3[0], h3[1], 0x88), _mm512_shuffle_ps(h3[0], h3[1], 0xdd));
    /* lane l of sums holds vector 0 2 1 3 8 10 9 11 4 6 5 7 12 14 13 15's: where vector u is */
    const __m512i lane_of = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
    return _mm512_permutexvar_ps(lane_of, sums);
}

/* Sixteen keys at a time, each query's sixteen reductions done together (the reductions, not the
 * multiplies, dominated 64-element dots one at a time), the queries two by two so that each key
 * chunk is loaded once per pair; the keys past the last sixteen one at a time. */
PL_TARGET_AVX512 static void dot_f32_qk_avx512(const float *const *qs, int nq, const float *k, int64_t ldk, int nk,
                                               int64_t n, float *out, int64_t ldo) {
    int j = 0;
    for (; j + 16 <= nk; j += 16) {
        int i = 0;
        for (; i + 2 <= nq; i += 2) {
            __m512 v[16], w[16];
            for (int u = 0; u < 16; u++) dot_f32_lanes_pair(k + (j + u) * ldk, qs[i], qs[i + 1], n, &v[u], &w[u]);
            _mm512_storeu_ps(out + i * ldo + j, reduce_add_x16(v));
            _mm512_storeu_ps(out + (i + 1) * ldo + j, reduce_add_x16(w));
        }
        if (i < nq) {
            __m512 v[16];
            for (int u = 0; u < 16; u++) v[u] = dot_f32_lanes(k + (j + u) * ldk, qs[i], n);
            _mm512_storeu_ps(out + i * ldo + j, reduce_add_x16(v));
        }
        if (n & 15)
            for (i = 0; i < nq; i++)
                for (int u = 0; u < 16; u++)
                    out[i * ldo + j + u] = dot_f32_tail(out[i * ldo + j + u], qs[i], k + (j + u) * ldk, n);
    }
    for (; j < nk; j++)
        for (int i = 0; i < nq; i++) out[i * ldo + j] = dot_f32_avx512(qs[i], k + j * ldk, n);
}

/* y += w[j]·x[j] for rows j = 0 .. nr - 1 in order, each element by the fused multiply-add that
 * axpy_f32_avx512 gives it (past the last multiple of 16 under a mask, as there), a 64-wide slab
 * of y held in registers across the rows instead of loaded and stored per row; the pair: two
 * queries over the same rows, each x chunk loaded once for both. */
PL_TARGET_AVX512 static inline void axpy_rows_f32(float *y, const float *w, const float *x, int64_t ldx, int nr,
                                                  int64_t n) {
    int64_t c = 0;
    for (; c + 64 <= n; c += 64) {
        __m512 y0 = _mm512_loadu_ps(y + c), y1 = _mm512_loadu_ps(y + c + 16);
        __m512 y2 = _mm512_loadu_ps(y + c + 32), y3 = _mm512_loadu_ps(y + c + 48);
        for (int j = 0; j < nr; j++) {
            const float *xr = x + j * ldx + c;
            __m512 va = _mm512_set1_ps(w[j]);
            y0 = _mm512_fmadd_ps(va, _mm512_loadu_ps(xr), y0);
            y1 = _mm512_fmadd_ps(va, _mm512_loadu_ps(xr + 16), y1);
            y2 = _mm512_fmadd_ps(va, _mm512_loadu_ps(xr + 32), y2);
            y3 = _mm512_fmadd_ps(va, _mm512_loadu_ps(xr + 48), y3);
        }
        _mm512_storeu_ps(y + c, y0), _mm512_storeu_ps(y + c + 16, y1);
        _mm512_storeu_ps(y + c + 32, y2), _mm512_storeu_ps(y + c + 48, y3);
    }
    for (; c < n; c += 16) {
        __mmask16 m = n - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - c)) - 1);
        __m512 y0 = _mm512_maskz_loadu_ps(m, y + c);
        for (int j = 0; j < nr; j++)
            y0 = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), _mm512_maskz_loadu_ps(m, x + j * ldx + c), y0);
        _mm512_mask_storeu_ps(y + c, m, y0);
    }
}

PL_TARGET_AVX512 static inline void axpy_rows_pair_f32(float *y0, float *y1, const float *w0, const float *w1,
                                                       const float *x, int64_t ldx, int nr, int64_t n) {
    int64_t c = 0;
    for (; c + 64 <= n; c += 64) {
        __m512 a0 = _mm512_loadu_ps(y0 + c), a1 = _mm512_loadu_ps(y0 + c + 16);
        __m512 a2 = _mm512_loadu_ps(y0 + c + 32), a3 = _mm512_loadu_ps(y0 + c + 48);
        __m512 b0 = _mm512_loadu_ps(y1 + c), b1 = _mm512_loadu_ps(y1 + c + 16);
        __m512 b2 = _mm512_loadu_ps(y1 + c + 32), b3 = _mm512_loadu_ps(y1 + c + 48);
        for (int j = 0; j < nr; j++) {
            const float *xr = x + j * ldx + c;
            __m512 x0 = _mm512_loadu_ps(xr), x1 = _mm512_loadu_ps(xr + 16);
            __m512 x2 = _mm512_loadu_ps(xr + 32), x3 = _mm512_loadu_ps(xr + 48);
            __m512 va = _mm512_set1_ps(w0[j]), vb = _mm512_set1_ps(w1[j]);
            a0 = _mm512_fmadd_ps(va, x0, a0), a1 = _mm512_fmadd_ps(va, x1, a1);
            a2 = _mm512_fmadd_ps(va, x2, a2), a3 = _mm512_fmadd_ps(va, x3, a3);
            b0 = _mm512_fmadd_ps(vb, x0, b0), b1 = _mm512_fmadd_ps(vb, x1, b1);
            b2 = _mm512_fmadd_ps(vb, x2, b2), b3 = _mm512_fmadd_ps(vb, x3, b3);
        }
        _mm512_storeu_ps(y0 + c, a0), _mm512_storeu_ps(y0 + c + 16, a1);
        _mm512_storeu_ps(y0 + c + 32, a2), _mm512_storeu_ps(y0 + c + 48, a3);
        _mm512_storeu_ps(y1 + c, b0), _mm512_storeu_ps(y1 + c + 16, b1);
        _mm512_storeu_ps(y1 + c + 32, b2), _mm512_storeu_ps(y1 + c + 48, b3);
    }
    for (; c < n; c += 16) {
        __mmask16 m = n - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - c)) - 1);
        __m512 a0 = _mm512_maskz_loadu_ps(m, y0 + c), b0 = _mm512_maskz_loadu_ps(m, y1 + c);
        for (int j = 0; j < nr; j++) {
            __m512 x0 = _mm512_maskz_loadu_ps(m, x + j * ldx + c);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(w0[j]), x0, a0);
            b0 = _mm512_fmadd_ps(_mm512_set1_ps(w1[j]), x0, b0);
        }
        _mm512_mask_storeu_ps(y0 + c, m, a0), _mm512_mask_storeu_ps(y1 + c, m, b0);
    }
}

/* Rows in chunks of PL_QK_ROWS, every query's part of a chunk before the next (the chunk stays in
 * L1); two queries with the same rows of the chunk go through the pair kernel. */
PL_TARGET_AVX512 static void axpy_f32_qk_avx512(float *const *ys, int nq, const float *ws, int64_t ldw,
                                                const int *first, const int *end, const float *x, int64_t ldx,
                                                int64_t n) {
    int last = 0;
    for (int i = 0; i < nq; i++) last = end[i] > last ? end[i] : last;
    for (int r0 = 0; r0 < last; r0 += PL_QK_ROWS)
        for (int i = 0; i < nq; i++) {
            int lo = first[i] > r0 ? first[i] : r0;
            int hi = end[i] < r0 + PL_QK_ROWS ? end[i] : r0 + PL_QK_ROWS;
            if (lo >= hi) continue;
            if (i + 1 < nq && lo == (first[i + 1] > r0 ? first[i + 1] : r0) &&
                hi == (end[i + 1] < r0 + PL_QK_ROWS ? end[i + 1] : r0 + PL_QK_ROWS)) {
                axpy_rows_pair_f32(ys[i], ys[i + 1], ws + i * ldw + lo, ws + (i + 1) * ldw + lo, x + lo * ldx, ldx,
                                   hi - lo, n);
                i++;
            } else {
                axpy_rows_f32(ys[i], ws + i * ldw + lo, x + lo * ldx, ldx, hi - lo, n);
            }
        }
}

PL_TARGET_AVX512 static void bf16_to_f32_avx512(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16(s + i));
    for (; i < n; i++) dst[i] = pl_bf16_to_f32(s[i]);
}

PL_TARGET_AVX512 static void f16_to_f32_avx512(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_f16(s + i));
    for (; i < n; i++) dst[i] = pl_f16_to_f32(s[i]);
}

int pl_install_simd_avx512(void) {
    /* The AVX2 f16 narrowing is as good here; start from it and widen what gains. */
    pl_install_simd_avx2();
    pl_traits_slot(PL_TYPE_F32)->vec_dot = vec_dot_f32_avx512;
    pl_traits_slot(PL_TYPE_F16)->vec_dot = vec_dot_f16_avx512;
    pl_traits_slot(PL_TYPE_F16)->to_f32 = f16_to_f32_avx512;
    pl_traits_slot(PL_TYPE_BF16)->vec_dot = vec_dot_bf16_avx512;
    pl_traits_slot(PL_TYPE_BF16)->to_f32 = bf16_to_f32_avx512;
    pl_vec.dot_f32 = dot_f32_avx512;
    pl_vec.axpy_f32 = axpy_f32_avx512;
    pl_vec.dot_f32_qk = dot_f32_qk_avx512;
    pl_vec.axpy_f32_qk = axpy_f32_qk_avx512;
    return 1;
}

#else
int pl_install_simd_avx512(void) { return 0; }
#endif
