/* model_dir.c - finds the model directory for the `mha` commands (see
 * model_dir.h for the order). */
#include "model_dir.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_dir(const char *path) {
    struct stat s;
    return stat(path, &s) == 0 && S_ISDIR(s.st_mode);
}

static int has_config(const char *dir) {
    char p[PATH_MAX];
    struct stat s;
    if (snprintf(p, sizeof p, "%s/config.json", dir) >= (int)sizeof p)
        return 0;
    return stat(p, &s) == 0 && S_ISREG(s.st_mode);
}

static int copy_out(const char *path, char *out, size_t cap) {
    if (strlen(path) + 1 > cap) {
        fprintf(stderr, "mha: model directory path too long: %s\n", path);
        return 1;
    }
    memcpy(out, path, strlen(path) + 1);
    return 0;
}

int mha_cli_model_dir(const char *flag, char *out, size_t cap) {
    if (flag || (getenv("MHA_MODEL_DIR") && getenv("MHA_MODEL_DIR")[0])) {
        const char *dir = flag ? flag : getenv("MHA_MODEL_DIR");
        if (!is_dir(dir)) {
            fprintf(stderr, "mha: model directory '%s' (%s) does not exist; `make model` in the "
                    "mha checkout fetches all-MiniLM-L6-v2 into " MHA_CLI_DEFAULT_MODEL "\n",
                    dir, flag ? "--model" : "MHA_MODEL_DIR");
            return 1;
        }
        return copy_out(dir, out, cap);
    }
    if (has_config(MHA_CLI_DEFAULT_MODEL))
        return copy_out(MHA_CLI_DEFAULT_MODEL, out, cap);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        for (int up = 0; up < 2; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash)
                break;
            *slash = '\0'; /* exe: the executable's directory, then its parent */
            char p[PATH_MAX];
            if (snprintf(p, sizeof p, "%s/" MHA_CLI_DEFAULT_MODEL, exe) < (int)sizeof p &&
                has_config(p))
                return copy_out(p, out, cap);
        }
    }
    fprintf(stderr, "mha: no model found (tried --model, MHA_MODEL_DIR, ./" MHA_CLI_DEFAULT_MODEL
            " and beside the executable); run `make model` in the mha checkout to fetch "
            "all-MiniLM-L6-v2, or pass --model DIR\n");
    return 1;
}
