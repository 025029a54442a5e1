/* test_seq_layers.c — the sequence kernels (common/nn/seq_layers.h) against float64:
 * each forward against a plain double-precision loop written here from the formula, each
 * backward against central finite differences of that double forward (the objective is
 * sum(dout * f(x)) for a random dout), and every split (rows, columns, heads) against the
 * whole call, bit for bit. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/nn/layers.h"
#include "common/nn/seq_layers.h"
#include "common/rng.h"

static void fill(float *x, size_t n, uint64_t seed, float scale)
{
    pst_rng r;
    pst_rng_seed(&r, seed, 7);
    for (size_t i = 0; i < n; i++)
        x[i] = scale * pst_rng_normal(&r);
}

static void to_double(double *d, const float *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = f[i];
}

/* |got - want| <= atol + rtol |want| everywhere; names the first element that is not. */
static void expect_close(const char *what, const float *got, const double *want, size_t n,
                         double atol, double rtol)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs(got[i] - want[i]) <= atol + rtol * fabs(want[i]),
                  "%s[%zu]: %.9g, expected %.9g", what, i, (double)got[i], want[i]);
}

/* The finite-difference gradient of obj over x[0..n) (x changed and restored). */
typedef double (*objective_fn)(void *ctx);
static void numeric_grad(double *g, double *x, size_t n, objective_fn obj, void *ctx)
{
    const double h = 1e-5;
    for (size_t i = 0; i < n; i++) {
        const double keep = x[i];
        x[i] = keep + h;
        double up = obj(ctx);
        x[i] = keep - h;
        double down = obj(ctx);
        x[i] = keep;
        g[i] = (up - down) / (2 * h);
    }
}

/* ---- LayerNorm ---------------------------------------------------------------------- */

enum { LN_N = 6, LN_C = 24 };

typedef struct ln_case {
    double x[LN_N * LN_C], w[LN_C], b[LN_C], dout[LN_N * LN_C], out[LN_N * LN_C];
} ln_case;

static void ln_double(ln_case *k)
{
    for (int r = 0; r < LN_N; r++) {
        const double *x = k->x + r * LN_C;
        double m = 0, v = 0;
        for (int c = 0; c < LN_C; c++)
            m += x[c];
        m /= LN_C;
        for (int c = 0; c < LN_C; c++)
            v += (x[c] - m) * (x[c] - m);
        v /= LN_C;
        for (int c = 0; c < LN_C; c++)
            k->out[r * LN_C + c] = (x[c] - m) / sqrt(v + (double)PST_LN_EPS) * k->w[c] + k->b[c];
    }
}

static double ln_obj(void *ctx)
{
    ln_case *k = ctx;
    ln_double(k);
    double s = 0;
    for (int i = 0; i < LN_N * LN_C; i++)
        s += k->dout[i] * k->out[i];
    return s;
}

Test(seq_layers, layernorm_against_float64_and_finite_differences)
{
    static float x[LN_N * LN_C], w[LN_C], b[LN_C], dout[LN_N * LN_C], out[LN_N * LN_C];
    static float mean[LN_N], rstd[LN_N], dx[LN_N * LN_C], dw[LN_C], db[LN_C];
    fill(x, LN_N * LN_C, 1, 2.0f);
    for (int i = 0; i < LN_N * LN_C; i++)
        x[i] += 0.5f; /* a nonzero mean */
    fill(w, LN_C, 2, 0.5f);
    for (int c = 0; c < LN_C; c++)
        w[c] += 1.0f;
    fill(b, LN_C, 3, 0.5f);
    fill(dout, LN_N * LN_C, 4, 1.0f);
    static ln_case k;
    to_double(k.x, x, LN_N * LN_C);
    to_double(k.w, w, LN_C);
    to_double(k.b, b, LN_C);
    to_double(k.dout, dout, LN_N * LN_C);

    pst_layernorm_forward(out, mean, rstd, x, w, b, LN_N, LN_C, 0, LN_N);
    ln_double(&k);
    expect_close("layernorm out", out, k.out, LN_N * LN_C, 1e-5, 1e-5);

    pst_layernorm_backward_input(dx, dout, x, w, mean, rstd, LN_N, LN_C, NULL, 0, LN_N);
    pst_layernorm_backward_params(dw, db, dout, x, mean, rstd, LN_N, LN_C, 0, 0, LN_C);
    static double g[LN_N * LN_C];
    numeric_grad(g, k.x, LN_N * LN_C, ln_obj, &k);
    expect_close("layernorm dinp", dx, g, LN_N * LN_C, 1e-4, 1e-3);
    numeric_grad(g, k.w, LN_C, ln_obj, &k);
    expect_close("layernorm dw", dw, g, LN_C, 1e-4, 1e-3);
    numeric_grad(g, k.b, LN_C, ln_obj, &k);
    expect_close("layernorm db", db, g, LN_C, 1e-4, 1e-3);

    /* res adds (the residual stream's gradient, a value per element; here res is dinp),
     * splits change no bit. */
    static float dx2[LN_N * LN_C], dw2[LN_C], db2[LN_C], out2[LN_N * LN_C];
    for (int i = 0; i < LN_N * LN_C; i++)
        dx2[i] = (float)(i % 7) - 3.0f;
    pst_layernorm_backward_input(dx2, dout, x, w, mean, rstd, LN_N, LN_C, dx2, 0, 4);
    pst_layernorm_backward_input(dx2, dout, x, w, mean, rstd, LN_N, LN_C, dx2, 4, LN_N);
    for (int i = 0; i < LN_N * LN_C; i++)
        cr_assert_eq(dx2[i], ((float)(i % 7) - 3.0f) + dx[i], "dinp + res at %d", i);
    pst_layernorm_backward_params(dw2, db2, dout, x, mean, rstd, LN_N, LN_C, 0, 0, 16);
    pst_layernorm_backward_params(dw2, db2, dout, x, mean, rstd, LN_N, LN_C, 0, 16, LN_C);
    cr_assert_eq(memcmp(dw2, dw, sizeof dw), 0);
    cr_assert_eq(memcmp(db2, db, sizeof db), 0);
    pst_layernorm_backward_params(dw2, db2, dout, x, mean, rstd, LN_N, LN_C, 1, 0, LN_C);
    double twice[LN_C];
    for (int c = 0; c < LN_C; c++)
        twice[c] = 2.0 * dw[c]; /* rows added onto dw one by one: near, not the same bits */
    expect_close("layernorm dw accumulated", dw2, twice, LN_C, 1e-5, 1e-5);
    pst_layernorm_forward(out2, NULL, NULL, x, w, b, LN_N, LN_C, 0, 3);
    pst_layernorm_forward(out2, NULL, NULL, x, w, b, LN_N, LN_C, 3, LN_N);
    cr_assert_eq(memcmp(out2, out, sizeof out), 0);
}

/* ---- attention ---------------------------------------------------------------------- */

/* A case in float64: B sequences of T positions, C channels in H heads. */
typedef struct att_case {
    int B, T, C, H;
    double *qkv, *dout, *out;
} att_case;

static void att_double(att_case *k)
{
    const int T = k->T, C = k->C, H = k->H, C3 = 3 * C, hs = C / H;
    const double scale = 1.0 / sqrt((double)hs);
    double *s = malloc(sizeof(double) * (size_t)T);
    for (int b = 0; b < k->B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const double *q = k->qkv + (b * T + t) * C3 + h * hs;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const double *kk = k->qkv + (b * T + j) * C3 + C + h * hs;
                    s[j] = 0;
                    for (int i = 0; i < hs; i++)
                        s[j] += q[i] * kk[i];
                    s[j] *= scale;
                    m = s[j] > m ? s[j] : m;
                }
                for (int j = 0; j <= t; j++)
                    sum += exp(s[j] - m);
                double *o = k->out + (b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    o[i] = 0;
                    for (int j = 0; j <= t; j++)
                        o[i] += exp(s[j] - m) / sum * k->qkv[(b * T + j) * C3 + 2 * C + h * hs + i];
                }
            }
    free(s);
}

static double att_obj(void *ctx)
{
    att_case *k = ctx;
    att_double(k);
    double s = 0;
    for (int i = 0; i < k->B * k->T * k->C; i++)
        s += k->dout[i] * k->out[i];
    return s;
}

/* One shape: the forward against float64, the backward against finite differences, and
 * every head alone against the whole call, bit for bit; each with the probabilities
 * recomputed and kept from the forward (the same forward bits; a backward that differs in
 * the last bits only). */
static void attention_case(int B, int T, int C, int H)
{
    const size_t nx = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, nl = (size_t)B * H * T;
    float *qkv = malloc(sizeof(float) * nx), *dout = malloc(sizeof(float) * ny);
    float *out = malloc(sizeof(float) * ny), *lse = malloc(sizeof(float) * nl);
    float *dqkv = malloc(sizeof(float) * nx), *scratch = malloc(sizeof(float) *
                                                                PST_ATTENTION_SCRATCH(T));
    float *out2 = malloc(sizeof(float) * ny), *lse2 = malloc(sizeof(float) * nl);
    float *dqkv2 = malloc(sizeof(float) * nx);
    float *probs = malloc(sizeof(float) * (size_t)B * H * T * T);
    float *out3 = malloc(sizeof(float) * ny), *lse3 = malloc(sizeof(float) * nl);
    float *dqkv3 = malloc(sizeof(float) * nx);
    double *g = malloc(sizeof(double) * nx);
    att_case k = {B, T, C, H, malloc(sizeof(double) * nx), malloc(sizeof(double) * ny),
                  malloc(sizeof(double) * ny)};
    fill(qkv, nx, 5, 1.5f);
    fill(dout, ny, 6, 1.0f);
    to_double(k.qkv, qkv, nx);
    to_double(k.dout, dout, ny);
    pst_attention_forward(out, lse, NULL, qkv, B, T, C, H, scratch, 0, B * H);
    att_double(&k);
    expect_close("attention out", out, k.out, ny, 1e-5, 1e-5);
    /* The first query sees only itself: its output is its value row, exactly. */
    for (int i = 0; i < C; i++)
        cr_assert_eq(out[i], qkv[2 * C + i]);

    memset(dqkv, 0xff, sizeof(float) * nx); /* NaN everywhere: the backward overwrites */
    pst_attention_backward(dqkv, dout, qkv, lse, NULL, B, T, C, H, scratch, 0, B * H);
    numeric_grad(g, k.qkv, nx, att_obj, &k);
    expect_close("attention dqkv", dqkv, g, nx, 1e-4, 1e-3);

    /* Kept: the scratch poisoned between forward and backward, so nothing comes from it. */
    memset(probs, 0xff, sizeof(float) * (size_t)B * H * T * T);
    pst_attention_forward(out3, lse3, probs, qkv, B, T, C, H, scratch, 0, B * H);
    cr_assert_eq(memcmp(out3, out, sizeof(float) * ny), 0, "kept probabilities: other outputs");
    cr_assert_eq(memcmp(lse3, lse, sizeof(float) * nl), 0);
    memset(scratch, 0xff, sizeof(float) * (size_t)PST_ATTENTION_SCRATCH(T));
    memset(dqkv3, 0xff, sizeof(float) * nx);
    pst_attention_backward(dqkv3, dout, qkv, lse3, probs, B, T, C, H, scratch, 0, B * H);
    expect_close("attention dqkv (kept)", dqkv3, g, nx, 1e-4, 1e-3);
    double worst = 0, big = 0; /* against the largest: dS = P (dP - D) cancels */
    for (size_t i = 0; i < nx; i++) {
        const double d = fabs((double)dqkv3[i] - dqkv[i]);
        worst = d > worst ? d : worst;
        big = fabs((double)dqkv[i]) > big ? fabs((double)dqkv[i]) : big;
    }
    cr_assert_lt(worst, 1e-5 * big, "kept and recomputed backward differ by %.3g of %.3g",
                 worst, big);

    /* A later query never reaches an earlier output: the mask. The last key of each
     * sequence is seen by the last query only, so its gradient comes from that query. */
    for (int bh = 0; bh < B * H; bh++) {
        pst_attention_forward(out2, lse2, NULL, qkv, B, T, C, H, scratch, bh, bh + 1);
        pst_attention_backward(dqkv2, dout, qkv, lse2, NULL, B, T, C, H, scratch, bh, bh + 1);
    }
    cr_assert_eq(memcmp(out2, out, sizeof(float) * ny), 0, "split over heads: other bits");
    cr_assert_eq(memcmp(lse2, lse, sizeof(float) * nl), 0);
    cr_assert_eq(memcmp(dqkv2, dqkv, sizeof(float) * nx), 0);
    for (int bh = 0; bh < B * H; bh++) {
        pst_attention_forward(out2, lse2, probs, qkv, B, T, C, H, scratch, bh, bh + 1);
        pst_attention_backward(dqkv2, dout, qkv, lse2, probs, B, T, C, H, scratch, bh, bh + 1);
    }
    cr_assert_eq(memcmp(out2, out, sizeof(float) * ny), 0, "kept, split over heads");
    cr_assert_eq(memcmp(dqkv2, dqkv3, sizeof(float) * nx), 0, "kept, split over heads");
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(scratch), free(out2);
    free(lse2), free(dqkv2), free(g), free(k.qkv), free(k.dout), free(k.out);
    free(probs), free(out3), free(lse3), free(dqkv3);
}

Test(seq_layers, attention_against_float64_and_finite_differences)
{
    attention_case(2, 7, 12, 3);
}

/* From 64 positions a pair's products stop at the causal cut (queries before it over the
 * keys before it; the keys after it from the queries after it): T = 64 (the cut at 32),
 * 80 (at 48, and a last row not a whole number of vectors) and 128. A product cut at the
 * wrong place drops or doubles a term, or reads a score the softmax did not write. */
Test(seq_layers, attention_past_the_causal_cut)
{
    attention_case(1, 64, 4, 1);
    attention_case(1, 80, 8, 2);
    attention_case(2, 128, 4, 2);
}

/* Rows of 1 to 40 keys, so the softmax's sums and maximum run their 16-lane loops (16 and
 * 32 keys whole, the rest in their tails), on scores of tens, where a wrong maximum
 * overflows or underflows the exponentials: the output and the log-sum-exp against
 * float64. The backward's D (each row's sum of P dP) is what makes every row of dS sum to
 * zero, so the keys' gradients sum to zero over the positions: a wrong D does not. */
enum { LT = 40, LC = 4 };

Test(seq_layers, attention_long_rows_with_large_scores)
{
    static float qkv[LT * 3 * LC], dout[LT * LC], out[LT * LC], lse[LT], dqkv[LT * 3 * LC];
    static float scratch[PST_ATTENTION_SCRATCH(LT)];
    fill(qkv, LT * 3 * LC, 11, 6.0f);
    fill(dout, LT * LC, 12, 1.0f);
    pst_attention_forward(out, lse, NULL, qkv, 1, LT, LC, 1, scratch, 0, 1);
    const double scale = 1.0 / sqrt((double)LC);
    double biggest = 0;
    for (int t = 0; t < LT; t++) {
        double sc[LT], m = -INFINITY, sum = 0;
        for (int j = 0; j <= t; j++) {
            sc[j] = 0;
            for (int i = 0; i < LC; i++)
                sc[j] += (double)qkv[t * 3 * LC + i] * qkv[j * 3 * LC + LC + i];
            sc[j] *= scale;
            m = sc[j] > m ? sc[j] : m;
            biggest = fabs(sc[j]) > biggest ? fabs(sc[j]) : biggest;
        }
        for (int j = 0; j <= t; j++)
            sum += exp(sc[j] - m);
        const double want_lse = m + log(sum);
        cr_assert(fabs(lse[t] - want_lse) <= 1e-4 * (1 + fabs(want_lse)), "lse[%d] %.9g, %.9g",
                  t, lse[t], want_lse);
        for (int i = 0; i < LC; i++) {
            double o = 0;
            for (int j = 0; j <= t; j++)
                o += exp(sc[j] - m) / sum * qkv[j * 3 * LC + 2 * LC + i];
            cr_assert(fabs(out[t * LC + i] - o) <= 1e-4 * (1 + fabs(o)), "out[%d][%d] %.9g, %.9g",
                      t, i, out[t * LC + i], o);
        }
    }
    cr_assert_gt(biggest, 20.0, "the scores are not large (%.3g)", biggest);
    pst_attention_backward(dqkv, dout, qkv, lse, NULL, 1, LT, LC, 1, scratch, 0, 1);
    for (int i = 0; i < LC; i++) {
        double sum = 0, mag = 0;
        for (int t = 0; t < LT; t++) {
            sum += dqkv[t * 3 * LC + LC + i];
            mag += fabs(dqkv[t * 3 * LC + LC + i]);
        }
        cr_assert_gt(mag, 1e-3);
        cr_assert(fabs(sum) <= 1e-4 * mag, "dK column %d sums to %.9g over %.9g", i, sum, mag);
    }
}

/* ---- GELU --------------------------------------------------------------------------- */

enum { GN = 64 };

typedef struct gelu_case {
    double x[GN], dout[GN];
} gelu_case;

static double gelu_d(double x)
{
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double gelu_obj(void *ctx)
{
    gelu_case *k = ctx;
    double s = 0;
    for (int i = 0; i < GN; i++)
        s += k->dout[i] * gelu_d(k->x[i]);
    return s;
}

Test(seq_layers, gelu_against_float64_and_finite_differences)
{
    float x[GN], dout[GN], out[GN], dx[GN];
    fill(x, GN, 8, 2.0f);
    fill(dout, GN, 9, 1.0f);
    gelu_case k;
    to_double(k.x, x, GN);
    to_double(k.dout, dout, GN);
    double want[GN];
    for (int i = 0; i < GN; i++)
        want[i] = gelu_d(k.x[i]);
    pst_gelu_forward(out, x, GN);
    expect_close("gelu out", out, want, GN, 1e-6, 1e-5);
    pst_gelu_backward(dx, x, dout, GN);
    double g[GN];
    numeric_grad(g, k.x, GN, gelu_obj, &k);
    expect_close("gelu dinp", dx, g, GN, 1e-5, 1e-4);
    memcpy(dx, dout, sizeof dx);
    pst_gelu_backward(dx, x, dx, GN); /* in place */
    expect_close("gelu dinp in place", dx, g, GN, 1e-5, 1e-4);
}

/* The forward that keeps gelu' (in place of its input, as the transformer block keeps it)
 * and the backward from it give the bits of the plain forward and backward. */
Test(seq_layers, gelu_kept_derivative_gives_the_same_bits)
{
    enum { NK = 1000 }; /* past the vector loops' widths, with a tail */
    static float x[NK], dout[NK], out[NK], dx[NK], keep[NK], out2[NK], dx2[NK];
    fill(x, NK, 12, 4.0f);
    fill(dout, NK, 13, 1.0f);
    pst_gelu_forward(out, x, NK);
    pst_gelu_backward(dx, x, dout, NK);
    memcpy(keep, x, sizeof keep);
    pst_gelu_forward_deriv(out2, keep, keep, NK);
    memcpy(dx2, dout, sizeof dx2);
    pst_gelu_backward_deriv(dx2, keep, dx2, NK);
    for (int i = 0; i < NK; i++) {
        cr_assert_eq(memcmp(&out2[i], &out[i], sizeof(float)), 0, "out[%d] %.9g vs %.9g", i,
                     out2[i], out[i]);
        cr_assert_eq(memcmp(&dx2[i], &dx[i], sizeof(float)), 0, "dinp[%d] %.9g vs %.9g", i,
                     dx2[i], dx[i]);
    }
}

/* GELU with the bias of the linear layer before it (the transformer block's fc) gives the
 * bits of the bias's own pass and then GELU, with and without the kept derivative; and the
 * bias is a row's, not the flat index's (rows of 40: the vector loops and a tail). */
Test(seq_layers, gelu_with_bias_gives_the_bits_of_the_bias_then_gelu)
{
    enum { R = 25, W = 40, NB = R * W };
    static float x[NB], bias[W], xb[NB], out[NB], deriv[NB], out2[NB], deriv2[NB];
    fill(x, NB, 14, 4.0f);
    fill(bias, W, 15, 1.0f);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < W; j++)
            xb[r * W + j] = x[r * W + j] + bias[j];
    pst_gelu_forward_deriv(out, deriv, xb, NB);
    memcpy(deriv2, x, sizeof deriv2); /* in place of the input, as the block keeps it */
    pst_gelu_forward_bias(out2, deriv2, deriv2, bias, R, W);
    cr_assert_eq(memcmp(out2, out, sizeof out), 0, "gelu with bias: other outputs");
    cr_assert_eq(memcmp(deriv2, deriv, sizeof deriv), 0, "gelu with bias: other derivatives");
    pst_gelu_forward(out, xb, NB);
    memset(out2, 0, sizeof out2);
    pst_gelu_forward_bias(out2, NULL, x, bias, R, W);
    cr_assert_eq(memcmp(out2, out, sizeof out), 0, "gelu with bias, no derivative");
}

/* GELU's backward summing the bias gradient of the linear layer before it: the bits of
 * the plain backward and of the linear layer's own bias pass (pst_linear_backward_weight_rows
 * with B rows), overwriting and accumulating, whole and in column slices. */
Test(seq_layers, gelu_backward_with_the_bias_gradient_gives_the_bits_of_the_two_passes)
{
    enum { R = 25, W = 40, NB = R * W };
    static float deriv[NB], dout[NB], dx[NB], dx2[NB], inp[R * 3], dw[W * 3];
    float db[W], db2[W];
    fill(deriv, NB, 16, 1.0f);
    fill(dout, NB, 17, 1.0f);
    fill(inp, R * 3, 18, 1.0f);
    pst_gelu_backward_deriv(dx, deriv, dout, NB);
    for (int accumulate = 0; accumulate <= 1; accumulate++) {
        fill(db, W, 19, 1.0f);
        memcpy(db2, db, sizeof db);
        pst_linear_backward_weight_rows(dw, db, dx, inp, R, 3, W, accumulate, 0, W);
        pst_gelu_backward_dbias(dx2, db2, deriv, dout, R, W, accumulate, 0, 16);
        pst_gelu_backward_dbias(dx2, db2, deriv, dout, R, W, accumulate, 16, W);
        cr_assert_eq(memcmp(dx2, dx, sizeof dx), 0, "dinp: other bits");
        cr_assert_eq(memcmp(db2, db, sizeof db), 0, "dbias (accumulate %d): other bits",
                     accumulate);
    }
}

/* ---- embedding ---------------------------------------------------------------------- */

Test(seq_layers, embedding_rows_and_gradients_in_a_fixed_order)
{
    enum { B = 3, T = 5, C = 20, V = 7 };
    float wte[V * C], wpe[T * C], out[B * T * C], dout[B * T * C];
    int32_t tok[B * T];
    fill(wte, V * C, 10, 1.0f);
    fill(wpe, T * C, 11, 1.0f);
    fill(dout, B * T * C, 12, 1.0f);
    for (int i = 0; i < B * T; i++)
        tok[i] = (i * 5 + 1) % V; /* repeats: several rows land on one token */
    tok[3] = V - 1;
    pst_embedding_forward(out, tok, wte, wpe, B, T, C, 0, C);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                cr_assert_eq(out[(b * T + t) * C + c],
                             wte[tok[b * T + t] * C + c] + wpe[t * C + c]);
    /* The gradient of a linear map is its transpose, so "finite differences" are exact
     * here: compare with sums in double, then check the order by bits against a plain
     * loop adding rows (b, t) ascending. */
    float dwte[V * C], dwpe[T * C];
    memset(dwte, 0xff, sizeof dwte);
    pst_embedding_backward(dwte, dwpe, dout, tok, B, T, C, V, 0, 0, C);
    double want_te[V * C] = {0}, want_pe[T * C] = {0};
    float order_te[V * C] = {0};
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                want_te[tok[b * T + t] * C + c] += dout[(b * T + t) * C + c];
                order_te[tok[b * T + t] * C + c] += dout[(b * T + t) * C + c];
                want_pe[t * C + c] += dout[(b * T + t) * C + c];
            }
    expect_close("dwte", dwte, want_te, V * C, 1e-6, 1e-6);
    expect_close("dwpe", dwpe, want_pe, T * C, 1e-6, 1e-6);
    cr_assert_eq(memcmp(dwte, order_te, sizeof dwte), 0, "rows not added in (b, t) order");
    /* Accumulate (the tied embedding's second writer) and a column split. */
    float acc[V * C], split[V * C];
    for (int i = 0; i < V * C; i++)
        acc[i] = split[i] = 0.25f;
    pst_embedding_backward(acc, NULL, dout, tok, B, T, C, V, 1, 0, C);
    pst_embedding_backward(split, NULL, dout, tok, B, T, C, V, 1, 0, 16);
    pst_embedding_backward(split, NULL, dout, tok, B, T, C, V, 1, 16, C);
    cr_assert_eq(memcmp(acc, split, sizeof acc), 0);
    float direct[V * C] = {0};
    for (int i = 0; i < V * C; i++)
        direct[i] = 0.25f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                direct[tok[b * T + t] * C + c] += dout[(b * T + t) * C + c];
    cr_assert_eq(memcmp(acc, direct, sizeof acc), 0);
}

/* A linear layer without a bias (the tied output projection): out = inp @ w^T, dbias NULL. */
Test(seq_layers, linear_without_bias)
{
    enum { B = 4, IC = 8, OC = 5 };
    float inp[B * IC], w[OC * IC], out[B * OC], dout[B * OC], dw[OC * IC], dx[B * IC];
    fill(inp, B * IC, 13, 1.0f);
    fill(w, OC * IC, 14, 1.0f);
    fill(dout, B * OC, 15, 1.0f);
    pst_linear_forward(out, inp, w, NULL, B, IC, OC, 0);
    double want[B * OC], wdw[OC * IC] = {0}, wdx[B * IC] = {0};
    for (int b = 0; b < B; b++)
        for (int o = 0; o < OC; o++) {
            want[b * OC + o] = 0;
            for (int i = 0; i < IC; i++) {
                want[b * OC + o] += (double)inp[b * IC + i] * w[o * IC + i];
                wdw[o * IC + i] += (double)dout[b * OC + o] * inp[b * IC + i];
                wdx[b * IC + i] += (double)dout[b * OC + o] * w[o * IC + i];
            }
        }
    expect_close("out", out, want, B * OC, 1e-5, 1e-5);
    pst_linear_backward(dx, dw, NULL, dout, inp, w, B, IC, OC, 0);
    expect_close("dw", dw, wdw, OC * IC, 1e-5, 1e-5);
    expect_close("dinp", dx, wdx, B * IC, 1e-5, 1e-5);
}

/* ---- cross-entropy over the vocabulary through the tied projection ------------------ */

enum { XN = 5, XC = 8, XV = 7 };

typedef struct tied_case {
    double x[XN * XC], wte[XV * XC];
    int32_t tgt[XN];
} tied_case;

/* mean over the XN positions of -log softmax(x @ wte^T)[target], in double */
static double tied_obj(void *ctx)
{
    tied_case *k = ctx;
    double total = 0;
    for (int n = 0; n < XN; n++) {
        double z[XV], m = -INFINITY, s = 0;
        for (int v = 0; v < XV; v++) {
            z[v] = 0;
            for (int c = 0; c < XC; c++)
                z[v] += k->x[n * XC + c] * k->wte[v * XC + c];
            m = z[v] > m ? z[v] : m;
        }
        for (int v = 0; v < XV; v++)
            s += exp(z[v] - m);
        total += log(s) - (z[k->tgt[n]] - m);
    }
    return total / XN;
}

Test(seq_layers, tied_projection_cross_entropy_against_finite_differences)
{
    float x[XN * XC], wte[XV * XC], logits[XN * XV], probs[XN * XV], dx[XN * XC], dw[XV * XC];
    fill(x, XN * XC, 20, 1.0f);
    fill(wte, XV * XC, 21, 1.0f);
    tied_case k;
    to_double(k.x, x, XN * XC);
    to_double(k.wte, wte, XV * XC);
    for (int n = 0; n < XN; n++)
        k.tgt[n] = (n * 3 + 1) % XV;
    /* the language-model head's arithmetic: logits by the linear kernel without bias, the
     * softmax cross-entropy, its gradient scaled by 1/positions, both GEMM gradients */
    pst_linear_forward(logits, x, wte, NULL, XN, XC, XV, 0);
    const double loss = pst_softmax_xent_forward(probs, logits, k.tgt, XN, XV) / XN;
    cr_assert(fabs(loss - tied_obj(&k)) <= 1e-6 * fabs(loss), "loss %.9g vs %.9g", loss,
              tied_obj(&k));
    pst_softmax_xent_backward(probs, probs, k.tgt, XN, XV, 1.0f / XN);
    pst_linear_backward(dx, dw, NULL, probs, x, wte, XN, XC, XV, 0);
    double g[XV * XC];
    numeric_grad(g, k.x, XN * XC, tied_obj, &k);
    expect_close("d loss / d x", dx, g, XN * XC, 1e-5, 1e-4);
    numeric_grad(g, k.wte, XV * XC, tied_obj, &k);
    expect_close("d loss / d wte", dw, g, XV * XC, 1e-5, 1e-4);
}

/* A row's sum as the kernels order it: element j into partial sum j % 16, the 16 partial
 * sums then added by halves (8 + 8, 4 + 4, 2 + 2, 1 + 1), in plain scalar float code. */
static float lanes16(const float *v, int n)
{
    float a[16] = {0};
    for (int j = 0; j < n; j++)
        a[j % 16] += v[j];
    for (int w = 8; w > 0; w /= 2)
        for (int k = 0; k < w; k++)
            a[k] += a[k + w];
    return a[0];
}

/* The vector sums of LayerNorm give the bits of that order, written here without vectors,
 * for row widths with and without a tail past the last 16 and below 16. The kernels are
 * built for AVX-512, AVX2 and SSE2; a run checks the one its CPU picks (these machines:
 * AVX-512 or AVX2; the SSE2 build only on a CPU without AVX2). */
Test(seq_layers, layernorm_sums_have_the_bits_of_their_fixed_order)
{
    enum { N = 6, CMAX = 133 };
    static const int widths[] = {128, 133, 7, 16, 1};
    static float x[N * CMAX], w[CMAX], b[CMAX], dout[N * CMAX], out[N * CMAX], dx[N * CMAX];
    float mean[N], rstd[N], t[CMAX], u[CMAX];
    int other = 0; /* rows whose mean a single running sum gives otherwise */
    for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) {
        const int C = widths[k];
        fill(x, N * C, 40 + k, 3.0f);
        fill(w, C, 50 + k, 1.0f);
        fill(b, C, 60 + k, 1.0f);
        fill(dout, N * C, 70 + k, 1.0f);
        pst_layernorm_forward(out, mean, rstd, x, w, b, N, C, 0, N);
        pst_layernorm_backward_input(dx, dout, x, w, mean, rstd, N, C, NULL, 0, N);
        for (int r = 0; r < N; r++) {
            const float *xr = x + r * C, *dr = dout + r * C;
            const float m = lanes16(xr, C) / (float)C;
            float serial = 0.0f;
            for (int c = 0; c < C; c++)
                serial += xr[c];
            other += serial / (float)C != m;
            for (int c = 0; c < C; c++)
                t[c] = (xr[c] - m) * (xr[c] - m);
            const float s = 1.0f / sqrtf(lanes16(t, C) / (float)C + PST_LN_EPS);
            cr_assert_eq(memcmp(&mean[r], &m, sizeof m), 0, "C %d row %d: mean %.9g, %.9g", C,
                         r, mean[r], m);
            cr_assert_eq(memcmp(&rstd[r], &s, sizeof s), 0, "C %d row %d: rstd %.9g, %.9g", C,
                         r, rstd[r], s);
            for (int c = 0; c < C; c++) {
                t[c] = w[c] * dr[c];
                u[c] = t[c] * ((xr[c] - m) * s);
            }
            const float dm = lanes16(t, C) / (float)C, dnm = lanes16(u, C) / (float)C;
            for (int c = 0; c < C; c++) {
                const float g = (t[c] - dm - (xr[c] - m) * s * dnm) * s;
                cr_assert_eq(memcmp(&dx[r * C + c], &g, sizeof g), 0,
                             "C %d row %d: dinp[%d] %.9g, %.9g", C, r, c, dx[r * C + c], g);
            }
        }
    }
    cr_assert_gt(other, 0, "no row tells the lanes' order from a running sum");
}
