/* test_dlrm.c — the `dlrm` click model (common/nn/models/dlrm.c) on the model interface,
 * its layers bound by hand and run on a CPU stream: the loss and every gradient (each
 * parameter, and each value of the rows' sparse embeddings: what the trainer pushes to
 * its tables) against central differences of a float64 DLRM written out here; the tensor
 * table of the peer's architecture; bad shapes refused. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/nn/ctr_layers.h"
#include "common/nn/model.h"
#include "common/nn/models/models.h"
#include "common/rng.h"
#include "common/runtime/device.h"
#include "trainer/exec.h"
#include "trainer/local.h"

enum { B = 6, D = 3, F = 4, DIM = 2, NB = 1, NT = 2 };
static const int bottom_w[NB] = {5}, top_w[NT] = {6, 4};

/* One linear layer in double: out (B, O) = in (B, I) W^T + b, ReLU when relu. */
static void lin(double *out, const double *in, const double *p, int I, int O, int relu)
{
    const double *w = p, *b = p + I * O;
    for (int r = 0; r < B; r++)
        for (int o = 0; o < O; o++) {
            double s = b[o];
            for (int i = 0; i < I; i++)
                s += in[r * I + i] * w[o * I + i];
            out[r * O + o] = relu && s < 0.0 ? 0.0 : s;
        }
}

/* The loss sum(bce(logit, y)) * scale in float64, parameters in the model's layout. */
static double reference(const double *p, const double *x, const double *emb, const int32_t *y,
                        double scale)
{
    double h0[B * 5], bot[B * DIM], z[B * 32], t0[B * 6], t1[B * 4], logit[B];
    size_t o = 0;
    lin(h0, x, p + o, D, 5, 1);
    o += 5 * D + 5;
    lin(bot, h0, p + o, 5, DIM, 1);
    o += DIM * 5 + DIM;
    const int W = pst_interact_width(F, DIM);
    for (int r = 0; r < B; r++) {
        const double *v[F + 1];
        v[0] = bot + r * DIM;
        for (int f = 1; f <= F; f++)
            v[f] = emb + r * F * DIM + (f - 1) * DIM;
        int c = 0;
        for (int k = 0; k < DIM; k++)
            z[r * W + c++] = v[0][k];
        for (int i = 1; i <= F; i++)
            for (int j = 0; j < i; j++) {
                double d = 0.0;
                for (int k = 0; k < DIM; k++)
                    d += v[i][k] * v[j][k];
                z[r * W + c++] = d;
            }
    }
    lin(t0, z, p + o, W, 6, 1);
    o += 6 * W + 6;
    lin(t1, t0, p + o, 6, 4, 1);
    o += 4 * 6 + 4;
    lin(logit, t1, p + o, 4, 1, 0);
    double loss = 0.0;
    for (int r = 0; r < B; r++)
        loss += fmax(logit[r], 0.0) - logit[r] * y[r] + log1p(exp(-fabs(logit[r])));
    return loss * scale;
}

/* d reference / d *v (a parameter or an embedding value) by central differences, step
 * 1e-5. */
static double central_difference(double *p, const double *x, double *emb, const int32_t *y,
                                 double scale, double *v)
{
    const double h = 1e-5, keep = *v;
    *v = keep + h;
    const double up = reference(p, x, emb, y, scale);
    *v = keep - h;
    const double down = reference(p, x, emb, y, scale);
    *v = keep;
    return (up - down) / (2 * h);
}

/* A batch from seed: x and emb normal (emb times 0.5), label 1 for every `every`-th row. */
static void make_batch(uint64_t seed, int every, float *x, float *emb, int32_t *y)
{
    pst_rng g;
    pst_rng_seed(&g, seed, 0);
    for (int i = 0; i < B * D; i++)
        x[i] = pst_rng_normal(&g);
    for (int i = 0; i < B * F * DIM; i++)
        emb[i] = 0.5f * pst_rng_normal(&g);
    for (int i = 0; i < B; i++)
        y[i] = i % every == 0;
}

/* The model's layers bound by hand over one batch (x, emb, y) and run forward then backward
 * on a cpu:1 stream with loss scale 1/B: the per-row losses, the parameters' gradients
 * (grads, zeroed first) and the embeddings' (demb). */
static void run_by_hand(const pst_model *m, const float *params, float *grads, const float *x,
                        const float *emb, const int32_t *y, float *losses, float *demb)
{
    pst_runtime *rt;
    cr_assert_eq(pst_runtime_init(&rt, "cpu:1"), PST_OK);
    memset(grads, 0, sizeof(float) * m->nparams);
    float *acts[8] = {0}, *dbuf[2] = {calloc(B * 64, sizeof(float)), calloc(B * 64, sizeof(float))};
    void *inst[8], *chunk[8];
    int32_t correct = 0;
    const int L = m->nlayers;
    for (int l = 0; l < L; l++) {
        acts[l] = m->layers[l].out_width ? calloc((size_t)B * m->layers[l].out_width, 4) : NULL;
        inst[l] = calloc(1, m->layers[l].cls->inst_bytes);
        chunk[l] = calloc(1, m->layers[l].cls->chunk_bytes + 1);
        pst_layer_io io = {.in = l ? acts[l - 1] : x, .out = acts[l],
                           .dout = l + 1 < L ? dbuf[(L - 2 - l) & 1] : NULL,
                           .din = l ? dbuf[(L - 1 - l) & 1] : NULL, .targets = y,
                           .losses = losses, .correct = &correct, .sparse = emb,
                           .dsparse = demb};
        pst_layer_io_point(&io, m, l, params, grads);
        m->layers[l].cls->bind(inst[l], m, l, &io);
    }
    pst_stream *s;
    cr_assert_eq(pst_stream_create(pst_runtime_device(rt, 0), &s), PST_OK);
    for (int l = 0; l < L; l++)
        cr_assert_eq(m->layers[l].cls->forward(inst[l], s, B, 1.0f / B), PST_OK, "%s",
                     pst_error_detail());
    for (int l = L - 1; l >= 0; l--) {
        const pst_layer_class *c = m->layers[l].cls;
        if (c->wgrad)
            cr_assert_eq(c->wgrad(inst[l], chunk[l], s, B, 0, m->layers[l].split_rows), PST_OK);
        if (c->igrad)
            cr_assert_eq(c->igrad(inst[l], s, B), PST_OK);
    }
    cr_assert_eq(pst_stream_synchronize(s), PST_OK, "%s", pst_error_detail());
    pst_stream_destroy(s);
    for (int l = 0; l < L; l++) {
        free(inst[l]);
        free(chunk[l]);
        free(acts[l]);
    }
    free(dbuf[0]);
    free(dbuf[1]);
    pst_runtime_free(rt);
}

Test(dlrm, loss_and_every_gradient_against_central_differences)
{
    pst_model m;
    cr_assert_eq(pst_model_dlrm(&m, D, F, DIM, NB, bottom_w, NT, top_w), PST_OK, "%s",
                 pst_error_detail());
    cr_assert_eq(m.nlayers, 7); /* 2 bottom, interaction, 3 top, the loss */
    cr_assert(m.sparse_fields == F && m.sparse_dim == DIM && m.in_width == D);
    const int W = pst_interact_width(F, DIM);
    cr_assert_eq(m.nparams, (size_t)(5 * D + 5 + DIM * 5 + DIM + 6 * W + 6 + 4 * 6 + 4 + 4 + 1));
    float *params = malloc(sizeof(float) * m.nparams), *grads = calloc(m.nparams, sizeof(float));
    m.init_params(&m, params, 3);
    float x[B * D], emb[B * F * DIM], demb[B * F * DIM], losses[B];
    int32_t y[B];
    make_batch(8, 3, x, emb, y);
    run_by_hand(&m, params, grads, x, emb, y, losses, demb);
    const float scale = 1.0f / B;

    double *p = malloc(sizeof(double) * m.nparams), xd[B * D], ed[B * F * DIM];
    for (size_t i = 0; i < m.nparams; i++)
        p[i] = params[i];
    for (int i = 0; i < B * D; i++)
        xd[i] = x[i];
    for (int i = 0; i < B * F * DIM; i++)
        ed[i] = emb[i];
    double loss = 0.0;
    for (int i = 0; i < B; i++)
        loss += losses[i];
    const double want = reference(p, xd, ed, y, 1.0);
    cr_assert_leq(fabs(loss - want), 1e-5 * want, "loss %.9g, float64 %.9g", loss, want);
    for (size_t i = 0; i < m.nparams; i++) {
        const double fd = central_difference(p, xd, ed, y, scale, &p[i]);
        cr_assert_leq(fabs(grads[i] - fd), 1e-4 * (1 + fabs(fd)), "parameter %zu: %g, central "
                      "difference %g", i, (double)grads[i], fd);
    }
    for (int i = 0; i < B * F * DIM; i++) {
        const double fd = central_difference(p, xd, ed, y, scale, &ed[i]);
        cr_assert_leq(fabs(demb[i] - fd), 1e-4 * (1 + fabs(fd)), "embedding value %d: %g, "
                      "central difference %g", i, (double)demb[i], fd);
    }
    free(p);
    free(params);
    free(grads);
    pst_model_free(&m);
}

/* The peer's architecture (torch_dlrm.py: 13 dense, 26 fields of 16, bottom 64, top 128 and
 * 64): 367 inputs to the top MLP, the tensors of its nn.Linear layers. */
Test(dlrm, the_peers_shape_and_bad_shapes)
{
    pst_model m;
    const int bottom[1] = {64}, top[2] = {128, 64};
    cr_assert_eq(pst_model_dlrm(&m, 13, 26, 16, 1, bottom, 2, top), PST_OK);
    cr_assert_eq(m.layers[2].out_width, 16 + 27 * 26 / 2);
    const int t0 = pst_model_find_tensor(&m, "t0.weight");
    cr_assert(t0 >= 0 && m.tensors[t0].shape[0] == 128 && m.tensors[t0].shape[1] == 367);
    cr_assert_eq(m.nparams, (size_t)(64 * 13 + 64 + 16 * 64 + 16 + 128 * 367 + 128 + 64 * 128 +
                                     64 + 64 + 1));
    pst_model_free(&m);
    cr_assert_eq(pst_model_dlrm(&m, 0, 26, 16, 1, bottom, 2, top), PST_ERR_INVALID);
    const int zero[1] = {0};
    cr_assert_eq(pst_model_dlrm(&m, 13, 26, 16, 1, zero, 2, top), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "bottom layer 0 has width 0"), "%s", pst_error_detail());
    cr_assert_null(m.layers);
}

/* One executor step of the model (cpu:1, cpu:2, and cpu:1 in two micro-batches) over the
 * same rows: the embeddings' gradient the executor hands back for the push equals the one
 * the layers give when run by hand (the first test's way), row by row; the devices' split
 * and the micro-batches only change which rows go together (within 1e-6). */
static void executor_dsparse(const char *devices, int acc, const float *x, const float *emb,
                             const int32_t *y, float *dsparse, float *loss)
{
    pst_config cfg;
    pst_config_defaults(&cfg);
    cfg.acc_steps = acc;
    cfg.optim.kind = PST_OPTIM_SGD;
    cfg.optim.lr = 0.1f;
    pst_runtime *rt = NULL;
    cr_assert_eq(pst_runtime_init(&rt, devices), PST_OK, "%s", pst_error_detail());
    pst_model m;
    cr_assert_eq(pst_model_dlrm(&m, D, F, DIM, NB, bottom_w, NT, top_w), PST_OK);
    tr_plan plan = {0};
    const tr_exec_settings es = tr_exec_settings_of(&cfg);
    cr_assert_eq(tr_exec_plan(&plan, &m, &es, cfg.block_bytes, 1, pst_runtime_count(rt)),
                 PST_OK, "%s", pst_error_detail());
    tr_link *link;
    const tr_link_settings ls = tr_link_settings_of(&cfg, &plan);
    cr_assert_eq(tr_local_init(&link, &ls, &plan), PST_OK, "%s", pst_error_detail());
    tr_exec_config ec = {.cfg = es, .rt = rt, .model = &m, .max_rows = B, .eval_rows = B,
                         .link = link, .overlap = 1, .threads = 1};
    tr_exec *ex = NULL;
    cr_assert_eq(tr_exec_init(&ex, &ec), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(tr_exec_start(ex, 3), PST_OK, "%s", pst_error_detail());
    double l = 0.0;
    cr_assert_eq(tr_exec_step(ex, 0, x, y, B, B, &l), PST_ERR_INVALID, "a step without rows");
    cr_assert_eq(tr_exec_sync(ex), PST_OK);
    tr_exec_free(ex);
    cr_assert_eq(tr_exec_init(&ex, &ec), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(tr_exec_start(ex, 3), PST_OK, "%s", pst_error_detail());
    tr_exec_set_sparse(ex, emb, dsparse);
    cr_assert_eq(tr_exec_step(ex, 0, x, y, B, B, &l), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(tr_exec_sync(ex), PST_OK, "%s", pst_error_detail());
    *loss = (float)l;
    tr_exec_free(ex);
    tr_link_free(link);
    tr_plan_free(&plan);
    pst_model_free(&m);
    pst_runtime_free(rt);
}

Test(dlrm, the_executor_hands_back_the_embeddings_gradient)
{
    pst_model m;
    cr_assert_eq(pst_model_dlrm(&m, D, F, DIM, NB, bottom_w, NT, top_w), PST_OK);
    float *params = malloc(sizeof(float) * m.nparams), *grads = calloc(m.nparams, sizeof(float));
    m.init_params(&m, params, 3); /* what tr_exec_start(ex, 3) starts from */
    float x[B * D], emb[B * F * DIM], want[B * F * DIM], losses[B];
    int32_t y[B];
    make_batch(9, 2, x, emb, y);
    run_by_hand(&m, params, grads, x, emb, y, losses, want);
    float hand_loss = 0.0f;
    for (int i = 0; i < B; i++)
        hand_loss += losses[i];
    const struct {
        const char *devices;
        int acc;
        int exact;
    } runs[] = {{"cpu:1", 1, 1}, {"cpu:2", 1, 0}, {"cpu:1", 2, 0}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        float got[B * F * DIM], loss = 0.0f;
        memset(got, 0xff, sizeof got);
        executor_dsparse(runs[r].devices, runs[r].acc, x, emb, y, got, &loss);
        for (int i = 0; i < B * F * DIM; i++)
            if (runs[r].exact)
                cr_assert_eq(memcmp(&got[i], &want[i], 4), 0, "%s: value %d is %a, by hand %a",
                             runs[r].devices, i, (double)got[i], (double)want[i]);
            else
                cr_assert_leq(fabsf(got[i] - want[i]), 1e-6f * (1 + fabsf(want[i])),
                              "%s acc %d: value %d is %g, by hand %g", runs[r].devices,
                              runs[r].acc, i, (double)got[i], (double)want[i]);
        cr_assert_leq(fabsf(loss - hand_loss), 1e-5f * hand_loss, "loss %g vs %g", (double)loss,
                      (double)hand_loss);
    }
    free(params);
    free(grads);
    pst_model_free(&m);
}
