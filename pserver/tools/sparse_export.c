/* sparse_export.c — the `sparse-export` program: a sparse table's rows for serving, from
 * its checkpoints (pserver/sparse_ckpt.h), as (key, row) records.
 *   sparse-export DIR OUT [STEP]
 * DIR is a table's checkpoint directory (DIR/<job>/pserver-<i>/table-<k>: each pserver
 * holds the keys that hash to it, so a job's table is the union of its pservers' exports);
 * STEP defaults to the newest checkpoint whose chain is whole. Writes OUT in
 * pst_sparse_export's format (the rows not expired at STEP, ascending by key) and prints
 * one JSON line: {"step":S,"rows":N,"dim":D,"out":"OUT"}. Exit 0, 1 (a file could not be
 * read or written: one line says which and why), 2 (bad arguments). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "pserver/sparse_ckpt.h"

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: sparse-export DIR OUT [STEP] (DIR: a sparse table's "
                        "checkpoints, e.g. ckpt/job-0123456789abcdef/pserver-0/table-0)\n");
        return 2;
    }
    long step = -1;
    if (argc == 4) {
        char *end;
        errno = 0;
        step = strtol(argv[3], &end, 10);
        if (errno || *end || end == argv[3] || step < 0) {
            fprintf(stderr, "sparse-export: STEP \"%s\" is not a step (example: 100)\n",
                    argv[3]);
            return 2;
        }
    } else if (pst_sparse_ckpt_steps(argv[1], &step, 1) != 1) {
        fprintf(stderr, "sparse-export: %s holds no whole sparse table checkpoint\n", argv[1]);
        return 1;
    }
    pst_sparse_table *t = NULL;
    size_t rows = 0;
    pst_status st = pst_sparse_ckpt_open(argv[1], step, &t);
    if (st == PST_OK)
        st = pst_sparse_export(t, step, argv[2], &rows);
    if (st != PST_OK) {
        fprintf(stderr, "sparse-export: %s\n", pst_error_detail());
        pst_sparse_free(t);
        return 1;
    }
    printf("{\"step\":%ld,\"rows\":%zu,\"dim\":%d,\"out\":\"%s\"}\n", step, rows,
           pst_sparse_config_of(t)->dim, argv[2]);
    pst_sparse_free(t);
    return 0;
}
