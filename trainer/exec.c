/* exec.c — the multi-device executor (see exec.h): what it builds at init, start and free.
 * The step is exec_step.c (its phases, in order), evaluation exec_eval.c, the block layout
 * exec_layout.c, the pipeline exec_pipe.c, the helpers they share exec_impl.c.
 *
 * DESIGN: everything a step touches is made at init: per device a model replica, three
 * streams (compute, send, recv), an event per layer ("its gradient is final") and per
 * block ("its new values are here"), the op argument structs; per block the pointer
 * arrays the collectives take (the optimizer state lives in the link's store).
 * A step only fills in row counts and queues work; the host waits for the compute
 * streams (to read the losses), never for the communication, unless overlap is off.
 * Hazards are closed by events alone: a block is reduced after every device recorded
 * its grad_done (the weight-gradient chunks: exec_layout.c); a device's next forward of
 * layer l waits on ready[b] of every block over l, and ready[b] comes after block b's reduce, push (its
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

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/memory.h"
#include "common/nn/gemm_bf16.h"
#include "trainer/exec_pipe.h"
#include "trainer/exec_step.h"

/* How long a lone device's team polls between runs (pst_pool_set_spin): longer than the
 * gaps inside a step (tens to a few hundred microseconds), far shorter than a step. */
#define EXEC_ALONE_SPIN_NS 500000L

static void cpu_set_of(const tr_exec_settings *cfg, cpu_set_t *set);

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
    int ok = ex->in_place && ex->D == 1 && ex->K == 1 && c->cfg.pipeline <= 1 &&
             !ex->scaler && c->cfg.grad_dtype == PST_F32 && c->link->ops->update_slice &&
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

/* Allocates device d's buffers: the flat parameters (unless shared with device 0) and
 * gradients, the activations, the batch and the layer instances. */
static pst_status alloc_replica(tr_exec *ex, exec_dev *d, int share_params)
{
    const pst_model *m = ex->model;
    const size_t B = (size_t)ex->max_batch;
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
    if (share_params) {
        d->params = ex->devs[0].params; /* not freed through this device */
    } else {
        const size_t held = exec_held_elems(ex, (int)(d - ex->devs));
        PST_TRY(exec_alloc_dev(d->dev, ex->psize * held, &d->params));
        d->param_alloc += ex->psize * held;
    }
    if (ex->lowp) {
        PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * ex->wbuf_floats, (void **)&d->wbuf));
        d->param_alloc += sizeof(float) * ex->wbuf_floats;
        if (!(d->casts = calloc((size_t)ex->L * PST_LAYER_MAX_TENSORS, sizeof *d->casts)))
            return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    }
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * exec_held_elems(ex, (int)(d - ex->devs)),
                           (void **)&d->grads));
    if (ex->c.cfg.pipeline > 1)
        return PST_OK; /* activations and layer instances: per slot (exec_pipe.c) */
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B * (size_t)widest, (void **)&d->dbuf[0]));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B * (size_t)widest, (void **)&d->dbuf[1]));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B * (size_t)m->in_width, (void **)&d->x));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(int32_t) * B * (size_t)m->target_width, (void **)&d->y));
    PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B, (void **)&d->losses));
    if (ex->sparse_width) {
        PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B * ex->sparse_width, (void **)&d->sparse));
        PST_TRY(exec_alloc_dev(d->dev, sizeof(float) * B * ex->sparse_width,
                               (void **)&d->dsparse));
    }
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

/* What the runtime, the link and the precision make of this job: devices, micro-batches,
 * the loss scaler, where the update lands (see DESIGN), the batch bound. */
static pst_status choose_modes(tr_exec *ex, const tr_exec_config *c)
{
    ex->c = *c;
    ex->model = c->model;
    if (c->cfg.compute_cpus && c->cfg.compute_cpus[0]) {
        ex->pin_compute = 1;
        cpu_set_of(&c->cfg, &ex->compute_cpus);
    }
    ex->D = pst_runtime_count(c->rt);
    ex->L = c->model->nlayers;
    ex->sparse_width = (size_t)c->model->sparse_fields * (size_t)c->model->sparse_dim;
    if (ex->sparse_width && c->cfg.pipeline > 1)
        return pst_error_set(PST_ERR_UNSUPPORTED, "--model %s with --pipeline %d is not built "
                             "yet: its sparse rows go to one pipeline stage (example: "
                             "--pipeline 1)", c->model->name, c->cfg.pipeline);
    if (ex->D > PST_DEVICE_MAX_COUNT)
        return pst_error_set(PST_ERR_INVALID, "executor: %d devices, at most %d", ex->D,
                             PST_DEVICE_MAX_COUNT);
    ex->host_memory = pst_runtime_host_memory(c->rt);
    /* A pipeline: every stage keeps its own blocks' parameters and gradients, and a block's
     * holders (a stage's replica group; the tied table's two stages) reduce and broadcast
     * among themselves (on CUDA through an NCCL communicator set of theirs). */
    ex->stage_local = c->cfg.pipeline > 1;
    ex->plan = c->link->plan; /* the blocks each device holds size its buffers */
    if (ex->plan->nparams != c->model->nparams || ex->plan->ndevices != ex->D)
        return pst_error_set(PST_ERR_INTERNAL, "executor: plan for %zu params on %d devices, "
                             "model has %zu on %d", ex->plan->nparams, ex->plan->ndevices,
                             c->model->nparams, ex->D);
    ex->shared = ex->host_memory && !c->cfg.cpu_replicas && !ex->stage_local;
    ex->pdt = c->cfg.precision;
    ex->psize = pst_dtype_size(ex->pdt);
    ex->lowp = ex->pdt != PST_F32;
    ex->bf16_gemm = ex->pdt == PST_BF16 && ex->host_memory && pst_gemm_bf16_on();
    ex->K = c->cfg.acc_steps > 0 ? c->cfg.acc_steps : 1;
    ex->scaler = ex->pdt == PST_F16;
    ex->loss_scale = ex->scaler ? c->cfg.loss_scale : 1.0f;
    /* In place only on the shared CPU copy in fp32: with replicas (--cpu-replicas 1, as on
     * GPUs) the new values go through host staging, are copied to the owner and broadcast;
     * in bf16/fp16 the store's master is fp32 and the devices hold its low-precision copy. */
    ex->direct = c->link->in_process && ex->shared;
    ex->in_place = ex->direct && !ex->lowp;
    PST_TRY(plan_sliced(ex, c));
    ex->wbuf_floats = 1;
    for (int l = 0; ex->lowp && l < ex->L; l++) {
        const pst_layer *ly = &c->model->layers[l];
        size_t numel = 0;
        for (int k = 0; k < ly->ntensors; k++)
            numel += c->model->tensors[ly->tensor[k]].numel;
        if (!ly->cls->weights_unread && numel > ex->wbuf_floats)
            ex->wbuf_floats = numel;
    }
    const int per_micro = (c->max_rows + ex->K - 1) / ex->K; /* rows of one micro-batch */
    int per_dev = (per_micro + ex->D - 1) / ex->D;
    ex->max_batch = per_dev > c->eval_rows ? per_dev : c->eval_rows;
    if (c->cfg.pipeline > 1) /* the evaluation's bound; a step's rows go through slots */
        ex->max_batch = c->eval_rows > 0 ? c->eval_rows : 1;
    return PST_OK;
}

/* Per device: its thread team (CPU), its replica's buffers, three streams (compute, send,
 * recv), an x_done event per layer, and its layers bound (pipeline off). */
static pst_status init_devices(tr_exec *ex)
{
    const tr_exec_config *c = &ex->c;
    const int team = c->threads > 0 ? c->threads : 1; /* a CPU device's threads */
    ex->devs = calloc((size_t)ex->D, sizeof *ex->devs);
    ex->send_streams = calloc((size_t)ex->D, sizeof *ex->send_streams);
    ex->recv_streams = calloc((size_t)ex->D, sizeof *ex->recv_streams);
    if (!ex->devs || !ex->send_streams || !ex->recv_streams)
        return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    for (int i = 0; i < ex->D; i++) {
        exec_dev *d = &ex->devs[i];
        d->ex = ex;
        d->dev = pst_runtime_device(c->rt, i);
        /* CPU devices split each layer and the optimizer over a team of their own threads
         * (OpenBLAS itself runs single-threaded, see train.c). */
        if (ex->host_memory)
            PST_TRY(pst_pool_init(&d->pool, team));
        /* Training alone on one device, the team has the cores to itself: its workers poll
         * through the gaps between a step's runs (the single-threaded ops, the batch's
         * gathering) instead of sleeping and paying a futex wake-up at the next run (about
         * 4% more samples/s on the MLP bench). With pservers, or devices sharing the cores,
         * polling would take them from the communication or the other devices. */
        if (d->pool && c->link->in_process && ex->D == 1)
            pst_pool_set_spin(d->pool, EXEC_ALONE_SPIN_NS);
        PST_TRY(alloc_replica(ex, d, ex->shared && i > 0));
        PST_TRY(pst_stream_create(d->dev, &d->compute));
        PST_TRY(pst_stream_create(d->dev, &d->send));
        PST_TRY(pst_stream_create(d->dev, &d->recv));
        ex->send_streams[i] = d->send;
        ex->recv_streams[i] = d->recv;
        PST_TRY(exec_events_create(d->dev, (size_t)ex->L, &d->x_done));
        if (c->cfg.pipeline <= 1)
            exec_bind_layers(ex, d);
    }
    if (ex->host_memory && ex->D > 1 && c->link->in_process) {
        /* The update after backward runs on the owner's send stream while every compute
         * thread waits for it: it gets them all, sleeping between runs (no polling that
         * would take a core from the compute). */
        PST_TRY(pst_pool_init(&ex->update_pool, ex->D * team));
        pst_pool_set_spin(ex->update_pool, 0);
    }
    return PST_OK;
}

/* The second shared parameter buffer (see DESIGN), the two communicators and the host
 * buffers. */
static pst_status init_shared(tr_exec *ex)
{
    const size_t n = ex->model->nparams;
    ex->pbuf[0] = ex->devs[0].params;
    if (ex->shared && !ex->direct) {
        PST_TRY(exec_alloc_dev(ex->devs[0].dev, ex->psize * n, &ex->pbuf[1]));
        ex->devs[0].param_alloc += ex->psize * n;
    }
    PST_TRY(pst_comm_init(&ex->reduce_comm, ex->c.rt));
    PST_TRY(pst_comm_init(&ex->bcast_comm, ex->c.rt));
    ex->host_params = malloc(sizeof(float) * n);
    ex->host_lowp = ex->lowp ? malloc(ex->psize * n) : NULL;
    ex->host_losses = malloc(sizeof(float) * (size_t)ex->max_batch);
    if (!ex->host_params || !ex->host_losses || (ex->lowp && !ex->host_lowp))
        return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    return PST_OK;
}

/* Per block: every device's ready and grad_done events, the pointers the collectives take,
 * the owner's sent event and landed flag, and host staging where the devices' memory is
 * not the host's or the pull does not land in place. */
static pst_status init_blocks(tr_exec *ex)
{
    const int nb = ex->plan->nblocks;
    ex->blocks = calloc((size_t)nb, sizeof *ex->blocks);
    ex->homes = calloc((size_t)nb, sizeof *ex->homes);
    if (!ex->blocks || !ex->homes)
        return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    for (int i = 0; i < ex->D; i++) {
        PST_TRY(exec_events_create(ex->devs[i].dev, (size_t)nb, &ex->devs[i].ready));
        PST_TRY(exec_events_create(ex->devs[i].dev, (size_t)nb, &ex->devs[i].grad_done));
    }
    size_t held[PST_DEVICE_MAX_COUNT] = {0};
    for (int b = 0; b < nb; b++) {
        exec_block *eb = &ex->blocks[b];
        eb->ex = ex;
        eb->index = b;
        eb->b = &ex->plan->blocks[b];
        eb->lmin = ex->lay.lmin[b];
        pst_rng_seed(&eb->jitter, ex->c.hooks ? ex->c.hooks->jitter_seed : 0, 7000 + (uint64_t)b);
        eb->gbufs = calloc((size_t)ex->D, sizeof(float *));
        eb->pbufs = calloc((size_t)ex->D, sizeof(void *));
        if (!eb->gbufs || !eb->pbufs)
            return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
        for (int i = 0; i < ex->D; i++) {
            if (!ex->stage_local) {
                eb->gbufs[i] = ex->devs[i].grads + eb->b->offset;
                eb->pbufs[i] = (char *)ex->devs[i].params + eb->b->offset * ex->psize;
            } else if ((eb->b->holders >> i) & 1u) { /* its blocks end to end, in order */
                eb->gbufs[i] = ex->devs[i].grads + held[i];
                eb->pbufs[i] = (char *)ex->devs[i].params + held[i] * ex->psize;
                held[i] += eb->b->length;
            }
        }
        if (ex->stage_local) { /* the holders' collectives (NCCL: their communicators) */
            PST_TRY(pst_comm_prepare_some(ex->reduce_comm, eb->b->holders));
            PST_TRY(pst_comm_prepare_some(ex->bcast_comm, eb->b->holders));
        }
        exec_dev *owner = &ex->devs[eb->b->owner_device];
        PST_TRY(pst_event_create(owner->dev, &eb->sent));
        PST_TRY(pst_flag_create(owner->dev, &eb->landed));
        ex->homes[b] = ex->lowp ? NULL : (float *)eb->pbufs[eb->b->owner_device];
        if (ex->shared)
            continue;
        /* Pulls land in host staging (unless the update is made in place): a pull may come
         * back while backward still reads the block's weights (dinp), so it is copied in
         * only after that. Pushes are sent straight from device memory when the host can
         * read it. */
        if (!ex->host_memory)
            PST_TRY(pst_device_alloc_host(owner->dev, sizeof(float) * eb->b->length,
                                          (void **)&eb->hgrad));
        if (!ex->in_place)
            PST_TRY(pst_device_alloc_host(owner->dev, ex->psize * eb->b->length, &eb->hparam));
    }
    return PST_OK;
}

/* Per device, each weight-gradient chunk's argument record (the layout's chunks). */
static pst_status alloc_chunk_args(tr_exec *ex)
{
    for (int i = 0; i < ex->D; i++) {
        exec_dev *d = &ex->devs[i];
        if (!(d->chunk = calloc((size_t)ex->lay.nchunks, sizeof *d->chunk)))
            return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
        for (int c = 0; c < ex->lay.nchunks; c++) {
            size_t bytes = ex->model->layers[ex->lay.chunks[c].layer].cls->chunk_bytes;
            if (bytes && !(d->chunk[c] = calloc(1, bytes)))
                return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
        }
    }
    return PST_OK;
}

/* The trace's tracks: per device compute, send and recv, and the RPCs. */
static void init_trace(tr_exec *ex)
{
    tr_trace *t = ex->c.trace;
    char name[48];
    for (int i = 0; i < ex->D; i++) {
        const char *dn = pst_device_name(ex->devs[i].dev);
        snprintf(name, sizeof name, "%s compute", dn);
        ex->tr_compute[i] = tr_trace_track(t, name);
        snprintf(name, sizeof name, "%s send (reduce, %s)", dn,
                 ex->c.link->in_process ? "update" : "push");
        ex->tr_send[i] = tr_trace_track(t, name);
        snprintf(name, sizeof name, "%s recv (pull, broadcast)", dn);
        ex->tr_recv[i] = tr_trace_track(t, name);
    }
    ex->tr_push = tr_trace_track(t, "rpc push");
    ex->tr_pull = tr_trace_track(t, "rpc pull");
}

pst_status tr_exec_init(tr_exec **out, const tr_exec_config *c)
{
    *out = NULL;
    tr_exec *ex = calloc(1, sizeof *ex);
    if (!ex)
        return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    pst_status st;
    if ((st = choose_modes(ex, c)) != PST_OK || (st = init_devices(ex)) != PST_OK ||
        (st = init_shared(ex)) != PST_OK ||
        (st = exec_layout_build(&ex->lay, ex->model, ex->plan, !c->link->in_process)) != PST_OK ||
        (st = init_blocks(ex)) != PST_OK || (st = alloc_chunk_args(ex)) != PST_OK ||
        (c->cfg.pipeline > 1 && (st = exec_pipe_init(ex)) != PST_OK)) {
        tr_exec_free(ex);
        return st;
    }
    if (c->hooks && c->hooks->jitter_us)
        pst_runtime_set_jitter(c->rt, c->hooks->jitter_seed, c->hooks->jitter_us);
    if (c->trace)
        init_trace(ex);
    *out = ex;
    return PST_OK;
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
        if (!eb->b) /* init failed before this block */
            continue;
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
        exec_events_free(d->x_done, (size_t)ex->L);
        exec_events_free(d->ready, ex->plan ? (size_t)ex->plan->nblocks : 0);
        exec_events_free(d->grad_done, ex->plan ? (size_t)ex->plan->nblocks : 0);
        for (int c = 0; d->chunk && c < ex->lay.nchunks; c++)
            free(d->chunk[c]);
        free(d->chunk);
        for (int l = 0; d->inst && l < ex->L; l++)
            free(d->inst[l]);
        free(d->inst);
        if (d->dev) {
            pst_device_free(d->dev, d->x);
            pst_device_free(d->dev, d->y);
            pst_device_free(d->dev, d->losses);
            pst_device_free(d->dev, d->correct);
            pst_device_free(d->dev, d->sparse);
            pst_device_free(d->dev, d->dsparse);
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
        PST_FREE_ALL(d->casts, d->acts, d->save, d->work, d->scratch);
        pst_pool_free(d->pool);
    }
    if (ex->pbuf[1])
        pst_device_free(ex->devs[0].dev, ex->pbuf[1]);
    pst_pool_free(ex->update_pool);
    pst_comm_free(ex->reduce_comm);
    pst_comm_free(ex->bcast_comm);
    free(ex->homes);
    free(ex->blocks);
    exec_layout_free(&ex->lay);
    PST_FREE_ALL(ex->rows, ex->host_params, ex->host_lowp, ex->host_losses, ex->devs,
                 ex->send_streams, ex->recv_streams, ex);
}

size_t tr_exec_nparams(const tr_exec *ex)
{
    return ex->model->nparams;
}

tr_exec_memory tr_exec_memory_of(const tr_exec *ex, int device)
{
    tr_exec_memory m = {0};
    if (device < 0 || device >= ex->D)
        return m;
    const exec_dev *d = &ex->devs[device];
    const size_t live = pst_device_live_bytes(d->dev), n = ex->model->nparams;
    m.params = ex->psize * (ex->stage_local ? exec_held_elems(ex, device) : n);
    m.grads = d->grads ? sizeof(float) * exec_held_elems(ex, device) : 0;
    m.acts = live - d->param_alloc - m.grads;
    m.peak = pst_device_peak_bytes(d->dev);
    return m;
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

tr_exec_settings tr_exec_settings_of(const pst_config *cfg)
{
    return (tr_exec_settings){
        .precision = cfg->precision, .grad_dtype = cfg->grad_dtype, .acc_steps = cfg->acc_steps,
        .cpu_replicas = cfg->cpu_replicas, .loss_scale = cfg->loss_scale,
        .loss_scale_window = cfg->loss_scale_window, .compute_cpus = cfg->compute_cpus,
        .compute_cpu_mask = cfg->compute_cpu_mask, .pipeline = cfg->pipeline,
        .micro_batches = cfg->micro_batches, .virtual_stages = cfg->virtual_stages,
        .schedule = cfg->schedule, .partition = cfg->partition, .npartition = cfg->npartition};
}

/* ---- start: pinning, the first values ----------------------------------------------- */

/* --compute-cpus as the config parsed it into a CPU set. */
static void cpu_set_of(const tr_exec_settings *cfg, cpu_set_t *set)
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
                             "taskset -p %d)", ex->c.cfg.compute_cpus, strerror(rc),
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
                                   ex->update_pool ? ex->update_pool : ex->devs[0].pool));
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
    for (int i = 0; i < (ex->shared ? 1 : ex->D); i++) {
        if (!ex->stage_local) {
            PST_TRY(pst_memcpy_async(ex->devs[i].compute, ex->devs[i].params, src,
                                     n * ex->psize, PST_COPY_HOST_TO_DEVICE));
            continue;
        }
        for (int b = 0; b < ex->plan->nblocks; b++) /* the blocks it holds */
            if (ex->blocks[b].pbufs[i])
                PST_TRY(pst_memcpy_async(ex->devs[i].compute, ex->blocks[b].pbufs[i],
                                         (const char *)src + ex->plan->blocks[b].offset *
                                                                 ex->psize,
                                         ex->plan->blocks[b].length * ex->psize,
                                         PST_COPY_HOST_TO_DEVICE));
    }
    return tr_exec_sync(ex);
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
