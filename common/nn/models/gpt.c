/* gpt.c — the `gpt` model on the model interface (see models.h): llm.c's GPT-2 layout for
 * a character language model. Tensors in llm.c's ParameterTensors order, one tensor per
 * layer inside each stacked kind (h0.ln1w, h1.ln1w, ..., h0.ln1b, ...), so the flat buffer
 * is exactly llm.c's (and torch_gpt.py --dump-state's) parameter layout. Layers: the
 * embedding, L transformer blocks, the loss head; the token table is named by the first
 * and the last layer (tied). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/nn/models/models.h"
#include "common/nn/seq_layers.h"
#include "common/rng.h"

/* the stacked kinds in llm.c's order, with their per-layer shapes (in units of C) */
enum { K_LN1W, K_LN1B, K_QKVW, K_QKVB, K_APW, K_APB, K_LN2W, K_LN2B, K_FCW, K_FCB, K_FPW, K_FPB,
       NKINDS };
static const char *const kind_names[NKINDS] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw",
                                               "attprojb", "ln2w", "ln2b", "fcw", "fcb",
                                               "fcprojw", "fcprojb"};
static const int kind_rows[NKINDS] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1}; /* x C */
static const int kind_cols[NKINDS] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 0}; /* x C; 0: 1-D */

typedef struct gpt_shape {
    int L;
} gpt_shape;

/* PyTorch's init in torch_gpt.py: weights and embeddings N(0, 0.02), the two residual
 * projections N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1. Tensor i draws from
 * pst_rng stream (seed, i): the values do not depend on the other tensors. */
static void gpt_init_params(const pst_model *m, float *dst, uint64_t seed)
{
    const int L = ((const gpt_shape *)m->data)->L;
    for (int i = 0; i < m->ntensors; i++) {
        const pst_tensor *t = &m->tensors[i];
        const char *kind = strchr(t->name, '.') ? strchr(t->name, '.') + 1 : t->name;
        float *p = dst + t->offset;
        size_t n = t->numel;
        if (strcmp(kind, "ln1w") == 0 || strcmp(kind, "ln2w") == 0 || strcmp(kind, "lnfw") == 0) {
            for (size_t k = 0; k < n; k++)
                p[k] = 1.0f;
        } else if (t->ndim == 1) { /* biases and LayerNorm biases */
            memset(p, 0, n * sizeof(float));
        } else {
            const float sd = strcmp(kind, "attprojw") == 0 || strcmp(kind, "fcprojw") == 0
                                 ? 0.02f / sqrtf(2.0f * (float)L)
                                 : 0.02f;
            pst_rng r;
            pst_rng_seed(&r, seed, (uint64_t)i);
            for (size_t k = 0; k < n; k++)
                p[k] = sd * pst_rng_normal(&r);
        }
    }
}

pst_status pst_model_gpt(pst_model *m, int V, int T, int L, int H, int C)
{
    *m = (pst_model){.name = "gpt", .in_width = T, .in_tokens = 1, .nclasses = V,
                     .target_width = T, .init_params = gpt_init_params};
    pst_status st = PST_OK;
    if (V < 2 || T < 1 || L < 1 || H < 1 || C < 1 || C % H != 0 || (int64_t)T * C > (1 << 24) ||
        L > 1024 || V > 65536) {
        st = pst_error_set(PST_ERR_INVALID, "gpt: bad shape (vocabulary %d, context %d, %d "
                           "layers, %d heads, %d channels; channels a multiple of heads, "
                           "e.g. --layers 4 --heads 4 --embd 128 --ctx 128)", V, T, L, H, C);
        goto error;
    }
    gpt_shape *shape = calloc(1, sizeof *shape);
    if (!(m->data = shape)) {
        st = pst_error_set(PST_ERR_NOMEM, "gpt: out of memory");
        goto error;
    }
    shape->L = L;
    char name[32];
    const int64_t wte[2] = {V, C}, wpe[2] = {T, C};
    if ((st = pst_model_add_tensor(m, "wte", 2, wte)) != PST_OK ||
        (st = pst_model_add_tensor(m, "wpe", 2, wpe)) != PST_OK)
        goto error;
    int first[NKINDS]; /* tensor index of layer 0's tensor of each kind */
    for (int k = 0; k < NKINDS; k++) {
        first[k] = m->ntensors;
        for (int l = 0; l < L; l++) {
            const int64_t shape2[2] = {(int64_t)kind_rows[k] * C, (int64_t)kind_cols[k] * C};
            snprintf(name, sizeof name, "h%d.%s", l, kind_names[k]);
            if ((st = pst_model_add_tensor(m, name, kind_cols[k] ? 2 : 1, shape2)) != PST_OK)
                goto error;
        }
    }
    const int64_t c1[1] = {C};
    if ((st = pst_model_add_tensor(m, "lnfw", 1, c1)) != PST_OK ||
        (st = pst_model_add_tensor(m, "lnfb", 1, c1)) != PST_OK)
        goto error;
    const int TC = T * C;
    const pst_layer emb = {.cls = &pst_layer_embedding, .tensor = {0, 1}, .ntensors = 2,
                           .in_width = T, .out_width = TC};
    if ((st = pst_model_add_layer(m, &emb)) != PST_OK)
        goto error;
    for (int l = 0; l < L; l++) {
        /* transformer_block.c's kept activations, the probabilities where it keeps them */
        const int probs = pst_attention_keeps_probs(T, C, H) ? H * T : 0;
        pst_layer blk = {.cls = &pst_layer_transformer_block, .ntensors = NKINDS,
                         .in_width = TC, .out_width = TC, .flags = H,
                         .save_width = T * (15 * C + 4 + H + probs), .work_width = 10 * TC,
                         .scratch_per_thread = (int)PST_ATTENTION_SCRATCH(T)};
        for (int k = 0; k < NKINDS; k++)
            blk.tensor[k] = first[k] + l;
        if ((st = pst_model_add_layer(m, &blk)) != PST_OK)
            goto error;
    }
    const int lnf = m->ntensors - 2;
    const pst_layer head = {.cls = &pst_layer_lm_head, .tensor = {lnf, lnf + 1, 0},
                            .ntensors = 3, .in_width = TC, .save_width = T * (C + 2 + 2 * V),
                            .work_width = TC};
    if ((st = pst_model_add_layer(m, &head)) != PST_OK || (st = pst_model_check(m)) != PST_OK)
        goto error;
    return PST_OK;
error:
    pst_model_free(m);
    return st;
}
