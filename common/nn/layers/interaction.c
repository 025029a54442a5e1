/* interaction.c — DLRM's pairwise dot-product interaction as a layer (model.h): the bottom
 * MLP's output (its input) with the row's sparse embeddings (io->sparse), no tensors. */
#include "common/nn/ctr_layers.h"
#include "common/nn/model.h"
#include "common/nn/ops.h"

typedef struct interact_inst {
    pst_interact_args fwd, bwd;
    pst_relu_bwd_args mask; /* PST_INTERACT_MASK_INPUT: din through the input's ReLU */
} interact_inst;

static void interact_bind(void *inst, const pst_model *m, int layer, const pst_layer_io *io)
{
    interact_inst *it = inst;
    const int F = m->sparse_fields, dim = m->sparse_dim;
    it->fwd = (pst_interact_args){.out = io->out, .bottom = io->in, .emb = io->sparse,
                                  .emb_stride = F * dim, .F = F, .dim = dim, .pool = io->pool};
    it->bwd = (pst_interact_args){.dbottom = io->din, .demb = io->dsparse, .dout = io->dout,
                                  .bottom = io->in, .emb = io->sparse, .emb_stride = F * dim,
                                  .demb_stride = F * dim, .F = F, .dim = dim, .pool = io->pool};
    it->mask = (pst_relu_bwd_args){.dinp = io->din, .dout = io->din, .out = io->in};
    if (!(m->layers[layer].flags & PST_INTERACT_MASK_INPUT))
        it->mask.dinp = NULL;
}

static pst_status interact_forward(void *inst, pst_stream *s, int B, float scale)
{
    (void)scale;
    interact_inst *it = inst;
    it->fwd.B = B;
    return pst_op_interact_forward(s, &it->fwd);
}

/* The gradients of both inputs in one op: the embeddings' for the trainer's push, the
 * bottom output's for the layers below (masked by their ReLU when flagged). */
static pst_status interact_igrad(void *inst, pst_stream *s, int B)
{
    interact_inst *it = inst;
    if (!it->bwd.dbottom || !it->bwd.demb)
        return PST_OK;
    it->bwd.B = B;
    PST_TRY(pst_op_interact_backward(s, &it->bwd));
    if (!it->mask.dinp)
        return PST_OK;
    it->mask.n = (int64_t)B * it->bwd.dim;
    return pst_op_relu_backward(s, &it->mask);
}

static double interact_cost(const pst_model *m, int layer)
{
    (void)layer;
    const double F = m->sparse_fields, dim = m->sparse_dim;
    return (F + 1.0) * F / 2.0 * dim;
}

PST_LAYER_CLASS(interaction, interact_inst, .bind = interact_bind, .forward = interact_forward,
                .igrad = interact_igrad, .cost = interact_cost);
