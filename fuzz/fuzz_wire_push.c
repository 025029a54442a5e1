/* fuzz_wire_push.c — the Push method's bodies: PushRequest with its gradient payload
 * (length elements of dtype, read as f32 as the pserver's store reads it) and PushReply.
 * See fuzz/wire_fuzz.h. */
#include "fuzz/fuzz_util.h"
#include "fuzz/wire_fuzz.h"

static uint64_t use_request(const rpc_message *m)
{
    const Pstrain__PushRequest *r = (const Pstrain__PushRequest *)rpc_message_header(m);
    uint64_t h = FUZZ_HASH_INIT;
    h = fuzz_hash_u64(h, r->trainer_id);
    h = fuzz_hash_u64(h, (uint64_t)r->step);
    h = fuzz_hash_u64(h, r->block);
    h = fuzz_hash(h, &r->scale, sizeof r->scale);
    pst_dtype dt;
    const pst_status st = rpc_dtype_from_wire(r->dtype, &dt);
    h = fuzz_hash_u64(h, (uint64_t)st);
    /* The pserver checks the dtype first; the payload check must refuse one on its own. */
    return fuzz_wire_payload(h, rpc_message_payload(m), (int)r->dtype, r->length);
}

static uint64_t use_reply(const rpc_message *m)
{
    const Pstrain__PushReply *r = (const Pstrain__PushReply *)rpc_message_header(m);
    return fuzz_hash_u64(FUZZ_HASH_INIT, r->duplicate);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_wire_run(rpc_method_request_desc(RPC_METHOD_PUSH), use_request, data, size);
    fuzz_wire_run(rpc_method_reply_desc(RPC_METHOD_PUSH), use_reply, data, size);
    return 0;
}
