/* mlp.c — the `mlp` model on the model interface (see models.h). */
#include <math.h>
#include <stdio.h>

#include "common/nn/layers.h"
#include "common/nn/models/models.h"
#include "common/rng.h"

void pst_init_linear_layers(const pst_model *m, float *dst, uint64_t seed)
{
    for (int l = 0; l < m->nlayers; l++) {
        if (m->layers[l].cls != &pst_layer_linear)
            continue;
        const pst_tensor *w = &m->tensors[m->layers[l].tensor[0]];
        const pst_tensor *b = &m->tensors[m->layers[l].tensor[1]];
        pst_rng r;
        pst_rng_seed(&r, seed, (uint64_t)l);
        const float bound = 1.0f / sqrtf((float)w->shape[1]);
        for (size_t i = 0; i < w->numel; i++) /* the weight, then the bias: one stream */
            dst[w->offset + i] = (2.0f * pst_rng_uniform(&r) - 1.0f) * bound;
        for (size_t i = 0; i < b->numel; i++)
            dst[b->offset + i] = (2.0f * pst_rng_uniform(&r) - 1.0f) * bound;
    }
}

pst_status pst_model_mlp(pst_model *m, int in_dim, int nclasses, int nhidden, const int *hidden)
{
    *m = (pst_model){.name = "mlp", .in_width = in_dim, .nclasses = nclasses, .target_width = 1,
                     .init_params = pst_init_linear_layers};
    pst_status st = PST_OK;
    if (in_dim < 1 || nclasses < 1 || nhidden < 0 || nhidden > PST_MAX_HIDDEN) {
        st = pst_error_set(PST_ERR_INVALID, "mlp: bad shape (in %d, %d classes, %d hidden "
                           "layers; at most %d)", in_dim, nclasses, nhidden, PST_MAX_HIDDEN);
        goto error;
    }
    int in = in_dim;
    for (int l = 0; l <= nhidden; l++) {
        const int out = l < nhidden ? hidden[l] : nclasses;
        if (out < 1) {
            st = pst_error_set(PST_ERR_INVALID, "mlp: hidden layer %d has width %d", l, out);
            goto error;
        }
        char name[32];
        const int64_t wshape[2] = {out, in}, bshape[1] = {out};
        snprintf(name, sizeof name, "l%d.weight", l);
        if ((st = pst_model_add_tensor(m, name, 2, wshape)) != PST_OK)
            goto error;
        snprintf(name, sizeof name, "l%d.bias", l);
        if ((st = pst_model_add_tensor(m, name, 1, bshape)) != PST_OK)
            goto error;
        const pst_layer linear = {
            .cls = &pst_layer_linear, .tensor = {m->ntensors - 2, m->ntensors - 1}, .ntensors = 2,
            .in_width = in, .out_width = out, .split_rows = out, .split_tile = PST_ROW_TILE,
            .flags = (l < nhidden ? PST_LINEAR_RELU : 0) | (l > 0 ? PST_LINEAR_MASK_INPUT : 0)};
        if ((st = pst_model_add_layer(m, &linear)) != PST_OK)
            goto error;
        in = out;
    }
    const pst_layer loss = {.cls = &pst_layer_softmax_xent, .in_width = nclasses};
    if ((st = pst_model_add_layer(m, &loss)) != PST_OK || (st = pst_model_check(m)) != PST_OK)
        goto error;
    return PST_OK;
error:
    pst_model_free(m);
    return st;
}
