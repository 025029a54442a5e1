/* ctr_layers.c — the click model's reference kernels (see ctr_layers.h). */
#include "common/nn/ctr_layers.h"

#include <math.h>
#include <string.h>

static float dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int k = 0; k < n; k++)
        s += a[k] * b[k];
    return s;
}

/* v_f of row b: the bottom output for f = 0, else its (f-1)-th embedding. */
static inline const float *vec(const float *bottom, const float *emb, int emb_stride, int dim,
                               int b, int f)
{
    return f == 0 ? bottom + (size_t)b * (size_t)dim
                  : emb + (size_t)b * (size_t)emb_stride + (size_t)(f - 1) * (size_t)dim;
}

void pst_interact_forward(float *out, const float *bottom, const float *emb, int emb_stride,
                          int F, int dim, int b0, int b1)
{
    const int W = pst_interact_width(F, dim);
    for (int b = b0; b < b1; b++) {
        float *o = out + (size_t)b * (size_t)W;
        memcpy(o, bottom + (size_t)b * (size_t)dim, sizeof(float) * (size_t)dim);
        int p = dim;
        for (int i = 1; i <= F; i++)
            for (int j = 0; j < i; j++)
                o[p++] = dot(vec(bottom, emb, emb_stride, dim, b, i),
                             vec(bottom, emb, emb_stride, dim, b, j), dim);
    }
}

void pst_interact_backward(float *dbottom, float *demb, int demb_stride, const float *dout,
                           const float *bottom, const float *emb, int emb_stride, int F,
                           int dim, int b0, int b1)
{
    const int W = pst_interact_width(F, dim);
    for (int b = b0; b < b1; b++) {
        const float *g = dout + (size_t)b * (size_t)W;
        float *d0 = dbottom + (size_t)b * (size_t)dim;
        float *de = demb + (size_t)b * (size_t)demb_stride;
        memcpy(d0, g, sizeof(float) * (size_t)dim);
        memset(de, 0, sizeof(float) * (size_t)F * (size_t)dim);
        int p = dim;
        for (int i = 1; i <= F; i++)
            for (int j = 0; j < i; j++, p++) {
                const float *vi = vec(bottom, emb, emb_stride, dim, b, i);
                const float *vj = vec(bottom, emb, emb_stride, dim, b, j);
                float *di = de + (size_t)(i - 1) * (size_t)dim;
                float *dj = j ? de + (size_t)(j - 1) * (size_t)dim : d0;
                for (int k = 0; k < dim; k++) {
                    di[k] += g[p] * vj[k];
                    dj[k] += g[p] * vi[k];
                }
            }
    }
}

void pst_bce_logits(float *losses, float *dlogits, const float *logits, const int32_t *labels,
                    float scale, int b0, int b1)
{
    for (int b = b0; b < b1; b++) {
        const double x = logits[b], y = labels[b];
        losses[b] = (float)(fmax(x, 0.0) - x * y + log1p(exp(-fabs(x))));
        const float p = (float)(1.0 / (1.0 + exp(-x)));
        dlogits[b] = scale == 0.0f ? p : (p - (float)y) * scale;
    }
}
