/* remote.c — the trainer's link to the pservers (see remote.h).
 *
 * DESIGN: one context per block holds the block's Push and Pull request headers and the
 * state of its exchange (a count of outstanding callbacks: push done, push payload
 * released, pull done), so an exchange allocates nothing. Init and Finish are waited for
 * with one counter under the link's mutex; every call has a deadline, so waits are
 * bounded.
 * Scheduling (after P3 and ByteScheduler's credits): the trainer's network link lets at
 * most `window` bytes of Pushes be in flight (from the call until its answer), to all its
 * pservers together; the others wait in a queue taken lowest (step, block) first. The
 * window is the trainer's, not each pserver's, because the pushes to every pserver share
 * the one link the trainer has: with a window per pserver, S pservers put S windows on it
 * at once, every block shares the link with every other and they all finish together at
 * the end of the step, so no pull can overlap a push. Blocks are in buffer order, so the
 * queue's order is forward order: backward produces the first layer's gradient last, and
 * its exchange overtakes the later layers' still waiting, so the next forward can start
 * sooner. Consecutive blocks are on different pservers (plan.h), so a window of one block
 * per pserver (the default, --send-window auto) sends a round of S blocks at a time, each
 * to its own pserver, and every pserver's link carries its share while the pulls of the
 * rounds before come back on the other direction of the full-duplex links. A wider window
 * only makes the last rounds finish together, and the step's tail (their pulls) longer.
 * Where every pserver is on this host (shared memory) there is no link to pace, only the
 * calls' latency to cover: auto is then at least TR_REMOTE_SAME_HOST_WINDOW. The Pulls
 * are not windowed: in sync mode each one waits at the pserver for its push.
 * Credits (sync, --send-ahead): a block's pull is answered only when every trainer pushed
 * it, so a trainer whose TCP flows got more of a shared pserver link than the others' runs
 * ahead, its pulls wait for the slowest, and at the end of the step the pserver's upload
 * still has the pulls of the blocks the slowest pushed last. So once the step's blocks are
 * all queued (backward is over), a push starts only if its block is fewer than `ahead`
 * blocks past the lowest block whose exchange has not ended: a trainer ahead waits, and
 * the link's share goes to the others. Never a deadlock: every block below a trainer's
 * lowest has ended, so the lowest block not ended anywhere is the next push of every
 * trainer that has not pushed it, and it is always allowed. Before backward is over
 * nothing is held: the pushes overlap backward as before.
 * Pipelines: each stage (the blocks with the same holders, plan.h) waits in a queue of its
 * own, and the window takes the queues' heads in turn (lowest step first), so every stage
 * has its pushes in flight as soon as its backward made them, as Paddle's per-device
 * streams do, instead of the first stage's blocks overtaking the last stage's rest. The
 * credits count within each queue (a stage's lowest block not ended); the argument above
 * holds queue by queue, since every trainer has the same plan. Without a pipeline there
 * is one queue and all this is the one lowest-first queue. */
#include "trainer/remote.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/memory.h"
#include "pserver/sparse.h"
#include "rpc/client.h"
#include "rpc/shm.h"
#include "rpc/transport.h"
#include "rpc/global.h"
#include "trainer/chain.h"

/* A chain's trainer k >= 1 (chain.h): where its push of a block stands this step. Whichever
 * of the push (once trainer k-1's sum is here) and a failed pull comes first moves it out of
 * CHAIN_WAITING; the other sees that and does not act. */
enum chain_push { CHAIN_WAITING, CHAIN_PUSHING, CHAIN_GIVEN_UP };

typedef struct block_ctx {
    tr_remote *r;
    const tr_block *b;
    Pstrain__PushRequest push;
    Pstrain__PullRequest pull;
    /* the exchange in flight */
    atomic_int pending;
    void *dst;          /* the values: f32 at start, the precision's dtype in a step */
    pst_dtype dst_dtype;
    void *wire_grad;    /* the gradient cast to --grad-dtype for a push in the call (NULL:
                         * pushed as f32, or through shared memory) */
    uint64_t shard_off; /* its first element in its pserver's shard (the Init's order) */
    int server;         /* the client's server its push and pull go to: its pserver, or in
                         * a chain (chain.h) the next trainer's relay */
    float *chain_sum;   /* a chain's trainer k >= 1: the sum so far it pushes on (f32) */
    int joined;         /* a chain's trainer k >= 1: of its gradient and trainer k-1's sum,
                         * how many are here for the step (the second queues the push);
                         * under the link's sched.mu */
    atomic_int pushing; /* a chain's trainer k >= 1, this step: a chain_push state */
    size_t area_off;    /* its first byte in its pserver's values area (rpc/shm.h) */
    tr_exchange_fn done;
    void *done_arg;
    pthread_mutex_t mu; /* guards err */
    pst_sticky err;     /* the exchange's first failure */
    tr_exchange_times times;
    /* waiting for the window */
    int queue;          /* its holders' queue (link_sched) */
    int rank;           /* its place in that queue's blocks, in buffer order */
    long step;
    const float *grad;
    float scale;
} block_ctx;

/* Exchanges waiting for the window, of blocks with the same holders (a pipeline's stage). */
typedef struct link_queue {
    uint64_t holders;
    block_ctx **heap; /* a binary min-heap by (step, block) */
    int n;
    int *blocks;       /* its blocks, in buffer order (nblocks) */
    int nblocks;
    int lowest;        /* credits: the rank of its lowest block whose exchange has not ended */
} link_queue;

/* The trainer's window: the exchanges in flight and those waiting. */
typedef struct link_sched {
    pthread_mutex_t mu;
    size_t inflight;     /* bytes */
    link_queue *queues;  /* one per set of holders, in the order of their first block */
    int nqueues;
    int turn;            /* the queue whose head goes first among equals */
    block_ctx **slots;   /* (nblocks): the queues' heaps, end to end */
    int *order;          /* (nblocks): the queues' blocks, end to end */
    /* credits (sync): the step whose exchanges are queued, how many of them, which have
     * ended (push answered and pull landed); each queue's lowest that has not */
    long step;
    int nqueued;
    unsigned char *ended; /* (nblocks) */
    int ahead;           /* blocks past a queue's lowest a push may start; 0: no limit */
} link_sched;

static int goes_before(const block_ctx *a, const block_ctx *b)
{
    return a->step != b->step ? a->step < b->step : a->b->id < b->b->id;
}

static void heap_push(link_queue *q, block_ctx *c)
{
    int i = q->n++;
    while (i > 0 && goes_before(c, q->heap[(i - 1) / 2])) {
        q->heap[i] = q->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    q->heap[i] = c;
}

static void heap_pop(link_queue *q)
{
    block_ctx *last = q->heap[--q->n];
    int i = 0, n = q->n;
    for (;;) {
        int k = 2 * i + 1;
        if (k >= n)
            break;
        if (k + 1 < n && goes_before(q->heap[k + 1], q->heap[k]))
            k++;
        if (!goes_before(q->heap[k], last))
            break;
        q->heap[i] = q->heap[k];
        i = k;
    }
    if (n > 0)
        q->heap[i] = last;
}


/* One pserver's PullSparse or PushSparse of a blocking sparse batch (tr_remote_pull_sparse,
 * tr_remote_push_sparse). */
typedef struct sparse_call {
    struct tr_remote *r;
    int s;
    Pstrain__PullSparseRequest pull;
    Pstrain__PushSparseRequest push;
    float *rows;   /* pull: where the rows land */
    size_t n, dim;
    pst_dtype dtype;
    void *buf;     /* push: its payload (keys, then rows in dtype), kept across steps */
    size_t cap;
} sparse_call;

typedef struct watch_arg {
    struct tr_remote *r;
    int server;
} watch_arg;

struct tr_remote {
    tr_link base;      /* first: the link interface (link.h) */
    tr_link_settings cfg;  /* what it reads of the job's settings */
    const tr_plan *plan; /* the caller's */
    rpc_client *client;
    rpc_transport *transport; /* insecure or TLS, for both clients */
    _Atomic uint64_t held_max_us; /* link.h's take_held */
    _Atomic uint64_t pushed_bytes, pulled_bytes; /* payloads (link.h's traffic) */
    int rpc_inited;
    block_ctx *blocks; /* (plan.nblocks) */
    link_sched sched;  /* the trainer's link: pushes in flight and waiting */
    size_t window;     /* its bytes (cfg->send_window, or auto's); 0: no limit */
    /* blocking batches (Init, Finish, start's pulls) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long pending;
    pst_sticky err; /* the batch's first failure */
    /* liveness: a Watch open on every pserver from the start to Finish, on a client of
     * its own (its long deadline, no retries) */
    rpc_client *watcher;
    Pstrain__WatchRequest watch;
    Pstrain__WatchRequest stop_watch; /* this trainer's Watch asking the job to stop */
    watch_arg wargs[PST_MAX_PSERVERS];
    atomic_int finishing;
    /* same host, sync: what this trainer shares with each pserver (rpc/shm.h) */
    rpc_shm_link shm[PST_MAX_PSERVERS];
    int joined[PST_MAX_PSERVERS]; /* its Init here succeeded (this run) */
    sparse_call sparse[PST_MAX_PSERVERS];
    tr_sparse_totals tables; /* the pservers' at their Finish replies (under mu) */
    /* leaving the job after a failed push (leave_on_push_failure) */
    atomic_int left;
    Pstrain__FinishRequest leave;
    char leave_reason[640];
    /* a chain of trainers (chain.h, cfg.chain_len > 0): this trainer's relay (trainer
     * k >= 1) and the client's server index of the next trainer's (k < T-1; -1: none) */
    tr_chain *chain;
    int chain_next;
};

/* ---- blocking batches ----------------------------------------------------------------- */

/* The failure st (detail: what failed) of something mu guards, kept if it is the first. */
static void fail_locked(pthread_mutex_t *mu, pst_sticky *err, pst_status st, const char *detail)
{
    pthread_mutex_lock(mu);
    pst_sticky_fail(err, st, detail);
    pthread_mutex_unlock(mu);
}

static void batch_error(tr_remote *r, pst_status st, const char *detail)
{
    fail_locked(&r->mu, &r->err, st, detail);
}

static void batch_add(tr_remote *r, long n)
{
    pthread_mutex_lock(&r->mu);
    r->pending += n;
    pthread_mutex_unlock(&r->mu);
}

static void batch_done(tr_remote *r)
{
    pthread_mutex_lock(&r->mu);
    if (--r->pending == 0)
        pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static pst_status batch_wait(tr_remote *r)
{
    pthread_mutex_lock(&r->mu);
    while (r->pending > 0)
        pthread_cond_wait(&r->cv, &r->mu);
    char detail[PST_ERROR_DETAIL_MAX];
    const pst_status st = pst_sticky_read(&r->err, detail);
    pst_sticky_reset(&r->err);
    pthread_mutex_unlock(&r->mu);
    return pst_sticky_raise(st, detail);
}

/* ---- one block's exchange ------------------------------------------------------------- */

static void exchange_error(block_ctx *c, pst_status st, const char *detail)
{
    fail_locked(&c->mu, &c->err, st, detail);
}

static void link_pump(tr_remote *r);

/* The bytes of a block's push: its gradient in --grad-dtype, or in a chain after its
 * first trainer the sum so far, in f32. */
static size_t push_bytes(const tr_remote *r, const block_ctx *c)
{
    return c->b->length * (r->chain ? sizeof(float) : pst_dtype_size(r->cfg.grad_dtype));
}

/* Where a block's exchange pushes and pulls: its pserver, or in a chain, but for its last
 * trainer, the next trainer's relay. */
static int exchange_server(const tr_remote *r, const block_ctx *c)
{
    return r->chain_next >= 0 ? r->chain_next : c->b->pserver;
}

/* The block's push has been answered (or failed): the next waiting exchange may start. */
static void window_release(block_ctx *c)
{
    link_sched *ls = &c->r->sched;
    pthread_mutex_lock(&ls->mu);
    ls->inflight -= push_bytes(c->r, c);
    pthread_mutex_unlock(&ls->mu);
    link_pump(c->r);
}

static void exchange_step_done(block_ctx *c)
{
    if (atomic_fetch_sub(&c->pending, 1) != 1)
        return;
    link_sched *ls = &c->r->sched;
    if (ls->ahead > 0) {
        pthread_mutex_lock(&ls->mu);
        if (c->step == ls->step) {
            ls->ended[c->b->id] = 1;
            link_queue *q = &ls->queues[c->queue];
            while (q->lowest < q->nblocks && ls->ended[q->blocks[q->lowest]])
                q->lowest++;
        }
        pthread_mutex_unlock(&ls->mu);
        link_pump(c->r);
    }
    char detail[PST_ERROR_DETAIL_MAX];
    detail[0] = '\0'; /* (an initializer would zero all 512 bytes, every exchange) */
    pthread_mutex_lock(&c->mu);
    const pst_status st = pst_sticky_read(&c->err, detail);
    pst_sticky_reset(&c->err);
    pthread_mutex_unlock(&c->mu);
    c->done(c->done_arg, st, detail);
}

static void push_released(void *arg)
{
    exchange_step_done(arg);
}

/* Where a pull's values came, as one payload view (rpc/wire.h): in the reply, in the
 * pserver's values area or in this block's pull slot, as the reply says (rpc/shm.h). */
static pst_status pulled_payload(const block_ctx *c, const Pstrain__PullReply *rep,
                                 pst_dtype dt, const rpc_payload *in_call, rpc_payload *out)
{
    const pst_status st = rpc_shm_link_pulled(&c->r->shm[c->b->pserver], rep->shm,
                                              rep->shm_values, in_call, c->shard_off,
                                              c->area_off, c->b->length, dt, out);
    if (st != PST_OK)
        return pst_error_wrap(st, "pull of block %u from %s", c->b->id,
                              rpc_client_server(c->r->client, c->server));
    if (rep->shm || rep->shm_values)
        atomic_fetch_add(&c->r->pulled_bytes, out->bytes);
    return PST_OK;
}

static void start_pull_done(void *arg, pst_status st, const char *detail);

/* A call to the next trainer's relay (chain.h) failed after its retries: the job cannot go
 * on through it, so every later call to it fails at once instead of each retrying for the
 * connect timeout. */
static void relay_failed(block_ctx *c, pst_status st, const char *detail)
{
    if (st != PST_OK && c->r->chain_next >= 0 && c->server == c->r->chain_next)
        rpc_client_give_up(c->r->client, c->server, detail);
}

/* A chain's trainer k >= 1 (chain.h): its pull of a step failed. Trainer k-1's pull of the
 * block fails with it, and an exchange still waiting for trainer k-1's sum ends now
 * instead of waiting for a sum that may never come (the push it will not make). */
static void chain_pull_failed(block_ctx *c, pst_status st, const char *detail)
{
    tr_chain_fail(c->r->chain, (int)c->b->id, st, detail);
    int waiting = CHAIN_WAITING;
    if (atomic_compare_exchange_strong(&c->pushing, &waiting, CHAIN_GIVEN_UP)) {
        exchange_step_done(c); /* push done */
        exchange_step_done(c); /* push released */
    }
}

/* The pull is a step's, by a chain's trainer k >= 1 (not the start's pull of values). */
static int chain_step_pull(const block_ctx *c)
{
    return c->r->chain && c->done != start_pull_done;
}

/* A block's pull failed: its call, its start or what came back. In a chain (k >= 1) the
 * exchange's push half ends with it (chain_pull_failed), or it would wait for ever for a
 * sum from a trainer that may be gone. */
static void pull_failed(block_ctx *c, pst_status st, const char *detail)
{
    exchange_error(c, st, detail);
    if (chain_step_pull(c))
        chain_pull_failed(c, st, detail);
}

static void pull_done(void *arg, pst_status st, const char *detail, const ProtobufCMessage *reply,
                      const rpc_payload *payload)
{
    block_ctx *c = arg;
    if (st == PST_OK) {
        c->times.pull_end = pst_clock_s();
        const Pstrain__PullReply *rep = (const Pstrain__PullReply *)reply;
        c->times.held = (double)rep->held_us * 1e-6;
        atomic_fetch_add(&c->r->pulled_bytes, payload ? payload->bytes : 0);
        uint64_t was = atomic_load(&c->r->held_max_us);
        while (rep->held_us > was &&
               !atomic_compare_exchange_weak(&c->r->held_max_us, &was, rep->held_us))
            ;
        pst_dtype dt;
        rpc_payload values;
        st = rpc_dtype_from_wire(rep->dtype, &dt);
        if (st == PST_OK && rep->length != c->b->length)
            st = pst_error_set(PST_ERR_FORMAT, "pull of block %u from %s: %llu values, expected %zu",
                               c->b->id, rpc_client_server(c->r->client, c->server),
                               (unsigned long long)rep->length, c->b->length);
        if (st == PST_OK && dt != c->dst_dtype && c->dst_dtype != PST_F32)
            st = pst_error_set(PST_ERR_FORMAT, "pull of block %u from %s: %s values, asked "
                               "for %s", c->b->id, rpc_client_server(c->r->client,
                                                                     c->server),
                               pst_dtype_name(dt), pst_dtype_name(c->dst_dtype));
        if (st == PST_OK)
            st = pulled_payload(c, rep, dt, payload, &values);
        if (st == PST_OK && c->dst_dtype != PST_F32) /* bf16/fp16 as they came */
            st = rpc_payload_read(&values, 0, c->dst, c->b->length * pst_dtype_size(dt));
        else if (st == PST_OK)
            st = rpc_payload_read_f32(&values, dt, 0, c->dst, c->b->length);
        if (st == PST_OK && chain_step_pull(c))
            st = tr_chain_values(c->r->chain, (int)c->b->id, c->pull.version, c->dst);
        if (st != PST_OK)
            pull_failed(c, st, pst_error_detail());
    } else {
        relay_failed(c, st, detail);
        pull_failed(c, st, detail);
    }
    exchange_step_done(c);
}

/* Pulls the block's values at `version` into c->dst, in c->dst_dtype. */
static void start_pull(block_ctx *c, int64_t version)
{
    c->pull.version = version;
    c->pull.dtype = rpc_dtype_to_wire(c->dst_dtype);
    int slot, values;
    rpc_shm_link_pull_asks(&c->r->shm[c->b->pserver], c->dst_dtype, &slot, &values);
    c->pull.shm = slot;
    c->pull.shm_values = values;
    c->times.pull_start = pst_clock_s();
    pst_status st = rpc_client_call_async(c->r->client, c->server, RPC_METHOD_PULL,
                                          &c->pull.base, NULL, 0, NULL, pull_done, c);
    if (st != PST_OK) { /* e.g. the next relay given up (relay_failed) */
        pull_failed(c, st, pst_error_detail());
        exchange_step_done(c);
    }
}

static void leave_done(void *arg, pst_status st, const char *detail,
                       const ProtobufCMessage *reply, const rpc_payload *payload)
{
    (void)arg;
    (void)reply;
    (void)payload;
    if (st != PST_OK)
        PST_DEBUG("early Finish: %s", detail);
}

/* Sync: a push that failed for good means this trainer cannot make the step, and its own
 * pull of the block (and every other trainer's) would wait for the deadline. It leaves
 * the job at once: an early Finish on every pserver, which fails every waiting pull with
 * the reason, this trainer's included. Once per link. */
static void leave_on_push_failure(block_ctx *c, const char *detail)
{
    tr_remote *r = c->r;
    if (atomic_exchange(&r->left, 1))
        return;
    snprintf(r->leave_reason, sizeof r->leave_reason, "push of block %u failed: %s", c->b->id,
             detail);
    pstrain__finish_request__init(&r->leave);
    r->leave.trainer_id = (uint32_t)r->cfg.trainer_id;
    r->leave.early = 1;
    r->leave.step = c->step;
    r->leave.reason = r->leave_reason;
    for (int s = 0; s < r->cfg.num_pservers; s++)
        if (rpc_client_call_async(r->client, s, RPC_METHOD_FINISH, &r->leave.base, NULL, 0, NULL,
                                  leave_done, r) != PST_OK)
            PST_DEBUG("early Finish to pserver %d: %s", s, pst_error_detail());
}

static void push_done(void *arg, pst_status st, const char *detail, const ProtobufCMessage *reply,
                      const rpc_payload *payload)
{
    block_ctx *c = arg;
    (void)reply;
    (void)payload;
    c->times.push_end = pst_clock_s();
    relay_failed(c, st, detail);
    window_release(c);
    if (st != PST_OK) {
        exchange_error(c, st, detail);
        if (c->r->cfg.mode == PST_MODE_ASYNC)
            exchange_step_done(c); /* the pull that would have followed */
        else
            leave_on_push_failure(c, detail);
    } else if (c->r->cfg.mode == PST_MODE_ASYNC) {
        start_pull(c, 0);
    }
    exchange_step_done(c);
}

/* A chain's trainer k >= 1 (chain.h): the sum so far of trainers 0..k-1 that trainer k-1
 * pushed here, plus this trainer's gradient rounded to --grad-dtype as its own push would
 * be, into c->chain_sum: the additions and the order of the pserver's sum. */
static pst_status chain_add(block_ctx *c)
{
    tr_remote *r = c->r;
    float *acc = c->chain_sum;
    const pst_status st = tr_chain_take(r->chain, (int)c->b->id, c->step, acc);
    if (st != PST_OK)
        return st;
    const size_t n = c->b->length;
    const pst_dtype gd = r->cfg.grad_dtype;
    if (gd == PST_F32) {
        for (size_t i = 0; i < n; i++)
            acc[i] += c->grad[i];
        return PST_OK;
    }
    enum { TILE = 2048 };
    uint16_t low[TILE];
    float wide[TILE];
    for (size_t i = 0; i < n; i += TILE) {
        const size_t m = n - i < TILE ? n - i : TILE;
        pst_cast(low, gd, c->grad + i, PST_F32, m);
        pst_cast(wide, PST_F32, low, gd, m);
        for (size_t j = 0; j < m; j++)
            acc[i + j] += wide[j];
    }
    return PST_OK;
}

/* Starts a block's exchange (it is counted in its link's window already). */
static void exchange_start(block_ctx *c)
{
    tr_remote *r = c->r;
    const int sync = r->cfg.mode == PST_MODE_SYNC;
    const long step = c->step;
    c->push.step = step;
    c->push.scale = c->scale == 1.0f ? 0.0f : c->scale;
    if (r->chain) { /* k >= 1: its pull to c->server is out already (tr_remote_exchange) */
        int waiting = CHAIN_WAITING;
        if (!atomic_compare_exchange_strong(&c->pushing, &waiting, CHAIN_PUSHING)) {
            window_release(c); /* given up: the exchange has ended */
            return;
        }
    } else {
        c->server = exchange_server(r, c);
        atomic_store(&c->pending, 3); /* push done, push released, pull done */
    }
    c->times.push_start = pst_clock_s();
    const size_t bytes = push_bytes(r, c);
    atomic_fetch_add(&r->pushed_bytes, bytes);
    const void *payload = c->grad;
    void *slot = rpc_shm_link_push_slot(&r->shm[c->b->pserver], c->shard_off, c->b->length);
    c->push.shm = slot != NULL;
    pst_status st = PST_OK;
    if (r->chain) { /* the sum so far, this trainer's gradient added */
        st = chain_add(c);
        payload = c->chain_sum;
    } else if (slot) { /* the pserver reads it before it answers; the next write is the next step */
        pst_cast(slot, r->cfg.grad_dtype, c->grad, PST_F32, c->b->length);
        payload = NULL;
    } else if (c->wire_grad) { /* one cast, into the block's own buffer: nothing else reads it */
        pst_cast(c->wire_grad, r->cfg.grad_dtype, c->grad, PST_F32, c->b->length);
        payload = c->wire_grad;
    }
    const int call = st == PST_OK;
    if (call)
        st = rpc_client_call_async(r->client, c->server, RPC_METHOD_PUSH, &c->push.base,
                                   payload, slot ? 0 : bytes, push_released, push_done, c);
    if (st != PST_OK) {
        /* The release has run if the call was made; done will not: the exchange ends here
         * (in a chain, once its pull, out already, ends too). */
        exchange_error(c, st, pst_error_detail());
        window_release(c);
        if (r->chain) {
            tr_chain_fail(r->chain, (int)c->b->id, st, pst_error_detail());
            if (!call)
                exchange_step_done(c); /* push released */
        } else {
            atomic_store(&c->pending, 1);
        }
        exchange_step_done(c); /* push done */
        return;
    }
    if (sync && !r->chain)
        start_pull(c, step + 1);
}

/* One queue per set of holders (without a pipeline every device holds every block: one
 * queue), in the order of their first block; each queue's heap is its blocks' share of
 * the slots. */
static void make_queues(tr_remote *r)
{
    link_sched *ls = &r->sched;
    for (int i = 0; i < r->plan->nblocks; i++) {
        block_ctx *c = &r->blocks[i];
        int q = 0;
        while (q < ls->nqueues && ls->queues[q].holders != c->b->holders)
            q++;
        if (q == ls->nqueues)
            ls->queues[ls->nqueues++].holders = c->b->holders;
        c->queue = q;
        c->rank = ls->queues[q].nblocks++;
    }
    for (int q = 0, at = 0; q < ls->nqueues; q++) {
        ls->queues[q].heap = ls->slots + at;
        ls->queues[q].blocks = ls->order + at;
        at += ls->queues[q].nblocks;
    }
    for (int i = 0; i < r->plan->nblocks; i++)
        ls->queues[r->blocks[i].queue].blocks[r->blocks[i].rank] = i;
}

/* The queue whose head starts next: among the heads of the lowest step, the first from
 * `turn` on that the credits do not hold; -1 where none may start. */
static int next_queue(const tr_remote *r, const link_sched *ls)
{
    long step = 0;
    int any = 0;
    for (int q = 0; q < ls->nqueues; q++)
        if (ls->queues[q].n > 0 && (!any || ls->queues[q].heap[0]->step < step)) {
            step = ls->queues[q].heap[0]->step;
            any = 1;
        }
    for (int k = 0; any && k < ls->nqueues; k++) {
        const int q = (ls->turn + k) % ls->nqueues;
        const block_ctx *c = ls->queues[q].n > 0 ? ls->queues[q].heap[0] : NULL;
        if (!c || c->step != step)
            continue;
        const int held = ls->ahead > 0 && c->step == ls->step &&
                         ls->nqueued == r->plan->nblocks &&
                         c->rank >= ls->queues[q].lowest + ls->ahead;
        if (!held)
            return q;
    }
    return -1;
}

/* Starts waiting exchanges while the window has room (an exchange larger than the window
 * starts when nothing else is in flight): each queue's lowest (step, block) first, and the
 * queues (a pipeline's stages) in turn, so every stage has its pushes in flight as soon as
 * its backward has made them. */
static void link_pump(tr_remote *r)
{
    link_sched *ls = &r->sched;
    const size_t window = r->window;
    for (;;) {
        block_ctx *next = NULL;
        pthread_mutex_lock(&ls->mu);
        const int q = next_queue(r, ls);
        if (q >= 0) {
            block_ctx *c = ls->queues[q].heap[0];
            const size_t bytes = push_bytes(r, c);
            if (window == 0 || ls->inflight == 0 || ls->inflight + bytes <= window) {
                next = c;
                heap_pop(&ls->queues[q]);
                ls->inflight += bytes;
                ls->turn = (q + 1) % ls->nqueues;
            }
        }
        pthread_mutex_unlock(&ls->mu);
        if (!next)
            return;
        exchange_start(next);
    }
}

/* A chain's trainer k >= 1: of its gradient of a step and trainer k-1's sum, one is here;
 * the second queues the push (the next step's cannot come before: trainer k-1 sends the
 * next step's sum only after this step's values). */
static void chain_join(block_ctx *c)
{
    link_sched *ls = &c->r->sched;
    pthread_mutex_lock(&ls->mu);
    const int go = ++c->joined == 2;
    if (go) {
        c->joined = 0;
        heap_push(&ls->queues[c->queue], c);
    }
    pthread_mutex_unlock(&ls->mu);
    if (go)
        link_pump(c->r);
}

pst_status tr_remote_exchange(tr_remote *r, int b, long step, const float *grad, float scale,
                              void *dst, tr_exchange_fn done, void *arg)
{
    if (b < 0 || b >= r->plan->nblocks)
        return pst_error_set(PST_ERR_INTERNAL, "exchange of block %d of %d", b, r->plan->nblocks);
    block_ctx *c = &r->blocks[b];
    c->dst = dst;
    c->dst_dtype = r->cfg.precision;
    c->done = done;
    c->done_arg = arg;
    c->step = step;
    c->grad = grad;
    c->scale = scale;
    link_sched *ls = &r->sched;
    pthread_mutex_lock(&ls->mu);
    if (step != ls->step) {
        ls->step = step;
        ls->nqueued = 0;
        for (int q = 0; q < ls->nqueues; q++)
            ls->queues[q].lowest = 0;
        memset(ls->ended, 0, (size_t)r->plan->nblocks);
    }
    ls->nqueued++;
    if (!r->chain)
        heap_push(&ls->queues[c->queue], c);
    pthread_mutex_unlock(&ls->mu);
    if (!r->chain) {
        link_pump(r);
        return PST_OK;
    }
    /* A chain's trainer k >= 1 asks for the values at once: while it waits for trainer
     * k-1's sum, a failure up the chain (a pserver failing the pulls of a step that cannot
     * complete, a relay failing its parked ones) reaches it through this pull. Its push
     * waits for that sum (chain_join). */
    c->server = exchange_server(r, c);
    atomic_store(&c->pushing, CHAIN_WAITING);
    atomic_store(&c->pending, 3); /* push done, push released, pull done */
    start_pull(c, step + 1);
    chain_join(c);
    return PST_OK;
}

/* chain.h's arrived: trainer k-1's sum of block b is here. */
static void chain_arrived(void *arg, int b)
{
    chain_join(&((tr_remote *)arg)->blocks[b]);
}

/* ---- Init / start / Finish ------------------------------------------------------------ */

typedef struct init_call {
    tr_remote *r;
    int64_t version;   /* the reply's */
    int answered;      /* the Init succeeded */
    int shm;           /* the reply's: the pserver mapped this trainer's segment */
    char area_name[RPC_SHM_NAME_MAX]; /* the reply's values area ("": none) */
    uint64_t area_nonce;
    Pstrain__DType area_dtype;
    Pstrain__InitRequest req;
    Pstrain__BlockSpec *specs;
    Pstrain__BlockSpec **spec_ptrs;
    Pstrain__OptimConfig optim;
    float *initial;
    char job_id[PST_JOB_ID_MAX + 24]; /* trainer 0's: tr_job_id */
    Pstrain__SparseTableSpec sparse[64]; /* the job's sparse tables, and pointers to them */
    Pstrain__SparseTableSpec *sparse_ptrs[64];
    Pstrain__ResumeState states[64];  /* trainer 0's resume_states, and pointers to them */
    Pstrain__ResumeState *state_ptrs[64];
    tr_resume_state state;            /* the reply's (has_state) */
    int has_state;
} init_call;

static void init_released(void *arg)
{
    batch_done(((init_call *)arg)->r);
}

static void init_done(void *arg, pst_status st, const char *detail, const ProtobufCMessage *reply,
                      const rpc_payload *payload)
{
    init_call *ic = arg;
    (void)payload;
    const tr_link_settings *cfg = &ic->r->cfg;
    if (st != PST_OK)
        batch_error(ic->r, st, detail);
    else {
        ic->version = ((const Pstrain__InitReply *)reply)->version;
        const Pstrain__InitReply *ir = (const Pstrain__InitReply *)reply;
        ic->answered = 1;
        ic->shm = ir->shm;
        snprintf(ic->area_name, sizeof ic->area_name, "%s",
                 ir->shm_values_name ? ir->shm_values_name : "");
        ic->area_nonce = ir->shm_values_nonce;
        ic->area_dtype = ir->shm_values_dtype;
        if ((ic->has_state = ir->resume_state != NULL))
            ic->state = (tr_resume_state){ir->resume_state->next_step,
                                          ir->resume_state->loss_scale,
                                          ir->resume_state->good_steps,
                                          ir->resume_state->skipped};
    }
    (void)cfg;
    batch_done(ic->r);
}

static void start_pull_done(void *arg, pst_status st, const char *detail)
{
    if (st != PST_OK)
        batch_error(arg, st, detail);
    batch_done(arg);
}

static void fill_init(init_call *ic, tr_remote *r, int s, const float *params, uint64_t fp)
{
    const tr_link_settings *cfg = &r->cfg;
    size_t k = 0, total = 0;
    for (int i = 0; i < r->plan->nblocks; i++) {
        const tr_block *b = &r->plan->blocks[i];
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
    ic->req.total_params = r->plan->nparams;
    ic->req.n_blocks = k;
    ic->req.blocks = ic->spec_ptrs;
    ic->req.optim = &ic->optim;
    ic->req.fingerprint = fp;
    ic->req.precision = rpc_dtype_to_wire(cfg->precision);
    ic->req.checkpoint_every = r->base.checkpoint_every;
    for (int i = 0; i < cfg->nsparse_tables && i < 64; i++) {
        const pst_sparse_config *t = &cfg->sparse_tables[i];
        Pstrain__SparseTableSpec *w = &ic->sparse[i];
        pstrain__sparse_table_spec__init(w);
        w->name = (char *)t->name;
        w->dim = (uint32_t)t->dim;
        w->optim = (char *)pst_sparse_optim_name(t->optim);
        w->lr = t->lr;
        w->eps = t->eps;
        w->beta1 = t->beta1;
        w->beta2 = t->beta2;
        w->init_std = t->init_std;
        w->seed = t->seed;
        w->admit_count = t->admit_count;
        w->evict_after = t->evict_after;
        w->max_rows = t->max_rows;
        ic->sparse_ptrs[i] = w;
    }
    ic->req.n_sparse_tables = (size_t)(cfg->nsparse_tables < 64 ? cfg->nsparse_tables : 64);
    ic->req.sparse_tables = ic->sparse_ptrs;
    ic->req.sparse_shard = (uint32_t)s;
    ic->req.sparse_shards = (uint32_t)cfg->num_pservers;
    if (cfg->trainer_id == 0) {
        ic->req.n_resume_steps = (size_t)r->base.nresume;
        ic->req.resume_steps = (int64_t *)r->base.resume_steps;
        snprintf(ic->job_id, sizeof ic->job_id, "%s", cfg->job_id);
        ic->req.job_id = ic->job_id;
        const int n = r->base.nresume < 64 ? r->base.nresume : 64;
        for (int i = 0; r->base.resume_states && i < n; i++) {
            const tr_resume_state *rs = &r->base.resume_states[i];
            pstrain__resume_state__init(&ic->states[i]);
            ic->states[i].next_step = rs->next_step;
            ic->states[i].loss_scale = rs->loss_scale;
            ic->states[i].good_steps = rs->good_steps;
            ic->states[i].skipped = rs->skipped;
            ic->state_ptrs[i] = &ic->states[i];
        }
        if (r->base.resume_states) {
            ic->req.n_resume_states = (size_t)n;
            ic->req.resume_states = ic->state_ptrs;
        }
        ic->req.resume_newest = r->base.resume_newest != 0;
    }
}

/* The step the job starts at: every pserver's Init reply gives the version its blocks hold,
 * which is 0 for a fresh job and a checkpoint's step for a resumed one. */
static pst_status start_version(tr_remote *r, const init_call *calls)
{
    const tr_link_settings *cfg = &r->cfg;
    const int64_t v = calls[0].version;
    if (cfg->mode == PST_MODE_ASYNC) {
        /* Resumed: each pserver says this trainer's first step not applied to all its
         * blocks; the lowest of them is where it goes on (the pushes of steps a pserver has
         * applied already are duplicates there: none is applied twice). */
        int64_t next = INT64_MAX;
        for (int s = 0; s < cfg->num_pservers; s++)
            if (calls[s].has_state && calls[s].state.next_step < next)
                next = calls[s].state.next_step;
        if (next != INT64_MAX) {
            r->base.start_state = (tr_resume_state){.next_step = next};
            r->base.has_start_state = 1;
            r->base.start_version = next; /* the push steps go on from there */
            return PST_OK;
        }
        /* A fresh job is at version 0 everywhere, which only trainer 0 can tell, as a later
         * trainer may join after it has pushed. */
        for (int s = 0; s < cfg->num_pservers && cfg->trainer_id == 0; s++)
            if (calls[s].version != 0)
                return pst_error_set(PST_ERR_STATE, "pserver %s already holds version %lld of "
                                     "its blocks: a finished or running job's pservers; "
                                     "restart them", rpc_client_server(r->client, s),
                                     (long long)calls[s].version);
        return PST_OK;
    }
    for (int s = 1; s < cfg->num_pservers; s++)
        if (calls[s].version != v) {
            /* The older of the two is what they can all go back to (--on-failure wait
             * does: tr_link.versions_differ). */
            int64_t lo = v;
            for (int k = 1; k < cfg->num_pservers; k++)
                lo = calls[k].version < lo ? calls[k].version : lo;
            r->base.versions_differ = 1;
            r->base.start_version = lo;
            return pst_error_set(PST_ERR_STATE, "the pservers hold different steps: %s at "
                                 "%lld, %s at %lld (a pserver lacks the newer checkpoint's "
                                 "shard or could not read it, see its log); with --on-failure "
                                 "wait the job falls back to step %lld or older; else restart "
                                 "it with --resume never, or remove the newer checkpoint",
                                 rpc_client_server(r->client, 0), (long long)v,
                                 rpc_client_server(r->client, s), (long long)calls[s].version,
                                 (long long)lo);
        }
    int known = v == 0; /* a fresh job, or a checkpoint trainer 0 offered */
    for (int i = 0; i < r->base.nresume && !known; i++)
        known = r->base.resume_steps[i] == v;
    if (!known && cfg->trainer_id == 0)
        return pst_error_set(PST_ERR_STATE, "pserver %s already holds version %lld of its "
                             "blocks: a finished or running job's pservers; restart them",
                             rpc_client_server(r->client, 0), (long long)v);
    r->base.start_version = v;
    /* every pserver resumed from v: each says where the trainers stood then */
    for (int s = 0; s < cfg->num_pservers && !r->base.has_start_state; s++)
        if (calls[s].has_state) {
            r->base.start_state = calls[s].state;
            r->base.has_start_state = 1;
        }
    return PST_OK;
}

/* A Watch lasts the whole job: its deadline is a day, and it is opened again when that
 * passes. */
#define WATCH_DEADLINE_MS (24 * 3600 * 1000)

static void watch_start(tr_remote *r, int s);

static void watch_done(void *arg, pst_status st, const char *detail, const ProtobufCMessage *reply,
                       const rpc_payload *payload)
{
    (void)payload;
    watch_arg *w = arg;
    if (st == PST_OK && reply && ((const Pstrain__WatchReply *)reply)->stop &&
        !atomic_load(&w->r->finishing)) {
        /* trainer 0: a process of the job was asked to stop; stop at the next step
         * boundary with a checkpoint, and watch on */
        PST_INFO("pserver %s asks to stop the job at the next step (a process of the job got "
                 "SIGTERM)", rpc_client_server(w->r->client, w->server));
        __atomic_store_n(&w->r->base.stop_asked, 1, __ATOMIC_RELEASE);
        watch_start(w->r, w->server);
        return;
    }
    if (st == PST_ERR_TIMEOUT && !atomic_load(&w->r->finishing)) {
        watch_start(w->r, w->server); /* a day has passed */
        return;
    }
    if (st != PST_OK && !atomic_load(&w->r->finishing)) {
        /* Its connection closed (the process died) or it answers no more: what waits for
         * it fails now, with this, instead of retrying for --connect-timeout-ms. */
        char why[600];
        snprintf(why, sizeof why, "pserver %s stopped answering (its watch of this trainer "
                 "ended: %s)", rpc_client_server(w->r->client, w->server), detail);
        PST_WARN("%s", why);
        /* Sync: no step completes without every pserver, so the calls to the others (a
         * pull waiting for a step) fail now too. */
        const int all = w->r->cfg.mode == PST_MODE_SYNC;
        for (int s = 0; st == PST_ERR_UNAVAILABLE && s < w->r->cfg.num_pservers; s++)
            if (all || s == w->server)
                rpc_client_give_up(w->r->client, s, why);
    }
}

static void watch_start(tr_remote *r, int s)
{
    r->wargs[s] = (watch_arg){r, s};
    if (rpc_client_call_async(r->watcher, s, RPC_METHOD_WATCH, &r->watch.base, NULL, 0, NULL,
                              watch_done, &r->wargs[s]) != PST_OK)
        PST_WARN("pserver %s: cannot open its Watch: %s", rpc_client_server(r->client, s),
                 pst_error_detail());
}

/* Maps pserver s's values area read-only (rpc/shm.h) and places the blocks in it; a pull
 * in its dtype then copies straight from there. None when it cannot (pulls use the slots). */
static void attach_area(tr_remote *r, int s, const init_call *ic)
{
    pst_dtype dt;
    if (rpc_dtype_from_wire(ic->area_dtype, &dt) != PST_OK)
        return;
    const size_t esize = pst_dtype_size(dt);
    size_t bytes = 0;
    for (int i = 0; i < r->plan->nblocks; i++) {
        block_ctx *c = &r->blocks[i];
        if (c->b->pserver != s)
            continue;
        c->area_off = bytes; /* the Init's order, as the pserver lays them out */
        bytes += rpc_shm_area_span(c->b->length, esize);
    }
    if (rpc_shm_link_attach_area(&r->shm[s], ic->area_name, ic->area_nonce, dt, bytes) !=
        PST_OK) {
        PST_INFO("pserver %s: pulls through the slots: %s", rpc_client_server(r->client, s),
                 pst_error_detail());
        return;
    }
    PST_INFO("pserver %s: pulls in %s read its values area directly",
             rpc_client_server(r->client, s), pst_dtype_name(dt));
}

pst_status tr_remote_start(tr_remote *r, float *params)
{
    const tr_link_settings *cfg = &r->cfg;
    const int S = cfg->num_pservers;
    pst_status st = PST_OK;
    init_call *calls = calloc((size_t)S, sizeof *calls);
    if (!calls)
        return pst_error_set(PST_ERR_NOMEM, "trainer: out of memory for Init");
    uint64_t fp = r->cfg.settings_fingerprint;
    /* Sync: a segment per pserver, offered in the Init; a pserver on this host maps it. */
    for (int s = 0; s < S && cfg->shm && cfg->mode == PST_MODE_SYNC; s++) {
        if (rpc_shm_link_offer(&r->shm[s], r->plan->pserver_elems[s]) != PST_OK)
            PST_DEBUG("pserver %s: payloads in the calls: %s", rpc_client_server(r->client, s),
                      pst_error_detail());
    }
    for (int s = 0; s < S; s++) {
        init_call *ic = &calls[s];
        size_t nb = 0;
        for (int i = 0; i < r->plan->nblocks; i++)
            nb += r->plan->blocks[i].pserver == s;
        ic->r = r;
        ic->specs = calloc(nb ? nb : 1, sizeof *ic->specs);
        ic->spec_ptrs = calloc(nb ? nb : 1, sizeof *ic->spec_ptrs);
        if (cfg->trainer_id == 0)
            ic->initial = malloc(sizeof(float) * (r->plan->pserver_elems[s] + 1));
        if (!ic->specs || !ic->spec_ptrs || (cfg->trainer_id == 0 && !ic->initial)) {
            st = pst_error_set(PST_ERR_NOMEM, "trainer: out of memory for Init");
            goto out;
        }
        fill_init(ic, r, s, params, fp);
        if (r->shm[s].seg.base) {
            ic->req.shm_name = r->shm[s].seg.name;
            ic->req.shm_nonce = r->shm[s].seg.nonce;
        }
        size_t bytes = ic->initial ? r->plan->pserver_elems[s] * sizeof(float) : 0;
        batch_add(r, bytes ? 2 : 1);
        st = rpc_client_call_async(r->client, s, RPC_METHOD_INIT, &ic->req.base, ic->initial,
                                   bytes, bytes ? init_released : NULL, init_done, ic);
        if (st != PST_OK) {
            batch_error(r, st, pst_error_detail());
            batch_done(r);
            st = PST_OK;
        }
    }
    st = batch_wait(r);
    for (int s = 0; s < S; s++) {
        r->joined[s] = calls[s].answered;
        if (rpc_shm_link_answer(&r->shm[s], st == PST_OK && calls[s].shm))
            PST_INFO("pserver %s is on this host: payloads through shared memory",
                     rpc_client_server(r->client, s));
        if (r->shm[s].on && calls[s].area_name[0])
            attach_area(r, s, &calls[s]);
    }
    if (st != PST_OK || (st = start_version(r, calls)) != PST_OK)
        goto out;
    int all_here = 1;
    for (int s = 0; s < S; s++)
        all_here = all_here && r->shm[s].on;
    r->window = tr_remote_window(cfg->send_window, r->plan, pst_dtype_size(cfg->grad_dtype),
                                 all_here);
    r->sched.step = -1; /* a step after a rollback starts its credits afresh */
    /* Credits share a pserver's link among the trainers; a chain's every link is one
     * trainer's (or its last's), so there, as on one host, there is none to share. */
    r->sched.ahead = cfg->mode == PST_MODE_SYNC
                         ? tr_remote_ahead(cfg->send_ahead, r->plan,
                                           all_here || cfg->chain_len > 0)
                         : 0;
    /* A push in the call casts into a buffer of its block's; one through shared memory
     * casts into its slot. */
    for (int i = 0; i < r->plan->nblocks && cfg->grad_dtype != PST_F32; i++) {
        block_ctx *c = &r->blocks[i];
        if (!r->shm[c->b->pserver].on && !c->wire_grad && !c->chain_sum &&
            !(c->wire_grad = malloc(c->b->length * pst_dtype_size(cfg->grad_dtype)))) {
            st = pst_error_set(PST_ERR_NOMEM, "trainer: out of memory for the push buffers");
            goto out;
        }
    }
    /* Everyone starts from the pservers' values (trainer 0's, or a checkpoint's). */
    for (int i = 0; i < r->plan->nblocks; i++) {
        block_ctx *c = &r->blocks[i];
        c->dst = params + c->b->offset;
        c->dst_dtype = PST_F32; /* the start's values are the master's, in f32 */
        c->server = c->b->pserver;
        c->done = start_pull_done;
        c->done_arg = r;
        atomic_store(&c->pending, 1);
        batch_add(r, 1);
        start_pull(c, 0);
    }
    st = batch_wait(r);
    if (st == PST_OK) { /* the pservers now know when this trainer goes away */
        pstrain__watch_request__init(&r->watch);
        r->watch.trainer_id = (uint32_t)cfg->trainer_id;
        for (int s = 0; s < S; s++)
            watch_start(r, s);
    }
    if (st == PST_OK)
        PST_INFO("joined %d pserver(s): %d blocks of up to %zu bytes, %s mode, %d trainers", S,
                 r->plan->nblocks, r->plan->block_bytes, pst_mode_name(cfg->mode), cfg->trainers);
out:
    for (int s = 0; s < S; s++) {
        PST_FREE_ALL(calls[s].specs, calls[s].spec_ptrs, calls[s].initial);
    }
    free(calls);
    return st;
}

static void finish_done(void *arg, pst_status st, const char *detail, const ProtobufCMessage *reply,
                        const rpc_payload *payload)
{
    tr_remote *r = arg;
    (void)payload;
    if (st != PST_OK) {
        batch_error(r, st, detail);
    } else { /* the pservers' sparse tables, summed */
        const Pstrain__FinishReply *fr = (const Pstrain__FinishReply *)reply;
        pthread_mutex_lock(&r->mu);
        r->tables.rows += fr->sparse_rows;
        r->tables.bytes += fr->sparse_bytes;
        r->tables.created += fr->rows_created;
        r->tables.evicted += fr->rows_evicted;
        r->tables.refused += fr->pushes_refused;
        r->tables.hash += fr->sparse_hash;
        pthread_mutex_unlock(&r->mu);
    }
    batch_done(r);
}


pst_status tr_remote_finish(tr_remote *r, int early, long step, const char *reason)
{
    if (!early) /* trainer k-1 pulls the last values from here */
        tr_chain_drain(r->chain);
    atomic_store(&r->finishing, 1); /* the pservers answer the watches now */
    Pstrain__FinishRequest req = PSTRAIN__FINISH_REQUEST__INIT;
    req.trainer_id = (uint32_t)r->cfg.trainer_id;
    req.early = early != 0;
    req.step = step;
    req.reason = (char *)(reason ? reason : "");
    req.checkpoint_step = r->base.checkpoint_step;
    req.rejoins = early && step < 0 && r->base.rejoins;
    for (int s = 0; s < r->cfg.num_pservers; s++) {
        /* A trainer that starts again at once tells only the pservers it joined: one it
         * could not reach would hold it for the whole connect timeout. */
        if (req.rejoins && !r->joined[s])
            continue;
        batch_add(r, 1);
        pst_status st = rpc_client_call_async(r->client, s, RPC_METHOD_FINISH, &req.base, NULL, 0,
                                              NULL, finish_done, r);
        if (st != PST_OK) {
            batch_error(r, st, pst_error_detail());
            batch_done(r);
        }
    }
    /* Training is complete and its result stands; a pserver that is already gone (its
     * other trainers finished first) is worth a warning, not a failure. A checkpoint asked
     * for that a pserver could not write is a failure. */
    pst_status st = batch_wait(r);
    if (st != PST_OK && r->base.checkpoint_step > 0)
        return st;
    if (st != PST_OK)
        PST_WARN("Finish: %s", pst_error_detail());
    return PST_OK;
}

/* ---- the link interface (link.h) ------------------------------------------------------ */

static pst_status link_start(tr_link *l, float *params, float *const *homes,
                             struct pst_pool *pool)
{
    (void)homes; /* the values live on the pservers */
    (void)pool;
    return tr_remote_start((tr_remote *)l, params);
}

static pst_status link_exchange(tr_link *l, int b, long step, const float *grad, float scale,
                                void *dst, tr_exchange_fn done, void *arg)
{
    return tr_remote_exchange((tr_remote *)l, b, step, grad, scale, dst, done, arg);
}

static void link_traffic(tr_link *l, uint64_t *pushed, uint64_t *pulled)
{
    *pushed = atomic_load(&((tr_remote *)l)->pushed_bytes);
    *pulled = atomic_load(&((tr_remote *)l)->pulled_bytes);
}

static double link_take_held(tr_link *l)
{
    return (double)atomic_exchange(&((tr_remote *)l)->held_max_us, 0) * 1e-6;
}

/* fp16: the step's vote on pserver 0, which answers once every trainer has voted. */
static pst_status link_vote(tr_link *l, long step, int overflow, int *skip)
{
    tr_remote *r = (tr_remote *)l;
    Pstrain__VoteRequest req = PSTRAIN__VOTE_REQUEST__INIT;
    req.trainer_id = (uint32_t)r->cfg.trainer_id;
    req.step = step;
    req.overflow = overflow != 0;
    rpc_message *rep = NULL;
    PST_TRY(rpc_client_call(r->client, 0, RPC_METHOD_VOTE, &req.base, NULL, 0, &rep));
    const Pstrain__VoteReply *vr = (const Pstrain__VoteReply *)rpc_message_header(rep);
    pst_status st = PST_OK;
    if (vr->step != step)
        st = pst_error_set(PST_ERR_FORMAT, "Vote of step %ld: %s answered for step %lld", step,
                           rpc_client_server(r->client, 0), (long long)vr->step);
    else
        *skip = vr->skip;
    rpc_message_free(rep);
    return st;
}

static void link_times(const tr_link *l, int b, tr_exchange_times *out)
{
    tr_remote_times((const tr_remote *)l, b, out);
}

static pst_status link_finish(tr_link *l, int early, long step, const char *reason)
{
    return tr_remote_finish((tr_remote *)l, early, step, reason);
}

static void link_free(tr_link *l)
{
    tr_remote_free((tr_remote *)l);
}

/* Trainer k > 0 got SIGTERM: its Watch on pserver 0 is replaced by one that asks the job to
 * stop (WatchRequest.stop); pserver 0 tells trainer 0. */
static pst_status link_ask_stop(tr_link *l)
{
    tr_remote *r = (tr_remote *)l;
    pstrain__watch_request__init(&r->stop_watch);
    r->stop_watch.trainer_id = (uint32_t)r->cfg.trainer_id;
    r->stop_watch.stop = 1; /* wargs[0] is {r, 0} since the start's watch_start */
    return rpc_client_call_async(r->watcher, 0, RPC_METHOD_WATCH, &r->stop_watch.base, NULL, 0,
                                 NULL, watch_done, &r->wargs[0]);
}

static pst_status link_sparse_pull(tr_link *l, int table, long step, const uint64_t *keys,
                                   const size_t *seg, float *rows);
static pst_status link_sparse_push(tr_link *l, int table, long step, const uint64_t *keys,
                                   const size_t *seg, const float *rows);
static void link_sparse_totals(tr_link *l, tr_sparse_totals *out);

static const tr_link_ops remote_ops = {
    .start = link_start,
    .ask_stop = link_ask_stop,
    .exchange = link_exchange,
    .vote = link_vote,
    .times = link_times,
    .finish = link_finish,
    .free = link_free,
    .take_held = link_take_held,
    .traffic = link_traffic,
    .sparse_pull = link_sparse_pull,
    .sparse_push = link_sparse_push,
    .sparse_totals = link_sparse_totals,
};

size_t tr_remote_window(size_t send_window, const tr_plan *plan, size_t wire_size,
                        int same_host)
{
    if (send_window != PST_SEND_WINDOW_AUTO)
        return send_window;
    /* a round of the longest block (a pipeline's segments make shorter ones too) */
    size_t longest = 0;
    for (int b = 0; b < plan->nblocks; b++)
        longest = plan->blocks[b].length > longest ? plan->blocks[b].length : longest;
    const int blocks = plan->npservers > 2 ? plan->npservers : 2;
    const size_t round = (size_t)blocks * longest * wire_size;
    return same_host && round < TR_REMOTE_SAME_HOST_WINDOW ? TR_REMOTE_SAME_HOST_WINDOW : round;
}

int tr_remote_ahead(int send_ahead, const tr_plan *plan, int unshared)
{
    if (send_ahead != PST_SEND_AHEAD_AUTO)
        return send_ahead;
    if (unshared)
        return 0;
    return 4 * plan->npservers;
}

tr_link *tr_remote_link(tr_remote *r)
{
    return &r->base;
}

pst_status tr_remote_init(tr_remote **out, const tr_link_settings *cfg,
                          const tr_plan *plan)
{
    *out = NULL;
    tr_remote *r = calloc(1, sizeof *r);
    if (!r)
        return pst_error_set(PST_ERR_NOMEM, "trainer: out of memory");
    r->base = (tr_link){.ops = &remote_ops, .plan = plan};
    r->cfg = *cfg;
    r->plan = plan;
    r->chain_next = -1;
    if (cfg->chain_len > 0) /* its links are between hosts: the payloads go in the calls */
        r->cfg.shm = 0;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    pthread_mutex_init(&r->sched.mu, NULL);
    pst_status st = PST_OK;
    if (plan->npservers != cfg->num_pservers) {
        st = pst_error_set(PST_ERR_INTERNAL, "trainer: a plan for %d pservers, %d configured",
                           plan->npservers, cfg->num_pservers);
        goto error;
    }
    r->blocks = calloc((size_t)r->plan->nblocks, sizeof *r->blocks);
    /* at most one exchange per block at a time; the window is set by start, once it
     * knows where the pservers are (no exchange comes before) */
    r->sched.slots = calloc((size_t)r->plan->nblocks, sizeof(block_ctx *));
    r->sched.queues = calloc((size_t)r->plan->nblocks, sizeof(link_queue));
    r->sched.order = calloc((size_t)r->plan->nblocks, sizeof(int));
    r->sched.ended = calloc((size_t)r->plan->nblocks, 1);
    r->sched.step = -1;
    if (!r->blocks || !r->sched.slots || !r->sched.queues || !r->sched.order ||
        !r->sched.ended) {
        st = pst_error_set(PST_ERR_NOMEM, "trainer: out of memory for the block plan");
        goto error;
    }
    uint64_t shard_len[PST_MAX_PSERVERS] = {0};
    for (int i = 0; i < r->plan->nblocks; i++) {
        block_ctx *c = &r->blocks[i];
        c->r = r;
        c->b = &r->plan->blocks[i];
        c->shard_off = shard_len[c->b->pserver]; /* fill_init lists them in this order */
        shard_len[c->b->pserver] += c->b->length;
        pthread_mutex_init(&c->mu, NULL);
        c->server = c->b->pserver;
        pstrain__push_request__init(&c->push);
        c->push.trainer_id = (uint32_t)cfg->trainer_id;
        c->push.block = c->b->id;
        c->push.dtype = rpc_dtype_to_wire(cfg->grad_dtype);
        c->push.length = c->b->length;
        if (cfg->chain_len > 0) { /* trainers 0..k's sum; after trainer 0, in f32 */
            c->push.trainers = (uint32_t)cfg->trainer_id + 1;
            if (cfg->trainer_id > 0) {
                c->push.dtype = PSTRAIN__DTYPE__F32;
                if (!(c->chain_sum = malloc(c->b->length * sizeof(float)))) {
                    st = pst_error_set(PST_ERR_NOMEM, "trainer: out of memory for the "
                                       "chain's sums");
                    goto error;
                }
            }
        }
        pstrain__pull_request__init(&c->pull);
        c->pull.trainer_id = (uint32_t)cfg->trainer_id;
        c->pull.block = c->b->id;
        c->pull.dtype = PSTRAIN__DTYPE__F32;
    }
    make_queues(r);
    rpc_global_init();
    r->rpc_inited = 1;
    const rpc_tls_files tls = {.ca = cfg->tls_ca, .client_cert = cfg->tls_client_cert,
                               .client_key = cfg->tls_client_key};
    if ((st = rpc_transport_load(&r->transport, &tls, 0)) != PST_OK)
        goto error;
    const char *addrs[PST_MAX_PSERVERS + 1];
    for (int s = 0; s < cfg->num_pservers; s++)
        addrs[s] = cfg->pservers[s];
    /* a chain's trainer k < T-1 pushes and pulls through trainer k+1's relay */
    int nservers = cfg->num_pservers;
    const char *names[PST_MAX_PSERVERS + 1] = {0}; /* NULL: "pserver" */
    char next_name[48];
    if (cfg->chain_len > 0 && cfg->trainer_id + 1 < cfg->trainers) {
        snprintf(next_name, sizeof next_name, "trainer %d's relay", cfg->trainer_id + 1);
        names[nservers] = next_name;
        r->chain_next = nservers;
        addrs[nservers++] = cfg->chain[cfg->trainer_id + 1];
    }
    if (cfg->chain_len > 0 && cfg->trainer_id > 0) {
        const tr_chain_config chc = {
            .trainer_id = cfg->trainer_id, .listen = cfg->chain[cfg->trainer_id], .plan = plan,
            .values_dtype = cfg->precision, .token = cfg->token, .wait_ms = cfg->rpc_timeout_ms,
            .peer_timeout_ms = cfg->peer_timeout_ms, .arrived = chain_arrived, .arg = r};
        if ((st = tr_chain_init(&r->chain, &chc)) != PST_OK)
            goto error;
    }
    rpc_client_config cc = {.servers = addrs, .num_servers = nservers,
                            .call_timeout_ms = (int)cfg->rpc_timeout_ms,
                            .connect_timeout_ms = cfg->connect_timeout_ms > 0
                                                      ? (int)cfg->connect_timeout_ms : -1,
                            .token = cfg->token, .transport = r->transport,
                            .names = names};
    if ((st = rpc_client_init(&r->client, &cc)) != PST_OK)
        goto error;
    rpc_client_config wc = {.servers = addrs, .num_servers = cfg->num_pservers,
                            .call_timeout_ms = WATCH_DEADLINE_MS, .connect_timeout_ms = -1,
                            .threads = 1, .keepalive_ms = (int)cfg->peer_timeout_ms,
                            .token = cfg->token, .transport = r->transport};
    if ((st = rpc_client_init(&r->watcher, &wc)) != PST_OK)
        goto error;
    *out = r;
    return PST_OK;
error:
    tr_remote_free(r);
    return st;
}

void tr_remote_free(tr_remote *r)
{
    if (!r)
        return;
    atomic_store(&r->finishing, 1);
    tr_chain_free(r->chain); /* before the client: its sums start pushes */
    rpc_client_free(r->watcher); /* fails the open watches: their callbacks see finishing */
    rpc_client_free(r->client);
    rpc_transport_free(r->transport);
    if (r->rpc_inited)
        rpc_global_shutdown();
    for (int s = 0; s < PST_MAX_PSERVERS; s++) { /* no call is left to use them */
        rpc_shm_link_free(&r->shm[s]);
    }
    for (int s = 0; s < PST_MAX_PSERVERS; s++)
        free(r->sparse[s].buf);
    for (int i = 0; r->blocks && i < r->plan->nblocks; i++) {
        pthread_mutex_destroy(&r->blocks[i].mu);
        free(r->blocks[i].wire_grad);
        free(r->blocks[i].chain_sum);
    }
    pthread_mutex_destroy(&r->sched.mu);
    PST_FREE_ALL(r->sched.slots, r->sched.queues, r->sched.order, r->sched.ended, r->blocks);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* ---- sparse tables ---------------------------------------------------------------------- */

static void sparse_pulled(void *arg, pst_status st, const char *detail,
                          const ProtobufCMessage *reply, const rpc_payload *payload)
{
    sparse_call *c = arg;
    const Pstrain__PullSparseReply *rep = (const Pstrain__PullSparseReply *)reply;
    const int answered = st == PST_OK; /* else detail says why; below, the checks' detail */
    pst_dtype dt = PST_F32;
    if (st == PST_OK && (rep->count != c->n || rep->dim != c->dim ||
                         rpc_dtype_from_wire(rep->dtype, &dt) != PST_OK || dt != c->dtype))
        st = pst_error_set(PST_ERR_FORMAT, "PullSparse: %s answered %llu rows of %u in dtype "
                           "%d for %zu keys of rows of %zu in %s",
                           rpc_client_server(c->r->client, c->s),
                           (unsigned long long)rep->count, rep->dim, (int)rep->dtype, c->n,
                           c->dim, pst_dtype_name(c->dtype));
    if (st == PST_OK && (st = rpc_payload_check(payload, dt, c->n * c->dim)) == PST_OK && c->n)
        st = rpc_payload_read_f32(payload, dt, 0, c->rows, c->n * c->dim);
    if (st != PST_OK)
        batch_error(c->r, st, answered ? pst_error_detail() : detail);
    else
        atomic_fetch_add(&c->r->pulled_bytes, (uint64_t)payload->bytes);
    batch_done(c->r);
}

static void sparse_pushed(void *arg, pst_status st, const char *detail,
                          const ProtobufCMessage *reply, const rpc_payload *payload)
{
    sparse_call *c = arg;
    (void)reply;
    (void)payload;
    if (st != PST_OK)
        batch_error(c->r, st, detail);
    batch_done(c->r);
}

static void sparse_released(void *arg)
{
    batch_done(((sparse_call *)arg)->r);
}

/* Starts pserver s's call of a blocking sparse batch (batch_wait ends it): its reply and
 * its payload's release each count once. */
static void sparse_start(tr_remote *r, int s, rpc_method m, const ProtobufCMessage *req,
                         const void *payload, size_t bytes, rpc_done_fn done)
{
    batch_add(r, 2);
    const pst_status st = rpc_client_call_async(r->client, s, m, req, payload, bytes,
                                                sparse_released, done, &r->sparse[s]);
    if (st != PST_OK) { /* the release ran, no reply comes */
        batch_error(r, st, pst_error_detail());
        batch_done(r);
    }
}

/* The rows' dtype on the wire: bf16 with --precision bf16, else f32. */
static pst_dtype sparse_wire(const tr_remote *r)
{
    return r->cfg.precision == PST_BF16 ? PST_BF16 : PST_F32;
}

static pst_status link_sparse_pull(tr_link *l, int table, long step, const uint64_t *keys,
                                   const size_t *seg, float *rows)
{
    tr_remote *r = (tr_remote *)l;
    const size_t dim = (size_t)r->cfg.sparse_tables[table].dim;
    for (int s = 0; s < r->cfg.num_pservers; s++) {
        sparse_call *c = &r->sparse[s];
        const size_t n = seg[s + 1] - seg[s];
        *c = (sparse_call){.r = r, .s = s, .rows = rows + seg[s] * dim, .n = n, .dim = dim,
                           .dtype = sparse_wire(r), .buf = c->buf, .cap = c->cap};
        pstrain__pull_sparse_request__init(&c->pull);
        c->pull.trainer_id = (uint32_t)r->cfg.trainer_id;
        c->pull.table = (uint32_t)table;
        c->pull.step = step;
        c->pull.dtype = rpc_dtype_to_wire(c->dtype);
        c->pull.count = n;
        sparse_start(r, s, RPC_METHOD_PULL_SPARSE, &c->pull.base, keys + seg[s],
                     n * sizeof(uint64_t), sparse_pulled);
    }
    return batch_wait(r);
}

static pst_status link_sparse_push(tr_link *l, int table, long step, const uint64_t *keys,
                                   const size_t *seg, const float *rows)
{
    tr_remote *r = (tr_remote *)l;
    const pst_dtype dt = sparse_wire(r);
    const size_t dim = (size_t)r->cfg.sparse_tables[table].dim, es = pst_dtype_size(dt);
    for (int s = 0; s < r->cfg.num_pservers; s++) {
        sparse_call *c = &r->sparse[s];
        const size_t n = seg[s + 1] - seg[s], bytes = n * (sizeof(uint64_t) + dim * es);
        if (bytes > c->cap) { /* the payload buffer grows to the largest push, once */
            void *buf = realloc(c->buf, bytes);
            if (!buf) {
                batch_error(r, PST_ERR_NOMEM, "PushSparse: out of memory");
                continue;
            }
            c->buf = buf;
            c->cap = bytes;
        }
        if (n) {
            memcpy(c->buf, keys + seg[s], n * sizeof(uint64_t));
            pst_cast((char *)c->buf + n * sizeof(uint64_t), dt, rows + seg[s] * dim, PST_F32,
                     n * dim);
        }
        pstrain__push_sparse_request__init(&c->push);
        c->push.trainer_id = (uint32_t)r->cfg.trainer_id;
        c->push.table = (uint32_t)table;
        c->push.step = step;
        c->push.dtype = rpc_dtype_to_wire(dt);
        c->push.count = n;
        sparse_start(r, s, RPC_METHOD_PUSH_SPARSE, &c->push.base, c->buf, bytes,
                     sparse_pushed);
        atomic_fetch_add(&r->pushed_bytes, (uint64_t)bytes);
    }
    return batch_wait(r);
}

static void link_sparse_totals(tr_link *l, tr_sparse_totals *out)
{
    tr_remote *r = (tr_remote *)l;
    pthread_mutex_lock(&r->mu);
    *out = r->tables;
    pthread_mutex_unlock(&r->mu);
}

void tr_remote_times(const tr_remote *r, int b, tr_exchange_times *out)
{
    *out = r->blocks[b].times;
}
