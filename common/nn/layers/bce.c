/* bce.c — binary cross-entropy on a logit, the click model's loss layer (model.h). Forward
 * and backward are one pass (ops.h's pst_op_bce_logits), as softmax_xent's. */
#include "common/nn/model.h"
#include "common/nn/ops.h"

static void bce_bind(void *inst, const pst_model *m, int layer, const pst_layer_io *io)
{
    (void)m, (void)layer;
    *(pst_bce_args *)inst = (pst_bce_args){.losses = io->losses, .dlogits = io->din,
                                           .logits = io->in, .labels = io->targets};
}

static pst_status bce_forward(void *inst, pst_stream *s, int B, float scale)
{
    pst_bce_args *a = inst;
    a->B = B;
    a->scale = scale;
    return pst_op_bce_logits(s, a);
}

static const float *bce_probs(void *inst)
{
    return ((pst_bce_args *)inst)->dlogits; /* scale 0 writes the sigmoids there */
}

PST_LAYER_CLASS(bce, pst_bce_args, .bind = bce_bind, .forward = bce_forward, .probs = bce_probs);
