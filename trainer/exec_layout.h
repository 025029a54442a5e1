/* exec_layout.h — the executor's block layout: which blocks each layer reads, the chunks a
 * layer's weight gradient is computed in (cut where blocks end), and the order backward
 * finishes the blocks. A pure function of the model, the block plan and one flag: no
 * devices, no threads, no allocation after exec_layout_build (tests/test_exec_layout.c).
 * Not for: the buffers, streams and events (exec.c), or running a step (exec_step.c). */
#ifndef TR_EXEC_LAYOUT_H
#define TR_EXEC_LAYOUT_H

#include "common/error.h"
#include "common/nn/model.h"
#include "trainer/plan.h"

/* Rows [row0, row1) of layer `layer`'s weight gradient (row1 0: the whole layer);
 * afterwards the nblk blocks chunk_blocks[blk0 ..] are final, ascending. A list, not a
 * range: a layer's tensors need not be contiguous (a transformer block's lie between the
 * other blocks' in llm.c's layout), so the blocks it finishes need not be either. */
typedef struct exec_chunk {
    int layer, row0, row1;
    int blk0, nblk;
} exec_chunk;

typedef struct exec_layout {
    int nblocks, L;
    int *lmin;             /* (nblocks) the lowest layer that reads block b: it finishes b */
    int *layer_blocks;     /* the blocks layer l reads, ascending: */
    int *layer_blocks0;    /* (L + 1) [layer_blocks0[l], layer_blocks0[l + 1]) */
    exec_chunk *chunks;    /* (nchunks) by layer, rows ascending */
    int nchunks;
    int *layer_chunk0;     /* (L + 1) layer l's chunks: [layer_chunk0[l], [l + 1]) */
    int *chunk_blocks;     /* (nblocks) the blocks each chunk finishes (exec_chunk) */
    int *send_order;       /* (nblocks) the order backward finishes the blocks: the top
                            * layer first, each layer's chunks by ascending rows */
} exec_layout;

/* Builds the layout of model m over plan p. cut_at_blocks 0 (training alone: nothing leaves
 * early) makes each layer one chunk. Errors: PST_ERR_NOMEM, PST_ERR_INTERNAL (a block no
 * layer reads; pst_model_check rules that out). On error *lay holds what to free. */
pst_status exec_layout_build(exec_layout *lay, const pst_model *m, const tr_plan *p,
                             int cut_at_blocks);
/* Frees what build allocated; accepts a zeroed layout. */
void exec_layout_free(exec_layout *lay);

#endif /* TR_EXEC_LAYOUT_H */
