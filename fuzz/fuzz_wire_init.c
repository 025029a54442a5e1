/* fuzz_wire_init.c — the Init method's bodies: InitRequest (its block list, optimizer
 * settings, sparse table specs and the f32 initial values of trainer 0's payload, read as
 * the pserver reads them) and InitReply. See fuzz/wire_fuzz.h. */
#include "fuzz/fuzz_util.h"
#include "fuzz/wire_fuzz.h"

static uint64_t use_request(const rpc_message *m)
{
    const Pstrain__InitRequest *r = (const Pstrain__InitRequest *)rpc_message_header(m);
    uint64_t h = FUZZ_HASH_INIT, total = 0;
    h = fuzz_hash_u64(h, r->trainer_id);
    h = fuzz_hash_u64(h, r->num_trainers);
    h = fuzz_hash_u64(h, (uint64_t)r->mode);
    h = fuzz_hash_u64(h, r->total_params);
    h = fuzz_hash_u64(h, r->fingerprint);
    h = fuzz_hash_u64(h, (uint64_t)r->checkpoint_every);
    pst_dtype dt;
    h = fuzz_hash_u64(h, (uint64_t)rpc_dtype_from_wire(r->precision, &dt));
    int sane = 1; /* every length in 1..2^32, as the pserver requires before summing */
    for (size_t i = 0; i < r->n_blocks; i++) {
        const Pstrain__BlockSpec *b = r->blocks[i];
        h = fuzz_hash_u64(h, b->id);
        h = fuzz_hash_u64(h, b->offset);
        h = fuzz_hash_u64(h, b->length);
        sane &= b->length >= 1 && b->length <= (1ull << 32);
        total += b->length;
    }
    for (size_t i = 0; i < r->n_resume_steps; i++)
        h = fuzz_hash_u64(h, (uint64_t)r->resume_steps[i]);
    if (r->optim) {
        const Pstrain__OptimConfig *o = r->optim;
        h = fuzz_hash_str(h, o->kind);
        h = fuzz_hash_str(h, o->schedule);
        const float f[] = {o->lr, o->momentum, o->beta1, o->beta2, o->eps, o->weight_decay,
                           o->min_lr};
        h = fuzz_hash(h, f, sizeof f);
        h = fuzz_hash_u64(h, (uint64_t)o->warmup_steps);
        h = fuzz_hash_u64(h, (uint64_t)o->total_steps);
    }
    for (size_t i = 0; i < r->n_sparse_tables; i++) {
        const Pstrain__SparseTableSpec *t = r->sparse_tables[i];
        h = fuzz_hash_str(h, t->name);
        h = fuzz_hash_u64(h, t->dim);
        h = fuzz_hash_str(h, t->optim);
        const double d[] = {t->lr, t->eps, t->beta1, t->beta2};
        h = fuzz_hash(h, d, sizeof d);
        h = fuzz_hash(h, &t->init_std, sizeof t->init_std);
        h = fuzz_hash_u64(h, t->seed);
        h = fuzz_hash_u64(h, t->admit_count);
        h = fuzz_hash_u64(h, (uint64_t)t->evict_after);
        h = fuzz_hash_u64(h, t->max_rows);
    }
    h = fuzz_hash_u64(h, r->sparse_shard);
    h = fuzz_hash_u64(h, r->sparse_shards);
    if (sane && r->n_blocks <= (1u << 20))
        h = fuzz_wire_payload(h, rpc_message_payload(m), PSTRAIN__DTYPE__F32, total);
    return h;
}

static uint64_t use_reply(const rpc_message *m)
{
    const Pstrain__InitReply *r = (const Pstrain__InitReply *)rpc_message_header(m);
    return fuzz_hash_u64(FUZZ_HASH_INIT, (uint64_t)r->version);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_wire_run(rpc_method_request_desc(RPC_METHOD_INIT), use_request, data, size);
    fuzz_wire_run(rpc_method_reply_desc(RPC_METHOD_INIT), use_reply, data, size);
    return 0;
}
