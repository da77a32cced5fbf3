/* quants.c — quantized block formats (ggml layouts, quants.h): scalar references and registration.
 *
 * Quantizers are ggml's reference ones (quantize_row_*_ref), operation for operation, so a tensor
 * quantized here has the bytes llama.cpp's quantizer (without an importance matrix) would write.
 * Floating-point contraction is off: a·b + c rounds twice, as in ggml's reference builds, with
 * every compiler — GCC in ISO C mode (-std=c11) by default, clang (whose default fuses where FMA is
 * baseline, as on AArch64 and Apple silicon, and then changes q6_K's bytes) and MSVC by the pragmas
 * below. Dot products are integer within a block and float across blocks.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "quants.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(_MSC_VER)
#pragma fp_contract(off)
#endif

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* Round to nearest, ties to even, for |f| < 2^22: ggml's nearest_int, independent of libm. */
static inline int nearest_int(float f) {
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

#define F16(h) pl_f16_to_f32(h)

/* ================================================================ dequantize */

static void q4_0_to_f32(const void *src, float *y, int64_t n) {
    const pl_block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        float d = F16(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[i].qs[j] & 0xF) - 8) * d;
            y[j + 16] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void q4_1_to_f32(const void *src, float *y, int64_t n) {
    const pl_block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        float d = F16(b[i].d), m = F16(b[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[i].qs[j] & 0xF) * d + m;
            y[j + 16] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void q5_0_to_f32(const void *src, float *y, int64_t n) {
    const pl_block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        float d = F16(b[i].d);
        uint32_t qh = load_u32(b[i].qh);
        for (int j = 0; j < 16; j++) {
            int q0 = (b[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int q1 = (b[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)(q0 - 16) * d;
            y[j + 16] = (float)(q1 - 16) * d;
        }
    }
}

static void q5_1_to_f32(const void *src, float *y, int64_t n) {
    const pl_block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        float d = F16(b[i].d), m = F16(b[i].m);
        uint32_t qh = load_u32(b[i].qh);
        for (int j = 0; j < 16; j++) {
            int q0 = (b[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int q1 = (b[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)q0 * d + m;
            y[j + 16] = (float)q1 * d + m;
        }
    }
}

static void q8_0_to_f32(const void *src, float *y, int64_t n) {
    const pl_block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        float d = F16(b[i].d);
        for (int j = 0; j < QK; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

static void q8_1_to_f32(const void *src, float *y, int64_t n) {
    const pl_block_q8_1 *b = src;
    for (int64_t i = 0; i < n / QK; i++, y += QK)
        for (int j = 0; j < QK; j++) y[j] = (float)b[i].qs[j] * b[i].d;
}

static void q4_K_to_f32(const void *src, float *y, int64_t n) {
    const pl_block_q4_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = F16(b[i].d), dmin = F16(b[i].dmin);
        uint8_t sm[16];
        pl_unpack_scales_k4(b[i].scales, sm);
        const uint8_t *q = b[i].qs;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            float d1 = d * sm[2 * c], m1 = dmin * sm[8 + 2 * c];
            float d2 = d * sm[2 * c + 1], m2 = dmin * sm[8 + 2 * c + 1];
            for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) y[32 + l] = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void q5_K_to_f32(const void *src, float *y, int64_t n) {
    const pl_block_q5_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = F16(b[i].d), dmin = F16(b[i].dmin);
        uint8_t sm[16];
        pl_unpack_scales_k4(b[i].scales, sm);
        const uint8_t *q = b[i].qs, *qh = b[i].qh;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            float d1 = d * sm[2 * c], m1 = dmin * sm[8 + 2 * c];
            float d2 = d * sm[2 * c + 1], m2 = dmin * sm[8 + 2 * c + 1];
            for (int l = 0; l < 32; l++)
                y[l] = d1 * (float)((q[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4)) - m1;
            for (int l = 0; l < 32; l++)
                y[32 + l] = d2 * (float)((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) - m2;
        }
    }
}

static void q6_K_to_f32(const void *src, float *y, int64_t n) {
    const pl_block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = F16(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int s = l / 16;
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[s] * (float)q1;
                y[l + 32] = d * (float)sc[s + 2] * (float)q2;
                y[l + 64] = d * (float)sc[s + 4] * (float)q3;
                y[l + 96] = d * (float)sc[s + 6] * (float)q4;
            }
        }
    }
}

static void q8_K_to_f32(const void *src, float *y, int64_t n) {
    const pl_block_q8_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K)
        for (int j = 0; j < QK_K; j++) y[j] = b[i].d * (float)b[i].qs[j];
}

/* ================================================================ quantize: blocks of 32 */

/* The element of largest magnitude, with its sign (the first one on ties). */
static inline float signed_absmax(const float *x, int n, float *amax_out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        if (amax < a) {
            amax = a;
            max = x[j];
        }
    }
    *amax_out = amax;
    return max;
}

static void q4_0_from_f32(const float *x, void *dst, int64_t n) {
    pl_block_q4_0 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax, max = signed_absmax(x, QK, &amax);
        float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = pl_f32_to_f16(d);
        for (int j = 0; j < 16; j++) {
            /* (int8_t) truncates toward zero, as ggml's reference does */
            uint8_t a = (uint8_t)MIN(15, (int8_t)(x[j] * id + 8.5f));
            uint8_t b = (uint8_t)MIN(15, (int8_t)(x[j + 16] * id + 8.5f));
            y[i].qs[j] = (uint8_t)(a | (b << 4));
        }
    }
}

/* Weights quantized at load get the scale that minimises the block's squared error, searched
 * around the reference's max/-8 and then refitted by least squares for the chosen codes: the same
 * bytes format, roughly a fifth less error than the reference encoder. */
static void q4_0_quantize_weights(const float *x, void *dst, int64_t n) {
    pl_block_q4_0 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax, max = signed_absmax(x, QK, &amax);
        float best_d = 0.0f, best_err = FLT_MAX;
        int8_t best_q[QK] = {0}, q[QK];
        for (int step = -9; step <= 9 && amax > 0.0f; step++) {
            float iscale = (-8.0f + 0.1f * (float)step) / max;
            float sxq = 0.0f, sqq = 0.0f;
            for (int j = 0; j < QK; j++) {
                int v = (int)lrintf(x[j] * iscale);
                q[j] = (int8_t)(v < -8 ? -8 : v > 7 ? 7 : v);
                sxq += x[j] * q[j];
                sqq += (float)(q[j] * q[j]);
            }
            if (sqq == 0.0f) continue;
            float d = pl_f16_to_f32(pl_f32_to_f16(sxq / sqq)); /* as it will be stored */
            float err = 0.0f;
            for (int j = 0; j < QK; j++) err += (x[j] - d * q[j]) * (x[j] - d * q[j]);
            if (err < best_err) {
                best_err = err;
                best_d = d;
                memcpy(best_q, q, sizeof q);
            }
        }
        y[i].d = pl_f32_to_f16(best_d);
        for (int j = 0; j < 16; j++)
            y[i].qs[j] = (uint8_t)((best_q[j] + 8) | ((best_q[j + 16] + 8) << 4));
    }
}

static void q4_1_from_f32(const float *x, void *dst, int64_t n) {
    pl_block_q4_1 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        float d = (max - min) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = pl_f32_to_f16(d);
        y[i].m = pl_f32_to_f16(min);
        for (int j = 0; j < 16; j++) {
            uint8_t a = (uint8_t)MIN(15, (int8_t)((x[j] - min) * id + 0.5f));
            uint8_t b = (uint8_t)MIN(15, (int8_t)((x[j + 16] - min) * id + 0.5f));
            y[i].qs[j] = (uint8_t)(a | (b << 4));
        }
    }
}

static void q5_0_from_f32(const float *x, void *dst, int64_t n) {
    pl_block_q5_0 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax, max = signed_absmax(x, QK, &amax);
        float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = pl_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            uint8_t a = (uint8_t)MIN(31, (int8_t)(x[j] * id + 16.5f));
            uint8_t b = (uint8_t)MIN(31, (int8_t)(x[j + 16] * id + 16.5f));
            y[i].qs[j] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
            qh |= (uint32_t)(a >> 4) << j;
            qh |= (uint32_t)(b >> 4) << (j + 16);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

static void q5_1_from_f32(const float *x, void *dst, int64_t n) {
    pl_block_q5_1 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        float d = (max - min) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = pl_f32_to_f16(d);
        y[i].m = pl_f32_to_f16(min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            uint8_t a = (uint8_t)MIN(31, (int)((x[j] - min) * id + 0.5f));
            uint8_t b = (uint8_t)MIN(31, (int)((x[j + 16] - min) * id + 0.5f));
            y[i].qs[j] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
            qh |= (uint32_t)((a >> 4) & 1) << j;
            qh |= (uint32_t)((b >> 4) & 1) << (j + 16);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

void pl_quantize_q8_0_ref(const float *x, void *dst, int64_t n) {
    pl_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = MAX(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = pl_f32_to_f16(d);
        for (int j = 0; j < QK; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

void pl_quantize_q8_1_ref(const float *x, void *dst, int64_t n) {
    pl_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = MAX(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = d;
        y[i].s = (float)sum * d;
    }
}

/* ================================================================ quantize: k-quants */

/* ggml's make_qkx2_quants: a scale and (non-positive) min for n values at levels 0..nmax, found by
 * weighted least squares over a sweep of trial scales. Returns the scale; *the_min = −min. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *w, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MAX(0, MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        best_error += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * (x[i] - min));
            l = MAX(0, MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                cur_error += w[i] * (diff * diff);
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* ggml's make_qx_quants with rmse_type 1 (weights x²) and no importance: a signed scale for levels
 * −nmax..nmax−1 (stored as L + nmax), refined over 18 trial scales around nmax/max. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < 1e-15f) { /* ggml's GROUP_MAX_EPS: all zero */
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = MAX(-nmax, MIN(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * x[i]);
            l = MAX(-nmax, MIN(nmax - 1, l));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + MAX(-nmax, MIN(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* The 6-bit scales and mins of 8 sub-blocks, packed as pl_get_scale_min_k4 reads them. */
static void pack_scales_k4(const float *scales, const float *mins, float max_scale, float max_min,
                           uint8_t *out) {
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < 8; j++) {
        /* uint8_t wraps as in ggml before the clamp */
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = MIN(63, ls);
        lm = MIN(63, lm);
        if (j < 4) {
            out[j] = ls;
            out[j + 4] = lm;
        } else {
            out[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            out[j - 4] |= (uint8_t)((ls >> 4) << 6);
            out[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
}

/* Shared by q4_K (nmax 15) and q5_K (nmax 31): levels L (256) of one super-block. */
static void quantize_k4_superblock(const float *x, int nmax, float rmin, int nstep, uint16_t *d_out,
                                   uint16_t *dmin_out, uint8_t *scales_out, uint8_t *L) {
    float mins[8], scales[8], weights[32];
    uint8_t Laux[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xb = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xb[l] * xb[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(xb[l]);
        scales[j] = make_qkx2_quants(32, nmax, xb, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                                     nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    pack_scales_k4(scales, mins, max_scale, max_min, scales_out);
    *d_out = pl_f32_to_f16(max_scale / 63.0f);
    *dmin_out = pl_f32_to_f16(max_min / 63.0f);
    /* Requantize against the scales as stored. */
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        pl_get_scale_min_k4(j, scales_out, &sc, &m);
        float d = F16(*d_out) * sc;
        if (!d) continue;
        float dm = F16(*dmin_out) * m;
        for (int l = 0; l < 32; l++) {
            int q = nearest_int((x[32 * j + l] + dm) / d);
            L[32 * j + l] = (uint8_t)MAX(0, MIN(nmax, q));
        }
    }
}

static void q4_K_from_f32(const float *x, void *dst, int64_t n) {
    pl_block_q4_K *y = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        memset(y[i].scales, 0, 12);
        quantize_k4_superblock(x, 15, -1.0f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *q = y[i].qs;
        for (int c = 0; c < QK_K; c += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[c + l] | (L[c + l + 32] << 4));
    }
}

static void q5_K_from_f32(const float *x, void *dst, int64_t n) {
    pl_block_q5_K *y = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        memset(y[i].scales, 0, 12);
        quantize_k4_superblock(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *ql = y[i].qs, *qh = y[i].qh;
        memset(qh, 0, 32);
        for (int c = 0; c < 4; c++, ql += 32) {
            for (int l = 0; l < 32; l++) {
                int l1 = L[64 * c + l], l2 = L[64 * c + l + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[l] |= (uint8_t)(1 << (2 * c));
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[l] |= (uint8_t)(2 << (2 * c));
                }
                ql[l] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

static void q6_K_from_f32(const float *x, void *dst, int64_t n) {
    pl_block_q6_K *y = dst;
    int8_t L[QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < 16; ib++) {
            float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) {
                max_abs_scale = fabsf(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < 1e-15f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -128.0f / max_scale;
        y[i].d = pl_f32_to_f16(1 / iscale);
        for (int ib = 0; ib < 16; ib++) y[i].scales[ib] = (int8_t)MIN(127, nearest_int(iscale * scales[ib]));
        for (int j = 0; j < 16; j++) {
            float d = F16(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int l = 0; l < 16; l++) {
                int q = nearest_int(x[16 * j + l] / d);
                L[16 * j + l] = (int8_t)(MAX(-32, MIN(31, q)) + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
                ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

void pl_quantize_q8_K_ref(const float *x, void *dst, int64_t n) {
    pl_block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax, max = signed_absmax(x, QK_K, &amax);
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)MIN(127, nearest_int(iscale * x[j]));
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ================================================================ dot products (scalar) */

static float vec_dot_q4_0_q8_0(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_0 *w = vw;
    const pl_block_q8_0 *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += ((w[i].qs[j] & 0xF) - 8) * x[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
        sum += (float)s * (F16(w[i].d) * F16(x[i].d));
    }
    return sum;
}

static float vec_dot_q4_1_q8_1(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_1 *w = vw;
    const pl_block_q8_1 *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += (w[i].qs[j] & 0xF) * x[i].qs[j] + (w[i].qs[j] >> 4) * x[i].qs[j + 16];
        sum += (float)s * (F16(w[i].d) * x[i].d) + F16(w[i].m) * x[i].s;
    }
    return sum;
}

static float vec_dot_q5_0_q8_0(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_0 *w = vw;
    const pl_block_q8_0 *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        uint32_t qh = load_u32(w[i].qh);
        int s = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = ((w[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4)) - 16;
            int q1 = ((w[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16;
            s += q0 * x[i].qs[j] + q1 * x[i].qs[j + 16];
        }
        sum += (float)s * (F16(w[i].d) * F16(x[i].d));
    }
    return sum;
}

static float vec_dot_q5_1_q8_1(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_1 *w = vw;
    const pl_block_q8_1 *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        uint32_t qh = load_u32(w[i].qh);
        int s = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (w[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int q1 = (w[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            s += q0 * x[i].qs[j] + q1 * x[i].qs[j + 16];
        }
        sum += (float)s * (F16(w[i].d) * x[i].d) + F16(w[i].m) * x[i].s;
    }
    return sum;
}

static float vec_dot_q8_0_q8_0(const void *vw, const void *vx, int64_t n) {
    const pl_block_q8_0 *w = vw;
    const pl_block_q8_0 *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        int s = 0;
        for (int j = 0; j < QK; j++) s += w[i].qs[j] * x[i].qs[j];
        sum += (float)s * (F16(w[i].d) * F16(x[i].d));
    }
    return sum;
}

/* q4_K, q5_K: Σ d·sc_j·Σ q·y − dmin·Σ m_j·Σ y, the second from the activations' bsums. */
static float vec_dot_q4_K_q8_K(const void *vw, const void *vx, int64_t n) {
    const pl_block_q4_K *w = vw;
    const pl_block_q8_K *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sm[16];
        pl_unpack_scales_k4(w[i].scales, sm);
        const uint8_t *q = w[i].qs;
        const int8_t *y = x[i].qs;
        int sumi = 0, summ = 0;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            int s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += (q[l] & 0xF) * y[l];
                s2 += (q[l] >> 4) * y[l + 32];
            }
            sumi += sm[2 * c] * s1 + sm[2 * c + 1] * s2;
        }
        for (int j = 0; j < 8; j++) summ += sm[8 + j] * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        sum += x[i].d * F16(w[i].d) * (float)sumi - x[i].d * F16(w[i].dmin) * (float)summ;
    }
    return sum;
}

static float vec_dot_q5_K_q8_K(const void *vw, const void *vx, int64_t n) {
    const pl_block_q5_K *w = vw;
    const pl_block_q8_K *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sm[16];
        pl_unpack_scales_k4(w[i].scales, sm);
        const uint8_t *q = w[i].qs, *qh = w[i].qh;
        const int8_t *y = x[i].qs;
        int sumi = 0, summ = 0;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            int s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += ((q[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4)) * y[l];
                s2 += ((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) * y[l + 32];
            }
            sumi += sm[2 * c] * s1 + sm[2 * c + 1] * s2;
        }
        for (int j = 0; j < 8; j++) summ += sm[8 + j] * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        sum += x[i].d * F16(w[i].d) * (float)sumi - x[i].d * F16(w[i].dmin) * (float)summ;
    }
    return sum;
}

static float vec_dot_q6_K_q8_K(const void *vw, const void *vx, int64_t n) {
    const pl_block_q6_K *w = vw;
    const pl_block_q8_K *x = vx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = w[i].ql, *qh = w[i].qh;
        const int8_t *sc = w[i].scales, *y = x[i].qs;
        int sumi = 0;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
            int s[8] = {0};
            for (int l = 0; l < 32; l++) {
                int g = l / 16;
                s[g] += (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32) * y[l];
                s[g + 2] += (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32) * y[l + 32];
                s[g + 4] += (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32) * y[l + 64];
                s[g + 6] += (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32) * y[l + 96];
            }
            for (int g = 0; g < 8; g++) sumi += sc[g] * s[g];
        }
        sum += x[i].d * F16(w[i].d) * (float)sumi;
    }
    return sum;
}

/* ================================================================ registration */

static void set_traits(int type, const char *name, int64_t block_size, int64_t type_size,
                       int vec_dot_type, pl_to_f32_fn to_f32, pl_from_f32_fn from_f32,
                       pl_vec_dot_fn vec_dot) {
    *pl_traits_slot(type) =
        (pl_type_traits){name, block_size, type_size, vec_dot_type, to_f32, from_f32, vec_dot, NULL, NULL};
}

/* The struct sizes are the file format: a compiler that pads one would misread every tensor. */
typedef char check_q4_0[sizeof(pl_block_q4_0) == 18 ? 1 : -1];
typedef char check_q4_1[sizeof(pl_block_q4_1) == 20 ? 1 : -1];
typedef char check_q5_0[sizeof(pl_block_q5_0) == 22 ? 1 : -1];
typedef char check_q5_1[sizeof(pl_block_q5_1) == 24 ? 1 : -1];
typedef char check_q8_0[sizeof(pl_block_q8_0) == 34 ? 1 : -1];
typedef char check_q8_1[sizeof(pl_block_q8_1) == 40 ? 1 : -1];
typedef char check_q4_K[sizeof(pl_block_q4_K) == 144 ? 1 : -1];
typedef char check_q5_K[sizeof(pl_block_q5_K) == 176 ? 1 : -1];
typedef char check_q6_K[sizeof(pl_block_q6_K) == 210 ? 1 : -1];
typedef char check_q8_K[sizeof(pl_block_q8_K) == 292 ? 1 : -1];

void pl_install_quant_kernels(int isa) {
    set_traits(PL_TYPE_Q4_0, "q4_0", QK, sizeof(pl_block_q4_0), PL_TYPE_Q8_0, q4_0_to_f32,
               q4_0_from_f32, vec_dot_q4_0_q8_0);
    pl_traits_slot(PL_TYPE_Q4_0)->quantize_weights = q4_0_quantize_weights;
    set_traits(PL_TYPE_Q4_1, "q4_1", QK, sizeof(pl_block_q4_1), PL_TYPE_Q8_1, q4_1_to_f32,
               q4_1_from_f32, vec_dot_q4_1_q8_1);
    set_traits(PL_TYPE_Q5_0, "q5_0", QK, sizeof(pl_block_q5_0), PL_TYPE_Q8_0, q5_0_to_f32,
               q5_0_from_f32, vec_dot_q5_0_q8_0);
    set_traits(PL_TYPE_Q5_1, "q5_1", QK, sizeof(pl_block_q5_1), PL_TYPE_Q8_1, q5_1_to_f32,
               q5_1_from_f32, vec_dot_q5_1_q8_1);
    set_traits(PL_TYPE_Q8_0, "q8_0", QK, sizeof(pl_block_q8_0), PL_TYPE_Q8_0, q8_0_to_f32,
               pl_quantize_q8_0_ref, vec_dot_q8_0_q8_0);
    set_traits(PL_TYPE_Q8_1, "q8_1", QK, sizeof(pl_block_q8_1), PL_TYPE_Q8_1, q8_1_to_f32,
               pl_quantize_q8_1_ref, NULL);
    set_traits(PL_TYPE_Q4_K, "q4_K", QK_K, sizeof(pl_block_q4_K), PL_TYPE_Q8_K, q4_K_to_f32,
               q4_K_from_f32, vec_dot_q4_K_q8_K);
    set_traits(PL_TYPE_Q5_K, "q5_K", QK_K, sizeof(pl_block_q5_K), PL_TYPE_Q8_K, q5_K_to_f32,
               q5_K_from_f32, vec_dot_q5_K_q8_K);
    set_traits(PL_TYPE_Q6_K, "q6_K", QK_K, sizeof(pl_block_q6_K), PL_TYPE_Q8_K, q6_K_to_f32,
               q6_K_from_f32, vec_dot_q6_K_q8_K);
    set_traits(PL_TYPE_Q8_K, "q8_K", QK_K, sizeof(pl_block_q8_K), PL_TYPE_Q8_K, q8_K_to_f32,
               pl_quantize_q8_K_ref, NULL);
    if (isa == PL_ISA_AVX2) pl_install_quants_avx2();
    if (isa == PL_ISA_AVX512) pl_install_quants_avx512();
    if (isa == PL_ISA_NEON) pl_install_quants_neon();
}
