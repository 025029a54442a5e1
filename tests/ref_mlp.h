/* ref_mlp.h — the tests' reference MLP: Linear -> ReLU -> ... -> Linear, softmax
 * cross-entropy, computed on the host with the plain CPU kernels of layers.h, one call
 * after another. The trainer runs the MLP of common/nn/models/mlp.c through the model
 * interface (model.h) and the executor; tests compare the two (test_model, test_exec).
 *
 * All parameters live in ONE flat buffer and all gradients in another of the same layout
 * (llm.c's ParameterTensors idea): layer l's weight (out_l, in_l) then its bias (out_l),
 * layers in forward order. Backward runs last layer first, so the END of the flat buffer
 * is complete first; the optional grad-ready hook reports each finished range, which is
 * what lets gradient blocks leave while backward continues.
 * Activations are sized for `max_batch` rows at init; forward/backward allocate nothing.
 * Not thread safe: one model per thread (a device has its own replica). */
#ifndef PST_TEST_REF_MLP_H
#define PST_TEST_REF_MLP_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h" /* PST_MAX_HIDDEN */
#include "common/runtime/device.h"
#include "common/error.h"

typedef struct ref_mlp_config {
    int in_dim;                      /* 784 for Fashion-MNIST */
    int out_dim;                     /* classes */
    int nhidden;                     /* hidden layers */
    int hidden[PST_MAX_HIDDEN];  /* their widths */
} ref_mlp_config;

typedef struct ref_linear_view {
    int in, out;
    size_t w_off;   /* offset of the weight (out, in) in the flat buffer */
    size_t b_off;   /* offset of the bias (out) */
} ref_linear_view;

/* Called after backward has finished the flat-buffer range [offset, offset+length). */
typedef void (*ref_grad_ready_fn)(void *arg, size_t offset, size_t length);

typedef struct ref_mlp {
    ref_mlp_config cfg;
    int nlayers;                                /* nhidden + 1 */
    int max_batch;
    size_t nparams;
    pst_device *dev;                            /* memory comes from here */
    float *params;                              /* (nparams) */
    float *grads;                               /* (nparams), same layout */
    ref_linear_view layer[PST_MAX_HIDDEN + 1];
    float *acts[PST_MAX_HIDDEN + 1];        /* layer outputs (max_batch, out_l); last = logits */
    float *probs;                               /* (max_batch, out_dim) */
    float *dbuf[2];                             /* (max_batch, widest layer) ping-pong */
} ref_mlp;

/* Number of parameters of an MLP with this shape. */
size_t ref_mlp_param_count(const ref_mlp_config *cfg);
/* Allocates the buffers on `dev` (params zeroed). Errors: PST_ERR_INVALID (bad shape),
 * PST_ERR_NOMEM. On error the model is freed and zeroed. */
pst_status ref_mlp_init(ref_mlp *m, const ref_mlp_config *cfg, int max_batch, pst_device *dev);
void ref_mlp_free(ref_mlp *m); /* accepts a zeroed or half-built model */
/* PyTorch's nn.Linear default: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)), from `seed`. */
void ref_mlp_init_params(ref_mlp *m, uint64_t seed);
/* The same values written to dst (nparams host floats) instead of m->params. */
void ref_mlp_init_params_into(const ref_mlp *m, float *dst, uint64_t seed);
/* Forward on x (B, in_dim) with targets y (B); returns the SUM of the B losses.
 * B <= max_batch. Leaves logits/probs for backward and prediction. */
double ref_mlp_forward(ref_mlp *m, const float *x, const int32_t *y, int B);
/* Backward of the last forward: grads = d(sum of losses * scale)/d params, overwritten
 * (or added when accumulate != 0). `ready` (may be NULL) is called per finished layer. */
void ref_mlp_backward(ref_mlp *m, const float *x, const int32_t *y, int B, float scale,
                      int accumulate, ref_grad_ready_fn ready, void *ready_arg);
/* Counts correct argmax predictions of the last forward's logits. */
int ref_mlp_count_correct(const ref_mlp *m, const int32_t *y, int B);

#endif /* PST_TEST_REF_MLP_H */
