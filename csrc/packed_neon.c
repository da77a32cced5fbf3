/* packed_neon.c — the packed GEMM kernels (packed.h) for AArch64 NEON.
 *
 * A chunk of a packed block is two 16-byte registers, rows 0..3 and rows 4..7, 4 elements of each:
 * the layout the dot-product extension's by-lane form wants. vdotq_laneq_s32 against the activation
 * dword k adds, per row, the 4 products into that row's i32 lane (__ARM_FEATURE_DOTPROD); without
 * the extension widening multiplies and two pairwise adds do the same. Block sums are exact, then
 * scaled and accumulated with one vfmaq_f32 per lane, the scalar reference's operations in its order.
 * Tiles of 4 activation rows per group, or two groups for one activation row: the x86 kernels read a
 * group at a time with software prefetching since that read a decode 1.5x faster on an AMD EPYC
 * (packed_x86.h, STREAM_AHEAD); not done here untimed (no ARM machine measured it).
 */
#include <string.h>

#include "packed.h"
#include "quants.h"

#if defined(PL_ARM64) && defined(__ARM_NEON)
#include <arm_neon.h>

#if defined(_MSC_VER) && !defined(__clang__)
#define ALWAYS_INLINE __forceinline
#define UNROLLED
#elif defined(__clang__) /* which takes "GCC unroll" but then leaves these loops rolled */
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLLED _Pragma("unroll")
#else
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLLED _Pragma("GCC unroll 8")
#endif

/* acc + per i32 lane r, Σ_i w[4r + i]·x[4K + i]: the 4 elements of row r against activation dword K. */
#if defined(__ARM_FEATURE_DOTPROD)
#define DOT4(acc, w, x, K) vdotq_laneq_s32(acc, w, x, K)
#else
static inline int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x16_t xk) {
    int16x8_t p0 = vmull_s8(vget_low_s8(w), vget_low_s8(xk)), p1 = vmull_s8(vget_high_s8(w), vget_high_s8(xk));
    return vaddq_s32(acc, vpaddlq_s16(vpaddq_s16(p0, p1))); /* |pair| ≤ 2·128·127: within i16 */
}
#define DOT4(acc, w, x, K) dot4(acc, w, vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(x), K)))
#endif

static inline float32x4_t f16x4(const uint16_t *h) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h))); }

/* The first count (≤ 8) of the 8 lanes lo, hi to y. */
static inline void store_rows(float *y, float32x4_t lo, float32x4_t hi, int64_t count) {
    if (count >= PL_PACK_ROWS) {
        vst1q_f32(y, lo);
        vst1q_f32(y + 4, hi);
    } else {
        float lanes[PL_PACK_ROWS];
        vst1q_f32(lanes, lo);
        vst1q_f32(lanes + 4, hi);
        memcpy(y, lanes, (size_t)count * sizeof(float));
    }
}

/* The dword index is an immediate of the by-lane dot: one case per chunk. */
#define FOR_CHUNKS4(BODY) BODY(0) BODY(1) BODY(2) BODY(3)

/* ================================================================ q4_1 × q8_1 */

static ALWAYS_INLINE void q4_1_tile(const pl_block_q4_1x8 *w, int64_t nb, const int G, const char *x, int64_t xs,
                                    const int T, float *y, int64_t ldy, int64_t rows_left) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    float32x4_t sd[2][4][2];
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++) UNROLLED for (int h = 0; h < 2; h++)
        sd[j][t][h] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int32x4_t acc[2][4][2];
        int8x16_t x0[4], x1[4]; /* activation qs[0..16), qs[16..32) */
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_1 *xb = (const pl_block_q8_1 *)(x + t * xs) + b;
            x0[t] = vld1q_s8(xb->qs);
            x1[t] = vld1q_s8(xb->qs + 16);
        }
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++)
            acc[j][t][0] = acc[j][t][1] = vdupq_n_s32(0);
#define CHUNK(K)                                                                                           \
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int h = 0; h < 2; h++) {                       \
            uint8x16_t v = vld1q_u8(w[j * nb + b].qs + 32 * (K) + 16 * h);                               \
            int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, low4)), hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4)); \
            UNROLLED for (int t = 0; t < T; t++)                                                         \
                acc[j][t][h] = DOT4(DOT4(acc[j][t][h], lo, x0[t], K), hi, x1[t], K);                     \
        }
        FOR_CHUNKS4(CHUNK)
#undef CHUNK
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int h = 0; h < 2; h++) {
            float32x4_t dw = f16x4(w[j * nb + b].d + 4 * h);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_1 *xb = (const pl_block_q8_1 *)(x + t * xs) + b;
                float32x4_t scale = vmulq_f32(dw, vdupq_n_f32(xb->d));
                sd[j][t][h] = vfmaq_f32(sd[j][t][h], vcvtq_f32_s32(acc[j][t][h]), scale);
            }
        }
    }
    /* the mins' share in a loop of its own, as in packed_avx2.c: fewer live registers in the main one */
    float32x4_t sm[2][4][2];
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++) UNROLLED for (int h = 0; h < 2; h++)
        sm[j][t][h] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++)
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int h = 0; h < 2; h++) {
            float32x4_t mw = f16x4(w[j * nb + b].m + 4 * h);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_1 *xb = (const pl_block_q8_1 *)(x + t * xs) + b;
                sm[j][t][h] = vfmaq_f32(sm[j][t][h], mw, vdupq_n_f32(xb->s));
            }
        }
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy + j * PL_PACK_ROWS, vaddq_f32(sd[j][t][0], sm[j][t][0]),
                   vaddq_f32(sd[j][t][1], sm[j][t][1]), rows_left - j * PL_PACK_ROWS);
}

/* ================================================================ q8_0 × q8_0 */

static ALWAYS_INLINE void q8_0_tile(const pl_block_q8_0x8 *w, int64_t nb, const int G, const char *x, int64_t xs,
                                    const int T, float *y, int64_t ldy, int64_t rows_left) {
    float32x4_t sd[2][4][2];
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++) UNROLLED for (int h = 0; h < 2; h++)
        sd[j][t][h] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int32x4_t acc[2][4][2];
        int8x16_t x0[4], x1[4]; /* activation qs[0..16): chunks 0..3, qs[16..32): chunks 4..7 */
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
            x0[t] = vld1q_s8(xb->qs);
            x1[t] = vld1q_s8(xb->qs + 16);
        }
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++)
            acc[j][t][0] = acc[j][t][1] = vdupq_n_s32(0);
#define CHUNK(K)                                                                                           \
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int h = 0; h < 2; h++) {                       \
            int8x16_t v0 = vld1q_s8(w[j * nb + b].qs + 32 * (K) + 16 * h);                               \
            int8x16_t v1 = vld1q_s8(w[j * nb + b].qs + 32 * ((K) + 4) + 16 * h);                         \
            UNROLLED for (int t = 0; t < T; t++)                                                         \
                acc[j][t][h] = DOT4(DOT4(acc[j][t][h], v0, x0[t], K), v1, x1[t], K);                     \
        }
        FOR_CHUNKS4(CHUNK)
#undef CHUNK
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int h = 0; h < 2; h++) {
            float32x4_t dw = f16x4(w[j * nb + b].d + 4 * h);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
                float32x4_t dx = vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(xb->d)));
                float32x4_t scale = vmulq_f32(dw, dx);
                sd[j][t][h] = vfmaq_f32(sd[j][t][h], vcvtq_f32_s32(acc[j][t][h]), scale);
            }
        }
    }
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy + j * PL_PACK_ROWS, sd[j][t][0], sd[j][t][1], rows_left - j * PL_PACK_ROWS);
}

/* ================================================================ q4_0 × q8_0 */

/* q − 8 made here as a signed byte (−8..7), as q5_0_tile's q − 16. */
static ALWAYS_INLINE void q4_0_tile(const pl_block_q4_0x8 *w, int64_t nb, const int G, const char *x, int64_t xs,
                                    const int T, float *y, int64_t ldy, int64_t rows_left) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t sd[2][4][2];
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++) UNROLLED for (int h = 0; h < 2; h++)
        sd[j][t][h] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int32x4_t acc[2][4][2];
        int8x16_t x0[4], x1[4]; /* activation qs[0..16): low elements, qs[16..32): high ones */
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
            x0[t] = vld1q_s8(xb->qs);
            x1[t] = vld1q_s8(xb->qs + 16);
        }
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++)
            acc[j][t][0] = acc[j][t][1] = vdupq_n_s32(0);
#define CHUNK(K)                                                                                           \
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int h = 0; h < 2; h++) {                       \
            uint8x16_t v = vld1q_u8(w[j * nb + b].qs + 32 * (K) + 16 * h);                               \
            int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, low4)), eight);                       \
            int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight);                        \
            UNROLLED for (int t = 0; t < T; t++)                                                         \
                acc[j][t][h] = DOT4(DOT4(acc[j][t][h], lo, x0[t], K), hi, x1[t], K);                     \
        }
        FOR_CHUNKS4(CHUNK)
#undef CHUNK
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int h = 0; h < 2; h++) {
            float32x4_t dw = f16x4(w[j * nb + b].d + 4 * h);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
                float32x4_t dx = vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(xb->d)));
                float32x4_t scale = vmulq_f32(dw, dx);
                sd[j][t][h] = vfmaq_f32(sd[j][t][h], vcvtq_f32_s32(acc[j][t][h]), scale);
            }
        }
    }
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy + j * PL_PACK_ROWS, sd[j][t][0], sd[j][t][1], rows_left - j * PL_PACK_ROWS);
}

/* ================================================================ q5_0 × q8_0 */

/* q − 16 made here as a signed byte (−16..15), so the block sums come out of the signed dot as in
 * q8_0_tile: the same exact integers as the scalar Σ(q − 16)·x. */
static ALWAYS_INLINE void q5_0_tile(const pl_block_q5_0x8 *w, int64_t nb, const int G, const char *x, int64_t xs,
                                    const int T, float *y, int64_t ldy, int64_t rows_left) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F), bit4 = vdupq_n_u8(0x10);
    const int8x16_t sixteen = vdupq_n_s8(16);
    float32x4_t sd[2][4][2];
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++) UNROLLED for (int h = 0; h < 2; h++)
        sd[j][t][h] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int32x4_t acc[2][4][2];
        int8x16_t x0[4], x1[4]; /* activation qs[0..16): low elements, qs[16..32): high ones */
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
            x0[t] = vld1q_s8(xb->qs);
            x1[t] = vld1q_s8(xb->qs + 16);
        }
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++)
            acc[j][t][0] = acc[j][t][1] = vdupq_n_s32(0);
#define CHUNK(K)                                                                                           \
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int h = 0; h < 2; h++) {                       \
            uint8x16_t v = vld1q_u8(w[j * nb + b].qs + 32 * (K) + 16 * h);                               \
            uint8x16_t qh = vld1q_u8(w[j * nb + b].qh + 16 * h);                                         \
            uint8x16_t hl = vandq_u8(vshlq_u8(qh, vdupq_n_s8(4 - (K))), bit4);                           \
            uint8x16_t hh = vandq_u8(vshlq_u8(qh, vdupq_n_s8(-(K))), bit4);                              \
            int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, low4), hl)), sixteen);        \
            int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), hh)), sixteen);         \
            UNROLLED for (int t = 0; t < T; t++)                                                         \
                acc[j][t][h] = DOT4(DOT4(acc[j][t][h], lo, x0[t], K), hi, x1[t], K);                     \
        }
        FOR_CHUNKS4(CHUNK)
#undef CHUNK
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int h = 0; h < 2; h++) {
            float32x4_t dw = f16x4(w[j * nb + b].d + 4 * h);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
                float32x4_t dx = vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(xb->d)));
                float32x4_t scale = vmulq_f32(dw, dx);
                sd[j][t][h] = vfmaq_f32(sd[j][t][h], vcvtq_f32_s32(acc[j][t][h]), scale);
            }
        }
    }
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy + j * PL_PACK_ROWS, sd[j][t][0], sd[j][t][1], rows_left - j * PL_PACK_ROWS);
}

/* ================================================================ q4_K × q8_K */

/* Rows 4h..4h+3's scale (mins 0) or min (mins 1) words: pl_k4x8_scales' sc or mn, one lane a row. */
static inline void k4x8_words(const pl_block_q4_Kx8 *b, int h, uint32x4_t *w0, uint32x4_t *w1, int mins) {
    const uint32x4_t low6 = vdupq_n_u32(0x3f3f3f3f), low4 = vdupq_n_u32(0x0f0f0f0f), top2 = vdupq_n_u32(0x03030303);
    uint32x4_t u0 = vld1q_u32(b->scales[mins ? 1 : 0] + 4 * h), u2 = vld1q_u32(b->scales[2] + 4 * h);
    if (mins) u2 = vshrq_n_u32(u2, 4);
    *w0 = vandq_u32(u0, low6);
    *w1 = vorrq_u32(vandq_u32(u2, low4), vshlq_n_u32(vandq_u32(vshrq_n_u32(u0, 6), top2), 4));
}

/* Byte s of each lane of word v, as an i32. */
static inline int32x4_t byte_of(uint32x4_t v, int s) {
    return vreinterpretq_s32_u32(vandq_u32(vshlq_u32(v, vdupq_n_s32(-8 * s)), vdupq_n_u32(0xFF)));
}

/* Sub-block by sub-block: per half of the rows, register (c, k)'s nibbles against activation dword
 * 64c + 32h + 4k give the sub-block's exact sums (the nibbles 0..15 are valid signed bytes), then
 * one multiply-add by the rows' scales. The mins' share from the activation's bsums, in integers.
 * q5_K (five): blocks of bs bytes, each a q4_Kx8 block and the fifth bits: bit sub of qh register k
 * completes register (c, k)'s nibbles to 5 bits (0..31, valid signed bytes too). */
static ALWAYS_INLINE void k4_tile(const char *w, const int64_t bs, const int five, int64_t nb, const int G,
                                  const char *x, int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F), bit4 = vdupq_n_u8(0x10);
    float32x4_t sd[2][4][2], sm[2][4][2];
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++) UNROLLED for (int h = 0; h < 2; h++)
        sd[j][t][h] = sm[j][t][h] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int half = 0; half < 2; half++) {
            const pl_block_q4_Kx8 *wb = (const pl_block_q4_Kx8 *)(w + (j * nb + b) * bs);
            const uint8_t *qh = five ? ((const pl_block_q5_Kx8 *)wb)->qh : NULL;
            uint32x4_t sc[2], mn[2];
            k4x8_words(wb, half, &sc[0], &sc[1], 0);
            k4x8_words(wb, half, &mn[0], &mn[1], 1);
            int32x4_t isum[4], imin[4];
            UNROLLED for (int t = 0; t < T; t++) isum[t] = imin[t] = vdupq_n_s32(0);
            for (int sub = 0; sub < 8; sub++) { /* rolled: clang will not unroll this much */
                const int c = sub / 2, h = sub % 2;
                const int8x16_t to_bit4 = vdupq_n_s8((int8_t)(4 - sub)); /* bit sub of a qh byte to bit 4 */
                int32x4_t s[4];
                int8x16_t x0[4], x1[4]; /* the sub-block's activation bytes 0..15 and 16..31 */
                UNROLLED for (int t = 0; t < T; t++) {
                    const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                    x0[t] = vld1q_s8(xb->qs + 64 * c + 32 * h);
                    x1[t] = vld1q_s8(xb->qs + 64 * c + 32 * h + 16);
                    s[t] = vdupq_n_s32(0);
                }
#define REG(K)                                                                                             \
                {                                                                                          \
                    uint8x16_t v0 = vld1q_u8(wb->qs + 256 * c + 32 * (K) + 16 * half);                     \
                    uint8x16_t v1 = vld1q_u8(wb->qs + 256 * c + 32 * ((K) + 4) + 16 * half);               \
                    uint8x16_t n0 = h ? vshrq_n_u8(v0, 4) : vandq_u8(v0, low4);                            \
                    uint8x16_t n1 = h ? vshrq_n_u8(v1, 4) : vandq_u8(v1, low4);                            \
                    if (five) {                                                                            \
                        uint8x16_t h0 = vld1q_u8(qh + 32 * (K) + 16 * half);                               \
                        uint8x16_t h1 = vld1q_u8(qh + 32 * ((K) + 4) + 16 * half);                         \
                        n0 = vorrq_u8(n0, vandq_u8(vshlq_u8(h0, to_bit4), bit4));                          \
                        n1 = vorrq_u8(n1, vandq_u8(vshlq_u8(h1, to_bit4), bit4));                          \
                    }                                                                                      \
                    int8x16_t q0 = vreinterpretq_s8_u8(n0), q1 = vreinterpretq_s8_u8(n1);                  \
                    UNROLLED for (int t = 0; t < T; t++) s[t] = DOT4(DOT4(s[t], q0, x0[t], K), q1, x1[t], K); \
                }
                FOR_CHUNKS4(REG)
#undef REG
                int32x4_t scale = byte_of(sc[sub / 4], sub % 4), min = byte_of(mn[sub / 4], sub % 4);
                UNROLLED for (int t = 0; t < T; t++) {
                    const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                    isum[t] = vmlaq_s32(isum[t], s[t], scale);
                    int32_t bsum = xb->bsums[2 * sub] + xb->bsums[2 * sub + 1];
                    imin[t] = vmlaq_s32(imin[t], min, vdupq_n_s32(bsum));
                }
            }
            float32x4_t dw = f16x4(wb->d + 4 * half), dmin = f16x4(wb->dmin + 4 * half);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                float32x4_t dx = vdupq_n_f32(xb->d);
                sd[j][t][half] = vfmaq_f32(sd[j][t][half], vcvtq_f32_s32(isum[t]), vmulq_f32(dw, dx));
                sm[j][t][half] = vfmaq_f32(sm[j][t][half], vcvtq_f32_s32(imin[t]), vmulq_f32(dmin, dx));
            }
        }
    }
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy + j * PL_PACK_ROWS, vsubq_f32(sd[j][t][0], sm[j][t][0]),
                   vsubq_f32(sd[j][t][1], sm[j][t][1]), rows_left - j * PL_PACK_ROWS);
}

static ALWAYS_INLINE void q4_K_tile(const pl_block_q4_Kx8 *w, int64_t nb, const int G, const char *x, int64_t xs,
                                    const int T, float *y, int64_t ldy, int64_t rows_left) {
    k4_tile((const char *)w, (int64_t)sizeof *w, 0, nb, G, x, xs, T, y, ldy, rows_left);
}

static ALWAYS_INLINE void q5_K_tile(const pl_block_q5_Kx8 *w, int64_t nb, const int G, const char *x, int64_t xs,
                                    const int T, float *y, int64_t ldy, int64_t rows_left) {
    k4_tile((const char *)w, (int64_t)sizeof *w, 1, nb, G, x, xs, T, y, ldy, rows_left);
}

/* ================================================================ q6_K × q8_K */

/* As q4_K_tile: per half of the rows and sub-block (16 elements, 4 registers), the 6-bit values (valid
 * signed bytes) against the activation give the sub-block's exact sums; the −32 of every element
 * as −32·bsums[s] before the scale. */
static ALWAYS_INLINE void q6_K_tile(const pl_block_q6_Kx8 *w, int64_t nb, const int G, const char *x, int64_t xs,
                                    const int T, float *y, int64_t ldy, int64_t rows_left) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F), top2 = vdupq_n_u8(0x30);
    float32x4_t sd[2][4][2];
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++) UNROLLED for (int h = 0; h < 2; h++)
        sd[j][t][h] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int half = 0; half < 2; half++) {
            const pl_block_q6_Kx8 *wb = &w[j * nb + b];
            int32x4_t isum[4];
            UNROLLED for (int t = 0; t < T; t++) isum[t] = vdupq_n_s32(0);
            for (int s = 0; s < 16; s++) { /* rolled, as q4_K_tile's */
                const int h = s / 8, high = s % 8 / 4, p = s % 4 / 2, kq = s % 2;
                int32x4_t sums[4];
                int8x16_t xv[4]; /* the sub-block's 16 activation bytes: dword kk is register 4kq + kk's */
                UNROLLED for (int t = 0; t < T; t++) {
                    const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                    xv[t] = vld1q_s8(xb->qs + 128 * h + 64 * high + 32 * p + 16 * kq);
                    sums[t] = vdupq_n_s32(0);
                }
#define REG(KK)                                                                                              \
                {                                                                                            \
                    const int k = 4 * kq + (KK);                                                             \
                    uint8x16_t v = vld1q_u8(wb->ql + 256 * (2 * h + p) + 32 * k + 16 * half);                \
                    uint8x16_t hb = vld1q_u8(wb->qh + 256 * h + 32 * k + 16 * half);                         \
                    uint8x16_t lo4 = high ? vshrq_n_u8(v, 4) : vandq_u8(v, low4);                            \
                    uint8x16_t hi2 = vandq_u8(vshlq_u8(hb, vdupq_n_s8(high ? -2 * p : 4 - 2 * p)), top2);   \
                    int8x16_t q = vreinterpretq_s8_u8(vorrq_u8(lo4, hi2));                                   \
                    UNROLLED for (int t = 0; t < T; t++) sums[t] = DOT4(sums[t], q, xv[t], KK);              \
                }
                FOR_CHUNKS4(REG)
#undef REG
                int32x4_t scale = vmovl_s16(vget_low_s16(vmovl_s8(vld1_s8(wb->scales[s] + 4 * half))));
                UNROLLED for (int t = 0; t < T; t++) {
                    const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                    int32x4_t centred = vsubq_s32(sums[t], vdupq_n_s32(32 * xb->bsums[s]));
                    isum[t] = vmlaq_s32(isum[t], centred, scale);
                }
            }
            float32x4_t dw = f16x4(wb->d + 4 * half);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                sd[j][t][half] = vfmaq_f32(sd[j][t][half], vcvtq_f32_s32(isum[t]), vmulq_f32(dw, vdupq_n_f32(xb->d)));
            }
        }
    }
    UNROLLED for (int j = 0; j < G; j++) UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy + j * PL_PACK_ROWS, sd[j][t][0], sd[j][t][1], rows_left - j * PL_PACK_ROWS);
}

/* Two groups at a time for one activation row, else tiles of 4 rows (see the top of this file). */
#define PACKED_GEMM(NAME, BLOCK, TILE)                                                                      \
    static void NAME(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end, const void *vx, \
                     int64_t xs, int n, float *y, int64_t ldy) {                                          \
        const BLOCK *w = packed;                                                                          \
        const char *x = vx;                                                                               \
        for (int64_t g = g0; g < g1;) {                                                                   \
            const BLOCK *wg = w + g * nb;                                                                 \
            float *yg = y + g * PL_PACK_ROWS;                                                             \
            int64_t left = row_end - g * PL_PACK_ROWS;                                                    \
            if (n == 1 && g + 1 < g1) {                                                                   \
                TILE(wg, nb, 2, x, xs, 1, yg, ldy, left);                                                 \
                g += 2;                                                                                   \
                continue;                                                                                 \
            }                                                                                             \
            int t = 0;                                                                                    \
            for (; t + 4 <= n; t += 4) TILE(wg, nb, 1, x + t * xs, xs, 4, yg + t * ldy, ldy, left);       \
            switch (n - t) {                                                                              \
            case 3: TILE(wg, nb, 1, x + t * xs, xs, 3, yg + t * ldy, ldy, left); break;                   \
            case 2: TILE(wg, nb, 1, x + t * xs, xs, 2, yg + t * ldy, ldy, left); break;                   \
            case 1: TILE(wg, nb, 1, x + t * xs, xs, 1, yg + t * ldy, ldy, left); break;                   \
            }                                                                                             \
            g++;                                                                                          \
        }                                                                                                 \
    }

PACKED_GEMM(gemm_q4_0x8_neon, pl_block_q4_0x8, q4_0_tile)
PACKED_GEMM(gemm_q4_1x8_neon, pl_block_q4_1x8, q4_1_tile)
PACKED_GEMM(gemm_q5_0x8_neon, pl_block_q5_0x8, q5_0_tile)
PACKED_GEMM(gemm_q8_0x8_neon, pl_block_q8_0x8, q8_0_tile)
PACKED_GEMM(gemm_q4_Kx8_neon, pl_block_q4_Kx8, q4_K_tile)
PACKED_GEMM(gemm_q5_Kx8_neon, pl_block_q5_Kx8, q5_K_tile)
PACKED_GEMM(gemm_q6_Kx8_neon, pl_block_q6_Kx8, q6_K_tile)

int pl_install_packed_neon(void) {
    pl_packed.q4_0 = gemm_q4_0x8_neon;
    pl_packed.q4_1 = gemm_q4_1x8_neon;
    pl_packed.q5_0 = gemm_q5_0x8_neon;
    pl_packed.q8_0 = gemm_q8_0x8_neon;
    pl_packed.q4_K = gemm_q4_Kx8_neon;
    pl_packed.q5_K = gemm_q5_Kx8_neon;
    pl_packed.q6_K = gemm_q6_Kx8_neon;
    return 1;
}

#else
int pl_install_packed_neon(void) { return 0; }
#endif
