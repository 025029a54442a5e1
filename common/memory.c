/* memory.c — see memory.h. */
#include "common/memory.h"

#include <malloc.h>

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
