/* test_norm_avx2.c - the AVX2 LayerNorm of the trained encoder
 * (src/kernels/norm_avx2.c) against the float64 reference
 * mha_layernorm_ref.  Letters: N rows, E width.  Widths 1..9, 31, 384, 385
 * (every tail of the 4-wide vectors), weight and bias present or absent,
 * in place and not, rows with |mean| >> std (1e4 + noise) where a float
 * mean would lose digits.  Bound per element: |y - ref| <= 1.5e-7 (|ref| +
 * |b|) + 1e-6 |w| (float rounding of the centred value, the weight and the
 * bias; the statistics are in double on both). */
#include "test.h"

#include "layers.h"

TEST(layernorm_avx2_matches_reference) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("no AVX2+FMA on this CPU");
    const int64_t Es[] = {1, 2, 3, 4, 5, 7, 8, 9, 31, 384, 385};
    const int64_t N = 5;
    uint64_t seed = 900;
    for (size_t a = 0; a < sizeof Es / sizeof *Es; a++) {
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
            mha_layernorm_f32_avx2(y, x, N, E, wo, bo, 1e-12f);
            int bad = 0;
            for (int64_t e = 0; e < N * E; e++) {
                const int64_t c = e % E;
                const float tol = 1.5e-7f * (fabsf(ref[e]) + (bo ? fabsf(bo[c]) : 0.0f)) +
                                  1e-6f * (wo ? fabsf(wo[c]) : 1.0f);
                if (!(fabsf(y[e] - ref[e]) <= tol) && bad++ < 3)
                    test_fail(__FILE__, __LINE__, "E=%lld w=%d b=%d at %lld: %.9g vs %.9g",
                              (long long)E, opt & 1, opt >> 1, (long long)e, y[e], ref[e]);
            }
        }
        /* in place gives the same bits as out of place */
        mha_layernorm_f32_avx2(y, x, N, E, w, b, 1e-5f);
        mha_layernorm_f32_avx2(x, x, N, E, w, b, 1e-5f);
        CHECK(memcmp(x, y, sizeof(float) * (size_t)(N * E)) == 0);
        free(x), free(w), free(b), free(y), free(ref);
    }
}
