/* ctr_synth_main.c — the `ctr-synth` program (scripts/ctr-synth runs it): writes a
 * planted-truth click file for `trainer --model dlrm --dataset ctr --data FILE` with the
 * flags of ../shared/peers/ctr_synth.py, and prints the peer's one JSON line on stdout.
 * The generator is common/data/ctr_synth.h; this file only parses and prints.
 * Exit status: 0 written, 2 bad flags, 1 other failures (the file, memory). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/data/ctr_synth.h"

static const char usage[] =
    "usage: ctr-synth --out FILE [--flag value | --flag=value] ...\n"
    "Planted-truth click-through data (the format of trainer --dataset ctr): every row's\n"
    "true click probability is stored, so the Bayes-optimal AUC and log loss of the test\n"
    "part are known (in the header and the JSON line this prints).\n"
    "  --rows 2000000      rows, training and test\n"
    "  --test-frac 0.1     the last round(rows * frac) rows are the test part\n"
    "  --fields 26         sparse fields F\n"
    "  --dense 13          dense features D, x ~ N(0, 1)\n"
    "  --rank 4            k of the true vectors v[f,i] ~ N(0, 0.25^2 I_k)\n"
    "  --pairs 40          random field pairs whose <v, v> enter the logit\n"
    "  --min-vocab 10      vocabularies log-spaced from this ...\n"
    "  --max-vocab 1000000 ... to this (ids are u32: at most 4294967295)\n"
    "  --zipf 1.1          Zipf exponent of the ids (0: uniform)\n"
    "  --ctr 0.25          mean click rate (the bias is set to it)\n"
    "  --seed 1            the same seed gives the same bytes\n"
    "  --out FILE          the file to write (required)\n"
    "  --threads 0         threads, 0 = one per CPU (not the peer's; the bytes do not change)\n";

/* Parses `v` as flag's value into *out; one line naming the flag otherwise. */
static int parse_u64(const char *flag, const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    const unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || errno || strchr(v, '-')) {
        fprintf(stderr, "ctr-synth: %s %s: want a whole number >= 0\n", flag, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_int(const char *flag, const char *v, int *out)
{
    char *end;
    errno = 0;
    const long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < -1000000000L || x > 1000000000L) {
        fprintf(stderr, "ctr-synth: %s %s: want a whole number\n", flag, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_double(const char *flag, const char *v, double *out)
{
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    if (!*v || *end || errno || !isfinite(x)) {
        fprintf(stderr, "ctr-synth: %s %s: want a number\n", flag, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_args(int argc, char **argv, pst_ctr_synth_config *cfg, const char **out)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            exit(0);
        }
        char flag[32];
        const size_t len = eq ? (size_t)(eq - a) : strlen(a);
        if (strncmp(a, "--", 2) != 0 || len >= sizeof flag) {
            fprintf(stderr, "ctr-synth: %s: not a flag (--help lists them)\n", a);
            return -1;
        }
        memcpy(flag, a, len);
        flag[len] = '\0';
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "ctr-synth: %s needs a value (--help lists the flags)\n", flag);
            return -1;
        }
        int rc;
        if (!strcmp(flag, "--rows"))
            rc = parse_u64(flag, v, &cfg->rows);
        else if (!strcmp(flag, "--test-frac"))
            rc = parse_double(flag, v, &cfg->test_frac);
        else if (!strcmp(flag, "--fields"))
            rc = parse_int(flag, v, &cfg->fields);
        else if (!strcmp(flag, "--dense"))
            rc = parse_int(flag, v, &cfg->dense);
        else if (!strcmp(flag, "--rank"))
            rc = parse_int(flag, v, &cfg->rank);
        else if (!strcmp(flag, "--pairs"))
            rc = parse_int(flag, v, &cfg->pairs);
        else if (!strcmp(flag, "--min-vocab"))
            rc = parse_u64(flag, v, &cfg->min_vocab);
        else if (!strcmp(flag, "--max-vocab"))
            rc = parse_u64(flag, v, &cfg->max_vocab);
        else if (!strcmp(flag, "--zipf"))
            rc = parse_double(flag, v, &cfg->zipf);
        else if (!strcmp(flag, "--ctr"))
            rc = parse_double(flag, v, &cfg->ctr);
        else if (!strcmp(flag, "--seed"))
            rc = parse_u64(flag, v, &cfg->seed);
        else if (!strcmp(flag, "--threads"))
            rc = parse_int(flag, v, &cfg->threads);
        else if (!strcmp(flag, "--out")) {
            *out = v;
            rc = 0;
        } else {
            fprintf(stderr, "ctr-synth: %s: no such flag (--help lists them)\n", flag);
            rc = -1;
        }
        if (rc)
            return -1;
    }
    if (!*out) {
        fprintf(stderr, "ctr-synth: --out FILE is required (example: ctr-synth --rows 200000 "
                "--out ctr.bin)\n");
        return -1;
    }
    return 0;
}

/* x rounded to `digits` decimals as Python's json prints round(x, digits). */
static void print_rounded(double x, int digits)
{
    if (isnan(x)) {
        fputs("NaN", stdout);
        return;
    }
    char s[64];
    snprintf(s, sizeof s, "%.*f", digits, x);
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '0' && s[n - 2] != '.')
        s[--n] = '\0';
    fputs(s, stdout);
}

static void print_json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

int main(int argc, char **argv)
{
    pst_ctr_synth_config cfg;
    pst_ctr_synth_defaults(&cfg);
    const char *out = NULL;
    if (parse_args(argc, argv, &cfg, &out))
        return 2;
    pst_ctr_synth_stats st;
    const pst_status s = pst_ctr_synth_write(out, &cfg, &st);
    if (s != PST_OK) {
        fprintf(stderr, "ctr-synth: %s\n", pst_error_detail());
        return s == PST_ERR_INVALID ? 2 : 1;
    }
    printf("{\"rows\": %llu, \"test_rows\": %llu, \"fields\": %d, \"dense\": %d, "
           "\"vocab_total\": %llu, \"distinct_ids_train\": %llu, \"ctr\": ",
           (unsigned long long)st.rows, (unsigned long long)st.test_rows, cfg.fields, cfg.dense,
           (unsigned long long)st.vocab_total, (unsigned long long)st.distinct_ids_train);
    print_rounded(st.ctr, 4);
    fputs(", \"bayes_auc_test\": ", stdout);
    print_rounded(st.bayes_auc, 5);
    fputs(", \"bayes_logloss_test\": ", stdout);
    print_rounded(st.bayes_logloss, 5);
    fputs(", \"out\": ", stdout);
    print_json_string(out);
    fputs("}\n", stdout);
    return fflush(stdout) == 0 ? 0 : 1;
}
