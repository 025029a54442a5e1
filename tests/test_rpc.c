/* test_rpc.c — rpc/: framing (no network), then server and client over loopback.
 *
 * criterion runs every test in a forked process, and gRPC must not be initialized before
 * a fork. A test that needs a server therefore forks FIRST: the child initializes gRPC,
 * runs an rpc_server with the test handlers below and reports its bound port through a
 * pipe; only then does the parent initialize gRPC and run clients. The child exits when a
 * Finish call arrives, dies with its parent (PR_SET_PDEATHSIG) and after an alarm(), so
 * nothing outlives a failed test. Addresses: 127.0.0.1, port 0 only.
 *
 * Test handlers (child): Init replies version = total_params (trainer_id 999: the number
 * of deferred calls found cancelled when answered), or fails with status
 * trainer_id - 1000 for trainer_id >= 1000; Push echoes its payload (checking it against
 * dtype/length when length != 0); Pull is deferred: a separate thread answers it after
 * `version` milliseconds with PULL_LEN elements of pull_value(block, i) in the requested
 * dtype; Finish replies, then the child shuts down (failing pending calls) and exits 0. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include "common/dtype.h"
#include "common/dtype_math.h"
#include "common/memory.h"
#include "rpc/client.h"
#include "rpc/global.h"
#include "rpc/server.h"
#include "rpc/shm.h"
#include "rpc/wire.h"
#include "tests/raw_call.h"

#define PULL_LEN 4096

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Exact in f16 and bf16: multiples of 0.5 with at most 7 significant bits. */
static float pull_value(uint32_t block, size_t i)
{
    return (float)((i % 64) + block % 64) * 0.5f;
}

/* ==== the child server ================================================================= */

struct pending {
    rpc_call *call;
    double due;
    struct pending *next;
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct pending *q;
    int stop;
    int finish;
    atomic_int cancelled_seen; /* deferred calls found cancelled when answered */
} child;

static void reply_pull(rpc_call *call)
{
    const Pstrain__PullRequest *req = (const Pstrain__PullRequest *)rpc_call_request(call);
    pst_dtype dt;
    if (rpc_dtype_from_wire(req->dtype, &dt) != PST_OK) {
        rpc_call_fail(call, PST_ERR_INVALID, "pull dtype %d", (int)req->dtype);
        return;
    }
    float *f = malloc(PULL_LEN * sizeof(float));
    void *buf = malloc(PULL_LEN * pst_dtype_size(dt));
    for (size_t i = 0; i < PULL_LEN; i++)
        f[i] = pull_value(req->block, i);
    pst_cast(buf, dt, f, PST_F32, PULL_LEN);
    free(f);
    Pstrain__PullReply rep = PSTRAIN__PULL_REPLY__INIT;
    rep.block = req->block;
    rep.version = req->version;
    rep.dtype = req->dtype;
    rep.length = PULL_LEN;
    /* After a shutdown-time failure this returns PST_ERR_STATE and frees buf: fine. */
    rpc_call_reply(call, &rep.base, buf, PULL_LEN * pst_dtype_size(dt), free, buf);
}

/* Answers deferred pulls when they are due; at stop, answers whatever is left. */
static void *releaser(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&child.mu);
    for (;;) {
        struct pending **best = NULL;
        for (struct pending **pp = &child.q; *pp != NULL; pp = &(*pp)->next)
            if (best == NULL || (*pp)->due < (*best)->due)
                best = pp;
        if (best == NULL && child.stop)
            break;
        if (best != NULL && (child.stop || (*best)->due <= now_s())) {
            struct pending *p = *best;
            *best = p->next;
            pthread_mutex_unlock(&child.mu);
            if (rpc_call_cancelled(p->call))
                atomic_fetch_add(&child.cancelled_seen, 1);
            reply_pull(p->call);
            free(p);
            pthread_mutex_lock(&child.mu);
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double wait = best != NULL ? (*best)->due - now_s() : 1.0;
        long ns = until.tv_nsec + (long)(wait * 1e9);
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&child.cv, &child.mu, &until);
    }
    pthread_mutex_unlock(&child.mu);
    return NULL;
}

static void child_handler(void *arg, rpc_call *call)
{
    (void)arg;
    switch (rpc_call_method(call)) {
    case RPC_METHOD_INIT: {
        const Pstrain__InitRequest *req = (const Pstrain__InitRequest *)rpc_call_request(call);
        if (req->trainer_id >= 1000) {
            pst_status st = (pst_status)(req->trainer_id - 1000);
            rpc_call_fail(call, st, "marked failure %d (%s)", (int)st, pst_strerror(st));
            return;
        }
        Pstrain__InitReply rep = PSTRAIN__INIT_REPLY__INIT;
        rep.version = req->trainer_id == 999 ? atomic_load(&child.cancelled_seen)
                                             : (int64_t)req->total_params;
        rpc_call_reply(call, &rep.base, NULL, 0, NULL, NULL);
        if (req->trainer_id == 998) {
            /* server.h: the call stays readable until the handler returns, even once
             * another server thread has finished sending its reply (what a pserver's Pull
             * answered at once does next). Under TSan a freed call is reported here. */
            usleep(200000);
            (void)rpc_call_cancelled(call);
            rpc_call_set_owner(call, NULL);
        }
        return;
    }
    case RPC_METHOD_PUSH: {
        const Pstrain__PushRequest *req = (const Pstrain__PushRequest *)rpc_call_request(call);
        const rpc_payload *p = rpc_call_payload(call);
        pst_dtype dt;
        if (req->length != 0 && (rpc_dtype_from_wire(req->dtype, &dt) != PST_OK ||
                                 rpc_payload_check(p, dt, req->length) != PST_OK)) {
            rpc_call_fail(call, PST_ERR_INVALID, "push: %s", pst_error_detail());
            return;
        }
        void *copy = malloc(p->bytes > 0 ? p->bytes : 1);
        rpc_payload_read(p, 0, copy, p->bytes);
        Pstrain__PushReply rep = PSTRAIN__PUSH_REPLY__INIT;
        rep.duplicate = req->step % 2 != 0;
        rpc_call_reply(call, &rep.base, copy, p->bytes, free, copy);
        return;
    }
    case RPC_METHOD_PULL: {
        const Pstrain__PullRequest *req = (const Pstrain__PullRequest *)rpc_call_request(call);
        struct pending *p = malloc(sizeof(*p));
        p->call = call;
        p->due = now_s() + (double)req->version / 1000.0;
        pthread_mutex_lock(&child.mu);
        p->next = child.q;
        child.q = p;
        pthread_cond_signal(&child.cv);
        pthread_mutex_unlock(&child.mu);
        return;
    }
    case RPC_METHOD_FINISH: {
        Pstrain__FinishReply rep = PSTRAIN__FINISH_REPLY__INIT;
        rpc_call_reply(call, &rep.base, NULL, 0, NULL, NULL);
        pthread_mutex_lock(&child.mu);
        child.finish = 1;
        pthread_cond_broadcast(&child.cv);
        pthread_mutex_unlock(&child.mu);
        return;
    }
    default:
        rpc_call_fail(call, PST_ERR_INTERNAL, "unexpected method");
    }
}

static void child_run(int wfd, int threads)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(50);
    rpc_global_init();
    pthread_mutex_init(&child.mu, NULL);
    pthread_cond_init(&child.cv, NULL);
    pthread_t rel;
    pthread_create(&rel, NULL, releaser, NULL);
    rpc_server *srv;
    rpc_server_config cfg = {.bind = "127.0.0.1:0", .threads = threads,
                             .handler = child_handler};
    int port = -1;
    if (rpc_server_init(&srv, &cfg) != PST_OK) {
        fprintf(stderr, "child: %s\n", pst_error_detail());
        (void)!write(wfd, &port, sizeof(port));
        _exit(2);
    }
    port = rpc_server_port(srv);
    (void)!write(wfd, &port, sizeof(port));
    close(wfd);
    pthread_mutex_lock(&child.mu);
    while (!child.finish)
        pthread_cond_wait(&child.cv, &child.mu);
    pthread_mutex_unlock(&child.mu);
    rpc_server_shutdown(srv, 1);
    pthread_mutex_lock(&child.mu);
    child.stop = 1;
    pthread_cond_broadcast(&child.cv);
    pthread_mutex_unlock(&child.mu);
    pthread_join(rel, NULL);
    rpc_server_free(srv);
    rpc_global_shutdown();
    _exit(0);
}

/* ==== parent helpers =================================================================== */

typedef struct server_proc {
    pid_t pid;
    int port;
    char addr[32];
} server_proc;

/* Forks the server child, reads its port, then initializes gRPC in this process. */
static server_proc spawn_server(int threads)
{
    server_proc sp;
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    sp.pid = fork();
    cr_assert_geq(sp.pid, 0);
    if (sp.pid == 0) {
        close(fds[0]);
        child_run(fds[1], threads);
    }
    close(fds[1]);
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    cr_assert_eq(poll(&pfd, 1, 10000), 1, "server child did not report its port");
    cr_assert_eq(read(fds[0], &sp.port, sizeof(sp.port)), (ssize_t)sizeof(sp.port));
    close(fds[0]);
    cr_assert_gt(sp.port, 0, "server child failed to start");
    snprintf(sp.addr, sizeof(sp.addr), "127.0.0.1:%d", sp.port);
    rpc_global_init();
    return sp;
}

/* Waits up to `secs` for the child; kills it when it overstays. Returns its exit code,
 * or -1 when it had to be killed or died of a signal. */
static int reap(server_proc *sp, double secs)
{
    double end = now_s() + secs;
    int status;
    for (;;) {
        pid_t r = waitpid(sp->pid, &status, WNOHANG);
        if (r == sp->pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (now_s() > end) {
            kill(sp->pid, SIGKILL);
            waitpid(sp->pid, &status, 0);
            return -1;
        }
        usleep(10000);
    }
}

static rpc_client *connect_to(const server_proc *sp, int call_timeout_ms,
                              int connect_timeout_ms)
{
    const char *addrs[1] = {sp->addr};
    rpc_client_config cfg = {.servers = addrs, .num_servers = 1,
                             .call_timeout_ms = call_timeout_ms,
                             .connect_timeout_ms = connect_timeout_ms};
    rpc_client *cl;
    cr_assert_eq(rpc_client_init(&cl, &cfg), PST_OK, "%s", pst_error_detail());
    return cl;
}

/* Sends Finish, frees the client, expects the child to exit 0 (clean shutdown). */
static void finish_server(server_proc *sp, rpc_client *cl)
{
    Pstrain__FinishRequest req = PSTRAIN__FINISH_REQUEST__INIT;
    rpc_message *rep = NULL;
    pst_status st = rpc_client_call(cl, 0, RPC_METHOD_FINISH, &req.base, NULL, 0, &rep);
    rpc_message_free(rep);
    rpc_client_free(cl);
    int code = reap(sp, 15);
    rpc_global_shutdown();
    cr_assert_eq(st, PST_OK, "finish: %s", pst_error_detail());
    cr_assert_eq(code, 0, "server child exit code %d", code);
}

static pst_status call_init(rpc_client *cl, uint32_t trainer_id, uint64_t total,
                            int64_t *version)
{
    Pstrain__InitRequest req = PSTRAIN__INIT_REQUEST__INIT;
    req.trainer_id = trainer_id;
    req.total_params = total;
    rpc_message *rep = NULL;
    pst_status st = rpc_client_call(cl, 0, RPC_METHOD_INIT, &req.base, NULL, 0, &rep);
    if (st == PST_OK && version != NULL)
        *version = ((const Pstrain__InitReply *)rpc_message_header(rep))->version;
    rpc_message_free(rep);
    return st;
}

/* A body with the framing done by hand: [len][header bytes][payload]. */
static size_t frame(uint8_t *out, uint32_t hlen_claimed, const void *hdr, size_t hlen,
                    const void *payload, size_t plen)
{
    out[0] = (uint8_t)hlen_claimed;
    out[1] = (uint8_t)(hlen_claimed >> 8);
    out[2] = (uint8_t)(hlen_claimed >> 16);
    out[3] = (uint8_t)(hlen_claimed >> 24);
    memcpy(out + 4, hdr, hlen);
    memcpy(out + 4 + hlen, payload, plen);
    return 4 + hlen + plen;
}

/* ==== framing, no network ============================================================== */

static atomic_int released;
static void count_release(void *arg)
{
    (void)arg;
    atomic_fetch_add(&released, 1);
}

/* Flattens a byte buffer into malloc'd memory. */
static uint8_t *flatten(grpc_byte_buffer *bb, size_t *len)
{
    grpc_byte_buffer_reader r;
    cr_assert(grpc_byte_buffer_reader_init(&r, bb));
    grpc_slice all = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    *len = GRPC_SLICE_LENGTH(all);
    uint8_t *out = malloc(*len);
    memcpy(out, GRPC_SLICE_START_PTR(all), *len);
    grpc_slice_unref(all);
    return out;
}

/* Cuts `body` into slices of `chunk` bytes (the last shorter). */
static grpc_byte_buffer *cut(const uint8_t *body, size_t len, size_t chunk)
{
    size_t n = len == 0 ? 0 : (len + chunk - 1) / chunk;
    grpc_slice *s = calloc(n + 1, sizeof(*s));
    for (size_t i = 0; i < n; i++) {
        size_t k = len - i * chunk < chunk ? len - i * chunk : chunk;
        s[i] = grpc_slice_from_copied_buffer((const char *)body + i * chunk, k);
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, n);
    for (size_t i = 0; i < n; i++)
        grpc_slice_unref(s[i]);
    free(s);
    return bb;
}

Test(wire, roundtrip_header_straddles_slices)
{
    rpc_global_init();
    enum { N = 1001 };
    float ref[N];
    uint16_t half[N];
    for (int i = 0; i < N; i++)
        ref[i] = (float)(i - 500) * 0.25f;
    pst_cast(half, PST_F16, ref, PST_F32, N);

    Pstrain__PushRequest req = PSTRAIN__PUSH_REQUEST__INIT;
    req.trainer_id = 3;
    req.step = 123456789012LL;
    req.block = 7;
    req.dtype = PSTRAIN__DTYPE__F16;
    req.length = N;
    grpc_byte_buffer *bb;
    atomic_store(&released, 0);
    cr_assert_eq(rpc_wire_encode(&req.base, half, sizeof(half), count_release, NULL, &bb),
                 PST_OK);
    /* Two slices: header (not copied into) and the caller's payload memory itself. */
    cr_assert_eq(bb->data.raw.slice_buffer.count, 2);
    cr_assert_eq(GRPC_SLICE_START_PTR(bb->data.raw.slice_buffer.slices[1]), (uint8_t *)half,
                 "payload slice must reference the caller's memory");
    size_t len;
    uint8_t *body = flatten(bb, &len);
    size_t h = protobuf_c_message_get_packed_size(&req.base);
    cr_assert_eq(len, 4 + h + sizeof(half));
    cr_assert_eq(body[0] | body[1] << 8 | body[2] << 16 | (uint32_t)body[3] << 24, h);
    cr_assert_eq(atomic_load(&released), 0);
    grpc_byte_buffer_destroy(bb);
    cr_assert_eq(atomic_load(&released), 1, "release runs once gRPC drops the payload");

    static const size_t chunks[] = {1, 2, 3, 5, 7, 13, 64, 4096};
    for (size_t k = 0; k < sizeof(chunks) / sizeof(chunks[0]); k++) {
        rpc_message *m;
        cr_assert_eq(rpc_wire_decode(cut(body, len, chunks[k]),
                                     &pstrain__push_request__descriptor, &m),
                     PST_OK, "chunk %zu: %s", chunks[k], pst_error_detail());
        const Pstrain__PushRequest *got = (const Pstrain__PushRequest *)rpc_message_header(m);
        cr_assert_eq(got->trainer_id, 3);
        cr_assert_eq(got->step, 123456789012LL);
        cr_assert_eq(got->block, 7);
        cr_assert_eq(got->dtype, PSTRAIN__DTYPE__F16);
        cr_assert_eq(got->length, N);
        const rpc_payload *p = rpc_message_payload(m);
        cr_assert_eq(p->offset, 4 + h);
        cr_assert_eq(p->bytes, sizeof(half));
        cr_assert_eq(rpc_payload_check(p, PST_F16, N), PST_OK);
        uint16_t raw[N];
        cr_assert_eq(rpc_payload_read(p, 0, raw, sizeof(raw)), PST_OK);
        cr_assert_eq(memcmp(raw, half, sizeof(half)), 0, "chunk %zu", chunks[k]);
        float f[N];
        cr_assert_eq(rpc_payload_read_f32(p, PST_F16, 0, f, N), PST_OK);
        cr_assert_eq(memcmp(f, ref, sizeof(ref)), 0, "chunk %zu: f16 -> f32", chunks[k]);
        float part[17];
        cr_assert_eq(rpc_payload_read_f32(p, PST_F16, 3, part, 17), PST_OK);
        cr_assert_eq(memcmp(part, ref + 3, sizeof(part)), 0);
        cr_assert_eq(rpc_payload_read(p, 5, raw, 3), PST_OK); /* odd offset, odd size */
        cr_assert_eq(memcmp(raw, (const uint8_t *)half + 5, 3), 0);
        rpc_message_free(m);
    }
    free(body);

    /* f32 payload read as f32, header cut by every possible slice size. */
    float vals[100];
    for (int i = 0; i < 100; i++)
        vals[i] = (float)i * 1.5f;
    Pstrain__PullReply rep = PSTRAIN__PULL_REPLY__INIT;
    rep.block = 70000;
    rep.version = -5;
    rep.length = 100;
    cr_assert_eq(rpc_wire_encode(&rep.base, vals, sizeof(vals), NULL, NULL, &bb), PST_OK);
    body = flatten(bb, &len);
    grpc_byte_buffer_destroy(bb);
    for (size_t chunk = 1; chunk <= 20; chunk++) {
        rpc_message *m;
        cr_assert_eq(rpc_wire_decode(cut(body, len, chunk), &pstrain__pull_reply__descriptor,
                                     &m),
                     PST_OK);
        const Pstrain__PullReply *got = (const Pstrain__PullReply *)rpc_message_header(m);
        cr_assert_eq(got->block, 70000);
        cr_assert_eq(got->version, -5);
        float f[100];
        cr_assert_eq(rpc_payload_read_f32(rpc_message_payload(m), PST_F32, 0, f, 100), PST_OK);
        cr_assert_eq(memcmp(f, vals, sizeof(f)), 0);
        rpc_message_free(m);
    }
    free(body);
    rpc_global_shutdown();
}

/* pst_copy_stream is memcpy at every size and alignment (head, vector body, tail), and a
 * payload read of PST_COPY_STREAM_MIN bytes or more (streamed, slice by slice) gives the
 * payload's bytes at any slice cut and destination alignment. */
Test(wire, large_payload_reads_stream_the_same_bytes)
{
    enum { MAX = (4 << 20) + 4096 };
    uint8_t *src = malloc(MAX + 64), *dst = malloc(MAX + 64), *want = malloc(MAX + 64);
    cr_assert(src && dst && want);
    for (size_t i = 0; i < MAX + 64; i++)
        src[i] = (uint8_t)(i * 131 + (i >> 9));
    static const size_t sizes[] = {0, 1, 15, 16, 63, 64, 65, 255, 256, 257, 4099, MAX};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        for (size_t so = 0; so < 3; so++) {
            for (size_t d = 0; d < 70; d += 7) {
                memset(dst, 0xa5, MAX + 64);
                memcpy(want, dst, MAX + 64);
                memcpy(want + d, src + so, sizes[k]);
                pst_copy_stream(dst + d, src + so, sizes[k]);
                cr_assert(memcmp(dst, want, MAX + 64) == 0, "size %zu, src +%zu, dst +%zu",
                          sizes[k], so, d);
            }
        }
    }
    free(want);

    rpc_global_init();
    enum { N = (5 << 20) / 4 + 1001 }; /* f32 elements: over PST_COPY_STREAM_MIN */
    float *vals = malloc(N * sizeof(float)), *got = malloc((N + 1) * sizeof(float));
    cr_assert(vals && got);
    for (int i = 0; i < N; i++)
        vals[i] = (float)i * 0.5f - 7.0f;
    Pstrain__PullReply rep = PSTRAIN__PULL_REPLY__INIT;
    rep.block = 5;
    rep.length = N;
    grpc_byte_buffer *bb;
    cr_assert_eq(rpc_wire_encode(&rep.base, vals, N * sizeof(float), NULL, NULL, &bb), PST_OK);
    size_t len;
    uint8_t *body = flatten(bb, &len);
    grpc_byte_buffer_destroy(bb);
    static const size_t chunks[] = {(1 << 20) + 3, 4 << 20, 65537};
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        rpc_message *m;
        cr_assert_eq(rpc_wire_decode(cut(body, len, chunks[k]), &pstrain__pull_reply__descriptor,
                                     &m), PST_OK);
        float *at = got + k % 2; /* 16-byte aligned, and not */
        cr_assert_eq(rpc_payload_read_f32(rpc_message_payload(m), PST_F32, 0, at, N), PST_OK);
        cr_assert(memcmp(at, vals, N * sizeof(float)) == 0, "chunk %zu", chunks[k]);
        rpc_message_free(m);
    }
    free(body);
    free(vals);
    free(got);
    free(src);
    free(dst);
    rpc_global_shutdown();
}

/* A payload kept out of its message outlives it, in the slices it came in: the message
 * keeps its header and reads an empty payload; a message without a payload keeps none. */
Test(wire, a_kept_payload_outlives_its_message)
{
    rpc_global_init();
    float vals[300];
    for (int i = 0; i < 300; i++)
        vals[i] = (float)i - 0.25f;
    Pstrain__PushRequest req = PSTRAIN__PUSH_REQUEST__INIT;
    req.block = 9;
    req.length = 300;
    grpc_byte_buffer *bb;
    cr_assert_eq(rpc_wire_encode(&req.base, vals, sizeof vals, NULL, NULL, &bb), PST_OK);
    size_t len;
    uint8_t *body = flatten(bb, &len);
    grpc_byte_buffer_destroy(bb);
    rpc_message *m;
    cr_assert_eq(rpc_wire_decode(cut(body, len, 97), &pstrain__push_request__descriptor, &m),
                 PST_OK);
    rpc_kept_payload *k = rpc_message_keep_payload(m);
    cr_assert_not_null(k);
    cr_assert_eq(rpc_message_payload(m)->bytes, 0);
    cr_assert_eq(((const Pstrain__PushRequest *)rpc_message_header(m))->block, 9);
    cr_assert_null(rpc_message_keep_payload(m), "the payload is kept once");
    rpc_message_free(m);
    float back[300];
    cr_assert_eq(rpc_payload_read_f32(rpc_kept_payload_view(k), PST_F32, 0, back, 300), PST_OK);
    cr_assert(memcmp(back, vals, sizeof vals) == 0);
    rpc_kept_payload_free(k);
    rpc_kept_payload_free(NULL);
    free(body);

    cr_assert_eq(rpc_wire_encode(&req.base, NULL, 0, NULL, NULL, &bb), PST_OK);
    body = flatten(bb, &len);
    grpc_byte_buffer_destroy(bb);
    cr_assert_eq(rpc_wire_decode(cut(body, len, 5), &pstrain__push_request__descriptor, &m),
                 PST_OK);
    cr_assert_null(rpc_message_keep_payload(m));
    rpc_message_free(m);
    free(body);
    rpc_global_shutdown();
}

Test(wire, bad_framing_is_format_error)
{
    rpc_global_init();
    rpc_message *m = (rpc_message *)1;
    cr_assert_eq(rpc_wire_decode(NULL, &pstrain__push_request__descriptor, &m),
                 PST_ERR_FORMAT);
    cr_assert_null(m);

    uint8_t b[64];
    cr_assert_eq(rpc_wire_decode(cut((const uint8_t *)"\x01\x00\x00", 3, 1),
                                 &pstrain__push_request__descriptor, &m),
                 PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "shorter") != NULL, "%s", pst_error_detail());

    size_t n = frame(b, 1000, "\x08\x01", 2, "abcd", 4);
    cr_assert_eq(rpc_wire_decode(cut(b, n, 1), &pstrain__push_request__descriptor, &m),
                 PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "header length 1000") != NULL, "%s",
              pst_error_detail());

    n = frame(b, 0xffffffffu, "", 0, "abcd", 4);
    cr_assert_eq(rpc_wire_decode(cut(b, n, 3), &pstrain__push_request__descriptor, &m),
                 PST_ERR_FORMAT);

    n = frame(b, 3, "\xff\xff\xff", 3, "", 0);
    cr_assert_eq(rpc_wire_decode(cut(b, n, 2), &pstrain__push_request__descriptor, &m),
                 PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "not a valid protobuf") != NULL, "%s",
              pst_error_detail());

    /* Header filling the whole body: valid, empty payload. Empty header: valid too. */
    n = frame(b, 2, "\x08\x09", 2, "", 0);
    cr_assert_eq(rpc_wire_decode(cut(b, n, 1), &pstrain__push_request__descriptor, &m), PST_OK);
    cr_assert_eq(((const Pstrain__PushRequest *)rpc_message_header(m))->trainer_id, 9);
    cr_assert_eq(rpc_message_payload(m)->bytes, 0);
    rpc_message_free(m);
    n = frame(b, 0, "", 0, "xyz", 3);
    cr_assert_eq(rpc_wire_decode(cut(b, n, 4), &pstrain__push_request__descriptor, &m), PST_OK);
    const rpc_payload *p = rpc_message_payload(m);
    cr_assert_eq(p->bytes, 3);
    cr_assert_eq(rpc_payload_check(p, PST_F32, 1), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "3 bytes") != NULL, "%s", pst_error_detail());
    cr_assert_eq(rpc_payload_read(p, 2, b, 2), PST_ERR_INVALID);
    float f;
    cr_assert_eq(rpc_payload_read_f32(p, PST_F16, 1, &f, 1), PST_ERR_INVALID);
    rpc_message_free(m);

    /* A header over RPC_WIRE_MAX_HEADER is refused and the payload released anyway. */
    Pstrain__BlockSpec big = PSTRAIN__BLOCK_SPEC__INIT;
    big.id = UINT32_MAX;
    big.offset = UINT64_MAX;
    big.length = UINT64_MAX;
    enum { NBLK = 600000 }; /* 30 bytes each: > 16 MiB */
    Pstrain__BlockSpec **blocks = malloc(NBLK * sizeof(*blocks));
    for (int i = 0; i < NBLK; i++)
        blocks[i] = &big;
    Pstrain__InitRequest ir = PSTRAIN__INIT_REQUEST__INIT;
    ir.n_blocks = NBLK;
    ir.blocks = blocks;
    grpc_byte_buffer *bb = (grpc_byte_buffer *)1;
    atomic_store(&released, 0);
    cr_assert_eq(rpc_wire_encode(&ir.base, b, 8, count_release, NULL, &bb), PST_ERR_INVALID);
    cr_assert_null(bb);
    cr_assert_eq(atomic_load(&released), 1);
    cr_assert(strstr(pst_error_detail(), "limit") != NULL, "%s", pst_error_detail());
    free(blocks);
    rpc_global_shutdown();
}

Test(wire, status_mapping)
{
    static const struct {
        pst_status st;
        grpc_status_code code;
    } table[] = {
        {PST_OK, GRPC_STATUS_OK},
        {PST_ERR_INVALID, GRPC_STATUS_INVALID_ARGUMENT},
        {PST_ERR_FORMAT, GRPC_STATUS_INVALID_ARGUMENT},
        {PST_ERR_NOT_FOUND, GRPC_STATUS_NOT_FOUND},
        {PST_ERR_MISMATCH, GRPC_STATUS_FAILED_PRECONDITION},
        {PST_ERR_STATE, GRPC_STATUS_FAILED_PRECONDITION},
        {PST_ERR_UNAVAILABLE, GRPC_STATUS_UNAVAILABLE},
        {PST_ERR_TIMEOUT, GRPC_STATUS_DEADLINE_EXCEEDED},
        {PST_ERR_NOMEM, GRPC_STATUS_RESOURCE_EXHAUSTED},
        {PST_ERR_UNSUPPORTED, GRPC_STATUS_UNIMPLEMENTED},
        {PST_ERR_IO, GRPC_STATUS_DATA_LOSS},
        {PST_ERR_INTERNAL, GRPC_STATUS_INTERNAL},
        {PST_ERR_RANGE, GRPC_STATUS_OUT_OF_RANGE},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        cr_assert_eq(rpc_status_to_grpc(table[i].st), table[i].code, "%s",
                     pst_strerror(table[i].st));
    /* Back, for peers that send no pst-status metadata. */
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_OK), PST_OK);
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_INVALID_ARGUMENT), PST_ERR_INVALID);
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_OUT_OF_RANGE), PST_ERR_RANGE);
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_NOT_FOUND), PST_ERR_NOT_FOUND);
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_FAILED_PRECONDITION), PST_ERR_STATE);
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_UNAVAILABLE), PST_ERR_UNAVAILABLE);
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_DEADLINE_EXCEEDED), PST_ERR_TIMEOUT);
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_UNIMPLEMENTED), PST_ERR_UNSUPPORTED);
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_CANCELLED), PST_ERR_STATE);
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_UNKNOWN), PST_ERR_INTERNAL);
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_DATA_LOSS), PST_ERR_IO);
    cr_assert_eq(rpc_status_from_grpc(GRPC_STATUS_RESOURCE_EXHAUSTED), PST_ERR_NOMEM);
    cr_assert_str_eq(rpc_method_path(RPC_METHOD_PULL), "/pstrain.PServer/Pull");
    cr_assert_eq(rpc_method_reply_desc(RPC_METHOD_INIT), &pstrain__init_reply__descriptor);
}

/* Debian's Abseil runs its debugging deadlock detector on every lock gRPC takes unless
 * rpc_global_init turns it off (rpc/global.c): its switch must still be found under the
 * names rpc/ knows, or a new Abseil brings the per-call cost back unseen. */
Test(wire, abseil_deadlock_detector_switched_off)
{
    cr_assert_eq(rpc_global_deadlock_detector_off(), 0, "not before rpc_global_init");
    rpc_global_init();
    cr_assert_eq(rpc_global_deadlock_detector_off(), 1, "Abseil's SetMutexDeadlockDetectionMode "
                 "is not under a name rpc/global.c knows in this build");
    rpc_global_shutdown();
}

/* ==== over loopback ==================================================================== */

Test(rpc, error_status_both_ways, .timeout = 30)
{
    server_proc sp = spawn_server(2);
    rpc_client *cl = connect_to(&sp, 10000, 5000);
    int64_t version = 0;
    cr_assert_eq(call_init(cl, 0, 4242, &version), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(version, 4242);
    /* Every status arrives exactly, with the server's detail and the server's address. */
    for (int st = PST_ERR_INVALID; st < PST_ERR_COUNT_; st++) {
        if (st == PST_ERR_UNAVAILABLE)
            continue; /* retried by design; covered by the shutdown test */
        pst_status got = call_init(cl, 1000 + (uint32_t)st, 0, NULL);
        cr_assert_eq(got, (pst_status)st, "sent %s, got %s", pst_strerror(st),
                     pst_strerror(got));
        char want[64];
        snprintf(want, sizeof(want), "marked failure %d", st);
        cr_assert(strstr(pst_error_detail(), want) != NULL, "%s", pst_error_detail());
        cr_assert(strstr(pst_error_detail(), sp.addr) != NULL, "%s", pst_error_detail());
    }
    /* What a plain gRPC peer sees: the mapped code, the detail, the exact status. */
    Pstrain__InitRequest req = PSTRAIN__INIT_REQUEST__INIT;
    req.trainer_id = 1000 + PST_ERR_MISMATCH;
    grpc_byte_buffer *bb;
    cr_assert_eq(rpc_wire_encode(&req.base, NULL, 0, NULL, NULL, &bb), PST_OK);
    size_t len;
    uint8_t *body = flatten(bb, &len);
    grpc_byte_buffer_destroy(bb);
    raw_result r = raw_call(sp.port, "/pstrain.PServer/Init", body, len, 5000);
    cr_assert_eq(r.code, GRPC_STATUS_FAILED_PRECONDITION);
    cr_assert(strstr(r.detail, "marked failure") != NULL, "%s", r.detail);
    cr_assert_eq(r.pst, PST_ERR_MISMATCH);
    free(body);
    /* A wrongly typed request is refused before anything is sent. */
    Pstrain__PullRequest pr = PSTRAIN__PULL_REQUEST__INIT;
    rpc_message *rep = NULL;
    cr_assert_eq(rpc_client_call(cl, 0, RPC_METHOD_PUSH, &pr.base, NULL, 0, &rep),
                 PST_ERR_INVALID);
    cr_assert_eq(rpc_client_call(cl, 1, RPC_METHOD_PUSH, &pr.base, NULL, 0, &rep),
                 PST_ERR_INVALID);
    finish_server(&sp, cl);
}

Test(rpc, large_payload_roundtrip, .timeout = 40)
{
    server_proc sp = spawn_server(2);
    rpc_client *cl = connect_to(&sp, 30000, 5000);
    size_t n = (64u << 20) / sizeof(uint32_t);
    uint32_t *send = malloc(n * sizeof(uint32_t));
    uint32_t *recv = malloc(n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++)
        send[i] = (uint32_t)i * 2654435761u;
    memset(recv, 0, n * sizeof(uint32_t));
    Pstrain__PushRequest req = PSTRAIN__PUSH_REQUEST__INIT;
    req.step = 2;
    req.dtype = PSTRAIN__DTYPE__F32;
    req.length = n;
    rpc_message *rep = NULL;
    pst_status st = rpc_client_call(cl, 0, RPC_METHOD_PUSH, &req.base, send,
                                    n * sizeof(uint32_t), &rep);
    cr_assert_eq(st, PST_OK, "%s", pst_error_detail());
    cr_assert_eq(((const Pstrain__PushReply *)rpc_message_header(rep))->duplicate, 0);
    const rpc_payload *p = rpc_message_payload(rep);
    cr_assert_eq(p->bytes, n * sizeof(uint32_t));
    cr_assert_gt(p->slices->count, 1, "a 64 MiB reply arrives in many slices");
    cr_assert_eq(rpc_payload_read(p, 0, recv, p->bytes), PST_OK);
    cr_assert_eq(memcmp(send, recv, n * sizeof(uint32_t)), 0, "64 MiB echo differs");
    rpc_message_free(rep);
    free(send);
    free(recv);
    finish_server(&sp, cl);
}

/* ---- many concurrent calls ------------------------------------------------------------ */

struct batch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, released, failed;
    char first_error[512];
};

struct acall {
    struct batch *b;
    rpc_method method;
    uint8_t *send;
    size_t bytes;
    uint8_t *recv;
    uint32_t block;
    pst_dtype dtype;
    float *pulled;
    int ok;
    double t_start, t_done;
};

static void batch_fail(struct batch *b, const char *what)
{
    if (b->failed++ == 0)
        snprintf(b->first_error, sizeof(b->first_error), "%s", what);
}

static void acall_release(void *arg)
{
    struct acall *a = arg;
    pthread_mutex_lock(&a->b->mu);
    a->b->released++;
    pthread_cond_broadcast(&a->b->cv);
    pthread_mutex_unlock(&a->b->mu);
}

static void acall_done(void *arg, pst_status st, const char *detail,
                       const ProtobufCMessage *reply, const rpc_payload *payload)
{
    struct acall *a = arg;
    char err[512] = "";
    a->t_done = now_s();
    if (st != PST_OK) {
        snprintf(err, sizeof(err), "%s: %s", pst_strerror(st), detail);
    } else if (a->method == RPC_METHOD_PUSH) {
        if (payload->bytes != a->bytes || rpc_payload_read(payload, 0, a->recv, a->bytes))
            snprintf(err, sizeof(err), "push echo of %zu bytes, got %zu", a->bytes,
                     payload->bytes);
    } else {
        const Pstrain__PullReply *r = (const Pstrain__PullReply *)reply;
        pst_dtype dt;
        if (r->block != a->block || rpc_dtype_from_wire(r->dtype, &dt) != PST_OK ||
            dt != a->dtype || rpc_payload_check(payload, dt, r->length) != PST_OK ||
            r->length != PULL_LEN ||
            rpc_payload_read_f32(payload, dt, 0, a->pulled, PULL_LEN) != PST_OK)
            snprintf(err, sizeof(err), "pull reply for block %u malformed", a->block);
    }
    pthread_mutex_lock(&a->b->mu);
    a->ok = err[0] == '\0';
    if (!a->ok)
        batch_fail(a->b, err);
    a->b->done++;
    pthread_cond_broadcast(&a->b->cv);
    pthread_mutex_unlock(&a->b->mu);
}

static void batch_wait(struct batch *b, int done, int released, double secs)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)secs;
    pthread_mutex_lock(&b->mu);
    while (b->done < done || b->released < released)
        if (pthread_cond_timedwait(&b->cv, &b->mu, &until) != 0)
            break;
    int d = b->done, r = b->released;
    pthread_mutex_unlock(&b->mu);
    cr_assert_eq(d, done, "only %d of %d calls done", d, done);
    cr_assert_eq(r, released, "only %d of %d payloads released", r, released);
}

static void start_pull(rpc_client *cl, struct acall *a, struct batch *b, uint32_t block,
                       pst_dtype dt, int delay_ms)
{
    memset(a, 0, sizeof(*a));
    a->b = b;
    a->method = RPC_METHOD_PULL;
    a->block = block;
    a->dtype = dt;
    a->pulled = malloc(PULL_LEN * sizeof(float));
    a->t_start = now_s();
    Pstrain__PullRequest req = PSTRAIN__PULL_REQUEST__INIT;
    req.block = block;
    req.version = delay_ms;
    req.dtype = rpc_dtype_to_wire(dt);
    cr_assert_eq(rpc_client_call_async(cl, 0, RPC_METHOD_PULL, &req.base, NULL, 0,
                                       acall_release, acall_done, a),
                 PST_OK, "%s", pst_error_detail());
}

static void check_pull(const struct acall *a)
{
    cr_assert(a->ok);
    for (size_t i = 0; i < PULL_LEN; i++)
        cr_assert_eq(a->pulled[i], pull_value(a->block, i), "block %u [%zu]", a->block, i);
}

Test(rpc, many_concurrent_async_calls, .timeout = 40)
{
    server_proc sp = spawn_server(2);
    rpc_client *cl = connect_to(&sp, 20000, 5000);
    enum { NPUSH = 256, NPULL = 64, BYTES = 64 << 10 };
    struct batch b = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    static struct acall pushes[NPUSH], pulls[NPULL];
    for (int i = 0; i < NPULL; i++) /* deferred, answered by another thread, any order */
        start_pull(cl, &pulls[i], &b, (uint32_t)i, i % 3 == 0 ? PST_F16 : PST_F32,
                   (i * 37) % 200);
    for (int i = 0; i < NPUSH; i++) {
        struct acall *a = &pushes[i];
        a->b = &b;
        a->method = RPC_METHOD_PUSH;
        a->bytes = BYTES - (size_t)i * 4;
        a->send = malloc(a->bytes);
        a->recv = malloc(a->bytes);
        for (size_t k = 0; k < a->bytes; k++)
            a->send[k] = (uint8_t)(k * 31 + (size_t)i * 7);
        Pstrain__PushRequest req = PSTRAIN__PUSH_REQUEST__INIT;
        req.block = (uint32_t)i;
        req.step = i;
        cr_assert_eq(rpc_client_call_async(cl, 0, RPC_METHOD_PUSH, &req.base, a->send,
                                           a->bytes, acall_release, acall_done, a),
                     PST_OK, "%s", pst_error_detail());
    }
    batch_wait(&b, NPUSH + NPULL, NPUSH + NPULL, 30);
    cr_assert_eq(b.failed, 0, "%d failed, first: %s", b.failed, b.first_error);
    for (int i = 0; i < NPUSH; i++) {
        cr_assert_eq(memcmp(pushes[i].send, pushes[i].recv, pushes[i].bytes), 0, "push %d", i);
        free(pushes[i].send);
        free(pushes[i].recv);
    }
    for (int i = 0; i < NPULL; i++) {
        check_pull(&pulls[i]);
        free(pulls[i].pulled);
    }
    finish_server(&sp, cl);
}

Test(rpc, deferred_reply_from_another_thread, .timeout = 30)
{
    server_proc sp = spawn_server(1);
    rpc_client *cl = connect_to(&sp, 10000, 5000);
    struct batch b = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct acall slow, fast;
    start_pull(cl, &slow, &b, 5, PST_BF16, 400);
    start_pull(cl, &fast, &b, 6, PST_F32, 0);
    /* While the slow pull waits, the server (one thread) keeps answering other calls. */
    int64_t version = 0;
    cr_assert_eq(call_init(cl, 0, 77, &version), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(version, 77);
    batch_wait(&b, 2, 2, 10);
    cr_assert_eq(b.failed, 0, "%s", b.first_error);
    check_pull(&slow);
    check_pull(&fast);
    cr_assert_geq(slow.t_done - slow.t_start, 0.35, "answered after %.3f s",
                  slow.t_done - slow.t_start);
    cr_assert_lt(fast.t_done, slow.t_done);
    free(slow.pulled);
    free(fast.pulled);
    finish_server(&sp, cl);
}

/* The handler keeps its call after replying (the server's reference on it until the
 * handler returns): the reply arrives, and the server exits 0 (under the TSan build a use
 * after free would make it exit 66). */
Test(rpc, a_handler_may_read_its_call_after_replying_until_it_returns, .timeout = 30)
{
    server_proc sp = spawn_server(2);
    rpc_client *cl = connect_to(&sp, 10000, 5000);
    for (int i = 0; i < 3; i++) {
        int64_t version = 0;
        cr_assert_eq(call_init(cl, 998, 55, &version), PST_OK, "%s", pst_error_detail());
        cr_assert_eq(version, 55);
    }
    finish_server(&sp, cl);
}

Test(rpc, malformed_request_then_good_call, .timeout = 30)
{
    server_proc sp = spawn_server(2);
    uint8_t b[64];
    size_t n = frame(b, 0x7fffffff, "", 0, "abcdef", 6);
    raw_result r = raw_call(sp.port, "/pstrain.PServer/Push", b, n, 5000);
    cr_assert_eq(r.code, GRPC_STATUS_INVALID_ARGUMENT, "code %d: %s", r.code, r.detail);
    cr_assert(strstr(r.detail, "header length") != NULL, "%s", r.detail);
    cr_assert_eq(r.pst, PST_ERR_FORMAT);
    n = frame(b, 3, "\xff\xff\xff", 3, "", 0);
    r = raw_call(sp.port, "/pstrain.PServer/Pull", b, n, 5000);
    cr_assert_eq(r.code, GRPC_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(r.detail, "not a valid protobuf") != NULL, "%s", r.detail);
    r = raw_call(sp.port, "/pstrain.PServer/Init", "", 0, 5000);
    cr_assert_eq(r.code, GRPC_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(r.detail, "shorter") != NULL, "%s", r.detail);
    /* Header says 10 f32 elements, payload has 9 bytes: the handler's own check. */
    Pstrain__PushRequest pr = PSTRAIN__PUSH_REQUEST__INIT;
    pr.length = 10;
    uint8_t hdr[32];
    size_t hl = protobuf_c_message_pack(&pr.base, hdr);
    n = frame(b, (uint32_t)hl, hdr, hl, "123456789", 9);
    r = raw_call(sp.port, "/pstrain.PServer/Push", b, n, 5000);
    cr_assert_eq(r.code, GRPC_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(r.detail, "9 bytes") != NULL, "%s", r.detail);

    rpc_client *cl = connect_to(&sp, 10000, 5000);
    uint32_t data[256];
    for (int i = 0; i < 256; i++)
        data[i] = (uint32_t)i;
    Pstrain__PushRequest req = PSTRAIN__PUSH_REQUEST__INIT;
    req.length = 256;
    rpc_message *rep = NULL;
    cr_assert_eq(rpc_client_call(cl, 0, RPC_METHOD_PUSH, &req.base, data, sizeof(data), &rep),
                 PST_OK, "%s", pst_error_detail());
    uint32_t back[256];
    cr_assert_eq(rpc_payload_read(rpc_message_payload(rep), 0, back, sizeof(back)), PST_OK);
    cr_assert_eq(memcmp(back, data, sizeof(data)), 0);
    rpc_message_free(rep);
    finish_server(&sp, cl);
}

Test(rpc, unknown_method_is_unimplemented_at_once, .timeout = 30)
{
    server_proc sp = spawn_server(2);
    raw_result r = raw_call(sp.port, "/pstrain.PServer/Nope", "x", 1, 10000);
    cr_assert_eq(r.code, GRPC_STATUS_UNIMPLEMENTED, "code %d: %s", r.code, r.detail);
    cr_assert_lt(r.secs, 2.0, "took %.2f s (deadline 10 s)", r.secs);
    cr_assert(strstr(r.detail, "/pstrain.PServer/Nope") != NULL, "%s", r.detail);
    r = raw_call(sp.port, "/other.Service/Call", "", 0, 10000);
    cr_assert_eq(r.code, GRPC_STATUS_UNIMPLEMENTED);
    cr_assert_lt(r.secs, 2.0);
    rpc_client *cl = connect_to(&sp, 10000, 5000);
    cr_assert_eq(call_init(cl, 0, 1, NULL), PST_OK, "%s", pst_error_detail());
    finish_server(&sp, cl);
}

static int unused_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t al = sizeof(a);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    close(fd); /* nothing listens there now */
    return ntohs(a.sin_port);
}

Test(rpc, no_server_fails_unavailable_after_retry_deadline, .timeout = 30)
{
    int port = unused_port();
    rpc_global_init();
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    const char *addrs[1] = {addr};
    rpc_client_config cfg = {.servers = addrs, .num_servers = 1, .connect_timeout_ms = 1000};
    rpc_client *cl;
    cr_assert_eq(rpc_client_init(&cl, &cfg), PST_OK, "%s", pst_error_detail());
    double t0 = now_s();
    pst_status st = call_init(cl, 0, 1, NULL);
    double secs = now_s() - t0;
    cr_assert_eq(st, PST_ERR_UNAVAILABLE, "%s: %s", pst_strerror(st), pst_error_detail());
    cr_assert(secs > 0.95 && secs < 4.0, "gave up after %.2f s", secs);
    cr_log_info("no server: %s", pst_error_detail());
    cr_assert(strstr(pst_error_detail(), addr) != NULL, "%s", pst_error_detail());
    cr_assert(strstr(pst_error_detail(), " s (") != NULL, "%s", pst_error_detail());
    cr_assert(strchr(pst_error_detail(), '\n') == NULL, "one line: %s", pst_error_detail());
    rpc_client_free(cl);

    /* Bad configurations. */
    const char *bad[1] = {"localhost"};
    cfg.servers = bad;
    cr_assert_eq(rpc_client_init(&cl, &cfg), PST_ERR_INVALID);
    cr_assert_null(cl);
    rpc_server *s;
    rpc_server_config sc = {.bind = "not-an-address", .handler = child_handler};
    cr_assert_eq(rpc_server_init(&s, &sc), PST_ERR_IO);
    cr_assert(strstr(pst_error_detail(), "not-an-address") != NULL, "%s", pst_error_detail());
    sc.bind = "127.0.0.1:0";
    cr_assert_eq(rpc_server_init(&s, &sc), PST_OK, "%s", pst_error_detail());
    char taken[32];
    snprintf(taken, sizeof(taken), "127.0.0.1:%d", rpc_server_port(s));
    rpc_server *s2;
    sc.bind = taken;
    cr_assert_eq(rpc_server_init(&s2, &sc), PST_ERR_IO, "a taken port must not be shared");
    rpc_server_free(s);
    rpc_global_shutdown();
}

Test(rpc, deadline_on_deferred_call, .timeout = 30)
{
    server_proc sp = spawn_server(2);
    rpc_client *cl = connect_to(&sp, 200, 5000);
    struct batch b = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct acall a;
    double t0 = now_s();
    /* The server answers 2.8 s after the 200 ms deadline: it counts the call as cancelled
     * only if it has heard of the cancellation by then (with 0.5 s, a clean-clone CI run
     * beside the cluster suite answered first, and the count stayed 0). */
    start_pull(cl, &a, &b, 1, PST_F32, 3000);
    pthread_mutex_lock(&b.mu);
    while (b.done < 1)
        pthread_cond_wait(&b.cv, &b.mu);
    pthread_mutex_unlock(&b.mu);
    double secs = now_s() - t0;
    cr_assert_eq(b.failed, 1);
    cr_assert(strstr(b.first_error, pst_strerror(PST_ERR_TIMEOUT)) != NULL, "%s",
              b.first_error);
    cr_assert(strstr(b.first_error, sp.addr) != NULL, "%s", b.first_error);
    cr_assert(strstr(b.first_error, "200 ms") != NULL, "%s", b.first_error);
    /* bounded, and not before the deadline; the upper bound is loose: a loaded machine */
    cr_assert(secs > 0.15 && secs < 3.0, "timed out after %.2f s", secs);
    cr_log_info("deadline: %s", b.first_error);
    free(a.pulled);
    /* The server answers the cancelled call later (reply dropped) and keeps serving. Asked
     * until it has answered it, for up to 10 s. */
    int64_t seen = -1;
    for (int tries = 0; tries < 100 && seen != 1; tries++) {
        usleep(100 * 1000);
        /* this client's 200 ms deadline can pass on a loaded machine (ctest -j2 ran it
         * beside the pipeline suite once): ask again */
        pst_status st = call_init(cl, 999, 0, &seen);
        if (st == PST_ERR_TIMEOUT)
            continue;
        cr_assert_eq(st, PST_OK, "%s", pst_error_detail());
    }
    cr_assert_eq(seen, 1, "the server saw the deferred call cancelled (rpc_call_cancelled)");
    finish_server(&sp, cl);
}

Test(rpc, shutdown_fails_pending_deferred_call, .timeout = 30)
{
    server_proc sp = spawn_server(2);
    rpc_client *cl = connect_to(&sp, 20000, 500);
    /* A pull the server would answer in 20 s: Finish makes it shut down, failing it. */
    struct batch b = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct acall a;
    start_pull(cl, &a, &b, 2, PST_F32, 20000);
    usleep(100 * 1000);
    Pstrain__FinishRequest fr = PSTRAIN__FINISH_REQUEST__INIT;
    rpc_message *rep = NULL;
    cr_assert_eq(rpc_client_call(cl, 0, RPC_METHOD_FINISH, &fr.base, NULL, 0, &rep), PST_OK,
                 "%s", pst_error_detail());
    rpc_message_free(rep);
    /* UNAVAILABLE "shutting down", retried for connect_timeout (0.5 s) against a server
     * that is gone, then reported. */
    batch_wait(&b, 1, 1, 10);
    cr_assert_eq(b.failed, 1);
    cr_assert(strstr(b.first_error, pst_strerror(PST_ERR_UNAVAILABLE)) != NULL, "%s",
              b.first_error);
    cr_log_info("shutdown: %s", b.first_error);
    free(a.pulled);
    int code = reap(&sp, 10);
    cr_assert_eq(code, 0, "server exit code %d after shutdown with a pending call", code);
    rpc_client_free(cl);
    rpc_global_shutdown();
}

Test(rpc, client_free_cancels_outstanding_calls, .timeout = 30)
{
    server_proc sp = spawn_server(2);
    rpc_client *cl = connect_to(&sp, 20000, 5000);
    struct batch b = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct acall a[4];
    for (int i = 0; i < 4; i++)
        start_pull(cl, &a[i], &b, (uint32_t)i, PST_F32, 20000);
    usleep(200 * 1000);
    double t0 = now_s();
    rpc_client_free(cl);
    cr_assert_lt(now_s() - t0, 2.0);
    batch_wait(&b, 4, 4, 1);
    cr_assert_eq(b.failed, 4);
    cr_assert(strstr(b.first_error, pst_strerror(PST_ERR_STATE)) != NULL, "%s",
              b.first_error);
    cr_assert(strstr(b.first_error, "shutting down") != NULL, "%s", b.first_error);
    for (int i = 0; i < 4; i++)
        free(a[i].pulled);
    /* The server noticed the cancellations and still serves and shuts down cleanly. */
    finish_server(&sp, connect_to(&sp, 10000, 5000));
}

/* ---- shm: same-host segments (rpc/shm.h) --------------------------------------------- */

/* A trainer's segment, attached by another process (the pserver's side) through its
 * /proc/<pid>/fd/<fd> name: each sees what the other writes in a slot. */
Test(shm, another_process_attaches_and_shares_the_slots, .timeout = 30)
{
    rpc_shm t;
    cr_assert_eq(rpc_shm_create(&t, 1000), PST_OK, "%s", pst_error_detail());
    float *push = rpc_shm_push_slot(&t, 100, 50);
    cr_assert_not_null(push);
    for (int i = 0; i < 50; i++)
        push[i] = (float)i * 0.5f;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        rpc_shm p;
        int ok = rpc_shm_attach(&p, t.name, t.nonce, 1000, NULL) == PST_OK;
        const float *got = ok ? rpc_shm_push_slot(&p, 100, 50) : NULL;
        for (int i = 0; ok && i < 50; i++)
            ok = got[i] == (float)i * 0.5f;
        float *pull = ok ? rpc_shm_pull_slot(&p, 100, 50) : NULL;
        for (int i = 0; ok && i < 50; i++)
            pull[i] = -(float)i;
        rpc_shm_free(&p);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child could not attach "
              "or read the push slot (status 0x%x)", status);
    const float *pull = rpc_shm_pull_slot(&t, 100, 50);
    for (int i = 0; i < 50; i++)
        cr_assert_eq(pull[i], -(float)i, "pull slot element %d", i);
    /* The pull slots follow all the push slots: no overlap. */
    cr_assert_eq((const unsigned char *)pull - (const unsigned char *)push, 1000 * 4);
    rpc_shm_free(&t);
    cr_assert_null(t.base);
}

/* What is not the trainer's sealed segment is refused with why, and maps nothing: another
 * nonce, a size too small for the blocks, an unsealed memfd, a file that is no memfd,
 * names that are not /proc/<pid>/fd/<fd>; slots outside the shard are NULL. */
Test(shm, what_is_not_the_trainers_segment_is_refused)
{
    rpc_shm t, p;
    cr_assert_eq(rpc_shm_create(&t, 256), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(rpc_shm_attach(&p, t.name, t.nonce ^ 1, 256, NULL), PST_ERR_UNAVAILABLE);
    cr_assert(strstr(pst_error_detail(), "another nonce"), "%s", pst_error_detail());
    cr_assert_null(p.base);
    cr_assert_eq(rpc_shm_attach(&p, t.name, t.nonce, 257, NULL), PST_ERR_UNAVAILABLE);
    cr_assert(strstr(pst_error_detail(), "the blocks need"), "%s", pst_error_detail());
    cr_assert_eq(rpc_shm_attach(&p, t.name, t.nonce, 256, NULL), PST_OK, "%s", pst_error_detail());
    cr_assert_null(rpc_shm_push_slot(&p, 200, 57));
    cr_assert_null(rpc_shm_pull_slot(&p, 257, 0));
    cr_assert_not_null(rpc_shm_pull_slot(&p, 200, 56));
    rpc_shm_free(&p);

    int fd = memfd_create("unsealed", MFD_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)rpc_shm_bytes(256)), 0);
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/fd/%d", (int)getpid(), fd);
    cr_assert_eq(rpc_shm_attach(&p, name, t.nonce, 256, NULL), PST_ERR_UNAVAILABLE);
    cr_assert(strstr(pst_error_detail(), "sealed"), "%s", pst_error_detail());
    close(fd);

    fd = open("/etc/hostname", O_RDONLY);
    if (fd >= 0) {
        snprintf(name, sizeof name, "/proc/%d/fd/%d", (int)getpid(), fd);
        cr_assert_eq(rpc_shm_attach(&p, name, t.nonce, 1, NULL), PST_ERR_UNAVAILABLE);
        close(fd);
    }
    const char *bad[] = {"/etc/passwd", "/proc/self/fd/0", "/proc/1/fd/0/../../environ",
                         "/proc/-3/fd/1", "", "/proc/999999999/fd/3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(rpc_shm_attach(&p, bad[i], t.nonce, 256, NULL), PST_ERR_UNAVAILABLE, "%s",
                     bad[i]);
        cr_assert_null(p.base);
    }
    rpc_shm_free(&t);
    rpc_shm_free(&t); /* an empty one is accepted */
}

/* The pserver's own values area, offered back as a trainer's segment under its name or
 * under another descriptor of the same file, is refused (a pull would write over the
 * values); a trainer's segment still attaches beside it. */
Test(shm, a_segment_of_the_process_itself_is_refused)
{
    rpc_shm area, t, p;
    cr_assert_eq(rpc_shm_create_area(&area, 64 * 64), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(rpc_shm_attach(&p, area.name, area.nonce, 64, &area), PST_ERR_UNAVAILABLE);
    cr_assert(strstr(pst_error_detail(), "its values area"), "%s", pst_error_detail());
    cr_assert_null(p.base);
    int again = dup(area.fd);
    cr_assert_geq(again, 0);
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/fd/%d", (int)getpid(), again);
    cr_assert_eq(rpc_shm_attach(&p, name, area.nonce, 64, &area), PST_ERR_UNAVAILABLE);
    close(again);
    cr_assert_eq(rpc_shm_create(&t, 64), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(rpc_shm_attach(&p, t.name, t.nonce, 64, &area), PST_OK, "%s",
                 pst_error_detail());
    rpc_shm_free(&p);
    rpc_shm_free(&t);
    rpc_shm_free(&area);
}

/* The pserver's table of its trainers' segments: a trainer's newer segment replaces its
 * older one, which stays mapped (a call of the earlier process may still read it) up to the
 * bound of 2n + 16 replaced; a refused one leaves the older in place; peers out of range
 * are refused or absent. */
Test(shm, the_pservers_table_keeps_replaced_segments_mapped)
{
    rpc_shm_peers peers = {0};
    rpc_shm t0, t1;
    cr_assert_eq(rpc_shm_create(&t0, 64), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(rpc_shm_create(&t1, 64), PST_OK, "%s", pst_error_detail());
    cr_assert_null(rpc_shm_peers_get(&peers, 0));
    cr_assert_eq(rpc_shm_peers_attach(&peers, 1, 0, t0.name, t0.nonce, 64, NULL), PST_OK, "%s",
                 pst_error_detail());
    const rpc_shm *first = rpc_shm_peers_get(&peers, 0);
    cr_assert_not_null(first);
    cr_assert_eq(first->nonce, t0.nonce);
    float *seen = rpc_shm_push_slot(first, 0, 4);
    ((float *)rpc_shm_push_slot(&t0, 0, 4))[0] = 3.5f;
    cr_assert_eq(seen[0], 3.5f);
    cr_assert_eq(rpc_shm_peers_attach(&peers, 1, 1, t1.name, t1.nonce, 64, NULL),
                 PST_ERR_INVALID);
    cr_assert_null(rpc_shm_peers_get(&peers, 1));
    /* a refused offer keeps the peer's segment */
    cr_assert_eq(rpc_shm_peers_attach(&peers, 1, 0, t1.name, t1.nonce ^ 1, 64, NULL),
                 PST_ERR_UNAVAILABLE);
    cr_assert_eq(rpc_shm_peers_get(&peers, 0), first);
    /* replaced: the new one is the peer's, the old one still mapped */
    for (int i = 0; i < 18; i++) {
        cr_assert_eq(rpc_shm_peers_attach(&peers, 1, 0, i % 2 ? t0.name : t1.name,
                                          i % 2 ? t0.nonce : t1.nonce, 64, NULL),
                     PST_OK, "replacement %d: %s", i, pst_error_detail());
        cr_assert_eq(rpc_shm_peers_get(&peers, 0)->nonce, i % 2 ? t0.nonce : t1.nonce);
    }
    cr_assert_eq(seen[0], 3.5f, "a replaced segment stays mapped");
    cr_assert_eq(peers.nretired, 18);
    cr_assert_eq(rpc_shm_peers_attach(&peers, 1, 0, t1.name, t1.nonce, 64, NULL),
                 PST_ERR_LIMIT);
    cr_assert(strstr(pst_error_detail(), "replaced already"), "%s", pst_error_detail());
    rpc_shm_peers_free(&peers);
    cr_assert_null(rpc_shm_peers_get(&peers, 0));
    rpc_shm_peers_free(&peers); /* an empty one is accepted */
    rpc_shm_free(&t0);
    rpc_shm_free(&t1);
}

/* The trainer's link with one pserver: off until the pserver takes the segment (pushes then
 * go in the call, pulls ask for no shared memory); on, a push goes to its slot and a pull
 * answered there is read from it; an answer in shared memory the link has not (a values
 * area never mapped, or a link that is off) is refused; a reply's own payload is taken as
 * it is. */
Test(shm, the_trainers_link_places_pushes_and_reads_pulls)
{
    rpc_shm_link l = {0};
    int slot = -1, values = -1;
    rpc_shm_link_pull_asks(&l, PST_F32, &slot, &values);
    cr_assert(!slot && !values);
    cr_assert_null(rpc_shm_link_push_slot(&l, 0, 8));
    cr_assert_eq(rpc_shm_link_offer(&l, 32), PST_OK, "%s", pst_error_detail());
    cr_assert_not_null(l.seg.base);
    cr_assert_null(rpc_shm_link_push_slot(&l, 0, 8), "not on before the pserver's answer");
    cr_assert_eq(rpc_shm_link_answer(&l, 0), 0);
    cr_assert_null(l.seg.base, "a segment not taken is released");
    rpc_payload out;
    cr_assert_eq(rpc_shm_link_pulled(&l, 1, 0, NULL, 0, 0, 8, PST_F32, &out), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "a pull slot"), "%s", pst_error_detail());

    cr_assert_eq(rpc_shm_link_offer(&l, 32), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(rpc_shm_link_answer(&l, 1), 1);
    float *push = rpc_shm_link_push_slot(&l, 8, 8);
    cr_assert_eq((void *)push, rpc_shm_push_slot(&l.seg, 8, 8));
    cr_assert_null(rpc_shm_link_push_slot(&l, 30, 8), "outside the shard");
    rpc_shm_link_pull_asks(&l, PST_BF16, &slot, &values);
    cr_assert(slot && !values, "no values area: the slots");
    float *pull = rpc_shm_pull_slot(&l.seg, 8, 8);
    for (int i = 0; i < 8; i++)
        pull[i] = (float)i + 0.25f;
    cr_assert_eq(rpc_shm_link_pulled(&l, 1, 0, NULL, 8, 0, 8, PST_F32, &out), PST_OK, "%s",
                 pst_error_detail());
    float got[8];
    cr_assert_eq(rpc_payload_read_f32(&out, PST_F32, 0, got, 8), PST_OK, "%s",
                 pst_error_detail());
    for (int i = 0; i < 8; i++)
        cr_assert_eq(got[i], (float)i + 0.25f);
    cr_assert_eq(rpc_shm_link_pulled(&l, 0, 1, NULL, 8, 0, 8, PST_F32, &out), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "a values area"), "%s", pst_error_detail());
    const rpc_payload in_call = rpc_payload_shared(got, sizeof got, 0);
    cr_assert_eq(rpc_shm_link_pulled(&l, 0, 0, &in_call, 8, 0, 8, PST_F32, &out), PST_OK);
    cr_assert_eq(out.flat, in_call.flat);

    /* a values area in bf16: pulls in bf16 ask for it and read it; f32 pulls do not */
    rpc_shm a;
    cr_assert_eq(rpc_shm_create_area(&a, 64), PST_OK, "%s", pst_error_detail());
    uint16_t *v = rpc_shm_area(&a);
    for (int i = 0; i < 8; i++)
        v[i] = pst_bf16_from_f32((float)i);
    cr_assert_eq(rpc_shm_link_attach_area(&l, a.name, a.nonce, PST_BF16, 64), PST_OK, "%s",
                 pst_error_detail());
    rpc_shm_link_pull_asks(&l, PST_BF16, &slot, &values);
    cr_assert(slot && values);
    rpc_shm_link_pull_asks(&l, PST_F32, &slot, &values);
    cr_assert(slot && !values);
    cr_assert_eq(rpc_shm_link_pulled(&l, 1, 1, NULL, 8, 0, 8, PST_BF16, &out), PST_OK, "%s",
                 pst_error_detail());
    cr_assert_eq(rpc_payload_read_f32(&out, PST_BF16, 0, got, 8), PST_OK, "%s",
                 pst_error_detail());
    for (int i = 0; i < 8; i++)
        cr_assert_eq(got[i], (float)i);
    cr_assert_eq(rpc_shm_link_pulled(&l, 1, 1, NULL, 8, 0, 8, PST_F32, &out), PST_ERR_FORMAT,
                 "an area of another dtype");
    rpc_shm_link_free(&l);
    cr_assert(!l.on && !l.seg.base && !l.area.base);
    cr_assert_eq(rpc_shm_link_attach_area(&l, a.name, a.nonce, PST_BF16, 64), PST_ERR_STATE);
    rpc_shm_link_free(&l);
    rpc_shm_free(&a);
}

/* A pserver's values area: blocks at 64-byte boundaries, mapped read-only by another
 * process that sees what the pserver writes; another nonce is refused. */
Test(shm, a_values_area_is_shared_read_only, .timeout = 30)
{
    cr_assert_eq(rpc_shm_area_span(10, 2), 64);
    cr_assert_eq(rpc_shm_area_span(16, 4), 64);
    cr_assert_eq(rpc_shm_area_span(17, 4), 128);
    cr_assert_eq(rpc_shm_area_span(0, 4), 0);
    const size_t third = 64 + 64; /* blocks of 10, 16 and 7 floats */
    const size_t bytes = third + rpc_shm_area_span(7, 4);
    rpc_shm a, t;
    cr_assert_eq(rpc_shm_create_area(&a, bytes), PST_OK, "%s", pst_error_detail());
    float *v = (float *)((char *)rpc_shm_area(&a) + third);
    for (int i = 0; i < 7; i++)
        v[i] = 1.5f * (float)i;
    cr_assert_eq(rpc_shm_attach_area(&t, a.name, a.nonce + 1, bytes), PST_ERR_UNAVAILABLE);
    cr_assert_eq(rpc_shm_attach_area(&t, a.name, a.nonce, bytes + 4096), PST_ERR_UNAVAILABLE);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int ok = rpc_shm_attach_area(&t, a.name, a.nonce, bytes) == PST_OK;
        const float *got = ok ? (const float *)((const char *)rpc_shm_area(&t) + third) : NULL;
        for (int i = 0; ok && i < 7; i++)
            ok = got[i] == 1.5f * (float)i;
        rpc_shm_free(&t);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x", status);
    rpc_shm_free(&a);
}
