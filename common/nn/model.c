/* model.c — building and checking a model's tables (see model.h). */
#include "common/nn/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/memory.h"

pst_status pst_model_add_tensor(pst_model *m, const char *name, int ndim, const int64_t *shape)
{
    if (strlen(name) >= sizeof m->tensors[0].name || ndim < 1 || ndim > 4)
        return pst_error_set(PST_ERR_INVALID, "model %s: tensor '%s' with %d dimensions "
                             "(names up to 31 characters, 1 to 4 dimensions)", m->name, name, ndim);
    pst_tensor t = {.offset = m->nparams, .numel = 1, .ndim = ndim, .dtype = PST_F32};
    snprintf(t.name, sizeof t.name, "%s", name);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1)
            return pst_error_set(PST_ERR_INVALID, "model %s: tensor %s has dimension %d of "
                                 "size %lld (at least 1)", m->name, name, i, (long long)shape[i]);
        t.shape[i] = shape[i];
        t.numel *= (size_t)shape[i];
    }
    pst_tensor *grown = realloc(m->tensors, sizeof *grown * (size_t)(m->ntensors + 1));
    if (!grown)
        return pst_error_set(PST_ERR_NOMEM, "model %s: out of memory", m->name);
    m->tensors = grown;
    m->tensors[m->ntensors++] = t;
    m->nparams += t.numel;
    return PST_OK;
}

pst_status pst_model_add_layer(pst_model *m, const pst_layer *layer)
{
    if (layer->ntensors < 0 || layer->ntensors > PST_LAYER_MAX_TENSORS || layer->in_width < 0 ||
        layer->out_width < 0 || !layer->cls)
        return pst_error_set(PST_ERR_INVALID, "model %s: layer %d is malformed", m->name,
                             m->nlayers);
    for (int i = 0; i < layer->ntensors; i++)
        if (layer->tensor[i] < 0 || layer->tensor[i] >= m->ntensors)
            return pst_error_set(PST_ERR_INVALID, "model %s: layer %d names tensor %d of %d",
                                 m->name, m->nlayers, layer->tensor[i], m->ntensors);
    for (int i = 0; i < layer->ntensors; i++)
        for (int k = 0; k < i; k++)
            if (layer->tensor[k] == layer->tensor[i])
                return pst_error_set(PST_ERR_INVALID, "model %s: layer %d names tensor %d twice",
                                     m->name, m->nlayers, layer->tensor[i]);
    pst_layer *grown = realloc(m->layers, sizeof *grown * (size_t)(m->nlayers + 1));
    if (!grown)
        return pst_error_set(PST_ERR_NOMEM, "model %s: out of memory", m->name);
    m->layers = grown;
    /* An earlier layer runs its backward after this one: where they share a tensor, the
     * earlier one adds to the gradient this one writes. */
    for (int l = 0; l < m->nlayers; l++)
        for (int i = 0; i < m->layers[l].ntensors; i++)
            for (int k = 0; k < layer->ntensors; k++)
                if (m->layers[l].tensor[i] == layer->tensor[k])
                    m->layers[l].grad_accumulate |= 1u << i;
    m->layers[m->nlayers] = *layer;
    m->layers[m->nlayers].grad_accumulate = 0;
    m->nlayers++;
    return PST_OK;
}

pst_status pst_model_check(const pst_model *m)
{
    if (m->nlayers < 1 || m->nparams == 0)
        return pst_error_set(PST_ERR_INVALID, "model %s: no layers or no parameters", m->name);
    int width = m->in_width;
    for (int l = 0; l < m->nlayers; l++) {
        const pst_layer *ly = &m->layers[l];
        if (ly->in_width != width)
            return pst_error_set(PST_ERR_INVALID, "model %s: layer %d (%s) reads %d floats "
                                 "per row, the layer before it gives %d", m->name, l,
                                 ly->cls->name, ly->in_width, width);
        width = ly->out_width;
        if (ly->ntensors > 0 && !ly->cls->wgrad)
            return pst_error_set(PST_ERR_INVALID, "model %s: layer %d (%s) names parameters "
                                 "but computes no weight gradient", m->name, l, ly->cls->name);
        if (ly->split_rows > 0 &&
            (ly->ntensors < 1 || m->tensors[ly->tensor[0]].shape[0] != ly->split_rows ||
             ly->split_tile < 1 || !ly->cls->wgrad))
            return pst_error_set(PST_ERR_INVALID, "model %s: layer %d (%s) splits %d rows of "
                                 "a tensor that does not have them", m->name, l, ly->cls->name,
                                 ly->split_rows);
    }
    if (m->target_width < 1)
        return pst_error_set(PST_ERR_INVALID, "model %s: %d labels per row (at least 1)",
                             m->name, m->target_width);
    for (int t = 0; t < m->ntensors; t++) {
        int named = 0;
        for (int l = 0; l < m->nlayers && !named; l++)
            for (int i = 0; i < m->layers[l].ntensors; i++)
                named |= m->layers[l].tensor[i] == t;
        if (!named)
            return pst_error_set(PST_ERR_INVALID, "model %s: no layer uses tensor %s (its "
                                 "gradient would never be final)", m->name, m->tensors[t].name);
    }
    return PST_OK;
}

int pst_model_find_tensor(const pst_model *m, const char *name)
{
    for (int t = 0; t < m->ntensors; t++)
        if (strcmp(m->tensors[t].name, name) == 0)
            return t;
    return -1;
}

void pst_model_free(pst_model *m)
{
    if (!m)
        return;
    PST_FREE_ALL(m->tensors, m->layers, m->data);
    memset(m, 0, sizeof *m);
}

void pst_layer_io_point(pst_layer_io *io, const pst_model *m, int layer, const float *params,
                        float *grads)
{
    const pst_layer *ly = &m->layers[layer];
    for (int k = 0; k < ly->ntensors; k++) {
        const size_t off = m->tensors[ly->tensor[k]].offset;
        if (params)
            io->w[k] = params + off;
        if (grads)
            io->g[k] = grads + off;
    }
}

int pst_layer_adds_grad(const pst_layer_io *io, const pst_layer *ly, uint32_t mask)
{
    return io->accumulate || (ly->grad_accumulate & mask) != 0;
}
