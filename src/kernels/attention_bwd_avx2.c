/* attention_bwd_avx2.c - AVX2+FMA inner loops of the fused attention backward.
 *
 * Letter legend and packed layouts: see attention_bwd.h (MR = 6 rows,
 * NR = 16 columns = 2 YMM, BR query rows per tile, BC keys per block).
 * The portable versions (gemm_scalar, row_grad_scalar) and the driver are in
 * attention_bwd_flash.c.  Compiled with -mavx2 -mfma; only reached after a
 * run-time CPU check.
 *
 * One register-blocked product serves all five GEMMs of the backward
 * (S = Q K^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ = dS K): the A
 * operand is read through a row and a column stride, so P^T and dS^T are
 * broadcast straight from the row-major score tile without a transpose.
 * ref: Goto & van de Geijn, "Anatomy of High-Performance Matrix
 * Multiplication", ACM TOMS 34(3), 2008 (BLIS sgemm haswell 6x16):
 * 12 accumulators + 2 panel loads + 1 broadcast = 15 of 16 YMM registers.
 */
#include "attention_bwd.h"

#include <immintrin.h>
#include <math.h>

#include "simd_avx2.h" /* exp256, transpose8_ps */

enum { MR = MHA_BWD_MR, NR = MHA_BWD_NR };

/* c (MR, np*NR) (+)= a (MR, k) . b (np, k, NR), a(r,x) = a[r*rsa + x*csa] */
static void gemm_avx2(float *c, int64_t ldc, const float *a, int64_t rsa, int64_t csa,
                      const float *b, int64_t pstride, int64_t k, int64_t np, bool acc) {
    for (int64_t pn = 0; pn < np; pn++) {
        const float *bp = b + pn * pstride;
        float *o = c + pn * NR;
        __m256 a00, a01, a10, a11, a20, a21, a30, a31, a40, a41, a50, a51;
        if (acc) {
            a00 = _mm256_loadu_ps(o), a01 = _mm256_loadu_ps(o + 8);
            a10 = _mm256_loadu_ps(o + ldc), a11 = _mm256_loadu_ps(o + ldc + 8);
            a20 = _mm256_loadu_ps(o + 2 * ldc), a21 = _mm256_loadu_ps(o + 2 * ldc + 8);
            a30 = _mm256_loadu_ps(o + 3 * ldc), a31 = _mm256_loadu_ps(o + 3 * ldc + 8);
            a40 = _mm256_loadu_ps(o + 4 * ldc), a41 = _mm256_loadu_ps(o + 4 * ldc + 8);
            a50 = _mm256_loadu_ps(o + 5 * ldc), a51 = _mm256_loadu_ps(o + 5 * ldc + 8);
        } else {
            a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
            a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
        }
        const float *x0 = a, *x1 = a + rsa, *x2 = a + 2 * rsa, *x3 = a + 3 * rsa,
                    *x4 = a + 4 * rsa, *x5 = a + 5 * rsa;
        for (int64_t x = 0; x < k; x++) {
            const int64_t ax = x * csa;
            __m256 b0 = _mm256_load_ps(bp + x * NR), b1 = _mm256_load_ps(bp + x * NR + 8), t;
            t = _mm256_broadcast_ss(x0 + ax);
            a00 = _mm256_fmadd_ps(t, b0, a00), a01 = _mm256_fmadd_ps(t, b1, a01);
            t = _mm256_broadcast_ss(x1 + ax);
            a10 = _mm256_fmadd_ps(t, b0, a10), a11 = _mm256_fmadd_ps(t, b1, a11);
            t = _mm256_broadcast_ss(x2 + ax);
            a20 = _mm256_fmadd_ps(t, b0, a20), a21 = _mm256_fmadd_ps(t, b1, a21);
            t = _mm256_broadcast_ss(x3 + ax);
            a30 = _mm256_fmadd_ps(t, b0, a30), a31 = _mm256_fmadd_ps(t, b1, a31);
            t = _mm256_broadcast_ss(x4 + ax);
            a40 = _mm256_fmadd_ps(t, b0, a40), a41 = _mm256_fmadd_ps(t, b1, a41);
            t = _mm256_broadcast_ss(x5 + ax);
            a50 = _mm256_fmadd_ps(t, b0, a50), a51 = _mm256_fmadd_ps(t, b1, a51);
        }
        _mm256_storeu_ps(o, a00), _mm256_storeu_ps(o + 8, a01), o += ldc;
        _mm256_storeu_ps(o, a10), _mm256_storeu_ps(o + 8, a11), o += ldc;
        _mm256_storeu_ps(o, a20), _mm256_storeu_ps(o + 8, a21), o += ldc;
        _mm256_storeu_ps(o, a30), _mm256_storeu_ps(o + 8, a31), o += ldc;
        _mm256_storeu_ps(o, a40), _mm256_storeu_ps(o + 8, a41), o += ldc;
        _mm256_storeu_ps(o, a50), _mm256_storeu_ps(o + 8, a51);
    }
}

/* See mha_bwd_isa.row_grad: P = exp(s*scale + bias - lse), dS = P (dP - D);
 * exactly 0 past lim and where bias is -inf (a blend, never a multiply, so
 * NaN in a masked score is dropped).  n is a multiple of 8. */
static void row_grad_avx2(float *s, float *dp, int64_t n, int64_t lim, float scale,
                          const float *bias, float lse, float D) {
    const __m256 vs = _mm256_set1_ps(scale), vl = _mm256_set1_ps(lse), vd = _mm256_set1_ps(D);
    const __m256 ninf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
    const __m256 flush = _mm256_set1_ps(MHA_SOFTMAX_FLUSH_X);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t j = 0;
    for (; j < lim; j += 8) {
        __m256 x = _mm256_fmsub_ps(_mm256_loadu_ps(s + j), vs, vl);
        __m256 keep = _mm256_castsi256_ps(
            _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(lim - j)), lane));
        if (bias) {
            __m256 bv = _mm256_loadu_ps(bias + j); /* lanes past lim: stale, masked by keep */
            keep = _mm256_and_ps(keep, _mm256_cmp_ps(bv, ninf, _CMP_NEQ_UQ));
            x = _mm256_add_ps(x, bv);
        }
        keep = _mm256_and_ps(keep, _mm256_cmp_ps(x, flush, _CMP_NLT_UQ)); /* NaN kept */
        __m256 pr = exp256(x);
        __m256 ds = _mm256_mul_ps(pr, _mm256_sub_ps(_mm256_loadu_ps(dp + j), vd));
        _mm256_storeu_ps(s + j, _mm256_blendv_ps(zero, pr, keep));
        _mm256_storeu_ps(dp + j, _mm256_blendv_ps(zero, ds, keep));
    }
    for (; j < n; j += 8) {
        _mm256_storeu_ps(s + j, zero);
        _mm256_storeu_ps(dp + j, zero);
    }
}

/* See mha_bwd_isa.transpose_rows: 8 x 8 tiles in registers (the two row
 * halves of a panel; masked loads past k, zero rows past w),
 * transpose8_ps, one store per half panel row. */
static void transpose_rows_avx2(float *panel, const float *src, int64_t rs, int64_t w,
                                int64_t k) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t x0 = 0; x0 < k; x0 += 8) {
        const int64_t nx = k - x0 < 8 ? k - x0 : 8;
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nx), lane);
        for (int h = 0; h < NR; h += 8) {
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                r[i] = h + i < w ? _mm256_maskload_ps(src + (h + i) * rs + x0, m)
                                 : _mm256_setzero_ps();
            transpose8_ps(r);
            for (int64_t c = 0; c < nx; c++)
                _mm256_store_ps(panel + (x0 + c) * NR + h, r[c]);
        }
    }
}

const mha_bwd_isa mha_bwd_isa_avx2 = {"avx2", gemm_avx2, row_grad_avx2, transpose_rows_avx2,
                                      NULL};
