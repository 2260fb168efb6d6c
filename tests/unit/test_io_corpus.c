/* test_io_corpus.c - every malformed file of tests/corpus (make_corpus.py)
 * is rejected with the status and message listed in expected.txt, every
 * file there is listed, and nothing leaks on the way (ASan build). */
#include "test.h"

#include <dirent.h>

static const char *corpus_root(void) {
    const char *r = getenv("MHA_CORPUS");
    return r ? r : "tests/corpus";
}

static int status_of(const char *name) {
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

TEST(io_corpus_each_file_fails_as_listed) {
    char path[512];
    snprintf(path, sizeof path, "%s/expected.txt", corpus_root());
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    char line[1024], listed[256][96];
    int n = 0, checked = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        line[strcspn(line, "\n")] = 0;
        char file[96], stname[32];
        int used = 0;
        if (sscanf(line, "%95s %31s %n", file, stname, &used) != 2) {
            test_fail(__FILE__, __LINE__, "bad expected.txt line '%s'", line);
            continue;
        }
        const char *needle = line + used;
        int want = status_of(stname);
        CHECK(want >= 0);
        if (n < 256)
            strcpy(listed[n++], file);
        char fp[700];
        snprintf(fp, sizeof fp, "%s/%s", corpus_root(), file);
        mha_status got;
        if (!strncmp(file, "npy/", 4)) {
            mha_tensor t;
            got = mha_npy_load(fp, MHA_F32, &t);
            if (got == MHA_OK)
                mha_tensor_free(&t);
            else
                CHECK(t.data == NULL);
        } else {
            mha_safetensors *st;
            got = mha_safetensors_open(fp, &st);
            if (got == MHA_OK)
                mha_safetensors_free(st);
            else
                CHECK(st == NULL);
        }
        checked++;
        if ((int)got != want || !strstr(mha_last_error(), needle) ||
            !strstr(mha_last_error(), file + (file[0] == 'n' ? 4 : 12)))
            test_fail(__FILE__, __LINE__, "%s: got %s \"%s\", want %s \"%s\" naming the file",
                      file, mha_status_string(got), mha_last_error(), stname, needle);
    }
    fclose(f);
    CHECK(checked >= 40);

    /* every corpus file is in the table */
    static const char *dirs[] = {"npy", "safetensors"};
    for (int d = 0; d < 2; d++) {
        snprintf(path, sizeof path, "%s/%s", corpus_root(), dirs[d]);
        DIR *dir = opendir(path);
        REQUIRE(dir != NULL);
        for (struct dirent *e; (e = readdir(dir)) != NULL;) {
            if (e->d_name[0] == '.')
                continue;
            char want[400];
            snprintf(want, sizeof want, "%s/%s", dirs[d], e->d_name);
            bool found = false;
            for (int i = 0; i < n && !found; i++)
                found = !strcmp(listed[i], want);
            if (!found)
                test_fail(__FILE__, __LINE__, "%s is not in expected.txt", want);
        }
        closedir(dir);
    }
}
