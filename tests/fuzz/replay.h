/* replay.h - the plain-program driver of the fuzz targets: feeds every file
 * named on the command line (directories: every regular file inside, sorted)
 * to the target once and prints "fuzz-replay NAME: N passed, 0 failed".  A
 * crash or sanitizer report ends the program, which is the failure. */
#ifndef MHA_FUZZ_REPLAY_H
#define MHA_FUZZ_REPLAY_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int replay_file(const char *path, int (*fn)(const uint8_t *, size_t)) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz-replay: cannot open %s\n", path);
        return 0;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    fclose(f);
    if (!buf)
        return 0;
    /* an exact-size copy so ASan sees reads one past the input */
    uint8_t *exact = malloc(n ? n : 1);
    if (exact) {
        memcpy(exact, buf, n);
        fn(exact, n);
    }
    free(exact);
    free(buf);
    return exact != NULL;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int fuzz_replay_main(int argc, char **argv, int (*fn)(const uint8_t *, size_t)) {
    int done = 0, failed = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "fuzz-replay: no such file %s\n", argv[i]);
            failed++;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            done += replay_file(argv[i], fn);
            continue;
        }
        DIR *d = opendir(argv[i]);
        char *names[4096];
        int n = 0;
        for (struct dirent *e; d && (e = readdir(d)) != NULL && n < 4096;)
            if (e->d_name[0] != '.')
                names[n++] = strdup(e->d_name);
        if (d)
            closedir(d);
        qsort(names, (size_t)n, sizeof *names, cmp_str);
        for (int k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]);
            if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
                done += replay_file(path, fn);
            free(names[k]);
        }
    }
    printf("fuzz-replay %s: %d passed, %d failed\n", argv[0], done, failed);
    return failed != 0;
}

#endif
