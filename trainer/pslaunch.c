/* pslaunch.c — runs a whole pstrain cluster on this machine: S pservers and T trainers on
 * 127.0.0.1, for the demo, tests and benchmarks.
 *
 *   pslaunch [--pservers S] [--trainers T] [--pserver-cmd PATH] [--timeout SEC]
 *            [--base-port P] [--restart N] -- TRAINER_CMD...
 *
 * DESIGN: pservers start first with PSTRAIN_PORT=0 (or P, P+1, ... with --base-port, for
 * a benchmark that shapes their traffic by port) and announce the port they bound on
 * their first stdout line ({"event":"listening","port":N}), so there is no port race.
 * Trainers then start with PSTRAIN_PSERVERS / PSTRAIN_TRAINERS / PSTRAIN_TRAINER_ID set.
 * One poll() loop reads every child's stdout and stderr: trainer 0's stdout passes through
 * unchanged (the summary line), every other line goes to stderr prefixed with
 * "[role rank]". When a child fails (non-zero exit or signal), or the timeout passes, or
 * pslaunch gets SIGINT/SIGTERM, every child is stopped (SIGTERM, then SIGKILL) and
 * pslaunch exits non-zero. With --restart N the children run with --on-failure wait
 * (PSTRAIN_ON_FAILURE=wait, unless the environment sets it) and a child that dies or fails
 * (other than exit 2, a configuration error) is started again alone, with the same id (a
 * pserver on the same port), up to N times in all: as a StatefulSet and an Indexed Job
 * would. The others stay up and the job rolls back to its newest complete checkpoint
 * (PSTRAIN_CHECKPOINT_DIR; none: step 0) and goes on. Children also die with pslaunch
 * (PR_SET_PDEATHSIG), so no process is left behind. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"

#define MAX_PROCS 128
#define LINE_MAX_LEN 4096

typedef struct child {
    const char *role;
    int rank;
    pid_t pid;
    int out_fd, err_fd;  /* -1 once closed */
    char out_buf[LINE_MAX_LEN], err_buf[LINE_MAX_LEN];
    size_t out_len, err_len;
    int exited, status;
    int port;            /* pservers: announced port, 0 until then */
    char *env[6];        /* what spawn() added to the environment (kept for a restart) */
    char **argv;
} child;

static child procs[MAX_PROCS];
static int nprocs;
static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
    got_signal = sig;
}


static void usage(FILE *f)
{
    fprintf(f, "usage: pslaunch [--pservers S] [--trainers T] [--pserver-cmd PATH] "
               "[--timeout SEC] [--base-port P] [--restart N] -- TRAINER_COMMAND [ARGS...]\n"
               "Starts S pservers (default 1; on ports P..P+S-1 with --base-port, else any free "
               "ports) and T trainers (default 2) on 127.0.0.1 and stops them all if one fails;\n"
               "--restart N starts a process that died or failed again (same id and port), up\n"
               "to N times in all, and runs every process with --on-failure wait: the job rolls\n"
               "back to its newest complete checkpoint (PSTRAIN_CHECKPOINT_DIR) and goes on.\n");
}

static int spawn(child *c, char *const argv[], char *const extra_env[])
{
    int out[2], err[2];
    if (pipe(out) || pipe(err)) {
        fprintf(stderr, "pslaunch: pipe: %s\n", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "pslaunch: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        close(out[0]);
        close(out[1]);
        close(err[0]);
        close(err[1]);
        for (int i = 0; extra_env[i]; i++)
            putenv(extra_env[i]);
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    for (int i = 0; i < 5 && extra_env[i]; i++)
        c->env[i] = extra_env[i];
    c->argv = (char **)argv;
    c->pid = pid;
    c->out_fd = out[0];
    c->err_fd = err[0];
    return 0;
}

/* Handles one complete line from a child's stream. */
static void emit_line(child *c, int is_out, const char *line)
{
    if (is_out && strcmp(c->role, "pserver") == 0 && c->port == 0) {
        const char *p = strstr(line, "\"port\":");
        if (strstr(line, "\"listening\"") && p) {
            c->port = atoi(p + 7);
            return;
        }
    }
    if (is_out && strcmp(c->role, "trainer") == 0 && c->rank == 0) {
        fprintf(stdout, "%s\n", line);
        fflush(stdout);
        return;
    }
    fprintf(stderr, "[%s %d] %s\n", c->role, c->rank, line);
}

/* Reads what is available on fd into buf, emitting complete lines. Returns 0 at EOF. */
static int pump(child *c, int is_out)
{
    int *fd = is_out ? &c->out_fd : &c->err_fd;
    char *buf = is_out ? c->out_buf : c->err_buf;
    size_t *len = is_out ? &c->out_len : &c->err_len;
    ssize_t n = read(*fd, buf + *len, LINE_MAX_LEN - 1 - *len);
    if (n <= 0) {
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            return 1;
        if (*len) {
            buf[*len] = '\0';
            emit_line(c, is_out, buf);
            *len = 0;
        }
        close(*fd);
        *fd = -1;
        return 0;
    }
    *len += (size_t)n;
    size_t start = 0;
    for (size_t i = 0; i < *len; i++) {
        if (buf[i] == '\n' || buf[i] == '\r') {
            buf[i] = '\0';
            if (i > start)
                emit_line(c, is_out, buf + start);
            start = i + 1;
        }
    }
    if (start == 0 && *len == LINE_MAX_LEN - 1) { /* a line longer than the buffer */
        buf[*len] = '\0';
        emit_line(c, is_out, buf);
        *len = 0;
    } else if (start) {
        memmove(buf, buf + start, *len - start);
        *len -= start;
    }
    return 1;
}

/* Polls every open pipe for up to timeout_ms and reaps exited children. */
static void service(int timeout_ms)
{
    struct pollfd fds[2 * MAX_PROCS];
    child *owner[2 * MAX_PROCS];
    int isout[2 * MAX_PROCS], n = 0;
    for (int i = 0; i < nprocs; i++) {
        if (procs[i].out_fd >= 0) {
            fds[n] = (struct pollfd){.fd = procs[i].out_fd, .events = POLLIN};
            owner[n] = &procs[i];
            isout[n++] = 1;
        }
        if (procs[i].err_fd >= 0) {
            fds[n] = (struct pollfd){.fd = procs[i].err_fd, .events = POLLIN};
            owner[n] = &procs[i];
            isout[n++] = 0;
        }
    }
    if (n > 0 && poll(fds, (nfds_t)n, timeout_ms) > 0) {
        for (int k = 0; k < n; k++)
            if (fds[k].revents & (POLLIN | POLLHUP | POLLERR))
                pump(owner[k], isout[k]);
    } else if (n == 0) {
        usleep((useconds_t)timeout_ms * 1000);
    }
    for (int i = 0; i < nprocs; i++) {
        if (procs[i].exited || procs[i].pid <= 0)
            continue;
        int status;
        if (waitpid(procs[i].pid, &status, WNOHANG) == procs[i].pid) {
            procs[i].exited = 1;
            procs[i].status = status;
        }
    }
}

static int failed(const child *c)
{
    return c->exited && !(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0);
}

static void describe_exit(const child *c)
{
    if (WIFEXITED(c->status))
        fprintf(stderr, "pslaunch: %s %d exited with status %d\n", c->role, c->rank,
                WEXITSTATUS(c->status));
    else if (WIFSIGNALED(c->status))
        fprintf(stderr, "pslaunch: %s %d killed by signal %d\n", c->role, c->rank,
                WTERMSIG(c->status));
}

/* SIGTERM to every live child, SIGKILL to those still alive after `grace` seconds. */
static void stop_all(double grace)
{
    for (int i = 0; i < nprocs; i++)
        if (!procs[i].exited && procs[i].pid > 0)
            kill(procs[i].pid, SIGTERM);
    double until = pst_clock_s() + grace;
    for (;;) {
        int alive = 0;
        for (int i = 0; i < nprocs; i++)
            alive += !procs[i].exited && procs[i].pid > 0;
        if (!alive)
            break;
        if (pst_clock_s() > until) {
            for (int i = 0; i < nprocs; i++)
                if (!procs[i].exited && procs[i].pid > 0)
                    kill(procs[i].pid, SIGKILL);
            until = pst_clock_s() + 60;
        }
        service(50);
    }
    for (int i = 0; i < nprocs; i++) /* drain what is left in the pipes */
        while (procs[i].out_fd >= 0 || procs[i].err_fd >= 0)
            service(10);
}

static long parse_count(const char *flag, const char *v, long lo, long hi)
{
    char *e;
    long n = v ? strtol(v, &e, 10) : -1;
    if (!v || *e || n < lo || n > hi) {
        fprintf(stderr, "pslaunch: %s %s: expected an integer in %ld..%ld (example: %s 2)\n",
                flag, v ? v : "(missing)", lo, hi, flag);
        exit(2);
    }
    return n;
}

/* One run of the whole job: the pservers, then the trainers, until they are all done.
 * JOB_FAILED when a child failed; JOB_STOPPED on a signal, the timeout, or a pserver that
 * never listened (not worth a restart). The children are left for stop_all. */
enum { JOB_OK = 0, JOB_FAILED, JOB_STOPPED };

/* --restart: starts a failed child again with its id, environment and (a pserver) port.
 * Returns 0 when started. */
static int restart_child(child *c)
{
    static char port_env[MAX_PROCS][32];
    const int k = (int)(c - procs);
    char *env[6] = {0};
    for (int i = 0; i < 5 && c->env[i]; i++)
        env[i] = c->env[i];
    if (strcmp(c->role, "pserver") == 0) { /* the trainers know it by its port */
        snprintf(port_env[k], sizeof port_env[k], "PSTRAIN_PORT=%d", c->port);
        env[0] = port_env[k];
    }
    char **argv = c->argv;
    const char *role = c->role;
    const int rank = c->rank, port = c->port;
    *c = (child){.role = role, .rank = rank, .out_fd = -1, .err_fd = -1, .port = port};
    return spawn(c, argv, env);
}

static int run_job(long S, long T, long base_port, const char *pserver_cmd,
                   char **trainer_argv, double deadline, long timeout, long restarts)
{
    int rc = JOB_OK;
    long restarted = 0;

    /* Pservers first; wait for each to announce its port. */
    static char env_store[MAX_PROCS][6][PATH_MAX];
    for (int s = 0; s < S; s++) {
        child *c = &procs[nprocs++];
        *c = (child){.role = "pserver", .rank = s, .out_fd = -1, .err_fd = -1};
        snprintf(env_store[s][0], PATH_MAX, "PSTRAIN_PORT=%ld", base_port ? base_port + s : 0);
        snprintf(env_store[s][1], PATH_MAX, "PSTRAIN_BIND=127.0.0.1");
        snprintf(env_store[s][2], PATH_MAX, "PSTRAIN_PSERVER_ID=%d", s);
        snprintf(env_store[s][3], PATH_MAX, "PSTRAIN_ROLE=pserver");
        char *env[] = {env_store[s][0], env_store[s][1], env_store[s][2], env_store[s][3], NULL};
        static char *pargv[] = {NULL, NULL};
        pargv[0] = (char *)pserver_cmd;
        if (spawn(c, pargv, env)) {
            rc = JOB_STOPPED;
            goto out;
        }
    }
    for (;;) {
        int ready = 0;
        for (int s = 0; s < S; s++) {
            ready += procs[s].port > 0;
            if (procs[s].exited || procs[s].out_fd < 0) {
                if (procs[s].port == 0) {
                    fprintf(stderr, "pslaunch: pserver %d stopped before listening\n", s);
                    rc = JOB_STOPPED;
                    goto out;
                }
            }
        }
        if (ready == S)
            break;
        if (got_signal || (deadline && pst_clock_s() > deadline)) {
            rc = JOB_STOPPED;
            goto out;
        }
        service(100);
    }

    char list[MAX_PROCS * 32] = "";
    for (int s = 0; s < S; s++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s127.0.0.1:%d",
                 s ? "," : "", procs[s].port);
    for (int t = 0; t < T; t++) {
        child *c = &procs[nprocs++];
        *c = (child){.role = "trainer", .rank = t, .out_fd = -1, .err_fd = -1};
        int k = (int)S + t;
        snprintf(env_store[k][0], PATH_MAX, "PSTRAIN_PSERVERS=%s", list);
        snprintf(env_store[k][1], PATH_MAX, "PSTRAIN_TRAINERS=%ld", T);
        snprintf(env_store[k][2], PATH_MAX, "PSTRAIN_TRAINER_ID=%d", t);
        snprintf(env_store[k][3], PATH_MAX, "PSTRAIN_ROLE=trainer");
        char *env[] = {env_store[k][0], env_store[k][1], env_store[k][2], env_store[k][3], NULL};
        if (spawn(c, trainer_argv, env)) {
            rc = JOB_STOPPED;
            goto out;
        }
    }

    /* Run until every trainer has exited, then give the pservers time to finish. */
    double pserver_grace_until = 0;
    for (;;) {
        service(200);
        for (int k = 0; k < nprocs; k++) {
            if (failed(&procs[k])) {
                describe_exit(&procs[k]);
                child *c = &procs[k];
                const int config_error = WIFEXITED(c->status) && WEXITSTATUS(c->status) == 2;
                if (restarted < restarts && !config_error && !got_signal) {
                    while (c->out_fd >= 0 || c->err_fd >= 0) /* its last lines first */
                        service(10);
                    restarted++;
                    fprintf(stderr, "pslaunch: starting %s %d again (restart %ld of %ld); the "
                                    "job rolls back to its newest complete checkpoint\n",
                            c->role, c->rank, restarted, restarts);
                    if (restart_child(c) == 0)
                        continue;
                }
                rc = JOB_FAILED;
                goto out;
            }
        }
        int trainers_left = 0, pservers_left = 0;
        for (int k = 0; k < nprocs; k++) {
            if (procs[k].exited)
                continue;
            if (strcmp(procs[k].role, "trainer") == 0)
                trainers_left++;
            else
                pservers_left++;
        }
        if (!trainers_left && !pservers_left)
            break;
        if (!trainers_left) {
            if (pserver_grace_until == 0)
                pserver_grace_until = pst_clock_s() + 10;
            else if (pst_clock_s() > pserver_grace_until) {
                fprintf(stderr, "pslaunch: trainers done; stopping the pservers that are still up\n");
                break;
            }
        }
        if (got_signal) {
            fprintf(stderr, "pslaunch: stopping on signal %d\n", (int)got_signal);
            rc = JOB_STOPPED;
            goto out;
        }
        if (deadline && pst_clock_s() > deadline) {
            fprintf(stderr, "pslaunch: --timeout %ld s passed; stopping everything\n", timeout);
            rc = JOB_STOPPED;
            goto out;
        }
    }
out:
    return rc;
}

int main(int argc, char **argv)
{
    long S = 1, T = 2, timeout = 0, base_port = 0, restarts = 0;
    const char *pserver_cmd = NULL;
    int i = 1;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        } else if (strcmp(argv[i], "--pservers") == 0) {
            S = parse_count("--pservers", i + 1 < argc ? argv[++i] : NULL, 1, 32);
        } else if (strcmp(argv[i], "--trainers") == 0) {
            T = parse_count("--trainers", i + 1 < argc ? argv[++i] : NULL, 1, 64);
        } else if (strcmp(argv[i], "--timeout") == 0) {
            timeout = parse_count("--timeout", i + 1 < argc ? argv[++i] : NULL, 0, 864000);
        } else if (strcmp(argv[i], "--base-port") == 0) {
            base_port = parse_count("--base-port", i + 1 < argc ? argv[++i] : NULL, 1, 65535 - 32);
        } else if (strcmp(argv[i], "--restart") == 0) {
            restarts = parse_count("--restart", i + 1 < argc ? argv[++i] : NULL, 0, 1000);
        } else if (strcmp(argv[i], "--pserver-cmd") == 0 && i + 1 < argc) {
            pserver_cmd = argv[++i];
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "pslaunch: %s: unknown argument\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        fprintf(stderr, "pslaunch: no trainer command after -- "
                        "(example: pslaunch --pservers 2 --trainers 2 -- build/bin/trainer --epochs 1)\n");
        return 2;
    }
    char **trainer_argv = argv + i;
    char self_dir[PATH_MAX], pserver_path[PATH_MAX + 16];
    if (!pserver_cmd) {
        ssize_t n = readlink("/proc/self/exe", self_dir, sizeof self_dir - 1);
        if (n <= 0) {
            fprintf(stderr, "pslaunch: cannot find my own path; pass --pserver-cmd PATH\n");
            return 2;
        }
        self_dir[n] = '\0';
        *strrchr(self_dir, '/') = '\0';
        snprintf(pserver_path, sizeof pserver_path, "%s/pserver", self_dir);
        pserver_cmd = pserver_path;
    }

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    double deadline = timeout > 0 ? pst_clock_s() + (double)timeout : 0;
    if (restarts > 0 && !getenv("PSTRAIN_ON_FAILURE"))
        setenv("PSTRAIN_ON_FAILURE", "wait", 1); /* inherited by every child */
    const int rc = run_job(S, T, base_port, pserver_cmd, trainer_argv, deadline, timeout,
                           restarts);
    stop_all(3.0);
    return rc == JOB_OK ? 0 : 1;
}

