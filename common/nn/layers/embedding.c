/* embedding.c — token + position embedding (model.h): the first layer of a model whose
 * input rows are T token ids. Its weight gradient adds rows in (sequence, position) order;
 * a tied token table (named again by a later layer) is added to, not overwritten. */
#include "common/nn/model.h"
#include "common/nn/ops.h"

typedef struct embedding_inst {
    pst_embedding_fwd_args fwd;
    pst_embedding_bwd_args bwd;
} embedding_inst;

static void embedding_bind(void *inst, const pst_model *m, int layer, const pst_layer_io *io)
{
    embedding_inst *e = inst;
    const pst_layer *ly = &m->layers[layer];
    const pst_tensor *wte = &m->tensors[ly->tensor[0]], *wpe = &m->tensors[ly->tensor[1]];
    const int V = (int)wte->shape[0], C = (int)wte->shape[1], T = (int)wpe->shape[0];
    e->fwd = (pst_embedding_fwd_args){.out = io->out, .tokens = io->tokens,
                                      .wte = io->w[0],
                                      .wpe = io->w[1], .T = T, .C = C,
                                      .pool = io->pool};
    e->bwd = (pst_embedding_bwd_args){.dwte = io->g[0], .dwpe = io->g[1], .dout = io->dout,
                                      .tokens = io->tokens, .T = T, .C = C, .V = V,
                                      .wte_accumulate = pst_layer_adds_grad(io, ly, 1u),
                                      .wpe_accumulate = pst_layer_adds_grad(io, ly, 2u),
                                      .pool = io->pool};
}

static pst_status embedding_forward(void *inst, pst_stream *s, int B, float scale)
{
    (void)scale;
    embedding_inst *e = inst;
    e->fwd.B = B;
    return pst_op_embedding_forward(s, &e->fwd);
}

static pst_status embedding_wgrad(void *inst, void *chunk, pst_stream *s, int B, int row0,
                                  int row1)
{
    (void)chunk, (void)row0, (void)row1;
    embedding_inst *e = inst;
    e->bwd.B = B;
    return pst_op_embedding_backward(s, &e->bwd);
}

/* a lookup and an add per value */
static double embedding_cost(const pst_model *m, int layer)
{
    return (double)m->layers[layer].out_width;
}

PST_LAYER_CLASS(embedding, embedding_inst, .bind = embedding_bind, .forward = embedding_forward,
                .wgrad = embedding_wgrad, .cost = embedding_cost);
