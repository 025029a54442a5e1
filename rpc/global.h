/* global.h — process-wide set-up of the gRPC library for rpc/.
 *
 * gRPC C core needs grpc_init() before any other call and grpc_shutdown() after the last
 * object is destroyed. pserver and trainer mains call rpc_global_init() once at start and
 * rpc_global_shutdown() once at exit; nested pairs (tests, libraries) are counted.
 *
 * Fork: gRPC must not be initialized in a process that later forks and uses gRPC in the
 * child; fork first, then call rpc_global_init() in each process. */
#ifndef PST_RPC_GLOBAL_H
#define PST_RPC_GLOBAL_H

/* Initializes gRPC on the first call; later calls only count. Also routes gRPC's own log
 * lines to common/log.h at debug level (process-wide). Thread safe. Cannot fail (gRPC
 * aborts the process itself when it cannot initialize). */
void rpc_global_init(void);

/* Undoes one rpc_global_init(); the last one shuts gRPC down, which requires every
 * rpc_server and rpc_client to be freed already. Extra calls are ignored. Thread safe. */
void rpc_global_shutdown(void);

#endif /* PST_RPC_GLOBAL_H */
