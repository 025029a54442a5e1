/* models.h — the models pstrain trains, each built as tables of the model interface
 * (model.h): the `mlp` (mlp.c) and the communication-only `synthetic` model (synthetic.c).
 * On error the model is freed and zeroed. */
#ifndef PST_MODELS_H
#define PST_MODELS_H

#include <stddef.h>

#include "common/config.h"
#include "common/nn/model.h"

/* Linear -> ReLU -> ... -> Linear -> softmax cross-entropy over `nclasses`; tensors
 * l<i>.weight (out, in) and l<i>.bias (out), layer by layer. Initial values as PyTorch's
 * nn.Linear: U(-1/sqrt(in), 1/sqrt(in)), layer l's from pst_rng stream (seed, l).
 * Errors: PST_ERR_INVALID for a width < 1 or more than PST_MAX_HIDDEN hidden layers. */
pst_status pst_model_mlp(pst_model *m, int in_dim, int nclasses, int nhidden, const int *hidden);
/* The init_params of models of linear layers: each linear layer l's weight then bias from
 * U(-1/sqrt(in), 1/sqrt(in)), pst_rng stream (seed, l) (PyTorch's nn.Linear). */
void pst_init_linear_layers(const pst_model *m, float *dst, uint64_t seed);
/* DLRM (arXiv 1906.00091; the peer ../shared/peers/torch_dlrm.py): a bottom MLP over D
 * dense features (widths bottom[0..nbottom), then dim, each through a ReLU), the pairwise
 * dot-product interaction with F sparse embeddings of dim values (io->sparse, from the
 * trainer's sparse tables), a top MLP (widths top[0..ntop) through ReLUs, then 1) and
 * binary cross-entropy on that logit (labels 0 or 1; nclasses 1: one probability per
 * row, of a click). Tensors b<i>.weight/bias and t<i>.weight/bias; initial values as
 * pst_init_linear_layers. Errors: PST_ERR_INVALID for a width, F or dim
 * below 1, more than PST_MAX_HIDDEN widths on a side. */
pst_status pst_model_dlrm(pst_model *m, int D, int F, int dim, int nbottom, const int *bottom,
                          int ntop, const int *top);
/* A GPT-2-style character language model (llm.c's layout, gpt.c): vocabulary V, context
 * T, L blocks of H heads over C channels, the output projection tied to the token
 * embedding; its input rows are T token ids, its targets T per row. Errors:
 * PST_ERR_INVALID for a shape that cannot be built (C not a multiple of H, ...). */
pst_status pst_model_gpt(pst_model *m, int V, int T, int L, int H, int C);
/* n parameters starting at zero, one layer computing nothing; trainer `trainer_id`'s
 * gradient is small fixed values that depend on the index and the id. */
pst_status pst_model_synthetic(pst_model *m, size_t n, int trainer_id);
/* The model cfg->model names ("mlp": cfg's hidden widths over in_dim inputs and nclasses;
 * "gpt": cfg's layers, heads, embd and ctx over a vocabulary of nclasses;
 * "synthetic": cfg->params for cfg->trainer_id). Errors: PST_ERR_INVALID for another name. */
pst_status pst_model_from_config(pst_model *m, const pst_config *cfg, int in_dim, int nclasses);
/* 1 when the model cfg->model names trains on a data set (mlp, gpt), 0 when not (synthetic). */
int pst_model_reads_data(const pst_config *cfg);

#endif /* PST_MODELS_H */
