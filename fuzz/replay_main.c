/* replay_main.c — runs a fuzz target over corpus files without libFuzzer: the regression
 * test of the normal build (ctest label fuzz-replay, part of make test).
 *
 * usage: fuzz_<name> PATH...   each PATH a file or a directory (its regular files, one
 * level, in name order). Feeds every file to LLVMFuzzerTestOneInput once and prints
 * "fuzz_<name>: N inputs replayed"; exits 1 when a path cannot be read or there were no
 * inputs at all (a corpus went missing). A crash is the target's own abort or sanitizer
 * report. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz/fuzz_util.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    const int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "%s: cannot read it\n", path);
        free(buf);
        return -1;
    }
    /* An exact-size copy, so ASan sees a read past the input as libFuzzer would. */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv)
{
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    long count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            perror(argv[i]);
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            if (run_file(argv[i]) != 0)
                return 1;
            count++;
            continue;
        }
        struct dirent **names;
        const int n = scandir(argv[i], &names, NULL, by_name);
        if (n < 0) {
            perror(argv[i]);
            return 1;
        }
        int failed = 0;
        for (int k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
            if (!failed && names[k]->d_name[0] != '.' && stat(path, &sb) == 0 &&
                S_ISREG(sb.st_mode)) {
                if (run_file(path) != 0)
                    failed = 1;
                else
                    count++;
            }
            free(names[k]);
        }
        free(names);
        if (failed)
            return 1;
    }
    printf("%s: %ld inputs replayed\n", prog, count);
    if (count == 0) {
        fprintf(stderr, "%s: no inputs (usage: %s FILE-OR-DIR...)\n", prog, prog);
        return 1;
    }
    return 0;
}
