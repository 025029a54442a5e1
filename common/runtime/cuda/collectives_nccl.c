/* collectives_nccl.c — the collectives of collectives.h on a CUDA runtime, through NCCL.
 *
 * Built with PSTRAIN_HAVE_CUDA only. Needs GPUs: tests/test_collectives.c runs it under
 * `make test-gpu` (run on one H200: comm creation only, since one device needs no
 * collective; several GPUs have not been tried).
 *
 * DESIGN. One process drives every GPU of the runtime, so the communicators come from
 * ncclCommInitAll (one per device, in device order). Each pst_comm owns its own set: the
 * executor reduces on the send streams through one comm while it broadcasts on the receive
 * streams through another, and two NCCL operations in flight on one communicator set can
 * deadlock (NCCL orders the operations of a communicator; ours are on different streams). A
 * reduce or broadcast is one NCCL call per device,
 * grouped (ncclGroupStart/End) so a single thread can issue them without deadlock, each on
 * the caller's stream of that device: NCCL work is stream-ordered, which is exactly the
 * ordering collectives.h promises (after the work queued before, before the work queued
 * after, on every stream). Reduce is in place on the root (sendbuff == recvbuff); the other
 * devices' buffers are only read. NCCL's summation order is its own (ring/tree, chosen by
 * size and topology): deterministic on one machine and device count, not bit-identical to
 * the host implementation or across device counts.
 * A stream whose status is sticky (a failed host function) still takes part: every rank
 * must issue the call or the others would hang; the step is failed anyway. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/runtime/collectives_impl.h"
#include "common/runtime/cuda/cuda_check.h"
#include "common/runtime/cuda/cuda_impl.h"
#include "common/runtime/device_impl.h"

typedef struct nccl_ctx {
    ncclComm_t comms[PST_DEVICE_MAX_COUNT]; /* (count), this comm's own */
    int count;
} nccl_ctx;

static pst_status nccl_init(pst_comm *c)
{
    nccl_ctx *nc = calloc(1, sizeof *nc);
    if (!nc)
        return pst_error_set(PST_ERR_NOMEM, "pst_comm_init: out of memory");
    pst_status st = pst_cuda_nccl_comms_create(c->rt, nc->comms);
    if (st != PST_OK) {
        free(nc);
        return st;
    }
    nc->count = c->count;
    c->ctx = nc;
    return PST_OK;
}

/* Teardown errors are not reported (nothing can be done). */
static void nccl_free(pst_comm *c)
{
    nccl_ctx *nc = c->ctx;
    for (int d = 0; nc && d < nc->count; d++)
        (void)ncclCommDestroy(nc->comms[d]);
    free(nc);
    c->ctx = NULL;
}

/* The cudaStream_t of every streams[d] (makes each device current in turn). */
static pst_status cuda_streams(int count, pst_stream *const streams[],
                               cudaStream_t out[PST_DEVICE_MAX_COUNT])
{
    for (int d = 0; d < count; d++) {
        int skip; /* ignored: see DESIGN */
        PST_TRY(pst_cuda_stream_begin(streams[d], &out[d], &skip));
    }
    return PST_OK;
}

static pst_status group_start(void)
{
    PST_CUDA_CHECK(ncclGroupStart());
    return PST_OK;
}

static pst_status group_end(void)
{
    PST_CUDA_CHECK(ncclGroupEnd());
    return PST_OK;
}

static pst_status reduce_calls(const nccl_ctx *nc, int count, float *const bufs[], size_t n,
                               int root, const cudaStream_t *cs)
{
    for (int d = 0; d < count; d++)
        PST_CUDA_CHECK(ncclReduce(bufs[d], bufs[d], n, ncclFloat, ncclSum, root, nc->comms[d],
                                  cs[d]));
    return PST_OK;
}

/* A broadcast is a copy: bytes, whatever the element type. */
static pst_status bcast_calls(const nccl_ctx *nc, int count, void *const bufs[], size_t bytes,
                              int root, const cudaStream_t *cs)
{
    for (int d = 0; d < count; d++)
        PST_CUDA_CHECK(ncclBcast(bufs[d], bytes, ncclUint8, root, nc->comms[d], cs[d]));
    return PST_OK;
}

/* Runs the per-device calls inside one NCCL group; the group is always closed. */
static pst_status grouped(pst_comm *c, void *const bufs[], size_t n, int root,
                          pst_stream *const streams[], int broadcast)
{
    cudaStream_t cs[PST_DEVICE_MAX_COUNT];
    const nccl_ctx *nc = c->ctx;
    PST_TRY(cuda_streams(c->count, streams, cs));
    PST_TRY(group_start());
    pst_status st = broadcast ? bcast_calls(nc, c->count, bufs, n, root, cs)
                              : reduce_calls(nc, c->count, (float *const *)bufs, n, root, cs);
    if (st != PST_OK) {
        char keep[PST_ERROR_DETAIL_MAX];
        snprintf(keep, sizeof keep, "%s", pst_error_detail());
        (void)group_end();
        return pst_error_set(st, "%s", keep);
    }
    return group_end();
}

/* A collective over some of the devices would need a communicator of those: not made yet. */
static pst_status every_member(const pst_comm *c, uint64_t members, const char *what)
{
    if (members == pst_devices_first(c->count))
        return PST_OK;
    return pst_error_set(PST_ERR_UNSUPPORTED, "%s: NCCL runs over every device of the "
                         "runtime, not some (members %#llx of %d)", what,
                         (unsigned long long)members, c->count);
}

static pst_status nccl_reduce(pst_comm *c, float *const bufs[], size_t n, int root,
                              pst_stream *const streams[], uint64_t members)
{
    PST_TRY(every_member(c, members, "pst_comm_reduce"));
    return grouped(c, (void *const *)bufs, n, root, streams, 0);
}

static pst_status nccl_broadcast(pst_comm *c, void *const bufs[], size_t bytes, int root,
                                 pst_stream *const streams[], uint64_t members)
{
    PST_TRY(every_member(c, members, "pst_comm_broadcast"));
    return grouped(c, bufs, bytes, root, streams, 1);
}

const pst_comm_iface pst_comm_nccl_iface = PST_COMM_IFACE(nccl);
