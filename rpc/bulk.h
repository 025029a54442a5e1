/* bulk.h — the gRPC channel arguments for moving tensor payloads, shared by the client's
 * channels and the server, and the way both write integer arguments (private to rpc/).
 *
 * Reads of at least 1 MiB and up to 4 MiB a recvmsg: gRPC starts at 8 KiB and grows its
 * reads slowly, and on the synthetic step (1 pserver + 2 trainers on 127.0.0.1, 25M f32,
 * payloads in the calls; AMD EPYC, 2 vCPUs, OPENBLAS_CORETYPE unset) the larger reads took
 * 5-10% of the step's CPU in development. Larger HTTP/2 frames and write buffers gave
 * nothing measurable; BDP probing stays on. docs/scaling.md says how that was measured. */
#ifndef PST_RPC_BULK_H
#define PST_RPC_BULK_H

#include <stddef.h>

#include <grpc/grpc.h>

/* One integer channel argument, as the tables of client.c, server.c and bulk.c list them. */
typedef struct rpc_int_arg {
    const char *key;
    int value;
} rpc_int_arg;

/* Writes the n integer arguments in[] into args[0..n) and returns n. */
size_t rpc_int_args(grpc_arg *args, const rpc_int_arg *in, size_t n);

/* The most arguments rpc_bulk_args writes. */
#define RPC_BULK_ARGS 2

/* Writes the bulk-transfer arguments into args[0..RPC_BULK_ARGS) and returns how many. */
size_t rpc_bulk_args(grpc_arg *args);

#endif /* PST_RPC_BULK_H */
