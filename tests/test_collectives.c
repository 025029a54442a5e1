/* test_collectives.c — reduce and broadcast among the devices of one runtime
 * (common/runtime/collectives.h).
 *
 * The host implementation on cpu:1, cpu:2 and cpu:4 runtimes: the reduce equals the
 * device-order sum ((b0 + b1) + b2) + ... bit for bit for every root and odd sizes (with
 * values spread over many binades, so another order would give other bits — checked);
 * broadcast copies the root's bits; both are ordered against other work on the streams
 * (work queued before is included, work queued after cannot disturb them), also under
 * injected random delays (pst_runtime_set_jitter) for several seeds; argument checks with
 * exact error codes. With CUDA built and a GPU present, the NCCL implementation is checked
 * against the same sums (within a tolerance: NCCL's order is its own); otherwise that test
 * is skipped with a visible "skipped: no GPU". Sleeps only make a race likely; no assertion
 * depends on timing. Also built with ThreadSanitizer (PST_TSAN_TESTS), which reports a sum
 * or copy that is not ordered after the writes it reads. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/runtime/collectives.h"
#include "common/runtime/collectives_impl.h" /* PST_COMM_HOST_SPLIT */
#include "common/runtime/device.h"
#include "common/error.h"
#include "common/rng.h"
#include "tests/check.h"

#define MAXD 4

static void sleep_us(unsigned us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* A runtime with one stream and one buffer of n floats per device, and a comm. */
typedef struct fixture {
    pst_runtime *rt;
    int D;
    size_t n;
    pst_stream *s[MAXD];
    float *buf[MAXD];
    pst_comm *comm;
} fixture;

static void fx_init(fixture *f, const char *spec, size_t n)
{
    memset(f, 0, sizeof *f);
    CHECK_OK(pst_runtime_init(&f->rt, spec));
    f->D = pst_runtime_count(f->rt);
    cr_assert(f->D <= MAXD);
    f->n = n;
    for (int d = 0; d < f->D; d++) {
        pst_device *dev = pst_runtime_device(f->rt, d);
        void *p = NULL;
        CHECK_OK(pst_stream_create(dev, &f->s[d]));
        CHECK_OK(pst_device_alloc(dev, (n ? n : 1) * sizeof(float), &p));
        f->buf[d] = p;
    }
    CHECK_OK(pst_comm_init(&f->comm, f->rt));
}

static void fx_sync(fixture *f)
{
    for (int d = 0; d < f->D; d++)
        CHECK_OK(pst_stream_synchronize(f->s[d]));
}

static void fx_free(fixture *f)
{
    fx_sync(f);
    pst_comm_free(f->comm);
    for (int d = 0; d < f->D; d++) {
        pst_device_free(pst_runtime_device(f->rt, d), f->buf[d]);
        pst_stream_destroy(f->s[d]);
    }
    pst_runtime_free(f->rt);
}

/* A value in +-[2^-20, 2^20): sums of such values depend on the order of the additions. */
static float spread(pst_rng *r)
{
    float u = pst_rng_uniform(r) * 2.0f - 1.0f;
    return ldexpf(u, (int)pst_rng_below(r, 41) - 20);
}

/* Deterministic value of element i of device d in round k (for host functions). */
static float value_at(uint64_t k, int d, size_t i)
{
    pst_rng r;
    pst_rng_seed(&r, k * 1000003u + (uint64_t)d, i);
    return spread(&r);
}

/* Fills every device buffer (the streams are idle) and keeps a copy in host[d]. */
static void fx_fill(fixture *f, uint64_t seed, float *host[MAXD])
{
    pst_rng r;
    pst_rng_seed(&r, seed, 7);
    for (int d = 0; d < f->D; d++)
        for (size_t i = 0; i < f->n; i++) {
            host[d][i] = spread(&r);
            f->buf[d][i] = host[d][i];
        }
}

/* out = ((in0 + in1) + in2) + ... */
static void device_order_sum(float *out, float *const in[], int D, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float acc = in[0][i];
        for (int d = 1; d < D; d++)
            acc += in[d][i];
        out[i] = acc;
    }
}

static void assert_bits(const float *got, const float *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t g, w;
        memcpy(&g, &got[i], 4);
        memcpy(&w, &want[i], 4);
        cr_assert_eq(g, w, "%s: element %zu is %a (0x%08x), want %a (0x%08x)", what, i,
                     (double)got[i], g, (double)want[i], w);
    }
}

static float *host_floats(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    cr_assert_not_null(p);
    return p;
}

/* ---- host functions queued on the streams ------------------------------------------ */

/* Sleeps, then writes value_at(k, d, .) into buf: "slow work queued before". */
typedef struct write_job {
    float *buf;
    size_t n;
    uint64_t k;
    int d;
    unsigned sleep_us;
} write_job;

static pst_status write_fn(void *arg)
{
    write_job *w = arg;
    if (w->sleep_us)
        sleep_us(w->sleep_us);
    for (size_t i = 0; i < w->n; i++)
        w->buf[i] = value_at(w->k, w->d, i);
    return PST_OK;
}

/* Counts the elements of buf that differ from the device-order sum of round k. */
typedef struct check_job {
    const float *buf;
    size_t n;
    uint64_t k;
    int D;
    atomic_int *mismatches;
} check_job;

static pst_status check_sum_fn(void *arg)
{
    check_job *c = arg;
    for (size_t i = 0; i < c->n; i++) {
        float acc = value_at(c->k, 0, i);
        for (int d = 1; d < c->D; d++)
            acc += value_at(c->k, d, i);
        if (memcmp(&acc, &c->buf[i], 4) != 0)
            atomic_fetch_add(c->mismatches, 1);
    }
    return PST_OK;
}

/* A work item that blocks its stream until the test opens it. */
typedef struct gate {
    atomic_int open;
} gate;

static pst_status gate_fn(void *arg)
{
    gate *g = arg;
    while (!atomic_load(&g->open))
        sleep_us(200);
    return PST_OK;
}

/* ---- reduce and broadcast results --------------------------------------------------- */

static const char *const specs[] = {"cpu:1", "cpu:2", "cpu:4"};
/* One size summed on the root's stream alone, one the host reduce splits over up to 4
 * members' streams (odd: the last slice is longer). */
#define SUMMED_ON_ROOT 513
#define SPLIT (4 * PST_COMM_HOST_SPLIT + 4099)
/* Odd; 4099 spans several chunks. */
static const size_t sizes[] = {1, 7, 1001, 4099, SPLIT};

Test(collectives_host, reduce_is_the_device_order_sum_for_every_root)
{
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        for (size_t zi = 0; zi < sizeof sizes / sizeof sizes[0]; zi++) {
            fixture f;
            fx_init(&f, specs[si], sizes[zi]);
            cr_assert_str_eq(pst_comm_name(f.comm), "host");
            float *host[MAXD], *want = host_floats(f.n);
            for (int d = 0; d < f.D; d++)
                host[d] = host_floats(f.n);
            for (int root = 0; root < f.D; root++) {
                fx_fill(&f, 100 * si + 10 * zi + (uint64_t)root, host);
                device_order_sum(want, host, f.D, f.n);
                CHECK_OK(pst_comm_reduce(f.comm, f.buf, f.n, root, f.s));
                fx_sync(&f);
                char what[64];
                snprintf(what, sizeof what, "%s n=%zu root=%d", specs[si], f.n, root);
                assert_bits(f.buf[root], want, f.n, what);
                for (int d = 0; d < f.D; d++)
                    if (d != root)
                        assert_bits(f.buf[d], host[d], f.n, "a non-root buffer changed");
            }
            for (int d = 0; d < f.D; d++)
                free(host[d]);
            free(want);
            fx_free(&f);
        }
    }
}

/* pst_comm_reduce_some: the members' buffers summed in device order into the root, the
 * others' buffers never read (NULL here) and unchanged where they exist; one member is its
 * own sum; a root that is not a member is refused. pst_comm_broadcast_some: only the
 * members written. */
static void check_reduce_some(size_t n)
{
    fixture f;
    fx_init(&f, "cpu:4", n);
    float *host[MAXD], *want = host_floats(f.n);
    for (int d = 0; d < f.D; d++)
        host[d] = host_floats(f.n);
    const uint64_t sets[] = {0x9, 0x6, 0xb, 0x4};
    for (size_t q = 0; q < sizeof sets / sizeof sets[0]; q++)
        for (int root = 0; root < f.D; root++) {
            if (!((sets[q] >> root) & 1u))
                continue;
            fx_fill(&f, 50 + 10 * q + (uint64_t)root, host);
            float *mine[MAXD] = {0}, *in[MAXD] = {0};
            int k = 0;
            for (int d = 0; d < f.D; d++)
                if ((sets[q] >> d) & 1u) {
                    mine[d] = f.buf[d];
                    in[k++] = host[d];
                }
            device_order_sum(want, in, k, f.n);
            CHECK_OK(pst_comm_reduce_some(f.comm, mine, f.n, root, f.s, sets[q]));
            fx_sync(&f);
            char what[64];
            snprintf(what, sizeof what, "members %#llx root %d", (unsigned long long)sets[q],
                     root);
            assert_bits(f.buf[root], want, f.n, what);
            for (int d = 0; d < f.D; d++)
                if (d != root)
                    assert_bits(f.buf[d], host[d], f.n, "another buffer changed");
        }
    /* Broadcast to some: the members get the root's bits, the others keep theirs. */
    fx_fill(&f, 77, host);
    void *some[MAXD] = {f.buf[0], NULL, f.buf[2], NULL};
    CHECK_OK(pst_comm_broadcast_some(f.comm, some, f.n * sizeof(float), 2, f.s, 0x5));
    fx_sync(&f);
    assert_bits(f.buf[0], host[2], f.n, "broadcast to a member");
    assert_bits(f.buf[2], host[2], f.n, "the root");
    assert_bits(f.buf[1], host[1], f.n, "a non-member written");
    assert_bits(f.buf[3], host[3], f.n, "a non-member written");
    float *none[MAXD] = {f.buf[0]};
    CHECK_ERR(pst_comm_reduce_some(f.comm, none, f.n, 1, f.s, 0x1), PST_ERR_INVALID);
    CHECK_ERR(pst_comm_reduce_some(f.comm, none, f.n, 0, f.s, 0x3), PST_ERR_INVALID); /* bufs[1] */
    for (int d = 0; d < f.D; d++)
        free(host[d]);
    free(want);
    fx_free(&f);
}

Test(collectives_host, reduce_over_some_devices_sums_only_them)
{
    check_reduce_some(SUMMED_ON_ROOT);
    check_reduce_some(SPLIT);
}

/* The data above would catch a wrong order: summing in reverse gives other bits. */
Test(collectives_host, test_data_distinguishes_orders)
{
    fixture f;
    fx_init(&f, "cpu:4", 1001);
    float *host[MAXD], *fwd = host_floats(f.n), *rev = host_floats(f.n);
    for (int d = 0; d < f.D; d++)
        host[d] = host_floats(f.n);
    fx_fill(&f, 7, host);
    device_order_sum(fwd, host, f.D, f.n);
    float *back[MAXD] = {host[3], host[2], host[1], host[0]};
    device_order_sum(rev, back, f.D, f.n);
    cr_assert_neq(memcmp(fwd, rev, f.n * sizeof(float)), 0,
                  "forward and reverse sums agree everywhere: the data is too tame");
    for (int d = 0; d < f.D; d++)
        free(host[d]);
    free(fwd);
    free(rev);
    fx_free(&f);
}

Test(collectives_host, broadcast_copies_the_root_bits)
{
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        fixture f;
        fx_init(&f, specs[si], 1001);
        float *host[MAXD];
        for (int d = 0; d < f.D; d++)
            host[d] = host_floats(f.n);
        for (int root = 0; root < f.D; root++) {
            fx_fill(&f, 50 + (uint64_t)root, host);
            CHECK_OK(pst_comm_broadcast(f.comm, f.buf, f.n, root, f.s));
            fx_sync(&f);
            for (int d = 0; d < f.D; d++)
                assert_bits(f.buf[d], host[root], f.n, "broadcast");
        }
        for (int d = 0; d < f.D; d++)
            free(host[d]);
        fx_free(&f);
    }
}

Test(collectives_host, zero_length_and_single_device_queue_nothing)
{
    fixture f;
    fx_init(&f, "cpu:2", 3);
    f.buf[0][0] = 1.0f;
    f.buf[1][0] = 2.0f;
    CHECK_OK(pst_comm_reduce(f.comm, f.buf, 0, 0, f.s));
    CHECK_OK(pst_comm_broadcast(f.comm, f.buf, 0, 1, f.s));
    fx_sync(&f);
    cr_assert_eq(f.buf[0][0], 1.0f);
    cr_assert_eq(f.buf[1][0], 2.0f);
    fx_free(&f);

    fx_init(&f, "cpu:1", 3);
    f.buf[0][1] = 5.0f;
    CHECK_OK(pst_comm_reduce(f.comm, f.buf, 3, 0, f.s));
    CHECK_OK(pst_comm_broadcast(f.comm, f.buf, 3, 0, f.s));
    fx_sync(&f);
    cr_assert_eq(f.buf[0][1], 5.0f);
    fx_free(&f);
}

/* ---- ordering against other work on the streams ----------------------------------- */

/* Slow writes queued before the reduce on non-root streams are part of the sum. */
static void check_reduce_after_earlier_work(size_t n)
{
    fixture f;
    fx_init(&f, "cpu:4", n);
    const int root = 1;
    write_job w[MAXD];
    for (int d = 0; d < f.D; d++) {
        w[d] = (write_job){.buf = f.buf[d], .n = f.n, .k = 3, .d = d,
                           .sleep_us = d == root ? 0 : 20000u * (unsigned)d};
        CHECK_OK(pst_stream_launch(f.s[d], write_fn, &w[d]));
    }
    CHECK_OK(pst_comm_reduce(f.comm, f.buf, f.n, root, f.s));
    atomic_int bad = 0;
    check_job c = {.buf = f.buf[root], .n = f.n, .k = 3, .D = f.D, .mismatches = &bad};
    CHECK_OK(pst_stream_launch(f.s[root], check_sum_fn, &c));
    fx_sync(&f);
    cr_assert_eq(atomic_load(&bad), 0, "%d elements miss a slow earlier write", bad);
    fx_free(&f);
}

Test(collectives_host, reduce_includes_work_queued_before, .timeout = 30)
{
    check_reduce_after_earlier_work(SUMMED_ON_ROOT);
    check_reduce_after_earlier_work(SPLIT);
}

/* A write queued after the reduce on a non-root stream waits until the sum has read the
 * buffer: the root stream is held by a gate so the sum runs late, and the write must not
 * overtake it. */
static void check_reduce_before_later_work(size_t n)
{
    fixture f;
    fx_init(&f, "cpu:4", n);
    for (int root = 0; root < f.D; root++) {
        float *host[MAXD], *want = host_floats(f.n);
        for (int d = 0; d < f.D; d++)
            host[d] = host_floats(f.n);
        fx_fill(&f, 900 + (uint64_t)root, host);
        device_order_sum(want, host, f.D, f.n);
        gate g = {0};
        CHECK_OK(pst_stream_launch(f.s[root], gate_fn, &g));
        CHECK_OK(pst_comm_reduce(f.comm, f.buf, f.n, root, f.s));
        float big = 1e30f;
        for (int d = 0; d < f.D; d++)
            if (d != root)
                for (size_t off = 0; off < f.n; off += 64) /* several items per stream */
                    CHECK_OK(pst_memcpy_async(f.s[d], f.buf[d] + off, &big, sizeof big,
                                              PST_COPY_HOST_TO_DEVICE));
        sleep_us(20000); /* let a misordered stream run ahead */
        atomic_store(&g.open, 1);
        fx_sync(&f);
        assert_bits(f.buf[root], want, f.n, "sum disturbed by later writes");
        for (int d = 0; d < f.D; d++)
            if (d != root)
                cr_assert_eq(f.buf[d][0], big, "the later write on stream %d did not run", d);
        for (int d = 0; d < f.D; d++)
            free(host[d]);
        free(want);
    }
    fx_free(&f);
}

Test(collectives_host, reduce_is_not_disturbed_by_work_queued_after, .timeout = 30)
{
    check_reduce_before_later_work(SUMMED_ON_ROOT);
    check_reduce_before_later_work(SPLIT);
}

/* Broadcast: earlier slow work on the root is what gets copied; earlier work on the
 * others still sees their old values; later writes on the others are not overwritten. */
Test(collectives_host, broadcast_is_ordered_both_ways, .timeout = 30)
{
    fixture f;
    fx_init(&f, "cpu:4", 129);
    const int root = 2;
    float *host[MAXD];
    for (int d = 0; d < f.D; d++)
        host[d] = host_floats(f.n);
    fx_fill(&f, 77, host);

    /* Before: the root slowly writes round-5 values; d = 1 slowly snapshots its old ones. */
    write_job w = {.buf = f.buf[root], .n = f.n, .k = 5, .d = root, .sleep_us = 30000};
    CHECK_OK(pst_stream_launch(f.s[root], write_fn, &w));
    float *snap = host_floats(f.n);
    CHECK_OK(pst_stream_launch(f.s[1], gate_fn, &(gate){.open = 1}));
    gate g1 = {0};
    CHECK_OK(pst_stream_launch(f.s[1], gate_fn, &g1));
    CHECK_OK(pst_memcpy_async(f.s[1], snap, f.buf[1], f.n * sizeof(float),
                              PST_COPY_DEVICE_TO_HOST));
    CHECK_OK(pst_comm_broadcast(f.comm, f.buf, f.n, root, f.s));
    /* After: device 3 overwrites its copy; the root's stream is still busy writing. */
    float after = -7.0f;
    CHECK_OK(pst_memcpy_async(f.s[3], f.buf[3], &after, sizeof after,
                              PST_COPY_HOST_TO_DEVICE));
    sleep_us(60000); /* past the root's slow write: a misordered copy would land first */
    atomic_store(&g1.open, 1);
    fx_sync(&f);

    assert_bits(snap, host[1], f.n, "earlier work on a non-root stream saw the broadcast");
    for (size_t i = 0; i < f.n; i++) {
        float want = value_at(5, root, i);
        cr_assert_eq(memcmp(&f.buf[0][i], &want, 4), 0, "device 0 element %zu", i);
        cr_assert_eq(memcmp(&f.buf[1][i], &want, 4), 0, "device 1 element %zu", i);
        if (i > 0)
            cr_assert_eq(memcmp(&f.buf[3][i], &want, 4), 0, "device 3 element %zu", i);
    }
    cr_assert_eq(f.buf[3][0], after, "a later write on device 3 was overwritten");
    free(snap);
    for (int d = 0; d < f.D; d++)
        free(host[d]);
    fx_free(&f);
}

/* Rounds of: every stream writes new values, reduce to a rotating root, check on the root
 * stream, broadcast, check on every stream — with random delays before each work item. */
Test(collectives_host, rounds_under_jitter, .timeout = 120)
{
    enum { ROUNDS = 12 };
    static const uint64_t seeds[] = {1, 2, 3, 42, 1234567};
    for (size_t si = 0; si < sizeof seeds / sizeof seeds[0]; si++) {
        fixture f;
        fx_init(&f, "cpu:4", si % 2 ? 37 : SPLIT); /* summed on the root, or split */
        pst_runtime_set_jitter(f.rt, seeds[si], 300);
        atomic_int bad = 0;
        write_job w[ROUNDS][MAXD];
        check_job root_check[ROUNDS], all_check[ROUNDS][MAXD];
        for (int k = 0; k < ROUNDS; k++) {
            int root = (k * 3 + (int)si) % f.D;
            for (int d = 0; d < f.D; d++) {
                w[k][d] = (write_job){.buf = f.buf[d], .n = f.n, .k = (uint64_t)k + 1, .d = d};
                CHECK_OK(pst_stream_launch(f.s[d], write_fn, &w[k][d]));
            }
            CHECK_OK(pst_comm_reduce(f.comm, f.buf, f.n, root, f.s));
            root_check[k] = (check_job){.buf = f.buf[root], .n = f.n, .k = (uint64_t)k + 1,
                                        .D = f.D, .mismatches = &bad};
            CHECK_OK(pst_stream_launch(f.s[root], check_sum_fn, &root_check[k]));
            CHECK_OK(pst_comm_broadcast(f.comm, f.buf, f.n, root, f.s));
            for (int d = 0; d < f.D; d++) {
                all_check[k][d] = root_check[k];
                all_check[k][d].buf = f.buf[d];
                CHECK_OK(pst_stream_launch(f.s[d], check_sum_fn, &all_check[k][d]));
            }
        }
        fx_sync(&f);
        cr_assert_eq(atomic_load(&bad), 0, "seed %llu: %d mismatching elements",
                     (unsigned long long)seeds[si], atomic_load(&bad));
        pst_runtime_set_jitter(f.rt, 0, 0);
        fx_free(&f);
    }
}

/* ---- argument checks ---------------------------------------------------------------- */

Test(collectives_args, init_and_free)
{
    pst_runtime *rt = NULL;
    pst_comm *c = (pst_comm *)&rt;
    CHECK_OK(pst_runtime_init(&rt, "cpu:2"));
    CHECK_ERR(pst_comm_init(NULL, rt), PST_ERR_INVALID);
    CHECK_ERR(pst_comm_init(&c, NULL), PST_ERR_INVALID);
    cr_assert_null(c);
    pst_comm_free(NULL);
    cr_assert_str_eq(pst_comm_name(NULL), "(no comm)");
    CHECK_OK(pst_comm_init(&c, rt));
    /* the host comm needs nothing made for a group; a NULL comm is refused */
    CHECK_OK(pst_comm_prepare_some(c, 0x3));
    CHECK_OK(pst_comm_prepare_some(c, 0x1));
    CHECK_ERR(pst_comm_prepare_some(NULL, 0x3), PST_ERR_INVALID);
    pst_comm_free(c);
    pst_runtime_free(rt);
}

Test(collectives_args, bad_arguments_are_invalid)
{
    fixture f;
    fx_init(&f, "cpu:2", 8);
    float *nobuf[MAXD] = {f.buf[0], NULL};
    pst_stream *swapped[MAXD] = {f.s[1], f.s[0]};
    pst_stream *nostream[MAXD] = {f.s[0], NULL};
    for (int bcast = 0; bcast < 2; bcast++) {
        pst_status (*op)(pst_comm *, float *const[], size_t, int, pst_stream *const[]) =
            bcast ? pst_comm_broadcast : pst_comm_reduce;
        CHECK_ERR(op(NULL, f.buf, 8, 0, f.s), PST_ERR_INVALID);
        CHECK_ERR(op(f.comm, NULL, 8, 0, f.s), PST_ERR_INVALID);
        CHECK_ERR(op(f.comm, f.buf, 8, 0, NULL), PST_ERR_INVALID);
        CHECK_ERR(op(f.comm, f.buf, 8, -1, f.s), PST_ERR_INVALID);
        CHECK_ERR(op(f.comm, f.buf, 8, 2, f.s), PST_ERR_INVALID);
        cr_assert(strstr(pst_error_detail(), "root 2") != NULL, "%s", pst_error_detail());
        CHECK_ERR(op(f.comm, nobuf, 8, 0, f.s), PST_ERR_INVALID);
        cr_assert(strstr(pst_error_detail(), "bufs[1]") != NULL, "%s", pst_error_detail());
        CHECK_ERR(op(f.comm, f.buf, 8, 0, swapped), PST_ERR_INVALID);
        cr_assert(strstr(pst_error_detail(), "streams[0]") != NULL, "%s", pst_error_detail());
        CHECK_ERR(op(f.comm, f.buf, 8, 0, nostream), PST_ERR_INVALID);
        CHECK_ERR(op(f.comm, f.buf, SIZE_MAX / 2, 0, f.s), PST_ERR_INVALID);
    }
    /* A stream of another runtime is not a stream of the comm's devices. */
    fixture g;
    fx_init(&g, "cpu:2", 8);
    CHECK_ERR(pst_comm_reduce(f.comm, f.buf, 8, 0, g.s), PST_ERR_INVALID);
    fx_free(&g);
    fx_free(&f);
}

/* ---- NCCL (needs CUDA and a GPU) ------------------------------------------------------ */

/* "cuda:0,1,..." naming the machine's GPUs (at most MAXD); 0 (after one [SKIP] line) when
 * there is none, or the build has no CUDA backend (pst_runtime_init says which). */
static int gpus_spec(char *spec, size_t size)
{
    pst_runtime *rt = NULL;
    if (pst_runtime_init(&rt, "cuda") != PST_OK) {
        fprintf(stderr, "[SKIP] collectives_nccl: skipped: no GPU (%s)\n", pst_error_detail());
        return 0;
    }
    snprintf(spec, size, "cuda:0");
    for (int d = 1; d < pst_runtime_count(rt) && d < MAXD; d++)
        snprintf(spec + strlen(spec), size - strlen(spec), ",%d", d);
    pst_runtime_free(rt);
    return 1;
}

/* Sum of |x| over the devices: the scale of the rounding error of any summation order. */
static float abs_sum(float *const in[], int D, size_t i)
{
    float s = 0.0f;
    for (int d = 0; d < D; d++)
        s += fabsf(in[d][i]);
    return s;
}

/* The machine's GPUs (at least min_gpus), a stream and an n-float buffer on each, host
 * arrays beside them, and a comm; 0 (after a [SKIP] line) when there are fewer. */
typedef struct gpu_fixture {
    pst_runtime *rt;
    pst_comm *c;
    int D;
    size_t n;
    pst_stream *s[MAXD];
    float *buf[MAXD], *host[MAXD], *want, *got;
} gpu_fixture;

static int gpu_fx_init(gpu_fixture *f, size_t n, int min_gpus)
{
    char spec[32];
    *f = (gpu_fixture){.n = n};
    if (!gpus_spec(spec, sizeof spec))
        return 0;
    CHECK_OK(pst_runtime_init(&f->rt, spec));
    f->D = pst_runtime_count(f->rt);
    if (f->D < min_gpus) {
        fprintf(stderr, "[SKIP] collectives_nccl: %d GPU(s), the case needs %d\n", f->D,
                min_gpus);
        pst_runtime_free(f->rt);
        return 0;
    }
    for (int d = 0; d < f->D; d++) {
        void *p = NULL;
        CHECK_OK(pst_stream_create(pst_runtime_device(f->rt, d), &f->s[d]));
        CHECK_OK(pst_device_alloc(pst_runtime_device(f->rt, d), n * sizeof(float), &p));
        f->buf[d] = p;
        f->host[d] = host_floats(n);
    }
    f->want = host_floats(n);
    f->got = host_floats(n);
    CHECK_OK(pst_comm_init(&f->c, f->rt));
    cr_assert_str_eq(pst_comm_name(f->c), "nccl");
    return 1;
}

static void gpu_fx_free(gpu_fixture *f)
{
    pst_comm_free(f->c);
    for (int d = 0; d < f->D; d++) {
        pst_device_free(pst_runtime_device(f->rt, d), f->buf[d]);
        pst_stream_destroy(f->s[d]);
        free(f->host[d]);
    }
    free(f->want);
    free(f->got);
    pst_runtime_free(f->rt);
}

/* New values on every GPU: host[d] drawn from r, copied to buf[d] on its stream. */
static void gpu_fx_fill(gpu_fixture *f, pst_rng *r)
{
    for (int d = 0; d < f->D; d++) {
        for (size_t i = 0; i < f->n; i++)
            f->host[d][i] = spread(r);
        CHECK_OK(pst_memcpy_async(f->s[d], f->buf[d], f->host[d], f->n * sizeof(float),
                                  PST_COPY_HOST_TO_DEVICE));
    }
}

/* The device memory limit on a GPU: the runtime refuses before CUDA allocates, the same
 * line as on the CPU (test_device's device_alloc tests), and a refusal changes nothing. */
Test(collectives_nccl, memory_limit_refuses_on_gpus, .timeout = 60)
{
    char spec[32];
    if (!gpus_spec(spec, sizeof spec))
        cr_skip_test("skipped: no GPU or no CUDA backend");
    pst_runtime *rt = NULL;
    CHECK_OK(pst_runtime_init(&rt, spec));
    pst_device *dev = pst_runtime_device(rt, 0);
    void *a = NULL, *b = &b;
    pst_device_set_memory_limit(dev, (size_t)1 << 20);
    CHECK_OK(pst_device_alloc(dev, (size_t)3 << 18, &a));
    CHECK_ERR(pst_device_alloc(dev, (size_t)1 << 19, &b), PST_ERR_NOMEM);
    cr_assert_null(b);
    cr_assert(strstr(pst_error_detail(), "--device-memory-limit"), "%s", pst_error_detail());
    cr_assert_eq(pst_device_live_bytes(dev), (size_t)3 << 18);
    CHECK_OK(pst_device_alloc(dev, (size_t)1 << 18, &b));
    pst_device_free(dev, a);
    pst_device_free(dev, b);
    pst_runtime_free(rt);
}

Test(collectives_nccl, matches_the_host_sum_on_gpus, .timeout = 120)
{
    gpu_fixture f;
    if (!gpu_fx_init(&f, 4099, 1))
        cr_skip_test("skipped: no GPU or no CUDA backend");
    const int D = f.D;
    const size_t n = f.n;
    pst_rng r;
    pst_rng_seed(&r, 11, 0);
    for (int root = 0; root < D; root++) {
        gpu_fx_fill(&f, &r);
        device_order_sum(f.want, f.host, D, n);
        CHECK_OK(pst_comm_reduce(f.c, f.buf, n, root, f.s));
        CHECK_OK(pst_memcpy_async(f.s[root], f.got, f.buf[root], n * sizeof(float),
                                  PST_COPY_DEVICE_TO_HOST));
        for (int d = 0; d < D; d++)
            CHECK_OK(pst_stream_synchronize(f.s[d]));
        /* NCCL's order is its own: each sum within a few roundings of the total size. */
        for (size_t i = 0; i < n; i++)
            cr_assert(fabsf(f.got[i] - f.want[i]) <= 4.0f * (float)D * FLT_EPSILON *
                                                         abs_sum(f.host, D, i),
                      "root %d element %zu: %g, want %g", root, i, (double)f.got[i],
                      (double)f.want[i]);
        CHECK_OK(pst_comm_broadcast(f.c, f.buf, n, root, f.s));
        for (int d = 0; d < D; d++) {
            CHECK_OK(pst_memcpy_async(f.s[d], f.host[d], f.buf[d], n * sizeof(float),
                                      PST_COPY_DEVICE_TO_HOST));
            CHECK_OK(pst_stream_synchronize(f.s[d]));
            assert_bits(f.host[d], f.got, n, "NCCL broadcast");
        }
    }
    gpu_fx_free(&f);
}

/* Some of the GPUs (a pipeline stage's replica group, the tied table's two stages): the
 * reduce sums only the members' buffers into the root's, the broadcast writes only the
 * members', each on an NCCL communicator set of exactly those GPUs (made at first use and
 * kept: the second pass reuses it). A proper subset of two or more needs three GPUs. */
Test(collectives_nccl, some_gpus_reduce_and_broadcast_among_themselves, .timeout = 180)
{
    gpu_fixture f;
    if (!gpu_fx_init(&f, 2053, 3))
        cr_skip_test("skipped: fewer than 3 GPUs, or no CUDA backend");
    const int D = f.D;
    const size_t n = f.n;
    CHECK_OK(pst_comm_prepare_some(f.c, 0x5)); /* made beforehand; 0x6 and 0x3 at first use */
    pst_rng r;
    pst_rng_seed(&r, 29, 0);
    const uint64_t sets[] = {0x5, 0x6, 0x3, 0x5};
    for (size_t q = 0; q < sizeof sets / sizeof sets[0]; q++) {
        const uint64_t m = sets[q];
        const int root = (m >> 2) & 1u ? 2 : 1;
        float *mine[MAXD] = {0}, *in[MAXD] = {0};
        int k = 0;
        gpu_fx_fill(&f, &r);
        for (int d = 0; d < D; d++)
            if ((m >> d) & 1u) {
                mine[d] = f.buf[d];
                in[k++] = f.host[d];
            }
        device_order_sum(f.want, in, k, n);
        CHECK_OK(pst_comm_reduce_some(f.c, mine, n, root, f.s, m));
        for (int d = 0; d < D; d++) {
            float *now = d == root ? f.got : host_floats(n);
            CHECK_OK(pst_memcpy_async(f.s[d], now, f.buf[d], n * sizeof(float),
                                      PST_COPY_DEVICE_TO_HOST));
            CHECK_OK(pst_stream_synchronize(f.s[d]));
            if (d != root) {
                assert_bits(now, f.host[d], n, "a buffer beside the root's after the reduce");
                free(now);
            }
        }
        for (size_t i = 0; i < n; i++)
            cr_assert(fabsf(f.got[i] - f.want[i]) <= 4.0f * (float)k * FLT_EPSILON *
                                                         abs_sum(in, k, i),
                      "members %#llx root %d element %zu: %g, want %g",
                      (unsigned long long)m, root, i, (double)f.got[i], (double)f.want[i]);
        void *some[MAXD] = {0};
        for (int d = 0; d < D; d++)
            some[d] = (m >> d) & 1u ? (void *)f.buf[d] : NULL;
        CHECK_OK(pst_comm_broadcast_some(f.c, some, n * sizeof(float), root, f.s, m));
        for (int d = 0; d < D; d++) {
            float *now = host_floats(n);
            CHECK_OK(pst_memcpy_async(f.s[d], now, f.buf[d], n * sizeof(float),
                                      PST_COPY_DEVICE_TO_HOST));
            CHECK_OK(pst_stream_synchronize(f.s[d]));
            assert_bits(now, (m >> d) & 1u ? f.got : f.host[d], n,
                        (m >> d) & 1u ? "a member after the broadcast" : "a non-member");
            free(now);
        }
    }
    gpu_fx_free(&f);
}

/* ---- two comms of one runtime at once --------------------------------------------------
 * The executor reduces on its send streams through one comm while it broadcasts on its
 * receive streams through another. Here one thread runs reduces and another broadcasts, at
 * the same time, each on its own streams and comm; both must finish (a hang fails the
 * test at its timeout) with the right values. On NCCL each comm has its own communicators:
 * two collectives in flight on one communicator set can deadlock. */

typedef struct two_side {
    pst_runtime *rt;
    pst_comm *comm;
    pst_stream *s[MAXD];
    float *buf[MAXD], *host[MAXD], *got;
    int D, broadcast, exact, failures;
    size_t n;
} two_side;

static void *two_side_run(void *arg)
{
    two_side *t = arg;
    const size_t bytes = t->n * sizeof(float);
    float *want = host_floats(t->n);
    for (int k = 0; k < 20 && !t->failures; k++) {
        const int root = k % t->D;
        for (int d = 0; d < t->D; d++) {
            for (size_t i = 0; i < t->n; i++)
                t->host[d][i] = value_at((uint64_t)k + (t->broadcast ? 500u : 0u), d, i);
            if (pst_memcpy_async(t->s[d], t->buf[d], t->host[d], bytes,
                                 PST_COPY_HOST_TO_DEVICE) != PST_OK)
                t->failures++;
        }
        pst_status st = t->broadcast ? pst_comm_broadcast(t->comm, t->buf, t->n, root, t->s)
                                     : pst_comm_reduce(t->comm, t->buf, t->n, root, t->s);
        if (st != PST_OK) {
            t->failures++;
            break;
        }
        if (t->broadcast)
            memcpy(want, t->host[root], bytes);
        else
            device_order_sum(want, t->host, t->D, t->n);
        for (int d = 0; d < t->D; d++) {
            if (!t->broadcast && d != root)
                continue;
            if (pst_memcpy_async(t->s[d], t->got, t->buf[d], bytes,
                                 PST_COPY_DEVICE_TO_HOST) != PST_OK ||
                pst_stream_synchronize(t->s[d]) != PST_OK) {
                t->failures++;
                continue;
            }
            for (size_t i = 0; i < t->n; i++) {
                const float tol = t->exact || t->broadcast
                                      ? 0.0f
                                      : 4.0f * (float)t->D * FLT_EPSILON *
                                            abs_sum(t->host, t->D, i);
                if (!(fabsf(t->got[i] - want[i]) <= tol)) {
                    t->failures++;
                    break;
                }
            }
        }
    }
    free(want);
    return NULL;
}

static void two_comms_concurrently(const char *spec, int exact)
{
    pst_runtime *rt = NULL;
    CHECK_OK(pst_runtime_init(&rt, spec));
    two_side side[2];
    for (int k = 0; k < 2; k++) {
        two_side *t = &side[k];
        *t = (two_side){.rt = rt, .D = pst_runtime_count(rt), .broadcast = k, .exact = exact,
                        .n = 3001};
        cr_assert(t->D <= MAXD);
        CHECK_OK(pst_comm_init(&t->comm, rt));
        t->got = host_floats(t->n);
        for (int d = 0; d < t->D; d++) {
            void *p = NULL;
            CHECK_OK(pst_stream_create(pst_runtime_device(rt, d), &t->s[d]));
            CHECK_OK(pst_device_alloc(pst_runtime_device(rt, d), t->n * sizeof(float), &p));
            t->buf[d] = p;
            t->host[d] = host_floats(t->n);
        }
    }
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
        cr_assert_eq(pthread_create(&th[k], NULL, two_side_run, &side[k]), 0);
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) {
        two_side *t = &side[k];
        cr_expect_eq(t->failures, 0, "%s: the %s side failed %d checks", spec,
                     t->broadcast ? "broadcast" : "reduce", t->failures);
        pst_comm_free(t->comm);
        for (int d = 0; d < t->D; d++) {
            pst_device_free(pst_runtime_device(rt, d), t->buf[d]);
            pst_stream_destroy(t->s[d]);
            free(t->host[d]);
        }
        free(t->got);
    }
    pst_runtime_free(rt);
}

Test(collectives, two_comms_at_once_on_cpu, .timeout = 60)
{
    two_comms_concurrently("cpu:3", 1);
}

Test(collectives_nccl, two_comms_at_once_on_gpus, .timeout = 120)
{
    char spec[32];
    if (!gpus_spec(spec, sizeof spec))
        cr_skip_test("skipped: no GPU or no CUDA backend");
    if (strcmp(spec, "cuda:0") == 0)
        fprintf(stderr, "collectives_nccl: one GPU: two comms are made and freed, but one "
                        "device needs no collective\n");
    two_comms_concurrently(spec, 0);
}
