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

/* A library's result code and the status it is reported as; codes not listed are
 * PST_ERR_INTERNAL. One table a library. */
typedef struct code_status {
    int code;
    pst_status st;
} code_status;

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static pst_status status_of(const code_status *map, size_t n, int code)
{
    for (size_t i = 0; i < n; i++)
        if (map[i].code == code)
            return map[i].st;
    return PST_ERR_INTERNAL;
}

static const code_status rt_codes[] = {
    {cudaErrorMemoryAllocation, PST_ERR_NOMEM},
    {cudaErrorNoDevice, PST_ERR_UNSUPPORTED},
    {cudaErrorInsufficientDriver, PST_ERR_UNSUPPORTED},
    {cudaErrorNotSupported, PST_ERR_UNSUPPORTED},
    {cudaErrorInvalidDevice, PST_ERR_UNSUPPORTED},
};

static const code_status blas_codes[] = {
    {CUBLAS_STATUS_ALLOC_FAILED, PST_ERR_NOMEM},
    {CUBLAS_STATUS_NOT_INITIALIZED, PST_ERR_UNSUPPORTED},
    {CUBLAS_STATUS_NOT_SUPPORTED, PST_ERR_UNSUPPORTED},
    {CUBLAS_STATUS_ARCH_MISMATCH, PST_ERR_UNSUPPORTED},
};

static const code_status nccl_codes[] = {
    {ncclInvalidArgument, PST_ERR_INVALID},
    {ncclInvalidUsage, PST_ERR_INVALID},
    {ncclSystemError, PST_ERR_IO},
    {ncclRemoteError, PST_ERR_UNAVAILABLE},
};

/* A library's failure as its status, with the detail
 * "<call> failed at <file>:<line>: <what> (<name>)<more>". */
static pst_status failed(const code_status *map, size_t n, int code, const char *call,
                         const char *file, int line, const char *what, const char *name,
                         const char *more)
{
    return pst_error_set(status_of(map, n, code), "%s failed at %s:%d: %s (%s)%s", call,
                         base_name(file), line, what, name, more);
}

pst_status pst_cuda_check_rt(cudaError_t r, const char *call, const char *file, int line)
{
    return r == cudaSuccess ? PST_OK
                            : failed(rt_codes, COUNT(rt_codes), (int)r, call, file, line,
                                     cudaGetErrorString(r), cudaGetErrorName(r), "");
}

pst_status pst_cuda_check_blas(cublasStatus_t r, const char *call, const char *file, int line)
{
    return r == CUBLAS_STATUS_SUCCESS
               ? PST_OK
               : failed(blas_codes, COUNT(blas_codes), (int)r, call, file, line,
                        cublasGetStatusString(r), cublasGetStatusName(r), "");
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
    /* NCCL keeps a longer explanation of the last failure on this thread. */
    const char *last = ncclGetLastError(NULL);
    char more[PST_ERROR_DETAIL_MAX] = "";
    if (last && last[0])
        snprintf(more, sizeof more, ": %s", last);
    return failed(nccl_codes, COUNT(nccl_codes), (int)r, call, file, line,
                  ncclGetErrorString(r), nccl_name(r), more);
}
