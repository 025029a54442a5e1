/* train.c — the training loop (see train.h).
 *
 * DESIGN: everything the loop needs is allocated before step 0 (batch buffers, the
 * executor's per-device state, the per-step timing array). A step gathers this trainer's
 * slice of the global batch and hands it to the executor (exec.h), which runs forward and
 * backward on the local devices with the loss scaled by 1/global_batch (so the trainers'
 * gradients SUM to the global batch's gradient) and the update, locally or through the
 * pservers. A model that reads no data (synthetic) gets no batch, only its row count.
 * Timing follows the PyTorch peer: step_ms covers forward+backward+update, samples/s covers
 * the whole training loop including batch gathering, not evaluation. */
#include "trainer/train.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/checkpoint.h"
#include "common/memory.h"
#include "common/prom.h"
#include "common/clock.h"
#include "common/data/data.h"
#include "common/data/text.h"
#include "common/runtime/device.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/metrics.h"
#include "common/nn/models/models.h"
#include "common/optim.h"
#include "trainer/exec.h"
#include "trainer/plan.h"
#include "trainer/local.h"
#include "trainer/remote.h"
#include "trainer/trace.h"

int tr_recoverable(pst_status st)
{
    return !tr_stop_requested() && (st == PST_ERR_UNAVAILABLE || st == PST_ERR_TIMEOUT ||
                                     st == PST_ERR_STATE || st == PST_ERR_RANGE);
}

static pst_status check_stop(void)
{
    return tr_stop_requested() ? pst_error_set(PST_ERR_STATE, "stopped by signal") : PST_OK;
}

/* ---- progress ------------------------------------------------------------------------- */

static void progress_bar(int epoch, int epochs, int b, int nb, double loss, double sps)
{
    char bar[31];
    int fill = nb ? (int)(30.0 * b / nb) : 30;
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "\repoch %d/%d [%s] %d/%d loss %.4f %.0f samples/s ", epoch, epochs, bar,
            b, nb, loss, sps);
    fflush(stderr);
}

/* ---- evaluation ------------------------------------------------------------------------ */

/* The mean loss over the first --val-windows validation windows and the share of their
 * tokens predicted, in batches of at most `chunk` windows (x, y hold chunk * T). */
static pst_status text_validate(tr_exec *ex, const pst_text *text, const pst_config *cfg,
                                int chunk, int32_t *x, int32_t *y, double *loss, double *acc)
{
    const int T = cfg->ctx;
    int nw = pst_text_val_windows(text, T);
    nw = nw < cfg->val_windows ? nw : cfg->val_windows;
    double sum = 0.0;
    long correct = 0;
    for (int i = 0; i < nw; i += chunk) {
        const int k = nw - i < chunk ? nw - i : chunk;
        pst_text_val_rows(text, T, i, k, x, y);
        double s;
        long c;
        PST_TRY(tr_exec_eval_batch(ex, x, y, k, &s, &c));
        sum += s;
        correct += c;
    }
    *loss = nw ? sum / nw : 0.0;
    *acc = nw ? (double)correct / ((double)nw * T) : 0.0;
    return PST_OK;
}

/* --sample N: N characters from the final model on stderr, after a one-byte prompt (the
 * validation part's first). The window holds the last T tokens at its start; causal
 * attention makes the prediction at its last filled position depend on those alone (the
 * rest of the row is zeros). Each next token is drawn from softmax(logits / temperature)
 * = p^(1/temperature), renormalized, by pst_rng stream (seed, "samp"). */
static pst_status text_sample(tr_exec *ex, const pst_text *text, const pst_config *cfg)
{
    const int T = cfg->ctx, V = text->vocab;
    int32_t *row = calloc((size_t)T, sizeof *row);
    float *probs = malloc(sizeof(float) * (size_t)T * (size_t)V);
    double *w = malloc(sizeof(double) * (size_t)V);
    pst_status st = PST_OK;
    if (!row || !probs || !w) {
        st = pst_error_set(PST_ERR_NOMEM, "--sample: out of memory");
        goto out;
    }
    pst_rng r;
    pst_rng_seed(&r, cfg->seed, 0x73616d70ull /* "samp" */);
    int len = 1;
    row[0] = text->tokens[text->n_train];
    fprintf(stderr, "sample (%d characters, temperature %g):\n%c", cfg->sample,
            (double)cfg->temperature, text->bytes[row[0]]);
    for (int i = 0; i < cfg->sample; i++) {
        if ((st = tr_exec_predict(ex, row, 1, probs)) != PST_OK)
            goto out;
        const float *p = probs + (size_t)(len - 1) * V;
        double total = 0.0;
        for (int v = 0; v < V; v++)
            total += w[v] = pow((double)p[v], 1.0 / cfg->temperature);
        double u = (double)pst_rng_uniform(&r) * total;
        int next = V - 1;
        for (int v = 0; v < V; v++)
            if ((u -= w[v]) < 0.0) {
                next = v;
                break;
            }
        fputc(text->bytes[next], stderr);
        if (len == T) { /* slide: keep the last T - 1 tokens */
            memmove(row, row + 1, sizeof *row * (size_t)(T - 1));
            len--;
        }
        row[len++] = next;
    }
    fputc('\n', stderr);
out:
    PST_FREE_ALL(row, probs, w);
    return st;
}

/* ---- the loop ------------------------------------------------------------------------- */

/* ---- where the time went ---- */

/* Running totals (seconds) of the steps, from which tr_time_split's parts follow: the
 * executor's time less the compute stream's is communication, of which what the pservers
 * spent holding the pulls for the other trainers is waiting; the step's wall time less the
 * data and the executor is the loop's own. Totals, not per step: a step's compute may
 * finish after the executor returns and count in the next. */
typedef struct time_totals {
    long steps;
    double wall, data, exec, held;
    double busy0, busy; /* the compute stream's busy seconds at the start and now */
} time_totals;

/* The parts in seconds in all (compute, comm, wait, data, other); compute and comm are 0
 * when not measured. */
static void split_seconds(const time_totals *t, double out[5])
{
    double compute = t->busy0 >= 0 && t->busy >= 0 ? t->busy - t->busy0 : 0.0;
    compute = compute < t->exec ? compute : t->exec;
    const double comm = t->busy0 >= 0 && t->busy >= 0 ? t->exec - compute : 0.0;
    const double wait = t->held < comm ? t->held : comm;
    out[0] = compute;
    out[1] = comm - wait;
    out[2] = t->busy0 >= 0 && t->busy >= 0 ? wait : t->held;
    out[3] = t->data;
    out[4] = t->wall - t->data - t->exec;
}

/* ---- /metrics ---- */

void tr_job_init(tr_job *job)
{
    memset(job, 0, sizeof *job);
    job->resume_limit = -1;
}

void tr_train_prom(tr_job *job, pst_prom *r)
{
    tr_job_metrics *m = &job->metrics;
    static const char *const part[5] = {"compute", "communication", "waiting", "data",
                                        "other"};
    const char *help = "Training step time by where it went: compute, communication not "
                       "hidden by compute, waiting for the other trainers, data loading, other";
    m->steps = pst_prom_counter(r, "pstrain_trainer_steps_total", "Training steps run",
                                    NULL);
    m->samples_per_s = pst_prom_gauge(r, "pstrain_trainer_samples_per_second",
                                          "Global-batch samples per second in this epoch", NULL);
    m->loss = pst_prom_gauge(r, "pstrain_trainer_loss",
                                 "Mean loss of this trainer's examples in the last step", NULL);
    for (int k = 0; k < 5; k++) {
        char labels[32];
        snprintf(labels, sizeof labels, "part=\"%s\"", part[k]);
        m->parts[k] = pst_prom_counter(r, "pstrain_trainer_step_seconds_total", help, labels);
    }
    m->pushed = pst_prom_counter(r, "pstrain_trainer_pushed_bytes_total",
                                     "Gradient payload bytes pushed to the pservers", NULL);
    m->pulled = pst_prom_counter(r, "pstrain_trainer_pulled_bytes_total",
                                     "Parameter payload bytes pulled from the pservers", NULL);
}

/* After a step: the run's totals so far (`run` from its start) into the counters. */
static void prom_step(tr_job_metrics *m, const time_totals *run, double loss,
                      double samples_per_s, tr_link *link)
{
    if (!m->steps)
        return;
    pst_prom_add(m->steps, 1);
    pst_prom_set(m->loss, loss);
    pst_prom_set(m->samples_per_s, samples_per_s);
    double now[5];
    split_seconds(run, now);
    for (int k = 0; k < 5; k++)
        if (now[k] > m->published[k]) {
            pst_prom_add(m->parts[k], now[k] - m->published[k]);
            m->published[k] = now[k];
        }
    if (link->ops->traffic) {
        uint64_t pushed, pulled;
        link->ops->traffic(link, &pushed, &pulled);
        pst_prom_add(m->pushed, (double)(pushed - m->pushed_at));
        pst_prom_add(m->pulled, (double)(pulled - m->pulled_at));
        m->pushed_at = pushed;
        m->pulled_at = pulled;
    }
}

static tr_time_split split_of(const time_totals *t)
{
    tr_time_split s = {0};
    if (t->steps <= 0)
        return s;
    const double n = (double)t->steps / 1e3; /* seconds in total -> ms per step */
    double part[5];
    split_seconds(t, part);
    const int measured = t->busy0 >= 0 && t->busy >= 0;
    s.step = t->wall / n;
    s.compute = measured ? part[0] / n : -1;
    s.comm = measured ? part[1] / n : -1;
    s.wait = part[2] / n;
    s.data = part[3] / n;
    s.other = part[4] / n;
    return s;
}

static void split_log(const char *what, const tr_time_split *s, int alone)
{
    if (s->step <= 0)
        return;
    if (alone && s->compute >= 0) { /* no communication: the in-process store's update */
        const double pc = 100.0 / s->step;
        PST_INFO("%s: %.2f ms per step: compute %.2f ms (%.0f%%), the optimizer update and "
                 "copies %.2f ms (%.0f%%), data %.2f ms (%.0f%%), other %.2f ms (%.0f%%)", what,
                 s->step, s->compute, s->compute * pc, s->comm, s->comm * pc, s->data,
                 s->data * pc, s->other, s->other * pc);
        return;
    }
    const double pc = 100.0 / s->step;
    if (s->compute < 0)
        PST_INFO("%s: %.2f ms per step: compute and communication not measured on this "
                 "device, waiting for other trainers %.2f ms, data %.2f ms, other %.2f ms",
                 what, s->step, s->wait, s->data, s->other);
    else
        PST_INFO("%s: %.2f ms per step: compute %.2f ms (%.0f%%), communication not hidden "
                 "%.2f ms (%.0f%%), waiting for other trainers %.2f ms (%.0f%%), data %.2f ms "
                 "(%.0f%%), other %.2f ms (%.0f%%)", what, s->step, s->compute, s->compute * pc,
                 s->comm, s->comm * pc, s->wait, s->wait * pc, s->data, s->data * pc, s->other,
                 s->other * pc);
}

/* Asked to stop (SIGTERM) before step `step`: this trainer's exchanges of the step before
 * are completed, which gives it version `step` of every block, so every pserver holds
 * that version whole; trainer 0 then asks for a checkpoint of it in its Finish and, once
 * every shard is written, writes the job state: the job resumes at `step`. Sends the
 * early Finish in any case. */
static void stop_at_boundary(const pst_config *cfg, const tr_plan *plan, tr_exec *ex,
                             tr_link *link, const char *job_dir, long step, long first)
{
    const int ckpt = job_dir[0] && cfg->trainer_id == 0 && cfg->checkpoint_every > 0 &&
                     step > first;
    char why[600];
    snprintf(why, sizeof why, "stopped by signal");
    if (tr_exec_sync(ex) != PST_OK) {
        snprintf(why, sizeof why, "stopped by signal; no checkpoint: %s", pst_error_detail());
        link->ops->finish(link, 1, step, why);
        return;
    }
    long version; /* what the blocks hold: `step`, less the steps fp16 skipped */
    const tr_resume_state rs = tr_exec_state(ex, step, &version);
    if (ckpt)
        link->checkpoint_step = version;
    pst_status st = link->ops->finish(link, 1, step, why);
    if (!ckpt)
        return;
    if (st == PST_OK)
        st = tr_job_write(cfg, plan, job_dir, version, &rs);
    if (st == PST_OK)
        PST_INFO("stopped by signal: checkpoint of step %ld written", step);
    else
        PST_WARN("stopped by signal: no checkpoint of step %ld: %s", step, pst_error_detail());
}

/* --save-params: the n final parameters, raw f32, written to path.tmp then renamed, so that
 * path is whole or absent. */
static pst_status save_params(const char *path, const float *params, size_t n)
{
    char tmp[PST_PATH_MAX + 40];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return pst_error_set(PST_ERR_IO, "--save-params %s: cannot create %s: %s", path, tmp,
                             strerror(errno));
    const int ok = fwrite(params, sizeof(float), n, f) == n;
    const int e = errno;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        const int e2 = ok ? errno : e;
        unlink(tmp);
        return pst_error_set(PST_ERR_IO, "--save-params %s: cannot write it: %s", path,
                             strerror(e2));
    }
    return PST_OK;
}

/* "%t" in a --metrics, --trace or --save-params path is the trainer id: the trainers of a job are often
 * started with the same flags (pslaunch, one Job template) and each gets a file of its own
 * (a shared metrics file still holds whole lines: pst_metrics_write appends each at once). */
static void own_path(char *out, size_t size, const char *path, const pst_config *cfg)
{
    const char *t = strstr(path, "%t");
    if (t)
        snprintf(out, size, "%.*s%d%s", (int)(t - path), path, cfg->trainer_id, t + 2);
    else
        snprintf(out, size, "%s", path);
}

/* The summary's devices: peak memory of each, the precision and its loss scaling, and the
 * bytes of parameters and optimizer state each device's process holds. */
static void summarize_devices(tr_summary *sum, const pst_config *cfg, const tr_exec *ex, int D)
{
    sum->ndevices = D < PST_DEVICE_MAX_COUNT ? D : PST_DEVICE_MAX_COUNT;
    for (int i = 0; i < sum->ndevices; i++)
        sum->memory[i] = tr_exec_memory_of(ex, i);
    sum->precision = cfg->precision;
    sum->loss_scale = tr_exec_loss_scale(ex);
    sum->skipped_steps = tr_exec_skipped(ex, NULL);
    /* Alone, the in-process store holds the optimizer state, and in bf16/fp16 the fp32
     * master beside the devices' copy; with pservers the trainer holds neither. */
    sum->optimizer_bytes_per_device =
        cfg->num_pservers ? 0
                          : tr_exec_nparams(ex) * sizeof(float) *
                                ((size_t)pst_optim_state_floats(cfg->optim.kind) +
                                 (cfg->precision != PST_F32));
}

pst_status tr_train(tr_job *job, const pst_config *user_cfg, const tr_test_hooks *hooks,
                    tr_summary *sum)
{
    pst_status st;
    pst_config run_cfg = *user_cfg; /* gets the run's length, below */
    const pst_config *cfg = &run_cfg;
    pst_dataset train = {0}, test = {0};
    pst_text text = {0};
    pst_model model = {0};
    pst_runtime *rt = NULL;
    pst_metrics metrics = {0};
    tr_plan plan = {0};
    tr_remote *remote = NULL;
    tr_link *link = NULL;
    tr_trace *trace = NULL;
    tr_exec *ex = NULL;
    void *x = NULL;
    float *params = NULL;
    int32_t *y = NULL;
    uint32_t *perm = NULL;
    double *step_ms = NULL;
    int started = 0, joining = 0;
    long step = -1;
    if (!strcmp(user_cfg->model, "dlrm")) /* the click model's loop (ctr.c) */
        return tr_train_ctr(job, user_cfg, hooks, sum);
    memset(sum, 0, sizeof *sum);
    sum->first_step = -1;

    if ((st = pst_runtime_init(&rt, cfg->devices)) != PST_OK)
        goto error;
    const int D = pst_runtime_count(rt);
    for (int i = 0; i < D; i++)
        pst_device_set_memory_limit(pst_runtime_device(rt, i), cfg->device_memory_limit);
    char metrics_path[PST_PATH_MAX + 32], trace_path[PST_PATH_MAX + 32];
    own_path(metrics_path, sizeof metrics_path, cfg->metrics_path, cfg);
    own_path(trace_path, sizeof trace_path, cfg->trace_path, cfg);
    if ((st = pst_metrics_open(&metrics, metrics_path)) != PST_OK)
        goto error;
    const int data = pst_model_reads_data(cfg);
    const int is_text = data && pst_config_text_data(cfg);
    if (is_text && (st = pst_text_load(&text, cfg->data_dir, cfg->ctx)) != PST_OK)
        goto error;
    if (data && !is_text &&
        (st = pst_dataset_load(&train, &test, cfg->dataset, cfg->data_dir)) != PST_OK)
        goto error;
    if ((st = pst_model_from_config(&model, cfg, is_text ? cfg->ctx : train.dim,
                                    is_text ? text.vocab
                                    : train.nclasses > test.nclasses ? train.nclasses
                                                                     : test.nclasses)) != PST_OK)
        goto error;
    const int row_in = model.in_width > 0 ? model.in_width : 1;

    const int T = cfg->trainers, rank = cfg->trainer_id, B = cfg->batch;
    const int max_part = (B + T - 1) / T;
    /* With data: --epochs over the training set, or --steps if fewer. Without: --steps, or
     * 20 per epoch, as one epoch. */
    /* Text: --steps windows drawn at random, as one epoch. */
    const int images = data && !is_text;
    long total = images ? (long)pst_batches_per_epoch(train.n, B) * cfg->epochs
                        : cfg->steps > 0 ? cfg->steps : 20L * cfg->epochs;
    if (images && cfg->steps > 0 && cfg->steps < total)
        total = cfg->steps;
    const int epochs = images ? cfg->epochs : 1;
    const long nb = images ? pst_batches_per_epoch(train.n, B) : total;
    /* warmup_cosine reaches --min-lr at the last step: every optimizer (the executor's,
     * the pservers' through Init) needs the run's length. */
    run_cfg.optim.total_steps = total;
    /* One plan for the executor and the link: the pservers', or one store's in-process. */
    const size_t block_bytes = tr_plan_pipelined_bytes(model.nparams, cfg->block_bytes,
                                                       cfg->num_pservers);
    /* A pipeline's blocks never span two stages: each stage holds and sends its own. */
    const tr_exec_settings exec_settings = tr_exec_settings_of(cfg);
    if ((st = tr_exec_plan(&plan, &model, &exec_settings, block_bytes,
                           cfg->num_pservers ? cfg->num_pservers : 1, D)) != PST_OK)
        goto error;
    const tr_link_settings link_settings = tr_link_settings_of(cfg, &plan);
    if (cfg->num_pservers) {
        if ((st = tr_remote_init(&remote, &link_settings, &plan)) != PST_OK)
            goto error;
        link = tr_remote_link(remote);
    } else if ((st = tr_local_init(&link, &link_settings, &plan)) != PST_OK) {
        goto error;
    }
    char job_dir[PST_PATH_MAX + PST_JOB_ID_MAX + 32] = "";
    int64_t candidates[TR_RESUME_CANDIDATES];
    tr_resume_state candidate_states[TR_RESUME_CANDIDATES];
    long newest = 0; /* the newest job checkpoint's step, whole or not */
    if ((st = tr_job_checkpoints(job, cfg, &plan, link_settings.job_id, link, job_dir,
                                sizeof job_dir, candidates, candidate_states, &newest)) !=
        PST_OK)
        goto error;
    if (trace_path[0]) {
        long steps = cfg->trace_last - cfg->trace_first + 1;
        size_t per_step = (size_t)(D * 2 * model.nlayers + 4 * 1024 + 64);
        if ((st = tr_trace_init(&trace, trace_path, cfg->trace_first, cfg->trace_last,
                                per_step * (size_t)steps)) != PST_OK)
            goto error;
    }
    /* The cores are shared by the devices: each device splits its layers and optimizer
     * over its share, a thread team of its own (OpenBLAS is single-threaded, see main.c). */
    const int threads_per_device = tr_threads_per_device(cfg, D);
    /* a sequence model's rows are large: evaluate in batches of the training rows */
    tr_exec_config ec = {.cfg = exec_settings, .rt = rt, .model = &model,
                         .max_rows = max_part,
                         .eval_rows = is_text ? max_part : 256, .link = link,
                         .overlap = cfg->overlap,
                         .threads = threads_per_device,
                         .trace = trace, .hooks = hooks};
    if ((st = tr_exec_init(&ex, &ec)) != PST_OK)
        goto error;

    x = malloc(sizeof(float) * (size_t)max_part * (size_t)row_in); /* floats or int32 tokens */
    y = malloc(sizeof(int32_t) * (size_t)max_part * (size_t)model.target_width);
    perm = malloc(sizeof(uint32_t) * (size_t)(train.n ? train.n : 1));
    step_ms = malloc(sizeof(double) * (size_t)(total > 0 ? total : 1));
    params = malloc(sizeof(float) * tr_exec_nparams(ex));
    if (!x || !y || !perm || !step_ms || !params) {
        st = pst_error_set(PST_ERR_NOMEM, "trainer: out of memory for batch buffers");
        goto error;
    }
    joining = 1; /* a failed start still tells the pservers this trainer is gone */
    if ((st = tr_exec_start(ex, cfg->seed)) != PST_OK)
        goto error;
    started = 1;
    int asked_stop = 0; /* 1: trainer 0 was asked to stop the job (ask_stop) */
    /* a resumed job's first step: its version, or past it when fp16 skipped steps before */
    const long first = link->has_start_state ? (long)link->start_state.next_step
                                             : (long)link->start_version;
    long job_version = (long)link->start_version; /* of the newest job state written */
    if ((st = tr_job_check_resume(cfg, link, job_dir, newest, first, total)) != PST_OK)
        goto error;
    if (first > 0)
        PST_INFO("resuming at step %ld of %ld", first, total);
    step = first;
    sum->first_step = first;

    time_totals run_time = {0};
    /* A new run (a recovery's): its totals and traffic start from 0, the counters go on. */
    for (int k = 0; k < 5; k++)
        job->metrics.published[k] = 0;
    job->metrics.pushed_at = job->metrics.pulled_at = 0;
    {
        double held;
        tr_exec_time_counters(ex, &run_time.busy0, &held); /* the start's pulls: not a step */
        run_time.busy = run_time.busy0;
    }
    const int tty = cfg->progress == PST_PROGRESS_BAR ||
                    (cfg->progress == PST_PROGRESS_AUTO && isatty(STDERR_FILENO));
    const int lines = cfg->progress != PST_PROGRESS_NONE;
    double train_time = 0.0, last_loss = 0.0, test_acc = 0.0;
    size_t samples = 0;
    for (int epoch = (int)(first / nb); epoch < epochs && step < total; epoch++) {
        double t_epoch = pst_clock_s(), t_bar = 0.0, loss_sum = 0.0;
        long loss_n = 0;
        time_totals epoch_time = {.busy0 = run_time.busy, .busy = run_time.busy};
        double t_step = pst_clock_s(); /* this step's start: the last one's end */
        size_t epoch_samples = 0;
        if (images)
            pst_epoch_order(perm, train.n, cfg->seed, epoch);
        for (long b = step - (long)epoch * nb; b < nb && step < total; b++, step++) {
            pst_log_set_step(step);
            long start = b * B;
            int len = images && train.n - start < B ? (int)(train.n - start) : B, lo, hi;
            pst_batch_part(len, rank, T, &lo, &hi);
            int cnt = hi - lo;
            if (images)
                pst_dataset_gather(&train, perm + start + lo, cnt, x, y);
            else if (is_text)
                pst_text_train_rows(&text, cfg->ctx, cfg->seed, step, B, lo, hi, x, y);
            const double t_data = pst_clock_s(); /* the batch is gathered */
            if (first == 0) /* a run resumed from a checkpoint goes past the crash hook */
                tr_test_hooks_step(hooks, step);
            double t0 = pst_clock_s(), loss = 0.0;
            const float step_scale = tr_exec_loss_scale(ex);
            long version; /* the blocks' version this step computes with */
            const tr_resume_state before = tr_exec_state(ex, step, &version);
            /* SIGTERM to a trainer other than 0 of a job with checkpoints: trainer 0 is asked
             * (through pserver 0) to stop the job at its next step with a checkpoint; this
             * trainer trains on until then. */
            if (tr_stop_requested() && !asked_stop && cfg->trainer_id != 0 && job_dir[0] &&
                cfg->checkpoint_every > 0 && link->ops->ask_stop) {
                asked_stop = link->ops->ask_stop(link) == PST_OK ? 1 : -1;
                if (asked_stop > 0)
                    PST_INFO("asked to stop: trainer 0 stops the job at its next step, with a "
                             "checkpoint; training on until then");
                else
                    PST_WARN("asked to stop: cannot ask trainer 0 to stop the job (%s); "
                             "leaving it now", pst_error_detail());
            }
            const int told = __atomic_load_n(&link->stop_asked, __ATOMIC_ACQUIRE);
            if ((tr_stop_requested() && asked_stop <= 0) || told) {
                stop_at_boundary(cfg, &plan, ex, link, job_dir, step, first);
                started = joining = 0; /* its Finish is sent */
                st = tr_stop_requested() ? check_stop()
                                         : pst_error_set(PST_ERR_STATE, "stopped: a process "
                                                         "of the job was asked to stop (see "
                                                         "the pservers' logs)");
                goto error;
            }
            if ((st = tr_exec_step(ex, step, data ? x : NULL, data ? y : NULL, cnt, len,
                                   &loss)) != PST_OK)
                goto error;
            double busy, held;
            const double t_exec = pst_clock_s();
            tr_exec_time_counters(ex, &busy, &held);
            /* Step `step` computed with `version` of every block (the step itself, less the
             * steps fp16 skipped), whose pulls the pservers answer only once their shard of
             * it is written: the job's state before the first step on that version
             * completes the checkpoint. */
            if (job_dir[0] && rank == 0 && cfg->checkpoint_every > 0 && version > job_version &&
                version % cfg->checkpoint_every == 0) {
                if ((st = tr_job_write(cfg, &plan, job_dir, version, &before)) != PST_OK)
                    goto error;
                job_version = version;
            }
            double t1 = pst_clock_s();
            loss_sum += loss;
            loss_n += cnt;
            step_ms[step] = 1e3 * (t1 - t0);
            epoch_samples += (size_t)len;
            char fp16[64] = ""; /* the loss scale this step used, and its fate */
            if (cfg->precision == PST_F16) {
                int skipped = 0;
                tr_exec_skipped(ex, &skipped);
                snprintf(fp16, sizeof fp16, ",\"loss_scale\":%.9g,\"skipped\":%d",
                         (double)step_scale, skipped);
            }
            pst_metrics_write(&metrics, "step",
                              "\"step\":%ld,\"epoch\":%d,\"loss\":%.6f,\"ms\":%.3f,"
                              "\"data_ms\":%.3f,\"held_ms\":%.3f%s", step, epoch + 1,
                              cnt ? loss / cnt : 0.0, step_ms[step], 1e3 * (t_data - t_step),
                              1e3 * held, fp16);
            if (tty && (t1 - t_bar > 0.1 || b == nb - 1)) {
                t_bar = t1;
                progress_bar(epoch + 1, epochs, (int)(b + 1), (int)nb,
                             loss_n ? loss_sum / (double)loss_n : 0.0,
                             (double)epoch_samples / (t1 - t_epoch));
            }
            const double t_end = pst_clock_s();
            for (time_totals *tt = &run_time; tt; tt = tt == &run_time ? &epoch_time : NULL) {
                tt->steps++;
                tt->wall += t_end - t_step;
                tt->data += t_data - t_step;
                tt->exec += t_exec - t0;
                tt->held += held;
                tt->busy = busy;
            }
            t_step = t_end;
            prom_step(&job->metrics, &run_time, cnt ? loss / cnt : 0.0,
                      (double)epoch_samples / (t_end - t_epoch), link);
        }
        if ((st = tr_exec_sync(ex)) != PST_OK)
            goto error;
        double dt = pst_clock_s() - t_epoch;
        train_time += dt;
        samples += epoch_samples;
        last_loss = loss_n ? loss_sum / (double)loss_n : 0.0;
        if (images && (st = tr_exec_evaluate(ex, &test, &test_acc)) != PST_OK)
            goto error;
        if (is_text && (st = text_validate(ex, &text, cfg, max_part, x, y, &sum->val_loss,
                                           &test_acc)) != PST_OK)
            goto error;
        if (tty)
            fputc('\n', stderr);
        if (lines) {
            const tr_time_split es = split_of(&epoch_time);
            char what[48];
            snprintf(what, sizeof what, "epoch %d/%d time", epoch + 1, epochs);
            split_log(what, &es, cfg->num_pservers == 0);
        }
        if (lines && is_text)
            PST_INFO("%ld steps: train_loss %.4f val_loss %.4f %.0f tokens/s", step, last_loss,
                     sum->val_loss, (double)epoch_samples * cfg->ctx / dt);
        else if (lines)
            PST_INFO("epoch %d/%d: train_loss %.4f test_acc %.4f %.0f samples/s", epoch + 1,
                     epochs, last_loss, test_acc, (double)epoch_samples / dt);
        pst_metrics_write(&metrics, "epoch",
                          "\"epoch\":%d,\"train_loss\":%.6f,\"test_acc\":%.4f,\"samples_per_s\":%.1f",
                          epoch + 1, last_loss, test_acc, (double)epoch_samples / dt);
    }
    pst_log_set_step(-1);
    if ((st = tr_exec_sync(ex)) != PST_OK || (st = tr_exec_params(ex, params)) != PST_OK)
        goto error;
    long version;
    const tr_resume_state end = tr_exec_state(ex, step, &version);
    if (job_dir[0] && rank == 0 && cfg->checkpoint_every > 0 && version > job_version &&
        version % cfg->checkpoint_every == 0 &&
        (st = tr_job_write(cfg, &plan, job_dir, version, &end)) != PST_OK)
        goto error;
    if (is_text && cfg->sample > 0 && rank == 0 && (st = text_sample(ex, &text, cfg)) != PST_OK)
        goto error;
    sum->test_acc = test_acc;
    sum->train_loss = last_loss;
    sum->samples_per_s = train_time > 0 ? (double)samples / train_time : 0.0;
    sum->text = is_text;
    sum->tokens_per_s = is_text ? sum->samples_per_s * cfg->ctx : 0.0;
    sum->step_ms_median = tr_median(step_ms + first, step - first);
    sum->time_split = split_of(&run_time);
    if (lines && epochs > 1)
        split_log("the run's time", &sum->time_split, cfg->num_pservers == 0);
    sum->steps = step;
    tr_summary_params(sum, params, tr_exec_nparams(ex));
    if (cfg->save_params_path[0]) {
        char path[PST_PATH_MAX + 32];
        own_path(path, sizeof path, cfg->save_params_path, cfg);
        if ((st = save_params(path, params, tr_exec_nparams(ex))) != PST_OK)
            goto error;
    }
    summarize_devices(sum, cfg, ex, D);
    if (trace && (st = tr_trace_write(trace)) != PST_OK)
        goto error;
    st = link->ops->finish(link, 0, step, NULL);
    started = joining = 0;
error:
    if (st != PST_OK)
        sum->steps = step;
    if (link && link->versions_differ && cfg->trainer_id == 0) {
        job->resume_limit = (long)link->start_version;
        PST_WARN("the next run offers the pservers checkpoints up to step %ld",
                 job->resume_limit);
    }
    /* (A start that failed for want of a pserver has no one to tell, except, when this
     * process starts again at once, the pservers it did join: tr_remote_finish.) */
    const int rejoins = link && cfg->on_failure == PST_ON_FAILURE_WAIT && tr_recoverable(st);
    if (started || (joining && ((st != PST_ERR_UNAVAILABLE && st != PST_ERR_TIMEOUT &&
                                 st != PST_ERR_AUTH) || rejoins))) {
        /* Leaving early: the pservers tell the other trainers at once, with the reason. */
        char keep[512];
        snprintf(keep, sizeof keep, "%s", pst_error_detail());
        link->rejoins = rejoins;
        link->ops->finish(link, 1, started ? step : -1, keep);
        pst_error_set(st, "%s", keep);
    }
    tr_exec_free(ex);
    tr_link_free(link);
    tr_plan_free(&plan);
    tr_trace_free(trace);
    pst_metrics_close(&metrics);
    PST_FREE_ALL(x, y, perm, step_ms, params);
    pst_model_free(&model);
    pst_dataset_free(&train);
    pst_dataset_free(&test);
    pst_text_free(&text);
    pst_runtime_free(rt);
    return st;
}
