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
 * rounded float operations (bias, ReLU, bias gradient column sums, add,
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
#include "common/nn/seq_layers.h" /* PST_LN_EPS */
#include "common/dtype_math.h"
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
        float v = bias ? __fadd_rn(out[i], bias[i % OC]) : out[i];
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

static pst_status run_linear_forward(pst_stream *s, cudaStream_t cs, const pst_linear_fwd_args *a)
{
    cublasHandle_t h;
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
    if (a->b || a->relu) /* no bias, no ReLU: the GEMM is the layer */
        PST_CUDA_CHECK(launch_bias_act(cs, a->out, a->b, a->B, a->OC, a->relu));
    return PST_OK;
}

static cudaError_t launch_relu_backward(cudaStream_t s, float *dinp, const float *dout,
                                        const float *out, size_t n);

static pst_status run_linear_backward(pst_stream *s, cudaStream_t cs, const pst_linear_bwd_args *a)
{
    cublasHandle_t h;
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
    if (st == PST_OK && a->dinp && a->mask) /* through the input's ReLU, in place */
        PST_CUDA_CHECK(launch_relu_backward(cs, a->dinp, a->dinp, a->mask,
                                            (size_t)a->B * (size_t)a->IC));
    return st;
}

/* ---- ReLU backward, add -------------------------------------------------------------- */

static __global__ void relu_backward_kernel(float *dinp, const float *dout, const float *out,
                                            size_t n)
{
    GRID_STRIDE(i, n)
    dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

/* bias (or NULL): added to each row of `width` first, dst = (dst + bias) + src */
static __global__ void add_kernel(float *dst, const float *src, const float *bias, int width,
                                  size_t n)
{
    GRID_STRIDE(i, n)
    dst[i] = __fadd_rn(bias ? __fadd_rn(dst[i], bias[i % (size_t)width]) : dst[i], src[i]);
}

static cudaError_t launch_relu_backward(cudaStream_t s, float *dinp, const float *dout,
                                        const float *out, size_t n)
{
    relu_backward_kernel<<<blocks_for(n), PST_CUDA_THREADS, 0, s>>>(dinp, dout, out, n);
    return cudaGetLastError();
}

static cudaError_t launch_add(cudaStream_t s, float *dst, const float *src, const float *bias,
                              int width, size_t n)
{
    add_kernel<<<blocks_for(n), PST_CUDA_THREADS, 0, s>>>(dst, src, bias, width, n);
    return cudaGetLastError();
}

static pst_status run_relu_backward(pst_stream *, cudaStream_t cs, const pst_relu_bwd_args *a)
{
    PST_CUDA_CHECK(launch_relu_backward(cs, a->dinp, a->dout, a->out, (size_t)a->n));
    return PST_OK;
}

static pst_status run_add(pst_stream *, cudaStream_t cs, const pst_add_args *a)
{
    /* src on another GPU is read through peer access (enabled at runtime init). */
    PST_CUDA_CHECK(launch_add(cs, a->dst, a->src, a->bias, a->width, a->n));
    return PST_OK;
}

/* ---- softmax cross-entropy ------------------------------------------------------------- */

#define XENT_THREADS 256

/* One block per group of `group` rows (1: per row), its rows one after another; row b:
 * probs = softmax(logits[b]); loss = log(sum) - (l[t] - max), written to losses[b], or with
 * group > 1 summed in row order in double and written as the group's mean (ops_cpu.c);
 * correct += argmax == target (first index of the maximum, as ops_cpu.c); dlogits[b] =
 * (probs - onehot) * scale, or probs when scale == 0. A target outside [0, C) gives a NaN
 * loss instead of reading out of bounds. */
static __global__ void xent_kernel(float *losses, int32_t *correct, float *dlogits,
                                   const float *logits, const int32_t *targets, int C,
                                   float scale, int group)
{
    __shared__ float red_v[XENT_THREADS];
    __shared__ int red_i[XENT_THREADS];
    const int tid = threadIdx.x;
    double group_sum = 0.0;
    for (int b = blockIdx.x * group; b < (blockIdx.x + 1) * group; b++) {
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
            if (group == 1)
                losses[b] = loss;
            group_sum += (double)loss;
            if (correct && best == t)
                atomicAdd(correct, 1);
        }
        __syncthreads(); /* the next row reuses red_v, red_i */
    }
    if (tid == 0 && group > 1)
        losses[blockIdx.x] = (float)(group_sum / group);
}

static cudaError_t launch_xent(cudaStream_t s, const pst_xent_args *a)
{
    const int group = a->group > 1 ? a->group : 1;
    xent_kernel<<<a->B / group, XENT_THREADS, 0, s>>>(a->losses, a->correct, a->dlogits,
                                                      a->logits, a->targets, a->C, a->scale,
                                                      group);
    return cudaGetLastError();
}

static pst_status run_softmax_xent(pst_stream *, cudaStream_t cs, const pst_xent_args *a)
{
    PST_CUDA_CHECK(launch_xent(cs, a));
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

static pst_status run_cast(pst_stream *, cudaStream_t cs, const pst_cast_args *a)
{
    PST_CUDA_CHECK(launch_cast(cs, a));
    return PST_OK;
}

/* ---- sequence ops (seq_layers.h) ---------------------------------------------------------
 * Simple kernels: a thread per output element, row or column, each sum in ascending order
 * (deterministic, no atomics); the CPU's LayerNorm and softmax row sums add in 16 lanes
 * instead (seq_layers.c), so the two agree to rounding, not bits. The
 * transcendental functions (expf, logf, tanhf) and the attention's recomputed scores
 * differ from glibc by rounding: tests/test_seq_ops.c compares with tolerances. Written
 * for parity first, not speed. */

static __global__ void embedding_fwd_kernel(float *out, const int32_t *tok, const float *wte,
                                            const float *wpe, int T, int C, size_t n)
{
    GRID_STRIDE(i, n)
    {
        const size_t row = i / (size_t)C;
        const int c = (int)(i % (size_t)C), t = (int)(row % (size_t)T);
        out[i] = __fadd_rn(wte[(size_t)tok[row] * C + c], wpe[(size_t)t * C + c]);
    }
}

/* one thread per column: every (b, t) row in order into its token's row */
static __global__ void embedding_bwd_wte_kernel(float *dwte, const float *dout,
                                                const int32_t *tok, int N, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int r = 0; r < N; r++) {
        float *e = dwte + (size_t)tok[r] * C + c;
        *e = __fadd_rn(*e, dout[(size_t)r * C + c]);
    }
}

/* one thread per (t, c): the sequences in order */
static __global__ void embedding_bwd_wpe_kernel(float *dwpe, const float *dout, int B, int T,
                                                int C, int accumulate)
{
    GRID_STRIDE(i, (size_t)T * C)
    {
        float acc = accumulate ? dwpe[i] : 0.0f;
        for (int b = 0; b < B; b++)
            acc = __fadd_rn(acc, dout[(size_t)b * T * C + i]);
        dwpe[i] = acc;
    }
}

static pst_status run_embedding_forward(pst_stream *, cudaStream_t cs,
                                        const pst_embedding_fwd_args *a)
{
    if (!a->B)
        return PST_OK;
    const size_t n = (size_t)a->B * a->T * a->C;
    embedding_fwd_kernel<<<blocks_for(n), PST_CUDA_THREADS, 0, cs>>>(a->out, a->tokens, a->wte,
                                                                      a->wpe, a->T, a->C, n);
    PST_CUDA_CHECK(cudaGetLastError());
    return PST_OK;
}

static pst_status run_embedding_backward(pst_stream *, cudaStream_t cs,
                                         const pst_embedding_bwd_args *a)
{
    if (a->dwte) {
        if (!a->wte_accumulate)
            PST_CUDA_CHECK(cudaMemsetAsync(a->dwte, 0, sizeof(float) * (size_t)a->V * a->C, cs));
        const unsigned blocks = (unsigned)((a->C + PST_CUDA_THREADS - 1) / PST_CUDA_THREADS);
        embedding_bwd_wte_kernel<<<blocks, PST_CUDA_THREADS, 0, cs>>>(a->dwte, a->dout,
                                                                       a->tokens, a->B * a->T,
                                                                       a->C);
        PST_CUDA_CHECK(cudaGetLastError());
    }
    if (a->dwpe) {
        embedding_bwd_wpe_kernel<<<blocks_for((size_t)a->T * a->C), PST_CUDA_THREADS, 0, cs>>>(
            a->dwpe, a->dout, a->B, a->T, a->C, a->wpe_accumulate);
        PST_CUDA_CHECK(cudaGetLastError());
    }
    return PST_OK;
}

/* one thread per row */
static __global__ void layernorm_fwd_kernel(float *out, float *mean, float *rstd,
                                            const float *inp, const float *w, const float *b,
                                            int N, int C)
{
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N)
        return;
    const float *x = inp + (size_t)r * C;
    float m = 0.0f, v = 0.0f;
    for (int c = 0; c < C; c++)
        m = __fadd_rn(m, x[c]);
    m = __fdiv_rn(m, (float)C);
    for (int c = 0; c < C; c++) {
        const float d = __fsub_rn(x[c], m);
        v = __fadd_rn(v, __fmul_rn(d, d));
    }
    v = __fdiv_rn(v, (float)C);
    const float sd = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(v, PST_LN_EPS)));
    float *o = out + (size_t)r * C;
    for (int c = 0; c < C; c++)
        o[c] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[c], m), sd), w[c]), b[c]);
    mean[r] = m;
    rstd[r] = sd;
}

static __global__ void layernorm_bwd_input_kernel(float *dinp, const float *dout,
                                                  const float *inp, const float *w,
                                                  const float *mean, const float *rstd, int N,
                                                  int C, const float *res)
{
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N)
        return;
    const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
    const float m = mean[r], sd = rstd[r];
    float dm = 0.0f, dnm = 0.0f;
    for (int c = 0; c < C; c++) {
        const float norm = __fmul_rn(__fsub_rn(x[c], m), sd), dnorm = __fmul_rn(w[c], d[c]);
        dm = __fadd_rn(dm, dnorm);
        dnm = __fadd_rn(dnm, __fmul_rn(dnorm, norm));
    }
    dm = __fdiv_rn(dm, (float)C);
    dnm = __fdiv_rn(dnm, (float)C);
    float *di = dinp + (size_t)r * C;
    const float *re = res ? res + (size_t)r * C : NULL;
    for (int c = 0; c < C; c++) {
        const float norm = __fmul_rn(__fsub_rn(x[c], m), sd), dnorm = __fmul_rn(w[c], d[c]);
        const float g = __fmul_rn(__fsub_rn(__fsub_rn(dnorm, dm), __fmul_rn(norm, dnm)), sd);
        di[c] = re ? __fadd_rn(re[c], g) : g;
    }
}

/* one thread per column, rows in order */
static __global__ void layernorm_bwd_params_kernel(float *dw, float *db, const float *dout,
                                                   const float *inp, const float *mean,
                                                   const float *rstd, int N, int C,
                                                   int accumulate)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float aw = accumulate ? dw[c] : 0.0f, ab = accumulate ? db[c] : 0.0f;
    for (int r = 0; r < N; r++) {
        const float d = dout[(size_t)r * C + c];
        ab = __fadd_rn(ab, d);
        aw = __fadd_rn(aw, __fmul_rn(__fmul_rn(__fsub_rn(inp[(size_t)r * C + c], mean[r]),
                                               rstd[r]),
                                     d));
    }
    dw[c] = aw;
    db[c] = ab;
}

static unsigned blocks_of(int n)
{
    return (unsigned)((n + PST_CUDA_THREADS - 1) / PST_CUDA_THREADS);
}

static pst_status run_layernorm_forward(pst_stream *, cudaStream_t cs, const pst_layernorm_args *a)
{
    if (!a->N)
        return PST_OK;
    layernorm_fwd_kernel<<<blocks_of(a->N), PST_CUDA_THREADS, 0, cs>>>(
        a->out, a->mean, a->rstd, a->inp, a->w, a->b, a->N, a->C);
    PST_CUDA_CHECK(cudaGetLastError());
    return PST_OK;
}

static pst_status run_layernorm_backward(pst_stream *, cudaStream_t cs, const pst_layernorm_args *a)
{
    if (a->dinp && a->N) {
        layernorm_bwd_input_kernel<<<blocks_of(a->N), PST_CUDA_THREADS, 0, cs>>>(
            a->dinp, a->dout, a->inp, a->w, a->saved_mean, a->saved_rstd, a->N, a->C, a->res);
        PST_CUDA_CHECK(cudaGetLastError());
    }
    if (a->dw) {
        layernorm_bwd_params_kernel<<<blocks_of(a->C), PST_CUDA_THREADS, 0, cs>>>(
            a->dw, a->db, a->dout, a->inp, a->saved_mean, a->saved_rstd, a->N, a->C,
            a->accumulate);
        PST_CUDA_CHECK(cudaGetLastError());
    }
    return PST_OK;
}

/* Attention kernels: one thread per (b, h, position), each summing in ascending order (the
 * CPU kernel, seq_layers.c, sums a row in 16 lanes), so their bits do not depend on how they
 * are split. A head's vectors (hs
 * floats) that a thread reuses are held in registers when hs <= R (R = 32 or 64, chosen at
 * launch); with R = 0 (larger heads) they stay in memory. Either way the same operations
 * run in the same order. */

/* HS_FOR(i): i over the head's hs elements; unrolled over R when the vectors are in
 * registers (the indices must be constants there). */
#define HS_FOR(i)                                                                           \
    _Pragma("unroll") for (int i = 0; i < (R > 0 ? R : hs); i++) if (R == 0 || i < hs)

/* A head vector read many times: R > 0, copied into registers; R == 0, read in memory. */
template <int R> struct head_in {
    float r[R > 0 ? R : 1];
    const float *m;
    __device__ __forceinline__ head_in(const float *src, int hs) : m(src)
    {
        if constexpr (R > 0) {
            HS_FOR(i) r[i] = src[i];
        }
    }
    __device__ __forceinline__ float operator[](int i) const
    {
        if constexpr (R > 0)
            return r[i];
        else
            return m[i];
    }
};

/* A head vector summed into: zeroed, added to, then written once to dst (R == 0: summed
 * in dst itself). */
template <int R> struct head_acc {
    float r[R > 0 ? R : 1];
    float *m;
    __device__ __forceinline__ head_acc(float *dst, int hs) : m(dst)
    {
        HS_FOR(i) (*this)[i] = 0.0f;
    }
    __device__ __forceinline__ float &operator[](int i)
    {
        if constexpr (R > 0)
            return r[i];
        else
            return m[i];
    }
    __device__ __forceinline__ void store(int hs)
    {
        if constexpr (R > 0) {
            HS_FOR(i) m[i] = r[i];
        }
    }
};

/* a . b in element order (a and b: head_in or memory) */
template <int R, typename A, typename B>
static __device__ __forceinline__ float head_dot(const A &a, const B &b, int hs)
{
    float sc = 0.0f;
    HS_FOR(i) sc = __fadd_rn(sc, __fmul_rn(a[i], b[i]));
    return sc;
}

/* One attention thread's (b, h, position) and the offsets every kernel takes from it. qkv
 * holds per token [q | k | v], C floats each; out and dout hold C floats per token; lse and
 * D hold one float per (b, h, position). */
struct attn_thread {
    int pos, h, b, T, C, H, hs;
    float scale; /* 1 / sqrt(hs) */
    /* Which (b, h, position) of the op's this thread is: false past the last one. */
    __device__ __forceinline__ bool init(const pst_attention_args &p)
    {
        const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        if (idx >= (size_t)p.B * p.H * p.T)
            return false;
        T = p.T, C = p.C, H = p.H, hs = p.C / p.H;
        pos = (int)(idx % T), h = (int)((idx / T) % H), b = (int)(idx / ((size_t)T * H));
        scale = __fdiv_rn(1.0f, __fsqrt_rn((float)hs));
        return true;
    }
    /* the offset of position t's query head in qkv (its key head is C further, its value 2C) */
    __device__ __forceinline__ size_t q(int t) const
    {
        return ((size_t)b * T + t) * 3 * C + h * hs;
    }
    __device__ __forceinline__ size_t k(int t) const { return q(t) + C; }
    /* the offset of position t's head in out or dout */
    __device__ __forceinline__ size_t io(int t) const { return ((size_t)b * T + t) * C + h * hs; }
    /* position t's index in lse and D */
    __device__ __forceinline__ size_t row(int t) const { return ((size_t)b * H + h) * T + t; }
};

/* Forward, one thread per query (b, h, t): its scores against keys 0..t are recomputed in
 * each of three passes (maximum, sum of exponentials, weighted values), so no T-wide
 * buffer. */
template <int R>
static __global__ void attention_fwd_kernel(const pst_attention_args args)
{
    attn_thread a;
    if (!a.init(args))
        return;
    const int t = a.pos, hs = a.hs, C = args.C;
    const float *qkv = args.qkv;
    const head_in<R> q(qkv + a.q(t), hs);
    float m = -INFINITY, sum = 0.0f;
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j <= t; j++) {
            const float sc = __fmul_rn(head_dot<R>(q, qkv + a.k(j), hs), a.scale);
            if (pass == 0)
                m = sc > m ? sc : m;
            else
                sum = __fadd_rn(sum, expf(__fsub_rn(sc, m)));
        }
    const float inv = __fdiv_rn(1.0f, sum);
    head_acc<R> o(args.out + a.io(t), hs);
    for (int j = 0; j <= t; j++) {
        const float *k = qkv + a.k(j), *v = k + C;
        const float p =
            __fmul_rn(expf(__fsub_rn(__fmul_rn(head_dot<R>(q, k, hs), a.scale), m)), inv);
        HS_FOR(i) o[i] = __fadd_rn(o[i], __fmul_rn(p, v[i]));
    }
    o.store(hs);
    args.lse[a.row(t)] = __fadd_rn(m, logf(sum));
}

/* The backward in two kernels, with p_tj = exp(s_tj - lse_t), g_tj = dout_t . v_j,
 * ds_tj = p_tj (g_tj - D_t) scale: attention_bwd_query_kernel, for query t: D_t = sum_j
 * p_tj g_tj (j ascending, written to Dbuf), then dq_t = sum_j ds_tj k_j (j ascending);
 * attention_bwd_key_kernel, for key j: dk_j = sum_t ds_tj q_t and dv_j = sum_t p_tj dout_t
 * (t ascending from j). */
template <int R, typename Q, typename K, typename V, typename D>
static __device__ __forceinline__ void attention_bwd_pair(const Q &q, const K &k, const V &v,
                                                          const D &d, int hs, float scale,
                                                          float l, float *p, float *g)
{
    float sc = 0.0f, gg = 0.0f;
    HS_FOR(i)
    {
        sc = __fadd_rn(sc, __fmul_rn(q[i], k[i]));
        gg = __fadd_rn(gg, __fmul_rn(d[i], v[i]));
    }
    *p = expf(__fsub_rn(__fmul_rn(sc, scale), l));
    *g = gg;
}

template <int R>
static __global__ void attention_bwd_query_kernel(const pst_attention_args args, float *Dbuf)
{
    attn_thread a;
    if (!a.init(args))
        return;
    const int t = a.pos, hs = a.hs, C = args.C;
    const head_in<R> q(args.qkv + a.q(t), hs);
    const head_in<R> d(args.dout + a.io(t), hs);
    const float l = args.saved_lse[a.row(t)];
    float D = 0.0f, p, g;
    for (int j = 0; j <= t; j++) {
        const float *k = args.qkv + a.k(j), *v = k + C;
        attention_bwd_pair<R>(q, k, v, d, hs, a.scale, l, &p, &g);
        D = __fadd_rn(D, __fmul_rn(p, g));
    }
    Dbuf[a.row(t)] = D;
    head_acc<R> dq(args.dqkv + a.q(t), hs);
    for (int j = 0; j <= t; j++) {
        const float *k = args.qkv + a.k(j), *v = k + C;
        attention_bwd_pair<R>(q, k, v, d, hs, a.scale, l, &p, &g);
        const float ds = __fmul_rn(__fmul_rn(p, __fsub_rn(g, D)), a.scale);
        HS_FOR(i) dq[i] = __fadd_rn(dq[i], __fmul_rn(ds, k[i]));
    }
    dq.store(hs);
}

template <int R>
static __global__ void attention_bwd_key_kernel(const pst_attention_args args, const float *Dbuf)
{
    attn_thread a;
    if (!a.init(args))
        return;
    const int j = a.pos, hs = a.hs, C = args.C;
    const float *k = args.qkv + a.k(j), *v = k + C;
    float *dkm = args.dqkv + a.k(j);
    head_acc<R> dk(dkm, hs), dv(dkm + C, hs);
    for (int t = j; t < args.T; t++) {
        const float *q = args.qkv + a.q(t), *d = args.dout + a.io(t);
        const size_t r = a.row(t);
        float p, g;
        attention_bwd_pair<R>(q, k, v, d, hs, a.scale, args.saved_lse[r], &p, &g);
        const float ds = __fmul_rn(__fmul_rn(p, __fsub_rn(g, Dbuf[r])), a.scale);
        HS_FOR(i)
        {
            dk[i] = __fadd_rn(dk[i], __fmul_rn(ds, q[i]));
            dv[i] = __fadd_rn(dv[i], __fmul_rn(p, d[i]));
        }
    }
    dk.store(hs);
    dv.store(hs);
}

/* Threads per block of the attention kernels: small blocks, so that a few thousand
 * (b, h, position) threads spread over all the GPU's multiprocessors. */
#define PST_ATTENTION_THREADS 64

/* The register size for head size hs: 32, 64, or 0 (in memory). */
static int attention_regs(int hs)
{
    return hs <= 32 ? 32 : hs <= 64 ? 64 : 0;
}

template <int R>
static cudaError_t launch_attention_fwd(cudaStream_t cs, const pst_attention_args *a)
{
    const int n = a->B * a->H * a->T;
    attention_fwd_kernel<R>
        <<<(n + PST_ATTENTION_THREADS - 1) / PST_ATTENTION_THREADS, PST_ATTENTION_THREADS, 0,
           cs>>>(*a);
    return cudaGetLastError();
}

/* D: B*H*T floats, stream-ordered (freed when the key kernel has run) */
template <int R>
static cudaError_t launch_attention_bwd(cudaStream_t cs, const pst_attention_args *a)
{
    const int n = a->B * a->H * a->T;
    const unsigned blocks = (n + PST_ATTENTION_THREADS - 1) / PST_ATTENTION_THREADS;
    float *D = NULL;
    cudaError_t e = cudaMallocAsync((void **)&D, sizeof(float) * (size_t)n, cs);
    if (e != cudaSuccess)
        return e;
    attention_bwd_query_kernel<R><<<blocks, PST_ATTENTION_THREADS, 0, cs>>>(*a, D);
    e = cudaGetLastError();
    if (e == cudaSuccess) {
        attention_bwd_key_kernel<R><<<blocks, PST_ATTENTION_THREADS, 0, cs>>>(*a, D);
        e = cudaGetLastError();
    }
    const cudaError_t f = cudaFreeAsync(D, cs);
    return e != cudaSuccess ? e : f;
}

/* Forward (BWD false) or backward, its kernels instantiated for the head's register size. */
template <bool BWD>
static pst_status run_attention(pst_stream *, cudaStream_t cs, const pst_attention_args *a)
{
    if (!a->B)
        return PST_OK;
    const int R = attention_regs(a->C / a->H);
    if constexpr (BWD)
        PST_CUDA_CHECK(R == 32   ? launch_attention_bwd<32>(cs, a)
                       : R == 64 ? launch_attention_bwd<64>(cs, a)
                                 : launch_attention_bwd<0>(cs, a));
    else
        PST_CUDA_CHECK(R == 32   ? launch_attention_fwd<32>(cs, a)
                       : R == 64 ? launch_attention_fwd<64>(cs, a)
                                 : launch_attention_fwd<0>(cs, a));
    return PST_OK;
}

#define GELU_S 0.7978845608028654f
#define GELU_K 0.044715f

/* gelu'(x) from x and th = tanh(u(x)), rounded as written: the forward's kept derivative
 * and the backward's own have the same bits. */
static __device__ float gelu_deriv(float x, float th)
{
    const float sech2 = __fsub_rn(1.0f, __fmul_rn(th, th));
    return __fadd_rn(__fmul_rn(0.5f, __fadd_rn(1.0f, th)),
                     __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), sech2), GELU_S),
                               __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * GELU_K, x), x))));
}

static __device__ float gelu_u(float x)
{
    return __fmul_rn(GELU_S, __fadd_rn(x, __fmul_rn(__fmul_rn(__fmul_rn(GELU_K, x), x), x)));
}

/* deriv NULL: out only; else also gelu'(inp) into deriv (which may be inp). bias: added
 * to each row of `width` first (the linear layer's, as the CPU kernel). */
static __global__ void gelu_fwd_kernel(float *out, float *deriv, const float *inp,
                                       const float *bias, int width, size_t n)
{
    GRID_STRIDE(i, n)
    {
        const float x = bias ? __fadd_rn(inp[i], bias[i % (size_t)width]) : inp[i];
        const float th = tanhf(gelu_u(x));
        out[i] = __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, th));
        if (deriv)
            deriv[i] = gelu_deriv(x, th);
    }
}

/* deriv NULL: gelu'(inp) computed here; else the forward's */
static __global__ void gelu_bwd_kernel(float *dinp, const float *inp, const float *deriv,
                                       const float *dout, size_t n)
{
    GRID_STRIDE(i, n)
    {
        const float local = deriv ? deriv[i] : gelu_deriv(inp[i], tanhf(gelu_u(inp[i])));
        dinp[i] = __fmul_rn(local, dout[i]);
    }
}

static pst_status run_gelu_forward(pst_stream *, cudaStream_t cs, const pst_gelu_args *a)
{
    if (!a->n)
        return PST_OK;
    gelu_fwd_kernel<<<blocks_for((size_t)a->n), PST_CUDA_THREADS, 0, cs>>>(
        a->out, a->deriv, a->inp, a->bias, a->width, (size_t)a->n);
    PST_CUDA_CHECK(cudaGetLastError());
    return PST_OK;
}

static pst_status run_gelu_backward(pst_stream *, cudaStream_t cs, const pst_gelu_args *a)
{
    if (!a->n)
        return PST_OK;
    gelu_bwd_kernel<<<blocks_for((size_t)a->n), PST_CUDA_THREADS, 0, cs>>>(
        a->out, a->inp, a->deriv, a->dout, (size_t)a->n);
    PST_CUDA_CHECK(cudaGetLastError());
    if (a->dbias) /* the linear layer's bias gradient, by its kernel: the same bits */
        PST_CUDA_CHECK(launch_bias_grad(cs, a->dbias, a->out, (int)(a->n / a->width), a->width,
                                        a->width, a->accumulate));
    return PST_OK;
}

/* ---- the click model (ctr_layers.h) --------------------------------------------------- */

/* v_f of row b: the bottom output for f = 0, else its (f-1)-th embedding. */
static __device__ __forceinline__ const float *ctr_vec(const float *bottom, const float *emb,
                                                       int emb_stride, int dim, size_t b, int f)
{
    return f == 0 ? bottom + b * dim : emb + b * emb_stride + (size_t)(f - 1) * dim;
}

/* One thread per output element (b, c): the bottom output's columns are copied, a pair's is
 * its dot product, its products added in ascending k without fusing (as the CPU kernel). */
static __global__ void interact_fwd_kernel(float *out, const float *bottom, const float *emb,
                                           int emb_stride, size_t B, int F, int dim)
{
    const int W = dim + (F + 1) * F / 2;
    GRID_STRIDE(idx, B * (size_t)W)
    {
        const size_t b = idx / W;
        const int c = (int)(idx % W);
        if (c < dim) {
            out[idx] = bottom[b * dim + c];
            continue;
        }
        int p = c - dim, i = 1;
        while (p >= i) { /* pair p is (i, j): i(i-1)/2 pairs come before row i */
            p -= i;
            i++;
        }
        const float *vi = ctr_vec(bottom, emb, emb_stride, dim, b, i);
        const float *vj = ctr_vec(bottom, emb, emb_stride, dim, b, p);
        float s = 0.0f;
        for (int k = 0; k < dim; k++)
            s = __fadd_rn(s, __fmul_rn(vi[k], vj[k]));
        out[idx] = s;
    }
}

/* One thread per (b, f, k): v_f's gradient at k, its pairs in the CPU kernel's order: (f, j)
 * for j < f, then (i, f) for i > f. */
static __global__ void interact_bwd_kernel(float *dbottom, float *demb, int demb_stride,
                                           const float *dout, const float *bottom,
                                           const float *emb, int emb_stride, size_t B, int F,
                                           int dim)
{
    const int W = dim + (F + 1) * F / 2;
    GRID_STRIDE(idx, B * (size_t)(F + 1) * dim)
    {
        const size_t b = idx / ((size_t)(F + 1) * dim);
        const int f = (int)(idx / dim % (F + 1)), k = (int)(idx % dim);
        const float *g = dout + b * W;
        float acc = f == 0 ? g[k] : 0.0f;
        for (int j = 0; j < f; j++)
            acc = __fadd_rn(acc, __fmul_rn(g[dim + f * (f - 1) / 2 + j],
                                           ctr_vec(bottom, emb, emb_stride, dim, b, j)[k]));
        for (int i = f + 1; i <= F; i++)
            acc = __fadd_rn(acc, __fmul_rn(g[dim + i * (i - 1) / 2 + f],
                                           ctr_vec(bottom, emb, emb_stride, dim, b, i)[k]));
        if (f == 0)
            dbottom[b * dim + k] = acc;
        else
            demb[b * demb_stride + (size_t)(f - 1) * dim + k] = acc;
    }
}

static __global__ void bce_kernel(float *losses, float *dlogits, const float *logits,
                                  const int32_t *labels, float scale, size_t B)
{
    GRID_STRIDE(b, B)
    {
        const double x = logits[b], y = labels[b];
        losses[b] = (float)(fmax(x, 0.0) - x * y + log1p(exp(-fabs(x))));
        const float p = (float)(1.0 / (1.0 + exp(-x)));
        dlogits[b] = scale == 0.0f ? p : __fmul_rn(__fsub_rn(p, (float)y), scale);
    }
}

static pst_status run_interact_forward(pst_stream *, cudaStream_t cs, const pst_interact_args *a)
{
    const size_t n = (size_t)a->B * (size_t)(a->dim + (a->F + 1) * a->F / 2);
    if (!n)
        return PST_OK;
    interact_fwd_kernel<<<blocks_for(n), PST_CUDA_THREADS, 0, cs>>>(
        a->out, a->bottom, a->emb, a->emb_stride, (size_t)a->B, a->F, a->dim);
    PST_CUDA_CHECK(cudaGetLastError());
    return PST_OK;
}

static pst_status run_interact_backward(pst_stream *, cudaStream_t cs,
                                        const pst_interact_args *a)
{
    const size_t n = (size_t)a->B * (size_t)(a->F + 1) * (size_t)a->dim;
    if (!n)
        return PST_OK;
    interact_bwd_kernel<<<blocks_for(n), PST_CUDA_THREADS, 0, cs>>>(
        a->dbottom, a->demb, a->demb_stride, a->dout, a->bottom, a->emb, a->emb_stride,
        (size_t)a->B, a->F, a->dim);
    PST_CUDA_CHECK(cudaGetLastError());
    return PST_OK;
}

static pst_status run_bce_logits(pst_stream *, cudaStream_t cs, const pst_bce_args *a)
{
    if (!a->B)
        return PST_OK;
    bce_kernel<<<blocks_for((size_t)a->B), PST_CUDA_THREADS, 0, cs>>>(
        a->losses, a->dlogits, a->logits, a->labels, a->scale, (size_t)a->B);
    PST_CUDA_CHECK(cudaGetLastError());
    return PST_OK;
}

/* ---- the op table ---------------------------------------------------------------------
 * Every op begins its stream's work the same way (nothing is queued on a stream that failed
 * before: skip), then runs; as CPU_OP in ops_cpu.c. */
#define CUDA_OP(name, type, run)                                                              \
    static pst_status name(pst_stream *s, const type *a)                                      \
    {                                                                                         \
        cudaStream_t cs;                                                                      \
        int skip;                                                                             \
        PST_TRY(pst_cuda_stream_begin(s, &cs, &skip));                                        \
        return skip ? PST_OK : run(s, cs, a);                                                 \
    }
CUDA_OP(cuda_linear_forward, pst_linear_fwd_args, run_linear_forward)
CUDA_OP(cuda_linear_backward, pst_linear_bwd_args, run_linear_backward)
CUDA_OP(cuda_relu_backward, pst_relu_bwd_args, run_relu_backward)
CUDA_OP(cuda_add, pst_add_args, run_add)
CUDA_OP(cuda_softmax_xent, pst_xent_args, run_softmax_xent)
CUDA_OP(cuda_cast, pst_cast_args, run_cast)
CUDA_OP(cuda_embedding_forward, pst_embedding_fwd_args, run_embedding_forward)
CUDA_OP(cuda_embedding_backward, pst_embedding_bwd_args, run_embedding_backward)
CUDA_OP(cuda_layernorm_forward, pst_layernorm_args, run_layernorm_forward)
CUDA_OP(cuda_layernorm_backward, pst_layernorm_args, run_layernorm_backward)
CUDA_OP(cuda_attention_forward, pst_attention_args, run_attention<false>)
CUDA_OP(cuda_attention_backward, pst_attention_args, run_attention<true>)
CUDA_OP(cuda_gelu_forward, pst_gelu_args, run_gelu_forward)
CUDA_OP(cuda_gelu_backward, pst_gelu_args, run_gelu_backward)
CUDA_OP(cuda_interact_forward, pst_interact_args, run_interact_forward)
CUDA_OP(cuda_interact_backward, pst_interact_args, run_interact_backward)
CUDA_OP(cuda_bce_logits, pst_bce_args, run_bce_logits)

extern "C" const pst_ops_iface pst_cuda_ops_iface = {
    cuda_linear_forward, cuda_linear_backward, cuda_relu_backward, cuda_softmax_xent,
    cuda_add,            cuda_cast,
    cuda_embedding_forward, cuda_embedding_backward, cuda_layernorm_forward,
    cuda_layernorm_backward, cuda_attention_forward, cuda_attention_backward,
    cuda_gelu_forward, cuda_gelu_backward,
    cuda_interact_forward, cuda_interact_backward, cuda_bce_logits,
};
