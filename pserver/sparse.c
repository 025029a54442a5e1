/* sparse.c — the sparse table (see sparse.h). */
#include "pserver/sparse.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/rng.h"
#include "pserver/sparse_index.h"

#define PENDING (PS_INDEX_EMPTY - 1) /* an entry's row: a key counted, not admitted */

typedef struct stripe {
    pthread_mutex_t mu;
    ps_index index;    /* entries {key, row or PENDING, pushes, last step} */
    float **slabs;     /* (nslabs) each PST_SPARSE_SLAB_ROWS rows of row_floats */
    size_t nslabs, slabs_cap;
    uint64_t *row_key; /* (rows_cap) the key of each row: moving the last row needs it */
    size_t rows, rows_cap, pending;
    uint64_t created, evicted, refused;
    /* the keys removed since the last pst_sparse_take_removed (while logging) */
    uint64_t *gone;
    size_t ngone, gone_cap;
    int gone_lost;     /* the log could not grow: a key is missing from it */
} stripe;

struct pst_sparse_table {
    pst_sparse_config cfg;
    size_t row_floats; /* dim * (1 + state floats) */
    size_t share;      /* rows per stripe at most (0: no limit) */
    int log_removals;  /* pst_sparse_log_removals */
    stripe st[PST_SPARSE_STRIPES];
};

/* ---- configuration ------------------------------------------------------------------- */

void pst_sparse_defaults(pst_sparse_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->dim = 16;
    cfg->optim = PST_SPARSE_ADAGRAD;
    cfg->lr = 0.05;
    cfg->eps = 1e-10;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.999;
    cfg->init_std = 0.01f;
    cfg->admit_count = 1;
}

static const char *const optim_names[PST_SPARSE_OPTIM_COUNT_] = {"sgd", "adagrad", "adam"};

const char *pst_sparse_optim_name(pst_sparse_optim o)
{
    return o >= 0 && o < PST_SPARSE_OPTIM_COUNT_ ? optim_names[o] : "unknown";
}

int pst_sparse_optim_parse(const char *s, pst_sparse_optim *out)
{
    for (int i = 0; s && i < PST_SPARSE_OPTIM_COUNT_; i++)
        if (!strcmp(s, optim_names[i])) {
            *out = (pst_sparse_optim)i;
            return 0;
        }
    return -1;
}

int pst_sparse_state_floats(pst_sparse_optim o)
{
    return o == PST_SPARSE_ADAM ? 2 : o == PST_SPARSE_ADAGRAD ? 1 : 0;
}

pst_status pst_sparse_check(const pst_sparse_config *c)
{
    const char *name = c->name;
    if (!name[0] || !memchr(name, 0, sizeof c->name))
        return pst_error_set(PST_ERR_INVALID, "sparse table: a name of 1 to %d characters "
                             "(example: field_3)", PST_SPARSE_NAME_MAX - 1);
    if (c->dim < 1 || c->dim > PST_SPARSE_MAX_DIM)
        return pst_error_set(PST_ERR_INVALID, "sparse table %s: dim %d, want 1 to %d (example: "
                             "16)", name, c->dim, PST_SPARSE_MAX_DIM);
    if (c->optim < 0 || c->optim >= PST_SPARSE_OPTIM_COUNT_)
        return pst_error_set(PST_ERR_INVALID, "sparse table %s: optimizer %d, want sgd, "
                             "adagrad or adam", name, (int)c->optim);
    if (!(c->lr > 0.0) || !isfinite(c->lr))
        return pst_error_set(PST_ERR_INVALID, "sparse table %s: lr %g, want a finite value > 0 "
                             "(example: 0.05)", name, (double)c->lr);
    if (c->optim != PST_SPARSE_SGD && (!(c->eps > 0.0) || !isfinite(c->eps)))
        return pst_error_set(PST_ERR_INVALID, "sparse table %s: eps %g, want a finite value > 0 "
                             "(example: 1e-10)", name, (double)c->eps);
    if (c->optim == PST_SPARSE_ADAM && !(c->beta1 >= 0.0 && c->beta1 < 1.0 &&
                                         c->beta2 >= 0.0 && c->beta2 < 1.0))
        return pst_error_set(PST_ERR_INVALID, "sparse table %s: betas %g, %g, want each in "
                             "[0, 1) (example: 0.9, 0.999)", name, (double)c->beta1,
                             (double)c->beta2);
    if (!(c->init_std >= 0.0f) || !isfinite(c->init_std))
        return pst_error_set(PST_ERR_INVALID, "sparse table %s: init_std %g, want a finite value "
                             ">= 0 (example: 0.01)", name, (double)c->init_std);
    if (c->max_rows > 0 && c->max_rows < PST_SPARSE_STRIPES)
        return pst_error_set(PST_ERR_INVALID, "sparse table %s: max_rows %zu, want 0 (no "
                             "limit) or at least %d (one row in each stripe)", name, c->max_rows,
                             PST_SPARSE_STRIPES);
    if (c->evict_after < 0)
        return pst_error_set(PST_ERR_INVALID, "sparse table %s: evict_after %ld, want >= 0 "
                             "steps (0: never)", name, c->evict_after);
    return PST_OK;
}

static inline int stripe_of(uint64_t h)
{
    return (int)(h & (PST_SPARSE_STRIPES - 1));
}

/* The index slot of key in s. */
static inline ps_index_entry *entry_of(const stripe *s, uint64_t key)
{
    return &s->index.slots[ps_index_find(&s->index, key, pst_sparse_mix(key))];
}

/* ---- rows ---------------------------------------------------------------------------- */

static inline float *row_at(const pst_sparse_table *t, const stripe *s, uint32_t r)
{
    return s->slabs[r / PST_SPARSE_SLAB_ROWS] + (size_t)(r % PST_SPARSE_SLAB_ROWS) * t->row_floats;
}

/* The initializer's values of key: N(0, init_std^2) from (seed, key). */
static void init_values(const pst_sparse_table *t, uint64_t key, float *v)
{
    const int dim = t->cfg.dim;
    if (t->cfg.init_std == 0.0f) {
        memset(v, 0, sizeof(float) * (size_t)dim);
        return;
    }
    pst_rng r;
    pst_rng_seed(&r, t->cfg.seed, key);
    for (int j = 0; j < dim; j++)
        v[j] = t->cfg.init_std * pst_rng_normal(&r);
}

/* A new row for key at the end of the stripe's rows: the initializer's values, zero
 * state. Returns its index, or PS_INDEX_EMPTY when out of memory. */
static uint32_t new_row(pst_sparse_table *t, stripe *s, uint64_t key)
{
    if (s->rows >= (size_t)PENDING - 1)
        return PS_INDEX_EMPTY;
    if (s->rows == s->nslabs * PST_SPARSE_SLAB_ROWS) {
        if (s->nslabs == s->slabs_cap) {
            const size_t cap = s->slabs_cap ? 2 * s->slabs_cap : 4;
            float **slabs = realloc(s->slabs, cap * sizeof *slabs);
            if (!slabs)
                return PS_INDEX_EMPTY;
            s->slabs = slabs;
            s->slabs_cap = cap;
        }
        if (!(s->slabs[s->nslabs] = malloc(sizeof(float) * PST_SPARSE_SLAB_ROWS *
                                           t->row_floats)))
            return PS_INDEX_EMPTY;
        s->nslabs++;
    }
    if (s->rows == s->rows_cap) {
        const size_t cap = s->rows_cap ? 2 * s->rows_cap : PST_SPARSE_SLAB_ROWS;
        uint64_t *keys = realloc(s->row_key, cap * sizeof *keys);
        if (!keys)
            return PS_INDEX_EMPTY;
        s->row_key = keys;
        s->rows_cap = cap;
    }
    const uint32_t r = (uint32_t)s->rows++;
    float *row = row_at(t, s, r);
    init_values(t, key, row);
    memset(row + t->cfg.dim, 0, sizeof(float) * (t->row_floats - (size_t)t->cfg.dim));
    s->row_key[r] = key;
    s->created++;
    return r;
}

/* Removes the entry in slot i (its row, if it has one: the last row moves into its place;
 * a slab with no row left is freed), and returns 1 if it had a row. Counts nothing. */
static int remove_entry(pst_sparse_table *t, stripe *s, size_t i)
{
    const uint32_t r = s->index.slots[i].row;
    ps_index_remove(&s->index, i);
    if (r == PENDING) {
        s->pending--;
        return 0;
    }
    const uint32_t last = (uint32_t)(s->rows - 1);
    if (r != last) {
        const uint64_t moved = s->row_key[last];
        memcpy(row_at(t, s, r), row_at(t, s, last), sizeof(float) * t->row_floats);
        s->row_key[r] = moved;
        entry_of(s, moved)->row = r;
    }
    s->rows--;
    if (s->nslabs > 0 && s->rows <= (s->nslabs - 1) * PST_SPARSE_SLAB_ROWS) {
        free(s->slabs[--s->nslabs]);
        s->slabs[s->nslabs] = NULL;
    }
    return 1;
}

/* Evicts the entry in slot i (age, the row budget): removed, counted, and logged for the
 * next delta checkpoint. */
static void drop_entry(pst_sparse_table *t, stripe *s, size_t i)
{
    const uint64_t key = s->index.slots[i].key;
    s->evicted += (uint64_t)remove_entry(t, s, i);
    if (!t->log_removals)
        return;
    if (s->ngone == s->gone_cap) {
        const size_t cap = s->gone_cap ? 2 * s->gone_cap : 256;
        uint64_t *g = realloc(s->gone, cap * sizeof *g);
        if (!g) {
            s->gone_lost = 1;
            return;
        }
        s->gone = g;
        s->gone_cap = cap;
    }
    s->gone[s->ngone++] = key;
}

static inline int expired(const pst_sparse_table *t, const ps_index_entry *e, long step)
{
    return pst_sparse_expired(&t->cfg, e->last, step);
}

/* ---- the optimizers ------------------------------------------------------------------ */

/* One update of row values p (dim) and their state with gradient g at step. */
static void update_row(const pst_sparse_table *t, float *p, const float *g, long step)
{
    const pst_sparse_config *c = &t->cfg;
    const int dim = c->dim;
    const float neg_lr = (float)-c->lr, eps = (float)c->eps;
    switch (c->optim) {
    case PST_SPARSE_SGD:
        for (int j = 0; j < dim; j++)
            p[j] = fmaf(neg_lr, g[j], p[j]);
        break;
    case PST_SPARSE_ADAGRAD: {
        float *acc = p + dim;
        for (int j = 0; j < dim; j++) {
            acc[j] = acc[j] + g[j] * g[j];
            const float std = sqrtf(acc[j]) + eps;
            p[j] = fmaf(neg_lr, g[j] / std, p[j]);
        }
        break;
    }
    case PST_SPARSE_ADAM: {
        float *m = p + dim, *v = p + 2 * dim;
        const double t1 = (double)step + 1.0;
        const double bc1 = 1.0 - pow(c->beta1, t1), bc2 = 1.0 - pow(c->beta2, t1);
        const float neg_step = (float)(-(c->lr * sqrt(bc2) / bc1));
        const float omb1 = (float)(1.0 - c->beta1), omb2 = (float)(1.0 - c->beta2);
        for (int j = 0; j < dim; j++) {
            m[j] = m[j] + (g[j] - m[j]) * omb1;
            v[j] = v[j] + (g[j] * g[j] - v[j]) * omb2;
            p[j] = p[j] + neg_step * (m[j] / (sqrtf(v[j]) + eps));
        }
        break;
    }
    default:
        break;
    }
}

/* ---- the table ----------------------------------------------------------------------- */

pst_status pst_sparse_create(pst_sparse_table **out, const pst_sparse_config *cfg)
{
    *out = NULL;
    PST_TRY(pst_sparse_check(cfg));
    pst_sparse_table *t = calloc(1, sizeof *t);
    if (!t)
        return pst_error_set(PST_ERR_NOMEM, "sparse table %s: out of memory", cfg->name);
    t->cfg = *cfg;
    if (t->cfg.admit_count == 0)
        t->cfg.admit_count = 1;
    t->row_floats = (size_t)cfg->dim * (size_t)(1 + pst_sparse_state_floats(cfg->optim));
    t->share = cfg->max_rows / PST_SPARSE_STRIPES; /* never more than max_rows in all (max_rows
                                                    * is 0 or at least one per stripe) */
    for (int i = 0; i < PST_SPARSE_STRIPES; i++) {
        pthread_mutex_init(&t->st[i].mu, NULL);
        if (ps_index_reserve(&t->st[i].index) != 0) {
            pst_sparse_free(t);
            return pst_error_set(PST_ERR_NOMEM, "sparse table %s: out of memory", cfg->name);
        }
    }
    *out = t;
    return PST_OK;
}

void pst_sparse_free(pst_sparse_table *t)
{
    if (!t)
        return;
    for (int i = 0; i < PST_SPARSE_STRIPES; i++) {
        stripe *s = &t->st[i];
        for (size_t k = 0; k < s->nslabs; k++)
            free(s->slabs[k]);
        free(s->slabs);
        ps_index_free(&s->index);
        free(s->row_key);
        free(s->gone);
        pthread_mutex_destroy(&s->mu);
    }
    free(t);
}

const pst_sparse_config *pst_sparse_config_of(const pst_sparse_table *t)
{
    return &t->cfg;
}

static pst_status check_keys(const pst_sparse_table *t, const uint64_t *keys, size_t n,
                             const void *rows)
{
    if (n > 0 && (!keys || !rows))
        return pst_error_set(PST_ERR_INVALID, "sparse table %s: NULL keys or rows for %zu keys",
                             t->cfg.name, n);
    if (n > PST_SPARSE_MAX_KEYS)
        return pst_error_set(PST_ERR_INVALID, "sparse table %s: %zu keys in one call, at most "
                             "%u", t->cfg.name, n, PST_SPARSE_MAX_KEYS);
    return PST_OK;
}

pst_status pst_sparse_pull(pst_sparse_table *t, const uint64_t *keys, size_t n, long step,
                           float *rows)
{
    PST_TRY(check_keys(t, keys, n, rows));
    const size_t dim = (size_t)t->cfg.dim;
    for (size_t i = 0; i < n; i++) {
        const uint64_t h = pst_sparse_mix(keys[i]);
        stripe *s = &t->st[stripe_of(h)];
        pthread_mutex_lock(&s->mu);
        const ps_index_entry *e = &s->index.slots[ps_index_find(&s->index, keys[i], h)];
        if (e->row != PS_INDEX_EMPTY && e->row != PENDING && !expired(t, e, step))
            memcpy(rows + i * dim, row_at(t, s, e->row), sizeof(float) * dim);
        else
            init_values(t, keys[i], rows + i * dim);
        pthread_mutex_unlock(&s->mu);
    }
    return PST_OK;
}

typedef struct aged {
    long last;
    uint64_t key;
} aged;

static int older_first(const void *x, const void *y)
{
    const aged *a = x, *b = y;
    if (a->last != b->last)
        return a->last < b->last ? -1 : 1;
    return a->key < b->key ? -1 : a->key > b->key;
}

/* A stripe over its share drops its least recently pushed rows (ties: the smaller key
 * first) down to 7/8 of the share. */
static int trim_to_share(pst_sparse_table *t, stripe *s)
{
    const size_t keep = t->share - t->share / 8, n = s->rows;
    aged *a = malloc(n * sizeof *a);
    if (!a)
        return -1;
    for (size_t r = 0; r < n; r++) {
        const uint64_t k = s->row_key[r];
        a[r] = (aged){entry_of(s, k)->last, k};
    }
    qsort(a, n, sizeof *a, older_first);
    for (size_t r = 0; r + keep < n; r++)
        drop_entry(t, s, ps_index_find(&s->index, a[r].key, pst_sparse_mix(a[r].key)));
    free(a);
    return 0;
}

/* One key's push inside its stripe (locked). */
static pst_status push_one(pst_sparse_table *t, stripe *s, uint64_t key, uint64_t h,
                           const float *g, long step)
{
    ps_index *x = &s->index;
    size_t i = ps_index_find(x, key, h);
    if (x->slots[i].row != PS_INDEX_EMPTY && expired(t, &x->slots[i], step)) {
        drop_entry(t, s, i); /* absent now: counted from zero again */
        i = ps_index_find(x, key, h);
    }
    if (x->slots[i].row == PS_INDEX_EMPTY) {
        if (ps_index_reserve(x) != 0)
            return pst_error_set(PST_ERR_NOMEM, "sparse table %s: out of memory for the index "
                                 "of %zu keys", t->cfg.name, x->used + 1);
        ps_index_put(x, ps_index_find(x, key, h), (ps_index_entry){key, PENDING, 0, step});
        s->pending++;
        i = ps_index_find(x, key, h);
    }
    ps_index_entry *e = &x->slots[i];
    e->last = step;
    if (e->pushes < UINT32_MAX)
        e->pushes++;
    if (e->row == PENDING) {
        if (e->pushes < t->cfg.admit_count) {
            s->refused++;
            return PST_OK;
        }
        const uint32_t r = new_row(t, s, key);
        if (r == PS_INDEX_EMPTY)
            return pst_error_set(PST_ERR_NOMEM, "sparse table %s: out of memory for row %zu",
                                 t->cfg.name, s->rows + 1);
        e->row = r;
        s->pending--;
    }
    update_row(t, row_at(t, s, e->row), g, step);
    if (t->share && s->rows > t->share && trim_to_share(t, s) != 0)
        return pst_error_set(PST_ERR_NOMEM, "sparse table %s: out of memory trimming %zu rows",
                             t->cfg.name, s->rows);
    return PST_OK;
}

pst_status pst_sparse_push(pst_sparse_table *t, const uint64_t *keys, size_t n,
                           const float *grads, long step)
{
    PST_TRY(check_keys(t, keys, n, grads));
    if (step < 0)
        return pst_error_set(PST_ERR_INVALID, "sparse table %s: push at step %ld, want >= 0",
                             t->cfg.name, step);
    const size_t dim = (size_t)t->cfg.dim;
    for (size_t i = 0; i < n * dim; i++) /* all or nothing */
        if (!isfinite(grads[i]))
            return pst_error_set(PST_ERR_INVALID, "sparse table %s: the gradient of key %llu "
                                 "(row %zu of the push) holds %g at column %zu: nothing "
                                 "applied", t->cfg.name, (unsigned long long)keys[i / dim],
                                 i / dim, (double)grads[i], i % dim);
    for (size_t i = 0; i < n; i++) {
        const uint64_t h = pst_sparse_mix(keys[i]);
        stripe *s = &t->st[stripe_of(h)];
        pthread_mutex_lock(&s->mu);
        const pst_status st = push_one(t, s, keys[i], h, grads + i * dim, step);
        pthread_mutex_unlock(&s->mu);
        PST_TRY(st);
    }
    return PST_OK;
}

void pst_sparse_sweep(pst_sparse_table *t, long step)
{
    for (int k = 0; k < PST_SPARSE_STRIPES && t->cfg.evict_after > 0; k++) {
        stripe *s = &t->st[k];
        pthread_mutex_lock(&s->mu);
        for (size_t i = 0; i < s->index.cap;) {
            /* removing slot i may shift a later entry into it: look at i again */
            const ps_index_entry *e = &s->index.slots[i];
            if (e->row != PS_INDEX_EMPTY && expired(t, e, step))
                drop_entry(t, s, i);
            else
                i++;
        }
        pthread_mutex_unlock(&s->mu);
    }
}

void pst_sparse_stats_of(pst_sparse_table *t, pst_sparse_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int k = 0; k < PST_SPARSE_STRIPES; k++) {
        stripe *s = &t->st[k];
        pthread_mutex_lock(&s->mu);
        out->rows += s->rows;
        out->stripe_rows[k] = s->rows;
        out->pending += s->pending;
        out->bytes += s->nslabs * PST_SPARSE_SLAB_ROWS * t->row_floats * sizeof(float) +
                      s->index.cap * sizeof(ps_index_entry) + s->rows_cap * sizeof(uint64_t) +
                      s->slabs_cap * sizeof(float *);
        out->created += s->created;
        out->evicted += s->evicted;
        out->refused += s->refused;
        pthread_mutex_unlock(&s->mu);
    }
}

void pst_sparse_foreach(pst_sparse_table *t, pst_sparse_row_fn fn, void *arg)
{
    const size_t dim = (size_t)t->cfg.dim;
    for (int k = 0; k < PST_SPARSE_STRIPES; k++) {
        stripe *s = &t->st[k];
        pthread_mutex_lock(&s->mu);
        for (size_t r = 0; r < s->rows; r++) {
            const uint64_t key = s->row_key[r];
            const ps_index_entry *e = entry_of(s, key);
            const float *row = row_at(t, s, (uint32_t)r);
            fn(arg, key, row, row + dim, e->pushes, e->last);
        }
        pthread_mutex_unlock(&s->mu);
    }
}

typedef struct hash_arg {
    uint64_t sum;
    size_t dim, state;
} hash_arg;

static void hash_row(void *arg, uint64_t key, const float *values, const float *state,
                     uint32_t pushes, long last)
{
    hash_arg *h = arg;
    (void)pushes;
    (void)last;
    uint64_t x = pst_fnv1a(PST_FNV1A_INIT, &key, sizeof key);
    x = pst_fnv1a(x, values, sizeof(float) * h->dim);
    h->sum += pst_fnv1a(x, state, sizeof(float) * h->state);
}

uint64_t pst_sparse_hash(pst_sparse_table *t)
{
    hash_arg h = {0, (size_t)t->cfg.dim,
                  (size_t)t->cfg.dim * (size_t)pst_sparse_state_floats(t->cfg.optim)};
    pst_sparse_foreach(t, hash_row, &h);
    return h.sum;
}

/* ---- checkpoints --------------------------------------------------------------------- */

void pst_sparse_foreach_entry(pst_sparse_table *t, long since, pst_sparse_row_fn fn, void *arg)
{
    const size_t dim = (size_t)t->cfg.dim;
    for (int k = 0; k < PST_SPARSE_STRIPES; k++) {
        stripe *s = &t->st[k];
        pthread_mutex_lock(&s->mu);
        for (size_t i = 0; i < s->index.cap; i++) {
            const ps_index_entry *e = &s->index.slots[i];
            if (e->row == PS_INDEX_EMPTY || e->last < since)
                continue;
            const float *row = e->row == PENDING ? NULL : row_at(t, s, e->row);
            fn(arg, e->key, row, row ? row + dim : NULL, e->pushes, e->last);
        }
        pthread_mutex_unlock(&s->mu);
    }
}

void pst_sparse_log_removals(pst_sparse_table *t, int on)
{
    for (int k = 0; k < PST_SPARSE_STRIPES; k++)
        pthread_mutex_lock(&t->st[k].mu);
    t->log_removals = on != 0;
    for (int k = 0; k < PST_SPARSE_STRIPES; k++)
        pthread_mutex_unlock(&t->st[k].mu);
}

pst_status pst_sparse_take_removed(pst_sparse_table *t, uint64_t **keys, size_t *n)
{
    *keys = NULL;
    *n = 0;
    int lost = 0;
    for (int k = 0; k < PST_SPARSE_STRIPES; k++) {
        stripe *s = &t->st[k];
        pthread_mutex_lock(&s->mu);
        lost |= s->gone_lost;
        *n += s->ngone;
    }
    uint64_t *out = !lost ? malloc(sizeof(uint64_t) * (*n ? *n : 1)) : NULL;
    size_t at = 0;
    for (int k = 0; k < PST_SPARSE_STRIPES; k++) { /* the log starts again in any case */
        stripe *s = &t->st[k];
        if (out)
            memcpy(out + at, s->gone, sizeof(uint64_t) * s->ngone);
        at += s->ngone;
        s->ngone = 0;
        s->gone_lost = 0;
        pthread_mutex_unlock(&s->mu);
    }
    if (!out) {
        *n = 0;
        return pst_error_set(lost ? PST_ERR_STATE : PST_ERR_NOMEM, "sparse table %s: %s",
                             t->cfg.name, lost ? "a removed key is missing from the log (out of "
                             "memory when it was removed): write a full checkpoint"
                             : "out of memory for the removed keys");
    }
    *keys = out;
    return PST_OK;
}

pst_status pst_sparse_restore(pst_sparse_table *t, uint64_t key, const float *row,
                              uint32_t pushes, long last)
{
    const uint64_t h = pst_sparse_mix(key);
    stripe *s = &t->st[stripe_of(h)];
    pst_status st = PST_OK;
    pthread_mutex_lock(&s->mu);
    ps_index *x = &s->index;
    size_t i = ps_index_find(x, key, h);
    if (x->slots[i].row != PS_INDEX_EMPTY)
        remove_entry(t, s, i);
    uint32_t r = PENDING;
    if (ps_index_reserve(x) != 0) {
        st = pst_error_set(PST_ERR_NOMEM, "sparse table %s: out of memory restoring key %llu",
                           t->cfg.name, (unsigned long long)key);
    } else if (row && (r = new_row(t, s, key)) == PS_INDEX_EMPTY) {
        st = pst_error_set(PST_ERR_NOMEM, "sparse table %s: out of memory restoring key %llu",
                           t->cfg.name, (unsigned long long)key);
    } else {
        if (row) {
            s->created--; /* restored, not made: the counters come with the checkpoint */
            memcpy(row_at(t, s, r), row, sizeof(float) * t->row_floats);
        } else {
            s->pending++;
        }
        ps_index_put(x, ps_index_find(x, key, h), (ps_index_entry){key, r, pushes, last});
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

void pst_sparse_restore_remove(pst_sparse_table *t, uint64_t key)
{
    const uint64_t h = pst_sparse_mix(key);
    stripe *s = &t->st[stripe_of(h)];
    pthread_mutex_lock(&s->mu);
    const size_t i = ps_index_find(&s->index, key, h);
    if (s->index.slots[i].row != PS_INDEX_EMPTY)
        remove_entry(t, s, i);
    pthread_mutex_unlock(&s->mu);
}

void pst_sparse_set_counters(pst_sparse_table *t, uint64_t created, uint64_t evicted,
                             uint64_t refused)
{
    for (int k = 0; k < PST_SPARSE_STRIPES; k++) {
        stripe *s = &t->st[k];
        pthread_mutex_lock(&s->mu);
        s->created = k ? 0 : created;
        s->evicted = k ? 0 : evicted;
        s->refused = k ? 0 : refused;
        pthread_mutex_unlock(&s->mu);
    }
}

