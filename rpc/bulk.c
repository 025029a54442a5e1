/* bulk.c — see bulk.h. */
#include "rpc/bulk.h"

size_t rpc_bulk_args(grpc_arg *args)
{
    static const struct {
        const char *key;
        int value;
    } a[RPC_BULK_ARGS] = {
        {GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 1 << 20},
        {GRPC_ARG_TCP_READ_CHUNK_SIZE, 4 << 20},
    };
    for (size_t i = 0; i < RPC_BULK_ARGS; i++) {
        args[i].type = GRPC_ARG_INTEGER;
        args[i].key = (char *)a[i].key;
        args[i].value.integer = a[i].value;
    }
    return RPC_BULK_ARGS;
}
