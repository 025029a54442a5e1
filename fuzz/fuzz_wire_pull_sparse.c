/* fuzz_wire_pull_sparse.c — the PullSparse method's bodies: PullSparseRequest with its keys
 * (count u64, read as the pserver's tables read them) and PullSparseReply with the rows
 * (count rows of dim elements of dtype, read raw and as f32 as the trainer reads them).
 * See fuzz/wire_fuzz.h. */
#include "fuzz/fuzz_util.h"
#include "fuzz/wire_fuzz.h"

static uint64_t use_request(const rpc_message *m)
{
    const Pstrain__PullSparseRequest *r =
        (const Pstrain__PullSparseRequest *)rpc_message_header(m);
    uint64_t h = FUZZ_HASH_INIT;
    h = fuzz_hash_u64(h, r->trainer_id);
    h = fuzz_hash_u64(h, r->table);
    h = fuzz_hash_u64(h, (uint64_t)r->step);
    h = fuzz_hash_u64(h, r->count);
    pst_dtype dt;
    h = fuzz_hash_u64(h, (uint64_t)rpc_dtype_from_wire(r->dtype, &dt));
    /* The pserver wants exactly the keys; what follows them is hashed, as its count. */
    return fuzz_wire_keys(h, rpc_message_payload(m), r->count, NULL);
}

static uint64_t use_reply(const rpc_message *m)
{
    const Pstrain__PullSparseReply *r = (const Pstrain__PullSparseReply *)rpc_message_header(m);
    uint64_t h = FUZZ_HASH_INIT;
    h = fuzz_hash_u64(h, r->table);
    h = fuzz_hash_u64(h, (uint64_t)r->version);
    h = fuzz_hash_u64(h, r->count);
    h = fuzz_hash_u64(h, r->dim);
    pst_dtype dt;
    h = fuzz_hash_u64(h, (uint64_t)rpc_dtype_from_wire(r->dtype, &dt));
    /* The trainer checks count and dim against its own before it reads count * dim
     * elements; a product past 2^64 is no payload's. */
    if (r->dim != 0 && r->count > UINT64_MAX / r->dim)
        return fuzz_hash_u64(h, (uint64_t)PST_ERR_FORMAT);
    return fuzz_wire_payload(h, rpc_message_payload(m), (int)r->dtype, r->count * r->dim);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_wire_run(rpc_method_request_desc(RPC_METHOD_PULL_SPARSE), use_request, data, size);
    fuzz_wire_run(rpc_method_reply_desc(RPC_METHOD_PULL_SPARSE), use_reply, data, size);
    return 0;
}
