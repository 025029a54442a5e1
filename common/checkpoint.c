/* checkpoint.c — checkpoint files (see checkpoint.h). */
#include "common/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static const char MAGIC[8] = {'P', 'S', 'T', 'C', 'K', 'P', 'T', '1'};
static const char END[8] = {'P', 'S', 'T', 'E', 'N', 'D', '!', '!'};

static void name_of(char *out, size_t size, const char *dir, long step)
{
    snprintf(out, size, "%s/step-%012ld.ckpt", dir, step);
}

/* mkdir -p */
static pst_status make_dir(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return pst_error_set(PST_ERR_IO, "checkpoint directory %s: name too long", dir);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        const char c = *p;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return pst_error_set(PST_ERR_IO, "checkpoint directory %s: cannot create %s: %s",
                                 dir, path, strerror(errno));
        *p = c;
        if (!c)
            break;
    }
    return PST_OK;
}

static pst_status put(pst_ckpt_writer *w, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, w->f) != n)
        return pst_error_set(PST_ERR_IO, "checkpoint %s: write failed: %s", w->tmp,
                             strerror(errno));
    return PST_OK;
}

pst_status pst_ckpt_begin(pst_ckpt_writer *w, const char *dir, long step)
{
    memset(w, 0, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->step = step;
    PST_TRY(make_dir(dir));
    name_of(w->path, sizeof w->path, dir, step);
    snprintf(w->tmp, sizeof w->tmp, "%s/.step-%012ld.ckpt.tmp", dir, step);
    /* Created anew (O_EXCL after removing what was there), never opened as found: a FIFO
     * or a link planted under this name would block the writer or redirect it. */
    if (unlink(w->tmp) != 0 && errno != ENOENT)
        return pst_error_set(PST_ERR_IO, "checkpoint %s: cannot create (the name is "
                             "taken): %s", w->tmp, strerror(errno));
    const int fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        pst_status st = pst_error_set(PST_ERR_IO, "checkpoint %s: cannot create: %s", w->tmp,
                                      strerror(errno));
        if (fd >= 0)
            close(fd);
        return st;
    }
    const uint64_t s = (uint64_t)step;
    const uint32_t zero = 0;
    pst_status st = put(w, MAGIC, sizeof MAGIC);
    if (st == PST_OK)
        st = put(w, &s, sizeof s);
    if (st == PST_OK) /* the section count, written at commit */
        st = put(w, &zero, sizeof zero);
    if (st != PST_OK)
        pst_ckpt_abort(w);
    return st;
}

pst_status pst_ckpt_section(pst_ckpt_writer *w, uint32_t tag, const void *data, size_t bytes)
{
    if (w->nsections == PST_CKPT_MAX_SECTIONS)
        return pst_error_set(PST_ERR_INVALID, "checkpoint %s: more than %d sections", w->path,
                             PST_CKPT_MAX_SECTIONS);
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t at = 0; at < bytes;) { /* crc32 takes a uInt length */
        const size_t n = bytes - at < (1u << 30) ? bytes - at : (1u << 30);
        crc = crc32(crc, (const Bytef *)data + at, (uInt)n);
        at += n;
    }
    const uint64_t b = bytes;
    const uint32_t c = (uint32_t)crc;
    PST_TRY(put(w, &tag, sizeof tag));
    PST_TRY(put(w, &b, sizeof b));
    PST_TRY(put(w, &c, sizeof c));
    PST_TRY(put(w, data, bytes));
    w->nsections++;
    return PST_OK;
}

pst_status pst_ckpt_commit(pst_ckpt_writer *w)
{
    pst_status st = put(w, END, sizeof END);
    if (st == PST_OK && (fseek(w->f, (long)(sizeof MAGIC + sizeof(uint64_t)), SEEK_SET) != 0 ||
                         fwrite(&w->nsections, sizeof w->nsections, 1, w->f) != 1))
        st = pst_error_set(PST_ERR_IO, "checkpoint %s: write failed: %s", w->tmp,
                           strerror(errno));
    if (st == PST_OK && (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
        st = pst_error_set(PST_ERR_IO, "checkpoint %s: flush failed: %s", w->tmp,
                           strerror(errno));
    if (st != PST_OK) {
        pst_ckpt_abort(w);
        return st;
    }
    fclose(w->f);
    w->f = NULL;
    if (rename(w->tmp, w->path) != 0) {
        st = pst_error_set(PST_ERR_IO, "checkpoint %s: rename failed: %s", w->path,
                           strerror(errno));
        unlink(w->tmp);
        return st;
    }
    int fd = open(w->dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0)
        st = pst_error_set(PST_ERR_IO, "checkpoint directory %s: fsync failed: %s", w->dir,
                           strerror(errno));
    if (fd >= 0)
        close(fd);
    return st;
}

void pst_ckpt_abort(pst_ckpt_writer *w)
{
    if (w->f) {
        fclose(w->f);
        w->f = NULL;
        unlink(w->tmp);
    }
}

/* pread of exactly n bytes at `at`. */
static int read_at(int fd, void *p, size_t n, uint64_t at)
{
    for (size_t got = 0; got < n;) {
        const ssize_t k = pread(fd, (char *)p + got, n - got, (off_t)(at + got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return 0;
        got += (size_t)k;
    }
    return 1;
}

/* The file's header and section table, read before any section: its step and section
 * count must be what the name says, and the sections' declared sizes must add up to the
 * file's size exactly, so nothing is allocated or read for a file that is not a
 * checkpoint (a sparse file of 1 GiB costs 20 bytes of reading). */
static pst_status check_layout(int fd, const char *path, long step, uint64_t size,
                               uint32_t *nsections)
{
    unsigned char h[20];
    if (size < sizeof h + sizeof END || !read_at(fd, h, sizeof h, 0) ||
        memcmp(h, MAGIC, sizeof MAGIC) != 0)
        return pst_error_set(PST_ERR_FORMAT, "checkpoint %s: not a pstrain checkpoint (no "
                             "PSTCKPT1 header)", path);
    uint64_t s;
    uint32_t n;
    memcpy(&s, h + 8, 8);
    memcpy(&n, h + 16, 4);
    if ((long)s != step)
        return pst_error_set(PST_ERR_FORMAT, "checkpoint %s: holds step %llu, not %ld", path,
                             (unsigned long long)s, step);
    if (n > PST_CKPT_MAX_SECTIONS)
        return pst_error_set(PST_ERR_FORMAT, "checkpoint %s: %u sections (corrupted header)",
                             path, n);
    uint64_t at = sizeof h;
    for (uint32_t i = 0; i < n; i++) {
        unsigned char sh[16];
        uint64_t bytes;
        if (size - at < sizeof sh || !read_at(fd, sh, sizeof sh, at))
            return pst_error_set(PST_ERR_FORMAT, "checkpoint %s: truncated in section %u of %u",
                                 path, i + 1, n);
        memcpy(&bytes, sh + 4, 8);
        at += sizeof sh;
        if (bytes > size - at)
            return pst_error_set(PST_ERR_FORMAT, "checkpoint %s: truncated in section %u of %u "
                                 "(%llu bytes announced, %llu left)", path, i + 1, n,
                                 (unsigned long long)bytes, (unsigned long long)(size - at));
        at += bytes;
    }
    if (size - at != sizeof END)
        return pst_error_set(PST_ERR_FORMAT, "checkpoint %s: no end marker after %u sections "
                             "(truncated or trailing bytes)", path, n);
    *nsections = n;
    return PST_OK;
}

pst_status pst_ckpt_read(pst_ckpt *c, const char *dir, long step)
{
    memset(c, 0, sizeof *c);
    char path[4160];
    name_of(path, sizeof path, dir, step);
    /* Non-blocking and checked by fstat before any read: a FIFO or a device named like a
     * checkpoint is refused at once instead of blocking the reader (a pserver holds its
     * service lock here). */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return pst_error_set(errno == ENOENT ? PST_ERR_NOT_FOUND : PST_ERR_IO,
                             "checkpoint %s: %s", path, strerror(errno));
    struct stat sb;
    uint32_t n = 0;
    pst_status st = PST_OK;
    if (fstat(fd, &sb) != 0)
        st = pst_error_set(PST_ERR_IO, "checkpoint %s: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = pst_error_set(PST_ERR_FORMAT, "checkpoint %s: not a regular file", path);
    else if ((uint64_t)sb.st_size > SIZE_MAX / 2)
        st = pst_error_set(PST_ERR_FORMAT, "checkpoint %s: %lld bytes (too large)", path,
                           (long long)sb.st_size);
    else
        st = check_layout(fd, path, step, (uint64_t)sb.st_size, &n);
    if (st == PST_OK) {
        c->size = (size_t)sb.st_size;
        if (!(c->buf = malloc(c->size)))
            st = pst_error_set(PST_ERR_NOMEM, "checkpoint %s: out of memory (%zu bytes)", path,
                               c->size);
        else if (!read_at(fd, c->buf, c->size, 0))
            st = pst_error_set(PST_ERR_IO, "checkpoint %s: read failed", path);
    }
    close(fd);
    /* The layout again, on the bytes read (the file may have changed since), with the
     * checksums. */
    const unsigned char *p = c->buf, *e = c->buf + c->size;
    if (st == PST_OK) {
        if (memcmp(p, MAGIC, sizeof MAGIC) != 0 || memcmp(p + 16, &n, 4) != 0)
            st = pst_error_set(PST_ERR_FORMAT, "checkpoint %s: changed while read", path);
        p += 20;
    }
    for (uint32_t i = 0; st == PST_OK && i < n; i++) {
        uint32_t tag, crc;
        uint64_t bytes;
        if ((size_t)(e - p) < 16) {
            st = pst_error_set(PST_ERR_FORMAT, "checkpoint %s: truncated in section %u of %u",
                               path, i + 1, n);
            break;
        }
        memcpy(&tag, p, 4);
        memcpy(&bytes, p + 4, 8);
        memcpy(&crc, p + 12, 4);
        p += 16;
        if (bytes > (uint64_t)(e - p)) {
            st = pst_error_set(PST_ERR_FORMAT, "checkpoint %s: changed while read", path);
            break;
        }
        uLong got = crc32(0L, Z_NULL, 0);
        for (uint64_t at = 0; at < bytes;) {
            const uint64_t k = bytes - at < (1u << 30) ? bytes - at : (1u << 30);
            got = crc32(got, p + at, (uInt)k);
            at += k;
        }
        if ((uint32_t)got != crc) {
            st = pst_error_set(PST_ERR_FORMAT, "checkpoint %s: section %u (tag %u) fails its "
                               "checksum (corrupted)", path, i + 1, tag);
            break;
        }
        c->sec[i].tag = tag;
        c->sec[i].data = p;
        c->sec[i].bytes = bytes;
        p += bytes;
    }
    if (st == PST_OK && ((size_t)(e - p) != sizeof END || memcmp(p, END, sizeof END) != 0))
        st = pst_error_set(PST_ERR_FORMAT, "checkpoint %s: no end marker after %u sections "
                           "(truncated or trailing bytes)", path, n);
    if (st != PST_OK) {
        pst_ckpt_free(c);
        return st;
    }
    c->step = step;
    c->nsections = (int)n;
    return PST_OK;
}

const void *pst_ckpt_find(const pst_ckpt *c, uint32_t tag, uint64_t *bytes)
{
    for (int i = 0; i < c->nsections; i++)
        if (c->sec[i].tag == tag) {
            *bytes = c->sec[i].bytes;
            return c->sec[i].data;
        }
    *bytes = 0;
    return NULL;
}

void pst_ckpt_free(pst_ckpt *c)
{
    free(c->buf);
    memset(c, 0, sizeof *c);
}

static int cmp_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

int pst_ckpt_list(const char *dir, long *steps, int max)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    long all[4096];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && n < 4096;) {
        long s;
        char tail[8];
        if (sscanf(e->d_name, "step-%ld.ckp%1s", &s, tail) == 2 && tail[0] == 't' &&
            strlen(e->d_name) == strlen("step-000000000000.ckpt") && s >= 0)
            all[n++] = s;
    }
    closedir(d);
    qsort(all, (size_t)n, sizeof all[0], cmp_desc);
    n = n < max ? n : max;
    memcpy(steps, all, sizeof(long) * (size_t)n);
    return n;
}

pst_status pst_ckpt_prune(const char *dir, int keep)
{
    long steps[4096];
    const int n = pst_ckpt_list(dir, steps, 4096);
    for (int i = keep; i < n; i++) {
        char path[4160];
        name_of(path, sizeof path, dir, steps[i]);
        if (unlink(path) != 0 && errno != ENOENT)
            return pst_error_set(PST_ERR_IO, "checkpoint %s: cannot remove: %s", path,
                                 strerror(errno));
    }
    return PST_OK;
}
