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

void pst_rows_sum_parts(const float *rows, const uint32_t *inverse, const size_t *bounds, int P,
                        size_t dim, float *sums, size_t nuniq, float *scratch, uint32_t *mark)
{
    if (P <= 1) {
        pst_rows_sum(rows, inverse, bounds[P > 0 ? P : 0], dim, sums, nuniq);
        return;
    }
    memset(sums, 0, sizeof(float) * nuniq * dim);
    /* mark[u]: p while key u's sum of part p is being made, p + P once it is added */
    for (size_t u = 0; u < nuniq; u++)
        mark[u] = UINT32_MAX;
    for (uint32_t p = 0; p < (uint32_t)P; p++) {
        for (size_t i = bounds[p]; i < bounds[p + 1]; i++) {
            const uint32_t u = inverse[i];
            float *s = scratch + (size_t)u * dim;
            const float *r = rows + i * dim;
            if (mark[u] != p) {
                mark[u] = p;
                memset(s, 0, sizeof(float) * dim);
            }
            for (size_t j = 0; j < dim; j++)
                s[j] += r[j];
        }
        for (size_t i = bounds[p]; i < bounds[p + 1]; i++) {
            const uint32_t u = inverse[i];
            if (mark[u] != p)
                continue; /* added already */
            mark[u] = p + (uint32_t)P;
            float *d = sums + (size_t)u * dim;
            const float *s = scratch + (size_t)u * dim;
            for (size_t j = 0; j < dim; j++)
                d[j] += s[j];
        }
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
