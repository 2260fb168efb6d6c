/* test.h - the tiny test framework of mha's unit suite.
 *
 *   TEST(name) { ... CHECK(cond); CHECK_STATUS(call, MHA_OK); ... }
 *
 * Tests register themselves; the runner (main.c) runs them all, or those
 * whose name contains argv[1], and ends with "N passed, N failed, N skipped".
 * CHECK failures print file:line and the condition, and fail the test
 * without stopping it; REQUIRE stops the test.
 *
 * A path this machine or build lacks (AVX2, OpenBLAS, libpng) is reported
 * as skipped, never passed silently:
 *   SKIP("no AVX2+FMA on this CPU");          skips the rest of the test
 *   SKIP_PART("kernel avx2: no AVX2+FMA");    notes a skipped part; the test
 *                                             goes on with what it can run
 * A test ended by SKIP counts as skipped, not passed; in a test that ran,
 * each distinct SKIP_PART reason counts one skip.  The runner lists them.
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
/* Notes a skip reason; whole != 0 marks the test itself skipped (SKIP). */
void test_skip(int whole, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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

#define SKIP(...)                                                           \
    do {                                                                    \
        test_skip(1, __VA_ARGS__);                                          \
        return;                                                             \
    } while (0)

#define SKIP_PART(...) test_skip(0, __VA_ARGS__)

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

/* The elements of t (the product of its shape). */
size_t test_numel(const mha_tensor *t);

/* Elements of a and b (n each) whose bit patterns differ, NaN against NaN
 * counted equal (payloads are not specified). */
size_t test_bits_differ(const float *a, const float *b, size_t n);

/* Whether mha_sdpa_backward on these tensors and options takes the
 * whole-row backward (mha_attn_bwd_rows_serve, before the kernel's own
 * conditions: the avx512 kernel and finite inputs); dq, dk, dv NULL when
 * not asked for. */
bool test_bwd_rows_served(const mha_tensor *q, const mha_tensor *k, const mha_tensor *v,
                          const mha_tensor *dout, const mha_tensor *dq, const mha_tensor *dk,
                          const mha_tensor *dv, const mha_sdpa_options *opt);

/* The inputs of an attention backward: q (B,Hq,L,d), k (B,Hkv,S,d),
 * v (B,Hkv,S,dv), dout (B,Hq,L,dv) (test_tensor, seeds seed*8 + 0..3; free
 * data[0..3]), their shapes in shape[0..3]. */
void test_sdpa_grad_inputs(mha_tensor *q, mha_tensor *k, mha_tensor *v, mha_tensor *dout,
                           float *data[4], int64_t shape[4][4], const int64_t dims[7],
                           uint64_t seed);

/* True when this build and CPU run the attention kernel; otherwise notes it
 * skipped in the current test (SKIP_PART), so the caller just moves on. */
bool test_kernel_runs(mha_kernel kernel);

/* x (n >= 70): inputs for a half-rounding check - normals, values that
 * underflow, exact powers, 0, 1, inf, bf16 ties both ways, fp16 subnormal
 * and overflow, a float subnormal, quiet and signalling NaNs whose payload
 * sits in the low half. */
void test_rounding_inputs(float *x, int n);

/* A float attention mask (L, S) from normals, -inf at every fifth entry
 * (e % 5 == 2); malloc'd (free it), NULL when out of memory. */
float *test_float_mask(int64_t L, int64_t S, uint64_t seed);

/* A contiguous float32 view (a,b,c,d) over x. */
mha_tensor test_view4(float *x, int64_t a, int64_t b, int64_t c, int64_t d);

/* max|a - b| over n floats; +inf where NaN or infinity positions differ. */
double test_max_diff(const float *a, const float *b, int64_t n);

/* Makes the k-th allocation of call() fail, once and then persistently, for
 * k = 1, 2, ... until call() succeeds: each failure must be MHA_ERR_NOMEM
 * with a message and leak nothing, and at least one must have happened. */
void test_alloc_failures(const char *name, mha_status (*call)(void));

/* Path of a fixture under tests/fixtures (MHA_FIXTURES overrides). */
const char *test_fixture_root(void);

/* The whole file at path, NUL-terminated (*len its size; len may be NULL),
 * or NULL; free() it. */
char *test_slurp(const char *path, size_t *len);

/* Occurrences of needle in s (overlapping ones too). */
int test_count(const char *s, const char *needle);

/* For the tests of an avx512 refusal: MHA_TEST_AVX512 unset (the emulated
 * loops off), then put back as it was. */
void test_avx512_emulation_off(void);
void test_avx512_emulation_restore(void);

#endif
