/* fuzz_wire_watch.c — the Watch method's bodies (liveness): WatchRequest and the empty
 * WatchReply. See fuzz/wire_fuzz.h. */
#include "fuzz/fuzz_util.h"
#include "fuzz/wire_fuzz.h"

static uint64_t use_request(const rpc_message *m)
{
    const Pstrain__WatchRequest *r = (const Pstrain__WatchRequest *)rpc_message_header(m);
    return fuzz_hash_u64(FUZZ_HASH_INIT, r->trainer_id);
}

static uint64_t use_reply(const rpc_message *m)
{
    return fuzz_hash_u64(FUZZ_HASH_INIT, rpc_message_payload(m)->bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_wire_run(rpc_method_request_desc(RPC_METHOD_WATCH), use_request, data, size);
    fuzz_wire_run(rpc_method_reply_desc(RPC_METHOD_WATCH), use_reply, data, size);
    return 0;
}
