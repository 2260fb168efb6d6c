/* attention_flash_avx2.c - AVX2+FMA inner loops of the fused attention.
 *
 * Letter legend and packed layouts: see attention_flash.h (MR = 6 query
 * rows, NR = 16 columns = 2 YMM, BC keys per block, dvp = dv rounded to NR).
 * The portable versions of each loop are in attention_flash.c (qk_scalar,
 * pv_scalar, row_scores_scalar, row_exp_scalar); the driver is shared.
 * Compiled with -mavx2 -mfma; only reached after a run-time CPU check.
 *
 * Register blocking (ref: Goto & van de Geijn, "Anatomy of High-Performance
 * Matrix Multiplication", ACM TOMS 34(3), 2008; BLIS sgemm haswell 6x16):
 * 12 accumulators (6 rows x 2 YMM) + 2 loads of the packed panel + 1
 * broadcast = 15 of 16 YMM registers; 12 FMAs per step cover the 4-cycle
 * latency of Zen 3's two FMA pipes (8 chains needed).
 */
#include "attention_flash.h"
#include "convert.h"

#include <immintrin.h>
#include <math.h>

#include "simd_avx2.h" /* exp256 */

enum { MR = MHA_FLASH_MR, NR = MHA_FLASH_NR, BC = MHA_FLASH_BC };

/* s (MR, npanels*NR) = q (MR, d) . kp^T (npanels, d, NR) */
static void qk_avx2(float *s, int64_t lds, const float *q, int64_t ldq, const float *kp,
                    int64_t d, int64_t npanels) {
    for (int64_t p = 0; p < npanels; p++) {
        const float *k = kp + p * d * NR;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00,
               a21 = a00, a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
        const float *q0 = q, *q1 = q + ldq, *q2 = q + 2 * ldq, *q3 = q + 3 * ldq,
                    *q4 = q + 4 * ldq, *q5 = q + 5 * ldq;
        for (int64_t c = 0; c < d; c++) {
            __m256 b0 = _mm256_load_ps(k + c * NR), b1 = _mm256_load_ps(k + c * NR + 8), a;
            a = _mm256_broadcast_ss(q0 + c);
            a00 = _mm256_fmadd_ps(a, b0, a00), a01 = _mm256_fmadd_ps(a, b1, a01);
            a = _mm256_broadcast_ss(q1 + c);
            a10 = _mm256_fmadd_ps(a, b0, a10), a11 = _mm256_fmadd_ps(a, b1, a11);
            a = _mm256_broadcast_ss(q2 + c);
            a20 = _mm256_fmadd_ps(a, b0, a20), a21 = _mm256_fmadd_ps(a, b1, a21);
            a = _mm256_broadcast_ss(q3 + c);
            a30 = _mm256_fmadd_ps(a, b0, a30), a31 = _mm256_fmadd_ps(a, b1, a31);
            a = _mm256_broadcast_ss(q4 + c);
            a40 = _mm256_fmadd_ps(a, b0, a40), a41 = _mm256_fmadd_ps(a, b1, a41);
            a = _mm256_broadcast_ss(q5 + c);
            a50 = _mm256_fmadd_ps(a, b0, a50), a51 = _mm256_fmadd_ps(a, b1, a51);
        }
        float *o = s + p * NR;
        _mm256_storeu_ps(o, a00), _mm256_storeu_ps(o + 8, a01), o += lds;
        _mm256_storeu_ps(o, a10), _mm256_storeu_ps(o + 8, a11), o += lds;
        _mm256_storeu_ps(o, a20), _mm256_storeu_ps(o + 8, a21), o += lds;
        _mm256_storeu_ps(o, a30), _mm256_storeu_ps(o + 8, a31), o += lds;
        _mm256_storeu_ps(o, a40), _mm256_storeu_ps(o + 8, a41), o += lds;
        _mm256_storeu_ps(o, a50), _mm256_storeu_ps(o + 8, a51);
    }
}

/* o (MR, dvp) += p (MR, n) . vp (dvp/NR, BC, NR) */
static void pv_avx2(float *o, int64_t ldo, const float *p, int64_t ldp, const float *vp,
                    int64_t n, int64_t dvp) {
    const float *p0 = p, *p1 = p + ldp, *p2 = p + 2 * ldp, *p3 = p + 3 * ldp, *p4 = p + 4 * ldp,
                *p5 = p + 5 * ldp;
    for (int64_t cp = 0; cp < dvp / NR; cp++) {
        const float *v = vp + cp * BC * NR;
        float *oc = o + cp * NR;
        __m256 a00 = _mm256_loadu_ps(oc), a01 = _mm256_loadu_ps(oc + 8);
        __m256 a10 = _mm256_loadu_ps(oc + ldo), a11 = _mm256_loadu_ps(oc + ldo + 8);
        __m256 a20 = _mm256_loadu_ps(oc + 2 * ldo), a21 = _mm256_loadu_ps(oc + 2 * ldo + 8);
        __m256 a30 = _mm256_loadu_ps(oc + 3 * ldo), a31 = _mm256_loadu_ps(oc + 3 * ldo + 8);
        __m256 a40 = _mm256_loadu_ps(oc + 4 * ldo), a41 = _mm256_loadu_ps(oc + 4 * ldo + 8);
        __m256 a50 = _mm256_loadu_ps(oc + 5 * ldo), a51 = _mm256_loadu_ps(oc + 5 * ldo + 8);
        for (int64_t j = 0; j < n; j++) {
            __m256 b0 = _mm256_load_ps(v + j * NR), b1 = _mm256_load_ps(v + j * NR + 8), a;
            a = _mm256_broadcast_ss(p0 + j);
            a00 = _mm256_fmadd_ps(a, b0, a00), a01 = _mm256_fmadd_ps(a, b1, a01);
            a = _mm256_broadcast_ss(p1 + j);
            a10 = _mm256_fmadd_ps(a, b0, a10), a11 = _mm256_fmadd_ps(a, b1, a11);
            a = _mm256_broadcast_ss(p2 + j);
            a20 = _mm256_fmadd_ps(a, b0, a20), a21 = _mm256_fmadd_ps(a, b1, a21);
            a = _mm256_broadcast_ss(p3 + j);
            a30 = _mm256_fmadd_ps(a, b0, a30), a31 = _mm256_fmadd_ps(a, b1, a31);
            a = _mm256_broadcast_ss(p4 + j);
            a40 = _mm256_fmadd_ps(a, b0, a40), a41 = _mm256_fmadd_ps(a, b1, a41);
            a = _mm256_broadcast_ss(p5 + j);
            a50 = _mm256_fmadd_ps(a, b0, a50), a51 = _mm256_fmadd_ps(a, b1, a51);
        }
        _mm256_storeu_ps(oc, a00), _mm256_storeu_ps(oc + 8, a01), oc += ldo;
        _mm256_storeu_ps(oc, a10), _mm256_storeu_ps(oc + 8, a11), oc += ldo;
        _mm256_storeu_ps(oc, a20), _mm256_storeu_ps(oc + 8, a21), oc += ldo;
        _mm256_storeu_ps(oc, a30), _mm256_storeu_ps(oc + 8, a31), oc += ldo;
        _mm256_storeu_ps(oc, a40), _mm256_storeu_ps(oc + 8, a41), oc += ldo;
        _mm256_storeu_ps(oc, a50), _mm256_storeu_ps(oc + 8, a51);
    }
}

/* Epilogue of one score row (see mha_flash_isa.row_scores).  A partial last
 * vector goes through an 8-lane buffer padded with -inf. */
static float row_scores_avx2(float *s, int64_t n, int64_t lim, float scale, const float *bias) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), vs = _mm256_set1_ps(scale);
    __m256 mx = ninf, nan = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j < lim; j += 8) {
        float xs[8], xb[8];
        const bool part = lim - j < 8;
        const float *ps = s + j, *pb = bias ? bias + j : NULL;
        if (part) {
            for (int u = 0; u < 8; u++) {
                xs[u] = j + u < lim ? s[j + u] : -INFINITY;
                xb[u] = j + u < lim && bias ? bias[j + u] : -INFINITY;
            }
            ps = xs, pb = bias ? xb : NULL;
        }
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(ps), vs);
        if (pb) {
            __m256 b = _mm256_loadu_ps(pb);
            x = _mm256_blendv_ps(_mm256_add_ps(x, b), ninf, _mm256_cmp_ps(b, ninf, _CMP_EQ_OQ));
        } else if (part) {
            x = _mm256_blendv_ps(x, ninf, _mm256_cmp_ps(_mm256_loadu_ps(ps), ninf, _CMP_EQ_OQ));
        }
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        mx = _mm256_max_ps(mx, x);
        if (part) {
            _mm256_storeu_ps(xs, x);
            for (int64_t u = 0; u < lim - j; u++)
                s[j + u] = xs[u];
        } else {
            _mm256_storeu_ps(s + j, x);
        }
    }
    for (j = lim; j < n; j++)
        s[j] = -INFINITY;
    if (_mm256_movemask_ps(nan))
        return NAN;
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    return _mm_cvtss_f32(m4);
}

/* e^x for the softmax's x = s - m <= 0, or NaN (which propagates): exp256
 * less what this domain never needs, 15 operations instead of 21.  No
 * overflow clamp (x <= 0); x is clamped at -87, so e^x >= 2^-126 stays
 * normal without an underflow mask (such a term is below any row sum >= 1
 * by 38 decades; the caller marks masked entries itself); n = round(x log2
 * e), r = x - n ln2 (ln2 in two parts, Cephes' split), and e^r = 1 + r +
 * r^2 q(r) with q cubic: a least-squares fit on Chebyshev nodes of |r| <=
 * ln2/2, max relative error 1.9e-7 (3 ulp) evaluated in float. */
static inline __m256 exp_softmax256(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x); /* operand order keeps NaN */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 q = _mm256_set1_ps(8.333842270076275e-3f);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.189859703183174e-2f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.666688621044159e-1f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.9999141693115234e-1f));
    const __m256 y =
        _mm256_fmadd_ps(q, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* p = exp(s - m), -0.0f where s is -inf, stored rounded to pdt; returns
 * the sum (8 partial sums) of the unrounded p. */
static inline __attribute__((always_inline)) float row_exp_avx2_as(float *s, int64_t n, float m,
                                                                   mha_dtype pdt) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), vm = _mm256_set1_ps(m);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 8) {
        float xs[8];
        const bool part = n - j < 8;
        float *ps = s + j;
        if (part) {
            for (int u = 0; u < 8; u++)
                xs[u] = j + u < n ? s[j + u] : -INFINITY;
            ps = xs;
        }
        __m256 x = _mm256_loadu_ps(ps);
        __m256 e = exp_softmax256(_mm256_sub_ps(x, vm));
        e = _mm256_blendv_ps(e, sign, _mm256_cmp_ps(x, ninf, _CMP_EQ_OQ)); /* masked: -0 */
        sum = _mm256_add_ps(sum, e);
        _mm256_storeu_ps(ps, round_half256(e, pdt));
        if (part)
            for (int64_t u = 0; u < n - j; u++)
                s[j + u] = xs[u];
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
    return _mm_cvtss_f32(s4);
}

/* See mha_flash_isa.row_exp: row_exp_avx2_as with pdt a constant. */
static float row_exp_avx2(float *s, int64_t n, float m, mha_dtype pdt) {
    return pdt == MHA_F16    ? row_exp_avx2_as(s, n, m, MHA_F16)
           : pdt == MHA_BF16 ? row_exp_avx2_as(s, n, m, MHA_BF16)
                             : row_exp_avx2_as(s, n, m, MHA_F32);
}

/* P rounded to half and back, 8 at a time: F16C's round-to-nearest-even
 * conversion for fp16, bf16_round_bits256 for bf16.  Tails: the scalar
 * rule. */
static void round_row_avx2(float *s, int64_t n, mha_dtype dt) {
    int64_t j = 0;
    if (dt == MHA_F16)
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(s + j, round_half256(_mm256_loadu_ps(s + j), MHA_F16));
    else
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(s + j, round_half256(_mm256_loadu_ps(s + j), MHA_BF16));
    for (; j < n; j++)
        s[j] = mha_round_to(dt, s[j]);
}

/* See mha_flash_isa.narrow_row: 8 at a time as round_row_avx2 rounds (the
 * bf16 halves packed by vpackusdw, whose 128-bit lanes vpermq puts back in
 * order); tails: the scalar rule. */
static void narrow_row_avx2(uint16_t *dst, const float *src, int64_t n, mha_dtype dt) {
    int64_t j = 0;
    if (dt == MHA_F16)
        for (; j + 8 <= n; j += 8)
            _mm_storeu_si128((__m128i *)(dst + j),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT));
    else
        for (; j + 8 <= n; j += 8) {
            const __m256i r = _mm256_srli_epi32(
                bf16_round_bits256(_mm256_castps_si256(_mm256_loadu_ps(src + j))), 16);
            const __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
            _mm_storeu_si128((__m128i *)(dst + j), _mm256_castsi256_si128(h));
        }
    for (; j < n; j++)
        mha_store_f(dst, dt, j, src[j]);
}

/* Half rows widened 8 at a time: F16C for fp16, a 16-bit shift for bf16. */
static void widen_row_avx2(float *dst, const uint16_t *src, mha_dtype dt, int64_t n) {
    int64_t j = 0;
    if (dt == MHA_F16)
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + j))));
    else
        for (; j + 8 <= n; j += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + j)));
            _mm256_storeu_ps(dst + j, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
    for (; j < n; j++)
        dst[j] = mha_load_f(src, dt, j);
}

const mha_flash_isa mha_flash_isa_avx2 = {"avx2",       qk_avx2,        pv_avx2,
                                          row_scores_avx2, row_exp_avx2, round_row_avx2,
                                          widen_row_avx2,  NULL,         NULL, NULL,
                                          narrow_row_avx2};

double mha_fma_peak_loop_avx2(int64_t iters, double *flops) {
    __m256 acc[12];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int u = 0; u < 12; u++)
        acc[u] = _mm256_set1_ps((float)u);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int u = 0; u < 12; u++)
            acc[u] = _mm256_fmadd_ps(acc[u], a, b);
    }
    __m256 t = acc[0];
    for (int u = 1; u < 12; u++)
        t = _mm256_add_ps(t, acc[u]);
    float out[8];
    _mm256_storeu_ps(out, t);
    *flops = (double)iters * 12.0 * 16.0;
    return (double)out[0];
}
