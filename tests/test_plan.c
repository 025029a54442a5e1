/* test_plan.c — the block plan: exact tiling, size limit, balance, determinism. */
#include <criterion/criterion.h>

#include "common/config.h"
#include "trainer/plan.h"
#include "trainer/remote.h"

static void check_plan(size_t n, size_t bytes, int S, int D)
{
    tr_plan p;
    cr_assert_eq(tr_plan_build(&p, n, bytes, S, D), PST_OK);
    size_t off = 0, maxlen = 0, minlen = (size_t)-1;
    for (int i = 0; i < p.nblocks; i++) {
        const tr_block *b = &p.blocks[i];
        cr_assert_eq(b->id, (uint32_t)i);
        cr_assert_eq(b->offset, off, "block %d starts at %zu, expected %zu", i, b->offset, off);
        cr_assert_gt(b->length, 0);
        cr_assert_leq(b->length * sizeof(float), bytes > 4 * n ? 4 * n : bytes,
                      "block %d is %zu elements, over %zu bytes", i, b->length, bytes);
        cr_assert(b->pserver >= 0 && b->pserver < S);
        cr_assert(b->owner_device >= 0 && b->owner_device < D);
        off += b->length;
        maxlen = b->length > maxlen ? b->length : maxlen;
        minlen = b->length < minlen ? b->length : minlen;
    }
    cr_assert_eq(off, n, "blocks cover %zu of %zu elements", off, n);
    cr_assert_leq(maxlen - minlen, 1, "block lengths differ by more than one element");
    /* Balance: the most loaded pserver / device carries at most one block over the mean. */
    size_t sum = 0;
    for (int s = 0; s < S; s++) {
        cr_assert_leq((double)p.pserver_elems[s], (double)n / S + (double)maxlen,
                      "pserver %d carries %zu of %zu (S=%d)", s, p.pserver_elems[s], n, S);
        sum += p.pserver_elems[s];
    }
    cr_assert_eq(sum, n);
    for (int d = 0; d < D; d++)
        cr_assert_leq((double)p.device_elems[d], (double)n / D + (double)maxlen);
    /* Every pserver has work when there are enough parameters. */
    if (n >= (size_t)S)
        for (int s = 0; s < S; s++)
            cr_assert_gt(p.pserver_elems[s], 0, "pserver %d idle with %zu params", s, n);
    tr_plan_free(&p);
}

Test(plan, tiles_and_balances)
{
    size_t sizes[] = {1, 2, 3, 7, 1000, 4096, 4097, 1863690, 25000000, 1048577};
    size_t bytes[] = {4, 12, 1024, 4u << 20, 64u << 20};
    int servers[] = {1, 2, 3, 5, 8};
    int devices[] = {1, 2, 4};
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t b = 0; b < sizeof bytes / sizeof *bytes; b++) {
            if (sizes[a] / (bytes[b] / 4) > 200000)
                continue; /* keep the test fast */
            for (size_t c = 0; c < sizeof servers / sizeof *servers; c++)
                for (size_t d = 0; d < sizeof devices / sizeof *devices; d++)
                    check_plan(sizes[a], bytes[b], servers[c], devices[d]);
        }
}

Test(plan, more_pservers_than_params)
{
    tr_plan p;
    cr_assert_eq(tr_plan_build(&p, 3, 4u << 20, 5, 1), PST_OK);
    cr_assert_eq(p.nblocks, 3);
    int busy = 0;
    for (int s = 0; s < 5; s++)
        busy += p.pserver_elems[s] > 0;
    cr_assert_eq(busy, 3);
    tr_plan_free(&p);
}

Test(plan, deterministic_and_fingerprinted)
{
    tr_plan a, b, c;
    cr_assert_eq(tr_plan_build(&a, 1863690, 1u << 20, 2, 2), PST_OK);
    cr_assert_eq(tr_plan_build(&b, 1863690, 1u << 20, 2, 4), PST_OK);
    cr_assert_eq(tr_plan_build(&c, 1863690, 1u << 20, 3, 2), PST_OK);
    cr_assert_eq(a.nblocks, b.nblocks);
    for (int i = 0; i < a.nblocks; i++) {
        cr_assert_eq(a.blocks[i].offset, b.blocks[i].offset);
        cr_assert_eq(a.blocks[i].pserver, b.blocks[i].pserver);
    }
    /* Devices are local: they do not change the fingerprint; pservers do. */
    cr_assert_eq(tr_plan_fingerprint(&a, 0), tr_plan_fingerprint(&b, 0));
    cr_assert_neq(tr_plan_fingerprint(&a, 0), tr_plan_fingerprint(&c, 0));
    tr_plan_free(&a);
    tr_plan_free(&b);
    tr_plan_free(&c);
}

Test(plan, rejects_bad_sizes)
{
    tr_plan p;
    cr_assert_eq(tr_plan_build(&p, 0, 1024, 1, 1), PST_ERR_INVALID);
    cr_assert_eq(tr_plan_build(&p, 10, 2, 1, 1), PST_ERR_INVALID);
    cr_assert_eq(tr_plan_build(&p, 10, 1024, 0, 1), PST_ERR_INVALID);
    cr_assert_eq(tr_plan_build(&p, 10, 1024, 1, 0), PST_ERR_INVALID);
    cr_assert_null(p.blocks);
    tr_plan_free(NULL);
}

/* Every pserver gets the same number of blocks (one link carrying a block more than the
 * others would be the job's bottleneck): 5 blocks' worth on 4 pservers is cut into 8. */
Test(plan, every_pserver_the_same_number_of_blocks)
{
    const size_t sizes[] = {5u << 20, 1863690, 25000000, 1000, 7};
    const int servers[] = {2, 3, 4, 5, 8};
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t c = 0; c < sizeof servers / sizeof *servers; c++) {
            tr_plan p;
            const int S = servers[c];
            cr_assert_eq(tr_plan_build(&p, sizes[a], 4u << 20, S, 1), PST_OK);
            int count[8] = {0};
            for (int i = 0; i < p.nblocks; i++)
                count[p.blocks[i].pserver]++;
            if (sizes[a] >= (size_t)p.nblocks && p.nblocks >= S)
                for (int s = 0; s < S; s++)
                    cr_assert_eq(count[s], p.nblocks / S, "%zu params on %d pservers: pserver "
                                 "%d has %d of %d blocks", sizes[a], S, s, count[s], p.nblocks);
            /* round robin: consecutive blocks on different pservers */
            for (int i = 1; i < p.nblocks && S > 1; i++)
                cr_assert_neq(p.blocks[i].pserver, p.blocks[i - 1].pserver);
            tr_plan_free(&p);
        }
    tr_plan p;
    cr_assert_eq(tr_plan_build(&p, 5000000, 4u << 20, 4, 1), PST_OK);
    cr_assert_eq(p.nblocks, 8);
    tr_plan_free(&p);
}

/* A job with pservers cuts at least TR_PLAN_ROUNDS blocks per pserver, never below
 * TR_PLAN_MIN_BLOCK, never above --block-bytes. */
Test(plan, pipelined_blocks)
{
    /* 20M f32 on 4 pservers: 80 MB in 4 x TR_PLAN_ROUNDS blocks */
    cr_assert_eq(tr_plan_pipelined_bytes(20000000, 4u << 20, 4),
                 20000000 / (4 * TR_PLAN_ROUNDS) * 4);
    /* 5M on 4: as many as blocks of TR_PLAN_MIN_BLOCK make */
    cr_assert_eq(tr_plan_pipelined_bytes(5000000, 4u << 20, 4), TR_PLAN_MIN_BLOCK);
    /* 100M on 1: 400 MB / TR_PLAN_ROUNDS, capped at 4 MiB */
    cr_assert_eq(tr_plan_pipelined_bytes(100000000, 4u << 20, 1), 4u << 20);
    /* small models: not below 256 KiB */
    cr_assert_eq(tr_plan_pipelined_bytes(100000, 4u << 20, 2), TR_PLAN_MIN_BLOCK);
    /* training alone: --block-bytes as it is */
    cr_assert_eq(tr_plan_pipelined_bytes(5000000, 4u << 20, 0), 4u << 20);
    /* a smaller --block-bytes stands */
    cr_assert_eq(tr_plan_pipelined_bytes(5000000, 64u << 10, 4), 64u << 10);
    tr_plan p;
    cr_assert_eq(tr_plan_build(&p, 20000000, tr_plan_pipelined_bytes(20000000, 4u << 20, 4),
                               4, 1), PST_OK);
    cr_assert_eq(p.nblocks, 4 * TR_PLAN_ROUNDS);
    tr_plan_free(&p);
    /* a size that is no whole number of elements a block: still exactly the rounds */
    const size_t n = 200000000 + 3;
    cr_assert_eq(tr_plan_build(&p, n, tr_plan_pipelined_bytes(n, 4u << 20, 64), 64, 1), PST_OK);
    cr_assert_eq(p.nblocks, 64 * TR_PLAN_ROUNDS);
    tr_plan_free(&p);
}

/* The send window (remote.h): auto is one round of the longest block (one per pserver, at
 * least two),
 * and at least TR_REMOTE_SAME_HOST_WINDOW when every pserver is on this host; a number
 * stands as it is. */
Test(plan, send_window_auto_is_one_round)
{
    tr_plan p;
    const size_t n = 5000000;
    cr_assert_eq(tr_plan_build(&p, n, tr_plan_pipelined_bytes(n, 4u << 20, 4), 4, 1), PST_OK);
    const size_t block = p.blocks[0].length;
    cr_assert_eq(tr_remote_window(PST_SEND_WINDOW_AUTO, &p, 4, 0), 4 * block * 4);
    cr_assert_eq(tr_remote_window(PST_SEND_WINDOW_AUTO, &p, 2, 0), 4 * block * 2);
    cr_assert_eq(tr_remote_window(PST_SEND_WINDOW_AUTO, &p, 4, 1), TR_REMOTE_SAME_HOST_WINDOW);
    cr_assert_eq(tr_remote_window(12345, &p, 4, 1), 12345);
    cr_assert_eq(tr_remote_window(0, &p, 4, 0), 0);
    tr_plan_free(&p);
    cr_assert_eq(tr_plan_build(&p, n, 4u << 20, 1, 1), PST_OK);
    cr_assert_eq(tr_remote_window(PST_SEND_WINDOW_AUTO, &p, 4, 0), 2 * p.blocks[0].length * 4);
    tr_plan_free(&p);
    /* A pipeline's plan starts with a short segment's block: the round is of the longest. */
    const tr_plan_segment segs[2] = {{100, 1}, {1000000, 2}};
    cr_assert_eq(tr_plan_build_segments(&p, segs, 2, 1u << 20, 2, 2), PST_OK);
    cr_assert_eq(p.blocks[0].length, 100);
    size_t longest = 0;
    for (int b = 0; b < p.nblocks; b++)
        longest = p.blocks[b].length > longest ? p.blocks[b].length : longest;
    cr_assert_gt(longest, 100);
    cr_assert_eq(tr_remote_window(PST_SEND_WINDOW_AUTO, &p, 4, 0), 2 * longest * 4);
    tr_plan_free(&p);
}

/* The credits (remote.h): auto is 4 blocks per pserver, and none when every
 * pserver is on this host; a number stands as it is. */
Test(plan, send_ahead_auto_is_four_blocks_a_pserver)
{
    tr_plan p;
    cr_assert_eq(tr_plan_build(&p, 5000000, 4u << 20, 1, 1), PST_OK);
    cr_assert_eq(tr_remote_ahead(PST_SEND_AHEAD_AUTO, &p, 0), 4);
    cr_assert_eq(tr_remote_ahead(PST_SEND_AHEAD_AUTO, &p, 1), 0);
    cr_assert_eq(tr_remote_ahead(3, &p, 1), 3);
    tr_plan_free(&p);
    cr_assert_eq(tr_plan_build(&p, 5000000, 4u << 20, 4, 1), PST_OK);
    cr_assert_eq(tr_remote_ahead(PST_SEND_AHEAD_AUTO, &p, 0), 16);
    cr_assert_eq(tr_remote_ahead(0, &p, 0), 0);
    tr_plan_free(&p);
}

/* Segments (a pipeline's stages): blocks tile the buffer and never span two segments; each
 * carries its segment's holders and is owned by one of them; every pserver gets a block;
 * the devices' held elements are their segments' sums; one segment held by every device
 * is tr_plan_build's plan; bad segments are refused. */
Test(plan, segments_cut_blocks_at_their_ends)
{
    const tr_plan_segment segs[] = {{1000, 0x9}, {7, 0x1}, {300, 0x2}, {5, 0x4}, {2000, 0x8},
                                    {1, 0x2}};
    const int ns = 6, D = 4;
    for (int S = 1; S <= 8; S++) {
        tr_plan p;
        cr_assert_eq(tr_plan_build_segments(&p, segs, ns, 1024, S, D), PST_OK, "%s",
                     pst_error_detail());
        size_t off = 0, held[4] = {0};
        int s = 0;
        size_t seg_end = segs[0].length;
        for (int i = 0; i < p.nblocks; i++) {
            const tr_block *b = &p.blocks[i];
            cr_assert_eq(b->offset, off);
            cr_assert(b->length > 0 && b->length * sizeof(float) <= 1024);
            while (b->offset >= seg_end)
                seg_end += segs[++s].length;
            cr_assert_leq(b->offset + b->length, seg_end, "S %d: block %d spans segments %d "
                          "and %d", S, i, s, s + 1);
            cr_assert_eq(b->holders, segs[s].holders);
            cr_assert((b->holders >> b->owner_device) & 1u, "block %d owned by a non-holder", i);
            cr_assert(b->pserver >= 0 && b->pserver < S);
            for (int d = 0; d < D; d++)
                if ((b->holders >> d) & 1u)
                    held[d] += b->length;
            off += b->length;
        }
        cr_assert_eq(off, p.nparams);
        cr_assert_eq(p.nparams, 3313u);
        for (int d = 0; d < D; d++)
            cr_assert_eq(p.device_held[d], held[d], "device %d", d);
        cr_assert_eq(held[0], 1007u);
        cr_assert_eq(held[3], 3000u);
        for (int q = 0; q < S; q++)
            cr_assert_gt(p.pserver_elems[q], 0, "S %d: pserver %d has no block", S, q);
        tr_plan_free(&p);
    }
    /* One segment every device holds: tr_plan_build's plan. */
    for (int S = 1; S <= 3; S++) {
        tr_plan a, b;
        const tr_plan_segment one = {12345, 0x7};
        cr_assert_eq(tr_plan_build(&a, 12345, 4096, S, 3), PST_OK);
        cr_assert_eq(tr_plan_build_segments(&b, &one, 1, 4096, S, 3), PST_OK);
        cr_assert_eq(tr_plan_fingerprint(&a, 0), tr_plan_fingerprint(&b, 0));
        for (int i = 0; i < a.nblocks; i++)
            cr_assert(a.blocks[i].owner_device == b.blocks[i].owner_device &&
                      a.blocks[i].holders == 0x7 && b.blocks[i].holders == 0x7);
        tr_plan_free(&a);
        tr_plan_free(&b);
    }
    tr_plan p;
    const tr_plan_segment empty[] = {{10, 0x1}, {0, 0x1}}, nobody[] = {{10, 0}},
                          outside[] = {{10, 0x10}};
    cr_assert_eq(tr_plan_build_segments(&p, empty, 2, 1024, 1, 4), PST_ERR_INVALID);
    cr_assert_eq(tr_plan_build_segments(&p, nobody, 1, 1024, 1, 4), PST_ERR_INVALID);
    cr_assert_eq(tr_plan_build_segments(&p, outside, 1, 1024, 1, 4), PST_ERR_INVALID);
}
