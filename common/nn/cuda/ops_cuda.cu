/* ops_cuda.cu — the model's ops on the CUDA backend (ops.h, ops_impl.h): cuBLAS GEMMs and
 * the kernels around them.
 *
 * Built with PSTRAIN_HAVE_CUDA only. COMPILED HERE, NOT RUN: machines without a GPU never
 * reach these launches; tests/test_ops.c compares every op with the CPU reference when a
 * GPU is present (`make test-gpu`).
 *
 * DESIGN. Each op reads its argument struct when it is queued (ops.h allows it), launches
 * on the stream's cudaStream_t and returns. Ops on a stream whose status is already sticky
 * are dropped (device.h). Kernels follow llm.c: outputs, inputs, then sizes; grid-stride
 * loops over size_t indices. Where the CPU reference is a fixed sequence of correctly
 * rounded float operations (bias, ReLU, bias gradient column sums, add, every optimizer,
 * casts) the kernels perform the same operations in the same order with the _rn
 * intrinsics, which nvcc never contracts into FMAs: those results are bit-identical to the
 * CPU's. GEMMs (cuBLAS) and the softmax (expf/logf, a tree reduction of the row sum) differ
 * by rounding, within the tolerances of tests/test_ops.c.
 *
 * Row-major vs cuBLAS. cuBLAS is column-major. A row-major (r, c) matrix with leading
 * dimension c is, read column-major, its transpose (c, r) with the same leading dimension.
 * So each row-major product C = A @ B is computed as the column-major C^T = B^T @ A^T, with
 * the operands swapped; the transposes are worked out at each call below. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/runtime/cuda/cuda_check.h"
#include "common/runtime/cuda/cuda_impl.h"

extern "C" {
#include "common/nn/ops_impl.h"
#include "common/dtype_math.h"
#include "common/nn/optim_math.h"
}

/* Threads per block of the elementwise kernels; blocks are capped, the loops stride. */
#define PST_CUDA_THREADS 256
#define PST_CUDA_MAX_BLOCKS 4096

static unsigned blocks_for(size_t n)
{
    size_t b = (n + PST_CUDA_THREADS - 1) / PST_CUDA_THREADS;
    return (unsigned)(b < PST_CUDA_MAX_BLOCKS ? (b ? b : 1) : PST_CUDA_MAX_BLOCKS);
}

#define GRID_STRIDE(i, n)                                                                  \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (size_t)gridDim.x * blockDim.x)

/* ---- linear: bias (+ReLU), bias gradient ------------------------------------------- */

/* out (B, OC) += bias (OC), then ReLU when relu: v = o + b; v > 0 ? v : 0 (layers.c). */
static __global__ void bias_act_kernel(float *out, const float *bias, size_t B, size_t OC,
                                       int relu)
{
    GRID_STRIDE(i, B * OC)
    {
        float v = __fadd_rn(out[i], bias[i % OC]);
        out[i] = relu ? (v > 0.0f ? v : 0.0f) : v;
    }
}

/* dbias (OC) = (accumulate ? dbias : 0) + dout[0] + dout[1] + ..., rows in order, one
 * thread per column: the same additions in the same order as layers.c (bit-identical). */
static __global__ void bias_grad_kernel(float *dbias, const float *dout, int B, int n, int ld,
                                        int accumulate)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n)
        return;
    float acc = accumulate ? dbias[j] : 0.0f;
    for (int b = 0; b < B; b++)
        acc = __fadd_rn(acc, dout[(size_t)b * ld + j]);
    dbias[j] = acc;
}

static cudaError_t launch_bias_act(cudaStream_t s, float *out, const float *bias, int B, int OC,
                                   int relu)
{
    size_t n = (size_t)B * OC;
    bias_act_kernel<<<blocks_for(n), PST_CUDA_THREADS, 0, s>>>(out, bias, (size_t)B, (size_t)OC,
                                                               relu);
    return cudaGetLastError();
}

/* Columns [0, n) of dout (B rows, leading dimension ld) into dbias[0, n). */
static cudaError_t launch_bias_grad(cudaStream_t s, float *dbias, const float *dout, int B,
                                    int n, int ld, int accumulate)
{
    unsigned blocks = (unsigned)((n + PST_CUDA_THREADS - 1) / PST_CUDA_THREADS);
    bias_grad_kernel<<<blocks, PST_CUDA_THREADS, 0, s>>>(dbias, dout, B, n, ld, accumulate);
    return cudaGetLastError();
}

/* Row-major C (m, n) = op(A) @ op(B) + beta*C in fp32 with fp32 accumulation, through the
 * column-major cuBLAS call described at each use. */
static pst_status gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                       int n, int k, const float *A, int lda, const float *B, int ldb,
                       float beta, float *C, int ldc)
{
    const float alpha = 1.0f;
    PST_CUDA_CHECK(cublasGemmEx(h, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F,
                                ldb, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
    return PST_OK;
}

static pst_status cuda_linear_forward(pst_stream *s, const pst_linear_fwd_args *a)
{
    cudaStream_t cs;
    cublasHandle_t h;
    int skip;
    PST_TRY(pst_cuda_stream_begin(s, &cs, &skip));
    if (skip)
        return PST_OK;
    PST_TRY(pst_cuda_blas_acquire(s, &h));
    /* Row-major out (B, OC) = inp (B, IC) @ w^T, w (OC, IC).
     * Column-major: out^T (OC, B) = w (OC, IC) @ inp^T (IC, B), where
     *   the buffer of w, read column-major, is w^T (IC, OC), ld IC  -> op T gives (OC, IC);
     *   the buffer of inp is inp^T (IC, B), ld IC                    -> op N;
     *   out^T (OC, B) has ld OC. */
    pst_status st = gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, a->OC, a->B, a->IC, a->w, a->IC, a->inp,
                         a->IC, 0.0f, a->out, a->OC);
    pst_cuda_blas_release(s);
    PST_TRY(st);
    PST_CUDA_CHECK(launch_bias_act(cs, a->out, a->b, a->B, a->OC, a->relu));
    return PST_OK;
}

static pst_status cuda_linear_backward(pst_stream *s, const pst_linear_bwd_args *a)
{
    cudaStream_t cs;
    cublasHandle_t h;
    int skip;
    PST_TRY(pst_cuda_stream_begin(s, &cs, &skip));
    if (skip)
        return PST_OK;
    /* Weight-gradient rows [r0, r1): columns r0.. of dout, rows r0.. of dw and db. */
    const int r0 = a->row1 ? a->row0 : 0, r1 = a->row1 ? a->row1 : a->OC;
    if (a->db)
        PST_CUDA_CHECK(launch_bias_grad(cs, a->db + r0, a->dout + r0, a->B, r1 - r0, a->OC,
                                        a->accumulate));
    PST_TRY(pst_cuda_blas_acquire(s, &h));
    /* Row-major dw (OC, IC) (+)= dout^T (OC, B) @ inp (B, IC).
     * Column-major: dw^T (IC, OC) = inp^T (IC, B) @ dout (B, OC), where
     *   the buffer of inp is inp^T (IC, B), ld IC     -> op N;
     *   the buffer of dout is dout^T (OC, B), ld OC   -> op T gives (B, OC);
     *   dw^T (IC, OC) has ld IC; beta 1 accumulates. */
    pst_status st = PST_OK;
    /* One GEMM per tile of PST_ROW_TILE rows, as on CPU (layers.h): the same calls, so the
     * same bits, however the executor cuts the layer. */
    for (int r = r0, e; a->dw && st == PST_OK && r < r1; r = e) {
        e = r - r % PST_ROW_TILE + PST_ROW_TILE; /* the end of r's tile */
        e = e < r1 ? e : r1;
        st = gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, a->IC, e - r, a->B, a->inp, a->IC, a->dout + r,
                  a->OC, a->accumulate ? 1.0f : 0.0f, a->dw + (size_t)r * a->IC, a->IC);
    }
    /* Row-major dinp (B, IC) = dout (B, OC) @ w (OC, IC).
     * Column-major: dinp^T (IC, B) = w^T (IC, OC) @ dout^T (OC, B), where
     *   the buffer of w is w^T (IC, OC), ld IC        -> op N;
     *   the buffer of dout is dout^T (OC, B), ld OC   -> op N;
     *   dinp^T (IC, B) has ld IC. */
    if (st == PST_OK && a->dinp)
        st = gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, a->IC, a->B, a->OC, a->w, a->IC, a->dout,
                  a->OC, 0.0f, a->dinp, a->IC);
    pst_cuda_blas_release(s);
    return st;
}

/* ---- ReLU backward, add -------------------------------------------------------------- */

static __global__ void relu_backward_kernel(float *dinp, const float *dout, const float *out,
                                            size_t n)
{
    GRID_STRIDE(i, n)
    dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

static __global__ void add_kernel(float *dst, const float *src, size_t n)
{
    GRID_STRIDE(i, n)
    dst[i] = __fadd_rn(dst[i], src[i]);
}

static cudaError_t launch_relu_backward(cudaStream_t s, float *dinp, const float *dout,
                                        const float *out, size_t n)
{
    relu_backward_kernel<<<blocks_for(n), PST_CUDA_THREADS, 0, s>>>(dinp, dout, out, n);
    return cudaGetLastError();
}

static cudaError_t launch_add(cudaStream_t s, float *dst, const float *src, size_t n)
{
    add_kernel<<<blocks_for(n), PST_CUDA_THREADS, 0, s>>>(dst, src, n);
    return cudaGetLastError();
}

static pst_status cuda_relu_backward(pst_stream *s, const pst_relu_bwd_args *a)
{
    cudaStream_t cs;
    int skip;
    PST_TRY(pst_cuda_stream_begin(s, &cs, &skip));
    if (skip)
        return PST_OK;
    PST_CUDA_CHECK(launch_relu_backward(cs, a->dinp, a->dout, a->out, (size_t)a->n));
    return PST_OK;
}

static pst_status cuda_add(pst_stream *s, const pst_add_args *a)
{
    cudaStream_t cs;
    int skip;
    PST_TRY(pst_cuda_stream_begin(s, &cs, &skip));
    if (skip)
        return PST_OK;
    /* src on another GPU is read through peer access (enabled at runtime init). */
    PST_CUDA_CHECK(launch_add(cs, a->dst, a->src, a->n));
    return PST_OK;
}

/* ---- softmax cross-entropy ------------------------------------------------------------- */

#define XENT_THREADS 256

/* One block per row b: probs = softmax(logits[b]); losses[b] = log(sum) - (l[t] - max);
 * correct += argmax == target (first index of the maximum, as ops_cpu.c); dlogits[b] =
 * (probs - onehot) * scale, or probs when scale == 0. A target outside [0, C) gives a NaN
 * loss instead of reading out of bounds. */
static __global__ void xent_kernel(float *losses, int32_t *correct, float *dlogits,
                                   const float *logits, const int32_t *targets, int C,
                                   float scale)
{
    __shared__ float red_v[XENT_THREADS];
    __shared__ int red_i[XENT_THREADS];
    const int b = blockIdx.x, tid = threadIdx.x;
    const float *l = logits + (size_t)b * C;
    float *p = dlogits + (size_t)b * C;

    /* max and first argmax */
    float mv = -INFINITY;
    int mi = C;
    for (int j = tid; j < C; j += blockDim.x) /* j grows: the thread's first maximum */
        if (mi == C || l[j] > mv) {
            mv = l[j];
            mi = j;
        }
    red_v[tid] = mv;
    red_i[tid] = mi;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (tid < w) {
            float ov = red_v[tid + w];
            int oi = red_i[tid + w];
            if (oi < C && (red_i[tid] == C || ov > red_v[tid] ||
                           (ov == red_v[tid] && oi < red_i[tid]))) {
                red_v[tid] = ov;
                red_i[tid] = oi;
            }
        }
        __syncthreads();
    }
    const float maxv = red_v[0];
    const int best = red_i[0];
    __syncthreads();

    /* exponentials and their sum */
    float sum = 0.0f;
    for (int j = tid; j < C; j += blockDim.x) {
        float e = expf(__fsub_rn(l[j], maxv));
        p[j] = e;
        sum = __fadd_rn(sum, e);
    }
    red_v[tid] = sum;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (tid < w)
            red_v[tid] = __fadd_rn(red_v[tid], red_v[tid + w]);
        __syncthreads();
    }
    const float total = red_v[0];
    const float inv = __fdiv_rn(1.0f, total);
    const int t = targets[b];
    for (int j = tid; j < C; j += blockDim.x) {
        float q = __fmul_rn(p[j], inv);
        if (scale != 0.0f) {
            q = __fmul_rn(q, scale);
            if (j == t)
                q = __fsub_rn(q, scale);
        }
        p[j] = q;
    }
    if (tid == 0) {
        float loss = (t >= 0 && t < C) ? __fsub_rn(logf(total), __fsub_rn(l[t], maxv)) : NAN;
        losses[b] = loss;
        if (correct && best == t)
            atomicAdd(correct, 1);
    }
}

static cudaError_t launch_xent(cudaStream_t s, const pst_xent_args *a)
{
    xent_kernel<<<a->B, XENT_THREADS, 0, s>>>(a->losses, a->correct, a->dlogits, a->logits,
                                              a->targets, a->C, a->scale);
    return cudaGetLastError();
}

static pst_status cuda_softmax_xent(pst_stream *s, const pst_xent_args *a)
{
    cudaStream_t cs;
    int skip;
    PST_TRY(pst_cuda_stream_begin(s, &cs, &skip));
    if (skip)
        return PST_OK;
    PST_CUDA_CHECK(launch_xent(cs, a));
    return PST_OK;
}

/* ---- optimizers (optim.h) ------------------------------------------------------------- */

/* The per-element steps and the per-call scalars are optim_math.h's, shared with optim.c:
 * the same operations, each rounded once (the _rn intrinsics there), the same bits. */
static __global__ void sgd_kernel(float *p, const float *g, size_t n, float lr, float wd)
{
    GRID_STRIDE(i, n)
    {
        float d = wd != 0.0f ? pst_optim_l2(g[i], wd, p[i]) : g[i];
        p[i] = pst_optim_descend(p[i], lr, d);
    }
}

static __global__ void momentum_kernel(float *p, float *buf, const float *g, size_t n,
                                       float lr, float mu, float wd)
{
    GRID_STRIDE(i, n)
    {
        float d = wd != 0.0f ? pst_optim_l2(g[i], wd, p[i]) : g[i];
        float bv = pst_optim_momentum(buf[i], mu, d);
        buf[i] = bv;
        p[i] = pst_optim_descend(p[i], lr, bv);
    }
}

static __global__ void adam_kernel(float *p, float *m, float *v, const float *g, size_t n,
                                   pst_optim_scalars s)
{
    GRID_STRIDE(i, n)
    {
        float d = s.l2 ? pst_optim_l2(g[i], s.wd, p[i]) : g[i];
        float vv = pst_optim_adam_v(v[i], s.b2, s.omb2, d);
        float mm = pst_optim_adam_m(m[i], s.b1, s.omb1, d);
        m[i] = mm;
        v[i] = vv;
        p[i] = pst_optim_adam_param(p[i], mm, PST_FSQRT(vv), s.decay, s.step_size, s.bc2_sqrt,
                                    s.eps);
    }
}

static cudaError_t launch_optim(cudaStream_t st, const pst_optim_args *a,
                                const pst_optim_scalars *s)
{
    const unsigned blocks = blocks_for(a->n);
    switch (a->cfg->kind) {
    case PST_OPTIM_SGD:
        sgd_kernel<<<blocks, PST_CUDA_THREADS, 0, st>>>(a->param, a->grad, a->n, s->lr, s->wd);
        break;
    case PST_OPTIM_MOMENTUM:
        momentum_kernel<<<blocks, PST_CUDA_THREADS, 0, st>>>(a->param, a->state, a->grad, a->n,
                                                             s->lr, s->mu, s->wd);
        break;
    case PST_OPTIM_ADAM:
    case PST_OPTIM_ADAMW:
        adam_kernel<<<blocks, PST_CUDA_THREADS, 0, st>>>(
            a->param, a->state, a->state + a->state_stride, a->grad, a->n, *s);
        break;
    default:
        return cudaSuccess; /* optim.h: an unknown kind leaves everything unchanged */
    }
    return cudaGetLastError();
}

static pst_status cuda_optim_apply(pst_stream *s, const pst_optim_args *a)
{
    cudaStream_t cs;
    int skip;
    PST_TRY(pst_cuda_stream_begin(s, &cs, &skip));
    if (skip)
        return PST_OK;
    /* The config is host memory, read now (ops.h: CUDA reads arguments when queued). */
    const pst_optim_config *cfg = a->cfg;
    pst_optim_scalars sc;
    pst_optim_scalars_at(cfg, a->t, pst_lr_at(cfg, a->t), &sc);
    PST_CUDA_CHECK(launch_optim(cs, a, &sc));
    return PST_OK;
}

/* ---- casts (dtype_math.h on the device: dtype.c's bit arithmetic, the same bits) ------- */

/* Element i of a buffer of type t, through memcpy so that unaligned buffers work too
 * (dtype.h promises no alignment); nvcc emits plain loads when it can. */
__device__ static float load_elem(const void *src, int t, size_t i)
{
    uint16_t h;
    if (t == PST_F32) {
        float f;
        memcpy(&f, (const char *)src + 4 * i, 4);
        return f;
    }
    memcpy(&h, (const char *)src + 2 * i, 2);
    return t == PST_F16 ? pst_f32_from_f16(h) : pst_f32_from_bf16(h);
}

__device__ static void store_elem(void *dst, int t, size_t i, float f)
{
    if (t == PST_F32) {
        memcpy((char *)dst + 4 * i, &f, 4);
        return;
    }
    uint16_t h = t == PST_F16 ? pst_f16_from_f32(f) : pst_bf16_from_f32(f);
    memcpy((char *)dst + 2 * i, &h, 2);
}

static __global__ void cast_kernel(void *dst, int dt, const void *src, int st, size_t n)
{
    GRID_STRIDE(i, n)
    store_elem(dst, dt, i, load_elem(src, st, i));
}

static cudaError_t launch_cast(cudaStream_t s, const pst_cast_args *a)
{
    if (a->dt == a->st) {
        if (a->dst == a->src)
            return cudaSuccess;
        return cudaMemcpyAsync(a->dst, a->src, a->n * (a->dt == PST_F32 ? 4 : 2),
                               cudaMemcpyDeviceToDevice, s);
    }
    cast_kernel<<<blocks_for(a->n), PST_CUDA_THREADS, 0, s>>>(a->dst, (int)a->dt, a->src,
                                                              (int)a->st, a->n);
    return cudaGetLastError();
}

static pst_status cuda_cast(pst_stream *s, const pst_cast_args *a)
{
    cudaStream_t cs;
    int skip;
    PST_TRY(pst_cuda_stream_begin(s, &cs, &skip));
    if (skip)
        return PST_OK;
    PST_CUDA_CHECK(launch_cast(cs, a));
    return PST_OK;
}

extern "C" const pst_ops_iface pst_cuda_ops_iface = {
    cuda_linear_forward, cuda_linear_backward, cuda_relu_backward, cuda_softmax_xent,
    cuda_add,            cuda_optim_apply,     cuda_cast,
};
