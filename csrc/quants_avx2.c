/* quants_avx2.c — quantized dot products and activation quantizers for x86-64 with AVX2 (+FMA, F16C).
 *
 * Products are integer within a block: maddubs (u8 × s8 → pairs of i16) then madd (→ i32), so a
 * block's sum is exact and only the per-block scaling is float, as in quants.c. Blocks of 32 go
 * eight at a time: their eight lane vectors are reduced to one vector of eight sums, converted and
 * scaled once, which roughly halves the work per block against one fmadd a block (ggml's way).
 * Activations come from pl_quantize_q8_*: their quants lie in [−127, 127], which the sign trick
 * below relies on. The quantizers reproduce the scalar references bit for bit.
 */
#include <string.h>

#include "quants.h"

#if defined(PL_X86) && (defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER))
#include <immintrin.h>

PL_TARGET_AVX2 static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

PL_TARGET_AVX2 static inline float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* An f16 field as f32. The 8-byte load lets the conversion take its operand from memory (no
 * shuffle-port µop); every field read this way has at least 8 bytes of its block from it on. */
PL_TARGET_AVX2 static inline float f16(const uint16_t *p) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p)));
}

/* 16 bytes of nibbles → 32 bytes: the low nibbles (elements 0..15), then the high ones. */
PL_TARGET_AVX2 static inline __m256i unpack_nibbles(const uint8_t *qs) {
    __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    b = _mm256_blend_epi32(b, _mm256_srli_epi16(b, 4), 0xF0);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

/* 32 bits → 32 bytes, 0xFF where the bit is set. */
PL_TARGET_AVX2 static inline __m256i unpack_bits(const uint8_t *qh) {
    uint32_t v;
    memcpy(&v, qh, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                            2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)v), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
}

/* Σ of 4 adjacent u8·s8 products, as 8 i32. */
PL_TARGET_AVX2 static inline __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* The same for s8·s8: the sign moves onto y (|y| ≤ 127, so negating it cannot overflow). */
PL_TARGET_AVX2 static inline __m256i dot_s8s8(__m256i x, __m256i y) {
    return dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* ================================================================ blocks of 32 */

/* Eight blocks' i32 lanes (hadd-ed in pairs: h0 = hadd(s0, s1), …) → one vector of their 8 sums. */
PL_TARGET_AVX2 static inline __m256i sums_of_8(__m256i h0, __m256i h1, __m256i h2, __m256i h3) {
    __m256i a = _mm256_hadd_epi32(h0, h1), b = _mm256_hadd_epi32(h2, h3);
    return _mm256_add_epi32(_mm256_blend_epi32(a, b, 0xF0), _mm256_permute2x128_si256(a, b, 0x21));
}

/* Eight f16 fields, one a block, as a vector. */
PL_TARGET_AVX2 static inline __m256 f16_fields(const void *first, size_t stride) {
    uint16_t h[8];
    for (int k = 0; k < 8; k++) memcpy(&h[k], (const char *)first + k * stride, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* The first 16 bytes of block a in the low lane, of block b in the high one. */
PL_TARGET_AVX2 static inline __m256i load_2x16(const void *a, const void *b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                   _mm_loadu_si128((const __m128i *)b), 1);
}

/* The two f16 fields (d, m) at the start of each of 8 blocks (each ≥ 16 bytes), as two vectors:
 * the blocks are loaded 16 bytes at a time, k beside k + 4, and the fields picked out with
 * unpacks (cheaper than inserting them one by one as f16_fields does). */
PL_TARGET_AVX2 static inline void f16_pairs8(const void *first, size_t stride, __m256 *d, __m256 *m) {
    const char *p = first;
    __m256i a0 = load_2x16(p, p + 4 * stride), a1 = load_2x16(p + stride, p + 5 * stride);
    __m256i a2 = load_2x16(p + 2 * stride, p + 6 * stride), a3 = load_2x16(p + 3 * stride, p + 7 * stride);
    __m256i u = _mm256_unpacklo_epi32(_mm256_unpacklo_epi16(a0, a1), _mm256_unpacklo_epi16(a2, a3));
    /* u as u16: d0 d1 d2 d3 m0 m1 m2 m3 | d4 d5 d6 d7 m4 m5 m6 m7 */
    u = _mm256_permute4x64_epi64(u, 0xD8);
    *d = _mm256_cvtph_ps(_mm256_castsi256_si128(u));
    *m = _mm256_cvtph_ps(_mm256_extracti128_si256(u, 1));
}

/* d and s of 8 q8_1 blocks. */
PL_TARGET_AVX2 static inline void q8_1_ds8(const pl_block_q8_1 *x, __m256 *d, __m256 *s) {
    __m256 a0 = _mm256_castsi256_ps(load_2x16(&x[0], &x[4])), a1 = _mm256_castsi256_ps(load_2x16(&x[1], &x[5]));
    __m256 a2 = _mm256_castsi256_ps(load_2x16(&x[2], &x[6])), a3 = _mm256_castsi256_ps(load_2x16(&x[3], &x[7]));
    __m256d u01 = _mm256_castps_pd(_mm256_unpacklo_ps(a0, a1)); /* d0 d1 s0 s1 | d4 d5 s4 s5 */
    __m256d u23 = _mm256_castps_pd(_mm256_unpacklo_ps(a2, a3)); /* d2 d3 s2 s3 | d6 d7 s6 s7 */
    *d = _mm256_castpd_ps(_mm256_unpacklo_pd(u01, u23));
    *s = _mm256_castpd_ps(_mm256_unpackhi_pd(u01, u23));
}

/* q4_1, q5_1 against q8_1, 8 blocks: returns the scales d·dy and adds the mins' share m·s to
 * *accm (see MIN_TERMS). */
PL_TARGET_AVX2 static inline __m256 scales8_min(const void *w, size_t stride, const pl_block_q8_1 *x, __m256 *accm) {
    __m256 d, m, dy, s;
    f16_pairs8(w, stride, &d, &m);
    q8_1_ds8(x, &dy, &s);
    *accm = _mm256_fmadd_ps(m, s, *accm);
    return _mm256_mul_ps(d, dy);
}

/* Eight blocks' sums, as sums_of_8 gives them, from their maddubs lanes (i16) where those are
 * at most 8191 in magnitude, so that four add up within i16: two levels of hadd in i16, then one
 * madd and the two halves added. Fewer µops than madd-ing each block and reducing in i32; exact. */
PL_TARGET_AVX2 static inline __m256i sums_of_8_i16(__m256i p0, __m256i p1, __m256i p2, __m256i p3, __m256i p4,
                                                   __m256i p5, __m256i p6, __m256i p7) {
    __m256i g0 = _mm256_hadd_epi16(_mm256_hadd_epi16(p0, p1), _mm256_hadd_epi16(p2, p3));
    __m256i g1 = _mm256_hadd_epi16(_mm256_hadd_epi16(p4, p5), _mm256_hadd_epi16(p6, p7));
    /* a: the sums of blocks 0..3 over each 128-bit half, b: of 4..7 */
    __m256i a = _mm256_madd_epi16(g0, _mm256_set1_epi16(1)), b = _mm256_madd_epi16(g1, _mm256_set1_epi16(1));
    return _mm256_add_epi32(_mm256_blend_epi32(a, b, 0xF0), _mm256_permute2x128_si256(a, b, 0x21));
}

/* Blocks eight at a time: their integer sums reduced to one vector (SUMS8(i)), scaled by one
 * vector of the eight scales (SCALES8(i)), so the float work is shared; the rest one by one.
 * SUM(i) yields block i's i32 lanes, SCALE(i) its scale. Leaves the total in sum. */
#define BLOCK32_LOOP_WITH(SUMS8, SUM, SCALE, SCALES8)                                           \
    __m256 acc = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                              \
    int64_t nb = n / QK, i = 0;                                                                \
    for (; i + 8 <= nb; i += 8)                                                                \
        acc = _mm256_fmadd_ps(SCALES8(i), _mm256_cvtepi32_ps(SUMS8(i)), acc);                  \
    for (; i < nb; i++)                                                                        \
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(SCALE(i)), _mm256_cvtepi32_ps(SUM(i)), acc1);    \
    float sum = hsum_ps(_mm256_add_ps(acc, acc1));

/* SUMS8 from SUM(i): i32 lanes, hadd-ed in pairs then sums_of_8. */
#define SUMS8_I32(i)                                                                            \
    sums_of_8(_mm256_hadd_epi32(SUM(i), SUM(i + 1)), _mm256_hadd_epi32(SUM(i + 2), SUM(i + 3)), \
              _mm256_hadd_epi32(SUM(i + 4), SUM(i + 5)), _mm256_hadd_epi32(SUM(i + 6), SUM(i + 7)))
/* SUMS8 from PROD(i): maddubs lanes within ±8191 (see sums_of_8_i16). */
#define SUMS8_I16(i) \
    sums_of_8_i16(PROD(i), PROD(i + 1), PROD(i + 2), PROD(i + 3), PROD(i + 4), PROD(i + 5), PROD(i + 6), PROD(i + 7))
#define BLOCK32_LOOP(SUM, SCALE, SCALES8) BLOCK32_LOOP_WITH(SUMS8_I32, SUM, SCALE, SCALES8)

#define LOAD_Y(i) _mm256_loadu_si256((const __m256i *)x[i].qs)
/* Weights with an f16 d against q8_0 (f16 d) or q8_1 (f32 d) activations. */
#define SCALE_Q8_0(i) (f16(&w[i].d) * f16(&x[i].d))
#define SCALES8_Q8_0(i) _mm256_mul_ps(f16_fields(&w[i].d, sizeof *w), f16_fields(&x[i].d, sizeof *x))
#define SCALE_Q8_1(i) (f16(&w[i].d) * x[i].d)
/* Weights with f16 d, m against q8_1: the mins' share goes into accm (MIN_TERMS). */
#define SCALES8_Q8_1(i) scales8_min(&w[i], sizeof *w, &x[i], &accm)

/* Σ (q − 8)·y as Σ q·y − Σ 8·y, both through maddubs (|pair sums| ≤ 3810 and 2032). */
PL_TARGET_AVX2 static inline __m256i dot_q4_0(__m256i q, __m256i y) {
    __m256i d = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(_mm256_set1_epi8(8), y));
    return _mm256_madd_epi16(d, _mm256_set1_epi16(1));
}

PL_TARGET_AVX2 static float vec_dot_q4_0_q8_0_avx2(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_0 *w = vw;
    const pl_block_q8_0 *x = vx;
#define SUM(i) dot_q4_0(unpack_nibbles(w[i].qs), LOAD_Y(i))
    BLOCK32_LOOP(SUM, SCALE_Q8_0, SCALES8_Q8_0)
#undef SUM
    return sum;
}

PL_TARGET_AVX2 static float vec_dot_q8_0_q8_0_avx2(const void *vw, const void *vx, int64_t n) {
    const pl_block_q8_0 *w = vw;
    const pl_block_q8_0 *x = vx;
#define SUM(i) dot_s8s8(_mm256_loadu_si256((const __m256i *)w[i].qs), LOAD_Y(i))
    BLOCK32_LOOP(SUM, SCALE_Q8_0, SCALES8_Q8_0)
#undef SUM
    return sum;
}

/* q5_0: where bit 4 is clear, OR-ing 0xF0 onto the nibble makes the byte nibble − 16 (as i8). */
PL_TARGET_AVX2 static inline __m256i q5_0_signed(const pl_block_q5_0 *b) {
    __m256i hi = _mm256_andnot_si256(unpack_bits(b->qh), _mm256_set1_epi8((char)0xF0));
    return _mm256_or_si256(unpack_nibbles(b->qs), hi);
}

PL_TARGET_AVX2 static float vec_dot_q5_0_q8_0_avx2(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_0 *w = vw;
    const pl_block_q8_0 *x = vx;
#define SUM(i) dot_s8s8(q5_0_signed(&w[i]), LOAD_Y(i))
    BLOCK32_LOOP(SUM, SCALE_Q8_0, SCALES8_Q8_0)
#undef SUM
    return sum;
}

/* q4_1, q5_1: Σ (d·q + m)·dy·qy = d·dy·Σ q·qy + m·s, s = dy·Σ qy kept in the activation block.
 * The eight-block loop's SCALES8_Q8_1 adds the m·s of its blocks into accm; MIN_TERMS adds the
 * rest one by one (the same order of operations as a separate pass). */
#define MIN_TERMS(w, x)                                                                         \
    float summ = 0.0f;                                                                          \
    for (int64_t j = nb - nb % 8; j < nb; j++) summ += f16(&w[j].m) * x[j].s;                   \
    summ += hsum_ps(accm);

PL_TARGET_AVX2 static float vec_dot_q4_1_q8_1_avx2(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_1 *w = vw;
    const pl_block_q8_1 *x = vx;
    __m256 accm = _mm256_setzero_ps();
/* maddubs lanes: |q·y + q'·y'| ≤ 2·15·128 */
#define PROD(i) _mm256_maddubs_epi16(unpack_nibbles(w[i].qs), LOAD_Y(i))
#define SUM(i) _mm256_madd_epi16(PROD(i), _mm256_set1_epi16(1))
    BLOCK32_LOOP_WITH(SUMS8_I16, SUM, SCALE_Q8_1, SCALES8_Q8_1)
#undef SUM
#undef PROD
    MIN_TERMS(w, x)
    return sum + summ;
}

PL_TARGET_AVX2 static inline __m256i q5_1_unsigned(const pl_block_q5_1 *b) {
    __m256i hi = _mm256_and_si256(unpack_bits(b->qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(unpack_nibbles(b->qs), hi);
}

PL_TARGET_AVX2 static float vec_dot_q5_1_q8_1_avx2(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_1 *w = vw;
    const pl_block_q8_1 *x = vx;
    __m256 accm = _mm256_setzero_ps();
/* maddubs lanes: |q·y + q'·y'| ≤ 2·31·128 */
#define PROD(i) _mm256_maddubs_epi16(q5_1_unsigned(&w[i]), LOAD_Y(i))
#define SUM(i) _mm256_madd_epi16(PROD(i), _mm256_set1_epi16(1))
    BLOCK32_LOOP_WITH(SUMS8_I16, SUM, SCALE_Q8_1, SCALES8_Q8_1)
#undef SUM
#undef PROD
    MIN_TERMS(w, x)
    return sum + summ;
}

#undef LOAD_Y

/* ================================================================ k-quants */

/* The 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a q4_K/q5_K super-block, unpacked from
 * 12 bytes with 32-bit masks: the layout pl_get_scale_min_k4 describes. */
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

/* i16 lane c of v in every lane of the low 128 bits, lane c + 1 in the high: shuffle masks. */
#define PAIR_MASK(c)                                                                              \
    _mm256_setr_epi8(2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c),    \
                     2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, \
                     2 * (c), 2 * (c) + 1, 2 * (c) + 2, 2 * (c) + 3, 2 * (c) + 2, 2 * (c) + 3,      \
                     2 * (c) + 2, 2 * (c) + 3, 2 * (c) + 2, 2 * (c) + 3, 2 * (c) + 2, 2 * (c) + 3,  \
                     2 * (c) + 2, 2 * (c) + 3, 2 * (c) + 2, 2 * (c) + 3, 2 * (c) + 2, 2 * (c) + 3)

/* i16 lane c of v in every lane. */
#define BCAST_MASK(c)                                                                           \
    _mm256_setr_epi8(2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c),  \
                     2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, \
                     2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c),     \
                     2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1, \
                     2 * (c), 2 * (c) + 1, 2 * (c), 2 * (c) + 1)

/* The mins' share of a q4_K/q5_K super-block: Σ_j m_j · Σ y over sub-block j (from bsums). */
PL_TARGET_AVX2 static inline __m128i k4_mins_dot(__m128i sm, const pl_block_q8_K *x) {
    __m256i bs = _mm256_loadu_si256((const __m256i *)x->bsums);
    __m128i bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    return _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)), bs32);
}

PL_TARGET_AVX2 static float vec_dot_q4_K_q8_K_avx2(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_K *w = vw;
    const pl_block_q8_K *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = x[i].d * f16(&w[i].d), dmin = x[i].d * f16(&w[i].dmin);
        __m128i sm = unpack_scales_k4(w[i].scales);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_mins_dot(sm, &x[i])), accm);
        __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm)); /* 8 scales as i16, twice */
        const uint8_t *q = w[i].qs;
        const int8_t *y = x[i].qs;
        __m256i sumi = _mm256_setzero_si256();
#define CHUNK(c)                                                                                  \
    {                                                                                             \
        __m256i b = _mm256_loadu_si256((const __m256i *)(q + 32 * (c)));                          \
        __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(b, m4),                                \
                                          _mm256_loadu_si256((const __m256i *)(y + 64 * (c))));   \
        __m256i hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),          \
                                          _mm256_loadu_si256((const __m256i *)(y + 64 * (c) + 32))); \
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(lo, _mm256_shuffle_epi8(sc, BCAST_MASK(2 * (c))))); \
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(hi, _mm256_shuffle_epi8(sc, BCAST_MASK(2 * (c) + 1)))); \
    }
        CHUNK(0) CHUNK(1) CHUNK(2) CHUNK(3)
#undef CHUNK
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
    return hsum_ps(acc) - _mm_cvtss_f32(accm);
}

PL_TARGET_AVX2 static float vec_dot_q5_K_q8_K_avx2(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_K *w = vw;
    const pl_block_q8_K *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = x[i].d * f16(&w[i].d), dmin = x[i].d * f16(&w[i].dmin);
        __m128i sm = unpack_scales_k4(w[i].scales);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_mins_dot(sm, &x[i])), accm);
        __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        const uint8_t *q = w[i].qs;
        const int8_t *y = x[i].qs;
        __m256i hbits = _mm256_loadu_si256((const __m256i *)w[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        /* Chunk c's high bits are bits 2c (first 32) and 2c+1 (next 32): shifted into bit 4. Bits
         * a 16-bit shift carries across bytes never land on bit 4. */
#define CHUNK(c)                                                                                  \
    {                                                                                             \
        __m256i b = _mm256_loadu_si256((const __m256i *)(q + 32 * (c)));                          \
        __m256i hb = _mm256_srli_epi16(hbits, 2 * (c));                                           \
        __m256i ql = _mm256_or_si256(_mm256_and_si256(b, m4),                                     \
                                     _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));           \
        __m256i qh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),               \
                                     _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));           \
        __m256i lo = _mm256_maddubs_epi16(ql, _mm256_loadu_si256((const __m256i *)(y + 64 * (c)))); \
        __m256i hi =                                                                              \
            _mm256_maddubs_epi16(qh, _mm256_loadu_si256((const __m256i *)(y + 64 * (c) + 32)));   \
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(lo, _mm256_shuffle_epi8(sc, BCAST_MASK(2 * (c))))); \
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(hi, _mm256_shuffle_epi8(sc, BCAST_MASK(2 * (c) + 1)))); \
    }
        CHUNK(0) CHUNK(1) CHUNK(2) CHUNK(3)
#undef CHUNK
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
    return hsum_ps(acc) - _mm_cvtss_f32(accm);
}

/* q6_K: Σ sc·(q − 32)·y = Σ sc·q·y − 32·Σ_g sc_g·bsum_g, with q ∈ [0, 63] unsigned for maddubs. */
PL_TARGET_AVX2 static float vec_dot_q6_K_q8_K_avx2(const void *vw, const void *vx, int64_t n) {
    const pl_block_q6_K *w = vw;
    const pl_block_q8_K *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = x[i].d * _cvtsh_ss(w[i].d); /* d ends the block: no 8-byte read */
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)x[i].bsums));
        __m256i sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[i].ql + 64 * h;
            const int8_t *y = x[i].qs + 128 * h;
            __m256i sc = _mm256_broadcastsi128_si256(
                _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(w[i].scales + 8 * h))));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
            __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            /* Bits 2k..2k+1 of qh go to bits 4..5 of element group k (16-bit shifts, as in q5_K). */
            __m256i q0 = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m2));
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(b2, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m2));
            __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), _mm256_and_si256(hb, m2));
            __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(hb, 2), m2));
            /* Element group k covers two scales: the first 16 (low half), the next 16 (high). */
            __m256i p0 = _mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)y));
            __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(y + 32)));
            __m256i p2 = _mm256_maddubs_epi16(q2, _mm256_loadu_si256((const __m256i *)(y + 64)));
            __m256i p3 = _mm256_maddubs_epi16(q3, _mm256_loadu_si256((const __m256i *)(y + 96)));
            p0 = _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sc, PAIR_MASK(0)));
            p1 = _mm256_madd_epi16(p1, _mm256_shuffle_epi8(sc, PAIR_MASK(2)));
            p2 = _mm256_madd_epi16(p2, _mm256_shuffle_epi8(sc, PAIR_MASK(4)));
            p3 = _mm256_madd_epi16(p3, _mm256_shuffle_epi8(sc, PAIR_MASK(6)));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

/* ================================================================ several activation rows
 * vec_dot_rows: the kernels above for up to ROWS activation rows at a time. Each weight block is
 * unpacked, and its scales widened, once for all of them; per row every float operation is the
 * single kernel's, in its order and lane layout (acc lane k: the blocks ≡ k mod 8 of the
 * eight-block loop), so each result is vec_dot's bit for bit. Integer sums are exact, so they may
 * be reduced otherwise (the i16 route wherever the lanes allow it) and summed in any order. */

#define ROWS 8 /* rows per pass: 8 measured faster than 4 (4 than 2 or 3), spills and all */

/* Each pass inlined with its R, and its loops over rows and blocks unrolled: left to itself GCC
 * keeps the larger passes as loops over arrays in memory, as slow as no sharing at all. */
#if defined(_MSC_VER) && !defined(__clang__)
#define ALWAYS_INLINE __forceinline
#define UNROLLED
#else
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLLED _Pragma("GCC unroll 8")
#endif

/* NAME(w, x, x_stride, n_rows, n, out, out_stride) running BODY, an always-inlined kernel of R rows,
 * over passes of ROWS rows and one pass of the rest; each R a constant, so each pass is unrolled. */
#define ROWS_DISPATCH(NAME, BODY)                                                                   \
    PL_TARGET_AVX2 static void NAME(const void *w, const void *x, int64_t xs, int n_rows, int64_t n, \
                                    float *out, int64_t os) {                                       \
        const char *xb = x;                                                                         \
        int t = 0;                                                                                  \
        for (; t + ROWS <= n_rows; t += ROWS) BODY(w, xb + t * xs, xs, ROWS, n, out + t * os, os);   \
        xb += t * xs;                                                                               \
        out += t * os;                                                                              \
        switch (n_rows - t) {                                                                       \
        case 7: BODY(w, xb, xs, 7, n, out, os); break;                                              \
        case 6: BODY(w, xb, xs, 6, n, out, os); break;                                              \
        case 5: BODY(w, xb, xs, 5, n, out, os); break;                                              \
        case 4: BODY(w, xb, xs, 4, n, out, os); break;                                              \
        case 3: BODY(w, xb, xs, 3, n, out, os); break;                                              \
        case 2: BODY(w, xb, xs, 2, n, out, os); break;                                              \
        case 1: BODY(w, xb, xs, 1, n, out, os); break;                                              \
        }                                                                                           \
    }

/* The f16 field at the start of each of 8 blocks (each ≥ 16 bytes): f16_fields' values, the
 * cheaper way f16_pairs8 loads them. */
PL_TARGET_AVX2 static inline __m256 f16_firsts8(const void *first, size_t stride) {
    __m256 d, unused;
    f16_pairs8(first, stride, &d, &unused);
    return d;
}

/* Eight blocks' sums from maddubs lanes beyond ±8191: madd to i32, as SUMS8_I32. */
PL_TARGET_AVX2 static inline __m256i sums_of_8_i32(const __m256i p[8]) {
    const __m256i one = _mm256_set1_epi16(1);
    __m256i s[8];
    for (int k = 0; k < 8; k++) s[k] = _mm256_madd_epi16(p[k], one);
    return sums_of_8(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]), _mm256_hadd_epi32(s[4], s[5]),
                     _mm256_hadd_epi32(s[6], s[7]));
}

PL_TARGET_AVX2 static inline __m256i sums_of_8_i16_v(const __m256i p[8]) {
    return sums_of_8_i16(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
}

/* Blocks of 32, R rows (BLOCK32_LOOP_WITH's operations per row). PREP(b, a, s) sets the weight side
 * of block b: a, what maddubs takes unsigned, and s, what signs the activations of an s8·s8
 * product (else unused); PROD(a, s, y) the block's maddubs lanes against activation quants y, and
 * SUMS8 eight blocks' sums from them. XSCALES8(x, dw, mw, accm) the eight scales of the blocks from
 * x on (adding the mins' share to accm, against q8_1), XD(x) one activation block's scale, and
 * FINISH(t, sum) row t's result. */
#define BLOCK32_ROWS(NAME, WT, XT, PREP, PROD, SUMS8, XSCALES8, XD, FINISH)                          \
    PL_TARGET_AVX2 static ALWAYS_INLINE void NAME(const void *vw, const char *xb, int64_t xs, int R,  \
                                                  int64_t n, float *out, int64_t os) {               \
        const WT *w = vw;                                                                            \
        const __m256i one = _mm256_set1_epi16(1);                                                    \
        __m256 acc[ROWS], acc1[ROWS], accm[ROWS];                                                    \
        UNROLLED for (int t = 0; t < R; t++) acc[t] = acc1[t] = accm[t] = _mm256_setzero_ps();                \
        int64_t nb = n / QK, i = 0;                                                                  \
        for (; i + 8 <= nb; i += 8) {                                                                \
            __m256i a[8], s[8]; /* s: unused by the unsigned products */                             \
            (void)s;                                                                                 \
            UNROLLED for (int k = 0; k < 8; k++) PREP(&w[i + k], a[k], s[k]);                                 \
            __m256 dw, mw;                                                                           \
            f16_pairs8(&w[i], sizeof *w, &dw, &mw);                                                  \
            UNROLLED for (int t = 0; t < R; t++) {                                                            \
                const XT *x = (const XT *)(xb + t * xs) + i;                                         \
                __m256i p[8];                                                                        \
                UNROLLED for (int k = 0; k < 8; k++)                                                 \
                    p[k] = PROD(a[k], s[k], _mm256_loadu_si256((const __m256i *)x[k].qs));           \
                __m256 scales = XSCALES8(x, dw, mw, &accm[t]);                                       \
                acc[t] = _mm256_fmadd_ps(scales, _mm256_cvtepi32_ps(SUMS8(p)), acc[t]);              \
            }                                                                                        \
        }                                                                                            \
        for (; i < nb; i++) {                                                                        \
            __m256i a, s;                                                                            \
            (void)s;                                                                                 \
            PREP(&w[i], a, s);                                                                       \
            float dw = f16(&w[i].d);                                                                 \
            UNROLLED for (int t = 0; t < R; t++) {                                                            \
                const XT *x = (const XT *)(xb + t * xs) + i;                                         \
                __m256i p = PROD(a, s, _mm256_loadu_si256((const __m256i *)x->qs));                  \
                acc1[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * XD(x)),                                \
                                          _mm256_cvtepi32_ps(_mm256_madd_epi16(p, one)), acc1[t]);   \
            }                                                                                        \
        }                                                                                            \
        UNROLLED for (int t = 0; t < R; t++) {                                                                \
            float sum = hsum_ps(_mm256_add_ps(acc[t], acc1[t]));                                     \
            out[t * os] = FINISH(t, sum);                                                            \
        }                                                                                            \
    }

/* Against q8_0: the scales d·dy. */
PL_TARGET_AVX2 static inline __m256 xscales8_q8_0(const pl_block_q8_0 *x, __m256 dw, __m256 mw, __m256 *accm) {
    (void)mw;
    (void)accm;
    return _mm256_mul_ps(dw, f16_firsts8(x, sizeof *x));
}
#define XD_Q8_0(x) f16(&(x)->d)
#define FINISH_Q8_0(t, sum) (sum)

/* Against q8_1: as scales8_min; FINISH as MIN_TERMS. */
PL_TARGET_AVX2 static inline __m256 xscales8_q8_1(const pl_block_q8_1 *x, __m256 dw, __m256 mw, __m256 *accm) {
    __m256 dy, s;
    q8_1_ds8(x, &dy, &s);
    *accm = _mm256_fmadd_ps(mw, s, *accm);
    return _mm256_mul_ps(dw, dy);
}
#define XD_Q8_1(x) ((x)->d)
/* m: the first block's m field, stride bytes from one block's to the next. */
PL_TARGET_AVX2 static inline float mins_q8_1(const uint16_t *m, size_t stride, const pl_block_q8_1 *x, int64_t nb,
                                             __m256 accm) {
    float summ = 0.0f;
    for (int64_t j = nb - nb % 8; j < nb; j++) summ += f16((const uint16_t *)((const char *)m + j * stride)) * x[j].s;
    summ += hsum_ps(accm);
    return summ;
}
#define FINISH_Q8_1(t, sum) ((sum) + mins_q8_1(&w[0].m, sizeof *w, (const pl_block_q8_1 *)(xb + (t) * xs), nb, accm[t]))

/* q4_0: Σ (q − 8)·y as in dot_q4_0; its lanes lie within ±2·8·128, so the i16 route. */
#define PREP_Q4_0(b, a, s) (a) = unpack_nibbles((b)->qs)
#define PROD_Q4_0(a, s, y) _mm256_sub_epi16(_mm256_maddubs_epi16(a, y), _mm256_maddubs_epi16(_mm256_set1_epi8(8), y))
BLOCK32_ROWS(rows_q4_0, pl_block_q4_0, pl_block_q8_0, PREP_Q4_0, PROD_Q4_0, sums_of_8_i16_v, xscales8_q8_0,
             XD_Q8_0, FINISH_Q8_0)
ROWS_DISPATCH(vec_dot_rows_q4_0_q8_0_avx2, rows_q4_0)

/* q8_0 and q5_0: dot_s8s8's sign trick; q5_0's lanes lie within ±2·16·128 (i16 route), q8_0's not. */
#define PROD_S8S8(a, s, y) _mm256_maddubs_epi16(a, _mm256_sign_epi8(y, s))
#define PREP_Q8_0(b, a, s) ((s) = _mm256_loadu_si256((const __m256i *)(b)->qs), (a) = _mm256_sign_epi8(s, s))
BLOCK32_ROWS(rows_q8_0, pl_block_q8_0, pl_block_q8_0, PREP_Q8_0, PROD_S8S8, sums_of_8_i32, xscales8_q8_0,
             XD_Q8_0, FINISH_Q8_0)
ROWS_DISPATCH(vec_dot_rows_q8_0_q8_0_avx2, rows_q8_0)

#define PREP_Q5_0(b, a, s) ((s) = q5_0_signed(b), (a) = _mm256_sign_epi8(s, s))
BLOCK32_ROWS(rows_q5_0, pl_block_q5_0, pl_block_q8_0, PREP_Q5_0, PROD_S8S8, sums_of_8_i16_v, xscales8_q8_0,
             XD_Q8_0, FINISH_Q8_0)
ROWS_DISPATCH(vec_dot_rows_q5_0_q8_0_avx2, rows_q5_0)

/* q4_1, q5_1: unsigned quants, maddubs straight (the single kernels' PROD). */
#define PROD_U8(a, s, y) _mm256_maddubs_epi16(a, y)
#define PREP_Q4_1(b, a, s) (a) = unpack_nibbles((b)->qs)
BLOCK32_ROWS(rows_q4_1, pl_block_q4_1, pl_block_q8_1, PREP_Q4_1, PROD_U8, sums_of_8_i16_v, xscales8_q8_1,
             XD_Q8_1, FINISH_Q8_1)
ROWS_DISPATCH(vec_dot_rows_q4_1_q8_1_avx2, rows_q4_1)

#define PREP_Q5_1(b, a, s) (a) = q5_1_unsigned(b)
BLOCK32_ROWS(rows_q5_1, pl_block_q5_1, pl_block_q8_1, PREP_Q5_1, PROD_U8, sums_of_8_i16_v, xscales8_q8_1,
             XD_Q8_1, FINISH_Q8_1)
ROWS_DISPATCH(vec_dot_rows_q5_1_q8_1_avx2, rows_q5_1)

/* q4_K (qh NULL) and q5_K, R rows: chunk by chunk, its nibbles and scale shuffles shared by the rows. */
PL_TARGET_AVX2 static ALWAYS_INLINE void rows_k4(const uint8_t *scales, const uint16_t *dp, const uint16_t *dminp,
                                                 const uint8_t *q, const uint8_t *qh, const char *xb, int64_t xs,
                                                 int64_t i, int R, __m256 *acc, __m128 *accm) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    float dw = f16(dp), dminw = f16(dminp);
    __m128i sm = unpack_scales_k4(scales);
    __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    const pl_block_q8_K *x[ROWS];
    __m256i sumi[ROWS];
    UNROLLED for (int t = 0; t < R; t++) {
        x[t] = (const pl_block_q8_K *)(xb + t * xs) + i;
        float dmin = x[t]->d * dminw;
        accm[t] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_mins_dot(sm, x[t])), accm[t]);
        sumi[t] = _mm256_setzero_si256();
    }
    __m256i hbits = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    UNROLLED for (int c = 0; c < 4; c++) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
        __m256i ql = _mm256_and_si256(b, m4), qhi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
        if (qh) { /* as vec_dot_q5_K_q8_K_avx2's CHUNK */
            __m256i hb = _mm256_srli_epi16(hbits, 2 * c);
            ql = _mm256_or_si256(ql, _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
            qhi = _mm256_or_si256(qhi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
        }
        __m256i sc_lo = _mm256_shuffle_epi8(sc, BCAST_MASK(2 * c)), sc_hi = _mm256_shuffle_epi8(sc, BCAST_MASK(2 * c + 1));
        UNROLLED for (int t = 0; t < R; t++) {
            const int8_t *y = x[t]->qs + 64 * c;
            __m256i lo = _mm256_maddubs_epi16(ql, _mm256_loadu_si256((const __m256i *)y));
            __m256i hi = _mm256_maddubs_epi16(qhi, _mm256_loadu_si256((const __m256i *)(y + 32)));
            sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(_mm256_madd_epi16(lo, sc_lo), _mm256_madd_epi16(hi, sc_hi)));
        }
    }
    UNROLLED for (int t = 0; t < R; t++) {
        float d = x[t]->d * dw;
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
}

/* The k4 kernels' ending: hsum(acc) less the mins' share. */
PL_TARGET_AVX2 static inline float k4_result(__m256 acc, __m128 accm) {
    accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
    return hsum_ps(acc) - _mm_cvtss_f32(accm);
}

PL_TARGET_AVX2 static ALWAYS_INLINE void rows_q4_K(const void *vw, const char *xb, int64_t xs, int R, int64_t n,
                                                   float *out, int64_t os) {
    const pl_block_q4_K *w = vw;
    __m256 acc[ROWS];
    __m128 accm[ROWS];
    UNROLLED for (int t = 0; t < R; t++) acc[t] = _mm256_setzero_ps(), accm[t] = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++)
        rows_k4(w[i].scales, &w[i].d, &w[i].dmin, w[i].qs, NULL, xb, xs, i, R, acc, accm);
    UNROLLED for (int t = 0; t < R; t++) out[t * os] = k4_result(acc[t], accm[t]);
}
ROWS_DISPATCH(vec_dot_rows_q4_K_q8_K_avx2, rows_q4_K)

PL_TARGET_AVX2 static ALWAYS_INLINE void rows_q5_K(const void *vw, const char *xb, int64_t xs, int R, int64_t n,
                                                   float *out, int64_t os) {
    const pl_block_q5_K *w = vw;
    __m256 acc[ROWS];
    __m128 accm[ROWS];
    UNROLLED for (int t = 0; t < R; t++) acc[t] = _mm256_setzero_ps(), accm[t] = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++)
        rows_k4(w[i].scales, &w[i].d, &w[i].dmin, w[i].qs, w[i].qh, xb, xs, i, R, acc, accm);
    UNROLLED for (int t = 0; t < R; t++) out[t * os] = k4_result(acc[t], accm[t]);
}
ROWS_DISPATCH(vec_dot_rows_q5_K_q8_K_avx2, rows_q5_K)

/* q6_K, R rows: per half, the six-bit quants and scale shuffles shared by the rows. */
PL_TARGET_AVX2 static ALWAYS_INLINE void rows_q6_K(const void *vw, const char *xb, int64_t xs, int R, int64_t n,
                                                   float *out, int64_t os) {
    const pl_block_q6_K *w = vw;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    __m256 acc[ROWS];
    UNROLLED for (int t = 0; t < R; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        float dw = _cvtsh_ss(w[i].d);
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        const pl_block_q8_K *x[ROWS];
        __m256i sumi[ROWS];
        UNROLLED for (int t = 0; t < R; t++) {
            x[t] = (const pl_block_q8_K *)(xb + t * xs) + i;
            __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)x[t]->bsums));
            sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
        }
        for (int h = 0; h < 2; h++) { /* as vec_dot_q6_K_q8_K_avx2 */
            const uint8_t *ql = w[i].ql + 64 * h;
            __m256i sc = _mm256_broadcastsi128_si256(
                _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(w[i].scales + 8 * h))));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
            __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i q[4], s[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m2));
            q[1] = _mm256_or_si256(_mm256_and_si256(b2, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), _mm256_and_si256(hb, m2));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(hb, 2), m2));
            s[0] = _mm256_shuffle_epi8(sc, PAIR_MASK(0));
            s[1] = _mm256_shuffle_epi8(sc, PAIR_MASK(2));
            s[2] = _mm256_shuffle_epi8(sc, PAIR_MASK(4));
            s[3] = _mm256_shuffle_epi8(sc, PAIR_MASK(6));
            UNROLLED for (int t = 0; t < R; t++) {
                const int8_t *y = x[t]->qs + 128 * h;
                UNROLLED for (int k = 0; k < 4; k++) {
                    __m256i p = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(y + 32 * k)));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, s[k]));
                }
            }
        }
        UNROLLED for (int t = 0; t < R; t++) {
            float d = x[t]->d * dw;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    UNROLLED for (int t = 0; t < R; t++) out[t * os] = hsum_ps(acc[t]);
}
ROWS_DISPATCH(vec_dot_rows_q6_K_q8_K_avx2, rows_q6_K)

/* ================================================================ activation quantizers */

/* roundf: to nearest, ties away from zero (what ggml's q8_0/q8_1 references use). */
PL_TARGET_AVX2 static inline __m256i round_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t)); /* exact */
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    __m256 up = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one);
    return _mm256_cvttps_epi32(_mm256_add_ps(t, up));
}

/* 32 i32 (elements 0..7, 8..15, …) → 32 i8 in order. */
PL_TARGET_AVX2 static inline __m256i pack_i32x4(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* One block of 32 for q8_0/q8_1; returns Σ q. */
PL_TARGET_AVX2 static inline int quantize_block32(const float *x, int8_t *qs, float *d_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    float amax = hmax_ps(a);
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    __m256 vid = _mm256_set1_ps(id);
    __m256i i0 = round_away(_mm256_mul_ps(v0, vid)), i1 = round_away(_mm256_mul_ps(v1, vid));
    __m256i i2 = round_away(_mm256_mul_ps(v2, vid)), i3 = round_away(_mm256_mul_ps(v3, vid));
    _mm256_storeu_si256((__m256i *)qs, pack_i32x4(i0, i1, i2, i3));
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *d_out = d;
    return _mm_cvtsi128_si32(s4);
}

PL_TARGET_AVX2 static void quantize_q8_0_avx2(const float *x, void *dst, int64_t n) {
    pl_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / QK; i++) {
        float d;
        quantize_block32(x + i * QK, y[i].qs, &d);
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    }
}

PL_TARGET_AVX2 static void quantize_q8_1_avx2(const float *x, void *dst, int64_t n) {
    pl_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / QK; i++) {
        float d;
        int sum = quantize_block32(x + i * QK, y[i].qs, &d);
        y[i].d = d;
        y[i].s = (float)sum * d;
    }
}

PL_TARGET_AVX2 static void quantize_q8_K_avx2(const float *x, void *dst, int64_t n) {
    pl_block_q8_K *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m256 a = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        float amax = hmax_ps(a);
        if (!(amax > 0.0f)) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* The first element of that magnitude gives the sign, as in the reference. */
        __m256 va = _mm256_set1_ps(amax);
        int j = 0, mask = 0;
        for (; j < QK_K; j += 8) {
            mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), va, _CMP_EQ_OQ));
            if (mask) break;
        }
        int k0 = 0;
        while (!((mask >> k0) & 1)) k0++;
        float max = x[j + k0];
        float iscale = -127.0f / max;
        __m256 vs = _mm256_set1_ps(iscale);
        const __m256i cap = _mm256_set1_epi32(127), one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
        __m256i sums[8];
        for (int k = 0; k < 8; k++) {
            const float *xk = x + 32 * k;
            /* cvtps rounds to nearest even, as nearest_int does */
            __m256i i0 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(xk))), cap);
            __m256i i1 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(xk + 8))), cap);
            __m256i i2 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(xk + 16))), cap);
            __m256i i3 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(xk + 24))), cap);
            __m256i q = pack_i32x4(i0, i1, i2, i3);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * k), q);
            /* 8 i32: 4 partial sums of elements 0..15 (low half), 4 of 16..31 (high half) */
            sums[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(one8, q), one16);
        }
        /* hadd twice: low halves hold groups 0, 2, 4, 6 (8, 10, …), high halves the odd ones. */
        __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(sums[0], sums[1]), _mm256_hadd_epi32(sums[2], sums[3]));
        __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(sums[4], sums[5]), _mm256_hadd_epi32(sums[6], sums[7]));
        __m256i g = _mm256_packs_epi32(g0, g1); /* low: groups 0,2,..,14; high: 1,3,..,15 */
        __m128i lo = _mm256_castsi256_si128(g), hi = _mm256_extracti128_si256(g, 1);
        _mm_storeu_si128((__m128i *)y[i].bsums, _mm_unpacklo_epi16(lo, hi));
        _mm_storeu_si128((__m128i *)(y[i].bsums + 8), _mm_unpackhi_epi16(lo, hi));
        y[i].d = 1 / iscale;
    }
}

/* ================================================================ dequantize (prefill tiles)
 * Products and sums in the order the scalar references use (no fused multiply-add), so every ISA
 * widens to the same bits. */

PL_TARGET_AVX2 static inline __m256 u8x8_to_ps(__m128i v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}

PL_TARGET_AVX2 static void q4_0_to_f32_avx2(const void *src, float *y, int64_t n) {
    const pl_block_q4_0 *b = src;
    const __m128i low = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        __m128i q = _mm_loadu_si128((const __m128i *)b[i].qs);
        __m128i lo = _mm_sub_epi8(_mm_and_si128(q, low), eight);
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), low), eight);
        _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d));
        _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d));
        _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d));
        _mm256_storeu_ps(y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d));
    }
}

PL_TARGET_AVX2 static void q4_1_to_f32_avx2(const void *src, float *y, int64_t n) {
    const pl_block_q4_1 *b = src;
    const __m128i low = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d)), m = _mm256_set1_ps(_cvtsh_ss(b[i].m));
        __m128i q = _mm_loadu_si128((const __m128i *)b[i].qs);
        __m128i lo = _mm_and_si128(q, low), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low);
        _mm256_storeu_ps(y, _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(lo), d), m));
        _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(_mm_srli_si128(lo, 8)), d), m));
        _mm256_storeu_ps(y + 16, _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(hi), d), m));
        _mm256_storeu_ps(y + 24, _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(_mm_srli_si128(hi, 8)), d), m));
    }
}

PL_TARGET_AVX2 static void q8_0_to_f32_avx2(const void *src, float *y, int64_t n) {
    const pl_block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        for (int j = 0; j < QK; j += 8) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(b[i].qs + j));
            _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
        }
    }
}

int pl_install_quants_avx2(void) {
    pl_traits_slot(PL_TYPE_Q4_0)->vec_dot = vec_dot_q4_0_q8_0_avx2;
    pl_traits_slot(PL_TYPE_Q4_1)->vec_dot = vec_dot_q4_1_q8_1_avx2;
    pl_traits_slot(PL_TYPE_Q5_0)->vec_dot = vec_dot_q5_0_q8_0_avx2;
    pl_traits_slot(PL_TYPE_Q5_1)->vec_dot = vec_dot_q5_1_q8_1_avx2;
    pl_traits_slot(PL_TYPE_Q8_0)->vec_dot = vec_dot_q8_0_q8_0_avx2;
    pl_traits_slot(PL_TYPE_Q4_K)->vec_dot = vec_dot_q4_K_q8_K_avx2;
    pl_traits_slot(PL_TYPE_Q5_K)->vec_dot = vec_dot_q5_K_q8_K_avx2;
    pl_traits_slot(PL_TYPE_Q6_K)->vec_dot = vec_dot_q6_K_q8_K_avx2;
    pl_traits_slot(PL_TYPE_Q4_0)->vec_dot_rows = vec_dot_rows_q4_0_q8_0_avx2;
    pl_traits_slot(PL_TYPE_Q4_1)->vec_dot_rows = vec_dot_rows_q4_1_q8_1_avx2;
    pl_traits_slot(PL_TYPE_Q5_0)->vec_dot_rows = vec_dot_rows_q5_0_q8_0_avx2;
    pl_traits_slot(PL_TYPE_Q5_1)->vec_dot_rows = vec_dot_rows_q5_1_q8_1_avx2;
    pl_traits_slot(PL_TYPE_Q8_0)->vec_dot_rows = vec_dot_rows_q8_0_q8_0_avx2;
    pl_traits_slot(PL_TYPE_Q4_K)->vec_dot_rows = vec_dot_rows_q4_K_q8_K_avx2;
    pl_traits_slot(PL_TYPE_Q5_K)->vec_dot_rows = vec_dot_rows_q5_K_q8_K_avx2;
    pl_traits_slot(PL_TYPE_Q6_K)->vec_dot_rows = vec_dot_rows_q6_K_q8_K_avx2;
    pl_traits_slot(PL_TYPE_Q8_0)->from_f32 = quantize_q8_0_avx2;
    pl_traits_slot(PL_TYPE_Q8_1)->from_f32 = quantize_q8_1_avx2;
    pl_traits_slot(PL_TYPE_Q8_K)->from_f32 = quantize_q8_K_avx2;
    pl_traits_slot(PL_TYPE_Q4_0)->to_f32 = q4_0_to_f32_avx2;
    pl_traits_slot(PL_TYPE_Q4_1)->to_f32 = q4_1_to_f32_avx2;
    pl_traits_slot(PL_TYPE_Q8_0)->to_f32 = q8_0_to_f32_avx2;
    return 1;
}

#else
int pl_install_quants_avx2(void) { return 0; }
#endif
