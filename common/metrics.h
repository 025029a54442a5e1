/* metrics.h — metrics for machines: JSON lines appended to a file (--metrics FILE).
 * Each record is one line `{"event":"...", ...}` written with one buffered fputs; the
 * file is flushed at close. A NULL or closed writer ignores records, so call sites need
 * no checks. Not thread safe: one writer per thread. */
#ifndef PST_METRICS_H
#define PST_METRICS_H

#include <stdio.h>

#include "common/error.h"

typedef struct pst_metrics {
    FILE *f;
} pst_metrics;

/* Opens `path` for appending; an empty path gives a writer that ignores records.
 * Errors: PST_ERR_IO naming the path. */
pst_status pst_metrics_open(pst_metrics *m, const char *path);
/* Writes `{"event":"<event>",<fields>}`; fields is printf-formatted JSON members
 * ("\"step\":%ld,\"loss\":%.6f"), or NULL for none. Records are cut at 1 KiB. */
void pst_metrics_write(pst_metrics *m, const char *event, const char *fields, ...)
    __attribute__((format(printf, 3, 4)));
void pst_metrics_close(pst_metrics *m); /* accepts a zeroed writer */

#endif /* PST_METRICS_H */
