/* packed_x86.h — the body of the x86 packed GEMM kernels (packed.h), built three times: packed_avx2.c
 * with maddubs (AVX2), packed_vnni.c and packed_avxvnni.c with vpdpbusd (AVX-512 VNNI on 256-bit
 * registers; AVX-VNNI, its VEX form on CPUs without AVX-512). Each defines PX_TARGET (the functions'
 * target), PX_SUFFIX (their names' ending) and PX_VNNI (0, 1: AVX-512 VNNI, 2: AVX-VNNI) before
 * including it; only how the u8·s8 products are summed differs (in i16 then madd, or straight into
 * i32 chains by vpdpbusd) and how many activation rows a tile takes (TILE_ROWS), all exact
 * integers, so all give the same bits.
 *
 * A chunk of a packed block is one 32-byte register: 4 elements of each of 8 weight rows. maddubs
 * against an activation dword broadcast to all lanes gives, per row, two i16 partial sums, which
 * one more step folds into the i32 lane r = weight row r (vpdpbusd gives the i32 at once). So a
 * block of one activation row ends as one vector of the 8 rows' exact block sums, scaled and
 * accumulated with one fmadd per lane: the scalar reference's operations, lane by lane, in its
 * order. Nothing is reduced across lanes.
 *
 * A tile is one row group × T activation rows: the weight chunks are loaded and unpacked once per
 * tile, each activation dword broadcast once per tile. T = TILE_ROWS for a batch (the weights of a
 * group stay in L1 while the activation rows stream past): 4 in the 16 registers of AVX2, 8 in
 * AVX-512's 32, which hold a k-quant tile's 16 chains and its sums (-6% to -12% a tile against 4
 * rows, every type); AVX-512's prefill tiles of every type but q6_K take two groups at once on
 * 64-byte registers (the pair tiles, see join_groups). With one activation row the
 * groups are read one after the other, in memory order, as one stream (see STREAM_AHEAD): two groups
 * side by side per tile shared each broadcast between them (10-28% less compute in L2) but read two
 * streams, and a decode from memory ran 1.5x slower.
 */
#ifndef PX_TARGET
#error "packed_x86.h is included by packed_avx2.c, packed_vnni.c and packed_avxvnni.c after they define PX_TARGET"
#endif

#include <stddef.h>
#include <string.h>

#include <immintrin.h>

#include "packed.h"
#include "quants.h"

#define PX_CAT_(a, b) a##b
#define PX_CAT(a, b) PX_CAT_(a, b)
#define PX_NAME(name) PX_CAT(name, PX_SUFFIX)

/* Each tile inlined with its T constant and its loops unrolled, so that its accumulators
 * live in registers rather than arrays in memory. */
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

/* An empty asm that claims to change v: the compiler must have v complete at this point, so it cannot
 * reassociate a block's chain of adds into a tree that computes every maddubs first (GCC did, and
 * spilled a third of them: 25% slower). */
#if defined(__GNUC__) || defined(__clang__)
#define IN_ORDER(v) __asm__("" : "+x"(v))
#else
#define IN_ORDER(v) ((void)0)
#endif

/* i16 pairs → i32: lane r = its two halves added. The same as madd with ones, but on the shift and
 * add pipes: on Zen 3 maddubs and madd share one multiply pipe, which the maddubs already fill. */
PX_TARGET static inline __m256i pair_sums(__m256i p) {
    return _mm256_add_epi32(_mm256_srai_epi32(p, 16), _mm256_srai_epi32(_mm256_slli_epi32(p, 16), 16));
}

/* The products of u8 by s8 bytes, 4 to a dword lane. VNNI builds sum them straight into i32 lanes
 * with vpdpbusd (DPBUSD; dot_bcast_add below); AVX2 builds through maddubs: pair_dot(u0, s0, u1, s1)
 * sums two registers' products and pair_add two such sums in i16 pairs (each caller bounds them below
 * 2^15), signed_dot is one register's products in i32, signed_dot_add adds them to an i32 sum.
 * pair_widen gives a tile's sums as i32 lanes in either build; madd_add adds i16 pairs' products to
 * i32 lanes (vpdpwssd, or madd and add). Integer sums, exact: every build gives the same bits. */
#if PX_VNNI
#if PX_VNNI == 2
#define DPBUSD _mm256_dpbusd_avx_epi32
#define DPWSSD _mm256_dpwssd_avx_epi32
#else
#define DPBUSD _mm256_dpbusd_epi32
#define DPWSSD _mm256_dpwssd_epi32
#endif
PX_TARGET static inline __m256i pair_widen(__m256i p) { return p; }
PX_TARGET static inline __m256i madd_add(__m256i acc, __m256i a, __m256i b) { return DPWSSD(acc, a, b); }
#else
PX_TARGET static inline __m256i pair_dot(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1));
}
PX_TARGET static inline __m256i pair_add(__m256i p, __m256i q) { return _mm256_add_epi16(p, q); }
PX_TARGET static inline __m256i pair_widen(__m256i p) { return pair_sums(p); }
PX_TARGET static inline __m256i signed_dot(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
PX_TARGET static inline __m256i signed_dot_add(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, signed_dot(u, s));
}
PX_TARGET static inline __m256i madd_add(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}
#endif

/* Integer sums a tile keeps per activation row: vpdpbusd accumulates in place, and its latency is
 * hidden only with 8 or more chains in flight (2 per row of a 4-row tile); maddubs sums in i16 and
 * adds, one chain a row. */
enum { DOT_CHAINS = PX_VNNI ? 2 : 1 };

/* The most activation rows a tile takes (see the top of this file). */
enum { TILE_ROWS = PX_VNNI == 1 ? 8 : 4 };

/* The 4 activation bytes at p in every dword. */
PX_TARGET static inline __m256i dword_bcast(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

#if PX_VNNI
/* acc + the products of u by the 4 bytes at p in every dword, in a tile of T activation rows. With
 * several rows the broadcast is folded into vpdpbusd's memory operand ({1to8}; AVX-512 only): one
 * instruction where vpbroadcastd takes a second, which is what a prefill's tiles are short of (a
 * q4_K tile of 4 rows -5%). A one-row stream from memory ran slower that way (q6_K +28%), so T = 1
 * broadcasts into a register. */
PX_TARGET static inline __m256i dot_bcast_add(__m256i acc, __m256i u, const int8_t *p, const int T) {
    (void)T;
#if PX_VNNI == 1 && (defined(__GNUC__) || defined(__clang__))
    if (T > 1) {
        __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
        return acc;
    }
#endif
    acc = DPBUSD(acc, u, dword_bcast(p));
    IN_ORDER(acc);
    return acc;
}
#endif

/* The first count (≤ 8) lanes of v to y: a partial group's padding rows are never written. */
PX_TARGET static inline void store_rows(float *y, __m256 v, int64_t count) {
    if (count >= PL_PACK_ROWS) {
        _mm256_storeu_ps(y, v);
    } else {
        float lanes[PL_PACK_ROWS];
        _mm256_storeu_ps(lanes, v);
        memcpy(y, lanes, (size_t)count * sizeof(float));
    }
}

/* Prefetching ahead of the block being read: pf_bytes per block, from pf + b·pf_bytes (0: none).
 * With one or a few activation rows (decode, a batch of decode steps) the matrix is read once, as
 * one stream, group after group in memory order, and the hardware prefetcher alone falls behind on
 * the packed blocks (from memory, one row at a time, packed q6_K took 3.9 ns a block of 32 without
 * software prefetching, the row kernel 0.9). Each block's bytes a fixed distance on are prefetched
 * as it is read: STREAM_AHEAD_Q6K for q6_K's long blocks (1,680 bytes), STREAM_AHEAD for the others'
 * (144-1,408). Measured on one core of machine D (AMD EPYC, AVX-512), decode tok/s of whole models
 * over distances of 0.5-16 KB: SmolLM2 Q4_1 (with q8_0) 223-226 without → 241-247 at 1 KB, 252-279
 * at 4-8 KB; a 1B Q8_0 15.5 → 19.0 at 1 KB, 20.2-22.6 at 4-8 KB. The k-quants took 1 KB until their
 * prefetches were spread over the sub-blocks (prefetch_some); spread, q4_K and q5_K are faster at
 * 4 KB (2026-11-29, bench_packed.py, one thread, a 60 MB matrix, alternating builds: q4_K 0.80-0.91
 * → 0.60-0.68 ns a block of 32 with VNNI, 0.76-0.90 → 0.62-0.72 on AVX2; q5_K 1.12-1.17 → 0.88-0.91;
 * a 3B Q4_K_M's decode on one thread 11.4-11.9 → 12.5-13.5 tok/s), q6_K is not (VNNI the same,
 * AVX2 1.2 → 1.8-2.0 ns). With more rows a group is read by several tiles and the first prefetches
 * the next group whole, in step. */
enum { STREAM_AHEAD = 4096, STREAM_AHEAD_Q6K = 1024 };

PX_TARGET static inline void prefetch_next(const char *pf, int64_t pf_bytes, int64_t b) {
    for (int64_t c = 0; c < pf_bytes; c += 64) PL_PREFETCH(pf + b * pf_bytes + c);
}

/* The next `lines` lines of block b's share of prefetching (prefetch_next), from *next up to end:
 * the k-quants' tiles spread a block's share over its sub-blocks. Their 8-row blocks are long (a
 * q6_K block is 27 lines), and one burst of prefetches fills the core's miss buffers and holds up its
 * loads (measured with two groups' 53 lines a block: spread, a single-row q6_K GEMM took 20-30% less). */
PX_TARGET static inline void prefetch_some(const char **next, const char *end, int lines) {
    for (int i = 0; i < lines && *next < end; i++, *next += 64) PL_PREFETCH(*next);
}

#if PX_VNNI == 1
/* Two row groups on AVX-512's 64-byte registers (a prefill's pair tiles: group A's 8 rows in dword
 * lanes 0-7, group B's in 8-15), so that each activation dword, broadcast once from memory by
 * vpdpbusd ({1to16}), serves 16 weight rows where a 32-byte tile's serves 8, and each activation
 * block's scale is set up once for both. Lane by lane a pair tile runs its 32-byte tile's operations
 * in their order: the same bits. One thread of Zen 4 (64-byte ops take two 32-byte slots there, so
 * the gain is in the broadcasts and the ops a block spends besides vpdpbusd), bench_packed.py, 64
 * rows, ns a block of 32 in L2 against the 32-byte tiles: q4_0 0.237 -> 0.181, q8_0 0.241 -> 0.180,
 * q5_0 0.248 -> 0.186, q4_1 0.216 -> 0.190 (k4_pair_tile: q4_K, q5_K). */

/* Group A's register at a and group B's at b as one: A's in the low half. */
PX_TARGET static inline __m512i join_groups(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

PX_TARGET static inline __m512i join_halves(__m256i a, __m256i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

PX_TARGET static inline __m512i dot_bcast_add16(__m512i acc, __m512i u, const int8_t *p) {
#if defined(__GNUC__) || defined(__clang__)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
#else
    int32_t v;
    memcpy(&v, p, 4);
    acc = _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(v));
#endif
    return acc;
}

/* Groups A's and B's 8 f16 scales at a and b as 16 floats. */
PX_TARGET static inline __m512 halves_f16(const uint16_t *a, const uint16_t *b) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                                   _mm_loadu_si128((const __m128i *)b), 1));
}

/* A pair tile's stores: the first rows_left (≥ 1) of the 16 lanes of v to y. */
PX_TARGET static inline void store_pair_rows(float *y, __m512 v, int64_t rows_left) {
    _mm512_mask_storeu_ps(y, rows_left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rows_left) - 1), v);
}

/* add_q8_0_blocks for a pair tile: groups A's and B's scales at da and db. */
PX_TARGET static ALWAYS_INLINE void add_q8_0_pair_blocks(__m512 *sd, const __m512i *isum, const uint16_t *da,
                                                         const uint16_t *db, const char *x, int64_t xs, int64_t b,
                                                         const int T) {
    __m512 dw = halves_f16(da, db);
    UNROLLED for (int t = 0; t < T; t++) {
        const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
        __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(_cvtsh_ss(xb->d)));
        sd[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), scale, sd[t]);
    }
}

#endif

/* ================================================================ q4_1 × q8_1 */

/* The group w against activation rows x, x + xs, … (T of them): y[t·ldy + r].
 * rows_left: the group's valid rows (8 or more: all). The mins' share m·s needs neither the quants
 * nor the integer sums: it runs as a second, short loop, which keeps the main one within the 16
 * registers. Each maddubs lane is at most 2·15·127 in magnitude, so the 8 of a block (4 chunks, low
 * and high nibbles) add up in i16 (≤ 30480) before the one pair_sums. */
PX_TARGET static ALWAYS_INLINE void q4_1_tile(const pl_block_q4_1x8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    (void)off;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256 sd[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sd[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_next(pf, pf_bytes, b);
        __m256i p[TILE_ROWS];
#if PX_VNNI
        __m256i hi_sum[TILE_ROWS]; /* the high nibbles' products in a chain of their own (DOT_CHAINS) */
#endif
        UNROLLED for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * k));
            __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_1 *xb = (const pl_block_q8_1 *)(x + t * xs) + b;
#if PX_VNNI
                if (k == 0) p[t] = hi_sum[t] = _mm256_setzero_si256();
                p[t] = dot_bcast_add(p[t], lo, xb->qs + 4 * k, T);
                hi_sum[t] = dot_bcast_add(hi_sum[t], hi, xb->qs + 16 + 4 * k, T);
#else
                __m256i q = pair_dot(lo, dword_bcast(xb->qs + 4 * k), hi, dword_bcast(xb->qs + 16 + 4 * k));
                p[t] = k == 0 ? q : pair_add(p[t], q);
                IN_ORDER(p[t]);
#endif
            }
        }
#if PX_VNNI
        UNROLLED for (int t = 0; t < T; t++) p[t] = _mm256_add_epi32(p[t], hi_sum[t]);
#endif
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w[b].d));
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_1 *xb = (const pl_block_q8_1 *)(x + t * xs) + b;
            __m256 isum = _mm256_cvtepi32_ps(pair_widen(p[t]));
            sd[t] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dw, _mm256_set1_ps(xb->d)), sd[t]);
        }
    }
    __m256 sm[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sm[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w[b].m));
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_1 *xb = (const pl_block_q8_1 *)(x + t * xs) + b;
            sm[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb->s), sm[t]);
        }
    }
    UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy, _mm256_add_ps(sd[t], sm[t]), rows_left);
}

#if PX_VNNI == 1
/* q4_1_tile over groups A (w) and B (w + nb blocks). */
PX_TARGET static ALWAYS_INLINE void q4_1_pair_tile(const pl_block_q4_1x8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    (void)off;
    const pl_block_q4_1x8 *wb = w + nb;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 sd[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sd[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_next(pf, pf_bytes, b);
        __m512i p[TILE_ROWS], hi_sum[TILE_ROWS];
        UNROLLED for (int k = 0; k < 4; k++) {
            __m512i v = join_groups(w[b].qs + 32 * k, wb[b].qs + 32 * k);
            __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_1 *xb = (const pl_block_q8_1 *)(x + t * xs) + b;
                if (k == 0) p[t] = hi_sum[t] = _mm512_setzero_si512();
                p[t] = dot_bcast_add16(p[t], lo, xb->qs + 4 * k);
                hi_sum[t] = dot_bcast_add16(hi_sum[t], hi, xb->qs + 16 + 4 * k);
            }
        }
        __m512 dw = halves_f16(w[b].d, wb[b].d);
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_1 *xb = (const pl_block_q8_1 *)(x + t * xs) + b;
            __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(p[t], hi_sum[t]));
            sd[t] = _mm512_fmadd_ps(isum, _mm512_mul_ps(dw, _mm512_set1_ps(xb->d)), sd[t]);
        }
    }
    __m512 sm[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sm[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512 mw = halves_f16(w[b].m, wb[b].m);
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_1 *xb = (const pl_block_q8_1 *)(x + t * xs) + b;
            sm[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xb->s), sm[t]);
        }
    }
    UNROLLED for (int t = 0; t < T; t++) store_pair_rows(y + t * ldy, _mm512_add_ps(sd[t], sm[t]), rows_left);
}
#endif

/* ================================================================ q8_0 × q8_0 */

/* The end of block b for the types against q8_0 activations: sd[t] += (float)isum[t] · (dw · dx_t),
 * dw the group's 8 f16 scales d, dx_t the f16 scale of row t's activation block b. */
PX_TARGET static ALWAYS_INLINE void add_q8_0_blocks(__m256 *sd, const __m256i *isum, const uint16_t *d,
                                                    const char *x, int64_t xs, int64_t b, const int T) {
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
    UNROLLED for (int t = 0; t < T; t++) {
        const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
        __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(_cvtsh_ss(xb->d)));
        sd[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), scale, sd[t]);
    }
}

#if PX_VNNI
/* As q4_1_tile, each weight byte made unsigned, w + 128 (its top bit flipped), for vpdpbusd; the
 * 128·Σx that adds comes off the block's integer sum as off[t·nb + b] (q8_0_offsets), its start.
 * No vpsignb: the activation dwords go to vpdpbusd as they are (dot_bcast_add). */
PX_TARGET static ALWAYS_INLINE void q8_0_tile(const pl_block_q8_0x8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    const __m256i top = _mm256_set1_epi8((char)0x80);
    __m256 sd[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sd[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_next(pf, pf_bytes, b);
        __m256i acc[DOT_CHAINS][TILE_ROWS];
        UNROLLED for (int k = 0; k < 8; k++) {
            __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * k)), top);
            const int ch = k % DOT_CHAINS;
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
                if (k == 0) acc[0][t] = _mm256_set1_epi32(off[t * nb + b]);
                if (k == 1) acc[1][t] = _mm256_setzero_si256();
                acc[ch][t] = dot_bcast_add(acc[ch][t], u, xb->qs + 4 * k, T);
            }
        }
        UNROLLED for (int t = 0; t < T; t++) acc[0][t] = _mm256_add_epi32(acc[0][t], acc[1][t]);
        add_q8_0_blocks(sd, acc[0], w[b].d, x, xs, b, T);
    }
    UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy, sd[t], rows_left);
}
#else
/* As q4_1_tile, the signs moved onto the activations (maddubs multiplies unsigned by signed):
 * |w|·sign(x, w). Pairs reach 2·128·127, so each maddubs goes to i32 through its own madd. */
PX_TARGET static ALWAYS_INLINE void q8_0_tile(const pl_block_q8_0x8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    (void)off;
    __m256 sd[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sd[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_next(pf, pf_bytes, b);
        __m256i acc[TILE_ROWS];
        UNROLLED for (int k = 0; k < 8; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * k)), av = _mm256_sign_epi8(v, v);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
                __m256i sx = _mm256_sign_epi8(dword_bcast(xb->qs + 4 * k), v);
                acc[t] = k == 0 ? signed_dot(av, sx) : signed_dot_add(acc[t], av, sx);
                IN_ORDER(acc[t]);
            }
        }
        add_q8_0_blocks(sd, acc, w[b].d, x, xs, b, T);
    }
    UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy, sd[t], rows_left);
}
#endif

#if PX_VNNI == 1
/* q8_0_tile over groups A (w) and B (w + nb blocks). */
PX_TARGET static ALWAYS_INLINE void q8_0_pair_tile(const pl_block_q8_0x8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    const pl_block_q8_0x8 *wb = w + nb;
    const __m512i top = _mm512_set1_epi8((char)0x80);
    __m512 sd[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sd[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_next(pf, pf_bytes, b);
        __m512i acc[2][TILE_ROWS];
        UNROLLED for (int k = 0; k < 8; k++) {
            __m512i u = _mm512_xor_si512(join_groups(w[b].qs + 32 * k, wb[b].qs + 32 * k), top);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
                if (k == 0) acc[0][t] = _mm512_set1_epi32(off[t * nb + b]);
                if (k == 1) acc[1][t] = _mm512_setzero_si512();
                acc[k % 2][t] = dot_bcast_add16(acc[k % 2][t], u, xb->qs + 4 * k);
            }
        }
        UNROLLED for (int t = 0; t < T; t++) acc[0][t] = _mm512_add_epi32(acc[0][t], acc[1][t]);
        add_q8_0_pair_blocks(sd, acc[0], w[b].d, wb[b].d, x, xs, b, T);
    }
    UNROLLED for (int t = 0; t < T; t++) store_pair_rows(y + t * ldy, sd[t], rows_left);
}
#endif

/* ================================================================ q4_0 × q8_0 */

/* As q4_1_tile's quants, without the mins: the −8 of every element comes off the block's integer
 * sum as off[t·nb + b] (q4_0_offsets), the start of its sum. The 8 maddubs lanes of a block add up
 * in i16 (≤ 30720, as q4_1's) before the one pair_widen. */
PX_TARGET static ALWAYS_INLINE void q4_0_tile(const pl_block_q4_0x8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256 sd[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sd[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_next(pf, pf_bytes, b);
        __m256i p[TILE_ROWS], isum[TILE_ROWS];
#if PX_VNNI
        __m256i hi_sum[TILE_ROWS]; /* the high nibbles' products in a chain of their own (DOT_CHAINS) */
#endif
        UNROLLED for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * k));
            __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
#if PX_VNNI
                if (k == 0) p[t] = _mm256_set1_epi32(off[t * nb + b]), hi_sum[t] = _mm256_setzero_si256();
                p[t] = dot_bcast_add(p[t], lo, xb->qs + 4 * k, T);
                hi_sum[t] = dot_bcast_add(hi_sum[t], hi, xb->qs + 16 + 4 * k, T);
#else
                __m256i q = pair_dot(lo, dword_bcast(xb->qs + 4 * k), hi, dword_bcast(xb->qs + 16 + 4 * k));
                p[t] = k == 0 ? q : pair_add(p[t], q);
                IN_ORDER(p[t]);
#endif
            }
        }
        UNROLLED for (int t = 0; t < T; t++)
#if PX_VNNI
            isum[t] = _mm256_add_epi32(p[t], hi_sum[t]);
#else
            isum[t] = _mm256_add_epi32(_mm256_set1_epi32(off[t * nb + b]), pair_widen(p[t]));
#endif
        add_q8_0_blocks(sd, isum, w[b].d, x, xs, b, T);
    }
    UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy, sd[t], rows_left);
}

/* ================================================================ q5_0 × q8_0 */

/* factor·Σx of activation block b of row t to off[t·nb + b], for rows rows: the exact i32 that
 * turns q4_0_tile's (factor −8), q5_0_tile's (−16) and VNNI q8_0_tile's (−128) unsigned products
 * into Σ(q − 8)·x, Σ(q − 16)·x and Σw·x, shared by every group of the call. */
PX_TARGET static inline void x_sums_times(const char *x, int64_t xs, int64_t nb, int rows, int32_t *off, short factor) {
    const __m256i ones8 = _mm256_set1_epi8(1);
    for (int t = 0; t < rows; t++)
        for (int64_t b = 0; b < nb; b++) {
            const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
            __m256i s8 = _mm256_maddubs_epi16(ones8, _mm256_loadu_si256((const __m256i *)xb->qs));
            __m128i s = _mm_add_epi16(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s = _mm_madd_epi16(s, _mm_set1_epi16(factor));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
            off[t * nb + b] = _mm_cvtsi128_si32(s);
        }
}

PX_TARGET static void q4_0_offsets(const char *x, int64_t xs, int64_t nb, int rows, int32_t *off) {
    x_sums_times(x, xs, nb, rows, off, -8);
}

PX_TARGET static void q5_0_offsets(const char *x, int64_t xs, int64_t nb, int rows, int32_t *off) {
    x_sums_times(x, xs, nb, rows, off, -16);
}

#if PX_VNNI
PX_TARGET static void q8_0_offsets(const char *x, int64_t xs, int64_t nb, int rows, int32_t *off) {
    x_sums_times(x, xs, nb, rows, off, -128);
}
#define Q8_0_OFFSETS q8_0_offsets
#define Q8_0_PER_BLOCK 1
#else
#define Q8_0_OFFSETS no_offsets
#define Q8_0_PER_BLOCK 0
#endif

/* q (0..31) unsigned against the signed activation, as maddubs wants it; the −16 of every element
 * comes off the block's integer sum as off[t·nb + b] (q5_0_offsets), an exact int32 shared by the 8
 * rows. A maddubs lane is at most 2·31·128 = 7936 in magnitude: 4 of them (two chunks, low and high
 * elements) add up in i16 (≤ 31744), so a block is two i16 partial sums, each widened by pair_sums. */
PX_TARGET static ALWAYS_INLINE void q5_0_tile(const pl_block_q5_0x8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    __m256 sd[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sd[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_next(pf, pf_bytes, b);
        __m256i acc[TILE_ROWS], qh;
#if PX_VNNI
        __m256i hi_sum[TILE_ROWS]; /* the high elements' products in a chain of their own (DOT_CHAINS) */
#endif
        qh = _mm256_loadu_si256((const __m256i *)w[b].qh);
        UNROLLED for (int t = 0; t < T; t++) {
            __m256i start = _mm256_set1_epi32(off[t * nb + b]);
            acc[t] = start;
        }
        UNROLLED for (int half = 0; half < 2; half++) {
#if !PX_VNNI
            __m256i p[TILE_ROWS];
#endif
            UNROLLED for (int kk = 0; kk < 2; kk++) {
                const int k = 2 * half + kk;
                __m256i v = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * k));
                /* bit k (4 + k) of each qh byte to bit 4; what the 16-bit shifts carry in from the
                 * neighbouring byte lands below (above) bit 4 and is masked off */
                __m256i hl = _mm256_and_si256(_mm256_slli_epi16(qh, 4 - k), bit4);
                __m256i hh = _mm256_and_si256(k ? _mm256_srli_epi16(qh, k) : qh, bit4);
                __m256i lo = _mm256_or_si256(_mm256_and_si256(v, low4), hl);
                __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), hh);
                UNROLLED for (int t = 0; t < T; t++) {
                    const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
#if PX_VNNI
                    if (k == 0) hi_sum[t] = _mm256_setzero_si256();
                    acc[t] = dot_bcast_add(acc[t], lo, xb->qs + 4 * k, T);
                    hi_sum[t] = dot_bcast_add(hi_sum[t], hi, xb->qs + 16 + 4 * k, T);
#else
                    __m256i q = pair_dot(lo, dword_bcast(xb->qs + 4 * k), hi, dword_bcast(xb->qs + 16 + 4 * k));
                    p[t] = kk == 0 ? q : pair_add(p[t], q);
                    IN_ORDER(p[t]);
#endif
                }
            }
#if !PX_VNNI
            UNROLLED for (int t = 0; t < T; t++)
                acc[t] = _mm256_add_epi32(acc[t], pair_widen(p[t]));
#endif
        }
#if PX_VNNI
        UNROLLED for (int t = 0; t < T; t++) acc[t] = _mm256_add_epi32(acc[t], hi_sum[t]);
#endif
        add_q8_0_blocks(sd, acc, w[b].d, x, xs, b, T);
    }
    UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy, sd[t], rows_left);
}

#if PX_VNNI == 1
/* q4_0_tile (five = 0) or q5_0_tile (five: blocks of bs bytes with the fifth bits) over groups A (w)
 * and B (w + nb blocks); both blocks begin with the 8 rows' scales. */
PX_TARGET static ALWAYS_INLINE void x0_pair_tile(const char *w, const int64_t bs, const int five, int64_t nb,
                                                 const char *x, int64_t xs, const int T, float *y, int64_t ldy,
                                                 int64_t rows_left, const char *pf, int64_t pf_bytes,
                                                 const int32_t *off) {
    const char *wb = w + nb * bs;
    const size_t qs = five ? offsetof(pl_block_q5_0x8, qs) : offsetof(pl_block_q4_0x8, qs),
                 qh = offsetof(pl_block_q5_0x8, qh);
    const __m512i low4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
    __m512 sd[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sd[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *ba = w + b * bs, *bb = wb + b * bs;
        prefetch_next(pf, pf_bytes, b);
        __m512i acc[TILE_ROWS], hi_sum[TILE_ROWS];
        const __m512i fifth = five ? join_groups(ba + qh, bb + qh) : _mm512_setzero_si512();
        UNROLLED for (int k = 0; k < 4; k++) {
            __m512i v = join_groups(ba + qs + 32 * k, bb + qs + 32 * k);
            __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            if (five) { /* bit k (4 + k) of each qh byte onto bit 4, as q5_0_tile */
                lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(fifth, 4 - k), bit4));
                hi = _mm512_or_si512(hi, _mm512_and_si512(k ? _mm512_srli_epi16(fifth, k) : fifth, bit4));
            }
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_0 *xb = (const pl_block_q8_0 *)(x + t * xs) + b;
                if (k == 0) acc[t] = _mm512_set1_epi32(off[t * nb + b]), hi_sum[t] = _mm512_setzero_si512();
                acc[t] = dot_bcast_add16(acc[t], lo, xb->qs + 4 * k);
                hi_sum[t] = dot_bcast_add16(hi_sum[t], hi, xb->qs + 16 + 4 * k);
            }
        }
        UNROLLED for (int t = 0; t < T; t++) acc[t] = _mm512_add_epi32(acc[t], hi_sum[t]);
        add_q8_0_pair_blocks(sd, acc, (const uint16_t *)ba, (const uint16_t *)bb, x, xs, b, T);
    }
    UNROLLED for (int t = 0; t < T; t++) store_pair_rows(y + t * ldy, sd[t], rows_left);
}

PX_TARGET static ALWAYS_INLINE void q4_0_pair_tile(const pl_block_q4_0x8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    x0_pair_tile((const char *)w, (int64_t)sizeof *w, 0, nb, x, xs, T, y, ldy, rows_left, pf, pf_bytes, off);
}

PX_TARGET static ALWAYS_INLINE void q5_0_pair_tile(const pl_block_q5_0x8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    x0_pair_tile((const char *)w, (int64_t)sizeof *w, 1, nb, x, xs, T, y, ldy, rows_left, pf, pf_bytes, off);
}
#endif

/* ================================================================ q4_K × q8_K */

/* The 8 rows' scale bytes of one word (pl_k4x8_scales' sc or mn words, lane r = row r). */
PX_TARGET static inline void k4x8_words(const pl_block_q4_Kx8 *b, __m256i *w0, __m256i *w1, int mins) {
    const __m256i low6 = _mm256_set1_epi32(0x3f3f3f3f), low4 = _mm256_set1_epi32(0x0f0f0f0f),
                  top2 = _mm256_set1_epi32(0x03030303);
    __m256i u0 = _mm256_loadu_si256((const __m256i *)b->scales[mins ? 1 : 0]);
    __m256i u2 = _mm256_loadu_si256((const __m256i *)b->scales[2]);
    if (mins) u2 = _mm256_srli_epi32(u2, 4);
    *w0 = _mm256_and_si256(u0, low6);
    __m256i top = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), top2), 4);
    *w1 = _mm256_or_si256(_mm256_and_si256(u2, low4), top);
}

/* Byte s of each dword in both of its i16 halves: lane r = (x, x), what madd multiplies a lane's
 * two i16 partial sums by to give x·(their sum) in i32. */
#define BYTE_BOTH_HALVES(s)                                                                            \
    _mm256_setr_epi8((s), -1, (s), -1, 4 + (s), -1, 4 + (s), -1, 8 + (s), -1, 8 + (s), -1, 12 + (s), -1, \
                     12 + (s), -1, (s), -1, (s), -1, 4 + (s), -1, 4 + (s), -1, 8 + (s), -1, 8 + (s), -1,  \
                     12 + (s), -1, 12 + (s), -1)

/* The activation's 8 sub-block sums of block b of row t as the 4 dwords madd pairs with the mins,
 * (bs0, bs2), (bs1, bs3), (bs4, bs6), (bs5, bs7), to off[4(t·nb + b)..]: made once a call, not once
 * a group (in a 4-row tile they took 16% of a q4_K GEMM's time). */
PX_TARGET static void k4_offsets(const char *x, int64_t xs, int64_t nb, int rows, int32_t *off) {
    for (int t = 0; t < rows; t++)
        for (int64_t b = 0; b < nb; b++) {
            const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
            __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
            __m128i s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)); /* bs0..bs7 */
            s = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15));
            _mm_storeu_si128((__m128i *)(off + 4 * (t * nb + b)), s);
        }
}

/* Bit j of each fifth-bits byte of a q5_Kx8 block moved onto bit 4: what the 16-bit shifts carry
 * across bytes lands below (left) or above (right) bit 4 and is masked off. */
PX_TARGET static inline __m256i k5_fifth_bits(__m256i hb, const int j) {
    hb = j < 4 ? _mm256_slli_epi16(hb, 4 - j) : j > 4 ? _mm256_srli_epi16(hb, j - 4) : hb;
    return _mm256_and_si256(hb, _mm256_set1_epi8(0x10));
}

#if PX_VNNI
/* The integer sum isum[t] = Σ_s sc_s·Σ q·x of block b of a q4_Kx8 (q5_Kx8: five) group against
 * activation rows t < T. vpdpbusd sums each register's products straight into i32: register (c, k)
 * is loaded once and unpacked into both of its sub-blocks, 2c (low nibbles) and 2c + 1 (high), each
 * summed over its 8 registers in its own i32 chain (2T chains: vpdpbusd's latency hidden), then
 * multiplied by its rows' scales. Per register and activation row that is one vpdpbusd where
 * maddubs needs an add in i16 and a share of the madd; on the 32 registers of AVX-512 the chains
 * and sums stay in registers. The same exact integers as the maddubs form. */
PX_TARGET static ALWAYS_INLINE void k4_block_sums(const pl_block_q4_Kx8 *blk, const int five, const char *x,
                                                  int64_t xs, int64_t b, const int T, __m256i *isum,
                                                  const char **next, const char *end) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), byte0 = _mm256_set1_epi32(0xFF);
    __m256i sc[2];
    k4x8_words(blk, &sc[0], &sc[1], 0);
    UNROLLED for (int t = 0; t < T; t++) isum[t] = _mm256_setzero_si256();
    UNROLLED for (int c = 0; c < 4; c++) {
        prefetch_some(next, end, five ? 6 : 5);
        __m256i lo_sum[TILE_ROWS], hi_sum[TILE_ROWS];
        UNROLLED for (int k = 0; k < 8; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(blk->qs + 256 * c + 32 * k));
            __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            if (five) {
                __m256i hb = _mm256_loadu_si256((const __m256i *)(((const pl_block_q5_Kx8 *)blk)->qh + 32 * k));
                lo = _mm256_or_si256(lo, k5_fifth_bits(hb, 2 * c));
                hi = _mm256_or_si256(hi, k5_fifth_bits(hb, 2 * c + 1));
            }
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                if (k == 0) lo_sum[t] = hi_sum[t] = _mm256_setzero_si256();
                lo_sum[t] = dot_bcast_add(lo_sum[t], lo, xb->qs + 64 * c + 4 * k, T);
                hi_sum[t] = dot_bcast_add(hi_sum[t], hi, xb->qs + 64 * c + 32 + 4 * k, T);
            }
        }
        /* sub-block 2c's scale byte (2c % 4 of word c / 2) and 2c + 1's, in each row's i32 lane */
        __m256i lo_scale = _mm256_and_si256(_mm256_srli_epi32(sc[c / 2], 16 * (c % 2)), byte0);
        __m256i hi_scale = _mm256_and_si256(_mm256_srli_epi32(sc[c / 2], 16 * (c % 2) + 8), byte0);
        UNROLLED for (int t = 0; t < T; t++) {
            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(lo_sum[t], lo_scale));
            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(hi_sum[t], hi_scale));
        }
    }
}
#else
/* The integer sum isum[t] = Σ_s sc_s·Σ q·x of block b of a q4_Kx8 (q5_Kx8: five) group against
 * activation rows t < T, a sub-block at a time: register (c, k)'s nibbles h against activation dword
 * 64c + 32h + 4k, 8 maddubs summed in i16 (each lane at most 2·15·128, 8 of them 30720), then one
 * madd by the rows' scales of sub-block 2c + h gives its exact share in i32. A register is loaded
 * once per nibble half (from L1 the second time), which keeps the live sums within the 16 registers.
 * q5_K: a maddubs lane reaches 2·31·128, so 4 add up in i16 (≤ 31744) and a sub-block takes two
 * madds by its scales. */
PX_TARGET static ALWAYS_INLINE void k4_block_sums(const pl_block_q4_Kx8 *blk, const int five, const char *x,
                                                  int64_t xs, int64_t b, const int T, __m256i *isum,
                                                  const char **next, const char *end) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const int span = five ? 4 : 8; /* registers summed in i16 before a madd */
    __m256i sc[2];
    k4x8_words(blk, &sc[0], &sc[1], 0);
    UNROLLED for (int t = 0; t < T; t++) isum[t] = _mm256_setzero_si256();
    UNROLLED for (int sub = 0; sub < 8; sub++) {
        const int c = sub / 2, h = sub % 2;
        /* a q4_K block's 18 lines (q5_K's 22) in its first 4 sub-blocks: spread over all 8 (3 a
         * sub-block), a 3B's decode ran 3-7% slower on one core */
        prefetch_some(next, end, five ? 6 : 5);
        __m256i p[TILE_ROWS], scale = _mm256_shuffle_epi8(sc[sub / 4], BYTE_BOTH_HALVES(sub % 4));
        UNROLLED for (int k = 0; k < 8; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(blk->qs + 256 * c + 32 * k));
            __m256i q = _mm256_and_si256(h ? _mm256_srli_epi16(v, 4) : v, low4);
            if (five) {
                __m256i hb = _mm256_loadu_si256((const __m256i *)(((const pl_block_q5_Kx8 *)blk)->qh + 32 * k));
                q = _mm256_or_si256(q, k5_fifth_bits(hb, sub));
            }
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                __m256i xd = dword_bcast(xb->qs + 64 * c + 32 * h + 4 * k);
                __m256i prod = _mm256_maddubs_epi16(q, xd);
                p[t] = k % span == 0 ? prod : _mm256_add_epi16(p[t], prod);
                IN_ORDER(p[t]);
                if (k % span == span - 1)
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p[t], scale));
            }
        }
    }
}
#endif

/* As q4_1_tile, a block's integer sum from k4_block_sums, then one fmadd by the scales a block; the
 * mins' share runs as a second loop, as q4_1's. q5_K (five): the same on blocks of bs bytes, each a
 * q4_Kx8 block and the fifth bits, bit j of qh register k moved onto bit 4 of register (c, k)'s
 * nibbles. */
PX_TARGET static ALWAYS_INLINE void k4_tile(const char *w, const int64_t bs, const int five, int64_t nb,
                                            const char *x, int64_t xs, const int T, float *y, int64_t ldy,
                                            int64_t rows_left, const char *pf, int64_t pf_bytes, const int32_t *off) {
#define KB(b) ((const pl_block_q4_Kx8 *)(w + (b) * bs))
    __m256 sd[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sd[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *next = pf + b * pf_bytes, *end = next + pf_bytes;
        __m256i isum[TILE_ROWS];
        k4_block_sums(KB(b), five, x, xs, b, T, isum, &next, end);
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)KB(b)->d));
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
            __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(xb->d));
            sd[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), scale, sd[t]);
        }
    }
    /* imin: the mins' bytes of each word as i16 pairs (bytes 0, 2 and 1, 3) against the matching
     * pairs of sub-block sums */
    const __m256i even = _mm256_set1_epi32(0x00FF00FF);
    __m256 sm[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sm[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i mn[2];
        k4x8_words(KB(b), &mn[0], &mn[1], 1);
        __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)KB(b)->dmin));
        __m256i mins[4] = {_mm256_and_si256(mn[0], even), _mm256_srli_epi16(mn[0], 8),
                           _mm256_and_si256(mn[1], even), _mm256_srli_epi16(mn[1], 8)};
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
            const int32_t *pairs = off + 4 * (t * nb + b);
            __m256i imin = _mm256_madd_epi16(mins[0], _mm256_set1_epi32(pairs[0]));
            UNROLLED for (int i = 1; i < 4; i++)
                imin = madd_add(imin, mins[i], _mm256_set1_epi32(pairs[i]));
            __m256 scale = _mm256_mul_ps(dmin, _mm256_set1_ps(xb->d));
            sm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), scale, sm[t]);
        }
    }
#undef KB
    UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy, _mm256_sub_ps(sd[t], sm[t]), rows_left);
}

PX_TARGET static ALWAYS_INLINE void q4_K_tile(const pl_block_q4_Kx8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    k4_tile((const char *)w, (int64_t)sizeof *w, 0, nb, x, xs, T, y, ldy, rows_left, pf, pf_bytes, off);
}

PX_TARGET static ALWAYS_INLINE void q5_K_tile(const pl_block_q5_Kx8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    k4_tile((const char *)w, (int64_t)sizeof *w, 1, nb, x, xs, T, y, ldy, rows_left, pf, pf_bytes, off);
}

#if PX_VNNI == 1
/* k4_tile over two groups at once (a pair tile: see join_groups). On Zen 4 (64-byte ops take two 32-byte
 * slots) the gain is in the broadcasts and the loop's other ops: one thread, bench_packed.py, 64
 * rows, q4_K 0.191 -> 0.177 ns a block of 32 (L2), q5_K 0.201 -> 0.185; q6_K done the same way was
 * no faster (0.258 -> 0.263: its unpacking takes more registers) and is left on 32 bytes. */

/* k4_block_sums of block b of groups A and B at once. */
PX_TARGET static ALWAYS_INLINE void k4_pair_block_sums(const pl_block_q4_Kx8 *ba, const pl_block_q4_Kx8 *bb,
                                                       const int five, const char *x, int64_t xs, int64_t b,
                                                       const int T, __m512i *isum, const char **next,
                                                       const char *end, const int lines) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), byte0 = _mm512_set1_epi32(0xFF), bit4 = _mm512_set1_epi8(0x10);
    __m256i sa[2], sb[2];
    k4x8_words(ba, &sa[0], &sa[1], 0);
    k4x8_words(bb, &sb[0], &sb[1], 0);
    const __m512i sc[2] = {join_halves(sa[0], sb[0]), join_halves(sa[1], sb[1])};
    UNROLLED for (int t = 0; t < T; t++) isum[t] = _mm512_setzero_si512();
    UNROLLED for (int c = 0; c < 4; c++) {
        prefetch_some(next, end, lines);
        __m512i lo_sum[TILE_ROWS], hi_sum[TILE_ROWS];
        UNROLLED for (int k = 0; k < 8; k++) {
            __m512i v = join_groups(ba->qs + 256 * c + 32 * k, bb->qs + 256 * c + 32 * k);
            __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            if (five) { /* bits 2c and 2c + 1 of each fifth-bits byte onto bit 4, as k5_fifth_bits */
                __m512i hb = join_groups(((const pl_block_q5_Kx8 *)ba)->qh + 32 * k,
                                         ((const pl_block_q5_Kx8 *)bb)->qh + 32 * k);
                const int j0 = 2 * c, j1 = 2 * c + 1;
                __m512i h0 = j0 < 4 ? _mm512_slli_epi16(hb, 4 - j0) : j0 > 4 ? _mm512_srli_epi16(hb, j0 - 4) : hb;
                __m512i h1 = j1 < 4 ? _mm512_slli_epi16(hb, 4 - j1) : _mm512_srli_epi16(hb, j1 - 4);
                lo = _mm512_or_si512(lo, _mm512_and_si512(h0, bit4));
                hi = _mm512_or_si512(hi, _mm512_and_si512(h1, bit4));
            }
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                if (k == 0) lo_sum[t] = hi_sum[t] = _mm512_setzero_si512();
                lo_sum[t] = dot_bcast_add16(lo_sum[t], lo, xb->qs + 64 * c + 4 * k);
                hi_sum[t] = dot_bcast_add16(hi_sum[t], hi, xb->qs + 64 * c + 32 + 4 * k);
            }
        }
        __m512i lo_scale = _mm512_and_si512(_mm512_srli_epi32(sc[c / 2], 16 * (c % 2)), byte0);
        __m512i hi_scale = _mm512_and_si512(_mm512_srli_epi32(sc[c / 2], 16 * (c % 2) + 8), byte0);
        UNROLLED for (int t = 0; t < T; t++) {
            isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(lo_sum[t], lo_scale));
            isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(hi_sum[t], hi_scale));
        }
    }
}

/* k4_tile over groups A (wa) and B (wa + group_bytes): y[t·ldy + r] for their 16 rows, the first
 * rows_left of them written. */
PX_TARGET static ALWAYS_INLINE void k4_pair_tile(const char *wa, const int64_t bs, const int five, int64_t nb,
                                                 const char *x, int64_t xs, const int T, float *y, int64_t ldy,
                                                 int64_t rows_left, const char *pf, int64_t pf_bytes,
                                                 const int32_t *off) {
    const char *wb = wa + nb * bs;
#define KA(b) ((const pl_block_q4_Kx8 *)(wa + (b) * bs))
#define KB2(b) ((const pl_block_q4_Kx8 *)(wb + (b) * bs))
    const int lines = (int)((pf_bytes / 64 + 3) / 4);
    __m512 sd[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sd[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *next = pf + b * pf_bytes, *end = next + pf_bytes;
        __m512i isum[TILE_ROWS];
        k4_pair_block_sums(KA(b), KB2(b), five, x, xs, b, T, isum, &next, end, lines);
        __m512 dw = halves_f16(KA(b)->d, KB2(b)->d);
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
            __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(xb->d));
            sd[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), scale, sd[t]);
        }
    }
    const __m512i even = _mm512_set1_epi32(0x00FF00FF);
    __m512 sm[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sm[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i ma[2], mb[2];
        k4x8_words(KA(b), &ma[0], &ma[1], 1);
        k4x8_words(KB2(b), &mb[0], &mb[1], 1);
        const __m512i mn[2] = {join_halves(ma[0], mb[0]), join_halves(ma[1], mb[1])};
        __m512 dmin = halves_f16(KA(b)->dmin, KB2(b)->dmin);
        __m512i mins[4] = {_mm512_and_si512(mn[0], even), _mm512_srli_epi16(mn[0], 8),
                           _mm512_and_si512(mn[1], even), _mm512_srli_epi16(mn[1], 8)};
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
            const int32_t *pairs = off + 4 * (t * nb + b);
            __m512i imin = _mm512_madd_epi16(mins[0], _mm512_set1_epi32(pairs[0]));
            UNROLLED for (int i = 1; i < 4; i++)
                imin = _mm512_dpwssd_epi32(imin, mins[i], _mm512_set1_epi32(pairs[i]));
            __m512 scale = _mm512_mul_ps(dmin, _mm512_set1_ps(xb->d));
            sm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), scale, sm[t]);
        }
    }
#undef KA
#undef KB2
    UNROLLED for (int t = 0; t < T; t++) store_pair_rows(y + t * ldy, _mm512_sub_ps(sd[t], sm[t]), rows_left);
}

PX_TARGET static ALWAYS_INLINE void q4_K_pair_tile(const pl_block_q4_Kx8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    k4_pair_tile((const char *)w, (int64_t)sizeof *w, 0, nb, x, xs, T, y, ldy, rows_left, pf, pf_bytes, off);
}

PX_TARGET static ALWAYS_INLINE void q5_K_pair_tile(const pl_block_q5_Kx8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    k4_pair_tile((const char *)w, (int64_t)sizeof *w, 1, nb, x, xs, T, y, ldy, rows_left, pf, pf_bytes, off);
}
#endif

/* ================================================================ q6_K × q8_K */

/* The 8 rows' int8 scales of sub-blocks s0 and s1 as the i16 pair (sc_s0, sc_s1) of lane r. */
PX_TARGET static inline __m256i q6_scale_pairs(const pl_block_q6_Kx8 *b, int s0, int s1) {
    __m128i a = _mm_loadl_epi64((const __m128i *)b->scales[s0]), c = _mm_loadl_epi64((const __m128i *)b->scales[s1]);
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, c));
}

#if PX_VNNI
/* isum[t] += Σ_s sc_s·Σ q·x over block b of a q6_Kx8 group against activation rows t < T. As
 * k4_block_sums with vpdpbusd: register (m, k) of ql, completed from qh, is loaded once for both of
 * its sub-blocks (low nibbles, high nibbles), each summed over its 4 registers in its own i32 chain
 * and multiplied by its rows' scales. */
PX_TARGET static ALWAYS_INLINE void q6_block_sums(const pl_block_q6_Kx8 *blk, const char *x, int64_t xs,
                                                  int64_t b, const int T, __m256i *isum, const char **next,
                                                  const char *end) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
    UNROLLED for (int h = 0; h < 2; h++) UNROLLED for (int p = 0; p < 2; p++) UNROLLED for (int kq = 0; kq < 2; kq++) {
        const int s_low = 8 * h + 2 * p + kq, s_high = s_low + 4;
        /* a block's 27 lines over its first 7 of 8 steps: 8 lines a step (done in 4) left a one-row
         * stream from memory 45% slower, its bursts filling the core's miss buffers */
        prefetch_some(next, end, 4);
        __m256i low_sum[TILE_ROWS], high_sum[TILE_ROWS];
        UNROLLED for (int kk = 0; kk < 4; kk++) {
            const int k = 4 * kq + kk;
            __m256i v = _mm256_loadu_si256((const __m256i *)(blk->ql + 256 * (2 * h + p) + 32 * k));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(blk->qh + 256 * h + 32 * k));
            /* bits 2p (4 + 2p) of qh to bits 4, 5; what the 16-bit shifts carry across bytes is masked off */
            __m256i ql = _mm256_or_si256(_mm256_and_si256(v, low4),
                                         _mm256_and_si256(_mm256_slli_epi16(hb, 4 - 2 * p), top2));
            __m256i qh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
                                         _mm256_and_si256(p ? _mm256_srli_epi16(hb, 2) : hb, top2));
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                if (kk == 0) low_sum[t] = high_sum[t] = _mm256_setzero_si256();
                low_sum[t] = dot_bcast_add(low_sum[t], ql, xb->qs + 128 * h + 32 * p + 4 * k, T);
                high_sum[t] = dot_bcast_add(high_sum[t], qh, xb->qs + 128 * h + 64 + 32 * p + 4 * k, T);
            }
        }
        __m256i low_scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)blk->scales[s_low]));
        __m256i high_scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)blk->scales[s_high]));
        UNROLLED for (int t = 0; t < T; t++) {
            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(low_sum[t], low_scale));
            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(high_sum[t], high_scale));
        }
    }
}
#else
/* isum[t] += Σ_s sc_s·Σ q·x over block b of a q6_Kx8 group against activation rows t < T, sub-block
 * by sub-block: a maddubs lane reaches 2·63·128, so two registers' products add up in i16 (≤ 32256)
 * before each madd by the rows' scales. */
PX_TARGET static ALWAYS_INLINE void q6_block_sums(const pl_block_q6_Kx8 *blk, const char *x, int64_t xs,
                                                  int64_t b, const int T, __m256i *isum, const char **next,
                                                  const char *end) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
    /* two loops of 8: GCC would not unroll one of 16 */
    UNROLLED for (int h = 0; h < 2; h++) UNROLLED for (int s8 = 0; s8 < 8; s8++) {
        const int s = 8 * h + s8, high = s8 / 4, p = s8 % 4 / 2, kq = s8 % 2;
        prefetch_some(next, end, 4); /* a block's 27 lines in its first 7 of 16 sub-blocks, as q4_K's */
        __m256i acc[TILE_ROWS], scale = q6_scale_pairs(blk, s, s);
        UNROLLED for (int kk = 0; kk < 4; kk++) {
            const int k = 4 * kq + kk;
            __m256i v = _mm256_loadu_si256((const __m256i *)(blk->ql + 256 * (2 * h + p) + 32 * k));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(blk->qh + 256 * h + 32 * k));
            /* bits 2p (4 + 2p) of qh to bits 4, 5; what the 16-bit shifts carry across bytes is masked off */
            __m256i q = high ? _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
                                               _mm256_and_si256(p ? _mm256_srli_epi16(hb, 2) : hb, top2))
                             : _mm256_or_si256(_mm256_and_si256(v, low4),
                                               _mm256_and_si256(_mm256_slli_epi16(hb, 4 - 2 * p), top2));
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                __m256i xd = dword_bcast(xb->qs + 128 * h + 64 * high + 32 * p + 4 * k);
                __m256i prod = _mm256_maddubs_epi16(q, xd);
                acc[t] = kk % 2 == 0 ? prod : _mm256_add_epi16(acc[t], prod);
                IN_ORDER(acc[t]);
                if (kk % 2) isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(acc[t], scale));
            }
        }
    }
}
#endif

/* As k4_tile, the block's integer sum from q6_block_sums; the −32 of every element comes in as
 * −32·Σ_s sc_s·bsums[s], exact, the block's start. */
PX_TARGET static ALWAYS_INLINE void q6_K_tile(const pl_block_q6_Kx8 *w, int64_t nb, const char *x,
                                                   int64_t xs, const int T, float *y, int64_t ldy, int64_t rows_left,
                                                   const char *pf, int64_t pf_bytes, const int32_t *off) {
    (void)off;
    __m256 sd[TILE_ROWS];
    UNROLLED for (int t = 0; t < T; t++) sd[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *next = pf + b * pf_bytes, *end = next + pf_bytes;
        __m256i isum[TILE_ROWS];
        __m256i corr[TILE_ROWS];
        UNROLLED for (int t = 0; t < T; t++) corr[t] = _mm256_setzero_si256();
        UNROLLED for (int m = 0; m < 8; m++) {
            __m256i pairs = q6_scale_pairs(&w[b], 2 * m, 2 * m + 1);
            UNROLLED for (int t = 0; t < T; t++) {
                const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
                __m256i bsums = dword_bcast((const int8_t *)(xb->bsums + 2 * m)); /* bsums 2m, 2m + 1 */
                corr[t] = madd_add(corr[t], pairs, bsums);
            }
        }
        UNROLLED for (int t = 0; t < T; t++)
            isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr[t], 5));
        q6_block_sums(&w[b], x, xs, b, T, isum, &next, end);
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w[b].d));
        UNROLLED for (int t = 0; t < T; t++) {
            const pl_block_q8_K *xb = (const pl_block_q8_K *)(x + t * xs) + b;
            __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(xb->d));
            sd[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), sc, sd[t]);
        }
    }
    UNROLLED for (int t = 0; t < T; t++)
        store_rows(y + t * ldy, sd[t], rows_left);
}

/* Ints of stack for the activation offsets of a call (q4_0_offsets, q5_0_offsets, k4_offsets): 64 KiB,
 * rows of them at a time. */
enum { OFFSET_INTS = 16384 };
/* For the types whose tiles take no offsets. */
static void no_offsets(const char *x, int64_t xs, int64_t nb, int rows, int32_t *off) {
    (void)x, (void)xs, (void)nb, (void)rows, (void)off;
}

/* NAME(packed, nb, g0, g1, row_end, x, xs, n, y, ldy) over NAME_part. OFFSETS (where PER_BLOCK is
 * not 0) makes what the tiles need of each activation block first, PER_BLOCK ints of it, on the
 * stack for as many rows as OFFSET_INTS holds (every row of a prefill but of the widest matrices,
 * whose groups then pass over the rows in parts). A row wider than that (over 524,288 columns of
 * q4_0) goes to SCALAR, the reference whose bits every kernel gives. */
#define PACKED_GEMM(NAME, OFFSETS, PER_BLOCK, SCALAR)                                                            \
    PX_TARGET static void PX_NAME(NAME)(const void *packed, int64_t nb, int64_t g0, int64_t g1, int64_t row_end, \
                                        const void *vx, int64_t xs, int n, float *y, int64_t ldy) {       \
        int32_t off[OFFSET_INTS];                                                                         \
        int64_t fit = PER_BLOCK ? OFFSET_INTS / (nb * PER_BLOCK) : n;                                     \
        if (fit == 0) {                                                                                   \
            SCALAR(packed, nb, g0, g1, row_end, vx, xs, n, y, ldy);                                       \
            return;                                                                                       \
        }                                                                                                 \
        int part = fit >= n ? n : fit >= TILE_ROWS ? (int)(fit / TILE_ROWS * TILE_ROWS) : (int)fit;      \
        for (int t0 = 0; t0 < n; t0 += part) {                                                            \
            int m = n - t0 < part ? n - t0 : part;                                                        \
            const char *x = (const char *)vx + t0 * xs;                                                   \
            OFFSETS(x, xs, nb, m, off);                                                                   \
            PX_NAME(NAME##_part)(packed, nb, g0, g1, row_end, x, xs, m, y + t0 * ldy, ldy, off);                   \
        }                                                                                                 \
    }

/* A tile of the rows left (fewer than TILE_ROWS), as a constant the tile unrolls by: within
 * TILE_ROWS, so that the AVX2 build's (unreachable) calls stay inside its tiles' arrays. */
#define REST_TILE(rows) ((rows) < TILE_ROWS ? (rows) : TILE_ROWS)

/* TILE over the n activation rows at x against the group(s) at wg: tiles of TILE_ROWS rows, then one
 * tile of the rest (AVX-512: up to 7 rows; as a tile of 4 and one of what was left, 5 rows took 1.2x
 * as long: a 1-row tile is the slowest per row). Only the first tile prefetches. */
#define ROW_TILES(TILE, wg, nb, x, xs, n, yg, ldy, left, pf, pf_bytes, off, PER_BLOCK)                          \
    do {                                                                                                      \
        int t = 0;                                                                                            \
        for (; t + TILE_ROWS <= n; t += TILE_ROWS, pf_bytes = 0)                                              \
            TILE(wg, nb, x + t * xs, xs, TILE_ROWS, yg + t * ldy, ldy, left, pf, pf_bytes, off + t * nb * PER_BLOCK); \
        if (TILE_ROWS > 4 && n - t >= 4) {                                                                    \
            switch (n - t) {                                                                                  \
            case 7: TILE(wg, nb, x + t * xs, xs, REST_TILE(7), yg + t * ldy, ldy, left, pf, pf_bytes, off + t * nb * PER_BLOCK); break; \
            case 6: TILE(wg, nb, x + t * xs, xs, REST_TILE(6), yg + t * ldy, ldy, left, pf, pf_bytes, off + t * nb * PER_BLOCK); break; \
            case 5: TILE(wg, nb, x + t * xs, xs, REST_TILE(5), yg + t * ldy, ldy, left, pf, pf_bytes, off + t * nb * PER_BLOCK); break; \
            default: TILE(wg, nb, x + t * xs, xs, REST_TILE(4), yg + t * ldy, ldy, left, pf, pf_bytes, off + t * nb * PER_BLOCK); \
            }                                                                                                 \
            t = n;                                                                                            \
        }                                                                                                     \
        switch (n - t) {                                                                                      \
        case 3: TILE(wg, nb, x + t * xs, xs, 3, yg + t * ldy, ldy, left, pf, pf_bytes, off + t * nb * PER_BLOCK); break; \
        case 2: TILE(wg, nb, x + t * xs, xs, 2, yg + t * ldy, ldy, left, pf, pf_bytes, off + t * nb * PER_BLOCK); break; \
        case 1: TILE(wg, nb, x + t * xs, xs, 1, yg + t * ldy, ldy, left, pf, pf_bytes, off + t * nb * PER_BLOCK); break; \
        }                                                                                                     \
    } while (0)

/* NAME_part over TILE: a group at a time in memory order (ROW_TILES). The first tile over a group
 * reads it from memory and prefetches: AHEAD bytes on for up to 4 rows, else the next group; never
 * past the range's last group. off: the rows' offsets, nb·PER_BLOCK a row. From PAIRS activation rows
 * on (0: never; AVX-512's pair tiles) the groups go two at a time through PAIR_TILE, which prefetches
 * the next two. */
#define PACKED_GEMM_PART(NAME, BLOCK, TILE, AHEAD, PER_BLOCK, PAIRS, PAIR_TILE)                                \
    PX_TARGET static void PX_NAME(NAME##_part)(const void *packed, int64_t nb, int64_t g0, int64_t g1,       \
                                               int64_t row_end, const char *x, int64_t xs, int n, float *y,   \
                                               int64_t ldy, const int32_t *off) {                             \
        const BLOCK *w = packed;                                                                          \
        const int64_t group_bytes = nb * (int64_t)sizeof(BLOCK);                                          \
        for (int64_t g = g0; g < g1;) {                                                                   \
            const BLOCK *wg = w + g * nb;                                                                 \
            float *yg = y + g * PL_PACK_ROWS;                                                             \
            int64_t left = row_end - g * PL_PACK_ROWS, rest = (g1 - g - 1) * group_bytes;                 \
            if ((PAIRS) > 0 && n >= (PAIRS) && g + 1 < g1) {                                              \
                rest -= group_bytes;                                                                      \
                int64_t pf_bytes = rest >= 2 * group_bytes ? 2 * (int64_t)sizeof(BLOCK)                   \
                                   : rest >= group_bytes ? (int64_t)sizeof(BLOCK) : 0;                    \
                const char *pf = (const char *)wg + 2 * group_bytes;                                      \
                ROW_TILES(PAIR_TILE, wg, nb, x, xs, n, yg, ldy, left, pf, pf_bytes, off, PER_BLOCK);       \
                g += 2;                                                                                   \
                continue;                                                                                 \
            }                                                                                             \
            int64_t want = n <= 4 ? (AHEAD) : group_bytes;                                                \
            int64_t ahead = rest < want ? rest : want;                                                    \
            const char *pf = (const char *)wg + ahead;                                                    \
            int64_t pf_bytes = ahead ? (int64_t)sizeof(BLOCK) : 0;                                        \
            ROW_TILES(TILE, wg, nb, x, xs, n, yg, ldy, left, pf, pf_bytes, off, PER_BLOCK);                \
            g += 1;                                                                                       \
        }                                                                                                 \
    }

#define PACKED_KERNEL(NAME, BLOCK, TILE, AHEAD, OFFSETS, PER_BLOCK, SCALAR) \
    PACKED_GEMM_PART(NAME, BLOCK, TILE, AHEAD, PER_BLOCK, 0, TILE)                  \
    PACKED_GEMM(NAME, OFFSETS, PER_BLOCK, SCALAR)

/* As PACKED_KERNEL, the groups two at a time through PAIR_TILE from PAIRS activation rows on (a
 * call of fewer reads the weights from memory, where two groups' streams at once can be slower). */
#define PACKED_KERNEL_PAIRS(NAME, BLOCK, TILE, PAIR_TILE, PAIRS, AHEAD, OFFSETS, PER_BLOCK, SCALAR) \
    PACKED_GEMM_PART(NAME, BLOCK, TILE, AHEAD, PER_BLOCK, PAIRS, PAIR_TILE)                               \
    PACKED_GEMM(NAME, OFFSETS, PER_BLOCK, SCALAR)

/* The fewest activation rows a call takes pair tiles for: from memory (60 MB, one thread,
 * bench_packed.py) a q4_K pair tile of 5 rows took 0.27-0.28 ns a block of 32 against 0.24, of 6
 * rows 0.24-0.25 against 0.24, of 7 rows 0.22 against 0.23; q5_K's the same as before from 5 rows,
 * q4_0's, q5_0's, q4_1's and q8_0's the same or faster (q8_0 at 5 rows 0.42 against 0.50). */
enum { K4_PAIRS_FROM = 7, PAIRS_FROM = 5 };

#if PX_VNNI == 1
PACKED_KERNEL_PAIRS(gemm_q4_1x8, pl_block_q4_1x8, q4_1_tile, q4_1_pair_tile, PAIRS_FROM,
                    STREAM_AHEAD, no_offsets, 0, pl_gemm_q4_1x8_scalar)
PACKED_KERNEL_PAIRS(gemm_q5_0x8, pl_block_q5_0x8, q5_0_tile, q5_0_pair_tile, PAIRS_FROM,
                    STREAM_AHEAD, q5_0_offsets, 1, pl_gemm_q5_0x8_scalar)
PACKED_KERNEL_PAIRS(gemm_q4_0x8, pl_block_q4_0x8, q4_0_tile, q4_0_pair_tile, PAIRS_FROM,
                    STREAM_AHEAD, q4_0_offsets, 1, pl_gemm_q4_0x8_scalar)
PACKED_KERNEL_PAIRS(gemm_q8_0x8, pl_block_q8_0x8, q8_0_tile, q8_0_pair_tile, PAIRS_FROM,
                    STREAM_AHEAD, Q8_0_OFFSETS, Q8_0_PER_BLOCK, pl_gemm_q8_0x8_scalar)
PACKED_KERNEL_PAIRS(gemm_q4_Kx8, pl_block_q4_Kx8, q4_K_tile, q4_K_pair_tile, K4_PAIRS_FROM,
                    STREAM_AHEAD, k4_offsets, 4, pl_gemm_q4_Kx8_scalar)
PACKED_KERNEL_PAIRS(gemm_q5_Kx8, pl_block_q5_Kx8, q5_K_tile, q5_K_pair_tile, PAIRS_FROM,
                    STREAM_AHEAD, k4_offsets, 4, pl_gemm_q5_Kx8_scalar)
#else
PACKED_KERNEL(gemm_q4_1x8, pl_block_q4_1x8, q4_1_tile, STREAM_AHEAD, no_offsets, 0, pl_gemm_q4_1x8_scalar)
PACKED_KERNEL(gemm_q5_0x8, pl_block_q5_0x8, q5_0_tile, STREAM_AHEAD, q5_0_offsets, 1, pl_gemm_q5_0x8_scalar)
PACKED_KERNEL(gemm_q4_0x8, pl_block_q4_0x8, q4_0_tile, STREAM_AHEAD, q4_0_offsets, 1, pl_gemm_q4_0x8_scalar)
PACKED_KERNEL(gemm_q8_0x8, pl_block_q8_0x8, q8_0_tile, STREAM_AHEAD, Q8_0_OFFSETS, Q8_0_PER_BLOCK, pl_gemm_q8_0x8_scalar)
PACKED_KERNEL(gemm_q4_Kx8, pl_block_q4_Kx8, q4_K_tile, STREAM_AHEAD, k4_offsets, 4, pl_gemm_q4_Kx8_scalar)
PACKED_KERNEL(gemm_q5_Kx8, pl_block_q5_Kx8, q5_K_tile, STREAM_AHEAD, k4_offsets, 4, pl_gemm_q5_Kx8_scalar)
#endif
PACKED_KERNEL(gemm_q6_Kx8, pl_block_q6_Kx8, q6_K_tile, STREAM_AHEAD_Q6K, no_offsets, 0, pl_gemm_q6_Kx8_scalar)

int PX_NAME(pl_install_packed)(void) {
    pl_packed.q4_0 = PX_NAME(gemm_q4_0x8);
    pl_packed.q4_1 = PX_NAME(gemm_q4_1x8);
    pl_packed.q5_0 = PX_NAME(gemm_q5_0x8);
    pl_packed.q8_0 = PX_NAME(gemm_q8_0x8);
    pl_packed.q4_K = PX_NAME(gemm_q4_Kx8);
    pl_packed.q5_K = PX_NAME(gemm_q5_Kx8);
    pl_packed.q6_K = PX_NAME(gemm_q6_Kx8);
    return 1;
}
