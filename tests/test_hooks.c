/* test_hooks.c — trainer/test_hooks.c: PSTRAIN_TEST_HOOKS, the one place the trainer reads
 * the faults the tests inject; and that the option table no longer knows them. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "trainer/test_hooks.h"

Test(test_hooks, none_by_default)
{
    tr_test_hooks h = {.crash_step = 5, .overflow_step = 5, .jitter_us = 5};
    cr_assert_eq(tr_test_hooks_parse(&h, NULL), PST_OK);
    cr_expect_eq(h.crash_step, -1);
    cr_expect_eq(h.overflow_step, -1);
    cr_expect_eq(h.jitter_us, 0u);
    cr_assert_eq(tr_test_hooks_parse(&h, ""), PST_OK);
    cr_expect_eq(h.crash_step, -1);
}

Test(test_hooks, every_hook)
{
    tr_test_hooks h;
    cr_assert_eq(tr_test_hooks_parse(&h, "crash=12,overflow=7,jitter=9:200"), PST_OK, "%s",
                 pst_error_detail());
    cr_expect_eq(h.crash_step, 12);
    cr_expect_eq(h.overflow_step, 7);
    cr_expect_eq(h.jitter_seed, 9u);
    cr_expect_eq(h.jitter_us, 200u);
    cr_assert_eq(tr_test_hooks_parse(&h, "jitter=0:0"), PST_OK);
    cr_expect_eq(h.crash_step, -1);
    cr_expect_eq(h.jitter_us, 0u);
}

Test(test_hooks, malformed_is_one_line_with_an_example)
{
    static const char *const bad[] = {"crash",       "crash=",        "crash=-1",
                                      "crash=1x",    "overflow=a",    "jitter=7",
                                      "jitter=7:",   "jitter=-1:5",   "jitter=7:2000000",
                                      "explode=3",   "crash=1,,",     "crash=1;overflow=2",
                                      ",crash=1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tr_test_hooks h;
        cr_expect_eq(tr_test_hooks_parse(&h, bad[i]), PST_ERR_INVALID, "\"%s\" accepted", bad[i]);
        const char *d = pst_error_detail();
        cr_expect(strstr(d, "PSTRAIN_TEST_HOOKS=") && strstr(d, "example: crash=12"),
                  "\"%s\": %s", bad[i], d);
        cr_expect_eq(h.crash_step, -1, "\"%s\" left a hook set", bad[i]);
    }
}

static const char *no_env(const char *name)
{
    (void)name;
    return NULL;
}

Test(test_hooks, read_from_the_environment_only)
{
    setenv("PSTRAIN_TEST_HOOKS", "crash=3", 1);
    tr_test_hooks h;
    cr_assert_eq(tr_test_hooks_from_env(&h), PST_OK);
    cr_expect_eq(h.crash_step, 3);
    unsetenv("PSTRAIN_TEST_HOOKS");
    cr_assert_eq(tr_test_hooks_from_env(&h), PST_OK);
    cr_expect_eq(h.crash_step, -1);
    /* the product's option table does not know them: --test-crash is an unknown flag */
    pst_config c;
    const char *argv[] = {"trainer", "--test-crash", "3", NULL};
    cr_expect_eq(pst_config_load(&c, PST_ROLE_TRAINER, 3, (char **)argv, no_env),
                 PST_ERR_INVALID, "--test-crash is still a flag");
}
