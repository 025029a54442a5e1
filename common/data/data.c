/* data.c — IDX data sets (Fashion-MNIST / MNIST), epoch shuffling and batch arithmetic
 * (see data.h).
 *
 * DESIGN: files are read through zlib's gzopen/gzread, which decompress gzip files and
 * pass plain files through unchanged, so "train-images-idx3-ubyte" and its ".gz" are read
 * by the same code. The name given is tried as is, then with ".gz" added, then with a
 * trailing ".gz" removed. Everything in a file is distrusted: the magic, every dimension
 * and the exact length (nothing missing, nothing after the data) are checked, and the
 * pixel buffer grows as bytes actually arrive instead of being sized from the header, so
 * a corrupt header cannot make us allocate gigabytes for a file of a few bytes.
 * Not for: other IDX element types (int, float) or data sets that do not fit in memory. */
#include "common/data/data.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "common/rng.h"

#define IDX_MAGIC_IMAGES 0x00000803u /* unsigned bytes, 3 dimensions (n, rows, cols) */
#define IDX_MAGIC_LABELS 0x00000801u /* unsigned bytes, 1 dimension (n) */
#define READ_CHUNK (1u << 20)        /* bytes per gzread call */
#define FIRST_ALLOC ((size_t)1 << 24) /* the pixel buffer starts here and doubles */

/* An open IDX file: the name actually opened (for every error detail) and its stream. */
typedef struct idx_file {
    char path[PATH_MAX];
    gzFile gz;
    int cut; /* the gzip stream ended before its end marker and checksum */
} idx_file;

static int ends_with_gz(const char *s)
{
    size_t n = strlen(s);
    return n >= 3 && strcmp(s + n - 3, ".gz") == 0;
}

/* Opens `path`, `path`.gz or `path` without ".gz", the first that exists. */
static pst_status idx_open(idx_file *f, const char *path)
{
    char cand[3][PATH_MAX];
    int ncand = 0;
    struct stat sb;

    f->gz = NULL;
    f->cut = 0;
    f->path[0] = '\0';
    if (!path || !path[0])
        return pst_error_set(PST_ERR_INVALID, "data file name is empty");
    size_t len = strlen(path);
    if (len + 4 > PATH_MAX)
        return pst_error_set(PST_ERR_INVALID, "%.200s...: data file name is too long", path);
    snprintf(cand[ncand++], PATH_MAX, "%s", path);
    snprintf(cand[ncand++], PATH_MAX, "%s.gz", path);
    if (ends_with_gz(path))
        snprintf(cand[ncand++], PATH_MAX, "%.*s", (int)(len - 3), path);

    for (int i = 0; i < ncand; i++) {
        if (stat(cand[i], &sb) != 0) {
            if (errno == ENOENT || errno == ENOTDIR)
                continue;
            return pst_error_set(PST_ERR_IO, "%s: %s", cand[i], strerror(errno));
        }
        snprintf(f->path, sizeof f->path, "%s", cand[i]);
        if (S_ISDIR(sb.st_mode))
            return pst_error_set(PST_ERR_IO, "%s: is a directory, expected an IDX file",
                                 f->path);
        errno = 0;
        f->gz = gzopen(f->path, "rb");
        if (!f->gz) {
            if (errno == ENOMEM || errno == 0)
                return pst_error_set(PST_ERR_NOMEM, "%s: no memory to open the file",
                                     f->path);
            return pst_error_set(PST_ERR_IO, "%s: %s", f->path, strerror(errno));
        }
        gzbuffer(f->gz, 1u << 17); /* fewer, larger reads than the 8 KiB default */
        return PST_OK;
    }
    snprintf(f->path, sizeof f->path, "%s", path);
    if (ends_with_gz(path))
        return pst_error_set(PST_ERR_NOT_FOUND,
                             "%s: no such file (nor %s); install dataset-fashion-mnist or "
                             "pass --data DIR",
                             path, cand[2]);
    return pst_error_set(PST_ERR_NOT_FOUND,
                         "%s: no such file (nor %s); install dataset-fashion-mnist or pass "
                         "--data DIR",
                         path, cand[1]);
}

static void idx_close(idx_file *f)
{
    if (f->gz)
        gzclose(f->gz);
    f->gz = NULL;
}

/* Reads up to `want` bytes into buf; *got is how many arrived before the end of the data.
 * A stream that stops early (plain file too short, gzip cut off) is not an error here:
 * the caller reports it with the count. Corrupt compressed data and read errors are. */
static pst_status idx_read(idx_file *f, void *buf, size_t want, size_t *got)
{
    *got = 0;
    while (*got < want) {
        size_t ask = want - *got < READ_CHUNK ? want - *got : READ_CHUNK;
        int n = gzread(f->gz, (char *)buf + *got, (unsigned)ask);
        if (n < 0)
            break;
        *got += (size_t)n;
        if (n == 0)
            break;
    }
    int zerr = Z_OK;
    const char *msg = gzerror(f->gz, &zerr);
    switch (zerr) {
    case Z_OK:
        return PST_OK;
    case Z_BUF_ERROR: /* "unexpected end of file": a cut gzip stream */
        f->cut = 1;
        return PST_OK;
    case Z_ERRNO:
        return pst_error_set(PST_ERR_IO, "%s: %s", f->path, strerror(errno));
    case Z_MEM_ERROR:
        return pst_error_set(PST_ERR_NOMEM, "%s: out of memory decompressing", f->path);
    default: {
        /* gzerror's message starts with the path; keep only the reason. */
        size_t plen = strlen(f->path);
        if (msg && strncmp(msg, f->path, plen) == 0 && strncmp(msg + plen, ": ", 2) == 0)
            msg += plen + 2;
        return pst_error_set(PST_ERR_FORMAT, "%s: corrupt gzip data (%s)", f->path,
                             msg && msg[0] ? msg : "zlib error");
    }
    }
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads and checks an IDX header of `ndims` dimensions with the given magic. */
static pst_status idx_header(idx_file *f, uint32_t magic, int ndims, uint32_t *dims,
                             const char *what)
{
    unsigned char hdr[16];
    size_t want = 4 + 4 * (size_t)ndims, got;

    PST_TRY(idx_read(f, hdr, want, &got));
    if (got == 0 && f->cut)
        return pst_error_set(PST_ERR_FORMAT, "%s: truncated: gzip stream ends before any "
                             "data, expected IDX %s", f->path, what);
    if (got == 0)
        return pst_error_set(PST_ERR_FORMAT, "%s: empty file, expected IDX %s", f->path,
                             what);
    if (got >= 4 && be32(hdr) != magic)
        return pst_error_set(PST_ERR_FORMAT,
                             "%s: wrong magic 0x%08x, expected 0x%08x (IDX %s); is it the "
                             "right file?",
                             f->path, be32(hdr), magic, what);
    if (got < want)
        return pst_error_set(PST_ERR_FORMAT,
                             "%s: truncated: expected a %zu-byte IDX header, got %zu bytes",
                             f->path, want, got);
    for (int i = 0; i < ndims; i++)
        dims[i] = be32(hdr + 4 + 4 * i);
    return PST_OK;
}

/* Reads exactly `size` bytes of `what` into a new buffer (*out, caller frees), then checks
 * that the file ends there. The buffer grows with the data actually read. */
static pst_status idx_body(idx_file *f, size_t size, const char *what, uint8_t **out)
{
    pst_status st;
    uint8_t *buf = NULL;
    size_t cap = size < FIRST_ALLOC ? size : FIRST_ALLOC, have = 0, got;
    unsigned char extra;

    *out = NULL;
    buf = malloc(cap ? cap : 1);
    if (!buf) {
        st = pst_error_set(PST_ERR_NOMEM, "%s: cannot allocate %zu bytes of %s", f->path,
                           cap, what);
        goto error;
    }
    for (;;) {
        st = idx_read(f, buf + have, cap - have, &got);
        if (st != PST_OK)
            goto error;
        have += got;
        if (have < cap || cap == size)
            break; /* the file ended, or everything expected has arrived */
        size_t ncap = cap > size / 2 ? size : 2 * cap;
        uint8_t *nbuf = realloc(buf, ncap);
        if (!nbuf) {
            st = pst_error_set(PST_ERR_NOMEM, "%s: cannot allocate %zu bytes of %s",
                               f->path, ncap, what);
            goto error;
        }
        buf = nbuf;
        cap = ncap;
    }
    if (have < size) {
        st = pst_error_set(PST_ERR_FORMAT, "%s: truncated: expected %zu bytes of %s, got %zu",
                           f->path, size, what, have);
        goto error;
    }
    st = idx_read(f, &extra, 1, &got);
    if (st != PST_OK)
        goto error;
    if (got != 0) {
        st = pst_error_set(PST_ERR_FORMAT,
                           "%s: unexpected data after the %zu bytes of %s the header "
                           "announces",
                           f->path, size, what);
        goto error;
    }
    if (f->cut) {
        /* All the data arrived but the stream stops before its end and CRC: a cut copy. */
        st = pst_error_set(PST_ERR_FORMAT,
                           "%s: truncated: gzip stream ends early (after the %zu bytes of "
                           "%s, before its checksum)",
                           f->path, size, what);
        goto error;
    }
    *out = buf;
    return PST_OK;

error:
    free(buf);
    return st;
}

/* Loads an IDX image file: (n, rows, cols) unsigned bytes. */
static pst_status load_images(const char *path, int *n, int *dim, uint8_t **x,
                              char *opened, size_t opened_size)
{
    pst_status st;
    idx_file f = {.gz = NULL, .cut = 0};
    uint32_t dims[3];

    st = idx_open(&f, path);
    snprintf(opened, opened_size, "%s", f.path);
    if (st != PST_OK)
        goto out;
    st = idx_header(&f, IDX_MAGIC_IMAGES, 3, dims, "images");
    if (st != PST_OK)
        goto out;
    if (dims[0] == 0 || dims[1] == 0 || dims[2] == 0) {
        st = pst_error_set(PST_ERR_FORMAT, "%s: empty dimension in header (%u x %u x %u)",
                           f.path, dims[0], dims[1], dims[2]);
        goto out;
    }
    uint64_t pixels = (uint64_t)dims[1] * dims[2];
    if (dims[0] > INT_MAX || pixels > INT_MAX || dims[0] * pixels > SIZE_MAX / 2) {
        st = pst_error_set(PST_ERR_FORMAT, "%s: header announces %u x %u x %u images, too "
                           "large to be real",
                           f.path, dims[0], dims[1], dims[2]);
        goto out;
    }
    st = idx_body(&f, (size_t)(dims[0] * pixels), "pixels", x);
    if (st != PST_OK)
        goto out;
    *n = (int)dims[0];
    *dim = (int)pixels;
out: /* st is PST_OK where no check failed */
    idx_close(&f);
    return st;
}

/* Loads an IDX label file: (n) unsigned bytes. */
static pst_status load_labels(const char *path, int *n, uint8_t **y, char *opened,
                              size_t opened_size)
{
    pst_status st;
    idx_file f = {.gz = NULL, .cut = 0};
    uint32_t count = 0;

    st = idx_open(&f, path);
    snprintf(opened, opened_size, "%s", f.path);
    if (st != PST_OK)
        goto out;
    st = idx_header(&f, IDX_MAGIC_LABELS, 1, &count, "labels");
    if (st != PST_OK)
        goto out;
    if (count == 0 || count > INT_MAX) {
        st = pst_error_set(PST_ERR_FORMAT, "%s: header announces %u labels", f.path, count);
        goto out;
    }
    st = idx_body(&f, count, "labels", y);
    if (st != PST_OK)
        goto out;
    *n = (int)count;
out: /* st is PST_OK where no check failed */
    idx_close(&f);
    return st;
}

pst_status pst_dataset_load_idx(pst_dataset *ds, const char *images_path,
                                const char *labels_path)
{
    pst_status st;
    char images_opened[PATH_MAX], labels_opened[PATH_MAX];
    int nlabels = 0;

    memset(ds, 0, sizeof *ds);
    st = load_images(images_path, &ds->n, &ds->dim, &ds->x, images_opened,
                     sizeof images_opened);
    if (st != PST_OK)
        goto error;
    st = load_labels(labels_path, &nlabels, &ds->y, labels_opened, sizeof labels_opened);
    if (st != PST_OK)
        goto error;
    if (nlabels != ds->n) {
        st = pst_error_set(PST_ERR_FORMAT, "%s: %d labels, but %s has %d images",
                           labels_opened, nlabels, images_opened, ds->n);
        goto error;
    }
    /* Any byte is a class id; the model needs 1 + the largest. */
    int max = 0;
    for (int i = 0; i < ds->n; i++)
        max = ds->y[i] > max ? ds->y[i] : max;
    ds->nclasses = max + 1;
    return PST_OK;

error:
    pst_dataset_free(ds);
    return st;
}

pst_status pst_dataset_load_idx_dir(pst_dataset *train, pst_dataset *test, const char *dir)
{
    static const char *const names[4] = {
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",  "t10k-labels-idx1-ubyte",
    };
    char paths[4][PATH_MAX];
    pst_status st;

    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (!dir || !dir[0])
        return pst_error_set(PST_ERR_INVALID,
                             "no data directory given; pass --data DIR (e.g. "
                             "/usr/share/datasets/fashion-mnist)");
    for (int i = 0; i < 4; i++) {
        int len = snprintf(paths[i], PATH_MAX, "%s/%s", dir, names[i]);
        if (len < 0 || len + 4 > PATH_MAX)
            return pst_error_set(PST_ERR_INVALID, "%.200s...: data directory name is too "
                                 "long", dir);
    }
    st = pst_dataset_load_idx(train, paths[0], paths[1]);
    if (st != PST_OK)
        goto error;
    st = pst_dataset_load_idx(test, paths[2], paths[3]);
    if (st != PST_OK)
        goto error;
    if (test->dim != train->dim) {
        st = pst_error_set(PST_ERR_FORMAT, "%s: test images have %d pixels, training images "
                           "in %s have %d",
                           paths[2], test->dim, paths[0], train->dim);
        goto error;
    }
    if (test->nclasses > train->nclasses) {
        st = pst_error_set(PST_ERR_FORMAT, "%s: test labels go up to %d but training labels "
                           "in %s only to %d",
                           paths[3], test->nclasses - 1, paths[1], train->nclasses - 1);
        goto error;
    }
    return PST_OK;

error:
    pst_dataset_free(train);
    pst_dataset_free(test);
    return st;
}

pst_status pst_dataset_load(pst_dataset *train, pst_dataset *test, const char *name,
                            const char *dir)
{
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (!name || (strcmp(name, "fashion-mnist") != 0 && strcmp(name, "mnist") != 0))
        return pst_error_set(PST_ERR_INVALID, "data set '%.64s': expected fashion-mnist or "
                             "mnist", name ? name : "(null)");
    PST_TRY(pst_dataset_load_idx_dir(train, test, dir));
    if (train->dim != 28 * 28 || train->nclasses > 10) {
        pst_status st = pst_error_set(PST_ERR_FORMAT, "%s: %s has 28x28 images in 10 classes, "
                                      "but these have %d pixels and %d classes; point --data "
                                      "at the %s files", dir, name, train->dim,
                                      train->nclasses, name);
        pst_dataset_free(train);
        pst_dataset_free(test);
        return st;
    }
    return PST_OK;
}

void pst_dataset_free(pst_dataset *ds)
{
    if (!ds)
        return;
    free(ds->x);
    free(ds->y);
    memset(ds, 0, sizeof *ds);
}

int pst_batches_per_epoch(int n, int batch)
{
    if (n <= 0 || batch <= 0)
        return 0;
    return n / batch + (n % batch != 0);
}

void pst_epoch_order(uint32_t *perm, int n, uint64_t seed, int epoch)
{
    pst_rng r;

    if (!perm || n <= 0)
        return;
    for (int i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    /* Stream 1000 + epoch: epochs get independent streams, away from the small stream
     * ids other users of the same seed (parameter init) take. */
    pst_rng_seed(&r, seed, 1000 + (uint64_t)(int64_t)epoch);
    for (int i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)pst_rng_below(&r, (uint64_t)i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void pst_batch_part(int len, int rank, int nparts, int *lo, int *hi)
{
    if (len <= 0 || nparts <= 0 || rank < 0 || rank >= nparts) {
        *lo = *hi = 0;
        return;
    }
    int base = len / nparts, extra = len % nparts;
    *lo = rank * base + (rank < extra ? rank : extra);
    *hi = *lo + base + (rank < extra);
}

void pst_dataset_gather(const pst_dataset *ds, const uint32_t *idx, int count, float *x,
                        int32_t *y)
{
    size_t dim = ds->dim > 0 ? (size_t)ds->dim : 0;
    /* The rows are scattered over the data set (a random order), each a cold miss: ask
     * for the rows AHEAD rows on while converting this one, so their loads overlap. */
    enum { AHEAD = 4 };
    for (int i = 0; i < count && i < AHEAD; i++)
        if (idx[i] < (uint32_t)ds->n)
            for (size_t j = 0; j < dim; j += 64)
                __builtin_prefetch(ds->x + (size_t)idx[i] * dim + j);
    for (int i = 0; i < count; i++) {
        if (i + AHEAD < count && idx[i + AHEAD] < (uint32_t)ds->n)
            for (size_t j = 0; j < dim; j += 64)
                __builtin_prefetch(ds->x + (size_t)idx[i + AHEAD] * dim + j);
        float *row = x + (size_t)i * dim;
        if (idx[i] >= (uint32_t)ds->n) {
            /* Outside the data set (a caller bug): zeros and label -1, never a wild read. */
            memset(row, 0, dim * sizeof *row);
            if (y)
                y[i] = -1;
            continue;
        }
        const uint8_t *src = ds->x + (size_t)idx[i] * dim;
        /* k / 255.0f, correctly rounded: the loop vectorizes (widen, convert, divide),
         * twice as fast as a 256-entry table, whose lookups do not. */
        for (size_t j = 0; j < dim; j++)
            row[j] = (float)src[j] / 255.0f;
        if (y)
            y[i] = ds->y[idx[i]];
    }
}
