/* test_tables_wire.c — PullSparse and PushSparse on the wire (pserver/tables.h): a real
 * pserver (PST_BIN_DIR) on 127.0.0.1 port 0, the test its client over real gRPC
 * (rpc/client.h), one pserver per test.
 *
 * What is checked: before Init both methods are refused STATE; every bad input tables.h
 * lists gets its exact status and a detail naming the problem, and leaves the table as it
 * was (a later pull gives the initializer's bits); a good push is applied once (a retry is
 * answered duplicate) and the rows then are Adagrad's, bit for bit; in sync mode a pull of
 * the next step waits until every trainer has pushed, and the two trainers' rows of a key
 * are summed and applied once; a joining trainer listing other tables is refused MISMATCH;
 * a key of another pserver's shard is refused naming its pserver; pulls whose client gave
 * up leave the table (they do not hold its slots) and the pserver serves on.
 *
 * DESIGN. test_cluster.c's pattern: the pserver is started (fork/exec) before gRPC is
 * initialized in the test process, children are killed and reaped by the suite's fini
 * (tests/child.h), and every wait has a deadline. The expected rows are worked out here:
 * the initializer's from a local pst_sparse_table of the same spec (pserver/sparse.h), each
 * update from Adagrad's formula written out as pserver/sparse.c rounds it (lr and eps
 * rounded to float from double, acc = g*g, p = fmaf(-lr, g / (sqrt(acc) + eps), p0)). The
 * only waits on the clock: a parked pull is checked still unanswered after 300 ms, and
 * 300 ms pass between two rounds of abandoned pulls. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* open_memstream (tests/child.h) */
#endif
#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/error.h"
#include "pserver/sparse.h"
#include "rpc/client.h"
#include "rpc/global.h"
#include "rpc/wire.h"
#include "tests/child.h"

#define PSERVER PST_BIN_DIR "/pserver"

/* Bounds of the waits. Generous: they only turn a hang into a failure. */
#define LISTEN_WAIT_MS 15000
#define EXIT_WAIT_MS 15000
#define ANSWER_WAIT_MS 10000

#include "tests/pserver_child.h"

#define NB 8      /* floats in the one dense block of the job */
#define DIM 4     /* values per row of sparse table "t" */
#define LR 0.1    /* its Adagrad's */
#define EPS 1e-10
#define FINGERPRINT 0x7ab1e5ULL

static void suite_fini(void)
{
    for (int i = 0; i < nchildren; i++)
        proc_cleanup(&pool[i]);
    nchildren = 0;
}

TestSuite(tables_wire, .fini = suite_fini, .timeout = 60);

/* ---- the pserver and its clients ------------------------------------------------------ */


/* Asserts a call's exact status, with the detail in the message. */
#define EXPECT_STATUS(call, want)                                                           \
    do {                                                                                    \
        pst_status got_ = (call);                                                           \
        cr_assert_eq(got_, (want), "%s: got %s (%d), want %s (%d): %s", #call,            \
                     pst_strerror(got_), (int)got_, pst_strerror(want), (int)(want),        \
                     got_ == PST_OK ? "" : pst_error_detail());                             \
    } while (0)

/* Asserts a call's exact failure status and that its detail names the problem (`what`). */
#define EXPECT_REFUSED(call, want, what)                                                    \
    do {                                                                                    \
        EXPECT_STATUS(call, want);                                                          \
        cr_assert(strstr(pst_error_detail(), (what)) != NULL,                               \
                  "%s: the detail does not say \"%s\": %s", #call, (what),                \
                  pst_error_detail());                                                      \
    } while (0)

/* ---- the calls ------------------------------------------------------------------------ */

typedef struct init_args {
    uint32_t trainer, ntrainers;
    uint32_t dim;          /* of sparse table "t" */
    uint32_t shard, shards;
    int initial;           /* trainer 0: the dense block's values as payload */
} init_args;

/* The spec of the job's one sparse table "t": dim `dim`, Adagrad lr 0.1 eps 1e-10, rows
 * from N(0, 0.01^2) drawn from seed 7, a row made by its key's first push. */
static void table_spec(Pstrain__SparseTableSpec *s, uint32_t dim)
{
    pstrain__sparse_table_spec__init(s);
    s->name = (char *)"t";
    s->dim = dim;
    s->optim = (char *)"adagrad";
    s->lr = LR;
    s->eps = EPS;
    s->init_std = 0.01f;
    s->seed = 7;
    s->admit_count = 1;
}

/* The same table made here: the reference of the initializer's values. */
static pst_sparse_table *local_table(void)
{
    pst_sparse_config c;
    pst_sparse_defaults(&c);
    snprintf(c.name, sizeof c.name, "t");
    c.dim = DIM;
    c.optim = PST_SPARSE_ADAGRAD;
    c.lr = LR;
    c.eps = EPS;
    c.init_std = 0.01f;
    c.seed = 7;
    c.admit_count = 1;
    pst_sparse_table *t = NULL;
    cr_assert_eq(pst_sparse_create(&t, &c), PST_OK, "%s", pst_error_detail());
    return t;
}

/* An Init of a sync SGD job over one dense block of NB (as test_cluster's do_init) with
 * sparse table "t" for shard a->shard of a->shards. */
static pst_status do_init(rpc_client *cl, const init_args *a)
{
    float initial[NB];
    for (int i = 0; i < NB; i++)
        initial[i] = 0.5f * (float)(i - 3);
    Pstrain__BlockSpec block = PSTRAIN__BLOCK_SPEC__INIT;
    block.id = 0;
    block.offset = 0;
    block.length = NB;
    Pstrain__BlockSpec *blocks[] = {&block};
    Pstrain__OptimConfig optim = PSTRAIN__OPTIM_CONFIG__INIT;
    optim.kind = (char *)"sgd";
    optim.lr = 1.0f;
    optim.schedule = (char *)"constant";
    Pstrain__SparseTableSpec spec;
    table_spec(&spec, a->dim);
    Pstrain__SparseTableSpec *specs[] = {&spec};
    Pstrain__InitRequest req = PSTRAIN__INIT_REQUEST__INIT;
    req.trainer_id = a->trainer;
    req.num_trainers = a->ntrainers;
    req.mode = PSTRAIN__MODE__SYNC;
    req.total_params = NB;
    req.n_blocks = 1;
    req.blocks = blocks;
    req.optim = &optim;
    req.fingerprint = FINGERPRINT;
    req.n_sparse_tables = 1;
    req.sparse_tables = specs;
    req.sparse_shard = a->shard;
    req.sparse_shards = a->shards;
    rpc_message *m = NULL;
    pst_status st = rpc_client_call(cl, 0, RPC_METHOD_INIT, &req.base,
                                    a->initial ? initial : NULL,
                                    a->initial ? sizeof initial : 0, &m);
    rpc_message_free(m);
    return st;
}

/* Trainer 0's Init of a job of ntrainers with table "t" of DIM on the one shard. */
static void init_job(rpc_client *cl, uint32_t ntrainers)
{
    const init_args a = {.trainer = 0, .ntrainers = ntrainers, .dim = DIM, .shards = 1,
                         .initial = 1};
    EXPECT_STATUS(do_init(cl, &a), PST_OK);
}

static Pstrain__PullSparseRequest pull_request(uint32_t table, int64_t step,
                                               Pstrain__DType dtype, uint64_t count)
{
    Pstrain__PullSparseRequest req = PSTRAIN__PULL_SPARSE_REQUEST__INIT;
    req.table = table;
    req.step = step;
    req.dtype = dtype;
    req.count = count;
    return req;
}

/* A PullSparse claiming `count` keys with `bytes` of payload; on PST_OK the reply must be
 * the count rows of DIM of table `table` at version `step` in `dtype`, read as f32 into
 * rows (count * DIM). */
static pst_status do_pull_raw(rpc_client *cl, uint32_t table, int64_t step,
                              Pstrain__DType dtype, uint64_t count, const void *payload,
                              size_t bytes, float *rows)
{
    Pstrain__PullSparseRequest req = pull_request(table, step, dtype, count);
    rpc_message *m = NULL;
    pst_status st = rpc_client_call(cl, 0, RPC_METHOD_PULL_SPARSE, &req.base, payload, bytes,
                                    &m);
    if (st == PST_OK) {
        const Pstrain__PullSparseReply *r =
            (const Pstrain__PullSparseReply *)rpc_message_header(m);
        cr_assert_eq(r->table, table);
        cr_assert_eq(r->version, step, "a pull of step %lld answered at version %lld",
                     (long long)step, (long long)r->version);
        cr_assert_eq(r->dtype, dtype);
        cr_assert_eq(r->count, count);
        cr_assert_eq(r->dim, (uint32_t)DIM);
        pst_dtype dt;
        cr_assert_eq(rpc_dtype_from_wire(dtype, &dt), PST_OK);
        const rpc_payload *p = rpc_message_payload(m);
        cr_assert_eq(rpc_payload_check(p, dt, count * DIM), PST_OK, "%s", pst_error_detail());
        cr_assert_eq(rpc_payload_read_f32(p, dt, 0, rows, (size_t)count * DIM), PST_OK);
    }
    rpc_message_free(m);
    return st;
}

/* The rows (n, DIM) of keys at step, in f32. */
static pst_status do_pull(rpc_client *cl, int64_t step, const uint64_t *keys, size_t n,
                          float *rows)
{
    return do_pull_raw(cl, 0, step, PSTRAIN__DTYPE__F32, n, keys, n * sizeof *keys, rows);
}

/* A PushSparse claiming `count` keys with `bytes` of payload; *dup gets the reply's flag. */
static pst_status do_push_raw(rpc_client *cl, uint32_t trainer, uint32_t table, int64_t step,
                              Pstrain__DType dtype, uint64_t count, const void *payload,
                              size_t bytes, int *dup)
{
    Pstrain__PushSparseRequest req = PSTRAIN__PUSH_SPARSE_REQUEST__INIT;
    req.trainer_id = trainer;
    req.table = table;
    req.step = step;
    req.dtype = dtype;
    req.count = count;
    rpc_message *m = NULL;
    pst_status st = rpc_client_call(cl, 0, RPC_METHOD_PUSH_SPARSE, &req.base, payload, bytes,
                                    &m);
    if (st == PST_OK && dup)
        *dup = ((const Pstrain__PushSparseReply *)rpc_message_header(m))->duplicate;
    rpc_message_free(m);
    return st;
}

/* The payload of a push: n keys, then n rows of `width` f32 (buf holds 64 keys of DIM + 1). */
typedef struct push_body {
    uint8_t buf[64 * (sizeof(uint64_t) + (DIM + 1) * sizeof(float))];
    size_t bytes;
} push_body;

static push_body body_of(const uint64_t *keys, size_t n, const float *rows, size_t width)
{
    push_body b;
    cr_assert_leq(n, 64);
    memcpy(b.buf, keys, n * sizeof *keys);
    memcpy(b.buf + n * sizeof *keys, rows, n * width * sizeof(float));
    b.bytes = n * (sizeof *keys + width * sizeof(float));
    return b;
}

/* Trainer `trainer`'s f32 rows (n, DIM) of keys at step. */
static pst_status do_push(rpc_client *cl, uint32_t trainer, int64_t step, const uint64_t *keys,
                          size_t n, const float *rows, int *dup)
{
    const push_body b = body_of(keys, n, rows, DIM);
    return do_push_raw(cl, trainer, 0, step, PSTRAIN__DTYPE__F32, n, b.buf, b.bytes, dup);
}

/* ---- the references ------------------------------------------------------------------- */

/* One Adagrad update of a fresh row (acc 0) as pserver/sparse.c rounds it. */
static float adagrad_first(float p0, float g)
{
    const float neg_lr = (float)-LR, eps = (float)EPS;
    const float acc = g * g;
    return fmaf(neg_lr, g / (sqrtf(acc) + eps), p0);
}

/* Asserts got (n, DIM) == want bit for bit, naming the key of a difference. */
static void expect_rows(const float *got, const float *want, const uint64_t *keys, size_t n,
                        const char *what)
{
    for (size_t i = 0; i < n * DIM; i++)
        cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                  "%s: key %llu column %zu is %.9g, want %.9g", what,
                  (unsigned long long)keys[i / DIM], i % DIM, (double)got[i], (double)want[i]);
}

/* A PullSparse started now whose answer is kept for the test: the call's status, its
 * detail and the rows (up to 8 of DIM) in f32. */
typedef struct pending_pull {
    pthread_mutex_t mu;
    int done;
    pst_status st;
    char detail[512];
    int64_t version;
    uint64_t count;
    float rows[8 * DIM];
} pending_pull;

static void pending_done(void *arg, pst_status st, const char *detail,
                         const ProtobufCMessage *reply, const rpc_payload *payload)
{
    pending_pull *p = arg;
    pthread_mutex_lock(&p->mu);
    p->st = st;
    snprintf(p->detail, sizeof p->detail, "%s", st == PST_OK ? "" : detail);
    if (st == PST_OK) {
        const Pstrain__PullSparseReply *r = (const Pstrain__PullSparseReply *)reply;
        p->version = r->version;
        p->count = r->count;
        if (r->count <= 8 && rpc_payload_check(payload, PST_F32, r->count * DIM) == PST_OK &&
            rpc_payload_read_f32(payload, PST_F32, 0, p->rows, (size_t)r->count * DIM) != PST_OK)
            p->st = PST_ERR_FORMAT;
    }
    p->done = 1;
    pthread_mutex_unlock(&p->mu);
}

static void pending_start(rpc_client *cl, pending_pull *p, int64_t step, const uint64_t *keys,
                          size_t n)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    Pstrain__PullSparseRequest req = pull_request(0, step, PSTRAIN__DTYPE__F32, n);
    /* keys are lent without a release: they outlive the client (the test's statics) */
    cr_assert_eq(rpc_client_call_async(cl, 0, RPC_METHOD_PULL_SPARSE, &req.base, keys,
                                       n * sizeof *keys, NULL, pending_done, p),
                 PST_OK, "%s", pst_error_detail());
}

static int pending_is_done(pending_pull *p)
{
    pthread_mutex_lock(&p->mu);
    const int done = p->done;
    pthread_mutex_unlock(&p->mu);
    return done;
}

/* Waits until the call is answered (asserts it is within timeout_ms). */
static void pending_wait(pending_pull *p, int timeout_ms)
{
    const double deadline = now_ms() + timeout_ms;
    while (!pending_is_done(p)) {
        cr_assert_lt(now_ms(), deadline, "a PullSparse not answered within %d ms", timeout_ms);
        sleep_ms(5);
    }
}

/* ---- a. before Init ------------------------------------------------------------------- */

Test(tables_wire, refused_before_init)
{
    proc *ps;
    int port;
    rpc_client *cl = fixture_start(&ps, &port);
    const uint64_t keys[] = {1, 2};
    float rows[2 * DIM] = {0};
    EXPECT_REFUSED(do_pull(cl, 0, keys, 2, rows), PST_ERR_STATE, "PullSparse before Init");
    EXPECT_REFUSED(do_push(cl, 0, 0, keys, 2, rows, NULL), PST_ERR_STATE,
                   "PushSparse before Init");
    EXPECT_REFUSED(do_push_raw(cl, 0, 0, 0, PSTRAIN__DTYPE__F32, 0, NULL, 0, NULL),
                   PST_ERR_STATE, "no sparse tables yet");
    init_job(cl, 1); /* and it serves */
    EXPECT_STATUS(do_pull(cl, 0, keys, 2, rows), PST_OK);
    fixture_stop(ps, cl);
}

/* ---- b. bad input changes nothing; a good push is applied once, as Adagrad says ------- */

Test(tables_wire, bad_requests_get_exact_errors_and_change_nothing)
{
    proc *ps;
    int port;
    rpc_client *cl = fixture_start(&ps, &port);
    init_job(cl, 1);
    enum { N = 3 };
    static const uint64_t keys[N] = {101, 202, 303};
    float before[N * DIM], after[N * DIM], want[N * DIM];
    EXPECT_STATUS(do_pull(cl, 0, keys, N, before), PST_OK);
    /* the initializer's values: those of the same spec made here */
    pst_sparse_table *ref = local_table();
    cr_assert_eq(pst_sparse_pull(ref, keys, N, 0, want), PST_OK);
    pst_sparse_free(ref);
    expect_rows(before, want, keys, N, "the first pull (the initializer's values)");
    /* BF16 rows are the f32 rows rounded */
    float bf_rows[N * DIM], rounded[N * DIM];
    uint16_t bf[N * DIM];
    EXPECT_STATUS(do_pull_raw(cl, 0, 0, PSTRAIN__DTYPE__BF16, N, keys, sizeof keys, bf_rows),
                  PST_OK);
    pst_cast(bf, PST_BF16, before, PST_F32, N * DIM);
    pst_cast(rounded, PST_F32, bf, PST_BF16, N * DIM);
    expect_rows(bf_rows, rounded, keys, N, "the BF16 pull");

    float g[N * DIM];
    for (int i = 0; i < N * DIM; i++)
        g[i] = 0.3f * (float)(i + 1) - 1.7f; /* none 0, none a power of two */
    const push_body good = body_of(keys, N, g, DIM);

    /* an unknown table */
    EXPECT_REFUSED(do_pull_raw(cl, 3, 0, PSTRAIN__DTYPE__F32, N, keys, sizeof keys, after),
                   PST_ERR_NOT_FOUND, "sparse table 3: this pserver has 1");
    EXPECT_REFUSED(do_push_raw(cl, 0, 3, 0, PSTRAIN__DTYPE__F32, N, good.buf, good.bytes,
                               NULL),
                   PST_ERR_NOT_FOUND, "sparse table 3: this pserver has 1");
    /* counts that disagree with the payload */
    EXPECT_REFUSED(do_pull_raw(cl, 0, 0, PSTRAIN__DTYPE__F32, 2, keys, sizeof keys, after),
                   PST_ERR_FORMAT, "2 keys but a payload of 24 bytes");
    EXPECT_REFUSED(do_push_raw(cl, 0, 0, 0, PSTRAIN__DTYPE__F32, 2, good.buf, good.bytes,
                               NULL),
                   PST_ERR_FORMAT, "need a payload of 48 bytes");
    float wide[N * (DIM + 1)];
    for (int i = 0; i < N * (DIM + 1); i++)
        wide[i] = 0.5f;
    const push_body too_wide = body_of(keys, N, wide, DIM + 1);
    EXPECT_REFUSED(do_push_raw(cl, 0, 0, 0, PSTRAIN__DTYPE__F32, N, too_wide.buf,
                               too_wide.bytes, NULL),
                   PST_ERR_FORMAT, "need a payload of 72 bytes");
    /* rows that are not finite */
    float bad[N * DIM];
    memcpy(bad, g, sizeof bad);
    bad[DIM + 2] = NAN;
    push_body b = body_of(keys, N, bad, DIM);
    EXPECT_REFUSED(do_push_raw(cl, 0, 0, 0, PSTRAIN__DTYPE__F32, N, b.buf, b.bytes, NULL),
                   PST_ERR_INVALID, "the row of key 202 is NaN");
    memcpy(bad, g, sizeof bad);
    bad[2 * DIM] = -INFINITY;
    b = body_of(keys, N, bad, DIM);
    EXPECT_REFUSED(do_push_raw(cl, 0, 0, 0, PSTRAIN__DTYPE__F32, N, b.buf, b.bytes, NULL),
                   PST_ERR_INVALID, "the row of key 303 is infinite");
    /* keys not unique and ascending */
    const uint64_t descending[N] = {101, 303, 202}, repeated[N] = {101, 202, 202};
    b = body_of(descending, N, g, DIM);
    EXPECT_REFUSED(do_push_raw(cl, 0, 0, 0, PSTRAIN__DTYPE__F32, N, b.buf, b.bytes, NULL),
                   PST_ERR_INVALID, "key 202 at 2 after 303");
    b = body_of(repeated, N, g, DIM);
    EXPECT_REFUSED(do_push_raw(cl, 0, 0, 0, PSTRAIN__DTYPE__F32, N, b.buf, b.bytes, NULL),
                   PST_ERR_INVALID, "key 202 at 2 after 202");
    /* more keys than one call may carry: the count is checked before the payload */
    const uint64_t too_many = (uint64_t)PST_SPARSE_MAX_KEYS + 1;
    EXPECT_REFUSED(do_pull_raw(cl, 0, 0, PSTRAIN__DTYPE__F32, too_many, keys, sizeof keys,
                               after),
                   PST_ERR_LIMIT, "4194305 keys, at most 4194304");
    EXPECT_REFUSED(do_push_raw(cl, 0, 0, 0, PSTRAIN__DTYPE__F32, too_many, good.buf,
                               good.bytes, NULL),
                   PST_ERR_LIMIT, "4194305 keys, at most 4194304");
    /* a dtype rows do not travel in */
    EXPECT_REFUSED(do_pull_raw(cl, 0, 0, PSTRAIN__DTYPE__F16, N, keys, sizeof keys, after),
                   PST_ERR_INVALID, "travel as F32 or BF16");
    EXPECT_REFUSED(do_push_raw(cl, 0, 0, 0, PSTRAIN__DTYPE__F16, N, good.buf, good.bytes,
                               NULL),
                   PST_ERR_INVALID, "travel as F32 or BF16");
    /* a negative step, a step ahead of the table's, a trainer not in the job */
    EXPECT_REFUSED(do_pull_raw(cl, 0, -1, PSTRAIN__DTYPE__F32, N, keys, sizeof keys, after),
                   PST_ERR_INVALID, "step -1; steps count from 0");
    EXPECT_REFUSED(do_push_raw(cl, 0, 0, -1, PSTRAIN__DTYPE__F32, N, good.buf, good.bytes,
                               NULL),
                   PST_ERR_INVALID, "step -1; steps count from 0");
    EXPECT_REFUSED(do_push_raw(cl, 0, 0, 5, PSTRAIN__DTYPE__F32, N, good.buf, good.bytes,
                               NULL),
                   PST_ERR_STATE, "sparse table 0 is at step 0");
    EXPECT_REFUSED(do_push_raw(cl, 1, 0, 0, PSTRAIN__DTYPE__F32, N, good.buf, good.bytes,
                               NULL),
                   PST_ERR_INVALID, "from trainer 1 of 1 trainers");

    /* nothing of them was applied: the initializer's bits at step 0 */
    EXPECT_STATUS(do_pull(cl, 0, keys, N, after), PST_OK);
    expect_rows(after, before, keys, N, "a pull after the refused calls");

    /* a good push is applied once; its retry is answered duplicate */
    int dup = -1;
    EXPECT_STATUS(do_push(cl, 0, 0, keys, N, g, &dup), PST_OK);
    cr_assert_eq(dup, 0, "the first push was answered duplicate");
    EXPECT_STATUS(do_push(cl, 0, 0, keys, N, g, &dup), PST_OK);
    cr_assert_eq(dup, 1, "the same push again was not answered duplicate");
    EXPECT_STATUS(do_pull(cl, 1, keys, N, after), PST_OK);
    for (int i = 0; i < N * DIM; i++)
        want[i] = adagrad_first(before[i], g[i]);
    expect_rows(after, want, keys, N, "step 1 (one Adagrad update)");
    for (int i = 0; i < N * DIM; i++)
        cr_assert_neq(after[i], before[i], "column %d did not move", i);
    fixture_stop(ps, cl);
}

/* ---- c. sync: a pull waits for every trainer's push; rows of a key summed once -------- */

Test(tables_wire, sync_pull_waits_for_every_trainer_and_rows_are_summed_once)
{
    proc *ps;
    int port;
    rpc_client *cl = fixture_start(&ps, &port);
    init_job(cl, 2);
    const init_args t1 = {.trainer = 1, .ntrainers = 2, .dim = DIM, .shards = 1};
    EXPECT_STATUS(do_init(cl, &t1), PST_OK);
    static const uint64_t all[3] = {1, 2, 3}, keys0[2] = {1, 2}, keys1[2] = {2, 3};
    float p0[3 * DIM], want[3 * DIM], a[2 * DIM], b[2 * DIM];
    EXPECT_STATUS(do_pull(cl, 0, all, 3, p0), PST_OK);
    for (int i = 0; i < 2 * DIM; i++) {
        a[i] = 0.125f * (float)(i + 1) - 0.4f;
        b[i] = -0.2f * (float)(i + 2) + 0.9f;
    }
    int dup = -1;
    EXPECT_STATUS(do_push(cl, 0, 0, keys0, 2, a, &dup), PST_OK);
    cr_assert_eq(dup, 0);
    pending_pull *p = calloc(1, sizeof *p);
    cr_assert_not_null(p);
    pending_start(cl, p, 1, all, 3);
    sleep_ms(300);
    cr_assert_not(pending_is_done(p), "a pull of step 1 was answered (%s: %s) before trainer "
                  "1 pushed step 0", pst_strerror(p->st), p->detail);
    EXPECT_STATUS(do_push(cl, 1, 0, keys1, 2, b, &dup), PST_OK);
    cr_assert_eq(dup, 0);
    pending_wait(p, ANSWER_WAIT_MS);
    cr_assert_eq(p->st, PST_OK, "the parked pull failed: %s: %s", pst_strerror(p->st),
                 p->detail);
    cr_assert_eq(p->version, 1);
    cr_assert_eq(p->count, 3);
    for (int j = 0; j < DIM; j++) {
        want[j] = adagrad_first(p0[j], a[j]);                              /* key 1: A1 */
        want[DIM + j] = adagrad_first(p0[DIM + j], a[DIM + j] + b[j]);     /* key 2: A2 + B2 */
        want[2 * DIM + j] = adagrad_first(p0[2 * DIM + j], b[DIM + j]);   /* key 3: B3 */
    }
    expect_rows(p->rows, want, all, 3, "the parked pull of step 1");
    /* the same from a pull made now, and a retry of trainer 1's push changes nothing */
    float now[3 * DIM];
    EXPECT_STATUS(do_push(cl, 1, 0, keys1, 2, b, &dup), PST_OK);
    cr_assert_eq(dup, 1);
    EXPECT_STATUS(do_pull(cl, 1, all, 3, now), PST_OK);
    expect_rows(now, want, all, 3, "a pull of step 1 after it");
    pthread_mutex_destroy(&p->mu);
    free(p);
    fixture_stop(ps, cl);
}

Test(tables_wire, joining_trainer_with_other_tables_is_refused)
{
    proc *ps;
    int port;
    rpc_client *cl = fixture_start(&ps, &port);
    init_job(cl, 2);
    const init_args wider = {.trainer = 1, .ntrainers = 2, .dim = 8, .shards = 1};
    EXPECT_REFUSED(do_init(cl, &wider), PST_ERR_MISMATCH,
                   "trainer 1's sparse table 0 differs from trainer 0's (t)");
    const init_args other_shard = {.trainer = 1, .ntrainers = 2, .dim = DIM, .shard = 1,
                                   .shards = 2};
    EXPECT_REFUSED(do_init(cl, &other_shard), PST_ERR_MISMATCH,
                   "for shard 1 of 2, trainer 0 1 for shard 0 of 1");
    fixture_stop(ps, cl);
}

/* ---- d. a key of another pserver ------------------------------------------------------ */

Test(tables_wire, key_of_another_shard_is_refused)
{
    proc *ps;
    int port;
    rpc_client *cl = fixture_start(&ps, &port);
    const init_args a = {.trainer = 0, .ntrainers = 1, .dim = DIM, .shard = 1, .shards = 2,
                         .initial = 1};
    EXPECT_STATUS(do_init(cl, &a), PST_OK);
    uint64_t mine = 0, theirs = 0;
    while (pst_sparse_pserver_of(mine, 2) != 1)
        mine++;
    while (pst_sparse_pserver_of(theirs, 2) != 0)
        theirs++;
    char what[64];
    snprintf(what, sizeof what, "key %llu (at 0) belongs to pserver 0 of 2",
             (unsigned long long)theirs);
    float rows[2 * DIM], g[2 * DIM];
    for (int i = 0; i < 2 * DIM; i++)
        g[i] = 0.25f;
    EXPECT_REFUSED(do_pull(cl, 0, &theirs, 1, rows), PST_ERR_INVALID, what);
    EXPECT_REFUSED(do_push(cl, 0, 0, &theirs, 1, g, NULL), PST_ERR_INVALID, what);
    /* the second key of a push whose first is this shard's */
    const uint64_t both[2] = {mine < theirs ? mine : theirs, mine < theirs ? theirs : mine};
    snprintf(what, sizeof what, "key %llu (at %d) belongs to pserver 0 of 2, this is "
             "pserver 1", (unsigned long long)theirs, mine < theirs ? 1 : 0);
    EXPECT_REFUSED(do_push(cl, 0, 0, both, 2, g, NULL), PST_ERR_INVALID, what);
    /* this shard's key is served */
    EXPECT_STATUS(do_pull(cl, 0, &mine, 1, rows), PST_OK);
    EXPECT_STATUS(do_push(cl, 0, 0, &mine, 1, g, NULL), PST_OK);
    EXPECT_STATUS(do_pull(cl, 1, &mine, 1, rows), PST_OK);
    fixture_stop(ps, cl);
}

/* ---- e. parked pulls whose client gave up --------------------------------------------- */

/* A table of a 1-trainer job parks at most 2 + 64 pulls (tables.c): two rounds of 40 pulls
 * of a step that does not come, from a client that gives up after 500 ms, all end at their
 * deadline (none refused LIMIT: the first round's left the table when their client went),
 * and the pserver then serves on. */
Test(tables_wire, abandoned_pulls_leave_the_table)
{
    proc *ps;
    int port;
    rpc_client *cl = fixture_start(&ps, &port);
    init_job(cl, 1);
    rpc_client *impatient = client_connect(port, 500, 5000);
    enum { ROUND = 40 };
    static const uint64_t keys[2] = {5, 6};
    pending_pull *p = calloc(ROUND, sizeof *p);
    cr_assert_not_null(p);
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < ROUND; k++)
            pending_start(impatient, &p[k], 1, keys, 2);
        for (int k = 0; k < ROUND; k++) {
            pending_wait(&p[k], ANSWER_WAIT_MS);
            cr_assert_eq(p[k].st, PST_ERR_TIMEOUT, "round %d pull %d ended %s: %s", round, k,
                         pst_strerror(p[k].st), p[k].detail);
            pthread_mutex_destroy(&p[k].mu);
        }
        sleep_ms(300); /* the pserver hears of the last cancellations */
    }
    rpc_client_free(impatient);
    free(p);
    /* it serves on: step 0 pushed and applied, step 1 pulled */
    float p0[2 * DIM], g[2 * DIM], want[2 * DIM], got[2 * DIM];
    for (int i = 0; i < 2 * DIM; i++)
        g[i] = 0.75f - 0.1f * (float)i;
    EXPECT_STATUS(do_pull(cl, 0, keys, 2, p0), PST_OK);
    int dup = -1;
    EXPECT_STATUS(do_push(cl, 0, 0, keys, 2, g, &dup), PST_OK);
    cr_assert_eq(dup, 0);
    EXPECT_STATUS(do_pull(cl, 1, keys, 2, got), PST_OK);
    for (int i = 0; i < 2 * DIM; i++)
        want[i] = adagrad_first(p0[i], g[i]);
    expect_rows(got, want, keys, 2, "step 1 after the abandoned pulls");
    fixture_stop(ps, cl);
}

/* A trainer that leaves the job early closes the tables: the pull parked for the step it
 * will never push fails at once with its reason, and so does every later pull. */
Test(tables_wire, a_departure_fails_parked_and_later_pulls_at_once)
{
    proc *ps;
    int port;
    rpc_client *cl = fixture_start(&ps, &port);
    init_job(cl, 2);
    const init_args t1 = {.trainer = 1, .ntrainers = 2, .dim = DIM, .shards = 1};
    EXPECT_STATUS(do_init(cl, &t1), PST_OK);
    static const uint64_t keys[2] = {4, 9};
    float g[2 * DIM], rows[2 * DIM];
    for (int i = 0; i < 2 * DIM; i++)
        g[i] = 0.01f * (float)i;
    int dup = -1;
    EXPECT_STATUS(do_push(cl, 0, 0, keys, 2, g, &dup), PST_OK);
    pending_pull *p = calloc(1, sizeof *p);
    cr_assert_not_null(p);
    pending_start(cl, p, 1, keys, 2);
    sleep_ms(200);
    cr_assert_not(pending_is_done(p), "a pull of step 1 was answered before trainer 1 pushed");
    Pstrain__FinishRequest fin = PSTRAIN__FINISH_REQUEST__INIT;
    fin.trainer_id = 1;
    fin.early = 1;
    fin.step = 0;
    fin.reason = (char *)"the test sends it away";
    rpc_message *m = NULL;
    EXPECT_STATUS(rpc_client_call(cl, 0, RPC_METHOD_FINISH, &fin.base, NULL, 0, &m), PST_OK);
    rpc_message_free(m);
    const double t0 = now_ms();
    pending_wait(p, 5000);
    cr_assert_eq(p->st, PST_ERR_STATE, "the parked pull: %s: %s", pst_strerror(p->st),
                 p->detail);
    cr_assert(strstr(p->detail, "the test sends it away"), "%s", p->detail);
    EXPECT_REFUSED(do_pull(cl, 1, keys, 2, rows), PST_ERR_STATE, "the test sends it away");
    cr_assert_lt(now_ms() - t0, 5000.0, "the refusals waited for a deadline");
    pthread_mutex_destroy(&p->mu);
    free(p);
    fixture_stop(ps, cl);
}
