/* blas_core.c — OpenBLAS kernel choice by CPU features (see blas_core.h). */
#include "trainer/blas_core.h"

#include "common/config.h"
#include "common/nn/gemm.h"

#include <cpuid.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <strings.h>

static unsigned long long read_xcr0(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

void tr_cpu_features_read(tr_cpu_features *f)
{
    *f = (tr_cpu_features){0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    const int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1;
    /* XCR0: bits 1-2 SSE+AVX state, bits 5-7 the AVX-512 opmask and ZMM state. */
    const unsigned long long xcr0 = osxsave ? read_xcr0() : 0;
    const int os_ymm = (xcr0 & 0x6) == 0x6, os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0;
    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, a, b, c, d);
    f->avx2 = os_ymm && ((b >> 5) & 1);
    f->fma = os_ymm && fma;
    f->avx512f = os_zmm && ((b >> 16) & 1);
    f->avx512dq = os_zmm && ((b >> 17) & 1);
    f->avx512bw = os_zmm && ((b >> 30) & 1);
    f->avx512vl = os_zmm && ((b >> 31) & 1);
    unsigned max_sub = a;
    if (max_sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        f->avx512bf16 = f->avx512f && ((a >> 5) & 1);
    }
}

const char *tr_blas_core_best(const tr_cpu_features *f)
{
    if (f->avx512f && f->avx512dq && f->avx512bw && f->avx512vl)
        return f->avx512bf16 ? "Cooperlake" : "SkylakeX";
    if (f->avx2 && f->fma)
        return "Haswell";
    return NULL;
}

/* OpenBLAS 0.3.21's x86-64 core names and the vector ISA of their sgemm kernels. */
static const struct {
    const char *name;
    int cls;
} core_classes[] = {
    {"Cooperlake", 3}, {"SkylakeX", 3}, {"SapphireRapids", 3},
    {"Haswell", 2},    {"Zen", 2},
    {"Sandybridge", 1}, {"Bulldozer", 1}, {"Piledriver", 1}, {"Steamroller", 1},
    {"Excavator", 1},
    {"Prescott", 0},   {"Core2", 0},     {"Penryn", 0},      {"Dunnington", 0},
    {"Nehalem", 0},    {"Atom", 0},      {"Nano", 0},        {"Barcelona", 0},
    {"Opteron", 0},    {"Opteron_SSE3", 0}, {"Athlon", 0},   {"Bobcat", 0},
    {"Katmai", 0},     {"Coppermine", 0}, {"Northwood", 0},  {"Banias", 0},
};

int tr_blas_core_class(const char *name)
{
    for (size_t i = 0; name && i < sizeof core_classes / sizeof core_classes[0]; i++)
        if (strcasecmp(name, core_classes[i].name) == 0)
            return core_classes[i].cls;
    return -1;
}

static const char *class_isa(int cls)
{
    static const char *isa[] = {"SSE", "AVX", "AVX2", "AVX-512"};
    return cls >= 0 && cls <= 3 ? isa[cls] : "unknown";
}

int tr_blas_core_advice(const char *forced, const tr_cpu_features *f, char *msg, size_t n)
{
    if (n)
        msg[0] = '\0';
    const char *best = tr_blas_core_best(f);
    const int have = tr_blas_core_class(forced), want = tr_blas_core_class(best);
    if (!forced || !best || have < 0 || have >= want)
        return 0;
    snprintf(msg, n,
             "OPENBLAS_CORETYPE=%s keeps OpenBLAS on %s GEMM kernels, but this CPU has %s%s: "
             "%s is faster; unset OPENBLAS_CORETYPE (the trainer then picks it) or set "
             "OPENBLAS_CORETYPE=%s",
             forced, class_isa(have),
             want == 3 ? "AVX-512 (F, DQ, BW, VL)" : class_isa(want),
             f->avx512bf16 && want == 3 ? " and AVX512_BF16" : "", best, best);
    return 1;
}

int tr_bf16_gemm_wanted(const tr_cpu_features *f, int is_bf16, int want)
{
    return is_bf16 && (want == PST_BF16_GEMM_ON || (want == PST_BF16_GEMM_AUTO && f->avx512bf16));
}

void tr_bf16_arith_line(const tr_cpu_features *f, const char *dtype, int want, int on,
                        const char *gemm, char *msg, size_t n)
{
    const int bf16 = strcmp(dtype, "bf16") == 0;
    if (bf16 && on) {
        snprintf(msg, n,
                 "bf16: parameters kept in bf16 on the devices and the wire; the linear "
                 "layers' GEMMs in bf16 with fp32 accumulation (%s), every other op in fp32",
                 gemm);
        return;
    }
    char why[256];
    if (!bf16)
        snprintf(why, sizeof why, "no %s GEMM is used on CPUs", dtype);
    else if (want == PST_BF16_GEMM_OFF)
        snprintf(why, sizeof why, "--bf16-gemm off");
    else if (gemm && *gemm) /* tried: what oneDNN said */
        snprintf(why, sizeof why, "%s", gemm);
    else
        snprintf(why, sizeof why, "%s",
                 f->avx512bf16 ? "bf16 GEMMs not tried"
                               : "the CPU lacks AVX512_BF16: no bf16 arithmetic to use; "
                                 "--bf16-gemm on emulates bf16 GEMMs, slower");
    snprintf(msg, n,
             "%s: parameters kept in %s on the devices and the wire; GEMMs and every other "
             "op compute in fp32 (%s)",
             dtype, dtype, why);
}

int tr_sgemm_lib(const tr_cpu_features *f, int want)
{
    if (want == PST_GEMM_AUTO) /* where OpenBLAS would get AVX2 or AVX-512 kernels */
        return tr_blas_core_best(f) ? PST_SGEMM_ONEDNN : PST_SGEMM_OPENBLAS;
    return want == PST_GEMM_ONEDNN ? PST_SGEMM_ONEDNN : PST_SGEMM_OPENBLAS;
}

const char *tr_blas_core_pick(void)
{
    tr_cpu_features f;
    tr_cpu_features_read(&f);
    return tr_blas_core_best(&f);
}

int tr_blas_core_env(void)
{
    if (getenv("OPENBLAS_CORETYPE"))
        return 0;
    const char *core = tr_blas_core_pick();
    return core && setenv("OPENBLAS_CORETYPE", core, 1) == 0;
}
