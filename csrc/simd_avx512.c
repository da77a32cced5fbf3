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

PL_TARGET_AVX512 static float dot_f32_avx512(const float *a, const float *b, int64_t n) {
    DOT_BODY(_mm512_loadu_ps)
    for (; i < n; i++) s += a[i] * b[i];
    return s;
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

PL_DOT_QK_FROM(dot_f32_qk_avx512, PL_TARGET_AVX512, float, dot_f32_avx512)
PL_AXPY_QK_FROM(axpy_f32_qk_avx512, PL_TARGET_AVX512, float, axpy_f32_avx512)

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
