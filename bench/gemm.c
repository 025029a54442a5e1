/* gemm.c — standalone benchmark (not a test): OpenBLAS against Debian's BLIS on the
 * trainer's GEMM shapes, in one process, alternating, plus OpenBLAS's bf16 cblas_sbgemm.
 *
 * Shapes are the row-major cblas_sgemm calls of common/nn/layers.c for an MLP 784-H-H-10 at
 * batch 128: forward out = inp * W^T (NT, M=B N=OC K=IC), weight gradient dW = dout^T * inp
 * (TN, M=OC N=IC K=B), input gradient dinp = dout * W (NN, M=B N=IC K=OC, none for the first
 * layer), for H = 1024 (bench/mlp.sh) and H = 4096 (bench/overlap.sh), and the square
 * 2048^3 NN. Prints JSON lines: the libraries, the sanity checks, one line per shape, op and
 * library (best and median GFLOP/s), and the total GEMM time of one MLP step per library.
 *
 * DESIGN: both libraries are dlopened by path with RTLD_LOCAL, so each one's cblas_sgemm
 * and its internal calls resolve inside that library, and the program links neither (build:
 * cc -O2 -o bench_gemm bench/gemm.c -ldl). Libraries alternate in rounds of --block
 * calls, the order flipped every round, each round after one untimed warm-up call. Between
 * libraries the program waits until no other thread of the process is runnable: OpenBLAS's
 * idle workers spin (sched_yield) for about 2^28 cycles after a call, and on 2 cores they
 * would take a core from BLIS. OpenBLAS's kernel family and L2 size come from the
 * environment (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE; bench/gemm.sh sets them like the other
 * benches), BLIS's from --blis-arch. cblas_sbgemm (bf16 inputs, fp32 output) is timed when
 * the OpenBLAS has it (built with BUILD_BFLOAT16; Debian's 0.3.21 is not); its speed depends
 * on the kernel family: only Cooperlake (and newer) has AVX512-BF16 kernels.
 *
 * usage: bench_gemm [--threads N=2] [--reps R=20] [--block B=5] [--openblas PATH]
 *                   [--blis PATH] [--blis-arch auto|native|NAME] [--need-sbgemm] [--sgemm-peak]
 *   --blis-arch   BLIS's kernel family (default auto: see blis_arch_choose); an id BLIS was
 *                 not built with makes BLIS itself abort with its own message
 *   --sgemm-peak  only {"sgemm_gflops": X, "openblas_gflops": A, "onednn_gflops": D}: 2048^3
 *                 NN with OpenBLAS and with oneDNN's dnnl_sgemm (0 when libdnnl.so.2 does not
 *                 load), best of R (default 10) each; X is the larger
 *   --need-sbgemm exit 2 when OpenBLAS has no cblas_sbgemm (else that part is skipped)
 * Exit status: 0, 1 when a sanity check fails, 2 when a library or symbol is missing or a
 * flag is wrong. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/dtype.h"
#include "common/rng.h"

/* CBLAS enum values (the same in every CBLAS; cblas.h is not included so that neither
 * library's header is needed). */
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta,
                         float *c, int ldc);
typedef void (*sbgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                          const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta,
                          float *c, int ldc);

#define OPENBLAS_DEFAULT "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"
#define BLIS_DEFAULT "/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4"
#define BLIS_FALLBACK "libblis.so.4"

/* The two libraries' entry points; optional members are NULL when absent. */
typedef struct {
    const char *ob_path, *blis_path;
    void *ob, *blis;
    sgemm_fn ob_sgemm;
    sbgemm_fn ob_sbgemm;                 /* optional: only OpenBLAS built with BFLOAT16 */
    void (*ob_set_threads)(int);
    int (*ob_get_threads)(void);         /* optional */
    char *(*ob_corename)(void);          /* optional */
    char *(*ob_config)(void);            /* optional */
    sgemm_fn blis_sgemm;
    void (*blis_set_threads)(int64_t);   /* dim_t is 64-bit in Debian's BLIS */
    int64_t (*blis_get_threads)(void);   /* optional */
    const char *(*blis_version)(void);   /* optional */
    int (*blis_arch_id)(void);           /* optional, with blis_arch_name */
    const char *(*blis_arch_name)(int);
} blas_libs;

/* Looks `name` up in `lib`; when `required` and absent, writes why into err. */
static void *sym(void *lib, const char *path, const char *name, int required, char *err,
                 size_t n)
{
    void *p = dlsym(lib, name);
    if (!p && required && !err[0])
        snprintf(err, n, "%s has no %s (nm -D --defined-only %s | grep %s)", path, name, path,
                 name);
    return p;
}

/* Opens OpenBLAS (always) and BLIS (when want_blis). Returns 0, or -1 with one line in err
 * naming what is missing and how to get it. The handles stay open until exit. */
static int libs_open(blas_libs *l, int want_blis, int need_sbgemm, char *err, size_t n)
{
    err[0] = '\0';
    l->ob = dlopen(l->ob_path, RTLD_NOW | RTLD_LOCAL);
    if (!l->ob) {
        snprintf(err, n, "cannot load OpenBLAS %s (%s): apt-get install libopenblas0-pthread",
                 l->ob_path, dlerror());
        return -1;
    }
    l->ob_sgemm = (sgemm_fn)sym(l->ob, l->ob_path, "cblas_sgemm", 1, err, n);
    l->ob_set_threads = (void (*)(int))sym(l->ob, l->ob_path, "openblas_set_num_threads", 1,
                                           err, n);
    l->ob_get_threads = (int (*)(void))sym(l->ob, l->ob_path, "openblas_get_num_threads", 0,
                                           err, n);
    l->ob_corename = (char *(*)(void))sym(l->ob, l->ob_path, "openblas_get_corename", 0, err, n);
    l->ob_config = (char *(*)(void))sym(l->ob, l->ob_path, "openblas_get_config", 0, err, n);
    l->ob_sbgemm = (sbgemm_fn)sym(l->ob, l->ob_path, "cblas_sbgemm", 0, err, n);
    if (err[0])
        return -1;
    if (need_sbgemm && !l->ob_sbgemm) {
        snprintf(err, n, "%s has no cblas_sbgemm: use an OpenBLAS built with BUILD_BFLOAT16=1 "
                 "(--openblas PATH); Debian's 0.3.21 is built without it", l->ob_path);
        return -1;
    }
    if (!want_blis)
        return 0;
    if (!l->blis_path) {
        l->blis_path = BLIS_DEFAULT;
        l->blis = dlopen(l->blis_path, RTLD_NOW | RTLD_LOCAL);
        if (!l->blis)
            l->blis_path = BLIS_FALLBACK;
    }
    if (!l->blis)
        l->blis = dlopen(l->blis_path, RTLD_NOW | RTLD_LOCAL);
    if (!l->blis) {
        snprintf(err, n, "cannot load BLIS %s (%s): apt-get install libblis4-pthread",
                 l->blis_path, dlerror());
        return -1;
    }
    l->blis_sgemm = (sgemm_fn)sym(l->blis, l->blis_path, "cblas_sgemm", 1, err, n);
    l->blis_set_threads = (void (*)(int64_t))sym(l->blis, l->blis_path,
                                                 "bli_thread_set_num_threads", 1, err, n);
    l->blis_get_threads = (int64_t (*)(void))sym(l->blis, l->blis_path,
                                                 "bli_thread_get_num_threads", 0, err, n);
    l->blis_version = (const char *(*)(void))sym(l->blis, l->blis_path,
                                                 "bli_info_get_version_str", 0, err, n);
    l->blis_arch_id = (int (*)(void))sym(l->blis, l->blis_path, "bli_arch_query_id", 0, err, n);
    l->blis_arch_name = (const char *(*)(int))sym(l->blis, l->blis_path, "bli_arch_string", 0,
                                                  err, n);
    return err[0] ? -1 : 0;
}

/* BLIS's id for an architecture name (its arch_t, whose last x86/ARM/POWER entry is
 * "generic"), or -1. Reads only BLIS's name table: BLIS is not initialized by it. */
static int blis_arch_lookup(const blas_libs *l, const char *name)
{
    for (int id = 0; l->blis_arch_name && id < 64; id++) {
        const char *s = l->blis_arch_name(id);
        if (!s)
            break;
        if (strcmp(s, name) == 0)
            return id;
        if (strcmp(s, "generic") == 0)
            break;
    }
    return -1;
}

/* Chooses BLIS's kernel family through BLIS_ARCH_TYPE, which BLIS reads once, when it
 * initializes (its first call): so this runs before any BLIS call. `want` is a name
 * ("skx", "haswell", ...), "native" (BLIS's own CPU detection) or "auto": the environment's
 * BLIS_ARCH_TYPE when set, else skx on a CPU with AVX-512 F/DQ/BW/VL, else native. BLIS
 * 0.9.0 detects no CPU newer than Zen 3 or Ice Lake and falls back to its generic C kernels
 * (about 5x slower here), which would compare OpenBLAS's best against BLIS's worst. Sets
 * *how to what decided; returns 0, or -1 with err when BLIS has no such name. */
static int blis_arch_choose(const blas_libs *l, const char *want, const char **how, char *err,
                            size_t n)
{
    const char *name = NULL;
    *how = "forced";
    if (strcmp(want, "native") == 0) {
        unsetenv("BLIS_ARCH_TYPE");
        *how = "blis detection";
        return 0;
    }
    if (strcmp(want, "auto") != 0) {
        name = want;
    } else if (getenv("BLIS_ARCH_TYPE")) {
        *how = "BLIS_ARCH_TYPE";
        return 0;
    } else {
#if defined(__x86_64__) && defined(__GNUC__)
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
            name = "skx";
#endif
        *how = name ? "auto: AVX-512 CPU" : "auto: blis detection";
        if (!name)
            return 0;
    }
    const int id = blis_arch_lookup(l, name);
    if (id < 0) {
        snprintf(err, n, "%s has no architecture '%s' (--blis-arch NAME|native|auto)",
                 l->blis_path, name);
        return -1;
    }
    char v[16];
    snprintf(v, sizeof v, "%d", id);
    setenv("BLIS_ARCH_TYPE", v, 1);
    return 0;
}

typedef struct {
    const char *name;
    char ta, tb;   /* 'N' or 'T', as in cblas_sgemm(RowMajor, ta, tb, ...) */
    int m, n, k;
    int group;     /* 1: an MLP-1024 step's GEMM, 2: an MLP-4096 step's, 0: the square */
} gemm_shape;

static const gemm_shape shapes[] = {
    {"mlp1024.l1.fwd", 'N', 'T', 128, 1024, 784, 1},
    {"mlp1024.l2.fwd", 'N', 'T', 128, 1024, 1024, 1},
    {"mlp1024.l3.fwd", 'N', 'T', 128, 10, 1024, 1},
    {"mlp1024.l1.dw", 'T', 'N', 1024, 784, 128, 1},
    {"mlp1024.l2.dw", 'T', 'N', 1024, 1024, 128, 1},
    {"mlp1024.l3.dw", 'T', 'N', 10, 1024, 128, 1},
    {"mlp1024.l2.dinp", 'N', 'N', 128, 1024, 1024, 1},
    {"mlp1024.l3.dinp", 'N', 'N', 128, 1024, 10, 1},
    {"mlp4096.l1.fwd", 'N', 'T', 128, 4096, 784, 2},
    {"mlp4096.l2.fwd", 'N', 'T', 128, 4096, 4096, 2},
    {"mlp4096.l3.fwd", 'N', 'T', 128, 10, 4096, 2},
    {"mlp4096.l1.dw", 'T', 'N', 4096, 784, 128, 2},
    {"mlp4096.l2.dw", 'T', 'N', 4096, 4096, 128, 2},
    {"mlp4096.l3.dw", 'T', 'N', 10, 4096, 128, 2},
    {"mlp4096.l2.dinp", 'N', 'N', 128, 4096, 4096, 2},
    {"mlp4096.l3.dinp", 'N', 'N', 128, 4096, 10, 2},
    {"square2048", 'N', 'N', 2048, 2048, 2048, 0},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

/* Operands of one shape: A (M x K, or K x M when ta='T'), B (K x N, or N x K when tb='T'),
 * their bf16 copies, and one output per library/op, all row-major. */
typedef struct {
    const gemm_shape *s;
    int lda, ldb;
    float *a, *b;
    uint16_t *abf, *bbf;   /* NULL when sbgemm is not timed */
    float *c[3];           /* indexed by the op enum below */
} operands;

enum { OP_OB_SGEMM, OP_BLIS_SGEMM, OP_OB_SBGEMM, N_OPS };
static const char *op_name[N_OPS] = {"sgemm", "sgemm", "sbgemm"};
static const char *op_lib[N_OPS] = {"openblas", "blis", "openblas"};

static void *alloc64(size_t bytes)
{
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

/* Uniform in [-1, 1), from the project's RNG. */
static void fill(float *x, size_t n, pst_rng *r)
{
    for (size_t i = 0; i < n; i++)
        x[i] = pst_rng_uniform(r) * 2.0f - 1.0f;
}

static void operands_free(operands *o)
{
    if (!o)
        return;
    free(o->a);
    free(o->b);
    free(o->abf);
    free(o->bbf);
    for (int i = 0; i < N_OPS; i++)
        free(o->c[i]);
    memset(o, 0, sizeof *o);
}

/* Allocates and fills the operands of s (bf16 copies when with_bf16). Returns 0 or -1 (out
 * of memory; o is then freed). */
static int operands_init(operands *o, const gemm_shape *s, int with_bf16)
{
    memset(o, 0, sizeof *o);
    o->s = s;
    const size_t na = (size_t)s->m * s->k, nb = (size_t)s->k * s->n, nc = (size_t)s->m * s->n;
    o->lda = s->ta == 'N' ? s->k : s->m;
    o->ldb = s->tb == 'N' ? s->n : s->k;
    o->a = alloc64(na * sizeof(float));
    o->b = alloc64(nb * sizeof(float));
    for (int i = 0; i < N_OPS; i++)
        o->c[i] = alloc64(nc * sizeof(float));
    if (with_bf16) {
        o->abf = alloc64(na * sizeof(uint16_t));
        o->bbf = alloc64(nb * sizeof(uint16_t));
    }
    int ok = o->a && o->b && (!with_bf16 || (o->abf && o->bbf));
    for (int i = 0; i < N_OPS; i++)
        ok = ok && o->c[i];
    if (!ok) {
        operands_free(o);
        return -1;
    }
    pst_rng r;
    pst_rng_seed(&r, 42, (uint64_t)s->m * 31u + (uint64_t)s->n * 7u + (uint64_t)s->k);
    fill(o->a, na, &r);
    fill(o->b, nb, &r);
    for (int i = 0; i < N_OPS; i++)
        memset(o->c[i], 0, nc * sizeof(float));
    if (with_bf16) {
        for (size_t i = 0; i < na; i++)
            o->abf[i] = pst_f32_to_bf16(o->a[i]);
        for (size_t i = 0; i < nb; i++)
            o->bbf[i] = pst_f32_to_bf16(o->b[i]);
    }
    return 0;
}

static void call(const blas_libs *l, int op, operands *o)
{
    const gemm_shape *s = o->s;
    const int ta = s->ta == 'N' ? NO_TRANS : TRANS, tb = s->tb == 'N' ? NO_TRANS : TRANS;
    if (op == OP_OB_SGEMM)
        l->ob_sgemm(ROW_MAJOR, ta, tb, s->m, s->n, s->k, 1.0f, o->a, o->lda, o->b, o->ldb,
                    0.0f, o->c[op], s->n);
    else if (op == OP_BLIS_SGEMM)
        l->blis_sgemm(ROW_MAJOR, ta, tb, s->m, s->n, s->k, 1.0f, o->a, o->lda, o->b, o->ldb,
                      0.0f, o->c[op], s->n);
    else
        l->ob_sbgemm(ROW_MAJOR, ta, tb, s->m, s->n, s->k, 1.0f, o->abf, o->lda, o->bbf,
                     o->ldb, 0.0f, o->c[op], s->n);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Waits until no thread of this process but the caller is runnable (state R in
 * /proc/self/task/TID/stat), at most 2 s: OpenBLAS's idle workers spin for a while after a
 * call and would share the cores with the next library's threads. Returns seconds waited. */
static double quiesce(void)
{
    const double t0 = now_s();
    const pid_t self = getpid(); /* the main thread's tid: the benchmark runs on it */
    for (;;) {
        int busy = 0;
        DIR *d = opendir("/proc/self/task");
        if (!d)
            return 0.0;
        struct dirent *e;
        while (!busy && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.' || atoi(e->d_name) == self)
                continue;
            char path[300], buf[512];
            snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
            FILE *f = fopen(path, "r");
            if (!f)
                continue;
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = '\0';
            const char *p = strrchr(buf, ')'); /* the name may hold spaces and ')' */
            busy = p && p[1] == ' ' && p[2] == 'R';
        }
        closedir(d);
        if (!busy || now_s() - t0 > 2.0)
            return now_s() - t0;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
}

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Sorts t[0..n) and returns its median. */
static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static double flops(const gemm_shape *s)
{
    return 2.0 * s->m * s->n * s->k;
}

/* Element (i, j) of op(A) * op(B) in double, from the fp32 (or bf16 when bf16) operands. */
static double reference(const operands *o, int i, int j, int bf16)
{
    const gemm_shape *s = o->s;
    double acc = 0.0;
    for (int p = 0; p < s->k; p++) {
        const size_t ia = s->ta == 'N' ? (size_t)i * o->lda + p : (size_t)p * o->lda + i;
        const size_t ib = s->tb == 'N' ? (size_t)p * o->ldb + j : (size_t)j * o->ldb + p;
        const double a = bf16 ? pst_bf16_to_f32(o->abf[ia]) : o->a[ia];
        const double b = bf16 ? pst_bf16_to_f32(o->bbf[ib]) : o->b[ib];
        acc += a * b;
    }
    return acc;
}

/* Sanity check on one shape: OpenBLAS and BLIS sgemm agree elementwise, and both (and
 * sbgemm, on its bf16-rounded operands) match a double reference at 61 sampled entries,
 * all to 1e-3 relative to the largest |C|. Prints one JSON line; returns 1 when it passes,
 * 0 when not, -1 when out of memory. */
static int check(const blas_libs *l, const gemm_shape *s, int with_bf16)
{
    operands o;
    if (operands_init(&o, s, with_bf16) != 0)
        return -1;
    call(l, OP_OB_SGEMM, &o);
    call(l, OP_BLIS_SGEMM, &o);
    if (with_bf16)
        call(l, OP_OB_SBGEMM, &o);
    const size_t nc = (size_t)s->m * s->n;
    double cmax = 0.0, diff = 0.0;
    for (size_t i = 0; i < nc; i++) {
        const double a = o.c[OP_OB_SGEMM][i], b = o.c[OP_BLIS_SGEMM][i];
        cmax = cmax > (b < 0 ? -b : b) ? cmax : (b < 0 ? -b : b);
        const double d = a > b ? a - b : b - a;
        diff = diff > d ? diff : d;
    }
    double ref_err[N_OPS] = {0};
    for (int t = 0; t < 61; t++) {
        const int i = (int)((size_t)t * 7919u % (size_t)s->m);
        const int j = (int)((size_t)t * 104729u % (size_t)s->n);
        for (int op = 0; op < N_OPS; op++) {
            if (op == OP_OB_SBGEMM && !with_bf16)
                continue;
            const double r = reference(&o, i, j, op == OP_OB_SBGEMM);
            const double d = o.c[op][(size_t)i * s->n + j] - r;
            ref_err[op] = ref_err[op] > (d < 0 ? -d : d) ? ref_err[op] : (d < 0 ? -d : d);
        }
    }
    const double denom = cmax > 0.0 ? cmax : 1.0;
    const double rel = diff / denom, tol = 1e-3;
    int ok = cmax > 0.0 && rel <= tol;
    for (int op = 0; op < N_OPS; op++)
        ok = ok && ref_err[op] / denom <= tol;
    printf("{\"check\":\"%s\",\"trans\":\"%c%c\",\"m\":%d,\"n\":%d,\"k\":%d,"
           "\"max_abs_c\":%.4g,\"openblas_vs_blis_rel\":%.3g,\"openblas_vs_ref_rel\":%.3g,"
           "\"blis_vs_ref_rel\":%.3g",
           s->name, s->ta, s->tb, s->m, s->n, s->k, cmax, rel,
           ref_err[OP_OB_SGEMM] / denom, ref_err[OP_BLIS_SGEMM] / denom);
    if (with_bf16)
        printf(",\"sbgemm_vs_bf16_ref_rel\":%.3g", ref_err[OP_OB_SBGEMM] / denom);
    printf(",\"tolerance\":%g,\"ok\":%s}\n", tol, ok ? "true" : "false");
    operands_free(&o);
    return ok;
}

typedef struct {
    int threads, reps, block;
} bench_cfg;

/* Per shape and op: the sums of best and median seconds over an MLP step's GEMMs. */
typedef struct {
    double best[3][N_OPS], med[3][N_OPS];
    int count[3];
} step_totals;

/* Times every op on shape s, alternating libraries in rounds; prints one JSON line per op.
 * Returns 0 or -1 (out of memory). */
static int time_shape(const blas_libs *l, const bench_cfg *cfg, const gemm_shape *s,
                      int with_sb, step_totals *tot, double *waited)
{
    operands o;
    if (operands_init(&o, s, with_sb) != 0)
        return -1;
    double *t[N_OPS];
    for (int op = 0; op < N_OPS; op++)
        t[op] = calloc((size_t)cfg->reps, sizeof(double));
    if (!t[0] || !t[1] || !t[2]) {
        for (int op = 0; op < N_OPS; op++)
            free(t[op]);
        operands_free(&o);
        return -1;
    }
    /* Even rounds: OpenBLAS sgemm, sbgemm, BLIS; odd rounds the reverse. */
    static const int order[2][N_OPS] = {{OP_OB_SGEMM, OP_OB_SBGEMM, OP_BLIS_SGEMM},
                                        {OP_BLIS_SGEMM, OP_OB_SBGEMM, OP_OB_SGEMM}};
    int done = 0;
    for (int round = 0; done < cfg->reps; round++) {
        const int n = cfg->reps - done < cfg->block ? cfg->reps - done : cfg->block;
        int last_lib = -1;
        for (int i = 0; i < N_OPS; i++) {
            const int op = order[round % 2][i];
            if (op == OP_OB_SBGEMM && !with_sb)
                continue;
            const int lib = op == OP_BLIS_SGEMM;
            if (lib != last_lib)
                *waited += quiesce();
            last_lib = lib;
            call(l, op, &o); /* warm-up: caches, and the library's threads awake */
            for (int r = 0; r < n; r++) {
                const double t0 = now_s();
                call(l, op, &o);
                t[op][done + r] = now_s() - t0;
            }
        }
        done += n;
    }
    for (int op = 0; op < N_OPS; op++) {
        if (op == OP_OB_SBGEMM && !with_sb)
            continue;
        const double med = median(t[op], cfg->reps), best = t[op][0];
        printf("{\"shape\":\"%s\",\"trans\":\"%c%c\",\"m\":%d,\"n\":%d,\"k\":%d,\"op\":\"%s\","
               "\"lib\":\"%s\",\"threads\":%d,\"reps\":%d,\"gflops_best\":%.1f,"
               "\"gflops_median\":%.1f,\"ms_best\":%.4f,\"ms_median\":%.4f}\n",
               s->name, s->ta, s->tb, s->m, s->n, s->k, op_name[op], op_lib[op], cfg->threads,
               cfg->reps, flops(s) / best / 1e9, flops(s) / med / 1e9, best * 1e3, med * 1e3);
        tot->best[s->group][op] += best;
        tot->med[s->group][op] += med;
    }
    tot->count[s->group]++;
    fflush(stdout);
    for (int op = 0; op < N_OPS; op++)
        free(t[op]);
    operands_free(&o);
    return 0;
}

/* oneDNN's row-major sgemm (dnnl_sgemm, oneDNN >= 1.0) and OpenMP's thread count, for
 * --sgemm-peak: the trainer's other fp32 GEMM library (common/nn/gemm.h). */
typedef int (*dnnl_sgemm_fn)(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
                             const float *a, int64_t lda, const float *b, int64_t ldb,
                             float beta, float *c, int64_t ldc);
#define ONEDNN_DEFAULT "libdnnl.so.2"

/* The best of reps 2048^3 NN products through f (0: OpenBLAS, 1: oneDNN), in seconds. */
static double peak_of(const blas_libs *l, dnnl_sgemm_fn dn, operands *o, int reps)
{
    const gemm_shape *sq = o->s;
    double best = 1e30;
    for (int r = 0; r <= reps; r++) { /* the first call is the warm-up */
        const double t0 = now_s();
        if (dn)
            dn('N', 'N', sq->m, sq->n, sq->k, 1.0f, o->a, o->lda, o->b, o->ldb, 0.0f,
               o->c[OP_OB_SGEMM], sq->n);
        else
            call(l, OP_OB_SGEMM, o);
        const double dt = now_s() - t0;
        if (r > 0)
            best = dt < best ? dt : best;
    }
    return best;
}

/* --sgemm-peak: the best 2048^3 NN GFLOP/s of OpenBLAS and of oneDNN (when libdnnl loads)
 * on `threads` threads; sgemm_gflops is the faster, the machine's ceiling for the trainer
 * whichever library it uses. Returns 0 or -1 (out of memory). */
static int sgemm_peak(const blas_libs *l, int reps, int threads)
{
    operands o;
    const gemm_shape *sq = &shapes[N_SHAPES - 1];
    if (operands_init(&o, sq, 0) != 0)
        return -1;
    const double ob = flops(sq) / peak_of(l, NULL, &o, reps) / 1e9;
    double dn = 0.0;
    void *lib = dlopen(ONEDNN_DEFAULT, RTLD_NOW | RTLD_LOCAL);
    dnnl_sgemm_fn f = lib ? (dnnl_sgemm_fn)dlsym(lib, "dnnl_sgemm") : NULL;
    void *gomp = lib ? dlopen("libgomp.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
    void (*omp_threads)(int) = gomp ? (void (*)(int))dlsym(gomp, "omp_set_num_threads") : NULL;
    if (f && omp_threads) {
        quiesce(); /* OpenBLAS's spinning workers off the cores first */
        omp_threads(threads);
        dn = flops(sq) / peak_of(l, f, &o, reps) / 1e9;
    }
    printf("{\"sgemm_gflops\":%.1f,\"openblas_gflops\":%.1f,\"onednn_gflops\":%.1f}\n",
           dn > ob ? dn : ob, ob, dn);
    operands_free(&o);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_gemm [--threads N=2] [--reps R=20] [--block B=5] "
               "[--openblas PATH] [--blis PATH] [--blis-arch auto|native|NAME] [--need-sbgemm] "
               "[--sgemm-peak]\n");
}

int main(int argc, char **argv)
{
    bench_cfg cfg = {.threads = 2, .reps = 0, .block = 5};
    blas_libs l = {.ob_path = OPENBLAS_DEFAULT};
    int peak = 0, need_sb = 0;
    const char *blis_arch = "auto", *blis_how = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--sgemm-peak") == 0)
            peak = 1;
        else if (strcmp(a, "--need-sbgemm") == 0)
            need_sb = 1;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (v && strcmp(a, "--threads") == 0)
            cfg.threads = atoi(v), i++;
        else if (v && strcmp(a, "--reps") == 0)
            cfg.reps = atoi(v), i++;
        else if (v && strcmp(a, "--block") == 0)
            cfg.block = atoi(v), i++;
        else if (v && strcmp(a, "--openblas") == 0)
            l.ob_path = v, i++;
        else if (v && strcmp(a, "--blis") == 0)
            l.blis_path = v, i++;
        else if (v && strcmp(a, "--blis-arch") == 0)
            blis_arch = v, i++;
        else {
            fprintf(stderr, "bench_gemm: unknown or incomplete flag %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (cfg.reps == 0)
        cfg.reps = peak ? 10 : 20;
    if (cfg.threads < 1 || cfg.reps < 1 || cfg.block < 1) {
        fprintf(stderr, "bench_gemm: --threads, --reps and --block must be at least 1\n");
        return 2;
    }
    char err[512];
    if (libs_open(&l, !peak, need_sb, err, sizeof err) != 0) {
        fprintf(stderr, "bench_gemm: %s\n", err);
        return 2;
    }
    l.ob_set_threads(cfg.threads);
    if (peak) {
        if (sgemm_peak(&l, cfg.reps, cfg.threads) == 0)
            return 0;
        fprintf(stderr, "bench_gemm: out of memory for 2048^3 operands\n");
        return 1;
    }
    if (blis_arch_choose(&l, blis_arch, &blis_how, err, sizeof err) != 0) {
        fprintf(stderr, "bench_gemm: %s\n", err);
        return 2;
    }
    l.blis_set_threads(cfg.threads);
    const int with_sb = l.ob_sbgemm != NULL;

    printf("{\"openblas\":\"%s\",\"openblas_config\":\"%s\",\"openblas_corename\":\"%s\","
           "\"openblas_threads\":%d,\"blis\":\"%s\",\"blis_version\":\"%s\","
           "\"blis_arch\":\"%s\",\"blis_arch_how\":\"%s\",\"blis_threads\":%lld,\"threads\":%d,\"reps\":%d,"
           "\"block\":%d,\"sbgemm\":%s}\n",
           l.ob_path, l.ob_config ? l.ob_config() : "", l.ob_corename ? l.ob_corename() : "",
           l.ob_get_threads ? l.ob_get_threads() : -1, l.blis_path,
           l.blis_version ? l.blis_version() : "",
           l.blis_arch_id && l.blis_arch_name ? l.blis_arch_name(l.blis_arch_id()) : "", blis_how,
           l.blis_get_threads ? (long long)l.blis_get_threads() : -1LL, cfg.threads, cfg.reps,
           cfg.block, with_sb ? "true" : "false");
    if (!with_sb)
        printf("{\"skipped\":\"sbgemm\",\"why\":\"%s has no cblas_sbgemm (OpenBLAS built "
               "without BUILD_BFLOAT16, as Debian's 0.3.21 is); pass one built with it as "
               "--openblas PATH\"}\n", l.ob_path);
    fflush(stdout);

    /* One check per transpose case, on the MLP-1024 shapes, before any timing. */
    int failed = 0;
    for (size_t i = 0; i < N_SHAPES; i++) {
        if (strcmp(shapes[i].name, "mlp1024.l2.fwd") != 0 &&
            strcmp(shapes[i].name, "mlp1024.l2.dw") != 0 &&
            strcmp(shapes[i].name, "mlp1024.l2.dinp") != 0)
            continue;
        const int r = check(&l, &shapes[i], with_sb);
        if (r < 0) {
            fprintf(stderr, "bench_gemm: out of memory for %s\n", shapes[i].name);
            return 1;
        }
        failed |= !r;
    }
    if (failed) {
        fprintf(stderr, "bench_gemm: OpenBLAS and BLIS results disagree (see the check lines): "
                        "the timings would not be of real work\n");
        return 1;
    }

    step_totals tot = {0};
    double waited = 0.0;
    for (size_t i = 0; i < N_SHAPES; i++) {
        const int sb = with_sb && shapes[i].group != 2; /* sbgemm: MLP-1024 and the square */
        if (time_shape(&l, &cfg, &shapes[i], sb, &tot, &waited) != 0) {
            fprintf(stderr, "bench_gemm: out of memory for %s\n", shapes[i].name);
            return 1;
        }
    }
    /* Totals of one training step's GEMMs (median and best per shape, summed). */
    for (int g = 1; g <= 2; g++) {
        const double ob = tot.med[g][OP_OB_SGEMM], bl = tot.med[g][OP_BLIS_SGEMM];
        printf("{\"summary\":\"mlp%d_step_gemms\",\"gemms\":%d,\"openblas_sgemm_ms_median\":%.3f,"
               "\"blis_sgemm_ms_median\":%.3f,\"blis_over_openblas_median\":%.3f,"
               "\"openblas_sgemm_ms_best\":%.3f,\"blis_sgemm_ms_best\":%.3f,"
               "\"blis_over_openblas_best\":%.3f",
               g == 1 ? 1024 : 4096, tot.count[g], ob * 1e3, bl * 1e3, bl / ob,
               tot.best[g][OP_OB_SGEMM] * 1e3, tot.best[g][OP_BLIS_SGEMM] * 1e3,
               tot.best[g][OP_BLIS_SGEMM] / tot.best[g][OP_OB_SGEMM]);
        if (with_sb && g == 1)
            printf(",\"openblas_sbgemm_ms_median\":%.3f,\"sbgemm_over_sgemm_median\":%.3f",
                   tot.med[g][OP_OB_SBGEMM] * 1e3, tot.med[g][OP_OB_SBGEMM] / ob);
        printf(",\"quiesce_s\":%.2f}\n", waited);
    }
    return 0;
}
