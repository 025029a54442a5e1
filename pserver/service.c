/* service.c — Init/Push/Pull/Finish on the block store (see service.h).
 *
 * DESIGN: the handler runs on the gRPC server threads and never blocks: a Pull whose
 * version does not exist yet parks a pull context (with its ps_pull_waiter) in the store
 * and is answered by the thread whose push makes the version; an Init from trainer k > 0
 * that arrives before trainer 0's is parked on a list and answered when trainer 0's Init
 * has created the store. The service lock guards only the init state and the finish
 * count; pushes and pulls go straight to the store's per-block locks. */
#include "pserver/service.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dtype.h"
#include "common/log.h"
#include "common/nn/optim.h"
#include "pserver/store.h"

#define MAX_PARKED 4096

struct ps_service {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ps_store *store;              /* NULL until trainer 0's Init */
    uint64_t fingerprint;
    uint32_t num_trainers;
    int sync;                     /* sync mode: pulled values are stable until every trainer
                                     has read them (see answer_pull) */
    pst_dtype lowp;               /* trainer 0's precision: the store's copy (f32: none) */
    uint32_t *block_ids;          /* (nblock_ids) the blocks here, for the cast report */
    size_t nblock_ids;
    int casts_logged;             /* the cast report was written (once) */
    unsigned char *finished;      /* (num_trainers) */
    uint32_t nfinished;
    int all_finished;
    rpc_call *parked[MAX_PARKED]; /* Inits waiting for trainer 0's */
    int nparked;
    /* Pull contexts, recycled: the steady state allocates nothing per Pull. */
    pthread_mutex_t pull_mu;
    struct pull_ctx *pull_free;   /* contexts whose reply was sent, with their buffers */
    size_t pull_allocs;           /* contexts ever allocated (the most pulls in flight) */
    size_t pulls;                 /* Pull calls handled */
};

/* A pull in flight; back on svc->pull_free once its reply was sent (release_pull). */
typedef struct pull_ctx {
    ps_pull_waiter waiter;
    ps_service *svc;
    rpc_call *call;
    pst_dtype dtype;
    void *buf;                    /* cast or copy of the values (async or not f32) */
    size_t cap;                   /* bytes allocated at buf, kept across reuses */
    struct pull_ctx *next;        /* in svc->pull_free */
} pull_ctx;

pst_status ps_service_init(ps_service **out)
{
    ps_service *svc = calloc(1, sizeof *svc);
    if (!svc)
        return pst_error_set(PST_ERR_NOMEM, "pserver: out of memory");
    pthread_mutex_init(&svc->mu, NULL);
    pthread_cond_init(&svc->cv, NULL);
    pthread_mutex_init(&svc->pull_mu, NULL);
    *out = svc;
    return PST_OK;
}

void ps_service_free(ps_service *svc)
{
    if (!svc)
        return;
    ps_store_free(svc->store);
    free(svc->finished);
    free(svc->block_ids);
    PST_INFO("%zu Pull calls served with %zu pull contexts", svc->pulls, svc->pull_allocs);
    for (pull_ctx *p = svc->pull_free, *next; p; p = next) {
        next = p->next;
        free(p->buf);
        free(p);
    }
    pthread_mutex_destroy(&svc->pull_mu);
    pthread_mutex_destroy(&svc->mu);
    pthread_cond_destroy(&svc->cv);
    free(svc);
}

static void fail(rpc_call *call, pst_status st)
{
    PST_DEBUG("%s from %s failed: %s", rpc_method_name(rpc_call_method(call)),
              rpc_call_peer(call), pst_error_detail());
    rpc_call_fail(call, st, "%s", pst_error_detail());
}

/* ---- Init ----------------------------------------------------------------------------- */

static pst_status optim_from_wire(const Pstrain__OptimConfig *w, pst_optim_config *o)
{
    pst_optim_defaults(o);
    if (!w)
        return pst_error_set(PST_ERR_INVALID, "Init: no optimizer settings");
    if (pst_optim_kind_parse(w->kind, &o->kind) != 0)
        return pst_error_set(PST_ERR_INVALID, "Init: optimizer \"%s\" unknown (example: momentum)",
                             w->kind);
    if (pst_lr_schedule_parse(w->schedule, &o->schedule) != 0)
        return pst_error_set(PST_ERR_INVALID, "Init: lr schedule \"%s\" unknown (example: constant)",
                             w->schedule);
    o->lr = w->lr;
    o->momentum = w->momentum;
    o->beta1 = w->beta1;
    o->beta2 = w->beta2;
    o->eps = w->eps;
    o->weight_decay = w->weight_decay;
    o->warmup_steps = w->warmup_steps;
    o->total_steps = w->total_steps;
    o->min_lr = w->min_lr;
    return PST_OK;
}

/* Creates the store from trainer 0's Init. Called with svc->mu held. */
static pst_status create_store(ps_service *svc, rpc_call *call)
{
    const Pstrain__InitRequest *req = (const Pstrain__InitRequest *)rpc_call_request(call);
    const rpc_payload *pl = rpc_call_payload(call);
    ps_block_spec *blocks = NULL;
    float *initial = NULL;
    pst_status st;
    if (req->num_trainers < 1 || req->num_trainers > 4096)
        return pst_error_set(PST_ERR_INVALID, "Init: num_trainers %u out of range 1..4096",
                             req->num_trainers);
    ps_store_config sc = {.mode = req->mode == PSTRAIN__MODE__ASYNC ? PST_MODE_ASYNC : PST_MODE_SYNC,
                          .num_trainers = (int)req->num_trainers,
                          .nblocks = (int)req->n_blocks};
    if ((st = optim_from_wire(req->optim, &sc.optim)) != PST_OK)
        return st;
    if (rpc_dtype_from_wire(req->precision, &sc.lowp) != PST_OK)
        return pst_error_set(PST_ERR_INVALID, "Init from trainer 0: precision %d is not F32, "
                             "F16 or BF16", (int)req->precision);
    uint64_t total = 0;
    blocks = calloc(req->n_blocks ? req->n_blocks : 1, sizeof *blocks);
    if (!blocks)
        return pst_error_set(PST_ERR_NOMEM, "Init: out of memory for %zu blocks", req->n_blocks);
    for (size_t i = 0; i < req->n_blocks; i++) {
        const Pstrain__BlockSpec *b = req->blocks[i];
        if (b->length == 0 || b->length > (1ull << 32) || b->offset + b->length > req->total_params) {
            st = pst_error_set(PST_ERR_INVALID, "Init: block %u [%llu, +%llu) outside the %llu "
                               "parameters", b->id, (unsigned long long)b->offset,
                               (unsigned long long)b->length, (unsigned long long)req->total_params);
            goto out;
        }
        blocks[i] = (ps_block_spec){.id = b->id, .offset = b->offset, .length = b->length};
        total += b->length;
    }
    if ((st = rpc_payload_check(pl, PST_F32, total)) != PST_OK) {
        st = pst_error_wrap(st, "Init from trainer 0: initial values");
        goto out;
    }
    initial = malloc(sizeof(float) * (total ? total : 1));
    if (!initial) {
        st = pst_error_set(PST_ERR_NOMEM, "Init: out of memory for %llu values",
                           (unsigned long long)total);
        goto out;
    }
    if (total && (st = rpc_payload_read_f32(pl, PST_F32, 0, initial, total)) != PST_OK)
        goto out;
    sc.blocks = blocks;
    if ((st = ps_store_init(&svc->store, &sc, initial)) != PST_OK)
        goto out;
    svc->finished = calloc(req->num_trainers, 1);
    svc->block_ids = malloc((req->n_blocks ? req->n_blocks : 1) * sizeof *svc->block_ids);
    if (!svc->finished || !svc->block_ids) {
        free(svc->finished);
        free(svc->block_ids);
        svc->finished = NULL;
        svc->block_ids = NULL;
        ps_store_free(svc->store);
        svc->store = NULL;
        st = pst_error_set(PST_ERR_NOMEM, "Init: out of memory");
        goto out;
    }
    svc->fingerprint = req->fingerprint;
    svc->num_trainers = req->num_trainers;
    svc->sync = sc.mode == PST_MODE_SYNC;
    svc->lowp = sc.lowp;
    for (size_t i = 0; i < req->n_blocks; i++)
        svc->block_ids[i] = blocks[i].id;
    svc->nblock_ids = req->n_blocks;
    PST_INFO("initialized by trainer 0: %zu blocks, %llu parameters here (of %llu), %u "
             "trainers, %s, optimizer %s lr %g, precision %s", req->n_blocks,
             (unsigned long long)total, (unsigned long long)req->total_params,
             req->num_trainers, sc.mode == PST_MODE_ASYNC ? "async" : "sync", req->optim->kind,
             req->optim->lr, pst_dtype_name(sc.lowp));
out:
    free(blocks);
    free(initial);
    return st;
}

/* Answers an Init once the store exists. Called with svc->mu held. */
static void answer_init(ps_service *svc, rpc_call *call)
{
    const Pstrain__InitRequest *req = (const Pstrain__InitRequest *)rpc_call_request(call);
    if (req->trainer_id >= svc->num_trainers) {
        fail(call, pst_error_set(PST_ERR_INVALID, "Init: trainer id %u but trainer 0 said there "
                                 "are %u trainers", req->trainer_id, svc->num_trainers));
        return;
    }
    /* Before the fingerprint, which may cover the precision too: this names the cause. */
    pst_dtype precision;
    if (rpc_dtype_from_wire(req->precision, &precision) != PST_OK) {
        fail(call, pst_error_set(PST_ERR_INVALID, "Init: trainer %u's precision %d is not F32, "
                                 "F16 or BF16", req->trainer_id, (int)req->precision));
        return;
    }
    if (precision != svc->lowp) {
        fail(call, pst_error_set(PST_ERR_INVALID, "Init: trainer %u's precision %s differs from "
                                 "trainer 0's %s: start every trainer with the same precision",
                                 req->trainer_id, pst_dtype_name(precision),
                                 pst_dtype_name(svc->lowp)));
        return;
    }
    if (req->fingerprint != svc->fingerprint || req->num_trainers != svc->num_trainers) {
        fail(call, pst_error_set(PST_ERR_MISMATCH,
                                 "Init: trainer %u's block plan or settings differ from trainer "
                                 "0's (fingerprint %016llx vs %016llx, %u vs %u trainers): start "
                                 "every trainer with the same flags", req->trainer_id,
                                 (unsigned long long)req->fingerprint,
                                 (unsigned long long)svc->fingerprint, req->num_trainers,
                                 svc->num_trainers));
        return;
    }
    int64_t version = 0;
    if (ps_store_nblocks(svc->store) > 0) {
        /* Version of the first block this pserver owns (all move together in sync mode). */
        const Pstrain__InitRequest *r = req;
        version = r->n_blocks ? ps_store_version(svc->store, r->blocks[0]->id) : 0;
    }
    Pstrain__InitReply reply = PSTRAIN__INIT_REPLY__INIT;
    reply.version = version;
    rpc_call_reply(call, &reply.base, NULL, 0, NULL, NULL);
}

static void handle_init(ps_service *svc, rpc_call *call)
{
    const Pstrain__InitRequest *req = (const Pstrain__InitRequest *)rpc_call_request(call);
    pthread_mutex_lock(&svc->mu);
    if (!svc->store) {
        if (req->trainer_id != 0) {
            if (svc->nparked == MAX_PARKED) {
                pthread_mutex_unlock(&svc->mu);
                fail(call, pst_error_set(PST_ERR_UNAVAILABLE, "Init: too many trainers waiting "
                                         "for trainer 0's Init"));
                return;
            }
            svc->parked[svc->nparked++] = call; /* answered after trainer 0's Init */
            pthread_mutex_unlock(&svc->mu);
            return;
        }
        pst_status st = create_store(svc, call);
        if (st != PST_OK) {
            pthread_mutex_unlock(&svc->mu);
            fail(call, st);
            return;
        }
        answer_init(svc, call);
        for (int i = 0; i < svc->nparked; i++)
            answer_init(svc, svc->parked[i]);
        svc->nparked = 0;
    } else {
        answer_init(svc, call);
    }
    pthread_mutex_unlock(&svc->mu);
}

/* ---- Push ----------------------------------------------------------------------------- */

typedef struct push_fill {
    const rpc_payload *payload;
    pst_dtype dtype;
} push_fill;

static pst_status fill_from_payload(void *arg, float *dst, uint64_t first, uint64_t length)
{
    push_fill *f = arg;
    return rpc_payload_read_f32(f->payload, f->dtype, first, dst, length);
}

static ps_store *store_or_fail(ps_service *svc, rpc_call *call)
{
    pthread_mutex_lock(&svc->mu);
    ps_store *st = svc->store;
    pthread_mutex_unlock(&svc->mu);
    if (!st)
        fail(call, pst_error_set(PST_ERR_STATE, "%s before Init: this pserver has no blocks yet",
                                 rpc_method_name(rpc_call_method(call))));
    return st;
}

static void handle_push(ps_service *svc, rpc_call *call)
{
    const Pstrain__PushRequest *req = (const Pstrain__PushRequest *)rpc_call_request(call);
    ps_store *store = store_or_fail(svc, call);
    if (!store)
        return;
    push_fill f = {.payload = rpc_call_payload(call)};
    pst_status st = rpc_dtype_from_wire(req->dtype, &f.dtype);
    if (st == PST_OK)
        st = rpc_payload_check(f.payload, f.dtype, req->length);
    int dup = 0;
    if (st == PST_OK)
        st = ps_store_push(store, req->trainer_id, req->step, req->block, req->length,
                           fill_from_payload, &f, &dup);
    if (st != PST_OK) {
        fail(call, st);
        return;
    }
    Pstrain__PushReply reply = PSTRAIN__PUSH_REPLY__INIT;
    reply.duplicate = dup != 0;
    rpc_call_reply(call, &reply.base, NULL, 0, NULL, NULL);
}

/* ---- Pull ----------------------------------------------------------------------------- */

/* A context from the free list, or a new one when every context is in flight. */
static pull_ctx *pull_get(ps_service *svc, rpc_call *call)
{
    pthread_mutex_lock(&svc->pull_mu);
    pull_ctx *p = svc->pull_free;
    if (p)
        svc->pull_free = p->next;
    else
        svc->pull_allocs++; /* counts a failed calloc too: it is the caller's NOMEM */
    svc->pulls++;
    pthread_mutex_unlock(&svc->pull_mu);
    if (!p && !(p = calloc(1, sizeof *p)))
        return NULL;
    void *buf = p->buf;
    size_t cap = p->cap;
    memset(p, 0, sizeof *p);
    p->buf = buf;
    p->cap = cap;
    p->svc = svc;
    p->call = call;
    return p;
}

/* The payload release of a Pull reply (or the end of a failed pull): back to the list. */
static void release_pull(void *arg)
{
    pull_ctx *p = arg;
    ps_service *svc = p->svc;
    pthread_mutex_lock(&svc->pull_mu);
    p->next = svc->pull_free;
    svc->pull_free = p;
    pthread_mutex_unlock(&svc->pull_mu);
}

static Pstrain__DType dtype_to_wire(pst_dtype t)
{
    return t == PST_F16 ? PSTRAIN__DTYPE__F16 : t == PST_BF16 ? PSTRAIN__DTYPE__BF16
                                                              : PSTRAIN__DTYPE__F32;
}

/* Runs with the block's lock held (store contract): copy out, then send. */
static void answer_pull(void *arg, pst_status st, const float *values, const void *lowp,
                        uint64_t length, int64_t version)
{
    pull_ctx *p = arg;
    const Pstrain__PullRequest *req = (const Pstrain__PullRequest *)rpc_call_request(p->call);
    if (st != PST_OK) {
        rpc_call_fail(p->call, st, "%s", pst_error_detail());
        release_pull(p);
        return;
    }
    size_t bytes = (size_t)length * pst_dtype_size(p->dtype);
    Pstrain__PullReply reply = PSTRAIN__PULL_REPLY__INIT;
    reply.block = req->block;
    reply.version = version;
    reply.dtype = dtype_to_wire(p->dtype);
    reply.length = length;
    /* The store's low-precision copy of this version, when it is in the dtype wanted. */
    const void *src = p->dtype == PST_F32 ? (const void *)values
                      : lowp && p->dtype == p->svc->lowp ? lowp : NULL;
    if (p->svc->sync && src) {
        /* Zero copy: in sync mode a block's values (and their low-precision copy) change
         * only when every trainer has pushed the next step, and a trainer pushes it only
         * after it has received this version, so they stay put while gRPC sends them from
         * the store. */
        rpc_call_reply(p->call, &reply.base, src, bytes, release_pull, p);
        return;
    }
    if (p->cap < bytes) {
        void *buf = realloc(p->buf, bytes);
        if (!buf) {
            rpc_call_fail(p->call, PST_ERR_NOMEM, "Pull: out of memory for %zu bytes", bytes);
            release_pull(p);
            return;
        }
        p->buf = buf;
        p->cap = bytes;
    }
    if (src)
        memcpy(p->buf, src, bytes); /* async: the next push may update the block */
    else
        pst_cast(p->buf, p->dtype, values, PST_F32, length); /* a dtype the store has no copy in */
    rpc_call_reply(p->call, &reply.base, p->buf, bytes, release_pull, p);
}

static void handle_pull(ps_service *svc, rpc_call *call)
{
    const Pstrain__PullRequest *req = (const Pstrain__PullRequest *)rpc_call_request(call);
    ps_store *store = store_or_fail(svc, call);
    if (!store)
        return;
    pull_ctx *p = pull_get(svc, call);
    if (!p) {
        fail(call, pst_error_set(PST_ERR_NOMEM, "Pull: out of memory"));
        return;
    }
    pst_status st = rpc_dtype_from_wire(req->dtype, &p->dtype);
    if (st == PST_OK)
        st = ps_store_pull(store, req->block, req->version, &p->waiter, answer_pull, p);
    if (st != PST_OK) {
        release_pull(p);
        fail(call, st);
    }
}

/* ---- Finish --------------------------------------------------------------------------- */

/* The one INFO line on the low-precision copy's casts (nothing without a copy). Optimizer
 * steps are the highest block version (sync: every block makes each step). */
static void log_casts(ps_service *svc)
{
    pthread_mutex_lock(&svc->mu);
    ps_store *store = svc->store;
    int first = store && svc->lowp != PST_F32 && !svc->casts_logged;
    svc->casts_logged |= first;
    pthread_mutex_unlock(&svc->mu);
    if (!first)
        return;
    int64_t steps = 0;
    for (size_t i = 0; i < svc->nblock_ids; i++) {
        int64_t v = ps_store_version(store, svc->block_ids[i]);
        steps = v > steps ? v : steps;
    }
    uint64_t casts = ps_store_cast_count(store);
    PST_INFO("casts: %llu elements to %s in %lld optimizer steps (%llu per step), %llu "
             "parameters owned", (unsigned long long)casts, pst_dtype_name(svc->lowp),
             (long long)steps, (unsigned long long)(steps > 0 ? casts / (uint64_t)steps : 0),
             (unsigned long long)ps_store_total_length(store));
}

uint64_t ps_service_cast_count(ps_service *svc)
{
    pthread_mutex_lock(&svc->mu);
    ps_store *store = svc->store;
    pthread_mutex_unlock(&svc->mu);
    return store ? ps_store_cast_count(store) : 0;
}

static void handle_finish(ps_service *svc, rpc_call *call)
{
    const Pstrain__FinishRequest *req = (const Pstrain__FinishRequest *)rpc_call_request(call);
    pthread_mutex_lock(&svc->mu);
    if (!svc->store || req->trainer_id >= svc->num_trainers) {
        pthread_mutex_unlock(&svc->mu);
        fail(call, pst_error_set(svc->store ? PST_ERR_INVALID : PST_ERR_STATE,
                                 "Finish from trainer %u: %s", req->trainer_id,
                                 svc->store ? "no such trainer" : "before Init"));
        return;
    }
    int first = !svc->finished[req->trainer_id];
    if (first) {
        svc->finished[req->trainer_id] = 1;
        svc->nfinished++;
        PST_INFO("trainer %u finished (%u of %u)", req->trainer_id, svc->nfinished,
                 svc->num_trainers);
    }
    int all = svc->nfinished == svc->num_trainers;
    pthread_mutex_unlock(&svc->mu);
    /* Reply before reporting "all finished": main() fails every call still unanswered when
     * it shuts the server down. */
    Pstrain__FinishReply reply = PSTRAIN__FINISH_REPLY__INIT;
    rpc_call_reply(call, &reply.base, NULL, 0, NULL, NULL);
    if (all) {
        log_casts(svc);
        pthread_mutex_lock(&svc->mu);
        svc->all_finished = 1;
        pthread_cond_broadcast(&svc->cv);
        pthread_mutex_unlock(&svc->mu);
    }
}

void ps_service_handle(void *arg, rpc_call *call)
{
    ps_service *svc = arg;
    switch (rpc_call_method(call)) {
    case RPC_METHOD_INIT:
        handle_init(svc, call);
        break;
    case RPC_METHOD_PUSH:
        handle_push(svc, call);
        break;
    case RPC_METHOD_PULL:
        handle_pull(svc, call);
        break;
    case RPC_METHOD_FINISH:
        handle_finish(svc, call);
        break;
    default:
        fail(call, pst_error_set(PST_ERR_NOT_FOUND, "unknown method"));
    }
}

int ps_service_wait(ps_service *svc, volatile int *stop)
{
    pthread_mutex_lock(&svc->mu);
    while (!svc->all_finished && !*stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&svc->cv, &svc->mu, &ts);
    }
    int done = svc->all_finished;
    pthread_mutex_unlock(&svc->mu);
    return done;
}

void ps_service_cancel(ps_service *svc)
{
    pthread_mutex_lock(&svc->mu);
    for (int i = 0; i < svc->nparked; i++)
        rpc_call_fail(svc->parked[i], PST_ERR_UNAVAILABLE, "pserver shutting down");
    svc->nparked = 0;
    ps_store *store = svc->store;
    pthread_mutex_unlock(&svc->mu);
    if (store)
        ps_store_cancel_waiters(store, PST_ERR_UNAVAILABLE);
    log_casts(svc); /* at shutdown, unless every trainer's Finish has written it */
}
