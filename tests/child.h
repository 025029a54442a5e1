/* child.h — child processes for the multi-process suites (test_cluster, test_netlab):
 * started with fork/execve, output into temporary files, every wait bounded, killed and
 * reaped by the suite's fini through the pool. Include after criterion.h.
 *
 * DESIGN. Children write stdout and stderr into temporary files (no pipe can fill up and
 * stall a child). Children get PR_SET_PDEATHSIG, so they also die with the criterion
 * worker. Each child's environment is the test's minus every PSTRAIN_* / Paddle /
 * NETLAB_NAME variable, plus what the test sets, built before fork: the child side only
 * makes async-signal-safe calls before execve (the test process may have gRPC threads).
 * Also the fields of a trainer's summary line (param_hash, numbers). */
#ifndef PST_TESTS_CHILD_H
#define PST_TESTS_CHILD_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct proc {
    pid_t pid;           /* 0 when never started */
    int reaped;          /* waitpid has returned it */
    int status;          /* its wait status once reaped */
    char out_path[64];   /* stdout and stderr files */
    char err_path[64];
} proc;

#define MAX_CHILDREN 64
static proc pool[MAX_CHILDREN]; /* every child of this test (criterion forks per test) */
static int nchildren;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Does "NAME=VALUE" belong to the variables the tests control? */
static int controlled_var(const char *kv)
{
    return strncmp(kv, "PSTRAIN_", 8) == 0 || strncmp(kv, "PADDLE_", 7) == 0 ||
           strncmp(kv, "TRAINING_ROLE=", 14) == 0 || strncmp(kv, "POD_IP=", 7) == 0 ||
           strncmp(kv, "NETLAB_NAME=", 12) == 0;
}

/* "PSTRAIN_TEST_HOOKS=..." (trainer/test_hooks.h: the faults a test injects) for the
 * children started while it is set; NULL: none. A PSTRAIN_TEST_HOOKS entry of the call's own
 * env wins. */
static const char *child_hooks;

/* Ours minus the controlled variables, plus `env` (and child_hooks); built before fork.
 * Free only the array. */
static char **child_environment(const char *const env[])
{
    extern char **environ;
    size_t n = 0, k = 0;
    int own_hooks = 0;
    for (char **e = environ; *e; e++)
        n++;
    for (int i = 0; env && env[i]; i++, n++)
        own_hooks |= strncmp(env[i], "PSTRAIN_TEST_HOOKS=", 19) == 0;
    char **envp = calloc(n + 2, sizeof *envp);
    if (!envp)
        return NULL;
    for (char **e = environ; *e; e++)
        if (!controlled_var(*e))
            envp[k++] = *e;
    for (int i = 0; env && env[i]; i++)
        envp[k++] = (char *)env[i];
    if (child_hooks && !own_hooks)
        envp[k++] = (char *)child_hooks;
    envp[k] = NULL;
    return envp;
}

/* Starts argv[0] (a path) with the extra environment; output goes to files. Returns NULL
 * (errno set) when it cannot: usable from the fini, which must not assert. */
static proc *proc_start_or_null(const char *const argv[], const char *const env[])
{
    if (nchildren >= MAX_CHILDREN)
        return NULL;
    proc *p = &pool[nchildren];
    memset(p, 0, sizeof *p);
    snprintf(p->out_path, sizeof p->out_path, "/tmp/pst_child_out_XXXXXX");
    snprintf(p->err_path, sizeof p->err_path, "/tmp/pst_child_err_XXXXXX");
    int out = mkstemp(p->out_path), err = mkstemp(p->err_path);
    int devnull = open("/dev/null", O_RDONLY);
    char **envp = child_environment(env);
    if (out < 0 || err < 0 || devnull < 0 || !envp) {
        int e = errno;
        if (out >= 0)
            close(out), unlink(p->out_path);
        if (err >= 0)
            close(err), unlink(p->err_path);
        if (devnull >= 0)
            close(devnull);
        free(envp);
        errno = e;
        return NULL;
    }
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* die with the test worker */
        if (getppid() != parent)
            _exit(126);
        dup2(devnull, STDIN_FILENO);
        dup2(out, STDOUT_FILENO);
        dup2(err, STDERR_FILENO);
        for (int fd = 3; fd < 1024; fd++) /* the criterion worker's pipes, our files */
            close(fd);
        execve(argv[0], (char *const *)argv, envp);
        static const char msg[] = "tests: execve failed\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    int e = errno;
    free(envp);
    close(devnull);
    close(out);
    close(err);
    if (pid < 0) {
        unlink(p->out_path);
        unlink(p->err_path);
        errno = e;
        return NULL;
    }
    p->pid = pid;
    nchildren++;
    return p;
}

static proc *proc_start(const char *const argv[], const char *const env[])
{
    proc *p = proc_start_or_null(argv, env);
    cr_assert_not_null(p, "cannot start %s: %s", argv[0], strerror(errno));
    return p;
}

/* Waits up to timeout_ms; 1 when the child has exited (p->status set), 0 when not yet. */
static int proc_wait(proc *p, int timeout_ms)
{
    if (p->reaped)
        return 1;
    double deadline = now_ms() + timeout_ms;
    for (;;) {
        pid_t r = waitpid(p->pid, &p->status, WNOHANG);
        if (r == p->pid) {
            p->reaped = 1;
            return 1;
        }
        if (r < 0 && errno != EINTR) {
            p->reaped = 1;
            p->status = -1;
            return 1;
        }
        if (now_ms() > deadline)
            return 0;
        sleep_ms(10);
    }
}

/* Kills (SIGKILL) and reaps a child that is still running; removes its files. */
static void proc_cleanup(proc *p)
{
    if (p->pid > 0 && !p->reaped) {
        kill(p->pid, SIGKILL);
        while (waitpid(p->pid, &p->status, 0) < 0 && errno == EINTR)
            ;
        p->reaped = 1;
    }
    if (p->out_path[0])
        unlink(p->out_path);
    if (p->err_path[0])
        unlink(p->err_path);
    p->out_path[0] = p->err_path[0] = '\0';
}

/* The whole content of a file, NUL-terminated ("" when unreadable); the caller frees it. */
static char *slurp(const char *path)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = fopen(path, "rb");
    if (f) {
        FILE *m = open_memstream(&buf, &len);
        cr_assert_not_null(m);
        char chunk[4096];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
            fwrite(chunk, 1, n, m);
        fclose(m);
        fclose(f);
    }
    if (!buf)
        buf = strdup("");
    cr_assert_not_null(buf);
    return buf;
}

/* Waits for a started child within timeout_ms and asserts that it exited (not killed,
 * not hung), naming it with `what`. Returns its exit status; *out / *err (optional)
 * receive its output. */
static inline int finish(proc *p, const char *what, int timeout_ms, char **out, char **err)
{
    int done = proc_wait(p, timeout_ms);
    char *o = slurp(p->out_path), *e = slurp(p->err_path); /* what a hung child wrote too */
    if (!done)
        proc_cleanup(p);
    cr_assert(done, "%s did not exit within %d ms; stderr:\n%s", what, timeout_ms, e);
    cr_assert(WIFEXITED(p->status), "%s died with wait status 0x%x; stderr:\n%s", what,
              p->status, e);
    if (out)
        *out = o;
    else
        free(o);
    if (err)
        *err = e;
    else
        free(e);
    return WEXITSTATUS(p->status);
}

/* The port a started pserver announces on its first stdout line
 * ({"event":"listening","port":N}), within timeout_ms; asserts, naming it `who`, when the
 * line is something else, or when it exits or the deadline passes first. */
static int listening_port(proc *p, const char *who, int timeout_ms)
{
    double deadline = now_ms() + timeout_ms;
    for (;;) {
        char *first = slurp(p->out_path);
        char *nl = strchr(first, '\n');
        if (nl) {
            *nl = '\0';
            const char *q = strstr(first, "\"port\":");
            cr_assert(strstr(first, "{\"event\":\"listening\"") == first && q,
                      "%s: first line is not the listening event: %s", who, first);
            int port = atoi(q + 7);
            free(first);
            cr_assert(port > 0 && port < 65536, "%s announced port %d", who, port);
            return port;
        }
        free(first);
        if (proc_wait(p, 0) || now_ms() > deadline) {
            char *err = slurp(p->err_path);
            cr_assert_fail("%s did not announce its port (%s); stderr:\n%s", who,
                           p->reaped ? "it exited" : "deadline passed", err);
        }
        sleep_ms(10);
    }
}

/* ---- a trainer's summary line --------------------------------------------------------- */

/* The summary's param_hash (16 hex digits: equal means bit-identical parameters). */
typedef struct param_hash {
    char hex[17];
} param_hash;

/* A 16-hex-digit field of the summary line (param_hash, the click model's sparse_hash). */
static param_hash summary_hex(const char *out, const char *key)
{
    param_hash h = {{0}};
    const char *line = strstr(out, "{\"event\":\"summary\"");
    cr_assert_not_null(line, "no summary line in:\n%s", out);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *q = strstr(line, pat);
    cr_assert_not_null(q, "summary has no %s: %s", key, line);
    q += strlen(pat);
    size_t len = strspn(q, "0123456789abcdef");
    cr_assert(len == 16 && q[16] == '"', "%s is not 16 hex digits: %s", key, line);
    memcpy(h.hex, q, 16);
    return h;
}

static inline param_hash summary_hash(const char *out)
{
    return summary_hex(out, "param_hash");
}

/* A number from the summary line of a trainer's stdout. */
static inline double summary_value(const char *out, const char *key)
{
    const char *line = strstr(out, "{\"event\":\"summary\"");
    cr_assert_not_null(line, "no summary line in:\n%s", out);
    const char *eol = strchr(line, '\n');
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *q = strstr(line, pat);
    cr_assert(q && (!eol || q < eol), "summary has no %s: %s", key, line);
    char *end;
    double v = strtod(q + strlen(pat), &end);
    cr_assert(end != q + strlen(pat), "summary %s is not a number: %s", key, line);
    return v;
}

/* Element i of an array of numbers in the summary line ("peak_bytes_per_device":[...]). */
static inline double summary_element(const char *out, const char *key, int i)
{
    const char *line = strstr(out, "{\"event\":\"summary\"");
    cr_assert_not_null(line, "no summary line in:\n%s", out);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":[", key);
    const char *q = strstr(line, pat);
    cr_assert_not_null(q, "summary has no array %s: %s", key, line);
    q += strlen(pat);
    for (int k = 0; k < i; k++) {
        q = strpbrk(q, ",]");
        cr_assert(q && *q == ',', "summary %s has no element %d: %s", key, i, line);
        q++;
    }
    char *end;
    double v = strtod(q, &end);
    cr_assert(end != q, "summary %s[%d] is not a number: %s", key, i, line);
    return v;
}

#endif /* PST_TESTS_CHILD_H */
