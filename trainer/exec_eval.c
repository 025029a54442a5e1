/* exec_eval.c — the executor's evaluation and results (see exec.h): forward without
 * gradients on device 0 (or the pipeline's chunks one after another), the loss and
 * accuracy over a data set, class probabilities, and the parameters read back. */
#include "trainer/exec.h"

#include <stdlib.h>

#include "common/memory.h"
#include "trainer/exec_pipe.h"
#include "trainer/exec_step.h"

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
    exec_use_newest_params(ex);
    PST_TRY(pst_memcpy_async(s, d->x, x, sizeof(float) * (size_t)rows * (size_t)m->in_width,
                             PST_COPY_HOST_TO_DEVICE));
    PST_TRY(y ? pst_memcpy_async(s, d->y, y, ybytes, PST_COPY_HOST_TO_DEVICE)
              : pst_memset_async(s, d->y, 0, ybytes));
    if (ex->sparse_width) {
        if (!ex->sparse_in)
            return pst_error_set(PST_ERR_INVALID, "model %s reads sparse rows: call "
                                 "tr_exec_set_sparse before evaluating", m->name);
        PST_TRY(pst_memcpy_async(s, d->sparse, ex->sparse_in,
                                 sizeof(float) * (size_t)rows * ex->sparse_width,
                                 PST_COPY_HOST_TO_DEVICE));
    }
    for (int k = 0; k < ex->L; k++) {
        PST_TRY(exec_enqueue_weights(ex, d, s, k));
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
        exec_use_newest_params(ex);
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
        exec_use_newest_params(ex);
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
    PST_FREE_ALL(hx, hy, idx);
    return st;
}

pst_status tr_exec_params(tr_exec *ex, float *dst)
{
    exec_use_newest_params(ex);
    exec_dev *d = &ex->devs[0];
    const size_t n = ex->model->nparams;
    char *to = ex->lowp ? (char *)ex->host_lowp : (char *)dst;
    if (!ex->stage_local) {
        PST_TRY(pst_memcpy_async(d->compute, to, d->params, ex->psize * n,
                                 PST_COPY_DEVICE_TO_HOST));
        PST_TRY(pst_stream_synchronize(d->compute));
    }
    /* A CPU pipeline: each block from its owner, the stage that holds it. */
    for (int b = 0; ex->stage_local && b < ex->plan->nblocks; b++) {
        const tr_block *blk = &ex->plan->blocks[b];
        exec_dev *o = &ex->devs[blk->owner_device];
        PST_TRY(pst_memcpy_async(o->compute, to + blk->offset * ex->psize,
                                 ex->blocks[b].pbufs[blk->owner_device],
                                 blk->length * ex->psize, PST_COPY_DEVICE_TO_HOST));
    }
    for (int i = 0; ex->stage_local && i < ex->D; i++)
        PST_TRY(pst_stream_synchronize(ex->devs[i].compute));
    if (ex->lowp)
        pst_cast(dst, PST_F32, ex->host_lowp, ex->pdt, n);
    return PST_OK;
}
