/* blas_core.c — OpenBLAS kernel choice (see blas_core.h). */
#include "trainer/blas_core.h"

#include <stdlib.h>
#include <unistd.h>

const char *tr_blas_core_pick(void)
{
    __builtin_cpu_init();
    /* AVX-512 kernels: measured 1.4x faster than Haswell's on an AVX-512 Intel Xeon here;
     * kept to Intel, since this OpenBLAS's AVX-512 paths are not trusted on other vendors. */
    if (__builtin_cpu_is("intel") && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
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
    /* Exec the resolved path, not /proc/self/exe, so the process keeps its name. */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || setenv("OPENBLAS_CORETYPE", core, 1) != 0)
        return;
    self[n] = '\0';
    execv(self, argv);
    unsetenv("OPENBLAS_CORETYPE"); /* exec failed: carry on with the default kernels */
}
