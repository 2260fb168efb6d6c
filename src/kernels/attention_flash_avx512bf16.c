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

#include <stdbool.h>
#include <string.h>

#include "simd_avx512.h"

enum { MR = MHA_FLASH_MR, NR = MHA_FLASH_NR, BC = MHA_FLASH_BC };

/* A vector of 32 bf16 (16 pairs) from integer lanes: the same 64 bytes. */
static inline __m512bh as_bh(__m512i x) {
    __m512bh r;
    memcpy(&r, &x, sizeof r);
    return r;
}

/* The register block: c (MR, np*NR) rows ld ldc = (acc: c +, else 0 +)
 * a (MR, steps) pairs rows ld lda . b, np = 1 or 2 panels of (steps, NR)
 * pairs bstep pairs apart.  Inlined with a constant np, the 6 x np
 * accumulators live in ZMM registers (GCC unrolls the r and u loops). */
static inline __attribute__((always_inline)) void dot_block(float *c, int64_t ldc, bool acc,
                                                            const uint32_t *a, int64_t lda,
                                                            const uint32_t *b, int64_t bstep,
                                                            int64_t steps, const int np) {
    __m512 x[MR][2];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int u = 0; u < np; u++)
            x[r][u] = acc ? _mm512_loadu_ps(c + r * ldc + u * NR) : _mm512_setzero_ps();
    for (int64_t t = 0; t < steps; t++) {
        __m512bh bv[2];
#pragma GCC unroll 2
        for (int u = 0; u < np; u++)
            bv[u] = as_bh(_mm512_load_si512(b + u * bstep + t * NR));
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            const __m512bh av = as_bh(_mm512_set1_epi32((int)a[r * lda + t]));
#pragma GCC unroll 2
            for (int u = 0; u < np; u++)
                x[r][u] = _mm512_dpbf16_ps(x[r][u], av, bv[u]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int u = 0; u < np; u++)
            _mm512_storeu_ps(c + r * ldc + u * NR, x[r][u]);
}

/* s (MR, npanels*NR) = q (MR, d2) pairs . kp^T (npanels, d2, NR) pairs */
static void qk_bf16_avx512(float *s, int64_t lds, const uint32_t *q, int64_t ldq,
                           const uint32_t *kp, int64_t d2, int64_t npanels) {
    int64_t p = 0;
    for (; p + 2 <= npanels; p += 2)
        dot_block(s + p * NR, lds, false, q, ldq, kp + p * d2 * NR, d2 * NR, d2, 2);
    if (p < npanels)
        dot_block(s + p * NR, lds, false, q, ldq, kp + p * d2 * NR, d2 * NR, d2, 1);
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
    const int64_t n2 = (n + 1) / 2, np = dvp / NR, vstep = (BC / 2) * NR;
    int64_t cp = 0;
    for (; cp + 2 <= np; cp += 2)
        dot_block(o + cp * NR, ldo, true, &pp[0][0], BC / 2, vp + cp * vstep, vstep, n2, 2);
    if (cp < np)
        dot_block(o + cp * NR, ldo, true, &pp[0][0], BC / 2, vp + cp * vstep, vstep, n2, 1);
}

const mha_flash_bf16 MHA_AVX512_SYMBOL(mha_flash_bf16_avx512) = {
    .name = "avx512bf16", .qk = qk_bf16_avx512, .pv = pv_bf16_avx512};
