/* attention_flash.h - the fused attention driver and its per-ISA microkernels.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v.  Tile letters:
 * BR query rows per tile, BC keys per block, MR = 6 rows and NR = 16
 * columns per register block, dvp = dv rounded up to NR.
 *
 * The driver (attention_flash.c) owns tiling, packing, masks, the online
 * softmax bookkeeping, dropout, weights and threads; an ISA supplies only the
 * inner loops below.  Scalar C, AVX2+FMA and AVX-512 versions exist, and
 * bf16 tile products on AVX512_BF16 (vdpbf16ps) and on AMX
 * (mha_flash_bf16); all are checked against mha_attn_fwd_f32_ref.
 */
#ifndef MHA_ATTENTION_FLASH_H
#define MHA_ATTENTION_FLASH_H

#include "../internal.h"

enum {
    MHA_FLASH_MR = 6,  /* query rows per register block                  */
    MHA_FLASH_NR = 16, /* key / value columns per register block (2 YMM) */
    MHA_FLASH_BR = 96, /* query rows per tile (16 register blocks)       */
    MHA_FLASH_BC = 128 /* keys per block (8 panels)                      */
};

/* Packed layouts (all contiguous, 64-byte aligned):
 *   q tile  qp (BR, d)            rows past L are zero;
 *   k block kp (BC/NR, d, NR)     panel-major K^T, columns past S zero;
 *   v block vp (dvp/NR, BC, NR)   column-panel-major V, columns past dv zero;
 *   scores  s  (BR, BC);  output accumulator o (BR, dvp).
 * q, k, v and out may be MHA_F32, MHA_F16 or MHA_BF16 (each its own):
 * packing widens to float32 (or keeps bf16 as pairs for mha_flash_bf16's
 * loops) and the output is rounded once when written. */
typedef struct mha_flash_isa {
    const char *name;
    /* s (MR, npanels*NR) rows ld lds = q (MR, d) rows ld ldq . kp^T panels. */
    void (*qk)(float *s, int64_t lds, const float *q, int64_t ldq, const float *kp, int64_t d,
               int64_t npanels);
    /* o (MR, dvp) rows ld ldo += p (MR, n) rows ld ldp . vp (dvp/NR, BC, NR). */
    void (*pv)(float *o, int64_t ldo, const float *p, int64_t ldp, const float *vp, int64_t n,
               int64_t dvp);
    /* Scores epilogue of one row, in place over s[0, n):
     *   j < lim: s = s*scale + bias[j] (bias NULL: 0), -inf where bias is -inf;
     *   j >= lim: -inf.
     * Returns the row maximum, NaN when any unmasked score is NaN, -inf when
     * every column is masked. */
    float (*row_scores)(float *s, int64_t n, int64_t lim, float scale, const float *bias);
    /* s[j] = exp(s[j] - m) over [0, n), -0.0f (the "masked" mark) where
     * s[j] is -inf; returns the sum.  m is finite or NaN.  pdt MHA_F16 or
     * MHA_BF16: the values stored are then rounded to pdt (as round_row
     * after the pass would), the sum staying that of the unrounded ones. */
    float (*row_exp)(float *s, int64_t n, float m, mha_dtype pdt);
    /* s[j] = s[j] rounded to dt (MHA_F16 or MHA_BF16) and back, over [0, n):
     * bit-identical to mha_round_to (convert.h), -0.0f stays -0.0f. */
    void (*round_row)(float *s, int64_t n, mha_dtype dt);
    /* dst[0, n) = the contiguous half row src (MHA_F16 or MHA_BF16) widened
     * exactly to float32; NULL: the driver's scalar conversion. */
    void (*widen_row)(float *dst, const uint16_t *src, mha_dtype dt, int64_t n);
    /* Two keys' contiguous bf16 rows a, b (b NULL: zeros) as pairs of a
     * packed V block: dst[(c/NR)*pstep + c%NR] = a[c] | b[c] << 16 for
     * c < n, zero up to the panel's end; returns whether a value read has
     * an all-ones exponent (inf or NaN).  NULL: the driver's scalar loop. */
    bool (*pair_rows)(uint32_t *dst, int64_t pstep, const uint16_t *a, const uint16_t *b,
                      int64_t n);
    /* One float32 row of a packed V block: dst[(c/NR)*pstep + c%NR] = src[c]
     * for c < n, zero up to the panel's end; returns whether any is not
     * finite.  NULL: the driver's load_row. */
    bool (*spread_row)(float *dst, int64_t pstep, const float *src, int64_t n);
    /* A K panel transposed: dst[c*NR + j] = the 32-bit element at src +
     * j*row_bytes + c*col_bytes (times mul as a float when mul != 1), j < n
     * <= NR, zero for j >= n; c < cols; dst 64-byte aligned, row_bytes <=
     * INT32_MAX / NR.  NULL: the driver's per-element loops. */
    void (*gather_panel)(uint32_t *dst, const char *src, int64_t row_bytes, int64_t col_bytes,
                         int64_t n, int64_t cols, float mul);
    /* dst[0, n) = src[0, n) as the half type dt (MHA_F16 or MHA_BF16),
     * bit-identical to mha_store_f (convert.h): an output row of a half
     * tensor.  NULL: the driver's scalar conversion. */
    void (*narrow_row)(uint16_t *dst, const float *src, int64_t n, mha_dtype dt);
} mha_flash_isa;

/* The bf16 tile products (vdpbf16ps on AVX512_BF16, or AMX), on bf16
 * pairs: a pair is two bf16 values in 32 bits, the lower-indexed one in the
 * low half.  Packed layouts (64-byte aligned), used instead of the float32
 * ones:
 *   q tile  qp (rows16, d2)       pairs along d, d2 = ceil(d/2) rounded up
 *                                 to d2_align, zero padded (odd d: the last
 *                                 pair's high half 0), rows past `rows` zero
 *                                 up to rows16 = rows rounded up to 16;
 *   k block kp (BC/NR, d2, NR)    pairs along d, columns past S zero;
 *   v block vp (dvp/NR, BC/2, NR) pairs along the key axis, zero padded;
 *   P       pb (rows16, BC)       bf16 rows (pairs along the key axis).
 * The driver takes tile_qk when q and k are both MHA_BF16 (and no ONNX
 * scale: q * sqrt(scale) is no bf16 value), tile_pv when v is MHA_BF16 (P
 * is then rounded to bf16, so its bf16 rows are exact).  Both do all rows
 * of the q tile at once, so rows past `rows` up to rows16 may be read from
 * the q tile and P and written to s and o (scratch rows). */
typedef struct mha_flash_bf16 {
    const char *name;
    /* s (rows, npanels*NR) rows ld lds = q (rows, d2) pairs rows ld ldq .
     * kp^T (npanels, d2, NR) pairs. */
    void (*tile_qk)(float *s, int64_t lds, const uint32_t *q, int64_t ldq, const uint32_t *kp,
                    int64_t d2, int64_t npanels, int64_t rows);
    /* tile_qk, and rmax (rows2 = rows rounded up to 2) = each row's max
     * over its npanels*NR products, NaN ones ignored (-inf when every one
     * is NaN): the softmax's max pass folded into the product (vmaxps on
     * the adder ports beside the dot products on the multipliers).  NULL:
     * the driver takes row_max. */
    void (*tile_qk_max)(float *s, int64_t lds, float *rmax, const uint32_t *q, int64_t ldq,
                        const uint32_t *kp, int64_t d2, int64_t npanels, int64_t rows);
    /* o (rows, dvp) rows ld ldo += p (rows, n) bf16 rows ld ldp . vp
     * (dvp/NR, BC/2, NR) pairs, every row to the same n; p is 0 wherever
     * nothing is to be added (past a row's visible columns up to n rounded
     * up to 32, and in the rows past `rows`). */
    void (*tile_pv)(float *o, int64_t ldo, const uint16_t *p, int64_t ldp, const uint32_t *vp,
                    int64_t n, int64_t dvp, int64_t rows);
    /* The softmax of the products' rows, P written rounded to bf16 straight
     * into the bf16 row p[0, n) that tile_pv takes:
     * row_exp_bf16: x = s * scale (scale 1: s is already the row_scores of
     * mha_flash_isa), p = exp(x - m), -0.0 where x is -inf; returns the
     * sum of the float32 values.  row_max: the max of s[0, n), NaN when
     * any is NaN (for scale > 0, max(s) * scale is the max of s * scale). */
    float (*row_exp_bf16)(const float *s, int64_t n, float scale, float m, uint16_t *p);
    float (*row_max)(const float *s, int64_t n);
    /* The online softmax of a block whose rows are all plain (every row
     * sees the same n columns; no bias, mask or softcap; scale finite and
     * > 0), rows r < rows of s (rows lds apart): the max mb = max(s_r) *
     * scale (rmax[r] * scale where rmax is given and rmax[r] > -inf),
     * m_new = max(m[r], mb) (NaN if either is); where it moved from a
     * finite m[r], o's row r (dvp floats, rows ldo apart) and l[r] are
     * multiplied by expf(m[r] - m_new); then l[r] += row_exp_bf16(s_r, n,
     * scale, m_new, pb row r (rows ldp apart)), except that P is +0 where
     * a score is -inf (from infinite inputs: no column is masked).  Rows
     * with m_new = -inf get s = -0.0 and P = 0.  The driver's per-row
     * steps in one call, the same m, l and output bits.  NULL: the driver
     * loops over rows. */
    void (*softmax_rows)(float *s, int64_t lds, int64_t rows, int64_t n, float scale,
                         const float *rmax, float *m, float *l, float *o, int64_t ldo,
                         int64_t dvp, uint16_t *pb, int64_t ldp);
    /* The calling thread's tile configuration and its release (AMX): the
     * products run only between them.  NULL: nothing to set up. */
    void (*tiles_on)(void);
    void (*tiles_off)(void);
    int64_t d2_align; /* pairs per packed q/k row rounded to this (>= 1) */
} mha_flash_bf16;

/* Runs p with the given inner loops (threads, workspace, all options);
 * dot: the bf16 loops, or NULL where the CPU has none (then bf16 tensors
 * are widened to float32 at packing, as F16 ones always are). */
mha_status mha_attn_flash_run(const mha_attn_problem *p, const mha_flash_isa *isa,
                              const mha_flash_bf16 *dot);

/* The portable inner loops (attention_flash.c; any CPU). */
extern const mha_flash_isa mha_flash_isa_scalar;
/* The AVX2+FMA inner loops (attention_flash_avx2.c; only call when the CPU
 * has AVX2 and FMA). */
extern const mha_flash_isa mha_flash_isa_avx2;
/* The AVX-512 inner loops (attention_flash_avx512.c; only after
 * mha_avx512_runs(), taken with MHA_AVX512_PICK). */
MHA_AVX512_DECLARE(mha_flash_isa, mha_flash_isa_avx512);
/* The AVX512_BF16 loops (attention_flash_avx512bf16.c; only after
 * mha_avx512_bf16_runs()): mha_flash_bf16_pick() returns them then.  Their
 * row_max, row_exp_bf16 and softmax_rows serve the AMX products too. */
MHA_AVX512_DECLARE(mha_flash_bf16, mha_flash_bf16_avx512);
float mha_flash_row_max_avx512(const float *s, int64_t n);
float mha_flash_row_exp_bf16_avx512(const float *s, int64_t n, float scale, float m, uint16_t *p);
void mha_flash_softmax_rows_avx512(float *s, int64_t lds, int64_t rows, int64_t n, float scale,
                                   const float *rmax, float *m, float *l, float *o, int64_t ldo,
                                   int64_t dvp, uint16_t *pb, int64_t ldp);
/* The AMX tile products (attention_flash_amx.c; only after
 * mha_cpu_has_amx_bf16(), never emulated). */
extern const mha_flash_bf16 mha_flash_bf16_amx;
/* The bf16 loops the avx512 kernel choice runs: AMX where
 * mha_cpu_has_amx_bf16(); else the vdpbf16ps loops, emulated, or natively
 * where mha_cpu_bf16_dot_is_fast(); NULL otherwise (bf16 tensors are then
 * widened to float32 at packing). */
const mha_flash_bf16 *mha_flash_bf16_pick(void);

/* An FMA-bound loop (12 independent 8-lane chains, iters steps); *flops
 * receives the FLOP count done.  Returns a value to keep the loop alive. */
double mha_fma_peak_loop_avx2(int64_t iters, double *flops);
/* The same with 16 chains of 16 lanes (attention_flash_avx512.c; only when
 * mha_cpu_has_avx512(): a peak is measured natively, never emulated). */
double mha_fma_peak_loop_avx512(int64_t iters, double *flops);

#endif /* MHA_ATTENTION_FLASH_H */
