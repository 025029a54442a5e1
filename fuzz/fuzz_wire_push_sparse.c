/* fuzz_wire_push_sparse.c — the PushSparse method's bodies: PushSparseRequest with its
 * payload (count u64 keys, then count rows of dtype, read as the pserver's tables read
 * them) and PushSparseReply. The rows' width is the table's, not in the request: the bytes
 * after the keys are read as the whole rows they make (a table of that dim). See
 * fuzz/wire_fuzz.h. */
#include "fuzz/fuzz_util.h"
#include "fuzz/wire_fuzz.h"

static uint64_t use_request(const rpc_message *m)
{
    const Pstrain__PushSparseRequest *r =
        (const Pstrain__PushSparseRequest *)rpc_message_header(m);
    const rpc_payload *p = rpc_message_payload(m);
    uint64_t h = FUZZ_HASH_INIT;
    h = fuzz_hash_u64(h, r->trainer_id);
    h = fuzz_hash_u64(h, r->table);
    h = fuzz_hash_u64(h, (uint64_t)r->step);
    h = fuzz_hash_u64(h, r->count);
    pst_dtype dt;
    const pst_status st = rpc_dtype_from_wire(r->dtype, &dt);
    h = fuzz_hash_u64(h, (uint64_t)st);
    size_t rest = 0;
    h = fuzz_wire_keys(h, p, r->count, &rest);
    if (r->count > p->bytes / sizeof(uint64_t))
        return h; /* the keys alone are more than the payload */
    /* Whole rows of a known dtype (none without keys: then the bytes after them must be
     * none); an unknown dtype must be refused by the payload check on its own. */
    uint64_t elems = 0;
    if (st == PST_OK && r->count > 0) {
        elems = rest / pst_dtype_size(dt);
        elems -= elems % r->count;
        h = fuzz_hash_u64(h, elems / r->count); /* the dim these rows make */
    }
    return fuzz_wire_payload_after(h, p, (size_t)r->count * sizeof(uint64_t), (int)r->dtype,
                                   elems);
}

static uint64_t use_reply(const rpc_message *m)
{
    const Pstrain__PushSparseReply *r = (const Pstrain__PushSparseReply *)rpc_message_header(m);
    return fuzz_hash_u64(FUZZ_HASH_INIT, r->duplicate);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_wire_run(rpc_method_request_desc(RPC_METHOD_PUSH_SPARSE), use_request, data, size);
    fuzz_wire_run(rpc_method_reply_desc(RPC_METHOD_PUSH_SPARSE), use_reply, data, size);
    return 0;
}
