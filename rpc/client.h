/* client.h — the trainer side of the pserver service: asynchronous unary calls to N
 * pservers over gRPC C core.
 *
 * One rpc_client holds one channel per pserver address and a completion queue drained by
 * its own threads. rpc_client_call_async() sends a request header and a payload lent from
 * the caller's memory (no copy) and later runs a done callback with the reply header and
 * the reply payload still in the received slices, so the callback copies it once, straight
 * into its destination (rpc_payload_read / rpc_payload_read_f32 cast to f32 on the way).
 *
 * Every attempt has a deadline (call_timeout_ms). A call that fails UNAVAILABLE (no
 * connection, server restarting or shutting down) is retried with exponential backoff
 * (50 ms doubling to 1 s) until connect_timeout_ms has passed since its first such
 * failure; then it fails PST_ERR_UNAVAILABLE with a detail naming the server and how long
 * it tried. Retried methods must be idempotent on the server (Push reports duplicates).
 *
 * Not for: what to send (trainer/), server side (rpc/server.h), framing (rpc/wire.h).
 * Requires rpc_global_init() (rpc/global.h) before rpc_client_init(). */
#ifndef PST_RPC_CLIENT_H
#define PST_RPC_CLIENT_H

#include <stddef.h>

#include "common/error.h"
#include "rpc/wire.h"

typedef struct rpc_client rpc_client;

/* Runs exactly once per accepted call, on a client thread (or, for calls cut short by
 * rpc_client_free, on the freeing thread). st == PST_OK: `reply` is the method's reply
 * header (cast it, e.g. (const Pstrain__PullReply *)) and `payload` its payload; both are
 * owned by the library and valid only during the callback. st != PST_OK: reply and payload
 * are NULL and `detail` says what failed, naming the server ("" never; valid during the
 * callback). It must not block for long (it holds a client thread) and must not call the
 * blocking rpc_client_call() or rpc_client_free(); starting new async calls is fine. */
typedef void (*rpc_done_fn)(void *arg, pst_status st, const char *detail,
                            const ProtobufCMessage *reply, const rpc_payload *payload);

typedef struct rpc_client_config {
    const char *const *servers; /* num_servers "host:port" addresses; copied */
    int num_servers;
    int call_timeout_ms;    /* deadline of each attempt; 0 -> 60000 */
    int connect_timeout_ms; /* how long UNAVAILABLE is retried; 0 -> 30000, < 0: never */
    int keepalive_ms;       /* > 0: ping each server that long idle; no answer within as
                             * long closes the connection (its calls fail UNAVAILABLE) */
    int threads;            /* threads running done callbacks; 0 -> 2 */
    const struct rpc_transport *transport; /* TLS (rpc/transport.h); NULL: insecure */
    const char *token;      /* non-empty: sent with every call ("authorization: Bearer
                             * TOKEN" metadata; copied) */
    const char *const *names; /* optional, num_servers: what each server is, before its
                               * address in error details ("trainer 2's relay"); NULL, or a
                               * NULL entry: "pserver" */
} rpc_client_config;

/* Creates the client and its channels; connecting happens lazily, on the first call.
 * Errors: PST_ERR_INVALID (no servers, an address that is not host:port, bad numbers),
 * PST_ERR_NOMEM. *out is NULL on failure. Blocking: no. */
pst_status rpc_client_init(rpc_client **out, const rpc_client_config *cfg);

/* Server `server` is known to be gone (its Watch ended, say): the calls to it in flight
 * are cancelled, and they and every later one fail UNAVAILABLE with `why` (copied; the
 * first one given stands) instead of being retried; those waiting for a retry end within
 * one backoff (at most 1 s). Thread safe, also from a done callback. */
void rpc_client_give_up(rpc_client *cl, int server, const char *why);

int rpc_client_num_servers(const rpc_client *cl);
/* The address of server i as configured; owned by the client. */
const char *rpc_client_server(const rpc_client *cl, int i);

/* Starts a call of `method` on server `server` with the request header `request` (its
 * descriptor must be the method's request type; packed before return, the caller keeps
 * it) and `bytes` bytes of payload.
 * Ownership of the payload: lent without copy. It stays alive and unchanged until
 * release(arg) runs — exactly once, on any thread, when gRPC holds no reference anymore
 * (usually right after done; gRPC may keep the buffer a little longer, e.g. while a
 * cancelled stream is torn down). It also runs before
 * this function returns when bytes == 0 or when the call is not accepted. release == NULL
 * means the memory outlives the client.
 * On PST_OK, done(arg, ...) runs exactly once later. On failure, done never runs.
 * Errors: PST_ERR_INVALID (server index, method, request type), PST_ERR_STATE (client
 * being freed), PST_ERR_NOMEM, PST_ERR_INTERNAL (gRPC refused the batch).
 * Thread safe; never blocks on the network. */
pst_status rpc_client_call_async(rpc_client *cl, int server, rpc_method method,
                                 const ProtobufCMessage *request, const void *payload,
                                 size_t bytes, rpc_release_fn release, rpc_done_fn done,
                                 void *arg);

/* Blocking convenience: the same call, waits for the reply and for gRPC to release the
 * payload (so the caller may reuse it at once). On PST_OK *reply is the reply message
 * (rpc_message_header / rpc_message_payload; free with rpc_message_free); on failure
 * *reply is NULL and pst_error_detail() on this thread holds the detail.
 * Errors: those of rpc_client_call_async and of the call (the server's status exactly,
 * PST_ERR_TIMEOUT, PST_ERR_UNAVAILABLE, PST_ERR_FORMAT for an undecodable reply).
 * Thread safe; must not be called from a done callback. Blocks up to the deadline (plus
 * the retry time). */
pst_status rpc_client_call(rpc_client *cl, int server, rpc_method method,
                           const ProtobufCMessage *request, const void *payload, size_t bytes,
                           rpc_message **reply);

/* Cancels every outstanding call (their done callbacks run with PST_ERR_STATE "client
 * shutting down", calls waiting for a retry on the calling thread), waits until every
 * callback has returned, then joins the threads and closes the channels. Payload
 * releases may run during this call. Accepts NULL. Not from a done callback. */
void rpc_client_free(rpc_client *cl);

#endif /* PST_RPC_CLIENT_H */
