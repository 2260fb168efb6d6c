/* attention_flash_avx512bf16.c - the fused attention's Q.K^T and P.V tile
 * products on bf16 pairs with vdpbf16ps (AVX512_BF16).
 *
 * Letter legend and packed layouts: see attention_flash.h (MR = 6 query
 * rows, NR = 16 columns = 1 ZMM of float32 or of bf16 pairs, BC keys per
 * block, d2 = ceil(d/2), dvp = dv rounded to NR).  The driver
 * (attention_flash.c) packs bf16 q tiles and K blocks as pairs along d and
 * bf16 V blocks as pairs along the key axis, once per block; everything else
 * (softmax, masks, the output) is the float32 path of
 * attention_flash_avx512.c.  Compiled with AVX512BF16_FLAGS; only reached
 * after mha_avx512_bf16_runs() (natively, or emulated in the test library).
 *
 * Precision: a product of two bf16 values (8-bit significands) is exact in
 * float32, and vdpbf16ps adds it in float32 (ref: Intel SDM, VDPBF16PS:
 * two FMAs per lane, odd pair element first, round to nearest even,
 * denormal inputs read as 0 and denormal results flushed), so Q.K^T differs
 * from the float32 loops on the widened values only by the order of the
 * float32 sums, and so does P.V, P being rounded to bf16 before (the
 * rounding rule of attention_flash.c), which makes its conversion to pairs
 * exact.  Values below 2^-126 count as 0: far below the bf16 tolerances.
 *
 * Register blocking: as the float32 loops, 6 rows x 2 panels = 12 ZMM
 * accumulators; per step 2 aligned 64-byte panel loads (16 columns x one
 * pair each), 6 broadcasts of a 32-bit pair and 12 vdpbf16ps: 768 FLOPs,
 * twice the float32 step's 384 for the same instruction count, with half
 * the bytes of packed K/V streamed (a d = 128 K block is 32 KB, not 64).
 * An odd last panel takes a 6 x 1 ZMM block.  P's conversion to pairs is
 * done once per call for all column panels (a 6 x BC/2 pair buffer on the
 * stack, vcvtne2ps2bf16 on masked loads, which also zero-pads odd n).
 *
 * Expected on Zen 4 (not measured here: this machine has no AVX-512 and
 * emulated timings mean nothing): vdpbf16ps zmm sustains one per cycle,
 * 64 FLOPs, i.e. 233 GFLOP/s per core against 116 for float32 FMA (issue
 * 16); its latency (about 6 cycles) is covered by the 12 independent
 * accumulators, and 8 loads per 12 dot instructions stay under the load
 * ports' rate.  So both tile products should run near 2x the float32 loops;
 * the softmax (exp, max, rescale) is unchanged, so the whole forward gains
 * less - about 1.5x at d = 64 and 1.7x at d = 128 by the products' share of
 * the float32 forward - to be measured on an AVX512_BF16 machine with
 * `mha bench`.
 */
#include "attention_flash.h"

#include <string.h>

#include "simd_avx512.h"

enum { MR = MHA_FLASH_MR, NR = MHA_FLASH_NR, BC = MHA_FLASH_BC };

/* A vector of 32 bf16 (16 pairs) from integer lanes: the same 64 bytes. */
static inline __m512bh as_bh(__m512i x) {
    __m512bh r;
    memcpy(&r, &x, sizeof r);
    return r;
}

/* 6 rows x 2 panels: acc[r][0..1] += pair a[r] . (b0 | b1); a's row r at
 * a + r*lda (pairs). */
#define DOT2_STEP(a, lda, j, b0, b1)                                                          \
    do {                                                                                      \
        __m512bh x_;                                                                          \
        x_ = as_bh(_mm512_set1_epi32((int)(a)[j]));                                           \
        c00 = _mm512_dpbf16_ps(c00, x_, b0), c01 = _mm512_dpbf16_ps(c01, x_, b1);             \
        x_ = as_bh(_mm512_set1_epi32((int)(a)[(lda) + (j)]));                                 \
        c10 = _mm512_dpbf16_ps(c10, x_, b0), c11 = _mm512_dpbf16_ps(c11, x_, b1);             \
        x_ = as_bh(_mm512_set1_epi32((int)(a)[2 * (lda) + (j)]));                             \
        c20 = _mm512_dpbf16_ps(c20, x_, b0), c21 = _mm512_dpbf16_ps(c21, x_, b1);             \
        x_ = as_bh(_mm512_set1_epi32((int)(a)[3 * (lda) + (j)]));                             \
        c30 = _mm512_dpbf16_ps(c30, x_, b0), c31 = _mm512_dpbf16_ps(c31, x_, b1);             \
        x_ = as_bh(_mm512_set1_epi32((int)(a)[4 * (lda) + (j)]));                             \
        c40 = _mm512_dpbf16_ps(c40, x_, b0), c41 = _mm512_dpbf16_ps(c41, x_, b1);             \
        x_ = as_bh(_mm512_set1_epi32((int)(a)[5 * (lda) + (j)]));                             \
        c50 = _mm512_dpbf16_ps(c50, x_, b0), c51 = _mm512_dpbf16_ps(c51, x_, b1);             \
    } while (0)

#define DOT1_STEP(a, lda, j, b0)                                                              \
    do {                                                                                      \
        c00 = _mm512_dpbf16_ps(c00, as_bh(_mm512_set1_epi32((int)(a)[j])), b0);               \
        c10 = _mm512_dpbf16_ps(c10, as_bh(_mm512_set1_epi32((int)(a)[(lda) + (j)])), b0);     \
        c20 = _mm512_dpbf16_ps(c20, as_bh(_mm512_set1_epi32((int)(a)[2 * (lda) + (j)])), b0); \
        c30 = _mm512_dpbf16_ps(c30, as_bh(_mm512_set1_epi32((int)(a)[3 * (lda) + (j)])), b0); \
        c40 = _mm512_dpbf16_ps(c40, as_bh(_mm512_set1_epi32((int)(a)[4 * (lda) + (j)])), b0); \
        c50 = _mm512_dpbf16_ps(c50, as_bh(_mm512_set1_epi32((int)(a)[5 * (lda) + (j)])), b0); \
    } while (0)

/* s (MR, npanels*NR) = q (MR, d2) pairs . kp^T (npanels, d2, NR) pairs */
static void qk_bf16_avx512(float *s, int64_t lds, const uint32_t *q, int64_t ldq,
                           const uint32_t *kp, int64_t d2, int64_t npanels) {
    int64_t p = 0;
    for (; p + 2 <= npanels; p += 2) {
        const uint32_t *k0 = kp + p * d2 * NR, *k1 = k0 + d2 * NR;
        __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
               c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
        for (int64_t c = 0; c < d2; c++) {
            const __m512bh b0 = as_bh(_mm512_load_si512(k0 + c * NR));
            const __m512bh b1 = as_bh(_mm512_load_si512(k1 + c * NR));
            DOT2_STEP(q, ldq, c, b0, b1);
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
        const uint32_t *k0 = kp + p * d2 * NR;
        __m512 c00 = _mm512_setzero_ps(), c10 = c00, c20 = c00, c30 = c00, c40 = c00, c50 = c00;
        for (int64_t c = 0; c < d2; c++) {
            const __m512bh b0 = as_bh(_mm512_load_si512(k0 + c * NR));
            DOT1_STEP(q, ldq, c, b0);
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

/* pp (MR, BC/2) pairs = p (MR, n) rows ld ldp as bf16, zero past n: 32
 * values per vcvtne2ps2bf16 (lanes 0..15 from its second operand).  Exact
 * for values already rounded to bf16; a -0.0f mark stays -0 (adds 0). */
static void p_to_pairs(uint32_t pp[MR][BC / 2], const float *p, int64_t ldp, int64_t n) {
    for (int r = 0; r < MR; r++)
        for (int64_t j = 0; j < n; j += 32) {
            const float *pr = p + r * ldp + j;
            const __m512 lo = _mm512_maskz_loadu_ps(mask16(n - j), pr);
            const __m512 hi = n - j > 16 ? _mm512_maskz_loadu_ps(mask16(n - j - 16), pr + 16)
                                         : _mm512_setzero_ps();
            const __m512bh b = _mm512_cvtne2ps_pbh(hi, lo);
            memcpy(&pp[r][j / 2], &b, sizeof b);
        }
}

/* o (MR, dvp) += p (MR, n) . vp (dvp/NR, BC/2, NR) pairs */
static void pv_bf16_avx512(float *o, int64_t ldo, const float *p, int64_t ldp,
                           const uint32_t *vp, int64_t n, int64_t dvp) {
    _Alignas(64) uint32_t pp[MR][BC / 2];
    p_to_pairs(pp, p, ldp, n);
    const uint32_t *a = &pp[0][0];
    const int64_t lda = BC / 2, n2 = (n + 1) / 2, np = dvp / NR;
    int64_t cp = 0;
    for (; cp + 2 <= np; cp += 2) {
        const uint32_t *v0 = vp + cp * (BC / 2) * NR, *v1 = v0 + (BC / 2) * NR;
        float *oc = o + cp * NR;
        __m512 c00 = _mm512_loadu_ps(oc), c01 = _mm512_loadu_ps(oc + NR);
        __m512 c10 = _mm512_loadu_ps(oc + ldo), c11 = _mm512_loadu_ps(oc + ldo + NR);
        __m512 c20 = _mm512_loadu_ps(oc + 2 * ldo), c21 = _mm512_loadu_ps(oc + 2 * ldo + NR);
        __m512 c30 = _mm512_loadu_ps(oc + 3 * ldo), c31 = _mm512_loadu_ps(oc + 3 * ldo + NR);
        __m512 c40 = _mm512_loadu_ps(oc + 4 * ldo), c41 = _mm512_loadu_ps(oc + 4 * ldo + NR);
        __m512 c50 = _mm512_loadu_ps(oc + 5 * ldo), c51 = _mm512_loadu_ps(oc + 5 * ldo + NR);
        for (int64_t j = 0; j < n2; j++) {
            const __m512bh b0 = as_bh(_mm512_load_si512(v0 + j * NR));
            const __m512bh b1 = as_bh(_mm512_load_si512(v1 + j * NR));
            DOT2_STEP(a, lda, j, b0, b1);
        }
        _mm512_storeu_ps(oc, c00), _mm512_storeu_ps(oc + NR, c01), oc += ldo;
        _mm512_storeu_ps(oc, c10), _mm512_storeu_ps(oc + NR, c11), oc += ldo;
        _mm512_storeu_ps(oc, c20), _mm512_storeu_ps(oc + NR, c21), oc += ldo;
        _mm512_storeu_ps(oc, c30), _mm512_storeu_ps(oc + NR, c31), oc += ldo;
        _mm512_storeu_ps(oc, c40), _mm512_storeu_ps(oc + NR, c41), oc += ldo;
        _mm512_storeu_ps(oc, c50), _mm512_storeu_ps(oc + NR, c51);
    }
    if (cp < np) {
        const uint32_t *v0 = vp + cp * (BC / 2) * NR;
        float *oc = o + cp * NR;
        __m512 c00 = _mm512_loadu_ps(oc), c10 = _mm512_loadu_ps(oc + ldo);
        __m512 c20 = _mm512_loadu_ps(oc + 2 * ldo), c30 = _mm512_loadu_ps(oc + 3 * ldo);
        __m512 c40 = _mm512_loadu_ps(oc + 4 * ldo), c50 = _mm512_loadu_ps(oc + 5 * ldo);
        for (int64_t j = 0; j < n2; j++) {
            const __m512bh b0 = as_bh(_mm512_load_si512(v0 + j * NR));
            DOT1_STEP(a, lda, j, b0);
        }
        _mm512_storeu_ps(oc, c00), oc += ldo;
        _mm512_storeu_ps(oc, c10), oc += ldo;
        _mm512_storeu_ps(oc, c20), oc += ldo;
        _mm512_storeu_ps(oc, c30), oc += ldo;
        _mm512_storeu_ps(oc, c40), oc += ldo;
        _mm512_storeu_ps(oc, c50);
    }
}

const mha_flash_bf16 MHA_AVX512_SYMBOL(mha_flash_bf16_avx512) = {"avx512bf16", qk_bf16_avx512,
                                                                  pv_bf16_avx512};
