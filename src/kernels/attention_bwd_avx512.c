/* attention_bwd_avx512.c - AVX-512 inner loops of the fused attention backward.
 *
 * Letter legend and packed layouts: see attention_bwd.h (MR = 6 rows,
 * NR = 16 columns = 1 ZMM, BR query rows per tile, BC keys per block).
 * The portable versions (gemm_scalar, row_grad_scalar) and the driver are in
 * attention_bwd_flash.c, the AVX2 ones in attention_bwd_avx2.c; the driver
 * is shared, so the packed layouts are the same.  Compiled with
 * AVX512_FLAGS; only reached after mha_avx512_runs() (natively, or emulated
 * in the test library).
 *
 * One register-blocked product serves all five GEMMs of the backward
 * (S = Q K^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ = dS K), the A
 * operand read through a row and a column stride as in the AVX2 loop.
 * Register blocking: up to four 16-column panels at once, 6 rows x 4 ZMM =
 * 24 accumulators, each broadcast of A feeding four FMAs; per step 4 panel
 * loads + 6 broadcasts + 24 FMAs for 768 FLOPs (29 of 32 ZMM live).  Left
 * over panels take a 6 x 2 and a 6 x 1 block.  Each output
 * element is summed over k in the same order with one FMA per step as in
 * the AVX2 loop, so the products round identically.  The score-row epilogue
 * runs 16 lanes at a time with masked tails (no scalar tail, no padding
 * reads past the row).
 * ref: Goto & van de Geijn, "Anatomy of High-Performance Matrix
 * Multiplication", ACM TOMS 34(3), 2008.
 */
#include "attention_bwd.h"

#include <math.h>

#include "simd_avx512.h" /* block_avx512, panels6_avx512, mask16, exp512 */

enum { MR = MHA_BWD_MR, NR = MHA_BWD_NR };
_Static_assert(MR == 6 && NR == 16, "block6_avx512 is 6 rows x 16-column panels");

/* c (MR, np*NR) (+)= a (MR, k) . b (np, k, NR), a(r,x) = a[r*rsa + x*csa]:
 * block6_avx512's panel walk (simd_avx512.h). */
static void gemm_avx512(float *c, int64_t ldc, const float *a, int64_t rsa, int64_t csa,
                        const float *b, int64_t pstride, int64_t k, int64_t np, bool acc) {
    /* the strides as constants where the driver passes 1 (fewer live
     * registers in the k loop: at 2 panels the generic one kept row offsets
     * in XMM registers) */
    if (rsa == 1) /* a read transposed (P^T, dS^T): the six rows adjacent */
        panels6_avx512(c, ldc, acc, a, 1, csa, b, pstride, k, np);
    else if (csa == 1) /* a row-major (Q, dO, dS) */
        panels6_avx512(c, ldc, acc, a, rsa, 1, b, pstride, k, np);
    else
        panels6_avx512(c, ldc, acc, a, rsa, csa, b, pstride, k, np);
}

/* See mha_bwd_isa.gemm_tall: block_avx512 on 12 rows x 1 or 2 panels (24
 * accumulators at 2, where 6 rows keep 12), with the two strides the driver
 * passes (rsa = 1: P^T or dS^T, the twelve rows adjacent; csa = 1: dS
 * row-major) as constants, so the twelve broadcasts are one pointer with
 * immediate offsets or a few row-stride multiples (no spilled row
 * pointers).  The same FMA chain per element as gemm_avx512's. */
static void gemm_tall_avx512(float *c, int64_t ldc, const float *a, int64_t rsa, int64_t csa,
                             const float *b, int64_t pstride, int64_t k, int64_t np, bool acc) {
    if (rsa == 1 && np == 2)
        block_avx512(c, ldc, acc, a, 1, csa, b, pstride, k, 12, 2);
    else if (rsa == 1)
        block_avx512(c, ldc, acc, a, 1, csa, b, pstride, k, 12, 1);
    else if (csa == 1 && np == 2)
        block_avx512(c, ldc, acc, a, rsa, 1, b, pstride, k, 12, 2);
    else if (csa == 1)
        block_avx512(c, ldc, acc, a, rsa, 1, b, pstride, k, 12, 1);
    else {
        gemm_avx512(c, ldc, a, rsa, csa, b, pstride, k, np, acc);
        gemm_avx512(c + 6 * ldc, ldc, a + 6 * rsa, rsa, csa, b, pstride, k, np, acc);
    }
}

/* One vector of row_grad_avx512 under lanes `in` (< lim), stored under
 * `out` (< n).  Called with in = out = 0xffff on whole vectors (a
 * constant: the masks fold away), with masks on the last one. */
static inline __attribute__((always_inline)) void
grad_vector(float *s, float *dp, __mmask16 in, __mmask16 out, __m512 vs, const float *bias,
            __m512 vl, __m512 vd) {
    __m512 x = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(in, s), vs, vl);
    __mmask16 keep = in;
    if (bias) {
        const __m512 bv = _mm512_maskz_loadu_ps(in, bias);
        keep = _mm512_mask_cmp_ps_mask(in, bv, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ);
        x = _mm512_add_ps(x, bv);
    }
    keep = _mm512_mask_cmp_ps_mask(keep, x, _mm512_set1_ps(MHA_SOFTMAX_FLUSH_X), _CMP_NLT_UQ);
    const __m512 pr = exp512(x);
    const __m512 ds = _mm512_mul_ps(pr, _mm512_sub_ps(_mm512_maskz_loadu_ps(in, dp), vd));
    _mm512_mask_storeu_ps(s, out, _mm512_maskz_mov_ps(keep, pr));
    _mm512_mask_storeu_ps(dp, out, _mm512_maskz_mov_ps(keep, ds));
}

/* See mha_bwd_isa.row_grad: P = exp(s*scale + bias - lse), dS = P (dP - D);
 * exactly 0 past lim and where bias is -inf (a masked move, never a
 * multiply, so NaN in a masked score is dropped; a NaN bias is kept and
 * propagates, as in the AVX2 and scalar loops).  exp512 is exp256's
 * full-range expf (s*scale - lse may be far below the softmax's range).
 * Lanes past lim are neither read nor used; stores stop at n.  Whole
 * vectors first, without masks (a mask computed per vector had been a
 * good part of this loop's instructions), then the partial one. */
static void row_grad_avx512(float *s, float *dp, int64_t n, int64_t lim, float scale,
                            const float *bias, float lse, float D) {
    const __m512 vs = _mm512_set1_ps(scale), vl = _mm512_set1_ps(lse), vd = _mm512_set1_ps(D);
    const __m512 zero = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= lim; j += 16)
        grad_vector(s + j, dp + j, 0xffff, 0xffff, vs, bias ? bias + j : NULL, vl, vd);
    if (j < lim) {
        grad_vector(s + j, dp + j, mask16(lim - j), mask16(n - j), vs, bias ? bias + j : NULL,
                    vl, vd);
        j += 16;
    }
    for (; j < n; j += 16) {
        const __mmask16 out = mask16(n - j);
        _mm512_mask_storeu_ps(s + j, out, zero);
        _mm512_mask_storeu_ps(dp + j, out, zero);
    }
}

/* See mha_bwd_isa.transpose_rows: 16 x 16 tiles in registers (masked
 * loads past k, zero rows past w), transpose16_ps, one aligned store per
 * panel row. */
static void transpose_rows_avx512(float *panel, const float *src, int64_t rs, int64_t w,
                                  int64_t k) {
    for (int64_t x0 = 0; x0 < k; x0 += 16) {
        const __mmask16 m = mask16(k - x0);
        __m512 r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            r[i] = i < w ? _mm512_maskz_loadu_ps(m, src + i * rs + x0) : _mm512_setzero_ps();
        transpose16_ps(r);
        const int64_t nx = k - x0 < 16 ? k - x0 : 16;
        for (int64_t c = 0; c < nx; c++)
            _mm512_store_ps(panel + (x0 + c) * NR, r[c]);
    }
}

const mha_bwd_isa MHA_AVX512_SYMBOL(mha_bwd_isa_avx512) = {"avx512", gemm_avx512,
                                                            row_grad_avx512,
                                                            transpose_rows_avx512,
                                                            gemm_tall_avx512};
