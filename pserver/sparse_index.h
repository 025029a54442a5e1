/* sparse_index.h — the sparse table's index (sparse.c): u64 keys to entries, open
 * addressing with linear probing over a power-of-two array, deletion by backward shift
 * (no tombstones). Chosen against Debian's uthash and genht by bench/hashtable.c
 * (docs/benchmarks.md, "Sparse tables: the index"). Not thread safe: the table locks a
 * stripe around every call.
 *
 * The caller hashes (pst_sparse_mix) and passes h: the home slot is bits 4 and up of h
 * (the low 4 pick the stripe). An entry's row is PS_INDEX_EMPTY in an unused slot. */
#ifndef PST_PSERVER_SPARSE_INDEX_H
#define PST_PSERVER_SPARSE_INDEX_H

#include <stddef.h>
#include <stdint.h>

#define PS_INDEX_EMPTY UINT32_MAX

typedef struct ps_index_entry {
    uint64_t key;
    uint32_t row;    /* PS_INDEX_EMPTY: an unused slot; else the caller's */
    uint32_t pushes; /* the caller's */
    long last;       /* the caller's */
} ps_index_entry;

typedef struct ps_index {
    ps_index_entry *slots; /* (cap) */
    size_t cap, used;      /* used: slots whose row is not PS_INDEX_EMPTY */
} ps_index;

/* The slot of key (its entry), or the empty slot where it would go. */
size_t ps_index_find(const ps_index *x, uint64_t key, uint64_t h);
/* Makes room for one more key (doubles the array past 7/10 full; the first call makes 64
 * slots); slot numbers change. Returns 0, or -1 out of memory (nothing changed). */
int ps_index_reserve(ps_index *x);
/* Puts e in the empty slot i (from ps_index_find, after ps_index_reserve). */
void ps_index_put(ps_index *x, size_t i, ps_index_entry e);
/* Empties slot i; entries after it may move back (slot numbers change). */
void ps_index_remove(ps_index *x, size_t i);
void ps_index_free(ps_index *x);

#endif /* PST_PSERVER_SPARSE_INDEX_H */
