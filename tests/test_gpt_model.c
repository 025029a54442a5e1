/* test_gpt_model.c — the `gpt` model of the model interface (common/nn/models/gpt.c) and
 * its layer classes (embedding, transformer_block, lm_head) against the tests' reference
 * GPT (tests/ref_gpt.c, itself checked against PyTorch in test_gpt_ref.c):
 *   - its tensor table is llm.c's flat layout (the reference's offsets), the token table is
 *     named by the first and the last layer, and only the first adds to its gradient;
 *   - run layer by layer on a CPU stream with the PyTorch reference's parameters and batch,
 *     one thread: the same losses and gradients as the reference, bit for bit; on a
 *     two-thread team: within float rounding (the linear ops split GEMMs by columns);
 *   - initial values as torch_gpt.py's init; bad shapes are one clear error. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/nn/models/models.h"
#include "common/nn/seq_layers.h"
#include "common/runtime/device.h"
#include "common/pool.h"
#include "ref_gpt.h"

static pst_runtime *rt;
static pst_device *dev;

static void setup(void)
{
    cr_assert_eq(pst_runtime_init(&rt, "cpu:1"), PST_OK, "%s", pst_error_detail());
    dev = pst_runtime_device(rt, 0);
}

static void teardown(void)
{
    pst_runtime_free(rt);
}

TestSuite(gpt_model, .init = setup, .fini = teardown);

/* The PyTorch reference file's parameters and first batch (tests/data/gpt_ref.bin). */
typedef struct ref_file {
    ref_gpt_dims d;
    int B;
    float *params;
    int32_t *inputs, *targets;
    float loss;
} ref_file;

static void load_ref(ref_file *f, size_t nparams_expected)
{
    FILE *fp = fopen(PST_SOURCE_DIR "/tests/data/gpt_ref.bin", "rb");
    cr_assert(fp);
    int32_t h[16];
    cr_assert_eq(fread(h, sizeof h, 1, fp), 1);
    f->d = (ref_gpt_dims){.V = h[2], .T = h[3], .L = h[4], .H = h[5], .C = h[6]};
    f->B = h[7];
    const size_t N = (size_t)f->B * f->d.T;
    f->params = malloc(nparams_expected * sizeof(float));
    f->inputs = malloc(N * sizeof(int32_t));
    f->targets = malloc(N * sizeof(int32_t));
    cr_assert_eq(fread(f->params, sizeof(float), nparams_expected, fp), nparams_expected);
    cr_assert_eq(fread(f->inputs, sizeof(int32_t), N, fp), N);
    cr_assert_eq(fread(f->targets, sizeof(int32_t), N, fp), N);
    cr_assert_eq(fseek(fp, (long)(N * f->d.V * sizeof(float)), SEEK_CUR), 0);
    cr_assert_eq(fread(&f->loss, sizeof(float), 1, fp), 1);
    fclose(fp);
}

Test(gpt_model, tensor_table_is_the_llm_c_layout_with_a_tied_embedding)
{
    const ref_gpt_dims d = {.V = 73, .T = 16, .L = 3, .H = 2, .C = 32};
    pst_model m;
    cr_assert_eq(pst_model_gpt(&m, d.V, d.T, d.L, d.H, d.C), PST_OK, "%s", pst_error_detail());
    ref_gpt r;
    cr_assert_eq(ref_gpt_init(&r, d, 1), 0);
    cr_assert_eq(m.nparams, r.nparams);
    cr_assert_eq(m.nlayers, d.L + 2);
    cr_assert_eq(m.in_tokens, 1);
    cr_assert_eq(m.target_width, d.T);
    /* each stacked kind's layer-0 tensor starts where the reference's kind starts */
    for (int k = 0; k < REF_GPT_NTENSORS; k++) {
        char name[32];
        if (k < 2 || k >= 14)
            snprintf(name, sizeof name, "%s", ref_gpt_tensor_names[k]);
        else
            snprintf(name, sizeof name, "h0.%s", ref_gpt_tensor_names[k]);
        const int t = pst_model_find_tensor(&m, name);
        cr_assert(t >= 0, "no tensor %s", name);
        cr_assert_eq(m.tensors[t].offset, r.off[k], "%s at %zu, llm.c's layout has %zu", name,
                     m.tensors[t].offset, r.off[k]);
    }
    const int wte = pst_model_find_tensor(&m, "wte");
    const pst_layer *first = &m.layers[0], *last = &m.layers[m.nlayers - 1];
    cr_assert_eq(first->tensor[0], wte);
    cr_assert_eq(last->tensor[2], wte, "the output projection reads the token table");
    cr_assert_eq(first->grad_accumulate, 1u, "the embedding adds to wte's gradient only");
    cr_assert_eq(last->grad_accumulate, 0u, "the head's backward runs first: it overwrites");
    for (int l = 1; l <= d.L; l++)
        cr_assert_eq(m.layers[l].grad_accumulate, 0u);
    ref_gpt_free(&r);
    pst_model_free(&m);
}

Test(gpt_model, bad_shapes_are_clear_errors)
{
    pst_model m;
    cr_assert_eq(pst_model_gpt(&m, 73, 16, 2, 3, 32), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "multiple of heads"), "%s", pst_error_detail());
    cr_assert_eq(m.nparams, 0);
    cr_assert_eq(pst_model_gpt(&m, 1, 16, 2, 2, 32), PST_ERR_INVALID);
    cr_assert_eq(pst_model_gpt(&m, 73, 0, 2, 2, 32), PST_ERR_INVALID);
}

Test(gpt_model, init_follows_the_pytorch_peer)
{
    pst_model m;
    cr_assert_eq(pst_model_gpt(&m, 73, 64, 4, 4, 128), PST_OK);
    float *p = malloc(m.nparams * sizeof(float)), *q = malloc(m.nparams * sizeof(float));
    m.init_params(&m, p, 3);
    m.init_params(&m, q, 3);
    cr_assert_eq(memcmp(p, q, m.nparams * sizeof(float)), 0, "same seed, same values");
    for (int t = 0; t < m.ntensors; t++) {
        const pst_tensor *x = &m.tensors[t];
        double s = 0, s2 = 0;
        for (size_t i = 0; i < x->numel; i++) {
            s += p[x->offset + i];
            s2 += (double)p[x->offset + i] * p[x->offset + i];
        }
        const double mean = s / x->numel, sd = sqrt(s2 / x->numel - mean * mean);
        const char *kind = strchr(x->name, '.') ? strchr(x->name, '.') + 1 : x->name;
        if (!strcmp(kind, "ln1w") || !strcmp(kind, "ln2w") || !strcmp(kind, "lnfw"))
            cr_assert(mean == 1.0 && sd == 0.0, "%s: LayerNorm weights start at 1", x->name);
        else if (x->ndim == 1)
            cr_assert(mean == 0.0 && sd == 0.0, "%s: biases start at 0", x->name);
        else {
            const double want = !strcmp(kind, "attprojw") || !strcmp(kind, "fcprojw")
                                    ? 0.02 / sqrt(8.0)
                                    : 0.02;
            cr_assert(fabs(sd - want) < 0.1 * want && fabs(mean) < 0.1 * want,
                      "%s: mean %.3g sd %.3g, want N(0, %.3g)", x->name, mean, sd, want);
        }
    }
    free(p);
    free(q);
    pst_model_free(&m);
}

/* Runs the model's layers once (forward, then backward last layer first) on a CPU stream
 * over B sequences, as the executor does, with `threads` threads; returns the loss sum. */
static double run_layers(const pst_model *m, const float *params, float *grads,
                         const int32_t *tokens, const int32_t *targets, int B, int threads)
{
    const int L = m->nlayers;
    pst_pool *pool = NULL;
    if (threads > 1)
        cr_assert_eq(pst_pool_init(&pool, threads), PST_OK);
    float **acts = calloc((size_t)L, sizeof *acts), **save = calloc((size_t)L, sizeof *save);
    float **work = calloc((size_t)L, sizeof *work), **scr = calloc((size_t)L, sizeof *scr);
    void **inst = calloc((size_t)L, sizeof *inst);
    int widest = 1;
    for (int l = 0; l < L; l++)
        widest = m->layers[l].in_width > widest ? m->layers[l].in_width : widest;
    float *dbuf[2] = {calloc((size_t)B * widest, sizeof(float)),
                      calloc((size_t)B * widest, sizeof(float))};
    float *losses = calloc((size_t)B, sizeof(float));
    int32_t correct = 0;
    for (int l = 0; l < L; l++) {
        const pst_layer *ly = &m->layers[l];
        acts[l] = ly->out_width ? calloc((size_t)B * ly->out_width, sizeof(float)) : NULL;
        save[l] = ly->save_width ? calloc((size_t)B * ly->save_width, sizeof(float)) : NULL;
        work[l] = ly->work_width ? calloc((size_t)B * ly->work_width, sizeof(float)) : NULL;
        scr[l] = ly->scratch_per_thread
                     ? calloc((size_t)threads * ly->scratch_per_thread, sizeof(float))
                     : NULL;
        inst[l] = calloc(1, ly->cls->inst_bytes);
        pst_layer_io io = {.pool = pool,
                           .in = l ? acts[l - 1] : NULL, .tokens = l ? NULL : tokens,
                           .out = acts[l], .dout = l + 1 < L ? dbuf[(L - 2 - l) & 1] : NULL,
                           .din = l ? dbuf[(L - 1 - l) & 1] : NULL, .targets = targets,
                           .losses = losses, .correct = &correct, .save = save[l],
                           .work = work[l], .scratch = scr[l], .max_batch = B};
        pst_layer_io_point(&io, m, l, params, grads);
        ly->cls->bind(inst[l], m, l, &io);
    }
    pst_stream *s;
    cr_assert_eq(pst_stream_create(dev, &s), PST_OK);
    for (int l = 0; l < L; l++)
        cr_assert_eq(m->layers[l].cls->forward(inst[l], s, B, 1.0f / (float)B), PST_OK, "%s",
                     pst_error_detail());
    for (int l = L - 1; l >= 0; l--) {
        const pst_layer_class *c = m->layers[l].cls;
        if (c->wgrad)
            cr_assert_eq(c->wgrad(inst[l], NULL, s, B, 0, 0), PST_OK, "%s", pst_error_detail());
        if (c->igrad)
            cr_assert_eq(c->igrad(inst[l], s, B), PST_OK, "%s", pst_error_detail());
    }
    cr_assert_eq(pst_stream_synchronize(s), PST_OK, "%s", pst_error_detail());
    pst_stream_destroy(s);
    double loss = 0;
    for (int b = 0; b < B; b++)
        loss += losses[b];
    for (int l = 0; l < L; l++) {
        free(acts[l]);
        free(save[l]);
        free(work[l]);
        free(scr[l]);
        free(inst[l]);
    }
    free(acts);
    free(save);
    free(work);
    free(scr);
    free(inst);
    free(dbuf[0]);
    free(dbuf[1]);
    free(losses);
    pst_pool_free(pool);
    return loss;
}

Test(gpt_model, layers_on_a_stream_equal_the_reference_gpt)
{
    pst_model m;
    cr_assert_eq(pst_model_gpt(&m, 73, 16, 2, 2, 32), PST_OK);
    ref_file f;
    load_ref(&f, m.nparams);
    cr_assert_eq(f.d.V, 73);
    const int B = f.B;
    ref_gpt r;
    cr_assert_eq(ref_gpt_init(&r, f.d, B), 0);
    float *want = calloc(m.nparams, sizeof(float)), *grads = malloc(m.nparams * sizeof(float));
    const double ref_loss = ref_gpt_forward(&r, f.params, f.inputs, f.targets, B, NULL);
    ref_gpt_backward(&r, f.params, want, f.inputs, f.targets, B);

    memset(grads, 0xff, m.nparams * sizeof(float)); /* NaN: every gradient is written */
    const double loss = run_layers(&m, f.params, grads, f.inputs, f.targets, B, 1) / B;
    cr_assert(fabs(loss - ref_loss) <= 1e-6 * ref_loss, "loss %.9g, reference %.9g", loss,
              ref_loss);
    cr_assert(fabs(loss - f.loss) <= 1e-6 * f.loss, "loss %.9g, PyTorch %.9g", loss,
              (double)f.loss);
    for (size_t i = 0; i < m.nparams; i++)
        cr_assert_eq(memcmp(&grads[i], &want[i], sizeof(float)), 0,
                     "gradient %zu: %.9g, the reference's %.9g", i, grads[i], want[i]);

    /* Two threads: the linear ops split their GEMMs by columns (other bits, ops_cpu.c). */
    memset(grads, 0xff, m.nparams * sizeof(float));
    const double loss2 = run_layers(&m, f.params, grads, f.inputs, f.targets, B, 2) / B;
    cr_assert(fabs(loss2 - ref_loss) <= 1e-6 * ref_loss);
    for (int t = 0; t < m.ntensors; t++) {
        const pst_tensor *x = &m.tensors[t];
        double scale = 0, diff = 0;
        for (size_t i = x->offset; i < x->offset + x->numel; i++) {
            scale = fmax(scale, fabs(want[i]));
            diff = fmax(diff, fabs(grads[i] - want[i]));
        }
        cr_assert(diff <= 1e-5 * scale, "%s: two threads differ by %.3g (largest %.3g)",
                  x->name, diff, scale);
    }
    free(want);
    free(grads);
    free(f.params);
    free(f.inputs);
    free(f.targets);
    ref_gpt_free(&r);
    pst_model_free(&m);
}

/* A block keeps its attention's probabilities for the backward, or recomputes them where
 * they would take more memory than its MLP (pst_attention_keeps_probs): each shape equals
 * the reference GPT, which follows the same rule, bit for bit. The two paths' gradients
 * differ in the last bits, so a block and a reference that took different paths would not
 * agree. */
Test(gpt_model, kept_and_recomputed_attention_equal_the_reference_gpt)
{
    const ref_gpt_dims shapes[2] = {{.V = 73, .T = 16, .L = 2, .H = 2, .C = 32},
                                    {.V = 73, .T = 16, .L = 2, .H = 4, .C = 8}};
    cr_assert(pst_attention_keeps_probs(16, 32, 2));
    cr_assert(!pst_attention_keeps_probs(16, 8, 4));
    enum { B = 3 };
    for (int k = 0; k < 2; k++) {
        const ref_gpt_dims d = shapes[k];
        pst_model m;
        cr_assert_eq(pst_model_gpt(&m, d.V, d.T, d.L, d.H, d.C), PST_OK);
        float *params = malloc(m.nparams * sizeof(float));
        float *grads = malloc(m.nparams * sizeof(float)), *want = calloc(m.nparams, sizeof(float));
        m.init_params(&m, params, 7);
        int32_t tokens[B * 16], targets[B * 16];
        for (int i = 0; i < B * d.T; i++) {
            tokens[i] = (i * 37 + 11) % d.V;
            targets[i] = (i * 53 + 5) % d.V;
        }
        ref_gpt r;
        cr_assert_eq(ref_gpt_init(&r, d, B), 0);
        ref_gpt_forward(&r, params, tokens, targets, B, NULL);
        ref_gpt_backward(&r, params, want, tokens, targets, B);
        memset(grads, 0xff, m.nparams * sizeof(float));
        run_layers(&m, params, grads, tokens, targets, B, 1);
        for (size_t i = 0; i < m.nparams; i++)
            cr_assert_eq(memcmp(&grads[i], &want[i], sizeof(float)), 0,
                         "%d heads x %d channels: gradient %zu: %.9g, the reference's %.9g", d.H,
                         d.C, i, grads[i], want[i]);
        free(params), free(grads), free(want);
        ref_gpt_free(&r);
        pst_model_free(&m);
    }
}
