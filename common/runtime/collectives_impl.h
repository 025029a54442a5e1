/* collectives_impl.h — the collectives' implementation table (private; users include
 * common/runtime/collectives.h). collectives.c checks every argument, serializes the calls of one
 * comm, then calls the table: an implementation may trust that bufs and streams hold a
 * valid entry for every member (bit d of `members`; the others may be NULL), that
 * streams[d] belongs to device d, that root is a member, that n > 0 and that there are at
 * least two members. */
#ifndef PST_COLLECTIVES_IMPL_H
#define PST_COLLECTIVES_IMPL_H

#include <pthread.h>

#include "common/runtime/collectives.h"

/* Floats a member sums at least before the host reduce is split over the members' streams
 * (collectives.c). A split costs each member's stream a wake-up or two (microseconds,
 * against a few microseconds to sum 16384 floats of two devices): a chosen bound, not a
 * tuned one. */
#define PST_COMM_HOST_SPLIT 16384

typedef struct pst_comm_iface {
    const char *name; /* "host", "nccl" */
    /* Creates c->ctx for c->rt (c->count devices). On failure releases what it made. */
    pst_status (*init)(pst_comm *c);
    /* Releases c->ctx; accepts a NULL ctx. */
    void (*free)(pst_comm *c);
    /* members (reduce, broadcast): bit d, device d takes part (the root always does);
     * every device in pst_comm_reduce and pst_comm_broadcast(_bytes) */
    pst_status (*reduce)(pst_comm *c, float *const bufs[], size_t n, int root,
                         pst_stream *const streams[], uint64_t members);
    /* Copies `bytes` bytes of bufs[root] into every other member's buffer. */
    pst_status (*broadcast)(pst_comm *c, void *const bufs[], size_t bytes, int root,
                            pst_stream *const streams[], uint64_t members);
    /* Optional: makes what collectives over `members` (two or more devices) need; called
     * with c->mu held. NULL: nothing to make. */
    pst_status (*prepare)(pst_comm *c, uint64_t members);
} pst_comm_iface;

/* The name and required hooks of the collectives backend id (id_init, id_free, id_reduce,
 * id_broadcast), for its table: {PST_COMM_IFACE(host)}. */
#define PST_COMM_IFACE(id)                                                                    \
    .name = #id, .init = id##_init, .free = id##_free, .reduce = id##_reduce,                 \
    .broadcast = id##_broadcast

struct pst_comm {
    const pst_comm_iface *iface;
    pst_runtime *rt;
    int count;          /* devices */
    pthread_mutex_t mu; /* serializes the calls */
    void *ctx;          /* implementation state */
};

/* Host implementation (collectives.c), always built. */
extern const pst_comm_iface pst_comm_host_iface;
#ifdef PSTRAIN_HAVE_CUDA
/* NCCL implementation (cuda/collectives_nccl.c). */
extern const pst_comm_iface pst_comm_nccl_iface;
#endif

#endif /* PST_COLLECTIVES_IMPL_H */
