/* dtypes.c — float formats (f32, f16, bf16): scalar conversions, their reference kernels and the
 * type traits table that every weight type registers in. Quantized block formats are in quants.c. */
#include <math.h>
#include <string.h>

#include "kernels.h"

/* The scalar references round a·b + c twice with every compiler, as GCC does in ISO C mode (clang
 * would fuse it where FMA is baseline): the same bits on every architecture (tests/native). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(_MSC_VER)
#pragma fp_contract(off)
#endif

static pl_type_traits traits[PL_TYPE_COUNT];

pl_type_traits *pl_traits_slot(int type) {
    return type >= 0 && type < PL_TYPE_COUNT ? &traits[type] : NULL;
}

const pl_type_traits *pl_traits(int type) {
    const pl_type_traits *t = pl_traits_slot(type);
    return t && t->name ? t : NULL;
}

/* As ggml's block structs lay them out: a scale (f16 d, or d and a minimum m), the quants, and the
 * k-quants' sub-block scales. */
static const struct {
    const char *name;
    int64_t block_size, type_size;
} layouts[PL_TYPE_COUNT] = {
    [PL_TYPE_F32] = {"f32", 1, 4},
    [PL_TYPE_F16] = {"f16", 1, 2},
    [PL_TYPE_BF16] = {"bf16", 1, 2},
    [PL_TYPE_Q4_0] = {"q4_0", 32, 2 + 16},
    [PL_TYPE_Q4_1] = {"q4_1", 32, 2 + 2 + 16},
    [PL_TYPE_Q5_0] = {"q5_0", 32, 2 + 4 + 16},
    [PL_TYPE_Q5_1] = {"q5_1", 32, 2 + 2 + 4 + 16},
    [PL_TYPE_Q8_0] = {"q8_0", 32, 2 + 32},
    [PL_TYPE_Q8_1] = {"q8_1", 32, 4 + 4 + 32},
    [PL_TYPE_Q2_K] = {"q2_K", 256, 256 / 16 + 256 / 4 + 2 + 2},
    [PL_TYPE_Q3_K] = {"q3_K", 256, 256 / 8 + 256 / 4 + 12 + 2},
    [PL_TYPE_Q4_K] = {"q4_K", 256, 2 + 2 + 12 + 256 / 2},
    [PL_TYPE_Q5_K] = {"q5_K", 256, 2 + 2 + 12 + 256 / 8 + 256 / 2},
    [PL_TYPE_Q6_K] = {"q6_K", 256, 256 / 2 + 256 / 4 + 256 / 16 + 2},
    [PL_TYPE_Q8_K] = {"q8_K", 256, 4 + 256 + 256 / 16 * 2},
};

const char *pl_type_layout(int type, int64_t *block_size, int64_t *type_size) {
    if (type < 0 || type >= PL_TYPE_COUNT || !layouts[type].name) return NULL;
    *block_size = layouts[type].block_size;
    *type_size = layouts[type].type_size;
    return layouts[type].name;
}

int64_t pl_row_size(int type, int64_t n) {
    const pl_type_traits *t = pl_traits(type);
    if (!t || n < 0 || n % t->block_size) return -1;
    return n / t->block_size * t->type_size;
}

void pl_vec_dot_rows(const pl_type_traits *t, const void *w, const void *x, int64_t x_stride, int n_rows,
                     int64_t n, float *out, int64_t out_stride) {
    if (t->vec_dot_rows && n_rows > 1) {
        t->vec_dot_rows(w, x, x_stride, n_rows, n, out, out_stride);
        return;
    }
    for (int r = 0; r < n_rows; r++) out[r * out_stride] = t->vec_dot(w, (const char *)x + r * x_stride, n);
}

/* ---------------------------------------------------------------- scalar conversions */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float pl_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t pl_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* keep NaN a NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float pl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf, nan */
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        float v = (float)mant * (1.0f / 16777216.0f); /* subnormal: mant · 2^-24 */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t pl_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;        /* nan */
    if (a >= 0x477ff000u) return sign | 0x7c00u;       /* rounds to inf */
    if (a < 0x38800000u) {                              /* f16 subnormal or zero */
        float v = bits_f32(a) * 16777216.0f;            /* exact: scales by 2^24 */
        uint32_t m = (uint32_t)lrintf(v);               /* round to nearest even */
        return sign | (uint16_t)m;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23); /* rebias, round to nearest even */
    return sign | (uint16_t)(r >> 13);
}

/* ---------------------------------------------------------------- scalar reference kernels */

float pl_dot_f32_scalar(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void pl_axpy_f32_scalar(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

float pl_dot_f16_scalar(const float *a, const uint16_t *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * pl_f16_to_f32(b[i]);
    return s;
}

void pl_axpy_f16_scalar(float *y, float a, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * pl_f16_to_f32(x[i]);
}

PL_DOT_QK_FROM(dot_f32_qk, , float, pl_dot_f32_scalar)
PL_AXPY_QK_FROM(axpy_f32_qk, , float, pl_axpy_f32_scalar)
PL_DOT_QK_FROM(dot_f16_qk, , uint16_t, pl_dot_f16_scalar)
PL_AXPY_QK_FROM(axpy_f16_qk, , uint16_t, pl_axpy_f16_scalar)

static void f32_to_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
static void f32_from_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

static void f16_to_f32(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = pl_f16_to_f32(s[i]);
}

static void f16_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = pl_f32_to_f16(src[i]);
}

static void bf16_to_f32(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = pl_bf16_to_f32(s[i]);
}

static void bf16_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = pl_f32_to_bf16(src[i]);
}

static float dot_f32(const void *w, const void *x, int64_t n) { return pl_dot_f32_scalar(w, x, n); }

static float dot_f16(const void *w, const void *x, int64_t n) {
    const uint16_t *a = w;
    const float *b = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += pl_f16_to_f32(a[i]) * b[i];
    return s;
}

static float dot_bf16(const void *w, const void *x, int64_t n) {
    const uint16_t *a = w;
    const float *b = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += pl_bf16_to_f32(a[i]) * b[i];
    return s;
}

pl_vec_kernels pl_vec = {pl_dot_f32_scalar, pl_axpy_f32_scalar, pl_softmax_scalar, pl_swiglu_scalar,
                         pl_geglu_scalar,   pl_gelu_scalar,     pl_dot_f16_scalar, pl_axpy_f16_scalar,
                         dot_f32_qk,        axpy_f32_qk,        dot_f16_qk,        axpy_f16_qk};

/* Installs the scalar float kernels, then lets the chosen ISA's file replace what it speeds up. */
void pl_install_type_kernels(int isa) {
    traits[PL_TYPE_F32] = (pl_type_traits){"f32", 1, 4, PL_TYPE_F32, f32_to_f32, f32_from_f32, dot_f32, NULL, NULL};
    traits[PL_TYPE_F16] = (pl_type_traits){"f16", 1, 2, PL_TYPE_F32, f16_to_f32, f16_from_f32, dot_f16, NULL, NULL};
    traits[PL_TYPE_BF16] =
        (pl_type_traits){"bf16", 1, 2, PL_TYPE_F32, bf16_to_f32, bf16_from_f32, dot_bf16, NULL, NULL};
    pl_vec.dot_f32 = pl_dot_f32_scalar;
    pl_vec.axpy_f32 = pl_axpy_f32_scalar;
    pl_vec.softmax = pl_softmax_scalar;
    pl_vec.swiglu = pl_swiglu_scalar;
    pl_vec.geglu = pl_geglu_scalar;
    pl_vec.gelu = pl_gelu_scalar;
    pl_vec.dot_f16 = pl_dot_f16_scalar;
    pl_vec.axpy_f16 = pl_axpy_f16_scalar;
    pl_vec.dot_f32_qk = dot_f32_qk;
    pl_vec.axpy_f32_qk = axpy_f32_qk;
    pl_vec.dot_f16_qk = dot_f16_qk;
    pl_vec.axpy_f16_qk = axpy_f16_qk;
    /* An AVX-512 CPU runs the AVX2 kernels that have no wider variant. */
    if (isa == PL_ISA_AVX2 || isa == PL_ISA_AVX512) pl_install_simd_avx2();
    if (isa == PL_ISA_AVX512) pl_install_simd_avx512();
    if (isa == PL_ISA_NEON) pl_install_simd_neon();
}
