/* exec_layout.c — the executor's block layout (see exec_layout.h). */
#include "trainer/exec_layout.h"

#include <stdlib.h>

#include "common/memory.h"

/* Which blocks each layer reads, and each block's lowest layer. */
static pst_status map_blocks(exec_layout *lay, const pst_model *m, const tr_plan *p)
{
    const int nb = p->nblocks;
    for (int b = 0; b < nb; b++)
        lay->lmin[b] = -1;
    for (int l = 0, k = 0; l < m->nlayers; l++) {
        const pst_layer *ly = &m->layers[l];
        lay->layer_blocks0[l] = k;
        for (int b = 0; b < nb; b++) {
            const tr_block *blk = &p->blocks[b];
            int reads = 0;
            for (int t = 0; t < ly->ntensors && !reads; t++) {
                const pst_tensor *ts = &m->tensors[ly->tensor[t]];
                reads = blk->offset < ts->offset + ts->numel &&
                        blk->offset + blk->length > ts->offset;
            }
            if (!reads)
                continue;
            lay->layer_blocks[k++] = b;
            if (lay->lmin[b] < 0)
                lay->lmin[b] = l;
        }
        lay->layer_blocks0[l + 1] = k;
    }
    for (int b = 0; b < nb; b++)
        if (lay->lmin[b] < 0) /* pst_model_check rules this out */
            return pst_error_set(PST_ERR_INTERNAL, "executor: no layer of model %s reads block "
                                 "%d", m->name, b);
    return PST_OK;
}

/* Whether block b's parameters that layer ly names all lie in its first tensor, and where
 * they end there (one past the last element, relative to the tensor). */
static int block_in_first_tensor(const pst_model *m, const pst_layer *ly, const tr_block *blk,
                                 size_t *end)
{
    const size_t lo = blk->offset, hi = blk->offset + blk->length;
    for (int k = 1; k < ly->ntensors; k++) {
        const pst_tensor *t = &m->tensors[ly->tensor[k]];
        if (lo < t->offset + t->numel && hi > t->offset)
            return 0;
    }
    const pst_tensor *t0 = &m->tensors[ly->tensor[0]];
    *end = (hi < t0->offset + t0->numel ? hi : t0->offset + t0->numel) - t0->offset;
    return 1;
}

/* Cuts every layer's weight gradient at the blocks it finishes (see exec.c's DESIGN). A
 * block is finished by its lowest layer lmin: by the chunk holding its last element in that
 * layer's first tensor, or by the layer's last chunk when it reaches into another of the
 * layer's tensors (every chunk adds its rows' share of those). Cuts are rounded up to whole
 * tiles (the layer's split_tile: a linear layer's GEMM bits must not depend on where the
 * plan cut the blocks). A block's cut is at least row 1, and the cuts of a layer's blocks
 * ascend with the blocks; a block whose cut equals the previous one is finished by the same
 * chunk. Without cut_at_blocks each layer is one chunk. */
static pst_status cut_chunks(exec_layout *lay, const pst_model *m, const tr_plan *p,
                             int cut_at_blocks)
{
    const int nb = p->nblocks;
    int nlisted = 0; /* every block is listed by exactly one chunk: its lowest layer's */
    for (int l = 0; l < m->nlayers; l++) {
        const pst_layer *ly = &m->layers[l];
        lay->layer_chunk0[l] = lay->nchunks;
        if (!ly->ntensors)
            continue;
        const int R = ly->split_rows, blk0 = nlisted;
        int row0 = 0;
        /* Blocks whose lowest layer is l, ascending: their cut rows ascend too. */
        for (int b = 0; b < nb; b++) {
            if (lay->lmin[b] != l)
                continue;
            if (!R || !cut_at_blocks) { /* one chunk finishes them all */
                lay->chunk_blocks[nlisted++] = b;
                continue;
            }
            const pst_tensor *t0 = &m->tensors[ly->tensor[0]];
            const size_t row_len = t0->numel / (size_t)R;
            size_t end;
            int cut = block_in_first_tensor(m, ly, &p->blocks[b], &end)
                          ? (int)((end + row_len - 1) / row_len)
                          : R;
            cut = (cut + ly->split_tile - 1) / ly->split_tile * ly->split_tile;
            cut = cut < R ? cut : R;
            lay->chunk_blocks[nlisted++] = b;
            if (cut <= row0) { /* row0 > 0: a chunk of this layer is already cut there */
                lay->chunks[lay->nchunks - 1].nblk++;
                continue;
            }
            lay->chunks[lay->nchunks++] = (exec_chunk){l, row0, cut, nlisted - 1, 1};
            row0 = cut;
        }
        if (!R || !cut_at_blocks)
            lay->chunks[lay->nchunks++] = (exec_chunk){l, 0, R, blk0, nlisted - blk0};
        else if (row0 < R) /* rows after the last block that ends in this layer */
            lay->chunks[lay->nchunks++] = (exec_chunk){l, row0, R, nlisted, 0};
    }
    lay->layer_chunk0[m->nlayers] = lay->nchunks;
    if (nlisted != nb) /* every block has a lowest layer (map_blocks checked it) */
        return pst_error_set(PST_ERR_INTERNAL, "executor: %d of %d blocks in chunks", nlisted,
                             nb);
    return PST_OK;
}

/* The order backward finishes the blocks: layers from the top, each layer's chunks by
 * ascending rows (the send streams are FIFO: the blocks leave in this order). */
static void order_sends(exec_layout *lay)
{
    for (int l = lay->L - 1, i = 0; l >= 0; l--)
        for (int c = lay->layer_chunk0[l]; c < lay->layer_chunk0[l + 1]; c++)
            for (int k = 0; k < lay->chunks[c].nblk; k++)
                lay->send_order[i++] = lay->chunk_blocks[lay->chunks[c].blk0 + k];
}

pst_status exec_layout_build(exec_layout *lay, const pst_model *m, const tr_plan *p,
                             int cut_at_blocks)
{
    const size_t nb = (size_t)p->nblocks, L = (size_t)m->nlayers;
    *lay = (exec_layout){.nblocks = p->nblocks, .L = m->nlayers};
    lay->lmin = calloc(nb ? nb : 1, sizeof(int));
    lay->layer_blocks = calloc(L * nb > 0 ? L * nb : 1, sizeof(int));
    lay->layer_blocks0 = calloc(L + 1, sizeof(int));
    lay->chunks = calloc(nb + L > 0 ? nb + L : 1, sizeof *lay->chunks);
    lay->layer_chunk0 = calloc(L + 1, sizeof(int));
    lay->chunk_blocks = calloc(nb ? nb : 1, sizeof(int));
    lay->send_order = calloc(nb ? nb : 1, sizeof(int));
    if (!lay->lmin || !lay->layer_blocks || !lay->layer_blocks0 || !lay->chunks ||
        !lay->layer_chunk0 || !lay->chunk_blocks || !lay->send_order)
        return pst_error_set(PST_ERR_NOMEM, "executor: out of memory");
    PST_TRY(map_blocks(lay, m, p));
    PST_TRY(cut_chunks(lay, m, p, cut_at_blocks));
    order_sends(lay);
    return PST_OK;
}

void exec_layout_free(exec_layout *lay)
{
    PST_FREE_ALL(lay->lmin, lay->layer_blocks, lay->layer_blocks0, lay->chunks, lay->layer_chunk0,
                 lay->chunk_blocks, lay->send_order);
    *lay = (exec_layout){0};
}
