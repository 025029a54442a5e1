/* sparse.h — a sparse table: hash-keyed embedding rows with per-row optimizer state,
 * admission and eviction (issue 31; the DLRM workload's tables). A table maps u64 keys to
 * rows of `dim` fp32 values; a pserver holds the keys that hash to it
 * (pst_sparse_pserver_of). Pure logic: no networking, no threads of its own, no logging.
 *
 * Not for: the wire, the sync sum of the trainers' rows (the caller adds them in trainer
 * order and pushes the sum once), checkpoint files (sparse_ckpt.h; this gives it what it
 * writes and restores).
 *
 * DESIGN
 * - Stripes. The keys are split over PST_SPARSE_STRIPES stripes by their hash; each stripe
 *   has its own mutex, open-addressing index and rows, so pulls and pushes of different
 *   stripes never wait for each other. Within a stripe every operation is in the order
 *   of its calls: one push applies its keys in the order given.
 * - The index: linear probing over a power-of-two array of entries {key, row, pushes,
 *   last step}, at most 7/10 full, deleted by backward shift (no tombstones). Chosen by
 *   bench/hashtable.c against Debian's uthash and genht (docs/benchmarks.md).
 * - Rows: values then optimizer state (SGD none, Adagrad the sum of squares, Adam m and
 *   v), end to end in slabs of PST_SPARSE_SLAB_ROWS rows. A stripe's rows are dense:
 *   removing one moves its last row into the hole, so its slabs are exactly the ones its
 *   rows need and memory is counted, and freed, by row (a slab when its last row goes).
 * - A key that has no row: pulls get the initializer's value, N(0, init_std^2) drawn
 *   from (seed, key), without creating anything, and the row starts from exactly that
 *   value when it is created. Before admission a key has an index entry without a row
 *   that counts its pushes; the push that reaches admit_count creates the row and is
 *   applied to it; the pushes before it are refused (counted, not applied).
 * - Eviction by age is exact and lazy: a key whose last push is more than evict_after
 *   steps before the step of the call is treated as absent (the initializer again, its
 *   pushes counted from zero) and its entry is removed then; pst_sparse_sweep reclaims
 *   the ones nobody asks for, and where it runs changes no value. A row budget
 *   (max_rows): a stripe past its share drops its least recently pushed rows (ties: the
 *   smaller key first) down to 7/8 of its share, at once.
 * - Optimizers as PyTorch's sparse ones, to the bit where its BLAS fuses a*x + y (the
 *   axpy of a sparse add): Adagrad (acc += g*g; p = fma(-lr, g / (sqrt(acc) + eps), p))
 *   and SparseAdam (m += (g - m)(1 - b1); v += (g*g - v)(1 - b2); p += -(lr sqrt(1 - b2^t)
 *   / (1 - b1^t)) * (m / (sqrt(v) + eps)), t = the step + 1: lazy moments, the table's
 *   step for the bias correction); SGD p = fma(-lr, g, p). */
#ifndef PST_PSERVER_SPARSE_H
#define PST_PSERVER_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/rng.h"

#define PST_SPARSE_STRIPES 16
#define PST_SPARSE_SLAB_ROWS 1024
#define PST_SPARSE_MAX_DIM 4096
#define PST_SPARSE_MAX_KEYS (1u << 22) /* keys in one pull or push */
#define PST_SPARSE_NAME_MAX 64

typedef enum pst_sparse_optim {
    PST_SPARSE_SGD = 0,
    PST_SPARSE_ADAGRAD,
    PST_SPARSE_ADAM,
    PST_SPARSE_OPTIM_COUNT_
} pst_sparse_optim;

typedef struct pst_sparse_config {
    char name[PST_SPARSE_NAME_MAX]; /* not empty */
    int dim;                        /* values per row, 1..PST_SPARSE_MAX_DIM */
    pst_sparse_optim optim;
    /* doubles, as PyTorch's Python numbers: the scalars an update uses are worked out
     * from them in double and rounded once (1 - beta1, the Adam step size) */
    double lr;                      /* > 0 */
    double eps;                     /* Adagrad, Adam: > 0 */
    double beta1, beta2;            /* Adam: in [0, 1) */
    float init_std;                 /* rows start N(0, init_std^2); 0: zeros */
    uint64_t seed;                  /* of the initializer */
    uint32_t admit_count;           /* the push that creates a row (0 or 1: the first) */
    long evict_after;               /* steps without a push before a row goes (0: never) */
    size_t max_rows;                /* rows at most, over all stripes (0: no limit; else at
                                     * least PST_SPARSE_STRIPES: each stripe keeps max_rows /
                                     * PST_SPARSE_STRIPES) */
} pst_sparse_config;

typedef struct pst_sparse_stats {
    size_t rows;                    /* rows now (keys waiting for admission not counted) */
    size_t pending;                 /* keys waiting for admission */
    size_t bytes;                   /* slabs, index and row keys: what the table allocated */
    uint64_t created, evicted, refused; /* rows made; rows removed (age or budget); pushed
                                     * keys not applied (before admission) */
    size_t stripe_rows[PST_SPARSE_STRIPES];
} pst_sparse_stats;

typedef struct pst_sparse_table pst_sparse_table;

/* Defaults: dim 16, Adagrad, lr 0.05, eps 1e-10, betas 0.9/0.999, init_std 0.01, seed 0,
 * admit on the first push, no eviction, no budget. The name is left empty. */
void pst_sparse_defaults(pst_sparse_config *cfg);
/* PST_OK, or PST_ERR_INVALID with a detail naming the setting and a good value. */
pst_status pst_sparse_check(const pst_sparse_config *cfg);
/* "sgd", "adagrad", "adam" <-> the enum; parse returns 0, or -1 (and leaves *out). */
const char *pst_sparse_optim_name(pst_sparse_optim o);
int pst_sparse_optim_parse(const char *s, pst_sparse_optim *out);

/* A new, empty table (cfg copied). Errors: those of pst_sparse_check, PST_ERR_NOMEM. */
pst_status pst_sparse_create(pst_sparse_table **out, const pst_sparse_config *cfg);
/* Accepts NULL. */
void pst_sparse_free(pst_sparse_table *t);
const pst_sparse_config *pst_sparse_config_of(const pst_sparse_table *t);

/* rows (n, dim) = the rows of keys[0..n) as of `step` (absent or expired keys: the
 * initializer's value). Changes no row. Errors: PST_ERR_INVALID (NULL with n > 0, n over
 * PST_SPARSE_MAX_KEYS). Thread safe. */
pst_status pst_sparse_pull(pst_sparse_table *t, const uint64_t *keys, size_t n, long step,
                           float *rows);
/* Applies grads (n, dim) to the rows of keys[0..n), in order, at `step` (>= 0): each key's
 * pushes are counted and its last step set; an admitted key's row (created from the
 * initializer by the push that admits it) gets one optimizer update. Nothing is applied
 * when an argument is bad: PST_ERR_INVALID (NULL with n > 0, n over PST_SPARSE_MAX_KEYS,
 * a negative step, a value that is NaN or infinite: the detail names the key);
 * PST_ERR_NOMEM leaves the keys before the one that failed applied (and that one too when
 * the row budget's trim ran out of memory after its update). Thread safe. */
pst_status pst_sparse_push(pst_sparse_table *t, const uint64_t *keys, size_t n,
                           const float *grads, long step);
/* Removes the entries that have expired by `step` (evict_after), and frees their memory.
 * Values are the same with or without it. Thread safe. */
void pst_sparse_sweep(pst_sparse_table *t, long step);
void pst_sparse_stats_of(pst_sparse_table *t, pst_sparse_stats *s);
/* Calls fn for every row (key, values (dim), state (dim * state floats), pushes, last
 * step), stripe by stripe, under each stripe's lock (fn must not call the table). */
typedef void (*pst_sparse_row_fn)(void *arg, uint64_t key, const float *values,
                                  const float *state, uint32_t pushes, long last);
void pst_sparse_foreach(pst_sparse_table *t, pst_sparse_row_fn fn, void *arg);
/* The table's state as one number that does not depend on where its rows live: the sum
 * (mod 2^64) over its rows of FNV-1a(key, values, optimizer state). The shards of a table
 * on several pservers add up to the hash of the one table holding all their rows. */
uint64_t pst_sparse_hash(pst_sparse_table *t);
/* Floats of optimizer state per value (0, 1 or 2). */
int pst_sparse_state_floats(pst_sparse_optim o);

/* Checkpoints (sparse_ckpt.h writes and reads the files). */
/* Calls fn for every entry whose last push is at or after step `since` (LONG_MIN: all),
 * rows and keys waiting for admission alike (values and state NULL for those), stripe by
 * stripe under each stripe's lock (fn must not call the table). */
void pst_sparse_foreach_entry(pst_sparse_table *t, long since, pst_sparse_row_fn fn, void *arg);
/* on: every key evicted from now on (age, the row budget) is logged, for the tombstones of
 * the next delta checkpoint. Off by default. */
void pst_sparse_log_removals(pst_sparse_table *t, int on);
/* The keys logged since the last call (*keys malloc'ed, *n of them; the log starts again).
 * PST_ERR_STATE when a key could not be logged (out of memory then): the next checkpoint
 * must be full. PST_ERR_NOMEM. */
pst_status pst_sparse_take_removed(pst_sparse_table *t, uint64_t **keys, size_t *n);
/* Puts key's entry as a checkpoint holds it, replacing one of that key: row (values then
 * optimizer state, dim * (1 + state floats)) or NULL for a key waiting for admission, its
 * pushes and last step. Counts nothing. Errors: PST_ERR_NOMEM. Thread safe. */
pst_status pst_sparse_restore(pst_sparse_table *t, uint64_t key, const float *row,
                              uint32_t pushes, long last);
/* Removes key's entry, if any (a checkpoint's tombstone). Counts nothing. */
void pst_sparse_restore_remove(pst_sparse_table *t, uint64_t key);
/* Sets the counters of pst_sparse_stats (rows created, evicted, pushes refused). */
void pst_sparse_set_counters(pst_sparse_table *t, uint64_t created, uint64_t evicted,
                             uint64_t refused);

/* The 64-bit mix of a key (splitmix64's finalizer): stripes, index slots, pservers. */
static inline uint64_t pst_sparse_mix(uint64_t k)
{
    return pst_rng_mix(k);
}

/* Whether a row last pushed at `last` has expired by `step` (evict_after): then it is
 * absent, whether or not a sweep has removed it yet. */
static inline int pst_sparse_expired(const pst_sparse_config *c, long last, long step)
{
    return c->evict_after > 0 && step - last > c->evict_after;
}

/* The pserver (of n) that holds `key`. */
static inline int pst_sparse_pserver_of(uint64_t key, int n)
{
    return (int)(((pst_sparse_mix(key) >> 32) * (uint64_t)n) >> 32);
}

#endif /* PST_PSERVER_SPARSE_H */
