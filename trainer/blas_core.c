/* blas_core.c — OpenBLAS kernel choice (see blas_core.h). */
#include "trainer/blas_core.h"

#include <stdlib.h>
#include <unistd.h>

const char *tr_blas_core_pick(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
    return NULL;
}

void tr_blas_core_reexec(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE"))
        return;
    const char *core = tr_blas_core_pick();
    if (!core)
        return;
    if (setenv("OPENBLAS_CORETYPE", core, 1) != 0)
        return;
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE"); /* exec failed: carry on with the default kernels */
}
