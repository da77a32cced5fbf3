/* packed_vnni.c — the packed GEMM kernels (packed.h) for x86-64 with AVX-512 VNNI: packed_x86.h's
 * body on the same 32-byte registers (AVX-512 VL), its u8·s8 inner products through vpdpbusd, which
 * sums 4 products into an i32 lane in one instruction where AVX2 needs maddubs, then an add in i16
 * and a widening step (madd or shifts) to i32. The integer sums are exact either way: the same bits
 * as the AVX2 build and the scalar reference. With the 32 registers of AVX-512 the tiles take 8
 * activation rows (TILE_ROWS), keep two i32 chains of vpdpbusd a row, and read each activation dword
 * through vpdpbusd's own broadcast (dot_bcast_add; packed_x86.h).
 */
#include "packed.h"

#if defined(PL_X86) && (defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER))
#define PX_TARGET PL_TARGET("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#define PX_SUFFIX _vnni
#define PX_VNNI 1
#include "packed_x86.h"
#else
int pl_install_packed_vnni(void) { return 0; }
#endif
