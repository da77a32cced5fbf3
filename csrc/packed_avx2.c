/* packed_avx2.c — the packed GEMM kernels (packed.h) for x86-64 with AVX2 (+FMA, F16C): the body in
 * packed_x86.h, its inner products through maddubs.
 *
 * An AVX-512 machine runs these kernels too, or with VNNI their vpdpbusd build (packed_vnni.c). The
 * float order would be the same from 64-byte registers, but the layout's unit is a 32-byte chunk: a
 * wider register would pair chunks of two groups or blocks, with more shuffles per product (as
 * quants_avx512.c measured for blocks of 32).
 */
#include "packed.h"

#if defined(PL_X86) && (defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER))
#define PX_TARGET PL_TARGET_AVX2
#define PX_SUFFIX _avx2
#define PX_VNNI 0
#include "packed_x86.h"
#else
int pl_install_packed_avx2(void) { return 0; }
#endif
