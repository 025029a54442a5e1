/* error.h — pstrain status codes and the per-thread error detail.
 *
 * Errors are values: every function that can fail returns a pst_status. The place that
 * detects a failure records a one-line detail once with pst_error_set() (what failed,
 * which file or peer, what a good value looks like); callers pass the status up without
 * printing. Only main() prints (pst_error_detail()) and decides the exit code.
 *
 * Thread safety: the detail lives in thread-local storage; a status that crosses threads
 * (a device stream, an RPC completion) carries its detail in its own object. */
#ifndef PST_ERROR_H
#define PST_ERROR_H

typedef enum pst_status {
    PST_OK = 0,
    PST_ERR_INVALID,     /* bad argument, configuration or request */
    PST_ERR_NOMEM,       /* allocation failed */
    PST_ERR_IO,          /* file or system call failed */
    PST_ERR_FORMAT,      /* malformed file or message */
    PST_ERR_NOT_FOUND,   /* no such file, block, method */
    PST_ERR_UNAVAILABLE, /* peer unreachable */
    PST_ERR_TIMEOUT,     /* a deadline passed */
    PST_ERR_STATE,       /* call not valid in the object's state (shut down, failed) */
    PST_ERR_UNSUPPORTED, /* not built in or not present (e.g. CUDA without a GPU) */
    PST_ERR_MISMATCH,    /* peers disagree (layout, settings) */
    PST_ERR_INTERNAL,    /* a bug in pstrain */
    PST_ERR_RANGE,       /* a value outside what the state allows (a step too far ahead) */
    PST_ERR_AUTH,        /* a call without the right token (PSTRAIN_TOKEN) */
    PST_ERR_LIMIT,       /* a configured resource limit (--max-params, --max-calls, ...) */
    PST_ERR_DENIED,      /* a call that speaks for another than its credentials name */
    PST_ERR_COUNT_
} pst_status;

/* The name of a status, e.g. "invalid argument". Never NULL. */
const char *pst_strerror(pst_status st);

/* Records a printf-style detail for this thread and returns `st`, so a failure site reads
 * `return pst_error_set(PST_ERR_IO, "%s: %s", path, strerror(errno));`.
 * The detail is truncated to 511 bytes. */
pst_status pst_error_set(pst_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Adds context in front of the current detail ("loading data: <detail>"); returns `st`. */
pst_status pst_error_wrap(pst_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The detail recorded last on this thread, or "" when none. Valid until the next set. */
const char *pst_error_detail(void);

void pst_error_clear(void);

/* Bytes of a detail, its NUL included (longer ones are truncated). */
#define PST_ERROR_DETAIL_MAX 512

/* A sticky status: the first failure of something several threads report to (a device
 * stream, a mark, a flag, a batch of calls) with its detail, carried to the threads that
 * wait on it. Its owner's lock guards it. */
typedef struct pst_sticky {
    pst_status status; /* PST_OK until the first failure */
    char detail[PST_ERROR_DETAIL_MAX];
} pst_sticky;

/* Not failed (a recycled one starts again here). */
void pst_sticky_reset(pst_sticky *s);

/* Records the failure st with its detail (NULL or "": st's name) unless s has failed
 * already: the first failure is the one kept. PST_OK changes nothing. */
void pst_sticky_fail(pst_sticky *s, pst_status st, const char *detail);

/* s's status; when failed, its detail is copied into `out`, to be reported after the
 * owner's lock is let go (pst_sticky_raise). */
pst_status pst_sticky_read(const pst_sticky *s, char out[PST_ERROR_DETAIL_MAX]);

/* PST_OK, or st with `detail` (from pst_sticky_read) set as the calling thread's error:
 * the cause as it was, unprefixed. */
pst_status pst_sticky_raise(pst_status st, const char detail[PST_ERROR_DETAIL_MAX]);

/* Evaluates a pst_status expression and returns it from the caller when not PST_OK. */
#define PST_TRY(expr)                         \
    do {                                      \
        pst_status pst_try_st_ = (expr);      \
        if (pst_try_st_ != PST_OK)            \
            return pst_try_st_;               \
    } while (0)

#endif /* PST_ERROR_H */
