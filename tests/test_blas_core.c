/* test_blas_core.c — OpenBLAS kernel family by CPU features: the choice for Intel- and
 * AMD-like feature sets, the class table, the startup warning under a forced slower
 * family (the real trainer program), and the feature reader against /proc/cpuinfo. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/nn/gemm.h"
#include "common/runtime/device.h"
#include "trainer/blas_core.h"

#define TRAINER PST_BIN_DIR "/trainer"

static const tr_cpu_features avx2_only = {.avx2 = 1, .fma = 1};
static const tr_cpu_features avx512 = {.avx2 = 1, .fma = 1, .avx512f = 1, .avx512dq = 1,
                                       .avx512bw = 1, .avx512vl = 1};
static const tr_cpu_features avx512_bf16 = {.avx2 = 1, .fma = 1, .avx512f = 1, .avx512dq = 1,
                                            .avx512bw = 1, .avx512vl = 1, .avx512bf16 = 1};

Test(blas_core, chosen_by_features_not_vendor)
{
    /* Skylake-X Xeon and Zen 4 alike: AVX-512 F/DQ/BW/VL. Zen 4/5 and Cooper Lake add BF16. */
    cr_assert_str_eq(tr_blas_core_best(&avx512), "SkylakeX");
    cr_assert_str_eq(tr_blas_core_best(&avx512_bf16), "Cooperlake");
    cr_assert_str_eq(tr_blas_core_best(&avx2_only), "Haswell");
    /* AVX-512F alone (Knights Landing) lacks BW/VL: the AVX2 kernels. */
    tr_cpu_features knl = avx2_only;
    knl.avx512f = 1;
    cr_assert_str_eq(tr_blas_core_best(&knl), "Haswell");
    /* AVX2 without FMA, or nothing: OpenBLAS's own detection. */
    tr_cpu_features nofma = {.avx2 = 1};
    cr_assert_null(tr_blas_core_best(&nofma));
    tr_cpu_features none = {0};
    cr_assert_null(tr_blas_core_best(&none));
}

Test(blas_core, class_table)
{
    cr_assert_eq(tr_blas_core_class("Cooperlake"), 3);
    cr_assert_eq(tr_blas_core_class("skylakex"), 3); /* OpenBLAS compares without case */
    cr_assert_eq(tr_blas_core_class("Haswell"), 2);
    cr_assert_eq(tr_blas_core_class("Zen"), 2);
    cr_assert_eq(tr_blas_core_class("Sandybridge"), 1);
    cr_assert_eq(tr_blas_core_class("Prescott"), 0);
    cr_assert_eq(tr_blas_core_class("Pentium9000"), -1);
    cr_assert_eq(tr_blas_core_class(NULL), -1);
}

Test(blas_core, advice_only_when_slower)
{
    char msg[512];
    cr_assert_eq(tr_blas_core_advice("Haswell", &avx512_bf16, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "OPENBLAS_CORETYPE=Haswell"), "%s", msg);
    cr_assert(strstr(msg, "OPENBLAS_CORETYPE=Cooperlake"), "%s", msg);
    cr_assert(strstr(msg, "unset OPENBLAS_CORETYPE"), "%s", msg);
    cr_assert_eq(tr_blas_core_advice("Zen", &avx512, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "OPENBLAS_CORETYPE=SkylakeX"), "%s", msg);
    cr_assert_eq(tr_blas_core_advice("Prescott", &avx2_only, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "Haswell"), "%s", msg);
    /* The best class already, same sgemm kernels, unknown names, nothing forced: quiet. */
    cr_assert_eq(tr_blas_core_advice("Cooperlake", &avx512_bf16, msg, sizeof msg), 0);
    cr_assert_eq(tr_blas_core_advice("SkylakeX", &avx512_bf16, msg, sizeof msg), 0);
    cr_assert_eq(tr_blas_core_advice("Haswell", &avx2_only, msg, sizeof msg), 0);
    cr_assert_eq(tr_blas_core_advice("Pentium9000", &avx512, msg, sizeof msg), 0);
    cr_assert_eq(tr_blas_core_advice(NULL, &avx512, msg, sizeof msg), 0);
    cr_assert_str_eq(msg, "");
}

/* Whether /proc/cpuinfo's flags line lists `flag` as a whole word. */
static int cpuinfo_has(const char *flag)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    cr_assert_not_null(f);
    char line[8192];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        char pat[64];
        snprintf(pat, sizeof pat, " %s", flag);
        for (char *p = strstr(line, pat); p; p = strstr(p + 1, pat)) {
            char end = p[strlen(pat)];
            if (end == ' ' || end == '\n' || end == '\0')
                found = 1;
        }
        break;
    }
    fclose(f);
    return found;
}

Test(blas_core, reader_agrees_with_the_kernel)
{
    tr_cpu_features f;
    tr_cpu_features_read(&f);
    /* The kernel lists a flag only when the OS supports its state, as the reader checks. */
    cr_assert_eq(f.avx2, cpuinfo_has("avx2"));
    cr_assert_eq(f.fma, cpuinfo_has("fma"));
    cr_assert_eq(f.avx512f, cpuinfo_has("avx512f"));
    cr_assert_eq(f.avx512dq, cpuinfo_has("avx512dq"));
    cr_assert_eq(f.avx512bw, cpuinfo_has("avx512bw"));
    cr_assert_eq(f.avx512vl, cpuinfo_has("avx512vl"));
    cr_assert_eq(f.avx512bf16, cpuinfo_has("avx512_bf16"));
}

/* Runs the trainer for one synthetic step under OPENBLAS_CORETYPE=core (NULL: unset);
 * returns whether its stderr carries the kernel warning. */
static int trainer_warns(const char *core)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s%s timeout 60 " TRAINER " --model synthetic --params 1000 --steps 1 "
             "--progress none 2>&1 >/dev/null",
             core ? "OPENBLAS_CORETYPE=" : "env -u OPENBLAS_CORETYPE", core ? core : "");
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[1024];
    int warned = 0;
    while (fgets(line, sizeof line, p))
        if (strstr(line, "WARN") && strstr(line, "OPENBLAS_CORETYPE="))
            warned = 1;
    cr_assert_eq(pclose(p), 0, "trainer failed: %s", cmd);
    return warned;
}

Test(blas_core, trainer_warns_only_under_a_slower_family, .timeout = 120)
{
    const char *best = tr_blas_core_pick();
    if (!best)
        cr_skip_test("this CPU has no AVX2+FMA: no family to prefer");
    cr_assert_eq(trainer_warns(best), 0, "warned under the best family %s", best);
    cr_assert_eq(trainer_warns(NULL), 0, "warned with OPENBLAS_CORETYPE unset");
    cr_assert_eq(trainer_warns("Prescott"), 1, "no warning under Prescott (best: %s)", best);
    if (tr_blas_core_class(best) == 3)
        cr_assert_eq(trainer_warns("Haswell"), 1, "no warning under Haswell on AVX-512");
}

Test(blas_core, bf16_gemms_are_picked_from_the_cpu_and_the_option)
{
    cr_assert_eq(tr_bf16_gemm_wanted(&avx512_bf16, 1, PST_BF16_GEMM_AUTO), 1);
    cr_assert_eq(tr_bf16_gemm_wanted(&avx2_only, 1, PST_BF16_GEMM_AUTO), 0);
    cr_assert_eq(tr_bf16_gemm_wanted(&avx2_only, 1, PST_BF16_GEMM_ON), 1);
    cr_assert_eq(tr_bf16_gemm_wanted(&avx512_bf16, 1, PST_BF16_GEMM_OFF), 0);
    cr_assert_eq(tr_bf16_gemm_wanted(&avx512_bf16, 0, PST_BF16_GEMM_ON), 0, "fp16 or fp32");
}

Test(blas_core, bf16_line_names_what_the_trainer_computes_in)
{
    char msg[512];
    tr_bf16_arith_line(&avx2_only, "bf16", PST_BF16_GEMM_AUTO, 0, "", msg, sizeof msg);
    cr_assert(strstr(msg, "compute in fp32"), "%s", msg);
    cr_assert(strstr(msg, "lacks AVX512_BF16"), "%s", msg);
    tr_bf16_arith_line(&avx512_bf16, "bf16", PST_BF16_GEMM_OFF, 0, "", msg, sizeof msg);
    cr_assert(strstr(msg, "compute in fp32 (--bf16-gemm off)"), "%s", msg);
    tr_bf16_arith_line(&avx512_bf16, "bf16", PST_BF16_GEMM_AUTO, 0,
                       "bf16 GEMMs off: oneDNN made no bf16 matmul (status 3)", msg, sizeof msg);
    cr_assert(strstr(msg, "compute in fp32 (bf16 GEMMs off: oneDNN made no"), "%s", msg);
    tr_bf16_arith_line(&avx512_bf16, "bf16", PST_BF16_GEMM_AUTO, 1, "kernel K", msg, sizeof msg);
    cr_assert(strstr(msg, "GEMMs in bf16 with fp32 accumulation (kernel K)"), "%s", msg);
    tr_bf16_arith_line(&avx512_bf16, "fp16", PST_BF16_GEMM_AUTO, 0, "", msg, sizeof msg);
    cr_assert(strstr(msg, "compute in fp32 (no fp16 GEMM is used on CPUs)"), "%s", msg);
}

/* How many of the trainer's log lines (bf16, --bf16-gemm `opt`, on `devices`) contain both
 * a and b; the trainer must exit 0 unless the devices may be missing (CUDA). */
static int trainer_lines_on(const char *devices, const char *opt, const char *a, const char *b)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "PSTRAIN_DEVICES=%s timeout 60 " TRAINER " --model synthetic --params 1000 "
             "--steps 1 --precision bf16 --bf16-gemm %s --progress none 2>&1 >/dev/null",
             devices, opt);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[1024];
    int said = 0;
    while (fgets(line, sizeof line, p))
        said += strstr(line, a) && strstr(line, b);
    const int rc = pclose(p);
    if (!pst_devices_spec_cuda(devices))
        cr_assert_eq(rc, 0);
    return said;
}

static int trainer_lines(const char *opt, const char *a, const char *b)
{
    return trainer_lines_on("cpu:1", opt, a, b);
}

Test(blas_core, a_bf16_trainer_says_what_it_computes_in, .timeout = 120)
{
    tr_cpu_features f;
    tr_cpu_features_read(&f);
    const char *bf16 = "bf16: parameters kept in bf16";
    cr_assert_eq(trainer_lines("auto", bf16, f.avx512bf16 ? "GEMMs in bf16" : "compute in fp32"),
                 1, "auto on a CPU %s AVX512_BF16", f.avx512bf16 ? "with" : "without");
    cr_assert_eq(trainer_lines("off", bf16, "compute in fp32 (--bf16-gemm off)"), 1);
    /* CUDA devices keep fp32 GEMMs whatever the option says (the line comes before the
     * devices are opened, so also where there is no GPU) */
    cr_assert_eq(trainer_lines_on("cuda:0", "on", bf16,
                                  "compute in fp32 (CUDA devices: bf16 GEMMs are for CPU devices)"),
                 1);
    /* on: on any CPU, emulated where the CPU lacks AVX512_BF16 */
    cr_assert_eq(trainer_lines("on", bf16, f.avx512bf16 ? "with fp32 accumulation (bf16 GEMMs on: oneDNN"
                                                        : "with fp32 accumulation (bf16 GEMMs on, emulated"),
                 1);
}

Test(blas_core, fp32_gemm_library_is_picked_from_the_cpu_and_the_option)
{
    cr_assert_eq(tr_sgemm_lib(&avx512, PST_GEMM_AUTO), PST_SGEMM_ONEDNN);
    cr_assert_eq(tr_sgemm_lib(&avx2_only, PST_GEMM_AUTO), PST_SGEMM_ONEDNN);
    tr_cpu_features nofma = {.avx2 = 1}, none = {0};
    cr_assert_eq(tr_sgemm_lib(&nofma, PST_GEMM_AUTO), PST_SGEMM_OPENBLAS);
    cr_assert_eq(tr_sgemm_lib(&none, PST_GEMM_AUTO), PST_SGEMM_OPENBLAS);
    cr_assert_eq(tr_sgemm_lib(&avx512, PST_GEMM_OPENBLAS), PST_SGEMM_OPENBLAS);
    cr_assert_eq(tr_sgemm_lib(&none, PST_GEMM_ONEDNN), PST_SGEMM_ONEDNN);
}

/* The trainer's log line and summary name the fp32 GEMM library --gemm gave it. */
Test(blas_core, the_trainer_names_its_fp32_gemm_library, .timeout = 120)
{
    tr_cpu_features f;
    tr_cpu_features_read(&f);
    const char *opts[] = {"openblas", "onednn", "auto"};
    const char *lines[] = {"fp32 GEMMs: OpenBLAS", "fp32 GEMMs: oneDNN", NULL};
    const char *names[] = {"\"cpu_gemm\":\"openblas\"", "\"cpu_gemm\":\"onednn\"", NULL};
    const int autolib = tr_sgemm_lib(&f, PST_GEMM_AUTO) == PST_SGEMM_ONEDNN;
    for (int i = 0; i < 3; i++) {
        const int lib = i < 2 ? i : autolib;
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "timeout 60 " TRAINER " --model mlp --hidden 16 --steps 2 --gemm %s "
                 "--progress none 2>&1", opts[i]);
        FILE *p = popen(cmd, "r");
        cr_assert_not_null(p);
        char line[4096];
        int said = 0, named = 0;
        while (fgets(line, sizeof line, p)) {
            said += strstr(line, "INFO") && strstr(line, lines[lib]);
            named += strstr(line, names[lib]) != NULL;
        }
        cr_assert_eq(pclose(p), 0, "%s", cmd);
        cr_assert_eq(said, 1, "--gemm %s: no line \"%s\"", opts[i], lines[lib]);
        cr_assert_eq(named, 1, "--gemm %s: the summary lacks %s", opts[i], names[lib]);
    }
}
