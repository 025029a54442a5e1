/* data.h — data sets for training: Fashion-MNIST / MNIST IDX files (gzipped or plain),
 * seeded shuffling, and the global-batch arithmetic every trainer shares.
 *
 * A data set keeps its pixels as uint8 (n, dim) and labels as uint8; batches are gathered
 * into float buffers scaled to [0, 1] (what the model reads).
 *
 * Distributed batching (identical on every process, no communication):
 *   epoch e's order is a permutation of [0, n) from a PRNG seeded with (seed, e);
 *   global batch b covers positions [b*B, min((b+1)*B, n)) of that order (the last batch
 *   of an epoch may be short; it is not dropped);
 *   trainer r of T takes the contiguous slice pst_batch_part(len, r, T) of each global
 *   batch, so the T slices, concatenated in trainer order, are the global batch.
 * Errors: PST_ERR_NOT_FOUND (missing file), PST_ERR_FORMAT (wrong magic, truncated,
 * dimension mismatch between images and labels), PST_ERR_IO (unreadable, a directory),
 * PST_ERR_NOMEM, PST_ERR_INVALID (empty or over-long name); the detail names the file
 * and the problem in one line. */
#ifndef PST_DATA_H
#define PST_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

typedef struct pst_dataset {
    int n;          /* examples */
    int dim;        /* features per example (784 for 28x28) */
    int nclasses;   /* 1 + largest label */
    uint8_t *x;     /* (n, dim) raw pixels */
    uint8_t *y;     /* (n) labels */
} pst_dataset;

/* Loads an IDX image file (magic 0x00000803) and label file (0x00000801). Each name is
 * tried as given, then with ".gz" appended, then with a trailing ".gz" removed; gzipped
 * and plain files are both read. The files must match their headers exactly (no missing
 * or extra bytes, a complete gzip stream) and hold the same number of examples; labels
 * may be any byte (nclasses = 1 + the largest). *ds is overwritten (not freed) on entry;
 * on success the caller frees it with pst_dataset_free, on error it is left zeroed. */
pst_status pst_dataset_load_idx(pst_dataset *ds, const char *images_path,
                                const char *labels_path);
/* Loads dir/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (Fashion-MNIST or MNIST).
 * The test split must have the training split's dim and no label beyond its classes.
 * Both outputs are overwritten on entry and left zeroed on error; dir NULL or "" is
 * PST_ERR_INVALID. */
pst_status pst_dataset_load_idx_dir(pst_dataset *train, pst_dataset *test, const char *dir);
/* The data set called `name` (--dataset) from dir: "fashion-mnist" or "mnist", both IDX
 * directories of 28x28 images in 10 classes. Errors: PST_ERR_INVALID for another name
 * (detail lists the known ones), PST_ERR_FORMAT when the files are not that shape, and
 * those of pst_dataset_load_idx_dir. */
pst_status pst_dataset_load(pst_dataset *train, pst_dataset *test, const char *name,
                            const char *dir);
void pst_dataset_free(pst_dataset *ds); /* accepts a zeroed or half-built one */

/* Number of global batches per epoch: ceil(n / batch); 0 when n <= 0 or batch <= 0. */
int pst_batches_per_epoch(int n, int batch);
/* Writes epoch `epoch`'s permutation of [0, n) into perm (n entries). Deterministic
 * function of (seed, epoch, n): Fisher-Yates (from the last position down) drawing from
 * pst_rng seeded with pst_rng_seed(&r, seed, 1000 + epoch). Does nothing when n <= 0. */
void pst_epoch_order(uint32_t *perm, int n, uint64_t seed, int epoch);
/* The slice [*lo, *hi) of a global batch of `len` rows that part `rank` of `nparts` takes:
 * contiguous, in rank order, sizes differ by at most one (lower ranks get the extra).
 * With more parts than rows the last parts are empty. Invalid arguments give [0, 0). */
void pst_batch_part(int len, int rank, int nparts, int *lo, int *hi);
/* Gathers rows idx[0..count) into x (count, dim) as float pixel / 255.0f in [0, 1] and y
 * (count), which may be NULL. Every idx[i] must be < ds->n; a row outside the data set
 * (a caller bug) is written as zeros with label -1 rather than read out of bounds.
 * Allocates nothing; thread safe for distinct outputs. */
void pst_dataset_gather(const pst_dataset *ds, const uint32_t *idx, int count, float *x,
                        int32_t *y);

#endif /* PST_DATA_H */
