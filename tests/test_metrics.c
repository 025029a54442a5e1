/* test_metrics.c — the JSON-lines metrics writer (common/metrics.c).
 *
 * Records go to a file in a fresh temporary directory and are read back byte for byte
 * after close; an empty path gives a writer that ignores records; an unopenable path is
 * PST_ERR_IO with a detail naming it. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/metrics.h"


static char dir[64];
static char path[128];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/pst_test_metrics_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
}

TestSuite(metrics, .init = setup, .fini = teardown);

/* The whole file, NUL-terminated; NULL when it does not exist. */
static char *slurp(const char *p)
{
    FILE *f = fopen(p, "rb");
    if (!f)
        return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

Test(metrics, records_read_back_exactly)
{
    pst_metrics m;
    cr_assert_eq(pst_metrics_open(&m, path), PST_OK, "%s", pst_error_detail());
    pst_metrics_write(&m, "step", "\"step\":%ld,\"loss\":%.6f", 1L, 0.5);
    pst_metrics_write(&m, "step", "\"step\":%ld,\"loss\":%.6f", 2L, 0.25);
    pst_metrics_write(&m, "epoch_end", NULL);
    pst_metrics_write(&m, "eval", "\"acc\":%.4f,\"split\":\"%s\"", 0.875, "test");
    pst_metrics_close(&m);
    cr_expect_null(m.f, "close leaves the writer closed");
    const char *got = slurp(path);
    cr_assert_not_null(got);
    cr_expect_str_eq(got,
                     "{\"event\":\"step\",\"step\":1,\"loss\":0.500000}\n"
                     "{\"event\":\"step\",\"step\":2,\"loss\":0.250000}\n"
                     "{\"event\":\"epoch_end\"}\n"
                     "{\"event\":\"eval\",\"acc\":0.8750,\"split\":\"test\"}\n");
}

Test(metrics, open_appends_to_an_existing_file)
{
    pst_metrics m;
    cr_assert_eq(pst_metrics_open(&m, path), PST_OK);
    pst_metrics_write(&m, "start", "\"run\":%d", 1);
    pst_metrics_close(&m);
    cr_assert_eq(pst_metrics_open(&m, path), PST_OK);
    pst_metrics_write(&m, "start", "\"run\":%d", 2);
    pst_metrics_close(&m);
    cr_expect_str_eq(slurp(path), "{\"event\":\"start\",\"run\":1}\n"
                                  "{\"event\":\"start\",\"run\":2}\n");
}

Test(metrics, writes_after_close_are_ignored)
{
    pst_metrics m;
    cr_assert_eq(pst_metrics_open(&m, path), PST_OK);
    pst_metrics_write(&m, "a", NULL);
    pst_metrics_close(&m);
    pst_metrics_write(&m, "b", "\"x\":%d", 1);
    pst_metrics_close(&m); /* twice is fine */
    cr_expect_str_eq(slurp(path), "{\"event\":\"a\"}\n");
}

Test(metrics, empty_path_ignores_records)
{
    pst_metrics m;
    memset(&m, 0xab, sizeof m);
    cr_expect_eq(pst_metrics_open(&m, ""), PST_OK);
    cr_expect_null(m.f);
    pst_metrics_write(&m, "step", "\"step\":%d", 1);
    pst_metrics_close(&m);
    cr_expect_eq(pst_metrics_open(&m, NULL), PST_OK);
    cr_expect_null(m.f);
    pst_metrics_write(&m, "step", NULL);
    pst_metrics_close(&m);
    /* A NULL or zeroed writer is accepted everywhere. */
    pst_metrics_write(NULL, "step", NULL);
    pst_metrics_close(NULL);
    pst_metrics z = {0};
    pst_metrics_write(&z, "step", NULL);
    pst_metrics_close(&z);
    /* Nothing was created in the directory. */
    struct stat st;
    cr_expect_neq(stat(path, &st), 0);
}

Test(metrics, unwritable_path_is_io_error_naming_it)
{
    static const char *const bad[] = {"/nonexistent-dir/x", "/nonexistent-dir/sub/m.jsonl"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pst_metrics m;
        pst_error_clear();
        cr_expect_eq(pst_metrics_open(&m, bad[i]), PST_ERR_IO, "%s opened", bad[i]);
        cr_expect(strstr(pst_error_detail(), bad[i]) != NULL, "detail '%s' does not name %s",
                  pst_error_detail(), bad[i]);
        cr_expect_null(m.f);
        pst_metrics_write(&m, "step", NULL); /* the failed writer ignores records */
        pst_metrics_close(&m);
    }
    /* A directory is not a file. */
    pst_metrics m;
    pst_error_clear();
    cr_expect_eq(pst_metrics_open(&m, dir), PST_ERR_IO);
    cr_expect(strstr(pst_error_detail(), dir) != NULL, "detail '%s'", pst_error_detail());
    cr_expect_null(m.f);
}
