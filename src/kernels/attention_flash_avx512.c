/* attention_flash_avx512.c - AVX-512 inner loops of the fused attention.
 *
 * Letter legend and packed layouts: see attention_flash.h (MR = 6 query
 * rows, NR = 16 columns = 1 ZMM, BC keys per block, dvp = dv rounded to NR).
 * The portable versions of each loop are in attention_flash.c and the AVX2
 * ones in attention_flash_avx2.c; the driver is shared, so the packed
 * layouts are the same.  Compiled with AVX512_FLAGS; only reached after
 * mha_avx512_runs() (natively, or emulated in the test library).
 *
 * Register blocking (block6_avx512, simd_avx512.h, shared with the
 * backward): up to four 16-column panels at once, 6 rows x 4 ZMM = 24
 * accumulators, each broadcast of q (or p) feeding four FMAs; per step 4
 * panel loads + 6 broadcasts + 24 FMAs for 768 FLOPs (the AVX2 6x16 block:
 * 2 loads + 6 broadcasts per 12 FMAs of 8 lanes).  Leftover panels take a
 * 6 x 2 and a 6 x 1 block.  Row tails use masked loads and stores instead
 * of a padded buffer.
 */
#include "attention_flash.h"
#include "convert.h"

#include <math.h>

#include "simd_avx512.h"

enum { MR = MHA_FLASH_MR, NR = MHA_FLASH_NR, BC = MHA_FLASH_BC };
_Static_assert(MR == 6 && NR == 16, "block6_avx512 is 6 rows x 16-column panels");

/* s (MR, npanels*NR) = q (MR, d) . kp^T (npanels, d, NR) */
static void qk_avx512(float *s, int64_t lds, const float *q, int64_t ldq, const float *kp,
                      int64_t d, int64_t npanels) {
    panels6_avx512(s, lds, 0, q, ldq, 1, kp, d * NR, d, npanels);
}

/* o (MR, dvp) += p (MR, n) . vp (dvp/NR, BC, NR) */
static void pv_avx512(float *o, int64_t ldo, const float *p, int64_t ldp, const float *vp,
                      int64_t n, int64_t dvp) {
    panels6_avx512(o, ldo, 1, p, ldp, 1, vp, BC * NR, n, dvp / NR);
}

/* One vector of a score row under lanes k: s = scale s + bias (-inf where
 * the bias is), stored; NaN lanes into *nan; returns mx with the lanes'
 * max.  Called with k = 0xffff on whole vectors (a constant: the masks
 * fold away) and with a mask on the tail only. */
static inline __attribute__((always_inline)) __m512
score_vector(float *s, __mmask16 k, __m512 vs, const float *bias, __m512 mx, __mmask16 *nan) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s), vs);
    if (bias) {
        const __m512 b = _mm512_mask_loadu_ps(ninf, k, bias);
        x = _mm512_mask_mov_ps(_mm512_add_ps(x, b), _mm512_cmp_ps_mask(b, ninf, _CMP_EQ_OQ),
                               ninf);
    }
    *nan |= _mm512_mask_cmp_ps_mask(k, x, x, _CMP_UNORD_Q);
    _mm512_mask_storeu_ps(s, k, x);
    return _mm512_mask_max_ps(mx, k, mx, x);
}

/* Epilogue of one score row (see mha_flash_isa.row_scores): whole vectors,
 * then a partial last one under a mask (a mask computed and applied on
 * every vector had been most of this loop's instructions). */
static float row_scores_avx512(float *s, int64_t n, int64_t lim, float scale, const float *bias) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), vs = _mm512_set1_ps(scale);
    __m512 mx = ninf;
    __mmask16 nan = 0;
    int64_t j = 0;
    for (; j + 16 <= lim; j += 16)
        mx = score_vector(s + j, 0xffff, vs, bias ? bias + j : NULL, mx, &nan);
    if (j < lim)
        mx = score_vector(s + j, mask16(lim - j), vs, bias ? bias + j : NULL, mx, &nan);
    for (j = lim; j < n; j += 16)
        _mm512_mask_storeu_ps(s + j, mask16(n - j), ninf);
    return nan ? NAN : _mm512_reduce_max_ps(mx);
}

/* One vector of p = exp(s - m) under lanes k (-0.0f where s is -inf),
 * stored; returns sum + the vector.  e^x as 2^(x log2 e) (exp2_softmax512:
 * 9 vector operations with the multiply, where the Cephes e^x of the AVX2
 * loop took 12, on the ports the products' FMAs need); the rounded x log2 e costs at most
 * 6e-8 |x| relative, 5e-6 at the clamp (x = -87, a weight of 1.6e-38),
 * as in the whole-row kernel, whose scores carry log2 e from Q K^T. */
static inline __attribute__((always_inline)) __m512 exp_vector(float *s, __mmask16 k, __m512 vm,
                                                               __m512 sum, mha_dtype pdt) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512 x = _mm512_mask_loadu_ps(ninf, k, s);
    __m512 e = exp2_softmax512(
        _mm512_mul_ps(_mm512_sub_ps(x, vm), _mm512_set1_ps(1.44269504088896341f)));
    e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, ninf, _CMP_EQ_OQ), _mm512_set1_ps(-0.0f));
    _mm512_mask_storeu_ps(s, k, round_half512(e, pdt)); /* P in v's dtype (pdt) */
    return _mm512_add_ps(sum, e); /* masked lanes: exp(-inf) = -0.0, adding nothing */
}

/* p = exp(s - m), -0.0f where s is -inf, stored rounded to pdt; returns
 * the sum of the unrounded p (16 partial sums, in the same order whether a
 * vector is whole or the masked tail). */
static inline __attribute__((always_inline)) float row_exp_avx512_as(float *s, int64_t n, float m,
                                                                     mha_dtype pdt) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        sum = exp_vector(s + j, 0xffff, vm, sum, pdt);
    if (j < n)
        sum = exp_vector(s + j, mask16(n - j), vm, sum, pdt);
    return _mm512_reduce_add_ps(sum);
}

/* See mha_flash_isa.row_exp: row_exp_avx512_as with pdt a constant. */
static float row_exp_avx512(float *s, int64_t n, float m, mha_dtype pdt) {
    return pdt == MHA_F16    ? row_exp_avx512_as(s, n, m, MHA_F16)
           : pdt == MHA_BF16 ? row_exp_avx512_as(s, n, m, MHA_BF16)
                             : row_exp_avx512_as(s, n, m, MHA_F32);
}

/* Half rows widened 16 at a time: vcvtph2ps for fp16, a 16-bit shift for
 * bf16; tails under a mask. */
static void widen_row_avx512(float *dst, const uint16_t *src, mha_dtype dt, int64_t n) {
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        _mm512_mask_storeu_ps(dst + j, k, widen_half512(_mm256_maskz_loadu_epi16(k, src + j), dt));
    }
}

/* Pairs of two bf16 rows, 16 channels (one 64-byte panel row) at a time:
 * zero-extend each to 32 bits, the second shifted into the high half. */
static bool pair_rows_avx512(uint32_t *dst, int64_t pstep, const uint16_t *a, const uint16_t *b,
                             int64_t n) {
    const __m512i lo_exp = _mm512_set1_epi32(0x7f80), hi_exp = _mm512_set1_epi32(0x7f800000);
    __mmask16 special = 0;
    for (int64_t c = 0; c < n; c += 16) {
        const __mmask16 k = mask16(n - c);
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, a + c));
        const __m512i hi = b ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, b + c))
                             : _mm512_setzero_si512();
        const __m512i x = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
        special |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(lo, lo_exp), lo_exp) |
                   _mm512_cmpeq_epi32_mask(_mm512_and_si512(x, hi_exp), hi_exp);
        _mm512_storeu_si512(dst + (c / 16) * pstep, x);
    }
    return special != 0;
}

/* A float32 V row into its panels, 16 at a time under a mask. */
static bool spread_row_avx512(float *dst, int64_t pstep, const float *src, int64_t n) {
    __mmask16 bad = 0;
    for (int64_t c = 0; c < n; c += 16) {
        const __mmask16 k = mask16(n - c);
        const __m512 x = _mm512_maskz_loadu_ps(k, src + c);
        /* x - x is 0 for finite x, NaN for inf and NaN */
        bad |= _mm512_cmp_ps_mask(_mm512_sub_ps(x, x), _mm512_setzero_ps(), _CMP_NEQ_UQ);
        _mm512_storeu_ps(dst + (c / 16) * pstep, x);
    }
    return bad != 0;
}

#ifndef MHA_AVX512_EMULATED /* SIMDe has no gathers: the emulated table has none */
/* A K panel by 16-lane gathers, one per channel (byte offsets j*row_bytes). */
static void gather_panel_avx512(uint32_t *dst, const char *src, int64_t row_bytes,
                                int64_t col_bytes, int64_t n, int64_t cols, float mul) {
    const __mmask16 k = mask16(n);
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)row_bytes));
    const __m512 vm = _mm512_set1_ps(mul);
    for (int64_t c = 0; c < cols; c++) {
        __m512i x =
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, idx, src + c * col_bytes, 1);
        if (mul != 1.0f)
            x = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(x), vm));
        _mm512_store_si512(dst + c * 16, x);
    }
}
#define GATHER_PANEL gather_panel_avx512
#else
#define GATHER_PANEL NULL
#endif

const mha_flash_isa MHA_AVX512_SYMBOL(mha_flash_isa_avx512) = {
    "avx512",         qk_avx512,      pv_avx512,       row_scores_avx512,
    row_exp_avx512,   round_half_row512, widen_row_avx512, pair_rows_avx512,
    spread_row_avx512, GATHER_PANEL,  narrow_half_row512};

/* An FMA-bound loop (16 independent 16-lane chains): the peak on CPUs whose
 * AVX-512 doubles the FMA width (Intel server cores); on Zen 4, whose
 * 512-bit operations take two passes, it equals the AVX2 loop's. */
double MHA_AVX512_SYMBOL(mha_fma_peak_loop_avx512)(int64_t iters, double *flops) {
    __m512 acc[16];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int u = 0; u < 16; u++)
        acc[u] = _mm512_set1_ps((float)u);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++)
            acc[u] = _mm512_fmadd_ps(acc[u], a, b);
    }
    __m512 t = acc[0];
    for (int u = 1; u < 16; u++)
        t = _mm512_add_ps(t, acc[u]);
    *flops = (double)iters * 16.0 * 32.0;
    return (double)_mm512_reduce_add_ps(t);
}
