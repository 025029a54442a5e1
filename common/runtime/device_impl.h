/* device_impl.h — private interface between the device runtime (device.c) and its backends.
 *
 * Not for users of the runtime: include common/runtime/device.h. This header holds the objects
 * behind the opaque handles of device.h and the backend function table (ggml-backend
 * style). device.c validates every argument, keeps the registry of live streams and
 * events, then calls the table; a backend may therefore assume non-NULL arguments, sizes
 * already checked and objects that belong to its own runtime.
 *
 * Layout: the generic part of each object is defined here; each backend hangs its own
 * state off the `ctx` member (created by its *_init hook, released by its *_free hook). */
#ifndef PST_DEVICE_IMPL_H
#define PST_DEVICE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "common/runtime/device.h"
#include "common/error.h"

#define PST_DEVICE_ALIGN 64     /* alignment of every device and host allocation */

typedef struct pst_backend_iface pst_backend_iface;

struct pst_device {
    pst_runtime *rt;
    int index;                /* position in rt->devices */
    char name[16];            /* "cpu:0" */
    atomic_size_t live_bytes; /* device memory allocated now (requested bytes) */
    atomic_size_t peak_bytes; /* most live_bytes ever seen */
    atomic_size_t limit_bytes; /* most live_bytes allowed (pst_device_set_memory_limit); 0: any */
    void *ctx;                /* backend state, owned by the backend */
};

struct pst_stream {
    pst_device *dev;
    int id;                        /* unique within the runtime, in creation order */
    LIST_ENTRY(pst_stream) link;   /* rt->streams registry, guarded by rt->mu */
    void *ctx;                     /* backend state */
};

struct pst_event {
    pst_device *dev;
    LIST_ENTRY(pst_event) link;    /* rt->events registry, guarded by rt->mu */
    void *ctx;                     /* backend state */
};

struct pst_flag {
    pst_device *dev;
    pthread_mutex_t mu;            /* guards value, sticky */
    pthread_cond_t cv;             /* broadcast on every signal */
    uint64_t value;
    pst_sticky sticky;             /* failed: for good */
    void *ctx;                     /* backend state */
};

/* For backends: blocks until f's value is >= value or f has failed; returns PST_OK or
 * the failure, with its detail copied into `detail`. */
pst_status pst_flag_wait_host(pst_flag *f, uint64_t value, char detail[PST_ERROR_DETAIL_MAX]);

struct pst_runtime {
    const pst_backend_iface *iface;
    pst_backend_kind kind;
    int count;                     /* number of devices */
    pst_device *devices;           /* (count) */
    pthread_mutex_t mu;            /* guards streams, events, next_stream_id */
    LIST_HEAD(, pst_stream) streams; /* live streams, freed by pst_runtime_free if left */
    LIST_HEAD(, pst_event) events;   /* live events, likewise */
    int next_stream_id;
    void *ctx;                     /* backend state */
};

/* The backend function table. Every hook may be called from any thread. Unless marked
 * optional a member is required. Hooks that return pst_status record a detail with
 * pst_error_set on the calling thread when they fail. */
struct pst_backend_iface {
    const char *name;          /* "cpu": prefix of the device names */
    pst_backend_kind kind;

    /* Creates the backend state of rt (rt->ctx) and of each device (rt->devices[i].ctx);
     * rt->count, the devices' index/name/rt are already set. On failure everything the hook
     * created is released and rt->ctx and all device ctx are NULL. */
    pst_status (*runtime_init)(pst_runtime *rt);
    /* Releases what runtime_init created. Called after every stream and event of rt has
     * been released through stream_free / event_free. Accepts a half-built runtime (NULL
     * ctx members). */
    void (*runtime_free)(pst_runtime *rt);

    /* Allocates `bytes` (> 0) of device memory, PST_DEVICE_ALIGN-aligned, zero-filled, and
     * counts them with pst_device_count_alloc. Errors: PST_ERR_NOMEM, with *ptr NULL. */
    pst_status (*device_alloc)(pst_device *dev, size_t bytes, void **ptr);
    /* Frees non-NULL memory from device_alloc on dev and uncounts it
     * (pst_device_count_free). Memory that device_alloc did not return is left alone. */
    void (*device_free)(pst_device *dev, void *ptr);
    /* Optional: host memory for transfers (pinned on CUDA). NULL means plain
     * PST_DEVICE_ALIGN-aligned, zero-filled malloc memory provided by device.c; when set,
     * host_free must be set too. */
    pst_status (*host_alloc)(pst_device *dev, size_t bytes, void **ptr);
    void (*host_free)(pst_device *dev, void *ptr);

    /* Creates the backend state of s (s->ctx); s->dev and s->id are set. The stream is
     * ready to take work when the hook returns. */
    pst_status (*stream_init)(pst_stream *s);
    /* Runs every item already queued on s, then releases s->ctx. Must not be called from
     * a work item of s itself. */
    void (*stream_free)(pst_stream *s);
    /* Queue fn(arg), a copy, a memset (bytes may be 0: the item is then a no-op that
     * still keeps its place in the FIFO). On success the item is queued; it runs after
     * every item queued on s before it. Errors: PST_ERR_NOMEM (nothing queued). */
    pst_status (*stream_launch)(pst_stream *s, pst_host_fn fn, void *arg);
    pst_status (*memcpy_async)(pst_stream *s, void *dst, const void *src, size_t bytes,
                               pst_copy_kind kind);
    pst_status (*memset_async)(pst_stream *s, void *dst, int value, size_t bytes);
    /* Blocks until every item queued on s before the call has run (or been skipped);
     * returns s's sticky status and, when it is an error, sets its detail on the calling
     * thread. */
    pst_status (*stream_synchronize)(pst_stream *s);

    /* Creates the backend state of ev (ev->ctx): a never-recorded event. */
    pst_status (*event_init)(pst_event *ev);
    /* Releases ev->ctx. Waits already queued on streams keep the mark they captured, so
     * they complete normally after the event is gone. */
    void (*event_free)(pst_event *ev);
    /* Queues a mark on s (same device as ev) and makes it the event's current mark. */
    pst_status (*event_record)(pst_event *ev, pst_stream *s);
    /* Makes later work on s wait for the event's current mark as of this call; no wait
     * when the event was never recorded. When the mark is reached on a failed stream, s
     * takes that error as its own sticky status. */
    pst_status (*stream_wait_event)(pst_stream *s, pst_event *ev);
    /* Blocks until the current mark is reached; returns the recording stream's sticky
     * status at that point (detail set on the calling thread). PST_OK when never
     * recorded. */
    pst_status (*event_synchronize)(pst_event *ev);
    /* 1 when the current mark has been reached or there is none, else 0. Never blocks. */
    int (*event_query)(pst_event *ev);

    /* Optional: the backend state of a flag (f->ctx), created after the generic part and
     * released before it. NULL: none. */
    pst_status (*flag_init)(pst_flag *f);
    void (*flag_free)(pst_flag *f);
    /* Optional: called by pst_flag_signal after it raised f->value or failed f (f->mu not
     * held), to tell the device. NULL: nothing to tell. */
    void (*flag_signal)(pst_flag *f);
    /* Makes later work on s wait until f->value >= value, or take f's failure. Must not
     * block the calling thread. */
    pst_status (*stream_wait_flag)(pst_stream *s, pst_flag *f, uint64_t value);

    /* Optional (test hook, see pst_runtime_set_jitter): before each later work item, a
     * stream sleeps a pseudo-random 0..max_us microseconds drawn from its own generator
     * seeded with (seed, stream id). max_us 0 turns it off. NULL: the hook is ignored. */
    void (*set_jitter)(pst_runtime *rt, uint64_t seed, unsigned max_us);

    /* Optional: seconds the stream has spent running its work items (kernels, copies,
     * host functions; not its waits), since it was created. NULL: not measured. */
    double (*stream_busy_seconds)(pst_stream *s);
    /* Optional (test hook, see pst_stream_sync_waiters). NULL: not counted. */
    int (*stream_sync_waiters)(pst_stream *s);
};

/* The name, kind and required members of a backend's table, for a backend that names its
 * hooks <p>_<member>: pst_backend_iface t = {PST_BACKEND_BASE("cpu", PST_BACKEND_CPU,
 * pst_cpu), then the optional members it has}. */
#define PST_BACKEND_BASE(name_, kind_, p)                                                     \
    .name = name_, .kind = kind_,                                                             \
    .runtime_init = p##_runtime_init, .runtime_free = p##_runtime_free,                       \
    .device_alloc = p##_device_alloc, .device_free = p##_device_free,                         \
    .stream_init = p##_stream_init, .stream_free = p##_stream_free,                           \
    .stream_launch = p##_stream_launch, .memcpy_async = p##_memcpy_async,                     \
    .memset_async = p##_memset_async, .stream_synchronize = p##_stream_synchronize,           \
    .event_init = p##_event_init, .event_free = p##_event_free,                               \
    .event_record = p##_event_record, .stream_wait_event = p##_stream_wait_event,             \
    .event_synchronize = p##_event_synchronize, .event_query = p##_event_query,               \
    .stream_wait_flag = p##_stream_wait_flag

/* The CPU backend (device_cpu.c), always built. */
extern const pst_backend_iface pst_cpu_backend_iface;

#ifdef PSTRAIN_HAVE_CUDA
/* The CUDA backend (cuda/device_cuda.c), built with PSTRAIN_HAVE_CUDA. Declared here, not
 * in cuda/cuda_impl.h, so that device.c needs nothing from cuda/: the arrows point from
 * the backend to this table, never back. */
extern const pst_backend_iface pst_cuda_backend_iface;
/* Number of CUDA GPUs this process can use. Errors: PST_ERR_UNSUPPORTED when
 * cudaGetDeviceCount fails or finds none, with the detail
 * "no CUDA GPU available: <why>; use PSTRAIN_DEVICES=cpu:N". */
pst_status pst_cuda_device_count(int *count);
#endif

/* Counter helpers for backends: add/remove `bytes` of device memory on dev (atomic; peak
 * follows live). */
void pst_device_count_alloc(pst_device *dev, size_t bytes);
void pst_device_count_free(pst_device *dev, size_t bytes);

#endif /* PST_DEVICE_IMPL_H */
