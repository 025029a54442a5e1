/* local.c — the in-process link (see local.h). */
#include "trainer/local.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/memory.h"
#include "pserver/shard.h"
#include "pserver/sparse.h"
#include "pserver/sparse_ckpt.h"
#include "pserver/store.h"

typedef struct local_block {
    ps_pull_waiter waiter;
    void *dst;                /* where the exchange's values go (NULL: in place), in the
                               * precision's dtype */
    size_t elem;              /* bytes per element of dst (set once) */
    _Atomic int sliced;       /* this step's update was made by local_update_slice */
    tr_exchange_times times;
} local_block;

typedef struct tr_local {
    tr_link base;             /* first: a tr_link * is a tr_local * */
    tr_link_settings cfg;  /* what it reads of the job's settings */
    ps_store *store;
    local_block *blocks;      /* (nblocks) */
    /* checkpoints (--checkpoint-dir): the store is the job's only shard */
    ps_block_spec *specs;     /* (nblocks) */
    ps_shard_layout layout;
    char ckpt_dir[4200];
    int ckpt_failed;          /* atomic: a shard could not be written (ckpt_error) */
    char ckpt_error[600];
    /* the job's sparse tables (cfg.sparse_tables), in process: one shard of each, and
     * their checkpoints beside the store's (ckpt_dir/table-<i>) */
    pst_sparse_table **tables; /* (cfg.nsparse_tables) */
    pst_sparse_ckpt *writers;  /* (cfg.nsparse_tables) with checkpoints, else NULL */
} tr_local;

/* The store's snapshot: the shard of `version` in DIR/pserver-0. A failure is kept and
 * reported by the next exchange (the step fails with it). */
static void local_snapshot(void *arg, int64_t version, const float *values, const float *state)
{
    tr_local *lk = arg;
    if (ps_shard_save(lk->ckpt_dir, version, &lk->layout, values, state, NULL,
                      lk->cfg.checkpoint_keep) != PST_OK) {
        if (!__atomic_load_n(&lk->ckpt_failed, __ATOMIC_ACQUIRE)) {
            snprintf(lk->ckpt_error, sizeof lk->ckpt_error, "%s", pst_error_detail());
            __atomic_store_n(&lk->ckpt_failed, 1, __ATOMIC_RELEASE);
        }
        return;
    }
    PST_INFO("checkpoint: step %lld written to %s", (long long)version, lk->ckpt_dir);
}

/* Resumes from the newest of the job's checkpoints whose shard is whole (the store's
 * values, state and version, and params: what the executor copies to the devices). */
static pst_status local_resume(tr_local *lk, float *params)
{
    const ps_shard_layout *lay = &lk->layout;
    float *values = malloc(sizeof(float) * (lay->total ? lay->total : 1));
    float *state = lay->nstate ? malloc(sizeof(float) * (size_t)lay->nstate * lay->total)
                               : NULL;
    if (!values || (lay->nstate && !state)) {
        free(values);
        free(state);
        return pst_error_set(PST_ERR_NOMEM, "local store: out of memory to resume");
    }
    const int64_t v = ps_shard_pick(lk->ckpt_dir, lk->base.resume_steps, lk->base.nresume,
                                    lay, values, state, NULL);
    pst_status st = PST_OK;
    if (v >= 0 && (st = ps_store_restore(lk->store, v, values, state)) == PST_OK) {
        memcpy(params, values, sizeof(float) * lay->total); /* the blocks tile the buffer */
        lk->base.start_version = v;
        for (int i = 0; lk->base.resume_states && i < lk->base.nresume; i++)
            if (lk->base.resume_steps[i] == v) {
                lk->base.start_state = lk->base.resume_states[i];
                lk->base.has_start_state = 1;
            }
        PST_INFO("resumed from checkpoint step %lld in %s", (long long)v, lk->ckpt_dir);
    }
    free(values);
    free(state);
    return st;
}

/* The sparse tables, loaded from their checkpoints of the step the store resumed at, and
 * their checkpoint writers when the job keeps checkpoints. */
static pst_status local_tables(tr_local *lk)
{
    const tr_link_settings *cfg = &lk->cfg;
    const int n = cfg->nsparse_tables;
    const int ckpt = cfg->checkpoint_dir[0] && lk->base.checkpoint_every > 0;
    const long v = (long)lk->base.start_version;
    if (!n)
        return PST_OK;
    lk->tables = calloc((size_t)n, sizeof *lk->tables);
    lk->writers = ckpt ? calloc((size_t)n, sizeof *lk->writers) : NULL;
    if (!lk->tables || (ckpt && !lk->writers))
        return pst_error_set(PST_ERR_NOMEM, "local store: out of memory for %d sparse tables", n);
    for (int i = 0; i < n; i++) {
        char dir[4300];
        snprintf(dir, sizeof dir, "%s/table-%d", lk->ckpt_dir, i);
        PST_TRY(pst_sparse_create(&lk->tables[i], &cfg->sparse_tables[i]));
        if (v > 0) {
            const pst_status st = pst_sparse_ckpt_load(dir, v, lk->tables[i]);
            if (st != PST_OK)
                return pst_error_wrap(st, "sparse table %d: resuming at step %ld", i, v);
        }
        if (ckpt)
            pst_sparse_ckpt_init(&lk->writers[i], lk->tables[i], dir, cfg->checkpoint_keep,
                                 v > 0 ? v : -1);
    }
    return PST_OK;
}

static pst_status local_start(tr_link *l, float *params, float *const *homes,
                              struct pst_pool *pool)
{
    tr_local *lk = (tr_local *)l;
    const tr_plan *p = l->plan;
    ps_block_spec *specs = calloc((size_t)p->nblocks, sizeof *specs);
    if (!specs)
        return pst_error_set(PST_ERR_NOMEM, "local store: out of memory");
    for (int b = 0; b < p->nblocks; b++)
        specs[b] = (ps_block_spec){.id = p->blocks[b].id, .offset = p->blocks[b].offset,
                                   .length = p->blocks[b].length};
    ps_store_config sc = {.mode = PST_MODE_SYNC, .num_trainers = 1,
                          .optim = lk->cfg.optim, .blocks = specs,
                          .nblocks = p->nblocks, .values = homes, .pool = pool,
                          .lowp = lk->cfg.precision};
    const tr_link_settings *cfg = &lk->cfg;
    if (cfg->checkpoint_dir[0]) { /* the store is this job's one pserver: pserver-0 */
        snprintf(lk->ckpt_dir, sizeof lk->ckpt_dir, "%s/%s/pserver-0", cfg->checkpoint_dir,
                 cfg->job_id);
        lk->layout = (ps_shard_layout){cfg->settings_fingerprint, specs, p->nblocks,
                                       p->nparams, 0};
        sc.snapshot_every = l->checkpoint_every;
        sc.snapshot = local_snapshot;
        sc.snapshot_arg = lk;
    }
    /* The blocks tile the buffer in order, so params is the concatenation the store wants;
     * with homes the values are already there (the executor put them). */
    pst_status st = ps_store_init(&lk->store, &sc, homes ? NULL : params);
    lk->specs = specs;
    lk->layout.nstate = lk->store ? ps_store_state_floats(lk->store) : 0;
    if (st == PST_OK && l->nresume > 0 && cfg->checkpoint_dir[0])
        st = local_resume(lk, params);
    if (st == PST_OK)
        st = local_tables(lk);
    return st;
}

static void local_pulled(void *arg, pst_status st, const float *values, const void *lowp,
                         uint64_t length, int64_t version)
{
    (void)version;
    local_block *lb = arg;
    const void *src = lowp ? lowp : (const void *)values; /* bf16/f16: the store's copy */
    if (st == PST_OK && lb->dst && lb->dst != src)
        memcpy(lb->dst, src, (size_t)length * lb->elem);
}

typedef struct rounding_fill {
    const float *grad;
    pst_dtype dtype;
} rounding_fill;

/* A ps_fill_fn: the gradient's piece as a pserver receives it, rounded to f.dtype and
 * back (the store divides out the loss scale, as for a pserver's push). */
static pst_status fill_rounded(void *arg, float *dst, uint64_t first, uint64_t length)
{
    const rounding_fill *f = arg;
    const float *g = f->grad + first;
    if (f->dtype == PST_F32) {
        memcpy(dst, g, length * sizeof(float));
    } else {
        uint16_t wire[2048]; /* as the wire holds it, a piece at a time */
        for (uint64_t i = 0; i < length; i += 2048) {
            const size_t k = length - i < 2048 ? (size_t)(length - i) : 2048;
            pst_cast(wire, f->dtype, g + i, PST_F32, k);
            pst_cast(dst + i, PST_F32, wire, f->dtype, k);
        }
    }
    return PST_OK;
}

static pst_status local_exchange(tr_link *l, int b, long step, const float *grad, float scale,
                                 void *dst, tr_exchange_fn done, void *arg)
{
    tr_local *lk = (tr_local *)l;
    local_block *lb = &lk->blocks[b];
    const tr_block *blk = &l->plan->blocks[b];
    int duplicate = 0;
    lb->times.push_start = pst_clock_s();
    pst_status st;
    if (atomic_exchange(&lb->sliced, 0)) {
        /* local_update_slice made the update during backward: only its completion here */
        st = ps_store_commit_slices(lk->store, step, blk->id);
    } else if (lk->cfg.grad_dtype != PST_F32 || scale != 1.0f) {
        /* Rounded to --grad-dtype as the wire would, so training alone equals one trainer
         * with pservers bit for bit. */
        rounding_fill f = {.grad = grad, .dtype = lk->cfg.grad_dtype};
        st = ps_store_push_scaled(lk->store, 0, step, blk->id, blk->length, scale,
                                  fill_rounded, &f, 0, &duplicate);
    } else {
        st = ps_store_push_f32(lk->store, 0, step, blk->id, grad, blk->length, 0, &duplicate);
    }
    lb->times.push_end = lb->times.pull_start = pst_clock_s();
    if (st == PST_OK && duplicate) /* one pusher, one push per step: cannot happen */
        st = pst_error_set(PST_ERR_INTERNAL, "local store: step %ld of block %d pushed twice",
                           step, b);
    if (st == PST_OK && __atomic_load_n(&lk->ckpt_failed, __ATOMIC_ACQUIRE))
        st = pst_error_set(PST_ERR_IO, "%s; the checkpoints written before are intact",
                           lk->ckpt_error);
    lb->dst = dst;
    /* The version exists now (one trainer): answered inside the call. */
    if (st == PST_OK)
        st = ps_store_pull(lk->store, blk->id, step + 1, &lb->waiter, local_pulled, lb);
    lb->times.pull_end = pst_clock_s();
    done(arg, st, st == PST_OK ? NULL : pst_error_detail());
    return PST_OK;
}

static pst_status local_update_slice(tr_link *l, int b, uint64_t first, uint64_t n,
                                     const float *grad)
{
    tr_local *lk = (tr_local *)l;
    atomic_store(&lk->blocks[b].sliced, 1);
    return ps_store_update_slice(lk->store, l->plan->blocks[b].id, first, n, grad);
}

static pst_status local_vote(tr_link *l, long step, int overflow, int *skip)
{
    (void)l;
    (void)step;
    *skip = overflow != 0; /* one trainer: its own flag is the job's */
    return PST_OK;
}

static void local_times(const tr_link *l, int b, tr_exchange_times *out)
{
    *out = ((const tr_local *)l)->blocks[b].times;
}

static pst_status local_finish(tr_link *l, int early, long step, const char *reason)
{
    tr_local *lk = (tr_local *)l;
    (void)early;
    (void)step;
    (void)reason;
    if (l->checkpoint_step <= 0)
        return PST_OK;
    PST_TRY(ps_store_snapshot_now(lk->store, l->checkpoint_step));
    if (__atomic_load_n(&lk->ckpt_failed, __ATOMIC_ACQUIRE))
        return pst_error_set(PST_ERR_IO, "%s", lk->ckpt_error);
    return PST_OK;
}

/* The in-process table is the job's one shard (seg[0], seg[1]). */
static pst_status local_sparse_pull(tr_link *l, int table, long step, const uint64_t *keys,
                                    const size_t *seg, float *rows)
{
    return pst_sparse_pull(((tr_local *)l)->tables[table], keys, seg[1], step, rows);
}

static pst_status local_sparse_push(tr_link *l, int table, long step, const uint64_t *keys,
                                    const size_t *seg, const float *rows)
{
    tr_local *lk = (tr_local *)l;
    PST_TRY(pst_sparse_push(lk->tables[table], keys, seg[1], rows, step));
    return pst_sparse_step_done(lk->tables[table], lk->writers ? &lk->writers[table] : NULL,
                                l->checkpoint_every, step);
}

static void local_sparse_totals(tr_link *l, tr_sparse_totals *out)
{
    tr_local *lk = (tr_local *)l;
    *out = (tr_sparse_totals){0};
    for (int i = 0; lk->tables && i < lk->cfg.nsparse_tables; i++) {
        pst_sparse_stats s;
        pst_sparse_stats_of(lk->tables[i], &s);
        out->rows += s.rows;
        out->bytes += s.bytes;
        out->created += s.created;
        out->evicted += s.evicted;
        out->refused += s.refused;
        out->hash += pst_sparse_hash(lk->tables[i]);
    }
}

static void local_free(tr_link *l)
{
    tr_local *lk = (tr_local *)l;
    for (int i = 0; lk->tables && i < lk->cfg.nsparse_tables; i++)
        pst_sparse_free(lk->tables[i]);
    free(lk->tables);
    free(lk->writers);
    ps_store_free(lk->store);
    PST_FREE_ALL(lk->blocks, lk->specs, lk);
}

static const tr_link_ops local_ops = {
    .start = local_start,
    .exchange = local_exchange,
    .update_slice = local_update_slice,
    .vote = local_vote,
    .times = local_times,
    .finish = local_finish,
    .free = local_free,
    .sparse_pull = local_sparse_pull,
    .sparse_push = local_sparse_push,
    .sparse_totals = local_sparse_totals,
};

pst_status tr_local_init(tr_link **out, const tr_link_settings *cfg, const tr_plan *plan)
{
    *out = NULL;
    tr_local *lk = calloc(1, sizeof *lk);
    if (!lk || !(lk->blocks = calloc((size_t)plan->nblocks, sizeof *lk->blocks))) {
        free(lk);
        return pst_error_set(PST_ERR_NOMEM, "local store: out of memory");
    }
    lk->base = (tr_link){.ops = &local_ops, .plan = plan, .in_process = 1};
    lk->cfg = *cfg;
    for (int b = 0; b < plan->nblocks; b++)
        lk->blocks[b].elem = pst_dtype_size(cfg->precision);
    *out = &lk->base;
    return PST_OK;
}
