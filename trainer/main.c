/* main.c — the `trainer` program: reads the configuration, trains, prints the summary.
 * Exit status: 0 on success, 2 for bad configuration or input data, 1 for other failures
 * (an unreachable pserver, out of memory). */
#include <cblas.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "common/memory.h"
#include "trainer/blas_core.h"
#include "trainer/remote.h"
#include "trainer/train.h"

static void on_signal(int sig)
{
    (void)sig;
    tr_request_stop();
}

static const char *env_lookup(const char *name)
{
    return getenv(name);
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
        return 2;
    default:
        return 1;
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
    tr_blas_core_reexec(argv);
    pst_memory_tune();
    pst_config cfg;
    pst_status st = pst_config_load(&cfg, PST_ROLE_TRAINER, argc, argv, env_lookup);
    if (st != PST_OK) {
        fprintf(stderr, "trainer: %s\n", pst_error_detail());
        return 2;
    }
    if (cfg.help) {
        pst_config_print_help(stdout, PST_ROLE_TRAINER, "trainer");
        return 0;
    }
    if (cfg.check_config) {
        pst_config_print(stdout, &cfg);
        return 0;
    }
    pst_log_init(cfg.log_level, "trainer", cfg.num_pservers ? cfg.trainer_id : -1);
    tr_cpu_features cpu;
    char advice[512];
    tr_cpu_features_read(&cpu);
    if (tr_blas_core_advice(getenv("OPENBLAS_CORETYPE"), &cpu, advice, sizeof advice))
        PST_WARN("%s", advice);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* Every GEMM is one slice of a layer that a CPU device's thread team splits (exec.c):
     * OpenBLAS's own threads would only compete with the team for the same cores. */
    openblas_set_num_threads(1);

    tr_summary sum;
    st = tr_train(&cfg, &sum);
    if (st != PST_OK) {
        fprintf(stderr, "trainer: %s\n", pst_error_detail());
        return exit_code(st);
    }
    tr_summary_print(stdout, &sum);
    return 0;
}
