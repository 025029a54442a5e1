/* fixed_grad.c — the synthetic model's layer (model.h): it computes nothing. Its weight
 * gradient is a fixed host array (the model's data) copied into the gradient buffer once,
 * and again only where something else may have written there (io->grads_gen NULL: every
 * step, as with several devices, whose reduce adds into one's buffer), so a step costs
 * only what the exchange costs; its losses are zeros. It never reads the parameters'
 * values. */
#include "common/nn/model.h"

typedef struct fixed_inst {
    const float *host_grad;
    float *grads;
    float *losses;
    size_t n;
    int accumulate;
    const uint64_t *gen; /* io->grads_gen */
    uint64_t wrote_at;   /* *gen + 1 when grads last got host_grad; 0: not known */
} fixed_inst;

/* The executor binds again whenever a step uses the other parameter buffer: what was
 * written stays known while the buffer and its count are the same. */
static void fixed_bind(void *inst, const pst_model *m, int layer, const pst_layer_io *io)
{
    fixed_inst *fi = inst;
    const uint64_t at = fi->grads == io->g[0] && fi->gen == io->grads_gen ? fi->wrote_at : 0;
    *fi = (fixed_inst){.host_grad = m->data, .grads = io->g[0], .losses = io->losses,
                       .n = m->tensors[m->layers[layer].tensor[0]].numel,
                       .accumulate = io->accumulate, .gen = io->grads_gen,
                       .wrote_at = at};
}

static pst_status fixed_forward(void *inst, pst_stream *s, int B, float scale)
{
    (void)scale;
    fixed_inst *fi = inst;
    return pst_memset_async(s, fi->losses, 0, sizeof(float) * (size_t)B);
}

static pst_status fixed_wgrad(void *inst, void *chunk, pst_stream *s, int B, int row0, int row1)
{
    (void)chunk, (void)B, (void)row0, (void)row1;
    fixed_inst *fi = inst;
    if (fi->accumulate) /* the fixed gradient is one optimizer step's, whatever the
                         * micro-batches: later ones leave it as it is */
        return PST_OK;
    if (fi->gen && fi->wrote_at == *fi->gen + 1) /* still there */
        return PST_OK;
    PST_TRY(pst_memcpy_async(s, fi->grads, fi->host_grad, sizeof(float) * fi->n,
                             PST_COPY_HOST_TO_DEVICE));
    fi->wrote_at = fi->gen ? *fi->gen + 1 : 0;
    return PST_OK;
}

PST_LAYER_CLASS(fixed_grad, fixed_inst, .bind = fixed_bind, .forward = fixed_forward,
                .wgrad = fixed_wgrad, .weights_unread = 1);
