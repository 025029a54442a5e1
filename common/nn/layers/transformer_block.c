/* transformer_block.c — a pre-LayerNorm transformer block (model.h):
 *   res2 = x + attproj(attention(qkv(ln1(x))));  out = res2 + fcproj(gelu(fc(ln2(res2))))
 * over rows of T positions of C channels, H heads (the layer's flags).
 *
 * The weight gradient runs the whole backward chain inside the block (every parameter's
 * gradient needs the gradients of the activations above it); the input gradient is its last
 * step, din = d res2 + LayerNorm1's input gradient, so the executor can send the block's
 * parameters before it. Both residual sums of the backward are added by the LayerNorm
 * backward that writes them (its res), in its pass. Activations kept from forward (save)
 * and the backward's scratch (work) are carved from the layer's buffers as
 * (max_batch * T, width) arrays, the attention's probabilities last where it keeps them
 * (pst_attention_keeps_probs); the attention's per-thread scratch holds one pair's
 * scores. */
#include "common/nn/model.h"
#include "common/nn/ops.h"
#include "common/nn/seq_layers.h"

enum { LN1W, LN1B, QKVW, QKVB, APW, APB, LN2W, LN2B, FCW, FCB, FPW, FPB, NT };

typedef struct block_inst {
    pst_layernorm_args ln1, ln2, ln1_w, ln2_bwd, ln1_in;
    pst_linear_fwd_args qkv, attproj, fc, fcproj;
    pst_linear_bwd_args fcproj_b, fc_b, attproj_b, qkv_b;
    pst_attention_args att, att_b;
    pst_gelu_args gelu, gelu_b;
    pst_add_args res2, res3;
    int T, C;
} block_inst;

static void block_bind(void *inst, const pst_model *m, int layer, const pst_layer_io *io)
{
    block_inst *k = inst;
    const pst_layer *ly = &m->layers[layer];
    const int C = (int)m->tensors[ly->tensor[LN1W]].shape[0], T = ly->in_width / C;
    const int H = ly->flags;
    k->T = T;
    k->C = C;
    const float *P[NT];
    const uint16_t *Q[NT]; /* bf16 GEMM weights, or NULL */
    float *G[NT];
    int acc[NT];
    for (int i = 0; i < NT; i++) {
        P[i] = io->w[i];
        Q[i] = io->w16[i];
        G[i] = io->g[i];
        acc[i] = pst_layer_adds_grad(io, ly, 1u << i);
    }
    /* the kept activations, each (max_batch * T, width) */
    const size_t NM = (size_t)io->max_batch * (size_t)T;
    float *ln1 = io->save, *mean1 = ln1 + NM * C, *rstd1 = mean1 + NM, *qkv = rstd1 + NM;
    float *atty = qkv + NM * 3 * C, *lse = atty + NM * C, *res2 = lse + NM * H;
    float *ln2 = res2 + NM * C, *mean2 = ln2 + NM * C, *rstd2 = mean2 + NM;
    float *fch = rstd2 + NM, *fchg = fch + NM * 4 * C;
    /* the attention's probabilities, (max_batch, H, T, T), where the block keeps them */
    float *probs = pst_attention_keeps_probs(T, C, H) ? fchg + NM * 4 * C : NULL;
    /* the backward's scratch */
    float *dres2 = io->work, *datty = dres2 + NM * C, *dqkv = datty + NM * C;
    float *dfch = dqkv + NM * 3 * C, *dln = dfch + NM * 4 * C;
    struct pst_pool *pool = io->pool;

    k->ln1 = (pst_layernorm_args){.out = ln1, .mean = mean1, .rstd = rstd1, .inp = io->in,
                                  .w = P[LN1W], .b = P[LN1B], .C = C, .pool = pool};
    k->qkv = (pst_linear_fwd_args){.out = qkv, .inp = ln1, .w = P[QKVW], .w16 = Q[QKVW],
                                   .b = P[QKVB], .IC = C, .OC = 3 * C, .pool = pool};
    k->att = (pst_attention_args){.out = atty, .lse = lse, .probs = probs, .qkv = qkv, .T = T,
                                  .C = C, .H = H, .scratch = io->scratch, .pool = pool};
    /* the two projections' biases are added by the residual adds, in their passes */
    k->attproj = (pst_linear_fwd_args){.out = res2, .inp = atty, .w = P[APW], .w16 = Q[APW],
                                       .IC = C, .OC = C, .pool = pool};
    k->res2 = (pst_add_args){.dst = res2, .src = io->in, .bias = P[APB], .width = C,
                             .pool = pool};
    k->ln2 = (pst_layernorm_args){.out = ln2, .mean = mean2, .rstd = rstd2, .inp = res2,
                                  .w = P[LN2W], .b = P[LN2B], .C = C, .pool = pool};
    /* fc's bias is added by GELU, in its pass over fch (no pass of its own); fch is read
     * again only by GELU's backward: the forward replaces it by gelu'(fch + bias) */
    k->fc = (pst_linear_fwd_args){.out = fch, .inp = ln2, .w = P[FCW], .w16 = Q[FCW],
                                  .IC = C, .OC = 4 * C, .pool = pool};
    k->gelu = (pst_gelu_args){.out = fchg, .inp = fch, .deriv = fch, .bias = P[FCB],
                              .width = 4 * C, .pool = pool};
    k->fcproj = (pst_linear_fwd_args){.out = io->out, .inp = fchg, .w = P[FPW],
                                      .w16 = Q[FPW], .IC = 4 * C, .OC = C, .pool = pool};
    k->res3 = (pst_add_args){.dst = io->out, .src = res2, .bias = P[FPB], .width = C,
                             .pool = pool};

    k->fcproj_b = (pst_linear_bwd_args){.dinp = dfch, .dw = G[FPW], .db = G[FPB],
                                        .dout = io->dout, .inp = fchg, .w = P[FPW],
                                        .w16 = Q[FPW],
                                        .IC = 4 * C, .OC = C, .accumulate = acc[FPW],
                                        .pool = pool};
    /* fc's bias gradient is summed by GELU's backward, in its pass over dfch */
    k->gelu_b = (pst_gelu_args){.out = dfch, .deriv = fch, .dout = dfch, .dbias = G[FCB],
                                .width = 4 * C, .accumulate = acc[FCB], .pool = pool};
    k->fc_b = (pst_linear_bwd_args){.dinp = dln, .dw = G[FCW], .dout = dfch,
                                    .inp = ln2, .w = P[FCW], .w16 = Q[FCW], .IC = C,
                                    .OC = 4 * C,
                                    .accumulate = acc[FCW], .pool = pool};
    k->ln2_bwd = (pst_layernorm_args){.dinp = dres2, .dw = G[LN2W], .db = G[LN2B],
                                      .dout = dln, .inp = res2, .w = P[LN2W],
                                      .saved_mean = mean2, .saved_rstd = rstd2,
                                      .res = io->dout, .C = C, .accumulate = acc[LN2W],
                                      .pool = pool};
    k->attproj_b = (pst_linear_bwd_args){.dinp = datty, .dw = G[APW], .db = G[APB],
                                         .dout = dres2, .inp = atty, .w = P[APW],
                                         .w16 = Q[APW], .IC = C,
                                         .OC = C, .accumulate = acc[APW], .pool = pool};
    k->att_b = (pst_attention_args){.dqkv = dqkv, .dout = datty, .qkv = qkv, .saved_lse = lse,
                                    .saved_probs = probs, .T = T, .C = C, .H = H,
                                    .scratch = io->scratch, .pool = pool};
    k->qkv_b = (pst_linear_bwd_args){.dinp = dln, .dw = G[QKVW], .db = G[QKVB], .dout = dqkv,
                                     .inp = ln1, .w = P[QKVW], .w16 = Q[QKVW], .IC = C,
                                     .OC = 3 * C,
                                     .accumulate = acc[QKVW], .pool = pool};
    k->ln1_w = (pst_layernorm_args){.dw = G[LN1W], .db = G[LN1B], .dout = dln, .inp = io->in,
                                    .w = P[LN1W], .saved_mean = mean1, .saved_rstd = rstd1,
                                    .C = C, .accumulate = acc[LN1W], .pool = pool};
    k->ln1_in = (pst_layernorm_args){.dinp = io->din, .dout = dln, .inp = io->in,
                                     .w = P[LN1W], .saved_mean = mean1, .saved_rstd = rstd1,
                                     .res = dres2, .C = C, .pool = pool};
}

static pst_status block_forward(void *inst, pst_stream *s, int B, float scale)
{
    (void)scale;
    block_inst *k = inst;
    const int N = B * k->T;
    const size_t NC = (size_t)N * (size_t)k->C;
    k->ln1.N = k->ln2.N = N;
    k->qkv.B = k->attproj.B = k->fc.B = k->fcproj.B = N;
    k->att.B = B;
    k->res2.n = k->res3.n = NC;
    k->gelu.n = (int64_t)NC * 4;
    PST_TRY(pst_op_layernorm_forward(s, &k->ln1));
    PST_TRY(pst_op_linear_forward(s, &k->qkv));
    PST_TRY(pst_op_attention_forward(s, &k->att));
    PST_TRY(pst_op_linear_forward(s, &k->attproj));
    PST_TRY(pst_op_add(s, &k->res2));
    PST_TRY(pst_op_layernorm_forward(s, &k->ln2));
    PST_TRY(pst_op_linear_forward(s, &k->fc));
    PST_TRY(pst_op_gelu_forward(s, &k->gelu));
    PST_TRY(pst_op_linear_forward(s, &k->fcproj));
    return pst_op_add(s, &k->res3);
}

static pst_status block_wgrad(void *inst, void *chunk, pst_stream *s, int B, int row0, int row1)
{
    (void)chunk, (void)row0, (void)row1;
    block_inst *k = inst;
    const int N = B * k->T;
    k->fcproj_b.B = k->fc_b.B = k->attproj_b.B = k->qkv_b.B = N;
    k->ln2_bwd.N = k->ln1_w.N = N;
    k->gelu_b.n = (int64_t)N * k->C * 4;
    k->att_b.B = B;
    PST_TRY(pst_op_linear_backward(s, &k->fcproj_b));
    PST_TRY(pst_op_gelu_backward(s, &k->gelu_b));
    PST_TRY(pst_op_linear_backward(s, &k->fc_b));
    PST_TRY(pst_op_layernorm_backward(s, &k->ln2_bwd)); /* d res2 = dout + LN2's input grad */
    PST_TRY(pst_op_linear_backward(s, &k->attproj_b));
    PST_TRY(pst_op_attention_backward(s, &k->att_b));
    PST_TRY(pst_op_linear_backward(s, &k->qkv_b));
    return pst_op_layernorm_backward(s, &k->ln1_w);
}

static pst_status block_igrad(void *inst, pst_stream *s, int B)
{
    block_inst *k = inst;
    if (!k->ln1_in.dinp)
        return PST_OK;
    k->ln1_in.N = B * k->T;
    return pst_op_layernorm_backward(s, &k->ln1_in); /* din = d res2 + LN1's input grad */
}

/* the weights per position, and attention's scores */
static double block_cost(const pst_model *m, int layer)
{
    const pst_layer *ly = &m->layers[layer];
    double numel = 0.0;
    for (int k = 0; k < ly->ntensors; k++)
        numel += (double)m->tensors[ly->tensor[k]].numel;
    const double C = (double)m->tensors[ly->tensor[0]].numel, T = ly->in_width / C;
    return T * numel + 2.0 * T * T * C;
}

PST_LAYER_CLASS(transformer_block, block_inst, .bind = block_bind, .forward = block_forward,
                .wgrad = block_wgrad, .igrad = block_igrad, .cost = block_cost,
                .gemm_weights = 1u << QKVW | 1u << APW | 1u << FCW | 1u << FPW);
