/* gemm.c — the fp32 GEMM of the CPU layers (see gemm.h).
 *
 * DESIGN: oneDNN's dnnl_sgemm runs on OpenMP threads (Debian builds it on libgomp); a thread
 * that has not asked for one OpenMP thread would start a team of its own inside every call,
 * competing with the ops' team for the same cores (and summing in another order), so each
 * calling thread sets that once (pst_omp_single_thread; its flag is thread-local). */
#include "common/nn/gemm.h"

#include "common/log.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>

static atomic_int lib_in_use; /* PST_SGEMM_* */
static atomic_int fell_back;  /* a oneDNN call failed: warned once */
static _Thread_local int omp_one;

void pst_omp_single_thread(void)
{
    if (!omp_one) {
        omp_set_num_threads(1);
        omp_one = 1;
    }
}

int pst_sgemm_lib(void)
{
    return atomic_load_explicit(&lib_in_use, memory_order_relaxed);
}

int pst_sgemm_setup(int lib, char *msg, size_t n)
{
    atomic_store(&lib_in_use, PST_SGEMM_OPENBLAS);
    if (lib != PST_SGEMM_ONEDNN) {
        snprintf(msg, n, "fp32 GEMMs: OpenBLAS");
        return PST_SGEMM_OPENBLAS;
    }
    /* one small product, so a oneDNN that cannot run here says so now */
    const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
    float c[4] = {0};
    pst_omp_single_thread();
    const dnnl_version_t *v = dnnl_version();
    const dnnl_status_t st = dnnl_sgemm('N', 'N', 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    if (st != dnnl_success || c[0] != 19.0f || c[3] != 50.0f) {
        snprintf(msg, n, "fp32 GEMMs: OpenBLAS (oneDNN %d.%d.%d's sgemm failed here: status "
                 "%d)", v->major, v->minor, v->patch, (int)st);
        return PST_SGEMM_OPENBLAS;
    }
    snprintf(msg, n, "fp32 GEMMs: oneDNN %d.%d.%d (dnnl_sgemm)", v->major, v->minor, v->patch);
    atomic_store(&lib_in_use, PST_SGEMM_ONEDNN);
    return PST_SGEMM_ONEDNN;
}

void pst_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
               int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (pst_sgemm_lib() == PST_SGEMM_ONEDNN) {
        pst_omp_single_thread();
        const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K,
                                            alpha, A, lda, B, ldb, beta, C, ldc);
        if (st == dnnl_success)
            return;
        /* out of memory for its packing: OpenBLAS computes it (other last bits) */
        if (!atomic_exchange(&fell_back, 1))
            PST_WARN("oneDNN's sgemm failed (status %d, %dx%dx%d): OpenBLAS computes the "
                     "products it fails, with other last bits", (int)st, M, N, K);
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
}
