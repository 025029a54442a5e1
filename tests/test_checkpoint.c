/* test_checkpoint.c — checkpoint files (common/checkpoint.c): a written file reads back
 * section by section; a truncated file, a flipped byte, a wrong magic, a file under another
 * step's name and trailing bytes are each one error naming the file and the problem;
 * listing is newest first and pruning keeps the newest; a failed write leaves the earlier
 * file of that step intact. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/checkpoint.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/pstrain-test-ckpt-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(checkpoint, .init = setup, .fini = teardown);

static void write_one(long step, float base)
{
    float v[1000];
    for (int i = 0; i < 1000; i++)
        v[i] = base + (float)i;
    const char meta[] = "meta";
    pst_ckpt_writer w;
    cr_assert_eq(pst_ckpt_begin(&w, dir, step), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(pst_ckpt_section(&w, 7, meta, sizeof meta), PST_OK);
    cr_assert_eq(pst_ckpt_section(&w, 9, v, sizeof v), PST_OK);
    cr_assert_eq(pst_ckpt_commit(&w), PST_OK, "%s", pst_error_detail());
}

static char *path_of(long step)
{
    static char p[160];
    snprintf(p, sizeof p, "%s/step-%012ld.ckpt", dir, step);
    return p;
}

Test(checkpoint, sections_read_back)
{
    write_one(5, 1.0f);
    pst_ckpt c;
    cr_assert_eq(pst_ckpt_read(&c, dir, 5), PST_OK, "%s", pst_error_detail());
    uint64_t bytes;
    const char *m = pst_ckpt_find(&c, 7, &bytes);
    cr_assert_str_eq(m, "meta");
    const float *v = pst_ckpt_find(&c, 9, &bytes);
    cr_assert_eq(bytes, 4000);
    cr_assert_eq(v[999], 1000.0f);
    cr_assert_null(pst_ckpt_find(&c, 3, &bytes));
    pst_ckpt_free(&c);
    cr_assert_eq(pst_ckpt_read(&c, dir, 6), PST_ERR_NOT_FOUND);
}

/* Damage at byte `at` (flip) or truncation to `size`; the read must fail FORMAT saying
 * `says` and naming the file. */
static void expect_damage(long at, long size, const char *says)
{
    write_one(5, 1.0f);
    if (size >= 0) {
        cr_assert_eq(truncate(path_of(5), size), 0);
    } else {
        FILE *f = fopen(path_of(5), "r+b");
        fseek(f, at, SEEK_SET);
        int c = fgetc(f);
        fseek(f, at, SEEK_SET);
        fputc(c ^ 1, f);
        fclose(f);
    }
    pst_ckpt c;
    cr_assert_eq(pst_ckpt_read(&c, dir, 5), PST_ERR_FORMAT, "at %ld size %ld", at, size);
    cr_assert(strstr(pst_error_detail(), path_of(5)), "%s", pst_error_detail());
    cr_assert(strstr(pst_error_detail(), says), "%s", pst_error_detail());
    cr_assert_null(c.buf);
}

Test(checkpoint, damage_is_named)
{
    expect_damage(0, -1, "not a pstrain checkpoint");
    expect_damage(8, -1, "holds step");
    expect_damage(2000, -1, "checksum");
    expect_damage(-1, 3000, "truncated");
    expect_damage(-1, 4061, "no end marker"); /* 20 + 21 + 4016 + 8 bytes, cut in the end marker */
    /* trailing bytes */
    write_one(5, 1.0f);
    FILE *f = fopen(path_of(5), "ab");
    fputs("x", f);
    fclose(f);
    pst_ckpt c;
    cr_assert_eq(pst_ckpt_read(&c, dir, 5), PST_ERR_FORMAT);
    /* another step's file under this name */
    write_one(6, 1.0f);
    char six[160];
    snprintf(six, sizeof six, "%s", path_of(6)); /* path_of's buffer is static */
    cr_assert_eq(rename(six, path_of(5)), 0);
    cr_assert_eq(pst_ckpt_read(&c, dir, 5), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "holds step 6"), "%s", pst_error_detail());
}

Test(checkpoint, list_newest_first_and_prune)
{
    const long steps[] = {10, 100, 5, 55};
    for (int i = 0; i < 4; i++)
        write_one(steps[i], 0.0f);
    FILE *f = fopen(path_of(7), "w"); /* a name it must not take for a checkpoint: */
    fclose(f);
    char other[200];
    snprintf(other, sizeof other, "%s/step-12.ckpt", dir); /* not 12 digits */
    fclose(fopen(other, "w"));
    long got[8];
    int n = pst_ckpt_list(dir, got, 8);
    cr_assert_eq(n, 5); /* 7's file has the right name, even if empty */
    cr_assert(got[0] == 100 && got[1] == 55 && got[2] == 10 && got[3] == 7 && got[4] == 5);
    cr_assert_eq(pst_ckpt_prune(dir, 2), PST_OK);
    n = pst_ckpt_list(dir, got, 8);
    cr_assert(n == 2 && got[0] == 100 && got[1] == 55, "%d", n);
    cr_assert_eq(pst_ckpt_list("/nonexistent/dir", got, 8), 0);
}

/* A write that fails (its temporary name taken by a directory) says so and leaves the
 * earlier file of that step as it was. */
Test(checkpoint, failed_write_keeps_the_old_file)
{
    write_one(5, 1.0f);
    char tmp[200];
    snprintf(tmp, sizeof tmp, "%s/.step-000000000005.ckpt.tmp", dir);
    cr_assert_eq(mkdir(tmp, 0755), 0);
    pst_ckpt_writer w;
    cr_assert_eq(pst_ckpt_begin(&w, dir, 5), PST_ERR_IO);
    cr_assert(strstr(pst_error_detail(), "cannot create"), "%s", pst_error_detail());
    pst_ckpt_abort(&w);
    pst_ckpt c;
    cr_assert_eq(pst_ckpt_read(&c, dir, 5), PST_OK, "%s", pst_error_detail());
    pst_ckpt_free(&c);
    cr_assert_eq(pst_ckpt_begin(&w, "/dev/null/sub", 1), PST_ERR_IO);
    cr_assert(strstr(pst_error_detail(), "/dev/null/sub"), "%s", pst_error_detail());
}

/* What is named like a checkpoint but is no regular file is refused at once, without
 * blocking: a FIFO (opened for reading, it would wait for a writer for ever) and a
 * directory. */
Test(checkpoint, a_fifo_or_directory_named_like_one_is_refused_at_once, .timeout = 10)
{
    cr_assert_eq(mkfifo(path_of(8), 0600), 0);
    pst_ckpt c;
    cr_assert_eq(pst_ckpt_read(&c, dir, 8), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "not a regular file"), "%s", pst_error_detail());
    cr_assert_null(c.buf);
    cr_assert_eq(mkdir(path_of(9), 0755), 0);
    cr_assert_eq(pst_ckpt_read(&c, dir, 9), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "not a regular file"), "%s", pst_error_detail());
}

/* A FIFO planted under the writer's temporary name does not block the writer: the name is
 * created anew, and the checkpoint reads back. */
Test(checkpoint, a_fifo_at_the_temporary_name_does_not_block_the_writer, .timeout = 10)
{
    char tmp[200];
    snprintf(tmp, sizeof tmp, "%s/.step-000000000004.ckpt.tmp", dir);
    cr_assert_eq(mkfifo(tmp, 0600), 0);
    write_one(4, 2.0f);
    pst_ckpt c;
    cr_assert_eq(pst_ckpt_read(&c, dir, 4), PST_OK, "%s", pst_error_detail());
    pst_ckpt_free(&c);
}

/* A sparse file of 1 GiB named like a checkpoint is refused after its header (20 bytes
 * read), not read whole: this process's peak memory stays far below the file's size. The
 * same for a file with a valid header whose section announces more bytes than it holds. */
Test(checkpoint, a_huge_file_is_refused_by_its_header_without_reading_it)
{
    FILE *f = fopen(path_of(11), "wb");
    cr_assert_not_null(f);
    cr_assert_eq(ftruncate(fileno(f), (off_t)1 << 30), 0);
    fclose(f);
    pst_ckpt c;
    cr_assert_eq(pst_ckpt_read(&c, dir, 11), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "not a pstrain checkpoint"), "%s", pst_error_detail());
    write_one(12, 1.0f); /* then grown to 1 GiB: its sections no longer add up */
    cr_assert_eq(truncate(path_of(12), (off_t)1 << 30), 0);
    cr_assert_eq(pst_ckpt_read(&c, dir, 12), PST_ERR_FORMAT);
    cr_assert(strstr(pst_error_detail(), "no end marker"), "%s", pst_error_detail());
    struct rusage ru;
    cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
    cr_assert_lt(ru.ru_maxrss, 256 * 1024, "peak %ld KiB: the file was read", ru.ru_maxrss);
}
