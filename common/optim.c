/* optim.c — SGD, momentum, Adam and AdamW updates and the learning-rate schedules; see
 * optim.h for the formulas and the state layout.
 *
 * DESIGN: pst_optim_apply computes every per-call scalar once (the scheduled lr, Adam's
 * bias corrections in double, 1-beta, the AdamW decay factor), then runs branch-free loops
 * chosen per kind (and per wd == 0, which PyTorch also special-cases) over restrict
 * float arrays, which the compiler vectorizes, each built for x86-64-v4, v3 and the
 * baseline (PST_BIT_EXACT_CLONES; no FMA is contracted, so every clone gives the same
 * bits; measured in docs/benchmarks.md). Adam runs over blocks of ADAM_BLOCK elements in
 * three passes: moments (storing v into a stack buffer), square roots, then the
 * parameters; the square root is the one place that needs SIMD intrinsics (see
 * sqrt_in_place). Each element's result depends only on that element and the hoisted
 * scalars, and every operation is one correctly rounded IEEE float operation (+, -, *, /,
 * sqrt; no FMA contraction), so vector bodies and scalar tails give the same bits, and so
 * does any split of a buffer into ranges. The order of operations is PyTorch's
 * (torch/optim/{sgd,adam,adamw}.py, single-tensor path), so results agree with
 * torch.optim to float rounding. */
#include "common/optim.h"

#include "common/dtype.h" /* PST_BIT_EXACT_CLONES */

#include <math.h>
#include <string.h>

#if defined(__SSE__)
#include <xmmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

static const double pst_pi = 3.14159265358979323846;

int pst_optim_state_floats(pst_optim_kind k)
{
    switch (k) {
    case PST_OPTIM_SGD:
        return 0;
    case PST_OPTIM_MOMENTUM:
    case PST_OPTIM_ADAGRAD:
        return 1;
    case PST_OPTIM_ADAM:
    case PST_OPTIM_ADAMW:
        return 2;
    default:
        return -1;
    }
}

float pst_lr_at(const pst_optim_config *cfg, long t)
{
    if (cfg->schedule != PST_LR_WARMUP_COSINE)
        return cfg->lr;
    if (t < 0)
        t = 0;
    long warmup = cfg->warmup_steps > 0 ? cfg->warmup_steps : 0;
    if (warmup > 0 && t <= warmup)
        return (float)((double)cfg->lr * (double)t / (double)warmup);
    if (t >= cfg->total_steps)
        return cfg->min_lr;
    /* Here warmup <= t < total_steps, so the denominator is at least 1. */
    double progress = (double)(t - warmup) / (double)(cfg->total_steps - warmup);
    double lo = cfg->min_lr, hi = cfg->lr;
    return (float)(lo + 0.5 * (hi - lo) * (1.0 + cos(pst_pi * progress)));
}

/* The element loops must vectorize in the project's -O2 build, where GCC uses the
 * "very-cheap" vectorizer cost model that skips any loop whose trip count is not a known
 * multiple of the vector width. The dynamic model changes no result bit; FMA contraction is
 * kept off explicitly so that no target (-march=native) contracts the vector body and the
 * scalar tail differently (clang: the standard pragma). Both hold for the rest of this file,
 * the element steps of optim_math.h included (they are inlined into the loops below). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("vect-cost-model=dynamic", "fp-contract=off")
#endif
#include "common/optim_math.h"

/* Adam runs over blocks of this many elements, with the square roots in a stack buffer. */
#define ADAM_BLOCK 256

PST_BIT_EXACT_CLONES
static void sgd_update(float *restrict p, const float *restrict g, size_t n,
                                        float lr)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pst_optim_descend(p[i], lr, g[i]);
}

PST_BIT_EXACT_CLONES
static void sgd_update_l2(float *restrict p, const float *restrict g,
                                           size_t n, float lr, float wd)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pst_optim_descend(p[i], lr, pst_optim_l2(g[i], wd, p[i]));
}

PST_BIT_EXACT_CLONES
static void momentum_update(float *restrict p, float *restrict buf,
                                             const float *restrict g, size_t n, float lr,
                                             float mu)
{
    for (size_t i = 0; i < n; i++) {
        float b = pst_optim_momentum(buf[i], mu, g[i]);
        buf[i] = b;
        p[i] = pst_optim_descend(p[i], lr, b);
    }
}

PST_BIT_EXACT_CLONES
static void momentum_update_l2(float *restrict p, float *restrict buf,
                                                const float *restrict g, size_t n, float lr,
                                                float mu, float wd)
{
    for (size_t i = 0; i < n; i++) {
        float b = pst_optim_momentum(buf[i], mu, pst_optim_l2(g[i], wd, p[i]));
        buf[i] = b;
        p[i] = pst_optim_descend(p[i], lr, b);
    }
}

/* m = b1*m + (1-b1)*g; v = b2*v + ((1-b2)*g)*g; root = v (square-rooted next). */
PST_BIT_EXACT_CLONES
static void adam_moments(float *restrict m, float *restrict v,
                                          float *restrict root, const float *restrict g,
                                          size_t n, const pst_optim_scalars *s)
{
    const float b1 = s->b1, b2 = s->b2, omb1 = s->omb1, omb2 = s->omb2;
    for (size_t i = 0; i < n; i++) {
        float d = g[i];
        float vv = pst_optim_adam_v(v[i], b2, omb2, d);
        m[i] = pst_optim_adam_m(m[i], b1, omb1, d);
        v[i] = vv;
        root[i] = vv;
    }
}

/* As adam_moments with the L2 term: the gradient is g + wd*p (Adam with weight decay). */
PST_BIT_EXACT_CLONES
static void adam_moments_l2(float *restrict m, float *restrict v,
                                             float *restrict root, const float *restrict g,
                                             const float *restrict p, size_t n,
                                             const pst_optim_scalars *s)
{
    const float b1 = s->b1, b2 = s->b2, omb1 = s->omb1, omb2 = s->omb2, wd = s->wd;
    for (size_t i = 0; i < n; i++) {
        float d = pst_optim_l2(g[i], wd, p[i]);
        float vv = pst_optim_adam_v(v[i], b2, omb2, d);
        m[i] = pst_optim_adam_m(m[i], b1, omb1, d);
        v[i] = vv;
        root[i] = vv;
    }
}

/* x = sqrt(x) in place. Under -fmath-errno (the C default, and this build's) sqrtf stays a
 * scalar call that the vectorizer cannot touch, so the bulk goes through the SIMD square
 * root, which is the same correctly rounded IEEE operation: the bits do not depend on which
 * path an element takes. */
static void sqrt_in_place(float *x, size_t n)
{
    size_t i = 0;
#if defined(__SSE__)
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#elif defined(__aarch64__) && defined(__ARM_NEON)
    for (; i + 4 <= n; i += 4)
        vst1q_f32(x + i, vsqrtq_f32(vld1q_f32(x + i)));
#endif
    for (; i < n; i++)
        x[i] = sqrtf(x[i]);
}

/* Adagrad over blocks of ADAM_BLOCK: acc += g'*g' (g' = g + wd*p when wd != 0), the
 * square roots in a SIMD pass, then p -= lr * (g' / (root + eps)): PyTorch's addcmul_,
 * sqrt, add_(eps) and addcdiv_ order. */
PST_BIT_EXACT_CLONES
static void adagrad_update(float *restrict p, float *restrict acc, const float *restrict g,
                           size_t n, float lr, float wd, float eps)
{
    float root[ADAM_BLOCK], d[ADAM_BLOCK];
    for (size_t off = 0; off < n; off += ADAM_BLOCK) {
        const size_t len = n - off < ADAM_BLOCK ? n - off : ADAM_BLOCK;
        for (size_t i = 0; i < len; i++) {
            d[i] = wd != 0.0f ? pst_optim_l2(g[off + i], wd, p[off + i]) : g[off + i];
            acc[off + i] = acc[off + i] + d[i] * d[i];
            root[i] = acc[off + i];
        }
        sqrt_in_place(root, len);
        for (size_t i = 0; i < len; i++)
            p[off + i] = pst_optim_descend(p[off + i], lr, d[i] / (root[i] + eps));
    }
}

/* p = p*decay - step_size * (m / (root/sqrt(bc2) + eps)), PyTorch's addcdiv_ order. */
PST_BIT_EXACT_CLONES
static void adam_params(float *restrict p, const float *restrict m,
                                         const float *restrict root, size_t n,
                                         const pst_optim_scalars *s)
{
    const float decay = s->decay, step = s->step_size, bc2s = s->bc2_sqrt, eps = s->eps;
    for (size_t i = 0; i < n; i++)
        p[i] = pst_optim_adam_param(p[i], m[i], root[i], decay, step, bc2s, eps);
}

static void adam_update(float *p, float *m, float *v, const float *g, size_t n,
                        const pst_optim_scalars *s)
{
    float root[ADAM_BLOCK];
    for (size_t off = 0; off < n; off += ADAM_BLOCK) {
        size_t len = n - off < ADAM_BLOCK ? n - off : ADAM_BLOCK;
        if (s->l2)
            adam_moments_l2(m + off, v + off, root, g + off, p + off, len, s);
        else
            adam_moments(m + off, v + off, root, g + off, len, s);
        sqrt_in_place(root, len);
        adam_params(p + off, m + off, root, len, s);
    }
}

pst_status pst_optim_apply(const pst_optim_config *cfg, long t, float *param, float *state,
                     size_t state_stride, const float *grad, size_t n)
{
    int nstate = pst_optim_state_floats(cfg->kind);
    if (nstate < 0 || (unsigned)cfg->schedule >= PST_LR_SCHEDULE_COUNT_)
        return pst_error_set(PST_ERR_INVALID, "optimizer: unknown kind %d or schedule %d; "
                             "expected sgd, momentum, adam, adamw or adagrad with constant or "
                             "warmup_cosine", (int)cfg->kind, (int)cfg->schedule);
    if (t < 1)
        return pst_error_set(PST_ERR_INVALID, "optimizer: update %ld; updates count from 1", t);
    if (nstate > 0 && state == NULL)
        return pst_error_set(PST_ERR_INVALID, "optimizer: %s needs %d state arrays, got none",
                             pst_optim_kind_name(cfg->kind), nstate);
    if (n == 0)
        return PST_OK;

    pst_optim_scalars s;
    pst_optim_scalars_at(cfg, t, pst_lr_at(cfg, t), &s);

    switch (cfg->kind) {
    case PST_OPTIM_SGD:
        if (s.wd != 0.0f)
            sgd_update_l2(param, grad, n, s.lr, s.wd);
        else
            sgd_update(param, grad, n, s.lr);
        return PST_OK;
    case PST_OPTIM_MOMENTUM:
        if (s.wd != 0.0f)
            momentum_update_l2(param, state, grad, n, s.lr, s.mu, s.wd);
        else
            momentum_update(param, state, grad, n, s.lr, s.mu);
        return PST_OK;
    case PST_OPTIM_ADAGRAD:
        adagrad_update(param, state, grad, n, s.lr, s.wd, cfg->eps);
        return PST_OK;
    case PST_OPTIM_ADAM:
    case PST_OPTIM_ADAMW:
        break;
    default:
        return PST_OK; /* unreachable: the kind was checked above */
    }

    adam_update(param, state, state + state_stride, grad, n, &s);
    return PST_OK;
}
