/* trace.c — Chrome trace writer (see trace.h). */
#include "trainer/trace.h"

#include "common/clock.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tr_trace {
    char path[512];
    long first, last;
    struct timespec start;
    tr_span *spans;
    size_t capacity;
    atomic_size_t used;
    int ntracks;
    char tracks[TR_TRACE_MAX_TRACKS][48];
};

pst_status tr_trace_init(tr_trace **out, const char *path, long first, long last,
                         size_t capacity)
{
    *out = NULL;
    tr_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->spans = calloc(capacity ? capacity : 1, sizeof *t->spans))) {
        free(t);
        return pst_error_set(PST_ERR_NOMEM, "--trace: out of memory for %zu spans", capacity);
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    t->first = first;
    t->last = last;
    t->capacity = capacity;
    clock_gettime(CLOCK_MONOTONIC, &t->start);
    *out = t;
    return PST_OK;
}

void tr_trace_free(tr_trace *t)
{
    if (!t)
        return;
    free(t->spans);
    free(t);
}

int tr_trace_track(tr_trace *t, const char *name)
{
    if (t->ntracks == TR_TRACE_MAX_TRACKS)
        return TR_TRACE_MAX_TRACKS - 1;
    snprintf(t->tracks[t->ntracks], sizeof t->tracks[0], "%s", name);
    return t->ntracks++;
}

int tr_trace_on(const tr_trace *t, long step)
{
    return t && step >= t->first && step <= t->last;
}

double tr_trace_clock(void)
{
    return pst_clock_s();
}

tr_span *tr_trace_add(tr_trace *t, int track, const char *name, long step, long arg)
{
    size_t i = atomic_fetch_add(&t->used, 1);
    if (i >= t->capacity)
        return NULL;
    tr_span *s = &t->spans[i];
    s->track = track;
    s->name = name;
    s->step = step;
    s->arg = arg;
    return s;
}

pst_status tr_trace_write(tr_trace *t)
{
    FILE *f = fopen(t->path, "w");
    if (!f)
        return pst_error_set(PST_ERR_IO, "--trace %s: cannot write: %s", t->path, strerror(errno));
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"trainer\"}}");
    for (int k = 0; k < t->ntracks; k++) {
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                k, t->tracks[k]);
        fprintf(f, ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                k, k);
    }
    double origin = (double)t->start.tv_sec + 1e-9 * (double)t->start.tv_nsec;
    size_t n = atomic_load(&t->used);
    if (n > t->capacity)
        n = t->capacity;
    for (size_t i = 0; i < n; i++) {
        const tr_span *s = &t->spans[i];
        if (s->t0 <= 0 || s->t1 < s->t0)
            continue;
        fprintf(f, ",\n{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                   "\"args\":{\"step\":%ld",
                s->name, s->track, 1e6 * (s->t0 - origin), 1e6 * (s->t1 - s->t0), s->step);
        if (s->arg >= 0)
            fprintf(f, ",\"index\":%ld", s->arg);
        fputs("}}", f);
    }
    fputs("\n]}\n", f);
    if (fclose(f) != 0)
        return pst_error_set(PST_ERR_IO, "--trace %s: write failed: %s", t->path, strerror(errno));
    return PST_OK;
}
