/* device_cuda.c — the CUDA backend of the device runtime (device.h, device_impl.h).
 *
 * Built with PSTRAIN_HAVE_CUDA only; plain C over the CUDA runtime API (the kernels live in
 * ops_cuda.cu). Not for: argument checking (device.c did it) or the model's kernels.
 * COMPILED AND LINKED ON MACHINES WITHOUT A GPU; only the no-GPU path runs there
 * (tests/test_cuda_nogpu.c). Everything else is exercised by `make test-gpu`.
 *
 * DESIGN. A device is a GPU ordinal with one cuBLAS handle (shared by its streams under a
 * lock) and a table of its allocations (cudaMalloc does not tell a pointer's size, and the
 * live/peak counters need it). A stream is a non-blocking cudaStream_t, an event a
 * cudaEvent_t without timing: CUDA already gives device.h's ordering rules (FIFO per
 * stream, waits that keep the mark they captured, never-recorded events that do not wait).
 * Host functions go through cudaLaunchHostFunc with a small item from a free list.
 *
 * Sticky status. device.h wants a failed host function to make its stream's status sticky
 * and that status to follow event dependencies. Each stream keeps a status + detail that
 * only its host functions set. Work submitted after the status is set is dropped at submit
 * time; GPU work queued before the failure was known still runs (the GPU cannot skip it),
 * and its results are as garbage as the failed step's. An event records the recording
 * stream's status at its mark in a refcounted *mark*, filled by a snapshot host function
 * queued just before cudaEventRecord; a wait queues, after cudaStreamWaitEvent, an "adopt"
 * host function that copies a failed mark's status. Both are needed only when the
 * recording stream has ever queued a host function (otherwise its status at the mark is
 * necessarily PST_OK), so a pure GPU pipeline pays no host round trip for them.
 * CUDA errors themselves (a bad launch, a faulted kernel) are returned by the call that
 * sees them, through PST_CUDA_CHECK, with the library's message.
 *
 * Locks: rt mu guards the mark and item free lists and refcounts and is never held across
 * a CUDA call (host functions take it, and a CUDA call may wait for host functions); an
 * event's mu makes "record + publish the mark" and "wait + capture the mark" atomic; a
 * stream's mu guards its status and detail; a device's blas_mu its cuBLAS handle and
 * alloc_mu its allocation table. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/memory.h"
#include "common/runtime/cuda/cuda_check.h"
#include "common/runtime/cuda/cuda_impl.h"
#include "common/runtime/device.h"
#include "common/runtime/device_impl.h"
#include "common/error.h"

/* One live allocation of a device. */
typedef struct pst_cuda_alloc {
    void *ptr;
    size_t bytes;
} pst_cuda_alloc;

typedef struct pst_cuda_device {
    int ordinal;               /* CUDA device number */
    cublasHandle_t blas;       /* NULL until created */
    pthread_mutex_t blas_mu;   /* held from cublasSetStream to the op's last cuBLAS call */
    pthread_mutex_t alloc_mu;  /* guards allocs */
    pst_cuda_alloc *allocs;    /* (nallocs) live allocations, unordered */
    size_t nallocs, cap;
} pst_cuda_device;

/* A recording stream's status at an event's mark; guarded by pst_cuda_runtime.mu. */
typedef struct pst_cuda_mark {
    int refs;                  /* the event while current + the snapshot item + adopters */
    int done;                  /* the snapshot ran */
    pst_sticky sticky;
    struct pst_cuda_mark *next_free;
} pst_cuda_mark;

typedef enum pst_cuda_item_kind {
    PST_CUDA_ITEM_USER = 0, /* the caller's pst_host_fn */
    PST_CUDA_ITEM_SNAPSHOT, /* copy the stream's status into `mark` */
    PST_CUDA_ITEM_ADOPT     /* take `mark`'s status when it failed */
} pst_cuda_item_kind;

struct pst_cuda_stream;

/* The argument of one cudaLaunchHostFunc; recycled through the runtime's free list. */
typedef struct pst_cuda_item {
    pst_cuda_item_kind kind;
    struct pst_cuda_stream *cs;
    pst_host_fn fn;
    void *arg;
    pst_cuda_mark *mark; /* SNAPSHOT, ADOPT: a counted reference, dropped by the item */
    struct pst_cuda_item *next_free;
} pst_cuda_item;

typedef struct pst_cuda_runtime {
    pthread_mutex_t mu;          /* free lists and mark refcounts; no CUDA call under it */
    pst_cuda_mark *free_marks;
    pst_cuda_item *free_items;
} pst_cuda_runtime;

typedef struct pst_cuda_stream {
    pst_stream *pub;
    pst_cuda_runtime *crt;
    cudaStream_t stream;
    atomic_int failed;           /* sticky.status != PST_OK, readable without the lock */
    atomic_int host_items;       /* user + adopt host functions ever queued */
    pthread_mutex_t mu;          /* guards sticky */
    pst_sticky sticky;           /* set by host functions only */
} pst_cuda_stream;

typedef struct pst_cuda_event {
    cudaEvent_t event;
    pthread_mutex_t mu;          /* record/wait vs mark */
    pst_cuda_mark *mark;         /* status at the current mark; NULL: PST_OK or never recorded */
} pst_cuda_event;

/* Set while a host function runs on CUDA's callback thread: CUDA calls are forbidden there,
 * so the hooks refuse them with PST_ERR_STATE instead of deadlocking. */
static _Thread_local int pst_cuda_in_host_fn;

/* ---- helpers ----------------------------------------------------------------------- */

/* Makes `ordinal` current on this thread; refuses inside a host function. */
static pst_status cuda_use(int ordinal)
{
    if (pst_cuda_in_host_fn)
        return pst_error_set(PST_ERR_STATE,
                             "cuda:%d: a device call from a host function "
                             "(pst_stream_launch) is not allowed by CUDA; queue it from "
                             "the submitting thread instead",
                             ordinal);
    PST_CUDA_CHECK(cudaSetDevice(ordinal));
    return PST_OK;
}

static pst_cuda_device *dev_ctx(const pst_device *dev)
{
    return dev->ctx;
}

int pst_cuda_device_ordinal(const pst_device *dev)
{
    const pst_cuda_device *dc = dev->ctx;
    if (dc)
        return dc->ordinal;
    /* Before runtime_init filled the context: the name is "cuda:<ordinal>". */
    return (int)strtol(dev->name + sizeof "cuda:" - 1, NULL, 10);
}

/* Records the first failure of cs; later ones keep the first detail. */
static void stream_fail(pst_cuda_stream *cs, pst_status st, const char *detail)
{
    pthread_mutex_lock(&cs->mu);
    pst_sticky_fail(&cs->sticky, st, detail);
    atomic_store(&cs->failed, cs->sticky.status != PST_OK);
    pthread_mutex_unlock(&cs->mu);
}

/* ---- device count and the no-GPU error --------------------------------------------- */

static pst_status cuda_count(int *n)
{
    PST_CUDA_CHECK(cudaGetDeviceCount(n));
    return PST_OK;
}

pst_status pst_cuda_device_count(int *count)
{
    int n = 0;
    *count = 0;
    if (cuda_count(&n) != PST_OK) {
        char why[PST_ERROR_DETAIL_MAX];
        snprintf(why, sizeof why, "%s", pst_error_detail());
        return pst_error_set(PST_ERR_UNSUPPORTED,
                             "no CUDA GPU available: %s; use PSTRAIN_DEVICES=cpu:N", why);
    }
    if (n <= 0)
        return pst_error_set(PST_ERR_UNSUPPORTED,
                             "no CUDA GPU available: cudaGetDeviceCount found 0 devices; "
                             "use PSTRAIN_DEVICES=cpu:N");
    *count = n;
    return PST_OK;
}

/* ---- runtime ----------------------------------------------------------------------- */

static pst_status blas_destroy(cublasHandle_t h)
{
    PST_CUDA_CHECK(cublasDestroy(h));
    return PST_OK;
}

static pst_status cuda_free_checked(void *p)
{
    PST_CUDA_CHECK(cudaFree(p));
    return PST_OK;
}

static void cuda_runtime_free(pst_runtime *rt)
{
    pst_cuda_runtime *crt = rt->ctx;
    for (int i = 0; i < rt->count; i++) {
        pst_cuda_device *dc = rt->devices[i].ctx;
        if (!dc)
            continue;
        if (cuda_use(dc->ordinal) == PST_OK) {
            if (dc->blas)
                (void)blas_destroy(dc->blas);
            /* Memory the caller did not free dies with the runtime. */
            for (size_t k = 0; k < dc->nallocs; k++) {
                (void)cuda_free_checked(dc->allocs[k].ptr);
                pst_device_count_free(&rt->devices[i], dc->allocs[k].bytes);
            }
        }
        free(dc->allocs);
        pthread_mutex_destroy(&dc->alloc_mu);
        pthread_mutex_destroy(&dc->blas_mu);
        free(dc);
        rt->devices[i].ctx = NULL;
    }
    if (crt) {
        PST_FREE_LIST(crt->free_marks, next_free);
        PST_FREE_LIST(crt->free_items, next_free);
        pthread_mutex_destroy(&crt->mu);
        free(crt);
        rt->ctx = NULL;
    }
}

/* cudaDeviceEnablePeerAccess where possible, so ops may read another GPU's memory
 * (pst_add_args.src) and copies between GPUs go direct. "Already enabled" is fine. */
static cudaError_t enable_peer(int peer)
{
    cudaError_t r = cudaDeviceEnablePeerAccess(peer, 0);
    if (r == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError(); /* resets the (non-sticky) last error it left */
        r = cudaSuccess;
    }
    return r;
}

static pst_status device_setup(pst_device *dev, int ngpus)
{
    pst_cuda_device *dc = calloc(1, sizeof *dc);
    if (!dc)
        return pst_error_set(PST_ERR_NOMEM, "%s: out of memory", dev->name);
    dc->ordinal = pst_cuda_device_ordinal(dev);
    if (pthread_mutex_init(&dc->blas_mu, NULL) != 0) {
        free(dc);
        return pst_error_set(PST_ERR_INTERNAL, "%s: pthread_mutex_init failed", dev->name);
    }
    if (pthread_mutex_init(&dc->alloc_mu, NULL) != 0) {
        pthread_mutex_destroy(&dc->blas_mu);
        free(dc);
        return pst_error_set(PST_ERR_INTERNAL, "%s: pthread_mutex_init failed", dev->name);
    }
    dev->ctx = dc; /* from here on, cuda_runtime_free releases it */
    if (dc->ordinal < 0 || dc->ordinal >= ngpus)
        return pst_error_set(PST_ERR_INVALID,
                             "%s: no such GPU: this machine has %d CUDA GPU%s (cuda:0..cuda:%d); "
                             "use PSTRAIN_DEVICES=cuda for all of them",
                             dev->name, ngpus, ngpus == 1 ? "" : "s", ngpus - 1);
    PST_TRY(cuda_use(dc->ordinal));
    PST_CUDA_CHECK(cublasCreate(&dc->blas));
    return PST_OK;
}

static pst_status peers_setup(pst_runtime *rt)
{
    for (int i = 0; i < rt->count; i++) {
        int oi = pst_cuda_device_ordinal(&rt->devices[i]);
        PST_TRY(cuda_use(oi));
        for (int j = 0; j < rt->count; j++) {
            int oj = pst_cuda_device_ordinal(&rt->devices[j]), can = 0;
            if (oi == oj)
                continue;
            PST_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, oi, oj));
            if (can)
                PST_CUDA_CHECK(enable_peer(oj));
        }
    }
    return PST_OK;
}

static pst_status cuda_runtime_setup(pst_runtime *rt)
{
    int ngpus = 0;
    PST_TRY(pst_cuda_device_count(&ngpus));
    pst_cuda_runtime *crt = calloc(1, sizeof *crt);
    if (!crt)
        return pst_error_set(PST_ERR_NOMEM, "cuda runtime: out of memory");
    if (pthread_mutex_init(&crt->mu, NULL) != 0) {
        free(crt);
        return pst_error_set(PST_ERR_INTERNAL, "cuda runtime: pthread_mutex_init failed");
    }
    rt->ctx = crt;
    for (int i = 0; i < rt->count; i++)
        PST_TRY(device_setup(&rt->devices[i], ngpus));
    return peers_setup(rt);
}

static pst_status cuda_runtime_init(pst_runtime *rt)
{
    pst_status st = cuda_runtime_setup(rt);
    if (st != PST_OK) {
        char keep[PST_ERROR_DETAIL_MAX];
        snprintf(keep, sizeof keep, "%s", pst_error_detail());
        cuda_runtime_free(rt); /* may overwrite the detail */
        return pst_error_set(st, "%s", keep);
    }
    return PST_OK;
}

pst_status pst_cuda_nccl_comms_create(pst_runtime *rt, uint64_t members, ncclComm_t *comms)
{
    if (pst_cuda_in_host_fn)
        return pst_error_set(PST_ERR_STATE, "NCCL setup from a host function "
                             "(pst_stream_launch) is not allowed by CUDA");
    int ordinals[PST_DEVICE_MAX_COUNT], k = 0;
    for (int i = 0; i < rt->count; i++)
        if ((members >> i) & 1u)
            ordinals[k++] = pst_cuda_device_ordinal(&rt->devices[i]);
    if (k == 0)
        return pst_error_set(PST_ERR_INVALID, "NCCL communicators of no device (members %#llx "
                             "of %d)", (unsigned long long)members, rt->count);
    PST_CUDA_CHECK(ncclCommInitAll(comms, k, ordinals));
    return PST_OK;
}

/* ---- memory ------------------------------------------------------------------------ */

/* cudaMalloc + zero fill, finished before returning: our streams are non-blocking and
 * would not wait for a memset on the legacy default stream. */
static pst_status alloc_zeroed(void **p, size_t bytes)
{
    PST_CUDA_CHECK(cudaMalloc(p, bytes));
    PST_CUDA_CHECK(cudaMemsetAsync(*p, 0, bytes, 0));
    PST_CUDA_CHECK(cudaStreamSynchronize(0));
    return PST_OK;
}

static pst_status cuda_device_alloc(pst_device *dev, size_t bytes, void **ptr)
{
    pst_cuda_device *dc = dev_ctx(dev);
    void *p = NULL;
    PST_TRY(cuda_use(dc->ordinal));
    pthread_mutex_lock(&dc->alloc_mu);
    if (dc->nallocs == dc->cap) {
        size_t cap = dc->cap ? 2 * dc->cap : 16;
        pst_cuda_alloc *a = realloc(dc->allocs, cap * sizeof *a);
        if (!a) {
            pthread_mutex_unlock(&dc->alloc_mu);
            return pst_error_set(PST_ERR_NOMEM, "%s: out of host memory for the allocation "
                                 "table", dev->name);
        }
        dc->allocs = a;
        dc->cap = cap;
    }
    pst_status st = alloc_zeroed(&p, bytes);
    if (st != PST_OK) {
        pthread_mutex_unlock(&dc->alloc_mu);
        if (p) {
            char keep[PST_ERROR_DETAIL_MAX];
            snprintf(keep, sizeof keep, "%s", pst_error_detail());
            (void)cuda_free_checked(p);
            pst_error_set(st, "%s", keep);
        }
        return pst_error_wrap(st, "%s: allocating %zu bytes (%zu live)", dev->name, bytes,
                              pst_device_live_bytes(dev));
    }
    dc->allocs[dc->nallocs++] = (pst_cuda_alloc){.ptr = p, .bytes = bytes};
    pthread_mutex_unlock(&dc->alloc_mu);
    pst_device_count_alloc(dev, bytes);
    *ptr = p;
    return PST_OK;
}

static void cuda_device_free(pst_device *dev, void *ptr)
{
    pst_cuda_device *dc = dev_ctx(dev);
    size_t bytes = 0;
    int found = 0;
    pthread_mutex_lock(&dc->alloc_mu);
    for (size_t k = 0; k < dc->nallocs; k++) {
        if (dc->allocs[k].ptr == ptr) {
            bytes = dc->allocs[k].bytes;
            dc->allocs[k] = dc->allocs[--dc->nallocs];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&dc->alloc_mu);
    if (!found)
        return; /* not ours (device_impl.h: left alone) */
    if (cuda_use(dc->ordinal) == PST_OK)
        (void)cuda_free_checked(ptr); /* a void hook: nothing to report to */
    pst_device_count_free(dev, bytes);
}

static pst_status host_alloc_pinned(void **ptr, size_t bytes)
{
    /* Portable: pinned for every GPU of the process, not just the current one. */
    PST_CUDA_CHECK(cudaHostAlloc(ptr, bytes, cudaHostAllocPortable));
    return PST_OK;
}

static pst_status cuda_host_alloc(pst_device *dev, size_t bytes, void **ptr)
{
    PST_TRY(cuda_use(dev_ctx(dev)->ordinal));
    pst_status st = host_alloc_pinned(ptr, bytes);
    if (st != PST_OK) {
        *ptr = NULL;
        return pst_error_wrap(st, "%s: pinned host buffer of %zu bytes", dev->name, bytes);
    }
    memset(*ptr, 0, bytes);
    return PST_OK;
}

static pst_status host_free_pinned(void *ptr)
{
    PST_CUDA_CHECK(cudaFreeHost(ptr));
    return PST_OK;
}

static void cuda_host_free(pst_device *dev, void *ptr)
{
    (void)dev;
    (void)host_free_pinned(ptr);
}

/* ---- marks and host-function items --------------------------------------------------- */

static pst_cuda_mark *mark_get(pst_cuda_runtime *crt, int refs)
{
    pthread_mutex_lock(&crt->mu);
    pst_cuda_mark *m = crt->free_marks;
    if (m)
        crt->free_marks = m->next_free;
    pthread_mutex_unlock(&crt->mu);
    if (!m)
        m = malloc(sizeof *m);
    if (m) {
        m->refs = refs;
        m->done = 0;
        pst_sticky_reset(&m->sticky);
        m->next_free = NULL;
    }
    return m;
}

static void mark_unref(pst_cuda_runtime *crt, pst_cuda_mark *m)
{
    pthread_mutex_lock(&crt->mu);
    if (--m->refs == 0) {
        m->next_free = crt->free_marks;
        crt->free_marks = m;
    }
    pthread_mutex_unlock(&crt->mu);
}

/* ce's current mark with a reference taken for the caller (mark_unref), or NULL; ce->mu
 * held. */
static pst_cuda_mark *mark_ref_current(pst_cuda_runtime *crt, pst_cuda_event *ce)
{
    pst_cuda_mark *m = ce->mark;
    if (m) {
        pthread_mutex_lock(&crt->mu);
        m->refs++;
        pthread_mutex_unlock(&crt->mu);
    }
    return m;
}

static pst_cuda_item *item_get(pst_cuda_runtime *crt)
{
    pthread_mutex_lock(&crt->mu);
    pst_cuda_item *it = crt->free_items;
    if (it)
        crt->free_items = it->next_free;
    pthread_mutex_unlock(&crt->mu);
    return it ? it : malloc(sizeof *it);
}

static void item_put(pst_cuda_runtime *crt, pst_cuda_item *it)
{
    pthread_mutex_lock(&crt->mu);
    it->next_free = crt->free_items;
    crt->free_items = it;
    pthread_mutex_unlock(&crt->mu);
}

/* Runs on CUDA's callback thread, in stream order. No CUDA call may happen here. */
static void CUDART_CB host_entry(void *p)
{
    pst_cuda_item *it = p;
    pst_cuda_stream *cs = it->cs;
    pst_cuda_runtime *crt = cs->crt;
    char detail[PST_ERROR_DETAIL_MAX];

    pst_cuda_in_host_fn = 1;
    switch (it->kind) {
    case PST_CUDA_ITEM_USER:
        if (!atomic_load(&cs->failed)) {
            pst_error_clear();
            pst_status st = it->fn(it->arg);
            if (st != PST_OK) {
                const char *d = pst_error_detail();
                snprintf(detail, sizeof detail, "%s stream %d: %s", cs->pub->dev->name,
                         cs->pub->id, d[0] ? d : pst_strerror(st));
                stream_fail(cs, st, detail);
            }
        }
        break;
    case PST_CUDA_ITEM_SNAPSHOT: {
        pthread_mutex_lock(&cs->mu);
        pst_status st = pst_sticky_read(&cs->sticky, detail);
        pthread_mutex_unlock(&cs->mu);
        pthread_mutex_lock(&crt->mu);
        pst_sticky_fail(&it->mark->sticky, st, detail);
        it->mark->done = 1;
        pthread_mutex_unlock(&crt->mu);
        mark_unref(crt, it->mark);
        break;
    }
    case PST_CUDA_ITEM_ADOPT: {
        /* The snapshot ran before the event completed, and this item runs after it. */
        pthread_mutex_lock(&crt->mu);
        pst_status mst = it->mark->done ? pst_sticky_read(&it->mark->sticky, detail) : PST_OK;
        if (mst != PST_OK) /* the cause goes on as it was; where it was seen, to debug */
            PST_DEBUG("%s stream %d waited on a failed event: %s", cs->pub->dev->name,
                      cs->pub->id, detail);
        pthread_mutex_unlock(&crt->mu);
        if (mst != PST_OK)
            stream_fail(cs, mst, detail);
        mark_unref(crt, it->mark);
        break;
    }
    }
    pst_cuda_in_host_fn = 0;
    item_put(crt, it);
}

static pst_status launch_host(cudaStream_t s, pst_cuda_item *it)
{
    PST_CUDA_CHECK(cudaLaunchHostFunc(s, host_entry, it));
    return PST_OK;
}

/* Queues an item on cs; on failure the item is recycled (its mark is the caller's). */
static pst_status queue_item(pst_cuda_stream *cs, pst_cuda_item_kind kind, pst_host_fn fn,
                             void *arg, pst_cuda_mark *mark)
{
    pst_cuda_item *it = item_get(cs->crt);
    if (!it)
        return pst_error_set(PST_ERR_NOMEM, "%s stream %d: out of memory for a work item",
                             cs->pub->dev->name, cs->pub->id);
    *it = (pst_cuda_item){.kind = kind, .cs = cs, .fn = fn, .arg = arg, .mark = mark};
    if (kind != PST_CUDA_ITEM_SNAPSHOT)
        atomic_fetch_add(&cs->host_items, 1);
    pst_status st = launch_host(cs->stream, it);
    if (st != PST_OK)
        item_put(cs->crt, it);
    return st;
}

/* ---- streams ----------------------------------------------------------------------- */

static pst_status stream_create(void *s)
{
    PST_CUDA_CHECK(cudaStreamCreateWithFlags((cudaStream_t *)s, cudaStreamNonBlocking));
    return PST_OK;
}

/* A stream's or event's backend object obj (calloc'd, its other fields set) gets its lock
 * and the handle create makes on dev's GPU, and becomes *ctx; on failure obj is freed.
 * object_close undoes it. */
static pst_status object_open(void *obj, void **ctx, pthread_mutex_t *mu, const pst_device *dev,
                              pst_status (*create)(void *), void *handle)
{
    pst_status st = PST_OK;
    if (pthread_mutex_init(mu, NULL) != 0)
        st = pst_error_set(PST_ERR_INTERNAL, "%s: pthread_mutex_init failed", dev->name);
    else {
        st = cuda_use(dev_ctx(dev)->ordinal);
        if (st == PST_OK)
            st = create(handle);
        if (st != PST_OK)
            pthread_mutex_destroy(mu);
    }
    if (st != PST_OK)
        free(obj);
    else
        *ctx = obj;
    return st;
}

static pst_status cuda_stream_init(pst_stream *s)
{
    pst_cuda_stream *cs = calloc(1, sizeof *cs);
    if (!cs)
        return pst_error_set(PST_ERR_NOMEM, "%s: out of memory for a stream", s->dev->name);
    cs->pub = s;
    cs->crt = s->dev->rt->ctx;
    pst_sticky_reset(&cs->sticky);
    atomic_init(&cs->failed, 0);
    atomic_init(&cs->host_items, 0);
    return object_open(cs, &s->ctx, &cs->mu, s->dev, stream_create, &cs->stream);
}

static pst_status stream_drain_destroy(void *s)
{
    PST_CUDA_CHECK(cudaStreamSynchronize(*(cudaStream_t *)s));
    PST_CUDA_CHECK(cudaStreamDestroy(*(cudaStream_t *)s));
    return PST_OK;
}

/* object_open undone: destroy(handle) on dev's GPU (skipped when it cannot be made
 * current), the lock, then obj, and *ctx = NULL. */
static void object_close(void *obj, void **ctx, pthread_mutex_t *mu, const pst_device *dev,
                         pst_status (*destroy)(void *), void *handle)
{
    if (cuda_use(dev_ctx(dev)->ordinal) == PST_OK)
        (void)destroy(handle);
    pthread_mutex_destroy(mu);
    free(obj);
    *ctx = NULL;
}

static void cuda_stream_free(pst_stream *s)
{
    pst_cuda_stream *cs = s->ctx;
    if (!cs)
        return;
    /* queued host items run before this returns */
    object_close(cs, &s->ctx, &cs->mu, s->dev, stream_drain_destroy, &cs->stream);
}

pst_status pst_cuda_stream_begin(pst_stream *s, cudaStream_t *stream, int *skip)
{
    pst_cuda_stream *cs = s->ctx;
    PST_TRY(cuda_use(dev_ctx(s->dev)->ordinal));
    *stream = cs->stream;
    *skip = atomic_load(&cs->failed);
    return PST_OK;
}

static pst_status blas_bind(cublasHandle_t h, cudaStream_t s)
{
    PST_CUDA_CHECK(cublasSetStream(h, s));
    return PST_OK;
}

pst_status pst_cuda_blas_acquire(pst_stream *s, cublasHandle_t *handle)
{
    pst_cuda_device *dc = dev_ctx(s->dev);
    pst_cuda_stream *cs = s->ctx;
    pthread_mutex_lock(&dc->blas_mu);
    pst_status st = blas_bind(dc->blas, cs->stream);
    if (st != PST_OK) {
        pthread_mutex_unlock(&dc->blas_mu);
        return st;
    }
    *handle = dc->blas;
    return PST_OK;
}

void pst_cuda_blas_release(pst_stream *s)
{
    pthread_mutex_unlock(&dev_ctx(s->dev)->blas_mu);
}

static pst_status cuda_stream_launch(pst_stream *s, pst_host_fn fn, void *arg)
{
    pst_cuda_stream *cs = s->ctx;
    PST_TRY(cuda_use(dev_ctx(s->dev)->ordinal));
    if (atomic_load(&cs->failed))
        return PST_OK; /* skipped, as on the CPU backend */
    return queue_item(cs, PST_CUDA_ITEM_USER, fn, arg, NULL);
}

static enum cudaMemcpyKind copy_kind(pst_copy_kind k)
{
    switch (k) {
    case PST_COPY_HOST_TO_DEVICE: return cudaMemcpyHostToDevice;
    case PST_COPY_DEVICE_TO_HOST: return cudaMemcpyDeviceToHost;
    case PST_COPY_DEVICE_TO_DEVICE: return cudaMemcpyDeviceToDevice;
    case PST_COPY_HOST_TO_HOST: return cudaMemcpyHostToHost;
    }
    return cudaMemcpyDefault;
}

static pst_status cuda_memcpy_async(pst_stream *s, void *dst, const void *src, size_t bytes,
                                    pst_copy_kind kind)
{
    pst_cuda_stream *cs = s->ctx;
    PST_TRY(cuda_use(dev_ctx(s->dev)->ordinal));
    if (bytes == 0 || atomic_load(&cs->failed))
        return PST_OK; /* a no-op keeps its place trivially; a failed stream skips */
    PST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, copy_kind(kind), cs->stream));
    return PST_OK;
}

static pst_status cuda_memset_async(pst_stream *s, void *dst, int value, size_t bytes)
{
    pst_cuda_stream *cs = s->ctx;
    PST_TRY(cuda_use(dev_ctx(s->dev)->ordinal));
    if (bytes == 0 || atomic_load(&cs->failed))
        return PST_OK;
    PST_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, cs->stream));
    return PST_OK;
}

static pst_status cuda_stream_synchronize(pst_stream *s)
{
    pst_cuda_stream *cs = s->ctx;
    char detail[PST_ERROR_DETAIL_MAX];
    PST_TRY(cuda_use(dev_ctx(s->dev)->ordinal));
    PST_TRY(PST_CUDA_STATUS(cudaStreamSynchronize(cs->stream)));
    pthread_mutex_lock(&cs->mu);
    pst_status st = pst_sticky_read(&cs->sticky, detail);
    pthread_mutex_unlock(&cs->mu);
    return pst_sticky_raise(st, detail);
}

/* ---- events ------------------------------------------------------------------------ */

static pst_status event_create(void *e)
{
    PST_CUDA_CHECK(cudaEventCreateWithFlags((cudaEvent_t *)e, cudaEventDisableTiming));
    return PST_OK;
}

static pst_status cuda_event_init(pst_event *ev)
{
    pst_cuda_event *ce = calloc(1, sizeof *ce);
    if (!ce)
        return pst_error_set(PST_ERR_NOMEM, "%s: out of memory for an event", ev->dev->name);
    return object_open(ce, &ev->ctx, &ce->mu, ev->dev, event_create, &ce->event);
}

static pst_status event_destroy(void *e)
{
    PST_CUDA_CHECK(cudaEventDestroy(*(cudaEvent_t *)e));
    return PST_OK;
}

static void cuda_event_free(pst_event *ev)
{
    pst_cuda_event *ce = ev->ctx;
    if (!ce)
        return;
    if (ce->mark)
        mark_unref(ev->dev->rt->ctx, ce->mark);
    /* CUDA keeps the event alive for waits already queued. */
    object_close(ce, &ev->ctx, &ce->mu, ev->dev, event_destroy, &ce->event);
}

static pst_status cuda_event_record(pst_event *ev, pst_stream *s)
{
    pst_cuda_event *ce = ev->ctx;
    pst_cuda_stream *cs = s->ctx;
    pst_cuda_runtime *crt = cs->crt;
    pst_cuda_mark *m = NULL;
    pst_status st;

    PST_TRY(cuda_use(dev_ctx(s->dev)->ordinal));
    pthread_mutex_lock(&ce->mu);
    if (atomic_load(&cs->host_items) > 0) {
        /* One reference for the event, one for the snapshot item. */
        m = mark_get(crt, 2);
        if (!m) {
            pthread_mutex_unlock(&ce->mu);
            return pst_error_set(PST_ERR_NOMEM, "%s: out of memory for an event mark",
                                 s->dev->name);
        }
        st = queue_item(cs, PST_CUDA_ITEM_SNAPSHOT, NULL, NULL, m);
        if (st != PST_OK) {
            pthread_mutex_unlock(&ce->mu);
            mark_unref(crt, m);
            mark_unref(crt, m);
            return st;
        }
    }
    st = PST_CUDA_STATUS(cudaEventRecord(ce->event, cs->stream));
    if (st != PST_OK) {
        pthread_mutex_unlock(&ce->mu);
        if (m)
            mark_unref(crt, m); /* the snapshot item drops its own */
        return st;
    }
    pst_cuda_mark *old = ce->mark;
    ce->mark = m;
    pthread_mutex_unlock(&ce->mu);
    if (old)
        mark_unref(crt, old);
    return PST_OK;
}

static pst_status cuda_stream_wait_event(pst_stream *s, pst_event *ev)
{
    pst_cuda_event *ce = ev->ctx;
    pst_cuda_stream *cs = s->ctx;
    pst_cuda_runtime *crt = cs->crt;

    PST_TRY(cuda_use(dev_ctx(s->dev)->ordinal));
    pthread_mutex_lock(&ce->mu);
    pst_cuda_mark *m = mark_ref_current(crt, ce);
    pst_status st = PST_CUDA_STATUS(cudaStreamWaitEvent(cs->stream, ce->event, 0));
    pthread_mutex_unlock(&ce->mu);
    if (st == PST_OK && m)
        st = queue_item(cs, PST_CUDA_ITEM_ADOPT, NULL, NULL, m);
    if (st != PST_OK && m)
        mark_unref(crt, m);
    return st;
}

static pst_status cuda_event_synchronize(pst_event *ev)
{
    pst_cuda_event *ce = ev->ctx;
    pst_cuda_runtime *crt = ev->dev->rt->ctx;
    char detail[PST_ERROR_DETAIL_MAX];

    PST_TRY(cuda_use(dev_ctx(ev->dev)->ordinal));
    pthread_mutex_lock(&ce->mu);
    pst_cuda_mark *m = mark_ref_current(crt, ce);
    pthread_mutex_unlock(&ce->mu);
    pst_status st = PST_CUDA_STATUS(cudaEventSynchronize(ce->event));
    if (st == PST_OK && m) {
        pthread_mutex_lock(&crt->mu);
        /* done: the snapshot precedes the event in its stream (a concurrent re-record on
         * another stream may leave an older mark not yet reached: counted as PST_OK). */
        if (m->done)
            st = pst_sticky_read(&m->sticky, detail);
        pthread_mutex_unlock(&crt->mu);
        st = pst_sticky_raise(st, detail);
    }
    if (m)
        mark_unref(crt, m);
    return st;
}

static pst_status event_ready(cudaEvent_t e, int *ready)
{
    cudaError_t r = cudaEventQuery(e);
    *ready = r != cudaErrorNotReady;
    /* Not ready is an answer, not an error. */
    cudaError_t err = r == cudaErrorNotReady ? cudaSuccess : r;
    return PST_CUDA_RESULT(err, "cudaEventQuery(event)");
}

static int cuda_event_query(pst_event *ev)
{
    pst_cuda_event *ce = ev->ctx;
    int ready = 1;
    if (cuda_use(dev_ctx(ev->dev)->ordinal) != PST_OK)
        return 1;
    /* A failed query counts as reached: the error surfaces at the next synchronize. */
    if (event_ready(ce->event, &ready) != PST_OK)
        return 1;
    return ready;
}

/* ---- flags ------------------------------------------------------------------------- */

/* The value the GPU waits on, in pinned host memory mapped for the device. A failed flag
 * shows INT64_MAX there: the driver compares (int64_t)(*addr - value) >= 0, so every wait
 * ends, and the host function queued after it turns the failure into the stream's. */
typedef struct pst_cuda_flag {
    uint64_t *host;
    unsigned long long dev;  /* CUdeviceptr of `host` */
} pst_cuda_flag;

/* cuStreamWaitValue64, from the driver through the runtime (no link against libcuda). */
typedef int (*pst_wait_value64_fn)(cudaStream_t, unsigned long long, uint64_t, unsigned int);
static pthread_once_t wait_value_once = PTHREAD_ONCE_INIT;
static pst_wait_value64_fn wait_value64;
static atomic_int wait_value_warned;

static void find_wait_value(void)
{
#if CUDART_VERSION >= 12050
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &fn, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        wait_value64 = (pst_wait_value64_fn)fn;
#endif
}

static pst_status cuda_flag_init(pst_flag *f)
{
    pst_cuda_flag *cf = calloc(1, sizeof *cf);
    if (!cf)
        return pst_error_set(PST_ERR_NOMEM, "%s: out of memory for a flag", f->dev->name);
    pst_status st = cuda_use(dev_ctx(f->dev)->ordinal);
    void *dp = NULL;
    if (st == PST_OK) {
        cudaError_t e = cudaHostAlloc((void **)&cf->host, sizeof *cf->host,
                                      cudaHostAllocMapped | cudaHostAllocPortable);
        if (e == cudaSuccess)
            e = cudaHostGetDevicePointer(&dp, cf->host, 0);
        if (e != cudaSuccess)
            st = pst_error_set(PST_ERR_NOMEM, "%s: no mapped host memory for a flag (%s)",
                               f->dev->name, cudaGetErrorString(e));
    }
    if (st != PST_OK) {
        if (cf->host)
            cudaFreeHost(cf->host);
        free(cf);
        return st;
    }
    *cf->host = 0;
    cf->dev = (unsigned long long)(uintptr_t)dp;
    f->ctx = cf;
    return PST_OK;
}

static void cuda_flag_free(pst_flag *f)
{
    pst_cuda_flag *cf = f->ctx;
    if (!cf)
        return;
    cudaFreeHost(cf->host);
    free(cf);
    f->ctx = NULL;
}

static void cuda_flag_signal(pst_flag *f)
{
    pst_cuda_flag *cf = f->ctx;
    pthread_mutex_lock(&f->mu);
    uint64_t v = f->sticky.status != PST_OK ? (uint64_t)INT64_MAX : f->value;
    pthread_mutex_unlock(&f->mu);
    __atomic_store_n(cf->host, v, __ATOMIC_RELEASE);
}

/* After the GPU's wait: fails the stream when the flag failed. Never blocks. */
static pst_status flag_check(void *arg)
{
    pst_flag *f = arg;
    char detail[PST_ERROR_DETAIL_MAX];
    pthread_mutex_lock(&f->mu);
    pst_status st = pst_sticky_read(&f->sticky, detail);
    pthread_mutex_unlock(&f->mu);
    return pst_sticky_raise(st, detail); /* the cause, as it was */
}

/* The fallback where the driver cannot wait on memory: a host function that blocks (and
 * holds CUDA's callback thread while it does). */
typedef struct flag_block_arg {
    pst_flag *f;
    uint64_t value;
} flag_block_arg;

static pst_status flag_block(void *arg)
{
    flag_block_arg a = *(flag_block_arg *)arg;
    free(arg);
    char detail[PST_ERROR_DETAIL_MAX];
    return pst_sticky_raise(pst_flag_wait_host(a.f, a.value, detail), detail); /* as it was */
}

static pst_status cuda_stream_wait_flag(pst_stream *s, pst_flag *f, uint64_t value)
{
    pst_cuda_stream *cs = s->ctx;
    pst_cuda_flag *cf = f->ctx;
    PST_TRY(cuda_use(dev_ctx(s->dev)->ordinal));
    pthread_once(&wait_value_once, find_wait_value);
    int rc = -1;
    if (wait_value64) {
        rc = wait_value64(cs->stream, cf->dev, value, 0 /* CU_STREAM_WAIT_VALUE_GEQ */);
        if (rc == 0)
            return queue_item(cs, PST_CUDA_ITEM_USER, flag_check, f, NULL);
    }
    if (!atomic_exchange(&wait_value_warned, 1))
        fprintf(stderr, "pstrain: %s: the driver cannot make a stream wait on host memory "
                        "(cuStreamWaitValue64 %s, error %d); flag waits block CUDA's callback "
                        "thread instead\n",
                s->dev->name, wait_value64 ? "failed" : "not found", rc);
    flag_block_arg *a = malloc(sizeof *a);
    if (!a)
        return pst_error_set(PST_ERR_NOMEM, "%s: out of memory for a flag wait", s->dev->name);
    *a = (flag_block_arg){f, value};
    pst_status st = queue_item(cs, PST_CUDA_ITEM_USER, flag_block, a, NULL);
    if (st != PST_OK)
        free(a);
    return st;
}

const pst_backend_iface pst_cuda_backend_iface = {
    PST_BACKEND_BASE("cuda", PST_BACKEND_CUDA, cuda),
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .flag_init = cuda_flag_init,
    .flag_free = cuda_flag_free,
    .flag_signal = cuda_flag_signal,
    /* set_jitter NULL: the CPU backend's test hook; GPUs have their own timing */
};
