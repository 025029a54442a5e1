/* ref_gpt.c — the tests' reference GPT (see ref_gpt.h). */
#include "ref_gpt.h"

#include <stdlib.h>
#include <string.h>

#include "common/nn/layers.h"
#include "common/nn/seq_layers.h"

const char *const ref_gpt_tensor_names[REF_GPT_NTENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, APW, APB, LN2W, LN2B, FCW, FCB, FPW, FPB, LNFW, LNFB };

int ref_gpt_init(ref_gpt *g, ref_gpt_dims d, int max_batch)
{
    memset(g, 0, sizeof *g);
    g->d = d;
    g->max_batch = max_batch;
    const size_t V = d.V, T = d.T, L = d.L, C = d.C;
    const size_t sizes[REF_GPT_NTENSORS] = {V * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C,
                                            L * C * C, L * C, L * C, L * C, L * 4 * C * C,
                                            L * 4 * C, L * C * 4 * C, L * C, C, C};
    for (int i = 0; i < REF_GPT_NTENSORS; i++) {
        g->off[i] = g->nparams;
        g->size[i] = sizes[i];
        g->nparams += sizes[i];
    }
    const size_t N = (size_t)max_batch * T, H = d.H;
    float **bufs[] = {&g->enc, &g->ln1, &g->ln1_mean, &g->ln1_rstd, &g->qkv, &g->atty,
                      &g->lse, &g->res2, &g->ln2, &g->ln2_mean, &g->ln2_rstd, &g->fch,
                      &g->fchg, &g->res3, &g->lnf, &g->lnf_mean, &g->lnf_rstd, &g->logits,
                      &g->probs, &g->dres, &g->dln, &g->dqkv, &g->datty, &g->dfch,
                      &g->scratch, &g->att_probs};
    /* the attention's probabilities kept from forward, as the trainer's block keeps them */
    const size_t kept = pst_attention_keeps_probs(d.T, d.C, d.H) ? L * max_batch * H * T * T : 1;
    const size_t n[] = {N * C, L * N * C, L * N, L * N, L * N * 3 * C, L * N * C,
                        L * max_batch * H * T, L * N * C, L * N * C, L * N, L * N,
                        L * N * 4 * C, L * N * 4 * C, L * N * C, N * C, N, N, N * V, N * V,
                        N * C, N * 4 * C, N * 3 * C, N * C, N * 4 * C,
                        (size_t)PST_ATTENTION_SCRATCH(T), kept};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = calloc(n[i], sizeof(float)))) {
            ref_gpt_free(g);
            return -1;
        }
    return 0;
}

void ref_gpt_free(ref_gpt *g)
{
    float *bufs[] = {g->enc, g->ln1, g->ln1_mean, g->ln1_rstd, g->qkv, g->atty, g->lse,
                     g->res2, g->ln2, g->ln2_mean, g->ln2_rstd, g->fch, g->fchg, g->res3,
                     g->lnf, g->lnf_mean, g->lnf_rstd, g->logits, g->probs, g->dres, g->dln,
                     g->dqkv, g->datty, g->dfch, g->scratch, g->att_probs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    memset(g, 0, sizeof *g);
}

/* layer l's kept attention probabilities, or NULL where the block recomputes them */
static float *att_probs(const ref_gpt *g, int l)
{
    const ref_gpt_dims *d = &g->d;
    return pst_attention_keeps_probs(d->T, d->C, d->H)
               ? g->att_probs + (size_t)l * g->max_batch * d->H * d->T * d->T
               : NULL;
}

/* layer l's slice of a stacked tensor k of per-layer size `each` */
#define P(k, l, each) (params + g->off[k] + (size_t)(l) * (each))
#define G(k, l, each) (grads + g->off[k] + (size_t)(l) * (each))

double ref_gpt_forward(ref_gpt *g, const float *params, const int32_t *tokens,
                       const int32_t *targets, int B, float *logits)
{
    const int T = g->d.T, C = g->d.C, V = g->d.V, H = g->d.H, L = g->d.L, N = B * T;
    const size_t NC = (size_t)N * C, NM = (size_t)g->max_batch * T; /* per-layer strides */
    pst_embedding_forward(g->enc, tokens, params + g->off[WTE], params + g->off[WPE], B, T, C,
                          0, C);
    const float *x = g->enc;
    for (int l = 0; l < L; l++) {
        float *ln1 = g->ln1 + l * NM * C, *qkv = g->qkv + l * NM * 3 * C;
        float *atty = g->atty + l * NM * C, *res2 = g->res2 + l * NM * C;
        float *ln2 = g->ln2 + l * NM * C, *fch = g->fch + l * NM * 4 * C;
        float *fchg = g->fchg + l * NM * 4 * C, *res3 = g->res3 + l * NM * C;
        pst_layernorm_forward(ln1, g->ln1_mean + l * NM, g->ln1_rstd + l * NM, x,
                              P(LN1W, l, C), P(LN1B, l, C), N, C, 0, N);
        pst_linear_forward(qkv, ln1, P(QKVW, l, 3 * C * C), P(QKVB, l, 3 * C), N, C, 3 * C, 0);
        pst_attention_forward(atty, g->lse + (size_t)l * g->max_batch * H * T, att_probs(g, l),
                              qkv, B, T, C, H, g->scratch, 0, B * H);
        pst_linear_forward(res2, atty, P(APW, l, C * C), P(APB, l, C), N, C, C, 0);
        for (size_t i = 0; i < NC; i++)
            res2[i] += x[i];
        pst_layernorm_forward(ln2, g->ln2_mean + l * NM, g->ln2_rstd + l * NM, res2,
                              P(LN2W, l, C), P(LN2B, l, C), N, C, 0, N);
        pst_linear_forward(fch, ln2, P(FCW, l, 4 * C * C), P(FCB, l, 4 * C), N, C, 4 * C, 0);
        pst_gelu_forward(fchg, fch, (int64_t)N * 4 * C);
        pst_linear_forward(res3, fchg, P(FPW, l, 4 * C * C), P(FPB, l, C), N, 4 * C, C, 0);
        for (size_t i = 0; i < NC; i++)
            res3[i] += res2[i];
        x = res3;
    }
    pst_layernorm_forward(g->lnf, g->lnf_mean, g->lnf_rstd, x, params + g->off[LNFW],
                          params + g->off[LNFB], N, C, 0, N);
    pst_linear_forward(g->logits, g->lnf, params + g->off[WTE], NULL, N, C, V, 0);
    if (logits)
        memcpy(logits, g->logits, sizeof(float) * (size_t)N * V);
    double sum = pst_softmax_xent_forward(g->probs, g->logits, targets, N, V);
    return sum / N;
}

void ref_gpt_backward(ref_gpt *g, const float *params, float *grads, const int32_t *tokens,
                      const int32_t *targets, int B)
{
    const int T = g->d.T, C = g->d.C, V = g->d.V, H = g->d.H, L = g->d.L, N = B * T;
    const size_t NM = (size_t)g->max_batch * T;
    float *dlogits = g->logits; /* the logits are not needed any more */
    /* the mean over B sequences of each one's mean over T positions, as the trainer scales */
    pst_softmax_xent_backward(dlogits, g->probs, targets, N, V, 1.0f / (float)B / (float)T);
    /* the tied projection writes wte's gradient first; the embedding adds to it last */
    pst_linear_backward(g->dln, grads + g->off[WTE], NULL, dlogits, g->lnf, params + g->off[WTE],
                        N, C, V, 0);
    const float *xL = L ? g->res3 + (size_t)(L - 1) * NM * C : g->enc;
    pst_layernorm_backward_input(g->dres, g->dln, xL, params + g->off[LNFW], g->lnf_mean,
                                 g->lnf_rstd, N, C, NULL, 0, N);
    pst_layernorm_backward_params(grads + g->off[LNFW], grads + g->off[LNFB], g->dln, xL,
                                  g->lnf_mean, g->lnf_rstd, N, C, 0, 0, C);
    for (int l = L - 1; l >= 0; l--) {
        const float *x = l ? g->res3 + (size_t)(l - 1) * NM * C : g->enc;
        const float *ln1 = g->ln1 + l * NM * C, *qkv = g->qkv + l * NM * 3 * C;
        const float *atty = g->atty + l * NM * C, *res2 = g->res2 + l * NM * C;
        const float *ln2 = g->ln2 + l * NM * C, *fch = g->fch + l * NM * 4 * C;
        const float *fchg = g->fchg + l * NM * 4 * C;
        /* res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
        pst_linear_backward(g->dfch, G(FPW, l, 4 * C * C), G(FPB, l, C), g->dres, fchg,
                            P(FPW, l, 4 * C * C), N, 4 * C, C, 0);
        pst_gelu_backward(g->dfch, fch, g->dfch, (int64_t)N * 4 * C);
        pst_linear_backward(g->dln, G(FCW, l, 4 * C * C), G(FCB, l, 4 * C), g->dfch, ln2,
                            P(FCW, l, 4 * C * C), N, C, 4 * C, 0);
        pst_layernorm_backward_input(g->dres, g->dln, res2, P(LN2W, l, C), g->ln2_mean + l * NM,
                                     g->ln2_rstd + l * NM, N, C, g->dres, 0, N);
        pst_layernorm_backward_params(G(LN2W, l, C), G(LN2B, l, C), g->dln, res2,
                                      g->ln2_mean + l * NM, g->ln2_rstd + l * NM, N, C, 0, 0, C);
        /* res2 = x + attproj(attention(qkv(ln1(x)))) */
        pst_linear_backward(g->datty, G(APW, l, C * C), G(APB, l, C), g->dres, atty,
                            P(APW, l, C * C), N, C, C, 0);
        pst_attention_backward(g->dqkv, g->datty, qkv, g->lse + (size_t)l * g->max_batch * H * T,
                               att_probs(g, l), B, T, C, H, g->scratch, 0, B * H);
        pst_linear_backward(g->dln, G(QKVW, l, 3 * C * C), G(QKVB, l, 3 * C), g->dqkv, ln1,
                            P(QKVW, l, 3 * C * C), N, C, 3 * C, 0);
        pst_layernorm_backward_input(g->dres, g->dln, x, P(LN1W, l, C), g->ln1_mean + l * NM,
                                     g->ln1_rstd + l * NM, N, C, g->dres, 0, N);
        pst_layernorm_backward_params(G(LN1W, l, C), G(LN1B, l, C), g->dln, x,
                                      g->ln1_mean + l * NM, g->ln1_rstd + l * NM, N, C, 0, 0, C);
    }
    pst_embedding_backward(grads + g->off[WTE], NULL, g->dres, tokens, B, T, C, V, 1, 0, C);
    pst_embedding_backward(NULL, grads + g->off[WPE], g->dres, tokens, B, T, C, V, 0, 0, C);
}
