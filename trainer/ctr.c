/* ctr.c — training the click model (--model dlrm --dataset ctr) alone (see train.h).
 *
 * DESIGN. A step reads its global batch's rows from the click file (common/data/ctr.h: a
 * stream, so the trainer's memory does not grow with the file), turns each row's field ids
 * into keys (field << 40 | id: one table for every field, each field's keys apart), finds
 * the batch's distinct keys (common/sparse_rows.h), pulls their rows from the in-process
 * sparse table (pserver/sparse.h: created on the first push, initializer values before),
 * lays them out per row for the executor, which runs the dense model (the bottom MLP, the
 * interaction, the top MLP, the loss) and hands back the rows' embedding gradients; those
 * are summed per key in row order and pushed to the table as one update of each key's row.
 * The dense parameters are updated by the in-process store, as for every model trained
 * alone. The sparse table's optimizer is the dense one's kind where the table has it
 * (sgd, adagrad, adam), with --lr and --eps.
 * Admission, eviction by age and the row budget are the table's (--sparse-admit-count,
 * --sparse-evict-after, --sparse-max-rows); expired rows are swept every 64 steps.
 * Not built yet (issue 31), refused in one line: pservers (the sparse tables' wire), fp16
 * (the table would need the loss scale and its vote), learning-rate schedules (the table's
 * lr is constant), a file without dense features. Not kept: --save-params, checkpoints,
 * metrics and traces (a warning names them). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/data/ctr.h"
#include "common/log.h"
#include "common/nn/models/models.h"
#include "common/sparse_rows.h"
#include "pserver/sparse.h"
#include "trainer/exec.h"
#include "trainer/local.h"
#include "trainer/plan.h"
#include "trainer/train.h"

#define FIELD_SHIFT 40 /* a key: the field above, the field-local id (< 2^40) below */

/* The batch buffers of up to `rows` rows. */
typedef struct ctr_batch {
    void *rec;            /* (rows, record) bytes as read */
    float *dense;         /* (rows, D) */
    uint32_t *ids;        /* (rows, F) */
    float *label;         /* (rows) */
    int32_t *y;           /* (rows) the executor's targets */
    uint64_t *keys;       /* (rows F) */
    pst_key_at *scratch;  /* (rows F) */
    uint64_t *uniq;       /* (rows F) */
    uint32_t *inverse;    /* (rows F) */
    float *pulled;        /* (rows F, dim) the distinct keys' rows */
    float *sparse;        /* (rows, F dim) the rows' embeddings */
    float *dsparse;       /* (rows, F dim) their gradients */
    float *sums;          /* (rows F, dim) the distinct keys' summed gradients */
    size_t nuniq;
} ctr_batch;

static pst_status batch_alloc(ctr_batch *b, const pst_ctr *c, size_t rows, size_t dim)
{
    const size_t F = (size_t)c->fields, n = rows * F;
    b->rec = malloc(rows * c->record);
    b->dense = malloc(sizeof(float) * rows * (size_t)(c->dense ? c->dense : 1));
    b->ids = malloc(sizeof(uint32_t) * n);
    b->label = malloc(sizeof(float) * rows);
    b->y = malloc(sizeof(int32_t) * rows);
    b->keys = malloc(sizeof(uint64_t) * n);
    b->scratch = malloc(sizeof(pst_key_at) * n);
    b->uniq = malloc(sizeof(uint64_t) * n);
    b->inverse = malloc(sizeof(uint32_t) * n);
    b->pulled = malloc(sizeof(float) * n * dim);
    b->sparse = malloc(sizeof(float) * n * dim);
    b->dsparse = malloc(sizeof(float) * n * dim);
    b->sums = malloc(sizeof(float) * n * dim);
    if (!b->rec || !b->dense || !b->ids || !b->label || !b->y || !b->keys || !b->scratch ||
        !b->uniq || !b->inverse || !b->pulled || !b->sparse || !b->dsparse || !b->sums)
        return pst_error_set(PST_ERR_NOMEM, "dlrm: out of memory for batches of %zu rows",
                             rows);
    return PST_OK;
}

static void batch_free(ctr_batch *b)
{
    void *p[] = {b->rec, b->dense, b->ids, b->label, b->y, b->keys, b->scratch, b->uniq,
                 b->inverse, b->pulled, b->sparse, b->dsparse, b->sums};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
}

/* Reads rows [first, first + n) and lays out their embeddings as of `step` (pulled from
 * the table; keys without a row get the initializer's values, and nothing is created). */
static pst_status batch_load(ctr_batch *b, const pst_ctr *c, pst_sparse_table *t,
                             uint64_t first, size_t n, long step, size_t dim)
{
    const pst_ctr_rows out = {b->dense, b->ids, b->label, NULL};
    PST_TRY(pst_ctr_read(c, first, n, b->rec, &out));
    const size_t F = (size_t)c->fields;
    for (size_t r = 0; r < n; r++) {
        b->y[r] = b->label[r] > 0.5f;
        for (size_t f = 0; f < F; f++)
            b->keys[r * F + f] = (uint64_t)f << FIELD_SHIFT | b->ids[r * F + f];
    }
    PST_TRY(pst_keys_unique(b->keys, n * F, b->scratch, b->uniq, b->inverse, &b->nuniq));
    PST_TRY(pst_sparse_pull(t, b->uniq, b->nuniq, step, b->pulled));
    for (size_t i = 0; i < n * F; i++)
        memcpy(b->sparse + i * dim, b->pulled + (size_t)b->inverse[i] * dim, sizeof(float) * dim);
    return PST_OK;
}

/* The click probabilities of the test part, in pieces of `piece` rows: AUC and log loss. */
static pst_status evaluate(tr_exec *ex, const pst_ctr *c, pst_sparse_table *t, ctr_batch *b,
                           size_t piece, long step, size_t dim, tr_summary *sum)
{
    const size_t n = (size_t)c->test_rows;
    float *p = malloc(sizeof(float) * (n ? n : 1)), *y = malloc(sizeof(float) * (n ? n : 1));
    uint64_t *scratch = malloc(sizeof(uint64_t) * (n ? n : 1));
    pst_status st = !p || !y || !scratch
                        ? pst_error_set(PST_ERR_NOMEM, "dlrm: out of memory for %zu test rows", n)
                        : PST_OK;
    for (size_t r0 = 0; st == PST_OK && r0 < n; r0 += piece) {
        const size_t k = n - r0 < piece ? n - r0 : piece;
        st = batch_load(b, c, t, c->train_rows + r0, k, step, dim);
        if (st == PST_OK) {
            tr_exec_set_sparse(ex, b->sparse, NULL);
            st = tr_exec_predict(ex, b->dense, (int)k, p + r0);
        }
        for (size_t i = 0; st == PST_OK && i < k; i++)
            y[r0 + i] = b->label[i];
    }
    if (st == PST_OK && n) {
        sum->test_auc = pst_auc(p, y, n, scratch);
        sum->test_logloss = pst_logloss(p, y, n);
        sum->auc_gap = (double)c->bayes_auc - sum->test_auc;
    }
    free(p);
    free(y);
    free(scratch);
    return st;
}

/* The table's optimizer: the dense one's kind, where a sparse table has it; what this loop
 * does not do yet is refused. */
static pst_status table_config(const pst_config *cfg, uint64_t seed, pst_sparse_config *tc)
{
    if (cfg->precision == PST_F16)
        return pst_error_set(PST_ERR_UNSUPPORTED, "--model dlrm with --precision fp16 is not "
                             "built yet: its sparse rows would need the loss scale (example: "
                             "--precision bf16)");
    if (cfg->optim.schedule != PST_LR_CONSTANT)
        return pst_error_set(PST_ERR_UNSUPPORTED, "--model dlrm with --lr-schedule %s is not "
                             "built yet: its sparse table's lr is constant (example: "
                             "--lr-schedule constant)", pst_lr_schedule_name(cfg->optim.schedule));
    if (cfg->save_params_path[0] || cfg->checkpoint_dir[0] || cfg->trace_path[0] ||
        cfg->metrics_path[0])
        PST_WARN("dlrm: --save-params, checkpoints, --metrics and --trace are not kept for "
                 "the click model yet: ignored");
    pst_sparse_defaults(tc);
    snprintf(tc->name, sizeof tc->name, "dlrm");
    tc->dim = cfg->sparse_dim;
    tc->admit_count = (uint32_t)cfg->sparse_admit_count;
    tc->evict_after = cfg->sparse_evict_after;
    tc->max_rows = (size_t)cfg->sparse_max_rows;
    tc->lr = cfg->optim.lr;
    tc->eps = cfg->optim.eps;
    tc->beta1 = cfg->optim.beta1;
    tc->beta2 = cfg->optim.beta2;
    tc->seed = seed;
    switch (cfg->optim.kind) {
    case PST_OPTIM_SGD:
        tc->optim = PST_SPARSE_SGD;
        break;
    case PST_OPTIM_ADAGRAD:
        tc->optim = PST_SPARSE_ADAGRAD;
        break;
    case PST_OPTIM_ADAM:
        tc->optim = PST_SPARSE_ADAM;
        break;
    default:
        return pst_error_set(PST_ERR_UNSUPPORTED, "--model dlrm with --optimizer %s: its "
                             "sparse tables have sgd, adagrad or adam (example: --optimizer "
                             "adagrad)", pst_optim_kind_name(cfg->optim.kind));
    }
    return pst_sparse_check(tc);
}

pst_status tr_train_ctr(const pst_config *cfg, tr_summary *sum)
{
    memset(sum, 0, sizeof *sum);
    sum->first_step = -1;
    sum->ctr = 1;
    pst_ctr c = {.fd = -1};
    pst_model model = {0};
    pst_runtime *rt = NULL;
    tr_plan plan = {0};
    tr_link *link = NULL;
    tr_exec *ex = NULL;
    pst_sparse_table *table = NULL;
    ctr_batch b = {0};
    float *params = NULL;
    const size_t dim = (size_t)cfg->sparse_dim;
    const int bottom[1] = {64}, top[2] = {128, 64}; /* the peer's (torch_dlrm.py) */
    pst_sparse_config tc;
    pst_status st = table_config(cfg, cfg->seed, &tc);
    if (st == PST_OK)
        st = pst_ctr_open(&c, cfg->data_dir);
    if (st == PST_OK && c.train_rows == 0)
        st = pst_error_set(PST_ERR_FORMAT, "%s: no training rows", c.path);
    if (st == PST_OK && (c.dense == 0 || c.test_rows > UINT32_MAX))
        st = pst_error_set(PST_ERR_UNSUPPORTED, "%s: %d dense features and %llu test rows: "
                           "the dlrm needs at least 1 dense feature (its bottom MLP's input) "
                           "and at most 2^32 test rows", c.path, c.dense,
                           (unsigned long long)c.test_rows);
    if (st == PST_OK)
        st = pst_model_dlrm(&model, c.dense, c.fields, (int)dim, 1, bottom, 2, top);
    if (st == PST_OK)
        st = pst_runtime_init(&rt, cfg->devices);
    const int D = rt ? pst_runtime_count(rt) : 1;
    for (int i = 0; rt && i < D; i++)
        pst_device_set_memory_limit(pst_runtime_device(rt, i), cfg->device_memory_limit);
    const size_t B = (size_t)cfg->batch;
    const long per_epoch = c.train_rows ? (long)((c.train_rows + B - 1) / B) : 1;
    long total = per_epoch * cfg->epochs;
    if (cfg->steps > 0 && cfg->steps < total)
        total = cfg->steps;
    pst_config run_cfg = *cfg; /* the dense optimizer's schedule needs the run's length */
    run_cfg.optim.total_steps = total;
    const tr_exec_settings es = tr_exec_settings_of(&run_cfg);
    if (st == PST_OK)
        st = tr_exec_plan(&plan, &model, &es, cfg->block_bytes, 1, D);
    const tr_link_settings ls = tr_link_settings_of(&run_cfg, &plan);
    if (st == PST_OK)
        st = tr_local_init(&link, &ls, &plan);
    /* evaluation in pieces of at least 1,024 rows: the executor's activations, the batch
     * buffers and so the process's peak memory are sized by the larger of the two */
    const size_t piece = B > 1024 ? B : 1024;
    double *step_ms = malloc(sizeof(double) * (size_t)(total > 0 ? total : 1));
    if (st == PST_OK && !step_ms)
        st = pst_error_set(PST_ERR_NOMEM, "dlrm: out of memory");
    tr_exec_config ec = {.cfg = es, .rt = rt, .model = &model, .max_rows = (int)B,
                         .eval_rows = (int)piece, .link = link, .overlap = cfg->overlap,
                         .threads = tr_threads_per_device(cfg, D)};
    if (st == PST_OK)
        st = tr_exec_init(&ex, &ec);
    if (st == PST_OK)
        st = tr_exec_start(ex, cfg->seed);
    if (st == PST_OK)
        st = pst_sparse_create(&table, &tc);
    if (st == PST_OK)
        st = batch_alloc(&b, &c, piece, dim);
    if (st != PST_OK)
        goto done;
    PST_INFO("dlrm: %s, %d dense and %d sparse fields, %llu training rows, %ld steps of %zu "
             "rows; %zu dense parameters, rows of %zu in a sparse table (%s, lr %g)", c.path,
             c.dense, c.fields, (unsigned long long)c.train_rows, total, B, model.nparams, dim,
             pst_sparse_optim_name(tc.optim), tc.lr);
    const double t0 = pst_clock_s();
    double loss_sum = 0.0;
    long samples = 0, trained = 0; /* rows of the last epoch's mean; rows of every step */
    sum->first_step = 0;
    for (long step = 0; st == PST_OK && step < total; step++) {
        const double s0 = pst_clock_s();
        const uint64_t first = (uint64_t)(step % per_epoch) * B;
        const size_t n = c.train_rows - first < B ? (size_t)(c.train_rows - first) : B;
        double loss = 0.0;
        st = batch_load(&b, &c, table, first, n, step, dim);
        if (st == PST_OK) {
            tr_exec_set_sparse(ex, b.sparse, b.dsparse);
            st = tr_exec_step(ex, step, b.dense, b.y, (int)n, (int)n, &loss);
        }
        if (st == PST_OK) /* the step's gradients are on the host once its compute has run */
            st = tr_exec_sync(ex);
        if (st == PST_OK) {
            pst_rows_sum(b.dsparse, b.inverse, n * (size_t)c.fields, dim, b.sums, b.nuniq);
            st = pst_sparse_push(table, b.uniq, b.nuniq, b.sums, step);
        }
        if (st == PST_OK && cfg->sparse_evict_after > 0 && step % 64 == 63)
            pst_sparse_sweep(table, step); /* frees expired rows (changes no value) */
        if (st == PST_OK && step >= total - per_epoch) { /* the last epoch's mean */
            loss_sum += loss;
            samples += (long)n;
        }
        trained += (long)n;
        step_ms[step] = 1e3 * (pst_clock_s() - s0);
        sum->steps = step + 1;
    }
    const double train_s = pst_clock_s() - t0;
    if (st == PST_OK) {
        sum->train_loss = samples ? loss_sum / (double)samples : 0.0;
        sum->samples_per_s = train_s > 0 ? (double)trained / train_s : 0.0;
        sum->step_ms_median = tr_median(step_ms, sum->steps);
        st = evaluate(ex, &c, table, &b, piece, total, dim, sum);
    }
    if (st == PST_OK && !(params = malloc(sizeof(float) * model.nparams)))
        st = pst_error_set(PST_ERR_NOMEM, "dlrm: out of memory");
    if (st == PST_OK)
        st = tr_exec_params(ex, params);
    if (st == PST_OK) {
        tr_summary_params(sum, params, model.nparams);
        pst_sparse_stats ts;
        pst_sparse_stats_of(table, &ts);
        sum->rows_touched = (size_t)ts.created;
        sum->rows_evicted = (size_t)ts.evicted;
        sum->pushes_refused = (size_t)ts.refused;
        sum->table_rows = ts.rows;
        sum->table_bytes = ts.bytes;
        sum->ndevices = D < PST_DEVICE_MAX_COUNT ? D : PST_DEVICE_MAX_COUNT;
        for (int i = 0; i < sum->ndevices; i++)
            sum->memory[i] = tr_exec_memory_of(ex, i);
        sum->precision = cfg->precision;
        sum->test_acc = 0.0; /* a click model has AUC and log loss instead */
    }
done:
    free(step_ms);
    free(params);
    batch_free(&b);
    pst_sparse_free(table);
    tr_exec_free(ex);
    tr_link_free(link);
    tr_plan_free(&plan);
    pst_runtime_free(rt);
    pst_model_free(&model);
    pst_ctr_close(&c);
    return st;
}
