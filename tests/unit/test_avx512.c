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

#include <math.h>

/* One SDPA (B=1, H=2, L=37, S=53, d=40, dv=24) on kernel; out (2*37*24). */
static mha_status sdpa_on(mha_kernel kernel, float *out) {
    enum { H = 2, L = 37, S = 53, D = 40, DV = 24 };
    static float q[H * L * D], k[H * S * D], v[H * S * DV];
    test_randn(q, H * L * D, 11), test_randn(k, H * S * D, 12), test_randn(v, H * S * DV, 13);
    mha_tensor Q = test_view4(q, 1, H, L, D), K = test_view4(k, 1, H, S, D);
    mha_tensor V = test_view4(v, 1, H, S, DV), O = test_view4(out, 1, H, L, DV);
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.kernel = kernel;
    return mha_sdpa_forward(&O, &Q, &K, &V, &opt);
}

TEST(avx512_native_kernel) {
    if (!mha_cpu_has_avx512())
        SKIP("native avx512: this CPU lacks AVX-512 F/BW/VL/DQ%s",
             mha_avx512_emulated() ? " (the avx512 loops ran emulated)" : "");
    const char *env = getenv("MHA_KERNEL");
    if (!env || !*env)
        CHECK(mha_kernel_resolve(MHA_KERNEL_AUTO) == MHA_KERNEL_AVX512);
    static float ref[2 * 37 * 24], got[2 * 37 * 24];
    REQUIRE_OK(sdpa_on(MHA_KERNEL_REF, ref));
    REQUIRE_OK(sdpa_on(MHA_KERNEL_AVX512, got));
    CHECK(test_rel_err(got, ref, 2 * 37 * 24) <= 1e-5);
}

TEST(avx512_bf16_native) {
    if (!mha_cpu_has_avx512_bf16())
        SKIP("native avx512 bf16 dot products: this CPU lacks AVX512_BF16%s",
             mha_avx512_emulated() ? " (the bf16 loops ran emulated)" : "");
    CHECK(mha_cpu_has_avx512());
}

/* Asked for on a CPU without AVX-512 (emulation off): MHA_ERR_UNSUPPORTED
 * naming AVX-512, and the output untouched. */
TEST(avx512_unsupported_is_an_error) {
    if (mha_cpu_has_avx512())
        SKIP("this CPU has AVX-512: the refusal is not reachable");
    test_avx512_emulation_off();
    static float out[2 * 37 * 24];
    for (int i = 0; i < 2 * 37 * 24; i++)
        out[i] = 7.0f;
    CHECK_STATUS(sdpa_on(MHA_KERNEL_AVX512, out), MHA_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("AVX-512");
    CHECK(out[0] == 7.0f && out[2 * 37 * 24 - 1] == 7.0f);
    test_avx512_emulation_restore();
}
