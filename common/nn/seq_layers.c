/* seq_layers.c — CPU kernels for embedding, LayerNorm, causal attention and GELU (see
 * seq_layers.h).
 *
 * DESIGN: float arithmetic throughout (as the trainer's other kernels and llm.c), sums in
 * a fixed order. Attention is computed one query at a time: the query's scores against its
 * visible keys go into a T-float scratch, are turned into probabilities in place (the
 * softmax and the causal mask in one pass: masked keys are never scored), and weight the
 * values. The backward recomputes each query's probabilities from the scores and the
 * saved log-sum-exp instead of keeping a (T, T) matrix per head from the forward. */
#include "common/nn/seq_layers.h"

#include <math.h>
#include <string.h>

void pst_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int B, int T, int C, int c0, int c1)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((int64_t)b * T + t) * C;
            const float *e = wte + (int64_t)tokens[(int64_t)b * T + t] * C;
            const float *p = wpe + (int64_t)t * C;
            for (int c = c0; c < c1; c++)
                o[c] = e[c] + p[c];
        }
}

void pst_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                            int B, int T, int C, int V, int accumulate, int c0, int c1)
{
    if (c1 <= c0)
        return;
    if (!accumulate) {
        for (int v = 0; dwte && v < V; v++)
            memset(dwte + (int64_t)v * C + c0, 0, sizeof(float) * (size_t)(c1 - c0));
        for (int t = 0; dwpe && t < T; t++)
            memset(dwpe + (int64_t)t * C + c0, 0, sizeof(float) * (size_t)(c1 - c0));
    }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((int64_t)b * T + t) * C;
            if (dwte) {
                float *e = dwte + (int64_t)tokens[(int64_t)b * T + t] * C;
                for (int c = c0; c < c1; c++)
                    e[c] += d[c];
            }
            if (dwpe) {
                float *p = dwpe + (int64_t)t * C;
                for (int c = c0; c < c1; c++)
                    p[c] += d[c];
            }
        }
}

void pst_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C, int r0, int r1)
{
    (void)N;
    for (int r = r0; r < r1; r++) {
        const float *x = inp + (int64_t)r * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++)
            m += x[c];
        m /= (float)C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            v += d * d;
        }
        v /= (float)C;
        const float s = 1.0f / sqrtf(v + PST_LN_EPS);
        float *o = out + (int64_t)r * C;
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - m) * s * w[c] + b[c];
        if (mean)
            mean[r] = m;
        if (rstd)
            rstd[r] = s;
    }
}

void pst_layernorm_backward_input(float *dinp, const float *dout, const float *inp,
                                  const float *w, const float *mean, const float *rstd, int N,
                                  int C, int dinp_accumulate, int r0, int r1)
{
    (void)N;
    for (int r = r0; r < r1; r++) {
        const float *x = inp + (int64_t)r * C, *d = dout + (int64_t)r * C;
        const float m = mean[r], s = rstd[r];
        /* the means of dnorm and of dnorm * norm, with dnorm = w * dout */
        float dm = 0.0f, dnm = 0.0f;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s, dnorm = w[c] * d[c];
            dm += dnorm;
            dnm += dnorm * norm;
        }
        dm /= (float)C;
        dnm /= (float)C;
        float *di = dinp + (int64_t)r * C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s, dnorm = w[c] * d[c];
            float g = (dnorm - dm - norm * dnm) * s;
            di[c] = dinp_accumulate ? di[c] + g : g;
        }
    }
}

void pst_layernorm_backward_params(float *dw, float *db, const float *dout, const float *inp,
                                   const float *mean, const float *rstd, int N, int C,
                                   int accumulate, int c0, int c1)
{
    if (c1 <= c0)
        return;
    if (!accumulate) {
        memset(dw + c0, 0, sizeof(float) * (size_t)(c1 - c0));
        memset(db + c0, 0, sizeof(float) * (size_t)(c1 - c0));
    }
    for (int r = 0; r < N; r++) {
        const float *x = inp + (int64_t)r * C, *d = dout + (int64_t)r * C;
        const float m = mean[r], s = rstd[r];
        for (int c = c0; c < c1; c++) {
            db[c] += d[c];
            dw[c] += (x[c] - m) * s * d[c];
        }
    }
}

void pst_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int H,
                           float *scratch, int bh0, int bh1)
{
    const int hs = C / H, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    (void)B; /* pairs are given by [bh0, bh1) */
    for (int bh = bh0; bh < bh1; bh++) {
        const int b = bh / H, h = bh % H;
        const float *base = qkv + (int64_t)b * T * C3;
        for (int t = 0; t < T; t++) {
            const float *q = base + (int64_t)t * C3 + h * hs;
            float m = -INFINITY;
            for (int j = 0; j <= t; j++) {
                const float *k = base + (int64_t)j * C3 + C + h * hs;
                float s = 0.0f;
                for (int i = 0; i < hs; i++)
                    s += q[i] * k[i];
                s *= scale;
                scratch[j] = s;
                m = s > m ? s : m;
            }
            float sum = 0.0f;
            for (int j = 0; j <= t; j++) {
                scratch[j] = expf(scratch[j] - m);
                sum += scratch[j];
            }
            const float inv = 1.0f / sum;
            float *o = out + ((int64_t)b * T + t) * C + h * hs;
            for (int i = 0; i < hs; i++)
                o[i] = 0.0f;
            for (int j = 0; j <= t; j++) {
                const float *v = base + (int64_t)j * C3 + 2 * C + h * hs;
                const float p = scratch[j] * inv;
                for (int i = 0; i < hs; i++)
                    o[i] += p * v[i];
            }
            lse[((int64_t)b * H + h) * T + t] = m + logf(sum);
        }
    }
}

void pst_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *lse,
                            int B, int T, int C, int H, float *scratch, int bh0, int bh1)
{
    const int hs = C / H, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    float *p = scratch, *dp = scratch + T;
    (void)B;
    for (int bh = bh0; bh < bh1; bh++) {
        const int b = bh / H, h = bh % H;
        const float *base = qkv + (int64_t)b * T * C3;
        float *dbase = dqkv + (int64_t)b * T * C3;
        for (int t = 0; t < T; t++)
            for (int part = 0; part < 3; part++)
                memset(dbase + (int64_t)t * C3 + part * C + h * hs, 0, sizeof(float) * (size_t)hs);
        for (int t = 0; t < T; t++) {
            const float *q = base + (int64_t)t * C3 + h * hs;
            const float *d = dout + ((int64_t)b * T + t) * C + h * hs;
            const float l = lse[((int64_t)b * H + h) * T + t];
            /* p_j recomputed; dp_j = dout_t . v_j; D = sum_j p_j dp_j */
            float D = 0.0f;
            for (int j = 0; j <= t; j++) {
                const float *k = base + (int64_t)j * C3 + C + h * hs;
                const float *v = base + (int64_t)j * C3 + 2 * C + h * hs;
                float s = 0.0f, g = 0.0f;
                for (int i = 0; i < hs; i++) {
                    s += q[i] * k[i];
                    g += d[i] * v[i];
                }
                p[j] = expf(s * scale - l);
                dp[j] = g;
                D += p[j] * g;
            }
            float *dq = dbase + (int64_t)t * C3 + h * hs;
            for (int j = 0; j <= t; j++) {
                const float *k = base + (int64_t)j * C3 + C + h * hs;
                float *dk = dbase + (int64_t)j * C3 + C + h * hs;
                float *dv = dbase + (int64_t)j * C3 + 2 * C + h * hs;
                const float ds = p[j] * (dp[j] - D) * scale;
                for (int i = 0; i < hs; i++) {
                    dq[i] += ds * k[i];
                    dk[i] += ds * q[i];
                    dv[i] += p[j] * d[i];
                }
            }
        }
    }
}

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K 0.044715f

void pst_gelu_forward(float *out, const float *inp, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_S * (x + GELU_K * x * x * x)));
    }
}

void pst_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float u = GELU_S * (x + GELU_K * x * x * x);
        const float th = tanhf(u);
        const float sech2 = 1.0f - th * th;
        const float local = 0.5f * (1.0f + th) +
                            0.5f * x * sech2 * GELU_S * (1.0f + 3.0f * GELU_K * x * x);
        dinp[i] = local * dout[i];
    }
}
