/* pipe_sched.c — pipeline schedules as data (see pipe_sched.h).
 *
 * DESIGN: each kind first orders a stage's compute, as (forward or backward, m, chunk)
 * pairs; one expansion then adds the receive before and the send after each compute that
 * has a neighbour chunk, and gives each forward the lowest free slot. */
#include "trainer/pipe_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/memory.h"

typedef struct compute {
    int backward, micro, chunk;
} compute;

/* Megatron-LM's interleaved order: the device's k-th forward (or backward) of its M x V. */
static compute interleaved_at(int k, int backward, int s, int P, int V)
{
    const int group = k / (P * V), in_group = k % (P * V);
    int c = in_group / P;
    if (backward)
        c = V - 1 - c;
    return (compute){backward, group * P + k % P, c * P + s};
}

/* Stage s's compute order into out (2 M V entries). */
static void order(pst_schedule kind, int s, int P, int M, int V, compute *out)
{
    int n = 0;
    if (kind == PST_SCHEDULE_GPIPE) {
        for (int m = 0; m < M; m++)
            out[n++] = (compute){0, m, s};
        for (int m = 0; m < M; m++)
            out[n++] = (compute){1, m, s};
        return;
    }
    if (kind == PST_SCHEDULE_1F1B) {
        const int warm = P - s - 1 < M ? P - s - 1 : M, rest = M - warm;
        for (int m = 0; m < warm; m++)
            out[n++] = (compute){0, m, s};
        for (int i = 0; i < rest; i++) {
            out[n++] = (compute){0, warm + i, s};
            out[n++] = (compute){1, i, s};
        }
        for (int m = rest; m < M; m++)
            out[n++] = (compute){1, m, s};
        return;
    }
    const int total = M * V;
    /* Megatron also warms up with every forward when M == P (its sends and receives pair
     * up synchronously); with sends that never wait the formula holds there too. */
    int warm = (P - s - 1) * 2 + (V - 1) * P;
    warm = warm < total ? warm : total;
    const int rest = total - warm;
    for (int k = 0; k < warm; k++)
        out[n++] = interleaved_at(k, 0, s, P, V);
    for (int k = 0; k < rest; k++) {
        out[n++] = interleaved_at(warm + k, 0, s, P, V);
        out[n++] = interleaved_at(k, 1, s, P, V);
    }
    for (int k = rest; k < total; k++)
        out[n++] = interleaved_at(k, 1, s, P, V);
}

pst_status tr_psched_build(tr_psched *s, pst_schedule kind, int P, int M, int V)
{
    memset(s, 0, sizeof *s);
    const char *name = pst_schedule_name(kind);
    if (P < 1 || M < 1 || V < 1)
        return pst_error_set(PST_ERR_INVALID, "pipeline: %d stages, %d micro-batches, %d "
                             "virtual stages: each must be at least 1 (example: --pipeline 2 "
                             "--micro-batches 8)", P, M, V);
    if (kind != PST_SCHEDULE_INTERLEAVED && V != 1)
        return pst_error_set(PST_ERR_INVALID, "--virtual-stages %d needs --schedule "
                             "interleaved, not %s (example: --schedule interleaved "
                             "--virtual-stages 2)", V, name);
    if (kind == PST_SCHEDULE_INTERLEAVED && (V < 2 || P < 2))
        return pst_error_set(PST_ERR_INVALID, "--schedule interleaved needs --virtual-stages "
                             ">= 2 and --pipeline >= 2, got %d and %d (example: --pipeline 2 "
                             "--virtual-stages 2)", V, P);
    if (kind == PST_SCHEDULE_INTERLEAVED && M % P)
        return pst_error_set(PST_ERR_INVALID, "--schedule interleaved needs --micro-batches "
                             "a multiple of --pipeline (%d), got %d (example: "
                             "--micro-batches %d)", P, M, (M / P + 1) * P);
    const int C = P * V;
    s->kind = kind;
    s->stages = P;
    s->micro = M;
    s->virt = V;
    s->count = calloc((size_t)P, sizeof *s->count);
    s->list = calloc((size_t)P, sizeof *s->list);
    s->peak_in_flight = calloc((size_t)P, sizeof *s->peak_in_flight);
    compute *ord = malloc(sizeof *ord * 2 * (size_t)M * (size_t)V);
    int *slot_of = malloc(sizeof(int) * (size_t)M * (size_t)C);
    unsigned char *used = calloc((size_t)M * (size_t)V + 1, 1);
    if (!s->count || !s->list || !s->peak_in_flight || !ord || !slot_of || !used)
        goto nomem;
    for (int st = 0; st < P; st++) {
        order(kind, st, P, M, V, ord);
        tr_psched_instr *l = malloc(sizeof *l * 6 * (size_t)M * (size_t)V);
        if (!(s->list[st] = l))
            goto nomem;
        memset(used, 0, (size_t)M * (size_t)V + 1);
        int n = 0, live = 0;
        for (int i = 0; i < 2 * M * V; i++) {
            const compute c = ord[i];
            const size_t at = (size_t)c.micro * (size_t)C + (size_t)c.chunk;
            if (!c.backward) {
                int j = 0;
                while (used[j])
                    j++;
                used[j] = 1;
                slot_of[at] = j;
                if (++live > s->peak_in_flight[st])
                    s->peak_in_flight[st] = live;
                if (c.chunk > 0)
                    l[n++] = (tr_psched_instr){TR_PSCHED_RECV_ACT, c.micro, c.chunk, -1};
                l[n++] = (tr_psched_instr){TR_PSCHED_FORWARD, c.micro, c.chunk, j};
                if (c.chunk < C - 1)
                    l[n++] = (tr_psched_instr){TR_PSCHED_SEND_ACT, c.micro, c.chunk, -1};
            } else {
                const int j = slot_of[at];
                used[j] = 0;
                live--;
                if (c.chunk < C - 1)
                    l[n++] = (tr_psched_instr){TR_PSCHED_RECV_GRAD, c.micro, c.chunk, -1};
                l[n++] = (tr_psched_instr){TR_PSCHED_BACKWARD, c.micro, c.chunk, j};
                if (c.chunk > 0)
                    l[n++] = (tr_psched_instr){TR_PSCHED_SEND_GRAD, c.micro, c.chunk, -1};
            }
        }
        s->count[st] = n;
    }
    PST_FREE_ALL(ord, slot_of, used);
    return PST_OK;
nomem:
    PST_FREE_ALL(ord, slot_of, used);
    tr_psched_free(s);
    return pst_error_set(PST_ERR_NOMEM, "pipeline: out of memory for the schedule");
}

void tr_psched_free(tr_psched *s)
{
    for (int i = 0; s->list && i < s->stages; i++)
        free(s->list[i]);
    PST_FREE_ALL(s->list, s->count, s->peak_in_flight);
    memset(s, 0, sizeof *s);
}

pst_status tr_psched_simulate(const tr_psched *s, double f, double b, tr_psched_sim *out)
{
    memset(out, 0, sizeof *out);
    const int P = s->stages, C = P * s->virt;
    const size_t n = (size_t)s->micro * (size_t)C;
    double *act = malloc(sizeof(double) * n), *grad = malloc(sizeof(double) * n);
    double *t = calloc((size_t)P, sizeof(double)), *busy = calloc((size_t)P, sizeof(double));
    int *pos = calloc((size_t)P, sizeof(int));
    if (!act || !grad || !t || !busy || !pos) {
        PST_FREE_ALL(act, grad, t, busy, pos);
        return pst_error_set(PST_ERR_NOMEM, "pipeline: out of memory for the simulation");
    }
    for (size_t i = 0; i < n; i++)
        act[i] = grad[i] = -1.0;
    for (int left = 1; left;) {
        int moved = 0;
        left = 0;
        for (int st = 0; st < P; st++) {
            for (; pos[st] < s->count[st]; pos[st]++) {
                const tr_psched_instr *in = &s->list[st][pos[st]];
                const size_t at = (size_t)in->micro * (size_t)C + (size_t)in->chunk;
                if (in->op == TR_PSCHED_RECV_ACT) {
                    if (act[at - 1] < 0.0)
                        break;
                    t[st] = act[at - 1] > t[st] ? act[at - 1] : t[st];
                } else if (in->op == TR_PSCHED_RECV_GRAD) {
                    if (grad[at] < 0.0)
                        break;
                    t[st] = grad[at] > t[st] ? grad[at] : t[st];
                } else if (in->op == TR_PSCHED_FORWARD) {
                    t[st] += f;
                    busy[st] += f;
                } else if (in->op == TR_PSCHED_BACKWARD) {
                    t[st] += b;
                    busy[st] += b;
                } else if (in->op == TR_PSCHED_SEND_ACT) {
                    act[at] = t[st];
                    out->messages++;
                } else {
                    grad[at - 1] = t[st];
                    out->messages++;
                }
                moved = 1;
            }
            if (pos[st] < s->count[st])
                left = 1;
        }
        if (left && !moved) {
            out->deadlock = 1;
            for (int st = 0; st < P; st++)
                if (pos[st] < s->count[st]) {
                    out->stuck_stage = st;
                    out->stuck_at = pos[st];
                    break;
                }
            break;
        }
    }
    for (int st = 0; st < P; st++) {
        out->makespan = t[st] > out->makespan ? t[st] : out->makespan;
        out->busy = busy[st] > out->busy ? busy[st] : out->busy;
    }
    out->bubble = out->busy > 0.0 ? (out->makespan - out->busy) / out->busy : 0.0;
    PST_FREE_ALL(act, grad, t, busy, pos);
    return PST_OK;
}

const char *tr_psched_describe(const tr_psched_instr *in, char *buf, size_t size)
{
    static const char *const names[] = {"F", "B", "SA", "RA", "SG", "RG"};
    snprintf(buf, size, "%s m%d c%d", names[in->op], in->micro, in->chunk);
    return buf;
}
