/* client.c — asynchronous unary calls to pservers on gRPC C core, with retries.
 *
 * Not for: framing (wire.c), the server (server.c), what trainers send (trainer/).
 *
 * DESIGN. Two channels (connections) per server, Pulls on their own (CL_LANES below), each
 * with the 4 MiB message limits lifted, gRPC's own retries
 * off (we retry ourselves and know which calls may repeat) and reconnect backoff matched
 * to ours (50 ms .. 1 s), so a retry meets a channel that has just tried to reconnect. The
 * four methods are pre-registered on every channel. A call is one batch of all six client
 * ops (send metadata, message, close; receive metadata, message, status) on one
 * completion queue drained by a few threads; its tag is the call object.
 *
 * The request is kept as two slices, the packed header and the lent payload, so an attempt
 * that fails UNAVAILABLE is rebuilt without packing or copying anything: the call waits
 * in a list with its retry time, and the queue threads wake up in time for the earliest
 * one (their grpc_completion_queue_next deadline) and start it again. A reply's exact
 * pst_status travels in trailing metadata (RPC_STATUS_METADATA_KEY); without it the gRPC
 * code is mapped (rpc_status_from_grpc). The reply body is decoded on the queue thread
 * and handed to the done callback in place: the only copy of its payload is the one the
 * callback makes into its destination.
 *
 * Lifetime: the client's mutex guards the list of active calls, the retry list and each
 * call's current grpc_call pointer, so rpc_client_free can cancel whatever is in flight
 * while queue threads finish calls; a call being started after `closing` is set is
 * refused, one created just before is cancelled by free and completes CANCELLED. */
#include "rpc/client.h"
#include "rpc/bulk.h"
#include "rpc/tsan.h"
#include "rpc/transport.h"

#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "common/log.h"
#include "common/memory.h"

enum {
    CL_BACKOFF_FIRST_MS = 50,
    CL_BACKOFF_MAX_MS = 1000,
    CL_MAX_THREADS = 64,
    CL_DETAIL = 512,
};

struct cl_call {
    rpc_client *cl;
    int server;
    rpc_method method;
    grpc_slice header;  /* length prefix + packed header */
    grpc_slice payload; /* lent payload (bytes > 0) */
    int has_payload;
    rpc_done_fn done;
    void *arg;
    rpc_message **keep; /* blocking wrapper: receives the reply instead of it being freed */
    /* the current attempt */
    grpc_call *gcall; /* guarded by cl->mu */
    grpc_byte_buffer *send_bb;
    grpc_byte_buffer *recv_bb;
    grpc_metadata_array init_md, trail_md;
    grpc_status_code status;
    grpc_slice details;
    int attempt_live; /* md arrays and details initialized */
    /* retries */
    int attempts;
    int64_t first_unavailable_ms; /* 0: no UNAVAILABLE yet */
    int backoff_ms;
    int64_t retry_at_ms;
    LIST_ENTRY(cl_call) link;    /* active list */
    struct cl_call *wnext;       /* retry list */
};

/* Lanes: each server gets two channels, so two TCP connections. Pull replies (bulk values
 * from the server) go on their own, because on one connection the small replies to
 * Pushes queue behind them in the server's socket and on its link: a Push's answer,
 * which frees the trainer's send window (trainer/remote.c), then comes only as late as
 * the Pull replies sent before it, and the trainer's link idles meanwhile. Every other
 * method (Push, Init, Finish, Vote, Watch) goes on lane 0, whose server-to-client
 * direction carries only small replies. */
#define CL_LANES 2

static int lane_of(rpc_method m)
{
    return m == RPC_METHOD_PULL ? 1 : 0;
}

struct rpc_client {
    int nservers;
    char **addrs;
    char **labels;                   /* "pserver ADDR" (or the config's name): in errors */
    grpc_channel **chans;            /* (nservers * CL_LANES) */
    void *(*reg)[RPC_METHOD_COUNT_]; /* registered-call handles per channel */
    grpc_completion_queue *cq;
    pthread_t threads[CL_MAX_THREADS];
    int nthreads;
    int call_timeout_ms;
    int connect_timeout_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int closing;
    int nactive;
    LIST_HEAD(, cl_call) active;
    struct cl_call *waiting;
    char **gone;       /* (nservers) why a server was given up (rpc_client_give_up), or NULL */
    int tls;            /* the channels are TLS (rpc/transport.h) */
    grpc_metadata auth; /* "authorization: Bearer TOKEN", sent with every call */
    int has_auth;
};

static int64_t now_ms(void)
{
    gpr_timespec t = gpr_now(GPR_CLOCK_MONOTONIC);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ---- attempts ------------------------------------------------------------------------- */

static void attempt_clear(struct cl_call *c)
{
    if (c->send_bb != NULL)
        grpc_byte_buffer_destroy(c->send_bb);
    c->send_bb = NULL;
    if (c->recv_bb != NULL)
        grpc_byte_buffer_destroy(c->recv_bb);
    c->recv_bb = NULL;
    if (c->attempt_live) {
        grpc_metadata_array_destroy(&c->init_md);
        grpc_metadata_array_destroy(&c->trail_md);
        grpc_slice_unref(c->details);
        c->attempt_live = 0;
    }
}

/* The detail of an error the pserver answered with: its text first (the cause: "trainer 1
 * left the job at step 5494 (stopped by signal)"), then where it was seen, in brackets. A
 * leading "<Method>: " or "<Method> of block N: " of the pserver's text moves into the
 * brackets: "... [pserver 10.0.0.1:7164 Pull of block 0]". */
static void server_detail(char *out, size_t size, const char *label, const char *mname,
                          const char *text)
{
    const char *cause = text;
    char where[64];
    snprintf(where, sizeof where, "%s", mname);
    const size_t m = strlen(mname);
    if (!strncmp(text, mname, m)) {
        const char *p = text + m;
        unsigned block;
        int used = 0;
        if (!strncmp(p, ": ", 2)) {
            cause = p + 2;
        } else if (sscanf(p, " of block %u: %n", &block, &used) == 1 && used > 0) {
            cause = p + used;
            snprintf(where, sizeof where, "%s of block %u", mname, block);
        }
    }
    snprintf(out, size, "%s [%s %s]", cause, label, where);
}

/* Starts one attempt. Errors: PST_ERR_STATE when the client is closing, PST_ERR_UNAVAILABLE
 * for a server given up (rpc_client_give_up), PST_ERR_INTERNAL
 * when gRPC refuses the batch. */
static pst_status attempt_start(struct cl_call *c)
{
    rpc_client *cl = c->cl;
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                     gpr_time_from_millis(cl->call_timeout_ms, GPR_TIMESPAN));
    pthread_mutex_lock(&cl->mu);
    if (cl->closing) {
        pthread_mutex_unlock(&cl->mu);
        return pst_error_set(PST_ERR_STATE, "%s %s: client shutting down",
                             cl->labels[c->server], rpc_method_name(c->method));
    }
    if (cl->gone[c->server]) { /* rpc_client_give_up: not even tried */
        char detail[CL_DETAIL];
        server_detail(detail, sizeof detail, cl->labels[c->server], rpc_method_name(c->method),
                      cl->gone[c->server]);
        pst_status st = pst_error_set(PST_ERR_UNAVAILABLE, "%s", detail);
        pthread_mutex_unlock(&cl->mu);
        return st;
    }
    const int ch = c->server * CL_LANES + lane_of(c->method);
    grpc_call *g = grpc_channel_create_registered_call(cl->chans[ch], NULL,
                                                       GRPC_PROPAGATE_DEFAULTS, cl->cq,
                                                       cl->reg[ch][c->method], deadline, NULL);
    c->gcall = g;
    pthread_mutex_unlock(&cl->mu);

    grpc_slice s[2] = {c->header, c->payload};
    c->send_bb = grpc_raw_byte_buffer_create(s, c->has_payload ? 2 : 1);
    grpc_metadata_array_init(&c->init_md);
    grpc_metadata_array_init(&c->trail_md);
    c->details = grpc_empty_slice();
    c->status = GRPC_STATUS_UNKNOWN;
    c->attempt_live = 1;

    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (cl->has_auth) { /* read-only and alive as long as the client */
        ops[0].data.send_initial_metadata.count = 1;
        ops[0].data.send_initial_metadata.metadata = &cl->auth;
    }
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = c->send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &c->recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &c->trail_md;
    ops[5].data.recv_status_on_client.status = &c->status;
    ops[5].data.recv_status_on_client.status_details = &c->details;
    c->attempts++;
    RPC_TSAN_RELEASE(c);
    grpc_call_error err = grpc_call_start_batch(g, ops, 6, c, NULL);
    if (err != GRPC_CALL_OK) {
        pthread_mutex_lock(&cl->mu);
        c->gcall = NULL;
        pthread_mutex_unlock(&cl->mu);
        grpc_call_unref(g);
        attempt_clear(c);
        return pst_error_set(PST_ERR_INTERNAL, "%s %s: gRPC refused the call: %s",
                             cl->labels[c->server], rpc_method_name(c->method),
                             grpc_call_error_to_string(err));
    }
    return PST_OK;
}

/* Unlinks and frees a call whose attempt is over; drops its slices (the payload is
 * released once gRPC has dropped it too). */
static void call_drop(struct cl_call *c)
{
    rpc_client *cl = c->cl;
    attempt_clear(c);
    grpc_slice_unref(c->header);
    if (c->has_payload)
        grpc_slice_unref(c->payload);
    pthread_mutex_lock(&cl->mu);
    LIST_REMOVE(c, link);
    if (--cl->nactive == 0)
        pthread_cond_broadcast(&cl->cv);
    pthread_mutex_unlock(&cl->mu);
    free(c);
}

/* Runs the done callback and frees the call. `msg` may be NULL. */
static void call_finish(struct cl_call *c, pst_status st, const char *detail, rpc_message *msg)
{
    if (c->keep != NULL)
        *c->keep = msg; /* before done(), which wakes the waiting caller */
    c->done(c->arg, st, detail, msg != NULL ? rpc_message_header(msg) : NULL,
            msg != NULL ? rpc_message_payload(msg) : NULL);
    if (c->keep == NULL)
        rpc_message_free(msg);
    call_drop(c);
}

/* The status of a finished attempt: exact when the server sent RPC_STATUS_METADATA_KEY. */
static pst_status attempt_status(const struct cl_call *c, int *from_server)
{
    *from_server = 0;
    for (size_t i = 0; i < c->trail_md.count; i++) {
        const grpc_metadata *md = &c->trail_md.metadata[i];
        if (!grpc_slice_str_cmp(md->key, RPC_STATUS_METADATA_KEY)) {
            char num[16];
            size_t n = GRPC_SLICE_LENGTH(md->value);
            if (n == 0 || n >= sizeof(num))
                break;
            memcpy(num, GRPC_SLICE_START_PTR(md->value), n);
            num[n] = '\0';
            char *end;
            long v = strtol(num, &end, 10);
            if (*end == '\0' && v > PST_OK && v < PST_ERR_COUNT_) {
                *from_server = 1;
                return (pst_status)v;
            }
            break;
        }
    }
    return rpc_status_from_grpc(c->status);
}

/* Queues `c` for another attempt, or returns 0 when its retry time is over. */
static int retry_schedule(struct cl_call *c)
{
    rpc_client *cl = c->cl;
    int64_t now = now_ms();
    if (c->first_unavailable_ms == 0) {
        c->first_unavailable_ms = now;
        c->backoff_ms = CL_BACKOFF_FIRST_MS;
    }
    int64_t give_up = c->first_unavailable_ms + cl->connect_timeout_ms;
    pthread_mutex_lock(&cl->mu);
    const int gone = cl->gone[c->server] != NULL;
    pthread_mutex_unlock(&cl->mu);
    if (cl->connect_timeout_ms < 0 || now >= give_up || gone)
        return 0;
    /* The last wait is cut short so that one attempt happens at the retry deadline. */
    c->retry_at_ms = now + c->backoff_ms < give_up ? now + c->backoff_ms : give_up;
    c->backoff_ms = c->backoff_ms * 2 > CL_BACKOFF_MAX_MS ? CL_BACKOFF_MAX_MS
                                                          : c->backoff_ms * 2;
    pthread_mutex_lock(&cl->mu);
    if (cl->closing) {
        pthread_mutex_unlock(&cl->mu);
        return 0;
    }
    c->wnext = cl->waiting;
    cl->waiting = c;
    pthread_mutex_unlock(&cl->mu);
    return 1;
}

static void on_complete(struct cl_call *c)
{
    rpc_client *cl = c->cl;
    const char *addr = cl->addrs[c->server], *label = cl->labels[c->server];
    const char *mname = rpc_method_name(c->method);
    pthread_mutex_lock(&cl->mu);
    grpc_call *g = c->gcall;
    c->gcall = NULL;
    int closing = cl->closing;
    pthread_mutex_unlock(&cl->mu);
    grpc_call_unref(g);

    char text[CL_DETAIL / 2];
    size_t n = GRPC_SLICE_LENGTH(c->details);
    if (n >= sizeof(text))
        n = sizeof(text) - 1;
    memcpy(text, GRPC_SLICE_START_PTR(c->details), n);
    text[n] = '\0';

    char detail[CL_DETAIL];
    int from_server;
    pst_status st = attempt_status(c, &from_server);
    /* Cancelled by the server's side (a pserver shutting down cancels the calls still in
     * transfer): it could not answer, so the call is unavailable: retried, and ended with
     * the reason once the server is known gone (rpc_client_give_up, from its Watch). This
     * client itself cancels only when closing (below) or giving up (UNAVAILABLE). */
    if (c->status == GRPC_STATUS_CANCELLED && !from_server && !closing)
        st = PST_ERR_UNAVAILABLE;
    if (st == PST_ERR_UNAVAILABLE && !closing &&
        (strstr(text, "andshake failed") || strstr(text, "is not in peer certificate"))) {
        /* A TLS handshake that fails fails again: no retry (a wrong CA, a certificate that
         * does not name this address, a server that is not TLS). */
        snprintf(detail, sizeof(detail), "%s %s: the TLS handshake failed: %s (check "
                 "PSTRAIN_TLS_CA, and that the pserver's certificate names %s)", label, mname,
                 text, addr);
        call_finish(c, PST_ERR_INVALID, detail, NULL);
        return;
    }
    if (st == PST_ERR_UNAVAILABLE && !closing) {
        PST_DEBUG("rpc client: %s %s unavailable (attempt %d): %s", addr, mname, c->attempts,
                  text);
        attempt_clear(c);
        if (retry_schedule(c))
            return;
        pthread_mutex_lock(&cl->mu);
        if (cl->gone[c->server]) {
            server_detail(detail, sizeof detail, label, mname, cl->gone[c->server]);
            pthread_mutex_unlock(&cl->mu);
            call_finish(c, st, detail, NULL);
            return;
        }
        pthread_mutex_unlock(&cl->mu);
        double secs = (double)(now_ms() - c->first_unavailable_ms) / 1000.0;
        snprintf(detail, sizeof(detail),
                 "%s unavailable: %s failed for %.1f s (%d attempts, connect timeout "
                 "%d ms): %s%s",
                 label, mname, secs, c->attempts, cl->connect_timeout_ms, text,
                 !strstr(text, "Socket closed") ? ""
                 : cl->tls ? " (the connection closed at once: does the pserver require a client "
                             "certificate? then set PSTRAIN_TLS_CLIENT_CERT and _KEY)"
                           : " (the connection closed at once: a TLS pserver? then set "
                             "PSTRAIN_TLS_CA)");
        call_finish(c, st, detail, NULL);
        return;
    }
    if (closing && c->status == GRPC_STATUS_CANCELLED && !from_server) {
        snprintf(detail, sizeof(detail), "%s %s: cancelled, client shutting down",
                 label, mname);
        call_finish(c, PST_ERR_STATE, detail, NULL);
        return;
    }
    if (st == PST_ERR_TIMEOUT && !from_server) {
        snprintf(detail, sizeof(detail), "%s %s: no reply within %d ms (%s)", label,
                 mname, cl->call_timeout_ms, text[0] ? text : "deadline exceeded");
        call_finish(c, st, detail, NULL);
        return;
    }
    if (st != PST_OK) {
        server_detail(detail, sizeof detail, label, mname, text[0] ? text : pst_strerror(st));
        call_finish(c, st, detail, NULL);
        return;
    }
    rpc_message *msg = NULL;
    grpc_byte_buffer *bb = c->recv_bb;
    c->recv_bb = NULL;
    st = rpc_wire_decode(bb, rpc_method_reply_desc(c->method), &msg);
    if (st != PST_OK) {
        snprintf(detail, sizeof(detail), "%s %s: bad reply: %s", label, mname,
                 pst_error_detail());
        call_finish(c, st, detail, NULL);
        return;
    }
    call_finish(c, PST_OK, "", msg);
}

/* Starts the calls whose retry time has come; returns the earliest time still waiting
 * (INT64_MAX for none). */
static int64_t retries_run(rpc_client *cl)
{
    int64_t now = now_ms();
    int64_t next = INT64_MAX;
    struct cl_call *due = NULL;
    pthread_mutex_lock(&cl->mu);
    struct cl_call **pp = &cl->waiting;
    while (*pp != NULL) {
        struct cl_call *c = *pp;
        if (c->retry_at_ms <= now) {
            *pp = c->wnext;
            c->wnext = due;
            due = c;
        } else {
            if (c->retry_at_ms < next)
                next = c->retry_at_ms;
            pp = &c->wnext;
        }
    }
    pthread_mutex_unlock(&cl->mu);
    while (due != NULL) {
        struct cl_call *c = due;
        due = c->wnext;
        pst_status st = attempt_start(c);
        if (st != PST_OK) {
            char detail[CL_DETAIL];
            snprintf(detail, sizeof(detail), "%s", pst_error_detail());
            call_finish(c, st, detail, NULL);
        }
    }
    return next;
}

static void *client_thread(void *arg)
{
    rpc_client *cl = arg;
    int64_t next = INT64_MAX;
    for (;;) {
        gpr_timespec deadline = next == INT64_MAX
                                    ? gpr_inf_future(GPR_CLOCK_MONOTONIC)
                                    : gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                   gpr_time_from_millis(next - now_ms(),
                                                                        GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(cl->cq, deadline, NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE) {
            RPC_TSAN_ACQUIRE(ev.tag);
            on_complete(ev.tag);
        }
        next = retries_run(cl);
    }
    return NULL;
}

/* ---- public --------------------------------------------------------------------------- */

static int addr_ok(const char *a)
{
    if (strstr(a, ":///") != NULL || strncmp(a, "ipv4:", 5) == 0 ||
        strncmp(a, "ipv6:", 5) == 0 || strncmp(a, "unix:", 5) == 0)
        return 1; /* a gRPC target URI, taken as given */
    const char *colon = strrchr(a, ':');
    if (colon == NULL || colon == a || colon[1] == '\0')
        return 0;
    long port = 0;
    for (const char *p = colon + 1; *p; p++) {
        if (!isdigit((unsigned char)*p) || port > 65535)
            return 0;
        port = port * 10 + (*p - '0');
    }
    return port >= 1 && port <= 65535;
}

pst_status rpc_client_init(rpc_client **out, const rpc_client_config *cfg)
{
    *out = NULL;
    if (cfg == NULL || cfg->num_servers <= 0 || cfg->servers == NULL)
        return pst_error_set(PST_ERR_INVALID, "rpc client: no server addresses");
    for (int i = 0; i < cfg->num_servers; i++)
        if (cfg->servers[i] == NULL || !addr_ok(cfg->servers[i]))
            return pst_error_set(PST_ERR_INVALID,
                                 "rpc client: server %d address '%s' is not host:port "
                                 "(e.g. 10.0.0.5:6174)",
                                 i, cfg->servers[i] != NULL ? cfg->servers[i] : "(null)");
    int nthreads = cfg->threads == 0 ? 2 : cfg->threads;
    if (nthreads < 1 || nthreads > CL_MAX_THREADS || cfg->call_timeout_ms < 0)
        return pst_error_set(PST_ERR_INVALID,
                             "rpc client: threads %d (1..%d, 0 for 2), call timeout %d ms",
                             cfg->threads, CL_MAX_THREADS, cfg->call_timeout_ms);
    rpc_client *cl = calloc(1, sizeof(*cl));
    if (cl == NULL)
        return pst_error_set(PST_ERR_NOMEM, "rpc client");
    LIST_INIT(&cl->active);
    pthread_mutex_init(&cl->mu, NULL);
    pthread_cond_init(&cl->cv, NULL);
    cl->call_timeout_ms = cfg->call_timeout_ms == 0 ? 60000 : cfg->call_timeout_ms;
    cl->connect_timeout_ms = cfg->connect_timeout_ms == 0 ? 30000 : cfg->connect_timeout_ms;
    if (cfg->token && cfg->token[0]) {
        char *v = malloc(strlen(cfg->token) + 8);
        if (v == NULL) {
            free(cl);
            return pst_error_set(PST_ERR_NOMEM, "rpc client");
        }
        sprintf(v, "Bearer %s", cfg->token);
        cl->auth.key = grpc_slice_from_static_string("authorization");
        cl->auth.value = grpc_slice_from_copied_string(v);
        cl->has_auth = 1;
        free(v);
    }
    cl->addrs = calloc((size_t)cfg->num_servers, sizeof(*cl->addrs));
    cl->labels = calloc((size_t)cfg->num_servers, sizeof(*cl->labels));
    cl->chans = calloc((size_t)cfg->num_servers * CL_LANES, sizeof(*cl->chans));
    cl->reg = calloc((size_t)cfg->num_servers * CL_LANES, sizeof(*cl->reg));
    cl->gone = calloc((size_t)cfg->num_servers, sizeof(*cl->gone));
    if (cl->addrs == NULL || cl->labels == NULL || cl->chans == NULL || cl->reg == NULL ||
        cl->gone == NULL)
        goto nomem;
    cl->nservers = cfg->num_servers;
    for (int i = 0; i < cl->nservers; i++) {
        cl->addrs[i] = strdup(cfg->servers[i]);
        const char *name = cfg->names && cfg->names[i] ? cfg->names[i] : "pserver";
        const size_t n = strlen(name) + strlen(cfg->servers[i]) + 2;
        if (cl->addrs[i] == NULL || (cl->labels[i] = malloc(n)) == NULL)
            goto nomem;
        snprintf(cl->labels[i], n, "%s %s", name, cfg->servers[i]);
    }

    grpc_arg args[16]; /* ours, the keepalive ones, RPC_BULK_ARGS and the lane */
    memset(args, 0, sizeof(args));
    static const rpc_int_arg iargs[7] = {
        {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1},
        {GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, -1},
        {GRPC_ARG_ENABLE_RETRIES, 0},
        {GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, CL_BACKOFF_FIRST_MS},
        {GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, CL_BACKOFF_MAX_MS},
        {GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, CL_BACKOFF_MAX_MS},
        {GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1},
    };
    size_t nargs = rpc_int_args(args, iargs, 7);
    if (cfg->keepalive_ms > 0) { /* a server that stops answering is found by its pings */
        const rpc_int_arg ka[] = {{GRPC_ARG_KEEPALIVE_TIME_MS, cfg->keepalive_ms},
                                  {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, cfg->keepalive_ms},
                                  {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1}};
        nargs += rpc_int_args(args + nargs, ka, 3);
    }
    nargs += rpc_bulk_args(args + nargs);
    grpc_channel_credentials *creds = rpc_transport_channel_creds(cfg->transport);
    cl->tls = strcmp(rpc_transport_name(cfg->transport), "insecure") != 0;
    /* One channel (TCP connection) per server and lane: the lane in the args as well, so
     * that no subchannel pool can ever merge the two. */
    args[nargs].type = GRPC_ARG_INTEGER;
    args[nargs].key = (char *)"pstrain.lane";
    grpc_arg *lane_arg = &args[nargs++];
    grpc_channel_args cargs = {nargs, args};
    for (int i = 0; i < cl->nservers * CL_LANES; i++) {
        lane_arg->value.integer = i % CL_LANES;
        cl->chans[i] = grpc_channel_create(cl->addrs[i / CL_LANES], creds, &cargs);
        for (int m = 0; m < RPC_METHOD_COUNT_; m++)
            cl->reg[i][m] = grpc_channel_register_call(cl->chans[i], rpc_method_path(m), NULL,
                                                       NULL);
    }
    grpc_channel_credentials_release(creds);
    cl->cq = grpc_completion_queue_create_for_next(NULL);
    for (int i = 0; i < nthreads; i++) {
        if (pthread_create(&cl->threads[i], NULL, client_thread, cl) != 0) {
            rpc_client_free(cl);
            return pst_error_set(PST_ERR_NOMEM, "rpc client: cannot start thread %d of %d",
                                 i, nthreads);
        }
        cl->nthreads++;
    }
    *out = cl;
    return PST_OK;

nomem:
    rpc_client_free(cl);
    return pst_error_set(PST_ERR_NOMEM, "rpc client for %d servers", cfg->num_servers);
}

void rpc_client_give_up(rpc_client *cl, int server, const char *why)
{
    if (server < 0 || server >= cl->nservers)
        return;
    char *w = strdup(why && why[0] ? why : "given up");
    pthread_mutex_lock(&cl->mu);
    if (!cl->gone[server] && w) {
        cl->gone[server] = w;
        w = NULL;
    }
    /* Calls in flight to it would wait for their deadline (a silent server keeps the
     * connection open): cancelled as unavailable, they end now with `why`. */
    struct cl_call *c;
    LIST_FOREACH(c, &cl->active, link)
        if (c->server == server && c->gcall != NULL)
            grpc_call_cancel_with_status(c->gcall, GRPC_STATUS_UNAVAILABLE, "given up", NULL);
    pthread_mutex_unlock(&cl->mu);
    free(w);
}

int rpc_client_num_servers(const rpc_client *cl)
{
    return cl->nservers;
}

const char *rpc_client_server(const rpc_client *cl, int i)
{
    return i >= 0 && i < cl->nservers ? cl->addrs[i] : NULL;
}

/* rpc_client_call_async, plus `keep` for the blocking wrapper. */
static pst_status call_start(rpc_client *cl, int server, rpc_method method,
                             const ProtobufCMessage *request, const void *payload,
                             size_t bytes, rpc_release_fn release, rpc_done_fn done,
                             void *arg, rpc_message **keep)
{
    pst_status st;
    if (server < 0 || server >= cl->nservers) {
        st = pst_error_set(PST_ERR_INVALID, "rpc client: server index %d (have %d servers)",
                           server, cl->nservers);
        goto fail;
    }
    if ((unsigned)method >= RPC_METHOD_COUNT_ || done == NULL ||
        (bytes > 0 && payload == NULL)) {
        st = pst_error_set(PST_ERR_INVALID,
                           "rpc client: method %d, done callback or payload missing",
                           (int)method);
        goto fail;
    }
    if (request == NULL || request->descriptor != rpc_method_request_desc(method)) {
        st = pst_error_set(PST_ERR_INVALID, "rpc client: %s request must be a %s, not %s",
                           rpc_method_name(method), rpc_method_request_desc(method)->name,
                           request != NULL ? request->descriptor->name : "NULL");
        goto fail;
    }
    struct cl_call *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        st = pst_error_set(PST_ERR_NOMEM, "rpc client: call");
        goto fail;
    }
    st = rpc_wire_header_slice(request, &c->header);
    if (st != PST_OK) {
        free(c);
        goto fail;
    }
    if (bytes > 0) {
        c->payload = rpc_wire_payload_slice(payload, bytes, release, arg);
        c->has_payload = 1;
    } else if (release != NULL) {
        release(arg);
    }
    c->cl = cl;
    c->server = server;
    c->method = method;
    c->done = done;
    c->arg = arg;
    c->keep = keep;
    pthread_mutex_lock(&cl->mu);
    LIST_INSERT_HEAD(&cl->active, c, link);
    cl->nactive++;
    pthread_mutex_unlock(&cl->mu);
    st = attempt_start(c);
    if (st != PST_OK)
        call_drop(c); /* releases the payload */
    return st;

fail:
    if (release != NULL)
        release(arg);
    return st;
}

pst_status rpc_client_call_async(rpc_client *cl, int server, rpc_method method,
                                 const ProtobufCMessage *request, const void *payload,
                                 size_t bytes, rpc_release_fn release, rpc_done_fn done,
                                 void *arg)
{
    return call_start(cl, server, method, request, payload, bytes, release, done, arg, NULL);
}

struct sync_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, released;
    pst_status st;
    char detail[CL_DETAIL];
    rpc_message *msg; /* set by call_finish through `keep` */
};

static void sync_release(void *arg)
{
    struct sync_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->released = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void sync_done(void *arg, pst_status st, const char *detail,
                      const ProtobufCMessage *reply, const rpc_payload *payload)
{
    (void)reply;
    (void)payload;
    struct sync_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->st = st;
    snprintf(w->detail, sizeof(w->detail), "%s", detail);
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

pst_status rpc_client_call(rpc_client *cl, int server, rpc_method method,
                           const ProtobufCMessage *request, const void *payload, size_t bytes,
                           rpc_message **reply)
{
    *reply = NULL;
    struct sync_wait w;
    memset(&w, 0, sizeof(w));
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    pst_status st = call_start(cl, server, method, request, payload, bytes, sync_release,
                               sync_done, &w, &w.msg);
    if (st == PST_OK) {
        pthread_mutex_lock(&w.mu);
        while (!(w.done && w.released))
            pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        st = w.st;
        if (st == PST_OK)
            *reply = w.msg;
        else
            pst_error_set(st, "%s", w.detail);
    }
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return st;
}

void rpc_client_free(rpc_client *cl)
{
    if (cl == NULL)
        return;
    pthread_mutex_lock(&cl->mu);
    cl->closing = 1;
    struct cl_call *c;
    LIST_FOREACH(c, &cl->active, link)
        if (c->gcall != NULL)
            grpc_call_cancel(c->gcall, NULL);
    struct cl_call *waiting = cl->waiting;
    cl->waiting = NULL;
    pthread_mutex_unlock(&cl->mu);
    while (waiting != NULL) {
        struct cl_call *c = waiting;
        waiting = c->wnext;
        char detail[CL_DETAIL];
        snprintf(detail, sizeof(detail), "%s %s: client shutting down during retries",
                 cl->labels[c->server], rpc_method_name(c->method));
        call_finish(c, PST_ERR_STATE, detail, NULL);
    }
    pthread_mutex_lock(&cl->mu);
    while (cl->nactive > 0)
        pthread_cond_wait(&cl->cv, &cl->mu);
    pthread_mutex_unlock(&cl->mu);
    if (cl->cq != NULL) {
        grpc_completion_queue_shutdown(cl->cq);
        for (int i = 0; i < cl->nthreads; i++)
            pthread_join(cl->threads[i], NULL);
        if (cl->nthreads == 0)
            while (grpc_completion_queue_next(cl->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
                       .type != GRPC_QUEUE_SHUTDOWN)
                ;
        grpc_completion_queue_destroy(cl->cq);
    }
    for (int i = 0; cl->chans != NULL && i < cl->nservers * CL_LANES; i++)
        if (cl->chans[i] != NULL)
            grpc_channel_destroy(cl->chans[i]);
    for (int i = 0; i < cl->nservers; i++) {
        if (cl->addrs != NULL)
            free(cl->addrs[i]);
        if (cl->labels != NULL)
            free(cl->labels[i]);
        if (cl->gone != NULL)
            free(cl->gone[i]);
    }
    if (cl->has_auth)
        grpc_slice_unref(cl->auth.value);
    PST_FREE_ALL(cl->chans, cl->addrs, cl->labels, cl->reg, cl->gone);
    pthread_cond_destroy(&cl->cv);
    pthread_mutex_destroy(&cl->mu);
    free(cl);
}
