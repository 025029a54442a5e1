/* service.c — Init/Push/Pull/Finish on the block store (see service.h).
 *
 * DESIGN: the handler runs on the gRPC server threads and never blocks: a Pull whose
 * version does not exist yet parks a pull context (with its ps_pull_waiter) in the store
 * and is answered by the thread whose push makes the version; an Init from trainer k > 0
 * that arrives before trainer 0's is parked on a list and answered when trainer 0's Init
 * has created the store. The service lock guards only the init state and the finish
 * count; pushes and pulls go straight to the store's per-block locks. */
#include "pserver/service.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/dtype.h"
#include "common/memory.h"
#include "common/prom.h"
#include "common/log.h"
#include "common/optim.h"
#include "pserver/shard.h"
#include "pserver/store.h"
#include "pserver/tables.h"
#include "rpc/shm.h"

#define MAX_PARKED 4096
#define PS_MAX_BLOCKS (1 << 20) /* blocks per pserver (an Init with more is refused) */
#define PULL_SLACK 1024         /* pulls in flight beyond 2 per trainer and block */
/* A parked Init is answered this long before its client's deadline (ps_service_wait looks
 * every 100 ms), so the trainer learns that trainer 0 never came instead of a bare
 * "no reply" that blames the pserver. */
#define INIT_ANSWER_MARGIN_MS 1000

/* fp16 loss scaling: the votes of one step (see handle_vote). Two, by step parity: a
 * trainer that has its answer for step s may vote s+1 while others still wait for s. */
typedef struct vote_slot {
    int64_t step;                 /* -1: never used */
    uint32_t count;               /* trainers that voted */
    int overflow;                 /* the OR of their votes */
    int decided;                  /* every trainer voted: `overflow` is the answer */
    unsigned char *voted;         /* (num_trainers) */
    rpc_call **calls;             /* (2 num_trainers) waiting for the answer (retries too) */
    int ncalls;
} vote_slot;

struct ps_service {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ps_store *store;              /* NULL until trainer 0's Init */
    ps_tables *tables;            /* the job's sparse tables: made with the store */
    uint64_t fingerprint;
    uint32_t num_trainers;
    int sync;                     /* sync mode: pulled values are stable until every trainer
                                     has read them (see answer_pull) */
    pst_dtype lowp;               /* trainer 0's precision: the store's copy (f32: none) */
    uint32_t *block_ids;          /* (nblock_ids) the blocks here, for the cast report */
    ps_block_spec *specs;         /* (nblock_ids) trainer 0's list: later Inits must match */
    size_t nblock_ids;
    int casts_logged;             /* the cast report was written (once) */
    unsigned char *finished;      /* (num_trainers) */
    rpc_call **watch;             /* (num_trainers) each trainer's open Watch, or NULL */
    int stop_asked;               /* trainer 0 is to be told to stop (ps_service_request_stop)
                                   * when it next watches */
    uint32_t nfinished;
    int all_finished;
    rpc_call *parked[MAX_PARKED]; /* Inits waiting for trainer 0's */
    int nparked;
    vote_slot votes[2];           /* by step parity (allocated with the store) */
    char departed[512];           /* why the job cannot complete (a trainer left early) */
    int departed_set;             /* atomic: departed is written and final */
    long skipped;                 /* steps every trainer skipped (a vote said overflow) */
    long withdrawn;               /* waiting Inits and Votes whose client gave up */
    /* --on-failure wait (ps_service_on_failure) */
    int wait_mode;                /* a departed job makes ps_service_wait return */
    long peer_timeout_ms;
    unsigned char *joined;        /* (num_trainers) its Init was answered by this store */
    double *let_go_at;            /* (num_trainers) pst_clock_s() when handle_finish let it
                                   * go before its first step (0: not); NULL until then */
    double departed_at;           /* pst_clock_s() of the departure */
    double init_by;               /* > 0: no store by then is fatal (the recovery timeout) */
    char fatal[1200];             /* why the pserver gives up (ps_service_failure) */
    int fatal_set;
    long inits_expired;           /* waiting Inits answered near their deadline */
    /* checkpoints */
    char ckpt_dir[4200];          /* this pserver's shard directory ("": none), made at Init */
    char ckpt_root[4096];         /* --checkpoint-dir ("": none) */
    char ckpt_name[64];           /* this pserver's subdirectory of the job's in it */
    int ckpt_keep;
    int64_t resumed;              /* the checkpoint step the store was restored to (0: none) */
    Pstrain__ResumeState resume_state; /* the trainers' state at it (has_resume_state) */
    int has_resume_state;
    /* async checkpoints: a shard every async_every pushes applied here (0: none), named by
     * the pushes applied so far */
    int64_t async_every;
    int64_t async_pushes;         /* __atomic */
    int async_saving;             /* __atomic */
    int resumed_async;            /* the store was restored from an async shard */
    int ckpt_failed;              /* atomic: a shard could not be written (ckpt_error) */
    char ckpt_error[600];
    uint64_t pull_casts;          /* atomic: elements cast for single pulls (a pull in a
                                   * dtype the store keeps no copy in) */
    /* Pull contexts, recycled: the steady state allocates nothing per Pull. */
    pthread_mutex_t pull_mu;
    struct pull_ctx *pull_free;   /* contexts whose reply was sent, with their buffers */
    size_t pull_allocs;           /* contexts ever allocated (the most pulls in flight) */
    size_t pulls;                 /* Pull calls handled */
    size_t pulls_abandoned;       /* atomic: withdrawn because their client gave up */
    size_t pulls_live;            /* contexts in flight (under pull_mu) */
    size_t pulls_sending;         /* replies whose payload gRPC still holds (__atomic) */
    const ps_prom *prom;          /* NULL: no /metrics */
    int64_t ckpt_at_us;           /* atomic (never under mu: the snapshot runs under a
                                   * block's lock, and mu is taken before block locks):
                                   * microseconds of pst_clock_s() of the newest
                                   * checkpoint written, or of the store's making */
    /* same host (rpc/shm.h): each trainer's segment, mapped at its Init */
    int shm_enabled;
    rpc_shm area;                 /* the values pulls are served from, shared (sync): the
                                   * store's copy in lowp (its f32 master when lowp is f32) */
    rpc_shm_peers peers;
    /* limits */
    uint64_t max_params;          /* an Init that would hold more is refused (0: none) */
    uint64_t max_memory;          /* bytes of blocks, the same (ps_service_limits) */
    size_t max_block;             /* atomic: the largest block's length (after Init) */
};

/* A pull in flight; back on svc->pull_free once its reply was sent (release_pull). */
typedef struct pull_ctx {
    ps_pull_waiter waiter;
    ps_service *svc;
    rpc_call *call;
    double arrived;               /* pst_clock_s() when it came (PullReply.held_us) */
    pst_dtype dtype;
    unsigned char *slot;          /* answer into this pull slot of the trainer's segment */
    int in_area;                  /* or let it read the values area (shm_values) */
    void *buf;                    /* cast or copy of the values (async or not f32) */
    size_t cap;                   /* bytes allocated at buf, kept across reuses */
    struct pull_ctx *next;        /* in svc->pull_free */
    /* under svc->pull_mu: the cancellation of an abandoned pull (pull_cancelled) */
    int inflight;                 /* serving `call` (not on the free list) */
    int cancelling;               /* pull_cancelled is withdrawing it: not reusable yet */
    int release_pending;          /* its release came while cancelling */
} pull_ctx;

pst_status ps_service_init(ps_service **out)
{
    ps_service *svc = calloc(1, sizeof *svc);
    if (!svc)
        return pst_error_set(PST_ERR_NOMEM, "pserver: out of memory");
    pthread_mutex_init(&svc->mu, NULL);
    pthread_cond_init(&svc->cv, NULL);
    pthread_mutex_init(&svc->pull_mu, NULL);
    svc->shm_enabled = 1;
    svc->area.fd = -1;
    *out = svc;
    return PST_OK;
}

static size_t pull_payloads_held(ps_service *svc, double seconds);

void ps_service_free(ps_service *svc)
{
    if (!svc)
        return;
    /* A reply's payload points into the store's values or a pull context's buffer, both
     * freed below, and gRPC may let go of it after the server is gone. */
    const size_t held = pull_payloads_held(svc, 5.0);
    if (held) {
        PST_WARN("%zu Pull reply payloads still held by gRPC after 5 s: the service's "
                 "memory is left to the exiting process", held);
        return;
    }
    ps_store_free(svc->store);
    ps_tables_free(svc->tables); /* its replies' payloads are their own */
    rpc_shm_free(&svc->area); /* after the store, whose values or copy live there */
    PST_FREE_ALL(svc->finished, svc->watch, svc->joined, svc->let_go_at, svc->block_ids,
                 svc->specs);
    rpc_shm_peers_free(&svc->peers);
    for (int k = 0; k < 2; k++) {
        free(svc->votes[k].voted);
        free(svc->votes[k].calls);
    }
    PST_INFO("%zu Pull calls served with %zu pull contexts (%zu given up by their client); "
             "%ld waiting Inits and Votes given up; %ld waiting Inits answered at their "
             "deadline", svc->pulls, svc->pull_allocs, svc->pulls_abandoned, svc->withdrawn,
             svc->inits_expired);
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
    /* Settings that cannot train are refused: the pserver does not trust its clients (the
     * trainer's flags are checked against the same ranges, optim_config.h). */
    if (pst_optim_check(o) != PST_OK)
        return pst_error_set(PST_ERR_INVALID, "Init: %s", pst_error_detail());
    return PST_OK;
}

/* A shard could not be written (the detail set): the first such failure is kept and stops
 * the pserver (ps_service_wait, ps_service_failure). */
static void checkpoint_failed(ps_service *svc)
{
    if (!__atomic_load_n(&svc->ckpt_failed, __ATOMIC_ACQUIRE)) {
        snprintf(svc->ckpt_error, sizeof svc->ckpt_error, "%s", pst_error_detail());
        PST_ERROR("%s; the checkpoints written before are intact", svc->ckpt_error);
        __atomic_store_n(&svc->ckpt_failed, 1, __ATOMIC_RELEASE);
    }
}

/* Creates the store from trainer 0's Init. Called with svc->mu held. */
/* The store's snapshot (ps_store_config): this pserver's shard of `version`, written
 * before the last block's pulls are answered. A failure stops the pserver (ps_service_wait
 * returns, ps_service_failure says why): a job that asked for checkpoints must not run on
 * without them. */
static void snapshot(void *arg, int64_t version, const float *values, const float *state)
{
    ps_service *svc = arg;
    const ps_shard_layout lay = {svc->fingerprint, svc->specs, (int)svc->nblock_ids,
                                 ps_store_total_length(svc->store),
                                 ps_store_state_floats(svc->store)};
    if (ps_shard_save(svc->ckpt_dir, version, &lay, values, state, NULL, svc->ckpt_keep) ==
        PST_OK) {
        PST_INFO("checkpoint: step %lld written to %s", (long long)version, svc->ckpt_dir);
        __atomic_store_n(&svc->ckpt_at_us, (int64_t)(pst_clock_s() * 1e6), __ATOMIC_RELAXED);
        return;
    }
    checkpoint_failed(svc);
}

/* Async: this pserver's shard, each block as it is now (ps_store_read_async), named by
 * the pushes applied here so far. One at a time: a push that comes due while one is
 * written leaves it to the next. A failure stops the pserver as in sync mode. */
static void async_snapshot(ps_service *svc, ps_store *store, int64_t pushes)
{
    if (__atomic_exchange_n(&svc->async_saving, 1, __ATOMIC_ACQ_REL))
        return;
    const uint64_t total = ps_store_total_length(store);
    const int nstate = ps_store_state_floats(store), nb = (int)svc->nblock_ids;
    float *values = malloc(sizeof(float) * (total ? total : 1));
    float *state = nstate ? malloc(sizeof(float) * (size_t)nstate * (total ? total : 1)) : NULL;
    int64_t *versions = malloc(sizeof(int64_t) * (size_t)(nb ? nb : 1));
    int64_t *steps = malloc(sizeof(int64_t) * (size_t)svc->num_trainers * (size_t)(nb ? nb : 1));
    pst_status st = values && (!nstate || state) && versions && steps
                        ? ps_store_read_async(store, values, state, versions, steps)
                        : pst_error_set(PST_ERR_NOMEM, "checkpoint: out of memory");
    const ps_shard_layout lay = {svc->fingerprint, svc->specs, nb, total, nstate};
    const ps_shard_async as = {(int)svc->num_trainers, versions, steps};
    if (st == PST_OK)
        st = ps_shard_save(svc->ckpt_dir, pushes, &lay, values, state, &as, svc->ckpt_keep);
    if (st == PST_OK) {
        PST_INFO("checkpoint: %lld pushes applied, written to %s", (long long)pushes,
                 svc->ckpt_dir);
        __atomic_store_n(&svc->ckpt_at_us, (int64_t)(pst_clock_s() * 1e6), __ATOMIC_RELAXED);
    } else {
        checkpoint_failed(svc);
    }
    PST_FREE_ALL(values, state, versions, steps);
    __atomic_store_n(&svc->async_saving, 0, __ATOMIC_RELEASE);
}

/* Async: the newest whole shard of this job here is loaded, each block's version and each
 * trainer's last step with it (none: the job starts from trainer 0's values). */
static pst_status resume_async(ps_service *svc, const Pstrain__InitRequest *req,
                               uint64_t total)
{
    const int nstate = ps_store_state_floats(svc->store), nb = (int)req->n_blocks;
    float *values = malloc(sizeof(float) * (total ? total : 1));
    float *state = nstate ? malloc(sizeof(float) * (size_t)nstate * (total ? total : 1)) : NULL;
    int64_t *versions = malloc(sizeof(int64_t) * (size_t)(nb ? nb : 1));
    int64_t *steps = malloc(sizeof(int64_t) * req->num_trainers * (size_t)(nb ? nb : 1));
    pst_status st = PST_OK;
    if (!values || (nstate && !state) || !versions || !steps)
        st = pst_error_set(PST_ERR_NOMEM, "Init: out of memory to resume");
    const ps_shard_layout lay = {req->fingerprint, svc->specs, nb, total, nstate};
    ps_shard_async as = {(int)req->num_trainers, versions, steps};
    const int64_t v = st == PST_OK ? ps_shard_pick_newest(svc->ckpt_dir, &lay, values, state, &as)
                                   : -1;
    if (v >= 0 && (st = ps_store_restore_async(svc->store, values, state, versions, steps)) ==
                      PST_OK) {
        svc->resumed_async = 1;
        __atomic_store_n(&svc->async_pushes, v, __ATOMIC_RELAXED);
        PST_INFO("resumed from the async checkpoint of %lld pushes in %s", (long long)v,
                 svc->ckpt_dir);
    } else if (v < 0 && st == PST_OK) {
        PST_WARN("no whole async checkpoint of this job here in %s: starting from trainer 0's "
                 "values", svc->ckpt_dir);
    }
    PST_FREE_ALL(values, state, versions, steps);
    return st;
}

/* Trainer 0 resumes: the newest of its job checkpoints whose shard this pserver holds
 * whole is loaded into the new store (none: the job starts from trainer 0's values). */
static pst_status resume(ps_service *svc, const Pstrain__InitRequest *req, uint64_t total)
{
    const int nstate = ps_store_state_floats(svc->store);
    float *values = malloc(sizeof(float) * (total ? total : 1));
    float *state = nstate ? malloc(sizeof(float) * (size_t)nstate * (total ? total : 1)) : NULL;
    if (!values || (nstate && !state)) {
        free(values);
        free(state);
        return pst_error_set(PST_ERR_NOMEM, "Init: out of memory to resume");
    }
    const ps_shard_layout lay = {req->fingerprint, svc->specs, (int)req->n_blocks, total,
                                 nstate};
    const int64_t v = ps_shard_pick(svc->ckpt_dir, req->resume_steps, (int)req->n_resume_steps,
                                    &lay, values, state, NULL);
    pst_status st = PST_OK;
    if (v >= 0 && (st = ps_store_restore(svc->store, v, values, state)) == PST_OK) {
        svc->resumed = v;
        /* what every trainer's Init reply says of it: trainer 0's state at that checkpoint */
        for (size_t i = 0; req->n_resume_states == req->n_resume_steps && i < req->n_resume_steps;
             i++)
            if (req->resume_steps[i] == v && req->resume_states[i]) {
                const Pstrain__ResumeState *r = req->resume_states[i];
                pstrain__resume_state__init(&svc->resume_state); /* the fields, nothing more */
                svc->resume_state.next_step = r->next_step;
                svc->resume_state.loss_scale = r->loss_scale;
                svc->resume_state.good_steps = r->good_steps;
                svc->resume_state.skipped = r->skipped;
                svc->has_resume_state = 1;
            }
        PST_INFO("resumed from checkpoint step %lld in %s", (long long)v, svc->ckpt_dir);
    } else if (v < 0) {
        PST_WARN("no checkpoint of trainer 0's %zu (newest %lld) is whole here in %s: starting "
                 "from trainer 0's values", req->n_resume_steps,
                 (long long)req->resume_steps[0], svc->ckpt_dir);
    }
    free(values);
    free(state);
    return st;
}

void ps_service_checkpoints(ps_service *svc, const char *dir, const char *name, int keep)
{
    snprintf(svc->ckpt_root, sizeof svc->ckpt_root, "%s", dir ? dir : "");
    snprintf(svc->ckpt_name, sizeof svc->ckpt_name, "%s", name ? name : "");
    svc->ckpt_keep = keep;
}

const char *ps_service_failure(ps_service *svc)
{
    if (__atomic_load_n(&svc->ckpt_failed, __ATOMIC_ACQUIRE))
        return svc->ckpt_error;
    return __atomic_load_n(&svc->fatal_set, __ATOMIC_ACQUIRE) ? svc->fatal : NULL;
}

void ps_service_on_failure(ps_service *svc, int wait, long peer_timeout_ms, double init_by,
                           const char *why)
{
    svc->wait_mode = wait;
    svc->peer_timeout_ms = peer_timeout_ms;
    svc->init_by = init_by;
    snprintf(svc->fatal, sizeof svc->fatal, "%s", why ? why : "");
}

static void on_update(void *arg, double seconds)
{
    const ps_service *svc = arg;
    pst_prom_observe(svc->prom->update, seconds);
}

void ps_prom_register(ps_prom *m, pst_prom *r)
{
    static const double buckets[] = {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1};
    const char *push = "Push calls handled, by outcome";
    const char *pull = "Pull calls answered, by outcome";
    m->pushes_ok = pst_prom_counter(r, "pstrain_pserver_pushes_total", push, "status=\"ok\"");
    m->pushes_failed = pst_prom_counter(r, "pstrain_pserver_pushes_total", push,
                                        "status=\"error\"");
    m->pulls_ok = pst_prom_counter(r, "pstrain_pserver_pulls_total", pull, "status=\"ok\"");
    m->pulls_failed = pst_prom_counter(r, "pstrain_pserver_pulls_total", pull,
                                       "status=\"error\"");
    m->received = pst_prom_counter(r, "pstrain_pserver_received_bytes_total",
                                   "Payload bytes of the pushes received", NULL);
    m->sent = pst_prom_counter(r, "pstrain_pserver_sent_bytes_total",
                               "Payload bytes of the pulls answered", NULL);
    m->update = pst_prom_histogram(r, "pstrain_pserver_update_seconds",
                                   "Time of one block's update: the optimizer step and the cast",
                                   NULL, buckets, (int)(sizeof buckets / sizeof buckets[0]));
}

void ps_service_prom(ps_service *svc, const ps_prom *m)
{
    svc->prom = m;
}

void ps_service_gauges_read(ps_service *svc, ps_service_gauges *g)
{
    memset(g, 0, sizeof *g);
    g->checkpoint_age = -1;
    pthread_mutex_lock(&svc->mu);
    if (svc->store) {
        g->initialized = 1;
        g->trainers = svc->num_trainers;
        for (uint32_t t = 0; t < svc->num_trainers; t++)
            g->connected += svc->watch[t] != NULL;
        g->blocks = svc->nblock_ids;
        g->params = ps_store_total_length(svc->store);
        if (svc->nblock_ids) {
            g->version = ps_store_version(svc->store, svc->block_ids[0]);
            const int pushed = ps_store_pushed(svc->store, svc->block_ids[0]);
            if (svc->sync && pushed >= 0)
                g->waited_for = svc->num_trainers - (uint32_t)pushed - svc->nfinished;
        }
        if (svc->ckpt_dir[0] && svc->sync)
            g->checkpoint_age =
                pst_clock_s() - (double)__atomic_load_n(&svc->ckpt_at_us, __ATOMIC_RELAXED) * 1e-6;
    }
    pthread_mutex_unlock(&svc->mu);
    /* the tables' own locks, not under svc->mu (a scrape never holds up Init or Finish) */
    ps_tables_totals_of(__atomic_load_n(&svc->tables, __ATOMIC_ACQUIRE), &g->sparse, 0);
}

void ps_service_limits(ps_service *svc, uint64_t max_params, uint64_t max_memory)
{
    svc->max_params = max_params;
    svc->max_memory = max_memory;
}

void ps_service_shm(ps_service *svc, int enabled)
{
    svc->shm_enabled = enabled != 0;
}

/* Maps the segment a sync trainer offers in its Init (rpc/shm.h); returns whether the
 * trainer may use it. A segment that cannot be mapped (another host or container, or not
 * the trainer's) is no error: the payloads stay in the calls. Called with svc->mu held. */
static int attach_shm_locked(ps_service *svc, const Pstrain__InitRequest *req)
{
    const uint32_t t = req->trainer_id;
    if (!req->shm_name || !req->shm_name[0] || !svc->shm_enabled || !svc->sync ||
        t >= svc->num_trainers)
        return 0;
    const pst_status st = rpc_shm_peers_attach(&svc->peers, svc->num_trainers, t,
                                               req->shm_name, req->shm_nonce,
                                               ps_store_total_length(svc->store), &svc->area);
    if (st == PST_ERR_LIMIT)
        PST_WARN("trainer %u: payloads in the calls, not in shared memory: %s", t,
                 pst_error_detail());
    else if (st != PST_OK)
        PST_INFO("trainer %u: payloads in the calls, not in shared memory: %s", t,
                 pst_error_detail());
    else
        PST_INFO("trainer %u is on this host: payloads through shared memory", t);
    return st == PST_OK;
}

size_t ps_service_max_request(void *arg, rpc_method m, const char **why)
{
    ps_service *svc = arg;
    if (m == RPC_METHOD_INIT && svc->max_params) {
        *why = "initial values of at most --max-params parameters, and the block list";
        const size_t blocks = svc->max_params < PS_MAX_BLOCKS ? svc->max_params : PS_MAX_BLOCKS;
        return (size_t)svc->max_params * sizeof(float) + 64 * blocks + 65536;
    }
    if (m == RPC_METHOD_PULL_SPARSE || m == RPC_METHOD_PUSH_SPARSE) {
        const ps_tables *tables = __atomic_load_n(&svc->tables, __ATOMIC_ACQUIRE);
        *why = tables ? "2^22 keys, and rows of the widest sparse table in f32"
                      : "no sparse tables before trainer 0's Init: the header alone";
        return tables ? ps_tables_max_request(tables, m) : RPC_SMALL_REQUEST_MAX;
    }
    if (m == RPC_METHOD_PUSH) {
        const size_t longest = __atomic_load_n(&svc->max_block, __ATOMIC_ACQUIRE);
        *why = longest ? "the largest block in f32, and the header"
                       : "no blocks before trainer 0's Init: the header alone";
        return longest * sizeof(float) + RPC_SMALL_REQUEST_MAX;
    }
    return 0;
}

const char *ps_service_departed(ps_service *svc)
{
    return __atomic_load_n(&svc->departed_set, __ATOMIC_ACQUIRE) ? svc->departed : NULL;
}

static void *keep_push(void *arg); /* (Push, below) */
static void release_push(void *kept);

/* Init's settings from the wire into sc, and the bounds an Init must keep before anything
 * is allocated: trainers, mode, optimizer, precision, blocks, --max-params and
 * --max-memory (what a 1 MiB Init can ask for grows with the trainers: a gradient buffer
 * each). */
static pst_status init_settings(ps_service *svc, const Pstrain__InitRequest *req,
                                ps_store_config *sc)
{
    if (req->num_trainers < 1 || req->num_trainers > 4096)
        return pst_error_set(PST_ERR_INVALID, "Init: num_trainers %u out of range 1..4096",
                             req->num_trainers);
    if (req->mode != PSTRAIN__MODE__SYNC && req->mode != PSTRAIN__MODE__ASYNC)
        return pst_error_set(PST_ERR_INVALID, "Init: mode %d unknown (SYNC = 0 or ASYNC = 1)",
                             (int)req->mode);
    *sc = (ps_store_config){
        .mode = req->mode == PSTRAIN__MODE__ASYNC ? PST_MODE_ASYNC : PST_MODE_SYNC,
        .num_trainers = (int)req->num_trainers, .nblocks = (int)req->n_blocks,
        .keep_push = keep_push, .release_push = release_push};
    PST_TRY(optim_from_wire(req->optim, &sc->optim));
    if (rpc_dtype_from_wire(req->precision, &sc->lowp) != PST_OK)
        return pst_error_set(PST_ERR_INVALID, "Init from trainer 0: precision %d is not F32, "
                             "F16 or BF16", (int)req->precision);
    uint64_t total = 0;
    if (req->n_blocks > PS_MAX_BLOCKS)
        return pst_error_set(PST_ERR_LIMIT, "Init from trainer 0: %zu blocks on this pserver, "
                             "at most %d", req->n_blocks, PS_MAX_BLOCKS);
    for (size_t i = 0; i < req->n_blocks; i++)
        total += req->blocks[i]->length <= (1ull << 32) ? req->blocks[i]->length : 0;
    if (svc->max_params && total > svc->max_params)
        return pst_error_set(PST_ERR_LIMIT, "Init from trainer 0: %llu parameters on this "
                             "pserver, at most %llu (--max-params; more pservers share a "
                             "model's parameters)", (unsigned long long)total,
                             (unsigned long long)svc->max_params);
    const double need = (double)ps_store_bytes(sc, total) +
                        (svc->shm_enabled && sc->mode == PST_MODE_SYNC
                             ? (double)total * pst_dtype_size(sc->lowp) : 0.0);
    if (svc->max_memory && need > (double)svc->max_memory)
        return pst_error_set(PST_ERR_LIMIT, "Init from trainer 0: %llu parameters on this "
                             "pserver for %u trainers (%s, optimizer %s) need %.3g GB, more than "
                             "--max-memory %.3g GB (more pservers share a model's parameters)",
                             (unsigned long long)total, req->num_trainers,
                             pst_mode_name(sc->mode), pst_optim_kind_name(sc->optim.kind),
                             need / 1e9, (double)svc->max_memory / 1e9);
    return PST_OK;
}

/* Init's blocks (*blocks) and their initial values (*initial, *total of them), checked:
 * every block inside the model, the values finite. The caller frees both, also on error. */
static pst_status init_blocks_and_values(const Pstrain__InitRequest *req, const rpc_payload *pl,
                                         ps_block_spec **blocks, float **initial,
                                         uint64_t *total)
{
    *total = 0;
    *blocks = calloc(req->n_blocks ? req->n_blocks : 1, sizeof **blocks);
    if (!*blocks)
        return pst_error_set(PST_ERR_NOMEM, "Init: out of memory for %zu blocks", req->n_blocks);
    for (size_t i = 0; i < req->n_blocks; i++) {
        const Pstrain__BlockSpec *b = req->blocks[i];
        if (b->length == 0 || b->length > (1ull << 32) || b->offset + b->length > req->total_params)
            return pst_error_set(PST_ERR_INVALID, "Init: block %u [%llu, +%llu) outside the %llu "
                                 "parameters", b->id, (unsigned long long)b->offset,
                                 (unsigned long long)b->length,
                                 (unsigned long long)req->total_params);
        (*blocks)[i] = (ps_block_spec){.id = b->id, .offset = b->offset, .length = b->length};
        *total += b->length;
    }
    pst_status st = rpc_payload_check(pl, PST_F32, *total);
    if (st != PST_OK)
        return pst_error_wrap(st, "Init from trainer 0: initial values");
    *initial = malloc(sizeof(float) * (*total ? *total : 1));
    if (!*initial)
        return pst_error_set(PST_ERR_NOMEM, "Init: out of memory for %llu values",
                             (unsigned long long)*total);
    if (*total)
        PST_TRY(rpc_payload_read_f32(pl, PST_F32, 0, *initial, *total));
    for (uint64_t i = 0; i < *total; i++)
        if (!isfinite((*initial)[i]))
            return pst_error_set(PST_ERR_INVALID, "Init from trainer 0: initial value %llu is "
                                 "%s; the values must be finite", (unsigned long long)i,
                                 isnan((*initial)[i]) ? "NaN" : "infinite");
    return PST_OK;
}

/* Checkpoints of this job: its directory (DIR/<job_id>/<name>: another job's in DIR are
 * not its), how often (sync: snapshots every checkpoint_every steps; async: about every
 * checkpoint_every steps of every trainer), and the update hook of /metrics. */
static pst_status init_checkpoints(ps_service *svc, const Pstrain__InitRequest *req,
                                   ps_store_config *sc)
{
    if (svc->ckpt_root[0]) {
        const char *job = req->job_id ? req->job_id : "";
        if (job[0] && !pst_job_id_valid(job))
            return pst_error_set(PST_ERR_INVALID, "Init from trainer 0: job_id \"%.80s\" is not "
                                 "1 to %d letters, digits, '.', '_' or '-' (example: "
                                 "job-0123456789abcdef)", job, PST_JOB_ID_MAX);
        snprintf(svc->ckpt_dir, sizeof svc->ckpt_dir, "%s/%s%s%s", svc->ckpt_root, job,
                 job[0] ? "/" : "", svc->ckpt_name);
    }
    if (req->checkpoint_every > 0 && sc->mode == PST_MODE_ASYNC && svc->ckpt_dir[0])
        svc->async_every = req->checkpoint_every * (int64_t)req->num_trainers *
                           (int64_t)(req->n_blocks ? req->n_blocks : 1);
    if (req->checkpoint_every > 0 && sc->mode == PST_MODE_SYNC) {
        if (svc->ckpt_dir[0]) {
            sc->snapshot_every = req->checkpoint_every;
            sc->snapshot = snapshot;
            sc->snapshot_arg = svc;
        } else {
            PST_WARN("trainer 0 asks for a checkpoint every %lld steps, but this pserver has "
                     "no --checkpoint-dir: it writes none", (long long)req->checkpoint_every);
        }
    }
    if (svc->prom) {
        sc->on_update = on_update;
        sc->on_update_arg = svc;
    }
    return PST_OK;
}

/* Sync: the values pulls are served from (the lowp copy, else the f32 master) in a shared
 * area, so a trainer on this host can read its pulls there (rpc/shm.h). Points sc->values
 * or sc->lowp_at at *values_at or *lowp_at, arrays the caller frees after ps_store_init
 * (the store keeps the pointers it needs); without an area (off, async, or it could not be
 * made) pulls are copied. */
static void init_values_area(ps_service *svc, const Pstrain__InitRequest *req,
                             const ps_block_spec *blocks, ps_store_config *sc,
                             float ***values_out, void ***lowp_out)
{
    rpc_shm_free(&svc->area); /* an earlier Init's, refused after the area was made */
    if (!svc->shm_enabled || sc->mode != PST_MODE_SYNC || !req->n_blocks)
        return;
    const size_t esize = pst_dtype_size(sc->lowp);
    size_t bytes = 0;
    for (size_t i = 0; i < req->n_blocks; i++)
        bytes += rpc_shm_area_span(blocks[i].length, esize);
    float **values_at = NULL;
    void **lowp_at = NULL;
    if (sc->lowp == PST_F32)
        values_at = malloc(req->n_blocks * sizeof *values_at);
    else
        lowp_at = malloc(req->n_blocks * sizeof *lowp_at);
    if ((values_at || lowp_at) && rpc_shm_create_area(&svc->area, bytes) == PST_OK) {
        char *at = rpc_shm_area(&svc->area);
        for (size_t i = 0; i < req->n_blocks; i++) {
            if (values_at)
                values_at[i] = (float *)at;
            else
                lowp_at[i] = at;
            at += rpc_shm_area_span(blocks[i].length, esize);
        }
        sc->values = *values_out = values_at;
        sc->lowp_at = *lowp_out = lowp_at;
        return;
    }
    PST_INFO("no shared values area: pulls are copied: %s", pst_error_detail());
    free(values_at);
    free(lowp_at);
}

/* Frees the membership tables (init_membership's), leaving them NULL. */
static void free_membership(ps_service *svc)
{
    for (int k = 0; k < 2; k++) {
        free(svc->votes[k].voted);
        free(svc->votes[k].calls);
        svc->votes[k] = (vote_slot){0};
    }
    PST_FREE_ALL(svc->specs, svc->finished, svc->watch, svc->joined, svc->block_ids);
    svc->specs = NULL;
    svc->joined = NULL;
    svc->watch = NULL;
    svc->finished = NULL;
    svc->block_ids = NULL;
}

/* Who has finished, watches, joined and voted, per trainer; the block ids and specs. */
static pst_status init_membership(ps_service *svc, const Pstrain__InitRequest *req)
{
    svc->finished = calloc(req->num_trainers, 1);
    svc->watch = calloc(req->num_trainers, sizeof *svc->watch);
    svc->joined = calloc(req->num_trainers, 1);
    svc->block_ids = malloc((req->n_blocks ? req->n_blocks : 1) * sizeof *svc->block_ids);
    svc->specs = malloc((req->n_blocks ? req->n_blocks : 1) * sizeof *svc->specs);
    int votes_ok = 1;
    for (int k = 0; k < 2; k++) {
        vote_slot *v = &svc->votes[k];
        v->step = -1;
        v->voted = calloc(req->num_trainers, 1);
        v->calls = calloc(2 * (size_t)req->num_trainers, sizeof *v->calls);
        votes_ok &= v->voted && v->calls;
    }
    if (svc->finished && svc->watch && svc->joined && svc->block_ids && svc->specs && votes_ok)
        return PST_OK;
    free_membership(svc);
    return pst_error_set(PST_ERR_NOMEM, "Init: out of memory");
}

/* Undoes create_store once the store and the membership tables are made. */
static void drop_store(ps_service *svc)
{
    ps_store_free(svc->store);
    svc->store = NULL;
    svc->resumed = 0;
    svc->has_resume_state = 0;
    svc->resumed_async = 0;
    free_membership(svc);
    rpc_shm_free(&svc->area);
}

/* Trainer 0's Init makes the store: its settings checked, its blocks and initial values,
 * the checkpoints, the shared values area, the store, the membership tables, then the
 * resume from a checkpoint when trainer 0 offers one. */
static pst_status create_store(ps_service *svc, rpc_call *call)
{
    const Pstrain__InitRequest *req = (const Pstrain__InitRequest *)rpc_call_request(call);
    ps_store_config sc;
    ps_block_spec *blocks = NULL;
    ps_tables *tables = NULL; /* published once the store is whole */
    float *initial = NULL;
    uint64_t total = 0;
    pst_status st;
    if ((st = init_settings(svc, req, &sc)) != PST_OK ||
        (st = init_blocks_and_values(req, rpc_call_payload(call), &blocks, &initial,
                                     &total)) != PST_OK)
        goto out;
    sc.blocks = blocks;
    if ((st = init_checkpoints(svc, req, &sc)) != PST_OK ||
        (st = ps_tables_init(&tables, req, sc.mode == PST_MODE_SYNC, svc->ckpt_dir,
                             svc->ckpt_keep)) != PST_OK)
        goto out;
    float **values_at = NULL;
    void **lowp_at = NULL;
    init_values_area(svc, req, blocks, &sc, &values_at, &lowp_at);
    st = ps_store_init(&svc->store, &sc, initial);
    free(values_at); /* the store keeps the pointers it needs */
    free(lowp_at);
    if (st != PST_OK) {
        rpc_shm_free(&svc->area);
        goto out;
    }
    __atomic_store_n(&svc->ckpt_at_us, (int64_t)(pst_clock_s() * 1e6), __ATOMIC_RELAXED);
    if ((st = init_membership(svc, req)) != PST_OK) {
        ps_store_free(svc->store);
        svc->store = NULL;
        rpc_shm_free(&svc->area);
        goto out;
    }
    svc->fingerprint = req->fingerprint;
    svc->num_trainers = req->num_trainers;
    size_t longest = 0;
    for (size_t i = 0; i < req->n_blocks; i++)
        longest = blocks[i].length > longest ? blocks[i].length : longest;
    __atomic_store_n(&svc->max_block, longest, __ATOMIC_RELEASE);
    for (size_t i = 0; i < req->n_blocks; i++)
        svc->specs[i] = blocks[i];
    if ((req->n_resume_steps > 0 && svc->ckpt_dir[0] && (st = resume(svc, req, total)) != PST_OK) ||
        /* the blocks resumed at a step the sparse tables cannot: refused */
        (svc->resumed > 0 && (st = ps_tables_resume(tables, svc->resumed)) != PST_OK) ||
        (req->resume_newest && sc.mode == PST_MODE_ASYNC && svc->ckpt_dir[0] &&
         (st = resume_async(svc, req, total)) != PST_OK)) {
        drop_store(svc); /* nothing of this Init is kept: trainer 0 may try again */
        goto out;
    }
    svc->sync = sc.mode == PST_MODE_SYNC;
    svc->lowp = sc.lowp;
    for (size_t i = 0; i < req->n_blocks; i++) {
        svc->block_ids[i] = blocks[i].id;
        svc->specs[i] = blocks[i];
    }
    svc->nblock_ids = req->n_blocks;
    PST_INFO("initialized by trainer 0: %zu blocks, %llu parameters here (of %llu), %u "
             "trainers, %s, optimizer %s lr %g, precision %s", req->n_blocks,
             (unsigned long long)total, (unsigned long long)req->total_params,
             req->num_trainers, sc.mode == PST_MODE_ASYNC ? "async" : "sync", req->optim->kind,
             req->optim->lr, pst_dtype_name(sc.lowp));
    if (ps_tables_count(tables))
        PST_INFO("%d sparse tables, shard %u of %u", ps_tables_count(tables), req->sparse_shard,
                 req->sparse_shards ? req->sparse_shards : 1);
    __atomic_store_n(&svc->tables, tables, __ATOMIC_RELEASE);
    tables = NULL;
out:
    ps_tables_free(tables);
    free(blocks);
    free(initial);
    return st;
}

/* Whether a joining trainer's Init agrees with trainer 0's: its id, its precision (checked
 * before the fingerprint, which may cover the precision too: this names the cause), the
 * fingerprint and the number of trainers. Called with svc->mu held, the store made. */
static pst_status check_joining_trainer(const ps_service *svc, const Pstrain__InitRequest *req)
{
    if (req->trainer_id >= svc->num_trainers)
        return pst_error_set(PST_ERR_INVALID, "Init: trainer id %u but trainer 0 said there "
                             "are %u trainers", req->trainer_id, svc->num_trainers);
    pst_dtype precision;
    if (rpc_dtype_from_wire(req->precision, &precision) != PST_OK)
        return pst_error_set(PST_ERR_INVALID, "Init: trainer %u's precision %d is not F32, "
                             "F16 or BF16", req->trainer_id, (int)req->precision);
    if (precision != svc->lowp)
        return pst_error_set(PST_ERR_INVALID, "Init: trainer %u's precision %s differs from "
                             "trainer 0's %s: start every trainer with the same precision",
                             req->trainer_id, pst_dtype_name(precision),
                             pst_dtype_name(svc->lowp));
    if (req->fingerprint != svc->fingerprint || req->num_trainers != svc->num_trainers)
        return pst_error_set(PST_ERR_MISMATCH,
                             "Init: trainer %u's block plan or settings differ from trainer "
                             "0's (fingerprint %016llx vs %016llx, %u vs %u trainers): start "
                             "every trainer with the same flags", req->trainer_id,
                             (unsigned long long)req->fingerprint,
                             (unsigned long long)svc->fingerprint, req->num_trainers,
                             svc->num_trainers);
    return PST_OK;
}

/* Whether a joining trainer lists trainer 0's blocks: the fingerprint covers the plan, but
 * a client can send any fingerprint, so the list itself must be trainer 0's. Called with
 * svc->mu held, the store made. */
static pst_status check_block_list(const ps_service *svc, const Pstrain__InitRequest *req)
{
    size_t i = 0;
    while (i < req->n_blocks && i < svc->nblock_ids && req->blocks[i]->id == svc->specs[i].id &&
           req->blocks[i]->offset == svc->specs[i].offset &&
           req->blocks[i]->length == svc->specs[i].length)
        i++;
    if (i < req->n_blocks && i < svc->nblock_ids)
        return pst_error_set(PST_ERR_MISMATCH, "Init: trainer %u's block %zu is %u "
                             "[%llu, +%llu), trainer 0's is %u [%llu, +%llu): start every "
                             "trainer with the same flags", req->trainer_id, i,
                             req->blocks[i]->id, (unsigned long long)req->blocks[i]->offset,
                             (unsigned long long)req->blocks[i]->length,
                             svc->specs[i].id, (unsigned long long)svc->specs[i].offset,
                             (unsigned long long)svc->specs[i].length);
    if (i < req->n_blocks || i < svc->nblock_ids)
        return pst_error_set(PST_ERR_MISMATCH, "Init: trainer %u lists %zu blocks, "
                             "trainer 0 %zu: start every trainer with the same flags",
                             req->trainer_id, req->n_blocks, svc->nblock_ids);
    return PST_OK;
}

/* The version a joining trainer starts from: its first block's (all move together in sync
 * mode), the resumed step without blocks, 0 for an empty store. Called with svc->mu held. */
static int64_t joining_version(const ps_service *svc, const Pstrain__InitRequest *req)
{
    if (ps_store_nblocks(svc->store) == 0)
        return 0;
    return req->n_blocks ? ps_store_version(svc->store, req->blocks[0]->id) : svc->resumed;
}

/* The Init's answer: the version, the trainer's shared memory (rpc/shm.h) and the values
 * area, and where to resume. Called with svc->mu held (attach_shm_locked). */
static void reply_init_locked(ps_service *svc, rpc_call *call, const Pstrain__InitRequest *req,
                              int64_t version)
{
    Pstrain__InitReply reply = PSTRAIN__INIT_REPLY__INIT;
    reply.version = version;
    reply.shm = attach_shm_locked(svc, req);
    if (reply.shm && svc->area.base) {
        reply.shm_values_name = svc->area.name;
        reply.shm_values_nonce = svc->area.nonce;
        reply.shm_values_dtype = rpc_dtype_to_wire(svc->lowp);
    }
    Pstrain__ResumeState async_at = PSTRAIN__RESUME_STATE__INIT;
    if (svc->has_resume_state) {
        reply.resume_state = &svc->resume_state;
    } else if (svc->resumed_async) { /* this trainer's first step not applied everywhere */
        async_at.next_step = ps_store_first_unapplied(svc->store, req->trainer_id);
        reply.resume_state = &async_at;
    }
    rpc_call_reply(call, &reply.base, NULL, 0, NULL, NULL);
}

/* Answers an Init once the store exists: checked against trainer 0's, the trainer joins
 * (back in time if handle_finish had let it go) and is told where to start. Called with
 * svc->mu held. */
static void answer_init(ps_service *svc, rpc_call *call)
{
    const Pstrain__InitRequest *req = (const Pstrain__InitRequest *)rpc_call_request(call);
    pst_status st = check_joining_trainer(svc, req);
    if (st == PST_OK)
        st = check_block_list(svc, req);
    if (st == PST_OK && svc->tables)
        st = ps_tables_check_join(svc->tables, req);
    if (st != PST_OK) {
        fail(call, st);
        return;
    }
    const int64_t version = joining_version(svc, req);
    svc->joined[req->trainer_id] = 1;
    if (svc->let_go_at)
        svc->let_go_at[req->trainer_id] = 0; /* back in time */
    reply_init_locked(svc, call, req, version);
}

static void trainer_done(ps_service *svc, uint32_t id, int early, const char *why,
                         rpc_call *finish_call);

/* --on-failure wait: a second Init of a trainer that joined this job is its process started
 * again; the job rolls back (see ps_service_wait). Called with svc->mu held; releases it
 * around trainer_done (which takes it) and holds it again on return. */
static void roll_back_on_restart_locked(ps_service *svc, const Pstrain__InitRequest *req)
{
    if (svc->wait_mode && svc->store && !svc->departed_set &&
        req->trainer_id < svc->num_trainers && svc->joined[req->trainer_id]) {
        pthread_mutex_unlock(&svc->mu);
        trainer_done(svc, req->trainer_id, 1, "started again (a new Init: its process "
                     "restarted)", NULL);
        pthread_mutex_lock(&svc->mu);
    }
}

/* Parks the Init of trainer k > 0 until trainer 0's has made the store: one waiting Init
 * per trainer id, a retry replacing (and failing) the one before, whose client has most
 * likely given up, so a flood of them holds nothing; refused when MAX_PARKED wait. Called
 * with svc->mu held; returns with it released. */
static void park_init_and_unlock(ps_service *svc, rpc_call *call)
{
    const Pstrain__InitRequest *req = (const Pstrain__InitRequest *)rpc_call_request(call);
    for (int i = 0; i < svc->nparked; i++) {
        const Pstrain__InitRequest *old =
            (const Pstrain__InitRequest *)rpc_call_request(svc->parked[i]);
        if (old->trainer_id == req->trainer_id) {
            rpc_call *stale = svc->parked[i];
            svc->parked[i] = call;
            pthread_mutex_unlock(&svc->mu);
            rpc_call_fail(stale, PST_ERR_STATE, "Init of trainer %u: replaced by a "
                          "newer Init of the same trainer", req->trainer_id);
            return;
        }
    }
    if (svc->nparked == MAX_PARKED) {
        pthread_mutex_unlock(&svc->mu);
        fail(call, pst_error_set(PST_ERR_UNAVAILABLE, "Init: too many trainers waiting "
                                 "for trainer 0's Init"));
        return;
    }
    svc->parked[svc->nparked++] = call; /* answered after trainer 0's Init */
    pthread_mutex_unlock(&svc->mu);
}

/* Answers the Inits parked until trainer 0's made the store. Called with svc->mu held. */
static void answer_parked_locked(ps_service *svc)
{
    for (int i = 0; i < svc->nparked; i++)
        answer_init(svc, svc->parked[i]);
    svc->nparked = 0;
}

/* An Init: refused for an id outside its own count, a restart rolls the job back, refused
 * during a rollback; before the store, trainer k > 0 waits for trainer 0, whose Init makes
 * it and answers them; after, answered at once. */
static void handle_init(ps_service *svc, rpc_call *call)
{
    const Pstrain__InitRequest *req = (const Pstrain__InitRequest *)rpc_call_request(call);
    if (req->trainer_id >= req->num_trainers) { /* refused now, not parked until a deadline */
        fail(call, pst_error_set(PST_ERR_INVALID, "Init: trainer id %u of %u trainers: ids run "
                                 "from 0 to num_trainers - 1", req->trainer_id,
                                 req->num_trainers));
        return;
    }
    pthread_mutex_lock(&svc->mu);
    roll_back_on_restart_locked(svc, req);
    if (svc->wait_mode && __atomic_load_n(&svc->departed_set, __ATOMIC_ACQUIRE)) {
        pthread_mutex_unlock(&svc->mu);
        fail(call, pst_error_set(PST_ERR_UNAVAILABLE, "Init of trainer %u: this pserver is "
                                 "rolling the job back (%s) and starts afresh in a moment",
                                 req->trainer_id, svc->departed));
        return;
    }
    if (!svc->store && req->trainer_id != 0) {
        park_init_and_unlock(svc, call);
        return;
    }
    const int creates = !svc->store; /* trainer 0's first Init */
    pst_status st = creates ? create_store(svc, call) : PST_OK;
    if (st != PST_OK) {
        pthread_mutex_unlock(&svc->mu);
        fail(call, st);
        return;
    }
    answer_init(svc, call);
    if (creates)
        answer_parked_locked(svc);
    pthread_mutex_unlock(&svc->mu);
}

/* ---- Push ----------------------------------------------------------------------------- */

/* A push's payload (in the call or in shared memory: one view, rpc/wire.h) in its dtype. */
typedef struct push_fill {
    rpc_payload payload;
    pst_dtype dtype;
    rpc_call *call; /* the payload is in this call (NULL: in shared memory, or kept) */
} push_fill;

/* A sync push kept in the slices it came in until its step's update (ps_store_config's
 * keep_push): the call goes on without them, and no byte of them is copied. */
typedef struct kept_push {
    push_fill f; /* first: the store's fill argument is &f */
    rpc_kept_payload *slices;
} kept_push;

static void *keep_push(void *arg)
{
    const push_fill *f = arg;
    kept_push *k = f->call ? malloc(sizeof *k) : NULL;
    if (!k)
        return NULL;
    k->slices = rpc_call_keep_payload(f->call);
    if (!k->slices) {
        free(k);
        return NULL;
    }
    k->f = (push_fill){.payload = *rpc_kept_payload_view(k->slices), .dtype = f->dtype};
    return &k->f;
}

static void release_push(void *kept)
{
    kept_push *k = kept;
    rpc_kept_payload_free(k->slices);
    free(k);
}

static pst_status fill_from_payload(void *arg, float *dst, uint64_t first, uint64_t length)
{
    push_fill *f = arg;
    return rpc_payload_read_f32(&f->payload, f->dtype, first, dst, length);
}

static pst_status fill_raw_from_payload(void *arg, void *dst, uint64_t first, uint64_t length)
{
    push_fill *f = arg;
    const size_t es = pst_dtype_size(f->dtype);
    return rpc_payload_read(&f->payload, (size_t)first * es, dst, (size_t)length * es);
}

/* A block's push or pull slot in trainer t's segment, and the block's length, for a call
 * that says shm; fails the call's status with why there is none. */
static pst_status shm_slot(ps_service *svc, ps_store *store, uint32_t t, uint32_t block,
                           int pull, unsigned char **out, uint64_t *length)
{
    const rpc_shm *seg = rpc_shm_peers_get(&svc->peers, t);
    uint64_t off = 0, len = 0;
    if (!seg)
        return pst_error_set(PST_ERR_STATE, "%s of block %u in shared memory: trainer %u set "
                             "none up with this pserver (its Init's reply said so); send the "
                             "payload in the call", pull ? "Pull" : "Push", block, t);
    if (!ps_store_block_place(store, block, &off, &len))
        return pst_error_set(PST_ERR_NOT_FOUND, "%s of block %u: no such block on this "
                             "pserver", pull ? "Pull" : "Push", block);
    *out = pull ? rpc_shm_pull_slot(seg, off, len) : rpc_shm_push_slot(seg, off, len);
    *length = len;
    return *out ? PST_OK : pst_error_set(PST_ERR_INTERNAL, "block %u outside trainer %u's "
                                         "shared memory", block, t);
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
    const rpc_payload *in_call = rpc_call_payload(call);
    push_fill f = {.payload = in_call ? *in_call : (rpc_payload){0}, .call = call};
    pst_status st = PST_OK;
    if (req->trainer_id < svc->num_trainers &&
        __atomic_load_n(&svc->finished[req->trainer_id], __ATOMIC_ACQUIRE))
        st = pst_error_set(PST_ERR_STATE, "Push of block %u from trainer %u after its Finish: a "
                           "finished trainer can only Finish again", req->block, req->trainer_id);
    if (st == PST_OK)
        st = rpc_dtype_from_wire(req->dtype, &f.dtype);
    if (st == PST_OK && req->shm && f.payload.bytes)
        st = pst_error_set(PST_ERR_FORMAT, "Push of block %u: a payload in the call and in "
                           "shared memory", req->block);
    else if (st == PST_OK && req->shm) {
        unsigned char *slot = NULL;
        uint64_t len = 0;
        st = shm_slot(svc, store, req->trainer_id, req->block, 0, &slot, &len);
        if (st == PST_OK && req->length != len)
            st = pst_error_set(PST_ERR_FORMAT, "Push of block %u: %llu elements, the block "
                               "has %llu", req->block, (unsigned long long)req->length,
                               (unsigned long long)len);
        if (st == PST_OK) /* the trainer maps its slot writable */
            f.payload = rpc_payload_shared(slot, (size_t)len * pst_dtype_size(f.dtype), 1);
        f.call = NULL;
    } else if (st == PST_OK)
        st = rpc_payload_check(&f.payload, f.dtype, req->length);
    const int unscaled = req->scale == 0.0f || req->scale == 1.0f; /* 0 on the wire: none */
    /* A chain's push (trainer/chain.h) is the step's whole sum, from the last trainer. */
    if (st == PST_OK && req->trainers > 1 &&
        (!svc->sync || req->trainers != svc->num_trainers ||
         req->trainer_id + 1 != svc->num_trainers || !unscaled))
        st = pst_error_set(PST_ERR_INVALID, "Push of block %u from trainer %u carries the sum "
                           "of %u trainers: a pserver takes a chain's sum only as the whole "
                           "step's (sync, all %u trainers, from trainer %u, no loss scale)",
                           req->block, req->trainer_id, req->trainers, svc->num_trainers,
                           svc->num_trainers ? svc->num_trainers - 1 : 0);
    int dup = 0;
    /* The trainer can still write its slot: the store checks and applies one copy of it. */
    const unsigned flags = (f.payload.peer_writable ? PS_PUSH_SHARED_SOURCE : 0) |
                            (req->trainers > 1 ? PS_PUSH_ALL_TRAINERS : 0);
    if (st == PST_OK && f.payload.flat && f.dtype == PST_F32 && unscaled) /* one pass */
        st = ps_store_push_f32(store, req->trainer_id, req->step, req->block,
                               (const float *)f.payload.flat, req->length, flags, &dup);
    else if (st == PST_OK && f.dtype == PST_BF16 && unscaled)
        st = ps_store_push_bf16(store, req->trainer_id, req->step, req->block, req->length,
                                fill_raw_from_payload, &f, flags, &dup);
    else if (st == PST_OK)
        st = ps_store_push_scaled(store, req->trainer_id, req->step, req->block, req->length,
                                  req->scale != 0.0f ? req->scale : 1.0f, fill_from_payload, &f,
                                  flags, &dup);
    if (st != PST_OK) {
        if (svc->prom)
            pst_prom_add(svc->prom->pushes_failed, 1);
        fail(call, st);
        return;
    }
    if (svc->async_every > 0 && !dup) {
        const int64_t n = __atomic_add_fetch(&svc->async_pushes, 1, __ATOMIC_RELAXED);
        if (n % svc->async_every == 0)
            async_snapshot(svc, store, n);
    }
    if (svc->prom) {
        pst_prom_add(svc->prom->pushes_ok, 1);
        pst_prom_add(svc->prom->received, (double)f.payload.bytes);
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
    if (!p)
        p = calloc(1, sizeof *p);
    if (p) { /* under the lock: pull_cancelled reads call and inflight */
        void *buf = p->buf;
        size_t cap = p->cap;
        memset(p, 0, sizeof *p);
        p->buf = buf;
        p->cap = cap;
        p->svc = svc;
        p->call = call;
        p->inflight = 1;
        p->arrived = pst_clock_s();
        svc->pulls_live++;
    }
    pthread_mutex_unlock(&svc->pull_mu);
    return p;
}

/* Under pull_mu: p goes back to the free list (pull_get's other half). */
static void pull_put_locked(ps_service *svc, pull_ctx *p)
{
    p->inflight = 0;
    p->next = svc->pull_free;
    svc->pull_free = p;
    svc->pulls_live--;
}

/* The end of a pull (failed, answered, or its lent payload released): back to the list. */
static void release_pull(void *arg)
{
    pull_ctx *p = arg;
    ps_service *svc = p->svc;
    pthread_mutex_lock(&svc->pull_mu);
    if (p->cancelling) {
        p->release_pending = 1; /* pull_cancelled puts it back */
    } else {
        pull_put_locked(svc, p);
    }
    pthread_mutex_unlock(&svc->pull_mu);
}

/* Lends p's reply payload to gRPC: counted until gRPC releases it (release_sent_pull), on
 * one of its threads, which may come after the server is gone (ps_service_free waits). */
static void lend_pull_payload(pull_ctx *p)
{
    __atomic_fetch_add(&p->svc->pulls_sending, 1, __ATOMIC_RELAXED);
}

static void release_sent_pull(void *arg)
{
    pull_ctx *p = arg;
    ps_service *svc = p->svc;
    release_pull(p);
    /* after p is back: ps_service_free frees it once the count reads 0 */
    __atomic_fetch_sub(&svc->pulls_sending, 1, __ATOMIC_RELEASE);
}

/* Waits up to `seconds` for gRPC to release every lent pull payload; how many it still
 * holds (0: all released). */
static size_t pull_payloads_held(ps_service *svc, double seconds)
{
    const double until = pst_clock_s() + seconds;
    size_t held;
    while ((held = __atomic_load_n(&svc->pulls_sending, __ATOMIC_ACQUIRE)) > 0 &&
           pst_clock_s() < until)
        usleep(1000);
    return held;
}

/* A Pull whose client gave up (deadline, cancel) while it waited for its version: its
 * waiter is withdrawn from the store and the call failed at once, so nothing is kept for
 * it. From the server's on_cancel (or handle_pull, when the cancel came first). A pull
 * being answered meanwhile is left to its answer; the context is reused only after both. */
static void pull_cancelled(ps_service *svc, rpc_call *call)
{
    pull_ctx *p = rpc_call_owner(call);
    if (!p)
        return; /* not a queued pull */
    pthread_mutex_lock(&svc->pull_mu);
    int mine = p->call == call && p->inflight && !p->cancelling;
    if (mine)
        p->cancelling = 1;
    pthread_mutex_unlock(&svc->pull_mu);
    if (!mine)
        return;
    pthread_mutex_lock(&svc->mu);
    ps_store *store = svc->store;
    pthread_mutex_unlock(&svc->mu);
    const int withdrawn = store && ps_store_pull_cancel(store, &p->waiter);
    if (withdrawn) {
        __atomic_fetch_add(&svc->pulls_abandoned, 1, __ATOMIC_RELAXED);
        rpc_call_fail(call, PST_ERR_TIMEOUT, "Pull: the client gave up waiting");
    }
    pthread_mutex_lock(&svc->pull_mu);
    p->cancelling = 0;
    if (withdrawn || p->release_pending) {
        p->release_pending = 0;
        pull_put_locked(svc, p);
    }
    pthread_mutex_unlock(&svc->pull_mu);
}

/* An Init or Vote whose client gave up while it waited (for trainer 0, for the other
 * votes) leaves its list and is failed now. */
static void parked_cancelled(ps_service *svc, rpc_call *call)
{
    int found = 0;
    pthread_mutex_lock(&svc->mu);
    for (int i = 0; i < svc->nparked && !found; i++)
        if (svc->parked[i] == call) {
            svc->parked[i] = svc->parked[--svc->nparked];
            found = 1;
        }
    for (int k = 0; k < 2 && !found; k++) {
        vote_slot *v = &svc->votes[k];
        for (int i = 0; i < v->ncalls && !found; i++)
            if (v->calls[i] == call) {
                v->calls[i] = v->calls[--v->ncalls]; /* its vote stays counted */
                found = 1;
            }
    }
    if (found)
        svc->withdrawn++;
    pthread_mutex_unlock(&svc->mu);
    if (found)
        rpc_call_fail(call, PST_ERR_TIMEOUT, "%s: the client gave up waiting",
                      rpc_method_name(rpc_call_method(call)));
}

static void watch_cancelled(ps_service *svc, rpc_call *call);

void ps_service_cancelled(void *arg, rpc_call *call)
{
    ps_service *svc = arg;
    if (rpc_call_method(call) == RPC_METHOD_PULL)
        pull_cancelled(svc, call);
    else if (rpc_call_method(call) == RPC_METHOD_WATCH)
        watch_cancelled(svc, call);
    else if (rpc_call_method(call) == RPC_METHOD_PULL_SPARSE)
        ps_tables_cancelled(__atomic_load_n(&svc->tables, __ATOMIC_ACQUIRE), call);
    else if (rpc_call_method(call) == RPC_METHOD_INIT || rpc_call_method(call) == RPC_METHOD_VOTE)
        parked_cancelled(svc, call);
}

/* The /metrics counts of an answered pull: failed, or ok and its bytes sent. */
static void count_pull(const pull_ctx *p, pst_status st, uint64_t length)
{
    const ps_prom *prom = p->svc->prom;
    if (prom && st != PST_OK)
        pst_prom_add(prom->pulls_failed, 1);
    if (prom && st == PST_OK) {
        pst_prom_add(prom->pulls_ok, 1);
        pst_prom_add(prom->sent, (double)((size_t)length * pst_dtype_size(p->dtype)));
    }
}

/* Fails a pull the store could not serve (the departure, when the job departed), and
 * releases its context. */
static void fail_pull(pull_ctx *p, pst_status st)
{
    const Pstrain__PullRequest *req = (const Pstrain__PullRequest *)rpc_call_request(p->call);
    if (__atomic_load_n(&p->svc->departed_set, __ATOMIC_ACQUIRE))
        rpc_call_fail(p->call, st, "Pull of block %u: %s", req->block, p->svc->departed);
    else
        rpc_call_fail(p->call, st, "%s", pst_error_detail());
    release_pull(p);
}

/* Sync, same host: the values into the pull's slot of the trainer's segment (copied, or
 * cast and counted), which the trainer reads only after this answer. */
static void reply_in_slot(pull_ctx *p, Pstrain__PullReply *reply, const void *src,
                          const float *values, uint64_t length, size_t bytes)
{
    if (src)
        memcpy(p->slot, src, bytes);
    else {
        pst_cast(p->slot, p->dtype, values, PST_F32, length);
        __atomic_fetch_add(&p->svc->pull_casts, length, __ATOMIC_RELAXED);
    }
    reply->shm = 1;
    rpc_call_reply(p->call, &reply->base, NULL, 0, NULL, NULL);
    release_pull(p);
}

/* The values copied into the context's buffer (kept across reuses) and sent from there:
 * async, where the next push may update the block, or a dtype the store keeps no copy in
 * (cast for this pull, and counted). */
static void reply_copied(pull_ctx *p, Pstrain__PullReply *reply, const void *src,
                         const float *values, uint64_t length, size_t bytes)
{
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
    else { /* a dtype the store has no copy in: cast for this pull, and counted */
        pst_cast(p->buf, p->dtype, values, PST_F32, length);
        __atomic_fetch_add(&p->svc->pull_casts, length, __ATOMIC_RELAXED);
    }
    lend_pull_payload(p);
    rpc_call_reply(p->call, &reply->base, p->buf, bytes, release_sent_pull, p);
}

/* Runs with the block's lock held (store contract): copy out, then send. The values go by
 * the shared values area, the trainer's pull slot, straight from the store (sync) or from
 * a copy. */
static void answer_pull(void *arg, pst_status st, const float *values, const void *lowp,
                        uint64_t length, int64_t version)
{
    pull_ctx *p = arg;
    const Pstrain__PullRequest *req = (const Pstrain__PullRequest *)rpc_call_request(p->call);
    count_pull(p, st, length);
    if (st != PST_OK) {
        fail_pull(p, st);
        return;
    }
    size_t bytes = (size_t)length * pst_dtype_size(p->dtype);
    Pstrain__PullReply reply = PSTRAIN__PULL_REPLY__INIT;
    reply.block = req->block;
    reply.version = version;
    reply.dtype = rpc_dtype_to_wire(p->dtype);
    reply.length = length;
    const double held = pst_clock_s() - p->arrived;
    reply.held_us = held > 0 ? (uint64_t)(held * 1e6) : 0;
    /* The store's low-precision copy of this version, when it is in the dtype wanted. */
    const void *src = p->dtype == PST_F32 ? (const void *)values
                      : lowp && p->dtype == p->svc->lowp ? lowp : NULL;
    if (p->in_area && src && p->dtype == p->svc->lowp) {
        /* sync: the trainer copies the block from the values area itself (see above) */
        reply.shm_values = 1;
        rpc_call_reply(p->call, &reply.base, NULL, 0, NULL, NULL);
        release_pull(p);
    } else if (p->slot) {
        reply_in_slot(p, &reply, src, values, length, bytes);
    } else if (p->svc->sync && src) {
        /* Zero copy: in sync mode a block's values (and their low-precision copy) change
         * only when every trainer has pushed the next step, and a trainer pushes it only
         * after it has received this version, so they stay put while gRPC sends them from
         * the store. */
        lend_pull_payload(p);
        rpc_call_reply(p->call, &reply.base, src, bytes, release_sent_pull, p);
    } else {
        reply_copied(p, &reply, src, values, length, bytes);
    }
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
    /* Each trainer has at most one exchange per block in flight: what is beyond that (with
     * room for retries and for a pull whose client has gone but whose cancellation has not
     * come yet) is not a trainer of this job. */
    const size_t most = 2 * (size_t)svc->num_trainers * svc->nblock_ids + PULL_SLACK;
    pthread_mutex_lock(&svc->pull_mu);
    const size_t live = svc->pulls_live;
    pthread_mutex_unlock(&svc->pull_mu);
    if (live > most) {
        release_pull(p);
        fail(call, pst_error_set(PST_ERR_LIMIT, "Pull of block %u: %zu pulls in flight on "
                                 "this pserver, at most %zu (2 per trainer and block, + "
                                 "%d)",
                                 req->block, live - 1, most, PULL_SLACK));
        return;
    }
    pst_status st = rpc_dtype_from_wire(req->dtype, &p->dtype);
    uint64_t len = 0;
    if (st == PST_OK && req->shm)
        st = shm_slot(svc, store, req->trainer_id, req->block, 1, &p->slot, &len);
    p->in_area = st == PST_OK && req->shm && req->shm_values && svc->area.base;
    if (st == PST_OK)
        st = ps_store_pull(store, req->block, req->version, &p->waiter, answer_pull, p);
    if (st != PST_OK) {
        release_pull(p);
        fail(call, st);
        return;
    }
    /* Queued (or answered already: then p may serve another call by now, which
     * pull_cancelled sees). A cancel before this found no owner: it is caught here. */
    rpc_call_set_owner(call, p);
    if (rpc_call_cancelled(call))
        pull_cancelled(svc, call);
}

/* ---- Vote ------------------------------------------------------------------------------ */

static void answer_vote(rpc_call *call, int64_t step, int skip)
{
    Pstrain__VoteReply reply = PSTRAIN__VOTE_REPLY__INIT;
    reply.step = step;
    reply.skip = skip != 0;
    rpc_call_reply(call, &reply.base, NULL, 0, NULL, NULL);
}

/* Why a Vote cannot be counted, checked in this order (PST_OK: it can): no store, the job
 * departed, no such trainer, a negative step, its trainer finished, its slot `v` holds a
 * later step or an earlier one still undecided. Called with svc->mu held. */
static pst_status check_vote_locked(const ps_service *svc, const Pstrain__VoteRequest *req,
                                    const vote_slot *v)
{
    if (!svc->store)
        return pst_error_set(PST_ERR_STATE, "Vote before Init: this pserver has no trainers "
                             "yet");
    if (__atomic_load_n(&svc->departed_set, __ATOMIC_ACQUIRE))
        return pst_error_set(PST_ERR_STATE, "Vote: %s", svc->departed);
    if (req->trainer_id >= svc->num_trainers)
        return pst_error_set(PST_ERR_INVALID, "Vote from trainer %u: there are %u trainers",
                             req->trainer_id, svc->num_trainers);
    if (req->step < 0)
        return pst_error_set(PST_ERR_INVALID, "Vote for step %lld: steps start at 0",
                             (long long)req->step);
    if (svc->finished[req->trainer_id])
        return pst_error_set(PST_ERR_STATE, "Vote of trainer %u after its Finish: a finished "
                             "trainer can only Finish again", req->trainer_id);
    if (v->step > req->step)
        return pst_error_set(PST_ERR_INVALID, "Vote of trainer %u for step %lld: step %lld "
                             "was decided since", req->trainer_id, (long long)req->step,
                             (long long)v->step);
    if (v->step >= 0 && v->step < req->step && !v->decided)
        return pst_error_set(PST_ERR_STATE, "Vote of trainer %u for step %lld while step %lld "
                             "still waits for votes", req->trainer_id, (long long)req->step,
                             (long long)v->step);
    return PST_OK;
}

/* Records an undecided step's vote in its slot `v` (emptied first for a new step): the
 * call waits there for the decision, the vote counts once per trainer. Fails when the
 * slot's calls are full (too many retries). Called with svc->mu held. */
static pst_status record_vote_locked(ps_service *svc, const Pstrain__VoteRequest *req,
                                     vote_slot *v, rpc_call *call)
{
    if (v->step != req->step) {
        v->step = req->step;
        v->count = 0;
        v->overflow = 0;
        v->decided = 0;
        v->ncalls = 0;
        memset(v->voted, 0, svc->num_trainers);
    }
    if (v->ncalls == 2 * (int)svc->num_trainers)
        return pst_error_set(PST_ERR_STATE, "Vote of trainer %u for step %lld: too many "
                             "retries waiting", req->trainer_id, (long long)req->step);
    v->calls[v->ncalls++] = call;
    if (!v->voted[req->trainer_id]) {
        v->voted[req->trainer_id] = 1;
        v->count++;
        v->overflow |= req->overflow;
    }
    return PST_OK;
}

/* A step's decision, to send once svc->mu is released (answer_votes). */
typedef struct vote_answer {
    int64_t step;
    int skip;                     /* the decision: some trainer's gradient overflowed */
    int decided_now;              /* this vote decided the step */
    long skipped;                 /* steps skipped so far, this one included */
    rpc_call **calls;             /* (n) the calls to answer, a list of this vote's own */
    int n;
} vote_answer;

/* Decides slot `v`'s step once every trainer has voted, taking its waiting calls into a
 * list of this call's own: with retries, step + 2 can be decided (and the slot reused)
 * before the last of these answers is out. Without memory for the list they are answered
 * here, under the lock. Called with svc->mu held. */
static void decide_vote_locked(ps_service *svc, vote_slot *v, int64_t step, vote_answer *a)
{
    *a = (vote_answer){.step = step};
    if (v->count == svc->num_trainers) {
        v->decided = a->decided_now = 1;
        a->n = v->ncalls;
        a->calls = malloc((size_t)a->n * sizeof *a->calls);
        if (a->calls) {
            memcpy(a->calls, v->calls, (size_t)a->n * sizeof *v->calls);
            v->ncalls = 0;
        }
        if (v->overflow)
            svc->skipped++;
    }
    a->skip = v->overflow;
    a->skipped = svc->skipped;
    if (a->n && !a->calls) { /* no memory for the list: answer under the lock */
        for (int i = 0; i < a->n; i++)
            answer_vote(v->calls[i], step, a->skip);
        v->ncalls = 0;
        a->n = 0;
    }
}

/* Sends a decision (nothing while the step waits for votes) and logs a skipped step.
 * Called without svc->mu. */
static void answer_votes(vote_answer *a)
{
    if (a->decided_now && a->skip)
        PST_INFO("step %lld skipped everywhere: a trainer's fp16 gradient overflowed (%ld "
                 "skipped so far)", (long long)a->step, a->skipped);
    for (int i = 0; i < a->n; i++)
        answer_vote(a->calls[i], a->step, a->skip);
    free(a->calls);
}

/* fp16 dynamic loss scaling: one decision per step that every trainer and pserver agrees
 * on. Every trainer sends its vote (did its summed gradient overflow?) to pserver 0 after
 * backward and before any push of the step; the call is parked until all num_trainers
 * have voted, then every vote of the step is answered with the OR. On skip no trainer
 * pushes the step at all, so no pserver sees it: values, optimizer state and versions stay
 * as they were, on every pserver, without the pservers talking to each other. A retried
 * vote counts once (and is answered too); a vote after the decision gets the decision. */
static void handle_vote(ps_service *svc, rpc_call *call)
{
    const Pstrain__VoteRequest *req = (const Pstrain__VoteRequest *)rpc_call_request(call);
    pthread_mutex_lock(&svc->mu);
    vote_slot *v = &svc->votes[req->step & 1];
    pst_status st = check_vote_locked(svc, req, v);
    if (st != PST_OK) {
        pthread_mutex_unlock(&svc->mu);
        fail(call, st);
        return;
    }
    if (v->step == req->step && v->decided) { /* a retry after the answer */
        int skip = v->overflow;
        pthread_mutex_unlock(&svc->mu);
        answer_vote(call, req->step, skip);
        return;
    }
    if ((st = record_vote_locked(svc, req, v, call)) != PST_OK) {
        pthread_mutex_unlock(&svc->mu);
        fail(call, st);
        return;
    }
    vote_answer a;
    decide_vote_locked(svc, v, req->step, &a);
    pthread_mutex_unlock(&svc->mu);
    answer_votes(&a);
}

/* Fails every Vote waiting for the others' (the job cannot decide that step any more).
 * Called with svc->mu held; rpc_call_fail does not call back into the service. */
static void fail_votes_locked(ps_service *svc, pst_status st, const char *why)
{
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < svc->votes[k].ncalls; i++)
            rpc_call_fail(svc->votes[k].calls[i], st, "Vote: %s", why);
        svc->votes[k].ncalls = 0;
    }
}

/* ---- Finish --------------------------------------------------------------------------- */

/* The one INFO line on the low-precision copy's casts (nothing without a copy). Optimizer
 * steps are the highest block version (sync: every block makes each step). */
static void log_casts(ps_service *svc)
{
    pthread_mutex_lock(&svc->mu);
    int first = svc->store && !svc->casts_logged;
    svc->casts_logged |= first;
    pthread_mutex_unlock(&svc->mu);
    if (!first)
        return;
    ps_service_report r;
    ps_service_get_report(svc, &r);
    if (svc->lowp != PST_F32)
        PST_INFO("casts: %llu elements to %s in %lld optimizer steps (%llu per step), %llu "
                 "parameters owned", (unsigned long long)r.casts, r.precision,
                 (long long)r.optimizer_steps,
                 (unsigned long long)(r.optimizer_steps > 0 ? r.casts / (uint64_t)r.optimizer_steps
                                                            : 0),
                 (unsigned long long)r.owned);
    PST_INFO("pull casts: %llu elements cast for single pulls (0 when every pull is in the "
             "job's precision)", (unsigned long long)r.pull_casts);
    PST_INFO("state: hash %016llx of the values, optimizer state and versions after %lld "
             "optimizer steps (%ld skipped for fp16 overflow)",
             (unsigned long long)r.state_hash, (long long)r.optimizer_steps, r.skipped_steps);
}

void ps_service_get_report(ps_service *svc, ps_service_report *out)
{
    *out = (ps_service_report){.precision = "f32"};
    pthread_mutex_lock(&svc->mu);
    ps_store *store = svc->store;
    out->skipped_steps = svc->skipped;
    out->pull_casts = __atomic_load_n(&svc->pull_casts, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&svc->mu);
    if (!store)
        return;
    out->initialized = 1;
    out->precision = pst_dtype_name(svc->lowp);
    for (size_t i = 0; i < svc->nblock_ids; i++) {
        int64_t v = ps_store_version(store, svc->block_ids[i]);
        out->optimizer_steps = v > out->optimizer_steps ? v : out->optimizer_steps;
    }
    out->casts = ps_store_cast_count(store);
    out->owned = ps_store_total_length(store);
    ps_tables *tables = __atomic_load_n(&svc->tables, __ATOMIC_ACQUIRE);
    out->sparse_tables = ps_tables_count(tables);
    ps_tables_totals_of(tables, &out->sparse, 1);
    out->state_hash = ps_store_state_hash(store);
}

uint64_t ps_service_cast_count(ps_service *svc)
{
    pthread_mutex_lock(&svc->mu);
    ps_store *store = svc->store;
    pthread_mutex_unlock(&svc->mu);
    return store ? ps_store_cast_count(store) : 0;
}

/* Trainer `id` is done: Finish (early: it leaves before the job's end, `why` says at
 * which step and why) or its Watch was cancelled. A departure fails at once every pull and
 * vote waiting for a step that can no longer complete. `finish_call` (may be NULL) is
 * answered before "every trainer finished" is announced: main() fails every call still
 * unanswered when it shuts the server down. */
static void trainer_done(ps_service *svc, uint32_t id, int early, const char *why,
                         rpc_call *finish_call)
{
    pthread_mutex_lock(&svc->mu);
    int first = !svc->finished[id];
    int departs = 0;
    rpc_call *watch = svc->watch[id];
    svc->watch[id] = NULL;
    if (first) {
        __atomic_store_n(&svc->finished[id], 1, __ATOMIC_RELEASE);
        svc->nfinished++;
        PST_INFO("trainer %u finished (%u of %u)%s%s", id, svc->nfinished, svc->num_trainers,
                 early ? ", early: " : "", early ? why : "");
        if (early && (svc->wait_mode || svc->nfinished < svc->num_trainers) &&
            !__atomic_load_n(&svc->departed_set, __ATOMIC_ACQUIRE)) {
            snprintf(svc->departed, sizeof svc->departed, "trainer %u %s", id, why);
            svc->departed_at = pst_clock_s();
            __atomic_store_n(&svc->departed_set, 1, __ATOMIC_RELEASE);
            departs = 1;
        }
    }
    int all = svc->nfinished == svc->num_trainers;
    if (departs) {
        fail_votes_locked(svc, PST_ERR_STATE, svc->departed);
        pthread_cond_broadcast(&svc->cv);
    }
    ps_store *store = svc->store;
    pthread_mutex_unlock(&svc->mu);
    if (departs) {
        PST_WARN("%s: failing the pulls that wait for it", svc->departed);
        ps_store_cancel_waiters(store, PST_ERR_STATE);
        ps_tables_fail_waiting(__atomic_load_n(&svc->tables, __ATOMIC_ACQUIRE), PST_ERR_STATE,
                               svc->departed);
    }
    if (watch) { /* the trainer is done: nothing left to watch */
        Pstrain__WatchReply wr = PSTRAIN__WATCH_REPLY__INIT;
        rpc_call_reply(watch, &wr.base, NULL, 0, NULL, NULL);
    }
    if (finish_call) {
        Pstrain__FinishReply reply = PSTRAIN__FINISH_REPLY__INIT;
        ps_tables_totals tt;
        ps_tables_totals_of(__atomic_load_n(&svc->tables, __ATOMIC_ACQUIRE), &tt, 1);
        reply.sparse_rows = tt.rows;
        reply.sparse_bytes = tt.bytes;
        reply.rows_created = tt.created;
        reply.rows_evicted = tt.evicted;
        reply.pushes_refused = tt.refused;
        reply.sparse_hash = tt.hash;
        rpc_call_reply(finish_call, &reply.base, NULL, 0, NULL, NULL);
    }
    if (all) {
        log_casts(svc);
        pthread_mutex_lock(&svc->mu);
        svc->all_finished = 1;
        pthread_cond_broadcast(&svc->cv);
        pthread_mutex_unlock(&svc->mu);
    }
}

/* Whether a Finish names a trainer of this store; its store, and whether this pserver
 * writes snapshots (sync, with a checkpoint directory). Takes and releases svc->mu. */
static pst_status check_finish(ps_service *svc, const Pstrain__FinishRequest *req,
                               ps_store **store, int *snapshots)
{
    pthread_mutex_lock(&svc->mu);
    if (!svc->store || req->trainer_id >= svc->num_trainers) {
        pthread_mutex_unlock(&svc->mu);
        return pst_error_set(svc->store ? PST_ERR_INVALID : PST_ERR_STATE,
                             "Finish from trainer %u: %s", req->trainer_id,
                             svc->store ? "no such trainer" : "before Init");
    }
    *store = svc->store;
    *snapshots = svc->ckpt_dir[0] && svc->sync;
    pthread_mutex_unlock(&svc->mu);
    return PST_OK;
}

/* Trainer 0 stops at a step boundary (SIGTERM) with every block at that version: the shard
 * of it, written before the answer (its job state completes the checkpoint); PST_OK for any
 * other Finish. A failure is logged. Called without svc->mu. */
static pst_status checkpoint_at_finish(ps_service *svc, const Pstrain__FinishRequest *req,
                                       ps_store *store, int snapshots)
{
    if (req->checkpoint_step <= 0 || req->trainer_id != 0)
        return PST_OK;
    pst_status st = snapshots ? ps_store_snapshot_now(store, req->checkpoint_step)
                              : pst_error_set(PST_ERR_STATE, "this pserver writes no "
                                              "checkpoints (no --checkpoint-dir, or async)");
    if (st == PST_OK && ps_service_failure(svc))
        st = pst_error_set(PST_ERR_IO, "%s", ps_service_failure(svc));
    if (st != PST_OK)
        PST_WARN("Finish of trainer 0 at step %lld: no checkpoint of it: %s",
                 (long long)req->checkpoint_step, pst_error_detail());
    return st;
}

/* How a Finish ends, after its checks (classify_finish). */
typedef enum finish_kind {
    FINISH_DONE,    /* the trainer is done (trainer_done) */
    FINISH_LET_GO,  /* it left before its first step here, to join again (answer_let_go) */
    FINISH_STALE,   /* an early Finish from before the rollback: ignored */
} finish_kind;

/* --on-failure wait: trainer `id` is let go: it is no longer joined, must Init again within
 * --peer-timeout-ms (ps_service_wait), and its Watch is taken off (returned, to answer).
 * Called with svc->mu held. */
static rpc_call *let_go_locked(ps_service *svc, uint32_t id)
{
    if (!svc->let_go_at)
        svc->let_go_at = calloc(svc->num_trainers, sizeof *svc->let_go_at);
    svc->joined[id] = 0;
    if (svc->let_go_at)
        svc->let_go_at[id] = pst_clock_s();
    rpc_call *watch = svc->watch[id];
    svc->watch[id] = NULL;
    pthread_cond_broadcast(&svc->cv); /* a rollback may wait for no one else now */
    return watch;
}

/* Which kind of Finish this is (the trainer checked by check_finish); a trainer let go is
 * let go here, *watch its Watch to answer. Takes and releases svc->mu.
 *
 * --on-failure wait: a trainer that joined this store but leaves before its first step in
 * it, to start a new run at once (its pservers disagreed on the step, one of them was
 * rolling back), pushed nothing here: it is let go and joins again with its next Init.
 * Rolling back for it would fail the trainers that already train on this store, who would
 * then leave the stores they had just joined elsewhere: the stores would roll back one
 * after the other for ever. Not trainer 0: its Init made the store, and its next one may
 * offer other checkpoints (a fallback), which needs a new store. An early Finish of a
 * trainer that has not joined this store is from its run before the rollback (stale). */
static finish_kind classify_finish(ps_service *svc, const Pstrain__FinishRequest *req,
                                   rpc_call **watch)
{
    pthread_mutex_lock(&svc->mu);
    const uint32_t id = req->trainer_id;
    const int stale = svc->wait_mode && req->early && !svc->joined[id];
    const int lets_go = !stale && svc->wait_mode && req->early && req->step < 0 &&
                        req->rejoins && id != 0 && !svc->finished[id];
    *watch = lets_go ? let_go_locked(svc, id) : NULL;
    pthread_mutex_unlock(&svc->mu);
    return lets_go ? FINISH_LET_GO : stale ? FINISH_STALE : FINISH_DONE;
}

static void answer_finish(rpc_call *call)
{
    Pstrain__FinishReply reply = PSTRAIN__FINISH_REPLY__INIT;
    rpc_call_reply(call, &reply.base, NULL, 0, NULL, NULL);
}

/* The answers to a trainer let go: its Watch (nothing left to watch) and its Finish.
 * Called without svc->mu. */
static void answer_let_go(const Pstrain__FinishRequest *req, rpc_call *call, rpc_call *watch)
{
    PST_INFO("trainer %u left before its first step here to start again (%s): it joins "
             "again with its next Init; nothing to roll back", req->trainer_id,
             req->reason && req->reason[0] ? req->reason : "no reason given");
    if (watch) {
        Pstrain__WatchReply wr = PSTRAIN__WATCH_REPLY__INIT;
        rpc_call_reply(watch, &wr.base, NULL, 0, NULL, NULL);
    }
    answer_finish(call);
}

/* Why an early Finish leaves, for trainer_done (why is left as it is for a Finish at the
 * job's end). */
static void finish_why(const Pstrain__FinishRequest *req, char *why, size_t size)
{
    if (!req->early)
        return;
    char at[32];
    if (req->step < 0)
        snprintf(at, sizeof at, "before step 0");
    else
        snprintf(at, sizeof at, "at step %lld", (long long)req->step);
    snprintf(why, size, "left the job %s (%s)", at,
             req->reason && req->reason[0] ? req->reason : "no reason given");
}

/* A Finish: checked, trainer 0's checkpoint written, then the trainer is let go (to join
 * again), ignored (stale) or done. */
static void handle_finish(ps_service *svc, rpc_call *call)
{
    const Pstrain__FinishRequest *req = (const Pstrain__FinishRequest *)rpc_call_request(call);
    ps_store *store = NULL;
    int snapshots = 0;
    pst_status st = check_finish(svc, req, &store, &snapshots);
    if (st != PST_OK) {
        fail(call, st);
        return;
    }
    if ((st = checkpoint_at_finish(svc, req, store, snapshots)) != PST_OK) {
        fail(call, st);
        trainer_done(svc, req->trainer_id, req->early, "left the job (stopped by signal; "
                     "its checkpoint failed)", NULL);
        return;
    }
    rpc_call *watch;
    switch (classify_finish(svc, req, &watch)) {
    case FINISH_LET_GO:
        answer_let_go(req, call, watch);
        return;
    case FINISH_STALE:
        PST_INFO("an early Finish of trainer %u from before the rollback: ignored",
                 req->trainer_id);
        answer_finish(call);
        return;
    case FINISH_DONE:
        break;
    }
    char why[512] = "";
    finish_why(req, why, sizeof why);
    trainer_done(svc, req->trainer_id, req->early, why, call);
}

/* ---- Watch (liveness) ----------------------------------------------------------------- */

/* Trainer 0's open Watch when it is to be told to stop (taken off, stop_asked cleared: it
 * is told once), or NULL. Called with svc->mu held; answer_stop answers it after. */
static rpc_call *tell_stop_locked(ps_service *svc)
{
    if (!svc->stop_asked || !svc->watch || !svc->watch[0])
        return NULL;
    rpc_call *w = svc->watch[0];
    svc->watch[0] = NULL;
    svc->stop_asked = 0;
    return w;
}

static void answer_stop(rpc_call *watch)
{
    if (!watch)
        return;
    Pstrain__WatchReply wr = PSTRAIN__WATCH_REPLY__INIT;
    wr.stop = 1;
    rpc_call_reply(watch, &wr.base, NULL, 0, NULL, NULL);
}

/* A trainer's Watch stays open until its Finish (answered then) or until its client goes
 * away (ps_service_cancelled): then the trainer is gone. One per trainer: a newer one
 * replaces the older (answered). */
static void handle_watch(ps_service *svc, rpc_call *call)
{
    const Pstrain__WatchRequest *req = (const Pstrain__WatchRequest *)rpc_call_request(call);
    pthread_mutex_lock(&svc->mu);
    pst_status st = PST_OK;
    if (!svc->store)
        st = pst_error_set(PST_ERR_STATE, "Watch before Init: this pserver has no trainers yet");
    else if (req->trainer_id >= svc->num_trainers)
        st = pst_error_set(PST_ERR_INVALID, "Watch from trainer %u: there are %u trainers",
                           req->trainer_id, svc->num_trainers);
    else if (svc->finished[req->trainer_id])
        st = pst_error_set(PST_ERR_STATE, "Watch of trainer %u after its Finish",
                           req->trainer_id);
    else if (!svc->joined[req->trainer_id]) /* its end would be the genuine trainer's */
        st = pst_error_set(PST_ERR_STATE, "Watch of trainer %u before its Init on this "
                           "pserver: send Init first", req->trainer_id);
    if (st != PST_OK) {
        pthread_mutex_unlock(&svc->mu);
        fail(call, st);
        return;
    }
    rpc_call *old = svc->watch[req->trainer_id];
    svc->watch[req->trainer_id] = call;
    if (req->stop) {
        PST_INFO("trainer %u was asked to stop: asking trainer 0 to stop the job at the next "
                 "step, with a checkpoint", req->trainer_id);
        svc->stop_asked = 1;
    }
    rpc_call *stop = tell_stop_locked(svc);
    pthread_mutex_unlock(&svc->mu);
    if (old) {
        Pstrain__WatchReply wr = PSTRAIN__WATCH_REPLY__INIT;
        rpc_call_reply(old, &wr.base, NULL, 0, NULL, NULL);
    }
    answer_stop(stop);
}

void ps_service_versions(ps_service *svc, int64_t *lo, int64_t *hi)
{
    *lo = *hi = -1;
    pthread_mutex_lock(&svc->mu);
    for (size_t i = 0; svc->store && i < svc->nblock_ids; i++) {
        const int64_t v = ps_store_version(svc->store, svc->block_ids[i]);
        *lo = *lo < 0 || v < *lo ? v : *lo;
        *hi = v > *hi ? v : *hi;
    }
    pthread_mutex_unlock(&svc->mu);
}

void ps_service_request_stop(ps_service *svc)
{
    pthread_mutex_lock(&svc->mu);
    svc->stop_asked = 1;
    rpc_call *stop = tell_stop_locked(svc);
    pthread_mutex_unlock(&svc->mu);
    answer_stop(stop);
}

/* The client of a Watch went away before its Finish: the trainer died, or keepalive pings
 * found its connection dead. */
static void watch_cancelled(ps_service *svc, rpc_call *call)
{
    pthread_mutex_lock(&svc->mu);
    int64_t id = -1;
    for (uint32_t t = 0; svc->watch && t < svc->num_trainers && id < 0; t++)
        if (svc->watch[t] == call)
            id = t;
    if (id >= 0)
        svc->watch[id] = NULL;
    const int64_t step = id >= 0 && svc->nblock_ids
                             ? ps_store_version(svc->store, svc->block_ids[0])
                             : -1;
    pthread_mutex_unlock(&svc->mu);
    if (id < 0)
        return; /* answered (Finish, a newer Watch) or failed (shutdown) meanwhile: done */
    rpc_call_fail(call, PST_ERR_TIMEOUT, "Watch: the client went away");
    char why[256];
    snprintf(why, sizeof why, "stopped answering at step %lld (its connection to this "
             "pserver closed: the process died, or keepalive pings went unanswered for "
             "--peer-timeout-ms)", (long long)step);
    trainer_done(svc, (uint32_t)id, 1, why, NULL);
}

/* PullSparse and PushSparse go to the sparse tables (tables.h) once trainer 0's Init has
 * made them. */
static void handle_sparse(ps_service *svc, rpc_call *call)
{
    ps_tables *tables = __atomic_load_n(&svc->tables, __ATOMIC_ACQUIRE);
    if (!tables)
        fail(call, pst_error_set(PST_ERR_STATE, "%s before Init: this pserver has no sparse "
                                 "tables yet", rpc_method_name(rpc_call_method(call))));
    else if (rpc_call_method(call) == RPC_METHOD_PULL_SPARSE)
        ps_tables_pull(tables, call);
    else
        ps_tables_push(tables, call);
}

/* The trainer_id a request speaks for (every method has one). */
static uint32_t claimed_trainer(rpc_call *call)
{
    const ProtobufCMessage *m = rpc_call_request(call);
    switch (rpc_call_method(call)) {
    case RPC_METHOD_INIT: return ((const Pstrain__InitRequest *)m)->trainer_id;
    case RPC_METHOD_PUSH: return ((const Pstrain__PushRequest *)m)->trainer_id;
    case RPC_METHOD_PULL: return ((const Pstrain__PullRequest *)m)->trainer_id;
    case RPC_METHOD_FINISH: return ((const Pstrain__FinishRequest *)m)->trainer_id;
    case RPC_METHOD_VOTE: return ((const Pstrain__VoteRequest *)m)->trainer_id;
    case RPC_METHOD_WATCH: return ((const Pstrain__WatchRequest *)m)->trainer_id;
    case RPC_METHOD_PULL_SPARSE: return ((const Pstrain__PullSparseRequest *)m)->trainer_id;
    case RPC_METHOD_PUSH_SPARSE: return ((const Pstrain__PushSparseRequest *)m)->trainer_id;
    default: return 0;
    }
}

void ps_service_handle(void *arg, rpc_call *call)
{
    ps_service *svc = arg;
    /* A trainer speaks only for itself once its credentials name it (rpc_call_identity):
     * a call for another is refused and changes nothing. */
    const char *by = "";
    const int id = rpc_call_identity(call, &by);
    if (id >= 0 && (uint32_t)id != claimed_trainer(call)) {
        fail(call, pst_error_set(PST_ERR_DENIED, "%s from trainer %d (%s) claims trainer_id %u: "
                                 "a trainer speaks only for itself",
                                 rpc_method_name(rpc_call_method(call)), id, by,
                                 claimed_trainer(call)));
        return;
    }
    static void (*const handlers[RPC_METHOD_COUNT_])(ps_service *, rpc_call *) = {
        [RPC_METHOD_INIT] = handle_init,          [RPC_METHOD_PUSH] = handle_push,
        [RPC_METHOD_PULL] = handle_pull,          [RPC_METHOD_FINISH] = handle_finish,
        [RPC_METHOD_VOTE] = handle_vote,          [RPC_METHOD_WATCH] = handle_watch,
        [RPC_METHOD_PULL_SPARSE] = handle_sparse, [RPC_METHOD_PUSH_SPARSE] = handle_sparse,
    };
    const unsigned m = (unsigned)rpc_call_method(call);
    if (m < RPC_METHOD_COUNT_ && handlers[m])
        handlers[m](svc, call);
    else
        fail(call, pst_error_set(PST_ERR_NOT_FOUND, "unknown method"));
}

/* Inits still waiting for trainer 0 when their client's deadline is near are answered
 * DEADLINE_EXCEEDED with the reason. A call without a deadline waits on (it holds one slot
 * of its trainer id; a newer Init of that id replaces it). Called with svc->mu held. */
static void expire_parked_locked(ps_service *svc)
{
    for (int i = 0; i < svc->nparked;) {
        rpc_call *call = svc->parked[i];
        int64_t left = rpc_call_deadline_left_ms(call);
        if (left < 0 || left > INIT_ANSWER_MARGIN_MS) {
            i++;
            continue;
        }
        const Pstrain__InitRequest *req = (const Pstrain__InitRequest *)rpc_call_request(call);
        uint32_t id = req->trainer_id;
        svc->parked[i] = svc->parked[--svc->nparked];
        svc->inits_expired++;
        rpc_call_fail(call, PST_ERR_TIMEOUT, "Init of trainer %u: trainer 0 has not sent its "
                      "Init to this pserver before the call's deadline; start trainer 0 "
                      "(PSTRAIN_TRAINER_ID=0) with the same pservers and flags, or give the "
                      "trainers a longer --rpc-timeout-ms", id);
    }
}

/* --on-failure wait: a departed job is over for this store once every trainer that joined
 * it has finished (each learns of the departure from its failed pulls) or a peer timeout
 * has passed (one that joined but is silent). Called with svc->mu held. */
static int rollback_due_locked(ps_service *svc)
{
    if (!svc->wait_mode || !__atomic_load_n(&svc->departed_set, __ATOMIC_ACQUIRE))
        return 0;
    if (pst_clock_s() - svc->departed_at > (double)svc->peer_timeout_ms / 1e3)
        return 1;
    for (uint32_t t = 0; t < svc->num_trainers; t++)
        if (svc->joined[t] && !svc->finished[t])
            return 0;
    return 1;
}

int ps_service_wait(ps_service *svc, volatile int *stop)
{
    pthread_mutex_lock(&svc->mu);
    while (!svc->all_finished && !*stop && !__atomic_load_n(&svc->ckpt_failed, __ATOMIC_ACQUIRE)) {
        if (rollback_due_locked(svc))
            break;
        /* A trainer let go to start again that has not sent its Init within the peer
         * timeout (its process died meanwhile, say) has left the job: the others are told
         * now, not at their calls' deadline. */
        for (uint32_t t = 0; svc->let_go_at && t < svc->num_trainers; t++) {
            const double since = svc->let_go_at[t] > 0 ? pst_clock_s() - svc->let_go_at[t] : 0;
            if (since <= (double)svc->peer_timeout_ms / 1e3)
                continue;
            svc->let_go_at[t] = 0;
            char why[160];
            snprintf(why, sizeof why, "left before its first step to start again, and sent no "
                     "new Init within --peer-timeout-ms %ld", svc->peer_timeout_ms);
            pthread_mutex_unlock(&svc->mu);
            trainer_done(svc, t, 1, why, NULL);
            pthread_mutex_lock(&svc->mu);
        }
        if (svc->init_by > 0 && svc->store && svc->nblock_ids &&
            ps_store_version(svc->store, svc->block_ids[0]) > svc->resumed)
            svc->init_by = 0; /* the job went on after the rollback */
        if (svc->init_by > 0 && pst_clock_s() > svc->init_by) {
            /* After a rollback the job must go on in time (the recovery timeout). */
            uint32_t missing = 0;
            while (svc->store && missing < svc->num_trainers && svc->joined[missing])
                missing++;
            char why[sizeof svc->fatal];
            snprintf(why, sizeof why, "%s", svc->fatal);
            if (!svc->store || missing < svc->num_trainers)
                snprintf(svc->fatal, sizeof svc->fatal, "--on-failure wait: trainer %u has not "
                         "sent its Init %s", svc->store ? missing : 0, why);
            else
                snprintf(svc->fatal, sizeof svc->fatal, "--on-failure wait: the job has not "
                         "made a step %s", why);
            PST_ERROR("%s", svc->fatal);
            __atomic_store_n(&svc->fatal_set, 1, __ATOMIC_RELEASE);
            break;
        }
        expire_parked_locked(svc);
        pst_cond_wait_ms(&svc->cv, &svc->mu, 100);
    }
    int done = svc->all_finished;
    pthread_mutex_unlock(&svc->mu);
    return done;
}

void ps_service_cancel(ps_service *svc)
{
    /* The calls still waiting learn why: the failure that stops this pserver (a checkpoint
     * it could not write, ...), else its shutdown. */
    char why[1300];
    const char *failure = ps_service_failure(svc);
    if (failure)
        snprintf(why, sizeof why, "pserver shutting down: %s", failure);
    else
        snprintf(why, sizeof why, "pserver shutting down");
    pthread_mutex_lock(&svc->mu);
    for (int i = 0; i < svc->nparked; i++)
        rpc_call_fail(svc->parked[i], PST_ERR_UNAVAILABLE, "%s", why);
    svc->nparked = 0;
    fail_votes_locked(svc, PST_ERR_UNAVAILABLE, why);
    for (uint32_t t = 0; svc->watch && t < svc->num_trainers; t++)
        if (svc->watch[t]) {
            rpc_call_fail(svc->watch[t], PST_ERR_UNAVAILABLE, "%s", why);
            svc->watch[t] = NULL;
        }
    ps_store *store = svc->store;
    pthread_mutex_unlock(&svc->mu);
    pst_error_set(PST_ERR_UNAVAILABLE, "%s", why); /* the detail the pulls are failed with */
    if (store)
        ps_store_cancel_waiters(store, PST_ERR_UNAVAILABLE);
    ps_tables_fail_waiting(__atomic_load_n(&svc->tables, __ATOMIC_ACQUIRE), PST_ERR_UNAVAILABLE,
                           why);
    log_casts(svc); /* at shutdown, unless every trainer's Finish has written it */
}
