/* attention_short_avx2.c - the short-text attention (attention_short.h)
 * with AVX2+FMA.  Letters: L tokens, H heads, d head width, Lp = L rounded
 * up to 8.
 *
 * Per head: K^T (d, Lp) is gathered once (zeros past L); per block of 4
 * query rows, scores S (4, Lp) = q K^T in 8-key vectors (4 FMAs per K^T
 * load, one broadcast of q each), times scale; per row the keys past L are
 * -inf, then max, p = exp(s - max) (exp256, 1-2 ulp), l = sum p, and
 * ctx = (sum_j p_j v_j) / l with d/8 YMM accumulators (v rows read in
 * place).  Every value depends only on the text: bits do not depend on the
 * batch or the threads.
 */
#include "attention_short.h"
#include "simd_avx2.h" /* exp256 */

#include <math.h>

static inline float hmax256(__m256 x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline float hsum256(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* o (d) = (sum_{j<L} p[j] v[j*ld]) / l, d = 8 * D8 (a constant when inlined). */
static inline __attribute__((always_inline)) void pv_row(float *o, const float *p,
                                                         const float *v, int64_t ld, int64_t L,
                                                         float l, const int D8) {
    __m256 acc[8]; /* the loops over c unroll fully: D8 registers */
#pragma GCC unroll 8
    for (int c = 0; c < D8; c++)
        acc[c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < L; j++) {
        const __m256 pj = _mm256_broadcast_ss(p + j);
        const float *vj = v + j * ld;
#pragma GCC unroll 8
        for (int c = 0; c < D8; c++)
            acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * c), acc[c]);
    }
    const __m256 vl = _mm256_set1_ps(l);
#pragma GCC unroll 8
    for (int c = 0; c < D8; c++)
        _mm256_storeu_ps(o + 8 * c, _mm256_div_ps(acc[c], vl));
}

static void pv_row_any(float *o, const float *p, const float *v, int64_t ld, int64_t L, float l,
                       int64_t d) {
    switch (d / 8) {
    case 1: pv_row(o, p, v, ld, L, l, 1); break;
    case 2: pv_row(o, p, v, ld, L, l, 2); break;
    case 3: pv_row(o, p, v, ld, L, l, 3); break;
    case 4: pv_row(o, p, v, ld, L, l, 4); break;
    case 5: pv_row(o, p, v, ld, L, l, 5); break;
    case 6: pv_row(o, p, v, ld, L, l, 6); break;
    case 7: pv_row(o, p, v, ld, L, l, 7); break;
    default: pv_row(o, p, v, ld, L, l, 8); break;
    }
}

/* s (L) = exp(s - max) in place (keys past L of the Lp are -inf, giving 0);
 * returns the sum. */
static float softmax_row(float *s, int64_t L, int64_t Lp) {
    for (int64_t j = L; j < Lp; j++)
        s[j] = -INFINITY;
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < Lp; j += 8)
        m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
    const __m256 vm = _mm256_set1_ps(hmax256(m));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < Lp; j += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    return hsum256(sum);
}

void mha_attn_short_f32_avx2(float *ctx, int64_t ldo, const float *q, const float *k,
                             const float *v, int64_t ld, int64_t L, int64_t S, int64_t H,
                             int64_t d, float scale, float *ws) {
    const int64_t Lp = (S + 7) / 8 * 8;
    float *kt = ws, *sc = ws + d * Lp; /* K^T (d, Lp), scores (4, Lp) */
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t h = 0; h < H; h++) {
        for (int64_t j = 0; j < Lp; j++)
            for (int64_t c = 0; c < d; c++)
                kt[c * Lp + j] = j < S ? k[j * ld + h * d + c] : 0.0f;
        for (int64_t i0 = 0; i0 < L; i0 += 4) {
            const int64_t rows = L - i0 < 4 ? L - i0 : 4;
            const float *qr[4];
            for (int r = 0; r < 4; r++) /* rows past the text repeat its row i0 */
                qr[r] = q + (i0 + (r < rows ? r : 0)) * ld + h * d;
            for (int64_t jb = 0; jb < Lp; jb += 8) {
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t c = 0; c < d; c++) {
                    const __m256 kv = _mm256_loadu_ps(kt + c * Lp + jb);
                    a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(qr[0] + c), kv, a0);
                    a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(qr[1] + c), kv, a1);
                    a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(qr[2] + c), kv, a2);
                    a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(qr[3] + c), kv, a3);
                }
                _mm256_storeu_ps(sc + jb, _mm256_mul_ps(a0, vscale));
                _mm256_storeu_ps(sc + Lp + jb, _mm256_mul_ps(a1, vscale));
                _mm256_storeu_ps(sc + 2 * Lp + jb, _mm256_mul_ps(a2, vscale));
                _mm256_storeu_ps(sc + 3 * Lp + jb, _mm256_mul_ps(a3, vscale));
            }
            for (int64_t r = 0; r < rows; r++) {
                float *s = sc + r * Lp;
                const float l = softmax_row(s, S, Lp);
                pv_row_any(ctx + (i0 + r) * ldo + h * d, s, v + h * d, ld, S, l, d);
            }
        }
    }
}
