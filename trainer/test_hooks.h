/* test_hooks.h — the trainer's test hooks: the faults the project's tests inject (a crash at
 * a step, an fp16 overflow, random delays). They are not settings: they are read from one
 * environment variable, in test_hooks.c alone, and are not in the option table, --help or
 * docs/configuration.md.
 *
 *   PSTRAIN_TEST_HOOKS="crash=12,overflow=7,jitter=7:200"
 *
 * crash=STEP     the trainer dies (_exit(3): nothing flushed, no Finish, as if killed) as it
 *                starts step STEP (a run resumed past STEP goes on);
 * overflow=STEP  fp16: this trainer's gradient overflows at step STEP, as if a value were
 *                infinite;
 * jitter=SEED:US random delays of 0..US microseconds (at most 1000000) before every stream
 *                item of the CPU devices and every exchange of a block, drawn from SEED. */
#ifndef TR_TEST_HOOKS_H
#define TR_TEST_HOOKS_H

#include <stdint.h>

#include "common/error.h"

typedef struct tr_test_hooks {
    long crash_step;    /* -1: never */
    long overflow_step; /* -1: never */
    uint64_t jitter_seed;
    unsigned jitter_us; /* 0: no delays */
} tr_test_hooks;

/* No hook. */
void tr_test_hooks_none(tr_test_hooks *h);

/* Parses spec (NULL or "": no hook). On a malformed spec: PST_ERR_INVALID with a detail
 * naming PSTRAIN_TEST_HOOKS and an example, and *h is no hook. */
pst_status tr_test_hooks_parse(tr_test_hooks *h, const char *spec);

/* tr_test_hooks_parse of getenv("PSTRAIN_TEST_HOOKS"). */
pst_status tr_test_hooks_from_env(tr_test_hooks *h);

/* The crash hook, as the trainer starts `step` of a run that did not resume past it: at
 * crash_step the process ends at once (_exit(3)). h NULL: no hook. */
void tr_test_hooks_step(const tr_test_hooks *h, long step);

#endif /* TR_TEST_HOOKS_H */
