/* prom.c — the Prometheus registry and its /metrics server (see prom.h).
 *
 * DESIGN: a metric is a fixed record registered before serving; values are C11 atomics
 * (a double's bits in an _Atomic uint64_t, added with a CAS loop; histogram buckets and
 * count as plain atomic integers), so the training threads update without a lock and a
 * scrape reads while they do. The list is append-only and registration happens before
 * pst_prom_serve starts the HTTP thread (pthread_create orders the two), so rendering
 * walks it without a lock too.
 *
 * libmicrohttpd runs one internal polling thread rather than a thread per connection:
 * scrapes are rare (seconds apart) and short, a stuck or slow client costs that thread a
 * socket in its poll set rather than a thread of its own, and that thread is the only one
 * that ever waits on a client, so training never blocks on a scrape. It also serializes
 * the scrapes, so the on_scrape callbacks never run concurrently from the server.
 *
 * Sample values are written as Prometheus's own clients write them: integers plainly, other
 * values in the shortest form that reads back to the same double (so a bound of 0.1 is
 * le="0.1", which a selector can name, not le="0.10000000000000001"). */
#include "common/prom.h"

#include <arpa/inet.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/memory.h"

enum { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM };
enum { MAX_SCRAPE_FNS = 8 };

struct pst_prom_metric {
    int kind;
    char *name, *help, *labels; /* labels: NULL or `a="b",c="d"` */
    _Atomic uint64_t value;     /* counter/gauge: a double's bits; histogram: the sum */
    _Atomic uint64_t count;     /* histogram: observations */
    int nbounds;
    double *bounds;             /* (nbounds) histogram upper bounds, increasing */
    _Atomic uint64_t *buckets;  /* (nbounds + 1) not cumulative; the last is +Inf */
    struct pst_prom_metric *next;
};

struct pst_prom {
    pst_prom_metric *head, *tail;
    void (*scrape_fn[MAX_SCRAPE_FNS])(void *);
    void *scrape_arg[MAX_SCRAPE_FNS];
    int nscrape;
};

struct pst_prom_server {
    pst_prom *r;
    struct MHD_Daemon *d;
    int port;
    atomic_long scrapes;
    /* While starting: the last message libmicrohttpd logged on the starting thread, which
     * says why MHD_start_daemon failed (it only returns NULL). */
    pthread_t starter;
    atomic_int starting;
    char why[192];
};

/* ---- values ----------------------------------------------------------------------------- */

/* a double's bits and back, through a union (C11 6.5.2.3 reads the bits as the other type) */
typedef union {
    double v;
    uint64_t b;
} pun64;

static uint64_t bits_of(double v) { return (pun64){.v = v}.b; }

static double double_of(uint64_t b) { return (pun64){.b = b}.v; }

static void atomic_add_double(_Atomic uint64_t *a, double v)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, bits_of(double_of(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

void pst_prom_add(pst_prom_metric *m, double v)
{
    if (!m || m->kind == KIND_HISTOGRAM)
        return;
    if (m->kind == KIND_COUNTER && !(v >= 0)) /* a counter never goes down (nor to NaN) */
        return;
    atomic_add_double(&m->value, v);
}

void pst_prom_set(pst_prom_metric *m, double v)
{
    if (m && m->kind == KIND_GAUGE)
        atomic_store_explicit(&m->value, bits_of(v), memory_order_relaxed);
}

void pst_prom_observe(pst_prom_metric *m, double v)
{
    if (!m || m->kind != KIND_HISTOGRAM)
        return;
    int i = 0; /* the first bucket with v <= its bound; NaN falls in +Inf only */
    while (i < m->nbounds && !(v <= m->bounds[i]))
        i++;
    atomic_fetch_add_explicit(&m->buckets[i], 1, memory_order_relaxed);
    atomic_add_double(&m->value, v);
    atomic_fetch_add_explicit(&m->count, 1, memory_order_relaxed);
}

double pst_prom_value(const pst_prom_metric *m)
{
    return m ? double_of(atomic_load_explicit(&m->value, memory_order_relaxed)) : 0.0;
}

/* ---- the registry ----------------------------------------------------------------------- */

pst_status pst_prom_init(pst_prom **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? PST_OK : pst_error_set(PST_ERR_NOMEM, "metrics: out of memory");
}

void pst_prom_free(pst_prom *r)
{
    if (!r)
        return;
    for (pst_prom_metric *m = r->head, *next; m; m = next) {
        next = m->next;
        PST_FREE_ALL(m->name, m->help, m->labels, m->bounds, (void *)m->buckets, m);
    }
    free(r);
}

static pst_prom_metric *add(pst_prom *r, int kind, const char *name, const char *help,
                            const char *labels)
{
    pst_prom_metric *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->kind = kind;
    m->name = strdup(name);
    m->help = strdup(help ? help : "");
    m->labels = labels && labels[0] ? strdup(labels) : NULL;
    if (!m->name || !m->help || (labels && labels[0] && !m->labels)) {
        PST_FREE_ALL(m->name, m->help, m->labels, m);
        return NULL;
    }
    if (r->tail)
        r->tail->next = m;
    else
        r->head = m;
    r->tail = m;
    return m;
}

pst_prom_metric *pst_prom_counter(pst_prom *r, const char *name, const char *help,
                                  const char *labels)
{
    return add(r, KIND_COUNTER, name, help, labels);
}

pst_prom_metric *pst_prom_gauge(pst_prom *r, const char *name, const char *help,
                                const char *labels)
{
    return add(r, KIND_GAUGE, name, help, labels);
}

pst_prom_metric *pst_prom_histogram(pst_prom *r, const char *name, const char *help,
                                    const char *labels, const double *bounds, int nbounds)
{
    if (nbounds < 0 || (nbounds > 0 && !bounds))
        return NULL;
    /* Allocated before the metric joins the list: a failure leaves nothing half-made. */
    double *b = malloc(sizeof(double) * (size_t)(nbounds ? nbounds : 1));
    _Atomic uint64_t *k = calloc((size_t)nbounds + 1, sizeof *k);
    pst_prom_metric *m = b && k ? add(r, KIND_HISTOGRAM, name, help, labels) : NULL;
    if (!m) {
        free(b);
        free((void *)k);
        return NULL;
    }
    if (nbounds)
        memcpy(b, bounds, sizeof(double) * (size_t)nbounds);
    m->bounds = b;
    m->buckets = k;
    m->nbounds = nbounds;
    return m;
}

void pst_prom_on_scrape(pst_prom *r, void (*fn)(void *arg), void *arg)
{
    if (r->nscrape < MAX_SCRAPE_FNS) {
        r->scrape_fn[r->nscrape] = fn;
        r->scrape_arg[r->nscrape++] = arg;
    }
}

/* ---- the text format -------------------------------------------------------------------- */

typedef struct text {
    char *buf;
    size_t len, cap;
    int failed;
} text;

static void put(text *t, const char *fmt, ...)
{
    if (t->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        char *more = realloc(t->buf, t->cap * 2 + (size_t)n);
        if (!more) {
            t->failed = 1;
            return;
        }
        t->buf = more;
        t->cap = t->cap * 2 + (size_t)n;
    }
}

/* A sample value as Prometheus writes it: integers below 2^53 plainly, others in the
 * shortest %g form that reads back to the same double. %g drops trailing zeros, so when
 * 15 digits or fewer read back %.15g is already the shortest; 17 always read back. */
static void put_value(text *t, double v)
{
    if (isnan(v)) {
        put(t, "NaN");
    } else if (isinf(v)) {
        put(t, v > 0 ? "+Inf" : "-Inf");
    } else if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        put(t, "%.0f", v);
    } else {
        char s[32];
        for (int digits = 15; digits <= 17; digits++) {
            snprintf(s, sizeof s, "%.*g", digits, v);
            if (strtod(s, NULL) == v)
                break;
        }
        put(t, "%s", s);
    }
}

static void put_help(text *t, const char *name, const char *help)
{
    put(t, "# HELP %s ", name);
    for (const char *p = help; *p; p++) {
        if (*p == '\\')
            put(t, "\\\\");
        else if (*p == '\n')
            put(t, "\\n");
        else
            put(t, "%c", *p);
    }
    put(t, "\n");
}

static void put_series(text *t, const pst_prom_metric *m)
{
    if (m->kind != KIND_HISTOGRAM) {
        put(t, "%s", m->name);
        if (m->labels)
            put(t, "{%s}", m->labels);
        put(t, " ");
        put_value(t, pst_prom_value(m));
        put(t, "\n");
        return;
    }
    uint64_t cumulative = 0;
    for (int i = 0; i <= m->nbounds; i++) {
        cumulative += atomic_load_explicit(&m->buckets[i], memory_order_relaxed);
        put(t, "%s_bucket{%s%sle=\"", m->name, m->labels ? m->labels : "", m->labels ? "," : "");
        if (i < m->nbounds)
            put_value(t, m->bounds[i]);
        else
            put(t, "+Inf");
        put(t, "\"} %llu\n", (unsigned long long)cumulative);
    }
    put(t, "%s_sum", m->name);
    if (m->labels)
        put(t, "{%s}", m->labels);
    put(t, " ");
    put_value(t, pst_prom_value(m));
    put(t, "\n%s_count", m->name);
    if (m->labels)
        put(t, "{%s}", m->labels);
    put(t, " %llu\n", (unsigned long long)atomic_load_explicit(&m->count, memory_order_relaxed));
}

char *pst_prom_render(pst_prom *r)
{
    for (int i = 0; i < r->nscrape; i++)
        r->scrape_fn[i](r->scrape_arg[i]);
    text t = {.buf = malloc(4096), .cap = 4096};
    if (!t.buf)
        return NULL;
    t.buf[0] = '\0';
    static const char *const kinds[] = {"counter", "gauge", "histogram"};
    for (const pst_prom_metric *m = r->head; m; m = m->next) {
        int seen = 0; /* its name was written with an earlier metric */
        for (const pst_prom_metric *e = r->head; e != m && !seen; e = e->next)
            seen = !strcmp(e->name, m->name);
        if (seen)
            continue;
        put_help(&t, m->name, m->help);
        put(&t, "# TYPE %s %s\n", m->name, kinds[m->kind]);
        for (const pst_prom_metric *s = m; s; s = s->next)
            if (!strcmp(s->name, m->name))
                put_series(&t, s);
    }
    if (t.failed) {
        free(t.buf);
        return NULL;
    }
    return t.buf;
}

/* ---- the server ------------------------------------------------------------------------- */

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **state)
{
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)state;
    pst_prom_server *s = cls;
    unsigned code = MHD_HTTP_OK;
    char *body = NULL;
    const char *type = "text/plain; version=0.0.4; charset=utf-8";
    /* HEAD is GET without the body (libmicrohttpd leaves it out); it is not a scrape. */
    const int get = !strcmp(method, MHD_HTTP_METHOD_GET);
    if (!get && strcmp(method, MHD_HTTP_METHOD_HEAD)) {
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
        body = strdup("only GET /metrics\n");
        type = "text/plain; charset=utf-8";
    } else if (strcmp(url, "/metrics")) {
        code = MHD_HTTP_NOT_FOUND;
        body = strdup("not found: the metrics are at /metrics\n");
        type = "text/plain; charset=utf-8";
    } else {
        body = pst_prom_render(s->r);
        if (body && get)
            atomic_fetch_add(&s->scrapes, 1);
    }
    if (!body)
        return MHD_NO; /* out of memory: the connection is closed */
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* libmicrohttpd's messages: at debug level, and while starting, kept as the reason a start
 * failed. Only the starting thread writes `why`; the server's own thread only logs. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    pst_prom_server *s = cls;
    char line[sizeof s->why];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\r\n")] = '\0';
    if (atomic_load(&s->starting) && pthread_equal(pthread_self(), s->starter))
        memcpy(s->why, line, sizeof line);
    PST_DEBUG("metrics: libmicrohttpd: %s", line);
}

pst_status pst_prom_serve(pst_prom *r, const char *host, int port, pst_prom_server **out)
{
    *out = NULL;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (!host || inet_pton(AF_INET, host, &addr.sin_addr) != 1)
        return pst_error_set(PST_ERR_INVALID, "metrics: bind address '%s' is not an IPv4 "
                             "address (0.0.0.0 for every interface, 127.0.0.1 for this host)",
                             host ? host : "(none)");
    if (port < 0 || port > 65535)
        return pst_error_set(PST_ERR_INVALID, "metrics: port %d on %s is outside 0..65535 "
                             "(0: any free port)", port, host);
    pst_prom_server *s = calloc(1, sizeof *s);
    if (!s)
        return pst_error_set(PST_ERR_NOMEM, "metrics: out of memory");
    s->r = r;
    s->starter = pthread_self();
    atomic_store(&s->starting, 1);
    /* The port is passed twice: the socket address is what binds, the argument is what
     * libmicrohttpd's messages name. */
    s->d = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port,
                            NULL, NULL, answer, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)PST_PROM_MAX_CONNECTIONS,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)PST_PROM_MAX_CONNECTIONS_PER_IP, MHD_OPTION_END);
    atomic_store(&s->starting, 0);
    if (!s->d) {
        pst_status st = pst_error_set(PST_ERR_IO, "metrics: cannot listen on %s:%d: %s", host,
                                      port, s->why[0] ? s->why : "libmicrohttpd could not start");
        free(s);
        return st;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info && info->port ? info->port : port;
    *out = s;
    return PST_OK;
}

int pst_prom_server_port(const pst_prom_server *s)
{
    return s ? s->port : -1;
}

long pst_prom_server_scrapes(const pst_prom_server *s)
{
    return s ? atomic_load(&((pst_prom_server *)s)->scrapes) : 0;
}

void pst_prom_server_stop(pst_prom_server *s)
{
    if (!s)
        return;
    MHD_stop_daemon(s->d); /* joins the server's thread: no callback runs after this */
    free(s);
}
