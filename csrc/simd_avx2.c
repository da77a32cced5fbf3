/* simd_avx2.c — f32/f16/bf16 kernels for x86-64 with AVX2, FMA and F16C. */
#include "kernels.h"

#if defined(PL_X86) && (defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER))
#include <immintrin.h>
#include <math.h>

PL_TARGET_AVX2 static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

PL_TARGET_AVX2 static inline __m256 load_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

PL_TARGET_AVX2 static inline __m256 load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* Four accumulators hide the FMA latency; the loads are the bound anyway. */
#define DOT_BODY(LOAD_W)                                                              \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                   \
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();                   \
    int64_t i = 0;                                                                    \
    for (; i + 32 <= n; i += 32) {                                                    \
        acc0 = _mm256_fmadd_ps(LOAD_W(a + i), _mm256_loadu_ps(b + i), acc0);          \
        acc1 = _mm256_fmadd_ps(LOAD_W(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);  \
        acc2 = _mm256_fmadd_ps(LOAD_W(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2); \
        acc3 = _mm256_fmadd_ps(LOAD_W(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3); \
    }                                                                                 \
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(LOAD_W(a + i), _mm256_loadu_ps(b + i), acc0);

/* A dot product is hsum256 of its lanes, then the scalar tail past the last multiple of 8; the
 * single and the multi-key kernels below share these, so they do the same operations. */
PL_TARGET_AVX2 static inline __m256 dot_f32_lanes(const float *a, const float *b, int64_t n) {
    DOT_BODY(_mm256_loadu_ps)
    return _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
}

PL_TARGET_AVX2 static inline float dot_f32_tail(float s, const float *a, const float *b, int64_t n) {
    for (int64_t i = n & ~(int64_t)7; i < n; i++) s += a[i] * b[i];
    return s;
}

PL_TARGET_AVX2 static float dot_f32_avx2(const float *a, const float *b, int64_t n) {
    return dot_f32_tail(hsum256(dot_f32_lanes(a, b, n)), a, b, n);
}

PL_TARGET_AVX2 static float vec_dot_f32_avx2(const void *w, const void *x, int64_t n) {
    return dot_f32_avx2(w, x, n);
}

PL_TARGET_AVX2 static float vec_dot_bf16_avx2(const void *w, const void *x, int64_t n) {
    const uint16_t *a = w;
    const float *b = x;
    DOT_BODY(load_bf16)
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) s += pl_bf16_to_f32(a[i]) * b[i];
    return s;
}

PL_TARGET_AVX2 static inline __m256 dot_f16_lanes(const uint16_t *a, const float *b, int64_t n) {
    DOT_BODY(load_f16)
    return _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
}

PL_TARGET_AVX2 static inline float dot_f16_tail(float s, const uint16_t *a, const float *b, int64_t n) {
    for (int64_t i = n & ~(int64_t)7; i < n; i++) s += pl_f16_to_f32(a[i]) * b[i];
    return s;
}

PL_TARGET_AVX2 static float vec_dot_f16_avx2(const void *w, const void *x, int64_t n) {
    return dot_f16_tail(hsum256(dot_f16_lanes(w, x, n)), w, x, n);
}

PL_TARGET_AVX2 static void axpy_f32_avx2(float *y, float a, const float *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* Attention's q · k over an f16 key: one chain of fused multiply-adds over the 8-lane chunks in
 * order, then hsum256 and the scalar tail. Its order is dot_f16_qk's (below), which runs several
 * keys' and queries' chains at once; a chain per key rather than DOT_BODY's four leaves nothing to
 * add up before the reduction, and its latency is hidden by the other keys' chains there. */
PL_TARGET_AVX2 static inline __m256 attn_f16_lanes(const uint16_t *k, const float *q, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(load_f16(k + i), _mm256_loadu_ps(q + i), acc);
    return acc;
}

PL_TARGET_AVX2 static float dot_f16_avx2(const float *q, const uint16_t *k, int64_t n) {
    return dot_f16_tail(hsum256(attn_f16_lanes(k, q, n)), k, q, n);
}

PL_TARGET_AVX2 static void axpy_f16_avx2(float *y, float a, const uint16_t *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_f16(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * pl_f16_to_f32(x[i]);
}

/* ---------------------------------------------------------------- attention's multi-query kernels */

/* hsum256 of eight vectors at once, [hsum256(v[0]), .., hsum256(v[7])] bit for bit: hsum256 adds
 * lane l to l + 4, then 0 to 2 and 1 to 3, then those two; these are the same additions (a + b
 * and b + a round alike), done for eight vectors by a transposition instead of one at a time. */
PL_TARGET_AVX2 static inline __m256 hsum256x8(const __m256 *v) {
    __m256 s04 = _mm256_add_ps(_mm256_permute2f128_ps(v[0], v[4], 0x20), _mm256_permute2f128_ps(v[0], v[4], 0x31));
    __m256 s15 = _mm256_add_ps(_mm256_permute2f128_ps(v[1], v[5], 0x20), _mm256_permute2f128_ps(v[1], v[5], 0x31));
    __m256 s26 = _mm256_add_ps(_mm256_permute2f128_ps(v[2], v[6], 0x20), _mm256_permute2f128_ps(v[2], v[6], 0x31));
    __m256 s37 = _mm256_add_ps(_mm256_permute2f128_ps(v[3], v[7], 0x20), _mm256_permute2f128_ps(v[3], v[7], 0x31));
    /* per 128-bit half: [s0[0] + s0[2], s0[1] + s0[3], s1[0] + s1[2], s1[1] + s1[3]] (4, 5 above) */
    __m256 t0145 = _mm256_add_ps(_mm256_shuffle_ps(s04, s15, 0x44), _mm256_shuffle_ps(s04, s15, 0xee));
    __m256 t2367 = _mm256_add_ps(_mm256_shuffle_ps(s26, s37, 0x44), _mm256_shuffle_ps(s26, s37, 0xee));
    return _mm256_hadd_ps(t0145, t2367);
}

/* DOT_BODY's lanes for two queries against one key (an f32 cache's): each key chunk loaded once
 * for both, every accumulator's operations those of DOT_BODY (a·b = b·a, fma alike). */
#define DOT_LANES_PAIR(NAME, KT, LOAD_K)                                                                  \
    PL_TARGET_AVX2 static inline void NAME(const KT *k, const float *q0, const float *q1, int64_t n,     \
                                           __m256 *out0, __m256 *out1) {                                 \
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps();            \
        __m256 a3 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();            \
        __m256 b2 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();                                       \
        int64_t i = 0;                                                                                   \
        for (; i + 32 <= n; i += 32) {                                                                   \
            __m256 k0 = LOAD_K(k + i), k1 = LOAD_K(k + i + 8), k2 = LOAD_K(k + i + 16), k3 = LOAD_K(k + i + 24); \
            a0 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q0 + i), a0);                                      \
            a1 = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q0 + i + 8), a1);                                  \
            a2 = _mm256_fmadd_ps(k2, _mm256_loadu_ps(q0 + i + 16), a2);                                 \
            a3 = _mm256_fmadd_ps(k3, _mm256_loadu_ps(q0 + i + 24), a3);                                 \
            b0 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q1 + i), b0);                                      \
            b1 = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q1 + i + 8), b1);                                  \
            b2 = _mm256_fmadd_ps(k2, _mm256_loadu_ps(q1 + i + 16), b2);                                 \
            b3 = _mm256_fmadd_ps(k3, _mm256_loadu_ps(q1 + i + 24), b3);                                 \
        }                                                                                                \
        for (; i + 8 <= n; i += 8) {                                                                     \
            __m256 k0 = LOAD_K(k + i);                                                                   \
            a0 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q0 + i), a0);                                      \
            b0 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q1 + i), b0);                                      \
        }                                                                                                \
        *out0 = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));                             \
        *out1 = _mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3));                             \
    }
DOT_LANES_PAIR(dot_f32_lanes_pair, float, _mm256_loadu_ps)

/* An f32 cache's keys eight at a time, each query's eight reductions transposed together (the
 * reductions, not the loads, dominate 64-element dots), the queries two by two so that each key
 * chunk is loaded once per pair; the keys past the last eight one at a time. */
#define DOT_QK_AVX2(NAME, KT, LANES, PAIR, TAIL, SINGLE)                                                  \
    PL_TARGET_AVX2 static void NAME(const float *const *qs, int nq, const KT *k, int64_t ldk, int nk,    \
                                    int64_t n, float *out, int64_t ldo) {                                \
        int j = 0;                                                                                       \
        for (; j + 8 <= nk; j += 8) {                                                                    \
            int i = 0;                                                                                   \
            for (; i + 2 <= nq; i += 2) {                                                                \
                __m256 v[8], w[8];                                                                       \
                for (int u = 0; u < 8; u++) PAIR(k + (j + u) * ldk, qs[i], qs[i + 1], n, &v[u], &w[u]);  \
                _mm256_storeu_ps(out + i * ldo + j, hsum256x8(v));                                       \
                _mm256_storeu_ps(out + (i + 1) * ldo + j, hsum256x8(w));                                 \
            }                                                                                            \
            if (i < nq) {                                                                                \
                __m256 v[8];                                                                             \
                for (int u = 0; u < 8; u++) v[u] = LANES(k + (j + u) * ldk, qs[i], n);                   \
                _mm256_storeu_ps(out + i * ldo + j, hsum256x8(v));                                       \
            }                                                                                            \
            if (n & 7)                                                                                   \
                for (i = 0; i < nq; i++)                                                                 \
                    for (int u = 0; u < 8; u++)                                                          \
                        out[i * ldo + j + u] = TAIL(out[i * ldo + j + u], k + (j + u) * ldk, qs[i], n);  \
        }                                                                                                \
        for (; j < nk; j++)                                                                              \
            for (int i = 0; i < nq; i++) out[i * ldo + j] = SINGLE(qs[i], k + j * ldk, n);               \
    }

/* dot_f32(q, k) multiplies q · k, the f16 one k · q: the lanes and tails keep each one's order */
PL_TARGET_AVX2 static inline __m256 dot_f32_lanes_kq(const float *k, const float *q, int64_t n) {
    return dot_f32_lanes(q, k, n);
}
PL_TARGET_AVX2 static inline float dot_f32_tail_kq(float s, const float *k, const float *q, int64_t n) {
    return dot_f32_tail(s, q, k, n);
}
DOT_QK_AVX2(dot_f32_qk_avx2, float, dot_f32_lanes_kq, dot_f32_lanes_pair, dot_f32_tail_kq, dot_f32_avx2)

/* attn_f16_lanes of four keys against two queries at once: eight chains in flight (their latency
 * hidden), each key chunk loaded and widened once for both queries, each query chunk loaded once
 * for the four keys. */
PL_TARGET_AVX2 static inline void attn_f16_lanes_4x2(const uint16_t *k, int64_t ldk, const float *q0, const float *q1,
                                                     int64_t n, __m256 *v, __m256 *w) {
    __m256 a[4], b[4];
    for (int u = 0; u < 4; u++) a[u] = b[u] = _mm256_setzero_ps();
    for (int64_t i = 0; i + 8 <= n; i += 8) {
        __m256 x0 = _mm256_loadu_ps(q0 + i), x1 = _mm256_loadu_ps(q1 + i);
        for (int u = 0; u < 4; u++) {
            __m256 key = load_f16(k + u * ldk + i);
            a[u] = _mm256_fmadd_ps(key, x0, a[u]);
            b[u] = _mm256_fmadd_ps(key, x1, b[u]);
        }
    }
    for (int u = 0; u < 4; u++) v[u] = a[u], w[u] = b[u];
}

/* attn_f16_lanes of eight keys against one query: eight chains in flight. */
PL_TARGET_AVX2 static inline void attn_f16_lanes_8x1(const uint16_t *k, int64_t ldk, const float *q, int64_t n,
                                                     __m256 *v) {
    __m256 a[8];
    for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
    for (int64_t i = 0; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(q + i);
        for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(load_f16(k + u * ldk + i), x, a[u]);
    }
    for (int u = 0; u < 8; u++) v[u] = a[u];
}

/* dot_f16_avx2 for every query against every key: eight keys at a time, each query's eight
 * reductions transposed together (hsum256x8), the queries two by two; the keys past the last eight
 * one at a time. */
PL_TARGET_AVX2 static void dot_f16_qk_avx2(const float *const *qs, int nq, const uint16_t *k, int64_t ldk, int nk,
                                           int64_t n, float *out, int64_t ldo) {
    int j = 0;
    for (; j + 8 <= nk; j += 8) {
        const uint16_t *kj = k + j * ldk;
        int i = 0;
        for (; i + 2 <= nq; i += 2) {
            __m256 v[8], w[8];
            attn_f16_lanes_4x2(kj, ldk, qs[i], qs[i + 1], n, v, w);
            attn_f16_lanes_4x2(kj + 4 * ldk, ldk, qs[i], qs[i + 1], n, v + 4, w + 4);
            _mm256_storeu_ps(out + i * ldo + j, hsum256x8(v));
            _mm256_storeu_ps(out + (i + 1) * ldo + j, hsum256x8(w));
        }
        if (i < nq) {
            __m256 v[8];
            attn_f16_lanes_8x1(kj, ldk, qs[i], n, v);
            _mm256_storeu_ps(out + i * ldo + j, hsum256x8(v));
        }
        if (n & 7)
            for (i = 0; i < nq; i++)
                for (int u = 0; u < 8; u++)
                    out[i * ldo + j + u] = dot_f16_tail(out[i * ldo + j + u], kj + u * ldk, qs[i], n);
    }
    for (; j < nk; j++)
        for (int i = 0; i < nq; i++) out[i * ldo + j] = dot_f16_avx2(qs[i], k + j * ldk, n);
}

/* y += w[j]·x[j] for rows j = 0 .. nr - 1 in order, each element by the fused multiply-add (or, past
 * the last multiple of 8, the scalar expression) that axpy gives it, with a 32-wide slab of y held
 * in registers across the rows instead of loaded and stored per row. */
#define AXPY_ROWS_AVX2(NAME, XT, LOADX, WIDEN)                                                          \
    PL_TARGET_AVX2 static inline void NAME(float *y, const float *w, const XT *x, int64_t ldx, int nr,  \
                                           int64_t n) {                                                \
        int64_t c = 0;                                                                                 \
        for (; c + 32 <= n; c += 32) {                                                                 \
            __m256 y0 = _mm256_loadu_ps(y + c), y1 = _mm256_loadu_ps(y + c + 8);                       \
            __m256 y2 = _mm256_loadu_ps(y + c + 16), y3 = _mm256_loadu_ps(y + c + 24);                 \
            for (int j = 0; j < nr; j++) {                                                             \
                const XT *xr = x + j * ldx + c;                                                        \
                __m256 va = _mm256_set1_ps(w[j]);                                                      \
                y0 = _mm256_fmadd_ps(va, LOADX(xr), y0);                                               \
                y1 = _mm256_fmadd_ps(va, LOADX(xr + 8), y1);                                           \
                y2 = _mm256_fmadd_ps(va, LOADX(xr + 16), y2);                                          \
                y3 = _mm256_fmadd_ps(va, LOADX(xr + 24), y3);                                          \
            }                                                                                          \
            _mm256_storeu_ps(y + c, y0), _mm256_storeu_ps(y + c + 8, y1);                              \
            _mm256_storeu_ps(y + c + 16, y2), _mm256_storeu_ps(y + c + 24, y3);                        \
        }                                                                                              \
        for (; c + 8 <= n; c += 8) {                                                                   \
            __m256 y0 = _mm256_loadu_ps(y + c);                                                        \
            for (int j = 0; j < nr; j++) y0 = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), LOADX(x + j * ldx + c), y0); \
            _mm256_storeu_ps(y + c, y0);                                                               \
        }                                                                                              \
        for (; c < n; c++)                                                                             \
            for (int j = 0; j < nr; j++) y[c] += w[j] * WIDEN(x[j * ldx + c]);                         \
    }

#define AS_F32(v) (v)
AXPY_ROWS_AVX2(axpy_rows_f32, float, _mm256_loadu_ps, AS_F32)
AXPY_ROWS_AVX2(axpy_rows_f16, uint16_t, load_f16, pl_f16_to_f32)

/* AXPY_ROWS for two queries over the same rows: y0 += w0[j]·x[j] and y1 += w1[j]·x[j], each x chunk
 * loaded (an f16 one widened) once for both, every element's operations those of AXPY_ROWS. */
#define AXPY_ROWS_PAIR_AVX2(NAME, XT, LOADX, WIDEN)                                                     \
    PL_TARGET_AVX2 static inline void NAME(float *y0, float *y1, const float *w0, const float *w1,     \
                                           const XT *x, int64_t ldx, int nr, int64_t n) {              \
        int64_t c = 0;                                                                                 \
        for (; c + 32 <= n; c += 32) {                                                                 \
            __m256 a0 = _mm256_loadu_ps(y0 + c), a1 = _mm256_loadu_ps(y0 + c + 8);                     \
            __m256 a2 = _mm256_loadu_ps(y0 + c + 16), a3 = _mm256_loadu_ps(y0 + c + 24);               \
            __m256 b0 = _mm256_loadu_ps(y1 + c), b1 = _mm256_loadu_ps(y1 + c + 8);                     \
            __m256 b2 = _mm256_loadu_ps(y1 + c + 16), b3 = _mm256_loadu_ps(y1 + c + 24);               \
            for (int j = 0; j < nr; j++) {                                                             \
                const XT *xr = x + j * ldx + c;                                                        \
                __m256 x0 = LOADX(xr), x1 = LOADX(xr + 8), x2 = LOADX(xr + 16), x3 = LOADX(xr + 24);   \
                __m256 va = _mm256_set1_ps(w0[j]), vb = _mm256_set1_ps(w1[j]);                         \
                a0 = _mm256_fmadd_ps(va, x0, a0), a1 = _mm256_fmadd_ps(va, x1, a1);                    \
                a2 = _mm256_fmadd_ps(va, x2, a2), a3 = _mm256_fmadd_ps(va, x3, a3);                    \
                b0 = _mm256_fmadd_ps(vb, x0, b0), b1 = _mm256_fmadd_ps(vb, x1, b1);                    \
                b2 = _mm256_fmadd_ps(vb, x2, b2), b3 = _mm256_fmadd_ps(vb, x3, b3);                    \
            }                                                                                          \
            _mm256_storeu_ps(y0 + c, a0), _mm256_storeu_ps(y0 + c + 8, a1);                            \
            _mm256_storeu_ps(y0 + c + 16, a2), _mm256_storeu_ps(y0 + c + 24, a3);                      \
            _mm256_storeu_ps(y1 + c, b0), _mm256_storeu_ps(y1 + c + 8, b1);                            \
            _mm256_storeu_ps(y1 + c + 16, b2), _mm256_storeu_ps(y1 + c + 24, b3);                      \
        }                                                                                              \
        for (; c + 8 <= n; c += 8) {                                                                   \
            __m256 a0 = _mm256_loadu_ps(y0 + c), b0 = _mm256_loadu_ps(y1 + c);                         \
            for (int j = 0; j < nr; j++) {                                                             \
                __m256 x0 = LOADX(x + j * ldx + c);                                                    \
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(w0[j]), x0, a0);                                   \
                b0 = _mm256_fmadd_ps(_mm256_set1_ps(w1[j]), x0, b0);                                   \
            }                                                                                          \
            _mm256_storeu_ps(y0 + c, a0), _mm256_storeu_ps(y1 + c, b0);                                \
        }                                                                                              \
        for (; c < n; c++)                                                                             \
            for (int j = 0; j < nr; j++) {                                                             \
                y0[c] += w0[j] * WIDEN(x[j * ldx + c]);                                                \
                y1[c] += w1[j] * WIDEN(x[j * ldx + c]);                                                \
            }                                                                                          \
    }
AXPY_ROWS_PAIR_AVX2(axpy_rows_pair_f32, float, _mm256_loadu_ps, AS_F32)
AXPY_ROWS_PAIR_AVX2(axpy_rows_pair_f16, uint16_t, load_f16, pl_f16_to_f32)

/* Rows in chunks of PL_QK_ROWS, every query's part of a chunk before the next (the chunk stays in
 * L1); two queries with the same rows of the chunk (a decode step's heads, a token's heads) go
 * through the pair kernel. */
#define AXPY_QK_AVX2(NAME, XT, ROWS, PAIR)                                                             \
    PL_TARGET_AVX2 static void NAME(float *const *ys, int nq, const float *ws, int64_t ldw, const int *first, \
                                    const int *end, const XT *x, int64_t ldx, int64_t n) {              \
        int last = 0;                                                                                  \
        for (int i = 0; i < nq; i++) last = end[i] > last ? end[i] : last;                             \
        for (int r0 = 0; r0 < last; r0 += PL_QK_ROWS)                                                  \
            for (int i = 0; i < nq; i++) {                                                             \
                int lo = first[i] > r0 ? first[i] : r0;                                                \
                int hi = end[i] < r0 + PL_QK_ROWS ? end[i] : r0 + PL_QK_ROWS;                          \
                if (lo >= hi) continue;                                                                \
                if (i + 1 < nq && lo == (first[i + 1] > r0 ? first[i + 1] : r0) &&                     \
                    hi == (end[i + 1] < r0 + PL_QK_ROWS ? end[i + 1] : r0 + PL_QK_ROWS)) {             \
                    PAIR(ys[i], ys[i + 1], ws + i * ldw + lo, ws + (i + 1) * ldw + lo, x + lo * ldx, ldx, \
                         hi - lo, n);                                                                  \
                    i++;                                                                               \
                } else {                                                                               \
                    ROWS(ys[i], ws + i * ldw + lo, x + lo * ldx, ldx, hi - lo, n);                     \
                }                                                                                      \
            }                                                                                          \
    }

AXPY_QK_AVX2(axpy_f32_qk_avx2, float, axpy_rows_f32, axpy_rows_pair_f32)
AXPY_QK_AVX2(axpy_f16_qk_avx2, uint16_t, axpy_rows_f16, axpy_rows_pair_f16)

PL_TARGET_AVX2 static void bf16_to_f32_avx2(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16(s + i));
    for (; i < n; i++) dst[i] = pl_bf16_to_f32(s[i]);
}

PL_TARGET_AVX2 static void f16_to_f32_avx2(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16(s + i));
    for (; i < n; i++) dst[i] = pl_f16_to_f32(s[i]);
}

PL_TARGET_AVX2 static void f16_from_f32_avx2(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = pl_f32_to_f16(src[i]);
}

/* e^x for x in [-87, 88], relative error ~2e-7: x = n·ln2 + r, e^r by a degree-6 polynomial. */
PL_TARGET_AVX2 static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3f)), _mm256_set1_ps(-87.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

PL_TARGET_AVX2 static void softmax_avx2(float *x, int n) {
    int i = 0;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float max = _mm_cvtss_f32(m4);
    for (; i < n; i++) max = x[i] > max ? x[i] : max;
    __m256 vm = _mm256_set1_ps(max), vsum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum256(vsum);
    for (; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; i++) x[i] *= 1.0f / sum;
}

PL_TARGET_AVX2 static void swiglu_avx2(float *gate, const float *up, int n) {
    int i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, g))));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* gelu_tanh(g) = 0.5·g·(1 + tanh(y)) = g / (1 + e^(-2y)), y = sqrt(2/pi)·(g + 0.044715·g³). */
PL_TARGET_AVX2 static inline __m256 gelu_tanh256(__m256 g) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    __m256 y2 = _mm256_mul_ps(_mm256_set1_ps(2.0f * 0.7978845608028654f),
                              _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
    return _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, y2))));
}

PL_TARGET_AVX2 static void geglu_avx2(float *gate, const float *up, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(gelu_tanh256(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
    if (i < n) pl_geglu_scalar(gate + i, up + i, n - i);
}

PL_TARGET_AVX2 static void gelu_avx2(float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, gelu_tanh256(_mm256_loadu_ps(x + i)));
    if (i < n) pl_gelu_scalar(x + i, n - i);
}

int pl_install_simd_avx2(void) {
    pl_traits_slot(PL_TYPE_F32)->vec_dot = vec_dot_f32_avx2;
    pl_traits_slot(PL_TYPE_F16)->vec_dot = vec_dot_f16_avx2;
    pl_traits_slot(PL_TYPE_F16)->to_f32 = f16_to_f32_avx2;
    pl_traits_slot(PL_TYPE_F16)->from_f32 = f16_from_f32_avx2;
    pl_traits_slot(PL_TYPE_BF16)->vec_dot = vec_dot_bf16_avx2;
    pl_traits_slot(PL_TYPE_BF16)->to_f32 = bf16_to_f32_avx2;
    pl_vec.dot_f32 = dot_f32_avx2;
    pl_vec.axpy_f32 = axpy_f32_avx2;
    pl_vec.softmax = softmax_avx2;
    pl_vec.swiglu = swiglu_avx2;
    pl_vec.geglu = geglu_avx2;
    pl_vec.gelu = gelu_avx2;
    pl_vec.dot_f16 = dot_f16_avx2;
    pl_vec.axpy_f16 = axpy_f16_avx2;
    pl_vec.dot_f32_qk = dot_f32_qk_avx2;
    pl_vec.axpy_f32_qk = axpy_f32_qk_avx2;
    pl_vec.dot_f16_qk = dot_f16_qk_avx2;
    pl_vec.axpy_f16_qk = axpy_f16_qk_avx2;
    return 1;
}

#else
int pl_install_simd_avx2(void) { return 0; }
#endif
