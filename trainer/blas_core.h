/* blas_core.h — picks OpenBLAS's GEMM kernel family from the CPU's features.
 *
 * Debian's OpenBLAS 0.3.21 chooses its kernels at load time from the CPU model; on CPUs
 * newer than the library it may fall back to "Prescott" (SSE3), about 5x slower here, and
 * some environments force an older family (OPENBLAS_CORETYPE=Haswell on AMD EPYC hosts:
 * half the GEMM speed of the AVX-512 kernels the CPU runs). The choice here is by
 * features read with cpuid and xgetbv (the OS must save the wide registers), not by
 * vendor: AVX-512 F+DQ+BW+VL with BF16 -> Cooperlake (SkylakeX's sgemm plus AVX512-BF16
 * sbgemm), AVX-512 F+DQ+BW+VL -> SkylakeX, AVX2+FMA -> Haswell.
 *
 * OPENBLAS_CORETYPE is read only when the library loads, so the trainer re-executes itself
 * once with the variable set. A value the user set is always kept; when it names a slower
 * family than the CPU supports, the trainer says so in one warning line. */
#ifndef TR_BLAS_CORE_H
#define TR_BLAS_CORE_H

#include <stddef.h>

typedef struct tr_cpu_features {
    int avx2, fma;                               /* with the OS saving the YMM state */
    int avx512f, avx512dq, avx512bw, avx512vl;   /* with the OS saving the ZMM state */
    int avx512bf16;
} tr_cpu_features;

/* Reads this CPU's features (cpuid leaves 1, 7.0, 7.1 and XCR0). */
void tr_cpu_features_read(tr_cpu_features *f);
/* The fastest OPENBLAS_CORETYPE for CPUs with these features ("Cooperlake", "SkylakeX",
 * "Haswell"), or NULL when OpenBLAS's own detection is the best available. */
const char *tr_blas_core_best(const tr_cpu_features *f);
/* The fp32 GEMM kernel class of an OpenBLAS core name, case-insensitive: 3 AVX-512,
 * 2 AVX2+FMA, 1 AVX, 0 SSE; -1 for a name this table does not know. Cooperlake and
 * SkylakeX share one class (the same sgemm kernels). */
int tr_blas_core_class(const char *name);
/* When `forced` (the environment's OPENBLAS_CORETYPE) names a slower fp32 GEMM class than
 * tr_blas_core_best(f), writes one line into msg naming the faster family and how to get
 * it, and returns 1; otherwise returns 0 and leaves msg empty. */
int tr_blas_core_advice(const char *forced, const tr_cpu_features *f, char *msg, size_t n);

/* Whether a trainer runs its linear GEMMs in bf16 (common/nn/gemm_bf16.h): is_bf16 (its
 * --precision) and --bf16-gemm (want: PST_BF16_GEMM_*) on, or auto on a CPU with
 * AVX512_BF16. Debian's OpenBLAS 0.3.21 is built without sbgemm, so those GEMMs go through
 * oneDNN. */
int tr_bf16_gemm_wanted(const tr_cpu_features *f, int is_bf16, int want);

/* What a bf16 or fp16 trainer computes in, as one line for its log: the parameters are
 * kept in the 2-byte type on the devices and the wire; the linear GEMMs in bf16 when `on`
 * (gemm: pst_gemm_bf16_setup's line, naming oneDNN's kernel), else everything in fp32 and
 * why (fp16, --bf16-gemm off, what oneDNN said when it was tried (gemm), or a CPU without
 * AVX512_BF16). */
void tr_bf16_arith_line(const tr_cpu_features *f, const char *dtype, int want, int on,
                        const char *gemm, char *msg, size_t n);

/* The fp32 GEMM library (common/nn/gemm.h: PST_SGEMM_*) for --gemm (want: PST_GEMM_*):
 * auto picks oneDNN on CPUs with AVX2 and FMA or with AVX-512 (those tr_blas_core_best names
 * a family for), where its sgemm was faster than OpenBLAS's on the layers' shapes
 * (docs/performance-tuning.md), else OpenBLAS. */
int tr_sgemm_lib(const tr_cpu_features *f, int want);

/* The best family for this CPU (tr_blas_core_best of this CPU's features). */
const char *tr_blas_core_pick(void);
/* When OPENBLAS_CORETYPE is unset and tr_blas_core_pick() names a core, sets it and
 * returns 1: the caller restarts the program (pst_exec_self) for OpenBLAS to read it, and
 * unsets it again where that failed (the default kernels are used). Otherwise returns 0. */
int tr_blas_core_env(void);

#endif /* TR_BLAS_CORE_H */
