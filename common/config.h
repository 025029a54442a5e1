/* config.h — the configuration of a pstrain process, resolved once in main() from the
 * environment and the command line (flags win), then passed down by pointer. Nothing
 * below main() reads the environment.
 *
 * Every setting has a flag and an environment variable (PSTRAIN_*); some also accept the
 * names PaddlePaddle's PS mode and its operators set (TRAINING_ROLE, PADDLE_PSERVERS_IP_PORT_LIST,
 * PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID, POD_IP + PADDLE_PORT), so manifests written for
 * them work unchanged. Precedence: flag > PSTRAIN_* > Paddle name > default.
 * A missing or malformed value is PST_ERR_INVALID with a one-line detail naming the
 * variable or flag and an example of a good value. */
#ifndef PST_CONFIG_H
#define PST_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/log.h"
#include "common/optim_config.h"

#define PST_MAX_PSERVERS 64
#define PST_ADDR_MAX 128
#define PST_MAX_CHAIN 64 /* trainers in a chain (PSTRAIN_CHAIN) */
#define PST_PATH_MAX 512
#define PST_TOKEN_MAX 1024
#define PST_JOB_ID_MAX 64

#define PST_CPU_MASK_WORDS 16 /* --compute-cpus: CPUs 0..1023 */
#define PST_MAX_HIDDEN 16     /* --hidden: most hidden layers */
#define PST_SEND_WINDOW_AUTO SIZE_MAX /* --send-window auto: the trainer picks (remote.h) */
#define PST_SEND_AHEAD_AUTO (-1)      /* --send-ahead auto: the trainer picks (remote.h) */
/* --dataset kjv's text (scripts/deps.sh writes it from Debian's bible-kjv) */
#define PST_KJV_PATH "/usr/local/share/pstrain/kjv.txt"

typedef enum pst_role { PST_ROLE_TRAINER = 0, PST_ROLE_PSERVER } pst_role;
typedef enum pst_mode { PST_MODE_SYNC = 0, PST_MODE_ASYNC } pst_mode;
typedef enum pst_progress { PST_PROGRESS_AUTO = 0, PST_PROGRESS_BAR, PST_PROGRESS_LINES,
                            PST_PROGRESS_NONE } pst_progress;

/* --bf16-gemm: a bf16 trainer's linear GEMMs in bf16 (common/nn/gemm_bf16.h) never, always,
 * or where the CPU has AVX512_BF16. */
enum { PST_BF16_GEMM_OFF = 0, PST_BF16_GEMM_ON = 1, PST_BF16_GEMM_AUTO = 2 };

/* --gemm: the library of the CPU devices' fp32 GEMMs (common/nn/gemm.h); auto picks by the
 * CPU's features (trainer/blas_core.h). */
enum { PST_GEMM_AUTO = 0, PST_GEMM_OPENBLAS = 1, PST_GEMM_ONEDNN = 2 };

/* --resume: start from the newest complete checkpoint when there is one (auto), never, or
 * fail when there is none (require). */
enum { PST_RESUME_AUTO = 0, PST_RESUME_NEVER, PST_RESUME_REQUIRE };
/* --on-failure: when a peer is lost, exit (fail) or roll back to the newest complete
 * checkpoint and go on once it is back (wait). */
enum { PST_ON_FAILURE_FAIL = 0, PST_ON_FAILURE_WAIT };

/* Pipeline schedules (--schedule). */
typedef enum pst_schedule {
    PST_SCHEDULE_GPIPE = 0,   /* every forward, then every backward */
    PST_SCHEDULE_1F1B,        /* one forward, one backward (PipeDream-flush) */
    PST_SCHEDULE_INTERLEAVED  /* 1F1B over V model chunks per device (Megatron) */
} pst_schedule;
const char *pst_schedule_name(pst_schedule s);
#define PST_MAX_CHUNKS 256 /* pipeline stages x virtual stages */

typedef struct pst_config {
    /* cluster */
    pst_role role;
    int num_pservers;                              /* 0: the trainer trains alone */
    char pservers[PST_MAX_PSERVERS][PST_ADDR_MAX]; /* host:port each */
    int trainers;                                  /* T */
    int trainer_id;                                /* 0..T-1 */
    int chain_len;                                 /* 0: no chain; else T (trainer/chain.h) */
    char chain[PST_MAX_CHAIN][PST_ADDR_MAX];       /* each trainer's relay, host:port */
    int pserver_id;                                /* index into pservers, -1 if unset */
    int port;                                      /* pserver listen port, -1 if unset */
    char bind_host[PST_ADDR_MAX];                  /* pserver listen address */
    pst_mode mode;
    size_t block_bytes;
    size_t send_window;                            /* push bytes in flight per trainer (all its
                                                    * pservers), 0: any, PST_SEND_WINDOW_AUTO */
    int send_ahead;                                /* blocks a push may start past the lowest
                                                    * block not yet pulled (sync), 0: any,
                                                    * PST_SEND_AHEAD_AUTO */
    char devices[64];                              /* "cpu:N" */
    size_t device_memory_limit;                    /* bytes per local device, 0: any */
    long rpc_timeout_ms;                           /* deadline of one RPC */
    long connect_timeout_ms;                       /* how long UNAVAILABLE is retried */
    int server_threads;                            /* pserver completion-queue threads */
    /* model and data */
    char model[16];                                /* mlp | gpt | dlrm | synthetic */
    int nhidden;                                   /* --hidden: hidden layers of the mlp */
    int hidden[PST_MAX_HIDDEN];                    /* their widths */
    long params;                                   /* synthetic model size */
    int layers, heads, embd, ctx;                  /* gpt: blocks, heads, channels, context */
    int sparse_dim;                                /* dlrm: values per embedding row */
    int sparse_admit_count;                        /* dlrm: the push that makes a row */
    long sparse_evict_after;                       /* dlrm: steps unseen before a row goes */
    long sparse_max_rows;                          /* dlrm: rows at most (0: no limit) */
    int val_windows;                               /* text: validation windows evaluated */
    int sample;                                    /* gpt: characters generated at the end */
    float temperature;                             /* of that sampling */
    char dataset[32];                              /* fashion-mnist | mnist | text | kjv | ctr */
    char data_dir[PST_PATH_MAX];
    int epochs;
    long steps;                                    /* stop after this many steps (0: epochs) */
    int batch;                                     /* GLOBAL batch */
    uint64_t seed;
    pst_optim_config optim;
    /* precision */
    pst_dtype precision;                           /* the trainer's parameters: f32, bf16, f16 */
    pst_dtype grad_dtype;                          /* pushed gradients (default: precision) */
    int bf16_gemm;                                 /* PST_BF16_GEMM_*: --bf16-gemm */
    int gemm;                                      /* PST_GEMM_*: --gemm */
    int grad_dtype_set;                            /* --grad-dtype given */
    int acc_steps;                                 /* micro-batches per optimizer step */
    /* checkpoints (common/checkpoint.h, pserver/shard.h) */
    char checkpoint_dir[PST_PATH_MAX];             /* "": none */
    /* token authentication (rpc/auth.h): every call carries it, the pserver refuses others */
    char token[PST_TOKEN_MAX + 1];                 /* "": none (PSTRAIN_TOKEN, or read from
                                                    * token_file at load, trimmed) */
    char token_file[PST_PATH_MAX];
    char job_id[PST_JOB_ID_MAX + 1];               /* --job-id ("": derived, tr_job_id) */
    char trainer_tokens_file[PST_PATH_MAX];        /* pserver: "id:token" lines (one identity
                                                    * per trainer; pst_trainer_tokens_load) */
    /* TLS (rpc/transport.h): files, "" when not set */
    char tls_cert[PST_PATH_MAX], tls_key[PST_PATH_MAX];           /* pserver */
    char tls_ca[PST_PATH_MAX];                                    /* both */
    char tls_client_cert[PST_PATH_MAX], tls_client_key[PST_PATH_MAX]; /* trainer */
    long checkpoint_every;                         /* steps between checkpoints (0: never) */
    int checkpoint_keep;                           /* the newest kept */
    int resume;                                    /* PST_RESUME_* */
    long peer_timeout_ms;                          /* pserver: a trainer whose connection
                                                    * answers no keepalive ping for this
                                                    * long is gone */
    int on_failure;                                /* PST_ON_FAILURE_* */
    int shm;                                       /* 1: sync payloads through shared
                                                    * memory on one host (rpc/shm.h) */
    /* pserver limits (each refusal names its limit; the pserver keeps serving) */
    long max_params;                               /* parameters held (Init refused above) */
    size_t max_memory;                             /* bytes an Init may make the store hold
                                                    * (0: half the machine's, at start) */
    int max_calls;                                 /* calls alive at once */
    long max_wait_ms;                              /* longest a call waits unanswered */
    long recovery_timeout_ms;                      /* --on-failure wait: give up after this
                                                    * long without the job going on */
    /* pipeline parallelism inside the trainer (trainer/pipe_sched.h, exec.h) */
    int pipeline;                                  /* stages P (1: none) */
    int micro_batches;                             /* M: micro-batches per step, pipelined */
    pst_schedule schedule;                         /* gpipe | 1f1b | interleaved */
    int virtual_stages;                            /* V: model chunks per device (interleaved) */
    int partition[PST_MAX_CHUNKS];                 /* layers per model chunk, by hand (npartition
                                                    * 0: balanced by compute) */
    int npartition;
    float loss_scale;                              /* fp16: initial dynamic loss scale */
    long loss_scale_window;                        /* fp16: steps without overflow before
                                                    * the scale doubles */
    /* output */
    char metrics_path[PST_PATH_MAX];
    int metrics_port;                              /* /metrics (common/prom.h); -1: off */
    pst_log_level log_level;
    pst_progress progress;
    int overlap;                                   /* 1: communication overlaps compute */
    int cpu_replicas;                              /* 1: each CPU device its own parameter copy */
    char trace_path[PST_PATH_MAX];                 /* Chrome trace file, "" = none */
    char save_params_path[PST_PATH_MAX];           /* final parameters, raw f32; "" = none */
    long trace_first, trace_last;                  /* steps traced (inclusive) */
    int threads;                                   /* compute threads, shared by the CPU
                                                    * devices; 0 = one per core */
    char compute_cpus[128];                        /* CPU list the compute threads are pinned
                                                    * to ("0", "0-3,8"), "" = not pinned */
    uint64_t compute_cpu_mask[PST_CPU_MASK_WORDS]; /* the same list as bits: CPU c is bit
                                                    * c % 64 of word c / 64 */
    int check_config;                              /* print the resolved config and exit */
    int help;
    int config_reference;                          /* print the settings as Markdown, exit */
} pst_config;

typedef const char *(*pst_getenv_fn)(const char *name);

void pst_config_defaults(pst_config *cfg);
/* Fills cfg from defaults, then the environment (through `getenv_fn`, normally getenv),
 * then argv[1..argc) ("--name value" or "--name=value"), then checks the whole
 * (e.g. trainer_id < trainers). `role` is the program's role; TRAINING_ROLE/PSTRAIN_ROLE,
 * when set, must agree with it. */
pst_status pst_config_load(pst_config *cfg, pst_role role, int argc, char **argv,
                           pst_getenv_fn getenv_fn);
/* A program's start: pst_config_load from argv and the process environment, then what
 * needs no job (--help, --config-reference, --check-config) printed to stdout. Returns -1
 * when the program goes on with cfg, else its exit status: 0 after printing, 2 after a
 * bad setting (one line "PROG: <detail>" on stderr). */
int pst_config_main(pst_config *cfg, pst_role role, const char *prog, int argc, char **argv);
/* --help text: every flag with its environment variable, example and meaning. */
void pst_config_print_help(FILE *out, pst_role role, const char *prog);
/* The topic (an index into the help's list of topics) of the option --flag, or -1. */
int pst_config_topic_of(const char *flag);
/* The number of options in no topic plus topic words that name no option, listed in out. */
int pst_config_unlisted_options(char *out, size_t size);
/* The resolved configuration as one JSON object on one line. */
void pst_config_print(FILE *out, const pst_config *cfg);
/* Every setting of both programs as docs/configuration.md holds it (Markdown: flag,
 * variable, Paddle's names, program, default, range, meaning), from the option table:
 * `trainer --config-reference > docs/configuration.md` (make docs) writes it, and the
 * suite checks that the file and the table agree. */
void pst_config_print_reference(FILE *out);

/* Whether s is a job id (--job-id, an Init's job_id): 1 to PST_JOB_ID_MAX letters, digits,
 * '.', '_' or '-', not starting with '.': a directory name, never a path. */
int pst_job_id_valid(const char *s);

/* A pserver's --trainer-tokens file: one "id:token" line per trainer (blank lines and
 * lines starting with # skipped; whitespace around the token ignored), ids 0..4095 once
 * each, tokens as --token's (printable ASCII without spaces, at most PST_TOKEN_MAX bytes)
 * and all different. *tokens (n entries, indexed by trainer id, NULL where none) is freed
 * with pst_trainer_tokens_free. Errors: PST_ERR_INVALID naming the file, line and what a
 * good line looks like. */
pst_status pst_trainer_tokens_load(const char *path, char ***tokens, int *n);
void pst_trainer_tokens_free(char **tokens, int n);
/* 1 when cfg->dataset is a text data set (text, kjv: bytes are tokens), 0 for images. */
int pst_config_text_data(const pst_config *cfg);
const char *pst_role_name(pst_role r);
const char *pst_mode_name(pst_mode m);

#endif /* PST_CONFIG_H */
