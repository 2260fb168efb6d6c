/* attention_flash_avx512.c - AVX-512 inner loops of the fused attention.
 *
 * Letter legend and packed layouts: see attention_flash.h (MR = 6 query
 * rows, NR = 16 columns = 1 ZMM, BC keys per block, dvp = dv rounded to NR).
 * The portable versions of each loop are in attention_flash.c and the AVX2
 * ones in attention_flash_avx2.c; the driver is shared, so the packed
 * layouts are the same.  Compiled with AVX512_FLAGS; only reached after
 * mha_avx512_runs() (natively, or emulated in the test library).
 *
 * Register blocking: two 16-column panels at once, 6 rows x 2 ZMM = 12
 * accumulators, each broadcast of q (or p) feeding two FMAs; per step 2
 * panel loads + 6 broadcasts + 12 FMAs for 384 FLOPs, half the instructions
 * of the AVX2 6x16 block.  An odd last panel takes a 6 x 1 ZMM block.  Row
 * tails use masked loads and stores instead of a padded buffer.
 */
#include "attention_flash.h"
#include "convert.h"

#include <math.h>

#include "simd_avx512.h"

enum { MR = MHA_FLASH_MR, NR = MHA_FLASH_NR, BC = MHA_FLASH_BC };

/* 6 rows x 2 panels: acc[r][0..1] (+)= a[r] . (b0 | b1) over k steps.  a's
 * row r starts at a + r*lda (step 1); panel rows bstep floats apart. */
#define BLOCK2_STEP(a0, lda, j, b0, b1)                                                       \
    do {                                                                                      \
        __m512 x_;                                                                            \
        x_ = _mm512_set1_ps((a0)[j]);                                                         \
        c00 = _mm512_fmadd_ps(x_, b0, c00), c01 = _mm512_fmadd_ps(x_, b1, c01);               \
        x_ = _mm512_set1_ps((a0)[(lda) + (j)]);                                               \
        c10 = _mm512_fmadd_ps(x_, b0, c10), c11 = _mm512_fmadd_ps(x_, b1, c11);               \
        x_ = _mm512_set1_ps((a0)[2 * (lda) + (j)]);                                           \
        c20 = _mm512_fmadd_ps(x_, b0, c20), c21 = _mm512_fmadd_ps(x_, b1, c21);               \
        x_ = _mm512_set1_ps((a0)[3 * (lda) + (j)]);                                           \
        c30 = _mm512_fmadd_ps(x_, b0, c30), c31 = _mm512_fmadd_ps(x_, b1, c31);               \
        x_ = _mm512_set1_ps((a0)[4 * (lda) + (j)]);                                           \
        c40 = _mm512_fmadd_ps(x_, b0, c40), c41 = _mm512_fmadd_ps(x_, b1, c41);               \
        x_ = _mm512_set1_ps((a0)[5 * (lda) + (j)]);                                           \
        c50 = _mm512_fmadd_ps(x_, b0, c50), c51 = _mm512_fmadd_ps(x_, b1, c51);               \
    } while (0)

#define BLOCK1_STEP(a0, lda, j, b0)                                                           \
    do {                                                                                      \
        c00 = _mm512_fmadd_ps(_mm512_set1_ps((a0)[j]), b0, c00);                              \
        c10 = _mm512_fmadd_ps(_mm512_set1_ps((a0)[(lda) + (j)]), b0, c10);                    \
        c20 = _mm512_fmadd_ps(_mm512_set1_ps((a0)[2 * (lda) + (j)]), b0, c20);                \
        c30 = _mm512_fmadd_ps(_mm512_set1_ps((a0)[3 * (lda) + (j)]), b0, c30);                \
        c40 = _mm512_fmadd_ps(_mm512_set1_ps((a0)[4 * (lda) + (j)]), b0, c40);                \
        c50 = _mm512_fmadd_ps(_mm512_set1_ps((a0)[5 * (lda) + (j)]), b0, c50);                \
    } while (0)

/* s (MR, npanels*NR) = q (MR, d) . kp^T (npanels, d, NR) */
static void qk_avx512(float *s, int64_t lds, const float *q, int64_t ldq, const float *kp,
                      int64_t d, int64_t npanels) {
    int64_t p = 0;
    for (; p + 2 <= npanels; p += 2) {
        const float *k0 = kp + p * d * NR, *k1 = k0 + d * NR;
        __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
               c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
        for (int64_t c = 0; c < d; c++) {
            const __m512 b0 = _mm512_load_ps(k0 + c * NR), b1 = _mm512_load_ps(k1 + c * NR);
            BLOCK2_STEP(q, ldq, c, b0, b1);
        }
        float *o = s + p * NR;
        _mm512_storeu_ps(o, c00), _mm512_storeu_ps(o + NR, c01), o += lds;
        _mm512_storeu_ps(o, c10), _mm512_storeu_ps(o + NR, c11), o += lds;
        _mm512_storeu_ps(o, c20), _mm512_storeu_ps(o + NR, c21), o += lds;
        _mm512_storeu_ps(o, c30), _mm512_storeu_ps(o + NR, c31), o += lds;
        _mm512_storeu_ps(o, c40), _mm512_storeu_ps(o + NR, c41), o += lds;
        _mm512_storeu_ps(o, c50), _mm512_storeu_ps(o + NR, c51);
    }
    if (p < npanels) {
        const float *k0 = kp + p * d * NR;
        __m512 c00 = _mm512_setzero_ps(), c10 = c00, c20 = c00, c30 = c00, c40 = c00, c50 = c00;
        for (int64_t c = 0; c < d; c++) {
            const __m512 b0 = _mm512_load_ps(k0 + c * NR);
            BLOCK1_STEP(q, ldq, c, b0);
        }
        float *o = s + p * NR;
        _mm512_storeu_ps(o, c00), o += lds;
        _mm512_storeu_ps(o, c10), o += lds;
        _mm512_storeu_ps(o, c20), o += lds;
        _mm512_storeu_ps(o, c30), o += lds;
        _mm512_storeu_ps(o, c40), o += lds;
        _mm512_storeu_ps(o, c50);
    }
}

/* o (MR, dvp) += p (MR, n) . vp (dvp/NR, BC, NR) */
static void pv_avx512(float *o, int64_t ldo, const float *p, int64_t ldp, const float *vp,
                      int64_t n, int64_t dvp) {
    const int64_t np = dvp / NR;
    int64_t cp = 0;
    for (; cp + 2 <= np; cp += 2) {
        const float *v0 = vp + cp * BC * NR, *v1 = v0 + BC * NR;
        float *oc = o + cp * NR;
        __m512 c00 = _mm512_loadu_ps(oc), c01 = _mm512_loadu_ps(oc + NR);
        __m512 c10 = _mm512_loadu_ps(oc + ldo), c11 = _mm512_loadu_ps(oc + ldo + NR);
        __m512 c20 = _mm512_loadu_ps(oc + 2 * ldo), c21 = _mm512_loadu_ps(oc + 2 * ldo + NR);
        __m512 c30 = _mm512_loadu_ps(oc + 3 * ldo), c31 = _mm512_loadu_ps(oc + 3 * ldo + NR);
        __m512 c40 = _mm512_loadu_ps(oc + 4 * ldo), c41 = _mm512_loadu_ps(oc + 4 * ldo + NR);
        __m512 c50 = _mm512_loadu_ps(oc + 5 * ldo), c51 = _mm512_loadu_ps(oc + 5 * ldo + NR);
        for (int64_t j = 0; j < n; j++) {
            const __m512 b0 = _mm512_load_ps(v0 + j * NR), b1 = _mm512_load_ps(v1 + j * NR);
            BLOCK2_STEP(p, ldp, j, b0, b1);
        }
        _mm512_storeu_ps(oc, c00), _mm512_storeu_ps(oc + NR, c01), oc += ldo;
        _mm512_storeu_ps(oc, c10), _mm512_storeu_ps(oc + NR, c11), oc += ldo;
        _mm512_storeu_ps(oc, c20), _mm512_storeu_ps(oc + NR, c21), oc += ldo;
        _mm512_storeu_ps(oc, c30), _mm512_storeu_ps(oc + NR, c31), oc += ldo;
        _mm512_storeu_ps(oc, c40), _mm512_storeu_ps(oc + NR, c41), oc += ldo;
        _mm512_storeu_ps(oc, c50), _mm512_storeu_ps(oc + NR, c51);
    }
    if (cp < np) {
        const float *v0 = vp + cp * BC * NR;
        float *oc = o + cp * NR;
        __m512 c00 = _mm512_loadu_ps(oc), c10 = _mm512_loadu_ps(oc + ldo);
        __m512 c20 = _mm512_loadu_ps(oc + 2 * ldo), c30 = _mm512_loadu_ps(oc + 3 * ldo);
        __m512 c40 = _mm512_loadu_ps(oc + 4 * ldo), c50 = _mm512_loadu_ps(oc + 5 * ldo);
        for (int64_t j = 0; j < n; j++) {
            const __m512 b0 = _mm512_load_ps(v0 + j * NR);
            BLOCK1_STEP(p, ldp, j, b0);
        }
        _mm512_storeu_ps(oc, c00), oc += ldo;
        _mm512_storeu_ps(oc, c10), oc += ldo;
        _mm512_storeu_ps(oc, c20), oc += ldo;
        _mm512_storeu_ps(oc, c30), oc += ldo;
        _mm512_storeu_ps(oc, c40), oc += ldo;
        _mm512_storeu_ps(oc, c50);
    }
}

/* Epilogue of one score row (see mha_flash_isa.row_scores); a partial last
 * vector is loaded and stored under a mask. */
static float row_scores_avx512(float *s, int64_t n, int64_t lim, float scale, const float *bias) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), vs = _mm512_set1_ps(scale);
    __m512 mx = ninf;
    __mmask16 nan = 0;
    for (int64_t j = 0; j < lim; j += 16) {
        const __mmask16 k = mask16(lim - j);
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), vs);
        if (bias) {
            const __m512 b = _mm512_mask_loadu_ps(ninf, k, bias + j);
            x = _mm512_mask_mov_ps(_mm512_add_ps(x, b), _mm512_cmp_ps_mask(b, ninf, _CMP_EQ_OQ),
                                   ninf);
        }
        nan |= _mm512_mask_cmp_ps_mask(k, x, x, _CMP_UNORD_Q);
        mx = _mm512_mask_max_ps(mx, k, mx, x);
        _mm512_mask_storeu_ps(s + j, k, x);
    }
    for (int64_t j = lim; j < n; j += 16)
        _mm512_mask_storeu_ps(s + j, mask16(n - j), ninf);
    return nan ? NAN : _mm512_reduce_max_ps(mx);
}

/* p = exp(s - m), -0.0f where s is -inf; returns the sum (16 partial sums). */
static float row_exp_avx512(float *s, int64_t n, float m) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), vm = _mm512_set1_ps(m);
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        const __m512 x = _mm512_mask_loadu_ps(ninf, k, s + j);
        __m512 e = exp_softmax512(_mm512_sub_ps(x, vm));
        e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, ninf, _CMP_EQ_OQ), sign); /* masked */
        sum = _mm512_add_ps(sum, e);
        _mm512_mask_storeu_ps(s + j, k, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* Half rows widened 16 at a time: vcvtph2ps for fp16, a 16-bit shift for
 * bf16; tails under a mask. */
static void widen_row_avx512(float *dst, const uint16_t *src, mha_dtype dt, int64_t n) {
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        _mm512_mask_storeu_ps(dst + j, k, widen_half512(_mm256_maskz_loadu_epi16(k, src + j), dt));
    }
}

const mha_flash_isa MHA_AVX512_SYMBOL(mha_flash_isa_avx512) = {
    "avx512",         qk_avx512,      pv_avx512,       row_scores_avx512,
    row_exp_avx512,   round_half_row512, widen_row_avx512};

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
