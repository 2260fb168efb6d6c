/* attention_decode_avx2.c - AVX2+FMA inner loops of the decode step (see
 * attention_decode.h; portable twins in attention_decode.c).
 * Letter legend: G heads per kv head, n keys, d, dv. */
#include "attention_decode.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static float hsum(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Heads in blocks of up to 4: each 8-float chunk of a key row is loaded once
 * and feeds 4 independent FMA chains. */
static void qk_avx2(float *s, const float *q, const float *k, int64_t n, int64_t G, int64_t d) {
    const int64_t d8 = d & ~(int64_t)7;
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
        const int64_t gn = G - g0 < 4 ? G - g0 : 4;
        const float *q0 = q + g0 * d;
        const float *q1 = q + (g0 + (gn > 1 ? 1 : 0)) * d;
        const float *q2 = q + (g0 + (gn > 2 ? 2 : 0)) * d;
        const float *q3 = q + (g0 + (gn > 3 ? 3 : 0)) * d;
        for (int64_t j = 0; j < n; j++) {
            const float *kr = k + j * d;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t x = 0; x < d8; x += 8) {
                const __m256 kv = _mm256_loadu_ps(kr + x);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + x), kv, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + x), kv, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + x), kv, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + x), kv, a3);
            }
            float r[4] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
            const float *qs[4] = {q0, q1, q2, q3};
            for (int64_t g = 0; g < gn; g++) {
                for (int64_t x = d8; x < d; x++)
                    r[g] += qs[g][x] * kr[x];
                s[(g0 + g) * n + j] = r[g];
            }
        }
    }
}

/* Columns in chunks of 8 outside, keys inside: the accumulators of up to 8
 * heads stay in registers while the block's V column chunk streams by. */
static void pv_avx2(float *acc, const float *p, const float *v, int64_t n, int64_t G,
                    int64_t dv) {
    const int64_t d8 = dv & ~(int64_t)7;
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
        const int64_t gn = G - g0 < 8 ? G - g0 : 8;
        for (int64_t x = 0; x < d8; x += 8) {
            __m256 a[8];
            for (int64_t g = 0; g < gn; g++)
                a[g] = _mm256_loadu_ps(acc + (g0 + g) * dv + x);
            for (int64_t j = 0; j < n; j++) {
                const __m256 vv = _mm256_loadu_ps(v + j * dv + x);
                for (int64_t g = 0; g < gn; g++)
                    a[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + (g0 + g) * n + j), vv, a[g]);
            }
            for (int64_t g = 0; g < gn; g++)
                _mm256_storeu_ps(acc + (g0 + g) * dv + x, a[g]);
        }
        for (int64_t x = d8; x < dv; x++)
            for (int64_t j = 0; j < n; j++)
                for (int64_t g = 0; g < gn; g++)
                    acc[(g0 + g) * dv + x] += p[(g0 + g) * n + j] * v[j * dv + x];
    }
}

const mha_decode_isa mha_decode_isa_avx2 = {qk_avx2, pv_avx2};
#else
const mha_decode_isa mha_decode_isa_avx2 = {0, 0};
#endif
