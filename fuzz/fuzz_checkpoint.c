/* fuzz_checkpoint.c — the checkpoint reader (common/checkpoint.c: pst_ckpt_read) and the
 * pserver's shard loader on it (pserver/shard.c: ps_shard_pick).
 *
 * Input: the whole file, written as DIR/step-000000000007.ckpt and read as step 7. A read
 * that succeeds must give sections inside the file (ASan checks every byte: each is
 * hashed); the shard loader then tries it against two layouts (FUZZ_LAYOUT below, with 2
 * and with 0 optimizer state floats per element), and a shard it accepts must be one that
 * the writer (ps_shard_save) would write for that layout. fuzz/gen_corpus.c writes the
 * seeds with these layouts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "fuzz/fuzz_util.h"
#include "pserver/shard.h"

#define FUZZ_STEP 7
#define FUZZ_FINGERPRINT 0x5eedf00dcafe0001ull

static const ps_block_spec specs[2] = {{.id = 0, .offset = 0, .length = 3},
                                       {.id = 1, .offset = 3, .length = 2}};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    if (!init) {
        fuzz_quiet();
        init = 1;
    }
    char name[64];
    snprintf(name, sizeof name, "step-%012d.ckpt", FUZZ_STEP);
    fuzz_write(name, data, size);

    pst_ckpt c;
    pst_status st = pst_ckpt_read(&c, fuzz_dir(), FUZZ_STEP);
    if (st != PST_OK) {
        FUZZ_CHECK(c.buf == NULL && c.nsections == 0, "a failed read leaves it zeroed");
        FUZZ_CHECK(st == PST_ERR_FORMAT, "a bad checkpoint file is PST_ERR_FORMAT");
        FUZZ_CHECK(pst_error_detail()[0] != '\0', "a failed read says why");
    } else {
        FUZZ_CHECK(c.step == FUZZ_STEP && c.nsections >= 0 &&
                       c.nsections <= PST_CKPT_MAX_SECTIONS && c.size == size,
                   "a read file is whole");
        uint64_t h = FUZZ_HASH_INIT;
        for (int i = 0; i < c.nsections; i++) {
            uint64_t bytes;
            const void *p = pst_ckpt_find(&c, c.sec[i].tag, &bytes);
            FUZZ_CHECK(p != NULL, "a section is found by its tag");
            h = fuzz_hash(h, c.sec[i].data, (size_t)c.sec[i].bytes);
        }
        (void)h;
        pst_ckpt_free(&c);
    }

    for (int nstate = 2; nstate >= 0; nstate -= 2) {
        const ps_shard_layout lay = {.fingerprint = FUZZ_FINGERPRINT, .specs = specs,
                                     .nblocks = 2, .total = 5, .nstate = nstate};
        float values[5], state[10];
        const int64_t candidates[2] = {FUZZ_STEP, 3}; /* step 3: no such file */
        const int64_t got = ps_shard_pick(fuzz_dir(), candidates, 2, &lay, values, state,
                                          NULL);
        FUZZ_CHECK(got == -1 || (got == FUZZ_STEP && st == PST_OK),
                   "a shard is picked only from a whole file");
        /* an async store's shard: its versions and 2 trainers' steps as well */
        int64_t versions[2], steps[4];
        ps_shard_async as = {.ntrainers = 2, .versions = versions, .last_steps = steps};
        const int64_t got_async = ps_shard_pick(fuzz_dir(), candidates, 2, &lay, values, state,
                                                &as);
        FUZZ_CHECK(got_async == -1 || (got_async == FUZZ_STEP && st == PST_OK),
                   "an async shard is picked only from a whole file");
    }
    return 0;
}
