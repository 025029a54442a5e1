/* trace.h — a Chrome trace (Trace Event JSON; loads in Perfetto or chrome://tracing) of
 * the trainer's streams and RPCs over a window of steps.
 *
 * Spans live in an array sized at init, so recording allocates nothing and costs a
 * clock read and a store per end. Each span names its track (a device stream such as
 * "cpu:1 compute", or an RPC direction "rpc push" / "rpc pull"), its label and its step.
 * Thread safety: tr_trace_add may be called from any thread (atomic slot index). */
#ifndef TR_TRACE_H
#define TR_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define TR_TRACE_MAX_TRACKS 64

typedef struct tr_trace tr_trace;

/* A span being recorded: t0/t1 are CLOCK_MONOTONIC seconds (tr_trace_clock()); the file
 * shows them relative to the trace's start. t1 == 0: not finished (not written). */
typedef struct tr_span {
    int track;
    const char *name; /* static string */
    long step;
    long arg;         /* block or layer index, -1 for none */
    double t0, t1;
} tr_span;

/* Records steps [first, last] (inclusive) into at most `capacity` spans. */
pst_status tr_trace_init(tr_trace **out, const char *path, long first, long last,
                         size_t capacity);
void tr_trace_free(tr_trace *t); /* accepts NULL */
/* Registers a track (in display order); returns its id. Not thread safe: call at init. */
int tr_trace_track(tr_trace *t, const char *name);
/* 1 when `step` is inside the window (t may be NULL: 0). */
int tr_trace_on(const tr_trace *t, long step);
/* CLOCK_MONOTONIC in seconds, the clock spans use. */
double tr_trace_clock(void);
/* Reserves a span (NULL when full); the caller fills t0/t1 (t1 = 0: not finished). */
tr_span *tr_trace_add(tr_trace *t, int track, const char *name, long step, long arg);
/* Writes the JSON file. Errors: PST_ERR_IO naming the path. */
pst_status tr_trace_write(tr_trace *t);

#endif /* TR_TRACE_H */
