/* ctr.c — training the click model (--model dlrm --dataset ctr), alone or with pservers
 * (see train.h).
 *
 * DESIGN. A step reads this trainer's slice of its global batch from the click file
 * (common/data/ctr.h: a stream, so the trainer's memory does not grow with the file), turns
 * each row's field ids into keys (field << 40 | id: one table for every field, each field's
 * keys apart), finds the slice's distinct keys (common/sparse_rows.h), ordered by the
 * pserver that holds them, pulls their rows (from the in-process sparse table alone,
 * pserver/sparse.h; from the pservers' shards otherwise, remote.h: keys without a row get
 * the initializer's values, and nothing is created), lays them out per row for the
 * executor, which runs the dense model (the bottom MLP, the interaction, the top MLP, the
 * loss) and hands back the rows' embedding gradients; those are summed per key device by
 * device, as the pservers sum trainers, and pushed: one update of each key's row a step.
 * The dense parameters go through the link as for every model. The sparse table's
 * optimizer is the dense one's kind where the table has it (sgd, adagrad, adam), with --lr
 * and --eps. Admission, eviction by age and the row budget are the table's
 * (--sparse-admit-count, --sparse-evict-after, --sparse-max-rows); expired rows are swept
 * every 64 steps. Checkpoints (sync): see ckpt_setup below.
 * Not built yet (issue 31), refused in one line: fp16 (the table would need the loss scale
 * and its vote), learning-rate schedules (the table's lr is constant), checkpoints in
 * async mode, a file without dense features. Not kept: --save-params, metrics and traces
 * (a warning names them). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/data/ctr.h"
#include "common/data/data.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/memory.h"
#include "common/nn/models/models.h"
#include "common/sparse_rows.h"
#include "pserver/sparse.h"
#include "trainer/exec.h"
#include "trainer/local.h"
#include "trainer/plan.h"
#include "trainer/remote.h"
#include "trainer/train.h"

#define FIELD_SHIFT 40 /* a key: the field above, the field-local id (< 2^40) below */

/* The sparse table: table 0 of the link (the in-process one alone, the pservers' shards
 * otherwise: link.h's sparse ops), and how the keys spread over its shards. */
typedef struct ctr_rows_at {
    tr_link *link;
    int S;                   /* shards: pservers (1 alone) */
    uint64_t keys_of[PST_MAX_PSERVERS]; /* distinct keys pulled from each, over the run */
} ctr_rows_at;

/* The batch buffers of up to `rows` rows. */
typedef struct ctr_batch {
    void *rec;            /* (rows, record) bytes as read */
    float *dense;         /* (rows, D) */
    uint32_t *ids;        /* (rows, F) */
    float *label;         /* (rows) */
    int32_t *y;           /* (rows) the executor's targets */
    uint64_t *keys;       /* (rows F) */
    pst_key_at *scratch;  /* (rows F) */
    uint64_t *uniq;       /* (rows F) the distinct keys, ascending within each pserver's */
    uint32_t *inverse;    /* (rows F) */
    uint32_t *moved;      /* (rows F) scratch of shard_keys and of the sums' parts */
    float *pulled;        /* (rows F, dim) the distinct keys' rows */
    float *sparse;        /* (rows, F dim) the rows' embeddings */
    float *dsparse;       /* (rows, F dim) their gradients */
    float *sums;          /* (rows F, dim) the distinct keys' summed gradients */
    float *part;          /* (rows F, dim) one device's sums (pst_rows_sum_parts) */
    size_t nuniq;
    size_t seg[PST_MAX_PSERVERS + 1]; /* uniq[seg[s], seg[s + 1]): pserver s's keys */
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
    b->moved = malloc(sizeof(uint32_t) * n);
    b->pulled = malloc(sizeof(float) * n * dim);
    b->sparse = malloc(sizeof(float) * n * dim);
    b->dsparse = malloc(sizeof(float) * n * dim);
    b->sums = malloc(sizeof(float) * n * dim);
    b->part = malloc(sizeof(float) * n * dim);
    if (!b->rec || !b->dense || !b->ids || !b->label || !b->y || !b->keys || !b->scratch ||
        !b->uniq || !b->inverse || !b->moved || !b->pulled || !b->sparse || !b->dsparse ||
        !b->sums || !b->part)
        return pst_error_set(PST_ERR_NOMEM, "dlrm: out of memory for batches of %zu rows",
                             rows);
    return PST_OK;
}

static void batch_free(ctr_batch *b)
{
    void *p[] = {b->rec, b->dense, b->ids, b->label, b->y, b->keys, b->scratch, b->uniq,
                 b->inverse, b->moved, b->pulled, b->sparse, b->dsparse, b->sums, b->part};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
}

/* Orders the distinct keys by the pserver that holds them (pst_sparse_pserver_of), each
 * pserver's still ascending, and points the occurrences at their new places: pserver s's
 * keys are uniq[seg[s], seg[s + 1]), and so are their rows in every (nuniq, dim) array. */
static void shard_keys(ctr_batch *b, size_t n, int S)
{
    b->seg[0] = 0;
    for (int s = 1; s <= S; s++)
        b->seg[s] = S == 1 ? b->nuniq : 0;
    if (S == 1)
        return;
    size_t at[PST_MAX_PSERVERS + 1] = {0};
    for (size_t u = 0; u < b->nuniq; u++)
        at[pst_sparse_pserver_of(b->uniq[u], S) + 1]++;
    for (int s = 0; s < S; s++)
        at[s + 1] += at[s];
    memcpy(b->seg, at, sizeof(size_t) * (size_t)(S + 1));
    uint64_t *to = b->keys; /* the keys are read again only by the next batch_load */
    for (size_t u = 0; u < b->nuniq; u++) {
        const size_t v = at[pst_sparse_pserver_of(b->uniq[u], S)]++;
        b->moved[u] = (uint32_t)v;
        to[v] = b->uniq[u];
    }
    memcpy(b->uniq, to, sizeof(uint64_t) * b->nuniq);
    for (size_t i = 0; i < n; i++)
        b->inverse[i] = b->moved[b->inverse[i]];
}

/* The distinct keys' rows (nuniq, dim) as of `step` into out. */
static pst_status rows_pull(ctr_rows_at *at, const ctr_batch *b, long step, float *out)
{
    for (int s = 0; s < at->S; s++)
        at->keys_of[s] += b->seg[s + 1] - b->seg[s];
    return at->link->ops->sparse_pull(at->link, 0, step, b->uniq, b->seg, out);
}

/* Reads rows [first, first + n) and lays out their embeddings as of `step` (keys without a
 * row get the initializer's values, and nothing is created). */
static pst_status batch_load(ctr_batch *b, const pst_ctr *c, ctr_rows_at *at, uint64_t first,
                             size_t n, long step, size_t dim)
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
    shard_keys(b, n * F, at->S);
    PST_TRY(rows_pull(at, b, step, b->pulled));
    for (size_t i = 0; i < n * F; i++)
        memcpy(b->sparse + i * dim, b->pulled + (size_t)b->inverse[i] * dim, sizeof(float) * dim);
    return PST_OK;
}

/* b->sums = each distinct key's gradient rows of this trainer's n rows, summed as the
 * pservers sum T trainers' pushes: within each of the D devices' rows (the executor's
 * split, pst_batch_part) in row order, then the devices in order; so T trainers of one
 * device each push, and the pservers apply, what one process on T devices applies. */
static void batch_sums(ctr_batch *b, size_t n, size_t F, size_t dim, int D)
{
    size_t bounds[PST_DEVICE_MAX_COUNT + 1];
    bounds[0] = 0;
    for (int d = 0; d < D; d++) {
        int lo, hi;
        pst_batch_part((int)n, d, D, &lo, &hi);
        bounds[d + 1] = (size_t)hi * F;
    }
    pst_rows_sum_parts(b->dsparse, b->inverse, bounds, D, dim, b->sums, b->nuniq, b->part,
                       b->moved);
}

/* The click probabilities of the test part, in pieces of `piece` rows: AUC and log loss. */
static pst_status evaluate(tr_exec *ex, const pst_ctr *c, ctr_rows_at *at, ctr_batch *b,
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
        st = batch_load(b, c, at, c->train_rows + r0, k, step, dim);
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
    PST_FREE_ALL(p, y, scratch);
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
    if (cfg->checkpoint_dir[0] && cfg->mode == PST_MODE_ASYNC)
        return pst_error_set(PST_ERR_UNSUPPORTED, "--model dlrm with --mode async and "
                             "--checkpoint-dir is not built yet: its sparse tables are "
                             "checkpointed in sync mode (example: --mode sync)");
    if (cfg->save_params_path[0] || cfg->trace_path[0] || cfg->metrics_path[0])
        PST_WARN("dlrm: --save-params, --metrics and --trace are not kept for the click model "
                 "yet: ignored");
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

/* Checkpoints (--checkpoint-dir, sync) are the link's (the pservers', or the in-process
 * store's in DIR/<job>/pserver-0: the dense shard and the sparse table's files beside it,
 * sparse_ckpt.h) and the job state's (job.c), as for every model: trainer 0 writes
 * DIR/<job>/job/step-<s>.ckpt when it starts step s, which it pulled, so every shard of s
 * is whole by then; a resumed job starts from the newest step every shard holds. */

/* The summary's table fields and param_hash: the dense parameters' FNV-1a continued over
 * the sparse table's hash (pst_sparse_hash, which does not depend on the pservers' split). */
static void summarize_tables(tr_summary *sum, const tr_sparse_totals *t)
{
    sum->rows_touched = (size_t)t->created;
    sum->rows_evicted = (size_t)t->evicted;
    sum->pushes_refused = (size_t)t->refused;
    sum->table_rows = (size_t)t->rows;
    sum->table_bytes = (size_t)t->bytes;
    sum->sparse_hash = t->hash;
    sum->param_hash = pst_fnv1a(sum->param_hash, &t->hash, sizeof t->hash);
}

/* With pservers: how evenly the keys spread over them (each pserver's share of the
 * distinct keys pulled, over the run), logged, and the largest share over the mean. */
static double key_balance(const ctr_rows_at *at)
{
    uint64_t total = 0, most = 0;
    char line[PST_MAX_PSERVERS * 12 + 1] = "";
    for (int s = 0; s < at->S; s++) {
        total += at->keys_of[s];
        most = at->keys_of[s] > most ? at->keys_of[s] : most;
    }
    for (int s = 0, k = 0; s < at->S && total && k < (int)sizeof line - 12; s++)
        k += snprintf(line + k, sizeof line - (size_t)k, "%s%.1f%%", s ? " " : "",
                      100.0 * (double)at->keys_of[s] / (double)total);
    if (at->S > 1 && total)
        PST_INFO("dlrm: the keys pulled by pserver (their share of %llu): %s",
                 (unsigned long long)total, line);
    return total ? (double)most * at->S / (double)total : 1.0;
}

pst_status tr_train_ctr(tr_job *job, const pst_config *cfg, const tr_test_hooks *hooks,
                        tr_summary *sum)
{
    memset(sum, 0, sizeof *sum);
    sum->first_step = -1;
    sum->ctr = 1;
    pst_ctr c = {.fd = -1};
    pst_model model = {0};
    pst_runtime *rt = NULL;
    tr_plan plan = {0};
    tr_link *link = NULL;
    tr_remote *remote = NULL;
    tr_exec *ex = NULL;
    ctr_rows_at at = {.S = cfg->num_pservers ? cfg->num_pservers : 1};
    ctr_batch b = {0};
    float *params = NULL;
    const size_t dim = (size_t)cfg->sparse_dim;
    const int bottom[1] = {64}, top[2] = {128, 64}; /* the peer's (torch_dlrm.py) */
    const int S = cfg->num_pservers, T = cfg->trainers, rank = cfg->trainer_id;
    int started = 0;
    long step = -1;
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
    const size_t most = (B + (size_t)T - 1) / (size_t)T; /* this trainer's rows at most */
    const long per_epoch = c.train_rows ? (long)((c.train_rows + B - 1) / B) : 1;
    long total = per_epoch * cfg->epochs;
    if (cfg->steps > 0 && cfg->steps < total)
        total = cfg->steps;
    /* The dense optimizer's length (its schedule is constant here): the whole run's, not
     * --steps, so a run stopped early by --steps resumes as the same job. */
    pst_config run_cfg = *cfg;
    run_cfg.optim.total_steps = per_epoch * cfg->epochs;
    const tr_exec_settings es = tr_exec_settings_of(&run_cfg);
    if (st == PST_OK)
        st = tr_exec_plan(&plan, &model, &es,
                          tr_plan_pipelined_bytes(model.nparams, cfg->block_bytes, S), S ? S : 1,
                          D);
    tr_link_settings ls = tr_link_settings_of(&run_cfg, &plan);
    ls.sparse_tables = &tc;
    ls.nsparse_tables = 1;
    if (st == PST_OK && S) {
        st = tr_remote_init(&remote, &ls, &plan);
        link = remote ? tr_remote_link(remote) : NULL;
    } else if (st == PST_OK) {
        st = tr_local_init(&link, &ls, &plan);
    }
    at.link = link;
    char job_dir[PST_PATH_MAX + PST_JOB_ID_MAX + 32] = "";
    int64_t candidates[TR_RESUME_CANDIDATES];
    tr_resume_state candidate_states[TR_RESUME_CANDIDATES];
    long newest = 0; /* the newest job checkpoint's step, whole or not */
    /* evaluation in pieces of at least 1,024 rows: the executor's activations, the batch
     * buffers and so the process's peak memory are sized by the larger of the two */
    const size_t piece = most > 1024 ? most : 1024;
    double *step_ms = malloc(sizeof(double) * (size_t)(total > 0 ? total : 1));
    if (st == PST_OK && !step_ms)
        st = pst_error_set(PST_ERR_NOMEM, "dlrm: out of memory");
    tr_exec_config ec = {.cfg = es, .rt = rt, .model = &model, .max_rows = (int)most,
                         .eval_rows = (int)piece, .link = link, .overlap = cfg->overlap,
                         .threads = tr_threads_per_device(cfg, D)};
    if (st == PST_OK)
        st = tr_exec_init(&ex, &ec);
    if (st == PST_OK)
        st = batch_alloc(&b, &c, piece, dim);
    if (st == PST_OK)
        st = tr_job_checkpoints(job, &run_cfg, &plan, ls.job_id, link, job_dir, sizeof job_dir,
                                candidates, candidate_states, &newest);
    if (st == PST_OK) /* Init (the tables made), every trainer on trainer 0's */
        st = tr_exec_start(ex, cfg->seed);
    if (st != PST_OK)
        goto done;
    started = 1;
    const long first = (long)link->start_version; /* a resumed job's step (0: a fresh one) */
    if (link->versions_differ)
        st = pst_error_set(PST_ERR_MISMATCH, "dlrm: the pservers resumed at different steps "
                           "(the oldest %lld): remove the newer checkpoints or start afresh "
                           "(--resume never)", (long long)link->start_version);
    if (st == PST_OK)
        st = tr_job_check_resume(&run_cfg, link, job_dir, newest, first, total);
    if (st == PST_OK && first > 0)
        PST_INFO("dlrm: resuming at step %ld of %ld", first, total);
    if (st != PST_OK)
        goto done;
    PST_INFO("dlrm: %s, %d dense and %d sparse fields, %llu training rows, %ld steps of %zu "
             "rows; %zu dense parameters, rows of %zu in a sparse table (%s, lr %g)%s", c.path,
             c.dense, c.fields, (unsigned long long)c.train_rows, total, B, model.nparams, dim,
             pst_sparse_optim_name(tc.optim), tc.lr, S ? " on the pservers" : "");
    const double t0 = pst_clock_s();
    double loss_sum = 0.0;
    long samples = 0, trained = 0; /* rows of the last epoch's mean; rows of every step */
    sum->first_step = first;
    for (step = first; st == PST_OK && step < total; step++) {
        const double s0 = pst_clock_s();
        const uint64_t start = (uint64_t)(step % per_epoch) * B; /* the global batch's */
        const size_t len = c.train_rows - start < B ? (size_t)(c.train_rows - start) : B;
        int lo, hi; /* this trainer's slice of the global batch */
        pst_batch_part((int)len, rank, T, &lo, &hi);
        const size_t n = (size_t)(hi - lo);
        double loss = 0.0;
        st = batch_load(&b, &c, &at, start + (uint64_t)lo, n, step, dim);
        if (st == PST_OK && job_dir[0] && rank == 0 && step > first &&
            step % cfg->checkpoint_every == 0) { /* every shard of `step` is whole now */
            long version;
            const tr_resume_state rs = tr_exec_state(ex, step, &version);
            st = tr_job_write(&run_cfg, &plan, job_dir, version, &rs);
        }
        if (st == PST_OK && first == 0) /* a run resumed from a checkpoint goes past it */
            tr_test_hooks_step(hooks, step);
        if (st == PST_OK && tr_stop_requested()) /* SIGTERM: leaves now, without a checkpoint */
            st = pst_error_set(PST_ERR_STATE, "stopped by signal at step %ld (the click model "
                               "writes no checkpoint when stopped: its newest is kept)", step);
        if (st == PST_OK) {
            tr_exec_set_sparse(ex, b.sparse, b.dsparse);
            st = tr_exec_step(ex, step, b.dense, b.y, (int)n, (int)len, &loss);
        }
        if (st == PST_OK) /* the step's gradients are on the host once its compute has run */
            st = tr_exec_sync(ex);
        if (st == PST_OK) {
            batch_sums(&b, n, (size_t)c.fields, dim, D);
            st = link->ops->sparse_push(link, 0, step, b.uniq, b.seg, b.sums);
        }
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
        sum->step_ms_median = tr_median(step_ms + first, sum->steps - first); /* this run's */
        st = evaluate(ex, &c, &at, &b, piece, total, dim, sum);
    }
    if (st == PST_OK && !(params = malloc(sizeof(float) * model.nparams)))
        st = pst_error_set(PST_ERR_NOMEM, "dlrm: out of memory");
    if (st == PST_OK)
        st = tr_exec_params(ex, params);
    if (st == PST_OK) { /* the pservers' tables: as their Finish replies say */
        st = link->ops->finish(link, 0, total, NULL);
        started = 0;
    }
    if (st == PST_OK) {
        tr_summary_params(sum, params, model.nparams);
        tr_sparse_totals tt;
        link->ops->sparse_totals(link, &tt);
        summarize_tables(sum, &tt);
        sum->key_balance = S ? key_balance(&at) : 0.0;
        sum->ndevices = D < PST_DEVICE_MAX_COUNT ? D : PST_DEVICE_MAX_COUNT;
        for (int i = 0; i < sum->ndevices; i++)
            sum->memory[i] = tr_exec_memory_of(ex, i);
        sum->precision = cfg->precision;
        sum->test_acc = 0.0; /* a click model has AUC and log loss instead */
    }
done:
    if (started) { /* leaving early: the pservers tell the other trainers at once */
        char why[512];
        snprintf(why, sizeof why, "%s", pst_error_detail());
        link->ops->finish(link, 1, step, why);
        pst_error_set(st, "%s", why);
    }
    free(step_ms);
    free(params);
    batch_free(&b);
    tr_exec_free(ex);
    tr_link_free(link);
    tr_plan_free(&plan);
    pst_runtime_free(rt);
    pst_model_free(&model);
    pst_ctr_close(&c);
    return st;
}
