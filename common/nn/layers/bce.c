/* bce.c — binary cross-entropy on a logit, the click model's loss layer (model.h). Forward
 * and backward are one pass (ops.h's pst_op_bce_logits), as softmax_xent's;
 * scale 0 writes the sigmoids to dlogits. */
#include "common/nn/model.h"
#include "common/nn/ops.h"

static void bce_bind(void *inst, const pst_model *m, int layer, const pst_layer_io *io)
{
    (void)m, (void)layer;
    *(pst_bce_args *)inst = (pst_bce_args){.losses = io->losses, .dlogits = io->din,
                                           .logits = io->in, .labels = io->targets};
}

PST_LOSS_LAYER_CLASS(bce, pst_bce_args, pst_op_bce_logits, bce_bind);
