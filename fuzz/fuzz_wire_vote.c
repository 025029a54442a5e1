/* fuzz_wire_vote.c — the Vote method's bodies (fp16 overflow votes): VoteRequest and
 * VoteReply. See fuzz/wire_fuzz.h. */
#include "fuzz/fuzz_util.h"
#include "fuzz/wire_fuzz.h"

static uint64_t use_request(const rpc_message *m)
{
    const Pstrain__VoteRequest *r = (const Pstrain__VoteRequest *)rpc_message_header(m);
    uint64_t h = FUZZ_HASH_INIT;
    h = fuzz_hash_u64(h, r->trainer_id);
    h = fuzz_hash_u64(h, (uint64_t)r->step);
    return fuzz_hash_u64(h, r->overflow);
}

static uint64_t use_reply(const rpc_message *m)
{
    const Pstrain__VoteReply *r = (const Pstrain__VoteReply *)rpc_message_header(m);
    return fuzz_hash_u64(fuzz_hash_u64(FUZZ_HASH_INIT, r->skip), (uint64_t)r->step);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_wire_run(rpc_method_request_desc(RPC_METHOD_VOTE), use_request, data, size);
    fuzz_wire_run(rpc_method_reply_desc(RPC_METHOD_VOTE), use_reply, data, size);
    return 0;
}
