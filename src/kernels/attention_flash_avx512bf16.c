/* attention_flash_avx512bf16.c - the fused attention's Q.K^T and P.V tile
 * products on bf16 pairs with vdpbf16ps (AVX512_BF16), whole query tiles at
 * a time, and the softmax pass that writes P as bf16 (shared with the AMX
 * products, attention_flash_amx.c).
 *
 * Letter legend and packed layouts: see attention_flash.h (MR = 6 query
 * rows, NR = 16 columns = 1 ZMM of float32 or of bf16 pairs, BC keys per
 * block, d2 = ceil(d/2), dvp = dv rounded to NR).  The driver
 * (attention_flash.c) packs bf16 q tiles and K blocks as pairs along d and
 * bf16 V blocks as pairs along the key axis, once per block, and the
 * softmax below writes P's bf16 rows, which are pairs along the key axis as
 * they stand; masks, the running statistics and the output are the float32
 * path of attention_flash_avx512.c.  Compiled with AVX512BF16_FLAGS; only
 * reached after mha_avx512_bf16_runs() (natively, or emulated in the test
 * library).
 *
 * Precision: a product of two bf16 values (8-bit significands) is exact in
 * float32, and vdpbf16ps adds it in float32 (ref: Intel SDM, VDPBF16PS:
 * two FMAs per lane, odd pair element first, round to nearest even,
 * denormal inputs read as 0 and denormal results flushed), so Q.K^T differs
 * from the float32 loops on the widened values only by the order of the
 * float32 sums, and so does P.V, P being rounded to bf16 (the rounding rule
 * of attention_flash.c).  Values below 2^-126 count as 0: far below the
 * bf16 tolerances.
 *
 * Register blocking: 6 rows x up to 4 panels = 24 ZMM accumulators (as the
 * float32 block6_avx512); per step 4 aligned 64-byte panel loads (16
 * columns x one pair each), 6 broadcasts of a 32-bit pair and 24 vdpbf16ps:
 * 1536 FLOPs, twice the float32 step for the same instruction count, on half
 * the packed bytes.  Leftover panels take 6 x 2 and 6 x 1 blocks, and the
 * last rows of a tile a 4- or 2-row block (the driver pads tiles to 16 rows,
 * so an odd row count reads one zero row more).
 *
 * Row maxima (tile_qk_max): the Q.K^T store also takes vmaxps of each
 * accumulator into one ZMM per row (6 more registers, the second operand
 * the running max, so a NaN product never enters it), reduced once a row
 * at the end: the softmax's separate max pass over s disappears for plain
 * whole blocks.  On Zen 4 vmaxps issues on the FP adder pipes while the dot
 * products hold the multipliers, so the fold costs no dot-product cycles;
 * at B1 H8 L2048 d64 it took the bf16 forward from 31.1 to 29.2 ms (medians
 * of 6 alternated runs; the pass and its per-row calls were about 6 % of
 * the time, perf).  Measured on Zen 4 (one
 * core): vdpbf16ps zmm sustains about 210 GFLOP/s, 2x its float32 FMA loop
 * (`build/dot_peak`); the two products then run near that rate and the
 * softmax is the rest of the time (docs/performance.md).
 */
#include "attention_flash.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "simd_avx512.h"

enum { MR = MHA_FLASH_MR, NR = MHA_FLASH_NR, BC = MHA_FLASH_BC, PANELS = 4 };
_Static_assert(MR == 6, "the row blocks below are 6, 4 and 2 rows");

/* A vector of 32 bf16 (16 pairs) from integer lanes: the same 64 bytes. */
static inline __m512bh as_bh(__m512i x) {
    __m512bh r;
    memcpy(&r, &x, sizeof r);
    return r;
}

/* The register block: c (nr, np*NR) rows ld ldc = (acc: c +, else 0 +)
 * a (nr, steps) pairs rows ld lda . b, np panels of (steps, NR) pairs
 * bstep pairs apart.  Inlined with constant nr <= MR and np <= PANELS, the
 * nr x np accumulators live in ZMM registers. */
static inline __attribute__((always_inline)) void dot_block(float *c, int64_t ldc, bool acc,
                                                            const uint32_t *a, int64_t lda,
                                                            const uint32_t *b, int64_t bstep,
                                                            int64_t steps, const int nr,
                                                            const int np, __m512 *mx) {
    __m512 x[MR][PANELS];
#pragma GCC unroll 6
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int u = 0; u < np; u++)
            x[r][u] = acc ? _mm512_loadu_ps(c + r * ldc + u * NR) : _mm512_setzero_ps();
    for (int64_t t = 0; t < steps; t++) {
        __m512bh bv[PANELS];
#pragma GCC unroll 4
        for (int u = 0; u < np; u++)
            bv[u] = as_bh(_mm512_load_si512(b + u * bstep + t * NR));
#pragma GCC unroll 6
        for (int r = 0; r < nr; r++) {
            const __m512bh av = as_bh(_mm512_set1_epi32((int)a[r * lda + t]));
#pragma GCC unroll 4
            for (int u = 0; u < np; u++)
                x[r][u] = _mm512_dpbf16_ps(x[r][u], av, bv[u]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int u = 0; u < np; u++) {
            _mm512_storeu_ps(c + r * ldc + u * NR, x[r][u]);
            if (mx) /* vmaxps returns its second operand on NaN: NaN never enters */
                mx[r] = _mm512_max_ps(x[r][u], mx[r]);
        }
}

/* nr rows (6, 4 or 2) x npanels panels of one product, 4 panels at a time;
 * the arguments as dot_block's, the panels bstep pairs apart. */
static inline __attribute__((always_inline)) void dot_rows(float *c, int64_t ldc, bool acc,
                                                           const uint32_t *a, int64_t lda,
                                                           const uint32_t *b, int64_t bstep,
                                                           int64_t steps, int64_t npanels,
                                                           const int nr, float *rmax) {
    __m512 mx[MR];
#pragma GCC unroll 6
    for (int r = 0; r < nr; r++)
        mx[r] = _mm512_set1_ps(-INFINITY);
    __m512 *m = rmax ? mx : NULL;
    int64_t p = 0;
    for (; p + 4 <= npanels; p += 4)
        dot_block(c + p * NR, ldc, acc, a, lda, b + p * bstep, bstep, steps, nr, 4, m);
    if (p + 2 <= npanels) {
        dot_block(c + p * NR, ldc, acc, a, lda, b + p * bstep, bstep, steps, nr, 2, m);
        p += 2;
    }
    if (p < npanels)
        dot_block(c + p * NR, ldc, acc, a, lda, b + p * bstep, bstep, steps, nr, 1, m);
#pragma GCC unroll 6
    for (int r = 0; r < nr && rmax; r++)
        rmax[r] = _mm512_reduce_max_ps(mx[r]);
}

/* All rows of a tile, round_up(rows, 2) of them (the driver's padding
 * rows are zeros): blocks of 6 rows, then one of 4 or 2. */
static void dot_tile(float *c, int64_t ldc, bool acc, const uint32_t *a, int64_t lda,
                     const uint32_t *b, int64_t bstep, int64_t steps, int64_t npanels,
                     int64_t rows, float *rmax) {
    const int64_t rows2 = rows + (rows & 1);
    int64_t r = 0;
    for (; r + MR <= rows2; r += MR)
        dot_rows(c + r * ldc, ldc, acc, a + r * lda, lda, b, bstep, steps, npanels, MR,
                 rmax ? rmax + r : NULL);
    if (rows2 - r == 4)
        dot_rows(c + r * ldc, ldc, acc, a + r * lda, lda, b, bstep, steps, npanels, 4,
                 rmax ? rmax + r : NULL);
    else if (rows2 - r == 2)
        dot_rows(c + r * ldc, ldc, acc, a + r * lda, lda, b, bstep, steps, npanels, 2,
                 rmax ? rmax + r : NULL);
}

/* s (rows, npanels*NR) rows ld lds = q (rows, d2) pairs rows ld ldq .
 * kp^T (npanels, d2, NR) pairs. */
static void qk_bf16_avx512(float *s, int64_t lds, const uint32_t *q, int64_t ldq,
                           const uint32_t *kp, int64_t d2, int64_t npanels, int64_t rows) {
    dot_tile(s, lds, false, q, ldq, kp, d2 * NR, d2, npanels, rows, NULL);
}

/* qk_bf16_avx512, and rmax[r] = the max of row r's non-NaN products. */
static void qk_max_bf16_avx512(float *s, int64_t lds, float *rmax, const uint32_t *q,
                               int64_t ldq, const uint32_t *kp, int64_t d2, int64_t npanels,
                               int64_t rows) {
    dot_tile(s, lds, false, q, ldq, kp, d2 * NR, d2, npanels, rows, rmax);
}

/* o (rows, dvp) rows ld ldo += p (rows, n) bf16 rows ld ldp . vp (dvp/NR,
 * BC/2, NR) pairs; a bf16 row is pairs along the key axis as it stands (ldp
 * even), and p is zero from n to the next 32. */
static void pv_bf16_avx512(float *o, int64_t ldo, const uint16_t *p, int64_t ldp,
                           const uint32_t *vp, int64_t n, int64_t dvp, int64_t rows) {
    const uint32_t *pp = (const uint32_t *)(const void *)p;
    dot_tile(o, ldo, true, pp, ldp / 2, vp, (BC / 2) * NR, (n + 1) / 2, dvp / NR, rows, NULL);
}

/* max over s[0, n), NaN when any is NaN (16 partial maxima). */
static inline __attribute__((always_inline)) float row_max_loop(const float *s, int64_t n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        const __m512 x = _mm512_maskz_loadu_ps(k, s + j);
        nan |= _mm512_mask_cmp_ps_mask(k, x, x, _CMP_UNORD_Q);
        mx = _mm512_mask_max_ps(mx, k, mx, x);
    }
    return nan ? NAN : _mm512_reduce_max_ps(mx);
}

float MHA_AVX512_SYMBOL(mha_flash_row_max_avx512)(const float *s, int64_t n) {
    return row_max_loop(s, n);
}

/* p = bf16(exp(s * scale - m)), -0.0 where s * scale is -inf, 16 at a
 * time: t = (s * scale - m) * log2(e) as one FMA on folded constants, then
 * exp2_softmax512 (simd_avx512.h), rounded by vcvtneps2bf16 (round to
 * nearest even: mha_float_to_bf16's bits for normal values, zero, -0.0 and NaN; it reads
 * denormals as 0, and results below 2^-126 weigh nothing beside the row
 * sum >= 1); returns the sum of the float32 values. */
static inline __attribute__((always_inline)) float row_exp_bf16_loop(const float *s, int64_t n,
                                                                     float scale, float m,
                                                                     uint16_t *p) {
    const float log2e = 1.44269504088896341f;
    const __m512 ninf = _mm512_set1_ps(-INFINITY), sign = _mm512_set1_ps(-0.0f);
    const __m512 c = _mm512_set1_ps(scale * log2e), cm = _mm512_set1_ps(m * log2e);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        const __m512 t = _mm512_fmsub_ps(_mm512_mask_loadu_ps(ninf, k, s + j), c, cm);
        const __mmask16 live = _mm512_cmp_ps_mask(t, ninf, _CMP_NEQ_UQ); /* -inf: masked */
        const __m512 e = _mm512_mask_mov_ps(sign, live, exp2_softmax512(t));
        sum = _mm512_add_ps(sum, e);
        const __m256bh h = _mm512_cvtneps_pbh(e);
        __m256i bits;
        memcpy(&bits, &h, sizeof bits);
        _mm256_mask_storeu_epi16(p + j, k, bits);
    }
    return _mm512_reduce_add_ps(sum);
}

float MHA_AVX512_SYMBOL(mha_flash_row_exp_bf16_avx512)(const float *s, int64_t n, float scale,
                                                      float m, uint16_t *p) {
    return row_exp_bf16_loop(s, n, scale, m, p);
}

/* row_max_loop with whole chunks unmasked (the same max: NaN when any is
 * NaN, else the exact maximum). */
static inline __attribute__((always_inline)) float row_max_plain(const float *s, int64_t n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m512 x = _mm512_loadu_ps(s + j);
        nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, x);
    }
    if (j < n) {
        const __mmask16 k = mask16(n - j);
        const __m512 x = _mm512_maskz_loadu_ps(k, s + j);
        nan |= _mm512_mask_cmp_ps_mask(k, x, x, _CMP_UNORD_Q);
        mx = _mm512_mask_max_ps(mx, k, mx, x);
    }
    return nan ? NAN : _mm512_reduce_max_ps(mx);
}

/* row_exp_bf16_loop for plain rows (no masked column, so no -0.0 mark to
 * keep: an -inf score, only possible from infinite inputs, gets +0, which
 * exp2_softmax512 gives by itself, and weighs the same in P.V and the sum):
 * two chunks a step, rounded to bf16 together by one vcvtne2ps2bf16 and
 * stored unmasked; the P values and the sum (the same adds in the same
 * order) are row_exp_bf16_loop's. */
static inline __attribute__((always_inline)) float row_exp_bf16_plain(const float *s, int64_t n,
                                                                      float scale, float m,
                                                                      uint16_t *p) {
    const float log2e = 1.44269504088896341f;
    const __m512 c = _mm512_set1_ps(scale * log2e), cm = _mm512_set1_ps(m * log2e);
    __m512 sum = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        const __m512 e0 = exp2_softmax512(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), c, cm));
        const __m512 e1 = exp2_softmax512(_mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), c, cm));
        sum = _mm512_add_ps(_mm512_add_ps(sum, e0), e1);
        const __m512bh h = _mm512_cvtne2ps_pbh(e1, e0); /* e0 in the low half */
        __m512i bits;
        memcpy(&bits, &h, sizeof bits);
        _mm512_storeu_si512((void *)(p + j), bits);
    }
    for (; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        const __m512 t = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, s + j), c, cm);
        const __m512 e = _mm512_maskz_mov_ps(k, exp2_softmax512(t));
        sum = _mm512_add_ps(sum, e);
        const __m256bh h = _mm512_cvtneps_pbh(e);
        __m256i bits;
        memcpy(&bits, &h, sizeof bits);
        _mm256_mask_storeu_epi16(p + j, k, bits);
    }
    return _mm512_reduce_add_ps(sum);
}

/* See mha_flash_bf16.softmax_rows: the driver's per-row steps for plain
 * rows (attention_flash.c, run_item), in the same order with the same
 * operations, so the same bits, without two calls and the driver's
 * bookkeeping per row. */
void MHA_AVX512_SYMBOL(mha_flash_softmax_rows_avx512)(float *s, int64_t lds, int64_t rows,
                                                      int64_t n, float scale, const float *rmax,
                                                      float *m, float *l, float *o, int64_t ldo,
                                                      int64_t dvp, uint16_t *pb, int64_t ldp) {
    for (int64_t r = 0; r < rows; r++) {
        float *sr = s + r * lds;
        uint16_t *pr = pb + r * ldp;
        float mb = rmax ? rmax[r] : -INFINITY; /* the product's max, or the pass */
        mb = (mb == -INFINITY ? row_max_plain(sr, n) : mb) * scale;
        const float mold = m[r];
        const float mnew = (isnan(mold) || isnan(mb)) ? NAN : (mb > mold ? mb : mold);
        if (mnew == -INFINITY) { /* nothing visible yet */
            for (int64_t j = 0; j < n; j++)
                sr[j] = -0.0f;
            memset(pr, 0, sizeof(uint16_t) * (size_t)n);
            continue;
        }
        if (!(mnew == mold)) {
            if (mold != -INFINITY) { /* lazy rescale: only when the max moved */
                const float alpha = expf(mold - mnew);
                const __m512 va = _mm512_set1_ps(alpha);
                float *orow = o + r * ldo;
                for (int64_t c = 0; c < dvp; c += 16) {
                    const __mmask16 k = mask16(dvp - c);
                    _mm512_mask_storeu_ps(orow + c, k,
                                          _mm512_mul_ps(_mm512_maskz_loadu_ps(k, orow + c), va));
                }
                l[r] *= alpha;
            }
            m[r] = mnew;
        }
        l[r] += row_exp_bf16_plain(sr, n, scale, mnew, pr);
    }
}

const mha_flash_bf16 MHA_AVX512_SYMBOL(mha_flash_bf16_avx512) = {
    .name = "avx512bf16",
    .d2_align = 1,
    .tile_qk = qk_bf16_avx512,
    .tile_qk_max = qk_max_bf16_avx512,
    .tile_pv = pv_bf16_avx512,
    .row_max = MHA_AVX512_SYMBOL(mha_flash_row_max_avx512),
    .row_exp_bf16 = MHA_AVX512_SYMBOL(mha_flash_row_exp_bf16_avx512),
    .softmax_rows = MHA_AVX512_SYMBOL(mha_flash_softmax_rows_avx512),
};
