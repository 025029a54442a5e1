/* cuda_impl.h — private interface of the CUDA backend (common/runtime/cuda/), shared by the
 * runtime (device_cuda.c), the ops (common/nn/cuda/ops_cuda.cu) and the NCCL collectives
 * (collectives_nccl.c). device.c reaches the backend only through device_impl.h. Compiled only with PSTRAIN_HAVE_CUDA.
 * Includable from C and from CUDA C++: it exposes CUDA handles behind pst_ objects without
 * the C-only layout of device_impl.h (which uses <stdatomic.h>).
 *
 * Device naming: device.c names device i of a CUDA runtime "cuda:<GPU ordinal>" (for
 * "cuda:3,1" device 0 is "cuda:3"); the runtime reads the ordinal back from the name. */
#ifndef PST_CUDA_IMPL_H
#define PST_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/runtime/device.h"
#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif


/* The GPU ordinal of a CUDA device (its name's number). */
int pst_cuda_device_ordinal(const pst_device *dev);

/* Prepares an op on stream s of the CUDA runtime: makes s's GPU current on this thread
 * and returns its cudaStream_t. Returns PST_ERR_STATE (detail set) when called from a
 * host function (CUDA forbids CUDA calls there). *skip is 1 when s's status is already
 * sticky: the op is then dropped (device.h: later items of a failed stream are skipped). */
pst_status pst_cuda_stream_begin(pst_stream *s, cudaStream_t *cs, int *skip);

/* The cuBLAS handle of s's device, bound to s's stream, under the device's cuBLAS lock
 * (one handle per device is shared by its streams, and cublasSetStream + the GEMM calls
 * must not interleave with another thread's). Call pst_cuda_blas_release after the last
 * cuBLAS call, whatever it returned. */
pst_status pst_cuda_blas_acquire(pst_stream *s, cublasHandle_t *handle);
void pst_cuda_blas_release(pst_stream *s);

/* Creates a new set of NCCL communicators over the runtime's GPUs in `members` (bit d:
 * device d), one per member in device order (ncclCommInitAll), into comms[0..k-1] (k
 * members; rank i is the i-th member); the caller destroys them (ncclCommDestroy). Each
 * pst_comm makes its own sets: NCCL calls of two communicator sets may run concurrently,
 * calls of one set must not. */
pst_status pst_cuda_nccl_comms_create(pst_runtime *rt, uint64_t members, ncclComm_t *comms);

#ifdef __cplusplus
}
#endif

#endif /* PST_CUDA_IMPL_H */
