/* exec_pipe.c — the executor's pipeline mode (--pipeline P > 1; see exec_pipe.h).
 *
 * The model's layers are cut into C = P x V contiguous model chunks (balanced by compute,
 * or --partition); chunk k runs on stage k % P (V chunks per stage: the interleaved
 * schedule's virtual stages). With D = P x R devices the trainer runs R data-parallel
 * replicas of the pipeline: replica r's stage s is device r P + s. Each step splits the
 * trainer's rows into M micro-batches, each micro-batch over the R replicas (as --acc-steps
 * splits over devices without a pipeline), and runs, on every device's compute stream, the
 * instruction list the schedule module built for its stage (trainer/pipe_sched.h: a pure
 * function of P, M, V and the kind).
 *
 * DESIGN
 * - Memory flat in M: a device's activations live in a pool of SLOTS, as many as its
 *   schedule's peak number of micro-batches in flight (forward run, backward not yet),
 *   each big enough for any of its chunks: per layer the output and what forward keeps
 *   for backward, the chunk's input, the gradient of its output (written by the next
 *   stage), the loss layer's input gradient and the per-row losses. The schedule gives
 *   each forward its slot; the backward of that micro-batch frees it. Layer instances (op
 *   arguments, host memory) are one per (micro-batch, layer), bound at init to that
 *   micro-batch's slot; nothing is allocated per step.
 * - Fixed shapes: a micro-batch's activation between stages is (rows, in_width) of the
 *   receiving chunk's first layer, known from the model: only the values travel, as one
 *   device-to-device copy; no shape or metadata message exists (messages are counted).
 * - Transfers run on each device's transfer stream, beside its compute: the activation of
 *   (m, k - 1) is copied from the sender's slot into chunk k's slot once the sender's
 *   forward has run and the slot's last backward has freed it, and FORWARD (m, k) waits
 *   for the copy; after BACKWARD (m, k) the input gradient (in the device's one gin
 *   buffer) is copied into chunk k - 1's slot of m, and the next backward waits until gin
 *   has left. So the copies of micro-batch m + 1 overlap the compute of m. Every copy
 *   lands in memory nobody else uses then: a slot lives from its forward to its backward,
 *   and the sender's backward of m comes after the receiver has both read its activation
 *   and written its gradient (an event per micro-batch and chunk each way). The schedule's SEND and RECV
 *   instructions order the lists; the host enqueues each device's list in order and
 *   holds an instruction back until what it waits for has been enqueued (the schedule is
 *   deadlock free, tested on its own, so this ends).
 * - Parameters and gradients: the block plan is cut at the stages' segments
 *   (tr_exec_stage_segments), so a block's holders are the devices whose chunks name its
 *   tensors: its stage in every replica. Each device's parameter and gradient
 *   buffers hold only its blocks, end to end (exec_param_at, exec_grad_at; a copy per
 *   device, as the replicas' schedule has), the gradients zeroed at the start of the step
 *   (so the first micro-batch adds to zero: the same bits as writing). A block with one
 *   holder needs no reduce and no broadcast; the others are reduced over their holders in
 *   device order (a stage's replica group; the tied token embedding, read by the first
 *   chunk's embedding and the last chunk's projection: the first and the last stage of
 *   each replica), and their new values broadcast to those (pst_comm_reduce_some,
 *   pst_comm_broadcast_some; on CUDA an NCCL communicator set per group). bf16/fp16: a
 *   device's parameters are in that dtype and each layer's are
 *   cast into its fp32 wbuf before each forward and backward, as without a pipeline;
 *   activations stay fp32. The block leaves as soon as every device recorded its
 *   grad_done: a device records it right after the last backward of its last chunk that
 *   names the block (at the start for blocks it never touches), so the last stage's blocks
 *   leave while the earlier stages are still in their backward.
 * - The loss is summed on the host from the per-row losses copied out of the last chunk's
 *   slot after each forward; logits and labels are kept only in the slot, until backward.
 * Evaluation runs the chunks one after another with micro-batch 0's instances and slots,
 * in pieces of a micro-batch. */
#include "trainer/exec_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/memory.h"
#include "trainer/pipe_sched.h"

/* Where chunk k's buffers lie in a slot, in 4-byte elements from the slot's start. */
typedef struct pipe_chunk {
    int stage;           /* k % P: replica r runs it on device r P + stage */
    int first, last;     /* its layers [first, last] */
    size_t in_off;       /* k == 0: the batch (floats or int32 tokens); else the copied
                          * input activation (mb, in_width of `first`) */
    size_t y_off;        /* last chunk: the targets (mb, target_width) */
    size_t *out_off;     /* (last - first + 1) each layer's output (mb, out_width) */
    size_t *save_off;    /* (last - first + 1) what it keeps from forward (mb, save_width) */
    size_t dout_off;     /* k < C-1: the gradient of the output (mb, out_width of `last`) */
    size_t dlast_off;    /* last chunk: the loss layer's input gradient (mb, in_width) */
    size_t loss_off;     /* last chunk: per-row losses (mb) */
    size_t floats;       /* the chunk's share of a slot */
} pipe_chunk;

typedef struct pipe_dev {
    float *slots;        /* (nslots, slot_floats) */
    int nslots;
    size_t slot_floats;
    float *dbuf[2];      /* (mb, widest input of its layers): backward's ping-pong */
    float *gin;          /* (mb, widest chunk input): a chunk's input gradient, sent down */
    float *work;         /* (mb, widest work_width): a layer's backward scratch */
    float *scratch;      /* (threads, largest scratch_per_thread) */
    int32_t *correct;    /* (1) */
    void **inst;         /* (M * L) layer l's instance for micro-batch m, bound to m's slot;
                          * NULL: not here. One per micro-batch, not per slot: the host
                          * sets an op's row count when it queues it, and a slot's next
                          * micro-batch is queued before its last one has run */
    void **wchunk;       /* (M * L) its weight-gradient argument record */
    int *blk_pos;        /* (nblocks) list position after which grad_done[b] is recorded
                          * (-1: at the start of the step: no chunk here names it) */
    int *layer_pos;      /* (L) the same for x_done[l] */
    pst_stream *xfer;    /* the copies between stages that land here or leave from here */
    pst_event **slot_free; /* (nslots) recorded on compute after the backward that frees it */
    pst_event *gin_free; /* recorded on xfer after gin was copied down */
    int tr_xfer;         /* its trace track */
} pipe_dev;

struct exec_pipe {
    tr_psched sched;
    int P, V, M, C;
    int R;               /* data-parallel replicas of the pipeline: devices P R */
    int mb;              /* most rows of one micro-batch on one replica */
    pipe_chunk *chunks;  /* (C) */
    pipe_dev *pd;        /* (P R) by device */
    int *fwd_slot;       /* (M * C) the slot FORWARD (m, k) uses (every replica the same) */
    /* by (r, m, k), at(): */
    pst_event **act_ev;  /* forward (m, k) has run: its output can be read */
    pst_event **grad_ev; /* the gradient of (m, k)'s output is in its slot */
    pst_event **in_ev;   /* (m, k)'s input activation is in its slot (k > 0) */
    pst_event **gin_ev;  /* backward (m, k) wrote its input gradient to gin */
    unsigned char *fwd_enq, *bwd_enq; /* host: queued this step */
    pst_event **eval_ev; /* (C) evaluation (replica 0): chunk k's forward has run */
    int *rows, *lo;      /* (R * M) this step's micro-batches, replica r's part of m: rows
                          * [lo, lo + rows) of the trainer's */
    float *host_losses;  /* (R * M * mb) per-row losses of the step, row order */
    long messages;       /* activation and gradient copies between stages, all steps */
};

static inline size_t at(const exec_pipe *p, int r, int m, int k)
{
    return ((size_t)r * (size_t)p->M + (size_t)m) * (size_t)p->C + (size_t)k;
}

/* The device that runs chunk k in replica r. */
static inline int dev_of(const exec_pipe *p, int r, int k)
{
    return r * p->P + p->chunks[k].stage;
}

/* ---- partition ------------------------------------------------------------------------ */

/* A layer's compute per row, in multiply-adds (what the balance weighs): its class's cost,
 * or its parameter count (its input width when it has none). */
static double layer_cost(const pst_model *m, int l)
{
    const pst_layer *ly = &m->layers[l];
    if (ly->cls->cost)
        return ly->cls->cost(m, l);
    double numel = 0.0;
    for (int k = 0; k < ly->ntensors; k++)
        numel += (double)m->tensors[ly->tensor[k]].numel;
    return numel > 0.0 ? numel : (double)ly->in_width;
}

/* first[k], k = 0..C: chunk k is layers [first[k], first[k+1]). By hand (--partition) or
 * the contiguous split that makes the costliest chunk cheapest (dynamic programming). */
static pst_status partition(const pst_model *m, const tr_exec_settings *cfg, int C, int *first)
{
    const int L = m->nlayers;
    if (cfg->npartition) {
        int sum = 0;
        for (int k = 0; k < cfg->npartition; k++)
            sum += cfg->partition[k];
        if (cfg->npartition != C || sum != L)
            return pst_error_set(PST_ERR_INVALID, "--partition lists %d chunks of %d layers; "
                                 "model %s needs %d chunks (--pipeline x --virtual-stages) "
                                 "of %d layers in all, each at least 1", cfg->npartition, sum,
                                 m->name, C, L);
        first[0] = 0;
        for (int k = 0; k < C; k++)
            first[k + 1] = first[k] + cfg->partition[k];
        return PST_OK;
    }
    if (L < C)
        return pst_error_set(PST_ERR_INVALID, "--pipeline %d x --virtual-stages %d = %d model "
                             "chunks, but model %s has %d layers: at most %d chunks (example: "
                             "--pipeline 2)", cfg->pipeline, cfg->virtual_stages, C, m->name, L,
                             L);
    double *pre = calloc((size_t)L + 1, sizeof *pre);
    double *best = malloc(sizeof(double) * (size_t)(C + 1) * (size_t)(L + 1));
    int *cut = malloc(sizeof(int) * (size_t)(C + 1) * (size_t)(L + 1));
    if (!pre || !best || !cut) {
        PST_FREE_ALL(pre, best, cut);
        return pst_error_set(PST_ERR_NOMEM, "pipeline: out of memory");
    }
    for (int l = 0; l < L; l++)
        pre[l + 1] = pre[l] + layer_cost(m, l);
    /* best[k][j]: the smallest largest cost of the first j layers in k chunks */
#define B(k, j) best[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
#define CUT(k, j) cut[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
    for (int j = 0; j <= L; j++)
        B(1, j) = pre[j];
    for (int k = 2; k <= C; k++)
        for (int j = k; j <= L; j++) {
            B(k, j) = -1.0;
            for (int i = k - 1; i < j; i++) { /* the last chunk is layers [i, j) */
                double c = B(k - 1, i) > pre[j] - pre[i] ? B(k - 1, i) : pre[j] - pre[i];
                if (B(k, j) < 0.0 || c < B(k, j)) {
                    B(k, j) = c;
                    CUT(k, j) = i;
                }
            }
        }
    first[C] = L;
    for (int k = C, j = L; k > 1; k--) {
        j = CUT(k, j);
        first[k - 1] = j;
    }
    first[0] = 0;
#undef B
#undef CUT
    PST_FREE_ALL(pre, best, cut);
    return PST_OK;
}

static pst_status nomem(void)
{
    return pst_error_set(PST_ERR_NOMEM, "pipeline: out of memory");
}

/* ---- the stages' tensors -------------------------------------------------------------- */

pst_status tr_exec_stage_segments(const pst_model *m, const tr_exec_settings *cfg, int D,
                                  tr_plan_segment **out, int *nsegs)
{
    *out = NULL;
    *nsegs = 0;
    const int P = cfg->pipeline, V = cfg->virtual_stages > 0 ? cfg->virtual_stages : 1;
    const int C = P * V, T = m->ntensors;
    if (P < 2 || D < P || D % P || D > PST_DEVICE_MAX_COUNT)
        return pst_error_set(PST_ERR_INVALID, "--pipeline %d on %d devices: a pipeline needs "
                             "P x R devices, R replicas of its %d stages, at most %d (example: "
                             "PSTRAIN_DEVICES=cpu:%d)", P, D, P, PST_DEVICE_MAX_COUNT, P);
    int *first = malloc(sizeof(int) * (size_t)(C + 1));
    uint64_t *mask = calloc((size_t)T, sizeof *mask);
    tr_plan_segment *segs = calloc((size_t)T, sizeof *segs);
    pst_status st = !first || !mask || !segs ? nomem() : partition(m, cfg, C, first);
    for (int k = 0; st == PST_OK && k < C; k++) /* chunk k: device r P + k % P, replica r */
        for (int l = first[k]; l < first[k + 1]; l++)
            for (int i = 0; i < m->layers[l].ntensors; i++)
                for (int d = k % P; d < D; d += P)
                    mask[m->layers[l].tensor[i]] |= (uint64_t)1 << d;
    /* The table lists the tensors in buffer order, end to end, each named by some layer
     * (model.h, pst_model_check): runs of equal masks are the segments. */
    int n = 0;
    for (int t = 0; st == PST_OK && t < T; t++) {
        if (n > 0 && segs[n - 1].holders == mask[t])
            segs[n - 1].length += m->tensors[t].numel;
        else
            segs[n++] = (tr_plan_segment){m->tensors[t].numel, mask[t]};
    }
    free(first);
    free(mask);
    if (st != PST_OK) {
        free(segs);
        return st;
    }
    *out = segs;
    *nsegs = n;
    return PST_OK;
}

pst_status tr_exec_plan(tr_plan *p, const pst_model *m, const tr_exec_settings *cfg,
                        size_t block_bytes, int npservers, int D)
{
    tr_plan_segment whole = {m->nparams, pst_devices_first(D)};
    tr_plan_segment *segs = &whole;
    int nsegs = 1;
    if (cfg->pipeline > 1 && D % cfg->pipeline == 0)
        PST_TRY(tr_exec_stage_segments(m, cfg, D, &segs, &nsegs));
    const pst_status st = tr_plan_build_segments(p, segs, nsegs, block_bytes, npservers, D);
    if (segs != &whole)
        free(segs);
    return st;
}

/* ---- init ----------------------------------------------------------------------------- */

/* Lays out chunk k's share of a slot. */
static pst_status layout_chunk(const tr_exec *ex, exec_pipe *p, int k, const int *first)
{
    const pst_model *m = ex->model;
    pipe_chunk *pc = &p->chunks[k];
    const size_t mb = (size_t)p->mb;
    pc->stage = k % p->P;
    pc->first = first[k];
    pc->last = first[k + 1] - 1;
    const int n = pc->last - pc->first + 1;
    pc->out_off = calloc((size_t)n, sizeof(size_t));
    pc->save_off = calloc((size_t)n, sizeof(size_t));
    if (!pc->out_off || !pc->save_off)
        return nomem();
    size_t off = 0;
    pc->in_off = off;
    off += mb * (size_t)(k == 0 ? (m->in_width > 0 ? m->in_width : 1)
                                : m->layers[pc->first].in_width);
    for (int l = pc->first; l <= pc->last; l++) {
        pc->out_off[l - pc->first] = off;
        off += mb * (size_t)m->layers[l].out_width;
        pc->save_off[l - pc->first] = off;
        off += mb * (size_t)m->layers[l].save_width;
    }
    const int last_chunk = k == p->C - 1;
    pc->y_off = off;
    off += last_chunk ? mb * (size_t)m->target_width : 0;
    pc->dout_off = off;
    off += last_chunk ? 0 : mb * (size_t)m->layers[pc->last].out_width;
    pc->dlast_off = off;
    off += last_chunk ? mb * (size_t)m->layers[ex->L - 1].in_width : 0;
    pc->loss_off = off;
    off += last_chunk ? mb : 0;
    pc->floats = off;
    return PST_OK;
}

/* Binds layer l of chunk k in slot j of its device to that slot's buffers. Backward
 * inside a chunk ping-pongs between dbuf[0] and dbuf[1] from its top layer down; the top
 * layer reads the gradient the next stage wrote into the slot (the loss layer writes its
 * input gradient at forward time, so into the slot too); the chunk's first layer writes
 * its input gradient into gin, which its backward then copies to the stage below. */
static void bind_slot_layer(tr_exec *ex, int r, int k, int mi, int l)
{
    exec_pipe *p = ex->pipe;
    const int j = p->fwd_slot[at(p, 0, mi, k)], dev = dev_of(p, r, k);
    const pst_model *m = ex->model;
    const pipe_chunk *pc = &p->chunks[k];
    exec_dev *d = &ex->devs[dev];
    pipe_dev *pd = &p->pd[dev];
    float *slot = pd->slots + (size_t)j * pd->slot_floats;
    const int top = pc->last, loss = ex->L - 1, i = l - pc->first;
    float *din = NULL;
    const float *dout = NULL;
    if (l == loss)
        din = slot + pc->dlast_off;
    else if (l == pc->first)
        din = l ? pd->gin : NULL;
    else
        din = pd->dbuf[(top - l) & 1];
    if (l == top)
        dout = l == loss ? NULL : slot + pc->dout_off;
    else if (l + 1 == loss)
        dout = slot + pc->dlast_off;
    else
        dout = pd->dbuf[(top - l - 1) & 1];
    pst_layer_io io = {
        .pool = d->pool, .accumulate = 1,
        .in = l == pc->first ? (m->in_tokens && l == 0 ? NULL : slot + pc->in_off)
                             : slot + pc->out_off[i - 1],
        .tokens = l == 0 && m->in_tokens ? (const int32_t *)(const void *)(slot + pc->in_off)
                                         : NULL,
        .out = m->layers[l].out_width ? slot + pc->out_off[i] : NULL,
        .dout = dout, .din = din,
        .targets = (const int32_t *)(const void *)(slot + pc->y_off),
        .losses = slot + pc->loss_off, .correct = pd->correct,
        .save = m->layers[l].save_width ? slot + pc->save_off[i] : NULL,
        .work = pd->work, .scratch = pd->scratch, .max_batch = p->mb};
    size_t packed = 0;
    for (int k = 0; k < m->layers[l].ntensors; k++) { /* its stage keeps them: not NULL */
        const pst_tensor *t = &m->tensors[m->layers[l].tensor[k]];
        io.g[k] = exec_grad_at(ex, dev, t->offset);
        if (ex->lowp) /* packed in the device's wbuf, cast there before each use */
            exec_bind_lowp(ex, d, l, k, exec_param_at(ex, dev, t->offset), t->numel, &packed,
                           &io);
        else
            io.w[k] = exec_param_at(ex, dev, t->offset);
    }
    m->layers[l].cls->bind(pd->inst[(size_t)mi * ex->L + l], m, l, &io);
}

void exec_pipe_bind(tr_exec *ex)
{
    exec_pipe *p = ex->pipe;
    for (int r = 0; r < p->R; r++)
        for (int k = 0; k < p->C; k++)
            for (int mi = 0; mi < p->M; mi++)
                for (int l = p->chunks[k].first; l <= p->chunks[k].last; l++)
                    bind_slot_layer(ex, r, k, mi, l);
}

/* Device s's buffers and instances (after the chunks are laid out): those of its stage's
 * chunks. */
static pst_status alloc_pipe_dev(tr_exec *ex, int s)
{
    exec_pipe *p = ex->pipe;
    const pst_model *m = ex->model;
    pipe_dev *pd = &p->pd[s];
    exec_dev *d = &ex->devs[s];
    const size_t mb = (size_t)p->mb;
    size_t widest = 1, gin = 1, work = 1, scratch = 1;
    const int stage = s % p->P;
    for (int k = stage; k < p->C; k += p->P) {
        const pipe_chunk *pc = &p->chunks[k];
        pd->slot_floats = pc->floats > pd->slot_floats ? pc->floats : pd->slot_floats;
        const size_t w0 = (size_t)m->layers[pc->first].in_width;
        gin = w0 > gin ? w0 : gin;
        for (int l = pc->first; l <= pc->last; l++) {
            const pst_layer *ly = &m->layers[l];
            widest = (size_t)ly->in_width > widest ? (size_t)ly->in_width : widest;
            work = (size_t)ly->work_width > work ? (size_t)ly->work_width : work;
            scratch = (size_t)ly->scratch_per_thread > scratch ? (size_t)ly->scratch_per_thread
                                                               : scratch;
        }
    }
    pd->nslots = p->sched.peak_in_flight[stage];
    if (pd->nslots < 1)
        pd->nslots = 1; /* evaluation uses slot 0 */
    const size_t threads = d->pool ? (size_t)pst_pool_size(d->pool) : 1;
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * (size_t)pd->nslots * pd->slot_floats,
                           (void **)&pd->slots));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * mb * widest, (void **)&pd->dbuf[0]));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * mb * widest, (void **)&pd->dbuf[1]));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * mb * gin, (void **)&pd->gin));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * mb * work, (void **)&pd->work));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * threads * scratch, (void **)&pd->scratch));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(int32_t), (void **)&pd->correct));
    const size_t ninst = (size_t)p->M * (size_t)ex->L;
    pd->inst = calloc(ninst, sizeof(void *));
    pd->wchunk = calloc(ninst, sizeof(void *));
    pd->blk_pos = malloc(sizeof(int) * (size_t)(ex->plan->nblocks ? ex->plan->nblocks : 1));
    pd->layer_pos = malloc(sizeof(int) * (size_t)ex->L);
    if (!pd->inst || !pd->wchunk || !pd->blk_pos || !pd->layer_pos)
        return nomem();
    PST_TRY(exec_events_create(d->dev, (size_t)pd->nslots, &pd->slot_free));
    PST_TRY(pst_stream_create(d->dev, &pd->xfer));
    PST_TRY(pst_event_create(d->dev, &pd->gin_free));
    if (ex->c.trace) {
        char name[48];
        snprintf(name, sizeof name, "%s stage transfers", pst_device_name(d->dev));
        pd->tr_xfer = tr_trace_track(ex->c.trace, name);
    }
    for (int k = stage; k < p->C; k += p->P)
        for (int mi = 0; mi < p->M; mi++)
            for (int l = p->chunks[k].first; l <= p->chunks[k].last; l++) {
                const pst_layer_class *cls = m->layers[l].cls;
                const size_t i = (size_t)mi * ex->L + l;
                if (!(pd->inst[i] = calloc(1, cls->inst_bytes ? cls->inst_bytes : 1)) ||
                    (cls->chunk_bytes && !(pd->wchunk[i] = calloc(1, cls->chunk_bytes))))
                    return nomem();
            }
    return PST_OK;
}

/* Where in device s's list (its stage's) grad_done[b] and x_done[l] are recorded: after
 * the last BACKWARD of the last of its chunks that names them. */
static void record_points(tr_exec *ex, int s)
{
    exec_pipe *p = ex->pipe;
    pipe_dev *pd = &p->pd[s];
    const tr_psched_instr *list = p->sched.list[s % p->P];
    for (int b = 0; b < ex->plan->nblocks; b++)
        pd->blk_pos[b] = -1;
    for (int l = 0; l < ex->L; l++)
        pd->layer_pos[l] = -1;
    for (int i = 0; i < p->sched.count[s % p->P]; i++) {
        const tr_psched_instr *in = &list[i];
        if (in->op != TR_PSCHED_BACKWARD)
            continue;
        const pipe_chunk *pc = &p->chunks[in->chunk];
        for (int l = pc->first; l <= pc->last; l++) {
            pd->layer_pos[l] = i;
            for (int q = ex->lay.layer_blocks0[l]; q < ex->lay.layer_blocks0[l + 1]; q++)
                pd->blk_pos[ex->lay.layer_blocks[q]] = i;
        }
    }
}

pst_status exec_pipe_init(tr_exec *ex)
{
    const tr_exec_settings *cfg = &ex->c.cfg;
    const int P = cfg->pipeline, V = cfg->virtual_stages, M = cfg->micro_batches;
    if (ex->D % P)
        return pst_error_set(PST_ERR_INVALID, "--pipeline %d needs a multiple of %d devices: "
                             "one per stage, times the pipeline's data-parallel replicas "
                             "(example: PSTRAIN_DEVICES=cpu:%d, or cpu:%d for 2 replicas); "
                             "this trainer has %d", P, P, P, 2 * P, ex->D);
    exec_pipe *p = calloc(1, sizeof *p);
    if (!p)
        return nomem();
    ex->pipe = p;
    p->P = P;
    p->V = V;
    p->M = M;
    p->C = P * V;
    p->R = ex->D / P;
    const int R = p->R;
    p->mb = ((ex->c.max_rows + M - 1) / M + R - 1) / R;
    PST_TRY(tr_psched_build(&p->sched, cfg->schedule, P, M, V));
    int *first = malloc(sizeof(int) * (size_t)(p->C + 1));
    p->chunks = calloc((size_t)p->C, sizeof *p->chunks);
    p->pd = calloc((size_t)ex->D, sizeof *p->pd);
    const size_t n = (size_t)R * (size_t)M * (size_t)p->C;
    p->fwd_slot = malloc(sizeof(int) * (size_t)M * (size_t)p->C);
    p->act_ev = calloc(n, sizeof(pst_event *));
    p->grad_ev = calloc(n, sizeof(pst_event *));
    p->in_ev = calloc(n, sizeof(pst_event *));
    p->gin_ev = calloc(n, sizeof(pst_event *));
    p->eval_ev = calloc((size_t)p->C, sizeof(pst_event *));
    p->fwd_enq = calloc(n, 1);
    p->bwd_enq = calloc(n, 1);
    p->rows = calloc((size_t)R * (size_t)M, sizeof(int));
    p->lo = calloc((size_t)R * (size_t)M, sizeof(int));
    p->host_losses = malloc(sizeof(float) * (size_t)R * (size_t)M * (size_t)p->mb);
    if (!first || !p->chunks || !p->pd || !p->fwd_slot || !p->act_ev || !p->grad_ev ||
        !p->in_ev || !p->gin_ev ||
        !p->eval_ev || !p->fwd_enq || !p->bwd_enq || !p->rows || !p->lo || !p->host_losses) {
        free(first);
        return nomem();
    }
    pst_status st = partition(ex->model, cfg, p->C, first);
    for (int k = 0; st == PST_OK && k < p->C; k++)
        st = layout_chunk(ex, p, k, first);
    free(first);
    PST_TRY(st);
    for (int s = 0; s < P; s++)
        for (int i = 0; i < p->sched.count[s]; i++) {
            const tr_psched_instr *in = &p->sched.list[s][i];
            if (in->op == TR_PSCHED_FORWARD)
                p->fwd_slot[at(p, 0, in->micro, in->chunk)] = in->slot;
        }
    for (int s = 0; s < ex->D; s++) {
        PST_TRY(alloc_pipe_dev(ex, s));
        record_points(ex, s);
    }
    for (size_t i = 0; i < n; i++) {
        const int k = (int)(i % (size_t)p->C), r = (int)(i / ((size_t)M * (size_t)p->C));
        /* each recorded by a stream of the device that makes it: act, in and gin by chunk
         * k's, grad by k + 1's (of the same replica) */
        const int up = k + 1 < p->C ? k + 1 : k;
        pst_device *own = ex->devs[dev_of(p, r, k)].dev;
        PST_TRY(pst_event_create(own, &p->act_ev[i]));
        PST_TRY(pst_event_create(ex->devs[dev_of(p, r, up)].dev, &p->grad_ev[i]));
        PST_TRY(pst_event_create(own, &p->in_ev[i]));
        PST_TRY(pst_event_create(own, &p->gin_ev[i]));
    }
    for (int k = 0; k < p->C; k++)
        PST_TRY(pst_event_create(ex->devs[dev_of(p, 0, k)].dev, &p->eval_ev[k]));
    exec_pipe_bind(ex);
    char parts[256] = "";
    for (int k = 0, o = 0; k < p->C && o < (int)sizeof parts - 16; k++)
        o += snprintf(parts + o, sizeof parts - (size_t)o, "%s%d-%d", k ? "," : "",
                      p->chunks[k].first, p->chunks[k].last);
    PST_INFO("pipeline: %d stages x %d replica%s, %s schedule, %d micro-batches of up to %d "
             "rows per replica, %d chunks (layers %s), slots per stage:", P, R, R > 1 ? "s" : "",
             pst_schedule_name(cfg->schedule), M, p->mb, p->C, parts);
    for (int s = 0; s < P; s++)
        PST_INFO("pipeline: stage %d (%s): %d slots of %zu floats", s,
                 pst_device_name(ex->devs[s].dev), p->pd[s].nslots, p->pd[s].slot_floats);
    return PST_OK;
}

void exec_pipe_free(tr_exec *ex)
{
    exec_pipe *p = ex->pipe;
    if (!p)
        return;
    const size_t n = (size_t)p->R * (size_t)p->M * (size_t)p->C;
    for (int s = 0; p->pd && s < ex->D; s++) /* its queue is done: the compute waited */
        pst_stream_destroy(p->pd[s].xfer);
    exec_events_free(p->act_ev, n);
    exec_events_free(p->grad_ev, n);
    exec_events_free(p->in_ev, n);
    exec_events_free(p->gin_ev, n);
    exec_events_free(p->eval_ev, (size_t)p->C);
    for (int s = 0; p->pd && s < ex->D; s++) {
        pipe_dev *pd = &p->pd[s];
        pst_device *dev = ex->devs[s].dev;
        for (size_t i = 0; pd->inst && i < (size_t)p->M * (size_t)ex->L; i++) {
            free(pd->inst[i]);
            free(pd->wchunk ? pd->wchunk[i] : NULL); /* NULL: its allocation failed */
        }
        PST_FREE_ALL(pd->inst, pd->wchunk, pd->blk_pos, pd->layer_pos);
        exec_events_free(pd->slot_free, (size_t)pd->nslots);
        pst_event_destroy(pd->gin_free);
        pst_device_free(dev, pd->slots);
        pst_device_free(dev, pd->dbuf[0]);
        pst_device_free(dev, pd->dbuf[1]);
        pst_device_free(dev, pd->gin);
        pst_device_free(dev, pd->work);
        pst_device_free(dev, pd->scratch);
        pst_device_free(dev, pd->correct);
    }
    for (int k = 0; p->chunks && k < p->C; k++) {
        free(p->chunks[k].out_off);
        free(p->chunks[k].save_off);
    }
    tr_psched_free(&p->sched);
    PST_FREE_ALL(p->chunks, p->pd, p->fwd_slot, p->fwd_enq, p->bwd_enq, p->rows, p->lo,
                 p->host_losses, p);
    ex->pipe = NULL;
}

long tr_exec_stage_messages(const tr_exec *ex)
{
    return ex->pipe ? ex->pipe->messages : 0;
}

int tr_exec_chunk_of(const tr_exec *ex, int l)
{
    if (l < 0 || l >= ex->L)
        return -1;
    for (int k = 0; ex->pipe && k < ex->pipe->C; k++)
        if (l >= ex->pipe->chunks[k].first && l <= ex->pipe->chunks[k].last)
            return k;
    return 0;
}

pst_status tr_exec_tied_equal(tr_exec *ex, int *equal)
{
    *equal = 1;
    exec_pipe *p = ex->pipe;
    if (!p || ex->shared)
        return PST_OK;
    const pst_model *m = ex->model;
    for (int t = 0; t < m->ntensors && *equal; t++) {
        uint64_t on = 0; /* the devices whose chunks name it: replicas, and tied stages */
        for (int k = 0; k < p->C; k++)
            for (int l = p->chunks[k].first; l <= p->chunks[k].last; l++)
                for (int q = 0; q < m->layers[l].ntensors; q++)
                    for (int r = 0; m->layers[l].tensor[q] == t && r < p->R; r++)
                        on |= (uint64_t)1 << dev_of(p, r, k);
        if (__builtin_popcountll(on) < 2)
            continue;
        const size_t bytes = m->tensors[t].numel * ex->psize;
        char *ref = malloc(bytes ? bytes : 1), *got = malloc(bytes ? bytes : 1);
        pst_status st = !ref || !got ? nomem() : PST_OK;
        for (int i = 0, seen = 0; i < ex->D && *equal && st == PST_OK; i++) {
            if (!((on >> i) & 1u))
                continue;
            exec_dev *d = &ex->devs[i];
            st = pst_memcpy_async(d->compute, seen ? got : ref,
                                  exec_param_at(ex, i, m->tensors[t].offset), bytes,
                                  PST_COPY_DEVICE_TO_HOST);
            if (st == PST_OK)
                st = pst_stream_synchronize(d->compute);
            if (st == PST_OK && seen)
                *equal = memcmp(ref, got, bytes) == 0;
            seen = 1;
        }
        free(ref);
        free(got);
        PST_TRY(st);
    }
    return PST_OK;
}

/* ---- the step ------------------------------------------------------------------------- */

/* The slot of micro-batch m on chunk k in replica r (its device's, that FORWARD (m, k)
 * took). */
static float *slot_of(const exec_pipe *p, int r, int m, int k)
{
    const pipe_dev *pd = &p->pd[dev_of(p, r, k)];
    return pd->slots + (size_t)p->fwd_slot[at(p, 0, m, k)] * pd->slot_floats;
}

/* A trace span's argument: which replica, chunk (< 1,024) and micro-batch (< 4,096). */
static long span_arg(int r, int m, int k)
{
    return (1024L * r + k) * 4096L + m;
}

/* Forward of micro-batch m on chunk k of replica r (its input copied in first), with
 * `scale` for the loss layer; the last chunk's per-row losses go to the host. */
static pst_status enqueue_forward(tr_exec *ex, long step, int r, int m, int k, const void *x,
                                  const int32_t *y, float scale)
{
    exec_pipe *p = ex->pipe;
    const pst_model *mo = ex->model;
    const pipe_chunk *pc = &p->chunks[k];
    const int dev = dev_of(p, r, k), rm = r * p->M + m;
    exec_dev *d = &ex->devs[dev];
    pst_stream *s = d->compute;
    const int j = p->fwd_slot[at(p, 0, m, k)], rows = p->rows[rm];
    float *slot = slot_of(p, r, m, k);
    if (k > 0) { /* the previous chunk's output: a fixed shape, values only */
        const pipe_chunk *prev = &p->chunks[k - 1];
        pipe_dev *pd = &p->pd[dev];
        const float *src = slot_of(p, r, m, k - 1) + prev->out_off[prev->last - prev->first];
        PST_TRY(pst_stream_wait_event(pd->xfer, p->act_ev[at(p, r, m, k - 1)]));
        PST_TRY(pst_stream_wait_event(pd->xfer, pd->slot_free[j]));
        tr_span *in = exec_mark_begin(ex, pd->xfer, pd->tr_xfer, "activation in", step,
                                      span_arg(r, m, k));
        if (rows)
            PST_TRY(pst_memcpy_async(pd->xfer, slot + pc->in_off, src,
                                     sizeof(float) * (size_t)rows *
                                         (size_t)mo->layers[pc->first].in_width,
                                     PST_COPY_DEVICE_TO_DEVICE));
        exec_mark_end(pd->xfer, in);
        PST_TRY(pst_event_record(p->in_ev[at(p, r, m, k)], pd->xfer));
        PST_TRY(pst_stream_wait_event(s, p->in_ev[at(p, r, m, k)]));
        p->messages++;
    } else if (rows && mo->in_width > 0) {
        const size_t xrow = mo->in_tokens ? sizeof(int32_t) : sizeof(float);
        PST_TRY(pst_memcpy_async(s, slot + pc->in_off,
                                 (const char *)x + (size_t)p->lo[rm] * mo->in_width * xrow,
                                 xrow * (size_t)rows * (size_t)mo->in_width,
                                 PST_COPY_HOST_TO_DEVICE));
    }
    if (k == p->C - 1 && rows && y)
        PST_TRY(pst_memcpy_async(s, slot + pc->y_off, y + (size_t)p->lo[rm] * mo->target_width,
                                 sizeof(int32_t) * (size_t)rows * (size_t)mo->target_width,
                                 PST_COPY_HOST_TO_DEVICE));
    tr_span *sp = exec_mark_begin(ex, s, ex->tr_compute[dev], "forward", step,
                                  span_arg(r, m, k));
    for (int l = pc->first; rows && l <= pc->last; l++) {
        for (int q = ex->lay.layer_blocks0[l]; q < ex->lay.layer_blocks0[l + 1]; q++) {
            const int b = ex->lay.layer_blocks[q];
            exec_dev *src = ex->shared ? &ex->devs[ex->blocks[b].b->owner_device] : d;
            PST_TRY(pst_stream_wait_event(s, src->ready[b]));
        }
        PST_TRY(exec_enqueue_weights(ex, d, s, l));
        PST_TRY(mo->layers[l].cls->forward(p->pd[dev].inst[(size_t)m * ex->L + l], s, rows,
                                           scale));
    }
    exec_mark_end(s, sp);
    if (k == p->C - 1 && rows)
        PST_TRY(pst_memcpy_async(s, p->host_losses + p->lo[rm], slot + pc->loss_off,
                                 sizeof(float) * (size_t)rows, PST_COPY_DEVICE_TO_HOST));
    return pst_event_record(p->act_ev[at(p, r, m, k)], s);
}

/* Backward of micro-batch m on chunk k of replica r (instruction i of its device's
 * list), top layer first; its input gradient is copied into chunk k-1's slot of m. */
static pst_status enqueue_backward(tr_exec *ex, long step, int r, int m, int k, int i)
{
    exec_pipe *p = ex->pipe;
    const pst_model *mo = ex->model;
    const pipe_chunk *pc = &p->chunks[k];
    const int dev = dev_of(p, r, k);
    exec_dev *d = &ex->devs[dev];
    pipe_dev *pd = &p->pd[dev];
    pst_stream *s = d->compute;
    const int j = p->fwd_slot[at(p, 0, m, k)], rows = p->rows[r * p->M + m];
    if (k < p->C - 1)
        PST_TRY(pst_stream_wait_event(s, p->grad_ev[at(p, r, m, k)]));
    if (k > 0) /* the last input gradient has left gin */
        PST_TRY(pst_stream_wait_event(s, pd->gin_free));
    tr_span *sp = exec_mark_begin(ex, s, ex->tr_compute[dev], "backward", step,
                                  span_arg(r, m, k));
    for (int l = pc->last; rows && l >= pc->first; l--) {
        const pst_layer_class *cls = mo->layers[l].cls;
        const size_t ii = (size_t)m * ex->L + l;
        if (cls->wgrad || cls->igrad)
            PST_TRY(exec_enqueue_weights(ex, d, s, l));
        if (cls->wgrad)
            PST_TRY(cls->wgrad(pd->inst[ii], pd->wchunk[ii], s, rows, 0, 0));
        if (cls->igrad)
            PST_TRY(cls->igrad(pd->inst[ii], s, rows));
    }
    exec_mark_end(s, sp);
    PST_TRY(pst_event_record(pd->slot_free[j], s));
    if (k > 0) {
        const pipe_chunk *prev = &p->chunks[k - 1];
        float *dst = slot_of(p, r, m, k - 1) + prev->dout_off;
        const float *src = pc->first == ex->L - 1
                               ? slot_of(p, r, m, k) + pc->dlast_off /* the loss alone */
                               : pd->gin;
        PST_TRY(pst_event_record(p->gin_ev[at(p, r, m, k)], s));
        PST_TRY(pst_stream_wait_event(pd->xfer, p->gin_ev[at(p, r, m, k)]));
        tr_span *out = exec_mark_begin(ex, pd->xfer, pd->tr_xfer, "gradient out", step,
                                       span_arg(r, m, k));
        if (rows)
            PST_TRY(pst_memcpy_async(pd->xfer, dst, src,
                                     sizeof(float) * (size_t)rows *
                                         (size_t)mo->layers[pc->first].in_width,
                                     PST_COPY_DEVICE_TO_DEVICE));
        exec_mark_end(pd->xfer, out);
        p->messages++;
        PST_TRY(pst_event_record(p->grad_ev[at(p, r, m, k - 1)], pd->xfer));
        PST_TRY(pst_event_record(pd->gin_free, pd->xfer));
    }
    for (int b = 0; b < ex->plan->nblocks; b++)
        if (pd->blk_pos[b] == i)
            PST_TRY(pst_event_record(d->grad_done[b], s));
    for (int l = 0; l < ex->L; l++)
        if (pd->layer_pos[l] == i)
            PST_TRY(pst_event_record(d->x_done[l], s));
    return PST_OK;
}

pst_status exec_pipe_step(tr_exec *ex, long step, const void *x, const int32_t *y, int rows,
                          float scale)
{
    exec_pipe *p = ex->pipe;
    const int P = p->P, R = p->R, nb = ex->plan->nblocks;
    if (rows > p->M * R * p->mb)
        return pst_error_set(PST_ERR_INVALID, "pipeline: %d rows, at most %d", rows,
                             p->M * R * p->mb);
    /* Micro-batch m's rows, split over the replicas (as --acc-steps M splits them over a
     * trainer's devices without a pipeline): each replica adds its parts in m order, the
     * reduce adds the replicas in device order. */
    for (int m = 0; m < p->M; m++) {
        int mlo, mhi;
        pst_batch_part(rows, m, p->M, &mlo, &mhi);
        for (int r = 0; r < R; r++) {
            int lo, hi;
            pst_batch_part(mhi - mlo, r, R, &lo, &hi);
            p->lo[r * p->M + m] = mlo + lo;
            p->rows[r * p->M + m] = hi - lo;
        }
    }
    /* Every device's gradient starts at zero (the previous step's reduce has read it once
     * every block's ready event has passed); blocks and layers no chunk here touches are
     * final at once. */
    for (int s = 0; s < ex->D; s++) {
        exec_dev *d = &ex->devs[s];
        for (int b = 0; b < nb; b++) {
            exec_dev *src = ex->shared ? &ex->devs[ex->blocks[b].b->owner_device] : d;
            PST_TRY(pst_stream_wait_event(d->compute, src->ready[b]));
        }
        PST_TRY(pst_memset_async(d->compute, d->grads, 0, exec_held_elems(ex, s) * sizeof(float)));
        for (int b = 0; b < nb; b++)
            if (p->pd[s].blk_pos[b] < 0)
                PST_TRY(pst_event_record(d->grad_done[b], d->compute));
        for (int l = 0; l < ex->L; l++)
            if (p->pd[s].layer_pos[l] < 0)
                PST_TRY(pst_event_record(d->x_done[l], d->compute));
    }
    /* The lists (device s runs its stage's, s % P, for replica s / P), each in order; an
     * instruction waits (on the host) until what it depends on in another list has been
     * queued, so every event is recorded before it is waited on. */
    const size_t n = (size_t)R * (size_t)p->M * (size_t)p->C;
    memset(p->fwd_enq, 0, n);
    memset(p->bwd_enq, 0, n);
    int pos[PST_DEVICE_MAX_COUNT] = {0};
    for (int left = 1; left;) {
        int moved = 0;
        left = 0;
        for (int s = 0; s < ex->D; s++) {
            const int r = s / P, count = p->sched.count[s % P];
            for (; pos[s] < count; pos[s]++) {
                const tr_psched_instr *in = &p->sched.list[s % P][pos[s]];
                const int m = in->micro, k = in->chunk;
                if (in->op == TR_PSCHED_FORWARD) {
                    if (k > 0 && !p->fwd_enq[at(p, r, m, k - 1)])
                        break;
                    PST_TRY(enqueue_forward(ex, step, r, m, k, x, y, scale));
                    p->fwd_enq[at(p, r, m, k)] = 1;
                } else if (in->op == TR_PSCHED_BACKWARD) {
                    if (k < p->C - 1 && !p->bwd_enq[at(p, r, m, k + 1)])
                        break;
                    PST_TRY(enqueue_backward(ex, step, r, m, k, pos[s]));
                    p->bwd_enq[at(p, r, m, k)] = 1;
                } /* sends and receives: the copies and events above */
                moved = 1;
            }
            left |= pos[s] < count;
        }
        if (left && !moved)
            return pst_error_set(PST_ERR_INTERNAL, "pipeline: the %s schedule's lists wait "
                                 "on each other (P %d, M %d, V %d)",
                                 pst_schedule_name(ex->c.cfg.schedule), P, p->M, p->V);
    }
    return PST_OK;
}

/* The step's loss: the per-row losses the last chunk copied out, in row order (after the
 * compute streams are synchronized). */
double exec_pipe_loss(const tr_exec *ex, int rows)
{
    double sum = 0.0;
    for (int r = 0; r < rows; r++)
        sum += ex->pipe->host_losses[r];
    return sum;
}

/* ---- evaluation ----------------------------------------------------------------------- */

/* The forward alone over `rows` host rows with scale 0, chunk after chunk in micro-batch
 * 0's slots, a micro-batch at a time: losses (rows) and, when probs is not NULL, the loss
 * layer's probabilities (rows, target_width, nclasses) to host memory; *correct adds up. */
pst_status exec_pipe_forward(tr_exec *ex, const void *x, const int32_t *y, int rows,
                             float *losses, float *probs, long *correct)
{
    exec_pipe *p = ex->pipe;
    const pst_model *mo = ex->model;
    const pipe_chunk *lastc = &p->chunks[p->C - 1];
    pst_stream *ls = ex->devs[lastc->stage].compute;
    const size_t xrow = mo->in_tokens ? sizeof(int32_t) : sizeof(float);
    const size_t per_row = (size_t)mo->target_width * (size_t)mo->nclasses;
    int32_t hc = 0;
    *correct = 0;
    PST_TRY(pst_memset_async(ls, p->pd[lastc->stage].correct, 0, sizeof(int32_t)));
    for (int r0 = 0; r0 < rows; r0 += p->mb) {
        const int n = rows - r0 < p->mb ? rows - r0 : p->mb;
        for (int k = 0; k < p->C; k++) {
            const pipe_chunk *pc = &p->chunks[k];
            pst_stream *s = ex->devs[pc->stage].compute;
            float *slot = slot_of(p, 0, 0, k);
            if (k == 0) {
                PST_TRY(pst_memcpy_async(s, slot + pc->in_off,
                                         (const char *)x + (size_t)r0 * mo->in_width * xrow,
                                         xrow * (size_t)n * (size_t)mo->in_width,
                                         PST_COPY_HOST_TO_DEVICE));
            } else {
                const pipe_chunk *prev = &p->chunks[k - 1];
                PST_TRY(pst_stream_wait_event(s, p->eval_ev[k - 1]));
                PST_TRY(pst_memcpy_async(s, slot + pc->in_off,
                                         slot_of(p, 0, 0, k - 1) +
                                             prev->out_off[prev->last -
                                                                              prev->first],
                                         sizeof(float) * (size_t)n *
                                             (size_t)mo->layers[pc->first].in_width,
                                         PST_COPY_DEVICE_TO_DEVICE));
            }
            if (k == p->C - 1) {
                const size_t yb = sizeof(int32_t) * (size_t)n * (size_t)mo->target_width;
                PST_TRY(y ? pst_memcpy_async(s, slot + pc->y_off, y + (size_t)r0 *
                                             mo->target_width, yb, PST_COPY_HOST_TO_DEVICE)
                          : pst_memset_async(s, slot + pc->y_off, 0, yb));
            }
            for (int l = pc->first; l <= pc->last; l++) {
                PST_TRY(exec_enqueue_weights(ex, &ex->devs[pc->stage], s, l));
                PST_TRY(mo->layers[l].cls->forward(p->pd[pc->stage].inst[l], s, n, 0.0f));
            }
            PST_TRY(pst_event_record(p->eval_ev[k], s));
        }
        float *slot = slot_of(p, 0, 0, p->C - 1);
        PST_TRY(pst_memcpy_async(ls, losses + r0, slot + lastc->loss_off,
                                 sizeof(float) * (size_t)n, PST_COPY_DEVICE_TO_HOST));
        if (probs) {
            const pst_layer *top = &mo->layers[ex->L - 1];
            PST_TRY(pst_memcpy_async(ls, probs + (size_t)r0 * per_row,
                                     top->cls->probs(p->pd[lastc->stage].inst[ex->L - 1]),
                                     sizeof(float) * (size_t)n * per_row,
                                     PST_COPY_DEVICE_TO_HOST));
        }
        /* the next piece overwrites slot 0 everywhere: wait for this one */
        PST_TRY(pst_stream_synchronize(ls));
    }
    PST_TRY(pst_memcpy_async(ls, &hc, p->pd[lastc->stage].correct, sizeof(int32_t),
                             PST_COPY_DEVICE_TO_HOST));
    PST_TRY(pst_stream_synchronize(ls));
    *correct = hc;
    return PST_OK;
}
