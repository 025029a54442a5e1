/* ops.h — the model's compute as operations queued on a device stream, so the trainer's
 * executor is written once for every backend (CPU now, CUDA when built).
 *
 * Each op takes its stream and a pointer to an argument struct. Every pointer in the
 * struct is memory of the stream's device (pst_device_alloc), except where noted.
 * Ownership and lifetime: the CPU backend reads the argument struct when the op RUNS on
 * the stream's worker, a CUDA backend when the op is queued; so the caller keeps the
 * struct alive and unchanged until the op has run (the executor keeps one per layer and
 * changes it only between synchronized steps). The ops reproduce the CPU reference
 * kernels of layers.h (CUDA within per-op tolerances, see tests/test_ops.c).
 * Errors: PST_ERR_INVALID for NULL or mismatched arguments; a failing op makes its stream's
 * status sticky (device.h). Thread safety: as pst_stream_launch. */
#ifndef PST_OPS_H
#define PST_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "common/runtime/device.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/nn/layers.h"
#include "common/nn/optim.h"

struct pst_pool;

/* out (B, OC) = inp (B, IC) @ w^T (OC, IC) + b (OC), then ReLU when relu != 0.
 * On CPU the GEMM and the bias/ReLU pass are split over `pool` by output columns when
 * given (NULL: the stream's thread alone), each part a single-threaded OpenBLAS call. */
typedef struct pst_linear_fwd_args {
    float *out;
    const float *inp, *w, *b;
    int B, IC, OC, relu;
    struct pst_pool *pool;       /* CPU only, may be NULL */
} pst_linear_fwd_args;

/* dw (OC, IC) = dout^T @ inp, db (OC) = column sums of dout (overwritten, or added when
 * accumulate), dinp (B, IC) = dout @ w (skipped when NULL). dw and db may both be NULL
 * (only dinp): the executor computes the weight gradient first, so the block can leave
 * while the input gradient is still being computed. When row1 > 0 only rows [row0, row1)
 * of dw and db are computed (0 <= row0 < row1 <= OC): the executor cuts a layer's weight
 * gradient near its block boundaries, so each block leaves as soon as its rows are done.
 * row0, and row1 unless it is OC, must be multiples of PST_ROW_TILE (layers.h): then the
 * rows are computed by the same GEMM calls, tile by tile, as in one op over all rows, and
 * get the same bits. */
typedef struct pst_linear_bwd_args {
    float *dinp, *dw, *db;
    const float *dout, *inp, *w;
    int B, IC, OC, accumulate;
    int row0, row1;              /* weight-gradient rows; row1 == 0: all */
    struct pst_pool *pool;       /* CPU only, may be NULL: split as the forward */
} pst_linear_bwd_args;

/* dinp (n) = out > 0 ? dout : 0. dinp may equal dout. */
typedef struct pst_relu_bwd_args {
    float *dinp;
    const float *dout, *out;
    int64_t n;
} pst_relu_bwd_args;

/* Softmax cross-entropy, forward and backward in one pass:
 * losses (B) = -log softmax(logits)[target]; correct (1 int) += rows whose argmax is the
 * target (may be NULL); dlogits (B, C) = (softmax - onehot) * scale, or, when scale is 0
 * (evaluation), the softmax itself. */
typedef struct pst_xent_args {
    float *losses;
    int32_t *correct;
    float *dlogits;
    const float *logits;
    const int32_t *targets;
    int B, C;
    float scale;
} pst_xent_args;

/* dst (n) += src (n); both on the stream's device, or src on another device of the same
 * runtime when the backend can read it (CPU: always). */
typedef struct pst_add_args {
    float *dst;
    const float *src;
    size_t n;
} pst_add_args;

/* The optimizer update of optim.h on device memory (param, state, grad). On CPU the
 * elementwise pass is split over `pool` when given (NULL: the stream's thread alone); the
 * split does not change a bit. */
typedef struct pst_optim_args {
    const pst_optim_config *cfg; /* host memory, read when the op runs */
    struct pst_pool *pool;       /* CPU only, may be NULL */
    long t;
    float *param, *state;
    size_t state_stride;
    const float *grad;
    size_t n;
} pst_optim_args;

/* dst (n, of dtype dt) = src (n, of dtype st), rounding to nearest even (dtype.h). */
typedef struct pst_cast_args {
    void *dst;
    pst_dtype dt;
    const void *src;
    pst_dtype st;
    size_t n;
} pst_cast_args;

pst_status pst_op_linear_forward(pst_stream *s, const pst_linear_fwd_args *a);
pst_status pst_op_linear_backward(pst_stream *s, const pst_linear_bwd_args *a);
pst_status pst_op_relu_backward(pst_stream *s, const pst_relu_bwd_args *a);
pst_status pst_op_softmax_xent(pst_stream *s, const pst_xent_args *a);
pst_status pst_op_add(pst_stream *s, const pst_add_args *a);
pst_status pst_op_optim_apply(pst_stream *s, const pst_optim_args *a);
pst_status pst_op_cast(pst_stream *s, const pst_cast_args *a);

#endif /* PST_OPS_H */
