/* packed_avxvnni.c — the packed GEMM kernels (packed.h) for x86-64 with AVX-VNNI: packed_vnni.c's
 * vpdpbusd build in its VEX form, for the CPUs that have it without AVX-512 (Intel's client cores
 * from Alder Lake on). The same bits as the AVX2 build and the scalar reference. A compiler that
 * predates AVX-VNNI builds none: the AVX2 kernels serve instead.
 */
#include "packed.h"

/* The compiler knows AVX-VNNI: GCC and clang ship its header, Visual Studio 2022 its intrinsics. */
#if defined(PL_X86) && defined(__has_include) && !defined(_MSC_VER)
#if __has_include(<avxvnniintrin.h>)
#define HAVE_AVXVNNI 1
#endif
#elif defined(PL_X86) && defined(_MSC_VER) && _MSC_VER >= 1930
#define HAVE_AVXVNNI 1
#endif

#ifdef HAVE_AVXVNNI
#define PX_TARGET PL_TARGET("avxvnni,avx2,fma,f16c")
#define PX_SUFFIX _avxvnni
#define PX_VNNI 2
#include "packed_x86.h"
int pl_packed_avxvnni_compiled(void) { return 1; }
#else
int pl_install_packed_avxvnni(void) { return 0; }
int pl_packed_avxvnni_compiled(void) { return 0; }
#endif
