/* memory.c — see memory.h. */
#include "common/memory.h"

#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef __GLIBC__
#include <gnu/libc-version.h>
#endif
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

int pst_memory_huge_heap_env(void)
{
#ifdef __GLIBC__
    int major = 0, minor = 0;
    if (sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor) != 2 ||
        major * 1000 + minor < 2035)
        return 0; /* older glibc has no such tunable */
    const char *old = getenv("GLIBC_TUNABLES");
    if (old && strstr(old, "glibc.malloc.hugetlb"))
        return 0; /* set already (by us before the restart, or by the user) */
    char thp[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    const int known = f && fgets(thp, sizeof thp, f) != NULL;
    if (f)
        fclose(f);
    if (!known || strstr(thp, "[never]"))
        return 0;
    char value[1024];
    const int n = old && old[0] ? snprintf(value, sizeof value, "%s:glibc.malloc.hugetlb=1", old)
                                : snprintf(value, sizeof value, "glibc.malloc.hugetlb=1");
    return n > 0 && (size_t)n < sizeof value && setenv("GLIBC_TUNABLES", value, 1) == 0;
#else
    return 0;
#endif
}

void pst_exec_self(char **argv)
{
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return;
    self[n] = '\0';
    execv(self, argv);
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

#if defined(__x86_64__)
#include <immintrin.h>

/* Stream-stores [0, n) from s to d, where d is aligned to W bytes and n a multiple of 4W:
 * one variant per vector width W, each compiled for its instruction set. */
#define STREAM_COPY(name, isa, W, vec, load, stream)                                          \
    __attribute__((target(isa))) static void name(char *d, const char *s, size_t n)          \
    {                                                                                         \
        for (size_t i = 0; i < n; i += 4 * (W)) {                                             \
            vec a = load((const vec *)(s + i)), b = load((const vec *)(s + i + (W)));         \
            vec c = load((const vec *)(s + i + 2 * (W)));                                     \
            vec e = load((const vec *)(s + i + 3 * (W)));                                     \
            stream((vec *)(d + i), a);                                                        \
            stream((vec *)(d + i + (W)), b);                                                  \
            stream((vec *)(d + i + 2 * (W)), c);                                              \
            stream((vec *)(d + i + 3 * (W)), e);                                              \
        }                                                                                     \
        _mm_sfence();                                                                         \
    }
STREAM_COPY(stream_avx512, "avx512f", 64, __m512i, _mm512_loadu_si512, _mm512_stream_si512)
STREAM_COPY(stream_avx2, "avx2", 32, __m256i, _mm256_loadu_si256, _mm256_stream_si256)
STREAM_COPY(stream_sse2, "sse2", 16, __m128i, _mm_loadu_si128, _mm_stream_si128)

/* The widest stream stores this CPU has, in bytes (the same answer on every thread). */
static size_t stream_width(void)
{
    static size_t width;
    size_t w = __atomic_load_n(&width, __ATOMIC_RELAXED);
    if (!w) {
        __builtin_cpu_init();
        w = __builtin_cpu_supports("avx512f") ? 64 : __builtin_cpu_supports("avx2") ? 32 : 16;
        __atomic_store_n(&width, w, __ATOMIC_RELAXED);
    }
    return w;
}

void pst_copy_stream(void *dst, const void *src, size_t n)
{
    const size_t width = stream_width();
    char *d = dst;
    const char *s = src;
    size_t head = (width - (uintptr_t)d % width) % width;
    head = head < n ? head : n;
    memcpy(d, s, head);
    const size_t body = (n - head) / (4 * width) * (4 * width);
    (width == 64 ? stream_avx512 : width == 32 ? stream_avx2 : stream_sse2)(d + head, s + head,
                                                                          body);
    memcpy(d + head + body, s + head + body, n - head - body);
}
#else
void pst_copy_stream(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}
#endif

void pst_free_all(void *const ptrs[], size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(ptrs[i]);
}
