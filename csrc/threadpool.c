/* threadpool.c — persistent workers and a cheap barrier (pthreads, or Win32 on Windows).
 *
 * A forward pass is one pool_run: every thread walks the same layer loop and meets the others at a
 * barrier between steps. Waiting threads spin briefly (a decode step's phases are microseconds
 * apart), then sleep on a condition variable so they leave the cores to BLAS during prefill.
 *
 * A run may take part of the pool (pl_pool_run_n: a decode step, whose fastest thread count can be
 * below the machine's): the threads past its count sit it out asleep, parked until a run wants
 * them, so they neither join its barriers nor spin beside it. The words every barrier touches lie
 * on cache lines of their own: arrivals count on one line while the waiters read another.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels.h"

#ifdef _WIN32
#include <windows.h>
typedef HANDLE pl_thread;
typedef SRWLOCK pl_mutex;
typedef CONDITION_VARIABLE pl_cond;
#define mutex_init(m) InitializeSRWLock(m)
#define mutex_destroy(m) ((void)(m))
#define mutex_lock(m) AcquireSRWLockExclusive(m)
#define mutex_unlock(m) ReleaseSRWLockExclusive(m)
#define cond_init(c) InitializeConditionVariable(c)
#define cond_destroy(c) ((void)(c))
#define cond_wait(c, m) SleepConditionVariableSRW(c, m, INFINITE, 0)
#define cond_broadcast(c) WakeAllConditionVariable(c)
#else
#include <pthread.h>
typedef pthread_t pl_thread;
typedef pthread_mutex_t pl_mutex;
typedef pthread_cond_t pl_cond;
#define mutex_init(m) pthread_mutex_init(m, NULL)
#define mutex_destroy(m) pthread_mutex_destroy(m)
#define mutex_lock(m) pthread_mutex_lock(m)
#define mutex_unlock(m) pthread_mutex_unlock(m)
#define cond_init(c) pthread_cond_init(c, NULL)
#define cond_destroy(c) pthread_cond_destroy(c)
#define cond_wait(c, m) pthread_cond_wait(c, m)
#define cond_broadcast(c) pthread_cond_broadcast(c)
#endif

#if defined(PL_X86)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(PL_ARM64) && !defined(_MSC_VER)
#define cpu_relax() __asm__ volatile("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* About 0.1–0.5 ms of spinning before sleeping: longer than a decode step's phases, far shorter
 * than an sgemm call during prefill. */
#define SPIN_ITERATIONS 4096

typedef struct {
    pl_pool *pool;
    int ith;
} worker_arg;

typedef struct {
    atomic_llong word;
    char pad[64 - sizeof(atomic_llong)];
} claim_line;

#define LINE_ALIGNED _Alignas(64)

/* A run's ticket: its number above, its thread count in the low TICKET_BITS, one word so that a
 * worker reads the pair a run was started with. */
#define TICKET_BITS 16
#define TICKET_COUNT(t) ((int)((t) & ((1LL << TICKET_BITS) - 1)))

struct pl_pool {
    int n_threads;
    int active;          /* the threads of the current run (its ticket's count) */
    int decode;          /* the threads of a decode call (pl_pool_set_decode_threads) */
    pl_thread *threads;  /* (n_threads - 1) workers; the caller is thread 0 */
    worker_arg *args;    /* (n_threads - 1) */
    pl_task_fn fn;
    void *arg;
    atomic_int stop;
    atomic_int sleepers; /* threads blocked on wake */
    atomic_int roster;   /* the thread count of the latest run: a parked thread below it rejoins */
    claim_line *claims;  /* 2 × n_threads, a cache line each: slot phase & 1's (pl_pool_claim) */
    void *claims_block;  /* what was allocated for them */
    pl_mutex lock;
    pl_cond wake;        /* a new ticket, or a barrier opened */
    pl_cond rejoin;      /* the roster grew */
    LINE_ALIGNED atomic_llong ticket; /* the current run's (bumped once per pool_run) */
    LINE_ALIGNED atomic_int arrived;  /* threads at the current barrier */
    LINE_ALIGNED atomic_int phase;    /* bumped when a barrier opens */
    char pad[64 - sizeof(atomic_int)];
};

/* The claims on one thread's range in a dealt phase: items taken from its front (the low 32 bits)
 * and from its back (the high ones), one word so that two claims never take the same item. */
#define CLAIM_BITS 32
#define CLAIM_MASK ((1LL << CLAIM_BITS) - 1)

static atomic_llong *claims_of(pl_pool *p, int slot, int owner) {
    return &p->claims[slot * p->n_threads + owner].word;
}

/* Every thread's claims of the phase slot afresh. */
static void reset_claims(pl_pool *p, int slot) {
    for (int t = 0; t < p->n_threads; t++) atomic_store_explicit(claims_of(p, slot, t), 0, memory_order_relaxed);
}

/* Waits until *word differs from old. */
static void wait_change(pl_pool *p, atomic_int *word, int old) {
    for (int i = 0; i < SPIN_ITERATIONS; i++) {
        if (atomic_load_explicit(word, memory_order_acquire) != old) return;
        cpu_relax();
    }
    mutex_lock(&p->lock);
    /* seq_cst pairs with notify(): either it sees a sleeper, or this load sees its store. */
    atomic_fetch_add(&p->sleepers, 1);
    while (atomic_load(word) == old) cond_wait(&p->wake, &p->lock);
    atomic_fetch_sub(&p->sleepers, 1);
    mutex_unlock(&p->lock);
}

/* Waits for a ticket other than old; returns it. */
static long long wait_ticket(pl_pool *p, long long old) {
    long long t;
    for (int i = 0; i < SPIN_ITERATIONS; i++) {
        if ((t = atomic_load_explicit(&p->ticket, memory_order_acquire)) != old) return t;
        cpu_relax();
    }
    mutex_lock(&p->lock);
    atomic_fetch_add(&p->sleepers, 1);
    while ((t = atomic_load(&p->ticket)) == old) cond_wait(&p->wake, &p->lock);
    atomic_fetch_sub(&p->sleepers, 1);
    mutex_unlock(&p->lock);
    return t;
}

/* Thread ith sleeps until a run wants it (or the pool stops). */
static void park(pl_pool *p, int ith) {
    mutex_lock(&p->lock);
    while (atomic_load(&p->roster) <= ith && !atomic_load(&p->stop)) cond_wait(&p->rejoin, &p->lock);
    mutex_unlock(&p->lock);
}

static void notify(pl_pool *p) {
    if (atomic_load(&p->sleepers) == 0) return;
    mutex_lock(&p->lock);
    cond_broadcast(&p->wake);
    mutex_unlock(&p->lock);
}

/* The last thread to arrive closes phase P and opens P + 1. Every claim of P ended before this
 * barrier, so P's claims are reset here for P + 2 (P + 1 claims in the other slot, reset when P
 * opened): a dealt matmul needs no barrier of its own before its first claim. */
void pl_barrier(pl_pool *p) {
    /* read before arriving: once the last thread arrives, the caller may start a run of another count */
    const int nth = p->active;
    int phase = atomic_load(&p->phase);
    if (nth == 1) {
        reset_claims(p, phase & 1);
        atomic_fetch_add_explicit(&p->phase, 1, memory_order_relaxed);
        return;
    }
    if (atomic_fetch_add(&p->arrived, 1) == nth - 1) {
        atomic_store(&p->arrived, 0);
        reset_claims(p, phase & 1); /* published by the phase */
        atomic_fetch_add(&p->phase, 1);
        notify(p);
    } else {
        wait_change(p, &p->phase, phase);
    }
}

#ifdef _WIN32
static DWORD WINAPI worker_main(LPVOID raw)
#else
static void *worker_main(void *raw)
#endif
{
    worker_arg *w = raw;
    pl_pool *p = w->pool;
    long long seen = 0;
    for (;;) {
        seen = wait_ticket(p, seen);
        if (atomic_load(&p->stop)) break;
        const int nth = TICKET_COUNT(seen);
        if (w->ith >= nth) { /* not in this run: fn and arg may already be the next one's */
            park(p, w->ith);
            continue;
        }
        /* a run this thread takes part in cannot end, nor fn and arg change, before it arrives */
        p->fn(p->arg, w->ith, nth);
        pl_barrier(p);
    }
    return 0;
}

pl_pool *pl_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    pl_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = p->active = p->decode = n_threads;
    atomic_store(&p->roster, n_threads);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->args = calloc((size_t)n_threads, sizeof *p->args);
    /* the claims on lines of their own: an owner claims its range often, a thief rarely */
    p->claims_block = calloc((size_t)2 * n_threads + 1, sizeof(claim_line));
    if (!p->threads || !p->args || !p->claims_block) {
        free(p->threads);
        free(p->args);
        free(p->claims_block);
        free(p);
        return NULL;
    }
    p->claims = (claim_line *)(((uintptr_t)p->claims_block + 63) / 64 * 64);
    mutex_init(&p->lock);
    cond_init(&p->wake);
    cond_init(&p->rejoin);
    for (int i = 1; i < n_threads; i++) {
        p->args[i - 1] = (worker_arg){p, i};
#ifdef _WIN32
        p->threads[i - 1] = CreateThread(NULL, 0, worker_main, &p->args[i - 1], 0, NULL);
        int failed = p->threads[i - 1] == NULL;
#else
        int failed = pthread_create(&p->threads[i - 1], NULL, worker_main, &p->args[i - 1]) != 0;
#endif
        if (failed) { /* run with the threads we got */
            p->n_threads = p->active = p->decode = i;
            atomic_store(&p->roster, i);
            break;
        }
    }
    return p;
}

void pl_pool_free(pl_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->ticket, 1LL << TICKET_BITS);
    mutex_lock(&p->lock);
    cond_broadcast(&p->wake);
    cond_broadcast(&p->rejoin);
    mutex_unlock(&p->lock);
    for (int i = 1; i < p->n_threads; i++) {
#ifdef _WIN32
        WaitForSingleObject(p->threads[i - 1], INFINITE);
        CloseHandle(p->threads[i - 1]);
#else
        pthread_join(p->threads[i - 1], NULL);
#endif
    }
    cond_destroy(&p->wake);
    cond_destroy(&p->rejoin);
    mutex_destroy(&p->lock);
    free(p->threads);
    free(p->args);
    free(p->claims_block);
    free(p);
}

int pl_pool_size(const pl_pool *p) { return p->n_threads; }

void pl_pool_set_decode_threads(pl_pool *p, int nth) { p->decode = nth >= 1 && nth <= p->n_threads ? nth : p->n_threads; }

int pl_pool_decode_threads(const pl_pool *p) { return p->decode; }

int64_t pl_pool_claim(pl_pool *p, int owner, int64_t size, int64_t least, int from_back, int64_t *first) {
    /* The phase cannot move while this thread is between barriers. */
    int phase = atomic_load_explicit(&p->phase, memory_order_relaxed);
    atomic_llong *word = claims_of(p, phase & 1, owner);
    long long seen = atomic_load_explicit(word, memory_order_relaxed);
    for (;;) {
        const int64_t front = seen & CLAIM_MASK, back = (int64_t)((unsigned long long)seen >> CLAIM_BITS);
        const int64_t left = size - front - back;
        if (left <= 0) return 0;
        int64_t take = p->active == 1 ? left : (left + 1) / 2;
        if (take < least) take = least;
        if (take > left) take = left;
        long long next = from_back ? seen + (long long)((unsigned long long)take << CLAIM_BITS) : seen + take;
        /* relaxed: what the claimed items compute is published by the barrier that ends the phase */
        if (atomic_compare_exchange_weak_explicit(word, &seen, next, memory_order_relaxed, memory_order_relaxed)) {
            *first = from_back ? size - back - take : front;
            return take;
        }
    }
}

void pl_pool_run(pl_pool *p, pl_task_fn fn, void *arg) { pl_pool_run_n(p, fn, arg, p->n_threads); }

void pl_pool_run_n(pl_pool *p, pl_task_fn fn, void *arg, int nth) {
    if (nth < 1 || nth > p->n_threads) nth = p->n_threads;
    p->active = nth; /* the workers read it after the ticket, the barrier after their fn */
    if (nth == 1) {  /* the workers wait on the ticket as they were, for a run that wants them */
        fn(arg, 0, 1);
        pl_barrier(p); /* the next run's takes start afresh */
        return;
    }
    p->fn = fn;
    p->arg = arg;
    if (nth > atomic_load(&p->roster)) { /* wake the parked threads this run wants */
        mutex_lock(&p->lock);
        atomic_store(&p->roster, nth);
        cond_broadcast(&p->rejoin);
        mutex_unlock(&p->lock);
    } else {
        atomic_store(&p->roster, nth);
    }
    long long next = ((atomic_load(&p->ticket) >> TICKET_BITS) + 1) << TICKET_BITS | nth;
    atomic_store(&p->ticket, next);
    notify(p);
    fn(arg, 0, nth);
    pl_barrier(p);
}
