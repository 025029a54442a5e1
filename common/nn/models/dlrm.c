/* dlrm.c — the `dlrm` click model on the model interface (see models.h). */
#include <stdio.h>

#include "common/nn/ctr_layers.h"
#include "common/nn/layers.h"
#include "common/nn/models/models.h"

/* Appends linear layer `name`<i> (in -> out) with its two tensors. */
static pst_status add_linear(pst_model *m, const char *name, int i, int in, int out, int flags)
{
    char tn[32];
    const int64_t wshape[2] = {out, in}, bshape[1] = {out};
    snprintf(tn, sizeof tn, "%s%d.weight", name, i);
    PST_TRY(pst_model_add_tensor(m, tn, 2, wshape));
    snprintf(tn, sizeof tn, "%s%d.bias", name, i);
    PST_TRY(pst_model_add_tensor(m, tn, 1, bshape));
    const pst_layer l = {.cls = &pst_layer_linear, .tensor = {m->ntensors - 2, m->ntensors - 1},
                         .ntensors = 2, .in_width = in, .out_width = out, .split_rows = out,
                         .split_tile = PST_ROW_TILE, .flags = flags};
    return pst_model_add_layer(m, &l);
}

pst_status pst_model_dlrm(pst_model *m, int D, int F, int dim, int nbottom, const int *bottom,
                          int ntop, const int *top)
{
    /* nclasses 1: one probability per row, of a click (the bce layer's probs) */
    *m = (pst_model){.name = "dlrm", .in_width = D, .nclasses = 1, .target_width = 1,
                     .sparse_fields = F, .sparse_dim = dim,
                     .init_params = pst_init_linear_layers};
    pst_status st = PST_OK;
    if (D < 1 || F < 1 || dim < 1 || nbottom < 0 || nbottom > PST_MAX_HIDDEN || ntop < 0 ||
        ntop > PST_MAX_HIDDEN || (size_t)F * (size_t)(F + 1) / 2 > (1u << 24)) {
        st = pst_error_set(PST_ERR_INVALID, "dlrm: bad shape (%d dense, %d fields of %d, %d "
                           "bottom and %d top layers; at most %d each)", D, F, dim, nbottom,
                           ntop, PST_MAX_HIDDEN);
        goto error;
    }
    int in = D;
    for (int i = 0; i <= nbottom && st == PST_OK; i++) { /* the last one outputs dim */
        const int out = i < nbottom ? bottom[i] : dim;
        st = out < 1 ? pst_error_set(PST_ERR_INVALID, "dlrm: bottom layer %d has width %d", i,
                                     out)
                     : add_linear(m, "b", i, in, out,
                                  PST_LINEAR_RELU | (i ? PST_LINEAR_MASK_INPUT : 0));
        in = out;
    }
    const pst_layer inter = {.cls = &pst_layer_interaction, .in_width = dim,
                             .out_width = pst_interact_width(F, dim),
                             .flags = PST_INTERACT_MASK_INPUT};
    if (st == PST_OK)
        st = pst_model_add_layer(m, &inter);
    in = inter.out_width;
    for (int i = 0; i <= ntop && st == PST_OK; i++) { /* the last one outputs the logit */
        const int out = i < ntop ? top[i] : 1;
        st = out < 1 ? pst_error_set(PST_ERR_INVALID, "dlrm: top layer %d has width %d", i, out)
                     : add_linear(m, "t", i, in, out,
                                  (i < ntop ? PST_LINEAR_RELU : 0) |
                                      (i ? PST_LINEAR_MASK_INPUT : 0));
        in = out;
    }
    const pst_layer loss = {.cls = &pst_layer_bce, .in_width = 1};
    if (st == PST_OK && (st = pst_model_add_layer(m, &loss)) == PST_OK)
        st = pst_model_check(m);
    if (st == PST_OK)
        return PST_OK;
error:
    pst_model_free(m);
    return st;
}
