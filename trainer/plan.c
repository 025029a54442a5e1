/* plan.c — the block plan (see plan.h). */
#include "trainer/plan.h"

#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/memory.h"
#include "common/runtime/device.h"
#include "common/config.h"

static int least_loaded(const size_t *load, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (load[i] < load[best])
            best = i;
    return best;
}

/* The plan's header and zeroed arrays for nb blocks; on failure the plan is zeroed. */
static pst_status plan_alloc(tr_plan *p, size_t nparams, size_t block_bytes, int npservers,
                             int ndevices, size_t nb)
{
    p->nparams = nparams;
    p->block_bytes = block_bytes;
    p->npservers = npservers;
    p->ndevices = ndevices;
    p->nblocks = (int)nb;
    p->blocks = calloc(nb, sizeof *p->blocks);
    p->pserver_elems = calloc((size_t)npservers, sizeof *p->pserver_elems);
    p->device_elems = calloc((size_t)ndevices, sizeof *p->device_elems);
    p->device_held = calloc((size_t)ndevices, sizeof *p->device_held);
    if (!p->blocks || !p->pserver_elems || !p->device_elems || !p->device_held) {
        tr_plan_free(p);
        return pst_error_set(PST_ERR_NOMEM, "block plan: out of memory for %zu blocks", nb);
    }
    return PST_OK;
}

pst_status tr_plan_build(tr_plan *p, size_t nparams, size_t block_bytes, int npservers,
                         int ndevices)
{
    memset(p, 0, sizeof *p);
    if (nparams == 0 || block_bytes < sizeof(float) || npservers < 1 || ndevices < 1)
        return pst_error_set(PST_ERR_INVALID,
                             "block plan: bad sizes (%zu params, %zu block bytes, %d pservers, "
                             "%d devices)", nparams, block_bytes, npservers, ndevices);
    size_t max_elems = block_bytes / sizeof(float);
    size_t nb = (nparams + max_elems - 1) / max_elems;
    size_t want = (size_t)npservers < nparams ? (size_t)npservers : nparams;
    if (nb < want)
        nb = want;
    /* Every pserver the same number of blocks: a link that carries one block more than the
     * others is the job's bottleneck (5 blocks on 4 pservers: one link carries twice the
     * bytes of the others). Equal blocks stay at most block_bytes: they only get smaller. */
    size_t whole = (nb + (size_t)npservers - 1) / (size_t)npservers * (size_t)npservers;
    if (whole <= nparams)
        nb = whole;
    if (nb > (size_t)INT32_MAX)
        return pst_error_set(PST_ERR_INVALID, "block plan: %zu blocks is too many; raise "
                             "PSTRAIN_BLOCK_BYTES (example: PSTRAIN_BLOCK_BYTES=4M)", nb);
    PST_TRY(plan_alloc(p, nparams, block_bytes, npservers, ndevices, nb));
    size_t base = nparams / nb, extra = nparams % nb, off = 0;
    for (size_t i = 0; i < nb; i++) {
        tr_block *b = &p->blocks[i];
        b->id = (uint32_t)i;
        b->offset = off;
        b->length = base + (i < extra ? 1 : 0);
        off += b->length;
        b->pserver = (int)(i % (size_t)npservers);
        p->pserver_elems[b->pserver] += b->length;
        b->owner_device = least_loaded(p->device_elems, ndevices);
        p->device_elems[b->owner_device] += b->length;
        b->holders = pst_devices_first(ndevices);
    }
    for (int d = 0; d < ndevices; d++)
        p->device_held[d] = nparams;
    return PST_OK;
}

/* The holder of `holders` with the fewest owned elements. */
static int least_loaded_of(const size_t *load, int n, uint64_t holders)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (((holders >> i) & 1u) && (best < 0 || load[i] < load[best]))
            best = i;
    return best;
}

pst_status tr_plan_build_segments(tr_plan *p, const tr_plan_segment *segs, int nsegs,
                                  size_t block_bytes, int npservers, int ndevices)
{
    memset(p, 0, sizeof *p);
    const uint64_t all = pst_devices_first(ndevices);
    size_t nparams = 0;
    for (int s = 0; s < nsegs; s++) {
        if (!segs || segs[s].length == 0 || !segs[s].holders || ndevices < 1 ||
            (segs[s].holders & ~all))
            return pst_error_set(PST_ERR_INVALID, "block plan: segment %d of %d has %zu "
                                 "elements and holders %#llx (%d devices)", s, nsegs,
                                 segs ? segs[s].length : 0,
                                 segs ? (unsigned long long)segs[s].holders : 0ull, ndevices);
        nparams += segs[s].length;
    }
    if (nsegs == 1 && segs[0].holders == all)
        return tr_plan_build(p, nparams, block_bytes, npservers, ndevices);
    if (nsegs < 1 || block_bytes < sizeof(float) || npservers < 1)
        return pst_error_set(PST_ERR_INVALID, "block plan: bad sizes (%d segments, %zu block "
                             "bytes, %d pservers)", nsegs, block_bytes, npservers);
    const size_t max_elems = block_bytes / sizeof(float);
    /* Blocks per segment; then, while some pserver would get none, one more block for the
     * segment whose blocks are longest. */
    size_t *per = calloc((size_t)nsegs, sizeof *per);
    if (!per)
        return pst_error_set(PST_ERR_NOMEM, "block plan: out of memory");
    size_t nb = 0;
    for (int s = 0; s < nsegs; s++)
        nb += per[s] = (segs[s].length + max_elems - 1) / max_elems;
    const size_t want = (size_t)npservers < nparams ? (size_t)npservers : nparams;
    while (nb < want) {
        int best = -1;
        for (int s = 0; s < nsegs; s++)
            if (per[s] < segs[s].length &&
                (best < 0 || segs[s].length * per[best] > segs[best].length * per[s]))
                best = s;
        per[best]++;
        nb++;
    }
    if (nb > (size_t)INT32_MAX) {
        free(per);
        return pst_error_set(PST_ERR_INVALID, "block plan: %zu blocks is too many; raise "
                             "PSTRAIN_BLOCK_BYTES (example: PSTRAIN_BLOCK_BYTES=4M)", nb);
    }
    const pst_status st = plan_alloc(p, nparams, block_bytes, npservers, ndevices, nb);
    if (st != PST_OK) {
        free(per);
        return st;
    }
    size_t i = 0, off = 0;
    for (int s = 0; s < nsegs; s++) {
        const size_t base = segs[s].length / per[s], extra = segs[s].length % per[s];
        for (size_t k = 0; k < per[s]; k++, i++) {
            tr_block *b = &p->blocks[i];
            b->id = (uint32_t)i;
            b->offset = off;
            b->length = base + (k < extra ? 1 : 0);
            off += b->length;
            b->pserver = least_loaded(p->pserver_elems, npservers);
            p->pserver_elems[b->pserver] += b->length;
            b->holders = segs[s].holders;
            b->owner_device = least_loaded_of(p->device_elems, ndevices, b->holders);
            p->device_elems[b->owner_device] += b->length;
            for (int d = 0; d < ndevices; d++)
                if ((b->holders >> d) & 1u)
                    p->device_held[d] += b->length;
        }
    }
    free(per);
    return PST_OK;
}

size_t tr_plan_pipelined_bytes(size_t nparams, size_t block_bytes, int npservers)
{
    if (npservers < 1 || nparams == 0)
        return block_bytes;
    const size_t rounds = (size_t)TR_PLAN_ROUNDS * (size_t)npservers;
    /* whole elements, so that the plan cuts exactly `rounds` blocks, not one more */
    size_t b = (nparams + rounds - 1) / rounds * sizeof(float);
    if (b < TR_PLAN_MIN_BLOCK)
        b = TR_PLAN_MIN_BLOCK;
    return b < block_bytes ? b : block_bytes;
}

int tr_plan_block_at(const tr_plan *p, size_t off)
{
    int lo = 0, hi = p->nblocks - 1; /* the blocks tile the buffer in order */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p->blocks[mid].offset <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void tr_plan_free(tr_plan *p)
{
    if (!p)
        return;
    PST_FREE_ALL(p->blocks, p->pserver_elems, p->device_elems, p->device_held);
    memset(p, 0, sizeof *p);
}

uint64_t tr_plan_fingerprint(const tr_plan *p, uint64_t h)
{
    uint64_t head[4] = {p->nparams, p->block_bytes, (uint64_t)p->npservers, (uint64_t)p->nblocks};
    h = pst_fnv1a(h ? h : PST_FNV1A_INIT, head, sizeof head);
    for (int i = 0; i < p->nblocks; i++) {
        uint64_t b[3] = {p->blocks[i].offset, p->blocks[i].length, (uint64_t)p->blocks[i].pserver};
        h = pst_fnv1a(h, b, sizeof b);
    }
    return h;
}

void tr_job_id(const tr_plan *p, const pst_config *c, char *out, size_t size)
{
    if (c->job_id[0]) {
        snprintf(out, size, "%s", c->job_id);
        return;
    }
    const int64_t more[3] = {(int64_t)c->seed, c->trainers, c->batch};
    snprintf(out, size, "job-%016llx",
             (unsigned long long)pst_fnv1a(tr_settings_fingerprint(p, c), more, sizeof more));
}

uint64_t tr_settings_fingerprint(const tr_plan *p, const pst_config *c)
{
    const pst_optim_config *o = &c->optim;
    uint64_t h = tr_plan_fingerprint(p, 0);
    int64_t ints[8] = {c->mode,         c->trainers,        o->kind,
                       o->schedule,     o->warmup_steps,    o->total_steps,
                       c->precision,    c->acc_steps};
    float floats[8] = {o->lr, o->momentum, o->beta1, o->beta2, o->eps, o->weight_decay, o->min_lr, 0};
    h = pst_fnv1a(h, ints, sizeof ints);
    return pst_fnv1a(h, floats, sizeof floats);
}
