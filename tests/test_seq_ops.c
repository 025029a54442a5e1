/* test_seq_ops.c — the sequence ops of ops.h (embedding, LayerNorm, attention, GELU, and
 * the cross-entropy's per-group losses) on every backend against seq_layers.h's kernels
 * called directly (whose own float64 checks are in test_seq_layers.c). On CPU, with and
 * without a two-thread team, every result equals the kernel's bit for bit (the splits are by
 * rows, columns or heads); on CUDA (when built and a GPU is present; `make test-gpu`) within
 * tolerances: the same float operations, but CUDA's expf/tanhf/sqrt and the attention's
 * recomputed scores round differently. Also: NULL and mismatched arguments are
 * PST_ERR_INVALID. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/nn/layers.h"
#include "common/nn/ops.h"
#include "common/nn/seq_layers.h"
#include "common/nn/ctr_layers.h"
#include "common/rng.h"
#include "common/runtime/device.h"
#include "common/pool.h"

typedef struct backend {
    const char *spec;
    pst_runtime *rt;
    pst_device *dev;
    pst_stream *s;
    pst_pool *pool; /* CPU: NULL or a two-thread team */
    int exact;
} backend;

enum { MAXB = 3 };

/* cpu:1 alone, cpu:1 with a team, cuda:0 when built and present */
static int open_backends(backend *b)
{
    int n = 0;
    for (int k = 0; k < 2; k++) {
        b[n] = (backend){.spec = k ? "cpu:1 (2 threads)" : "cpu:1", .exact = 1};
        cr_assert_eq(pst_runtime_init(&b[n].rt, "cpu:1"), PST_OK);
        if (k)
            cr_assert_eq(pst_pool_init(&b[n].pool, 2), PST_OK);
        n++;
    }
#ifdef PSTRAIN_HAVE_CUDA
    b[n] = (backend){.spec = "cuda:0"};
    if (pst_runtime_init(&b[n].rt, "cuda:0") == PST_OK)
        n++;
    else
        fprintf(stderr, "[SKIP] test_seq_ops: CUDA parity skipped: no GPU\n");
#endif
    for (int i = 0; i < n; i++) {
        b[i].dev = pst_runtime_device(b[i].rt, 0);
        cr_assert_eq(pst_stream_create(b[i].dev, &b[i].s), PST_OK);
    }
    return n;
}

static void close_backends(backend *b, int n)
{
    for (int i = 0; i < n; i++) {
        pst_stream_destroy(b[i].s);
        pst_pool_free(b[i].pool);
        pst_runtime_free(b[i].rt);
    }
}

static void *put(backend *b, const void *host, size_t bytes)
{
    void *p;
    cr_assert_eq(pst_device_alloc(b->dev, bytes ? bytes : 1, &p), PST_OK);
    if (host)
        cr_assert_eq(pst_memcpy_async(b->s, p, host, bytes, PST_COPY_HOST_TO_DEVICE), PST_OK);
    else
        cr_assert_eq(pst_memset_async(b->s, p, 0, bytes), PST_OK);
    return p;
}

static void get(backend *b, void *host, const void *dev, size_t bytes)
{
    cr_assert_eq(pst_memcpy_async(b->s, host, dev, bytes, PST_COPY_DEVICE_TO_HOST), PST_OK);
    cr_assert_eq(pst_stream_synchronize(b->s), PST_OK, "%s", pst_error_detail());
}

static float *randn(size_t n, uint64_t seed, float scale)
{
    float *p = malloc(n * sizeof(float));
    pst_rng r;
    pst_rng_seed(&r, seed, 3);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * pst_rng_normal(&r);
    return p;
}

static void compare(const char *what, const backend *b, const float *got, const float *want,
                    size_t n, float tol)
{
    for (size_t i = 0; i < n; i++) {
        if (b->exact)
            cr_assert_eq(memcmp(&got[i], &want[i], 4), 0, "%s on %s: element %zu is %a, the "
                         "kernel's %a", what, b->spec, i, (double)got[i], (double)want[i]);
        else
            cr_assert(fabsf(got[i] - want[i]) <= tol * (1.0f + fabsf(want[i])),
                      "%s on %s: element %zu is %.9g, the kernel's %.9g", what, b->spec, i,
                      (double)got[i], (double)want[i]);
    }
}

enum { B = 3, T = 9, C = 24, H = 3, V = 11, N = B * T };

Test(seq_ops, embedding)
{
    backend be[MAXB];
    const int nb = open_backends(be);
    float *wte = randn(V * C, 1, 1), *wpe = randn(T * C, 2, 1), *dout = randn(N * C, 3, 1);
    int32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (i * 7) % V;
    static float want[N * C], wdte[V * C], wdpe[T * C], got[N * C], gte[V * C], gpe[T * C];
    pst_embedding_forward(want, tok, wte, wpe, B, T, C, 0, C);
    for (int i = 0; i < V * C; i++)
        wdte[i] = 0.5f; /* accumulated onto (the tied table's second writer) */
    pst_embedding_backward(wdte, NULL, dout, tok, B, T, C, V, 1, 0, C);
    pst_embedding_backward(NULL, wdpe, dout, tok, B, T, C, V, 0, 0, C);
    for (int i = 0; i < nb; i++) {
        backend *b = &be[i];
        float *d_wte = put(b, wte, sizeof(float) * V * C), *d_wpe = put(b, wpe, sizeof(float) * T * C);
        float *d_out = put(b, NULL, sizeof(float) * N * C), *d_dout = put(b, dout, sizeof(float) * N * C);
        float half[V * C];
        for (int k = 0; k < V * C; k++)
            half[k] = 0.5f;
        float *d_dte = put(b, half, sizeof half), *d_dpe = put(b, NULL, sizeof(float) * T * C);
        int32_t *d_tok = put(b, tok, sizeof tok);
        pst_embedding_fwd_args f = {.out = d_out, .tokens = d_tok, .wte = d_wte, .wpe = d_wpe,
                                    .B = B, .T = T, .C = C, .pool = b->pool};
        cr_assert_eq(pst_op_embedding_forward(b->s, &f), PST_OK, "%s", pst_error_detail());
        pst_embedding_bwd_args g = {.dwte = d_dte, .dwpe = d_dpe, .dout = d_dout, .tokens = d_tok,
                                    .B = B, .T = T, .C = C, .V = V, .wte_accumulate = 1,
                                    .pool = b->pool};
        cr_assert_eq(pst_op_embedding_backward(b->s, &g), PST_OK, "%s", pst_error_detail());
        get(b, got, d_out, sizeof got);
        get(b, gte, d_dte, sizeof gte);
        get(b, gpe, d_dpe, sizeof gpe);
        compare("embedding out", b, got, want, N * C, 1e-6f);
        compare("embedding dwte", b, gte, wdte, V * C, 1e-6f);
        compare("embedding dwpe", b, gpe, wdpe, T * C, 1e-6f);
        void *bufs[] = {d_wte, d_wpe, d_out, d_dout, d_dte, d_dpe, d_tok};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
            pst_device_free(b->dev, bufs[k]);
    }
    free(wte);
    free(wpe);
    free(dout);
    close_backends(be, nb);
}

Test(seq_ops, layernorm)
{
    backend be[MAXB];
    const int nb = open_backends(be);
    float *x = randn(N * C, 4, 2), *w = randn(C, 5, 1), *bb = randn(C, 6, 1);
    float *dout = randn(N * C, 7, 1);
    /* the residual stream's gradient, added to: a value per element, so a row or column
     * read from the wrong place shows */
    float *res = randn(N * C, 8, 1);
    static float out[N * C], mean[N], rstd[N], dx[N * C], dw[C], db[C];
    pst_layernorm_forward(out, mean, rstd, x, w, bb, N, C, 0, N);
    memcpy(dx, res, sizeof dx);
    pst_layernorm_backward_input(dx, dout, x, w, mean, rstd, N, C, dx, 0, N);
    pst_layernorm_backward_params(dw, db, dout, x, mean, rstd, N, C, 0, 0, C);
    for (int i = 0; i < nb; i++) {
        backend *b = &be[i];
        float *d_x = put(b, x, sizeof(float) * N * C), *d_w = put(b, w, sizeof(float) * C);
        float *d_b = put(b, bb, sizeof(float) * C), *d_out = put(b, NULL, sizeof(float) * N * C);
        float *d_m = put(b, NULL, sizeof(float) * N), *d_r = put(b, NULL, sizeof(float) * N);
        float *d_dout = put(b, dout, sizeof(float) * N * C), *d_dx = put(b, res, sizeof dx);
        float *d_dw = put(b, NULL, sizeof(float) * C), *d_db = put(b, NULL, sizeof(float) * C);
        pst_layernorm_args f = {.out = d_out, .mean = d_m, .rstd = d_r, .inp = d_x, .w = d_w,
                                .b = d_b, .N = N, .C = C, .pool = b->pool};
        cr_assert_eq(pst_op_layernorm_forward(b->s, &f), PST_OK, "%s", pst_error_detail());
        pst_layernorm_args g = {.dinp = d_dx, .dw = d_dw, .db = d_db, .dout = d_dout, .inp = d_x,
                                .w = d_w, .saved_mean = d_m, .saved_rstd = d_r, .N = N, .C = C,
                                .res = d_dx, .pool = b->pool};
        cr_assert_eq(pst_op_layernorm_backward(b->s, &g), PST_OK, "%s", pst_error_detail());
        /* the residual's gradient from another buffer: dinp = res + the input gradient, the
         * bits of adding to it in place (the transformer block's two residual sums) */
        float *d_res = put(b, res, sizeof dx), *d_dx2 = put(b, NULL, sizeof dx);
        pst_layernorm_args g2 = {.dinp = d_dx2, .dout = d_dout, .inp = d_x, .w = d_w,
                                 .saved_mean = d_m, .saved_rstd = d_r, .res = d_res, .N = N,
                                 .C = C, .pool = b->pool};
        cr_assert_eq(pst_op_layernorm_backward(b->s, &g2), PST_OK, "%s", pst_error_detail());
        static float go[N * C], gdx[N * C], gw[C], gb[C], gm[N], gr[N];
        get(b, go, d_out, sizeof go);
        get(b, gm, d_m, sizeof gm);
        get(b, gr, d_r, sizeof gr);
        get(b, gdx, d_dx, sizeof gdx);
        static float gdx2[N * C];
        get(b, gdx2, d_dx2, sizeof gdx2);
        cr_assert_eq(memcmp(gdx2, gdx, sizeof gdx), 0,
                     "%s: res + the input gradient differs from adding it in place", b->spec);
        get(b, gw, d_dw, sizeof gw);
        get(b, gb, d_db, sizeof gb);
        compare("layernorm out", b, go, out, N * C, 1e-5f);
        compare("layernorm mean", b, gm, mean, N, 1e-5f);
        compare("layernorm rstd", b, gr, rstd, N, 1e-5f);
        compare("layernorm dinp", b, gdx, dx, N * C, 1e-4f);
        compare("layernorm dw", b, gw, dw, C, 1e-4f);
        compare("layernorm db", b, gb, db, C, 1e-5f);
        void *bufs[] = {d_x, d_w, d_b, d_out, d_m, d_r, d_dout, d_dx, d_dw, d_db, d_res, d_dx2};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
            pst_device_free(b->dev, bufs[k]);
    }
    free(x);
    free(w);
    free(bb);
    free(dout);
    free(res);
    close_backends(be, nb);
}

/* One attention shape: forward and backward on every backend against the CPU kernel, and a
 * second backward (over the first's result) that must give the same bits. */
static void attention_case(int b_, int t_, int c_, int h_)
{
    const size_t n = (size_t)b_ * t_, nl = (size_t)b_ * h_ * t_;
    const size_t sq = sizeof(float) * n * 3 * c_, so = sizeof(float) * n * c_;
    const size_t sl = sizeof(float) * nl, ss = sizeof(float) * PST_ATTENTION_SCRATCH(t_);
    backend be[MAXB];
    const int nb = open_backends(be);
    float *qkv = randn(n * 3 * c_, 8, 1.5f), *dout = randn(n * c_, 9, 1);
    float *out = malloc(so), *lse = malloc(sl), *dqkv = malloc(sq), *scr = malloc(ss);
    float *go = malloc(so), *gl = malloc(sl), *gd = malloc(sq), *gd2 = malloc(sq);
    pst_attention_forward(out, lse, NULL, qkv, b_, t_, c_, h_, scr, 0, b_ * h_);
    pst_attention_backward(dqkv, dout, qkv, lse, NULL, b_, t_, c_, h_, scr, 0, b_ * h_);
    for (int i = 0; i < nb; i++) {
        backend *b = &be[i];
        float *d_qkv = put(b, qkv, sq), *d_dout = put(b, dout, so);
        float *d_out = put(b, NULL, so), *d_lse = put(b, NULL, sl);
        float *d_dqkv = put(b, NULL, sq), *d_scr = put(b, NULL, ss * 2);
        pst_attention_args f = {.out = d_out, .lse = d_lse, .qkv = d_qkv, .B = b_, .T = t_,
                                .C = c_, .H = h_, .scratch = d_scr, .pool = b->pool};
        cr_assert_eq(pst_op_attention_forward(b->s, &f), PST_OK, "%s", pst_error_detail());
        pst_attention_args g = {.dqkv = d_dqkv, .dout = d_dout, .qkv = d_qkv,
                                .saved_lse = d_lse, .B = b_, .T = t_, .C = c_, .H = h_,
                                .scratch = d_scr, .pool = b->pool};
        cr_assert_eq(pst_op_attention_backward(b->s, &g), PST_OK, "%s", pst_error_detail());
        get(b, go, d_out, so);
        get(b, gl, d_lse, sl);
        get(b, gd, d_dqkv, sq);
        compare("attention out", b, go, out, n * c_, 1e-5f);
        compare("attention lse", b, gl, lse, nl, 1e-5f);
        compare("attention dqkv", b, gd, dqkv, n * 3 * c_, 1e-4f);
        cr_assert_eq(pst_op_attention_backward(b->s, &g), PST_OK, "%s", pst_error_detail());
        get(b, gd2, d_dqkv, sq);
        cr_assert(memcmp(gd, gd2, sq) == 0, "%s: attention dqkv differs between runs (head "
                  "size %d)", b->spec, c_ / h_);
        void *bufs[] = {d_qkv, d_dout, d_out, d_lse, d_dqkv, d_scr};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
            pst_device_free(b->dev, bufs[k]);
    }
    void *host[] = {qkv, dout, out, lse, dqkv, scr, go, gl, gd, gd2};
    for (size_t k = 0; k < sizeof host / sizeof host[0]; k++)
        free(host[k]);
    close_backends(be, nb);
}

/* head sizes 8, 48 and 68: the CUDA kernels hold a head in 32 or 64 registers, or (over
 * 64) read it in memory */
Test(seq_ops, attention)
{
    attention_case(B, T, C, H);
    attention_case(2, 7, 96, 2);
    attention_case(2, 5, 136, 2);
}

Test(seq_ops, gelu_and_grouped_cross_entropy)
{
    backend be[MAXB];
    const int nb = open_backends(be);
    enum { NG = 1000 };
    float *x = randn(NG, 10, 2), *dout = randn(NG, 11, 1);
    static float y[NG], dx[NG];
    pst_gelu_forward(y, x, NG);
    pst_gelu_backward(dx, x, dout, NG);
    /* cross-entropy over V classes at N positions, losses averaged over groups of T */
    float *logits = randn(N * V, 12, 2);
    int32_t tgt[N];
    for (int i = 0; i < N; i++)
        tgt[i] = (i * 5 + 2) % V;
    static float probs[N * V], glosses[B];
    for (int g = 0; g < B; g++) {
        double s = 0;
        for (int t = 0; t < T; t++)
            s += pst_softmax_xent_forward(probs + (g * T + t) * V, logits + (g * T + t) * V,
                                          tgt + g * T + t, 1, V);
        glosses[g] = (float)(s / T);
    }
    for (int i = 0; i < nb; i++) {
        backend *b = &be[i];
        float *d_x = put(b, x, sizeof(float) * NG), *d_y = put(b, NULL, sizeof y);
        float *d_dout = put(b, dout, sizeof(float) * NG);
        pst_gelu_args f = {.out = d_y, .inp = d_x, .n = NG, .pool = b->pool};
        cr_assert_eq(pst_op_gelu_forward(b->s, &f), PST_OK, "%s", pst_error_detail());
        static float gy[NG], gdx[NG];
        get(b, gy, d_y, sizeof gy);
        pst_gelu_args g = {.out = d_dout, .inp = d_x, .dout = d_dout, .n = NG, .pool = b->pool};
        cr_assert_eq(pst_op_gelu_backward(b->s, &g), PST_OK, "%s", pst_error_detail());
        get(b, gdx, d_dout, sizeof gdx);
        compare("gelu", b, gy, y, NG, 1e-6f);
        compare("gelu backward (in place)", b, gdx, dx, NG, 1e-5f);
        /* the forward keeping gelu' in place of its input, the backward from it: the same
         * outputs, bit for bit, as the two ops without it on the same backend */
        float *d_keep = put(b, x, sizeof(float) * NG), *d_y2 = put(b, NULL, sizeof y);
        float *d_dout2 = put(b, dout, sizeof(float) * NG);
        pst_gelu_args fk = {.out = d_y2, .inp = d_keep, .deriv = d_keep, .n = NG,
                            .pool = b->pool};
        cr_assert_eq(pst_op_gelu_forward(b->s, &fk), PST_OK, "%s", pst_error_detail());
        pst_gelu_args gk = {.out = d_dout2, .deriv = d_keep, .dout = d_dout2, .n = NG,
                            .pool = b->pool};
        cr_assert_eq(pst_op_gelu_backward(b->s, &gk), PST_OK, "%s", pst_error_detail());
        static float gy2[NG], gdx2[NG];
        get(b, gy2, d_y2, sizeof gy2);
        get(b, gdx2, d_dout2, sizeof gdx2);
        cr_assert_eq(memcmp(gy2, gy, sizeof gy), 0, "%s: gelu with deriv: other bits", b->spec);
        cr_assert_eq(memcmp(gdx2, gdx, sizeof gdx), 0, "%s: gelu backward from the kept deriv: "
                     "other bits", b->spec);
        /* with a bias added to each row of 40 first: the bits of the bias added by the
         * linear op (no GEMM: an identity weight) and then GELU, on the same backend */
        enum { GW = 40 };
        static float eye[GW * GW], gb[GW];
        for (int r = 0; r < GW; r++) {
            gb[r] = 0.25f * (float)(r % 7) - 0.75f;
            for (int c = 0; c < GW; c++)
                eye[r * GW + c] = r == c ? 1.0f : 0.0f;
        }
        float *d_eye = put(b, eye, sizeof eye), *d_gb = put(b, gb, sizeof gb);
        float *d_xb = put(b, NULL, sizeof(float) * NG), *d_y3 = put(b, NULL, sizeof y);
        float *d_k3 = put(b, x, sizeof(float) * NG), *d_y4 = put(b, NULL, sizeof y);
        pst_linear_fwd_args lb = {.out = d_xb, .inp = d_x, .w = d_eye, .b = d_gb, .B = NG / GW,
                                  .IC = GW, .OC = GW, .pool = b->pool};
        cr_assert_eq(pst_op_linear_forward(b->s, &lb), PST_OK, "%s", pst_error_detail());
        pst_gelu_args fb = {.out = d_y3, .inp = d_xb, .deriv = d_xb, .n = NG, .pool = b->pool};
        cr_assert_eq(pst_op_gelu_forward(b->s, &fb), PST_OK, "%s", pst_error_detail());
        pst_gelu_args fb2 = {.out = d_y4, .inp = d_k3, .deriv = d_k3, .bias = d_gb, .width = GW,
                             .n = NG, .pool = b->pool};
        cr_assert_eq(pst_op_gelu_forward(b->s, &fb2), PST_OK, "%s", pst_error_detail());
        static float gy3[NG], gy4[NG], gk3[NG], gk4[NG];
        get(b, gy3, d_y3, sizeof gy3);
        get(b, gk3, d_xb, sizeof gk3);
        get(b, gy4, d_y4, sizeof gy4);
        get(b, gk4, d_k3, sizeof gk4);
        cr_assert_eq(memcmp(gy4, gy3, sizeof gy3), 0, "%s: gelu with bias: other bits", b->spec);
        cr_assert_eq(memcmp(gk4, gk3, sizeof gk3), 0, "%s: gelu' with bias: other bits", b->spec);
        pst_gelu_args bad = fb2;
        bad.width = 3; /* not a divisor of NG */
        cr_assert_neq(pst_op_gelu_forward(b->s, &bad), PST_OK);
        /* the backward from the kept deriv with the bias gradient: the bits of the backward
         * and then the linear op's own bias gradient, on the same backend */
        static float gdb[GW], gdb2[GW], gdx5[NG];
        float *d_dout5 = put(b, dout, sizeof(float) * NG), *d_db = put(b, NULL, sizeof gdb);
        float *d_in5 = put(b, x, sizeof(float) * NG), *d_dw = put(b, NULL, sizeof eye);
        pst_linear_bwd_args lbw = {.dw = d_dw, .db = d_db, .dout = d_dout2, .inp = d_in5,
                                   .w = d_eye, .B = NG / GW, .IC = GW, .OC = GW,
                                   .pool = b->pool};
        cr_assert_eq(pst_op_linear_backward(b->s, &lbw), PST_OK, "%s", pst_error_detail());
        get(b, gdb, d_db, sizeof gdb);
        float *d_db2 = put(b, NULL, sizeof gdb2);
        pst_gelu_args gb5 = {.out = d_dout5, .deriv = d_keep, .dout = d_dout5, .dbias = d_db2,
                             .width = GW, .n = NG, .pool = b->pool};
        cr_assert_eq(pst_op_gelu_backward(b->s, &gb5), PST_OK, "%s", pst_error_detail());
        get(b, gdx5, d_dout5, sizeof gdx5);
        get(b, gdb2, d_db2, sizeof gdb2);
        cr_assert_eq(memcmp(gdx5, gdx2, sizeof gdx2), 0, "%s: gelu backward with the bias "
                     "gradient: other bits", b->spec);
        cr_assert_eq(memcmp(gdb2, gdb, sizeof gdb), 0, "%s: the bias gradient: other bits",
                     b->spec);

        float *d_l = put(b, logits, sizeof(float) * N * V), *d_p = put(b, NULL, sizeof probs);
        float *d_loss = put(b, NULL, sizeof(float) * B);
        int32_t *d_t = put(b, tgt, sizeof tgt), *d_c = put(b, NULL, sizeof(int32_t));
        pst_xent_args xa = {.losses = d_loss, .correct = d_c, .dlogits = d_p, .logits = d_l,
                            .targets = d_t, .B = N, .C = V, .scale = 0.0f, .group = T};
        cr_assert_eq(pst_op_softmax_xent(b->s, &xa), PST_OK, "%s", pst_error_detail());
        float gl[B];
        get(b, gl, d_loss, sizeof gl);
        compare("grouped cross-entropy losses", b, gl, glosses, B, 1e-5f);
        xa.B = N - 1; /* not a whole number of groups */
        cr_assert_eq(pst_op_softmax_xent(b->s, &xa), PST_ERR_INVALID);
        void *bufs[] = {d_x, d_y, d_dout, d_l, d_p, d_loss, d_t, d_c};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
            pst_device_free(b->dev, bufs[k]);
    }
    free(x);
    free(dout);
    free(logits);
    close_backends(be, nb);
}

/* The click model's ops (ctr_layers.h): the interaction forward and backward with strided
 * embedding rows, and BCE with its probabilities, against the kernels. */
Test(seq_ops, click_model_interaction_and_bce)
{
    enum { CB = 7, CF = 5, CD = 4, CS = 3 + CF * CD, CW = CD + (CF + 1) * CF / 2 };
    backend be[MAXB];
    const int nb = open_backends(be);
    float *bot = randn(CB * CD, 21, 1), *emb = randn(CB * CS, 22, 1), *dout = randn(CB * CW, 23, 1);
    float *logits = randn(CB, 24, 3);
    int32_t lab[CB];
    for (int i = 0; i < CB; i++)
        lab[i] = i % 2;
    static float out[CB * CW], db[CB * CD], de[CB * CS], loss[CB], dl[CB], prob[CB];
    pst_interact_forward(out, bot, emb, CS, CF, CD, 0, CB);
    pst_interact_backward(db, de, CS, dout, bot, emb, CS, CF, CD, 0, CB);
    pst_bce_logits(loss, dl, logits, lab, 0.25f, 0, CB);
    pst_bce_logits(loss, prob, logits, lab, 0.0f, 0, CB);
    for (int i = 0; i < nb; i++) {
        backend *b = &be[i];
        float *d_bot = put(b, bot, sizeof(float) * CB * CD), *d_emb = put(b, emb, sizeof(float) * CB * CS);
        float *d_dout = put(b, dout, sizeof(float) * CB * CW), *d_out = put(b, NULL, sizeof out);
        float *d_db = put(b, NULL, sizeof db), *d_de = put(b, NULL, sizeof de);
        float *d_x = put(b, logits, sizeof(float) * CB);
        int32_t *d_y = put(b, lab, sizeof lab);
        float *d_loss = put(b, NULL, sizeof loss), *d_dl = put(b, NULL, sizeof dl);
        float *d_p = put(b, NULL, sizeof prob);
        pst_interact_args f = {.out = d_out, .bottom = d_bot, .emb = d_emb, .emb_stride = CS,
                               .B = CB, .F = CF, .dim = CD, .pool = b->pool};
        cr_assert_eq(pst_op_interact_forward(b->s, &f), PST_OK, "%s", pst_error_detail());
        pst_interact_args g = {.dbottom = d_db, .demb = d_de, .dout = d_dout, .bottom = d_bot,
                               .emb = d_emb, .emb_stride = CS, .demb_stride = CS, .B = CB,
                               .F = CF, .dim = CD, .pool = b->pool};
        cr_assert_eq(pst_op_interact_backward(b->s, &g), PST_OK, "%s", pst_error_detail());
        pst_bce_args c = {.losses = d_loss, .dlogits = d_dl, .logits = d_x, .labels = d_y,
                          .B = CB, .scale = 0.25f};
        cr_assert_eq(pst_op_bce_logits(b->s, &c), PST_OK, "%s", pst_error_detail());
        pst_bce_args e = c;
        e.dlogits = d_p;
        e.scale = 0.0f;
        cr_assert_eq(pst_op_bce_logits(b->s, &e), PST_OK, "%s", pst_error_detail());
        static float go[CB * CW], gdb[CB * CD], gde[CB * CS], gl[CB], gdl[CB], gp[CB];
        get(b, go, d_out, sizeof go);
        get(b, gdb, d_db, sizeof gdb);
        get(b, gde, d_de, sizeof gde);
        get(b, gl, d_loss, sizeof gl);
        get(b, gdl, d_dl, sizeof gdl);
        get(b, gp, d_p, sizeof gp);
        compare("interaction out", b, go, out, CB * CW, 1e-6f);
        compare("interaction dbottom", b, gdb, db, CB * CD, 1e-6f);
        for (int r = 0; r < CB; r++) /* the stride's last 3 columns are not written */
            compare("interaction demb", b, gde + r * CS, de + r * CS, CF * CD, 1e-6f);
        compare("bce loss", b, gl, loss, CB, 1e-6f);
        compare("bce dlogits", b, gdl, dl, CB, 1e-6f);
        compare("bce probabilities", b, gp, prob, CB, 1e-6f);
        void *bufs[] = {d_bot, d_emb, d_dout, d_out, d_db, d_de, d_x, d_y, d_loss, d_dl, d_p};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
            pst_device_free(b->dev, bufs[k]);
    }
    free(bot);
    free(emb);
    free(dout);
    free(logits);
    close_backends(be, nb);
}

Test(seq_ops, null_and_mismatched_arguments_are_invalid)
{
    pst_runtime *rt;
    cr_assert_eq(pst_runtime_init(&rt, "cpu:1"), PST_OK);
    pst_stream *s;
    cr_assert_eq(pst_stream_create(pst_runtime_device(rt, 0), &s), PST_OK);
    float f[64];
    int32_t tok[4] = {0};
    pst_embedding_fwd_args e = {.out = f, .tokens = tok, .wte = f, .wpe = f, .B = 1, .T = 2, .C = 2};
    cr_assert_eq(pst_op_embedding_forward(s, NULL), PST_ERR_INVALID);
    e.tokens = NULL;
    cr_assert_eq(pst_op_embedding_forward(s, &e), PST_ERR_INVALID);
    pst_attention_args a = {.out = f, .lse = f, .qkv = f, .scratch = f, .B = 1, .T = 2, .C = 6, .H = 4};
    cr_assert_eq(pst_op_attention_forward(s, &a), PST_ERR_INVALID, "C not a multiple of H");
    pst_layernorm_args l = {.dout = f, .inp = f, .w = f, .saved_mean = f, .saved_rstd = f,
                            .dw = f, .N = 1, .C = 2};
    cr_assert_eq(pst_op_layernorm_backward(s, &l), PST_ERR_INVALID, "dw without db");
    pst_gelu_args g = {.out = f, .inp = NULL, .n = 4};
    cr_assert_eq(pst_op_gelu_forward(s, &g), PST_ERR_INVALID);
    pst_interact_args ia = {.out = f, .bottom = f, .emb = f, .emb_stride = 5, .B = 1, .F = 2,
                            .dim = 3};
    cr_assert_eq(pst_op_interact_forward(s, &ia), PST_ERR_INVALID, "a stride under F dim");
    pst_bce_args bc = {.losses = f, .dlogits = f, .logits = f, .labels = NULL, .B = 1};
    cr_assert_eq(pst_op_bce_logits(s, &bc), PST_ERR_INVALID);
    pst_stream_destroy(s);
    pst_runtime_free(rt);
}
