/* rpc_throughput.c — push+pull throughput of rpc/ on loopback (a report, not a test).
 *
 * Forks one pserver-like server and C trainer-like clients (gRPC is initialized only after
 * the forks). Each step, every client pushes its whole gradient buffer (N floats cut into
 * blocks of B bytes, all blocks in flight at once) and, as each push completes, pulls that
 * block back into its parameter buffer. The server copies each pushed block once into its
 * f32 store (rpc_payload_read_f32) and answers pulls by lending the store without copy;
 * clients copy pulled blocks once into their parameters. So every byte crosses loopback
 * with exactly the copies the design allows. Values are not checked (a pull may read a
 * block while another client's push overwrites it): this measures the transport only.
 *
 * Usage: rpc_throughput [-c clients=2] [-n floats=25000000] [-b block_bytes=4194304]
 * (-b counts f32 bytes: a block holds block_bytes / 4 elements whatever the wire dtype)
 *                       [-s steps=10] [-t server_threads=2] [-w wire=f32|f16|bf16]
 * Prints per-client and aggregate GB/s (1 GB = 1e9 bytes) of payload moved. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/dtype.h"
#include "rpc/client.h"
#include "rpc/global.h"
#include "rpc/server.h"
#include "rpc/wire.h"

static struct {
    int clients;
    size_t floats;
    size_t block_bytes;
    int steps;
    int threads;
    pst_dtype wire;
} opt = {2, 25000000, 4u << 20, 10, 2, PST_F32};

static size_t nblocks(void)
{
    size_t per = opt.block_bytes / 4;
    return (opt.floats + per - 1) / per;
}

static void block_range(size_t b, size_t *off, size_t *len)
{
    size_t per = opt.block_bytes / 4;
    *off = b * per;
    *len = opt.floats - *off < per ? opt.floats - *off : per;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- server ----------------------------------------------------------------------------- */

static struct {
    float *store;  /* (floats) f32 master */
    void *wirebuf; /* (floats) store cast to the wire dtype, when it is not f32 */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int finished;
} srv = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void server_handler(void *arg, rpc_call *call)
{
    (void)arg;
    switch (rpc_call_method(call)) {
    case RPC_METHOD_PUSH: {
        const Pstrain__PushRequest *r = (const Pstrain__PushRequest *)rpc_call_request(call);
        size_t off, len;
        pst_dtype dt;
        if (r->block >= nblocks() || rpc_dtype_from_wire(r->dtype, &dt) != PST_OK) {
            rpc_call_fail(call, PST_ERR_INVALID, "block %u", r->block);
            return;
        }
        block_range(r->block, &off, &len);
        const rpc_payload *p = rpc_call_payload(call);
        if (rpc_payload_check(p, dt, len) != PST_OK ||
            rpc_payload_read_f32(p, dt, 0, srv.store + off, len) != PST_OK) {
            rpc_call_fail(call, PST_ERR_INVALID, "%s", pst_error_detail());
            return;
        }
        Pstrain__PushReply rep = PSTRAIN__PUSH_REPLY__INIT;
        rpc_call_reply(call, &rep.base, NULL, 0, NULL, NULL);
        return;
    }
    case RPC_METHOD_PULL: {
        const Pstrain__PullRequest *r = (const Pstrain__PullRequest *)rpc_call_request(call);
        size_t off, len;
        if (r->block >= nblocks()) {
            rpc_call_fail(call, PST_ERR_NOT_FOUND, "block %u", r->block);
            return;
        }
        block_range(r->block, &off, &len);
        Pstrain__PullReply rep = PSTRAIN__PULL_REPLY__INIT;
        rep.block = r->block;
        rep.version = r->version;
        rep.dtype = rpc_dtype_to_wire(opt.wire);
        rep.length = len;
        size_t es = pst_dtype_size(opt.wire);
        const char *base = opt.wire == PST_F32 ? (const char *)srv.store : srv.wirebuf;
        rpc_call_reply(call, &rep.base, base + off * es, len * es, NULL, NULL);
        return;
    }
    case RPC_METHOD_FINISH: {
        Pstrain__FinishReply rep = PSTRAIN__FINISH_REPLY__INIT;
        rpc_call_reply(call, &rep.base, NULL, 0, NULL, NULL);
        pthread_mutex_lock(&srv.mu);
        srv.finished++;
        pthread_cond_broadcast(&srv.cv);
        pthread_mutex_unlock(&srv.mu);
        return;
    }
    default: {
        Pstrain__InitReply rep = PSTRAIN__INIT_REPLY__INIT;
        rpc_call_reply(call, &rep.base, NULL, 0, NULL, NULL);
    }
    }
}

static int server_main(int wfd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    srv.store = calloc(opt.floats, sizeof(float));
    srv.wirebuf = calloc(opt.floats, pst_dtype_size(opt.wire));
    rpc_global_init();
    rpc_server *s;
    rpc_server_config cfg = {.bind = "127.0.0.1:0", .threads = opt.threads,
                             .handler = server_handler};
    int port = -1;
    if (rpc_server_init(&s, &cfg) != PST_OK) {
        fprintf(stderr, "server: %s\n", pst_error_detail());
        (void)!write(wfd, &port, sizeof(port));
        return 1;
    }
    port = rpc_server_port(s);
    (void)!write(wfd, &port, sizeof(port));
    pthread_mutex_lock(&srv.mu);
    while (srv.finished < opt.clients)
        pthread_cond_wait(&srv.cv, &srv.mu);
    pthread_mutex_unlock(&srv.mu);
    rpc_server_free(s);
    rpc_global_shutdown();
    return 0;
}

/* ---- client ----------------------------------------------------------------------------- */

struct cl_state {
    rpc_client *cl;
    void *grad;   /* (floats) in the wire dtype */
    float *param; /* (floats) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t left; /* pulls outstanding this step */
    int failed;
    char error[512];
    long step;
};

struct blk {
    struct cl_state *st;
    uint32_t block;
};

static void note(struct cl_state *st, pst_status s, const char *detail)
{
    pthread_mutex_lock(&st->mu);
    if (s != PST_OK && st->failed++ == 0)
        snprintf(st->error, sizeof(st->error), "%s", detail);
    st->left--;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

static void pull_done(void *arg, pst_status s, const char *detail,
                      const ProtobufCMessage *reply, const rpc_payload *payload)
{
    struct blk *b = arg;
    if (s == PST_OK) {
        const Pstrain__PullReply *r = (const Pstrain__PullReply *)reply;
        size_t off, len;
        pst_dtype dt;
        block_range(b->block, &off, &len);
        if (rpc_dtype_from_wire(r->dtype, &dt) != PST_OK ||
            rpc_payload_check(payload, dt, len) != PST_OK ||
            rpc_payload_read_f32(payload, dt, 0, b->st->param + off, len) != PST_OK) {
            s = PST_ERR_FORMAT;
            detail = pst_error_detail();
        }
    }
    note(b->st, s, detail);
}

static void push_done(void *arg, pst_status s, const char *detail,
                      const ProtobufCMessage *reply, const rpc_payload *payload)
{
    (void)reply;
    (void)payload;
    struct blk *b = arg;
    if (s == PST_OK) {
        Pstrain__PullRequest req = PSTRAIN__PULL_REQUEST__INIT;
        req.block = b->block;
        req.version = b->st->step + 1;
        req.dtype = rpc_dtype_to_wire(opt.wire);
        s = rpc_client_call_async(b->st->cl, 0, RPC_METHOD_PULL, &req.base, NULL, 0, NULL,
                                  pull_done, b);
        if (s == PST_OK)
            return;
        detail = pst_error_detail();
    }
    note(b->st, s, detail);
}

static int client_main(int id, int port, int wfd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct cl_state st;
    memset(&st, 0, sizeof(st));
    pthread_mutex_init(&st.mu, NULL);
    pthread_cond_init(&st.cv, NULL);
    size_t es = pst_dtype_size(opt.wire);
    st.grad = malloc(opt.floats * es);
    st.param = malloc(opt.floats * sizeof(float));
    float *g = malloc(opt.floats * sizeof(float));
    for (size_t i = 0; i < opt.floats; i++)
        g[i] = (float)((i + (size_t)id) % 1000) * 0.001f;
    pst_cast(st.grad, opt.wire, g, PST_F32, opt.floats);
    free(g);
    memset(st.param, 0, opt.floats * sizeof(float));

    rpc_global_init();
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    const char *addrs[1] = {addr};
    rpc_client_config cfg = {.servers = addrs, .num_servers = 1};
    if (rpc_client_init(&st.cl, &cfg) != PST_OK) {
        fprintf(stderr, "client %d: %s\n", id, pst_error_detail());
        return 1;
    }
    size_t nb = nblocks();
    struct blk *blks = calloc(nb, sizeof(*blks));
    double t_start = 0;
    for (long step = 0; step <= opt.steps; step++) { /* step 0 warms up */
        if (step == 1)
            t_start = now_s();
        st.step = step;
        st.left = nb;
        for (size_t b = 0; b < nb; b++) {
            size_t off, len;
            block_range(b, &off, &len);
            blks[b] = (struct blk){&st, (uint32_t)b};
            Pstrain__PushRequest req = PSTRAIN__PUSH_REQUEST__INIT;
            req.trainer_id = (uint32_t)id;
            req.step = step;
            req.block = (uint32_t)b;
            req.dtype = rpc_dtype_to_wire(opt.wire);
            req.length = len;
            /* The gradient buffer is not written during the run: no release needed. */
            if (rpc_client_call_async(st.cl, 0, RPC_METHOD_PUSH, &req.base,
                                      (const char *)st.grad + off * es, len * es, NULL,
                                      push_done, &blks[b]) != PST_OK)
                note(&st, PST_ERR_INTERNAL, pst_error_detail());
        }
        pthread_mutex_lock(&st.mu);
        while (st.left > 0)
            pthread_cond_wait(&st.cv, &st.mu);
        pthread_mutex_unlock(&st.mu);
        if (st.failed) {
            fprintf(stderr, "client %d step %ld: %s\n", id, step, st.error);
            return 1;
        }
    }
    double secs = now_s() - t_start;
    Pstrain__FinishRequest fr = PSTRAIN__FINISH_REQUEST__INIT;
    fr.trainer_id = (uint32_t)id;
    rpc_message *rep = NULL;
    rpc_client_call(st.cl, 0, RPC_METHOD_FINISH, &fr.base, NULL, 0, &rep);
    rpc_message_free(rep);
    rpc_client_free(st.cl);
    rpc_global_shutdown();
    (void)!write(wfd, &secs, sizeof(secs));
    return 0;
}

int main(int argc, char **argv)
{
    int c;
    while ((c = getopt(argc, argv, "c:n:b:s:t:w:")) != -1) {
        switch (c) {
        case 'c': opt.clients = atoi(optarg); break;
        case 'n': opt.floats = strtoull(optarg, NULL, 10); break;
        case 'b': opt.block_bytes = strtoull(optarg, NULL, 10); break;
        case 's': opt.steps = atoi(optarg); break;
        case 't': opt.threads = atoi(optarg); break;
        case 'w':
            if (pst_dtype_parse(optarg, &opt.wire) != 0) {
                fprintf(stderr, "-w: f32, f16 or bf16\n");
                return 2;
            }
            break;
        default:
            fprintf(stderr, "usage: %s [-c clients] [-n floats] [-b block_bytes] [-s steps] "
                            "[-t server_threads] [-w f32|f16|bf16]\n", argv[0]);
            return 2;
        }
    }
    if (opt.clients < 1 || opt.floats == 0 || opt.block_bytes < 4 || opt.steps < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    int sp[2];
    if (pipe(sp) != 0)
        return 1;
    pid_t server = fork();
    if (server == 0) {
        close(sp[0]);
        _exit(server_main(sp[1]));
    }
    close(sp[1]);
    int port = -1;
    struct pollfd pfd = {.fd = sp[0], .events = POLLIN};
    if (poll(&pfd, 1, 20000) != 1 || read(sp[0], &port, sizeof(port)) != sizeof(port) ||
        port <= 0) {
        fprintf(stderr, "server did not start\n");
        kill(server, SIGKILL);
        return 1;
    }
    int cp[2];
    if (pipe(cp) != 0)
        return 1;
    pid_t *kids = calloc((size_t)opt.clients, sizeof(pid_t));
    for (int i = 0; i < opt.clients; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            close(cp[0]);
            _exit(client_main(i, port, cp[1]));
        }
    }
    close(cp[1]);
    int ok = 1;
    double max_secs = 0;
    double step_bytes = (double)opt.floats * (double)pst_dtype_size(opt.wire) * 2.0;
    for (int i = 0; i < opt.clients; i++) {
        double secs;
        if (read(cp[0], &secs, sizeof(secs)) != sizeof(secs)) {
            ok = 0;
            break;
        }
        if (secs > max_secs)
            max_secs = secs;
        printf("client: %.3f s for %d steps, %.2f GB/s push+pull (%.1f ms/step)\n", secs,
               opt.steps, step_bytes * opt.steps / secs / 1e9, secs * 1000.0 / opt.steps);
    }
    for (int i = 0; i < opt.clients; i++) {
        int status;
        waitpid(kids[i], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            ok = 0;
    }
    int status;
    waitpid(server, &status, 0);
    if (!ok) {
        fprintf(stderr, "a client failed\n");
        return 1;
    }
    double total = step_bytes * opt.steps * opt.clients;
    printf("aggregate: %d clients x %zu %s elements (%zu blocks of %zu elements), %d steps: "
           "%.2f GB/s push+pull through the server (%.2f GB/s each way)\n",
           opt.clients, opt.floats, pst_dtype_name(opt.wire), nblocks(), opt.block_bytes / 4,
           opt.steps, total / max_secs / 1e9, total / 2 / max_secs / 1e9);
    return 0;
}
