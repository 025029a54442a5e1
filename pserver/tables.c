/* tables.c — PullSparse and PushSparse on a pserver's sparse tables (see tables.h).
 *
 * DESIGN: a table's lock guards its version, the pushes of the step being summed (each
 * trainer's keys and rows, checked and copied out of its call) and the pulls parked for a
 * later step; the rows themselves are the sparse table's (its stripe locks). A pull is
 * answered outside the table's lock, from rows that cannot change meanwhile in sync mode
 * (the next step needs this trainer's push). Replies own their payload (malloc, freed when
 * gRPC releases it). */
#include "pserver/tables.h"


#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/log.h"
#include "common/sparse_rows.h"
#include "pserver/sparse_ckpt.h"
#include "rpc/wire.h"

#define PARKED_SLACK 64 /* pulls parked beyond 2 per trainer (retries, abandoned ones) */

typedef struct parked_pull {
    rpc_call *call;
    uint64_t *keys; /* owned */
    size_t n;
    int64_t step;
    pst_dtype dtype;
} parked_pull;

/* One trainer's push of the step being summed: keys then rows in one allocation. */
typedef struct push_in {
    uint64_t *keys; /* NULL: not pushed yet */
    float *rows;
    size_t n;
} push_in;

typedef struct table {
    pst_sparse_table *t;
    int index, dim;
    pthread_mutex_t mu;
    int64_t version;        /* sync: steps applied; async: pushes applied */
    uint32_t have;          /* sync: trainers whose push of step `version` is in */
    push_in *in;            /* (T) */
    uint64_t *mkeys[2];     /* the merge's two buffers (sync, T > 1) */
    float *mrows[2];
    size_t mcap;
    parked_pull *parked;
    int nparked, parked_cap;
    pst_sparse_ckpt ckpt;   /* its checkpoints (ps_tables.every > 0) */
    pst_status broken;      /* a step could not be applied: every later call fails */
    char why[512];
    uint64_t keys_pulled, keys_pushed; /* __atomic */
} table;

struct ps_tables {
    int sync;
    int64_t every;          /* a checkpoint every this many steps (0: none) */
    uint32_t trainers, shard, shards;
    int n;
    table *tabs;
};

/* ---- Init ----------------------------------------------------------------------------- */

static pst_status spec_config(const Pstrain__SparseTableSpec *w, size_t i, pst_sparse_config *c)
{
    pst_sparse_defaults(c);
    const char *name = w->name ? w->name : "";
    if (strlen(name) >= sizeof c->name)
        return pst_error_set(PST_ERR_INVALID, "Init: sparse table %zu's name is longer than "
                             "%zu characters", i, sizeof c->name - 1);
    snprintf(c->name, sizeof c->name, "%s", name);
    if (w->dim < 1 || w->dim > PST_SPARSE_MAX_DIM)
        return pst_error_set(PST_ERR_INVALID, "Init: sparse table %zu (%s): dim %u, a good "
                             "value is 1 to %d (example: 16)", i, name, w->dim,
                             PST_SPARSE_MAX_DIM);
    c->dim = (int)w->dim;
    if (pst_sparse_optim_parse(w->optim ? w->optim : "", &c->optim) != 0)
        return pst_error_set(PST_ERR_INVALID, "Init: sparse table %zu (%s): optimizer \"%.32s\""
                             " is not sgd, adagrad or adam", i, name, w->optim ? w->optim : "");
    c->lr = w->lr;
    c->eps = w->eps;
    c->beta1 = w->beta1;
    c->beta2 = w->beta2;
    c->init_std = w->init_std;
    c->seed = w->seed;
    c->admit_count = w->admit_count ? w->admit_count : 1; /* 0 and 1: the first push */
    c->evict_after = (long)w->evict_after;
    c->max_rows = (size_t)w->max_rows;
    pst_status st = pst_sparse_check(c);
    return st == PST_OK ? st : pst_error_wrap(st, "Init: sparse table %zu (%s)", i, name);
}

static pst_status table_init(table *tab, int index, const pst_sparse_config *c, uint32_t T)
{
    tab->index = index;
    tab->dim = c->dim;
    pthread_mutex_init(&tab->mu, NULL);
    tab->in = calloc(T, sizeof *tab->in);
    tab->parked_cap = 2 * (int)T + PARKED_SLACK;
    tab->parked = calloc((size_t)tab->parked_cap, sizeof *tab->parked);
    if (!tab->in || !tab->parked)
        return pst_error_set(PST_ERR_NOMEM, "Init: out of memory for sparse table %s", c->name);
    return pst_sparse_create(&tab->t, c);
}

pst_status ps_tables_init(ps_tables **out, const Pstrain__InitRequest *req, int sync,
                          const char *ckpt_dir, int keep)
{
    *out = NULL;
    if (req->n_sparse_tables > PS_TABLES_MAX)
        return pst_error_set(PST_ERR_LIMIT, "Init: %zu sparse tables, at most %d",
                             req->n_sparse_tables, PS_TABLES_MAX);
    const uint32_t shards = req->sparse_shards ? req->sparse_shards : 1;
    if (req->sparse_shard >= shards)
        return pst_error_set(PST_ERR_INVALID, "Init: sparse shard %u of %u: shards run from 0 "
                             "to sparse_shards - 1", req->sparse_shard, shards);
    ps_tables *ts = calloc(1, sizeof *ts);
    if (!ts || !(ts->tabs = calloc(req->n_sparse_tables + 1, sizeof *ts->tabs))) {
        free(ts);
        return pst_error_set(PST_ERR_NOMEM, "Init: out of memory for the sparse tables");
    }
    ts->sync = sync;
    ts->trainers = req->num_trainers;
    ts->shard = req->sparse_shard;
    ts->shards = shards;
    ts->every = sync && ckpt_dir && ckpt_dir[0] && req->checkpoint_every > 0
                    ? req->checkpoint_every : 0;
    pst_status st = PST_OK;
    for (size_t i = 0; st == PST_OK && i < req->n_sparse_tables; i++) {
        pst_sparse_config c;
        st = spec_config(req->sparse_tables[i], i, &c);
        if (st == PST_OK) {
            ts->n++; /* freed by ps_tables_free from here on */
            st = table_init(&ts->tabs[i], (int)i, &c, req->num_trainers);
        }
        if (st == PST_OK && ts->every) {
            char dir[4200];
            snprintf(dir, sizeof dir, "%s/table-%zu", ckpt_dir, i);
            pst_sparse_ckpt_init(&ts->tabs[i].ckpt, ts->tabs[i].t, dir, keep, -1);
        }
    }
    if (st != PST_OK) {
        ps_tables_free(ts);
        return st;
    }
    *out = ts;
    return PST_OK;
}

static int same_config(const pst_sparse_config *a, const pst_sparse_config *b)
{
    return !strcmp(a->name, b->name) && a->dim == b->dim && a->optim == b->optim &&
           a->lr == b->lr && a->eps == b->eps && a->beta1 == b->beta1 && a->beta2 == b->beta2 &&
           a->init_std == b->init_std && a->seed == b->seed && a->admit_count == b->admit_count &&
           a->evict_after == b->evict_after && a->max_rows == b->max_rows;
}

pst_status ps_tables_check_join(const ps_tables *ts, const Pstrain__InitRequest *req)
{
    const uint32_t shards = req->sparse_shards ? req->sparse_shards : 1;
    if ((int)req->n_sparse_tables != ts->n || req->sparse_shard != ts->shard ||
        shards != ts->shards)
        return pst_error_set(PST_ERR_MISMATCH, "Init: trainer %u lists %zu sparse tables for "
                             "shard %u of %u, trainer 0 %d for shard %u of %u: start every "
                             "trainer with the same flags and pservers", req->trainer_id,
                             req->n_sparse_tables, req->sparse_shard, shards, ts->n, ts->shard,
                             ts->shards);
    for (int i = 0; i < ts->n; i++) {
        pst_sparse_config c;
        if (spec_config(req->sparse_tables[i], (size_t)i, &c) != PST_OK ||
            !same_config(&c, pst_sparse_config_of(ts->tabs[i].t)))
            return pst_error_set(PST_ERR_MISMATCH, "Init: trainer %u's sparse table %d differs "
                                 "from trainer 0's (%s): start every trainer with the same "
                                 "flags", req->trainer_id, i,
                                 pst_sparse_config_of(ts->tabs[i].t)->name);
    }
    return PST_OK;
}

/* ---- checks shared by both methods ---------------------------------------------------- */

static table *lookup(ps_tables *ts, uint32_t index, const char *method, pst_status *st)
{
    if (index < (uint32_t)ts->n)
        return &ts->tabs[index];
    *st = ts->n ? pst_error_set(PST_ERR_NOT_FOUND, "%s of sparse table %u: this pserver has %d "
                                "(0 to %d)", method, index, ts->n, ts->n - 1)
                : pst_error_set(PST_ERR_NOT_FOUND, "%s of sparse table %u: this job has no "
                                "sparse tables", method, index);
    return NULL;
}

static pst_status wire_dtype(Pstrain__DType w, const char *method, pst_dtype *dt)
{
    if (rpc_dtype_from_wire(w, dt) != PST_OK || (*dt != PST_F32 && *dt != PST_BF16))
        return pst_error_set(PST_ERR_INVALID, "%s: rows in dtype %d; a sparse table's rows "
                             "travel as F32 or BF16", method, (int)w);
    return PST_OK;
}

/* Each key this pserver's shard; ascending: also unique and ascending. */
static pst_status check_keys(const ps_tables *ts, const table *tab, const uint64_t *keys,
                             size_t n, int ascending, const char *method)
{
    for (size_t i = 0; i < n; i++) {
        if (ts->shards > 1 && pst_sparse_pserver_of(keys[i], (int)ts->shards) != (int)ts->shard)
            return pst_error_set(PST_ERR_INVALID, "%s of sparse table %d: key %llu (at %zu) "
                                 "belongs to pserver %d of %u, this is pserver %u", method,
                                 tab->index, (unsigned long long)keys[i], i,
                                 pst_sparse_pserver_of(keys[i], (int)ts->shards), ts->shards,
                                 ts->shard);
        if (ascending && i > 0 && keys[i] <= keys[i - 1])
            return pst_error_set(PST_ERR_INVALID, "%s of sparse table %d: key %llu at %zu after "
                                 "%llu: the keys must be unique and ascending", method,
                                 tab->index, (unsigned long long)keys[i], i,
                                 (unsigned long long)keys[i - 1]);
    }
    return PST_OK;
}

static void count_keys(uint64_t *counter, size_t n)
{
    __atomic_fetch_add(counter, (uint64_t)n, __ATOMIC_RELAXED);
}

/* ---- PullSparse ----------------------------------------------------------------------- */

/* Answers a pull with the rows of keys as of `step` (tables.h); frees nothing of keys. */
static void answer_pull(table *tab, rpc_call *call, const uint64_t *keys, size_t n, int64_t step,
                        pst_dtype dt, int64_t version)
{
    const size_t elems = n * (size_t)tab->dim, bytes = elems * pst_dtype_size(dt);
    float *rows = malloc(sizeof(float) * (elems ? elems : 1));
    void *out = dt == PST_F32 ? (void *)rows : malloc(bytes ? bytes : 1);
    pst_status st = rows && out ? PST_OK
                                : pst_error_set(PST_ERR_NOMEM, "PullSparse: out of memory for "
                                                "%zu rows", n);
    if (st == PST_OK)
        st = pst_sparse_pull(tab->t, keys, n, step, rows);
    if (st == PST_OK && dt != PST_F32)
        pst_cast(out, dt, rows, PST_F32, elems);
    if (out != rows)
        free(rows);
    if (st != PST_OK) {
        free(out);
        rpc_call_fail(call, st, "%s", pst_error_detail());
        return;
    }
    count_keys(&tab->keys_pulled, n);
    Pstrain__PullSparseReply reply = PSTRAIN__PULL_SPARSE_REPLY__INIT;
    reply.table = (uint32_t)tab->index;
    reply.version = version;
    reply.dtype = rpc_dtype_to_wire(dt);
    reply.count = n;
    reply.dim = (uint32_t)tab->dim;
    rpc_call_reply(call, &reply.base, out, bytes, free, out);
}

static void fail_call(rpc_call *call, pst_status st)
{
    PST_DEBUG("%s from %s failed: %s", rpc_method_name(rpc_call_method(call)),
              rpc_call_peer(call), pst_error_detail());
    rpc_call_fail(call, st, "%s", pst_error_detail());
}

void ps_tables_pull(ps_tables *ts, rpc_call *call)
{
    const Pstrain__PullSparseRequest *req =
        (const Pstrain__PullSparseRequest *)rpc_call_request(call);
    const rpc_payload *pl = rpc_call_payload(call);
    pst_status st = PST_OK;
    pst_dtype dt = PST_F32;
    uint64_t *keys = NULL;
    table *tab = lookup(ts, req->table, "PullSparse", &st);
    if (tab)
        st = wire_dtype(req->dtype, "PullSparse", &dt);
    if (st == PST_OK && req->count > PST_SPARSE_MAX_KEYS)
        st = pst_error_set(PST_ERR_LIMIT, "PullSparse of sparse table %u: %llu keys, at most %u "
                           "in one call", req->table, (unsigned long long)req->count,
                           PST_SPARSE_MAX_KEYS);
    if (st == PST_OK && req->step < 0)
        st = pst_error_set(PST_ERR_INVALID, "PullSparse of sparse table %u: step %lld; steps "
                           "count from 0", req->table, (long long)req->step);
    if (st == PST_OK && req->count * (uint64_t)tab->dim * sizeof(float) > PS_TABLES_MAX_CALL_BYTES)
        st = pst_error_set(PST_ERR_LIMIT, "PullSparse of sparse table %u: %llu rows of %d are "
                           "more than %u MiB in one reply: pull fewer keys a call",
                           req->table, (unsigned long long)req->count, tab->dim,
                           PS_TABLES_MAX_CALL_BYTES >> 20);
    if (st == PST_OK && (!pl ? req->count != 0 : pl->bytes != req->count * sizeof(uint64_t)))
        st = pst_error_set(PST_ERR_FORMAT, "PullSparse of sparse table %u: %llu keys but a "
                           "payload of %zu bytes (8 a key)", req->table,
                           (unsigned long long)req->count, pl ? pl->bytes : 0);
    const size_t n = (size_t)req->count;
    if (st == PST_OK && !(keys = malloc(sizeof(uint64_t) * (n ? n : 1))))
        st = pst_error_set(PST_ERR_NOMEM, "PullSparse: out of memory for %zu keys", n);
    if (st == PST_OK && n)
        st = rpc_payload_read(pl, 0, keys, n * sizeof(uint64_t));
    if (st == PST_OK)
        st = check_keys(ts, tab, keys, n, 0, "PullSparse");
    if (st != PST_OK) {
        free(keys);
        fail_call(call, st);
        return;
    }
    rpc_call_set_owner(call, tab); /* before it is parked: ps_tables_cancelled finds it */
    pthread_mutex_lock(&tab->mu);
    const int64_t version = tab->version;
    if (tab->broken != PST_OK) {
        st = tab->broken;
        pst_error_set(st, "%s", tab->why);
    } else if (ts->sync && req->step > version + 1) {
        st = pst_error_set(PST_ERR_STATE, "PullSparse of step %lld from trainer %u: sparse table "
                           "%u is at step %lld (sync: a trainer pulls at most the next step)",
                           (long long)req->step, req->trainer_id, req->table,
                           (long long)version);
    } else if (ts->sync && req->step > version && tab->nparked == tab->parked_cap) {
        st = pst_error_set(PST_ERR_LIMIT, "PullSparse of sparse table %u: %d pulls wait on it, "
                           "at most %d (2 per trainer, + %d)", req->table, tab->nparked,
                           tab->parked_cap, PARKED_SLACK);
    } else if (ts->sync && req->step > version) {
        tab->parked[tab->nparked++] = (parked_pull){call, keys, n, req->step, dt};
        pthread_mutex_unlock(&tab->mu);
        if (rpc_call_cancelled(call)) /* a cancel that came before the owner was set */
            ps_tables_cancelled(ts, call);
        return;
    }
    pthread_mutex_unlock(&tab->mu);
    if (st == PST_OK)
        answer_pull(tab, call, keys, n, req->step, dt, version);
    else
        fail_call(call, st);
    free(keys);
}

void ps_tables_cancelled(ps_tables *ts, rpc_call *call)
{
    (void)ts;
    table *tab = rpc_call_owner(call);
    if (!tab)
        return;
    parked_pull found = {0};
    pthread_mutex_lock(&tab->mu);
    for (int i = 0; i < tab->nparked; i++)
        if (tab->parked[i].call == call) {
            found = tab->parked[i];
            tab->parked[i] = tab->parked[--tab->nparked];
            break;
        }
    pthread_mutex_unlock(&tab->mu);
    if (!found.call)
        return; /* answered already */
    free(found.keys);
    rpc_call_fail(call, PST_ERR_TIMEOUT, "PullSparse: the client gave up waiting");
}

/* Fails the pulls parked on tab (rpc_call_fail does not block), and closes it: its later
 * calls fail at once with the same reason. Called with tab->mu held. */
static void close_locked(table *tab, pst_status st, const char *why)
{
    if (tab->broken == PST_OK) {
        tab->broken = st;
        snprintf(tab->why, sizeof tab->why, "sparse table %d: %s", tab->index, why);
    }
    for (int k = 0; k < tab->nparked; k++) {
        rpc_call_fail(tab->parked[k].call, tab->broken, "%s", tab->why);
        free(tab->parked[k].keys);
    }
    tab->nparked = 0;
}

void ps_tables_fail_waiting(ps_tables *ts, pst_status st, const char *why)
{
    for (int i = 0; ts && i < ts->n; i++) {
        table *tab = &ts->tabs[i];
        pthread_mutex_lock(&tab->mu);
        close_locked(tab, st, why);
        pthread_mutex_unlock(&tab->mu);
    }
}

/* ---- PushSparse ----------------------------------------------------------------------- */

/* The push's keys and rows, checked, in one allocation (*in). */
static pst_status read_push(ps_tables *ts, table *tab, const Pstrain__PushSparseRequest *req,
                            const rpc_payload *pl, push_in *in)
{
    pst_dtype dt = PST_F32;
    PST_TRY(wire_dtype(req->dtype, "PushSparse", &dt));
    if (req->count > PST_SPARSE_MAX_KEYS)
        return pst_error_set(PST_ERR_LIMIT, "PushSparse of sparse table %u: %llu keys, at most "
                             "%u in one call", req->table, (unsigned long long)req->count,
                             PST_SPARSE_MAX_KEYS);
    if (req->step < 0)
        return pst_error_set(PST_ERR_INVALID, "PushSparse of sparse table %u: step %lld; steps "
                             "count from 0", req->table, (long long)req->step);
    if (req->trainer_id >= ts->trainers)
        return pst_error_set(PST_ERR_INVALID, "PushSparse from trainer %u of %u trainers",
                             req->trainer_id, ts->trainers);
    const size_t n = (size_t)req->count, elems = n * (size_t)tab->dim;
    const size_t es = pst_dtype_size(dt), want = n * sizeof(uint64_t) + elems * es;
    if (elems * sizeof(float) > PS_TABLES_MAX_CALL_BYTES) /* count <= 2^22, dim <= 4096 */
        return pst_error_set(PST_ERR_LIMIT, "PushSparse of sparse table %u: %zu rows of %d are "
                             "more than %u MiB in one call: push fewer keys a call",
                             req->table, n, tab->dim, PS_TABLES_MAX_CALL_BYTES >> 20);
    if (pl ? pl->bytes != want : want != 0)
        return pst_error_set(PST_ERR_FORMAT, "PushSparse of sparse table %u: %llu keys of rows "
                             "of %d %s need a payload of %zu bytes (the keys, then the rows), "
                             "it has %zu", req->table, (unsigned long long)req->count, tab->dim,
                             pst_dtype_name(dt), want, pl ? pl->bytes : 0);
    void *buf = malloc(n * sizeof(uint64_t) + sizeof(float) * elems + 1);
    if (!buf)
        return pst_error_set(PST_ERR_NOMEM, "PushSparse: out of memory for %zu rows", n);
    *in = (push_in){.keys = buf, .rows = (float *)((uint64_t *)buf + n), .n = n};
    pst_status st = PST_OK;
    if (n) {
        st = rpc_payload_read(pl, 0, in->keys, n * sizeof(uint64_t));
        if (st == PST_OK)
            st = rpc_payload_read_f32(pl, dt, n * sizeof(uint64_t) / es, in->rows, elems);
    }
    if (st == PST_OK)
        st = check_keys(ts, tab, in->keys, n, 1, "PushSparse");
    for (size_t i = 0; st == PST_OK && i < elems; i++)
        if (!isfinite(in->rows[i]))
            st = pst_error_set(PST_ERR_INVALID, "PushSparse of sparse table %u: the row of key "
                               "%llu is %s at %zu; gradients must be finite", req->table,
                               (unsigned long long)in->keys[i / (size_t)tab->dim],
                               isnan(in->rows[i]) ? "NaN" : "infinite", i % (size_t)tab->dim);
    if (st != PST_OK) {
        free(buf);
        in->keys = NULL;
    }
    return st;
}

/* Sync, every trainer's push of step `version` in: their rows added in trainer order, the
 * sums applied, the version moved on; the pulls it makes ready move to *ready (*nready;
 * the caller answers them outside the lock and frees the array). Called with tab->mu. */
static pst_status complete_step_locked(ps_tables *ts, table *tab, parked_pull **ready,
                                       int *nready)
{
    const size_t dim = (size_t)tab->dim;
    size_t total = 0;
    for (uint32_t t = 0; t < ts->trainers; t++)
        total += tab->in[t].n;
    const uint64_t *keys = tab->in[0].keys;
    const float *rows = tab->in[0].rows;
    size_t n = tab->in[0].n;
    pst_status st = PST_OK;
    if (ts->trainers > 1 && total > tab->mcap) {
        for (int k = 0; k < 2; k++) {
            free(tab->mkeys[k]);
            free(tab->mrows[k]);
            tab->mkeys[k] = malloc(sizeof(uint64_t) * total);
            tab->mrows[k] = malloc(sizeof(float) * total * dim);
        }
        tab->mcap = tab->mkeys[0] && tab->mkeys[1] && tab->mrows[0] && tab->mrows[1] ? total : 0;
        if (!tab->mcap)
            st = pst_error_set(PST_ERR_NOMEM, "PushSparse: out of memory to sum %zu rows", total);
    }
    /* acc = trainer 0's, then acc + trainer t's for t = 1, 2, ...: each key's rows added in
     * trainer order (pst_rows_merge's contract) */
    for (uint32_t t = 1; st == PST_OK && t < ts->trainers; t++) {
        const int k = (int)(t & 1);
        const uint64_t *const lk[2] = {keys, tab->in[t].keys};
        const size_t ln[2] = {n, tab->in[t].n};
        const float *const lr[2] = {rows, tab->in[t].rows};
        st = pst_rows_merge(2, lk, ln, lr, dim, tab->mkeys[k], tab->mrows[k], &n);
        keys = tab->mkeys[k];
        rows = tab->mrows[k];
    }
    const int64_t step = tab->version;
    if (st == PST_OK)
        st = pst_sparse_push(tab->t, keys, n, rows, (long)step);
    if (st == PST_OK && (st = pst_sparse_step_done(tab->t, &tab->ckpt, (long)ts->every,
                                                   (long)step)) != PST_OK)
        PST_ERROR("sparse table %d: no checkpoint of step %lld: %s", tab->index,
                  (long long)step + 1, pst_error_detail());
    for (uint32_t t = 0; t < ts->trainers; t++) {
        free(tab->in[t].keys);
        tab->in[t] = (push_in){0};
    }
    tab->have = 0;
    *nready = 0;
    *ready = NULL;
    if (st == PST_OK) {
        tab->version = step + 1;
        /* the pulls of the new step, answered by the caller after the lock */
        if (tab->nparked && !(*ready = malloc(sizeof **ready * (size_t)tab->nparked)))
            st = pst_error_set(PST_ERR_NOMEM, "out of memory answering the pulls of step "
                               "%lld", (long long)step + 1);
        for (int i = 0; *ready && i < tab->nparked;) {
            if (tab->parked[i].step <= tab->version) {
                (*ready)[(*nready)++] = tab->parked[i];
                tab->parked[i] = tab->parked[--tab->nparked];
            } else {
                i++;
            }
        }
    }
    if (st != PST_OK) { /* the step is lost: the table is closed, its waiting pulls failed */
        char why[400];
        snprintf(why, sizeof why, "stopped at step %lld: %s", (long long)step,
                 pst_error_detail());
        close_locked(tab, st, why);
        pst_error_set(st, "%s", tab->why);
    }
    return st;
}

static void answer_push(rpc_call *call, int duplicate)
{
    Pstrain__PushSparseReply reply = PSTRAIN__PUSH_SPARSE_REPLY__INIT;
    reply.duplicate = duplicate != 0;
    rpc_call_reply(call, &reply.base, NULL, 0, NULL, NULL);
}

static void push_async(ps_tables *ts, table *tab, rpc_call *call, push_in *in, int64_t step)
{
    pst_status st = pst_sparse_push(tab->t, in->keys, in->n, in->rows, (long)step);
    count_keys(&tab->keys_pushed, in->n);
    free(in->keys);
    if (st != PST_OK) {
        fail_call(call, st);
        return;
    }
    pthread_mutex_lock(&tab->mu);
    const int64_t pushes = ++tab->version;
    pthread_mutex_unlock(&tab->mu);
    if (pst_sparse_config_of(tab->t)->evict_after > 0 &&
        pushes % (PST_SPARSE_SWEEP_EVERY * (int64_t)ts->trainers) == 0)
        pst_sparse_sweep(tab->t, (long)step);
    answer_push(call, 0);
}

void ps_tables_push(ps_tables *ts, rpc_call *call)
{
    const Pstrain__PushSparseRequest *req =
        (const Pstrain__PushSparseRequest *)rpc_call_request(call);
    pst_status st = PST_OK;
    push_in in = {0};
    table *tab = lookup(ts, req->table, "PushSparse", &st);
    if (tab)
        st = read_push(ts, tab, req, rpc_call_payload(call), &in);
    if (st != PST_OK) {
        fail_call(call, st);
        return;
    }
    if (!ts->sync) {
        push_async(ts, tab, call, &in, req->step);
        return;
    }
    int duplicate = 0, nready = 0;
    parked_pull *ready = NULL;
    pthread_mutex_lock(&tab->mu);
    const int64_t version = tab->version;
    if (tab->broken != PST_OK) {
        st = tab->broken;
        pst_error_set(st, "%s", tab->why);
    } else if (req->step < version || (req->step == version && tab->in[req->trainer_id].keys)) {
        duplicate = 1;
    } else if (req->step > version) {
        st = pst_error_set(PST_ERR_STATE, "PushSparse of step %lld from trainer %u: sparse table "
                           "%u is at step %lld (sync: a step is pushed after its rows were "
                           "pulled)", (long long)req->step, req->trainer_id, req->table,
                           (long long)version);
    } else {
        tab->in[req->trainer_id] = in;
        in.keys = NULL; /* the table's now */
        count_keys(&tab->keys_pushed, tab->in[req->trainer_id].n);
        if (++tab->have == ts->trainers)
            st = complete_step_locked(ts, tab, &ready, &nready);
    }
    const int64_t now = tab->version;
    pthread_mutex_unlock(&tab->mu);
    free(in.keys);
    for (int i = 0; i < nready; i++) {
        answer_pull(tab, ready[i].call, ready[i].keys, ready[i].n, ready[i].step,
                    ready[i].dtype, now);
        free(ready[i].keys);
    }
    free(ready);
    if (st != PST_OK)
        fail_call(call, st);
    else
        answer_push(call, duplicate);
}

/* ---- the rest ------------------------------------------------------------------------- */

size_t ps_tables_max_request(const ps_tables *ts, rpc_method m)
{
    int dim = 0;
    for (int i = 0; ts && i < ts->n; i++)
        dim = ts->tabs[i].dim > dim ? ts->tabs[i].dim : dim;
    const size_t keys = (size_t)PST_SPARSE_MAX_KEYS * sizeof(uint64_t);
    if (m == RPC_METHOD_PULL_SPARSE)
        return keys + RPC_SMALL_REQUEST_MAX;
    if (m == RPC_METHOD_PUSH_SPARSE) /* the keys and at most the call's bytes of f32 rows */
        return keys + (dim ? PS_TABLES_MAX_CALL_BYTES : 0) + RPC_SMALL_REQUEST_MAX;
    return 0;
}

pst_status ps_tables_resume(ps_tables *ts, int64_t step)
{
    if (ts && ts->n && !ts->every)
        return pst_error_set(PST_ERR_STATE, "sparse tables: resuming at step %lld without "
                             "checkpoints of them (sync mode and a checkpoint directory "
                             "with --checkpoint-every)", (long long)step);
    for (int i = 0; ts && i < ts->n; i++) {
        table *tab = &ts->tabs[i];
        pst_status st = pst_sparse_ckpt_load(tab->ckpt.dir, (long)step, tab->t);
        if (st != PST_OK)
            return pst_error_wrap(st, "sparse table %d (%s): resuming at step %lld", i,
                                  pst_sparse_config_of(tab->t)->name, (long long)step);
        tab->version = step;
        char dir[sizeof tab->ckpt.dir];
        snprintf(dir, sizeof dir, "%s", tab->ckpt.dir); /* init writes its own copy */
        pst_sparse_ckpt_init(&tab->ckpt, tab->t, dir, tab->ckpt.keep, (long)step);
    }
    return PST_OK;
}

int ps_tables_count(const ps_tables *ts)
{
    return ts ? ts->n : 0;
}

pst_sparse_table *ps_tables_table(ps_tables *ts, int i)
{
    return ts && i >= 0 && i < ts->n ? ts->tabs[i].t : NULL;
}

void ps_tables_totals_of(ps_tables *ts, ps_tables_totals *out, int with_hash)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; ts && i < ts->n; i++) {
        pst_sparse_stats s;
        pst_sparse_stats_of(ts->tabs[i].t, &s);
        out->rows += s.rows;
        out->bytes += s.bytes;
        out->created += s.created;
        out->evicted += s.evicted;
        out->refused += s.refused;
        out->hash += with_hash ? pst_sparse_hash(ts->tabs[i].t) : 0;
        out->keys_pulled += __atomic_load_n(&ts->tabs[i].keys_pulled, __ATOMIC_RELAXED);
        out->keys_pushed += __atomic_load_n(&ts->tabs[i].keys_pushed, __ATOMIC_RELAXED);
    }
}

void ps_tables_free(ps_tables *ts)
{
    if (!ts)
        return;
    for (int i = 0; i < ts->n; i++) {
        table *tab = &ts->tabs[i];
        for (uint32_t t = 0; tab->in && t < ts->trainers; t++)
            free(tab->in[t].keys);
        for (int k = 0; k < tab->nparked; k++)
            free(tab->parked[k].keys);
        for (int k = 0; k < 2; k++) {
            free(tab->mkeys[k]);
            free(tab->mrows[k]);
        }
        free(tab->in);
        free(tab->parked);
        pst_sparse_free(tab->t);
        pthread_mutex_destroy(&tab->mu);
    }
    free(ts->tabs);
    free(ts);
}
