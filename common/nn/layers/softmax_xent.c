/* softmax_xent.c — the softmax cross-entropy loss layer (model.h). Forward and backward
 * are one pass (ops.h's pst_op_softmax_xent): forward already writes the gradient of the
 * logits, so the layer has no backward op of its own; scale 0 writes the softmax to
 * dlogits. */
#include "common/nn/model.h"
#include "common/nn/ops.h"

static void xent_bind(void *inst, const pst_model *m, int layer, const pst_layer_io *io)
{
    *(pst_xent_args *)inst = (pst_xent_args){
        .losses = io->losses, .correct = io->correct, .dlogits = io->din, .logits = io->in,
        .targets = io->targets, .C = m->layers[layer].in_width};
}

PST_LOSS_LAYER_CLASS(softmax_xent, pst_xent_args, pst_op_softmax_xent, xent_bind);
