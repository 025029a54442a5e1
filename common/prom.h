/* prom.h — Prometheus metrics: a registry of counters, gauges and histograms that the
 * training threads update lock-free, rendered in the Prometheus text format (version
 * 0.0.4) and served on GET /metrics by libmicrohttpd on its own thread
 * (--metrics-port), so a scrape never blocks training.
 *
 * Names follow Prometheus conventions (the caller's job): a `pstrain_` prefix, `_total` on
 * counters, base units (`_seconds`, `_bytes`). A metric is one series: metrics that share
 * a name (with different label sets) are rendered under one # HELP / # TYPE, in the order
 * of their first registration; they must share help text and kind.
 *
 * Thread safety: registration (pst_prom_counter/gauge/histogram, pst_prom_on_scrape)
 * before pst_prom_serve; updates (add/set/observe) from any thread at any time, lock-free
 * (atomics); rendering from any thread, concurrent with updates (a scrape sees each value
 * as it was at some instant; a histogram's buckets, sum and count may be mutually off by
 * the observations made during the scrape). */
#ifndef PST_PROM_H
#define PST_PROM_H

#include <stddef.h>

#include "common/error.h"

typedef struct pst_prom pst_prom;
typedef struct pst_prom_metric pst_prom_metric;
typedef struct pst_prom_server pst_prom_server;

pst_status pst_prom_init(pst_prom **out);
void pst_prom_free(pst_prom *r); /* after pst_prom_server_stop; accepts NULL */

/* labels: NULL or a label set in text form without braces, e.g. `status="ok"` or
 * `part="compute"` (values escaped by the caller; they are ours). Returns NULL only when
 * out of memory (updates to a NULL metric are ignored, so callers need not check). */
pst_prom_metric *pst_prom_counter(pst_prom *r, const char *name, const char *help,
                                  const char *labels);
pst_prom_metric *pst_prom_gauge(pst_prom *r, const char *name, const char *help,
                                const char *labels);
/* bounds: nbounds upper bounds, increasing (the +Inf bucket is added). */
pst_prom_metric *pst_prom_histogram(pst_prom *r, const char *name, const char *help,
                                    const char *labels, const double *bounds, int nbounds);

void pst_prom_add(pst_prom_metric *m, double v);     /* counter (v >= 0) or gauge */
void pst_prom_set(pst_prom_metric *m, double v);     /* gauge */
void pst_prom_observe(pst_prom_metric *m, double v); /* histogram */
double pst_prom_value(const pst_prom_metric *m);     /* counter/gauge; histogram: its sum */

/* fn runs at the start of every render (e.g. to set gauges read from elsewhere: a version,
 * the trainers connected). At most 8. */
void pst_prom_on_scrape(pst_prom *r, void (*fn)(void *arg), void *arg);

/* The text exposition of every metric, NUL-terminated, malloc'd (the caller frees); NULL
 * when out of memory. */
char *pst_prom_render(pst_prom *r);

/* Connections a /metrics server keeps at once, and from one client address: idle ones
 * are closed after 10 s, and one address cannot hold them all, so a client that opens
 * many and sends nothing does not keep a scraper at another address out. */
#define PST_PROM_MAX_CONNECTIONS 128
#define PST_PROM_MAX_CONNECTIONS_PER_IP 8

/* Serves GET /metrics (200, text/plain; version=0.0.4; HEAD too, not counted as a scrape)
 * on bind:port (port 0: any free port, pst_prom_server_port tells) from libmicrohttpd's own
 * thread, with the connection limits above; other paths get 404, other methods 405.
 * Errors: PST_ERR_INVALID for an address
 * that is not IPv4 or a port outside 0..65535, PST_ERR_IO naming the address when it cannot
 * listen. */
pst_status pst_prom_serve(pst_prom *r, const char *bind, int port, pst_prom_server **out);
int pst_prom_server_port(const pst_prom_server *s);
long pst_prom_server_scrapes(const pst_prom_server *s); /* GET /metrics answered */
void pst_prom_server_stop(pst_prom_server *s); /* accepts NULL */

#endif /* PST_PROM_H */
