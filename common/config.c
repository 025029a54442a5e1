/* config.c — table-driven configuration from environment and flags (see config.h).
 *
 * DESIGN: one table lists every setting once: its flag, its PSTRAIN_ variable, an
 * optional Paddle alias, an example, the help text, the roles it applies to, and how to
 * parse it. Loading walks the table twice (environment, then flags), so --help,
 * --check-config and the error messages can never disagree with what is parsed. */
#include "common/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum opt_type { OPT_INT, OPT_LONG, OPT_U64, OPT_FLOAT, OPT_STR, OPT_BYTES, OPT_BOOL, OPT_FN };

#define R_TRAINER (1u << PST_ROLE_TRAINER)
#define R_PSERVER (1u << PST_ROLE_PSERVER)
#define R_ALL (R_TRAINER | R_PSERVER)

typedef pst_status (*opt_parse_fn)(pst_config *cfg, const char *v, const char *where,
                                   const char *example);

typedef struct opt {
    const char *flag;   /* without "--" */
    const char *env;
    const char *alias;  /* Paddle's name, or NULL */
    const char *alias2; /* a second, weaker alias, or NULL */
    const char *example;
    const char *help;
    unsigned roles;
    enum opt_type type;
    size_t off;         /* field offset for the plain types */
    size_t size;        /* OPT_STR buffer size */
    double min, max;    /* numeric range */
    opt_parse_fn fn;    /* OPT_FN */
} opt;

static pst_status bad(const char *where, const char *v, const char *what, const char *example)
{
    return pst_error_set(PST_ERR_INVALID, "%s=%s: %s (example: %s)", where, v, what, example);
}

/* A byte count with an optional K/M/G suffix (KiB, MB and the like too) in min..max, or
 * with `with_auto` the word "auto" (PST_SEND_WINDOW_AUTO). */
static pst_status parse_bytes(const char *v, double min, double max, int with_auto,
                              const char *where, const char *example, size_t *out)
{
    if (with_auto && strcasecmp(v, "auto") == 0) {
        *out = PST_SEND_WINDOW_AUTO;
        return PST_OK;
    }
    char *e;
    char range[160];
    errno = 0;
    double n = strtod(v, &e);
    double mult = 1;
    if (e != v && *e) {
        switch (*e) {
        case 'k': case 'K': mult = 1024.0; break;
        case 'm': case 'M': mult = 1024.0 * 1024; break;
        case 'g': case 'G': mult = 1024.0 * 1024 * 1024; break;
        default: mult = 0;
        }
        if (e[1] && !(e[1] == 'i' && e[2] == 'B' && !e[3]) && !((e[1] == 'B' || e[1] == 'b') && !e[2]))
            mult = 0;
    }
    n *= mult;
    if (e == v || errno || mult == 0 || n < min || n > max || n != floor(n)) {
        snprintf(range, sizeof range, "expected a whole number of bytes in %s..%s (K/M/G "
                 "suffixes)%s", min >= 1024 ? "1K" : "0", max >= 1099511627776.0 ? "1024G" : "1G",
                 with_auto ? " or auto" : "");
        return bad(where, v, range, example);
    }
    *out = (size_t)n;
    return PST_OK;
}

static pst_status parse_send_window(pst_config *cfg, const char *v, const char *where,
                                    const char *ex)
{
    return parse_bytes(v, 0, (double)(1ull << 40), 1, where, ex, &cfg->send_window);
}

static pst_status parse_send_ahead(pst_config *cfg, const char *v, const char *where,
                                   const char *ex)
{
    if (strcasecmp(v, "auto") == 0) {
        cfg->send_ahead = PST_SEND_AHEAD_AUTO;
        return PST_OK;
    }
    char *e;
    errno = 0;
    const long n = strtol(v, &e, 10);
    if (e == v || *e || errno || n < 0 || n > 1000000)
        return bad(where, v, "expected a whole number of blocks in 0..1000000 or auto", ex);
    cfg->send_ahead = (int)n;
    return PST_OK;
}

/* The pserver's listen address: an IP literal, as POD_IP gives it: IPv4, or IPv6 with or
 * without brackets (kept with them, as gRPC's host:port wants). A name is not resolved
 * here: a listener binds an address of its own host. */
static pst_status parse_bind(pst_config *cfg, const char *v, const char *where, const char *ex)
{
    unsigned char ip[16];
    char inner[PST_ADDR_MAX];
    const size_t n = strlen(v);
    const size_t skip = n >= 2 && v[0] == '[' && v[n - 1] == ']';
    if (n - 2 * skip >= sizeof inner)
        return bad(where, v, "too long", ex);
    memcpy(inner, v + skip, n - 2 * skip);
    inner[n - 2 * skip] = '\0';
    if (!skip && inet_pton(AF_INET, inner, ip) == 1)
        snprintf(cfg->bind_host, sizeof cfg->bind_host, "%s", inner);
    else if (inet_pton(AF_INET6, inner, ip) == 1 && n + 2 < sizeof cfg->bind_host)
        snprintf(cfg->bind_host, sizeof cfg->bind_host, "[%s]", inner);
    else
        return bad(where, v, "expected an IP address of this host (IPv4, or IPv6)", ex);
    return PST_OK;
}

int pst_job_id_valid(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!isalnum((unsigned char)s[n]) && s[n] != '.' && s[n] != '_' && s[n] != '-')
            return 0;
    return n >= 1 && n <= PST_JOB_ID_MAX && s[0] != '.';
}

static pst_status parse_job_id(pst_config *cfg, const char *v, const char *where,
                               const char *ex)
{
    if (!pst_job_id_valid(v))
        return bad(where, v, "expected 1 to 64 letters, digits, '.', '_' or '-', not starting "
                   "with '.'", ex);
    snprintf(cfg->job_id, sizeof cfg->job_id, "%s", v);
    return PST_OK;
}

static pst_status parse_role(pst_config *cfg, const char *v, const char *where, const char *ex)
{
    pst_role r;
    if (strcasecmp(v, "trainer") == 0)
        r = PST_ROLE_TRAINER;
    else if (strcasecmp(v, "pserver") == 0)
        r = PST_ROLE_PSERVER;
    else
        return bad(where, v, "expected trainer or pserver", ex);
    if (r != cfg->role)
        return pst_error_set(PST_ERR_INVALID, "%s=%s: this program is the %s (run build/bin/%s)",
                             where, v, pst_role_name(cfg->role), pst_role_name(r));
    return PST_OK;
}

/* A comma list of at most max host:port addresses into out; *n set. */
static pst_status parse_addrs(char (*out)[PST_ADDR_MAX], int max, int *n, const char *v,
                              const char *where, const char *ex, const char *what)
{
    int k = 0;
    const char *p = v;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0 || len >= PST_ADDR_MAX)
            return bad(where, v, "expected a comma-separated list of host:port", ex);
        if (k == max) {
            char why[64];
            snprintf(why, sizeof why, "more than %d %s", max, what);
            return bad(where, v, why, ex);
        }
        char addr[PST_ADDR_MAX];
        memcpy(addr, p, len);
        addr[len] = '\0';
        const char *colon = strrchr(addr, ':');
        char *e = NULL;
        long port = colon ? strtol(colon + 1, &e, 10) : 0;
        if (!colon || colon == addr || !e || *e || port < 1 || port > 65535)
            return bad(where, v, "each entry must be host:port with a port in 1..65535", ex);
        memcpy(out[k++], addr, len + 1);
        p = end ? end + 1 : p + len;
    }
    *n = k;
    return PST_OK;
}

static pst_status parse_pservers(pst_config *cfg, const char *v, const char *where,
                                 const char *ex)
{
    return parse_addrs(cfg->pservers, PST_MAX_PSERVERS, &cfg->num_pservers, v, where, ex,
                       "pservers");
}

static pst_status parse_chain(pst_config *cfg, const char *v, const char *where,
                              const char *ex)
{
    return parse_addrs(cfg->chain, PST_MAX_CHAIN, &cfg->chain_len, v, where, ex, "trainers");
}

static pst_status parse_mode(pst_config *cfg, const char *v, const char *where, const char *ex)
{
    if (strcasecmp(v, "sync") == 0)
        cfg->mode = PST_MODE_SYNC;
    else if (strcasecmp(v, "async") == 0)
        cfg->mode = PST_MODE_ASYNC;
    else
        return bad(where, v, "expected sync or async", ex);
    return PST_OK;
}

static pst_status parse_hidden(pst_config *cfg, const char *v, const char *where,
                               const char *ex)
{
    int n = 0;
    const char *p = v;
    if (strcmp(v, "none") == 0 || *v == '\0') {
        cfg->nhidden = 0;
        return PST_OK;
    }
    while (*p) {
        char *e;
        errno = 0;
        long w = strtol(p, &e, 10);
        if (e == p || errno || w < 1 || w > 1 << 20 || (*e && *e != ','))
            return bad(where, v, "expected comma-separated layer widths >= 1", ex);
        if (n == PST_MAX_HIDDEN)
            return bad(where, v, "at most 16 hidden layers", ex);
        cfg->hidden[n++] = (int)w;
        p = *e ? e + 1 : e;
    }
    cfg->nhidden = n;
    return PST_OK;
}

/* One word a keyword option takes, and its value. */
typedef struct {
    const char *word;
    int value;
} keyword;

/* *out = the value of v's word in kw (case-insensitive; the list ends with a NULL word),
 * else the error "expected a, b or c". */
static pst_status keyword_value(const keyword *kw, const char *v, const char *where,
                                const char *ex, int *out)
{
    char what[160] = "expected ";
    int n = 0;
    for (; kw[n].word; n++)
        if (strcasecmp(v, kw[n].word) == 0) {
            *out = kw[n].value;
            return PST_OK;
        }
    for (int i = 0; i < n; i++)
        snprintf(what + strlen(what), sizeof what - strlen(what), "%s%s",
                 i == 0 ? "" : i == n - 1 ? " or " : ", ", kw[i].word);
    return bad(where, v, what, ex);
}

/* The parser fn of a keyword option: cfg->field, of type `type`, from the words and values
 * listed as {"word", value}, ... */
#define KEYWORD_OPTION(fn, field, type, ...)                                                  \
    static pst_status fn(pst_config *cfg, const char *v, const char *where, const char *ex)  \
    {                                                                                         \
        static const keyword words[] = {__VA_ARGS__, {NULL, 0}};                              \
        int k;                                                                                \
        PST_TRY(keyword_value(words, v, where, ex, &k));                                      \
        cfg->field = (type)k;                                                                 \
        return PST_OK;                                                                        \
    }

KEYWORD_OPTION(parse_resume, resume, int, {"auto", PST_RESUME_AUTO},
               {"never", PST_RESUME_NEVER}, {"require", PST_RESUME_REQUIRE})
KEYWORD_OPTION(parse_on_failure, on_failure, int, {"wait", PST_ON_FAILURE_WAIT},
               {"fail", PST_ON_FAILURE_FAIL})
KEYWORD_OPTION(parse_shm, shm, int, {"auto", 1}, {"off", 0})
KEYWORD_OPTION(parse_bf16_gemm, bf16_gemm, int, {"auto", PST_BF16_GEMM_AUTO},
               {"on", PST_BF16_GEMM_ON}, {"off", PST_BF16_GEMM_OFF})
KEYWORD_OPTION(parse_gemm, gemm, int, {"auto", PST_GEMM_AUTO}, {"openblas", PST_GEMM_OPENBLAS},
               {"onednn", PST_GEMM_ONEDNN})
KEYWORD_OPTION(parse_pipe_schedule, schedule, pst_schedule, {"gpipe", PST_SCHEDULE_GPIPE},
               {"1f1b", PST_SCHEDULE_1F1B}, {"interleaved", PST_SCHEDULE_INTERLEAVED})
KEYWORD_OPTION(parse_progress, progress, pst_progress, {"auto", PST_PROGRESS_AUTO},
               {"bar", PST_PROGRESS_BAR}, {"lines", PST_PROGRESS_LINES},
               {"none", PST_PROGRESS_NONE})

/* Layers per model chunk, first to last: "2,3,3,2" (empty: balanced by compute). */
static pst_status parse_partition(pst_config *cfg, const char *v, const char *where,
                                  const char *ex)
{
    int n = 0;
    for (const char *p = v; *p;) {
        char *e;
        errno = 0;
        long k = strtol(p, &e, 10);
        if (e == p || errno || k < 1 || k > 1 << 20 || (*e && *e != ','))
            return bad(where, v, "expected comma-separated layer counts >= 1, one per model "
                       "chunk", ex);
        if (n == PST_MAX_CHUNKS)
            return bad(where, v, "at most 256 model chunks", ex);
        cfg->partition[n++] = (int)k;
        p = *e ? e + 1 : e;
    }
    cfg->npartition = n;
    return PST_OK;
}

static pst_status parse_optimizer(pst_config *cfg, const char *v, const char *where,
                                  const char *ex)
{
    if (pst_optim_kind_parse(v, &cfg->optim.kind) != 0)
        return bad(where, v, "expected sgd, momentum, adam, adamw or adagrad", ex);
    return PST_OK;
}

static pst_status parse_schedule(pst_config *cfg, const char *v, const char *where,
                                 const char *ex)
{
    if (pst_lr_schedule_parse(v, &cfg->optim.schedule) != 0)
        return bad(where, v, "expected constant or warmup_cosine", ex);
    return PST_OK;
}

static pst_status parse_log_level(pst_config *cfg, const char *v, const char *where,
                                  const char *ex)
{
    if (pst_log_level_parse(v, &cfg->log_level) != 0)
        return bad(where, v, "expected debug, info, warn, error or off", ex);
    return PST_OK;
}

static pst_status parse_trace_steps(pst_config *cfg, const char *v, const char *where,
                                   const char *ex)
{
    char *e;
    errno = 0;
    long a = strtol(v, &e, 10);
    if (e == v || *e != ':' || errno)
        return bad(where, v, "expected FIRST:LAST step numbers", ex);
    const char *p = e + 1;
    long b = strtol(p, &e, 10);
    if (e == p || *e || errno || a < 0 || b < a)
        return bad(where, v, "expected FIRST:LAST with 0 <= FIRST <= LAST", ex);
    cfg->trace_first = a;
    cfg->trace_last = b;
    return PST_OK;
}

static pst_status parse_model(pst_config *cfg, const char *v, const char *where, const char *ex)
{
    if (strcmp(v, "mlp") != 0 && strcmp(v, "gpt") != 0 && strcmp(v, "dlrm") != 0 &&
        strcmp(v, "synthetic") != 0)
        return bad(where, v, "expected mlp, gpt, dlrm or synthetic", ex);
    snprintf(cfg->model, sizeof cfg->model, "%s", v);
    return PST_OK;
}

static pst_status parse_dataset(pst_config *cfg, const char *v, const char *where,
                                const char *ex)
{
    if (strcmp(v, "fashion-mnist") != 0 && strcmp(v, "mnist") != 0 && strcmp(v, "text") != 0 &&
        strcmp(v, "kjv") != 0 && strcmp(v, "ctr") != 0)
        return bad(where, v, "expected fashion-mnist or mnist (IDX files in --data), text "
                   "(--data FILE), kjv or ctr (--data FILE)", ex);
    snprintf(cfg->dataset, sizeof cfg->dataset, "%s", v);
    return PST_OK;
}

static pst_status dtype_value(pst_dtype *out, const char *v, const char *where,
                              const char *ex)
{
    return pst_dtype_parse(v, out) != 0 ? bad(where, v, "expected fp32, bf16 or fp16", ex)
                                        : PST_OK;
}

static pst_status parse_precision(pst_config *cfg, const char *v, const char *where,
                                  const char *ex)
{
    return dtype_value(&cfg->precision, v, where, ex);
}

static pst_status parse_grad_dtype(pst_config *cfg, const char *v, const char *where,
                                   const char *ex)
{
    cfg->grad_dtype_set = 1;
    return dtype_value(&cfg->grad_dtype, v, where, ex);
}

/* A CPU list as taskset and cpusets write it: "0", "0-3", "0,2,4-7"; CPUs below 1024. */
static pst_status parse_cpus(pst_config *cfg, const char *v, const char *where, const char *ex)
{
    static const char what[] = "expected a CPU list such as 0 or 0-3,8 (CPUs 0..1023)";
    memset(cfg->compute_cpu_mask, 0, sizeof cfg->compute_cpu_mask);
    cfg->compute_cpus[0] = '\0';
    if (strlen(v) >= sizeof cfg->compute_cpus)
        return bad(where, v, "CPU list too long", ex);
    for (const char *p = v; *p;) {
        char *e;
        long lo = -1, hi = -1;
        if (isdigit((unsigned char)*p))
            lo = hi = strtol(p, &e, 10);
        if (lo >= 0 && *e == '-' && isdigit((unsigned char)e[1]))
            hi = strtol(e + 1, &e, 10);
        if (lo < 0 || hi < lo || hi > 1023 || (*e && *e != ',') || (*e == ',' && !e[1]))
            return bad(where, v, what, ex);
        for (long c = lo; c <= hi; c++)
            cfg->compute_cpu_mask[c / 64] |= 1ull << (c % 64);
        p = *e ? e + 1 : e;
    }
    snprintf(cfg->compute_cpus, sizeof cfg->compute_cpus, "%s", v);
    return PST_OK;
}

#define F(field) offsetof(pst_config, field), 0
#define S(field) offsetof(pst_config, field), sizeof(((pst_config *)0)->field)

static const opt options[] = {
    {"role", "PSTRAIN_ROLE", "TRAINING_ROLE", "PADDLE_TRAINING_ROLE", "trainer", "role of this process (checked against the program)", R_ALL, OPT_FN, 0, 0, 0, 0, parse_role},
    {"pservers", "PSTRAIN_PSERVERS", "PADDLE_PSERVERS_IP_PORT_LIST", NULL, "10.0.0.1:7164,10.0.0.2:7164", "pserver addresses, host:port comma list; unset = train alone", R_ALL, OPT_FN, 0, 0, 0, 0, parse_pservers},
    {"trainers", "PSTRAIN_TRAINERS", "PADDLE_TRAINERS_NUM", NULL, "2", "number of trainers T", R_TRAINER, OPT_INT, F(trainers), 1, 4096, NULL},
    {"chain", "PSTRAIN_CHAIN", NULL, NULL, "10.0.0.5:7200,10.0.0.6:7200,10.0.0.7:7200", "sync: the trainers' relay addresses, host:port, one per trainer in id order (at most 64): each trainer's gradients go to the next one, which adds its own, and only the last trainer pushes, the sum of all, to the pservers; the values come back down the same way. A pserver's link then carries one gradient and one copy of the values a step instead of one per trainer. Trainer k listens on entry k's port (entry 0's is not used); unset: every trainer pushes and pulls itself", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_chain},
    {"trainer-id", "PSTRAIN_TRAINER_ID", "PADDLE_TRAINER_ID", NULL, "0", "this trainer's id, 0..T-1", R_TRAINER, OPT_INT, F(trainer_id), 0, 4095, NULL},
    {"pserver-id", "PSTRAIN_PSERVER_ID", NULL, NULL, "0", "this pserver's index in --pservers (its port comes from there)", R_PSERVER, OPT_INT, F(pserver_id), 0, PST_MAX_PSERVERS - 1, NULL},
    {"port", "PSTRAIN_PORT", "PADDLE_PORT", NULL, "7164", "pserver listen port (0 = any free port, printed at start)", R_PSERVER, OPT_INT, F(port), 0, 65535, NULL},
    {"bind", "PSTRAIN_BIND", "POD_IP", NULL, "0.0.0.0", "pserver listen address (an IPv4 or IPv6 address of this host)", R_PSERVER, OPT_FN, 0, 0, 0, 0, parse_bind},
    {"mode", "PSTRAIN_MODE", NULL, NULL, "sync", "sync (sum every trainer's gradient, then update) or async (update per push)", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_mode},
    {"block-bytes", "PSTRAIN_BLOCK_BYTES", NULL, NULL, "4M", "largest gradient block sent in one message (bytes; K/M/G suffixes)", R_TRAINER, OPT_BYTES, F(block_bytes), 1024, 1 << 30, NULL},
    {"send-window", "PSTRAIN_SEND_WINDOW", NULL, NULL, "auto", "bytes of pushes in flight per trainer, to all its pservers together; waiting blocks go in forward order (first layer first); auto = one block per pserver (at least two; at least 8M when every pserver is on this host), 0 = no limit", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_send_window},
    {"send-ahead", "PSTRAIN_SEND_AHEAD", NULL, NULL, "8", "sync, once backward has queued every block of the step: a push starts only if its block is fewer than this many blocks past the trainer's lowest block whose pull has not landed, so no trainer runs ahead of the others on a pserver's shared link (credits, as ByteScheduler's); auto = 4 per pserver where a pserver is on another host, else 0 (and 0 with PSTRAIN_CHAIN, whose links are each one trainer's); 0 = no limit", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_send_ahead},
    {"devices", "PSTRAIN_DEVICES", NULL, NULL, "cpu:1", "local devices of this trainer", R_TRAINER, OPT_STR, S(devices), 0, 0, NULL},
    {"device-memory-limit", "PSTRAIN_DEVICE_MEMORY_LIMIT", NULL, NULL, "0", "most bytes of device memory the trainer may allocate on each local device (parameters, gradients, activations); a model that does not fit is refused at start with one line; 0: no limit", R_TRAINER, OPT_BYTES, F(device_memory_limit), 0, 1099511627776.0, NULL},
    {"rpc-timeout-ms", "PSTRAIN_RPC_TIMEOUT_MS", NULL, NULL, "60000", "deadline of one RPC in milliseconds", R_TRAINER, OPT_LONG, F(rpc_timeout_ms), 100, 86400000, NULL},
    {"connect-timeout-ms", "PSTRAIN_CONNECT_TIMEOUT_MS", NULL, NULL, "30000", "how long an unreachable pserver is retried (ms)", R_TRAINER, OPT_LONG, F(connect_timeout_ms), 0, 86400000, NULL},
    {"server-threads", "PSTRAIN_SERVER_THREADS", NULL, NULL, "2", "pserver RPC and update threads", R_PSERVER, OPT_INT, F(server_threads), 1, 256, NULL},
    {"model", "PSTRAIN_MODEL", NULL, NULL, "mlp", "mlp, gpt (a character language model; unless set: --dataset kjv --batch 16 --optimizer adamw --lr 0.001 --beta2 0.99 --weight-decay 0), dlrm (a click model, alone or with pservers that hold its sparse tables; unless set: --dataset ctr --batch 512 --optimizer adagrad --lr 0.05 --eps 1e-10), or synthetic (no compute; N fp32 gradients) to measure communication", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_model},
    {"hidden", "PSTRAIN_HIDDEN", NULL, NULL, "1024,1024", "mlp hidden layer widths", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_hidden},
    {"params", "PSTRAIN_PARAMS", NULL, NULL, "25000000", "synthetic model: number of fp32 parameters", R_TRAINER, OPT_LONG, F(params), 1, 4e9, NULL},
    {"layers", "PSTRAIN_LAYERS", NULL, NULL, "4", "gpt: transformer blocks", R_TRAINER, OPT_INT, F(layers), 1, 1024, NULL},
    {"heads", "PSTRAIN_HEADS", NULL, NULL, "4", "gpt: attention heads (a divisor of --embd)", R_TRAINER, OPT_INT, F(heads), 1, 1024, NULL},
    {"embd", "PSTRAIN_EMBD", NULL, NULL, "128", "gpt: channels", R_TRAINER, OPT_INT, F(embd), 1, 65536, NULL},
    {"sparse-admit-count", "PSTRAIN_SPARSE_ADMIT_COUNT", NULL, NULL, "3", "dlrm: a key becomes a row of its sparse table on its C-th push (the pushes before are counted and dropped; pulls get the initializer's values)", R_TRAINER, OPT_INT, F(sparse_admit_count), 1, 1000000000, NULL},
    {"sparse-evict-after", "PSTRAIN_SPARSE_EVICT_AFTER", NULL, NULL, "1000", "dlrm: a row not pushed for this many steps is removed (0: never)", R_TRAINER, OPT_LONG, F(sparse_evict_after), 0, 1000000000000L, NULL},
    {"sparse-max-rows", "PSTRAIN_SPARSE_MAX_ROWS", NULL, NULL, "1000000", "dlrm: rows of its sparse table at most (with pservers: on each pserver), the least recently pushed go first (0: no limit; else at least 16)", R_TRAINER, OPT_LONG, F(sparse_max_rows), 0, 1000000000000L, NULL},
    {"sparse-dim", "PSTRAIN_SPARSE_DIM", NULL, NULL, "16", "dlrm: values per row of its sparse tables (the bottom MLP's output width too)", R_TRAINER, OPT_INT, F(sparse_dim), 1, 4096, NULL},
    {"ctx", "PSTRAIN_CTX", NULL, NULL, "128", "gpt: context (tokens per sequence)", R_TRAINER, OPT_INT, F(ctx), 1, 65536, NULL},
    {"val-windows", "PSTRAIN_VAL_WINDOWS", NULL, NULL, "64", "text: validation windows (stride --ctx from the start of the last 10%) in val_loss", R_TRAINER, OPT_INT, F(val_windows), 1, 1 << 24, NULL},
    {"sample", "PSTRAIN_SAMPLE", NULL, NULL, "300", "gpt: print this many characters generated by the final model to stderr", R_TRAINER, OPT_INT, F(sample), 0, 1 << 20, NULL},
    {"temperature", "PSTRAIN_TEMPERATURE", NULL, NULL, "0.8", "gpt: sampling temperature (--sample)", R_TRAINER, OPT_FLOAT, F(temperature), 0.01, 100, NULL},
    {"dataset", "PSTRAIN_DATASET", NULL, NULL, "fashion-mnist", "data set: fashion-mnist or mnist (IDX files), text (--data FILE: bytes are tokens) or kjv (the King James Bible, written by scripts/deps.sh from Debian's bible-kjv)", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_dataset},
    {"data", "PSTRAIN_DATA", NULL, NULL, "/usr/share/datasets/fashion-mnist", "directory of the IDX files, or the text file (default: /usr/share/datasets/<dataset>; kjv: " PST_KJV_PATH ")", R_TRAINER, OPT_STR, S(data_dir), 0, 0, NULL},
    {"epochs", "PSTRAIN_EPOCHS", NULL, NULL, "5", "passes over the training set", R_TRAINER, OPT_INT, F(epochs), 1, 1e6, NULL},
    {"steps", "PSTRAIN_STEPS", NULL, NULL, "100", "stop after this many steps (0 = run all epochs)", R_TRAINER, OPT_LONG, F(steps), 0, 1e12, NULL},
    {"batch", "PSTRAIN_BATCH", NULL, NULL, "128", "GLOBAL batch size per optimizer step (all trainers and micro-batches together)", R_TRAINER, OPT_INT, F(batch), 1, 1 << 20, NULL},
    {"precision", "PSTRAIN_PRECISION", NULL, NULL, "bf16", "fp32, bf16 or fp16: the dtype of the trainer's parameters (bf16/fp16: 2 bytes per parameter, fp32 accumulation; the fp32 master and the optimizer live on the pservers, cast once per update)", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_precision},
    {"bf16-gemm", "PSTRAIN_BF16_GEMM", NULL, NULL, "off", "with --precision bf16 on CPU devices, the linear layers' GEMMs: auto (in bf16 with fp32 accumulation through oneDNN where the CPU has AVX512_BF16, else fp32), on (in bf16 on every CPU: through oneDNN where the CPU has AVX512_BF16; on CPUs without, bf16-rounded operands are multiplied in fp32 by OpenBLAS, the same products but slower than fp32, and faster than oneDNN's software kernel) or off (fp32 GEMMs on the bf16 weights' fp32 casts); CUDA devices compute in fp32 whatever it says", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_bf16_gemm},
    {"grad-dtype", "PSTRAIN_GRAD_DTYPE", NULL, NULL, "fp32", "dtype of the pushed gradients: fp32, bf16 or fp16 (default: the precision's)", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_grad_dtype},
    {"acc-steps", "PSTRAIN_ACC_STEPS", NULL, NULL, "4", "micro-batches per optimizer step: each trainer splits its share of --batch into K, accumulates their gradients in fp32 and pushes once", R_TRAINER, OPT_INT, F(acc_steps), 1, 4096, NULL},
    {"checkpoint-dir", "PSTRAIN_CHECKPOINT_DIR", NULL, NULL, "/ckpt", "write checkpoints here, in a subdirectory per job (pserver: its shard in DIR/JOB/pserver-ID; trainer 0: the job state in DIR/JOB/job; JOB: --job-id) and resume from them; unset: none", R_ALL, OPT_STR, S(checkpoint_dir), 0, 0, NULL},
    {"job-id", "PSTRAIN_JOB_ID", NULL, NULL, "ctr-2026-11", "the job's name: its checkpoints' subdirectory of --checkpoint-dir (unset: job- and a hash of the settings a resumed job must share); resuming checkpoints of other settings under it is refused", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_job_id},
    {"checkpoint-every", "PSTRAIN_CHECKPOINT_EVERY", NULL, NULL, "100", "steps between checkpoints (sync mode; 0: never)", R_TRAINER, OPT_LONG, F(checkpoint_every), 0, 1e12, NULL},
    {"checkpoint-keep", "PSTRAIN_CHECKPOINT_KEEP", NULL, NULL, "2", "checkpoints kept, the newest", R_ALL, OPT_INT, F(checkpoint_keep), 1, 1000, NULL},
    {"resume", "PSTRAIN_RESUME", NULL, NULL, "auto", "with --checkpoint-dir: auto (resume from the newest complete checkpoint if any), never, or require (exit 2 without one)", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_resume},
    {"token", "PSTRAIN_TOKEN", NULL, NULL, "3f9c0e...", "the job's secret: every call carries it and a pserver with one refuses calls without it (printable ASCII, no spaces; prefer --token-file)", R_ALL, OPT_STR, S(token), 0, 0, NULL},
    {"trainer-tokens", "PSTRAIN_TRAINER_TOKENS_FILE", NULL, NULL, "/etc/pstrain/trainer-tokens", "pserver: one token per trainer, \"id:token\" lines; each call must carry one, and speaks only for that trainer id (instead of --token)", R_PSERVER, OPT_STR, S(trainer_tokens_file), 0, 0, NULL},
    {"token-file", "PSTRAIN_TOKEN_FILE", NULL, NULL, "/etc/pstrain/token", "read the token from this file (surrounding whitespace ignored), e.g. a mounted Kubernetes Secret", R_ALL, OPT_STR, S(token_file), 0, 0, NULL},
    {"tls-cert", "PSTRAIN_TLS_CERT", NULL, NULL, "/tls/tls.crt", "TLS: this pserver's certificate (PEM, chain allowed); with --tls-key", R_PSERVER, OPT_STR, S(tls_cert), 0, 0, NULL},
    {"tls-key", "PSTRAIN_TLS_KEY", NULL, NULL, "/tls/tls.key", "TLS: this pserver's private key (PEM)", R_PSERVER, OPT_STR, S(tls_key), 0, 0, NULL},
    {"tls-ca", "PSTRAIN_TLS_CA", NULL, NULL, "/tls/ca.crt", "TLS: trainer: the CA that signed the pservers' certificates (verified, host names too); pserver: require client certificates signed by it (mutual TLS)", R_ALL, OPT_STR, S(tls_ca), 0, 0, NULL},
    {"tls-client-cert", "PSTRAIN_TLS_CLIENT_CERT", NULL, NULL, "/tls/client.crt", "mutual TLS: this trainer's certificate (PEM); with --tls-client-key", R_TRAINER, OPT_STR, S(tls_client_cert), 0, 0, NULL},
    {"tls-client-key", "PSTRAIN_TLS_CLIENT_KEY", NULL, NULL, "/tls/client.key", "mutual TLS: this trainer's private key (PEM)", R_TRAINER, OPT_STR, S(tls_client_key), 0, 0, NULL},
    {"max-params", "PSTRAIN_MAX_PARAMS", NULL, NULL, "100000000", "pserver: refuse an Init that would make it hold more parameters than this (before allocating anything)", R_PSERVER, OPT_LONG, F(max_params), 1, 1L << 40, NULL},
    {"max-memory", "PSTRAIN_MAX_MEMORY", NULL, NULL, "16G", "pserver: refuse an Init whose blocks would take more bytes than this (values, optimizer state and one gradient buffer per trainer in sync), before allocating anything; 0: half of this machine's memory, or of its cgroup's limit", R_PSERVER, OPT_BYTES, F(max_memory), 0, 1099511627776.0, NULL},
    {"max-calls", "PSTRAIN_MAX_CALLS", NULL, NULL, "65536", "pserver: calls alive at once; more are refused RESOURCE_EXHAUSTED", R_PSERVER, OPT_INT, F(max_calls), 16, 1 << 24, NULL},
    {"max-wait-ms", "PSTRAIN_MAX_WAIT_MS", NULL, NULL, "3600000", "pserver: a call (a pull waiting for a step, an Init waiting for trainer 0) unanswered this long is ended DEADLINE_EXCEEDED (Watch excepted)", R_PSERVER, OPT_LONG, F(max_wait_ms), 1000, 86400000, NULL},
    {"on-failure", "PSTRAIN_ON_FAILURE", NULL, NULL, "wait", "when a peer is lost: fail (exit 1 with the reason) or wait (with --checkpoint-dir: every process stays, the lost one is restarted by its supervisor, and the job rolls back to the newest complete checkpoint and goes on)", R_ALL, OPT_FN, 0, 0, 0, 0, parse_on_failure},
    {"shm", "PSTRAIN_SHM", NULL, NULL, "off", "sync payloads between a trainer and a pserver on the same host: auto (through shared memory when both can map it, else in the calls) or off (always in the calls)", R_ALL, OPT_FN, 0, 0, 0, 0, parse_shm},
    {"recovery-timeout-ms", "PSTRAIN_RECOVERY_TIMEOUT_MS", NULL, NULL, "300000", "--on-failure wait: exit 1 when the job has not gone on this long after a failure", R_ALL, OPT_LONG, F(recovery_timeout_ms), 1000, 86400000, NULL},
    {"peer-timeout-ms", "PSTRAIN_PEER_TIMEOUT_MS", NULL, NULL, "5000", "a peer that stops answering keepalive pings for this long (or whose process dies: at once) is gone: a pserver tells the other trainers, a trainer stops waiting for that pserver", R_ALL, OPT_LONG, F(peer_timeout_ms), 100, 3600000, NULL},
    {"pipeline", "PSTRAIN_PIPELINE", NULL, NULL, "4", "pipeline stages: the model's layers split over this many of the trainer's devices (PSTRAIN_DEVICES=cpu:P, or cpu:P*R for R data-parallel replicas of the pipeline); 1: no pipeline", R_TRAINER, OPT_INT, F(pipeline), 1, 64, NULL},
    {"micro-batches", "PSTRAIN_MICRO_BATCHES", NULL, NULL, "8", "pipeline: micro-batches per step (the trainer's rows split in M)", R_TRAINER, OPT_INT, F(micro_batches), 1, 4096, NULL},
    {"schedule", "PSTRAIN_SCHEDULE", NULL, NULL, "1f1b", "pipeline schedule: gpipe, 1f1b or interleaved (needs --virtual-stages >= 2 and --micro-batches a multiple of --pipeline)", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_pipe_schedule},
    {"virtual-stages", "PSTRAIN_VIRTUAL_STAGES", NULL, NULL, "2", "pipeline, interleaved: model chunks per device", R_TRAINER, OPT_INT, F(virtual_stages), 1, 16, NULL},
    {"partition", "PSTRAIN_PARTITION", NULL, NULL, "2,3,3,2", "pipeline: layers per model chunk, first to last (default: balanced by compute)", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_partition},
    {"loss-scale", "PSTRAIN_LOSS_SCALE", NULL, NULL, "65536", "fp16: the initial dynamic loss scale, a power of two from 2^-24 to 2^24 (PyTorch GradScaler's default 2^16); halved on every overflow, doubled after --loss-scale-window good steps up to 2^24", R_TRAINER, OPT_FLOAT, F(loss_scale), 0x1p-24, 0x1p24, NULL},
    {"loss-scale-window", "PSTRAIN_LOSS_SCALE_WINDOW", NULL, NULL, "2000", "fp16: the loss scale doubles after this many steps without overflow (GradScaler's growth_interval)", R_TRAINER, OPT_LONG, F(loss_scale_window), 1, 1e12, NULL},
    {"seed", "PSTRAIN_SEED", NULL, NULL, "0", "seed of initialization and shuffling", R_TRAINER, OPT_U64, F(seed), 0, 0, NULL},
    {"optimizer", "PSTRAIN_OPTIMIZER", NULL, NULL, "momentum", "sgd, momentum, adam, adamw or adagrad (eps: --eps; no lr decay, initial accumulator 0)", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_optimizer},
    {"lr", "PSTRAIN_LR", NULL, NULL, "0.05", "learning rate", R_TRAINER, OPT_FLOAT, F(optim.lr), 0, 0, NULL},
    {"momentum", "PSTRAIN_MOMENTUM", NULL, NULL, "0.9", "momentum factor (optimizer momentum)", R_TRAINER, OPT_FLOAT, F(optim.momentum), 0, 0, NULL},
    {"beta1", "PSTRAIN_BETA1", NULL, NULL, "0.9", "Adam beta1", R_TRAINER, OPT_FLOAT, F(optim.beta1), 0, 0, NULL},
    {"beta2", "PSTRAIN_BETA2", NULL, NULL, "0.999", "Adam beta2", R_TRAINER, OPT_FLOAT, F(optim.beta2), 0, 0, NULL},
    {"eps", "PSTRAIN_EPS", NULL, NULL, "1e-8", "Adam epsilon", R_TRAINER, OPT_FLOAT, F(optim.eps), 0, 0, NULL},
    {"weight-decay", "PSTRAIN_WEIGHT_DECAY", NULL, NULL, "0.0001", "weight decay (L2 for sgd/momentum/adam, decoupled for adamw)", R_TRAINER, OPT_FLOAT, F(optim.weight_decay), 0, 0, NULL},
    {"lr-schedule", "PSTRAIN_LR_SCHEDULE", NULL, NULL, "constant", "constant or warmup_cosine", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_schedule},
    {"warmup-steps", "PSTRAIN_WARMUP_STEPS", NULL, NULL, "100", "warmup_cosine: steps of linear warmup", R_TRAINER, OPT_LONG, F(optim.warmup_steps), 0, 1e12, NULL},
    {"min-lr", "PSTRAIN_MIN_LR", NULL, NULL, "0", "warmup_cosine: final learning rate", R_TRAINER, OPT_FLOAT, F(optim.min_lr), 0, 0, NULL},
    {"metrics-port", "PSTRAIN_METRICS_PORT", NULL, NULL, "9464", "serve Prometheus metrics on GET /metrics at this port (0: any free port, logged; unset: off)", R_ALL, OPT_INT, F(metrics_port), 0, 65535, NULL},
    {"metrics", "PSTRAIN_METRICS", NULL, NULL, "metrics.jsonl", "append metrics as JSON lines to this file (trainer: per step and epoch; pserver: one record at exit: casts, optimizer steps, state hash)", R_ALL, OPT_STR, S(metrics_path), 0, 0, NULL},
    {"log-level", "PSTRAIN_LOG_LEVEL", NULL, NULL, "info", "debug, info, warn, error or off", R_ALL, OPT_FN, 0, 0, 0, 0, parse_log_level},
    {"progress", "PSTRAIN_PROGRESS", NULL, NULL, "auto", "auto (bar on a TTY, lines otherwise), bar, lines or none", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_progress},
    {"overlap", "PSTRAIN_OVERLAP", NULL, NULL, "1", "1: send gradient blocks during backward and start the next forward per block; 0: serialized (backward, all sends, all pulls)", R_TRAINER, OPT_BOOL, F(overlap), 0, 0, NULL},
    {"cpu-replicas", "PSTRAIN_CPU_REPLICAS", NULL, NULL, "0", "1: every CPU device keeps its own parameter copy and takes the GPU schedule (per-device reduce, staging, broadcast); 0: CPU devices share one copy", R_TRAINER, OPT_BOOL, F(cpu_replicas), 0, 0, NULL},
    {"save-params", "PSTRAIN_SAVE_PARAMS", NULL, NULL, "model-%t.f32", "at the end, write the final parameters to this file: raw little-endian fp32, the model's flat buffer in its tensors' order (the GPT: llm.c's layout); %t: the trainer id", R_TRAINER, OPT_STR, S(save_params_path), 0, 0, NULL},
    {"trace", "PSTRAIN_TRACE", NULL, NULL, "trace.json", "write a Chrome trace (Perfetto, chrome://tracing) of the streams and RPCs", R_TRAINER, OPT_STR, S(trace_path), 0, 0, NULL},
    {"trace-steps", "PSTRAIN_TRACE_STEPS", NULL, NULL, "10:12", "steps the trace covers, FIRST:LAST", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_trace_steps},
    {"gemm", "PSTRAIN_GEMM", NULL, NULL, "openblas", "the library of the CPU devices' fp32 GEMMs: auto (oneDNN's sgemm on x86-64 CPUs with AVX2 and FMA or with AVX-512, else OpenBLAS), openblas or onednn; each sums in its own order, so the parameters' bits depend on it (every trainer of a job picks by the same rule); the trainer logs the one in use", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_gemm},
    {"threads", "PSTRAIN_THREADS", NULL, NULL, "2", "compute threads, shared by the local CPU devices (0 = one per core)", R_TRAINER, OPT_INT, F(threads), 0, 1024, NULL},
    {"compute-cpus", "PSTRAIN_COMPUTE_CPUS", NULL, NULL, "0-3", "pin the compute threads (every CPU device's compute stream and thread team) to these CPUs, e.g. to keep them apart from the communication's; unset = not pinned", R_TRAINER, OPT_FN, 0, 0, 0, 0, parse_cpus},
    {"check-config", NULL, NULL, NULL, "", "print the resolved configuration as JSON and exit", R_ALL, OPT_BOOL, F(check_config), 0, 0, NULL},
    {"help", NULL, NULL, NULL, "", "show this help", R_ALL, OPT_BOOL, F(help), 0, 0, NULL},
    {"config-reference", NULL, NULL, NULL, "", "print every setting of both programs as a Markdown table (docs/configuration.md) and exit", R_ALL, OPT_BOOL, F(config_reference), 0, 0, NULL},
};
#define NOPTIONS ((int)(sizeof options / sizeof options[0]))

/* --help and the reference list the settings by topic, in this order; each option is in
 * exactly one topic (test_config checks: pst_config_topic_of finds every flag). */
static const struct {
    const char *title;
    const char *flags; /* space-separated, in display order */
} topics[] = {
    {"Cluster", "role pservers trainers trainer-id pserver-id port bind mode devices "
                "device-memory-limit server-threads"},
    {"Model and data", "model hidden params layers heads embd ctx sparse-dim sparse-admit-count "
                       "sparse-evict-after sparse-max-rows dataset data val-windows sample "
                       "temperature"},
    {"Training", "epochs steps batch seed optimizer lr momentum beta1 beta2 eps weight-decay "
                 "lr-schedule warmup-steps min-lr"},
    {"Precision", "precision grad-dtype bf16-gemm loss-scale loss-scale-window"},
    {"Accumulation and pipelines", "acc-steps pipeline micro-batches schedule virtual-stages "
                                   "partition"},
    {"Communication", "block-bytes send-window send-ahead chain overlap shm rpc-timeout-ms "
                      "connect-timeout-ms"},
    {"Checkpoints and recovery", "checkpoint-dir job-id checkpoint-every checkpoint-keep resume "
                                 "on-failure recovery-timeout-ms peer-timeout-ms save-params"},
    {"Security", "token token-file trainer-tokens tls-cert tls-key tls-ca tls-client-cert "
                 "tls-client-key"},
    {"Pserver limits", "max-params max-memory max-calls max-wait-ms"},
    {"Threads and CPUs", "threads compute-cpus cpu-replicas gemm"},
    {"Monitoring", "metrics-port metrics log-level progress trace trace-steps"},
    {"This program", "check-config help config-reference"},
};
#define NTOPICS ((int)(sizeof topics / sizeof topics[0]))

static const opt *find_flag(const char *name, size_t len, unsigned role);

/* The next word of a topic's flag list: its start (*len bytes), NULL at the end; *p moves
 * past it. */
static const char *topic_word(const char **p, size_t *len)
{
    *p += strspn(*p, " ");
    if (!**p)
        return NULL;
    const char *w = *p;
    *len = strcspn(w, " ");
    *p += *len;
    return w;
}

/* Calls fn(o, arg) for every option of topic t, in the topic's order. */
static void topic_each(int t, void (*fn)(const opt *o, void *arg), void *arg)
{
    size_t n;
    for (const char *p = topics[t].flags, *w; (w = topic_word(&p, &n));) {
        const opt *o = find_flag(w, n, R_ALL);
        if (o)
            fn(o, arg);
    }
}

int pst_config_topic_of(const char *flag)
{
    size_t n;
    for (int t = 0; t < NTOPICS; t++)
        for (const char *p = topics[t].flags, *w; (w = topic_word(&p, &n));)
            if (strlen(flag) == n && !strncmp(w, flag, n))
                return t;
    return -1;
}

int pst_config_unlisted_options(char *out, size_t size)
{
    int bad = 0;
    size_t n;
    if (size)
        out[0] = '\0';
    for (int i = 0; i < NOPTIONS; i++)
        if (pst_config_topic_of(options[i].flag) < 0) {
            size_t used = strlen(out);
            snprintf(out + used, size - used, "%s--%s", bad++ ? " " : "", options[i].flag);
        }
    for (int t = 0; t < NTOPICS; t++)
        for (const char *p = topics[t].flags, *w; (w = topic_word(&p, &n));)
            if (!find_flag(w, n, R_ALL)) {
                size_t used = strlen(out);
                snprintf(out + used, size - used, "%s(topic word %.*s)", bad++ ? " " : "",
                         (int)n, w);
            }
    return bad;
}

static pst_status parse_number(const char *v, double *out, int integer)
{
    char *e;
    errno = 0;
    double d = integer ? (double)strtoll(v, &e, 10) : strtod(v, &e);
    if (e == v || *e || errno || !isfinite(d))
        return PST_ERR_INVALID;
    *out = d;
    return PST_OK;
}

static pst_status apply(pst_config *cfg, const opt *o, const char *v, const char *where)
{
    char *base = (char *)cfg;
    char example[160];
    snprintf(example, sizeof example, "%s=%s", where, o->example);
    double d;
    char range[96];
    snprintf(range, sizeof range, "expected a number in %g..%g", o->min, o->max);
    switch (o->type) {
    case OPT_INT:
    case OPT_LONG:
        if (parse_number(v, &d, 1) || d < o->min || d > o->max) {
            snprintf(range, sizeof range, "expected an integer in %.0f..%.0f", o->min, o->max);
            return bad(where, v, range, example);
        }
        if (o->type == OPT_INT)
            *(int *)(base + o->off) = (int)d;
        else
            *(long *)(base + o->off) = (long)d;
        return PST_OK;
    case OPT_U64: {
        char *e;
        errno = 0;
        unsigned long long u = strtoull(v, &e, 10);
        if (e == v || *e || errno || v[0] == '-')
            return bad(where, v, "expected a non-negative integer", example);
        *(uint64_t *)(base + o->off) = u;
        return PST_OK;
    }
    case OPT_FLOAT: {
        /* the optimizer's settings: their one table of ranges (optim_config.h) */
        const pst_optim_range *r = pst_optim_range_of(o->flag);
        if (parse_number(v, &d, 0) || (r ? !pst_optim_in_range(r, d) : d < o->min || d > o->max)) {
            char text[64];
            if (r)
                snprintf(range, sizeof range, "expected a number in %s",
                         pst_optim_range_text(r, text, sizeof text));
            return bad(where, v, range, example);
        }
        *(float *)(base + o->off) = (float)d;
        return PST_OK;
    }
    case OPT_STR:
        if (strlen(v) >= o->size && !strcmp(o->env, "PSTRAIN_TOKEN")) /* never in a log */
            return pst_error_set(PST_ERR_INVALID, "%s: longer than %zu bytes", where,
                                 o->size - 1);
        if (strlen(v) >= o->size)
            return bad(where, v, "too long", example);
        memcpy(base + o->off, v, strlen(v) + 1);
        return PST_OK;
    case OPT_BYTES:
        return parse_bytes(v, o->min, o->max, 0, where, example, (size_t *)(base + o->off));
    case OPT_BOOL:
        if (strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 || strcasecmp(v, "yes") == 0)
            *(int *)(base + o->off) = 1;
        else if (strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0 || strcasecmp(v, "no") == 0)
            *(int *)(base + o->off) = 0;
        else
            return bad(where, v, "expected 1 or 0", example);
        return PST_OK;
    case OPT_FN:
        return o->fn(cfg, v, where, example);
    }
    return PST_ERR_INTERNAL;
}

int pst_config_text_data(const pst_config *cfg)
{
    return !strcmp(cfg->dataset, "text") || !strcmp(cfg->dataset, "kjv");
}

void pst_config_defaults(pst_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->trainers = 1;
    cfg->pserver_id = -1;
    cfg->port = -1;
    snprintf(cfg->bind_host, sizeof cfg->bind_host, "0.0.0.0");
    cfg->mode = PST_MODE_SYNC;
    cfg->block_bytes = 4u << 20;
    cfg->send_window = PST_SEND_WINDOW_AUTO;
    cfg->send_ahead = PST_SEND_AHEAD_AUTO;
    cfg->shm = 1;
    cfg->bf16_gemm = PST_BF16_GEMM_AUTO;
    cfg->gemm = PST_GEMM_AUTO;
    snprintf(cfg->devices, sizeof cfg->devices, "cpu:1");
    cfg->rpc_timeout_ms = 60000;
    cfg->connect_timeout_ms = 30000;
    cfg->server_threads = 2;
    snprintf(cfg->model, sizeof cfg->model, "mlp");
    cfg->nhidden = 2;
    cfg->hidden[0] = 1024;
    cfg->hidden[1] = 1024;
    cfg->params = 25000000;
    cfg->layers = 4;
    cfg->heads = 4;
    cfg->embd = 128;
    cfg->ctx = 128;
    cfg->sparse_dim = 16;
    cfg->sparse_admit_count = 1;
    cfg->val_windows = 64;
    cfg->temperature = 0.8f;
    snprintf(cfg->dataset, sizeof cfg->dataset, "fashion-mnist");
    cfg->epochs = 1;
    cfg->batch = 128;
    pst_optim_defaults(&cfg->optim);
    cfg->optim.kind = PST_OPTIM_MOMENTUM;
    cfg->optim.lr = 0.05f;
    cfg->log_level = PST_LOG_INFO;
    cfg->threads = 0;
    cfg->overlap = 1;
    cfg->precision = PST_F32;
    cfg->grad_dtype = PST_F32;
    cfg->acc_steps = 1;
    cfg->checkpoint_every = 100;
    cfg->peer_timeout_ms = 5000;
    cfg->recovery_timeout_ms = 300000;
    cfg->metrics_port = -1;
    cfg->max_params = 1L << 30;
    cfg->max_calls = 65536;
    cfg->max_wait_ms = 3600000;
    cfg->checkpoint_keep = 2;
    cfg->pipeline = 1;
    cfg->micro_batches = 1;
    cfg->schedule = PST_SCHEDULE_1F1B;
    cfg->virtual_stages = 1;
    cfg->loss_scale = 65536.0f;
    cfg->loss_scale_window = 2000;
    cfg->trace_first = 10;
    cfg->trace_last = 12;
}

static int is_bool_word(const char *v)
{
    static const char *const words[] = {"0", "1", "true", "false", "yes", "no"};
    for (int i = 0; i < 6; i++)
        if (strcasecmp(v, words[i]) == 0)
            return 1;
    return 0;
}

static const opt *find_flag(const char *name, size_t len, unsigned role)
{
    for (int i = 0; i < NOPTIONS; i++)
        if ((options[i].roles & role) && strlen(options[i].flag) == len &&
            strncmp(options[i].flag, name, len) == 0)
            return &options[i];
    return NULL;
}

/* --token-file read into cfg->token (trimmed), and the token checked: printable ASCII
 * without spaces, as a gRPC metadata value must be. */
static pst_status load_token(pst_config *cfg)
{
    if (cfg->token_file[0]) {
        if (cfg->token[0])
            return pst_error_set(PST_ERR_INVALID, "both PSTRAIN_TOKEN and PSTRAIN_TOKEN_FILE "
                                 "are set: give one (example: PSTRAIN_TOKEN_FILE=/etc/pstrain/"
                                 "token)");
        FILE *f = fopen(cfg->token_file, "rb");
        if (!f)
            return pst_error_set(PST_ERR_INVALID, "PSTRAIN_TOKEN_FILE=%s: cannot read it: %s "
                                 "(example: openssl rand -hex 32 > %s)", cfg->token_file,
                                 strerror(errno), cfg->token_file);
        char buf[PST_TOKEN_MAX + 2];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        const int err = ferror(f), more = n == sizeof buf - 1 && fgetc(f) != EOF;
        fclose(f);
        if (err)
            return pst_error_set(PST_ERR_INVALID, "PSTRAIN_TOKEN_FILE=%s: cannot read it",
                                 cfg->token_file);
        buf[n] = '\0';
        size_t a = 0;
        while (a < n && isspace((unsigned char)buf[a]))
            a++;
        while (n > a && isspace((unsigned char)buf[n - 1]))
            buf[--n] = '\0';
        if (more || n - a > PST_TOKEN_MAX)
            return pst_error_set(PST_ERR_INVALID, "PSTRAIN_TOKEN_FILE=%s: longer than %d bytes "
                                 "(example: openssl rand -hex 32 > %s)", cfg->token_file,
                                 PST_TOKEN_MAX, cfg->token_file);
        if (n == a)
            return pst_error_set(PST_ERR_INVALID, "PSTRAIN_TOKEN_FILE=%s: empty; it must hold "
                                 "the token (example: openssl rand -hex 32 > %s)",
                                 cfg->token_file, cfg->token_file);
        memcpy(cfg->token, buf + a, n - a);
        cfg->token[n - a] = '\0';
    }
    for (const char *p = cfg->token; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            return pst_error_set(PST_ERR_INVALID, "%s: the token has a %s at byte %d; it must "
                                 "be printable ASCII without spaces (example: openssl rand "
                                 "-hex 32)", cfg->token_file[0] ? cfg->token_file : "PSTRAIN_TOKEN",
                                 *p == ' ' ? "space" : "control or non-ASCII byte",
                                 (int)(p - cfg->token));
    return PST_OK;
}

void pst_trainer_tokens_free(char **tokens, int n)
{
    for (int i = 0; tokens && i < n; i++)
        free(tokens[i]);
    free(tokens);
}

pst_status pst_trainer_tokens_load(const char *path, char ***tokens, int *n)
{
    *tokens = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return pst_error_set(PST_ERR_INVALID, "PSTRAIN_TRAINER_TOKENS_FILE=%s: cannot read it: "
                             "%s (example line: 3:$(openssl rand -hex 32))", path,
                             strerror(errno));
    char **tab = calloc(4096, sizeof *tab);
    char line[PST_TOKEN_MAX + 64];
    pst_status st = tab ? PST_OK : pst_error_set(PST_ERR_NOMEM, "trainer tokens: out of memory");
    int most = 0;
    for (int ln = 1; st == PST_OK && fgets(line, sizeof line, f); ln++) {
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            st = pst_error_set(PST_ERR_INVALID, "PSTRAIN_TRAINER_TOKENS_FILE=%s line %d: longer "
                               "than %d bytes", path, ln, (int)sizeof line - 2);
            break;
        }
        while (len && isspace((unsigned char)line[len - 1]))
            line[--len] = '\0';
        char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (!*p || *p == '#')
            continue;
        char *e;
        errno = 0;
        const long id = strtol(p, &e, 10);
        char *tok = e + (*e == ':');
        while (isspace((unsigned char)*tok))
            tok++;
        int bad = e == p || *e != ':' || errno || id < 0 || id > 4095 || !*tok ||
                  strlen(tok) > PST_TOKEN_MAX;
        for (const char *c = tok; !bad && *c; c++)
            bad = *c < 0x21 || *c > 0x7e;
        if (bad) {
            st = pst_error_set(PST_ERR_INVALID, "PSTRAIN_TRAINER_TOKENS_FILE=%s line %d: not "
                               "\"id:token\" with an id in 0..4095 and a token of printable "
                               "ASCII without spaces (example: 3:$(openssl rand -hex 32))",
                               path, ln);
            break;
        }
        if (tab[id]) {
            st = pst_error_set(PST_ERR_INVALID, "PSTRAIN_TRAINER_TOKENS_FILE=%s line %d: trainer "
                               "%ld listed twice", path, ln, id);
            break;
        }
        for (int t = 0; t < most; t++)
            if (tab[t] && !strcmp(tab[t], tok)) {
                st = pst_error_set(PST_ERR_INVALID, "PSTRAIN_TRAINER_TOKENS_FILE=%s line %d: "
                                   "trainer %ld has trainer %d's token (each needs its own)",
                                   path, ln, id, t);
                break;
            }
        if (st == PST_OK && !(tab[id] = strdup(tok)))
            st = pst_error_set(PST_ERR_NOMEM, "trainer tokens: out of memory");
        most = id + 1 > most ? (int)id + 1 : most;
    }
    if (st == PST_OK && ferror(f))
        st = pst_error_set(PST_ERR_INVALID, "PSTRAIN_TRAINER_TOKENS_FILE=%s: cannot read it",
                           path);
    if (st == PST_OK && most == 0)
        st = pst_error_set(PST_ERR_INVALID, "PSTRAIN_TRAINER_TOKENS_FILE=%s: no \"id:token\" "
                           "line (example: 0:$(openssl rand -hex 32))", path);
    fclose(f);
    if (st != PST_OK) {
        pst_trainer_tokens_free(tab, 4096);
        return st;
    }
    *tokens = tab;
    *n = most;
    return PST_OK;
}

pst_status pst_config_load(pst_config *cfg, pst_role role, int argc, char **argv,
                           pst_getenv_fn getenv_fn)
{
    pst_config_defaults(cfg);
    cfg->role = role;
    unsigned rmask = 1u << role;
    char given[NOPTIONS] = {0}; /* set from the environment or a flag */

    /* Environment: Paddle's alias first, PSTRAIN_* over it. */
    for (int i = 0; i < NOPTIONS; i++) {
        const opt *o = &options[i];
        if (!(o->roles & rmask))
            continue;
        const char *names[] = {o->alias2, o->alias, o->env};
        for (int k = 0; k < 3; k++) {
            const char *v = names[k] ? getenv_fn(names[k]) : NULL;
            if (v && *v) {
                PST_TRY(apply(cfg, o, v, names[k]));
                given[i] = 1;
            }
        }
    }

    /* Flags. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0)
            return pst_error_set(PST_ERR_INVALID,
                                 "%s: unexpected argument; flags look like --batch 128 (see --help)", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const opt *o = find_flag(name, len, rmask);
        if (!o)
            return pst_error_set(PST_ERR_INVALID,
                                 "%.*s: unknown flag for the %s (example: --batch 128; see --help)",
                                 (int)(len + 2), a, pst_role_name(role));
        const char *v;
        if (eq)
            v = eq + 1;
        else if (o->type == OPT_BOOL && i + 1 < argc && is_bool_word(argv[i + 1]))
            v = argv[++i];
        else if (o->type == OPT_BOOL)
            v = "1";
        else if (i + 1 < argc)
            v = argv[++i];
        else
            return pst_error_set(PST_ERR_INVALID, "--%s needs a value (example: --%s %s)",
                                 o->flag, o->flag, o->example);
        char where[64];
        snprintf(where, sizeof where, "--%s", o->flag);
        PST_TRY(apply(cfg, o, v, where));
        given[o - options] = 1;
    }
    if (cfg->help || cfg->config_reference)
        return PST_OK;

    /* The whole. */
    PST_TRY(load_token(cfg));
    if (role == PST_ROLE_TRAINER && (!strcmp(cfg->model, "gpt") || !strcmp(cfg->model, "dlrm"))) {
        /* The GPT's and the DLRM's own defaults (their PyTorch peers') for what was not set: */
        typedef struct flag_default {
            const char *flag, *value;
        } flag_default;
        static const flag_default gpt_defaults[] = {
            {"dataset", "kjv"}, {"batch", "16"}, {"optimizer", "adamw"}, {"lr", "0.001"},
            {"beta2", "0.99"}, {"weight-decay", "0"}, {NULL, NULL}};
        static const flag_default dlrm_defaults[] = {
            {"dataset", "ctr"}, {"batch", "512"}, {"optimizer", "adagrad"}, {"lr", "0.05"},
            {"eps", "1e-10"}, {NULL, NULL}};
        const int gpt = !strcmp(cfg->model, "gpt");
        for (const flag_default *d = gpt ? gpt_defaults : dlrm_defaults; d->flag; d++) {
            const opt *o = find_flag(d->flag, strlen(d->flag), rmask);
            if (o && !given[o - options])
                PST_TRY(apply(cfg, o, d->value, gpt ? "--model gpt's default"
                                                    : "--model dlrm's default"));
        }
    }
    if (role == PST_ROLE_TRAINER) {
        const int text = pst_config_text_data(cfg);
        if (!cfg->data_dir[0] && !strcmp(cfg->dataset, "kjv"))
            snprintf(cfg->data_dir, sizeof cfg->data_dir, "%s", PST_KJV_PATH);
        else if (!cfg->data_dir[0] && text)
            return pst_error_set(PST_ERR_INVALID, "--dataset text needs --data FILE (example: "
                                 "--dataset text --data corpus.txt)");
        else if (!cfg->data_dir[0] && !strcmp(cfg->dataset, "ctr"))
            return pst_error_set(PST_ERR_INVALID, "--dataset ctr needs --data FILE, a click "
                                 "file in ctr_synth.py's format (scripts/ctr-synth writes "
                                 "one; example: --data ctr.bin)");
        else if (!cfg->data_dir[0]) /* --data not given: the data set's own directory */
            snprintf(cfg->data_dir, sizeof cfg->data_dir, "/usr/share/datasets/%s",
                     cfg->dataset);
        const int ctr = !strcmp(cfg->dataset, "ctr"), dlrm = !strcmp(cfg->model, "dlrm");
        if (((strcmp(cfg->model, "gpt") == 0) != text || dlrm != ctr) &&
            strcmp(cfg->model, "synthetic") != 0)
            return pst_error_set(PST_ERR_INVALID, "--model %s cannot train on --dataset %s: the "
                                 "gpt model reads text (--dataset text or kjv), the dlrm click "
                                 "data (--dataset ctr), the mlp images (example: --model gpt "
                                 "--dataset kjv)", cfg->model, cfg->dataset);
        if (!strcmp(cfg->model, "gpt") && cfg->embd % cfg->heads)
            return pst_error_set(PST_ERR_INVALID, "--embd %d is not a multiple of --heads %d "
                                 "(example: --embd 128 --heads 4)", cfg->embd, cfg->heads);
        if (cfg->num_pservers == 0 && cfg->trainers > 1)
            return pst_error_set(PST_ERR_INVALID,
                                 "PSTRAIN_TRAINERS=%d but no pservers: set PSTRAIN_PSERVERS "
                                 "(example: PSTRAIN_PSERVERS=127.0.0.1:7164)", cfg->trainers);
        if (cfg->trainer_id >= cfg->trainers)
            return pst_error_set(PST_ERR_INVALID,
                                 "PSTRAIN_TRAINER_ID=%d: must be below PSTRAIN_TRAINERS=%d "
                                 "(example: PSTRAIN_TRAINER_ID=0)", cfg->trainer_id, cfg->trainers);
        if (cfg->chain_len > 0 && (cfg->chain_len != cfg->trainers || cfg->trainers < 2))
            return pst_error_set(PST_ERR_INVALID, "PSTRAIN_CHAIN lists %d trainers' addresses, "
                                 "PSTRAIN_TRAINERS=%d: a chain names every trainer, and there "
                                 "are at least two (example: PSTRAIN_TRAINERS=2 PSTRAIN_CHAIN="
                                 "10.0.0.5:7200,10.0.0.6:7200)", cfg->chain_len, cfg->trainers);
        if (cfg->chain_len > 0 && cfg->on_failure == PST_ON_FAILURE_WAIT)
            return pst_error_set(PST_ERR_INVALID, "PSTRAIN_CHAIN with --on-failure wait: a "
                                 "chain of trainers does not roll back after a failure yet "
                                 "(example: --on-failure fail)");
        if (cfg->chain_len > 0 && cfg->mode != PST_MODE_SYNC)
            return pst_error_set(PST_ERR_INVALID, "PSTRAIN_CHAIN needs --mode sync: a chain "
                                 "sums every trainer's gradient of a step (example: unset "
                                 "PSTRAIN_CHAIN for async)");
        if (pst_optim_check(&cfg->optim) != PST_OK) /* Adam's eps > 0: a pserver checks too */
            return pst_error_set(PST_ERR_INVALID, "--optimizer %s: %s",
                                 pst_optim_kind_name(cfg->optim.kind), pst_error_detail());
        if (!cfg->grad_dtype_set)
            cfg->grad_dtype = cfg->precision;
        if (cfg->chain_len > 0 && (cfg->precision == PST_F16 || cfg->grad_dtype == PST_F16))
            return pst_error_set(PST_ERR_INVALID, "PSTRAIN_CHAIN with fp16: a chain does not "
                                 "carry the loss scale yet (example: --precision bf16, or "
                                 "unset PSTRAIN_CHAIN)");
        if (cfg->chain_len > 0 && (cfg->tls_ca[0] || cfg->tls_client_cert[0]))
            return pst_error_set(PST_ERR_INVALID, "PSTRAIN_CHAIN with TLS: the trainers' relays "
                                 "do not serve TLS yet (example: unset PSTRAIN_CHAIN, or "
                                 "PSTRAIN_TLS_CA)");
        if (cfg->precision == PST_F16 && cfg->mode == PST_MODE_ASYNC)
            return pst_error_set(PST_ERR_INVALID, "--precision fp16 needs --mode sync: its "
                                 "overflow vote keeps the trainers in step (example: "
                                 "--precision bf16 --mode async)");
        int e;
        if (frexpf(cfg->loss_scale, &e) != 0.5f)
            return pst_error_set(PST_ERR_INVALID, "--loss-scale %g is not a power of two "
                                 "(example: --loss-scale 65536)", (double)cfg->loss_scale);
        if (cfg->batch < cfg->trainers * cfg->acc_steps)
            return pst_error_set(PST_ERR_INVALID,
                                 "--batch %d: the global batch must give each of the %d "
                                 "trainers' %d micro-batches at least one example (example: "
                                 "--batch %d)", cfg->batch, cfg->trainers, cfg->acc_steps,
                                 cfg->trainers * cfg->acc_steps * 32);
        if (cfg->pipeline == 1 && cfg->micro_batches > 1)
            return pst_error_set(PST_ERR_INVALID, "--micro-batches %d without --pipeline: "
                                 "micro-batches of one device are --acc-steps (example: "
                                 "--acc-steps %d, or --pipeline 2 --micro-batches %d)",
                                 cfg->micro_batches, cfg->micro_batches, cfg->micro_batches);
        if (cfg->pipeline > 1 && cfg->acc_steps > 1)
            return pst_error_set(PST_ERR_INVALID, "--acc-steps %d with --pipeline %d: a "
                                 "pipeline's micro-batches are --micro-batches (example: "
                                 "--pipeline %d --micro-batches %d)", cfg->acc_steps,
                                 cfg->pipeline, cfg->pipeline, cfg->acc_steps);
        if (cfg->virtual_stages > 1 && cfg->schedule != PST_SCHEDULE_INTERLEAVED)
            return pst_error_set(PST_ERR_INVALID, "--virtual-stages %d needs --schedule "
                                 "interleaved (example: --schedule interleaved "
                                 "--virtual-stages 2)", cfg->virtual_stages);
        if (cfg->pipeline > 1 && cfg->batch < cfg->trainers * cfg->micro_batches)
            return pst_error_set(PST_ERR_INVALID,
                                 "--batch %d: the global batch must give each of the %d "
                                 "trainers' %d micro-batches at least one example (example: "
                                 "--batch %d)", cfg->batch, cfg->trainers, cfg->micro_batches,
                                 cfg->trainers * cfg->micro_batches * 8);
        if (cfg->batch < cfg->trainers)
            return pst_error_set(PST_ERR_INVALID,
                                 "--batch %d: the global batch must give every one of the %d "
                                 "trainers at least one example (example: --batch 128)",
                                 cfg->batch, cfg->trainers);
    } else {
        if (cfg->port < 0 && cfg->pserver_id >= 0) {
            if (cfg->pserver_id >= cfg->num_pservers)
                return pst_error_set(PST_ERR_INVALID,
                                     "PSTRAIN_PSERVER_ID=%d: PSTRAIN_PSERVERS lists %d pservers; "
                                     "set both (example: PSTRAIN_PSERVERS=127.0.0.1:7164 "
                                     "PSTRAIN_PSERVER_ID=0) or PSTRAIN_PORT=7164",
                                     cfg->pserver_id, cfg->num_pservers);
            cfg->port = atoi(strrchr(cfg->pservers[cfg->pserver_id], ':') + 1);
        }
        if (cfg->port < 0)
            return pst_error_set(PST_ERR_INVALID,
                                 "PSTRAIN_PORT is not set: a pserver needs its port "
                                 "(example: PSTRAIN_PORT=7164, or PSTRAIN_PSERVER_ID=0 with "
                                 "PSTRAIN_PSERVERS)");
    }
    return PST_OK;
}

const char *pst_role_name(pst_role r)
{
    return r == PST_ROLE_PSERVER ? "pserver" : "trainer";
}

const char *pst_schedule_name(pst_schedule s)
{
    return s == PST_SCHEDULE_GPIPE ? "gpipe" : s == PST_SCHEDULE_1F1B ? "1f1b" : "interleaved";
}

const char *pst_mode_name(pst_mode m)
{
    return m == PST_MODE_ASYNC ? "async" : "sync";
}

typedef struct help_ctx {
    FILE *out;
    unsigned rmask;
    int shown; /* options of this topic printed so far */
    const char *title;
} help_ctx;

static void help_line(const opt *o, void *arg)
{
    help_ctx *h = arg;
    if (!(o->roles & h->rmask))
        return;
    if (!h->shown++)
        fprintf(h->out, "\n%s:\n", h->title);
    char left[64];
    snprintf(left, sizeof left, "--%s%s%s", o->flag, o->example[0] ? " " : "",
             o->type == OPT_BOOL ? "" : o->example);
    fprintf(h->out, "  %-40s %s\n", left, o->help);
    if (o->env)
        fprintf(h->out, "  %-40s   env %s%s%s%s%s\n", "", o->env, o->alias ? ", " : "",
                o->alias ? o->alias : "", o->alias2 ? ", " : "", o->alias2 ? o->alias2 : "");
}

void pst_config_print_help(FILE *out, pst_role role, const char *prog)
{
    fprintf(out, "usage: %s [--flag value | --flag=value] ...\n", prog);
    fprintf(out, "Every flag can also be set by its environment variable; flags win.\n");
    for (int t = 0; t < NTOPICS; t++) {
        help_ctx h = {.out = out, .rmask = 1u << role, .title = topics[t].title};
        topic_each(t, help_line, &h);
    }
}

static void json_str(FILE *out, const char *key, const char *v, int *first)
{
    fprintf(out, "%s\"%s\":\"", *first ? "" : ",", key);
    for (const char *p = v; *p; p++) {
        if (*p == '"' || *p == '\\')
            fputc('\\', out);
        if ((unsigned char)*p >= 0x20)
            fputc(*p, out);
    }
    fputc('"', out);
    *first = 0;
}

void pst_config_print(FILE *out, const pst_config *cfg)
{
    int first = 1;
    char buf[PST_MAX_PSERVERS * PST_ADDR_MAX + 64];
    fputc('{', out);
    json_str(out, "role", pst_role_name(cfg->role), &first);
    buf[0] = '\0';
    for (int i = 0; i < cfg->num_pservers; i++) {
        strcat(buf, i ? "," : "");
        strcat(buf, cfg->pservers[i]);
    }
    json_str(out, "pservers", buf, &first);
    _Static_assert(PST_MAX_CHAIN <= PST_MAX_PSERVERS, "the chain's list fits buf");
    if (cfg->role == PST_ROLE_TRAINER) {
        buf[0] = '\0';
        for (int i = 0; i < cfg->chain_len; i++) {
            strcat(buf, i ? "," : "");
            strcat(buf, cfg->chain[i]);
        }
        json_str(out, "chain", buf, &first);
    }
    if (cfg->role == PST_ROLE_PSERVER) {
        fprintf(out, ",\"port\":%d,\"pserver_id\":%d,\"server_threads\":%d", cfg->port,
                cfg->pserver_id, cfg->server_threads);
        fprintf(out, ",\"max_params\":%ld,\"max_memory\":%zu,\"max_calls\":%d,"
                "\"max_wait_ms\":%ld", cfg->max_params, cfg->max_memory, cfg->max_calls,
                cfg->max_wait_ms);
        json_str(out, "bind", cfg->bind_host, &first);
    } else {
        fprintf(out, ",\"trainers\":%d,\"trainer_id\":%d", cfg->trainers, cfg->trainer_id);
        json_str(out, "mode", pst_mode_name(cfg->mode), &first);
        fprintf(out, ",\"block_bytes\":%zu", cfg->block_bytes);
        if (cfg->send_window == PST_SEND_WINDOW_AUTO)
            json_str(out, "send_window", "auto", &first);
        else
            fprintf(out, ",\"send_window\":%zu", cfg->send_window);
        if (cfg->send_ahead == PST_SEND_AHEAD_AUTO)
            json_str(out, "send_ahead", "auto", &first);
        else
            fprintf(out, ",\"send_ahead\":%d", cfg->send_ahead);
        json_str(out, "devices", cfg->devices, &first);
        fprintf(out, ",\"device_memory_limit\":%zu", cfg->device_memory_limit);
        json_str(out, "compute_cpus", cfg->compute_cpus, &first);
        json_str(out, "model", cfg->model, &first);
        buf[0] = '\0';
        for (int i = 0; i < cfg->nhidden; i++)
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%d", i ? "," : "",
                     cfg->hidden[i]);
        json_str(out, "hidden", buf, &first);
        fprintf(out, ",\"params\":%ld,\"layers\":%d,\"heads\":%d,\"embd\":%d,\"ctx\":%d,"
                     "\"val_windows\":%d,\"sample\":%d,\"temperature\":%g",
                cfg->params, cfg->layers, cfg->heads, cfg->embd, cfg->ctx, cfg->val_windows,
                cfg->sample, cfg->temperature);
        json_str(out, "dataset", cfg->dataset, &first);
        json_str(out, "data", cfg->data_dir, &first);
        fprintf(out, ",\"epochs\":%d,\"steps\":%ld,\"batch\":%d,\"seed\":%llu", cfg->epochs,
                cfg->steps, cfg->batch, (unsigned long long)cfg->seed);
        json_str(out, "optimizer", pst_optim_kind_name(cfg->optim.kind), &first);
        fprintf(out, ",\"lr\":%g,\"momentum\":%g,\"beta1\":%g,\"beta2\":%g,\"eps\":%g,"
                     "\"weight_decay\":%g",
                cfg->optim.lr, cfg->optim.momentum, cfg->optim.beta1, cfg->optim.beta2,
                cfg->optim.eps, cfg->optim.weight_decay);
        json_str(out, "lr_schedule", pst_lr_schedule_name(cfg->optim.schedule), &first);
        fprintf(out, ",\"warmup_steps\":%ld,\"min_lr\":%g,\"connect_timeout_ms\":%ld",
                cfg->optim.warmup_steps, cfg->optim.min_lr, cfg->connect_timeout_ms);
        fprintf(out, ",\"rpc_timeout_ms\":%ld,\"threads\":%d,\"overlap\":%d,\"cpu_replicas\":%d",
                cfg->rpc_timeout_ms, cfg->threads, cfg->overlap, cfg->cpu_replicas);
        json_str(out, "precision", pst_dtype_name(cfg->precision), &first);
        json_str(out, "grad_dtype", pst_dtype_name(cfg->grad_dtype), &first);
        json_str(out, "bf16_gemm", cfg->bf16_gemm == PST_BF16_GEMM_AUTO ? "auto"
                                   : cfg->bf16_gemm == PST_BF16_GEMM_ON ? "on"
                                                                        : "off", &first);
        json_str(out, "gemm", cfg->gemm == PST_GEMM_AUTO       ? "auto"
                              : cfg->gemm == PST_GEMM_OPENBLAS ? "openblas"
                                                               : "onednn", &first);
        fprintf(out, ",\"acc_steps\":%d,\"pipeline\":%d,\"micro_batches\":%d", cfg->acc_steps,
                cfg->pipeline, cfg->micro_batches);
        json_str(out, "schedule", pst_schedule_name(cfg->schedule), &first);
        fprintf(out, ",\"virtual_stages\":%d", cfg->virtual_stages);
        json_str(out, "trace", cfg->trace_path, &first);
        fprintf(out, ",\"trace_steps\":\"%ld:%ld\"", cfg->trace_first, cfg->trace_last);
        json_str(out, "metrics", cfg->metrics_path, &first);
        json_str(out, "resume", cfg->resume == PST_RESUME_NEVER     ? "never"
                                : cfg->resume == PST_RESUME_REQUIRE ? "require"
                                                                    : "auto", &first);
        fprintf(out, ",\"checkpoint_every\":%ld", cfg->checkpoint_every);
        json_str(out, "job_id", cfg->job_id, &first);
    }
    fprintf(out, ",\"metrics_port\":%d", cfg->metrics_port);
    json_str(out, "checkpoint_dir", cfg->checkpoint_dir, &first);
    json_str(out, "token", cfg->token[0] ? "set" : "none", &first); /* never the secret */
    json_str(out, "token_file", cfg->token_file, &first);
    json_str(out, "tls_ca", cfg->tls_ca, &first);
    if (cfg->role == PST_ROLE_PSERVER) {
        json_str(out, "tls_cert", cfg->tls_cert, &first);
        json_str(out, "tls_key", cfg->tls_key, &first);
    } else {
        json_str(out, "tls_client_cert", cfg->tls_client_cert, &first);
        json_str(out, "tls_client_key", cfg->tls_client_key, &first);
    }
    fprintf(out, ",\"checkpoint_keep\":%d,\"peer_timeout_ms\":%ld", cfg->checkpoint_keep,
            cfg->peer_timeout_ms);
    json_str(out, "on_failure", cfg->on_failure == PST_ON_FAILURE_WAIT ? "wait" : "fail", &first);
    fprintf(out, ",\"recovery_timeout_ms\":%ld", cfg->recovery_timeout_ms);
    json_str(out, "shm", cfg->shm ? "auto" : "off", &first);
    fputs("}\n", out);
}

/* A table cell: what v says, with '|' escaped and line breaks folded. */
static void md_cell(FILE *out, const char *v)
{
    fputs("| ", out);
    for (const char *p = v ? v : ""; *p; p++) {
        if (*p == '|')
            fputs("\\|", out);
        else
            fputc(*p == '\n' ? ' ' : *p, out);
    }
    fputc(' ', out);
}

/* The value key has in the JSON of pst_config_print (a flag's name with '_' for '-'),
 * without its quotes, into out ("" when it is not there). */
static void json_value(const char *json, const char *flag, char *out, size_t size)
{
    char key[72];
    snprintf(key, sizeof key, "\"%s\":", flag);
    for (char *k = key; *k; k++)
        *k = *k == '-' ? '_' : *k;
    out[0] = '\0';
    const char *at = strstr(json, key);
    if (!at)
        return;
    at += strlen(key);
    const int quoted = *at == '"';
    at += quoted;
    size_t n = 0;
    while (at[n] && n + 1 < size && (quoted ? at[n] != '"' : at[n] != ',' && at[n] != '}'))
        n++;
    memcpy(out, at, n);
    out[n] = '\0';
}

typedef struct ref_ctx {
    FILE *out;
    const pst_config *defaults; /* the trainer's */
    const char *json;           /* both programs' defaults, as --check-config prints them */
} ref_ctx;

/* One row of the reference's table for o. */
static void ref_row(const opt *o, void *arg)
{
    const ref_ctx *r = arg;
    char flag[80], env[80] = "", alias[96] = "", def[256] = "", range[64] = "";
    snprintf(flag, sizeof flag, "`--%s`", o->flag);
    if (o->env)
        snprintf(env, sizeof env, "`%s`", o->env);
    if (o->alias)
        snprintf(alias, sizeof alias, "`%s`%s%s%s", o->alias, o->alias2 ? ", `" : "",
                 o->alias2 ? o->alias2 : "", o->alias2 ? "`" : "");
    const char *prog = o->roles == R_ALL ? "both" : o->roles == R_TRAINER ? "trainer"
                                                                            : "pserver";
    const char *base = (const char *)r->defaults + o->off;
    switch (o->type) {
    case OPT_INT: snprintf(def, sizeof def, "%d", *(const int *)base); break;
    case OPT_LONG: snprintf(def, sizeof def, "%ld", *(const long *)base); break;
    case OPT_U64:
        snprintf(def, sizeof def, "%llu", (unsigned long long)*(const uint64_t *)base);
        break;
    case OPT_FLOAT: snprintf(def, sizeof def, "%g", (double)*(const float *)base); break;
    case OPT_BYTES: snprintf(def, sizeof def, "%zu", *(const size_t *)base); break;
    case OPT_BOOL: snprintf(def, sizeof def, "%d", *(const int *)base); break;
    case OPT_STR: snprintf(def, sizeof def, "%s", base); break;
    case OPT_FN: json_value(r->json, o->flag, def, sizeof def); break;
    }
    if (o->type == OPT_STR && !strcmp(o->flag, "token"))
        def[0] = '\0'; /* never printed, even empty */
    const pst_optim_range *orange = pst_optim_range_of(o->flag);
    if (o->type == OPT_BOOL)
        snprintf(range, sizeof range, "0 or 1");
    else if (orange)
        pst_optim_range_text(orange, range, sizeof range);
    else if (o->max > o->min && o->type != OPT_STR && o->type != OPT_FN)
        snprintf(range, sizeof range, "%.17g .. %.17g", o->min, o->max);
    char defcell[270];
    snprintf(defcell, sizeof defcell, def[0] ? "`%s`" : "%s", def);
    md_cell(r->out, flag);
    md_cell(r->out, env);
    md_cell(r->out, alias);
    md_cell(r->out, prog);
    md_cell(r->out, defcell);
    md_cell(r->out, range);
    md_cell(r->out, o->help);
    fputs("|\n", r->out);
}

void pst_config_print_reference(FILE *out)
{
    pst_config d, dp;
    pst_config_defaults(&d);
    pst_config_defaults(&dp);
    d.role = PST_ROLE_TRAINER;
    dp.role = PST_ROLE_PSERVER;
    char *json = NULL; /* both programs' defaults, as --check-config prints them */
    size_t json_len = 0;
    FILE *m = open_memstream(&json, &json_len);
    if (m) {
        pst_config_print(m, &d);
        pst_config_print(m, &dp);
        fclose(m);
    }
    fputs("# Configuration reference\n\n"
          "<!-- Written by `build/bin/trainer --config-reference` (`make docs`) from the option "
          "table in common/config.c; the suite fails when the two disagree. Do not edit. -->\n\n"
          "Every setting is a flag and an environment variable; a flag wins over its "
          "variable, a `PSTRAIN_*` variable over Paddle's name. `--help` lists a program's "
          "settings, `--check-config` prints the configuration a process resolved as JSON "
          "and exits. A missing or malformed value is one line naming the variable and an "
          "example of a good value, exit status 2. The token itself never appears in "
          "`--check-config`. Manifests written for PaddlePaddle's PS mode work as they are: "
          "its variables are the \"Paddle's name\" column. The other errors a user can "
          "meet: [troubleshooting.md](troubleshooting.md).\n\n"
          "The settings by topic, in the order `--help` lists them:\n", out);
    ref_ctx r = {.out = out, .defaults = &d, .json = json ? json : ""};
    for (int t = 0; t < NTOPICS; t++) {
        fprintf(out, "\n## %s\n\n", topics[t].title);
        fputs("| flag | variable | Paddle's name | program | default | range | meaning |\n"
              "| --- | --- | --- | --- | --- | --- | --- |\n", out);
        topic_each(t, ref_row, &r);
    }
    free(json);
}

static const char *process_env(const char *name)
{
    return getenv(name);
}

int pst_config_main(pst_config *cfg, pst_role role, const char *prog, int argc, char **argv)
{
    if (pst_config_load(cfg, role, argc, argv, process_env) != PST_OK) {
        fprintf(stderr, "%s: %s\n", prog, pst_error_detail());
        return 2;
    }
    if (cfg->help)
        pst_config_print_help(stdout, role, prog);
    else if (cfg->config_reference)
        pst_config_print_reference(stdout);
    else if (cfg->check_config)
        pst_config_print(stdout, cfg);
    else
        return -1;
    return 0;
}
