/* test_prom.c — the Prometheus registry and its /metrics server (common/prom.c).
 *
 * The text format is compared byte for byte (shared names, labels, help escaping, values
 * as Prometheus writes them, cumulative buckets); updates from 4 threads give exact totals;
 * a real HTTP exchange on 127.0.0.1 port 0 with a plain socket client checks GET /metrics
 * (status, content type, a body equal to pst_prom_render's), HEAD, 404, 405, a port in use
 * and bad addresses (exact error codes), and scrapes while 4 threads update; the scraped
 * text is read by Prometheus's own parser (python3-prometheus-client). Nothing waits on
 * wall-clock time: the HTTP client only has a receive timeout so a hung server fails. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "check.h"
#include "common/prom.h"

/* ---- the text format ------------------------------------------------------------------- */

/* The small registry of the exact-text and parser tests, with its expected text. */
static pst_prom *small_registry(void)
{
    pst_prom *r;
    CHECK_OK(pst_prom_init(&r));
    const char *help = "Calls, by\noutcome \\";
    pst_prom_metric *ok = pst_prom_counter(r, "pstrain_x_total", help, "status=\"ok\"");
    pst_prom_metric *g = pst_prom_gauge(r, "pstrain_g", "A gauge", NULL);
    pst_prom_metric *bad = pst_prom_counter(r, "pstrain_x_total", help, "status=\"error\"");
    pst_prom_metric *plain = pst_prom_counter(r, "pstrain_x_total", help, NULL);
    const double b[] = {0.1, 1, 10};
    pst_prom_metric *h = pst_prom_histogram(r, "pstrain_h_seconds", "Times", NULL, b, 3);
    pst_prom_metric *hl = pst_prom_histogram(r, "pstrain_h_seconds", "Times", "part=\"io\"", b, 3);
    cr_assert(ok && g && bad && plain && h && hl);
    pst_prom_add(ok, 3);
    pst_prom_add(bad, 1);
    pst_prom_add(plain, 0.5);
    pst_prom_set(g, 2.5);
    pst_prom_observe(h, 0.05);
    pst_prom_observe(h, 0.5);
    pst_prom_observe(h, 1); /* on a bound: that bucket (le is <=) */
    pst_prom_observe(h, 100);
    pst_prom_observe(hl, 0.25);
    return r;
}

static const char small_text[] = "# HELP pstrain_x_total Calls, by\\noutcome \\\\\n"
                                 "# TYPE pstrain_x_total counter\n"
                                 "pstrain_x_total{status=\"ok\"} 3\n"
                                 "pstrain_x_total{status=\"error\"} 1\n"
                                 "pstrain_x_total 0.5\n"
                                 "# HELP pstrain_g A gauge\n"
                                 "# TYPE pstrain_g gauge\n"
                                 "pstrain_g 2.5\n"
                                 "# HELP pstrain_h_seconds Times\n"
                                 "# TYPE pstrain_h_seconds histogram\n"
                                 "pstrain_h_seconds_bucket{le=\"0.1\"} 1\n"
                                 "pstrain_h_seconds_bucket{le=\"1\"} 3\n"
                                 "pstrain_h_seconds_bucket{le=\"10\"} 3\n"
                                 "pstrain_h_seconds_bucket{le=\"+Inf\"} 4\n"
                                 "pstrain_h_seconds_sum 101.55\n"
                                 "pstrain_h_seconds_count 4\n"
                                 "pstrain_h_seconds_bucket{part=\"io\",le=\"0.1\"} 0\n"
                                 "pstrain_h_seconds_bucket{part=\"io\",le=\"1\"} 1\n"
                                 "pstrain_h_seconds_bucket{part=\"io\",le=\"10\"} 1\n"
                                 "pstrain_h_seconds_bucket{part=\"io\",le=\"+Inf\"} 1\n"
                                 "pstrain_h_seconds_sum{part=\"io\"} 0.25\n"
                                 "pstrain_h_seconds_count{part=\"io\"} 1\n";

Test(prom, text_format_is_exact)
{
    pst_prom *r = small_registry();
    char *text = pst_prom_render(r);
    cr_assert_not_null(text);
    cr_expect_str_eq(text, small_text);
    free(text);
    pst_prom_free(r);
}

Test(prom, empty_registry_renders_nothing)
{
    pst_prom *r;
    CHECK_OK(pst_prom_init(&r));
    char *text = pst_prom_render(r);
    cr_assert_not_null(text);
    cr_expect_str_eq(text, "");
    free(text);
    pst_prom_free(r);
    pst_prom_free(NULL);
}

/* Integers below 2^53 plainly, others in the shortest form that reads back exactly, and
 * +Inf/-Inf/NaN as Prometheus spells them (bounds too). */
Test(prom, values_are_written_as_prometheus_writes_them)
{
    static const struct {
        double v;
        const char *text;
    } cases[] = {
        {0, "0"},
        {-3, "-3"},
        {-0.5, "-0.5"},
        {0.1, "0.1"},
        {0.1 + 0.2, "0.30000000000000004"},
        {1.0 / 3, "0.3333333333333333"},
        {2.0 / 3, "0.6666666666666666"},
        {0.1 * 3, "0.30000000000000004"},
        {1 - 1e-16, "0.9999999999999999"},
        {1e-5, "1e-05"},
        {1.5e-7, "1.5e-07"},
        {9007199254740991.0, "9007199254740991"}, /* 2^53 - 1 */
        {9007199254740992.0, "9007199254740992"}, /* 2^53: %g's form, the same digits */
        {1e20, "1e+20"},
        {123456.75, "123456.75"},
        {INFINITY, "+Inf"},
        {-INFINITY, "-Inf"},
        {NAN, "NaN"},
    };
    const size_t n = sizeof cases / sizeof cases[0];
    pst_prom *r;
    CHECK_OK(pst_prom_init(&r));
    for (size_t i = 0; i < n; i++)
        pst_prom_set(pst_prom_gauge(r, "v", "Values", NULL), cases[i].v);
    const double bounds[] = {1e-5, 3e-4, 0.1, 2.5, 1e20};
    pst_prom_histogram(r, "b", "Bounds", NULL, bounds, 5);
    char want[4096] = "# HELP v Values\n# TYPE v gauge\n";
    for (size_t i = 0; i < n; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "v %s\n", cases[i].text);
    strcat(want, "# HELP b Bounds\n# TYPE b histogram\n"
                 "b_bucket{le=\"1e-05\"} 0\nb_bucket{le=\"0.0003\"} 0\nb_bucket{le=\"0.1\"} 0\n"
                 "b_bucket{le=\"2.5\"} 0\nb_bucket{le=\"1e+20\"} 0\nb_bucket{le=\"+Inf\"} 0\n"
                 "b_sum 0\nb_count 0\n");
    char *text = pst_prom_render(r);
    cr_expect_str_eq(text, want);
    free(text);
    pst_prom_free(r);
}

/* Counters never go down; each update applies to its kind only; NULL metrics are ignored;
 * NaN is in no finite bucket. */
Test(prom, updates_apply_to_their_kind_only)
{
    pst_prom *r;
    CHECK_OK(pst_prom_init(&r));
    pst_prom_metric *c = pst_prom_counter(r, "c_total", "c", NULL);
    pst_prom_metric *g = pst_prom_gauge(r, "g", "g", NULL);
    const double b[] = {1};
    pst_prom_metric *h = pst_prom_histogram(r, "h", "h", NULL, b, 1);
    pst_prom_add(c, 2);
    pst_prom_add(c, -1);
    pst_prom_add(c, NAN);
    pst_prom_set(c, 100);
    pst_prom_observe(c, 5);
    cr_expect_eq(pst_prom_value(c), 2.0);
    pst_prom_add(g, -1.5);
    pst_prom_observe(g, 5);
    cr_expect_eq(pst_prom_value(g), -1.5);
    pst_prom_add(h, 7);
    pst_prom_set(h, 7);
    pst_prom_observe(h, NAN);
    cr_expect(isnan(pst_prom_value(h)), "a NaN observation makes the sum NaN");
    pst_prom_add(NULL, 1);
    pst_prom_set(NULL, 1);
    pst_prom_observe(NULL, 1);
    cr_expect_eq(pst_prom_value(NULL), 0.0);
    char *text = pst_prom_render(r);
    cr_expect_str_eq(text, "# HELP c_total c\n# TYPE c_total counter\nc_total 2\n"
                           "# HELP g g\n# TYPE g gauge\ng -1.5\n"
                           "# HELP h h\n# TYPE h histogram\n"
                           "h_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 1\nh_sum NaN\nh_count 1\n");
    free(text);
    pst_prom_free(r);
}

static void add_one(void *arg)
{
    pst_prom_metric *m = arg;
    pst_prom_add(m, 1);
}

Test(prom, on_scrape_runs_before_every_render)
{
    pst_prom *r;
    CHECK_OK(pst_prom_init(&r));
    pst_prom_metric *calls = pst_prom_gauge(r, "calls", "Renders", NULL);
    pst_prom_metric *extra = pst_prom_gauge(r, "extra", "The ninth callback's", NULL);
    for (int i = 0; i < 8; i++)
        pst_prom_on_scrape(r, add_one, calls);
    pst_prom_on_scrape(r, add_one, extra); /* a ninth: beyond "at most 8", ignored */
    char *text = pst_prom_render(r);
    cr_expect(strstr(text, "\ncalls 8\n") && strstr(text, "\nextra 0\n"), "%s", text);
    free(text);
    text = pst_prom_render(r);
    cr_expect(strstr(text, "\ncalls 16\n"), "%s", text);
    free(text);
    pst_prom_free(r);
}

/* ---- concurrent updates ---------------------------------------------------------------- */

enum { THREADS = 4, ADDS = 100000 };

typedef struct adder {
    pst_prom_metric *c, *g, *h;
} adder;

static void *add_many(void *arg)
{
    adder *a = arg;
    for (int i = 0; i < ADDS; i++) {
        pst_prom_add(a->c, 1);
        pst_prom_add(a->g, i % 2 ? 0.5 : -0.25);
        pst_prom_observe(a->h, (double)(i % 4)); /* 0, 1, 2, 3: one per bucket */
    }
    return NULL;
}

Test(prom, concurrent_updates_are_exact)
{
    pst_prom *r;
    CHECK_OK(pst_prom_init(&r));
    const double b[] = {0, 1, 2};
    adder a = {pst_prom_counter(r, "c_total", "c", NULL), pst_prom_gauge(r, "g", "g", NULL),
               pst_prom_histogram(r, "h", "h", NULL, b, 3)};
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, add_many, &a), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    /* Every partial sum is a multiple of 0.25 below 2^53: exact in any order. */
    cr_expect_eq(pst_prom_value(a.c), 400000.0);
    cr_expect_eq(pst_prom_value(a.g), 4 * (ADDS / 2) * 0.25);
    cr_expect_eq(pst_prom_value(a.h), 4 * (ADDS / 4) * 6.0);
    char *text = pst_prom_render(r);
    cr_expect_str_eq(text, "# HELP c_total c\n# TYPE c_total counter\nc_total 400000\n"
                           "# HELP g g\n# TYPE g gauge\ng 50000\n"
                           "# HELP h h\n# TYPE h histogram\n"
                           "h_bucket{le=\"0\"} 100000\nh_bucket{le=\"1\"} 200000\n"
                           "h_bucket{le=\"2\"} 300000\nh_bucket{le=\"+Inf\"} 400000\n"
                           "h_sum 600000\nh_count 400000\n");
    free(text);
    pst_prom_free(r);
}

/* ---- HTTP ------------------------------------------------------------------------------ */

/* A request to 127.0.0.1:port; the whole answer (status line, headers, body). */
/* A socket connected to 127.0.0.1:port from the loopback address `from` (NULL: any). */
static int connect_from(int port, const char *from)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    if (from) {
        struct sockaddr_in src = {.sin_family = AF_INET};
        cr_assert_eq(inet_pton(AF_INET, from, &src.sin_addr), 1);
        cr_assert_eq(bind(fd, (struct sockaddr *)&src, sizeof src), 0, "%s", strerror(errno));
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    return fd;
}

static char *http_from(int port, const char *request, const char *from)
{
    int fd = connect_from(port, from);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv); /* a hung server fails */
    cr_assert_eq(write(fd, request, strlen(request)), (ssize_t)strlen(request));
    size_t len = 0, cap = 1 << 16;
    char *all = malloc(cap);
    ssize_t k;
    while ((k = read(fd, all + len, cap - 1 - len)) > 0) {
        len += (size_t)k;
        if (len == cap - 1)
            all = realloc(all, cap *= 2);
    }
    cr_assert_eq(k, 0, "reading the answer: %s", strerror(errno));
    close(fd);
    all[len] = '\0';
    return all;
}

static char *http(int port, const char *request)
{
    return http_from(port, request, NULL);
}

static char *get_from(int port, const char *path, const char *from)
{
    char req[256];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    return http_from(port, req, from);
}

static char *get(int port, const char *path)
{
    return get_from(port, path, NULL);
}

/* The body of an answer (after the blank line). */
static const char *body_of(const char *answer)
{
    const char *p = strstr(answer, "\r\n\r\n");
    cr_assert_not_null(p, "no end of headers in: %s", answer);
    return p + 4;
}

static int status_of(const char *answer)
{
    int code = 0;
    cr_assert_eq(sscanf(answer, "HTTP/1.1 %d ", &code), 1, "no status line: %s", answer);
    return code;
}

static int renders;
static void count_render(void *arg)
{
    (void)arg;
    renders++;
}

Test(prom, get_metrics_is_the_render, .timeout = 30)
{
    pst_prom *r = small_registry();
    pst_prom_on_scrape(r, count_render, NULL);
    pst_prom_server *s;
    CHECK_OK(pst_prom_serve(r, "127.0.0.1", 0, &s));
    const int port = pst_prom_server_port(s);
    cr_assert_gt(port, 0);
    cr_expect_eq(pst_prom_server_scrapes(s), 0);

    char *got = get(port, "/metrics");
    cr_assert_eq(status_of(got), 200, "%s", got);
    cr_expect(strstr(got, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
              "%s", got);
    cr_expect_eq(renders, 1, "on_scrape ran once per scrape");
    char *want = pst_prom_render(r);
    cr_expect_str_eq(body_of(got), want);
    cr_expect_str_eq(body_of(got), small_text);
    free(want);
    free(got);
    cr_expect_eq(pst_prom_server_scrapes(s), 1);

    /* A query string is not part of the path. */
    got = get(port, "/metrics?name=x");
    cr_expect_eq(status_of(got), 200, "%s", got);
    free(got);
    cr_expect_eq(pst_prom_server_scrapes(s), 2);

    /* HEAD: the headers of a GET without the body; not a scrape. */
    got = http(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    cr_expect_eq(status_of(got), 200, "%s", got);
    cr_expect_str_eq(body_of(got), "");
    free(got);
    cr_expect_eq(pst_prom_server_scrapes(s), 2);

    pst_prom_server_stop(s);
    pst_prom_server_stop(NULL);
    pst_prom_free(r);
}

Test(prom, other_paths_404_other_methods_405, .timeout = 30)
{
    pst_prom *r = small_registry();
    pst_prom_server *s;
    CHECK_OK(pst_prom_serve(r, "127.0.0.1", 0, &s));
    const int port = pst_prom_server_port(s);
    static const char *const paths[] = {"/", "/metricsx", "/metrics/", "/Metrics", "/other"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        char *got = get(port, paths[i]);
        cr_expect_eq(status_of(got), 404, "GET %s: %s", paths[i], got);
        free(got);
    }
    static const char *const methods[] = {"POST", "PUT", "DELETE", "PATCH"};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        char req[256];
        snprintf(req, sizeof req, "%s /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                 "Connection: close\r\n\r\nabc", methods[i]);
        char *got = http(port, req);
        cr_expect_eq(status_of(got), 405, "%s: %s", methods[i], got);
        cr_expect(strstr(got, "\r\nAllow: GET, HEAD\r\n"), "%s: %s", methods[i], got);
        free(got);
    }
    cr_expect_eq(pst_prom_server_scrapes(s), 0, "404 and 405 are not scrapes");
    /* The server still answers after them. */
    char *got = get(port, "/metrics");
    cr_expect_eq(status_of(got), 200, "%s", got);
    free(got);
    cr_expect_eq(pst_prom_server_scrapes(s), 1);
    pst_prom_server_stop(s);
    pst_prom_free(r);
}

Test(prom, any_address_serves_loopback, .timeout = 30)
{
    pst_prom *r = small_registry();
    pst_prom_server *s;
    CHECK_OK(pst_prom_serve(r, "0.0.0.0", 0, &s));
    char *got = get(pst_prom_server_port(s), "/metrics");
    cr_expect_eq(status_of(got), 200, "%s", got);
    cr_expect_str_eq(body_of(got), small_text);
    free(got);
    pst_prom_server_stop(s);
    pst_prom_free(r);
}

Test(prom, port_in_use_is_io_error_naming_it, .timeout = 30)
{
    pst_prom *r = small_registry();
    pst_prom_server *s, *again = (pst_prom_server *)&again;
    CHECK_OK(pst_prom_serve(r, "127.0.0.1", 0, &s));
    const int port = pst_prom_server_port(s);
    CHECK_ERR(pst_prom_serve(r, "127.0.0.1", port, &again), PST_ERR_IO);
    cr_expect_null(again);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    cr_expect(strstr(pst_error_detail(), want) && strstr(pst_error_detail(), "in use"),
              "detail '%s' should name %s and the cause", pst_error_detail(), want);
    cr_expect_null(strchr(pst_error_detail(), '\n'), "one line: '%s'", pst_error_detail());
    /* The first server is unharmed. */
    char *got = get(port, "/metrics");
    cr_expect_eq(status_of(got), 200, "%s", got);
    free(got);
    pst_prom_server_stop(s);
    pst_prom_free(r);
}

Test(prom, bad_address_or_port_is_invalid)
{
    pst_prom *r;
    CHECK_OK(pst_prom_init(&r));
    static const char *const bad[] = {"localhost", "::1", "1.2.3", "", "256.0.0.1",
                                      "127.0.0.1:80", " 127.0.0.1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pst_prom_server *s;
        CHECK_ERR(pst_prom_serve(r, bad[i], 0, &s), PST_ERR_INVALID);
        cr_expect_null(s);
        char quoted[64];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        cr_expect(strstr(pst_error_detail(), quoted), "detail '%s' should name %s",
                  pst_error_detail(), quoted);
    }
    pst_prom_server *s;
    CHECK_ERR(pst_prom_serve(r, NULL, 0, &s), PST_ERR_INVALID);
    CHECK_ERR(pst_prom_serve(r, "127.0.0.1", -1, &s), PST_ERR_INVALID);
    cr_expect(strstr(pst_error_detail(), "-1"), "%s", pst_error_detail());
    CHECK_ERR(pst_prom_serve(r, "127.0.0.1", 65536, &s), PST_ERR_INVALID);
    cr_expect(strstr(pst_error_detail(), "65536"), "%s", pst_error_detail());
    pst_prom_free(r);
}

/* ---- scrapes during updates ------------------------------------------------------------ */

/* The value of the series `series` (its whole name and labels) in a scrape; -1 if absent. */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; (p = strstr(p, series)); p += n)
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1;
}

enum { SCRAPES = 20 };

Test(prom, scrapes_during_updates_see_monotone_counters, .timeout = 60)
{
    pst_prom *r;
    CHECK_OK(pst_prom_init(&r));
    const double b[] = {0, 1, 2};
    adder a = {pst_prom_counter(r, "c_total", "c", NULL), pst_prom_gauge(r, "g", "g", NULL),
               pst_prom_histogram(r, "h", "h", NULL, b, 3)};
    pst_prom_server *s;
    CHECK_OK(pst_prom_serve(r, "127.0.0.1", 0, &s));
    const int port = pst_prom_server_port(s);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, add_many, &a), 0);
    double last_c = 0, last_count = 0;
    for (int k = 0; k < SCRAPES; k++) {
        char *got = get(port, "/metrics");
        cr_assert_eq(status_of(got), 200, "%s", got);
        const char *text = body_of(got);
        const double c = sample(text, "c_total"), count = sample(text, "h_count");
        cr_assert(c >= last_c && c <= THREADS * ADDS, "scrape %d: c_total %g after %g", k, c,
                  last_c);
        cr_assert(count >= last_count && count <= THREADS * ADDS, "scrape %d: h_count %g after %g",
                  k, count, last_count);
        /* Buckets are cumulative within a scrape. */
        const double b0 = sample(text, "h_bucket{le=\"0\"}"), b1 = sample(text, "h_bucket{le=\"1\"}"),
                     b2 = sample(text, "h_bucket{le=\"2\"}"),
                     binf = sample(text, "h_bucket{le=\"+Inf\"}");
        cr_assert(0 <= b0 && b0 <= b1 && b1 <= b2 && b2 <= binf, "scrape %d:\n%s", k, text);
        last_c = c;
        last_count = count;
        free(got);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    char *got = get(port, "/metrics");
    cr_expect_eq(sample(body_of(got), "c_total"), (double)THREADS * ADDS);
    cr_expect_eq(sample(body_of(got), "h_count"), (double)THREADS * ADDS);
    cr_expect_eq(sample(body_of(got), "h_bucket{le=\"+Inf\"}"), (double)THREADS * ADDS);
    free(got);
    cr_expect_eq(pst_prom_server_scrapes(s), SCRAPES + 1);
    pst_prom_server_stop(s);
    pst_prom_free(r);
}

/* ---- Prometheus's parser --------------------------------------------------------------- */

/* Families and samples as prometheus_client reads them, one per line: the documentation
 * as a JSON string (escapes undone), labels sorted, values as Python floats. */
static const char parse_py[] =
    "import json, sys\n"
    "from prometheus_client.parser import text_string_to_metric_families\n"
    "for f in text_string_to_metric_families(sys.stdin.read()):\n"
    "    print(f.name, f.type, json.dumps(f.documentation))\n"
    "    for s in f.samples:\n"
    "        labels = ','.join('%s=%s' % kv for kv in sorted(s.labels.items()))\n"
    "        print(' ', s.name, '{' + labels + '}', repr(s.value))\n";

Test(prom, prometheus_client_parses_the_scrape, .timeout = 60)
{
    cr_assert_eq(system("/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null"), 0,
                 "Prometheus's parser is missing: install python3-prometheus-client "
                 "(scripts/deps.sh)");
    pst_prom *r = small_registry();
    pst_prom_set(pst_prom_gauge(r, "pstrain_special", "Special values", "v=\"inf\""), INFINITY);
    pst_prom_set(pst_prom_gauge(r, "pstrain_special", "Special values", "v=\"nan\""), NAN);
    pst_prom_set(pst_prom_gauge(r, "pstrain_special", "Special values", "v=\"tiny\""), 1e-5);
    pst_prom_server *s;
    CHECK_OK(pst_prom_serve(r, "127.0.0.1", 0, &s));
    char *got = get(pst_prom_server_port(s), "/metrics");
    cr_assert_eq(status_of(got), 200, "%s", got);

    char dir[] = "/tmp/pst_test_prom_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char script[64], scrape[64], cmd[256];
    snprintf(script, sizeof script, "%s/parse.py", dir);
    snprintf(scrape, sizeof scrape, "%s/scrape.txt", dir);
    FILE *f = fopen(script, "w");
    cr_assert_not_null(f);
    fputs(parse_py, f);
    fclose(f);
    f = fopen(scrape, "w");
    cr_assert_not_null(f);
    fputs(body_of(got), f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s < %s 2>&1", script, scrape);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    static char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    const int rc = pclose(p);
    unlink(script);
    unlink(scrape);
    rmdir(dir);
    cr_assert_eq(rc, 0, "the parser failed on:\n%s\n%s", body_of(got), out);
    cr_expect_str_eq(out,
                     "pstrain_x counter \"Calls, by\\noutcome \\\\\"\n"
                     "  pstrain_x_total {status=ok} 3.0\n"
                     "  pstrain_x_total {status=error} 1.0\n"
                     "  pstrain_x_total {} 0.5\n"
                     "pstrain_g gauge \"A gauge\"\n"
                     "  pstrain_g {} 2.5\n"
                     "pstrain_h_seconds histogram \"Times\"\n"
                     "  pstrain_h_seconds_bucket {le=0.1} 1.0\n"
                     "  pstrain_h_seconds_bucket {le=1} 3.0\n"
                     "  pstrain_h_seconds_bucket {le=10} 3.0\n"
                     "  pstrain_h_seconds_bucket {le=+Inf} 4.0\n"
                     "  pstrain_h_seconds_sum {} 101.55\n"
                     "  pstrain_h_seconds_count {} 4.0\n"
                     "  pstrain_h_seconds_bucket {le=0.1,part=io} 0.0\n"
                     "  pstrain_h_seconds_bucket {le=1,part=io} 1.0\n"
                     "  pstrain_h_seconds_bucket {le=10,part=io} 1.0\n"
                     "  pstrain_h_seconds_bucket {le=+Inf,part=io} 1.0\n"
                     "  pstrain_h_seconds_sum {part=io} 0.25\n"
                     "  pstrain_h_seconds_count {part=io} 1.0\n"
                     "pstrain_special gauge \"Special values\"\n"
                     "  pstrain_special {v=inf} inf\n"
                     "  pstrain_special {v=nan} nan\n"
                     "  pstrain_special {v=tiny} 1e-05\n");
    free(got);
    pst_prom_server_stop(s);
    pst_prom_free(r);
}

/* 100 connections from 127.0.0.1 that send nothing (more than the server keeps in all)
 * leave room for a scrape from 127.0.0.2: one address holds at most
 * PST_PROM_MAX_CONNECTIONS_PER_IP of them. The scrape is answered while some of them are
 * still held (not after the idle timeout has closed them all, as when one address could
 * take every connection). */
Test(prom, idle_connections_from_one_address_leave_room_for_a_scrape, .timeout = 60)
{
    pst_prom *r = small_registry();
    pst_prom_server *s;
    CHECK_OK(pst_prom_serve(r, "0.0.0.0", 0, &s));
    const int port = pst_prom_server_port(s);
    int idle[100];
    for (int i = 0; i < 100; i++)
        idle[i] = connect_from(port, "127.0.0.1");
    char *got = get_from(port, "/metrics", "127.0.0.2");
    cr_expect_eq(status_of(got), 200, "%s", got);
    cr_expect_str_eq(body_of(got), small_text);
    free(got);
    int held = 0;
    for (int i = 0; i < 100; i++) {
        char c;
        held += recv(idle[i], &c, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN;
    }
    cr_expect(held >= 1 && held <= PST_PROM_MAX_CONNECTIONS_PER_IP,
              "%d idle connections still held when the scrape was answered", held);
    for (int i = 0; i < 100; i++)
        close(idle[i]);
    pst_prom_server_stop(s);
    pst_prom_free(r);
}
