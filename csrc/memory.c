/* memory.c — where the core's large blocks come from: cache-line aligned blocks for buffers, one
 * block on huge pages for the weights every step sweeps, and handing freed heap pages back. */
#if defined(__linux__)
#define _GNU_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE, posix_memalign */
#include <sys/mman.h>
#elif !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L /* posix_memalign under -std=c11 */
#endif
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"

#ifdef _WIN32
#include <malloc.h>
void *pl_alloc_aligned(size_t n) { return _aligned_malloc(n ? n : 64, 64); }
void pl_free_aligned(void *p) { _aligned_free(p); }
#else
/* Large blocks come straight from mmap: KV cache pages cost memory only once written. */
void *pl_alloc_aligned(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 64) == 0 ? p : NULL;
}
void pl_free_aligned(void *p) { free(p); }
#endif

#if defined(__linux__)
/* A decode step reads every matrix of the model once, front to back. On 4 KB pages that sweep
 * crosses a page (a TLB miss, a restart of the hardware prefetcher) every 4 KB; on Linux's
 * transparent 2 MB pages, asked for here with madvise (the systems' usual setting, "madvise", gives
 * them to no one who does not ask), 512 times less often. Measured, the same weights on either in
 * one process: SmolLM2 Q4_1 decode 1.04-1.05×, Gemma 3 Q4_K_M 1.04×, SmolLM2 bf16 1.03-1.10×
 * (benchmarks/RESULTS.md). The block is 2 MB aligned and a whole number of 2 MB pages, so every page
 * of it can be huge; where the kernel refuses, its 4 KB pages serve the same. */
#define HUGE_PAGE ((size_t)2 << 20)

static size_t huge_pages_of(size_t n) { return (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE; }

void *pl_alloc_swept(size_t n) {
    size_t size = huge_pages_of(n ? n : 1), span = size + HUGE_PAGE;
    char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    char *start = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (start > p) munmap(p, (size_t)(start - p)); /* the slack either side of the aligned pages */
    if (p + span > start + size) munmap(start + size, (size_t)(p + span - (start + size)));
#ifdef MADV_HUGEPAGE
    madvise(start, size, MADV_HUGEPAGE); /* advice: a kernel without huge pages ignores it */
#endif
    return start;
}

void pl_free_swept(void *p, size_t n) {
    if (p) munmap(p, huge_pages_of(n ? n : 1));
}

int pl_swept_on_huge_pages(void) { return 1; }
#else
void *pl_alloc_swept(size_t n) { return pl_alloc_aligned(n); }
void pl_free_swept(void *p, size_t n) {
    (void)n;
    pl_free_aligned(p);
}

int pl_swept_on_huge_pages(void) { return 0; }
#endif

#if defined(__GLIBC__)
#include <malloc.h>
void pl_trim_heap(void) { malloc_trim(0); }
#else
void pl_trim_heap(void) {}
#endif
