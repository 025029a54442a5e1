/* train.h — the trainer's training loop, shared by local and distributed training.
 *
 * The loop owns the data, the model and the progress/metrics output; what turns a
 * gradient into new parameters is an updater: local mode applies the optimizer in this
 * process, distributed mode pushes gradient blocks to the pservers and pulls the new
 * values. Either way the model's flat `params` holds the new values when update returns. */
#ifndef TR_TRAIN_H
#define TR_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/error.h"
#include "common/runtime/device.h"

typedef struct tr_updater {
    void *self;
    /* Turns grads (n floats, the gradient of the global batch's mean loss, or this
     * trainer's share of it) into new params for 0-based `step`. */
    pst_status (*update)(void *self, long step, float *params, const float *grads, size_t n);
    /* Called once before step 0 with the initial params (trainer 0's values are the
     * cluster's; others may receive them). May be NULL. */
    pst_status (*start)(void *self, float *params, size_t n);
    /* Called once after the last step, on success and failure alike. May be NULL. */
    pst_status (*finish)(void *self);
} tr_updater;

typedef struct tr_summary {
    double test_acc;
    double train_loss;     /* mean loss of this trainer's examples in the last epoch run */
    double samples_per_s;  /* global-batch samples per second of training wall time */
    double step_ms_median; /* forward + backward + update */
    long steps;
    size_t params;
    double param_l2;
    uint64_t param_hash;   /* FNV-1a of the parameters' bytes (host float layout): equal
                            * hashes mean bit-identical parameters */
    int ndevices;
    size_t peak_bytes[PST_DEVICE_MAX_COUNT]; /* per local device */
} tr_summary;

/* The local optimizer as an updater (the same optimizer code the pserver runs), its
 * elementwise pass split over `threads` threads; its state is allocated at start.
 * `*out` is freed with tr_local_updater_free. Errors: PST_ERR_NOMEM, PST_ERR_IO. */
/* The synthetic model's run length: --steps, or 20 steps per epoch. */
long tr_synthetic_steps(const pst_config *cfg);
pst_status tr_local_updater_init(tr_updater *out, const pst_optim_config *optim, int threads);
void tr_local_updater_free(tr_updater *u);

/* Trains the mlp model the config describes on the trainer's devices (the executor,
 * exec.h), alone or with the configured pservers. Prints progress on stderr and fills
 * *sum. Errors: device, data, allocation or pserver failures, with their detail. */
pst_status tr_train(const pst_config *cfg, tr_summary *sum);
/* Trains the synthetic model (no compute) through `upd`. */
pst_status tr_train_synthetic(const pst_config *cfg, tr_updater *upd, tr_summary *sum);

/* Asks a running tr_train/tr_train_synthetic to stop after the current step (it then
 * returns PST_ERR_STATE "stopped by signal"). Async-signal-safe: main() calls it from its
 * SIGTERM/SIGINT handler, so a trainer that is PID 1 in a container stops when asked. */
void tr_request_stop(void);

/* One JSON line: {"event":"summary",...}. */
void tr_summary_print(FILE *out, const tr_summary *s);

#endif /* TR_TRAIN_H */
