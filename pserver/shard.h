/* shard.h — a pserver's checkpoint shard: its blocks' fp32 master values, optimizer state
 * and version, with the plan fingerprint and block list they belong to, as a checkpoint
 * file (common/checkpoint.h) DIR/step-<version>.ckpt. Used by the pserver service and by
 * the trainer's in-process store when it trains alone (trainer/local.c).
 * Not thread safe per directory. */
#ifndef PS_SHARD_H
#define PS_SHARD_H

#include <stdint.h>

#include "common/error.h"
#include "pserver/store.h"

/* What a shard must match to be loaded. */
typedef struct ps_shard_layout {
    uint64_t fingerprint;       /* the plan and settings (trainer 0's) */
    const ps_block_spec *specs; /* (nblocks) in the store's order */
    int nblocks;
    uint64_t total;             /* elements: the sum of the lengths */
    int nstate;                 /* optimizer state floats per element */
} ps_shard_layout;

/* An async store's shard also holds each block's version and each trainer's last step
 * applied to it (ps_store_read_async's layout: last_steps[t * nblocks + i]). */
typedef struct ps_shard_async {
    int ntrainers;
    int64_t *versions;   /* (nblocks) */
    int64_t *last_steps; /* (ntrainers x nblocks) */
} ps_shard_async;

/* Writes the shard of `version` (values: total, state: nstate x length per block, NULL
 * when nstate is 0; as: an async store's versions and steps, NULL for sync) and keeps the
 * `keep` newest. Errors: PST_ERR_IO naming the file. */
pst_status ps_shard_save(const char *dir, int64_t version, const ps_shard_layout *lay,
                         const float *values, const float *state, const ps_shard_async *as,
                         int keep);

/* The newest of `candidates` (any order) whose shard in dir is whole, checksummed and of
 * this layout: its values and state are read into values/state (sized as for save) and
 * its version returned; a candidate whose file is missing, damaged or of another plan is
 * skipped with one warning line naming the file and the problem. -1: none. */
int64_t ps_shard_pick(const char *dir, const int64_t *candidates, int n,
                      const ps_shard_layout *lay, float *values, float *state,
                      ps_shard_async *as);
/* ps_shard_pick of every shard in dir (async: no common step to offer): as must be given,
 * and the shard must hold its versions and steps for as->ntrainers trainers. */
int64_t ps_shard_pick_newest(const char *dir, const ps_shard_layout *lay, float *values,
                             float *state, ps_shard_async *as);

#endif /* PS_SHARD_H */
