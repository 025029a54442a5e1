/* link.h — how a trainer's executor turns a block's gradient into the block's new values:
 * the link interface. Two links implement it: the pservers over gRPC (remote.h) and, for
 * training alone, an in-process parameter store running the pserver's own store code
 * (local.h). The executor (exec.h) speaks only to this interface, so local and distributed
 * training take one exchange path and one optimizer path (the store's).
 *
 * An exchange of block b for 0-based step s hands the link the block's gradient (the sum
 * of this trainer's devices) and gets back the block's values after update s+1. `done`
 * runs once per exchange, when the values have landed and the gradient is no longer read,
 * on whatever thread finished it (an RPC thread; the calling thread for the local link).
 * Both links build nothing of their own from the model: the block plan (plan.h) is built
 * once by the caller and shared. Thread safety: exchanges of different blocks may be
 * started from any threads; one exchange per block at a time. */
#ifndef TR_LINK_H
#define TR_LINK_H

#include <stdint.h>

#include "common/config.h"
#include "common/error.h"
#include "trainer/plan.h"

struct pst_pool;
struct pst_sparse_config;
typedef struct tr_link tr_link;

/* The job's settings a link reads, and only those (tr_link_settings_of takes them from
 * the job's pst_config and the plan; the strings point into the configuration, which
 * outlives the link). */
typedef struct tr_link_settings {
    int trainer_id, trainers;           /* this trainer, of T */
    pst_mode mode;
    pst_dtype precision, grad_dtype;    /* the job's parameters; the pushed gradients */
    pst_optim_config optim;
    uint64_t settings_fingerprint;      /* tr_settings_fingerprint: what a resume shares */
    char job_id[PST_JOB_ID_MAX + 24];   /* tr_job_id: names the job's checkpoints */
    /* The pservers (remote.c). */
    int num_pservers;
    const char (*pservers)[PST_ADDR_MAX];
    size_t send_window;
    int send_ahead;
    int shm;                            /* sync payloads through shared memory on one host */
    int chain_len;                      /* a chain of trainers (chain.h): its relays' */
    const char (*chain)[PST_ADDR_MAX];  /* addresses, one per trainer; 0: none */
    long rpc_timeout_ms, connect_timeout_ms, peer_timeout_ms;
    const char *token, *tls_ca, *tls_client_cert, *tls_client_key;
    /* The job's sparse tables (pserver/sparse.h; the caller's array, which outlives the
     * link): every pserver makes its shard of each at trainer 0's Init. */
    const struct pst_sparse_config *sparse_tables;
    int nsparse_tables;
    /* Checkpoints of the in-process store (local.c; the pservers write their own). */
    const char *checkpoint_dir;         /* "": none */
    int checkpoint_keep;
} tr_link_settings;

/* A link's settings from the job's configuration and its block plan. */
tr_link_settings tr_link_settings_of(const pst_config *cfg, const tr_plan *plan);

/* A job's sparse tables as the link last saw them (the pservers': their Finish replies,
 * summed; 0 before): rows and bytes held, rows made and evicted, pushes refused before
 * admission, and the sum of their pst_sparse_hash. */
typedef struct tr_sparse_totals {
    uint64_t rows, bytes, created, evicted, refused;
    uint64_t hash;
} tr_sparse_totals;

/* Called once per exchange when it has finished; `detail` describes a failure. */
typedef void (*tr_exchange_fn)(void *arg, pst_status st, const char *detail);

/* When the last exchange of a block sent and answered its push and pull (CLOCK_MONOTONIC
 * seconds; the local link: the update and the copy out); read it in the done callback,
 * for traces. */
typedef struct tr_exchange_times {
    double push_start, push_end, pull_start, pull_end;
    double held;    /* seconds the pserver held the pull for the other trainers' pushes and
                     * the update (PullReply.held_us; the local link: 0) */
} tr_exchange_times;

typedef struct tr_link_ops {
    /* Makes every trainer start from the same parameters: params holds this trainer's
     * initial values and, on return, the job's (trainer 0's), in f32. homes (may be NULL,
     * and is NULL unless the precision is f32): per
     * block, host-addressable memory that holds the block's values on its owner device;
     * an in-process link then keeps its master values there and writes each update in
     * place (the exchange's dst is not written). pool (may be NULL): threads an
     * in-process update may split over. Blocking. */
    pst_status (*start)(tr_link *l, float *params, float *const *homes, struct pst_pool *pool);
    /* Starts the exchange of block b for step `step`: grad[0..len) (f32, the sum of the
     * trainer's devices) is kept alive and unchanged until done runs; it travels as
     * --grad-dtype, scaled by `scale` (fp16 loss scaling: a power of two the update divides
     * out; 1 otherwise). The new values land in dst[0..len) in the job's precision (f32, or
     * bf16/f16 from the pserver's copy, cast once per update). */
    pst_status (*exchange)(tr_link *l, int b, long step, const float *grad, float scale,
                           void *dst, tr_exchange_fn done, void *arg);
    /* Optional (NULL: not offered), in-process links of one trainer in fp32 only: applies
     * this step's update to elements [first, first + n) of block b from grad[0..n) now, on
     * the calling thread, while the gradient is still in its cache. Once every element of
     * the block had its slice, the block's exchange of the step only completes the update
     * (its grad is not read again). Thread safe for disjoint ranges. An error (a NaN or an
     * infinity) is also reported by that exchange. */
    pst_status (*update_slice)(tr_link *l, int b, uint64_t first, uint64_t n,
                               const float *grad);
    /* fp16 loss scaling: this trainer's gradient of (0-based) `step` overflowed or not;
     * *skip is set to whether ANY trainer's did, the same answer for every trainer, so the
     * step is skipped everywhere (no block exchanged, nothing updated). Blocking, with a
     * deadline. */
    pst_status (*vote)(tr_link *l, long step, int overflow, int *skip);
    void (*times)(const tr_link *l, int b, tr_exchange_times *out);
    /* Ends the job on the link's side (Finish on every pserver). early != 0: this trainer
     * leaves before the job's end, at (0-based) `step` (-1: before step 0, e.g. its Init
     * was refused), for `reason`; the pservers then fail the other trainers' waiting pulls
     * at once with that reason instead of letting them wait for their deadline. */
    pst_status (*finish)(tr_link *l, int early, long step, const char *reason);
    /* The longest the pservers held one of this trainer's pulls for the other trainers'
     * pushes and the update (tr_exchange_times.held) since the last call, which resets it;
     * NULL: never (training alone). Thread safe. */
    double (*take_held)(tr_link *l);
    /* Payload bytes pushed and pulled so far; NULL: none (training alone). Thread safe. */
    void (*traffic)(tr_link *l, uint64_t *pushed, uint64_t *pulled);
    /* Sparse tables (the settings' sparse_tables; NULL: the link has none to offer). Keys
     * are ordered by the pserver that holds them (pst_sparse_pserver_of over the link's
     * shards, max(1, num_pservers)): keys[seg[s], seg[s + 1]) are shard s's, and so are
     * their rows (dim f32 each) in rows. Pull: the rows as of `step` (sync: once every
     * trainer's push of step - 1 is applied). Push: this trainer's summed gradient rows of
     * `step`, the keys of each shard unique and ascending (every shard gets one, no keys
     * too); the step's sweep and checkpoint follow it (pst_sparse_step_done). Blocking. */
    pst_status (*sparse_pull)(tr_link *l, int table, long step, const uint64_t *keys,
                              const size_t *seg, float *rows);
    pst_status (*sparse_push)(tr_link *l, int table, long step, const uint64_t *keys,
                              const size_t *seg, const float *rows);
    void (*sparse_totals)(tr_link *l, tr_sparse_totals *out);
    /* A trainer other than 0 got SIGTERM: asks trainer 0 (through the pservers) to stop the
     * job at its next step boundary with a checkpoint; this trainer trains on until then.
     * NULL: not offered (training alone). */
    pst_status (*ask_stop)(tr_link *l);
    void (*free)(tr_link *l);
} tr_link_ops;

/* Where the trainers stand at a checkpoint beyond the blocks' version: fp16 skips steps
 * without making a version, so the step to run next can be past it, and the loss scaler
 * has a state (rpc ResumeState). */
typedef struct tr_resume_state {
    int64_t next_step;  /* the step to run first */
    float loss_scale;   /* fp16: the loss scaler's scale and steps since it last changed */
    int64_t good_steps;
    int64_t skipped;    /* steps skipped so far */
} tr_resume_state;

struct tr_link {
    const tr_link_ops *ops;
    const tr_plan *plan;  /* the caller's; outlives the link */
    int in_process;       /* 1: updates run in this process, on the exchanging thread */
    /* Checkpoints, set by the caller before start: the steps of trainer 0's whole job
     * checkpoints (any order; none: a fresh start) and how often to write them. */
    const int64_t *resume_steps;
    const tr_resume_state *resume_states; /* for each of resume_steps, or NULL */
    int nresume;
    int resume_newest; /* async, trainer 0: each pserver resumes from its newest shard */
    int64_t checkpoint_every;
    /* Set by the caller before an early finish at a step boundary (SIGTERM, trainer 0):
     * every pserver (the in-process store) writes its shard of this version before
     * answering, and finish fails when one could not (0: none). */
    int64_t checkpoint_step;
    /* Set by the caller before an early finish before step 0: this process starts a new
     * run at once (--on-failure wait), so a pserver need not roll the job back for it. */
    int rejoins;
    /* Set by start: the step the job resumes at (the version every block holds; 0 for a
     * fresh job). When start fails because the pservers hold different versions (one
     * could not use the newest checkpoint), versions_differ is 1 and start_version the
     * oldest of them. */
    int64_t start_version;
    int versions_differ;
    /* Set by start when the job resumes from a checkpoint whose resume_states trainer 0 gave
     * (the one of the checkpoint chosen, the same on every trainer); has_start_state 0:
     * none (a fresh job: the step is start_version, the scaler as configured). */
    tr_resume_state start_state;
    int has_start_state;
    /* Set (to 1) by the link when a pserver asks trainer 0 to stop the job at the next step
     * boundary (WatchReply.stop: another process got SIGTERM). Read with
     * __atomic_load_n. */
    int stop_asked;
};

static inline void tr_link_free(tr_link *l)
{
    if (l)
        l->ops->free(l);
}

#endif /* TR_LINK_H */
