/* check.h — status assertions shared by the module suites; include after criterion.h (or
 * the ThreadSanitizer runner's tests/tsan/criterion/criterion.h). */
#ifndef PST_TESTS_CHECK_H
#define PST_TESTS_CHECK_H

#include "common/error.h"

/* expr returns PST_OK; otherwise the failure names the call, the status and its detail. */
#define CHECK_OK(expr)                                                                    \
    do {                                                                                  \
        pst_status check_st_ = (expr);                                                    \
        cr_assert_eq(check_st_, PST_OK, "%s -> %s: %s", #expr, pst_strerror(check_st_),   \
                     pst_error_detail());                                                 \
    } while (0)

/* expr fails with exactly `want` and leaves a detail line. */
#define CHECK_ERR(expr, want)                                                             \
    do {                                                                                  \
        pst_error_clear();                                                                \
        pst_status check_st_ = (expr);                                                    \
        cr_assert_eq(check_st_, (want), "%s -> %s, want %s (%s)", #expr,                  \
                     pst_strerror(check_st_), pst_strerror(want), pst_error_detail());    \
        cr_assert_neq(pst_error_detail()[0], '\0', "%s left no detail", #expr);           \
    } while (0)

#endif /* PST_TESTS_CHECK_H */
