/* main.c - runs every registered test; last line "N passed, N failed, N skipped".
 * A test that calls SKIP/SKIP_PART (test.h) is listed with its reasons; one
 * ended by SKIP counts as skipped, not passed; in one that ran, each distinct
 * SKIP_PART reason counts one skip.  Without OpenMP every test named *thread*
 * notes that its thread counts ran on one thread. */
#include "test.h"
#include "internal.h" /* mha_cpu_has_avx512, mha_avx512_emulated */

#include <stdarg.h>

#define MAX_TESTS 4096
#define MAX_SKIPS 8    /* distinct skip reasons kept per test */
#define SKIP_LEN 160

typedef struct test_entry {
    const char *name;
    test_fn fn;
} test_entry;
static test_entry tests[MAX_TESTS];
static int n_tests;
static int current_failures;
static char current_skips[MAX_SKIPS][SKIP_LEN];
static int n_current_skips;
static int current_skipped; /* SKIP ended the test */

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

void test_skip(int whole, const char *fmt, ...) {
    char reason[SKIP_LEN];
    current_skipped |= whole != 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    for (int i = 0; i < n_current_skips; i++)
        if (strcmp(current_skips[i], reason) == 0)
            return;
    if (n_current_skips < MAX_SKIPS)
        memcpy(current_skips[n_current_skips++], reason, sizeof reason);
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const test_entry *)a)->name, ((const test_entry *)b)->name);
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    qsort(tests, (size_t)n_tests, sizeof tests[0], by_name);
    int passed = 0, failed = 0, skipped = 0;
    /* The avx512 kernel runs natively on an AVX-512 CPU; elsewhere its
     * emulated twins where the test library has them (SIMDe; the hook
     * MHA_TEST_AVX512=emulate, docs/errors.md "Test hooks"). */
    if (!mha_cpu_has_avx512())
        setenv("MHA_TEST_AVX512", "emulate", 0);
    printf("avx512 kernels: %s\n", mha_cpu_has_avx512()    ? "native"
                                    : mha_avx512_emulated() ? "emulated (this CPU lacks AVX-512)"
                                                            : "not run (this CPU lacks AVX-512; "
                                                              "no SIMDe emulation in this build)");
    for (int i = 0; i < n_tests; i++) {
        if (filter && !strstr(tests[i].name, filter))
            continue;
        current_failures = 0;
        n_current_skips = 0;
        current_skipped = 0;
#ifndef _OPENMP /* a thread-count comparison cannot fail on one thread: say so */
        if (strstr(tests[i].name, "thread"))
            test_skip(0, "built without OpenMP: every thread count runs on one thread");
#endif
        tests[i].fn();
        for (int s = 0; s < n_current_skips; s++)
            printf("skip %s: %s\n", tests[i].name, current_skips[s]);
        if (current_failures) {
            failed++;
            fprintf(stderr, "FAIL %s\n", tests[i].name);
        } else if (current_skipped) {
            skipped++;
        } else {
            passed++;
            skipped += n_current_skips;
            if (getenv("MHA_TEST_VERBOSE"))
                printf("ok   %s\n", tests[i].name);
        }
    }
    printf("unit: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
