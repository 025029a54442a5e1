/* hashtable.c — which hash table the sparse table's index is (issue 31: "a well-kept C
 * library from Debian if one fits, or an open-addressing table of our own if it is
 * measurably better"). Times, single-threaded, for N distinct random u64 keys mapped to
 * a row number: insert all; find each once in random order (hits); find N keys that are
 * absent (misses); delete half; find the rest; and the bytes each holds with N keys:
 *   ours    pserver/sparse_index.c: linear probing, 24-byte entries, backward-shift delete;
 *   uthash  Debian's uthash-dev (HASH_ADD/HASH_FIND on a uint64_t field, its default
 *           Jenkins hash; chained, intrusive: one malloc'd struct per key);
 *   genht   Debian's libgenht1-dev (htip: open addressing with a stored hash, our mix as
 *           its hash function).
 * Each run alternates the three, RUNS times; prints one JSON line per (table, run) and
 * the medians in ns per operation. usage: bench_hashtable [N=2000000] [RUNS=5] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <genht/htip.h>
#include <uthash.h>

#include "common/rng.h"
#include "pserver/sparse.h"
#include "pserver/sparse_index.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { INSERT, HIT, MISS, DELETE, AFTER, NOPS };
static const char *const op_names[NOPS] = {"insert", "find_hit", "find_miss", "delete_half",
                                           "find_after_delete"};

typedef struct run {
    double ns[NOPS];
    size_t bytes;
    uint64_t check; /* a sum of the values found, so nothing is optimized away */
} run;

/* ---- ours ---- */
static run run_ours(const uint64_t *keys, const uint64_t *order, const uint64_t *absent,
                    size_t n)
{
    run r = {0};
    ps_index x = {0};
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        const uint64_t h = pst_sparse_mix(keys[i]);
        if (ps_index_reserve(&x) != 0)
            exit(2);
        ps_index_put(&x, ps_index_find(&x, keys[i], h), (ps_index_entry){keys[i], (uint32_t)i, 0, 0});
    }
    r.ns[INSERT] = now() - t0;
    r.bytes = x.cap * sizeof(ps_index_entry);
    t0 = now();
    for (size_t i = 0; i < n; i++)
        r.check += x.slots[ps_index_find(&x, order[i], pst_sparse_mix(order[i]))].row;
    r.ns[HIT] = now() - t0;
    t0 = now();
    for (size_t i = 0; i < n; i++)
        r.check += x.slots[ps_index_find(&x, absent[i], pst_sparse_mix(absent[i]))].row == PS_INDEX_EMPTY;
    r.ns[MISS] = now() - t0;
    t0 = now();
    for (size_t i = 0; i < n; i += 2)
        ps_index_remove(&x, ps_index_find(&x, keys[i], pst_sparse_mix(keys[i])));
    r.ns[DELETE] = now() - t0;
    t0 = now();
    for (size_t i = 1; i < n; i += 2)
        r.check += x.slots[ps_index_find(&x, keys[i], pst_sparse_mix(keys[i]))].row;
    r.ns[AFTER] = now() - t0;
    ps_index_free(&x);
    return r;
}

/* ---- uthash ---- */
typedef struct ut_item {
    uint64_t key;
    uint32_t row;
    UT_hash_handle hh;
} ut_item;

static run run_uthash(const uint64_t *keys, const uint64_t *order, const uint64_t *absent,
                      size_t n)
{
    run r = {0};
    ut_item *head = NULL, *it;
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        it = malloc(sizeof *it);
        it->key = keys[i];
        it->row = (uint32_t)i;
        HASH_ADD(hh, head, key, sizeof(uint64_t), it);
    }
    r.ns[INSERT] = now() - t0;
    /* its items (malloc adds 16 bytes to each) and its buckets */
    r.bytes = n * (sizeof(ut_item) + 16) + head->hh.tbl->num_buckets * sizeof(UT_hash_bucket);
    t0 = now();
    for (size_t i = 0; i < n; i++) {
        HASH_FIND(hh, head, &order[i], sizeof(uint64_t), it);
        r.check += it->row;
    }
    r.ns[HIT] = now() - t0;
    t0 = now();
    for (size_t i = 0; i < n; i++) {
        HASH_FIND(hh, head, &absent[i], sizeof(uint64_t), it);
        r.check += it == NULL;
    }
    r.ns[MISS] = now() - t0;
    t0 = now();
    for (size_t i = 0; i < n; i += 2) {
        HASH_FIND(hh, head, &keys[i], sizeof(uint64_t), it);
        HASH_DEL(head, it);
        free(it);
    }
    r.ns[DELETE] = now() - t0;
    t0 = now();
    for (size_t i = 1; i < n; i += 2) {
        HASH_FIND(hh, head, &keys[i], sizeof(uint64_t), it);
        r.check += it->row;
    }
    r.ns[AFTER] = now() - t0;
    ut_item *tmp;
    HASH_ITER(hh, head, it, tmp)
    {
        HASH_DEL(head, it);
        free(it);
    }
    return r;
}

/* ---- genht ---- */
static unsigned int genht_hash(htip_key_t k)
{
    return (unsigned int)(pst_sparse_mix((uint64_t)k) >> 32);
}

static run run_genht(const uint64_t *keys, const uint64_t *order, const uint64_t *absent,
                     size_t n)
{
    run r = {0};
    htip_t *h = htip_alloc(genht_hash, htip_keyeq);
    double t0 = now();
    for (size_t i = 0; i < n; i++)
        htip_set(h, (htip_key_t)keys[i], (void *)(uintptr_t)(i + 1));
    r.ns[INSERT] = now() - t0;
    r.bytes = ((size_t)h->mask + 1) * sizeof(htip_entry_t);
    t0 = now();
    for (size_t i = 0; i < n; i++)
        r.check += (uintptr_t)htip_get(h, (htip_key_t)order[i]) - 1;
    r.ns[HIT] = now() - t0;
    t0 = now();
    for (size_t i = 0; i < n; i++)
        r.check += htip_get(h, (htip_key_t)absent[i]) == NULL;
    r.ns[MISS] = now() - t0;
    t0 = now();
    for (size_t i = 0; i < n; i += 2)
        htip_pop(h, (htip_key_t)keys[i]);
    r.ns[DELETE] = now() - t0;
    t0 = now();
    for (size_t i = 1; i < n; i += 2)
        r.check += (uintptr_t)htip_get(h, (htip_key_t)keys[i]) - 1;
    r.ns[AFTER] = now() - t0;
    htip_free(h);
    return r;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000000;
    const int runs = argc > 2 ? atoi(argv[2]) : 5;
    if (n < 2 || runs < 1 || runs > 64) {
        fprintf(stderr, "usage: bench_hashtable [N >= 2] [RUNS 1..64]\n");
        return 2;
    }
    uint64_t *keys = malloc(n * sizeof *keys), *order = malloc(n * sizeof *order),
             *absent = malloc(n * sizeof *absent);
    if (!keys || !order || !absent)
        return 2;
    pst_rng rng;
    pst_rng_seed(&rng, 1, 0);
    /* keys as the trainer makes them: a field id in the top byte, an id below; distinct */
    for (size_t i = 0; i < n; i++) {
        keys[i] = ((uint64_t)(i % 26) << 56) | (uint64_t)(i / 26) * 2;
        absent[i] = keys[i] + 1; /* odd ids: never inserted */
        order[i] = keys[i];
    }
    for (size_t i = n - 1; i > 0; i--) { /* shuffle both */
        size_t j = (size_t)pst_rng_below(&rng, i + 1);
        uint64_t t = keys[i];
        keys[i] = keys[j];
        keys[j] = t;
        j = (size_t)pst_rng_below(&rng, i + 1);
        t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    const char *names[3] = {"ours", "uthash", "genht"};
    run (*fns[3])(const uint64_t *, const uint64_t *, const uint64_t *, size_t) = {
        run_ours, run_uthash, run_genht};
    double ns[3][NOPS][64];
    size_t bytes[3] = {0};
    for (int k = 0; k < runs; k++)
        for (int t = 0; t < 3; t++) {
            run r = fns[t](keys, order, absent, n);
            bytes[t] = r.bytes;
            printf("{\"table\":\"%s\",\"run\":%d,\"keys\":%zu", names[t], k, n);
            for (int o = 0; o < NOPS; o++) {
                const double per = r.ns[o] * 1e9 / (double)(o == DELETE || o == AFTER ? n / 2 : n);
                ns[t][o][k] = per;
                printf(",\"%s_ns\":%.1f", op_names[o], per);
            }
            printf(",\"bytes\":%zu,\"check\":%llu}\n", r.bytes, (unsigned long long)r.check);
        }
    for (int t = 0; t < 3; t++) {
        printf("{\"median\":\"%s\",\"keys\":%zu,\"runs\":%d", names[t], n, runs);
        for (int o = 0; o < NOPS; o++) {
            qsort(ns[t][o], (size_t)runs, sizeof(double), cmp_double);
            printf(",\"%s_ns\":%.1f", op_names[o], ns[t][o][runs / 2]);
        }
        printf(",\"bytes_per_key\":%.1f}\n", (double)bytes[t] / (double)n);
    }
    free(keys);
    free(order);
    free(absent);
    return 0;
}
