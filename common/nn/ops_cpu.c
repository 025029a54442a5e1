/* ops_cpu.c — the CPU ops: each op is a host function queued on the stream that calls
 * the reference kernel (layers.h, optim.h, dtype.h) with the caller's argument struct;
 * the linear layers and the optimizer split their work over the args' thread pool. */
#include <math.h>
#include <string.h>

#include "common/nn/layers.h"
#include "common/nn/ops_impl.h"
#include "common/runtime/pool.h"

/* The linear layer's parts: slices of the output cut at 16 floats (one cache line), so the
 * parts never write the same line. A part whose slice is empty (a 10-wide output over 2
 * threads) does nothing. The number of parts can change the last bits: OpenBLAS's kernels
 * give a column other bits in a GEMM call of another width (AMD EPYC, Haswell kernels; see
 * tests/test_exec.c's reference test), so the same run with another thread count may end
 * with other bits. The weight gradient is split on whole tiles instead (PST_ROW_TILE),
 * because there the executor's chunks, not the threads, decide the cuts. */
static void linear_fwd_part(void *arg, int part, int nparts)
{
    const pst_linear_fwd_args *a = arg;
    size_t j0, j1;
    pst_pool_split((size_t)a->OC, part, nparts, 16, &j0, &j1);
    pst_linear_forward_cols(a->out, a->inp, a->w, a->b, a->B, a->IC, a->OC, a->relu, (int)j0,
                            (int)j1);
}

static void linear_bwd_part(void *arg, int part, int nparts)
{
    const pst_linear_bwd_args *a = arg;
    size_t lo, hi;
    if (a->dw) {
        const int r0 = a->row1 ? a->row0 : 0, r1 = a->row1 ? a->row1 : a->OC;
        /* whole tiles to each thread (r0 is a multiple of PST_ROW_TILE): the bits do not
         * depend on the number of threads */
        pst_pool_split((size_t)(r1 - r0), part, nparts, PST_ROW_TILE, &lo, &hi);
        pst_linear_backward_weight_rows(a->dw, a->db, a->dout, a->inp, a->B, a->IC, a->OC,
                                        a->accumulate, r0 + (int)lo, r0 + (int)hi);
    }
    if (a->dinp) {
        pst_pool_split((size_t)a->IC, part, nparts, 16, &lo, &hi);
        pst_linear_backward_input_cols(a->dinp, a->dout, a->w, a->B, a->IC, a->OC, (int)lo,
                                       (int)hi);
    }
}

static pst_status run_linear_fwd(void *arg)
{
    pst_pool_run(((const pst_linear_fwd_args *)arg)->pool, linear_fwd_part, arg);
    return PST_OK;
}

static pst_status run_linear_bwd(void *arg)
{
    pst_pool_run(((const pst_linear_bwd_args *)arg)->pool, linear_bwd_part, arg);
    return PST_OK;
}

static pst_status run_relu_bwd(void *arg)
{
    const pst_relu_bwd_args *a = arg;
    pst_relu_backward(a->dinp, a->dout, a->out, a->n);
    return PST_OK;
}

static pst_status run_xent(void *arg)
{
    const pst_xent_args *a = arg;
    int correct = 0;
    for (int b = 0; b < a->B; b++) {
        const float *l = a->logits + (int64_t)b * a->C;
        float *p = a->dlogits + (int64_t)b * a->C;
        int best = 0;
        for (int j = 1; j < a->C; j++)
            best = l[j] > l[best] ? j : best;
        correct += best == a->targets[b];
        /* one row through the reference kernel keeps the arithmetic identical */
        double loss = pst_softmax_xent_forward(p, l, a->targets + b, 1, a->C);
        a->losses[b] = (float)loss;
        if (a->scale != 0.0f)
            pst_softmax_xent_backward(p, p, a->targets + b, 1, a->C, a->scale);
    }
    if (a->correct)
        *a->correct += correct;
    return PST_OK;
}

static pst_status run_add(void *arg)
{
    const pst_add_args *a = arg;
    for (size_t i = 0; i < a->n; i++)
        a->dst[i] += a->src[i];
    return PST_OK;
}

static void optim_part(void *arg, int part, int nparts)
{
    const pst_optim_args *a = arg;
    size_t lo, hi;
    pst_pool_split(a->n, part, nparts, 16, &lo, &hi);
    /* cannot fail: pst_op_optim_apply checked the config, t and the state */
    (void)pst_optim_apply(a->cfg, a->t, a->param + lo, a->state ? a->state + lo : NULL,
                          a->state_stride, a->grad + lo, hi - lo);
}

static pst_status run_optim(void *arg)
{
    pst_pool_run(((const pst_optim_args *)arg)->pool, optim_part, arg);
    return PST_OK;
}

static pst_status run_cast(void *arg)
{
    const pst_cast_args *a = arg;
    pst_cast(a->dst, a->dt, a->src, a->st, a->n);
    return PST_OK;
}

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
CPU_OP(cpu_optim_apply, pst_optim_args, run_optim)
CPU_OP(cpu_cast, pst_cast_args, run_cast)

const pst_ops_iface pst_cpu_ops_iface = {
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .relu_backward = cpu_relu_backward,
    .softmax_xent = cpu_softmax_xent,
    .add = cpu_add,
    .optim_apply = cpu_optim_apply,
    .cast = cpu_cast,
};
