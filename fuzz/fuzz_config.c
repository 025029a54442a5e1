/* fuzz_config.c — the configuration parser (common/config.c) through pst_config_load():
 * the command line and the environment together.
 *
 * Input: [u8: bit 0 the role (trainer, pserver)][NUL-separated strings]. The strings up
 * to the first empty one are argv[1..] (argv[0] is the program); the strings after it are
 * the environment, NAME=VALUE each (a string without '=' is ignored), looked up by the
 * parser through a table instead of getenv. A loaded configuration must print (as
 * --check-config does). Run it with stdin from /dev/null: --token-file=/dev/stdin reads it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "fuzz/fuzz_util.h"

enum { MAX_STRINGS = 256 };

static char *env_names[MAX_STRINGS], *env_values[MAX_STRINGS];
static int nenv;

static const char *env_lookup(const char *name)
{
    for (int i = nenv - 1; i >= 0; i--) /* the last one wins, as in a shell */
        if (strcmp(env_names[i], name) == 0)
            return env_values[i];
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *devnull;
    if (!devnull) {
        fuzz_quiet();
        devnull = fopen("/dev/null", "w");
        FUZZ_CHECK(devnull != NULL, "cannot open /dev/null");
    }
    if (size < 1)
        return 0;
    const pst_role role = data[0] & 1 ? PST_ROLE_PSERVER : PST_ROLE_TRAINER;
    /* A NUL-terminated copy: every string ends inside it. */
    char *buf = malloc(size);
    FUZZ_CHECK(buf != NULL, "out of memory");
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    char *argv[MAX_STRINGS + 1];
    int argc = 0, in_env = 0;
    argv[argc++] = "fuzz_config";
    nenv = 0;
    for (char *s = buf, *next; s < buf + size - 1; s = next) {
        next = s + strlen(s) + 1;
        char *eq = strchr(s, '=');
        if (!in_env && *s == '\0')
            in_env = 1;
        else if (!in_env && argc < MAX_STRINGS)
            argv[argc++] = s;
        else if (in_env && eq && nenv < MAX_STRINGS) {
            *eq = '\0';
            env_names[nenv] = s;
            env_values[nenv++] = eq + 1;
        }
    }
    argv[argc] = NULL;

    pst_config *cfg = malloc(sizeof *cfg);
    FUZZ_CHECK(cfg != NULL, "out of memory");
    pst_status st = pst_config_load(cfg, role, argc, argv, env_lookup);
    if (st != PST_OK) {
        FUZZ_CHECK(st == PST_ERR_INVALID, "a bad configuration is PST_ERR_INVALID");
        FUZZ_CHECK(pst_error_detail()[0] != '\0', "a bad configuration says why");
    } else {
        FUZZ_CHECK(cfg->role == role, "the role is the program's");
        FUZZ_CHECK(cfg->num_pservers >= 0 && cfg->num_pservers <= PST_MAX_PSERVERS,
                   "pserver count in range");
        pst_config_print(devnull, cfg);
    }
    free(cfg);
    free(buf);
    return 0;
}
