/* main.c — the `pserver` program: serves its parameter blocks until every trainer has
 * finished (exit 0) or it gets SIGINT/SIGTERM (exit 0 after a clean shutdown).
 * First stdout line: {"event":"listening","port":N} (pslaunch reads it; port 0 in the
 * configuration picks a free port). Exit 2 for bad configuration, 1 when it cannot
 * listen. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/memory.h"
#include "common/metrics.h"
#include "common/prom.h"
#include "pserver/service.h"
#include "rpc/global.h"
#include "rpc/server.h"
#include "rpc/transport.h"

static volatile int stop_flag;
static volatile sig_atomic_t signals; /* SIGTERM and SIGINT received */

/* Seconds a pserver asked to stop (SIGTERM) serves on for trainer 0 to stop the job at a
 * step boundary with a checkpoint, before it stops anyway (under Kubernetes' default
 * terminationGracePeriodSeconds, 30). A second signal stops it at once. */
#define STOP_GRACE_S 25

static void on_signal(int sig)
{
    if (sig != SIGALRM)
        signals++;
    stop_flag = 1;
}

/* /metrics: the service of the moment (a rollback makes a new one), for the gauges a
 * scrape reads. */
typedef struct scrape_view {
    pthread_mutex_t mu;
    ps_service *svc;
    pst_prom_metric *initialized, *trainers, *connected, *waited_for, *version, *blocks,
        *params, *checkpoint_age;
    pst_prom_metric *sparse[5]; /* rows, bytes, created, evicted, refused */
} scrape_view;

static void on_scrape(void *arg)
{
    scrape_view *v = arg;
    ps_service_gauges g = {.checkpoint_age = -1};
    pthread_mutex_lock(&v->mu);
    if (v->svc)
        ps_service_gauges_read(v->svc, &g);
    pthread_mutex_unlock(&v->mu);
    pst_prom_set(v->initialized, g.initialized);
    pst_prom_set(v->trainers, g.trainers);
    pst_prom_set(v->connected, g.connected);
    pst_prom_set(v->waited_for, g.waited_for);
    pst_prom_set(v->version, (double)g.version);
    pst_prom_set(v->blocks, (double)g.blocks);
    pst_prom_set(v->params, (double)g.params);
    pst_prom_set(v->checkpoint_age, g.checkpoint_age);
    const double sparse[5] = {(double)g.sparse.rows, (double)g.sparse.bytes,
                              (double)g.sparse.created, (double)g.sparse.evicted,
                              (double)g.sparse.refused};
    for (int i = 0; i < 5; i++)
        pst_prom_set(v->sparse[i], sparse[i]);
}

static void register_gauges(scrape_view *v, pst_prom *r, int checkpoints)
{
    v->initialized = pst_prom_gauge(r, "pstrain_pserver_initialized",
                                    "1 once trainer 0's Init has made the store", NULL);
    v->trainers = pst_prom_gauge(r, "pstrain_pserver_trainers", "Trainers of the job", NULL);
    v->connected = pst_prom_gauge(r, "pstrain_pserver_trainers_connected",
                                  "Trainers whose Watch of this pserver is open", NULL);
    v->waited_for = pst_prom_gauge(r, "pstrain_pserver_trainers_waited_for",
                                   "Sync: trainers whose push of the next step has not come "
                                   "(first block)", NULL);
    v->version = pst_prom_gauge(r, "pstrain_pserver_version",
                                "Version (optimizer steps) of the first block", NULL);
    v->blocks = pst_prom_gauge(r, "pstrain_pserver_blocks", "Parameter blocks owned", NULL);
    v->params = pst_prom_gauge(r, "pstrain_pserver_parameters", "Parameters owned", NULL);
    v->checkpoint_age = checkpoints
                            ? pst_prom_gauge(r, "pstrain_pserver_checkpoint_age_seconds",
                                             "Seconds since the newest checkpoint was written",
                                             NULL)
                            : NULL;
    static const char *const sparse[5][2] = {
        {"pstrain_pserver_sparse_rows", "Rows of the sparse tables held here"},
        {"pstrain_pserver_sparse_bytes", "Bytes the sparse tables here allocated"},
        {"pstrain_pserver_sparse_rows_created", "Sparse rows made (admitted) so far"},
        {"pstrain_pserver_sparse_rows_evicted", "Sparse rows removed (age or row budget)"},
        {"pstrain_pserver_sparse_pushes_refused", "Pushed keys refused before admission"}};
    for (int i = 0; i < 5; i++)
        v->sparse[i] = pst_prom_gauge(r, sparse[i][0], sparse[i][1], NULL);
    pst_prom_on_scrape(r, on_scrape, v);
}

int main(int argc, char **argv)
{
    /* No huge pages for malloc's heap here (pst_memory_huge_heap_env): the pserver gives
     * back what a burst of refused or abandoned calls left free (malloc_trim, rpc/server.c),
     * and free memory inside a heap's huge pages stays resident (measured:
     * cluster::abandoned_calls_give_their_memory_back kept 13 MB of a 19 MB peak). Its
     * blocks get them (store.c). */
    pst_memory_tune_server();
    pst_config cfg;
    const int done = pst_config_main(&cfg, PST_ROLE_PSERVER, "pserver", argc, argv);
    if (done >= 0)
        return done;
    pst_log_init(cfg.log_level, "pserver", cfg.pserver_id);
    /* --metrics: one record at exit (what the service reports); opened now, so a bad path
     * is a configuration error before serving. */
    pst_metrics metrics = {0};
    if (pst_metrics_open(&metrics, cfg.metrics_path) != PST_OK) {
        fprintf(stderr, "pserver: %s\n", pst_error_detail());
        return 2;
    }
    /* One identity per trainer: its own token, from --trainer-tokens. */
    char **trainer_tokens = NULL;
    int ntrainer_tokens = 0;
    if (cfg.trainer_tokens_file[0]) {
        if (cfg.token[0]) {
            fprintf(stderr, "pserver: both PSTRAIN_TRAINER_TOKENS_FILE and the job's token "
                    "(PSTRAIN_TOKEN or PSTRAIN_TOKEN_FILE) are set: give one (example: "
                    "PSTRAIN_TRAINER_TOKENS_FILE=/etc/pstrain/trainer-tokens)\n");
            return 2;
        }
        if (pst_trainer_tokens_load(cfg.trainer_tokens_file, &trainer_tokens,
                                    &ntrainer_tokens) != PST_OK) {
            fprintf(stderr, "pserver: %s\n", pst_error_detail());
            return 2;
        }
    }
    /* --max-memory 0: half of what this machine (or its cgroup) has, for the blocks. */
    const uint64_t max_memory = cfg.max_memory ? (uint64_t)cfg.max_memory
                                               : (uint64_t)(pst_memory_available() / 2);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGALRM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* /metrics: one registry for the process (counters go on across rollbacks). */
    pst_prom *prom = NULL;
    pst_prom_server *prom_srv = NULL;
    ps_prom prom_counters = {0};
    scrape_view view = {.mu = PTHREAD_MUTEX_INITIALIZER};
    if (cfg.metrics_port >= 0) {
        if (pst_prom_init(&prom) != PST_OK) {
            fprintf(stderr, "pserver: %s\n", pst_error_detail());
            return 1;
        }
        ps_prom_register(&prom_counters, prom);
        register_gauges(&view, prom, cfg.checkpoint_dir[0] != '\0');
        if (pst_prom_serve(prom, cfg.bind_host, cfg.metrics_port, &prom_srv) != PST_OK) {
            fprintf(stderr, "pserver: --metrics-port %d: %s\n", cfg.metrics_port,
                    pst_error_detail());
            pst_prom_free(prom);
            return 1;
        }
    }
    rpc_global_init();
    ps_service *svc = NULL;
    rpc_server *srv = NULL;
    rpc_transport *transport = NULL;
    const rpc_tls_files tls = {.cert = cfg.tls_cert, .key = cfg.tls_key, .ca = cfg.tls_ca};
    if (rpc_transport_load(&transport, &tls, 1) != PST_OK) {
        fprintf(stderr, "pserver: %s\n", pst_error_detail());
        pst_metrics_close(&metrics);
        rpc_global_shutdown();
        return 2;
    }
    int rc = 0, port = cfg.port;
    char lost[600] = ""; /* the departure that made this pserver roll back */
    const int wait = cfg.on_failure == PST_ON_FAILURE_WAIT;
    double init_by = 0;  /* the recovery deadline after a rollback */
    for (;;) {
        char bind[PST_ADDR_MAX + 16];
        snprintf(bind, sizeof bind, "%s:%d", cfg.bind_host, port);
        if (ps_service_init(&svc) != PST_OK) {
            fprintf(stderr, "pserver: %s\n", pst_error_detail());
            rc = 1;
            goto out;
        }
        if (cfg.checkpoint_dir[0]) { /* its own directory: pservers may share DIR */
            char name[64];
            if (cfg.pserver_id >= 0)
                snprintf(name, sizeof name, "pserver-%d", cfg.pserver_id);
            else
                snprintf(name, sizeof name, "pserver-port-%d", cfg.port);
            ps_service_checkpoints(svc, cfg.checkpoint_dir, name, cfg.checkpoint_keep);
        }
        char why[900];
        snprintf(why, sizeof why, "within --recovery-timeout-ms %ld after %s; giving up "
                 "(start the job again: it resumes from the newest complete checkpoint)",
                 cfg.recovery_timeout_ms, lost);
        ps_service_on_failure(svc, wait, cfg.peer_timeout_ms, init_by, why);
        ps_service_limits(svc, (uint64_t)cfg.max_params, max_memory);
        ps_service_shm(svc, cfg.shm);
        if (prom)
            ps_service_prom(svc, &prom_counters);
        pthread_mutex_lock(&view.mu);
        view.svc = svc;
        pthread_mutex_unlock(&view.mu);
        rpc_server_config sc = {.bind = bind, .threads = cfg.server_threads,
                                .handler = ps_service_handle, .handler_arg = svc,
                                .on_cancel = ps_service_cancelled,
                                .keepalive_ms = (int)cfg.peer_timeout_ms,
                                .token = cfg.token, .transport = transport,
                                .trainer_tokens = (const char *const *)trainer_tokens,
                                .ntrainer_tokens = ntrainer_tokens,
                                .max_calls = cfg.max_calls, .max_wait_ms = (int)cfg.max_wait_ms,
                                .max_request = ps_service_max_request,
                                .max_message = (long long)cfg.max_params * 4 + (64LL << 20)};
        if (rpc_server_init(&srv, &sc) != PST_OK) {
            fprintf(stderr, "pserver: %s\n", pst_error_detail());
            rc = 1;
            goto out;
        }
        port = rpc_server_port(srv); /* a rollback serves on the same port */
        if (prom_srv)
            printf("{\"event\":\"listening\",\"port\":%d,\"metrics_port\":%d}\n", port,
                   pst_prom_server_port(prom_srv));
        else
            printf("{\"event\":\"listening\",\"port\":%d}\n", port);
        fflush(stdout);
        PST_INFO("listening on %s:%d with %d threads (%s); blocks of at most %.3g GB%s",
                 cfg.bind_host, port, cfg.server_threads, rpc_transport_name(transport),
                 (double)max_memory / 1e9,
                 cfg.max_memory ? "" : " (--max-memory 0: half of this machine's memory)");
        if (!cfg.token[0] && !ntrainer_tokens)
            PST_INFO("no token (PSTRAIN_TOKEN or PSTRAIN_TOKEN_FILE): anyone who can reach "
                     "port %d can train, read or end this job", port);
        int finished = ps_service_wait(svc, &stop_flag);
        if (!finished && stop_flag && signals == 1 && cfg.checkpoint_dir[0] &&
            !ps_service_failure(svc) && !ps_service_departed(svc)) {
            /* The job stops at a step with a checkpoint: trainer 0 learns of it through its
             * Watch; its Finish and the others' end the wait as at the job's end. */
            PST_INFO("asked to stop: trainer 0 is to stop the job at the next step, with a "
                     "checkpoint (this pserver stops anyway in %d s, or at a second signal)",
                     STOP_GRACE_S);
            ps_service_request_stop(svc);
            stop_flag = 0;
            alarm(STOP_GRACE_S);
            finished = ps_service_wait(svc, &stop_flag);
            alarm(0);
        }
        const char *departed = ps_service_departed(svc);
        const int again = wait && departed && !stop_flag && !ps_service_failure(svc);
        if (again) {
            snprintf(lost, sizeof lost, "%s", departed);
            PST_WARN("%s: rolling back (--on-failure wait): serving afresh on port %d; trainer "
                     "0's next Init loads the newest complete checkpoint (giving up after "
                     "--recovery-timeout-ms %ld)", lost, port, cfg.recovery_timeout_ms);
            init_by = pst_clock_s() + (double)cfg.recovery_timeout_ms / 1e3;
        } else if (finished) {
            int64_t lo, hi;
            ps_service_versions(svc, &lo, &hi);
            PST_INFO("every trainer finished, the blocks at versions %lld to %lld; shutting "
                     "down", (long long)lo, (long long)hi);
        } else if (ps_service_failure(svc)) {
            rc = 1; /* its line is in the log */
        } else {
            PST_INFO("stopping on signal");
        }
        ps_service_cancel(svc);
        rpc_server_shutdown(srv, 1);
        if (again) {
            rpc_server_free(srv);
            pthread_mutex_lock(&view.mu);
            view.svc = NULL;
            pthread_mutex_unlock(&view.mu);
            ps_service_free(svc);
            srv = NULL;
            svc = NULL;
            continue;
        }
        break;
    }
    {
        ps_service_report r;
        ps_service_get_report(svc, &r);
        pst_metrics_write(&metrics, "pserver",
                      "\"pserver_id\":%d,\"initialized\":%d,\"precision\":\"%s\","
                      "\"casts\":%llu,\"pull_casts\":%llu,\"optimizer_steps\":%lld,"
                      "\"casts_per_step\":%llu,\"owned\":%llu,\"skipped_steps\":%ld,"
                      "\"state_hash\":\"%016llx\",\"sparse_tables\":%d,\"sparse_rows\":%zu,"
                      "\"sparse_bytes\":%zu,\"rows_created\":%llu,\"rows_evicted\":%llu,"
                      "\"pushes_refused\":%llu,\"keys_pulled\":%llu,\"keys_pushed\":%llu,"
                      "\"sparse_hash\":\"%016llx\"",
                      cfg.pserver_id, r.initialized, r.precision,
                      (unsigned long long)r.casts, (unsigned long long)r.pull_casts,
                      (long long)r.optimizer_steps,
                      (unsigned long long)(r.optimizer_steps > 0
                                               ? r.casts / (uint64_t)r.optimizer_steps
                                               : 0),
                      (unsigned long long)r.owned, r.skipped_steps,
                      (unsigned long long)r.state_hash, r.sparse_tables, r.sparse.rows,
                      r.sparse.bytes, (unsigned long long)r.sparse.created,
                      (unsigned long long)r.sparse.evicted,
                      (unsigned long long)r.sparse.refused,
                      (unsigned long long)r.sparse.keys_pulled,
                      (unsigned long long)r.sparse.keys_pushed,
                      (unsigned long long)r.sparse.hash);
        if (r.sparse_tables)
            PST_INFO("sparse tables: %zu rows in %zu bytes here; %llu rows created, %llu "
                     "evicted, %llu pushed keys refused before admission; %llu keys pulled, "
                     "%llu pushed", r.sparse.rows, r.sparse.bytes,
                     (unsigned long long)r.sparse.created, (unsigned long long)r.sparse.evicted,
                     (unsigned long long)r.sparse.refused,
                     (unsigned long long)r.sparse.keys_pulled,
                     (unsigned long long)r.sparse.keys_pushed);
    }
out:
    pst_metrics_close(&metrics);
    rpc_server_free(srv);
    pst_prom_server_stop(prom_srv); /* before the service its scrapes read goes */
    ps_service_free(svc);
    pst_prom_free(prom);
    rpc_transport_free(transport);
    rpc_global_shutdown();
    pst_trainer_tokens_free(trainer_tokens, ntrainer_tokens);
    return rc;
}
