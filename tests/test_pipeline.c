/* test_pipeline.c — the executor's pipeline mode (trainer/exec_pipe.c) in one process, on
 * the GPT and the King James Bible (scripts/deps.sh writes it):
 *   - every schedule, stage count, virtual stage count and micro-batch count gives the
 *     parameters of plain training with the same global batch within 1e-6 relative
 *     (param L2), and, for one M, the same bits as each other (each device adds its
 *     micro-batches in order; the reduce adds the devices in order); so do R = 2
 *     data-parallel replicas of a pipeline (cpu:P R), against plain training on cpu:2;
 *   - the tied token embedding's copies on the first and the last stage are equal bit
 *     for bit after every step (--cpu-replicas 1: a parameter copy per device);
 *   - exactly 2 (C - 1) M copies travel between stages per step, nothing else;
 *   - peak bytes per device are flat in M for 1F1B and interleaved, and grow for GPipe;
 *   - invalid combinations are refused with one line naming them. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/data/text.h"
#include "common/nn/models/models.h"
#include "common/runtime/device.h"
#include "trainer/exec.h"
#include "trainer/local.h"

enum { T = 16, LAYERS = 6 }; /* 8 model layers: embedding, 6 blocks, the head */

typedef struct run {
    int P, V, M, replicas, overlap;
    pst_schedule sched;
    int mb;              /* rows per micro-batch (0: global batch 16 split in M) */
    int steps;
    int devices;         /* CPU devices (0: P; a multiple of P: replicas of the pipeline) */
    int rows;            /* the global batch (0: mb M, or 16) */
    uint64_t jitter;     /* test hook: random delays in every stream, this seed (0: none) */
    const char *partition; /* --partition (NULL: balanced) */
    pst_dtype precision;
} run;

typedef struct result {
    float *params;
    size_t n;
    size_t peak[8];      /* per device */
    size_t grad_bytes[8], param_bytes[8]; /* per device: tr_exec_memory_of */
    size_t held_by[8];   /* per device: elements of the tensors its chunks' layers name */
    long messages;
    int tied_unequal_steps;
} result;

static pst_text text;

static void load(void)
{
    if (text.n == 0)
        cr_assert_eq(pst_text_load(&text, PST_KJV_PATH, T), PST_OK, "%s", pst_error_detail());
}

static void base_config(pst_config *cfg)
{
    pst_config_defaults(cfg);
    cfg->block_bytes = 8192;
    cfg->optim.kind = PST_OPTIM_ADAMW;
    cfg->optim.lr = 3e-3f;
    cfg->optim.beta2 = 0.99f;
    cfg->optim.weight_decay = 0.0f;
}

/* Trains r->steps AdamW steps of the 8-layer GPT with r's pipeline (P 1: plain, cpu:1)
 * and returns the final parameters and what the run measured. tr_exec_init's error, if
 * any, is returned with *res untouched. */
static pst_status train(const run *r, result *res)
{
    load();
    pst_config cfg;
    base_config(&cfg);
    cfg.pipeline = r->P;
    cfg.virtual_stages = r->V ? r->V : 1;
    cfg.micro_batches = r->P > 1 ? r->M : 1;
    cfg.acc_steps = r->P > 1 ? 1 : (r->M ? r->M : 1);
    cfg.schedule = r->sched;
    cfg.cpu_replicas = r->replicas;
    cfg.precision = r->precision;
    const tr_test_hooks hooks = {.crash_step = -1, .overflow_step = -1,
                                 .jitter_seed = r->jitter, .jitter_us = r->jitter ? 300 : 0};
    for (const char *q = r->partition; q && *q; q += *q == ',') {
        char *e;
        cfg.partition[cfg.npartition++] = (int)strtol(q, &e, 10);
        q = e;
    }
    const int B = r->rows ? r->rows : r->mb ? r->mb * r->M : 16;
    const int D = r->devices ? r->devices : r->P;
    char devices[16];
    snprintf(devices, sizeof devices, "cpu:%d", D);
    pst_runtime *rt = NULL;
    cr_assert_eq(pst_runtime_init(&rt, devices), PST_OK, "%s", pst_error_detail());
    pst_model model;
    cr_assert_eq(pst_model_gpt(&model, text.vocab, T, LAYERS, 2, 32), PST_OK);
    tr_plan plan = {0};
    const tr_exec_settings es = tr_exec_settings_of(&cfg);
    pst_status st = tr_exec_plan(&plan, &model, &es, cfg.block_bytes, 1, D);
    if (st != PST_OK) { /* the partition's errors */
        pst_model_free(&model);
        pst_runtime_free(rt);
        return st;
    }
    tr_link *link;
    const tr_link_settings ls = tr_link_settings_of(&cfg, &plan);
    cr_assert_eq(tr_local_init(&link, &ls, &plan), PST_OK);
    tr_exec_config ec = {.cfg = es,
                         .rt = rt, .model = &model, .max_rows = B,
                         .eval_rows = B, .link = link, .overlap = r->overlap, .threads = 1,
                         .hooks = &hooks};
    tr_exec *ex = NULL;
    st = tr_exec_init(&ex, &ec);
    if (st == PST_OK) {
        memset(res, 0, sizeof *res);
        cr_assert_eq(tr_exec_start(ex, 5), PST_OK, "%s", pst_error_detail());
        int32_t *x = malloc(sizeof(int32_t) * (size_t)B * T);
        int32_t *y = malloc(sizeof(int32_t) * (size_t)B * T);
        for (int s = 0; s < r->steps; s++) {
            pst_text_train_rows(&text, T, 5, s, B, 0, B, x, y);
            double loss;
            cr_assert_eq(tr_exec_step(ex, s, x, y, B, B, &loss), PST_OK, "%s",
                         pst_error_detail());
            cr_assert(isfinite(loss) && loss > 0);
            cr_assert_eq(tr_exec_sync(ex), PST_OK, "%s", pst_error_detail());
            int equal = 0;
            cr_assert_eq(tr_exec_tied_equal(ex, &equal), PST_OK, "%s", pst_error_detail());
            res->tied_unequal_steps += !equal;
        }
        free(x);
        free(y);
        res->n = tr_exec_nparams(ex);
        res->params = malloc(sizeof(float) * res->n);
        cr_assert_eq(tr_exec_params(ex, res->params), PST_OK);
        for (int i = 0; i < D && i < 8; i++) {
            const tr_exec_memory mem = tr_exec_memory_of(ex, i);
            res->peak[i] = mem.peak;
            res->grad_bytes[i] = mem.grads;
            res->param_bytes[i] = mem.params;
        }
        /* What each stage should hold, from the model and the partition alone. */
        const int C = r->P * (r->V ? r->V : 1);
        int first[65];
        first[0] = 0;
        for (int k = 0; k < C; k++) { /* the executor's chunks, from its partition */
            first[k + 1] = first[k];
            while (first[k + 1] < model.nlayers && tr_exec_chunk_of(ex, first[k + 1]) == k)
                first[k + 1]++;
        }
        for (int t = 0; t < model.ntensors; t++) {
            uint64_t mask = 0;
            for (int k = 0; k < C; k++)
                for (int l = first[k]; l < first[k + 1]; l++)
                    for (int i = 0; i < model.layers[l].ntensors; i++)
                        if (model.layers[l].tensor[i] == t)
                            mask |= (uint64_t)1 << (k % r->P);
            for (int d = 0; d < D && d < 8; d++) /* device d runs stage d % P */
                res->held_by[d] += (mask >> (d % r->P)) & 1u ? model.tensors[t].numel : 0;
        }
        res->messages = tr_exec_stage_messages(ex);
    }
    tr_exec_free(ex);
    tr_link_free(link);
    tr_plan_free(&plan);
    pst_model_free(&model);
    pst_runtime_free(rt);
    return st;
}

static double l2(const float *p, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)p[i] * p[i];
    return sqrt(s);
}

static const char *name(pst_schedule s)
{
    return pst_schedule_name(s);
}

/* P = 2 and 4, 1F1B and interleaved (V = 2), GPipe, M = 4 and 8: param L2 within 1e-6 of
 * plain training (one device, the same 16-row global batch in M micro-batches); for each
 * M, every pipelined run has the bits of the first. */
Test(pipeline, every_schedule_equals_plain_training, .timeout = 300)
{
    const int Ms[] = {4, 8};
    for (int mi = 0; mi < 2; mi++) {
        const int M = Ms[mi];
        result plain, first = {0};
        run pr = {.P = 1, .M = M, .steps = 10};
        cr_assert_eq(train(&pr, &plain), PST_OK, "%s", pst_error_detail());
        const double ref = l2(plain.params, plain.n);
        const run runs[] = {
            {.P = 2, .M = M, .sched = PST_SCHEDULE_1F1B, .steps = 10},
            {.P = 2, .M = M, .sched = PST_SCHEDULE_GPIPE, .steps = 10},
            {.P = 2, .V = 2, .M = M, .sched = PST_SCHEDULE_INTERLEAVED, .steps = 10},
            {.P = 4, .M = M, .sched = PST_SCHEDULE_1F1B, .steps = 10},
            {.P = 4, .V = 2, .M = M, .sched = PST_SCHEDULE_INTERLEAVED, .steps = 10},
            {.P = 4, .M = M, .sched = PST_SCHEDULE_1F1B, .steps = 10, .overlap = 1,
             .replicas = 1},
        };
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
            result res;
            cr_assert_eq(train(&runs[i], &res), PST_OK, "%s", pst_error_detail());
            const double v = l2(res.params, res.n);
            fprintf(stderr, "pipeline P %d V %d M %d %s: param_l2 %.9g, plain %.9g\n",
                    runs[i].P, runs[i].V, M, name(runs[i].sched), v, ref);
            cr_assert_leq(fabs(v - ref) / ref, 1e-6, "P %d V %d M %d %s: %.9g vs plain %.9g",
                          runs[i].P, runs[i].V, M, name(runs[i].sched), v, ref);
            if (!first.params) {
                first = res;
                continue;
            }
            cr_assert_eq(memcmp(first.params, res.params, res.n * sizeof(float)), 0,
                         "P %d V %d M %d %s: other bits than P 2 1f1b", runs[i].P, runs[i].V,
                         M, name(runs[i].sched));
            free(res.params);
        }
        free(first.params);
        free(plain.params);
    }
}

/* Issue 30 item 3: R = 2 data-parallel replicas of a pipeline (cpu:2P; replica r runs
 * stage s on device r P + s). Micro-batch m's rows are split over the replicas as
 * --acc-steps splits them over a trainer's devices, each stage's gradient is reduced over
 * its replica group in device order: param L2 within 1e-6 of plain training on cpu:2 with
 * --acc-steps M, and every layout (P 2 and 4, each schedule, unequal rows) the same bits. */
Test(pipeline, replicas_of_a_pipeline_equal_plain_training, .timeout = 300)
{
    const int rows[] = {16, 15};
    for (int q = 0; q < 2; q++) {
        const int M = 4;
        result plain, first = {0};
        const run pr = {.P = 1, .M = M, .devices = 2, .rows = rows[q], .steps = 10};
        cr_assert_eq(train(&pr, &plain), PST_OK, "%s", pst_error_detail());
        const double ref = l2(plain.params, plain.n);
        const run runs[] = {
            {.P = 2, .M = M, .devices = 4, .sched = PST_SCHEDULE_1F1B},
            {.P = 4, .M = M, .devices = 8, .sched = PST_SCHEDULE_1F1B},
            {.P = 2, .M = M, .devices = 4, .sched = PST_SCHEDULE_GPIPE},
            {.P = 2, .V = 2, .M = M, .devices = 4, .sched = PST_SCHEDULE_INTERLEAVED},
            {.P = 2, .M = M, .devices = 4, .sched = PST_SCHEDULE_1F1B, .overlap = 1,
             .replicas = 1},
        };
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
            run r = runs[i];
            r.rows = rows[q];
            r.steps = 10;
            result res;
            cr_assert_eq(train(&r, &res), PST_OK, "%s", pst_error_detail());
            const double v = l2(res.params, res.n);
            fprintf(stderr, "pipeline P %d V %d R 2 M %d %s, %d rows: param_l2 %.9g, plain "
                    "%.9g\n", r.P, r.V, M, name(r.sched), r.rows, v, ref);
            cr_assert_leq(fabs(v - ref) / ref, 1e-6, "P %d V %d R 2 %s: %.9g vs plain %.9g",
                          r.P, r.V, name(r.sched), v, ref);
            if (!first.params) {
                first = res;
                continue;
            }
            cr_assert_eq(memcmp(first.params, res.params, res.n * sizeof(float)), 0,
                         "P %d V %d R 2 %s, %d rows: other bits than P 2 1f1b", r.P, r.V,
                         name(r.sched), r.rows);
            free(res.params);
        }
        free(first.params);
        free(plain.params);
    }
}

/* Issue 30 item 4: bf16 and fp16 pipelines. Each stage keeps its blocks' parameters in the
 * precision's dtype (2 bytes an element) and its fp32 gradients (4), the layers compute
 * from fp32 values cast from them before each forward and backward, the store keeps the
 * fp32 master and casts once per update. Per precision and M every layout (P 2 and 4, 1F1B,
 * interleaved, GPipe) gives the same bits, the tied table's copies stay equal, and param L2
 * is within 1e-4 of training without a pipeline in that precision (the tied halves' other
 * order, rounded to 8 or 11 bits, can move a value by its last bit; 30-step runs of the
 * trainer differ by about 1e-3). */
Test(pipeline, bf16_and_fp16_pipelines, .timeout = 240)
{
    const pst_dtype dts[] = {PST_BF16, PST_F16};
    for (int q = 0; q < 2; q++) {
        result plain, first = {0};
        const run pr = {.P = 1, .M = 4, .steps = 10, .precision = dts[q]};
        cr_assert_eq(train(&pr, &plain), PST_OK, "%s", pst_error_detail());
        const double ref = l2(plain.params, plain.n);
        const run runs[] = {
            {.P = 2, .M = 4, .sched = PST_SCHEDULE_1F1B},
            {.P = 4, .M = 4, .sched = PST_SCHEDULE_1F1B},
            {.P = 2, .V = 2, .M = 4, .sched = PST_SCHEDULE_INTERLEAVED},
            {.P = 2, .M = 4, .sched = PST_SCHEDULE_GPIPE, .overlap = 1},
        };
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
            run r = runs[i];
            r.steps = 10;
            r.precision = dts[q];
            result res;
            cr_assert_eq(train(&r, &res), PST_OK, "%s", pst_error_detail());
            const double v = l2(res.params, res.n);
            const char *dn = pst_dtype_name(dts[q]);
            fprintf(stderr, "%s pipeline P %d V %d %s: param_l2 %.9g, plain %.9g\n", dn, r.P,
                    r.V, name(r.sched), v, ref);
            cr_assert(isfinite(v) && fabs(v - ref) / ref <= 1e-4, "%s P %d %s: %.9g vs %.9g",
                      dn, r.P, name(r.sched), v, ref);
            cr_assert_eq(res.tied_unequal_steps, 0, "%s P %d: tied copies differ", dn, r.P);
            for (int s = 0; s < r.P; s++) {
                cr_assert_eq(res.param_bytes[s], 2 * res.held_by[s], "%s P %d stage %d: %zu "
                             "parameter bytes for %zu elements", dn, r.P, s, res.param_bytes[s],
                             res.held_by[s]);
                cr_assert_eq(res.grad_bytes[s], 4 * res.held_by[s]);
            }
            if (!first.params) {
                first = res;
                continue;
            }
            cr_assert_eq(memcmp(first.params, res.params, res.n * sizeof(float)), 0,
                         "%s P %d V %d %s: other bits than P 2 1f1b", dn, r.P, r.V,
                         name(r.sched));
            free(res.params);
        }
        free(first.params);
        free(plain.params);
    }
}

/* With a parameter copy per device (the GPU layout) the tied token embedding is held by
 * the first stage (the embedding) and the last (the projection): after every step both
 * copies are the same bits. */
Test(pipeline, tied_embedding_copies_equal_after_every_step, .timeout = 120)
{
    const run runs[] = {
        {.P = 2, .M = 4, .sched = PST_SCHEDULE_1F1B, .replicas = 1, .overlap = 1, .steps = 8},
        {.P = 4, .V = 2, .M = 4, .sched = PST_SCHEDULE_INTERLEAVED, .replicas = 1,
         .overlap = 1, .steps = 8},
        {.P = 2, .M = 4, .devices = 4, .sched = PST_SCHEDULE_1F1B, .overlap = 1, .steps = 8},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        result res;
        cr_assert_eq(train(&runs[i], &res), PST_OK, "%s", pst_error_detail());
        cr_assert_eq(res.tied_unequal_steps, 0, "P %d: the copies differed after %d steps",
                     runs[i].P, res.tied_unequal_steps);
        free(res.params);
    }
}

/* Only activations go forward and gradients back, one copy each per micro-batch and chunk
 * boundary in each replica: 2 (C - 1) M R per step, C = P V; no shape or metadata message
 * exists. */
Test(pipeline, messages_between_stages_are_counted_exactly, .timeout = 120)
{
    const run runs[] = {
        {.P = 2, .M = 4, .sched = PST_SCHEDULE_1F1B, .steps = 3},
        {.P = 4, .M = 8, .sched = PST_SCHEDULE_GPIPE, .steps = 3},
        {.P = 2, .V = 2, .M = 6, .sched = PST_SCHEDULE_INTERLEAVED, .steps = 3},
        {.P = 4, .M = 3, .sched = PST_SCHEDULE_1F1B, .steps = 3}, /* M < P */
        {.P = 2, .M = 4, .devices = 4, .sched = PST_SCHEDULE_1F1B, .steps = 3},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        result res;
        cr_assert_eq(train(&runs[i], &res), PST_OK, "%s", pst_error_detail());
        const long C = runs[i].P * (runs[i].V ? runs[i].V : 1);
        const long R = runs[i].devices ? runs[i].devices / runs[i].P : 1;
        cr_assert_eq(res.messages, 2 * (C - 1) * runs[i].M * R * runs[i].steps,
                     "P %d V %d M %d: %ld messages", runs[i].P, runs[i].V, runs[i].M,
                     res.messages);
        free(res.params);
    }
}

/* The point of the memory work (Paddle PR #34230): at a fixed micro-batch size, a stage's
 * peak bytes do not grow with the number of micro-batches. 1F1B holds min(P - s, M)
 * micro-batches: the same bytes (within 2%) from M = P to M = 16P (docs/benchmarks.md's table
 * goes to 64P). Interleaved holds min(M V, (P - s - 1) 2 + (V - 1) P + 1) chunk
 * activations: its most from M = 2P on (M = P has only M V = P V of them), so flat from
 * 4P to 16P and never more than at 4P. GPipe holds all M: it grows. */
/* Issue 30: a stage keeps the gradients (and addresses the parameters) of the tensors its
 * chunks' layers name and nothing else; the tied token table is on the first and the last
 * stage; the sum over the stages is the model plus one table, per replica. 1F1B and
 * interleaved, P 2 and 4, one replica and two (cpu:2P). */
Test(pipeline, each_stage_holds_only_its_tensors, .timeout = 120)
{
    for (int c = 0; c < 8; c++) {
        const int P = c & 1 ? 4 : 2, V = c & 2 ? 2 : 1, R = c & 4 ? 2 : 1;
        run r = {.P = P, .V = V, .M = 2 * P, .mb = 2, .steps = 1, .devices = P * R,
                 .sched = V > 1 ? PST_SCHEDULE_INTERLEAVED : PST_SCHEDULE_1F1B};
        result res = {0};
        cr_assert_eq(train(&r, &res), PST_OK, "%s", pst_error_detail());
        size_t sum = 0;
        for (int s = 0; s < P * R; s++) {
            cr_assert_eq(res.grad_bytes[s], 4 * res.held_by[s], "P %d V %d R %d device %d: %zu "
                         "gradient bytes for %zu elements", P, V, R, s, res.grad_bytes[s],
                         res.held_by[s]);
            cr_assert_eq(res.param_bytes[s], res.grad_bytes[s]);
            cr_assert_lt(res.held_by[s], res.n, "P %d device %d holds everything", P, s);
            sum += res.held_by[s];
        }
        const size_t table = (size_t)text.vocab * 32; /* the tied (vocab, embd) table */
        cr_assert_eq(sum, R * (res.n + table), "P %d V %d R %d: the stages hold %zu of R x "
                     "(%zu + %zu)", P, V, R, sum, res.n, table);
        free(res.params);
    }
}

Test(pipeline, peak_memory_is_flat_in_micro_batches, .timeout = 300)
{
    const pst_schedule kinds[] = {PST_SCHEDULE_1F1B, PST_SCHEDULE_INTERLEAVED,
                                  PST_SCHEDULE_GPIPE};
    const int P = 2;
    for (int q = 0; q < 3; q++) {
        size_t peak[3][2];
        for (int i = 0, f = 1; i < 3; i++, f *= 4) {
            run r = {.P = P, .V = kinds[q] == PST_SCHEDULE_INTERLEAVED ? 2 : 1, .M = P * f,
                     .mb = 2, .sched = kinds[q], .steps = 1};
            result res;
            cr_assert_eq(train(&r, &res), PST_OK, "%s", pst_error_detail());
            for (int s = 0; s < P; s++) {
                peak[i][s] = res.peak[s];
                fprintf(stderr, "%s M %d: stage %d peak %zu bytes\n", name(kinds[q]), r.M, s,
                        res.peak[s]);
            }
            free(res.params);
        }
        for (int s = 0; s < P; s++) {
            const char *k = name(kinds[q]);
            if (kinds[q] == PST_SCHEDULE_GPIPE) {
                cr_assert_gt(peak[2][s], peak[0][s] * 1.5, "gpipe stage %d: %zu at M %d vs %zu "
                             "at M %d", s, peak[2][s], 16 * P, peak[0][s], P);
                continue;
            }
            const int from = kinds[q] == PST_SCHEDULE_INTERLEAVED ? 1 : 0;
            for (int i = from + 1; i < 3; i++)
                cr_assert_leq(fabs((double)peak[i][s] - (double)peak[from][s]),
                              0.02 * (double)peak[from][s], "%s stage %d: %zu vs %zu", k, s,
                              peak[i][s], peak[from][s]);
            cr_assert_leq(peak[0][s], peak[from][s], "%s stage %d: more at M = P", k, s);
        }
    }
}

/* One line naming the problem, and no executor. */
Test(pipeline, invalid_combinations_are_refused, .timeout = 60)
{
    const struct {
        run r;
        const char *says;
        pst_status st;
    } bad[] = {
        {{.P = 3, .M = 4, .sched = PST_SCHEDULE_INTERLEAVED, .V = 2, .steps = 1}, "multiple",
         PST_ERR_INVALID},
        {{.P = 8, .V = 2, .M = 8, .sched = PST_SCHEDULE_INTERLEAVED, .steps = 1}, "layers",
         PST_ERR_INVALID},
        {{.P = 2, .M = 4, .devices = 3, .steps = 1}, "cpu:2", PST_ERR_INVALID},
        {{.P = 2, .M = 4, .partition = "3,3", .steps = 1}, "--partition", PST_ERR_INVALID},
        {{.P = 2, .M = 4, .partition = "8", .steps = 1}, "2 chunks", PST_ERR_INVALID},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        result res;
        pst_status st = train(&bad[i].r, &res);
        cr_assert_eq(st, bad[i].st, "case %zu: %s", i, pst_strerror(st));
        cr_assert(strstr(pst_error_detail(), bad[i].says), "case %zu: %s", i,
                  pst_error_detail());
        cr_assert(!strchr(pst_error_detail(), '\n'), "%s", pst_error_detail());
    }
}

/* --partition by hand: other stage boundaries, the same bits (each tensor's gradient is
 * still added in micro-batch order on the one device that computes it). */
Test(pipeline, partition_by_hand_changes_no_bit, .timeout = 120)
{
    const run a = {.P = 4, .M = 4, .sched = PST_SCHEDULE_1F1B, .steps = 4};
    run b = a;
    b.partition = "1,3,3,1";
    result ra, rb;
    cr_assert_eq(train(&a, &ra), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(train(&b, &rb), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(memcmp(ra.params, rb.params, ra.n * sizeof(float)), 0);
    free(ra.params);
    free(rb.params);
}

/* 15 rows in 4 micro-batches (4, 4, 4, 3): micro-batches of unequal rows, each with its own
 * op arguments (the host sets a row count when it queues an op). */
Test(pipeline, unequal_micro_batches, .timeout = 120)
{
    const run plain = {.P = 1, .M = 4, .rows = 15, .steps = 6};
    const run pipes[] = {
        {.P = 2, .M = 4, .rows = 15, .sched = PST_SCHEDULE_1F1B, .steps = 6},
        {.P = 2, .M = 4, .rows = 15, .sched = PST_SCHEDULE_GPIPE, .steps = 6},
        {.P = 2, .V = 2, .M = 4, .rows = 15, .sched = PST_SCHEDULE_INTERLEAVED, .steps = 6},
    };
    result ref, first = {0};
    cr_assert_eq(train(&plain, &ref), PST_OK, "%s", pst_error_detail());
    const double r = l2(ref.params, ref.n);
    for (size_t i = 0; i < sizeof pipes / sizeof pipes[0]; i++) {
        result res;
        cr_assert_eq(train(&pipes[i], &res), PST_OK, "%s", pst_error_detail());
        const double v = l2(res.params, res.n);
        cr_assert_leq(fabs(v - r) / r, 1e-6, "%s: %.9g vs %.9g", name(pipes[i].sched), v, r);
        if (!first.params)
            first = res;
        else {
            cr_assert_eq(memcmp(first.params, res.params, res.n * sizeof(float)), 0, "%s",
                         name(pipes[i].sched));
            free(res.params);
        }
    }
    free(first.params);
    free(ref.params);
}

/* Random delays before every item of every stream (compute, transfers, reduce, update,
 * broadcast) change no bit: every hazard between the stages is closed by an event. */
Test(pipeline, random_stream_delays_change_no_bit, .timeout = 240)
{
    const run base[] = {
        {.P = 4, .M = 8, .sched = PST_SCHEDULE_1F1B, .steps = 3, .overlap = 1},
        {.P = 2, .V = 2, .M = 4, .sched = PST_SCHEDULE_INTERLEAVED, .steps = 3, .overlap = 1,
         .replicas = 1},
        {.P = 2, .M = 6, .rows = 15, .sched = PST_SCHEDULE_GPIPE, .steps = 3, .overlap = 1},
        {.P = 2, .M = 4, .devices = 4, .rows = 15, .sched = PST_SCHEDULE_1F1B, .steps = 3,
         .overlap = 1},
    };
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) {
        result ref;
        cr_assert_eq(train(&base[i], &ref), PST_OK, "%s", pst_error_detail());
        for (uint64_t seed = 1; seed <= 3; seed++) {
            run r = base[i];
            r.jitter = seed;
            result res;
            cr_assert_eq(train(&r, &res), PST_OK, "%s", pst_error_detail());
            cr_assert_eq(memcmp(ref.params, res.params, ref.n * sizeof(float)), 0,
                         "%s P %d, jitter seed %llu: other bits", name(r.sched), r.P,
                         (unsigned long long)seed);
            free(res.params);
        }
        free(ref.params);
    }
}
