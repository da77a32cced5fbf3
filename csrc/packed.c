/* packed.c — the 8-row interleaved layouts (packed.h): repacking, the scalar reference kernels, and
 * the table the ISA installs its kernels into.
 *
 * The references are plain C: fmaf where the contract fuses, and no contraction anywhere else, so
 * that a compiler cannot fuse dw·dx into the next addition on one architecture and not on another.
 */
#include <math.h>
#include <string.h>

#include "packed.h"
#include "quants.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(_MSC_VER)
#pragma fp_contract(off)
#endif

/* The layout is the contract with every ISA's kernel and with the tests. */
typedef char check_q4_0x8[sizeof(pl_block_q4_0x8) == 144 ? 1 : -1];
typedef char check_q4_1x8[sizeof(pl_block_q4_1x8) == 160 ? 1 : -1];
typedef char check_q8_0x8[sizeof(pl_block_q8_0x8) == 272 ? 1 : -1];
typedef char check_q5_0x8[sizeof(pl_block_q5_0x8) == 176 ? 1 : -1];
typedef char check_q4_Kx8[sizeof(pl_block_q4_Kx8) == 1152 ? 1 : -1];
typedef char check_q5_Kx8[sizeof(pl_block_q5_Kx8) == 1408 ? 1 : -1];
typedef char check_q6_Kx8[sizeof(pl_block_q6_Kx8) == 1680 ? 1 : -1];

pl_packed_kernels pl_packed = {pl_gemm_q4_0x8_scalar, pl_gemm_q4_1x8_scalar, pl_gemm_q5_0x8_scalar,
                               pl_gemm_q8_0x8_scalar, pl_gemm_q4_Kx8_scalar, pl_gemm_q5_Kx8_scalar,
                               pl_gemm_q6_Kx8_scalar};

int pl_packed_type(int type) {
    return type == PL_TYPE_Q4_0 || type == PL_TYPE_Q4_1 || type == PL_TYPE_Q5_0 || type == PL_TYPE_Q8_0 ||
           type == PL_TYPE_Q4_K || type == PL_TYPE_Q5_K || type == PL_TYPE_Q6_K;
}

pl_packed_gemm_fn pl_packed_kernel_of(const pl_packed_kernels *k, int type) {
    switch (type) {
    case PL_TYPE_Q4_0: return k->q4_0;
    case PL_TYPE_Q4_1: return k->q4_1;
    case PL_TYPE_Q5_0: return k->q5_0;
    case PL_TYPE_Q4_K: return k->q4_K;
    case PL_TYPE_Q5_K: return k->q5_K;
    case PL_TYPE_Q6_K: return k->q6_K;
    default: return k->q8_0;
    }
}

static int64_t packed_block_size(int type) {
    switch (type) {
    case PL_TYPE_Q4_0: return (int64_t)sizeof(pl_block_q4_0x8);
    case PL_TYPE_Q4_1: return (int64_t)sizeof(pl_block_q4_1x8);
    case PL_TYPE_Q5_0: return (int64_t)sizeof(pl_block_q5_0x8);
    case PL_TYPE_Q4_K: return (int64_t)sizeof(pl_block_q4_Kx8);
    case PL_TYPE_Q5_K: return (int64_t)sizeof(pl_block_q5_Kx8);
    case PL_TYPE_Q6_K: return (int64_t)sizeof(pl_block_q6_Kx8);
    default: return (int64_t)sizeof(pl_block_q8_0x8);
    }
}

int64_t pl_packed_bytes(int type, int64_t rows, int64_t cols) {
    if (!pl_packed_type(type) || rows < 0 || cols < 0) return -1;
    int64_t elems = pl_traits(type)->block_size;
    if (cols % elems) return -1;
    int64_t groups = (rows + PL_PACK_ROWS - 1) / PL_PACK_ROWS;
    return groups * (cols / elems) * packed_block_size(type);
}

/* A q4_1 block keeps elements j and 16 + j in the low and high nibble of qs[j], so qs[4k + i] already
 * is the packed byte of elements 4k + i and 16 + 4k + i: packing moves 4-byte runs. */
static void pack_q4_1(const pl_block_q4_1 *const src[PL_PACK_ROWS], pl_block_q4_1x8 *dst) {
    for (int r = 0; r < PL_PACK_ROWS; r++) {
        dst->d[r] = src[r]->d;
        dst->m[r] = src[r]->m;
        for (int k = 0; k < 4; k++) memcpy(&dst->qs[32 * k + 4 * r], &src[r]->qs[4 * k], 4);
    }
}

static void pack_q4_0(const pl_block_q4_0 *const src[PL_PACK_ROWS], pl_block_q4_0x8 *dst) {
    for (int r = 0; r < PL_PACK_ROWS; r++) {
        dst->d[r] = src[r]->d;
        for (int k = 0; k < 4; k++) memcpy(&dst->qs[32 * k + 4 * r], &src[r]->qs[4 * k], 4);
    }
}

static void pack_q8_0(const pl_block_q8_0 *const src[PL_PACK_ROWS], pl_block_q8_0x8 *dst) {
    for (int r = 0; r < PL_PACK_ROWS; r++) {
        dst->d[r] = src[r]->d;
        for (int k = 0; k < 8; k++) memcpy(&dst->qs[32 * k + 4 * r], &src[r]->qs[4 * k], 4);
    }
}

/* The low 4 bits move as q4_1's; the fifth bits of elements 4k + i and 16 + 4k + i go to bits k and
 * 4 + k of the byte beside them. */
static void pack_q5_0(const pl_block_q5_0 *const src[PL_PACK_ROWS], pl_block_q5_0x8 *dst) {
    for (int r = 0; r < PL_PACK_ROWS; r++) {
        dst->d[r] = src[r]->d;
        uint32_t h = (uint32_t)src[r]->qh[0] | (uint32_t)src[r]->qh[1] << 8 | (uint32_t)src[r]->qh[2] << 16 |
                     (uint32_t)src[r]->qh[3] << 24;
        for (int k = 0; k < 4; k++) memcpy(&dst->qs[32 * k + 4 * r], &src[r]->qs[4 * k], 4);
        for (int i = 0; i < 4; i++) {
            unsigned byte = 0;
            for (int k = 0; k < 4; k++)
                byte |= (h >> (4 * k + i) & 1) << k | (h >> (16 + 4 * k + i) & 1) << (4 + k);
            dst->qh[4 * r + i] = (uint8_t)byte;
        }
    }
}

/* Row r of a q4_K or q5_K super-block (d, dmin, its 12 scale bytes, the low 4 bits qs): qs moves in
 * 4-byte runs as q4_1's; the scale bytes become three words, assembled little-endian so that the
 * kernels' arithmetic on them is the same on any host. */
static void pack_k4_row(pl_block_q4_Kx8 *dst, int r, uint16_t d, uint16_t dmin, const uint8_t *scales,
                        const uint8_t *qs) {
    dst->d[r] = d;
    dst->dmin[r] = dmin;
    for (int w = 0; w < 3; w++) {
        const uint8_t *b = scales + 4 * w;
        dst->scales[w][r] = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    }
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 8; k++) memcpy(&dst->qs[256 * c + 32 * k + 4 * r], &qs[32 * c + 4 * k], 4);
}

static void pack_q4_K(const pl_block_q4_K *const src[PL_PACK_ROWS], pl_block_q4_Kx8 *dst) {
    for (int r = 0; r < PL_PACK_ROWS; r++) pack_k4_row(dst, r, src[r]->d, src[r]->dmin, src[r]->scales, src[r]->qs);
}

/* As q4_K, and qh in 4-byte runs beside the qs bytes of the same elements. */
static void pack_q5_K(const pl_block_q5_K *const src[PL_PACK_ROWS], pl_block_q5_Kx8 *dst) {
    for (int r = 0; r < PL_PACK_ROWS; r++) {
        pack_k4_row(&dst->low, r, src[r]->d, src[r]->dmin, src[r]->scales, src[r]->qs);
        for (int k = 0; k < 8; k++) memcpy(&dst->qh[32 * k + 4 * r], &src[r]->qh[4 * k], 4);
    }
}

/* ql and qh move in 4-byte runs, the scales a byte each. */
static void pack_q6_K(const pl_block_q6_K *const src[PL_PACK_ROWS], pl_block_q6_Kx8 *dst) {
    for (int r = 0; r < PL_PACK_ROWS; r++) {
        dst->d[r] = src[r]->d;
        for (int s = 0; s < 16; s++) dst->scales[s][r] = src[r]->scales[s];
        for (int k = 0; k < 8; k++) {
            for (int m = 0; m < 4; m++) memcpy(&dst->ql[256 * m + 32 * k + 4 * r], &src[r]->ql[32 * m + 4 * k], 4);
            for (int h = 0; h < 2; h++) memcpy(&dst->qh[256 * h + 32 * k + 4 * r], &src[r]->qh[32 * h + 4 * k], 4);
        }
    }
}

int pl_pack_groups(int type, const void *src, int64_t rows, int64_t cols, void *dst, int64_t g0, int64_t g1) {
    int64_t groups = (rows + PL_PACK_ROWS - 1) / PL_PACK_ROWS;
    if (pl_packed_bytes(type, rows, cols) < 0 || g0 < 0 || g1 < g0 || g1 > groups) return PL_ERR_ARGS;
    int64_t nb = cols / pl_traits(type)->block_size, row_bytes = pl_row_size(type, cols), bs = packed_block_size(type);
    /* Padding rows read a zero block: d = m = 0 and zero quants give exact zeros. */
    static const uint8_t zero[sizeof(pl_block_q6_K)]; /* the largest of the source blocks */
    for (int64_t g = g0; g < g1; g++)
        for (int64_t b = 0; b < nb; b++) {
            const void *blk[PL_PACK_ROWS];
            for (int r = 0; r < PL_PACK_ROWS; r++) {
                int64_t row = g * PL_PACK_ROWS + r;
                blk[r] = row < rows ? (const char *)src + row * row_bytes + b * pl_traits(type)->type_size
                                : (const void *)zero;
            }
            void *out = (char *)dst + (g * nb + b) * bs;
            if (type == PL_TYPE_Q4_0)
                pack_q4_0((const pl_block_q4_0 *const *)blk, out);
            else if (type == PL_TYPE_Q4_1)
                pack_q4_1((const pl_block_q4_1 *const *)blk, out);
            else if (type == PL_TYPE_Q5_0)
                pack_q5_0((const pl_block_q5_0 *const *)blk, out);
            else if (type == PL_TYPE_Q4_K)
                pack_q4_K((const pl_block_q4_K *const *)blk, out);
            else if (type == PL_TYPE_Q5_K)
                pack_q5_K((const pl_block_q5_K *const *)blk, out);
            else if (type == PL_TYPE_Q6_K)
                pack_q6_K((const pl_block_q6_K *const *)blk, out);
            else
                pack_q8_0((const pl_block_q8_0 *const *)blk, out);
        }
    return PL_OK;
}

int pl_gemm_packed(int type, const void *packed, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                   const void *x, int64_t x_stride, int n, float *y, int64_t ldy) {
    if (pl_packed_bytes(type, rows, cols) < 0 || r0 < 0 || r0 % PL_PACK_ROWS || r1 < r0 || r1 > rows || n < 0)
        return PL_ERR_ARGS;
    if (r1 == r0 || n == 0 || cols == 0) {
        /* an empty row (cols 0) dots to 0 */
        for (int t = 0; t < n; t++)
            for (int64_t r = r0; r < r1; r++) y[t * ldy + r] = 0.0f;
        return PL_OK;
    }
    pl_packed_gemm_fn kernel = pl_packed_kernel_of(&pl_packed, type);
    int64_t nb = cols / pl_traits(type)->block_size;
    kernel(packed, nb, r0 / PL_PACK_ROWS, (r1 + PL_PACK_ROWS - 1) / PL_PACK_ROWS, r1, x, x_stride, n, y, ldy);
    return PL_OK;
}

/* ---------------------------------------------------------------- scalar references */

#define F16(h) pl_f16_to_f32(h)

void pl_gemm_q4_0x8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy) {
    const pl_block_q4_0x8 *w = packed;
    for (int64_t g = g0; g < g1; g++)
        for (int r = 0; r < PL_PACK_ROWS && g * PL_PACK_ROWS + r < row_end; r++)
            for (int t = 0; t < n; t++) {
                const pl_block_q8_0 *xb = (const pl_block_q8_0 *)((const char *)x + t * x_stride);
                float sd = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const pl_block_q4_0x8 *wb = &w[g * nb + b];
                    int isum = 0;
                    for (int k = 0; k < 4; k++)
                        for (int i = 0; i < 4; i++) {
                            int q = wb->qs[32 * k + 4 * r + i];
                            isum += ((q & 0xF) - 8) * xb[b].qs[4 * k + i] + ((q >> 4) - 8) * xb[b].qs[16 + 4 * k + i];
                        }
                    float scale = F16(wb->d[r]) * F16(xb[b].d);
                    sd = fmaf((float)isum, scale, sd);
                }
                y[t * ldy + g * PL_PACK_ROWS + r] = sd;
            }
}

void pl_gemm_q4_1x8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy) {
    const pl_block_q4_1x8 *w = packed;
    for (int64_t g = g0; g < g1; g++)
        for (int r = 0; r < PL_PACK_ROWS && g * PL_PACK_ROWS + r < row_end; r++)
            for (int t = 0; t < n; t++) {
                const pl_block_q8_1 *xb = (const pl_block_q8_1 *)((const char *)x + t * x_stride);
                float sd = 0.0f, sm = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const pl_block_q4_1x8 *wb = &w[g * nb + b];
                    int isum = 0;
                    for (int k = 0; k < 4; k++)
                        for (int i = 0; i < 4; i++) {
                            int q = wb->qs[32 * k + 4 * r + i];
                            isum += (q & 0xF) * xb[b].qs[4 * k + i] + (q >> 4) * xb[b].qs[16 + 4 * k + i];
                        }
                    float scale = F16(wb->d[r]) * xb[b].d;
                    sd = fmaf((float)isum, scale, sd);
                    sm = fmaf(F16(wb->m[r]), xb[b].s, sm);
                }
                y[t * ldy + g * PL_PACK_ROWS + r] = sd + sm;
            }
}

void pl_gemm_q5_0x8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy) {
    const pl_block_q5_0x8 *w = packed;
    for (int64_t g = g0; g < g1; g++)
        for (int r = 0; r < PL_PACK_ROWS && g * PL_PACK_ROWS + r < row_end; r++)
            for (int t = 0; t < n; t++) {
                const pl_block_q8_0 *xb = (const pl_block_q8_0 *)((const char *)x + t * x_stride);
                float sd = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const pl_block_q5_0x8 *wb = &w[g * nb + b];
                    int isum = 0;
                    for (int k = 0; k < 4; k++)
                        for (int i = 0; i < 4; i++) {
                            int q = wb->qs[32 * k + 4 * r + i], h = wb->qh[4 * r + i];
                            int lo = (q & 0xF) | (h >> k & 1) << 4, hi = (q >> 4) | (h >> (4 + k) & 1) << 4;
                            isum += (lo - 16) * xb[b].qs[4 * k + i] + (hi - 16) * xb[b].qs[16 + 4 * k + i];
                        }
                    float scale = F16(wb->d[r]) * F16(xb[b].d);
                    sd = fmaf((float)isum, scale, sd);
                }
                y[t * ldy + g * PL_PACK_ROWS + r] = sd;
            }
}

void pl_gemm_q8_0x8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy) {
    const pl_block_q8_0x8 *w = packed;
    for (int64_t g = g0; g < g1; g++)
        for (int r = 0; r < PL_PACK_ROWS && g * PL_PACK_ROWS + r < row_end; r++)
            for (int t = 0; t < n; t++) {
                const pl_block_q8_0 *xb = (const pl_block_q8_0 *)((const char *)x + t * x_stride);
                float sd = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const pl_block_q8_0x8 *wb = &w[g * nb + b];
                    int isum = 0;
                    for (int k = 0; k < 8; k++)
                        for (int i = 0; i < 4; i++) isum += wb->qs[32 * k + 4 * r + i] * xb[b].qs[4 * k + i];
                    float scale = F16(wb->d[r]) * F16(xb[b].d);
                    sd = fmaf((float)isum, scale, sd);
                }
                y[t * ldy + g * PL_PACK_ROWS + r] = sd;
            }
}

/* q4_K and q5_K: a q5_Kx8 block is a q4_Kx8 one and the fifth bits (qh, NULL for q4_K), bs bytes apart. */
static void gemm_k4x8_scalar(const char *packed, int64_t bs, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                             const void *x, int64_t x_stride, int n, float *y, int64_t ldy, int five) {
    for (int64_t g = g0; g < g1; g++)
        for (int r = 0; r < PL_PACK_ROWS && g * PL_PACK_ROWS + r < row_end; r++)
            for (int t = 0; t < n; t++) {
                const pl_block_q8_K *xb = (const pl_block_q8_K *)((const char *)x + t * x_stride);
                float sd = 0.0f, sm = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const pl_block_q4_Kx8 *wb = (const pl_block_q4_Kx8 *)(packed + (g * nb + b) * bs);
                    const uint8_t *qh = five ? ((const pl_block_q5_Kx8 *)wb)->qh : NULL;
                    uint32_t sc[2], mn[2];
                    pl_k4x8_scales(wb, r, sc, mn);
                    int isum = 0, imin = 0;
                    for (int j = 0; j < 8; j++) { /* sub-block j: nibble j % 2 of registers c = j / 2 */
                        int c = j / 2, h = j % 2, s = 0;
                        for (int k = 0; k < 8; k++)
                            for (int i = 0; i < 4; i++) {
                                int q = wb->qs[256 * c + 32 * k + 4 * r + i];
                                q = h ? q >> 4 : q & 0xF;
                                if (five) q |= (qh[32 * k + 4 * r + i] >> j & 1) << 4;
                                s += q * xb[b].qs[64 * c + 32 * h + 4 * k + i];
                            }
                        int shift = 8 * (j % 4);
                        isum += (int)(sc[j / 4] >> shift & 0xFF) * s;
                        imin += (int)(mn[j / 4] >> shift & 0xFF) * (xb[b].bsums[2 * j] + xb[b].bsums[2 * j + 1]);
                    }
                    sd = fmaf((float)isum, F16(wb->d[r]) * xb[b].d, sd);
                    sm = fmaf((float)imin, F16(wb->dmin[r]) * xb[b].d, sm);
                }
                y[t * ldy + g * PL_PACK_ROWS + r] = sd - sm;
            }
}

void pl_gemm_q4_Kx8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy) {
    gemm_k4x8_scalar(packed, (int64_t)sizeof(pl_block_q4_Kx8), nb, g0, g1, row_end, x, x_stride, n, y, ldy, 0);
}

void pl_gemm_q5_Kx8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy) {
    gemm_k4x8_scalar(packed, (int64_t)sizeof(pl_block_q5_Kx8), nb, g0, g1, row_end, x, x_stride, n, y, ldy, 1);
}

/* Row r's 6-bit element e (< 256) of a q6_Kx8 block: the low 4 bits from ql, the top 2 from qh. */
static int q6_Kx8_element(const pl_block_q6_Kx8 *b, int r, int e) {
    int h = e / 128, p = e / 32 % 2, high = e / 64 % 2, l = e % 32; /* l = 4k + i */
    int at = 32 * (l / 4) + 4 * r + l % 4; /* register l / 4, row r, byte l % 4 */
    int lo = b->ql[256 * (2 * h + p) + at], hb = b->qh[256 * h + at];
    return (high ? lo >> 4 : lo & 0xF) | (hb >> (4 * high + 2 * p) & 3) << 4;
}

void pl_gemm_q6_Kx8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy) {
    const pl_block_q6_Kx8 *w = packed;
    for (int64_t g = g0; g < g1; g++)
        for (int r = 0; r < PL_PACK_ROWS && g * PL_PACK_ROWS + r < row_end; r++)
            for (int t = 0; t < n; t++) {
                const pl_block_q8_K *xb = (const pl_block_q8_K *)((const char *)x + t * x_stride);
                float sd = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const pl_block_q6_Kx8 *wb = &w[g * nb + b];
                    int isum = 0;
                    for (int s = 0; s < 16; s++) {
                        int sum = 0;
                        for (int e = 16 * s; e < 16 * s + 16; e++) sum += q6_Kx8_element(wb, r, e) * xb[b].qs[e];
                        isum += wb->scales[s][r] * (sum - 32 * xb[b].bsums[s]);
                    }
                    sd = fmaf((float)isum, F16(wb->d[r]) * xb[b].d, sd);
                }
                y[t * ldy + g * PL_PACK_ROWS + r] = sd;
            }
}

static const char *installed = "scalar";

void pl_install_packed_kernels(int isa) {
    pl_packed.q4_0 = pl_gemm_q4_0x8_scalar;
    pl_packed.q4_1 = pl_gemm_q4_1x8_scalar;
    pl_packed.q5_0 = pl_gemm_q5_0x8_scalar;
    pl_packed.q8_0 = pl_gemm_q8_0x8_scalar;
    pl_packed.q4_K = pl_gemm_q4_Kx8_scalar;
    pl_packed.q5_K = pl_gemm_q5_Kx8_scalar;
    pl_packed.q6_K = pl_gemm_q6_Kx8_scalar;
    installed = "scalar";
    /* An AVX-512 machine runs the AVX2 kernels, or with VNNI their vpdpbusd build: see packed_avx2.c.
     * An AVX2 machine with AVX-VNNI (without AVX-512) runs that build's VEX form. */
    if (isa == PL_ISA_AVX512 && pl_cpu_has_vnni() && pl_install_packed_vnni())
        installed = "vnni";
    else if (isa == PL_ISA_AVX2 && pl_cpu_has_avx_vnni() && pl_install_packed_avxvnni())
        installed = "avxvnni";
    else if ((isa == PL_ISA_AVX2 || isa == PL_ISA_AVX512) && pl_install_packed_avx2())
        installed = "avx2";
    else if (isa == PL_ISA_NEON && pl_install_packed_neon())
        installed = "neon";
}

const char *pl_packed_kernels_name(void) { return installed; }
