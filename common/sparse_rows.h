/* sparse_rows.h — a batch's sparse keys and gradient rows, in the fixed orders that make
 * sync training exact (issue 31): the trainer's unique keys with each occurrence's index,
 * the rows of repeated keys summed in occurrence order, and the pserver's merge of the
 * trainers' pushes, rows added in trainer order. Pure functions: no allocation (the
 * caller passes the scratch), thread safe on disjoint arguments.
 *
 * Not for: the table (pserver/sparse.h), the wire. */
#ifndef PST_SPARSE_ROWS_H
#define PST_SPARSE_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* A key and where it stood: the sort's element. */
typedef struct pst_key_at {
    uint64_t key;
    uint32_t at;
} pst_key_at;

/* uniq[0..*nuniq) = the distinct keys of keys[0..n), ascending; inverse[i] = the index of
 * keys[i] in uniq. scratch holds n elements. Errors: PST_ERR_INVALID (NULL with n > 0, n
 * over UINT32_MAX). */
pst_status pst_keys_unique(const uint64_t *keys, size_t n, pst_key_at *scratch, uint64_t *uniq,
                           uint32_t *inverse, size_t *nuniq);
/* sums (nuniq, dim) = for each unique key the sum of rows (n, dim) of its occurrences,
 * added to zero in ascending i. */
void pst_rows_sum(const float *rows, const uint32_t *inverse, size_t n, size_t dim, float *sums,
                  size_t nuniq);
/* The same sums as the pservers make them of P trainers' pushes (pst_rows_merge): rows
 * [bounds[p], bounds[p + 1]) are part p (P parts, bounds ascending, bounds[P] = n); each
 * key's rows within a part are added to zero in ascending i, and the parts' sums added in
 * part order. P = 1 is pst_rows_sum. scratch holds (nuniq, dim) floats, mark nuniq. */
void pst_rows_sum_parts(const float *rows, const uint32_t *inverse, const size_t *bounds, int P,
                        size_t dim, float *sums, size_t nuniq, float *scratch, uint32_t *mark);
/* The union of T sorted unique key lists keys[t][0..n[t]) into out_keys (ascending,
 * *nout of them, at most the sum of n[t]), with out_rows (*nout, dim) = each key's rows
 * added in trainer order (t ascending: the first trainer that has it copied, the next
 * ones added). Errors: PST_ERR_INVALID (a list not strictly ascending: the detail names
 * the trainer and the position). */
pst_status pst_rows_merge(int T, const uint64_t *const keys[], const size_t n[],
                          const float *const rows[], size_t dim, uint64_t *out_keys,
                          float *out_rows, size_t *nout);

#endif /* PST_SPARSE_ROWS_H */
