/* pipe_sched.h — pipeline schedules as data: for P stages (devices), M micro-batches and V
 * model chunks per device, each stage's ordered list of instructions.
 *
 * The model is cut into C = P x V chunks; chunk k runs on stage k % P (with V > 1 a device
 * holds chunks s, s + P, ...: the interleaved schedule's virtual stages). Micro-batch m's
 * activation goes from chunk k to chunk k + 1 (SEND_ACT on k's stage, RECV_ACT on k + 1's)
 * and its gradient back (SEND_GRAD, RECV_GRAD). Every FORWARD takes an activation slot of
 * its stage, which its BACKWARD frees: a stage needs `peak_in_flight` slots, whatever M
 * (1F1B: min(P - s, M); GPipe: M).
 *
 * Kinds:
 *   GPIPE        every forward (m ascending), then every backward (m ascending);
 *   1F1B         PipeDream-flush: min(P - s - 1, M) warm-up forwards, then one forward and
 *                one backward in turn, then the remaining backwards (Megatron-LM's
 *                non-interleaved schedule);
 *   INTERLEAVED  Megatron-LM's interleaved 1F1B over V chunks per device: the M x V
 *                (micro-batch, chunk) pairs of a device in groups of P micro-batches per
 *                chunk, (P - s - 1) x 2 + (V - 1) x P warm-up forwards (at most all
 *                M V), then 1F1B. Needs V >= 2 and M a multiple of P. (Megatron warms up
 *                with all of them when M == P, for its paired sends; ours never wait.)
 * A stage runs the backwards of each of its chunks in ascending m, in every kind: the
 * gradients a device accumulates are added in the same order whatever the schedule.
 *
 * Sends are asynchronous (buffered), receives wait: tr_psched_simulate runs the lists in
 * unit time under that rule and finds deadlocks, the makespan and the bubble.
 * Pure functions; no I/O. Not thread safe per object (build, then share read-only). */
#ifndef TR_PIPE_SCHED_H
#define TR_PIPE_SCHED_H

#include "common/config.h"
#include "common/error.h"

typedef enum tr_psched_op {
    TR_PSCHED_FORWARD = 0, /* forward of (micro, chunk); takes `slot` */
    TR_PSCHED_BACKWARD,    /* backward of (micro, chunk); frees `slot` */
    TR_PSCHED_SEND_ACT,    /* (micro, chunk)'s output to chunk + 1's stage */
    TR_PSCHED_RECV_ACT,    /* (micro, chunk)'s input from chunk - 1's stage */
    TR_PSCHED_SEND_GRAD,   /* (micro, chunk)'s input gradient to chunk - 1's stage */
    TR_PSCHED_RECV_GRAD    /* (micro, chunk)'s output gradient from chunk + 1's stage */
} tr_psched_op;

typedef struct tr_psched_instr {
    tr_psched_op op;
    int micro;   /* 0 .. M-1 */
    int chunk;   /* the model chunk, 0 .. C-1 (its stage is chunk % P) */
    int slot;    /* FORWARD/BACKWARD: the activation slot, 0 .. peak_in_flight-1; else -1 */
} tr_psched_instr;

typedef struct tr_psched {
    pst_schedule kind;
    int stages, micro, virt;    /* P, M, V */
    int *count;                 /* (P) instructions of each stage */
    tr_psched_instr **list;     /* (P) each stage's list, in order */
    int *peak_in_flight;        /* (P) most (micro, chunk) pairs between forward and backward */
} tr_psched;

/* Builds the lists. Errors (one line naming the combination and a good value):
 * PST_ERR_INVALID for P, M or V < 1, V > 1 with another kind than INTERLEAVED,
 * INTERLEAVED with V < 2, P < 2 or M not a multiple of P; PST_ERR_NOMEM. On error *s is
 * zeroed. */
pst_status tr_psched_build(tr_psched *s, pst_schedule kind, int P, int M, int V);
void tr_psched_free(tr_psched *s); /* accepts a zeroed one */

typedef struct tr_psched_sim {
    double makespan;    /* when the last stage is done */
    double busy;        /* the busiest stage's compute time */
    double bubble;      /* (makespan - busy) / busy */
    long messages;      /* sends (activations and gradients) */
    int deadlock;       /* 1: a stage waits for a send that never comes */
    int stuck_stage;    /* deadlock: the first stage that waits, and at which instruction */
    int stuck_at;
} tr_psched_sim;

/* Runs the lists: a FORWARD costs `f` per chunk, a BACKWARD `b`; a send costs nothing
 * and never waits; a receive waits for its send. Errors: PST_ERR_NOMEM. A deadlock is a
 * result (out->deadlock), not an error. */
pst_status tr_psched_simulate(const tr_psched *s, double f, double b, tr_psched_sim *out);

/* "F m3 c1", "RA m0 c2", ... into buf (at least 24 bytes). */
const char *tr_psched_describe(const tr_psched_instr *in, char *buf, size_t size);

#endif /* TR_PIPE_SCHED_H */
