/* test_model.c — the model interface (common/nn/model.h) and its models, and the tests'
 * reference MLP (tests/ref_mlp.c) they are measured against.
 *
 * Suite `model`: the mlp's and the synthetic model's tensor tables and layer lists, the
 * interface's checks on malformed models (each a clear error naming the layer or tensor),
 * and the interface's MLP run layer by layer on a CPU stream against the reference MLP:
 * the same losses and gradients, bit for bit, and the same initial values.
 * Suite `mlp` (the reference): the model runs on a real CPU device ("cpu:1") so its memory accounting is exercised.
 * The reference is a double-precision MLP written here from the layout documented in
 * model.h (layer l: weight (out_l, in_l) then bias (out_l), in forward order); every
 * parameter's gradient is checked against central finite differences of that reference.
 * The grad-ready hook is checked for order (end of the buffer first), exact coverage, and
 * that each range it reports already holds its final gradient. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/nn/models/models.h"
#include "common/runtime/device.h"
#include "ref_mlp.h"
#include "common/rng.h"

static pst_runtime *rt;
static pst_device *dev;

static void setup(void)
{
    cr_assert_eq(pst_runtime_init(&rt, "cpu:1"), PST_OK, "%s", pst_error_detail());
    dev = pst_runtime_device(rt, 0);
    cr_assert_not_null(dev);
}

static void teardown(void)
{
    pst_runtime_free(rt);
    rt = NULL;
    dev = NULL;
}

TestSuite(mlp, .init = setup, .fini = teardown);

/* The tiny model of the gradient checks: 6 -> 5 -> 4 -> 3, batch 4. */
static ref_mlp_config tiny_cfg(void)
{
    ref_mlp_config c = {.in_dim = 6, .out_dim = 3, .nhidden = 2, .hidden = {5, 4}};
    return c;
}

static void fill_uniform(float *x, size_t n, float lo, float hi, uint64_t seed)
{
    pst_rng r;
    pst_rng_seed(&r, seed, 3);
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * pst_rng_uniform(&r);
}

static int close_enough(double got, double want, double atol, double rtol)
{
    return fabs(got - want) <= atol + rtol * fabs(want);
}

/* Sum over the batch of the cross-entropy losses of the MLP with parameters p (double),
 * layout as model.h documents. Also returns the smallest |pre-activation| of a hidden
 * unit (how far the data is from a ReLU kink) through *margin when not NULL. */
static double ref_loss(const ref_mlp_config *cfg, const double *p, const float *x,
                       const int32_t *y, int B, double *margin)
{
    double act[2][64];
    double loss = 0, minpre = INFINITY;
    for (int b = 0; b < B; b++) {
        int in = cfg->in_dim;
        for (int i = 0; i < in; i++)
            act[0][i] = x[b * in + i];
        int cur = 0;
        size_t off = 0;
        for (int l = 0; l <= cfg->nhidden; l++) {
            int out = l < cfg->nhidden ? cfg->hidden[l] : cfg->out_dim;
            const double *w = p + off, *bias = p + off + (size_t)out * in;
            for (int o = 0; o < out; o++) {
                double s = bias[o];
                for (int i = 0; i < in; i++)
                    s += w[o * in + i] * act[cur][i];
                if (l < cfg->nhidden) {
                    minpre = fmin(minpre, fabs(s));
                    s = s > 0 ? s : 0;
                }
                act[1 - cur][o] = s;
            }
            off += (size_t)out * in + out;
            cur = 1 - cur;
            in = out;
        }
        const double *logits = act[cur];
        double m = logits[0], s = 0;
        for (int j = 1; j < cfg->out_dim; j++)
            m = fmax(m, logits[j]);
        for (int j = 0; j < cfg->out_dim; j++)
            s += exp(logits[j] - m);
        loss += log(s) + m - logits[y[b]];
    }
    if (margin)
        *margin = minpre;
    return loss;
}

/* ---- shapes and layout -------------------------------------------------------------- */

Test(mlp, param_count)
{
    ref_mlp_config c = {.in_dim = 784, .out_dim = 10, .nhidden = 2, .hidden = {1024, 1024}};
    cr_expect_eq(ref_mlp_param_count(&c), (size_t)(784 * 1024 + 1024 + 1024 * 1024 + 1024 +
                                                   1024 * 10 + 10));
    ref_mlp_config lin = {.in_dim = 784, .out_dim = 10, .nhidden = 0};
    cr_expect_eq(ref_mlp_param_count(&lin), (size_t)(784 * 10 + 10));
    ref_mlp_config t = tiny_cfg();
    cr_expect_eq(ref_mlp_param_count(&t), (size_t)(6 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3));
    ref_mlp_config one = {.in_dim = 1, .out_dim = 1, .nhidden = 3, .hidden = {1, 1, 1}};
    cr_expect_eq(ref_mlp_param_count(&one), (size_t)8);
}

Test(mlp, views_tile_the_flat_buffer)
{
    ref_mlp_config cfgs[] = {
        tiny_cfg(),
        {.in_dim = 784, .out_dim = 10, .nhidden = 2, .hidden = {1024, 1024}},
        {.in_dim = 7, .out_dim = 2, .nhidden = 0},
        {.in_dim = 3, .out_dim = 5, .nhidden = 4, .hidden = {9, 1, 8, 2}},
    };
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        const ref_mlp_config *c = &cfgs[k];
        ref_mlp m;
        cr_assert_eq(ref_mlp_init(&m, c, 3, dev), PST_OK, "%s", pst_error_detail());
        cr_expect_eq(m.nlayers, c->nhidden + 1);
        cr_expect_eq(m.max_batch, 3);
        cr_expect_eq(m.dev, dev);
        cr_expect_eq(m.nparams, ref_mlp_param_count(c));
        cr_assert_not_null(m.params);
        cr_assert_not_null(m.grads);
        cr_expect_neq(m.params, m.grads);
        size_t off = 0;
        int in = c->in_dim;
        for (int l = 0; l < m.nlayers; l++) {
            const ref_linear_view *v = &m.layer[l];
            int out = l < c->nhidden ? c->hidden[l] : c->out_dim;
            cr_expect_eq(v->in, in, "config %zu layer %d in", k, l);
            cr_expect_eq(v->out, out, "config %zu layer %d out", k, l);
            cr_expect_eq(v->w_off, off, "config %zu layer %d w_off %zu, want %zu", k, l,
                         v->w_off, off);
            cr_expect_eq(v->b_off, v->w_off + (size_t)v->out * v->in,
                         "config %zu layer %d: bias does not follow the weight", k, l);
            off = v->b_off + (size_t)v->out;
            in = out;
            cr_assert_not_null(m.acts[l]);
        }
        cr_expect_eq(off, m.nparams, "config %zu: last layer ends at %zu, nparams %zu", k, off,
                     m.nparams);
        /* params zeroed at init; the whole buffer is addressable. */
        for (size_t i = 0; i < m.nparams; i++)
            cr_assert_eq(m.params[i], 0.0f, "config %zu params[%zu] = %g", k, i, m.params[i]);
        m.grads[m.nparams - 1] = 1.0f;
        ref_mlp_free(&m);
        cr_expect_null(m.params);
        cr_expect_null(m.dev);
    }
}

Test(mlp, memory_accounting)
{
    ref_mlp_config c = tiny_cfg();
    size_t live0 = pst_device_live_bytes(dev), peak0 = pst_device_peak_bytes(dev);
    ref_mlp m;
    cr_assert_eq(ref_mlp_init(&m, &c, 4, dev), PST_OK, "%s", pst_error_detail());
    size_t peak1 = pst_device_peak_bytes(dev), live1 = pst_device_live_bytes(dev);
    cr_expect_geq(peak1 - peak0, 2 * m.nparams * sizeof(float),
                  "peak grew by %zu, params + grads alone are %zu", peak1 - peak0,
                  2 * m.nparams * sizeof(float));
    cr_expect_geq(live1 - live0, 2 * m.nparams * sizeof(float));

    /* Forward and backward allocate nothing. */
    float x[4 * 6];
    int32_t y[4] = {0, 1, 2, 1};
    fill_uniform(x, 24, -1, 1, 5);
    ref_mlp_init_params(&m, 1);
    for (int i = 0; i < 3; i++) {
        ref_mlp_forward(&m, x, y, 4);
        ref_mlp_backward(&m, x, y, 4, 0.25f, i > 0, NULL, NULL);
    }
    cr_expect_eq(pst_device_live_bytes(dev), live1, "forward/backward changed live bytes");
    cr_expect_eq(pst_device_peak_bytes(dev), peak1, "forward/backward raised the peak");

    ref_mlp_free(&m);
    cr_expect_eq(pst_device_live_bytes(dev), live0, "free leaves %zu bytes live",
                 pst_device_live_bytes(dev) - live0);
    ref_mlp_free(&m); /* a zeroed model is accepted */
    ref_mlp_free(NULL);
}

Test(mlp, invalid_shapes)
{
    struct {
        ref_mlp_config c;
        int batch;
    } bad[] = {
        {{.in_dim = 0, .out_dim = 3, .nhidden = 1, .hidden = {4}}, 2},
        {{.in_dim = -1, .out_dim = 3, .nhidden = 0}, 2},
        {{.in_dim = 6, .out_dim = 0, .nhidden = 0}, 2},
        {{.in_dim = 6, .out_dim = 3, .nhidden = -1}, 2},
        {{.in_dim = 6, .out_dim = 3, .nhidden = PST_MAX_HIDDEN + 1,
          .hidden = {3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3}}, 2},
        {{.in_dim = 6, .out_dim = 3, .nhidden = 2, .hidden = {5, 0}}, 2},
        {{.in_dim = 6, .out_dim = 3, .nhidden = 1, .hidden = {-4}}, 2},
        {{.in_dim = 6, .out_dim = 3, .nhidden = 0}, 0},
        {{.in_dim = 6, .out_dim = 3, .nhidden = 0}, -5},
    };
    size_t live0 = pst_device_live_bytes(dev);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ref_mlp m;
        memset(&m, 0xab, sizeof m);
        pst_error_clear();
        cr_expect_eq(ref_mlp_init(&m, &bad[k].c, bad[k].batch, dev), PST_ERR_INVALID,
                     "case %zu accepted", k);
        cr_expect(strstr(pst_error_detail(), "mlp") != NULL, "case %zu detail '%s'", k,
                  pst_error_detail());
        cr_expect_null(m.params, "case %zu: model not zeroed on error", k);
        cr_expect_null(m.dev, "case %zu: model not zeroed on error", k);
        cr_expect_eq(m.nparams, 0, "case %zu: model not zeroed on error", k);
        ref_mlp_free(&m);
    }
    cr_expect_eq(pst_device_live_bytes(dev), live0, "a rejected init left memory behind");
    /* The largest allowed depth is accepted. */
    ref_mlp_config deep = {.in_dim = 2, .out_dim = 2, .nhidden = PST_MAX_HIDDEN};
    for (int l = 0; l < PST_MAX_HIDDEN; l++)
        deep.hidden[l] = 3;
    ref_mlp m;
    cr_expect_eq(ref_mlp_init(&m, &deep, 1, dev), PST_OK, "%s", pst_error_detail());
    cr_expect_eq(m.nlayers, PST_MAX_HIDDEN + 1);
    ref_mlp_free(&m);
}

/* ---- initialization ----------------------------------------------------------------- */

Test(mlp, init_params_deterministic_and_bounded)
{
    ref_mlp_config c = {.in_dim = 50, .out_dim = 7, .nhidden = 2, .hidden = {30, 9}};
    ref_mlp a, b;
    cr_assert_eq(ref_mlp_init(&a, &c, 1, dev), PST_OK);
    cr_assert_eq(ref_mlp_init(&b, &c, 1, dev), PST_OK);
    size_t bytes = a.nparams * sizeof(float);

    ref_mlp_init_params(&a, 42);
    ref_mlp_init_params(&b, 42);
    cr_expect_eq(memcmp(a.params, b.params, bytes), 0, "same seed, different bits");
    ref_mlp_init_params(&b, 42); /* re-init overwrites, does not continue a stream */
    cr_expect_eq(memcmp(a.params, b.params, bytes), 0, "re-init with the same seed differs");

    ref_mlp_init_params(&b, 43);
    size_t same = 0;
    for (size_t i = 0; i < a.nparams; i++)
        same += a.params[i] == b.params[i];
    cr_expect_lt(same, a.nparams / 100, "seeds 42 and 43 agree on %zu of %zu parameters", same,
                 a.nparams);

    for (int l = 0; l < a.nlayers; l++) {
        const ref_linear_view *v = &a.layer[l];
        double bound = 1.0 / sqrt((double)v->in);
        size_t n = (size_t)v->out * v->in + v->out;
        double mn = INFINITY, mx = -INFINITY, sum = 0;
        for (size_t i = 0; i < n; i++) {
            float p = a.params[v->w_off + i];
            cr_assert(fabs(p) <= bound * (1 + 1e-6), "layer %d param %zu = %g outside +-%g", l,
                      i, p, bound);
            mn = fmin(mn, p);
            mx = fmax(mx, p);
            sum += p;
        }
        /* U(-bound, bound): the sample spans most of the range and is centred. */
        cr_expect(mn < -0.5 * bound && mx > 0.5 * bound, "layer %d range [%g, %g], bound %g",
                  l, mn, mx, bound);
        cr_expect(fabs(sum / n) < 0.25 * bound, "layer %d mean %g, bound %g", l, sum / n,
                  bound);
        /* The biases are initialized too (not left at zero). */
        int nonzero_bias = 0;
        for (int o = 0; o < v->out; o++)
            nonzero_bias += a.params[v->b_off + o] != 0.0f;
        cr_expect_eq(nonzero_bias, v->out, "layer %d: %d of %d biases are set", l, nonzero_bias,
                     v->out);
    }
    ref_mlp_free(&a);
    ref_mlp_free(&b);
}

/* ---- forward and gradients ---------------------------------------------------------- */

typedef struct tiny {
    ref_mlp m;
    float x[4 * 6];
    int32_t y[4];
} tiny;

static void tiny_make(tiny *t, uint64_t seed)
{
    ref_mlp_config c = tiny_cfg();
    cr_assert_eq(ref_mlp_init(&t->m, &c, 4, dev), PST_OK, "%s", pst_error_detail());
    ref_mlp_init_params(&t->m, seed);
    fill_uniform(t->x, 24, -2, 2, seed + 100);
    const int32_t y[4] = {2, 0, 1, 2};
    memcpy(t->y, y, sizeof y);
}

static double *params_double(const ref_mlp *m)
{
    double *p = malloc(m->nparams * sizeof *p);
    cr_assert_not_null(p);
    for (size_t i = 0; i < m->nparams; i++)
        p[i] = m->params[i];
    return p;
}

Test(mlp, forward_matches_reference)
{
    tiny t;
    tiny_make(&t, 7);
    double *p = params_double(&t.m);
    for (int B = 1; B <= 4; B++) {
        double loss = ref_mlp_forward(&t.m, t.x, t.y, B);
        double want = ref_loss(&t.m.cfg, p, t.x, t.y, B, NULL);
        cr_expect(close_enough(loss, want, 1e-5, 1e-5), "B=%d loss %.9g, reference %.9g", B,
                  loss, want);
    }
    /* Same inputs, same bits. */
    double l1 = ref_mlp_forward(&t.m, t.x, t.y, 4);
    double l2 = ref_mlp_forward(&t.m, t.x, t.y, 4);
    cr_expect_eq(memcmp(&l1, &l2, sizeof l1), 0);
    free(p);
    ref_mlp_free(&t.m);
}

Test(mlp, gradient_finite_differences_every_parameter)
{
    tiny t;
    tiny_make(&t, 11);
    const int B = 4;
    const float scale = 1.0f / B;
    ref_mlp *m = &t.m;
    double *p = params_double(m);
    double margin;
    ref_loss(&m->cfg, p, t.x, t.y, B, &margin);
    cr_assert_gt(margin, 1e-3, "a hidden unit sits on a ReLU kink (%g); pick another seed",
                 margin);

    for (size_t i = 0; i < m->nparams; i++)
        m->grads[i] = NAN; /* accumulate = 0 overwrites */
    ref_mlp_forward(m, t.x, t.y, B);
    ref_mlp_backward(m, t.x, t.y, B, scale, 0, NULL, NULL);

    const double h = 1e-6;
    for (int l = 0; l < m->nlayers; l++) {
        const ref_linear_view *v = &m->layer[l];
        size_t n = (size_t)v->out * v->in + v->out;
        int nonzero_w = 0, nonzero_b = 0;
        for (size_t k = 0; k < n; k++) {
            size_t i = v->w_off + k;
            double save = p[i];
            p[i] = save + h;
            double lp = ref_loss(&m->cfg, p, t.x, t.y, B, NULL);
            p[i] = save - h;
            double lm = ref_loss(&m->cfg, p, t.x, t.y, B, NULL);
            p[i] = save;
            double want = scale * (lp - lm) / (2 * h);
            int is_bias = i >= v->b_off;
            cr_expect(close_enough(m->grads[i], want, 2e-6, 1e-4),
                      "layer %d %s[%zu] (flat %zu): grad %.9g, finite differences %.9g", l,
                      is_bias ? "bias" : "weight", is_bias ? i - v->b_off : k, i, m->grads[i],
                      want);
            if (fabs(want) > 1e-4)
                *(is_bias ? &nonzero_b : &nonzero_w) += 1;
        }
        /* Otherwise a layer whose gradient is all zero would pass trivially. */
        cr_expect_gt(nonzero_w, 0, "layer %d: every weight gradient is ~0", l);
        cr_expect_gt(nonzero_b, 0, "layer %d: every bias gradient is ~0", l);
    }
    free(p);
    ref_mlp_free(m);
}

Test(mlp, gradient_no_hidden_layer)
{
    /* nhidden = 0: softmax regression; the backward has no ReLU and no dinp. */
    ref_mlp_config c = {.in_dim = 5, .out_dim = 4, .nhidden = 0};
    ref_mlp m;
    cr_assert_eq(ref_mlp_init(&m, &c, 3, dev), PST_OK);
    ref_mlp_init_params(&m, 3);
    float x[15];
    int32_t y[3] = {3, 1, 0};
    fill_uniform(x, 15, -1, 1, 9);
    double *p = params_double(&m);
    ref_mlp_forward(&m, x, y, 3);
    ref_mlp_backward(&m, x, y, 3, 0.5f, 0, NULL, NULL);
    for (size_t i = 0; i < m.nparams; i++) {
        const double h = 1e-6;
        double save = p[i];
        p[i] = save + h;
        double lp = ref_loss(&c, p, x, y, 3, NULL);
        p[i] = save - h;
        double lm = ref_loss(&c, p, x, y, 3, NULL);
        p[i] = save;
        double want = 0.5 * (lp - lm) / (2 * h);
        cr_expect(close_enough(m.grads[i], want, 2e-6, 1e-4), "grads[%zu] %.9g, FD %.9g", i,
                  m.grads[i], want);
    }
    free(p);
    ref_mlp_free(&m);
}

Test(mlp, backward_deterministic)
{
    tiny a, b;
    tiny_make(&a, 5);
    tiny_make(&b, 5);
    ref_mlp_forward(&a.m, a.x, a.y, 4);
    ref_mlp_backward(&a.m, a.x, a.y, 4, 0.25f, 0, NULL, NULL);
    ref_mlp_forward(&b.m, b.x, b.y, 4);
    ref_mlp_backward(&b.m, b.x, b.y, 4, 0.25f, 0, NULL, NULL);
    cr_expect_eq(memcmp(a.m.grads, b.m.grads, a.m.nparams * sizeof(float)), 0,
                 "same seed and data, different gradient bits");
    ref_mlp_free(&a.m);
    ref_mlp_free(&b.m);
}

Test(mlp, accumulate_doubles_the_gradient)
{
    tiny t;
    tiny_make(&t, 13);
    ref_mlp *m = &t.m;
    float *g1 = malloc(m->nparams * sizeof(float));
    ref_mlp_forward(m, t.x, t.y, 4);
    ref_mlp_backward(m, t.x, t.y, 4, 0.25f, 0, NULL, NULL);
    memcpy(g1, m->grads, m->nparams * sizeof(float));
    ref_mlp_forward(m, t.x, t.y, 4);
    ref_mlp_backward(m, t.x, t.y, 4, 0.25f, 1, NULL, NULL);
    int nonzero = 0;
    for (size_t i = 0; i < m->nparams; i++) {
        cr_expect(close_enough(m->grads[i], 2.0 * g1[i], 1e-6, 1e-6),
                  "grads[%zu] = %.9g after two accumulating passes, want 2 * %.9g", i,
                  m->grads[i], g1[i]);
        nonzero += g1[i] != 0.0f;
    }
    cr_expect_gt(nonzero, (int)m->nparams / 4);
    /* And accumulate = 0 afterwards overwrites again. */
    ref_mlp_backward(m, t.x, t.y, 4, 0.25f, 0, NULL, NULL);
    cr_expect_eq(memcmp(m->grads, g1, m->nparams * sizeof(float)), 0);
    free(g1);
    ref_mlp_free(m);
}

/* ---- the grad-ready hook ------------------------------------------------------------ */

typedef struct hook_log {
    int n;
    size_t off[PST_MAX_HIDDEN + 2], len[PST_MAX_HIDDEN + 2];
    const ref_mlp *m;
    float *snap; /* grads as they were when each range was reported */
} hook_log;

static void on_ready(void *arg, size_t offset, size_t length)
{
    hook_log *h = arg;
    if (h->n < PST_MAX_HIDDEN + 2) {
        h->off[h->n] = offset;
        h->len[h->n] = length;
    }
    h->n++;
    if (offset + length <= h->m->nparams)
        memcpy(h->snap + offset, h->m->grads + offset, length * sizeof(float));
}

Test(mlp, grad_ready_hook_reports_from_the_end)
{
    ref_mlp_config cfgs[] = {tiny_cfg(),
                             {.in_dim = 3, .out_dim = 5, .nhidden = 4, .hidden = {9, 1, 8, 2}},
                             {.in_dim = 4, .out_dim = 2, .nhidden = 0}};
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        ref_mlp m;
        cr_assert_eq(ref_mlp_init(&m, &cfgs[k], 2, dev), PST_OK);
        ref_mlp_init_params(&m, 17);
        float *x = calloc((size_t)2 * cfgs[k].in_dim, sizeof(float));
        fill_uniform(x, (size_t)2 * cfgs[k].in_dim, -1, 1, 4);
        int32_t y[2] = {1, 0};
        hook_log h = {.m = &m, .snap = calloc(m.nparams, sizeof(float))};
        for (size_t i = 0; i < m.nparams; i++)
            h.snap[i] = NAN;
        ref_mlp_forward(&m, x, y, 2);
        ref_mlp_backward(&m, x, y, 2, 0.5f, 0, on_ready, &h);

        cr_assert_eq(h.n, m.nlayers, "config %zu: %d reports for %d layers", k, h.n,
                     m.nlayers);
        size_t end = m.nparams;
        for (int i = 0; i < h.n; i++) {
            const ref_linear_view *v = &m.layer[m.nlayers - 1 - i];
            cr_expect_eq(h.off[i] + h.len[i], end,
                         "config %zu report %d [%zu, +%zu) does not end where the previous "
                         "began (%zu)", k, i, h.off[i], h.len[i], end);
            cr_expect_eq(h.off[i], v->w_off, "config %zu report %d is not layer %d", k, i,
                         m.nlayers - 1 - i);
            cr_expect_eq(h.len[i], (size_t)v->out * v->in + v->out);
            end = h.off[i];
        }
        cr_expect_eq(end, 0, "config %zu: reports stop at %zu, not at the start", k, end);
        /* Each reported range already held its final gradient. */
        cr_expect_eq(memcmp(h.snap, m.grads, m.nparams * sizeof(float)), 0,
                     "config %zu: a range changed after it was reported ready", k);
        free(h.snap);
        free(x);
        ref_mlp_free(&m);
    }
}

/* ---- predictions -------------------------------------------------------------------- */

Test(mlp, count_correct)
{
    /* No hidden layer, identity weight and zero bias: logits = x, so argmax is known. */
    ref_mlp_config c = {.in_dim = 3, .out_dim = 3, .nhidden = 0};
    ref_mlp m;
    cr_assert_eq(ref_mlp_init(&m, &c, 5, dev), PST_OK);
    for (int i = 0; i < 3; i++)
        m.params[m.layer[0].w_off + i * 3 + i] = 1.0f;
    const float x[5 * 3] = {
        0.1f, 0.9f, 0.0f,  /* argmax 1 */
        5.0f, -1.0f, 4.9f, /* argmax 0 */
        -3.0f, -2.0f, -1.0f, /* argmax 2 */
        2.0f, 2.0f, 1.0f,  /* tie: the first index (0) */
        0.0f, 0.0f, 7.0f,  /* argmax 2 */
    };
    const int32_t all_right[5] = {1, 0, 2, 0, 2};
    const int32_t some_right[5] = {1, 2, 2, 1, 0}; /* rows 0 and 2 */
    const int32_t none_right[5] = {0, 1, 0, 1, 1};
    ref_mlp_forward(&m, x, all_right, 5);
    cr_expect_eq(ref_mlp_count_correct(&m, all_right, 5), 5);
    cr_expect_eq(ref_mlp_count_correct(&m, some_right, 5), 2);
    cr_expect_eq(ref_mlp_count_correct(&m, none_right, 5), 0);
    cr_expect_eq(ref_mlp_count_correct(&m, all_right, 3), 3, "only the first B rows count");
    /* A smaller batch forward: only its rows are looked at. */
    ref_mlp_forward(&m, x + 3, all_right + 1, 1);
    cr_expect_eq(ref_mlp_count_correct(&m, all_right + 1, 1), 1);
    cr_expect_eq(ref_mlp_count_correct(&m, none_right + 1, 1), 0);
    ref_mlp_free(&m);
}

/* ---- the model interface ---- */

TestSuite(model, .init = setup, .fini = teardown);

Test(model, mlp_tensor_table_and_layers)
{
    pst_model m;
    const int hidden[2] = {5, 4};
    cr_assert_eq(pst_model_mlp(&m, 6, 3, 2, hidden), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(m.ntensors, 6);
    cr_assert_eq(m.nlayers, 4, "3 linear layers and the loss");
    const char *names[6] = {"l0.weight", "l0.bias", "l1.weight", "l1.bias", "l2.weight", "l2.bias"};
    const size_t numel[6] = {30, 5, 20, 4, 12, 3};
    size_t off = 0;
    for (int t = 0; t < 6; t++) {
        cr_assert_str_eq(m.tensors[t].name, names[t]);
        cr_assert_eq(m.tensors[t].offset, off, "%s is not right after the one before", names[t]);
        cr_assert_eq(m.tensors[t].numel, numel[t]);
        cr_assert_eq(pst_model_find_tensor(&m, names[t]), t);
        off += numel[t];
    }
    cr_assert_eq(m.nparams, off);
    cr_assert_eq(pst_model_find_tensor(&m, "l3.weight"), -1);
    cr_assert_eq(m.layers[0].flags, PST_LINEAR_RELU, "layer 0: ReLU out, raw input");
    cr_assert_eq(m.layers[1].flags, PST_LINEAR_RELU | PST_LINEAR_MASK_INPUT);
    cr_assert_eq(m.layers[2].flags, PST_LINEAR_MASK_INPUT, "the logits have no ReLU");
    cr_assert_eq(m.layers[3].cls, &pst_layer_softmax_xent);
    cr_assert_eq(m.layers[2].split_rows, 3);
    /* the same count as the reference */
    ref_mlp_config rc = {.in_dim = 6, .out_dim = 3, .nhidden = 2, .hidden = {5, 4}};
    cr_assert_eq(ref_mlp_param_count(&rc), m.nparams);
    pst_model_free(&m);
    cr_assert_eq(m.nlayers, 0, "free zeroes the model");
}

Test(model, synthetic_model)
{
    pst_model m;
    cr_assert_eq(pst_model_synthetic(&m, 1000, 2), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(m.nparams, 1000);
    cr_assert_eq(m.nlayers, 1);
    cr_assert_eq(m.in_width, 0, "reads no data");
    const float *g = m.data;
    cr_assert_eq(g[7], (float)(((size_t)7 * 2654435761u + 977u * 2u) % 1000u) * 1e-6f);
    float p[1000];
    p[3] = 1.0f;
    m.init_params(&m, p, 5);
    cr_assert_eq(p[3], 0.0f, "starts at zero");
    pst_model_free(&m);
}

/* The synthetic model's layer writes its fixed gradient once per gradient buffer, and
 * again whenever the executor says it wrote there (grads_gen) or gives no count. A value
 * changed behind the layer's back stays while the count stands: the test can see a skip. */
static float fixed_grad_after(const pst_model *m, void *inst, pst_layer_io *io, float *grads,
                              int rebind)
{
    if (rebind)
        m->layers[0].cls->bind(inst, m, 0, io);
    pst_stream *s;
    cr_assert_eq(pst_stream_create(dev, &s), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(m->layers[0].cls->wgrad(inst, NULL, s, 1, 0, 0), PST_OK, "%s",
                 pst_error_detail());
    cr_assert_eq(pst_stream_synchronize(s), PST_OK, "%s", pst_error_detail());
    pst_stream_destroy(s);
    const float v = grads[5];
    grads[5] = 42.0f; /* someone else's write, not counted */
    return v;
}

Test(model, synthetic_gradient_written_again_only_after_another_writer)
{
    pst_model m;
    cr_assert_eq(pst_model_synthetic(&m, 64, 1), PST_OK, "%s", pst_error_detail());
    const float want = ((const float *)m.data)[5];
    float grads[64], other[64], losses[1];
    uint64_t gen = 0;
    void *inst = calloc(1, m.layers[0].cls->inst_bytes);
    pst_layer_io io = {.losses = losses, .grads_gen = &gen};
    pst_layer_io_point(&io, &m, 0, NULL, grads);
    cr_assert_eq(fixed_grad_after(&m, inst, &io, grads, 1), want, "the first step writes");
    cr_assert_eq(fixed_grad_after(&m, inst, &io, grads, 0), 42.0f, "kept: not written again");
    cr_assert_eq(fixed_grad_after(&m, inst, &io, grads, 1), 42.0f, "a rebind keeps what it knows");
    gen++; /* the executor zeroed the gradients */
    cr_assert_eq(fixed_grad_after(&m, inst, &io, grads, 0), want, "written after the count moved");
    cr_assert_eq(fixed_grad_after(&m, inst, &io, grads, 0), 42.0f);
    pst_layer_io_point(&io, &m, 0, NULL, other);
    cr_assert_eq(fixed_grad_after(&m, inst, &io, other, 1), want, "another buffer is written");
    io.grads_gen = NULL; /* a reduce writes the buffer every step */
    cr_assert_eq(fixed_grad_after(&m, inst, &io, other, 1), want, "no count: every step");
    cr_assert_eq(fixed_grad_after(&m, inst, &io, other, 0), want);
    io.accumulate = 1;
    cr_assert_eq(fixed_grad_after(&m, inst, &io, other, 1), 42.0f,
                 "later micro-batches add nothing");
    free(inst);
    pst_model_free(&m);
}

Test(model, malformed_models_are_clear_errors)
{
    pst_model m = {.name = "bad", .in_width = 4, .target_width = 1};
    const int64_t w[2] = {3, 4}, b[1] = {3}, zero[1] = {0};
    cr_assert_eq(pst_model_add_tensor(&m, "w", 2, w), PST_OK);
    cr_assert_eq(pst_model_add_tensor(&m, "b", 1, b), PST_OK);
    cr_assert_eq(pst_model_add_tensor(&m, "z", 1, zero), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "tensor z"), "%s", pst_error_detail());
    pst_layer bad_index = {.cls = &pst_layer_linear, .tensor = {0, 7}, .ntensors = 2};
    cr_assert_eq(pst_model_add_layer(&m, &bad_index), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "tensor 7"), "%s", pst_error_detail());
    cr_assert_eq(pst_model_check(&m), PST_ERR_INVALID, "no layers");
    /* a linear layer reading 5 floats after a 4-wide input */
    pst_layer lin = {.cls = &pst_layer_linear, .tensor = {0, 1}, .ntensors = 2, .in_width = 5,
                     .out_width = 3, .split_rows = 3, .split_tile = 1};
    cr_assert_eq(pst_model_add_layer(&m, &lin), PST_OK);
    cr_assert_eq(pst_model_check(&m), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "layer 0 (linear) reads 5"), "%s", pst_error_detail());
    m.layers[0].in_width = 4;
    m.layers[0].split_rows = 2; /* w has 3 rows */
    cr_assert_eq(pst_model_check(&m), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "splits 2 rows"), "%s", pst_error_detail());
    m.layers[0].split_rows = 3;
    m.layers[0].ntensors = 1; /* b unused: its gradient would never be final */
    cr_assert_eq(pst_model_check(&m), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "tensor b"), "%s", pst_error_detail());
    m.layers[0].ntensors = 2;
    m.target_width = 0;
    cr_assert_eq(pst_model_check(&m), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "0 labels per row"), "%s", pst_error_detail());
    m.target_width = 1;
    cr_assert_eq(pst_model_check(&m), PST_OK, "%s", pst_error_detail());
    pst_model_free(&m);
    const int hidden[1] = {0};
    cr_assert_eq(pst_model_mlp(&m, 6, 3, 1, hidden), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "hidden layer 0 has width 0"), "%s", pst_error_detail());
    pst_config cfg;
    pst_config_defaults(&cfg);
    snprintf(cfg.model, sizeof cfg.model, "gpt9");
    cr_assert_eq(pst_model_from_config(&m, &cfg, 6, 3), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "--model gpt9"), "%s", pst_error_detail());
}

/* The interface's MLP, its layers run in order on one CPU stream (what the executor does on
 * one device without a thread team), against the reference MLP: the same initial values,
 * per-row losses and gradient, bit for bit. */
Test(model, layers_on_a_stream_equal_the_reference)
{
    enum { B = 7, IN = 13, C = 5 };
    const int hidden[2] = {300, 9}; /* 300 rows: two weight-gradient tiles */
    pst_model m;
    cr_assert_eq(pst_model_mlp(&m, IN, C, 2, hidden), PST_OK);
    ref_mlp r;
    ref_mlp_config rc = {.in_dim = IN, .out_dim = C, .nhidden = 2, .hidden = {300, 9}};
    cr_assert_eq(ref_mlp_init(&r, &rc, B, dev), PST_OK);
    ref_mlp_init_params(&r, 11);
    float *params = malloc(sizeof(float) * m.nparams), *grads = calloc(m.nparams, sizeof(float));
    m.init_params(&m, params, 11);
    cr_assert_eq(memcmp(params, r.params, sizeof(float) * m.nparams), 0, "initial values");

    float x[B * IN], losses[B], *acts[4] = {0}, *dbuf[2];
    int32_t y[B], correct = 0;
    pst_rng g;
    pst_rng_seed(&g, 5, 0);
    for (int i = 0; i < B * IN; i++)
        x[i] = 2.0f * pst_rng_uniform(&g) - 1.0f;
    for (int i = 0; i < B; i++)
        y[i] = i % C;
    for (int l = 0; l < m.nlayers; l++)
        acts[l] = m.layers[l].out_width ? calloc((size_t)B * m.layers[l].out_width, sizeof(float))
                                        : NULL;
    dbuf[0] = calloc(B * 300, sizeof(float));
    dbuf[1] = calloc(B * 300, sizeof(float));
    void *inst[4], *chunk[4];
    for (int l = 0; l < m.nlayers; l++) {
        inst[l] = calloc(1, m.layers[l].cls->inst_bytes);
        chunk[l] = calloc(1, m.layers[l].cls->chunk_bytes + 1);
        const int L = m.nlayers;
        pst_layer_io io = {.in = l ? acts[l - 1] : x,
                           .out = acts[l], .dout = l + 1 < L ? dbuf[(L - 2 - l) & 1] : NULL,
                           .din = l ? dbuf[(L - 1 - l) & 1] : NULL, .targets = y,
                           .losses = losses, .correct = &correct};
        pst_layer_io_point(&io, &m, l, params, grads);
        m.layers[l].cls->bind(inst[l], &m, l, &io);
    }
    pst_stream *s;
    cr_assert_eq(pst_stream_create(dev, &s), PST_OK);
    for (int l = 0; l < m.nlayers; l++)
        cr_assert_eq(m.layers[l].cls->forward(inst[l], s, B, 1.0f / B), PST_OK);
    for (int l = m.nlayers - 1; l >= 0; l--) {
        const pst_layer_class *c = m.layers[l].cls;
        if (c->wgrad)
            cr_assert_eq(c->wgrad(inst[l], chunk[l], s, B, 0, m.layers[l].split_rows), PST_OK);
        if (c->igrad)
            cr_assert_eq(c->igrad(inst[l], s, B), PST_OK);
    }
    cr_assert_eq(pst_stream_synchronize(s), PST_OK, "%s", pst_error_detail());
    pst_stream_destroy(s);

    double ref_loss = ref_mlp_forward(&r, x, y, B), loss = 0.0;
    ref_mlp_backward(&r, x, y, B, 1.0f / B, 0, NULL, NULL);
    for (int i = 0; i < B; i++)
        loss += losses[i];
    cr_assert_float_eq(loss, ref_loss, 1e-5 * fabs(ref_loss), "loss %.9g vs %.9g", loss, ref_loss);
    cr_assert_eq(correct, ref_mlp_count_correct(&r, y, B));
    for (size_t i = 0; i < m.nparams; i++)
        cr_assert_eq(memcmp(&grads[i], &r.grads[i], sizeof(float)), 0,
                     "gradient %zu: %.9g vs the reference's %.9g", i, grads[i], r.grads[i]);
    for (int l = 0; l < m.nlayers; l++) {
        free(inst[l]);
        free(chunk[l]);
        free(acts[l]);
    }
    free(dbuf[0]);
    free(dbuf[1]);
    free(params);
    free(grads);
    ref_mlp_free(&r);
    pst_model_free(&m);
}
