/* test_layers.c — the CPU layer kernels (common/nn/layers.c) against naive references.
 *
 * Forward kernels are compared with triple loops accumulated in double. Gradients are
 * checked against central finite differences two ways: of a double-precision reference
 * forward (tight tolerance, tests the formula) and of the float kernel under test itself
 * (loose tolerance, tests that forward and backward belong together). Scalar losses are
 * L = sum(out * R) for a fixed random R, so dL/dout = R. Shapes are odd on purpose
 * (B=3, IC=5, OC=7; B=1; one size past BLAS block boundaries). Outputs that the header
 * says are overwritten are pre-filled with NaN, so a kernel that reads them fails. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "common/nn/layers.h"
#include "common/pool.h"
#include "common/rng.h"

/* ---- helpers ------------------------------------------------------------------------ */

static float *falloc(size_t n)
{
    float *p = malloc(n * sizeof *p);
    cr_assert_not_null(p);
    return p;
}

static void fill_uniform(float *x, size_t n, float lo, float hi, uint64_t seed)
{
    pst_rng r;
    pst_rng_seed(&r, seed, 7);
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * pst_rng_uniform(&r);
}

static void fill_nan(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

static int close_enough(double got, double want, double atol, double rtol)
{
    return fabs(got - want) <= atol + rtol * fabs(want);
}

/* out (B, OC) = inp (B, IC) @ w^T + b, optional ReLU; all double. */
static void ref_linear(double *out, const double *inp, const double *w, const double *b, int B,
                       int IC, int OC, int relu)
{
    for (int i = 0; i < B; i++)
        for (int o = 0; o < OC; o++) {
            double s = b[o];
            for (int k = 0; k < IC; k++)
                s += inp[i * IC + k] * w[o * IC + k];
            out[i * OC + o] = relu && s < 0.0 ? 0.0 : s;
        }
}

static double *to_double(const float *x, size_t n)
{
    double *d = malloc(n * sizeof *d);
    cr_assert_not_null(d);
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

/* ---- linear forward ----------------------------------------------------------------- */

static void check_linear_forward(int B, int IC, int OC, int relu, uint64_t seed)
{
    float *inp = falloc((size_t)B * IC), *w = falloc((size_t)OC * IC), *b = falloc(OC);
    float *out = falloc((size_t)B * OC);
    fill_uniform(inp, (size_t)B * IC, -1, 1, seed);
    fill_uniform(w, (size_t)OC * IC, -1, 1, seed + 1);
    fill_uniform(b, OC, -1, 1, seed + 2);
    fill_nan(out, (size_t)B * OC); /* overwritten, never read */
    pst_linear_forward(out, inp, w, b, B, IC, OC, relu);

    double *di = to_double(inp, (size_t)B * IC), *dw = to_double(w, (size_t)OC * IC);
    double *db = to_double(b, OC), *want = malloc(sizeof(double) * B * OC);
    ref_linear(want, di, dw, db, B, IC, OC, relu);
    int zeros = 0, positives = 0;
    for (int i = 0; i < B * OC; i++) {
        cr_expect(close_enough(out[i], want[i], 1e-5 * sqrt(IC), 1e-5),
                  "B=%d IC=%d OC=%d relu=%d: out[%d] = %.9g, reference %.9g", B, IC, OC, relu,
                  i, out[i], want[i]);
        if (relu)
            cr_expect(out[i] >= 0.0f, "ReLU output %d is negative: %g", i, out[i]);
        zeros += out[i] == 0.0f;
        positives += out[i] > 0.0f;
    }
    if (relu && B * OC >= 7) /* the data must exercise both sides of the ReLU */
        cr_expect(zeros > 0 && positives > 0, "zeros %d positives %d", zeros, positives);
    free(inp); free(w); free(b); free(out); free(di); free(dw); free(db); free(want);
}

Test(linear_forward, odd_sizes_no_relu)
{
    check_linear_forward(3, 5, 7, 0, 1);
    check_linear_forward(1, 5, 7, 0, 2);
    check_linear_forward(7, 1, 3, 0, 3);
    check_linear_forward(3, 7, 1, 0, 4);
}

Test(linear_forward, odd_sizes_relu)
{
    check_linear_forward(3, 5, 7, 1, 11);
    check_linear_forward(1, 5, 7, 1, 12);
    check_linear_forward(5, 3, 9, 1, 13);
}

Test(linear_forward, sizes_past_blas_blocks)
{
    check_linear_forward(33, 67, 129, 0, 21);
    check_linear_forward(33, 67, 129, 1, 22);
}

Test(linear_forward, exact_small_case)
{
    /* Hand-computed: inp (2,2), w (3,2), bias (3). */
    const float inp[] = {1, 2, -1, 0.5f};
    const float w[] = {1, 0, 0, 1, 1, -1};
    const float b[] = {0.5f, -3, 0};
    float out[6];
    pst_linear_forward(out, inp, w, b, 2, 2, 3, 0);
    const float want[] = {1.5f, -1, -1, -0.5f, -2.5f, -1.5f};
    for (int i = 0; i < 6; i++)
        cr_expect_eq(out[i], want[i], "out[%d] = %g, want %g", i, out[i], want[i]);
    pst_linear_forward(out, inp, w, b, 2, 2, 3, 1);
    const float want_relu[] = {1.5f, 0, 0, 0, 0, 0};
    for (int i = 0; i < 6; i++)
        cr_expect_eq(out[i], want_relu[i], "relu out[%d] = %g, want %g", i, out[i],
                     want_relu[i]);
}

/* ---- linear backward ---------------------------------------------------------------- */

typedef struct lin_case {
    int B, IC, OC;
    float *inp, *w, *b, *R; /* R (B, OC): L = sum(out * R) */
} lin_case;

static lin_case lin_make(int B, int IC, int OC, uint64_t seed)
{
    lin_case c = {B, IC, OC, falloc((size_t)B * IC), falloc((size_t)OC * IC), falloc(OC),
                  falloc((size_t)B * OC)};
    fill_uniform(c.inp, (size_t)B * IC, -1, 1, seed);
    fill_uniform(c.w, (size_t)OC * IC, -1, 1, seed + 1);
    fill_uniform(c.b, OC, -1, 1, seed + 2);
    fill_uniform(c.R, (size_t)B * OC, -1, 1, seed + 3);
    return c;
}

static void lin_free(lin_case *c)
{
    free(c->inp); free(c->w); free(c->b); free(c->R);
}

/* L in double from a double reference forward on (possibly perturbed) double copies. */
static double lin_loss_ref(const lin_case *c, const double *inp, const double *w,
                           const double *b)
{
    double *out = malloc(sizeof(double) * c->B * c->OC);
    ref_linear(out, inp, w, b, c->B, c->IC, c->OC, 0);
    double L = 0;
    for (int i = 0; i < c->B * c->OC; i++)
        L += out[i] * c->R[i];
    free(out);
    return L;
}

/* L of the float kernel under test, accumulated in double. */
static double lin_loss_kernel(const lin_case *c)
{
    float *out = falloc((size_t)c->B * c->OC);
    pst_linear_forward(out, c->inp, c->w, c->b, c->B, c->IC, c->OC, 0);
    double L = 0;
    for (int i = 0; i < c->B * c->OC; i++)
        L += (double)out[i] * c->R[i];
    free(out);
    return L;
}

/* Central differences of L w.r.t. every element of `which` (0 inp, 1 w, 2 b), in double
 * on the double reference. */
static void lin_fd_ref(const lin_case *c, int which, double *grad)
{
    double *inp = to_double(c->inp, (size_t)c->B * c->IC);
    double *w = to_double(c->w, (size_t)c->OC * c->IC);
    double *b = to_double(c->b, c->OC);
    double *x = which == 0 ? inp : which == 1 ? w : b;
    size_t n = which == 0 ? (size_t)c->B * c->IC : which == 1 ? (size_t)c->OC * c->IC : (size_t)c->OC;
    const double h = 1e-4;
    for (size_t i = 0; i < n; i++) {
        double save = x[i];
        x[i] = save + h;
        double lp = lin_loss_ref(c, inp, w, b);
        x[i] = save - h;
        double lm = lin_loss_ref(c, inp, w, b);
        x[i] = save;
        grad[i] = (lp - lm) / (2 * h);
    }
    free(inp); free(w); free(b);
}

/* The same on the float kernel with h = 1e-2. */
static void lin_fd_kernel(lin_case *c, int which, double *grad)
{
    float *x = which == 0 ? c->inp : which == 1 ? c->w : c->b;
    size_t n = which == 0 ? (size_t)c->B * c->IC : which == 1 ? (size_t)c->OC * c->IC : (size_t)c->OC;
    const float h = 1e-2f;
    for (size_t i = 0; i < n; i++) {
        float save = x[i];
        x[i] = save + h;
        double lp = lin_loss_kernel(c);
        x[i] = save - h;
        double lm = lin_loss_kernel(c);
        x[i] = save;
        grad[i] = (lp - lm) / ((double)(save + h) - (double)(save - h));
    }
}

static void expect_grad(const char *what, const float *got, const double *want, size_t n,
                        double atol, double rtol, const lin_case *c)
{
    double maxabs = 0;
    for (size_t i = 0; i < n; i++) {
        cr_expect(close_enough(got[i], want[i], atol, rtol),
                  "B=%d IC=%d OC=%d %s[%zu] = %.9g, finite differences %.9g", c->B, c->IC,
                  c->OC, what, i, got[i], want[i]);
        maxabs = fmax(maxabs, fabs(want[i]));
    }
    cr_expect(maxabs > 1e-3, "%s: the reference gradient is all zero, the test is vacuous",
              what);
}

static void check_linear_backward(int B, int IC, int OC, uint64_t seed)
{
    lin_case c = lin_make(B, IC, OC, seed);
    float *dinp = falloc((size_t)B * IC), *dw = falloc((size_t)OC * IC), *db = falloc(OC);
    fill_nan(dinp, (size_t)B * IC); /* accumulate = 0 overwrites all three */
    fill_nan(dw, (size_t)OC * IC);
    fill_nan(db, OC);
    pst_linear_backward(dinp, dw, db, c.R, c.inp, c.w, B, IC, OC, 0);

    double *fi = malloc(sizeof(double) * B * IC), *fw = malloc(sizeof(double) * OC * IC);
    double *fb = malloc(sizeof(double) * OC);
    lin_fd_ref(&c, 0, fi);
    lin_fd_ref(&c, 1, fw);
    lin_fd_ref(&c, 2, fb);
    expect_grad("dinp (ref FD)", dinp, fi, (size_t)B * IC, 1e-5, 1e-5, &c);
    expect_grad("dweight (ref FD)", dw, fw, (size_t)OC * IC, 1e-5, 1e-5, &c);
    expect_grad("dbias (ref FD)", db, fb, OC, 1e-5, 1e-5, &c);

    lin_fd_kernel(&c, 0, fi);
    lin_fd_kernel(&c, 1, fw);
    lin_fd_kernel(&c, 2, fb);
    expect_grad("dinp (kernel FD)", dinp, fi, (size_t)B * IC, 1e-3, 1e-2, &c);
    expect_grad("dweight (kernel FD)", dw, fw, (size_t)OC * IC, 1e-3, 1e-2, &c);
    expect_grad("dbias (kernel FD)", db, fb, OC, 1e-3, 1e-2, &c);

    free(fi); free(fw); free(fb); free(dinp); free(dw); free(db);
    lin_free(&c);
}

Test(linear_backward, finite_differences_odd_sizes)
{
    check_linear_backward(3, 5, 7, 100);
    check_linear_backward(1, 5, 7, 200);
    check_linear_backward(4, 1, 3, 300);
    check_linear_backward(2, 3, 1, 400);
}

Test(linear_backward, finite_differences_past_blas_blocks)
{
    check_linear_backward(17, 33, 21, 500);
}

Test(linear_backward, accumulate_adds_to_existing_values)
{
    const int B = 3, IC = 5, OC = 7;
    lin_case c = lin_make(B, IC, OC, 600);
    float *dw0 = falloc(OC * IC), *db0 = falloc(OC), *dw = falloc(OC * IC), *db = falloc(OC);
    float *dinp0 = falloc(B * IC), *dinp = falloc(B * IC);
    pst_linear_backward(dinp0, dw0, db0, c.R, c.inp, c.w, B, IC, OC, 0);

    /* Start from known values; accumulate = 1 must give them plus the gradient. */
    fill_uniform(dw, OC * IC, -5, 5, 601);
    fill_uniform(db, OC, -5, 5, 602);
    float *dw_start = falloc(OC * IC), *db_start = falloc(OC);
    memcpy(dw_start, dw, sizeof(float) * OC * IC);
    memcpy(db_start, db, sizeof(float) * OC);
    fill_nan(dinp, B * IC); /* dinp is overwritten even when accumulating */
    pst_linear_backward(dinp, dw, db, c.R, c.inp, c.w, B, IC, OC, 1);
    for (int i = 0; i < OC * IC; i++)
        cr_expect(close_enough(dw[i], (double)dw_start[i] + dw0[i], 1e-5, 1e-5),
                  "dweight[%d] = %g, want %g + %g", i, dw[i], dw_start[i], dw0[i]);
    for (int i = 0; i < OC; i++)
        cr_expect(close_enough(db[i], (double)db_start[i] + db0[i], 1e-5, 1e-5),
                  "dbias[%d] = %g, want %g + %g", i, db[i], db_start[i], db0[i]);
    for (int i = 0; i < B * IC; i++)
        cr_expect(close_enough(dinp[i], dinp0[i], 1e-6, 1e-6), "dinp[%d] = %g, want %g", i,
                  dinp[i], dinp0[i]);

    /* Twice with accumulate after an overwrite: exactly twice the gradient (to rounding). */
    pst_linear_backward(NULL, dw, db, c.R, c.inp, c.w, B, IC, OC, 0);
    pst_linear_backward(NULL, dw, db, c.R, c.inp, c.w, B, IC, OC, 1);
    for (int i = 0; i < OC * IC; i++)
        cr_expect(close_enough(dw[i], 2.0 * dw0[i], 1e-6, 1e-6), "2x dweight[%d]", i);
    for (int i = 0; i < OC; i++)
        cr_expect(close_enough(db[i], 2.0 * db0[i], 1e-6, 1e-6), "2x dbias[%d]", i);

    free(dw0); free(db0); free(dw); free(db); free(dinp0); free(dinp); free(dw_start);
    free(db_start);
    lin_free(&c);
}

Test(linear_backward, null_dinp_is_skipped)
{
    const int B = 3, IC = 5, OC = 7;
    lin_case c = lin_make(B, IC, OC, 700);
    float *dw0 = falloc(OC * IC), *db0 = falloc(OC), *dinp0 = falloc(B * IC);
    float *dw = falloc(OC * IC), *db = falloc(OC);
    pst_linear_backward(dinp0, dw0, db0, c.R, c.inp, c.w, B, IC, OC, 0);
    fill_nan(dw, OC * IC);
    fill_nan(db, OC);
    pst_linear_backward(NULL, dw, db, c.R, c.inp, c.w, B, IC, OC, 0);
    cr_expect_eq(memcmp(dw, dw0, sizeof(float) * OC * IC), 0, "dweight differs without dinp");
    cr_expect_eq(memcmp(db, db0, sizeof(float) * OC), 0, "dbias differs without dinp");
    free(dw0); free(db0); free(dinp0); free(dw); free(db);
    lin_free(&c);
}

Test(linear_backward, deterministic)
{
    const int B = 9, IC = 13, OC = 11;
    lin_case c = lin_make(B, IC, OC, 800);
    float *a[3] = {falloc(B * IC), falloc(OC * IC), falloc(OC)};
    float *d[3] = {falloc(B * IC), falloc(OC * IC), falloc(OC)};
    pst_linear_backward(a[0], a[1], a[2], c.R, c.inp, c.w, B, IC, OC, 0);
    pst_linear_backward(d[0], d[1], d[2], c.R, c.inp, c.w, B, IC, OC, 0);
    cr_expect_eq(memcmp(a[0], d[0], sizeof(float) * B * IC), 0);
    cr_expect_eq(memcmp(a[1], d[1], sizeof(float) * OC * IC), 0);
    cr_expect_eq(memcmp(a[2], d[2], sizeof(float) * OC), 0);
    for (int i = 0; i < 3; i++) {
        free(a[i]);
        free(d[i]);
    }
    lin_free(&c);
}

/* ---- ReLU backward ------------------------------------------------------------------ */

Test(relu_backward, masks_by_output)
{
    const float out[] = {0.0f, 1.5f, 0.0f, 1e-30f, 3.0f, 0.0f, 2.0f};
    const float dout[] = {1.0f, -2.0f, 3.0f, 4.0f, -5.0f, 6.0f, 7.0f};
    const float want[] = {0.0f, -2.0f, 0.0f, 4.0f, -5.0f, 0.0f, 7.0f};
    float dinp[7];
    fill_nan(dinp, 7);
    pst_relu_backward(dinp, dout, out, 7);
    for (int i = 0; i < 7; i++)
        cr_expect_eq(dinp[i], want[i], "dinp[%d] = %g, want %g", i, dinp[i], want[i]);
}

Test(relu_backward, in_place)
{
    const float out[] = {0.0f, 2.0f, 0.0f, 0.25f, 0.0f};
    float d[] = {1.0f, 2.0f, -3.0f, -4.0f, 5.0f};
    const float want[] = {0.0f, 2.0f, 0.0f, -4.0f, 0.0f};
    pst_relu_backward(d, d, out, 5);
    for (int i = 0; i < 5; i++)
        cr_expect_eq(d[i], want[i], "d[%d] = %g, want %g", i, d[i], want[i]);
}

Test(relu_backward, finite_differences_through_forward)
{
    /* L = sum(relu(inp @ w^T + b) * R): dpre = relu_backward(R, out), and the gradient
     * of the pre-activation is checked by finite differences of the bias. */
    const int B = 4, IC = 5, OC = 7;
    lin_case c = lin_make(B, IC, OC, 900);
    float *out = falloc(B * OC), *dpre = falloc(B * OC);
    pst_linear_forward(out, c.inp, c.w, c.b, B, IC, OC, 1);
    pst_relu_backward(dpre, c.R, out, (int64_t)B * OC);
    double *di = to_double(c.inp, B * IC), *dw = to_double(c.w, OC * IC);
    double *db = to_double(c.b, OC), *o = malloc(sizeof(double) * B * OC);
    ref_linear(o, di, dw, db, B, IC, OC, 0);
    const double h = 1e-6;
    for (int i = 0; i < B; i++)
        for (int j = 0; j < OC; j++) {
            double pre = o[i * OC + j];
            if (fabs(pre) < 1e-4)
                continue; /* at the kink the derivative is not defined */
            double fp = fmax(pre + h, 0) * c.R[i * OC + j], fm = fmax(pre - h, 0) * c.R[i * OC + j];
            double want = (fp - fm) / (2 * h);
            cr_expect(close_enough(dpre[i * OC + j], want, 1e-6, 1e-6),
                      "dpre[%d,%d] = %g, want %g (pre %g)", i, j, dpre[i * OC + j], want, pre);
        }
    free(out); free(dpre); free(di); free(dw); free(db); free(o);
    lin_free(&c);
}

/* ---- softmax cross-entropy ---------------------------------------------------------- */

/* probs and the summed loss in double (log-sum-exp with the max subtracted). */
static double ref_xent(double *probs, const double *logits, const int32_t *t, int B, int C)
{
    double loss = 0;
    for (int b = 0; b < B; b++) {
        const double *l = logits + b * C;
        double m = l[0], s = 0;
        for (int j = 1; j < C; j++)
            m = fmax(m, l[j]);
        for (int j = 0; j < C; j++)
            s += exp(l[j] - m);
        if (probs)
            for (int j = 0; j < C; j++)
                probs[b * C + j] = exp(l[j] - m) / s;
        loss += log(s) + m - l[t[b]];
    }
    return loss;
}

Test(softmax_xent, forward_against_double_reference)
{
    const int B = 5, C = 7;
    float logits[5 * 7], probs[5 * 7];
    int32_t t[] = {0, 6, 3, 3, 1};
    fill_uniform(logits, B * C, -4, 4, 1000);
    fill_nan(probs, B * C);
    double loss = pst_softmax_xent_forward(probs, logits, t, B, C);

    double *dl = to_double(logits, B * C), want_p[5 * 7];
    double want = ref_xent(want_p, dl, t, B, C);
    cr_expect(close_enough(loss, want, 1e-6, 1e-6), "loss %.9g, reference %.9g", loss, want);
    /* The sum of -log p[target] over rows (not the mean). */
    double sum_nll = 0;
    for (int b = 0; b < B; b++)
        sum_nll += -log(want_p[b * C + t[b]]);
    cr_expect(close_enough(loss, sum_nll, 1e-6, 1e-6), "loss %.9g, sum of -log p %.9g", loss,
              sum_nll);
    for (int b = 0; b < B; b++) {
        double rowsum = 0;
        for (int j = 0; j < C; j++) {
            cr_expect(close_enough(probs[b * C + j], want_p[b * C + j], 1e-7, 1e-5),
                      "probs[%d,%d] = %.9g, reference %.9g", b, j, probs[b * C + j],
                      want_p[b * C + j]);
            rowsum += probs[b * C + j];
        }
        cr_expect(close_enough(rowsum, 1.0, 1e-6, 0), "row %d sums to %.9g", b, rowsum);
    }
    free(dl);
}

Test(softmax_xent, single_class_and_uniform)
{
    /* C = 1: p = 1, loss 0. Equal logits: p = 1/C, loss = B log C. */
    float l1[] = {3.0f, -7.0f}, p1[2];
    int32_t t1[] = {0, 0};
    double loss = pst_softmax_xent_forward(p1, l1, t1, 2, 1);
    cr_expect_eq(loss, 0.0, "C=1 loss %g", loss);
    cr_expect_eq(p1[0], 1.0f);
    cr_expect_eq(p1[1], 1.0f);

    float l4[8] = {2, 2, 2, 2, -1, -1, -1, -1}, p4[8];
    int32_t t4[] = {3, 0};
    loss = pst_softmax_xent_forward(p4, l4, t4, 2, 4);
    cr_expect(close_enough(loss, 2 * log(4.0), 1e-6, 1e-6), "uniform loss %.9g", loss);
    for (int i = 0; i < 8; i++)
        cr_expect(close_enough(p4[i], 0.25, 1e-7, 0), "p[%d] = %g", i, p4[i]);
}

Test(softmax_xent, stable_with_huge_logits)
{
    /* The largest logit sits first, last and in the middle, so a kernel that does not
     * subtract the row's maximum overflows somewhere. */
    const int B = 5, C = 3;
    const float logits[] = {1e4f, 0.0f, -1e4f,    /* target 1: loss 1e4 */
                            1e4f, 1e4f, -1e4f,    /* target 0: loss log 2 */
                            -1e4f, -1e4f, -1e4f,  /* target 2: loss log 3 */
                            -1e4f, 0.0f, 1e4f,    /* target 0: loss 2e4 */
                            0.0f, 1e4f, 0.0f};    /* target 1: loss ~0 */
    const int32_t t[] = {1, 0, 2, 0, 1};
    float probs[15];
    double loss = pst_softmax_xent_forward(probs, logits, t, B, C);
    cr_assert(isfinite(loss), "loss %g is not finite", loss);
    double want = 1e4 + log(2.0) + log(3.0) + 2e4;
    cr_expect(close_enough(loss, want, 1e-3, 1e-6), "loss %.9g, want %.9g", loss, want);
    cr_expect_eq(probs[11], 1.0f);
    cr_expect_eq(probs[13], 1.0f);
    for (int i = 0; i < 15; i++)
        cr_expect(isfinite(probs[i]) && probs[i] >= 0.0f && probs[i] <= 1.0f, "probs[%d] = %g",
                  i, probs[i]);
    cr_expect_eq(probs[0], 1.0f);
    cr_expect_eq(probs[1], 0.0f);
    cr_expect(close_enough(probs[3], 0.5, 1e-7, 0) && close_enough(probs[4], 0.5, 1e-7, 0));
    cr_expect(close_enough(probs[6], 1.0 / 3, 1e-7, 0));

    /* A very confident correct prediction: loss tiny but not negative, and finite. */
    const float sure[] = {50.0f, -50.0f};
    const int32_t t0[] = {0};
    float p[2];
    loss = pst_softmax_xent_forward(p, sure, t0, 1, 2);
    cr_expect(isfinite(loss) && loss >= 0.0 && loss < 1e-6, "confident loss %g", loss);
    /* The wrong target of the same row: loss 100 computed from the logits, not log(0). */
    const int32_t t1[] = {1};
    loss = pst_softmax_xent_forward(p, sure, t1, 1, 2);
    cr_expect(close_enough(loss, 100.0, 1e-4, 1e-6), "loss %g, want 100", loss);
}

Test(softmax_xent, backward_formula)
{
    const int B = 2, C = 3;
    const float probs[] = {0.2f, 0.3f, 0.5f, 0.6f, 0.1f, 0.3f};
    const int32_t t[] = {2, 0};
    float d[6];
    fill_nan(d, 6);
    pst_softmax_xent_backward(d, probs, t, B, C, 0.5f);
    const float want[] = {0.1f, 0.15f, -0.25f, -0.2f, 0.05f, 0.15f};
    for (int i = 0; i < 6; i++)
        cr_expect(close_enough(d[i], want[i], 1e-7, 0), "d[%d] = %.9g, want %.9g", i, d[i],
                  want[i]);
}

Test(softmax_xent, backward_finite_differences)
{
    const int B = 4, C = 5;
    const float scale = 1.0f / B;
    float logits[4 * 5], probs[4 * 5], d[4 * 5];
    const int32_t t[] = {4, 0, 2, 2};
    fill_uniform(logits, B * C, -3, 3, 1100);
    pst_softmax_xent_forward(probs, logits, t, B, C);
    fill_nan(d, B * C);
    pst_softmax_xent_backward(d, probs, t, B, C, scale);

    /* FD of scale * (sum of losses): the double reference, then the float kernel. */
    double *dl = to_double(logits, B * C);
    double maxabs = 0;
    for (int i = 0; i < B * C; i++) {
        const double h = 1e-5;
        double save = dl[i];
        dl[i] = save + h;
        double lp = ref_xent(NULL, dl, t, B, C);
        dl[i] = save - h;
        double lm = ref_xent(NULL, dl, t, B, C);
        dl[i] = save;
        double want = scale * (lp - lm) / (2 * h);
        cr_expect(close_enough(d[i], want, 1e-6, 1e-5), "dlogits[%d] = %.9g, ref FD %.9g", i,
                  d[i], want);
        maxabs = fmax(maxabs, fabs(want));

        const float hf = 1e-2f;
        float fsave = logits[i];
        float tmp[4 * 5];
        logits[i] = fsave + hf;
        double kp = pst_softmax_xent_forward(tmp, logits, t, B, C);
        logits[i] = fsave - hf;
        double km = pst_softmax_xent_forward(tmp, logits, t, B, C);
        logits[i] = fsave;
        double kwant = scale * (kp - km) / ((double)(fsave + hf) - (double)(fsave - hf));
        cr_expect(close_enough(d[i], kwant, 1e-3, 1e-2), "dlogits[%d] = %.9g, kernel FD %.9g",
                  i, d[i], kwant);
    }
    cr_expect(maxabs > 1e-2, "vacuous gradient");
    /* Each row of (p - onehot) sums to zero. */
    for (int b = 0; b < B; b++) {
        double s = 0;
        for (int j = 0; j < C; j++)
            s += d[b * C + j];
        cr_expect(close_enough(s, 0, 1e-6, 0), "row %d of dlogits sums to %g", b, s);
    }
    free(dl);
}

/* ---- slices (the CPU ops split a layer over threads with these) --------------------- */

/* Elementwise closeness of two float arrays (a slice's GEMM is a smaller OpenBLAS call,
 * which may pick another kernel and round differently: same math, not the same bits). */
static void expect_close(const char *what, const float *got, const float *want, size_t n,
                         double atol)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(close_enough(got[i], want[i], atol, 1e-5), "%s[%zu] = %.9g, whole call %.9g",
                  what, i, got[i], want[i]);
}

/* The kernels run slice by slice, cut at `cuts`, agree with the whole call, and a slice
 * writes nothing outside its range. */
static void check_slices(int B, int IC, int OC, const int *cuts, int ncuts, uint64_t seed)
{
    float *inp = falloc((size_t)B * IC), *w = falloc((size_t)OC * IC), *b = falloc(OC);
    float *dout = falloc((size_t)B * OC);
    fill_uniform(inp, (size_t)B * IC, -1, 1, seed);
    fill_uniform(w, (size_t)OC * IC, -1, 1, seed + 1);
    fill_uniform(b, OC, -1, 1, seed + 2);
    fill_uniform(dout, (size_t)B * OC, -1, 1, seed + 3);
    float *out = falloc((size_t)B * OC), *out_s = falloc((size_t)B * OC);
    float *dw = falloc((size_t)OC * IC), *dw_s = falloc((size_t)OC * IC);
    float *db = falloc(OC), *db_s = falloc(OC);
    float *dinp = falloc((size_t)B * IC), *dinp_s = falloc((size_t)B * IC);
    pst_linear_forward(out, inp, w, b, B, IC, OC, 1);
    pst_linear_backward(dinp, dw, db, dout, inp, w, B, IC, OC, 0);
    fill_nan(out_s, (size_t)B * OC);
    fill_nan(dw_s, (size_t)OC * IC);
    fill_nan(db_s, OC);
    fill_nan(dinp_s, (size_t)B * IC);
    for (int k = 0; k + 1 < ncuts; k++) {
        const int j0 = cuts[k] < OC ? cuts[k] : OC, j1 = cuts[k + 1] < OC ? cuts[k + 1] : OC;
        pst_linear_forward_cols(out_s, inp, w, b, B, IC, OC, 1, j0, j1);
        pst_linear_backward_weight_rows(dw_s, db_s, dout, inp, B, IC, OC, 0, j0, j1);
        /* Before the last slice, everything from j1 on is still untouched. */
        if (j1 < OC) {
            cr_assert(isnan(out_s[j1]) && isnan(db_s[j1]) && isnan(dw_s[(size_t)j1 * IC]),
                      "slice [%d, %d) wrote past its end", j0, j1);
        }
        const int i0 = cuts[k] < IC ? cuts[k] : IC, i1 = cuts[k + 1] < IC ? cuts[k + 1] : IC;
        pst_linear_backward_input_cols(dinp_s, dout, w, B, IC, OC, i0, i1);
    }
    /* The last cut reaches the end of every dimension: nothing is left NaN. */
    expect_close("out", out_s, out, (size_t)B * OC, 1e-5 * sqrt(IC));
    expect_close("dweight", dw_s, dw, (size_t)OC * IC, 1e-5 * sqrt(B));
    expect_close("dinp", dinp_s, dinp, (size_t)B * IC, 1e-5 * sqrt(OC));
    /* The bias gradient is our own loop: the same bits in any slice. */
    cr_assert_eq(memcmp(db, db_s, sizeof(float) * OC), 0, "bias-gradient slices differ");
    free(inp); free(w); free(b); free(dout); free(out); free(out_s); free(dw); free(dw_s);
    free(db); free(db_s); free(dinp); free(dinp_s);
}

Test(linear_slices, assemble_to_the_whole_call)
{
    const int odd[] = {0, 16, 48, 1 << 20};
    check_slices(33, 65, 70, odd, 4, 71);
    /* The MLP's shapes at batch 128, cut in two as a 2-thread team does. */
    const int halves_1024[] = {0, 512, 1 << 20}, halves_784[] = {0, 400, 1 << 20};
    check_slices(128, 784, 1024, halves_1024, 3, 72);
    check_slices(128, 784, 10, halves_784, 3, 73);
    /* A slice may be empty (a 10-wide output over two threads). */
    const int empty[] = {0, 0, 16, 16, 1 << 20};
    check_slices(7, 20, 10, empty, 5, 74);
}

/* The weight gradient's bits do not depend on how its rows are cut, as long as the cuts
 * fall on tiles (layers.h, PST_ROW_TILE): the executor's chunks and the threads' slices
 * give what one call over the whole layer gives. With OpenBLAS's Haswell kernels, calls
 * of other shapes give other bits (measured on an AMD EPYC: rows 504-511 of 1024 cut at
 * 512), which is what the tiles prevent. */
Test(linear_backward, row_cuts_on_tiles_keep_the_bits)
{
    const int B = 64, IC = 300, OC = 1100;
    float *dout = falloc((size_t)B * OC), *inp = falloc((size_t)B * IC);
    float *dw_full = falloc((size_t)OC * IC), *db_full = falloc((size_t)OC);
    float *dw_cut = falloc((size_t)OC * IC), *db_cut = falloc((size_t)OC);
    fill_uniform(dout, (size_t)B * OC, -1.0f, 1.0f, 71);
    fill_uniform(inp, (size_t)B * IC, 0.0f, 1.0f, 72);
    pst_linear_backward_weight_rows(dw_full, db_full, dout, inp, B, IC, OC, 0, 0, OC);
    const int cuts[][5] = {{512, OC, OC, OC, OC}, {256, 768, OC, OC, OC},
                           {768, 1024, OC, OC, OC}, {256, 512, 768, 1024, OC}};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        fill_nan(dw_cut, (size_t)OC * IC);
        fill_nan(db_cut, (size_t)OC);
        int j0 = 0;
        for (int k = 0; k < 5 && j0 < OC; k++) {
            pst_linear_backward_weight_rows(dw_cut, db_cut, dout, inp, B, IC, OC, 0, j0,
                                            cuts[c][k]);
            j0 = cuts[c][k];
        }
        cr_assert_eq(memcmp(dw_cut, dw_full, sizeof(float) * (size_t)OC * IC), 0,
                     "cuts {%d, %d, %d, %d}: dweight differs from the whole-layer call",
                     cuts[c][0], cuts[c][1], cuts[c][2], cuts[c][3]);
        cr_assert_eq(memcmp(db_cut, db_full, sizeof(float) * (size_t)OC), 0,
                     "cuts {%d, %d, %d, %d}: dbias differs", cuts[c][0], cuts[c][1],
                     cuts[c][2], cuts[c][3]);
    }
    free(dout);
    free(inp);
    free(dw_full);
    free(db_full);
    free(dw_cut);
    free(db_cut);
}

/* A forward's column slice zeroes its part of C and calls the GEMM with beta 1 (layers.c):
 * the bits of OpenBLAS's own beta 0 call, past the BLAS's K block (IC 900) and with NaN
 * where C was. */
Test(linear_slices, zeroed_slices_give_the_bits_of_a_beta_0_gemm)
{
    enum { B = 37, IC = 900, OC = 96, J0 = 16, J1 = 64 };
    float *inp = falloc((size_t)B * IC), *w = falloc((size_t)OC * IC);
    float *got = falloc((size_t)B * OC), *want = falloc((size_t)B * OC);
    fill_uniform(inp, (size_t)B * IC, -1.0f, 1.0f, 1);
    fill_uniform(w, (size_t)OC * IC, -1.0f, 1.0f, 2);
    fill_nan(got, (size_t)B * OC);
    fill_nan(want, (size_t)B * OC);
    pst_linear_forward_cols(got, inp, w, NULL, B, IC, OC, 0, J0, J1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, J1 - J0, IC, 1.0f, inp, IC,
                w + (size_t)J0 * IC, IC, 0.0f, want + J0, OC);
    for (int b = 0; b < B; b++)
        cr_assert_eq(memcmp(got + (size_t)b * OC + J0, want + (size_t)b * OC + J0,
                            sizeof(float) * (J1 - J0)), 0, "forward row %d", b);
    free(inp), free(w), free(got), free(want);
}

/* The input gradient's columns or rows beside the weight gradient's tiles
 * (pst_linear_dinp_part): every item once, in order, at multiples of the alignment, and
 * each part's multiply-adds within one aligned cut (plus a tile the cuts cannot move) of an
 * even share. */
static void check_dinp_parts(int64_t items, int64_t item_cost, int align, int wrows,
                             int64_t wrow_cost)
{
    for (int nparts = 1; nparts <= 6; nparts++) {
        size_t prev = 0;
        const double share = ((double)wrows * wrow_cost + (double)items * item_cost) / nparts;
        for (int p = 0; p < nparts; p++) {
            size_t lo, hi, wlo, whi;
            pst_linear_dinp_part(items, item_cost, align, wrows, wrow_cost, p, nparts, &lo, &hi);
            cr_assert_eq(lo, prev, "items %ld rows %d parts %d: part %d starts at %zu, not %zu",
                         (long)items, wrows, nparts, p, lo, prev);
            cr_assert_geq(hi, lo);
            cr_assert(hi % (size_t)align == 0 || hi == (size_t)items, "cut %zu", hi);
            prev = hi;
            pst_pool_split((size_t)wrows, p, nparts, PST_ROW_TILE, &wlo, &whi);
            const double work = (double)(whi - wlo) * wrow_cost + (double)(hi - lo) * item_cost;
            cr_assert_leq(work, share + (double)align * item_cost + (double)PST_ROW_TILE * wrow_cost,
                          "items %ld rows %d parts %d part %d: %.0f of %.0f", (long)items, wrows,
                          nparts, p, work, share);
        }
        cr_assert_eq(prev, (size_t)items, "items %ld rows %d parts %d: the cuts end at %zu",
                     (long)items, wrows, nparts, prev);
    }
}

Test(linear_slices, dinp_parts_cover_once_and_balance_the_tiles)
{
    /* (IC, OC, B): dinp by columns (IC items of B*OC) and by rows (B items of IC*OC) */
    const int shapes[][3] = {{128, 128, 2048}, {512, 128, 2048}, {128, 384, 2048},
                             {128, 512, 64},   {784, 1024, 128}, {1024, 10, 128},
                             {100, 700, 37},   {48, 2000, 5}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t IC = shapes[s][0], OC = shapes[s][1], B = shapes[s][2];
        check_dinp_parts(IC, B * OC, 16, (int)OC, B * IC);
        check_dinp_parts(B, IC * OC, 1, (int)OC, B * IC);
    }
    /* a one-tile layer on two threads: the second has the tile, the first all of dinp */
    size_t lo, hi, wlo, whi;
    pst_pool_split(128, 1, 2, PST_ROW_TILE, &wlo, &whi);
    cr_assert(wlo == 0 && whi == 128);
    pst_linear_dinp_part(128, 2048 * 128, 16, 128, 2048 * 128, 0, 2, &lo, &hi);
    cr_assert(lo == 0 && hi == 128);
    pst_linear_dinp_part(128, 2048 * 128, 16, 128, 2048 * 128, 1, 2, &lo, &hi);
    cr_assert(lo == 128 && hi == 128);
}
