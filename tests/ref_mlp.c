/* ref_mlp.c — the tests' reference MLP (see ref_mlp.h). */
#include "ref_mlp.h"

#include <math.h>
#include <string.h>

#include "common/nn/layers.h"
#include "common/rng.h"

size_t ref_mlp_param_count(const ref_mlp_config *cfg)
{
    size_t n = 0;
    int in = cfg->in_dim;
    for (int l = 0; l <= cfg->nhidden; l++) {
        int out = l < cfg->nhidden ? cfg->hidden[l] : cfg->out_dim;
        n += (size_t)out * (size_t)in + (size_t)out;
        in = out;
    }
    return n;
}

static pst_status alloc_floats(pst_device *dev, size_t n, float **out)
{
    void *p = NULL;
    pst_status st = pst_device_alloc(dev, n * sizeof(float), &p);
    *out = p;
    return st;
}

pst_status ref_mlp_init(ref_mlp *m, const ref_mlp_config *cfg, int max_batch, pst_device *dev)
{
    memset(m, 0, sizeof *m);
    if (cfg->in_dim <= 0 || cfg->out_dim <= 0 || cfg->nhidden < 0 ||
        cfg->nhidden > PST_MAX_HIDDEN || max_batch <= 0)
        return pst_error_set(PST_ERR_INVALID,
                             "mlp: bad shape (in %d, out %d, %d hidden layers, batch %d)",
                             cfg->in_dim, cfg->out_dim, cfg->nhidden, max_batch);
    for (int l = 0; l < cfg->nhidden; l++)
        if (cfg->hidden[l] <= 0)
            return pst_error_set(PST_ERR_INVALID, "mlp: hidden layer %d has width %d", l,
                                 cfg->hidden[l]);
    m->cfg = *cfg;
    m->nlayers = cfg->nhidden + 1;
    m->max_batch = max_batch;
    m->dev = dev;
    m->nparams = ref_mlp_param_count(cfg);

    size_t off = 0;
    int in = cfg->in_dim, widest = cfg->in_dim;
    for (int l = 0; l < m->nlayers; l++) {
        int out = l < cfg->nhidden ? cfg->hidden[l] : cfg->out_dim;
        m->layer[l] = (ref_linear_view){.in = in, .out = out, .w_off = off,
                                        .b_off = off + (size_t)out * in};
        off += (size_t)out * in + out;
        widest = out > widest ? out : widest;
        in = out;
    }

    pst_status st;
    if ((st = alloc_floats(dev, m->nparams, &m->params)) != PST_OK ||
        (st = alloc_floats(dev, m->nparams, &m->grads)) != PST_OK ||
        (st = alloc_floats(dev, (size_t)max_batch * cfg->out_dim, &m->probs)) != PST_OK ||
        (st = alloc_floats(dev, (size_t)max_batch * widest, &m->dbuf[0])) != PST_OK ||
        (st = alloc_floats(dev, (size_t)max_batch * widest, &m->dbuf[1])) != PST_OK)
        goto error;
    for (int l = 0; l < m->nlayers; l++)
        if ((st = alloc_floats(dev, (size_t)max_batch * m->layer[l].out, &m->acts[l])) != PST_OK)
            goto error;
    return PST_OK;
error:
    ref_mlp_free(m);
    return st;
}

void ref_mlp_free(ref_mlp *m)
{
    if (!m || !m->dev)
        return;
    pst_device_free(m->dev, m->params);
    pst_device_free(m->dev, m->grads);
    pst_device_free(m->dev, m->probs);
    pst_device_free(m->dev, m->dbuf[0]);
    pst_device_free(m->dev, m->dbuf[1]);
    for (int l = 0; l < PST_MAX_HIDDEN + 1; l++)
        pst_device_free(m->dev, m->acts[l]);
    memset(m, 0, sizeof *m);
}

void ref_mlp_init_params_into(const ref_mlp *m, float *dst, uint64_t seed)
{
    for (int l = 0; l < m->nlayers; l++) {
        const ref_linear_view *v = &m->layer[l];
        pst_rng r;
        pst_rng_seed(&r, seed, (uint64_t)l);
        float bound = 1.0f / sqrtf((float)v->in);
        size_t n = (size_t)v->out * v->in + v->out; /* weight then bias, contiguous */
        float *p = dst + v->w_off;
        for (size_t i = 0; i < n; i++)
            p[i] = (2.0f * pst_rng_uniform(&r) - 1.0f) * bound;
    }
}

void ref_mlp_init_params(ref_mlp *m, uint64_t seed)
{
    ref_mlp_init_params_into(m, m->params, seed);
}

double ref_mlp_forward(ref_mlp *m, const float *x, const int32_t *y, int B)
{
    const float *inp = x;
    for (int l = 0; l < m->nlayers; l++) {
        const ref_linear_view *v = &m->layer[l];
        pst_linear_forward(m->acts[l], inp, m->params + v->w_off, m->params + v->b_off, B,
                           v->in, v->out, l < m->nlayers - 1);
        inp = m->acts[l];
    }
    return pst_softmax_xent_forward(m->probs, m->acts[m->nlayers - 1], y, B, m->cfg.out_dim);
}

void ref_mlp_backward(ref_mlp *m, const float *x, const int32_t *y, int B, float scale,
                      int accumulate, ref_grad_ready_fn ready, void *ready_arg)
{
    float *dout = m->dbuf[0], *dinp = m->dbuf[1];
    pst_softmax_xent_backward(dout, m->probs, y, B, m->cfg.out_dim, scale);
    for (int l = m->nlayers - 1; l >= 0; l--) {
        const ref_linear_view *v = &m->layer[l];
        const float *inp = l > 0 ? m->acts[l - 1] : x;
        pst_linear_backward(l > 0 ? dinp : NULL, m->grads + v->w_off, m->grads + v->b_off,
                            dout, inp, m->params + v->w_off, B, v->in, v->out, accumulate);
        if (ready)
            ready(ready_arg, v->w_off, (size_t)v->out * v->in + v->out);
        if (l > 0) {
            /* Through the previous layer's ReLU: its output is this layer's input. */
            pst_relu_backward(dinp, dinp, m->acts[l - 1], (int64_t)B * v->in);
            float *t = dout;
            dout = dinp;
            dinp = t;
        }
    }
}

int ref_mlp_count_correct(const ref_mlp *m, const int32_t *y, int B)
{
    const float *logits = m->acts[m->nlayers - 1];
    int C = m->cfg.out_dim, correct = 0;
    for (int b = 0; b < B; b++) {
        const float *r = logits + (int64_t)b * C;
        int best = 0;
        for (int j = 1; j < C; j++)
            if (r[j] > r[best])
                best = j;
        correct += best == y[b];
    }
    return correct;
}
