/* test_gemm_bf16.c — bf16 GEMMs (common/nn/gemm_bf16.h) and the linear layer's bf16
 * kernels (layers.h): every product against a double-precision sum of the same
 * bf16-rounded operands, in both modes a CPU offers: emulated (bf16 operands widened and
 * multiplied by OpenBLAS; every CPU) and oneDNN's kernel (CPUs with AVX512_BF16 or AMX, and
 * its software kernel on other AVX-512 CPUs; where there is none the tests say so and check
 * the emulation alone). */
#include <criterion/criterion.h>

#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/nn/gemm_bf16.h"
#include "common/nn/layers.h"
#include "common/rng.h"

static void fill(float *x, size_t n, uint64_t seed)
{
    pst_rng r;
    pst_rng_seed(&r, seed, 3);
    for (size_t i = 0; i < n; i++)
        x[i] = 2.0f * pst_rng_uniform(&r) - 1.0f;
}

static uint16_t *bf16_of(const float *x, size_t n)
{
    uint16_t *h = malloc(n * sizeof *h);
    cr_assert_not_null(h);
    pst_cast(h, PST_BF16, x, PST_F32, n);
    return h;
}

static float *f32_of(const uint16_t *h, size_t n)
{
    float *x = malloc(n * sizeof *x);
    cr_assert_not_null(x);
    pst_cast(x, PST_F32, h, PST_BF16, n);
    return x;
}

/* The modes to test on this CPU: emulated always, oneDNN's kernel where it has one (with
 * AVX512_BF16 or AMX, and its software kernel on other AVX-512 CPUs). */
static int modes(int *m)
{
    char msg[256];
    int n = 0;
    if (pst_gemm_bf16_setup(PST_GEMM_BF16_ONEDNN, msg, sizeof msg))
        m[n++] = PST_GEMM_BF16_ONEDNN;
    cr_log_info("%s\n", msg);
    m[n++] = PST_GEMM_BF16_EMULATE;
    return n;
}

static void use(int mode)
{
    char msg[256];
    cr_assert_eq(pst_gemm_bf16_setup(mode, msg, sizeof msg), 1, "%s", msg);
}

/* Element (i, j) of op(X) for X stored (rows, ld) as bf16 values widened to double. */
static double at(const float *x, int trans, int ld, int i, int j)
{
    return trans ? x[(int64_t)j * ld + i] : x[(int64_t)i * ld + j];
}

/* One product against a double sum (pad: row strides past the widths, else dense): the
 * error of an fp32 sum of K exact products is below K * 2^-24 of the sum of their
 * magnitudes (plus the accumulated C). Elements of C outside the M x N block stay.
 * f32: fp32 operands through pst_gemm_onednn_f32 (oneDNN's path with an fp32 kernel),
 * whose products are rounded too: one more 2^-24 of each. */
static void check_product(int f32, int pad, int ta, int tb, int M, int N, int K, int acc,
                          uint64_t seed)
{
    const int lda = (ta ? M : K) + 3 * pad, ldb = (tb ? K : N) + 5 * pad, ldc = N + 7 * pad;
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
    const size_t nc = (size_t)M * ldc;
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c);
    cr_assert(a && b && c);
    fill(a, na, seed);
    fill(b, nb, seed + 1);
    fill(c, nc, seed + 2);
    uint16_t *a16 = bf16_of(a, na), *b16 = bf16_of(b, nb);
    float *ar = f32 ? a : f32_of(a16, na), *br = f32 ? b : f32_of(b16, nb);
    float *c0 = malloc(nc * sizeof *c0);
    cr_assert_not_null(c0);
    memcpy(c0, c, nc * sizeof *c);
    if (f32)
        cr_assert_eq(pst_gemm_onednn_f32(ta, tb, M, N, K, a, lda, b, ldb, acc, c, ldc), 0,
                     "oneDNN's fp32 matmul failed");
    else
        pst_gemm_bf16(ta, tb, M, N, K, a16, lda, b16, ldb, acc, c, ldc);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            const size_t e = (size_t)i * ldc + j;
            if (j >= N) {
                cr_assert_eq(memcmp(&c[e], &c0[e], sizeof *c), 0, "C[%d][%d] outside changed",
                             i, j);
                continue;
            }
            double s = acc ? c0[e] : 0.0, mag = acc ? fabs(c0[e]) : 0.0;
            for (int k = 0; k < K; k++) {
                const double p = at(ar, ta, lda, i, k) * at(br, tb, ldb, k, j);
                s += p;
                mag += fabs(p);
            }
            cr_assert_leq(fabs(c[e] - s), (K + 3) * 0x1p-24 * mag + 1e-30,
                          "%s ta %d tb %d %dx%dx%d acc %d: C[%d][%d] %.9g vs %.9g",
                          f32 ? "fp32" : "bf16", ta, tb, M, N, K, acc, i, j, c[e], s);
        }
    if (!f32)
        free(ar), free(br);
    free(a), free(b), free(c), free(c0), free(a16), free(b16);
}

/* every transposition, with and without C added, at a few sizes, dense (oneDNN's brgemm
 * kernels take only these) and with row strides past the widths */
static void check_products(int f32)
{
    for (int pad = 0; pad < 2; pad++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++) {
                    check_product(f32, pad, ta, tb, 7, 5, 3, acc, 11);
                    check_product(f32, pad, ta, tb, 33, 70, 129, acc, 12);
                    check_product(f32, pad, ta, tb, 64, 48, 300, acc, 13);
                }
    check_product(f32, 0, 0, 1, 1, 1, 1, 0, 14);
}

Test(gemm_bf16, off_until_set_up_and_each_mode_says_what_it_is)
{
    char msg[256];
    cr_assert_eq(pst_gemm_bf16_on(), 0, "on before any setup");
    cr_assert_eq(pst_gemm_bf16_setup(PST_GEMM_BF16_OFF, msg, sizeof msg), 0);
    cr_assert_str_eq(msg, "bf16 GEMMs off");
    cr_assert_eq(pst_gemm_bf16_setup(PST_GEMM_BF16_EMULATE, msg, sizeof msg), 1);
    cr_assert_eq(pst_gemm_bf16_on(), 1);
    cr_assert(strstr(msg, "bf16 GEMMs on, emulated"), "%s", msg);
    int capacity = -1; /* oneDNN's process-wide primitive cache is off: the threads' own
                        * tables hold the primitives */
    cr_assert_eq(dnnl_get_primitive_cache_capacity(&capacity), dnnl_success);
    cr_assert_eq(capacity, 0);
    const int kernel = pst_gemm_bf16_setup(PST_GEMM_BF16_ONEDNN, msg, sizeof msg);
    cr_assert(kernel ? strstr(msg, "matmul, kernel ") != NULL
                     : strstr(msg, "bf16 GEMMs off: oneDNN") && strstr(msg, "for this CPU"),
              "%s", msg);
    cr_assert_eq(pst_gemm_bf16_on(), kernel);
}

Test(gemm_bf16, every_transposition_against_a_double_sum, .timeout = 120)
{
    int m[2];
    const int nm = modes(m);
    for (int k = 0; k < nm; k++) {
        use(m[k]);
        check_products(0);
    }
}

/* The oneDNN path itself (memory descriptors with strides and transposes, the sum post-op
 * for C added to, primitives made per shape and thread) with an fp32 kernel, which oneDNN
 * has on every x86-64 CPU: on CPUs without a bf16 kernel this is what checks the path. */
Test(gemm_bf16, the_onednn_path_with_fp32_operands, .timeout = 120)
{
    use(PST_GEMM_BF16_EMULATE); /* makes oneDNN's engine (the emulation does too) */
    check_products(1);
}

/* The kernels of the linear layer against the fp32 kernels on the same bf16-rounded
 * operands (the same products; the sums may be ordered otherwise): forward by column
 * slices, the weight gradient by tiles (OC past PST_ROW_TILE) and with accumulate, with the
 * same bits however its rows are sliced, the input gradient by column slices. */
Test(linear_bf16, kernels_match_the_fp32_kernels_on_rounded_operands, .timeout = 120)
{
    const int B = 24, IC = 40, OC = 300;
    const size_t ni = (size_t)B * IC, nw = (size_t)OC * IC, no = (size_t)B * OC;
    float *inp = malloc(ni * 4), *w = malloc(nw * 4), *bias = malloc(OC * 4), *dout = malloc(no * 4);
    cr_assert(inp && w && bias && dout);
    fill(inp, ni, 1), fill(w, nw, 2), fill(bias, OC, 3), fill(dout, no, 4);
    uint16_t *w16 = bf16_of(w, nw), *i16 = bf16_of(inp, ni), *d16 = bf16_of(dout, no);
    float *wr = f32_of(w16, nw), *ir = f32_of(i16, ni), *dr = f32_of(d16, no);
    float *out = malloc(no * 4), *ref = malloc(no * 4), *dw = malloc(nw * 4), *dwr = malloc(nw * 4);
    float *db = malloc(OC * 4), *dbr = malloc(OC * 4), *di = malloc(ni * 4), *dir = malloc(ni * 4);
    cr_assert(out && ref && dw && dwr && db && dbr && di && dir);
    int m[2];
    const int nm = modes(m);
    for (int k = 0; k < nm; k++) {
        use(m[k]);
        /* forward: two column slices (cut at 16) against one fp32 call */
        pst_linear_forward_cols_bf16(out, inp, w16, bias, B, IC, OC, 1, 0, 160);
        pst_linear_forward_cols_bf16(out, inp, w16, bias, B, IC, OC, 1, 160, OC);
        pst_linear_forward_cols(ref, ir, wr, bias, B, IC, OC, 1, 0, OC);
        for (size_t e = 0; e < no; e++)
            cr_assert_leq(fabsf(out[e] - ref[e]), 1e-5f * (1.0f + fabsf(ref[e])), "out[%zu]", e);
        /* weight gradient: rows [0, 256) and [256, 300), then accumulated once more; the
         * bias gradient from the fp32 dout, as the fp32 kernel's */
        for (int acc = 0; acc < 2; acc++) {
            pst_linear_backward_weight_rows_bf16(dw, db, dout, inp, B, IC, OC, acc, 0, 256);
            pst_linear_backward_weight_rows_bf16(dw, db, dout, inp, B, IC, OC, acc, 256, OC);
            pst_linear_backward_weight_rows(dwr, dbr, dr, ir, B, IC, OC, acc, 0, OC);
            for (size_t e = 0; e < nw; e++)
                cr_assert_leq(fabsf(dw[e] - dwr[e]), 1e-5f * (1.0f + fabsf(dwr[e])),
                              "acc %d: dw[%zu] %.9g vs %.9g", acc, e, dw[e], dwr[e]);
        }
        /* the tiles make the bits: one call over all rows gives those of the two above */
        pst_linear_backward_weight_rows_bf16(dwr, dbr, dout, inp, B, IC, OC, 0, 0, 256);
        pst_linear_backward_weight_rows_bf16(dwr, dbr, dout, inp, B, IC, OC, 0, 256, OC);
        pst_linear_backward_weight_rows_bf16(dw, db, dout, inp, B, IC, OC, 0, 0, OC);
        cr_assert_eq(memcmp(dw, dwr, nw * 4), 0, "a slice of two tiles gave other bits");
        pst_linear_backward_weight_rows(dwr, dbr, dout, inp, B, IC, OC, 0, 0, OC);
        cr_assert_eq(memcmp(db, dbr, OC * 4), 0, "the bias gradient is the fp32 kernel's");
        /* input gradient: columns [0, 16) and [16, 40) */
        pst_linear_backward_input_cols_bf16(di, dout, w16, B, IC, OC, 0, 16);
        pst_linear_backward_input_cols_bf16(di, dout, w16, B, IC, OC, 16, IC);
        pst_linear_backward_input_cols(dir, dr, wr, B, IC, OC, 0, IC);
        for (size_t e = 0; e < ni; e++)
            cr_assert_leq(fabsf(di[e] - dir[e]), 1e-5f * (1.0f + fabsf(dir[e])), "dinp[%zu]", e);
    }
    free(inp), free(w), free(bias), free(dout), free(w16), free(i16), free(d16), free(wr);
    free(ir), free(dr), free(out), free(ref), free(dw), free(dwr), free(db), free(dbr);
    free(di), free(dir);
}

/* Each thread keeps its own products (oneDNN primitives and their memory objects): four
 * threads, each going over more shapes than a thread's table holds and then over some
 * again (products the table kept, products it dropped), get the bits one thread gets in
 * one pass. */
enum { THREADS = 4, SHAPES = 110 };

typedef struct job {
    const uint16_t *a, *b;
    const float *af, *bf; /* the same operands in fp32 */
    float *c;   /* SHAPES results of up to 8 x 8 */
    int passes; /* 2: some shapes again, kept and dropped ones (products()) */
} job;

static int f32_products; /* products() through pst_gemm_onednn_f32 */

static void *products(void *arg)
{
    job *j = arg;
    /* all shapes; then (passes 2) the last 64 again, which the table keeps (hits), and the
     * first 8 again, which it dropped for the last ones (made anew) */
    const int n = j->passes > 1 ? SHAPES + 64 + 8 : SHAPES;
    for (int i = 0; i < n; i++) {
        const int s = i < SHAPES ? i : i < SHAPES + 64 ? i - 64 : i - SHAPES - 64;
        const int M = 1 + s % 8, N = 1 + (s / 8) % 8, K = 1 + s % 13;
        if (f32_products)
            cr_assert_eq(pst_gemm_onednn_f32(s & 1, (s >> 1) & 1, M, N, K, j->af, 16, j->bf, 16,
                                             0, j->c + s * 64, 8),
                         0);
        else
            pst_gemm_bf16(s & 1, (s >> 1) & 1, M, N, K, j->a, 16, j->b, 16, 0, j->c + s * 64, 8);
    }
    return NULL;
}

Test(gemm_bf16, threads_keep_their_own_products, .timeout = 120)
{
    float a[256], b[256];
    fill(a, 256, 21);
    fill(b, 256, 22);
    uint16_t *a16 = bf16_of(a, 256), *b16 = bf16_of(b, 256);
    int m[2];
    const int nm = modes(m);
    for (int k = 0; k <= nm; k++) {
        f32_products = k == nm; /* last: the oneDNN path with fp32 operands */
        use(k < nm ? m[k] : PST_GEMM_BF16_EMULATE);
        float *want = calloc(SHAPES * 64, sizeof *want);
        cr_assert_not_null(want);
        job one = {a16, b16, a, b, want, 1};
        products(&one);
        pthread_t t[THREADS];
        job js[THREADS];
        for (int i = 0; i < THREADS; i++) {
            js[i] = (job){a16, b16, a, b, calloc(SHAPES * 64, sizeof(float)), 2};
            cr_assert_not_null(js[i].c);
            cr_assert_eq(pthread_create(&t[i], NULL, products, &js[i]), 0);
        }
        for (int i = 0; i < THREADS; i++) {
            pthread_join(t[i], NULL);
            cr_assert_eq(memcmp(js[i].c, want, SHAPES * 64 * sizeof(float)), 0,
                         "%s: thread %d got other bits", f32_products ? "fp32" : "bf16", i);
            free(js[i].c);
        }
        free(want);
    }
    free(a16), free(b16);
}
