/* simd_avx2.h - AVX2+FMA helpers shared by the *_avx2.c kernels (private).
 *
 * Include only from files compiled with -mavx2 -mfma (the Makefile's
 * %_avx2.o rule); everything here is static inline, so each kernel keeps
 * its own copy and the instruction sequence is what it was when the helper
 * stood in each file.
 */
#ifndef MHA_KERNELS_SIMD_AVX2_H
#define MHA_KERNELS_SIMD_AVX2_H

#include <immintrin.h>

#include "mha.h" /* mha_dtype */

/* exp(x) for x <= ~88 (and NaN): Cephes expf, error about 1-2 ulp.
 * ref: S. L. Moshier, Cephes Math Library, expf.c: n = round(x log2 e),
 * r = x - n ln2 (ln2 split in two for exactness), e^r by a degree-6
 * polynomial, times 2^n built in the exponent field.  floor() rounds
 * explicitly, so the caller's MXCSR rounding mode does not matter.  Inputs
 * below -87.33 (results under FLT_MIN) give 0, so no denormal is produced;
 * the softmax loses at most e^-87 of a sum that is >= 1.
 * Used by the forward (attention_flash_avx2.c, row_exp) and the backward
 * (attention_bwd_avx2.c, row_grad); the portable loops call expf. */
static inline __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 hi = _mm256_set1_ps(88.3762626647949f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(hi, x); /* operand order keeps NaN */
    x = _mm256_max_ps(lo, x);
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                               _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)),
                                  23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

/* GELU 0.5 x (1 + erf(x / sqrt 2)), erf by Abramowitz and Stegun 7.1.26
 * (|error| <= 1.5e-7; PyTorch's vectorised erf for the exact GELU on CPU).
 * ref: M. Abramowitz, I. Stegun, Handbook of Mathematical Functions, 7.1.26:
 * erfc(a) = t (a1 + t (a2 + ... + t a5)) e^(-a^2), t = 1 / (1 + p a), a >= 0.
 * 1 + erf(z) is taken as erfc(-z) for z < 0 and 2 - erfc(z) otherwise, so
 * the negative tail keeps its relative precision.  The scalar twin is
 * mha_gelu_as_f32 (gemm_packed.c); used by gemm_packed_avx2.c. */
static inline __m256 gelu256(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
    __m256 a = _mm256_andnot_ps(sign, z);
    __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), a, one));
    __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(1.061405429f), t, _mm256_set1_ps(-1.453152027f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(1.421413741f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(-0.284496736f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(0.254829592f));
    __m256 e = _mm256_mul_ps(_mm256_mul_ps(r, t), exp256(_mm256_xor_ps(sign, _mm256_mul_ps(a, a))));
    __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
    __m256 one_plus_erf = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.0f), e), e, neg);
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), one_plus_erf);
}

/* r (8 x 8) transposed in place: r[i] lane j becomes r[j] lane i.  24
 * shuffles: pairs of rows interleaved, then quads, then the 128-bit
 * halves.  Used by the GEMM's transposing packs (gemm_avx2.c), the
 * whole-row forward's K^T (attention_short_avx2.c) and the backward's
 * K^T/V^T panels (attention_bwd_avx2.c). */
static inline __attribute__((always_inline)) void transpose8_ps(__m256 r[8]) {
    __m256 u[8], v[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        u[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        u[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        v[4 * i] = _mm256_shuffle_ps(u[4 * i], u[4 * i + 2], 0x44);
        v[4 * i + 1] = _mm256_shuffle_ps(u[4 * i], u[4 * i + 2], 0xEE);
        v[4 * i + 2] = _mm256_shuffle_ps(u[4 * i + 1], u[4 * i + 3], 0x44);
        v[4 * i + 3] = _mm256_shuffle_ps(u[4 * i + 1], u[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(v[i], v[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(v[i], v[4 + i], 0x31);
    }
}

/* 8 float32 bit patterns rounded to bf16 as mha_float_to_bf16 does, in
 * integer lanes (+ 0x7fff + the lowest kept bit; NaN lanes only get the
 * quiet bit); the bf16 bits are the top half of each lane. */
static inline __m256i bf16_round_bits256(__m256i x) {
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs), inf);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    return _mm256_blendv_epi8(r, _mm256_or_si256(x, _mm256_set1_epi32(0x400000)), nan);
}

/* x rounded to the half type dt and back, bit-identical to mha_round_to:
 * F16C's round-to-nearest-even conversion for fp16, bf16_round_bits256 with
 * the low half cleared for bf16; MHA_F32 unchanged (dt a constant where
 * inlined). */
static inline __attribute__((always_inline)) __m256 round_half256(__m256 x, mha_dtype dt) {
    if (dt == MHA_F16)
        return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    if (dt == MHA_BF16)
        return _mm256_castsi256_ps(_mm256_and_si256(bf16_round_bits256(_mm256_castps_si256(x)),
                                                    _mm256_set1_epi32((int)0xffff0000u)));
    return x;
}

#endif
