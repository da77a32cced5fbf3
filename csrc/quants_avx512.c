/* quants_avx512.c — quantized dot products for x86-64 with AVX-512 (F, BW, VL, DQ).
 *
 * The AVX2 file's scheme on registers twice as wide: two blocks of 32 (or one 64-element chunk of
 * a k-quant super-block) per register, u8 × s8 products through maddubs and madd, byte selects
 * through mask registers. The activation quantizers are the AVX2 ones.
 */
#include <string.h>

#include "quants.h"

#if defined(PL_X86) && (defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER))
#include <immintrin.h>

PL_TARGET_AVX512 static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

/* Two blocks' 16 bytes of nibbles → 64 bytes: block a's low nibbles, its high ones, then b's. */
PL_TARGET_AVX512 static inline __m512i unpack_nibbles_x2(const uint8_t *qa, const uint8_t *qb) {
    __m256i ab = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qa)),
                                         _mm_loadu_si128((const __m128i *)qb), 1);
    __m512i v = _mm512_shuffle_i64x2(_mm512_castsi256_si512(ab), _mm512_castsi256_si512(ab),
                                     _MM_SHUFFLE(1, 1, 0, 0)); /* a, a, b, b */
    v = _mm512_mask_srli_epi16(v, 0xFF00FF00u, v, 4);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
}

PL_TARGET_AVX512 static inline __m512i load_2x32(const int8_t *a, const int8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* Two blocks' 32 bits of qh → a mask over the 64 bytes. */
static inline __mmask64 bits_x2(const uint8_t *qa, const uint8_t *qb) {
    uint32_t a, b;
    memcpy(&a, qa, 4);
    memcpy(&b, qb, 4);
    return (__mmask64)a | ((__mmask64)b << 32);
}

PL_TARGET_AVX512 static inline __m512i dot_u8s8(__m512i u, __m512i s) {
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}

/* s8·s8: |x| · (y with x's sign); activations' |y| ≤ 127, so negating cannot overflow. */
PL_TARGET_AVX512 static inline __m512i dot_s8s8(__m512i x, __m512i y) {
    __mmask64 neg = _mm512_movepi8_mask(x);
    return dot_u8s8(_mm512_abs_epi8(x), _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y));
}

PL_TARGET_AVX512 static inline __m512 scales_x2(float a, float b) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(a)), _mm256_set1_ps(b), 1);
}

/* ================================================================ blocks of 32 */

/* Blocks in pairs; an odd last block pairs with itself against zero activations. PAIR(a, b, ya, yb)
 * yields the i32 lanes of blocks a and b, SCALE(i) block i's float scale. */
#define BLOCK32_PAIRS(PAIR, SCALE)                                                         \
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                         \
    int64_t nb = n / QK, i = 0;                                                            \
    for (; i + 4 <= nb; i += 4) {                                                          \
        __m512i s0 = PAIR(i, i + 1, x[i].qs, x[i + 1].qs);                                 \
        __m512i s1 = PAIR(i + 2, i + 3, x[i + 2].qs, x[i + 3].qs);                         \
        acc0 = _mm512_fmadd_ps(scales_x2(SCALE(i), SCALE(i + 1)), _mm512_cvtepi32_ps(s0), acc0); \
        acc1 = _mm512_fmadd_ps(scales_x2(SCALE(i + 2), SCALE(i + 3)), _mm512_cvtepi32_ps(s1), acc1); \
    }                                                                                      \
    for (; i + 2 <= nb; i += 2) {                                                          \
        __m512i s0 = PAIR(i, i + 1, x[i].qs, x[i + 1].qs);                                 \
        acc0 = _mm512_fmadd_ps(scales_x2(SCALE(i), SCALE(i + 1)), _mm512_cvtepi32_ps(s0), acc0); \
    }                                                                                      \
    if (i < nb) {                                                                          \
        static const int8_t zero[32];                                                      \
        __m512i s0 = PAIR(i, i, x[i].qs, zero);                                            \
        acc0 = _mm512_fmadd_ps(scales_x2(SCALE(i), 0.0f), _mm512_cvtepi32_ps(s0), acc0);   \
    }                                                                                      \
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));

PL_TARGET_AVX512 static float vec_dot_q4_0_q8_0_avx512(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_0 *w = vw;
    const pl_block_q8_0 *x = vx;
#define PAIR(a, b, ya, yb) \
    dot_s8s8(_mm512_sub_epi8(unpack_nibbles_x2(w[a].qs, w[b].qs), _mm512_set1_epi8(8)), load_2x32(ya, yb))
#define SCALE(i) (f16(w[i].d) * f16(x[i].d))
    BLOCK32_PAIRS(PAIR, SCALE)
#undef PAIR
#undef SCALE
    return sum;
}

PL_TARGET_AVX512 static float vec_dot_q8_0_q8_0_avx512(const void *vw, const void *vx, int64_t n) {
    const pl_block_q8_0 *w = vw;
    const pl_block_q8_0 *x = vx;
#define PAIR(a, b, ya, yb) dot_s8s8(load_2x32(w[a].qs, w[b].qs), load_2x32(ya, yb))
#define SCALE(i) (f16(w[i].d) * f16(x[i].d))
    BLOCK32_PAIRS(PAIR, SCALE)
#undef PAIR
#undef SCALE
    return sum;
}

/* q5_0: nibble + 16·bit − 16, i.e. nibble − 16 where the bit is clear. */
PL_TARGET_AVX512 static inline __m512i q5_0_signed_x2(const pl_block_q5_0 *a, const pl_block_q5_0 *b) {
    __m512i q = unpack_nibbles_x2(a->qs, b->qs);
    return _mm512_mask_sub_epi8(q, ~bits_x2(a->qh, b->qh), q, _mm512_set1_epi8(16));
}

PL_TARGET_AVX512 static float vec_dot_q5_0_q8_0_avx512(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_0 *w = vw;
    const pl_block_q8_0 *x = vx;
#define PAIR(a, b, ya, yb) dot_s8s8(q5_0_signed_x2(&w[a], &w[b]), load_2x32(ya, yb))
#define SCALE(i) (f16(w[i].d) * f16(x[i].d))
    BLOCK32_PAIRS(PAIR, SCALE)
#undef PAIR
#undef SCALE
    return sum;
}

PL_TARGET_AVX512 static float vec_dot_q4_1_q8_1_avx512(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_1 *w = vw;
    const pl_block_q8_1 *x = vx;
    float summ = 0.0f;
    for (int64_t j = 0; j < n / QK; j++) summ += f16(w[j].m) * x[j].s;
#define PAIR(a, b, ya, yb) dot_u8s8(unpack_nibbles_x2(w[a].qs, w[b].qs), load_2x32(ya, yb))
#define SCALE(i) (f16(w[i].d) * x[i].d)
    BLOCK32_PAIRS(PAIR, SCALE)
#undef PAIR
#undef SCALE
    return sum + summ;
}

PL_TARGET_AVX512 static inline __m512i q5_1_x2(const pl_block_q5_1 *a, const pl_block_q5_1 *b) {
    __m512i q = unpack_nibbles_x2(a->qs, b->qs);
    return _mm512_mask_add_epi8(q, bits_x2(a->qh, b->qh), q, _mm512_set1_epi8(16));
}

PL_TARGET_AVX512 static float vec_dot_q5_1_q8_1_avx512(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_1 *w = vw;
    const pl_block_q8_1 *x = vx;
    float summ = 0.0f;
    for (int64_t j = 0; j < n / QK; j++) summ += f16(w[j].m) * x[j].s;
#define PAIR(a, b, ya, yb) dot_u8s8(q5_1_x2(&w[a], &w[b]), load_2x32(ya, yb))
#define SCALE(i) (f16(w[i].d) * x[i].d)
    BLOCK32_PAIRS(PAIR, SCALE)
#undef PAIR
#undef SCALE
    return sum + summ;
}

/* ================================================================ k-quants */

/* The 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a q4_K/q5_K super-block. */
static inline __m128i unpack_scales_k4(const uint8_t *p) {
    uint32_t u[4];
    memcpy(u, p, 12);
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x03030303;
    uint32_t mins_lo = u[1] & low6;
    u[3] = ((u[2] >> 4) & low4) | (((u[1] >> 6) & top2) << 4);
    u[1] = (u[2] & low4) | (((u[0] >> 6) & top2) << 4);
    u[0] &= low6;
    u[2] = mins_lo;
    return _mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]);
}

/* i16 index vector: lane a in the first 16 lanes, lane b in the last 16. */
#define HALVES(a, b) _mm512_setr_epi64(0x0001000100010001LL * (a), 0x0001000100010001LL * (a),     \
                                       0x0001000100010001LL * (a), 0x0001000100010001LL * (a),     \
                                       0x0001000100010001LL * (b), 0x0001000100010001LL * (b),     \
                                       0x0001000100010001LL * (b), 0x0001000100010001LL * (b))
/* … lanes a, a+1, a+2, a+3 in quarters of 8. */
#define QUARTERS(a) _mm512_setr_epi64(0x0001000100010001LL * (a), 0x0001000100010001LL * (a),     \
                                      0x0001000100010001LL * ((a) + 1), 0x0001000100010001LL * ((a) + 1), \
                                      0x0001000100010001LL * ((a) + 2), 0x0001000100010001LL * ((a) + 2), \
                                      0x0001000100010001LL * ((a) + 3), 0x0001000100010001LL * ((a) + 3))

PL_TARGET_AVX512 static inline __m128i k4_mins_dot(__m128i sm, const pl_block_q8_K *x) {
    __m256i bs = _mm256_loadu_si256((const __m256i *)x->bsums);
    __m128i bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    return _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)), bs32);
}

/* 32 bytes of nibbles → 64 bytes: the low nibbles (first 32 elements), then the high ones. */
PL_TARGET_AVX512 static inline __m512i nibbles_64(const uint8_t *q) {
    __m256i b = _mm256_loadu_si256((const __m256i *)q);
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 4), 1);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
}

PL_TARGET_AVX512 static float vec_dot_q4_K_q8_K_avx512(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_K *w = vw;
    const pl_block_q8_K *x = vx;
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = x[i].d * f16(w[i].d), dmin = x[i].d * f16(w[i].dmin);
        __m128i sm = unpack_scales_k4(w[i].scales);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_mins_dot(sm, &x[i])), accm);
        __m512i sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm));
        const int8_t *y = x[i].qs;
        __m512i s0 = _mm512_madd_epi16(
            _mm512_maddubs_epi16(nibbles_64(w[i].qs), _mm512_loadu_si512(y)),
            _mm512_permutexvar_epi16(HALVES(0, 1), sc));
        __m512i s1 = _mm512_madd_epi16(
            _mm512_maddubs_epi16(nibbles_64(w[i].qs + 32), _mm512_loadu_si512(y + 64)),
            _mm512_permutexvar_epi16(HALVES(2, 3), sc));
        __m512i s2 = _mm512_madd_epi16(
            _mm512_maddubs_epi16(nibbles_64(w[i].qs + 64), _mm512_loadu_si512(y + 128)),
            _mm512_permutexvar_epi16(HALVES(4, 5), sc));
        __m512i s3 = _mm512_madd_epi16(
            _mm512_maddubs_epi16(nibbles_64(w[i].qs + 96), _mm512_loadu_si512(y + 192)),
            _mm512_permutexvar_epi16(HALVES(6, 7), sc));
        __m512i sumi = _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
    return _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(accm);
}

PL_TARGET_AVX512 static float vec_dot_q5_K_q8_K_avx512(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_K *w = vw;
    const pl_block_q8_K *x = vx;
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = x[i].d * f16(w[i].d), dmin = x[i].d * f16(w[i].dmin);
        __m128i sm = unpack_scales_k4(w[i].scales);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_mins_dot(sm, &x[i])), accm);
        __m512i sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm));
        const int8_t *y = x[i].qs;
        /* Chunk c takes bit 2c of qh[l] for its first 32 elements, bit 2c+1 for the next 32:
         * with hb = qh, qh >> 1 side by side, bit 2c of either half, moved to bit 4. */
        __m256i hb = _mm256_loadu_si256((const __m256i *)w[i].qh);
        __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 1), 1);
#define CHUNK(c)                                                                                   \
    _mm512_madd_epi16(                                                                             \
        _mm512_maddubs_epi16(                                                                      \
            _mm512_or_si512(nibbles_64(w[i].qs + 32 * (c)),                                        \
                            _mm512_and_si512(_mm512_slli_epi16(_mm512_srli_epi16(h, 2 * (c)), 4), bit4)), \
            _mm512_loadu_si512(y + 64 * (c))),                                                     \
        _mm512_permutexvar_epi16(HALVES(2 * (c), 2 * (c) + 1), sc))
        __m512i sumi = _mm512_add_epi32(_mm512_add_epi32(CHUNK(0), CHUNK(1)),
                                        _mm512_add_epi32(CHUNK(2), CHUNK(3)));
#undef CHUNK
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
    return _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(accm);
}

/* q6_K: Σ sc·q·y − 32·Σ_g sc_g·bsum_g with q ∈ [0, 63]. A half of 128 is two registers: elements
 * 0..63 from the low nibbles of ql[0..64), 64..127 from the high ones; the 2 high bits of each
 * come from qh (first 32 bytes of the register) or qh >> 2 (last 32). */
PL_TARGET_AVX512 static float vec_dot_q6_K_q8_K_avx512(const void *vw, const void *vx, int64_t n) {
    const pl_block_q6_K *w = vw;
    const pl_block_q8_K *x = vx;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x30);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = x[i].d * f16(w[i].d);
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)x[i].bsums));
        __m512i sc = _mm512_castsi256_si512(sc16);
        __m512i sumi = _mm512_inserti64x4(_mm512_setzero_si512(),
                                          _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5)), 0);
        for (int h = 0; h < 2; h++) {
            const int8_t *y = x[i].qs + 128 * h;
            __m512i l = _mm512_loadu_si512(w[i].ql + 64 * h);
            __m256i hb = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
            __m512i hh = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 2), 1);
            __m512i q01 = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_slli_epi16(hh, 4), m2));
            __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), _mm512_and_si512(hh, m2));
            __m512i p01 = _mm512_maddubs_epi16(q01, _mm512_loadu_si512(y));
            __m512i p23 = _mm512_maddubs_epi16(q23, _mm512_loadu_si512(y + 64));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p01, _mm512_permutexvar_epi16(QUARTERS(8 * h), sc)));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p23, _mm512_permutexvar_epi16(QUARTERS(8 * h + 4), sc)));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

int pl_install_quants_avx512(void) {
    pl_install_quants_avx2();
    pl_traits_slot(PL_TYPE_Q4_0)->vec_dot = vec_dot_q4_0_q8_0_avx512;
    pl_traits_slot(PL_TYPE_Q4_1)->vec_dot = vec_dot_q4_1_q8_1_avx512;
    pl_traits_slot(PL_TYPE_Q5_0)->vec_dot = vec_dot_q5_0_q8_0_avx512;
    pl_traits_slot(PL_TYPE_Q5_1)->vec_dot = vec_dot_q5_1_q8_1_avx512;
    pl_traits_slot(PL_TYPE_Q8_0)->vec_dot = vec_dot_q8_0_q8_0_avx512;
    pl_traits_slot(PL_TYPE_Q4_K)->vec_dot = vec_dot_q4_K_q8_K_avx512;
    pl_traits_slot(PL_TYPE_Q5_K)->vec_dot = vec_dot_q5_K_q8_K_avx512;
    pl_traits_slot(PL_TYPE_Q6_K)->vec_dot = vec_dot_q6_K_q8_K_avx512;
    return 1;
}

#else
int pl_install_quants_avx512(void) { return 0; }
#endif
