/* test_pipe_sched.c — the pipeline schedules as data (trainer/pipe_sched.c), on the lists
 * alone, for every P <= 8, M <= 64 and V <= 4 where the kind allows them:
 *   - each stage runs the forward and the backward of every (micro-batch, chunk) of its
 *     chunks exactly once, the backward after the forward, and each chunk's backwards in
 *     ascending micro-batch order (so gradients add in one order whatever the schedule);
 *   - every send has its receive on the neighbour chunk's stage, and the run in unit time
 *     (sends never wait, receives do) never deadlocks, M < P included;
 *   - slots: a forward takes one no live micro-batch holds, below peak_in_flight, and the
 *     peak is min(P - s, M) for 1F1B, M for GPipe, min(M V, 2 (P - s - 1) + (V - 1) P + 1)
 *     interleaved;
 *   - makespan in unit slots: 2 (M + P - 1) for GPipe and 1F1B (forward = backward = 1),
 *     bubble (P - 1) / M; interleaved with a chunk's forward and backward 1 / V each,
 *     bubble (P - 1) / (V M);
 *   - messages: 2 (P V - 1) M per step;
 *   - invalid combinations get one line naming them. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/pipe_sched.h"

static int imin(int a, int b)
{
    return a < b ? a : b;
}

/* Checks one schedule; returns its simulation. */
static tr_psched_sim check(pst_schedule kind, int P, int M, int V)
{
    tr_psched s;
    cr_assert_eq(tr_psched_build(&s, kind, P, M, V), PST_OK, "%s P %d M %d V %d: %s",
                 pst_schedule_name(kind), P, M, V, pst_error_detail());
    const int C = P * V;
    const size_t n = (size_t)M * (size_t)C;
    int *fwd = calloc(n, sizeof(int)), *bwd = calloc(n, sizeof(int));
    int *sa = calloc(n, sizeof(int)), *ra = calloc(n, sizeof(int));
    int *sg = calloc(n, sizeof(int)), *rg = calloc(n, sizeof(int));
    int *holder = malloc(sizeof(int) * (size_t)M * (size_t)V + 1);
    int *last_b = malloc(sizeof(int) * (size_t)C);
    for (int st = 0; st < P; st++) {
        for (int j = 0; j < M * V; j++)
            holder[j] = -1;
        for (int k = 0; k < C; k++)
            last_b[k] = -1;
        int live = 0, peak = 0;
        for (int i = 0; i < s.count[st]; i++) {
            const tr_psched_instr *in = &s.list[st][i];
            cr_assert(in->micro >= 0 && in->micro < M && in->chunk >= 0 && in->chunk < C);
            cr_assert_eq(in->chunk % P, st, "chunk %d on stage %d", in->chunk, st);
            const size_t at = (size_t)in->micro * (size_t)C + (size_t)in->chunk;
            switch (in->op) {
            case TR_PSCHED_FORWARD:
                cr_assert(in->slot >= 0 && in->slot < s.peak_in_flight[st]);
                cr_assert_eq(holder[in->slot], -1, "slot %d taken twice", in->slot);
                holder[in->slot] = (int)at;
                fwd[at]++;
                live++;
                peak = live > peak ? live : peak;
                break;
            case TR_PSCHED_BACKWARD:
                cr_assert_eq(fwd[at], 1, "backward before forward");
                cr_assert_eq(holder[in->slot], (int)at, "backward in another slot");
                holder[in->slot] = -1;
                live--;
                bwd[at]++;
                cr_assert_lt(last_b[in->chunk], in->micro, "chunk %d: backwards out of order",
                             in->chunk);
                last_b[in->chunk] = in->micro;
                break;
            case TR_PSCHED_SEND_ACT: sa[at]++; break;
            case TR_PSCHED_RECV_ACT: ra[at]++; break;
            case TR_PSCHED_SEND_GRAD: sg[at]++; break;
            case TR_PSCHED_RECV_GRAD: rg[at]++; break;
            }
        }
        cr_assert_eq(live, 0);
        cr_assert_eq(peak, s.peak_in_flight[st]);
        int want = kind == PST_SCHEDULE_GPIPE ? M
                   : kind == PST_SCHEDULE_1F1B ? imin(P - st, M)
                                               : imin(M * V, 2 * (P - st - 1) + (V - 1) * P + 1);
        cr_assert_eq(peak, want, "%s P %d M %d V %d stage %d: peak %d, want %d",
                     pst_schedule_name(kind), P, M, V, st, peak, want);
    }
    for (int m = 0; m < M; m++)
        for (int k = 0; k < C; k++) {
            const size_t at = (size_t)m * (size_t)C + (size_t)k;
            cr_assert(fwd[at] == 1 && bwd[at] == 1, "m %d chunk %d: %d forwards, %d backwards",
                      m, k, fwd[at], bwd[at]);
            cr_assert_eq(sa[at], k < C - 1, "activation sends of m %d chunk %d", m, k);
            cr_assert_eq(ra[at], k > 0);
            cr_assert_eq(sg[at], k > 0);
            cr_assert_eq(rg[at], k < C - 1);
        }
    tr_psched_sim sim;
    const double f = kind == PST_SCHEDULE_INTERLEAVED ? 1.0 / V : 1.0;
    cr_assert_eq(tr_psched_simulate(&s, f, f, &sim), PST_OK);
    cr_assert(!sim.deadlock, "%s P %d M %d V %d: deadlock at stage %d instruction %d",
              pst_schedule_name(kind), P, M, V, sim.stuck_stage, sim.stuck_at);
    cr_assert_eq(sim.messages, 2L * (C - 1) * M);
    free(fwd);
    free(bwd);
    free(sa);
    free(ra);
    free(sg);
    free(rg);
    free(holder);
    free(last_b);
    tr_psched_free(&s);
    return sim;
}

Test(pipe_sched, gpipe_and_1f1b_over_the_grid)
{
    for (int P = 1; P <= 8; P++)
        for (int M = 1; M <= 64; M++)
            for (int q = 0; q < 2; q++) {
                const pst_schedule kind = q ? PST_SCHEDULE_1F1B : PST_SCHEDULE_GPIPE;
                tr_psched_sim sim = check(kind, P, M, 1);
                cr_assert_float_eq(sim.makespan, 2.0 * (M + P - 1), 1e-9,
                                   "%s P %d M %d: makespan %g", pst_schedule_name(kind), P, M,
                                   sim.makespan);
                cr_assert_float_eq(sim.bubble, (double)(P - 1) / M, 1e-9);
            }
}

Test(pipe_sched, interleaved_over_the_grid)
{
    for (int P = 2; P <= 8; P++)
        for (int V = 2; V <= 4; V++)
            for (int M = P; M <= 64; M += P) {
                tr_psched_sim sim = check(PST_SCHEDULE_INTERLEAVED, P, M, V);
                cr_assert_float_eq(sim.bubble, (double)(P - 1) / ((double)V * M), 1e-9,
                                   "P %d V %d M %d: bubble %g, want %g (makespan %g)", P, V, M,
                                   sim.bubble, (double)(P - 1) / ((double)V * M),
                                   sim.makespan);
            }
}

Test(pipe_sched, invalid_combinations_name_the_problem)
{
    const struct {
        pst_schedule kind;
        int P, M, V;
        const char *says;
    } bad[] = {
        {PST_SCHEDULE_INTERLEAVED, 4, 6, 2, "multiple of --pipeline (4), got 6"},
        {PST_SCHEDULE_INTERLEAVED, 2, 4, 1, "--virtual-stages >= 2"},
        {PST_SCHEDULE_INTERLEAVED, 1, 4, 2, "--pipeline >= 2"},
        {PST_SCHEDULE_1F1B, 2, 4, 2, "needs --schedule interleaved"},
        {PST_SCHEDULE_GPIPE, 2, 0, 1, "at least 1"},
        {PST_SCHEDULE_GPIPE, 0, 4, 1, "at least 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tr_psched s;
        cr_assert_eq(tr_psched_build(&s, bad[i].kind, bad[i].P, bad[i].M, bad[i].V),
                     PST_ERR_INVALID, "case %zu", i);
        cr_assert(strstr(pst_error_detail(), bad[i].says), "case %zu: %s", i,
                  pst_error_detail());
        cr_assert(!strchr(pst_error_detail(), '\n'));
        cr_assert_null(s.list);
    }
}

/* A list a person can read: the 1F1B list of the first of 2 stages, 3 micro-batches. */
Test(pipe_sched, lists_read_as_expected)
{
    tr_psched s;
    cr_assert_eq(tr_psched_build(&s, PST_SCHEDULE_1F1B, 2, 3, 1), PST_OK);
    char got[256] = "", buf[32];
    for (int i = 0; i < s.count[0]; i++) {
        strcat(got, tr_psched_describe(&s.list[0][i], buf, sizeof buf));
        strcat(got, i + 1 < s.count[0] ? ", " : "");
    }
    cr_assert_str_eq(got, "F m0 c0, SA m0 c0, F m1 c0, SA m1 c0, RG m0 c0, B m0 c0, "
                          "F m2 c0, SA m2 c0, RG m1 c0, B m1 c0, RG m2 c0, B m2 c0");
    tr_psched_free(&s);
}
