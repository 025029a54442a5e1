/* test_exec_layout.c — the executor's block layout (trainer/exec_layout.c), a pure function
 * of a model and a block plan: on the real MLP and GPT over plans of many block sizes, every
 * block is finished by exactly one chunk of its lowest layer, that chunk holds the block's
 * last row, a layer's chunks tile its rows on whole tiles, the send order is backward's
 * (top layer first, rows ascending), and training alone each layer is one chunk. A block no
 * layer reads is an error, not a silent hole. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/nn/models/models.h"
#include "trainer/exec_layout.h"

/* Whether layer ly reads any element of blk. */
static int reads(const pst_model *m, const pst_layer *ly, const tr_block *blk)
{
    for (int t = 0; t < ly->ntensors; t++) {
        const pst_tensor *ts = &m->tensors[ly->tensor[t]];
        if (blk->offset < ts->offset + ts->numel && blk->offset + blk->length > ts->offset)
            return 1;
    }
    return 0;
}

/* Checks every property of the layout of m over a plan of blocks of `bytes`. */
static void check_layout(const pst_model *m, size_t bytes, int cut)
{
    tr_plan p;
    cr_assert_eq(tr_plan_build(&p, m->nparams, bytes, 2, 1), PST_OK);
    exec_layout lay;
    cr_assert_eq(exec_layout_build(&lay, m, &p, cut), PST_OK, "%s", pst_error_detail());
    const int nb = p.nblocks, L = m->nlayers;
    /* lmin and layer_blocks: exactly the layers that read a block, ascending */
    for (int b = 0; b < nb; b++) {
        int lo = -1;
        for (int l = 0; l < L && lo < 0; l++)
            lo = reads(m, &m->layers[l], &p.blocks[b]) ? l : -1;
        cr_assert_eq(lay.lmin[b], lo, "block %d: lmin %d, lowest reader %d", b, lay.lmin[b], lo);
    }
    for (int l = 0; l < L; l++) {
        int k = lay.layer_blocks0[l];
        for (int b = 0; b < nb; b++)
            if (reads(m, &m->layers[l], &p.blocks[b]))
                cr_assert_eq(lay.layer_blocks[k++], b, "layer %d's blocks", l);
        cr_assert_eq(k, lay.layer_blocks0[l + 1], "layer %d reads more blocks than listed", l);
    }
    /* every block listed once, by a chunk of its lowest layer */
    int *seen = calloc((size_t)nb, sizeof(int));
    for (int c = 0; c < lay.nchunks; c++)
        for (int k = 0; k < lay.chunks[c].nblk; k++) {
            const int b = lay.chunk_blocks[lay.chunks[c].blk0 + k];
            seen[b]++;
            cr_assert_eq(lay.chunks[c].layer, lay.lmin[b], "block %d finished by layer %d, not "
                         "its lowest %d", b, lay.chunks[c].layer, lay.lmin[b]);
        }
    for (int b = 0; b < nb; b++)
        cr_assert_eq(seen[b], 1, "block %d listed %d times", b, seen[b]);
    /* a layer's chunks tile [0, split_rows) on whole tiles, in order */
    for (int l = 0; l < L; l++) {
        const pst_layer *ly = &m->layers[l];
        const int c0 = lay.layer_chunk0[l], c1 = lay.layer_chunk0[l + 1];
        if (!ly->ntensors) {
            cr_assert_eq(c1, c0, "layer %d has no tensors but %d chunks", l, c1 - c0);
            continue;
        }
        cr_assert_gt(c1, c0, "layer %d has tensors and no chunk", l);
        if (!cut || !ly->split_rows)
            cr_assert_eq(c1 - c0, 1, "layer %d: %d chunks, expected one", l, c1 - c0);
        if (!ly->split_rows) { /* not split: the whole layer (rows 0 to 0) */
            cr_assert(lay.chunks[c0].row0 == 0 && lay.chunks[c0].row1 == 0);
            continue;
        }
        int row = 0;
        for (int c = c0; c < c1; c++) {
            cr_assert_eq(lay.chunks[c].layer, l);
            cr_assert_eq(lay.chunks[c].row0, row, "layer %d chunk %d starts at %d, not %d", l,
                         c - c0, lay.chunks[c].row0, row);
            cr_assert_gt(lay.chunks[c].row1, row);
            if (lay.chunks[c].row1 < ly->split_rows)
                cr_assert_eq(lay.chunks[c].row1 % ly->split_tile, 0, "layer %d cut at row %d, "
                             "not a multiple of its tile %d", l, lay.chunks[c].row1,
                             ly->split_tile);
            row = lay.chunks[c].row1;
        }
        cr_assert_eq(row, ly->split_rows, "layer %d's chunks end at row %d of %d", l, row,
                     ly->split_rows);
        /* a block that ends inside the first tensor is finished by the chunk that computes
         * its last row, not a later one */
        const pst_tensor *t0 = &m->tensors[ly->tensor[0]];
        for (int c = c0; cut && ly->split_rows && c < c1; c++)
            for (int k = 0; k < lay.chunks[c].nblk; k++) {
                const tr_block *blk = &p.blocks[lay.chunk_blocks[lay.chunks[c].blk0 + k]];
                const size_t row_len = t0->numel / (size_t)ly->split_rows;
                const size_t end = blk->offset + blk->length;
                int others = 0; /* the block reaches into another tensor of the layer */
                for (int t = 1; t < ly->ntensors; t++) {
                    const pst_tensor *ts = &m->tensors[ly->tensor[t]];
                    others |= blk->offset < ts->offset + ts->numel && end > ts->offset;
                }
                if (others) {
                    cr_assert_eq(c, c1 - 1, "a block beyond layer %d's first tensor is "
                                 "finished before its last chunk", l);
                    continue;
                }
                const size_t last_row = (end - t0->offset - 1) / row_len;
                cr_assert((size_t)lay.chunks[c].row1 > last_row, "block ends at row %zu, its "
                          "chunk at %d", last_row, lay.chunks[c].row1);
                if (c > c0)
                    cr_assert((size_t)lay.chunks[c - 1].row1 <= last_row, "block ending at "
                              "row %zu could have left with the chunk before", last_row);
            }
    }
    /* the send order: every block once, lowest layers last, a layer's chunks by rows */
    memset(seen, 0, sizeof(int) * (size_t)nb);
    for (int i = 0; i < nb; i++) {
        const int b = lay.send_order[i];
        cr_assert(b >= 0 && b < nb);
        cr_assert_eq(seen[b]++, 0, "block %d sent twice", b);
        if (i > 0)
            cr_assert_geq(lay.lmin[lay.send_order[i - 1]], lay.lmin[b], "send order: block "
                          "%d of layer %d after a block of a lower layer", b, lay.lmin[b]);
    }
    free(seen);
    exec_layout_free(&lay);
    cr_assert_null(lay.chunks);
    tr_plan_free(&p);
}

/* check_layout over plans of each block size, cut at blocks and not; frees m. */
static void check_block_sizes(pst_model *m, const size_t *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        check_layout(m, bytes[i], 1);
        check_layout(m, bytes[i], 0);
    }
    pst_model_free(m);
}

Test(exec_layout, mlp_over_many_block_sizes)
{
    pst_model m = {0};
    const int hidden[] = {256, 128};
    cr_assert_eq(pst_model_mlp(&m, 784, 10, 2, hidden), PST_OK);
    const size_t bytes[] = {4096, 65536, 100000, 1u << 20, 64u << 20};
    check_block_sizes(&m, bytes, sizeof bytes / sizeof *bytes);
}

Test(exec_layout, gpt_tied_embedding_and_scattered_tensors)
{
    pst_model m = {0};
    cr_assert_eq(pst_model_gpt(&m, 96, 32, 2, 2, 32), PST_OK, "%s", pst_error_detail());
    const size_t bytes[] = {1024, 4096, 30000, 1u << 20};
    check_block_sizes(&m, bytes, sizeof bytes / sizeof *bytes);
}

Test(exec_layout, cuts_an_mlp_layer_where_its_blocks_end)
{
    /* 784-1024-10 in blocks of 65536 bytes (16384 floats, 21 rows): layer 0's weight
     * (1024 rows of 784) holds 49 blocks; cut on tiles of PST_ROW_TILE (256) rows, its
     * gradient is 4 chunks. */
    pst_model m = {0};
    const int hidden[] = {1024};
    cr_assert_eq(pst_model_mlp(&m, 784, 10, 1, hidden), PST_OK);
    tr_plan p;
    cr_assert_eq(tr_plan_build(&p, m.nparams, 65536, 1, 1), PST_OK);
    exec_layout lay;
    cr_assert_eq(exec_layout_build(&lay, &m, &p, 1), PST_OK);
    const int chunks0 = lay.layer_chunk0[1] - lay.layer_chunk0[0];
    cr_assert_eq(chunks0, 4, "layer 0 in %d chunks; its blocks end at many rows", chunks0);
    /* every block reaches into layer 0 (the last one holds its bias and all of layer 1):
     * they leave in buffer order, as backward's row chunks finish them */
    for (int i = 0; i < p.nblocks; i++)
        cr_assert_eq(lay.send_order[i], i, "send order %d: block %d", i, lay.send_order[i]);
    exec_layout_free(&lay);
    cr_assert_eq(exec_layout_build(&lay, &m, &p, 0), PST_OK);
    cr_assert_eq(lay.layer_chunk0[1] - lay.layer_chunk0[0], 1, "alone: one chunk a layer");
    exec_layout_free(&lay);
    tr_plan_free(&p);
    pst_model_free(&m);
}

Test(exec_layout, a_block_no_layer_reads_is_an_error)
{
    pst_model m = {0};
    const int hidden[] = {16};
    cr_assert_eq(pst_model_mlp(&m, 8, 4, 1, hidden), PST_OK);
    tr_plan p; /* a plan over more parameters than the model has: its last block is no one's */
    cr_assert_eq(tr_plan_build(&p, m.nparams + 64, 256, 1, 1), PST_OK);
    exec_layout lay;
    cr_assert_eq(exec_layout_build(&lay, &m, &p, 1), PST_ERR_INTERNAL);
    cr_assert(strstr(pst_error_detail(), "reads block"), "%s", pst_error_detail());
    exec_layout_free(&lay);
    tr_plan_free(&p);
    pst_model_free(&m);
}
