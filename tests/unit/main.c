/* main.c - runs every registered test; last line "N passed, N failed". */
#include "test.h"

#include <stdarg.h>

#define MAX_TESTS 4096

typedef struct test_entry {
    const char *name;
    test_fn fn;
} test_entry;
static test_entry tests[MAX_TESTS];
static int n_tests;
static int current_failures;

void test_register(const char *name, test_fn fn) {
    if (n_tests < MAX_TESTS)
        tests[n_tests++] = (test_entry){name, fn};
}

void test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    current_failures++;
}

int test_failures(void) { return current_failures; }

static int by_name(const void *a, const void *b) {
    return strcmp(((const test_entry *)a)->name, ((const test_entry *)b)->name);
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    qsort(tests, (size_t)n_tests, sizeof tests[0], by_name);
    int passed = 0, failed = 0;
    for (int i = 0; i < n_tests; i++) {
        if (filter && !strstr(tests[i].name, filter))
            continue;
        current_failures = 0;
        tests[i].fn();
        if (current_failures) {
            failed++;
            fprintf(stderr, "FAIL %s\n", tests[i].name);
        } else {
            passed++;
            if (getenv("MHA_TEST_VERBOSE"))
                printf("ok   %s\n", tests[i].name);
        }
    }
    printf("unit: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
