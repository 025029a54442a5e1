/* optim.h — optimizers and learning-rate schedules, written once for the local trainer
 * and the pserver.
 *
 * An update is a pure elementwise function over a range of parameters, so the pserver can
 * apply it per block (and per thread) and the result is the same bits as one call over the
 * whole buffer. Semantics follow PyTorch (torch.optim, dampening 0, nesterov off):
 *   SGD:       g' = g + wd*p;                       p -= lr*g'
 *   momentum:  g' = g + wd*p;  buf = mu*buf + g';    p -= lr*buf       (buf starts at 0)
 *   Adam:      g' = g + wd*p;  m = b1*m + (1-b1)*g'; v = b2*v + (1-b2)*g'^2;
 *              p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
 *   AdamW:     p *= 1 - lr*wd; then Adam with g' = g.
 *   Adagrad:   g' = g + wd*p;  acc += g'*g';  p -= lr * (g' / (sqrt(acc) + eps))
 *              (acc starts at 0, PyTorch's initial_accumulator_value; no lr decay)
 * t is the 1-based update count. lr is the schedule's value at update t (pst_lr_at).
 * The g' = g + wd*p term is skipped when wd == 0, as PyTorch does.
 *
 * Arithmetic is float per element, in PyTorch's order (its single-tensor CPU path), so
 * results match torch.optim to float rounding: Adam computes
 *   step = (float)(lr / (1 - b1^t)), c2 = (float)sqrt(1 - b2^t)    (double, once per call)
 *   p = p - step * (m / (sqrt(v) / c2 + eps)),
 * with v updated as b2*v + ((1-b2)*g')*g', and 1-b1, 1-b2, 1-lr*wd rounded to float from
 * double. Elementwise results do not depend on how a buffer is split into calls.
 *
 * Optimizer state is `pst_optim_state_floats(kind)` arrays ([buf], [m, v] or [acc]), each
 * parallel to the parameters, zero-initialized by the caller; array k of a call starts at
 * state + k*state_stride, so a sub-range [off, off+n) of a buffer of N parameters is
 * updated with (param+off, state+off, stride N, grad+off, n). Thread safe (no shared
 * state); calls on disjoint ranges may run concurrently. Nothing here allocates. */
#ifndef PST_OPTIM_H
#define PST_OPTIM_H

#include <stddef.h>

#include "common/error.h"
#include "common/optim_config.h"

/* 0 for SGD, 1 for momentum, 2 for Adam/AdamW; -1 outside the enum. */
int pst_optim_state_floats(pst_optim_kind k);
/* Learning rate for 1-based update t, computed in double and returned as float.
 * Constant (and any schedule outside the enum): lr. Warmup_cosine, with t = max(t, 0),
 * W = max(warmup_steps, 0), T = total_steps, the first matching line:
 *   W > 0 and t <= W:  lr * t / W                 (lr/W at t = 1, lr at t = W)
 *   t >= T:            min_lr                     (reached at T, and stays)
 *   otherwise:         min_lr + (lr - min_lr) * (1 + cos(pi * (t - W) / (T - W))) / 2
 * The pieces are continuous: the cosine starts at lr at t = W (so without warmup it starts
 * at lr) and reaches min_lr at t = T. With T <= W the rate drops to min_lr after warmup. */
float pst_lr_at(const pst_optim_config *cfg, long t);
/* Applies update t (1-based) to param[0..n) with grad[0..n) and the state arrays at
 * state + k*state_stride (layout above; state may be NULL for SGD). grad is read only;
 * param, grad and the state arrays must not overlap (so state_stride >= n for Adam and
 * AdamW). n == 0 does nothing. Errors: PST_ERR_INVALID (a kind or schedule outside the
 * enums, t < 1, NULL state for a kind with state), with the detail; everything is then
 * left unchanged. */
pst_status pst_optim_apply(const pst_optim_config *cfg, long t, float *param, float *state,
                     size_t state_stride, const float *grad, size_t n);

#endif /* PST_OPTIM_H */
