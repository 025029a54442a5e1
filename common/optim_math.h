/* optim_math.h — the optimizer arithmetic, written once so that any update gets the same
 * bits: the per-call scalars (computed on the host, in double, rounded once) and the
 * per-element steps, in PyTorch's order (optim.h has the formulas). optim.c is its only
 * user today (the pservers' and the in-process store's update); the device op that shared
 * it had no caller and was removed, and the _rn forms below keep a device update, should
 * one get a caller, bit-equal to the host's.
 *
 * Every operation is one correctly rounded IEEE float operation: on the device through
 * the _rn intrinsics (nvcc would otherwise contract a*b+c into an FMA); on the CPU as plain
 * C, which optim.c compiles with FMA contraction off. So a parameter gets the same bits on
 * either backend, whatever the vector width or the split into calls. Nothing here touches
 * memory: the callers own their loops (vectorized on the CPU, a grid-stride loop on CUDA). */
#ifndef PST_OPTIM_MATH_H
#define PST_OPTIM_MATH_H

#include <math.h>
#include <string.h>

#include "common/optim_config.h"

#if defined(__CUDACC__)
#define PST_OPTIM_FN static inline __host__ __device__
#else
#define PST_OPTIM_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define PST_FADD(a, b) __fadd_rn((a), (b))
#define PST_FSUB(a, b) __fsub_rn((a), (b))
#define PST_FMUL(a, b) __fmul_rn((a), (b))
#define PST_FDIV(a, b) __fdiv_rn((a), (b))
#define PST_FSQRT(a) __fsqrt_rn(a)
#else
#define PST_FADD(a, b) ((a) + (b))
#define PST_FSUB(a, b) ((a) - (b))
#define PST_FMUL(a, b) ((a) * (b))
#define PST_FDIV(a, b) ((a) / (b))
#define PST_FSQRT(a) sqrtf(a)
#endif

/* The scalars of update t, hoisted out of the element loops. */
typedef struct pst_optim_scalars {
    float lr;        /* the schedule's lr at t (pst_lr_at) */
    float wd;        /* L2 coefficient added to the gradient (SGD, momentum, Adam) */
    float mu;        /* momentum */
    float b1, b2;    /* betas */
    float omb1;      /* 1 - beta1, rounded once from double (as PyTorch's alpha) */
    float omb2;      /* 1 - beta2 */
    float step_size; /* lr / (1 - beta1^t), in double then rounded */
    float bc2_sqrt;  /* sqrt(1 - beta2^t), in double then rounded */
    float eps;
    float decay;     /* AdamW: 1 - lr*wd, in double then rounded; Adam: 1 (exact) */
    int l2;          /* Adam with wd != 0: the gradient gets wd*p (AdamW decays instead) */
} pst_optim_scalars;

/* Fills s for update t (1-based) of cfg with the schedule's learning rate lr (pst_lr_at,
 * optim.h; passed in so that this header needs no library). Host code. */
static inline void pst_optim_scalars_at(const pst_optim_config *cfg, long t, float lr,
                                        pst_optim_scalars *s)
{
    memset(s, 0, sizeof *s);
    s->lr = lr;
    s->wd = cfg->weight_decay;
    s->mu = cfg->momentum;
    s->decay = 1.0f;
    if (cfg->kind != PST_OPTIM_ADAM && cfg->kind != PST_OPTIM_ADAMW)
        return;
    const double b1 = cfg->beta1, b2 = cfg->beta2;
    const double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    s->b1 = cfg->beta1;
    s->b2 = cfg->beta2;
    s->omb1 = (float)(1.0 - b1);
    s->omb2 = (float)(1.0 - b2);
    s->step_size = (float)((double)lr / bc1);
    s->bc2_sqrt = (float)sqrt(bc2);
    s->eps = cfg->eps;
    /* AdamW's p *= 1 - lr*wd happens before the Adam step; multiplying by 1 for Adam is
     * exact, so one parameter step serves both. */
    if (cfg->kind == PST_OPTIM_ADAMW)
        s->decay = (float)(1.0 - (double)lr * (double)s->wd);
    s->l2 = cfg->kind == PST_OPTIM_ADAM && s->wd != 0.0f;
}

/* g' = g + wd*p (the L2 term; callers skip it when wd == 0, as PyTorch does). */
PST_OPTIM_FN float pst_optim_l2(float g, float wd, float p)
{
    return PST_FADD(g, PST_FMUL(wd, p));
}

/* p - lr*d: SGD's step with d = g', momentum's with d = buf. */
PST_OPTIM_FN float pst_optim_descend(float p, float lr, float d)
{
    return PST_FSUB(p, PST_FMUL(lr, d));
}

/* buf*mu + g' (the new momentum buffer). */
PST_OPTIM_FN float pst_optim_momentum(float buf, float mu, float d)
{
    return PST_FADD(PST_FMUL(buf, mu), d);
}

/* Adam's moments: m*b1 + (1-b1)*g' and v*b2 + ((1-b2)*g')*g'. */
PST_OPTIM_FN float pst_optim_adam_m(float m, float b1, float omb1, float d)
{
    return PST_FADD(PST_FMUL(m, b1), PST_FMUL(omb1, d));
}

PST_OPTIM_FN float pst_optim_adam_v(float v, float b2, float omb2, float d)
{
    return PST_FADD(PST_FMUL(v, b2), PST_FMUL(PST_FMUL(omb2, d), d));
}

/* p*decay - step * (m / (root/sqrt(bc2) + eps)) with root = sqrt(v): PyTorch's addcdiv_
 * order. The CPU takes the square root in a SIMD pass of its own (optim.c). */
PST_OPTIM_FN float pst_optim_adam_param(float p, float m, float root, float decay,
                                        float step_size, float bc2_sqrt, float eps)
{
    const float denom = PST_FADD(PST_FDIV(root, bc2_sqrt), eps);
    return PST_FSUB(PST_FMUL(p, decay), PST_FMUL(step_size, PST_FDIV(m, denom)));
}

#endif /* PST_OPTIM_MATH_H */
