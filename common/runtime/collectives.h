/* collectives.h — reduce and broadcast among the devices of ONE runtime (one process,
 * several devices), on their streams.
 *
 * The trainer uses them to sum a gradient block from every local device into the block's
 * owner device, and to copy the owner's new parameters back to the others (DESIGN.md,
 * steps 3 and 6). Not for: communication between processes (that is rpc/).
 * Implementations (ggml-style table, collectives_impl.h): on a CPU runtime the host
 * implementation (always built), on a CUDA runtime NCCL (built with PSTRAIN_HAVE_CUDA).
 *
 * Ordering: a collective is ordered after the work already queued on each streams[d] and
 * before the work queued on each streams[d] after the call, like a kernel queued on all of
 * them at once. In particular no device's later work can overwrite its buffer before the
 * collective has read it, and no later work sees a partial result. Nothing blocks the
 * caller: the call queues and returns.
 *
 * Sum order: the host implementation sums in device order, for every root:
 *     out[i] = ((b0[i] + b1[i]) + b2[i]) + ... + b(D-1)[i]
 * (each + one correctly rounded float addition), so results are bit-identical from run to
 * run and equal to a sequential loop over the devices. NCCL sums in NCCL's own order (ring
 * or tree, depending on the topology and the size): deterministic for a fixed machine and
 * device count, but NOT bit-identical across device counts or to the host order.
 *
 * Ownership: the comm keeps a pointer to the runtime, which must outlive it. Buffers and
 * streams stay the caller's; the buffers must stay allocated until the collective has run
 * (synchronize a stream of it, or wait on an event recorded after it).
 * Allocation: init creates everything a call needs (events; NCCL communicators on CUDA),
 * except the host implementation's small job records for a reduce (one, or one a device
 * when a long sum is split), which come from a free list that only grows while more
 * reduces are in flight than ever before.
 * Thread safety: calls on one comm may come from several threads; they are serialized.
 * Errors: PST_ERR_INVALID for bad arguments (detail names the argument); errors of the
 * runtime or of NCCL otherwise. A collective that fails to queue on some devices leaves the
 * ones already queued in place: treat the step as failed. */
#ifndef PST_COLLECTIVES_H
#define PST_COLLECTIVES_H

#include <stddef.h>

#include "common/runtime/device.h"
#include "common/error.h"

typedef struct pst_comm pst_comm;

/* Creates the collectives of the devices of rt (every device, in device order). On error
 * *out is NULL. */
pst_status pst_comm_init(pst_comm **out, pst_runtime *rt);
/* Frees the comm; accepts NULL. Call it once the collectives queued through it have run or
 * their streams have been synchronized (like freeing a buffer a kernel still reads). */
void pst_comm_free(pst_comm *c);
/* "host" or "nccl". */
const char *pst_comm_name(const pst_comm *c);

/* Sums bufs[d][0..n) over every device d into bufs[root] (in place: bufs[root] is an input
 * too). bufs[d] is memory of device d; streams[d] is a stream of device d; both arrays
 * have pst_runtime_count(rt) entries. The other devices' buffers are left unchanged.
 * n == 0, or a runtime of one device, queues nothing. */
pst_status pst_comm_reduce(pst_comm *c, float *const bufs[], size_t n, int root,
                           pst_stream *const streams[]);
/* pst_comm_reduce over the devices in `members` only (bit d: device d; the root must be
 * one): their buffers summed in device order into bufs[root]; the others' bufs[d] are not
 * read (may be NULL) and their streams do not wait. A pipeline's tied weights: the stages
 * that hold them. On NCCL: over a communicator set of exactly those devices, made at the
 * first collective over them (pst_comm_prepare_some makes it beforehand). */
pst_status pst_comm_reduce_some(pst_comm *c, float *const bufs[], size_t n, int root,
                                pst_stream *const streams[], uint64_t members);
/* Copies bufs[root][0..n) into every other device's bufs[d], with the same arguments and
 * ordering rules as pst_comm_reduce. */
pst_status pst_comm_broadcast(pst_comm *c, float *const bufs[], size_t n, int root,
                              pst_stream *const streams[]);
/* The same for `bytes` bytes of any element type (bf16/fp16 parameters). */
pst_status pst_comm_broadcast_bytes(pst_comm *c, void *const bufs[], size_t bytes, int root,
                                    pst_stream *const streams[]);
/* pst_comm_broadcast_bytes to the devices in `members` only (the root must be one), as
 * pst_comm_reduce_some: the others' bufs[d] are not written (may be NULL) and their
 * streams do not wait. */
pst_status pst_comm_broadcast_some(pst_comm *c, void *const bufs[], size_t bytes, int root,
                                   pst_stream *const streams[], uint64_t members);
/* Makes now what collectives over `members` will need (NCCL: their communicator set), so
 * that no step pays for it and a failure shows at the start. Call it before collectives of
 * another comm run on the same GPUs: NCCL's setup of a set made at its first use could
 * stall behind them. Nothing to do on the host comm, or for fewer than two members. */
pst_status pst_comm_prepare_some(pst_comm *c, uint64_t members);

#endif /* PST_COLLECTIVES_H */
