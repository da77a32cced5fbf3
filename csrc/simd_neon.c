/* simd_neon.c — f32/f16/bf16 kernels for AArch64 (NEON and half-precision conversion are baseline). */
#include "kernels.h"

#if defined(PL_ARM64) && defined(__ARM_NEON)
#include <arm_neon.h>

static inline float32x4_t load_bf16(const uint16_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

static inline float32x4_t load_f16(const uint16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

#define DOT_BODY(LOAD_W)                                                         \
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);                    \
    float32x4_t acc2 = vdupq_n_f32(0), acc3 = vdupq_n_f32(0);                    \
    int64_t i = 0;                                                               \
    for (; i + 16 <= n; i += 16) {                                               \
        acc0 = vfmaq_f32(acc0, LOAD_W(a + i), vld1q_f32(b + i));                 \
        acc1 = vfmaq_f32(acc1, LOAD_W(a + i + 4), vld1q_f32(b + i + 4));         \
        acc2 = vfmaq_f32(acc2, LOAD_W(a + i + 8), vld1q_f32(b + i + 8));         \
        acc3 = vfmaq_f32(acc3, LOAD_W(a + i + 12), vld1q_f32(b + i + 12));       \
    }                                                                            \
    for (; i + 4 <= n; i += 4) acc0 = vfmaq_f32(acc0, LOAD_W(a + i), vld1q_f32(b + i)); \
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));

static float dot_f32_neon(const float *a, const float *b, int64_t n) {
    DOT_BODY(vld1q_f32)
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static float vec_dot_f32_neon(const void *w, const void *x, int64_t n) { return dot_f32_neon(w, x, n); }

static float vec_dot_bf16_neon(const void *w, const void *x, int64_t n) {
    const uint16_t *a = w;
    const float *b = x;
    DOT_BODY(load_bf16)
    for (; i < n; i++) s += pl_bf16_to_f32(a[i]) * b[i];
    return s;
}

static float vec_dot_f16_neon(const void *w, const void *x, int64_t n) {
    const uint16_t *a = w;
    const float *b = x;
    DOT_BODY(load_f16)
    for (; i < n; i++) s += pl_f16_to_f32(a[i]) * b[i];
    return s;
}

static void axpy_f32_neon(float *y, float a, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; i++) y[i] += a * x[i];
}

PL_DOT_QK_FROM(dot_f32_qk_neon, , float, dot_f32_neon)
PL_AXPY_QK_FROM(axpy_f32_qk_neon, , float, axpy_f32_neon)

static void bf16_to_f32_neon(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, load_bf16(s + i));
    for (; i < n; i++) dst[i] = pl_bf16_to_f32(s[i]);
}

static void f16_to_f32_neon(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, load_f16(s + i));
    for (; i < n; i++) dst[i] = pl_f16_to_f32(s[i]);
}

int pl_install_simd_neon(void) {
    pl_traits_slot(PL_TYPE_F32)->vec_dot = vec_dot_f32_neon;
    pl_traits_slot(PL_TYPE_F16)->vec_dot = vec_dot_f16_neon;
    pl_traits_slot(PL_TYPE_F16)->to_f32 = f16_to_f32_neon;
    pl_traits_slot(PL_TYPE_BF16)->vec_dot = vec_dot_bf16_neon;
    pl_traits_slot(PL_TYPE_BF16)->to_f32 = bf16_to_f32_neon;
    pl_vec.dot_f32 = dot_f32_neon;
    pl_vec.axpy_f32 = axpy_f32_neon;
    pl_vec.dot_f32_qk = dot_f32_qk_neon;
    pl_vec.axpy_f32_qk = axpy_f32_qk_neon;
    return 1;
}

#else
int pl_install_simd_neon(void) { return 0; }
#endif
