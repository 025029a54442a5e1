/* test_device.c — the device runtime (common/runtime/device.h) on the CPU backend.
 *
 * Covers spec parsing, memory counters, stream FIFO order, event semantics (cross-stream
 * waits, re-recording, never-recorded events), async copies, sticky errors, shutdown with
 * queued work, injected random delays (pst_runtime_set_jitter) and argument checks.
 * Sleeps only make a race likely; no assertion depends on how long anything took. Tests
 * that could hang on a bug carry a timeout. Also built with ThreadSanitizer
 * (PST_TSAN_TESTS), which checks that items on one stream never overlap: the counters
 * they bump are plain ints. */
#include <criterion/criterion.h>
#include <gnu/libc-version.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/runtime/device.h"
#include "common/memory.h"
#include "common/error.h"
#include "tests/check.h"

static pst_runtime *make_rt(const char *spec)
{
    pst_runtime *rt = NULL;
    CHECK_OK(pst_runtime_init(&rt, spec));
    cr_assert_not_null(rt);
    return rt;
}

static pst_stream *make_stream(pst_runtime *rt, int dev)
{
    pst_stream *s = NULL;
    CHECK_OK(pst_stream_create(pst_runtime_device(rt, dev), &s));
    return s;
}

static pst_event *make_event(pst_runtime *rt, int dev)
{
    pst_event *ev = NULL;
    CHECK_OK(pst_event_create(pst_runtime_device(rt, dev), &ev));
    return ev;
}

static void sleep_us(unsigned us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* A work item that blocks its stream until the test opens it. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered;
    int open;
} gate;

static void gate_init(gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->entered = 0;
    g->open = 0;
}

static pst_status gate_fn(void *arg)
{
    gate *g = arg;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    return PST_OK;
}

/* Blocks until a stream is inside gate_fn. */
static void gate_wait_entered(gate *g)
{
    pthread_mutex_lock(&g->mu);
    while (!g->entered)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static pst_status set_flag_fn(void *arg)
{
    atomic_store((atomic_int *)arg, 1);
    return PST_OK;
}

static pst_status inc_fn(void *arg)
{
    (*(int *)arg)++;
    return PST_OK;
}

/* ---- spec parsing ------------------------------------------------------------------ */

Test(device_spec, good_specs)
{
    pst_runtime *rt = make_rt("cpu");
    cr_assert_eq(pst_runtime_count(rt), 1);
    cr_assert_eq(pst_runtime_backend(rt), PST_BACKEND_CPU);
    cr_assert_str_eq(pst_device_name(pst_runtime_device(rt, 0)), "cpu:0");
    cr_assert_null(pst_runtime_device(rt, 1));
    pst_runtime_free(rt);

    rt = make_rt("cpu:4");
    cr_assert_eq(pst_runtime_count(rt), 4);
    for (int i = 0; i < 4; i++) {
        char want[16];
        snprintf(want, sizeof want, "cpu:%d", i);
        pst_device *dev = pst_runtime_device(rt, i);
        cr_assert_not_null(dev);
        cr_assert_str_eq(pst_device_name(dev), want);
        cr_assert_eq(pst_device_index(dev), i);
    }
    cr_assert_null(pst_runtime_device(rt, 4));
    cr_assert_null(pst_runtime_device(rt, -1));
    pst_runtime_free(rt);

    rt = make_rt("cpu:64");
    cr_assert_eq(pst_runtime_count(rt), 64);
    cr_assert_str_eq(pst_device_name(pst_runtime_device(rt, 63)), "cpu:63");
    pst_runtime_free(rt);
}

Test(device_spec, bad_specs_are_invalid)
{
    static const char *const bad[] = {
        "",       "cpu:0",   "cpu:65",  "cpu:",   "cpu:2x",   "cpu:-1", "cpu:+2",
        " cpu:2", "cpu:2 ",  "CPU:2",   "gpu",    "cpu2",     "cpu:1,2", "cpus",
        "cpu:99999999999999999999", "cpu:0002x", "cuda:", "cuda:0,", "cuda:,0",
        "cuda:0,0", "cuda:a", "cuda0", "cuda:1;2", "cuda:64", "cuda:-1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pst_runtime *rt = (pst_runtime *)&bad; /* must be reset to NULL */
        pst_error_clear();
        pst_status st = pst_runtime_init(&rt, bad[i]);
        cr_assert_eq(st, PST_ERR_INVALID, "\"%s\" -> %s (%s)", bad[i], pst_strerror(st),
                     pst_error_detail());
        cr_assert_null(rt, "\"%s\": *out not NULL on error", bad[i]);
        const char *d = pst_error_detail();
        cr_assert(strstr(d, "cpu:2") != NULL, "\"%s\": detail lacks an example: %s", bad[i],
                  d);
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"%s\"", bad[i]);
        cr_assert(strstr(d, quoted) != NULL, "detail does not quote %s: %s", quoted, d);
    }
}

/* A CUDA spec that cannot be served: a build without the CUDA backend says so; a build
 * with it, on a machine without a GPU, says there is no GPU (test_cuda_nogpu.c has more). */
Test(device_spec, cuda_is_unsupported_in_this_build)
{
    static const char *const cuda[] = {"cuda", "cuda:0", "cuda:0,1", "cuda:3,1,2"};
#ifdef PSTRAIN_HAVE_CUDA
    pst_runtime *gpu = NULL;
    if (pst_runtime_init(&gpu, "cuda") == PST_OK) {
        pst_runtime_free(gpu);
        cr_skip_test("a GPU is present");
    }
#endif
    for (size_t i = 0; i < sizeof cuda / sizeof cuda[0]; i++) {
        pst_runtime *rt = (pst_runtime *)&cuda;
        pst_error_clear();
        pst_status st = pst_runtime_init(&rt, cuda[i]);
        cr_assert_eq(st, PST_ERR_UNSUPPORTED, "\"%s\" -> %s (%s)", cuda[i], pst_strerror(st),
                     pst_error_detail());
        cr_assert_null(rt);
        const char *d = pst_error_detail();
        cr_assert(strstr(d, cuda[i]) != NULL, "detail does not name %s: %s", cuda[i], d);
#ifdef PSTRAIN_HAVE_CUDA
        cr_assert(strstr(d, "no CUDA GPU available") != NULL, "%s", d);
#else
        cr_assert(strstr(d, "no CUDA backend") != NULL, "%s", d);
#endif
        cr_assert(strstr(d, "cpu:N") != NULL, "%s", d);
    }
}

Test(device_spec, null_arguments)
{
    pst_runtime *rt = (pst_runtime *)&rt;
    CHECK_ERR(pst_runtime_init(&rt, NULL), PST_ERR_INVALID);
    cr_assert_null(rt);
    CHECK_ERR(pst_runtime_init(NULL, "cpu:2"), PST_ERR_INVALID);
    pst_runtime_free(NULL);
    cr_assert_eq(pst_runtime_count(NULL), 0);
    cr_assert_null(pst_runtime_device(NULL, 0));
}

/* ---- memory ------------------------------------------------------------------------ */

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

Test(device_alloc, live_and_peak_counters)
{
    pst_runtime *rt = make_rt("cpu:2");
    pst_device *d0 = pst_runtime_device(rt, 0), *d1 = pst_runtime_device(rt, 1);
    void *a, *b, *c, *e;

    cr_assert_eq(pst_device_live_bytes(d0), 0);
    cr_assert_eq(pst_device_peak_bytes(d0), 0);
    CHECK_OK(pst_device_alloc(d0, 100, &a));
    CHECK_OK(pst_device_alloc(d0, 1000, &b));
    cr_assert_eq((uintptr_t)a % 64, 0);
    cr_assert_eq((uintptr_t)b % 64, 0);
    cr_assert(all_zero(a, 100));
    cr_assert(all_zero(b, 1000));
    cr_assert_eq(pst_device_live_bytes(d0), 1100);
    cr_assert_eq(pst_device_peak_bytes(d0), 1100);

    pst_device_free(d0, b);
    cr_assert_eq(pst_device_live_bytes(d0), 100);
    cr_assert_eq(pst_device_peak_bytes(d0), 1100);
    CHECK_OK(pst_device_alloc(d0, 50, &c));
    cr_assert_eq(pst_device_live_bytes(d0), 150);
    cr_assert_eq(pst_device_peak_bytes(d0), 1100);

    /* Devices count separately. */
    cr_assert_eq(pst_device_live_bytes(d1), 0);
    cr_assert_eq(pst_device_peak_bytes(d1), 0);
    CHECK_OK(pst_device_alloc(d1, 7, &e));
    cr_assert_eq(pst_device_live_bytes(d1), 7);
    cr_assert_eq(pst_device_live_bytes(d0), 150);

    pst_device_free(d0, a);
    pst_device_free(d0, c);
    pst_device_free(d1, e);
    pst_device_free(d0, NULL);
    cr_assert_eq(pst_device_live_bytes(d0), 0);
    cr_assert_eq(pst_device_live_bytes(d1), 0);
    cr_assert_eq(pst_device_peak_bytes(d0), 1100);
    cr_assert_eq(pst_device_peak_bytes(d1), 7);
    pst_runtime_free(rt);
}

Test(device_alloc, memory_is_zero_filled_when_reused)
{
    pst_runtime *rt = make_rt("cpu");
    pst_device *dev = pst_runtime_device(rt, 0);
    static const size_t sizes[] = {1, 63, 64, 65, 4096, 100000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int round = 0; round < 3; round++) {
            unsigned char *p;
            CHECK_OK(pst_device_alloc(dev, sizes[i], (void **)&p));
            cr_assert_eq((uintptr_t)p % 64, 0);
            cr_assert(all_zero(p, sizes[i]), "%zu bytes not zero-filled", sizes[i]);
            memset(p, 0xff, sizes[i]); /* dirty it so a reuse without zeroing shows */
            pst_device_free(dev, p);
        }
    }
    cr_assert_eq(pst_device_live_bytes(dev), 0);
    pst_runtime_free(rt);
}

/* The VmFlags of the mapping that holds address p ("" where none is found). */
static void vm_flags_at(const void *p, char *flags, size_t size)
{
    flags[0] = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    cr_assert_not_null(f, "/proc/self/smaps");
    char line[512];
    int inside = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) { /* a mapping's first line */
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            snprintf(flags, size, "%s", line + 8);
            break;
        }
    }
    fclose(f);
}

/* Device and host buffers of many MiB ask for transparent huge pages (pst_memory_huge):
 * the 2 MiB pages inside them carry the "hg" flag; a small buffer's mapping does not get
 * it from the allocator. */
Test(device_alloc, large_buffers_ask_for_huge_pages)
{
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0)
        cr_skip_test("this kernel has no transparent huge pages");
    pst_runtime *rt = make_rt("cpu");
    pst_device *dev = pst_runtime_device(rt, 0);
    const size_t big = (size_t)16 << 20;
    unsigned char *d, *h;
    CHECK_OK(pst_device_alloc(dev, big, (void **)&d));
    CHECK_OK(pst_device_alloc_host(dev, big, (void **)&h));
    char flags[256];
    vm_flags_at(d + big / 2, flags, sizeof flags);
    cr_assert(strstr(flags, " hg") != NULL, "device buffer's mapping has VmFlags:%s", flags);
    vm_flags_at(h + big / 2, flags, sizeof flags);
    cr_assert(strstr(flags, " hg") != NULL, "host buffer's mapping has VmFlags:%s", flags);
    cr_assert(all_zero(d, big) && all_zero(h, big));
    pst_device_free(dev, d);
    pst_device_free_host(dev, h);
    pst_runtime_free(rt);
}

/* The restart that gives malloc's heaps huge pages: GLIBC_TUNABLES gains
 * glibc.malloc.hugetlb=1 (after what it held), once; a value the user set is kept. */
Test(device_alloc, heap_huge_pages_through_glibc_tunables)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char thp[128] = "";
    const int known = f && fgets(thp, sizeof thp, f);
    if (f)
        fclose(f);
    if (!known || strstr(thp, "[never]"))
        cr_skip_test("this kernel has no transparent huge pages");
    int major = 0, minor = 0;
    cr_assert_eq(sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor), 2);
    if (major * 1000 + minor < 2035)
        cr_skip_test("glibc %s has no glibc.malloc.hugetlb", gnu_get_libc_version());
    unsetenv("GLIBC_TUNABLES");
    cr_assert_eq(pst_memory_huge_heap_env(), 1);
    cr_assert_str_eq(getenv("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1");
    cr_assert_eq(pst_memory_huge_heap_env(), 0, "set once, not twice");
    setenv("GLIBC_TUNABLES", "glibc.malloc.check=0", 1);
    cr_assert_eq(pst_memory_huge_heap_env(), 1);
    cr_assert_str_eq(getenv("GLIBC_TUNABLES"), "glibc.malloc.check=0:glibc.malloc.hugetlb=1");
    setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0", 1);
    cr_assert_eq(pst_memory_huge_heap_env(), 0);
    cr_assert_str_eq(getenv("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=0");
}

Test(device_alloc, errors)
{
    pst_runtime *rt = make_rt("cpu");
    pst_device *dev = pst_runtime_device(rt, 0);
    void *p = &p;

    CHECK_ERR(pst_device_alloc(dev, 0, &p), PST_ERR_INVALID);
    cr_assert_null(p);
    p = &p;
    CHECK_ERR(pst_device_alloc(dev, SIZE_MAX, &p), PST_ERR_NOMEM);
    cr_assert_null(p);
    p = &p;
    CHECK_ERR(pst_device_alloc(dev, SIZE_MAX - 64, &p), PST_ERR_NOMEM);
    cr_assert_null(p);
    CHECK_ERR(pst_device_alloc(NULL, 16, &p), PST_ERR_INVALID);
    CHECK_ERR(pst_device_alloc(dev, 16, NULL), PST_ERR_INVALID);
    CHECK_ERR(pst_device_alloc_host(dev, 0, &p), PST_ERR_INVALID);
    CHECK_ERR(pst_device_alloc_host(NULL, 16, &p), PST_ERR_INVALID);
    CHECK_ERR(pst_device_alloc_host(dev, 16, NULL), PST_ERR_INVALID);
    CHECK_ERR(pst_device_alloc_host(dev, SIZE_MAX, &p), PST_ERR_NOMEM);
    cr_assert_eq(pst_device_live_bytes(dev), 0);
    cr_assert_eq(pst_device_peak_bytes(dev), 0);
    pst_device_free(NULL, NULL);
    pst_device_free(dev, NULL);
    pst_device_free_host(NULL, NULL);
    pst_device_free_host(dev, NULL);
    cr_assert_eq(pst_device_live_bytes(NULL), 0);
    cr_assert_eq(pst_device_peak_bytes(NULL), 0);
    cr_assert_eq(pst_device_index(NULL), -1);
    cr_assert_not_null(pst_device_name(NULL));
    pst_runtime_free(rt);
}

/* pst_device_set_memory_limit: an allocation past the limit is refused with one line that
 * names the device, the bytes and the option, and changes nothing; one that fits exactly
 * passes; freeing makes room again; other devices and host memory are not limited; 0
 * lifts the limit. */
Test(device_alloc, memory_limit_refuses_what_does_not_fit)
{
    pst_runtime *rt = make_rt("cpu:2");
    pst_device *d0 = pst_runtime_device(rt, 0), *d1 = pst_runtime_device(rt, 1);
    void *a = NULL, *b = NULL, *c = &c, *h = NULL;
    pst_device_set_memory_limit(d0, 1000);
    CHECK_OK(pst_device_alloc(d0, 600, &a));
    CHECK_ERR(pst_device_alloc(d0, 401, &c), PST_ERR_NOMEM);
    cr_assert_null(c);
    cr_assert(strstr(pst_error_detail(), "cpu:0: 401 bytes more would make 1001") &&
                  strstr(pst_error_detail(), "memory limit of 1000 (--device-memory-limit"),
              "%s", pst_error_detail());
    CHECK_ERR(pst_device_alloc(d0, SIZE_MAX, &c), PST_ERR_NOMEM); /* no overflow */
    cr_assert_eq(pst_device_live_bytes(d0), 600);
    cr_assert_eq(pst_device_peak_bytes(d0), 600);
    CHECK_OK(pst_device_alloc(d0, 400, &b)); /* exactly the limit */
    CHECK_OK(pst_device_alloc(d1, 5000, &c));
    CHECK_OK(pst_device_alloc_host(d0, 5000, &h));
    pst_device_free(d0, a);
    CHECK_OK(pst_device_alloc(d0, 600, &a));
    pst_device_free(d0, a);
    pst_device_set_memory_limit(d0, 0);
    CHECK_OK(pst_device_alloc(d0, 100000, &a));
    pst_device_free(d0, a);
    pst_device_free(d0, b);
    pst_device_free(d1, c);
    pst_device_free_host(d0, h);
    pst_device_set_memory_limit(NULL, 1); /* accepted, does nothing */
    pst_runtime_free(rt);
}

Test(device_alloc, host_memory_is_aligned_and_uncounted)
{
    pst_runtime *rt = make_rt("cpu");
    pst_device *dev = pst_runtime_device(rt, 0);
    unsigned char *h;
    CHECK_OK(pst_device_alloc_host(dev, 1000, (void **)&h));
    cr_assert_eq((uintptr_t)h % 64, 0);
    cr_assert(all_zero(h, 1000));
    memset(h, 1, 1000);
    cr_assert_eq(pst_device_live_bytes(dev), 0);
    pst_device_free_host(dev, h);
    pst_runtime_free(rt);
}

typedef struct alloc_worker {
    pst_device *dev;
    size_t bytes;
    pst_status st;
} alloc_worker;

static void *alloc_worker_main(void *arg)
{
    alloc_worker *w = arg;
    for (int i = 0; i < 1000 && w->st == PST_OK; i++) {
        void *p;
        w->st = pst_device_alloc(w->dev, w->bytes, &p);
        pst_device_free(w->dev, p);
    }
    return NULL;
}

Test(device_alloc, counters_are_exact_under_concurrency)
{
    pst_runtime *rt = make_rt("cpu");
    pst_device *dev = pst_runtime_device(rt, 0);
    pthread_t th[4];
    alloc_worker w[4];
    size_t sum = 0;
    for (int i = 0; i < 4; i++) {
        w[i] = (alloc_worker){.dev = dev, .bytes = (size_t)(i + 1) * 1000, .st = PST_OK};
        sum += w[i].bytes;
        pthread_create(&th[i], NULL, alloc_worker_main, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(w[i].st, PST_OK);
    }
    cr_assert_eq(pst_device_live_bytes(dev), 0);
    cr_assert_geq(pst_device_peak_bytes(dev), 4000);
    cr_assert_leq(pst_device_peak_bytes(dev), sum);
    pst_runtime_free(rt);
}

/* ---- FIFO order -------------------------------------------------------------------- */

#define ORDER_N 10000

typedef struct order_log {
    int n;
    int seen[ORDER_N];
} order_log;

typedef struct order_item {
    order_log *log;
    int value;
} order_item;

static pst_status order_fn(void *arg)
{
    order_item *it = arg;
    if (it->log->n < ORDER_N)
        it->log->seen[it->log->n] = it->value;
    it->log->n++;
    return PST_OK;
}

Test(device_stream, fifo_order_is_exact, .timeout = 30)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *s = make_stream(rt, 0);
    order_log *log = calloc(1, sizeof *log);
    order_item *items = calloc(ORDER_N, sizeof *items);
    for (int i = 0; i < ORDER_N; i++) {
        items[i] = (order_item){.log = log, .value = i};
        CHECK_OK(pst_stream_launch(s, order_fn, &items[i]));
    }
    CHECK_OK(pst_stream_synchronize(s));
    cr_assert_eq(log->n, ORDER_N);
    for (int i = 0; i < ORDER_N; i++)
        cr_assert_eq(log->seen[i], i, "item %d ran in position of %d", log->seen[i], i);
    pst_stream_destroy(s);
    free(items);
    free(log);
    pst_runtime_free(rt);
}

#define SUBMITTERS 4
#define PER_SUBMITTER 2500

typedef struct submitter {
    pst_stream *s;
    order_log *log;
    order_item items[PER_SUBMITTER];
    int id;
    pst_status st;
} submitter;

static void *submitter_main(void *arg)
{
    submitter *sub = arg;
    for (int i = 0; i < PER_SUBMITTER && sub->st == PST_OK; i++) {
        sub->items[i] = (order_item){.log = sub->log, .value = sub->id * PER_SUBMITTER + i};
        sub->st = pst_stream_launch(sub->s, order_fn, &sub->items[i]);
    }
    return NULL;
}

Test(device_stream, concurrent_submitters_keep_their_order, .timeout = 30)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *s = make_stream(rt, 0);
    order_log *log = calloc(1, sizeof *log);
    submitter *subs = calloc(SUBMITTERS, sizeof *subs);
    pthread_t th[SUBMITTERS];
    for (int t = 0; t < SUBMITTERS; t++) {
        subs[t].s = s;
        subs[t].log = log;
        subs[t].id = t;
        pthread_create(&th[t], NULL, submitter_main, &subs[t]);
    }
    for (int t = 0; t < SUBMITTERS; t++) {
        pthread_join(th[t], NULL);
        cr_assert_eq(subs[t].st, PST_OK);
    }
    CHECK_OK(pst_stream_synchronize(s));
    cr_assert_eq(log->n, SUBMITTERS * PER_SUBMITTER);
    int next[SUBMITTERS] = {0};
    for (int i = 0; i < log->n; i++) {
        int t = log->seen[i] / PER_SUBMITTER, k = log->seen[i] % PER_SUBMITTER;
        cr_assert_eq(k, next[t], "submitter %d: item %d ran before item %d", t, k, next[t]);
        next[t]++;
    }
    pst_stream_destroy(s);
    free(subs);
    free(log);
    pst_runtime_free(rt);
}

/* Synchronizes s and keeps what it returned: from a work item (self_sync_fn) or a thread. */
typedef struct self_sync {
    pst_stream *s;
    pst_status got;
} self_sync;

static pst_status self_sync_fn(void *arg)
{
    self_sync *ss = arg;
    ss->got = pst_stream_synchronize(ss->s);
    return PST_OK;
}

static void *self_sync_thread(void *arg)
{
    self_sync_fn(arg);
    return NULL;
}

/* Blocks until n threads wait in pst_stream_synchronize(s) (each has taken its point). */
static void wait_for_sync_waiters(pst_stream *s, int n)
{
    while (pst_stream_sync_waiters(s) < n)
        sleep_us(500);
}

/* Two threads synchronize one stream at different points of its queue: the one that came
 * first (a gate and 4 items in) returns while a gate after them is still shut, before the
 * later one's items ran; the later returns once they have. (The worker wakes callers only
 * when the lowest point any of them waits for is reached: a wake-up point kept for the
 * later caller alone would hang the first here.) Each caller is known to wait, with its
 * point taken, before the test goes on. */
Test(device_stream, synchronize_callers_wake_at_their_own_points, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *s = make_stream(rt, 0);
    gate g1, g2;
    gate_init(&g1);
    gate_init(&g2);
    int count = 0;
    CHECK_OK(pst_stream_launch(s, gate_fn, &g1));
    for (int i = 0; i < 4; i++)
        CHECK_OK(pst_stream_launch(s, inc_fn, &count));
    self_sync first = {.s = s, .got = PST_ERR_INTERNAL}, later = first;
    pthread_t t_first, t_later;
    pthread_create(&t_first, NULL, self_sync_thread, &first);
    wait_for_sync_waiters(s, 1);
    CHECK_OK(pst_stream_launch(s, gate_fn, &g2));
    for (int i = 0; i < 4; i++)
        CHECK_OK(pst_stream_launch(s, inc_fn, &count));
    pthread_create(&t_later, NULL, self_sync_thread, &later);
    wait_for_sync_waiters(s, 2);
    gate_open(&g1);
    pthread_join(t_first, NULL); /* hangs (the timeout fails the test) if never woken */
    cr_assert_eq(first.got, PST_OK);
    gate_wait_entered(&g2);
    cr_assert_eq(count, 4, "the first caller's items ran: %d", count);
    gate_open(&g2);
    pthread_join(t_later, NULL);
    cr_assert_eq(later.got, PST_OK);
    cr_assert_eq(count, 8, "the later caller returned after %d of 8 items", count);
    cr_assert_eq(pst_stream_sync_waiters(s), 0);
    cr_assert_eq(pst_stream_sync_waiters(NULL), -1);
    pst_stream_destroy(s);
    pst_runtime_free(rt);
}

/* ---- events across streams --------------------------------------------------------- */

typedef struct slow_write {
    int *dst;
    int value;
    unsigned delay_us;
} slow_write;

static pst_status slow_write_fn(void *arg)
{
    slow_write *w = arg;
    sleep_us(w->delay_us);
    *w->dst = w->value;
    return PST_OK;
}

typedef struct copy_int {
    int *dst;
    const int *src;
} copy_int;

static pst_status copy_int_fn(void *arg)
{
    copy_int *c = arg;
    *c->dst = *c->src;
    return PST_OK;
}

/* B waits on an event recorded in A after a slow item; B must read A's result. */
static void check_wait_sees_result(int dev_a, int dev_b)
{
    pst_runtime *rt = make_rt("cpu:2");
    pst_stream *a = make_stream(rt, dev_a), *b = make_stream(rt, dev_b);
    pst_event *ev = make_event(rt, dev_a);
    for (int round = 1; round <= 5; round++) {
        int x = 0, y = -1;
        slow_write w = {.dst = &x, .value = 40 + round, .delay_us = 10000};
        copy_int c = {.dst = &y, .src = &x};
        CHECK_OK(pst_stream_launch(a, slow_write_fn, &w));
        CHECK_OK(pst_event_record(ev, a));
        CHECK_OK(pst_stream_wait_event(b, ev));
        CHECK_OK(pst_stream_launch(b, copy_int_fn, &c));
        CHECK_OK(pst_stream_synchronize(b));
        cr_assert_eq(y, 40 + round, "B read %d before A wrote it", y);
        CHECK_OK(pst_stream_synchronize(a));
    }
    pst_event_destroy(ev);
    pst_stream_destroy(a);
    pst_stream_destroy(b);
    pst_runtime_free(rt);
}

Test(device_event, wait_sees_result_same_device, .timeout = 20)
{
    check_wait_sees_result(0, 0);
}

Test(device_event, wait_sees_result_across_devices, .timeout = 20)
{
    check_wait_sees_result(0, 1);
}

Test(device_event, wait_blocks_until_mark, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *a = make_stream(rt, 0), *b = make_stream(rt, 0);
    pst_event *ev = make_event(rt, 0);
    gate g;
    atomic_int ran = 0;
    gate_init(&g);
    CHECK_OK(pst_stream_launch(a, gate_fn, &g));
    CHECK_OK(pst_event_record(ev, a));
    CHECK_OK(pst_stream_wait_event(b, ev));
    CHECK_OK(pst_stream_launch(b, set_flag_fn, &ran));
    gate_wait_entered(&g);
    cr_assert_eq(pst_event_query(ev), 0);
    sleep_us(20000); /* gives a wrong B time to run */
    cr_assert_eq(atomic_load(&ran), 0, "B ran before the event's mark was reached");
    cr_assert_eq(pst_event_query(ev), 0);
    gate_open(&g);
    CHECK_OK(pst_stream_synchronize(b));
    cr_assert_eq(atomic_load(&ran), 1);
    cr_assert_eq(pst_event_query(ev), 1);
    pst_event_destroy(ev);
    pst_stream_destroy(a);
    pst_stream_destroy(b);
    pst_runtime_free(rt);
}

/* Re-recording moves the mark for later calls; a wait already queued keeps the old one. */
Test(device_event, rerecord_moves_mark_but_not_queued_waits, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *a = make_stream(rt, 0), *b = make_stream(rt, 0), *c = make_stream(rt, 0);
    pst_event *ev = make_event(rt, 0);
    gate g;
    atomic_int ran = 0;
    gate_init(&g);
    CHECK_OK(pst_stream_launch(a, gate_fn, &g));
    CHECK_OK(pst_event_record(ev, a));              /* mark 1: behind the gate */
    CHECK_OK(pst_stream_wait_event(b, ev));         /* B captures mark 1 */
    CHECK_OK(pst_stream_launch(b, set_flag_fn, &ran));
    CHECK_OK(pst_event_record(ev, c));              /* mark 2: on an idle stream */
    gate_wait_entered(&g);
    /* The event now stands for mark 2, which is reached although A is still blocked. */
    CHECK_OK(pst_event_synchronize(ev));
    cr_assert_eq(pst_event_query(ev), 1);
    sleep_us(20000);
    cr_assert_eq(atomic_load(&ran), 0, "a queued wait followed the re-recorded mark");
    gate_open(&g);
    CHECK_OK(pst_stream_synchronize(b));
    cr_assert_eq(atomic_load(&ran), 1);
    pst_event_destroy(ev);
    pst_stream_destroy(a);
    pst_stream_destroy(b);
    pst_stream_destroy(c);
    pst_runtime_free(rt);
}

/* Re-recording behind pending work makes later waits and queries follow the new mark. */
Test(device_event, rerecord_later_mark_is_waited_for, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *a = make_stream(rt, 0), *b = make_stream(rt, 0);
    pst_event *ev = make_event(rt, 0);
    gate g;
    atomic_int ran = 0;
    gate_init(&g);
    CHECK_OK(pst_event_record(ev, a)); /* mark 1: reached at once */
    CHECK_OK(pst_event_synchronize(ev));
    cr_assert_eq(pst_event_query(ev), 1);
    CHECK_OK(pst_stream_launch(a, gate_fn, &g));
    CHECK_OK(pst_event_record(ev, a)); /* mark 2: behind the gate */
    gate_wait_entered(&g);
    cr_assert_eq(pst_event_query(ev), 0, "query still reports the old mark");
    CHECK_OK(pst_stream_wait_event(b, ev));
    CHECK_OK(pst_stream_launch(b, set_flag_fn, &ran));
    sleep_us(20000);
    cr_assert_eq(atomic_load(&ran), 0, "a wait used the old mark");
    gate_open(&g);
    CHECK_OK(pst_event_synchronize(ev));
    CHECK_OK(pst_stream_synchronize(b));
    cr_assert_eq(atomic_load(&ran), 1);
    pst_event_destroy(ev);
    pst_stream_destroy(a);
    pst_stream_destroy(b);
    pst_runtime_free(rt);
}

Test(device_event, never_recorded_does_not_wait, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *a = make_stream(rt, 0), *b = make_stream(rt, 0);
    pst_event *ev = make_event(rt, 0);
    gate g;
    atomic_int ran = 0;
    gate_init(&g);
    cr_assert_eq(pst_event_query(ev), 1);
    CHECK_OK(pst_event_synchronize(ev));
    /* A is busy; an unrecorded event must not tie B to it (or to anything). */
    CHECK_OK(pst_stream_launch(a, gate_fn, &g));
    gate_wait_entered(&g);
    CHECK_OK(pst_stream_wait_event(b, ev));
    CHECK_OK(pst_stream_launch(b, set_flag_fn, &ran));
    CHECK_OK(pst_stream_synchronize(b));
    cr_assert_eq(atomic_load(&ran), 1);
    gate_open(&g);
    pst_event_destroy(ev);
    pst_stream_destroy(a);
    pst_stream_destroy(b);
    pst_runtime_free(rt);
}

Test(device_event, query_and_synchronize, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *a = make_stream(rt, 0);
    pst_event *ev = make_event(rt, 0);
    gate g;
    int x = 0;
    slow_write w = {.dst = &x, .value = 7, .delay_us = 0};
    gate_init(&g);
    CHECK_OK(pst_stream_launch(a, gate_fn, &g));
    CHECK_OK(pst_stream_launch(a, slow_write_fn, &w));
    CHECK_OK(pst_event_record(ev, a));
    gate_wait_entered(&g);
    cr_assert_eq(pst_event_query(ev), 0);
    gate_open(&g);
    CHECK_OK(pst_event_synchronize(ev));
    cr_assert_eq(pst_event_query(ev), 1);
    cr_assert_eq(x, 7, "work before the mark had not run when it was reached");
    pst_event_destroy(ev);
    pst_stream_destroy(a);
    pst_runtime_free(rt);
}

/* A wait keeps the mark it captured even when the event is destroyed meanwhile. */
Test(device_event, destroy_with_pending_wait, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *a = make_stream(rt, 0), *b = make_stream(rt, 0);
    pst_event *ev = make_event(rt, 0);
    gate g;
    atomic_int ran = 0;
    gate_init(&g);
    CHECK_OK(pst_stream_launch(a, gate_fn, &g));
    CHECK_OK(pst_event_record(ev, a));
    CHECK_OK(pst_stream_wait_event(b, ev));
    CHECK_OK(pst_stream_launch(b, set_flag_fn, &ran));
    pst_event_destroy(ev);
    gate_wait_entered(&g);
    sleep_us(10000);
    cr_assert_eq(atomic_load(&ran), 0);
    gate_open(&g);
    CHECK_OK(pst_stream_synchronize(b));
    cr_assert_eq(atomic_load(&ran), 1);
    pst_stream_destroy(a);
    pst_stream_destroy(b);
    pst_runtime_free(rt);
}

/* ---- copies ------------------------------------------------------------------------ */

typedef struct byte_probe {
    const unsigned char *src;
    unsigned char seen;
} byte_probe;

static pst_status byte_probe_fn(void *arg)
{
    byte_probe *p = arg;
    p->seen = p->src[0];
    return PST_OK;
}

Test(device_copy, memcpy_and_memset_async, .timeout = 20)
{
    enum { N = 3000 };
    pst_runtime *rt = make_rt("cpu");
    pst_device *dev = pst_runtime_device(rt, 0);
    pst_stream *s = make_stream(rt, 0);
    unsigned char *d1, *d2, *h_in, *h_out;
    CHECK_OK(pst_device_alloc(dev, N, (void **)&d1));
    CHECK_OK(pst_device_alloc(dev, N, (void **)&d2));
    CHECK_OK(pst_device_alloc_host(dev, N, (void **)&h_in));
    CHECK_OK(pst_device_alloc_host(dev, N, (void **)&h_out));
    for (int i = 0; i < N; i++)
        h_in[i] = (unsigned char)(i * 7 + 3);

    CHECK_OK(pst_memset_async(s, d1, 0x5a, N));
    byte_probe probe = {.src = d1};
    CHECK_OK(pst_stream_launch(s, byte_probe_fn, &probe)); /* sees the memset */
    CHECK_OK(pst_memcpy_async(s, d1, h_in, N, PST_COPY_HOST_TO_DEVICE));
    CHECK_OK(pst_memcpy_async(s, d2, d1, N, PST_COPY_DEVICE_TO_DEVICE));
    CHECK_OK(pst_memset_async(s, d2 + 100, 0x1ff, 50)); /* value is cast to a byte */
    CHECK_OK(pst_memcpy_async(s, h_out, d2, N, PST_COPY_DEVICE_TO_HOST));
    CHECK_OK(pst_memcpy_async(s, NULL, NULL, 0, PST_COPY_HOST_TO_HOST)); /* no-op */
    CHECK_OK(pst_memset_async(s, NULL, 0, 0));
    CHECK_OK(pst_stream_synchronize(s));

    cr_assert_eq(probe.seen, 0x5a);
    for (int i = 0; i < N; i++) {
        unsigned char want = (i >= 100 && i < 150) ? 0xff : (unsigned char)(i * 7 + 3);
        cr_assert_eq(h_out[i], want, "byte %d: %#x, want %#x", i, h_out[i], want);
    }

    CHECK_ERR(pst_memcpy_async(s, d1 + 10, d1, 20, PST_COPY_DEVICE_TO_DEVICE),
              PST_ERR_INVALID); /* overlap */
    CHECK_ERR(pst_memcpy_async(s, d1, d1 + 10, 20, PST_COPY_DEVICE_TO_DEVICE),
              PST_ERR_INVALID);
    CHECK_ERR(pst_memcpy_async(s, d1, d2, 20, (pst_copy_kind)99), PST_ERR_INVALID);
    CHECK_ERR(pst_memcpy_async(s, NULL, d2, 20, PST_COPY_DEVICE_TO_DEVICE), PST_ERR_INVALID);
    CHECK_ERR(pst_memcpy_async(s, d1, NULL, 20, PST_COPY_DEVICE_TO_DEVICE), PST_ERR_INVALID);
    CHECK_ERR(pst_memset_async(s, NULL, 0, 20), PST_ERR_INVALID);
    CHECK_ERR(pst_memcpy_async(NULL, d1, d2, 20, PST_COPY_DEVICE_TO_DEVICE), PST_ERR_INVALID);
    CHECK_ERR(pst_memset_async(NULL, d1, 0, 20), PST_ERR_INVALID);

    pst_stream_destroy(s);
    pst_device_free(dev, d1);
    pst_device_free(dev, d2);
    pst_device_free_host(dev, h_in);
    pst_device_free_host(dev, h_out);
    pst_runtime_free(rt);
}

/* Device 0 fills a buffer, device 1 copies it out after waiting on device 0's event. */
Test(device_copy, copies_across_streams_follow_events, .timeout = 20)
{
    enum { N = 1 << 16 };
    pst_runtime *rt = make_rt("cpu:2");
    pst_device *d0 = pst_runtime_device(rt, 0);
    pst_stream *a = make_stream(rt, 0), *b = make_stream(rt, 1);
    pst_event *ev = make_event(rt, 0);
    unsigned char *dbuf, *h;
    slow_write delay = {.dst = &(int){0}, .value = 1, .delay_us = 10000};
    CHECK_OK(pst_device_alloc(d0, N, (void **)&dbuf));
    CHECK_OK(pst_device_alloc_host(d0, N, (void **)&h));
    for (int round = 1; round <= 3; round++) {
        CHECK_OK(pst_stream_launch(a, slow_write_fn, &delay));
        CHECK_OK(pst_memset_async(a, dbuf, round, N));
        CHECK_OK(pst_event_record(ev, a));
        CHECK_OK(pst_stream_wait_event(b, ev));
        CHECK_OK(pst_memcpy_async(b, h, dbuf, N, PST_COPY_DEVICE_TO_HOST));
        CHECK_OK(pst_stream_synchronize(b));
        for (int i = 0; i < N; i++)
            cr_assert_eq(h[i], round, "round %d byte %d is %d", round, i, h[i]);
    }
    pst_event_destroy(ev);
    pst_stream_destroy(a);
    pst_stream_destroy(b);
    pst_device_free(d0, dbuf);
    pst_device_free_host(d0, h);
    pst_runtime_free(rt);
}

/* ---- sticky errors ----------------------------------------------------------------- */

static pst_status fail_fn(void *arg)
{
    return pst_error_set(PST_ERR_IO, "disk on fire %d", *(int *)arg);
}

static pst_status fail_silently_fn(void *arg)
{
    (void)arg;
    return PST_ERR_INTERNAL;
}

/* Succeeds but leaves a detail behind on the worker thread. */
static pst_status stale_detail_fn(void *arg)
{
    (void)arg;
    pst_error_set(PST_ERR_IO, "stale detail");
    return PST_OK;
}

Test(device_error, first_error_is_sticky_with_detail, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu");
    pst_device *dev = pst_runtime_device(rt, 0);
    pst_stream *s = make_stream(rt, 0);
    pst_event *ev = make_event(rt, 0);
    int count = 0, seven = 7, eight = 8;
    unsigned char *buf;
    CHECK_OK(pst_device_alloc(dev, 64, (void **)&buf));

    CHECK_OK(pst_stream_launch(s, inc_fn, &count));
    CHECK_OK(pst_stream_launch(s, fail_fn, &seven));
    CHECK_OK(pst_stream_launch(s, inc_fn, &count));    /* skipped */
    CHECK_OK(pst_stream_launch(s, fail_fn, &eight));   /* skipped: not the first error */
    CHECK_OK(pst_memset_async(s, buf, 1, 64));          /* skipped */
    CHECK_OK(pst_event_record(ev, s));                  /* reached, carries the error */

    pst_error_clear();
    cr_assert_eq(pst_stream_synchronize(s), PST_ERR_IO);
    const char *d = pst_error_detail();
    cr_assert(strstr(d, "disk on fire 7") != NULL, "detail: %s", d);
    cr_assert(strstr(d, "cpu:0") != NULL, "detail does not name the device: %s", d);
    cr_assert_eq(count, 1);
    cr_assert(all_zero(buf, 64), "a memset after the error ran");

    pst_error_clear();
    cr_assert_eq(pst_event_synchronize(ev), PST_ERR_IO);
    cr_assert(strstr(pst_error_detail(), "disk on fire 7") != NULL, "%s", pst_error_detail());
    cr_assert_eq(pst_event_query(ev), 1);

    /* Still sticky: new work is accepted and skipped; the first error stays. */
    CHECK_OK(pst_stream_launch(s, inc_fn, &count));
    pst_error_clear();
    cr_assert_eq(pst_stream_synchronize(s), PST_ERR_IO);
    cr_assert(strstr(pst_error_detail(), "disk on fire 7") != NULL, "%s", pst_error_detail());
    cr_assert_eq(count, 1);

    pst_event_destroy(ev);
    pst_stream_destroy(s);
    pst_device_free(dev, buf);
    pst_runtime_free(rt);
}

Test(device_error, error_without_detail_gets_one, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *s = make_stream(rt, 0);
    CHECK_OK(pst_stream_launch(s, stale_detail_fn, NULL));
    CHECK_OK(pst_stream_launch(s, fail_silently_fn, NULL));
    pst_error_clear();
    cr_assert_eq(pst_stream_synchronize(s), PST_ERR_INTERNAL);
    cr_assert(strstr(pst_error_detail(), pst_strerror(PST_ERR_INTERNAL)) != NULL, "%s",
              pst_error_detail());
    cr_assert(strstr(pst_error_detail(), "stale") == NULL,
              "an earlier item's detail leaked: %s", pst_error_detail());
    pst_stream_destroy(s);
    pst_runtime_free(rt);
}

Test(device_error, other_streams_are_unaffected, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu:2");
    pst_stream *bad = make_stream(rt, 0), *good = make_stream(rt, 1);
    int count = 0, seven = 7;
    CHECK_OK(pst_stream_launch(bad, fail_fn, &seven));
    CHECK_OK(pst_stream_launch(good, inc_fn, &count));
    cr_assert_eq(pst_stream_synchronize(bad), PST_ERR_IO);
    CHECK_OK(pst_stream_synchronize(good));
    cr_assert_eq(count, 1);
    pst_stream_destroy(bad);
    pst_stream_destroy(good);
    pst_runtime_free(rt);
}

Test(device_error, waiting_on_a_failed_stream_fails, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu:2");
    pst_stream *a = make_stream(rt, 0), *b = make_stream(rt, 1);
    pst_event *ev = make_event(rt, 0);
    int count = 0, seven = 7;
    CHECK_OK(pst_stream_launch(a, fail_fn, &seven));
    CHECK_OK(pst_event_record(ev, a));
    CHECK_OK(pst_stream_wait_event(b, ev));
    CHECK_OK(pst_stream_launch(b, inc_fn, &count));
    pst_error_clear();
    cr_assert_eq(pst_stream_synchronize(b), PST_ERR_IO);
    cr_assert(strstr(pst_error_detail(), "disk on fire 7") != NULL, "%s", pst_error_detail());
    cr_assert_eq(count, 0, "work after a wait on a failed stream ran");
    pst_event_destroy(ev);
    pst_stream_destroy(a);
    pst_stream_destroy(b);
    pst_runtime_free(rt);
}

Test(device_error, synchronize_from_own_item_is_refused, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *s = make_stream(rt, 0);
    self_sync ss = {.s = s, .got = PST_OK};
    CHECK_OK(pst_stream_launch(s, self_sync_fn, &ss));
    CHECK_OK(pst_stream_synchronize(s));
    cr_assert_eq(ss.got, PST_ERR_STATE, "got %s", pst_strerror(ss.got));
    pst_stream_destroy(s);
    pst_runtime_free(rt);
}

/* ---- no lost work ------------------------------------------------------------------ */

#define LW_DEVICES 4
#define LW_PER_DEVICE 3
#define LW_STREAMS (LW_DEVICES * LW_PER_DEVICE)
#define LW_ITEMS 2000
#define LW_EVERY 250

typedef struct lost_work {
    pst_stream *streams[LW_STREAMS];
    pst_event *events[LW_STREAMS];
    int counts[LW_STREAMS]; /* plain ints: items of one stream must never overlap */
    atomic_int total;
} lost_work;

typedef struct lw_arg {
    lost_work *lw;
    int stream;
} lw_arg;

static pst_status lw_fn(void *arg)
{
    lw_arg *a = arg;
    a->lw->counts[a->stream]++;
    atomic_fetch_add(&a->lw->total, 1);
    return PST_OK;
}

typedef struct lw_submitter {
    lost_work *lw;
    lw_arg args[LW_PER_DEVICE];
    int first; /* first stream index owned */
    pst_status st;
} lw_submitter;

static void *lw_submitter_main(void *arg)
{
    lw_submitter *sub = arg;
    lost_work *lw = sub->lw;
    for (int i = 0; i < LW_ITEMS && sub->st == PST_OK; i++) {
        for (int k = 0; k < LW_PER_DEVICE && sub->st == PST_OK; k++) {
            int sid = sub->first + k;
            sub->st = pst_stream_launch(lw->streams[sid], lw_fn, &sub->args[k]);
            if (sub->st == PST_OK && i % LW_EVERY == LW_EVERY - 1) {
                sub->st = pst_event_record(lw->events[sid], lw->streams[sid]);
                if (sub->st == PST_OK)
                    sub->st = pst_stream_wait_event(lw->streams[sid],
                                                    lw->events[(sid + 1) % LW_STREAMS]);
            }
        }
    }
    return NULL;
}

Test(device_stream, no_lost_work, .timeout = 30)
{
    pst_runtime *rt = make_rt("cpu:4");
    lost_work *lw = calloc(1, sizeof *lw);
    lw_submitter subs[LW_DEVICES];
    pthread_t th[LW_DEVICES];
    for (int s = 0; s < LW_STREAMS; s++) {
        lw->streams[s] = make_stream(rt, s / LW_PER_DEVICE);
        lw->events[s] = make_event(rt, s / LW_PER_DEVICE);
    }
    for (int t = 0; t < LW_DEVICES; t++) {
        subs[t].lw = lw;
        subs[t].first = t * LW_PER_DEVICE;
        subs[t].st = PST_OK;
        for (int k = 0; k < LW_PER_DEVICE; k++)
            subs[t].args[k] = (lw_arg){.lw = lw, .stream = t * LW_PER_DEVICE + k};
        pthread_create(&th[t], NULL, lw_submitter_main, &subs[t]);
    }
    for (int t = 0; t < LW_DEVICES; t++) {
        pthread_join(th[t], NULL);
        cr_assert_eq(subs[t].st, PST_OK, "%s", pst_strerror(subs[t].st));
    }
    for (int s = 0; s < LW_STREAMS; s++)
        CHECK_OK(pst_stream_synchronize(lw->streams[s]));
    for (int s = 0; s < LW_STREAMS; s++)
        cr_assert_eq(lw->counts[s], LW_ITEMS, "stream %d ran %d items", s, lw->counts[s]);
    cr_assert_eq(atomic_load(&lw->total), LW_STREAMS * LW_ITEMS);
    for (int s = 0; s < LW_STREAMS; s++) {
        pst_event_destroy(lw->events[s]);
        pst_stream_destroy(lw->streams[s]);
    }
    free(lw);
    pst_runtime_free(rt);
}

/* ---- shutdown ---------------------------------------------------------------------- */

typedef struct slow_inc {
    int *count;
    unsigned delay_us;
} slow_inc;

static pst_status slow_inc_fn(void *arg)
{
    slow_inc *si = arg;
    sleep_us(si->delay_us);
    (*si->count)++;
    return PST_OK;
}

Test(device_shutdown, stream_destroy_drains, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu");
    pst_stream *s = make_stream(rt, 0);
    int count = 0;
    slow_inc si = {.count = &count, .delay_us = 100};
    for (int i = 0; i < 200; i++)
        CHECK_OK(pst_stream_launch(s, slow_inc_fn, &si));
    pst_stream_destroy(s);
    cr_assert_eq(count, 200);
    pst_stream_destroy(NULL);
    pst_runtime_free(rt);
}

/* Streams and events left alive are drained and freed by pst_runtime_free, including a
 * stream whose queue waits on another stream's slow work. */
Test(device_shutdown, runtime_free_drains, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu:2");
    int counts[4] = {0};
    slow_inc si[4];
    pst_stream *s[4];
    pst_event *ev[2];
    for (int i = 0; i < 4; i++) {
        s[i] = make_stream(rt, i % 2);
        si[i] = (slow_inc){.count = &counts[i], .delay_us = 50};
    }
    ev[0] = make_event(rt, 0);
    ev[1] = make_event(rt, 1);
    for (int i = 0; i < 100; i++) {
        for (int k = 0; k < 4; k++)
            CHECK_OK(pst_stream_launch(s[k], slow_inc_fn, &si[k]));
        if (i % 10 == 9) {
            CHECK_OK(pst_event_record(ev[0], s[0]));
            CHECK_OK(pst_stream_wait_event(s[3], ev[0]));
            CHECK_OK(pst_event_record(ev[1], s[1]));
            CHECK_OK(pst_stream_wait_event(s[2], ev[1]));
        }
    }
    pst_runtime_free(rt);
    for (int k = 0; k < 4; k++)
        cr_assert_eq(counts[k], 100, "stream %d ran %d of 100 items", k, counts[k]);
}

/* ---- injected random delays -------------------------------------------------------- */

#define JC_STAGES 4
#define JC_ROUNDS 40

typedef struct jitter_chain {
    int vals[JC_ROUNDS][JC_STAGES];
    atomic_int violations; /* a stage found its input not yet written */
} jitter_chain;

typedef struct jc_arg {
    jitter_chain *jc;
    int round, stage;
} jc_arg;

static int jc_expected(int round, int stage)
{
    int v = round * 10 + 1;
    for (int k = 1; k <= stage; k++)
        v = v * 2 + k;
    return v;
}

static pst_status jc_fn(void *arg)
{
    jc_arg *a = arg;
    int r = a->round, k = a->stage;
    if (k == 0) {
        a->jc->vals[r][0] = r * 10 + 1;
        return PST_OK;
    }
    int in = a->jc->vals[r][k - 1];
    if (in != jc_expected(r, k - 1))
        atomic_fetch_add(&a->jc->violations, 1);
    a->jc->vals[r][k] = in * 2 + k;
    return PST_OK;
}

/* Stage k of each round runs on stream k (alternating devices) after waiting on stage
 * k-1's event; each stream re-records one event every round. Random delays before every
 * item shuffle the timing; the result must not change. */
static void run_jitter_chain(uint64_t seed, unsigned max_us)
{
    pst_runtime *rt = make_rt("cpu:2");
    pst_stream *s[JC_STAGES];
    pst_event *ev[JC_STAGES];
    jitter_chain *jc = calloc(1, sizeof *jc);
    jc_arg *args = calloc(JC_ROUNDS * JC_STAGES, sizeof *args);
    pst_runtime_set_jitter(rt, seed, max_us);
    for (int k = 0; k < JC_STAGES; k++) {
        s[k] = make_stream(rt, k % 2);
        ev[k] = make_event(rt, k % 2);
    }
    for (int r = 0; r < JC_ROUNDS; r++) {
        for (int k = 0; k < JC_STAGES; k++) {
            jc_arg *a = &args[r * JC_STAGES + k];
            *a = (jc_arg){.jc = jc, .round = r, .stage = k};
            if (k > 0)
                CHECK_OK(pst_stream_wait_event(s[k], ev[k - 1]));
            CHECK_OK(pst_stream_launch(s[k], jc_fn, a));
            CHECK_OK(pst_event_record(ev[k], s[k]));
        }
    }
    /* The last stage's event covers the whole chain. */
    CHECK_OK(pst_event_synchronize(ev[JC_STAGES - 1]));
    for (int k = 0; k < JC_STAGES; k++)
        CHECK_OK(pst_stream_synchronize(s[k]));
    cr_assert_eq(atomic_load(&jc->violations), 0, "seed %llu: %d stages ran early",
                 (unsigned long long)seed, atomic_load(&jc->violations));
    for (int r = 0; r < JC_ROUNDS; r++)
        for (int k = 0; k < JC_STAGES; k++)
            cr_assert_eq(jc->vals[r][k], jc_expected(r, k), "seed %llu round %d stage %d",
                         (unsigned long long)seed, r, k);
    for (int k = 0; k < JC_STAGES; k++) {
        pst_event_destroy(ev[k]);
        pst_stream_destroy(s[k]);
    }
    free(args);
    free(jc);
    pst_runtime_free(rt);
}

Test(device_jitter, dependency_chain_across_seeds, .timeout = 30)
{
    for (uint64_t seed = 1; seed <= 6; seed++)
        run_jitter_chain(seed, 300);
    run_jitter_chain(7, 0); /* jitter off */
}

Test(device_jitter, hook_can_be_changed_and_ignores_null, .timeout = 20)
{
    pst_runtime_set_jitter(NULL, 1, 100);
    pst_runtime *rt = make_rt("cpu");
    pst_stream *s = make_stream(rt, 0);
    int count = 0;
    pst_runtime_set_jitter(rt, 42, 200);
    for (int i = 0; i < 20; i++)
        CHECK_OK(pst_stream_launch(s, inc_fn, &count));
    CHECK_OK(pst_stream_synchronize(s));
    pst_runtime_set_jitter(rt, 43, 0);
    for (int i = 0; i < 20; i++)
        CHECK_OK(pst_stream_launch(s, inc_fn, &count));
    CHECK_OK(pst_stream_synchronize(s));
    cr_assert_eq(count, 40);
    pst_stream_destroy(s);
    pst_runtime_free(rt);
}

/* ---- argument checks --------------------------------------------------------------- */

Test(device_args, null_and_invalid_arguments)
{
    pst_runtime *rt = make_rt("cpu:2");
    pst_device *d0 = pst_runtime_device(rt, 0);
    pst_stream *s = make_stream(rt, 0), *out_s = (pst_stream *)&out_s;
    pst_event *ev = make_event(rt, 0), *out_ev = (pst_event *)&out_ev;

    CHECK_ERR(pst_stream_create(NULL, &out_s), PST_ERR_INVALID);
    cr_assert_null(out_s);
    CHECK_ERR(pst_stream_create(d0, NULL), PST_ERR_INVALID);
    CHECK_ERR(pst_stream_launch(NULL, inc_fn, NULL), PST_ERR_INVALID);
    CHECK_ERR(pst_stream_launch(s, NULL, NULL), PST_ERR_INVALID);
    CHECK_ERR(pst_stream_synchronize(NULL), PST_ERR_INVALID);
    CHECK_ERR(pst_event_create(NULL, &out_ev), PST_ERR_INVALID);
    cr_assert_null(out_ev);
    CHECK_ERR(pst_event_create(d0, NULL), PST_ERR_INVALID);
    CHECK_ERR(pst_event_record(NULL, s), PST_ERR_INVALID);
    CHECK_ERR(pst_event_record(ev, NULL), PST_ERR_INVALID);
    CHECK_ERR(pst_stream_wait_event(NULL, ev), PST_ERR_INVALID);
    CHECK_ERR(pst_stream_wait_event(s, NULL), PST_ERR_INVALID);
    CHECK_ERR(pst_event_synchronize(NULL), PST_ERR_INVALID);
    cr_assert_eq(pst_event_query(NULL), 1);
    cr_assert_null(pst_stream_device(NULL));
    cr_assert_eq(pst_stream_device(s), d0);
    pst_stream_destroy(NULL);
    pst_event_destroy(NULL);

    /* Nothing was queued by the refused calls. */
    CHECK_OK(pst_stream_synchronize(s));
    pst_event_destroy(ev);
    pst_stream_destroy(s);
    pst_runtime_free(rt);
}

Test(device_args, events_and_streams_of_other_devices_and_runtimes, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu:2"), *other = make_rt("cpu");
    pst_stream *s0 = make_stream(rt, 0), *s1 = make_stream(rt, 1);
    pst_stream *os = make_stream(other, 0);
    pst_event *ev0 = make_event(rt, 0), *oev = make_event(other, 0);

    /* An event is recorded on its own device's streams only. */
    CHECK_ERR(pst_event_record(ev0, s1), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "cpu:1") != NULL, "%s", pst_error_detail());
    /* Any stream of the same runtime may wait on it. */
    CHECK_OK(pst_event_record(ev0, s0));
    CHECK_OK(pst_stream_wait_event(s1, ev0));
    /* Other runtimes: refused both ways. */
    CHECK_ERR(pst_event_record(ev0, os), PST_ERR_INVALID);
    CHECK_ERR(pst_event_record(oev, s0), PST_ERR_INVALID);
    CHECK_ERR(pst_stream_wait_event(os, ev0), PST_ERR_INVALID);
    CHECK_ERR(pst_stream_wait_event(s0, oev), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "runtime") != NULL, "%s", pst_error_detail());
    CHECK_OK(pst_stream_synchronize(s1));

    pst_event_destroy(ev0);
    pst_event_destroy(oev);
    pst_stream_destroy(s0);
    pst_stream_destroy(s1);
    pst_stream_destroy(os);
    pst_runtime_free(other);
    pst_runtime_free(rt);
}

/* ---- flags: waits the host releases ------------------------------------------------ */

static pst_flag *make_flag(pst_runtime *rt, int dev)
{
    pst_flag *f = NULL;
    CHECK_OK(pst_flag_create(pst_runtime_device(rt, dev), &f));
    cr_assert_not_null(f);
    return f;
}

/* Work after a flag wait runs only once the host raised the value far enough; a smaller
 * value does not release it; one signal releases every wait it covers. */
Test(device_flag, wait_until_the_value_is_reached, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu:1");
    pst_stream *s = make_stream(rt, 0);
    pst_flag *f = make_flag(rt, 0);
    pst_event *after = make_event(rt, 0);
    int count = 0;
    CHECK_OK(pst_stream_wait_flag(s, f, 0)); /* value 0: no wait */
    CHECK_OK(pst_stream_wait_flag(s, f, 2));
    CHECK_OK(pst_stream_launch(s, inc_fn, &count));
    CHECK_OK(pst_stream_wait_flag(s, f, 3));
    CHECK_OK(pst_stream_launch(s, inc_fn, &count));
    CHECK_OK(pst_event_record(after, s));
    pst_flag_signal(f, 1, PST_OK, NULL);
    sleep_us(20000); /* room for a wrongly released wait to run */
    cr_assert_eq(pst_event_query(after), 0, "value 1 released a wait for 2");
    pst_flag_signal(f, 3, PST_OK, NULL);
    CHECK_OK(pst_stream_synchronize(s));
    cr_assert_eq(count, 2);
    pst_flag_signal(f, 2, PST_OK, NULL); /* smaller: ignored, nothing to release */
    CHECK_OK(pst_stream_wait_flag(s, f, 3));
    CHECK_OK(pst_stream_synchronize(s));
    pst_event_destroy(after);
    pst_stream_destroy(s);
    pst_flag_destroy(f);
    pst_runtime_free(rt);
}

/* A stream waiting on a flag holds no thread another stream needs: a second stream of the
 * same device runs and synchronizes meanwhile (a shared blocked thread would hang here). */
Test(device_flag, a_waiting_stream_does_not_block_others, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu:1");
    pst_stream *a = make_stream(rt, 0), *b = make_stream(rt, 0);
    pst_flag *f = make_flag(rt, 0);
    atomic_int ran = 0;
    int count = 0;
    CHECK_OK(pst_stream_wait_flag(a, f, 1));
    CHECK_OK(pst_stream_launch(a, set_flag_fn, &ran));
    CHECK_OK(pst_stream_launch(b, inc_fn, &count));
    CHECK_OK(pst_stream_synchronize(b));
    cr_assert_eq(count, 1);
    cr_assert_eq(atomic_load(&ran), 0, "ran before the signal");
    pst_flag_signal(f, 1, PST_OK, NULL);
    CHECK_OK(pst_stream_synchronize(a));
    cr_assert_eq(atomic_load(&ran), 1);
    pst_stream_destroy(a);
    pst_stream_destroy(b);
    pst_flag_destroy(f);
    pst_runtime_free(rt);
}

/* A failed signal fails the waiting stream with its detail, follows the events recorded
 * after the wait to other streams, and fails every later wait at once. */
Test(device_flag, failure_reaches_the_waiting_stream_and_its_dependents, .timeout = 20)
{
    pst_runtime *rt = make_rt("cpu:2");
    pst_stream *a = make_stream(rt, 0), *c = make_stream(rt, 1), *d = make_stream(rt, 0);
    pst_flag *f = make_flag(rt, 0);
    pst_event *after = make_event(rt, 0);
    int count = 0;
    CHECK_OK(pst_stream_wait_flag(a, f, 5));
    CHECK_OK(pst_stream_launch(a, inc_fn, &count));
    CHECK_OK(pst_event_record(after, a));
    CHECK_OK(pst_stream_wait_event(c, after));
    CHECK_OK(pst_stream_launch(c, inc_fn, &count));
    pst_flag_signal(f, 1, PST_ERR_IO, "pserver 10.0.0.1:7000 Pull: connection reset");
    cr_assert_eq(pst_stream_synchronize(a), PST_ERR_IO);
    cr_assert(strstr(pst_error_detail(), "connection reset"), "%s", pst_error_detail());
    cr_assert_eq(pst_stream_synchronize(c), PST_ERR_IO);
    cr_assert(strstr(pst_error_detail(), "connection reset"), "%s", pst_error_detail());
    cr_assert_eq(count, 0, "work after a failed wait ran");
    CHECK_OK(pst_stream_wait_flag(d, f, 100)); /* queued fine, fails when it runs */
    cr_assert_eq(pst_stream_synchronize(d), PST_ERR_IO);
    pst_event_destroy(after);
    pst_stream_destroy(a);
    pst_stream_destroy(c);
    pst_stream_destroy(d);
    pst_flag_destroy(f);
    pst_runtime_free(rt);
}

Test(device_flag, bad_arguments)
{
    pst_runtime *rt = make_rt("cpu:2");
    pst_stream *s = make_stream(rt, 1);
    pst_flag *f = make_flag(rt, 0);
    pst_flag *none = f;
    cr_assert_eq(pst_flag_create(NULL, &none), PST_ERR_INVALID);
    cr_assert_null(none);
    cr_assert_eq(pst_flag_create(pst_runtime_device(rt, 0), NULL), PST_ERR_INVALID);
    cr_assert_eq(pst_stream_wait_flag(NULL, f, 1), PST_ERR_INVALID);
    cr_assert_eq(pst_stream_wait_flag(s, NULL, 1), PST_ERR_INVALID);
    cr_assert_eq(pst_stream_wait_flag(s, f, 1), PST_ERR_INVALID, "flag of another device");
    cr_assert(strstr(pst_error_detail(), "cpu:0"), "%s", pst_error_detail());
    pst_flag_signal(NULL, 1, PST_OK, NULL); /* ignored */
    pst_flag_destroy(NULL);
    pst_stream_destroy(s);
    pst_flag_destroy(f);
    pst_runtime_free(rt);
}

static pst_status sleep_40ms(void *arg)
{
    (void)arg;
    sleep_us(40000);
    return PST_OK;
}

/* A stream's busy time counts the work it runs, not its waits: the time split's compute
 * (trainer/train.c) rests on it. Never compared with an upper wall-clock bound on the
 * work; the waiting stream's busy time must stay far below the 80 ms it waited. */
Test(device_stream, busy_time_counts_work_not_waits, .timeout = 30)
{
    pst_runtime *rt = make_rt("cpu:1");
    pst_stream *a = make_stream(rt, 0), *b = make_stream(rt, 0);
    pst_event *ev = make_event(rt, 0);
    cr_assert_eq(pst_stream_busy_seconds(a), 0.0);
    CHECK_OK(pst_stream_launch(a, sleep_40ms, NULL));
    CHECK_OK(pst_stream_launch(a, sleep_40ms, NULL));
    CHECK_OK(pst_event_record(ev, a));
    CHECK_OK(pst_stream_wait_event(b, ev)); /* b waits about 80 ms */
    CHECK_OK(pst_stream_synchronize(b));
    CHECK_OK(pst_stream_synchronize(a));
    const double busy_a = pst_stream_busy_seconds(a), busy_b = pst_stream_busy_seconds(b);
    cr_assert_geq(busy_a, 0.080, "a ran 2 x 40 ms of work but counts %.3f s", busy_a);
    cr_assert_lt(busy_b, 0.040, "b only waited, yet counts %.3f s busy", busy_b);
    cr_assert_eq(pst_stream_busy_seconds(NULL), -1.0);
    pst_event_destroy(ev);
    pst_stream_destroy(a);
    pst_stream_destroy(b);
    pst_runtime_free(rt);
}
