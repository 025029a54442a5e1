/* layers.c — CPU kernels for linear, ReLU and softmax cross-entropy (see layers.h).
 *
 * DESIGN: the three GEMMs of a linear layer go to pst_sgemm (gemm.h: OpenBLAS or oneDNN, one
 * library for the process); everything else is one pass fused onto data that is still in
 * cache: bias + ReLU after the forward GEMM, the bias gradient as a column sum of dout.
 * Each GEMM also comes as a slice of its output (columns of out and dinp, rows of dweight)
 * so the CPU ops can split one layer over a thread team with single-threaded GEMMs: every
 * element is still one dot product over the same K, and no two slices write the same cache
 * line when cut at 16 floats. */
#include "common/nn/layers.h"

#include "common/dtype.h"
#include "common/nn/gemm.h"
#include "common/nn/gemm_bf16.h"
#include "common/pool.h"

#include <math.h>
#include <string.h>

/* Zeroes columns [j0, j0 + n) of the B rows of c (row stride ldc) for the forward's GEMM
 * (inp @ weight^T). That GEMM with beta 0 zeroes C and then adds each K block's product
 * to it, exactly as beta 1 on a zeroed C does, so zeroing here and calling with beta 1
 * gives the same bits; OpenBLAS's own zeroing of a column slice (sgemm_beta) was 4.5% of a
 * GPT step on a 2-thread team (AMD EPYC, Haswell kernels), where a whole-width C gets one
 * memset. Not for the input gradient's GEMM (no transposes): on AVX-512 OpenBLAS sends a
 * small one with beta 0 and alpha 1 to sgemm_direct, which sums in another order than
 * the blocked path beta 1 takes. */
static float gemm_slice_beta(float *c, int B, int ldc, int j0, int n)
{
    if (n == ldc)
        return 0.0f; /* the whole width: OpenBLAS zeroes it in one pass */
    for (int b = 0; b < B; b++)
        memset(c + (int64_t)b * ldc + j0, 0, sizeof(float) * (size_t)n);
    return 1.0f;
}

/* out[:, j0:j1] += bias, then ReLU (the forward's epilogue, on the block just written). */
static inline void bias_relu(float *out, const float *bias, int B, int OC, int relu, int j0,
                             int j1)
{
    for (int b = 0; b < B; b++) {
        float *o = out + (int64_t)b * OC;
        if (relu && bias) {
            for (int j = j0; j < j1; j++) {
                float v = o[j] + bias[j];
                o[j] = v > 0.0f ? v : 0.0f;
            }
        } else if (relu) {
            for (int j = j0; j < j1; j++)
                o[j] = o[j] > 0.0f ? o[j] : 0.0f;
        } else if (bias) {
            for (int j = j0; j < j1; j++)
                o[j] += bias[j];
        }
    }
}

PST_BIT_EXACT_CLONES
void pst_linear_forward_cols(float *out, const float *inp, const float *weight,
                             const float *bias, int B, int IC, int OC, int relu, int j0, int j1)
{
    const int n = j1 - j0;
    if (n <= 0 || B <= 0)
        return;
    /* out[:, j0:j1] = inp @ weight[j0:j1, :]^T: rows j0.. of weight, columns j0.. of out. */
    const float beta = gemm_slice_beta(out, B, OC, j0, n);
    pst_sgemm(0, 1, B, n, IC, 1.0f, inp, IC, weight + (int64_t)j0 * IC, IC, beta, out + j0,
              OC);
    bias_relu(out, bias, B, OC, relu, j0, j1);
}

/* A block of rows x n that a bf16 kernel could not compute (no scratch): NaN, which fails
 * the step's exchange rather than training on wrong values. */
static void nan_block(float *c, int rows, int n, int64_t ld)
{
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++)
            c[r * ld + j] = __builtin_nanf("");
}

/* C[:, 0:n] (M rows, row stride ldc) = op(A) @ op(B) in bf16, every operand dense: oneDNN's
 * fastest kernels (brgemm, AMX) take only dense layouts, so a slice narrower than C is
 * computed into this thread's dense block (scratch 2) and copied out, and a shape always
 * meets the same kernel. 0, or -1 without scratch. */
static int gemm_into_cols(int ta, int tb, int M, int n, int K, const uint16_t *A, int lda,
                          const uint16_t *B, int ldb, float *C, int ldc)
{
    if (n == ldc) {
        pst_gemm_bf16(ta, tb, M, n, K, A, lda, B, ldb, 0, C, ldc);
        return 0;
    }
    float *t = (float *)(void *)pst_gemm_bf16_scratch(2, 2 * (size_t)M * (size_t)n);
    if (!t)
        return -1;
    pst_gemm_bf16(ta, tb, M, n, K, A, lda, B, ldb, 0, t, n);
    for (int i = 0; i < M; i++)
        memcpy(C + (int64_t)i * ldc, t + (int64_t)i * n, sizeof(float) * (size_t)n);
    return 0;
}

PST_BIT_EXACT_CLONES
void pst_linear_forward_cols_bf16(float *out, const float *inp, const uint16_t *w16,
                                  const float *bias, int B, int IC, int OC, int relu, int j0,
                                  int j1)
{
    const int n = j1 - j0;
    if (n <= 0 || B <= 0)
        return;
    uint16_t *x = pst_gemm_bf16_scratch(0, (size_t)B * (size_t)IC);
    if (x)
        pst_bf16_rows(x, inp, B, IC, IC);
    if (!x || gemm_into_cols(0, 1, B, n, IC, x, IC, w16 + (int64_t)j0 * IC, IC, out + j0,
                             OC) != 0) {
        nan_block(out + j0, B, n, OC);
        return;
    }
    bias_relu(out, bias, B, OC, relu, j0, j1);
}

void pst_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                        int B, int IC, int OC, int relu)
{
    pst_linear_forward_cols(out, inp, weight, bias, B, IC, OC, relu, 0, OC);
}

/* The end of the prefix of parts 0..p (layers.h, pst_linear_dinp_part), before the running
 * maximum that keeps the cuts in order. */
static int64_t dinp_cut(int64_t items, int64_t item_cost, int align, int wrows,
                        int64_t wrow_cost, int p, int nparts)
{
    if (p >= nparts - 1)
        return items;
    const int64_t total = (int64_t)wrows * wrow_cost + items * item_cost;
    size_t lo, hi;
    pst_pool_split((size_t)wrows, p, nparts, PST_ROW_TILE, &lo, &hi); /* parts 0..p: [0, hi) */
    const int64_t want = total * (p + 1) / nparts - (int64_t)hi * wrow_cost;
    const int64_t n = want <= 0 ? 0 : (want / item_cost + align / 2) / align * align;
    return n < items ? n : items;
}

void pst_linear_dinp_part(int64_t items, int64_t item_cost, int align, int wrows,
                          int64_t wrow_cost, int part, int nparts, size_t *lo, size_t *hi)
{
    int64_t end = 0, start = 0;
    for (int p = 0; p <= part; p++) {
        start = end;
        const int64_t c = dinp_cut(items, item_cost, align, wrows, wrow_cost, p, nparts);
        end = c > end ? c : end;
    }
    *lo = (size_t)start;
    *hi = (size_t)end;
}

int pst_row_tile_end(int r, int end)
{
    const int e = r - r % PST_ROW_TILE + PST_ROW_TILE; /* the end of r's tile */
    return e < end ? e : end;
}

/* dbias[j0:j1] = column sums of dout[:, j0:j1] (added to when accumulate), rows added in
 * order so the result does not depend on threads. */
static inline void bias_grad(float *dbias, const float *dout, int B, int OC, int accumulate,
                             int j0, int j1)
{
    if (!dbias)
        return;
    if (!accumulate)
        memset(dbias + j0, 0, sizeof(float) * (size_t)(j1 - j0));
    for (int b = 0; b < B; b++) {
        const float *d = dout + (int64_t)b * OC;
        for (int j = j0; j < j1; j++)
            dbias[j] += d[j];
    }
}

PST_BIT_EXACT_CLONES
void pst_linear_backward_weight_rows(float *dweight, float *dbias, const float *dout,
                                     const float *inp, int B, int IC, int OC, int accumulate,
                                     int j0, int j1)
{
    const int n = j1 - j0;
    if (n <= 0)
        return;
    bias_grad(dbias, dout, B, OC, accumulate, j0, j1);
    /* dweight[j0:j1, :] = dout[:, j0:j1]^T @ inp, one call per tile of PST_ROW_TILE rows
     * (layers.h: the same calls whatever the slice). */
    if (B > 0) {
        for (int r = j0, e; r < j1; r = e) {
            e = pst_row_tile_end(r, j1);
            pst_sgemm(1, 0, e - r, IC, B, 1.0f, dout + r, OC, inp, IC, accumulate ? 1.0f : 0.0f,
                      dweight + (int64_t)r * IC, IC);
        }
    } else if (!accumulate)
        memset(dweight + (int64_t)j0 * IC, 0, sizeof(float) * (size_t)n * (size_t)IC);
}

PST_BIT_EXACT_CLONES
void pst_linear_backward_weight_rows_bf16(float *dweight, float *dbias, const float *dout,
                                          const float *inp, int B, int IC, int OC,
                                          int accumulate, int j0, int j1)
{
    const int n = j1 - j0;
    if (n <= 0)
        return;
    bias_grad(dbias, dout, B, OC, accumulate, j0, j1);
    if (B <= 0) {
        if (!accumulate)
            memset(dweight + (int64_t)j0 * IC, 0, sizeof(float) * (size_t)n * (size_t)IC);
        return;
    }
    /* inp in bf16, then the same tiles as the fp32 kernel, each with its columns of dout
     * rounded into a dense block of their own: every tile of a width is the same dense
     * product, wherever the slice around it starts and ends */
    uint16_t *d = pst_gemm_bf16_scratch(0, (size_t)B * PST_ROW_TILE);
    uint16_t *x = pst_gemm_bf16_scratch(1, (size_t)B * (size_t)IC);
    if (!d || !x) {
        nan_block(dweight + (int64_t)j0 * IC, n, IC, IC);
        return;
    }
    pst_bf16_rows(x, inp, B, IC, IC);
    for (int r = j0, e; r < j1; r = e) {
        e = pst_row_tile_end(r, j1);
        pst_bf16_rows(d, dout + r, B, e - r, OC);
        pst_gemm_bf16(1, 0, e - r, IC, B, d, e - r, x, IC, accumulate,
                      dweight + (int64_t)r * IC, IC);
    }
}

void pst_linear_backward_input_cols(float *dinp, const float *dout, const float *weight, int B,
                                    int IC, int OC, int i0, int i1)
{
    const int n = i1 - i0;
    if (n <= 0 || B <= 0)
        return;
    /* dinp[:, i0:i1] = dout @ weight[:, i0:i1]. */
    pst_sgemm(0, 0, B, n, OC, 1.0f, dout, OC, weight + i0, IC, 0.0f, dinp + i0, IC);
}

void pst_linear_backward_input_cols_bf16(float *dinp, const float *dout, const uint16_t *w16,
                                         int B, int IC, int OC, int i0, int i1)
{
    const int n = i1 - i0;
    if (n <= 0 || B <= 0)
        return;
    /* dinp[:, i0:i1] = dout @ w16[:, i0:i1], the weight's columns copied dense (scratch 1)
     * when they are not all of it */
    uint16_t *d = pst_gemm_bf16_scratch(0, (size_t)B * (size_t)OC);
    uint16_t *wd = n == IC ? NULL : pst_gemm_bf16_scratch(1, (size_t)OC * (size_t)n);
    const uint16_t *w = n == IC ? w16 : wd;
    for (int o = 0; wd && o < OC; o++)
        memcpy(wd + (int64_t)o * n, w16 + (int64_t)o * IC + i0, sizeof *wd * (size_t)n);
    if (d)
        pst_bf16_rows(d, dout, B, OC, OC);
    if (!d || !w || gemm_into_cols(0, 0, B, n, OC, d, OC, w, n, dinp + i0, IC) != 0)
        nan_block(dinp + i0, B, n, IC);
}

void pst_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int B, int IC, int OC,
                         int accumulate)
{
    if (dweight)
        pst_linear_backward_weight_rows(dweight, dbias, dout, inp, B, IC, OC, accumulate, 0, OC);
    if (dinp)
        pst_linear_backward_input_cols(dinp, dout, weight, B, IC, OC, 0, IC);
}

void pst_relu_backward(float *dinp, const float *dout, const float *out, int64_t N)
{
    for (int64_t i = 0; i < N; i++) {
        float d = dout[i]; /* loaded unconditionally, so the select vectorizes */
        dinp[i] = out[i] > 0.0f ? d : 0.0f;
    }
}

void pst_relu_backward_cols(float *d, const float *out, int B, int C, int i0, int i1)
{
    for (int b = 0; b < B; b++)
        pst_relu_backward(d + (int64_t)b * C + i0, d + (int64_t)b * C + i0,
                          out + (int64_t)b * C + i0, i1 - i0);
}

double pst_softmax_xent_forward(float *probs, const float *logits, const int32_t *targets,
                                int B, int C)
{
    double loss = 0.0;
    for (int b = 0; b < B; b++) {
        const float *l = logits + (int64_t)b * C;
        float *p = probs + (int64_t)b * C;
        float maxv = l[0];
        for (int j = 1; j < C; j++)
            maxv = l[j] > maxv ? l[j] : maxv;
        float sum = 0.0f;
        for (int j = 0; j < C; j++) {
            p[j] = expf(l[j] - maxv);
            sum += p[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j < C; j++)
            p[j] *= inv;
        /* -log softmax computed from the logits keeps precision when p[target] is tiny. */
        loss += (double)(logf(sum) - (l[targets[b]] - maxv));
    }
    return loss;
}

void pst_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                               int B, int C, float scale)
{
    for (int b = 0; b < B; b++) {
        const float *p = probs + (int64_t)b * C;
        float *d = dlogits + (int64_t)b * C;
        for (int j = 0; j < C; j++)
            d[j] = p[j] * scale;
        d[targets[b]] -= scale;
    }
}
