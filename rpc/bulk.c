/* bulk.c — see bulk.h. */
#include "rpc/bulk.h"

size_t rpc_int_args(grpc_arg *args, const rpc_int_arg *in, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        args[i].type = GRPC_ARG_INTEGER;
        args[i].key = (char *)in[i].key;
        args[i].value.integer = in[i].value;
    }
    return n;
}

size_t rpc_bulk_args(grpc_arg *args)
{
    static const rpc_int_arg a[RPC_BULK_ARGS] = {
        {GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 1 << 20},
        {GRPC_ARG_TCP_READ_CHUNK_SIZE, 4 << 20},
    };
    return rpc_int_args(args, a, RPC_BULK_ARGS);
}
