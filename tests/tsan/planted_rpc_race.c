/* planted_rpc_race.c — a data race planted in OUR code across a gRPC call, for proving that
 * the TSan suite's gRPC suppressions (tests/tsan/grpc.supp) and the completion-queue
 * annotations (rpc/tsan.h) do not hide our races (tests/tsan/expect_race.sh runs it).
 *
 *   planted_rpc_race rpc    the main thread starts an async Init, THEN writes `planted`;
 *                           the call's done callback, on the client's completion thread,
 *                           reads it: nothing orders the two, TSan must report it
 *   planted_rpc_race clean  the same with the write before the call starts: the call's
 *                           start and its completion order it, TSan must stay silent
 *
 * The server is a child process (forked before gRPC starts here) that answers every Init.
 * After the write the main thread waits for the callback on a relaxed atomic, which TSan
 * does not count as synchronization, so no incidental lock orders the accesses.
 * Exit status: 0 when the call completed (TSan itself exits 66 after reporting), 2 when
 * something else failed. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rpc/client.h"
#include "rpc/global.h"
#include "rpc/server.h"

static long planted;
static atomic_int done_flag;
static volatile long seen; /* volatile: the read of planted cannot be optimized away */

static void answer(void *arg, rpc_call *call)
{
    (void)arg;
    Pstrain__InitReply rep = PSTRAIN__INIT_REPLY__INIT;
    rpc_call_reply(call, &rep.base, NULL, 0, NULL, NULL);
}

/* The server child: answers Inits until its parent is gone. */
static void serve(int wfd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(30);
    rpc_global_init();
    rpc_server *srv;
    rpc_server_config cfg = {.bind = "127.0.0.1:0", .threads = 1, .handler = answer};
    int port = -1;
    if (rpc_server_init(&srv, &cfg) == PST_OK)
        port = rpc_server_port(srv);
    (void)!write(wfd, &port, sizeof port);
    for (;;)
        pause();
}

static __attribute__((noinline)) void planted_read(void)
{
    seen = planted;
}

static void on_done(void *arg, pst_status st, const char *detail, const ProtobufCMessage *reply,
                    const rpc_payload *payload)
{
    (void)arg;
    (void)reply;
    (void)payload;
    if (st != PST_OK)
        fprintf(stderr, "planted_rpc_race: Init failed: %s\n", detail);
    planted_read();
    atomic_store_explicit(&done_flag, st == PST_OK ? 1 : 2, memory_order_relaxed);
}

int main(int argc, char **argv)
{
    const int race = argc > 1 && strcmp(argv[1], "rpc") == 0;
    if (argc < 2 || (!race && strcmp(argv[1], "clean") != 0)) {
        fprintf(stderr, "usage: planted_rpc_race rpc|clean\n");
        return 2;
    }
    int fds[2];
    if (pipe(fds) != 0)
        return 2;
    pid_t child = fork();
    if (child == 0) {
        close(fds[0]);
        serve(fds[1]);
    }
    close(fds[1]);
    int port = -1;
    if (read(fds[0], &port, sizeof port) != (ssize_t)sizeof port || port <= 0) {
        fprintf(stderr, "planted_rpc_race: the server child did not start\n");
        return 2;
    }
    rpc_global_init();
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *addrs[] = {addr};
    rpc_client_config cfg = {.servers = addrs, .num_servers = 1, .call_timeout_ms = 10000};
    rpc_client *cl;
    if (rpc_client_init(&cl, &cfg) != PST_OK) {
        fprintf(stderr, "planted_rpc_race: %s\n", pst_error_detail());
        return 2;
    }
    Pstrain__InitRequest req = PSTRAIN__INIT_REQUEST__INIT;
    if (!race)
        planted = 42; /* before the call: ordered by its start and completion */
    if (rpc_client_call_async(cl, 0, RPC_METHOD_INIT, &req.base, NULL, 0, NULL, on_done,
                              NULL) != PST_OK) {
        fprintf(stderr, "planted_rpc_race: %s\n", pst_error_detail());
        return 2;
    }
    if (race)
        planted = 42; /* after the call started: nothing orders it with the callback */
    const struct timespec tick = {0, 1000000};
    for (int i = 0; i < 20000 && !atomic_load_explicit(&done_flag, memory_order_relaxed); i++)
        nanosleep(&tick, NULL);
    const int ok = atomic_load_explicit(&done_flag, memory_order_relaxed) == 1;
    rpc_client_free(cl);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    rpc_global_shutdown();
    return ok ? 0 : 2;
}
