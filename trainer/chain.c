/* chain.c — a trainer's relay in a chain of trainers (see chain.h).
 *
 * DESIGN: one lock for the relay; per block the sum so far that arrived and is not taken
 * yet (kept in its received slices), two copies of the values (by version parity) and the
 * one pull of trainer k-1 that may wait for them. Two copies, because trainer k's pull of
 * version v+1 can land while the reply of version v to trainer k-1 is still being sent;
 * version v+2 cannot (it needs trainer k-1's sum of step v+1, which it makes only after it
 * received version v), and tr_chain_values checks that rather than trust it. Replies are
 * made outside the lock: a payload's release may run inside rpc_call_reply. */
#include "trainer/chain.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "rpc/server.h"
#include "rpc/wire.h"

typedef struct relay_block relay_block;

typedef struct lend {
    tr_chain *ch;
    relay_block *rb;
    int slot;
} lend;

struct relay_block {
    int index;
    uint64_t length;
    rpc_kept_payload *sum; /* the sum so far that arrived, not taken yet (NULL: none) */
    pst_dtype sum_dtype;
    long sum_step;
    long taken;            /* the last step taken; -1: none */
    void *values[2];       /* copies of the values, by version parity */
    int64_t version[2];    /* the version each holds; -1: none */
    int lent[2];           /* replies from each not released yet */
    lend lends[2];
    rpc_call *parked;      /* trainer k-1's pull waiting for its version */
    int64_t parked_version;
    int64_t served;        /* the newest version answered; -1: none */
};

struct tr_chain {
    tr_chain_config cfg;
    rpc_server *server;
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* a reply released (drain) */
    relay_block *blocks;
    int nblocks;
    pst_sticky err;        /* trainer k's own pull failed: every pull gets it */
};

static relay_block *block_of(tr_chain *ch, uint32_t id)
{
    if (id >= (uint32_t)ch->nblocks || ch->cfg.plan->blocks[id].id != id)
        return NULL;
    return &ch->blocks[id];
}

/* The newest version of the values the relay holds (-1: none). */
static int64_t newest(const relay_block *rb)
{
    return rb->version[0] > rb->version[1] ? rb->version[0] : rb->version[1];
}

static void lend_released(void *arg)
{
    lend *l = arg;
    pthread_mutex_lock(&l->ch->mu);
    l->rb->lent[l->slot]--;
    pthread_cond_broadcast(&l->ch->cv);
    pthread_mutex_unlock(&l->ch->mu);
}

/* Answers trainer k-1's pull of rb with the copy in `slot` (counted in lent already). */
static void answer(tr_chain *ch, relay_block *rb, rpc_call *call, int slot)
{
    Pstrain__PullReply rep = PSTRAIN__PULL_REPLY__INIT;
    rep.block = (uint32_t)rb->index;
    rep.version = rb->version[slot];
    rep.dtype = rpc_dtype_to_wire(ch->cfg.values_dtype);
    rep.length = rb->length;
    rpc_call_reply(call, &rep.base, rb->values[slot],
                   rb->length * pst_dtype_size(ch->cfg.values_dtype), lend_released,
                   &rb->lends[slot]);
}

static void handle_push(tr_chain *ch, rpc_call *call)
{
    const Pstrain__PushRequest *req = (const Pstrain__PushRequest *)rpc_call_request(call);
    const int k = ch->cfg.trainer_id;
    const uint32_t covers = req->trainers ? req->trainers : 1;
    relay_block *rb = block_of(ch, req->block);
    pst_dtype dt = PST_F32;
    if (req->trainer_id + 1 != (uint32_t)k || covers != (uint32_t)k) {
        rpc_call_fail(call, PST_ERR_INVALID, "Push of block %u to trainer %d's relay from "
                      "trainer %u with the sum of %u trainers: it takes trainer %d's sum of "
                      "trainers 0..%d (PSTRAIN_CHAIN lists the trainers in id order)",
                      req->block, k, req->trainer_id, covers, k - 1, k - 1);
        return;
    }
    if (!rb) {
        rpc_call_fail(call, PST_ERR_NOT_FOUND, "Push of block %u to trainer %d's relay: the "
                      "plan has %d blocks", req->block, k, ch->nblocks);
        return;
    }
    pst_status st = rpc_dtype_from_wire(req->dtype, &dt);
    if (st == PST_OK && req->length != rb->length)
        st = pst_error_set(PST_ERR_FORMAT, "Push of block %u to trainer %d's relay: %llu "
                           "elements, the block has %llu", req->block, k,
                           (unsigned long long)req->length, (unsigned long long)rb->length);
    if (st == PST_OK && (req->shm || (req->scale != 0.0f && req->scale != 1.0f)))
        st = pst_error_set(PST_ERR_INVALID, "Push of block %u to trainer %d's relay: a relay "
                           "takes payloads in the call, without a loss scale", req->block, k);
    if (st == PST_OK)
        st = rpc_payload_check(rpc_call_payload(call), dt, req->length);
    if (st != PST_OK) {
        rpc_call_fail(call, st, "%s", pst_error_detail());
        return;
    }
    int dup = 0, arrived = 0;
    pthread_mutex_lock(&ch->mu);
    if (req->step <= rb->taken || (rb->sum && rb->sum_step == req->step)) {
        dup = 1; /* a retry of one that arrived */
    } else if (rb->sum) {
        st = pst_error_set(PST_ERR_STATE, "Push of block %u, step %lld to trainer %d's relay: "
                           "it still holds step %ld's", req->block, (long long)req->step, k,
                           rb->sum_step);
    } else if (!(rb->sum = rpc_call_keep_payload(call))) {
        st = pst_error_set(PST_ERR_NOMEM, "trainer %d's relay: out of memory", k);
    } else {
        rb->sum_dtype = dt;
        rb->sum_step = (long)req->step;
        arrived = 1;
    }
    pthread_mutex_unlock(&ch->mu);
    if (st != PST_OK) {
        rpc_call_fail(call, st, "%s", pst_error_detail());
        return;
    }
    Pstrain__PushReply rep = PSTRAIN__PUSH_REPLY__INIT;
    rep.duplicate = dup;
    rpc_call_reply(call, &rep.base, NULL, 0, NULL, NULL);
    if (arrived)
        ch->cfg.arrived(ch->cfg.arg, rb->index);
}

static void handle_pull(tr_chain *ch, rpc_call *call)
{
    const Pstrain__PullRequest *req = (const Pstrain__PullRequest *)rpc_call_request(call);
    const int k = ch->cfg.trainer_id;
    relay_block *rb = block_of(ch, req->block);
    pst_dtype dt = PST_F32;
    pst_status st = rb ? rpc_dtype_from_wire(req->dtype, &dt)
                       : pst_error_set(PST_ERR_NOT_FOUND, "Pull of block %u from trainer %d's "
                                       "relay: the plan has %d blocks", req->block, k,
                                       ch->nblocks);
    if (st == PST_OK && (dt != ch->cfg.values_dtype || req->shm || req->shm_values))
        st = pst_error_set(PST_ERR_INVALID, "Pull of block %u from trainer %d's relay: it "
                           "serves the job's %s values in the call", req->block, k,
                           pst_dtype_name(ch->cfg.values_dtype));
    if (st != PST_OK) {
        rpc_call_fail(call, st, "%s", pst_error_detail());
        return;
    }
    int slot = -1;
    rpc_call *superseded = NULL;
    char detail[PST_ERROR_DETAIL_MAX];
    pthread_mutex_lock(&ch->mu);
    st = pst_sticky_read(&ch->err, detail);
    for (int i = 0; i < 2 && st == PST_OK; i++)
        if (rb->version[i] == req->version)
            slot = i;
    if (st == PST_OK && slot >= 0) {
        rb->lent[slot]++;
        if (req->version > rb->served)
            rb->served = req->version;
    } else if (st == PST_OK && req->version > newest(rb)) {
        superseded = rb->parked; /* a retry of a pull whose first try is still here */
        rb->parked = call;
        rb->parked_version = req->version;
        rpc_call_set_owner(call, rb);
    } else if (st == PST_OK) {
        st = PST_ERR_RANGE;
        snprintf(detail, sizeof detail, "Pull of block %u, version %lld from trainer %d's "
                 "relay: it holds versions %lld and %lld", req->block,
                 (long long)req->version, k, (long long)rb->version[0],
                 (long long)rb->version[1]);
    }
    pthread_mutex_unlock(&ch->mu);
    if (superseded)
        rpc_call_fail(superseded, PST_ERR_STATE, "Pull of block %u: superseded by a retry",
                      req->block);
    if (st != PST_OK)
        rpc_call_fail(call, st, "%s", detail);
    else if (slot >= 0)
        answer(ch, rb, call, slot);
}

static void handle(void *arg, rpc_call *call)
{
    tr_chain *ch = arg;
    const rpc_method m = rpc_call_method(call);
    if (m == RPC_METHOD_PUSH)
        handle_push(ch, call);
    else if (m == RPC_METHOD_PULL)
        handle_pull(ch, call);
    else
        rpc_call_fail(call, PST_ERR_INVALID, "%s to trainer %d's relay: a trainer's relay "
                      "serves Push and Pull only (Init, Finish and the rest go to the "
                      "pservers)", rpc_method_name(m), ch->cfg.trainer_id);
}

/* Trainer k-1 gave up on a parked pull: it is failed now. */
static void cancelled(void *arg, rpc_call *call)
{
    tr_chain *ch = arg;
    relay_block *rb = rpc_call_owner(call);
    if (!rb)
        return;
    pthread_mutex_lock(&ch->mu);
    const int mine = rb->parked == call;
    if (mine)
        rb->parked = NULL;
    pthread_mutex_unlock(&ch->mu);
    if (mine)
        rpc_call_fail(call, PST_ERR_TIMEOUT, "Pull of block %d: the client gave up waiting",
                      rb->index);
}

pst_status tr_chain_init(tr_chain **out, const tr_chain_config *cfg)
{
    *out = NULL;
    tr_chain *ch = calloc(1, sizeof *ch);
    if (!ch)
        return pst_error_set(PST_ERR_NOMEM, "trainer relay: out of memory");
    ch->cfg = *cfg;
    ch->nblocks = cfg->plan->nblocks;
    pthread_mutex_init(&ch->mu, NULL);
    pthread_cond_init(&ch->cv, NULL);
    pst_sticky_reset(&ch->err);
    ch->blocks = calloc((size_t)ch->nblocks, sizeof *ch->blocks);
    pst_status st = ch->blocks ? PST_OK
                               : pst_error_set(PST_ERR_NOMEM, "trainer relay: out of memory");
    uint64_t largest = 0;
    const size_t esize = pst_dtype_size(cfg->values_dtype);
    for (int i = 0; i < ch->nblocks && st == PST_OK; i++) {
        relay_block *rb = &ch->blocks[i];
        rb->index = i;
        rb->length = cfg->plan->blocks[i].length;
        rb->taken = -1;
        rb->served = -1;
        largest = rb->length > largest ? rb->length : largest;
        for (int s = 0; s < 2; s++) {
            rb->version[s] = -1;
            rb->lends[s] = (lend){ch, rb, s};
            if (!(rb->values[s] = malloc(rb->length * esize)))
                st = pst_error_set(PST_ERR_NOMEM, "trainer relay: out of memory for the "
                                   "values of %d blocks", ch->nblocks);
        }
    }
    const char *colon = strrchr(cfg->listen, ':');
    char bind[PST_ADDR_MAX + 16];
    snprintf(bind, sizeof bind, "0.0.0.0:%s", colon ? colon + 1 : "");
    rpc_server_config sc = {.bind = bind, .threads = 2, .handler = handle, .handler_arg = ch,
                            .on_cancel = cancelled, .keepalive_ms = (int)cfg->peer_timeout_ms,
                            .max_calls = 4 * ch->nblocks + 64,
                            .max_message = (long long)(largest * sizeof(float)) + 65536,
                            .max_wait_ms = (int)cfg->wait_ms,
                            .token = cfg->token && cfg->token[0] ? cfg->token : NULL};
    if (st == PST_OK && (st = rpc_server_init(&ch->server, &sc)) != PST_OK)
        st = pst_error_wrap(st, "trainer %d's relay on %s (PSTRAIN_CHAIN entry %d)",
                            cfg->trainer_id, bind, cfg->trainer_id);
    if (st != PST_OK) {
        tr_chain_free(ch);
        return st;
    }
    PST_INFO("relay of the chain listening on port %d", rpc_server_port(ch->server));
    *out = ch;
    return PST_OK;
}

pst_status tr_chain_take(tr_chain *ch, int b, long step, float *acc)
{
    relay_block *rb = &ch->blocks[b];
    pthread_mutex_lock(&ch->mu);
    rpc_kept_payload *sum = rb->sum && rb->sum_step == step ? rb->sum : NULL;
    const pst_dtype dt = rb->sum_dtype;
    if (sum) {
        rb->sum = NULL;
        rb->taken = step;
    }
    pthread_mutex_unlock(&ch->mu);
    if (!sum)
        return pst_error_set(PST_ERR_STATE, "trainer %d's relay: no sum of block %d, step %ld "
                             "from trainer %d", ch->cfg.trainer_id, b, step,
                             ch->cfg.trainer_id - 1);
    const pst_status st = rpc_payload_read_f32(rpc_kept_payload_view(sum), dt, 0, acc,
                                               rb->length);
    rpc_kept_payload_free(sum);
    return st;
}

pst_status tr_chain_values(tr_chain *ch, int b, int64_t version, const void *values)
{
    relay_block *rb = &ch->blocks[b];
    const int slot = (int)(version & 1);
    rpc_call *call = NULL;
    pthread_mutex_lock(&ch->mu);
    if (rb->lent[slot] > 0) {
        pthread_mutex_unlock(&ch->mu);
        return pst_error_set(PST_ERR_INTERNAL, "trainer %d's relay: version %lld of block %d "
                             "landed while version %lld is still being sent to trainer %d",
                             ch->cfg.trainer_id, (long long)version, b,
                             (long long)rb->version[slot], ch->cfg.trainer_id - 1);
    }
    memcpy(rb->values[slot], values, rb->length * pst_dtype_size(ch->cfg.values_dtype));
    rb->version[slot] = version;
    if (rb->parked && rb->parked_version == version) {
        call = rb->parked;
        rb->parked = NULL;
        rb->lent[slot]++;
        rb->served = version;
    }
    pthread_mutex_unlock(&ch->mu);
    if (call)
        answer(ch, rb, call, slot);
    return PST_OK;
}

void tr_chain_fail(tr_chain *ch, int b, pst_status st, const char *detail)
{
    relay_block *rb = &ch->blocks[b];
    /* The relay itself still answers: trainer k-1 must not retry what failed further up. */
    if (st == PST_ERR_UNAVAILABLE)
        st = PST_ERR_STATE;
    pthread_mutex_lock(&ch->mu);
    pst_sticky_fail(&ch->err, st, detail);
    rpc_call *call = rb->parked;
    rb->parked = NULL;
    pthread_mutex_unlock(&ch->mu);
    if (call)
        rpc_call_fail(call, st, "trainer %d, down the chain: %s", ch->cfg.trainer_id, detail);
}

void tr_chain_drain(tr_chain *ch)
{
    if (!ch)
        return;
    const double until = pst_clock_s() + (double)ch->cfg.wait_ms * 1e-3;
    pthread_mutex_lock(&ch->mu);
    for (;;) {
        int busy = -1;
        for (int i = 0; i < ch->nblocks && busy < 0; i++) {
            const relay_block *rb = &ch->blocks[i];
            if (rb->served < newest(rb) || rb->lent[0] || rb->lent[1])
                busy = i;
        }
        if (busy < 0 || pst_clock_s() >= until) {
            if (busy >= 0)
                PST_WARN("trainer %d's relay closes with block %d's last values not pulled "
                         "by trainer %d", ch->cfg.trainer_id, busy, ch->cfg.trainer_id - 1);
            break;
        }
        pst_cond_wait_ms(&ch->cv, &ch->mu, 50);
    }
    pthread_mutex_unlock(&ch->mu);
}

void tr_chain_free(tr_chain *ch)
{
    if (!ch)
        return;
    /* Pulls still parked: this trainer is leaving (the job's end drained them), so they fail
     * now, in a way trainer k-1 does not retry, rather than as the server's shutdown would
     * (unavailable: retried for the connect timeout). */
    for (int i = 0; ch->blocks && i < ch->nblocks; i++) {
        pthread_mutex_lock(&ch->mu);
        rpc_call *call = ch->blocks[i].parked;
        ch->blocks[i].parked = NULL;
        pthread_mutex_unlock(&ch->mu);
        if (call)
            rpc_call_fail(call, PST_ERR_STATE, "trainer %d left the job: its relay closed "
                          "with this pull of block %d waiting", ch->cfg.trainer_id, i);
    }
    rpc_server_free(ch->server); /* waits for the replies in flight */
    for (int i = 0; ch->blocks && i < ch->nblocks; i++) {
        rpc_kept_payload_free(ch->blocks[i].sum);
        free(ch->blocks[i].values[0]);
        free(ch->blocks[i].values[1]);
    }
    free(ch->blocks);
    pthread_mutex_destroy(&ch->mu);
    pthread_cond_destroy(&ch->cv);
    free(ch);
}
