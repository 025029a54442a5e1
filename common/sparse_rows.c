/* sparse_rows.c — unique keys, summed rows, merged pushes (see sparse_rows.h). */
#include "common/sparse_rows.h"

#include <stdlib.h>
#include <string.h>

static int key_then_at(const void *x, const void *y)
{
    const pst_key_at *a = x, *b = y;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return a->at < b->at ? -1 : a->at > b->at;
}

pst_status pst_keys_unique(const uint64_t *keys, size_t n, pst_key_at *scratch, uint64_t *uniq,
                           uint32_t *inverse, size_t *nuniq)
{
    *nuniq = 0;
    if (n > 0 && (!keys || !scratch || !uniq || !inverse))
        return pst_error_set(PST_ERR_INVALID, "sparse keys: NULL arguments for %zu keys", n);
    if (n > UINT32_MAX)
        return pst_error_set(PST_ERR_INVALID, "sparse keys: %zu keys in one batch, at most %u",
                             n, UINT32_MAX);
    for (size_t i = 0; i < n; i++)
        scratch[i] = (pst_key_at){keys[i], (uint32_t)i};
    qsort(scratch, n, sizeof *scratch, key_then_at);
    size_t u = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || scratch[i].key != scratch[i - 1].key)
            uniq[u++] = scratch[i].key;
        inverse[scratch[i].at] = (uint32_t)(u - 1);
    }
    *nuniq = u;
    return PST_OK;
}

void pst_rows_sum(const float *rows, const uint32_t *inverse, size_t n, size_t dim, float *sums,
                  size_t nuniq)
{
    memset(sums, 0, sizeof(float) * nuniq * dim); /* 0 + x is x (but -0: no optimizer
                                                    * step tells +0 from -0) */
    for (size_t i = 0; i < n; i++) {
        float *s = sums + (size_t)inverse[i] * dim;
        const float *r = rows + i * dim;
        for (size_t j = 0; j < dim; j++)
            s[j] += r[j];
    }
}

pst_status pst_rows_merge(int T, const uint64_t *const keys[], const size_t n[],
                          const float *const rows[], size_t dim, uint64_t *out_keys,
                          float *out_rows, size_t *nout)
{
    *nout = 0;
    for (int t = 0; t < T; t++)
        for (size_t i = 1; i < n[t]; i++)
            if (keys[t][i] <= keys[t][i - 1])
                return pst_error_set(PST_ERR_INVALID, "sparse push of trainer %d: key %llu at "
                                     "%zu after %llu: the keys must be unique and ascending",
                                     t, (unsigned long long)keys[t][i], i,
                                     (unsigned long long)keys[t][i - 1]);
    size_t pos[64] = {0}, o = 0;
    if (T > 64)
        return pst_error_set(PST_ERR_INVALID, "sparse merge: %d trainers, at most 64", T);
    for (;;) {
        int any = 0;
        uint64_t k = 0;
        for (int t = 0; t < T; t++) /* the smallest key not yet taken */
            if (pos[t] < n[t] && (!any || keys[t][pos[t]] < k)) {
                k = keys[t][pos[t]];
                any = 1;
            }
        if (!any)
            break;
        float *dst = out_rows + o * dim;
        int first = 1;
        for (int t = 0; t < T; t++) {
            if (pos[t] >= n[t] || keys[t][pos[t]] != k)
                continue;
            const float *src = rows[t] + pos[t] * dim;
            if (first)
                memcpy(dst, src, sizeof(float) * dim);
            else
                for (size_t j = 0; j < dim; j++)
                    dst[j] += src[j];
            first = 0;
            pos[t]++;
        }
        out_keys[o++] = k;
    }
    *nout = o;
    return PST_OK;
}
