/* linear.c — the Linear layer (model.h): out = in @ W^T + b, optionally through a ReLU,
 * on the ops of ops.h. Its weight gradient can be computed by ranges of W's rows, cut on
 * tiles of PST_ROW_TILE rows (layers.h) so the bits do not depend on the cuts. */
#include "common/nn/model.h"
#include "common/nn/ops.h"

typedef struct linear_inst {
    pst_linear_fwd_args fwd;
    pst_linear_bwd_args wgrad; /* the template each chunk's record is copied from */
    pst_linear_bwd_args igrad; /* PST_LINEAR_MASK_INPUT: din through the input's ReLU in
                                * the same op (igrad.mask) */
} linear_inst;

static void linear_bind(void *inst, const pst_model *m, int layer, const pst_layer_io *io)
{
    linear_inst *li = inst;
    const pst_layer *ly = &m->layers[layer];
    const pst_tensor *w = &m->tensors[ly->tensor[0]];
    const int OC = (int)w->shape[0], IC = (int)w->shape[1];
    li->fwd = (pst_linear_fwd_args){.out = io->out, .inp = io->in, .w = io->w[0],
                                    .w16 = io->w16[0], .b = io->w[1], .IC = IC, .OC = OC,
                                    .relu = (ly->flags & PST_LINEAR_RELU) != 0, .pool = io->pool};
    li->wgrad = (pst_linear_bwd_args){.dw = io->g[0], .db = io->g[1],
                                      .dout = io->dout, .inp = io->in,
                                      .w = io->w[0], .w16 = io->w16[0], .IC = IC,
                                      .OC = OC, .accumulate = pst_layer_adds_grad(io, ly, 3u),
                                      .pool = io->pool, .rows_done = io->rows_done,
                                      .rows_arg = io->rows_arg};
    li->igrad = (pst_linear_bwd_args){.dinp = io->din, .dout = io->dout, .inp = io->in,
                                      .w = io->w[0], .w16 = io->w16[0], .IC = IC, .OC = OC,
                                      .pool = io->pool,
                                      .mask = io->din && (ly->flags & PST_LINEAR_MASK_INPUT)
                                                  ? io->in : NULL};
}

static pst_status linear_forward(void *inst, pst_stream *s, int B, float scale)
{
    (void)scale;
    linear_inst *li = inst;
    li->fwd.B = B;
    return pst_op_linear_forward(s, &li->fwd);
}

static pst_status linear_wgrad(void *inst, void *chunk, pst_stream *s, int B, int row0, int row1)
{
    linear_inst *li = inst;
    pst_linear_bwd_args *a = chunk;
    *a = li->wgrad;
    a->B = B;
    a->row0 = row0;
    a->row1 = row1;
    return pst_op_linear_backward(s, a);
}

static pst_status linear_igrad(void *inst, pst_stream *s, int B)
{
    linear_inst *li = inst;
    if (!li->igrad.dinp)
        return PST_OK;
    li->igrad.B = B;
    return pst_op_linear_backward(s, &li->igrad);
}

PST_LAYER_CLASS(linear, linear_inst, .chunk_bytes = sizeof(pst_linear_bwd_args),
                .bind = linear_bind, .forward = linear_forward, .wgrad = linear_wgrad,
                .igrad = linear_igrad, .rows_updatable = 1, .gemm_weights = 1u);
