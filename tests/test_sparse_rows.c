/* test_sparse_rows.c — common/sparse_rows.c: a batch's unique keys and inverse index
 * against a naive reference, repeated keys' rows summed in occurrence order bit for bit,
 * and the pserver's merge of the trainers' pushes: the union of their keys, rows added in
 * trainer order, equal to a naive merge bit for bit; keys out of order refused. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/sparse_rows.h"

enum { N = 5000, DIM = 5 };

static uint64_t keys[N];
static float rows[N * DIM];

static void make_batch(uint64_t seed, size_t n, uint64_t range)
{
    pst_rng r;
    pst_rng_seed(&r, seed, 0);
    for (size_t i = 0; i < n; i++) {
        keys[i] = (pst_rng_below(&r, range) << 3) ^ 0x5a5a000000000000ull; /* hot repeats */
        for (int j = 0; j < DIM; j++)
            rows[i * DIM + j] = pst_rng_normal(&r);
    }
}

/* Unique keys ascending, each key's inverse pointing at it, and every key's rows summed in
 * occurrence order: the same bits as a double loop over the batch. */
Test(sparse_rows, unique_keys_and_sums_equal_a_naive_loop)
{
    make_batch(3, N, 700);
    static pst_key_at scratch[N];
    static uint64_t uniq[N];
    static uint32_t inverse[N];
    static float sums[N * DIM];
    size_t u = 0;
    cr_assert_eq(pst_keys_unique(keys, N, scratch, uniq, inverse, &u), PST_OK);
    cr_assert(u > 100 && u < 700, "%zu unique keys", u);
    for (size_t i = 1; i < u; i++)
        cr_assert_lt(uniq[i - 1], uniq[i], "not ascending at %zu", i);
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(uniq[inverse[i]], keys[i], "occurrence %zu", i);
    pst_rows_sum(rows, inverse, N, DIM, sums, u);
    for (size_t k = 0; k < u; k++) {
        float want[DIM] = {0};
        size_t count = 0;
        for (size_t i = 0; i < N; i++) /* the naive reference: row order */
            if (keys[i] == uniq[k]) {
                count++;
                for (int j = 0; j < DIM; j++)
                    want[j] += rows[i * DIM + j];
            }
        cr_assert_gt(count, 0);
        cr_assert_eq(memcmp(want, sums + k * DIM, sizeof want), 0, "key %zu's sum", k);
    }
    size_t none = 7;
    cr_assert_eq(pst_keys_unique(keys, 0, scratch, uniq, inverse, &none), PST_OK);
    cr_assert_eq(none, 0);
    cr_assert_eq(pst_keys_unique(NULL, 3, scratch, uniq, inverse, &none), PST_ERR_INVALID);
}

/* Three trainers' unique sorted keys and summed rows, overlapping: the merge lists every
 * key once, ascending, with the rows added in trainer order (t0 + t1 + t2 where present):
 * the same bits as a naive merge. */
Test(sparse_rows, merge_adds_the_trainers_rows_in_trainer_order)
{
    enum { T = 3, PER = 1500 };
    static uint64_t tk[T][PER], out_keys[T * PER];
    static float tr[T][PER * DIM], out_rows[T * PER * DIM];
    static pst_key_at scratch[PER];
    static uint32_t inverse[PER];
    size_t n[T];
    for (int t = 0; t < T; t++) {
        make_batch(10 + (uint64_t)t, PER, 900);
        cr_assert_eq(pst_keys_unique(keys, PER, scratch, tk[t], inverse, &n[t]), PST_OK);
        pst_rows_sum(rows, inverse, PER, DIM, tr[t], n[t]);
    }
    const uint64_t *kp[T] = {tk[0], tk[1], tk[2]};
    const float *rp[T] = {tr[0], tr[1], tr[2]};
    size_t nout = 0;
    cr_assert_eq(pst_rows_merge(T, kp, n, rp, DIM, out_keys, out_rows, &nout), PST_OK);
    cr_assert_gt(nout, n[0]);
    for (size_t i = 1; i < nout; i++)
        cr_assert_lt(out_keys[i - 1], out_keys[i]);
    size_t listed = 0;
    for (size_t o = 0; o < nout; o++) {
        float want[DIM];
        int first = 1;
        for (int t = 0; t < T; t++)
            for (size_t i = 0; i < n[t]; i++) {
                if (tk[t][i] != out_keys[o])
                    continue;
                listed++;
                for (int j = 0; j < DIM; j++)
                    want[j] = first ? tr[t][i * DIM + j] : want[j] + tr[t][i * DIM + j];
                first = 0;
            }
        cr_assert(!first, "key %llu is in no trainer's push", (unsigned long long)out_keys[o]);
        cr_assert_eq(memcmp(want, out_rows + o * DIM, sizeof want), 0, "key %zu", o);
    }
    cr_assert_eq(listed, n[0] + n[1] + n[2], "a trainer's key is missing from the merge");
    /* a push whose keys are not ascending is refused, naming the trainer */
    uint64_t bad[3] = {5, 9, 9};
    const uint64_t *bp[2] = {tk[0], bad};
    const size_t bn[2] = {n[0], 3};
    const float *br[2] = {tr[0], tr[1]};
    cr_assert_eq(pst_rows_merge(2, bp, bn, br, DIM, out_keys, out_rows, &nout), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "trainer 1"), "%s", pst_error_detail());
}
