/* pool.c — worker threads for pst_pool_run (see pool.h).
 * DESIGN: a generation counter published under one mutex; workers wait for it to move, run
 * their part, and count themselves done; the caller waits for the count. A run is short
 * (one layer's GEMM slice, a fraction of a millisecond), and a futex wake-up on a VM costs
 * tens of microseconds, so both sides first spin on the atomics (with the CPU's pause hint)
 * for the pool's spin time, and only then sleep on the condition variables. The spin is
 * bounded by the clock, not by a count of pauses: a pause takes 10 to 140 cycles depending
 * on the CPU. The mutex still orders every hand-over that ends in a sleep, so no wake-up is
 * lost. */
#include "common/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Pauses between two looks at the clock while spinning (about 1-10 us). */
#define POOL_SPIN_CHECK 64

struct pst_pool {
    int n;                 /* threads including the caller */
    pthread_t *threads;    /* (n - 1) */
    pthread_mutex_t run_mu;/* one run at a time */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    atomic_ulong gen;      /* written under mu; read by spinning workers */
    atomic_int remaining;  /* workers still running the current generation */
    atomic_int stop;
    pst_pool_fn fn;        /* written before gen moves, read after */
    void *arg;
    atomic_long spin_ns;   /* how long either side polls before it sleeps */
};

typedef struct worker_arg {
    pst_pool *p;
    int part;
} worker_arg;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    sched_yield();
#endif
}

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Polls until `done(p)` or the pool's spin time has passed; returns done(p). */
static int spin_until(pst_pool *p, int (*done)(pst_pool *, void *), void *arg)
{
    const long spin = atomic_load_explicit(&p->spin_ns, memory_order_relaxed);
    long end = -1;
    for (;;) {
        for (int i = 0; i < POOL_SPIN_CHECK; i++) {
            if (done(p, arg))
                return 1;
            cpu_relax();
        }
        const long t = now_ns();
        if (end < 0)
            end = t + spin;
        else if (t >= end)
            return done(p, arg);
    }
}

static int gen_moved(pst_pool *p, void *seen)
{
    return atomic_load_explicit(&p->gen, memory_order_acquire) != *(unsigned long *)seen ||
           atomic_load_explicit(&p->stop, memory_order_relaxed);
}

static int all_done(pst_pool *p, void *unused)
{
    (void)unused;
    return atomic_load_explicit(&p->remaining, memory_order_acquire) == 0;
}

static void *worker(void *a)
{
    worker_arg w = *(worker_arg *)a;
    free(a);
    pst_pool *p = w.p;
    unsigned long seen = 0;
    for (;;) {
        spin_until(p, gen_moved, &seen);
        unsigned long g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->go, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            break;
        seen = g;
        p->fn(p->arg, w.part, p->n);
        if (atomic_fetch_sub_explicit(&p->remaining, 1, memory_order_acq_rel) == 1) {
            /* The last one: wake the caller if it went to sleep (it checks under mu). */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

pst_status pst_pool_init(pst_pool **out, int nthreads)
{
    *out = NULL;
    if (nthreads < 1 || nthreads > 1024)
        return pst_error_set(PST_ERR_INVALID, "thread pool: %d threads (example: 2)", nthreads);
    pst_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->threads = calloc((size_t)nthreads, sizeof *p->threads))) {
        free(p);
        return pst_error_set(PST_ERR_NOMEM, "thread pool: out of memory");
    }
    p->n = 1;
    atomic_init(&p->gen, 0);
    atomic_init(&p->remaining, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->spin_ns, PST_POOL_SPIN_NS_DEFAULT);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 1; i < nthreads; i++) {
        worker_arg *w = malloc(sizeof *w);
        if (!w) {
            pst_pool_free(p);
            return pst_error_set(PST_ERR_NOMEM, "thread pool: out of memory");
        }
        *w = (worker_arg){p, i};
        if (pthread_create(&p->threads[i - 1], NULL, worker, w) != 0) {
            free(w);
            pst_pool_free(p);
            return pst_error_set(PST_ERR_IO, "thread pool: cannot start thread %d", i);
        }
        p->n = i + 1;
    }
    *out = p;
    return PST_OK;
}

void pst_pool_free(pst_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n - 1; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->run_mu);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

void pst_pool_set_spin(pst_pool *p, long ns)
{
    if (p)
        atomic_store_explicit(&p->spin_ns, ns > 0 ? ns : 0, memory_order_relaxed);
}

int pst_pool_size(const pst_pool *p)
{
    return p ? p->n : 1;
}

void pst_pool_run(pst_pool *p, pst_pool_fn fn, void *arg)
{
    if (!p || p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->run_mu);
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->remaining, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    if (!spin_until(p, all_done, NULL)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->remaining) > 0)
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->run_mu);
}

void pst_pool_split(size_t n, int part, int nparts, size_t align, size_t *lo, size_t *hi)
{
    size_t chunks = (n + align - 1) / align;
    size_t a = chunks * (size_t)part / (size_t)nparts, b = chunks * (size_t)(part + 1) / (size_t)nparts;
    *lo = a * align < n ? a * align : n;
    *hi = b * align < n ? b * align : n;
}
