/* fuzz_idx.c — the IDX loader (common/data/data.c: MNIST-style image and label files,
 * plain or gzipped) through pst_dataset_load_idx().
 *
 * Input: [u32 LE k][k bytes: the image file][the rest: the label file] (k is clamped to
 * the input), written to two temporary files. A loaded data set must be as its headers
 * say (n, dim, 1 + the largest label) and every row must gather. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/data/data.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    if (!init) {
        fuzz_quiet();
        init = 1;
    }
    size_t k = 0;
    if (size >= 4) {
        k = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 |
            (size_t)data[3] << 24;
        data += 4;
        size -= 4;
    }
    if (k > size)
        k = size;
    char images[4096];
    snprintf(images, sizeof images, "%s", fuzz_write("images-idx3-ubyte", data, k));
    const char *labels = fuzz_write("labels-idx1-ubyte", data + k, size - k);

    pst_dataset ds;
    pst_status st = pst_dataset_load_idx(&ds, images, labels);
    if (st != PST_OK) {
        FUZZ_CHECK(ds.x == NULL && ds.y == NULL && ds.n == 0, "a failed load leaves it zeroed");
        FUZZ_CHECK(pst_error_detail()[0] != '\0', "a failed load says why");
        return 0;
    }
    FUZZ_CHECK(ds.n > 0 && ds.dim > 0 && ds.nclasses >= 1 && ds.nclasses <= 256,
               "a loaded data set has examples, pixels and classes");
    /* Gather the first and the last rows, and one outside (zeros, label -1). */
    uint32_t idx[3] = {0, (uint32_t)ds.n - 1, (uint32_t)ds.n};
    float *x = malloc(sizeof(float) * 3 * (size_t)ds.dim);
    FUZZ_CHECK(x != NULL, "out of memory");
    int32_t y[3];
    pst_dataset_gather(&ds, idx, 3, x, y);
    FUZZ_CHECK(y[0] >= 0 && y[0] < ds.nclasses && y[1] >= 0 && y[1] < ds.nclasses &&
                   y[2] == -1, "gathered labels");
    for (size_t j = 0; j < 3 * (size_t)ds.dim; j++)
        FUZZ_CHECK(x[j] >= 0.0f && x[j] <= 1.0f, "gathered pixels are in [0, 1]");
    free(x);
    pst_dataset_free(&ds);
    return 0;
}
