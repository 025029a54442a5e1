/* pool.h — a fixed set of worker threads for splitting one loop across cores.
 *
 * pst_pool_run(pool, fn, arg) calls fn(arg, part, nparts) once for every part in
 * [0, nparts), nparts = the pool's thread count: the caller runs part 0, the workers the
 * rest, and it returns when all are done. A CPU device's team: its layers' GEMM slices
 * (each a single-threaded OpenBLAS call) and the optimizer's elementwise pass. Between runs
 * workers spin for the pool's spin time (pst_pool_set_spin; 50 us unless set), then sleep
 * on a condition variable; nothing is allocated per run. One run at a time per pool (runs from several threads, e.g. the
 * compute and the send stream, are serialized by a lock, so they never oversubscribe the
 * cores). */
#ifndef PST_POOL_H
#define PST_POOL_H

#include <stddef.h>

#include "common/error.h"

typedef struct pst_pool pst_pool;
typedef void (*pst_pool_fn)(void *arg, int part, int nparts);

/* nthreads >= 1 (1: no workers, fn runs inline). Errors: PST_ERR_INVALID, PST_ERR_NOMEM,
 * PST_ERR_IO (thread creation). */
pst_status pst_pool_init(pst_pool **out, int nthreads);
void pst_pool_free(pst_pool *p); /* joins the workers; accepts NULL */
/* How long a worker polls for the next run (and the caller for the workers) before it
 * sleeps: long enough to cover the gaps between a step's runs saves a futex wake-up per run,
 * but the polling takes the core from any other thread that wants it. Thread safe. */
#define PST_POOL_SPIN_NS_DEFAULT 50000L
void pst_pool_set_spin(pst_pool *p, long ns);
int pst_pool_size(const pst_pool *p);
void pst_pool_run(pst_pool *p, pst_pool_fn fn, void *arg);
/* The range [*lo, *hi) of part `part` of `nparts` over n items, cut at multiples of
 * `align` items so parts never share a cache line of the arrays they write. */
void pst_pool_split(size_t n, int part, int nparts, size_t align, size_t *lo, size_t *hi);

#endif /* PST_POOL_H */
