/* softmax_xent.c — the softmax cross-entropy loss layer (model.h). Forward and backward
 * are one pass (ops.h's pst_op_softmax_xent): forward already writes the gradient of the
 * logits, so the layer has no backward op of its own. */
#include "common/nn/model.h"
#include "common/nn/ops.h"

static void xent_bind(void *inst, const pst_model *m, int layer, const pst_layer_io *io)
{
    *(pst_xent_args *)inst = (pst_xent_args){
        .losses = io->losses, .correct = io->correct, .dlogits = io->din, .logits = io->in,
        .targets = io->targets, .C = m->layers[layer].in_width};
}

static pst_status xent_forward(void *inst, pst_stream *s, int B, float scale)
{
    pst_xent_args *a = inst;
    a->B = B;
    a->scale = scale;
    return pst_op_softmax_xent(s, a);
}

static const float *xent_probs(void *inst)
{
    return ((pst_xent_args *)inst)->dlogits; /* scale 0 writes the softmax there */
}

PST_LAYER_CLASS(softmax_xent, pst_xent_args, .bind = xent_bind, .forward = xent_forward,
                .probs = xent_probs);
