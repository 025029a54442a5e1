/* device.h — the device runtime: devices, streams, events, memory (public interface).
 *
 * A runtime is a set of logical devices of one backend, made from a spec string:
 * "cpu:N" (N CPU devices; "cpu" = "cpu:1") or, when built with CUDA, "cuda" / "cuda:0,1".
 * Semantics follow CUDA streams and events so that the trainer's executor is written
 * once and runs on either backend:
 *   - work submitted to one stream runs in submission order (FIFO), one item at a time;
 *   - different streams run concurrently;
 *   - pst_event_record(ev, s) marks the point in `s` after all work submitted so far;
 *     pst_stream_wait_event(s2, ev) makes later work on s2 wait for that point;
 *     waiting on an event that was never recorded does not wait (as in CUDA);
 *     re-recording an event moves the mark; a wait already submitted keeps the old mark;
 *   - a failed work item makes its stream's status sticky: later items on that stream are
 *     skipped and pst_stream_synchronize() returns the first error (with its detail).
 *     A stream that waits on an event whose mark was reached on a failed stream takes
 *     that error as its own sticky status, so failures follow the dependencies;
 *   - an event is recorded on a stream of its own device (as in CUDA); a stream of any
 *     device of the same runtime may wait on it.
 *   - a flag is a monotone 64-bit value that the HOST raises (from any thread: an RPC
 *     completion, say) and streams wait on: pst_stream_wait_flag(s, f, v) makes later
 *     work on s wait until the value is >= v. It replaces blocking inside a host function,
 *     which on CUDA would hold the driver's one callback thread and stall every stream's
 *     host functions. A failed signal makes the flag fail: every wait on it, pending or
 *     later, ends at once and its stream takes the error as its sticky status.
 * On the CPU backend a stream is a worker thread with a FIFO queue; "kernels" are host
 * functions (pst_stream_launch). A CUDA backend implements the same table
 * (device_impl.h) with cudaStream_t / cudaEvent_t and cudaLaunchHostFunc.
 *
 * Ownership: the runtime owns its devices; a stream or event belongs to the device it was
 * created on and must be destroyed before the runtime is freed. Memory from
 * pst_device_alloc is freed with pst_device_free.
 * Thread safety: every function may be called from any thread; submitting to one stream
 * from several threads at once is allowed (items are ordered by the queue lock).
 * Errors: functions return PST_OK or an error with a detail (error.h); none aborts. */
#ifndef PST_DEVICE_H
#define PST_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

typedef struct pst_runtime pst_runtime;
typedef struct pst_device pst_device;
typedef struct pst_stream pst_stream;
typedef struct pst_event pst_event;
typedef struct pst_flag pst_flag;

#define PST_DEVICE_MAX_COUNT 64 /* most devices in one runtime ("cpu:64") */

/* The set of devices 0..n-1 as bits (bit d: device d), for n <= PST_DEVICE_MAX_COUNT: what
 * the collectives' `members` and the block plan's holders name. */
static inline uint64_t pst_devices_first(int n)
{
    return n >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
}

typedef enum pst_backend_kind { PST_BACKEND_CPU = 0, PST_BACKEND_CUDA } pst_backend_kind;

typedef enum pst_copy_kind {
    PST_COPY_HOST_TO_DEVICE = 0,
    PST_COPY_DEVICE_TO_HOST,
    PST_COPY_DEVICE_TO_DEVICE,
    PST_COPY_HOST_TO_HOST
} pst_copy_kind;

/* A unit of work on a stream. Returns PST_OK, or an error (with pst_error_set detail)
 * that makes the stream's status sticky. Runs on the stream's worker thread. */
typedef pst_status (*pst_host_fn)(void *arg);

/* Creates the devices named by `spec` ("cpu:4"). Errors: PST_ERR_INVALID for a malformed
 * spec (detail names it and gives "cpu:2" as an example), PST_ERR_UNSUPPORTED for a backend
 * not built or with no hardware. On error *out is NULL. */
pst_status pst_runtime_init(pst_runtime **out, const char *spec);
/* 1 when `spec` names CUDA devices ("cuda" or "cuda:..."), as pst_runtime_init reads it;
 * asks no GPU and checks nothing else of the spec. */
int pst_devices_spec_cuda(const char *spec);
/* Stops and frees everything; accepts NULL. Streams still holding work are drained first. */
void pst_runtime_free(pst_runtime *rt);
int pst_runtime_count(const pst_runtime *rt);
/* Test hook (for tests that hunt ordering bugs with injected random delays; production
 * code never calls it): from now on, before each work item, every stream of `rt` sleeps a
 * pseudo-random 0..max_us microseconds drawn from its own pst_rng seeded with
 * (seed, stream id). max_us 0 turns it off. Same seed, same delays per stream. A no-op for
 * a NULL runtime or a backend without the hook. */
void pst_runtime_set_jitter(pst_runtime *rt, uint64_t seed, unsigned max_us);
pst_backend_kind pst_runtime_backend(const pst_runtime *rt);
/* 1 when device memory is ordinary host memory that the host may read and write directly
 * (the CPU backend), 0 when copies are needed (CUDA). */
int pst_runtime_host_memory(const pst_runtime *rt);
/* Device i in [0, count), or NULL when out of range. */
pst_device *pst_runtime_device(pst_runtime *rt, int i);

/* "cpu:0", "cuda:1". */
const char *pst_device_name(const pst_device *dev);
int pst_device_index(const pst_device *dev);

/* Allocates `bytes` of device memory, 64-byte aligned, zero-filled on CPU. Counts toward
 * the device's live and peak bytes. Errors: PST_ERR_NOMEM. */
pst_status pst_device_alloc(pst_device *dev, size_t bytes, void **ptr);
/* Frees memory from pst_device_alloc on the same device; accepts NULL. */
void pst_device_free(pst_device *dev, void *ptr);
/* Host memory for send/recv buffers (pinned on CUDA; plain aligned memory on CPU). */
pst_status pst_device_alloc_host(pst_device *dev, size_t bytes, void **ptr);
void pst_device_free_host(pst_device *dev, void *ptr);
/* From now on pst_device_alloc refuses, with PST_ERR_NOMEM and a line naming the device,
 * the bytes and the limit, an allocation that would make the device's live bytes exceed
 * `bytes` (0: no limit, the default). The same on every backend: it is checked before the
 * backend allocates, against the live bytes at the call (a device's memory is allocated by
 * one thread at a time in the trainer, at init). What is already allocated stays. */
void pst_device_set_memory_limit(pst_device *dev, size_t bytes);
/* Bytes currently allocated / the most ever allocated at once (device memory only). */
size_t pst_device_live_bytes(const pst_device *dev);
size_t pst_device_peak_bytes(const pst_device *dev);

pst_status pst_stream_create(pst_device *dev, pst_stream **out);
/* Waits for the stream's queued work, then frees it; accepts NULL. */
void pst_stream_destroy(pst_stream *s);
pst_device *pst_stream_device(const pst_stream *s);
/* Queues fn(arg). The caller keeps `arg` alive until the item has run. */
pst_status pst_stream_launch(pst_stream *s, pst_host_fn fn, void *arg);
/* Queues a copy of `bytes` from src to dst. */
pst_status pst_memcpy_async(pst_stream *s, void *dst, const void *src, size_t bytes,
                            pst_copy_kind kind);
/* Queues a memset of `bytes` at dst to `value`. */
pst_status pst_memset_async(pst_stream *s, void *dst, int value, size_t bytes);
/* Blocks until all work queued so far has run; returns the stream's sticky status. */
pst_status pst_stream_synchronize(pst_stream *s);
/* Seconds the stream has spent running work (not waiting on events or flags) since it was
 * created, as of the last item it finished; -1 when the backend does not measure it (CUDA:
 * not yet). Thread safe. */
double pst_stream_busy_seconds(pst_stream *s);
/* Test hook: how many threads are inside pst_stream_synchronize(s) with the point they
 * wait for taken; -1 when the backend does not count them (CUDA). Thread safe. */
int pst_stream_sync_waiters(pst_stream *s);

pst_status pst_event_create(pst_device *dev, pst_event **out);
void pst_event_destroy(pst_event *ev); /* accepts NULL */
pst_status pst_event_record(pst_event *ev, pst_stream *s);
pst_status pst_stream_wait_event(pst_stream *s, pst_event *ev);
/* Blocks until the last recorded mark has been reached (returns at once if never
 * recorded). Returns the recording stream's sticky status. */
pst_status pst_event_synchronize(pst_event *ev);
/* 1 when the last recorded mark has been reached (or never recorded), else 0. */
int pst_event_query(pst_event *ev);

/* A flag of dev at value 0. On CUDA its value lives in pinned host memory mapped for the
 * GPU, which waits on it itself (cuStreamWaitValue64); where the driver cannot, the wait
 * falls back to a host function that blocks, with a warning once. */
pst_status pst_flag_create(pst_device *dev, pst_flag **out);
void pst_flag_destroy(pst_flag *f); /* accepts NULL; no wait on it may still be queued */
/* Later work on s (a stream of the flag's device) waits until the value is >= value
 * (value 0: no wait), or fails when the flag has failed. */
pst_status pst_stream_wait_flag(pst_stream *s, pst_flag *f, uint64_t value);
/* From any thread: raises the value to `value` (a smaller one is ignored). st != PST_OK
 * fails the flag for good with st and `detail` (may be NULL). Never blocks on a stream. */
void pst_flag_signal(pst_flag *f, uint64_t value, pst_status st, const char *detail);

#endif /* PST_DEVICE_H */
