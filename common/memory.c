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
