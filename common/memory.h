/* memory.h — process-wide allocator settings for the long-running programs.
 *
 * Messages of several MiB are allocated and freed every step (gRPC receive slices, pull
 * replies). glibc serves allocations that large with mmap and returns them with munmap,
 * so every step page-faults its buffers in again. pst_memory_tune() keeps such blocks in
 * the heap (no mmap below 32 MiB, glibc's largest threshold; no trimming), so after the first step they are reused.
 * Call once at the start of main(). */
#ifndef PST_MEMORY_H
#define PST_MEMORY_H

#include <stddef.h>
#include <stdlib.h>

void pst_memory_tune(void);

/* pst_memory_tune, and one malloc arena, so that malloc_trim can give back what a burst of
 * refused calls left free (see memory.c). For the pserver. */
void pst_memory_tune_server(void);

/* Advice for a buffer of many MiB that copies stream through (parameters, gradients, the
 * pserver's blocks): transparent huge pages over the 2 MiB pages wholly inside
 * [p, p + bytes), so a pass over it takes a TLB miss per 2 MiB instead of per 4 KiB (each
 * miss a two-level walk under a hypervisor). Call it before the buffer is first written.
 * Advice only: where the kernel has THP off, or the range holds no whole 2 MiB page,
 * nothing changes. */
void pst_memory_huge(void *p, size_t bytes);

/* malloc's own heaps ask for transparent huge pages too (where gRPC's receive buffers
 * live, which every pushed and pulled byte passes through): only glibc can do that, through
 * its tunable glibc.malloc.hugetlb=1 (glibc 2.35 and later), read once at the program's
 * start. Where that applies (glibc >= 2.35, the kernel's THP not "never") and
 * GLIBC_TUNABLES does not name glibc.malloc.hugetlb yet, adds it to the variable and
 * returns 1: the caller then restarts the program (pst_exec_self) for it to take effect.
 * Otherwise returns 0 and changes nothing; GLIBC_TUNABLES=glibc.malloc.hugetlb=0 keeps the
 * heaps on 4 KiB pages. */
int pst_memory_huge_heap_env(void);

/* Copies n bytes from src to dst (not overlapping), as memcpy, with non-temporal stores
 * where the CPU has them (x86-64: AVX-512F, AVX2 or SSE2), for copies of
 * PST_COPY_STREAM_MIN bytes or more in all (in pieces, each by this): a copy that large
 * leaves the caches anyway, and stores that bypass them skip reading each destination line
 * first (a trainer's pulled blocks into its parameters: docs/scaling.md). Smaller copies
 * should use memcpy: what they write is read soon, from cache. */
#define PST_COPY_STREAM_MIN ((size_t)1 << 20)
void pst_copy_stream(void *dst, const void *src, size_t n);

/* Executes this program's binary (/proc/self/exe resolved, so the process keeps its name)
 * again with the same arguments and the current environment, in this process. Returns only
 * when that failed. Call before any thread starts. */
void pst_exec_self(char **argv);

/* Frees every node of the singly linked list at head (an lvalue, left NULL), whose nodes
 * link through member `next` and own nothing else. A statement: PST_FREE_LIST(h, next); */
#define PST_FREE_LIST(head, next)                                                             \
    for (void *pst_node_; (pst_node_ = (head)) != NULL; free(pst_node_))                      \
    (head) = (head)->next

/* free() of every argument, in order: PST_FREE_ALL(a->x, a->y, a->z); */
#define PST_FREE_ALL(...)                                                                     \
    pst_free_all((void *[]){__VA_ARGS__}, sizeof((void *[]){__VA_ARGS__}) / sizeof(void *))
void pst_free_all(void *const ptrs[], size_t n);

/* Bytes of memory this process may use: the machine's physical memory, or its cgroup's
 * limit (cgroup v2 memory.max, as a pod's) when that is lower. */
unsigned long long pst_memory_available(void);

#endif /* PST_MEMORY_H */
