/* sparse_ckpt.h — a sparse table's checkpoints, full and delta, and its export for serving
 * (issue 31).
 *
 * A table's checkpoints are files DIR/step-<12 digits>.ckpt of common/checkpoint.h (atomic,
 * checksummed sections), each the table as of a step (every push of the steps before it
 * applied):
 *   'SPHD' the header: format 1, full or delta, the step, the step of the checkpoint a
 *          delta follows, the counters (rows created, evicted, pushes refused), the numbers
 *          of entries and tombstones, and the table's name, dim, optimizer and state floats
 *   'SPKY' u64 keys, 'SPPU' u32 pushes, 'SPLA' i64 last steps, 'SPHR' u8 has-a-row (0: a
 *          key waiting for admission), one each per entry
 *   'SPRW' f32 rows (values, then optimizer state) of the entries that have one
 *   'SPTB' u64 tombstones: keys evicted since the checkpoint a delta follows
 * A full file holds every entry; a delta only those pushed since the checkpoint before it
 * (last step >= that step), and the keys evicted since. Loading a step applies the newest
 * full file at or before it, then each delta after it in order (tombstones first), which
 * gives the entries, rows, optimizer state and counters the table had: training resumed
 * from it makes the bits of the run that never stopped.
 * Not thread safe per writer; the table's own locks guard the rows. */
#ifndef PST_PSERVER_SPARSE_CKPT_H
#define PST_PSERVER_SPARSE_CKPT_H

#include "common/error.h"
#include "pserver/sparse.h"

#define PST_SPARSE_CKPT_FULL_EVERY 8 /* a full file every 8 checkpoints, deltas between */

typedef struct pst_sparse_ckpt {
    char dir[4200];
    int keep;            /* checkpoints kept (>= 1): with the files their chains need */
    long last;           /* the step of the newest checkpoint (-1: none yet) */
    int deltas;          /* deltas written since the newest full */
    long full;           /* the newest full checkpoint's step (-1: none known) */
} pst_sparse_ckpt;

/* A writer for table t's checkpoints in dir (created when missing): starts the table's
 * removal log (pst_sparse_log_removals). resumed_at >= 0: t was loaded from dir's
 * checkpoint of that step (pst_sparse_ckpt_load), and the next file may follow it. */
void pst_sparse_ckpt_init(pst_sparse_ckpt *w, pst_sparse_table *t, const char *dir, int keep,
                          long resumed_at);
/* Writes t as of `step` (call between steps): a delta after the last, or a full file every
 * PST_SPARSE_CKPT_FULL_EVERY checkpoints (or when there is no earlier one, or the removal
 * log lost a key), then prunes what no kept checkpoint needs. Errors: PST_ERR_IO naming the
 * file, PST_ERR_NOMEM; on error no file of `step` exists and the next one is full. */
pst_status pst_sparse_ckpt_save(pst_sparse_ckpt *w, pst_sparse_table *t, long step);
/* Once every push of `step` is applied to t: its expired rows swept every
 * PST_SPARSE_SWEEP_EVERY steps (which changes no value), and with a writer (w non-NULL,
 * every > 0) a checkpoint of step + 1 when that is a multiple of every. Errors: those of
 * pst_sparse_ckpt_save. */
#define PST_SPARSE_SWEEP_EVERY 64
pst_status pst_sparse_step_done(pst_sparse_table *t, pst_sparse_ckpt *w, long every, long step);
/* Loads dir's checkpoint of `step` into t, which must be empty and have the checkpoint's
 * name, dim, optimizer, admission, eviction and row budget (PST_ERR_MISMATCH otherwise:
 * a resume with other settings would not give the bits). Applies the step's chain only,
 * whatever else the directory holds. Errors: PST_ERR_NOT_FOUND (a file of the chain is
 * missing), PST_ERR_FORMAT (a damaged file, named), PST_ERR_MISMATCH, PST_ERR_IO,
 * PST_ERR_NOMEM. */
pst_status pst_sparse_ckpt_load(const char *dir, long step, pst_sparse_table *t);
/* A new table made from dir's checkpoint of `step`: its name, dim, optimizer, admission,
 * eviction and row budget from the file, the rest sparse.h's defaults (for an export, not
 * for training on).
 * Errors: those of pst_sparse_ckpt_load, PST_ERR_FORMAT for settings out of range. */
pst_status pst_sparse_ckpt_open(const char *dir, long step, pst_sparse_table **out);
/* The steps of dir's checkpoints whose chain is whole (each file there and readable),
 * newest first, at most max. Reads the files. */
int pst_sparse_ckpt_steps(const char *dir, long *steps, int max);
/* Writes t's rows as of `step` for serving to path (atomically: path.tmp, then renamed):
 * "PSTEMB01", u32 dim, u32 0, u64 count, then count records of u64 key and dim f32
 * values, ascending by key (keys waiting for admission and rows expired by `step` have
 * none: a pull gets the initializer's values for them); *count = the records written.
 * Errors: PST_ERR_IO naming the file, PST_ERR_NOMEM. */
pst_status pst_sparse_export(pst_sparse_table *t, long step, const char *path, size_t *count);

#endif /* PST_PSERVER_SPARSE_CKPT_H */
