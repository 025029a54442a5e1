/* tables.h — a pserver's sparse tables on the wire (issue 31): the meaning of PullSparse and
 * PushSparse (rpc/pstrain.proto) on the tables of sparse.h that trainer 0's Init lists.
 *
 * Each pserver holds its shard of every table: the keys k with
 * pst_sparse_pserver_of(k, shards) == shard; a key of another shard is refused.
 * - Sync. Every trainer pushes every table once a step (no keys too). A table's version is
 *   the steps applied to it. A push of step `version` is checked and kept; once every
 *   trainer's is in, their rows are added in trainer order (pst_rows_merge: the first
 *   trainer that has a key copied, the next ones added), each key's sum is applied once at
 *   that step (pst_sparse_push, keys ascending), and the version moves on. A pull of step s
 *   is answered once the version is s (parked until then, on the table: the push that
 *   completes the step answers it), with the rows as of step s. So T trainers of one
 *   device each give the bits of one process on T devices (trainer/ctr.c sums each
 *   device's rows the same way).
 * - Async. A push is applied at once at its step; a pull is answered at once.
 * Bad input is refused with a status and a detail, and nothing of it is kept or applied:
 * an unknown table (PST_ERR_NOT_FOUND), a dtype other than F32 or BF16, counts that
 * disagree with the payload, more than PST_SPARSE_MAX_KEYS keys (PST_ERR_LIMIT), keys not
 * unique and ascending or of another shard, a row that is NaN or infinite
 * (PST_ERR_INVALID), rows of more than PS_TABLES_MAX_CALL_BYTES (PST_ERR_LIMIT), a push of
 * a step ahead of the table's, a pull of a step past the next (PST_ERR_STATE). In sync mode
 * a repeated push (a retry) is answered `duplicate` and counted once; in async mode every
 * push that arrives is applied, a retry too. A table checkpoint that cannot be written stops
 * the table: its later calls fail with the reason.
 * Not for: the dense blocks (store.h), Init's other checks (service.c), async checkpoints
 * of the tables (not built: sync mode only). */
#ifndef PS_TABLES_H
#define PS_TABLES_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "pserver/sparse.h"
#include "rpc/server.h"

struct Pstrain__InitRequest;
typedef struct ps_tables ps_tables;

/* The tables of trainer 0's Init (none is fine): each spec checked (pst_sparse_check),
 * shard < shards. sync: the mode. ckpt_dir non-empty (sync, the Init's checkpoint_every >
 * 0): table i's checkpoints go to ckpt_dir/table-<i> (sparse_ckpt.h: full and delta files,
 * `keep` kept) when a step that is a multiple of checkpoint_every has been applied, before
 * the pulls of that step are answered. Errors: PST_ERR_INVALID naming the table and
 * setting, PST_ERR_LIMIT (more than PS_TABLES_MAX), PST_ERR_NOMEM. */
#define PS_TABLES_MAX 64
/* The rows of one call at most, in f32 (a trainer sends its keys in calls under it). */
#define PS_TABLES_MAX_CALL_BYTES (256u << 20)
pst_status ps_tables_init(ps_tables **out, const struct Pstrain__InitRequest *req, int sync,
                          const char *ckpt_dir, int keep);
/* The job resumes at `step` (the dense shard's): each table loaded from its checkpoint of
 * that step, its version set to it. Errors: those of pst_sparse_ckpt_load, wrapped with the
 * table's name. */
pst_status ps_tables_resume(ps_tables *t, int64_t step);
/* Whether a joining trainer's Init lists the same tables and shards (PST_ERR_MISMATCH). */
pst_status ps_tables_check_join(const ps_tables *t, const struct Pstrain__InitRequest *req);
/* Handlers: answer the call now, or park it (a sync pull of a step not applied yet). */
void ps_tables_pull(ps_tables *t, rpc_call *call);
void ps_tables_push(ps_tables *t, rpc_call *call);
/* A parked pull whose client gave up: withdrawn and failed now (the server's on_cancel). */
void ps_tables_cancelled(ps_tables *t, rpc_call *call);
/* Fails every parked pull with st and why (shutdown, a trainer left the job), and every
 * later call of the tables with the same: the job cannot go on. */
void ps_tables_fail_waiting(ps_tables *t, pst_status st, const char *why);
/* The largest request body of PullSparse or PushSparse (0 for other methods). */
size_t ps_tables_max_request(const ps_tables *t, rpc_method m);
int ps_tables_count(const ps_tables *t);

/* Totals over the tables (pst_sparse_stats), and the keys pulled and pushed here; with_hash:
 * their hash too (a pass over every row; else 0). */
typedef struct ps_tables_totals {
    size_t rows, bytes;
    uint64_t created, evicted, refused;
    uint64_t keys_pulled, keys_pushed;
    uint64_t hash;  /* the sum of the tables' pst_sparse_hash */
} ps_tables_totals;
void ps_tables_totals_of(ps_tables *t, ps_tables_totals *out, int with_hash);
/* Table i itself (for checkpoints and tests); NULL past the count. */
pst_sparse_table *ps_tables_table(ps_tables *t, int i);
/* After the server is shut down (no call left); accepts NULL. */
void ps_tables_free(ps_tables *t);

#endif /* PS_TABLES_H */
