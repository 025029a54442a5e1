/* tsan.h — the ordering gRPC gives that ThreadSanitizer cannot see (private to rpc/).
 *
 * gRPC C core is Debian's, not built with TSan, so the happens-before its completion queue
 * gives (a tag handed in with a batch on one thread comes out of grpc_completion_queue_next
 * on another, after everything gRPC did for it) is made of accesses TSan never sees, and
 * every handover would read as a race. RPC_TSAN_RELEASE(tag) just before a tag goes to
 * gRPC and RPC_TSAN_ACQUIRE(tag) when the queue hands it back state that edge. Outside a
 * TSan build they are nothing. tests/tsan/grpc.supp keeps TSan's interceptors out of
 * gRPC's, gpr's and abseil's own calls (their memory accesses are not instrumented either);
 * our code around them stays checked. */
#ifndef PST_RPC_TSAN_H
#define PST_RPC_TSAN_H

#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define RPC_TSAN_RELEASE(p) __tsan_release((void *)(p))
#define RPC_TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#else
#define RPC_TSAN_RELEASE(p) ((void)0)
#define RPC_TSAN_ACQUIRE(p) ((void)0)
#endif

#endif /* PST_RPC_TSAN_H */
