/* test_sparse_ckpt.c — pserver/sparse_ckpt.c: a table trained with admission, eviction by
 * age and a row budget, checkpointed every 3 steps (full files and deltas with tombstones),
 * loaded from a delta's chain and trained on gives the bits, the rows waiting for
 * admission and the counters of the table that never stopped; pruning keeps what the kept
 * checkpoints need; a damaged, missing or foreign file is refused with its status; the
 * export holds every row not expired at its step, ascending by key. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rng.h"
#include "pserver/sparse.h"
#include "pserver/sparse_ckpt.h"

enum { DIM = 4, STEPS = 40, KEYS = 300, PER_STEP = 40, EVERY = 3 };

static char dir[96];

static void suite_init(void)
{
    snprintf(dir, sizeof dir, "/tmp/pst_sparse_ckpt_%d", (int)getpid());
}

static void suite_fini(void)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

TestSuite(sparse_ckpt, .init = suite_init, .fini = suite_fini);

static pst_sparse_table *table(int dim, pst_sparse_optim o)
{
    pst_sparse_config c;
    pst_sparse_defaults(&c);
    snprintf(c.name, sizeof c.name, "clicks");
    c.dim = dim;
    c.optim = o;
    c.admit_count = 2;
    c.evict_after = 6;
    c.max_rows = 160;
    pst_sparse_table *t = NULL;
    cr_assert_eq(pst_sparse_create(&t, &c), PST_OK, "%s", pst_error_detail());
    return t;
}

/* Step s's push: PER_STEP distinct keys drawn from (s), ascending, and their gradients. */
static void push_step(pst_sparse_table *t, long s)
{
    pst_rng r;
    pst_rng_seed(&r, 11, (uint64_t)s);
    unsigned char pick[KEYS] = {0};
    uint64_t keys[PER_STEP];
    float g[PER_STEP * DIM];
    int n = 0;
    while (n < PER_STEP) {
        const uint32_t k = (uint32_t)pst_rng_below(&r, KEYS);
        if (!pick[k]++)
            n++;
    }
    n = 0;
    for (uint32_t k = 0; k < KEYS; k++)
        if (pick[k])
            keys[n++] = (uint64_t)k * 7919;
    for (int i = 0; i < PER_STEP * DIM; i++)
        g[i] = pst_rng_normal(&r);
    cr_assert_eq(pst_sparse_push(t, keys, PER_STEP, g, s), PST_OK, "%s", pst_error_detail());
}

static void assert_same(pst_sparse_table *a, pst_sparse_table *b, long step)
{
    cr_assert_eq(pst_sparse_hash(a), pst_sparse_hash(b), "the rows differ");
    pst_sparse_stats x, y;
    pst_sparse_stats_of(a, &x);
    pst_sparse_stats_of(b, &y);
    cr_assert_eq(x.rows, y.rows);
    cr_assert_eq(x.pending, y.pending, "keys waiting for admission: %zu vs %zu", x.pending,
                 y.pending);
    cr_assert_eq(x.created, y.created);
    cr_assert_eq(x.evicted, y.evicted);
    cr_assert_eq(x.refused, y.refused);
    static float ra[KEYS * DIM], rb[KEYS * DIM];
    uint64_t keys[KEYS];
    for (uint32_t k = 0; k < KEYS; k++)
        keys[k] = (uint64_t)k * 7919;
    cr_assert_eq(pst_sparse_pull(a, keys, KEYS, step, ra), PST_OK);
    cr_assert_eq(pst_sparse_pull(b, keys, KEYS, step, rb), PST_OK);
    cr_assert_eq(memcmp(ra, rb, sizeof ra), 0, "pulls differ");
}

Test(sparse_ckpt, resume_from_full_and_deltas_gives_the_bits)
{
    const pst_sparse_optim optims[] = {PST_SPARSE_ADAGRAD, PST_SPARSE_ADAM};
    for (int o = 0; o < 2; o++) {
        char d[128];
        snprintf(d, sizeof d, "%s/resume%d", dir, o);
        pst_sparse_table *ref = table(DIM, optims[o]), *run = table(DIM, optims[o]);
        pst_sparse_ckpt w;
        pst_sparse_ckpt_init(&w, run, d, 100, -1);
        for (long s = 0; s < STEPS; s++) {
            push_step(ref, s);
            push_step(run, s);
            if ((s + 1) % EVERY == 0)
                cr_assert_eq(pst_sparse_ckpt_save(&w, run, s + 1), PST_OK, "%s",
                             pst_error_detail());
        }
        pst_sparse_stats st;
        pst_sparse_stats_of(ref, &st);
        cr_assert_gt(st.evicted, 0, "nothing was evicted: the test covers no tombstone");
        cr_assert_gt(st.pending, 0);
        /* every checkpoint's chain is whole; 13 of them (3, 6, ... 39) */
        long steps[64];
        cr_assert_eq(pst_sparse_ckpt_steps(d, steps, 64), STEPS / EVERY);
        /* from a delta (step 30: the chain 24 (full), 27, 30) and from a full one (24) */
        const long from[] = {30, 24, 39};
        for (int k = 0; k < 3; k++) {
            pst_sparse_table *again = table(DIM, optims[o]), *fresh = table(DIM, optims[o]);
            cr_assert_eq(pst_sparse_ckpt_load(d, from[k], again), PST_OK, "%s",
                         pst_error_detail());
            for (long s = 0; s < from[k]; s++)
                push_step(fresh, s);
            assert_same(fresh, again, from[k]);
            for (long s = from[k]; s < STEPS; s++)
                push_step(again, s);
            assert_same(ref, again, STEPS);
            pst_sparse_free(again);
            pst_sparse_free(fresh);
        }
        pst_sparse_free(ref);
        pst_sparse_free(run);
    }
}

Test(sparse_ckpt, pruning_keeps_the_chains_of_the_kept)
{
    char d[128];
    snprintf(d, sizeof d, "%s/prune", dir);
    pst_sparse_table *t = table(DIM, PST_SPARSE_ADAGRAD);
    pst_sparse_ckpt w;
    pst_sparse_ckpt_init(&w, t, d, 2, -1);
    for (long s = 0; s < STEPS; s++) {
        push_step(t, s);
        if ((s + 1) % EVERY == 0)
            cr_assert_eq(pst_sparse_ckpt_save(&w, t, s + 1), PST_OK, "%s", pst_error_detail());
    }
    /* fulls at 3 and 27 (every 8th); the 2 newest (36, 39) need 27, 30, 33 */
    long steps[64];
    const int n = pst_sparse_ckpt_steps(d, steps, 64);
    cr_assert_eq(n, 5, "%d checkpoints left", n);
    cr_assert_eq(steps[0], 39);
    cr_assert_eq(steps[4], 27);
    pst_sparse_table *again = table(DIM, PST_SPARSE_ADAGRAD);
    cr_assert_eq(pst_sparse_ckpt_load(d, 39, again), PST_OK, "%s", pst_error_detail());
    push_step(again, 39); /* the last step, after the checkpoint of 39 */
    assert_same(t, again, STEPS);
    pst_sparse_free(again);
    pst_sparse_free(t);
}

/* An earlier run's files stay in the directory (every 4 steps: 4, 8, 12); the job resumed
 * at 8 checkpoints every 5 (10 full, 15 a delta on 10): loading 15 applies its own chain
 * only, not the stale delta of 12 that lies between. */
Test(sparse_ckpt, a_chain_ignores_files_an_earlier_run_left)
{
    char d[128];
    snprintf(d, sizeof d, "%s/stale", dir);
    pst_sparse_table *old = table(DIM, PST_SPARSE_ADAGRAD);
    pst_sparse_ckpt w;
    pst_sparse_ckpt_init(&w, old, d, 100, -1);
    for (long s = 0; s < 12; s++) {
        push_step(old, s);
        if ((s + 1) % 4 == 0)
            cr_assert_eq(pst_sparse_ckpt_save(&w, old, s + 1), PST_OK);
    }
    pst_sparse_table *t = table(DIM, PST_SPARSE_ADAGRAD);
    cr_assert_eq(pst_sparse_ckpt_load(d, 8, t), PST_OK, "%s", pst_error_detail());
    pst_sparse_ckpt_init(&w, t, d, 100, 8);
    for (long s = 8; s < 15; s++) {
        push_step(t, s);
        if ((s + 1) % 5 == 0)
            cr_assert_eq(pst_sparse_ckpt_save(&w, t, s + 1), PST_OK);
    }
    pst_sparse_table *again = table(DIM, PST_SPARSE_ADAGRAD);
    cr_assert_eq(pst_sparse_ckpt_load(d, 15, again), PST_OK, "%s", pst_error_detail());
    assert_same(t, again, 15);
    pst_sparse_free(again);
    pst_sparse_free(t);
    pst_sparse_free(old);
}

Test(sparse_ckpt, damaged_missing_or_foreign_files_are_refused)
{
    char d[128], path[200];
    snprintf(d, sizeof d, "%s/bad", dir);
    pst_sparse_table *t = table(DIM, PST_SPARSE_ADAGRAD);
    pst_sparse_ckpt w;
    pst_sparse_ckpt_init(&w, t, d, 100, -1);
    for (long s = 0; s < 9; s++) {
        push_step(t, s);
        if ((s + 1) % EVERY == 0)
            cr_assert_eq(pst_sparse_ckpt_save(&w, t, s + 1), PST_OK);
    }
    /* another table's (dim 8) */
    pst_sparse_table *other = table(8, PST_SPARSE_ADAGRAD);
    cr_assert_eq(pst_sparse_ckpt_load(d, 9, other), PST_ERR_MISMATCH, "%s", pst_error_detail());
    pst_sparse_free(other);
    /* a byte of the delta of step 6 flipped: its chain (and 9's) is broken */
    snprintf(path, sizeof path, "%s/step-%012d.ckpt", d, 6);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, 100, SEEK_SET), 0);
    const int c = fgetc(f);
    cr_assert_eq(fseek(f, 100, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    fclose(f);
    pst_sparse_table *again = table(DIM, PST_SPARSE_ADAGRAD);
    cr_assert_eq(pst_sparse_ckpt_load(d, 9, again), PST_ERR_FORMAT, "%s", pst_error_detail());
    cr_assert(strstr(pst_error_detail(), "step-000000000006"), "%s", pst_error_detail());
    long steps[8];
    cr_assert_eq(pst_sparse_ckpt_steps(d, steps, 8), 1); /* 3 alone */
    cr_assert_eq(steps[0], 3);
    /* the full file of step 3 gone: nothing loads */
    snprintf(path, sizeof path, "%s/step-%012d.ckpt", d, 3);
    cr_assert_eq(unlink(path), 0);
    pst_sparse_table *none = table(DIM, PST_SPARSE_ADAGRAD);
    cr_assert_eq(pst_sparse_ckpt_load(d, 3, none), PST_ERR_NOT_FOUND, "%s", pst_error_detail());
    pst_sparse_free(none);
    pst_sparse_free(again);
    pst_sparse_free(t);
}

Test(sparse_ckpt, export_holds_every_row_ascending)
{
    char path[128];
    snprintf(path, sizeof path, "%s.emb", dir);
    pst_sparse_table *t = table(DIM, PST_SPARSE_ADAGRAD);
    for (long s = 0; s < 12; s++)
        push_step(t, s);
    size_t written = 0;
    cr_assert_eq(pst_sparse_export(t, 12, path, &written), PST_OK, "%s", pst_error_detail());
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    char magic[8];
    uint32_t dim, zero;
    uint64_t count;
    cr_assert(fread(magic, 8, 1, f) == 1 && fread(&dim, 4, 1, f) == 1 &&
              fread(&zero, 4, 1, f) == 1 && fread(&count, 8, 1, f) == 1);
    cr_assert_eq(memcmp(magic, "PSTEMB01", 8), 0);
    cr_assert_eq(dim, DIM);
    pst_sparse_stats st;
    pst_sparse_stats_of(t, &st);
    cr_assert_lt(count, st.rows, "no row expired by step 12: the test covers none");
    cr_assert_gt(st.pending, 0, "keys waiting for admission: the test covers none");
    size_t live = 0; /* the rows a pull at step 12 reads from the table, not the initializer */
    uint64_t keys[KEYS];
    static float got[KEYS * DIM];
    for (uint32_t k = 0; k < KEYS; k++)
        keys[k] = (uint64_t)k * 7919;
    cr_assert_eq(pst_sparse_pull(t, keys, KEYS, 12, got), PST_OK);
    uint64_t prev = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t key;
        float v[DIM], want[DIM];
        cr_assert(fread(&key, 8, 1, f) == 1 && fread(v, sizeof v, 1, f) == 1);
        cr_assert(i == 0 || key > prev, "keys not ascending at %llu", (unsigned long long)i);
        prev = key;
        cr_assert_eq(pst_sparse_pull(t, &key, 1, 12, want), PST_OK);
        cr_assert_eq(memcmp(v, want, sizeof v), 0, "key %llu", (unsigned long long)key);
    }
    cr_assert_eq(fgetc(f), EOF);
    fclose(f);
    pst_sparse_sweep(t, 12); /* what is left are the rows the export holds */
    pst_sparse_stats_of(t, &st);
    live = st.rows;
    cr_assert_eq(count, live);
    cr_assert_eq(written, count);
    unlink(path);
    pst_sparse_free(t);
}
