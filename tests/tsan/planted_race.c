/* planted_race.c — a program with a data race planted in OUR code, for proving that the
 * ThreadSanitizer suite still reports our races (tests/tsan/expect_race.sh runs it).
 *
 * Why: the TSan build runs OpenBLAS single-threaded (OPENBLAS_NUM_THREADS=1), because
 * OpenBLAS's own worker threads synchronize in ways TSan cannot see and every GEMM then
 * looks like a race. That must not blind the suite to races between our streams, so this
 * program plants exactly the kind of bug the executor could have: two streams of one CPU
 * device touch the same buffer with no event between them.
 *
 *   planted_race host    stream 1 writes a buffer in a host function, stream 2 reads it
 *   planted_race gemm    stream 1 runs a linear forward op (OpenBLAS GEMM + our bias/ReLU
 *                        pass) into `out`, stream 2 reads `out`
 *   planted_race clean   as `host`, but stream 2 waits for an event recorded after the
 *                        write: no race, so TSan must stay silent
 * Exit status: 0 when the run finished (TSan itself exits 66 after reporting).
 *
 * The racing accesses must not be ordered by any incidental synchronization: if the reader's
 * stream thread only picked up its task after the main thread had waited for stream 1, the
 * stream mutexes would carry a happens-before edge from the write to the read and TSan would
 * rightly stay silent (a flaky test, seen on a loaded CI machine). So the two host functions
 * hand over with relaxed atomics, which TSan does not count as synchronization: the writer
 * waits until the reader's task is running, the reader waits until the write is done. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/runtime/device.h"
#include "common/nn/ops.h"

#define N 1024

typedef struct shared_buf {
    float *v;
    double sum;
    atomic_int reader_running; /* relaxed handshake, invisible to TSan (see the top) */
    atomic_int written;
} shared_buf;

static void spin_until(atomic_int *flag)
{
    while (!atomic_load_explicit(flag, memory_order_relaxed))
        usleep(100);
}

static pst_status wait_for_reader(void *arg)
{
    spin_until(&((shared_buf *)arg)->reader_running);
    return PST_OK;
}

static pst_status mark_written(void *arg)
{
    atomic_store_explicit(&((shared_buf *)arg)->written, 1, memory_order_relaxed);
    return PST_OK;
}

static pst_status planted_write(void *arg)
{
    shared_buf *b = arg;
    for (int i = 0; i < N; i++)
        b->v[i] = (float)i;
    return PST_OK;
}

/* Reads after the write in time but, in the racing modes, with no happens-before edge. */
static pst_status planted_read(void *arg)
{
    shared_buf *b = arg;
    atomic_store_explicit(&b->reader_running, 1, memory_order_relaxed);
    spin_until(&b->written);
    double s = 0;
    for (int i = 0; i < N; i++)
        s += b->v[i];
    b->sum = s;
    return PST_OK;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "host") && strcmp(mode, "gemm") && strcmp(mode, "clean")) {
        fprintf(stderr, "usage: planted_race host|gemm|clean\n");
        return 2;
    }
    pst_runtime *rt;
    pst_stream *s1, *s2;
    pst_event *ev;
    if (pst_runtime_init(&rt, "cpu:1") != PST_OK) {
        fprintf(stderr, "planted_race: %s\n", pst_error_detail());
        return 1;
    }
    pst_device *dev = pst_runtime_device(rt, 0);
    float *w, *bias, *x, *out;
    shared_buf buf = {.v = NULL};
    if (pst_stream_create(dev, &s1) != PST_OK || pst_stream_create(dev, &s2) != PST_OK ||
        pst_event_create(dev, &ev) != PST_OK ||
        pst_device_alloc(dev, sizeof(float) * N, (void **)&buf.v) != PST_OK ||
        pst_device_alloc(dev, sizeof(float) * 32 * 32, (void **)&w) != PST_OK ||
        pst_device_alloc(dev, sizeof(float) * 32, (void **)&bias) != PST_OK ||
        pst_device_alloc(dev, sizeof(float) * 32 * 32, (void **)&x) != PST_OK ||
        pst_device_alloc(dev, sizeof(float) * N, (void **)&out) != PST_OK) {
        fprintf(stderr, "planted_race: %s\n", pst_error_detail());
        return 1;
    }
    pst_status st = PST_OK;
    if (strcmp(mode, "gemm") == 0) {
        pst_linear_fwd_args fwd = {.out = out, .inp = x, .w = w, .b = bias, .B = 32,
                                   .IC = 32, .OC = 32, .relu = 1};
        buf.v = out;
        st = pst_stream_launch(s1, wait_for_reader, &buf);
        if (st == PST_OK)
            st = pst_op_linear_forward(s1, &fwd);
        if (st == PST_OK)
            st = pst_stream_launch(s1, mark_written, &buf);
        if (st == PST_OK)
            st = pst_stream_launch(s2, planted_read, &buf); /* no wait: the planted race */
        if (st == PST_OK)
            st = pst_stream_synchronize(s1);
        if (st == PST_OK)
            st = pst_stream_synchronize(s2);
    } else {
        int clean = strcmp(mode, "clean") == 0;
        /* clean: the event orders the streams, so the reader cannot be running first */
        st = clean ? PST_OK : pst_stream_launch(s1, wait_for_reader, &buf);
        if (st == PST_OK)
            st = pst_stream_launch(s1, planted_write, &buf);
        if (st == PST_OK)
            st = pst_stream_launch(s1, mark_written, &buf);
        if (st == PST_OK && clean) {
            st = pst_event_record(ev, s1);
            if (st == PST_OK)
                st = pst_stream_wait_event(s2, ev);
        }
        if (st == PST_OK)
            st = pst_stream_launch(s2, planted_read, &buf);
        if (st == PST_OK)
            st = pst_stream_synchronize(s1);
        if (st == PST_OK)
            st = pst_stream_synchronize(s2);
    }
    if (st != PST_OK) {
        fprintf(stderr, "planted_race: %s\n", pst_error_detail());
        return 1;
    }
    printf("planted_race %s: done (sum %.0f)\n", mode, buf.sum);
    pst_event_destroy(ev);
    pst_stream_destroy(s1);
    pst_stream_destroy(s2);
    pst_runtime_free(rt);
    return 0;
}
