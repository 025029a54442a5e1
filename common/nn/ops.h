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

struct pst_pool;

/* out (B, OC) = inp (B, IC) @ w^T (OC, IC) + b (OC; NULL: no bias), then ReLU when relu.
 * On CPU the GEMM and the bias/ReLU pass are split over `pool` by output rows or columns
 * when given (NULL: the stream's thread alone), each part a single-threaded pst_sgemm call. */
typedef struct pst_linear_fwd_args {
    float *out;
    const float *inp, *w, *b;
    /* CPU only: w in bf16 (then w may be NULL): the GEMMs run in bf16 with fp32
     * accumulation (gemm_bf16.h) on bf16 roundings of inp (and of dout in backward) */
    const uint16_t *w16;
    int B, IC, OC, relu;
    struct pst_pool *pool;       /* CPU only, may be NULL */
} pst_linear_fwd_args;

/* dw (OC, IC) = dout^T @ inp, db (OC) = column sums of dout (overwritten, or added when
 * accumulate; db NULL: a layer without bias), dinp (B, IC) = dout @ w (skipped when NULL).
 * dw and db may both be NULL
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
    const uint16_t *w16;         /* CPU only: as in pst_linear_fwd_args */
    int B, IC, OC, accumulate;
    int row0, row1;              /* weight-gradient rows; row1 == 0: all */
    struct pst_pool *pool;       /* CPU only, may be NULL: split as the forward */
    /* CPU only, may be NULL: called on the thread that computed them, once the rows
     * [r0, r1) of dw and their entries of db are final (a tile of PST_ROW_TILE rows or less
     * at a time), while they are still in its cache. The GPU backends ignore it. */
    void (*rows_done)(void *arg, int r0, int r1);
    void *rows_arg;
    /* May be NULL: dinp then goes through the input's ReLU, dinp = mask > 0 ? dinp : 0
     * (mask (B, IC): the layer's input, a ReLU's output), in the same op, slice by slice. */
    const float *mask;
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
 * (evaluation), the softmax itself. With group > 1 (a language model's positions: B rows
 * in groups of `group`), losses has B/group entries, each the mean of its group's losses
 * (summed in row order in double). */
typedef struct pst_xent_args {
    float *losses;
    int32_t *correct;
    float *dlogits;
    const float *logits;
    const int32_t *targets;
    int B, C;
    float scale;
    int group;                   /* 0 or 1: a loss per row */
} pst_xent_args;

/* dst (n) += src (n); both on the stream's device, or src on another device of the same
 * runtime when the backend can read it (CPU: always). With bias: dst is rows of `width` (a
 * divisor of n) and each element gets its column's bias first, dst = (dst + bias) + src:
 * the bias of the linear layer that wrote dst (which then adds none) in the residual's
 * pass, the bits of the two passes. */
typedef struct pst_add_args {
    float *dst;
    const float *src, *bias;
    size_t n;
    int width;
    struct pst_pool *pool;       /* CPU only, may be NULL: split over it */
} pst_add_args;

/* dst (n, of dtype dt) = src (n, of dtype st), rounding to nearest even (dtype.h). */
typedef struct pst_cast_args {
    void *dst;
    pst_dtype dt;
    const void *src;
    pst_dtype st;
    size_t n;
    struct pst_pool *pool;       /* CPU only, may be NULL: split over it */
} pst_cast_args;

/* ---- sequence ops (seq_layers.h's kernels; on CPU split over `pool` where given, by rows,
 * columns or (sequence, head) pairs, which changes no bit) ---- */

/* out (B, T, C) = wte[tokens] + wpe[t]. */
typedef struct pst_embedding_fwd_args {
    float *out;
    const int32_t *tokens;
    const float *wte, *wpe;
    int B, T, C;
    struct pst_pool *pool;
} pst_embedding_fwd_args;

/* dwte (V, C) and dwpe (T, C) from dout (B, T, C), rows in (b, t) order; each overwritten
 * or added to (its own accumulate flag); either may be NULL. */
typedef struct pst_embedding_bwd_args {
    float *dwte, *dwpe;
    const float *dout;
    const int32_t *tokens;
    int B, T, C, V;
    int wte_accumulate, wpe_accumulate;
    struct pst_pool *pool;
} pst_embedding_bwd_args;

/* LayerNorm over rows of C: forward writes out, mean, rstd (N); backward writes dinp
 * (the input gradient, or res + it where res is set: a residual's gradient added in the
 * same pass, res may be dinp; dinp NULL: skipped) and dw, db (overwritten, or added when
 * accumulate; both NULL: skipped). */
typedef struct pst_layernorm_args {
    float *out, *mean, *rstd;   /* forward */
    float *dinp, *dw, *db;      /* backward */
    const float *inp, *w, *b, *dout;
    const float *saved_mean, *saved_rstd; /* backward: the forward's mean, rstd */
    const float *res;                     /* backward: added to dinp, or NULL */
    int N, C;
    int accumulate;
    struct pst_pool *pool;
} pst_layernorm_args;

/* Causal multi-head attention (seq_layers.h): forward out (B, T, C), lse (B, H, T) from
 * qkv (B, T, 3C); backward dqkv from dout, qkv, lse. scratch: 2*T floats per thread of the
 * pool (one part's at scratch + part * 2T). probs (forward) and saved_probs (backward), or
 * NULL: (B, H, T, T) probabilities kept from the forward for the backward on CPU devices
 * (pst_attention_keeps_probs); CUDA's kernels recompute them and leave the buffer alone. */
typedef struct pst_attention_args {
    float *out, *lse, *probs;   /* forward */
    float *dqkv;                /* backward */
    const float *qkv, *dout, *saved_lse, *saved_probs;
    int B, T, C, H;
    float *scratch;
    struct pst_pool *pool;
} pst_attention_args;

/* GELU (tanh form): forward out = gelu(inp), and when deriv is set also deriv = gelu'(inp)
 * (deriv may be inp: the pre-activation is then replaced by what the backward needs);
 * backward out = gelu'(inp) * dout, or deriv * dout when deriv is set (a forward's deriv:
 * the same bits, no tanh computed again); out may be dout. Forward with bias: inp is rows
 * of `width` (a divisor of n) and each gets bias (width) added first, the bias of the
 * linear layer before it (which then adds none): one pass less, the same bits. Backward
 * with dbias (and deriv): the same, and out's column sums over the rows, in row order,
 * written to (accumulate: added to) dbias, the bias gradient of that layer (which then
 * computes none). */
typedef struct pst_gelu_args {
    float *out;
    const float *inp, *dout, *bias;
    float *deriv, *dbias;
    int64_t n;
    int width, accumulate;
    struct pst_pool *pool;
} pst_gelu_args;

/* ---- the click model's ops (ctr_layers.h's kernels; on CPU split over `pool` by rows) ---- */

/* The interaction (ctr_layers.h): forward out (B, dim + (F+1)F/2) from bottom (B, dim) and
 * emb (B rows of F dim, emb_stride floats apart); backward dbottom (B, dim) and demb (B
 * rows, demb_stride apart) from dout (NULL dbottom and demb: no backward). */
typedef struct pst_interact_args {
    float *out;                 /* forward */
    float *dbottom, *demb;      /* backward */
    const float *bottom, *emb, *dout;
    int emb_stride, demb_stride;
    int B, F, dim;
    struct pst_pool *pool;
} pst_interact_args;

/* Binary cross-entropy on logits (ctr_layers.h): losses (B), dlogits (B) = (sigmoid -
 * label) * scale, or the probabilities when scale is 0. labels (B): 0 or 1. */
typedef struct pst_bce_args {
    float *losses, *dlogits;
    const float *logits;
    const int32_t *labels;
    int B;
    float scale;
} pst_bce_args;

pst_status pst_op_interact_forward(pst_stream *s, const pst_interact_args *a);
pst_status pst_op_interact_backward(pst_stream *s, const pst_interact_args *a);
pst_status pst_op_bce_logits(pst_stream *s, const pst_bce_args *a);

pst_status pst_op_embedding_forward(pst_stream *s, const pst_embedding_fwd_args *a);
pst_status pst_op_embedding_backward(pst_stream *s, const pst_embedding_bwd_args *a);
pst_status pst_op_layernorm_forward(pst_stream *s, const pst_layernorm_args *a);
pst_status pst_op_layernorm_backward(pst_stream *s, const pst_layernorm_args *a);
pst_status pst_op_attention_forward(pst_stream *s, const pst_attention_args *a);
pst_status pst_op_attention_backward(pst_stream *s, const pst_attention_args *a);
pst_status pst_op_gelu_forward(pst_stream *s, const pst_gelu_args *a);
pst_status pst_op_gelu_backward(pst_stream *s, const pst_gelu_args *a);

pst_status pst_op_linear_forward(pst_stream *s, const pst_linear_fwd_args *a);
pst_status pst_op_linear_backward(pst_stream *s, const pst_linear_bwd_args *a);
pst_status pst_op_relu_backward(pst_stream *s, const pst_relu_bwd_args *a);
pst_status pst_op_softmax_xent(pst_stream *s, const pst_xent_args *a);
pst_status pst_op_add(pst_stream *s, const pst_add_args *a);
pst_status pst_op_cast(pst_stream *s, const pst_cast_args *a);

#endif /* PST_OPS_H */
