/* test_data.c — IDX loading, epoch order and batch arithmetic (common/data/data.c).
 *
 * The real Fashion-MNIST files (package dataset-fashion-mnist) are loaded and checked
 * against properties computed independently with Python's gzip module (CRC-32 of the
 * pixels and labels, first labels, class histogram). Broken files are written into a
 * fresh mkdtemp() directory per test; each failure asserts the exact status and that the
 * one-line detail names the file. A cut-at-every-length sweep checks that no prefix of a
 * valid file loads or crashes. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common/data/data.h"
#include "common/rng.h"

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* ---- temporary directory, one per test ---- */

static char tmp_dir[64];
static char **tmp_paths; /* every path handed out by tmp_path, freed by tmp_remove */
static size_t tmp_npaths;

static void tmp_make(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/pst_test_data_XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_dir), "mkdtemp");
}

static void tmp_remove(void)
{
    DIR *d = opendir(tmp_dir);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
            unlink(p);
        }
        closedir(d);
        rmdir(tmp_dir);
    }
    for (size_t i = 0; i < tmp_npaths; i++)
        free(tmp_paths[i]);
    free(tmp_paths);
    tmp_paths = NULL;
    tmp_npaths = 0;
}

TestSuite(idx_files, .init = tmp_make, .fini = tmp_remove);

/* Returns tmp_dir/name; the string lives until the end of the test. */
static const char *tmp_path(const char *name)
{
    char *p = malloc(strlen(tmp_dir) + strlen(name) + 2);
    char **more = realloc(tmp_paths, (tmp_npaths + 1) * sizeof *tmp_paths);
    cr_assert(p && more);
    sprintf(p, "%s/%s", tmp_dir, name);
    tmp_paths = more;
    tmp_paths[tmp_npaths++] = p;
    return p;
}

static const char *write_plain(const char *name, const void *data, size_t len)
{
    const char *p = tmp_path(name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f, "fopen %s", p);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
    return p;
}

static const char *write_gz(const char *name, const void *data, size_t len)
{
    const char *p = tmp_path(name);
    gzFile g = gzopen(p, "wb");
    cr_assert_not_null(g, "gzopen %s", p);
    if (len)
        cr_assert_eq(gzwrite(g, data, (unsigned)len), (int)len);
    cr_assert_eq(gzclose(g), Z_OK);
    return p;
}

/* Reads a whole (possibly gzipped) file into a malloc'd buffer. */
static unsigned char *slurp(const char *path, size_t *len, int decompress)
{
    size_t cap = 1 << 20, n = 0;
    unsigned char *buf = malloc(cap);
    cr_assert_not_null(buf);
    if (decompress) {
        gzFile g = gzopen(path, "rb");
        cr_assert_not_null(g, "gzopen %s", path);
        int k;
        while ((k = gzread(g, buf + n, (unsigned)(cap - n))) > 0) {
            n += (size_t)k;
            if (n == cap)
                cr_assert_not_null(buf = realloc(buf, cap *= 2));
        }
        cr_assert_geq(k, 0);
        gzclose(g);
    } else {
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "fopen %s", path);
        size_t k;
        while ((k = fread(buf + n, 1, cap - n, f)) > 0) {
            n += k;
            if (n == cap)
                cr_assert_not_null(buf = realloc(buf, cap *= 2));
        }
        fclose(f);
    }
    *len = n;
    return buf;
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* A small valid IDX image file: n images of rows x cols, pixel (i, j) = (7i + 3j) % 256. */
static unsigned char *make_images(uint32_t magic, uint32_t n, uint32_t rows, uint32_t cols,
                                  size_t *len)
{
    size_t body = (size_t)n * rows * cols;
    unsigned char *b = malloc(16 + body);
    cr_assert_not_null(b);
    put_be32(b, magic);
    put_be32(b + 4, n);
    put_be32(b + 8, rows);
    put_be32(b + 12, cols);
    for (size_t k = 0; k < body; k++)
        b[16 + k] = (unsigned char)((7 * (k / (rows * cols)) + 3 * (k % (rows * cols))) % 256);
    *len = 16 + body;
    return b;
}

/* A small valid IDX label file: label i = i % nclasses. */
static unsigned char *make_labels(uint32_t magic, uint32_t n, int nclasses, size_t *len)
{
    unsigned char *b = malloc(8 + n);
    cr_assert_not_null(b);
    put_be32(b, magic);
    put_be32(b + 4, n);
    for (uint32_t i = 0; i < n; i++)
        b[8 + i] = (unsigned char)(i % (uint32_t)nclasses);
    *len = 8 + n;
    return b;
}

/* Asserts that loading fails with `want`, the detail names `file` and contains `text`
 * (when not NULL), is one line, and the data set is left zeroed. */
static void expect_load_error(const char *images, const char *labels, pst_status want,
                              const char *file, const char *text)
{
    pst_dataset ds;
    memset(&ds, 0x5a, sizeof ds);
    pst_error_clear();
    pst_status st = pst_dataset_load_idx(&ds, images, labels);
    const char *detail = pst_error_detail();
    cr_assert_eq(st, want, "status %s (%s), want %s", pst_strerror(st), detail,
                 pst_strerror(want));
    cr_assert_not_null(strstr(detail, file), "detail '%s' does not name %s", detail, file);
    if (text)
        cr_assert_not_null(strstr(detail, text), "detail '%s' lacks '%s'", detail, text);
    cr_assert_null(strchr(detail, '\n'), "detail is not one line: '%s'", detail);
    cr_assert(ds.x == NULL && ds.y == NULL && ds.n == 0 && ds.dim == 0 && ds.nclasses == 0,
              "data set not zeroed after an error");
}

/* ---- the real data ---- */

static void check_histogram(const pst_dataset *ds, int per_class)
{
    int hist[256] = {0};
    for (int i = 0; i < ds->n; i++)
        hist[ds->y[i]]++;
    for (int c = 0; c < 10; c++)
        cr_expect_eq(hist[c], per_class, "class %d has %d examples", c, hist[c]);
}

static void check_pixels(const pst_dataset *ds, uint32_t crc_px, unsigned long long sum_px)
{
    size_t bytes = (size_t)ds->n * (size_t)ds->dim;
    unsigned long long sum = 0;
    uint8_t lo = 255, hi = 0;
    for (size_t k = 0; k < bytes; k++) {
        sum += ds->x[k];
        lo = ds->x[k] < lo ? ds->x[k] : lo;
        hi = ds->x[k] > hi ? ds->x[k] : hi;
    }
    cr_expect_eq(lo, 0);
    cr_expect_eq(hi, 255);
    cr_expect_eq(sum, sum_px);
    uLong crc = crc32_z(crc32(0L, Z_NULL, 0), ds->x, bytes);
    cr_expect_eq(crc, crc_px, "pixel crc 0x%08lx", crc);
}

Test(fashion_mnist, loads_real_files, .timeout = 30)
{
    pst_dataset train, test;
    pst_status st = pst_dataset_load_idx_dir(&train, &test, FMNIST_DIR);
    cr_assert_eq(st, PST_OK, "%s (install dataset-fashion-mnist)", pst_error_detail());

    cr_expect_eq(train.n, 60000);
    cr_expect_eq(test.n, 10000);
    cr_expect_eq(train.dim, 784);
    cr_expect_eq(test.dim, 784);
    cr_expect_eq(train.nclasses, 10);
    cr_expect_eq(test.nclasses, 10);
    check_histogram(&train, 6000);
    check_histogram(&test, 1000);

    /* Reference values from Python: gzip.open(...).read()[16:] (pixels), [8:] (labels). */
    check_pixels(&train, 0xae65dccdu, 3431114169ull);
    check_pixels(&test, 0x12728439u, 573469082ull);
    cr_expect_eq(crc32_z(crc32(0L, Z_NULL, 0), train.y, 60000), 0x2ed6e46au);
    cr_expect_eq(crc32_z(crc32(0L, Z_NULL, 0), test.y, 10000), 0x242bc73fu);
    static const uint8_t train_first[12] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5, 0, 9};
    static const uint8_t test_first[12] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7, 4, 5};
    cr_expect_eq(memcmp(train.y, train_first, 12), 0);
    cr_expect_eq(memcmp(test.y, test_first, 12), 0);

    pst_dataset_free(&train);
    pst_dataset_free(&test);
    cr_expect(train.x == NULL && train.y == NULL && train.n == 0);
    pst_dataset_free(&train); /* twice is fine */
    pst_dataset_free(NULL);
}

Test(idx_files, plain_files_match_gzipped, .timeout = 30)
{
    /* Gunzip the test split into the temp dir; loading the plain files gives the same
     * bytes. Names: given with ".gz" when only the plain file exists, and without. */
    static const char *const names[2] = {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    for (int i = 0; i < 2; i++) {
        char src[256];
        size_t len;
        snprintf(src, sizeof src, "%s/%s.gz", FMNIST_DIR, names[i]);
        unsigned char *b = slurp(src, &len, 1);
        write_plain(names[i], b, len);
        free(b);
    }
    pst_dataset gz, plain, plain2;
    cr_assert_eq(pst_dataset_load_idx(&gz, FMNIST_DIR "/t10k-images-idx3-ubyte.gz",
                                      FMNIST_DIR "/t10k-labels-idx1-ubyte"),
                 PST_OK, "%s", pst_error_detail());
    cr_assert_eq(pst_dataset_load_idx(&plain, tmp_path("t10k-images-idx3-ubyte"),
                                      tmp_path("t10k-labels-idx1-ubyte")),
                 PST_OK, "%s", pst_error_detail());
    cr_assert_eq(pst_dataset_load_idx(&plain2, tmp_path("t10k-images-idx3-ubyte.gz"),
                                      tmp_path("t10k-labels-idx1-ubyte.gz")),
                 PST_OK, "%s", pst_error_detail());
    cr_assert_eq(plain.n, gz.n);
    cr_assert_eq(plain.dim, gz.dim);
    cr_assert_eq(plain.nclasses, gz.nclasses);
    cr_assert_eq(memcmp(plain.x, gz.x, (size_t)gz.n * (size_t)gz.dim), 0);
    cr_assert_eq(memcmp(plain.y, gz.y, (size_t)gz.n), 0);
    cr_assert_eq(memcmp(plain2.x, gz.x, (size_t)gz.n * (size_t)gz.dim), 0);
    pst_dataset_free(&gz);
    pst_dataset_free(&plain);
    pst_dataset_free(&plain2);
}

/* ---- broken files ---- */

Test(idx_files, missing_file)
{
    size_t len;
    unsigned char *lb = make_labels(0x801, 4, 3, &len);
    const char *labels = write_plain("labels", lb, len);
    free(lb);
    const char *images = tmp_path("no-such-images");
    expect_load_error(images, labels, PST_ERR_NOT_FOUND, images,
                      "install dataset-fashion-mnist or pass --data DIR");
    /* The ".gz" variant is also named so the user sees both were tried. */
    expect_load_error(images, labels, PST_ERR_NOT_FOUND, images, "no-such-images.gz");
    expect_load_error(tmp_path("gone.gz"), labels, PST_ERR_NOT_FOUND, "gone.gz", "gone)");
    expect_load_error("/nonexistent-dir/x/images", labels, PST_ERR_NOT_FOUND,
                      "/nonexistent-dir/x/images", NULL);

    /* Missing labels after good images: the images are freed, the labels path named. */
    unsigned char *im = make_images(0x803, 4, 2, 2, &len);
    images = write_plain("images", im, len);
    free(im);
    expect_load_error(images, tmp_path("no-labels"), PST_ERR_NOT_FOUND, "no-labels",
                      "--data DIR");

    /* The directory loader names the first missing file; outputs are zeroed. */
    pst_dataset train, test;
    memset(&train, 0x5a, sizeof train);
    memset(&test, 0x5a, sizeof test);
    cr_assert_eq(pst_dataset_load_idx_dir(&train, &test, tmp_dir), PST_ERR_NOT_FOUND);
    cr_assert_not_null(strstr(pst_error_detail(), "train-images-idx3-ubyte"), "%s",
                       pst_error_detail());
    cr_assert_not_null(strstr(pst_error_detail(), tmp_dir), "%s", pst_error_detail());
    cr_assert(train.x == NULL && test.x == NULL && train.n == 0 && test.n == 0);
    cr_assert_eq(pst_dataset_load_idx_dir(&train, &test, NULL), PST_ERR_INVALID);
    cr_assert_eq(pst_dataset_load_idx_dir(&train, &test, ""), PST_ERR_INVALID);

    /* A directory where a file is expected is an i/o error, not "not found". */
    expect_load_error(tmp_dir, labels, PST_ERR_IO, tmp_dir, "directory");
}

Test(idx_files, empty_file)
{
    size_t len;
    unsigned char *lb = make_labels(0x801, 4, 3, &len);
    const char *labels = write_plain("labels", lb, len);
    unsigned char *im = make_images(0x803, 4, 2, 2, &len);
    const char *images = write_plain("images", im, len);
    free(lb);
    free(im);
    const char *empty = write_plain("empty", "", 0);
    const char *empty_gz = write_gz("empty.gz", "", 0);
    expect_load_error(empty, labels, PST_ERR_FORMAT, empty, "empty");
    expect_load_error(images, empty, PST_ERR_FORMAT, empty, "empty");
    expect_load_error(empty_gz, labels, PST_ERR_FORMAT, empty_gz, "empty");
}

Test(idx_files, wrong_magic)
{
    size_t ilen, llen;
    unsigned char *im = make_images(0x803, 5, 3, 4, &ilen);
    unsigned char *lb = make_labels(0x801, 5, 3, &llen);
    const char *images = write_plain("images", im, ilen);
    const char *labels = write_plain("labels", lb, llen);

    /* Images and labels swapped: each names the magic found and the one expected. */
    expect_load_error(labels, images, PST_ERR_FORMAT, labels, "0x00000801");
    expect_load_error(labels, images, PST_ERR_FORMAT, labels, "expected 0x00000803");
    expect_load_error(images, images, PST_ERR_FORMAT, images, "expected 0x00000801");
    expect_load_error(images, images, PST_ERR_FORMAT, images, "0x00000803");

    /* Little-endian magic (a common writer bug). */
    put_be32(im, 0x03080000);
    const char *le = write_plain("little-endian", im, ilen);
    expect_load_error(le, labels, PST_ERR_FORMAT, le, "0x03080000");
    /* Magic of a float IDX file. */
    put_be32(im, 0x00000d03);
    const char *fl = write_gz("float.gz", im, ilen);
    expect_load_error(fl, labels, PST_ERR_FORMAT, fl, "0x00000d03");
    /* Text instead of IDX. */
    const char *txt = write_plain("text", "hello, world\n", 13);
    expect_load_error(txt, labels, PST_ERR_FORMAT, txt, "wrong magic");
    free(im);
    free(lb);
}

Test(idx_files, truncated_plain)
{
    size_t ilen, llen;
    unsigned char *im = make_images(0x803, 5, 3, 4, &ilen); /* 60 bytes of pixels */
    unsigned char *lb = make_labels(0x801, 5, 3, &llen);
    const char *labels = write_plain("labels", lb, llen);

    const char *cut = write_plain("cut-images", im, 16 + 50);
    expect_load_error(cut, labels, PST_ERR_FORMAT, cut,
                      "truncated: expected 60 bytes of pixels, got 50");
    const char *cutgz = write_gz("cut-images.gz", im, 16 + 50);
    expect_load_error(cutgz, labels, PST_ERR_FORMAT, cutgz,
                      "truncated: expected 60 bytes of pixels, got 50");
    const char *hdr = write_plain("cut-header", im, 10);
    expect_load_error(hdr, labels, PST_ERR_FORMAT, hdr, "truncated");
    const char *images = write_plain("images", im, ilen);
    const char *cutl = write_plain("cut-labels", lb, llen - 2);
    expect_load_error(images, cutl, PST_ERR_FORMAT, cutl,
                      "truncated: expected 5 bytes of labels, got 3");
    free(im);
    free(lb);
}

Test(idx_files, truncated_real_gzip, .timeout = 30)
{
    /* Cut copies of the real gzipped test split: the gzip stream ends mid-way. */
    size_t len;
    unsigned char *gz = slurp(FMNIST_DIR "/t10k-images-idx3-ubyte.gz", &len, 0);
    const char *images = write_plain("t10k-images-idx3-ubyte.gz", gz, len / 2);
    free(gz);
    expect_load_error(images, FMNIST_DIR "/t10k-labels-idx1-ubyte.gz", PST_ERR_FORMAT, images,
                      "truncated: expected 7840000 bytes of pixels, got ");

    gz = slurp(FMNIST_DIR "/t10k-labels-idx1-ubyte.gz", &len, 0);
    const char *labels = write_plain("t10k-labels-idx1-ubyte.gz", gz, len - 100);
    free(gz);
    expect_load_error(FMNIST_DIR "/t10k-images-idx3-ubyte.gz", labels, PST_ERR_FORMAT, labels,
                      "truncated: expected 10000 bytes of labels, got ");
}

Test(idx_files, trailing_data_and_corrupt_gzip)
{
    size_t ilen, llen;
    unsigned char *im = make_images(0x803, 5, 3, 4, &ilen);
    unsigned char *lb = make_labels(0x801, 5, 3, &llen);
    const char *labels = write_plain("labels", lb, llen);

    unsigned char *longer = calloc(1, ilen + 7);
    cr_assert_not_null(longer);
    memcpy(longer, im, ilen);
    const char *extra = write_plain("extra", longer, ilen + 7);
    expect_load_error(extra, labels, PST_ERR_FORMAT, extra, "after the 60 bytes of pixels");
    free(longer);

    /* A gzip header followed by garbage. */
    static const unsigned char bad_gz[] = {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0, 0x03,
                                           0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const char *corrupt = write_plain("corrupt.gz", bad_gz, sizeof bad_gz);
    pst_dataset ds;
    pst_status st = pst_dataset_load_idx(&ds, corrupt, labels);
    cr_assert_eq(st, PST_ERR_FORMAT, "%s", pst_error_detail());
    cr_assert_not_null(strstr(pst_error_detail(), corrupt), "%s", pst_error_detail());
    free(im);
    free(lb);
}

/* --dataset picks the loader's expectations: a known name on IDX files of its shape loads,
 * an unknown name or files of another shape are clear errors that leave nothing behind. */
Test(idx_files, named_data_sets, .timeout = 30)
{
    pst_dataset train, test;
    cr_assert_eq(pst_dataset_load(&train, &test, "mnist", FMNIST_DIR), PST_OK, "%s",
                 pst_error_detail());
    cr_expect_eq(train.dim, 784);
    cr_expect_eq(train.nclasses, 10);
    pst_dataset_free(&train);
    pst_dataset_free(&test);

    cr_expect_eq(pst_dataset_load(&train, &test, "cifar10", FMNIST_DIR), PST_ERR_INVALID);
    cr_expect(strstr(pst_error_detail(), "cifar10") &&
                  strstr(pst_error_detail(), "expected fashion-mnist or mnist"),
              "%s", pst_error_detail());
    cr_expect_null(train.x);

    /* IDX files of 3x4 images: a valid IDX directory, but not MNIST's shape */
    size_t ilen, llen;
    unsigned char *im = make_images(0x803, 5, 3, 4, &ilen);
    unsigned char *lb = make_labels(0x801, 5, 3, &llen);
    write_plain("train-images-idx3-ubyte", im, ilen);
    write_plain("train-labels-idx1-ubyte", lb, llen);
    write_plain("t10k-images-idx3-ubyte", im, ilen);
    write_plain("t10k-labels-idx1-ubyte", lb, llen);
    free(im);
    free(lb);
    cr_assert_eq(pst_dataset_load_idx_dir(&train, &test, tmp_dir), PST_OK, "%s",
                 pst_error_detail());
    pst_dataset_free(&train);
    pst_dataset_free(&test);
    cr_expect_eq(pst_dataset_load(&train, &test, "fashion-mnist", tmp_dir), PST_ERR_FORMAT);
    cr_expect(strstr(pst_error_detail(), "12 pixels"), "%s", pst_error_detail());
    cr_expect_null(train.x);
    cr_expect_null(test.x);
}

Test(idx_files, bad_dimensions)
{
    size_t ilen, llen;
    unsigned char *lb = make_labels(0x801, 5, 3, &llen);
    const char *labels = write_plain("labels", lb, llen);

    /* Zero examples or a zero side. */
    unsigned char *im = make_images(0x803, 0, 3, 4, &ilen);
    const char *zero = write_plain("zero", im, ilen);
    expect_load_error(zero, labels, PST_ERR_FORMAT, zero, "empty dimension");
    free(im);
    im = make_images(0x803, 5, 0, 4, &ilen);
    zero = write_plain("zero-rows", im, ilen);
    expect_load_error(zero, labels, PST_ERR_FORMAT, zero, NULL);
    free(im);

    /* A header announcing absurd sizes with a few bytes behind it: refused without a huge
     * allocation. */
    unsigned char hdr[16 + 8] = {0};
    put_be32(hdr, 0x803);
    put_be32(hdr + 4, 0xffffffffu);
    put_be32(hdr + 8, 0xffffu);
    put_be32(hdr + 12, 0xffffu);
    const char *huge = write_plain("huge", hdr, sizeof hdr);
    expect_load_error(huge, labels, PST_ERR_FORMAT, huge, "too large");
    /* Large but representable: reported as truncated after reading what is there. */
    put_be32(hdr + 4, 1000000);
    put_be32(hdr + 8, 28);
    put_be32(hdr + 12, 28);
    const char *big = write_plain("big", hdr, sizeof hdr);
    expect_load_error(big, labels, PST_ERR_FORMAT, big,
                      "truncated: expected 784000000 bytes of pixels, got 8");
    /* Label count of zero or beyond int. */
    unsigned char lh[8];
    put_be32(lh, 0x801);
    put_be32(lh + 4, 0);
    im = make_images(0x803, 5, 3, 4, &ilen);
    const char *images = write_plain("images", im, ilen);
    const char *l0 = write_plain("labels0", lh, 8);
    expect_load_error(images, l0, PST_ERR_FORMAT, l0, "0 labels");
    put_be32(lh + 4, 0x80000000u);
    const char *lbig = write_plain("labels-big", lh, 8);
    expect_load_error(images, lbig, PST_ERR_FORMAT, lbig, NULL);
    free(im);
    free(lb);
}

Test(idx_files, count_mismatch)
{
    size_t ilen, llen;
    unsigned char *im = make_images(0x803, 5, 3, 4, &ilen);
    unsigned char *lb = make_labels(0x801, 4, 3, &llen);
    const char *images = write_plain("images", im, ilen);
    const char *labels = write_gz("labels.gz", lb, llen);
    expect_load_error(images, labels, PST_ERR_FORMAT, labels, "4 labels");
    expect_load_error(images, labels, PST_ERR_FORMAT, images, "5 images");
    free(im);
    free(lb);
}

Test(idx_files, small_file_contents)
{
    size_t ilen, llen;
    unsigned char *im = make_images(0x803, 5, 3, 4, &ilen);
    unsigned char *lb = make_labels(0x801, 5, 4, &llen);
    lb[8 + 2] = 6; /* largest label 6: 7 classes, even though 4 and 5 never occur */
    const char *images = write_gz("images.gz", im, ilen);
    const char *labels = write_plain("labels", lb, llen);
    pst_dataset ds;
    cr_assert_eq(pst_dataset_load_idx(&ds, tmp_path("images"), labels), PST_OK, "%s",
                 pst_error_detail());
    cr_assert_eq(ds.n, 5);
    cr_assert_eq(ds.dim, 12);
    cr_assert_eq(ds.nclasses, 7);
    cr_assert_eq(memcmp(ds.x, im + 16, 60), 0);
    cr_assert_eq(memcmp(ds.y, lb + 8, 5), 0);
    pst_dataset_free(&ds);
    (void)images;
    free(im);
    free(lb);
}

Test(idx_files, every_prefix_fails_cleanly, .timeout = 30)
{
    /* Every strict prefix of a valid file, plain and gzipped, is FORMAT with the file
     * named; the full file loads. Run under ASan/valgrind this also checks that no prefix
     * reads out of bounds or leaks. */
    size_t ilen, llen;
    unsigned char *im = make_images(0x803, 3, 2, 5, &ilen);
    unsigned char *lb = make_labels(0x801, 3, 2, &llen);
    const char *images = write_plain("images", im, ilen);
    const char *labels = write_plain("labels", lb, llen);
    for (size_t cut = 0; cut <= ilen; cut++) {
        const char *p = write_plain("cut", im, cut);
        const char *g = write_gz("cut.gz", im, cut);
        pst_dataset ds;
        pst_status want = cut == ilen ? PST_OK : PST_ERR_FORMAT;
        cr_assert_eq(pst_dataset_load_idx(&ds, p, labels), want, "cut %zu: %s", cut,
                     pst_error_detail());
        if (want != PST_OK)
            cr_assert_not_null(strstr(pst_error_detail(), p));
        pst_dataset_free(&ds);
        cr_assert_eq(pst_dataset_load_idx(&ds, g, labels), want, "gz cut %zu: %s", cut,
                     pst_error_detail());
        pst_dataset_free(&ds);
    }
    for (size_t cut = 0; cut < llen; cut++) {
        const char *p = write_plain("cut", lb, cut);
        pst_dataset ds;
        cr_assert_eq(pst_dataset_load_idx(&ds, images, p), PST_ERR_FORMAT, "cut %zu: %s", cut,
                     pst_error_detail());
        cr_assert_not_null(strstr(pst_error_detail(), p));
    }
    /* Cuts of the compressed bytes themselves (the gzip stream ends early). */
    const char *g = write_gz("full.gz", im, ilen);
    size_t glen;
    unsigned char *gzb = slurp(g, &glen, 0);
    for (size_t cut = 0; cut < glen; cut++) {
        const char *p = write_plain("gzcut", gzb, cut);
        pst_dataset ds;
        pst_status st = pst_dataset_load_idx(&ds, p, labels);
        /* Even when every data byte decompresses (the cut is in the end marker or the
         * 8-byte CRC/size trailer) the file is refused as truncated. */
        cr_assert_eq(st, PST_ERR_FORMAT, "gz byte cut %zu of %zu: %s (%s)", cut, glen,
                     pst_strerror(st), pst_error_detail());
        cr_assert_not_null(strstr(pst_error_detail(), p), "%s", pst_error_detail());
        if (cut >= 10) /* past the gzip header: reported as truncated */
            cr_assert_not_null(strstr(pst_error_detail(), "truncated"), "cut %zu: %s", cut,
                               pst_error_detail());
        pst_dataset_free(&ds);
    }
    free(gzb);
    free(im);
    free(lb);
}

/* ---- epoch order, batches, gather ---- */

Test(epoch, order_is_a_deterministic_permutation)
{
    enum { N = 10007 };
    static uint32_t a[N], b[N], c[N], d[N];
    static unsigned char seen[N];
    pst_epoch_order(a, N, 42, 0);
    pst_epoch_order(b, N, 42, 0);
    pst_epoch_order(c, N, 42, 1);
    pst_epoch_order(d, N, 43, 0);
    for (int i = 0; i < N; i++) {
        cr_assert_lt(a[i], (uint32_t)N);
        cr_assert_eq(seen[a[i]], 0, "%u appears twice", a[i]);
        seen[a[i]] = 1;
    }
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "same (seed, epoch) must give the same order");
    cr_assert_neq(memcmp(a, c, sizeof a), 0, "epochs must differ");
    cr_assert_neq(memcmp(a, d, sizeof a), 0, "seeds must differ");
    int fixed = 0, moved_far = 0;
    for (int i = 0; i < N; i++) {
        fixed += a[i] == (uint32_t)i;
        moved_far += abs((int)a[i] - i) > N / 4;
    }
    cr_expect_lt(fixed, 10, "%d fixed points: not shuffled", fixed);
    cr_expect_gt(moved_far, N / 4, "too few elements moved far");

    /* It is the documented Fisher-Yates over pst_rng stream 1000 + epoch. */
    uint32_t ref[N];
    pst_rng r;
    pst_rng_seed(&r, 42, 1000 + 1);
    for (int i = 0; i < N; i++)
        ref[i] = (uint32_t)i;
    for (int i = N - 1; i > 0; i--) {
        uint32_t j = (uint32_t)pst_rng_below(&r, (uint64_t)i + 1), t = ref[i];
        ref[i] = ref[j];
        ref[j] = t;
    }
    cr_assert_eq(memcmp(ref, c, sizeof ref), 0);

    /* Edge sizes. */
    uint32_t one = 77;
    pst_epoch_order(&one, 1, 1, 5);
    cr_assert_eq(one, 0);
    pst_epoch_order(NULL, 0, 1, 0);
    uint32_t two[2];
    int swapped = 0;
    for (int e = 0; e < 64; e++) {
        pst_epoch_order(two, 2, 9, e);
        cr_assert((two[0] == 0 && two[1] == 1) || (two[0] == 1 && two[1] == 0));
        swapped += two[0] == 1;
    }
    cr_expect(swapped > 10 && swapped < 54, "n=2 swapped %d of 64 epochs", swapped);
}

Test(epoch, batches_per_epoch)
{
    cr_assert_eq(pst_batches_per_epoch(60000, 64), 938);
    cr_assert_eq(pst_batches_per_epoch(60000, 100), 600);
    cr_assert_eq(pst_batches_per_epoch(10000, 128), 79);
    cr_assert_eq(pst_batches_per_epoch(1, 64), 1);
    cr_assert_eq(pst_batches_per_epoch(64, 64), 1);
    cr_assert_eq(pst_batches_per_epoch(65, 64), 2);
    cr_assert_eq(pst_batches_per_epoch(5, 1), 5);
    cr_assert_eq(pst_batches_per_epoch(0, 64), 0);
    cr_assert_eq(pst_batches_per_epoch(10, 0), 0);
    cr_assert_eq(pst_batches_per_epoch(-3, 4), 0);
    cr_assert_eq(pst_batches_per_epoch(2147483647, 2), 1073741824); /* no overflow */
}

Test(epoch, batch_parts_cover_the_batch)
{
    for (int len = 0; len <= 70; len++) {
        for (int nparts = 1; nparts <= 80; nparts++) {
            int expect_lo = 0;
            for (int r = 0; r < nparts; r++) {
                int lo = -1, hi = -1;
                pst_batch_part(len, r, nparts, &lo, &hi);
                cr_assert_eq(lo, expect_lo, "len %d nparts %d rank %d: lo %d", len, nparts, r,
                             lo);
                int size = hi - lo, base = len / nparts;
                cr_assert(size == base || size == base + 1, "len %d nparts %d rank %d: %d",
                          len, nparts, r, size);
                /* Lower ranks get the extra rows. */
                cr_assert_eq(size, base + (r < len % nparts), "len %d nparts %d rank %d",
                             len, nparts, r);
                expect_lo = hi;
            }
            cr_assert_eq(expect_lo, len, "len %d nparts %d: parts end at %d", len, nparts,
                         expect_lo);
        }
    }
    int lo, hi;
    pst_batch_part(64, 0, 4, &lo, &hi);
    cr_assert(lo == 0 && hi == 16);
    pst_batch_part(10, 2, 4, &lo, &hi); /* 3 3 2 2 */
    cr_assert(lo == 6 && hi == 8);
    pst_batch_part(3, 4, 5, &lo, &hi); /* more parts than rows: the last ones are empty */
    cr_assert(lo == 3 && hi == 3);
    pst_batch_part(10, 5, 4, &lo, &hi); /* invalid rank */
    cr_assert(lo == 0 && hi == 0);
    pst_batch_part(10, 0, 0, &lo, &hi);
    cr_assert(lo == 0 && hi == 0);
}

Test(epoch, gather_values)
{
    uint8_t px[3 * 4] = {0, 255, 1, 128, 10, 20, 30, 40, 254, 2, 3, 4};
    uint8_t lab[3] = {2, 0, 1};
    pst_dataset ds = {.n = 3, .dim = 4, .nclasses = 3, .x = px, .y = lab};
    uint32_t idx[4] = {2, 0, 2, 1};
    float x[4 * 4];
    int32_t y[4];
    pst_dataset_gather(&ds, idx, 4, x, y);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(y[i], lab[idx[i]]);
        for (int j = 0; j < 4; j++) {
            float want = (float)px[idx[i] * 4 + j] / 255.0f;
            cr_assert_eq(x[i * 4 + j], want, "row %d col %d: %a want %a", i, j,
                         (double)x[i * 4 + j], (double)want);
        }
    }
    cr_assert_eq(x[1 * 4 + 0], 0.0f);
    cr_assert_eq(x[1 * 4 + 1], 1.0f);
    cr_assert_eq(x[0 * 4 + 0], 254.0f / 255.0f);

    /* An index past the end gives a zero row and label -1 instead of reading wild. */
    uint32_t bad[1] = {3};
    pst_dataset_gather(&ds, bad, 1, x, y);
    cr_assert(x[0] == 0.0f && x[3] == 0.0f && y[0] == -1);
}

Test(epoch, gather_real_batch_in_order, .timeout = 30)
{
    /* The shuffled, split global batch gathered part by part equals the whole batch. */
    pst_dataset test;
    cr_assert_eq(pst_dataset_load_idx(&test, FMNIST_DIR "/t10k-images-idx3-ubyte",
                                      FMNIST_DIR "/t10k-labels-idx1-ubyte"),
                 PST_OK, "%s", pst_error_detail());
    uint32_t *perm = malloc(sizeof *perm * (size_t)test.n);
    cr_assert_not_null(perm);
    pst_epoch_order(perm, test.n, 7, 3);
    enum { B = 100, T = 3 };
    static float whole[B * 784], parts[B * 784];
    int32_t ywhole[B], yparts[B];
    int b = 5;
    pst_dataset_gather(&test, perm + b * B, B, whole, ywhole);
    for (int r = 0; r < T; r++) {
        int lo, hi;
        pst_batch_part(B, r, T, &lo, &hi);
        pst_dataset_gather(&test, perm + b * B + lo, hi - lo, parts + (size_t)lo * 784,
                           yparts + lo);
    }
    cr_assert_eq(memcmp(whole, parts, sizeof whole), 0);
    cr_assert_eq(memcmp(ywhole, yparts, sizeof ywhole), 0);
    for (int i = 0; i < B * 784; i++)
        cr_assert(whole[i] >= 0.0f && whole[i] <= 1.0f);
    free(perm);
    pst_dataset_free(&test);
}

/* ---- text files (common/data/text.h) ---- */

#include "common/config.h"
#include "common/data/text.h"

TestSuite(text_files, .init = tmp_make, .fini = tmp_remove);

static const char *write_text(const char *name, const char *bytes, size_t n)
{
    const char *p = tmp_path(name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
    return p;
}

Test(text_files, missing_empty_short_and_directory_are_one_line_errors)
{
    pst_text t;
    const char *missing = tmp_path("nope.txt");
    cr_assert_eq(pst_text_load(&t, missing, 16), PST_ERR_NOT_FOUND);
    cr_assert(strstr(pst_error_detail(), missing), "%s", pst_error_detail());
    cr_assert_eq(t.tokens, NULL);
    const char *empty = write_text("empty.txt", "", 0);
    cr_assert_eq(pst_text_load(&t, empty, 16), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "empty") && strstr(pst_error_detail(), empty), "%s",
              pst_error_detail());
    /* 100 bytes: the last 10 cannot hold a window of 16 + 1 */
    char hundred[100];
    memset(hundred, 'a', sizeof hundred);
    const char *shortf = write_text("short.txt", hundred, sizeof hundred);
    cr_assert_eq(pst_text_load(&t, shortf, 16), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "too short for context 16"), "%s", pst_error_detail());
    cr_assert_eq(pst_text_load(&t, shortf, 8), PST_OK, "%s", pst_error_detail());
    pst_text_free(&t);
    cr_assert_eq(pst_text_load(&t, tmp_dir, 8), PST_ERR_IO);
    cr_assert(strstr(pst_error_detail(), "directory"), "%s", pst_error_detail());
    for (const char *d = pst_error_detail(); *d; d++)
        cr_assert_neq(*d, '\n', "one line");
}

Test(text_files, vocabulary_split_and_windows_follow_the_peer)
{
    /* 200 bytes over the sorted vocabulary {' ', 'a', 'b', 'z'} */
    char text[200];
    const char alphabet[] = "zab ";
    for (int i = 0; i < 200; i++)
        text[i] = alphabet[(i * 7 + i / 3) % 4];
    const char *p = write_text("t.txt", text, sizeof text);
    pst_text t;
    cr_assert_eq(pst_text_load(&t, p, 8), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(t.vocab, 4);
    cr_assert_eq(memcmp(t.bytes, " abz", 4), 0, "the sorted set of distinct bytes");
    cr_assert_eq(t.n, 200);
    cr_assert_eq(t.n_train, 180, "the first 90%% (floor) train");
    for (int i = 0; i < 200; i++)
        cr_assert_eq(t.bytes[t.tokens[i]], (uint8_t)text[i]);
    /* validation windows at stride T from the start of the last 10% */
    cr_assert_eq(pst_text_val_windows(&t, 8), (20 - 1) / 8);
    int32_t x[4 * 8], y[4 * 8];
    pst_text_val_rows(&t, 8, 1, 1, x, y);
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(x[i], t.tokens[180 + 8 + i]);
        cr_assert_eq(y[i], t.tokens[180 + 8 + i + 1], "targets are the next tokens");
    }
    /* a global batch of 4: the same on every call, the trainers' slices are its rows */
    int32_t gx[4 * 8], gy[4 * 8], sx[4 * 8], sy[4 * 8];
    pst_text_train_rows(&t, 8, 5, 17, 4, 0, 4, gx, gy);
    pst_text_train_rows(&t, 8, 5, 17, 4, 0, 2, sx, sy);
    pst_text_train_rows(&t, 8, 5, 17, 4, 2, 4, sx + 16, sy + 16);
    cr_assert_eq(memcmp(gx, sx, sizeof gx), 0);
    cr_assert_eq(memcmp(gy, sy, sizeof gy), 0);
    pst_text_train_rows(&t, 8, 5, 18, 4, 0, 4, x, y);
    cr_assert_neq(memcmp(gx, x, sizeof gx), 0, "another step, other windows");
    /* every window lies inside the training part: each row is a contiguous run */
    for (int r = 0; r < 4; r++) {
        int found = 0;
        for (size_t off = 0; off + 9 <= t.n_train && !found; off++) {
            int ok = 1;
            for (int i = 0; i < 8 && ok; i++)
                ok = gx[r * 8 + i] == t.tokens[off + i] && gy[r * 8 + i] == t.tokens[off + i + 1];
            found = ok;
        }
        cr_assert(found, "row %d is not a window of the training part", r);
    }
    pst_text_free(&t);
}

Test(text_files, the_king_james_bible_has_73_symbols, .timeout = 30)
{
    pst_text t;
    cr_assert_eq(pst_text_load(&t, PST_KJV_PATH, 128), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(t.n, 4404412);
    cr_assert_eq(t.vocab, 73);
    pst_text_free(&t);
}
