/* test_hooks.c — PSTRAIN_TEST_HOOKS, the one place the trainer's test hooks are read (see
 * test_hooks.h). */
#include "trainer/test_hooks.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HOOKS_EXAMPLE "crash=12,overflow=7,jitter=7:200"

void tr_test_hooks_none(tr_test_hooks *h)
{
    *h = (tr_test_hooks){.crash_step = -1, .overflow_step = -1};
}

static pst_status bad_hooks(tr_test_hooks *h, const char *spec, const char *what)
{
    tr_test_hooks_none(h);
    return pst_error_set(PST_ERR_INVALID, "PSTRAIN_TEST_HOOKS=%s: %s (example: %s)", spec, what,
                         HOOKS_EXAMPLE);
}

/* A step: 0..1e12, the whole of [p, end). */
static int parse_step(const char *p, const char *end, long *out)
{
    char *e;
    errno = 0;
    long v = strtol(p, &e, 10);
    if (e == p || e != end || errno || v < 0 || v > 1000000000000L)
        return 0;
    *out = v;
    return 1;
}

pst_status tr_test_hooks_parse(tr_test_hooks *h, const char *spec)
{
    tr_test_hooks_none(h);
    if (!spec || !*spec)
        return PST_OK;
    tr_test_hooks r;
    tr_test_hooks_none(&r);
    for (const char *p = spec; *p;) {
        const char *end = p + strcspn(p, ",");
        const char *eq = memchr(p, '=', (size_t)(end - p));
        if (!eq)
            return bad_hooks(h, spec, "expected NAME=VALUE items separated by commas");
        const size_t n = (size_t)(eq - p);
        const char *v = eq + 1;
        if (n == 5 && !strncmp(p, "crash", 5)) {
            if (!parse_step(v, end, &r.crash_step))
                return bad_hooks(h, spec, "crash=STEP takes a step 0..1000000000000");
        } else if (n == 8 && !strncmp(p, "overflow", 8)) {
            if (!parse_step(v, end, &r.overflow_step))
                return bad_hooks(h, spec, "overflow=STEP takes a step 0..1000000000000");
        } else if (n == 6 && !strncmp(p, "jitter", 6)) {
            char *e;
            errno = 0;
            unsigned long long seed = strtoull(v, &e, 10);
            if (e == v || *e != ':' || errno || v[0] == '-')
                return bad_hooks(h, spec, "jitter=SEED:US, e.g. jitter=7:200");
            const char *u = e + 1;
            long us = strtol(u, &e, 10);
            if (e == u || e != end || errno || us < 0 || us > 1000000)
                return bad_hooks(h, spec, "jitter=SEED:US takes 0..1000000 microseconds");
            r.jitter_seed = seed;
            r.jitter_us = (unsigned)us;
        } else {
            return bad_hooks(h, spec, "unknown hook; the hooks are crash, overflow and jitter");
        }
        p = *end ? end + 1 : end;
    }
    *h = r;
    return PST_OK;
}

pst_status tr_test_hooks_from_env(tr_test_hooks *h)
{
    return tr_test_hooks_parse(h, getenv("PSTRAIN_TEST_HOOKS"));
}

void tr_test_hooks_step(const tr_test_hooks *h, long step)
{
    if (h && step == h->crash_step)
        _exit(3); /* as if killed: nothing flushed, no Finish */
}
