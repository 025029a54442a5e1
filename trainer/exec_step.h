/* exec_step.h — what the step (exec_step.c) lends the rest of the executor. Private to
 * trainer/exec*.c. */
#ifndef TR_EXEC_STEP_H
#define TR_EXEC_STEP_H

#include "trainer/exec_impl.h"

/* Points every replica at the newest parameters (two buffers: pbuf[cur]) and rebinds the
 * layers to them; evaluation and tr_exec_params call it too. */
void exec_use_newest_params(tr_exec *ex);

#endif /* TR_EXEC_STEP_H */
