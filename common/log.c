/* log.c — see log.h. State is a handful of atomics set by main(); lines are written with
 * one write(2) so concurrent threads never interleave inside a line. */
#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = PST_LOG_INFO;
static atomic_long log_step = -1;
static atomic_int log_rank = -1;
static char log_role[32] = "pstrain";

void pst_log_init(pst_log_level level, const char *role, int rank)
{
    atomic_store(&log_level, (int)level);
    atomic_store(&log_rank, rank);
    snprintf(log_role, sizeof log_role, "%s", role ? role : "pstrain");
}

void pst_log_set_level(pst_log_level level)
{
    atomic_store(&log_level, (int)level);
}

void pst_log_set_step(long step)
{
    atomic_store(&log_step, step);
}

int pst_log_enabled(pst_log_level level)
{
    return (int)level >= atomic_load(&log_level) && level < PST_LOG_OFF;
}

int pst_log_level_parse(const char *s, pst_log_level *out)
{
    static const char *const names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i <= PST_LOG_OFF; i++) {
        if (strcasecmp(s, names[i]) == 0) {
            *out = (pst_log_level)i;
            return 0;
        }
    }
    return -1;
}

void pst_log_write(pst_log_level level, const char *fmt, ...)
{
    static const char *const tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %s %s", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, tags[level], log_role);
    int rank = atomic_load(&log_rank);
    if (rank >= 0)
        n += snprintf(line + n, sizeof line - n, "[%d]", rank);
    long step = atomic_load(&log_step);
    if (step >= 0)
        n += snprintf(line + n, sizeof line - n, " step %ld", step);
    n += snprintf(line + n, sizeof line - n, ": ");
    va_list ap;
    va_start(ap, fmt);
    if (n < (int)sizeof line)
        n += vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
