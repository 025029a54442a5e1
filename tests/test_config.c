/* test_config.c — configuration from environment and flags (common/config.c).
 *
 * The environment is a table in each test, read through a fake getenv, so the tests do
 * not depend on (or touch) the real environment; one test checks the real one is never
 * read. Covered: defaults, every value type, precedence (flag > PSTRAIN_* > Paddle name >
 * default), both flag forms, the Paddle names, role checks, the pserver port, malformed
 * values (exact code, and a detail naming the variable or flag with an example),
 * whole-config checks, the JSON print (validated by a small JSON parser below) and --help
 * (compared with the PSTRAIN_ names in config.c itself). */
#include <criterion/criterion.h>

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"

/* ---- the fake environment ----------------------------------------------------------- */

static const char *const *fake_env; /* name, value, name, value, ..., NULL */

static const char *fake_getenv(const char *name)
{
    for (const char *const *p = fake_env; p && p[0]; p += 2)
        if (strcmp(p[0], name) == 0)
            return p[1];
    return NULL;
}

static pst_status load_v(pst_config *cfg, pst_role role, const char *const *env, char **argv)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    fake_env = env;
    pst_error_clear();
    return pst_config_load(cfg, role, argc, argv, fake_getenv);
}

#define ENV(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NOENV ((const char *const[]){NULL})
/* LOAD(&cfg, role, env) or LOAD(&cfg, role, env, "--flag", "value", ...) */
#define LOAD(cfg, role, ...) LOAD_(cfg, role, __VA_ARGS__, NULL)
#define LOAD_(cfg, role, env, ...) load_v(cfg, role, env, (char *[]){"prog", __VA_ARGS__})

#define EXPECT_OK(st) cr_assert_eq((st), PST_OK, "expected PST_OK: %s", pst_error_detail())

static void expect_detail_has(const char *a, const char *b)
{
    const char *d = pst_error_detail();
    cr_expect(strstr(d, a) != NULL, "detail '%s' does not name '%s'", d, a);
    if (b)
        cr_expect(strstr(d, b) != NULL, "detail '%s' has no '%s'", d, b);
}

/* ---- defaults and types ------------------------------------------------------------- */

Test(config, trainer_defaults)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV));
    pst_config d;
    pst_config_defaults(&d);
    d.role = PST_ROLE_TRAINER;
    /* with no --data the trainer resolves the data set's own directory */
    cr_expect_str_eq(c.data_dir, "/usr/share/datasets/fashion-mnist");
    snprintf(d.data_dir, sizeof d.data_dir, "/usr/share/datasets/fashion-mnist");
    cr_expect_eq(memcmp(&c, &d, sizeof c), 0, "load with nothing set differs from defaults");

    cr_expect_eq(c.role, PST_ROLE_TRAINER);
    cr_expect_eq(c.num_pservers, 0);
    cr_expect_eq(c.trainers, 1);
    cr_expect_eq(c.trainer_id, 0);
    cr_expect_eq(c.pserver_id, -1);
    cr_expect_eq(c.port, -1);
    cr_expect_eq(c.mode, PST_MODE_SYNC);
    cr_expect_eq(c.block_bytes, (size_t)4 << 20);
    cr_expect_str_eq(c.devices, "cpu:1");
    cr_expect_eq(c.rpc_timeout_ms, 60000);
    cr_expect_eq(c.connect_timeout_ms, 30000);
    cr_expect_str_eq(c.model, "mlp");
    cr_expect_eq(c.nhidden, 2);
    cr_expect_eq(c.hidden[0], 1024);
    cr_expect_eq(c.hidden[1], 1024);
    cr_expect_str_eq(c.dataset, "fashion-mnist");
    cr_expect_eq(c.batch, 128);
    cr_expect_eq(c.seed, 0);
    cr_expect_eq(c.steps, 0);
    cr_expect_eq(c.optim.kind, PST_OPTIM_MOMENTUM);
    cr_expect_eq(c.optim.lr, 0.05f);
    cr_expect_eq(c.optim.schedule, PST_LR_CONSTANT);
    cr_expect_str_eq(c.metrics_path, "");
    cr_expect_eq(c.log_level, PST_LOG_INFO);
    cr_expect_eq(c.progress, PST_PROGRESS_AUTO);
    cr_expect_eq(c.check_config, 0);
    cr_expect_eq(c.help, 0);
}

Test(config, data_dir_follows_the_dataset)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--dataset", "mnist"));
    cr_expect_str_eq(c.data_dir, "/usr/share/datasets/mnist");
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--dataset", "mnist", "--data", "/d"));
    cr_expect_str_eq(c.data_dir, "/d");
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER, NOENV, "--port", "7164"));
    cr_expect_str_eq(c.data_dir, "", "a pserver reads no data");
}

Test(config, gpt_flags_and_text_data_sets)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--model", "gpt", "--dataset", "kjv"));
    cr_expect_str_eq(c.data_dir, PST_KJV_PATH);
    cr_expect(c.layers == 4 && c.heads == 4 && c.embd == 128 && c.ctx == 128 &&
              c.val_windows == 64 && c.sample == 0);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_LAYERS", "2", "PSTRAIN_CTX", "32"),
                   "--model", "gpt", "--dataset", "text", "--data", "/x.txt", "--heads", "2",
                   "--embd", "64", "--sample", "100", "--temperature", "0.5"));
    cr_expect(c.layers == 2 && c.ctx == 32 && c.heads == 2 && c.embd == 64 && c.sample == 100);
    cr_expect_str_eq(c.data_dir, "/x.txt");
    /* what --model gpt leaves unset takes the PyTorch peer's settings; what is set stays */
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--model", "gpt"));
    cr_expect_str_eq(c.dataset, "kjv");
    cr_expect(c.batch == 16 && c.optim.kind == PST_OPTIM_ADAMW && c.optim.lr == 1e-3f &&
              c.optim.beta2 == 0.99f && c.optim.weight_decay == 0.0f);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_OPTIMIZER", "adam"), "--model", "gpt",
                   "--batch", "32", "--lr", "0.003"));
    cr_expect(c.batch == 32 && c.optim.kind == PST_OPTIM_ADAM && c.optim.lr == 0.003f &&
              c.optim.beta2 == 0.99f);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV));
    cr_expect(c.batch == 128 && c.optim.kind == PST_OPTIM_MOMENTUM, "the mlp's defaults stay");
    cr_assert_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--model", "gpt", "--dataset",
                      "fashion-mnist"), PST_ERR_INVALID);
    expect_detail_has("--model gpt cannot train on --dataset fashion-mnist", "--dataset kjv");
    cr_assert_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--dataset", "kjv"), PST_ERR_INVALID);
    expect_detail_has("--model mlp cannot train on --dataset kjv", NULL);
    cr_assert_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--model", "gpt", "--dataset", "text"),
                 PST_ERR_INVALID);
    expect_detail_has("--dataset text needs --data FILE", NULL);
    cr_assert_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--model", "gpt", "--dataset", "kjv",
                      "--embd", "30"), PST_ERR_INVALID);
    expect_detail_has("--embd 30 is not a multiple of --heads 4", NULL);
    cr_assert_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--model", "gpt2"), PST_ERR_INVALID);
    expect_detail_has("gpt2", "mlp, gpt, dlrm or synthetic");
    cr_assert_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--model", "gpt", "--dataset", "kjv",
                      "--ctx", "0"), PST_ERR_INVALID);
}

Test(config, pserver_defaults)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER, ENV("PSTRAIN_PORT", "7164")));
    cr_expect_eq(c.role, PST_ROLE_PSERVER);
    cr_expect_eq(c.port, 7164);
    cr_expect_eq(c.pserver_id, -1);
    cr_expect_str_eq(c.bind_host, "0.0.0.0");
    cr_expect_eq(c.server_threads, 2);
    cr_expect_eq(c.rpc_timeout_ms, 60000);
    /* Port 0 (any free port) is a valid setting, unlike "unset". */
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER, ENV("PSTRAIN_PORT", "0")));
    cr_expect_eq(c.port, 0);
}

Test(config, every_type_from_the_environment)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PSTRAIN_PSERVERS", "10.0.0.1:7164,host-b.example:7165",
                       "PSTRAIN_TRAINERS", "3", "PSTRAIN_TRAINER_ID", "2",
                       "PSTRAIN_MODE", "async", "PSTRAIN_BLOCK_BYTES", "64K",
                       "PSTRAIN_DEVICES", "cpu:4", "PSTRAIN_RPC_TIMEOUT_MS", "1500",
                       "PSTRAIN_CONNECT_TIMEOUT_MS", "0", "PSTRAIN_MODEL", "synthetic",
                       "PSTRAIN_HIDDEN", "512,256,128", "PSTRAIN_PARAMS", "3000000000",
                       "PSTRAIN_DATASET", "mnist", "PSTRAIN_DATA", "/tmp/data dir",
                       "PSTRAIN_EPOCHS", "7", "PSTRAIN_STEPS", "123456789012",
                       "PSTRAIN_BATCH", "256", "PSTRAIN_SEED", "18446744073709551615",
                       "PSTRAIN_OPTIMIZER", "adamw", "PSTRAIN_LR", "0.125",
                       "PSTRAIN_MOMENTUM", "0.5", "PSTRAIN_BETA1", "0.8",
                       "PSTRAIN_BETA2", "0.99", "PSTRAIN_EPS", "1e-6",
                       "PSTRAIN_WEIGHT_DECAY", "0.25", "PSTRAIN_LR_SCHEDULE", "warmup_cosine",
                       "PSTRAIN_WARMUP_STEPS", "50", "PSTRAIN_MIN_LR", "0.001",
                       "PSTRAIN_METRICS", "/tmp/m.jsonl", "PSTRAIN_LOG_LEVEL", "debug",
                       "PSTRAIN_PROGRESS", "lines", "PSTRAIN_THREADS", "3")));
    cr_expect_eq(c.num_pservers, 2);
    cr_expect_str_eq(c.pservers[0], "10.0.0.1:7164");
    cr_expect_str_eq(c.pservers[1], "host-b.example:7165");
    cr_expect_eq(c.trainers, 3);
    cr_expect_eq(c.trainer_id, 2);
    cr_expect_eq(c.mode, PST_MODE_ASYNC);
    cr_expect_eq(c.block_bytes, (size_t)65536);
    cr_expect_str_eq(c.devices, "cpu:4");
    cr_expect_eq(c.rpc_timeout_ms, 1500L);
    cr_expect_eq(c.connect_timeout_ms, 0L);
    cr_expect_str_eq(c.model, "synthetic");
    cr_expect_eq(c.nhidden, 3);
    cr_expect_eq(c.hidden[0], 512);
    cr_expect_eq(c.hidden[1], 256);
    cr_expect_eq(c.hidden[2], 128);
    cr_expect_eq(c.params, 3000000000L);
    cr_expect_str_eq(c.dataset, "mnist");
    cr_expect_str_eq(c.data_dir, "/tmp/data dir");
    cr_expect_eq(c.epochs, 7);
    cr_expect_eq(c.steps, 123456789012L);
    cr_expect_eq(c.batch, 256);
    cr_expect_eq(c.seed, UINT64_MAX);
    cr_expect_eq(c.optim.kind, PST_OPTIM_ADAMW);
    cr_expect_eq(c.optim.lr, 0.125f);
    cr_expect_eq(c.optim.momentum, 0.5f);
    cr_expect_eq(c.optim.beta1, 0.8f);
    cr_expect_eq(c.optim.beta2, 0.99f);
    cr_expect_eq(c.optim.eps, 1e-6f);
    cr_expect_eq(c.optim.weight_decay, 0.25f);
    cr_expect_eq(c.optim.schedule, PST_LR_WARMUP_COSINE);
    cr_expect_eq(c.optim.warmup_steps, 50L);
    cr_expect_eq(c.optim.min_lr, 0.001f);
    cr_expect_str_eq(c.metrics_path, "/tmp/m.jsonl");
    cr_expect_eq(c.log_level, PST_LOG_DEBUG);
    cr_expect_eq(c.progress, PST_PROGRESS_LINES);
    cr_expect_eq(c.threads, 3);
}

Test(config, pserver_types_from_the_environment)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER,
                   ENV("PSTRAIN_PORT", "7001", "PSTRAIN_BIND", "127.0.0.1",
                       "PSTRAIN_SERVER_THREADS", "8", "PSTRAIN_RPC_TIMEOUT_MS", "250",
                       "PSTRAIN_METRICS", "/tmp/ps.jsonl", "PSTRAIN_LOG_LEVEL", "warn",
                       "PSTRAIN_THREADS", "1")));
    /* Trainer-only settings in the environment are ignored by the pserver. */
    cr_expect_eq(c.port, 7001);
    cr_expect_str_eq(c.bind_host, "127.0.0.1");
    cr_expect_eq(c.server_threads, 8);
    cr_expect_eq(c.rpc_timeout_ms, 60000L);
    cr_expect_str_eq(c.metrics_path, "/tmp/ps.jsonl"); /* its record at exit */
    cr_expect_eq(c.log_level, PST_LOG_WARN);
    cr_expect_eq(c.threads, 0);
}

Test(config, byte_sizes)
{
    static const struct {
        const char *v;
        size_t want;
    } ok[] = {{"1024", 1024},       {"1K", 1024},          {"64K", 65536},
              {"64k", 65536},       {"2M", 2u << 20},      {"4MiB", 4u << 20},
              {"8KB", 8192},        {"1G", 1u << 30},      {"1.5K", 1536},
              {"1048576", 1u << 20}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        pst_config c;
        EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_BLOCK_BYTES", ok[i].v)));
        cr_expect_eq(c.block_bytes, ok[i].want, "%s -> %zu, want %zu", ok[i].v, c.block_bytes,
                     ok[i].want);
        char flag[64];
        snprintf(flag, sizeof flag, "--block-bytes=%s", ok[i].v);
        EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, flag));
        cr_expect_eq(c.block_bytes, ok[i].want, "%s -> %zu, want %zu", flag, c.block_bytes,
                     ok[i].want);
    }
}

Test(config, hidden_lists)
{
    static const struct {
        const char *v;
        int n, w[3];
    } ok[] = {{"1024,1024", 2, {1024, 1024}}, {"7", 1, {7}}, {"none", 0, {0}},
              {"3,2,1", 3, {3, 2, 1}}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        pst_config c;
        EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_HIDDEN", ok[i].v)));
        cr_expect_eq(c.nhidden, ok[i].n, "%s: %d layers", ok[i].v, c.nhidden);
        for (int l = 0; l < ok[i].n; l++)
            cr_expect_eq(c.hidden[l], ok[i].w[l], "%s: layer %d", ok[i].v, l);
    }
    /* 16 layers is the limit. */
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PSTRAIN_HIDDEN", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16")));
    cr_expect_eq(c.nhidden, 16);
    cr_expect_eq(c.hidden[15], 16);
}

Test(config, compute_cpu_lists)
{
    static const char *ok[] = {"0", "1", "0-3", "0,2,4-7", "1023", ""};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        pst_config c;
        EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_COMPUTE_CPUS", ok[i])));
        cr_expect_str_eq(c.compute_cpus, ok[i]);
    }
    /* The bits: 0,2,4-7 and 1023. */
    pst_config m;
    EXPECT_OK(LOAD(&m, PST_ROLE_TRAINER, ENV("PSTRAIN_COMPUTE_CPUS", "0,2,4-7,1023")));
    cr_expect_eq(m.compute_cpu_mask[0], 0xf5ull);
    for (int w = 1; w < 15; w++)
        cr_expect_eq(m.compute_cpu_mask[w], 0ull, "word %d", w);
    cr_expect_eq(m.compute_cpu_mask[15], 1ull << 63);
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV));
    cr_expect_str_eq(c.compute_cpus, "", "pinned by default");
}

Test(config, enums_are_case_insensitive_where_documented)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_MODE", "ASYNC", "PSTRAIN_PROGRESS", "Bar")));
    cr_expect_eq(c.mode, PST_MODE_ASYNC);
    cr_expect_eq(c.progress, PST_PROGRESS_BAR);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_PROGRESS", "none", "PSTRAIN_OPTIMIZER",
                                             "sgd", "PSTRAIN_LOG_LEVEL", "off")));
    cr_expect_eq(c.progress, PST_PROGRESS_NONE);
    cr_expect_eq(c.optim.kind, PST_OPTIM_SGD);
    cr_expect_eq(c.log_level, PST_LOG_OFF);
}

Test(config, real_environment_is_not_read)
{
    setenv("PSTRAIN_BATCH", "999", 1);
    setenv("TRAINING_ROLE", "PSERVER", 1);
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV));
    cr_expect_eq(c.batch, 128);
}

Test(config, variables_of_the_other_role_are_ignored)
{
    pst_config c;
    /* A shared manifest sets both roles' variables; each program reads only its own. */
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PSTRAIN_PORT", "not-a-port", "PSTRAIN_SERVER_THREADS", "x",
                       "POD_IP", "10.1.1.1", "PADDLE_PORT", "bad")));
    cr_expect_eq(c.port, -1);
    cr_expect_str_eq(c.bind_host, "0.0.0.0");
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER,
                   ENV("PSTRAIN_PORT", "7164", "PSTRAIN_BATCH", "abc", "PSTRAIN_MODE", "fast",
                       "PADDLE_TRAINERS_NUM", "x")));
    cr_expect_eq(c.batch, 128);
}

/* ---- flags -------------------------------------------------------------------------- */

Test(config, flags_override_environment)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PSTRAIN_BATCH", "256", "PSTRAIN_LR", "0.5", "PSTRAIN_MODE", "async",
                       "PSTRAIN_HIDDEN", "8,8"),
                   "--batch", "64", "--lr=0.25", "--mode", "sync", "--hidden=3"));
    cr_expect_eq(c.batch, 64);
    cr_expect_eq(c.optim.lr, 0.25f);
    cr_expect_eq(c.mode, PST_MODE_SYNC);
    cr_expect_eq(c.nhidden, 1);
    cr_expect_eq(c.hidden[0], 3);
    /* A later flag wins over an earlier one. */
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--batch=10", "--batch", "20"));
    cr_expect_eq(c.batch, 20);
}

Test(config, both_flag_forms)
{
    pst_config a, b;
    EXPECT_OK(LOAD(&a, PST_ROLE_TRAINER, NOENV, "--pservers", "127.0.0.1:7001", "--trainers",
                   "2", "--trainer-id", "1", "--seed", "99", "--block-bytes", "2M", "--data",
                   "/d", "--optimizer", "adam", "--steps", "10", "--metrics", "/tmp/x"));
    EXPECT_OK(LOAD(&b, PST_ROLE_TRAINER, NOENV, "--pservers=127.0.0.1:7001", "--trainers=2",
                   "--trainer-id=1", "--seed=99", "--block-bytes=2M", "--data=/d",
                   "--optimizer=adam", "--steps=10", "--metrics=/tmp/x"));
    cr_expect_eq(memcmp(&a, &b, sizeof a), 0, "--name value and --name=value differ");
    cr_expect_eq(a.num_pservers, 1);
    cr_expect_str_eq(a.pservers[0], "127.0.0.1:7001");
    cr_expect_eq(a.trainers, 2);
    cr_expect_eq(a.trainer_id, 1);
    cr_expect_eq(a.seed, 99);
    cr_expect_eq(a.block_bytes, (size_t)2 << 20);
    cr_expect_str_eq(a.data_dir, "/d");
    cr_expect_eq(a.optim.kind, PST_OPTIM_ADAM);
    cr_expect_eq(a.steps, 10);
    cr_expect_str_eq(a.metrics_path, "/tmp/x");
    /* "=" splits at the first '=' only; the value may contain more. */
    EXPECT_OK(LOAD(&a, PST_ROLE_TRAINER, NOENV, "--data=/a=b"));
    cr_expect_str_eq(a.data_dir, "/a=b");
    /* Pserver flags. */
    EXPECT_OK(LOAD(&a, PST_ROLE_PSERVER, NOENV, "--port", "7002", "--bind=127.0.0.1",
                   "--server-threads", "3"));
    cr_expect_eq(a.port, 7002);
    cr_expect_str_eq(a.bind_host, "127.0.0.1");
    cr_expect_eq(a.server_threads, 3);
}

Test(config, boolean_flags)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--check-config"));
    cr_expect_eq(c.check_config, 1);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--check-config", "--batch", "5"));
    cr_expect_eq(c.check_config, 1, "a boolean flag does not take the next argument");
    cr_expect_eq(c.batch, 5);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--check-config=0"));
    cr_expect_eq(c.check_config, 0);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--check-config=yes"));
    cr_expect_eq(c.check_config, 1);
}

Test(config, help_skips_the_whole_config_checks)
{
    /* --help must work in a misconfigured environment. */
    pst_config c;
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_TRAINERS", "2")), PST_ERR_INVALID);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_TRAINERS", "2"), "--help"));
    cr_expect_eq(c.help, 1);
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER, NOENV, "--help")); /* no port */
    cr_expect_eq(c.help, 1);
}

/* ---- Paddle names ------------------------------------------------------------------- */

Test(config, paddle_trainer_names)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("TRAINING_ROLE", "TRAINER",
                       "PADDLE_PSERVERS_IP_PORT_LIST", "10.0.0.1:6174,10.0.0.2:6175",
                       "PADDLE_TRAINERS_NUM", "4", "PADDLE_TRAINER_ID", "3")));
    cr_expect_eq(c.num_pservers, 2);
    cr_expect_str_eq(c.pservers[0], "10.0.0.1:6174");
    cr_expect_str_eq(c.pservers[1], "10.0.0.2:6175");
    cr_expect_eq(c.trainers, 4);
    cr_expect_eq(c.trainer_id, 3);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PADDLE_TRAINING_ROLE", "TRAINER")));
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("TRAINING_ROLE", "trainer", "PSTRAIN_ROLE",
                                             "Trainer")));
}

Test(config, paddle_pserver_names)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER,
                   ENV("TRAINING_ROLE", "PSERVER", "POD_IP", "10.0.0.7", "PADDLE_PORT", "6174",
                       "PADDLE_PSERVERS_IP_PORT_LIST", "10.0.0.7:6174,10.0.0.8:6174")));
    cr_expect_eq(c.role, PST_ROLE_PSERVER);
    cr_expect_str_eq(c.bind_host, "10.0.0.7");
    cr_expect_eq(c.port, 6174);
    cr_expect_eq(c.num_pservers, 2);
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER,
                   ENV("PADDLE_TRAINING_ROLE", "PSERVER", "PADDLE_PORT", "6000")));
    cr_expect_eq(c.port, 6000);
}

Test(config, pstrain_names_win_over_paddle_names)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PADDLE_PSERVERS_IP_PORT_LIST", "a:1,b:2,c:3", "PSTRAIN_PSERVERS", "d:4",
                       "PADDLE_TRAINERS_NUM", "4", "PSTRAIN_TRAINERS", "2",
                       "PADDLE_TRAINER_ID", "3", "PSTRAIN_TRAINER_ID", "1")));
    cr_expect_eq(c.num_pservers, 1);
    cr_expect_str_eq(c.pservers[0], "d:4");
    cr_expect_eq(c.trainers, 2);
    cr_expect_eq(c.trainer_id, 1);
    /* The order in the table must not matter: PSTRAIN_ listed first in the env too. */
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PSTRAIN_TRAINERS", "2", "PADDLE_TRAINERS_NUM", "4", "PSTRAIN_PSERVERS",
                       "d:4")));
    cr_expect_eq(c.trainers, 2);

    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER,
                   ENV("POD_IP", "10.0.0.5", "PSTRAIN_BIND", "127.0.0.1", "PADDLE_PORT", "6000",
                       "PSTRAIN_PORT", "7000")));
    cr_expect_str_eq(c.bind_host, "127.0.0.1");
    cr_expect_eq(c.port, 7000);

    /* And flags win over both. */
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PADDLE_TRAINERS_NUM", "4", "PSTRAIN_TRAINERS", "2", "PSTRAIN_PSERVERS",
                       "d:4"),
                   "--trainers", "3"));
    cr_expect_eq(c.trainers, 3);
}

/* ---- roles and the pserver port ----------------------------------------------------- */

/* PSTRAIN_CHAIN: every trainer's relay, in id order; what a chain cannot do yet is refused
 * in one line that names the setting and a good value. */
Test(config, chain_of_trainers)
{
    pst_config cfg;
    EXPECT_OK(LOAD(&cfg, PST_ROLE_TRAINER,
                   ENV("PSTRAIN_PSERVERS", "10.0.0.1:7164", "PSTRAIN_TRAINERS", "3",
                       "PSTRAIN_CHAIN", "10.0.0.5:7200,10.0.0.6:7200,h7:7201")));
    cr_assert_eq(cfg.chain_len, 3);
    cr_assert_str_eq(cfg.chain[2], "h7:7201");
    const char *base[] = {"PSTRAIN_PSERVERS", "10.0.0.1:7164", "PSTRAIN_TRAINERS", "2",
                          "PSTRAIN_CHAIN", "10.0.0.5:7200,10.0.0.6:7200"};
    const struct {
        const char *name, *value, *says;
    } bad[] = {
        {"PSTRAIN_CHAIN", "10.0.0.5:7200", "lists 1 trainers"},
        {"PSTRAIN_CHAIN", "10.0.0.5:7200,10.0.0.6", "host:port"},
        {"PSTRAIN_MODE", "async", "needs --mode sync"},
        {"PSTRAIN_PRECISION", "fp16", "fp16"},
        {"PSTRAIN_ON_FAILURE", "wait", "--on-failure fail"},
        {"PSTRAIN_TLS_CA", "/tls/ca.crt", "TLS"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *env[10] = {0};
        memcpy(env, base, sizeof base);
        if (strcmp(bad[i].name, "PSTRAIN_CHAIN") == 0) { /* in place of the good list */
            env[5] = bad[i].value;
        } else {
            env[6] = bad[i].name;
            env[7] = bad[i].value;
        }
        cr_assert_eq(load_v(&cfg, PST_ROLE_TRAINER, env, (char *[]){"prog", NULL}),
                     PST_ERR_INVALID, "%s=%s was taken", bad[i].name, bad[i].value);
        expect_detail_has("PSTRAIN_CHAIN", bad[i].says);
        expect_detail_has("example", NULL);
    }
}

Test(config, role_mismatch)
{
    static const struct {
        pst_role role;
        const char *var, *val;
    } bad[] = {{PST_ROLE_TRAINER, "TRAINING_ROLE", "PSERVER"},
               {PST_ROLE_TRAINER, "PADDLE_TRAINING_ROLE", "PSERVER"},
               {PST_ROLE_TRAINER, "PSTRAIN_ROLE", "pserver"},
               {PST_ROLE_PSERVER, "TRAINING_ROLE", "TRAINER"},
               {PST_ROLE_PSERVER, "PSTRAIN_ROLE", "trainer"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pst_config c;
        cr_expect_eq(LOAD(&c, bad[i].role, ENV(bad[i].var, bad[i].val, "PSTRAIN_PORT", "7164")),
                     PST_ERR_INVALID, "%s=%s accepted by the %s", bad[i].var, bad[i].val,
                     pst_role_name(bad[i].role));
        expect_detail_has(bad[i].var, bad[i].val);
    }
    pst_config c;
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--role", "pserver"), PST_ERR_INVALID);
    expect_detail_has("--role", NULL);
    /* Not a role at all. */
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, ENV("TRAINING_ROLE", "WORKER")), PST_ERR_INVALID);
    expect_detail_has("TRAINING_ROLE", "example");
}

Test(config, pserver_port_from_id_and_list)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER,
                   ENV("PSTRAIN_PSERVERS", "127.0.0.1:7001,127.0.0.1:7002,[::1]:7003",
                       "PSTRAIN_PSERVER_ID", "1")));
    cr_expect_eq(c.pserver_id, 1);
    cr_expect_eq(c.port, 7002);
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER,
                   ENV("PSTRAIN_PSERVERS", "127.0.0.1:7001,127.0.0.1:7002,[::1]:7003"),
                   "--pserver-id", "2"));
    cr_expect_eq(c.port, 7003);
    /* An explicit port is not replaced by the list's. */
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER,
                   ENV("PSTRAIN_PSERVERS", "127.0.0.1:7001", "PSTRAIN_PSERVER_ID", "0",
                       "PSTRAIN_PORT", "9000")));
    cr_expect_eq(c.port, 9000);
    /* An id past the list. */
    cr_expect_eq(LOAD(&c, PST_ROLE_PSERVER,
                      ENV("PSTRAIN_PSERVERS", "127.0.0.1:7001,127.0.0.1:7002",
                          "PSTRAIN_PSERVER_ID", "2")),
                 PST_ERR_INVALID);
    expect_detail_has("PSTRAIN_PSERVER_ID", "example");
    cr_expect_eq(LOAD(&c, PST_ROLE_PSERVER, ENV("PSTRAIN_PSERVER_ID", "0")), PST_ERR_INVALID);
    expect_detail_has("PSTRAIN_PSERVER_ID", "example");
}

Test(config, pserver_without_port)
{
    pst_config c;
    cr_expect_eq(LOAD(&c, PST_ROLE_PSERVER, NOENV), PST_ERR_INVALID);
    expect_detail_has("PSTRAIN_PORT", "example");
    /* A list alone does not say which entry this pserver is. */
    cr_expect_eq(LOAD(&c, PST_ROLE_PSERVER, ENV("PSTRAIN_PSERVERS", "127.0.0.1:7001")),
                 PST_ERR_INVALID);
    expect_detail_has("PSTRAIN_PORT", "example");
}

/* ---- malformed values --------------------------------------------------------------- */

typedef struct bad_case {
    pst_role role;
    const char *var, *val; /* environment, or NULL */
    const char *argv[3];   /* flags, or empty */
    const char *name;      /* what the detail must name */
} bad_case;

#define T PST_ROLE_TRAINER
#define P PST_ROLE_PSERVER
static const bad_case bad_values[] = {
    {T, "PSTRAIN_BATCH", "abc", {0}, "PSTRAIN_BATCH"},
    {T, "PSTRAIN_BATCH", "0", {0}, "PSTRAIN_BATCH"},
    {T, "PSTRAIN_BATCH", "12.5", {0}, "PSTRAIN_BATCH"},
    {T, "PSTRAIN_BATCH", "128x", {0}, "PSTRAIN_BATCH"},
    {T, "PSTRAIN_BATCH", "99999999999999999999999", {0}, "PSTRAIN_BATCH"},
    {T, "PSTRAIN_TRAINERS", "0", {0}, "PSTRAIN_TRAINERS"},
    {T, "PSTRAIN_TRAINER_ID", "-1", {0}, "PSTRAIN_TRAINER_ID"},
    {T, "PSTRAIN_STEPS", "-1", {0}, "PSTRAIN_STEPS"},
    {T, "PSTRAIN_EPOCHS", "0", {0}, "PSTRAIN_EPOCHS"},
    {T, "PSTRAIN_RPC_TIMEOUT_MS", "5", {0}, "PSTRAIN_RPC_TIMEOUT_MS"},
    {T, "PSTRAIN_THREADS", "-2", {0}, "PSTRAIN_THREADS"},
    {T, "PSTRAIN_PSERVERS", "host-without-port", {0}, "PSTRAIN_PSERVERS"},
    {T, "PSTRAIN_PSERVERS", "h:0", {0}, "PSTRAIN_PSERVERS"},
    {T, "PSTRAIN_PSERVERS", "h:65536", {0}, "PSTRAIN_PSERVERS"},
    {T, "PSTRAIN_PSERVERS", "h:71x", {0}, "PSTRAIN_PSERVERS"},
    {T, "PSTRAIN_PSERVERS", ":7164", {0}, "PSTRAIN_PSERVERS"},
    {T, "PSTRAIN_PSERVERS", "a:1,,b:2", {0}, "PSTRAIN_PSERVERS"},
    {T, "PSTRAIN_MODE", "fast", {0}, "PSTRAIN_MODE"},
    {T, "PSTRAIN_BLOCK_BYTES", "12Q", {0}, "PSTRAIN_BLOCK_BYTES"},
    {T, "PSTRAIN_BLOCK_BYTES", "512", {0}, "PSTRAIN_BLOCK_BYTES"},
    {T, "PSTRAIN_BLOCK_BYTES", "2G", {0}, "PSTRAIN_BLOCK_BYTES"},
    {T, "PSTRAIN_BLOCK_BYTES", "2000.5", {0}, "PSTRAIN_BLOCK_BYTES"},
    {T, "PSTRAIN_BLOCK_BYTES", "-4M", {0}, "PSTRAIN_BLOCK_BYTES"},
    {T, "PSTRAIN_BLOCK_BYTES", "4MX", {0}, "PSTRAIN_BLOCK_BYTES"},
    {T, "PSTRAIN_BLOCK_BYTES", "M", {0}, "PSTRAIN_BLOCK_BYTES"},
    {T, "PSTRAIN_LR", "abc", {0}, "PSTRAIN_LR"},
    {T, "PSTRAIN_LR", "-0.1", {0}, "PSTRAIN_LR"},
    {T, "PSTRAIN_LR", "nan", {0}, "PSTRAIN_LR"},
    {T, "PSTRAIN_LR", "inf", {0}, "PSTRAIN_LR"},
    {T, "PSTRAIN_MOMENTUM", "1.5", {0}, "PSTRAIN_MOMENTUM"},
    {T, "PSTRAIN_HIDDEN", "1024,x", {0}, "PSTRAIN_HIDDEN"},
    {T, "PSTRAIN_HIDDEN", "0", {0}, "PSTRAIN_HIDDEN"},
    {T, "PSTRAIN_HIDDEN", "1024,,1024", {0}, "PSTRAIN_HIDDEN"},
    {T, "PSTRAIN_HIDDEN", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", {0}, "PSTRAIN_HIDDEN"},
    {T, "PSTRAIN_SEED", "-1", {0}, "PSTRAIN_SEED"},
    {T, "PSTRAIN_SEED", "abc", {0}, "PSTRAIN_SEED"},
    {T, "PSTRAIN_OPTIMIZER", "rmsprop", {0}, "PSTRAIN_OPTIMIZER"},
    {T, "PSTRAIN_LR_SCHEDULE", "linear", {0}, "PSTRAIN_LR_SCHEDULE"},
    {T, "PSTRAIN_LOG_LEVEL", "loud", {0}, "PSTRAIN_LOG_LEVEL"},
    {T, "PSTRAIN_PROGRESS", "fancy", {0}, "PSTRAIN_PROGRESS"},
    {T, "PSTRAIN_MODEL", "resnet", {0}, "PSTRAIN_MODEL"},
    {T, "PSTRAIN_DATASET", "cifar10", {0}, "PSTRAIN_DATASET"},
    {T, "PSTRAIN_DEVICES", "cpu:1,cpu:2,cpu:3,cpu:4,cpu:5,cpu:6,cpu:7,cpu:8,cpu:9,cpu:10,cpu:11",
     {0}, "PSTRAIN_DEVICES"},
    {T, "PSTRAIN_ROLE", "worker", {0}, "PSTRAIN_ROLE"},
    {T, "PADDLE_TRAINERS_NUM", "two", {0}, "PADDLE_TRAINERS_NUM"},
    {T, "PADDLE_TRAINER_ID", "x", {0}, "PADDLE_TRAINER_ID"},
    {T, "PADDLE_PSERVERS_IP_PORT_LIST", "nohost", {0}, "PADDLE_PSERVERS_IP_PORT_LIST"},
    {P, "PSTRAIN_PORT", "70000", {0}, "PSTRAIN_PORT"},
    {P, "PADDLE_PORT", "abc", {0}, "PADDLE_PORT"},
    {P, "PSTRAIN_SERVER_THREADS", "0", {0}, "PSTRAIN_SERVER_THREADS"},
    {P, "PSTRAIN_PSERVER_ID", "64", {0}, "PSTRAIN_PSERVER_ID"},
    {T, NULL, NULL, {"--lr=-1"}, "--lr"},
    {T, NULL, NULL, {"--lr", "-1"}, "--lr"},
    {T, NULL, NULL, {"--batch", "abc"}, "--batch"},
    {T, NULL, NULL, {"--block-bytes=12Q"}, "--block-bytes"},
    {T, NULL, NULL, {"--send-ahead=-1"}, "--send-ahead"},
    {T, "PSTRAIN_SEND_AHEAD", "many", {0}, "PSTRAIN_SEND_AHEAD"},
    {T, NULL, NULL, {"--mode", "fast"}, "--mode"},
    {T, NULL, NULL, {"--seed=-3"}, "--seed"},
    {T, NULL, NULL, {"--check-config=maybe"}, "--check-config"},
    {T, "PSTRAIN_COMPUTE_CPUS", "all", {0}, "PSTRAIN_COMPUTE_CPUS"},
    {T, NULL, NULL, {"--compute-cpus", "3-1"}, "--compute-cpus"},
    {T, NULL, NULL, {"--compute-cpus=1,,2"}, "--compute-cpus"},
    {T, NULL, NULL, {"--compute-cpus=0,"}, "--compute-cpus"},
    {T, NULL, NULL, {"--compute-cpus=-1"}, "--compute-cpus"},
    {T, NULL, NULL, {"--compute-cpus=1024"}, "--compute-cpus"},
    {P, NULL, NULL, {"--port", "65536"}, "--port"},
    /* missing value */
    {T, NULL, NULL, {"--batch"}, "--batch"},
    {P, NULL, NULL, {"--port"}, "--port"},
};
#undef T
#undef P

Test(config, malformed_values_name_the_setting_and_an_example)
{
    for (size_t i = 0; i < sizeof bad_values / sizeof bad_values[0]; i++) {
        const bad_case *b = &bad_values[i];
        pst_config c;
        /* A valid base, so only the bad value can be the cause (and a pserver has a port). */
        const char *const env_bad[] = {b->var ? b->var : "PSTRAIN_X_UNUSED",
                                       b->val ? b->val : "",
                                       b->role == PST_ROLE_PSERVER && (!b->var ||
                                           strcmp(b->var, "PSTRAIN_PORT") != 0)
                                           ? "PSTRAIN_PORT" : "PSTRAIN_X_UNUSED2",
                                       "7164", NULL};
        char *argv[4] = {"prog", (char *)b->argv[0], (char *)b->argv[1], NULL};
        pst_status st = load_v(&c, b->role, env_bad, argv);
        cr_expect_eq(st, PST_ERR_INVALID, "case %zu (%s=%s %s %s) gave %s, want invalid", i,
                     b->var ? b->var : "", b->val ? b->val : "", b->argv[0] ? b->argv[0] : "",
                     b->argv[1] ? b->argv[1] : "", pst_strerror(st));
        const char *d = pst_error_detail();
        cr_expect(strstr(d, b->name) != NULL, "case %zu: detail '%s' does not name %s", i, d,
                  b->name);
        cr_expect(strstr(d, "example") != NULL, "case %zu: detail '%s' gives no example", i, d);
    }
}

Test(config, unknown_flag_names_it_and_gives_an_example)
{
    /* A typo is the most common malformed flag; like every other config error its
     * detail must name it and show a good example (not only point at --help). */
    static const char *const flags[] = {"--frobnicate", "--batchsize=3", "--port"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        pst_config c;
        /* --port is a pserver flag: unknown to the trainer. */
        cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, (char *)flags[i], "1"), PST_ERR_INVALID,
                     "%s accepted", flags[i]);
        const char *d = pst_error_detail();
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(flags[i], "="), flags[i]);
        cr_expect(strstr(d, name) != NULL, "detail '%s' does not name %s", d, name);
        cr_expect(strstr(d, "example") != NULL, "detail '%s' gives no example", d);
    }
}

Test(config, positional_argument_is_rejected)
{
    pst_config c;
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "batch", "128"), PST_ERR_INVALID);
    expect_detail_has("batch", "--");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "-batch=128"), PST_ERR_INVALID);
    expect_detail_has("-batch", NULL);
}

/* ---- whole-config checks ------------------------------------------------------------ */

Test(config, trainer_id_must_be_below_trainers)
{
    pst_config c;
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER,
                      ENV("PSTRAIN_TRAINERS", "2", "PSTRAIN_PSERVERS", "127.0.0.1:7164",
                          "PSTRAIN_TRAINER_ID", "2")),
                 PST_ERR_INVALID);
    expect_detail_has("PSTRAIN_TRAINER_ID", "example");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--trainer-id", "1"), PST_ERR_INVALID);
    expect_detail_has("PSTRAIN_TRAINER_ID", "example");
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PSTRAIN_TRAINERS", "2", "PSTRAIN_PSERVERS", "127.0.0.1:7164",
                       "PSTRAIN_TRAINER_ID", "1")));
}

Test(config, several_trainers_need_pservers)
{
    pst_config c;
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_TRAINERS", "2")), PST_ERR_INVALID);
    expect_detail_has("PSTRAIN_PSERVERS", "example");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, ENV("PADDLE_TRAINERS_NUM", "3")), PST_ERR_INVALID);
    expect_detail_has("PSTRAIN_PSERVERS", "example");
    /* One trainer with pservers is fine (a single trainer using the pserver path). */
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_PSERVERS", "127.0.0.1:7164")));
}

Test(config, batch_covers_every_trainer)
{
    pst_config c;
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER,
                      ENV("PSTRAIN_TRAINERS", "4", "PSTRAIN_PSERVERS", "127.0.0.1:7164",
                          "PSTRAIN_BATCH", "3")),
                 PST_ERR_INVALID);
    expect_detail_has("batch", "example");
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PSTRAIN_TRAINERS", "4", "PSTRAIN_PSERVERS", "127.0.0.1:7164",
                       "PSTRAIN_BATCH", "4")));
}

/* ---- JSON print --------------------------------------------------------------------- */

/* A strict JSON (RFC 8259) recognizer; top-level keys must be unique. */
typedef struct json {
    const char *p;
    int depth;
    char keys[128][64];
    int nkeys;
    int dup;
} json;

static void ws(json *j)
{
    while (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')
        j->p++;
}

static int jstring(json *j, char *out, size_t outsz)
{
    size_t n = 0;
    if (*j->p != '"')
        return 0;
    j->p++;
    while (*j->p != '"') {
        unsigned char ch = (unsigned char)*j->p;
        if (ch == '\0' || ch < 0x20)
            return 0;
        if (ch == '\\') {
            j->p++;
            if (*j->p == 'u') {
                for (int k = 1; k <= 4; k++)
                    if (!strchr("0123456789abcdefABCDEF", j->p[k]) || !j->p[k])
                        return 0;
                j->p += 4;
            } else if (!*j->p || !strchr("\"\\/bfnrt", *j->p)) {
                return 0;
            }
        }
        if (out && n + 1 < outsz)
            out[n++] = *j->p;
        j->p++;
    }
    if (out)
        out[n] = '\0';
    j->p++;
    return 1;
}

static int jnumber(json *j)
{
    const char *p = j->p;
    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (*p >= '0' && *p <= '9')
            p++;
    else
        return 0;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9'))
            return 0;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(*p >= '0' && *p <= '9'))
            return 0;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    j->p = p;
    return 1;
}

static int jvalue(json *j);

static int jobject(json *j)
{
    int top = j->depth == 0;
    j->depth++;
    j->p++; /* { */
    ws(j);
    if (*j->p == '}') {
        j->p++;
        j->depth--;
        return 1;
    }
    for (;;) {
        char key[64];
        ws(j);
        if (!jstring(j, key, sizeof key))
            return 0;
        if (top) {
            for (int k = 0; k < j->nkeys; k++)
                if (strcmp(j->keys[k], key) == 0)
                    j->dup = 1;
            if (j->nkeys < 128)
                snprintf(j->keys[j->nkeys++], 64, "%s", key);
        }
        ws(j);
        if (*j->p++ != ':')
            return 0;
        if (!jvalue(j))
            return 0;
        ws(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        if (*j->p == '}') {
            j->p++;
            j->depth--;
            return 1;
        }
        return 0;
    }
}

static int jarray(json *j)
{
    j->depth++;
    j->p++;
    ws(j);
    if (*j->p == ']') {
        j->p++;
        j->depth--;
        return 1;
    }
    for (;;) {
        if (!jvalue(j))
            return 0;
        ws(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        if (*j->p == ']') {
            j->p++;
            j->depth--;
            return 1;
        }
        return 0;
    }
}

static int jvalue(json *j)
{
    ws(j);
    switch (*j->p) {
    case '{': return jobject(j);
    case '[': return jarray(j);
    case '"': return jstring(j, NULL, 0);
    case 't': return strncmp(j->p, "true", 4) == 0 ? (j->p += 4, 1) : 0;
    case 'f': return strncmp(j->p, "false", 5) == 0 ? (j->p += 5, 1) : 0;
    case 'n': return strncmp(j->p, "null", 4) == 0 ? (j->p += 4, 1) : 0;
    default: return jnumber(j);
    }
}

/* The line must be exactly one JSON object followed by "\n". */
static void expect_json_line(const char *s)
{
    size_t len = strlen(s);
    cr_assert_gt(len, 2);
    cr_expect_eq(s[len - 1], '\n', "not newline-terminated: %s", s);
    cr_expect_eq(strchr(s, '\n'), s + len - 1, "more than one line: %s", s);
    json j = {.p = s};
    ws(&j);
    cr_assert_eq(*j.p, '{', "not an object: %s", s);
    int ok = jvalue(&j);
    cr_expect(ok, "invalid JSON near '%.30s' in %s", j.p, s);
    if (ok) {
        cr_expect_str_eq(j.p, "\n", "trailing text '%s'", j.p);
        cr_expect(!j.dup, "duplicate top-level key in %s", s);
    }
}

static char *print_config(const pst_config *c)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    pst_config_print(f, c);
    fclose(f);
    return buf;
}

static void expect_has(const char *s, const char *needle)
{
    cr_expect(strstr(s, needle) != NULL, "'%s' not in %s", needle, s);
}

Test(config, print_trainer_json)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PSTRAIN_PSERVERS", "10.0.0.1:7164,10.0.0.2:7164", "PSTRAIN_TRAINERS",
                       "2", "PSTRAIN_TRAINER_ID", "1", "PSTRAIN_MODE", "async",
                       "PSTRAIN_HIDDEN", "512,256", "PSTRAIN_BLOCK_BYTES", "64K",
                       "PSTRAIN_SEED", "18446744073709551615", "PSTRAIN_EPS", "1e-8",
                       "PSTRAIN_OPTIMIZER", "adam", "PSTRAIN_LR_SCHEDULE", "warmup_cosine"),
                   "--batch", "256", "--lr=0.125", "--metrics", "/tmp/run.jsonl"));
    char *s = print_config(&c);
    expect_json_line(s);
    expect_has(s, "\"role\":\"trainer\"");
    expect_has(s, "\"pservers\":\"10.0.0.1:7164,10.0.0.2:7164\"");
    expect_has(s, "\"trainers\":2");
    expect_has(s, "\"trainer_id\":1");
    expect_has(s, "\"mode\":\"async\"");
    expect_has(s, "\"block_bytes\":65536");
    expect_has(s, "\"hidden\":\"512,256\"");
    expect_has(s, "\"batch\":256");
    expect_has(s, "\"seed\":18446744073709551615");
    expect_has(s, "\"optimizer\":\"adam\"");
    expect_has(s, "\"lr\":0.125");
    expect_has(s, "\"lr_schedule\":\"warmup_cosine\"");
    expect_has(s, "\"metrics\":\"/tmp/run.jsonl\"");
    expect_has(s, "\"model\":\"mlp\"");
    expect_has(s, "\"devices\":\"cpu:1\"");
    free(s);

    /* Defaults print too, with an empty pserver list and no hidden layer. */
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_HIDDEN", "none")));
    s = print_config(&c);
    expect_json_line(s);
    expect_has(s, "\"pservers\":\"\"");
    expect_has(s, "\"hidden\":\"\"");
    free(s);
}

/* Mixed precision: --precision sets the gradient dtype too unless --grad-dtype is given;
 * micro-batches must each get a row of every trainer's share; the fp16 loss scale is a
 * power of two; bad values name the setting and an example. */
Test(config, precision_micro_batches_and_loss_scale)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV));
    cr_expect_eq(c.precision, PST_F32);
    cr_expect_eq(c.grad_dtype, PST_F32);
    cr_expect_eq(c.acc_steps, 1);
    cr_expect_eq(c.loss_scale, 65536.0f);
    cr_expect_eq(c.loss_scale_window, 2000);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_PRECISION", "bf16")));
    cr_expect_eq(c.precision, PST_BF16);
    cr_expect_eq(c.grad_dtype, PST_BF16);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_PRECISION", "fp16"), "--grad-dtype",
                   "fp32", "--acc-steps", "4", "--loss-scale", "1024"));
    cr_expect_eq(c.precision, PST_F16);
    cr_expect_eq(c.grad_dtype, PST_F32);
    cr_expect_eq(c.acc_steps, 4);
    cr_expect_eq(c.loss_scale, 1024.0f);
    char *s = print_config(&c);
    expect_json_line(s);
    expect_has(s, "\"precision\":\"f16\"");
    expect_has(s, "\"grad_dtype\":\"f32\"");
    expect_has(s, "\"acc_steps\":4");
    free(s);

    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_PRECISION", "fp8")), PST_ERR_INVALID);
    expect_detail_has("PSTRAIN_PRECISION=fp8", "bf16");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--grad-dtype", "int8"), PST_ERR_INVALID);
    expect_detail_has("grad-dtype", "example");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--acc-steps", "0"), PST_ERR_INVALID);
    expect_detail_has("acc-steps", "example");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--loss-scale", "1000"), PST_ERR_INVALID);
    expect_detail_has("loss-scale", "power of two");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--loss-scale", "0"), PST_ERR_INVALID);
    expect_detail_has("loss-scale", NULL);
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--loss-scale", "-65536"), PST_ERR_INVALID);
    expect_detail_has("loss-scale", NULL);
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--loss-scale", "33554432"), /* 2^25 */
                 PST_ERR_INVALID);
    expect_detail_has("loss-scale", NULL);
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--loss-scale", "nan"), PST_ERR_INVALID);
    expect_detail_has("loss-scale", NULL);
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--loss-scale-window", "0"), PST_ERR_INVALID);
    expect_detail_has("loss-scale-window", "example");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER,
                      ENV("PSTRAIN_PSERVERS", "127.0.0.1:7164", "PSTRAIN_MODE", "async"),
                      "--precision", "fp16"),
                 PST_ERR_INVALID);
    expect_detail_has("fp16", "sync");
    /* 2 trainers x 4 micro-batches need 8 rows */
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER,
                      ENV("PSTRAIN_TRAINERS", "2", "PSTRAIN_PSERVERS", "127.0.0.1:7164"),
                      "--batch", "7", "--acc-steps", "4"),
                 PST_ERR_INVALID);
    expect_detail_has("batch", "micro-batches");
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PSTRAIN_TRAINERS", "2", "PSTRAIN_PSERVERS", "127.0.0.1:7164"), "--batch",
                   "8", "--acc-steps", "4"));
}

Test(config, print_pserver_json)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER,
                   ENV("PSTRAIN_PSERVERS", "127.0.0.1:7001,127.0.0.1:7002", "PSTRAIN_PSERVER_ID",
                       "1", "PSTRAIN_BIND", "127.0.0.1", "PSTRAIN_SERVER_THREADS", "3")));
    char *s = print_config(&c);
    expect_json_line(s);
    expect_has(s, "\"role\":\"pserver\"");
    expect_has(s, "\"port\":7002");
    expect_has(s, "\"pserver_id\":1");
    expect_has(s, "\"server_threads\":3");
    expect_has(s, "\"bind\":\"127.0.0.1\"");
    cr_expect_null(strstr(s, "rpc_timeout_ms"), "trainer-only setting printed for a pserver");
    free(s);
}

Test(config, print_escapes_strings)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER,
                   ENV("PSTRAIN_METRICS", "/tmp/a\"b\\c", "PSTRAIN_DATA", "/tmp/tab\there")));
    char *s = print_config(&c);
    expect_json_line(s);
    expect_has(s, "\"metrics\":\"/tmp/a\\\"b\\\\c\"");
    free(s);
}

Test(config, names)
{
    cr_expect_str_eq(pst_role_name(PST_ROLE_TRAINER), "trainer");
    cr_expect_str_eq(pst_role_name(PST_ROLE_PSERVER), "pserver");
    cr_expect_str_eq(pst_mode_name(PST_MODE_SYNC), "sync");
    cr_expect_str_eq(pst_mode_name(PST_MODE_ASYNC), "async");
}

/* ---- help --------------------------------------------------------------------------- */

static char *help_text(pst_role role)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    pst_config_print_help(f, role, "build/bin/prog");
    fclose(f);
    return buf;
}

Test(config, help_lists_variables)
{
    char *t = help_text(PST_ROLE_TRAINER), *p = help_text(PST_ROLE_PSERVER);
    expect_has(t, "build/bin/prog");
    static const char *const trainer_names[] = {
        "PSTRAIN_PSERVERS", "PADDLE_PSERVERS_IP_PORT_LIST", "PSTRAIN_TRAINERS",
        "PADDLE_TRAINERS_NUM", "PSTRAIN_TRAINER_ID", "PADDLE_TRAINER_ID", "PSTRAIN_ROLE",
        "TRAINING_ROLE", "PADDLE_TRAINING_ROLE", "PSTRAIN_MODE", "PSTRAIN_BLOCK_BYTES",
        "PSTRAIN_HIDDEN", "PSTRAIN_BATCH", "PSTRAIN_LR", "PSTRAIN_SEED", "PSTRAIN_METRICS",
        "--batch 128", "--block-bytes 4M", "--hidden 1024,1024", "--check-config", "--help"};
    for (size_t i = 0; i < sizeof trainer_names / sizeof trainer_names[0]; i++)
        expect_has(t, trainer_names[i]);
    static const char *const pserver_names[] = {
        "PSTRAIN_PORT", "PADDLE_PORT", "PSTRAIN_BIND", "POD_IP", "PSTRAIN_PSERVER_ID",
        "PSTRAIN_PSERVERS", "PSTRAIN_SERVER_THREADS", "PSTRAIN_LOG_LEVEL", "TRAINING_ROLE",
        "--port 7164"};
    for (size_t i = 0; i < sizeof pserver_names / sizeof pserver_names[0]; i++)
        expect_has(p, pserver_names[i]);
    /* Each program lists its own settings only. */
    cr_expect_null(strstr(t, "PSTRAIN_PORT"), "trainer help lists PSTRAIN_PORT");
    cr_expect_null(strstr(t, "PSTRAIN_SERVER_THREADS"));
    cr_expect_null(strstr(p, "PSTRAIN_BATCH"), "pserver help lists PSTRAIN_BATCH");
    cr_expect_null(strstr(p, "PSTRAIN_BLOCK_BYTES"));
    cr_expect_null(strstr(p, "PSTRAIN_THREADS"), "BLAS threads are the trainer's");
    expect_has(p, "PSTRAIN_METRICS"); /* the pserver's record at exit */
    free(t);
    free(p);
}

/* --help lists the settings by topic: every option is in exactly one topic, the topics'
 * headings come in order, and a setting sits under its own topic's heading. */
Test(config, help_is_grouped_by_topic)
{
    char unlisted[512];
    cr_expect_eq(pst_config_unlisted_options(unlisted, sizeof unlisted), 0,
                 "options in no topic, or topic words naming no option: %s", unlisted);
    cr_expect_eq(pst_config_topic_of("checkpoint-every"), pst_config_topic_of("resume"));
    cr_expect_neq(pst_config_topic_of("checkpoint-every"), pst_config_topic_of("lr"));
    cr_expect_eq(pst_config_topic_of("no-such-flag"), -1);
    char *t = help_text(PST_ROLE_TRAINER), *p = help_text(PST_ROLE_PSERVER);
    const char *cl = strstr(t, "\nCluster:\n"), *tr = strstr(t, "\nTraining:\n");
    const char *ck = strstr(t, "\nCheckpoints and recovery:\n");
    cr_assert(cl && tr && ck, "topic headings missing from the trainer's help:\n%s", t);
    cr_expect(cl < tr && tr < ck, "topics out of order");
    const char *lr = strstr(t, "  --lr "), *every = strstr(t, "  --checkpoint-every ");
    cr_assert(lr && every);
    cr_expect(lr > tr && lr < ck, "--lr is not under Training");
    cr_expect(every > ck, "--checkpoint-every is not under Checkpoints and recovery");
    /* a topic with none of a program's settings has no heading in its help */
    cr_expect_null(strstr(p, "\nTraining:\n"), "the pserver's help shows an empty topic");
    expect_has(p, "\nPserver limits:\n");
    cr_expect_null(strstr(t, "\nPserver limits:\n"));
    free(t);
    free(p);
}

Test(config, help_lists_every_variable_config_reads)
{
    /* Every "PSTRAIN_..." string literal in config.c is a variable the table reads; each
     * must appear in the help of at least one program. */
    char path[1024];
    snprintf(path, sizeof path, "%s/common/config.c", PST_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot read %s", path);
    static char src[1 << 17];
    size_t n = fread(src, 1, sizeof src - 1, f);
    fclose(f);
    src[n] = '\0';
    char *t = help_text(PST_ROLE_TRAINER), *p = help_text(PST_ROLE_PSERVER);
    int found = 0;
    for (const char *s = src; (s = strstr(s, "\"PSTRAIN_")) != NULL; s++) {
        size_t len = strspn(s + 1, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
        if (s[1 + len] != '"')
            continue; /* inside a longer message */
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)len, s + 1);
        /* Match the whole name, not a prefix (PSTRAIN_LR vs PSTRAIN_LR_SCHEDULE). */
        char with_sep[70];
        int listed = 0;
        const char *seps[] = {"\n", ","};
        for (int k = 0; k < 2 && !listed; k++) {
            snprintf(with_sep, sizeof with_sep, "env %s%s", name, seps[k]);
            listed = strstr(t, with_sep) || strstr(p, with_sep);
        }
        cr_expect(listed, "%s is read by config.c but not in --help", name);
        found++;
    }
    cr_expect_gt(found, 30, "only %d PSTRAIN_ variables found in %s", found, path);
    free(t);
    free(p);
}

Test(config, pipeline_flags)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV));
    cr_expect_eq(c.pipeline, 1);
    cr_expect_eq(c.micro_batches, 1);
    cr_expect_eq(c.schedule, PST_SCHEDULE_1F1B);
    cr_expect_eq(c.virtual_stages, 1);
    cr_expect_eq(c.npartition, 0);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_PIPELINE", "4"), "--micro-batches", "8",
                   "--schedule", "Interleaved", "--virtual-stages", "2", "--partition",
                   "1,1,1,1,1,1,1,1"));
    cr_expect_eq(c.pipeline, 4);
    cr_expect_eq(c.micro_batches, 8);
    cr_expect_eq(c.schedule, PST_SCHEDULE_INTERLEAVED);
    cr_expect_eq(c.virtual_stages, 2);
    cr_expect_eq(c.npartition, 8);
    char *s = print_config(&c);
    expect_json_line(s);
    expect_has(s, "\"pipeline\":4");
    expect_has(s, "\"micro_batches\":8");
    expect_has(s, "\"schedule\":\"interleaved\"");
    free(s);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--schedule", "gpipe"));
    cr_expect_eq(c.schedule, PST_SCHEDULE_GPIPE);

    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--schedule", "zigzag"), PST_ERR_INVALID);
    expect_detail_has("--schedule=zigzag", "1f1b");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--micro-batches", "4"), PST_ERR_INVALID);
    expect_detail_has("--micro-batches 4 without --pipeline", "--acc-steps 4");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--pipeline", "2", "--acc-steps", "2"),
                 PST_ERR_INVALID);
    expect_detail_has("--acc-steps 2 with --pipeline 2", "--micro-batches 2");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--virtual-stages", "2"), PST_ERR_INVALID);
    expect_detail_has("--virtual-stages 2", "--schedule interleaved");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--pipeline", "2", "--micro-batches", "128",
                      "--batch", "64"), PST_ERR_INVALID);
    expect_detail_has("--batch 64", "micro-batches");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--partition", "2,0,3"), PST_ERR_INVALID);
    expect_detail_has("--partition=2,0,3", "layer counts");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--pipeline", "0"), PST_ERR_INVALID);
    expect_detail_has("pipeline", "example");
}

Test(config, checkpoint_flags)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV));
    cr_expect_str_eq(c.checkpoint_dir, "");
    cr_expect_eq(c.checkpoint_every, 100);
    cr_expect_eq(c.checkpoint_keep, 2);
    cr_expect_eq(c.resume, PST_RESUME_AUTO);
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_CHECKPOINT_DIR", "/tmp/x"),
                   "--checkpoint-every", "5", "--checkpoint-keep", "3", "--resume", "Require"));
    cr_expect_str_eq(c.checkpoint_dir, "/tmp/x");
    cr_expect_eq(c.checkpoint_every, 5);
    cr_expect_eq(c.checkpoint_keep, 3);
    cr_expect_eq(c.resume, PST_RESUME_REQUIRE);
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER, ENV("PSTRAIN_CHECKPOINT_DIR", "/tmp/y"), "--port", "7"));
    cr_expect_str_eq(c.checkpoint_dir, "/tmp/y");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--resume", "sometimes"), PST_ERR_INVALID);
    expect_detail_has("--resume=sometimes", "require");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--checkpoint-keep", "0"), PST_ERR_INVALID);
    expect_detail_has("checkpoint-keep", "example");
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--checkpoint-dir", "/tmp/x", "--mode",
                   "async"));
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--checkpoint-dir", "/tmp/x", "--precision",
                   "fp16"));
    /* --job-id: a directory name, never a path */
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--job-id", "ctr-2026.11_a"));
    cr_expect_str_eq(c.job_id, "ctr-2026.11_a");
    char bad_ids[][8] = {"../x", "a/b", ".hidden", "x y"};
    for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
        cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--job-id", bad_ids[i]), PST_ERR_INVALID,
                     "--job-id %s", bad_ids[i]);
        expect_detail_has("--job-id", "letters, digits");
    }
}

Test(config, recovery_flags)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV));
    cr_expect_eq(c.on_failure, PST_ON_FAILURE_FAIL);
    cr_expect_eq(c.recovery_timeout_ms, 300000);
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER, ENV("PSTRAIN_ON_FAILURE", "Wait",
                                             "PSTRAIN_RECOVERY_TIMEOUT_MS", "1500"), "--port", "7"));
    cr_expect_eq(c.on_failure, PST_ON_FAILURE_WAIT);
    cr_expect_eq(c.recovery_timeout_ms, 1500);
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--on-failure", "retry"), PST_ERR_INVALID);
    expect_detail_has("--on-failure=retry", "wait or fail");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--recovery-timeout-ms", "10"), PST_ERR_INVALID);
    expect_detail_has("recovery-timeout-ms", "example");
}

/* A token file: the token inside, whitespace around it ignored; empty, missing, with both
 * variables set, or with a space inside: one line naming the file or variable, and the
 * token itself never in a message. */
Test(config, token_from_the_environment_or_a_file)
{
    pst_config c;
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV));
    cr_expect_str_eq(c.token, "");
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_TOKEN", "abc123")));
    cr_expect_str_eq(c.token, "abc123");
    char path[] = "/tmp/pst_token_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "\n  s3cr3t-t0ken \t\n", 18), 18);
    close(fd);
    EXPECT_OK(LOAD(&c, PST_ROLE_PSERVER, ENV("PSTRAIN_TOKEN_FILE", path), "--port", "7"));
    cr_expect_str_eq(c.token, "s3cr3t-t0ken");
    cr_expect_eq(LOAD(&c, PST_ROLE_PSERVER, ENV("PSTRAIN_TOKEN_FILE", path, "PSTRAIN_TOKEN", "x"),
                      "--port", "7"), PST_ERR_INVALID);
    expect_detail_has("both PSTRAIN_TOKEN and PSTRAIN_TOKEN_FILE", "example");
    FILE *f = fopen(path, "w");
    fputs(" \n\t", f);
    fclose(f);
    cr_expect_eq(LOAD(&c, PST_ROLE_PSERVER, ENV("PSTRAIN_TOKEN_FILE", path), "--port", "7"),
                 PST_ERR_INVALID);
    expect_detail_has(path, "empty");
    f = fopen(path, "w");
    fputs("two words", f);
    fclose(f);
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_TOKEN_FILE", path)), PST_ERR_INVALID);
    expect_detail_has(path, "space");
    cr_expect(!strstr(pst_error_detail(), "two words"), "%s", pst_error_detail());
    unlink(path);
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_TOKEN_FILE", path)), PST_ERR_INVALID);
    expect_detail_has(path, "cannot read");
    char big[PST_TOKEN_MAX + 10];
    memset(big, 'k', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, ENV("PSTRAIN_TOKEN", big)), PST_ERR_INVALID);
    expect_detail_has("PSTRAIN_TOKEN", "longer than");
    cr_expect(!strstr(pst_error_detail(), "kkkkkkkk"), "%s", pst_error_detail());
}

/* The optimizer's ranges are one table (optim_config.h): the trainer's flags and a
 * pserver's Init (service.c, pst_optim_check) refuse the same values. */
Test(config, optimizer_ranges_are_one_table)
{
    pst_config c;
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--beta1", "1"), PST_ERR_INVALID);
    expect_detail_has("--beta1=1", "[0, 1)");
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--beta1", "0.999"));
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--lr", "1e7"), PST_ERR_INVALID);
    expect_detail_has("--lr=1e7", "[0, 1e+06]");
    cr_expect_eq(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--optimizer", "adam", "--eps", "0"),
                 PST_ERR_INVALID);
    expect_detail_has("--optimizer adam", "needs eps > 0");
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV, "--optimizer", "sgd", "--eps", "0"));
    /* the same table behind pst_optim_check, which a pserver's Init runs */
    EXPECT_OK(LOAD(&c, PST_ROLE_TRAINER, NOENV));
    cr_expect_eq(pst_optim_check(&c.optim), PST_OK);
    c.optim.beta1 = 1.0f;
    cr_expect_eq(pst_optim_check(&c.optim), PST_ERR_INVALID);
    cr_expect(strstr(pst_error_detail(), "beta1 1 out of range [0, 1)"), "%s",
              pst_error_detail());
    const pst_optim_range *r = pst_optim_range_of("weight-decay");
    cr_assert_not_null(r);
    cr_expect(pst_optim_in_range(r, 1e3) && !pst_optim_in_range(r, 1001) &&
              !pst_optim_in_range(r, -1e-9));
    cr_expect_null(pst_optim_range_of("batch"));
}
