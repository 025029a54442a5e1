/* seq_layers.h — CPU reference kernels for sequence models (a GPT-2-style transformer):
 * token + position embedding, LayerNorm, causal multi-head attention, GELU (tanh form).
 * The matmuls are the linear kernels of layers.h (a NULL bias there means none).
 * llm.c conventions: outputs first, then inputs, then dimensions; row-major; a sequence
 * batch is (B, T, C) with N = B*T rows. Parameter gradients overwrite, or add when
 * `accumulate` (a tied tensor's second writer). Every sum over rows runs in ascending row
 * order, and every slice function computes each element with the same operations in the
 * same order as the whole call, so a split over threads changes no bit.
 * Pure functions: thread safe on disjoint outputs. No allocation. */
#ifndef PST_SEQ_LAYERS_H
#define PST_SEQ_LAYERS_H

#include <stdint.h>

#define PST_LN_EPS 1e-5f

/* out (B, T, C) = wte[tokens[b, t]] + wpe[t], for columns [c0, c1). Tokens in [0, V). */
void pst_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int B, int T, int C, int c0, int c1);
/* dwte (V, C) += dout rows by token, dwpe (T, C) += dout summed over b, columns [c0, c1),
 * rows (b, t) in ascending order; both are zeroed first (those columns) unless accumulate.
 * Either may be NULL. */
void pst_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                            int B, int T, int C, int V, int accumulate, int c0, int c1);

/* out (N, C) = (inp - mean) * rstd * w + b per row, for rows [r0, r1); mean and rstd (N) are
 * written for the backward (either may be NULL). */
void pst_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C, int r0, int r1);
/* dinp (N, C), rows [r0, r1): the input gradient, or res + it where res is set (the
 * residual stream's gradient, added in the same pass; res may be dinp). */
void pst_layernorm_backward_input(float *dinp, const float *dout, const float *inp,
                                  const float *w, const float *mean, const float *rstd, int N,
                                  int C, const float *res, int r0, int r1);
/* dw, db (C), columns [c0, c1): sums over all N rows in row order (overwritten, or added
 * to when accumulate). */
void pst_layernorm_backward_params(float *dw, float *db, const float *dout, const float *inp,
                                   const float *mean, const float *rstd, int N, int C,
                                   int accumulate, int c0, int c1);

/* Causal self-attention over qkv (B, T, 3C) (the C query columns, then the keys, then the
 * values; head h uses columns h*C/H .. (h+1)*C/H - 1 of each): out (B, T, C) and, for the
 * backward, lse (B, H, T) = the log-sum-exp of each query's scaled scores. A query sees
 * keys 0..t; the masked probabilities are 0. Pairs (b, h) with b*H + h in [bh0, bh1), one
 * at a time: scratch holds one pair's (T, T) scores. scratch: PST_ATTENTION_SCRATCH(T).
 * probs, when not NULL: the pairs' probabilities are computed there and kept for the
 * backward ((B, H, T, T), pair b*H + h at (b*H + h) T^2; the entries no product reads are
 * left unwritten), with the same out and lse. */
#define PST_ATTENTION_SCRATCH(T) (2 * (int64_t)(T) * (T))
void pst_attention_forward(float *out, float *lse, float *probs, const float *qkv, int B, int T,
                           int C, int H, float *scratch, int bh0, int bh1);
/* dqkv (B, T, 3C) for pairs [bh0, bh1) (overwritten) from dout (B, T, C), with the
 * forward's probs where it kept them, else the probabilities recomputed from qkv and lse:
 * a product less and no exponential, where the kept ones take memory (the two differ in the
 * last bits: the forward divides by the sum, the recomputation subtracts its log).
 * scratch: PST_ATTENTION_SCRATCH(T) floats (two (T, T) matrices). */
void pst_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *lse,
                            const float *probs, int B, int T, int C, int H, float *scratch,
                            int bh0, int bh1);

/* Whether a transformer block keeps its attention's probabilities from the forward for the
 * backward: where they take no more memory than its MLP's hidden activation (H T <= 4 C
 * floats per position; GPT-2 small's 12 heads at 1024 positions recompute). */
static inline int pst_attention_keeps_probs(int T, int C, int H)
{
    return (long long)H * T <= 4LL * C;
}

/* out (n) = GELU(inp), the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void pst_gelu_forward(float *out, const float *inp, int64_t n);
/* The same out, and deriv (n) = GELU'(inp) (deriv may equal inp: the backward then needs
 * only it), with the bits pst_gelu_backward's GELU'(inp) has. */
void pst_gelu_forward_deriv(float *out, float *deriv, const float *inp, int64_t n);
/* GELU of inp + bias, rows of `width` floats with bias (width) added to each first (a
 * linear layer's bias, added here instead of in a pass over its output: the same sums, so
 * the bits of the bias's pass and then pst_gelu_forward or, with deriv, ..._deriv). */
void pst_gelu_forward_bias(float *out, float *deriv, const float *inp, const float *bias,
                           int64_t rows, int width);
/* dinp (n) = GELU'(inp) * dout (dinp may equal dout). */
void pst_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
/* pst_gelu_backward_deriv over columns [j0, j1) of rows of `width`, and dbias[j] (zeroed
 * first unless accumulate) += each row's dinp[j] in row order: the bias gradient of the
 * linear layer before GELU, with the bits of its own pass (layers.h). */
void pst_gelu_backward_dbias(float *dinp, float *dbias, const float *deriv, const float *dout,
                             int64_t rows, int width, int accumulate, int j0, int j1);
/* dinp (n) = deriv * dout, deriv from pst_gelu_forward_deriv: pst_gelu_backward's bits
 * (dinp may equal dout). */
void pst_gelu_backward_deriv(float *dinp, const float *deriv, const float *dout, int64_t n);

#endif /* PST_SEQ_LAYERS_H */
