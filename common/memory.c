/* memory.c — see memory.h. */
#include "common/memory.h"

#include <malloc.h>

void pst_memory_tune(void)
{
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, -1);
}
