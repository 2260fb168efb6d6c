/* fixture.c - reading PyTorch parity fixtures. */
#include "fixture.h"

#include <dirent.h>
#include <unistd.h>

static int cmp_names(const void *a, const void *b) { return strcmp(a, b); }

int fixture_list(const char *set, char names[][128], int max) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", test_fixture_root(), set);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= 128)
            continue;
        snprintf(names[n++], 128, "%.127s", e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, 128, cmp_names);
    return n;
}

bool fixture_open(fixture *f, const char *set, const char *name) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s/%s/%s", test_fixture_root(), set, name);
    char path[600];
    snprintf(path, sizeof path, "%s/config.txt", f->dir);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return false;
    char line[160];
    while (fgets(line, sizeof line, fp) && f->n < FIXTURE_MAX_KEYS) {
        char *eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = 0;
        line[strcspn(line, "\r\n")] = 0;
        eq[1 + strcspn(eq + 1, "\r\n")] = 0;
        snprintf(f->keys[f->n], sizeof f->keys[0], "%.31s", line);
        snprintf(f->values[f->n], sizeof f->values[0], "%.63s", eq + 1);
        f->n++;
    }
    fclose(fp);
    return true;
}

const char *fixture_str(const fixture *f, const char *key) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->keys[i], key))
            return f->values[i];
    return "";
}

int64_t fixture_int(const fixture *f, const char *key) { return atoll(fixture_str(f, key)); }

bool fixture_has(const fixture *f, const char *file) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", f->dir, file);
    return access(path, R_OK) == 0;
}

mha_status fixture_load(const fixture *f, const char *file, int want, mha_tensor *t) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", f->dir, file);
    if (want >= 0)
        return mha_npy_load(t, path, (mha_dtype)want);
    mha_dtype file_dtype;
    return mha_npy_load_any(t, &file_dtype, path, 1);
}

size_t fixture_numel(const mha_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return (size_t)n;
}

void fixture_compare(const char *case_name, const char *what, const float *y,
                     const mha_tensor *ref, double tol, double *worst) {
    double err = test_rel_err(y, ref->data, fixture_numel(ref));
    if (err > *worst)
        *worst = err;
    if (!(err <= tol))
        test_fail(__FILE__, __LINE__, "%s: %s error %.3g > %.0e", case_name, what, err, tol);
}

const mha_tensor *fixture_optional(const fixture *f, const char *file, int want, mha_tensor *t) {
    if (!fixture_has(f, file))
        return NULL;
    if (fixture_load(f, file, want, t) != MHA_OK) {
        test_fail(__FILE__, __LINE__, "%s/%s: %s", f->dir, file, mha_last_error());
        return NULL;
    }
    return t;
}

mha_causal fixture_causal(const fixture *f, const char *key) {
    const char *s = fixture_str(f, key);
    if (!strcmp(s, "top_left"))
        return MHA_CAUSAL_TOP_LEFT;
    if (!strcmp(s, "bottom_right"))
        return MHA_CAUSAL_BOTTOM_RIGHT;
    if (!strcmp(s, "offset"))
        return MHA_CAUSAL_OFFSET;
    return MHA_CAUSAL_NONE;
}

static int status_named(const char *name) {
    static const struct {
        const char *name;
        mha_status st;
    } map[] = {{"FORMAT", MHA_ERR_FORMAT},           {"OVERFLOW", MHA_ERR_OVERFLOW},
               {"UNSUPPORTED", MHA_ERR_UNSUPPORTED}, {"IO", MHA_ERR_IO},
               {"DTYPE", MHA_ERR_DTYPE},             {"SHAPE", MHA_ERR_SHAPE}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strcmp(name, map[i].name))
            return (int)map[i].st;
    return -1;
}

bool fixture_corpus_next(FILE *f, char *line, char *file, int *status, const char **needle) {
    while (fgets(line, 1024, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        line[strcspn(line, "\n")] = 0;
        char stname[32];
        int used = 0;
        if (sscanf(line, "%95s %31s %n", file, stname, &used) != 2) {
            file[0] = 0;
            *status = -1;
            *needle = line;
            return true;
        }
        *status = status_named(stname);
        *needle = line + used;
        return true;
    }
    return false;
}
