/* tests/tsan/criterion/criterion.h — a minimal criterion-compatible runner, used ONLY to
 * run the multi-threaded suites under ThreadSanitizer (make test-tsan).
 *
 * Why: libcriterion maps its shared arena at fixed random addresses, which TSan's shadow
 * memory occupies on this machine, so criterion aborts at start-up under TSan ("Could not
 * initialize inheritable arena"; Criterion issue #274). The same test sources compile
 * against this header instead: Test() registers a function (every one: the table grows),
 * each test runs in a forked child under an alarm of its .timeout (120 s when it sets
 * none), the cr_assert_* / cr_expect_* subset the suites use is provided, a skipped test
 * counts as skipped, and the run ends with "T tests: N passed, N failed, N skipped".
 * `--filter PATTERN` (criterion's option: a glob over "suite/name"; here it may be given
 * several times, a test runs when any matches) runs a part of a suite; the last line then
 * counts the tests run and says how many the filter left out. A filter that matches no test
 * is an error, so a renamed test cannot drop out of the run unnoticed. */
#ifndef PST_TSAN_CRITERION_H
#define PST_TSAN_CRITERION_H

#include <cblas.h>
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct tsan_test {
    const char *suite, *name;
    void (*fn)(void);
    void (*init)(void);
    void (*fini)(void);
    double timeout; /* seconds; 0: the default, TSAN_DEFAULT_TIMEOUT */
} tsan_test;

/* criterion's default has no limit; ours is ctest's per-suite --timeout's business, but a
 * hung test must not hide the others: each gets this alarm unless it sets .timeout. */
#define TSAN_DEFAULT_TIMEOUT 120
/* A skipped test's exit status (cr_skip_test): counted as skipped, not passed. */
#define TSAN_SKIP_STATUS 77

static tsan_test *tsan_tests;
static int tsan_ntests, tsan_cap;
static int tsan_expect_failed;

/* TestSuite(suite, .init, .fini, .timeout): as in criterion, the suite's init runs before
 * each of its tests' own, its fini after, and its timeout is the default of its tests. */
#define TSAN_MAX_SUITES 16
static tsan_test tsan_suites[TSAN_MAX_SUITES]; /* name in .suite; fn unused */
static int tsan_nsuites;
/* The running test's fini functions, run also when a fatal assertion ends it, so what it
 * started (child processes) is cleaned up as criterion would. */
static void (*tsan_running_fini[2])(void);

/* Every Test() is registered (the table grows); out of memory ends the run, so that no test
 * is silently dropped. */
static void tsan_register(const char *s, const char *n, void (*fn)(void), void (*init)(void),
                          void (*fini)(void), double timeout)
{
    if (tsan_ntests == tsan_cap) {
        int cap = tsan_cap ? 2 * tsan_cap : 64;
        tsan_test *t = realloc(tsan_tests, (size_t)cap * sizeof *t);
        if (!t) {
            fprintf(stderr, "tsan runner: out of memory registering %s::%s\n", s, n);
            abort();
        }
        tsan_tests = t;
        tsan_cap = cap;
    }
    tsan_tests[tsan_ntests++] = (tsan_test){s, n, fn, init, fini, timeout};
}

__attribute__((format(printf, 5, 6), unused)) static void
tsan_report(int fatal, const char *file, int line, const char *expr, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: assertion failed: %s: ", file, line, expr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (fatal) {
        for (int i = 0; i < 2; i++)
            if (tsan_running_fini[i]) {
                void (*f)(void) = tsan_running_fini[i];
                tsan_running_fini[i] = NULL; /* a failure inside a fini ends there */
                f();
            }
        _exit(1);
    }
    tsan_expect_failed = 1;
}

struct criterion_test_extra_data {
    void (*init)(void);
    void (*fini)(void);
    double timeout; /* seconds: the test's alarm (0: TSAN_DEFAULT_TIMEOUT) */
};

#define TSAN_CAT_(a, b) a##b
#define Test(suite, name, ...)                                                             \
    static void suite##_##name(void);                                                      \
    __attribute__((constructor)) static void TSAN_CAT_(tsan_reg_, suite##_##name)(void)    \
    {                                                                                      \
        struct criterion_test_extra_data x = {__VA_ARGS__};                                \
        (void)x;                                                                           \
        tsan_register(#suite, #name, suite##_##name, x.init, x.fini, x.timeout);           \
    }                                                                                      \
    static void suite##_##name(void)
/* Test(suite, name, .init = f, .fini = g) works because the extra arguments are
 * designated initializers of criterion_test_extra_data. */

#define TestSuite(suite, ...)                                                              \
    __attribute__((constructor)) static void TSAN_CAT_(tsan_suite_, suite)(void)           \
    {                                                                                      \
        struct criterion_test_extra_data x = {__VA_ARGS__};                                \
        if (tsan_nsuites == TSAN_MAX_SUITES) {                                             \
            fprintf(stderr, "tsan runner: more than %d TestSuite()s\n", TSAN_MAX_SUITES);   \
            abort();                                                                       \
        }                                                                                  \
        tsan_suites[tsan_nsuites++] = (tsan_test){#suite, "", NULL, x.init, x.fini,         \
                                                  x.timeout};                              \
    }

/* The TestSuite() of a test's suite, or NULL. */
static const tsan_test *tsan_suite_of(const tsan_test *t)
{
    for (int i = 0; i < tsan_nsuites; i++)
        if (strcmp(tsan_suites[i].suite, t->suite) == 0)
            return &tsan_suites[i];
    return NULL;
}

#define TSAN_CHECK_(fatal, cond, ...)                                                      \
    do {                                                                                   \
        if (!(cond))                                                                       \
            tsan_report(fatal, __FILE__, __LINE__, #cond, " " __VA_ARGS__);                 \
    } while (0)
#define cr_assert(c, ...) TSAN_CHECK_(1, (c), __VA_ARGS__)
#define cr_expect(c, ...) TSAN_CHECK_(0, (c), __VA_ARGS__)
#define cr_assert_not(c, ...) TSAN_CHECK_(1, !(c), __VA_ARGS__)
#define cr_assert_eq(a, b, ...) TSAN_CHECK_(1, (a) == (b), __VA_ARGS__)
#define cr_assert_neq(a, b, ...) TSAN_CHECK_(1, (a) != (b), __VA_ARGS__)
#define cr_assert_lt(a, b, ...) TSAN_CHECK_(1, (a) < (b), __VA_ARGS__)
#define cr_assert_leq(a, b, ...) TSAN_CHECK_(1, (a) <= (b), __VA_ARGS__)
#define cr_assert_gt(a, b, ...) TSAN_CHECK_(1, (a) > (b), __VA_ARGS__)
#define cr_assert_geq(a, b, ...) TSAN_CHECK_(1, (a) >= (b), __VA_ARGS__)
#define cr_assert_null(a, ...) TSAN_CHECK_(1, (a) == NULL, __VA_ARGS__)
#define cr_assert_not_null(a, ...) TSAN_CHECK_(1, (a) != NULL, __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) TSAN_CHECK_(1, strcmp((a), (b)) == 0, __VA_ARGS__)
#define cr_assert_float_eq(a, b, eps, ...) TSAN_CHECK_(1, fabs((double)(a) - (double)(b)) <= (eps), __VA_ARGS__)
#define cr_expect_eq(a, b, ...) TSAN_CHECK_(0, (a) == (b), __VA_ARGS__)
#define cr_expect_neq(a, b, ...) TSAN_CHECK_(0, (a) != (b), __VA_ARGS__)
#define cr_expect_lt(a, b, ...) TSAN_CHECK_(0, (a) < (b), __VA_ARGS__)
#define cr_expect_leq(a, b, ...) TSAN_CHECK_(0, (a) <= (b), __VA_ARGS__)
#define cr_expect_gt(a, b, ...) TSAN_CHECK_(0, (a) > (b), __VA_ARGS__)
#define cr_expect_geq(a, b, ...) TSAN_CHECK_(0, (a) >= (b), __VA_ARGS__)
#define cr_expect_null(a, ...) TSAN_CHECK_(0, (a) == NULL, __VA_ARGS__)
#define cr_expect_not_null(a, ...) TSAN_CHECK_(0, (a) != NULL, __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...) TSAN_CHECK_(0, strcmp((a), (b)) == 0, __VA_ARGS__)
#define cr_expect_float_eq(a, b, eps, ...) TSAN_CHECK_(0, fabs((double)(a) - (double)(b)) <= (eps), __VA_ARGS__)
#define cr_skip_test(...)                                                                  \
    do {                                                                                   \
        fprintf(stderr, "skipped: " __VA_ARGS__);                                          \
        fputc('\n', stderr);                                                              \
        _exit(TSAN_SKIP_STATUS);                                                           \
    } while (0)
#define cr_assert_fail(...) tsan_report(1, __FILE__, __LINE__, "cr_assert_fail", " " __VA_ARGS__)
#define cr_log_info(...) fprintf(stderr, __VA_ARGS__)
#define cr_log_warn(...) fprintf(stderr, __VA_ARGS__)

/* Whether test i is selected by the --filter patterns (all when there are none). */
static int tsan_selected(const tsan_test *t, char **patterns, int npatterns)
{
    if (npatterns == 0)
        return 1;
    char full[512];
    snprintf(full, sizeof full, "%s/%s", t->suite, t->name);
    for (int i = 0; i < npatterns; i++)
        if (fnmatch(patterns[i], full, 0) == 0)
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    char **patterns = calloc((size_t)argc, sizeof *patterns);
    int npatterns = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) {
            patterns[npatterns++] = argv[++i];
        } else if (strncmp(argv[i], "--filter=", 9) == 0) {
            patterns[npatterns++] = argv[i] + 9;
        } else {
            fprintf(stderr, "tsan runner: unknown argument '%s' (expected --filter "
                    "'suite/name glob', repeatable)\n", argv[i]);
            return 2;
        }
    }
    for (int p = 0; p < npatterns; p++) {
        int hit = 0;
        for (int i = 0; i < tsan_ntests && !hit; i++)
            hit = tsan_selected(&tsan_tests[i], &patterns[p], 1);
        if (!hit) {
            fprintf(stderr, "tsan runner: --filter '%s' matches no test\n", patterns[p]);
            return 2;
        }
    }
    /* OpenBLAS's threads synchronize through spin flags TSan cannot see: run its GEMMs on
     * the calling (stream) thread, as OPENBLAS_NUM_THREADS=1 in ctest does too. */
    openblas_set_num_threads(1);
    int pass = 0, fail = 0, skip = 0, left_out = 0;
    for (int i = 0; i < tsan_ntests; i++) {
        if (!tsan_selected(&tsan_tests[i], patterns, npatterns)) {
            left_out++;
            continue;
        }
        fflush(NULL);
        const tsan_test *test = &tsan_tests[i], *suite = tsan_suite_of(test);
        pid_t p = fork();
        if (p == 0) {
            /* Its own process group, so what a test started goes with it (below). */
            setpgid(0, 0);
            const double t = test->timeout > 0 ? test->timeout : suite ? suite->timeout : 0;
            alarm(t > 0 ? (unsigned)ceil(t) : TSAN_DEFAULT_TIMEOUT);
            tsan_running_fini[0] = test->fini;
            tsan_running_fini[1] = suite ? suite->fini : NULL;
            if (suite && suite->init)
                suite->init();
            if (test->init)
                test->init();
            test->fn();
            for (int f = 0; f < 2; f++)
                if (tsan_running_fini[f])
                    tsan_running_fini[f]();
            _exit(tsan_expect_failed);
        }
        int st = 0;
        waitpid(p, &st, 0);
        kill(-p, SIGKILL); /* processes the test left behind (a timeout's, say) */
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            pass++;
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == TSAN_SKIP_STATUS) {
            skip++;
            fprintf(stderr, "[SKIP] %s::%s\n", tsan_tests[i].suite, tsan_tests[i].name);
        } else {
            fail++;
            fprintf(stderr, "[FAIL] %s::%s (status %d)\n", tsan_tests[i].suite,
                    tsan_tests[i].name, st);
        }
    }
    if (left_out)
        printf("%d tests: %d passed, %d failed, %d skipped (%d left out by --filter)\n",
               tsan_ntests - left_out, pass, fail, skip, left_out);
    else
        printf("%d tests: %d passed, %d failed, %d skipped\n", tsan_ntests, pass, fail, skip);
    free(patterns);
    free(tsan_tests);
    return fail != 0;
}

#endif /* PST_TSAN_CRITERION_H */
