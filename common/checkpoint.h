/* checkpoint.h — checkpoint files: atomic, in checksummed sections, one per step.
 *
 * A file is DIR/step-<12 digits>.ckpt:
 *   "PSTCKPT1" | u64 step | u32 sections | sections... | "PSTEND!!"
 *   section:   u32 tag | u64 bytes | u32 CRC-32 of the bytes (zlib's crc32) | bytes
 * (little-endian). Written to a temporary file in DIR, fsync'ed, renamed over its name and
 * the directory fsync'ed: a reader sees a whole file or none. Every read checks the magic,
 * the step in the name, each section's length against the file and its checksum, and the
 * end marker: a truncated or corrupted file is one error line naming the file and what is
 * wrong. Used by the pservers' shards (pserver/shard.h) and the trainer's job state.
 * Not thread safe per object; files of different steps may be written concurrently. */
#ifndef PST_CHECKPOINT_H
#define PST_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/error.h"

#define PST_CKPT_MAX_SECTIONS 16

typedef struct pst_ckpt_writer {
    FILE *f;
    char dir[4096], tmp[4160], path[4160];
    long step;
    uint32_t nsections;
} pst_ckpt_writer;

/* Starts DIR/step-<step>.ckpt (creating DIR and its parents when missing). Errors:
 * PST_ERR_IO naming the directory or file and why (strerror). */
pst_status pst_ckpt_begin(pst_ckpt_writer *w, const char *dir, long step);
/* Appends a section. Errors: PST_ERR_IO, PST_ERR_INVALID (too many sections). */
pst_status pst_ckpt_section(pst_ckpt_writer *w, uint32_t tag, const void *data, size_t bytes);
/* Makes the file whole and visible (flush, fsync, rename, fsync DIR). Errors: PST_ERR_IO;
 * on error the temporary file is removed and an earlier file of that name is untouched. */
pst_status pst_ckpt_commit(pst_ckpt_writer *w);
/* Drops an unfinished file (accepts one that failed or was never begun). */
void pst_ckpt_abort(pst_ckpt_writer *w);

typedef struct pst_ckpt {
    void *buf;      /* the whole file */
    size_t size;
    long step;
    int nsections;
    struct {
        uint32_t tag;
        const void *data;
        uint64_t bytes;
    } sec[PST_CKPT_MAX_SECTIONS];
} pst_ckpt;

/* Reads and checks DIR/step-<step>.ckpt. Errors: PST_ERR_NOT_FOUND (no such file),
 * PST_ERR_FORMAT (truncated, corrupted: the detail names the file and the problem),
 * PST_ERR_IO, PST_ERR_NOMEM. On error *c is zeroed. */
pst_status pst_ckpt_read(pst_ckpt *c, const char *dir, long step);
/* The section with `tag` (its bytes in *bytes), or NULL. The bytes lie in the file as
 * written, with no alignment: copy a struct or an array of wider types out (memcpy) rather
 * than reading it through a cast pointer. */
const void *pst_ckpt_find(const pst_ckpt *c, uint32_t tag, uint64_t *bytes);
void pst_ckpt_free(pst_ckpt *c); /* accepts a zeroed one */

/* The steps of DIR's checkpoint files, newest first, at most `max` (by name: not read).
 * A missing DIR has none. Returns how many. */
int pst_ckpt_list(const char *dir, long *steps, int max);
/* Removes all but the `keep` newest (keep >= 1). Errors: PST_ERR_IO. */
pst_status pst_ckpt_prune(const char *dir, int keep);

#endif /* PST_CHECKPOINT_H */
