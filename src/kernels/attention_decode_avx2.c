/* attention_decode_avx2.c - AVX2+FMA(+F16C) inner loops of the decode step
 * (see attention_decode.h; portable twins in attention_decode.c).
 * Letter legend: G heads per kv head, n keys, d, dv.
 *
 * K/V rows are read in their storage dtype and widened in registers: fp16
 * by F16C (vcvtph2ps), bf16 by zero-extending 16 -> 32 bits and shifting
 * left 16 (bf16 is the top half of a float), fp32 as is.  Each loop body is
 * written once and specialised per dtype by inlining. */
#include "attention_decode.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "convert.h"

#include <immintrin.h>

static float hsum(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Elements [off, off + 8) of a row of dtype dt, as float32. */
static inline __attribute__((always_inline)) __m256 load8(const void *p, mha_dtype dt,
                                                          int64_t off) {
    switch (dt) {
    case MHA_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + off)));
    case MHA_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + off))),
            16));
    default: return _mm256_loadu_ps((const float *)p + off);
    }
}

/* Heads in blocks of up to 4: each 8-element chunk of a key row is loaded
 * (and widened) once and feeds 4 independent FMA chains. */
static inline __attribute__((always_inline)) void qk_avx2_dt(float *s, const float *q,
                                                             const void *k, mha_dtype dt,
                                                             int64_t n, int64_t G, int64_t d) {
    const int64_t d8 = d & ~(int64_t)7;
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
        const int64_t gn = G - g0 < 4 ? G - g0 : 4;
        const float *q0 = q + g0 * d;
        const float *q1 = q + (g0 + (gn > 1 ? 1 : 0)) * d;
        const float *q2 = q + (g0 + (gn > 2 ? 2 : 0)) * d;
        const float *q3 = q + (g0 + (gn > 3 ? 3 : 0)) * d;
        for (int64_t j = 0; j < n; j++) {
            const int64_t kr = j * d;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t x = 0; x < d8; x += 8) {
                const __m256 kv = load8(k, dt, kr + x);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + x), kv, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + x), kv, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + x), kv, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + x), kv, a3);
            }
            float r[4] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
            const float *qs[4] = {q0, q1, q2, q3};
            for (int64_t g = 0; g < gn; g++) {
                for (int64_t x = d8; x < d; x++)
                    r[g] += qs[g][x] * mha_load_f(k, dt, kr + x);
                s[(g0 + g) * n + j] = r[g];
            }
        }
    }
}

static void qk_avx2(float *s, const float *q, const void *k, mha_dtype dt, int64_t n, int64_t G,
                    int64_t d) {
    switch (dt) {
    case MHA_F16: qk_avx2_dt(s, q, k, MHA_F16, n, G, d); break;
    case MHA_BF16: qk_avx2_dt(s, q, k, MHA_BF16, n, G, d); break;
    default: qk_avx2_dt(s, q, k, MHA_F32, n, G, d); break;
    }
}

/* Columns in chunks of 8 outside, keys inside: the accumulators of up to 8
 * heads stay in registers while the block's V column chunk streams by. */
static inline __attribute__((always_inline)) void pv_avx2_dt(float *acc, const float *p,
                                                             const void *v, mha_dtype dt,
                                                             int64_t n, int64_t G, int64_t dv) {
    const int64_t d8 = dv & ~(int64_t)7;
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
        const int64_t gn = G - g0 < 8 ? G - g0 : 8;
        for (int64_t x = 0; x < d8; x += 8) {
            __m256 a[8];
            for (int64_t g = 0; g < gn; g++)
                a[g] = _mm256_loadu_ps(acc + (g0 + g) * dv + x);
            for (int64_t j = 0; j < n; j++) {
                const __m256 vv = load8(v, dt, j * dv + x);
                for (int64_t g = 0; g < gn; g++)
                    a[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + (g0 + g) * n + j), vv, a[g]);
            }
            for (int64_t g = 0; g < gn; g++)
                _mm256_storeu_ps(acc + (g0 + g) * dv + x, a[g]);
        }
        for (int64_t x = d8; x < dv; x++)
            for (int64_t j = 0; j < n; j++)
                for (int64_t g = 0; g < gn; g++)
                    acc[(g0 + g) * dv + x] += p[(g0 + g) * n + j] * mha_load_f(v, dt, j * dv + x);
    }
}

static void pv_avx2(float *acc, const float *p, const void *v, mha_dtype dt, int64_t n,
                    int64_t G, int64_t dv) {
    switch (dt) {
    case MHA_F16: pv_avx2_dt(acc, p, v, MHA_F16, n, G, dv); break;
    case MHA_BF16: pv_avx2_dt(acc, p, v, MHA_BF16, n, G, dv); break;
    default: pv_avx2_dt(acc, p, v, MHA_F32, n, G, dv); break;
    }
}

/* p rounded to dt and back, 8 at a time, as mha_round_to does: fp16 by a
 * vcvtps2ph/vcvtph2ps round trip (round to nearest even, subnormals kept);
 * bf16 by adding 0x7fff + the lowest kept bit and clearing the low half,
 * NaN kept quiet with its top payload (0x00400000 set). */
static void round_p_avx2(float *p, int64_t n, mha_dtype dt) {
    int64_t j = 0;
    if (dt == MHA_F16)
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(p + j, _mm256_cvtph_ps(_mm256_cvtps_ph(
                                        _mm256_loadu_ps(p + j), _MM_FROUND_TO_NEAREST_INT)));
    else if (dt == MHA_BF16)
        for (; j + 8 <= n; j += 8) {
            const __m256 x = _mm256_loadu_ps(p + j);
            const __m256i b = _mm256_castps_si256(x);
            const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
            __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
            r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u));
            const __m256i qnan = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi32((int)0xffff0000u)),
                                                 _mm256_set1_epi32(0x00400000));
            const __m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
            _mm256_storeu_ps(p + j, _mm256_blendv_ps(_mm256_castsi256_ps(r),
                                                     _mm256_castsi256_ps(qnan), isnan));
        }
    for (; j < n; j++)
        p[j] = mha_round_to(dt, p[j]);
}

const mha_decode_isa mha_decode_isa_avx2 = {qk_avx2, pv_avx2, round_p_avx2};
#else
const mha_decode_isa mha_decode_isa_avx2 = {0, 0, 0};
#endif
