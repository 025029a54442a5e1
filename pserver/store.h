/* store.h — the pserver's block store: the parameter blocks this pserver owns, their
 * optimizer state and versions, the sync/async update rule and the pulls waiting for a
 * version. Pure logic: no networking, no threads of its own, no logging.
 *
 * Not for: the wire (rpc/ decodes a PushRequest and hands the store a fill function that
 * casts the payload slices into the store's buffer), checkpoints on disk, membership.
 *
 * DESIGN. One mutex per block and nothing shared between blocks after init, so requests
 * for different blocks never wait for each other and the optimizer updates of different
 * blocks run in parallel on whatever threads deliver their last push (the gRPC server
 * threads). Everything a push or pull touches is allocated by ps_store_init: the fp32
 * master values, the optimizer state, and per block either num_trainers receive buffers
 * (sync) or one scratch buffer (async). A push writes its gradient straight into the
 * store's buffer through a ps_fill_fn, so the payload is copied (and cast) once. A pull that
 * has to wait is queued on an intrusive list whose node (ps_pull_waiter) the caller
 * provides, typically embedded in its RPC call object: the hot path allocates nothing.
 *
 * Sync mode. A block's version is the number of updates applied to it. Step s of every
 * trainer contributes to update s+1: pushes for step == version are kept in the pushing
 * trainer's buffer; when all num_trainers have pushed, the buffers are summed in trainer-id
 * order (acc = buf[0]; acc += buf[1]; ...; one fixed order, so the result is the same bits
 * whatever the arrival order, and equal to one process summing the same gradients), the
 * optimizer is applied once with t = version + 1, the version is bumped and every waiting
 * pull that wanted at most the new version is answered. A push for an older step is a
 * duplicate (already applied), as is a second push for the current step by the same trainer
 * (a client retry); a push for a later step is an error, because that trainer cannot have
 * seen the version it depends on.
 *
 * Async mode. Each push is applied at once (t = version + 1, version++) and answers the
 * waiting pulls. Steps only serve to detect retries: per trainer and block the store keeps
 * the last step applied, and a push with step <= that one is a duplicate; one more than
 * PS_ASYNC_STEP_WINDOW steps past it is an error (it would turn every later push of that
 * trainer into a "duplicate").
 *
 * A gradient holding NaN or infinity is rejected before it reaches any parameter; the
 * trainer may push that step again.
 *
 * Low precision (the config's lowp: f16 or bf16; PaddlePaddle PR #35878's cast in the
 * optimizer stage). The master values and the optimizer state stay f32; each block also
 * keeps a copy of its values in lowp, written by one pst_cast of the whole block at init and
 * right after every update, by the thread that made the update, under the block's lock and
 * before the waiting pulls are answered. Every pull is handed that copy, so a block is cast
 * once per version however many trainers pull it, instead of once per pull. */
#ifndef PST_PSERVER_STORE_H
#define PST_PSERVER_STORE_H

#include <stdint.h>

#include "common/config.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/optim.h"

struct pst_pool;

typedef struct ps_store ps_store;

#define PS_ASYNC_STEP_WINDOW 1024 /* async: the furthest a push may be past its last step */

/* One block of the trainers' flat parameter buffer: elements [offset, offset + length). */
typedef struct ps_block_spec {
    uint32_t id;     /* global block index in the plan */
    uint64_t offset; /* first element in the flat buffer */
    uint64_t length; /* elements, > 0 */
} ps_block_spec;


typedef struct ps_store_config {
    pst_mode mode;
    int num_trainers;          /* >= 1; trainer ids are 0 .. num_trainers-1 */
    pst_optim_config optim;    /* copied by ps_store_init */
    const ps_block_spec *blocks; /* (nblocks) ids unique, ranges disjoint; copied */
    int nblocks;               /* >= 0; a pserver may own no block */
    /* Optional (NULL: the store allocates them). values[i] is where block i's master values
     * live, in the caller's memory: an in-process store over a trainer's own parameters
     * (trainer/local.c), so a pull answers with a pointer into them and nothing is copied.
     * The store writes them only in an update; the caller keeps them alive and does not
     * write them. `initial` NULL then leaves them as they are. */
    float *const *values;
    struct pst_pool *pool;     /* optional: each update and each cast split over these
                                * threads (the split changes no bit); NULL: the pushing
                                * thread alone */
    /* PST_F32 (the zero value): no low-precision copy. PST_F16 or PST_BF16: per block a copy
     * of the master values in that dtype (2 bytes an element, allocated at init), cast at
     * init and after every update, handed to every pull (ps_pull_fn's lowp). */
    pst_dtype lowp;
    /* Optional with lowp (NULL: the store allocates them): lowp_at[i] is where block i's
     * copy lives, in the caller's memory (the pserver's shared values area, rpc/shm.h),
     * 64-byte aligned; the caller keeps it alive and does not write it. */
    void *const *lowp_at;
    /* Checkpoints (sync mode; 0 in async): every `snapshot_every` versions each block's
     * values and optimizer state are copied as the block reaches that version, and when the
     * last block has, snapshot(snapshot_arg, version, values, state) runs on that thread
     * with that block's lock held, before its pulls are answered (so no block can be past
     * the version meanwhile): values (total_length) and state (nstate x length per block)
     * are the shard's, blocks in config order. It handles its own failure (the store goes
     * on). */
    int64_t snapshot_every;
    void (*snapshot)(void *arg, int64_t version, const float *values, const float *state);
    void *snapshot_arg;
    /* Optional, both or neither (NULL: a sync push that does not complete its step is
     * copied into the store). Sync with more than one trainer: a push from a fill at scale 1
     * (ps_store_push, ps_store_push_scaled, ps_store_push_bf16; not PS_PUSH_SHARED_SOURCE)
     * that does not complete its step is kept where it came instead: keep_push(fill_arg)
     * returns an argument for the same fill that reads the same elements until
     * release_push(kept), or NULL, and the push is copied. The store checks the push through
     * it as it comes, reads it again in the step's update (from the pool's threads, as the
     * last push's), and releases it after that update, or when the push is discarded in its
     * check, or at ps_store_free; with a block's lock held, on that thread. keep_push runs on
     * the pushing thread, inside the push, with the block's lock held. */
    void *(*keep_push)(void *fill_arg);
    void (*release_push)(void *kept);
    /* Optional: seconds each block update took (the optimizer step and the cast), called
     * on the updating thread after it. */
    void (*on_update)(void *arg, double seconds);
    void *on_update_arg;
} ps_store_config;

/* Writes elements [first, first + length) of a pushed gradient into dst[0..length) as f32
 * (casting from the wire dtype). ps_store_push calls it piece by piece, in order, so each
 * piece is checked for NaN/Inf while it is still in cache. When the push makes the update
 * (the last of a sync step, one trainer, async), the pieces are only checked, and the
 * update calls it again (or the kept argument's, ps_store_config's keep_push) for each
 * tile of 4096 elements, from the store's pool threads
 * concurrently and in any order, before ps_store_push returns: it must give the same
 * elements every time (read a source that does not change) and be safe to call from
 * several threads at once. Called with the block's lock held: it must not call back into
 * the store. Returns PST_OK, or an error with its detail set (pst_error_set); on error in
 * the check the push is discarded and ps_store_push returns that status (a second read of
 * what the first read has no error to give). */
typedef pst_status (*ps_fill_fn)(void *arg, float *dst, uint64_t first, uint64_t length);

/* Writes elements [first, first + length) of a pushed bf16 gradient into dst[0..length), as
 * they came (2 bytes each, no cast); otherwise as ps_fill_fn (read again by the update
 * when the push makes it). */
typedef pst_status (*ps_raw_fill_fn)(void *arg, void *dst, uint64_t first, uint64_t length);

/* Answers a pull. On success `st` is PST_OK and values[0..length) are the block's values at
 * `version` (>= the version wanted); when the store has a low-precision copy (config lowp
 * f16 or bf16), lowp points at length elements of that dtype, equal to
 * pst_cast(values) bit for bit (the same version), otherwise lowp is NULL. On failure
 * (ps_store_cancel_waiters) `st` is that error, values and lowp are NULL and length 0.
 * Called with the block's lock held, either inside ps_store_pull or later on the thread
 * that makes the version (inside ps_store_push) or that cancels. It must not block for long
 * and must not call back into the store.
 * The values and lowp pointers stay valid for the store's life, but what they point at
 * changes with the next update: copy it before returning, unless the caller knows no update
 * can happen until it is done with it (sync mode, where update v+1 needs every trainer's
 * push of step v, which each trainer sends only after it has received version v: the
 * pserver service sends f32 and lowp pull replies straight from here on that basis). */
typedef void (*ps_pull_fn)(void *arg, pst_status st, const float *values, const void *lowp,
                           uint64_t length, int64_t version);

/* A queued pull: storage the caller provides (embed it in the call object), so that
 * queueing allocates nothing. All fields are private to the store. The caller must keep
 * the waiter alive and unmoved from ps_store_pull until its fn has been called or
 * ps_store_pull_cancel has withdrawn it; afterwards it may be reused or freed (also from
 * inside fn: the store does not touch a waiter after calling its fn). */
typedef struct ps_pull_waiter {
    struct ps_pull_waiter *next, *prev;
    ps_pull_fn fn;
    void *arg;
    int64_t want_version;
    int block;  /* index into the store's blocks */
    int queued; /* 1 while on the block's list */
} ps_pull_waiter;

/* Sets every block to a checkpoint's `version`, values (total_length) and optimizer
 * state (laid out as snapshot gives it; NULL for an optimizer without state), and casts
 * the low-precision copies. Call before any push or pull. Errors: PST_ERR_INVALID (a
 * negative version). */
pst_status ps_store_restore(ps_store *st, int64_t version, const float *values,
                            const float *state);
/* Async stores, for checkpoints: each block's values and optimizer state (laid out as
 * ps_store_restore takes them), its version and each trainer's last step applied to it
 * (trainer-major, last_steps[t * nblocks + i] for the block at index i; -1: none), each
 * block copied under its own lock (a block's values, version and steps agree; two blocks
 * may be some pushes apart). Errors: PST_ERR_STATE for a sync store. */
pst_status ps_store_read_async(ps_store *st, float *values, float *state, int64_t *versions,
                               int64_t *last_steps);
/* Restores what ps_store_read_async gave. A push of a step at or below a trainer's last
 * step of a block is then a duplicate there, so no push is applied twice. Call before any
 * push or pull. Errors: PST_ERR_STATE for a sync store, PST_ERR_INVALID for a negative
 * version. */
pst_status ps_store_restore_async(ps_store *st, const float *values, const float *state,
                                  const int64_t *versions, const int64_t *last_steps);
/* Async: trainer t's first step not applied to every block of this store (the lowest of
 * its last steps, plus one); 0 for a trainer that pushed nothing, -1 for a sync store or
 * a trainer out of range. Thread safe. */
int64_t ps_store_first_unapplied(ps_store *st, uint32_t t);
/* Floats of optimizer state per parameter (0 for SGD). */
int ps_store_state_floats(const ps_store *st);

/* Bytes ps_store_init allocates for cfg's blocks of `total_length` elements, at most: the
 * values (unless cfg->values), the optimizer state, the gradient buffers (one per trainer
 * in sync, one in async) and the low-precision copy (unless cfg->lowp_at), without the
 * checkpoint snapshot. Saturates at UINT64_MAX. For a bound checked before the store is
 * made (a pserver's --max-memory). */
uint64_t ps_store_bytes(const ps_store_config *cfg, uint64_t total_length);

/* Creates a store for cfg's blocks. `initial` holds the blocks' f32 values concatenated in
 * the order cfg->blocks lists them (ps_store_total_length elements), or is NULL for zeros.
 * Optimizer state starts at zero and every version at 0. cfg and initial are only read
 * during the call.
 * With cfg->lowp f16 or bf16 each block's low-precision copy is cast from its values once
 * they are set (from `initial`, or the caller's cfg->values as they are); that cast is not
 * counted by ps_store_cast_count.
 * Errors: PST_ERR_INVALID (detail names the field) for a NULL cfg or out, an unknown mode,
 * optimizer kind or schedule, a lowp other than f32, f16 or bf16, num_trainers < 1,
 * nblocks < 0, a NULL blocks array with nblocks > 0, a zero length, a repeated block id,
 * overlapping or overflowing ranges; PST_ERR_NOMEM; PST_ERR_INTERNAL if a mutex cannot be
 * created. On error *out is NULL.
 * Not thread safe with respect to the new store (nothing else can reach it yet). */
pst_status ps_store_init(ps_store **out, const ps_store_config *cfg, const float *initial);

/* Frees the store; accepts NULL. No other call may be running or start. Waiters still
 * queued are dropped without being called: call ps_store_cancel_waiters first. */
void ps_store_free(ps_store *st);

/* Delivers trainer `trainer`'s gradient for `step` of block `block` (its global id).
 * `length` must equal the block's length; fill writes the gradient into the store's buffer
 * (see ps_fill_fn). *duplicate (optional, may be NULL) is set to 1 when the push had been
 * counted already and was ignored (fill is then not called), 0 otherwise.
 * Errors, each with a one-line detail and no change to the store:
 *   PST_ERR_NOT_FOUND  the block is not on this pserver;
 *   PST_ERR_INVALID    length differs from the block's, trainer >= num_trainers, step < 0,
 *                      fill is NULL, or the gradient holds NaN or infinity (checked after
 *                      fill; the trainer may push that step again);
 *   PST_ERR_RANGE      (sync) step > the block's version; (async) step more than
 *                      PS_ASYNC_STEP_WINDOW past the trainer's last;
 *   whatever fill returns (its detail kept).
 * When the push completes a step (sync) or always (async) the optimizer runs on this
 * thread, then (lowp f16/bf16) the block's low-precision copy is cast from the new values,
 * and the pulls waiting for the new version are answered here, before the call returns.
 * Thread safe; blocks only on the block's lock (other pushes and pulls of the same block,
 * including one that runs its update). Allocates nothing. */
pst_status ps_store_push(ps_store *st, uint32_t trainer, int64_t step, uint32_t block,
                         uint64_t length, ps_fill_fn fill, void *fill_arg, int *duplicate);

/* Flags of ps_store_push_scaled, ps_store_push_bf16 and ps_store_push_f32. */
enum {
    /* fill reads memory another process can write while the push runs (a trainer's
     * shared-memory slot, rpc/shm.h): the store reads it once, into its own buffer, and
     * checks and applies that copy, never the source again. Without the flag a push that
     * makes the update is read twice (ps_fill_fn), which is only sound for a source that
     * does not change. */
    PS_PUSH_SHARED_SOURCE = 1u << 0,
    /* Sync: the push is the sum of every trainer's gradient of the step, added in trainer-id
     * order by the trainers themselves (a chain, trainer/chain.h): it makes the update on its
     * own, as one trainer's would. Refused (PST_ERR_STATE) once a trainer pushed the step
     * itself; a repeat after the update is a duplicate. Async and one trainer: ignored. */
    PS_PUSH_ALL_TRAINERS = 1u << 1,
};

/* ps_store_push of a gradient scaled by `loss_scale` (fp16 dynamic loss scaling): every
 * piece is divided by it after fill, before the NaN/Inf check and the sum, so the sum over
 * trainers equals the unscaled sum (a power of two divides exactly, barring subnormals).
 * `flags`: PS_PUSH_* or 0. Errors as ps_store_push, plus PST_ERR_INVALID (nothing changed)
 * for a scale that is not a power of two in [2^-126, 2^126]. */
pst_status ps_store_push_scaled(ps_store *st, uint32_t trainer, int64_t step, uint32_t block,
                                uint64_t length, float loss_scale, ps_fill_fn fill,
                                void *fill_arg, unsigned flags, int *duplicate);

/* ps_store_push of a bf16 gradient, kept in bf16 until the update widens it to f32 (exact):
 * the same sums and the same bits as ps_store_push with a fill that casts, with half the
 * bytes written and read. NaN and infinity are checked on the bf16 values. `flags`:
 * PS_PUSH_* or 0. Errors as ps_store_push. */
pst_status ps_store_push_bf16(ps_store *st, uint32_t trainer, int64_t step, uint32_t block,
                              uint64_t length, ps_raw_fill_fn fill, void *fill_arg,
                              unsigned flags, int *duplicate);

/* ps_store_push with the gradient as an f32 array: in this process (the in-process store of
 * local training), or flags PS_PUSH_SHARED_SOURCE for a trainer's shared-memory slot.
 * Without the flag, a push that makes the update on its own (one trainer, or async) is read
 * where it is, checked and applied without a copy, and grad must not change during the
 * call. Every other push is copied into the store and checked in the same pass, reading
 * each element once, and the update applies that copy. Errors as ps_store_push, plus
 * PST_ERR_INVALID for a NULL grad. */
pst_status ps_store_push_f32(ps_store *st, uint32_t trainer, int64_t step, uint32_t block,
                             const float *grad, uint64_t length, unsigned flags,
                             int *duplicate);

/* The update of a sync store of one trainer (training alone), made piece by piece while
 * the gradient is produced, each piece while it is still in cache:
 * ps_store_update_slice applies the optimizer step of version + 1 to elements
 * [first, first + n) of block `block` with grad[0..n) (the same arithmetic as a push, so
 * the same bits), and ps_store_commit_slices(step) then makes the version (the step's
 * pulls, casts counter and checkpoint as a push would), once every element of the block had
 * exactly one slice. Slices of one block may run on several threads at once on disjoint
 * ranges; the commit must come after all of them (ordered by the caller), and no push of
 * the block may come between. A slice with a NaN or infinity is not applied and returns
 * PST_ERR_INVALID; the commit then fails with the element's index and changes no version,
 * but the block's other slices stay applied (the job stops: training alone, the step's
 * state is not written to a checkpoint). Errors: PST_ERR_NOT_FOUND (block),
 * PST_ERR_INVALID (range), PST_ERR_STATE (not a sync store of one trainer),
 * PST_ERR_RANGE (commit: step is not the block's version). */
pst_status ps_store_update_slice(ps_store *st, uint32_t block, uint64_t first, uint64_t n,
                                 const float *grad);
pst_status ps_store_commit_slices(ps_store *st, int64_t step, uint32_t block);

/* Asks for block `block`'s values once its version is >= want_version (sync: step + 1).
 * If that version exists, fn is called before this returns; otherwise the pull is queued
 * on `w` and fn is called later by the push that makes the version, or with an error by
 * ps_store_cancel_waiters. After ps_store_cancel_waiters, a pull that would have to wait
 * is answered at once with the cancelling error instead of being queued.
 * Returns PST_OK when fn has been or will be called exactly once. Errors, fn never called:
 * PST_ERR_NOT_FOUND for a block not on this pserver, PST_ERR_INVALID for a NULL w or fn.
 * Thread safe; never waits for the version, only for the block's lock. Allocates nothing. */
pst_status ps_store_pull(ps_store *st, uint32_t block, int64_t want_version,
                         ps_pull_waiter *w, ps_pull_fn fn, void *arg);

/* Withdraws a pull queued by ps_store_pull (e.g. its RPC was cancelled by the client).
 * Returns 1 if it was still queued: fn will never be called for it. Returns 0 if fn has
 * already been called (a call in progress on another thread has finished by the time this
 * returns, since both hold the block's lock). Thread safe; w must be a waiter passed to
 * ps_store_pull on this store that returned PST_OK. */
int ps_store_pull_cancel(ps_store *st, ps_pull_waiter *w);

/* Calls every queued pull's fn with `status` (values and lowp NULL, length 0), empties the queues
 * and makes later pulls that would wait fail the same way (shutdown). A status of PST_OK
 * is replaced by PST_ERR_STATE. The fns run on this thread, each under its block's lock.
 * The status reaches fn without a detail; the caller knows why it cancelled. Thread safe. */
void ps_store_cancel_waiters(ps_store *st, pst_status status);

/* A checkpoint now (ps_store_config's snapshot), of `version`: when every block holds it,
 * their values and state are copied under their locks and snapshot() runs on this thread.
 * Errors: PST_ERR_STATE when the store writes no snapshots or a block is at another
 * version (mid-step: no consistent state to write). Thread safe. */
pst_status ps_store_snapshot_now(ps_store *st, int64_t version);

/* Sync: how many trainers have pushed the block's next step so far (-1: no such block).
 * Thread safe. */
int ps_store_pushed(ps_store *st, uint32_t block);

/* The block's current version, or -1 when the block is not on this pserver. Thread safe. */
int64_t ps_store_version(ps_store *st, uint32_t block);

/* Copies the block's current values into dst[0..length) and, when `version` is not NULL,
 * the version they belong to (one consistent snapshot, e.g. for a checkpoint or a test).
 * Errors: PST_ERR_NOT_FOUND; PST_ERR_INVALID for a NULL dst. Thread safe. */
pst_status ps_store_read(ps_store *st, uint32_t block, float *dst, int64_t *version);

/* The block's length in elements, or 0 when the block is not on this pserver. */
uint64_t ps_store_block_length(const ps_store *st, uint32_t block);
/* Where the block is in the shard (its blocks in the configured order): its first element
 * and its length. Returns 0 when the block is not on this pserver. */
int ps_store_block_place(const ps_store *st, uint32_t block, uint64_t *shard_off,
                         uint64_t *length);

/* Sum of the lengths of all blocks (the length of `initial`). */
uint64_t ps_store_total_length(const ps_store *st);

/* Number of blocks. */
int ps_store_nblocks(const ps_store *st);

/* The dtype of the blocks' low-precision copies: PST_F16 or PST_BF16, or PST_F32 for none. */
pst_dtype ps_store_lowp(const ps_store *st);

/* Elements cast into the low-precision copies by updates since init (the cast at init is
 * not counted), summed over the blocks: each update adds its block's length. 0 without a
 * copy. In sync mode, (optimizer steps) x ps_store_total_length when every block has made
 * the same number of steps. Thread safe (an atomic read; a running update may or may not be
 * counted yet). */
uint64_t ps_store_cast_count(const ps_store *st);

/* FNV-1a over every block, in the configured order: its version, fp32 values and optimizer
 * state (the bits an update changes), each block under its lock. Equal hashes: the same
 * state, bit for bit (a skipped fp16 step must leave it so). Thread safe. */
uint64_t ps_store_state_hash(ps_store *st);

#endif /* PST_PSERVER_STORE_H */
