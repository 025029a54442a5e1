/* cuda_check.c — formatting and status mapping behind PST_CUDA_CHECK (cuda_check.h).
 *
 * Every function here works without a GPU: the libraries' error strings are static
 * tables, so the no-GPU tests exercise the exact text a GPU failure would print. */
#include "common/runtime/cuda/cuda_check.h"

#include <stdio.h>

/* The file name without its directories, so details stay short and stable. */
static const char *base_name(const char *file)
{
    const char *b = file;
    for (const char *p = file; *p; p++)
        if (*p == '/')
            b = p + 1;
    return b;
}

pst_status pst_cuda_check_rt(cudaError_t r, const char *call, const char *file, int line)
{
    if (r == cudaSuccess)
        return PST_OK;
    pst_status st;
    switch (r) {
    case cudaErrorMemoryAllocation:
        st = PST_ERR_NOMEM;
        break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNotSupported:
    case cudaErrorInvalidDevice:
        st = PST_ERR_UNSUPPORTED;
        break;
    default:
        st = PST_ERR_INTERNAL;
        break;
    }
    return pst_error_set(st, "%s failed at %s:%d: %s (%s)", call, base_name(file), line,
                         cudaGetErrorString(r), cudaGetErrorName(r));
}

pst_status pst_cuda_check_blas(cublasStatus_t r, const char *call, const char *file, int line)
{
    if (r == CUBLAS_STATUS_SUCCESS)
        return PST_OK;
    pst_status st;
    switch (r) {
    case CUBLAS_STATUS_ALLOC_FAILED:
        st = PST_ERR_NOMEM;
        break;
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
        st = PST_ERR_UNSUPPORTED;
        break;
    default:
        st = PST_ERR_INTERNAL;
        break;
    }
    return pst_error_set(st, "%s failed at %s:%d: %s (%s)", call, base_name(file), line,
                         cublasGetStatusString(r), cublasGetStatusName(r));
}

static const char *nccl_name(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult?";
    }
}

pst_status pst_cuda_check_nccl(ncclResult_t r, const char *call, const char *file, int line)
{
    if (r == ncclSuccess)
        return PST_OK;
    pst_status st;
    switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        st = PST_ERR_INVALID;
        break;
    case ncclSystemError:
        st = PST_ERR_IO;
        break;
    case ncclRemoteError:
        st = PST_ERR_UNAVAILABLE;
        break;
    default:
        st = PST_ERR_INTERNAL;
        break;
    }
    /* NCCL keeps a longer explanation of the last failure on this thread. */
    const char *last = ncclGetLastError(NULL);
    return pst_error_set(st, "%s failed at %s:%d: %s (%s)%s%s", call, base_name(file), line,
                         ncclGetErrorString(r), nccl_name(r), last && last[0] ? ": " : "",
                         last ? last : "");
}
