/* layers.c — CPU kernels for linear, ReLU and softmax cross-entropy (see layers.h).
 *
 * DESIGN: the three GEMMs of a linear layer go to OpenBLAS; everything else is one pass
 * fused onto data that is still in cache: bias + ReLU after the forward GEMM, the bias
 * gradient as a column sum of dout. */
#include "common/layers.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

void pst_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                        int B, int IC, int OC, int relu)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, OC, IC, 1.0f, inp, IC, weight, IC,
                0.0f, out, OC);
    for (int b = 0; b < B; b++) {
        float *o = out + (int64_t)b * OC;
        if (relu) {
            for (int j = 0; j < OC; j++) {
                float v = o[j] + bias[j];
                o[j] = v > 0.0f ? v : 0.0f;
            }
        } else {
            for (int j = 0; j < OC; j++)
                o[j] += bias[j];
        }
    }
}

void pst_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int B, int IC, int OC,
                         int accumulate)
{
    if (!dweight)
        goto input;
    /* dbias: column sums, rows added in order so the result does not depend on threads. */
    if (!accumulate)
        memset(dbias, 0, sizeof(float) * (size_t)OC);
    for (int b = 0; b < B; b++) {
        const float *d = dout + (int64_t)b * OC;
        for (int j = 0; j < OC; j++)
            dbias[j] += d[j];
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, B, 1.0f, dout, OC, inp, IC,
                accumulate ? 1.0f : 0.0f, dweight, IC);
input:
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, IC, OC, 1.0f, dout, OC,
                    weight, IC, 0.0f, dinp, IC);
}

void pst_relu_backward(float *dinp, const float *dout, const float *out, int64_t N)
{
    for (int64_t i = 0; i < N; i++) {
        float d = dout[i]; /* loaded unconditionally, so the select vectorizes */
        dinp[i] = out[i] > 0.0f ? d : 0.0f;
    }
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
