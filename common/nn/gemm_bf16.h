/* gemm_bf16.h — GEMMs with bf16 operands and fp32 results (fp32 accumulation), for a bf16
 * trainer's linear layers on CPUs with bf16 instructions (AVX512_BF16, AMX).
 *
 * Debian's OpenBLAS 0.3.21 is built without sbgemm, so the products go through oneDNN's
 * matmul primitive (Debian's libdnnl2, oneDNN 2.6), which picks its kernel from the CPU:
 * AMX or AVX512_BF16 where the CPU has them, and on AVX-512 CPUs without them a kernel
 * that converts in software (gemm:jit); oneDNN 2.6 has none for AVX2 CPUs (then the
 * products can be emulated: pst_gemm_bf16_setup). A primitive is made once per shape and
 * thread and kept in that thread's cache; each call runs single-threaded on the calling
 * thread, as the CPU ops run OpenBLAS (the ops split a layer over their own thread team).
 *
 * Off until pst_gemm_bf16_setup turns it on: the trainer does that at start for bf16
 * parameters (--bf16-gemm: auto, on where the CPU has AVX512_BF16). */
#ifndef PST_NN_GEMM_BF16_H
#define PST_NN_GEMM_BF16_H

#include <stddef.h>
#include <stdint.h>

/* pst_gemm_bf16_setup's modes: off; oneDNN's kernel, or off when oneDNN has none for this
 * CPU; emulated: bf16-rounded operands widened to fp32 and multiplied by OpenBLAS (exact
 * products, another order of sums), for CPUs without bf16 instructions (the tests,
 * --bf16-gemm on), where it is faster than oneDNN's software kernel. */
enum { PST_GEMM_BF16_OFF, PST_GEMM_BF16_ONEDNN, PST_GEMM_BF16_EMULATE };

/* Turns bf16 GEMMs on or off for the process (mode above), before any thread calls
 * pst_gemm_bf16. On makes oneDNN's engine (and, in oneDNN's mode, one probe product); msg
 * gets one line naming the kernel oneDNN picked (its impl string), the emulation, or why
 * they are off. Returns 1 when on. Not thread safe: call it once at start (tests: in each test's process). */
int pst_gemm_bf16_setup(int mode, char *msg, size_t n);

/* 1 after pst_gemm_bf16_setup turned them on. */
int pst_gemm_bf16_on(void);

/* C (M, N) = op(A) (M, K) @ op(B) (K, N) + (accumulate ? C : 0), row-major, A and B bf16
 * (trans_a: A is stored (K, M) with row stride lda; trans_b: B is stored (N, K)), C fp32
 * with row stride ldc. Only C's M x N elements are written. Each element is a sum of
 * exact bf16 x bf16 products in fp32; the order of the sum is the kernel's. Emulated, every
 * product is computed from fp32 copies of A and B by OpenBLAS, which gives the same
 * products in another order; so is one that oneDNN failed (out of memory), and one
 * warning is logged. */
void pst_gemm_bf16(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A, int lda,
                   const uint16_t *B, int ldb, int accumulate, float *C, int ldc);

/* The same product with fp32 A and B through the same oneDNN path (a primitive per shape
 * and thread, strides, transposes, C added to): the tests check that path with it on CPUs
 * for which oneDNN has no bf16 kernel. Needs a pst_gemm_bf16_setup other than off first.
 * 0, or -1 when oneDNN failed (C then unspecified). */
int pst_gemm_onednn_f32(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                        const float *B, int ldb, int accumulate, float *C, int ldc);

/* Rows [0, rows) of columns [0, n) of src (row stride ld) into dst as bf16 (rows, n),
 * rounded to nearest even. */
void pst_bf16_rows(uint16_t *dst, const float *src, int rows, int n, int64_t ld);

/* This thread's scratch `slot` (0-3; pst_gemm_bf16's own are others), at least n bf16
 * elements, kept and grown for the thread's life (freed when it exits); NULL when out of
 * memory or for another slot. */
uint16_t *pst_gemm_bf16_scratch(int slot, size_t n);

#endif
