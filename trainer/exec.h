/* exec.h — the executor: one training step over the trainer's local devices, scheduled
 * on per-device streams (DESIGN.md, "The step, end to end").
 *
 * Every device holds a replica of the model (params, grads, activations) and computes its
 * share of the trainer's rows on its COMPUTE stream. Each gradient block of the plan has
 * an owner device. As soon as backward has finished the layers a block covers on every
 * device, the owner's SEND stream sums the devices' copies into the owner (collectives,
 * fixed device order) and starts the block's exchange through the link (link.h: push +
 * pull to the pservers, or the in-process store's update when training alone). The owner's
 * RECV stream takes blocks in forward order: it waits for the block's new values and
 * broadcasts them to the other devices, then records the block's ready event on every
 * device. The next step's forward of layer l waits only on the ready events of the
 * blocks that layer reads, so compute restarts before the last block is back.
 * With overlap off the same work runs serialized: backward, then all sends, then all
 * receives, then the next step.
 * Not thread safe: one thread drives an executor. */
#ifndef TR_EXEC_H
#define TR_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/data/data.h"
#include "common/runtime/device.h"
#include "common/nn/model.h"
#include "trainer/link.h"
#include "trainer/plan.h"
#include "trainer/test_hooks.h"
#include "trainer/trace.h"

typedef struct tr_exec tr_exec;

/* The job's settings the executor reads, and only those (tr_exec_settings_of takes them
 * from the job's pst_config; the pointers point into it). */
typedef struct tr_exec_settings {
    pst_dtype precision;        /* the devices' parameters: f32, bf16 or f16 */
    pst_dtype grad_dtype;       /* the pushed gradients (fp16: the overflow bound) */
    int acc_steps;              /* micro-batches per step without a pipeline (0: 1) */
    int cpu_replicas;           /* 1: a parameter copy per CPU device (the GPU schedule) */
    float loss_scale;           /* fp16: the first dynamic loss scale */
    long loss_scale_window;     /* fp16: steps without overflow before it doubles */
    const char *compute_cpus;   /* --compute-cpus as given ("": the threads are not pinned) */
    const uint64_t *compute_cpu_mask; /* (PST_CPU_MASK_WORDS) the same CPUs as bits */
    int pipeline;               /* stages P (1: none) */
    int micro_batches;          /* M, pipelined */
    int virtual_stages;         /* V: model chunks per device */
    pst_schedule schedule;
    const int *partition;       /* (npartition) layers per model chunk by hand; 0: balanced */
    int npartition;
} tr_exec_settings;

/* The executor's settings of a job. */
tr_exec_settings tr_exec_settings_of(const pst_config *cfg);

/* A pipeline's (cfg->pipeline > 1) flat buffer on D = P x R devices (R data-parallel
 * replicas of the P stages) as segments of the plan (tr_plan_build_segments): runs of
 * tensors that the same devices hold, a stage (chunk k runs on device r P + k % P in
 * replica r) holding the tensors its chunks' layers name, the tied token table the first
 * and the last stage. *out (free) lists them in buffer order. Errors: PST_ERR_INVALID (D
 * not a multiple of P), those of the partition (--partition, too few layers),
 * PST_ERR_NOMEM. */
pst_status tr_exec_stage_segments(const pst_model *m, const tr_exec_settings *cfg, int D,
                                  tr_plan_segment **out, int *nsegs);
/* The block plan of a job on D local devices (tr_plan_build_segments): a pipeline's cut at
 * its stages' segments (D a multiple of cfg->pipeline), else one segment every device
 * holds. Errors: those of the two. */
pst_status tr_exec_plan(tr_plan *p, const pst_model *m, const tr_exec_settings *cfg,
                        size_t block_bytes, int npservers, int D);

typedef struct tr_exec_config {
    tr_exec_settings cfg;   /* what the executor reads of the job's settings */
    pst_runtime *rt;        /* the trainer's devices */
    const pst_model *model; /* what to train (outlives the executor) */
    int max_rows;           /* most rows of one step on this trainer */
    int eval_rows;          /* rows per evaluation batch */
    tr_link *link;          /* the exchange: the pservers, or the in-process store */
    int overlap;            /* 0: serialized schedule */
    int threads;            /* CPU threads per device: its layers and optimizer (0: 1) */
    tr_trace *trace;        /* may be NULL */
    const tr_test_hooks *hooks; /* the tests' faults (overflow, jitter); NULL: none */
} tr_exec_config;

/* Allocates everything a step needs, for the link's block plan (built for this model's
 * parameters and the runtime's devices). */
pst_status tr_exec_init(tr_exec **out, const tr_exec_config *c);
void tr_exec_free(tr_exec *ex); /* waits for the streams; accepts NULL */
size_t tr_exec_nparams(const tr_exec *ex);
/* Initial parameters from `seed` on every device, through the link's start (the pservers:
 * Init, then everyone pulls trainer 0's values; or a checkpoint's, when the link resumes:
 * link->start_version is then the first step to run). */
pst_status tr_exec_start(tr_exec *ex, uint64_t seed);
/* Queues step `step` (0, 1, 2, ... in order) over rows x (rows, in_width: floats, or int32 token ids when the model
 * has in_tokens) and y (rows, target_width) in host memory, this trainer's
 * share of a global batch of `global_rows`; returns when the step's compute has run (its
 * communication may still be running), with the sum of the rows' losses. */
pst_status tr_exec_step(tr_exec *ex, long step, const void *x, const int32_t *y, int rows,
                        int global_rows, double *loss_sum);
/* Waits for all queued work. */
pst_status tr_exec_sync(tr_exec *ex);
/* For the time split: the seconds the busiest device's compute stream has run work since
 * the start (-1 when its backend does not measure it), and the longest a pserver held one
 * of the pulls since the last call for the other trainers' pushes (link.h's take_held). */
void tr_exec_time_counters(tr_exec *ex, double *compute_busy, double *held_max);
/* The forward alone on device 0 over `rows` (at most the evaluation rows) host rows, as
 * tr_exec_step takes them: the sum of their losses and the number of correct predictions
 * (call after tr_exec_sync; returns when done). */
pst_status tr_exec_eval_batch(tr_exec *ex, const void *x, const int32_t *y, int rows,
                              double *loss_sum, long *correct);
/* The model's predictions on device 0 for `rows` host rows (as tr_exec_step takes them):
 * probs (rows, target_width, nclasses) in host memory. Errors: PST_ERR_UNSUPPORTED for a
 * model whose loss layer gives none (call after tr_exec_sync). */
pst_status tr_exec_predict(tr_exec *ex, const void *x, int rows, float *probs);
/* A model with sparse fields (model.h: the click model): the rows' embeddings for the next
 * tr_exec_step, tr_exec_eval_batch or tr_exec_predict, sparse (rows, F dim) host floats in
 * the order of the batch's rows, and where that step writes their gradient (rows, F dim;
 * NULL: not wanted, as in evaluation). Both stay the caller's and must stay valid until the
 * step's compute has run (tr_exec_sync, or the step's return when overlap is off). */
void tr_exec_set_sparse(tr_exec *ex, const float *sparse, float *dsparse);
/* Test accuracy on device 0 (call after tr_exec_sync). */
pst_status tr_exec_evaluate(tr_exec *ex, const pst_dataset *test, double *acc);
/* A copy of the parameters as f32 (after tr_exec_sync): device 0's, or in a CPU pipeline
 * each block's from the stage that owns it. */
pst_status tr_exec_params(tr_exec *ex, float *dst);
/* Device memory of one local device, in bytes, as the summary reports it:
 *   params  its parameter copy, or the one of device 0 that CPU devices share: the whole
 *           model, or a CPU pipeline stage's blocks only (times the precision's size);
 *   grads   its gradient buffer (fp32, what its layers accumulate into): the whole model,
 *           or a CPU pipeline stage's blocks only;
 *   acts    the rest the executor keeps there: activations (or a pipeline's slots),
 *           backward's buffers, scratch, the batch (live bytes less the parameter
 *           buffers it allocated and the gradients);
 *   peak    the most allocated on it at once. */
typedef struct tr_exec_memory {
    size_t params, grads, acts, peak;
} tr_exec_memory;
tr_exec_memory tr_exec_memory_of(const tr_exec *ex, int device);
/* fp16: the loss scale of the next step (GradScaler's rule: --loss-scale to start, x2
 * after --loss-scale-window steps without overflow up to PST_LOSS_SCALE_MAX, x0.5 on
 * overflow; an overflow at PST_LOSS_SCALE_MIN fails the step); 1 otherwise. */
#define PST_LOSS_SCALE_MAX 0x1p24f
#define PST_LOSS_SCALE_MIN 0x1p-24f
float tr_exec_loss_scale(const tr_exec *ex);
/* Steps skipped because some trainer's fp16 gradient overflowed (every pserver and trainer
 * skipped them: no block changed); *last (may be NULL): whether the last step was one. */
long tr_exec_skipped(const tr_exec *ex, int *last);
/* Where the trainer stands before `next_step` (a checkpoint's tr_resume_state: the loss
 * scaler's state, steps skipped), and *version (may be NULL) the updates made so far: the
 * version of the blocks that step computes with. A resumed link's start_state is taken
 * by tr_exec_start. */
tr_resume_state tr_exec_state(const tr_exec *ex, long next_step, long *version);
/* Pipeline (--pipeline > 1): activation and gradient copies between stages so far (the
 * only messages between them: 2 (C - 1) per micro-batch and step); 0 without a pipeline. */
long tr_exec_stage_messages(const tr_exec *ex);
/* Pipeline: the model chunk layer l runs in (on device chunk % P); 0 without a pipeline,
 * -1 for a layer out of range. */
int tr_exec_chunk_of(const tr_exec *ex, int l);
/* *equal = 1 when every tensor that chunks on several devices name (the tied token
 * embedding: the first stage's embedding, the last stage's projection) has the same bits
 * in each of those devices' parameter copies (call after tr_exec_sync; 1 without a
 * pipeline or with one shared CPU copy). Blocking. */
pst_status tr_exec_tied_equal(tr_exec *ex, int *equal);

#endif /* TR_EXEC_H */
