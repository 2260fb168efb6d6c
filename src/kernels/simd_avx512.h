/* simd_avx512.h - AVX-512 helpers shared by the *_avx512.c kernels (private).
 *
 * Include only from files compiled with the Makefile's AVX512_FLAGS (F, DQ,
 * BW, VL and the AVX2 set) - natively, or emulated: the test library builds
 * each AVX-512 kernel file a second time with -DMHA_AVX512_EMULATED, and the
 * _mm512 names then come from tests/emu/avx512_emulation.h (SIMDe plus what
 * it lacks), so the same source is checked on CPUs without AVX-512.
 * Everything here is static inline.
 */
#ifndef MHA_KERNELS_SIMD_AVX512_H
#define MHA_KERNELS_SIMD_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#include "mha.h" /* mha_dtype */

#ifdef MHA_AVX512_EMULATED
#include "avx512_emulation.h"
#endif

/* ---- the attention products' register block ---------------------------------- */

/* c (rows, np*16) rows ldc apart (+)= a (rows, steps) . np panels of b
 * (steps, 16), a(r, x) = a[r*rsa + x*csa], panel t at b + t*bstep with its
 * rows 16 floats apart; load_c: the sums start from c, else from 0.  rows
 * and np are constants once inlined (rows * np <= 24), so the arrays unroll
 * into ZMM accumulators: 6 x 4, 6 x 2, 6 x 1 (block6_avx512; at 4: 4 panel
 * loads + 6 broadcasts per 24 FMAs, 29 of 32 registers) or 12 x 2 for the
 * backward's narrow products.  Every element is one FMA chain in step order
 * whatever the shape: the forward (attention_flash_avx512.c) and the five
 * products of the backward (attention_bwd_avx512.c) both run it. */
static inline __attribute__((always_inline)) void
block_avx512(float *c, int64_t ldc, int load_c, const float *a, int64_t rsa, int64_t csa,
             const float *b, int64_t bstep, int64_t steps, const int rows, const int np) {
    __m512 acc[12][4];
#pragma GCC unroll 12
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int t = 0; t < np; t++)
            acc[r][t] = load_c ? _mm512_loadu_ps(c + r * ldc + t * 16) : _mm512_setzero_ps();
    for (int64_t x = 0; x < steps; x++) {
        const float *ax = a + x * csa;
        __m512 bt[4];
#pragma GCC unroll 4
        for (int t = 0; t < np; t++)
            bt[t] = _mm512_load_ps(b + t * bstep + x * 16);
#pragma GCC unroll 12
        for (int r = 0; r < rows; r++) {
            const __m512 av = _mm512_set1_ps(ax[r * rsa]);
#pragma GCC unroll 4
            for (int t = 0; t < np; t++)
                acc[r][t] = _mm512_fmadd_ps(av, bt[t], acc[r][t]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int t = 0; t < np; t++)
            _mm512_storeu_ps(c + r * ldc + t * 16, acc[r][t]);
}

/* Six rows: c (6, np*16) (+)= a (6, steps) . np panels, np = 4, 2 or 1. */
static inline __attribute__((always_inline)) void
block6_avx512(float *c, int64_t ldc, int load_c, const float *a, int64_t rsa, int64_t csa,
              const float *b, int64_t bstep, int64_t steps, const int np) {
    block_avx512(c, ldc, load_c, a, rsa, csa, b, bstep, steps, 6, np);
}

/* block6_avx512 over npanels panels: blocks of 4 panels, then 2, then 1. */
static inline void panels6_avx512(float *c, int64_t ldc, int load_c, const float *a,
                                  int64_t rsa, int64_t csa, const float *b, int64_t bstep,
                                  int64_t steps, int64_t npanels) {
    int64_t p = 0;
    for (; p + 4 <= npanels; p += 4)
        block6_avx512(c + p * 16, ldc, load_c, a, rsa, csa, b + p * bstep, bstep, steps, 4);
    if (p + 2 <= npanels)
        block6_avx512(c + p * 16, ldc, load_c, a, rsa, csa, b + p * bstep, bstep, steps, 2),
            p += 2;
    if (p < npanels)
        block6_avx512(c + p * 16, ldc, load_c, a, rsa, csa, b + p * bstep, bstep, steps, 1);
}

/* Lanes [0, n) of a 16-lane vector (n >= 16: all). */
static inline __mmask16 mask16(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* r (16 x 16) transposed in place: r[i] lane j becomes r[j] lane i.  64
 * shuffles: 32-bit and 64-bit interleaves within the 128-bit lanes, then
 * two rounds of 128-bit lane shuffles (0x88 takes lanes 0 and 2 of each
 * source, 0xdd lanes 1 and 3). */
static inline __attribute__((always_inline)) void transpose16_ps(__m512 r[16]) {
    __m512 a[16], b[16], c[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) { /* a[2i], a[2i+1]: rows 2i, 2i+1 interleaved */
        a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* b[4i+m] lane l: rows 4i..4i+3 of column 4l+m */
        const __m512d x0 = _mm512_castps_pd(a[4 * i]), x1 = _mm512_castps_pd(a[4 * i + 1]);
        const __m512d x2 = _mm512_castps_pd(a[4 * i + 2]), x3 = _mm512_castps_pd(a[4 * i + 3]);
        b[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x2));
        b[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x2));
        b[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(x1, x3));
        b[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(x1, x3));
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) { /* c[4m..4m+3]: the 128-bit lanes regrouped */
        c[4 * m] = _mm512_shuffle_f32x4(b[m], b[4 + m], 0x88);
        c[4 * m + 1] = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0x88);
        c[4 * m + 2] = _mm512_shuffle_f32x4(b[m], b[4 + m], 0xdd);
        c[4 * m + 3] = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0xdd);
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) { /* column 4l + m = row 4l + m of the result */
        r[m] = _mm512_shuffle_f32x4(c[4 * m], c[4 * m + 1], 0x88);
        r[8 + m] = _mm512_shuffle_f32x4(c[4 * m], c[4 * m + 1], 0xdd);
        r[4 + m] = _mm512_shuffle_f32x4(c[4 * m + 2], c[4 * m + 3], 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(c[4 * m + 2], c[4 * m + 3], 0xdd);
    }
}

/* 2^t for a softmax (t <= 0, -inf or NaN), written for P rounded to bf16
 * (attention_flash_avx512bf16.c) and taken by the float32 whole-row kernel
 * (attention_short_avx512.c) and flash forward (row_exp_avx512): t = n + r
 * with n = floor(t) and r in [0, 1)
 * from one vreduceps, 2^r by a degree-5 polynomial (minimax for the
 * relative error on [0, 1), fitted in float64), 2^n by vscalefps under a
 * mask that makes t < -126 (and -inf) exactly 0, as exp2_softmax256's
 * clamp does (NaN propagates): 9 vector operations, where e^x by Cephes'
 * range reduction (exp_softmax256's, with 2^n by vscalefps) took 12 and
 * the scaling before it one more.  Measured against
 * exp2 in float64 for t in [-126, 0], and through row_exp_bf16 against
 * exp(s - m) (steps of 1e-5 over [-87, 0]; the folded log2(e) costs the
 * difference): relative error <= 1.5e-7 and 3.9e-6, against bf16's 2^-9 =
 * 2e-3 rounding step that follows.  Degree 4 (2.7e-6 and 6.5e-6) was no
 * faster and flipped twice as many of those roundings against expf (0.034%
 * of P's values where degree 5 flips 0.015%), which
 * attention_bf16dot_single_block_is_tight sees.  On Zen 4 the bf16 pass
 * runs in about 0.24 ns an element on one core, the previous one (e^x, 10
 * operations, a clamp and a separate scaling) in 0.33. */
static inline __m512 exp2_softmax512(__m512 t) {
    const __m512 r = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(1.877576578e-3f), r, _mm512_set1_ps(8.989340626e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.582631752e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(2.401536107e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(6.931530833e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(9.999999404e-1f));
    /* below 2^-126 exactly 0, never a denormal: denormal weights (vscalefps
     * results, then FMA inputs) took microcode assists on Intel, 17-20x the
     * time of a row whose scores spread past 126 (log2 units); NaN lanes
     * pass the compare (unordered), so NaN still propagates */
    const __mmask16 normal = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
    return _mm512_maskz_scalef_ps(normal, y, t);
}

/* The max of s[0, n), n >= 1: four independent chains of 16 lanes over
 * whole vectors, then the tail under a mask (vmaxps: a NaN may or may not
 * win; the softmax rows that take it come out NaN either way through their
 * exp).  One chain with a mask per step had been latency-bound (4 cycles a
 * vector) and 30 % of the whole-row softmax (perf, Intel Xeon, L 2048);
 * the max does not depend on the order, so the bits are those of one
 * chain. */
static inline float row_max512(const float *s, int64_t n) {
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(s + j));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(s + j + 16));
        m2 = _mm512_max_ps(m2, _mm512_loadu_ps(s + j + 32));
        m3 = _mm512_max_ps(m3, _mm512_loadu_ps(s + j + 48));
    }
    for (; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        m0 = _mm512_mask_max_ps(m0, k, m0, _mm512_maskz_loadu_ps(k, s + j));
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

/* The whole-row softmax's weights of 16 scores x (log2 units) under lanes
 * k: 2^(x - m), 0 outside k, and -0.0 - the mark of a skipped key - where x
 * is -inf (those lanes added to *marked). */
static inline __m512 exp2_marked512(__m512 x, __m512 m, __mmask16 k, __mmask16 *marked) {
    const __mmask16 neg = _mm512_mask_cmp_ps_mask(k, x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    *marked |= neg;
    return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(k, exp2_softmax512(_mm512_sub_ps(x, m))), neg,
                              _mm512_set1_ps(-0.0f));
}

/* exp(x) over the whole float range (and NaN): exp256's Cephes expf
 * (simd_avx2.h; 1-2 ulp) with 2^n by vscalefps; x below -87.33 gives 0 (no
 * denormal), above 88.38 gives the clamp's finite value as exp256 does. */
static inline __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_set1_ps(88.3762626647949f), x); /* operand order keeps NaN */
    x = _mm512_max_ps(lo, x);
    const __m512 n = _mm512_roundscale_ps(
        _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps((__mmask16)~under, _mm512_scalef_ps(y, n));
}

/* GELU 0.5 x (1 + erf(x / sqrt 2)): gelu256 (simd_avx2.h) 16 lanes wide,
 * the same operations in the same order, so the same bits lane for lane
 * (exp512's vscalefps multiplies by the same power of two as exp256's
 * exponent field). */
static inline __m512 gelu512(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 z = _mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f));
    const __m512 a = _mm512_abs_ps(z);
    const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), a, one));
    __m512 r = _mm512_fmadd_ps(_mm512_set1_ps(1.061405429f), t, _mm512_set1_ps(-1.453152027f));
    r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(1.421413741f));
    r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(-0.284496736f));
    r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(0.254829592f));
    const __m512 e = _mm512_mul_ps(_mm512_mul_ps(r, t), exp512(_mm512_xor_ps(_mm512_set1_ps(-0.0f),
                                                                               _mm512_mul_ps(a, a))));
    const __mmask16 neg = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 one_plus_erf =
        _mm512_mask_mov_ps(_mm512_sub_ps(_mm512_set1_ps(2.0f), e), neg, e);
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), one_plus_erf);
}

/* 16 half values (fp16 or bf16 bits) widened to float32: vcvtph2ps for
 * fp16; bf16 is the top half of a float, so zero-extend and shift left 16. */
static inline __m512 widen_half512(__m256i h, mha_dtype dt) {
    return dt == MHA_F16 ? _mm512_cvtph_ps(h)
                         : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 float32 bit patterns rounded to bf16 as mha_float_to_bf16
 * (convert.h) does, in integer lanes: + 0x7fff + the lowest kept bit, NaN
 * lanes only getting the quiet bit (0x00400000) so they stay NaN; the bf16
 * bits are the top half of each lane (the low half is left as it comes). */
static inline __m512i bf16_round_bits512(__m512i x) {
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, abs), inf);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(x, _mm512_set1_epi32(0x400000)));
}

/* x rounded to the type dt and back, bit-identical to mha_round_to
 * (convert.h): fp16 by a vcvtps2ph (round to nearest even, subnormals
 * kept) / vcvtph2ps round trip, bf16 by bf16_round_bits512 with the low
 * half cleared, MHA_F32 unchanged.  dt a constant where it is inlined. */
static inline __attribute__((always_inline)) __m512 round_half512(__m512 x, mha_dtype dt) {
    if (dt == MHA_F16)
        return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    if (dt == MHA_BF16)
        return _mm512_castsi512_ps(_mm512_and_si512(bf16_round_bits512(_mm512_castps_si512(x)),
                                                    _mm512_set1_epi32((int)0xffff0000u)));
    return x;
}

/* p (n) rounded in place to the half type dt and back (round_half512), 16
 * at a time, the tail under a mask. */
static inline void round_half_row512(float *p, int64_t n, mha_dtype dt) {
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        const __m512 x = _mm512_maskz_loadu_ps(k, p + j);
        _mm512_mask_storeu_ps(p + j, k,
                              dt == MHA_F16 ? round_half512(x, MHA_F16) : round_half512(x, MHA_BF16));
    }
}

/* dst (n) = src (n) as the half type dt, bit-identical to mha_store_f
 * (convert.h): fp16 by vcvtps2ph (round to nearest even, subnormals kept),
 * bf16 by bf16_round_bits512; 16 at a time, the tail under a mask. */
static inline void narrow_half_row512(uint16_t *dst, const float *src, int64_t n, mha_dtype dt) {
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        const __m512 x = _mm512_maskz_loadu_ps(k, src + j);
        if (dt == MHA_F16)
            _mm256_mask_storeu_epi16(dst + j, k, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        else
            _mm256_mask_storeu_epi16(dst + j, k,
                                     _mm512_cvtepi32_epi16(_mm512_srli_epi32(
                                         bf16_round_bits512(_mm512_castps_si512(x)), 16)));
    }
}

#endif /* MHA_KERNELS_SIMD_AVX512_H */
