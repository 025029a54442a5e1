/* remote.h — a trainer's link to the pservers (link.h's interface over gRPC): Init,
 * per-block exchange, Finish.
 *
 * A block exchange for step s pushes the block's gradient to the pserver that owns it and
 * pulls the block's new values: in sync mode the Pull of version s+1 starts together with
 * the Push (the pserver answers it once all trainers' gradients for step s are summed in
 * trainer-id order and applied); in async mode the Pull (of the current version) starts
 * when the Push is acknowledged. The pulled values are copied from the received slices
 * straight into the caller's buffer, and the gradient is lent to gRPC without a copy; the
 * exchange's done callback runs once both are finished (values written, gradient
 * released), on an RPC thread.
 * Start: every trainer sends Init to every pserver (trainer 0 with the initial values of
 * the pserver's blocks), then pulls version 0 of every block, so all trainers begin from
 * trainer 0's parameters. Finish: a Finish call to every pserver.
 * Sparse tables (link.h's sparse ops, pserver/tables.h): one PullSparse or PushSparse per
 * pserver, all at once, rows in bf16 on the wire with --precision bf16 (f32 otherwise),
 * each call with its deadline; the tables' totals come with the Finish replies.
 * Sparse tables (link.h's sparse ops, pserver/tables.h): one PullSparse or PushSparse per
 * pserver, all at once, rows in bf16 on the wire with --precision bf16 (f32 otherwise);
 * the tables' totals come with the Finish replies.
 * Errors name the pserver's address and what failed. Thread safety: exchanges of
 * different blocks may be started from any threads; one exchange per block at a time. */
#ifndef TR_REMOTE_H
#define TR_REMOTE_H

#include "common/config.h"
#include "trainer/link.h"
#include "trainer/plan.h"

typedef struct tr_remote tr_remote;

/* A link over cfg's pservers for the caller's plan (built for cfg->num_pservers); connects
 * lazily. The config and the plan must outlive the link. */
pst_status tr_remote_init(tr_remote **out, const tr_link_settings *cfg,
                          const tr_plan *plan);
void tr_remote_free(tr_remote *r); /* accepts NULL */
/* The bytes of pushes a trainer keeps in flight (remote.c's scheduling): send_window as
 * configured, or for PST_SEND_WINDOW_AUTO one round of the plan's largest block (in
 * wire_size bytes an element) per pserver, at least two blocks, and at least
 * TR_REMOTE_SAME_HOST_WINDOW when every pserver is on this host (same_host). */
#define TR_REMOTE_SAME_HOST_WINDOW ((size_t)8 << 20)
size_t tr_remote_window(size_t send_window, const tr_plan *plan, size_t wire_size,
                        int same_host);
/* The credits of a sync trainer (remote.c's scheduling): once every block of the step is
 * queued, a push starts only if its block is fewer than this many blocks past the lowest
 * block whose exchange has not ended. send_ahead as configured, or for PST_SEND_AHEAD_AUTO
 * 4 blocks per pserver, and 0 (no limit) when no link is shared among the trainers
 * (unshared: every pserver on this host, or a chain of trainers, chain.h). */
int tr_remote_ahead(int send_ahead, const tr_plan *plan, int unshared);
/* The link interface of r (link.h): its free frees r. */
tr_link *tr_remote_link(tr_remote *r);
/* Init on every pserver with the values in params (trainer 0's are the cluster's), then
 * pulls every block's version 0 into params. Blocking. */
pst_status tr_remote_start(tr_remote *r, float *params);
/* Starts the exchange of block b for 0-based `step`: grad[0..len) is pushed in
 * --grad-dtype with its loss scale (kept alive and unchanged until done runs), the new
 * values land in dst[0..len) in --precision's dtype. done runs once, after the pull. */
pst_status tr_remote_exchange(tr_remote *r, int b, long step, const float *grad, float scale,
                              void *dst, tr_exchange_fn done, void *arg);
void tr_remote_times(const tr_remote *r, int b, tr_exchange_times *out);
/* Finish on every pserver (early: leaving at `step` for `reason`, see link.h). A pserver
 * already gone is a warning, not an error. */
pst_status tr_remote_finish(tr_remote *r, int early, long step, const char *reason);

#endif /* TR_REMOTE_H */
