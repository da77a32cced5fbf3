/* packed.h — weights repacked at load, 8 rows interleaved, and the one GEMM kernel that multiplies
 * them by any number of activation rows.
 *
 * Why: the row-at-a-time kernels (quants*.c) reduce every block horizontally and give a result
 * whose float order depends on how many activation rows share the pass. Here 8 weight rows sit
 * side by side in each packed block, so one 32-byte load holds 4 elements of each of the 8 rows,
 * an integer multiply against one broadcast activation dword gives the 8 rows' partial sums in 8
 * lanes, and nothing is ever reduced across lanes. Every (weight row, activation row) result is
 * computed by the same sequence of float operations whatever the number of activation rows, the
 * tile or row range it falls in, and the ISA: prefill, a batch of decode steps and a single step
 * give the same bits.
 *
 * Layout (q4_1x8). Rows are taken in groups of 8 (the last padded with zero blocks); for group g and
 * block index b (nb = cols / 32 blocks per row) one packed block at byte (g·nb + b)·160:
 *     d[8], m[8]  the 8 rows' f16 scales and mins of block b
 *     qs[128]     qs[32k + 4r + i] = q[r][4k + i] | q[r][16 + 4k + i] << 4,  k < 4, r < 8, i < 4
 * (q[r][e]: the 4-bit element e of row r's block b). Chunk k's 32 bytes hold, per row, elements
 * 4k..4k+3 in the low nibbles and 16+4k..16+4k+3 in the high ones: multiplied against the
 * activation block's qs dwords at 4k and 16 + 4k, broadcast.
 * q8_0x8 is the same with 8 chunks of bytes: d[8], qs[32k + 4r + i] = q[r][4k + i], k < 8 (272 bytes).
 * q5_0x8 keeps q4_1x8's qs for the low 4 bits and adds the 8 rows' fifth bits, one byte per qs lane:
 *     d[8]        f16 scales
 *     qh[32]      bit k of qh[4r + i] = bit 4 of q[r][4k + i], bit 4 + k = bit 4 of q[r][16 + 4k + i], k < 4
 *     qs[128]     as q4_1x8 (the low 4 bits of q[r][e])
 * (176 bytes, the 8 source blocks' size): for chunk k, qh shifted so that bit k (bit 4 + k) lands
 * on bit 4 of each byte completes the low (high) nibbles to 5 bits, all chunks from one 32-byte qh.
 * q4_0x8 is q4_1x8 without the mins: d[8], qs[128] (144 bytes).
 * Scales stay f16: the packed matrix is exactly as large as the source (decode is memory-bound).
 * q4_Kx8 packs 8 rows' super-blocks of 256 (cols / 256 per row):
 *     d[8], dmin[8]  f16
 *     scales[w][r]   row r's scale bytes 4w .. 4w + 3 as one little-endian word (w < 3): the 8 rows'
 *                    6-bit scales and mins unpack in 8 lanes at once (pl_k4x8_scales)
 *     qs[1024]       qs[256c + 32k + 4r + i] = row r's qs[32c + 4k + i], c < 4, k < 8
 * (1,152 bytes, the 8 source blocks' size). Register (c, k) holds, per row, elements 4k..4k+3 of
 * sub-block 2c in its low nibbles and of sub-block 2c + 1 in its high ones.
 * q5_Kx8 is a q4_Kx8 block of the low 4 bits, scales and mins, followed by the 8 rows' fifth bits:
 *     qh[256]        qh[32k + 4r + i] = row r's qh[4k + i], k < 8
 * (1,408 bytes). Register k of qh lines up with registers (c, k) of qs byte for byte: bit j of a qh
 * byte is the fifth bit of the element of sub-block j (c = j / 2, low nibble for even j) beside it.
 * q6_Kx8 packs 8 rows' q6_K super-blocks the same way:
 *     d[8]           f16
 *     scales[16][8]  scales[s][r] = row r's int8 scale of sub-block s (16 elements)
 *     ql[1024]       ql[256m + 32k + 4r + i] = row r's ql[32m + 4k + i], m < 4, k < 8
 *     qh[512]        qh[256h + 32k + 4r + i] = row r's qh[32h + 4k + i], h < 2
 * (1,680 bytes). Register (m = 2h + p, k) of ql holds, per row, the low 4 bits of elements
 * 128h + 32p + 4k + i in its low nibbles and of 64 more in its high ones; their top 2 bits are bits
 * 2p (low) and 4 + 2p (high) of the same bytes of qh register (h, k).
 *
 * The float-order contract. For each output (weight row r, activation row t), isum_b = Σ_e q_w·q_x
 * over block b is an exact int32 (for blocks of 32 |isum_b| < 2^24, so (float)isum_b is exact too;
 * a k-quant super-block's can pass 2^24 and (float) rounds it to nearest, alike on every ISA), and
 *     q4_1 × q8_1:  sd = 0, sm = 0; for b = 0 .. nb-1 in order:
 *                       sd = fmaf((float)isum_b, dw_b·dx_b, sd);  sm = fmaf(mw_b, sx_b, sm)
 *                   y = sd + sm
 *     q8_0 × q8_0:  sd = 0; for b in order: sd = fmaf((float)isum_b, dw_b·dx_b, sd);  y = sd
 *     q5_0 × q8_0:  the same, isum_b = Σ_e (q_w − 16)·q_x (q_w the unsigned 5-bit value 0..31)
 *     q4_0 × q8_0:  the same, isum_b = Σ_e (q_w − 8)·q_x (q_w the unsigned 4-bit value 0..15)
 *     q4_K × q8_K:  sd = 0, sm = 0; for super-block b in order, isum_b = Σ_j sc_j·Σ_{e in j} q_w·q_x and
 *                   imin_b = Σ_j m_j·(bsums[2j] + bsums[2j+1]) over its 8 sub-blocks j (exact int32s):
 *                       sd = fmaf((float)isum_b, dw_b·dx_b, sd);  sm = fmaf((float)imin_b, dminw_b·dx_b, sm)
 *                   y = sd − sm
 *     q5_K × q8_K:  the same, q_w the unsigned 5-bit value 0..31
 *     q6_K × q8_K:  sd = 0; for b in order, isum_b = Σ_s sc_s·(Σ_{e in s} q_w·q_x − 32·bsums[s]) over its 16
 *                   sub-blocks s (q_w the unsigned 6-bit value 0..63; exact):
 *                       sd = fmaf((float)isum_b, dw_b·dx_b, sd);  y = sd
 * where dw_b·dx_b is one rounded f32 product of the widened f16 weight scale and the activation's
 * scale (q8_1 and q8_K: its f32 d; q8_0: its widened f16 d), mw_b the widened f16 min, sx_b the q8_1 block's
 * f32 s. The scalar reference spells this with fmaf (compiled without contraction), the SIMD kernels
 * with one fused multiply-add per lane (_mm256_fmadd_ps, vfmaq_f32): every ISA gives the same bits.
 * The result differs from vec_dot's (another order) by a few ulps of the block sums.
 */
#ifndef PYLLM_PACKED_H
#define PYLLM_PACKED_H

#include "kernels.h"

#define PL_PACK_ROWS 8

typedef struct {
    uint16_t d[PL_PACK_ROWS], m[PL_PACK_ROWS]; /* f16, row r's d and m in lane r */
    uint8_t qs[128];                           /* see above: 4 chunks of 32 bytes */
} pl_block_q4_1x8;                             /* 160 bytes: 8 q4_1 blocks */

typedef struct {
    uint16_t d[PL_PACK_ROWS];
    uint8_t qs[128];                           /* as q4_1x8's */
} pl_block_q4_0x8;                             /* 144 bytes: 8 q4_0 blocks */

typedef struct {
    uint16_t d[PL_PACK_ROWS];
    int8_t qs[256];                            /* 8 chunks of 32 bytes */
} pl_block_q8_0x8;                             /* 272 bytes: 8 q8_0 blocks */

typedef struct {
    uint16_t d[PL_PACK_ROWS];
    uint8_t qh[32];                            /* the fifth bits, see above */
    uint8_t qs[128];                           /* the low 4 bits: 4 chunks of 32 bytes as q4_1x8 */
} pl_block_q5_0x8;                             /* 176 bytes: 8 q5_0 blocks */

typedef struct {
    uint16_t d[PL_PACK_ROWS], dmin[PL_PACK_ROWS];
    uint32_t scales[3][PL_PACK_ROWS];          /* see above */
    uint8_t qs[1024];                          /* 4 × 8 registers of 32 bytes */
} pl_block_q4_Kx8;                             /* 1,152 bytes: 8 q4_K super-blocks */

typedef struct {
    pl_block_q4_Kx8 low;                       /* the low 4 bits, the scales and the mins */
    uint8_t qh[256];                           /* the fifth bits: 8 registers, see above */
} pl_block_q5_Kx8;                             /* 1,408 bytes: 8 q5_K super-blocks */

typedef struct {
    uint16_t d[PL_PACK_ROWS];
    int8_t scales[16][PL_PACK_ROWS];
    uint8_t ql[1024];                          /* 4 × 8 registers of 32 bytes, see above */
    uint8_t qh[512];                           /* 2 × 8 registers */
} pl_block_q6_Kx8;                             /* 1,680 bytes: 8 q6_K super-blocks */

/* Row r's 8 sub-block scales and mins of a q4_Kx8 block from its three words: word 0 (1) of sc holds
 * sub-blocks 0..3 (4..7), a byte each, as does mn for the mins; the arithmetic of
 * pl_get_scale_min_k4 on the 4 bytes of each word at once. The SIMD kernels do the same on 8 rows. */
static inline void pl_k4x8_scales(const pl_block_q4_Kx8 *b, int r, uint32_t sc[2], uint32_t mn[2]) {
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x03030303;
    uint32_t u0 = b->scales[0][r], u1 = b->scales[1][r], u2 = b->scales[2][r];
    sc[0] = u0 & low6;
    sc[1] = (u2 & low4) | ((u0 >> 6) & top2) << 4;
    mn[0] = u1 & low6;
    mn[1] = ((u2 >> 4) & low4) | ((u1 >> 6) & top2) << 4;
}

/* Whether weights of this type can be packed: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K. */
int pl_packed_type(int type);
/* Bytes of a packed (rows, cols) matrix, rows padded to a multiple of 8; -1 for a type that cannot
 * be packed or cols not whole blocks (32 elements, or 256 for the k-quants). */
int64_t pl_packed_bytes(int type, int64_t rows, int64_t cols);
/* Repacks row groups [g0, g1) of src (rows × pl_row_size(type, cols) bytes, the file's layout) into
 * dst (pl_packed_bytes); a range of groups at a time, so that loading can split it over threads.
 * PL_OK, or PL_ERR_ARGS (nothing written) for a bad type, shape or group range. */
int pl_pack_groups(int type, const void *src, int64_t rows, int64_t cols, void *dst, int64_t g0, int64_t g1);
/* y[t·ldy + r] = row r of W · activation row t, for r in [r0, r1) (r0 a multiple of 8, r1 ≤ rows)
 * and t < n. x: n rows of the type's vec_dot_type (q8_1 for q4_1, q8_0 for q4_0, q5_0 and q8_0, q8_K for
 * the k-quants), x_stride bytes
 * apart. Bit-identical for any n, r0, r1 and ISA. PL_OK, or PL_ERR_ARGS (nothing written). */
int pl_gemm_packed(int type, const void *packed, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                   const void *x, int64_t x_stride, int n, float *y, int64_t ldy);

/* One kernel: row groups [g0, g1) of a packed matrix of nb blocks (the type's) per row, results for rows below
 * row_end only (the last group may be partial). Arguments already checked. */
typedef void (*pl_packed_gemm_fn)(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                                  const void *x, int64_t x_stride, int n, float *y, int64_t ldy);
typedef struct {
    pl_packed_gemm_fn q4_0, q4_1, q5_0, q8_0, q4_K, q5_K, q6_K;
} pl_packed_kernels;
extern pl_packed_kernels pl_packed;

/* The scalar references (packed.c), the kernels every ISA must equal bit for bit. */
void pl_gemm_q4_0x8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy);
void pl_gemm_q4_1x8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy);
void pl_gemm_q5_0x8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy);
void pl_gemm_q8_0x8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy);
void pl_gemm_q4_Kx8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy);
void pl_gemm_q5_Kx8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy);
void pl_gemm_q6_Kx8_scalar(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end,
                           const void *x, int64_t x_stride, int n, float *y, int64_t ldy);
/* The kernel of a packable type in the table k. */
pl_packed_gemm_fn pl_packed_kernel_of(const pl_packed_kernels *k, int type);

/* Installs the packed kernels of isa (cpu.c's pl_set_isa); the per-ISA installers return 0 where
 * not compiled in. */
void pl_install_packed_kernels(int isa);
int pl_install_packed_avx2(void);
int pl_install_packed_vnni(void);
int pl_install_packed_avxvnni(void);
int pl_packed_avxvnni_compiled(void); /* whether this core has the AVX-VNNI build (its compiler knew it) */
/* Which build of the kernels is installed: "scalar", "avx2", "vnni", "avxvnni" or "neon". */
const char *pl_packed_kernels_name(void);
int pl_install_packed_neon(void);

#endif
