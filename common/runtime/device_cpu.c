/* device_cpu.c — the CPU backend of the device runtime (device.h, device_impl.h).
 *
 * Always built. A CPU "device" is a name and a pair of memory counters; the work happens
 * in streams. Not for: argument checking (device.c did it) or numerical kernels (the
 * layers submit those as host functions).
 *
 * DESIGN. Each stream is one worker thread with a FIFO queue of items: a host function,
 * a memcpy, a memset, an event mark, or a wait on a mark. Submitting appends under the
 * stream's lock and signals the worker; the worker pops one item, runs it without the
 * lock, then counts it as completed and wakes synchronize callers once the count reaches
 * the lowest one they wait for (not at every item: a caller waiting for a whole step's
 * queue would otherwise wake, and take a core, hundreds of times). Nothing spins: every
 * wait is on a condition variable. Streams share nothing, so they run concurrently.
 * An event points at its current *mark*, a small refcounted object: recording makes a
 * fresh mark, queues it on the stream and then makes it current; a wait captures the
 * current mark at submit time (a counted reference), so re-recording later cannot move a
 * wait that is already queued, and destroying the event cannot free a mark a queued wait
 * still needs. A mark is "done" once its stream's worker reaches it; it carries that
 * stream's sticky status (and detail) so failures propagate along event dependencies.
 * A flag wait is an item whose worker blocks on the flag's condition variable: only that
 * stream waits.
 * All marks of a runtime are guarded by one mutex, each with its own condition variable.
 * Items and marks are recycled through free lists, so a steady training step allocates
 * nothing after the first one. A stream's first error is sticky: later host functions,
 * copies and memsets are skipped, while marks are still reached (so no waiter hangs).
 * Its detail is stored in the stream and re-set on the thread that synchronizes. */
#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <time.h>

#include "common/log.h"
#include "common/memory.h"
#include "common/runtime/device.h"
#include "common/runtime/device_impl.h"
#include "common/error.h"
#include "common/rng.h"

/* Written at the start of each device allocation's header; cleared when it is freed. */
#define PST_CPU_ALLOC_MAGIC UINT64_C(0x7073742d64657631) /* "pst-dev1" */

/* Sits in the PST_DEVICE_ALIGN bytes before each device allocation. */
typedef struct pst_cpu_alloc_header {
    uint64_t magic;
    size_t bytes;    /* requested size, as counted in live_bytes */
    pst_device *dev; /* the device whose counters hold it */
} pst_cpu_alloc_header;

_Static_assert(sizeof(pst_cpu_alloc_header) <= PST_DEVICE_ALIGN,
               "the allocation header must fit in one alignment unit");

/* A point in one stream's FIFO, shared by the event that recorded it and the waits that
 * captured it. Every field is guarded by pst_cpu_runtime.mark_mu. */
typedef struct pst_cpu_mark {
    int refs;       /* the event (while current) + the queued record item + waiters */
    int done;       /* the recording stream's worker reached it */
    pst_sticky sticky; /* the recording stream's sticky status at that point */
    pthread_cond_t cv; /* signalled when done is set */
    struct pst_cpu_mark *next_free;
} pst_cpu_mark;

typedef enum pst_cpu_item_kind {
    PST_CPU_ITEM_HOST = 0,
    PST_CPU_ITEM_COPY,
    PST_CPU_ITEM_SET,
    PST_CPU_ITEM_RECORD, /* reach `mark` */
    PST_CPU_ITEM_WAIT,   /* block until `mark` is reached */
    PST_CPU_ITEM_FLAG    /* block until `flag` reaches `flag_value` */
} pst_cpu_item_kind;

typedef struct pst_cpu_item {
    pst_cpu_item_kind kind;
    pst_host_fn fn;
    void *arg;
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    pst_cpu_mark *mark; /* RECORD, WAIT: a counted reference, dropped after the item */
    pst_flag *flag;     /* FLAG */
    uint64_t flag_value;
    struct pst_cpu_item *next;
} pst_cpu_item;

typedef struct pst_cpu_runtime {
    pthread_mutex_t mark_mu;     /* guards every mark and every event's current mark */
    pst_cpu_mark *free_marks;    /* recycled marks (refs 0) */
    pthread_mutex_t jitter_mu;   /* guards jitter_seed, jitter_max_us */
    uint64_t jitter_seed;
    unsigned jitter_max_us;
    atomic_uint_fast64_t jitter_epoch; /* bumped by each set_jitter; workers reseed on change */
} pst_cpu_runtime;

typedef struct pst_cpu_stream {
    pst_stream *pub;
    pst_cpu_runtime *crt;
    pthread_t thread;
    pthread_mutex_t mu;          /* guards everything below down to `sticky` */
    pthread_cond_t work_cv;      /* worker: an item was queued or stopping was set */
    pthread_cond_t done_cv;      /* synchronize: `completed` reached wake_at */
    pst_cpu_item *head, *tail;   /* the FIFO */
    pst_cpu_item *free_items;    /* recycled items */
    uint64_t submitted;          /* items queued so far */
    uint64_t completed;          /* items run or skipped so far */
    uint64_t wake_at;            /* the lowest `completed` a synchronize waits for; none: max */
    int sync_waiters;            /* threads in synchronize (pst_stream_sync_waiters) */
    int stopping;                /* stream_free: exit once the queue is empty */
    pst_sticky sticky;           /* written only by the worker */
    _Atomic uint64_t busy_ns;    /* time in HOST/COPY/SET items (pst_stream_busy_seconds) */
    /* Worker-only state. */
    pst_rng rng;
    uint64_t jitter_epoch;
    unsigned jitter_max_us;
} pst_cpu_stream;

typedef struct pst_cpu_event {
    pst_cpu_mark *current; /* NULL until recorded; guarded by mark_mu */
} pst_cpu_event;

/* The stream whose worker runs on this thread (NULL on other threads), to refuse a
 * synchronize that would wait for itself. */
static _Thread_local pst_cpu_stream *pst_cpu_current;

/* ---- runtime ----------------------------------------------------------------------- */

#define PST_CPU_RUNTIME_MARKS 4096

static pst_status pst_cpu_runtime_init(pst_runtime *rt)
{
    pst_cpu_runtime *crt = calloc(1, sizeof *crt);
    if (!crt)
        return pst_error_set(PST_ERR_NOMEM, "cpu runtime: out of memory");
    if (pthread_mutex_init(&crt->mark_mu, NULL) != 0)
        goto error_mark;
    if (pthread_mutex_init(&crt->jitter_mu, NULL) != 0)
        goto error_jitter;
    atomic_init(&crt->jitter_epoch, 0);
    /* Marks are recycled; a stock for the events of a few steps in flight is made now, so a
     * training step allocates nothing (a larger need grows the list once). */
    for (int i = 0; i < PST_CPU_RUNTIME_MARKS; i++) {
        pst_cpu_mark *m = malloc(sizeof *m);
        if (!m || pthread_cond_init(&m->cv, NULL) != 0) {
            free(m);
            break; /* record reports it if it is ever short */
        }
        m->next_free = crt->free_marks;
        crt->free_marks = m;
    }
    rt->ctx = crt;
    return PST_OK;

error_jitter:
    pthread_mutex_destroy(&crt->mark_mu);
error_mark:
    free(crt);
    return pst_error_set(PST_ERR_INTERNAL, "cpu runtime: pthread_mutex_init failed");
}

static void pst_cpu_runtime_free(pst_runtime *rt)
{
    pst_cpu_runtime *crt = rt->ctx;
    if (!crt)
        return;
    while (crt->free_marks) {
        pst_cpu_mark *m = crt->free_marks;
        crt->free_marks = m->next_free;
        pthread_cond_destroy(&m->cv);
        free(m);
    }
    pthread_mutex_destroy(&crt->jitter_mu);
    pthread_mutex_destroy(&crt->mark_mu);
    free(crt);
    rt->ctx = NULL;
}

static void pst_cpu_set_jitter(pst_runtime *rt, uint64_t seed, unsigned max_us)
{
    pst_cpu_runtime *crt = rt->ctx;
    pthread_mutex_lock(&crt->jitter_mu);
    crt->jitter_seed = seed;
    crt->jitter_max_us = max_us;
    atomic_fetch_add_explicit(&crt->jitter_epoch, 1, memory_order_release);
    pthread_mutex_unlock(&crt->jitter_mu);
}

/* ---- memory ------------------------------------------------------------------------ */

static pst_status pst_cpu_device_alloc(pst_device *dev, size_t bytes, void **ptr)
{
    if (bytes > SIZE_MAX - 2 * PST_DEVICE_ALIGN)
        return pst_error_set(PST_ERR_NOMEM, "%s: cannot allocate %zu bytes", dev->name,
                             bytes);
    /* One alignment unit of header, then the data rounded up to whole units (C11
     * aligned_alloc wants a multiple of the alignment). */
    size_t data = (bytes + PST_DEVICE_ALIGN - 1) / PST_DEVICE_ALIGN * PST_DEVICE_ALIGN;
    unsigned char *base = aligned_alloc(PST_DEVICE_ALIGN, PST_DEVICE_ALIGN + data);
    if (!base)
        return pst_error_set(PST_ERR_NOMEM, "%s: cannot allocate %zu bytes (%zu live)",
                             dev->name, bytes, pst_device_live_bytes(dev));
    pst_memory_huge(base, PST_DEVICE_ALIGN + data);
    memset(base, 0, PST_DEVICE_ALIGN + data);
    pst_cpu_alloc_header *h = (pst_cpu_alloc_header *)base;
    h->magic = PST_CPU_ALLOC_MAGIC;
    h->bytes = bytes;
    h->dev = dev;
    pst_device_count_alloc(dev, bytes);
    *ptr = base + PST_DEVICE_ALIGN;
    return PST_OK;
}

static void pst_cpu_device_free(pst_device *dev, void *ptr)
{
    (void)dev;
    unsigned char *base = (unsigned char *)ptr - PST_DEVICE_ALIGN;
    pst_cpu_alloc_header *h = (pst_cpu_alloc_header *)base;
    if (h->magic != PST_CPU_ALLOC_MAGIC)
        return;
    h->magic = 0;
    /* Uncount from the device that counted it, even if the caller named another. */
    pst_device_count_free(h->dev, h->bytes);
    free(base);
}

/* ---- marks ------------------------------------------------------------------------- */

/* A fresh, not-done mark with `refs` references, or NULL when out of memory. */
static pst_cpu_mark *pst_cpu_mark_get(pst_cpu_runtime *crt, int refs)
{
    pthread_mutex_lock(&crt->mark_mu);
    pst_cpu_mark *m = crt->free_marks;
    if (m) {
        crt->free_marks = m->next_free;
    } else {
        m = malloc(sizeof *m);
        if (m && pthread_cond_init(&m->cv, NULL) != 0) {
            free(m);
            m = NULL;
        }
    }
    if (m) {
        m->refs = refs;
        m->done = 0;
        pst_sticky_reset(&m->sticky);
        m->next_free = NULL;
    }
    pthread_mutex_unlock(&crt->mark_mu);
    return m;
}

/* Drops one reference; mark_mu held. */
static void pst_cpu_mark_unref_locked(pst_cpu_runtime *crt, pst_cpu_mark *m)
{
    if (--m->refs == 0) {
        m->next_free = crt->free_marks;
        crt->free_marks = m;
    }
}

static void pst_cpu_mark_unref(pst_cpu_runtime *crt, pst_cpu_mark *m)
{
    pthread_mutex_lock(&crt->mark_mu);
    pst_cpu_mark_unref_locked(crt, m);
    pthread_mutex_unlock(&crt->mark_mu);
}

/* Marks m reached with the recording stream's sticky status. */
static void pst_cpu_mark_reach(pst_cpu_runtime *crt, pst_cpu_mark *m, const pst_sticky *from)
{
    pthread_mutex_lock(&crt->mark_mu);
    m->done = 1;
    pst_sticky_fail(&m->sticky, from->status, from->detail);
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&crt->mark_mu);
}

/* Blocks until m is reached; returns its status and copies its detail when failed. The
 * caller holds a reference. */
static pst_status pst_cpu_mark_wait(pst_cpu_runtime *crt, pst_cpu_mark *m,
                                    char detail[PST_ERROR_DETAIL_MAX])
{
    pthread_mutex_lock(&crt->mark_mu);
    while (!m->done)
        pthread_cond_wait(&m->cv, &crt->mark_mu);
    pst_status st = pst_sticky_read(&m->sticky, detail);
    pthread_mutex_unlock(&crt->mark_mu);
    return st;
}

/* ---- the worker -------------------------------------------------------------------- */

static void pst_cpu_jitter(pst_cpu_stream *cs)
{
    pst_cpu_runtime *crt = cs->crt;
    uint64_t epoch = atomic_load_explicit(&crt->jitter_epoch, memory_order_acquire);
    if (epoch != cs->jitter_epoch) {
        pthread_mutex_lock(&crt->jitter_mu);
        cs->jitter_epoch = atomic_load_explicit(&crt->jitter_epoch, memory_order_relaxed);
        cs->jitter_max_us = crt->jitter_max_us;
        pst_rng_seed(&cs->rng, crt->jitter_seed, (uint64_t)cs->pub->id);
        pthread_mutex_unlock(&crt->jitter_mu);
    }
    if (cs->jitter_max_us == 0)
        return;
    uint64_t us = pst_rng_below(&cs->rng, (uint64_t)cs->jitter_max_us + 1);
    struct timespec ts = {.tv_sec = (time_t)(us / 1000000),
                          .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Runs one item. `sticky` is the stream's status before it. Returns the item's status;
 * on failure `detail` holds the message to keep. Drops the item's mark reference. */
static pst_status pst_cpu_run_item(pst_cpu_stream *cs, pst_cpu_item *it, pst_status sticky,
                                   char detail[PST_ERROR_DETAIL_MAX])
{
    pst_status st = PST_OK;

    if (it->kind == PST_CPU_ITEM_RECORD) {
        /* Marks are reached even on a failed stream, so waiters never hang; only the
         * worker writes cs->sticky, so reading it here is safe. */
        if (sticky == PST_OK)
            pst_cpu_jitter(cs);
        pst_cpu_mark_reach(cs->crt, it->mark, &cs->sticky);
        pst_cpu_mark_unref(cs->crt, it->mark);
        return PST_OK;
    }
    if (sticky != PST_OK) {
        if (it->kind == PST_CPU_ITEM_WAIT)
            pst_cpu_mark_unref(cs->crt, it->mark);
        return PST_OK; /* skipped */
    }
    pst_cpu_jitter(cs);
    struct timespec t0, t1;
    const int timed = it->kind == PST_CPU_ITEM_HOST || it->kind == PST_CPU_ITEM_COPY ||
                      it->kind == PST_CPU_ITEM_SET;
    if (timed)
        clock_gettime(CLOCK_MONOTONIC, &t0);
    switch (it->kind) {
    case PST_CPU_ITEM_HOST:
        pst_error_clear();
        st = it->fn(it->arg);
        if (st != PST_OK) {
            const char *d = pst_error_detail();
            snprintf(detail, PST_ERROR_DETAIL_MAX, "%s stream %d: %s", cs->pub->dev->name,
                     cs->pub->id, d[0] ? d : pst_strerror(st));
        }
        break;
    case PST_CPU_ITEM_COPY:
        if (it->bytes > 0)
            memcpy(it->dst, it->src, it->bytes);
        break;
    case PST_CPU_ITEM_SET:
        if (it->bytes > 0)
            memset(it->dst, it->value, it->bytes);
        break;
    case PST_CPU_ITEM_WAIT: {
        char waited[PST_ERROR_DETAIL_MAX];
        st = pst_cpu_mark_wait(cs->crt, it->mark, waited);
        if (st != PST_OK) { /* the cause goes on as it was; where it was seen, to the debug log */
            PST_DEBUG("%s stream %d waited on a failed event: %s", cs->pub->dev->name,
                      cs->pub->id, waited);
            memcpy(detail, waited, PST_ERROR_DETAIL_MAX);
        }
        pst_cpu_mark_unref(cs->crt, it->mark);
        break;
    }
    case PST_CPU_ITEM_FLAG: {
        /* Only this stream's worker waits: the other streams run on. */
        char waited[PST_ERROR_DETAIL_MAX];
        st = pst_flag_wait_host(it->flag, it->flag_value, waited);
        if (st != PST_OK) {
            PST_DEBUG("%s stream %d waited on a failed flag: %s", cs->pub->dev->name,
                      cs->pub->id, waited);
            memcpy(detail, waited, PST_ERROR_DETAIL_MAX);
        }
        break;
    }
    case PST_CPU_ITEM_RECORD:
        break; /* handled above */
    }
    if (timed) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        atomic_fetch_add_explicit(&cs->busy_ns,
                                  (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL +
                                             (t1.tv_nsec - t0.tv_nsec)),
                                  memory_order_relaxed);
    }
    return st;
}

static void *pst_cpu_worker(void *arg)
{
    pst_cpu_stream *cs = arg;
    char detail[PST_ERROR_DETAIL_MAX];

    pst_cpu_current = cs;
    pthread_mutex_lock(&cs->mu);
    for (;;) {
        while (!cs->head && !cs->stopping)
            pthread_cond_wait(&cs->work_cv, &cs->mu);
        pst_cpu_item *it = cs->head;
        if (!it)
            break; /* stopping, and the queue is drained */
        cs->head = it->next;
        if (!cs->head)
            cs->tail = NULL;
        pst_status sticky = cs->sticky.status;
        pthread_mutex_unlock(&cs->mu);

        pst_status st = pst_cpu_run_item(cs, it, sticky, detail);

        pthread_mutex_lock(&cs->mu);
        pst_sticky_fail(&cs->sticky, st, detail);
        cs->completed++;
        it->next = cs->free_items;
        cs->free_items = it;
        if (cs->completed >= cs->wake_at) { /* every waiter wakes and sets it again */
            cs->wake_at = UINT64_MAX;
            pthread_cond_broadcast(&cs->done_cv);
        }
    }
    pthread_mutex_unlock(&cs->mu);
    return NULL;
}

/* ---- streams ----------------------------------------------------------------------- */

#define PST_CPU_STREAM_ITEMS 1024

static pst_status pst_cpu_stream_init(pst_stream *s)
{
    pst_cpu_stream *cs = calloc(1, sizeof *cs);
    int err;
    if (!cs)
        return pst_error_set(PST_ERR_NOMEM, "%s: out of memory for a stream", s->dev->name);
    cs->pub = s;
    cs->crt = s->dev->rt->ctx;
    cs->wake_at = UINT64_MAX;
    pst_sticky_reset(&cs->sticky);
    if (pthread_mutex_init(&cs->mu, NULL) != 0)
        goto error_mu;
    if (pthread_cond_init(&cs->work_cv, NULL) != 0)
        goto error_work;
    if (pthread_cond_init(&cs->done_cv, NULL) != 0)
        goto error_done;
    /* Work items are recycled; enough for a deep queue are made now, so a training step
     * (a few hundred items per stream at most, two steps in flight) allocates nothing. A
     * deeper queue grows the list once. */
    for (int i = 0; i < PST_CPU_STREAM_ITEMS; i++) {
        pst_cpu_item *it = malloc(sizeof *it);
        if (!it)
            break; /* submit reports it if it is ever short */
        it->next = cs->free_items;
        cs->free_items = it;
    }
    err = pthread_create(&cs->thread, NULL, pst_cpu_worker, cs);
    if (err != 0) {
        pthread_cond_destroy(&cs->done_cv);
        pthread_cond_destroy(&cs->work_cv);
        pthread_mutex_destroy(&cs->mu);
        PST_FREE_LIST(cs->free_items, next);
        free(cs);
        return pst_error_set(PST_ERR_IO, "%s: cannot start a stream thread: %s", s->dev->name,
                             strerror(err));
    }
    s->ctx = cs;
    return PST_OK;

error_done:
    pthread_cond_destroy(&cs->work_cv);
error_work:
    pthread_mutex_destroy(&cs->mu);
error_mu:
    free(cs);
    return pst_error_set(PST_ERR_INTERNAL, "%s: cannot initialize a stream's lock",
                         s->dev->name);
}

static void pst_cpu_stream_free(pst_stream *s)
{
    pst_cpu_stream *cs = s->ctx;
    if (!cs)
        return;
    pthread_mutex_lock(&cs->mu);
    cs->stopping = 1;
    pthread_cond_signal(&cs->work_cv);
    pthread_mutex_unlock(&cs->mu);
    pthread_join(cs->thread, NULL); /* the worker drains the queue before it exits */
    PST_FREE_LIST(cs->free_items, next);
    pthread_cond_destroy(&cs->done_cv);
    pthread_cond_destroy(&cs->work_cv);
    pthread_mutex_destroy(&cs->mu);
    free(cs);
    s->ctx = NULL;
}

/* Appends a copy of *item to the FIFO and wakes the worker. */
static pst_status pst_cpu_submit(pst_cpu_stream *cs, const pst_cpu_item *item)
{
    pthread_mutex_lock(&cs->mu);
    pst_cpu_item *it = cs->free_items;
    if (it) {
        cs->free_items = it->next;
    } else {
        it = malloc(sizeof *it);
        if (!it) {
            pthread_mutex_unlock(&cs->mu);
            return pst_error_set(PST_ERR_NOMEM, "%s stream %d: out of memory for a work item",
                                 cs->pub->dev->name, cs->pub->id);
        }
    }
    *it = *item;
    it->next = NULL;
    if (cs->tail)
        cs->tail->next = it;
    else
        cs->head = it;
    cs->tail = it;
    cs->submitted++;
    pthread_cond_signal(&cs->work_cv);
    pthread_mutex_unlock(&cs->mu);
    return PST_OK;
}

static pst_status pst_cpu_stream_launch(pst_stream *s, pst_host_fn fn, void *arg)
{
    pst_cpu_item it = {.kind = PST_CPU_ITEM_HOST, .fn = fn, .arg = arg};
    return pst_cpu_submit(s->ctx, &it);
}

static pst_status pst_cpu_memcpy_async(pst_stream *s, void *dst, const void *src,
                                       size_t bytes, pst_copy_kind kind)
{
    (void)kind; /* host and device memory are the same memory on this backend */
    pst_cpu_item it = {.kind = PST_CPU_ITEM_COPY, .dst = dst, .src = src, .bytes = bytes};
    return pst_cpu_submit(s->ctx, &it);
}

static pst_status pst_cpu_memset_async(pst_stream *s, void *dst, int value, size_t bytes)
{
    pst_cpu_item it = {.kind = PST_CPU_ITEM_SET, .dst = dst, .value = value, .bytes = bytes};
    return pst_cpu_submit(s->ctx, &it);
}

static pst_status pst_cpu_stream_synchronize(pst_stream *s)
{
    pst_cpu_stream *cs = s->ctx;
    char detail[PST_ERROR_DETAIL_MAX];

    if (pst_cpu_current == cs)
        return pst_error_set(PST_ERR_STATE,
                             "%s stream %d: pst_stream_synchronize called from a work item "
                             "of the same stream would wait for itself",
                             s->dev->name, s->id);
    pthread_mutex_lock(&cs->mu);
    uint64_t target = cs->submitted;
    cs->sync_waiters++;
    while (cs->completed < target) {
        if (target < cs->wake_at)
            cs->wake_at = target;
        pthread_cond_wait(&cs->done_cv, &cs->mu);
    }
    cs->sync_waiters--;
    pst_status st = pst_sticky_read(&cs->sticky, detail);
    pthread_mutex_unlock(&cs->mu);
    return pst_sticky_raise(st, detail);
}

/* ---- events ------------------------------------------------------------------------ */

static pst_status pst_cpu_event_init(pst_event *ev)
{
    pst_cpu_event *ce = calloc(1, sizeof *ce);
    if (!ce)
        return pst_error_set(PST_ERR_NOMEM, "%s: out of memory for an event", ev->dev->name);
    ev->ctx = ce;
    return PST_OK;
}

static void pst_cpu_event_free(pst_event *ev)
{
    pst_cpu_event *ce = ev->ctx;
    pst_cpu_runtime *crt = ev->dev->rt->ctx;
    if (!ce)
        return;
    pthread_mutex_lock(&crt->mark_mu);
    if (ce->current)
        pst_cpu_mark_unref_locked(crt, ce->current);
    ce->current = NULL;
    pthread_mutex_unlock(&crt->mark_mu);
    free(ce);
    ev->ctx = NULL;
}

static pst_status pst_cpu_event_record(pst_event *ev, pst_stream *s)
{
    pst_cpu_event *ce = ev->ctx;
    pst_cpu_runtime *crt = s->dev->rt->ctx;
    /* One reference for the event, one for the queued record item. */
    pst_cpu_mark *m = pst_cpu_mark_get(crt, 2);
    if (!m)
        return pst_error_set(PST_ERR_NOMEM, "%s: out of memory for an event mark",
                             s->dev->name);
    pst_cpu_item it = {.kind = PST_CPU_ITEM_RECORD, .mark = m};
    pst_status st = pst_cpu_submit(s->ctx, &it);
    if (st != PST_OK) {
        pthread_mutex_lock(&crt->mark_mu);
        pst_cpu_mark_unref_locked(crt, m);
        pst_cpu_mark_unref_locked(crt, m);
        pthread_mutex_unlock(&crt->mark_mu);
        return st;
    }
    /* Published only once queued: a wait that captures m always finds it in a FIFO. */
    pthread_mutex_lock(&crt->mark_mu);
    pst_cpu_mark *old = ce->current;
    ce->current = m;
    if (old)
        pst_cpu_mark_unref_locked(crt, old);
    pthread_mutex_unlock(&crt->mark_mu);
    return PST_OK;
}

static pst_status pst_cpu_stream_wait_event(pst_stream *s, pst_event *ev)
{
    pst_cpu_event *ce = ev->ctx;
    pst_cpu_runtime *crt = s->dev->rt->ctx;

    pthread_mutex_lock(&crt->mark_mu);
    pst_cpu_mark *m = ce->current;
    if (m)
        m->refs++;
    pthread_mutex_unlock(&crt->mark_mu);
    if (!m)
        return PST_OK; /* never recorded: nothing to wait for */
    pst_cpu_item it = {.kind = PST_CPU_ITEM_WAIT, .mark = m};
    pst_status st = pst_cpu_submit(s->ctx, &it);
    if (st != PST_OK)
        pst_cpu_mark_unref(crt, m);
    return st;
}

static pst_status pst_cpu_stream_wait_flag(pst_stream *s, pst_flag *f, uint64_t value)
{
    pst_cpu_item it = {.kind = PST_CPU_ITEM_FLAG, .flag = f, .flag_value = value};
    return pst_cpu_submit(s->ctx, &it);
}

static pst_status pst_cpu_event_synchronize(pst_event *ev)
{
    pst_cpu_event *ce = ev->ctx;
    pst_cpu_runtime *crt = ev->dev->rt->ctx;
    char detail[PST_ERROR_DETAIL_MAX];

    pthread_mutex_lock(&crt->mark_mu);
    pst_cpu_mark *m = ce->current;
    if (!m) {
        pthread_mutex_unlock(&crt->mark_mu);
        return PST_OK;
    }
    m->refs++; /* keeps m alive should the event be re-recorded meanwhile */
    pthread_mutex_unlock(&crt->mark_mu);
    pst_status st = pst_cpu_mark_wait(crt, m, detail);
    pst_cpu_mark_unref(crt, m);
    return pst_sticky_raise(st, detail);
}

static int pst_cpu_event_query(pst_event *ev)
{
    pst_cpu_event *ce = ev->ctx;
    pst_cpu_runtime *crt = ev->dev->rt->ctx;
    pthread_mutex_lock(&crt->mark_mu);
    int reached = !ce->current || ce->current->done;
    pthread_mutex_unlock(&crt->mark_mu);
    return reached;
}

static double pst_cpu_stream_busy_seconds(pst_stream *s)
{
    const pst_cpu_stream *cs = s->ctx;
    return (double)atomic_load_explicit(&cs->busy_ns, memory_order_relaxed) * 1e-9;
}

static int pst_cpu_stream_sync_waiters(pst_stream *s)
{
    pst_cpu_stream *cs = s->ctx;
    pthread_mutex_lock(&cs->mu);
    const int n = cs->sync_waiters;
    pthread_mutex_unlock(&cs->mu);
    return n;
}

const pst_backend_iface pst_cpu_backend_iface = {
    PST_BACKEND_BASE("cpu", PST_BACKEND_CPU, pst_cpu),
    /* host_alloc, host_free NULL: plain aligned memory from device.c */
    .set_jitter = pst_cpu_set_jitter,
    .stream_busy_seconds = pst_cpu_stream_busy_seconds,
    .stream_sync_waiters = pst_cpu_stream_sync_waiters,
};
