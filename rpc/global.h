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
 * lines to common/log.h at debug level (process-wide), and switches off Abseil's debugging
 * deadlock detector, which Debian's Abseil (built without NDEBUG) runs on every lock gRPC
 * takes. Thread safe. Cannot fail (gRPC aborts the process itself when it cannot
 * initialize). */
void rpc_global_init(void);

/* 1 once rpc_global_init found Abseil's switch and turned the detector off; 0 where this
 * Abseil has no such switch under a known name (nothing was changed). */
int rpc_global_deadlock_detector_off(void);

/* Undoes one rpc_global_init(); the last one shuts gRPC down, which requires every
 * rpc_server and rpc_client to be freed already. Extra calls are ignored. Thread safe. */
void rpc_global_shutdown(void);

#endif /* PST_RPC_GLOBAL_H */
