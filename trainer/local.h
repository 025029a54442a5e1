/* local.h — the link of a trainer training alone (link.h): an in-process parameter store,
 * the pserver's own store code (pserver/store.h) with one trainer in sync mode, so local
 * training runs the same update rule, NaN/Inf checks and optimizer as a cluster.
 *
 * With `homes` at start (CPU devices sharing one parameter copy) the store's master values
 * are those parameters: a push is checked and applied in place, without a copy, and the
 * pull answers with those same values. Without (GPU devices, or CPU replicas taking the GPU
 * schedule) the store keeps host values and a pull copies them into the exchange's dst. An exchange runs entirely on the calling thread;
 * done is called before it returns. */
#ifndef TR_LOCAL_H
#define TR_LOCAL_H

#include "common/config.h"
#include "trainer/link.h"

/* cfg's optimizer (with total_steps set) over the plan's blocks; cfg and plan must outlive
 * the link. Errors: PST_ERR_NOMEM. */
pst_status tr_local_init(tr_link **out, const tr_link_settings *cfg, const tr_plan *plan);

#endif /* TR_LOCAL_H */
