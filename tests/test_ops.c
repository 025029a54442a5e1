/* test_ops.c — the model's ops (common/nn/ops.h) on every available backend against the CPU
 * reference kernels (layers.h, dtype.h called directly), ggml's test-backend-ops
 * idea.
 *
 * Backends: CPU always; CUDA when this build has it AND a GPU is present (otherwise the
 * test ops_backends.cuda reports "skipped: no GPU" and the loops run on CPU only). On CPU
 * every result must equal the reference bit for bit. On CUDA the tolerances are per op:
 * the elementwise ops (bias and ReLU after the GEMM aside), the bias gradient and the
 * casts are built from the same correctly rounded operations in the
 * same order (common/nn/cuda/ops_cuda.cu), so they must match bit for bit too; GEMMs and the
 * softmax get a tolerance. Also: argument checks with exact error codes, zero sizes,
 * ordering across two streams with events (under injected delays), and ops skipped on a
 * stream whose status is sticky. Suite ops_naive: the CPU ops (on a stream, over a thread
 * pool) against plain double loops written from ops.h's formulas, not the kernels they
 * call. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/runtime/device.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/nn/layers.h"
#include "common/nn/ops.h"
#include "common/pool.h"
#include "common/optim.h"
#include "common/rng.h"
#include "tests/check.h"

/* ---- backends ----------------------------------------------------------------------- */

typedef struct backend {
    char spec[16];
    pst_runtime *rt;
    pst_device *dev;
    pst_stream *s;
    int exact_gemm; /* GEMM-based results are bit-identical to the reference (CPU) */
} backend;

#define MAX_BACKENDS 2

static void backend_open(backend *b, const char *spec, pst_runtime *rt, int exact_gemm)
{
    memset(b, 0, sizeof *b);
    snprintf(b->spec, sizeof b->spec, "%s", spec);
    b->rt = rt;
    b->dev = pst_runtime_device(rt, 0);
    b->exact_gemm = exact_gemm;
    CHECK_OK(pst_stream_create(b->dev, &b->s));
}

/* CPU always; CUDA when built and a GPU is present. Returns how many. */
static int backends_open(backend b[MAX_BACKENDS])
{
    int n = 0;
    pst_runtime *rt = NULL;
    CHECK_OK(pst_runtime_init(&rt, "cpu:1"));
    backend_open(&b[n++], "cpu:1", rt, 1);
#ifdef PSTRAIN_HAVE_CUDA
    if (pst_runtime_init(&rt, "cuda:0") == PST_OK)
        backend_open(&b[n++], "cuda:0", rt, 0);
#endif
    return n;
}

static void backends_close(backend b[], int n)
{
    for (int i = 0; i < n; i++) {
        pst_stream_destroy(b[i].s);
        pst_runtime_free(b[i].rt);
    }
}

Test(ops_backends, cuda)
{
#ifndef PSTRAIN_HAVE_CUDA
    fprintf(stderr, "[SKIP] test_ops: CUDA parity skipped: this build has no CUDA backend\n");
    cr_skip_test("skipped: built without CUDA");
#else
    pst_runtime *rt = NULL;
    if (pst_runtime_init(&rt, "cuda:0") != PST_OK) {
        fprintf(stderr, "[SKIP] test_ops: CUDA parity skipped: no GPU (%s)\n", pst_error_detail());
        cr_skip_test("skipped: no GPU");
    }
    fprintf(stderr, "test_ops: CUDA parity runs on %s\n",
            pst_device_name(pst_runtime_device(rt, 0)));
    pst_runtime_free(rt);
#endif
}

/* Device copies of host data, and back. */
static void *dev_put(backend *b, const void *host, size_t bytes)
{
    void *p = NULL;
    CHECK_OK(pst_device_alloc(b->dev, bytes ? bytes : 1, &p));
    if (host && bytes)
        CHECK_OK(pst_memcpy_async(b->s, p, host, bytes, PST_COPY_HOST_TO_DEVICE));
    return p;
}

static void dev_get(backend *b, void *host, const void *dev, size_t bytes)
{
    CHECK_OK(pst_memcpy_async(b->s, host, dev, bytes, PST_COPY_DEVICE_TO_HOST));
}

static void dev_free(backend *b, void *p)
{
    pst_device_free(b->dev, p);
}

/* ---- data and comparison ----------------------------------------------------------- */

static float *randn(size_t n, uint64_t seed)
{
    pst_rng r;
    pst_rng_seed(&r, seed, 1);
    float *p = malloc((n ? n : 1) * sizeof *p);
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = pst_rng_normal(&r);
    return p;
}

static float *copy_floats(const float *src, size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    cr_assert_not_null(p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

/* exact: the same bits; else |got - want| <= atol + rtol*|want| (NaN matches NaN). */
static void compare(const char *what, const backend *b, const float *got, const float *want,
                    size_t n, int exact, float atol, float rtol)
{
    for (size_t i = 0; i < n; i++) {
        if (exact) {
            cr_assert_eq(memcmp(&got[i], &want[i], 4), 0,
                         "%s on %s: element %zu is %a, reference %a (bit for bit)", what,
                         b->spec, i, (double)got[i], (double)want[i]);
        } else if (!(isnan(got[i]) && isnan(want[i]))) {
            cr_assert(fabsf(got[i] - want[i]) <= atol + rtol * fabsf(want[i]),
                      "%s on %s: element %zu is %.9g, reference %.9g (atol %g, rtol %g)", what,
                      b->spec, i, (double)got[i], (double)want[i], (double)atol, (double)rtol);
        }
    }
}

/* Per-op tolerances for backends whose GEMM/softmax are not the reference's. */
#define TOL_GEMM_ATOL 1e-4f
#define TOL_GEMM_RTOL 1e-4f
#define TOL_XENT_ATOL 1e-6f
#define TOL_XENT_RTOL 1e-5f

/* ---- linear ------------------------------------------------------------------------ */

static const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {33, 65, 17}, {64, 300, 10}};

Test(ops_parity, linear_forward)
{
    backend be[MAX_BACKENDS];
    int nb = backends_open(be);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int B = shapes[k][0], IC = shapes[k][1], OC = shapes[k][2];
        float *inp = randn((size_t)B * IC, 10 + k), *w = randn((size_t)OC * IC, 20 + k);
        float *bias = randn((size_t)OC, 30 + k);
        float *ref = malloc(sizeof(float) * B * OC), *got = malloc(sizeof(float) * B * OC);
        for (int relu = 0; relu < 2; relu++) {
            pst_linear_forward(ref, inp, w, bias, B, IC, OC, relu);
            for (int i = 0; i < nb; i++) {
                backend *b = &be[i];
                float *d_inp = dev_put(b, inp, sizeof(float) * B * IC);
                float *d_w = dev_put(b, w, sizeof(float) * OC * IC);
                float *d_b = dev_put(b, bias, sizeof(float) * OC);
                float *d_out = dev_put(b, NULL, sizeof(float) * B * OC);
                pst_linear_fwd_args a = {.out = d_out, .inp = d_inp, .w = d_w, .b = d_b,
                                         .B = B, .IC = IC, .OC = OC, .relu = relu};
                CHECK_OK(pst_op_linear_forward(b->s, &a));
                dev_get(b, got, d_out, sizeof(float) * B * OC);
                CHECK_OK(pst_stream_synchronize(b->s));
                compare(relu ? "linear_forward+relu" : "linear_forward", b, got, ref,
                        (size_t)B * OC, b->exact_gemm, TOL_GEMM_ATOL, TOL_GEMM_RTOL);
                dev_free(b, d_inp);
                dev_free(b, d_w);
                dev_free(b, d_b);
                dev_free(b, d_out);
            }
        }
        free(inp);
        free(w);
        free(bias);
        free(ref);
        free(got);
    }
    backends_close(be, nb);
}

/* The CPU ops split a layer over their pool (single-threaded OpenBLAS per part). A part is
 * a smaller OpenBLAS call that may take another kernel, so a split is checked against the
 * whole call within the GEMM tolerance, and for determinism: the same team size gives the
 * same bits every time, and a team of one gives the reference kernel's bits. */
static void linear_via_pool(pst_stream *s, pst_pool *pool, const float *inp, const float *w,
                            const float *bias, const float *dout, int B, int IC, int OC,
                            float *out, float *dw, float *db, float *dx)
{
    pst_linear_fwd_args f = {.out = out, .inp = inp, .w = w, .b = bias, .B = B, .IC = IC,
                             .OC = OC, .relu = 1, .pool = pool};
    pst_linear_bwd_args g = {.dinp = dx, .dw = dw, .db = db, .dout = dout, .inp = inp, .w = w,
                             .B = B, .IC = IC, .OC = OC, .mask = inp, .pool = pool};
    memset(out, 0xff, sizeof(float) * B * OC);
    memset(dw, 0xff, sizeof(float) * OC * IC);
    memset(db, 0xff, sizeof(float) * OC);
    memset(dx, 0xff, sizeof(float) * B * IC);
    CHECK_OK(pst_op_linear_forward(s, &f));
    CHECK_OK(pst_op_linear_backward(s, &g));
    CHECK_OK(pst_stream_synchronize(s));
}

/* One shape of linear_split_over_a_pool. */
static void linear_split_shape(pst_stream *s, int B, int IC, int OC, uint64_t seed)
{
    float *inp = randn((size_t)B * IC, seed), *w = randn((size_t)OC * IC, seed + 1);
    float *bias = randn((size_t)OC, seed + 2), *dout = randn((size_t)B * OC, seed + 3);
    float *r[4], *g[4], *h[4];
    const size_t n[4] = {(size_t)B * OC, (size_t)OC * IC, (size_t)OC, (size_t)B * IC};
    const char *what[4] = {"forward", "dw", "db", "dinp"};
    for (int k = 0; k < 4; k++) {
        r[k] = malloc(sizeof(float) * n[k]);
        g[k] = malloc(sizeof(float) * n[k]);
        h[k] = malloc(sizeof(float) * n[k]);
    }
    pst_linear_forward(r[0], inp, w, bias, B, IC, OC, 1);
    pst_linear_backward(r[3], r[1], r[2], dout, inp, w, B, IC, OC, 0);
    /* the input's ReLU (mask = inp: its negative entries stop the gradient) */
    pst_relu_backward(r[3], r[3], inp, (int64_t)B * IC);
    for (int threads = 1; threads <= 3; threads++) {
        pst_pool *pool;
        CHECK_OK(pst_pool_init(&pool, threads));
        linear_via_pool(s, pool, inp, w, bias, dout, B, IC, OC, g[0], g[1], g[2], g[3]);
        linear_via_pool(s, pool, inp, w, bias, dout, B, IC, OC, h[0], h[1], h[2], h[3]);
        for (int k = 0; k < 4; k++) {
            cr_assert_eq(memcmp(g[k], h[k], sizeof(float) * n[k]), 0,
                         "%s (B %d, IC %d, OC %d): %d threads gave other bits the second time",
                         what[k], B, IC, OC, threads);
            if (threads == 1)
                cr_assert_eq(memcmp(g[k], r[k], sizeof(float) * n[k]), 0,
                             "%s: a team of one differs from the reference kernel", what[k]);
            for (size_t i = 0; i < n[k]; i++)
                cr_assert(fabs(g[k][i] - r[k][i]) <= TOL_GEMM_ATOL + TOL_GEMM_RTOL * fabs(r[k][i]),
                          "%s[%zu] (B %d, IC %d, OC %d), %d threads: %.9g, whole call %.9g",
                          what[k], i, B, IC, OC, threads, g[k][i], r[k][i]);
        }
        pst_pool_free(pool);
    }
    for (int k = 0; k < 4; k++) {
        free(r[k]);
        free(g[k]);
        free(h[k]);
    }
    free(inp); free(w); free(bias); free(dout);
}

Test(ops_parity, linear_split_over_a_pool)
{
    pst_runtime *rt;
    pst_stream *s;
    CHECK_OK(pst_runtime_init(&rt, "cpu:1"));
    CHECK_OK(pst_stream_create(pst_runtime_device(rt, 0), &s));
    linear_split_shape(s, 64, 300, 130, 91);  /* columns: the batch under both widths */
    linear_split_shape(s, 300, 40, 24, 95);   /* rows: the batch over both (ops_cpu.c) */
    linear_split_shape(s, 600, 100, 300, 99); /* rows, and dweight past one tile */
    pst_stream_destroy(s);
    pst_runtime_free(rt);
}

/* The residual add split over a pool: the bits of one loop, whatever the team. */
Test(ops_parity, add_split_over_a_pool)
{
    pst_runtime *rt;
    pst_stream *s;
    CHECK_OK(pst_runtime_init(&rt, "cpu:1"));
    CHECK_OK(pst_stream_create(pst_runtime_device(rt, 0), &s));
    const size_t n = 100003;
    float *src = randn(n, 120), *dst0 = randn(n, 121);
    float *ref = copy_floats(dst0, n), *got = malloc(sizeof(float) * n);
    for (size_t j = 0; j < n; j++)
        ref[j] += src[j];
    for (int threads = 1; threads <= 3; threads++) {
        pst_pool *pool;
        CHECK_OK(pst_pool_init(&pool, threads));
        memcpy(got, dst0, sizeof(float) * n);
        pst_add_args a = {.dst = got, .src = src, .n = n, .pool = pool};
        CHECK_OK(pst_op_add(s, &a));
        CHECK_OK(pst_stream_synchronize(s));
        cr_assert_eq(memcmp(got, ref, sizeof(float) * n), 0, "%d threads", threads);
        pst_pool_free(pool);
    }
    /* with a bias per column, split by rows of 13 (the first 7692 rows) */
    const size_t nw = n - n % 13;
    float *bias = randn(13, 122), *refb = copy_floats(dst0, n);
    for (size_t j = 0; j < nw; j++)
        refb[j] = (dst0[j] + bias[j % 13]) + src[j];
    for (int threads = 1; threads <= 3; threads++) {
        pst_pool *pool;
        CHECK_OK(pst_pool_init(&pool, threads));
        memcpy(got, dst0, sizeof(float) * n);
        pst_add_args a = {.dst = got, .src = src, .bias = bias, .width = 13, .n = nw,
                          .pool = pool};
        CHECK_OK(pst_op_add(s, &a));
        CHECK_OK(pst_stream_synchronize(s));
        cr_assert_eq(memcmp(got, refb, sizeof(float) * n), 0, "bias, %d threads", threads);
        pst_pool_free(pool);
    }
    free(bias); free(refb);
    free(src); free(dst0); free(ref); free(got);
    pst_stream_destroy(s);
    pst_runtime_free(rt);
}

/* A pool run: every part counts its calls and copies the caller's round number, written
 * before the run (plain memory: the pool's hand-over must order it). */
typedef struct count_run {
    atomic_int calls[4];
    int round;
    int seen[4];
} count_run;

static void count_part(void *arg, int part, int nparts)
{
    count_run *c = arg;
    (void)nparts;
    atomic_fetch_add(&c->calls[part], 1);
    c->seen[part] = c->round;
}

/* Whatever the spin (none: the workers sleep at once; the default; one second: they poll
 * through every gap), each run calls every part once, a run started after a gap longer than
 * the spin wakes the sleeping workers, and freeing a pool whose workers poll returns (the
 * test's timeout guards against a hang, it measures nothing). */
Test(ops_pool, every_part_runs_once_whatever_the_spin, .timeout = 60)
{
    const long spins[3] = {0, PST_POOL_SPIN_NS_DEFAULT, 1000000000L};
    for (int k = 0; k < 3; k++) {
        pst_pool *pool;
        CHECK_OK(pst_pool_init(&pool, 4));
        pst_pool_set_spin(pool, spins[k]);
        count_run c = {.round = 0};
        for (int r = 0; r < 300; r++) {
            c.round = r;
            pst_pool_run(pool, count_part, &c);
            for (int p = 0; p < 4; p++)
                cr_assert_eq(c.seen[p], r, "spin %ld ns, run %d: part %d saw run %d",
                             spins[k], r, p, c.seen[p]);
            if (r % 50 == 0) /* a gap longer than the short spins: the workers sleep */
                usleep(2000);
        }
        for (int p = 0; p < 4; p++)
            cr_assert_eq(atomic_load(&c.calls[p]), 300, "spin %ld ns: part %d ran %d times",
                         spins[k], p, atomic_load(&c.calls[p]));
        pst_pool_free(pool);
    }
}

Test(ops_parity, linear_backward)
{
    backend be[MAX_BACKENDS];
    int nb = backends_open(be);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int B = shapes[k][0], IC = shapes[k][1], OC = shapes[k][2];
        const size_t nw = (size_t)OC * IC, ni = (size_t)B * IC, no = (size_t)B * OC;
        float *inp = randn(ni, 40 + k), *w = randn(nw, 50 + k), *dout = randn(no, 60 + k);
        float *dw0 = randn(nw, 70 + k), *db0 = randn((size_t)OC, 80 + k);
        for (int acc = 0; acc < 2; acc++) {
            /* with_dinp 2: dinp through the input's ReLU (mask = inp, half of it <= 0) */
            for (int with_dinp = 0; with_dinp < 3; with_dinp++) {
                float *ref_dw = copy_floats(dw0, nw), *ref_db = copy_floats(db0, OC);
                float *ref_dinp = malloc(sizeof(float) * ni);
                pst_linear_backward(with_dinp ? ref_dinp : NULL, ref_dw, ref_db, dout, inp, w,
                                    B, IC, OC, acc);
                if (with_dinp == 2)
                    pst_relu_backward(ref_dinp, ref_dinp, inp, (int64_t)ni);
                for (int i = 0; i < nb; i++) {
                    backend *b = &be[i];
                    float *d_inp = dev_put(b, inp, sizeof(float) * ni);
                    float *d_w = dev_put(b, w, sizeof(float) * nw);
                    float *d_dout = dev_put(b, dout, sizeof(float) * no);
                    float *d_dw = dev_put(b, dw0, sizeof(float) * nw);
                    float *d_db = dev_put(b, db0, sizeof(float) * OC);
                    float *d_dinp = dev_put(b, NULL, sizeof(float) * ni);
                    pst_linear_bwd_args a = {.dinp = with_dinp ? d_dinp : NULL, .dw = d_dw,
                                             .db = d_db, .dout = d_dout, .inp = d_inp,
                                             .w = d_w, .B = B, .IC = IC, .OC = OC,
                                             .accumulate = acc,
                                             .mask = with_dinp == 2 ? d_inp : NULL};
                    CHECK_OK(pst_op_linear_backward(b->s, &a));
                    float *g_dw = malloc(sizeof(float) * nw), *g_db = malloc(sizeof(float) * OC);
                    float *g_dinp = malloc(sizeof(float) * ni);
                    dev_get(b, g_dw, d_dw, sizeof(float) * nw);
                    dev_get(b, g_db, d_db, sizeof(float) * OC);
                    dev_get(b, g_dinp, d_dinp, sizeof(float) * ni);
                    CHECK_OK(pst_stream_synchronize(b->s));
                    compare("linear_backward dw", b, g_dw, ref_dw, nw, b->exact_gemm,
                            TOL_GEMM_ATOL, TOL_GEMM_RTOL);
                    /* The bias gradient is a column sum in row order: exact everywhere. */
                    compare("linear_backward db", b, g_db, ref_db, (size_t)OC, 1, 0, 0);
                    if (with_dinp)
                        compare("linear_backward dinp", b, g_dinp, ref_dinp, ni, b->exact_gemm,
                                TOL_GEMM_ATOL, TOL_GEMM_RTOL);
                    else
                        for (size_t j = 0; j < ni; j++)
                            cr_assert_eq(g_dinp[j], 0.0f, "dinp written although NULL");
                    free(g_dw);
                    free(g_db);
                    free(g_dinp);
                    dev_free(b, d_inp);
                    dev_free(b, d_w);
                    dev_free(b, d_dout);
                    dev_free(b, d_dw);
                    dev_free(b, d_db);
                    dev_free(b, d_dinp);
                }
                free(ref_dw);
                free(ref_db);
                free(ref_dinp);
            }
        }
        free(inp);
        free(w);
        free(dout);
        free(dw0);
        free(db0);
    }
    backends_close(be, nb);
}

/* ---- ReLU backward, add ----------------------------------------------------------- */

/* A weight-gradient row range (the executor's chunks): rows [r0, r1) of dw and db as the
 * reference slice kernel computes them, every other row untouched, on every backend: a
 * middle tile and the last, short one. */
static void row_range_case(backend *be, int nb, int r0, int r1)
{
    const int B = 33, IC = 65, OC = 600;
    const size_t nw = (size_t)OC * IC, ni = (size_t)B * IC, no = (size_t)B * OC;
    float *inp = randn(ni, 141), *w = randn(nw, 142), *dout = randn(no, 143);
    float *dw0 = randn(nw, 144), *db0 = randn((size_t)OC, 145);
    for (int acc = 0; acc < 2; acc++) {
        float *ref_dw = copy_floats(dw0, nw), *ref_db = copy_floats(db0, OC);
        pst_linear_backward_weight_rows(ref_dw, ref_db, dout, inp, B, IC, OC, acc, r0, r1);
        for (int i = 0; i < nb; i++) {
            backend *b = &be[i];
            float *d_inp = dev_put(b, inp, sizeof(float) * ni);
            float *d_w = dev_put(b, w, sizeof(float) * nw);
            float *d_dout = dev_put(b, dout, sizeof(float) * no);
            float *d_dw = dev_put(b, dw0, sizeof(float) * nw);
            float *d_db = dev_put(b, db0, sizeof(float) * OC);
            pst_linear_bwd_args a = {.dw = d_dw, .db = d_db, .dout = d_dout, .inp = d_inp,
                                     .w = d_w, .B = B, .IC = IC, .OC = OC, .accumulate = acc,
                                     .row0 = r0, .row1 = r1};
            CHECK_OK(pst_op_linear_backward(b->s, &a));
            float *g_dw = malloc(sizeof(float) * nw), *g_db = malloc(sizeof(float) * OC);
            dev_get(b, g_dw, d_dw, sizeof(float) * nw);
            dev_get(b, g_db, d_db, sizeof(float) * OC);
            CHECK_OK(pst_stream_synchronize(b->s));
            compare("linear_backward rows dw", b, g_dw, ref_dw, nw, b->exact_gemm,
                    TOL_GEMM_ATOL, TOL_GEMM_RTOL);
            compare("linear_backward rows db", b, g_db, ref_db, (size_t)OC, 1, 0, 0);
            /* Outside the range: the initial values, bit for bit. */
            cr_assert_eq(memcmp(g_dw, dw0, sizeof(float) * (size_t)r0 * IC), 0, "rows < r0 written");
            cr_assert_eq(memcmp(g_dw + (size_t)r1 * IC, dw0 + (size_t)r1 * IC,
                                sizeof(float) * (size_t)(OC - r1) * IC), 0, "rows >= r1 written");
            cr_assert_eq(memcmp(g_db, db0, sizeof(float) * r0), 0, "db < r0 written");
            cr_assert_eq(memcmp(g_db + r1, db0 + r1, sizeof(float) * (OC - r1)), 0, "db >= r1 written");
            free(g_dw);
            free(g_db);
            dev_free(b, d_inp);
            dev_free(b, d_w);
            dev_free(b, d_dout);
            dev_free(b, d_dw);
            dev_free(b, d_db);
        }
        free(ref_dw);
        free(ref_db);
    }
    free(inp); free(w); free(dout); free(dw0); free(db0);
}

Test(ops_parity, linear_backward_row_range)
{
    backend be[MAX_BACKENDS];
    int nb = backends_open(be);
    row_range_case(be, nb, 256, 512); /* a middle tile */
    row_range_case(be, nb, 512, 600); /* the last, short one */
    backends_close(be, nb);
}

Test(ops_parity, relu_backward)
{
    backend be[MAX_BACKENDS];
    int nb = backends_open(be);
    static const int64_t sizes[] = {1, 1000, 4097};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const int64_t n = sizes[k];
        float *dout = randn((size_t)n, 90 + k), *out = randn((size_t)n, 91 + k);
        for (int64_t j = 0; j < n; j += 7)
            out[j] = j % 2 ? 0.0f : -0.0f; /* exactly zero is "not > 0" */
        float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
        pst_relu_backward(ref, dout, out, n);
        for (int i = 0; i < nb; i++) {
            backend *b = &be[i];
            for (int in_place = 0; in_place < 2; in_place++) {
                float *d_dout = dev_put(b, dout, sizeof(float) * n);
                float *d_out = dev_put(b, out, sizeof(float) * n);
                float *d_dinp = in_place ? d_dout : dev_put(b, NULL, sizeof(float) * n);
                pst_relu_bwd_args a = {.dinp = d_dinp, .dout = d_dout, .out = d_out, .n = n};
                CHECK_OK(pst_op_relu_backward(b->s, &a));
                dev_get(b, got, d_dinp, sizeof(float) * n);
                CHECK_OK(pst_stream_synchronize(b->s));
                compare("relu_backward", b, got, ref, (size_t)n, 1, 0, 0);
                if (!in_place)
                    dev_free(b, d_dinp);
                dev_free(b, d_dout);
                dev_free(b, d_out);
            }
        }
        free(dout);
        free(out);
        free(ref);
        free(got);
    }
    backends_close(be, nb);
}

Test(ops_parity, add)
{
    backend be[MAX_BACKENDS];
    int nb = backends_open(be);
    static const size_t sizes[] = {1, 1001, 70001};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const size_t n = sizes[k];
        float *dst = randn(n, 100 + k), *src = randn(n, 110 + k);
        float *ref = copy_floats(dst, n), *got = malloc(sizeof(float) * n);
        for (size_t j = 0; j < n; j++)
            ref[j] += src[j];
        for (int i = 0; i < nb; i++) {
            backend *b = &be[i];
            float *d_dst = dev_put(b, dst, sizeof(float) * n);
            float *d_src = dev_put(b, src, sizeof(float) * n);
            pst_add_args a = {.dst = d_dst, .src = d_src, .n = n};
            CHECK_OK(pst_op_add(b->s, &a));
            dev_get(b, got, d_dst, sizeof(float) * n);
            CHECK_OK(pst_stream_synchronize(b->s));
            compare("add", b, got, ref, n, 1, 0, 0);
            dev_free(b, d_dst);
            dev_free(b, d_src);
        }
        /* with a bias per column of rows of `w` (the projection's, in the residual's pass):
         * (dst + bias) + src, bit for bit */
        static const int widths[] = {1, 13, 7};
        const int w = widths[k];
        const size_t nw = n - n % (size_t)w; /* whole rows */
        float *bias = randn((size_t)w, 130 + k);
        for (size_t j = 0; j < nw; j++)
            ref[j] = (dst[j] + bias[j % (size_t)w]) + src[j];
        for (int i = 0; i < nb; i++) {
            backend *b = &be[i];
            float *d_dst = dev_put(b, dst, sizeof(float) * n);
            float *d_src = dev_put(b, src, sizeof(float) * n);
            float *d_bias = dev_put(b, bias, sizeof(float) * (size_t)w);
            pst_add_args a = {.dst = d_dst, .src = d_src, .bias = d_bias, .width = w, .n = nw};
            CHECK_OK(pst_op_add(b->s, &a));
            dev_get(b, got, d_dst, sizeof(float) * nw);
            CHECK_OK(pst_stream_synchronize(b->s));
            compare("add with bias", b, got, ref, nw, 1, 0, 0);
            a.width = 3; /* not a divisor of n: refused */
            if (nw % 3)
                CHECK_ERR(pst_op_add(b->s, &a), PST_ERR_INVALID);
            dev_free(b, d_dst);
            dev_free(b, d_src);
            dev_free(b, d_bias);
        }
        free(bias);
        free(dst);
        free(src);
        free(ref);
        free(got);
    }
    backends_close(be, nb);
}

/* ---- softmax cross-entropy ------------------------------------------------------------ */

/* ops.h's definition, row by row through the reference kernels (as ops_cpu.c). */
static void xent_reference(float *losses, int32_t *correct, float *dlogits, const float *logits,
                           const int32_t *targets, int B, int C, float scale)
{
    int right = 0;
    for (int b = 0; b < B; b++) {
        const float *l = logits + (size_t)b * C;
        float *p = dlogits + (size_t)b * C;
        int best = 0;
        for (int j = 1; j < C; j++)
            best = l[j] > l[best] ? j : best;
        right += best == targets[b];
        losses[b] = (float)pst_softmax_xent_forward(p, l, targets + b, 1, C);
        if (scale != 0.0f)
            pst_softmax_xent_backward(p, p, targets + b, 1, C, scale);
    }
    *correct += right;
}

Test(ops_parity, softmax_xent)
{
    static const int shapes_bc[][2] = {{1, 1}, {6, 10}, {33, 257}, {3, 1000}};
    backend be[MAX_BACKENDS];
    int nb = backends_open(be);
    for (size_t k = 0; k < sizeof shapes_bc / sizeof shapes_bc[0]; k++) {
        const int B = shapes_bc[k][0], C = shapes_bc[k][1];
        const size_t nl = (size_t)B * C;
        float *logits = randn(nl, 120 + k);
        int32_t *targets = malloc(sizeof(int32_t) * B);
        pst_rng r;
        pst_rng_seed(&r, 130 + k, 0);
        for (int b = 0; b < B; b++) {
            targets[b] = (int32_t)pst_rng_below(&r, (uint64_t)C);
            if (b % 3 == 0) /* the target is the (first) maximum: a correct row */
                logits[(size_t)b * C + targets[b]] = 10.0f;
        }
        if (C > 2) { /* a tie for the maximum: the first index wins */
            logits[0] = 12.0f;
            logits[2] = 12.0f;
            targets[0] = 2;
        }
        for (int with_correct = 0; with_correct < 2; with_correct++) {
            for (int si = 0; si < 2; si++) {
                const float scale = si ? 1.0f / (float)B : 0.0f;
                float *ref_l = malloc(sizeof(float) * B), *ref_d = malloc(sizeof(float) * nl);
                int32_t ref_c = 5;
                xent_reference(ref_l, &ref_c, ref_d, logits, targets, B, C, scale);
                for (int i = 0; i < nb; i++) {
                    backend *b = &be[i];
                    int32_t c0 = 5, got_c = -1;
                    float *d_logits = dev_put(b, logits, sizeof(float) * nl);
                    int32_t *d_t = dev_put(b, targets, sizeof(int32_t) * B);
                    float *d_l = dev_put(b, NULL, sizeof(float) * B);
                    float *d_d = dev_put(b, NULL, sizeof(float) * nl);
                    int32_t *d_c = dev_put(b, &c0, sizeof c0);
                    pst_xent_args a = {.losses = d_l, .correct = with_correct ? d_c : NULL,
                                       .dlogits = d_d, .logits = d_logits, .targets = d_t,
                                       .B = B, .C = C, .scale = scale};
                    CHECK_OK(pst_op_softmax_xent(b->s, &a));
                    float *g_l = malloc(sizeof(float) * B), *g_d = malloc(sizeof(float) * nl);
                    dev_get(b, g_l, d_l, sizeof(float) * B);
                    dev_get(b, g_d, d_d, sizeof(float) * nl);
                    dev_get(b, &got_c, d_c, sizeof got_c);
                    CHECK_OK(pst_stream_synchronize(b->s));
                    compare("softmax_xent losses", b, g_l, ref_l, (size_t)B, b->exact_gemm,
                            TOL_XENT_ATOL, TOL_XENT_RTOL);
                    compare(scale ? "softmax_xent dlogits" : "softmax_xent probs", b, g_d,
                            ref_d, nl, b->exact_gemm, TOL_XENT_ATOL, TOL_XENT_RTOL);
                    cr_assert_eq(got_c, with_correct ? ref_c : 5, "correct on %s: %d, want %d",
                                 b->spec, got_c, with_correct ? ref_c : 5);
                    free(g_l);
                    free(g_d);
                    dev_free(b, d_logits);
                    dev_free(b, d_t);
                    dev_free(b, d_l);
                    dev_free(b, d_d);
                    dev_free(b, d_c);
                }
                free(ref_l);
                free(ref_d);
            }
        }
        free(logits);
        free(targets);
    }
    backends_close(be, nb);
}

/* ---- casts --------------------------------------------------------------------------- */

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Source data of type st: every 16-bit pattern, or f32 edge cases plus random values. */
static void *cast_source(pst_dtype st, size_t *n)
{
    if (st != PST_F32) {
        uint16_t *h = malloc(65536 * sizeof *h);
        for (uint32_t i = 0; i < 65536; i++)
            h[i] = (uint16_t)i;
        *n = 65536;
        return h;
    }
    static const uint32_t edges[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
        0xffa00123u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x38800000u,
        0x387fffffu, 0x33000000u, 0x33000001u, 0x33c00000u, 0x00000001u, 0x807fffffu,
        0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x7f7f8000u, 0x7f7fffffu,
        0x3f800000u, 0xbf800000u, 0x3f801000u, 0x3f800fffu, 0x3f802000u, 0x3f803000u,
    };
    const size_t ne = sizeof edges / sizeof edges[0], nr = 20001;
    float *f = malloc((ne + nr) * sizeof *f);
    for (size_t i = 0; i < ne; i++)
        f[i] = f32_of(edges[i]);
    pst_rng r;
    pst_rng_seed(&r, 150, 0);
    for (size_t i = 0; i < nr; i++)
        f[ne + i] = f32_of((uint32_t)pst_rng_u64(&r)); /* every exponent, NaNs too */
    *n = ne + nr;
    return f;
}

Test(ops_parity, cast_every_pair)
{
    backend be[MAX_BACKENDS];
    int nb = backends_open(be);
    for (int st = 0; st < PST_DTYPE_COUNT_; st++) {
        size_t n;
        void *src = cast_source((pst_dtype)st, &n);
        const size_t sb = n * pst_dtype_size((pst_dtype)st);
        for (int dt = 0; dt < PST_DTYPE_COUNT_; dt++) {
            const size_t db = n * pst_dtype_size((pst_dtype)dt);
            unsigned char *ref = malloc(db), *got = malloc(db + 1);
            pst_cast(ref, (pst_dtype)dt, src, (pst_dtype)st, n);
            for (int i = 0; i < nb; i++) {
                backend *b = &be[i];
                /* Aligned, and both buffers shifted by one byte (dtype.h needs no alignment). */
                for (int shift = 0; shift < 2; shift++) {
                    unsigned char *d_src = dev_put(b, NULL, sb + 1);
                    unsigned char *d_dst = dev_put(b, NULL, db + 1);
                    CHECK_OK(pst_memcpy_async(b->s, d_src + shift, src, sb,
                                              PST_COPY_HOST_TO_DEVICE));
                    pst_cast_args a = {.dst = d_dst + shift, .dt = (pst_dtype)dt,
                                       .src = d_src + shift, .st = (pst_dtype)st, .n = n};
                    CHECK_OK(pst_op_cast(b->s, &a));
                    dev_get(b, got, d_dst + shift, db);
                    CHECK_OK(pst_stream_synchronize(b->s));
                    cr_assert_eq(memcmp(got, ref, db), 0, "cast %s -> %s on %s (shift %d)",
                                 pst_dtype_name((pst_dtype)st), pst_dtype_name((pst_dtype)dt),
                                 b->spec, shift);
                    dev_free(b, d_src);
                    dev_free(b, d_dst);
                }
            }
            free(ref);
            free(got);
        }
        free(src);
    }
    backends_close(be, nb);
}

/* ---- argument checks ----------------------------------------------------------------- */

Test(ops_args, null_and_bad_arguments_are_invalid)
{
    backend be[1];
    pst_runtime *rt = NULL;
    CHECK_OK(pst_runtime_init(&rt, "cpu:1"));
    backend_open(&be[0], "cpu:1", rt, 1);
    pst_stream *s = be[0].s;
    float *f = dev_put(&be[0], NULL, 64 * sizeof(float));
    int32_t *t = dev_put(&be[0], NULL, 16 * sizeof(int32_t));

    pst_linear_fwd_args lf = {.out = f, .inp = f + 8, .w = f + 16, .b = f + 24,
                              .B = 2, .IC = 2, .OC = 2};
    CHECK_ERR(pst_op_linear_forward(NULL, &lf), PST_ERR_INVALID);
    CHECK_ERR(pst_op_linear_forward(s, NULL), PST_ERR_INVALID);
    for (int k = 0; k < 3; k++) {
        pst_linear_fwd_args x = lf;
        if (k == 0) x.out = NULL;
        if (k == 1) x.inp = NULL;
        if (k == 2) x.w = NULL;
        CHECK_ERR(pst_op_linear_forward(s, &x), PST_ERR_INVALID);
    }
    pst_linear_fwd_args nobias = lf;
    nobias.b = NULL; /* a layer without bias (the tied output projection) */
    CHECK_OK(pst_op_linear_forward(s, &nobias));
    pst_linear_fwd_args bad = lf;
    bad.B = -1;
    CHECK_ERR(pst_op_linear_forward(s, &bad), PST_ERR_INVALID);
    bad = lf;
    bad.IC = 0;
    CHECK_ERR(pst_op_linear_forward(s, &bad), PST_ERR_INVALID);
    bad = lf;
    bad.B = 0;
    CHECK_OK(pst_op_linear_forward(s, &bad)); /* an empty batch is nothing to do */

    pst_linear_bwd_args lb = {.dinp = NULL, .dw = f, .db = f + 8, .dout = f + 16,
                              .inp = f + 24, .w = f + 32, .B = 2, .IC = 2, .OC = 2};
    CHECK_ERR(pst_op_linear_backward(NULL, &lb), PST_ERR_INVALID);
    CHECK_ERR(pst_op_linear_backward(s, NULL), PST_ERR_INVALID);
    pst_linear_bwd_args nodb = lb;
    nodb.db = NULL; /* no bias: no bias gradient */
    CHECK_OK(pst_op_linear_backward(s, &nodb));
    for (int k = 0; k < 5; k++) {
        pst_linear_bwd_args x = lb;
        if (k == 0) x.dw = NULL;
        if (k == 1) x.dinp = x.dw = NULL; /* nothing to compute but a bias gradient */
        if (k == 2) x.dout = NULL;
        if (k == 3) x.inp = NULL;
        if (k == 4) x.w = NULL;
        CHECK_ERR(pst_op_linear_backward(s, &x), PST_ERR_INVALID);
    }
    pst_linear_bwd_args lbb = lb;
    lbb.B = 0;
    CHECK_ERR(pst_op_linear_backward(s, &lbb), PST_ERR_INVALID);
    CHECK_OK(pst_op_linear_backward(s, &lb)); /* dinp NULL is allowed */
    /* Weight-gradient rows: inside [0, OC), not empty, only with dw, starting at a tile
     * (PST_ROW_TILE) and ending at one or at OC. */
    const int ranges[][2] = {{1, 1}, {-1, 1}, {0, 3}, {2, 1}, {1, 0}, {1, 2}};
    for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
        pst_linear_bwd_args x = lb;
        x.row0 = ranges[k][0];
        x.row1 = ranges[k][1];
        CHECK_ERR(pst_op_linear_backward(s, &x), PST_ERR_INVALID);
    }
    pst_linear_bwd_args rows = lb;
    rows.row0 = 0;
    rows.row1 = 2; /* = OC */
    CHECK_OK(pst_op_linear_backward(s, &rows));
    rows.dw = rows.db = NULL;
    rows.dinp = f + 40;
    CHECK_ERR(pst_op_linear_backward(s, &rows), PST_ERR_INVALID); /* rows without dw */

    pst_relu_bwd_args rb = {.dinp = f, .dout = f, .out = f + 8, .n = 8};
    CHECK_ERR(pst_op_relu_backward(NULL, &rb), PST_ERR_INVALID);
    CHECK_ERR(pst_op_relu_backward(s, NULL), PST_ERR_INVALID);
    for (int k = 0; k < 4; k++) {
        pst_relu_bwd_args x = rb;
        if (k == 0) x.dinp = NULL;
        if (k == 1) x.dout = NULL;
        if (k == 2) x.out = NULL;
        if (k == 3) x.n = -1;
        CHECK_ERR(pst_op_relu_backward(s, &x), PST_ERR_INVALID);
    }

    pst_xent_args xa = {.losses = f, .correct = NULL, .dlogits = f + 8, .logits = f + 32,
                        .targets = t, .B = 2, .C = 4, .scale = 0.5f};
    CHECK_ERR(pst_op_softmax_xent(NULL, &xa), PST_ERR_INVALID);
    CHECK_ERR(pst_op_softmax_xent(s, NULL), PST_ERR_INVALID);
    for (int k = 0; k < 6; k++) {
        pst_xent_args x = xa;
        if (k == 0) x.losses = NULL;
        if (k == 1) x.dlogits = NULL;
        if (k == 2) x.logits = NULL;
        if (k == 3) x.targets = NULL;
        if (k == 4) x.B = -1;
        if (k == 5) x.C = 0;
        CHECK_ERR(pst_op_softmax_xent(s, &x), PST_ERR_INVALID);
    }

    pst_add_args aa = {.dst = f, .src = f + 8, .n = 8};
    CHECK_ERR(pst_op_add(NULL, &aa), PST_ERR_INVALID);
    CHECK_ERR(pst_op_add(s, NULL), PST_ERR_INVALID);
    aa.dst = NULL;
    CHECK_ERR(pst_op_add(s, &aa), PST_ERR_INVALID);
    aa = (pst_add_args){.dst = f, .src = NULL, .n = 8};
    CHECK_ERR(pst_op_add(s, &aa), PST_ERR_INVALID);

    pst_cast_args ca = {.dst = f, .dt = PST_F16, .src = f + 16, .st = PST_F32, .n = 8};
    CHECK_ERR(pst_op_cast(NULL, &ca), PST_ERR_INVALID);
    CHECK_ERR(pst_op_cast(s, NULL), PST_ERR_INVALID);
    for (int k = 0; k < 4; k++) {
        pst_cast_args x = ca;
        if (k == 0) x.dst = NULL;
        if (k == 1) x.src = NULL;
        if (k == 2) x.dt = PST_DTYPE_COUNT_;
        if (k == 3) x.st = (pst_dtype)7;
        CHECK_ERR(pst_op_cast(s, &x), PST_ERR_INVALID);
    }
    ca.n = 0;
    CHECK_OK(pst_op_cast(s, &ca));

    CHECK_OK(pst_stream_synchronize(s));
    dev_free(&be[0], f);
    dev_free(&be[0], t);
    backends_close(be, 1);
}

/* ---- stream order -------------------------------------------------------------------- */

static void sleep_us(unsigned us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Slowly writes `n` values into dst: work the ops after it must wait for. */
typedef struct slow_fill {
    float *dst;
    const float *src;
    size_t n;
    unsigned us;
} slow_fill;

static pst_status slow_fill_fn(void *arg)
{
    slow_fill *sf = arg;
    sleep_us(sf->us);
    memcpy(sf->dst, sf->src, sf->n * sizeof(float));
    return PST_OK;
}

static float *alloc_floats(pst_device *dev, size_t bytes)
{
    void *p = NULL;
    CHECK_OK(pst_device_alloc(dev, bytes, &p));
    return p;
}

/* Stream A: slow input write, linear_forward (+ReLU), event. Stream B (same or another
 * device): waits on the event, relu_backward reading A's output, add of A's output into a
 * buffer of B's device. Repeated with injected delays for several seeds. */
Test(ops_order, two_streams_with_events, .timeout = 60)
{
    static const char *const specs[] = {"cpu:1", "cpu:2"};
    static const uint64_t seeds[] = {0, 1, 7, 99};
    const int B = 16, IC = 24, OC = 12;
    const size_t ni = (size_t)B * IC, nw = (size_t)OC * IC, no = (size_t)B * OC;
    float *inp = randn(ni, 200), *w = randn(nw, 201), *bias = randn(OC, 202);
    float *dout = randn(no, 203), *acc0 = randn(no, 204);
    float *ref_out = malloc(sizeof(float) * no), *ref_dinp = malloc(sizeof(float) * no);
    float *ref_acc = copy_floats(acc0, no);
    pst_linear_forward(ref_out, inp, w, bias, B, IC, OC, 1);
    pst_relu_backward(ref_dinp, dout, ref_out, (int64_t)no);
    for (size_t j = 0; j < no; j++)
        ref_acc[j] += ref_out[j];

    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        for (size_t ki = 0; ki < sizeof seeds / sizeof seeds[0]; ki++) {
            pst_runtime *rt = NULL;
            CHECK_OK(pst_runtime_init(&rt, specs[si]));
            if (seeds[ki])
                pst_runtime_set_jitter(rt, seeds[ki], 500);
            pst_device *da = pst_runtime_device(rt, 0);
            pst_device *db = pst_runtime_device(rt, pst_runtime_count(rt) - 1);
            pst_stream *sa = NULL, *sb = NULL;
            pst_event *ev = NULL;
            CHECK_OK(pst_stream_create(da, &sa));
            CHECK_OK(pst_stream_create(db, &sb));
            CHECK_OK(pst_event_create(da, &ev));
            float *d_inp, *d_w, *d_b, *d_out, *d_dout, *d_dinp, *d_acc;
            d_inp = alloc_floats(da, sizeof(float) * ni);
            d_w = alloc_floats(da, sizeof(float) * nw);
            d_b = alloc_floats(da, sizeof(float) * OC);
            d_out = alloc_floats(da, sizeof(float) * no);
            d_dout = alloc_floats(db, sizeof(float) * no);
            d_dinp = alloc_floats(db, sizeof(float) * no);
            d_acc = alloc_floats(db, sizeof(float) * no);

            slow_fill fill = {.dst = d_inp, .src = inp, .n = ni, .us = 20000};
            CHECK_OK(pst_stream_launch(sa, slow_fill_fn, &fill));
            CHECK_OK(pst_memcpy_async(sa, d_w, w, sizeof(float) * nw, PST_COPY_HOST_TO_DEVICE));
            CHECK_OK(pst_memcpy_async(sa, d_b, bias, sizeof(float) * OC,
                                      PST_COPY_HOST_TO_DEVICE));
            pst_linear_fwd_args fa = {.out = d_out, .inp = d_inp, .w = d_w, .b = d_b,
                                      .B = B, .IC = IC, .OC = OC, .relu = 1};
            CHECK_OK(pst_op_linear_forward(sa, &fa));
            CHECK_OK(pst_event_record(ev, sa));

            CHECK_OK(pst_memcpy_async(sb, d_dout, dout, sizeof(float) * no,
                                      PST_COPY_HOST_TO_DEVICE));
            CHECK_OK(pst_memcpy_async(sb, d_acc, acc0, sizeof(float) * no,
                                      PST_COPY_HOST_TO_DEVICE));
            CHECK_OK(pst_stream_wait_event(sb, ev));
            pst_relu_bwd_args ra = {.dinp = d_dinp, .dout = d_dout, .out = d_out,
                                    .n = (int64_t)no};
            CHECK_OK(pst_op_relu_backward(sb, &ra));
            pst_add_args aa = {.dst = d_acc, .src = d_out, .n = no};
            CHECK_OK(pst_op_add(sb, &aa));
            float *got_dinp = malloc(sizeof(float) * no), *got_acc = malloc(sizeof(float) * no);
            CHECK_OK(pst_memcpy_async(sb, got_dinp, d_dinp, sizeof(float) * no,
                                      PST_COPY_DEVICE_TO_HOST));
            CHECK_OK(pst_memcpy_async(sb, got_acc, d_acc, sizeof(float) * no,
                                      PST_COPY_DEVICE_TO_HOST));
            CHECK_OK(pst_stream_synchronize(sb));
            backend cpu = {.spec = "cpu"};
            compare("relu_backward after an event", &cpu, got_dinp, ref_dinp, no, 1, 0, 0);
            compare("add after an event", &cpu, got_acc, ref_acc, no, 1, 0, 0);
            CHECK_OK(pst_stream_synchronize(sa));
            free(got_dinp);
            free(got_acc);
            pst_device_free(da, d_inp);
            pst_device_free(da, d_w);
            pst_device_free(da, d_b);
            pst_device_free(da, d_out);
            pst_device_free(db, d_dout);
            pst_device_free(db, d_dinp);
            pst_device_free(db, d_acc);
            pst_event_destroy(ev);
            pst_stream_destroy(sa);
            pst_stream_destroy(sb);
            pst_runtime_free(rt);
        }
    }
    free(inp);
    free(w);
    free(bias);
    free(dout);
    free(acc0);
    free(ref_out);
    free(ref_dinp);
    free(ref_acc);
}

static pst_status fail_fn(void *arg)
{
    (void)arg;
    return pst_error_set(PST_ERR_IO, "injected failure");
}

/* An op queued after a failed item is skipped; the stream reports the first error. */
Test(ops_order, ops_after_a_failure_are_skipped)
{
    pst_runtime *rt = NULL;
    pst_stream *s = NULL;
    CHECK_OK(pst_runtime_init(&rt, "cpu:1"));
    CHECK_OK(pst_stream_create(pst_runtime_device(rt, 0), &s));
    void *p = NULL;
    CHECK_OK(pst_device_alloc(pst_runtime_device(rt, 0), 8 * sizeof(float), &p));
    float *d = p;
    float one[4] = {1, 1, 1, 1};
    CHECK_OK(pst_memcpy_async(s, d + 4, one, sizeof one, PST_COPY_HOST_TO_DEVICE));
    CHECK_OK(pst_stream_launch(s, fail_fn, NULL));
    pst_add_args a = {.dst = d, .src = d + 4, .n = 4};
    CHECK_OK(pst_op_add(s, &a));
    pst_error_clear();
    cr_assert_eq(pst_stream_synchronize(s), PST_ERR_IO);
    cr_assert(strstr(pst_error_detail(), "injected failure") != NULL, "%s", pst_error_detail());
    for (int i = 0; i < 4; i++)
        cr_assert_eq(d[i], 0.0f, "the add ran on a failed stream");
    pst_device_free(pst_runtime_device(rt, 0), p);
    pst_stream_destroy(s);
    pst_runtime_free(rt);
}

/* ---- the CPU ops against naive loops --------------------------------------------------
 * The parity tests above compare each op with the kernel it calls; these compare the CPU
 * ops, as the executor queues them (on a stream, split over a 2-thread pool), with plain
 * loops in double written here from ops.h's formulas. A bug shared by an op and its kernel
 * shows here. Tolerances: GEMM-like sums of K float products against double, |err| <=
 * 1e-5 * (1 + sum |a_k b_k|); elementwise ops in float are exact where the formula is one
 * float operation (ReLU mask, add), else 2 ulp-ish relative 1e-6. */

static int naive_close(double got, double want, double scale, double rtol)
{
    return fabs(got - want) <= rtol * (1.0 + scale);
}

Test(ops_naive, linear_forward_backward_and_row_ranges)
{
    pst_runtime *rt = NULL;
    CHECK_OK(pst_runtime_init(&rt, "cpu:1"));
    pst_device *dev = pst_runtime_device(rt, 0);
    pst_stream *s;
    CHECK_OK(pst_stream_create(dev, &s));
    pst_pool *pool;
    CHECK_OK(pst_pool_init(&pool, 2));
    const int dims[][3] = {{1, 3, 2}, {7, 13, 5}, {9, 40, 600}}; /* 600 rows: 3 tiles */
    for (int k = 0; k < 3; k++) {
        const int B = dims[k][0], IC = dims[k][1], OC = dims[k][2];
        float *inp = randn((size_t)B * IC, 300 + k), *w = randn((size_t)OC * IC, 310 + k);
        float *bias = randn((size_t)OC, 320 + k), *dout = randn((size_t)B * OC, 330 + k);
        float *out = calloc((size_t)B * OC, sizeof(float));
        float *dw = randn((size_t)OC * IC, 340 + k), *db = randn((size_t)OC, 350 + k);
        float *dw0 = copy_floats(dw, (size_t)OC * IC), *db0 = copy_floats(db, (size_t)OC);
        float *dinp = calloc((size_t)B * IC, sizeof(float));
        for (int relu = 0; relu < 2; relu++) {
            pst_linear_fwd_args f = {.out = out, .inp = inp, .w = w, .b = bias, .B = B, .IC = IC,
                                     .OC = OC, .relu = relu, .pool = pool};
            CHECK_OK(pst_op_linear_forward(s, &f));
            CHECK_OK(pst_stream_synchronize(s));
            for (int r = 0; r < B; r++)
                for (int j = 0; j < OC; j++) {
                    double acc = bias[j], mag = fabs(bias[j]);
                    for (int i = 0; i < IC; i++) {
                        acc += (double)inp[r * IC + i] * w[j * IC + i];
                        mag += fabs((double)inp[r * IC + i] * w[j * IC + i]);
                    }
                    if (relu && acc < 0)
                        acc = 0;
                    cr_assert(naive_close(out[r * OC + j], acc, mag, 1e-5),
                              "forward %dx%dx%d relu %d: out[%d][%d] = %.9g, loops %.9g", B, IC,
                              OC, relu, r, j, out[r * OC + j], acc);
                }
        }
        /* Weight gradient of rows [row0, row1) accumulated onto dw0/db0, then the input
         * gradient: rows outside the range keep their old values. */
        const int row0 = OC > 256 ? 256 : 0, row1 = OC > 256 ? 512 : OC;
        pst_linear_bwd_args bw = {.dw = dw, .db = db, .dout = dout, .inp = inp, .w = w, .B = B,
                                  .IC = IC, .OC = OC, .accumulate = 1, .row0 = row0,
                                  .row1 = row1, .pool = pool};
        pst_linear_bwd_args bx = {.dinp = dinp, .dout = dout, .inp = inp, .w = w, .B = B,
                                  .IC = IC, .OC = OC, .pool = pool};
        CHECK_OK(pst_op_linear_backward(s, &bw));
        CHECK_OK(pst_op_linear_backward(s, &bx));
        CHECK_OK(pst_stream_synchronize(s));
        for (int j = 0; j < OC; j++) {
            const int in_range = j >= row0 && j < row1;
            double g = db0[j], mag = fabs(db0[j]);
            for (int r = 0; r < B; r++) {
                g += in_range ? dout[r * OC + j] : 0.0;
                mag += fabs(dout[r * OC + j]);
            }
            cr_assert(naive_close(db[j], g, mag, 1e-5), "db[%d] = %.9g, loops %.9g (rows %d..%d)",
                      j, db[j], g, row0, row1);
            for (int i = 0; i < IC; i++) {
                double a = dw0[j * IC + i], am = fabs(a);
                for (int r = 0; r < B && in_range; r++) {
                    a += (double)dout[r * OC + j] * inp[r * IC + i];
                    am += fabs((double)dout[r * OC + j] * inp[r * IC + i]);
                }
                cr_assert(naive_close(dw[j * IC + i], a, am, 1e-5),
                          "dw[%d][%d] = %.9g, loops %.9g (rows %d..%d)", j, i, dw[j * IC + i], a,
                          row0, row1);
            }
        }
        for (int r = 0; r < B; r++)
            for (int i = 0; i < IC; i++) {
                double a = 0, am = 0;
                for (int j = 0; j < OC; j++) {
                    a += (double)dout[r * OC + j] * w[j * IC + i];
                    am += fabs((double)dout[r * OC + j] * w[j * IC + i]);
                }
                cr_assert(naive_close(dinp[r * IC + i], a, am, 1e-5),
                          "dinp[%d][%d] = %.9g, loops %.9g", r, i, dinp[r * IC + i], a);
            }
        free(inp); free(w); free(bias); free(dout); free(out); free(dw); free(db);
        free(dw0); free(db0); free(dinp);
    }
    pst_pool_free(pool);
    pst_stream_destroy(s);
    pst_runtime_free(rt);
}

Test(ops_naive, relu_add_softmax_xent)
{
    pst_runtime *rt = NULL;
    CHECK_OK(pst_runtime_init(&rt, "cpu:1"));
    pst_stream *s;
    CHECK_OK(pst_stream_create(pst_runtime_device(rt, 0), &s));
    enum { B = 6, C = 11, N = 37 };
    float *dout = randn(N, 400), *outv = randn(N, 401), *dinp = calloc(N, sizeof(float));
    pst_relu_bwd_args ra = {.dinp = dinp, .dout = dout, .out = outv, .n = N};
    float *dst = randn(N, 402), *src = randn(N, 403), *dst0 = copy_floats(dst, N);
    pst_add_args aa = {.dst = dst, .src = src, .n = N};
    float *logits = randn(B * C, 404), losses[B], dlog[B * C];
    int32_t targets[B] = {0, 10, 3, 3, 7, 1}, correct = 2;
    const float scale = 1.0f / 64;
    pst_xent_args xa = {.losses = losses, .correct = &correct, .dlogits = dlog,
                        .logits = logits, .targets = targets, .B = B, .C = C, .scale = scale};
    CHECK_OK(pst_op_relu_backward(s, &ra));
    CHECK_OK(pst_op_add(s, &aa));
    CHECK_OK(pst_op_softmax_xent(s, &xa));
    CHECK_OK(pst_stream_synchronize(s));
    for (int i = 0; i < N; i++) {
        cr_assert_eq(dinp[i], outv[i] > 0 ? dout[i] : 0.0f, "relu backward %d", i);
        cr_assert_eq(dst[i], dst0[i] + src[i], "add %d", i);
    }
    int want_correct = 2;
    for (int r = 0; r < B; r++) {
        double mx = logits[r * C], sum = 0;
        int best = 0;
        for (int j = 1; j < C; j++)
            if (logits[r * C + j] > logits[r * C + best])
                best = j;
        mx = logits[r * C + best];
        for (int j = 0; j < C; j++)
            sum += exp((double)logits[r * C + j] - mx);
        const double loss = log(sum) - ((double)logits[r * C + targets[r]] - mx);
        cr_assert(naive_close(losses[r], loss, fabs(loss), 1e-6), "loss %d: %.9g vs %.9g", r,
                  losses[r], loss);
        want_correct += best == targets[r];
        for (int j = 0; j < C; j++) {
            const double p = exp((double)logits[r * C + j] - mx) / sum;
            const double g = (p - (j == targets[r])) * scale;
            cr_assert(naive_close(dlog[r * C + j], g, 0.0, 1e-7), "dlogits[%d][%d] %.9g vs %.9g",
                      r, j, dlog[r * C + j], g);
        }
    }
    cr_assert_eq(correct, want_correct, "correct %d, loops %d", correct, want_correct);
    free(dout); free(outv); free(dinp); free(dst); free(src); free(dst0); free(logits);
    pst_stream_destroy(s);
    pst_runtime_free(rt);
}

