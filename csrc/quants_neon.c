/* quants_neon.c — quantized dot products for AArch64 NEON.
 *
 * 16 int8 products at a time: vdotq_s32 where the compiler targets the dot-product extension
 * (__ARM_FEATURE_DOTPROD: Apple silicon, or a build for armv8.2-a+dotprod), else widening multiplies
 * and pairwise adds. Block sums are exact integers, as in quants.c; activations are quantized by
 * the scalar references.
 */
#include <string.h>

#include "quants.h"

#if defined(PL_ARM64) && defined(__ARM_NEON)
#include <arm_neon.h>

static inline float f16(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }

/* acc + Σ of 4 adjacent a·b products, per lane. */
static inline int32x4_t dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    int16x8_t p1 = vmull_s8(vget_high_s8(a), vget_high_s8(b));
    return vaddq_s32(acc, vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)));
#endif
}

/* Σ over a block of 32: a0·b[0..16) + a1·b[16..32). */
static inline int32x4_t dot32(int8x16_t a0, int8x16_t a1, const int8_t *b) {
    return dot_s8(dot_s8(vdupq_n_s32(0), a0, vld1q_s8(b)), a1, vld1q_s8(b + 16));
}

static inline void nibbles(const uint8_t *qs, int8x16_t *lo, int8x16_t *hi) {
    uint8x16_t q = vld1q_u8(qs);
    *lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
    *hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
}

/* Bit 4 of the 32 elements of a q5 block: 0x10 where qh's bit is set. */
static inline void high_bits(const uint8_t *qh, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t b = vld1q_u8(bit), b4 = vdupq_n_u8(0x10);
    uint8x16_t h0 = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
    uint8x16_t h1 = vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3]));
    *lo = vandq_u8(vtstq_u8(h0, b), b4);
    *hi = vandq_u8(vtstq_u8(h1, b), b4);
}

/* ================================================================ blocks of 32 */

static float vec_dot_q4_0_q8_0_neon(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_0 *w = vw;
    const pl_block_q8_0 *x = vx;
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    int64_t nb = n / QK, i = 0;
    for (; i < nb; i++) {
        int8x16_t lo, hi;
        nibbles(w[i].qs, &lo, &hi);
        int32x4_t s = dot32(vsubq_s8(lo, eight), vsubq_s8(hi, eight), x[i].qs);
        float32x4_t p = vmulq_n_f32(vcvtq_f32_s32(s), f16(w[i].d) * f16(x[i].d));
        if (i & 1) acc1 = vaddq_f32(acc1, p); else acc0 = vaddq_f32(acc0, p);
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1));
}

static float vec_dot_q8_0_q8_0_neon(const void *vw, const void *vx, int64_t n) {
    const pl_block_q8_0 *w = vw;
    const pl_block_q8_0 *x = vx;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / QK; i++) {
        int32x4_t s = dot32(vld1q_s8(w[i].qs), vld1q_s8(w[i].qs + 16), x[i].qs);
        float32x4_t p = vmulq_n_f32(vcvtq_f32_s32(s), f16(w[i].d) * f16(x[i].d));
        if (i & 1) acc1 = vaddq_f32(acc1, p); else acc0 = vaddq_f32(acc0, p);
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1));
}

static float vec_dot_q5_0_q8_0_neon(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_0 *w = vw;
    const pl_block_q8_0 *x = vx;
    const int8x16_t sixteen = vdupq_n_s8(16);
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / QK; i++) {
        int8x16_t lo, hi;
        uint8x16_t hlo, hhi;
        nibbles(w[i].qs, &lo, &hi);
        high_bits(w[i].qh, &hlo, &hhi);
        lo = vsubq_s8(vorrq_s8(lo, vreinterpretq_s8_u8(hlo)), sixteen);
        hi = vsubq_s8(vorrq_s8(hi, vreinterpretq_s8_u8(hhi)), sixteen);
        float32x4_t p = vmulq_n_f32(vcvtq_f32_s32(dot32(lo, hi, x[i].qs)), f16(w[i].d) * f16(x[i].d));
        if (i & 1) acc1 = vaddq_f32(acc1, p); else acc0 = vaddq_f32(acc0, p);
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1));
}

static float vec_dot_q4_1_q8_1_neon(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_1 *w = vw;
    const pl_block_q8_1 *x = vx;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    float summ = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        int8x16_t lo, hi;
        nibbles(w[i].qs, &lo, &hi);
        float32x4_t p = vmulq_n_f32(vcvtq_f32_s32(dot32(lo, hi, x[i].qs)), f16(w[i].d) * x[i].d);
        if (i & 1) acc1 = vaddq_f32(acc1, p); else acc0 = vaddq_f32(acc0, p);
        summ += f16(w[i].m) * x[i].s;
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1)) + summ;
}

static float vec_dot_q5_1_q8_1_neon(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_1 *w = vw;
    const pl_block_q8_1 *x = vx;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    float summ = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        int8x16_t lo, hi;
        uint8x16_t hlo, hhi;
        nibbles(w[i].qs, &lo, &hi);
        high_bits(w[i].qh, &hlo, &hhi);
        lo = vorrq_s8(lo, vreinterpretq_s8_u8(hlo));
        hi = vorrq_s8(hi, vreinterpretq_s8_u8(hhi));
        float32x4_t p = vmulq_n_f32(vcvtq_f32_s32(dot32(lo, hi, x[i].qs)), f16(w[i].d) * x[i].d);
        if (i & 1) acc1 = vaddq_f32(acc1, p); else acc0 = vaddq_f32(acc0, p);
        summ += f16(w[i].m) * x[i].s;
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1)) + summ;
}

/* ================================================================ k-quants */

/* Σ_j m_j · Σ y over sub-block j of a q4_K/q5_K super-block, from the activations' bsums. */
static inline int k4_mins_dot(const uint8_t *sm, const pl_block_q8_K *x) {
    int16x8_t bs = vpaddq_s16(vld1q_s16(x->bsums), vld1q_s16(x->bsums + 8));
    int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(sm + 8)));
    return vaddvq_s32(vaddq_s32(vmull_s16(vget_low_s16(bs), vget_low_s16(m)),
                                vmull_s16(vget_high_s16(bs), vget_high_s16(m))));
}

static float vec_dot_q4_K_q8_K_neon(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_K *w = vw;
    const pl_block_q8_K *x = vx;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sm[16];
        pl_unpack_scales_k4(w[i].scales, sm);
        const uint8_t *q = w[i].qs;
        const int8_t *y = x[i].qs;
        int32_t sumi = 0;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            uint8x16_t b0 = vld1q_u8(q), b1 = vld1q_u8(q + 16);
            int32x4_t lo = dot32(vreinterpretq_s8_u8(vandq_u8(b0, m4)), vreinterpretq_s8_u8(vandq_u8(b1, m4)), y);
            int32x4_t hi = dot32(vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), vreinterpretq_s8_u8(vshrq_n_u8(b1, 4)), y + 32);
            sumi += vaddvq_s32(lo) * sm[2 * c] + vaddvq_s32(hi) * sm[2 * c + 1];
        }
        sum += x[i].d * f16(w[i].d) * (float)sumi - x[i].d * f16(w[i].dmin) * (float)k4_mins_dot(sm, &x[i]);
    }
    return sum;
}

static float vec_dot_q5_K_q8_K_neon(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_K *w = vw;
    const pl_block_q8_K *x = vx;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), b4 = vdupq_n_u8(0x10);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sm[16];
        pl_unpack_scales_k4(w[i].scales, sm);
        const uint8_t *q = w[i].qs;
        const int8_t *y = x[i].qs;
        /* Chunk c's high bits are bits 2c and 2c+1 of qh: shift the bytes right by 2 a chunk. */
        uint8x16_t h0 = vld1q_u8(w[i].qh), h1 = vld1q_u8(w[i].qh + 16);
        int32_t sumi = 0;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            uint8x16_t b0 = vld1q_u8(q), b1 = vld1q_u8(q + 16);
            int8x16_t l0 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b0, m4), vandq_u8(vshlq_n_u8(h0, 4), b4)));
            int8x16_t l1 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b1, m4), vandq_u8(vshlq_n_u8(h1, 4), b4)));
            int8x16_t u0 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b0, 4), vandq_u8(vshlq_n_u8(h0, 3), b4)));
            int8x16_t u1 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b1, 4), vandq_u8(vshlq_n_u8(h1, 3), b4)));
            sumi += vaddvq_s32(dot32(l0, l1, y)) * sm[2 * c] + vaddvq_s32(dot32(u0, u1, y + 32)) * sm[2 * c + 1];
            h0 = vshrq_n_u8(h0, 2);
            h1 = vshrq_n_u8(h1, 2);
        }
        sum += x[i].d * f16(w[i].d) * (float)sumi - x[i].d * f16(w[i].dmin) * (float)k4_mins_dot(sm, &x[i]);
    }
    return sum;
}

static float vec_dot_q6_K_q8_K_neon(const void *vw, const void *vx, int64_t n) {
    const pl_block_q6_K *w = vw;
    const pl_block_q8_K *x = vx;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(0x30);
    const int8x16_t off = vdupq_n_s8(32);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t sumi = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[i].ql + 64 * h, *qh = w[i].qh + 32 * h;
            const int8_t *sc = w[i].scales + 8 * h, *y = x[i].qs + 128 * h;
            for (int k = 0; k < 2; k++) { /* 16 of the 32 l at a time: one scale per 16 elements */
                uint8x16_t hb = vld1q_u8(qh + 16 * k);
                uint8x16_t a = vld1q_u8(ql + 16 * k), b = vld1q_u8(ql + 32 + 16 * k);
                int8x16_t q0 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(a, m4), vandq_u8(vshlq_n_u8(hb, 4), m2))), off);
                int8x16_t q1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b, m4), vandq_u8(vshlq_n_u8(hb, 2), m2))), off);
                int8x16_t q2 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(a, 4), vandq_u8(hb, m2))), off);
                int8x16_t q3 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b, 4), vandq_u8(vshrq_n_u8(hb, 2), m2))), off);
                const int8_t *yk = y + 16 * k;
                sumi += vaddvq_s32(dot_s8(vdupq_n_s32(0), q0, vld1q_s8(yk))) * sc[k];
                sumi += vaddvq_s32(dot_s8(vdupq_n_s32(0), q1, vld1q_s8(yk + 32))) * sc[k + 2];
                sumi += vaddvq_s32(dot_s8(vdupq_n_s32(0), q2, vld1q_s8(yk + 64))) * sc[k + 4];
                sumi += vaddvq_s32(dot_s8(vdupq_n_s32(0), q3, vld1q_s8(yk + 96))) * sc[k + 6];
            }
        }
        sum += x[i].d * f16(w[i].d) * (float)sumi;
    }
    return sum;
}

int pl_install_quants_neon(void) {
    pl_traits_slot(PL_TYPE_Q4_0)->vec_dot = vec_dot_q4_0_q8_0_neon;
    pl_traits_slot(PL_TYPE_Q4_1)->vec_dot = vec_dot_q4_1_q8_1_neon;
    pl_traits_slot(PL_TYPE_Q5_0)->vec_dot = vec_dot_q5_0_q8_0_neon;
    pl_traits_slot(PL_TYPE_Q5_1)->vec_dot = vec_dot_q5_1_q8_1_neon;
    pl_traits_slot(PL_TYPE_Q8_0)->vec_dot = vec_dot_q8_0_q8_0_neon;
    pl_traits_slot(PL_TYPE_Q4_K)->vec_dot = vec_dot_q4_K_q8_K_neon;
    pl_traits_slot(PL_TYPE_Q5_K)->vec_dot = vec_dot_q5_K_q8_K_neon;
    pl_traits_slot(PL_TYPE_Q6_K)->vec_dot = vec_dot_q6_K_q8_K_neon;
    return 1;
}

#else
int pl_install_quants_neon(void) { return 0; }
#endif
