/* gen_corpus.c — writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/seed-*)
 * with pstrain's own encoders and writers, so the seeds are what the programs really send
 * and write: wire bodies from rpc_wire_encode, shards from ps_shard_save, checkpoint files
 * from the pst_ckpt writer, IDX files as Fashion-MNIST's (plain and gzipped), and command
 * lines and environments in the form of fuzz_config.c. Also a few cut and corrupted ones.
 *
 * usage: fuzz_gen_corpus DIR   (make fuzz-corpus; run once, the outputs are committed).
 * Deterministic: the same files on every run. Not part of any test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <grpc/byte_buffer_reader.h>

#include "common/checkpoint.h"
#include "common/dtype.h"
#include "pserver/shard.h"
#include "rpc/global.h"
#include "rpc/wire.h"

static const char *out_dir;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_gen_corpus: %s\n", what);
    exit(1);
}

static void put(const char *target, const char *name, const void *data, size_t size)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_dir, target);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/seed-%s", out_dir, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
        die(path);
}

/* ---- wire ------------------------------------------------------------------------------ */

/* Encodes header + payload as rpc_wire_encode does and writes the body, then the same body
 * cut short (in the payload when there is one, else in the header). */
static void body(const char *target, const char *name, const ProtobufCMessage *header,
                 const void *payload, size_t bytes)
{
    grpc_byte_buffer *bb;
    if (rpc_wire_encode(header, payload, bytes, NULL, NULL, &bb) != PST_OK)
        die("rpc_wire_encode");
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        die("grpc_byte_buffer_reader_init");
    grpc_slice all = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    grpc_byte_buffer_destroy(bb);
    const size_t len = GRPC_SLICE_LENGTH(all);
    put(target, name, GRPC_SLICE_START_PTR(all), len);
    char cut[128];
    snprintf(cut, sizeof cut, "%s-cut", name);
    if (len > 5)
        put(target, cut, GRPC_SLICE_START_PTR(all), len - (bytes ? 3 : 1));
    grpc_slice_unref(all);
}

static void wire_edges(const char *target)
{
    static const uint8_t empty_header[4] = {0, 0, 0, 0};
    static const uint8_t short3[3] = {2, 0, 0};
    static const uint8_t too_long[6] = {0xff, 0xff, 0xff, 0x7f, 0x08, 0x01};
    static const uint8_t bad_varint[15] = {11, 0, 0, 0, 0x08, 0xff, 0xff, 0xff, 0xff,
                                           0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    put(target, "empty", "", 0);
    put(target, "short-length", short3, sizeof short3);
    put(target, "empty-header", empty_header, sizeof empty_header);
    put(target, "header-length-beyond-body", too_long, sizeof too_long);
    put(target, "bad-varint", bad_varint, sizeof bad_varint);
}

static void wire(void)
{
    float vals[6] = {1.5f, -2.0f, 0.25f, 1e-3f, 3.0e4f, -0.0f};
    uint16_t half[6], bf[6];
    pst_cast(half, PST_F16, vals, PST_F32, 6);
    pst_cast(bf, PST_BF16, vals, PST_F32, 6);

    Pstrain__OptimConfig optim = PSTRAIN__OPTIM_CONFIG__INIT;
    optim.kind = "adamw";
    optim.lr = 0.001f;
    optim.beta1 = 0.9f;
    optim.beta2 = 0.99f;
    optim.eps = 1e-8f;
    optim.schedule = "warmup_cosine";
    optim.warmup_steps = 10;
    optim.total_steps = 100;
    Pstrain__BlockSpec b0 = PSTRAIN__BLOCK_SPEC__INIT, b1 = PSTRAIN__BLOCK_SPEC__INIT;
    b0.id = 0, b0.offset = 0, b0.length = 4;
    b1.id = 3, b1.offset = 4, b1.length = 2;
    Pstrain__BlockSpec *blocks[2] = {&b0, &b1};
    int64_t resume[2] = {200, 100};
    Pstrain__InitRequest init = PSTRAIN__INIT_REQUEST__INIT;
    init.trainer_id = 0;
    init.num_trainers = 2;
    init.mode = PSTRAIN__MODE__SYNC;
    init.total_params = 6;
    init.n_blocks = 2;
    init.blocks = blocks;
    init.optim = &optim;
    init.fingerprint = 0x1234567890abcdefull;
    init.precision = PSTRAIN__DTYPE__BF16;
    init.checkpoint_every = 100;
    init.n_resume_steps = 2;
    init.resume_steps = resume;
    body("wire_init", "request-trainer0", &init.base, vals, sizeof vals);
    init.trainer_id = 1;
    init.optim = NULL;
    init.n_resume_steps = 0;
    body("wire_init", "request-trainer1-no-payload", &init.base, NULL, 0);
    Pstrain__SparseTableSpec tab0 = PSTRAIN__SPARSE_TABLE_SPEC__INIT;
    Pstrain__SparseTableSpec tab1 = PSTRAIN__SPARSE_TABLE_SPEC__INIT;
    tab0.name = "field_0", tab0.dim = 16, tab0.optim = "adagrad", tab0.lr = 0.05;
    tab0.eps = 1e-10, tab0.init_std = 0.01f, tab0.seed = 7, tab0.admit_count = 2;
    tab0.evict_after = 100, tab0.max_rows = 4096;
    tab1.name = "field_1", tab1.dim = 8, tab1.optim = "adam", tab1.lr = 0.001;
    tab1.eps = 1e-8, tab1.beta1 = 0.9, tab1.beta2 = 0.999, tab1.seed = 7;
    Pstrain__SparseTableSpec *tables[2] = {&tab0, &tab1};
    init.n_sparse_tables = 2;
    init.sparse_tables = tables;
    init.sparse_shard = 1;
    init.sparse_shards = 2;
    body("wire_init", "request-sparse-tables", &init.base, NULL, 0);
    init.n_sparse_tables = 0;
    init.sparse_tables = NULL;
    init.sparse_shard = 0;
    init.sparse_shards = 0;
    Pstrain__InitReply init_rep = PSTRAIN__INIT_REPLY__INIT;
    init_rep.version = 100;
    body("wire_init", "reply", &init_rep.base, NULL, 0);
    wire_edges("wire_init");

    Pstrain__PushRequest push = PSTRAIN__PUSH_REQUEST__INIT;
    push.trainer_id = 1;
    push.step = 42;
    push.block = 3;
    push.length = 6;
    push.dtype = PSTRAIN__DTYPE__F32;
    body("wire_push", "request-f32", &push.base, vals, sizeof vals);
    push.dtype = PSTRAIN__DTYPE__F16;
    push.scale = 1024.0f;
    body("wire_push", "request-f16-scaled", &push.base, half, sizeof half);
    push.dtype = PSTRAIN__DTYPE__BF16;
    push.scale = 0.0f;
    body("wire_push", "request-bf16", &push.base, bf, sizeof bf);
    push.length = 7; /* one element more than the payload */
    body("wire_push", "request-length-mismatch", &push.base, bf, sizeof bf);
    Pstrain__PushReply push_rep = PSTRAIN__PUSH_REPLY__INIT;
    push_rep.duplicate = 1;
    body("wire_push", "reply-duplicate", &push_rep.base, NULL, 0);
    wire_edges("wire_push");

    Pstrain__PullRequest pull = PSTRAIN__PULL_REQUEST__INIT;
    pull.block = 3;
    pull.version = 43;
    pull.dtype = PSTRAIN__DTYPE__BF16;
    body("wire_pull", "request", &pull.base, NULL, 0);
    Pstrain__PullReply pull_rep = PSTRAIN__PULL_REPLY__INIT;
    pull_rep.block = 3;
    pull_rep.version = 43;
    pull_rep.length = 6;
    pull_rep.held_us = 1234;
    pull_rep.dtype = PSTRAIN__DTYPE__F32;
    body("wire_pull", "reply-f32", &pull_rep.base, vals, sizeof vals);
    pull_rep.dtype = PSTRAIN__DTYPE__F16;
    body("wire_pull", "reply-f16", &pull_rep.base, half, sizeof half);
    pull_rep.dtype = PSTRAIN__DTYPE__BF16;
    body("wire_pull", "reply-bf16", &pull_rep.base, bf, sizeof bf);
    wire_edges("wire_pull");

    Pstrain__FinishRequest fin = PSTRAIN__FINISH_REQUEST__INIT;
    fin.trainer_id = 1;
    body("wire_finish", "request", &fin.base, NULL, 0);
    fin.early = 1;
    fin.step = 17;
    fin.reason = "stopped by signal";
    fin.checkpoint_step = 17;
    body("wire_finish", "request-early", &fin.base, NULL, 0);
    Pstrain__FinishReply fin_rep = PSTRAIN__FINISH_REPLY__INIT;
    body("wire_finish", "reply", &fin_rep.base, NULL, 0);
    fin_rep.sparse_rows = 3000;
    fin_rep.sparse_bytes = 1u << 20;
    fin_rep.rows_created = 3500;
    fin_rep.rows_evicted = 500;
    fin_rep.pushes_refused = 1200;
    fin_rep.sparse_hash = 0x9e3779b97f4a7c15ull;
    body("wire_finish", "reply-sparse", &fin_rep.base, NULL, 0);
    wire_edges("wire_finish");

    Pstrain__VoteRequest vote = PSTRAIN__VOTE_REQUEST__INIT;
    vote.trainer_id = 1;
    vote.step = 9;
    vote.overflow = 1;
    body("wire_vote", "request-overflow", &vote.base, NULL, 0);
    Pstrain__VoteReply vote_rep = PSTRAIN__VOTE_REPLY__INIT;
    vote_rep.skip = 1;
    vote_rep.step = 9;
    body("wire_vote", "reply-skip", &vote_rep.base, NULL, 0);
    wire_edges("wire_vote");

    /* PullSparse: 3 keys; the rows of dim 2 are vals (f32, bf16). PushSparse: the keys,
     * then the rows, in one payload. */
    const uint64_t keys[3] = {7, 1ull << 40, UINT64_MAX - 1};
    uint8_t push_f32[sizeof keys + sizeof vals], push_bf[sizeof keys + sizeof bf];
    memcpy(push_f32, keys, sizeof keys);
    memcpy(push_f32 + sizeof keys, vals, sizeof vals);
    memcpy(push_bf, keys, sizeof keys);
    memcpy(push_bf + sizeof keys, bf, sizeof bf);
    Pstrain__PullSparseRequest spull = PSTRAIN__PULL_SPARSE_REQUEST__INIT;
    spull.trainer_id = 1;
    spull.table = 2;
    spull.step = 42;
    spull.dtype = PSTRAIN__DTYPE__F32;
    spull.count = 3;
    body("wire_pull_sparse", "request", &spull.base, keys, sizeof keys);
    spull.dtype = PSTRAIN__DTYPE__BF16;
    body("wire_pull_sparse", "request-bf16", &spull.base, keys, sizeof keys);
    spull.count = 4; /* one key more than the payload */
    body("wire_pull_sparse", "request-count-mismatch", &spull.base, keys, sizeof keys);
    spull.count = 0;
    body("wire_pull_sparse", "request-no-keys", &spull.base, NULL, 0);
    Pstrain__PullSparseReply spull_rep = PSTRAIN__PULL_SPARSE_REPLY__INIT;
    spull_rep.table = 2;
    spull_rep.version = 42;
    spull_rep.count = 3;
    spull_rep.dim = 2;
    spull_rep.dtype = PSTRAIN__DTYPE__F32;
    body("wire_pull_sparse", "reply-f32", &spull_rep.base, vals, sizeof vals);
    spull_rep.dtype = PSTRAIN__DTYPE__BF16;
    body("wire_pull_sparse", "reply-bf16", &spull_rep.base, bf, sizeof bf);
    spull_rep.dim = 3; /* rows wider than the payload */
    body("wire_pull_sparse", "reply-dim-mismatch", &spull_rep.base, bf, sizeof bf);
    wire_edges("wire_pull_sparse");

    Pstrain__PushSparseRequest spush = PSTRAIN__PUSH_SPARSE_REQUEST__INIT;
    spush.trainer_id = 1;
    spush.table = 2;
    spush.step = 42;
    spush.dtype = PSTRAIN__DTYPE__F32;
    spush.count = 3;
    body("wire_push_sparse", "request-f32", &spush.base, push_f32, sizeof push_f32);
    spush.dtype = PSTRAIN__DTYPE__BF16;
    body("wire_push_sparse", "request-bf16", &spush.base, push_bf, sizeof push_bf);
    body("wire_push_sparse", "request-part-row", &spush.base, push_bf, sizeof push_bf - 2);
    spush.count = 4; /* more keys than whole rows follow */
    body("wire_push_sparse", "request-count-mismatch", &spush.base, push_bf, sizeof push_bf);
    spush.count = 0; /* every trainer pushes every table each step, no keys too */
    body("wire_push_sparse", "request-no-keys", &spush.base, NULL, 0);
    Pstrain__PushSparseReply spush_rep = PSTRAIN__PUSH_SPARSE_REPLY__INIT;
    spush_rep.duplicate = 1;
    body("wire_push_sparse", "reply-duplicate", &spush_rep.base, NULL, 0);
    wire_edges("wire_push_sparse");

    Pstrain__WatchRequest watch = PSTRAIN__WATCH_REQUEST__INIT;
    watch.trainer_id = 3;
    body("wire_watch", "request", &watch.base, NULL, 0);
    Pstrain__WatchReply watch_rep = PSTRAIN__WATCH_REPLY__INIT;
    body("wire_watch", "reply", &watch_rep.base, NULL, 0);
    wire_edges("wire_watch");
}

/* ---- IDX --------------------------------------------------------------------------------- */

static size_t be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
    return 4;
}

static size_t gzip(uint8_t *dst, size_t cap, const uint8_t *src, size_t n)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        die("deflateInit2");
    z.next_in = (Bytef *)(uintptr_t)src;
    z.avail_in = (uInt)n;
    z.next_out = dst;
    z.avail_out = (uInt)cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END)
        die("deflate");
    const size_t out = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

/* [u32 LE images length][images][labels], as fuzz_idx.c reads it. */
static void idx_input(const char *name, const uint8_t *img, size_t ni, const uint8_t *lab,
                      size_t nl)
{
    uint8_t buf[4096];
    buf[0] = (uint8_t)ni, buf[1] = (uint8_t)(ni >> 8), buf[2] = (uint8_t)(ni >> 16);
    buf[3] = (uint8_t)(ni >> 24);
    memcpy(buf + 4, img, ni);
    memcpy(buf + 4 + ni, lab, nl);
    put("idx", name, buf, 4 + ni + nl);
}

static void idx(void)
{
    uint8_t img[256] = {0}, lab[64] = {0}, gimg[512], glab[256];
    size_t ni = 0, nl = 0;
    ni += be32(img + ni, 0x803);
    ni += be32(img + ni, 3); /* 3 images of 2 x 4 */
    ni += be32(img + ni, 2);
    ni += be32(img + ni, 4);
    for (int i = 0; i < 24; i++)
        img[ni++] = (uint8_t)(i * 11);
    nl += be32(lab + nl, 0x801);
    nl += be32(lab + nl, 3);
    lab[nl++] = 0, lab[nl++] = 9, lab[nl++] = 4;
    idx_input("plain", img, ni, lab, nl);
    const size_t gi = gzip(gimg, sizeof gimg, img, ni), gl = gzip(glab, sizeof glab, lab, nl);
    idx_input("gzip", gimg, gi, glab, gl);
    idx_input("gzip-images-plain-labels", gimg, gi, lab, nl);
    idx_input("gzip-cut", gimg, gi - 6, glab, gl);
    idx_input("images-truncated", img, ni - 1, lab, nl);
    idx_input("labels-extra-byte", img, ni, lab, nl + 1 > sizeof lab ? nl : nl + 1);
    idx_input("labels-as-images", lab, nl, img, ni);
    idx_input("header-only", img, 16, lab, 8);
    uint8_t big[16];
    memcpy(big, img, 16);
    be32(big + 4, 0x7fffffff); /* a header announcing far more than the file holds */
    idx_input("huge-count", big, sizeof big, lab, nl);
}

/* ---- text -------------------------------------------------------------------------------- */

static void text_input(const char *name, int8_t T, const char *s)
{
    uint8_t buf[4096];
    const size_t n = strlen(s);
    buf[0] = (uint8_t)T;
    memcpy(buf + 1, s, n);
    put("text", name, buf, 1 + n);
}

static void text(void)
{
    static const char kjv[] =
        "In the beginning God created the heaven and the earth. And the earth was without "
        "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
        "moved upon the face of the waters.\n";
    text_input("kjv-ctx8", 8, kjv);
    text_input("kjv-ctx1", 1, kjv);
    text_input("too-short-for-ctx", 64, "short text");
    text_input("ctx0", 0, kjv);
    text_input("ctx-negative", -5, kjv);
    text_input("empty", 4, "");
    uint8_t all[257];
    all[0] = 2;
    for (int i = 0; i < 256; i++)
        all[1 + i] = (uint8_t)(255 - i);
    put("text", "every-byte-ctx2", all, sizeof all);
}

/* ---- configuration ----------------------------------------------------------------------- */

/* role byte, argv strings, an empty string, NAME=VALUE strings (fuzz_config.c). */
static void config_input(const char *name, int pserver, const char *const *argv,
                         const char *const *env)
{
    uint8_t buf[4096];
    size_t n = 0;
    buf[n++] = (uint8_t)pserver;
    for (; argv && *argv; argv++) {
        memcpy(buf + n, *argv, strlen(*argv) + 1);
        n += strlen(*argv) + 1;
    }
    buf[n++] = '\0';
    for (; env && *env; env++) {
        memcpy(buf + n, *env, strlen(*env) + 1);
        n += strlen(*env) + 1;
    }
    put("config", name, buf, n);
}

static void config(void)
{
    const char *const alone[] = {"--batch", "64", "--lr=0.1", "--optimizer", "adam",
                                 "--hidden", "128,64", "--steps", "10", NULL};
    config_input("trainer-alone", 0, alone, NULL);
    const char *const cluster_env[] = {"PSTRAIN_TRAINERS=2", "PSTRAIN_TRAINER_ID=1",
                                       "PSTRAIN_PSERVERS=127.0.0.1:7164,127.0.0.1:7165",
                                       "PSTRAIN_MODE=async", "PSTRAIN_BLOCK_BYTES=1MiB", NULL};
    config_input("trainer-cluster-env", 0, NULL, cluster_env);
    const char *const paddle_env[] = {"TRAINING_ROLE=TRAINER", "PADDLE_TRAINERS_NUM=2",
                                      "PADDLE_TRAINER_ID=0",
                                      "PADDLE_PSERVERS_IP_PORT_LIST=10.0.0.1:6174", NULL};
    config_input("trainer-paddle-env", 0, NULL, paddle_env);
    const char *const gpt[] = {"--model", "gpt", "--ctx", "64", "--embd", "64", "--heads",
                               "4", "--precision", "bf16", "--grad-dtype", "fp16",
                               "--pipeline", "2", "--micro-batches", "4", "--schedule",
                               "interleaved", "--virtual-stages", "2", "--partition",
                               "1,1,1,1", "--compute-cpus", "0-3,8", NULL};
    config_input("trainer-gpt-pipeline", 0, gpt, NULL);
    const char *const fp16[] = {"--precision=fp16", "--loss-scale", "1024",
                                "--loss-scale-window", "100", "--overlap", "false",
                                "--trace-steps", "2:4",
                                "--send-window=8M", "--lr-schedule", "warmup_cosine",
                                "--check-config", NULL};
    config_input("trainer-fp16", 0, fp16, NULL);
    const char *const ckpt[] = {"--checkpoint-dir", "/ckpt", "--checkpoint-every", "5",
                                "--resume", "require", "--on-failure", "wait",
                                "--token", "abc123", "--log-level", "debug", NULL};
    config_input("trainer-checkpoints", 0, ckpt, NULL);
    const char *const ps_env[] = {"PSTRAIN_PSERVERS=127.0.0.1:7164,127.0.0.1:7165",
                                  "PSTRAIN_PSERVER_ID=1", "PSTRAIN_SERVER_THREADS=4", NULL};
    config_input("pserver-id-env", 1, NULL, ps_env);
    const char *const ps[] = {"--port", "0", "--bind", "127.0.0.1", "--max-params", "1000",
                              "--max-calls", "64", "--max-wait-ms", "5000",
                              "--metrics-port=9464", "--tls-cert", "/tls/tls.crt", NULL};
    config_input("pserver-flags", 1, ps, NULL);
    const char *const help[] = {"--help", NULL};
    config_input("help", 0, help, NULL);
    const char *const bad[] = {"--batch", "0", NULL};
    config_input("bad-batch", 0, bad, NULL);
    const char *const unknown[] = {"--no-such-flag=1", NULL};
    config_input("unknown-flag", 1, unknown, NULL);
    const char *const role_env[] = {"PSTRAIN_ROLE=pserver", NULL};
    config_input("role-mismatch", 0, NULL, role_env);
}

/* ---- checkpoint -------------------------------------------------------------------------- */

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die(path);
    static uint8_t buf[1 << 16];
    *n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return buf;
}

static void checkpoint(void)
{
    char dir[] = "/tmp/pstrain-gen-corpus-XXXXXX", path[4096];
    if (!mkdtemp(dir))
        die("mkdtemp");
    /* fuzz_checkpoint.c's layouts: fingerprint, blocks {0: 0+3, 1: 3+2}, 2 or 0 states. */
    const ps_block_spec specs[2] = {{.id = 0, .offset = 0, .length = 3},
                                    {.id = 1, .offset = 3, .length = 2}};
    const float values[5] = {0.5f, -1.0f, 2.0f, 0.125f, 3.0f};
    float state[10];
    for (int i = 0; i < 10; i++)
        state[i] = (float)i * 0.01f;
    size_t n;
    uint8_t *p;
    snprintf(path, sizeof path, "%s/step-%012d.ckpt", dir, 7);
    for (int nstate = 2; nstate >= 0; nstate -= 2) {
        const ps_shard_layout lay = {.fingerprint = 0x5eedf00dcafe0001ull, .specs = specs,
                                     .nblocks = 2, .total = 5, .nstate = nstate};
        if (ps_shard_save(dir, 7, &lay, values, state, NULL, 0) != PST_OK)
            die("ps_shard_save");
        p = slurp(path, &n);
        put("checkpoint", nstate ? "shard-adam" : "shard-sgd", p, n);
        if (nstate) {
            put("checkpoint", "shard-cut", p, n - 9);
            p[n - 12] ^= 0x40; /* a value's bit: the section fails its checksum */
            put("checkpoint", "shard-bad-crc", p, n);
        }
    }
    /* A plain checkpoint of three sections (the trainer's job state is one of these). */
    pst_ckpt_writer w;
    const char meta[] = "meta";
    if (pst_ckpt_begin(&w, dir, 7) != PST_OK || pst_ckpt_section(&w, 1, meta, sizeof meta) ||
        pst_ckpt_section(&w, 9, values, sizeof values) || pst_ckpt_section(&w, 4, "", 0) ||
        pst_ckpt_commit(&w) != PST_OK)
        die("pst_ckpt writer");
    p = slurp(path, &n);
    put("checkpoint", "three-sections", p, n);
    p[8] = 8; /* the step field: a file under another step's name */
    put("checkpoint", "other-step", p, n);
    put("checkpoint", "header-only", p, 20);
    if (pst_ckpt_begin(&w, dir, 7) != PST_OK || pst_ckpt_commit(&w) != PST_OK)
        die("pst_ckpt writer");
    p = slurp(path, &n);
    put("checkpoint", "no-sections", p, n);
    unlink(path);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        die("usage: fuzz_gen_corpus DIR (fuzz/corpus)");
    out_dir = argv[1];
    mkdir(out_dir, 0755);
    rpc_global_init();
    wire();
    idx();
    text();
    config();
    checkpoint();
    rpc_global_shutdown();
    printf("fuzz_gen_corpus: seeds written under %s\n", out_dir);
    return 0;
}
