/* pool_check.c — the thread pool under runs of changing thread counts (csrc/threadpool.c).
 *
 * Pools of 1 to 6 threads run 2,000 tasks each, every run on a count drawn at random (1 to the
 * pool's size, or all of it), each task meeting its threads at three barriers and claiming dealt
 * items between them: every thread of the run must take part exactly once, no thread outside it,
 * every item be claimed once, and what a thread wrote before a barrier be seen after it. Built
 * with ThreadSanitizer by .ci/sanitizers; a hang (a lost wake-up) is its timeout's failure.
 *
 *   cc -O1 -g -fsanitize=thread -Icsrc tests/native/pool_check.c csrc/threadpool.c -lpthread
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "pyllm.h"

#define MAX_THREADS 6
#define RUNS 2000
#define ITEMS 97

typedef struct {
    pl_pool *pool;
    int nth;                          /* the count the run was started with */
    atomic_int ran[MAX_THREADS];      /* times each thread took part in this run */
    int wrote[MAX_THREADS];           /* each thread's value before the first barrier */
    atomic_int claimed[MAX_THREADS * ITEMS];
    atomic_int errors;
} run_args;

static void task(void *raw, int ith, int nth) {
    run_args *a = raw;
    if (nth != a->nth || ith < 0 || ith >= nth) atomic_fetch_add(&a->errors, 1);
    atomic_fetch_add(&a->ran[ith], 1);
    a->wrote[ith] = ith * 7 + 1;
    pl_barrier(a->pool);
    for (int t = 0; t < nth; t++) /* written by another thread before the barrier */
        if (a->wrote[t] != t * 7 + 1) atomic_fetch_add(&a->errors, 1);
    /* dealt items: its own range first, then the others' from their backs */
    for (int k = 0; k < nth; k++) {
        int owner = (ith + k) % nth;
        int64_t first, n;
        while ((n = pl_pool_claim(a->pool, owner, ITEMS, 3, owner != ith, &first)) > 0)
            for (int64_t i = first; i < first + n; i++) atomic_fetch_add(&a->claimed[owner * ITEMS + i], 1);
    }
    pl_barrier(a->pool);
    pl_barrier(a->pool);
}

int main(void) {
    unsigned seed = 12345;
    long checks = 0;
    for (int size = 1; size <= MAX_THREADS; size++) {
        pl_pool *pool = pl_pool_create(size);
        if (!pool || pl_pool_size(pool) != size) {
            fprintf(stderr, "pool_check: no pool of %d threads\n", size);
            return 1;
        }
        run_args *a = calloc(1, sizeof *a);
        for (int r = 0; r < RUNS; r++) {
            seed = seed * 1103515245u + 12345u;
            int want = (int)((seed >> 16) % (unsigned)(size + 1)); /* 0: the whole pool */
            int nth = want == 0 ? size : want;
            *a = (run_args){0};
            a->pool = pool;
            a->nth = nth;
            if (want == 0)
                pl_pool_run(pool, task, a);
            else
                pl_pool_run_n(pool, task, a, want);
            for (int t = 0; t < MAX_THREADS; t++) {
                if (atomic_load(&a->ran[t]) != (t < nth)) {
                    fprintf(stderr, "pool_check: %d threads, run %d on %d: thread %d ran %d times\n", size, r, nth,
                            t, atomic_load(&a->ran[t]));
                    return 1;
                }
                for (int i = 0; i < ITEMS; i++)
                    if (atomic_load(&a->claimed[t * ITEMS + i]) != (t < nth)) {
                        fprintf(stderr, "pool_check: %d threads, run %d on %d: item %d of thread %d claimed %d times\n",
                                size, r, nth, i, t, atomic_load(&a->claimed[t * ITEMS + i]));
                        return 1;
                    }
            }
            if (atomic_load(&a->errors)) {
                fprintf(stderr, "pool_check: %d threads, run %d on %d: %d errors\n", size, r, nth,
                        atomic_load(&a->errors));
                return 1;
            }
            checks++;
        }
        pl_pool_set_decode_threads(pool, size + 1); /* outside [1, size]: back to the size */
        if (pl_pool_decode_threads(pool) != size) return 1;
        free(a);
        pl_pool_free(pool);
    }
    printf("pool_check: %ld runs of changing thread counts passed\n", checks);
    return 0;
}
