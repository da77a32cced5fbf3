/* quants.h — ggml's quantized block layouts, as GGUF files store them, and what the per-ISA quant
 * files share with quants.c.
 *
 * Blocks of 32 (q4_0 … q8_1) carry one scale; super-blocks of 256 (the k-quants) carry a scale per
 * sub-block, itself quantized. Scales are f16 bit patterns (uint16_t) except in the activation-only
 * formats q8_1 and q8_K, which keep f32. Every struct packs to ggml's size without padding.
 */
#ifndef PYLLM_QUANTS_H
#define PYLLM_QUANTS_H

#include "kernels.h"

#define QK 32   /* elements of a q4_0 … q8_1 block */
#define QK_K 256 /* elements of a k-quant super-block */

typedef struct {
    uint16_t d;       /* f16 scale: x = d·(q − 8) */
    uint8_t qs[16];   /* element j in the low nibble of qs[j], j + 16 in the high one */
} pl_block_q4_0;      /* 18 bytes */

typedef struct {
    uint16_t d, m;    /* f16: x = d·q + m */
    uint8_t qs[16];
} pl_block_q4_1;      /* 20 bytes */

typedef struct {
    uint16_t d;       /* x = d·(q − 16) */
    uint8_t qh[4];    /* bit j (little-endian u32) = bit 4 of element j */
    uint8_t qs[16];   /* low 4 bits, nibbles as in q4_0 */
} pl_block_q5_0;      /* 22 bytes */

typedef struct {
    uint16_t d, m;    /* x = d·q + m */
    uint8_t qh[4];
    uint8_t qs[16];
} pl_block_q5_1;      /* 24 bytes */

typedef struct {
    uint16_t d;       /* x = d·q */
    int8_t qs[32];
} pl_block_q8_0;      /* 34 bytes */

/* Activations against q4_1/q5_1: s = d·Σq lets the weights' min fold in as m·s. ggml's current
 * block keeps d and s as f16 (36 bytes); never stored in files, so pyllm keeps them f32 (the
 * 40-byte layout gguf-py and pyllm.dtypes list), which also keeps the dot more exact. */
typedef struct {
    float d, s;
    int8_t qs[32];
} pl_block_q8_1;      /* 40 bytes */

typedef struct {
    uint16_t d, dmin;    /* f16 super-scales of the 6-bit sub-block scales and mins */
    uint8_t scales[12];  /* 8 scales and 8 mins, 6 bits each (see pl_get_scale_min_k4) */
    uint8_t qs[128];     /* 64 elements per 32 bytes: low nibbles the first 32, high the next */
} pl_block_q4_K;         /* 144 bytes: x = d·sc·q − dmin·m */

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];      /* bit 2c (2c+1) of qh[l]: bit 4 of element l (l + 32) of chunk c of 64 */
    uint8_t qs[128];
} pl_block_q5_K;         /* 176 bytes */

typedef struct {
    uint8_t ql[128];     /* low 4 bits, per half of 128: [0,32) and [32,64) low nibbles, then high */
    uint8_t qh[64];      /* high 2 bits, per half: 4 elements l, l+32, l+64, l+96 in qh[l] */
    int8_t scales[16];   /* one per 16 elements */
    uint16_t d;
} pl_block_q6_K;         /* 210 bytes: x = d·sc·(q − 32) */

typedef struct {
    float d;
    int8_t qs[256];
    int16_t bsums[16];   /* Σ qs over each 16 elements: the k-quants' mins fold in through these */
} pl_block_q8_K;         /* 292 bytes */

/* Sub-block j's 6-bit scale and min of a q4_K / q5_K super-block. */
static inline void pl_get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* All 8 scales (out[0..7]) and mins (out[8..15]) of a q4_K / q5_K super-block at once. */
static inline void pl_unpack_scales_k4(const uint8_t *q, uint8_t out[16]) {
    for (int j = 0; j < 8; j++) pl_get_scale_min_k4(j, q, &out[j], &out[8 + j]);
}

/* Activation quantizers shared with the SIMD files (scalar references, quants.c). Each SIMD
 * quantizer reproduces its reference bit for bit. */
void pl_quantize_q8_0_ref(const float *x, void *y, int64_t n);
void pl_quantize_q8_1_ref(const float *x, void *y, int64_t n);
void pl_quantize_q8_K_ref(const float *x, void *y, int64_t n);

/* Per-ISA installers of the quant kernels (quants_avx2.c, …): each returns 0 where not compiled in. */
int pl_install_quants_avx2(void);
int pl_install_quants_avx512(void);
int pl_install_quants_neon(void);

#endif
