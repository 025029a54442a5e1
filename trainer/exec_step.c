/* exec_step.c — one training step of the executor (tr_exec_step, see exec.h), as the list
 * of its phases; the hazards between them are closed by events (exec.c's DESIGN):
 *   gather            a device's share of the rows, copied to it      compute stream
 *   forward           layer by layer, each after its blocks are ready   compute stream
 *   backward          records grad_done[b] as each block's rows finish  compute stream
 *   reduce_to_owner   a block's gradient summed on its owner device     send streams
 *   (fp16: vote)      one skip-or-apply decision for the whole job      host
 *   exchange          the block's push + pull (the link)                send stream
 *   broadcast         the new values to every device, then ready[b]     recv streams
 *   end_step          the host waits for the compute; losses; loss scale
 * The pipeline (exec_pipe.c) replaces gather, forward and backward by its schedule; the
 * rest is the same. */
#include "trainer/exec.h"

#include <math.h>
#include <stdatomic.h>
#include <unistd.h>

#include "trainer/exec_pipe.h"
#include "trainer/exec_step.h"

/* Points every replica at the newest parameters (two buffers: pbuf[cur]). */
void exec_use_newest_params(tr_exec *ex)
{
    if (!ex->pbuf[1])
        return;
    for (int i = 0; i < ex->D; i++) {
        ex->devs[i].params = ex->pbuf[ex->cur];
        if (!ex->pipe)
            exec_bind_layers(ex, &ex->devs[i]);
    }
    if (ex->pipe)
        exec_pipe_bind(ex);
}

/* ---- gather, forward, backward: a device's compute stream ------------------------------ */

/* A model with sparse fields: rows [lo, lo + n) of the caller's embeddings (tr_exec_set_sparse)
 * to the device. */
static pst_status sparse_rows_in(tr_exec *ex, exec_dev *d, int lo, int n)
{
    if (!ex->sparse_in)
        return pst_error_set(PST_ERR_INVALID, "model %s reads sparse rows: call "
                             "tr_exec_set_sparse before its steps", ex->model->name);
    return pst_memcpy_async(d->compute, d->sparse, ex->sparse_in + (size_t)lo * ex->sparse_width,
                            sizeof(float) * (size_t)n * ex->sparse_width,
                            PST_COPY_HOST_TO_DEVICE);
}

void tr_exec_set_sparse(tr_exec *ex, const float *sparse, float *dsparse)
{
    ex->sparse_in = sparse;
    ex->sparse_grad = dsparse;
}

/* Gather: device d's rows of micro-batch k (--acc-steps K splits the trainer's rows in K
 * parts, each over the D devices), copied to the device. */
static pst_status gather(tr_exec *ex, exec_dev *d, int k, const void *x, const int32_t *y,
                         int rows)
{
    const int in = ex->model->in_width;
    const size_t tw = (size_t)ex->model->target_width;
    const size_t xrow = ex->model->in_tokens ? sizeof(int32_t) : sizeof(float);
    int mlo, mhi, lo, hi;
    pst_batch_part(rows, k, ex->K, &mlo, &mhi);
    pst_batch_part(mhi - mlo, (int)(d - ex->devs), ex->D, &lo, &hi);
    d->lo = mlo + lo;
    d->rows = hi - lo;
    if (d->rows && in)
        PST_TRY(pst_memcpy_async(d->compute, d->x, (const char *)x + (size_t)d->lo * in * xrow,
                                 xrow * (size_t)d->rows * in, PST_COPY_HOST_TO_DEVICE));
    if (d->rows && y)
        PST_TRY(pst_memcpy_async(d->compute, d->y, y + (size_t)d->lo * tw,
                                 sizeof(int32_t) * (size_t)d->rows * tw, PST_COPY_HOST_TO_DEVICE));
    if (d->rows && ex->sparse_width)
        PST_TRY(sparse_rows_in(ex, d, d->lo, d->rows));
    return PST_OK;
}

/* Forward: each layer waits for the blocks it reads to be ready (the previous step's
 * broadcast, or the owner's update on a shared CPU buffer), then runs; the loss layer
 * writes the losses and the gradient of its input, times `scale`. */
static pst_status forward(tr_exec *ex, exec_dev *d, long step, float scale)
{
    pst_stream *s = d->compute;
    const int di = (int)(d - ex->devs);
    if (!d->rows)
        return PST_OK;
    for (int l = 0; l < ex->L; l++) {
        for (int k = ex->lay.layer_blocks0[l]; k < ex->lay.layer_blocks0[l + 1]; k++) {
            const int b = ex->lay.layer_blocks[k];
            exec_dev *src = ex->shared ? &ex->devs[ex->blocks[b].b->owner_device] : d;
            PST_TRY(pst_stream_wait_event(s, src->ready[b]));
        }
        tr_span *sp = exec_mark_begin(ex, s, ex->tr_compute[di], "forward", step, l);
        PST_TRY(exec_enqueue_weights(ex, d, s, l));
        PST_TRY(ex->model->layers[l].cls->forward(d->inst[l], s, d->rows, scale));
        exec_mark_end(s, sp);
    }
    return PST_OK;
}

/* A device with no rows this step: a zero gradient still takes part in the reduce. The
 * previous step's reduce may still read this device's gradient; every block's ready event
 * comes after its reduce, so it waits for all of them first. */
static pst_status zero_gradient(tr_exec *ex, exec_dev *d)
{
    pst_stream *s = d->compute;
    for (int b = 0; b < ex->plan->nblocks; b++) {
        exec_dev *src = ex->shared ? &ex->devs[ex->blocks[b].b->owner_device] : d;
        PST_TRY(pst_stream_wait_event(s, src->ready[b]));
    }
    PST_TRY(pst_memset_async(s, d->grads, 0,
                             exec_held_elems(ex, (int)(d - ex->devs)) * sizeof(float)));
    d->grads_gen++; /* what a layer wrote there is gone (pst_layer_io.grads_gen) */
    for (int b = 0; b < ex->plan->nblocks; b++)
        PST_TRY(pst_event_record(d->grad_done[b], s));
    for (int l = 0; l < ex->L; l++)
        PST_TRY(pst_event_record(d->x_done[l], s));
    return PST_OK;
}

/* Backward of micro-batch `micro`, top layer first. A layer's weight gradient is computed
 * chunk by chunk (exec_layout.c) and each block's grad_done is recorded right after the
 * chunk that finishes it: the block leaves while the rest of the layer (and its input
 * gradient) is still being computed. Updated during backward (ex->rows), the input gradient
 * comes first: it reads the weights the update changes. x_done: the layer's weights are
 * read. */
static pst_status backward(tr_exec *ex, exec_dev *d, long step, int micro)
{
    pst_stream *s = d->compute;
    const int di = (int)(d - ex->devs);
    if (!d->rows) /* after the first micro-batch, the gradient so far stands */
        return micro > 0 ? PST_OK : zero_gradient(ex, d);
    for (int l = ex->L - 1; l >= 0; l--) {
        const pst_layer_class *cls = ex->model->layers[l].cls;
        tr_span *sp = cls->wgrad || cls->igrad
                          ? exec_mark_begin(ex, s, ex->tr_compute[di], "backward", step, l)
                          : NULL;
        if (l < ex->L - 1) /* the top layer's weights are still in the scratch */
            PST_TRY(exec_enqueue_weights(ex, d, s, l));
        const int igrad_first = ex->rows && cls->igrad;
        if (igrad_first) {
            PST_TRY(cls->igrad(d->inst[l], s, d->rows));
            PST_TRY(pst_event_record(d->x_done[l], s));
        }
        for (int c = ex->lay.layer_chunk0[l]; c < ex->lay.layer_chunk0[l + 1]; c++) {
            const exec_chunk *ch = &ex->lay.chunks[c];
            PST_TRY(cls->wgrad(d->inst[l], d->chunk[c], s, d->rows, ch->row0, ch->row1));
            const int *done = ex->lay.chunk_blocks + ch->blk0;
            for (int k = 0; k < ch->nblk; k++)
                PST_TRY(pst_event_record(d->grad_done[done[k]], s));
        }
        if (!igrad_first) {
            if (cls->igrad)
                PST_TRY(cls->igrad(d->inst[l], s, d->rows));
            PST_TRY(pst_event_record(d->x_done[l], s));
        }
        exec_mark_end(s, sp);
    }
    if (ex->sparse_width && ex->sparse_grad) /* the rows' embedding gradients, for the push */
        PST_TRY(pst_memcpy_async(s, ex->sparse_grad + (size_t)d->lo * ex->sparse_width,
                                 d->dsparse, sizeof(float) * (size_t)d->rows * ex->sparse_width,
                                 PST_COPY_DEVICE_TO_HOST));
    return PST_OK;
}

/* Waits for every device's compute (0), send (1) or recv (2) stream. */
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
            exec_bind_layers(ex, &ex->devs[i]);
        }
}


/* Between two micro-batches: the host waits for the compute (it reads the losses, and
 * rebinds the layers' arguments), and the next ones add to the gradients (fp32). */
static pst_status between_micro_batches(tr_exec *ex, double *loss_sum)
{
    PST_TRY(sync_streams(ex, 0));
    PST_TRY(add_losses(ex, loss_sum));
    set_accumulate(ex, 1);
    return PST_OK;
}

/* ---- reduce, exchange, broadcast: the send and recv streams ---------------------------- */

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
    const float *grad = eb->hgrad ? eb->hgrad : eb->gbufs[eb->b->owner_device];
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
    const float *g = eb->hgrad ? eb->hgrad : eb->gbufs[eb->b->owner_device];
    const float most = ex->c.cfg.grad_dtype == PST_F16 ? 65504.0f : INFINITY;
    int bad = 0;
    for (size_t i = 0; i < eb->b->length; i++)
        bad |= !(fabsf(g[i]) <= most); /* NaN fails too */
    if (bad)
        atomic_store(&ex->overflow, 1);
    return PST_OK;
}

/* Reduce to the owner: waits for the block's gradient on every device (grad_done), sums
 * it into the owner device in device order and stages it for the host (fp16: then checks
 * it for overflow). On the owner's send stream. */
static pst_status reduce_to_owner(tr_exec *ex, exec_block *eb, long step)
{
    const int o = eb->b->owner_device;
    exec_dev *owner = &ex->devs[o];
    for (int i = 0; i < ex->D; i++)
        PST_TRY(pst_stream_wait_event(ex->devs[i].send, ex->devs[i].grad_done[eb->index]));
    eb->send_span = exec_mark_begin(ex, owner->send, ex->tr_send[o],
                               ex->direct ? "reduce+update" : "reduce+push", step, eb->index);
    /* Over the devices that hold the block (each one, or a tied table's two stages) where
     * only they keep it, else every device. */
    PST_TRY(pst_comm_reduce_some(ex->reduce_comm, eb->gbufs, eb->b->length, o, ex->send_streams,
                                 ex->stage_local ? eb->b->holders : ~(uint64_t)0));
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

/* Exchange: the block's push + pull for exchange step `step` (slot by its parity), started
 * on the owner's send stream after the reduce. */
static pst_status exchange(tr_exec *ex, exec_block *eb, long step)
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

/* fp16: every block's sum was reduced and checked; one decision for the whole job (the
 * link's vote: every trainer's flag, the same answer everywhere) before any block leaves.
 * *skip: the step's gradient is dropped everywhere. */
static pst_status vote_then_exchange(tr_exec *ex, long step, long xs, int *skip)
{
    const int nb = ex->plan->nblocks;
    PST_TRY(sync_streams(ex, 1));
    const int overflow = atomic_exchange(&ex->overflow, 0) ||
                         (ex->c.hooks && step == ex->c.hooks->overflow_step);
    PST_TRY(ex->c.link->ops->vote(ex->c.link, step, overflow, skip));
    for (int i = 0; i < nb; i++)
        if (*skip) /* nothing leaves: close the spans reduce_to_owner opened */
            exec_mark_end(ex->devs[ex->blocks[i].b->owner_device].send, ex->blocks[i].send_span);
        else
            PST_TRY(exchange(ex, &ex->blocks[ex->lay.send_order[i]], xs));
    return PST_OK;
}

/* Broadcast, then ready: on the owner's recv stream, once the block's pull landed (and
 * backward stopped reading its old weights), its new values go to the owner and to every
 * device, and each device records ready[b], which the next step's forward waits for. */
static pst_status broadcast(tr_exec *ex, exec_block *eb, long step)
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
    PST_TRY(pst_comm_broadcast_some(ex->bcast_comm, eb->pbufs, eb->b->length * ex->psize, o,
                                    ex->recv_streams,
                                    ex->stage_local ? eb->b->holders : ~(uint64_t)0));
    for (int i = 0; i < ex->D; i++)
        PST_TRY(pst_event_record(ex->devs[i].ready[eb->index], ex->devs[i].recv));
    exec_mark_end(owner->recv, sp);
    return PST_OK;
}

/* Every block's broadcast, in forward order (the next step needs the first layers first). */
static pst_status broadcast_all(tr_exec *ex, long xs)
{
    if (ex->pbuf[1])
        ex->cur ^= 1; /* the pulls land there */
    if (!ex->c.overlap)
        PST_TRY(sync_streams(ex, 1));
    for (int b = 0; b < ex->plan->nblocks; b++)
        PST_TRY(broadcast(ex, &ex->blocks[b], xs));
    if (!ex->c.overlap)
        PST_TRY(sync_streams(ex, 2));
    return PST_OK;
}

/* ---- the step ------------------------------------------------------------------------- */

/* End of the step: the host waits for the compute (not for the communication, unless
 * overlap is off), sums the losses, and keeps the loss scale (fp16: GradScaler's rule). */
static pst_status end_step(tr_exec *ex, long step, int rows, int skip, double *loss_sum)
{
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
    if (ex->scaler && ++ex->good_steps == ex->c.cfg.loss_scale_window) {
        ex->good_steps = 0;
        if (ex->loss_scale < PST_LOSS_SCALE_MAX) /* GradScaler's growth, bounded */
            ex->loss_scale *= 2.0f;
    }
    return PST_OK;
}

pst_status tr_exec_step(tr_exec *ex, long step, const void *x, const int32_t *y, int rows,
                        int global_rows, double *loss_sum)
{
    /* fp16: the loss (so every gradient) times the loss scale, a power of two: exact */
    const float scale = ex->loss_scale / (float)global_rows;
    *loss_sum = 0.0;
    exec_use_newest_params(ex); /* step s-1's compute has run: nothing reads the arguments */
    if (ex->pipe) /* gather, forward and backward in the schedule's order */
        PST_TRY(exec_pipe_step(ex, step, x, y, rows, scale));
    for (int k = 0; !ex->pipe && k < ex->K; k++) { /* micro-batches (--acc-steps K) */
        if (k > 0)
            PST_TRY(between_micro_batches(ex, loss_sum));
        for (int i = 0; i < ex->D; i++) {
            PST_TRY(gather(ex, &ex->devs[i], k, x, y, rows));
            PST_TRY(forward(ex, &ex->devs[i], step, scale));
            PST_TRY(backward(ex, &ex->devs[i], step, k));
        }
    }
    if (!ex->c.overlap)
        PST_TRY(sync_streams(ex, 0));
    /* The exchanges are numbered by the updates made: a skipped step makes none. Blocks go
     * in the order backward finishes them (the send streams are FIFO); fp16 reduces and
     * checks them all, then votes, before any leaves. */
    const long xs = ex->applied;
    int skip = 0;
    for (int i = 0; i < ex->plan->nblocks; i++) {
        exec_block *eb = &ex->blocks[ex->lay.send_order[i]];
        PST_TRY(reduce_to_owner(ex, eb, xs));
        if (!ex->scaler)
            PST_TRY(exchange(ex, eb, xs));
    }
    if (ex->scaler)
        PST_TRY(vote_then_exchange(ex, step, xs, &skip));
    if (!skip)
        PST_TRY(broadcast_all(ex, xs));
    return end_step(ex, step, rows, skip, loss_sum);
}
