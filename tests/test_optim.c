/* test_optim.c — tests for common/optim.c: each optimizer against arithmetic worked out by
 * hand and against numbers produced by PyTorch 1.13, a naive scalar reference compared bit
 * for bit on a large random buffer, range splits giving identical bits, the learning-rate
 * schedules, and the name/parse/state-size helpers. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/optim.h"
#include "common/rng.h"

static pst_optim_config make_cfg(pst_optim_kind kind, float lr, float wd)
{
    pst_optim_config cfg;
    pst_optim_defaults(&cfg);
    cfg.kind = kind;
    cfg.lr = lr;
    cfg.weight_decay = wd;
    return cfg;
}

/* |got - want| <= tol for each element. */
static void expect_near(const char *what, const float *got, const float *want, size_t n,
                        double tol)
{
    for (size_t i = 0; i < n; i++)
        cr_expect(fabs((double)got[i] - (double)want[i]) <= tol,
                  "%s[%zu]: got %.9g, want %.9g", what, i, got[i], want[i]);
}

/* |got - want| <= rel * |want| for each element. */
static void expect_rel(const char *what, const float *got, const float *want, size_t n,
                       double rel)
{
    for (size_t i = 0; i < n; i++)
        cr_expect(fabs((double)got[i] - (double)want[i]) <= rel * fabs((double)want[i]),
                  "%s[%zu]: got %.9g, want %.9g", what, i, got[i], want[i]);
}

static void expect_same_bits(const char *what, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_expect(memcmp(&a[i], &b[i], sizeof(float)) == 0, "%s[%zu]: %.9g vs %.9g", what, i,
                  a[i], b[i]);
}

/* ---- hand-computed updates ------------------------------------------------------------
 * Values are chosen dyadic so that SGD and momentum are exact in float. */

Test(optim_hand, sgd)
{
    /* lr 0.5, p = [1, -2, 0.25]
     * g1 = [0.5, 1, -4]:   p = [1 - 0.25, -2 - 0.5, 0.25 + 2]       = [0.75, -2.5, 2.25]
     * g2 = [1, -0.5, 0.25]: p = [0.75 - 0.5, -2.5 + 0.25, 2.25 - 0.125] = [0.25, -2.25, 2.125] */
    pst_optim_config cfg = make_cfg(PST_OPTIM_SGD, 0.5f, 0.0f);
    float p[3] = {1.0f, -2.0f, 0.25f};
    const float g1[3] = {0.5f, 1.0f, -4.0f}, g2[3] = {1.0f, -0.5f, 0.25f};
    const float want1[3] = {0.75f, -2.5f, 2.25f}, want2[3] = {0.25f, -2.25f, 2.125f};
    pst_optim_apply(&cfg, 1, p, NULL, 0, g1, 3);
    expect_near("p1", p, want1, 3, 0.0);
    pst_optim_apply(&cfg, 2, p, NULL, 0, g2, 3);
    expect_near("p2", p, want2, 3, 0.0);
}

Test(optim_hand, sgd_weight_decay)
{
    /* lr 0.5, wd 0.25, p = [1, -2, 0.25], g = [0.5, 1, -4]
     * g' = g + 0.25 p = [0.75, 0.5, -3.9375]
     * p  = p - 0.5 g' = [1 - 0.375, -2 - 0.25, 0.25 + 1.96875] = [0.625, -2.25, 2.21875] */
    pst_optim_config cfg = make_cfg(PST_OPTIM_SGD, 0.5f, 0.25f);
    float p[3] = {1.0f, -2.0f, 0.25f};
    const float g[3] = {0.5f, 1.0f, -4.0f};
    const float want[3] = {0.625f, -2.25f, 2.21875f};
    pst_optim_apply(&cfg, 1, p, NULL, 0, g, 3);
    expect_near("p1", p, want, 3, 0.0);
}

Test(optim_hand, momentum)
{
    /* lr 0.5, mu 0.5, p = [1, -2], buf = 0
     * g1 = [0.5, 1]:  buf = [0.5, 1] (= g1);              p = [1 - 0.25, -2 - 0.5] = [0.75, -2.5]
     * g2 = [1, -0.5]: buf = 0.5 [0.5, 1] + g2 = [1.25, 0]; p = [0.75 - 0.625, -2.5] = [0.125, -2.5] */
    pst_optim_config cfg = make_cfg(PST_OPTIM_MOMENTUM, 0.5f, 0.0f);
    cfg.momentum = 0.5f;
    float p[2] = {1.0f, -2.0f}, buf[2] = {0.0f, 0.0f};
    const float g1[2] = {0.5f, 1.0f}, g2[2] = {1.0f, -0.5f};
    pst_optim_apply(&cfg, 1, p, buf, 2, g1, 2);
    expect_near("buf1", buf, g1, 2, 0.0);
    expect_near("p1", p, (const float[]){0.75f, -2.5f}, 2, 0.0);
    pst_optim_apply(&cfg, 2, p, buf, 2, g2, 2);
    expect_near("buf2", buf, (const float[]){1.25f, 0.0f}, 2, 0.0);
    expect_near("p2", p, (const float[]){0.125f, -2.5f}, 2, 0.0);
}

Test(optim_hand, momentum_weight_decay)
{
    /* lr 0.5, mu 0.5, wd 0.5, p = [1, -2], buf = 0
     * g1 = [0.5, 1]:  g' = g1 + 0.5 p = [1, 0];  buf = [1, 0];  p = [1 - 0.5, -2] = [0.5, -2]
     * g2 = [1, -0.5]: g' = [1 + 0.25, -0.5 - 1] = [1.25, -1.5]
     *                 buf = 0.5 [1, 0] + g' = [1.75, -1.5]
     *                 p = [0.5 - 0.875, -2 + 0.75] = [-0.375, -1.25] */
    pst_optim_config cfg = make_cfg(PST_OPTIM_MOMENTUM, 0.5f, 0.5f);
    cfg.momentum = 0.5f;
    float p[2] = {1.0f, -2.0f}, buf[2] = {0.0f, 0.0f};
    const float g1[2] = {0.5f, 1.0f}, g2[2] = {1.0f, -0.5f};
    pst_optim_apply(&cfg, 1, p, buf, 2, g1, 2);
    expect_near("buf1", buf, (const float[]){1.0f, 0.0f}, 2, 0.0);
    expect_near("p1", p, (const float[]){0.5f, -2.0f}, 2, 0.0);
    pst_optim_apply(&cfg, 2, p, buf, 2, g2, 2);
    expect_near("buf2", buf, (const float[]){1.75f, -1.5f}, 2, 0.0);
    expect_near("p2", p, (const float[]){-0.375f, -1.25f}, 2, 0.0);
}

/* Adam hand cases: lr 0.5, b1 0.5, b2 0.75, eps 0, p = [1, -2], g1 = [0.5, -1], g2 = [2, 1].
 * Bias corrections: t=1: 1-b1 = 0.5, 1-b2 = 0.25 -> step = 0.5/0.5 = 1, sqrt(0.25) = 0.5
 *                   t=2: 1-b1^2 = 0.75, 1-b2^2 = 0.4375 -> step = 0.5/0.75 = 0.666666667,
 *                        sqrt(0.4375) = 0.661437828
 * Step 2 is not exact in float; 1e-6 absolute covers the rounding of O(1) terms. */
static pst_optim_config adam_hand_cfg(pst_optim_kind kind, float wd)
{
    pst_optim_config cfg = make_cfg(kind, 0.5f, wd);
    cfg.beta1 = 0.5f;
    cfg.beta2 = 0.75f;
    cfg.eps = 0.0f;
    return cfg;
}

Test(optim_hand, adam)
{
    /* t=1: m = 0.5 g1 = [0.25, -0.5]; v = 0.25 g1^2 = [0.0625, 0.25]
     *      denom = sqrt(v)/0.5 = [0.5, 1]; m/denom = [0.5, -0.5]; p = p - 1*that = [0.5, -1.5]
     * t=2: m = 0.5 m + 0.5 g2 = [0.125 + 1, -0.25 + 0.5] = [1.125, 0.25]
     *      v = 0.75 v + 0.25 g2^2 = [0.046875 + 1, 0.1875 + 0.25] = [1.046875, 0.4375]
     *      denom = sqrt(v)/0.661437828 = [1.0231691/0.661437828, 1] = [1.54688627, 1]
     *      m/denom = [0.727267427, 0.25]; times step 0.666666667 = [0.484844951, 0.166666667]
     *      p = [0.5 - 0.484844951, -1.5 - 0.166666667] = [0.0151550486, -1.66666667] */
    pst_optim_config cfg = adam_hand_cfg(PST_OPTIM_ADAM, 0.0f);
    float p[2] = {1.0f, -2.0f}, st[4] = {0};
    const float g1[2] = {0.5f, -1.0f}, g2[2] = {2.0f, 1.0f};
    pst_optim_apply(&cfg, 1, p, st, 2, g1, 2);
    expect_near("m1", st, (const float[]){0.25f, -0.5f}, 2, 0.0);
    expect_near("v1", st + 2, (const float[]){0.0625f, 0.25f}, 2, 0.0);
    expect_near("p1", p, (const float[]){0.5f, -1.5f}, 2, 0.0);
    pst_optim_apply(&cfg, 2, p, st, 2, g2, 2);
    expect_near("m2", st, (const float[]){1.125f, 0.25f}, 2, 0.0);
    expect_near("v2", st + 2, (const float[]){1.046875f, 0.4375f}, 2, 0.0);
    expect_near("p2", p, (const float[]){0.0151550486f, -1.66666667f}, 2, 1e-6);
}

Test(optim_hand, adam_l2_weight_decay)
{
    /* wd 0.5 is added to the gradient.
     * t=1: g' = g1 + 0.5 p = [0.5 + 0.5, -1 - 1] = [1, -2]
     *      m = 0.5 g' = [0.5, -1]; v = 0.25 g'^2 = [0.25, 1]
     *      denom = sqrt(v)/0.5 = [1, 2]; m/denom = [0.5, -0.5]; p = [0.5, -1.5]
     * t=2: g' = g2 + 0.5 p = [2 + 0.25, 1 - 0.75] = [2.25, 0.25]
     *      m = 0.5 m + 0.5 g' = [0.25 + 1.125, -0.5 + 0.125] = [1.375, -0.375]
     *      v = 0.75 v + 0.25 g'^2 = [0.1875 + 1.265625, 0.75 + 0.015625] = [1.453125, 0.765625]
     *      denom = [1.20545635, 0.875] / 0.661437828 = [1.82247869, 1.32287566]
     *      m/denom = [0.754466984, -0.283473355]; times 0.666666667 = [0.502977989, -0.188982237]
     *      p = [0.5 - 0.502977989, -1.5 + 0.188982237] = [-0.0029779894, -1.31101776] */
    pst_optim_config cfg = adam_hand_cfg(PST_OPTIM_ADAM, 0.5f);
    float p[2] = {1.0f, -2.0f}, st[4] = {0};
    const float g1[2] = {0.5f, -1.0f}, g2[2] = {2.0f, 1.0f};
    pst_optim_apply(&cfg, 1, p, st, 2, g1, 2);
    expect_near("m1", st, (const float[]){0.5f, -1.0f}, 2, 0.0);
    expect_near("v1", st + 2, (const float[]){0.25f, 1.0f}, 2, 0.0);
    expect_near("p1", p, (const float[]){0.5f, -1.5f}, 2, 0.0);
    pst_optim_apply(&cfg, 2, p, st, 2, g2, 2);
    expect_near("m2", st, (const float[]){1.375f, -0.375f}, 2, 0.0);
    expect_near("v2", st + 2, (const float[]){1.453125f, 0.765625f}, 2, 0.0);
    expect_near("p2", p, (const float[]){-0.0029779894f, -1.31101776f}, 2, 1e-6);
}

Test(optim_hand, adamw)
{
    /* wd 0.5 decoupled: p *= 1 - lr*wd = 0.75 first; the moments are Adam's (g' = g).
     * t=1: p = 0.75 [1, -2] = [0.75, -1.5]; Adam step as above moves by [-0.5, +0.5]:
     *      p = [0.25, -1]
     * t=2: p = 0.75 [0.25, -1] = [0.1875, -0.75]; Adam step [-0.484844951, -0.166666667]:
     *      p = [-0.297344951, -0.916666667] */
    pst_optim_config cfg = adam_hand_cfg(PST_OPTIM_ADAMW, 0.5f);
    float p[2] = {1.0f, -2.0f}, st[4] = {0};
    const float g1[2] = {0.5f, -1.0f}, g2[2] = {2.0f, 1.0f};
    pst_optim_apply(&cfg, 1, p, st, 2, g1, 2);
    expect_near("m1", st, (const float[]){0.25f, -0.5f}, 2, 0.0);
    expect_near("v1", st + 2, (const float[]){0.0625f, 0.25f}, 2, 0.0);
    expect_near("p1", p, (const float[]){0.25f, -1.0f}, 2, 0.0);
    pst_optim_apply(&cfg, 2, p, st, 2, g2, 2);
    expect_near("m2", st, (const float[]){1.125f, 0.25f}, 2, 0.0);
    expect_near("v2", st + 2, (const float[]){1.046875f, 0.4375f}, 2, 0.0);
    expect_near("p2", p, (const float[]){-0.297344951f, -0.916666667f}, 2, 1e-6);
}

/* ---- PyTorch 1.13 references -----------------------------------------------------------
 * Generated with /usr/bin/python3 (torch 1.13.0a0) by this script; each printed row is
 * `name wd? t p[0..5)` and is pasted below as torch_ref[kind][wd != 0][t-1]:
 *
 * import torch
 * f = lambda x: float(torch.tensor(x, dtype=torch.float32))  # config values are floats
 * p0 = [0.5, -1.25, 2.0, 0.0, -0.75]
 * gs = [[0.25, -0.5, 1.0, 0.125, -2.0], [-0.75, 0.5, 0.25, -0.375, 1.5], [0.5, 0.0, -1.0, 0.625, -0.25]]
 * mk = {'sgd': lambda p, wd: torch.optim.SGD([p], lr=f(0.1), weight_decay=wd),
 *       'momentum': lambda p, wd: torch.optim.SGD([p], lr=f(0.1), momentum=f(0.9), weight_decay=wd),
 *       'adam': lambda p, wd: torch.optim.Adam([p], lr=f(0.1), betas=(f(0.9), f(0.999)), eps=f(1e-8), weight_decay=wd),
 *       'adamw': lambda p, wd: torch.optim.AdamW([p], lr=f(0.1), betas=(f(0.9), f(0.999)), eps=f(1e-8), weight_decay=wd)}
 * for name in mk:
 *     for wd in (0.0, f(0.1)):
 *         p = torch.tensor(p0, requires_grad=True); opt = mk[name](p, wd)
 *         for t, g in enumerate(gs, 1):
 *             p.grad = torch.tensor(g); opt.step()
 *             print(name, 'wd' if wd else '--', t, ', '.join('%.9gf' % x for x in p.detach().tolist()))
 */
static const float torch_p0[5] = {0.5f, -1.25f, 2.0f, 0.0f, -0.75f};
static const float torch_grads[3][5] = {
    {0.25f, -0.5f, 1.0f, 0.125f, -2.0f},
    {-0.75f, 0.5f, 0.25f, -0.375f, 1.5f},
    {0.5f, 0.0f, -1.0f, 0.625f, -0.25f},
};
static const float torch_ref[PST_OPTIM_KIND_COUNT_][2][3][5] = {
    [PST_OPTIM_SGD] = {
        {{0.474999994f, -1.20000005f, 1.89999998f, -0.0125000002f, -0.550000012f},
         {0.550000012f, -1.25f, 1.875f, 0.0250000004f, -0.699999988f},
         {0.5f, -1.25f, 1.97500002f, -0.0375000015f, -0.675000012f}},
        {{0.469999999f, -1.1875f, 1.88f, -0.0125000002f, -0.542500019f},
         {0.540300012f, -1.22562504f, 1.8362f, 0.0251250006f, -0.687075019f},
         {0.484897017f, -1.21336877f, 1.91783798f, -0.0376262516f, -0.655204296f}},
    },
    [PST_OPTIM_MOMENTUM] = {
        {{0.474999994f, -1.20000005f, 1.89999998f, -0.0125000002f, -0.550000012f},
         {0.527499974f, -1.20500004f, 1.78499997f, 0.013749999f, -0.520000041f},
         {0.524749994f, -1.20950007f, 1.78149998f, -0.0251250025f, -0.468000054f}},
        {{0.469999999f, -1.1875f, 1.88f, -0.0125000002f, -0.542500019f},
         {0.513300002f, -1.16937494f, 1.72819996f, 0.013875002f, -0.500325024f},
         {0.49713701f, -1.14136875f, 1.67429793f, -0.025026245f, -0.432364285f}},
    },
    [PST_OPTIM_ADAM] = {
        {{0.400000006f, -1.14999998f, 1.89999998f, -0.0999999866f, -0.649999976f},
         {0.449418992f, -1.15526319f, 1.81694019f, -0.050580997f, -0.641067505f},
         {0.447540224f, -1.15933168f, 1.8153826f, -0.0841678083f, -0.627835393f}},
        {{0.400000006f, -1.14999998f, 1.89999998f, -0.0999999866f, -0.649999976f},
         {0.442482352f, -1.13199985f, 1.81146502f, -0.0499024019f, -0.637238741f},
         {0.432441711f, -1.1085043f, 1.78833914f, -0.0822397321f, -0.619560242f}},
    },
    [PST_OPTIM_ADAMW] = {
        {{0.400000006f, -1.14999998f, 1.89999998f, -0.0999999866f, -0.649999976f},
         {0.449418992f, -1.15526319f, 1.81694019f, -0.050580997f, -0.641067505f},
         {0.447540224f, -1.15933168f, 1.8153826f, -0.0841678083f, -0.627835393f}},
        {{0.395000011f, -1.13749993f, 1.88f, -0.0999999866f, -0.642499983f},
         {0.440468997f, -1.13138819f, 1.77814019f, -0.049580995f, -0.627142489f},
         {0.434185535f, -1.12414277f, 1.75880122f, -0.0826719999f, -0.607638955f}},
    },
    /* 'adagrad': torch.optim.Adagrad([p], lr=f(0.1), eps=f(1e-8), weight_decay=wd) */
    [PST_OPTIM_ADAGRAD] = {
        {{0.400000006f, -1.14999998f, 1.89999998f, -0.0999999866f, -0.649999976f},
         {0.494868338f, -1.22071064f, 1.87574637f, -0.00513165444f, -0.709999979f},
         {0.441416085f, -1.22071064f, 1.94537747f, -0.089647077f, -0.700049579f}},
        {{0.400000006f, -1.14999998f, 1.89999998f, -0.0999999866f, -0.649999976f},
         {0.492114633f, -1.20244777f, 1.86557448f, -0.00488749892f, -0.706879735f},
         {0.434084952f, -1.18628252f, 1.91926634f, -0.0888023004f, -0.694269955f}},
    },
};

Test(optim_torch, all_kinds_with_and_without_weight_decay)
{
    for (int k = 0; k < PST_OPTIM_KIND_COUNT_; k++) {
        for (int w = 0; w < 2; w++) {
            pst_optim_config cfg = make_cfg((pst_optim_kind)k, 0.1f, w ? 0.1f : 0.0f);
            cfg.momentum = 0.9f;
            cfg.beta1 = 0.9f;
            cfg.beta2 = 0.999f;
            cfg.eps = 1e-8f;
            float p[5], st[10] = {0};
            memcpy(p, torch_p0, sizeof(p));
            for (int t = 1; t <= 3; t++) {
                char what[64];
                snprintf(what, sizeof(what), "%s wd=%d t=%d p", pst_optim_kind_name(cfg.kind),
                         w, t);
                pst_optim_apply(&cfg, t, p, k == PST_OPTIM_SGD ? NULL : st, 5,
                                torch_grads[t - 1], 5);
                /* Adam and AdamW match these rows bit for bit on x86-64; SGD, momentum and
                 * Adagrad differ by an ulp in places, because torch's add_(x, alpha=a) and
                 * addcdiv_ run as fused multiply-adds on its AVX2 CPU path, and ours rounds
                 * a*x first (Adagrad's p[3] at t 2 is -0.1 + 0.0948683: that ulp of the
                 * terms is 1.5e-6 of the difference). */
                expect_rel(what, p, torch_ref[k][w][t - 1], 5,
                           k == PST_OPTIM_ADAGRAD ? 2e-6 : 1e-6);
            }
        }
    }
}

/* ---- naive reference, bit for bit ------------------------------------------------------
 * One scalar loop in PyTorch's operation order, with the per-call scalars rounded the way
 * optim.h documents. The library's vectorized loops (and SIMD square root) must give the
 * same bits on a buffer long enough to cover several Adam blocks and ragged tails. Like the
 * library, the reference must not fuse multiply-adds (GCC's C11 mode does not; clang's
 * default would with -march=native). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
static void naive_apply(const pst_optim_config *cfg, long t, float *p, float *st,
                        size_t stride, const float *g, size_t n)
{
    float lr = pst_lr_at(cfg, t), wd = cfg->weight_decay;
    double bc1 = 1.0 - pow((double)cfg->beta1, (double)t);
    double bc2 = 1.0 - pow((double)cfg->beta2, (double)t);
    float step = (float)((double)lr / bc1), c2 = (float)sqrt(bc2);
    float omb1 = (float)(1.0 - (double)cfg->beta1), omb2 = (float)(1.0 - (double)cfg->beta2);
    for (size_t i = 0; i < n; i++) {
        float d = g[i];
        if (cfg->kind != PST_OPTIM_ADAMW && wd != 0.0f)
            d = d + wd * p[i];
        switch (cfg->kind) {
        case PST_OPTIM_SGD:
            p[i] = p[i] - lr * d;
            break;
        case PST_OPTIM_MOMENTUM:
            st[i] = st[i] * cfg->momentum + d;
            p[i] = p[i] - lr * st[i];
            break;
        case PST_OPTIM_ADAGRAD:
            st[i] = st[i] + d * d;
            p[i] = p[i] - lr * (d / (sqrtf(st[i]) + cfg->eps));
            break;
        default: {
            float *m = st, *v = st + stride;
            if (cfg->kind == PST_OPTIM_ADAMW)
                p[i] = p[i] * (float)(1.0 - (double)lr * (double)wd);
            m[i] = m[i] * cfg->beta1 + omb1 * d;
            v[i] = v[i] * cfg->beta2 + (omb2 * d) * d;
            float denom = sqrtf(v[i]) / c2 + cfg->eps;
            p[i] = p[i] - step * (m[i] / denom);
            break;
        }
        }
    }
}

#define BIG_N 1037 /* several Adam blocks plus a ragged tail */

static void fill_random(float *p, float *g, size_t n, uint64_t seed)
{
    pst_rng rng;
    pst_rng_seed(&rng, seed, 0);
    for (size_t i = 0; i < n; i++) {
        p[i] = pst_rng_normal(&rng);
        g[i] = 0.1f * pst_rng_normal(&rng);
    }
}

Test(optim_naive, bits_match_scalar_reference)
{
    static float p[BIG_N], g[BIG_N], st[2 * BIG_N], rp[BIG_N], rst[2 * BIG_N];
    for (int k = 0; k < PST_OPTIM_KIND_COUNT_; k++) {
        for (int w = 0; w < 2; w++) {
            pst_optim_config cfg = make_cfg((pst_optim_kind)k, 0.01f, w ? 0.05f : 0.0f);
            fill_random(p, g, BIG_N, 7);
            memcpy(rp, p, sizeof(p));
            memset(st, 0, sizeof(st));
            memset(rst, 0, sizeof(rst));
            for (long t = 1; t <= 5; t++) {
                pst_optim_apply(&cfg, t, p, st, BIG_N, g, BIG_N);
                naive_apply(&cfg, t, rp, rst, BIG_N, g, BIG_N);
            }
            cr_assert(memcmp(p, rp, sizeof(p)) == 0, "%s wd=%d: params differ from reference",
                      pst_optim_kind_name(cfg.kind), w);
            cr_assert(memcmp(st, rst, sizeof(st)) == 0, "%s wd=%d: state differs",
                      pst_optim_kind_name(cfg.kind), w);
        }
    }
}

/* ---- range splits ----------------------------------------------------------------------- */

Test(optim_split, sub_ranges_give_identical_bits)
{
    /* Ragged split points: misaligned for the vector width and crossing Adam blocks. */
    static const size_t cuts[] = {0, 1, 6, 7, 263, 600, 601, 1030, BIG_N};
    const size_t ncuts = sizeof(cuts) / sizeof(cuts[0]);
    static float p1[BIG_N], p2[BIG_N], g[BIG_N], s1[2 * BIG_N], s2[2 * BIG_N];
    for (int k = 0; k < PST_OPTIM_KIND_COUNT_; k++) {
        for (int w = 0; w < 2; w++) {
            pst_optim_config cfg = make_cfg((pst_optim_kind)k, 0.01f, w ? 0.05f : 0.0f);
            fill_random(p1, g, BIG_N, 11);
            memcpy(p2, p1, sizeof(p1));
            memset(s1, 0, sizeof(s1));
            memset(s2, 0, sizeof(s2));
            for (long t = 1; t <= 4; t++) {
                pst_optim_apply(&cfg, t, p1, s1, BIG_N, g, BIG_N);
                for (size_t c = 0; c + 1 < ncuts; c++) {
                    size_t off = cuts[c], n = cuts[c + 1] - cuts[c];
                    pst_optim_apply(&cfg, t, p2 + off, s2 + off, BIG_N, g + off, n);
                }
            }
            char what[64];
            snprintf(what, sizeof(what), "%s wd=%d param", pst_optim_kind_name(cfg.kind), w);
            expect_same_bits(what, p1, p2, BIG_N);
            snprintf(what, sizeof(what), "%s wd=%d state", pst_optim_kind_name(cfg.kind), w);
            expect_same_bits(what, s1, s2, 2 * BIG_N);
        }
    }
}

/* ---- edge cases of apply ---------------------------------------------------------------- */

Test(optim_apply, sgd_with_null_state)
{
    pst_optim_config cfg = make_cfg(PST_OPTIM_SGD, 0.5f, 0.0f);
    float p[2] = {1.0f, 2.0f};
    const float g[2] = {2.0f, -2.0f};
    pst_optim_apply(&cfg, 1, p, NULL, 0, g, 2);
    expect_near("p", p, (const float[]){0.0f, 3.0f}, 2, 0.0);
}

Test(optim_apply, rejected_configs_leave_everything_unchanged)
{
    const float g[2] = {1.0f, -1.0f};
    float p[2] = {1.0f, 2.0f}, st[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    const float p0[2] = {1.0f, 2.0f}, st0[4] = {0.5f, 0.5f, 0.5f, 0.5f};

    pst_optim_config cfg = make_cfg(PST_OPTIM_MOMENTUM, 0.5f, 0.0f);
    cr_expect_eq(pst_optim_apply(&cfg, 1, p, NULL, 2, g, 2), PST_ERR_INVALID); /* needs state */
    cr_expect(strstr(pst_error_detail(), "momentum needs 1 state"), "%s", pst_error_detail());
    expect_near("momentum NULL state", p, p0, 2, 0.0);

    cfg.kind = PST_OPTIM_ADAM;
    cr_expect_eq(pst_optim_apply(&cfg, 0, p, st, 2, g, 2), PST_ERR_INVALID); /* 1-based t */
    cr_expect(strstr(pst_error_detail(), "update 0"), "%s", pst_error_detail());
    expect_near("t=0 param", p, p0, 2, 0.0);
    expect_near("t=0 state", st, st0, 4, 0.0);

    cfg.kind = PST_OPTIM_KIND_COUNT_;
    cr_expect_eq(pst_optim_apply(&cfg, 1, p, st, 2, g, 2), PST_ERR_INVALID);
    expect_near("bad kind param", p, p0, 2, 0.0);
    expect_near("bad kind state", st, st0, 4, 0.0);

    cfg.kind = PST_OPTIM_ADAM;
    cfg.schedule = PST_LR_SCHEDULE_COUNT_;
    cr_expect_eq(pst_optim_apply(&cfg, 1, p, st, 2, g, 2), PST_ERR_INVALID);
    expect_near("bad schedule param", p, p0, 2, 0.0);

    cfg.kind = PST_OPTIM_ADAMW;
    cfg.schedule = PST_LR_CONSTANT;
    cr_expect_eq(pst_optim_apply(&cfg, 1, p, st, 2, g, 0), PST_OK); /* n = 0: nothing */
    expect_near("n=0 param", p, p0, 2, 0.0);
}

Test(optim_apply, uses_scheduled_lr)
{
    /* An update under warmup_cosine equals the same update under a constant lr equal to
     * pst_lr_at(t), bit for bit, for every kind (AdamW's decay uses the scheduled lr too). */
    static float pa[64], pb[64], g[64], sa[128], sb[128];
    for (int k = 0; k < PST_OPTIM_KIND_COUNT_; k++) {
        pst_optim_config sched = make_cfg((pst_optim_kind)k, 0.05f, 0.1f);
        sched.schedule = PST_LR_WARMUP_COSINE;
        sched.warmup_steps = 3;
        sched.total_steps = 8;
        sched.min_lr = 0.001f;
        pst_optim_config flat = sched;
        flat.schedule = PST_LR_CONSTANT;
        fill_random(pa, g, 64, 3);
        memcpy(pb, pa, sizeof(pa));
        memset(sa, 0, sizeof(sa));
        memset(sb, 0, sizeof(sb));
        for (long t = 1; t <= 10; t++) {
            flat.lr = pst_lr_at(&sched, t);
            pst_optim_apply(&sched, t, pa, sa, 64, g, 64);
            pst_optim_apply(&flat, t, pb, sb, 64, g, 64);
        }
        expect_same_bits(pst_optim_kind_name(sched.kind), pa, pb, 64);
    }
}

/* ---- learning-rate schedules ------------------------------------------------------------ */

static pst_optim_config cosine_cfg(void)
{
    /* lr 0.5, min_lr 0.05, warmup 10, total 110: the cosine spans t = 10..110 (100 steps). */
    pst_optim_config cfg = make_cfg(PST_OPTIM_ADAMW, 0.5f, 0.0f);
    cfg.schedule = PST_LR_WARMUP_COSINE;
    cfg.warmup_steps = 10;
    cfg.total_steps = 110;
    cfg.min_lr = 0.05f;
    return cfg;
}

Test(optim_lr, constant)
{
    pst_optim_config cfg = make_cfg(PST_OPTIM_SGD, 0.25f, 0.0f);
    cfg.warmup_steps = 10; /* ignored by the constant schedule */
    cfg.total_steps = 20;
    cr_expect_eq(pst_lr_at(&cfg, 1), 0.25f);
    cr_expect_eq(pst_lr_at(&cfg, 15), 0.25f);
    cr_expect_eq(pst_lr_at(&cfg, 1000), 0.25f);
}

Test(optim_lr, warmup)
{
    pst_optim_config cfg = cosine_cfg();
    cr_expect_eq(pst_lr_at(&cfg, 0), 0.0f);                  /* 0.5 * 0/10 */
    cr_expect_float_eq(pst_lr_at(&cfg, 1), 0.05f, 1e-9);     /* 0.5 * 1/10, warmup start */
    cr_expect_float_eq(pst_lr_at(&cfg, 5), 0.25f, 1e-9);     /* 0.5 * 5/10 */
    cr_expect_eq(pst_lr_at(&cfg, 10), 0.5f);                 /* warmup end: exactly lr */
}

Test(optim_lr, cosine)
{
    pst_optim_config cfg = cosine_cfg();
    /* t=11: 0.05 + 0.45 * (1 + cos(pi * 1/100)) / 2 = 0.05 + 0.225 * 1.99950656 = 0.499888977 */
    cr_expect_float_eq(pst_lr_at(&cfg, 11), 0.499888977f, 1e-7);
    /* t=35: progress 0.25: 0.05 + 0.225 * (1 + 0.707106781) = 0.434099026 */
    cr_expect_float_eq(pst_lr_at(&cfg, 35), 0.434099026f, 1e-7);
    /* t=60: mid-cosine, progress 0.5, cos = 0: 0.05 + 0.225 = 0.275 */
    cr_expect_float_eq(pst_lr_at(&cfg, 60), 0.275f, 1e-7);
    /* t=85: progress 0.75: 0.05 + 0.225 * (1 - 0.707106781) = 0.115900974 */
    cr_expect_float_eq(pst_lr_at(&cfg, 85), 0.115900974f, 1e-7);
    /* t=109: progress 0.99: 0.05 + 0.225 * (1 - 0.999506560) = 0.050111023 */
    cr_expect_float_eq(pst_lr_at(&cfg, 109), 0.050111023f, 1e-7);
    cr_expect_eq(pst_lr_at(&cfg, 110), 0.05f); /* total_steps: exactly min_lr */
    cr_expect_eq(pst_lr_at(&cfg, 111), 0.05f); /* and after */
    cr_expect_eq(pst_lr_at(&cfg, 100000), 0.05f);
    /* Non-increasing after warmup. */
    for (long t = 10; t < 120; t++)
        cr_expect(pst_lr_at(&cfg, t + 1) <= pst_lr_at(&cfg, t), "t=%ld", t);
}

Test(optim_lr, cosine_without_warmup)
{
    pst_optim_config cfg = cosine_cfg();
    cfg.warmup_steps = 0;
    cfg.total_steps = 100;
    /* t=1: 0.05 + 0.225 * (1 + cos(pi/100)) = 0.499888977; t=50: 0.275; t=100: min_lr */
    cr_expect_float_eq(pst_lr_at(&cfg, 1), 0.499888977f, 1e-7);
    cr_expect_float_eq(pst_lr_at(&cfg, 50), 0.275f, 1e-7);
    cr_expect_eq(pst_lr_at(&cfg, 100), 0.05f);
}

Test(optim_lr, total_not_after_warmup)
{
    /* total_steps <= warmup_steps: warmup as usual, then min_lr. */
    pst_optim_config cfg = cosine_cfg();
    cfg.total_steps = 10;
    cr_expect_eq(pst_lr_at(&cfg, 10), 0.5f);
    cr_expect_eq(pst_lr_at(&cfg, 11), 0.05f);
    cfg.total_steps = 4;
    cr_expect_float_eq(pst_lr_at(&cfg, 5), 0.25f, 1e-9);
    cr_expect_eq(pst_lr_at(&cfg, 11), 0.05f);
}

/* ---- names, parsing, sizes, defaults ---------------------------------------------------- */

Test(optim_names, kind_round_trip)
{
    static const char *const names[] = {"sgd", "momentum", "adam", "adamw", "adagrad"};
    for (int k = 0; k < PST_OPTIM_KIND_COUNT_; k++) {
        cr_expect_str_eq(pst_optim_kind_name((pst_optim_kind)k), names[k]);
        pst_optim_kind out = PST_OPTIM_KIND_COUNT_;
        cr_expect_eq(pst_optim_kind_parse(pst_optim_kind_name((pst_optim_kind)k), &out), 0);
        cr_expect_eq(out, (pst_optim_kind)k);
    }
    pst_optim_kind out = PST_OPTIM_MOMENTUM;
    cr_expect_eq(pst_optim_kind_parse("Adam", &out), -1);
    cr_expect_eq(pst_optim_kind_parse("", &out), -1);
    cr_expect_eq(pst_optim_kind_parse("adamw ", &out), -1);
    cr_expect_eq(pst_optim_kind_parse(NULL, &out), -1);
    cr_expect_eq(out, PST_OPTIM_MOMENTUM); /* untouched on failure */
    cr_expect_str_eq(pst_optim_kind_name(PST_OPTIM_KIND_COUNT_), "unknown");
}

Test(optim_names, schedule_round_trip)
{
    static const char *const names[] = {"constant", "warmup_cosine"};
    for (int s = 0; s < PST_LR_SCHEDULE_COUNT_; s++) {
        cr_expect_str_eq(pst_lr_schedule_name((pst_lr_schedule)s), names[s]);
        pst_lr_schedule out = PST_LR_SCHEDULE_COUNT_;
        cr_expect_eq(pst_lr_schedule_parse(pst_lr_schedule_name((pst_lr_schedule)s), &out), 0);
        cr_expect_eq(out, (pst_lr_schedule)s);
    }
    pst_lr_schedule out = PST_LR_CONSTANT;
    cr_expect_eq(pst_lr_schedule_parse("cosine", &out), -1);
    cr_expect_eq(pst_lr_schedule_parse(NULL, &out), -1);
    cr_expect_eq(out, PST_LR_CONSTANT);
    cr_expect_str_eq(pst_lr_schedule_name(PST_LR_SCHEDULE_COUNT_), "unknown");
}

Test(optim_names, state_floats)
{
    cr_expect_eq(pst_optim_state_floats(PST_OPTIM_SGD), 0);
    cr_expect_eq(pst_optim_state_floats(PST_OPTIM_MOMENTUM), 1);
    cr_expect_eq(pst_optim_state_floats(PST_OPTIM_ADAM), 2);
    cr_expect_eq(pst_optim_state_floats(PST_OPTIM_ADAMW), 2);
    cr_expect_eq(pst_optim_state_floats(PST_OPTIM_ADAGRAD), 1);
    cr_expect_eq(pst_optim_state_floats(PST_OPTIM_KIND_COUNT_), -1);
}

Test(optim_names, defaults)
{
    pst_optim_config cfg;
    memset(&cfg, 0xff, sizeof(cfg));
    pst_optim_defaults(&cfg);
    cr_expect_eq(cfg.kind, PST_OPTIM_SGD);
    cr_expect_eq(cfg.lr, 0.01f);
    cr_expect_eq(cfg.momentum, 0.9f);
    cr_expect_eq(cfg.beta1, 0.9f);
    cr_expect_eq(cfg.beta2, 0.999f);
    cr_expect_eq(cfg.eps, 1e-8f);
    cr_expect_eq(cfg.weight_decay, 0.0f);
    cr_expect_eq(cfg.schedule, PST_LR_CONSTANT);
    cr_expect_eq(cfg.warmup_steps, 0);
    cr_expect_eq(cfg.total_steps, 0);
    cr_expect_eq(cfg.min_lr, 0.0f);
}

/* Momentum, Adam and AdamW against optim.h's formulas in double, five steps (this checked
 * the device op that was removed; the arithmetic is optim.c's). */
Test(optim_apply, momentum_and_adam_follow_the_formulas_in_double)
{
    enum { N = 50 };
    for (int kind = PST_OPTIM_MOMENTUM; kind <= PST_OPTIM_ADAMW; kind++) {
        pst_optim_config cfg;
        pst_optim_defaults(&cfg);
        cfg.kind = (pst_optim_kind)kind;
        cfg.lr = 0.01f;
        cfg.momentum = 0.9f;
        cfg.weight_decay = 0.05f;
        pst_rng rng;
        pst_rng_seed(&rng, 500 + (uint64_t)kind, 1);
        float p[N], g[N], state[2 * N] = {0};
        double rp[N], rm[N] = {0}, rv[N] = {0};
        for (int i = 0; i < N; i++)
            rp[i] = p[i] = pst_rng_normal(&rng);
        for (long t = 1; t <= 5; t++) {
            for (int i = 0; i < N; i++)
                g[i] = pst_rng_normal(&rng);
            cr_assert_eq(pst_optim_apply(&cfg, t, p, state, N, g, N), PST_OK);
            const double lr = cfg.lr, wd = cfg.weight_decay, b1 = cfg.beta1, b2 = cfg.beta2;
            for (int i = 0; i < N; i++) {
                double d = g[i];
                if (kind == PST_OPTIM_MOMENTUM) {
                    d += wd * rp[i];
                    rm[i] = cfg.momentum * rm[i] + d;
                    rp[i] -= lr * rm[i];
                } else {
                    if (kind == PST_OPTIM_ADAMW)
                        rp[i] *= 1 - lr * wd;
                    else
                        d += wd * rp[i];
                    rm[i] = b1 * rm[i] + (1 - b1) * d;
                    rv[i] = b2 * rv[i] + (1 - b2) * d * d;
                    const double mh = rm[i] / (1 - pow(b1, (double)t));
                    const double vh = rv[i] / (1 - pow(b2, (double)t));
                    rp[i] -= lr * mh / (sqrt(vh) + cfg.eps);
                }
                cr_assert(fabs(p[i] - rp[i]) <= 1e-5 * (1.0 + fabs(rp[i])),
                          "%s t=%ld: param %d is %.9g, the formula gives %.9g",
                          pst_optim_kind_name(cfg.kind), t, i, p[i], rp[i]);
            }
        }
    }
}
