/* ctr_synth.h — planted-truth click data written by pstrain itself (scripts/ctr-synth): the
 * generative process of ../shared/peers/ctr_synth.py, in the file format common/data/ctr.h
 * reads, for users without the peer (issue 31). Not the peer's bytes: the process and the
 * format are the same, the random numbers are ours.
 *
 * The process. Field f (of F) has V_f ids, V_f = geomspace(min_vocab, max_vocab, F)[f]
 * truncated (numpy's geomspace: the ends exact, pow(10, log10 steps) between). A row's id of
 * field f is a truncated Zipf(zipf) rank over 1..V_f mapped through a random permutation of
 * the field's ids; every id has a true weight s[f,i] ~ N(0, 0.2^2) and a true vector
 * v[f,i] ~ N(0, 0.25^2 I_k); x ~ N(0, 1) dense features (stored as drawn, f32), w ~
 * N(0, 0.15^2); logit = b + sum_f s[f,id_f] + sum over `pairs` random distinct field pairs
 * of <v[f,id_f], v[g,id_g]> + w.x, b found by 60 bisections on [-20, 20] so the mean of
 * sigmoid(logit) is `ctr`; label ~ Bernoulli(sigmoid(logit)), p_true = sigmoid(logit). The
 * last round(rows * test_frac) rows are the test part; the header carries their Bayes AUC
 * (pst_auc of the stored p_true: ties averaged by ranks) and log loss (pst_logloss).
 *
 * DESIGN. Nothing is sized by a vocabulary, so --max-vocab 10^8 costs what 10^6 does: s and
 * v of id i are drawn from a pst_rng seeded by (seed, f, i) whenever a row needs them, the
 * permutation is a 4-round Feistel network on the smallest even number of bits that holds
 * V_f with cycle walking (a bijection of [0, V_f) from 4 keys), and the Zipf ranks come from
 * rejection-inversion (Hormann & Derflinger 1996, as Apache Commons RNG's
 * RejectionInversionZipfSampler): exact, O(1) memory and time per draw (rejections are
 * rare). The ids, s and v of each field's first 4,096 ranks (most draws) are kept: the same
 * numbers, computed once. Each row draws from its own pst_rng seeded by (seed, row), so the
 * rows are made in two passes by any number of threads with the same bytes: the first
 * keeps each row's logit (8 bytes a row) for the bisection, the second draws the row again
 * and streams it to the file. The distinct ids of the training part are counted per field
 * in a bitmap of V_f bits or, when that is larger, a sorted list of the training rows' ids.
 * Determinism: integer arithmetic and IEEE + - * / sqrt (no contraction under -std=c11) give
 * the same bits everywhere; log, exp, log1p, expm1 and pow come from the C library. glibc's
 * are within an ulp of the exact result and differ between libms (and between glibc's FMA
 * and plain variants) only in rare last bits, which can, rarely, turn a Zipf draw or a
 * label the other way: the same bytes are promised for the same build and libm. */
#ifndef PST_CTR_SYNTH_H
#define PST_CTR_SYNTH_H

#include <stdint.h>

#include "common/error.h"

typedef struct pst_ctr_synth_config {
    uint64_t rows;                  /* training and test rows, 1 to 2^40 */
    double test_frac;               /* in (0, 1), leaving at least one row on each side */
    int fields, dense, rank, pairs; /* F (1 to 1024), D (0 to 1024), k (0 to 1024), pairs >= 0 */
    uint64_t min_vocab, max_vocab;  /* 1 <= min <= max < 2^32 */
    double zipf;                    /* Zipf exponent, 0 (uniform) to 100 */
    double ctr;                     /* the mean click probability wanted, in (0, 1) */
    uint64_t seed;
    int threads;                    /* 0: one per online CPU; the bytes do not depend on it */
} pst_ctr_synth_config;

/* What was written (the peer's JSON line). */
typedef struct pst_ctr_synth_stats {
    uint64_t rows, test_rows;
    uint64_t vocab_total;        /* sum of V_f */
    uint64_t distinct_ids_train; /* distinct (field, id) pairs of the training rows */
    double ctr;                  /* the mean label */
    double bayes_auc, bayes_logloss; /* of the test part, as in the header (before the f32) */
} pst_ctr_synth_stats;

/* The peer's defaults: 2,000,000 rows, test_frac 0.1, 26 fields, 13 dense, rank 4, 40
 * pairs, vocabularies 10 to 10^6, zipf 1.1, ctr 0.25, seed 1, threads 0. */
void pst_ctr_synth_defaults(pst_ctr_synth_config *cfg);

/* PST_ERR_INVALID with a one-line detail naming the flag (--rows, --test-frac, ...) when a
 * setting is out of the ranges above. */
pst_status pst_ctr_synth_check(const pst_ctr_synth_config *cfg);

/* Writes the file at `path` (created or truncated; opened before any work, so an
 * unwritable path fails at once) and fills *stats when not NULL. Memory: 9 bytes a row,
 * 1 MB of rows per thread, 4,096 (k + 1) doubles per field, and for the distinct count per
 * field the smaller of V_f / 8 and 4 x training rows bytes. Errors: those of
 * pst_ctr_synth_check, PST_ERR_IO (the detail names the path; a partly written file is
 * removed), PST_ERR_NOMEM. Blocks until the file is written; thread safe (it touches no
 * global state). */
pst_status pst_ctr_synth_write(const char *path, const pst_ctr_synth_config *cfg,
                               pst_ctr_synth_stats *stats);

#endif /* PST_CTR_SYNTH_H */
