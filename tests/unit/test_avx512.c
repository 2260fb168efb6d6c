/* test_avx512.c - the avx512 kernel choice: native where the CPU has
 * AVX-512, reported skipped (never passed) where it does not; and never a
 * silent fallback when it is asked for on a CPU without it.
 *
 * The parity suites (test_flash.c, test_attention_half.c, test_decode*.c,
 * test_grad_attention*.c, ...) run MHA_KERNEL_AVX512 beside scalar and avx2;
 * on a CPU without AVX-512 they run the emulated twins (main.c sets
 * MHA_TEST_AVX512=emulate when the test library has them). */
#include "test.h"
#include "internal.h" /* mha_cpu_has_avx512, mha_avx512_emulated */
#include "kernels/attention_flash.h" /* mha_flash_bf16_pick */

#include <math.h>

int mha_emu_selftest(char *msg, size_t n); /* tests/emu/emu_selftest.c */

/* The emulation itself against Intel's definitions on edge cases (NaN
 * operand order, rounding modes, single rounding, bf16 lane order). */
TEST(avx512_emulation_is_faithful) {
    char msg[200];
    const int rc = mha_emu_selftest(msg, sizeof msg);
    if (rc < 0)
        SKIP("no AVX-512 emulation in this build (libsimde-dev absent)");
    if (rc != 0)
        test_fail(__FILE__, __LINE__, "emulation: %s", msg);
}

enum { GRAD_FLOATS = 2 * 37 * 40 + 2 * 53 * (40 + 24) }; /* dq, dk, dv of sdpa_on */

/* One SDPA (B=1, H=2, L=37, S=53, d=40, dv=24) on kernel; out (2*37*24).
 * With grad: its backward instead, out the upstream gradient, and grad
 * dq (2*37*40), dk (2*53*40), dv (2*53*24) one after another, added into. */
static mha_status sdpa_on(mha_kernel kernel, float *out, float *grad) {
    enum { H = 2, L = 37, S = 53, D = 40, DV = 24 };
    static float q[H * L * D], k[H * S * D], v[H * S * DV];
    test_randn(q, H * L * D, 11), test_randn(k, H * S * D, 12), test_randn(v, H * S * DV, 13);
    mha_tensor Q = test_view4(q, 1, H, L, D), K = test_view4(k, 1, H, S, D);
    mha_tensor V = test_view4(v, 1, H, S, DV), O = test_view4(out, 1, H, L, DV);
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.kernel = kernel;
    if (!grad)
        return mha_sdpa_forward(&O, &Q, &K, &V, &opt);
    mha_tensor dQ = test_view4(grad, 1, H, L, D), dK = test_view4(grad + H * L * D, 1, H, S, D);
    mha_tensor dV = test_view4(grad + H * L * D + H * S * D, 1, H, S, DV);
    return mha_sdpa_backward(&dQ, &dK, &dV, &O, NULL, NULL, &Q, &K, &V, &opt);
}

TEST(avx512_native_kernel) {
    if (!mha_cpu_has_avx512())
        SKIP("native avx512: this CPU lacks AVX-512 F/BW/VL/DQ%s",
             mha_avx512_emulated() ? " (the avx512 loops ran emulated)" : "");
    const char *env = getenv("MHA_KERNEL");
    if (!env || !*env)
        CHECK(mha_kernel_resolve(MHA_KERNEL_AUTO) == MHA_KERNEL_AVX512);
    static float ref[2 * 37 * 24], got[2 * 37 * 24];
    REQUIRE_OK(sdpa_on(MHA_KERNEL_REF, ref, NULL));
    REQUIRE_OK(sdpa_on(MHA_KERNEL_AVX512, got, NULL));
    CHECK(test_rel_err(got, ref, 2 * 37 * 24) <= 1e-5);
    static float gref[GRAD_FLOATS], ggot[GRAD_FLOATS]; /* zero: the backward adds */
    REQUIRE_OK(sdpa_on(MHA_KERNEL_REF, ref, gref));
    REQUIRE_OK(sdpa_on(MHA_KERNEL_AVX512, ref, ggot));
    CHECK(test_rel_err(ggot, gref, GRAD_FLOATS) <= 1e-4);
}

TEST(avx512_bf16_native) {
    if (!mha_cpu_has_avx512_bf16())
        SKIP("native avx512 bf16 dot products: this CPU lacks AVX512_BF16%s",
             mha_avx512_emulated() ? " (the bf16 loops ran emulated)" : "");
    /* natively (emulation off) the avx512 choice takes the AMX tiles where
     * the CPU has them, else the vdpbf16ps loops on AMD, and widens bf16 to
     * float32 on the other Intel CPUs (mha_cpu_bf16_dot_is_fast) */
    test_avx512_emulation_off();
    const mha_flash_bf16 *want = mha_cpu_has_amx_bf16()       ? &mha_flash_bf16_amx
                                 : mha_cpu_bf16_dot_is_fast() ? &mha_flash_bf16_avx512
                                                              : NULL;
    CHECK(mha_flash_bf16_pick() == want);
    test_avx512_emulation_restore();
}

/* Asked for on a CPU without AVX-512 (emulation off): MHA_ERR_UNSUPPORTED
 * naming AVX-512, and the output (the backward's gradients) untouched. */
TEST(avx512_unsupported_is_an_error) {
    if (mha_cpu_has_avx512())
        SKIP("this CPU has AVX-512: the refusal is not reachable");
    test_avx512_emulation_off();
    static float out[2 * 37 * 24];
    for (int i = 0; i < 2 * 37 * 24; i++)
        out[i] = 7.0f;
    CHECK_STATUS(sdpa_on(MHA_KERNEL_AVX512, out, NULL), MHA_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("AVX-512");
    CHECK(out[0] == 7.0f && out[2 * 37 * 24 - 1] == 7.0f);
    static float grad[GRAD_FLOATS];
    for (int i = 0; i < GRAD_FLOATS; i++)
        grad[i] = 7.0f;
    CHECK_STATUS(sdpa_on(MHA_KERNEL_AVX512, out, grad), MHA_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("AVX-512");
    int changed = 0;
    for (int i = 0; i < GRAD_FLOATS; i++)
        changed += grad[i] != 7.0f;
    CHECK(changed == 0);
    test_avx512_emulation_restore();
}
