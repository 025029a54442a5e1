/* summary.c — the trainer's summary line (see train.h): what tr_train and the click
 * model's loop (ctr.c) report at the end of a run. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/hash.h"
#include "common/nn/gemm.h"
#include "trainer/train.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tr_median(double *v, long n)
{
    if (n <= 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void tr_summary_params(tr_summary *sum, const float *params, size_t n)
{
    double l2 = 0.0;
    for (size_t i = 0; i < n; i++)
        l2 += (double)params[i] * (double)params[i];
    sum->params = n;
    sum->param_l2 = sqrt(l2);
    sum->param_hash = pst_fnv1a(PST_FNV1A_INIT, params, n * sizeof(float));
}

void tr_summary_print(FILE *out, const tr_summary *s)
{
    fprintf(out,
            "{\"event\":\"summary\",\"test_acc\":%.4f,\"train_loss\":%.6f,"
            "\"samples_per_s\":%.1f,\"step_ms_median\":%.3f,\"steps\":%ld,\"params\":%zu,"
            "\"param_l2\":%.9g,\"param_hash\":\"%016" PRIx64 "\"",
            s->test_acc, s->train_loss, s->samples_per_s, s->step_ms_median, s->steps,
            s->params, s->param_l2, s->param_hash);
    /* Per local device (a pipeline's stage), tr_exec_memory's fields. */
    static const char *const names[4] = {"peak", "param", "grad", "activation"};
    for (int f = 0; f < 4; f++) {
        fprintf(out, ",\"%s_bytes_per_device\":[", names[f]);
        for (int i = 0; i < s->ndevices; i++) {
            const tr_exec_memory *m = &s->memory[i];
            const size_t v[4] = {m->peak, m->params, m->grads, m->acts};
            fprintf(out, "%s%zu", i ? "," : "", v[f]);
        }
        fputs("]", out);
    }
    fprintf(out, ",\"precision\":\"%s\",\"cpu_gemm\":\"%s\",\"optimizer_bytes_per_device\":%zu",
            pst_dtype_name(s->precision),
            pst_sgemm_lib() == PST_SGEMM_ONEDNN ? "onednn" : "openblas",
            s->optimizer_bytes_per_device);
    if (s->precision == PST_F16)
        fprintf(out, ",\"loss_scale\":%.9g,\"skipped_steps\":%ld", (double)s->loss_scale,
                s->skipped_steps);
    if (s->text)
        fprintf(out, ",\"val_loss\":%.6f,\"tokens_per_s\":%.1f", s->val_loss, s->tokens_per_s);
    if (s->ctr) { /* null where not a number (a test part of one class, NaN predictions) */
        const double v[3] = {s->test_auc, s->test_logloss, s->auc_gap};
        static const char *const k[3] = {"test_auc", "test_logloss", "auc_gap"};
        for (int i = 0; i < 3; i++)
            fprintf(out, isfinite(v[i]) ? ",\"%s\":%.5f" : ",\"%s\":null", k[i], v[i]);
        fprintf(out, ",\"rows_touched\":%zu,\"rows_evicted\":%zu,\"pushes_refused\":%zu,"
                     "\"table_rows\":%zu,\"table_bytes\":%zu,\"sparse_hash\":\"%016" PRIx64
                     "\",\"key_balance\":%.4f",
                s->rows_touched, s->rows_evicted, s->pushes_refused, s->table_rows,
                s->table_bytes, s->sparse_hash, s->key_balance);
    }
    const tr_time_split *t = &s->time_split;
    char compute[32] = "null", comm[32] = "null";
    if (t->compute >= 0) {
        snprintf(compute, sizeof compute, "%.3f", t->compute);
        snprintf(comm, sizeof comm, "%.3f", t->comm);
    }
    fprintf(out, ",\"time_split\":{\"step_ms\":%.3f,\"compute_ms\":%s,\"comm_ms\":%s,"
                 "\"wait_ms\":%.3f,\"data_ms\":%.3f,\"other_ms\":%.3f}",
            t->step, compute, comm, t->wait, t->data, t->other);
    fputs("}\n", out);
    fflush(out);
}
