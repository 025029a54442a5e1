/* server.c — gRPC C core server for /pstrain.PServer/ with deferred replies.
 *
 * Not for: the meaning of the methods (pserver/), framing (wire.c).
 *
 * DESIGN. One completion queue serves everything and a small pool of threads drains it;
 * each event's tag is a struct srv_tag naming what completed. The four methods are
 * registered with GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, so a call arrives with its
 * request body already read; a few requests per method are kept posted (a request is
 * re-posted as soon as one is matched). Every other method arrives through
 * grpc_server_request_call and is answered UNIMPLEMENTED at once, because gRPC would
 * otherwise hold such calls until their deadline.
 *
 * An arrived call first posts RECV_CLOSE_ON_SERVER, which completes when the call ends for
 * any reason and tells whether the client cancelled (went away, deadline passed); then the
 * body is decoded (failures answered INVALID_ARGUMENT here) and the handler runs. The
 * handler, or any thread later, completes the call once: an atomic `completed` flag makes
 * the owner's reply and the server's shutdown-time failure race safely, and only the
 * winner posts the send batch (initial metadata, message, status). Two reference counts
 * keep things valid: grpc_refs (the close op and the send op) releases the grpc_call as
 * soon as the reply is sent and the call closed, whether or not the owner still holds its
 * handle (after a shutdown-time failure it may); refs (gRPC side + owner, and the
 * handler while it runs) frees the rpc_call once the owner has let go too.
 * A reply to a client that went away simply completes with success == 0.
 *
 * Shutdown: stop accepting (grpc_server_shutdown_and_notify), optionally fail the pending
 * calls, wait for the shutdown tag and for every call's gRPC side to finish, destroy the
 * server, shut the queue down and join the threads once it is drained. */
#include "rpc/server.h"
#include "rpc/bulk.h"
#include "rpc/tsan.h"
#include "rpc/transport.h"

#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

#include <errno.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpc/compression.h>
#include <grpc/grpc.h>
#include <grpc/byte_buffer.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>

#include "common/clock.h"
#include "common/log.h"

enum {
    SRV_REQUESTS_PER_METHOD = 4, /* requests kept posted for each registered method */
    SRV_MAX_THREADS = 64,
    SRV_CANCEL_AFTER_S = 5, /* shutdown with fail_pending: cancel calls still in transfer */
};

enum srv_tag_kind {
    TAG_NEW_CALL,    /* a registered-method request matched (or failed at shutdown) */
    TAG_NEW_GENERIC, /* an unknown-method request matched */
    TAG_CLOSE,       /* RECV_CLOSE_ON_SERVER of a call */
    TAG_SEND,        /* the reply batch of a call */
    TAG_GENERIC_DONE,
    TAG_SHUTDOWN,
};

struct srv_tag {
    enum srv_tag_kind kind;
    void *obj;
};

struct rpc_call {
    rpc_server *srv;
    rpc_method method;
    struct srv_tag t_new, t_close, t_send;
    grpc_call *gcall;
    gpr_timespec deadline;
    grpc_metadata_array req_md;
    grpc_byte_buffer *req_bb; /* request body until decoded */
    rpc_message *msg;
    char *peer; /* gpr_malloc'd */
    int identity;         /* the trainer the call is from (rpc_call_identity), -1: unbound */
    const char *identity_by;
    int close_cancelled;
    void *_Atomic owner;  /* rpc_call_set_owner */
    atomic_int cancelled;
    atomic_int completed;
    atomic_int grpc_refs; /* close op + send op */
    int64_t arrived_ms;   /* monotonic, for max_wait_ms */
    int expired;          /* max_wait_ms ended it (under the server's mu) */
    atomic_int refs;      /* gRPC side + owner (+ the handler while it runs) */
    /* reply, alive until the send batch completes */
    grpc_byte_buffer *reply_bb;
    grpc_slice status_details;
    grpc_metadata trail;
    char trail_val[16];
    LIST_ENTRY(rpc_call) link;    /* the server's list of arrived calls */
    struct rpc_call *fail_next;   /* fail_pending's work list */
};

struct gen_call {
    rpc_server *srv;
    struct srv_tag t_new, t_done;
    grpc_call *gcall;
    grpc_call_details details;
    grpc_metadata_array md;
    int cancelled;
    grpc_slice status_details;
};

struct rpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    void *methods[RPC_METHOD_COUNT_];
    int port;
    rpc_handler_fn handler;
    void *handler_arg;
    rpc_cancel_fn on_cancel;
    /* The "Bearer TOKEN" values a call may carry (none: no token asked for): the job's
     * token (id -1), or each trainer's own (id = its trainer id). */
    struct srv_key {
        char *bearer;
        size_t len;
        int id;
    } *keys;
    int nkeys;
    int client_certs;  /* mutual TLS: a call's client certificate may name its trainer */
    int max_calls, max_wait_ms;
    size_t (*max_request)(void *arg, rpc_method m, const char **why);
    pthread_t keeper; /* housekeeping: ends calls that waited too long, gives back memory */
    int keeper_started;
    atomic_long rejected; /* calls answered with an error before any handler saw them */
    atomic_long abandoned; /* calls their client gave up on before the reply */
    atomic_long refused;       /* calls refused for their token */
    atomic_long refused_logged;
    _Atomic double refused_log_at; /* pst_clock_s() of the last such log line */
    pthread_t threads[SRV_MAX_THREADS];
    int nthreads;
    struct srv_tag t_shutdown;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int shutting;      /* shutdown_and_notify issued (or about to be) */
    int shutdown_done; /* its tag arrived */
    int finished;      /* shutdown complete: threads joined, queue destroyed */
    int grpc_live;     /* calls (registered or generic) whose gRPC side is alive */
    LIST_HEAD(, rpc_call) calls;
};

/* ---- call lifetime ------------------------------------------------------------------- */

static void call_destroy(rpc_call *c)
{
    if (c->gcall != NULL)
        grpc_call_unref(c->gcall);
    if (c->req_bb != NULL)
        grpc_byte_buffer_destroy(c->req_bb);
    grpc_metadata_array_destroy(&c->req_md);
    rpc_message_free(c->msg);
    if (c->peer != NULL)
        gpr_free(c->peer);
    free(c);
}

static void call_unref(rpc_call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    rpc_server *s = c->srv;
    pthread_mutex_lock(&s->mu);
    LIST_REMOVE(c, link);
    pthread_mutex_unlock(&s->mu);
    call_destroy(c);
}

static void live_done(rpc_server *s)
{
    pthread_mutex_lock(&s->mu);
    s->grpc_live--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void call_grpc_unref(rpc_call *c)
{
    if (atomic_fetch_sub(&c->grpc_refs, 1) != 1)
        return;
    rpc_server *s = c->srv;
    grpc_call_unref(c->gcall);
    c->gcall = NULL;
    live_done(s);
    call_unref(c);
}

/* The reply batch is over (sent, dropped, or never started): frees what it held. */
static void reply_finished(rpc_call *c)
{
    if (c->reply_bb != NULL)
        grpc_byte_buffer_destroy(c->reply_bb);
    c->reply_bb = NULL;
    grpc_slice_unref(c->status_details);
    c->status_details = grpc_empty_slice();
    call_grpc_unref(c);
}

/* Posts the reply batch; the caller won the `completed` flag. Takes `bb` (may be NULL). */
static void call_send(rpc_call *c, pst_status st, const char *detail, grpc_byte_buffer *bb)
{
    grpc_op ops[3];
    size_t n = 0;
    memset(ops, 0, sizeof(ops));
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    n++;
    if (bb != NULL) {
        c->reply_bb = bb;
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = bb;
        n++;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = rpc_status_to_grpc(st);
    if (st != PST_OK) {
        snprintf(c->trail_val, sizeof(c->trail_val), "%d", (int)st);
        c->trail.key = grpc_slice_from_static_string(RPC_STATUS_METADATA_KEY);
        c->trail.value = grpc_slice_from_static_string(c->trail_val);
        ops[n].data.send_status_from_server.trailing_metadata_count = 1;
        ops[n].data.send_status_from_server.trailing_metadata = &c->trail;
        c->status_details = grpc_slice_from_copied_string(detail != NULL ? detail : "");
        ops[n].data.send_status_from_server.status_details = &c->status_details;
    }
    n++;
    grpc_call *gc = c->gcall; /* c may be gone once the batch is started */
    RPC_TSAN_RELEASE(&c->t_send);
    grpc_call_error err = grpc_call_start_batch(gc, ops, n, &c->t_send, NULL);
    if (err != GRPC_CALL_OK) {
        PST_DEBUG("rpc server: %s reply not sent: %s", rpc_method_name(c->method),
                  grpc_call_error_to_string(err));
        reply_finished(c);
    }
}

static void on_send_done(rpc_call *c, int success)
{
    if (!success)
        PST_DEBUG("rpc server: %s reply to %s dropped (client gone)",
                  rpc_method_name(c->method), c->peer != NULL ? c->peer : "?");
    reply_finished(c);
}

static void on_close(rpc_call *c)
{
    if (c->close_cancelled) {
        atomic_store(&c->cancelled, 1);
        if (!atomic_load(&c->completed)) {
            PST_DEBUG("rpc server: %s call from %s cancelled before its reply",
                      rpc_method_name(c->method), c->peer != NULL ? c->peer : "?");
            atomic_fetch_add(&c->srv->abandoned, 1); /* the keeper gives their memory back */
            if (c->srv->on_cancel) /* our gRPC reference keeps c alive meanwhile */
                c->srv->on_cancel(c->srv->handler_arg, c);
        }
    }
    call_grpc_unref(c);
}

/* ---- requests ------------------------------------------------------------------------ */

static void request_registered(rpc_server *s, rpc_method m)
{
    rpc_call *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        PST_DEBUG("rpc server: out of memory re-posting a %s request", rpc_method_name(m));
        return;
    }
    c->srv = s;
    c->method = m;
    c->t_new = (struct srv_tag){TAG_NEW_CALL, c};
    c->t_close = (struct srv_tag){TAG_CLOSE, c};
    c->t_send = (struct srv_tag){TAG_SEND, c};
    c->status_details = grpc_empty_slice();
    grpc_metadata_array_init(&c->req_md);
    RPC_TSAN_RELEASE(&c->t_new);
    grpc_call_error err = grpc_server_request_registered_call(
        s->server, s->methods[m], &c->gcall, &c->deadline, &c->req_md, &c->req_bb, s->cq,
        s->cq, &c->t_new);
    if (err != GRPC_CALL_OK) {
        PST_DEBUG("rpc server: cannot post a %s request: %s", rpc_method_name(m),
                  grpc_call_error_to_string(err));
        call_destroy(c);
    }
}

static void request_generic(rpc_server *s)
{
    struct gen_call *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        PST_DEBUG("rpc server: out of memory re-posting the generic request");
        return;
    }
    g->srv = s;
    g->t_new = (struct srv_tag){TAG_NEW_GENERIC, g};
    g->t_done = (struct srv_tag){TAG_GENERIC_DONE, g};
    g->status_details = grpc_empty_slice();
    grpc_call_details_init(&g->details);
    grpc_metadata_array_init(&g->md);
    RPC_TSAN_RELEASE(&g->t_new);
    grpc_call_error err =
        grpc_server_request_call(s->server, &g->gcall, &g->details, &g->md, s->cq, s->cq,
                                 &g->t_new);
    if (err != GRPC_CALL_OK) {
        PST_DEBUG("rpc server: cannot post the generic request: %s",
                  grpc_call_error_to_string(err));
        grpc_call_details_destroy(&g->details);
        grpc_metadata_array_destroy(&g->md);
        free(g);
    }
}

static void gen_destroy(struct gen_call *g)
{
    if (g->gcall != NULL)
        grpc_call_unref(g->gcall);
    grpc_slice_unref(g->status_details);
    grpc_call_details_destroy(&g->details);
    grpc_metadata_array_destroy(&g->md);
    free(g);
}

/* Counts a matched generic call as alive and says whether to re-post its request. */
static int arrival(rpc_server *s)
{
    pthread_mutex_lock(&s->mu);
    s->grpc_live++;
    int repost = !s->shutting;
    pthread_mutex_unlock(&s->mu);
    return repost;
}

#define CALLER_REFUSED (-2)

/* Who the call's "authorization" metadata says it is: CALLER_REFUSED when it carries none
 * of the server's keys, else the key's id (-1: the job's token). Every key is compared
 * with every value, each in time that depends on the lengths only, never on where the
 * first wrong byte is. */
static int caller_of(const rpc_server *s, const grpc_metadata_array *md)
{
    int who = CALLER_REFUSED;
    for (size_t i = 0; i < md->count; i++) {
        if (grpc_slice_str_cmp(md->metadata[i].key, "authorization"))
            continue;
        const size_t n = GRPC_SLICE_LENGTH(md->metadata[i].value);
        const unsigned char *v = GRPC_SLICE_START_PTR(md->metadata[i].value);
        for (int k = 0; k < s->nkeys; k++) {
            const struct srv_key *key = &s->keys[k];
            unsigned diff = n != key->len;
            for (size_t b = 0; b < key->len; b++)
                diff |= (unsigned)(v[b < n ? b : 0] ^ (unsigned char)key->bearer[b]);
            if (n > 0 && diff == 0)
                who = key->id;
        }
    }
    return who;
}

/* The trainer id a client certificate names: the first subject alternative name, else
 * the common name, that holds "trainer-<id>" (e.g. trainer-3, or a pod's
 * pstrain-trainer-3-x7k2p); -1 when none does or there is no certificate. */
static int name_id(const char *v, size_t n)
{
    static const char key[] = "trainer-";
    for (size_t i = 0; i + sizeof key - 1 < n; i++) {
        if (memcmp(v + i, key, sizeof key - 1) != 0 || (i > 0 && v[i - 1] != '-' && v[i - 1] != '.'))
            continue;
        size_t j = i + sizeof key - 1;
        long id = 0;
        while (j < n && v[j] >= '0' && v[j] <= '9' && id <= 4095)
            id = id * 10 + (v[j++] - '0');
        if (j > i + sizeof key - 1 && id <= 4095 && (j == n || v[j] == '-' || v[j] == '.'))
            return (int)id;
    }
    return -1;
}

static int certificate_id(grpc_call *gcall)
{
    grpc_auth_context *ctx = grpc_call_auth_context(gcall);
    if (!ctx)
        return -1;
    int id = -1;
    const char *names[] = {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME};
    for (int k = 0; k < 2 && id < 0; k++) {
        grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ctx, names[k]);
        for (const grpc_auth_property *p; id < 0 && (p = grpc_auth_property_iterator_next(&it));)
            id = name_id(p->value, p->value_length);
    }
    grpc_auth_context_release(ctx);
    return id;
}

/* One line per second at most, with the count since the last one. */
static void log_refused(rpc_server *s, const char *what, const char *peer)
{
    const long n = atomic_fetch_add(&s->refused, 1) + 1;
    const double now = pst_clock_s(), last = atomic_load(&s->refused_log_at);
    if (now - last < 1.0 || !atomic_compare_exchange_strong(&s->refused_log_at, &last, now))
        return;
    const long before = atomic_exchange(&s->refused_logged, n);
    PST_WARN("refused %s from %s: no token or the wrong one (%ld such calls since the last "
             "line)", what, peer ? peer : "?", n - before);
}

static void on_new_generic(struct gen_call *g, int success)
{
    rpc_server *s = g->srv;
    if (!success) {
        gen_destroy(g);
        return;
    }
    if (arrival(s))
        request_generic(s);
    char method[256];
    size_t ml = GRPC_SLICE_LENGTH(g->details.method);
    if (ml >= sizeof(method))
        ml = sizeof(method) - 1;
    memcpy(method, GRPC_SLICE_START_PTR(g->details.method), ml);
    method[ml] = '\0';
    char detail[320];
    grpc_status_code code = GRPC_STATUS_UNIMPLEMENTED;
    snprintf(detail, sizeof(detail), "unknown method %s (this server serves /pstrain.PServer/"
             "Init, Push, Pull, Finish)", method);
    if (s->nkeys && caller_of(s, &g->md) == CALLER_REFUSED) {
        log_refused(s, "a call", NULL);
        code = GRPC_STATUS_UNAUTHENTICATED;
        snprintf(detail, sizeof(detail), "this pserver needs the job's token (PSTRAIN_TOKEN or "
                 "PSTRAIN_TOKEN_FILE): none or another was sent");
    }
    atomic_fetch_add(&s->rejected, 1);
    PST_DEBUG("rpc server: %s", detail);
    g->status_details = grpc_slice_from_copied_string(detail);
    grpc_op ops[3];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[1].data.recv_close_on_server.cancelled = &g->cancelled;
    ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[2].data.send_status_from_server.status = code;
    ops[2].data.send_status_from_server.status_details = &g->status_details;
    grpc_call *gc = g->gcall;
    RPC_TSAN_RELEASE(&g->t_done);
    grpc_call_error err = grpc_call_start_batch(gc, ops, 3, &g->t_done, NULL);
    if (err != GRPC_CALL_OK) {
        PST_DEBUG("rpc server: cannot answer %s: %s", method, grpc_call_error_to_string(err));
        gen_destroy(g);
        live_done(s);
    }
}

static void on_new_call(rpc_call *c, int success)
{
    rpc_server *s = c->srv;
    if (!success) { /* shutdown: the posted request is returned unmatched */
        call_destroy(c);
        return;
    }
    atomic_init(&c->grpc_refs, 2);
    atomic_init(&c->refs, 2);
    c->peer = grpc_call_get_peer(c->gcall);
    c->arrived_ms = (int64_t)(pst_clock_s() * 1e3);
    pthread_mutex_lock(&s->mu);
    s->grpc_live++;
    const int live = s->grpc_live;
    int repost = !s->shutting;
    LIST_INSERT_HEAD(&s->calls, c, link);
    pthread_mutex_unlock(&s->mu);
    if (repost)
        request_registered(s, c->method);

    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    grpc_call *gc = c->gcall;
    RPC_TSAN_RELEASE(&c->t_close);
    grpc_call_error err = grpc_call_start_batch(gc, &op, 1, &c->t_close, NULL);
    if (err != GRPC_CALL_OK) {
        PST_DEBUG("rpc server: cannot watch %s call for cancellation: %s",
                  rpc_method_name(c->method), grpc_call_error_to_string(err));
        call_grpc_unref(c);
    }

    grpc_byte_buffer *bb = c->req_bb;
    c->req_bb = NULL;
    /* Pull, Finish, Vote and Watch carry a header only: a large body is hostile and is refused
     * before it is decoded (compressed bodies are refused by gRPC: see the channel args). */
    const size_t body = bb ? grpc_byte_buffer_length(bb) : 0; /* NULL: no message came */
    pst_status st = PST_OK;
    const int by_token = s->nkeys ? caller_of(s, &c->req_md) : -1;
    const int by_cert = s->client_certs ? certificate_id(c->gcall) : -1;
    c->identity = by_token >= 0 ? by_token : by_cert;
    c->identity_by = by_token >= 0 ? "its token" : "its client certificate";
    if (by_token == CALLER_REFUSED) { /* before anything is decoded */
        grpc_byte_buffer_destroy(bb);
        bb = NULL;
        log_refused(s, rpc_method_name(c->method), c->peer);
        st = pst_error_set(PST_ERR_AUTH, "this pserver needs %s (PSTRAIN_TOKEN or "
                           "PSTRAIN_TOKEN_FILE): none or another was sent",
                           s->keys[0].id < 0 ? "the job's token"
                                             : "the trainer's own token, one of its "
                                               "--trainer-tokens");
    } else if (by_token >= 0 && by_cert >= 0 && by_token != by_cert) {
        grpc_byte_buffer_destroy(bb);
        bb = NULL;
        st = pst_error_set(PST_ERR_DENIED, "a call with trainer %d's token and trainer %d's "
                           "client certificate", by_token, by_cert);
    } else if (s->max_calls > 0 && live > s->max_calls) {
        grpc_byte_buffer_destroy(bb);
        bb = NULL;
        st = pst_error_set(PST_ERR_LIMIT, "%d calls in flight on this pserver, at most %d "
                           "(--max-calls)", live - 1, s->max_calls);
    } else if (s->max_request && body > 0) {
        const char *why = "";
        const size_t most = s->max_request(s->handler_arg, c->method, &why);
        if (most > 0 && body > most) {
            grpc_byte_buffer_destroy(bb);
            bb = NULL;
            st = pst_error_set(PST_ERR_LIMIT, "a request of %zu bytes: at most %zu (%s)", body,
                               most, why);
        }
    }
    if (st == PST_OK && !rpc_method_request_payload(c->method) && body > RPC_SMALL_REQUEST_MAX) {
        grpc_byte_buffer_destroy(bb);
        bb = NULL;
        st = pst_error_set(PST_ERR_INVALID, "%s request of %zu bytes: at most %d (it carries "
                           "no payload)", rpc_method_name(c->method), body,
                           RPC_SMALL_REQUEST_MAX);
    }
    if (st == PST_OK)
        st = rpc_wire_decode(bb, rpc_method_request_desc(c->method), &c->msg);
    if (st != PST_OK) {
        atomic_fetch_add(&s->rejected, 1);
        PST_DEBUG("rpc server: bad %s request from %s: %s", rpc_method_name(c->method),
                  c->peer != NULL ? c->peer : "?", pst_error_detail());
        if (!atomic_exchange(&c->completed, 1)) /* unless shutdown failed it already */
            call_send(c, st, pst_error_detail(), NULL);
        call_unref(c); /* no owner */
        return;
    }
    /* The handler's own reference: c stays valid until it returns, also when it (or a
     * thread it queued c for) completes c meanwhile (rpc_handler_fn). */
    atomic_fetch_add(&c->refs, 1);
    s->handler(s->handler_arg, c);
    call_unref(c);
}

static void *server_thread(void *arg)
{
    rpc_server *s = arg;
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        struct srv_tag *t = ev.tag;
        RPC_TSAN_ACQUIRE(t);
        switch (t->kind) {
        case TAG_NEW_CALL:
            on_new_call(t->obj, ev.success);
            break;
        case TAG_NEW_GENERIC:
            on_new_generic(t->obj, ev.success);
            break;
        case TAG_CLOSE:
            on_close(t->obj);
            break;
        case TAG_SEND:
            on_send_done(t->obj, ev.success);
            break;
        case TAG_GENERIC_DONE:
            gen_destroy(t->obj);
            live_done(s);
            break;
        case TAG_SHUTDOWN:
            pthread_mutex_lock(&s->mu);
            s->shutdown_done = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            break;
        }
    }
    return NULL;
}

/* The housekeeping thread, every 100 ms:
 * - max_wait_ms > 0: the calls alive longer than that and not answered (Watch excepted) are
 *   cancelled with DEADLINE_EXCEEDED, which runs on_cancel as a client that gave up would:
 *   the handler withdraws what it keeps for them.
 * - When calls are refused or abandoned by their clients: malloc_trim(0) once a second while
 *   they go on, and 0.2, 1, 2, 4 ... 64 s after the last one. pst_memory_tune keeps freed memory in the heap for the next
 *   step's messages; a flood of refused calls (each body received whole before it is
 *   refused) would otherwise leave the heap at its peak for good. gRPC keeps 10 to 50 MB for
 *   a connection that floods it while the connection stays (10,000 or 30,000 refused 100 KB
 *   pushes alike) and frees it when the connection closes: the later trims give that back
 *   when the client leaves. A job's own calls are never refused, so its buffers stay where
 *   pst_memory_tune keeps them. */
static int expire_due(rpc_server *s, const char *detail)
{
    rpc_call *due[64];
    int n = 0;
    const int64_t now = (int64_t)(pst_clock_s() * 1e3);
    pthread_mutex_lock(&s->mu);
    for (rpc_call *c = LIST_FIRST(&s->calls); c != NULL && n < 64; c = LIST_NEXT(c, link)) {
        if (c->expired || c->method == RPC_METHOD_WATCH || atomic_load(&c->completed) ||
            now - c->arrived_ms <= s->max_wait_ms)
            continue;
        int g = atomic_load(&c->grpc_refs); /* a reference on its gRPC side, if alive */
        while (g > 0 && !atomic_compare_exchange_weak(&c->grpc_refs, &g, g + 1))
            ;
        if (g <= 0)
            continue;
        c->expired = 1;
        due[n++] = c;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) {
        grpc_call_cancel_with_status(due[i]->gcall, GRPC_STATUS_DEADLINE_EXCEEDED, detail, NULL);
        call_grpc_unref(due[i]);
    }
    return n;
}

static void *keeper_thread(void *arg)
{
    rpc_server *s = arg;
    char detail[160];
    snprintf(detail, sizeof detail, "unanswered for %d ms: the pserver ends such calls "
             "(--max-wait-ms)", s->max_wait_ms);
    long seen = 0;             /* `rejected` at the last look */
    double changed_at = -1e9;  /* when it last changed */
    double trimmed_at = -1e9;  /* the last trim */
    double quiet_trim = 0.2;   /* seconds after the last refusal of the next trim */
    for (;;) {
        pthread_mutex_lock(&s->mu);
        const int shutting = s->shutting;
        pthread_mutex_unlock(&s->mu);
        if (shutting)
            return NULL;
        if (s->max_wait_ms > 0 && expire_due(s, detail) == 64)
            continue;
        const long rejected = atomic_load(&s->rejected) + atomic_load(&s->abandoned);
        const double now = pst_clock_s();
        if (rejected != seen) {
            seen = rejected;
            changed_at = now;
            quiet_trim = 0.2;
        }
        int trim = 0;
        if (changed_at >= trimmed_at && now - trimmed_at >= 1.0)
            trim = 1; /* calls are being refused: once a second */
        else if (quiet_trim <= 64 && now - changed_at >= quiet_trim) {
            trim = 1; /* they stopped: 0.2 s, 1, 2, 4 ... 64 s after the last */
            quiet_trim = quiet_trim < 1 ? 1 : 2 * quiet_trim;
        }
        if (trim) {
            malloc_trim(0);
            trimmed_at = now;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* ---- server -------------------------------------------------------------------------- */

/* Drains a shut-down queue that no thread serves (initialization failures). */
static void cq_drain(grpc_completion_queue *cq)
{
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
}

/* Why gRPC could not listen on `bind` ("host:port"), found by doing it ourselves: the host
 * does not resolve, or bind() fails (the port in use, an address not of this machine). */
static void listen_failure(const char *bind_addr, char *why, size_t n)
{
    char host[256];
    const char *colon = strrchr(bind_addr, ':');
    if (!colon || colon == bind_addr || !colon[1] || (size_t)(colon - bind_addr) >= sizeof host) {
        snprintf(why, n, "not host:port (example: 0.0.0.0:7164)");
        return;
    }
    memcpy(host, bind_addr, (size_t)(colon - bind_addr));
    host[colon - bind_addr] = '\0';
    if (host[0] == '[' && host[strlen(host) - 1] == ']') { /* [::1] */
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host, colon + 1, &hints, &ai);
    if (rc != 0) {
        snprintf(why, n, "the address %s does not resolve (%s; example: 0.0.0.0 or 127.0.0.1)",
                 host, gai_strerror(rc));
        return;
    }
    snprintf(why, n, "gRPC refused it");
    for (struct addrinfo *p = ai; p; p = p->ai_next) {
        int fd = socket(p->ai_family, p->ai_socktype, p->ai_protocol);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, p->ai_addr, p->ai_addrlen) != 0)
            snprintf(why, n, "%s%s", strerror(errno),
                     errno == EADDRINUSE ? " (another process listens there)" : "");
        close(fd);
        break;
    }
    freeaddrinfo(ai);
}

static void keys_free(rpc_server *s)
{
    for (int k = 0; s->keys && k < s->nkeys; k++)
        free(s->keys[k].bearer);
    free(s->keys);
}

pst_status rpc_server_init(rpc_server **out, const rpc_server_config *cfg)
{
    *out = NULL;
    if (cfg == NULL || cfg->handler == NULL || cfg->bind == NULL)
        return pst_error_set(PST_ERR_INVALID, "rpc server: no handler or bind address");
    int nthreads = cfg->threads == 0 ? 2 : cfg->threads;
    if (nthreads < 1 || nthreads > SRV_MAX_THREADS)
        return pst_error_set(PST_ERR_INVALID, "rpc server: %d threads (1..%d, 0 for 2)",
                             cfg->threads, SRV_MAX_THREADS);
    rpc_server *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return pst_error_set(PST_ERR_NOMEM, "rpc server");
    LIST_INIT(&s->calls);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->handler = cfg->handler;
    s->handler_arg = cfg->handler_arg;
    s->on_cancel = cfg->on_cancel;
    s->t_shutdown = (struct srv_tag){TAG_SHUTDOWN, s};
    atomic_init(&s->refused_log_at, 0.0);
    s->max_calls = cfg->max_calls;
    s->max_wait_ms = cfg->max_wait_ms;
    s->max_request = cfg->max_request;
    const int shared = cfg->token && cfg->token[0];
    for (int t = 0; t < cfg->ntrainer_tokens; t++)
        s->nkeys += cfg->trainer_tokens[t] != NULL;
    s->nkeys += shared && !s->nkeys; /* the job's token only without trainers' own */
    s->keys = s->nkeys ? calloc((size_t)s->nkeys, sizeof *s->keys) : NULL;
    for (int t = 0, k = 0; s->keys && k < s->nkeys; t++) {
        const char *token = s->nkeys == shared ? cfg->token : cfg->trainer_tokens[t];
        if (!token)
            continue;
        struct srv_key *key = &s->keys[k++];
        key->id = s->nkeys == shared ? -1 : t;
        key->len = strlen("Bearer ") + strlen(token);
        if ((key->bearer = malloc(key->len + 1)))
            snprintf(key->bearer, key->len + 1, "Bearer %s", token);
    }
    for (int k = 0; k < s->nkeys; k++)
        if (!s->keys || !s->keys[k].bearer) {
            keys_free(s);
            free(s);
            return pst_error_set(PST_ERR_NOMEM, "rpc server");
        }
    pst_status st = PST_OK;

    /* No SO_REUSEPORT: a second pserver on a taken port must fail, not share it. */
    grpc_arg args[16]; /* ours, the keepalive ones and RPC_BULK_ARGS */
    memset(args, 0, sizeof(args));
    const rpc_int_arg own[] = {
        {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         cfg->max_message > 0 && cfg->max_message < INT_MAX ? (int)cfg->max_message : INT_MAX},
        {GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, -1},
        {GRPC_ARG_ALLOW_REUSEPORT, 0},
        /* Identity only: a compressed request is refused by gRPC, so a body's size on the
         * wire is its size in memory (64 MiB of zeros gzip to a few KiB). */
        {GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET, 1 << GRPC_COMPRESS_NONE}};
    size_t nargs = rpc_int_args(args, own, 4);
    if (cfg->keepalive_ms > 0) { /* a client that stops answering is found by its pings */
        const rpc_int_arg ka[] = {
            {GRPC_ARG_KEEPALIVE_TIME_MS, cfg->keepalive_ms},
            {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, cfg->keepalive_ms},
            {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1},
            {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0},
            /* and the clients' pings as often (a trainer watches its pservers the same
             * way): no strike for pinging "too often" */
            {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, cfg->keepalive_ms / 2},
            {GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0}};
        nargs += rpc_int_args(args + nargs, ka, 6);
    }
    nargs += rpc_bulk_args(args + nargs);
    grpc_channel_args cargs = {nargs, args};
    s->server = grpc_server_create(&cargs, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    for (int m = 0; m < RPC_METHOD_COUNT_; m++) {
        s->methods[m] = grpc_server_register_method(s->server, rpc_method_path(m), NULL,
                                                    GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
                                                    0);
        if (s->methods[m] == NULL) {
            st = pst_error_set(PST_ERR_INTERNAL, "rpc server: cannot register %s",
                               rpc_method_path(m));
            goto error;
        }
    }
    s->client_certs = cfg->transport && !strcmp(rpc_transport_name(cfg->transport), "mutual tls");
    grpc_server_credentials *creds = rpc_transport_server_creds(cfg->transport);
    s->port = grpc_server_add_http2_port(s->server, cfg->bind, creds);
    grpc_server_credentials_release(creds);
    if (s->port <= 0) {
        char why[256];
        listen_failure(cfg->bind, why, sizeof why);
        st = pst_error_set(PST_ERR_IO, "rpc server: cannot listen on %s: %s", cfg->bind, why);
        goto error;
    }
    /* Threads first: if one cannot start, the server was never started and unwinds
     * simply. Polling a queue before grpc_server_start is allowed. */
    for (int i = 0; i < nthreads; i++) {
        if (pthread_create(&s->threads[i], NULL, server_thread, s) != 0) {
            st = pst_error_set(PST_ERR_NOMEM, "rpc server: cannot start thread %d of %d", i,
                               nthreads);
            goto error;
        }
        s->nthreads++;
    }
    grpc_server_start(s->server);
    if (pthread_create(&s->keeper, NULL, keeper_thread, s) == 0)
        s->keeper_started = 1;
    else
        PST_WARN("rpc server: cannot start the housekeeping thread: no --max-wait-ms, and "
                 "memory from refused calls is not given back");
    for (int m = 0; m < RPC_METHOD_COUNT_; m++)
        for (int k = 0; k < SRV_REQUESTS_PER_METHOD; k++)
            request_registered(s, m);
    request_generic(s);
    PST_DEBUG("rpc server: listening on %s (port %d, %d threads)", cfg->bind, s->port,
              s->nthreads);
    *out = s;
    return PST_OK;

error:
    grpc_server_destroy(s->server);
    grpc_completion_queue_shutdown(s->cq);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    if (s->nthreads == 0)
        cq_drain(s->cq);
    grpc_completion_queue_destroy(s->cq);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    keys_free(s);
    free(s);
    return st;
}

int rpc_server_port(const rpc_server *s)
{
    return s->port;
}

/* Fails every call not completed yet. A call whose `completed` flag we win keeps its send
 * reference until we post the send, so it stays alive after the lock is dropped; the
 * sends are posted outside the lock because a refused one re-enters it (live_done). */
static void fail_pending(rpc_server *s)
{
    rpc_call *to_fail = NULL;
    pthread_mutex_lock(&s->mu);
    rpc_call *c;
    LIST_FOREACH(c, &s->calls, link) {
        if (atomic_exchange(&c->completed, 1))
            continue;
        c->fail_next = to_fail;
        to_fail = c;
    }
    pthread_mutex_unlock(&s->mu);
    while (to_fail != NULL) {
        rpc_call *c = to_fail;
        to_fail = c->fail_next;
        call_send(c, PST_ERR_UNAVAILABLE, "server shutting down", NULL);
    }
}

void rpc_server_shutdown(rpc_server *s, int fail)
{
    pthread_mutex_lock(&s->mu);
    if (s->shutting) {
        while (!s->finished)
            pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->shutting = 1;
    pthread_mutex_unlock(&s->mu);

    if (s->keeper_started) /* it sees `shutting` within 100 ms */
        pthread_join(s->keeper, NULL);
    s->keeper_started = 0;
    RPC_TSAN_RELEASE(&s->t_shutdown);
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
    if (fail)
        fail_pending(s);
    pthread_mutex_lock(&s->mu);
    if (fail) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += SRV_CANCEL_AFTER_S;
        while (!(s->shutdown_done && s->grpc_live == 0)) {
            if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0)
                break;
        }
        if (!(s->shutdown_done && s->grpc_live == 0)) {
            pthread_mutex_unlock(&s->mu);
            PST_DEBUG("rpc server: cancelling calls still in transfer");
            grpc_server_cancel_all_calls(s->server);
            pthread_mutex_lock(&s->mu);
        }
    }
    while (!(s->shutdown_done && s->grpc_live == 0))
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);

    grpc_server_destroy(s->server);
    s->server = NULL;
    grpc_completion_queue_shutdown(s->cq);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    grpc_completion_queue_destroy(s->cq);
    s->cq = NULL;

    pthread_mutex_lock(&s->mu);
    s->finished = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    PST_DEBUG("rpc server: port %d shut down", s->port);
}

void rpc_server_free(rpc_server *s)
{
    if (s == NULL)
        return;
    rpc_server_shutdown(s, 1);
    /* Calls the owner never completed after a shutdown-time failure. */
    rpc_call *c = LIST_FIRST(&s->calls);
    while (c != NULL) {
        rpc_call *next = LIST_NEXT(c, link);
        call_destroy(c);
        c = next;
    }
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    keys_free(s);
    free(s);
}

/* ---- calls --------------------------------------------------------------------------- */

rpc_method rpc_call_method(const rpc_call *c)
{
    return c->method;
}

const ProtobufCMessage *rpc_call_request(const rpc_call *c)
{
    return rpc_message_header(c->msg);
}

const rpc_payload *rpc_call_payload(const rpc_call *c)
{
    return rpc_message_payload(c->msg);
}

rpc_kept_payload *rpc_call_keep_payload(rpc_call *c)
{
    return rpc_message_keep_payload(c->msg);
}

int rpc_call_identity(const rpc_call *c, const char **by)
{
    if (by)
        *by = c->identity >= 0 ? c->identity_by : "";
    return c->identity;
}

void rpc_call_set_owner(rpc_call *c, void *owner)
{
    atomic_store(&c->owner, owner);
}

void *rpc_call_owner(const rpc_call *c)
{
    return atomic_load(&((rpc_call *)c)->owner);
}

int rpc_call_cancelled(const rpc_call *c)
{
    return atomic_load(&((rpc_call *)c)->cancelled);
}

int64_t rpc_call_deadline_left_ms(const rpc_call *c)
{
    gpr_timespec inf = gpr_inf_future(c->deadline.clock_type);
    if (gpr_time_cmp(c->deadline, inf) == 0)
        return -1;
    gpr_timespec d = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
    gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
    int64_t ms = gpr_time_to_millis(left);
    return ms > 0 ? ms : 0;
}

const char *rpc_call_peer(const rpc_call *c)
{
    return c->peer != NULL ? c->peer : "?";
}

static pst_status already_completed(rpc_call *c)
{
    pst_status st = pst_error_set(PST_ERR_STATE,
                                  "rpc server: %s call was already failed (server shutting "
                                  "down)",
                                  rpc_method_name(c->method));
    call_unref(c);
    return st;
}

pst_status rpc_call_reply(rpc_call *c, const ProtobufCMessage *reply, const void *payload,
                          size_t bytes, rpc_release_fn release, void *arg)
{
    if (atomic_exchange(&c->completed, 1)) {
        if (release != NULL)
            release(arg);
        return already_completed(c);
    }
    const ProtobufCMessageDescriptor *want = rpc_method_reply_desc(c->method);
    pst_status st;
    if (reply == NULL || reply->descriptor != want) {
        if (release != NULL)
            release(arg);
        st = pst_error_set(PST_ERR_INVALID, "rpc server: %s reply must be a %s, not %s",
                           rpc_method_name(c->method), want->name,
                           reply != NULL ? reply->descriptor->name : "NULL");
        call_send(c, PST_ERR_INTERNAL, pst_error_detail(), NULL);
    } else {
        grpc_byte_buffer *bb = NULL;
        st = rpc_wire_encode(reply, payload, bytes, release, arg, &bb);
        if (st == PST_OK)
            call_send(c, PST_OK, NULL, bb);
        else
            call_send(c, PST_ERR_INTERNAL, pst_error_detail(), NULL);
    }
    call_unref(c);
    return st;
}

pst_status rpc_call_fail(rpc_call *c, pst_status st, const char *fmt, ...)
{
    if (atomic_exchange(&c->completed, 1))
        return already_completed(c);
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    if (st == PST_OK) /* a failure must not read as success */
        st = PST_ERR_INTERNAL;
    call_send(c, st, detail, NULL);
    call_unref(c);
    return PST_OK;
}
