/* remote.c — the distributed updater (see remote.h).
 *
 * DESIGN: one context per block holds the block's Push and Pull request headers, so a
 * step allocates nothing. A counter of outstanding callbacks (push done, push payload
 * released, pull done) under one mutex is what the step waits on; the first error is
 * kept with its detail and returned once every outstanding call has ended (each has a
 * deadline, so the wait is bounded). */
#include "trainer/remote.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "rpc/client.h"
#include "rpc/global.h"
#include "trainer/plan.h"

typedef struct remote_updater remote_updater;

typedef struct block_ctx {
    remote_updater *u;
    const tr_block *b;
    Pstrain__PushRequest push;
    Pstrain__PullRequest pull;
} block_ctx;

struct remote_updater {
    const pst_config *cfg;
    tr_plan plan;
    rpc_client *client;
    int rpc_inited;
    block_ctx *blocks;           /* (plan.nblocks) */
    float *params;               /* the buffer pulls write into during a step */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long pending;
    pst_status err;
    char err_detail[512];
};

static void record_error(remote_updater *u, pst_status st, const char *detail)
{
    pthread_mutex_lock(&u->mu);
    if (u->err == PST_OK) {
        u->err = st;
        snprintf(u->err_detail, sizeof u->err_detail, "%s", detail);
    }
    pthread_mutex_unlock(&u->mu);
}

static void done_one(remote_updater *u)
{
    pthread_mutex_lock(&u->mu);
    if (--u->pending == 0)
        pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
}

static void add_pending(remote_updater *u, long n)
{
    pthread_mutex_lock(&u->mu);
    u->pending += n;
    pthread_mutex_unlock(&u->mu);
}

/* Waits for every outstanding callback; returns the first error of the batch. */
static pst_status wait_all(remote_updater *u)
{
    pthread_mutex_lock(&u->mu);
    while (u->pending > 0)
        pthread_cond_wait(&u->cv, &u->mu);
    pst_status st = u->err;
    u->err = PST_OK;
    pthread_mutex_unlock(&u->mu);
    if (st != PST_OK)
        pst_error_set(st, "%s", u->err_detail);
    return st;
}

static void release_one(void *arg)
{
    done_one(((block_ctx *)arg)->u);
}

/* Starts a call whose done callback (and release, when `payload_bytes` > 0) will call
 * done_one(); a call that is not accepted is accounted here. */
static void start_call(remote_updater *u, int server, rpc_method m, const ProtobufCMessage *req,
                       const void *payload, size_t bytes, rpc_release_fn release, rpc_done_fn done,
                       void *arg)
{
    add_pending(u, bytes && release ? 2 : 1);
    pst_status st = rpc_client_call_async(u->client, server, m, req, payload, bytes, release,
                                          done, arg);
    if (st != PST_OK) {
        record_error(u, st, pst_error_detail());
        done_one(u); /* done never runs; the release already has */
    }
}

/* ---- Pull ----------------------------------------------------------------------------- */

static void pull_done(void *arg, pst_status st, const char *detail, const ProtobufCMessage *reply,
                      const rpc_payload *payload)
{
    block_ctx *c = arg;
    remote_updater *u = c->u;
    if (st == PST_OK) {
        const Pstrain__PullReply *r = (const Pstrain__PullReply *)reply;
        pst_dtype dt;
        st = rpc_dtype_from_wire(r->dtype, &dt);
        if (st == PST_OK && r->length != c->b->length)
            st = pst_error_set(PST_ERR_FORMAT, "pull of block %u from %s: %llu values, expected %zu",
                               c->b->id, rpc_client_server(u->client, c->b->pserver),
                               (unsigned long long)r->length, c->b->length);
        if (st == PST_OK)
            st = rpc_payload_read_f32(payload, dt, 0, u->params + c->b->offset, c->b->length);
        if (st != PST_OK)
            record_error(u, st, pst_error_detail());
    } else {
        record_error(u, st, detail);
    }
    done_one(u);
}

static void start_pull(block_ctx *c, int64_t version)
{
    c->pull.version = version;
    start_call(c->u, c->b->pserver, RPC_METHOD_PULL, &c->pull.base, NULL, 0, NULL, pull_done, c);
}

/* ---- Push ----------------------------------------------------------------------------- */

static void push_done(void *arg, pst_status st, const char *detail, const ProtobufCMessage *reply,
                      const rpc_payload *payload)
{
    block_ctx *c = arg;
    (void)reply;
    (void)payload;
    if (st != PST_OK)
        record_error(c->u, st, detail);
    else if (c->u->cfg->mode == PST_MODE_ASYNC)
        start_pull(c, 0);
    done_one(c->u);
}

static pst_status remote_update(void *self, long step, float *params, const float *grads,
                                size_t n)
{
    remote_updater *u = self;
    if (n != u->plan.nparams)
        return pst_error_set(PST_ERR_INTERNAL, "update of %zu params with a plan for %zu", n,
                             u->plan.nparams);
    u->params = params;
    /* Last block first: backward finishes the end of the buffer first. */
    for (int i = u->plan.nblocks - 1; i >= 0; i--) {
        block_ctx *c = &u->blocks[i];
        c->push.step = step;
        start_call(u, c->b->pserver, RPC_METHOD_PUSH, &c->push.base, grads + c->b->offset,
                   c->b->length * sizeof(float), release_one, push_done, c);
        if (u->cfg->mode == PST_MODE_SYNC)
            start_pull(c, step + 1);
    }
    return wait_all(u);
}

/* ---- Init / Finish -------------------------------------------------------------------- */

static uint64_t settings_fingerprint(const remote_updater *u)
{
    const pst_config *c = u->cfg;
    const pst_optim_config *o = &c->optim;
    uint64_t h = tr_plan_fingerprint(&u->plan, 0);
    int64_t ints[6] = {c->mode, c->trainers, o->kind, o->schedule, o->warmup_steps, o->total_steps};
    float floats[8] = {o->lr, o->momentum, o->beta1, o->beta2, o->eps, o->weight_decay, o->min_lr, 0};
    h = tr_fnv1a(h, ints, sizeof ints);
    return tr_fnv1a(h, floats, sizeof floats);
}

typedef struct init_call {
    block_ctx base; /* .u only */
    Pstrain__InitRequest req;
    Pstrain__BlockSpec *specs;
    Pstrain__BlockSpec **spec_ptrs;
    Pstrain__OptimConfig optim;
    float *initial;
} init_call;

static void init_done(void *arg, pst_status st, const char *detail, const ProtobufCMessage *reply,
                      const rpc_payload *payload)
{
    init_call *ic = arg;
    (void)payload;
    if (st != PST_OK) {
        record_error(ic->base.u, st, detail);
    } else if (((const Pstrain__InitReply *)reply)->version != 0 &&
               (ic->base.u->cfg->mode == PST_MODE_SYNC || ic->base.u->cfg->trainer_id == 0)) {
        /* A fresh job starts at version 0. In async mode trainer 0 may already have pushed
         * when a later trainer joins, so only trainer 0 (and sync mode) can tell. */
        char d[256];
        snprintf(d, sizeof d, "pserver already holds version %lld of its blocks: a finished or "
                 "running job's pservers; restart them (resuming is not supported yet)",
                 (long long)((const Pstrain__InitReply *)reply)->version);
        record_error(ic->base.u, PST_ERR_STATE, d);
    }
    done_one(ic->base.u);
}

static pst_status remote_start(void *self, float *params, size_t n)
{
    remote_updater *u = self;
    const pst_config *cfg = u->cfg;
    const int S = cfg->num_pservers;
    pst_status st;
    if ((st = tr_plan_build(&u->plan, n, cfg->block_bytes, S, 1)) != PST_OK)
        return st;
    u->blocks = calloc((size_t)u->plan.nblocks, sizeof *u->blocks);
    init_call *calls = calloc((size_t)S, sizeof *calls);
    if (!u->blocks || !calls) {
        free(calls);
        return pst_error_set(PST_ERR_NOMEM, "trainer: out of memory for the block plan");
    }
    for (int i = 0; i < u->plan.nblocks; i++) {
        block_ctx *c = &u->blocks[i];
        c->u = u;
        c->b = &u->plan.blocks[i];
        pstrain__push_request__init(&c->push);
        c->push.trainer_id = (uint32_t)cfg->trainer_id;
        c->push.block = c->b->id;
        c->push.dtype = PSTRAIN__DTYPE__F32;
        c->push.length = c->b->length;
        pstrain__pull_request__init(&c->pull);
        c->pull.block = c->b->id;
        c->pull.dtype = PSTRAIN__DTYPE__F32;
    }

    rpc_global_init();
    u->rpc_inited = 1;
    const char *addrs[PST_MAX_PSERVERS];
    for (int s = 0; s < S; s++)
        addrs[s] = cfg->pservers[s];
    rpc_client_config cc = {.servers = addrs, .num_servers = S,
                            .call_timeout_ms = (int)cfg->rpc_timeout_ms,
                            .connect_timeout_ms = cfg->connect_timeout_ms > 0 ? (int)cfg->connect_timeout_ms : -1};
    if ((st = rpc_client_init(&u->client, &cc)) != PST_OK)
        goto out;

    uint64_t fp = settings_fingerprint(u);
    for (int s = 0; s < S; s++) {
        init_call *ic = &calls[s];
        ic->base.u = u;
        size_t nb = 0, total = 0;
        for (int i = 0; i < u->plan.nblocks; i++)
            if (u->plan.blocks[i].pserver == s)
                nb++;
        ic->specs = calloc(nb ? nb : 1, sizeof *ic->specs);
        ic->spec_ptrs = calloc(nb ? nb : 1, sizeof *ic->spec_ptrs);
        ic->initial = cfg->trainer_id == 0 ? malloc(sizeof(float) * (u->plan.pserver_elems[s] + 1)) : NULL;
        if (!ic->specs || !ic->spec_ptrs || (cfg->trainer_id == 0 && !ic->initial)) {
            st = pst_error_set(PST_ERR_NOMEM, "trainer: out of memory for Init");
            goto out;
        }
        size_t k = 0;
        for (int i = 0; i < u->plan.nblocks; i++) {
            const tr_block *b = &u->plan.blocks[i];
            if (b->pserver != s)
                continue;
            pstrain__block_spec__init(&ic->specs[k]);
            ic->specs[k].id = b->id;
            ic->specs[k].offset = b->offset;
            ic->specs[k].length = b->length;
            ic->spec_ptrs[k] = &ic->specs[k];
            if (ic->initial)
                memcpy(ic->initial + total, params + b->offset, b->length * sizeof(float));
            total += b->length;
            k++;
        }
        pstrain__init_request__init(&ic->req);
        pstrain__optim_config__init(&ic->optim);
        ic->optim.kind = (char *)pst_optim_kind_name(cfg->optim.kind);
        ic->optim.lr = cfg->optim.lr;
        ic->optim.momentum = cfg->optim.momentum;
        ic->optim.beta1 = cfg->optim.beta1;
        ic->optim.beta2 = cfg->optim.beta2;
        ic->optim.eps = cfg->optim.eps;
        ic->optim.weight_decay = cfg->optim.weight_decay;
        ic->optim.schedule = (char *)pst_lr_schedule_name(cfg->optim.schedule);
        ic->optim.warmup_steps = cfg->optim.warmup_steps;
        ic->optim.total_steps = cfg->optim.total_steps;
        ic->optim.min_lr = cfg->optim.min_lr;
        ic->req.trainer_id = (uint32_t)cfg->trainer_id;
        ic->req.num_trainers = (uint32_t)cfg->trainers;
        ic->req.mode = cfg->mode == PST_MODE_ASYNC ? PSTRAIN__MODE__ASYNC : PSTRAIN__MODE__SYNC;
        ic->req.total_params = n;
        ic->req.n_blocks = nb;
        ic->req.blocks = ic->spec_ptrs;
        ic->req.optim = &ic->optim;
        ic->req.fingerprint = fp;
        start_call(u, s, RPC_METHOD_INIT, &ic->req.base, ic->initial,
                   ic->initial ? total * sizeof(float) : 0, ic->initial ? release_one : NULL,
                   init_done, ic);
    }
    if ((st = wait_all(u)) != PST_OK)
        goto out;
    /* Everyone starts from the pservers' values (trainer 0's). */
    u->params = params;
    for (int i = 0; i < u->plan.nblocks; i++)
        start_pull(&u->blocks[i], 0);
    st = wait_all(u);
    PST_INFO("joined %d pserver(s): %d blocks of up to %zu bytes, %s mode, %d trainers", S,
             u->plan.nblocks, cfg->block_bytes, pst_mode_name(cfg->mode), cfg->trainers);
out:
    for (int s = 0; s < S; s++) {
        free(calls[s].specs);
        free(calls[s].spec_ptrs);
        free(calls[s].initial);
    }
    free(calls);
    return st;
}

static void finish_done(void *arg, pst_status st, const char *detail, const ProtobufCMessage *reply,
                        const rpc_payload *payload)
{
    (void)reply;
    (void)payload;
    if (st != PST_OK)
        record_error(arg, st, detail);
    done_one(arg);
}

static pst_status remote_finish(void *self)
{
    remote_updater *u = self;
    if (!u->client)
        return PST_OK;
    Pstrain__FinishRequest req = PSTRAIN__FINISH_REQUEST__INIT;
    req.trainer_id = (uint32_t)u->cfg->trainer_id;
    for (int s = 0; s < u->cfg->num_pservers; s++) {
        add_pending(u, 1);
        pst_status st = rpc_client_call_async(u->client, s, RPC_METHOD_FINISH, &req.base, NULL, 0,
                                              NULL, finish_done, u);
        if (st != PST_OK) {
            record_error(u, st, pst_error_detail());
            done_one(u);
        }
    }
    /* Training is complete and its result stands; a pserver that is already gone (its
     * other trainers finished first) is worth a warning, not a failure. */
    if (wait_all(u) != PST_OK)
        PST_WARN("Finish: %s", pst_error_detail());
    return PST_OK;
}

pst_status tr_remote_updater_init(tr_updater *out, const pst_config *cfg)
{
    memset(out, 0, sizeof *out);
    remote_updater *u = calloc(1, sizeof *u);
    if (!u)
        return pst_error_set(PST_ERR_NOMEM, "trainer: out of memory");
    u->cfg = cfg;
    pthread_mutex_init(&u->mu, NULL);
    pthread_cond_init(&u->cv, NULL);
    out->self = u;
    out->start = remote_start;
    out->update = remote_update;
    out->finish = remote_finish;
    return PST_OK;
}

void tr_remote_updater_free(tr_updater *upd)
{
    if (!upd || !upd->self)
        return;
    remote_updater *u = upd->self;
    rpc_client_free(u->client);
    if (u->rpc_inited)
        rpc_global_shutdown();
    tr_plan_free(&u->plan);
    free(u->blocks);
    pthread_mutex_destroy(&u->mu);
    pthread_cond_destroy(&u->cv);
    free(u);
    upd->self = NULL;
}
