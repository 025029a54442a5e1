/* prom.c — the Prometheus registry and its /metrics server (see prom.h).
 *
 * DESIGN: a metric is a fixed record registered before serving; values are C11 atomics
 * (a double's bits in an _Atomic uint64_t, added with a CAS loop), so the training threads
 * update without a lock and a scrape reads while they do. The list is append-only and
 * registration happens before pst_prom_serve starts the HTTP thread, so rendering walks
 * it without a lock too. libmicrohttpd runs one internal polling thread: scrapes are rare
 * (seconds apart) and short, and that thread is the only one that ever waits on a client. */
#include "common/prom.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM };
enum { MAX_SCRAPE_FNS = 8, MAX_BOUNDS = 32 };

struct pst_prom_metric {
    int kind;
    char *name, *help, *labels; /* labels: NULL or `a="b",c="d"` */
    _Atomic uint64_t value;     /* counter/gauge: a double's bits; histogram: the sum */
    int nbounds;
    double bounds[MAX_BOUNDS];
    _Atomic uint64_t buckets[MAX_BOUNDS + 1]; /* not cumulative; the last is +Inf */
    _Atomic uint64_t count;
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
};

/* ---- values ----------------------------------------------------------------------------- */

static uint64_t bits_of(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static double double_of(uint64_t b)
{
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

static void atomic_add_double(_Atomic uint64_t *a, double v)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, bits_of(double_of(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

void pst_prom_add(pst_prom_metric *m, double v)
{
    if (m && m->kind != KIND_HISTOGRAM)
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
    int i = 0;
    while (i < m->nbounds && v > m->bounds[i])
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
        free(m->name);
        free(m->help);
        free(m->labels);
        free(m);
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
        free(m->name);
        free(m->help);
        free(m->labels);
        free(m);
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
    if (nbounds < 0 || nbounds > MAX_BOUNDS)
        return NULL;
    pst_prom_metric *m = add(r, KIND_HISTOGRAM, name, help, labels);
    if (m) {
        m->nbounds = nbounds;
        memcpy(m->bounds, bounds, sizeof(double) * (size_t)nbounds);
    }
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

/* A sample value as Prometheus writes it: integers plainly, others in full precision. */
static void put_value(text *t, double v)
{
    if (isnan(v))
        put(t, "NaN");
    else if (isinf(v))
        put(t, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0)
        put(t, "%.0f", v);
    else
        put(t, "%.17g", v);
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
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
        body = strdup("only GET /metrics\n");
        type = "text/plain; charset=utf-8";
    } else if (strcmp(url, "/metrics")) {
        code = MHD_HTTP_NOT_FOUND;
        body = strdup("not found: the metrics are at /metrics\n");
        type = "text/plain; charset=utf-8";
    } else {
        body = pst_prom_render(s->r);
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

pst_status pst_prom_serve(pst_prom *r, const char *host, int port, pst_prom_server **out)
{
    *out = NULL;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (port < 0 || port > 65535 || inet_pton(AF_INET, host, &addr.sin_addr) != 1)
        return pst_error_set(PST_ERR_INVALID, "metrics: %s:%d is not an IPv4 address and port "
                             "(example: 0.0.0.0:9464)", host, port);
    pst_prom_server *s = calloc(1, sizeof *s);
    if (!s)
        return pst_error_set(PST_ERR_NOMEM, "metrics: out of memory");
    s->r = r;
    /* Its port is taken to mean "in use" unless the socket says otherwise: probe first, so
     * the error names the cause (libmicrohttpd only returns NULL). */
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1, err = 0;
    if (probe >= 0) {
        setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(probe, (struct sockaddr *)&addr, sizeof addr) != 0)
            err = errno;
        close(probe);
    }
    if (!err)
        s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL_LINUX_ONLY,
                                (uint16_t)port, NULL, NULL, answer, s, MHD_OPTION_SOCK_ADDR,
                                (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_TIMEOUT,
                                (unsigned)10, MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
                                MHD_OPTION_END);
    if (!s->d) {
        free(s);
        return pst_error_set(PST_ERR_IO, "metrics: cannot listen on %s:%d: %s", host, port,
                             err ? strerror(err) : "libmicrohttpd could not start");
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
    MHD_stop_daemon(s->d);
    free(s);
}
