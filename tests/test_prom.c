/* test_prom.c — the Prometheus registry and its /metrics server (common/prom.h): the exact
 * text format, lock-free updates from several threads, and a real HTTP exchange on
 * 127.0.0.1 (GET /metrics, 404, 405, a port in use). */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/prom.h"

Test(prom, text_format_is_exact)
{
    pst_prom *r;
    cr_assert_eq(pst_prom_init(&r), PST_OK);
    pst_prom_metric *ok = pst_prom_counter(r, "pstrain_x_total", "Calls, by\noutcome \\",
                                           "status=\"ok\"");
    pst_prom_metric *g = pst_prom_gauge(r, "pstrain_g", "A gauge", NULL);
    pst_prom_metric *bad = pst_prom_counter(r, "pstrain_x_total", "Calls, by\noutcome \\",
                                            "status=\"error\"");
    const double b[] = {0.1, 1, 10};
    pst_prom_metric *h = pst_prom_histogram(r, "pstrain_h_seconds", "Times", NULL, b, 3);
    pst_prom_add(ok, 3);
    pst_prom_add(bad, 1);
    pst_prom_set(g, 2.5);
    pst_prom_observe(h, 0.05);
    pst_prom_observe(h, 0.5);
    pst_prom_observe(h, 0.5);
    pst_prom_observe(h, 100);
    pst_prom_add(NULL, 1); /* ignored */
    char *text = pst_prom_render(r);
    const char *want = "# HELP pstrain_x_total Calls, by\\noutcome \\\\\n"
                       "# TYPE pstrain_x_total counter\n"
                       "pstrain_x_total{status=\"ok\"} 3\n"
                       "pstrain_x_total{status=\"error\"} 1\n"
                       "# HELP pstrain_g A gauge\n"
                       "# TYPE pstrain_g gauge\n"
                       "pstrain_g 2.5\n"
                       "# HELP pstrain_h_seconds Times\n"
                       "# TYPE pstrain_h_seconds histogram\n"
                       "pstrain_h_seconds_bucket{le=\"0.10000000000000001\"} 1\n"
                       "pstrain_h_seconds_bucket{le=\"1\"} 3\n"
                       "pstrain_h_seconds_bucket{le=\"10\"} 3\n"
                       "pstrain_h_seconds_bucket{le=\"+Inf\"} 4\n"
                       "pstrain_h_seconds_sum 101.05\n"
                       "pstrain_h_seconds_count 4\n";
    cr_assert_str_eq(text, want);
    free(text);
    pst_prom_free(r);
}

typedef struct adder {
    pst_prom_metric *c, *h;
} adder;

static void *add_many(void *arg)
{
    adder *a = arg;
    for (int i = 0; i < 100000; i++) {
        pst_prom_add(a->c, 1);
        pst_prom_observe(a->h, 0.5);
    }
    return NULL;
}

Test(prom, concurrent_updates_are_exact)
{
    pst_prom *r;
    cr_assert_eq(pst_prom_init(&r), PST_OK);
    const double b[] = {1};
    adder a = {pst_prom_counter(r, "c_total", "c", NULL),
               pst_prom_histogram(r, "h", "h", NULL, b, 1)};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, add_many, &a);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(pst_prom_value(a.c), 400000.0);
    cr_assert_eq(pst_prom_value(a.h), 200000.0);
    char *text = pst_prom_render(r);
    cr_assert(strstr(text, "h_count 400000\n") && strstr(text, "h_bucket{le=\"1\"} 400000\n"),
              "%s", text);
    free(text);
    pst_prom_free(r);
}

/* A request to 127.0.0.1:port; the whole answer (status line, headers, body). */
static char *http(int port, const char *request)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    cr_assert_eq(write(fd, request, strlen(request)), (ssize_t)strlen(request));
    size_t len = 0, cap = 65536;
    char *all = malloc(cap);
    ssize_t k;
    while ((k = read(fd, all + len, cap - 1 - len)) > 0)
        len += (size_t)k;
    close(fd);
    all[len] = '\0';
    return all;
}

static int scrapes_seen;
static void count_scrape(void *arg)
{
    (void)arg;
    scrapes_seen++;
}

Test(prom, served_over_http)
{
    pst_prom *r;
    cr_assert_eq(pst_prom_init(&r), PST_OK);
    pst_prom_add(pst_prom_counter(r, "pstrain_served_total", "Served", NULL), 7);
    pst_prom_on_scrape(r, count_scrape, NULL);
    pst_prom_server *s;
    cr_assert_eq(pst_prom_serve(r, "127.0.0.1", 0, &s), PST_OK, "%s", pst_error_detail());
    const int port = pst_prom_server_port(s);
    cr_assert_gt(port, 0);
    char *got = http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    cr_assert(!strncmp(got, "HTTP/1.1 200", 12), "%s", got);
    cr_assert(strstr(got, "text/plain; version=0.0.4"), "%s", got);
    const char *body = strstr(got, "\r\n\r\n");
    cr_assert_not_null(body);
    cr_assert_str_eq(body + 4, "# HELP pstrain_served_total Served\n"
                               "# TYPE pstrain_served_total counter\n"
                               "pstrain_served_total 7\n");
    free(got);
    cr_assert_eq(scrapes_seen, 1);
    cr_assert_eq(pst_prom_server_scrapes(s), 1);
    got = http(port, "GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    cr_assert(!strncmp(got, "HTTP/1.1 404", 12), "%s", got);
    free(got);
    got = http(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                     "Connection: close\r\n\r\n");
    cr_assert(!strncmp(got, "HTTP/1.1 405", 12), "%s", got);
    free(got);

    pst_prom_server *again;
    cr_assert_eq(pst_prom_serve(r, "127.0.0.1", port, &again), PST_ERR_IO);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    cr_assert(strstr(pst_error_detail(), want) && strstr(pst_error_detail(), "in use"), "%s",
              pst_error_detail());
    cr_assert_eq(pst_prom_serve(r, "not-an-address", 0, &again), PST_ERR_INVALID);
    pst_prom_server_stop(s);
    pst_prom_free(r);
}
