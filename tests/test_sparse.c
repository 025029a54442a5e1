/* test_sparse.c — pserver/sparse.c, the sparse table: the per-row SGD, Adagrad and Adam
 * against numbers produced by PyTorch 1.13 (torch.optim.SGD, Adagrad and SparseAdam with
 * sparse gradients), bit for bit; pulls of unknown keys; admission, eviction by age (with
 * and without sweeps: the same values) and by row budget, with their counts; memory that
 * grows and shrinks by row; bad input refused with nothing applied; threads pushing,
 * pulling and sweeping at once (also under TSan). */
#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pserver/sparse.h"

static pst_sparse_table *table(pst_sparse_optim o, int dim, void (*edit)(pst_sparse_config *))
{
    pst_sparse_config c;
    pst_sparse_defaults(&c);
    snprintf(c.name, sizeof c.name, "t");
    c.optim = o;
    c.dim = dim;
    if (edit)
        edit(&c);
    pst_sparse_table *t = NULL;
    cr_assert_eq(pst_sparse_create(&t, &c), PST_OK, "%s", pst_error_detail());
    return t;
}

/* torch: w = zeros(3, 3); three steps of sparse gradients on rows {0, 1}, {1, 2}, {0, 2};
 * the values of rows 0, 1, 2 after them (tmp script in the commit's note). */
static const float grads[3][2][3] = {{{0.1f, -0.2f, 0.3f}, {1.5f, -2.5f, 0.7f}},
                                     {{-0.4f, 0.05f, 0.9f}, {0.33f, 0.66f, -0.99f}},
                                     {{0.2f, 0.2f, -0.2f}, {0.0f, 1e-3f, -1e-3f}}};
static const uint64_t rows_of[3][2] = {{0, 1}, {1, 2}, {0, 2}};

static void zero_init(pst_sparse_config *c)
{
    c->init_std = 0.0f;
}

static void against_torch(pst_sparse_optim o, double lr, const float want[9])
{
    pst_sparse_table *t = table(o, 3, zero_init);
    pst_sparse_config c = *pst_sparse_config_of(t);
    c.lr = lr;
    c.eps = o == PST_SPARSE_ADAM ? 1e-8 : 1e-10;
    pst_sparse_free(t);
    cr_assert_eq(pst_sparse_create(&t, &c), PST_OK);
    for (long s = 0; s < 3; s++)
        cr_assert_eq(pst_sparse_push(t, rows_of[s], 2, &grads[s][0][0], s), PST_OK, "%s",
                     pst_error_detail());
    const uint64_t keys[3] = {0, 1, 2};
    float got[9];
    cr_assert_eq(pst_sparse_pull(t, keys, 3, 2, got), PST_OK);
    for (int i = 0; i < 9; i++)
        cr_expect_eq(got[i], want[i], "%s element %d: %a, torch %a", pst_sparse_optim_name(o), i,
                     (double)got[i], (double)want[i]);
    pst_sparse_free(t);
}

Test(sparse, sgd_adagrad_and_adam_equal_pytorch_bit_for_bit)
{
    const float sgd[9] = {-0x1.eb852p-6f, 0x1.c28f5cp-31f, -0x1.47ae16p-7f,
                          -0x1.c28f5ep-4f, 0x1.f5c29p-3f, -0x1.47ae14p-3f,
                          -0x1.0e5606p-5f, -0x1.0ebee2p-4f, 0x1.95e9e2p-4f};
    const float adagrad[9] = {-0x1.83fa8cp-4f, 0x1.dfe054p-7f, -0x1.6cca24p-6f,
                              -0x1.300fb6p-5f, 0x1.9168dep-5f, -0x1.6e7596p-4f,
                              -0x1.99999ap-5f, -0x1.9a387ap-5f, 0x1.9a0384p-5f};
    const float adam[9] = {-0x1.2b97b6p-6f, 0x1.38dfcap-7f, -0x1.705558p-7f,
                           -0x1.dcf768p-7f, 0x1.0f2946p-6f, -0x1.477964p-6f,
                           -0x1.b0539p-7f, -0x1.b0a4ccp-7f, 0x1.b089cp-7f};
    against_torch(PST_SPARSE_SGD, 0.1, sgd);
    against_torch(PST_SPARSE_ADAGRAD, 0.05, adagrad);
    against_torch(PST_SPARSE_ADAM, 0.01, adam);
}

/* A pull of a key without a row gets the initializer's value, the same from every table
 * with that seed and different for another key, and creates nothing; the row that a push
 * creates starts from exactly that value. */
Test(sparse, unknown_keys_pull_the_initializer_and_create_nothing)
{
    pst_sparse_table *a = table(PST_SPARSE_SGD, 8, NULL), *b = table(PST_SPARSE_SGD, 8, NULL);
    const uint64_t keys[2] = {42, 43};
    float va[16], vb[16];
    cr_assert_eq(pst_sparse_pull(a, keys, 2, 0, va), PST_OK);
    cr_assert_eq(pst_sparse_pull(b, keys, 2, 0, vb), PST_OK);
    cr_assert_eq(memcmp(va, vb, sizeof va), 0);
    cr_assert_neq(memcmp(va, va + 8, sizeof(float) * 8), 0, "keys 42 and 43 start alike");
    double ss = 0.0;
    for (int j = 0; j < 16; j++)
        ss += (double)va[j] * va[j];
    cr_assert(ss > 0.0 && sqrt(ss / 16) < 0.05, "init rms %g for std 0.01", sqrt(ss / 16));
    pst_sparse_stats st;
    pst_sparse_stats_of(a, &st);
    cr_assert_eq(st.rows + st.pending + st.created, 0);
    const float zero[8] = {0};
    cr_assert_eq(pst_sparse_push(a, keys, 1, zero, 0), PST_OK);
    float after[8];
    cr_assert_eq(pst_sparse_pull(a, keys, 1, 0, after), PST_OK);
    cr_assert_eq(memcmp(after, va, sizeof after), 0, "the row did not start from the pull");
    pst_sparse_stats_of(a, &st);
    cr_assert_eq(st.rows, 1);
    cr_assert_eq(st.created, 1);
    pst_sparse_free(a);
    pst_sparse_free(b);
}

static void admit3(pst_sparse_config *c)
{
    c->admit_count = 3;
}

/* admit_count 3: the first two pushes of a key are refused (counted, not applied); the
 * third creates the row and applies its own gradient only. */
Test(sparse, admission_after_three_pushes)
{
    pst_sparse_table *t = table(PST_SPARSE_SGD, 2, admit3);
    const uint64_t k = 7;
    const float g[2] = {1.0f, -1.0f};
    float init[2], v[2];
    cr_assert_eq(pst_sparse_pull(t, &k, 1, 0, init), PST_OK);
    pst_sparse_stats st;
    for (long s = 0; s < 2; s++) {
        cr_assert_eq(pst_sparse_push(t, &k, 1, g, s), PST_OK);
        cr_assert_eq(pst_sparse_pull(t, &k, 1, s, v), PST_OK);
        cr_assert_eq(memcmp(v, init, sizeof v), 0, "applied before admission");
    }
    pst_sparse_stats_of(t, &st);
    cr_assert(st.rows == 0 && st.pending == 1 && st.refused == 2 && st.created == 0,
              "rows %zu pending %zu refused %llu", st.rows, st.pending,
              (unsigned long long)st.refused);
    cr_assert_eq(pst_sparse_push(t, &k, 1, g, 2), PST_OK);
    cr_assert_eq(pst_sparse_pull(t, &k, 1, 2, v), PST_OK);
    for (int j = 0; j < 2; j++)
        cr_assert_eq(v[j], fmaf(-0.05f, g[j], init[j]), "column %d", j);
    pst_sparse_stats_of(t, &st);
    cr_assert(st.rows == 1 && st.pending == 0 && st.refused == 2 && st.created == 1);
    pst_sparse_free(t);
}

static void evict5(pst_sparse_config *c)
{
    c->evict_after = 5;
}

/* evict_after 5, the same pushes with and without sweeps: a row pushed at step 0 is there
 * at step 5, gone at step 6 (the initializer again), and a push at step 7 creates it anew
 * from the initializer; the values never depend on the sweeps, which free the memory. */
Test(sparse, eviction_by_age_is_exact_with_or_without_sweeps)
{
    for (int sweep = 0; sweep < 2; sweep++) {
        pst_sparse_table *t = table(PST_SPARSE_ADAGRAD, 4, evict5);
        const uint64_t k[2] = {1, 2};
        const float g[8] = {0.5f, 0.5f, 0.5f, 0.5f, 1, 1, 1, 1};
        float init[8], v[8];
        cr_assert_eq(pst_sparse_pull(t, k, 2, 0, init), PST_OK);
        cr_assert_eq(pst_sparse_push(t, k, 2, g, 0), PST_OK);
        for (long s = 1; s <= 7; s++) {
            if (sweep)
                pst_sparse_sweep(t, s);
            if (s == 3) /* key 2 stays alive */
                cr_assert_eq(pst_sparse_push(t, &k[1], 1, g + 4, s), PST_OK);
            cr_assert_eq(pst_sparse_pull(t, k, 1, s, v), PST_OK);
            cr_assert_eq(memcmp(v, init, sizeof(float) * 4) == 0, s >= 6, "sweep %d step %ld",
                         sweep, s);
        }
        cr_assert_eq(pst_sparse_push(t, k, 1, g, 7), PST_OK);
        cr_assert_eq(pst_sparse_pull(t, k, 1, 7, v), PST_OK);
        const float once = fmaf(-0.05f, 0.5f / (sqrtf(0.25f) + 1e-10f), init[0]);
        cr_assert_eq(v[0], once, "re-created row %a, want %a", (double)v[0], (double)once);
        pst_sparse_sweep(t, 7);
        pst_sparse_stats st;
        pst_sparse_stats_of(t, &st);
        cr_assert(st.rows == 2 && st.created == 3 && st.evicted == 1, "rows %zu created %llu "
                  "evicted %llu", st.rows, (unsigned long long)st.created,
                  (unsigned long long)st.evicted);
        pst_sparse_free(t);
    }
}

static void budget160(pst_sparse_config *c)
{
    c->max_rows = 160;
}

/* max_rows 160 (10 a stripe, trimmed to 9): pushing 4,000 keys one step each never holds
 * more than 160 rows, and the rows kept are the most recently pushed: the last 8 keys are
 * among the 9 newest of their stripes, whichever those are. */
Test(sparse, a_row_budget_keeps_the_most_recent_rows)
{
    pst_sparse_table *t = table(PST_SPARSE_SGD, 4, budget160);
    const float g[4] = {1, 1, 1, 1};
    pst_sparse_stats st;
    for (uint64_t k = 0; k < 4000; k++) {
        cr_assert_eq(pst_sparse_push(t, &k, 1, g, (long)k), PST_OK);
        pst_sparse_stats_of(t, &st);
        cr_assert_leq(st.rows, 160, "%zu rows after key %llu", st.rows, (unsigned long long)k);
    }
    cr_assert_eq(st.created, 4000);
    cr_assert_eq(st.evicted, 4000 - st.rows);
    cr_assert_geq(st.rows, 160 * 7 / 8 - 16, "%zu rows", st.rows);
    /* the last 8 keys are held (their pull is not the initializer's value) */
    for (uint64_t k = 4000 - 8; k < 4000; k++) {
        float v[4], init[4];
        cr_assert_eq(pst_sparse_pull(t, &k, 1, 4000, v), PST_OK);
        pst_sparse_table *fresh = table(PST_SPARSE_SGD, 4, NULL);
        cr_assert_eq(pst_sparse_pull(fresh, &k, 1, 0, init), PST_OK);
        pst_sparse_free(fresh);
        cr_assert_neq(memcmp(v, init, sizeof v), 0, "key %llu was dropped",
                      (unsigned long long)k);
    }
    pst_sparse_free(t);
}

static void count_rows(void *arg, uint64_t key, const float *values, const float *state,
                       uint32_t pushes, long last)
{
    (void)key, (void)values, (void)state, (void)last;
    cr_assert_eq(pushes, 1);
    ++*(size_t *)arg;
}

static void count_any(void *arg, uint64_t key, const float *values, const float *state,
                      uint32_t pushes, long last)
{
    (void)key, (void)values, (void)state, (void)pushes, (void)last;
    ++*(size_t *)arg;
}

/* Memory is counted by row: 100,000 rows of 16 Adam floats x 3, then all but the last
 * 1,000 expire and a sweep frees their slabs; every remaining key is still found. */
Test(sparse, memory_grows_and_shrinks_by_row)
{
    pst_sparse_table *t = table(PST_SPARSE_ADAM, 16, evict5);
    float g[16];
    for (int j = 0; j < 16; j++)
        g[j] = 0.25f;
    pst_sparse_stats st;
    pst_sparse_stats_of(t, &st);
    const size_t empty = st.bytes;
    for (uint64_t k = 0; k < 100000; k++)
        cr_assert_eq(pst_sparse_push(t, &k, 1, g, k < 99000 ? 0 : 10), PST_OK);
    pst_sparse_stats_of(t, &st);
    const size_t full = st.bytes, row = 16 * 3 * sizeof(float);
    cr_assert_geq(full - empty, 100000 * row, "%zu bytes for 100,000 rows", full - empty);
    cr_assert_leq(full - empty, 100000 * (row + 128) + PST_SPARSE_STRIPES * PST_SPARSE_SLAB_ROWS *
                  row, "%zu bytes for 100,000 rows", full - empty);
    pst_sparse_sweep(t, 10);
    pst_sparse_stats_of(t, &st);
    cr_assert_eq(st.rows, 1000);
    cr_assert_eq(st.evicted, 99000);
    cr_assert_leq(st.bytes - empty, 1000 * row + PST_SPARSE_STRIPES * PST_SPARSE_SLAB_ROWS * row +
                  full / 2, "%zu bytes left for 1,000 rows", st.bytes - empty);
    size_t seen = 0;
    pst_sparse_foreach(t, count_rows, &seen);
    cr_assert_eq(seen, 1000);
    pst_sparse_table *fresh = table(PST_SPARSE_ADAM, 16, NULL);
    for (uint64_t k = 99000; k < 100000; k++) {
        float v[16], init[16];
        cr_assert_eq(pst_sparse_pull(t, &k, 1, 10, v), PST_OK);
        cr_assert_eq(pst_sparse_pull(fresh, &k, 1, 10, init), PST_OK);
        cr_assert_neq(memcmp(v, init, sizeof v), 0, "key %llu lost its row",
                      (unsigned long long)k);
    }
    pst_sparse_free(fresh);
    pst_sparse_free(t);
}

/* Bad input: exact statuses, one line naming the problem, nothing applied. */
Test(sparse, bad_input_is_refused_and_nothing_applied)
{
    pst_sparse_table *t = table(PST_SPARSE_ADAGRAD, 2, NULL);
    const uint64_t keys[3] = {1, 2, 3};
    const float g[6] = {1, 1, 1, NAN, 1, 1};
    cr_assert_eq(pst_sparse_push(t, keys, 3, g, 0), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "key 2") && strstr(pst_error_detail(), "nothing"),
              "%s", pst_error_detail());
    pst_sparse_stats st;
    pst_sparse_stats_of(t, &st);
    cr_assert_eq(st.created + st.rows + st.pending, 0, "a bad push applied something");
    const float inf[2] = {INFINITY, 0};
    cr_assert_eq(pst_sparse_push(t, keys, 1, inf, 0), PST_ERR_INVALID);
    cr_assert_eq(pst_sparse_push(t, keys, 1, g, -1), PST_ERR_INVALID);
    cr_assert_eq(pst_sparse_push(t, NULL, 1, g, 0), PST_ERR_INVALID);
    cr_assert_eq(pst_sparse_pull(t, keys, (size_t)PST_SPARSE_MAX_KEYS + 1, 0, (float *)g),
                 PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "at most"), "%s", pst_error_detail());
    pst_sparse_stats_of(t, &st);
    cr_assert_eq(st.created + st.rows + st.pending, 0);
    pst_sparse_free(t);
    pst_sparse_config c;
    pst_sparse_defaults(&c);
    pst_sparse_table *bad = NULL;
    cr_assert_eq(pst_sparse_create(&bad, &c), PST_ERR_INVALID); /* no name */
    snprintf(c.name, sizeof c.name, "f0");
    c.dim = 0;
    cr_assert_eq(pst_sparse_create(&bad, &c), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "dim 0"), "%s", pst_error_detail());
    c.dim = 4;
    c.lr = 0.0;
    cr_assert_eq(pst_sparse_create(&bad, &c), PST_ERR_INVALID);
    c.lr = 0.1;
    c.max_rows = 5; /* fewer than one row a stripe */
    cr_assert_eq(pst_sparse_create(&bad, &c), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "max_rows 5"), "%s", pst_error_detail());
    c.max_rows = 0;
    c.optim = PST_SPARSE_ADAM;
    c.beta2 = 1.0;
    cr_assert_eq(pst_sparse_create(&bad, &c), PST_ERR_INVALID);
    cr_assert_null(bad);
    pst_sparse_optim o;
    cr_assert_eq(pst_sparse_optim_parse("adagrad", &o), 0);
    cr_assert_eq(o, PST_SPARSE_ADAGRAD);
    cr_assert_eq(pst_sparse_optim_parse("Adagrad", &o), -1);
}

typedef struct worker {
    pst_sparse_table *t;
    int id;
} worker;

static void *hammer(void *arg)
{
    worker *w = arg;
    float g[8], v[8 * 64];
    uint64_t keys[64];
    for (int j = 0; j < 8; j++)
        g[j] = 0.01f * (float)(w->id + 1);
    float gs[8 * 64];
    for (int i = 0; i < 8 * 64; i++)
        gs[i] = g[i % 8];
    for (long s = 0; s < 300; s++) {
        for (int i = 0; i < 64; i++) /* overlapping keys across the threads */
            keys[i] = (uint64_t)((s * 37 + i * 11 + w->id * 5) % 5000);
        if (pst_sparse_push(w->t, keys, 64, gs, s) != PST_OK ||
            pst_sparse_pull(w->t, keys, 64, s, v) != PST_OK)
            return (void *)1;
        if (s % 50 == 0)
            pst_sparse_sweep(w->t, s);
    }
    return NULL;
}

static void concurrent(pst_sparse_config *c)
{
    c->evict_after = 20;
    c->max_rows = 3000;
    c->admit_count = 2;
}

/* Four threads push, pull and sweep overlapping keys with admission, eviction and a row
 * budget at once: no error, the budget holds, and the counts add up. */
Test(sparse, threads_insert_find_and_evict_at_once, .timeout = 60)
{
    pst_sparse_table *t = table(PST_SPARSE_ADAM, 8, concurrent);
    pthread_t th[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){t, i};
        cr_assert_eq(pthread_create(&th[i], NULL, hammer, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        void *rc;
        pthread_join(th[i], &rc);
        cr_assert_null(rc, "thread %d failed: %s", i, pst_error_detail());
    }
    pst_sparse_stats st;
    pst_sparse_stats_of(t, &st);
    cr_assert_leq(st.rows, 3000);
    cr_assert_eq(st.rows, st.created - st.evicted, "rows %zu, created %llu, evicted %llu",
                 st.rows, (unsigned long long)st.created, (unsigned long long)st.evicted);
    size_t seen = 0;
    pst_sparse_foreach(t, count_any, &seen);
    cr_assert_eq(seen, st.rows);
    pst_sparse_free(t);
}
