/* collectives.c — the collectives' public functions (argument checks, per-comm
 * serialization, choice of implementation) and the host implementation used on CPU
 * runtimes (see collectives.h).
 *
 * DESIGN (host). A reduce to `root` is three steps queued with the device runtime's own
 * tools, so the CPU backend's FIFO and event semantics give the ordering of collectives.h:
 *   1. every other device d records ready[d] on streams[d]; streams[root] waits on each;
 *   2. streams[root] runs one host function that sums the buffers in device order into
 *      bufs[root] (per element: acc = b0; acc += b1; ...; so any root gives the same bits);
 *   3. streams[root] records done[root]; every other streams[d] waits on it, so work the
 *      caller queues later on d cannot overwrite bufs[d] before the sum has read it.
 * A long reduce (PST_COMM_HOST_SPLIT floats a member and more) splits step 2 over the members:
 * each member's stream sums one slice of the elements (the same device order per element,
 * so the same bits), after every member's ready (each waits on all the others'), and every
 * member waits on all the others' done. The sum then runs on as many threads as there are
 * members, instead of one while the others wait.
 * A broadcast is the same with step 2 replaced by copies bufs[root] -> bufs[d] queued on
 * streams[root]. The events are made once per device at init; re-recording them for the
 * next call is safe because each wait keeps the mark it captured (device.h), and calls on a
 * comm are serialized. The reduce's job records (the buffer pointers and the slice each
 * host function reads; one, or one a member when split) come from a free list; each host
 * function returns its own. A job whose host function
 * is skipped (its stream failed) is not reused but is freed with the comm. */
#include "common/runtime/collectives.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/memory.h"
#include "common/runtime/collectives_impl.h"
#include "common/runtime/device.h"
#include "common/runtime/device_impl.h"

/* ---- public functions -------------------------------------------------------------- */

pst_status pst_comm_init(pst_comm **out, pst_runtime *rt)
{
    if (!out)
        return pst_error_set(PST_ERR_INVALID, "pst_comm_init: out is NULL");
    *out = NULL;
    if (!rt)
        return pst_error_set(PST_ERR_INVALID, "pst_comm_init: runtime is NULL");
    const pst_comm_iface *iface = &pst_comm_host_iface;
    if (pst_runtime_backend(rt) == PST_BACKEND_CUDA) {
#ifdef PSTRAIN_HAVE_CUDA
        iface = &pst_comm_nccl_iface;
#else
        return pst_error_set(PST_ERR_UNSUPPORTED,
                             "pst_comm_init: a CUDA runtime in a build without NCCL");
#endif
    }
    pst_comm *c = calloc(1, sizeof *c);
    if (!c)
        return pst_error_set(PST_ERR_NOMEM, "pst_comm_init: out of memory");
    c->iface = iface;
    c->rt = rt;
    c->count = pst_runtime_count(rt);
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return pst_error_set(PST_ERR_INTERNAL, "pst_comm_init: pthread_mutex_init failed");
    }
    pst_status st = iface->init(c);
    if (st != PST_OK) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return st;
    }
    *out = c;
    return PST_OK;
}

void pst_comm_free(pst_comm *c)
{
    if (!c)
        return;
    c->iface->free(c);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const char *pst_comm_name(const pst_comm *c)
{
    return c ? c->iface->name : "(no comm)";
}

/* The checks every implementation relies on (collectives_impl.h). */
static pst_status check_members(const char *what, pst_comm *c, void *const bufs[], size_t n,
                                int root, pst_stream *const streams[], uint64_t members)
{
    if (!c)
        return pst_error_set(PST_ERR_INVALID, "%s: comm is NULL", what);
    if (!bufs || !streams)
        return pst_error_set(PST_ERR_INVALID, "%s: %s array is NULL", what,
                             bufs ? "streams" : "bufs");
    if (root < 0 || root >= c->count)
        return pst_error_set(PST_ERR_INVALID,
                             "%s: root %d is not a device of the runtime (0..%d)", what, root,
                             c->count - 1);
    if (n > SIZE_MAX / sizeof(float))
        return pst_error_set(PST_ERR_INVALID, "%s: %zu floats do not fit in memory", what, n);
    if (!((members >> root) & 1u))
        return pst_error_set(PST_ERR_INVALID, "%s: root %d does not take part (members %#llx)",
                             what, root, (unsigned long long)members);
    for (int d = 0; d < c->count; d++) {
        pst_device *dev = pst_runtime_device(c->rt, d);
        if (!((members >> d) & 1u))
            continue;
        if (!streams[d])
            return pst_error_set(PST_ERR_INVALID, "%s: streams[%d] is NULL", what, d);
        if (pst_stream_device(streams[d]) != dev)
            return pst_error_set(PST_ERR_INVALID,
                                 "%s: streams[%d] is a stream of %s, not of %s (streams[d] "
                                 "must be a stream of device d of the comm's runtime)",
                                 what, d, pst_device_name(pst_stream_device(streams[d])),
                                 pst_device_name(dev));
        if (n > 0 && !bufs[d])
            return pst_error_set(PST_ERR_INVALID, "%s: bufs[%d] is NULL", what, d);
    }
    return PST_OK;
}

static pst_status check_args(const char *what, pst_comm *c, void *const bufs[], size_t n,
                             int root, pst_stream *const streams[])
{
    return check_members(what, c, bufs, n, root, streams, c ? pst_devices_first(c->count) : 0);
}

pst_status pst_comm_reduce(pst_comm *c, float *const bufs[], size_t n, int root,
                           pst_stream *const streams[])
{
    return pst_comm_reduce_some(c, bufs, n, root, streams, c ? pst_devices_first(c->count) : 0);
}

/* What both collectives do around their backend's call: only the comm's devices take
 * part; the checks; nothing to do with no bytes or the root alone; the comm's lock. */
static pst_status run_some(pst_comm *c, int reduce, void *const bufs[], size_t bytes, int root,
                           pst_stream *const streams[], uint64_t members)
{
    if (c)
        members &= pst_devices_first(c->count);
    PST_TRY(check_members(reduce ? "pst_comm_reduce" : "pst_comm_broadcast_bytes", c, bufs,
                          bytes / sizeof(float), root, streams, members));
    if (bytes == 0 || members == ((uint64_t)1 << root))
        return PST_OK; /* the sum of one buffer is itself; nobody else to copy to */
    pthread_mutex_lock(&c->mu);
    pst_status st = reduce ? c->iface->reduce(c, (float *const *)bufs, bytes / sizeof(float),
                                              root, streams, members)
                           : c->iface->broadcast(c, bufs, bytes, root, streams, members);
    pthread_mutex_unlock(&c->mu);
    return st;
}

pst_status pst_comm_reduce_some(pst_comm *c, float *const bufs[], size_t n, int root,
                                pst_stream *const streams[], uint64_t members)
{
    if (n > SIZE_MAX / sizeof(float)) /* as check_members says it, before n * 4 wraps */
        return pst_error_set(PST_ERR_INVALID, "pst_comm_reduce: %zu floats do not fit in memory",
                             n);
    return run_some(c, 1, (void *const *)bufs, n * sizeof(float), root, streams, members);
}

pst_status pst_comm_broadcast(pst_comm *c, float *const bufs[], size_t n, int root,
                              pst_stream *const streams[])
{
    PST_TRY(check_args("pst_comm_broadcast", c, (void *const *)bufs, n, root, streams));
    return pst_comm_broadcast_bytes(c, (void *const *)bufs, n * sizeof(float), root, streams);
}

pst_status pst_comm_broadcast_bytes(pst_comm *c, void *const bufs[], size_t bytes, int root,
                                    pst_stream *const streams[])
{
    return pst_comm_broadcast_some(c, bufs, bytes, root, streams, c ? pst_devices_first(c->count) : 0);
}

pst_status pst_comm_broadcast_some(pst_comm *c, void *const bufs[], size_t bytes, int root,
                                   pst_stream *const streams[], uint64_t members)
{
    return run_some(c, 0, bufs, bytes, root, streams, members);
}

pst_status pst_comm_prepare_some(pst_comm *c, uint64_t members)
{
    if (!c)
        return pst_error_set(PST_ERR_INVALID, "pst_comm_prepare_some: comm is NULL");
    members &= pst_devices_first(c->count);
    if (!c->iface->prepare || __builtin_popcountll(members) < 2)
        return PST_OK;
    pthread_mutex_lock(&c->mu);
    const pst_status st = c->iface->prepare(c, members);
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* ---- host implementation ----------------------------------------------------------- */

/* Elements summed per pass: the partial sums of one chunk stay in cache. */
#define HOST_CHUNK 1024

struct host_ctx;

/* What the reduce's host function reads: elements [lo, hi) of the sum. */
typedef struct host_job {
    struct host_ctx *hc;
    float *bufs[PST_DEVICE_MAX_COUNT]; /* (count) */
    uint64_t members;                  /* the devices summed (bit d) */
    int count, root;
    size_t lo, hi;
    struct host_job *next_free;
    struct host_job *next_all;
} host_job;

typedef struct host_ctx {
    pst_event *ready[PST_DEVICE_MAX_COUNT]; /* on device d: streams[d] reached the call */
    pst_event *done[PST_DEVICE_MAX_COUNT];  /* on device d: the collective rooted at d ran */
    pthread_mutex_t pool_mu;                /* guards free_jobs, all_jobs */
    host_job *free_jobs;
    host_job *all_jobs;
} host_ctx;

static void host_free(pst_comm *c)
{
    host_ctx *hc = c->ctx;
    if (!hc)
        return;
    for (int d = 0; d < c->count; d++) {
        pst_event_destroy(hc->ready[d]);
        pst_event_destroy(hc->done[d]);
    }
    PST_FREE_LIST(hc->all_jobs, next_all);
    pthread_mutex_destroy(&hc->pool_mu);
    free(hc);
    c->ctx = NULL;
}

#define HOST_JOBS 256

static pst_status host_init(pst_comm *c)
{
    host_ctx *hc = calloc(1, sizeof *hc);
    if (!hc)
        return pst_error_set(PST_ERR_NOMEM, "pst_comm_init: out of memory");
    if (pthread_mutex_init(&hc->pool_mu, NULL) != 0) {
        free(hc);
        return pst_error_set(PST_ERR_INTERNAL, "pst_comm_init: pthread_mutex_init failed");
    }
    c->ctx = hc;
    /* Reduce jobs are recycled; enough for the blocks of a few steps in flight (a job a
     * member where a reduce is split) are made now so a training step allocates nothing
     * (more are made once if ever needed). */
    for (int i = 0; i < HOST_JOBS; i++) {
        host_job *j = calloc(1, sizeof *j);
        if (!j)
            break;
        j->hc = hc;
        j->next_all = hc->all_jobs;
        hc->all_jobs = j;
        j->next_free = hc->free_jobs;
        hc->free_jobs = j;
    }
    for (int d = 0; d < c->count; d++) {
        pst_device *dev = pst_runtime_device(c->rt, d);
        pst_status st = pst_event_create(dev, &hc->ready[d]);
        if (st == PST_OK)
            st = pst_event_create(dev, &hc->done[d]);
        if (st != PST_OK) {
            host_free(c);
            return st;
        }
    }
    return PST_OK;
}

static host_job *job_get(host_ctx *hc)
{
    pthread_mutex_lock(&hc->pool_mu);
    host_job *j = hc->free_jobs;
    if (j) {
        hc->free_jobs = j->next_free;
    } else {
        j = calloc(1, sizeof *j);
        if (j) {
            j->hc = hc;
            j->next_all = hc->all_jobs;
            hc->all_jobs = j;
        }
    }
    pthread_mutex_unlock(&hc->pool_mu);
    return j;
}

static void job_put(host_ctx *hc, host_job *j)
{
    pthread_mutex_lock(&hc->pool_mu);
    j->next_free = hc->free_jobs;
    hc->free_jobs = j;
    pthread_mutex_unlock(&hc->pool_mu);
}

/* The sum over the members of elements [lo, hi), on one member stream's worker: out[i] =
 * ((b0[i] + b1[i]) + b2[i]) + ... in device order. */
static pst_status host_reduce_run(void *arg)
{
    host_job *j = arg;
    float acc[HOST_CHUNK];
    float *out = j->bufs[j->root];
    int first = 0;
    while (!((j->members >> first) & 1u))
        first++;
    for (size_t off = j->lo; off < j->hi; off += HOST_CHUNK) {
        size_t len = j->hi - off < HOST_CHUNK ? j->hi - off : HOST_CHUNK;
        memcpy(acc, j->bufs[first] + off, len * sizeof(float));
        for (int d = first + 1; d < j->count; d++) {
            if (!((j->members >> d) & 1u))
                continue;
            const float *b = j->bufs[d] + off;
            for (size_t i = 0; i < len; i++)
                acc[i] += b[i];
        }
        memcpy(out + off, acc, len * sizeof(float));
    }
    job_put(j->hc, j);
    return PST_OK;
}

/* Step 1: streams[root] waits until every other member's stream has reached this call. */
static pst_status host_enter(host_ctx *hc, int count, int root, pst_stream *const streams[],
                             uint64_t members)
{
    for (int d = 0; d < count; d++) {
        if (d == root || !((members >> d) & 1u))
            continue;
        PST_TRY(pst_event_record(hc->ready[d], streams[d]));
        PST_TRY(pst_stream_wait_event(streams[root], hc->ready[d]));
    }
    return PST_OK;
}

/* Step 3: every other member's stream waits until streams[root] has finished. */
static pst_status host_leave(host_ctx *hc, int count, int root, pst_stream *const streams[],
                             uint64_t members)
{
    PST_TRY(pst_event_record(hc->done[root], streams[root]));
    for (int d = 0; d < count; d++)
        if (d != root && ((members >> d) & 1u))
            PST_TRY(pst_stream_wait_event(streams[d], hc->done[root]));
    return PST_OK;
}

/* Queues elements [lo, hi) of the sum on stream s. */
static pst_status host_reduce_slice(pst_comm *c, float *const bufs[], int root, uint64_t members,
                                    pst_stream *s, size_t lo, size_t hi)
{
    host_ctx *hc = c->ctx;
    host_job *j = job_get(hc);
    if (!j)
        return pst_error_set(PST_ERR_NOMEM, "pst_comm_reduce: out of memory for a job");
    memcpy(j->bufs, bufs, (size_t)c->count * sizeof *bufs);
    j->count = c->count;
    j->members = members;
    j->root = root;
    j->lo = lo;
    j->hi = hi;
    pst_status st = pst_stream_launch(s, host_reduce_run, j);
    if (st != PST_OK)
        job_put(hc, j);
    return st;
}

/* Every member's stream waits until all the others have reached this point (evs: ready
 * or done). */
static pst_status host_all_meet(pst_event *const evs[], int count, pst_stream *const streams[],
                                uint64_t members)
{
    for (int d = 0; d < count; d++)
        if ((members >> d) & 1u)
            PST_TRY(pst_event_record(evs[d], streams[d]));
    for (int d = 0; d < count; d++)
        for (int e = 0; e < count; e++)
            if (e != d && ((members >> d) & 1u) && ((members >> e) & 1u))
                PST_TRY(pst_stream_wait_event(streams[d], evs[e]));
    return PST_OK;
}

static pst_status host_reduce(pst_comm *c, float *const bufs[], size_t n, int root,
                              pst_stream *const streams[], uint64_t members)
{
    host_ctx *hc = c->ctx;
    const int m = __builtin_popcountll(members);
    if (n < (size_t)m * PST_COMM_HOST_SPLIT) {
        PST_TRY(host_enter(hc, c->count, root, streams, members));
        PST_TRY(host_reduce_slice(c, bufs, root, members, streams[root], 0, n));
        return host_leave(hc, c->count, root, streams, members);
    }
    PST_TRY(host_all_meet(hc->ready, c->count, streams, members));
    /* Slices of multiples of 16 floats (whole cache lines where the buffers are aligned),
     * the last one takes the rest. A slice that fails to queue still leaves the meeting
     * after them queued, so later work waits for the slices that were. */
    const size_t per = (n / (size_t)m) & ~(size_t)15;
    size_t lo = 0;
    pst_status st = PST_OK;
    for (int d = 0, k = 0; d < c->count && st == PST_OK; d++) {
        if (!((members >> d) & 1u))
            continue;
        const size_t hi = ++k == m ? n : lo + per;
        st = host_reduce_slice(c, bufs, root, members, streams[d], lo, hi);
        lo = hi;
    }
    const pst_status met = host_all_meet(hc->done, c->count, streams, members);
    return st != PST_OK ? st : met;
}

static pst_status host_broadcast(pst_comm *c, void *const bufs[], size_t bytes, int root,
                                 pst_stream *const streams[], uint64_t members)
{
    host_ctx *hc = c->ctx;
    PST_TRY(host_enter(hc, c->count, root, streams, members));
    for (int d = 0; d < c->count; d++)
        if (d != root && ((members >> d) & 1u))
            PST_TRY(pst_memcpy_async(streams[root], bufs[d], bufs[root], bytes,
                                     PST_COPY_DEVICE_TO_DEVICE));
    return host_leave(hc, c->count, root, streams, members);
}

const pst_comm_iface pst_comm_host_iface = {PST_COMM_IFACE(host)};
