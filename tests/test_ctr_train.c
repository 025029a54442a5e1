/* test_ctr_train.c — the click model trained by the real trainer program (trainer/ctr.c,
 * --model dlrm --dataset ctr) on a click file with a planted truth written here (the
 * format of ../shared/peers/ctr_synth.py, its labels drawn from known probabilities):
 * it learns (test AUC well above chance, near the file's Bayes AUC), it makes exactly one
 * sparse row per distinct (field, id) of the training rows, two runs give the same bits,
 * with pservers (2 x 2, sync) it gives the bits of one process on 2 devices, async and bf16
 * rows learn too, a killed job resumes from full and delta checkpoints with the same bits, and what it cannot do yet (pipelines, fp16, an optimizer its tables lack)
 * or a broken file is refused in one line, with a non-zero exit. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/data/ctr.h"
#include "common/rng.h"
#include "pserver/sparse_ckpt.h"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" /* child.h's pserver helpers */
#include "tests/child.h"
#pragma GCC diagnostic pop

#define TRAINER PST_BIN_DIR "/trainer"
#define PSLAUNCH PST_BIN_DIR "/pslaunch"
#define RUN_WAIT_MS 60000

enum { F = 3, D = 2, ROWS = 6000, TEST = 1000 };
static const uint32_t vocab[F] = {30, 4000, 5}; /* field 1: ids unseen in training too */

static char path[64];
static size_t distinct_train; /* (field, id) pairs of the training rows */
static size_t twice_train;    /* of them, those in at least two batches of 100 rows */
static float bayes_auc;

static void put(FILE *f, const void *p, size_t n)
{
    cr_assert_eq(fwrite(p, 1, n, f), n); /* little-endian host (x86-64, aarch64) */
}

/* logit = s[0][id_0] + 0.2 s[1][id_1] + s[2][id_2] + 0.5 x0 - 0.5 x1 - 1, s ~ N(0, 1): the
 * ids of the small fields carry most of it; field 1's 4,000 ids are seen about once each
 * (many only in the test part, which then gets the initializer's rows). */
static void write_click_file(void)
{
    snprintf(path, sizeof path, "/tmp/pst_ctr_train_%d.bin", (int)getpid());
    pst_rng r;
    pst_rng_seed(&r, 77, 0);
    static float s[F][4000];
    for (int f = 0; f < F; f++)
        for (uint32_t i = 0; i < vocab[f]; i++)
            s[f][i] = pst_rng_normal(&r);
    static unsigned char seen[F][4000];
    static int batches[F][4000], last_batch[F][4000];
    static float ptest[TEST], ytest[TEST];
    static unsigned char rec[ROWS][8 + 4 * D + 4 * F];
    distinct_train = 0;
    twice_train = 0;
    for (int n = 0; n < ROWS; n++) {
        float x[D] = {pst_rng_normal(&r), pst_rng_normal(&r)};
        uint32_t id[F];
        double logit = 0.5 * x[0] - 0.5 * x[1] - 1.0;
        for (int f = 0; f < F; f++) {
            id[f] = (uint32_t)pst_rng_below(&r, vocab[f]);
            logit += (f == 1 ? 0.2 : 1.0) * s[f][id[f]]; /* the sparse field weak */
            if (n < ROWS - TEST && !seen[f][id[f]]) {
                seen[f][id[f]] = 1;
                distinct_train++;
            }
            if (n < ROWS - TEST && (batches[f][id[f]] == 0 || last_batch[f][id[f]] != n / 100)) {
                last_batch[f][id[f]] = n / 100; /* a batch pushes a key once */
                if (++batches[f][id[f]] == 2)
                    twice_train++;
            }
        }
        const float p = (float)(1.0 / (1.0 + exp(-logit)));
        const unsigned char y = pst_rng_uniform(&r) < p;
        memset(rec[n], 0, sizeof rec[n]);
        rec[n][0] = y;
        memcpy(rec[n] + 4, &p, 4);
        memcpy(rec[n] + 8, x, sizeof x);
        memcpy(rec[n] + 8 + 4 * D, id, sizeof id);
        if (n >= ROWS - TEST) {
            ptest[n - (ROWS - TEST)] = p;
            ytest[n - (ROWS - TEST)] = y;
        }
    }
    static uint64_t scratch[TEST];
    bayes_auc = (float)pst_auc(ptest, ytest, TEST, scratch);
    const float ll = (float)pst_logloss(ptest, ytest, TEST);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    const uint32_t head32[4] = {1, F, D, 0};
    const uint64_t head64[3] = {ROWS, TEST, 77};
    const uint32_t reserved[2] = {0, 0};
    put(f, "PSTCTR01", 8);
    put(f, head32, sizeof head32);
    put(f, head64, sizeof head64);
    put(f, &bayes_auc, 4);
    put(f, &ll, 4);
    put(f, reserved, sizeof reserved);
    put(f, vocab, sizeof vocab);
    put(f, rec, sizeof rec);
    cr_assert_eq(fclose(f), 0);
}

static void suite_init(void)
{
    write_click_file();
}

static void suite_fini(void)
{
    unlink(path);
    for (int i = 0; i < nchildren; i++)
        proc_cleanup(&pool[i]);
    nchildren = 0;
}

TestSuite(ctr_train, .init = suite_init, .fini = suite_fini);

/* The job on `devices` (PSTRAIN_DEVICES): S == 0 the trainer alone, else `pslaunch
 * --pservers S --trainers T -- trainer ...`, with the suite's flags and `extra`; asserts
 * its exit status; stdout (trainer 0's summary last) returned, stderr in *err (or freed). */
static char *job(int S, int T, const char *const extra[], const char *devices, int want_rc,
                 char **err)
{
    char s_arg[8], t_arg[8];
    snprintf(s_arg, sizeof s_arg, "%d", S);
    snprintf(t_arg, sizeof t_arg, "%d", T);
    const char *launch[8] = {PSLAUNCH, "--pservers", s_arg, "--trainers", t_arg, "--timeout",
                             "100", "--"};
    const char *flags[] = {TRAINER, "--model", "dlrm", "--data", path, "--batch", "100",
                           "--epochs", "1", "--seed", "1", "--threads", "1", "--progress",
                           "none", "--log-level", "warn", "--metrics", "",
                           "--connect-timeout-ms", "5000"};
    const char *argv[64];
    int n = 0;
    for (int i = 0; S && i < 8; i++)
        argv[n++] = launch[i];
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        argv[n++] = flags[i];
    for (int i = 0; extra && extra[i]; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    char env_dev[32];
    snprintf(env_dev, sizeof env_dev, "PSTRAIN_DEVICES=%s", devices);
    const char *env[] = {env_dev, NULL};
    char *out = NULL, *e = NULL;
    const int rc = finish(proc_start(argv, env), argv[0], RUN_WAIT_MS, &out, &e);
    cr_assert_eq(rc, want_rc, "%s exited %d, want %d; stderr:\n%s", argv[0], rc, want_rc, e);
    if (err)
        *err = e;
    else
        free(e);
    return out;
}

static char *train(const char *const extra[], const char *devices, int want_rc, char **err)
{
    return job(0, 1, extra, devices, want_rc, err);
}

static char *cluster(int S, int T, const char *const extra[], const char *devices)
{
    return job(S, T, extra, devices, 0, NULL);
}

/* One epoch of 50 steps: the model learns the planted ids (test AUC within 0.05 of the
 * Bayes AUC, far above chance), one row per distinct (field, id) trained on, and the same
 * bits twice, and on cpu:2 the same rows. */
Test(ctr_train, learns_the_planted_truth_with_one_row_per_id, .timeout = 120)
{
    char *out = train(NULL, "cpu:1", 0, NULL);
    const double auc = summary_value(out, "test_auc"), gap = summary_value(out, "auc_gap");
    fprintf(stderr, "dlrm on %d rows: test AUC %.4f (Bayes %.4f), log loss %.4f, %g rows\n",
            ROWS - TEST, auc, (double)bayes_auc, summary_value(out, "test_logloss"),
            summary_value(out, "rows_touched"));
    cr_assert_gt(auc, 0.7, "test AUC %.4f", auc);
    cr_assert_lt(fabs(gap - ((double)bayes_auc - auc)), 1e-4, "auc_gap %g", gap);
    cr_assert_lt(gap, 0.05, "%.4f short of the Bayes AUC %.4f", gap, (double)bayes_auc);
    cr_assert_eq((size_t)summary_value(out, "rows_touched"), distinct_train);
    cr_assert_eq((size_t)summary_value(out, "table_rows"), distinct_train);
    cr_assert_gt(summary_value(out, "table_bytes"), 0);
    cr_assert_eq((long)summary_value(out, "steps"), (ROWS - TEST) / 100);
    char *again = train(NULL, "cpu:1", 0, NULL);
    cr_assert_str_eq(summary_hash(again).hex, summary_hash(out).hex, "a second run differs");
    cr_assert_eq(summary_value(again, "test_auc"), auc);
    char *two = train(NULL, "cpu:2", 0, NULL);
    cr_assert_eq((size_t)summary_value(two, "rows_touched"), distinct_train);
    cr_assert_gt(summary_value(two, "test_auc"), 0.7);
    free(out);
    free(again);
    free(two);
}

/* Admission after 2 pushes: exactly the (field, id) pairs of two or more batches become
 * rows, and every distinct pair's first push is refused; a row budget of 320 holds. */
Test(ctr_train, admission_and_a_row_budget, .timeout = 60)
{
    const char *admit[] = {"--sparse-admit-count", "2", NULL};
    char *out = train(admit, "cpu:1", 0, NULL);
    cr_assert_eq((size_t)summary_value(out, "rows_touched"), twice_train, "rows %g, want %zu",
                 summary_value(out, "rows_touched"), twice_train);
    cr_assert_eq((size_t)summary_value(out, "pushes_refused"), distinct_train);
    cr_assert_eq(summary_value(out, "rows_evicted"), 0);
    free(out);
    const char *budget[] = {"--sparse-max-rows", "320", NULL};
    out = train(budget, "cpu:1", 0, NULL);
    cr_assert_leq(summary_value(out, "table_rows"), 320);
    cr_assert_eq(summary_value(out, "rows_touched") - summary_value(out, "rows_evicted"),
                 summary_value(out, "table_rows"));
    cr_assert_gt(summary_value(out, "rows_evicted"), 0);
    cr_assert_gt(summary_value(out, "test_auc"), 0.6);
    free(out);
}

/* 2 pservers x 2 trainers of one device each, sync, give the bits of one process on 2
 * devices: the dense parameters, the sparse table (sparse_hash: values and Adagrad state of
 * every row, wherever it lives) and its counters, with admission after 2 pushes and
 * eviction after 8 steps unseen (so rows come, are refused, expire and come back). */
Test(ctr_train, two_pservers_two_trainers_give_the_bits_of_two_devices, .timeout = 180)
{
    const char *extra[] = {"--sparse-admit-count", "2", "--sparse-evict-after", "8", NULL};
    char *local = train(extra, "cpu:2", 0, NULL);
    char *dist = cluster(2, 2, extra, "cpu:1");
    fprintf(stderr, "click model, local cpu:2 and 2 x 2 sync: param_hash %s / %s, sparse_hash "
            "%s, rows %g / %g, evicted %g / %g, refused %g / %g, key balance %.4f\n",
            summary_hash(local).hex, summary_hash(dist).hex, summary_hex(dist, "sparse_hash").hex,
            summary_value(local, "rows_touched"), summary_value(dist, "rows_touched"),
            summary_value(local, "rows_evicted"), summary_value(dist, "rows_evicted"),
            summary_value(local, "pushes_refused"), summary_value(dist, "pushes_refused"),
            summary_value(dist, "key_balance"));
    cr_assert_str_eq(summary_hash(dist).hex, summary_hash(local).hex, "param_hash differs");
    cr_assert_str_eq(summary_hex(dist, "sparse_hash").hex, summary_hex(local, "sparse_hash").hex);
    const char *same[] = {"rows_touched", "rows_evicted", "pushes_refused", "table_rows",
                          "test_auc", "test_logloss"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        cr_assert_eq(summary_value(dist, same[i]), summary_value(local, same[i]), "%s: %g vs %g",
                     same[i], summary_value(dist, same[i]), summary_value(local, same[i]));
    cr_assert_gt(summary_value(dist, "rows_evicted"), 0);
    cr_assert_gt(summary_value(dist, "pushes_refused"), 0);
    /* the keys spread over the 2 pservers by their hash: neither holds 60% */
    cr_assert_lt(summary_value(dist, "key_balance"), 1.2);
    free(local);
    free(dist);
    /* one trainer with 2 pservers: the bits of one device alone */
    local = train(NULL, "cpu:1", 0, NULL);
    dist = cluster(2, 1, NULL, "cpu:1");
    cr_assert_str_eq(summary_hash(dist).hex, summary_hash(local).hex);
    free(local);
    free(dist);
}

/* Async (each push applied at once) and rows in bf16 on the wire (sync) still learn the
 * planted truth; a row budget holds on each pserver (their tables sum at most 2 x 160). */
Test(ctr_train, async_bf16_rows_and_a_budget_per_pserver, .timeout = 180)
{
    const char *async[] = {"--mode", "async", NULL};
    char *out = cluster(2, 2, async, "cpu:1");
    cr_assert_gt(summary_value(out, "test_auc"), 0.7, "async: test AUC %g",
                 summary_value(out, "test_auc"));
    free(out);
    const char *bf16[] = {"--precision", "bf16", NULL};
    out = cluster(2, 2, bf16, "cpu:1");
    cr_assert_gt(summary_value(out, "test_auc"), 0.7, "bf16: test AUC %g",
                 summary_value(out, "test_auc"));
    free(out);
    const char *budget[] = {"--sparse-max-rows", "160", NULL};
    out = cluster(2, 2, budget, "cpu:1");
    cr_assert_leq(summary_value(out, "table_rows"), 320);
    cr_assert_gt(summary_value(out, "rows_evicted"), 0);
    cr_assert_eq(summary_value(out, "rows_touched") - summary_value(out, "rows_evicted"),
                 summary_value(out, "table_rows"));
    free(out);
}

/* A number after "key": in a one-line JSON object. */
static double summary_field_number(const char *out, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *q = strstr(out, pat);
    cr_assert_not_null(q, "no %s in %s", key, out);
    return strtod(q + strlen(pat), NULL);
}

/* A job killed as it starts step 17 (PSTRAIN_TEST_HOOKS crash: no Finish, nothing flushed)
 * with a checkpoint every 5 steps resumes from step 15, whose sparse table is the full file
 * of step 5 and the deltas of 10 and 15, and ends with the bits of the job that never
 * stopped: alone on cpu:2 and 2 pservers x 2 trainers, which give the same bits; then
 * sparse-export writes each pserver's rows for serving from its newest checkpoint. */
Test(ctr_train, a_killed_job_resumes_from_full_and_delta_checkpoints, .timeout = 240)
{
    const char *extra[] = {"--sparse-admit-count", "2", "--sparse-evict-after", "8",
                           "--checkpoint-every", "5", "--log-level", "info", NULL};
    char *ref = train(extra, "cpu:2", 0, NULL);
    for (int j = 0; j < 2; j++) {
        char dir[96], env_dir[160], *out = NULL, *err = NULL;
        snprintf(dir, sizeof dir, "/tmp/pst_ctr_ckpt_%d_%d", (int)getpid(), j);
        snprintf(env_dir, sizeof env_dir, "PSTRAIN_CHECKPOINT_DIR=%s", dir);
        const char *argv[48] = {PSLAUNCH, "--pservers", "2", "--trainers", "2", "--timeout",
                                "100", "--", TRAINER, "--model", "dlrm", "--data", path,
                                "--batch", "100", "--epochs", "1", "--seed", "1", "--threads",
                                "1", "--progress", "none", "--metrics", "",
                                "--connect-timeout-ms", "5000"};
        int n = 27;
        const int first = j == 0 ? 8 : 0; /* alone: the trainer itself, on cpu:2 */
        for (int i = 0; extra[i]; i++)
            argv[n++] = extra[i];
        argv[n] = NULL;
        const char *devices = j == 0 ? "PSTRAIN_DEVICES=cpu:2" : "PSTRAIN_DEVICES=cpu:1";
        const char *crash[] = {env_dir, devices, "PSTRAIN_JOB_ID=t", "PSTRAIN_TEST_HOOKS=crash=17",
                               NULL};
        const char *const *args = argv + first;
        int rc = finish(proc_start(args, crash), "job", RUN_WAIT_MS, &out, &err);
        cr_assert_neq(rc, 0, "the job did not stop at step 17:\n%s", err);
        free(out);
        free(err);
        /* the table's files: the full one of 5, the deltas of 10 and 15 */
        char table[160];
        snprintf(table, sizeof table, "%s/t/pserver-0/table-0", dir);
        long steps[8];
        cr_assert_eq(pst_sparse_ckpt_steps(table, steps, 8), 3, "%s", table);
        cr_assert_eq(steps[0], 15);
        const char *again[] = {env_dir, devices, "PSTRAIN_JOB_ID=t", NULL};
        rc = finish(proc_start(args, again), "job", RUN_WAIT_MS, &out, &err);
        cr_assert_eq(rc, 0, "the resumed job exited %d:\n%s", rc, err);
        cr_assert(strstr(err, "resuming at step 15"), "%s", err);
        cr_assert_str_eq(summary_hash(out).hex, summary_hash(ref).hex, "other bits after "
                         "resuming (%s)", j ? "2 x 2" : "alone");
        const double live = summary_value(out, "table_rows");
        free(out);
        free(err);
        if (j == 1) { /* each pserver's rows for serving, from its newest checkpoint (50) */
            double rows = 0;
            for (int ps = 0; ps < 2; ps++) {
                char tdir[160], emb[160];
                snprintf(tdir, sizeof tdir, "%s/t/pserver-%d/table-0", dir, ps);
                snprintf(emb, sizeof emb, "%s/%d.emb", dir, ps);
                const char *exp[] = {PST_BIN_DIR "/sparse-export", tdir, emb, NULL};
                rc = finish(proc_start(exp, NULL), "sparse-export", RUN_WAIT_MS, &out, &err);
                cr_assert_eq(rc, 0, "sparse-export exited %d: %s", rc, err);
                cr_assert(strstr(out, "\"step\":50,"), "%s", out);
                rows += summary_field_number(out, "rows");
                free(out);
                free(err);
            }
            /* what a pull at step 50 reads from the tables: rows not expired (<= those held) */
            cr_assert(rows > 0 && rows <= live, "exported %g rows, the tables hold %g", rows,
                      live);
            const char *none[] = {PST_BIN_DIR "/sparse-export", "/tmp/pst_no_such_table",
                                  "/tmp/pst_no.emb", NULL};
            rc = finish(proc_start(none, NULL), "sparse-export", RUN_WAIT_MS, &out, &err);
            cr_assert_eq(rc, 1);
            cr_assert(strstr(err, "/tmp/pst_no_such_table") && strchr(err, '\n') ==
                      err + strlen(err) - 1, "%s", err);
            free(out);
            free(err);
        }
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
    }
    free(ref);
}

/* One line and a non-zero exit for what is not built yet and for a broken file. */
Test(ctr_train, what_it_cannot_do_is_refused_in_one_line, .timeout = 60)
{
    const struct {
        const char *extra[8];
        const char *says;
    } bad[] = {
        {{"--optimizer", "momentum", NULL}, "sgd, adagrad or adam"},
        {{"--pipeline", "2", "--micro-batches", "2", NULL}, "--pipeline 2 is not built yet"},
        {{"--dataset", "kjv", NULL}, "cannot train on --dataset kjv"},
        {{"--data", "/tmp/pst_no_such_click_file.bin", NULL}, "No such file"},
        {{"--precision", "fp16", NULL}, "--precision fp16 is not built yet"},
        {{"--lr-schedule", "warmup_cosine", "--warmup-steps", "5", NULL}, "lr is constant"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *err = NULL;
        const char *dev = i == 1 ? "cpu:2" : "cpu:1";
        char *argv_out = NULL;
        const char *argv[32] = {TRAINER, "--model", "dlrm", "--data", path, "--progress",
                                "none", "--log-level", "warn"};
        int n = 9;
        for (int k = 0; bad[i].extra[k]; k++)
            argv[n++] = bad[i].extra[k];
        argv[n] = NULL;
        char env_dev[32];
        snprintf(env_dev, sizeof env_dev, "PSTRAIN_DEVICES=%s", dev);
        const char *env[] = {env_dev, NULL};
        const int rc = finish(proc_start(argv, env), "trainer", RUN_WAIT_MS, &argv_out, &err);
        cr_assert_neq(rc, 0, "case %zu exited 0", i);
        cr_assert(strstr(err, bad[i].says), "case %zu: %s", i, err);
        cr_assert_eq(strchr(err, '\n'), err + strlen(err) - 1, "case %zu, more than one line:\n%s",
                     i, err);
        free(err);
        free(argv_out);
    }
    /* with pservers, one that is not there is named (port 1 of this host: nobody listens) */
    char env_ps[] = "PSTRAIN_PSERVERS=127.0.0.1:1";
    const char *argv[] = {TRAINER, "--model", "dlrm", "--data", path, "--connect-timeout-ms",
                          "500", "--progress", "none", NULL};
    const char *env[] = {env_ps, NULL};
    char *out = NULL, *err = NULL;
    cr_assert_neq(finish(proc_start(argv, env), "trainer", RUN_WAIT_MS, &out, &err), 0);
    cr_assert(strstr(err, "127.0.0.1:1"), "%s", err);
    free(out);
    free(err);
}
