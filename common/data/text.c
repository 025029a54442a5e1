/* text.c — a text file as a character-level data set (see text.h). */
#include "common/data/text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/rng.h"

pst_status pst_text_load(pst_text *t, const char *path, int T)
{
    memset(t, 0, sizeof *t);
    if (!path || !path[0])
        return pst_error_set(PST_ERR_INVALID, "text data: no file named (example: --data "
                             "corpus.txt)");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return pst_error_set(errno == ENOENT ? PST_ERR_NOT_FOUND : PST_ERR_IO,
                             "%s: cannot open the text file (%s)%s", path, strerror(errno),
                             strstr(path, "kjv") ? "; scripts/deps.sh writes it from Debian's "
                                                   "bible-kjv" : "");
    if (S_ISDIR(sb.st_mode))
        return pst_error_set(PST_ERR_IO, "%s: is a directory, expected a text file", path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return pst_error_set(PST_ERR_IO, "%s: cannot open the text file (%s)", path,
                             strerror(errno));
    /* the whole file, as stat sized it */
    const size_t n = (size_t)sb.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    const size_t got = buf ? fread(buf, 1, n, f) : 0;
    fclose(f);
    if (!buf)
        return pst_error_set(PST_ERR_NOMEM, "%s: out of memory for %zu bytes", path, n);
    if (got != n) {
        free(buf);
        return pst_error_set(PST_ERR_IO, "%s: read %zu of its %zu bytes", path, got, n);
    }
    if (n == 0) {
        free(buf);
        return pst_error_set(PST_ERR_FORMAT, "%s: the text file is empty", path);
    }
    const size_t n_train = n * 9 / 10;
    /* the validation part holds a window of T+1, the training part an offset range */
    if (T < 1 || n - n_train < (size_t)T + 1 || n_train < (size_t)T + 2) {
        free(buf);
        return pst_error_set(PST_ERR_FORMAT, "%s: %zu bytes is too short for context %d (its "
                             "last 10%% must hold %d + 1 bytes: at least %zu bytes)", path, n,
                             T, T, (size_t)(T + 1) * 10 + 10);
    }
    int seen[256] = {0};
    for (size_t i = 0; i < n; i++)
        seen[buf[i]] = 1;
    uint8_t id[256];
    for (int b = 0; b < 256; b++)
        if (seen[b]) {
            id[b] = (uint8_t)t->vocab;
            t->bytes[t->vocab++] = (uint8_t)b;
        }
    for (size_t i = 0; i < n; i++)
        buf[i] = id[buf[i]];
    t->tokens = buf;
    t->n = n;
    t->n_train = n_train;
    return PST_OK;
}

void pst_text_free(pst_text *t)
{
    if (!t)
        return;
    free(t->tokens);
    memset(t, 0, sizeof *t);
}

static void window(const pst_text *t, size_t off, int T, int32_t *x, int32_t *y)
{
    for (int i = 0; i < T; i++) {
        x[i] = t->tokens[off + i];
        y[i] = t->tokens[off + i + 1];
    }
}

void pst_text_train_rows(const pst_text *t, int T, uint64_t seed, long step, int global_B,
                         int lo, int hi, int32_t *x, int32_t *y)
{
    pst_rng r;
    pst_rng_seed(&r, seed, PST_TEXT_STREAM + (uint64_t)step);
    const uint64_t range = t->n_train - (size_t)T - 1;
    for (int b = 0; b < global_B && b < hi; b++) {
        const uint64_t off = pst_rng_below(&r, range); /* every row drawn: the same sequence */
        if (b >= lo)
            window(t, (size_t)off, T, x + (size_t)(b - lo) * T, y + (size_t)(b - lo) * T);
    }
}

int pst_text_val_windows(const pst_text *t, int T)
{
    const size_t n_val = t->n - t->n_train;
    return T > 0 && n_val > 0 ? (int)((n_val - 1) / (size_t)T) : 0;
}

void pst_text_val_rows(const pst_text *t, int T, int first, int count, int32_t *x, int32_t *y)
{
    for (int i = 0; i < count; i++)
        window(t, t->n_train + (size_t)(first + i) * T, T, x + (size_t)i * T, y + (size_t)i * T);
}
