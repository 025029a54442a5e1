/* exec_impl.c — helpers the executor's files share (see exec_impl.h): device allocation,
 * trace marks on streams, binding a device's layers to its buffers (with the update made
 * during backward, which the executor owns: a layer only reports rows done through its io),
 * and the casts of a layer's low-precision weights. */
#include "trainer/exec_impl.h"

#include <stdlib.h>

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

/* ---- memory, layers ------------------------------------------------------------------- */

pst_status exec_alloc_dev(pst_device *dev, size_t bytes, void **p)
{
    return pst_device_alloc(dev, bytes ? bytes : 1, p);
}

size_t exec_held_elems(const tr_exec *ex, int i)
{
    return ex->stage_local ? ex->plan->device_held[i] : ex->model->nparams;
}

float *exec_grad_at(const tr_exec *ex, int i, size_t off)
{
    const int b = tr_plan_block_at(ex->plan, off);
    float *g = ex->blocks[b].gbufs[i];
    return g ? g + (off - ex->plan->blocks[b].offset) : NULL;
}

void *exec_param_at(const tr_exec *ex, int i, size_t off)
{
    const int b = tr_plan_block_at(ex->plan, off);
    char *p = ex->blocks[b].pbufs[i];
    return p ? p + (off - ex->plan->blocks[b].offset) * ex->psize : NULL;
}

pst_status exec_events_create(pst_device *dev, size_t n, pst_event ***out)
{
    if (!(*out = calloc(n ? n : 1, sizeof **out)))
        return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    for (size_t i = 0; i < n; i++)
        PST_TRY(pst_event_create(dev, &(*out)[i]));
    return PST_OK;
}

void exec_events_free(pst_event **evs, size_t n)
{
    for (size_t i = 0; evs && i < n; i++)
        pst_event_destroy(evs[i]);
    free(evs);
}

/* ---- the update made during backward (training alone) -------------------------------- */

/* Hands elements [off, off + n) of the flat gradient to the link's update, cut at blocks. */
static void update_flat(tr_exec *ex, size_t off, size_t n)
{
    const tr_plan *p = ex->plan;
    const float *g = ex->devs[0].grads;
    for (int b = tr_plan_block_at(p, off); n > 0 && b < p->nblocks; b++) {
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

/* Points every layer instance of device d at its buffers: layer l reads layer l-1's
 * output (layer 0 the batch). Backward ping-pongs between dbuf[0] and dbuf[1], starting
 * from the loss layer's input gradient in dbuf[0]: layer l reads dout and writes din,
 * which becomes layer l-1's dout; layer 0's input gradient is not computed. */
void exec_bind_layers(tr_exec *ex, exec_dev *d)
{
    const pst_model *m = ex->model;
    for (int l = 0; l < ex->L; l++) {
        pst_layer_io io = {
            .pool = d->pool, .accumulate = d->accumulate,
            .in = l ? d->acts[l - 1] : m->in_tokens ? NULL : d->x, .out = d->acts[l],
            .tokens = !l && m->in_tokens ? (const int32_t *)(const void *)d->x : NULL,
            .dout = l + 1 < ex->L ? d->dbuf[(ex->L - 2 - l) & 1] : NULL,
            .din = l ? d->dbuf[(ex->L - 1 - l) & 1] : NULL,
            .targets = d->y, .losses = d->losses, .correct = d->correct,
            .sparse = d->sparse, .dsparse = d->dsparse,
            .save = d->save[l], .work = d->work[l], .scratch = d->scratch[l],
            .max_batch = ex->max_batch,
            .rows_done = ex->rows && m->layers[l].ntensors ? rows_final : NULL,
            .rows_arg = ex->rows ? &ex->rows[l] : NULL,
            /* one device holds every gradient: no reduce writes into it */
            .grads_gen = ex->D == 1 && !ex->stage_local ? &d->grads_gen : NULL};
        const pst_layer *ly = &m->layers[l];
        pst_layer_io_point(&io, m, l, ex->lowp ? NULL : d->params, d->grads);
        size_t at = 0; /* the layer's tensors packed in wbuf */
        for (int k = 0; ex->lowp && k < ly->ntensors; k++) {
            const pst_tensor *t = &m->tensors[ly->tensor[k]];
            exec_bind_lowp(ex, d, l, k, (const char *)d->params + t->offset * ex->psize, t->numel,
                           &at, &io);
        }
        ly->cls->bind(d->inst[l], m, l, &io);
    }
}

void exec_bind_lowp(tr_exec *ex, exec_dev *d, int l, int k, const void *src, size_t numel,
                    size_t *at, pst_layer_io *io)
{
    /* A GEMM weight with bf16 GEMMs is read where the device keeps it (in bf16 already),
     * as fp32 parameters are: nothing to cast (n 0) */
    const int gemm = ex->bf16_gemm && (ex->model->layers[l].cls->gemm_weights >> k & 1u);
    d->casts[l * PST_LAYER_MAX_TENSORS + k] = (pst_cast_args){
        .dst = d->wbuf + *at, .dt = PST_F32, .src = src, .st = ex->pdt, .n = gemm ? 0 : numel,
        .pool = d->pool};
    io->w[k] = gemm ? NULL : d->wbuf + *at;
    io->w16[k] = gemm ? (const uint16_t *)src : NULL;
    *at += gemm ? 0 : numel;
}

/* bf16/fp16: queues on s the casts of layer l's tensors into the device's fp32 scratch
 * (before its forward, and again before its backward: the other layers used the scratch
 * in between). One cast per tensor per use: the trainer keeps no fp32 copy. */
pst_status exec_enqueue_weights(tr_exec *ex, exec_dev *d, pst_stream *s, int l)
{
    const pst_layer *ly = &ex->model->layers[l];
    if (!ex->lowp || ly->cls->weights_unread)
        return PST_OK;
    for (int k = 0; k < ly->ntensors; k++) {
        const pst_cast_args *c = &d->casts[l * PST_LAYER_MAX_TENSORS + k];
        if (c->n > 0) /* a bf16 GEMM weight is read in place: nothing to queue */
            PST_TRY(pst_op_cast(s, c));
    }
    return PST_OK;
}
