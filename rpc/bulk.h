/* bulk.h — the gRPC channel arguments for moving tensor payloads, shared by the client's
 * channels and the server (private to rpc/).
 *
 * Measured on the synthetic step (1 pserver + 2 trainers on 127.0.0.1, 25M f32
 * parameters, payloads in the calls; docs/benchmarks.md): reads of at least 1 MiB and up
 * to 4 MiB a recvmsg (gRPC starts at 8 KiB and grows its reads slowly) took the CPU time
 * of a step from about 425 to 375-405 ms and the step from 226-234 to 208-212 ms. A larger
 * HTTP/2 frame (4 MiB instead of 16 KiB) and write buffer gave nothing measurable on top;
 * BDP probing stays on (its windows kept the lab's 1 Gbit/s links full, and turning it
 * off with a fixed 8 MiB window made the step slower). */
#ifndef PST_RPC_BULK_H
#define PST_RPC_BULK_H

#include <stddef.h>

#include <grpc/grpc.h>

/* The most arguments rpc_bulk_args writes. */
#define RPC_BULK_ARGS 2

/* Writes the bulk-transfer arguments into args[0..RPC_BULK_ARGS) and returns how many. */
size_t rpc_bulk_args(grpc_arg *args);

#endif /* PST_RPC_BULK_H */
