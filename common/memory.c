/* memory.c — see memory.h. */
#include "common/memory.h"

#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

void pst_memory_tune(void)
{
    /* 32 MiB is the largest threshold glibc accepts on 64-bit (a larger value is refused
     * and the default, 128 KiB, stays). */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, -1);
}

void pst_memory_tune_server(void)
{
    pst_memory_tune();
    /* One arena: glibc gives each thread that meets a locked arena another one (up to 8 per
     * core), and with trimming off, memory freed into an arena's top stays resident for
     * good, where not even malloc_trim reaches it (it trims the main arena's top only). Under
     * a flood of refused 100 KB pushes gRPC's threads spread 111 MB over several arenas,
     * all free afterwards and all still resident. In the one main arena, malloc_trim gives
     * such memory back (the rpc server calls it after refused calls). */
    mallopt(M_ARENA_MAX, 1);
}

void pst_memory_huge(void *p, size_t bytes)
{
    const uintptr_t huge = (uintptr_t)2 << 20;
    const uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    const uintptr_t hi = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (p && hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
}

unsigned long long pst_memory_available(void)
{
    const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    unsigned long long bytes = pages > 0 && size > 0 ? (unsigned long long)pages * (unsigned long long)size
                                                      : 0;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r"); /* "max" when there is no limit */
    unsigned long long limit;
    if (f && fscanf(f, "%llu", &limit) == 1 && limit > 0 && (!bytes || limit < bytes))
        bytes = limit;
    if (f)
        fclose(f);
    return bytes;
}
