/* collectives_nccl.c — the collectives of collectives.h on a CUDA runtime, through NCCL.
 *
 * Built with PSTRAIN_HAVE_CUDA only. Needs GPUs: tests/test_collectives.c runs it under
 * `make test-gpu` (run on one H200: comm creation only, since one device needs no
 * collective; several GPUs have not been tried).
 *
 * DESIGN. One process drives every GPU of the runtime, so the communicators come from
 * ncclCommInitAll (one per device, in device order). A collective over some of the devices
 * (pst_comm_reduce_some: a pipeline stage's replica group, the tied table's two stages)
 * runs on a communicator set of exactly those, kept with the comm (ranks in device order;
 * the root's rank is its place among the members): NCCL has no collective over a subset of
 * a communicator's ranks. The executor makes its sets at init (pst_comm_prepare_some); one
 * made at its first use instead runs NCCL's setup (allocations that may synchronize the
 * GPUs) inside the collective, where another comm's work in flight could stall it. Each pst_comm owns its own sets: the
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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/runtime/collectives_impl.h"
#include "common/runtime/cuda/cuda_check.h"
#include "common/runtime/cuda/cuda_impl.h"
#include "common/runtime/device_impl.h"

/* A communicator set over some of the runtime's devices: comms[i] is the i-th member's
 * (device order). */
typedef struct nccl_group {
    uint64_t members; /* bit d: device d */
    int k;
    ncclComm_t comms[PST_DEVICE_MAX_COUNT];
} nccl_group;

typedef struct nccl_ctx {
    nccl_group all;     /* every device, made with the comm */
    nccl_group *groups; /* (ngroups) the subsets used so far, made at their first use */
    int ngroups;
} nccl_ctx;

static pst_status nccl_init(pst_comm *c)
{
    nccl_ctx *nc = calloc(1, sizeof *nc);
    if (!nc)
        return pst_error_set(PST_ERR_NOMEM, "pst_comm_init: out of memory");
    nc->all.members = pst_devices_first(c->count);
    pst_status st = pst_cuda_nccl_comms_create(c->rt, nc->all.members, nc->all.comms);
    if (st != PST_OK) {
        free(nc);
        return st;
    }
    nc->all.k = c->count;
    c->ctx = nc;
    return PST_OK;
}

/* Teardown errors are not reported (nothing can be done). */
static void group_destroy(nccl_group *g)
{
    for (int i = 0; i < g->k; i++)
        (void)ncclCommDestroy(g->comms[i]);
}

static void nccl_free(pst_comm *c)
{
    nccl_ctx *nc = c->ctx;
    if (!nc)
        return;
    group_destroy(&nc->all);
    for (int i = 0; i < nc->ngroups; i++)
        group_destroy(&nc->groups[i]);
    free(nc->groups);
    free(nc);
    c->ctx = NULL;
}

/* The communicator set of exactly `members` (two or more devices), made now if this comm
 * has none yet. Under the comm's lock (collectives.c), so from one thread at a time. */
static pst_status group_of(pst_comm *c, uint64_t members, const nccl_group **out)
{
    nccl_ctx *nc = c->ctx;
    if (members == nc->all.members) {
        *out = &nc->all;
        return PST_OK;
    }
    for (int i = 0; i < nc->ngroups; i++)
        if (nc->groups[i].members == members) {
            *out = &nc->groups[i];
            return PST_OK;
        }
    nccl_group *more = realloc(nc->groups, (size_t)(nc->ngroups + 1) * sizeof *more);
    if (!more)
        return pst_error_set(PST_ERR_NOMEM, "NCCL communicators of devices %#llx: out of "
                             "memory", (unsigned long long)members);
    nc->groups = more;
    nccl_group *g = &nc->groups[nc->ngroups];
    *g = (nccl_group){.members = members, .k = __builtin_popcountll(members)};
    PST_TRY(pst_cuda_nccl_comms_create(c->rt, members, g->comms));
    nc->ngroups++;
    *out = g;
    return PST_OK;
}

/* One NCCL call per member, rank i on the i-th member's buffer and stream, inside one NCCL
 * group (so one thread issues them without deadlock); the group is always closed. */
static pst_status grouped(pst_comm *c, void *const bufs[], size_t n, int root,
                          pst_stream *const streams[], uint64_t members, int broadcast)
{
    const nccl_group *g = NULL;
    PST_TRY(group_of(c, members, &g));
    cudaStream_t cs[PST_DEVICE_MAX_COUNT];
    void *b[PST_DEVICE_MAX_COUNT];
    int k = 0, root_rank = 0;
    for (int d = 0; d < c->count; d++) {
        if (!((members >> d) & 1u))
            continue;
        int skip; /* ignored: see DESIGN */
        PST_TRY(pst_cuda_stream_begin(streams[d], &cs[k], &skip));
        if (d == root)
            root_rank = k;
        b[k++] = bufs[d];
    }
    PST_CUDA_CHECK(ncclGroupStart());
    pst_status st = PST_OK;
    for (int i = 0; i < k && st == PST_OK; i++)
        st = broadcast /* a copy: bytes, whatever the element type */
                 ? PST_CUDA_STATUS(ncclBcast(b[i], n, ncclUint8, root_rank, g->comms[i], cs[i]))
                 : PST_CUDA_STATUS(ncclReduce(b[i], b[i], n, ncclFloat, ncclSum, root_rank,
                                              g->comms[i], cs[i]));
    if (st != PST_OK) {
        char keep[PST_ERROR_DETAIL_MAX];
        snprintf(keep, sizeof keep, "%s", pst_error_detail());
        (void)ncclGroupEnd();
        return pst_error_set(st, "%s", keep);
    }
    PST_CUDA_CHECK(ncclGroupEnd());
    return PST_OK;
}

static pst_status nccl_prepare(pst_comm *c, uint64_t members)
{
    const nccl_group *g = NULL;
    return group_of(c, members, &g);
}

static pst_status nccl_reduce(pst_comm *c, float *const bufs[], size_t n, int root,
                              pst_stream *const streams[], uint64_t members)
{
    return grouped(c, (void *const *)bufs, n, root, streams, members, 0);
}

static pst_status nccl_broadcast(pst_comm *c, void *const bufs[], size_t bytes, int root,
                                 pst_stream *const streams[], uint64_t members)
{
    return grouped(c, bufs, bytes, root, streams, members, 1);
}

const pst_comm_iface pst_comm_nccl_iface = {PST_COMM_IFACE(nccl), .prepare = nccl_prepare};
