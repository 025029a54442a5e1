/* server.h — the gRPC server side of the pserver service (/pstrain.PServer/{Init,Push,
 * Pull,Finish}).
 *
 * An rpc_server listens on one "host:port", decodes each request (rpc/wire.h framing) and
 * hands it to one handler callback as an rpc_call. The handler answers it with
 * rpc_call_reply() or rpc_call_fail(), either at once or LATER from any thread: a Pull is
 * answered only when the requested version exists, so deferred replies are the normal
 * case, not an exception. Calls to any other method are answered UNIMPLEMENTED at once;
 * a request whose framing or header does not decode is answered INVALID_ARGUMENT with the
 * detail and never reaches the handler.
 *
 * Not for: what the methods mean (pserver/), the client side (rpc/client.h).
 *
 * Requires rpc_global_init() (rpc/global.h) before rpc_server_init(). */
#ifndef PST_RPC_SERVER_H
#define PST_RPC_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "rpc/wire.h"

typedef struct rpc_server rpc_server;

/* The largest body of a request without payload (Pull, Finish, Vote): larger ones are
 * refused INVALID_ARGUMENT before they are decoded. Compressed requests are refused. */
#define RPC_SMALL_REQUEST_MAX 65536
typedef struct rpc_call rpc_call;

/* Receives every decoded request, on one of the server's threads. It must not block for
 * long (it holds a server thread); it completes `call` exactly once, now or later, with
 * rpc_call_reply() or rpc_call_fail(). Until the handler returns, `call` stays readable
 * (rpc_call_cancelled, rpc_call_set_owner) even when it was completed meanwhile, by the
 * handler itself or on another thread: a handler that queues a call where another thread
 * may answer it at once can still mark it as its own afterwards. */
typedef void (*rpc_handler_fn)(void *arg, rpc_call *call);

/* Optional: told, on one of the server's threads, that a call the owner has not completed
 * yet was cancelled by its client (it went away, or its deadline passed), so the owner can
 * release what it holds for it at once instead of when it would have answered. The owner
 * still completes the call (rpc_call_fail) unless it is completing it on another thread;
 * the call stays valid during the callback. Called at most once per call. */
typedef void (*rpc_cancel_fn)(void *arg, rpc_call *call);

typedef struct rpc_server_config {
    const char *bind;      /* "host:port"; port 0 picks a free port (rpc_server_port) */
    int threads;           /* completion-queue threads running handlers; 0 -> 2 */
    rpc_handler_fn handler;
    void *handler_arg;
    rpc_cancel_fn on_cancel;  /* optional; gets handler_arg */
    int keepalive_ms;      /* > 0: ping every client connection that long idle and close it
                            * (cancelling its calls) when no answer comes within as long */
    const struct rpc_transport *transport; /* TLS (rpc/transport.h); NULL: insecure */
    /* Limits, each refused with RESOURCE_EXHAUSTED (or DEADLINE_EXCEEDED) and a message
     * naming it; 0: none. */
    int max_calls;         /* calls alive at once (arrived, not yet answered and sent) */
    long long max_message; /* the largest request body gRPC receives at all (bytes; above
                            * INT_MAX: gRPC's own limit) */
    int max_wait_ms;       /* a call unanswered this long is ended DEADLINE_EXCEEDED, as if
                            * its client had gone (on_cancel runs); Watch calls excepted */
    /* The largest request body of method m the handler accepts (bytes; 0: no limit but the
     * header-only methods' RPC_SMALL_REQUEST_MAX); asked for every call before its body is
     * decoded. May be NULL. */
    size_t (*max_request)(void *arg, rpc_method m, const char **why);
    const char *token;     /* non-empty: every call must carry it (rpc_client_config.token);
                            * others are answered UNAUTHENTICATED before their body is
                            * decoded (copied) */
    /* Each trainer's own token, by trainer id (NULL: none for that id): when any is set,
     * every call must carry one of them instead of `token`, and that id is the call's
     * identity (rpc_call_identity). */
    const char *const *trainer_tokens;
    int ntrainer_tokens;
} rpc_server_config;

/* Creates the server, binds cfg->bind, starts serving. *out is NULL on failure.
 * Errors: PST_ERR_INVALID (no handler, bad thread count), PST_ERR_IO (cannot listen on the
 * address: in use or not an address), PST_ERR_NOMEM. Blocking: no. */
pst_status rpc_server_init(rpc_server **out, const rpc_server_config *cfg);

/* The bound port (useful after binding port 0). Thread safe. */
int rpc_server_port(const rpc_server *s);

/* Stops serving: no new calls are accepted, then waits until every call already received
 * is completed and its reply sent, and joins the threads.
 * fail_pending == 0: calls still waiting for the owner (deferred replies) must be
 *   completed by the owner from other threads; this blocks until they are.
 * fail_pending != 0: every call not completed yet is failed at once with
 *   PST_ERR_UNAVAILABLE "server shutting down"; calls still in transfer are cancelled if
 *   they do not finish within a few seconds. The owner may still call rpc_call_reply/fail
 *   on the calls it holds (they return PST_ERR_STATE and release the payload) until
 *   rpc_server_free().
 * Idempotent; must not be called from a handler. Thread safe against handlers and
 * rpc_call_* on other threads. */
void rpc_server_shutdown(rpc_server *s, int fail_pending);

/* Shuts down (failing pending calls) if not done yet and frees everything, including the
 * rpc_call objects the owner never completed; every rpc_call pointer is invalid after
 * this. Accepts NULL. */
void rpc_server_free(rpc_server *s);

/* ---- the call ------------------------------------------------------------------------ */

/* Accessors, valid until the call is completed (and, after a server-side failure at
 * shutdown, until rpc_server_free). Thread safe. */
rpc_method rpc_call_method(const rpc_call *c);
/* The request header; cast to the method's request type (Pstrain__PushRequest, ...). */
const ProtobufCMessage *rpc_call_request(const rpc_call *c);
/* The request payload (read it with rpc_payload_read / rpc_payload_read_f32). */
const rpc_payload *rpc_call_payload(const rpc_call *c);
/* Moves the request payload out of the call, to outlive it (rpc_message_keep_payload):
 * rpc_call_payload reads 0 bytes from then on. Only the thread handling the call. */
rpc_kept_payload *rpc_call_keep_payload(rpc_call *c);
/* The trainer the call comes from, as its credentials say: the id of the trainer token it
 * carries (rpc_server_config.trainer_tokens), else the "trainer-<id>" its mutual-TLS client
 * certificate names (a subject alternative name, else the common name); -1 when neither
 * binds it to one. *by (optional) gets which ("its token", "its client certificate"). A call
 * whose token and certificate name two trainers is refused PERMISSION_DENIED before the
 * handler sees it. */
int rpc_call_identity(const rpc_call *c, const char **by);
/* 1 once the client went away or its deadline passed (the reply would be dropped), else
 * 0. A deferred call that is cancelled still needs to be completed by the owner. */
int rpc_call_cancelled(const rpc_call *c);
/* Milliseconds left until the client's deadline (0 once it has passed), or -1 when the
 * call has none. Lets an owner that parks a call answer it, with its own reason, before the
 * client gives up on it. */
int64_t rpc_call_deadline_left_ms(const rpc_call *c);
/* A pointer of the owner's kept with the call (for on_cancel); NULL until set. */
void rpc_call_set_owner(rpc_call *c, void *owner);
void *rpc_call_owner(const rpc_call *c);
/* The peer's address ("ipv4:127.0.0.1:41234"); owned by the call. */
const char *rpc_call_peer(const rpc_call *c);

/* Completes the call with status OK, the reply header (its descriptor must be the
 * method's reply type) and an optional payload lent without copy.
 * Ownership: `reply` is packed before return (the caller keeps it). The payload follows
 * rpc_wire_encode's contract: it stays alive and unchanged until release(arg) runs —
 * exactly once, on any thread, also when this function fails; release NULL means the
 * memory outlives the server.
 * After this call `c` is invalid (completion hands it back to the server), except to the
 * handler that got it, until it returns (rpc_handler_fn).
 * Errors: PST_ERR_INVALID (reply of the wrong type or unpackable — the call is failed with
 * INTERNAL instead), PST_ERR_STATE (the server already failed the call at shutdown). A
 * client that went away is not an error: the reply is dropped.
 * Thread safe: any thread, including the handler itself. Blocking: no. */
pst_status rpc_call_reply(rpc_call *c, const ProtobufCMessage *reply, const void *payload,
                          size_t bytes, rpc_release_fn release, void *arg);

/* Completes the call with a failure: the client gets `st` (exactly, through trailing
 * metadata; other gRPC clients see rpc_status_to_grpc(st)) and the formatted detail.
 * `c` is invalid afterwards. Errors: PST_ERR_STATE as above. Thread safe, non-blocking. */
pst_status rpc_call_fail(rpc_call *c, pst_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* PST_RPC_SERVER_H */
