/* test_io_corpus.c - every malformed file of tests/corpus (make_corpus.py)
 * is rejected with the status and message listed in expected.txt, every
 * file there is listed, and nothing leaks on the way (ASan build). */
#include "fixture.h"

#include <dirent.h>

static const char *corpus_root(void) {
    const char *r = getenv("MHA_CORPUS");
    return r ? r : "tests/corpus";
}

TEST(io_corpus_each_file_fails_as_listed) {
    char path[512];
    snprintf(path, sizeof path, "%s/expected.txt", corpus_root());
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    char line[1024], listed[256][96];
    int n = 0, checked = 0;
    int want_st;
    const char *needle;
    char file[96];
    while (fixture_corpus_next(f, line, file, &want_st, &needle)) {
        if (!file[0]) {
            test_fail(__FILE__, __LINE__, "bad expected.txt line '%s'", line);
            continue;
        }
        CHECK(want_st >= 0);
        if (n < 256)
            strcpy(listed[n++], file);
        char fp[700];
        snprintf(fp, sizeof fp, "%s/%s", corpus_root(), file);
        mha_status got;
        if (!strncmp(file, "npy/", 4)) {
            mha_tensor t;
            got = mha_npy_load(&t, fp, MHA_F32);
            if (got == MHA_OK)
                mha_tensor_free(&t);
            else
                CHECK(t.data == NULL);
        } else {
            mha_safetensors *st;
            got = mha_safetensors_open(&st, fp);
            if (got == MHA_OK)
                mha_safetensors_free(st);
            else
                CHECK(st == NULL);
        }
        checked++;
        if ((int)got != want_st || !strstr(mha_last_error(), needle) ||
            !strstr(mha_last_error(), file + (file[0] == 'n' ? 4 : 12)))
            test_fail(__FILE__, __LINE__, "%s: got %s \"%s\", want %s \"%s\" naming the file",
                      file, mha_status_string(got), mha_last_error(),
                      mha_status_string((mha_status)want_st), needle);
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
