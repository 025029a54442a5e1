/* test_cuda_nogpu.c — what of the CUDA support can be checked on a machine without a GPU
 * (common/runtime/device.c's CUDA specs, common/runtime/cuda/).
 *
 * In every build: CUDA specs are parsed before anything else (bad ones are
 * PST_ERR_INVALID with an example), and a good one on a machine or build that cannot serve
 * it is PST_ERR_UNSUPPORTED with one line that names the spec and ends with
 * "use PSTRAIN_DEVICES=cpu:N". With CUDA built: that line says "no CUDA GPU available" and
 * carries the CUDA runtime's reason; PST_CUDA_CHECK formats cudaError_t, cublasStatus_t
 * and ncclResult_t failures as "<call> failed at <file>:<line>: <message> (<name>)" and maps
 * them to statuses — run on synthetic error values, which needs no device. On a machine
 * WITH a GPU the no-GPU tests skip themselves (the GPU path is test_ops/test_collectives). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/runtime/device.h"
#include "common/error.h"
#ifdef PSTRAIN_HAVE_CUDA
#include "common/runtime/cuda/cuda_check.h"
#endif

/* 1 when CUDA is built and a GPU can be used (then the no-GPU path cannot be observed). */
static int gpu_present(void)
{
#ifdef PSTRAIN_HAVE_CUDA
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
    return 0;
#endif
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

Test(cuda_spec, unavailable_cuda_is_one_clear_line)
{
    if (gpu_present())
        cr_skip_test("a GPU is present: the no-GPU error cannot happen here");
    static const char *const specs[] = {"cuda", "cuda:0", "cuda:0,1", "cuda:3,1,2"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        pst_runtime *rt = (pst_runtime *)&specs; /* must be reset to NULL */
        pst_error_clear();
        pst_status st = pst_runtime_init(&rt, specs[i]);
        const char *d = pst_error_detail();
        cr_assert_eq(st, PST_ERR_UNSUPPORTED, "\"%s\" -> %s (%s)", specs[i], pst_strerror(st),
                     d);
        cr_assert_null(rt);
        char named[64];
        snprintf(named, sizeof named, "PSTRAIN_DEVICES=%s: ", specs[i]);
        cr_assert(strncmp(d, named, strlen(named)) == 0, "detail does not start with %s: %s",
                  named, d);
#ifdef PSTRAIN_HAVE_CUDA
        cr_assert(strncmp(d + strlen(named), "no CUDA GPU available: ",
                          strlen("no CUDA GPU available: ")) == 0, "%s", d);
        cr_assert(strstr(d, "cudaGetDeviceCount") != NULL, "the CUDA reason is missing: %s", d);
#else
        cr_assert(strncmp(d + strlen(named), "this build has no CUDA backend",
                          strlen("this build has no CUDA backend")) == 0, "%s", d);
#endif
        cr_assert(ends_with(d, "; use PSTRAIN_DEVICES=cpu:N"), "%s", d);
        cr_assert_null(strchr(d, '\n'), "more than one line: %s", d);
    }
}

Test(cuda_spec, malformed_cuda_specs_are_invalid_with_an_example)
{
    static const char *const bad[] = {"cuda:x", "cuda:0,0", "cuda:-1", "cuda:", "cuda:0,",
                                      "cuda:,1", "cuda:1;2", "cuda:64", "cuda0", "CUDA:0",
                                      "cuda:0 ", "cuda:1,1,2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pst_runtime *rt = (pst_runtime *)&bad;
        pst_error_clear();
        pst_status st = pst_runtime_init(&rt, bad[i]);
        const char *d = pst_error_detail();
        cr_assert_eq(st, PST_ERR_INVALID, "\"%s\" -> %s (%s)", bad[i], pst_strerror(st), d);
        cr_assert_null(rt);
        cr_assert(strstr(d, "e.g. cpu:2") != NULL, "\"%s\": no example: %s", bad[i], d);
        cr_assert(strstr(d, "cuda[:i,j,...]") != NULL, "\"%s\": CUDA form not shown: %s",
                  bad[i], d);
    }
    pst_error_clear();
    pst_runtime *rt = NULL;
    cr_assert_eq(pst_runtime_init(&rt, "cuda:0,0"), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "listed twice") != NULL, "%s", pst_error_detail());
}

Test(cuda_spec, cpu_specs_are_untouched)
{
    pst_runtime *rt = NULL;
    cr_assert_eq(pst_runtime_init(&rt, "cpu:3"), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(pst_runtime_backend(rt), PST_BACKEND_CPU);
    cr_assert_str_eq(pst_device_name(pst_runtime_device(rt, 2)), "cpu:2");
    pst_runtime_free(rt);
}

#ifdef PSTRAIN_HAVE_CUDA

/* Functions with PST_CUDA_CHECK on a synthetic result: they return what the macro
 * returns, or PST_OK after a success. `line` receives the line of the check. */
static int check_line;

static cudaError_t fake_cuda(cudaError_t r)
{
    return r;
}

static pst_status checked_cuda(cudaError_t r)
{
    check_line = __LINE__ + 1;
    PST_CUDA_CHECK(fake_cuda(r));
    return PST_OK;
}

static cublasStatus_t fake_blas(cublasStatus_t r)
{
    return r;
}

static pst_status checked_blas(cublasStatus_t r)
{
    check_line = __LINE__ + 1;
    PST_CUDA_CHECK(fake_blas(r));
    return PST_OK;
}

static ncclResult_t fake_nccl(ncclResult_t r)
{
    return r;
}

static pst_status checked_nccl(ncclResult_t r)
{
    check_line = __LINE__ + 1;
    PST_CUDA_CHECK(fake_nccl(r));
    return PST_OK;
}

Test(cuda_check, formats_a_cuda_runtime_error)
{
    pst_error_clear();
    cr_assert_eq(checked_cuda(cudaErrorInvalidValue), PST_ERR_INTERNAL);
    char want[256];
    snprintf(want, sizeof want,
             "fake_cuda(r) failed at test_cuda_nogpu.c:%d: invalid argument "
             "(cudaErrorInvalidValue)",
             check_line);
    cr_assert_str_eq(pst_error_detail(), want);

    cr_assert_eq(checked_cuda(cudaErrorMemoryAllocation), PST_ERR_NOMEM);
    cr_assert(strstr(pst_error_detail(), "(cudaErrorMemoryAllocation)") != NULL, "%s",
              pst_error_detail());
    cr_assert_eq(checked_cuda(cudaErrorNoDevice), PST_ERR_UNSUPPORTED);
    cr_assert_eq(checked_cuda(cudaErrorInsufficientDriver), PST_ERR_UNSUPPORTED);

    pst_error_set(PST_ERR_IO, "untouched");
    cr_assert_eq(checked_cuda(cudaSuccess), PST_OK);
    cr_assert_str_eq(pst_error_detail(), "untouched", "a success must not set a detail");
}

Test(cuda_check, formats_a_cublas_error)
{
    pst_error_clear();
    cr_assert_eq(checked_blas(CUBLAS_STATUS_INVALID_VALUE), PST_ERR_INTERNAL);
    char want[256];
    snprintf(want, sizeof want, "fake_blas(r) failed at test_cuda_nogpu.c:%d: %s (%s)",
             check_line, cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE),
             "CUBLAS_STATUS_INVALID_VALUE");
    cr_assert_str_eq(pst_error_detail(), want);
    cr_assert_eq(checked_blas(CUBLAS_STATUS_ALLOC_FAILED), PST_ERR_NOMEM);
    cr_assert_eq(checked_blas(CUBLAS_STATUS_NOT_INITIALIZED), PST_ERR_UNSUPPORTED);
    cr_assert_eq(checked_blas(CUBLAS_STATUS_SUCCESS), PST_OK);
}

Test(cuda_check, formats_an_nccl_error)
{
    pst_error_clear();
    cr_assert_eq(checked_nccl(ncclInvalidArgument), PST_ERR_INVALID);
    char want[256];
    snprintf(want, sizeof want, "fake_nccl(r) failed at test_cuda_nogpu.c:%d: %s (%s)",
             check_line, ncclGetErrorString(ncclInvalidArgument), "ncclInvalidArgument");
    cr_assert(strncmp(pst_error_detail(), want, strlen(want)) == 0, "%s\nwant %s",
              pst_error_detail(), want);
    cr_assert_eq(checked_nccl(ncclSystemError), PST_ERR_IO);
    cr_assert_eq(checked_nccl(ncclRemoteError), PST_ERR_UNAVAILABLE);
    cr_assert_eq(checked_nccl(ncclUnhandledCudaError), PST_ERR_INTERNAL);
    cr_assert_eq(checked_nccl(ncclSuccess), PST_OK);
}

#else

Test(cuda_check, needs_a_cuda_build)
{
    fprintf(stderr, "[SKIP] test_cuda_nogpu: PST_CUDA_CHECK tests skipped: this build has no "
                    "CUDA backend\n");
    cr_skip_test("skipped: built without CUDA");
}

#endif
