/* exec_pipe.h — the executor's pipeline mode (--pipeline P > 1; exec_pipe.c), private to
 * trainer/exec*.c. It uses the executor's state and helpers (exec_impl.h) and its block
 * layout (exec_layout.h); exec.c and the step call it, never the other way round. */
#ifndef TR_EXEC_PIPE_H
#define TR_EXEC_PIPE_H

#include "trainer/exec_impl.h"

/* Init (after the blocks, their layers and the devices' gradient buffers exist): the
 * schedule, the partition, the slots and the layer instances bound to them; errors:
 * PST_ERR_INVALID (devices not a multiple of the stages, a bad --partition, invalid
 * schedule parameters), PST_ERR_NOMEM. Free accepts ex->pipe NULL (call after
 * the streams are idle). */
pst_status exec_pipe_init(tr_exec *ex);
void exec_pipe_free(tr_exec *ex);
/* Rebinds every slot's layers to the devices' current parameter buffers. */
void exec_pipe_bind(tr_exec *ex);
/* Queues a step's compute over `rows` host rows on every device (the lists of the
 * schedule), gradients zeroed first; grad_done and x_done are recorded as in exec_step.c. */
pst_status exec_pipe_step(tr_exec *ex, long step, const void *x, const int32_t *y, int rows,
                          float scale);
/* The step's loss sum (call after the compute streams are synchronized). */
double exec_pipe_loss(const tr_exec *ex, int rows);
/* Evaluation forward (blocking): per-row losses, optional probabilities, correct count. */
pst_status exec_pipe_forward(tr_exec *ex, const void *x, const int32_t *y, int rows,
                             float *losses, float *probs, long *correct);

#endif /* TR_EXEC_PIPE_H */
