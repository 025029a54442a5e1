/* ctr.c — planted-truth click-through data read as a stream (see ctr.h). */
#include "common/data/ctr.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const unsigned char *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static float rdf(const unsigned char *p)
{
    const uint32_t u = rd32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Reads exactly n bytes at off; a short read is the file's fault. */
static pst_status read_at(const pst_ctr *c, void *dst, size_t n, uint64_t off)
{
    for (size_t done = 0; done < n;) {
        const ssize_t r = pread(c->fd, (char *)dst + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return pst_error_set(PST_ERR_IO, "%s: %s", c->path, strerror(errno));
        if (r == 0)
            return pst_error_set(PST_ERR_FORMAT, "%s: ends at byte %llu, inside what its "
                                 "header announces", c->path,
                                 (unsigned long long)(off + done));
        done += (size_t)r;
    }
    return PST_OK;
}

pst_status pst_ctr_open(pst_ctr *c, const char *path)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    if (!path || !path[0] || strlen(path) >= sizeof c->path)
        return pst_error_set(PST_ERR_INVALID, "--data: a ctr file's path (example: --data "
                             "ctr.bin, written by scripts/ctr-synth)");
    snprintf(c->path, sizeof c->path, "%s", path);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        const int e = errno;
        return pst_error_set(e == ENOENT ? PST_ERR_NOT_FOUND : PST_ERR_IO, "%s: %s", path,
                             strerror(e));
    }
    if (!S_ISREG(sb.st_mode))
        return pst_error_set(PST_ERR_IO, "%s: not a regular file", path);
    if ((c->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return pst_error_set(PST_ERR_IO, "%s: %s", path, strerror(errno));
    unsigned char h[64];
    pst_status st = (size_t)sb.st_size < sizeof h
                        ? pst_error_set(PST_ERR_FORMAT, "%s: %lld bytes, shorter than the "
                                        "64-byte header of a ctr file", path,
                                        (long long)sb.st_size)
                        : read_at(c, h, sizeof h, 0);
    if (st == PST_OK && (memcmp(h, "PSTCTR01", 8) != 0 || rd32(h + 8) != 1))
        st = pst_error_set(PST_ERR_FORMAT, "%s: not a ctr file of version 1 (magic "
                           "\"PSTCTR01\", version 1; write one with scripts/ctr-synth)", path);
    if (st == PST_OK) {
        const uint32_t F = rd32(h + 12), D = rd32(h + 16);
        c->rows = rd64(h + 24);
        c->test_rows = rd64(h + 32);
        c->seed = rd64(h + 40);
        c->bayes_auc = rdf(h + 48);
        c->bayes_logloss = rdf(h + 52);
        if (F < 1 || F > PST_CTR_MAX_FIELDS || D > PST_CTR_MAX_DENSE)
            st = pst_error_set(PST_ERR_FORMAT, "%s: %u sparse fields and %u dense features, "
                               "want 1 to %d and 0 to %d", path, F, D, PST_CTR_MAX_FIELDS,
                               PST_CTR_MAX_DENSE);
        c->fields = (int)F;
        c->dense = (int)D;
        c->record = 8 + 4 * (size_t)D + 4 * (size_t)F;
    }
    const uint64_t head = 64 + 4 * (uint64_t)c->fields;
    if (st == PST_OK && (c->test_rows > c->rows || c->rows > ((uint64_t)1 << 40) ||
                         head + c->rows * c->record != (uint64_t)sb.st_size))
        st = pst_error_set(PST_ERR_FORMAT, "%s: %lld bytes, but its header says %llu rows "
                           "(%llu of them test) of %zu bytes after %llu: %llu bytes", path,
                           (long long)sb.st_size, (unsigned long long)c->rows,
                           (unsigned long long)c->test_rows, c->record,
                           (unsigned long long)head,
                           (unsigned long long)(head + c->rows * c->record));
    if (st == PST_OK && !(c->vocab = malloc(sizeof(uint32_t) * (size_t)c->fields)))
        st = pst_error_set(PST_ERR_NOMEM, "%s: out of memory", path);
    unsigned char *v = st == PST_OK ? malloc(4 * (size_t)c->fields) : NULL;
    if (st == PST_OK && !v)
        st = pst_error_set(PST_ERR_NOMEM, "%s: out of memory", path);
    if (st == PST_OK)
        st = read_at(c, v, 4 * (size_t)c->fields, 64);
    for (int f = 0; st == PST_OK && f < c->fields; f++)
        if ((c->vocab[f] = rd32(v + 4 * f)) == 0)
            st = pst_error_set(PST_ERR_FORMAT, "%s: field %d has an empty vocabulary", path, f);
    free(v);
    if (st != PST_OK) {
        pst_ctr_close(c);
        return st;
    }
    c->train_rows = c->rows - c->test_rows;
    return PST_OK;
}

void pst_ctr_close(pst_ctr *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c->vocab);
    memset(c, 0, sizeof *c);
    c->fd = -1;
}

pst_status pst_ctr_read(const pst_ctr *c, uint64_t first, size_t count, void *buf,
                        const pst_ctr_rows *out)
{
    if (first > c->rows || count > c->rows - first)
        return pst_error_set(PST_ERR_INVALID, "%s: rows [%llu, %llu) of %llu", c->path,
                             (unsigned long long)first,
                             (unsigned long long)(first + count), (unsigned long long)c->rows);
    PST_TRY(read_at(c, buf, count * c->record, 64 + 4 * (uint64_t)c->fields +
                                                    first * c->record));
    const int F = c->fields, D = c->dense;
    for (size_t i = 0; i < count; i++) {
        const unsigned char *r = (const unsigned char *)buf + i * c->record;
        if (r[0] > 1)
            return pst_error_set(PST_ERR_FORMAT, "%s: row %llu has label %u, want 0 or 1",
                                 c->path, (unsigned long long)(first + i), r[0]);
        out->label[i] = (float)r[0];
        if (out->p_true)
            out->p_true[i] = rdf(r + 4);
        for (int j = 0; j < D; j++)
            out->dense[i * (size_t)D + (size_t)j] = rdf(r + 8 + 4 * (size_t)j);
        for (int f = 0; f < F; f++) {
            const uint32_t id = rd32(r + 8 + 4 * (size_t)D + 4 * (size_t)f);
            if (id >= c->vocab[f])
                return pst_error_set(PST_ERR_FORMAT, "%s: row %llu field %d has id %u, its "
                                     "vocabulary has %u", c->path,
                                     (unsigned long long)(first + i), f, id, c->vocab[f]);
            out->ids[i * (size_t)F + (size_t)f] = id;
        }
    }
    return PST_OK;
}

static int ascending(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* A float's bits as an unsigned key in the float's order (negatives flipped). */
static uint32_t order_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

double pst_auc(const float *p, const float *y, size_t n, uint64_t *scratch)
{
    for (size_t i = 0; i < n; i++) /* the score's order in the high half, the row below */
        scratch[i] = (uint64_t)order_bits(p[i] == 0.0f ? 0.0f : p[i]) << 32 | (uint32_t)i;
    qsort(scratch, n, sizeof *scratch, ascending);
    double pos_rank_sum = 0.0, npos = 0.0;
    for (size_t s = 0; s < n;) { /* a run of equal scores shares the mean of its ranks */
        size_t e = s + 1;
        while (e < n && scratch[e] >> 32 == scratch[s] >> 32)
            e++;
        const double rank = (double)(s + e - 1) / 2.0 + 1.0;
        for (size_t k = s; k < e; k++)
            if (y[(uint32_t)scratch[k]] > 0.5f) {
                pos_rank_sum += rank;
                npos += 1.0;
            }
        s = e;
    }
    const double nneg = (double)n - npos;
    if (npos == 0.0 || nneg == 0.0)
        return NAN;
    return (pos_rank_sum - npos * (npos + 1.0) / 2.0) / (npos * nneg);
}

double pst_logloss(const float *p, const float *y, size_t n)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double q = fmin(fmax((double)p[i], 1e-12), 1.0 - 1e-12);
        sum -= y[i] > 0.5f ? log(q) : log(1.0 - q);
    }
    return n ? sum / (double)n : NAN;
}
