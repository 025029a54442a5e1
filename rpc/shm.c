/* shm.c — payloads through shared memory on one host (see shm.h). */
#include "rpc/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#define SHM_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

size_t rpc_shm_bytes(uint64_t total)
{
    if (total > (SIZE_MAX - RPC_SHM_HEADER) / 8)
        return 0;
    return RPC_SHM_HEADER + (size_t)total * 8;
}

static void shm_empty(rpc_shm *s)
{
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

static pst_status create(rpc_shm *s, size_t bytes)
{
    int fd = memfd_create("pstrain-payloads", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return pst_error_set(PST_ERR_UNSUPPORTED, "memfd_create: %s", strerror(errno));
    if (ftruncate(fd, (off_t)bytes) != 0 || fcntl(fd, F_ADD_SEALS, SHM_SEALS) != 0) {
        pst_status st = pst_error_set(PST_ERR_IO, "shared memory of %zu bytes: %s", bytes,
                                      strerror(errno));
        close(fd);
        return st;
    }
    struct stat sb;
    void *base = fstat(fd, &sb) == 0
                     ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                     : MAP_FAILED;
    if (base == MAP_FAILED) {
        pst_status st = pst_error_set(PST_ERR_NOMEM, "mmap of %zu bytes of shared memory: %s",
                                      bytes, strerror(errno));
        close(fd);
        return st;
    }
    uint64_t nonce = 0;
    while (nonce == 0)
        if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
            nonce = 0;
    memcpy(base, &nonce, sizeof nonce);
    s->base = base;
    s->bytes = bytes;
    s->fd = fd;
    s->nonce = nonce;
    s->dev = sb.st_dev;
    s->ino = sb.st_ino;
    snprintf(s->name, sizeof s->name, "/proc/%d/fd/%d", (int)getpid(), fd);
    return PST_OK;
}

pst_status rpc_shm_create(rpc_shm *s, uint64_t total)
{
    shm_empty(s);
    const size_t bytes = rpc_shm_bytes(total);
    if (!bytes)
        return pst_error_set(PST_ERR_NOMEM, "shared memory for %llu elements: too large",
                             (unsigned long long)total);
    PST_TRY(create(s, bytes));
    s->total = total;
    return PST_OK;
}

pst_status rpc_shm_create_area(rpc_shm *s, size_t bytes)
{
    shm_empty(s);
    if (bytes > SIZE_MAX - RPC_SHM_HEADER)
        return pst_error_set(PST_ERR_NOMEM, "shared memory of %zu bytes: too large", bytes);
    return create(s, RPC_SHM_HEADER + bytes);
}

size_t rpc_shm_area_span(uint64_t length, size_t esize)
{
    return ((size_t)length * esize + 63) / 64 * 64;
}

void *rpc_shm_area(const rpc_shm *s)
{
    return s->base ? s->base + RPC_SHM_HEADER : NULL;
}

/* Maps `name` (a sealed memfd of a process on this host) with `bytes` bytes, checking the
 * nonce at its start. */
static pst_status attach(rpc_shm *s, const char *name, uint64_t nonce, size_t bytes,
                         int writable, const rpc_shm *mine)
{
    shm_empty(s);
    int pid = 0, fdn = 0, end = 0;
    if (!name || strlen(name) >= RPC_SHM_NAME_MAX ||
        sscanf(name, "/proc/%9d/fd/%9d%n", &pid, &fdn, &end) != 2 || name[end] != '\0' ||
        pid <= 0 || fdn < 0)
        return pst_error_set(PST_ERR_UNAVAILABLE, "shared memory %.80s: not a "
                             "/proc/<pid>/fd/<fd> name", name ? name : "(none)");
    if (!bytes || nonce == 0)
        return pst_error_set(PST_ERR_UNAVAILABLE, "shared memory %s: no segment of %zu bytes "
                             "with nonce %llu", name, bytes, (unsigned long long)nonce);
    /* Opened for real only once it is known to be a regular file on tmpfs (where memfds
     * live): an O_PATH descriptor first, which opens nothing (no device's open, no FUSE
     * daemon's), then the same file again through it, non-blocking. */
    int path = open(name, O_PATH | O_CLOEXEC);
    if (path < 0)
        return pst_error_set(PST_ERR_UNAVAILABLE, "shared memory %s: %s (another host or "
                             "container)", name, strerror(errno));
    struct statfs fs;
    struct stat sb;
    if (fstatfs(path, &fs) != 0 || fs.f_type != TMPFS_MAGIC || fstat(path, &sb) != 0 ||
        !S_ISREG(sb.st_mode)) {
        close(path);
        return pst_error_set(PST_ERR_UNAVAILABLE, "shared memory %s: not a memfd (a regular "
                             "file on tmpfs)", name);
    }
    if (mine && mine->base && sb.st_dev == mine->dev && sb.st_ino == mine->ino) {
        close(path);
        return pst_error_set(PST_ERR_UNAVAILABLE, "shared memory %s: a segment of this process "
                             "(its values area), not the trainer's", name);
    }
    char again[40];
    snprintf(again, sizeof again, "/proc/self/fd/%d", path);
    int fd = open(again, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    close(path);
    if (fd < 0)
        return pst_error_set(PST_ERR_UNAVAILABLE, "shared memory %s: %s", name,
                             strerror(errno));
    const int seals = fcntl(fd, F_GET_SEALS);
    pst_status st = PST_OK;
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
        st = pst_error_set(PST_ERR_UNAVAILABLE, "shared memory %s: not a memfd sealed "
                           "against shrinking", name);
    else if ((uint64_t)sb.st_size < bytes)
        st = pst_error_set(PST_ERR_UNAVAILABLE, "shared memory %s: %lld bytes, the blocks "
                           "need %zu", name, (long long)sb.st_size, bytes);
    void *base = MAP_FAILED;
    if (st == PST_OK) {
        base = mmap(NULL, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd,
                    0);
        if (base == MAP_FAILED)
            st = pst_error_set(PST_ERR_UNAVAILABLE, "shared memory %s: mmap: %s", name,
                               strerror(errno));
    }
    close(fd);
    if (st != PST_OK)
        return st;
    if (memcmp(base, &nonce, sizeof nonce) != 0) {
        munmap(base, bytes);
        return pst_error_set(PST_ERR_UNAVAILABLE, "shared memory %s: another nonce (not the "
                             "trainer's segment)", name);
    }
    s->base = base;
    s->bytes = bytes;
    s->nonce = nonce;
    s->dev = sb.st_dev;
    s->ino = sb.st_ino;
    snprintf(s->name, sizeof s->name, "%s", name);
    return PST_OK;
}

pst_status rpc_shm_attach(rpc_shm *s, const char *name, uint64_t nonce, uint64_t total,
                          const rpc_shm *mine)
{
    const size_t bytes = rpc_shm_bytes(total);
    PST_TRY(attach(s, name, nonce, bytes, 1, mine));
    s->total = total;
    return PST_OK;
}

pst_status rpc_shm_attach_area(rpc_shm *s, const char *name, uint64_t nonce, size_t bytes)
{
    if (bytes > SIZE_MAX - RPC_SHM_HEADER)
        bytes = 0;
    return attach(s, name, nonce, bytes ? RPC_SHM_HEADER + bytes : 0, 0, NULL);
}

static void *slot(const rpc_shm *s, uint64_t first, uint64_t shard_off, uint64_t length)
{
    if (!s->base || shard_off > s->total || length > s->total - shard_off)
        return NULL;
    return s->base + RPC_SHM_HEADER + (size_t)(first + shard_off) * 4;
}

void *rpc_shm_push_slot(const rpc_shm *s, uint64_t shard_off, uint64_t length)
{
    return slot(s, 0, shard_off, length);
}

void *rpc_shm_pull_slot(const rpc_shm *s, uint64_t shard_off, uint64_t length)
{
    return slot(s, s->total, shard_off, length);
}

void rpc_shm_free(rpc_shm *s)
{
    if (!s->base)
        return; /* empty (or all zeros: never made) */
    munmap(s->base, s->bytes);
    if (s->fd >= 0)
        close(s->fd);
    shm_empty(s);
}
