/* layers.h — CPU reference kernels for the layers pstrain models use, with forward and
 * backward. llm.c conventions: outputs first, then inputs, then dimensions; row-major
 * tensors with shapes in comments; parameter gradients either overwrite or accumulate
 * (`accumulate`), which lets a step skip zeroing the gradient buffer.
 * GEMMs go through OpenBLAS (cblas_sgemm). Pure functions: thread safe on disjoint
 * outputs. No allocation, except the bf16 kernels' per-thread scratch (below). */
#ifndef PST_LAYERS_H
#define PST_LAYERS_H

#include <stddef.h>
#include <stdint.h>

/* out (B, OC) = inp (B, IC) @ weight^T + bias, then ReLU when relu != 0.
 * weight (OC, IC), bias (OC) or NULL (no bias; then dbias below is NULL too). */
void pst_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                        int B, int IC, int OC, int relu);

/* Gradients of out = inp @ weight^T + bias given dout (B, OC):
 *   dweight (OC, IC) = dout^T @ inp,  dbias (OC) = column sums of dout,
 *   dinp (B, IC) = dout @ weight (skipped when dinp is NULL).
 * dweight/dbias are overwritten, or added to when accumulate != 0; dinp is overwritten.
 * dweight and dbias may both be NULL: only dinp is computed. */
void pst_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int B, int IC, int OC,
                         int accumulate);

/* The weight gradient is computed in tiles of PST_ROW_TILE rows (rows [0, 256), [256, 512),
 * ..., the last one ending at OC), one GEMM call each. A GEMM's result for a row depends
 * on the shape of the call that computes it (measured on an AMD EPYC with
 * OPENBLAS_CORETYPE=Haswell: rows 504-511 of a 1024-row dweight computed as two calls of
 * 512 get other bits than from one call), so fixed tiles are what make the bits independent of how a layer is cut
 * into chunks or threads; at 256 rows they cost no speed here. */
#define PST_ROW_TILE 256
/* The end of row r's tile, or `end` when that comes first. */
int pst_row_tile_end(int r, int end);

/* The part [*lo, *hi) of dinp's `items` (its columns or its rows, each `item_cost`
 * multiply-adds) for part `part` of `nparts` when the same parts also compute `wrows` rows
 * of dweight (each `wrow_cost`), each its whole tiles as pst_pool_split(wrows, ...,
 * PST_ROW_TILE) gives them: the cuts bring each prefix of parts nearest to its share of all
 * the multiply-adds, at multiples of `align` items, never backwards; the parts together
 * cover [0, items) once. A layer of one tile (OC <= 256) would otherwise leave every part
 * but the one with the tile idle for its whole weight gradient. The cuts depend only on
 * the arguments. */
void pst_linear_dinp_part(int64_t items, int64_t item_cost, int align, int wrows,
                          int64_t wrow_cost, int part, int nparts, size_t *lo, size_t *hi);

/* Slices of the two kernels above, for splitting a layer over threads (same arithmetic
 * per element): columns [j0, j1) of out; rows [j0, j1) of dweight and dbias (j0 and j1,
 * unless it is OC, multiples of PST_ROW_TILE for the bits of the whole-layer call);
 * columns [i0, i1) of dinp. An empty range does nothing. */
void pst_linear_forward_cols(float *out, const float *inp, const float *weight,
                             const float *bias, int B, int IC, int OC, int relu, int j0, int j1);
void pst_linear_backward_weight_rows(float *dweight, float *dbias, const float *dout,
                                     const float *inp, int B, int IC, int OC, int accumulate,
                                     int j0, int j1);
void pst_linear_backward_input_cols(float *dinp, const float *dout, const float *weight, int B,
                                    int IC, int OC, int i0, int i1);

/* The same three slices with the weight in bf16 (w16, (OC, IC)) and the GEMMs in bf16 with
 * fp32 accumulation (gemm_bf16.h): inp and dout are rounded to bf16 in the calling thread's
 * scratch first. Bias, ReLU and the bias gradient are the fp32 code above; the weight
 * gradient keeps its tiles. */
void pst_linear_forward_cols_bf16(float *out, const float *inp, const uint16_t *w16,
                                  const float *bias, int B, int IC, int OC, int relu, int j0,
                                  int j1);
void pst_linear_backward_weight_rows_bf16(float *dweight, float *dbias, const float *dout,
                                          const float *inp, int B, int IC, int OC,
                                          int accumulate, int j0, int j1);
void pst_linear_backward_input_cols_bf16(float *dinp, const float *dout, const uint16_t *w16,
                                         int B, int IC, int OC, int i0, int i1);

/* dinp (N) = dout where out > 0, else 0 (out is the ReLU's output). In place allowed. */
void pst_relu_backward(float *dinp, const float *dout, const float *out, int64_t N);
/* The same in place on columns [i0, i1) of d (B, C) with out (B, C): the input gradient of a
 * linear layer through its input's ReLU, a slice at a time. */
void pst_relu_backward_cols(float *d, const float *out, int B, int C, int i0, int i1);

/* probs (B, C) = softmax(logits); returns the SUM over rows of -log(probs[target]).
 * Targets must be in [0, C). Numerically stable (max subtracted). */
double pst_softmax_xent_forward(float *probs, const float *logits, const int32_t *targets,
                                int B, int C);

/* dlogits (B, C) = (probs - onehot(targets)) * scale. scale = 1/global_batch makes the sum of
 * every trainer's gradient the gradient of the global batch's mean loss. */
void pst_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                               int B, int C, float scale);

#endif /* PST_LAYERS_H */
