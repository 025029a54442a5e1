/* shm.c — payloads through shared memory on one host (see shm.h). */
#include "rpc/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
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

/* ---- the pserver's side: its trainers' segments --------------------------------------- */

pst_status rpc_shm_peers_attach(rpc_shm_peers *p, uint32_t n, uint32_t i, const char *name,
                                uint64_t nonce, uint64_t total, const rpc_shm *mine)
{
    if (!p->seg) {
        rpc_shm **all = n ? calloc(n, sizeof *all) : NULL;
        if (!all)
            return pst_error_set(PST_ERR_NOMEM, "shared memory of %u trainers: out of memory",
                                 n);
        p->n = n;
        __atomic_store_n(&p->seg, all, __ATOMIC_RELEASE);
    }
    if (i >= p->n)
        return pst_error_set(PST_ERR_INVALID, "shared memory of trainer %u: the job has %u",
                             i, p->n);
    rpc_shm *old = p->seg[i];
    if (old && p->nretired >= 2 * (size_t)p->n + 16)
        return pst_error_set(PST_ERR_LIMIT, "shared memory of trainer %u: %zu segments "
                             "replaced already", i, p->nretired);
    rpc_shm *seg = malloc(sizeof *seg);
    rpc_shm **retired = realloc(p->retired, (p->nretired + 1) * sizeof *retired);
    if (retired)
        p->retired = retired;
    if (!seg || !retired) {
        free(seg);
        return pst_error_set(PST_ERR_NOMEM, "shared memory of trainer %u: out of memory", i);
    }
    const pst_status st = rpc_shm_attach(seg, name, nonce, total, mine);
    if (st != PST_OK) {
        free(seg);
        return st;
    }
    if (old)
        p->retired[p->nretired++] = old;
    __atomic_store_n(&p->seg[i], seg, __ATOMIC_RELEASE);
    return PST_OK;
}

const rpc_shm *rpc_shm_peers_get(const rpc_shm_peers *p, uint32_t i)
{
    rpc_shm **all = __atomic_load_n(&p->seg, __ATOMIC_ACQUIRE);
    return all && i < p->n ? __atomic_load_n(&all[i], __ATOMIC_ACQUIRE) : NULL;
}

void rpc_shm_peers_free(rpc_shm_peers *p)
{
    for (uint32_t i = 0; p->seg && i < p->n; i++)
        if (p->seg[i]) {
            rpc_shm_free(p->seg[i]);
            free(p->seg[i]);
        }
    for (size_t i = 0; i < p->nretired; i++) {
        rpc_shm_free(p->retired[i]);
        free(p->retired[i]);
    }
    free(p->seg);
    free(p->retired);
    memset(p, 0, sizeof *p);
}

/* ---- the trainer's side: one pserver's link ------------------------------------------- */

pst_status rpc_shm_link_offer(rpc_shm_link *l, uint64_t total)
{
    rpc_shm_link_free(l);
    return rpc_shm_create(&l->seg, total);
}

int rpc_shm_link_answer(rpc_shm_link *l, int taken)
{
    l->on = taken && l->seg.base;
    if (!l->on)
        rpc_shm_free(&l->seg);
    return l->on;
}

pst_status rpc_shm_link_attach_area(rpc_shm_link *l, const char *name, uint64_t nonce,
                                    pst_dtype dtype, size_t bytes)
{
    if (!l->on)
        return pst_error_set(PST_ERR_STATE, "values area %.80s: no shared memory with this "
                             "pserver", name ? name : "(none)");
    PST_TRY(rpc_shm_attach_area(&l->area, name, nonce, bytes));
    l->area_dtype = dtype;
    return PST_OK;
}

void *rpc_shm_link_push_slot(const rpc_shm_link *l, uint64_t shard_off, uint64_t length)
{
    return l->on ? rpc_shm_push_slot(&l->seg, shard_off, length) : NULL;
}

void rpc_shm_link_pull_asks(const rpc_shm_link *l, pst_dtype dtype, int *slot, int *values)
{
    *slot = l->on;
    *values = l->area.base && dtype == l->area_dtype;
}

pst_status rpc_shm_link_pulled(const rpc_shm_link *l, int slot, int values,
                               const rpc_payload *in_call, uint64_t shard_off,
                               size_t area_off, uint64_t length, pst_dtype dtype,
                               rpc_payload *out)
{
    if (!slot && !values) {
        *out = in_call ? *in_call : (rpc_payload){0};
        return PST_OK;
    }
    const void *at = NULL;
    if (values)
        at = l->area.base && dtype == l->area_dtype
                 ? (const char *)rpc_shm_area(&l->area) + area_off
                 : NULL;
    else
        at = l->on ? rpc_shm_pull_slot(&l->seg, shard_off, length) : NULL;
    if (!at)
        return pst_error_set(PST_ERR_FORMAT, "answered in shared memory this trainer did not "
                             "set up with the pserver (%s)",
                             values ? "a values area" : "a pull slot");
    *out = rpc_payload_shared(at, (size_t)length * pst_dtype_size(dtype), 0);
    return PST_OK;
}

void rpc_shm_link_free(rpc_shm_link *l)
{
    rpc_shm_free(&l->seg);
    rpc_shm_free(&l->area);
    l->on = 0;
}
