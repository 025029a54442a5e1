/* pserver_child.h — a real pserver as a child process and the test as its RPC client, for
 * the suites that talk to one (test_cluster, test_tables_wire). The including file defines
 * PSERVER (the binary), LISTEN_WAIT_MS and EXIT_WAIT_MS, and includes tests/child.h,
 * criterion and rpc/client.h + rpc/global.h first. gRPC is initialized only after the fork
 * (fixture_start): a child started after grpc_init would inherit its threads' state. */
#ifndef PST_TESTS_PSERVER_CHILD_H
#define PST_TESTS_PSERVER_CHILD_H

/* Starts a pserver on 127.0.0.1, port 0, into *ps at log_level, with up to 4 more
 * NAME=value variables (extra: NULL-terminated, or NULL); returns the port it announced. */
static int pserver_start_envs(proc **ps, const char *log_level, const char *const *extra)
{
    const char *env[7] = {"PSTRAIN_PORT=0", "PSTRAIN_BIND=127.0.0.1"};
    for (int i = 0; extra && extra[i] && i < 4; i++)
        env[2 + i] = extra[i];
    const char *argv[] = {PSERVER, "--log-level", log_level, NULL};
    *ps = proc_start(argv, env);
    return listening_port(*ps, "pserver", LISTEN_WAIT_MS);
}

static int pserver_start(proc **ps)
{
    return pserver_start_envs(ps, "warn", NULL);
}

/* SIGTERM, then the pserver must exit 0 (clean shutdown) within the deadline. */
static void pserver_stop(proc *p)
{
    kill(p->pid, SIGTERM);
    int done = proc_wait(p, EXIT_WAIT_MS);
    char *err = slurp(p->err_path);
    cr_assert(done, "pserver did not stop within %d ms of SIGTERM; stderr:\n%s", EXIT_WAIT_MS,
              err);
    cr_assert(WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0,
              "pserver stopped with wait status 0x%x; stderr:\n%s", p->status, err);
    free(err);
}

/* A client of the pserver on `port` whose calls give up after call_timeout_ms;
 * UNAVAILABLE is retried for connect_timeout_ms. */
static rpc_client *client_connect(int port, int call_timeout_ms, int connect_timeout_ms)
{
    static char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *servers[] = {addr};
    rpc_client_config cc = {.servers = servers, .num_servers = 1,
                            .call_timeout_ms = call_timeout_ms,
                            .connect_timeout_ms = connect_timeout_ms};
    rpc_client *cl = NULL;
    cr_assert_eq(rpc_client_init(&cl, &cc), PST_OK, "%s", pst_error_detail());
    return cl;
}

/* A pserver started here and a client of it (gRPC initialized after the fork), and their
 * end: the pserver must then stop cleanly. */
static rpc_client *fixture_start(proc **ps, int *port)
{
    *port = pserver_start(ps);
    rpc_global_init();
    return client_connect(*port, 10000, 5000);
}

static void fixture_stop(proc *ps, rpc_client *cl)
{
    rpc_client_free(cl);
    rpc_global_shutdown();
    pserver_stop(ps);
}

#endif /* PST_TESTS_PSERVER_CHILD_H */
