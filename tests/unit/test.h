/* test.h - the tiny test framework of mha's unit suite.
 *
 *   TEST(name) { ... CHECK(cond); CHECK_STATUS(call, MHA_OK); ... }
 *
 * Tests register themselves; the runner (main.c) runs them all, or those
 * whose name contains argv[1], and ends with "N passed, N failed".
 * CHECK failures print file:line and the condition, and fail the test
 * without stopping it; REQUIRE stops the test.
 */
#ifndef MHA_TEST_H
#define MHA_TEST_H

#include "mha.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn);
void test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int test_failures(void); /* failures so far in the current test */

#define TEST(name)                                                          \
    static void test_##name(void);                                          \
    __attribute__((constructor)) static void test_register_##name(void) {   \
        test_register(#name, test_##name);                                  \
    }                                                                       \
    static void test_##name(void)

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond))                                                        \
            test_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);              \
    } while (0)

#define REQUIRE(cond)                                                       \
    do {                                                                    \
        if (!(cond)) {                                                      \
            test_fail(__FILE__, __LINE__, "REQUIRE(%s)", #cond);            \
            return;                                                         \
        }                                                                   \
    } while (0)

#define CHECK_STATUS(call, want)                                            \
    do {                                                                    \
        mha_status got_ = (call);                                           \
        if (got_ != (want))                                                 \
            test_fail(__FILE__, __LINE__, "%s -> %s (%s), want %s", #call,  \
                      mha_status_string(got_), mha_last_error(),            \
                      mha_status_string(want));                             \
    } while (0)

#define REQUIRE_OK(call)                                                    \
    do {                                                                    \
        mha_status got_ = (call);                                           \
        if (got_ != MHA_OK) {                                               \
            test_fail(__FILE__, __LINE__, "%s -> %s (%s)", #call,           \
                      mha_status_string(got_), mha_last_error());           \
            return;                                                         \
        }                                                                   \
    } while (0)

/* Message of the last error contains `needle`. */
#define CHECK_ERROR_MENTIONS(needle)                                        \
    do {                                                                    \
        if (!strstr(mha_last_error(), (needle)))                            \
            test_fail(__FILE__, __LINE__, "error \"%s\" lacks \"%s\"",      \
                      mha_last_error(), (needle));                          \
    } while (0)

/* ---- helpers (util.c) ---------------------------------------------------- */

/* Deterministic normal(0,1) floats from a seed (xorshift + Box-Muller). */
void test_randn(float *x, size_t n, uint64_t seed);

/* The normalised error of the rule:
 * max|y - ref| / max(1, max|ref|); NaN positions must match (else +inf). */
double test_rel_err(const float *y, const float *ref, size_t n);

/* A float tensor view over malloc'd, randn-filled data (free with free()). */
float *test_tensor(mha_tensor *t, int ndim, const int64_t *shape, uint64_t seed);

/* Path of a fixture under tests/fixtures (MHA_FIXTURES overrides). */
const char *test_fixture_root(void);

#endif
