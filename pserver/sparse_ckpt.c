/* sparse_ckpt.c — a sparse table's full and delta checkpoints, and its export (see
 * sparse_ckpt.h). */
#include "pserver/sparse_ckpt.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/log.h"
#include "common/memory.h"

#define TAG(a, b, c, d) ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
enum {
    SEC_HEAD = TAG('S', 'P', 'H', 'D'),
    SEC_KEYS = TAG('S', 'P', 'K', 'Y'),
    SEC_PUSHES = TAG('S', 'P', 'P', 'U'),
    SEC_LAST = TAG('S', 'P', 'L', 'A'),
    SEC_HAS_ROW = TAG('S', 'P', 'H', 'R'),
    SEC_ROWS = TAG('S', 'P', 'R', 'W'),
    SEC_TOMBS = TAG('S', 'P', 'T', 'B'),
};

typedef struct head {
    uint32_t format, delta;
    int64_t step, base;          /* base: the step of the checkpoint a delta follows */
    uint64_t created, evicted, refused;
    uint64_t entries, tombs;
    uint32_t dim, state_floats, optim, admit_count;
    int64_t evict_after;         /* the table's: a resume must keep them (the same bits), */
    uint64_t max_rows;           /* and an export of the file alone knows what expired */
    char name[PST_SPARSE_NAME_MAX];
} head;

/* ---- writing ---------------------------------------------------------------------------- */

typedef struct collect {
    uint64_t *keys;
    uint32_t *pushes;
    int64_t *last;
    unsigned char *has_row;
    float *rows;
    size_t n, nrows, cap, row_floats, dim;
    int nomem;
} collect;

static void collect_entry(void *arg, uint64_t key, const float *values, const float *state,
                          uint32_t pushes, long last)
{
    collect *c = arg;
    if (c->nomem)
        return;
    if (c->n == c->cap) {
        const size_t cap = c->cap ? 2 * c->cap : 1024;
        uint64_t *k = realloc(c->keys, cap * sizeof *k);
        if (k)
            c->keys = k;
        uint32_t *p = realloc(c->pushes, cap * sizeof *p);
        if (p)
            c->pushes = p;
        int64_t *l = realloc(c->last, cap * sizeof *l);
        if (l)
            c->last = l;
        unsigned char *h = realloc(c->has_row, cap);
        if (h)
            c->has_row = h;
        float *r = realloc(c->rows, cap * c->row_floats * sizeof *r);
        if (r)
            c->rows = r;
        if (!k || !p || !l || !h || !r) {
            c->nomem = 1;
            return;
        }
        c->cap = cap;
    }
    c->keys[c->n] = key;
    c->pushes[c->n] = pushes;
    c->last[c->n] = last;
    c->has_row[c->n] = values != NULL;
    if (values) { /* values then state, end to end as the table keeps them */
        float *row = c->rows + c->nrows * c->row_floats;
        memcpy(row, values, sizeof(float) * c->dim);
        memcpy(row + c->dim, state, sizeof(float) * (c->row_floats - c->dim));
        c->nrows++;
    }
    c->n++;
}

static void collect_free(collect *c)
{
    PST_FREE_ALL(c->keys, c->pushes, c->last, c->has_row, c->rows);
}

static pst_status write_file(const char *dir, const head *h, const collect *c,
                             const uint64_t *tombs)
{
    pst_ckpt_writer w;
    pst_status st = pst_ckpt_begin(&w, dir, (long)h->step);
    if (st == PST_OK)
        st = pst_ckpt_section(&w, SEC_HEAD, h, sizeof *h);
    if (st == PST_OK)
        st = pst_ckpt_section(&w, SEC_KEYS, c->keys, sizeof(uint64_t) * c->n);
    if (st == PST_OK)
        st = pst_ckpt_section(&w, SEC_PUSHES, c->pushes, sizeof(uint32_t) * c->n);
    if (st == PST_OK)
        st = pst_ckpt_section(&w, SEC_LAST, c->last, sizeof(int64_t) * c->n);
    if (st == PST_OK)
        st = pst_ckpt_section(&w, SEC_HAS_ROW, c->has_row, c->n);
    if (st == PST_OK)
        st = pst_ckpt_section(&w, SEC_ROWS, c->rows, sizeof(float) * c->nrows * c->row_floats);
    if (st == PST_OK)
        st = pst_ckpt_section(&w, SEC_TOMBS, tombs, sizeof(uint64_t) * h->tombs);
    if (st == PST_OK)
        return pst_ckpt_commit(&w);
    pst_ckpt_abort(&w);
    return st;
}

void pst_sparse_ckpt_init(pst_sparse_ckpt *w, pst_sparse_table *t, const char *dir, int keep,
                          long resumed_at)
{
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->keep = keep > 0 ? keep : 1;
    w->last = resumed_at;
    /* after a resume the chain's full is not known here: the next file is a full one */
    w->deltas = PST_SPARSE_CKPT_FULL_EVERY;
    w->full = -1;
    pst_sparse_log_removals(t, 1);
}

/* Removes the files older than the full checkpoint that the oldest kept one needs. */
static pst_status prune(const pst_sparse_ckpt *w)
{
    long steps[4096];
    const int n = pst_ckpt_list(w->dir, steps, 4096);
    if (n <= w->keep || w->full < 0 || steps[w->keep - 1] < w->full)
        return PST_OK; /* every kept checkpoint's chain starts before the full we know */
    for (int i = 0; i < n; i++) {
        if (steps[i] >= w->full)
            continue;
        char path[4300];
        snprintf(path, sizeof path, "%s/step-%012ld.ckpt", w->dir, steps[i]);
        if (unlink(path) != 0 && errno != ENOENT)
            return pst_error_set(PST_ERR_IO, "checkpoint %s: cannot remove: %s", path,
                                 strerror(errno));
    }
    return PST_OK;
}

pst_status pst_sparse_ckpt_save(pst_sparse_ckpt *w, pst_sparse_table *t, long step)
{
    const pst_sparse_config *cfg = pst_sparse_config_of(t);
    uint64_t *tombs = NULL;
    size_t ntombs = 0;
    /* the log runs in any case: taken now, it starts again for the next delta */
    const pst_status logged = pst_sparse_take_removed(t, &tombs, &ntombs);
    const int delta = w->last >= 0 && w->deltas < PST_SPARSE_CKPT_FULL_EVERY - 1 &&
                      logged == PST_OK;
    collect c = {.dim = (size_t)cfg->dim,
                 .row_floats = (size_t)cfg->dim * (size_t)(1 + pst_sparse_state_floats(cfg->optim))};
    pst_sparse_foreach_entry(t, delta ? w->last : LONG_MIN, collect_entry, &c);
    pst_sparse_stats s;
    pst_sparse_stats_of(t, &s);
    head h = {.format = 1, .delta = (uint32_t)delta, .step = step, .base = delta ? w->last : -1,
              .created = s.created, .evicted = s.evicted, .refused = s.refused,
              .entries = c.n, .tombs = delta ? ntombs : 0, .dim = (uint32_t)cfg->dim,
              .state_floats = (uint32_t)pst_sparse_state_floats(cfg->optim),
              .optim = (uint32_t)cfg->optim, .admit_count = cfg->admit_count,
              .evict_after = cfg->evict_after, .max_rows = cfg->max_rows};
    snprintf(h.name, sizeof h.name, "%s", cfg->name);
    pst_status st = c.nomem ? pst_error_set(PST_ERR_NOMEM, "checkpoint of sparse table %s: out "
                                            "of memory for %zu entries", cfg->name, c.n)
                            : write_file(w->dir, &h, &c, tombs);
    collect_free(&c);
    free(tombs);
    if (st != PST_OK) {
        w->deltas = PST_SPARSE_CKPT_FULL_EVERY; /* the next one is full */
        return st;
    }
    w->last = step;
    if (delta) {
        w->deltas++;
    } else {
        w->deltas = 0;
        w->full = step;
    }
    if (prune(w) != PST_OK) /* the checkpoint is whole: an old file left is no failure */
        PST_WARN("%s", pst_error_detail());
    return PST_OK;
}

pst_status pst_sparse_step_done(pst_sparse_table *t, pst_sparse_ckpt *w, long every, long step)
{
    if (pst_sparse_config_of(t)->evict_after > 0 &&
        step % PST_SPARSE_SWEEP_EVERY == PST_SPARSE_SWEEP_EVERY - 1)
        pst_sparse_sweep(t, step);
    if (w && every > 0 && (step + 1) % every == 0)
        return pst_sparse_ckpt_save(w, t, step + 1);
    return PST_OK;
}

/* ---- reading ---------------------------------------------------------------------------- */

/* Reads dir's file of `step` and its header (copied out: sections are unaligned). */
static pst_status read_file(pst_ckpt *c, head *h, const char *dir, long step)
{
    PST_TRY(pst_ckpt_read(c, dir, step));
    uint64_t bytes = 0;
    const void *p = pst_ckpt_find(c, SEC_HEAD, &bytes);
    if (!p || bytes != sizeof *h) {
        pst_ckpt_free(c);
        return pst_error_set(PST_ERR_FORMAT, "checkpoint %s/step-%012ld.ckpt: no sparse table "
                             "header", dir, step);
    }
    memcpy(h, p, sizeof *h);
    h->name[sizeof h->name - 1] = 0;
    /* counts no larger than the file: the sizes made from them below cannot wrap */
    if (h->format != 1 || h->step != step || (h->delta && (h->base < 0 || h->base >= step)) ||
        h->entries > c->size / 8 || h->tombs > c->size / 8 || h->dim > PST_SPARSE_MAX_DIM ||
        h->state_floats > 2) {
        pst_ckpt_free(c);
        return pst_error_set(PST_ERR_FORMAT, "checkpoint %s/step-%012ld.ckpt: format %u, step "
                             "%lld, base %lld, %llu entries, %llu tombstones, dim %u: not a "
                             "sparse table checkpoint of this step", dir, step, h->format,
                             (long long)h->step, (long long)h->base,
                             (unsigned long long)h->entries, (unsigned long long)h->tombs,
                             h->dim);
    }
    return PST_OK;
}

/* A section of exactly `bytes` bytes (NULL when it has none). */
static pst_status section(const pst_ckpt *c, const char *dir, uint32_t tag, uint64_t bytes,
                          const void **out)
{
    uint64_t got = 0;
    *out = pst_ckpt_find(c, tag, &got);
    if ((!*out && bytes) || got != bytes)
        return pst_error_set(PST_ERR_FORMAT, "checkpoint %s/step-%012ld.ckpt: a section of %llu "
                             "bytes where its header says %llu", dir, c->step,
                             (unsigned long long)got, (unsigned long long)bytes);
    return PST_OK;
}

/* Applies one file: tombstones, then entries; then the counters. */
static pst_status apply(const pst_ckpt *c, const head *h, const char *dir, pst_sparse_table *t)
{
    const pst_sparse_config *cfg = pst_sparse_config_of(t);
    const size_t row_floats = (size_t)h->dim * (1 + (size_t)h->state_floats);
    if (strcmp(h->name, cfg->name) || h->dim != (uint32_t)cfg->dim ||
        h->optim != (uint32_t)cfg->optim ||
        h->state_floats != (uint32_t)pst_sparse_state_floats(cfg->optim))
        return pst_error_set(PST_ERR_MISMATCH, "checkpoint %s/step-%012ld.ckpt: table %s of dim "
                             "%u, optimizer %u; this job's is %s of dim %d, %s", dir, c->step,
                             h->name, h->dim, h->optim, cfg->name, cfg->dim,
                             pst_sparse_optim_name(cfg->optim));
    if (h->admit_count != cfg->admit_count || h->evict_after != cfg->evict_after ||
        h->max_rows != cfg->max_rows)
        return pst_error_set(PST_ERR_MISMATCH, "checkpoint %s/step-%012ld.ckpt: admission after "
                             "%u, eviction after %lld, at most %llu rows; this job's are %u, "
                             "%ld, %zu: resume with the --sparse-* flags it was written with",
                             dir, c->step, h->admit_count, (long long)h->evict_after,
                             (unsigned long long)h->max_rows, cfg->admit_count,
                             cfg->evict_after, cfg->max_rows);
    const uint64_t n = h->entries;
    const void *keys, *pushes, *last, *has_row, *tombs, *rows;
    PST_TRY(section(c, dir, SEC_KEYS, n * sizeof(uint64_t), &keys));
    PST_TRY(section(c, dir, SEC_PUSHES, n * sizeof(uint32_t), &pushes));
    PST_TRY(section(c, dir, SEC_LAST, n * sizeof(int64_t), &last));
    PST_TRY(section(c, dir, SEC_HAS_ROW, n, &has_row));
    PST_TRY(section(c, dir, SEC_TOMBS, h->tombs * sizeof(uint64_t), &tombs));
    uint64_t nrows = 0;
    for (uint64_t i = 0; i < n; i++)
        nrows += ((const unsigned char *)has_row)[i] != 0;
    PST_TRY(section(c, dir, SEC_ROWS, nrows * row_floats * sizeof(float), &rows));
    for (uint64_t i = 0; i < h->tombs; i++) {
        uint64_t k;
        memcpy(&k, (const char *)tombs + i * sizeof k, sizeof k);
        pst_sparse_restore_remove(t, k);
    }
    float *row = malloc(sizeof(float) * row_floats);
    if (!row)
        return pst_error_set(PST_ERR_NOMEM, "checkpoint: out of memory");
    pst_status st = PST_OK;
    for (uint64_t i = 0, r = 0; st == PST_OK && i < n; i++) {
        uint64_t k;
        uint32_t p;
        int64_t l;
        memcpy(&k, (const char *)keys + i * sizeof k, sizeof k);
        memcpy(&p, (const char *)pushes + i * sizeof p, sizeof p);
        memcpy(&l, (const char *)last + i * sizeof l, sizeof l);
        const int has = ((const unsigned char *)has_row)[i] != 0;
        if (has)
            memcpy(row, (const char *)rows + (r++) * row_floats * sizeof(float),
                   sizeof(float) * row_floats);
        st = pst_sparse_restore(t, k, has ? row : NULL, p, (long)l);
    }
    free(row);
    if (st == PST_OK)
        pst_sparse_set_counters(t, h->created, h->evicted, h->refused);
    return st;
}

#define MAX_CHAIN 1024 /* files in one chain at most (a full one every 8 when we write) */

/* The chain of `step`: chain[0] = step, each next the base of the one before, the last a
 * full file; *n of them. Reads each file (its checksums too). */
static pst_status chain_of(const char *dir, long step, long *chain, int *n)
{
    *n = 0;
    for (long s = step;;) {
        if (*n == MAX_CHAIN)
            return pst_error_set(PST_ERR_FORMAT, "checkpoint %s/step-%012ld.ckpt: a chain of "
                                 "more than %d files", dir, step, MAX_CHAIN);
        pst_ckpt c;
        head h;
        PST_TRY(read_file(&c, &h, dir, s));
        pst_ckpt_free(&c);
        chain[(*n)++] = s;
        if (!h.delta)
            return PST_OK;
        s = (long)h.base;
    }
}

pst_status pst_sparse_ckpt_load(const char *dir, long step, pst_sparse_table *t)
{
    long chain[MAX_CHAIN];
    int n = 0;
    PST_TRY(chain_of(dir, step, chain, &n));
    /* the full file, then each delta on the one before it (other files in dir, left by an
     * earlier run, are not of this chain) */
    for (int i = n - 1; i >= 0; i--) {
        pst_ckpt c;
        head h;
        PST_TRY(read_file(&c, &h, dir, chain[i]));
        pst_status st = PST_OK;
        if ((i == n - 1) == (h.delta != 0) || (h.delta && h.base != chain[i + 1]))
            st = pst_error_set(PST_ERR_FORMAT, "checkpoint %s/step-%012ld.ckpt: changed while "
                               "its chain was read", dir, chain[i]);
        if (st == PST_OK)
            st = apply(&c, &h, dir, t);
        pst_ckpt_free(&c);
        PST_TRY(st);
    }
    return PST_OK;
}

pst_status pst_sparse_ckpt_open(const char *dir, long step, pst_sparse_table **out)
{
    *out = NULL;
    pst_ckpt c;
    head h;
    PST_TRY(read_file(&c, &h, dir, step));
    pst_ckpt_free(&c);
    pst_sparse_config cfg;
    pst_sparse_defaults(&cfg);
    snprintf(cfg.name, sizeof cfg.name, "%s", h.name);
    cfg.dim = (int)h.dim;
    cfg.optim = (pst_sparse_optim)h.optim;
    cfg.admit_count = h.admit_count;
    cfg.evict_after = (long)h.evict_after;
    cfg.max_rows = (size_t)h.max_rows;
    pst_status st = pst_sparse_check(&cfg);
    if (st == PST_OK)
        st = pst_sparse_create(out, &cfg);
    if (st == PST_OK && (st = pst_sparse_ckpt_load(dir, step, *out)) != PST_OK) {
        pst_sparse_free(*out);
        *out = NULL;
    }
    return st == PST_OK ? st : pst_error_wrap(st, "%s/step-%012ld.ckpt", dir, step);
}

int pst_sparse_ckpt_steps(const char *dir, long *steps, int max)
{
    long all[4096];
    const int n = pst_ckpt_list(dir, all, 4096);
    int k = 0;
    for (int i = 0; i < n && k < max; i++) {
        long chain[MAX_CHAIN];
        int len;
        if (chain_of(dir, all[i], chain, &len) == PST_OK)
            steps[k++] = all[i];
    }
    return k;
}

/* ---- export ----------------------------------------------------------------------------- */

typedef struct record {
    uint64_t key;
    size_t at; /* its row in the collect's rows */
} record;

static int by_key(const void *a, const void *b)
{
    const record *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

pst_status pst_sparse_export(pst_sparse_table *t, long step, const char *path, size_t *count)
{
    *count = 0;
    const pst_sparse_config *cfg = pst_sparse_config_of(t);
    collect c = {.dim = (size_t)cfg->dim,
                 .row_floats = (size_t)cfg->dim * (size_t)(1 + pst_sparse_state_floats(cfg->optim))};
    pst_sparse_foreach_entry(t, LONG_MIN, collect_entry, &c);
    record *recs = c.nomem ? NULL : malloc(sizeof *recs * (c.nrows ? c.nrows : 1));
    if (!recs) {
        collect_free(&c);
        return pst_error_set(PST_ERR_NOMEM, "export of sparse table %s: out of memory",
                             cfg->name);
    }
    size_t k = 0;
    for (size_t i = 0, r = 0; i < c.n; i++) {
        if (!c.has_row[i])
            continue;
        if (!pst_sparse_expired(cfg, (long)c.last[i], step))
            recs[k++] = (record){c.keys[i], r};
        r++;
    }
    qsort(recs, k, sizeof *recs, by_key);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    pst_status st = PST_OK;
    if (!f) {
        st = pst_error_set(PST_ERR_IO, "export %s: cannot create %s: %s", path, tmp,
                           strerror(errno));
    } else {
        const uint32_t dim = (uint32_t)cfg->dim, zero = 0;
        const uint64_t records = k;
        int ok = fwrite("PSTEMB01", 1, 8, f) == 8 && fwrite(&dim, 4, 1, f) == 1 &&
                 fwrite(&zero, 4, 1, f) == 1 && fwrite(&records, 8, 1, f) == 1;
        for (size_t i = 0; ok && i < k; i++)
            ok = fwrite(&recs[i].key, 8, 1, f) == 1 &&
                 fwrite(c.rows + recs[i].at * c.row_floats, sizeof(float), c.dim, f) == c.dim;
        const int e = errno;
        if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
            st = pst_error_set(PST_ERR_IO, "export %s: cannot write it: %s", path,
                               strerror(ok ? errno : e));
            unlink(tmp);
        } else {
            *count = k;
        }
    }
    free(recs);
    collect_free(&c);
    return st;
}
