/* local.c — the in-process link (see local.h). */
#include "trainer/local.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "pserver/store.h"

typedef struct local_block {
    ps_pull_waiter waiter;
    float *dst;               /* where the exchange's values go (NULL: in place) */
    tr_exchange_times times;
} local_block;

typedef struct tr_local {
    tr_link base;             /* first: a tr_link * is a tr_local * */
    const pst_config *cfg;
    ps_store *store;
    local_block *blocks;      /* (nblocks) */
} tr_local;

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
    const ps_store_config sc = {.mode = PST_MODE_SYNC, .num_trainers = 1,
                                .optim = lk->cfg->optim, .blocks = specs,
                                .nblocks = p->nblocks, .values = homes, .pool = pool};
    /* The blocks tile the buffer in order, so params is the concatenation the store wants;
     * with homes the values are already there (the executor put them). */
    pst_status st = ps_store_init(&lk->store, &sc, homes ? NULL : params);
    free(specs);
    return st;
}

static void local_pulled(void *arg, pst_status st, const float *values, uint64_t length,
                         int64_t version)
{
    (void)version;
    local_block *lb = arg;
    if (st == PST_OK && lb->dst && lb->dst != values)
        memcpy(lb->dst, values, (size_t)length * sizeof(float));
}

static pst_status local_exchange(tr_link *l, int b, long step, const float *grad, float *dst,
                                 tr_exchange_fn done, void *arg)
{
    tr_local *lk = (tr_local *)l;
    local_block *lb = &lk->blocks[b];
    const tr_block *blk = &l->plan->blocks[b];
    int duplicate = 0;
    lb->times.push_start = pst_clock_s();
    pst_status st = ps_store_push_f32(lk->store, 0, step, blk->id, grad, blk->length, &duplicate);
    lb->times.push_end = lb->times.pull_start = pst_clock_s();
    if (st == PST_OK && duplicate) /* one pusher, one push per step: cannot happen */
        st = pst_error_set(PST_ERR_INTERNAL, "local store: step %ld of block %d pushed twice",
                           step, b);
    lb->dst = dst;
    /* The version exists now (one trainer): answered inside the call. */
    if (st == PST_OK)
        st = ps_store_pull(lk->store, blk->id, step + 1, &lb->waiter, local_pulled, lb);
    lb->times.pull_end = pst_clock_s();
    done(arg, st, st == PST_OK ? NULL : pst_error_detail());
    return PST_OK;
}

static void local_times(const tr_link *l, int b, tr_exchange_times *out)
{
    *out = ((const tr_local *)l)->blocks[b].times;
}

static pst_status local_finish(tr_link *l)
{
    (void)l;
    return PST_OK;
}

static void local_free(tr_link *l)
{
    tr_local *lk = (tr_local *)l;
    ps_store_free(lk->store);
    free(lk->blocks);
    free(lk);
}

static const tr_link_ops local_ops = {
    .start = local_start,
    .exchange = local_exchange,
    .times = local_times,
    .finish = local_finish,
    .free = local_free,
};

pst_status tr_local_init(tr_link **out, const pst_config *cfg, const tr_plan *plan)
{
    *out = NULL;
    tr_local *lk = calloc(1, sizeof *lk);
    if (!lk || !(lk->blocks = calloc((size_t)plan->nblocks, sizeof *lk->blocks))) {
        free(lk);
        return pst_error_set(PST_ERR_NOMEM, "local store: out of memory");
    }
    lk->base = (tr_link){.ops = &local_ops, .plan = plan, .in_process = 1};
    lk->cfg = cfg;
    *out = &lk->base;
    return PST_OK;
}
