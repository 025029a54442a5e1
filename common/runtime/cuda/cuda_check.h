/* cuda_check.h — the one checking macro for CUDA runtime, cuBLAS and NCCL calls.
 *
 * Private to the CUDA backend (common/runtime/cuda/, common/nn/cuda/) and its tests. Usage, in a function that
 * returns pst_status:
 *
 *     PST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
 *
 * When the call does not succeed, the macro records the detail
 *     "<call> failed at <file>:<line>: <library message> (<error name>)"
 * with pst_error_set on the calling thread and RETURNS the matching pst_status from the
 * enclosing function. It never prints, exits or aborts (STYLE.md: errors are values).
 * The call's result type picks the library: cudaError_t, cublasStatus_t or ncclResult_t
 * (C11 _Generic in C, overloads in C++/CUDA sources). Kernel launches are checked by
 * wrapping them in a function that returns cudaGetLastError().
 *
 * Status mapping: out of memory -> PST_ERR_NOMEM; no GPU / driver too old / not supported
 * -> PST_ERR_UNSUPPORTED; a bad argument to NCCL -> PST_ERR_INVALID; an NCCL system or
 * remote error -> PST_ERR_IO / PST_ERR_UNAVAILABLE; anything else -> PST_ERR_INTERNAL.
 * Thread safety: the functions below only format into the thread-local detail. */
#ifndef PST_CUDA_CHECK_H
#define PST_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Return PST_OK for a success value; otherwise set the detail described above (`call`
 * is the call's source text) and return the mapped status. */
pst_status pst_cuda_check_rt(cudaError_t r, const char *call, const char *file, int line);
pst_status pst_cuda_check_blas(cublasStatus_t r, const char *call, const char *file,
                               int line);
pst_status pst_cuda_check_nccl(ncclResult_t r, const char *call, const char *file, int line);

#ifdef __cplusplus
}

/* C++ (nvcc) picks the checker by overload; these only forward to the C functions. */
static inline pst_status pst_cuda_check_any(cudaError_t r, const char *c, const char *f, int l)
{
    return pst_cuda_check_rt(r, c, f, l);
}
static inline pst_status pst_cuda_check_any(cublasStatus_t r, const char *c, const char *f,
                                            int l)
{
    return pst_cuda_check_blas(r, c, f, l);
}
static inline pst_status pst_cuda_check_any(ncclResult_t r, const char *c, const char *f, int l)
{
    return pst_cuda_check_nccl(r, c, f, l);
}
#define PST_CUDA_RESULT(r, call) pst_cuda_check_any((r), (call), __FILE__, __LINE__)
#else
#define PST_CUDA_RESULT(r, call)                                                          \
    _Generic((r), cudaError_t: pst_cuda_check_rt, cublasStatus_t: pst_cuda_check_blas,    \
             ncclResult_t: pst_cuda_check_nccl)((r), (call), __FILE__, __LINE__)
#endif

/* Evaluates `call` once, as an expression: PST_OK, or on failure the status, with the
 * detail recorded. */
#define PST_CUDA_STATUS(call) PST_CUDA_RESULT((call), #call)

/* Evaluates `call` once; on failure records the detail and returns the status. */
#define PST_CUDA_CHECK(call)                                                              \
    do {                                                                                  \
        pst_status pst_cuda_st_ = PST_CUDA_RESULT((call), #call);                         \
        if (pst_cuda_st_ != PST_OK)                                                       \
            return pst_cuda_st_;                                                          \
    } while (0)

#endif /* PST_CUDA_CHECK_H */
