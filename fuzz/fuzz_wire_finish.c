/* fuzz_wire_finish.c — the Finish method's bodies: FinishRequest (its reason string) and
 * FinishReply (the pserver's sparse tables: rows, bytes, counters, hash). See
 * fuzz/wire_fuzz.h. */
#include "fuzz/fuzz_util.h"
#include "fuzz/wire_fuzz.h"

static uint64_t use_request(const rpc_message *m)
{
    const Pstrain__FinishRequest *r = (const Pstrain__FinishRequest *)rpc_message_header(m);
    uint64_t h = FUZZ_HASH_INIT;
    h = fuzz_hash_u64(h, r->trainer_id);
    h = fuzz_hash_u64(h, r->early);
    h = fuzz_hash_u64(h, (uint64_t)r->step);
    h = fuzz_hash_u64(h, (uint64_t)r->checkpoint_step);
    h = fuzz_hash_str(h, r->reason);
    return fuzz_hash_u64(h, rpc_message_payload(m)->bytes);
}

static uint64_t use_reply(const rpc_message *m)
{
    const Pstrain__FinishReply *r = (const Pstrain__FinishReply *)rpc_message_header(m);
    uint64_t h = FUZZ_HASH_INIT;
    h = fuzz_hash_u64(h, r->sparse_rows);
    h = fuzz_hash_u64(h, r->sparse_bytes);
    h = fuzz_hash_u64(h, r->rows_created);
    h = fuzz_hash_u64(h, r->rows_evicted);
    h = fuzz_hash_u64(h, r->pushes_refused);
    h = fuzz_hash_u64(h, r->sparse_hash);
    return fuzz_hash_u64(h, rpc_message_payload(m)->bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_wire_run(rpc_method_request_desc(RPC_METHOD_FINISH), use_request, data, size);
    fuzz_wire_run(rpc_method_reply_desc(RPC_METHOD_FINISH), use_reply, data, size);
    return 0;
}
