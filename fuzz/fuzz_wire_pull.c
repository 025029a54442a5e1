/* fuzz_wire_pull.c — the Pull method's bodies: PullRequest and PullReply with the block's
 * values as payload (length elements of dtype, read raw and as f32 as the trainer reads
 * them). See fuzz/wire_fuzz.h. */
#include "fuzz/fuzz_util.h"
#include "fuzz/wire_fuzz.h"

static uint64_t use_request(const rpc_message *m)
{
    const Pstrain__PullRequest *r = (const Pstrain__PullRequest *)rpc_message_header(m);
    uint64_t h = FUZZ_HASH_INIT;
    h = fuzz_hash_u64(h, r->block);
    h = fuzz_hash_u64(h, (uint64_t)r->version);
    pst_dtype dt;
    return fuzz_hash_u64(h, (uint64_t)rpc_dtype_from_wire(r->dtype, &dt));
}

static uint64_t use_reply(const rpc_message *m)
{
    const Pstrain__PullReply *r = (const Pstrain__PullReply *)rpc_message_header(m);
    uint64_t h = FUZZ_HASH_INIT;
    h = fuzz_hash_u64(h, r->block);
    h = fuzz_hash_u64(h, (uint64_t)r->version);
    h = fuzz_hash_u64(h, r->held_us);
    pst_dtype dt;
    h = fuzz_hash_u64(h, (uint64_t)rpc_dtype_from_wire(r->dtype, &dt));
    return fuzz_wire_payload(h, rpc_message_payload(m), (int)r->dtype, r->length);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_wire_run(rpc_method_request_desc(RPC_METHOD_PULL), use_request, data, size);
    fuzz_wire_run(rpc_method_reply_desc(RPC_METHOD_PULL), use_reply, data, size);
    return 0;
}
