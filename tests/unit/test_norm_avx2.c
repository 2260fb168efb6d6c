/* test_norm_avx2.c - the AVX2 and AVX-512 LayerNorm loops of the trained
 * encoder (src/kernels/norm_avx2.c, norm_avx512.c) against the float64 reference
 * mha_layernorm_ref.  Letters: N rows, E width.  Widths 1..9, 31, 384, 385
 * (every tail of the 4-wide vectors; avx512: 1..385 with every tail of its
 * 8- and 16-wide steps), weight and bias present or absent,
 * in place and not, rows with |mean| >> std (1e4 + noise) where a float
 * mean would lose digits.  Bound per element: |y - ref| <= 1.5e-7 (|ref| +
 * |b|) + 1e-6 |w| (float rounding of the centred value, the weight and the
 * bias; the statistics are in double on both). */
#include "test.h"

#include "layers.h"

/* A LayerNorm loop of mha_layernorm_f32's plan (avx2, or avx512 through its
 * dispatch). */
typedef enum { NORM_AVX2, NORM_AVX512 } norm_kernel;

static void norm_on(norm_kernel kernel, float *y, const float *x, int64_t N, int64_t E,
                    const float *w, const float *b, float eps) {
    if (kernel == NORM_AVX512)
        CHECK_STATUS(mha_layernorm_f32_avx512(y, x, N, E, w, b, eps), MHA_OK);
    else
        mha_layernorm_f32_avx2(y, x, N, E, w, b, eps);
}

/* kernel against the reference over widths Es (n of them). */
static void norm_matches_reference(norm_kernel kernel, const int64_t *Es, size_t n) {
    const int64_t N = 5;
    uint64_t seed = 900;
    for (size_t a = 0; a < n; a++) {
        const int64_t E = Es[a];
        float *x = malloc(sizeof(float) * (size_t)(N * E)), *w = malloc(sizeof(float) * (size_t)E);
        float *b = malloc(sizeof(float) * (size_t)E), *y = malloc(sizeof(float) * (size_t)(N * E));
        float *ref = malloc(sizeof(float) * (size_t)(N * E));
        test_randn(x, (size_t)(N * E), seed++);
        test_randn(w, (size_t)E, seed++);
        test_randn(b, (size_t)E, seed++);
        for (int64_t c = 0; c < E; c++)
            x[3 * E + c] += 1e4f; /* row 3: a large mean */
        for (int opt = 0; opt < 4; opt++) {
            const float *wo = opt & 1 ? w : NULL, *bo = opt & 2 ? b : NULL;
            mha_layernorm_ref(ref, x, N, E, wo, bo, 1e-12f);
            norm_on(kernel, y, x, N, E, wo, bo, 1e-12f);
            int bad = 0;
            for (int64_t e = 0; e < N * E; e++) {
                const int64_t c = e % E;
                const float tol = 1.5e-7f * (fabsf(ref[e]) + (bo ? fabsf(bo[c]) : 0.0f)) +
                                  1e-6f * (wo ? fabsf(wo[c]) : 1.0f);
                if (!(fabsf(y[e] - ref[e]) <= tol) && bad++ < 3)
                    test_fail(__FILE__, __LINE__, "%s E=%lld w=%d b=%d at %lld: %.9g vs %.9g",
                              kernel == NORM_AVX512 ? "avx512" : "avx2", (long long)E, opt & 1,
                              opt >> 1, (long long)e, y[e], ref[e]);
            }
        }
        /* in place gives the same bits as out of place */
        norm_on(kernel, y, x, N, E, w, b, 1e-5f);
        norm_on(kernel, x, x, N, E, w, b, 1e-5f);
        CHECK(memcmp(x, y, sizeof(float) * (size_t)(N * E)) == 0);
        free(x), free(w), free(b), free(y), free(ref);
    }
}

TEST(layernorm_avx2_matches_reference) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("no AVX2+FMA on this CPU");
    const int64_t Es[] = {1, 2, 3, 4, 5, 7, 8, 9, 31, 384, 385};
    norm_matches_reference(NORM_AVX2, Es, sizeof Es / sizeof *Es);
}

/* The avx512 loop (src/kernels/norm_avx512.c; emulated where the CPU lacks
 * AVX-512): every tail of the 8-double halves and the 16-float steps. */
TEST(layernorm_avx512_matches_reference) {
    if (!mha_avx512_runs())
        SKIP("avx512: this CPU lacks AVX-512 and the test library has no emulation");
    const int64_t Es[] = {1, 2, 7, 8, 9, 15, 16, 17, 24, 31, 33, 384, 385};
    norm_matches_reference(NORM_AVX512, Es, sizeof Es / sizeof *Es);
}

/* Where it cannot run (emulation off, no AVX-512): MHA_ERR_UNSUPPORTED
 * naming AVX-512, y untouched. */
TEST(layernorm_avx512_unsupported_is_an_error) {
    if (mha_cpu_has_avx512())
        SKIP("this CPU has AVX-512: the refusal is not reachable");
    test_avx512_emulation_off();
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    CHECK_STATUS(mha_layernorm_f32_avx512(y, x, 1, 8, NULL, NULL, 1e-5f), MHA_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("AVX-512");
    CHECK(y[0] == 7.0f && y[7] == 7.0f);
    test_avx512_emulation_restore();
}
