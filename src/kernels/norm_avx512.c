/* norm_avx512.c - LayerNorm of rows with AVX-512 (F/DQ/BW/VL): the trained
 * encoder's norms (src/bert.c) under the avx512 kernel.  Letters: N rows, E
 * normalised width.  Compiled with AVX512_FLAGS; reached only through
 * mha_layernorm_f32_avx512 (src/norm.c), after mha_avx512_runs().
 *
 * The arithmetic plan of mha_layernorm_f32 (src/norm.c; norm_avx2.c does the
 * same with 4 lanes): the row's mean and biased variance in double, two
 * passes (the variance of the centred values), the centring and scaling in
 * double, then weight and bias in float.  Blocking: 16 floats a step (one
 * ZMM load), widened to two 8-double vectors that feed two accumulators
 * (two independent add chains instead of one; 16 partial sums in a fixed
 * order, so the bits depend on the row alone).  The last partial step is a
 * masked load (absent lanes are 0, and are masked out of the centred
 * values) and a masked store: no scalar tail.
 */
#include "../layers.h"

#include <math.h>

#include "simd_avx512.h"

/* x[c .. c+16) under k as two 8-double vectors, lanes outside k zero. */
static inline void load16_pd(const float *x, __mmask16 k, __m512d *lo, __m512d *hi) {
    const __m512 v = _mm512_maskz_loadu_ps(k, x);
    *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    *hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
}

static void layernorm_avx512(float *y, const float *x, int64_t N, int64_t E, const float *w,
                             const float *b, float eps) {
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E;
        float *yr = y + r * E;
        __m512d s0 = _mm512_setzero_pd(), s1 = s0, lo, hi;
        for (int64_t c = 0; c < E; c += 16) {
            load16_pd(xr + c, mask16(E - c), &lo, &hi);
            s0 = _mm512_add_pd(s0, lo), s1 = _mm512_add_pd(s1, hi);
        }
        const double mean = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1)) / (double)E;
        const __m512d vmean = _mm512_set1_pd(mean);
        s0 = s1 = _mm512_setzero_pd();
        for (int64_t c = 0; c < E; c += 16) {
            const __mmask16 k = mask16(E - c);
            load16_pd(xr + c, k, &lo, &hi);
            const __m512d d0 = _mm512_maskz_sub_pd((__mmask8)k, lo, vmean);
            const __m512d d1 = _mm512_maskz_sub_pd((__mmask8)(k >> 8), hi, vmean);
            s0 = _mm512_fmadd_pd(d0, d0, s0), s1 = _mm512_fmadd_pd(d1, d1, s1);
        }
        const double sq = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
        const double rstd = 1.0 / sqrt(sq / (double)E + (double)eps);
        const __m512d vrstd = _mm512_set1_pd(rstd);
        for (int64_t c = 0; c < E; c += 16) {
            const __mmask16 k = mask16(E - c);
            load16_pd(xr + c, k, &lo, &hi);
            const __m256 y0 = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_sub_pd(lo, vmean), vrstd));
            const __m256 y1 = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_sub_pd(hi, vmean), vrstd));
            __m512 v = _mm512_insertf32x8(_mm512_castps256_ps512(y0), y1, 1);
            if (w)
                v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, w + c));
            if (b)
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, b + c));
            _mm512_mask_storeu_ps(yr + c, k, v);
        }
    }
}

const mha_layernorm_fn MHA_AVX512_SYMBOL(mha_layernorm_avx512_loop) = layernorm_avx512;
