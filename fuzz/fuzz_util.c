/* fuzz_util.c — temporary files and checks for the fuzz targets (see fuzz_util.h). */
#include "fuzz/fuzz_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

static char dir[PATH_MAX];

/* Removes the directory's files (one level: the targets make no subdirectories) and it. */
static void remove_dir(void)
{
    DIR *d = opendir(dir);
    if (d) {
        char path[PATH_MAX + 256];
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

const char *fuzz_dir(void)
{
    if (dir[0])
        return dir;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/pstrain-fuzz-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(remove_dir);
    return dir;
}

const char *fuzz_write(const char *name, const void *data, size_t size)
{
    static char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FUZZ_CHECK(fd >= 0, "fuzz: cannot create a temporary file");
    const uint8_t *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        FUZZ_CHECK(n > 0, "fuzz: cannot write a temporary file");
        p += n;
        size -= (size_t)n;
    }
    close(fd);
    return path;
}

uint64_t fuzz_hash(uint64_t h, const void *p, size_t n)
{
    return pst_fnv1a(h, p, n);
}

uint64_t fuzz_hash_u64(uint64_t h, uint64_t v)
{
    return fuzz_hash(h, &v, sizeof v);
}

uint64_t fuzz_hash_str(uint64_t h, const char *s)
{
    return s ? fuzz_hash(h, s, strlen(s) + 1) : fuzz_hash(h, "", 1);
}

void fuzz_quiet(void)
{
    pst_log_set_level(PST_LOG_OFF);
}

void fuzz_check_(int ok, const char *what, const char *file, int line)
{
    if (ok)
        return;
    fprintf(stderr, "%s:%d: fuzz check failed: %s\n", file, line, what);
    abort();
}
