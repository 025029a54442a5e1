/* test_store.c — the pserver block store against a sequential reference.
 *
 * The reference is the update rule written out plainly: per block, sum the trainers'
 * gradients in trainer-id order into a separate buffer and call pst_optim_apply with
 * t = version + 1 on a separate copy of the parameters and state. The store must give the
 * same bits whatever the order in which pushes arrive, with retries, rejected pushes and
 * concurrent threads. Error cases assert exact codes and that the store did not change. */
#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/dtype.h"
#include "common/optim.h"
#include "common/rng.h"
#include "pserver/store.h"

/* Three blocks with lengths that are not multiples of a vector width, listed out of id and
 * offset order so the lookup cannot rely on either. */
static const ps_block_spec test_blocks[] = {
    {.id = 7, .offset = 22, .length = 5},
    {.id = 3, .offset = 0, .length = 17},
    {.id = 12, .offset = 40, .length = 33},
};
#define NTB 3
#define TOTAL_LEN (5 + 17 + 33)
#define MAX_T 4

/* ---- helpers ---- */

static void fill_normal(float *x, uint64_t n, uint64_t seed, uint64_t stream, float scale)
{
    pst_rng r;
    pst_rng_seed(&r, seed, stream);
    for (uint64_t i = 0; i < n; i++)
        x[i] = scale * pst_rng_normal(&r);
}

static void optim_for(pst_optim_kind kind, pst_optim_config *o)
{
    pst_optim_defaults(o);
    o->kind = kind;
    switch (kind) {
    case PST_OPTIM_SGD:
        o->lr = 0.05f;
        o->weight_decay = 0.01f;
        break;
    case PST_OPTIM_MOMENTUM:
        o->lr = 0.03f;
        o->momentum = 0.9f;
        break;
    case PST_OPTIM_ADAM:
        o->lr = 0.01f;
        o->weight_decay = 0.001f;
        break;
    case PST_OPTIM_ADAMW:
        /* The schedule makes the result depend on t, so a wrong t shows. */
        o->lr = 0.02f;
        o->weight_decay = 0.1f;
        o->schedule = PST_LR_WARMUP_COSINE;
        o->warmup_steps = 2;
        o->total_steps = 10;
        o->min_lr = 0.001f;
        break;
    case PST_OPTIM_ADAGRAD:
        o->lr = 0.05f;
        o->eps = 1e-10f;
        o->weight_decay = 0.01f;
        break;
    default:
        break;
    }
}

static ps_store *make_store(pst_mode mode, int ntrainers, pst_optim_kind kind, float *initial)
{
    ps_store_config cfg = {.mode = mode, .num_trainers = ntrainers, .blocks = test_blocks,
                           .nblocks = NTB};
    optim_for(kind, &cfg.optim);
    fill_normal(initial, TOTAL_LEN, 1, 0, 1.0f);
    ps_store *st = NULL;
    pst_status rc = ps_store_init(&st, &cfg, initial);
    cr_assert_eq(rc, PST_OK, "init: %s", pst_error_detail());
    cr_assert_not_null(st);
    return st;
}

typedef struct fill_src {
    const float *g;
    atomic_int calls; /* the update may read a push again through its fill, on pool threads */
    pst_status fail; /* returned instead of filling when not PST_OK */
} fill_src;

static pst_status fill_copy(void *arg, float *dst, uint64_t first, uint64_t n)
{
    fill_src *f = arg;
    f->calls++;
    if (f->fail != PST_OK)
        return pst_error_set(f->fail, "test fill failed");
    memcpy(dst, f->g + first, (size_t)n * sizeof(float));
    return PST_OK;
}

/* Pushes g and returns the status; *dup and *calls report what happened. */
static pst_status push_grad(ps_store *st, uint32_t t, int64_t step, uint32_t block,
                            const float *g, uint64_t n, int *dup, int *calls)
{
    fill_src f = {.g = g};
    int d = -1;
    pst_status rc = ps_store_push(st, t, step, block, n, fill_copy, &f, &d);
    if (dup)
        *dup = d;
    if (calls)
        *calls = f.calls;
    return rc;
}

/* A pull answer captured for the test. */
typedef struct pull_box {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls;
    int order;          /* global answer sequence number of the last call */
    pst_status st;
    int values_null;
    uint64_t length;
    int64_t version;
    float values[64];
    int lowp_null;
    uint16_t lowp[64];  /* the store's f16/bf16 copy, when it has one */
} pull_box;

static int answer_seq;

static void pull_box_init(pull_box *b)
{
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
}

static void pull_capture(void *arg, pst_status st, const float *values, const void *lowp,
                         uint64_t length, int64_t version);

/* A pull of a version that exists: answered inside the call, without error, into *box. */
static void pull_now(ps_store *st, uint32_t block, int64_t version, pull_box *box)
{
    pull_box_init(box);
    ps_pull_waiter w;
    cr_assert_eq(ps_store_pull(st, block, version, &w, pull_capture, box), PST_OK);
    cr_assert_eq(box->calls, 1, "block %u, version %lld exists: answered inside the call",
                 (unsigned)block, (long long)version);
    cr_assert_eq(box->st, PST_OK);
}

static void pull_capture(void *arg, pst_status st, const float *values, const void *lowp,
                         uint64_t length, int64_t version)
{
    pull_box *b = arg;
    pthread_mutex_lock(&b->mu);
    b->lowp_null = lowp == NULL;
    if (lowp && length <= 64)
        memcpy(b->lowp, lowp, (size_t)length * sizeof(uint16_t));
    b->calls++;
    b->order = ++answer_seq;
    b->st = st;
    b->values_null = values == NULL;
    b->length = length;
    b->version = version;
    if (values && length <= 64)
        memcpy(b->values, values, (size_t)length * sizeof(float));
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Sequential reference of one block. */
typedef struct ref_block {
    uint64_t n;
    float p[64];
    float state[2 * 64];
    int64_t version;
} ref_block;

static void ref_init(ref_block *r, const float *initial, uint64_t n)
{
    memset(r, 0, sizeof *r);
    r->n = n;
    memcpy(r->p, initial, (size_t)n * sizeof(float));
}

/* acc = g[0]; acc += g[1]; ...; then update t = version + 1. */
static void ref_step(ref_block *r, const pst_optim_config *o, float g[][64], int ntrainers)
{
    float acc[64];
    memcpy(acc, g[0], (size_t)r->n * sizeof(float));
    for (int t = 1; t < ntrainers; t++)
        for (uint64_t i = 0; i < r->n; i++)
            acc[i] += g[t][i];
    pst_optim_apply(o, (long)(r->version + 1), r->p, r->state, (size_t)r->n, acc,
                    (size_t)r->n);
    r->version++;
}

static uint64_t initial_offset(int bi)
{
    uint64_t off = 0;
    for (int i = 0; i < bi; i++)
        off += test_blocks[i].length;
    return off;
}

static void assert_block_equals(ps_store *st, int bi, const ref_block *r)
{
    float got[64];
    int64_t ver = -5;
    cr_assert_eq(ps_store_read(st, test_blocks[bi].id, got, &ver), PST_OK);
    cr_assert_eq(ver, r->version, "block %u: version %lld, want %lld",
                 (unsigned)test_blocks[bi].id, (long long)ver, (long long)r->version);
    cr_assert(memcmp(got, r->p, (size_t)r->n * sizeof(float)) == 0,
              "block %u: values differ from the reference", (unsigned)test_blocks[bi].id);
}

/* All blocks' values and versions, to show that a failed call changed nothing. */
typedef struct snapshot {
    float v[NTB][64];
    int64_t ver[NTB];
} snapshot;

static void take_snapshot(ps_store *st, snapshot *s)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < NTB; i++)
        cr_assert_eq(ps_store_read(st, test_blocks[i].id, s->v[i], &s->ver[i]), PST_OK);
}

static void assert_unchanged(ps_store *st, const snapshot *before)
{
    snapshot now;
    take_snapshot(st, &now);
    cr_assert(memcmp(&now, before, sizeof now) == 0, "the store changed");
}

/* ---- configuration ---- */

Test(store, init_rejects_bad_config)
{
    ps_store_config good = {.mode = PST_MODE_SYNC, .num_trainers = 2, .blocks = test_blocks,
                            .nblocks = NTB};
    pst_optim_defaults(&good.optim);
    ps_store *st = (ps_store *)&good; /* must be reset to NULL on failure */

    ps_store_config c = good;
    c.num_trainers = 0;
    cr_assert_eq(ps_store_init(&st, &c, NULL), PST_ERR_INVALID);
    cr_assert_null(st);
    cr_assert(strstr(pst_error_detail(), "num_trainers") != NULL, "%s", pst_error_detail());

    ps_block_spec dup[] = {{1, 0, 4}, {2, 4, 4}, {1, 8, 4}};
    c = good;
    c.blocks = dup;
    c.nblocks = 3;
    cr_assert_eq(ps_store_init(&st, &c, NULL), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "block id 1 listed twice") != NULL, "%s",
              pst_error_detail());

    ps_block_spec zero[] = {{1, 0, 4}, {2, 4, 0}};
    c = good;
    c.blocks = zero;
    c.nblocks = 2;
    cr_assert_eq(ps_store_init(&st, &c, NULL), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "block 2 has length 0") != NULL, "%s",
              pst_error_detail());

    ps_block_spec overlap[] = {{1, 0, 4}, {2, 3, 4}};
    c = good;
    c.blocks = overlap;
    c.nblocks = 2;
    cr_assert_eq(ps_store_init(&st, &c, NULL), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "overlap") != NULL, "%s", pst_error_detail());

    ps_block_spec wrap[] = {{1, UINT64_MAX - 2, 4}};
    c = good;
    c.blocks = wrap;
    c.nblocks = 1;
    cr_assert_eq(ps_store_init(&st, &c, NULL), PST_ERR_INVALID);

    c = good;
    c.mode = (pst_mode)7;
    cr_assert_eq(ps_store_init(&st, &c, NULL), PST_ERR_INVALID);
    c = good;
    c.optim.kind = PST_OPTIM_KIND_COUNT_;
    cr_assert_eq(ps_store_init(&st, &c, NULL), PST_ERR_INVALID);
    c = good;
    c.blocks = NULL;
    cr_assert_eq(ps_store_init(&st, &c, NULL), PST_ERR_INVALID);
    c = good;
    c.nblocks = -1;
    cr_assert_eq(ps_store_init(&st, &c, NULL), PST_ERR_INVALID);
    cr_assert_eq(ps_store_init(&st, NULL, NULL), PST_ERR_INVALID);
    cr_assert_eq(ps_store_init(NULL, &good, NULL), PST_ERR_INVALID);
    cr_assert_null(st);

    ps_store_free(NULL);
}

Test(store, init_layout_and_accessors)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_SYNC, 2, PST_OPTIM_ADAM, initial);
    cr_assert_eq(ps_store_nblocks(st), NTB);
    cr_assert_eq(ps_store_total_length(st), (uint64_t)TOTAL_LEN);
    for (int i = 0; i < NTB; i++) {
        float got[64];
        int64_t ver = -1;
        cr_assert_eq(ps_store_block_length(st, test_blocks[i].id), test_blocks[i].length);
        cr_assert_eq(ps_store_version(st, test_blocks[i].id), 0);
        cr_assert_eq(ps_store_read(st, test_blocks[i].id, got, &ver), PST_OK);
        cr_assert_eq(ver, 0);
        cr_assert(memcmp(got, initial + initial_offset(i),
                         (size_t)test_blocks[i].length * sizeof(float)) == 0);
    }
    float got[64];
    cr_assert_eq(ps_store_version(st, 99), -1);
    cr_assert_eq(ps_store_block_length(st, 99), 0);
    cr_assert_eq(ps_store_read(st, 99, got, NULL), PST_ERR_NOT_FOUND);
    cr_assert_eq(ps_store_read(st, 3, NULL, NULL), PST_ERR_INVALID);
    ps_store_free(st);

    /* No initial values: zeros. A pserver with no block is valid. */
    ps_store_config cfg = {.mode = PST_MODE_ASYNC, .num_trainers = 1, .blocks = test_blocks,
                           .nblocks = NTB};
    pst_optim_defaults(&cfg.optim);
    cr_assert_eq(ps_store_init(&st, &cfg, NULL), PST_OK);
    cr_assert_eq(ps_store_read(st, 12, got, NULL), PST_OK);
    for (int i = 0; i < 33; i++)
        cr_assert_eq(got[i], 0.0f);
    ps_store_free(st);
    cfg.blocks = NULL;
    cfg.nblocks = 0;
    cr_assert_eq(ps_store_init(&st, &cfg, NULL), PST_OK);
    cr_assert_eq(ps_store_nblocks(st), 0);
    cr_assert_eq(ps_store_total_length(st), 0);
    ps_store_free(st);
}

/* ---- sync mode against the reference ---- */

/* Runs `steps` sync steps with `ntrainers` trainers, pushing in the given trainer order
 * (a permutation of 0..ntrainers-1) and checking every block against the reference after
 * every push: unchanged until the last trainer's push, then exactly the reference. */
static void run_sync_case(int ntrainers, pst_optim_kind kind, const int *order, int steps)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_SYNC, ntrainers, kind, initial);
    pst_optim_config o;
    optim_for(kind, &o);
    ref_block ref[NTB];
    for (int i = 0; i < NTB; i++)
        ref_init(&ref[i], initial + initial_offset(i), test_blocks[i].length);

    for (int s = 0; s < steps; s++) {
        float g[NTB][MAX_T][64];
        for (int i = 0; i < NTB; i++)
            for (int t = 0; t < ntrainers; t++)
                fill_normal(g[i][t], test_blocks[i].length, 2, (uint64_t)(s * 100 + i * 10 + t),
                            0.5f);
        /* Trainer-major: each trainer pushes all its blocks, as trainers do. */
        for (int k = 0; k < ntrainers; k++) {
            int t = order[k];
            for (int i = 0; i < NTB; i++) {
                int dup = -1;
                cr_assert_eq(push_grad(st, (uint32_t)t, s, test_blocks[i].id, g[i][t],
                                       test_blocks[i].length, &dup, NULL),
                             PST_OK, "%s", pst_error_detail());
                cr_assert_eq(dup, 0);
                if (k < ntrainers - 1)
                    assert_block_equals(st, i, &ref[i]); /* not applied yet */
            }
        }
        for (int i = 0; i < NTB; i++) {
            ref_step(&ref[i], &o, g[i], ntrainers);
            assert_block_equals(st, i, &ref[i]);
        }
    }
    ps_store_free(st);
}

Test(store, sync_matches_reference_any_order)
{
    static const int fwd1[] = {0}, fwd2[] = {0, 1}, rev2[] = {1, 0};
    static const int fwd3[] = {0, 1, 2}, rev3[] = {2, 1, 0}, mix3[] = {1, 2, 0};
    for (int k = 0; k < PST_OPTIM_KIND_COUNT_; k++) {
        pst_optim_kind kind = (pst_optim_kind)k;
        run_sync_case(1, kind, fwd1, 6);
        run_sync_case(2, kind, fwd2, 6);
        run_sync_case(2, kind, rev2, 6);
        run_sync_case(3, kind, fwd3, 6);
        run_sync_case(3, kind, rev3, 6);
        run_sync_case(3, kind, mix3, 6);
    }
}

/* The order of summation is fixed: with values whose float sum depends on the order, the
 * result is the trainer-id-order sum even when trainer 2 arrives first. */
Test(store, sync_sum_order_is_trainer_id_order)
{
    ps_block_spec one = {.id = 0, .offset = 0, .length = 1};
    ps_store_config cfg = {.mode = PST_MODE_SYNC, .num_trainers = 3, .blocks = &one,
                           .nblocks = 1};
    pst_optim_defaults(&cfg.optim);
    cfg.optim.kind = PST_OPTIM_SGD;
    cfg.optim.lr = 1.0f;
    float zero = 0.0f;
    ps_store *st = NULL;
    cr_assert_eq(ps_store_init(&st, &cfg, &zero), PST_OK);
    /* (1e8 + -1e8) + 1 = 1, while (1 + -1e8) + 1e8 = 0 in float. */
    float g0 = 1e8f, g1 = -1e8f, g2 = 1.0f;
    cr_assert_eq(push_grad(st, 2, 0, 0, &g2, 1, NULL, NULL), PST_OK);
    cr_assert_eq(push_grad(st, 1, 0, 0, &g1, 1, NULL, NULL), PST_OK);
    cr_assert_eq(push_grad(st, 0, 0, 0, &g0, 1, NULL, NULL), PST_OK);
    float p;
    cr_assert_eq(ps_store_read(st, 0, &p, NULL), PST_OK);
    cr_assert_eq(p, -1.0f, "p = %g", (double)p);
    ps_store_free(st);
}

/* A chain's push (PS_PUSH_ALL_TRAINERS): the step's whole sum, made by the trainers in
 * trainer-id order, updates the block as the trainers' own pushes would (the same bits),
 * through every push entry point; a repeat is a duplicate, and it is refused once a trainer
 * pushed the step itself. */
Test(store, chain_sum_push_equals_the_trainers_pushes)
{
    float init_a[TOTAL_LEN], init_b[TOTAL_LEN];
    ps_store *alone = make_store(PST_MODE_SYNC, 3, PST_OPTIM_ADAM, init_a);
    ps_store *chain = make_store(PST_MODE_SYNC, 3, PST_OPTIM_ADAM, init_b);
    for (int step = 0; step < 3; step++) {
        for (int bi = 0; bi < NTB; bi++) {
            const ps_block_spec *b = &test_blocks[bi];
            float g[3][64], sum[64];
            for (int t = 0; t < 3; t++)
                fill_normal(g[t], b->length, 7, (uint64_t)(step * 100 + bi * 10 + t),
                            t == 1 ? 1e4f : 1.0f);
            for (uint64_t i = 0; i < b->length; i++)
                sum[i] = (g[0][i] + g[1][i]) + g[2][i];
            for (int t = 0; t < 3; t++)
                cr_assert_eq(push_grad(alone, (uint32_t)t, step, b->id, g[t], b->length, NULL,
                                       NULL), PST_OK, "%s", pst_error_detail());
            int dup = -1;
            pst_status rc;
            if (step == 0) { /* in the call, through a fill */
                fill_src f = {.g = sum};
                rc = ps_store_push_scaled(chain, 2, step, b->id, b->length, 1.0f, fill_copy, &f,
                                          PS_PUSH_ALL_TRAINERS, &dup);
            } else { /* an array (step 1 as if from shared memory) */
                rc = ps_store_push_f32(chain, 2, step, b->id, sum, b->length,
                                       PS_PUSH_ALL_TRAINERS |
                                           (step == 1 ? PS_PUSH_SHARED_SOURCE : 0), &dup);
            }
            cr_assert_eq(rc, PST_OK, "%s", pst_error_detail());
            cr_assert_eq(dup, 0);
            cr_assert_eq(ps_store_push_f32(chain, 2, step, b->id, sum, b->length,
                                           PS_PUSH_ALL_TRAINERS, &dup), PST_OK);
            cr_assert_eq(dup, 1, "a chain's repeated push is a duplicate");
            float va[64], vb[64];
            int64_t ra = -1, rb = -2;
            cr_assert_eq(ps_store_read(alone, b->id, va, &ra), PST_OK);
            cr_assert_eq(ps_store_read(chain, b->id, vb, &rb), PST_OK);
            cr_assert_eq(ra, rb);
            cr_assert(memcmp(va, vb, b->length * sizeof(float)) == 0,
                      "step %d block %u: the chain's sum gave other values", step, b->id);
        }
    }
    /* a trainer pushed step 3 itself: the chain's sum of it is refused, nothing changes */
    const ps_block_spec *b = &test_blocks[0];
    float g[64] = {0};
    cr_assert_eq(push_grad(chain, 0, 3, b->id, g, b->length, NULL, NULL), PST_OK);
    snapshot before;
    take_snapshot(chain, &before);
    cr_assert_eq(ps_store_push_f32(chain, 2, 3, b->id, g, b->length, PS_PUSH_ALL_TRAINERS,
                                   NULL), PST_ERR_STATE);
    cr_assert(strstr(pst_error_detail(), "PSTRAIN_CHAIN"), "%s", pst_error_detail());
    assert_unchanged(chain, &before);
    ps_store_free(alone);
    ps_store_free(chain);
}

/* ---- pulls ---- */

Test(store, pull_deferred_until_version)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_SYNC, 2, PST_OPTIM_MOMENTUM, initial);
    pst_optim_config o;
    optim_for(PST_OPTIM_MOMENTUM, &o);
    const int bi = 1; /* block id 3 */
    ref_block ref;
    ref_init(&ref, initial + initial_offset(bi), test_blocks[bi].length);

    pull_box now, first, second, later;
    pull_box_init(&now);
    pull_box_init(&first);
    pull_box_init(&second);
    pull_box_init(&later);
    ps_pull_waiter w_now, w_first, w_second, w_later;

    /* Version 0 exists: answered before the call returns. */
    cr_assert_eq(ps_store_pull(st, 3, 0, &w_now, pull_capture, &now), PST_OK);
    cr_assert_eq(now.calls, 1);
    cr_assert_eq(now.st, PST_OK);
    cr_assert_eq(now.version, 0);
    cr_assert_eq(now.length, 17);
    cr_assert(memcmp(now.values, ref.p, 17 * sizeof(float)) == 0);

    cr_assert_eq(ps_store_pull(st, 3, 1, &w_first, pull_capture, &first), PST_OK);
    cr_assert_eq(ps_store_pull(st, 3, 1, &w_second, pull_capture, &second), PST_OK);
    cr_assert_eq(ps_store_pull(st, 3, 2, &w_later, pull_capture, &later), PST_OK);
    cr_assert_eq(first.calls + second.calls + later.calls, 0);

    float g[MAX_T][64];
    fill_normal(g[0], 17, 3, 0, 1.0f);
    fill_normal(g[1], 17, 3, 1, 1.0f);
    cr_assert_eq(push_grad(st, 1, 0, 3, g[1], 17, NULL, NULL), PST_OK);
    cr_assert_eq(first.calls + second.calls + later.calls, 0, "answered before the step");
    /* Pushes to other blocks do not answer this block's waiters. */
    float other[64];
    fill_normal(other, 33, 3, 9, 1.0f);
    cr_assert_eq(push_grad(st, 0, 0, 12, other, 33, NULL, NULL), PST_OK);
    cr_assert_eq(push_grad(st, 1, 0, 12, other, 33, NULL, NULL), PST_OK);
    cr_assert_eq(first.calls + second.calls + later.calls, 0);

    cr_assert_eq(push_grad(st, 0, 0, 3, g[0], 17, NULL, NULL), PST_OK);
    ref_step(&ref, &o, g, 2);
    cr_assert_eq(first.calls, 1);
    cr_assert_eq(second.calls, 1);
    cr_assert_eq(later.calls, 0, "version 2 does not exist yet");
    cr_assert_lt(first.order, second.order, "waiters are answered in queue order");
    cr_assert_eq(first.st, PST_OK);
    cr_assert_eq(first.version, 1);
    cr_assert_eq(first.length, 17);
    cr_assert(memcmp(first.values, ref.p, 17 * sizeof(float)) == 0);
    cr_assert(memcmp(second.values, ref.p, 17 * sizeof(float)) == 0);

    /* The answered waiter can be reused at once. */
    cr_assert_eq(ps_store_pull(st, 3, 2, &w_first, pull_capture, &first), PST_OK);
    cr_assert_eq(first.calls, 1);
    fill_normal(g[0], 17, 4, 0, 1.0f);
    fill_normal(g[1], 17, 4, 1, 1.0f);
    cr_assert_eq(push_grad(st, 0, 1, 3, g[0], 17, NULL, NULL), PST_OK);
    cr_assert_eq(push_grad(st, 1, 1, 3, g[1], 17, NULL, NULL), PST_OK);
    ref_step(&ref, &o, g, 2);
    cr_assert_eq(first.calls, 2);
    cr_assert_eq(later.calls, 1);
    cr_assert_eq(later.version, 2);
    cr_assert(memcmp(later.values, ref.p, 17 * sizeof(float)) == 0);
    cr_assert(memcmp(first.values, ref.p, 17 * sizeof(float)) == 0);

    /* Unknown block or missing arguments: error, fn never called. */
    pull_box none;
    pull_box_init(&none);
    ps_pull_waiter w_none;
    cr_assert_eq(ps_store_pull(st, 99, 0, &w_none, pull_capture, &none), PST_ERR_NOT_FOUND);
    cr_assert_eq(ps_store_pull(st, 3, 0, NULL, pull_capture, &none), PST_ERR_INVALID);
    cr_assert_eq(ps_store_pull(st, 3, 0, &w_none, NULL, &none), PST_ERR_INVALID);
    cr_assert_eq(none.calls, 0);
    ps_store_free(st);
}

Test(store, pull_cancel_withdraws_one_waiter)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_SYNC, 1, PST_OPTIM_SGD, initial);
    pull_box a, b;
    pull_box_init(&a);
    pull_box_init(&b);
    ps_pull_waiter wa, wb;
    cr_assert_eq(ps_store_pull(st, 7, 1, &wa, pull_capture, &a), PST_OK);
    cr_assert_eq(ps_store_pull(st, 7, 1, &wb, pull_capture, &b), PST_OK);
    cr_assert_eq(ps_store_pull_cancel(st, &wa), 1);
    cr_assert_eq(ps_store_pull_cancel(st, &wa), 0);
    float g[64];
    fill_normal(g, 5, 5, 0, 1.0f);
    cr_assert_eq(push_grad(st, 0, 0, 7, g, 5, NULL, NULL), PST_OK);
    cr_assert_eq(a.calls, 0, "a withdrawn pull is never answered");
    cr_assert_eq(b.calls, 1);
    cr_assert_eq(ps_store_pull_cancel(st, &wb), 0, "already answered");
    ps_store_free(st);
}

Test(store, cancel_waiters_delivers_error)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_SYNC, 2, PST_OPTIM_ADAM, initial);
    pull_box a, b, c, after, avail;
    pull_box_init(&a);
    pull_box_init(&b);
    pull_box_init(&c);
    pull_box_init(&after);
    pull_box_init(&avail);
    ps_pull_waiter wa, wb, wc, wafter, wavail;
    cr_assert_eq(ps_store_pull(st, 3, 1, &wa, pull_capture, &a), PST_OK);
    cr_assert_eq(ps_store_pull(st, 3, 5, &wb, pull_capture, &b), PST_OK);
    cr_assert_eq(ps_store_pull(st, 12, 1, &wc, pull_capture, &c), PST_OK);
    cr_assert_eq(a.calls + b.calls + c.calls, 0);

    ps_store_cancel_waiters(st, PST_ERR_UNAVAILABLE);
    pull_box *boxes[] = {&a, &b, &c};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(boxes[i]->calls, 1);
        cr_assert_eq(boxes[i]->st, PST_ERR_UNAVAILABLE);
        cr_assert(boxes[i]->values_null);
        cr_assert_eq(boxes[i]->length, 0);
    }
    cr_assert_eq(ps_store_pull_cancel(st, &wa), 0);

    /* Afterwards a pull that would wait fails at once; one that can be served is. */
    cr_assert_eq(ps_store_pull(st, 7, 1, &wafter, pull_capture, &after), PST_OK);
    cr_assert_eq(after.calls, 1);
    cr_assert_eq(after.st, PST_ERR_UNAVAILABLE);
    cr_assert_eq(ps_store_pull(st, 7, 0, &wavail, pull_capture, &avail), PST_OK);
    cr_assert_eq(avail.calls, 1);
    cr_assert_eq(avail.st, PST_OK);
    cr_assert(memcmp(avail.values, initial + initial_offset(0), 5 * sizeof(float)) == 0);

    /* Cancelling again, and with PST_OK (replaced by PST_ERR_STATE), calls nobody twice. */
    ps_store_cancel_waiters(st, PST_OK);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(boxes[i]->calls, 1);
    pull_box late;
    pull_box_init(&late);
    ps_pull_waiter wlate;
    cr_assert_eq(ps_store_pull(st, 7, 3, &wlate, pull_capture, &late), PST_OK);
    cr_assert_eq(late.st, PST_ERR_STATE);
    ps_store_free(st);
}

/* ---- duplicates and rejected pushes ---- */

Test(store, duplicate_push_counted_once)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_SYNC, 2, PST_OPTIM_ADAM, initial);
    pst_optim_config o;
    optim_for(PST_OPTIM_ADAM, &o);
    const int bi = 2; /* block id 12 */
    ref_block ref;
    ref_init(&ref, initial + initial_offset(bi), 33);

    float g[MAX_T][64], retry[64];
    fill_normal(g[0], 33, 6, 0, 1.0f);
    fill_normal(g[1], 33, 6, 1, 1.0f);
    fill_normal(retry, 33, 6, 2, 1.0f); /* different bits: must not be used */
    int dup = -1, calls = -1;
    cr_assert_eq(push_grad(st, 0, 0, 12, g[0], 33, &dup, &calls), PST_OK);
    cr_assert_eq(dup, 0);
    cr_assert_eq(calls, 1);
    cr_assert_eq(push_grad(st, 0, 0, 12, retry, 33, &dup, &calls), PST_OK);
    cr_assert_eq(dup, 1, "same trainer, step and block again is a duplicate");
    cr_assert_eq(calls, 0, "a duplicate's payload is not read");
    cr_assert_eq(ps_store_version(st, 12), 0, "one trainer's retry does not complete a step");
    cr_assert_eq(push_grad(st, 1, 0, 12, g[1], 33, &dup, NULL), PST_OK);
    cr_assert_eq(dup, 0);
    ref_step(&ref, &o, g, 2);
    assert_block_equals(st, bi, &ref);

    /* Step 0 again, from either trainer, is now an old step: duplicate, nothing changes. */
    snapshot before;
    take_snapshot(st, &before);
    cr_assert_eq(push_grad(st, 1, 0, 12, retry, 33, &dup, &calls), PST_OK);
    cr_assert_eq(dup, 1);
    cr_assert_eq(calls, 0);
    cr_assert_eq(push_grad(st, 0, 0, 12, retry, 33, &dup, &calls), PST_OK);
    cr_assert_eq(dup, 1);
    assert_unchanged(st, &before);

    /* duplicate may be NULL. */
    fill_src f = {.g = retry};
    cr_assert_eq(ps_store_push(st, 0, 0, 12, 33, fill_copy, &f, NULL), PST_OK);
    ps_store_free(st);
}

Test(store, future_step_rejected)
{
    ps_block_spec one = {.id = 3, .offset = 0, .length = 4};
    ps_store_config cfg = {.mode = PST_MODE_SYNC, .num_trainers = 1, .blocks = &one,
                           .nblocks = 1};
    optim_for(PST_OPTIM_MOMENTUM, &cfg.optim);
    float init[4] = {1, 2, 3, 4}, g[4] = {0.5f, -0.25f, 1, 2};
    ps_store *st = NULL;
    cr_assert_eq(ps_store_init(&st, &cfg, init), PST_OK);
    for (int s = 0; s < 7; s++)
        cr_assert_eq(push_grad(st, 0, s, 3, g, 4, NULL, NULL), PST_OK);
    cr_assert_eq(ps_store_version(st, 3), 7);

    float before[4], after[4];
    cr_assert_eq(ps_store_read(st, 3, before, NULL), PST_OK);
    int dup = -1, calls = -1;
    pst_error_clear();
    cr_assert_eq(push_grad(st, 0, 9, 3, g, 4, &dup, &calls), PST_ERR_RANGE);
    cr_assert_str_eq(pst_error_detail(), "step 9 is ahead of block 3's version 7");
    cr_assert_eq(dup, 0);
    cr_assert_eq(calls, 0);
    cr_assert_eq(push_grad(st, 0, 8, 3, g, 4, NULL, NULL), PST_ERR_RANGE);
    cr_assert_eq(ps_store_version(st, 3), 7);
    cr_assert_eq(ps_store_read(st, 3, after, NULL), PST_OK);
    cr_assert(memcmp(before, after, sizeof before) == 0);
    ps_store_free(st);
}

Test(store, bad_push_exact_codes_store_unchanged)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_SYNC, 2, PST_OPTIM_ADAMW, initial);
    pst_optim_config o;
    optim_for(PST_OPTIM_ADAMW, &o);
    ref_block ref;
    ref_init(&ref, initial + initial_offset(0), 5);
    float g[MAX_T][64];
    fill_normal(g[0], 5, 7, 0, 1.0f);
    fill_normal(g[1], 5, 7, 1, 1.0f);
    snapshot before;
    take_snapshot(st, &before);

    int dup = -1, calls = -1;
    cr_assert_eq(push_grad(st, 0, 0, 99, g[0], 5, &dup, &calls), PST_ERR_NOT_FOUND);
    cr_assert_eq(calls, 0);
    cr_assert(strstr(pst_error_detail(), "block 99") != NULL, "%s", pst_error_detail());
    cr_assert_eq(push_grad(st, 0, 0, 7, g[0], 4, &dup, &calls), PST_ERR_INVALID);
    cr_assert_eq(calls, 0);
    cr_assert_eq(push_grad(st, 0, 0, 7, g[0], 6, &dup, &calls), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "5 elements") != NULL, "%s", pst_error_detail());
    cr_assert_eq(push_grad(st, 2, 0, 7, g[0], 5, &dup, &calls), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "trainer id 2") != NULL, "%s", pst_error_detail());
    cr_assert_eq(push_grad(st, UINT32_MAX, 0, 7, g[0], 5, &dup, &calls), PST_ERR_INVALID);
    cr_assert_eq(push_grad(st, 0, -1, 7, g[0], 5, &dup, &calls), PST_ERR_INVALID);
    cr_assert_eq(calls, 0);
    cr_assert_eq(dup, 0);
    cr_assert_eq(ps_store_push(st, 0, 0, 7, 5, NULL, NULL, &dup), PST_ERR_INVALID);
    /* A failing fill: its status and detail come back, nothing is counted. */
    fill_src f = {.g = g[0], .fail = PST_ERR_FORMAT};
    cr_assert_eq(ps_store_push(st, 0, 0, 7, 5, fill_copy, &f, &dup), PST_ERR_FORMAT);
    cr_assert_str_eq(pst_error_detail(), "test fill failed");
    assert_unchanged(st, &before);

    /* None of them counted: the step needs both trainers and equals the reference. */
    cr_assert_eq(push_grad(st, 1, 0, 7, g[1], 5, &dup, NULL), PST_OK);
    cr_assert_eq(dup, 0);
    cr_assert_eq(ps_store_version(st, 7), 0);
    cr_assert_eq(push_grad(st, 0, 0, 7, g[0], 5, &dup, NULL), PST_OK);
    cr_assert_eq(dup, 0);
    ref_step(&ref, &o, g, 2);
    assert_block_equals(st, 0, &ref);
    ps_store_free(st);
}

Test(store, nonfinite_gradient_rejected)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_SYNC, 2, PST_OPTIM_MOMENTUM, initial);
    pst_optim_config o;
    optim_for(PST_OPTIM_MOMENTUM, &o);
    ref_block ref;
    ref_init(&ref, initial + initial_offset(1), 17);
    float g[MAX_T][64], bad[64];
    fill_normal(g[0], 17, 8, 0, 1.0f);
    fill_normal(g[1], 17, 8, 1, 1.0f);

    pull_box box;
    pull_box_init(&box);
    ps_pull_waiter w;
    cr_assert_eq(ps_store_pull(st, 3, 1, &w, pull_capture, &box), PST_OK);
    cr_assert_eq(push_grad(st, 0, 0, 3, g[0], 17, NULL, NULL), PST_OK);
    snapshot before;
    take_snapshot(st, &before);

    const float poison[] = {NAN, INFINITY, -INFINITY};
    const char *names[] = {"nan", "inf", "-inf"};
    for (int k = 0; k < 3; k++) {
        memcpy(bad, g[1], sizeof bad);
        bad[16] = poison[k]; /* last element: the scan must reach the tail */
        int dup = -1, calls = -1;
        cr_assert_eq(push_grad(st, 1, 0, 3, bad, 17, &dup, &calls), PST_ERR_INVALID);
        cr_assert_eq(calls, 1);
        cr_assert_eq(dup, 0);
        cr_assert(strstr(pst_error_detail(), names[k]) != NULL, "%s", pst_error_detail());
        cr_assert(strstr(pst_error_detail(), "element 16") != NULL, "%s", pst_error_detail());
        assert_unchanged(st, &before);
        cr_assert_eq(box.calls, 0);
    }
    /* Trainer 0's gradient was fine and stays counted; it may not be poisoned by a retry. */
    memcpy(bad, g[0], sizeof bad);
    bad[0] = NAN;
    int dup = -1;
    cr_assert_eq(push_grad(st, 0, 0, 3, bad, 17, &dup, NULL), PST_OK);
    cr_assert_eq(dup, 1);

    /* A clean push for the same step completes it. */
    cr_assert_eq(push_grad(st, 1, 0, 3, g[1], 17, &dup, NULL), PST_OK);
    cr_assert_eq(dup, 0);
    ref_step(&ref, &o, g, 2);
    assert_block_equals(st, 1, &ref);
    cr_assert_eq(box.calls, 1);
    cr_assert(memcmp(box.values, ref.p, 17 * sizeof(float)) == 0);

    ps_store_free(st);
}

/* A block of several fill pieces (64 KiB each): a NaN in a later piece names its element
 * and changes nothing; a clean push is copied whole (every piece, in order). */
Test(store, large_block_filled_in_pieces)
{
    enum { N = 3 * 16384 + 77 };
    static float initial[N], g[N], v[N];
    ps_block_spec spec = {.id = 0, .offset = 0, .length = N};
    ps_store_config cfg = {.mode = PST_MODE_SYNC, .num_trainers = 1, .blocks = &spec, .nblocks = 1};
    optim_for(PST_OPTIM_SGD, &cfg.optim);
    fill_normal(initial, N, 1, 0, 1.0f);
    fill_normal(g, N, 2, 0, 1.0f);
    ps_store *st = NULL;
    cr_assert_eq(ps_store_init(&st, &cfg, initial), PST_OK, "%s", pst_error_detail());
    g[2 * 16384 + 5] = NAN;
    int calls = 0;
    cr_assert_eq(push_grad(st, 0, 0, 0, g, N, NULL, &calls), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "element 32773") != NULL, "%s", pst_error_detail());
    cr_assert_eq(calls, 3, "stops at the piece with the NaN");
    int64_t version = -1;
    cr_assert_eq(ps_store_read(st, 0, v, &version), PST_OK);
    cr_assert_eq(version, 0);
    cr_assert(memcmp(v, initial, sizeof v) == 0, "a rejected push changed the values");
    g[2 * 16384 + 5] = 0.25f;
    cr_assert_eq(push_grad(st, 0, 0, 0, g, N, NULL, &calls), PST_OK);
    /* 4 pieces checked, then (the push makes the update) read again tile by tile */
    cr_assert_eq(calls, 4 + (N + 4095) / 4096);
    cr_assert_eq(ps_store_read(st, 0, v, &version), PST_OK);
    cr_assert_eq(version, 1);
    static float ref[N];
    memcpy(ref, initial, sizeof ref);
    pst_optim_apply(&cfg.optim, 1, ref, NULL, N, g, N);
    cr_assert(memcmp(v, ref, sizeof v) == 0, "the update differs from one pass over the block");
    ps_store_free(st);
}

/* ---- async mode ---- */

Test(store, async_applies_each_push)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_ASYNC, 3, PST_OPTIM_ADAM, initial);
    pst_optim_config o;
    optim_for(PST_OPTIM_ADAM, &o);
    ref_block ref;
    ref_init(&ref, initial + initial_offset(2), 33);

    pull_box box;
    pull_box_init(&box);
    ps_pull_waiter w;
    cr_assert_eq(ps_store_pull(st, 12, 2, &w, pull_capture, &box), PST_OK);

    /* Trainers at different steps, in any order: each push is one update. */
    static const struct { uint32_t t; int64_t step; } seq[] = {
        {2, 0}, {0, 0}, {0, 1}, {1, 5}, {2, 1}, {0, 2}, {1, 6},
    };
    for (size_t k = 0; k < sizeof seq / sizeof seq[0]; k++) {
        float g[1][64];
        fill_normal(g[0], 33, 9, k, 1.0f);
        int dup = -1;
        cr_assert_eq(push_grad(st, seq[k].t, seq[k].step, 12, g[0], 33, &dup, NULL), PST_OK,
                     "%s", pst_error_detail());
        cr_assert_eq(dup, 0);
        ref_step(&ref, &o, g, 1);
        assert_block_equals(st, 2, &ref);
        if (k == 1) {
            cr_assert_eq(box.calls, 1, "pull for version 2 answered by the second push");
            cr_assert_eq(box.version, 2);
            cr_assert(memcmp(box.values, ref.p, 33 * sizeof(float)) == 0);
        }
    }

    /* Retries: a step at or below the trainer's last applied step for this block. */
    snapshot before;
    take_snapshot(st, &before);
    float g[64];
    fill_normal(g, 33, 10, 0, 1.0f);
    int dup = -1, calls = -1;
    cr_assert_eq(push_grad(st, 0, 2, 12, g, 33, &dup, &calls), PST_OK);
    cr_assert_eq(dup, 1);
    cr_assert_eq(calls, 0);
    cr_assert_eq(push_grad(st, 1, 3, 12, g, 33, &dup, NULL), PST_OK);
    cr_assert_eq(dup, 1);
    /* Per block: trainer 0's step 2 is new for block 3. */
    fill_normal(g, 17, 10, 1, 1.0f);
    cr_assert_eq(push_grad(st, 0, 2, 3, g, 17, &dup, NULL), PST_OK);
    cr_assert_eq(dup, 0);
    cr_assert_eq(ps_store_version(st, 3), 1);
    /* Future steps are fine in async mode; non-finite gradients are not. */
    fill_normal(g, 33, 10, 2, 1.0f);
    g[3] = NAN;
    cr_assert_eq(push_grad(st, 2, 100, 12, g, 33, &dup, NULL), PST_ERR_INVALID);
    snapshot mid;
    take_snapshot(st, &mid);
    for (int i = 0; i < NTB; i++)
        if (test_blocks[i].id != 3)
            cr_assert(memcmp(mid.v[i], before.v[i], sizeof mid.v[i]) == 0 &&
                      mid.ver[i] == before.ver[i]);
    /* The rejected push did not record step 100: the clean retry is applied. */
    g[3] = 0.25f;
    cr_assert_eq(push_grad(st, 2, 100, 12, g, 33, &dup, NULL), PST_OK);
    cr_assert_eq(dup, 0);
    float gg[1][64];
    memcpy(gg[0], g, sizeof g);
    ref_step(&ref, &o, gg, 1);
    assert_block_equals(st, 2, &ref);
    ps_store_free(st);
}

/* Momentum, Adam and Adagrad state carry across many steps: the store after 25 sync steps
 * equals a plain loop of pst_optim_apply over the trainer-ordered sums. */
Test(store, optimizer_state_carried_across_steps)
{
    const pst_optim_kind kinds[] = {PST_OPTIM_MOMENTUM, PST_OPTIM_ADAM, PST_OPTIM_ADAMW,
                                    PST_OPTIM_ADAGRAD};
    for (int k = 0; k < 4; k++) {
        float initial[TOTAL_LEN];
        ps_store *st = make_store(PST_MODE_SYNC, 2, kinds[k], initial);
        pst_optim_config o;
        optim_for(kinds[k], &o);
        float p[TOTAL_LEN], state[2 * TOTAL_LEN];
        memcpy(p, initial, sizeof p);
        memset(state, 0, sizeof state);
        for (int s = 0; s < 25; s++) {
            for (int i = 0; i < NTB; i++) {
                uint64_t n = test_blocks[i].length, off = initial_offset(i);
                float g0[64], g1[64], acc[64];
                fill_normal(g0, n, 11, (uint64_t)(s * 10 + i * 2), 1.0f);
                fill_normal(g1, n, 11, (uint64_t)(s * 10 + i * 2 + 1), 1.0f);
                cr_assert_eq(push_grad(st, 1, s, test_blocks[i].id, g1, n, NULL, NULL), PST_OK);
                cr_assert_eq(push_grad(st, 0, s, test_blocks[i].id, g0, n, NULL, NULL), PST_OK);
                for (uint64_t j = 0; j < n; j++)
                    acc[j] = g0[j] + g1[j];
                /* The whole buffer's state laid out as (2, TOTAL_LEN): the per-block
                 * sub-range call of optim.h. */
                pst_optim_apply(&o, s + 1, p + off, state + off, TOTAL_LEN, acc, n);
            }
        }
        for (int i = 0; i < NTB; i++) {
            float got[64];
            int64_t ver;
            cr_assert_eq(ps_store_read(st, test_blocks[i].id, got, &ver), PST_OK);
            cr_assert_eq(ver, 25);
            cr_assert(memcmp(got, p + initial_offset(i),
                             (size_t)test_blocks[i].length * sizeof(float)) == 0,
                      "%s: block %u differs", pst_optim_kind_name(kinds[k]),
                      (unsigned)test_blocks[i].id);
        }
        ps_store_free(st);
    }
}

/* ---- concurrency ---- */

#define STRESS_T 3
#define STRESS_NB 24
#define STRESS_STEPS 400
#define STRESS_MAXLEN 700

typedef struct stress_layout {
    ps_block_spec blocks[STRESS_NB];
    uint64_t total;
} stress_layout;

static void stress_layout_make(stress_layout *l)
{
    uint64_t off = 0;
    for (int b = 0; b < STRESS_NB; b++) {
        /* Ids scattered, lengths from 1 to STRESS_MAXLEN. */
        l->blocks[b].id = (uint32_t)(b * 37 % 101);
        l->blocks[b].offset = off;
        l->blocks[b].length = b == 0 ? 1 : (uint64_t)(b * 131 % STRESS_MAXLEN) + 1;
        off += l->blocks[b].length;
    }
    l->total = off;
}

/* The gradient trainer t computes at step s for block b from the parameters it pulled:
 * a quadratic pull towards zero plus trainer-specific noise. */
static void stress_grad(float *g, const float *p, uint64_t n, int t, int s, int b)
{
    pst_rng r;
    pst_rng_seed(&r, 12, (uint64_t)((t * STRESS_STEPS + s) * STRESS_NB + b));
    for (uint64_t i = 0; i < n; i++)
        g[i] = 0.5f * p[i] * (float)(t + 1) + 0.1f * pst_rng_normal(&r);
}

typedef struct stress_trainer stress_trainer;

typedef struct stress_pull {
    stress_trainer *tr;
    int b;
    ps_pull_waiter w;
} stress_pull;

struct stress_trainer {
    int t;
    ps_store *st;
    const stress_layout *l;
    float *params; /* (total) this trainer's copy, written by the pull answers */
    stress_pull pulls[STRESS_NB];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int answered;
    int64_t want;
    int failures;  /* checked by the main thread after join (no asserts off-thread) */
    char why[256];
};

/* Records the first failure; called with tr->mu held. */
static void stress_fail(stress_trainer *tr, const char *what)
{
    if (tr->failures++ == 0)
        snprintf(tr->why, sizeof tr->why, "trainer %d: %s (%s)", tr->t, what,
                 pst_error_detail());
}

static void stress_answer(void *arg, pst_status st, const float *values, const void *lowp,
                          uint64_t length, int64_t version)
{
    (void)lowp;
    stress_pull *p = arg;
    stress_trainer *tr = p->tr;
    const ps_block_spec *spec = &tr->l->blocks[p->b];
    pthread_mutex_lock(&tr->mu);
    if (st != PST_OK || length != spec->length || version != tr->want)
        stress_fail(tr, "bad pull answer");
    else
        memcpy(tr->params + spec->offset, values, (size_t)length * sizeof(float));
    tr->answered++;
    pthread_cond_signal(&tr->cv);
    pthread_mutex_unlock(&tr->mu);
}

static void *stress_trainer_main(void *arg)
{
    stress_trainer *tr = arg;
    const stress_layout *l = tr->l;
    float *g = malloc(STRESS_MAXLEN * sizeof(float));
    int order[STRESS_NB];
    pst_rng r;
    pst_rng_seed(&r, 13, (uint64_t)tr->t);
    for (int s = 0; s < STRESS_STEPS; s++) {
        /* Each trainer pushes its blocks in its own shuffled order every step. */
        for (int b = 0; b < STRESS_NB; b++)
            order[b] = b;
        for (int b = STRESS_NB - 1; b > 0; b--) {
            int j = (int)pst_rng_below(&r, (uint64_t)b + 1), tmp = order[b];
            order[b] = order[j];
            order[j] = tmp;
        }
        pthread_mutex_lock(&tr->mu);
        tr->answered = 0;
        tr->want = s + 1;
        pthread_mutex_unlock(&tr->mu);
        for (int k = 0; k < STRESS_NB; k++) {
            int b = order[k];
            const ps_block_spec *spec = &l->blocks[b];
            stress_grad(g, tr->params + spec->offset, spec->length, tr->t, s, b);
            fill_src f = {.g = g};
            int dup = -1;
            const char *failed = NULL;
            if (ps_store_push(tr->st, (uint32_t)tr->t, s, spec->id, spec->length, fill_copy,
                              &f, &dup) != PST_OK || dup != 0)
                failed = "push";
            /* Every fourth push is retried, as a client whose reply was lost would. */
            if (!failed && pst_rng_below(&r, 4) == 0) {
                if (ps_store_push(tr->st, (uint32_t)tr->t, s, spec->id, spec->length,
                                  fill_copy, &f, &dup) != PST_OK || dup != 1)
                    failed = "retry not a duplicate";
            }
            if (!failed && ps_store_pull(tr->st, spec->id, s + 1, &tr->pulls[b].w,
                                         stress_answer, &tr->pulls[b]) != PST_OK)
                failed = "pull";
            if (failed) {
                /* The step cannot complete now; stop so the test reports it. */
                pthread_mutex_lock(&tr->mu);
                stress_fail(tr, failed);
                pthread_mutex_unlock(&tr->mu);
                free(g);
                return NULL;
            }
        }
        pthread_mutex_lock(&tr->mu);
        while (tr->answered < STRESS_NB)
            pthread_cond_wait(&tr->cv, &tr->mu);
        pthread_mutex_unlock(&tr->mu);
    }
    free(g);
    return NULL;
}

typedef struct stress_reader {
    ps_store *st;
    const stress_layout *l;
    atomic_int stop;
    int failures;
} stress_reader;

/* Reads snapshots concurrently; versions of a block never go back. */
static void *stress_reader_main(void *arg)
{
    stress_reader *rd = arg;
    float *buf = malloc(STRESS_MAXLEN * sizeof(float));
    int64_t last[STRESS_NB] = {0};
    while (!atomic_load(&rd->stop)) {
        for (int b = 0; b < STRESS_NB; b++) {
            int64_t v = -1;
            if (ps_store_read(rd->st, rd->l->blocks[b].id, buf, &v) != PST_OK || v < last[b])
                rd->failures++;
            last[b] = v;
        }
    }
    free(buf);
    return NULL;
}

Test(store, multithreaded_sync_equals_sequential, .timeout = 20)
{
    static stress_layout l;
    stress_layout_make(&l);
    float *initial = malloc(l.total * sizeof(float));
    fill_normal(initial, l.total, 14, 0, 1.0f);
    ps_store_config cfg = {.mode = PST_MODE_SYNC, .num_trainers = STRESS_T, .blocks = l.blocks,
                           .nblocks = STRESS_NB};
    optim_for(PST_OPTIM_ADAM, &cfg.optim);
    ps_store *st = NULL;
    cr_assert_eq(ps_store_init(&st, &cfg, initial), PST_OK, "%s", pst_error_detail());

    static stress_trainer tr[STRESS_T];
    pthread_t th[STRESS_T], rth;
    stress_reader rd = {.st = st, .l = &l};
    cr_assert_eq(pthread_create(&rth, NULL, stress_reader_main, &rd), 0);
    for (int t = 0; t < STRESS_T; t++) {
        memset(&tr[t], 0, sizeof tr[t]);
        tr[t].t = t;
        tr[t].st = st;
        tr[t].l = &l;
        tr[t].params = malloc(l.total * sizeof(float));
        memcpy(tr[t].params, initial, l.total * sizeof(float));
        for (int b = 0; b < STRESS_NB; b++) {
            tr[t].pulls[b].tr = &tr[t];
            tr[t].pulls[b].b = b;
        }
        pthread_mutex_init(&tr[t].mu, NULL);
        pthread_cond_init(&tr[t].cv, NULL);
        cr_assert_eq(pthread_create(&th[t], NULL, stress_trainer_main, &tr[t]), 0);
    }
    for (int t = 0; t < STRESS_T; t++)
        pthread_join(th[t], NULL);
    atomic_store(&rd.stop, 1);
    pthread_join(rth, NULL);
    for (int t = 0; t < STRESS_T; t++)
        cr_assert_eq(tr[t].failures, 0, "%s", tr[t].why);
    cr_assert_eq(rd.failures, 0, "a version went back");

    /* Sequential reference: every trainer sees the same parameters at every step. */
    float *p = malloc(l.total * sizeof(float));
    float *state = calloc(2 * l.total, sizeof(float));
    float *g = malloc(STRESS_MAXLEN * sizeof(float));
    float *acc = malloc(STRESS_MAXLEN * sizeof(float));
    memcpy(p, initial, l.total * sizeof(float));
    for (int s = 0; s < STRESS_STEPS; s++) {
        for (int b = 0; b < STRESS_NB; b++) {
            const ps_block_spec *spec = &l.blocks[b];
            float *pb = p + spec->offset;
            for (int t = 0; t < STRESS_T; t++) {
                stress_grad(t == 0 ? acc : g, pb, spec->length, t, s, b);
                if (t > 0)
                    for (uint64_t i = 0; i < spec->length; i++)
                        acc[i] += g[i];
            }
            pst_optim_apply(&cfg.optim, s + 1, pb, state + spec->offset, l.total, acc,
                            spec->length);
        }
    }
    float *got = malloc(STRESS_MAXLEN * sizeof(float));
    for (int b = 0; b < STRESS_NB; b++) {
        const ps_block_spec *spec = &l.blocks[b];
        int64_t ver = -1;
        cr_assert_eq(ps_store_read(st, spec->id, got, &ver), PST_OK);
        cr_assert_eq(ver, STRESS_STEPS);
        cr_assert(memcmp(got, p + spec->offset, spec->length * sizeof(float)) == 0,
                  "block %u differs from the sequential reference", (unsigned)spec->id);
        for (int t = 0; t < STRESS_T; t++)
            cr_assert(memcmp(tr[t].params + spec->offset, got,
                             spec->length * sizeof(float)) == 0,
                      "trainer %d's last pull of block %u differs", t, (unsigned)spec->id);
    }
    for (int t = 0; t < STRESS_T; t++)
        free(tr[t].params);
    free(got);
    free(acc);
    free(g);
    free(state);
    free(p);
    free(initial);
    ps_store_free(st);
}

/* Async under contention: with SGD, lr 0.5 and small integer gradients every update is exact
 * in float, so the final values are the same whatever the interleaving. */
typedef struct async_worker {
    ps_store *st;
    int t;
    int steps;
    int failures;
} async_worker;

/* Few, long blocks: the threads collide on the same block most of the time. */
#define ASYNC_NB 2
#define ASYNC_LEN 4096

static void *async_worker_main(void *arg)
{
    async_worker *w = arg;
    float *g = malloc(ASYNC_LEN * sizeof(float));
    for (int s = 0; s < w->steps; s++) {
        for (int b = 0; b < ASYNC_NB; b++) {
            for (int i = 0; i < ASYNC_LEN; i++)
                g[i] = (float)((w->t + s + b + i) % 5 - 2);
            fill_src f = {.g = g};
            int dup = -1;
            if (ps_store_push(w->st, (uint32_t)w->t, s, (uint32_t)b, ASYNC_LEN, fill_copy, &f,
                              &dup) != PST_OK || dup != 0)
                w->failures++;
            if (ps_store_push(w->st, (uint32_t)w->t, s, (uint32_t)b, ASYNC_LEN, fill_copy, &f,
                              &dup) != PST_OK || dup != 1)
                w->failures++;
        }
    }
    free(g);
    return NULL;
}

Test(store, multithreaded_async_counts_every_push, .timeout = 20)
{
    enum { T = 4, STEPS = 400 };
    ps_block_spec blocks[ASYNC_NB];
    for (int b = 0; b < ASYNC_NB; b++)
        blocks[b] = (ps_block_spec){.id = (uint32_t)b, .offset = (uint64_t)b * ASYNC_LEN,
                                    .length = ASYNC_LEN};
    ps_store_config cfg = {.mode = PST_MODE_ASYNC, .num_trainers = T, .blocks = blocks,
                           .nblocks = ASYNC_NB};
    pst_optim_defaults(&cfg.optim);
    cfg.optim.kind = PST_OPTIM_SGD;
    cfg.optim.lr = 0.5f;
    ps_store *st = NULL;
    cr_assert_eq(ps_store_init(&st, &cfg, NULL), PST_OK);
    async_worker w[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        w[t] = (async_worker){.st = st, .t = t, .steps = STEPS};
        cr_assert_eq(pthread_create(&th[t], NULL, async_worker_main, &w[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        cr_assert_eq(w[t].failures, 0);
    }
    for (int b = 0; b < ASYNC_NB; b++) {
        static float got[ASYNC_LEN];
        int64_t ver = -1;
        cr_assert_eq(ps_store_read(st, (uint32_t)b, got, &ver), PST_OK);
        cr_assert_eq(ver, T * STEPS);
        for (int i = 0; i < ASYNC_LEN; i++) {
            float want = 0.0f;
            for (int t = 0; t < T; t++)
                for (int s = 0; s < STEPS; s++)
                    want -= 0.5f * (float)((t + s + b + i) % 5 - 2);
            cr_assert_eq(got[i], want, "block %d element %d: %g, want %g", b, i,
                         (double)got[i], (double)want);
        }
    }
    ps_store_free(st);
}

/* ---- the in-process store (trainer/local.c): push_f32, caller-owned values, a pool ---- */

#include "common/pool.h"

/* A one-trainer store whose master values are the caller's arrays (one per block, as a
 * trainer's parameter buffer), updated by f32 pushes read in place, with and without a
 * thread pool: the same bits as the reference (and so as fill pushes to an ordinary store),
 * a pull answers with the caller's own memory, and a non-finite gradient changes nothing. */
Test(store, in_process_push_f32_on_caller_values)
{
    pst_optim_kind kinds[2] = {PST_OPTIM_MOMENTUM, PST_OPTIM_ADAMW};
    for (int k = 0; k < 2; k++) {
        for (int use_pool = 0; use_pool < 2; use_pool++) {
            enum { SPAN = 40 + 33 }; /* the blocks' offsets reach this far */
            float initial[SPAN], home[SPAN];
            fill_normal(initial, SPAN, 1, 0, 1.0f);
            memcpy(home, initial, sizeof home);
            float *values[NTB];
            for (int i = 0; i < NTB; i++)
                values[i] = home + test_blocks[i].offset;
            pst_pool *pool = NULL;
            if (use_pool)
                cr_assert_eq(pst_pool_init(&pool, 2), PST_OK);
            ps_store_config cfg = {.mode = PST_MODE_SYNC, .num_trainers = 1,
                                   .blocks = test_blocks, .nblocks = NTB, .values = values,
                                   .pool = pool};
            optim_for(kinds[k], &cfg.optim);
            ps_store *st = NULL;
            cr_assert_eq(ps_store_init(&st, &cfg, NULL), PST_OK, "%s", pst_error_detail());
            cr_assert_eq(memcmp(home, initial, sizeof home), 0, "initial NULL keeps the values");
            ref_block ref;
            ref_init(&ref, initial + 40, 33); /* block 12 */
            float g[MAX_T][64];
            for (int64_t step = 0; step < 4; step++) {
                fill_normal(g[0], 33, 9, (uint64_t)step, 1.0f);
                int dup = -1;
                cr_assert_eq(ps_store_push_f32(st, 0, step, 12, g[0], 33, 0, &dup), PST_OK, "%s",
                             pst_error_detail());
                cr_assert_eq(dup, 0);
                ref_step(&ref, &cfg.optim, g, 1);
                cr_assert_eq(memcmp(home + 40, ref.p, 33 * sizeof(float)), 0,
                             "%s, pool %d, step %lld: the caller's values differ from the "
                             "reference", pst_optim_kind_name(kinds[k]), use_pool,
                             (long long)step);
                pull_box box;
                pull_now(st, 12, step + 1, &box);
                cr_assert_eq(memcmp(box.values, home + 40, 33 * sizeof(float)), 0);
            }
            /* A NaN in the last element: refused, nothing changes, the step may be pushed
             * again. */
            float before[SPAN];
            memcpy(before, home, sizeof before);
            g[0][32] = NAN;
            cr_assert_eq(ps_store_push_f32(st, 0, 4, 12, g[0], 33, 0, NULL), PST_ERR_INVALID);
            cr_assert(strstr(pst_error_detail(), "nan at element 32"), "%s", pst_error_detail());
            cr_assert_eq(memcmp(before, home, sizeof home), 0);
            cr_assert_eq(ps_store_version(st, 12), 4);
            g[0][32] = 0.5f;
            cr_assert_eq(ps_store_push_f32(st, 0, 4, 12, g[0], 33, 0, NULL), PST_OK);
            cr_assert_eq(ps_store_version(st, 12), 5);
            /* The other blocks were never pushed: untouched. */
            cr_assert_eq(memcmp(home, initial, 40 * sizeof(float)), 0);
            cr_assert_eq(ps_store_push_f32(st, 0, 5, 12, NULL, 33, 0, NULL), PST_ERR_INVALID);
            ps_store_free(st);
            pst_pool_free(pool);
        }
    }
}

/* Two threads hand the slices of one block to ps_store_update_slice, each its own ranges. */
typedef struct slice_job {
    ps_store *st;
    const float *g;
    int parity; /* this thread's slices: every other one */
} slice_job;

static void *slice_thread(void *arg)
{
    const slice_job *j = arg;
    static const uint64_t cuts[] = {0, 5, 6, 17, 30, 33}; /* uneven, one of length 1 */
    for (int i = j->parity; i < 5; i += 2)
        if (ps_store_update_slice(j->st, 12, cuts[i], cuts[i + 1] - cuts[i], j->g + cuts[i]) !=
            PST_OK)
            return (void *)1;
    return NULL;
}

/* The update made piece by piece during backward (training alone): slices from two threads
 * and then the commit give the bits of a push of the whole gradient, step after step, with
 * the same pulls; a NaN in one slice fails the commit, naming the element, and makes no
 * version; a commit of another step, a slice out of the block or on a store of two
 * trainers are refused with their codes. */
Test(store, update_made_in_slices_gives_the_bits_of_a_push, .timeout = 20)
{
    pst_optim_kind kinds[3] = {PST_OPTIM_MOMENTUM, PST_OPTIM_ADAMW, PST_OPTIM_SGD};
    for (int k = 0; k < 3; k++) {
        enum { SPAN = 40 + 33 };
        float initial[SPAN], sliced[SPAN], pushed[SPAN];
        fill_normal(initial, SPAN, 1, 0, 1.0f);
        memcpy(sliced, initial, sizeof sliced);
        memcpy(pushed, initial, sizeof pushed);
        float *vs[NTB], *vp[NTB];
        for (int i = 0; i < NTB; i++) {
            vs[i] = sliced + test_blocks[i].offset;
            vp[i] = pushed + test_blocks[i].offset;
        }
        ps_store_config cs = {.mode = PST_MODE_SYNC, .num_trainers = 1, .blocks = test_blocks,
                              .nblocks = NTB, .values = vs};
        optim_for(kinds[k], &cs.optim);
        ps_store_config cp = cs;
        cp.values = vp;
        ps_store *a = NULL, *b = NULL;
        cr_assert_eq(ps_store_init(&a, &cs, NULL), PST_OK, "%s", pst_error_detail());
        cr_assert_eq(ps_store_init(&b, &cp, NULL), PST_OK, "%s", pst_error_detail());
        float g[33];
        for (int64_t step = 0; step < 5; step++) {
            fill_normal(g, 33, 9, (uint64_t)step, 1.0f);
            pthread_t t[2];
            slice_job jobs[2] = {{a, g, 0}, {a, g, 1}};
            for (int i = 0; i < 2; i++)
                cr_assert_eq(pthread_create(&t[i], NULL, slice_thread, &jobs[i]), 0);
            for (int i = 0; i < 2; i++) {
                void *r;
                pthread_join(t[i], &r);
                cr_assert_null(r, "a slice was refused: %s", pst_error_detail());
            }
            cr_assert_eq(ps_store_version(a, 12), step, "a slice made a version");
            cr_assert_eq(ps_store_commit_slices(a, step, 12), PST_OK, "%s", pst_error_detail());
            cr_assert_eq(ps_store_push_f32(b, 0, step, 12, g, 33, 0, NULL), PST_OK);
            cr_assert_eq(ps_store_version(a, 12), step + 1);
            cr_assert_eq(memcmp(sliced, pushed, sizeof sliced), 0,
                         "%s, step %lld: slices and a push differ", pst_optim_kind_name(kinds[k]),
                         (long long)step);
            pull_box box;
            pull_now(a, 12, step + 1, &box); /* the commit made the version */
            cr_assert_eq(memcmp(box.values, sliced + 40, 33 * sizeof(float)), 0);
        }
        cr_assert_eq(memcmp(sliced, initial, 40 * sizeof(float)), 0, "other blocks touched");
        /* A NaN at element 20: its slice is refused, the others applied; the commit fails
         * with the element and makes no version. */
        g[20] = NAN;
        cr_assert_eq(ps_store_update_slice(a, 12, 0, 17, g), PST_OK);
        cr_assert_eq(ps_store_update_slice(a, 12, 17, 16, g + 17), PST_ERR_INVALID);
        cr_assert_eq(ps_store_commit_slices(a, 5, 12), PST_ERR_INVALID);
        cr_assert(strstr(pst_error_detail(), "nan at element 20"), "%s", pst_error_detail());
        cr_assert(strstr(pst_error_detail(), "partly applied"), "%s", pst_error_detail());
        cr_assert_eq(ps_store_version(a, 12), 5);
        /* Refusals, each with its code. */
        cr_assert_eq(ps_store_commit_slices(a, 7, 12), PST_ERR_RANGE);
        cr_assert_eq(ps_store_update_slice(a, 12, 30, 4, g), PST_ERR_INVALID);
        cr_assert_eq(ps_store_update_slice(a, 99, 0, 1, g), PST_ERR_NOT_FOUND);
        cr_assert_eq(ps_store_commit_slices(a, 5, 99), PST_ERR_NOT_FOUND);
        ps_store_free(a);
        ps_store_free(b);
    }
    float initial[TOTAL_LEN], g[17] = {0};
    ps_store *two = make_store(PST_MODE_SYNC, 2, PST_OPTIM_MOMENTUM, initial);
    cr_assert_eq(ps_store_update_slice(two, 3, 0, 17, g), PST_ERR_STATE);
    cr_assert_eq(ps_store_commit_slices(two, 0, 3), PST_ERR_STATE);
    ps_store_free(two);
}

/* With several trainers an f32 push cannot be read in place (the step needs every
 * trainer's gradient): it is copied, so the caller may reuse its buffer at once, and the
 * sum is the reference's. */
Test(store, push_f32_with_several_trainers_is_copied)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_SYNC, 2, PST_OPTIM_MOMENTUM, initial);
    pst_optim_config o;
    optim_for(PST_OPTIM_MOMENTUM, &o);
    ref_block ref;
    ref_init(&ref, initial + initial_offset(1), 17);
    float g[MAX_T][64], buf[64];
    fill_normal(g[0], 17, 4, 0, 1.0f);
    fill_normal(g[1], 17, 4, 1, 1.0f);
    memcpy(buf, g[0], sizeof buf);
    cr_assert_eq(ps_store_push_f32(st, 0, 0, 3, buf, 17, 0, NULL), PST_OK);
    memset(buf, 0x7f, sizeof buf); /* reused by the caller: must not matter */
    cr_assert_eq(ps_store_push_f32(st, 1, 0, 3, g[1], 17, 0, NULL), PST_OK);
    ref_step(&ref, &o, g, 2);
    assert_block_equals(st, 1, &ref);
    ps_store_free(st);
}

/* A gradient read in place is scanned for NaN and infinity by the pool's parts (a block
 * large enough to be split): the first bad element is named whichever part holds it, and
 * a refused push changes no value. */
Test(store, in_place_scan_split_over_the_pool_names_the_first_bad_element)
{
    enum { N = 10007 };
    static const ps_block_spec big[] = {{.id = 1, .offset = 0, .length = N}};
    static float home[N], g[N];
    fill_normal(home, N, 2, 0, 1.0f);
    float *values[1] = {home};
    pst_pool *pool = NULL;
    cr_assert_eq(pst_pool_init(&pool, 2), PST_OK);
    ps_store_config cfg = {.mode = PST_MODE_SYNC, .num_trainers = 1, .blocks = big,
                           .nblocks = 1, .values = values, .pool = pool};
    optim_for(PST_OPTIM_MOMENTUM, &cfg.optim);
    ps_store *st = NULL;
    cr_assert_eq(ps_store_init(&st, &cfg, NULL), PST_OK, "%s", pst_error_detail());
    static float before[N];
    memcpy(before, home, sizeof before);
    /* (positions, values): one bad element in the second part, then one in each part */
    const struct {
        uint64_t at[2];
        int n;
        const char *want;
    } cases[] = {{{9000, 0}, 1, "nan at element 9000"},
                 {{N - 1, 0}, 1, "inf at element 10006"},
                 {{7000, 17}, 2, "nan at element 17"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fill_normal(g, N, 3, c, 1.0f);
        for (int i = 0; i < cases[c].n; i++)
            g[cases[c].at[i]] = strstr(cases[c].want, "inf") ? INFINITY : NAN;
        cr_assert_eq(ps_store_push_f32(st, 0, 0, 1, g, N, 0, NULL), PST_ERR_INVALID);
        cr_assert(strstr(pst_error_detail(), cases[c].want), "case %zu: %s", c,
                  pst_error_detail());
        cr_assert_eq(memcmp(before, home, sizeof before), 0, "case %zu changed values", c);
        cr_assert_eq(ps_store_version(st, 1), 0);
    }
    fill_normal(g, N, 3, 99, 1.0f);
    cr_assert_eq(ps_store_push_f32(st, 0, 0, 1, g, N, 0, NULL), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(ps_store_version(st, 1), 1);
    cr_assert_neq(memcmp(before, home, sizeof before), 0, "a clean push updates");
    ps_store_free(st);
    pst_pool_free(pool);
}

/* ---- the low-precision copy (config lowp) ---- */

/* Pulls block bi at want_version (which must exist) and asserts that the copy the pull is
 * handed is pst_cast of the master values at that version, bit for bit; the copy goes to
 * *copy (length elements) when copy is not NULL. */
static void assert_lowp_is_cast(ps_store *st, pst_dtype dt, int bi, int64_t want_version,
                                uint16_t *copy)
{
    const uint32_t id = test_blocks[bi].id;
    const uint64_t n = test_blocks[bi].length;
    pull_box box;
    pull_now(st, id, want_version, &box);
    cr_assert_eq(box.version, want_version);
    cr_assert_eq(box.lowp_null, 0, "%s store: the pull got no copy", pst_dtype_name(dt));
    float master[64];
    int64_t ver = -1;
    cr_assert_eq(ps_store_read(st, id, master, &ver), PST_OK);
    cr_assert_eq(ver, want_version);
    cr_assert_eq(memcmp(box.values, master, (size_t)n * sizeof(float)), 0);
    uint16_t want[64];
    pst_cast(want, dt, master, PST_F32, (size_t)n);
    cr_assert_eq(memcmp(box.lowp, want, (size_t)n * sizeof(uint16_t)), 0,
                 "%s copy of block %u at version %lld is not the cast of the master values",
                 pst_dtype_name(dt), (unsigned)id, (long long)want_version);
    if (copy)
        memcpy(copy, box.lowp, (size_t)n * sizeof(uint16_t));
}

/* bf16 and f16 stores, sync, 1 and 2 trainers, with and without a pool: after init and after
 * every step each block's copy is pst_cast(master) bit for bit, the master values are the
 * f32 reference's (the copy changes nothing else), and the count of elements cast grows by
 * the owned length per step (the init cast is not counted). A cancelled pull gets no copy. */
Test(store, lowp_copy_is_the_cast_after_every_sync_step)
{
    const pst_dtype dts[2] = {PST_BF16, PST_F16};
    enum { STEPS = 5 };
    for (int d = 0; d < 2; d++) {
        for (int ntrainers = 1; ntrainers <= 2; ntrainers++) {
            for (int use_pool = 0; use_pool < 2; use_pool++) {
                pst_pool *pool = NULL;
                if (use_pool)
                    cr_assert_eq(pst_pool_init(&pool, 2), PST_OK);
                float initial[TOTAL_LEN];
                fill_normal(initial, TOTAL_LEN, 1, 0, 1.0f);
                ps_store_config cfg = {.mode = PST_MODE_SYNC, .num_trainers = ntrainers,
                                       .blocks = test_blocks, .nblocks = NTB, .pool = pool,
                                       .lowp = dts[d]};
                optim_for(PST_OPTIM_ADAMW, &cfg.optim);
                ps_store *st = NULL;
                cr_assert_eq(ps_store_init(&st, &cfg, initial), PST_OK, "%s",
                             pst_error_detail());
                cr_assert_eq(ps_store_lowp(st), dts[d]);
                cr_assert_eq(ps_store_cast_count(st), 0, "the init cast is not counted");
                ref_block ref[NTB];
                uint16_t at_init[NTB][64];
                for (int i = 0; i < NTB; i++) {
                    ref_init(&ref[i], initial + initial_offset(i), test_blocks[i].length);
                    assert_lowp_is_cast(st, dts[d], i, 0, at_init[i]);
                }
                for (int s = 0; s < STEPS; s++) {
                    float g[NTB][MAX_T][64];
                    for (int i = 0; i < NTB; i++)
                        for (int t = 0; t < ntrainers; t++)
                            fill_normal(g[i][t], test_blocks[i].length, 2,
                                        (uint64_t)(s * 100 + i * 10 + t), 0.5f);
                    for (int t = ntrainers - 1; t >= 0; t--) {
                        for (int i = 0; i < NTB; i++)
                            cr_assert_eq(push_grad(st, (uint32_t)t, s, test_blocks[i].id,
                                                   g[i][t], test_blocks[i].length, NULL, NULL),
                                         PST_OK, "%s", pst_error_detail());
                        if (t > 0) /* not every trainer has pushed: nothing cast yet */
                            cr_assert_eq(ps_store_cast_count(st), (uint64_t)s * TOTAL_LEN);
                    }
                    cr_assert_eq(ps_store_cast_count(st), (uint64_t)(s + 1) * TOTAL_LEN,
                                 "%s, %d trainers, step %d: %llu elements cast",
                                 pst_dtype_name(dts[d]), ntrainers, s,
                                 (unsigned long long)ps_store_cast_count(st));
                    for (int i = 0; i < NTB; i++) {
                        ref_step(&ref[i], &cfg.optim, g[i], ntrainers);
                        assert_block_equals(st, i, &ref[i]);
                        assert_lowp_is_cast(st, dts[d], i, s + 1, NULL);
                    }
                }
                uint16_t now[64];
                assert_lowp_is_cast(st, dts[d], 2, STEPS, now);
                cr_assert_neq(memcmp(now, at_init[2], 33 * sizeof(uint16_t)), 0,
                              "the updates changed the copy");
                /* A duplicate push casts nothing. */
                int dup = -1;
                cr_assert_eq(push_grad(st, 0, STEPS - 1, test_blocks[0].id, ref[0].p,
                                       test_blocks[0].length, &dup, NULL), PST_OK);
                cr_assert_eq(dup, 1);
                cr_assert_eq(ps_store_cast_count(st), (uint64_t)STEPS * TOTAL_LEN);
                /* A pull failed by cancel_waiters gets neither values nor copy. */
                pull_box box;
                pull_box_init(&box);
                ps_pull_waiter w;
                cr_assert_eq(ps_store_pull(st, 12, STEPS + 1, &w, pull_capture, &box), PST_OK);
                cr_assert_eq(box.calls, 0);
                ps_store_cancel_waiters(st, PST_ERR_UNAVAILABLE);
                cr_assert_eq(box.calls, 1);
                cr_assert_eq(box.st, PST_ERR_UNAVAILABLE);
                cr_assert(box.values_null && box.lowp_null);
                ps_store_free(st);
                pst_pool_free(pool);
            }
        }
    }
}

/* Async, 2 trainers, bf16 and f16: every accepted push is one update and one cast of its
 * block (count = sum over pushes of the block's length); duplicates and a rejected
 * (non-finite) gradient cast nothing; the copy is the cast of the master values each time. */
Test(store, lowp_async_casts_once_per_push)
{
    const pst_dtype dts[2] = {PST_BF16, PST_F16};
    for (int d = 0; d < 2; d++) {
        float initial[TOTAL_LEN];
        fill_normal(initial, TOTAL_LEN, 1, 0, 1.0f);
        ps_store_config cfg = {.mode = PST_MODE_ASYNC, .num_trainers = 2,
                               .blocks = test_blocks, .nblocks = NTB, .lowp = dts[d]};
        optim_for(PST_OPTIM_MOMENTUM, &cfg.optim);
        ps_store *st = NULL;
        cr_assert_eq(ps_store_init(&st, &cfg, initial), PST_OK, "%s", pst_error_detail());
        for (int i = 0; i < NTB; i++)
            assert_lowp_is_cast(st, dts[d], i, 0, NULL);
        /* (trainer, step, block index) */
        static const struct { uint32_t t; int64_t step; int bi; } seq[] = {
            {0, 0, 2}, {1, 0, 2}, {1, 0, 0}, {0, 1, 2}, {1, 3, 1}, {0, 2, 2}, {0, 0, 1},
        };
        uint64_t want = 0;
        int64_t ver[NTB] = {0};
        for (size_t k = 0; k < sizeof seq / sizeof seq[0]; k++) {
            const int bi = seq[k].bi;
            float g[64];
            fill_normal(g, test_blocks[bi].length, 9, k, 1.0f);
            int dup = -1;
            cr_assert_eq(push_grad(st, seq[k].t, seq[k].step, test_blocks[bi].id, g,
                                   test_blocks[bi].length, &dup, NULL), PST_OK, "%s",
                         pst_error_detail());
            cr_assert_eq(dup, 0);
            want += test_blocks[bi].length;
            cr_assert_eq(ps_store_cast_count(st), want, "%s, push %zu: %llu cast, want %llu",
                         pst_dtype_name(dts[d]), k,
                         (unsigned long long)ps_store_cast_count(st),
                         (unsigned long long)want);
            assert_lowp_is_cast(st, dts[d], bi, ++ver[bi], NULL);
        }
        float g[64];
        fill_normal(g, 33, 10, 0, 1.0f);
        int dup = -1;
        cr_assert_eq(push_grad(st, 0, 2, 12, g, 33, &dup, NULL), PST_OK); /* a retry */
        cr_assert_eq(dup, 1);
        g[5] = INFINITY;
        cr_assert_eq(push_grad(st, 1, 9, 12, g, 33, &dup, NULL), PST_ERR_INVALID);
        cr_assert_eq(ps_store_cast_count(st), want, "a duplicate or refused push casts nothing");
        assert_lowp_is_cast(st, dts[d], 2, ver[2], NULL);
        ps_store_free(st);
    }
}

/* lowp f32 (the zero value): no copy, pulls get lowp NULL and nothing is ever counted. */
Test(store, lowp_f32_has_no_copy)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_SYNC, 1, PST_OPTIM_SGD, initial);
    cr_assert_eq(ps_store_lowp(st), PST_F32);
    for (int64_t s = 0; s < 3; s++) {
        for (int i = 0; i < NTB; i++) {
            float g[64];
            fill_normal(g, test_blocks[i].length, 3, (uint64_t)(s * 10 + i), 1.0f);
            cr_assert_eq(push_grad(st, 0, s, test_blocks[i].id, g, test_blocks[i].length,
                                   NULL, NULL), PST_OK);
            pull_box box;
            pull_now(st, test_blocks[i].id, s + 1, &box);
            cr_assert_eq(box.values_null, 0);
            cr_assert_eq(box.lowp_null, 1);
        }
    }
    cr_assert_eq(ps_store_cast_count(st), 0);
    ps_store_free(st);
}

/* A lowp that is not a dtype is refused, naming the field; *out stays NULL. */
Test(store, lowp_invalid_rejected)
{
    const int bad[] = {PST_DTYPE_COUNT_, 7, -1};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ps_store_config cfg = {.mode = PST_MODE_SYNC, .num_trainers = 1, .blocks = test_blocks,
                               .nblocks = NTB, .lowp = (pst_dtype)bad[k]};
        pst_optim_defaults(&cfg.optim);
        ps_store *st = (ps_store *)&cfg;
        cr_assert_eq(ps_store_init(&st, &cfg, NULL), PST_ERR_INVALID, "lowp %d", bad[k]);
        cr_assert_null(st);
        cr_assert(strstr(pst_error_detail(), "lowp"), "%s", pst_error_detail());
    }
}

/* The in-process store (trainer/local.c) over the caller's values with initial NULL: the
 * copy is cast from the caller's values as they are, and refreshed by f32 pushes read in
 * place (split over a pool). */
Test(store, lowp_copy_of_caller_values)
{
    enum { SPAN = 40 + 33 };
    float home[SPAN];
    fill_normal(home, SPAN, 5, 0, 1.0f);
    float *values[NTB];
    for (int i = 0; i < NTB; i++)
        values[i] = home + test_blocks[i].offset;
    pst_pool *pool = NULL;
    cr_assert_eq(pst_pool_init(&pool, 2), PST_OK);
    ps_store_config cfg = {.mode = PST_MODE_SYNC, .num_trainers = 1, .blocks = test_blocks,
                           .nblocks = NTB, .values = values, .pool = pool, .lowp = PST_BF16};
    optim_for(PST_OPTIM_ADAM, &cfg.optim);
    ps_store *st = NULL;
    cr_assert_eq(ps_store_init(&st, &cfg, NULL), PST_OK, "%s", pst_error_detail());
    for (int i = 0; i < NTB; i++)
        assert_lowp_is_cast(st, PST_BF16, i, 0, NULL);
    for (int64_t s = 0; s < 3; s++) {
        float g[64];
        fill_normal(g, 33, 6, (uint64_t)s, 1.0f);
        cr_assert_eq(ps_store_push_f32(st, 0, s, 12, g, 33, 0, NULL), PST_OK, "%s",
                     pst_error_detail());
        assert_lowp_is_cast(st, PST_BF16, 2, s + 1, NULL);
    }
    cr_assert_eq(ps_store_cast_count(st), 3 * 33);
    ps_store_free(st);
    pst_pool_free(pool);
}

/* Checks, inside a pull's answer (block lock held), that the copy is the cast of the values
 * it comes with. */
typedef struct lowp_reader {
    ps_store *st;
    pst_dtype dt;
    volatile int stop; /* written before join; the reader polls it between pulls */
    int reading;       /* set after its first pull: the pushes start then */
    int pulls, mismatches, missing;
    uint16_t want[ASYNC_LEN];
} lowp_reader;

static void lowp_check_answer(void *arg, pst_status st, const float *values, const void *lowp,
                              uint64_t length, int64_t version)
{
    (void)version;
    lowp_reader *r = arg;
    r->pulls++;
    if (st != PST_OK || !lowp || length != ASYNC_LEN) {
        r->missing++;
        return;
    }
    pst_cast(r->want, r->dt, values, PST_F32, ASYNC_LEN);
    r->mismatches += memcmp(r->want, lowp, sizeof r->want) != 0;
}

static void *lowp_reader_main(void *arg)
{
    lowp_reader *r = arg;
    for (int k = 0; !__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE); k++) {
        ps_pull_waiter w;
        if (ps_store_pull(r->st, (uint32_t)(k % ASYNC_NB), 0, &w, lowp_check_answer, r) !=
            PST_OK)
            r->missing++;
        if (k == 0)
            __atomic_store_n(&r->reading, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* Async pushes from two threads and a puller on a third, with the update and the cast split
 * over a pool: every copy a pull sees is the cast of the values it sees (one version), and
 * the count is every push's block length. */
Test(store, lowp_multithreaded_async_copy_matches_values, .timeout = 20)
{
    enum { T = 2, STEPS = 100 };
    ps_block_spec blocks[ASYNC_NB];
    for (int b = 0; b < ASYNC_NB; b++)
        blocks[b] = (ps_block_spec){.id = (uint32_t)b, .offset = (uint64_t)b * ASYNC_LEN,
                                    .length = ASYNC_LEN};
    pst_pool *pool = NULL;
    cr_assert_eq(pst_pool_init(&pool, 2), PST_OK);
    ps_store_config cfg = {.mode = PST_MODE_ASYNC, .num_trainers = T, .blocks = blocks,
                           .nblocks = ASYNC_NB, .pool = pool, .lowp = PST_F16};
    pst_optim_defaults(&cfg.optim);
    cfg.optim.kind = PST_OPTIM_MOMENTUM;
    cfg.optim.lr = 0.01f;
    cfg.optim.momentum = 0.9f;
    ps_store *st = NULL;
    cr_assert_eq(ps_store_init(&st, &cfg, NULL), PST_OK, "%s", pst_error_detail());
    static lowp_reader r;
    memset(&r, 0, sizeof r);
    r.st = st;
    r.dt = PST_F16;
    pthread_t rth;
    cr_assert_eq(pthread_create(&rth, NULL, lowp_reader_main, &r), 0);
    /* The pushes start once the puller runs (on a loaded machine it once had not pulled
     * before 100 steps of pushes were over). */
    for (int ms = 0; !__atomic_load_n(&r.reading, __ATOMIC_ACQUIRE) && ms < 10000; ms++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    cr_assert(__atomic_load_n(&r.reading, __ATOMIC_ACQUIRE), "the puller did not start in 10 s");
    async_worker w[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        w[t] = (async_worker){.st = st, .t = t, .steps = STEPS};
        cr_assert_eq(pthread_create(&th[t], NULL, async_worker_main, &w[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        cr_assert_eq(w[t].failures, 0);
    }
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
    pthread_join(rth, NULL);
    cr_assert_gt(r.pulls, 0);
    cr_assert_eq(r.missing, 0);
    cr_assert_eq(r.mismatches, 0, "%d of %d pulls saw a copy that is not the values' cast",
                 r.mismatches, r.pulls);
    cr_assert_eq(ps_store_cast_count(st), (uint64_t)T * STEPS * ASYNC_NB * ASYNC_LEN);
    ps_store_free(st);
    pst_pool_free(pool);
}

/* ---- checkpoints ---- */

typedef struct snap_log {
    int calls;
    int64_t versions[8];
    float values[8][TOTAL_LEN];
    float state[8][2 * TOTAL_LEN];
} snap_log;

static void record_snapshot(void *arg, int64_t version, const float *values, const float *state)
{
    snap_log *l = arg;
    cr_assert_lt(l->calls, 8);
    l->versions[l->calls] = version;
    memcpy(l->values[l->calls], values, sizeof l->values[0]);
    memcpy(l->state[l->calls], state, sizeof l->state[0]);
    l->calls++;
}

/* Every 2 versions, once the last block has reached it, the store hands out every block's
 * values and Adam moments of that version (blocks in config order); restoring another
 * store from them continues with the same bits as the first. */
Test(store, snapshot_every_n_versions_and_restore)
{
    snap_log *log = calloc(1, sizeof *log);
    ps_store_config cfg = {.mode = PST_MODE_SYNC, .num_trainers = 2, .blocks = test_blocks,
                           .nblocks = NTB, .snapshot_every = 2, .snapshot = record_snapshot,
                           .snapshot_arg = log};
    optim_for(PST_OPTIM_ADAM, &cfg.optim);
    float initial[TOTAL_LEN];
    fill_normal(initial, TOTAL_LEN, 1, 0, 1.0f);
    ps_store *a = NULL, *b = NULL;
    cr_assert_eq(ps_store_init(&a, &cfg, initial), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(ps_store_state_floats(a), 2);
    for (int s = 0; s < 5; s++)
        for (int i = 0; i < NTB; i++) {
            float g[64];
            fill_normal(g, test_blocks[i].length, 11, (uint64_t)(s * 10 + i), 1.0f);
            cr_assert_eq(push_grad(a, 0, s, test_blocks[i].id, g, test_blocks[i].length, NULL,
                                   NULL), PST_OK);
            cr_assert_eq(log->calls, s / 2); /* one trainer's push completes nothing */
            cr_assert_eq(push_grad(a, 1, s, test_blocks[i].id, g, test_blocks[i].length, NULL,
                                   NULL), PST_OK);
            /* called after the LAST block of an even version, not before */
            const int want = (s + 1) / 2 - ((s + 1) % 2 == 0 && i < NTB - 1 ? 1 : 0);
            cr_assert_eq(log->calls, want, "step %d block %d: %d snapshots", s, i, log->calls);
            if ((s + 1) % 2 == 0 && i == NTB - 1) { /* the snapshot is the store's state */
                float got[TOTAL_LEN];
                for (int k = 0; k < NTB; k++) {
                    int64_t v;
                    cr_assert_eq(ps_store_read(a, test_blocks[k].id, got + initial_offset(k), &v),
                                 PST_OK);
                    cr_assert_eq(v, s + 1);
                }
                cr_assert_eq(memcmp(got, log->values[log->calls - 1], sizeof got), 0);
                cr_assert_eq(log->versions[log->calls - 1], s + 1);
            }
        }
    /* restore version 4 into a fresh store, run step 4 on both: the same bits */
    cfg.snapshot_every = 0;
    cr_assert_eq(ps_store_init(&b, &cfg, NULL), PST_OK);
    cr_assert_eq(ps_store_restore(b, 4, log->values[1], log->state[1]), PST_OK);
    for (int i = 0; i < NTB; i++) {
        float g[64];
        fill_normal(g, test_blocks[i].length, 11, (uint64_t)(4 * 10 + i), 1.0f);
        cr_assert_eq(ps_store_version(b, test_blocks[i].id), 4);
        for (int t = 0; t < 2; t++)
            cr_assert_eq(push_grad(b, (uint32_t)t, 4, test_blocks[i].id, g,
                                   test_blocks[i].length, NULL, NULL), PST_OK, "%s",
                         pst_error_detail());
    }
    cr_assert_eq(ps_store_state_hash(a), ps_store_state_hash(b));
    cr_assert_eq(ps_store_restore(b, -1, log->values[1], log->state[1]), PST_ERR_INVALID);
    ps_store_free(a);
    ps_store_free(b);
    free(log);
}

/* ---- bf16 pushes kept as they came ---- */

typedef struct bf16_src {
    const uint16_t *h;
} bf16_src;

static pst_status fill_bf16_raw(void *arg, void *dst, uint64_t first, uint64_t n)
{
    const bf16_src *f = arg;
    memcpy(dst, f->h + first, (size_t)n * sizeof(uint16_t));
    return PST_OK;
}

static pst_status fill_bf16_cast(void *arg, float *dst, uint64_t first, uint64_t n)
{
    const bf16_src *f = arg;
    pst_cast(dst, PST_F32, f->h + first, PST_BF16, (size_t)n);
    return PST_OK;
}

/* ps_store_push_bf16 keeps a bf16 push in bf16 until the update: the values after every
 * step are the bits of a store whose pushes were cast to f32 at arrival (ps_store_push), in
 * sync with 1, 2 and 3 trainers (trainer 1 pushing f32 among bf16 ones) and async, with
 * Adam's state carried between steps. */
Test(store, bf16_pushes_kept_as_they_came_give_the_bits_of_cast_ones)
{
    const struct {
        pst_mode mode;
        int trainers;
    } cases[] = {{PST_MODE_SYNC, 1}, {PST_MODE_SYNC, 2}, {PST_MODE_SYNC, 3},
                 {PST_MODE_ASYNC, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float initial[TOTAL_LEN];
        ps_store *cast = make_store(cases[c].mode, cases[c].trainers, PST_OPTIM_ADAM, initial);
        ps_store *kept = make_store(cases[c].mode, cases[c].trainers, PST_OPTIM_ADAM, initial);
        for (int step = 0; step < 4; step++) {
            for (int t = 0; t < cases[c].trainers; t++) {
                for (int bi = 0; bi < NTB; bi++) {
                    const uint64_t n = test_blocks[bi].length;
                    float g[64];
                    uint16_t h[64];
                    fill_normal(g, n, 40 + (uint64_t)step, (uint64_t)(t * NTB + bi), 0.3f);
                    pst_cast(h, PST_BF16, g, PST_F32, (size_t)n);
                    bf16_src src = {.h = h};
                    const uint32_t id = test_blocks[bi].id;
                    cr_assert_eq(ps_store_push(cast, (uint32_t)t, step, id, n, fill_bf16_cast,
                                               &src, NULL), PST_OK, "%s", pst_error_detail());
                    pst_status rc;
                    if (t == 1 && cases[c].mode == PST_MODE_SYNC) /* an f32 row among them */
                        rc = ps_store_push(kept, (uint32_t)t, step, id, n, fill_bf16_cast, &src,
                                           NULL);
                    else
                        rc = ps_store_push_bf16(kept, (uint32_t)t, step, id, n, fill_bf16_raw,
                                                &src, 0, NULL);
                    cr_assert_eq(rc, PST_OK, "%s", pst_error_detail());
                }
            }
            for (int bi = 0; bi < NTB; bi++) {
                float a[64], b[64];
                int64_t va = -1, vb = -2;
                cr_assert_eq(ps_store_read(cast, test_blocks[bi].id, a, &va), PST_OK);
                cr_assert_eq(ps_store_read(kept, test_blocks[bi].id, b, &vb), PST_OK);
                cr_assert_eq(va, vb);
                cr_assert(memcmp(a, b, test_blocks[bi].length * sizeof(float)) == 0,
                          "case %zu, step %d, block %u: bf16 kept differs from bf16 cast", c,
                          step, (unsigned)test_blocks[bi].id);
            }
        }
        ps_store_free(cast);
        ps_store_free(kept);
    }
}

/* A bf16 push with an infinity or a NaN is refused, naming it and its element, and the
 * store is as it was; the trainer's push of the same step with finite values then counts. */
Test(store, bf16_push_with_inf_or_nan_is_refused)
{
    float initial[TOTAL_LEN];
    ps_store *st = make_store(PST_MODE_SYNC, 2, PST_OPTIM_MOMENTUM, initial);
    const uint64_t n = test_blocks[2].length; /* 33 */
    const uint32_t id = test_blocks[2].id;
    uint16_t h[64];
    for (uint64_t i = 0; i < n; i++)
        h[i] = 0x3c00u + (uint16_t)i; /* finite */
    const struct {
        uint16_t bits;
        const char *name;
    } bad[] = {{0x7f80u, "inf"}, {0xff80u, "-inf"}, {0x7fc1u, "nan"}};
    snapshot before;
    take_snapshot(st, &before);
    for (size_t k = 0; k < 3; k++) {
        uint16_t b[64];
        memcpy(b, h, sizeof b);
        b[31] = bad[k].bits;
        bf16_src src = {.h = b};
        cr_assert_eq(ps_store_push_bf16(st, 0, 0, id, n, fill_bf16_raw, &src, 0, NULL),
                     PST_ERR_INVALID);
        char want[64];
        snprintf(want, sizeof want, "has %s at element 31", bad[k].name);
        cr_assert(strstr(pst_error_detail(), want), "%s", pst_error_detail());
        assert_unchanged(st, &before);
    }
    bf16_src ok = {.h = h};
    cr_assert_eq(ps_store_push_bf16(st, 0, 0, id, n, fill_bf16_raw, &ok, 0, NULL), PST_OK);
    cr_assert_eq(ps_store_pushed(st, id), 1);
    ps_store_free(st);
}

/* A source that a hostile trainer rewrites between reads (its shared-memory slot): the first
 * read of each element gives the finite gradient, every later read NaN. */
typedef struct turning_src {
    const float *g;
    const uint16_t *h;
    _Atomic int reads[64];
} turning_src;

static pst_status fill_turning(void *arg, float *dst, uint64_t first, uint64_t n)
{
    turning_src *f = arg;
    for (uint64_t i = 0; i < n; i++)
        dst[i] = atomic_fetch_add(&f->reads[first + i], 1) ? NAN : f->g[first + i];
    return PST_OK;
}

static pst_status fill_turning_raw(void *arg, void *dst, uint64_t first, uint64_t n)
{
    turning_src *f = arg;
    uint16_t *out = dst;
    for (uint64_t i = 0; i < n; i++)
        out[i] = atomic_fetch_add(&f->reads[first + i], 1) ? 0x7fc1u : f->h[first + i];
    return PST_OK;
}

/* PS_PUSH_SHARED_SOURCE: a push that completes the step (sync, 1 and 2 trainers, f32 and
 * bf16, async) reads its source once, so a source that turns to NaN after the check never
 * reaches the values; each element is read exactly once. */
Test(store, shared_source_is_read_once_so_a_rewrite_never_reaches_the_values)
{
    const struct {
        pst_mode mode;
        int trainers;
    } cases[] = {{PST_MODE_SYNC, 1}, {PST_MODE_SYNC, 2}, {PST_MODE_ASYNC, 1}};
    const uint64_t n = test_blocks[2].length; /* 33 */
    const uint32_t id = test_blocks[2].id;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int bf16 = 0; bf16 < 2; bf16++) {
            float initial[TOTAL_LEN];
            ps_store *st = make_store(cases[c].mode, cases[c].trainers, PST_OPTIM_ADAM,
                                      initial);
            for (int step = 0; step < 3; step++) {
                for (int t = 0; t < cases[c].trainers; t++) {
                    float g[64];
                    uint16_t h[64];
                    fill_normal(g, n, 70 + (uint64_t)step, (uint64_t)t, 0.3f);
                    pst_cast(h, PST_BF16, g, PST_F32, (size_t)n);
                    turning_src src = {.g = g, .h = h};
                    for (uint64_t i = 0; i < n; i++)
                        atomic_init(&src.reads[i], 0);
                    const pst_status rc =
                        bf16 ? ps_store_push_bf16(st, (uint32_t)t, step, id, n,
                                                  fill_turning_raw, &src,
                                                  PS_PUSH_SHARED_SOURCE, NULL)
                             : ps_store_push_scaled(st, (uint32_t)t, step, id, n, 1.0f,
                                                    fill_turning, &src,
                                                    PS_PUSH_SHARED_SOURCE, NULL);
                    cr_assert_eq(rc, PST_OK, "case %zu bf16 %d: %s", c, bf16,
                                 pst_error_detail());
                    for (uint64_t i = 0; i < n; i++)
                        cr_assert_eq(atomic_load(&src.reads[i]), 1,
                                     "case %zu bf16 %d step %d: element %llu read %d times", c,
                                     bf16, step, (unsigned long long)i,
                                     atomic_load(&src.reads[i]));
                }
                float v[64];
                int64_t version = -1;
                cr_assert_eq(ps_store_read(st, id, v, &version), PST_OK);
                cr_assert_eq(version, step + 1);
                for (uint64_t i = 0; i < n; i++)
                    cr_assert(isfinite(v[i]), "case %zu bf16 %d step %d: value %llu is %g", c,
                              bf16, step, (unsigned long long)i, (double)v[i]);
            }
            ps_store_free(st);
        }
    }
}

/* A trainer's shared-memory slot, rewritten by another process while it is pushed as an
 * f32 array with PS_PUSH_SHARED_SOURCE (the pserver's path for a same-host push): one
 * element turns to NaN a quarter of the time. Each push is either refused (its one read saw
 * the NaN) or applies what it read, so the values stay finite: sync with 1 and 2 trainers,
 * and async. Read in place instead (check, then the update reading the array again, as a
 * push without the flag is read with one trainer or async), a NaN put in between reaches
 * the values within a few steps. */
Test(store, shared_f32_slot_rewritten_by_another_process_never_reaches_the_values,
     .timeout = 120)
{
    enum { L = 1 << 16, PUSHES = 300, AT = 12345 };
    const ps_block_spec blocks[] = {{.id = 0, .offset = 0, .length = L}};
    float *slot = mmap(NULL, L * sizeof(float), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    atomic_int *stop = mmap(NULL, 2 * sizeof *stop, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(slot != MAP_FAILED && stop != MAP_FAILED);
    atomic_int *started = stop + 1;
    for (int i = 0; i < L; i++)
        slot[i] = 0.001f;
    atomic_init(stop, 0);
    atomic_init(started, 0);
    const pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) { /* the hostile trainer: NaN for 1 of every 4 spins, in a loop */
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with the test, whatever its end */
        if (getppid() == 1)
            _exit(0);
        volatile uint32_t *at = (volatile uint32_t *)&slot[AT];
        uint32_t nan_bits = 0x7fc00000u, fine;
        memcpy(&fine, &slot[AT], sizeof fine);
        atomic_store(started, 1);
        while (!atomic_load(stop))
            for (int k = 0; k < 4; k++)
                for (int spin = 0; spin < 2000; spin++)
                    *at = k == 0 ? nan_bits : fine;
        _exit(0);
    }
    const struct {
        pst_mode mode;
        int trainers;
    } cases[] = {{PST_MODE_SYNC, 1}, {PST_MODE_SYNC, 2}, {PST_MODE_ASYNC, 1}};
    for (int ms = 0; !atomic_load(started) && ms < 10000; ms++) /* the writer runs */
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    cr_assert(atomic_load(started), "the writing process did not start in 10 s");
    int refused = 0, applied = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ps_store_config cfg = {.mode = cases[c].mode, .num_trainers = cases[c].trainers,
                               .blocks = blocks, .nblocks = 1};
        optim_for(PST_OPTIM_SGD, &cfg.optim);
        float *initial = calloc(L, sizeof(float));
        ps_store *st = NULL;
        cr_assert_eq(ps_store_init(&st, &cfg, initial), PST_OK, "%s", pst_error_detail());
        /* At least PUSHES, and on until one was refused and one applied (the writer may
         * have been off its core for a while, on either value): both outcomes in every
         * case. */
        int64_t next = 0; /* async: one past the last accepted step */
        int refused_here = 0, applied_here = 0;
        for (int p = 0; p < PUSHES || ((!refused_here || !applied_here) && p < 200000); p++) {
            const uint32_t t = (uint32_t)(p % cases[c].trainers);
            const int64_t step = cases[c].mode == PST_MODE_SYNC ? ps_store_version(st, 0) : next;
            const pst_status rc =
                ps_store_push_f32(st, t, step, 0, slot, L, PS_PUSH_SHARED_SOURCE, NULL);
            cr_assert(rc == PST_OK || rc == PST_ERR_INVALID, "case %zu push %d: %s", c, p,
                      pst_error_detail());
            if (rc != PST_OK) {
                refused++;
                refused_here++;
                continue;
            }
            applied++;
            applied_here++;
            next++;
            float v;
            int64_t version;
            cr_assert_eq(ps_store_read(st, 0, initial, &version), PST_OK);
            v = initial[AT];
            cr_assert(isfinite(v), "case %zu push %d: value %d is %g", c, p, AT, (double)v);
        }
        ps_store_free(st);
        free(initial);
    }
    atomic_store(stop, 1);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    /* Both outcomes happened: the other process did write while the pushes ran. */
    cr_assert(refused > 0 && applied > 0, "refused %d, applied %d", refused, applied);
    munmap(slot, L * sizeof(float));
    munmap(stop, 2 * sizeof *stop);
}

/* ---- sync pushes kept where they came (ps_store_config's keep_push) ---- */

/* A push's source in these tests, f32 (f) or bf16 (h); keep_copy keeps its own copy, so
 * the caller can overwrite its buffers after each push returns (a store that read the
 * caller's argument again would sum NaNs). */
typedef struct kept_src {
    fill_src f; /* first: the f32 fill's argument */
    bf16_src h;
    float g[64];
    uint16_t raw[64];
} kept_src;

static atomic_int keeps, releases, keep_calls, refuse_odd;

/* Keeps the push (refuse_odd: every other one is refused, and the store copies it). */
static void *keep_copy(void *arg)
{
    const kept_src *src = arg;
    if (atomic_load(&refuse_odd) && atomic_fetch_add(&keep_calls, 1) % 2 == 1)
        return NULL;
    kept_src *k = calloc(1, sizeof *k);
    cr_assert_not_null(k);
    if (src->f.g)
        memcpy(k->g, src->f.g, sizeof k->g);
    if (src->h.h)
        memcpy(k->raw, src->h.h, sizeof k->raw);
    k->f.g = k->g;
    k->h.h = k->raw;
    atomic_fetch_add(&keeps, 1);
    return k;
}

static void release_copy(void *kept)
{
    atomic_fetch_add(&releases, 1);
    free(kept);
}

static pst_status fill_kept_raw(void *arg, void *dst, uint64_t first, uint64_t n)
{
    kept_src *k = arg;
    return fill_bf16_raw(&k->h, dst, first, n);
}

/* Pushes kept where they came give the bits of pushes copied into the store (sync, 2 and 3
 * trainers in reversed order, f32 and bf16 rows, every other keep refused, updates over a
 * pool of 2 threads reading kept rows concurrently, Adam over 4 steps); every kept push is
 * released by the update of its step; a push discarded in its check is released at once;
 * ps_store_free releases what a step that never completed kept; keep_push without
 * release_push is refused. */
Test(store, kept_pushes_give_the_bits_of_copied_ones_and_are_released)
{
    struct pst_pool *pool = NULL;
    cr_assert_eq(pst_pool_init(&pool, 2), PST_OK);
    for (int trainers = 2; trainers <= 3; trainers++) {
        for (int bf16 = 0; bf16 <= 1; bf16++) {
            float initial[TOTAL_LEN];
            ps_store *copied = make_store(PST_MODE_SYNC, trainers, PST_OPTIM_ADAM, initial);
            ps_store_config cfg = {.mode = PST_MODE_SYNC, .num_trainers = trainers,
                                   .blocks = test_blocks, .nblocks = NTB, .pool = pool,
                                   .keep_push = keep_copy, .release_push = release_copy};
            optim_for(PST_OPTIM_ADAM, &cfg.optim);
            ps_store *kept = NULL;
            cr_assert_eq(ps_store_init(&kept, &cfg, initial), PST_OK, "%s",
                         pst_error_detail());
            atomic_store(&keeps, 0);
            atomic_store(&releases, 0);
            atomic_store(&refuse_odd, 1);
            for (int step = 0; step < 4; step++) {
                for (int t = trainers - 1; t >= 0; t--) {
                    for (int bi = 0; bi < NTB; bi++) {
                        const uint64_t n = test_blocks[bi].length;
                        const uint32_t id = test_blocks[bi].id;
                        float g[64] = {0};
                        uint16_t h[64] = {0};
                        fill_normal(g, n, 70 + (uint64_t)step, (uint64_t)(t * NTB + bi), 0.3f);
                        pst_cast(h, PST_BF16, g, PST_F32, (size_t)n);
                        kept_src src = {.f = {.g = bf16 ? NULL : g}, .h = {bf16 ? h : NULL}};
                        pst_status rc, rk;
                        if (bf16) {
                            rc = ps_store_push_bf16(copied, (uint32_t)t, step, id, n,
                                                    fill_bf16_raw, &src.h, 0, NULL);
                            rk = ps_store_push_bf16(kept, (uint32_t)t, step, id, n,
                                                    fill_kept_raw, &src, 0, NULL);
                        } else {
                            rc = push_grad(copied, (uint32_t)t, step, id, g, n, NULL, NULL);
                            rk = ps_store_push(kept, (uint32_t)t, step, id, n, fill_copy,
                                               &src, NULL);
                        }
                        cr_assert_eq(rc, PST_OK, "%s", pst_error_detail());
                        cr_assert_eq(rk, PST_OK, "%s", pst_error_detail());
                        memset(h, 0xff, sizeof h); /* NaNs, for a store that reads them */
                        for (size_t i = 0; i < 64; i++)
                            g[i] = NAN;
                    }
                }
                for (int bi = 0; bi < NTB; bi++) {
                    float a[64], b[64];
                    cr_assert_eq(ps_store_read(copied, test_blocks[bi].id, a, NULL), PST_OK);
                    cr_assert_eq(ps_store_read(kept, test_blocks[bi].id, b, NULL), PST_OK);
                    cr_assert(memcmp(a, b, test_blocks[bi].length * sizeof(float)) == 0,
                              "%d trainers, bf16 %d, step %d, block %u: kept differs", trainers,
                              bf16, step, (unsigned)test_blocks[bi].id);
                }
                cr_assert_eq(atomic_load(&releases), atomic_load(&keeps),
                             "step %d: %d kept, %d released", step, atomic_load(&keeps),
                             atomic_load(&releases));
            }
            /* (trainers - 1) pushes a block a step come before the last: half kept */
            cr_assert_geq(atomic_load(&keeps), (trainers - 1) * NTB * 4 / 2 - 1);
            atomic_store(&refuse_odd, 0);
            /* A push discarded in its check is released before the push returns. */
            float bad[33];
            fill_normal(bad, 33, 9, 9, 1.0f);
            bad[16] = NAN;
            kept_src src = {.f = {.g = bad}};
            const int before = atomic_load(&keeps);
            cr_assert_eq(ps_store_push(kept, 0, 4, 3, 17, fill_copy, &src, NULL),
                         PST_ERR_INVALID);
            cr_assert_eq(atomic_load(&keeps), before + 1);
            cr_assert_eq(atomic_load(&releases), atomic_load(&keeps));
            /* A step left open keeps its push until the store is freed. */
            bad[16] = 0.5f;
            cr_assert_eq(ps_store_push(kept, 0, 4, 12, 33, fill_copy, &src, NULL), PST_OK);
            cr_assert_eq(atomic_load(&keeps), atomic_load(&releases) + 1);
            ps_store_free(kept);
            cr_assert_eq(atomic_load(&releases), atomic_load(&keeps));
            ps_store_free(copied);
        }
    }
    pst_pool_free(pool);
    ps_store_config half = {.mode = PST_MODE_SYNC, .num_trainers = 2, .blocks = test_blocks,
                            .nblocks = NTB, .keep_push = keep_copy};
    pst_optim_defaults(&half.optim);
    ps_store *st = NULL;
    cr_assert_eq(ps_store_init(&st, &half, NULL), PST_ERR_INVALID);
    cr_assert(strstr(pst_error_detail(), "keep_push and release_push") != NULL, "%s",
              pst_error_detail());
}
