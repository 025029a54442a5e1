/* test_ctr_synth.c — common/data/ctr_synth.c and the ctr-synth program: a file it writes
 * opens with the reader (common/data/ctr.h) and every row reads back; the same seed gives
 * the same bytes whatever the threads, another seed other bytes; the header's Bayes AUC and
 * log loss are those of the stored p_true on the test rows, the labels are drawn from
 * p_true (click rate, calibration); the ids follow the truncated Zipf law over a
 * permutation of the vocabulary (rank frequencies against 1 / (r^s H(V, s))), also for a
 * 10^8 vocabulary; bad settings are refused with exact codes and one line, and the
 * program prints the peer's JSON line or one error line with a non-zero exit. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/data/ctr.h"
#include "common/data/ctr_synth.h"
#include "tests/check.h"

#define SYNTH PST_BIN_DIR "/ctr-synth"

static char path[64], path2[64];

static void setup(void)
{
    snprintf(path, sizeof path, "/tmp/pst_ctr_synth_%d.bin", (int)getpid());
    snprintf(path2, sizeof path2, "/tmp/pst_ctr_synth_%d_b.bin", (int)getpid());
}

static void teardown(void)
{
    unlink(path);
    unlink(path2);
}

TestSuite(ctr_synth, .init = setup, .fini = teardown, .timeout = 60);

/* 20,000 rows of 4 fields (vocabularies 10, 46, 215, 1000), 3 dense, rank 2, 3 pairs. */
static pst_ctr_synth_config small(void)
{
    pst_ctr_synth_config c;
    pst_ctr_synth_defaults(&c);
    c.rows = 20000;
    c.fields = 4;
    c.dense = 3;
    c.rank = 2;
    c.pairs = 3;
    c.max_vocab = 1000;
    c.seed = 7;
    c.threads = 2;
    return c;
}

/* Every row of the file at p (the reader checks ids and labels as it reads). */
typedef struct rows {
    pst_ctr c;
    float *dense, *label, *p;
    uint32_t *ids;
} rows;

static void read_all(rows *r, const char *p)
{
    CHECK_OK(pst_ctr_open(&r->c, p));
    const size_t n = (size_t)r->c.rows;
    r->dense = malloc(sizeof(float) * n * (size_t)(r->c.dense ? r->c.dense : 1));
    r->label = malloc(sizeof(float) * n);
    r->p = malloc(sizeof(float) * n);
    r->ids = malloc(sizeof(uint32_t) * n * (size_t)r->c.fields);
    enum { BLOCK = 1000 };
    void *buf = malloc(BLOCK * r->c.record);
    cr_assert(r->dense && r->label && r->p && r->ids && buf);
    for (size_t first = 0; first < n; first += BLOCK) {
        const size_t cnt = n - first < BLOCK ? n - first : BLOCK;
        const pst_ctr_rows out = {r->dense + first * (size_t)r->c.dense,
                                  r->ids + first * (size_t)r->c.fields, r->label + first,
                                  r->p + first};
        CHECK_OK(pst_ctr_read(&r->c, first, cnt, buf, &out));
    }
    free(buf);
}

static void rows_free(rows *r)
{
    pst_ctr_close(&r->c);
    free(r->dense);
    free(r->label);
    free(r->p);
    free(r->ids);
}

/* Distinct ids of field f in rows [0, n). */
static uint64_t distinct(const rows *r, int f, uint64_t n)
{
    const uint32_t V = r->c.vocab[f];
    unsigned char *seen = calloc(V, 1);
    cr_assert_not_null(seen);
    uint64_t d = 0;
    for (uint64_t i = 0; i < n; i++) {
        const uint32_t id = r->ids[i * (uint64_t)r->c.fields + (uint64_t)f];
        d += !seen[id];
        seen[id] = 1;
    }
    free(seen);
    return d;
}

static int descending(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x < y) - (x > y);
}

/* Field f's id counts, most frequent first, into counts (V). */
static void rank_counts(const rows *r, int f, uint32_t *counts)
{
    const uint32_t V = r->c.vocab[f];
    memset(counts, 0, sizeof *counts * V);
    for (uint64_t i = 0; i < r->c.rows; i++)
        counts[r->ids[i * (uint64_t)r->c.fields + (uint64_t)f]]++;
    qsort(counts, V, sizeof *counts, descending);
}

/* H(V, s) = sum_{r <= V} r^-s */
static double harmonic(uint32_t V, double s)
{
    double h = 0.0;
    for (uint32_t r = V; r >= 1; r--)
        h += pow((double)r, -s);
    return h;
}

Test(ctr_synth, a_small_file_reads_back_row_by_row)
{
    const pst_ctr_synth_config cfg = small();
    pst_ctr_synth_stats st;
    CHECK_OK(pst_ctr_synth_write(path, &cfg, &st));
    rows r;
    read_all(&r, path);
    cr_assert(r.c.fields == 4 && r.c.dense == 3 && r.c.rows == 20000 && r.c.test_rows == 2000 &&
              r.c.train_rows == 18000 && r.c.seed == 7);
    cr_assert(r.c.vocab[0] == 10 && r.c.vocab[1] == 46 && r.c.vocab[2] == 215 &&
              r.c.vocab[3] == 1000, "geomspace(10, 1000, 4) truncated: %u %u %u %u",
              r.c.vocab[0], r.c.vocab[1], r.c.vocab[2], r.c.vocab[3]);
    cr_assert(st.rows == 20000 && st.test_rows == 2000 && st.vocab_total == 10 + 46 + 215 + 1000);
    double clicks = 0.0, psum = 0.0, dsum = 0.0, dsq = 0.0;
    uint64_t seen = 0;
    for (size_t i = 0; i < r.c.rows; i++) {
        cr_assert(r.p[i] > 0.0f && r.p[i] < 1.0f, "row %zu p_true %g", i, r.p[i]);
        clicks += r.label[i];
        psum += r.p[i];
        for (int j = 0; j < 3; j++) {
            dsum += r.dense[i * 3 + (size_t)j];
            dsq += (double)r.dense[i * 3 + (size_t)j] * r.dense[i * 3 + (size_t)j];
        }
    }
    for (int f = 0; f < 4; f++)
        seen += distinct(&r, f, r.c.train_rows);
    const double n = (double)r.c.rows;
    cr_assert_leq(fabs(clicks / n - 0.25), 0.02, "click rate %.4f, want 0.25", clicks / n);
    cr_assert_eq(st.ctr, clicks / n);
    /* the labels are Bernoulli(p_true): the clicks within 4 sigma of the sum of p */
    cr_assert_leq(fabs(clicks - psum), 4.0 * sqrt(psum * 0.75), "%g clicks, sum of p %g",
                  clicks, psum);
    cr_assert_leq(fabs(dsum / (3 * n)), 0.03, "dense mean %g", dsum / (3 * n));
    cr_assert_leq(fabs(dsq / (3 * n) - 1.0), 0.03, "dense variance %g", dsq / (3 * n));
    cr_assert_eq(st.distinct_ids_train, seen, "%llu distinct training ids, the file has %llu",
                 (unsigned long long)st.distinct_ids_train, (unsigned long long)seen);
    rows_free(&r);
}

Test(ctr_synth, same_seed_same_bytes_whatever_the_threads_other_seed_other_bytes)
{
    pst_ctr_synth_config cfg = small();
    cfg.rows = 5000;
    cfg.threads = 1;
    CHECK_OK(pst_ctr_synth_write(path, &cfg, NULL));
    cfg.threads = 3;
    CHECK_OK(pst_ctr_synth_write(path2, &cfg, NULL));
    FILE *a = fopen(path, "rb"), *b = fopen(path2, "rb");
    cr_assert(a && b);
    static unsigned char x[1 << 20], y[1 << 20];
    const size_t na = fread(x, 1, sizeof x, a), nb = fread(y, 1, sizeof y, b);
    fclose(a);
    fclose(b);
    cr_assert(na == nb && na == 64 + 4 * 4 + 5000 * (8 + 4 * 3 + 4 * 4));
    cr_assert(memcmp(x, y, na) == 0, "1 and 3 threads wrote other bytes");
    cfg.seed = 8;
    CHECK_OK(pst_ctr_synth_write(path2, &cfg, NULL));
    b = fopen(path2, "rb");
    cr_assert_not_null(b);
    cr_assert_eq(fread(y, 1, sizeof y, b), na);
    fclose(b);
    size_t differ = 0;
    for (size_t i = 64 + 16; i < na; i++)
        differ += x[i] != y[i];
    cr_assert_gt(differ, na / 4, "seeds 7 and 8 share too many bytes (%zu of %zu differ)",
                 differ, na);
}

Test(ctr_synth, the_header_holds_the_bayes_auc_and_log_loss_of_the_stored_p_true)
{
    pst_ctr_synth_config cfg = small();
    cfg.fields = 10; /* enough signal for an AUC well above chance */
    cfg.pairs = 12;
    cfg.rank = 4;
    pst_ctr_synth_stats st;
    CHECK_OK(pst_ctr_synth_write(path, &cfg, &st));
    rows r;
    read_all(&r, path);
    const size_t t0 = (size_t)r.c.train_rows, nt = (size_t)r.c.test_rows;
    uint64_t *scratch = malloc(sizeof *scratch * nt);
    cr_assert_not_null(scratch);
    const double auc = pst_auc(r.p + t0, r.label + t0, nt, scratch);
    const double ll = pst_logloss(r.p + t0, r.label + t0, nt);
    cr_assert_eq(st.bayes_auc, auc);
    cr_assert_eq(st.bayes_logloss, ll);
    cr_assert_eq(r.c.bayes_auc, (float)auc, "header %.7f, the stored p_true give %.7f",
                 r.c.bayes_auc, auc);
    cr_assert_eq(r.c.bayes_logloss, (float)ll);
    cr_assert_gt(auc, 0.7, "the planted truth separates clicks: AUC %.4f", auc);
    /* no constant predictor reaches the truth's log loss */
    double q = 0.0;
    for (size_t i = 0; i < nt; i++)
        q += r.label[t0 + i];
    q /= (double)nt;
    cr_assert_lt(ll, -(q * log(q) + (1 - q) * log(1 - q)) - 0.03, "log loss %.4f", ll);
    free(scratch);
    rows_free(&r);
}

/* Field 2's 1,000 ids (and field 0's 10) with 60,000 rows: the i-th most frequent id has
 * frequency 1 / (i^1.1 H(V, 1.1)); every id of the small field occurs. */
Test(ctr_synth, ids_follow_the_truncated_zipf_law)
{
    pst_ctr_synth_config cfg = small();
    cfg.rows = 60000;
    cfg.fields = 3;
    cfg.dense = 1;
    cfg.pairs = 1;
    CHECK_OK(pst_ctr_synth_write(path, &cfg, NULL));
    rows r;
    read_all(&r, path);
    cr_assert(r.c.vocab[0] == 10 && r.c.vocab[2] == 1000);
    uint32_t counts[1000];
    const double n = (double)r.c.rows;
    rank_counts(&r, 2, counts);
    const double h1000 = harmonic(1000, 1.1);
    for (int i = 1; i <= 3; i++) {
        const double want = 1.0 / (pow(i, 1.1) * h1000), got = counts[i - 1] / n;
        cr_assert_leq(fabs(got / want - 1.0), 0.04, "vocabulary 1000, rank %d: frequency %.5f, "
                      "Zipf says %.5f", i, got, want);
    }
    rank_counts(&r, 0, counts);
    const double h10 = harmonic(10, 1.1);
    double chi2 = 0.0;
    for (int i = 1; i <= 10; i++) {
        const double want = n / (pow(i, 1.1) * h10);
        cr_assert_gt(counts[i - 1], 0, "id of rank %d never drawn", i);
        chi2 += (counts[i - 1] - want) * (counts[i - 1] - want) / want;
    }
    cr_assert_lt(chi2, 27.9, "vocabulary 10: chi-square %.1f over 9 degrees (p < 0.001)", chi2);
    rows_free(&r);
}

/* A 10^8 vocabulary without 10^8 of anything: the ids below it, spread over it, the
 * distinct count from the sorted list (the bitmap would be larger). */
Test(ctr_synth, a_vocabulary_of_10_to_the_8_costs_no_table)
{
    pst_ctr_synth_config cfg = small();
    cfg.rows = 5000;
    cfg.fields = 2;
    cfg.pairs = 1;
    cfg.max_vocab = 100000000;
    pst_ctr_synth_stats st;
    CHECK_OK(pst_ctr_synth_write(path, &cfg, &st));
    rows r;
    read_all(&r, path);
    cr_assert_eq(r.c.vocab[1], 100000000u);
    uint32_t top = 0;
    for (uint64_t i = 0; i < r.c.rows; i++)
        if (r.ids[2 * i + 1] > top)
            top = r.ids[2 * i + 1];
    cr_assert_gt(top, 50000000u, "the permutation spreads the ids over the vocabulary");
    cr_assert_eq(st.distinct_ids_train, distinct(&r, 0, r.c.train_rows) +
                                            distinct(&r, 1, r.c.train_rows));
    rows_free(&r);
}

Test(ctr_synth, bad_settings_are_refused_with_one_line)
{
    static const char *const bad[] = {
        "rows 0", "test-frac 0", "test-frac 1", "test-frac 1.5", "no test row",
        "min vocab > max vocab", "max vocab 2^32", "min vocab 0", "fields 0", "fields 1025",
        "dense -1", "rank -1", "pairs -1", "zipf -1", "zipf NaN", "ctr 0", "ctr 1",
        "threads -1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pst_ctr_synth_config c = small();
        switch (i) {
        case 0: c.rows = 0; break;
        case 1: c.test_frac = 0.0; break;
        case 2: c.test_frac = 1.0; break;
        case 3: c.test_frac = 1.5; break;
        case 4: c.rows = 5; c.test_frac = 0.05; break;
        case 5: c.min_vocab = 100; c.max_vocab = 10; break;
        case 6: c.max_vocab = (uint64_t)1 << 32; break;
        case 7: c.min_vocab = 0; break;
        case 8: c.fields = 0; break;
        case 9: c.fields = 1025; break;
        case 10: c.dense = -1; break;
        case 11: c.rank = -1; break;
        case 12: c.pairs = -1; break;
        case 13: c.zipf = -1.0; break;
        case 14: c.zipf = NAN; break;
        case 15: c.ctr = 0.0; break;
        case 16: c.ctr = 1.0; break;
        case 17: c.threads = -1; break;
        }
        CHECK_ERR(pst_ctr_synth_write(path, &c, NULL), PST_ERR_INVALID);
        cr_assert(pst_error_detail()[0] == '-' && !strchr(pst_error_detail(), '\n'),
                  "%s: \"%s\" should name the flag, in one line", bad[i], pst_error_detail());
        cr_assert(access(path, F_OK) != 0, "%s: nothing written", bad[i]);
    }
    const pst_ctr_synth_config c = small();
    CHECK_ERR(pst_ctr_synth_write("/nonexistent-dir/x.bin", &c, NULL), PST_ERR_IO);
    cr_assert(strstr(pst_error_detail(), "/nonexistent-dir/x.bin"), "%s", pst_error_detail());
}

/* Runs the program with args (stdout and stderr together into out); its exit status. */
static int run(const char *args, char *out, size_t cap)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", SYNTH, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    const size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

Test(ctr_synth, the_program_prints_the_json_line_or_one_error_line)
{
    char out[4096], args[256];
    snprintf(args, sizeof args, "--rows 3000 --fields 3 --max-vocab 1000 --seed 5 --out=%s",
             path);
    cr_assert_eq(run(args, out, sizeof out), 0, "%s", out);
    cr_assert_eq(lines(out), 1, "%s", out);
    cr_assert(strstr(out, "{\"rows\": 3000, \"test_rows\": 300, \"fields\": 3, \"dense\": 13, "
                          "\"vocab_total\": 1110, \"distinct_ids_train\": ") == out, "%s", out);
    cr_assert(strstr(out, "\"bayes_auc_test\": 0.") && strstr(out, "\"out\": \"/tmp/"), "%s",
              out);
    pst_ctr c;
    CHECK_OK(pst_ctr_open(&c, path));
    pst_ctr_close(&c);
    static const char *const bad[] = {
        "--rows 0", "--test-frac 1.5", "--min-vocab 100 --max-vocab 10", "--rows ten",
        "--no-such-flag 1", "--rows 100 --out /nonexistent-dir/x.bin", "--rows 100 --out",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "%s --out %s", bad[i], path2);
        if (strstr(bad[i], "--out")) /* its own --out, or none */
            snprintf(args, sizeof args, "%s", bad[i]);
        const int rc = run(args, out, sizeof out);
        cr_assert_neq(rc, 0, "ctr-synth %s: exit 0", args);
        cr_assert(lines(out) == 1 && strncmp(out, "ctr-synth: ", 11) == 0,
                  "ctr-synth %s: want one line, got \"%s\"", args, out);
        cr_assert(access(path2, F_OK) != 0, "ctr-synth %s: nothing written", args);
    }
    cr_assert_neq(run("--rows 100", out, sizeof out), 0, "--out is required: %s", out);
    cr_assert(strstr(out, "--out FILE is required"), "%s", out);
}
