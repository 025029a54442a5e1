/* train.h — the trainer's training loop, shared by local and distributed training and by
 * every model: it owns the data, the batches and the progress/metrics output, and hands
 * each step to the executor (exec.h). */
#ifndef TR_TRAIN_H
#define TR_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include "common/config.h"
#include "common/error.h"
#include "common/runtime/device.h"
#include "trainer/exec.h"
#include "trainer/link.h"
#include "trainer/test_hooks.h"

/* Where the time of the training steps went (means per step, ms; see tr_time_split). */
typedef struct tr_time_split {
    double step;          /* wall time of a step: the parts add up to it */
    double compute;       /* the busiest device's compute stream running (-1: a device
                           * whose backend does not measure it; comm below is then -1 too) */
    double comm;          /* communication not hidden by compute: the rest of the
                           * executor's time, less `wait` (alone: the in-process update) */
    double wait;          /* the pservers held the pulls for the other trainers (sync) */
    double data;          /* the batch gathered from the data set */
    double other;         /* the rest: the loop's own work (metrics, progress, checks) */
} tr_time_split;

typedef struct tr_summary {
    double test_acc;       /* text: the share of validation tokens predicted (argmax) */
    double train_loss;     /* mean loss of this trainer's examples in the last epoch run */
    int text;              /* 1: a language model; val_loss and tokens_per_s below */
    double val_loss;       /* mean loss over the validation windows */
    double tokens_per_s;
    double samples_per_s;  /* global-batch samples per second of training wall time */
    double step_ms_median; /* forward + backward + update */
    long steps;
    size_t params;
    double param_l2;
    uint64_t param_hash;   /* FNV-1a of the parameters' bytes (host float layout): equal
                            * hashes mean bit-identical parameters */
    int ndevices;
    tr_exec_memory memory[PST_DEVICE_MAX_COUNT]; /* per local device (stage) */
    pst_dtype precision;   /* of the parameters on the devices */
    size_t optimizer_bytes_per_device; /* optimizer state (and fp32 master) the trainer
                                        * holds: 0 with pservers; alone, the in-process
                                        * store's (host memory, counted once) */
    float loss_scale;      /* fp16: the dynamic loss scale at the end */
    long skipped_steps;    /* fp16: steps skipped everywhere for an overflow */
    tr_time_split time_split; /* over the run's steps */
    long first_step;       /* the step this run started at (a resumed job's: > 0); set on
                            * failure too, with `steps` the step it failed in (-1: before
                            * the start) */
    int ctr;               /* 1: the click model; the fields below */
    double test_auc, test_logloss, auc_gap; /* on the file's test part; auc_gap: the file's
                                            * Bayes-optimal AUC minus ours */
    size_t rows_touched;   /* sparse rows made (a key made again after eviction counts
                            * again) */
    size_t rows_evicted;   /* removed: unseen for --sparse-evict-after, or the row budget */
    size_t pushes_refused; /* pushed keys not yet admitted (--sparse-admit-count) */
    size_t table_rows, table_bytes; /* the sparse table at the end */
    uint64_t sparse_hash;  /* pst_sparse_hash of the table (all pservers' shards); the
                            * click model's param_hash covers it too */
    double key_balance;    /* with pservers: the largest pserver's share of the keys over
                            * the mean share (1: even); 0 alone */
} tr_summary;

struct pst_prom_metric;

/* The trainer's /metrics (tr_train_prom), and how much of the current run they hold. */
typedef struct tr_job_metrics {
    struct pst_prom_metric *steps, *samples_per_s, *loss, *parts[5], *pushed, *pulled;
    double published[5];           /* the parts' seconds already added (counters only rise) */
    uint64_t pushed_at, pulled_at; /* the current run's traffic already added */
} tr_job_metrics;

/* What outlives one tr_train: a process's runs are attempts at one job (--on-failure wait
 * starts it again, main.c). Owned by the caller; tr_job_init before the first run. */
typedef struct tr_job {
    /* Trainer 0 offers no job checkpoint newer than this (-1: any): the pservers of a run
     * disagreed on the newest one they hold whole (tr_link.versions_differ), and the next
     * run falls back to what they all have. */
    long resume_limit;
    tr_job_metrics metrics; /* zero: no /metrics */
} tr_job;

void tr_job_init(tr_job *job);

/* Trains the model the config names (models.h) on the trainer's devices through the
 * executor (exec.h), alone or with the configured pservers. A model that reads data gets
 * the configured data set, --epochs over it (or --steps) and a test accuracy per epoch (a
 * text data set: --steps of windows drawn at random, then the validation loss); the
 * synthetic model runs --steps (or 20 per epoch) steps of --batch rows and no evaluation.
 * Prints progress on stderr and fills *sum. job: what outlives the run (tr_job); hooks:
 * the tests' faults (test_hooks.h), NULL: none. Errors: device, data, allocation or pserver failures, with their detail. */
/* The CPU threads of each of D devices: --threads (0: the machine's cores) shared by them,
 * at least 1 (OpenBLAS itself runs single-threaded, see main.c). */
static inline int tr_threads_per_device(const pst_config *cfg, int D)
{
    const int cores = cfg->threads > 0 ? cfg->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    return cores / D > 0 ? cores / D : 1;
}
/* Median of v[0..n) (sorts v); 0 for n == 0. */
double tr_median(double *v, long n);
/* The summary's view of the final parameters: their count, L2 norm and param_hash. */
void tr_summary_params(tr_summary *sum, const float *params, size_t n);
/* --model dlrm (ctr.c): trains the click model on the --data click file, one pass per
 * epoch in file order (global batches of --batch rows, each trainer its slice), its
 * sparse rows in an in-process table alone or on the pservers; then the AUC and log loss
 * on the file's test part. hooks: the tests' crash (test_hooks.h), NULL: none. */
pst_status tr_train_ctr(tr_job *job, const pst_config *cfg, const tr_test_hooks *hooks,
                        tr_summary *sum);

/* The job state of checkpoints (job.c), trainer 0's files DIR/<job_id>/job/step-<s>.ckpt.
 * tr_job_checkpoints: the pservers (or the in-process store) write their shards every
 * --checkpoint-every steps; trainer 0 the job state into job_dir (set here: empty without
 * --checkpoint-dir, or in async mode); a resumed job starts from the newest checkpoint
 * every one of them has whole. Trainer 0 lists the candidates (candidates and states, of
 * TR_RESUME_CANDIDATES each, which the link keeps pointers to: they must outlive it) and
 * *newest, the newest job checkpoint's step, whole or not. job_id: the links'
 * (tr_link_settings), made once. Errors: PST_ERR_MISMATCH (a checkpoint of the --job-id
 * named with other settings). */
#define TR_RESUME_CANDIDATES 64
pst_status tr_job_checkpoints(tr_job *job, const pst_config *cfg, const tr_plan *plan,
                              const char *job_id, tr_link *link, char *job_dir, size_t dir_size,
                              int64_t *candidates, tr_resume_state *states, long *newest);
/* The job state of version `version` (every shard of it whole: the pservers write theirs
 * before answering the pulls a step computes with), and where the trainers stand then, rs
 * (the step to run next, past the version when fp16 skipped steps, and the scaler); the
 * --checkpoint-keep newest kept. */
pst_status tr_job_write(const pst_config *cfg, const tr_plan *plan, const char *dir,
                        long version, const tr_resume_state *rs);
/* Whether the job may start at step `first` of `total`: --resume require wants the
 * checkpoint it names (trainer 0), and a resumed job cannot start past its end. */
pst_status tr_job_check_resume(const pst_config *cfg, const tr_link *link, const char *job_dir,
                               long newest, long first, long total);
pst_status tr_train(tr_job *job, const pst_config *cfg, const tr_test_hooks *hooks,
                    tr_summary *sum);

/* Asks a running tr_train to stop after the current step (it then
 * returns PST_ERR_STATE "stopped by signal"). Async-signal-safe: main() calls it from its
 * SIGTERM/SIGINT handler, so a trainer that is PID 1 in a container stops when asked. */
void tr_request_stop(void);
/* Whether tr_request_stop was called. */
int tr_stop_requested(void);
/* Whether a run that failed with st is one --on-failure wait starts again: a peer lost or
 * restarting (its calls unavailable or past their deadline, the job departed, a push the
 * pserver no longer expects). Not: bad configuration or data, a checkpoint that cannot be
 * written, a signal. */
int tr_recoverable(pst_status st);

/* /metrics (common/prom.h): registers the trainer's metrics in r and job, which every later
 * tr_train of job updates as it trains (steps, loss, samples/s, the time split, bytes pushed and
 * pulled). Call once, before tr_train. */
struct pst_prom;
void tr_train_prom(tr_job *job, struct pst_prom *r);

/* One JSON line: {"event":"summary",...}. */
void tr_summary_print(FILE *out, const tr_summary *s);

#endif /* TR_TRAIN_H */
