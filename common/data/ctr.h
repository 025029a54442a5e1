/* ctr.h — click-through data in the planted-truth format of ../shared/peers/ctr_synth.py
 * (issue 31's `--dataset ctr --data FILE`): Criteo-shaped rows of a label, the row's true
 * click probability, D dense features and F sparse field ids, with the Bayes-optimal AUC
 * and log loss of the test part in the header. Read as a stream: the file stays on disk
 * and a caller reads the rows it needs (a batch, a piece of the test part) into its own
 * buffer, so the trainer's memory does not grow with the file (2M rows are 328 MB).
 *
 * Format (little-endian): a 64-byte header (magic "PSTCTR01", u32 version 1, u32 F, u32 D,
 * u32 rank, u64 rows, u64 test_rows, u64 seed, f32 bayes_auc_test, f32
 * bayes_logloss_test, u32 reserved[2]); F u32 vocabulary sizes; rows records of (u8
 * label, 3 bytes 0, f32 p_true, f32 dense[D], u32 ids[F]); the training rows first, the
 * last test_rows the test part.
 *
 * Errors: PST_ERR_NOT_FOUND (no file), PST_ERR_IO (unreadable, a directory),
 * PST_ERR_FORMAT (another magic or version, sizes out of range, a size that disagrees
 * with the header, an id at or past its field's vocabulary, a label not 0 or 1: the
 * detail names the file, the row and the field), PST_ERR_INVALID (rows out of range),
 * PST_ERR_NOMEM. */
#ifndef PST_CTR_H
#define PST_CTR_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define PST_CTR_MAX_FIELDS 1024
#define PST_CTR_MAX_DENSE 1024

typedef struct pst_ctr {
    int fd;
    char path[512];
    int fields, dense;           /* F, D */
    uint32_t *vocab;             /* (F) */
    uint64_t rows, train_rows, test_rows, seed;
    float bayes_auc, bayes_logloss; /* of the test part, from the header */
    size_t record;               /* bytes of one row: 8 + 4 D + 4 F */
} pst_ctr;

/* A block of rows as the model reads them. */
typedef struct pst_ctr_rows {
    float *dense;    /* (count, D) */
    uint32_t *ids;   /* (count, F) field-local ids */
    float *label;    /* (count) 0 or 1 */
    float *p_true;   /* (count) the true click probability (may be NULL: not wanted) */
} pst_ctr_rows;

/* Opens `path` and reads its header and vocabularies; the rows stay in the file. *c is
 * overwritten on entry; zeroed on error. */
pst_status pst_ctr_open(pst_ctr *c, const char *path);
void pst_ctr_close(pst_ctr *c); /* accepts a zeroed one */
/* Rows [first, first + count) into out (count rows of each array), checked as they are
 * read (ids below their vocabularies, labels 0 or 1). buf is the caller's scratch of
 * count * c->record bytes (nothing is allocated). Thread safe on distinct outputs. */
pst_status pst_ctr_read(const pst_ctr *c, uint64_t first, size_t count, void *buf,
                        const pst_ctr_rows *out);
/* AUC of scores p (n, not NaN) for labels y (n, 0 or 1), ties averaged by rank (the
 * peer's definition); scratch holds n. NaN when a class is missing. Thread safe. */
double pst_auc(const float *p, const float *y, size_t n, uint64_t *scratch);
/* Mean binary cross-entropy of probabilities p against labels y, p clamped to
 * [1e-12, 1 - 1e-12] as the peer's eps. */
double pst_logloss(const float *p, const float *y, size_t n);

#endif /* PST_CTR_H */
