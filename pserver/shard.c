/* shard.c — a pserver's checkpoint shard (see shard.h). */
#include "pserver/shard.h"

#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/log.h"

enum { SEC_META = 1, SEC_SPECS = 2, SEC_VALUES = 3, SEC_STATE = 4, SEC_VERSIONS = 5,
       SEC_LAST_STEPS = 6 };

typedef struct shard_meta {
    uint64_t fingerprint;
    uint64_t total;
    uint32_t nblocks;
    uint32_t nstate;
    int64_t version;
} shard_meta;

typedef struct shard_spec {
    uint64_t id, offset, length;
} shard_spec;

pst_status ps_shard_save(const char *dir, int64_t version, const ps_shard_layout *lay,
                         const float *values, const float *state, const ps_shard_async *as,
                         int keep)
{
    shard_meta meta = {lay->fingerprint, lay->total, (uint32_t)lay->nblocks,
                       (uint32_t)lay->nstate, version};
    shard_spec *specs = malloc(sizeof *specs * (size_t)(lay->nblocks ? lay->nblocks : 1));
    if (!specs)
        return pst_error_set(PST_ERR_NOMEM, "checkpoint: out of memory");
    for (int i = 0; i < lay->nblocks; i++)
        specs[i] = (shard_spec){lay->specs[i].id, lay->specs[i].offset, lay->specs[i].length};
    pst_ckpt_writer w;
    pst_status st = pst_ckpt_begin(&w, dir, (long)version);
    if (st == PST_OK)
        st = pst_ckpt_section(&w, SEC_META, &meta, sizeof meta);
    if (st == PST_OK)
        st = pst_ckpt_section(&w, SEC_SPECS, specs, sizeof *specs * (size_t)lay->nblocks);
    if (st == PST_OK)
        st = pst_ckpt_section(&w, SEC_VALUES, values, sizeof(float) * lay->total);
    if (st == PST_OK && lay->nstate)
        st = pst_ckpt_section(&w, SEC_STATE, state,
                              sizeof(float) * (size_t)lay->nstate * lay->total);
    if (st == PST_OK && as)
        st = pst_ckpt_section(&w, SEC_VERSIONS, as->versions,
                              sizeof(int64_t) * (size_t)lay->nblocks);
    if (st == PST_OK && as)
        st = pst_ckpt_section(&w, SEC_LAST_STEPS, as->last_steps,
                              sizeof(int64_t) * (size_t)as->ntrainers * (size_t)lay->nblocks);
    if (st == PST_OK)
        st = pst_ckpt_commit(&w);
    else
        pst_ckpt_abort(&w);
    free(specs);
    if (st == PST_OK && keep > 0)
        st = pst_ckpt_prune(dir, keep);
    return st;
}

/* Checks c against lay; on success copies its values and state. */
static pst_status load(const pst_ckpt *c, const char *dir, const ps_shard_layout *lay,
                       float *values, float *state, ps_shard_async *as)
{
    uint64_t bytes;
    /* Sections have no alignment in the file (checkpoint.h): the structs are copied out. */
    shard_meta m;
    const void *mp = pst_ckpt_find(c, SEC_META, &bytes);
    if (!mp || bytes != sizeof m)
        return pst_error_set(PST_ERR_FORMAT, "checkpoint %s/step-%012ld.ckpt: no shard header",
                             dir, c->step);
    memcpy(&m, mp, sizeof m);
    const shard_meta *meta = &m;
    if (meta->fingerprint != lay->fingerprint)
        return pst_error_set(PST_ERR_MISMATCH, "checkpoint %s/step-%012ld.ckpt: from another "
                             "plan (fingerprint %016llx, this job %016llx)", dir, c->step,
                             (unsigned long long)meta->fingerprint,
                             (unsigned long long)lay->fingerprint);
    if (meta->total != lay->total || meta->nblocks != (uint32_t)lay->nblocks ||
        meta->nstate != (uint32_t)lay->nstate || meta->version != c->step)
        return pst_error_set(PST_ERR_MISMATCH, "checkpoint %s/step-%012ld.ckpt: %u blocks of %llu "
                             "values with %u state floats each, this pserver has %d of %llu "
                             "with %d", dir, c->step, meta->nblocks,
                             (unsigned long long)meta->total, meta->nstate, lay->nblocks,
                             (unsigned long long)lay->total, lay->nstate);
    const unsigned char *specs = pst_ckpt_find(c, SEC_SPECS, &bytes);
    if (!specs || bytes != sizeof(shard_spec) * (size_t)lay->nblocks)
        return pst_error_set(PST_ERR_FORMAT, "checkpoint %s/step-%012ld.ckpt: no block list",
                             dir, c->step);
    for (int i = 0; i < lay->nblocks; i++) {
        shard_spec sp;
        memcpy(&sp, specs + sizeof sp * (size_t)i, sizeof sp);
        if (sp.id != lay->specs[i].id || sp.offset != lay->specs[i].offset ||
            sp.length != lay->specs[i].length)
            return pst_error_set(PST_ERR_MISMATCH, "checkpoint %s/step-%012ld.ckpt: block %d "
                                 "is %llu at %llu+%llu, this pserver's %u at %llu+%llu", dir,
                                 c->step, i, (unsigned long long)sp.id,
                                 (unsigned long long)sp.offset, (unsigned long long)sp.length,
                                 lay->specs[i].id, (unsigned long long)lay->specs[i].offset,
                                 (unsigned long long)lay->specs[i].length);
    }
    const void *v = pst_ckpt_find(c, SEC_VALUES, &bytes);
    if (!v || bytes != sizeof(float) * lay->total)
        return pst_error_set(PST_ERR_FORMAT, "checkpoint %s/step-%012ld.ckpt: no values", dir,
                             c->step);
    const void *s = lay->nstate ? pst_ckpt_find(c, SEC_STATE, &bytes) : NULL;
    if (lay->nstate && (!s || bytes != sizeof(float) * (size_t)lay->nstate * lay->total))
        return pst_error_set(PST_ERR_FORMAT, "checkpoint %s/step-%012ld.ckpt: no optimizer "
                             "state", dir, c->step);
    uint64_t vbytes = 0, lbytes = 0;
    const void *vs = as ? pst_ckpt_find(c, SEC_VERSIONS, &vbytes) : NULL;
    const void *ls = as ? pst_ckpt_find(c, SEC_LAST_STEPS, &lbytes) : NULL;
    if (as && (!vs || vbytes != sizeof(int64_t) * (size_t)lay->nblocks || !ls ||
               lbytes != sizeof(int64_t) * (size_t)as->ntrainers * (size_t)lay->nblocks))
        return pst_error_set(PST_ERR_MISMATCH, "checkpoint %s/step-%012ld.ckpt: not an async "
                             "shard of %d trainers", dir, c->step, as->ntrainers);
    memcpy(values, v, sizeof(float) * lay->total);
    if (s)
        memcpy(state, s, sizeof(float) * (size_t)lay->nstate * lay->total);
    if (as) {
        memcpy(as->versions, vs, vbytes);
        memcpy(as->last_steps, ls, lbytes);
    }
    return PST_OK;
}

int64_t ps_shard_pick(const char *dir, const int64_t *candidates, int n,
                      const ps_shard_layout *lay, float *values, float *state,
                      ps_shard_async *as)
{
    int64_t *order = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!order)
        return -1;
    memcpy(order, candidates, sizeof(int64_t) * (size_t)n);
    for (int i = 1; i < n; i++) /* newest first */
        for (int j = i; j > 0 && order[j] > order[j - 1]; j--) {
            int64_t t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    int64_t got = -1;
    for (int i = 0; i < n && got < 0; i++) {
        pst_ckpt c;
        pst_status st = pst_ckpt_read(&c, dir, (long)order[i]);
        if (st == PST_OK)
            st = load(&c, dir, lay, values, state, as);
        pst_ckpt_free(&c);
        if (st == PST_OK)
            got = order[i];
        else
            PST_WARN("%s; trying an older one", pst_error_detail());
    }
    free(order);
    return got;
}

int64_t ps_shard_pick_newest(const char *dir, const ps_shard_layout *lay, float *values,
                             float *state, ps_shard_async *as)
{
    long steps[64];
    int64_t candidates[64];
    const int n = pst_ckpt_list(dir, steps, 64);
    for (int i = 0; i < n; i++)
        candidates[i] = steps[i];
    return n ? ps_shard_pick(dir, candidates, n, lay, values, state, as) : -1;
}
