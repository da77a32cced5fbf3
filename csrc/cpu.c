/* cpu.c — what this CPU (and its OS) can run, and which kernel variants are installed.
 *
 * One wheel serves every machine: nothing is compiled for the build machine's CPU, so the choice is
 * made here, at import, and can be lowered by hand (tests compare every variant with the scalar one).
 */
#include "kernels.h"
#include "packed.h"

#if defined(PL_X86)
#if defined(_MSC_VER)
#include <intrin.h>
static void cpuid(int leaf, int sub, unsigned r[4]) {
    int v[4];
    __cpuidex(v, leaf, sub);
    for (int i = 0; i < 4; i++) r[i] = (unsigned)v[i];
}
static unsigned long long xgetbv0(void) { return _xgetbv(0); }
#else
#include <cpuid.h>
static void cpuid(int leaf, int sub, unsigned r[4]) {
    if (!__get_cpuid_count((unsigned)leaf, (unsigned)sub, &r[0], &r[1], &r[2], &r[3]))
        r[0] = r[1] = r[2] = r[3] = 0;
}
static unsigned long long xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

static int vnni = 0, avx_vnni = 0; /* AVX-512 VNNI and AVX-VNNI, set by detect() */

static int detect(void) {
    unsigned r1[4], r7[4];
    cpuid(0, 0, r1);
    if (r1[0] < 7) return PL_ISA_SCALAR;
    cpuid(1, 0, r1);
    cpuid(7, 0, r7);
    int osxsave = (r1[2] >> 27) & 1;
    if (!osxsave) return PL_ISA_SCALAR;
    /* The OS must save the wide registers on a context switch, or using them corrupts state. */
    unsigned long long xcr0 = xgetbv0();
    int os_avx = (xcr0 & 0x6) == 0x6;
    int os_avx512 = (xcr0 & 0xe6) == 0xe6;
    int fma = (r1[2] >> 12) & 1, avx = (r1[2] >> 28) & 1, f16c = (r1[2] >> 29) & 1;
    int avx2 = (r7[1] >> 5) & 1;
    int avx512 = ((r7[1] >> 16) & 1) && ((r7[1] >> 17) & 1) /* dq */ && ((r7[1] >> 30) & 1) /* bw */ &&
                 ((r7[1] >> 31) & 1) /* vl */;
    if (!(os_avx && avx && avx2 && fma && f16c)) return PL_ISA_SCALAR;
    unsigned r71[4];
    cpuid(7, 1, r71);
    avx_vnni = (r71[0] >> 4) & 1;
    if (!(os_avx512 && avx512)) return PL_ISA_AVX2;
    vnni = (r7[2] >> 11) & 1;
    return PL_ISA_AVX512;
}
#elif defined(PL_ARM64) && defined(__ARM_NEON)
static const int vnni = 0, avx_vnni = 0;
static int detect(void) { return PL_ISA_NEON; }
#else
static const int vnni = 0, avx_vnni = 0;
static int detect(void) { return PL_ISA_SCALAR; }
#endif

static int best_isa = -1;
static int current_isa = PL_ISA_SCALAR;

int pl_cpu_best_isa(void) {
    if (best_isa < 0) best_isa = detect();
    return best_isa;
}

/* What the CPU has decides what may run: AVX2 machines can run scalar, AVX-512 ones AVX2 too. */
static int supported(int isa) {
    int best = pl_cpu_best_isa();
    if (isa == PL_ISA_SCALAR) return 1;
    if (isa == PL_ISA_NEON) return best == PL_ISA_NEON;
    if (isa == PL_ISA_AVX2) return best == PL_ISA_AVX2 || best == PL_ISA_AVX512;
    if (isa == PL_ISA_AVX512) return best == PL_ISA_AVX512;
    return 0;
}

int pl_set_isa(int isa) {
    if (!supported(isa)) isa = PL_ISA_SCALAR;
    pl_install_type_kernels(isa);
    pl_install_quant_kernels(isa);
    pl_install_packed_kernels(isa);
    current_isa = isa;
    return isa;
}

int pl_current_isa(void) { return current_isa; }

int pl_cpu_has_vnni(void) {
    pl_cpu_best_isa();
    return vnni;
}

int pl_cpu_has_avx_vnni(void) {
    pl_cpu_best_isa();
    return avx_vnni;
}

const char *pl_isa_name(int isa) {
    switch (isa) {
    case PL_ISA_AVX2: return "avx2";
    case PL_ISA_AVX512: return "avx512";
    case PL_ISA_NEON: return "neon";
    default: return "scalar";
    }
}
