/* fuzz_util.h — what the fuzz targets share: a private temporary directory for the loaders
 * that read files by name, and the check that turns a broken invariant into a crash.
 *
 * Each target (fuzz/fuzz_<name>.c) defines LLVMFuzzerTestOneInput. Built with clang and
 * -DPSTRAIN_FUZZ=ON it links libFuzzer (make fuzz); in the normal build it links
 * fuzz/replay_main.c, which feeds it the corpus files (ctest label fuzz-replay).
 * Not for: production code; nothing here is linked into a pstrain program. */
#ifndef PST_FUZZ_UTIL_H
#define PST_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "common/hash.h"

/* The libFuzzer entry point every target defines: 0 always (bad input is an error status
 * of the code under test, never a crash). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A directory of this process, made on first use under $TMPDIR (or /tmp) and removed with
 * its files at exit. Aborts when it cannot be made (the harness cannot run). */
const char *fuzz_dir(void);

/* Writes data to fuzz_dir()/name (replacing it) and returns the full path (a static
 * buffer, valid until the next call). Aborts on a write failure. */
const char *fuzz_write(const char *name, const void *data, size_t size);

/* Silences pstrain's logger (warnings of rejected files would flood the fuzzer's output). */
void fuzz_quiet(void);

/* FNV-1a over n bytes, continuing from h (start with FUZZ_HASH_INIT). */
#define FUZZ_HASH_INIT PST_FNV1A_INIT
uint64_t fuzz_hash(uint64_t h, const void *p, size_t n);
uint64_t fuzz_hash_u64(uint64_t h, uint64_t v);
uint64_t fuzz_hash_str(uint64_t h, const char *s); /* NULL hashes as "" */

/* A harness invariant: prints `what` and aborts when cond is false, so the fuzzer (or the
 * replay) reports a crash with this input. */
#define FUZZ_CHECK(cond, what) fuzz_check_((cond) != 0, (what), __FILE__, __LINE__)
void fuzz_check_(int ok, const char *what, const char *file, int line);

#endif /* PST_FUZZ_UTIL_H */
