/* gemm.h — the fp32 GEMM of the CPU layers: OpenBLAS's cblas_sgemm or oneDNN's dnnl_sgemm,
 * one library for the whole process, picked once at start (pst_sgemm_setup).
 *
 * Both run single-threaded on the calling thread (the ops split a layer over their own
 * thread team). The library is part of the arithmetic: each sums a product in its own
 * order, so the parameters' bits depend on it (and on the CPU's kernels), as they do on
 * OpenBLAS's kernel family. Every process of a job that should agree bit for bit must use
 * the same one. */
#ifndef PST_NN_GEMM_H
#define PST_NN_GEMM_H

#include <stddef.h>

/* pst_sgemm_setup's libraries. */
enum { PST_SGEMM_OPENBLAS, PST_SGEMM_ONEDNN };

/* Picks the library for the process before any thread calls pst_sgemm; msg gets one line
 * naming it (for oneDNN, its version). Returns the library in use: oneDNN when asked and
 * its call works here, else OpenBLAS, with the reason in msg. Not thread safe: call it once
 * at start. */
int pst_sgemm_setup(int lib, char *msg, size_t n);

/* The library pst_sgemm uses (PST_SGEMM_OPENBLAS until pst_sgemm_setup picks another). */
int pst_sgemm_lib(void);

/* C (M, N) = op(A) (M, K) @ op(B) (K, N) * alpha + beta * C, row-major (trans_a: A is
 * stored (K, M) with row stride lda; trans_b: B is stored (N, K)); cblas_sgemm's contract
 * (beta 0: C is not read). A product oneDNN fails (out of memory) is computed by OpenBLAS,
 * with one warning for the process. */
void pst_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
               int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* Holds the calling thread's oneDNN calls to that thread (one OpenMP thread), once per
 * thread: every oneDNN product of the CPU layers (this file's and gemm_bf16.h's) runs on
 * the thread that calls it. */
void pst_omp_single_thread(void);

#endif
