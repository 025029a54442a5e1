/* ops_cpu.c — the CPU ops: each op is a host function queued on the stream that calls
 * the reference kernel (layers.h, dtype.h) with the caller's argument struct; the linear
 * layers split their work over the args' thread pool. */
#include <math.h>
#include <string.h>

#include "common/nn/layers.h"
#include "common/nn/seq_layers.h"
#include "common/nn/ctr_layers.h"
#include "common/nn/ops_impl.h"
#include "common/pool.h"

/* The linear layer's parts: slices of the output's rows, or of its columns cut at 16
 * floats (one cache line) so the parts never write the same line (by_rows says which). A
 * part whose slice is empty (a 10-wide output over 2 threads) does nothing. The number of
 * parts can change the last bits: the GEMM libraries give an element other bits in a GEMM
 * call of another shape (AMD EPYC, Haswell kernels; see tests/test_exec.c's reference
 * test), so the same run with another thread count may end with other bits; the same
 * count always gives the same cuts. The weight gradient is split on whole tiles instead
 * (PST_ROW_TILE), because there the executor's chunks, not the threads, decide the cuts.
 *
 * Rows rather than columns of the output when a part's rows pack less: by rows a part
 * packs its rows of the input and all of the weight, by columns all of the input and its
 * rows of the weight, so rows when the batch is larger than the output (the GPT's 2048
 * tokens against 128-512 outputs; the MLP's 128 rows against 1024 outputs stay on columns),
 * and whole rows are zeroed in one pass. Also when the output is too narrow for 16 floats
 * per part (a 10-class output), so that every part computes instead of one. */
static int by_rows(int B, int width, int nparts)
{
    return nparts > 1 && B >= 2 * nparts && (B > width || width < 16 * nparts);
}

/* Part [lo, hi) of an output (B, width) split by rows or by columns, as a block: rows
 * [*b0, *b0 + *nb), columns [*c0, *c1). */
static void part_block(int rows, size_t lo, size_t hi, int B, int width, size_t *b0, int *nb,
                       int *c0, int *c1)
{
    *b0 = rows ? lo : 0;
    *nb = rows ? (int)(hi - lo) : B;
    *c0 = rows ? 0 : (int)lo;
    *c1 = rows ? width : (int)hi;
}

static void linear_fwd_part(void *arg, int part, int nparts)
{
    const pst_linear_fwd_args *a = arg;
    const int rows = by_rows(a->B, a->OC, nparts);
    size_t lo, hi, b0;
    int nb, c0, c1;
    pst_pool_split((size_t)(rows ? a->B : a->OC), part, nparts, rows ? 1 : 16, &lo, &hi);
    part_block(rows, lo, hi, a->B, a->OC, &b0, &nb, &c0, &c1);
    float *out = a->out + b0 * (size_t)a->OC;
    const float *inp = a->inp + b0 * (size_t)a->IC;
    if (a->w16)
        pst_linear_forward_cols_bf16(out, inp, a->w16, a->b, nb, a->IC, a->OC, a->relu, c0, c1);
    else
        pst_linear_forward_cols(out, inp, a->w, a->b, nb, a->IC, a->OC, a->relu, c0, c1);
}

/* Rows [j0, j1) of the weight gradient, in bf16 when the args carry w16. */
static void wgrad_rows(const pst_linear_bwd_args *a, int j0, int j1)
{
    (a->w16 ? pst_linear_backward_weight_rows_bf16 : pst_linear_backward_weight_rows)(
        a->dw, a->db, a->dout, a->inp, a->B, a->IC, a->OC, a->accumulate, j0, j1);
}

static void linear_bwd_part(void *arg, int part, int nparts)
{
    const pst_linear_bwd_args *a = arg;
    size_t lo, hi;
    const int r0 = a->row1 ? a->row0 : 0, r1 = a->row1 ? a->row1 : a->OC;
    if (a->dw) {
        /* whole tiles to each thread (r0 is a multiple of PST_ROW_TILE): the bits do not
         * depend on the number of threads */
        pst_pool_split((size_t)(r1 - r0), part, nparts, PST_ROW_TILE, &lo, &hi);
        if (!a->rows_done) {
            wgrad_rows(a, r0 + (int)lo, r0 + (int)hi);
        } else { /* tile by tile (the same calls: layers.h), each handed on while in cache */
            for (int r = r0 + (int)lo, e; r < r0 + (int)hi; r = e) {
                e = pst_row_tile_end(r, r0 + (int)hi);
                wgrad_rows(a, r, e);
                a->rows_done(a->rows_arg, r, e);
            }
        }
    }
    if (a->dinp) {
        const int64_t B = a->B, IC = a->IC, OC = a->OC;
        /* dinp (B, IC) by rows or columns as the forward; items of `cost` multiply-adds */
        const int rows = by_rows(a->B, a->IC, nparts), align = rows ? 1 : 16;
        const int64_t items = rows ? B : IC, cost = rows ? IC * OC : B * OC;
        if (a->dw) /* balanced against the weight-gradient tiles each part has */
            pst_linear_dinp_part(items, cost, align, r1 - r0, B * IC, part, nparts, &lo, &hi);
        else
            pst_pool_split((size_t)items, part, nparts, (size_t)align, &lo, &hi);
        size_t b0;
        int nb, c0, c1;
        part_block(rows, lo, hi, a->B, a->IC, &b0, &nb, &c0, &c1);
        float *d = a->dinp + b0 * (size_t)IC;
        if (a->w16)
            pst_linear_backward_input_cols_bf16(d, a->dout + b0 * (size_t)OC, a->w16, nb, a->IC,
                                                a->OC, c0, c1);
        else
            pst_linear_backward_input_cols(d, a->dout + b0 * (size_t)OC, a->w, nb, a->IC,
                                           a->OC, c0, c1);
        if (a->mask) /* while this block of dinp is in cache */
            pst_relu_backward_cols(d, a->mask + b0 * (size_t)IC, nb, a->IC, c0, c1);
    }
}

/* A host function that runs `part` over the args' pool (NULL pool: inline). */
#define POOL_RUN(name, type, part)                                \
    static pst_status name(void *arg)                             \
    {                                                             \
        pst_pool_run(((const type *)arg)->pool, part, arg);       \
        return PST_OK;                                            \
    }
POOL_RUN(run_linear_fwd, pst_linear_fwd_args, linear_fwd_part)
POOL_RUN(run_linear_bwd, pst_linear_bwd_args, linear_bwd_part)

static pst_status run_relu_bwd(void *arg)
{
    const pst_relu_bwd_args *a = arg;
    pst_relu_backward(a->dinp, a->dout, a->out, a->n);
    return PST_OK;
}

static pst_status run_xent(void *arg)
{
    const pst_xent_args *a = arg;
    const int group = a->group > 1 ? a->group : 1;
    int correct = 0;
    double group_sum = 0.0;
    for (int b = 0; b < a->B; b++) {
        const float *l = a->logits + (int64_t)b * a->C;
        float *p = a->dlogits + (int64_t)b * a->C;
        int best = 0;
        for (int j = 1; j < a->C; j++)
            best = l[j] > l[best] ? j : best;
        correct += best == a->targets[b];
        /* one row through the reference kernel keeps the arithmetic identical */
        double loss = pst_softmax_xent_forward(p, l, a->targets + b, 1, a->C);
        if (group == 1) {
            a->losses[b] = (float)loss;
        } else {
            group_sum += loss;
            if ((b + 1) % group == 0) {
                a->losses[b / group] = (float)(group_sum / group);
                group_sum = 0.0;
            }
        }
        if (a->scale != 0.0f)
            pst_softmax_xent_backward(p, p, a->targets + b, 1, a->C, a->scale);
    }
    if (a->correct)
        *a->correct += correct;
    return PST_OK;
}

PST_BIT_EXACT_CLONES
static void add_part(void *arg, int part, int nparts)
{
    const pst_add_args *a = arg;
    size_t lo, hi;
    if (a->bias) { /* by rows */
        const size_t w = (size_t)a->width;
        pst_pool_split(a->n / w, part, nparts, 1, &lo, &hi);
        for (size_t r = lo; r < hi; r++) {
            float *d = a->dst + r * w;
            const float *s = a->src + r * w;
            for (size_t j = 0; j < w; j++)
                d[j] = (d[j] + a->bias[j]) + s[j];
        }
        return;
    }
    pst_pool_split(a->n, part, nparts, 16, &lo, &hi);
    for (size_t i = lo; i < hi; i++)
        a->dst[i] += a->src[i];
}

/* Elementwise: split over the pool (the split changes no bit) unless too small to pay. */
static pst_status run_add(void *arg)
{
    const pst_add_args *a = arg;
    pst_pool_run(a->n >= 32768 ? a->pool : NULL, add_part, (void *)arg);
    return PST_OK;
}

static void cast_part(void *arg, int part, int nparts)
{
    const pst_cast_args *a = arg;
    size_t lo, hi;
    pst_pool_split(a->n, part, nparts, 16, &lo, &hi);
    pst_cast((char *)a->dst + lo * pst_dtype_size(a->dt), a->dt,
             (const char *)a->src + lo * pst_dtype_size(a->st), a->st, hi - lo);
}

/* Elementwise: split over the pool (the split changes no bit) unless too small to pay. */
static pst_status run_cast(void *arg)
{
    const pst_cast_args *a = arg;
    pst_pool_run(a->n >= 32768 ? a->pool : NULL, cast_part, arg);
    return PST_OK;
}

/* ---- the sequence ops ---- */

static void embedding_fwd_part(void *arg, int part, int nparts)
{
    const pst_embedding_fwd_args *a = arg;
    size_t c0, c1;
    pst_pool_split((size_t)a->C, part, nparts, 16, &c0, &c1);
    pst_embedding_forward(a->out, a->tokens, a->wte, a->wpe, a->B, a->T, a->C, (int)c0, (int)c1);
}

static void embedding_bwd_part(void *arg, int part, int nparts)
{
    const pst_embedding_bwd_args *a = arg;
    size_t c0, c1;
    pst_pool_split((size_t)a->C, part, nparts, 16, &c0, &c1);
    if (a->dwte)
        pst_embedding_backward(a->dwte, NULL, a->dout, a->tokens, a->B, a->T, a->C, a->V,
                               a->wte_accumulate, (int)c0, (int)c1);
    if (a->dwpe)
        pst_embedding_backward(NULL, a->dwpe, a->dout, a->tokens, a->B, a->T, a->C, a->V,
                               a->wpe_accumulate, (int)c0, (int)c1);
}

static void layernorm_fwd_part(void *arg, int part, int nparts)
{
    const pst_layernorm_args *a = arg;
    size_t r0, r1;
    pst_pool_split((size_t)a->N, part, nparts, 1, &r0, &r1);
    pst_layernorm_forward(a->out, a->mean, a->rstd, a->inp, a->w, a->b, a->N, a->C, (int)r0,
                          (int)r1);
}

/* dinp by rows, dw and db by columns (each column's sum over rows in row order). */
static void layernorm_bwd_part(void *arg, int part, int nparts)
{
    const pst_layernorm_args *a = arg;
    size_t lo, hi;
    if (a->dinp) {
        pst_pool_split((size_t)a->N, part, nparts, 1, &lo, &hi);
        pst_layernorm_backward_input(a->dinp, a->dout, a->inp, a->w, a->saved_mean,
                                     a->saved_rstd, a->N, a->C, a->res, (int)lo, (int)hi);
    }
    if (a->dw) {
        pst_pool_split((size_t)a->C, part, nparts, 16, &lo, &hi);
        pst_layernorm_backward_params(a->dw, a->db, a->dout, a->inp, a->saved_mean,
                                      a->saved_rstd, a->N, a->C, a->accumulate, (int)lo,
                                      (int)hi);
    }
}

static void attention_fwd_part(void *arg, int part, int nparts)
{
    const pst_attention_args *a = arg;
    size_t lo, hi;
    pst_pool_split((size_t)a->B * (size_t)a->H, part, nparts, 1, &lo, &hi);
    pst_attention_forward(a->out, a->lse, a->probs, a->qkv, a->B, a->T, a->C, a->H,
                          a->scratch + (size_t)part * (size_t)PST_ATTENTION_SCRATCH(a->T),
                          (int)lo, (int)hi);
}

static void attention_bwd_part(void *arg, int part, int nparts)
{
    const pst_attention_args *a = arg;
    size_t lo, hi;
    pst_pool_split((size_t)a->B * (size_t)a->H, part, nparts, 1, &lo, &hi);
    pst_attention_backward(a->dqkv, a->dout, a->qkv, a->saved_lse, a->saved_probs, a->B, a->T,
                           a->C, a->H,
                           a->scratch + (size_t)part * (size_t)PST_ATTENTION_SCRATCH(a->T),
                           (int)lo, (int)hi);
}

static void gelu_fwd_part(void *arg, int part, int nparts)
{
    const pst_gelu_args *a = arg;
    size_t lo, hi;
    if (a->bias) { /* by rows */
        pst_pool_split((size_t)(a->n / a->width), part, nparts, 1, &lo, &hi);
        const size_t at = lo * (size_t)a->width;
        pst_gelu_forward_bias(a->out + at, a->deriv ? a->deriv + at : NULL, a->inp + at, a->bias,
                              (int64_t)(hi - lo), a->width);
        return;
    }
    pst_pool_split((size_t)a->n, part, nparts, 16, &lo, &hi);
    if (a->deriv)
        pst_gelu_forward_deriv(a->out + lo, a->deriv + lo, a->inp + lo, (int64_t)(hi - lo));
    else
        pst_gelu_forward(a->out + lo, a->inp + lo, (int64_t)(hi - lo));
}

static void gelu_bwd_part(void *arg, int part, int nparts)
{
    const pst_gelu_args *a = arg;
    size_t lo, hi;
    if (a->dbias) { /* by columns: each bias entry's sum is one part's, in row order */
        pst_pool_split((size_t)a->width, part, nparts, 16, &lo, &hi);
        pst_gelu_backward_dbias(a->out, a->dbias, a->deriv, a->dout, a->n / a->width, a->width,
                                a->accumulate, (int)lo, (int)hi);
        return;
    }
    pst_pool_split((size_t)a->n, part, nparts, 16, &lo, &hi);
    if (a->deriv)
        pst_gelu_backward_deriv(a->out + lo, a->deriv + lo, a->dout + lo, (int64_t)(hi - lo));
    else
        pst_gelu_backward(a->out + lo, a->inp + lo, a->dout + lo, (int64_t)(hi - lo));
}

static void interact_fwd_part(void *arg, int part, int nparts)
{
    const pst_interact_args *a = arg;
    size_t lo, hi;
    pst_pool_split((size_t)a->B, part, nparts, 1, &lo, &hi);
    pst_interact_forward(a->out, a->bottom, a->emb, a->emb_stride, a->F, a->dim, (int)lo,
                         (int)hi);
}

static void interact_bwd_part(void *arg, int part, int nparts)
{
    const pst_interact_args *a = arg;
    size_t lo, hi;
    pst_pool_split((size_t)a->B, part, nparts, 1, &lo, &hi);
    pst_interact_backward(a->dbottom, a->demb, a->demb_stride, a->dout, a->bottom, a->emb,
                          a->emb_stride, a->F, a->dim, (int)lo, (int)hi);
}

static pst_status run_bce(void *arg)
{
    const pst_bce_args *a = arg;
    pst_bce_logits(a->losses, a->dlogits, a->logits, a->labels, a->scale, 0, a->B);
    return PST_OK;
}

POOL_RUN(run_interact_fwd, pst_interact_args, interact_fwd_part)
POOL_RUN(run_interact_bwd, pst_interact_args, interact_bwd_part)
POOL_RUN(run_embedding_fwd, pst_embedding_fwd_args, embedding_fwd_part)
POOL_RUN(run_embedding_bwd, pst_embedding_bwd_args, embedding_bwd_part)
POOL_RUN(run_layernorm_fwd, pst_layernorm_args, layernorm_fwd_part)
POOL_RUN(run_layernorm_bwd, pst_layernorm_args, layernorm_bwd_part)
POOL_RUN(run_attention_fwd, pst_attention_args, attention_fwd_part)
POOL_RUN(run_attention_bwd, pst_attention_args, attention_bwd_part)
POOL_RUN(run_gelu_fwd, pst_gelu_args, gelu_fwd_part)
POOL_RUN(run_gelu_bwd, pst_gelu_args, gelu_bwd_part)

#define CPU_OP(name, type, fn)                              \
    static pst_status name(pst_stream *s, const type *a)    \
    {                                                       \
        return pst_stream_launch(s, fn, (void *)a);         \
    }
CPU_OP(cpu_linear_forward, pst_linear_fwd_args, run_linear_fwd)
CPU_OP(cpu_linear_backward, pst_linear_bwd_args, run_linear_bwd)
CPU_OP(cpu_relu_backward, pst_relu_bwd_args, run_relu_bwd)
CPU_OP(cpu_softmax_xent, pst_xent_args, run_xent)
CPU_OP(cpu_add, pst_add_args, run_add)
CPU_OP(cpu_cast, pst_cast_args, run_cast)
CPU_OP(cpu_embedding_forward, pst_embedding_fwd_args, run_embedding_fwd)
CPU_OP(cpu_embedding_backward, pst_embedding_bwd_args, run_embedding_bwd)
CPU_OP(cpu_layernorm_forward, pst_layernorm_args, run_layernorm_fwd)
CPU_OP(cpu_layernorm_backward, pst_layernorm_args, run_layernorm_bwd)
CPU_OP(cpu_attention_forward, pst_attention_args, run_attention_fwd)
CPU_OP(cpu_attention_backward, pst_attention_args, run_attention_bwd)
CPU_OP(cpu_gelu_forward, pst_gelu_args, run_gelu_fwd)
CPU_OP(cpu_gelu_backward, pst_gelu_args, run_gelu_bwd)
CPU_OP(cpu_interact_forward, pst_interact_args, run_interact_fwd)
CPU_OP(cpu_interact_backward, pst_interact_args, run_interact_bwd)
CPU_OP(cpu_bce_logits, pst_bce_args, run_bce)

const pst_ops_iface pst_cpu_ops_iface = {
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .relu_backward = cpu_relu_backward,
    .softmax_xent = cpu_softmax_xent,
    .add = cpu_add,
    .cast = cpu_cast,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .interact_forward = cpu_interact_forward,
    .interact_backward = cpu_interact_backward,
    .bce_logits = cpu_bce_logits,
};
