/* test_ctr.c — common/data/ctr.c: a click-through file in ctr_synth.py's format, written
 * here byte by byte, read back as a stream (header, vocabularies, any block of rows);
 * bad files refused with PST_ERR_FORMAT naming the file, row and field; the AUC (ties
 * averaged) against counting pairs, and the log loss against its definition. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/data/ctr.h"
#include "common/rng.h"

enum { F = 3, D = 2, ROWS = 1000, TEST = 100 };
static const uint32_t vocab[F] = {10, 1000, 7};

static void put32(FILE *f, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    fwrite(b, 1, 4, f);
}

static void putf(FILE *f, float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    put32(f, u);
}

static void put64(FILE *f, uint64_t v)
{
    put32(f, (uint32_t)v);
    put32(f, (uint32_t)(v >> 32));
}

/* Row i: label i % 3 == 0, p_true i / 1000, dense (i, -i) / 8, ids (i % 10, i, i % 7);
 * `bad_id_row` (when < ROWS) gets id 7 in field 2 (its vocabulary is 7). */
static void write_file(const char *path, const char *magic, uint64_t rows_said, int bad_id_row,
                       int truncate)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fwrite(magic, 1, 8, f);
    put32(f, 1);
    put32(f, F);
    put32(f, D);
    put32(f, 4);
    put64(f, rows_said);
    put64(f, TEST);
    put64(f, 1);
    putf(f, 0.8f);
    putf(f, 0.45f);
    put32(f, 0);
    put32(f, 0);
    for (int k = 0; k < F; k++)
        put32(f, vocab[k]);
    for (int i = 0; i < ROWS - truncate; i++) {
        const unsigned char lab[4] = {i % 3 == 0, 0, 0, 0};
        fwrite(lab, 1, 4, f);
        putf(f, (float)i / 1000.0f);
        putf(f, (float)i / 8.0f);
        putf(f, (float)-i / 8.0f);
        put32(f, (uint32_t)(i % 10));
        put32(f, (uint32_t)i);
        put32(f, i == bad_id_row ? 7u : (uint32_t)(i % 7));
    }
    fclose(f);
}

static char path[64];

static void setup(void)
{
    snprintf(path, sizeof path, "/tmp/pst_ctr_%d.bin", (int)getpid());
}

static void teardown(void)
{
    unlink(path);
}

TestSuite(ctr, .init = setup, .fini = teardown);

Test(ctr, a_file_reads_back_row_by_row)
{
    write_file(path, "PSTCTR01", ROWS, -1, 0);
    pst_ctr c;
    cr_assert_eq(pst_ctr_open(&c, path), PST_OK, "%s", pst_error_detail());
    cr_assert(c.fields == F && c.dense == D && c.rows == ROWS && c.test_rows == TEST &&
              c.train_rows == ROWS - TEST && c.record == 8 + 4 * D + 4 * F);
    cr_assert(c.vocab[1] == 1000 && c.bayes_auc == 0.8f && c.bayes_logloss == 0.45f);
    enum { N = 37 };
    static unsigned char buf[N * (8 + 4 * D + 4 * F)];
    float dense[N * D], label[N], p[N];
    uint32_t ids[N * F];
    const pst_ctr_rows out = {dense, ids, label, p};
    cr_assert_eq(pst_ctr_read(&c, 950, N, buf, &out), PST_OK, "%s",
                 pst_error_detail());
    for (int k = 0; k < N; k++) {
        const int i = 950 + k;
        cr_assert_eq(label[k], (float)(i % 3 == 0));
        cr_assert_eq(p[k], (float)i / 1000.0f);
        cr_assert(dense[k * D] == (float)i / 8.0f && dense[k * D + 1] == (float)-i / 8.0f);
        cr_assert(ids[k * F] == (uint32_t)(i % 10) && ids[k * F + 1] == (uint32_t)i &&
                  ids[k * F + 2] == (uint32_t)(i % 7), "row %d", i);
    }
    cr_assert_eq(pst_ctr_read(&c, 990, N, buf, &out), PST_ERR_INVALID); /* past the end */
    pst_ctr_close(&c);
    pst_ctr_close(&c); /* twice is fine */
}

Test(ctr, bad_files_are_refused_naming_what_is_wrong)
{
    pst_ctr c;
    cr_assert_eq(pst_ctr_open(&c, "/tmp/no_such_ctr_file.bin"), PST_ERR_NOT_FOUND);
    cr_assert_eq(pst_ctr_open(&c, "/tmp"), PST_ERR_IO);
    write_file(path, "PSTCTR02", ROWS, -1, 0);
    cr_assert_eq(pst_ctr_open(&c, path), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "not a ctr file"), "%s", pst_error_detail());
    write_file(path, "PSTCTR01", ROWS, -1, 3); /* 3 rows short */
    cr_assert_eq(pst_ctr_open(&c, path), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "1000 rows"), "%s", pst_error_detail());
    write_file(path, "PSTCTR01", ROWS + 1, -1, 0); /* the header says one more */
    cr_assert_eq(pst_ctr_open(&c, path), PST_ERR_FORMAT);
    write_file(path, "PSTCTR01", ROWS, 500, 0); /* an id past its vocabulary */
    cr_assert_eq(pst_ctr_open(&c, path), PST_OK);
    static unsigned char buf[ROWS * (8 + 4 * D + 4 * F)];
    static float dense[ROWS * D], label[ROWS];
    static uint32_t ids[ROWS * F];
    const pst_ctr_rows out = {dense, ids, label, NULL};
    cr_assert_eq(pst_ctr_read(&c, 0, 400, buf, &out), PST_OK);
    cr_assert_eq(pst_ctr_read(&c, 400, 200, buf, &out), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "row 500 field 2 has id 7"), "%s", pst_error_detail());
    cr_assert(!strchr(pst_error_detail(), '\n'));
    pst_ctr_close(&c);
}

/* The AUC by ranks (ties averaged) equals counting the pairs (a positive above a negative
 * counts 1, a tie 1/2); perfect, reversed and constant scores give 1, 0 and 0.5. */
Test(ctr, auc_and_log_loss_by_their_definitions)
{
    enum { N = 600 };
    static float p[N], y[N];
    static uint64_t scratch[N];
    pst_rng r;
    pst_rng_seed(&r, 9, 0);
    for (int i = 0; i < N; i++) {
        y[i] = (float)(pst_rng_uniform(&r) < 0.3f);
        p[i] = (float)(int)(pst_rng_uniform(&r) * 50.0f) / 50.0f; /* many ties */
    }
    double pairs = 0.0, npos = 0.0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            if (y[i] > 0.5f && y[j] < 0.5f)
                pairs += p[i] > p[j] ? 1.0 : p[i] == p[j] ? 0.5 : 0.0;
    for (int i = 0; i < N; i++)
        npos += y[i];
    const double want = pairs / (npos * (N - npos)), got = pst_auc(p, y, N, scratch);
    cr_assert_leq(fabs(got - want), 1e-12, "auc %.15f, pairs say %.15f", got, want);
    for (int i = 0; i < N; i++)
        p[i] = y[i];
    cr_assert_eq(pst_auc(p, y, N, scratch), 1.0);
    for (int i = 0; i < N; i++)
        p[i] = 1.0f - y[i];
    cr_assert_eq(pst_auc(p, y, N, scratch), 0.0);
    for (int i = 0; i < N; i++)
        p[i] = 0.25f;
    cr_assert_eq(pst_auc(p, y, N, scratch), 0.5);
    cr_assert(isnan(pst_auc(p, p, N, scratch)), "one class only");
    double ll = 0.0;
    for (int i = 0; i < N; i++)
        ll -= y[i] > 0.5f ? log(0.25) : log(0.75);
    cr_assert_leq(fabs(pst_logloss(p, y, N) - ll / N), 1e-12);
    p[0] = 0.0f;
    y[0] = 1.0f;
    cr_assert(isfinite(pst_logloss(p, y, N)), "p 0 for a click is clamped, not infinite");
}
