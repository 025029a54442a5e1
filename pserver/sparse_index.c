/* sparse_index.c — the sparse table's index (see sparse_index.h). */
#include "pserver/sparse_index.h"

#include <stdlib.h>

#include "pserver/sparse.h"

#define MIN_SLOTS 64

static inline size_t home_of(uint64_t h, size_t cap)
{
    return (size_t)(h >> 4) & (cap - 1);
}

size_t ps_index_find(const ps_index *x, uint64_t key, uint64_t h)
{
    size_t i = home_of(h, x->cap);
    while (x->slots[i].row != PS_INDEX_EMPTY && x->slots[i].key != key)
        i = (i + 1) & (x->cap - 1);
    return i;
}

int ps_index_reserve(ps_index *x)
{
    if (x->cap && (x->used + 1) * 10 <= x->cap * 7)
        return 0;
    const size_t cap = x->cap ? x->cap * 2 : MIN_SLOTS;
    ps_index_entry *slots = malloc(cap * sizeof *slots);
    if (!slots)
        return -1;
    for (size_t i = 0; i < cap; i++)
        slots[i].row = PS_INDEX_EMPTY;
    ps_index old = *x;
    x->slots = slots;
    x->cap = cap;
    for (size_t i = 0; i < old.cap; i++)
        if (old.slots[i].row != PS_INDEX_EMPTY)
            x->slots[ps_index_find(x, old.slots[i].key, pst_sparse_mix(old.slots[i].key))] =
                old.slots[i];
    free(old.slots);
    return 0;
}

void ps_index_put(ps_index *x, size_t i, ps_index_entry e)
{
    x->slots[i] = e;
    x->used++;
}

void ps_index_remove(ps_index *x, size_t i)
{
    const size_t mask = x->cap - 1;
    for (size_t j = (i + 1) & mask; x->slots[j].row != PS_INDEX_EMPTY; j = (j + 1) & mask) {
        const size_t home = home_of(pst_sparse_mix(x->slots[j].key), x->cap);
        /* j's entry may fill the hole at i unless its home lies cyclically in (i, j] */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            x->slots[i] = x->slots[j];
            i = j;
        }
    }
    x->slots[i].row = PS_INDEX_EMPTY;
    x->used--;
}

void ps_index_free(ps_index *x)
{
    free(x->slots);
    *x = (ps_index){0};
}
