/* ctr_layers.h — CPU reference kernels of the click model (DLRM, arXiv 1906.00091; issue
 * 31): the pairwise dot-product interaction of the field embeddings with the bottom MLP's
 * output, and binary cross-entropy on a logit. llm.c conventions: outputs first, then
 * inputs, then dimensions; row-major; rows [b0, b1) per call, each element computed with
 * the same operations in the same order whatever the split, so a split over threads
 * changes no bit. Pure functions: thread safe on disjoint outputs. No allocation.
 *
 * The interaction of a row: v_0 = bottom (dim), v_f = the f-th embedding (f = 1..F,
 * emb + (f-1) dim of the row, rows emb_stride floats apart); out (dim + P), P = (F+1)F/2,
 * = [v_0 | <v_i, v_j> for i = 1..F, j = 0..i-1] (torch.tril_indices(F+1, F+1, -1)'s
 * order, the bottom output first: the peer's torch.cat([x, Z])). Each dot adds its dim
 * products in ascending k. */
#ifndef PST_CTR_LAYERS_H
#define PST_CTR_LAYERS_H

#include <stdint.h>

/* Columns of the interaction's output: dim + (F+1)F/2. */
static inline int pst_interact_width(int F, int dim)
{
    return dim + (F + 1) * F / 2;
}

void pst_interact_forward(float *out, const float *bottom, const float *emb, int emb_stride,
                          int F, int dim, int b0, int b1);
/* dbottom (rows, dim) and demb (rows, F dim, demb_stride apart) overwritten from dout
 * (rows, dim + P): dv_0 starts at dout's first dim columns, the others at 0, then each
 * pair (i, j), in the forward's order, adds g v_j to dv_i and g v_i to dv_j. */
void pst_interact_backward(float *dbottom, float *demb, int demb_stride, const float *dout,
                           const float *bottom, const float *emb, int emb_stride, int F,
                           int dim, int b0, int b1);
/* Binary cross-entropy on logits x with labels y (int32, 0 or 1, the executor's
 * targets): losses (B) = max(x, 0) - x y + log(1 + exp(-|x|)) (in double); dlogits (B) =
 * (sigmoid(x) - y) * scale, or sigmoid(x) when scale is 0 (evaluation: the click
 * probabilities). */
void pst_bce_logits(float *losses, float *dlogits, const float *logits, const int32_t *labels,
                    float scale, int b0, int b1);

#endif /* PST_CTR_LAYERS_H */
