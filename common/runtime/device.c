/* device.c — the device runtime's public functions (device.h): spec parsing, argument
 * checks, the registry of live streams and events, and dispatch to the backend table
 * (device_impl.h).
 *
 * Not for: scheduling or memory details, which belong to the backends (device_cpu.c).
 * Every check that does not depend on the backend is made here, once, so each backend may
 * trust its arguments. */
#include "common/runtime/device.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/memory.h"
#include "common/runtime/device_impl.h"

/* How much of a bad spec string is quoted back in an error detail. */
#define PST_SPEC_QUOTE_MAX 64

/* ---- spec parsing ---------------------------------------------------------------- */

/* Parses a decimal number of 1..4 digits at *s (no sign, no spaces); advances *s. Returns
 * -1 when there is no digit or the number is too long. */
static int parse_small_uint(const char **s)
{
    const char *p = *s;
    int v = 0, n = 0;
    while (*p >= '0' && *p <= '9') {
        if (++n > 4)
            return -1;
        v = v * 10 + (*p - '0');
        p++;
    }
    if (n == 0)
        return -1;
    *s = p;
    return v;
}

static pst_status spec_invalid(const char *spec, const char *why)
{
    return pst_error_set(PST_ERR_INVALID,
                         "PSTRAIN_DEVICES=\"%.*s\": %s; expected cpu, cpu:N with 1 <= N <= %d, "
                         "or cuda[:i,j,...], e.g. cpu:2",
                         PST_SPEC_QUOTE_MAX, spec, why, PST_DEVICE_MAX_COUNT);
}

int pst_devices_spec_cuda(const char *spec)
{
    return strcmp(spec, "cuda") == 0 || strncmp(spec, "cuda:", 5) == 0;
}

/* Reads `spec` into a backend and a device count; for CUDA also the GPU ordinals of the
 * devices in order (ordinals[count]). CUDA specs are checked for form first, so a typo is
 * PST_ERR_INVALID whether or not this build has CUDA; then a build without the CUDA
 * backend refuses them, and "cuda" (every GPU) asks the CUDA runtime how many there are
 * (PST_ERR_UNSUPPORTED with the no-GPU detail when none). */
static pst_status parse_spec(const char *spec, pst_backend_kind *kind, int *count,
                             int ordinals[PST_DEVICE_MAX_COUNT])
{
    if (strcmp(spec, "cpu") == 0) {
        *kind = PST_BACKEND_CPU;
        *count = 1;
        return PST_OK;
    }
    if (strncmp(spec, "cpu:", 4) == 0) {
        const char *p = spec + 4;
        int n = parse_small_uint(&p);
        if (n < 0 || *p != '\0')
            return spec_invalid(spec, "the device count is not a number");
        if (n < 1 || n > PST_DEVICE_MAX_COUNT)
            return spec_invalid(spec, "the device count is out of range");
        *kind = PST_BACKEND_CPU;
        *count = n;
        return PST_OK;
    }
    if (pst_devices_spec_cuda(spec)) {
        int n = 0;
        if (spec[4] == ':') {
            /* A comma list of distinct GPU ordinals. */
            uint64_t seen = 0;
            const char *p = spec + 5;
            for (;;) {
                int id = parse_small_uint(&p);
                if (id < 0 || id >= PST_DEVICE_MAX_COUNT)
                    return spec_invalid(spec, "a GPU ordinal is missing or out of range");
                if (seen & (UINT64_C(1) << id))
                    return spec_invalid(spec, "a GPU ordinal is listed twice");
                seen |= UINT64_C(1) << id;
                ordinals[n++] = id; /* at most 64: the ordinals are distinct and < 64 */
                if (*p == '\0')
                    break;
                if (*p != ',')
                    return spec_invalid(spec, "GPU ordinals must be separated by commas");
                p++;
            }
        }
#ifdef PSTRAIN_HAVE_CUDA
        if (n == 0) {
            /* "cuda": every GPU of the machine, in ordinal order. */
            pst_status st = pst_cuda_device_count(&n);
            if (st != PST_OK)
                return pst_error_wrap(st, "PSTRAIN_DEVICES=%.*s", PST_SPEC_QUOTE_MAX, spec);
            if (n > PST_DEVICE_MAX_COUNT)
                n = PST_DEVICE_MAX_COUNT;
            for (int i = 0; i < n; i++)
                ordinals[i] = i;
        }
        *kind = PST_BACKEND_CUDA;
        *count = n;
        return PST_OK;
#else
        return pst_error_set(PST_ERR_UNSUPPORTED,
                             "PSTRAIN_DEVICES=%.*s: this build has no CUDA backend "
                             "(configured with PSTRAIN_CUDA=OFF or without the CUDA toolkit); "
                             "use PSTRAIN_DEVICES=cpu:N",
                             PST_SPEC_QUOTE_MAX, spec);
#endif
    }
    return spec_invalid(spec, "unknown device kind");
}

/* ---- runtime ----------------------------------------------------------------------- */

pst_status pst_runtime_init(pst_runtime **out, const char *spec)
{
    pst_backend_kind kind = PST_BACKEND_CPU;
    int count = 0;
    int ordinals[PST_DEVICE_MAX_COUNT];
    pst_runtime *rt;
    pst_status st;

    if (!out)
        return pst_error_set(PST_ERR_INVALID, "pst_runtime_init: out is NULL");
    *out = NULL;
    if (!spec)
        return pst_error_set(PST_ERR_INVALID,
                             "pst_runtime_init: device spec is NULL; give one such as cpu:2");
    PST_TRY(parse_spec(spec, &kind, &count, ordinals));

    rt = calloc(1, sizeof *rt);
    if (!rt)
        return pst_error_set(PST_ERR_NOMEM, "pst_runtime_init: out of memory");
    LIST_INIT(&rt->streams);
    LIST_INIT(&rt->events);
    rt->iface = &pst_cpu_backend_iface;
#ifdef PSTRAIN_HAVE_CUDA
    if (kind == PST_BACKEND_CUDA)
        rt->iface = &pst_cuda_backend_iface;
#endif
    rt->kind = kind;
    rt->devices = calloc((size_t)count, sizeof *rt->devices);
    if (!rt->devices) {
        free(rt);
        return pst_error_set(PST_ERR_NOMEM, "pst_runtime_init: out of memory for %d devices",
                             count);
    }
    rt->count = count;
    for (int i = 0; i < count; i++) {
        pst_device *dev = &rt->devices[i];
        dev->rt = rt;
        dev->index = i;
        /* CPU devices are numbered; a CUDA device is named by its GPU ordinal, which the
         * CUDA backend reads back (pst_cuda_device_ordinal). */
        snprintf(dev->name, sizeof dev->name, "%s:%d", rt->iface->name,
                 kind == PST_BACKEND_CUDA ? ordinals[i] : i);
        atomic_init(&dev->live_bytes, 0);
        atomic_init(&dev->peak_bytes, 0);
        atomic_init(&dev->limit_bytes, 0);
    }
    if (pthread_mutex_init(&rt->mu, NULL) != 0) {
        free(rt->devices);
        free(rt);
        return pst_error_set(PST_ERR_INTERNAL, "pst_runtime_init: pthread_mutex_init failed");
    }
    st = rt->iface->runtime_init(rt);
    if (st != PST_OK) {
        /* "PSTRAIN_DEVICES=cuda:0: no CUDA GPU available: ...; use PSTRAIN_DEVICES=cpu:N" */
        if (kind == PST_BACKEND_CUDA)
            pst_error_wrap(st, "PSTRAIN_DEVICES=%.*s", PST_SPEC_QUOTE_MAX, spec);
        pthread_mutex_destroy(&rt->mu);
        free(rt->devices);
        free(rt);
        return st;
    }
    *out = rt;
    return PST_OK;
}

static void stream_release(pst_stream *s)
{
    s->dev->rt->iface->stream_free(s);
    free(s);
}

static void event_release(pst_event *ev)
{
    ev->dev->rt->iface->event_free(ev);
    free(ev);
}

void pst_runtime_free(pst_runtime *rt)
{
    if (!rt)
        return;
    /* Streams left by the caller are drained and freed one at a time, without holding
     * rt->mu, so their work items may still create or destroy other objects. */
    for (;;) {
        pthread_mutex_lock(&rt->mu);
        pst_stream *s = LIST_FIRST(&rt->streams);
        if (s)
            LIST_REMOVE(s, link);
        pthread_mutex_unlock(&rt->mu);
        if (!s)
            break;
        stream_release(s);
    }
    for (;;) {
        pthread_mutex_lock(&rt->mu);
        pst_event *ev = LIST_FIRST(&rt->events);
        if (ev)
            LIST_REMOVE(ev, link);
        pthread_mutex_unlock(&rt->mu);
        if (!ev)
            break;
        event_release(ev);
    }
    rt->iface->runtime_free(rt);
    pthread_mutex_destroy(&rt->mu);
    free(rt->devices);
    free(rt);
}

int pst_runtime_count(const pst_runtime *rt)
{
    return rt ? rt->count : 0;
}

pst_backend_kind pst_runtime_backend(const pst_runtime *rt)
{
    return rt ? rt->kind : PST_BACKEND_CPU;
}

pst_device *pst_runtime_device(pst_runtime *rt, int i)
{
    if (!rt || i < 0 || i >= rt->count)
        return NULL;
    return &rt->devices[i];
}

void pst_runtime_set_jitter(pst_runtime *rt, uint64_t seed, unsigned max_us)
{
    if (!rt || !rt->iface->set_jitter)
        return;
    rt->iface->set_jitter(rt, seed, max_us);
}

/* ---- devices and memory ------------------------------------------------------------ */

const char *pst_device_name(const pst_device *dev)
{
    return dev ? dev->name : "(no device)";
}

int pst_device_index(const pst_device *dev)
{
    return dev ? dev->index : -1;
}

void pst_device_count_alloc(pst_device *dev, size_t bytes)
{
    size_t live = atomic_fetch_add(&dev->live_bytes, bytes) + bytes;
    size_t peak = atomic_load(&dev->peak_bytes);
    while (live > peak && !atomic_compare_exchange_weak(&dev->peak_bytes, &peak, live)) {
    }
}

void pst_device_count_free(pst_device *dev, size_t bytes)
{
    atomic_fetch_sub(&dev->live_bytes, bytes);
}

pst_status pst_device_alloc(pst_device *dev, size_t bytes, void **ptr)
{
    if (!ptr)
        return pst_error_set(PST_ERR_INVALID, "pst_device_alloc: ptr is NULL");
    *ptr = NULL;
    if (!dev)
        return pst_error_set(PST_ERR_INVALID, "pst_device_alloc: device is NULL");
    if (bytes == 0)
        return pst_error_set(PST_ERR_INVALID,
                             "pst_device_alloc: allocation of 0 bytes on %s", dev->name);
    const size_t limit = atomic_load(&dev->limit_bytes), live = pst_device_live_bytes(dev);
    if (limit && (bytes > limit || live > limit - bytes))
        return pst_error_set(PST_ERR_NOMEM,
                             "%s: %zu bytes more would make %zu on the device, over its memory "
                             "limit of %zu (--device-memory-limit, PSTRAIN_DEVICE_MEMORY_LIMIT); "
                             "give it more, or cut the model over more devices with --pipeline",
                             dev->name, bytes, live + bytes, limit);
    return dev->rt->iface->device_alloc(dev, bytes, ptr);
}

void pst_device_set_memory_limit(pst_device *dev, size_t bytes)
{
    if (dev)
        atomic_store(&dev->limit_bytes, bytes);
}

void pst_device_free(pst_device *dev, void *ptr)
{
    if (!dev || !ptr)
        return;
    dev->rt->iface->device_free(dev, ptr);
}

pst_status pst_device_alloc_host(pst_device *dev, size_t bytes, void **ptr)
{
    if (!ptr)
        return pst_error_set(PST_ERR_INVALID, "pst_device_alloc_host: ptr is NULL");
    *ptr = NULL;
    if (!dev)
        return pst_error_set(PST_ERR_INVALID, "pst_device_alloc_host: device is NULL");
    if (bytes == 0)
        return pst_error_set(PST_ERR_INVALID,
                             "pst_device_alloc_host: allocation of 0 bytes for %s", dev->name);
    if (dev->rt->iface->host_alloc)
        return dev->rt->iface->host_alloc(dev, bytes, ptr);
    /* aligned_alloc wants a multiple of the alignment. */
    if (bytes > SIZE_MAX - PST_DEVICE_ALIGN)
        return pst_error_set(PST_ERR_NOMEM, "pst_device_alloc_host: %zu bytes for %s",
                             bytes, dev->name);
    size_t rounded = (bytes + PST_DEVICE_ALIGN - 1) / PST_DEVICE_ALIGN * PST_DEVICE_ALIGN;
    void *p = aligned_alloc(PST_DEVICE_ALIGN, rounded);
    if (!p)
        return pst_error_set(PST_ERR_NOMEM, "pst_device_alloc_host: %zu bytes for %s",
                             bytes, dev->name);
    pst_memory_huge(p, rounded);
    memset(p, 0, rounded);
    *ptr = p;
    return PST_OK;
}

void pst_device_free_host(pst_device *dev, void *ptr)
{
    if (!ptr)
        return;
    if (dev && dev->rt->iface->host_free)
        dev->rt->iface->host_free(dev, ptr);
    else
        free(ptr);
}

size_t pst_device_live_bytes(const pst_device *dev)
{
    return dev ? atomic_load(&((pst_device *)dev)->live_bytes) : 0;
}

size_t pst_device_peak_bytes(const pst_device *dev)
{
    return dev ? atomic_load(&((pst_device *)dev)->peak_bytes) : 0;
}

/* ---- streams ----------------------------------------------------------------------- */

pst_status pst_stream_create(pst_device *dev, pst_stream **out)
{
    pst_runtime *rt;
    pst_stream *s;
    pst_status st;

    if (!out)
        return pst_error_set(PST_ERR_INVALID, "pst_stream_create: out is NULL");
    *out = NULL;
    if (!dev)
        return pst_error_set(PST_ERR_INVALID, "pst_stream_create: device is NULL");
    rt = dev->rt;
    s = calloc(1, sizeof *s);
    if (!s)
        return pst_error_set(PST_ERR_NOMEM, "pst_stream_create: out of memory on %s",
                             dev->name);
    s->dev = dev;
    pthread_mutex_lock(&rt->mu);
    s->id = rt->next_stream_id++;
    pthread_mutex_unlock(&rt->mu);
    st = rt->iface->stream_init(s);
    if (st != PST_OK) {
        free(s);
        return st;
    }
    pthread_mutex_lock(&rt->mu);
    LIST_INSERT_HEAD(&rt->streams, s, link);
    pthread_mutex_unlock(&rt->mu);
    *out = s;
    return PST_OK;
}

void pst_stream_destroy(pst_stream *s)
{
    if (!s)
        return;
    pst_runtime *rt = s->dev->rt;
    pthread_mutex_lock(&rt->mu);
    LIST_REMOVE(s, link);
    pthread_mutex_unlock(&rt->mu);
    stream_release(s);
}

pst_device *pst_stream_device(const pst_stream *s)
{
    return s ? s->dev : NULL;
}

pst_status pst_stream_launch(pst_stream *s, pst_host_fn fn, void *arg)
{
    if (!s)
        return pst_error_set(PST_ERR_INVALID, "pst_stream_launch: stream is NULL");
    if (!fn)
        return pst_error_set(PST_ERR_INVALID, "pst_stream_launch: function is NULL (%s)",
                             s->dev->name);
    return s->dev->rt->iface->stream_launch(s, fn, arg);
}

pst_status pst_memcpy_async(pst_stream *s, void *dst, const void *src, size_t bytes,
                            pst_copy_kind kind)
{
    if (!s)
        return pst_error_set(PST_ERR_INVALID, "pst_memcpy_async: stream is NULL");
    if ((unsigned)kind > (unsigned)PST_COPY_HOST_TO_HOST)
        return pst_error_set(PST_ERR_INVALID, "pst_memcpy_async: unknown copy kind %d",
                             (int)kind);
    if (bytes > 0 && (!dst || !src))
        return pst_error_set(PST_ERR_INVALID,
                             "pst_memcpy_async: %s is NULL for a copy of %zu bytes on %s",
                             dst ? "src" : "dst", bytes, s->dev->name);
    if (bytes > 0) {
        uintptr_t d = (uintptr_t)dst, r = (uintptr_t)src;
        if ((d <= r && r - d < bytes) || (r < d && d - r < bytes))
            return pst_error_set(PST_ERR_INVALID,
                                 "pst_memcpy_async: source and destination of %zu bytes "
                                 "overlap on %s",
                                 bytes, s->dev->name);
    }
    return s->dev->rt->iface->memcpy_async(s, dst, src, bytes, kind);
}

pst_status pst_memset_async(pst_stream *s, void *dst, int value, size_t bytes)
{
    if (!s)
        return pst_error_set(PST_ERR_INVALID, "pst_memset_async: stream is NULL");
    if (bytes > 0 && !dst)
        return pst_error_set(PST_ERR_INVALID,
                             "pst_memset_async: dst is NULL for %zu bytes on %s", bytes,
                             s->dev->name);
    return s->dev->rt->iface->memset_async(s, dst, value, bytes);
}

pst_status pst_stream_synchronize(pst_stream *s)
{
    if (!s)
        return pst_error_set(PST_ERR_INVALID, "pst_stream_synchronize: stream is NULL");
    return s->dev->rt->iface->stream_synchronize(s);
}

double pst_stream_busy_seconds(pst_stream *s)
{
    if (!s || !s->dev->rt->iface->stream_busy_seconds)
        return -1.0;
    return s->dev->rt->iface->stream_busy_seconds(s);
}

int pst_stream_sync_waiters(pst_stream *s)
{
    if (!s || !s->dev->rt->iface->stream_sync_waiters)
        return -1;
    return s->dev->rt->iface->stream_sync_waiters(s);
}

/* ---- events ------------------------------------------------------------------------ */

pst_status pst_event_create(pst_device *dev, pst_event **out)
{
    pst_runtime *rt;
    pst_event *ev;
    pst_status st;

    if (!out)
        return pst_error_set(PST_ERR_INVALID, "pst_event_create: out is NULL");
    *out = NULL;
    if (!dev)
        return pst_error_set(PST_ERR_INVALID, "pst_event_create: device is NULL");
    rt = dev->rt;
    ev = calloc(1, sizeof *ev);
    if (!ev)
        return pst_error_set(PST_ERR_NOMEM, "pst_event_create: out of memory on %s",
                             dev->name);
    ev->dev = dev;
    st = rt->iface->event_init(ev);
    if (st != PST_OK) {
        free(ev);
        return st;
    }
    pthread_mutex_lock(&rt->mu);
    LIST_INSERT_HEAD(&rt->events, ev, link);
    pthread_mutex_unlock(&rt->mu);
    *out = ev;
    return PST_OK;
}

void pst_event_destroy(pst_event *ev)
{
    if (!ev)
        return;
    pst_runtime *rt = ev->dev->rt;
    pthread_mutex_lock(&rt->mu);
    LIST_REMOVE(ev, link);
    pthread_mutex_unlock(&rt->mu);
    event_release(ev);
}

pst_status pst_event_record(pst_event *ev, pst_stream *s)
{
    if (!ev || !s)
        return pst_error_set(PST_ERR_INVALID, "pst_event_record: %s is NULL",
                             ev ? "stream" : "event");
    if (ev->dev->rt != s->dev->rt)
        return pst_error_set(PST_ERR_INVALID,
                             "pst_event_record: event and stream belong to different runtimes");
    /* As in CUDA: an event is recorded on a stream of its own device (any device's
     * stream may wait on it). */
    if (ev->dev != s->dev)
        return pst_error_set(PST_ERR_INVALID,
                             "pst_event_record: event of %s recorded on a stream of %s; "
                             "record on a stream of the event's device",
                             ev->dev->name, s->dev->name);
    return s->dev->rt->iface->event_record(ev, s);
}

pst_status pst_stream_wait_event(pst_stream *s, pst_event *ev)
{
    if (!ev || !s)
        return pst_error_set(PST_ERR_INVALID, "pst_stream_wait_event: %s is NULL",
                             ev ? "stream" : "event");
    if (ev->dev->rt != s->dev->rt)
        return pst_error_set(PST_ERR_INVALID,
                             "pst_stream_wait_event: stream and event belong to different "
                             "runtimes");
    return s->dev->rt->iface->stream_wait_event(s, ev);
}

pst_status pst_event_synchronize(pst_event *ev)
{
    if (!ev)
        return pst_error_set(PST_ERR_INVALID, "pst_event_synchronize: event is NULL");
    return ev->dev->rt->iface->event_synchronize(ev);
}

int pst_event_query(pst_event *ev)
{
    /* A NULL event has no mark to wait for. */
    if (!ev)
        return 1;
    return ev->dev->rt->iface->event_query(ev);
}

/* ---- flags ------------------------------------------------------------------------- */

pst_status pst_flag_create(pst_device *dev, pst_flag **out)
{
    if (!out)
        return pst_error_set(PST_ERR_INVALID, "pst_flag_create: out is NULL");
    *out = NULL;
    if (!dev)
        return pst_error_set(PST_ERR_INVALID, "pst_flag_create: device is NULL");
    pst_flag *f = calloc(1, sizeof *f);
    if (!f)
        return pst_error_set(PST_ERR_NOMEM, "pst_flag_create: out of memory on %s", dev->name);
    f->dev = dev;
    pst_sticky_reset(&f->sticky);
    if (pthread_mutex_init(&f->mu, NULL) != 0) {
        free(f);
        return pst_error_set(PST_ERR_INTERNAL, "pst_flag_create: pthread_mutex_init failed");
    }
    if (pthread_cond_init(&f->cv, NULL) != 0) {
        pthread_mutex_destroy(&f->mu);
        free(f);
        return pst_error_set(PST_ERR_INTERNAL, "pst_flag_create: pthread_cond_init failed");
    }
    const pst_backend_iface *iface = dev->rt->iface;
    pst_status st = iface->flag_init ? iface->flag_init(f) : PST_OK;
    if (st != PST_OK) {
        pthread_cond_destroy(&f->cv);
        pthread_mutex_destroy(&f->mu);
        free(f);
        return st;
    }
    *out = f;
    return PST_OK;
}

void pst_flag_destroy(pst_flag *f)
{
    if (!f)
        return;
    const pst_backend_iface *iface = f->dev->rt->iface;
    if (iface->flag_free)
        iface->flag_free(f);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

pst_status pst_stream_wait_flag(pst_stream *s, pst_flag *f, uint64_t value)
{
    if (!s || !f)
        return pst_error_set(PST_ERR_INVALID, "pst_stream_wait_flag: %s is NULL",
                             f ? "stream" : "flag");
    if (f->dev != s->dev)
        return pst_error_set(PST_ERR_INVALID, "pst_stream_wait_flag: the flag is on %s, the "
                             "stream on %s", f->dev->name, s->dev->name);
    if (value == 0)
        return PST_OK;
    return s->dev->rt->iface->stream_wait_flag(s, f, value);
}

void pst_flag_signal(pst_flag *f, uint64_t value, pst_status st, const char *detail)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    if (value > f->value)
        f->value = value;
    pst_sticky_fail(&f->sticky, st, detail);
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    const pst_backend_iface *iface = f->dev->rt->iface;
    if (iface->flag_signal)
        iface->flag_signal(f);
}

pst_status pst_flag_wait_host(pst_flag *f, uint64_t value, char detail[PST_ERROR_DETAIL_MAX])
{
    pthread_mutex_lock(&f->mu);
    while (f->value < value && f->sticky.status == PST_OK)
        pthread_cond_wait(&f->cv, &f->mu);
    pst_status st = pst_sticky_read(&f->sticky, detail);
    pthread_mutex_unlock(&f->mu);
    return st;
}

int pst_runtime_host_memory(const pst_runtime *rt)
{
    return rt && rt->kind == PST_BACKEND_CPU;
}
