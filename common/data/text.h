/* text.h — a text file as a character-level data set (bytes are tokens), with the rules of
 * the PyTorch peer (../shared/peers/torch_gpt.py), so the two can be compared:
 *   the vocabulary is the sorted set of the file's distinct bytes (token i is the i-th
 *   smallest byte); the first 90% of the bytes (floor) train, the rest validate;
 *   a training batch is B windows of T+1 tokens starting at offsets drawn uniformly from
 *   [0, n_train - T - 1); validation windows start at stride T from the validation part's
 *   start. Inputs are a window's first T tokens, targets its last T.
 * The draws of global step s come from pst_rng stream (seed, PST_TEXT_STREAM + s), the same
 * on every trainer; trainer r of T takes its slice of the global batch (data.h's
 * pst_batch_part), so the slices concatenated are the global batch.
 * Errors: PST_ERR_NOT_FOUND (missing file), PST_ERR_IO (unreadable, a directory),
 * PST_ERR_FORMAT (empty, or too short for the context: the validation part must hold one
 * window of T+1 and the training part two), PST_ERR_NOMEM; the detail names the file. */
#ifndef PST_TEXT_H
#define PST_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define PST_TEXT_STREAM 0x7465787400000000ull /* "text" */

typedef struct pst_text {
    uint8_t *tokens;    /* (n) token ids */
    size_t n, n_train;  /* tokens [0, n_train) train, [n_train, n) validate */
    int vocab;          /* distinct bytes */
    uint8_t bytes[256]; /* token id -> the byte it stands for */
} pst_text;

/* Loads `path` for context T. *t is overwritten on entry; zeroed on error. */
pst_status pst_text_load(pst_text *t, const char *path, int T);
void pst_text_free(pst_text *t); /* accepts a zeroed one */

/* Rows [lo, hi) of global step `step`'s batch of `global_B` windows: x and y (hi-lo, T). */
void pst_text_train_rows(const pst_text *t, int T, uint64_t seed, long step, int global_B,
                         int lo, int hi, int32_t *x, int32_t *y);
/* Validation windows available at stride T. */
int pst_text_val_windows(const pst_text *t, int T);
/* Validation windows [first, first + count) into x and y (count, T). */
void pst_text_val_rows(const pst_text *t, int T, int first, int count, int32_t *x, int32_t *y);

#endif /* PST_TEXT_H */
