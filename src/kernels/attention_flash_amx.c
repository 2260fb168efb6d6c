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
 * and so are P's bf16 rows, which the vdpbf16ps loops' row_exp_bf16 writes
 * (exp and rounding in one pass, attention_flash_avx512bf16.c).  Masks,
 * the running statistics and the output are the float32 path of
 * attention_flash_avx512.c.  Compiled with
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

const mha_flash_bf16 mha_flash_bf16_amx = {
    .name = "amx",
    .d2_align = TR,
    .tile_qk = qk_amx,
    .tile_pv = pv_amx,
    .row_max = mha_flash_row_max_avx512,
    .row_exp_bf16 = mha_flash_row_exp_bf16_avx512,
    .softmax_rows = mha_flash_softmax_rows_avx512,
    .tiles_on = tiles_on_amx,
    .tiles_off = tiles_off_amx,
};
