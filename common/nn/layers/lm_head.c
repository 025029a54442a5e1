/* lm_head.c — the language-model loss layer (model.h): final LayerNorm, logits through the
 * output projection tied to the token embedding, softmax cross-entropy at every position.
 * Forward writes the gradient of the logits (the cross-entropy op does both in one pass,
 * scaled by scale / T: a row's loss is the mean over its T positions); the weight gradient
 * writes the projection's part of the token table's gradient and the LayerNorm's; the
 * input gradient goes through the LayerNorm.
 * Kept from forward (save, per row): the normalized x (T*C), its mean and rstd (T each),
 * the logits and their gradient (T*V each). Scratch (work): the gradient of the normalized
 * x (T*C). */
#include "common/nn/model.h"
#include "common/nn/ops.h"

typedef struct lm_head_inst {
    pst_layernorm_args ln, ln_wgrad, ln_igrad;
    pst_linear_fwd_args proj;
    pst_linear_bwd_args proj_bwd;
    pst_xent_args xent;
    int T;
} lm_head_inst;

static void lm_head_bind(void *inst, const pst_model *m, int layer, const pst_layer_io *io)
{
    lm_head_inst *h = inst;
    const pst_layer *ly = &m->layers[layer];
    const pst_tensor *lw = &m->tensors[ly->tensor[0]];
    const pst_tensor *wte = &m->tensors[ly->tensor[2]];
    const int C = (int)lw->shape[0], V = (int)wte->shape[0], T = ly->in_width / C;
    const size_t NM = (size_t)io->max_batch * (size_t)T;
    float *lnf = io->save, *mean = lnf + NM * C, *rstd = mean + NM, *logits = rstd + NM;
    float *dlogits = logits + NM * V, *dlnf = io->work;
    h->T = T;
    h->ln = (pst_layernorm_args){.out = lnf, .mean = mean, .rstd = rstd, .inp = io->in,
                                 .w = io->w[0], .b = io->w[1],
                                 .C = C, .pool = io->pool};
    h->proj = (pst_linear_fwd_args){.out = logits, .inp = lnf, .w = io->w[2],
                                    .w16 = io->w16[2], .IC = C, .OC = V, .pool = io->pool};
    h->xent = (pst_xent_args){.losses = io->losses, .correct = io->correct,
                              .dlogits = dlogits, .logits = logits, .targets = io->targets,
                              .C = V, .group = T};
    h->proj_bwd = (pst_linear_bwd_args){.dinp = dlnf, .dw = io->g[2],
                                        .dout = dlogits, .inp = lnf,
                                        .w = io->w[2], .w16 = io->w16[2], .IC = C,
                                        .OC = V,
                                        .accumulate = pst_layer_adds_grad(io, ly, 4u),
                                        .pool = io->pool};
    h->ln_wgrad = (pst_layernorm_args){.dw = io->g[0], .db = io->g[1], .dout = dlnf,
                                       .inp = io->in, .w = io->w[0],
                                       .saved_mean = mean, .saved_rstd = rstd, .C = C,
                                       .accumulate = pst_layer_adds_grad(io, ly, 1u),
                                       .pool = io->pool};
    h->ln_igrad = (pst_layernorm_args){.dinp = io->din, .dout = dlnf, .inp = io->in,
                                       .w = io->w[0], .saved_mean = mean,
                                       .saved_rstd = rstd, .C = C, .pool = io->pool};
}

static pst_status lm_head_forward(void *inst, pst_stream *s, int B, float scale)
{
    lm_head_inst *h = inst;
    const int N = B * h->T;
    h->ln.N = N;
    h->proj.B = N;
    h->xent.B = N;
    h->xent.scale = scale / (float)h->T;
    PST_TRY(pst_op_layernorm_forward(s, &h->ln));
    PST_TRY(pst_op_linear_forward(s, &h->proj));
    return pst_op_softmax_xent(s, &h->xent);
}

static pst_status lm_head_wgrad(void *inst, void *chunk, pst_stream *s, int B, int row0,
                                int row1)
{
    (void)chunk, (void)row0, (void)row1;
    lm_head_inst *h = inst;
    h->proj_bwd.B = B * h->T;
    h->ln_wgrad.N = B * h->T;
    PST_TRY(pst_op_linear_backward(s, &h->proj_bwd));
    return pst_op_layernorm_backward(s, &h->ln_wgrad);
}

static pst_status lm_head_igrad(void *inst, pst_stream *s, int B)
{
    lm_head_inst *h = inst;
    if (!h->ln_igrad.dinp)
        return PST_OK;
    h->ln_igrad.N = B * h->T;
    return pst_op_layernorm_backward(s, &h->ln_igrad);
}

static const float *lm_head_probs(void *inst)
{
    return ((lm_head_inst *)inst)->xent.dlogits; /* scale 0 writes the softmax there */
}

/* the projection: V x C per position */
static double lm_head_cost(const pst_model *m, int layer)
{
    const pst_layer *ly = &m->layers[layer];
    const double C = (double)m->tensors[ly->tensor[0]].numel, T = ly->in_width / C;
    return T * (double)m->tensors[ly->tensor[2]].numel;
}

PST_LAYER_CLASS(lm_head, lm_head_inst, .bind = lm_head_bind, .forward = lm_head_forward,
                .wgrad = lm_head_wgrad, .igrad = lm_head_igrad, .probs = lm_head_probs,
                .cost = lm_head_cost, .gemm_weights = 4u);
