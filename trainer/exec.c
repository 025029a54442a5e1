/* exec.c — the multi-device executor (see exec.h).
 *
 * DESIGN: everything a step touches is made at init: per device a model replica, three
 * streams (compute, send, recv), an event per layer ("its gradient is final") and per
 * block ("its new values are here"), the op argument structs; per block the pointer
 * arrays the collectives take (the optimizer state lives in the link's store).
 * A step only fills in row counts and queues work; the host waits for the compute
 * streams (to read the losses), never for the communication, unless overlap is off.
 * Hazards are closed by events alone: a block is reduced after every device recorded
 * its grad_done (see the weight-gradient chunks below); a device's next forward of layer l waits on
 * ready[b] of every block over l, and ready[b] comes after block b's reduce, push (its
 * payload released) and pull, so the next backward can never overwrite a gradient that is
 * still being read.
 * On CPU runtimes the devices share one set of parameters (device memory is host memory,
 * so a replica per device would only cost a copy per block per step): there is no
 * broadcast, and every device's forward waits on the owner's ready event. Training alone,
 * the in-process store updates that buffer in place (its master values ARE the buffer),
 * after every device's backward has stopped reading the block's weights (x_done).
 * Distributed, there are TWO buffers, by step parity: step s computes with one while its
 * pulls land in the other, so a pull starts with its push (at grad_done) instead of
 * waiting for backward to finish with the old weights; step s+1 computes with the new
 * buffer. With replicas (--cpu-replicas 1, and on GPUs) each new block lands in host
 * staging, is copied to the owner once backward stopped reading the old weights, and is
 * broadcast; the recv stream waits for it on a flag the exchange raises (device.h).
 * A layer's weight gradient is computed in chunks of rows cut at the block boundaries
 * (ascending), and each block's grad_done is recorded right after the chunk that finishes
 * it: a large layer's first blocks leave while the rest of its weight gradient is still
 * being computed (on a GPU host that is communication hidden behind compute; on CPU the
 * same). A block spanning two layers is finished by the lower layer, later in backward.
 * Training alone each layer is one chunk. */
#include "trainer/exec.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/runtime/collectives.h"
#include "common/log.h"
#include "common/nn/ops.h"
#include "common/pool.h"
#include "common/rng.h"
#include "trainer/exec_impl.h"

/* How long a lone device's team polls between runs (pst_pool_set_spin): longer than the
 * gaps inside a step (tens to a few hundred microseconds), far shorter than a step. */
#define EXEC_ALONE_SPIN_NS 500000L

static void cpu_set_of(const pst_config *cfg, cpu_set_t *set);

/* ---- trace marks ---------------------------------------------------------------------- */

static pst_status span_begin(void *arg)
{
    ((tr_span *)arg)->t0 = tr_trace_clock();
    return PST_OK;
}

static pst_status span_end(void *arg)
{
    ((tr_span *)arg)->t1 = tr_trace_clock();
    return PST_OK;
}

/* Opens a span on stream s when the step is traced; returns it for mark_end (or NULL). */
tr_span *exec_mark_begin(tr_exec *ex, pst_stream *s, int track, const char *name, long step,
                          long arg)
{
    if (!tr_trace_on(ex->c.trace, step))
        return NULL;
    tr_span *sp = tr_trace_add(ex->c.trace, track, name, step, arg);
    if (sp && pst_stream_launch(s, span_begin, sp) != PST_OK)
        return NULL;
    return sp;
}

void exec_mark_end(pst_stream *s, tr_span *sp)
{
    if (sp)
        pst_stream_launch(s, span_end, sp);
}

/* ---- init / free ---------------------------------------------------------------------- */

pst_status exec_alloc_dev(pst_device *dev, size_t bytes, void **p)
{
    return pst_device_alloc(dev, bytes ? bytes : 1, p);
}

/* ---- the update made during backward (training alone) -------------------------------- */

/* A linear layer's rows_done argument: where its weight and bias lie in the flat buffer. */
typedef struct exec_rows {
    tr_exec *ex;
    size_t w_off, b_off;
    int IC;
} exec_rows;

/* Hands elements [off, off + n) of the flat gradient to the link's update, cut at blocks. */
static void update_flat(tr_exec *ex, size_t off, size_t n)
{
    const tr_plan *p = ex->plan;
    int lo = 0, hi = p->nblocks - 1; /* the blocks tile the buffer in order: the last with
                                      * offset <= off */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p->blocks[mid].offset <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    const float *g = ex->devs[0].grads;
    for (int b = lo; n > 0 && b < p->nblocks; b++) {
        const tr_block *blk = &p->blocks[b];
        const size_t take = blk->offset + blk->length - off < n ? blk->offset + blk->length - off
                                                                  : n;
        /* An error (a NaN or infinity) is kept by the link and fails the block's exchange. */
        (void)ex->c.link->ops->update_slice(ex->c.link, b, off - blk->offset, take, g + off);
        off += take;
        n -= take;
    }
}

/* pst_layer_io.rows_done: rows [r0, r1) of a linear layer's weight gradient and their bias
 * entries are final: update them while they are in this thread's cache. */
static void rows_final(void *arg, int r0, int r1)
{
    const exec_rows *h = arg;
    update_flat(h->ex, h->w_off + (size_t)r0 * (size_t)h->IC, (size_t)(r1 - r0) * (size_t)h->IC);
    update_flat(h->ex, h->b_off + (size_t)r0, (size_t)(r1 - r0));
}

/* Training alone in fp32 on one CPU device (the update in place), the optimizer runs inside
 * backward: each tile of a linear layer's weight-gradient rows is updated by the thread
 * that computed it, while it is in that core's cache, instead of in a pass over the whole
 * gradient after it (which reads it back from memory). Then each layer computes its input
 * gradient before its weight gradient (the update changes the weights it reads), and the
 * block's exchange only completes the update. The same arithmetic on the same elements:
 * the same bits (tests: training alone equals one trainer with pservers). Only when every
 * layer with parameters has rows_updatable (linear: the MLP), one micro-batch, no pipeline, no loss scaling,
 * f32 gradients. */
static pst_status plan_sliced(tr_exec *ex, const tr_exec_config *c)
{
    const pst_model *m = ex->model;
    int ok = ex->in_place && ex->D == 1 && ex->K == 1 && c->cfg->pipeline <= 1 &&
             !ex->scaler && c->cfg->grad_dtype == PST_F32 && c->link->ops->update_slice &&
             ex->host_memory;
    for (int l = 0; ok && l < ex->L; l++)
        ok = !m->layers[l].ntensors ||
             (m->layers[l].cls->rows_updatable && m->layers[l].ntensors == 2);
    if (!ok)
        return PST_OK;
    ex->rows = calloc((size_t)ex->L, sizeof *ex->rows);
    if (!ex->rows)
        return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    for (int l = 0; l < ex->L; l++) {
        const pst_layer *ly = &m->layers[l];
        if (!ly->ntensors)
            continue;
        const pst_tensor *w = &m->tensors[ly->tensor[0]], *b = &m->tensors[ly->tensor[1]];
        ex->rows[l] = (exec_rows){ex, w->offset, b->offset, (int)w->shape[1]};
    }
    return PST_OK;
}

/* Points every layer instance of device d at its buffers: layer l reads layer l-1's
 * output (layer 0 the batch). Backward ping-pongs between dbuf[0] and dbuf[1], starting
 * from the loss layer's input gradient in dbuf[0]: layer l reads dout and writes din,
 * which becomes layer l-1's dout; layer 0's input gradient is not computed. */
static void bind_layers(tr_exec *ex, exec_dev *d)
{
    const pst_model *m = ex->model;
    for (int l = 0; l < ex->L; l++) {
        pst_layer_io io = {
            .pool = d->pool, .grads = d->grads, .accumulate = d->accumulate,
            .in = l ? d->acts[l - 1] : m->in_tokens ? NULL : d->x, .out = d->acts[l],
            .tokens = !l && m->in_tokens ? (const int32_t *)(const void *)d->x : NULL,
            .dout = l + 1 < ex->L ? d->dbuf[(ex->L - 2 - l) & 1] : NULL,
            .din = l ? d->dbuf[(ex->L - 1 - l) & 1] : NULL,
            .targets = d->y, .losses = d->losses, .correct = d->correct,
            .save = d->save[l], .work = d->work[l], .scratch = d->scratch[l],
            .max_batch = ex->max_batch,
            .rows_done = ex->rows && m->layers[l].ntensors ? rows_final : NULL,
            .rows_arg = ex->rows ? &ex->rows[l] : NULL};
        const pst_layer *ly = &m->layers[l];
        if (!ex->lowp) {
            pst_layer_io_point(&io, m, l, d->params);
        } else {
            /* The layer's tensors packed in wbuf, each cast there before the layer runs. */
            size_t at = 0;
            for (int k = 0; k < ly->ntensors; k++) {
                const pst_tensor *t = &m->tensors[ly->tensor[k]];
                io.w[k] = d->wbuf + at;
                d->casts[l * PST_LAYER_MAX_TENSORS + k] = (pst_cast_args){
                    .dst = d->wbuf + at, .dt = PST_F32,
                    .src = (const char *)d->params + t->offset * ex->psize, .st = ex->pdt,
                    .n = t->numel, .pool = d->pool};
                at += t->numel;
            }
        }
        ly->cls->bind(d->inst[l], m, l, &io);
    }
}

/* bf16/fp16: queues on s the casts of layer l's tensors into the device's fp32 scratch
 * (before its forward, and again before its backward: the other layers used the scratch
 * in between). One cast per tensor per use: the trainer keeps no fp32 copy. */
static pst_status enqueue_weights(tr_exec *ex, exec_dev *d, pst_stream *s, int l)
{
    const pst_layer *ly = &ex->model->layers[l];
    if (!ex->lowp || ly->cls->weights_unread)
        return PST_OK;
    for (int k = 0; k < ly->ntensors; k++)
        PST_TRY(pst_op_cast(s, &d->casts[l * PST_LAYER_MAX_TENSORS + k]));
    return PST_OK;
}

/* Whether block b's parameters that layer ly names all lie in its first tensor, and where
 * they end there (one past the last element, relative to the tensor). */
static int block_in_first_tensor(const pst_model *m, const pst_layer *ly, const tr_block *blk,
                                 size_t *end)
{
    const size_t lo = blk->offset, hi = blk->offset + blk->length;
    for (int k = 1; k < ly->ntensors; k++) {
        const pst_tensor *t = &m->tensors[ly->tensor[k]];
        if (lo < t->offset + t->numel && hi > t->offset)
            return 0;
    }
    const pst_tensor *t0 = &m->tensors[ly->tensor[0]];
    *end = (hi < t0->offset + t0->numel ? hi : t0->offset + t0->numel) - t0->offset;
    return 1;
}

/* Cuts every layer's weight gradient at the blocks it finishes (see DESIGN). A block is
 * finished by its lowest layer lmin: by the chunk holding its last element in that layer's
 * first tensor, or by the layer's last chunk when it reaches into another of the layer's
 * tensors (every chunk adds its rows' share of those). Cuts are rounded up to whole tiles
 * (the layer's split_tile: a linear layer's GEMM bits must not depend on where the plan
 * cut the blocks). A block's cut is at least row 1, and the cuts of a layer's blocks ascend
 * with the blocks; a block whose cut equals the previous one is finished by the same chunk.
 * Training alone nothing is sent early (the in-place update waits for the layer's x_done
 * anyway) and smaller GEMMs only cost speed, so each layer is one chunk. */
static pst_status build_chunks(tr_exec *ex)
{
    const pst_model *m = ex->model;
    const int nb = ex->plan->nblocks, cut_at_blocks = !ex->c.link->in_process;
    ex->chunks = calloc((size_t)nb + (size_t)ex->L, sizeof *ex->chunks);
    ex->layer_chunk0 = calloc((size_t)ex->L + 1, sizeof(int));
    ex->chunk_blocks = calloc((size_t)nb, sizeof(int));
    if (!ex->chunks || !ex->layer_chunk0 || !ex->chunk_blocks)
        return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    int nlisted = 0; /* every block is listed by exactly one chunk: its lowest layer's */
    for (int l = 0; l < ex->L; l++) {
        const pst_layer *ly = &m->layers[l];
        ex->layer_chunk0[l] = ex->nchunks;
        if (!ly->ntensors)
            continue;
        const int R = ly->split_rows, blk0 = nlisted;
        int row0 = 0;
        /* Blocks whose lowest layer is l, ascending: their cut rows ascend too. */
        for (int b = 0; b < nb; b++) {
            if (ex->blocks[b].lmin != l)
                continue;
            if (!R || !cut_at_blocks) { /* one chunk finishes them all */
                ex->chunk_blocks[nlisted++] = b;
                continue;
            }
            const pst_tensor *t0 = &m->tensors[ly->tensor[0]];
            const size_t row_len = t0->numel / (size_t)R;
            size_t end;
            int cut = block_in_first_tensor(m, ly, &ex->plan->blocks[b], &end)
                          ? (int)((end + row_len - 1) / row_len)
                          : R;
            cut = (cut + ly->split_tile - 1) / ly->split_tile * ly->split_tile;
            cut = cut < R ? cut : R;
            ex->chunk_blocks[nlisted++] = b;
            if (cut <= row0) { /* row0 > 0: a chunk of this layer is already cut there */
                ex->chunks[ex->nchunks - 1].nblk++;
                continue;
            }
            ex->chunks[ex->nchunks++] = (exec_chunk){l, row0, cut, nlisted - 1, 1};
            row0 = cut;
        }
        if (!R || !cut_at_blocks)
            ex->chunks[ex->nchunks++] = (exec_chunk){l, 0, R, blk0, nlisted - blk0};
        else if (row0 < R) /* rows after the last block that ends in this layer */
            ex->chunks[ex->nchunks++] = (exec_chunk){l, row0, R, nlisted, 0};
    }
    ex->layer_chunk0[ex->L] = ex->nchunks;
    if (!(ex->send_order = malloc(sizeof(int) * (size_t)(nb ? nb : 1))))
        return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    for (int l = ex->L - 1, i = 0; l >= 0; l--)
        for (int c = ex->layer_chunk0[l]; c < ex->layer_chunk0[l + 1]; c++)
            for (int k = 0; k < ex->chunks[c].nblk; k++)
                ex->send_order[i++] = ex->chunk_blocks[ex->chunks[c].blk0 + k];
    if (nlisted != nb) /* every block has a lowest layer (tr_exec_init checked it) */
        return pst_error_set(PST_ERR_INTERNAL, "executor: %d of %d blocks in chunks", nlisted,
                             nb);
    for (int i = 0; i < ex->D; i++) {
        exec_dev *d = &ex->devs[i];
        d->chunk = calloc((size_t)ex->nchunks, sizeof *d->chunk);
        if (!d->chunk)
            return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
        for (int c = 0; c < ex->nchunks; c++) {
            size_t bytes = m->layers[ex->chunks[c].layer].cls->chunk_bytes;
            if (bytes && !(d->chunk[c] = calloc(1, bytes)))
                return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
        }
    }
    return PST_OK;
}

/* Points every replica at the newest parameters (two buffers: pbuf[cur]). */
static void use_newest_params(tr_exec *ex)
{
    if (!ex->pbuf[1])
        return;
    for (int i = 0; i < ex->D; i++) {
        ex->devs[i].params = ex->pbuf[ex->cur];
        if (!ex->pipe)
            bind_layers(ex, &ex->devs[i]);
    }
    if (ex->pipe)
        exec_pipe_bind(ex);
}

/* Allocates device d's buffers: the flat parameters (unless shared with device 0) and
 * gradients, the activations, the batch and the layer instances. */
static pst_status alloc_replica(tr_exec *ex, exec_dev *d, int share_params)
{
    const pst_model *m = ex->model;
    const size_t B = (size_t)ex->max_batch, n = m->nparams;
    int widest = 1;
    for (int l = 0; l < ex->L; l++)
        widest = m->layers[l].in_width > widest ? m->layers[l].in_width : widest;
    d->acts = calloc((size_t)ex->L, sizeof *d->acts);
    d->inst = calloc((size_t)ex->L, sizeof *d->inst);
    d->save = calloc((size_t)ex->L, sizeof *d->save);
    d->work = calloc((size_t)ex->L, sizeof *d->work);
    d->scratch = calloc((size_t)ex->L, sizeof *d->scratch);
    if (!d->acts || !d->inst || !d->save || !d->work || !d->scratch)
        return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    if (share_params)
        d->params = ex->devs[0].params; /* not freed through this device */
    else
        PST_TRY(exec_alloc_dev(d->dev, ex->psize * n, &d->params));
    if (ex->lowp) {
        PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * ex->wbuf_floats, (void **)&d->wbuf));
        if (!(d->casts = calloc((size_t)ex->L * PST_LAYER_MAX_TENSORS, sizeof *d->casts)))
            return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    }
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * n, (void **)&d->grads));
    if (ex->c.cfg->pipeline > 1)
        return PST_OK; /* activations and layer instances: per slot (exec_pipe.c) */
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B * (size_t)widest, (void **)&d->dbuf[0]));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B * (size_t)widest, (void **)&d->dbuf[1]));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B * (size_t)m->in_width, (void **)&d->x));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(int32_t) * B * (size_t)m->target_width, (void **)&d->y));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B, (void **)&d->losses));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(int32_t), (void **)&d->correct));
    for (int l = 0; l < ex->L; l++) {
        const pst_layer *ly = &m->layers[l];
        if (ly->out_width > 0)
            PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B * (size_t)ly->out_width,
                              (void **)&d->acts[l]));
        if (ly->save_width > 0)
            PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B * (size_t)ly->save_width,
                              (void **)&d->save[l]));
        if (ly->work_width > 0)
            PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B * (size_t)ly->work_width,
                              (void **)&d->work[l]));
        if (ly->scratch_per_thread > 0) {
            const size_t threads = d->pool ? (size_t)pst_pool_size(d->pool) : 1;
            PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * threads * (size_t)ly->scratch_per_thread,
                              (void **)&d->scratch[l]));
        }
        if (!(d->inst[l] = calloc(1, ly->cls->inst_bytes ? ly->cls->inst_bytes : 1)))
            return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    }
    return PST_OK;
}

pst_status tr_exec_init(tr_exec **out, const tr_exec_config *c)
{
    *out = NULL;
    pst_status st;
    tr_exec *ex = calloc(1, sizeof *ex);
    if (!ex)
        return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    ex->c = *c;
    ex->model = c->model;
    if (c->cfg->compute_cpus[0]) {
        ex->pin_compute = 1;
        cpu_set_of(c->cfg, &ex->compute_cpus);
    }
    ex->D = pst_runtime_count(c->rt);
    ex->L = c->model->nlayers;
    ex->host_memory = pst_runtime_host_memory(c->rt);
    ex->shared = ex->host_memory && !c->cfg->cpu_replicas;
    ex->pdt = c->cfg->precision;
    ex->psize = pst_dtype_size(ex->pdt);
    ex->lowp = ex->pdt != PST_F32;
    ex->K = c->cfg->acc_steps > 0 ? c->cfg->acc_steps : 1;
    ex->scaler = ex->pdt == PST_F16;
    ex->loss_scale = ex->scaler ? c->cfg->loss_scale : 1.0f;
    /* In place only on the shared CPU copy in fp32: with replicas (--cpu-replicas 1, as on
     * GPUs) the new values go through host staging, are copied to the owner and broadcast;
     * in bf16/fp16 the store's master is fp32 and the devices hold its low-precision copy. */
    ex->direct = c->link->in_process && ex->shared;
    ex->in_place = ex->direct && !ex->lowp;
    if ((st = plan_sliced(ex, c)) != PST_OK) {
        free(ex);
        return st;
    }
    ex->wbuf_floats = 1;
    for (int l = 0; ex->lowp && l < ex->L; l++) {
        const pst_layer *ly = &c->model->layers[l];
        size_t numel = 0;
        for (int k = 0; k < ly->ntensors; k++)
            numel += c->model->tensors[ly->tensor[k]].numel;
        if (!ly->cls->weights_unread && numel > ex->wbuf_floats)
            ex->wbuf_floats = numel;
    }
    if (ex->D > PST_DEVICE_MAX_COUNT) {
        int D = ex->D;
        free(ex);
        return pst_error_set(PST_ERR_INVALID, "executor: %d devices, at most %d", D,
                             PST_DEVICE_MAX_COUNT);
    }
    const int per_micro = (c->max_rows + ex->K - 1) / ex->K; /* rows of one micro-batch */
    int per_dev = (per_micro + ex->D - 1) / ex->D;
    ex->max_batch = per_dev > c->eval_rows ? per_dev : c->eval_rows;
    if (c->cfg->pipeline > 1) /* the evaluation's bound; a step's rows go through slots */
        ex->max_batch = c->eval_rows > 0 ? c->eval_rows : 1;
    ex->devs = calloc((size_t)ex->D, sizeof *ex->devs);
    ex->send_streams = calloc((size_t)ex->D, sizeof *ex->send_streams);
    ex->recv_streams = calloc((size_t)ex->D, sizeof *ex->recv_streams);
    if (!ex->devs || !ex->send_streams || !ex->recv_streams) {
        st = pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
        goto error;
    }
    for (int i = 0; i < ex->D; i++) {
        exec_dev *d = &ex->devs[i];
        d->ex = ex;
        d->dev = pst_runtime_device(c->rt, i);
        /* CPU devices split each layer and the optimizer over a team of their own threads
         * (OpenBLAS itself runs single-threaded, see train.c). */
        if (ex->host_memory &&
            (st = pst_pool_init(&d->pool, c->threads > 0 ? c->threads : 1)) != PST_OK)
            goto error;
        /* Training alone on one device, the team has the cores to itself: its workers poll
         * through the gaps between a step's runs (the single-threaded ops, the batch's
         * gathering) instead of sleeping and paying a futex wake-up at the next run (about
         * 4% more samples/s on the MLP bench). With pservers, or devices sharing the cores,
         * polling would take them from the communication or the other devices. */
        if (d->pool && c->link->in_process && ex->D == 1)
            pst_pool_set_spin(d->pool, EXEC_ALONE_SPIN_NS);
        if ((st = alloc_replica(ex, d, ex->shared && i > 0)) != PST_OK ||
            (st = pst_stream_create(d->dev, &d->compute)) != PST_OK ||
            (st = pst_stream_create(d->dev, &d->send)) != PST_OK ||
            (st = pst_stream_create(d->dev, &d->recv)) != PST_OK)
            goto error;
        ex->send_streams[i] = d->send;
        ex->recv_streams[i] = d->recv;
        d->x_done = calloc((size_t)ex->L, sizeof *d->x_done);
        if (!d->x_done) {
            st = pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
            goto error;
        }
        for (int l = 0; l < ex->L; l++)
            if ((st = pst_event_create(d->dev, &d->x_done[l])) != PST_OK)
                goto error;
        if (c->cfg->pipeline <= 1)
            bind_layers(ex, d);
    }
    size_t n = ex->model->nparams;
    ex->pbuf[0] = ex->devs[0].params;
    if (ex->shared && !ex->direct &&
        (st = exec_alloc_dev(ex->devs[0].dev, ex->psize * n, &ex->pbuf[1])) != PST_OK)
        goto error;
    ex->plan = c->link->plan;
    if (ex->plan->nparams != n || ex->plan->ndevices != ex->D) {
        st = pst_error_set(PST_ERR_INTERNAL, "executor: plan for %zu params on %d devices, "
                           "model has %zu on %d", ex->plan->nparams, ex->plan->ndevices, n, ex->D);
        goto error;
    }
    if ((st = pst_comm_init(&ex->reduce_comm, c->rt)) != PST_OK ||
        (st = pst_comm_init(&ex->bcast_comm, c->rt)) != PST_OK)
        goto error;

    const int nb = ex->plan->nblocks;
    ex->blocks = calloc((size_t)nb, sizeof *ex->blocks);
    ex->homes = calloc((size_t)nb, sizeof *ex->homes);
    ex->layer_blocks = calloc((size_t)ex->L * (size_t)nb, sizeof(int));
    ex->layer_blocks0 = calloc((size_t)ex->L + 1, sizeof(int));
    ex->host_params = malloc(sizeof(float) * n);
    ex->host_lowp = ex->lowp ? malloc(ex->psize * n) : NULL;
    ex->host_losses = malloc(sizeof(float) * (size_t)ex->max_batch);
    if (!ex->blocks || !ex->homes || !ex->layer_blocks || !ex->layer_blocks0 || !ex->host_params ||
        !ex->host_losses || (ex->lowp && !ex->host_lowp)) {
        st = pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
        goto error;
    }
    for (int i = 0; i < ex->D; i++) {
        exec_dev *d = &ex->devs[i];
        d->ready = calloc((size_t)nb, sizeof *d->ready);
        d->grad_done = calloc((size_t)nb, sizeof *d->grad_done);
        if (!d->ready || !d->grad_done) {
            st = pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
            goto error;
        }
        for (int b = 0; b < nb; b++)
            if ((st = pst_event_create(d->dev, &d->ready[b])) != PST_OK ||
                (st = pst_event_create(d->dev, &d->grad_done[b])) != PST_OK)
                goto error;
    }
    /* Which blocks each layer reads, and each block's lowest layer. */
    for (int b = 0; b < nb; b++)
        ex->blocks[b].lmin = -1;
    for (int l = 0, k = 0; l < ex->L; l++) {
        const pst_layer *ly = &ex->model->layers[l];
        ex->layer_blocks0[l] = k;
        for (int b = 0; b < nb; b++) {
            const tr_block *blk = &ex->plan->blocks[b];
            int reads = 0;
            for (int t = 0; t < ly->ntensors && !reads; t++) {
                const pst_tensor *ts = &ex->model->tensors[ly->tensor[t]];
                reads = blk->offset < ts->offset + ts->numel && blk->offset + blk->length > ts->offset;
            }
            if (!reads)
                continue;
            ex->layer_blocks[k++] = b;
            if (ex->blocks[b].lmin < 0)
                ex->blocks[b].lmin = l;
        }
        ex->layer_blocks0[l + 1] = k;
    }
    for (int b = 0; b < nb; b++)
        if (ex->blocks[b].lmin < 0) { /* pst_model_check rules this out */
            st = pst_error_set(PST_ERR_INTERNAL, "executor: no layer of model %s reads block "
                               "%d", ex->model->name, b);
            goto error;
        }
    for (int b = 0; b < nb; b++) {
        exec_block *eb = &ex->blocks[b];
        eb->ex = ex;
        eb->index = b;
        eb->b = &ex->plan->blocks[b];
        pst_rng_seed(&eb->jitter, c->hooks ? c->hooks->jitter_seed : 0, 7000 + (uint64_t)b);
        eb->gbufs = calloc((size_t)ex->D, sizeof(float *));
        eb->pbufs = calloc((size_t)ex->D, sizeof(void *));
        if (!eb->gbufs || !eb->pbufs) {
            st = pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
            goto error;
        }
        for (int i = 0; i < ex->D; i++) {
            eb->gbufs[i] = ex->devs[i].grads + eb->b->offset;
            eb->pbufs[i] = (char *)ex->devs[i].params + eb->b->offset * ex->psize;
        }
        exec_dev *owner = &ex->devs[eb->b->owner_device];
        if ((st = pst_event_create(owner->dev, &eb->sent)) != PST_OK ||
            (st = pst_flag_create(owner->dev, &eb->landed)) != PST_OK)
            goto error;
        ex->homes[b] = ex->lowp ? NULL : (float *)eb->pbufs[eb->b->owner_device];
        if (!ex->shared) {
            /* Pulls land in host staging (unless the update is made in place): a pull may
             * come back while backward still reads the block's weights (dinp), so it is
             * copied in only after that. Pushes are sent straight from device memory when
             * the host can read it. */
            if ((!ex->host_memory &&
                 (st = pst_device_alloc_host(owner->dev, sizeof(float) * eb->b->length,
                                             (void **)&eb->hgrad)) != PST_OK) ||
                (!ex->in_place &&
                 (st = pst_device_alloc_host(owner->dev, ex->psize * eb->b->length,
                                             &eb->hparam)) != PST_OK))
                goto error;
        }
    }
    if ((st = build_chunks(ex)) != PST_OK)
        goto error;
    if (c->cfg->pipeline > 1 && (st = exec_pipe_init(ex)) != PST_OK)
        goto error;
    if (c->hooks && c->hooks->jitter_us)
        pst_runtime_set_jitter(c->rt, c->hooks->jitter_seed, c->hooks->jitter_us);
    if (c->trace) {
        char name[48];
        for (int i = 0; i < ex->D; i++) {
            const char *dn = pst_device_name(ex->devs[i].dev);
            snprintf(name, sizeof name, "%s compute", dn);
            ex->tr_compute[i] = tr_trace_track(c->trace, name);
            snprintf(name, sizeof name, "%s send (reduce, %s)", dn,
                     c->link->in_process ? "update" : "push");
            ex->tr_send[i] = tr_trace_track(c->trace, name);
            snprintf(name, sizeof name, "%s recv (pull, broadcast)", dn);
            ex->tr_recv[i] = tr_trace_track(c->trace, name);
        }
        ex->tr_push = tr_trace_track(c->trace, "rpc push");
        ex->tr_pull = tr_trace_track(c->trace, "rpc pull");
    }
    *out = ex;
    return PST_OK;
error:
    tr_exec_free(ex);
    return st;
}

void tr_exec_free(tr_exec *ex)
{
    if (!ex)
        return;
    if (ex->devs)
        tr_exec_sync(ex);
    /* After a failure the streams are done but an exchange may still be in flight (its
     * push or pull answers later, at the latest at its RPC deadline): its done callback
     * signals a block's flag, so everything waits for it. */
    while (atomic_load(&ex->exchanges) > 0)
        usleep(1000);
    exec_pipe_free(ex);
    for (int b = 0; ex->blocks && b < ex->plan->nblocks; b++) {
        exec_block *eb = &ex->blocks[b];
        pst_device *owner = ex->devs[eb->b->owner_device].dev;
        pst_event_destroy(eb->sent);
        pst_device_free_host(owner, eb->hgrad);
        pst_device_free_host(owner, eb->hparam);
        free(eb->gbufs);
        free(eb->pbufs);
        pst_flag_destroy(eb->landed);
    }
    for (int i = 0; ex->devs && i < ex->D; i++) {
        exec_dev *d = &ex->devs[i];
        pst_stream_destroy(d->compute);
        pst_stream_destroy(d->send);
        pst_stream_destroy(d->recv);
        for (int l = 0; d->x_done && l < ex->L; l++)
            pst_event_destroy(d->x_done[l]);
        free(d->x_done);
        for (int b = 0; d->ready && ex->plan && b < ex->plan->nblocks; b++)
            pst_event_destroy(d->ready[b]);
        for (int b = 0; d->grad_done && ex->plan && b < ex->plan->nblocks; b++)
            pst_event_destroy(d->grad_done[b]);
        for (int c = 0; d->chunk && c < ex->nchunks; c++)
            free(d->chunk[c]);
        free(d->chunk);
        for (int l = 0; d->inst && l < ex->L; l++)
            free(d->inst[l]);
        free(d->inst);
        free(d->grad_done);
        free(d->ready);
        if (d->dev) {
            pst_device_free(d->dev, d->x);
            pst_device_free(d->dev, d->y);
            pst_device_free(d->dev, d->losses);
            pst_device_free(d->dev, d->correct);
            /* shared: device 0 owns pbuf[0] (params may point at pbuf[1] by now) */
            void *own = !ex->shared ? d->params : i ? NULL : ex->pbuf[0] ? ex->pbuf[0] : d->params;
            pst_device_free(d->dev, own);
            pst_device_free(d->dev, d->grads);
            pst_device_free(d->dev, d->wbuf);
            pst_device_free(d->dev, d->dbuf[0]);
            pst_device_free(d->dev, d->dbuf[1]);
            for (int l = 0; d->save && d->work && d->scratch && l < ex->L; l++) {
                pst_device_free(d->dev, d->save[l]);
                pst_device_free(d->dev, d->work[l]);
                pst_device_free(d->dev, d->scratch[l]);
            }
            for (int l = 0; d->acts && l < ex->L; l++)
                pst_device_free(d->dev, d->acts[l]);
        }
        free(d->casts);
        free(d->acts);
        free(d->save);
        free(d->work);
        free(d->scratch);
        pst_pool_free(d->pool);
    }
    if (ex->pbuf[1])
        pst_device_free(ex->devs[0].dev, ex->pbuf[1]);
    pst_comm_free(ex->reduce_comm);
    pst_comm_free(ex->bcast_comm);
    free(ex->homes);
    free(ex->blocks);
    free(ex->chunk_blocks);
    free(ex->send_order);
    free(ex->layer_blocks);
    free(ex->layer_blocks0);
    free(ex->chunks);
    free(ex->rows);
    free(ex->layer_chunk0);
    free(ex->host_params);
    free(ex->host_lowp);
    free(ex->host_losses);
    free(ex->devs);
    free(ex->send_streams);
    free(ex->recv_streams);
    free(ex);
}

size_t tr_exec_nparams(const tr_exec *ex)
{
    return ex->model->nparams;
}

size_t tr_exec_peak_bytes(const tr_exec *ex, int device)
{
    return device >= 0 && device < ex->D ? pst_device_peak_bytes(ex->devs[device].dev) : 0;
}

void tr_exec_time_counters(tr_exec *ex, double *compute_busy, double *held_max)
{
    double busy = -1.0, held = 0.0;
    for (int i = 0; i < ex->D; i++) {
        const double b = pst_stream_busy_seconds(ex->devs[i].compute);
        busy = b > busy ? b : busy;
    }
    if (ex->c.link->ops->take_held)
        held = ex->c.link->ops->take_held(ex->c.link);
    *compute_busy = busy;
    *held_max = held;
}

pst_status tr_exec_sync(tr_exec *ex)
{
    pst_status first = PST_OK;
    char detail[512] = "";
    for (int i = 0; i < ex->D; i++) {
        pst_stream *ss[3] = {ex->devs[i].compute, ex->devs[i].send, ex->devs[i].recv};
        for (int k = 0; k < 3; k++) {
            pst_status st = ss[k] ? pst_stream_synchronize(ss[k]) : PST_OK;
            if (st != PST_OK && first == PST_OK) {
                first = st;
                snprintf(detail, sizeof detail, "%s", pst_error_detail());
            }
        }
    }
    if (first != PST_OK)
        pst_error_set(first, "%s", detail);
    return first;
}

/* ---- start ---------------------------------------------------------------------------- */

/* --compute-cpus as the config parsed it into a CPU set. */
static void cpu_set_of(const pst_config *cfg, cpu_set_t *set)
{
    CPU_ZERO(set);
    for (int c = 0; c < PST_CPU_MASK_WORDS * 64 && c < CPU_SETSIZE; c++)
        if (cfg->compute_cpu_mask[c / 64] >> (c % 64) & 1)
            CPU_SET(c, set);
}

static void pin_part(void *arg, int part, int nparts)
{
    (void)part;
    (void)nparts;
    tr_exec *ex = arg;
    /* The same set already succeeded on the compute thread (pin_compute), in the same
     * process: it cannot fail here for want of a usable CPU. */
    pthread_setaffinity_np(pthread_self(), sizeof ex->compute_cpus, &ex->compute_cpus);
}

/* On a compute stream: pins its worker thread and its device's thread team. */
static pst_status pin_compute(void *arg)
{
    exec_dev *d = arg;
    tr_exec *ex = d->ex;
    int rc = pthread_setaffinity_np(pthread_self(), sizeof ex->compute_cpus, &ex->compute_cpus);
    if (rc != 0)
        return pst_error_set(PST_ERR_INVALID, "--compute-cpus=%s: cannot pin the compute "
                             "threads there (%s); name CPUs this process may use (see "
                             "taskset -p %d)", ex->c.cfg->compute_cpus, strerror(rc),
                             (int)getpid());
    pst_pool_run(d->pool, pin_part, ex);
    return PST_OK;
}

pst_status tr_exec_start(tr_exec *ex, uint64_t seed)
{
    size_t n = tr_exec_nparams(ex);
    if (ex->pin_compute && ex->host_memory) /* CPU devices: a GPU computes on the GPU */
        for (int i = 0; i < ex->D; i++)
            PST_TRY(pst_stream_launch(ex->devs[i].compute, pin_compute, &ex->devs[i]));
    ex->model->init_params(ex->model, ex->host_params, seed);
    PST_TRY(ex->c.link->ops->start(ex->c.link, ex->host_params, ex->in_place ? ex->homes : NULL,
                                   ex->devs[0].pool));
    ex->applied = ex->c.link->start_version; /* a resumed job's updates so far */
    if (ex->c.link->has_start_state) { /* and where the trainers stood then */
        const tr_resume_state *rs = &ex->c.link->start_state;
        ex->skipped = rs->skipped;
        if (ex->scaler) { /* (fp16 is sync only: an async resume has no scaler state) */
            ex->loss_scale = rs->loss_scale;
            ex->good_steps = rs->good_steps;
        }
    }
    const void *src = ex->host_params;
    if (ex->lowp) { /* the devices start from the master's low-precision copy */
        pst_cast(ex->host_lowp, ex->pdt, ex->host_params, PST_F32, n);
        src = ex->host_lowp;
    }
    for (int i = 0; i < (ex->shared ? 1 : ex->D); i++)
        PST_TRY(pst_memcpy_async(ex->devs[i].compute, ex->devs[i].params, src, n * ex->psize,
                                 PST_COPY_HOST_TO_DEVICE));
    return tr_exec_sync(ex);
}

/* ---- the step ------------------------------------------------------------------------- */

/* Queues forward and backward of micro-batch `micro` of the step on device d. */
static pst_status enqueue_compute(tr_exec *ex, exec_dev *d, long step, int micro, float scale)
{
    pst_stream *s = d->compute;
    if (d->rows == 0 && micro > 0)
        return PST_OK; /* the gradient so far stands */
    if (d->rows == 0) {
        /* No rows here this step: a zero gradient still takes part in the reduce. The
         * previous step's reduce may still read this device's gradient; every block's
         * ready event comes after its reduce, so wait for all of them first. */
        for (int b = 0; b < ex->plan->nblocks; b++) {
            exec_dev *src = ex->shared ? &ex->devs[ex->blocks[b].b->owner_device] : d;
            PST_TRY(pst_stream_wait_event(s, src->ready[b]));
        }
        PST_TRY(pst_memset_async(s, d->grads, 0, ex->model->nparams * sizeof(float)));
        for (int b = 0; b < ex->plan->nblocks; b++)
            PST_TRY(pst_event_record(d->grad_done[b], s));
        for (int l = 0; l < ex->L; l++)
            PST_TRY(pst_event_record(d->x_done[l], s));
        return PST_OK;
    }
    int di = (int)(d - ex->devs);
    const pst_layer *layers = ex->model->layers;
    for (int l = 0; l < ex->L; l++) {
        for (int k = ex->layer_blocks0[l]; k < ex->layer_blocks0[l + 1]; k++) {
            const int b = ex->layer_blocks[k];
            exec_dev *src = ex->shared ? &ex->devs[ex->blocks[b].b->owner_device] : d;
            PST_TRY(pst_stream_wait_event(s, src->ready[b]));
        }
        tr_span *sp = exec_mark_begin(ex, s, ex->tr_compute[di], "forward", step, l);
        PST_TRY(enqueue_weights(ex, d, s, l));
        PST_TRY(layers[l].cls->forward(d->inst[l], s, d->rows, scale));
        exec_mark_end(s, sp);
    }
    for (int l = ex->L - 1; l >= 0; l--) {
        const pst_layer_class *cls = layers[l].cls;
        tr_span *sp = cls->wgrad || cls->igrad
                          ? exec_mark_begin(ex, s, ex->tr_compute[di], "backward", step, l)
                          : NULL;
        if (l < ex->L - 1) /* the top layer's weights are still in the scratch */
            PST_TRY(enqueue_weights(ex, d, s, l));
        /* The weight gradient first, chunk by chunk: each block leaves as soon as its rows
         * are done, while the rest of the layer (and its input gradient) is still being
         * computed. Updated during backward (ex->rows), the input gradient comes first:
         * it reads the weights the update changes. x_done: the layer's weights are read. */
        const int igrad_first = ex->rows && cls->igrad;
        if (igrad_first) {
            PST_TRY(cls->igrad(d->inst[l], s, d->rows));
            PST_TRY(pst_event_record(d->x_done[l], s));
        }
        for (int c = ex->layer_chunk0[l]; c < ex->layer_chunk0[l + 1]; c++) {
            PST_TRY(cls->wgrad(d->inst[l], d->chunk[c], s, d->rows, ex->chunks[c].row0,
                               ex->chunks[c].row1));
            const int *done = ex->chunk_blocks + ex->chunks[c].blk0;
            for (int k = 0; k < ex->chunks[c].nblk; k++)
                PST_TRY(pst_event_record(d->grad_done[done[k]], s));
        }
        if (!igrad_first) {
            if (cls->igrad)
                PST_TRY(cls->igrad(d->inst[l], s, d->rows));
            PST_TRY(pst_event_record(d->x_done[l], s));
        }
        exec_mark_end(s, sp);
    }
    return PST_OK;
}

static void exchange_done(void *arg, pst_status st, const char *detail)
{
    exec_block *eb = arg;
    tr_exec *ex = eb->ex;
    if (tr_trace_on(ex->c.trace, eb->step)) {
        tr_exchange_times t;
        ex->c.link->ops->times(ex->c.link, eb->index, &t);
        tr_span *p = tr_trace_add(ex->c.trace, ex->tr_push, "push", eb->step, eb->index);
        if (p) {
            p->t0 = t.push_start;
            p->t1 = t.push_end;
        }
        tr_span *q = tr_trace_add(ex->c.trace, ex->tr_pull, "pull", eb->step, eb->index);
        if (q) {
            q->t0 = t.pull_start;
            q->t1 = t.pull_end;
        }
        /* what of the pull the pserver spent waiting for the other trainers' pushes and
         * the update (its clock is not ours: placed from the pull's start) */
        tr_span *h = t.held > 0 ? tr_trace_add(ex->c.trace, ex->tr_pull, "held", eb->step,
                                               eb->index) : NULL;
        if (h) {
            h->t0 = t.pull_start;
            h->t1 = t.pull_start + t.held;
        }
    }
    /* The recv stream waits on the flag, not in a host function: on CUDA that would hold
     * the driver's one callback thread and stall every stream's host functions. */
    pst_flag_signal(eb->landed, (uint64_t)eb->step + 1, st, detail);
    atomic_fetch_sub(&ex->exchanges, 1); /* last: ex may be freed right after */
}

/* On the owner's send stream, after the reduce: starts the block's push + pull. */
static pst_status issue_exchange(void *arg)
{
    exec_slot *slot = arg;
    exec_block *eb = slot->eb;
    tr_exec *ex = eb->ex;
    eb->step = slot->step;
    if (ex->c.hooks && ex->c.hooks->jitter_us)
        usleep((useconds_t)pst_rng_below(&eb->jitter, ex->c.hooks->jitter_us + 1));
    exec_dev *owner = &ex->devs[eb->b->owner_device];
    const float *grad = eb->hgrad ? eb->hgrad : owner->grads + eb->b->offset;
    atomic_fetch_add(&ex->exchanges, 1);
    pst_status st = ex->c.link->ops->exchange(ex->c.link, eb->index, eb->step, grad,
                                              slot->scale, slot->dst, exchange_done, eb);
    if (st != PST_OK) /* not started: done will not run */
        atomic_fetch_sub(&ex->exchanges, 1);
    return st;
}

/* fp16: on the owner's send stream after the reduce, whether the block's summed (scaled)
 * gradient overflows: a value that is not finite, or that --grad-dtype f16 cannot hold. */
static pst_status check_overflow(void *arg)
{
    exec_block *eb = arg;
    tr_exec *ex = eb->ex;
    const float *g = eb->hgrad ? eb->hgrad : ex->devs[eb->b->owner_device].grads + eb->b->offset;
    const float most = ex->c.cfg->grad_dtype == PST_F16 ? 65504.0f : INFINITY;
    int bad = 0;
    for (size_t i = 0; i < eb->b->length; i++)
        bad |= !(fabsf(g[i]) <= most); /* NaN fails too */
    if (bad)
        atomic_store(&ex->overflow, 1);
    return PST_OK;
}

/* The first half of a block's send: waits for its gradient on every device, reduces it
 * into the owner and stages it for the host. The exchange itself is send_exchange. */
static pst_status send_reduce(tr_exec *ex, exec_block *eb, long step)
{
    const int o = eb->b->owner_device;
    exec_dev *owner = &ex->devs[o];
    for (int i = 0; i < ex->D; i++)
        PST_TRY(pst_stream_wait_event(ex->devs[i].send, ex->devs[i].grad_done[eb->index]));
    eb->send_span = exec_mark_begin(ex, owner->send, ex->tr_send[o],
                               ex->direct ? "reduce+update" : "reduce+push", step, eb->index);
    PST_TRY(pst_comm_reduce(ex->reduce_comm, eb->gbufs, eb->b->length, o, ex->send_streams));
    if (ex->direct) {
        /* The update writes the owner's weights (every device's, when shared), or the
         * store's copy lands there: backward must be done reading them. */
        for (int i = 0; i < ex->D; i++)
            if (i == o || ex->shared)
                PST_TRY(pst_stream_wait_event(owner->send, ex->devs[i].x_done[eb->lmin]));
    }
    if (eb->hgrad)
        PST_TRY(pst_memcpy_async(owner->send, eb->hgrad, eb->gbufs[o],
                                 eb->b->length * sizeof(float), PST_COPY_DEVICE_TO_HOST));
    if (ex->scaler)
        PST_TRY(pst_stream_launch(owner->send, check_overflow, eb));
    return PST_OK;
}

/* The second half: the block's push + pull for exchange step `step` (slot by its parity). */
static pst_status send_exchange(tr_exec *ex, exec_block *eb, long step)
{
    exec_dev *owner = &ex->devs[eb->b->owner_device];
    exec_slot *slot = &eb->slot[step & 1];
    slot->eb = eb;
    slot->step = step;
    slot->scale = ex->loss_scale;
    /* In place: nowhere (the link writes the owner's weights). Direct (alone, bf16/fp16):
     * the store's copy straight into the shared weights, backward being done with them.
     * Shared: into the other parameter buffer, which no compute reads this step. Replicas:
     * host staging. */
    slot->dst = ex->in_place ? NULL
                : ex->direct ? (char *)ex->pbuf[0] + eb->b->offset * ex->psize
                : ex->shared ? (char *)ex->pbuf[ex->cur ^ 1] + eb->b->offset * ex->psize
                             : eb->hparam;
    PST_TRY(pst_stream_launch(owner->send, issue_exchange, slot));
    /* Without it, a send stream that failed before starting the exchange would leave the
     * recv stream waiting for a pull that never comes; through the event the recv stream
     * takes the failure instead. */
    PST_TRY(pst_event_record(eb->sent, owner->send));
    exec_mark_end(owner->send, eb->send_span);
    return PST_OK;
}

static pst_status enqueue_recv(tr_exec *ex, exec_block *eb, long step)
{
    const int o = eb->b->owner_device;
    exec_dev *owner = &ex->devs[o];
    tr_span *sp = exec_mark_begin(ex, owner->recv, ex->tr_recv[o], "pull+broadcast", step,
                             eb->index);
    /* Through sent the recv stream also takes a failure of the streams before it, instead
     * of waiting for a pull that never comes. */
    PST_TRY(pst_stream_wait_event(owner->recv, eb->sent));
    if (ex->shared) {
        /* Nothing to broadcast: the new values are in the shared buffer (in place, after
         * the send stream waited for x_done everywhere) or the other buffer. */
        PST_TRY(pst_stream_wait_flag(owner->recv, eb->landed, (uint64_t)step + 1));
        PST_TRY(pst_event_record(owner->ready[eb->index], owner->recv));
        exec_mark_end(owner->recv, sp);
        return PST_OK;
    }
    /* The new values overwrite weights that backward reads for dinp until x_done. */
    for (int i = 0; i < ex->D; i++)
        PST_TRY(pst_stream_wait_event(ex->devs[i].recv, ex->devs[i].x_done[eb->lmin]));
    PST_TRY(pst_stream_wait_flag(owner->recv, eb->landed, (uint64_t)step + 1));
    if (!ex->in_place)
        PST_TRY(pst_memcpy_async(owner->recv, eb->pbufs[o], eb->hparam,
                                 eb->b->length * ex->psize, PST_COPY_HOST_TO_DEVICE));
    PST_TRY(pst_comm_broadcast_bytes(ex->bcast_comm, eb->pbufs, eb->b->length * ex->psize, o,
                                     ex->recv_streams));
    for (int i = 0; i < ex->D; i++)
        PST_TRY(pst_event_record(ex->devs[i].ready[eb->index], ex->devs[i].recv));
    exec_mark_end(owner->recv, sp);
    return PST_OK;
}

static pst_status sync_streams(tr_exec *ex, int which)
{
    for (int i = 0; i < ex->D; i++) {
        pst_stream *s = which == 0 ? ex->devs[i].compute : which == 1 ? ex->devs[i].send
                                                                      : ex->devs[i].recv;
        PST_TRY(pst_stream_synchronize(s));
    }
    return PST_OK;
}

/* Adds the per-row losses of the devices' last compute (synchronized) to *sum, in device
 * and row order. */
static pst_status add_losses(tr_exec *ex, double *sum)
{
    for (int i = 0; i < ex->D; i++) {
        exec_dev *d = &ex->devs[i];
        if (!d->rows)
            continue;
        const float *l = d->losses;
        if (!ex->host_memory) {
            PST_TRY(pst_memcpy_async(d->compute, ex->host_losses, d->losses,
                                     sizeof(float) * (size_t)d->rows, PST_COPY_DEVICE_TO_HOST));
            PST_TRY(pst_stream_synchronize(d->compute));
            l = ex->host_losses;
        }
        for (int r = 0; r < d->rows; r++)
            *sum += l[r];
    }
    return PST_OK;
}

/* Binds every device's layers to overwrite (0) or add to (1) the gradients; the compute
 * streams must have passed the ops bound before. */
static void set_accumulate(tr_exec *ex, int on)
{
    for (int i = 0; i < ex->D; i++)
        if (ex->devs[i].accumulate != on) {
            ex->devs[i].accumulate = on;
            bind_layers(ex, &ex->devs[i]);
        }
}

pst_status tr_exec_step(tr_exec *ex, long step, const void *x, const int32_t *y, int rows,
                        int global_rows, double *loss_sum)
{
    const int in = ex->model->in_width;
    const size_t tw = (size_t)ex->model->target_width;
    const size_t xrow = ex->model->in_tokens ? sizeof(int32_t) : sizeof(float);
    /* fp16: the loss (so every gradient) times the loss scale, a power of two: exact */
    const float scale = ex->loss_scale / (float)global_rows;
    *loss_sum = 0.0;
    use_newest_params(ex); /* step s-1's compute has run: nothing reads the arguments */
    /* Micro-batches (--acc-steps K): the trainer's rows in K parts, one after the other on
     * every device; the first overwrites the gradients, the others add to them (fp32), and
     * the blocks leave after the last. Between two, the host waits for the compute (it
     * reads the losses, and rebinds the layers' arguments). */
    if (ex->pipe)
        PST_TRY(exec_pipe_step(ex, step, x, y, rows, scale));
    for (int k = 0; !ex->pipe && k < ex->K; k++) {
        int mlo, mhi;
        pst_batch_part(rows, k, ex->K, &mlo, &mhi);
        if (k > 0) {
            PST_TRY(sync_streams(ex, 0));
            PST_TRY(add_losses(ex, loss_sum));
            set_accumulate(ex, 1);
        }
        for (int i = 0; i < ex->D; i++) {
            exec_dev *d = &ex->devs[i];
            int lo, hi;
            pst_batch_part(mhi - mlo, i, ex->D, &lo, &hi);
            d->lo = mlo + lo;
            d->rows = hi - lo;
            if (d->rows && in)
                PST_TRY(pst_memcpy_async(d->compute, d->x,
                                         (const char *)x + (size_t)d->lo * in * xrow,
                                         xrow * (size_t)d->rows * in, PST_COPY_HOST_TO_DEVICE));
            if (d->rows && y)
                PST_TRY(pst_memcpy_async(d->compute, d->y, y + (size_t)d->lo * tw,
                                         sizeof(int32_t) * (size_t)d->rows * tw,
                                         PST_COPY_HOST_TO_DEVICE));
            PST_TRY(enqueue_compute(ex, d, step, k, scale));
        }
    }
    if (!ex->c.overlap)
        PST_TRY(sync_streams(ex, 0));
    /* The exchanges are numbered by the updates made: a skipped step makes none. Blocks go
     * in the order backward finishes them (the send streams are FIFO). fp16: every block's
     * sum is reduced and checked first, then one decision for the whole job (the link's
     * vote: every trainer's flag, the same answer everywhere) before any block leaves. */
    const long xs = ex->applied;
    const int nb = ex->plan->nblocks;
    int skip = 0;
    for (int i = 0; i < nb; i++) {
        PST_TRY(send_reduce(ex, &ex->blocks[ex->send_order[i]], xs));
        if (!ex->scaler)
            PST_TRY(send_exchange(ex, &ex->blocks[ex->send_order[i]], xs));
    }
    if (ex->scaler) {
        PST_TRY(sync_streams(ex, 1));
        const int overflow =
            atomic_exchange(&ex->overflow, 0) ||
            (ex->c.hooks && step == ex->c.hooks->overflow_step);
        PST_TRY(ex->c.link->ops->vote(ex->c.link, step, overflow, &skip));
        for (int i = 0; i < nb; i++)
            if (skip) /* nothing leaves: close the spans send_reduce opened */
                exec_mark_end(ex->devs[ex->blocks[i].b->owner_device].send, ex->blocks[i].send_span);
            else
                PST_TRY(send_exchange(ex, &ex->blocks[ex->send_order[i]], xs));
    }
    if (!skip) {
        if (ex->pbuf[1])
            ex->cur ^= 1; /* the pulls above land there */
        if (!ex->c.overlap)
            PST_TRY(sync_streams(ex, 1));
        for (int b = 0; b < nb; b++) /* forward order: the next step needs these first */
            PST_TRY(enqueue_recv(ex, &ex->blocks[b], xs));
        if (!ex->c.overlap)
            PST_TRY(sync_streams(ex, 2));
    }
    PST_TRY(sync_streams(ex, 0));
    if (ex->pipe)
        *loss_sum = exec_pipe_loss(ex, rows);
    else
        PST_TRY(add_losses(ex, loss_sum));
    set_accumulate(ex, 0); /* the compute has run: the next step's first micro-batch */
    ex->last_skip = skip;
    if (skip) { /* this step's gradient is dropped everywhere; the next one's scale halves */
        ex->skipped++;
        ex->good_steps = 0;
        if (ex->loss_scale <= PST_LOSS_SCALE_MIN)
            return pst_error_set(PST_ERR_STATE, "fp16: step %ld overflowed at the smallest "
                                 "loss scale (2^-24): the gradients are not finite at any "
                                 "scale (a NaN or infinite loss?)", step);
        ex->loss_scale *= 0.5f;
        return PST_OK;
    }
    ex->applied++;
    if (ex->scaler && ++ex->good_steps == ex->c.cfg->loss_scale_window) {
        ex->good_steps = 0;
        if (ex->loss_scale < PST_LOSS_SCALE_MAX) /* GradScaler's growth, bounded */
            ex->loss_scale *= 2.0f;
    }
    return PST_OK;
}

/* ---- evaluation and results ----------------------------------------------------------- */

/* Evaluation's forward on device 0 over `rows` host rows (as tr_exec_step takes them; y
 * NULL: zero targets): every layer with scale 0, so the loss layer writes the losses and
 * its softmax and no gradient. Queued on device 0's compute stream. */
static pst_status forward_rows(tr_exec *ex, const void *x, const int32_t *y, int rows)
{
    exec_dev *d = &ex->devs[0];
    pst_stream *s = d->compute;
    const pst_model *m = ex->model;
    const size_t ybytes = sizeof(int32_t) * (size_t)rows * (size_t)m->target_width;
    if (rows < 1 || rows > ex->max_batch)
        return pst_error_set(PST_ERR_INVALID, "evaluation: %d rows, 1 to %d", rows,
                             ex->max_batch);
    use_newest_params(ex);
    PST_TRY(pst_memcpy_async(s, d->x, x, sizeof(float) * (size_t)rows * (size_t)m->in_width,
                             PST_COPY_HOST_TO_DEVICE));
    PST_TRY(y ? pst_memcpy_async(s, d->y, y, ybytes, PST_COPY_HOST_TO_DEVICE)
              : pst_memset_async(s, d->y, 0, ybytes));
    for (int k = 0; k < ex->L; k++) {
        PST_TRY(enqueue_weights(ex, d, s, k));
        PST_TRY(m->layers[k].cls->forward(d->inst[k], s, rows, 0.0f));
    }
    return PST_OK;
}

pst_status tr_exec_predict(tr_exec *ex, const void *x, int rows, float *probs)
{
    const pst_model *m = ex->model;
    const pst_layer *last = &m->layers[ex->L - 1];
    if (!last->cls->probs || m->nclasses < 1)
        return pst_error_set(PST_ERR_UNSUPPORTED, "predict: model %s gives no probabilities",
                             m->name);
    if (ex->pipe) {
        long correct;
        if (rows < 1 || rows > ex->max_batch)
            return pst_error_set(PST_ERR_INVALID, "predict: %d rows, 1 to %d", rows,
                                 ex->max_batch);
        use_newest_params(ex);
        return exec_pipe_forward(ex, x, NULL, rows, ex->host_losses, probs, &correct);
    }
    pst_stream *s = ex->devs[0].compute;
    PST_TRY(forward_rows(ex, x, NULL, rows));
    PST_TRY(pst_memcpy_async(s, probs, last->cls->probs(ex->devs[0].inst[ex->L - 1]),
                             sizeof(float) * (size_t)rows * (size_t)m->target_width *
                                 (size_t)m->nclasses,
                             PST_COPY_DEVICE_TO_HOST));
    return pst_stream_synchronize(s);
}

pst_status tr_exec_eval_batch(tr_exec *ex, const void *x, const int32_t *y, int rows,
                              double *loss_sum, long *correct)
{
    exec_dev *d = &ex->devs[0];
    pst_stream *s = d->compute;
    int32_t hc = 0;
    *loss_sum = 0.0;
    *correct = 0;
    if (!rows)
        return PST_OK;
    if (ex->pipe) {
        if (rows > ex->max_batch)
            return pst_error_set(PST_ERR_INVALID, "evaluation: %d rows, 1 to %d", rows,
                                 ex->max_batch);
        use_newest_params(ex);
        PST_TRY(exec_pipe_forward(ex, x, y, rows, ex->host_losses, NULL, correct));
        for (int r = 0; r < rows; r++)
            *loss_sum += ex->host_losses[r];
        return PST_OK;
    }
    const float *l = d->losses;
    PST_TRY(pst_memset_async(s, d->correct, 0, sizeof(int32_t)));
    PST_TRY(forward_rows(ex, x, y, rows));
    if (!ex->host_memory) {
        PST_TRY(pst_memcpy_async(s, ex->host_losses, d->losses, sizeof(float) * (size_t)rows,
                                 PST_COPY_DEVICE_TO_HOST));
        l = ex->host_losses;
    }
    PST_TRY(pst_memcpy_async(s, &hc, d->correct, sizeof(int32_t), PST_COPY_DEVICE_TO_HOST));
    PST_TRY(pst_stream_synchronize(s));
    for (int r = 0; r < rows; r++)
        *loss_sum += l[r];
    *correct = hc;
    return PST_OK;
}

pst_status tr_exec_evaluate(tr_exec *ex, const pst_dataset *test, double *acc)
{
    const int in = ex->model->in_width, chunk = ex->max_batch;
    float *hx = malloc(sizeof(float) * (size_t)chunk * in);
    int32_t *hy = malloc(sizeof(int32_t) * (size_t)chunk);
    uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)chunk);
    pst_status st = PST_OK;
    long correct = 0;
    if (!hx || !hy || !idx) {
        st = pst_error_set(PST_ERR_NOMEM, "evaluation: out of memory");
        goto out;
    }
    for (int start = 0; start < test->n; start += chunk) {
        const int cnt = test->n - start < chunk ? test->n - start : chunk;
        for (int i = 0; i < cnt; i++)
            idx[i] = (uint32_t)(start + i);
        pst_dataset_gather(test, idx, cnt, hx, hy);
        double loss;
        long c;
        if ((st = tr_exec_eval_batch(ex, hx, hy, cnt, &loss, &c)) != PST_OK)
            goto out;
        correct += c;
    }
    *acc = test->n ? (double)correct / test->n : 0.0;
out:
    free(hx);
    free(hy);
    free(idx);
    return st;
}

pst_status tr_exec_params(tr_exec *ex, float *dst)
{
    use_newest_params(ex);
    exec_dev *d = &ex->devs[0];
    const size_t n = ex->model->nparams;
    PST_TRY(pst_memcpy_async(d->compute, ex->lowp ? ex->host_lowp : (void *)dst, d->params,
                             ex->psize * n, PST_COPY_DEVICE_TO_HOST));
    PST_TRY(pst_stream_synchronize(d->compute));
    if (ex->lowp)
        pst_cast(dst, PST_F32, ex->host_lowp, ex->pdt, n);
    return PST_OK;
}

float tr_exec_loss_scale(const tr_exec *ex)
{
    return ex->loss_scale;
}

tr_resume_state tr_exec_state(const tr_exec *ex, long next_step, long *version)
{
    if (version)
        *version = ex->applied;
    return (tr_resume_state){next_step, ex->loss_scale, ex->good_steps, ex->skipped};
}

long tr_exec_skipped(const tr_exec *ex, int *last)
{
    if (last)
        *last = ex->last_skip;
    return ex->skipped;
}

size_t tr_exec_param_bytes(const tr_exec *ex)
{
    return ex->psize * ex->model->nparams;
}
