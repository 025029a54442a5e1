/* plan.h — the block plan: how the flat gradient buffer is cut into blocks, which pserver
 * owns each block and which local device owns it. Computed independently and identically
 * by every process from (nparams, block_bytes, npservers, ndevices); no communication.
 *
 * Cutting: nblocks = max(ceil(nparams / max_elems), min(npservers, nparams)) rounded up to
 * a multiple of npservers (where every block keeps at least one element) blocks of
 * near-equal length (the first nparams mod nblocks one element longer), in buffer order, so no block is
 * larger than block_bytes and every pserver gets work when there are enough parameters.
 * Placement: round robin, block i on pserver i mod npservers: with the rounding every
 * pserver gets the same number of blocks, and consecutive blocks are on different
 * pservers. Owner devices: blocks in order, each to the device with the fewest bytes so
 * far (ties to the lowest index).
 *
 * Pipelining (a job with pservers): train.c asks for blocks no larger than
 * tr_plan_pipelined_bytes(), so each pserver gets at least TR_PLAN_ROUNDS blocks. A step's
 * pushes then go out in rounds of one block per pserver, and the pulls of a round come
 * back while the next rounds are pushed, on the other direction of a full-duplex link:
 * the step is the link's bytes plus about one round, not twice the bytes. */
#ifndef TR_PLAN_H
#define TR_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

typedef struct tr_block {
    uint32_t id;        /* index in the plan */
    size_t offset;      /* first element in the flat buffer */
    size_t length;      /* elements */
    int pserver;        /* owning pserver, 0..npservers-1 */
    int owner_device;   /* owning local device, 0..ndevices-1: one of the holders */
    uint64_t holders;   /* bit d: local device d computes (part of) its gradient: every
                         * device, or a pipeline's stages that hold the block's tensors */
} tr_block;

/* A run of the flat buffer that the same local devices hold (a pipeline's stage, or the
 * tensors two stages share): tr_plan_build_segments never lets a block span two. */
typedef struct tr_plan_segment {
    size_t length;      /* elements */
    uint64_t holders;   /* bit d: device d holds it (not 0) */
} tr_plan_segment;

typedef struct tr_plan {
    size_t nparams;
    size_t block_bytes;
    int npservers;
    int ndevices;
    int nblocks;
    tr_block *blocks;       /* (nblocks), in buffer order */
    size_t *pserver_elems;  /* (npservers) elements owned by each pserver */
    size_t *device_elems;   /* (ndevices) elements owned by each device */
    size_t *device_held;    /* (ndevices) elements of the blocks each device holds */
} tr_plan;

/* Builds the plan for f32 parameters. Errors: PST_ERR_INVALID (nparams 0, block_bytes < 4,
 * npservers or ndevices < 1), PST_ERR_NOMEM. On error the plan is zeroed. */
pst_status tr_plan_build(tr_plan *p, size_t nparams, size_t block_bytes, int npservers,
                         int ndevices);
/* The plan of a buffer cut into segments in buffer order (nsegs >= 1, lengths > 0, adding
 * up to nparams): each segment is cut into near-equal blocks of at most block_bytes, so no
 * block spans two; at least one block per pserver (the longest blocks are halved until
 * there are). Blocks go to the pserver with the fewest elements so far and to the holder
 * with the fewest owned elements (ties: the lowest index). With one segment that every
 * device holds it is tr_plan_build's plan, block for block. Errors as tr_plan_build, plus
 * PST_ERR_INVALID for a segment of no elements, no holder or a holder past ndevices. */
pst_status tr_plan_build_segments(tr_plan *p, const tr_plan_segment *segs, int nsegs,
                                  size_t block_bytes, int npservers, int ndevices);
void tr_plan_free(tr_plan *p); /* accepts a zeroed plan */
/* The block that holds element `off` (< nparams) of the flat buffer. */
int tr_plan_block_at(const tr_plan *p, size_t off);

/* Blocks per pserver a job with pservers is cut into at least, and the smallest block
 * that rule makes (bytes of f32; below it a call's own cost outweighs the overlap). */
#define TR_PLAN_ROUNDS 32
#define TR_PLAN_MIN_BLOCK ((size_t)256 << 10)
/* The block_bytes a job with `npservers` pservers builds its plan with: block_bytes, or
 * less, so that every pserver gets TR_PLAN_ROUNDS blocks, but not below TR_PLAN_MIN_BLOCK.
 * npservers 0 (training alone): block_bytes. */
size_t tr_plan_pipelined_bytes(size_t nparams, size_t block_bytes, int npservers);
/* FNV-1a over the plan's numbers, continuing from `h` (start with 0). */
uint64_t tr_plan_fingerprint(const tr_plan *p, uint64_t h);
/* The plan's fingerprint and the settings every trainer (and a checkpoint) must share:
 * mode, trainers, optimizer and its schedule, precision, micro-batches. */
struct pst_config;
uint64_t tr_settings_fingerprint(const tr_plan *p, const struct pst_config *c);
/* The job's id: --job-id, else "job-" and 16 hex digits of the settings fingerprint with
 * the seed, trainers and global batch (what a resumed job must share). It names the job's
 * checkpoint subdirectory, DIR/<id>/job (trainer 0's job state) and DIR/<id>/pserver-<i>
 * (the shards), so two jobs in one DIR never prune each other's checkpoints. */
void tr_job_id(const tr_plan *p, const struct pst_config *c, char *out, size_t size);

#endif /* TR_PLAN_H */
