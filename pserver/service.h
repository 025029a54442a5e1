/* service.h — the pserver's RPC service: the meaning of Init, Push, Pull and Finish on
 * top of the block store (store.h) and the gRPC server (rpc/server.h).
 *
 * Init: trainer 0's Init creates the store from its block list, optimizer settings and
 * initial values (payload); an Init from another trainer waits for trainer 0's and is then
 * accepted only when its fingerprint (plan + settings) equals trainer 0's, otherwise it
 * fails with PST_ERR_MISMATCH. Trainer 0's precision (F32, or F16/BF16) becomes the store's
 * lowp (store.h: a low-precision copy of every block cast once per update); another
 * trainer whose precision differs gets PST_ERR_INVALID naming both. A repeated Init with the
 * same fingerprint is answered with the current version (a client retry). Push and Pull go
 * to the store; before Init they fail with PST_ERR_STATE. A Pull in the store's lowp dtype
 * is answered from that copy (no cast per pull), one in f32 from the master values, one in
 * any other dtype is cast for that pull. Finish marks a trainer done; once all have finished
 * the service reports done and main() shuts the server down. Every bad request gets an
 * error status; the service keeps serving. With a low-precision copy, one INFO line reports
 * the elements cast when every trainer has finished, or else at ps_service_cancel; a second
 * one the hash of the store's state (ps_store_state_hash) at that point. Vote (fp16 loss
 * scaling, pserver 0 only) answers every trainer's vote for a step with the OR of all of
 * them, once all have voted (see handle_vote). */
#ifndef PS_SERVICE_H
#define PS_SERVICE_H

#include <stdint.h>

#include "common/error.h"
#include "pserver/tables.h"
#include "rpc/server.h"

typedef struct ps_service ps_service;

pst_status ps_service_init(ps_service **out);
/* The rpc_server handler; `arg` is the ps_service. */
void ps_service_handle(void *arg, rpc_call *call);
/* The rpc_server's on_cancel: a Pull whose client gave up is withdrawn from the store and
 * failed at once (nothing is kept for it). */
void ps_service_cancelled(void *arg, rpc_call *call);
/* Blocks until every trainer has finished or `stop` becomes non-zero (checked every
 * 100 ms), a checkpoint failed, or (--on-failure wait) the job departed or no Init came in
 * time (ps_service_on_failure). Returns 1 when the trainers finished, 0 otherwise. */
int ps_service_wait(ps_service *svc, volatile int *stop);
/* The lowest and highest version of this pserver's blocks (both -1: none yet). Async: a
 * block's version is the pushes applied to it. Thread safe. */
void ps_service_versions(ps_service *svc, int64_t *lo, int64_t *hi);
/* This pserver was asked to stop (SIGTERM): trainer 0 is told, through its Watch (now, or
 * when it next opens one), to stop the job at the next step boundary with a checkpoint of
 * that step; the trainers' Finish then ends ps_service_wait as usual. Thread safe. */
void ps_service_request_stop(ps_service *svc);
/* Checkpoints: this pserver's shards go to dir/<job_id>/name (created when missing; the
 * job_id of trainer 0's Init, none: dir/name), the `keep` newest kept; written every N
 * steps when trainer 0's Init asks (sync mode), and loaded when it resumes. Call before
 * serving. */
void ps_service_checkpoints(ps_service *svc, const char *dir, const char *name, int keep);
/* Why the pserver must stop (a checkpoint could not be written, or no trainer 0 came back
 * in time after a rollback), or NULL. */
const char *ps_service_failure(ps_service *svc);
/* --on-failure wait: when a trainer leaves the job early (its Finish says so, its Watch
 * ended, or a second Init shows its process restarted), Inits are answered UNAVAILABLE
 * (the trainers retry) and ps_service_wait returns once every trainer that joined has
 * finished or peer_timeout_ms has passed: main() then starts a new service on the same
 * port, which loads the newest checkpoint at trainer 0's next Init. init_by > 0 (a
 * pst_clock_s() time): without trainer 0's Init by then, ps_service_wait returns and
 * ps_service_failure is `why`. Call before serving. */
void ps_service_on_failure(ps_service *svc, int wait, long peer_timeout_ms, double init_by,
                           const char *why);
/* Limits: an Init that would make this pserver hold more than max_params parameters, or
 * blocks of more than max_memory bytes (ps_store_bytes and the shared values area: the
 * gradient buffers grow with the trainers), is refused before anything is allocated (0:
 * none). Call before serving. */
void ps_service_limits(ps_service *svc, uint64_t max_params, uint64_t max_memory);
/* Same-host payloads (rpc/shm.h): 1 maps the segment a sync trainer offers in its Init,
 * when it can; 0 never does (payloads stay in the calls). Default 1. Call before serving. */
void ps_service_shm(ps_service *svc, int enabled);
/* rpc_server_config.max_request: the largest Init (max_params values and the block list)
 * and Push (the largest block in f32, once trainer 0's Init is in; the header alone
 * before) body accepted; 0 for the others. */
size_t ps_service_max_request(void *arg, rpc_method m, const char **why);
/* Why the job cannot complete (a trainer left early), or NULL. */
const char *ps_service_departed(ps_service *svc);
/* Fails the pulls and inits still waiting (server shutting down). */
void ps_service_cancel(ps_service *svc);
/* Elements cast into the store's low-precision copies by updates (ps_store_cast_count);
 * 0 before trainer 0's Init or without a copy. Thread safe. */
uint64_t ps_service_cast_count(ps_service *svc);

/* What the pserver reports at exit (the log and --metrics). */
typedef struct ps_service_report {
    int initialized;          /* trainer 0's Init made the store; the rest is 0 otherwise */
    const char *precision;    /* the store's low-precision copy: "bf16", "f16" or "f32" */
    uint64_t casts;           /* ps_store_cast_count */
    uint64_t pull_casts;      /* elements cast for single pulls (dtype without a copy) */
    int64_t optimizer_steps;  /* the highest block version */
    uint64_t owned;           /* parameters of this pserver's blocks */
    long skipped_steps;       /* fp16 steps the vote skipped everywhere */
    uint64_t state_hash;      /* ps_store_state_hash: values, optimizer state, versions */
    int sparse_tables;        /* the job's sparse tables (tables.h), and their totals here */
    ps_tables_totals sparse;
} ps_service_report;
void ps_service_get_report(ps_service *svc, ps_service_report *out);
void ps_service_free(ps_service *svc); /* after the server is shut down; accepts NULL */

/* Prometheus (common/prom.h): the counters the service adds to. Registered once by
 * ps_prom_register; they outlive the services (a rollback makes a new one). */
struct pst_prom;
struct pst_prom_metric;
typedef struct ps_prom {
    struct pst_prom_metric *pushes_ok, *pushes_failed, *pulls_ok, *pulls_failed;
    struct pst_prom_metric *received, *sent; /* payload bytes of pushes and pulls */
    struct pst_prom_metric *update;          /* seconds of one block update (histogram) */
} ps_prom;
void ps_prom_register(ps_prom *m, struct pst_prom *r);
void ps_service_prom(ps_service *svc, const ps_prom *m); /* before serving */

/* What a scrape shows of the service now. Thread safe. */
typedef struct ps_service_gauges {
    int initialized;          /* trainer 0's Init made the store */
    uint32_t trainers;        /* the job's */
    uint32_t connected;       /* trainers whose Watch is open */
    uint32_t waited_for;      /* sync: trainers whose push of the first block's next step
                               * has not come */
    int64_t version;          /* the first block's */
    size_t blocks;
    uint64_t params;          /* parameters of this pserver's blocks */
    double checkpoint_age;    /* seconds since the newest checkpoint was written (since the
                               * store was made if none yet); -1: no checkpoints */
    ps_tables_totals sparse;  /* the sparse tables here (hash 0) */
} ps_service_gauges;
void ps_service_gauges_read(ps_service *svc, ps_service_gauges *out);

#endif /* PS_SERVICE_H */
