/* exec_impl.h — the executor's insides (private to trainer/exec*.c): the per-device and
 * per-block state exec.c builds, and the helpers (exec_impl.c) that exec.c, the step
 * (exec_step.c), evaluation (exec_eval.c) and the pipeline schedule's runner (exec_pipe.c)
 * share. Calls go one way: exec.c -> exec_step.c -> exec_pipe.c -> exec_impl.c and
 * exec_layout.c; nothing here calls back up.
 * Not for: anything outside the executor (use exec.h). */
#ifndef TR_EXEC_IMPL_H
#define TR_EXEC_IMPL_H

#include <sched.h>
#include <stdatomic.h>

#include "common/nn/ops.h"
#include "common/rng.h"
#include "common/runtime/collectives.h"
#include "common/pool.h"
#include "trainer/exec.h"
#include "trainer/exec_layout.h"
#include "trainer/trace.h"

typedef struct exec_pipe exec_pipe; /* exec_pipe.c: --pipeline > 1 */

typedef struct exec_block exec_block;

/* What a queued host function of a block needs to know about its step. The host queues
 * step s+1 before step s's send/recv items have run, so each block has two, by step
 * parity: step s+2 is queued only after step s+1's compute, which waited for every one
 * of step s's items (through the ready events). */
typedef struct exec_slot {
    exec_block *eb;
    long step;
    float scale; /* the loss scale the gradient carries (1: none) */
    void *dst;   /* where the pull lands (elements of the precision's dtype) */
} exec_slot;

typedef struct exec_dev {
    tr_exec *ex;
    pst_device *dev;
    pst_stream *compute, *send, *recv;
    pst_pool *pool;               /* CPU: this device's share of the cores (NULL on CUDA) */
    void *params;                 /* (nparams) of the precision's dtype; shared on CPU */
    float *grads;                 /* (nparams) fp32, micro-batches accumulate in it */
    float *wbuf;                  /* bf16/fp16: (widest layer's tensors) fp32 values of the
                                   * layer being computed, cast from params before each use */
    size_t param_alloc;           /* device bytes allocated here for parameters (its copy,
                                   * the second shared buffer, wbuf): tr_exec_memory_of */
    pst_cast_args *casts;         /* (L * PST_LAYER_MAX_TENSORS) those casts, by layer */
    int accumulate;               /* the layers are bound to add to the gradients */
    uint64_t grads_gen;           /* pst_layer_io.grads_gen: bumped when zeroed */
    float **acts;                 /* (L) layer outputs (max_batch, out_width); NULL: none */
    float *dbuf[2];               /* (max_batch, widest input) backward's ping-pong */
    void **inst;                  /* (L) the layers' op arguments on this device */
    void **chunk;                 /* (nchunks) each weight-gradient chunk's arguments */
    float *x;                     /* (max_batch, in_width) floats, or int32 tokens (in_tokens) */
    float *sparse, *dsparse;      /* a model with sparse fields: (max_batch, F dim) the rows'
                                   * embeddings and their gradient (NULL otherwise) */
    int32_t *y;                   /* (max_batch, target_width) */
    float **save, **work;         /* (L) each layer's kept activations and scratch; NULL: none */
    float **scratch;              /* (L) per-thread scratch; NULL: none */
    float *losses;                /* (max_batch) */
    int32_t *correct;             /* (1) */
    pst_event **grad_done;        /* (nblocks) block b's gradient is final on this device */
    pst_event **x_done;           /* (L) backward no longer reads layer l's weights */
    pst_event **ready;            /* (nblocks) */
    int lo, rows;                 /* this step's rows: [lo, lo + rows) of the trainer's */
} exec_dev;

struct exec_block {
    tr_exec *ex;
    int index;
    const tr_block *b;
    int lmin;                     /* lowest layer that names the block's parameters */
    float **gbufs;                /* (D) grads + offset on every device */
    void **pbufs;                 /* (D) params + offset on every device */
    pst_event *sent;              /* owner's send stream: the exchange started (or failed) */
    float *hgrad;                 /* push staging when device memory is not host memory */
    void *hparam;                 /* pull staging (replicas, unless updated in place) */
    exec_slot slot[2];            /* by step parity */
    pst_rng jitter;               /* test hook: delay before each exchange */
    long step;                    /* of the exchange in flight (set when it starts) */
    pst_flag *landed;             /* on the owner: step s's values have landed at s + 1 */
    /* trace */
    tr_span *send_span, *recv_span;
};

/* The update made during backward (training alone, fp32, one CPU device): a linear layer's
 * rows_done argument, where its weight and bias lie in the flat buffer (exec_bind_layers
 * installs rows_final, which hands the finished rows to the link's update_slice). */
typedef struct exec_rows {
    tr_exec *ex;
    size_t w_off, b_off;
    int IC;
} exec_rows;

struct tr_exec {
    tr_exec_config c;
    const pst_model *model;
    int direct;                    /* the in-process link's update lands in the shared weights
                                    * (training alone on CPU), after backward read them */
    int in_place;                  /* the link updates the shared weights itself (direct,
                                    * fp32) */
    exec_rows *rows;               /* (L) or NULL: the update in place is made during
                                    * backward, tile by tile, as each tile of weight-gradient
                                    * rows is final (rows_final); the layers' arguments */
    pst_dtype pdt;                 /* the parameters' dtype on the devices (--precision) */
    size_t psize;                  /* its bytes */
    int lowp;                      /* pdt is bf16 or fp16: layers compute from wbuf */
    int bf16_gemm;                 /* pdt bf16, CPU devices, pst_gemm_bf16_on(): the layers'
                                    * GEMM weights in bf16 (exec_bind_lowp) */
    int K;                         /* micro-batches per step (--acc-steps) */
    /* fp16 dynamic loss scaling (PyTorch GradScaler's rule) */
    int scaler;                    /* precision f16 */
    float loss_scale;              /* of the next step (1 without the scaler) */
    long good_steps;               /* steps since the last overflow or growth */
    long skipped;                  /* steps skipped for overflow */
    int last_skip;                 /* the last step was skipped */
    atomic_int overflow;           /* a block of this step overflowed (check_overflow) */
    atomic_long exchanges;         /* started and not yet done: tr_exec_free waits for them
                                    * (their done callbacks touch the blocks' flags) */
    long applied;                  /* updates made: the exchanges' step numbers */
    float **homes;                 /* (nblocks) each block's values on its owner device */
    int D, L, host_memory;
    int shared;                    /* CPU: one parameter buffer for every device */
    int stage_local;               /* a pipeline: each device's gradient and parameter
                                    * buffers hold only its blocks (tr_block.holders), in
                                    * block order; a parameter copy per device (not shared) */
    void *pbuf[2];                 /* shared copy with pservers: by step parity (see DESIGN) */
    int cur;                       /* pbuf[cur] holds the newest parameters */
    exec_dev *devs;
    /* Several CPU devices training in process: the in-process store's update and casts over
     * all their threads (idle once backward is done), not device 0's share alone; NULL
     * otherwise (tr_exec_start passes device 0's team) */
    pst_pool *update_pool;
    const tr_plan *plan;
    exec_block *blocks;
    size_t wbuf_floats;            /* bf16/fp16: the widest layer's tensors (its scratch) */
    exec_layout lay;               /* which blocks each layer reads, the weight-gradient
                                    * chunks, the send order (exec_layout.c) */
    /* Reduce (send streams) and broadcast (recv streams) run concurrently: each has a
     * communicator of its own (NCCL orders the kernels of one communicator). */
    pst_comm *reduce_comm, *bcast_comm;
    pst_stream **send_streams, **recv_streams;
    float *host_params;            /* (nparams) */
    void *host_lowp;               /* (nparams) of pdt when lowp: start and tr_exec_params */
    float *host_losses;            /* (max_batch) */
    const float *sparse_in;        /* tr_exec_set_sparse: the next step's or evaluation's rows */
    float *sparse_grad;            /* where the step writes their gradient (NULL: nowhere) */
    size_t sparse_width;           /* floats of a row's sparse embeddings: F dim */
    int max_batch;
    cpu_set_t compute_cpus;        /* --compute-cpus; pinned only when pin_compute */
    int pin_compute;
    int tr_compute[PST_DEVICE_MAX_COUNT], tr_send[PST_DEVICE_MAX_COUNT], tr_recv[PST_DEVICE_MAX_COUNT];
    int tr_push, tr_pull;
    exec_pipe *pipe;               /* --pipeline > 1: the stages' state (exec_pipe.c) */
};

/* ---- exec_impl.c: shared by the executor's files ---- */

/* Device memory of at least one byte (bytes 0 allowed). */
pst_status exec_alloc_dev(pst_device *dev, size_t bytes, void **p);
/* Elements of device i's gradient buffer (and, stage_local, of its parameter buffer): the
 * blocks it holds (stage_local), else all. */
size_t exec_held_elems(const tr_exec *ex, int i);
/* Where device i keeps the gradient / the parameter of element `off` of the flat buffer
 * (after the blocks are set up); NULL where it holds none. */
float *exec_grad_at(const tr_exec *ex, int i, size_t off);
void *exec_param_at(const tr_exec *ex, int i, size_t off);
/* A trace span around the work queued on s between the two calls (NULL when the step is
 * not traced). */
tr_span *exec_mark_begin(tr_exec *ex, pst_stream *s, int track, const char *name, long step,
                         long arg);
void exec_mark_end(pst_stream *s, tr_span *sp);
/* n events of dev in a new array *out (n 0: an empty one). On error *out holds what was
 * made, for exec_events_free. */
pst_status exec_events_create(pst_device *dev, size_t n, pst_event ***out);
/* Destroys the n events of evs (NULL entries allowed) and frees the array (NULL allowed). */
void exec_events_free(pst_event **evs, size_t n);
/* Points every layer instance of device d at its buffers (pipeline off). */
void exec_bind_layers(tr_exec *ex, exec_dev *d);
/* bf16/fp16: binds layer l's tensor k (numel values at src, in the device's parameters)
 * packed at *at floats into d's wbuf (*at advances): io->w[k] there in fp32, cast before
 * each use (exec_enqueue_weights); with bf16 GEMMs (ex->bf16_gemm) a GEMM weight of the
 * layer's class is bound as io->w16[k] = src instead (read in place, nothing cast or
 * packed), io->w[k] NULL. */
void exec_bind_lowp(tr_exec *ex, exec_dev *d, int l, int k, const void *src, size_t numel,
                    size_t *at, pst_layer_io *io);

/* bf16/fp16: queues on s the casts of layer l's tensors into d's fp32 scratch. */
pst_status exec_enqueue_weights(tr_exec *ex, exec_dev *d, pst_stream *s, int l);

#endif /* TR_EXEC_IMPL_H */
