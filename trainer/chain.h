/* chain.h — a trainer's relay in a chain of trainers (PSTRAIN_CHAIN, sync mode).
 *
 * With T trainers and one pserver, every trainer's push and pull crosses the pserver's
 * one link: T gradients in and T copies of the values out a step, the whole step's bytes
 * on one link however fast the trainers' own are. In a chain the trainers pass each block
 * on instead: trainer 0 pushes its gradient to trainer 1, which adds its own and pushes
 * the sum so far to trainer 2, and so on; only trainer T-1 pushes, the sum of every
 * trainer's gradient, to the block's pserver (PushRequest.trainers = T). The values come
 * back the same way: trainer T-1 pulls them from the pserver, trainer k from trainer k+1.
 * Each link, the pserver's included, then carries at most one sum (in f32) and one copy of
 * the values a step each way, whatever T is; the blocks are pipelined, so the chain adds
 * about one block's time per hop, 2T hops (a ring's reduce half, with a PS's optimizer at
 * the end; docs/scaling.md, "A chain of trainers").
 *
 * Exactness: the pserver sums a step's gradients acc = g0; acc += g1; ... in trainer-id
 * order (pserver/store.h). The chain makes the same additions in the same order, in f32,
 * each trainer's gradient first rounded to --grad-dtype as its own push would be, and the
 * sums so far travel in f32: the same bits as the trainers pushing themselves.
 *
 * This file is the relay: trainer k's server (k >= 1) for trainer k-1's pushes of the sum
 * so far and for its pulls. A push is answered at once and its payload kept in the
 * received slices until trainer k's own exchange of the block takes it (tr_chain_take);
 * the `arrived` callback tells the link it is there. A pull is answered from a copy of the
 * values trainer k's own pull received (tr_chain_values), two versions kept per block, or
 * parked until they come. The link (remote.c) does the rest: the sum, the push onward and
 * the pulls. Failures: a parked pull is failed with the reason of trainer k's own failed
 * pull (tr_chain_fail) or when the relay closes; every call has the client's deadline, and
 * nothing waits longer than wait_ms. Not done yet (refused by the configuration): async,
 * fp16 loss scaling, TLS on the relay, rolling back after a failure (--on-failure wait). */
#ifndef TR_CHAIN_H
#define TR_CHAIN_H

#include <stdint.h>

#include "common/dtype.h"
#include "common/error.h"
#include "trainer/plan.h"

typedef struct tr_chain tr_chain;

typedef struct tr_chain_config {
    int trainer_id;          /* k >= 1: it relays for trainer k-1 */
    const char *listen;      /* its PSTRAIN_CHAIN entry, host:port: the port is bound on
                              * every address of this host */
    const tr_plan *plan;     /* the caller's; outlives the relay */
    pst_dtype values_dtype;  /* the job's precision: what pulls carry */
    const char *token;       /* the job's token ("" or NULL: none) */
    long wait_ms;            /* a pull parked this long is failed */
    long peer_timeout_ms;    /* keepalive of trainer k-1's connection */
    /* Block b's sum so far of a step has arrived (on a server thread). */
    void (*arrived)(void *arg, int b);
    void *arg;
} tr_chain_config;

/* Starts the relay's server. Errors: PST_ERR_IO (the port is taken), PST_ERR_NOMEM. */
pst_status tr_chain_init(tr_chain **out, const tr_chain_config *cfg);

/* Block b's sum so far of `step` (f32 sums of trainers 0..k-1), read into acc (its
 * block's length) and let go. PST_ERR_STATE when none of that step has arrived (the link
 * calls it only after `arrived`). */
pst_status tr_chain_take(tr_chain *ch, int b, long step, float *acc);

/* Trainer k's own pull of block b at `version` landed in values (the block's length in
 * values_dtype): keeps a copy for trainer k-1 and answers its pull if it waits. Errors:
 * PST_ERR_INTERNAL when the copy of two versions back is still being sent. */
pst_status tr_chain_values(tr_chain *ch, int b, int64_t version, const void *values);

/* Trainer k's own pull of block b failed: trainer k-1's pull of it fails with `detail`
 * at once, as does every later one. */
void tr_chain_fail(tr_chain *ch, int b, pst_status st, const char *detail);

/* At the job's end: waits (at most wait_ms) until trainer k-1 has pulled every block's
 * last values, so closing the relay cuts none of its last pulls. */
void tr_chain_drain(tr_chain *ch);

/* Stops the server (failing what is parked) and frees everything. Accepts NULL. */
void tr_chain_free(tr_chain *ch);

#endif /* TR_CHAIN_H */
