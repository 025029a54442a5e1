/* fuzz_text.c — the text loader (common/data/text.c: a file whose bytes are tokens)
 * through pst_text_load(), then its batches.
 *
 * Input: [i8 T: the context, any value][the rest: the file]. A loaded text must map every
 * byte to a token below its vocabulary, and its training and validation windows must read
 * inside the tokens (ASan checks the reads). */
#include <stdint.h>
#include <stdlib.h>

#include "common/data/text.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const int T = (int8_t)data[0];
    const char *path = fuzz_write("corpus.txt", data + 1, size - 1);
    pst_text t;
    pst_status st = pst_text_load(&t, path, T);
    if (st != PST_OK) {
        FUZZ_CHECK(t.tokens == NULL && t.n == 0, "a failed load leaves it zeroed");
        FUZZ_CHECK(pst_error_detail()[0] != '\0', "a failed load says why");
        return 0;
    }
    FUZZ_CHECK(T >= 1 && t.n == size - 1 && t.n_train < t.n && t.vocab >= 1 &&
                   t.vocab <= 256, "a loaded text is the file, split in two");
    for (size_t i = 0; i < t.n; i++)
        FUZZ_CHECK(t.tokens[i] < t.vocab && t.bytes[t.tokens[i]] == data[1 + i],
                   "every token stands for its byte");
    enum { B = 4 };
    int32_t *x = malloc(sizeof(int32_t) * B * (size_t)T), *y = malloc(sizeof(int32_t) * B * (size_t)T);
    FUZZ_CHECK(x && y, "out of memory");
    pst_text_train_rows(&t, T, 7, 3, B, 0, B, x, y);
    for (int i = 0; i < B * T; i++)
        FUZZ_CHECK(x[i] >= 0 && x[i] < t.vocab && y[i] >= 0 && y[i] < t.vocab,
                   "training windows hold tokens");
    const int nval = pst_text_val_windows(&t, T);
    FUZZ_CHECK(nval >= 1, "the validation part holds a window");
    for (int first = 0; first < nval; first += B) {
        const int count = nval - first < B ? nval - first : B;
        pst_text_val_rows(&t, T, first, count, x, y);
    }
    free(x);
    free(y);
    pst_text_free(&t);
    return 0;
}
