/* test_ctr_layers.c — common/nn/ctr_layers.c, the click model's kernels: the interaction's
 * output against float64 dot products, its backward against the gradient of sum(dout * out)
 * by central differences in float64, BCE's loss and gradient against their definitions
 * (and the probabilities when scale is 0), strided embedding rows, and any split over rows
 * giving the same bits as one call. */
#include <criterion/criterion.h>

#include <math.h>
#include <string.h>

#include "common/nn/ctr_layers.h"
#include "common/rng.h"

enum { B = 5, F = 4, DIM = 3, STRIDE = 2 + F * DIM, W = DIM + (F + 1) * F / 2 };

static float bottom[B * DIM], emb[B * STRIDE], dout[B * W];

static void fill(void)
{
    pst_rng r;
    pst_rng_seed(&r, 4, 0);
    for (int i = 0; i < B * DIM; i++)
        bottom[i] = pst_rng_normal(&r);
    for (int i = 0; i < B * STRIDE; i++)
        emb[i] = pst_rng_normal(&r);
    for (int i = 0; i < B * W; i++)
        dout[i] = pst_rng_normal(&r);
}

/* v_f of row b in double */
static double v(const double *bot, const double *em, int b, int f, int k)
{
    return f == 0 ? bot[b * DIM + k] : em[b * STRIDE + (f - 1) * DIM + k];
}

/* sum(dout * interaction(bottom, emb)) in double */
static double objective(const double *bot, const double *em)
{
    double s = 0.0;
    for (int b = 0; b < B; b++) {
        int p = 0;
        for (int k = 0; k < DIM; k++)
            s += dout[b * W + p++] * bot[b * DIM + k];
        for (int i = 1; i <= F; i++)
            for (int j = 0; j < i; j++) {
                double d = 0.0;
                for (int k = 0; k < DIM; k++)
                    d += v(bot, em, b, i, k) * v(bot, em, b, j, k);
                s += dout[b * W + p++] * d;
            }
    }
    return s;
}

/* d objective / d *v (one of bot's or em's values) by central differences, step 1e-6. */
static double central_difference(double *bot, double *em, double *v)
{
    const double x = *v, h = 1e-6;
    *v = x + h;
    const double up = objective(bot, em);
    *v = x - h;
    const double down = objective(bot, em);
    *v = x;
    return (up - down) / (2 * h);
}

Test(ctr_layers, interaction_against_float64_and_central_differences)
{
    fill();
    static float out[B * W];
    pst_interact_forward(out, bottom, emb, STRIDE, F, DIM, 0, B);
    for (int b = 0; b < B; b++) {
        for (int k = 0; k < DIM; k++)
            cr_assert_eq(out[b * W + k], bottom[b * DIM + k]);
        int p = DIM;
        for (int i = 1; i <= F; i++)
            for (int j = 0; j < i; j++, p++) {
                double d = 0.0;
                for (int k = 0; k < DIM; k++) {
                    const float *vi = emb + b * STRIDE + (i - 1) * DIM;
                    const float *vj = j ? emb + b * STRIDE + (j - 1) * DIM : bottom + b * DIM;
                    d += (double)vi[k] * vj[k];
                }
                cr_assert_leq(fabs(out[b * W + p] - d), 1e-5 * (1 + fabs(d)), "row %d pair "
                              "(%d, %d)", b, i, j);
            }
    }
    static float db[B * DIM], de[B * STRIDE];
    for (int i = 0; i < B * STRIDE; i++)
        de[i] = 99.0f; /* the 2 columns past each row's F * DIM are left alone */
    pst_interact_backward(db, de, STRIDE, dout, bottom, emb, STRIDE, F, DIM, 0, B);
    static double bot[B * DIM], em[B * STRIDE];
    for (int i = 0; i < B * DIM; i++)
        bot[i] = bottom[i];
    for (int i = 0; i < B * STRIDE; i++)
        em[i] = emb[i];
    for (int i = 0; i < B * DIM; i++) {
        const double want = central_difference(bot, em, &bot[i]);
        cr_assert_leq(fabs(db[i] - want), 1e-4 * (1 + fabs(want)), "dbottom %d: %g vs %g", i,
                      (double)db[i], want);
    }
    for (int b = 0; b < B; b++)
        for (int c = 0; c < STRIDE; c++) {
            const int i = b * STRIDE + c;
            if (c >= F * DIM) {
                cr_assert_eq(de[i], 99.0f, "demb wrote past a row's embeddings");
                continue;
            }
            const double want = central_difference(bot, em, &em[i]);
            cr_assert_leq(fabs(de[i] - want), 1e-4 * (1 + fabs(want)), "demb %d: %g vs %g", i,
                          (double)de[i], want);
        }
}

/* Rows split in two calls give the bits of one call. */
Test(ctr_layers, a_split_over_rows_changes_no_bit)
{
    fill();
    static float a[B * W], b2[B * W], da[B * DIM], db[B * DIM], ea[B * STRIDE], eb[B * STRIDE];
    pst_interact_forward(a, bottom, emb, STRIDE, F, DIM, 0, B);
    pst_interact_forward(b2, bottom, emb, STRIDE, F, DIM, 0, 2);
    pst_interact_forward(b2, bottom, emb, STRIDE, F, DIM, 2, B);
    cr_assert_eq(memcmp(a, b2, sizeof a), 0);
    pst_interact_backward(da, ea, STRIDE, dout, bottom, emb, STRIDE, F, DIM, 0, B);
    pst_interact_backward(db, eb, STRIDE, dout, bottom, emb, STRIDE, F, DIM, 0, 3);
    pst_interact_backward(db, eb, STRIDE, dout, bottom, emb, STRIDE, F, DIM, 3, B);
    cr_assert_eq(memcmp(da, db, sizeof da), 0);
    for (int r = 0; r < B; r++)
        cr_assert_eq(memcmp(ea + r * STRIDE, eb + r * STRIDE, sizeof(float) * F * DIM), 0);
}

/* BCE: the loss against log(1 + exp(-x)) forms, stable for large |x|; the gradient
 * (sigmoid - y) * scale against the loss's central difference; scale 0: sigmoid. */
Test(ctr_layers, bce_against_its_definition)
{
    const float x[6] = {-30.0f, -2.5f, -0.1f, 0.0f, 1.7f, 40.0f};
    const int32_t y[6] = {1, 0, 1, 0, 1, 0};
    float loss[6], d[6], p[6];
    pst_bce_logits(loss, d, x, y, 0.5f, 0, 6);
    pst_bce_logits(loss, p, x, y, 0.0f, 0, 6);
    for (int i = 0; i < 6; i++) {
        const double xi = x[i];
        const double want = y[i] ? log1p(exp(-xi)) : log1p(exp(xi));
        cr_assert_leq(fabs(loss[i] - want), 1e-6 * (1 + want), "loss %d: %g vs %g", i,
                      (double)loss[i], want);
        cr_assert(isfinite(loss[i]));
        const double s = 1.0 / (1.0 + exp(-xi));
        cr_assert_leq(fabs(p[i] - s), 1e-7, "sigmoid %d", i);
        const double h = 1e-4;
        const double lu = y[i] ? log1p(exp(-(xi + h))) : log1p(exp(xi + h));
        const double ld = y[i] ? log1p(exp(-(xi - h))) : log1p(exp(xi - h));
        cr_assert_leq(fabs(d[i] - 0.5 * (lu - ld) / (2 * h)), 1e-6, "dlogit %d", i);
    }
}
