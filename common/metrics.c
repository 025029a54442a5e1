/* metrics.c — JSON-lines metrics writer (see metrics.h). */
#include "common/metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

pst_status pst_metrics_open(pst_metrics *m, const char *path)
{
    m->f = NULL;
    if (!path || !*path)
        return PST_OK;
    m->f = fopen(path, "a"); /* O_APPEND */
    if (!m->f)
        return pst_error_set(PST_ERR_IO, "--metrics %s: cannot open for appending: %s", path,
                             strerror(errno));
    /* Line-buffered: each record reaches the file in one append, whole, even when several
     * processes share the file. */
    setvbuf(m->f, NULL, _IOLBF, 0);
    return PST_OK;
}

void pst_metrics_write(pst_metrics *m, const char *event, const char *fields, ...)
{
    if (!m || !m->f)
        return;
    char line[1024];
    int n = snprintf(line, sizeof line, "{\"event\":\"%s\"%s", event,
                     fields && fields[0] ? "," : "");
    if (fields && n < (int)sizeof line) {
        va_list ap;
        va_start(ap, fields);
        vsnprintf(line + n, sizeof line - n, fields, ap);
        va_end(ap);
    }
    fputs(line, m->f);
    fputs("}\n", m->f);
}

void pst_metrics_close(pst_metrics *m)
{
    if (m && m->f) {
        fclose(m->f);
        m->f = NULL;
    }
}
