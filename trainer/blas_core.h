/* blas_core.h — picks OpenBLAS's GEMM kernels for this CPU.
 *
 * Debian's OpenBLAS 0.3.21 selects its kernels at load time from the CPU model; on CPUs
 * newer than the library it falls back to "Prescott" (SSE3), which made the MLP step
 * about 5x slower here. OPENBLAS_CORETYPE overrides the choice but is read only when the
 * library loads, so the trainer re-executes itself once with the variable set. A value
 * the user already set is always kept. */
#ifndef TR_BLAS_CORE_H
#define TR_BLAS_CORE_H

/* The OPENBLAS_CORETYPE this CPU should use ("SkylakeX" on AVX-512 Intel CPUs, "Haswell"
 * on other AVX2+FMA CPUs), or NULL when OpenBLAS's own detection is the best available. */
const char *tr_blas_core_pick(void);
/* When OPENBLAS_CORETYPE is unset and tr_blas_core_pick() names a core, sets it and
 * re-executes /proc/self/exe with the same arguments. Returns only when no re-exec was
 * needed or it failed (then the default kernels are used). */
void tr_blas_core_reexec(char **argv);

#endif /* TR_BLAS_CORE_H */
