/* model.h — the model interface: what the executor knows of a model (llm.c's tensor table,
 * ggml's tables of ops).
 *
 * A model is
 *   - a TABLE OF TENSORS: named parameter tensors (offset, shape, dtype) laid end to end in
 *     one flat buffer of `nparams` elements; the gradients use the same layout in a second
 *     buffer. The block plan is cut from this buffer (trainer/plan.h);
 *   - an ORDERED LIST OF LAYERS, forward order, the last one the loss. Each layer names the
 *     tensors it reads and whose gradient it writes (anywhere in the buffer: a tied weight is
 *     simply named by two layers), the widths of its input and output activations, and a
 *     class: forward, weight-gradient and input-gradient ops queued on a stream.
 * The executor runs the layers in order on each device and never learns what they compute.
 * Layer l's input is layer l-1's output (layer 0's is the batch); backward runs the layers
 * last to first, each reading the gradient of its output and writing that of its input.
 *
 * A tensor named by several layers (a tied weight: the token embedding read by the first
 * layer and the output projection) gets its gradient from each: the layer whose backward
 * runs first (the highest) overwrites it, the others add to it. pst_model_add_layer works
 * this out and sets each layer's grad_accumulate bits; a layer class reads them.
 *
 * A block's gradient is final once the LOWEST layer that names it has run its backward (the
 * layers run backward one after another on one stream; a pipeline stage will be a range of
 * layers on one device, and then "lowest" becomes "last in the stage's order"). A layer
 * whose first tensor's gradient can be computed in row ranges says so (split_rows > 0): the
 * executor then cuts its weight gradient where blocks end, so early blocks leave while the
 * rest of the layer is still being computed.
 *
 * The classes live in common/nn/layers/, the models in common/nn/models/.
 * Ownership: a model owns its tables and `data`; pst_model_free releases them. A model is
 * read-only once built and may be shared by every device and thread. */
#ifndef PST_MODEL_H
#define PST_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/runtime/device.h"

struct pst_pool;
struct pst_model;

#define PST_LAYER_MAX_TENSORS 16

typedef struct pst_tensor {
    char name[32];      /* "l0.weight" */
    size_t offset;      /* first element in the flat buffer */
    size_t numel;
    int ndim;
    int64_t shape[4];
    pst_dtype dtype;    /* PST_F32 for now */
} pst_tensor;

/* Where one layer instance on one device reads and writes (the executor's buffers, all
 * memory of that device). `w` changes between steps when the executor switches parameter
 * buffers; the class's bind is then called again. */
typedef struct pst_layer_io {
    struct pst_pool *pool;      /* CPU: the device's thread team (NULL: the stream's thread) */
    const float *w[PST_LAYER_MAX_TENSORS]; /* the values of the layer's tensors, in the order
                                 * it names them: in the flat fp32 buffer, or (bf16/fp16
                                 * parameters) in an fp32 scratch the executor casts the
                                 * layer's tensors into before each use */
    /* bf16 parameters with bf16 GEMMs on (gemm_bf16.h; CPU devices): for each tensor in the
     * class's gemm_weights, its bf16 values where the device keeps them (nothing cast), with
     * w[k] NULL; NULL otherwise */
    const uint16_t *w16[PST_LAYER_MAX_TENSORS];
    float *g[PST_LAYER_MAX_TENSORS]; /* the gradients (fp32) of the layer's tensors, in the
                                 * order it names them: where the device keeps them (the
                                 * flat gradient buffer at the tensors' offsets, for now) */
    int accumulate;             /* 1: every gradient the layer writes adds to the buffer
                                 * (micro-batches after the first); 0: as grad_accumulate */
    const float *in;            /* (max_batch, in_width): the previous layer's output or the batch */
    const int32_t *tokens;      /* layer 0 of a model with in_tokens: the batch as token ids */
    float *out;                 /* (max_batch, out_width); NULL when out_width is 0 */
    const float *dout;          /* gradient of `out` (NULL for the loss layer) */
    float *din;                 /* gradient of `in` (NULL for layer 0: nobody reads it) */
    const int32_t *targets;     /* (max_batch, target_width) labels */
    const float *sparse;        /* a model with sparse fields: the batch's rows of its
                                 * sparse tables (max_batch, sparse_fields * sparse_dim),
                                 * the trainer's; NULL otherwise */
    float *dsparse;             /* their gradient, written by the layer that reads them */
    float *losses;              /* (max_batch) per-row losses, written by the loss layer */
    int32_t *correct;           /* (1) correct predictions, added to by the loss layer */
    float *save;                /* (max_batch, save_width): kept from forward to backward */
    float *work;                /* (max_batch, work_width): scratch of this layer's ops */
    float *scratch;             /* (pool threads, scratch_per_thread) */
    int max_batch;
    /* May be NULL: a layer whose weight gradient is computed by rows (linear) calls it for
     * every range of rows [r0, r1) of its first tensor once their gradients, and the
     * matching entries of its second (the bias), are final; rows_arg is per layer. The
     * executor then updates those parameters at once (training alone), so a layer given it
     * must have read its weights for the input gradient before its weight gradient. */
    void (*rows_done)(void *arg, int r0, int r1);
    void *rows_arg;
    /* May be NULL. Else the device's count of writes to its gradients by anyone but the
     * layers (the executor zeroing them), read when the layer queues its weight gradient:
     * while it has not moved, io->g still holds what the layer last wrote there. NULL:
     * something else writes them every step (a reduce adds other devices' into them). Lets
     * a layer whose gradient is the same every step (fixed_grad) write it once. */
    const uint64_t *grads_gen;
} pst_layer_io;

/* What a layer does, as ops queued on a stream (common/nn/ops.h). The op argument structs
 * live in the instance (inst_bytes, one per device) and in one chunk record per
 * weight-gradient chunk (chunk_bytes): the CPU backend reads them when the op runs, so
 * they must not change until the stream has passed it; the executor sets B and queues,
 * and changes nothing until the step's compute has run. No function allocates. */
typedef struct pst_layer_class {
    const char *name;
    size_t inst_bytes;
    size_t chunk_bytes;         /* per weight-gradient chunk (0: wgrad gets NULL) */
    /* Points the instance's op arguments at io (no work queued). */
    void (*bind)(void *inst, const struct pst_model *m, int layer, const pst_layer_io *io);
    /* Forward over B rows. The loss layer also writes the per-row losses, the gradient of
     * its input scaled by `scale` (evaluation: scale 0, din gets the softmax) and counts
     * correct rows. */
    pst_status (*forward)(void *inst, pst_stream *s, int B, float scale);
    /* The weight gradient of rows [row0, row1) of the first tensor (row1 0: all rows, and
     * every other tensor's gradient; a range that ends at split_rows also finishes the
     * others). `chunk` is this range's own argument record. NULL: no parameters. */
    pst_status (*wgrad)(void *inst, void *chunk, pst_stream *s, int B, int row0, int row1);
    /* The gradient of the input (io->din), when io->din is not NULL. NULL: nothing to do. */
    pst_status (*igrad)(void *inst, pst_stream *s, int B);
    /* The loss layer's predictions after a forward with scale 0: (B, target_width,
     * nclasses) probabilities in device memory. NULL: the layer has none. */
    const float *(*probs)(void *inst);
    /* 1: no op reads the tensors' values (io->w unused): with bf16/fp16 parameters the
     * executor casts nothing for this layer. */
    int weights_unread;
    /* Bit k: tensor k is read only as a linear op's weight (pst_linear_*_args.w), which then
     * takes io->w16[k] when the executor gives it (bf16 GEMMs). */
    uint32_t gemm_weights;
    /* 1: tensor[0] is a weight whose gradient rows wgrad computes by range and tensor[1]
     * its bias, so the executor may update a range of rows while backward goes on (the
     * linear layer). */
    int rows_updatable;
    /* Compute per row in multiply-adds, for the pipeline's balance of stages. NULL: the
     * layer's parameter count (or its input width when it has none). */
    double (*cost)(const struct pst_model *m, int layer);
} pst_layer_class;

typedef struct pst_layer {
    const pst_layer_class *cls;
    int tensor[PST_LAYER_MAX_TENSORS]; /* indices into the model's tensors */
    int ntensors;
    int in_width, out_width;           /* floats per row of input and output */
    int split_rows;                    /* rows of tensor[0] wgrad computes by range (0: none) */
    int split_tile;                    /* cuts fall on multiples of this many rows */
    int flags;                         /* the class's own (e.g. PST_LINEAR_RELU) */
    int save_width;                    /* floats per row kept from forward to backward */
    int work_width;                    /* floats per row of scratch */
    int scratch_per_thread;            /* floats of scratch per thread of the device's team */
    uint32_t grad_accumulate;          /* bit i: add to tensor[i]'s gradient (set by
                                        * pst_model_add_layer: a higher layer writes it first) */
} pst_layer;

typedef struct pst_model {
    char name[16];
    pst_tensor *tensors;
    int ntensors;
    pst_layer *layers;                 /* forward order; the last is the loss */
    int nlayers;
    size_t nparams;
    int in_width;                      /* values per input row (0: the model reads no data) */
    int in_tokens;                     /* 1: the input rows are int32 token ids, not floats */
    int nclasses;                      /* labels are 0 .. nclasses-1 (0: no labels) */
    int target_width;                  /* labels per row (at least 1) */
    int sparse_fields, sparse_dim;     /* a click model: per input row, sparse_fields rows of
                                        * sparse_dim values from its sparse tables
                                        * (io->sparse); 0: none */
    /* The initial parameters from `seed` (nparams host floats). */
    void (*init_params)(const struct pst_model *m, float *dst, uint64_t seed);
    void *data;                        /* the model's own, freed with it */
} pst_model;

/* ---- building a model (for the files in models/) ---- */

/* Appends a tensor of the given shape after the last one. Errors: PST_ERR_NOMEM,
 * PST_ERR_INVALID (a name too long, no or too many dimensions, a dimension < 1). */
pst_status pst_model_add_tensor(pst_model *m, const char *name, int ndim, const int64_t *shape);
/* Appends a layer (copied), and sets grad_accumulate on the earlier layers that name one
 * of its tensors. Errors: PST_ERR_NOMEM, PST_ERR_INVALID (a tensor index out of range, too
 * many tensors, a negative width). */
pst_status pst_model_add_layer(pst_model *m, const pst_layer *layer);
/* The checks the executor relies on: at least one layer; widths chain (layer l's in_width is
 * layer l-1's out_width, layer 0's the model's in_width); every tensor named by some layer;
 * a split layer's first tensor has split_rows rows. Errors: PST_ERR_INVALID naming the layer. */
pst_status pst_model_check(const pst_model *m);
void pst_model_free(pst_model *m); /* accepts a zeroed or half-built model; zeroes it */

/* Points io->w and io->g at layer `layer`'s tensors in the flat fp32 buffers `params` and
 * `grads` (the model's layout); a NULL buffer leaves its pointers as they are. */
void pst_layer_io_point(pst_layer_io *io, const pst_model *m, int layer, const float *params,
                        float *grads);

/* Index of the tensor named `name`, or -1. */
int pst_model_find_tensor(const pst_model *m, const char *name);

/* ---- the layer classes (common/nn/layers/) ---- */

/* 1 when the layer adds to the gradients of its tensors in `mask` (bit i: tensor[i]) rather
 * than writing them: io->accumulate, or one of them is written first by a higher layer. */
int pst_layer_adds_grad(const pst_layer_io *io, const pst_layer *ly, uint32_t mask);

/* Defines the class pst_layer_<id>, named "<id>", whose instance is an `inst_type`; the
 * rest are its other members as designated initializers (.bind = ..., .forward = ...). */
#define PST_LAYER_CLASS(id, inst_type, ...)                                                  \
    const pst_layer_class pst_layer_##id = {.name = #id, .inst_bytes = sizeof(inst_type),    \
                                            __VA_ARGS__}

/* Defines the class of a loss layer whose one op (op(stream, args), its args an `args_type`
 * with members B, scale and dlogits) writes the losses and, times scale, the logits'
 * gradient in one pass, so forward is its backward too; scale 0 writes the probabilities to
 * dlogits instead, which probs returns. bind_fn fills the args from the layer's io. */
#define PST_LOSS_LAYER_CLASS(id, args_type, op, bind_fn)                                     \
    static pst_status id##_forward(void *inst, pst_stream *s, int B, float scale)            \
    {                                                                                        \
        args_type *a = inst;                                                                 \
        a->B = B;                                                                            \
        a->scale = scale;                                                                    \
        return op(s, a);                                                                     \
    }                                                                                        \
    static const float *id##_probs(void *inst) { return ((args_type *)inst)->dlogits; }      \
    PST_LAYER_CLASS(id, args_type, .bind = bind_fn, .forward = id##_forward,                 \
                    .probs = id##_probs)

/* Linear: out (B, OC) = in (B, IC) @ W^T + b, tensors {W (OC, IC), b (OC)}; flags: */
#define PST_LINEAR_RELU 1       /* ReLU on the output */
#define PST_LINEAR_MASK_INPUT 2 /* the input came through a ReLU: din is masked by in > 0 */
extern const pst_layer_class pst_layer_linear;
/* Softmax cross-entropy over in_width classes (the loss; no tensors). */
extern const pst_layer_class pst_layer_softmax_xent;
/* DLRM's interaction (ctr_layers.h): in (B, dim) the bottom MLP's output, io->sparse the
 * row's model->sparse_fields embeddings; out (B, dim + (F+1)F/2) = [in | their pairwise
 * dots]; the input gradient goes to din and io->dsparse. No tensors; flags: */
#define PST_INTERACT_MASK_INPUT 1 /* the input came through a ReLU: din is masked by in > 0 */
extern const pst_layer_class pst_layer_interaction;
/* Binary cross-entropy on one logit per row against a 0/1 label (the loss; no tensors);
 * its probabilities are the sigmoids. */
extern const pst_layer_class pst_layer_bce;
/* Token + position embedding: the first layer of a model with in_tokens (rows of T token
 * ids): out (B, T*C) = wte[token] + wpe[t]; tensors {wte (V, C), wpe (T, C)}. */
extern const pst_layer_class pst_layer_embedding;
/* A pre-LayerNorm transformer block over rows of T positions of C channels (in and out
 * T*C): x += attproj(causal_attention(qkv(ln1(x)))); x += fcproj(gelu(fc(ln2(x)))).
 * Tensors {ln1w, ln1b, qkvw (3C, C), qkvb, attprojw (C, C), attprojb, ln2w, ln2b,
 * fcw (4C, C), fcb, fcprojw (C, 4C), fcprojb}; heads in flags. */
extern const pst_layer_class pst_layer_transformer_block;
/* The language-model loss: final LayerNorm, logits = x @ wte^T (the projection tied to the
 * embedding), softmax cross-entropy of every position against its target; a row's loss is
 * the mean over its T positions. Tensors {lnfw, lnfb, wte (V, C)}; the loss layer. */
extern const pst_layer_class pst_layer_lm_head;
/* The synthetic model's only layer: no compute; its weight gradient is a fixed host array
 * (m->data) copied to the device, its losses are zeros. */
extern const pst_layer_class pst_layer_fixed_grad;

#endif /* PST_MODEL_H */
