/* error.c — status names and the thread-local error detail (see error.h). */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char detail[PST_ERROR_DETAIL_MAX];

static const char *const names[PST_ERR_COUNT_] = {
    [PST_OK] = "ok",
    [PST_ERR_INVALID] = "invalid argument",
    [PST_ERR_NOMEM] = "out of memory",
    [PST_ERR_IO] = "i/o error",
    [PST_ERR_FORMAT] = "malformed data",
    [PST_ERR_NOT_FOUND] = "not found",
    [PST_ERR_UNAVAILABLE] = "unavailable",
    [PST_ERR_TIMEOUT] = "deadline exceeded",
    [PST_ERR_STATE] = "invalid state",
    [PST_ERR_UNSUPPORTED] = "unsupported",
    [PST_ERR_MISMATCH] = "mismatch",
    [PST_ERR_INTERNAL] = "internal error",
    [PST_ERR_RANGE] = "out of range",
    [PST_ERR_AUTH] = "unauthenticated",
    [PST_ERR_LIMIT] = "limit exceeded",
    [PST_ERR_DENIED] = "permission denied",
};

const char *pst_strerror(pst_status st)
{
    if ((unsigned)st >= PST_ERR_COUNT_)
        return "unknown error";
    return names[st];
}

pst_status pst_error_set(pst_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return st;
}

pst_status pst_error_wrap(pst_status st, const char *fmt, ...)
{
    char prefix[PST_ERROR_DETAIL_MAX], old[PST_ERROR_DETAIL_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, detail, sizeof old);
    if (old[0])
        snprintf(detail, sizeof detail, "%s: %s", prefix, old);
    else
        snprintf(detail, sizeof detail, "%s: %s", prefix, pst_strerror(st));
    return st;
}

const char *pst_error_detail(void)
{
    return detail;
}

void pst_error_clear(void)
{
    detail[0] = '\0';
}

void pst_sticky_reset(pst_sticky *s)
{
    s->status = PST_OK;
    s->detail[0] = '\0';
}

void pst_sticky_fail(pst_sticky *s, pst_status st, const char *why)
{
    if (st == PST_OK || s->status != PST_OK)
        return;
    s->status = st;
    snprintf(s->detail, sizeof s->detail, "%s", why && why[0] ? why : pst_strerror(st));
}

pst_status pst_sticky_read(const pst_sticky *s, char out[PST_ERROR_DETAIL_MAX])
{
    if (s->status != PST_OK)
        memcpy(out, s->detail, PST_ERROR_DETAIL_MAX);
    return s->status;
}

pst_status pst_sticky_raise(pst_status st, const char why[PST_ERROR_DETAIL_MAX])
{
    return st == PST_OK ? PST_OK : pst_error_set(st, "%s", why);
}
