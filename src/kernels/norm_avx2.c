/* norm_avx2.c - LayerNorm of rows with AVX2+FMA: the trained encoder's
 * norms (src/bert.c).  Letters: N rows, E normalised width.
 *
 * The same arithmetic plan as mha_layernorm_f32 (src/norm.c), which is the
 * reference: the row's mean and biased variance in double, two passes (the
 * variance of the centred values), the centring and scaling in double, then
 * weight and bias in float; here 4 doubles per vector with 4-lane partial
 * sums (a fixed order: bits depend on the row alone).
 * tests/unit/test_norm_avx2.c compares it with mha_layernorm_ref.
 */
#include "../layers.h"

#include <immintrin.h>
#include <math.h>

static inline double hsum_pd(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

void mha_layernorm_f32_avx2(float *y, const float *x, int64_t N, int64_t E, const float *w,
                            const float *b, float eps) {
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E;
        float *yr = y + r * E;
        const int64_t E4 = E / 4 * 4;
        __m256d acc = _mm256_setzero_pd();
        for (int64_t c = 0; c < E4; c += 4)
            acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm_loadu_ps(xr + c)));
        double sum = hsum_pd(acc);
        for (int64_t c = E4; c < E; c++)
            sum += xr[c];
        const double mean = sum / (double)E;
        const __m256d vmean = _mm256_set1_pd(mean);
        acc = _mm256_setzero_pd();
        for (int64_t c = 0; c < E4; c += 4) {
            const __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(xr + c)), vmean);
            acc = _mm256_fmadd_pd(d, d, acc);
        }
        double sq = hsum_pd(acc);
        for (int64_t c = E4; c < E; c++)
            sq += (xr[c] - mean) * (xr[c] - mean);
        const double rstd = 1.0 / sqrt(sq / (double)E + (double)eps);
        const __m256d vrstd = _mm256_set1_pd(rstd);
        for (int64_t c = 0; c < E4; c += 4) {
            const __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(xr + c)), vmean);
            __m128 v = _mm256_cvtpd_ps(_mm256_mul_pd(d, vrstd));
            if (w)
                v = _mm_mul_ps(v, _mm_loadu_ps(w + c));
            if (b)
                v = _mm_add_ps(v, _mm_loadu_ps(b + c));
            _mm_storeu_ps(yr + c, v);
        }
        for (int64_t c = E4; c < E; c++)
            yr[c] = mha_layernorm_value(xr[c], mean, rstd, w, b, c);
    }
}
