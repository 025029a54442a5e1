/* runner_selftest.c — the ThreadSanitizer build's test runner (tests/tsan/criterion/) on
 * itself: 600 empty tests (more than its old fixed table of 512 held), one whose .timeout
 * of 1 s it must enforce (the test sleeps 5 s), and one that skips. tests/tsan/
 * expect_runner.sh expects "602 tests: 600 passed, 1 failed, 1 skipped" and exit 1, and
 * checks --filter on these tests. */
#include <criterion/criterion.h>
#include <unistd.h>

#define T1(n) \
    Test(many, t##n) {}
#define T10(p) T1(p##0) T1(p##1) T1(p##2) T1(p##3) T1(p##4) T1(p##5) T1(p##6) T1(p##7) \
    T1(p##8) T1(p##9)
#define T100(p) T10(p##0) T10(p##1) T10(p##2) T10(p##3) T10(p##4) T10(p##5) T10(p##6) \
    T10(p##7) T10(p##8) T10(p##9)
T100(1)
T100(2)
T100(3)
T100(4)
T100(5)
T100(6)

Test(timing, outlives_its_timeout, .timeout = 1)
{
    sleep(5);
}

Test(timing, skips)
{
    cr_skip_test("on purpose");
}
