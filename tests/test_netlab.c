/* test_netlab.c — the cluster across "hosts": pservers and trainers each in a host of
 * scripts/netlab (its own network and PID namespace, its own /proc), talking over a
 * shaped veth/bridge network instead of loopback.
 *
 * What is checked: 1 trainer (h2) x 2 pservers (h0, h1) ends with local training's
 * param_hash (bit for bit); 2 trainers (h2, h3) x 2 pservers end with the param_hash of
 * local training with the same global batch on 2 devices (each with the trainers' team of
 * 2 threads: OpenBLAS's Haswell kernels give a column other bits in a GEMM of another
 * width, so the threads per device must match, ops_cpu.c) and of the same job on one host
 * (pslaunch on 127.0.0.1, where the payloads go through shared memory); no pair used
 * shared memory
 * (a trainer's memfd, named /proc/<pid>/fd/<fd>, does not exist in the pserver's host, so
 * the payloads must stay in the calls by themselves: PSTRAIN_SHM is left at auto); each
 * pserver exits 0 after the last Finish; the 2 trainers chained (PSTRAIN_CHAIN: h2 sends
 * its gradient to h3, which pushes the sum to the pservers and passes the values back) end
 * with the same bits.
 *
 * DESIGN. As test_cluster.c: children write stdout and stderr into temporary files, every
 * wait has a deadline after which the child is killed and the test fails with its stderr,
 * children get PR_SET_PDEATHSIG, the environment is the test's minus PSTRAIN_* / Paddle /
 * NETLAB_NAME plus what the test sets. A program runs in a host as `scripts/netlab run hN
 * -- PROGRAM...`; netlab run execs nsenter, whose command gets SIGTERM when nsenter dies,
 * so killing the child we started ends the program in the lab too. The lab (NETLAB_NAME
 * nltest, apart from netlab_check's nlchk so that ctest -j runs both) is made by the
 * test and taken down by the suite's fini, on failure too, which also kills whatever is
 * left in it. Not root, or no ip netns / tc / util-linux: the test is skipped with the
 * one line netlab printed. One test only: criterion runs the tests of a suite in parallel
 * and they would share the lab. No gRPC in this process. Nothing asserts on durations. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* open_memstream, prctl */
#endif
#include <criterion/criterion.h>

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/child.h"

#define PSERVER PST_BIN_DIR "/pserver"
#define TRAINER PST_BIN_DIR "/trainer"
#define PSLAUNCH PST_BIN_DIR "/pslaunch"
#define NETLAB PST_SOURCE_DIR "/scripts/netlab"
#define LAB_NAME "NETLAB_NAME=nltest"

/* Bounds of the waits. Generous: they only turn a hang into a failure. */
#define LAB_WAIT_MS 30000
#define LISTEN_WAIT_MS 15000
#define RUN_WAIT_MS 60000
#define EXIT_WAIT_MS 15000

/* The model: small and quick (test_cluster's DEVICE_FLAGS); fp32. */
#define FLAGS "--hidden", "32", "--batch", "64", "--steps", "25", "--seed", "9", \
              "--block-bytes", "8192", "--precision", "fp32", "--progress", "none", \
              "--connect-timeout-ms", "5000"

/* ---- child processes (tests/child.h) ------------------------------------------------- */

/* ---- the lab ---------------------------------------------------------------------------- */

static int lab_started; /* netlab up was run: the fini takes the lab down */

/* `netlab down`, bounded; never asserts (it runs in the fini). */
static void lab_down(void)
{
    const char *argv[] = {NETLAB, "down", NULL};
    const char *env[] = {LAB_NAME, NULL};
    proc *p = proc_start_or_null(argv, env);
    if (!p) {
        fprintf(stderr, "test_netlab: cannot run netlab down: %s\n", strerror(errno));
        return;
    }
    if (!proc_wait(p, LAB_WAIT_MS) || !WIFEXITED(p->status) || WEXITSTATUS(p->status) != 0) {
        char *e = slurp(p->err_path);
        fprintf(stderr, "test_netlab: netlab down failed; stderr:\n%s\n", e);
        free(e);
    }
    proc_cleanup(p);
}

static void suite_fini(void)
{
    for (int i = 0; i < nchildren; i++) /* first what runs in the lab */
        proc_cleanup(&pool[i]);
    nchildren = 0;
    if (lab_started)
        lab_down();
    lab_started = 0;
}

/* Brings up `hosts` hosts at 1 Gbit/s into addr[i] ("10.77.0.(i+1)"); skips the test when
 * netlab says the machine cannot (exit 2: not root, a tool missing). */
static void lab_up(int hosts, char addr[][16])
{
    if (geteuid() != 0)
        cr_skip_test("netlab needs root (network namespaces): not run");
    char n[8];
    snprintf(n, sizeof n, "%d", hosts);
    const char *argv[] = {NETLAB, "up", "--hosts", n, "--link", "1gbit", NULL};
    const char *env[] = {LAB_NAME, NULL};
    lab_started = 1;
    char *out, *err;
    int rc = finish(proc_start(argv, env), "netlab up", LAB_WAIT_MS, &out, &err);
    if (rc == 2) {
        err[strcspn(err, "\n")] = '\0';
        cr_skip_test("the lab cannot run here: %s", err);
    }
    cr_assert_eq(rc, 0, "netlab up exited %d; stderr:\n%s", rc, err);
    const char *line = out;
    for (int i = 0; i < hosts; i++) {
        char name[8], want_name[8], ifname[16];
        cr_assert(sscanf(line, "%7s %15s %15s", name, addr[i], ifname) == 3,
                  "netlab up's line %d is not NAME ADDRESS INTERFACE:\n%s", i, out);
        snprintf(want_name, sizeof want_name, "h%d", i);
        cr_assert_str_eq(name, want_name, "netlab up printed:\n%s", out);
        cr_assert_str_eq(ifname, "eth0", "netlab up printed:\n%s", out);
        line = strchr(line, '\n');
        cr_assert_not_null(line, "netlab up printed:\n%s", out);
        line++;
    }
    free(out);
    free(err);
}

/* argv of `netlab run HOST -- program...` into out[max]. */
static void in_host(const char **out, int max, const char *host, const char *const prog[])
{
    int n = 0;
    const char *head[] = {NETLAB, "run", host, "--"};
    for (int i = 0; i < 4; i++)
        out[n++] = head[i];
    for (int i = 0; prog[i]; i++) {
        cr_assert_lt(n, max - 1);
        out[n++] = prog[i];
    }
    out[n] = NULL;
}

/* ---- the programs ------------------------------------------------------------------------- */

/* Starts a pserver in `host` on port 0; returns the port it announced. */
static int pserver_start(proc **ps, const char *host)
{
    const char *prog[] = {PSERVER, "--log-level", "info", NULL};
    const char *argv[16];
    in_host(argv, 16, host, prog);
    const char *env[] = {LAB_NAME, "PSTRAIN_PORT=0", NULL};
    *ps = proc_start(argv, env);
    char who[64];
    snprintf(who, sizeof who, "pserver in %s", host);
    return listening_port(*ps, who, LISTEN_WAIT_MS);
}

typedef struct result {
    param_hash hash;
    double l2; /* param_l2 */
} result;

static result summary_result(const char *out)
{
    result r = {summary_hash(out), summary_value(out, "param_l2")};
    cr_assert(r.l2 > 0 && isfinite(r.l2), "param_l2 %g", r.l2);
    return r;
}

/* argv (a job outside the lab) on `devices`, which must exit 0: trainer 0's result. */
static result job_result(const char *what, const char *const argv[], const char *devices)
{
    char env_dev[32];
    snprintf(env_dev, sizeof env_dev, "PSTRAIN_DEVICES=%s", devices);
    const char *env[] = {env_dev, NULL};
    char *out, *err;
    int rc = finish(proc_start(argv, env), what, RUN_WAIT_MS + 30000, &out, &err);
    cr_assert_eq(rc, 0, "%s on %s exited %d; stderr:\n%s", what, devices, rc, err);
    result r = summary_result(out);
    free(out);
    free(err);
    return r;
}

/* Shared memory would show in a log line with "is on this host" (trainer and pserver,
 * --log-level info; see test_cluster's shared_memory_payloads_give_the_bits_of_the_calls).
 * The pserver says instead "trainer T: payloads in the calls, not in shared memory: ...":
 * it did try the trainer's /proc/<pid>/fd/<fd>, and in its own host that pid is another
 * process or none (every host numbers its processes from 1, so the pid often exists: the
 * memfd, size and nonce checks are what refuse it). */
static void assert_no_shm(const char *who, const char *err)
{
    cr_assert_null(strstr(err, "is on this host"), "%s used shared memory across hosts:\n%s",
                   who, err);
}

/* T trainers in h2.. against pservers in h0 and h1 (addr: the lab's addresses), chained
 * (PSTRAIN_CHAIN, trainer/chain.h: the trainers pass the sums on between their hosts) or
 * not; returns trainer 0's result, after every trainer and pserver exited 0 without shared
 * memory. */
static result cluster_result(int T, char addr[][16], int chained)
{
    proc *ps[2];
    int port[2];
    for (int s = 0; s < 2; s++) {
        char host[8];
        snprintf(host, sizeof host, "h%d", s);
        port[s] = pserver_start(&ps[s], host);
    }
    char pservers[96], trainers[32];
    snprintf(pservers, sizeof pservers, "PSTRAIN_PSERVERS=%s:%d,%s:%d", addr[0], port[0],
             addr[1], port[1]);
    snprintf(trainers, sizeof trainers, "PSTRAIN_TRAINERS=%d", T);
    char chain[96] = "PSTRAIN_CHAIN=";
    for (int t = 0; t < T; t++) /* each host its own: the same port in every one */
        snprintf(chain + strlen(chain), sizeof chain - strlen(chain), "%s%s:7200",
                 t ? "," : "", addr[2 + t]);
    proc *tr[2];
    char ids[2][32];
    for (int t = 0; t < T; t++) {
        char host[8];
        snprintf(host, sizeof host, "h%d", 2 + t);
        snprintf(ids[t], sizeof ids[t], "PSTRAIN_TRAINER_ID=%d", t);
        const char *prog[] = {TRAINER, FLAGS, "--log-level", "info", NULL};
        const char *argv[40];
        in_host(argv, 40, host, prog);
        const char *env[] = {LAB_NAME, pservers, trainers, ids[t], "PSTRAIN_DEVICES=cpu:1",
                             chained ? chain : NULL, NULL};
        tr[t] = proc_start(argv, env);
    }
    result r = {{{0}}, 0};
    for (int t = 0; t < T; t++) {
        char what[32];
        snprintf(what, sizeof what, "trainer %d of %d", t, T);
        char *out, *err;
        int rc = finish(tr[t], what, RUN_WAIT_MS, &out, &err);
        cr_assert_eq(rc, 0, "%s (in h%d) exited %d; stderr:\n%s", what, 2 + t, rc, err);
        assert_no_shm(what, err);
        if (t == 0)
            r = summary_result(out);
        free(out);
        free(err);
    }
    for (int s = 0; s < 2; s++) { /* each exits 0 after the last Finish */
        char what[32];
        snprintf(what, sizeof what, "pserver %d", s);
        char *err;
        int rc = finish(ps[s], what, EXIT_WAIT_MS, NULL, &err);
        cr_assert_eq(rc, 0, "%s (in h%d) exited %d; stderr:\n%s", what, s, rc, err);
        assert_no_shm(what, err);
        for (int t = 0; t < T && !chained; t++) { /* it tried the trainer's segment, and
                                                   * refused it (a chain offers none) */
            char said[64];
            snprintf(said, sizeof said, "trainer %d: payloads in the calls", t);
            cr_assert_not_null(strstr(err, said), "%s does not say \"%s\":\n%s", what, said,
                               err);
        }
        free(err);
    }
    return r;
}

TestSuite(netlab, .fini = suite_fini, .timeout = 300);

Test(netlab, cluster_across_hosts_gives_the_bits_of_one_host)
{
    char addr[4][16];
    lab_up(4, addr);

    const char *local[] = {TRAINER, FLAGS, "--log-level", "warn", NULL};
    const char *loopback[] = {PSLAUNCH, "--pservers", "2", "--trainers", "2", "--timeout", "90",
                              "--", TRAINER, FLAGS, "--log-level", "warn", NULL};
    /* The global batch in 2 halves, each on a device with a team of 2 threads as each
     * trainer's cpu:1 has (OpenBLAS may give a column other bits in a GEMM of another
     * width: the threads per device must match, ops_cpu.c). */
    const char *local2[] = {TRAINER, FLAGS, "--threads", "4", "--log-level", "warn", NULL};
    const result one = job_result("local trainer", local, "cpu:1");
    const result two = job_result("local trainer", local2, "cpu:2");
    const result same_host = job_result("pslaunch 2 x 2", loopback, "cpu:1");

    const result d1 = cluster_result(1, addr, 0);
    cr_assert_str_eq(d1.hash.hex, one.hash.hex, "1 trainer (h2) x 2 pservers (h0, h1): %s, "
                     "local: %s", d1.hash.hex, one.hash.hex);

    const result d2 = cluster_result(2, addr, 0);
    cr_assert_str_eq(d2.hash.hex, same_host.hash.hex, "2 trainers (h2, h3) x 2 pservers (h0, "
                     "h1): %s, the same job on one host: %s", d2.hash.hex, same_host.hash.hex);
    cr_assert_str_eq(d2.hash.hex, two.hash.hex, "2 trainers (h2, h3) x 2 pservers (h0, h1): "
                     "%s, local on cpu:2 with the same global batch: %s", d2.hash.hex,
                     two.hash.hex);

    /* trainer 0 (h2) pushes to trainer 1 (h3), which pushes the sum to the pservers */
    const result chained = cluster_result(2, addr, 1);
    cr_assert_str_eq(chained.hash.hex, two.hash.hex, "2 chained trainers (h2 -> h3) x 2 "
                     "pservers (h0, h1): %s, local on cpu:2 with the same global batch: %s",
                     chained.hash.hex, two.hash.hex);
}
