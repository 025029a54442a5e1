/* store.c — the pserver's block store (see store.h for the contract and the update rule).
 *
 * DESIGN. The store is an array of blocks plus a table from global block id to index,
 * sorted by id and searched by bisection; both are fixed after init and read without a
 * lock. Each block owns one allocation laid out as
 *   values (length) | state (nstate, length) | recv (nrecv, length)
 * with nrecv = num_trainers in sync mode (trainer t's gradient for the current step is row
 * t) and 1 in async mode (scratch for the gradient being applied). A bf16 push is kept as
 * it came, in the first half of its row (row_bf16), and widened tile by tile in the update:
 * the same f32 values (the widening is exact) summed in the same order, with half the bytes
 * written and read. A push is not copied at all where it can be read again where it came
 * (row_src): the one that makes the update, and, with the config's keep_push, the sync
 * pushes before it (the pserver keeps their gRPC slices until the step's update); recv is
 * then never touched, and takes no memory. The block's mutex guards
 * everything else in the block: version, the per-trainer flags, the waiter list and the
 * values (a pull's fn reads them under it). Blocks are aligned to a cache line so the locks
 * of neighbouring blocks do not share one.
 *
 * With a low-precision dtype (lowp) a block has one more allocation, lowp (length elements of
 * 2 bytes), guarded by the same lock. The cast that refreshes it runs in the same pool parts
 * as the optimizer, each part casting the slice it has just updated while it is in cache
 * (pst_cast is elementwise, so the split changes no bit). The count of elements cast is the
 * store's only state shared between blocks: an atomic, added to once per update. */
#include "pserver/store.h"

#include "common/hash.h"
#include "common/clock.h"
#include "common/memory.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/pool.h"

#define PS_CACHE_LINE 64

/* A row read from where its push has it (its payload), through its fill, instead of from
 * the store's buffer: the push that makes the update, and (sync, with the config's
 * keep_push) the pushes kept before it, are not copied first. Neither fill: it is in recv. */
typedef struct row_src {
    ps_fill_fn fill;      /* f32, or */
    ps_raw_fill_fn raw;   /* bf16 */
    void *arg;
    int kept;             /* arg came from keep_push: release_push it after the update */
} row_src;

typedef struct ps_block {
    _Alignas(PS_CACHE_LINE) pthread_mutex_t mu;
    int mu_ok;             /* mu was initialized (free of a half-built store) */
    uint32_t id;
    uint64_t offset;
    uint64_t length;
    int64_t version;       /* updates applied */
    float *values;         /* (length) fp32 master values (in mem, or the caller's) */
    float *mem;            /* what the store allocated: [values,] state, recv */
    float *state;          /* (nstate, length) optimizer state, NULL for SGD */
    float *recv;           /* sync: (num_trainers, length); async: (length) */
    void *lowp;            /* (length) of the store's lowp: pst_cast(values); NULL for f32 */
    int lowp_own;          /* lowp was allocated by the store (not the config's lowp_at) */
    uint8_t *pushed;       /* sync: (num_trainers) pushed step == version already */
    uint8_t *row_bf16;     /* (nrecv) recv row r holds bf16 (in its first half), not f32 */
    row_src *sources;      /* sync, more than one trainer: (num_trainers) the pushes of
                            * this step read where they came (kept ones), else zeros */
    int npushed;           /* sync: how many flags are set */
    int64_t *last_step;    /* async: (num_trainers) last step applied, -1 for none */
    ps_pull_waiter *head;  /* queued pulls, FIFO */
    ps_pull_waiter *tail;
    pst_status closed;     /* != PST_OK once ps_store_cancel_waiters has run */
    uint64_t shard_off;    /* first element in the shard (blocks in config order) */
    _Atomic uint64_t slice_bad; /* ps_store_update_slice: the first non-finite element
                                 * seen this step, (index + 1) << 2 | nonfinite_kind; 0:
                                 * none. One word, so its index and kind stay together */
} ps_block;

typedef struct ps_block_index {
    uint32_t id;
    int index;
} ps_block_index;

struct ps_store {
    pst_mode mode;
    int num_trainers;
    int nstate;            /* pst_optim_state_floats(optim.kind) */
    pst_optim_config optim;
    struct pst_pool *pool; /* may be NULL: updates on the pushing thread alone */
    pst_dtype lowp;        /* f16/bf16: blocks keep a copy in it; f32: none */
    _Atomic uint64_t casts; /* elements cast into the copies by updates */
    int nblocks;
    ps_block *blocks;      /* (nblocks) in the configured order */
    ps_block_index *by_id; /* (nblocks) sorted by id */
    uint64_t total_length;
    void *(*keep_push)(void *); /* ps_store_config's: NULL copies every push */
    void (*release_push)(void *);
    /* checkpoints (ps_store_config's snapshot) */
    void (*on_update)(void *, double);
    void *on_update_arg;
    int64_t snap_every;
    void (*snap_fn)(void *, int64_t, const float *, const float *);
    void *snap_arg;
    float *snap_values, *snap_state; /* (total_length), (nstate x total_length) */
    pthread_mutex_t snap_mu;
    int snap_mu_ok;
    int snap_count;        /* blocks copied for snap_version */
    int64_t snap_version;
};

/* ---- helpers ---- */

static int cmp_index_id(const void *a, const void *b)
{
    uint32_t x = ((const ps_block_index *)a)->id, y = ((const ps_block_index *)b)->id;
    return (x > y) - (x < y);
}

static int cmp_spec_offset(const void *a, const void *b)
{
    uint64_t x = (*(const ps_block_spec *const *)a)->offset;
    uint64_t y = (*(const ps_block_spec *const *)b)->offset;
    return (x > y) - (x < y);
}

static ps_block *find_block(const ps_store *st, uint32_t id)
{
    int lo = 0, hi = st->nblocks;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (st->by_id[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < st->nblocks && st->by_id[lo].id == id)
        return &st->blocks[st->by_id[lo].index];
    return NULL;
}

#define FILL_PIECE 16384 /* floats (64 KiB) a push is filled and checked in */

/* Index of the first NaN or infinity in g[0..n), or n when all are finite. The test is
 * bit arithmetic that vectorizes: adding one to the exponent field carries into the sign
 * bit exactly when the exponent is all ones (NaN, infinity). GCC's -O2 cost model skips
 * loops of unknown length, hence the dynamic model here (optim.c does the same). The
 * position is only looked for on failure. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("vect-cost-model=dynamic")))
#endif
PST_BIT_EXACT_CLONES
static uint64_t find_nonfinite(const float *g, uint64_t n)
{
    uint32_t bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &g[i], sizeof u);
        bad |= (u & 0x7f800000u) + 0x00800000u;
    }
    if (!(bad & 0x80000000u))
        return n;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &g[i], sizeof u);
        if ((u & 0x7f800000u) == 0x7f800000u)
            return i;
    }
    return n;
}

/* dst[0..n) = src[0..n) and find_nonfinite of what was read, in one pass that reads each
 * element of src once: what is checked is what is copied, even while another process
 * writes src. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("vect-cost-model=dynamic")))
#endif
PST_BIT_EXACT_CLONES
static uint64_t copy_finite(float *restrict dst, const float *restrict src, uint64_t n)
{
    uint32_t bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], sizeof u);
        memcpy(&dst[i], &u, sizeof u);
        bad |= (u & 0x7f800000u) + 0x00800000u;
    }
    return bad & 0x80000000u ? find_nonfinite(dst, n) : n;
}

/* find_nonfinite of bf16 values h[0..n) (the same test on the 8 exponent bits). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("vect-cost-model=dynamic")))
#endif
static uint64_t find_nonfinite_bf16(const uint16_t *h, uint64_t n)
{
    uint16_t bad = 0;
    for (uint64_t i = 0; i < n; i++)
        bad |= (uint16_t)((h[i] & 0x7f80u) + 0x0080u);
    if (!(bad & 0x8000u))
        return n;
    for (uint64_t i = 0; i < n; i++)
        if ((h[i] & 0x7f80u) == 0x7f80u)
            return i;
    return n;
}

static float bf16_value(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* acc = h (row 0 of the sum) or acc += h (a later row), h bf16. */
static void add_bf16(float *acc, const uint16_t *h, size_t n, int first)
{
    if (first)
        for (size_t i = 0; i < n; i++)
            acc[i] = bf16_value(h[i]);
    else
        for (size_t i = 0; i < n; i++)
            acc[i] += bf16_value(h[i]);
}

/* find_nonfinite over g[0..n) split across the store's pool: a gradient read in place is
 * scanned in one pass before anything changes, and on a team of cores that pass costs a
 * part of the update's time instead of a serial pass of its own. */
#define SCAN_MAX_PARTS 64

typedef struct scan_job {
    const float *g;
    uint64_t n;
    uint64_t bad[SCAN_MAX_PARTS]; /* per part: absolute index of its first bad element, or n */
} scan_job;

static void scan_part(void *arg, int part, int nparts)
{
    scan_job *j = arg;
    size_t lo, hi;
    pst_pool_split((size_t)j->n, part, nparts, 16, &lo, &hi);
    uint64_t at = find_nonfinite(j->g + lo, hi - lo);
    j->bad[part] = at < hi - lo ? lo + at : j->n;
}

static uint64_t find_nonfinite_pool(struct pst_pool *pool, const float *g, uint64_t n)
{
    const int nparts = pool ? pst_pool_size(pool) : 1;
    if (nparts < 2 || nparts > SCAN_MAX_PARTS || n < 4096)
        return find_nonfinite(g, n);
    scan_job job = {.g = g, .n = n};
    pst_pool_run(pool, scan_part, &job);
    uint64_t first = n;
    for (int i = 0; i < nparts; i++)
        first = job.bad[i] < first ? job.bad[i] : first;
    return first;
}

/* What a non-finite x is: 0 NaN, 1 infinity, 2 minus infinity (nonfinite_names). */
static const char *const nonfinite_names[3] = {"nan", "inf", "-inf"};

static unsigned nonfinite_kind(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if (u & 0x007fffffu)
        return 0;
    return (u & 0x80000000u) ? 2 : 1;
}

static const char *nonfinite_name(float x)
{
    return nonfinite_names[nonfinite_kind(x)];
}

static void waiter_unlink(ps_block *b, ps_pull_waiter *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        b->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        b->tail = w->prev;
    w->next = w->prev = NULL;
    w->queued = 0;
}

static void waiter_append(ps_block *b, ps_pull_waiter *w)
{
    w->next = NULL;
    w->prev = b->tail;
    if (b->tail)
        b->tail->next = w;
    else
        b->head = w;
    b->tail = w;
    w->queued = 1;
}

/* Answers, in queue order, every waiter whose wanted version now exists. Block lock held.
 * A waiter is unlinked before its fn runs and not touched afterwards (fn may free it). */
static void answer_waiters(ps_block *b)
{
    ps_pull_waiter *w = b->head;
    while (w) {
        ps_pull_waiter *next = w->next;
        if (w->want_version <= b->version) {
            ps_pull_fn fn = w->fn;
            void *arg = w->arg;
            waiter_unlink(b, w);
            fn(arg, PST_OK, b->values, b->lowp, b->length, b->version);
        }
        w = next;
    }
}

/* One part of an update split over the store's pool (elementwise: the split changes no
 * bit, optim.h): tile by tile, the sum of the gradient rows (`rows` rows `stride` floats
 * apart from `sum`, each f32 or, where bf16[r], bf16 in the row's first half; summed in
 * row order, trainer-id order in sync mode, into a tile on the stack), the optimizer, and
 * the cast into the low-precision copy, each tile still in cache for the next pass. With
 * neither g nor sum only the cast (init). */

typedef struct update_job {
    const ps_store *st;
    ps_block *b;
    const float *g;   /* the gradient as it is, or NULL */
    const float *sum; /* or the rows to sum first, or NULL */
    const uint8_t *bf16;
    int rows;
    uint64_t stride;
    const row_src *src; /* (rows) where each row is read from, or NULL: all from sum */
} update_job;

#define UPDATE_TILE 4096 /* floats: a tile of every array fits in L2 */

/* acc[0..n) = (r == 0 ? 0 : acc) + row r's elements [t0, t0 + n): one element's sum is
 * acc = row0; acc += row1; ... whatever the tiles and the row dtypes. */
static void add_row(float *acc, const update_job *j, int r, size_t t0, size_t n)
{
    const float *row = j->sum + (uint64_t)r * j->stride;
    const row_src *d = j->src ? &j->src[r] : NULL;
    /* A row's fill has read these elements once already, in the push's check: it cannot
     * fail now. */
    if (d && d->raw) {
        uint16_t h[UPDATE_TILE];
        (void)d->raw(d->arg, h, t0, n);
        add_bf16(acc, h, n, r == 0);
        return;
    }
    if (d && d->fill) {
        if (r == 0) {
            (void)d->fill(d->arg, acc, t0, n);
        } else {
            float f[UPDATE_TILE];
            (void)d->fill(d->arg, f, t0, n);
            for (size_t i = 0; i < n; i++)
                acc[i] += f[i];
        }
        return;
    }
    if (j->bf16[r]) {
        add_bf16(acc, (const uint16_t *)row + t0, n, r == 0);
    } else if (r == 0) {
        memcpy(acc, row + t0, n * sizeof(float));
    } else {
        for (size_t i = 0; i < n; i++)
            acc[i] += row[t0 + i];
    }
}

static void update_part(void *arg, int part, int nparts)
{
    const update_job *j = arg;
    const ps_block *b = j->b;
    size_t lo, hi;
    pst_pool_split((size_t)b->length, part, nparts, 16, &lo, &hi);
    _Alignas(PS_CACHE_LINE) float acc[UPDATE_TILE];
    for (size_t t0 = lo; t0 < hi; t0 += UPDATE_TILE) {
        const size_t n = hi - t0 < UPDATE_TILE ? hi - t0 : UPDATE_TILE;
        const float *g = j->g ? j->g + t0 : NULL;
        if (j->sum) {
            if (j->rows == 1 && !j->bf16[0] && !(j->src && j->src[0].fill)) {
                g = j->sum + t0;
            } else {
                for (int r = 0; r < j->rows; r++)
                    add_row(acc, j, r, t0, n);
                g = acc;
            }
        }
        if (g) /* cannot fail: validate_config checked the kind and schedule, t >= 1, state */
            (void)pst_optim_apply(&j->st->optim, (long)(b->version + 1), b->values + t0,
                                  b->state ? b->state + t0 : NULL, (size_t)b->length, g, n);
        if (b->lowp)
            pst_cast((char *)b->lowp + t0 * pst_dtype_size(j->st->lowp), j->st->lowp,
                     b->values + t0, PST_F32, n);
    }
}

static void run_update(const ps_store *st, ps_block *b, const float *g, const float *sum,
                       int rows, uint64_t stride, const row_src *src)
{
    update_job job = {st, b, g, sum, b->row_bf16, rows, stride, src};
    if (st->pool)
        pst_pool_run(st->pool, update_part, &job);
    else
        update_part(&job, 0, 1);
}

/* One optimizer update with gradient g and the cast of the new values into the block's
 * low-precision copy; bumps the version and answers waiters. */
/* g: the gradient; or sum: `rows` rows `stride` floats apart, summed in row order first. */
/* A checkpoint version reached by block b (its lock held): its copy, and the snapshot when
 * it is the last block to get there. */
static void snapshot_block(ps_store *st, ps_block *b)
{
    memcpy(st->snap_values + b->shard_off, b->values, b->length * sizeof(float));
    if (b->state)
        memcpy(st->snap_state + (uint64_t)st->nstate * b->shard_off, b->state,
               (size_t)st->nstate * b->length * sizeof(float));
    pthread_mutex_lock(&st->snap_mu);
    if (st->snap_version != b->version) {
        st->snap_version = b->version;
        st->snap_count = 0;
    }
    const int last = ++st->snap_count == st->nblocks;
    pthread_mutex_unlock(&st->snap_mu);
    if (last)
        st->snap_fn(st->snap_arg, b->version, st->snap_values, st->snap_state);
}

pst_status ps_store_snapshot_now(ps_store *st, int64_t version)
{
    if (!st->snap_fn)
        return pst_error_set(PST_ERR_STATE, "checkpoint of step %lld: this store writes no "
                             "checkpoints", (long long)version);
    for (int i = 0; i < st->nblocks; i++)
        pthread_mutex_lock(&st->blocks[i].mu);
    int at = -1; /* a block at another version */
    for (int i = 0; i < st->nblocks && at < 0; i++)
        if (st->blocks[i].version != version)
            at = i;
    if (at < 0) {
        for (int i = 0; i < st->nblocks; i++) {
            const ps_block *b = &st->blocks[i];
            memcpy(st->snap_values + b->shard_off, b->values, b->length * sizeof(float));
            if (b->state)
                memcpy(st->snap_state + (uint64_t)st->nstate * b->shard_off, b->state,
                       (size_t)st->nstate * b->length * sizeof(float));
        }
        pthread_mutex_lock(&st->snap_mu);
        st->snap_version = -1; /* the periodic copies start again */
        st->snap_count = 0;
        pthread_mutex_unlock(&st->snap_mu);
    }
    const int64_t other = at < 0 ? version : st->blocks[at].version;
    for (int i = st->nblocks - 1; i >= 0; i--)
        pthread_mutex_unlock(&st->blocks[i].mu);
    if (at >= 0)
        return pst_error_set(PST_ERR_STATE, "checkpoint of step %lld: block %u holds version "
                             "%lld (mid-step: no consistent state)", (long long)version,
                             st->blocks[at].id, (long long)other);
    st->snap_fn(st->snap_arg, version, st->snap_values, st->snap_state);
    return PST_OK;
}

/* Block b (its lock held) has its next version's values: counts the casts, reports the
 * update's time, makes the version (atomic: ps_store_update_slice reads it unlocked) and
 * its checkpoint copy, and answers the pulls waiting for it. */
static void made_version(ps_store *st, ps_block *b, double seconds)
{
    if (b->lowp)
        atomic_fetch_add_explicit(&st->casts, b->length, memory_order_relaxed);
    if (st->on_update)
        st->on_update(st->on_update_arg, seconds);
    __atomic_store_n(&b->version, b->version + 1, __ATOMIC_RELEASE);
    if (st->snap_every > 0 && b->version % st->snap_every == 0)
        snapshot_block(st, b);
    answer_waiters(b);
}

static pst_status apply_update(ps_store *st, ps_block *b, const float *g, const float *sum,
                               int rows, uint64_t stride, const row_src *src)
{
    const double t0 = st->on_update ? pst_clock_s() : 0.0;
    run_update(st, b, g, sum, rows, stride, src);
    made_version(st, b, st->on_update ? pst_clock_s() - t0 : 0.0);
    return PST_OK;
}

pst_status ps_store_restore(ps_store *st, int64_t version, const float *values,
                            const float *state)
{
    if (version < 0)
        return pst_error_set(PST_ERR_INVALID, "pserver store: restore to version %lld",
                             (long long)version);
    for (int i = 0; i < st->nblocks; i++) {
        ps_block *b = &st->blocks[i];
        pthread_mutex_lock(&b->mu);
        memcpy(b->values, values + b->shard_off, b->length * sizeof(float));
        if (b->state && state)
            memcpy(b->state, state + (uint64_t)st->nstate * b->shard_off,
                   (size_t)st->nstate * b->length * sizeof(float));
        b->version = version;
        if (b->lowp)
            run_update(st, b, NULL, NULL, 0, 0, NULL); /* the cast alone */
        pthread_mutex_unlock(&b->mu);
    }
    return PST_OK;
}

pst_status ps_store_read_async(ps_store *st, float *values, float *state, int64_t *versions,
                               int64_t *last_steps)
{
    if (st->mode != PST_MODE_ASYNC)
        return pst_error_set(PST_ERR_STATE, "pserver store: an async read of a sync store");
    for (int i = 0; i < st->nblocks; i++) {
        ps_block *b = &st->blocks[i];
        pthread_mutex_lock(&b->mu);
        memcpy(values + b->shard_off, b->values, b->length * sizeof(float));
        if (b->state && state)
            memcpy(state + (uint64_t)st->nstate * b->shard_off, b->state,
                   (size_t)st->nstate * b->length * sizeof(float));
        versions[i] = b->version;
        for (int t = 0; t < st->num_trainers; t++)
            last_steps[(size_t)t * (size_t)st->nblocks + (size_t)i] = b->last_step[t];
        pthread_mutex_unlock(&b->mu);
    }
    return PST_OK;
}

pst_status ps_store_restore_async(ps_store *st, const float *values, const float *state,
                                  const int64_t *versions, const int64_t *last_steps)
{
    if (st->mode != PST_MODE_ASYNC)
        return pst_error_set(PST_ERR_STATE, "pserver store: an async restore of a sync store");
    for (int i = 0; i < st->nblocks; i++)
        if (versions[i] < 0)
            return pst_error_set(PST_ERR_INVALID, "pserver store: restore block %u to version "
                                 "%lld", st->blocks[i].id, (long long)versions[i]);
    PST_TRY(ps_store_restore(st, 0, values, state));
    for (int i = 0; i < st->nblocks; i++) {
        ps_block *b = &st->blocks[i];
        pthread_mutex_lock(&b->mu);
        b->version = versions[i];
        for (int t = 0; t < st->num_trainers; t++)
            b->last_step[t] = last_steps[(size_t)t * (size_t)st->nblocks + (size_t)i];
        pthread_mutex_unlock(&b->mu);
    }
    return PST_OK;
}

int64_t ps_store_first_unapplied(ps_store *st, uint32_t t)
{
    if (st->mode != PST_MODE_ASYNC || t >= (uint32_t)st->num_trainers)
        return -1;
    int64_t lo = INT64_MAX;
    for (int i = 0; i < st->nblocks; i++) {
        ps_block *b = &st->blocks[i];
        pthread_mutex_lock(&b->mu);
        lo = b->last_step[t] < lo ? b->last_step[t] : lo;
        pthread_mutex_unlock(&b->mu);
    }
    return st->nblocks ? lo + 1 : 0;
}

int ps_store_state_floats(const ps_store *st)
{
    return st->nstate;
}

/* Releases the pushes of block b kept for its step (its lock held, or at free). */
static void release_kept(const ps_store *st, ps_block *b)
{
    for (int r = 0; b->sources && r < st->num_trainers; r++) {
        if (b->sources[r].kept)
            st->release_push(b->sources[r].arg);
        b->sources[r] = (row_src){0};
    }
}

/* Sync: all trainers pushed step == version, each row where b->sources says. Sums the rows
 * in trainer-id order (acc = row0; acc += row1; ...: per element, the same order whatever
 * the tiles and wherever each row is read from), applies it, releases the kept pushes and
 * clears the flags. */
static pst_status complete_sync_step(ps_store *st, ps_block *b)
{
    memset(b->pushed, 0, (size_t)st->num_trainers);
    b->npushed = 0;
    pst_status rc = apply_update(st, b, NULL, b->recv, st->num_trainers, b->length,
                                 b->sources);
    release_kept(st, b);
    return rc;
}

/* ---- config validation ---- */

static pst_status validate_config(const ps_store_config *cfg)
{
    if (cfg->mode != PST_MODE_SYNC && cfg->mode != PST_MODE_ASYNC)
        return pst_error_set(PST_ERR_INVALID, "pserver store: unknown mode %d (want sync or async)",
                             (int)cfg->mode);
    if (cfg->num_trainers < 1)
        return pst_error_set(PST_ERR_INVALID, "pserver store: num_trainers %d, want >= 1",
                             cfg->num_trainers);
    if ((unsigned)cfg->optim.kind >= PST_OPTIM_KIND_COUNT_)
        return pst_error_set(PST_ERR_INVALID, "pserver store: unknown optimizer kind %d",
                             (int)cfg->optim.kind);
    if ((unsigned)cfg->optim.schedule >= PST_LR_SCHEDULE_COUNT_)
        return pst_error_set(PST_ERR_INVALID, "pserver store: unknown lr schedule %d",
                             (int)cfg->optim.schedule);
    if (cfg->lowp != PST_F32 && cfg->lowp != PST_F16 && cfg->lowp != PST_BF16)
        return pst_error_set(PST_ERR_INVALID, "pserver store: lowp dtype %d unknown (want f32 "
                             "for no low-precision copy, f16 or bf16)", (int)cfg->lowp);
    if (!cfg->keep_push != !cfg->release_push)
        return pst_error_set(PST_ERR_INVALID, "pserver store: keep_push and release_push "
                             "come together (both set or both NULL)");
    if (cfg->nblocks < 0)
        return pst_error_set(PST_ERR_INVALID, "pserver store: nblocks %d, want >= 0",
                             cfg->nblocks);
    if (cfg->nblocks > 0 && !cfg->blocks)
        return pst_error_set(PST_ERR_INVALID, "pserver store: %d blocks but no block list",
                             cfg->nblocks);
    for (int i = 0; i < cfg->nblocks; i++) {
        const ps_block_spec *s = &cfg->blocks[i];
        if (s->length == 0)
            return pst_error_set(PST_ERR_INVALID, "pserver store: block %u has length 0",
                                 (unsigned)s->id);
        if (s->offset > UINT64_MAX - s->length)
            return pst_error_set(PST_ERR_INVALID,
                                 "pserver store: block %u: offset %llu + length %llu overflows",
                                 (unsigned)s->id, (unsigned long long)s->offset,
                                 (unsigned long long)s->length);
    }
    return PST_OK;
}

/* Checks that the ranges [offset, offset+length) are disjoint; `order` is scratch. */
static pst_status check_disjoint(const ps_block_spec *blocks, int n,
                                 const ps_block_spec **order)
{
    for (int i = 0; i < n; i++)
        order[i] = &blocks[i];
    qsort(order, (size_t)n, sizeof *order, cmp_spec_offset);
    for (int i = 1; i < n; i++) {
        const ps_block_spec *a = order[i - 1], *b = order[i];
        if (a->offset + a->length > b->offset)
            return pst_error_set(PST_ERR_INVALID,
                                 "pserver store: blocks %u [%llu, %llu) and %u [%llu, %llu) "
                                 "overlap",
                                 (unsigned)a->id, (unsigned long long)a->offset,
                                 (unsigned long long)(a->offset + a->length), (unsigned)b->id,
                                 (unsigned long long)b->offset,
                                 (unsigned long long)(b->offset + b->length));
    }
    return PST_OK;
}

/* ---- public API ---- */

uint64_t ps_store_bytes(const ps_store_config *cfg, uint64_t total_length)
{
    const double rows = (cfg->values ? 0 : 1) + pst_optim_state_floats(cfg->optim.kind) +
                        (cfg->mode == PST_MODE_SYNC ? (double)cfg->num_trainers : 1);
    const double lowp = cfg->lowp != PST_F32 && !cfg->lowp_at ? pst_dtype_size(cfg->lowp) : 0;
    const double bytes = (double)total_length * (rows * sizeof(float) + lowp);
    return bytes >= 0x1p64 ? UINT64_MAX : (uint64_t)bytes;
}

pst_status ps_store_init(ps_store **out, const ps_store_config *cfg, const float *initial)
{
    if (!out)
        return pst_error_set(PST_ERR_INVALID, "pserver store: NULL out pointer");
    *out = NULL;
    if (!cfg)
        return pst_error_set(PST_ERR_INVALID, "pserver store: NULL config");
    PST_TRY(validate_config(cfg));

    pst_status rc = PST_OK;
    const ps_block_spec **order = NULL;
    ps_store *st = calloc(1, sizeof *st);
    if (!st)
        return pst_error_set(PST_ERR_NOMEM, "pserver store: out of memory");
    st->mode = cfg->mode;
    st->num_trainers = cfg->num_trainers;
    st->optim = cfg->optim;
    st->pool = cfg->pool;
    st->keep_push = cfg->keep_push;
    st->release_push = cfg->release_push;
    st->lowp = cfg->lowp;
    st->on_update = cfg->on_update;
    st->on_update_arg = cfg->on_update_arg;
    atomic_init(&st->casts, 0);
    st->nstate = pst_optim_state_floats(cfg->optim.kind);
    int n = cfg->nblocks;

    if (n > 0) {
        st->by_id = calloc((size_t)n, sizeof *st->by_id);
        order = calloc((size_t)n, sizeof *order);
        /* aligned_alloc wants a size that is a multiple of the alignment; sizeof(ps_block)
         * is one because of its _Alignas member. */
        st->blocks = aligned_alloc(_Alignof(ps_block), (size_t)n * sizeof *st->blocks);
        if (!st->by_id || !order || !st->blocks) {
            free(st->blocks);
            st->blocks = NULL;
            rc = pst_error_set(PST_ERR_NOMEM, "pserver store: out of memory for %d blocks", n);
            goto error;
        }
        memset(st->blocks, 0, (size_t)n * sizeof *st->blocks);
        st->nblocks = n;
    }

    if (n > 0) {
        for (int i = 0; i < n; i++) {
            st->by_id[i].id = cfg->blocks[i].id;
            st->by_id[i].index = i;
        }
        qsort(st->by_id, (size_t)n, sizeof *st->by_id, cmp_index_id);
        for (int i = 1; i < n; i++) {
            if (st->by_id[i].id == st->by_id[i - 1].id) {
                rc = pst_error_set(PST_ERR_INVALID, "pserver store: block id %u listed twice",
                                   (unsigned)st->by_id[i].id);
                goto error;
            }
        }
        rc = check_disjoint(cfg->blocks, n, order);
        if (rc != PST_OK)
            goto error;
    }

    int nrecv = cfg->mode == PST_MODE_SYNC ? cfg->num_trainers : 1;
    const uint64_t own = cfg->values ? 0 : 1; /* the store allocates the values */
    uint64_t rows = own + (uint64_t)st->nstate + (uint64_t)nrecv;
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const ps_block_spec *s = &cfg->blocks[i];
        ps_block *b = &st->blocks[i];
        b->id = s->id;
        b->offset = s->offset;
        b->length = s->length;
        b->closed = PST_OK;
        if (s->length > SIZE_MAX / sizeof(float) / rows) {
            rc = pst_error_set(PST_ERR_INVALID,
                               "pserver store: block %u of %llu elements is too large",
                               (unsigned)s->id, (unsigned long long)s->length);
            goto error;
        }
        /* Cache-line aligned, like device memory: the update's vector loops read it. */
        const size_t bytes = (size_t)(rows * s->length) * sizeof(float);
        b->mem = aligned_alloc(PS_CACHE_LINE, (bytes + PS_CACHE_LINE - 1) / PS_CACHE_LINE *
                                                  PS_CACHE_LINE);
        if (b->mem) { /* recv is written before it is read: left untouched, it takes no
                       * memory until a push is copied into it (kept pushes are not) */
            pst_memory_huge(b->mem, bytes);
            memset(b->mem, 0, (size_t)((own + (uint64_t)st->nstate) * s->length) * sizeof(float));
        }
        if (!b->mem) {
            rc = pst_error_set(PST_ERR_NOMEM,
                               "pserver store: out of memory for block %u (%llu elements)",
                               (unsigned)s->id, (unsigned long long)s->length);
            goto error;
        }
        b->values = own ? b->mem : cfg->values[i];
        b->state = st->nstate > 0 ? b->mem + own * s->length : NULL;
        b->recv = b->mem + (own + (uint64_t)st->nstate) * s->length;
        b->row_bf16 = calloc((size_t)nrecv, 1);
        if (!b->row_bf16) {
            rc = pst_error_set(PST_ERR_NOMEM, "pserver store: out of memory");
            goto error;
        }
        if (cfg->mode == PST_MODE_SYNC) {
            b->pushed = calloc((size_t)cfg->num_trainers, 1);
            if (cfg->num_trainers > 1)
                b->sources = calloc((size_t)cfg->num_trainers, sizeof *b->sources);
            if (!b->pushed || (cfg->num_trainers > 1 && !b->sources)) {
                rc = pst_error_set(PST_ERR_NOMEM, "pserver store: out of memory");
                goto error;
            }
        } else {
            b->last_step = malloc((size_t)cfg->num_trainers * sizeof *b->last_step);
            if (!b->last_step) {
                rc = pst_error_set(PST_ERR_NOMEM, "pserver store: out of memory");
                goto error;
            }
            for (int t = 0; t < cfg->num_trainers; t++)
                b->last_step[t] = -1;
        }
        if (initial)
            memcpy(b->values, initial + off, (size_t)s->length * sizeof(float));
        b->shard_off = off;
        off += s->length;
        if (cfg->lowp != PST_F32) {
            const size_t lbytes = (size_t)s->length * pst_dtype_size(cfg->lowp);
            b->lowp_own = !cfg->lowp_at;
            b->lowp = cfg->lowp_at ? cfg->lowp_at[i]
                                   : aligned_alloc(PS_CACHE_LINE, (lbytes + PS_CACHE_LINE - 1) /
                                                                      PS_CACHE_LINE *
                                                                      PS_CACHE_LINE);
            if (!b->lowp) {
                rc = pst_error_set(PST_ERR_NOMEM, "pserver store: out of memory for block %u's "
                                   "%s copy", (unsigned)s->id, pst_dtype_name(cfg->lowp));
                goto error;
            }
            run_update(st, b, NULL, NULL, 0, 0, NULL); /* the cast alone: not counted */
        }
        if (pthread_mutex_init(&b->mu, NULL) != 0) {
            rc = pst_error_set(PST_ERR_INTERNAL, "pserver store: pthread_mutex_init failed");
            goto error;
        }
        b->mu_ok = 1;
    }
    st->total_length = off;
    if (cfg->snapshot_every > 0 && cfg->mode == PST_MODE_SYNC && cfg->snapshot) {
        st->snap_every = cfg->snapshot_every;
        st->snap_fn = cfg->snapshot;
        st->snap_arg = cfg->snapshot_arg;
        st->snap_version = -1;
        st->snap_values = malloc(sizeof(float) * (off ? off : 1));
        st->snap_state = st->nstate ? malloc(sizeof(float) * (size_t)st->nstate * (off ? off : 1))
                                    : NULL;
        if (!st->snap_values || (st->nstate && !st->snap_state)) {
            rc = pst_error_set(PST_ERR_NOMEM, "pserver store: out of memory for checkpoints");
            goto error;
        }
        if (pthread_mutex_init(&st->snap_mu, NULL) != 0) {
            rc = pst_error_set(PST_ERR_INTERNAL, "pserver store: pthread_mutex_init failed");
            goto error;
        }
        st->snap_mu_ok = 1;
    }
    free(order);
    *out = st;
    return PST_OK;

error:
    free(order);
    ps_store_free(st);
    return rc;
}

void ps_store_free(ps_store *st)
{
    if (!st)
        return;
    for (int i = 0; i < st->nblocks; i++) {
        ps_block *b = &st->blocks[i];
        if (b->mu_ok)
            pthread_mutex_destroy(&b->mu);
        free(b->mem);
        if (b->lowp_own)
            free(b->lowp);
        release_kept(st, b);
        PST_FREE_ALL(b->pushed, b->row_bf16, b->last_step, b->sources);
    }
    PST_FREE_ALL(st->blocks, st->by_id, st->snap_values, st->snap_state);
    if (st->snap_mu_ok)
        pthread_mutex_destroy(&st->snap_mu);
    free(st);
}

/* ps_store_push, or with `direct` (fill NULL) ps_store_push_f32. */
static pst_status push(ps_store *st, uint32_t trainer, int64_t step, uint32_t block,
                       uint64_t length, float inv_scale, ps_fill_fn fill, void *fill_arg,
                       const float *direct, ps_raw_fill_fn raw_bf16, unsigned flags,
                       int *duplicate)
{
    if (duplicate)
        *duplicate = 0;
    ps_block *b = find_block(st, block);
    if (!b)
        return pst_error_set(PST_ERR_NOT_FOUND, "push: block %u is not on this pserver",
                             (unsigned)block);
    if (length != b->length)
        return pst_error_set(PST_ERR_INVALID,
                             "push: block %u has %llu elements, the push carries %llu",
                             (unsigned)block, (unsigned long long)b->length,
                             (unsigned long long)length);
    if (trainer >= (uint32_t)st->num_trainers)
        return pst_error_set(PST_ERR_INVALID, "push: trainer id %u out of range (%d trainers)",
                             (unsigned)trainer, st->num_trainers);
    if (step < 0)
        return pst_error_set(PST_ERR_INVALID, "push: negative step %lld for block %u",
                             (long long)step, (unsigned)block);
    if (!fill && !direct && !raw_bf16)
        return pst_error_set(PST_ERR_INVALID, "push: no fill function");

    pst_status rc = PST_OK;
    void *kept = NULL; /* this push, kept where it came (keep_push) */
    /* the step's whole sum (a chain): row 0, applied as one trainer's push */
    const int all = (flags & PS_PUSH_ALL_TRAINERS) && st->mode == PST_MODE_SYNC &&
                    st->num_trainers > 1;
    pthread_mutex_lock(&b->mu);
    float *dst;
    if (st->mode == PST_MODE_SYNC) {
        if (step > b->version) {
            rc = pst_error_set(PST_ERR_RANGE, "step %lld is ahead of block %u's version %lld",
                               (long long)step, (unsigned)block, (long long)b->version);
            goto out;
        }
        if (step < b->version || (!all && b->pushed[trainer])) {
            if (duplicate)
                *duplicate = 1;
            goto out;
        }
        if (all && b->npushed > 0) {
            rc = pst_error_set(PST_ERR_STATE, "push: the whole sum of block %u, step %lld came "
                               "from trainer %u's chain after %d trainer(s) pushed the step "
                               "themselves: every trainer of a chained job (PSTRAIN_CHAIN) "
                               "pushes through it", (unsigned)block, (long long)step,
                               (unsigned)trainer, b->npushed);
            goto out;
        }
        dst = b->recv + (uint64_t)(all ? 0 : trainer) * b->length;
    } else {
        if (step <= b->last_step[trainer]) {
            if (duplicate)
                *duplicate = 1;
            goto out;
        }
        /* A trainer's pushes of a block come one step after another (retries repeat one):
         * a step far ahead would make every real one after it look like a duplicate. The
         * distance in unsigned arithmetic: step > last_step >= -1, so it is exact where
         * step - last_step would overflow (step 2^63-1 before any push). */
        if ((uint64_t)step - (uint64_t)b->last_step[trainer] > PS_ASYNC_STEP_WINDOW) {
            rc = pst_error_set(PST_ERR_RANGE, "push: step %lld of block %u from trainer %u is "
                               "more than %d steps past its last (%lld)", (long long)step,
                               (unsigned)block, (unsigned)trainer, PS_ASYNC_STEP_WINDOW,
                               (long long)b->last_step[trainer]);
            goto out;
        }
        dst = b->recv;
    }

    /* A push that makes the update on its own (one trainer, or async) and comes as an f32
     * array in this process is read where it is; every other is copied into dst first. */
    const int alone = st->mode == PST_MODE_ASYNC || st->num_trainers == 1 || all;
    const int in_place = direct && !(flags & PS_PUSH_SHARED_SOURCE) && alone;
    const float *g = in_place ? direct : dst;
    /* The destination is a buffer no one else reads until this push is accepted below, so
     * a failed fill or a rejected gradient leaves the store as it was. 64 KiB pieces: each
     * is checked while it is still in cache, instead of a second pass over the block. A
     * gradient read in place is checked in one pass, split over the pool. */
    const uint64_t bad_at = in_place ? find_nonfinite_pool(st->pool, g, b->length) : b->length;
    if (bad_at < b->length) {
        rc = pst_error_set(PST_ERR_INVALID,
                           "push: gradient of block %u from trainer %u, step %lld has %s at "
                           "element %llu; discarded",
                           (unsigned)block, (unsigned)trainer, (long long)step,
                           nonfinite_name(g[bad_at]), (unsigned long long)bad_at);
        goto out;
    }
    /* A push from a fill that makes the update (the last of a sync step, one trainer, or
     * async) is not copied: its pieces are only checked here, through a buffer on the
     * stack, and the update reads it again from the caller (through the fill), tile by tile,
     * saving the write of the whole gradient and its reading back. Not a source another
     * process can write (PS_PUSH_SHARED_SOURCE): what was checked must be what is applied,
     * so it is copied into dst like any other push. */
    const int row = st->mode == PST_MODE_SYNC && !all ? (int)trainer : 0;
    const int readable = !direct && inv_scale == 1.0f && !(flags & PS_PUSH_SHARED_SOURCE);
    const int through = readable && (alone || b->npushed + 1 == st->num_trainers);
    /* A sync push before the last of its step: kept where it came when the caller can keep
     * it (keep_push), and read from there by the update, like the last one. */
    kept = readable && !through && st->keep_push ? st->keep_push(fill_arg) : NULL;
    const int only_check = through || kept;
    for (uint64_t off = 0; off < b->length && raw_bf16; off += FILL_PIECE) {
        const uint64_t n = b->length - off < FILL_PIECE ? b->length - off : FILL_PIECE;
        uint16_t piece[FILL_PIECE];
        uint16_t *h = only_check ? piece : (uint16_t *)dst + off;
        if ((rc = raw_bf16(fill_arg, h, off, n)) != PST_OK)
            goto out;
        const uint64_t bad = find_nonfinite_bf16(h, n);
        if (bad < n) {
            rc = pst_error_set(PST_ERR_INVALID,
                               "push: gradient of block %u from trainer %u, step %lld has %s "
                               "at element %llu; discarded",
                               (unsigned)block, (unsigned)trainer, (long long)step,
                               nonfinite_name(bf16_value(h[bad])),
                               (unsigned long long)(off + bad));
            goto out;
        }
    }
    for (uint64_t off = 0; off < b->length && !in_place && !raw_bf16; off += FILL_PIECE) {
        uint64_t n = b->length - off < FILL_PIECE ? b->length - off : FILL_PIECE;
        float piece[FILL_PIECE];
        float *out = only_check ? piece : dst + off;
        uint64_t bad;
        if (direct) { /* (no scale with an array) */
            bad = copy_finite(out, direct + off, n);
        } else {
            if ((rc = fill(fill_arg, out, off, n)) != PST_OK)
                goto out;
            if (inv_scale != 1.0f) /* a power of two: exact (barring subnormals) */
                for (uint64_t i = 0; i < n; i++)
                    out[i] *= inv_scale;
            bad = find_nonfinite(out, n);
        }
        if (bad < n) {
            rc = pst_error_set(PST_ERR_INVALID,
                               "push: gradient of block %u from trainer %u, step %lld has %s "
                               "at element %llu; discarded",
                               (unsigned)block, (unsigned)trainer, (long long)step,
                               nonfinite_name(out[bad]), (unsigned long long)(off + bad));
            goto out;
        }
    }

    row_src src = {0}; /* where the update reads this push: recv, unless */
    if (only_check)
        src = (row_src){.fill = raw_bf16 ? NULL : fill, .raw = raw_bf16,
                        .arg = kept ? kept : fill_arg, .kept = kept != NULL};
    b->row_bf16[row] = raw_bf16 != NULL;
    if (!alone) {
        b->pushed[trainer] = 1;
        b->sources[row] = src;
        kept = NULL; /* the block's now */
        if (++b->npushed == st->num_trainers)
            rc = complete_sync_step(st, b);
    } else { /* one trainer, async, or a chain's whole sum: its gradient is the sum */
        if (st->mode == PST_MODE_ASYNC)
            b->last_step[trainer] = step;
        rc = in_place ? apply_update(st, b, g, NULL, 1, 0, NULL)
                      : apply_update(st, b, NULL, dst, 1, b->length, &src);
    }

out:
    if (kept) /* a push discarded in its check */
        st->release_push(kept);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

pst_status ps_store_push(ps_store *st, uint32_t trainer, int64_t step, uint32_t block,
                         uint64_t length, ps_fill_fn fill, void *fill_arg, int *duplicate)
{
    return push(st, trainer, step, block, length, 1.0f, fill, fill_arg, NULL, NULL, 0,
                duplicate);
}

pst_status ps_store_push_bf16(ps_store *st, uint32_t trainer, int64_t step, uint32_t block,
                              uint64_t length, ps_raw_fill_fn fill, void *fill_arg,
                              unsigned flags, int *duplicate)
{
    if (!fill)
        return pst_error_set(PST_ERR_INVALID, "push: no fill function");
    return push(st, trainer, step, block, length, 1.0f, NULL, fill_arg, NULL, fill, flags,
                duplicate);
}

pst_status ps_store_push_scaled(ps_store *st, uint32_t trainer, int64_t step, uint32_t block,
                                uint64_t length, float loss_scale, ps_fill_fn fill,
                                void *fill_arg, unsigned flags, int *duplicate)
{
    int e;
    if (!(loss_scale > 0.0f) || isinf(loss_scale) || frexpf(loss_scale, &e) != 0.5f ||
        e < -125 || e > 127)
        return pst_error_set(PST_ERR_INVALID, "push: loss scale %g of block %u is not a power "
                             "of two between 2^-126 and 2^126 (example: 65536)",
                             (double)loss_scale, (unsigned)block);
    return push(st, trainer, step, block, length, 1.0f / loss_scale, fill, fill_arg, NULL, NULL,
                flags, duplicate);
}

/* ---- the update made piece by piece (training alone, see store.h) ---------------------- */

/* The block of a slice or a commit, in a store that takes them. */
static pst_status sliced_block(ps_store *st, uint32_t block, ps_block **out)
{
    if (!(*out = find_block(st, block)))
        return pst_error_set(PST_ERR_NOT_FOUND, "update: block %u is not in this store",
                             (unsigned)block);
    if (st->mode != PST_MODE_SYNC || st->num_trainers != 1)
        return pst_error_set(PST_ERR_STATE, "update: piece by piece only in a sync store of "
                             "one trainer");
    return PST_OK;
}

pst_status ps_store_update_slice(ps_store *st, uint32_t block, uint64_t first, uint64_t n,
                                 const float *grad)
{
    ps_block *b;
    PST_TRY(sliced_block(st, block, &b));
    if (first > b->length || n > b->length - first || (n && !grad))
        return pst_error_set(PST_ERR_INVALID, "update: elements [%llu, +%llu) of block %u "
                             "(%llu elements)%s", (unsigned long long)first,
                             (unsigned long long)n, (unsigned)block,
                             (unsigned long long)b->length, grad ? "" : " with no gradient");
    const uint64_t bad = find_nonfinite(grad, n);
    if (bad < n) { /* kept for the commit, which fails the step; the lowest index wins */
        const uint64_t mine = (first + bad + 1) << 2 | nonfinite_kind(grad[bad]);
        uint64_t seen = atomic_load(&b->slice_bad);
        while ((seen == 0 || mine < seen) &&
               !atomic_compare_exchange_weak(&b->slice_bad, &seen, mine))
            ;
        return pst_error_set(PST_ERR_INVALID, "update: gradient of block %u has %s at element "
                             "%llu", (unsigned)block, nonfinite_name(grad[bad]),
                             (unsigned long long)(first + bad));
    }
    /* b->version is the commit's to change, after every piece: read without the lock. The
     * same call on the same elements as update_part, so the same bits. */
    const int64_t version = __atomic_load_n(&b->version, __ATOMIC_ACQUIRE);
    (void)pst_optim_apply(&st->optim, (long)(version + 1), b->values + first,
                          b->state ? b->state + first : NULL, (size_t)b->length, grad, n);
    if (b->lowp)
        pst_cast((char *)b->lowp + first * pst_dtype_size(st->lowp), st->lowp,
                 b->values + first, PST_F32, n);
    return PST_OK;
}

pst_status ps_store_commit_slices(ps_store *st, int64_t step, uint32_t block)
{
    ps_block *b;
    PST_TRY(sliced_block(st, block, &b));
    pst_status rc = PST_OK;
    pthread_mutex_lock(&b->mu);
    const uint64_t bad = atomic_exchange(&b->slice_bad, 0);
    if (step != b->version) {
        rc = pst_error_set(PST_ERR_RANGE, "update: step %lld of block %u, whose version is "
                           "%lld", (long long)step, (unsigned)block, (long long)b->version);
    } else if (bad) {
        rc = pst_error_set(PST_ERR_INVALID, "push: gradient of block %u from trainer 0, step "
                           "%lld has %s at element %llu; the update, made piece by piece "
                           "during backward, is partly applied", (unsigned)block,
                           (long long)step, nonfinite_names[bad & 3],
                           (unsigned long long)((bad >> 2) - 1));
    } else {
        made_version(st, b, 0.0); /* the time went into backward */
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

pst_status ps_store_push_f32(ps_store *st, uint32_t trainer, int64_t step, uint32_t block,
                             const float *grad, uint64_t length, unsigned flags, int *duplicate)
{
    if (!grad)
        return pst_error_set(PST_ERR_INVALID, "push: no gradient");
    return push(st, trainer, step, block, length, 1.0f, NULL, NULL, grad, NULL, flags,
                duplicate);
}

pst_status ps_store_pull(ps_store *st, uint32_t block, int64_t want_version,
                         ps_pull_waiter *w, ps_pull_fn fn, void *arg)
{
    if (!w || !fn)
        return pst_error_set(PST_ERR_INVALID, "pull: NULL waiter or answer function");
    ps_block *b = find_block(st, block);
    if (!b)
        return pst_error_set(PST_ERR_NOT_FOUND, "pull: block %u is not on this pserver",
                             (unsigned)block);
    w->next = w->prev = NULL;
    w->fn = fn;
    w->arg = arg;
    w->want_version = want_version;
    w->block = (int)(b - st->blocks);
    w->queued = 0;

    pthread_mutex_lock(&b->mu);
    if (b->version >= want_version)
        fn(arg, PST_OK, b->values, b->lowp, b->length, b->version);
    else if (b->closed != PST_OK)
        fn(arg, b->closed, NULL, NULL, 0, b->version);
    else
        waiter_append(b, w);
    pthread_mutex_unlock(&b->mu);
    return PST_OK;
}

int ps_store_pull_cancel(ps_store *st, ps_pull_waiter *w)
{
    if (!w || w->block < 0 || w->block >= st->nblocks)
        return 0;
    ps_block *b = &st->blocks[w->block];
    pthread_mutex_lock(&b->mu);
    int removed = w->queued;
    if (removed)
        waiter_unlink(b, w);
    pthread_mutex_unlock(&b->mu);
    return removed;
}

void ps_store_cancel_waiters(ps_store *st, pst_status status)
{
    if (status == PST_OK)
        status = PST_ERR_STATE;
    for (int i = 0; i < st->nblocks; i++) {
        ps_block *b = &st->blocks[i];
        pthread_mutex_lock(&b->mu);
        b->closed = status;
        while (b->head) {
            ps_pull_waiter *w = b->head;
            ps_pull_fn fn = w->fn;
            void *arg = w->arg;
            waiter_unlink(b, w);
            fn(arg, status, NULL, NULL, 0, b->version);
        }
        pthread_mutex_unlock(&b->mu);
    }
}

int ps_store_pushed(ps_store *st, uint32_t block)
{
    ps_block *b = find_block(st, block);
    if (!b)
        return -1;
    pthread_mutex_lock(&b->mu);
    const int n = b->npushed;
    pthread_mutex_unlock(&b->mu);
    return n;
}

int64_t ps_store_version(ps_store *st, uint32_t block)
{
    ps_block *b = find_block(st, block);
    if (!b)
        return -1;
    pthread_mutex_lock(&b->mu);
    int64_t v = b->version;
    pthread_mutex_unlock(&b->mu);
    return v;
}

pst_status ps_store_read(ps_store *st, uint32_t block, float *dst, int64_t *version)
{
    ps_block *b = find_block(st, block);
    if (!b)
        return pst_error_set(PST_ERR_NOT_FOUND, "read: block %u is not on this pserver",
                             (unsigned)block);
    if (!dst)
        return pst_error_set(PST_ERR_INVALID, "read: NULL destination for block %u",
                             (unsigned)block);
    pthread_mutex_lock(&b->mu);
    memcpy(dst, b->values, (size_t)b->length * sizeof(float));
    if (version)
        *version = b->version;
    pthread_mutex_unlock(&b->mu);
    return PST_OK;
}

uint64_t ps_store_block_length(const ps_store *st, uint32_t block)
{
    const ps_block *b = find_block(st, block);
    return b ? b->length : 0;
}

int ps_store_block_place(const ps_store *st, uint32_t block, uint64_t *shard_off,
                         uint64_t *length)
{
    const ps_block *b = find_block(st, block);
    if (!b)
        return 0;
    *shard_off = b->shard_off;
    *length = b->length;
    return 1;
}

uint64_t ps_store_total_length(const ps_store *st)
{
    return st->total_length;
}

int ps_store_nblocks(const ps_store *st)
{
    return st->nblocks;
}

pst_dtype ps_store_lowp(const ps_store *st)
{
    return st->lowp;
}

uint64_t ps_store_state_hash(ps_store *st)
{
    uint64_t h = PST_FNV1A_INIT;
    for (int i = 0; i < st->nblocks; i++) {
        ps_block *b = &st->blocks[i];
        pthread_mutex_lock(&b->mu);
        h = pst_fnv1a(h, &b->version, sizeof b->version);
        h = pst_fnv1a(h, b->values, b->length * sizeof(float));
        if (b->state)
            h = pst_fnv1a(h, b->state, (size_t)st->nstate * b->length * sizeof(float));
        pthread_mutex_unlock(&b->mu);
    }
    return h;
}

uint64_t ps_store_cast_count(const ps_store *st)
{
    /* atomic_load wants a non-const object in C11 */
    return atomic_load_explicit((_Atomic uint64_t *)&st->casts, memory_order_relaxed);
}
