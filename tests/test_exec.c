/* test_exec.c — the multi-device executor in one process (local mode), on the real
 * Fashion-MNIST files: the same global batch on cpu:1, cpu:2 and cpu:4 gives the same
 * parameters (relative L2 difference <= 1e-6); overlap on and off give the same bits; random
 * delays injected in every stream (the jitter test hook) over many seeds neither deadlock nor
 * lose a block: the bits equal the undelayed run; --cpu-replicas 1 (a parameter copy per
 * device, the GPU schedule) gives the bits of the shared copy. Also built under ThreadSanitizer
 * (make test-tsan). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/nn/gemm_bf16.h"
#include "common/data/data.h"
#include "common/nn/models/models.h"
#include "common/optim.h"
#include "ref_mlp.h"
#include "common/runtime/device.h"
#include "trainer/exec.h"
#include "trainer/local.h"

static pst_dataset train_set, test_set;
static uint32_t *order; /* epoch 0's order of the training set, seed 3 */

static void load(void)
{
    if (train_set.n)
        return;
    pst_status st = pst_dataset_load_idx_dir(&train_set, &test_set,
                                                   "/usr/share/datasets/fashion-mnist");
    cr_assert_eq(st, PST_OK, "%s", pst_error_detail());
    order = malloc(sizeof(uint32_t) * train_set.n);
    pst_epoch_order(order, train_set.n, 3, 0);
}

/* Step s's batch of B rows (every run below sees the same batches). */
static void batch_of(int s, int B, float *x, int32_t *y)
{
    pst_dataset_gather(&train_set, order + (size_t)s * B, B, x, y);
}

/* Trains `steps` steps of a small MLP on `devices` and returns device 0's parameters. */
static const char *compute_cpus = ""; /* --compute-cpus of the runs below */
static int cpu_replicas;              /* --cpu-replicas of the runs below */
static int exec_threads = 2;          /* threads per device */
static pst_dtype precision = PST_F32; /* --precision of the runs below */
static int acc_steps = 1;             /* --acc-steps of the runs below */
static size_t param_bytes;            /* tr_exec_memory_of(0).params of the last run */
static size_t peak0;                  /* device 0's peak bytes in the last run */

static const char *no_env(const char *name)
{
    (void)name;
    return NULL;
}

/* An MLP trained alone on `devices` through the executor (the in-process store behind the
 * link interface): everything one run holds. */
typedef struct local_run {
    pst_runtime *rt;
    pst_model model;
    tr_plan plan;
    tr_link *link;
    tr_exec *ex;
} local_run;

/* The jitter test hook of the runs local_run_open starts (train_b sets it). */
static tr_test_hooks run_hooks = {.crash_step = -1, .overflow_step = -1};

static void local_run_open(local_run *r, const pst_config *cfg, const char *devices,
                           int nhidden, const int *hidden, int max_rows, int eval_rows,
                           int overlap, int threads)
{
    load();
    cr_assert_eq(pst_runtime_init(&r->rt, devices), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(pst_model_mlp(&r->model, train_set.dim, 10, nhidden, hidden), PST_OK);
    cr_assert_eq(tr_plan_build(&r->plan, r->model.nparams, cfg->block_bytes, 1,
                               pst_runtime_count(r->rt)), PST_OK);
    const tr_link_settings ls = tr_link_settings_of(cfg, &r->plan);
    cr_assert_eq(tr_local_init(&r->link, &ls, &r->plan), PST_OK);
    tr_exec_config ec = {.cfg = tr_exec_settings_of(cfg),
                         .rt = r->rt, .model = &r->model, .max_rows = max_rows,
                         .eval_rows = eval_rows, .link = r->link, .overlap = overlap,
                         .threads = threads, .hooks = &run_hooks};
    r->ex = NULL;
    cr_assert_eq(tr_exec_init(&r->ex, &ec), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(tr_exec_start(r->ex, 3), PST_OK, "%s", pst_error_detail());
}

static void local_run_close(local_run *r)
{
    tr_exec_free(r->ex);
    tr_link_free(r->link);
    tr_plan_free(&r->plan);
    pst_model_free(&r->model);
    pst_runtime_free(r->rt);
}

static float *train_b(const char *devices, int overlap, uint64_t jitter_seed,
                      unsigned jitter_us, int steps, int B, size_t *n_out, double *acc_out)
{
    load();
    pst_config cfg;
    pst_config_defaults(&cfg);
    cfg.block_bytes = 2048; /* many blocks over the devices */
    cfg.optim.kind = PST_OPTIM_MOMENTUM;
    cfg.optim.lr = 0.05f;
    run_hooks.jitter_seed = jitter_seed;
    run_hooks.jitter_us = jitter_us;
    cfg.cpu_replicas = cpu_replicas;
    cfg.precision = cfg.grad_dtype = precision;
    cfg.acc_steps = acc_steps;
    if (*compute_cpus) { /* parsed as the trainer parses it */
        pst_config pinned;
        const char *argv[] = {"test", "--compute-cpus", compute_cpus};
        cr_assert_eq(pst_config_load(&pinned, PST_ROLE_TRAINER, 3, (char **)argv, no_env), PST_OK);
        memcpy(cfg.compute_cpus, pinned.compute_cpus, sizeof cfg.compute_cpus);
        memcpy(cfg.compute_cpu_mask, pinned.compute_cpu_mask, sizeof cfg.compute_cpu_mask);
    }
    /* Two threads per device: every layer and optimizer pass is split over a team (the
     * TSan build sees the team's hand-overs too). */
    local_run run;
    local_run_open(&run, &cfg, devices, 2, (const int[]){24, 16}, B, 64, overlap, exec_threads);
    tr_exec *ex = run.ex;
    float *x = malloc(sizeof(float) * B * train_set.dim);
    int32_t *y = malloc(sizeof(int32_t) * B);
    for (int s = 0; s < steps; s++) {
        batch_of(s, B, x, y);
        double loss;
        cr_assert_eq(tr_exec_step(ex, s, x, y, B, B, &loss), PST_OK, "%s", pst_error_detail());
        cr_assert(isfinite(loss) && loss > 0);
    }
    cr_assert_eq(tr_exec_sync(ex), PST_OK, "%s", pst_error_detail());
    size_t n = tr_exec_nparams(ex);
    float *p = malloc(sizeof(float) * n);
    cr_assert_eq(tr_exec_params(ex, p), PST_OK);
    if (acc_out)
        cr_assert_eq(tr_exec_evaluate(ex, &test_set, acc_out), PST_OK, "%s", pst_error_detail());
    param_bytes = tr_exec_memory_of(ex, 0).params;
    peak0 = tr_exec_memory_of(ex, 0).peak;
    for (int d = 0; d < pst_runtime_count(run.rt); d++) {
        const tr_exec_memory m = tr_exec_memory_of(ex, d);
        cr_assert_gt(m.peak, n * (pst_dtype_size(precision) + sizeof(float)), /* params + grads */
                     "device %d peak", d);
        cr_assert_eq(m.params, n * pst_dtype_size(precision), "device %d", d);
        cr_assert_eq(m.grads, n * sizeof(float), "device %d", d);
        cr_assert(m.acts > 0 && m.grads + m.acts <= m.peak, "device %d: %zu + %zu > peak %zu", d,
                  m.grads, m.acts, m.peak);
    }
    local_run_close(&run);
    free(x);
    free(y);
    *n_out = n;
    return p;
}

/* B = 37: odd, so the devices get unequal shares. */
static float *train(const char *devices, int overlap, uint64_t jitter_seed, unsigned jitter_us,
                    int steps, size_t *n_out, double *acc_out)
{
    return train_b(devices, overlap, jitter_seed, jitter_us, steps, 37, n_out, acc_out);
}

static double l2(const float *p, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)p[i] * p[i];
    return sqrt(s);
}

Test(exec, same_parameters_on_1_2_4_devices, .timeout = 120)
{
    size_t n1, n2, n4;
    double acc;
    float *p1 = train("cpu:1", 1, 0, 0, 60, &n1, &acc);
    float *p2 = train("cpu:2", 1, 0, 0, 60, &n2, NULL);
    float *p4 = train("cpu:4", 1, 0, 0, 60, &n4, NULL);
    cr_assert_eq(n1, n2);
    cr_assert_eq(n1, n4);
    double a = l2(p1, n1), b = l2(p2, n2), c = l2(p4, n4);
    cr_log_info("param_l2 cpu:1 %.9g cpu:2 %.9g cpu:4 %.9g, test_acc %.4f\n", a, b, c, acc);
    cr_assert_leq(fabs(b - a) / a, 1e-6, "cpu:2 %.9g vs cpu:1 %.9g", b, a);
    cr_assert_leq(fabs(c - a) / a, 1e-6, "cpu:4 %.9g vs cpu:1 %.9g", c, a);
    /* elementwise too, not just the norm */
    for (size_t i = 0; i < n1; i++)
        cr_assert_leq(fabs(p4[i] - p1[i]), 1e-5 + 1e-4 * fabs(p1[i]), "param %zu", i);
    cr_assert_gt(acc, 0.3, "training did not learn (test_acc %.3f)", acc);
    free(p1);
    free(p2);
    free(p4);
}

Test(exec, overlap_off_gives_the_same_bits, .timeout = 120)
{
    size_t n, m;
    float *a = train("cpu:2", 1, 0, 0, 15, &n, NULL);
    float *b = train("cpu:2", 0, 0, 0, 15, &m, NULL);
    cr_assert_eq(n, m);
    cr_assert_eq(memcmp(a, b, n * sizeof(float)), 0, "overlap changed the result");
    free(a);
    free(b);
}

Test(exec, random_stream_delays_lose_nothing, .timeout = 300)
{
    size_t n, m;
    float *ref = train("cpu:4", 1, 0, 0, 6, &n, NULL);
    for (uint64_t seed = 1; seed <= 8; seed++) {
        float *p = train("cpu:4", 1, seed, 300, 6, &m, NULL);
        cr_assert_eq(n, m);
        /* The reduce order is fixed, so delays may change timing but never the bits. */
        cr_assert_eq(memcmp(ref, p, n * sizeof(float)), 0, "seed %llu changed the result",
                     (unsigned long long)seed);
        free(p);
    }
    free(ref);
}

/* --cpu-replicas 1: every device its own parameter copy, so the GPU schedule runs (the
 * owner's optimizer on its copy, then a broadcast to the others, each device's forward
 * waiting on its own ready events). Same arithmetic in the same order as the shared copy:
 * the same bits, with and without overlap, under every jitter seed. */
Test(exec, replicas_equal_shared_under_delays, .timeout = 300)
{
    size_t n, m;
    float *ref = train("cpu:4", 1, 0, 0, 6, &n, NULL);
    cpu_replicas = 1;
    float *serial = train("cpu:4", 0, 0, 0, 6, &m, NULL);
    cr_assert_eq(n, m);
    cr_assert_eq(memcmp(ref, serial, n * sizeof(float)), 0, "replicas, overlap 0: other bits");
    free(serial);
    for (uint64_t seed = 0; seed <= 8; seed++) {
        float *p = train("cpu:4", 1, seed, seed ? 300 : 0, 6, &m, NULL);
        cr_assert_eq(n, m);
        cr_assert_eq(memcmp(ref, p, n * sizeof(float)), 0,
                     "replicas, jitter seed %llu: other bits than the shared copy",
                     (unsigned long long)seed);
        free(p);
    }
    free(ref);
}

/* --acc-steps K: the step's rows in K micro-batches whose fp32 gradients accumulate on the
 * device, one push per block per step. Not bit for bit (a sum of K partial GEMMs rounds
 * otherwise than one), within 1e-6 relative, on 1 and 2 devices. */
Test(exec, micro_batches_1_2_4_equal_within_1e6, .timeout = 120)
{
    size_t n, m;
    double acc;
    float *ref = train("cpu:1", 1, 0, 0, 40, &n, NULL);
    const int ks[] = {2, 4};
    for (int i = 0; i < 2; i++)
        for (int dv = 0; dv < 2; dv++) {
            acc_steps = ks[i];
            float *p = train(dv ? "cpu:2" : "cpu:1", 1, 0, 0, 40, &m, dv ? NULL : &acc);
            acc_steps = 1;
            cr_assert_eq(n, m);
            double a = l2(ref, n), b = l2(p, m);
            cr_log_info("acc-steps %d cpu:%d: param_l2 %.9g vs %.9g (rel %.3g)\n", ks[i],
                        dv + 1, b, a, fabs(b - a) / a);
            cr_assert_leq(fabs(b - a) / a, 1e-6, "acc-steps %d cpu:%d: %.9g vs %.9g", ks[i],
                          dv + 1, b, a);
            for (size_t j = 0; j < n; j++)
                cr_assert_leq(fabs(p[j] - ref[j]), 1e-5 + 1e-4 * fabs(ref[j]), "param %zu", j);
            if (!dv)
                cr_assert_gt(acc, 0.3, "acc-steps %d did not learn (%.3f)", ks[i], acc);
            free(p);
        }
    free(ref);
}

/* bf16 and fp16 parameters: the devices hold 2 bytes per parameter (device 0's memory is
 * the fp32 run's minus 2 bytes per parameter plus the fp32 scratch of the widest layer,
 * exactly), the run learns, ends near the fp32 run, and every schedule (devices sharing
 * one copy or each its own, overlap on or off, micro-batches) gives the same bits, since
 * the casts and the fp32 sums are the same. */
Test(exec, low_precision_two_bytes_and_schedules_agree, .timeout = 240)
{
    size_t n, m;
    float *f32 = train("cpu:2", 1, 0, 0, 40, &n, NULL);
    cr_assert_eq(param_bytes, n * sizeof(float));
    const size_t f32_peak = peak0;
    const size_t widest = (size_t)train_set.dim * 24 + 24; /* the MLP's first layer */
    const pst_dtype dts[] = {PST_BF16, PST_F16};
    for (int t = 0; t < 2; t++) {
        precision = dts[t];
        double acc;
        float *p = train("cpu:2", 1, 0, 0, 40, &m, &acc);
        cr_assert_eq(n, m);
        cr_assert_eq(param_bytes, n * 2, "%s: %zu parameter bytes for %zu parameters",
                     pst_dtype_name(precision), param_bytes, n);
        cr_assert_eq(peak0 + 2 * n, f32_peak + widest * sizeof(float),
                     "%s: device 0 peaks at %zu bytes, fp32 at %zu: not 2 bytes per parameter "
                     "plus a %zu-float scratch", pst_dtype_name(precision), peak0, f32_peak,
                     widest);
        double a = l2(f32, n), b = l2(p, n);
        cr_log_info("%s: param_l2 %.9g vs fp32 %.9g, test_acc %.4f\n", pst_dtype_name(precision),
                    b, a, acc);
        cr_assert_gt(acc, 0.3, "%s did not learn (%.3f)", pst_dtype_name(precision), acc);
        cr_assert_leq(fabs(b - a) / a, 2e-2, "%s: param_l2 %.9g vs fp32 %.9g",
                      pst_dtype_name(precision), b, a);
        cpu_replicas = 1; /* the staging + broadcast of 2-byte values */
        float *r = train("cpu:2", 0, 0, 0, 40, &m, NULL);
        cpu_replicas = 0;
        cr_assert_eq(memcmp(p, r, n * sizeof(float)), 0, "%s: replicas changed the bits",
                     pst_dtype_name(precision));
        float *j = train("cpu:2", 1, 5, 200, 40, &m, NULL);
        cr_assert_eq(memcmp(p, j, n * sizeof(float)), 0, "%s: stream delays changed the bits",
                     pst_dtype_name(precision));
        acc_steps = 2;
        float *k = train("cpu:2", 1, 0, 0, 40, &m, NULL);
        acc_steps = 1;
        double c = l2(k, n);
        cr_assert_leq(fabs(c - b) / b, 1e-3, "%s: acc-steps 2 param_l2 %.9g vs %.9g",
                      pst_dtype_name(precision), c, b);
        free(p);
        free(r);
        free(j);
        free(k);
    }
    precision = PST_F32;
    free(f32);
}

Test(exec, fewer_rows_than_devices, .timeout = 120)
{
    /* 3 rows on 4 devices: one device has none and contributes a zero gradient. */
    size_t n, m;
    float *a = train_b("cpu:1", 1, 0, 0, 20, 3, &n, NULL);
    float *b = train_b("cpu:4", 1, 0, 0, 20, 3, &m, NULL);
    cr_assert_eq(n, m);
    double la = l2(a, n), lb = l2(b, m);
    cr_assert_leq(fabs(la - lb) / la, 1e-6, "cpu:4 %.9g vs cpu:1 %.9g", lb, la);
    free(a);
    free(b);
}

/* --compute-cpus pins the compute threads and changes no bit; a CPU the process may not
 * use is a clear error at start, not a hang. */
Test(exec, compute_threads_pinned)
{
    size_t n1, n2;
    float *free_run = train_b("cpu:2", 1, 0, 0, 4, 37, &n1, NULL);
    compute_cpus = "0";
    float *pinned = train_b("cpu:2", 1, 0, 0, 4, 37, &n2, NULL);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(free_run, pinned, n1 * sizeof(float)), 0, "pinning changed the bits");
    free(free_run);
    free(pinned);

    load();
    pst_config cfg;
    pst_config_defaults(&cfg);
    const char *argv[] = {"test", "--compute-cpus", "1023"}; /* no such CPU here */
    cr_assert_eq(pst_config_load(&cfg, PST_ROLE_TRAINER, 3, (char **)argv, no_env), PST_OK);
    pst_runtime *rt = NULL;
    cr_assert_eq(pst_runtime_init(&rt, "cpu:1"), PST_OK);
    pst_model model;
    cr_assert_eq(pst_model_mlp(&model, train_set.dim, 10, 1, (const int[]){8}), PST_OK);
    tr_plan plan;
    cr_assert_eq(tr_plan_build(&plan, model.nparams, cfg.block_bytes, 1, 1), PST_OK);
    tr_link *link;
    const tr_link_settings ls = tr_link_settings_of(&cfg, &plan);
    cr_assert_eq(tr_local_init(&link, &ls, &plan), PST_OK);
    tr_exec_config ec = {.cfg = tr_exec_settings_of(&cfg),
                         .rt = rt, .model = &model, .max_rows = 4, .eval_rows = 4,
                         .link = link,
                         .overlap = 1, .threads = 2};
    tr_exec *ex = NULL;
    cr_assert_eq(tr_exec_init(&ex, &ec), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(tr_exec_start(ex, 3), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "--compute-cpus=1023"), "%s", pst_error_detail());
    tr_exec_free(ex);
    tr_link_free(link);
    tr_plan_free(&plan);
    pst_model_free(&model);
    pst_runtime_free(rt);
}

/* The executor against a reference step: the tests' reference MLP (ref_mlp.c: the plain CPU
 * kernels of layers.h called one after another on the host) and the optimizer applied to
 * the whole buffer at once. The executor runs the model interface's MLP (ops on streams,
 * the optimizer block by block on the owner devices). With one device and one thread the
 * arithmetic is the same, and so must be the bits. A thread team splits the forward and
 * input-gradient GEMMs by output columns, and OpenBLAS's kernels give a column other bits
 * in a call of another width (measured: AMD EPYC, OPENBLAS_CORETYPE=Haswell); two devices
 * sum their rows separately before the reduce: within 1e-5 relative per parameter. */
static void reference_steps(float *params, int steps, int B)
{
    load();
    pst_runtime *rt = NULL;
    cr_assert_eq(pst_runtime_init(&rt, "cpu:1"), PST_OK);
    ref_mlp m;
    ref_mlp_config mc = {.in_dim = train_set.dim, .out_dim = 10, .nhidden = 2, .hidden = {24, 16}};
    cr_assert_eq(ref_mlp_init(&m, &mc, B, pst_runtime_device(rt, 0)), PST_OK);
    ref_mlp_init_params(&m, 3);
    pst_optim_config oc;
    pst_config cfg;
    pst_config_defaults(&cfg);
    oc = cfg.optim;
    oc.kind = PST_OPTIM_MOMENTUM;
    oc.lr = 0.05f;
    float *state = calloc(m.nparams, sizeof(float));
    float *x = malloc(sizeof(float) * B * train_set.dim);
    int32_t *y = malloc(sizeof(int32_t) * B);
    for (int s = 0; s < steps; s++) {
        batch_of(s, B, x, y);
        ref_mlp_forward(&m, x, y, B);
        ref_mlp_backward(&m, x, y, B, 1.0f / (float)B, 0, NULL, NULL);
        cr_assert_eq(pst_optim_apply(&oc, s + 1, m.params, state, m.nparams, m.grads,
                                     m.nparams), PST_OK);
    }
    memcpy(params, m.params, sizeof(float) * m.nparams);
    ref_mlp_free(&m);
    pst_runtime_free(rt);
    free(state);
    free(x);
    free(y);
}

Test(exec, steps_equal_the_reference_kernels, .timeout = 120)
{
    const int steps = 5;
    size_t n;
    exec_threads = 1;
    float *p1 = train("cpu:1", 1, 0, 0, steps, &n, NULL);
    float *ref = malloc(sizeof(float) * n);
    reference_steps(ref, steps, 37);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(memcmp(&p1[i], &ref[i], sizeof(float)), 0,
                     "cpu:1, 1 thread: param %zu is %.9g, the reference step gives %.9g", i,
                     p1[i], ref[i]);
    free(p1);
    exec_threads = 2;
    const char *devices[3] = {"cpu:1", "cpu:2", "cpu:2"};
    for (int k = 0; k < 3; k++) {
        cpu_replicas = k == 2;
        size_t m;
        float *p = train(devices[k], 1, 0, 0, steps, &m, NULL);
        cr_assert_eq(n, m);
        for (size_t i = 0; i < n; i++)
            cr_assert_leq(fabs(p[i] - ref[i]), 1e-5 * fabs(ref[i]) + 1e-7,
                          "%s, 2 threads, replicas %d: param %zu is %.9g, the reference %.9g",
                          devices[k], cpu_replicas, i, p[i], ref[i]);
        free(p);
    }
    free(ref);
}

/* Training alone on one CPU device the update is made during backward, tile by tile: a
 * batch with a NaN makes a NaN gradient, and the step fails with the element named and the
 * word that the update is partly applied (on two devices, where the update waits for the
 * reduce, the whole push is refused: "discarded"), from the step or the sync after it. */
Test(exec, nan_gradient_alone_stops_the_step_naming_it, .timeout = 120)
{
    const char *devices[2] = {"cpu:1", "cpu:2"};
    const char *said[2] = {"partly applied", "discarded"};
    for (int k = 0; k < 2; k++) {
        pst_config cfg;
        pst_config_defaults(&cfg);
        cfg.optim.kind = PST_OPTIM_MOMENTUM;
        local_run run;
        local_run_open(&run, &cfg, devices[k], 1, (const int[]){24}, 32, 32, 1, 2);
        tr_exec *ex = run.ex;
        float *x = malloc(sizeof(float) * 32 * train_set.dim);
        int32_t *y = malloc(sizeof(int32_t) * 32);
        double loss;
        batch_of(0, 32, x, y);
        cr_assert_eq(tr_exec_step(ex, 0, x, y, 32, 32, &loss), PST_OK, "%s", pst_error_detail());
        batch_of(1, 32, x, y);
        x[5 * train_set.dim + 100] = NAN; /* row 5: every first-layer gradient row gets it */
        pst_status st = tr_exec_step(ex, 1, x, y, 32, 32, &loss);
        if (st == PST_OK) /* the exchanges may end after the step returned (overlap) */
            st = tr_exec_sync(ex);
        cr_assert_eq(st, PST_ERR_INVALID, "%s: a NaN batch gave %s", devices[k],
                     pst_strerror(st));
        cr_assert(strstr(pst_error_detail(), "has nan at element"), "%s", pst_error_detail());
        cr_assert(strstr(pst_error_detail(), said[k]), "%s: %s", devices[k], pst_error_detail());
        local_run_close(&run);
        free(x);
        free(y);
    }
}

/* ---- the GPT through the executor ------------------------------------------------------
 * A small GPT (2 blocks, 2 heads, 32 channels, context 16) on the King James Bible: on cpu:2
 * the shared copy, overlap off, --cpu-replicas 1 and random stream delays all give the same
 * bits (the tied embedding's gradient is written by the head and added to by the embedding
 * on every schedule); on cpu:1 with one thread, five AdamW steps equal the tests' reference
 * GPT (ref_gpt.c) and pst_optim_apply over the whole buffer, bit for bit. */
#include "common/data/text.h"
#include "ref_gpt.h"

enum { GPT_T = 16, GPT_B = 6 };

static float *train_gpt(const char *devices, int overlap, uint64_t jitter_seed, int steps,
                        int replicas, int threads, size_t *n_out)
{
    pst_text text;
    cr_assert_eq(pst_text_load(&text, PST_KJV_PATH, GPT_T), PST_OK, "%s", pst_error_detail());
    pst_config cfg;
    pst_config_defaults(&cfg);
    cfg.block_bytes = 8192; /* 14 blocks of the 28k parameters */
    cfg.precision = cfg.grad_dtype = precision;
    cfg.optim.kind = PST_OPTIM_ADAMW;
    cfg.optim.lr = 3e-3f;
    cfg.optim.beta2 = 0.99f;
    cfg.optim.weight_decay = 0.0f;
    const tr_test_hooks hooks = {.crash_step = -1, .overflow_step = -1,
                                 .jitter_seed = jitter_seed, .jitter_us = jitter_seed ? 300 : 0};
    cfg.cpu_replicas = replicas;
    pst_runtime *rt = NULL;
    cr_assert_eq(pst_runtime_init(&rt, devices), PST_OK, "%s", pst_error_detail());
    pst_model model;
    cr_assert_eq(pst_model_gpt(&model, text.vocab, GPT_T, 2, 2, 32), PST_OK);
    tr_plan plan;
    cr_assert_eq(tr_plan_build(&plan, model.nparams, cfg.block_bytes, 1, pst_runtime_count(rt)),
                 PST_OK);
    tr_link *link;
    const tr_link_settings ls = tr_link_settings_of(&cfg, &plan);
    cr_assert_eq(tr_local_init(&link, &ls, &plan), PST_OK);
    tr_exec_config ec = {.cfg = tr_exec_settings_of(&cfg),
                         .rt = rt, .model = &model, .max_rows = GPT_B,
                         .eval_rows = GPT_B, .link = link, .overlap = overlap,
                         .threads = threads, .hooks = &hooks};
    tr_exec *ex = NULL;
    cr_assert_eq(tr_exec_init(&ex, &ec), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(tr_exec_start(ex, 5), PST_OK, "%s", pst_error_detail());
    int32_t x[GPT_B * GPT_T], y[GPT_B * GPT_T];
    for (int s = 0; s < steps; s++) {
        pst_text_train_rows(&text, GPT_T, 5, s, GPT_B, 0, GPT_B, x, y);
        double loss;
        cr_assert_eq(tr_exec_step(ex, s, x, y, GPT_B, GPT_B, &loss), PST_OK, "%s",
                     pst_error_detail());
        cr_assert(isfinite(loss) && loss > 0);
    }
    cr_assert_eq(tr_exec_sync(ex), PST_OK, "%s", pst_error_detail());
    *n_out = tr_exec_nparams(ex);
    float *p = malloc(sizeof(float) * *n_out);
    cr_assert_eq(tr_exec_params(ex, p), PST_OK);
    tr_exec_free(ex);
    tr_link_free(link);
    tr_plan_free(&plan);
    pst_model_free(&model);
    pst_runtime_free(rt);
    pst_text_free(&text);
    return p;
}

Test(exec, gpt_schedules_give_the_same_bits, .timeout = 300)
{
    size_t n, m;
    float *ref = train_gpt("cpu:2", 1, 0, 4, 0, 2, &n);
    const struct {
        int overlap, replicas;
        uint64_t jitter;
    } runs[] = {{0, 0, 0}, {1, 1, 0}, {1, 1, 1}, {1, 0, 2}, {1, 1, 3}};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        float *p = train_gpt("cpu:2", runs[k].overlap, runs[k].jitter, 4, runs[k].replicas, 2,
                             &m);
        cr_assert_eq(n, m);
        cr_assert_eq(memcmp(ref, p, n * sizeof(float)), 0,
                     "overlap %d, replicas %d, jitter seed %llu: other bits", runs[k].overlap,
                     runs[k].replicas, (unsigned long long)runs[k].jitter);
        free(p);
    }
    free(ref);
}

/* bf16 GEMMs (gemm_bf16.h; emulated where oneDNN has no bf16 kernel for the CPU): the
 * layers read their GEMM weights in bf16 where the device keeps them instead of a cast in
 * the fp32 scratch, so device memory is that of bf16 without them; the GEMMs are what changes the
 * bits against bf16 with fp32 GEMMs; the MLP learns and ends near fp32; and the schedules
 * (replicas, stream delays; the GPT's overlap, replicas and delays) give the same bits. */
Test(exec, bf16_gemms_learn_and_schedules_agree, .timeout = 300)
{
    size_t n, m;
    float *f32 = train("cpu:2", 1, 0, 0, 40, &n, NULL);
    precision = PST_BF16;
    float *plain = train("cpu:2", 1, 0, 0, 40, &m, NULL);
    const size_t plain_peak = peak0;
    char msg[256];
    /* oneDNN's kernel where it has one for this CPU (its slicing is what the schedules
     * must not change), else emulated */
    cr_assert(pst_gemm_bf16_setup(PST_GEMM_BF16_ONEDNN, msg, sizeof msg) ||
                  pst_gemm_bf16_setup(PST_GEMM_BF16_EMULATE, msg, sizeof msg),
              "%s", msg);
    cr_log_info("%s\n", msg);
    double acc;
    float *p = train("cpu:2", 1, 0, 0, 40, &m, &acc);
    cr_assert_eq(n, m);
    cr_assert_eq(peak0, plain_peak, "device 0 peaks at %zu bytes, %zu with fp32 GEMMs", peak0,
                 plain_peak);
    cr_assert_neq(memcmp(p, plain, n * sizeof(float)), 0, "bf16 GEMMs changed no bit");
    const double a = l2(f32, n), b = l2(p, n);
    cr_log_info("bf16 GEMMs: param_l2 %.9g vs fp32 %.9g, test_acc %.4f\n", b, a, acc);
    cr_assert_gt(acc, 0.3, "bf16 GEMMs did not learn (%.3f)", acc);
    cr_assert_leq(fabs(b - a) / a, 2e-2, "param_l2 %.9g vs fp32 %.9g", b, a);
    cpu_replicas = 1;
    float *r = train("cpu:2", 0, 0, 0, 40, &m, NULL);
    cpu_replicas = 0;
    cr_assert_eq(memcmp(p, r, n * sizeof(float)), 0, "replicas changed the bits");
    float *j = train("cpu:2", 1, 5, 200, 40, &m, NULL);
    cr_assert_eq(memcmp(p, j, n * sizeof(float)), 0, "stream delays changed the bits");
    float *g = train_gpt("cpu:2", 1, 0, 4, 0, 2, &n);
    const struct {
        int overlap, replicas;
        uint64_t jitter;
    } runs[] = {{0, 0, 0}, {1, 1, 1}, {1, 0, 2}};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        float *q = train_gpt("cpu:2", runs[k].overlap, runs[k].jitter, 4, runs[k].replicas, 2,
                             &m);
        cr_assert_eq(memcmp(g, q, n * sizeof(float)), 0, "GPT run %zu: other bits", k);
        free(q);
    }
    pst_gemm_bf16_setup(PST_GEMM_BF16_OFF, msg, sizeof msg);
    precision = PST_F32;
    free(f32), free(plain), free(p), free(r), free(j), free(g);
}

Test(exec, gpt_steps_equal_the_reference_gpt, .timeout = 120)
{
    const int steps = 5;
    size_t n;
    float *got = train_gpt("cpu:1", 1, 0, steps, 0, 1, &n);

    pst_text text;
    cr_assert_eq(pst_text_load(&text, PST_KJV_PATH, GPT_T), PST_OK);
    pst_model model;
    cr_assert_eq(pst_model_gpt(&model, text.vocab, GPT_T, 2, 2, 32), PST_OK);
    ref_gpt r;
    cr_assert_eq(ref_gpt_init(&r, (ref_gpt_dims){.V = text.vocab, .T = GPT_T, .L = 2, .H = 2,
                                                 .C = 32}, GPT_B), 0);
    cr_assert_eq(r.nparams, n);
    float *params = malloc(sizeof(float) * n), *grads = malloc(sizeof(float) * n);
    float *state = calloc(2 * n, sizeof(float));
    model.init_params(&model, params, 5);
    pst_config cfg;
    pst_config_defaults(&cfg);
    pst_optim_config oc = cfg.optim;
    oc.kind = PST_OPTIM_ADAMW;
    oc.lr = 3e-3f;
    oc.beta2 = 0.99f;
    oc.weight_decay = 0.0f;
    int32_t x[GPT_B * GPT_T], y[GPT_B * GPT_T];
    for (int s = 0; s < steps; s++) {
        pst_text_train_rows(&text, GPT_T, 5, s, GPT_B, 0, GPT_B, x, y);
        ref_gpt_forward(&r, params, x, y, GPT_B, NULL);
        ref_gpt_backward(&r, params, grads, x, y, GPT_B);
        cr_assert_eq(pst_optim_apply(&oc, s + 1, params, state, n, grads, n), PST_OK);
    }
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(memcmp(&got[i], &params[i], sizeof(float)), 0,
                     "parameter %zu: %.9g, the reference's %.9g", i, got[i], params[i]);
    free(got);
    free(params);
    free(grads);
    free(state);
    ref_gpt_free(&r);
    pst_model_free(&model);
    pst_text_free(&text);
}
