/* main.c — the `trainer` program: reads the configuration, trains, prints the summary.
 * Exit status: 0 on success, 2 for bad configuration or input data, 1 for other failures
 * (an unreachable pserver, out of memory). */
#include <cblas.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "common/memory.h"
#include "common/nn/gemm.h"
#include "common/nn/gemm_bf16.h"
#include "common/prom.h"
#include "common/runtime/device.h"
#include "trainer/blas_core.h"
#include "trainer/remote.h"
#include "trainer/train.h"

static void on_signal(int sig)
{
    (void)sig;
    tr_request_stop();
}

static int exit_code(pst_status st)
{
    switch (st) {
    case PST_OK:
        return 0;
    case PST_ERR_INVALID:
    case PST_ERR_NOT_FOUND:
    case PST_ERR_FORMAT:
    case PST_ERR_UNSUPPORTED:
    case PST_ERR_MISMATCH: /* the trainers were started with other flags */
    case PST_ERR_AUTH:     /* another token than the pservers' */
        return 2;
    default:
        return 1;
    }
}

/* Trains; with --on-failure wait a run that fails because a peer was lost is started
 * again in this process: every pserver rolls back to (and trainer 0 offers) the newest
 * complete checkpoint, so the survivors and the restarted peer go on from the same step
 * and, training being deterministic, end with the bits of a run without the fault. Gives
 * up when no run has gone past its first step for --recovery-timeout-ms. */
static pst_status recover_or_fail(tr_job *job, const pst_config *cfg,
                                  const tr_test_hooks *hooks, tr_summary *sum)
{
    pst_config run = *cfg;
    double give_up = 0; /* set at the first failure, moved on when a run makes progress */
    for (int attempt = 0;; attempt++) {
        pst_status st = tr_train(job, &run, hooks, sum);
        if (st == PST_OK || cfg->on_failure != PST_ON_FAILURE_WAIT || !tr_recoverable(st))
            return st;
        const double now = pst_clock_s();
        if (give_up == 0 || sum->steps > sum->first_step + 1)
            give_up = now + (double)cfg->recovery_timeout_ms / 1e3;
        char why[1024];
        snprintf(why, sizeof why, "%s", pst_error_detail());
        if (now >= give_up)
            return pst_error_set(st, "--on-failure wait: the job has not gone on for "
                                 "--recovery-timeout-ms %ld; the last failure: %s",
                                 cfg->recovery_timeout_ms, why);
        PST_WARN("%s; rolling back to the newest complete checkpoint (--on-failure wait, "
                 "run %d; giving up in %.0f s)", why, attempt + 2, give_up - now);
        /* The next run's connections retry no longer than the recovery has left. */
        const long left_ms = (long)((give_up - now) * 1e3) + 1;
        run.connect_timeout_ms = cfg->connect_timeout_ms > 0 && cfg->connect_timeout_ms < left_ms
                                     ? cfg->connect_timeout_ms : left_ms;
        run.rpc_timeout_ms = cfg->rpc_timeout_ms < left_ms ? cfg->rpc_timeout_ms : left_ms;
        /* The newest whole checkpoint of this job, whatever --resume said for the start (a
         * checkpoint of the same job and settings holds the same bits). */
        run.resume = PST_RESUME_AUTO;
        usleep(200 * 1000); /* the pservers notice the departure and start afresh */
    }
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--blas-core") == 0) {
        /* The best family for this CPU whatever the environment says (the benches use it
         * to run pstrain and its peer on the same, best kernels). */
        const char *core = tr_blas_core_pick();
        puts(core ? core : "");
        return 0;
    }
    /* Both settings are read once at the start (by OpenBLAS and by glibc): one restart
     * makes both take effect. */
    const int blas = tr_blas_core_env();
    if (pst_memory_huge_heap_env() + blas > 0) {
        pst_exec_self(argv);
        if (blas) /* the restart failed: carry on with the default kernels */
            unsetenv("OPENBLAS_CORETYPE");
    }
    pst_memory_tune();
    pst_config cfg;
    const int done = pst_config_main(&cfg, PST_ROLE_TRAINER, "trainer", argc, argv);
    if (done >= 0)
        return done;
    tr_test_hooks hooks; /* the tests' faults: never set in production (test_hooks.h) */
    if (tr_test_hooks_from_env(&hooks) != PST_OK) {
        fprintf(stderr, "trainer: %s\n", pst_error_detail());
        return 2;
    }
    pst_log_init(cfg.log_level, "trainer", cfg.num_pservers ? cfg.trainer_id : -1);
    tr_cpu_features cpu;
    char advice[512];
    tr_cpu_features_read(&cpu);
    if (tr_blas_core_advice(getenv("OPENBLAS_CORETYPE"), &cpu, advice, sizeof advice))
        PST_WARN("%s", advice);
    if (cfg.precision != PST_F32) {
        char gemm[256] = "";
        const int cuda = pst_devices_spec_cuda(cfg.devices); /* GEMMs in fp32 (cuBLAS) */
        const int want = !cuda && tr_bf16_gemm_wanted(&cpu, cfg.precision == PST_BF16,
                                                      cfg.bf16_gemm);
        if (cuda)
            snprintf(gemm, sizeof gemm, "CUDA devices: bf16 GEMMs are for CPU devices");
        /* oneDNN's kernel on a CPU with bf16 instructions (auto, on); on: emulated on one
         * without (oneDNN's software kernel for AVX-512 is slower still) or where oneDNN
         * made none; auto: fp32 there */
        int on = want && cpu.avx512bf16 &&
                 pst_gemm_bf16_setup(PST_GEMM_BF16_ONEDNN, gemm, sizeof gemm);
        if (want && !on && cfg.bf16_gemm == PST_BF16_GEMM_ON) {
            if (cpu.avx512bf16) /* what oneDNN said, before the emulation's line replaces it */
                PST_WARN("%s; emulating them", gemm);
            on = pst_gemm_bf16_setup(PST_GEMM_BF16_EMULATE, gemm, sizeof gemm);
        }
        tr_bf16_arith_line(&cpu, pst_dtype_name(cfg.precision), cfg.bf16_gemm, on, gemm,
                           advice, sizeof advice);
        PST_INFO("%s", advice);
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* Every GEMM is one slice of a layer that a CPU device's thread team splits (exec.c):
     * OpenBLAS's own threads would only compete with the team for the same cores. */
    openblas_set_num_threads(1);
    if (!pst_devices_spec_cuda(cfg.devices)) {
        char gemm[160];
        const int want = tr_sgemm_lib(&cpu, cfg.gemm);
        if (pst_sgemm_setup(want, gemm, sizeof gemm) != want && cfg.gemm == PST_GEMM_ONEDNN)
            PST_WARN("--gemm onednn: %s", gemm);
        else
            PST_INFO("%s", gemm);
    }

    pst_status st;
    tr_job job;
    tr_job_init(&job);
    /* /metrics: served from its own thread for the whole process (recoveries included). */
    pst_prom *prom = NULL;
    pst_prom_server *prom_srv = NULL;
    if (cfg.metrics_port >= 0) {
        if ((st = pst_prom_init(&prom)) != PST_OK ||
            (tr_train_prom(&job, prom), st = pst_prom_serve(prom, "0.0.0.0", cfg.metrics_port,
                                                      &prom_srv)) != PST_OK) {
            fprintf(stderr, "trainer: --metrics-port %d: %s\n", cfg.metrics_port,
                    pst_error_detail());
            pst_prom_free(prom);
            return 1;
        }
        PST_INFO("serving metrics on port %d (GET /metrics)", pst_prom_server_port(prom_srv));
    }
    tr_summary sum;
    st = recover_or_fail(&job, &cfg, &hooks, &sum);
    pst_prom_server_stop(prom_srv);
    pst_prom_free(prom);
    if (st != PST_OK) {
        fprintf(stderr, "trainer: %s\n", pst_error_detail());
        return exit_code(st);
    }
    tr_summary_print(stdout, &sum);
    return 0;
}
