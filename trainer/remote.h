/* remote.h — the distributed updater: pushes gradient blocks to the pservers that own
 * them and pulls the new values, following the block plan (plan.h).
 *
 * Step s, sync mode: for every block, in reverse buffer order (the order backward
 * finishes them), a Push of step s and a Pull of version s+1 are started together on the
 * block's pserver; the pserver answers the Pull once all trainers' gradients for step s
 * are summed in trainer-id order and applied. Async mode: the Pull (of whatever version
 * is current) starts when the Push is acknowledged. Pulled values are copied from the
 * received slices straight into the model's flat parameter buffer. Gradient payloads are
 * lent to gRPC without copying; the step returns only when gRPC has released them.
 * Start: every trainer sends Init to every pserver (trainer 0 with the initial values of
 * the pserver's blocks), then pulls version 0 of every block, so all trainers begin from
 * trainer 0's parameters. Finish: a Finish call to every pserver.
 * Errors carry the pserver's address and what failed. */
#ifndef TR_REMOTE_H
#define TR_REMOTE_H

#include "common/config.h"
#include "trainer/train.h"

/* The config must outlive the updater. Free with tr_remote_updater_free. */
pst_status tr_remote_updater_init(tr_updater *out, const pst_config *cfg);
void tr_remote_updater_free(tr_updater *u); /* accepts a zeroed one */

#endif /* TR_REMOTE_H */
