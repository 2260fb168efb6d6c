/* attention_flash_amx.c - the fused attention's Q.K^T and P.V tile products
 * on bf16 pairs with AMX (TDPBF16PS), whole query tiles at a time.
 *
 * Letter legend and packed layouts: see attention_flash.h (NR = 16 columns,
 * BC keys per block, d2 pairs per q/k row - a multiple of 16 here, the
 * driver pads with zeros -, dvp = dv rounded to NR).  The packed K block
 * (BC/NR, d2, NR) pairs and V block (dvp/NR, BC/2, NR) pairs are already
 * what TDPBF16PS takes as its B operand: 16 rows (pairs along the reduced
 * axis) of 16 columns x one pair = 64 bytes, 64 bytes apart.  The q tile
 * (rows, d2) pairs is the A operand as it stands (16 rows x 16 pairs),
 * and so are P's bf16 rows, which row_exp_bf16 writes (exp and rounding in
 * one pass).  Everything else (softmax, masks, the output) is the
 * float32 path of attention_flash_avx512.c.  Compiled with
 * AVX512BF16_FLAGS and -mamx-tile -mamx-bf16; only reached after
 * mha_cpu_has_amx_bf16() (natively: AMX cannot be emulated), between
 * tiles_on and tiles_off on the same thread.
 *
 * Precision: as vdpbf16ps (attention_flash_avx512bf16.c), each product of
 * two bf16 values is exact in float32 and added in float32 (ref: Intel SDM,
 * TDPBF16PS: round to nearest even, denormal inputs and results as 0), so
 * both products differ from the float32 loops on the widened values only by
 * the order of the float32 sums.
 *
 * Tiles: palette 1, all eight 16 rows x 64 bytes: C tiles 0-3 (2 row tiles
 * x 2 column panels of 16 x 16 float32), A tiles 4-5, B tiles 6-7.  A step
 * is 4 TDPBF16PS (4 x 16 x 16 x 32 multiply-adds) for 4 tile loads; the C
 * tiles are loaded (P.V) or zeroed (Q.K^T) once per block and stored once.
 * Measured on a Sapphire Rapids class Xeon: one core sustains 3.8 TFLOP/s
 * of TDPBF16PS, about 15x its float32 FMA loop; in the forward the C tile
 * stores (about 48 cycles a KiB) hold Q.K^T of a block to some 1.5 TFLOP/s,
 * and the float32 softmax costs as much as both products
 * (docs/performance.md).
 */
#include "attention_flash.h"

#include <stdbool.h>
#include <math.h>
#include <string.h>

#include <immintrin.h>

#include "simd_avx512.h"

enum { NR = MHA_FLASH_NR, BC = MHA_FLASH_BC, TR = 16 /* rows per tile */ };

/* The LDTILECFG operand (Intel SDM vol. 1, 3.2: palette 1). */
typedef struct tile_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* A constant in memory: GCC 12's _tile_loadconfig declares only 8 bytes of
 * its operand read, so a configuration built on the stack just before it
 * loses its stores to dead-store elimination. */
static const tile_config config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {TR, TR, TR, TR, TR, TR, TR, TR},
};

static void tiles_on_amx(void) { _tile_loadconfig(&config); }

static void tiles_off_amx(void) { _tile_release(); }

/* The tile block: c (nr*16, nc*16) rows ldc bytes apart = (acc: c +, else
 * 0 +) sum over steps t of A_t . B_t, where A_t is (nr*16 rows, 64 bytes)
 * at a + t*astep rows lda bytes apart and B_t is the (16, 16) pair tile at
 * b + t*bstep (column panel u another bpanel bytes on), rows 64 bytes
 * apart.  nr, nc in {1, 2}, constants after inlining (tile numbers are
 * immediates). */
static inline __attribute__((always_inline)) void tile_block(char *c, int64_t ldc, bool acc,
                                                             const char *a, int64_t lda,
                                                             int64_t astep, const char *b,
                                                             int64_t bpanel, int64_t bstep,
                                                             int64_t steps, const int nr,
                                                             const int nc) {
    char *c1 = c + TR * ldc;
    if (acc) {
        _tile_loadd(0, c, ldc);
        if (nc == 2)
            _tile_loadd(1, c + 64, ldc);
        if (nr == 2) {
            _tile_loadd(2, c1, ldc);
            if (nc == 2)
                _tile_loadd(3, c1 + 64, ldc);
        }
    } else {
        _tile_zero(0);
        if (nc == 2)
            _tile_zero(1);
        if (nr == 2) {
            _tile_zero(2);
            if (nc == 2)
                _tile_zero(3);
        }
    }
    for (int64_t t = 0; t < steps; t++) {
        const char *at = a + t * astep, *bt = b + t * bstep;
        _tile_loadd(4, at, lda);
        _tile_loadd(6, bt, 64);
        if (nc == 2)
            _tile_loadd(7, bt + bpanel, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (nc == 2)
            _tile_dpbf16ps(1, 4, 7);
        if (nr == 2) {
            _tile_loadd(5, at + TR * lda, lda);
            _tile_dpbf16ps(2, 5, 6);
            if (nc == 2)
                _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, c, ldc);
    if (nc == 2)
        _tile_stored(1, c + 64, ldc);
    if (nr == 2) {
        _tile_stored(2, c1, ldc);
        if (nc == 2)
            _tile_stored(3, c1 + 64, ldc);
    }
}

/* All row tiles (ntiles of 16 rows, two at a time) x npanels column panels
 * (two at a time) of one product: the four shapes of tile_block. */
static void tile_grid(char *c, int64_t ldc, bool acc, const char *a, int64_t lda, int64_t astep,
                      const char *b, int64_t bpanel, int64_t bstep, int64_t steps,
                      int64_t ntiles, int64_t npanels) {
    for (int64_t rt = 0; rt < ntiles; rt += 2) {
        char *cr = c + rt * TR * ldc;
        const char *ar = a + rt * TR * lda;
        const bool two = rt + 2 <= ntiles;
        int64_t p = 0;
        for (; p + 2 <= npanels; p += 2) {
            if (two)
                tile_block(cr + p * 64, ldc, acc, ar, lda, astep, b + p * bpanel, bpanel, bstep,
                           steps, 2, 2);
            else
                tile_block(cr + p * 64, ldc, acc, ar, lda, astep, b + p * bpanel, bpanel, bstep,
                           steps, 1, 2);
        }
        if (p < npanels) {
            if (two)
                tile_block(cr + p * 64, ldc, acc, ar, lda, astep, b + p * bpanel, bpanel, bstep,
                           steps, 2, 1);
            else
                tile_block(cr + p * 64, ldc, acc, ar, lda, astep, b + p * bpanel, bpanel, bstep,
                           steps, 1, 1);
        }
    }
}

/* s (rows16, npanels*NR) rows ld lds = q (rows16, d2) pairs rows ld ldq .
 * kp^T (npanels, d2, NR) pairs; rows16 = rows rounded up to 16, d2 a
 * multiple of 16. */
static void qk_amx(float *s, int64_t lds, const uint32_t *q, int64_t ldq, const uint32_t *kp,
                   int64_t d2, int64_t npanels, int64_t rows) {
    tile_grid((char *)s, lds * 4, false, (const char *)q, ldq * 4, 64, (const char *)kp,
              d2 * NR * 4, TR * NR * 4, d2 / TR, (rows + TR - 1) / TR, npanels);
}

/* o (rows16, dvp) rows ld ldo += p (rows16, n32) bf16 rows ld ldp . vp
 * (dvp/NR, BC/2, NR) pairs, n32 = n rounded up to 32 (p zero past n). */
static void pv_amx(float *o, int64_t ldo, const uint16_t *p, int64_t ldp, const uint32_t *vp,
                   int64_t n, int64_t dvp, int64_t rows) {
    tile_grid((char *)o, ldo * 4, true, (const char *)p, ldp * 2, 64, (const char *)vp,
              (BC / 2) * NR * 4, TR * NR * 4, (n + 31) / 32, (rows + TR - 1) / TR, dvp / NR);
}

/* e^x for x = s - m <= 0 (or NaN, which propagates), for P that is then
 * rounded to bf16 (8 significant bits): exp_softmax512's polynomial
 * (simd_avx512.h) in Horner form, a one-constant ln 2 reduction and
 * round-to-nearest by the 1.5 * 2^23 shift: 10 vector operations where it
 * has 12 (13 uops; the exp pass is the AMX forward's largest cost).  x is
 * clamped at -87 as there (e^x >= 2^-126 stays normal, and a huge |x| never
 * meets the shift's range).  Measured against exp in float64 over [-87, 0]
 * in steps of 1e-6: relative error <= 3.9e-7, far below the 2e-3 of the
 * bf16 rounding that follows. */
static inline __m512 exp_bf16_softmax(__m512 x) {
    const __m512 shift = _mm512_set1_ps(12582912.0f); /* 1.5 * 2^23 */
    x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x); /* operand order keeps NaN */
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shift),
                                   shift);
    const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147180559945309f), x);
    __m512 y = _mm512_set1_ps(8.333842270076275e-3f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.189859703183174e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.666688621044159e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.9999141693115234e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* max over s[0, n), NaN when any is NaN (16 partial maxima). */
static float row_max_amx(const float *s, int64_t n) {
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

/* p = bf16(exp(s * scale - m)), -0.0 where s * scale is -inf, 16 at a
 * time, by vcvtneps2bf16 (round to nearest even: mha_float_to_bf16's bits
 * for normal values, zero, -0.0 and NaN; it reads denormals as 0, and
 * exp_bf16_softmax's results below 2^-126 weigh nothing beside the row
 * sum >= 1); returns the sum of the float32 values. */
static float row_exp_bf16_amx(const float *s, int64_t n, float scale, float m, uint16_t *p) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), vm = _mm512_set1_ps(m);
    const __m512 sign = _mm512_set1_ps(-0.0f), vs = _mm512_set1_ps(scale);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        const __m512 x = _mm512_mul_ps(_mm512_mask_loadu_ps(ninf, k, s + j), vs);
        __m512 e = exp_bf16_softmax(_mm512_sub_ps(x, vm));
        e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, ninf, _CMP_EQ_OQ), sign); /* masked */
        sum = _mm512_add_ps(sum, e);
        const __m256bh h = _mm512_cvtneps_pbh(e);
        __m256i bits;
        memcpy(&bits, &h, sizeof bits);
        _mm256_mask_storeu_epi16(p + j, k, bits);
    }
    return _mm512_reduce_add_ps(sum);
}

const mha_flash_bf16 mha_flash_bf16_amx = {
    .name = "amx",
    .d2_align = TR,
    .tile_qk = qk_amx,
    .tile_pv = pv_amx,
    .row_max = row_max_amx,
    .row_exp_bf16 = row_exp_bf16_amx,
    .tiles_on = tiles_on_amx,
    .tiles_off = tiles_off_amx,
};
