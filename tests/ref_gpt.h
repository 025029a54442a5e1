/* ref_gpt.h — the tests' reference GPT: llm.c's GPT-2 layout (token + position embedding,
 * pre-LayerNorm blocks with causal multi-head attention and a GELU-tanh MLP, final
 * LayerNorm, output projection tied to the token embedding), computed on the host with the
 * plain CPU kernels of seq_layers.h and layers.h, one call after another on one thread.
 * It is what pstrain's GPT model is checked against, and it is itself checked against
 * PyTorch (../shared/peers/torch_gpt.py --dump-state; tests/test_gpt_ref.c).
 *
 * Parameters and gradients are flat buffers in llm.c's ParameterTensors order:
 *   wte (V,C) wpe (T,C) ln1w (L,C) ln1b (L,C) qkvw (L,3C,C) qkvb (L,3C) attprojw (L,C,C)
 *   attprojb (L,C) ln2w (L,C) ln2b (L,C) fcw (L,4C,C) fcb (L,4C) fcprojw (L,C,4C)
 *   fcprojb (L,C) lnfw (C) lnfb (C)
 * Activations are allocated for max_batch sequences at init. Not thread safe. */
#ifndef PST_TEST_REF_GPT_H
#define PST_TEST_REF_GPT_H

#include <stddef.h>
#include <stdint.h>

enum { REF_GPT_NTENSORS = 16 };

typedef struct ref_gpt_dims {
    int V, T, L, H, C;
} ref_gpt_dims;

typedef struct ref_gpt {
    ref_gpt_dims d;
    int max_batch;
    size_t off[REF_GPT_NTENSORS], size[REF_GPT_NTENSORS], nparams;
    /* activations, (B, T, width) unless noted; per layer l at l * (B*T*width) */
    float *enc, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *res2, *ln2, *ln2_mean,
        *ln2_rstd, *fch, *fchg, *res3, *lnf, *lnf_mean, *lnf_rstd, *logits, *probs;
    /* backward scratch */
    float *dres, *dln, *dqkv, *datty, *dfch, *scratch;
    float *att_probs; /* (L, max_batch, H, T, T) where pst_attention_keeps_probs */
} ref_gpt;

/* The tensors' names in the order above. */
extern const char *const ref_gpt_tensor_names[REF_GPT_NTENSORS];

int ref_gpt_init(ref_gpt *g, ref_gpt_dims d, int max_batch); /* 0, or -1: out of memory */
void ref_gpt_free(ref_gpt *g);
/* Forward over B sequences of tokens (B, T); targets (B, T). Returns the mean loss over
 * the B*T positions; logits (B, T, V) are copied out when not NULL. */
double ref_gpt_forward(ref_gpt *g, const float *params, const int32_t *tokens,
                       const int32_t *targets, int B, float *logits);
/* Backward of the last forward: grads (overwritten) of the mean loss. */
void ref_gpt_backward(ref_gpt *g, const float *params, float *grads, const int32_t *tokens,
                      const int32_t *targets, int B);

#endif /* PST_TEST_REF_GPT_H */
