/* isa_check.c — every kernel of every ISA this machine runs, against the scalar reference.
 *
 * Linked straight against the csrc/ sources (no Python), so it runs wherever a C compiler targets:
 * natively on x86-64 (AVX2, and AVX-512 where the CPU has it) and on AArch64 under qemu (NEON);
 * .ci/cross builds and runs it on each. For each ISA the kernel table is taken once with
 * pl_set_isa(PL_ISA_SCALAR) and once with the ISA, and every entry of both — the traits of every
 * type (to_f32, from_f32, vec_dot, quantize_weights) and pl_vec — is called on the same inputs
 * (also the entries an ISA leaves scalar: they must then agree trivially). An ISA's vec_dot_rows
 * is checked against that ISA's own vec_dot, bit for bit. The packed GEMM kernels (packed.h) are
 * checked against their scalar references bit for bit, for every row count, activation count and
 * split of either, and the packed layout is unpacked back into the file's bytes. The tolerances are
 * the ones the Python tests use:
 *
 *   bit for bit    widening and dequantizing (every ISA does the scalar's operations in its order;
 *                  a NaN need only stay a NaN), narrowing and quantizing (the SIMD quantizers
 *                  reproduce their references)
 *   bit for bit    dot products whose inputs keep every partial sum an exact float: small integers,
 *                  quant scales ±1 or ±2 (then the order of summation cannot matter); the scalar
 *                  result must be the exact sum too
 *   |Δ| ≤ 4e-7·(n/32 + 4)·Σ|w·x|       quantized dot products (test_quants.py's dot_tolerance)
 *   |Δ| ≤ max(1e-5·|Σw·x|, 1e-4)       float dot products, n ≤ 1000 (test_kernels.py's approx)
 *   |Δ| ≤ 2^-22·(|a·x| + |y|)          axpy (one fused multiply-add against two roundings)
 *   |Δ| ≤ 2·(atol + rtol·|y|)          softmax (2e-6, 1e-9), swiglu (2e-6, 1e-7), gelu and geglu
 *                                      (1e-5, 1e-6): each is within (atol, rtol) of float64 in
 *                                      test_kernels.py / test_ops.py, so within twice of each other
 *
 * Prints one line per kernel (checks, largest difference, its share of the tolerance), then
 * "isa_check: ISA: N passed, M failed" per ISA, and a digest of the scalar kernels' exact outputs,
 * which must be the same on every architecture. Exits 1 on any failure.
 *
 *   isa_check [--require avx2|avx512|neon ...]   fail if a required ISA cannot be run here
 *             [--digests]                          and print the scalar digest of every kernel
 */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "packed.h"
#include "quants.h"

/* ---------------------------------------------------------------- random numbers, no libm */

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t next_u64(rng_t *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(rng_t *r) { return (float)(next_u64(r) >> 40) * (1.0f / 16777216.0f); } /* [0, 1) */
static int randint(rng_t *r, int lo, int hi) { return lo + (int)(next_u64(r) % (uint64_t)(hi - lo + 1)); }

/* Twelve uniforms less 6 (mean 0, variance 1): float arithmetic only, so every architecture draws
 * the same numbers and the scalar digest can be compared across them. */
static float normal(rng_t *r) {
    float s = 0.0f;
    for (int i = 0; i < 12; i++) s += uniform(r);
    return s - 6.0f;
}

/* Gaussian data with some outliers, as real weights and activations have (test_quants.gaussian). */
static void gaussian(float *x, int64_t n, rng_t *r) {
    for (int64_t i = 0; i < n; i++) x[i] = normal(r);
    for (int64_t i = 0; i < n / 64; i++) x[next_u64(r) % (uint64_t)n] *= 8.0f;
}

/* ---------------------------------------------------------------- the kernel tables */

typedef struct {
    int has[PL_TYPE_COUNT];
    pl_type_traits t[PL_TYPE_COUNT];
    pl_vec_kernels v;
    pl_packed_kernels p;
} kernel_set;

static void take_kernels(kernel_set *k) {
    memset(k, 0, sizeof *k);
    for (int i = 0; i < PL_TYPE_COUNT; i++) {
        const pl_type_traits *t = pl_traits(i);
        if (t) {
            k->has[i] = 1;
            k->t[i] = *t;
        }
    }
    k->v = pl_vec;
    k->p = pl_packed;
}

static int is_quant(int type) { return type != PL_TYPE_F32 && type != PL_TYPE_F16 && type != PL_TYPE_BF16; }

/* ---------------------------------------------------------------- results */

typedef struct {
    char name[40];
    int own;           /* the ISA's kernel is not the scalar one */
    int checks, failed, exact;
    double max_diff;   /* largest |Δ| of a check with a tolerance */
    double max_share;  /* largest |Δ| / tolerance */
} stat_t;

#define MAX_STATS 100
static stat_t stats[MAX_STATS];
static int n_stats;
static const char *isa_name = "?";
static int total_failed;
static int fail_messages;

static stat_t *stat_of(const char *type, const char *kernel, int own) {
    char name[40];
    snprintf(name, sizeof name, "%s%s%s", type, *type ? "." : "", kernel);
    for (int i = 0; i < n_stats; i++)
        if (!strcmp(stats[i].name, name)) return &stats[i];
    if (n_stats == MAX_STATS) {
        fprintf(stderr, "isa_check: more than %d kernels\n", MAX_STATS);
        exit(2);
    }
    stat_t *s = &stats[n_stats++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->own = own;
    return s;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void fail(stat_t *s, const char *what, const char *fmt, ...) {
    s->failed++;
    total_failed++;
    if (fail_messages++ >= 40) return; /* enough to see the pattern */
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "isa_check: FAIL %s %s (%s): ", isa_name, s->name, what);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Bit for bit; a NaN need only be a NaN (F16C and NEON quieten signalling ones, the scalar code
 * keeps their payload). */
static void same_floats(stat_t *s, const char *what, const float *got, const float *ref, int64_t n) {
    s->checks++;
    s->exact++;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) && isnan(ref[i])) continue;
        if (bits(got[i]) != bits(ref[i])) {
            fail(s, what, "element %lld of %lld: %s %.9g (0x%08x), scalar %.9g (0x%08x)", (long long)i,
                 (long long)n, isa_name, got[i], (unsigned)bits(got[i]), ref[i], (unsigned)bits(ref[i]));
            return;
        }
    }
}

static void same_bytes(stat_t *s, const char *what, const void *got, const void *ref, size_t n) {
    s->checks++;
    s->exact++;
    const uint8_t *a = got, *b = ref;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            fail(s, what, "byte %lld of %lld: %s 0x%02x, scalar 0x%02x", (long long)i, (long long)n, isa_name,
                 a[i], b[i]);
            return;
        }
}

/* |got − ref| ≤ tol[i] for every element (tol: per element, or the scalar tol0 where NULL). */
static void close_floats(stat_t *s, const char *what, const float *got, const float *ref, const double *tol,
                         double tol0, int64_t n) {
    s->checks++;
    for (int64_t i = 0; i < n; i++) {
        double t = tol ? tol[i] : tol0, d = fabs((double)got[i] - (double)ref[i]);
        if (!(isfinite(got[i]) && isfinite(ref[i])) || !(d <= t)) {
            if (isnan(got[i]) && isnan(ref[i])) continue;
            if (isinf(got[i]) && got[i] == ref[i]) continue;
            fail(s, what, "element %lld of %lld: %s %.9g, scalar %.9g, |diff| %.3g > tolerance %.3g",
                 (long long)i, (long long)n, isa_name, got[i], ref[i], d, t);
            return;
        }
        if (d > s->max_diff) s->max_diff = d;
        if (t > 0 && d / t > s->max_share) s->max_share = d / t;
    }
}

/* ---------------------------------------------------------------- blocks */

/* Where each block format keeps its scales: f16 fields (d, and m or dmin) and f32 ones. */
typedef struct {
    int type;
    int n16, n32;
    size_t f16[2], f32[2];
} scale_fields;

static const scale_fields SCALES[] = {
    {PL_TYPE_Q4_0, 1, 0, {offsetof(pl_block_q4_0, d)}, {0}},
    {PL_TYPE_Q4_1, 2, 0, {offsetof(pl_block_q4_1, d), offsetof(pl_block_q4_1, m)}, {0}},
    {PL_TYPE_Q5_0, 1, 0, {offsetof(pl_block_q5_0, d)}, {0}},
    {PL_TYPE_Q5_1, 2, 0, {offsetof(pl_block_q5_1, d), offsetof(pl_block_q5_1, m)}, {0}},
    {PL_TYPE_Q8_0, 1, 0, {offsetof(pl_block_q8_0, d)}, {0}},
    {PL_TYPE_Q8_1, 0, 2, {0}, {offsetof(pl_block_q8_1, d), offsetof(pl_block_q8_1, s)}},
    {PL_TYPE_Q4_K, 2, 0, {offsetof(pl_block_q4_K, d), offsetof(pl_block_q4_K, dmin)}, {0}},
    {PL_TYPE_Q5_K, 2, 0, {offsetof(pl_block_q5_K, d), offsetof(pl_block_q5_K, dmin)}, {0}},
    {PL_TYPE_Q6_K, 1, 0, {offsetof(pl_block_q6_K, d)}, {0}},
    {PL_TYPE_Q8_K, 0, 1, {0}, {offsetof(pl_block_q8_K, d)}},
};

static const scale_fields *scales_of(int type) {
    for (size_t i = 0; i < sizeof SCALES / sizeof *SCALES; i++)
        if (SCALES[i].type == type) return &SCALES[i];
    return NULL;
}

/* max, −max, min normal, subnormals, ±0, 1 (test_quants.EXTREME_F16) */
static const uint16_t EXTREME_F16[] = {0x7BFF, 0xFBFF, 0x0400, 0x8400, 0x0001, 0x03FF, 0x8001, 0x0000, 0x8000, 0x3C00};
static const float EXTREME_F32[] = {1e36f, -1e36f, 1.2e-38f, 1e-45f, 0.0f, 1.0f};

enum { SCALES_NORMAL, SCALES_EXTREME, SCALES_UNIT };

/* In [1e-3, 0.1): two statements, so that no compiler fuses them into one rounding (C lets it
 * contract a·b + c within an expression, and clang does where FMA is baseline, as on AArch64). */
static float normal_scale(rng_t *r) {
    float u = 0.099f * uniform(r);
    return 1e-3f + u;
}

/* Σ qs over each 16 elements of q8_K blocks, as the quantizer leaves them. */
static void fix_bsums(pl_block_q8_K *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++)
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += b[i].qs[16 * j + l];
            b[i].bsums[j] = (int16_t)sum;
        }
}

/* Random bytes, then the scales set: normal (|d| in [1e-3, 0.1), either sign), extreme (cycled
 * through the values above), or unit (±1, ±2: every product and sum of a dot stays an exact float). */
static void random_blocks(int type, void *dst, int64_t nb, int mode, rng_t *r) {
    const pl_type_traits *t = pl_traits(type);
    uint8_t *b = dst;
    for (int64_t i = 0; i < nb * t->type_size; i++) b[i] = (uint8_t)next_u64(r);
    const scale_fields *sf = scales_of(type);
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *blk = b + i * t->type_size;
        for (int k = 0; k < sf->n16; k++) {
            uint16_t h;
            if (mode == SCALES_EXTREME)
                h = EXTREME_F16[(i + (int64_t)sf->f16[k]) % (int64_t)(sizeof EXTREME_F16 / 2)];
            else if (mode == SCALES_UNIT)
                h = pl_f32_to_f16((next_u64(r) & 1 ? -1.0f : 1.0f) * (next_u64(r) & 1 ? 2.0f : 1.0f));
            else
                h = pl_f32_to_f16((next_u64(r) & 1 ? -1.0f : 1.0f) * normal_scale(r));
            memcpy(blk + sf->f16[k], &h, 2);
        }
        for (int k = 0; k < sf->n32; k++) {
            float v = mode == SCALES_EXTREME ? EXTREME_F32[i % (int64_t)(sizeof EXTREME_F32 / 4)]
                      : mode == SCALES_UNIT  ? (next_u64(r) & 1 ? 2.0f : 1.0f)
                                             : normal_scale(r);
            memcpy(blk + sf->f32[k], &v, 4);
        }
    }
    if (type == PL_TYPE_Q8_K) fix_bsums(dst, nb);
}

/* ---------------------------------------------------------------- checks of one ISA */

typedef struct {
    const kernel_set *simd, *ref;
    rng_t rng;
} ctx_t;

#define LEN(a) ((int)(sizeof(a) / sizeof *(a)))

static const char *type_name(const ctx_t *c, int type) { return c->ref->t[type].name; }

/* to_f32: every f16/bf16 bit pattern; random blocks with normal and extreme scales. */
static void check_to_f32(ctx_t *c, int type) {
    const pl_type_traits *ts = &c->simd->t[type], *tr = &c->ref->t[type];
    stat_t *s = stat_of(tr->name, "to_f32", ts->to_f32 != tr->to_f32);
    int64_t bs = tr->block_size, cap = 1 << 16;
    uint8_t *src = malloc((size_t)(cap / bs * tr->type_size));
    float *got = malloc((size_t)cap * 4), *ref = malloc((size_t)cap * 4);
    char what[64];
    if (!is_quant(type)) {
        if (type == PL_TYPE_F32)
            gaussian((float *)src, cap, &c->rng);
        else
            for (int64_t i = 0; i < cap; i++) ((uint16_t *)src)[i] = (uint16_t)i;
        static const int lens[] = {1, 3, 7, 8, 9, 15, 16, 17, 33, 100};
        for (int k = 0; k <= LEN(lens); k++) {
            int64_t n = k < LEN(lens) ? lens[k] : cap, off = k < LEN(lens) ? randint(&c->rng, 0, 60000) : 0;
            const uint8_t *p = src + off * tr->type_size;
            snprintf(what, sizeof what, "n=%lld%s", (long long)n, k < LEN(lens) ? "" : ", every value");
            ts->to_f32(p, got, n);
            tr->to_f32(p, ref, n);
            same_floats(s, what, got, ref, n);
        }
    } else {
        static const int blocks[] = {1, 2, 3, 7, 8, 9, 16, 17, 64};
        for (int mode = SCALES_NORMAL; mode <= SCALES_EXTREME; mode++)
            for (int k = 0; k < LEN(blocks); k++) {
                int64_t nb = blocks[k], n = nb * bs;
                if (n > cap) continue;
                random_blocks(type, src, nb, mode, &c->rng);
                snprintf(what, sizeof what, "%lld blocks, %s scales", (long long)nb,
                         mode == SCALES_NORMAL ? "normal" : "extreme");
                ts->to_f32(src, got, n);
                tr->to_f32(src, ref, n);
                same_floats(s, what, got, ref, n);
            }
    }
    free(src);
    free(got);
    free(ref);
}

/* What activations look like, with the cases quantizers round differently on (activation_inputs
 * of test_quants.py): a zero block, ties of x/d at k + ½ for d = 1, a negative maximum tied with a
 * later positive one; and blocks scaled by 10^-5 … 10^3. n: a multiple of 4·256. */
static void activation_inputs(float *x, int64_t n, rng_t *r) {
    gaussian(x, n, r);
    for (int64_t i = 0; i < n; i++) x[i] *= 3.7f;
    for (int j = 0; j < QK_K; j++) {
        x[j] = 0.0f;
        x[QK_K + j] = (float)(j % 64) - 31.5f;
        x[2 * QK_K + j] = (float)(j % 128) - 63.5f;
    }
    for (int j = QK_K + 5; j < 2 * QK_K; j += QK) x[j] = 127.0f;
    x[2 * QK_K + 7] = -127.0f;
    float big = 0.0f;
    for (int j = 3 * QK_K; j < 4 * QK_K; j++) big = fabsf(x[j]) > big ? fabsf(x[j]) : big;
    x[3 * QK_K + 9] = -2 * big;
    x[3 * QK_K + 200] = 2 * big;
    static const float scale[] = {1e-5f, 1e-4f, 1e-3f, 1e-2f, 0.1f, 1.0f, 10.0f, 100.0f, 1000.0f};
    for (int64_t b = 4 * QK_K / QK; b < n / QK; b++) {
        float f = scale[next_u64(r) % LEN(scale)];
        for (int j = 0; j < QK; j++) x[b * QK + j] *= f;
    }
}

/* f32 → f16 inputs of test_kernels.py: gaussian · 10^(-9 … 5), and the edges of rounding. */
static int64_t narrowing_inputs(float *x, int64_t cap, rng_t *r) {
    static const float pow10[] = {1e-9f, 1e-8f, 1e-7f, 1e-6f, 1e-5f, 1e-4f, 1e-3f, 1e-2f,
                                  1e-1f, 1.0f,  1e1f,  1e2f,  1e3f,  1e4f,  1e5f};
    static const float edges[] = {0.0f, -0.0f, 65504.0f, 65520.0f, 65519.99f, 1e-8f, 6e-8f, 3e-8f, 2.98e-8f,
                                  INFINITY, -INFINITY, NAN, -NAN, 5.9604645e-8f, 2.9802322e-8f,
                                  6.1035156e-5f, 6.0975552e-5f, 1.00048828125f, 1.00146484375f};
    int64_t n = 0;
    for (int i = 0; i < LEN(edges) && n < cap; i++) x[n++] = edges[i];
    while (n < cap) x[n++] = normal(r) * pow10[next_u64(r) % LEN(pow10)];
    return n;
}

/* from_f32 (and quantize_weights): bytes, bit for bit. */
static void check_from_f32(ctx_t *c, int type, int weights) {
    const pl_type_traits *ts = &c->simd->t[type], *tr = &c->ref->t[type];
    pl_from_f32_fn fs = weights ? ts->quantize_weights : ts->from_f32;
    pl_from_f32_fn fr = weights ? tr->quantize_weights : tr->from_f32;
    if (!fs || !fr) return;
    stat_t *s = stat_of(tr->name, weights ? "quantize_weights" : "from_f32", fs != fr);
    const int64_t cap = 16 * QK_K;
    float *x = malloc(cap * 4);
    uint8_t *got = malloc((size_t)pl_row_size(type, cap)), *ref = malloc((size_t)pl_row_size(type, cap));
    if (is_quant(type))
        activation_inputs(x, cap, &c->rng);
    else
        narrowing_inputs(x, cap, &c->rng);
    int64_t bs = tr->block_size;
    /* everything, then a few blocks (elements of the float types) at random offsets */
    static const int blocks[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 33};
    char what[64];
    for (int k = 0; k < LEN(blocks); k++) {
        int64_t n = k == 0 ? cap : blocks[k] * bs;
        if (n > cap) continue;
        int64_t off = k == 0 ? 0 : randint(&c->rng, 0, (int)((cap - n) / bs)) * bs;
        snprintf(what, sizeof what, "n=%lld at %lld", (long long)n, (long long)off);
        size_t nbytes = (size_t)pl_row_size(type, n);
        memset(got, 0xAA, nbytes);
        memset(ref, 0x55, nbytes);
        fs(x + off, got, n);
        fr(x + off, ref, n);
        same_bytes(s, what, got, ref, nbytes);
    }
    free(x);
    free(got);
    free(ref);
}

/* Σ w·x and Σ|w·x| in float64 over the dequantized operands (scalar to_f32). */
static void dot_reference(const kernel_set *ref, int type, const void *w, const void *xq, int64_t n, float *wf,
                          float *xf, double *sum, double *scale) {
    int vt = ref->t[type].vec_dot_type;
    ref->t[type].to_f32(w, wf, n);
    ref->t[vt].to_f32(xq, xf, n);
    double s = 0, a = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)wf[i] * xf[i];
        a += fabs((double)wf[i] * xf[i]);
    }
    *sum = s;
    *scale = a;
}

/* Activations in unit blocks: quants in {−1, 0, 1}, d ±1 or ±2 (q8_0's f16) or 1 or 2 (the f32 of
 * q8_1, q8_K); s and bsums as the quantizers set them. */
static void unit_activations(int vt, void *dst, int64_t n, rng_t *r) {
    if (vt == PL_TYPE_F32) {
        float *x = dst;
        for (int64_t i = 0; i < n; i++) x[i] = (float)randint(r, -4, 4);
        return;
    }
    random_blocks(vt, dst, n / pl_traits(vt)->block_size, SCALES_UNIT, r);
    if (vt == PL_TYPE_Q8_0 || vt == PL_TYPE_Q8_1) {
        for (int64_t b = 0; b < n / QK; b++) {
            int8_t *qs = vt == PL_TYPE_Q8_0 ? ((pl_block_q8_0 *)dst)[b].qs : ((pl_block_q8_1 *)dst)[b].qs;
            int sum = 0;
            for (int j = 0; j < QK; j++) sum += qs[j] = (int8_t)randint(r, -1, 1);
            if (vt == PL_TYPE_Q8_1) ((pl_block_q8_1 *)dst)[b].s = (float)sum * ((pl_block_q8_1 *)dst)[b].d;
        }
    } else { /* q8_K */
        pl_block_q8_K *y = dst;
        for (int64_t b = 0; b < n / QK_K; b++)
            for (int j = 0; j < QK_K; j++) y[b].qs[j] = (int8_t)randint(r, -1, 1);
        fix_bsums(y, n / QK_K);
    }
}

/* Weights of unit blocks, or for the float types small integers. */
static void unit_weights(const kernel_set *ref, int type, void *dst, int64_t n, rng_t *r) {
    if (!is_quant(type)) {
        float *x = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) x[i] = (float)randint(r, -4, 4);
        ref->t[type].from_f32(x, dst, n);
        free(x);
        return;
    }
    random_blocks(type, dst, n / pl_traits(type)->block_size, SCALES_UNIT, r);
}

static void check_vec_dot(ctx_t *c, int type) {
    const pl_type_traits *ts = &c->simd->t[type], *tr = &c->ref->t[type];
    if (!tr->vec_dot) return;
    stat_t *s = stat_of(tr->name, "vec_dot", ts->vec_dot != tr->vec_dot);
    int vt = tr->vec_dot_type, quant = is_quant(type);
    int64_t bs = tr->block_size;
    const int64_t cap = 160 * 32;
    void *w = malloc((size_t)pl_row_size(type, cap)), *xq = malloc((size_t)pl_row_size(vt, cap));
    float *x = malloc(cap * 4), *wf = malloc(cap * 4), *xf = malloc(cap * 4);
    char what[80];

    /* 1. unit scales and small quants: every partial sum is an exact float, so every order of
     *    summation gives the exact sum. Block counts cover the 8-block groups and their tails. */
    static const int unit_blocks_32[] = {1, 2, 7, 8, 9, 15, 16, 17, 33}, unit_blocks_k[] = {1, 2, 3};
    static const int unit_lens_f[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 576, 1000, 4099};
    const int *counts = !quant ? unit_lens_f : bs == QK ? unit_blocks_32 : unit_blocks_k;
    int n_counts = !quant ? LEN(unit_lens_f) : bs == QK ? LEN(unit_blocks_32) : LEN(unit_blocks_k);
    for (int k = 0; k < n_counts; k++) {
        int64_t n = counts[k] * bs;
        unit_weights(c->ref, type, w, n, &c->rng);
        unit_activations(vt, xq, n, &c->rng);
        double want, scale;
        dot_reference(c->ref, type, w, xq, n, wf, xf, &want, &scale);
        if (scale >= 16777216.0) {
            fprintf(stderr, "isa_check: %s unit dot of %lld sums to %g, not exact in f32\n", tr->name,
                    (long long)n, scale);
            exit(2);
        }
        float got = ts->vec_dot(w, xq, n), ref = tr->vec_dot(w, xq, n), exact = (float)want;
        snprintf(what, sizeof what, "n=%lld, unit scales", (long long)n);
        same_floats(s, what, &got, &ref, 1);
        s->checks++; /* and both are the exact sum */
        s->exact++;
        if (bits(ref) != bits(exact)) fail(s, what, "scalar %.9g, the exact sum %.9g", ref, exact);
    }

    /* 2. the rows of test_vec_dot_simd_agrees_with_scalar: half quantized from gaussian data, half
     *    random blocks; activations spanning a factor of 100; and random blocks of extreme f16
     *    scales against small activations. Activations go through the scalar quantizer. */
    static const int blocks_32[] = {1, 2, 3, 7, 8, 9, 16, 17, 33, 129}, blocks_k[] = {1, 2, 3, 8, 17};
    static const int lens_f[] = {1, 7, 8, 9, 16, 17, 31, 33, 64, 65, 576, 1000}; /* test_kernels' range */
    counts = !quant ? lens_f : bs == QK ? blocks_32 : blocks_k;
    n_counts = !quant ? LEN(lens_f) : bs == QK ? LEN(blocks_32) : LEN(blocks_k);
    for (int k = 0; k < n_counts; k++) {
        int64_t n = counts[k] * bs, nb = counts[k];
        for (int row = 0; row < 5; row++) {
            int extreme = quant && row == 4;
            if (!quant) {
                gaussian(x, n, &c->rng);
                tr->from_f32(x, w, n);
            } else if (row < 3) {
                int64_t half = nb / 2 * bs;
                gaussian(x, half, &c->rng);
                (tr->quantize_weights ? tr->quantize_weights : tr->from_f32)(x, w, half);
                random_blocks(type, (char *)w + pl_row_size(type, half), nb - nb / 2, SCALES_NORMAL, &c->rng);
            } else {
                random_blocks(type, w, nb, extreme ? SCALES_EXTREME : SCALES_NORMAL, &c->rng);
            }
            gaussian(x, n, &c->rng);
            if (quant)
                for (int64_t i = 0; i < n; i++) x[i] *= extreme ? 1e-3f : i < n / 4 ? 100.0f : 1.0f;
            c->ref->t[vt].from_f32(x, xq, n);
            double want, scale;
            dot_reference(c->ref, type, w, xq, n, wf, xf, &want, &scale);
            float got = ts->vec_dot(w, xq, n), ref = tr->vec_dot(w, xq, n);
            double tol = quant ? 4e-7 * (double)(n / QK + 4) * scale + 1e-30 : fmax(1e-5 * fabs(want), 1e-4);
            snprintf(what, sizeof what, "n=%lld, row %d (%s)", (long long)n, row,
                     !quant      ? "gaussian"
                     : row < 3   ? "half quantized, half random"
                     : extreme   ? "extreme scales"
                                 : "random");
            close_floats(s, what, &got, &ref, NULL, tol, 1);
        }
    }
    free(w);
    free(xq);
    free(x);
    free(wf);
    free(xf);
}

/* vec_dot_rows, where the ISA has one: each of n_rows results, written out_stride apart, is the
 * ISA's own vec_dot of that row bit for bit (what keeps a row of a batched decode step equal to
 * that sequence's step alone), and nothing between them is written. Row counts cover passes of 8
 * and every remainder; widths the 8-block groups and their tails (18 blocks: a 576 row). In the
 * failure messages the reference, this ISA's vec_dot, is called "scalar". */
static void check_vec_dot_rows(ctx_t *c, int type) {
    const pl_type_traits *ts = &c->simd->t[type];
    if (!ts->vec_dot_rows) return;
    stat_t *s = stat_of(ts->name, "vec_dot_rows", 1);
    enum { MAX_ROWS = 17 };
    static const int blocks_32[] = {1, 7, 8, 9, 17, 18, 33}, blocks_k[] = {1, 2, 3};
    int k32 = ts->block_size == QK;
    const int *counts = k32 ? blocks_32 : blocks_k;
    int n_counts = k32 ? LEN(blocks_32) : LEN(blocks_k), vt = ts->vec_dot_type;
    const int64_t cap = 5 * QK_K; /* ≥ 33 blocks of 32, whole super-blocks */
    int64_t xrow = pl_row_size(vt, cap);
    void *w = malloc((size_t)pl_row_size(type, cap));
    uint8_t *xq = malloc((size_t)(MAX_ROWS * xrow));
    float *x = malloc(cap * 4), want[MAX_ROWS], got[2 * MAX_ROWS], gap[2 * MAX_ROWS];
    char what[80];
    for (int k = 0; k < n_counts; k++) {
        int64_t nb = counts[k], n = nb * ts->block_size;
        xrow = pl_row_size(vt, n);
        for (int mode = SCALES_NORMAL; mode <= SCALES_EXTREME; mode++) {
            random_blocks(type, w, nb, mode, &c->rng);
            for (int r = 0; r < MAX_ROWS; r++) {
                gaussian(x, n, &c->rng);
                float f = (float)(r % 5 == 0 ? 1e-2 : r % 5 == 1 ? 1e-1 : r % 5 == 2 ? 1.0 : r % 5 == 3 ? 1e1 : 1e2);
                for (int64_t i = 0; i < n; i++) x[i] *= mode == SCALES_EXTREME ? 1e-3f : f;
                c->ref->t[vt].from_f32(x, xq + r * xrow, n);
                want[r] = ts->vec_dot(w, xq + r * xrow, n);
            }
            for (int n_rows = 1; n_rows <= MAX_ROWS; n_rows++) {
                for (int i = 0; i < 2 * MAX_ROWS; i++) got[i] = gap[i] = -12345.0f;
                ts->vec_dot_rows(w, xq, xrow, n_rows, n, got, 2);
                float res[MAX_ROWS], between[MAX_ROWS];
                for (int r = 0; r < n_rows; r++) res[r] = got[2 * r], between[r] = got[2 * r + 1];
                snprintf(what, sizeof what, "%lld blocks, %d rows, %s scales", (long long)nb, n_rows,
                         mode == SCALES_NORMAL ? "normal" : "extreme");
                same_floats(s, what, res, want, n_rows);
                same_floats(s, what, between, gap, n_rows);
            }
        }
    }
    free(w);
    free(xq);
    free(x);
}

/* ---------------------------------------------------------------- packed GEMM */

/* The file's bytes of row group g back from a packed matrix, by the layout packed.h documents
 * (written here independently of packed.c): rows below rows only. */
static void unpack_group(int type, const void *packed, int64_t rows, int64_t cols, int64_t g, uint8_t *dst) {
    int64_t nb = cols / pl_traits(type)->block_size, row_bytes = pl_row_size(type, cols);
    for (int r = 0; r < PL_PACK_ROWS && g * PL_PACK_ROWS + r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *out = dst + r * row_bytes;
            if (type == PL_TYPE_Q4_0) {
                const pl_block_q4_0x8 *p = (const pl_block_q4_0x8 *)packed + g * nb + b;
                pl_block_q4_0 *o = (pl_block_q4_0 *)out + b;
                o->d = p->d[r];
                /* chunk k: row r's qs[4k .. 4k + 3], both nibbles where the file keeps them */
                for (int k = 0; k < 4; k++)
                    for (int i = 0; i < 4; i++) o->qs[4 * k + i] = p->qs[32 * k + 4 * r + i];
            } else if (type == PL_TYPE_Q4_1) {
                const pl_block_q4_1x8 *p = (const pl_block_q4_1x8 *)packed + g * nb + b;
                pl_block_q4_1 *o = (pl_block_q4_1 *)out + b;
                o->d = p->d[r];
                o->m = p->m[r];
                for (int k = 0; k < 4; k++)
                    for (int i = 0; i < 4; i++) {
                        uint8_t q = p->qs[32 * k + 4 * r + i];
                        /* low nibble: element 4k + i; high: 16 + 4k + i, the high nibble of qs[4k + i] */
                        o->qs[4 * k + i] = (uint8_t)((q & 0xF) | (q >> 4) << 4);
                    }
            } else if (type == PL_TYPE_Q5_0) {
                const pl_block_q5_0x8 *p = (const pl_block_q5_0x8 *)packed + g * nb + b;
                pl_block_q5_0 *o = (pl_block_q5_0 *)out + b;
                uint32_t h = 0;
                o->d = p->d[r];
                for (int k = 0; k < 4; k++)
                    for (int i = 0; i < 4; i++) {
                        uint8_t q = p->qs[32 * k + 4 * r + i], hb = p->qh[4 * r + i];
                        o->qs[4 * k + i] = q; /* the low nibbles stay where q4_1's do */
                        /* bit k: the fifth bit of element 4k + i; bit 4 + k: of element 16 + 4k + i */
                        h |= (uint32_t)(hb >> k & 1) << (4 * k + i) | (uint32_t)(hb >> (4 + k) & 1) << (16 + 4 * k + i);
                    }
                for (int i = 0; i < 4; i++) o->qh[i] = (uint8_t)(h >> (8 * i));
            } else if (type == PL_TYPE_Q4_K) {
                const pl_block_q4_Kx8 *p = (const pl_block_q4_Kx8 *)packed + g * nb + b;
                pl_block_q4_K *o = (pl_block_q4_K *)out + b;
                o->d = p->d[r];
                o->dmin = p->dmin[r];
                for (int i = 0; i < 12; i++) o->scales[i] = (uint8_t)(p->scales[i / 4][r] >> (8 * (i % 4)));
                /* register (c, k): row r's bytes 32c + 4k .. + 3 */
                for (int c = 0; c < 4; c++)
                    for (int k = 0; k < 8; k++)
                        for (int i = 0; i < 4; i++) o->qs[32 * c + 4 * k + i] = p->qs[256 * c + 32 * k + 4 * r + i];
            } else if (type == PL_TYPE_Q5_K) {
                const pl_block_q5_Kx8 *p = (const pl_block_q5_Kx8 *)packed + g * nb + b;
                pl_block_q5_K *o = (pl_block_q5_K *)out + b;
                o->d = p->low.d[r];
                o->dmin = p->low.dmin[r];
                for (int i = 0; i < 12; i++) o->scales[i] = (uint8_t)(p->low.scales[i / 4][r] >> (8 * (i % 4)));
                /* register (c, k) of qs as q4_K's; register k of qh: row r's qh[4k ..] */
                for (int k = 0; k < 8; k++)
                    for (int i = 0; i < 4; i++) {
                        for (int c = 0; c < 4; c++) o->qs[32 * c + 4 * k + i] = p->low.qs[256 * c + 32 * k + 4 * r + i];
                        o->qh[4 * k + i] = p->qh[32 * k + 4 * r + i];
                    }
            } else if (type == PL_TYPE_Q6_K) {
                const pl_block_q6_Kx8 *p = (const pl_block_q6_Kx8 *)packed + g * nb + b;
                pl_block_q6_K *o = (pl_block_q6_K *)out + b;
                o->d = p->d[r];
                for (int sb = 0; sb < 16; sb++) o->scales[sb] = p->scales[sb][r];
                /* register (m, k) of ql: row r's ql[32m + 4k ..]; (h, k) of qh: its qh[32h + 4k ..] */
                for (int k = 0; k < 8; k++)
                    for (int i = 0; i < 4; i++) {
                        for (int m = 0; m < 4; m++) o->ql[32 * m + 4 * k + i] = p->ql[256 * m + 32 * k + 4 * r + i];
                        for (int h = 0; h < 2; h++) o->qh[32 * h + 4 * k + i] = p->qh[256 * h + 32 * k + 4 * r + i];
                    }
            } else {
                const pl_block_q8_0x8 *p = (const pl_block_q8_0x8 *)packed + g * nb + b;
                pl_block_q8_0 *o = (pl_block_q8_0 *)out + b;
                o->d = p->d[r];
                for (int k = 0; k < 8; k++)
                    for (int i = 0; i < 4; i++) o->qs[4 * k + i] = p->qs[32 * k + 4 * r + i];
            }
        }
}

/* pl_gemm_packed's kernels of an ISA against the scalar ones, bit for bit: the whole (rows, n)
 * product; each activation row alone; the rows cut into ranges at every group boundary; nothing
 * written outside the rows asked for (ldy leaves a gap after each output row). Weights with
 * normal and extreme scales, activations quantized by the reference from rows of very different
 * magnitudes. Also: the packed layout unpacks into the source bytes (padding groups zero). */
static void check_packed(ctx_t *c, int type) {
    pl_packed_gemm_fn ks = pl_packed_kernel_of(&c->simd->p, type);
    pl_packed_gemm_fn kr = pl_packed_kernel_of(&c->ref->p, type);
    stat_t *s = stat_of(type_name(c, type), "gemm_packed", ks != kr);
    stat_t *sl = stat_of(type_name(c, type), "pack_groups", 0);
    static const int rows_list[] = {1, 7, 8, 9, 24, 37}, cols_list[] = {32, 64, 256, 576, 1536};
    static const int n_list[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 15, 17}; /* tiles of 8 rows and one of the rest */
    enum { MAX_N = 17, MAX_ROWS = 37, MAX_COLS = 1536, GAP = 3 };
    int vt = c->ref->t[type].vec_dot_type;
    int64_t ldy = MAX_ROWS + GAP;
    uint8_t *w = malloc((size_t)(MAX_ROWS * pl_row_size(type, MAX_COLS)));
    uint8_t *back = malloc((size_t)(MAX_ROWS * pl_row_size(type, MAX_COLS)));
    uint8_t *packed = malloc((size_t)pl_packed_bytes(type, MAX_ROWS, MAX_COLS));
    uint8_t *xq = malloc((size_t)(MAX_N * pl_row_size(vt, MAX_COLS)));
    float *x = malloc(MAX_COLS * sizeof(float));
    float *want = malloc(MAX_N * ldy * sizeof(float)), *got = malloc(MAX_N * ldy * sizeof(float));
    char what[96];
    int64_t elems = c->ref->t[type].block_size;
    for (int ci = 0; ci < LEN(cols_list); ci++)
        for (int ri = 0; ri < LEN(rows_list); ri++)
            for (int mode = SCALES_NORMAL; mode <= SCALES_EXTREME; mode++) {
                int64_t rows = rows_list[ri], cols = cols_list[ci], nb = cols / elems;
                if (cols % elems) continue;
                int64_t row_bytes = pl_row_size(type, cols), xrow = pl_row_size(vt, cols);
                int64_t groups = (rows + PL_PACK_ROWS - 1) / PL_PACK_ROWS;
                const char *scales = mode == SCALES_NORMAL ? "normal" : "extreme";
                random_blocks(type, w, rows * nb, mode, &c->rng);
                memset(packed, 0xAA, (size_t)pl_packed_bytes(type, rows, cols));
                /* two calls, as a loader splitting the groups over threads would make them */
                pl_pack_groups(type, w, rows, cols, packed, 0, groups / 2);
                pl_pack_groups(type, w, rows, cols, packed, groups / 2, groups);
                memset(back, 0x55, (size_t)(rows * row_bytes));
                for (int64_t g = 0; g < groups; g++) unpack_group(type, packed, rows, cols, g, back + g * 8 * row_bytes);
                snprintf(what, sizeof what, "%lld x %lld, %s scales, unpacked", (long long)rows, (long long)cols, scales);
                same_bytes(sl, what, back, w, (size_t)(rows * row_bytes));
                if (rows % PL_PACK_ROWS) { /* the padding rows of the last group: zero blocks */
                    uint8_t zero[sizeof(pl_block_q6_Kx8)] = {0}, pad[sizeof(pl_block_q6_Kx8)];
                    int64_t padded = groups * PL_PACK_ROWS;
                    for (int64_t b = 0; b < nb; b++) {
                        int64_t bs = pl_packed_bytes(type, 8, elems);
                        memcpy(pad, packed + ((groups - 1) * nb + b) * bs, (size_t)bs);
                        /* zero the real rows' lanes, then everything must be zero */
                        for (int r = 0; r < PL_PACK_ROWS - (int)(padded - rows); r++) {
                            if (type == PL_TYPE_Q4_0) {
                                pl_block_q4_0x8 *p = (pl_block_q4_0x8 *)pad;
                                p->d[r] = 0;
                                for (int k = 0; k < 4; k++) memset(&p->qs[32 * k + 4 * r], 0, 4);
                            } else if (type == PL_TYPE_Q4_1) {
                                pl_block_q4_1x8 *p = (pl_block_q4_1x8 *)pad;
                                p->d[r] = p->m[r] = 0;
                                for (int k = 0; k < 4; k++) memset(&p->qs[32 * k + 4 * r], 0, 4);
                            } else if (type == PL_TYPE_Q5_0) {
                                pl_block_q5_0x8 *p = (pl_block_q5_0x8 *)pad;
                                p->d[r] = 0;
                                memset(&p->qh[4 * r], 0, 4);
                                for (int k = 0; k < 4; k++) memset(&p->qs[32 * k + 4 * r], 0, 4);
                            } else if (type == PL_TYPE_Q4_K) {
                                pl_block_q4_Kx8 *p = (pl_block_q4_Kx8 *)pad;
                                p->d[r] = p->dmin[r] = 0;
                                p->scales[0][r] = p->scales[1][r] = p->scales[2][r] = 0;
                                for (int k = 0; k < 32; k++) memset(&p->qs[32 * k + 4 * r], 0, 4);
                            } else if (type == PL_TYPE_Q5_K) {
                                pl_block_q5_Kx8 *p = (pl_block_q5_Kx8 *)pad;
                                p->low.d[r] = p->low.dmin[r] = 0;
                                p->low.scales[0][r] = p->low.scales[1][r] = p->low.scales[2][r] = 0;
                                for (int k = 0; k < 32; k++) memset(&p->low.qs[32 * k + 4 * r], 0, 4);
                                for (int k = 0; k < 8; k++) memset(&p->qh[32 * k + 4 * r], 0, 4);
                            } else if (type == PL_TYPE_Q6_K) {
                                pl_block_q6_Kx8 *p = (pl_block_q6_Kx8 *)pad;
                                p->d[r] = 0;
                                for (int sb = 0; sb < 16; sb++) p->scales[sb][r] = 0;
                                for (int k = 0; k < 32; k++) memset(&p->ql[32 * k + 4 * r], 0, 4);
                                for (int k = 0; k < 16; k++) memset(&p->qh[32 * k + 4 * r], 0, 4);
                            } else {
                                pl_block_q8_0x8 *p = (pl_block_q8_0x8 *)pad;
                                p->d[r] = 0;
                                for (int k = 0; k < 8; k++) memset(&p->qs[32 * k + 4 * r], 0, 4);
                            }
                        }
                        snprintf(what, sizeof what, "%lld x %lld, padding of block %lld", (long long)rows,
                                 (long long)cols, (long long)b);
                        same_bytes(sl, what, pad, zero, (size_t)bs);
                    }
                }

                for (int t = 0; t < MAX_N; t++) {
                    gaussian(x, cols, &c->rng);
                    float f = mode == SCALES_EXTREME ? 1e-3f : (float)(t % 4 == 0 ? 1e-2 : t % 4 == 1 ? 1.0 : t % 4 == 2 ? 1e2 : 10.0);
                    for (int64_t i = 0; i < cols; i++) x[i] *= f;
                    c->ref->t[vt].from_f32(x, xq + t * xrow, cols);
                }
                for (int64_t i = 0; i < MAX_N * ldy; i++) want[i] = -12345.0f;
                kr(packed, nb, 0, groups, rows, xq, xrow, MAX_N, want, ldy);
                for (int ni = 0; ni < LEN(n_list); ni++) {
                    int n = n_list[ni];
                    /* the whole product */
                    for (int64_t i = 0; i < MAX_N * ldy; i++) got[i] = -12345.0f;
                    ks(packed, nb, 0, groups, rows, xq, xrow, n, got, ldy);
                    snprintf(what, sizeof what, "%lld x %lld, n=%d, %s scales", (long long)rows, (long long)cols, n, scales);
                    same_floats(s, what, got, want, n * ldy);
                    /* row ranges: [0, 8a) and [8a, rows) for every a, into a fresh output each */
                    for (int64_t a = 1; a < groups; a++) {
                        for (int64_t i = 0; i < MAX_N * ldy; i++) got[i] = -12345.0f;
                        ks(packed, nb, a, groups, rows, xq, xrow, n, got, ldy);
                        ks(packed, nb, 0, a, a * PL_PACK_ROWS, xq, xrow, n, got, ldy);
                        snprintf(what, sizeof what, "%lld x %lld, n=%d, split at row %lld, %s scales", (long long)rows,
                                 (long long)cols, n, (long long)(a * PL_PACK_ROWS), scales);
                        same_floats(s, what, got, want, n * ldy);
                    }
                }
                /* each activation row alone, at its own offset */
                for (int64_t i = 0; i < MAX_N * ldy; i++) got[i] = -12345.0f;
                for (int t = 0; t < MAX_N; t++) ks(packed, nb, 0, groups, rows, xq + t * xrow, xrow, 1, got + t * ldy, ldy);
                snprintf(what, sizeof what, "%lld x %lld, rows one by one, %s scales", (long long)rows, (long long)cols, scales);
                same_floats(s, what, got, want, MAX_N * ldy);
            }
    free(w);
    free(back);
    free(packed);
    free(xq);
    free(x);
    free(want);
    free(got);
}

/* A row so wide that a call's activation offsets (q4_0, q5_0, q4_K, q5_K) do not fit the kernel's
 * stack for 17 rows at once: the groups then pass over the rows in parts, which must give the same
 * bits as the scalar kernel in one pass. */
static void check_packed_wide(ctx_t *c, int type) {
    pl_packed_gemm_fn ks = pl_packed_kernel_of(&c->simd->p, type);
    pl_packed_gemm_fn kr = pl_packed_kernel_of(&c->ref->p, type);
    stat_t *s = stat_of(type_name(c, type), "gemm_packed", ks != kr);
    enum { ROWS = 9, COLS = 65536, N = 17 };
    int vt = c->ref->t[type].vec_dot_type;
    int64_t nb = COLS / c->ref->t[type].block_size, groups = (ROWS + PL_PACK_ROWS - 1) / PL_PACK_ROWS;
    int64_t xrow = pl_row_size(vt, COLS);
    uint8_t *w = malloc((size_t)(ROWS * pl_row_size(type, COLS)));
    uint8_t *packed = malloc((size_t)pl_packed_bytes(type, ROWS, COLS));
    uint8_t *xq = malloc((size_t)(N * xrow));
    float *x = malloc(COLS * sizeof(float)), want[N * ROWS], got[N * ROWS];
    random_blocks(type, w, ROWS * nb, SCALES_NORMAL, &c->rng);
    pl_pack_groups(type, w, ROWS, COLS, packed, 0, groups);
    for (int t = 0; t < N; t++) {
        gaussian(x, COLS, &c->rng);
        c->ref->t[vt].from_f32(x, xq + t * xrow, COLS);
    }
    kr(packed, nb, 0, groups, ROWS, xq, xrow, N, want, ROWS);
    ks(packed, nb, 0, groups, ROWS, xq, xrow, N, got, ROWS);
    same_floats(s, "9 x 65536, n=17 (the rows in parts)", got, want, N * ROWS);
    free(w);
    free(packed);
    free(xq);
    free(x);
}

/* ---------------------------------------------------------------- pl_vec */

static const int VEC_LENS[] = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 576, 1000, 1536, 4099};
#define VEC_CAP 4099

static void check_vec(ctx_t *c) {
    const pl_vec_kernels *vs = &c->simd->v, *vr = &c->ref->v;
    float *a = malloc(VEC_CAP * 4), *b = malloc(VEC_CAP * 4), *got = malloc(VEC_CAP * 4), *ref = malloc(VEC_CAP * 4);
    uint16_t *h = malloc(VEC_CAP * 2);
    double *tol = malloc(VEC_CAP * sizeof *tol);
    char what[64];
    stat_t *sd = stat_of("", "dot_f32", vs->dot_f32 != vr->dot_f32);
    stat_t *sa = stat_of("", "axpy_f32", vs->axpy_f32 != vr->axpy_f32);
    stat_t *sdh = stat_of("", "dot_f16", vs->dot_f16 != vr->dot_f16);
    stat_t *sah = stat_of("", "axpy_f16", vs->axpy_f16 != vr->axpy_f16);
    stat_t *ss = stat_of("", "softmax", vs->softmax != vr->softmax);
    stat_t *sw = stat_of("", "swiglu", vs->swiglu != vr->swiglu);
    stat_t *sg = stat_of("", "geglu", vs->geglu != vr->geglu);
    stat_t *su = stat_of("", "gelu", vs->gelu != vr->gelu);
    for (int k = 0; k < LEN(VEC_LENS); k++) {
        int n = VEC_LENS[k];
        /* dot_f32: small integers (exact in any order), then gaussian data */
        for (int i = 0; i < n; i++) a[i] = (float)randint(&c->rng, -4, 4), b[i] = (float)randint(&c->rng, -4, 4);
        float g1 = vs->dot_f32(a, b, n), r1 = vr->dot_f32(a, b, n);
        snprintf(what, sizeof what, "n=%d, small integers", n);
        same_floats(sd, what, &g1, &r1, 1);
        if (n <= 1000) { /* where test_kernels.py's tolerance holds: its lengths */
            gaussian(a, n, &c->rng);
            gaussian(b, n, &c->rng);
            double want = 0;
            for (int i = 0; i < n; i++) want += (double)a[i] * b[i];
            g1 = vs->dot_f32(a, b, n), r1 = vr->dot_f32(a, b, n);
            snprintf(what, sizeof what, "n=%d, gaussian", n);
            close_floats(sd, what, &g1, &r1, NULL, fmax(1e-5 * fabs(want), 1e-4), 1);
        }

        /* axpy_f32: small integers, then gaussian data; y += a·x */
        for (int pass = 0; pass < 2; pass++) {
            float alpha = pass ? normal(&c->rng) : (float)randint(&c->rng, -4, 4);
            for (int i = 0; i < n; i++) {
                a[i] = pass ? normal(&c->rng) : (float)randint(&c->rng, -4, 4);
                got[i] = ref[i] = pass ? normal(&c->rng) : (float)randint(&c->rng, -4, 4);
                tol[i] = ldexp(fabs((double)alpha * a[i]) + fabs(got[i]), -22);
            }
            vs->axpy_f32(got, alpha, a, n);
            vr->axpy_f32(ref, alpha, a, n);
            snprintf(what, sizeof what, "n=%d, %s", n, pass ? "gaussian" : "small integers");
            if (pass)
                close_floats(sa, what, got, ref, tol, 0, n);
            else
                same_floats(sa, what, got, ref, n);
        }

        /* dot_f16 and axpy_f16 (an f16 KV cache's keys and values): the f32 kernels' tolerances,
         * the f16 operand widened exactly; their own random stream leaves the others' data as it was */
        rng_t r16 = {0x16f16 + (uint64_t)n};
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < n; i++) {
                a[i] = pass ? normal(&r16) : (float)randint(&r16, -4, 4);
                h[i] = pl_f32_to_f16(pass ? normal(&r16) : (float)randint(&r16, -4, 4));
            }
            if (pass && n > 1000) break;
            double want = 0;
            for (int i = 0; i < n; i++) want += (double)a[i] * pl_f16_to_f32(h[i]);
            float g1 = vs->dot_f16(a, h, n), r1 = vr->dot_f16(a, h, n);
            snprintf(what, sizeof what, "n=%d, %s", n, pass ? "gaussian" : "small integers");
            if (pass)
                close_floats(sdh, what, &g1, &r1, NULL, fmax(1e-5 * fabs(want), 1e-4), 1);
            else
                same_floats(sdh, what, &g1, &r1, 1);
        }
        for (int pass = 0; pass < 2; pass++) {
            float alpha = pass ? normal(&r16) : (float)randint(&r16, -4, 4);
            for (int i = 0; i < n; i++) {
                h[i] = pl_f32_to_f16(pass ? normal(&r16) : (float)randint(&r16, -4, 4));
                got[i] = ref[i] = pass ? normal(&r16) : (float)randint(&r16, -4, 4);
                tol[i] = ldexp(fabs((double)alpha * pl_f16_to_f32(h[i])) + fabs(got[i]), -22);
            }
            vs->axpy_f16(got, alpha, h, n);
            vr->axpy_f16(ref, alpha, h, n);
            snprintf(what, sizeof what, "n=%d, %s", n, pass ? "gaussian" : "small integers");
            if (pass)
                close_floats(sah, what, got, ref, tol, 0, n);
            else
                same_floats(sah, what, got, ref, n);
        }

        /* softmax of x·20 (test_kernels.py): rtol 2e-6, atol 1e-9 against float64 */
        gaussian(a, n, &c->rng);
        for (int i = 0; i < n; i++) got[i] = ref[i] = a[i] * 20.0f;
        vs->softmax(got, n);
        vr->softmax(ref, n);
        for (int i = 0; i < n; i++) tol[i] = 2 * (1e-9 + 2e-6 * fabs(ref[i]));
        snprintf(what, sizeof what, "n=%d", n);
        close_floats(ss, what, got, ref, tol, 0, n);

        /* swiglu of gate·8, up (test_kernels.py): rtol 2e-6, atol 1e-7 */
        gaussian(a, n, &c->rng);
        gaussian(b, n, &c->rng);
        for (int i = 0; i < n; i++) got[i] = ref[i] = a[i] * 8.0f;
        vs->swiglu(got, b, n);
        vr->swiglu(ref, b, n);
        for (int i = 0; i < n; i++) tol[i] = 2 * (1e-7 + 2e-6 * fabs(ref[i]));
        close_floats(sw, what, got, ref, tol, 0, n);

        /* geglu and gelu of gate ~ N(0, 3²) (test_ops.py): rtol 1e-5, atol 1e-6 */
        for (int i = 0; i < n; i++) got[i] = ref[i] = a[i] * 3.0f;
        vs->geglu(got, b, n);
        vr->geglu(ref, b, n);
        for (int i = 0; i < n; i++) tol[i] = 2 * (1e-6 + 1e-5 * fabs(ref[i]));
        close_floats(sg, what, got, ref, tol, 0, n);
        for (int i = 0; i < n; i++) got[i] = ref[i] = a[i] * 3.0f;
        vs->gelu(got, n);
        vr->gelu(ref, n);
        for (int i = 0; i < n; i++) tol[i] = 2 * (1e-6 + 1e-5 * fabs(ref[i]));
        close_floats(su, what, got, ref, tol, 0, n);
    }
    free(a);
    free(b);
    free(got);
    free(ref);
    free(h);
    free(tol);
}

/* ---------------------------------------------------------------- pl_vec's multi-query kernels */

/* dot_*_qk and axpy_*_qk (attention's queries that share K/V rows): against the ISA's own
 * dot/axpy called once per (query, key), bit for bit, and against the scalar multi-query kernels
 * with the dot and axpy tolerances (bit for bit on small integers). 5 queries; 35 keys (twice 16
 * or four times 8, and a rest); 150 value rows in ragged ranges that cross PL_QK_ROWS. */
#define MQ_QUERIES 5
#define MQ_KEYS 35
#define MQ_ROWS 150

static void check_vec_qk(ctx_t *c) {
    const pl_vec_kernels *vs = &c->simd->v, *vr = &c->ref->v;
    const int first[MQ_QUERIES] = {0, 3, 70, 64, 149}, end[MQ_QUERIES] = {150, 67, 140, 128, 150};
    const int lens[] = {1, 7, 8, 9, 16, 17, 20, 32, 33, 64, 65, 72, 128, 256};
    int64_t cap = 256;
    float *qf = malloc(MQ_QUERIES * cap * 4), *kf = malloc(MQ_ROWS * cap * 4), *ws = malloc(MQ_QUERIES * MQ_ROWS * 4);
    uint16_t *kh = malloc(MQ_ROWS * cap * 2);
    float *got = malloc(MQ_QUERIES * cap * 4), *own = malloc(MQ_QUERIES * cap * 4), *ref = malloc(MQ_QUERIES * cap * 4);
    double *tol = malloc(MQ_QUERIES * cap * sizeof *tol), *run = malloc(MQ_QUERIES * cap * sizeof *run);
    char what[64];
    for (int f16 = 0; f16 < 2; f16++) {
        stat_t *sd = stat_of("", f16 ? "dot_f16_qk" : "dot_f32_qk", f16 ? vs->dot_f16_qk != vr->dot_f16_qk
                                                                        : vs->dot_f32_qk != vr->dot_f32_qk);
        stat_t *sa = stat_of("", f16 ? "axpy_f16_qk" : "axpy_f32_qk", f16 ? vs->axpy_f16_qk != vr->axpy_f16_qk
                                                                            : vs->axpy_f32_qk != vr->axpy_f32_qk);
        for (int k = 0; k < LEN(lens); k++)
            for (int pass = 0; pass < 2; pass++) {
                int64_t n = lens[k];
                const float *qs[MQ_QUERIES];
                float *ys[MQ_QUERIES], *yo[MQ_QUERIES], *yr[MQ_QUERIES];
                for (int i = 0; i < MQ_QUERIES * n; i++) qf[i] = pass ? normal(&c->rng) : (float)randint(&c->rng, -4, 4);
                for (int i = 0; i < MQ_ROWS * n; i++) {
                    kf[i] = pass ? normal(&c->rng) : (float)randint(&c->rng, -4, 4);
                    kh[i] = pl_f32_to_f16(kf[i]);
                    if (f16) kf[i] = pl_f16_to_f32(kh[i]);
                }
                for (int i = 0; i < MQ_QUERIES; i++) qs[i] = qf + i * n, ys[i] = got + i * n, yo[i] = own + i * n, yr[i] = ref + i * n;
                snprintf(what, sizeof what, "n=%lld, %s", (long long)n, pass ? "gaussian" : "small integers");

                if (f16) {
                    vs->dot_f16_qk(qs, MQ_QUERIES, kh, n, MQ_KEYS, n, got, MQ_KEYS);
                    vr->dot_f16_qk(qs, MQ_QUERIES, kh, n, MQ_KEYS, n, ref, MQ_KEYS);
                } else {
                    vs->dot_f32_qk(qs, MQ_QUERIES, kf, n, MQ_KEYS, n, got, MQ_KEYS);
                    vr->dot_f32_qk(qs, MQ_QUERIES, kf, n, MQ_KEYS, n, ref, MQ_KEYS);
                }
                for (int i = 0; i < MQ_QUERIES; i++)
                    for (int j = 0; j < MQ_KEYS; j++) {
                        own[i * MQ_KEYS + j] = f16 ? vs->dot_f16(qs[i], kh + j * n, n) : vs->dot_f32(qs[i], kf + j * n, n);
                        double want = 0;
                        for (int e = 0; e < n; e++) want += (double)qs[i][e] * kf[j * n + e];
                        tol[i * MQ_KEYS + j] = fmax(1e-5 * fabs(want), 1e-4);
                    }
                same_floats(sd, "against the ISA's single kernel", got, own, MQ_QUERIES * MQ_KEYS);
                if (pass)
                    close_floats(sd, what, got, ref, tol, 0, MQ_QUERIES * MQ_KEYS);
                else
                    same_floats(sd, what, got, ref, MQ_QUERIES * MQ_KEYS);

                for (int i = 0; i < MQ_QUERIES * MQ_ROWS; i++) ws[i] = pass ? uniform(&c->rng) : (float)randint(&c->rng, -2, 2);
                for (int i = 0; i < MQ_QUERIES * n; i++) {
                    got[i] = own[i] = ref[i] = pass ? normal(&c->rng) : (float)randint(&c->rng, -4, 4);
                    run[i] = got[i], tol[i] = 0;
                }
                if (f16) {
                    vs->axpy_f16_qk(ys, MQ_QUERIES, ws, MQ_ROWS, first, end, kh, n, n);
                    vr->axpy_f16_qk(yr, MQ_QUERIES, ws, MQ_ROWS, first, end, kh, n, n);
                } else {
                    vs->axpy_f32_qk(ys, MQ_QUERIES, ws, MQ_ROWS, first, end, kf, n, n);
                    vr->axpy_f32_qk(yr, MQ_QUERIES, ws, MQ_ROWS, first, end, kf, n, n);
                }
                /* each step's tolerance, 2^-22·(|a·x| + |y|), summed over the steps */
                for (int i = 0; i < MQ_QUERIES; i++)
                    for (int j = first[i]; j < end[i]; j++) {
                        float a = ws[i * MQ_ROWS + j];
                        if (f16)
                            vs->axpy_f16(yo[i], a, kh + j * n, n);
                        else
                            vs->axpy_f32(yo[i], a, kf + j * n, n);
                        for (int e = 0; e < n; e++) {
                            double ax = (double)a * kf[j * n + e];
                            tol[i * n + e] += ldexp(fabs(ax) + fabs(run[i * n + e]), -22);
                            run[i * n + e] += ax;
                        }
                    }
                same_floats(sa, "against the ISA's single kernel", got, own, MQ_QUERIES * n);
                if (pass)
                    close_floats(sa, what, got, ref, tol, 0, MQ_QUERIES * n);
                else
                    same_floats(sa, what, got, ref, MQ_QUERIES * n);
            }
    }
    free(qf);
    free(kf);
    free(ws);
    free(kh);
    free(got);
    free(own);
    free(ref);
    free(tol);
    free(run);
}

/* ---------------------------------------------------------------- the scalar digest */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The scalar kernels' outputs that IEEE arithmetic fixes bit for bit (no libm beyond sqrtf, fabsf,
 * roundf, lrintf): conversions, quantizers, dot products. The same on every architecture, or a
 * reference differs between them (a plain char's sign, a multiply-add the compiler contracted, …).
 * With verbose, one digest per kernel as well. */
static uint64_t scalar_digest(const kernel_set *ref, int verbose) {
    rng_t r = {12345};
    uint64_t total = 0xcbf29ce484222325ull;
    const int64_t n = 8 * QK_K;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    uint8_t *q = malloc((size_t)n * 4), *xq = malloc((size_t)n * 4);
#define PART(kernel, data, bytes)                                                                  \
    do {                                                                                           \
        uint64_t h = fnv(0xcbf29ce484222325ull, data, (size_t)(bytes));                            \
        total = fnv(total, &h, 8);                                                                 \
        if (verbose) printf("isa_check: scalar %s.%s digest %016llx\n", t->name, kernel, (unsigned long long)h); \
    } while (0)
    for (int type = 0; type < PL_TYPE_COUNT; type++) {
        if (!ref->has[type]) continue;
        const pl_type_traits *t = &ref->t[type];
        activation_inputs(x, n, &r);
        t->from_f32(x, q, n);
        PART("from_f32", q, pl_row_size(type, n));
        if (t->quantize_weights) {
            t->quantize_weights(x, q, n);
            PART("quantize_weights", q, pl_row_size(type, n));
        }
        t->to_f32(q, y, n);
        PART("to_f32", y, n * 4);
        if (is_quant(type)) {
            random_blocks(type, q, n / t->block_size, SCALES_NORMAL, &r);
            t->to_f32(q, y, n);
            PART("to_f32 (random blocks)", y, n * 4);
        }
        if (t->vec_dot) {
            gaussian(x, n, &r);
            ref->t[t->vec_dot_type].from_f32(x, xq, n);
            float d = t->vec_dot(q, xq, n);
            PART("vec_dot", &d, 4);
        }
    }
    for (int type = 0; type < PL_TYPE_COUNT; type++) {
        if (!pl_packed_type(type)) continue;
        const pl_type_traits *t = &ref->t[type];
        const int64_t rows = 13, cols = 2 * QK_K, nbr = 3; /* 2 groups, the second partial; 3 activation rows */
        int64_t xrow = pl_row_size(t->vec_dot_type, cols);
        float out[3 * 13];
        random_blocks(type, q, rows * cols / t->block_size, SCALES_NORMAL, &r);
        uint8_t *packed = malloc((size_t)pl_packed_bytes(type, rows, cols));
        pl_pack_groups(type, q, rows, cols, packed, 0, 2);
        gaussian(x, nbr * cols, &r);
        ref->t[t->vec_dot_type].from_f32(x, xq, nbr * cols);
        pl_packed_kernel_of(&ref->p, type)(packed, cols / t->block_size, 0, 2, rows, xq, xrow, (int)nbr, out, rows);
        PART("gemm_packed", out, sizeof out);
        free(packed);
    }
#undef PART
    free(x);
    free(y);
    free(q);
    free(xq);
    return total;
}

/* ---------------------------------------------------------------- main */

static int report(void) {
    int own = 0, checks = 0, failed = 0;
    for (int i = 0; i < n_stats; i++) {
        const stat_t *s = &stats[i];
        own += s->own;
        checks += s->checks;
        failed += s->failed;
        printf("  %-7s %-24s %-9s %4d checks", isa_name, s->name, s->own ? "own" : "(scalar)", s->checks);
        if (s->exact == s->checks)
            printf("  bit for bit");
        else if (s->max_diff == 0)
            printf("  every result identical");
        else
            printf("  max |diff| %.2e, %.3f of tolerance%s", s->max_diff, s->max_share,
                   s->exact ? " (the exact ones bit for bit)" : "");
        printf("%s\n", s->failed ? "  FAILED" : "");
    }
    printf("isa_check: %s: %d passed, %d failed (%d of the %d kernels are %s's own, the rest scalar)\n",
           isa_name, checks - failed, failed, own, n_stats, isa_name);
    return failed;
}

int main(int argc, char **argv) {
    int required[4] = {0}, digests = 0;
    for (int i = 1; i < argc; i++) {
        int known = 0;
        if (!strcmp(argv[i], "--digests")) {
            digests = known = 1;
        } else if (!strcmp(argv[i], "--require") && i + 1 < argc) {
            i++;
            for (int isa = PL_ISA_AVX2; isa <= PL_ISA_NEON; isa++)
                if (!strcmp(argv[i], pl_isa_name(isa))) required[isa] = known = 1;
        }
        if (!known) {
            fprintf(stderr, "usage: isa_check [--require avx2|avx512|neon ...] [--digests]\n");
            return 2;
        }
    }
    printf("isa_check: this CPU's best ISA is %s%s%s\n", pl_isa_name(pl_cpu_best_isa()),
           pl_cpu_has_vnni() ? "; AVX-512 VNNI (avx512's packed kernels: the vpdpbusd build)" : "",
           pl_cpu_has_avx_vnni() ? "; AVX-VNNI (avx2's packed kernels: its VEX build)" : "");
    kernel_set scalar, simd;
    if (pl_set_isa(PL_ISA_SCALAR) != PL_ISA_SCALAR) {
        fprintf(stderr, "isa_check: cannot install the scalar kernels\n");
        return 1;
    }
    take_kernels(&scalar);
    int tested = 0, missing = 0;
    for (int isa = PL_ISA_AVX2; isa <= PL_ISA_NEON; isa++) {
        if (pl_set_isa(isa) != isa) {
            if (required[isa]) {
                fprintf(stderr, "isa_check: FAIL %s is required but this build or CPU cannot run it\n",
                        pl_isa_name(isa));
                missing++;
            }
            continue;
        }
        take_kernels(&simd);
        pl_set_isa(PL_ISA_SCALAR);
        isa_name = pl_isa_name(isa);
        n_stats = 0;
        ctx_t c = {&simd, &scalar, {0x5eed0000u + (uint64_t)isa}};
        for (int type = 0; type < PL_TYPE_COUNT; type++) {
            if (!scalar.has[type]) continue;
            if (!simd.has[type]) {
                fprintf(stderr, "isa_check: FAIL %s has no traits for %s\n", isa_name, type_name(&c, type));
                total_failed++;
                continue;
            }
            check_to_f32(&c, type);
            check_from_f32(&c, type, 0);
            check_from_f32(&c, type, 1);
            check_vec_dot(&c, type);
            check_vec_dot_rows(&c, type);
            if (pl_packed_type(type)) {
                check_packed(&c, type);
                check_packed_wide(&c, type);
            }
        }
        check_vec(&c);
        check_vec_qk(&c);
        report();
        tested++;
    }
    if (!tested) printf("isa_check: no SIMD ISA runs here; nothing to compare with the scalar kernels\n");
    printf("isa_check: scalar reference digest %016llx\n", (unsigned long long)scalar_digest(&scalar, digests));
    pl_set_isa(pl_cpu_best_isa());
    if (total_failed || missing) {
        fprintf(stderr, "isa_check: FAILED: %d checks differ beyond tolerance%s\n", total_failed,
                missing ? ", and a required ISA is missing" : "");
        return 1;
    }
    return 0;
}
