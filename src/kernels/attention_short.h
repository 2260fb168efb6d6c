/* attention_short.h - attention without masks whose whole key row is kept:
 * the trained encoder's self-attention of one short text (src/bert.c), and
 * mha_sdpa_forward's plain problems up to a few thousand keys
 * (mha_attn_short_serves).
 *
 * Letters: L query rows, S keys, H heads, d head width (D = H d).
 *   ctx[i, h d + c] = sum_j p[h][i][j] v[j, h d + c],
 *   p[h][i][:] = softmax_j(scale * sum_c q[i, h d + c] k[j, h d + c])
 * q is (L, H d), k and v (S, H d), row-major with rows ld apart (ldo for
 * ctx): q, k and v can be column blocks of one (L, 3D) buffer.
 *
 * Why not the flash driver (attention_flash.c): its tiles (96 x 128), its
 * per-call planning, the packing of K and V and the online softmax of every
 * 128-key block cost more than they save while one head's K^T and V stay in
 * the caches.  This kernel keeps one head's K^T (d x S) and a block of whole
 * score rows, reads v in place and runs each softmax once, on the whole row.
 * Measured on Zen 4 (docs/performance.md, "Whole rows"): 1.1-1.7x the flash
 * driver from L = 64 to 1024 at d = 32 and 64 (1.03-1.06x at 2048-4096);
 * with K^T in panels of 32 keys (a contiguous stream per panel, where rows
 * S apart strided through L2) 1.05-1.17x the flash driver also at d = 128
 * and 256 and up to S d = 524288 (L 8192 d 64, L 4096 d 128, L 2048 d 256),
 * about level at S d = 2^20.  On an Intel Xeon (2 MiB L2, a far slower L3)
 * it wins only while K^T and V fit in half the L2 (S d <= 131072: 1.0-1.2x
 * the flash tiles; 0.48-0.76x at 262144-524288), hence the bound by the
 * machine's caches (mha_attn_short_avx512_max_sd).  K^T and V are both
 * packed per head: V read in place strided 3E floats a key in the whole
 * MHA's (L, 3E) buffer, which halved its P V.
 * The avx2 loop (attention_short_avx2.c, 6-row blocks, K^T in panels of
 * 16 keys) serves mha_sdpa_forward's avx2 kernel the same way; measured on
 * Zen 3 (512 KiB L2 per core; docs/performance.md, "Whole rows on AVX2"):
 * 1.04-1.95x the avx2 flash driver up to S d = 131072 (L 256-2048 at d 64,
 * 1024 at d 128, B32 H12 L128 d32 1.34x, B8 L512 d64 1.27x), 0.85-0.92x
 * at S d = 196608-262144 (L 3072-4096 d 64, L 2048 d 128): there the
 * bound MHA_ATTN_SHORT_AVX2_MAX_SD.
 * bf16 q, k, v take a twin on vdpbf16ps (attention_short_avx512bf16.c),
 * whose gain is larger since the products shrink and the flash softmax
 * does not: 1.04-1.7x the flash driver's bf16 forward, 1.5-2.3x the
 * float32 one (B1 H8 L512-4096 d64/128, B32 H12 L128 d32, B8 L512 d64).
 * Where that twin is not taken (fp16 always; bf16 on CPUs whose vdpbf16ps
 * is slower than the FMA, and on the avx2 kernel) half q, k, v are widened
 * item by item to the float32 loops, P rounded to v's dtype as the flash
 * driver rounds it (mha_attn_short_run): measured on an Intel Xeon without
 * AMX, 0.52x the flash driver's time at B32 H12 L128 d32 bf16, 0.72x at B8
 * L512 d64, 0.90-0.96x at S d = 131072 (docs/performance.md).
 * A training forward's log-sum-exp (opt.lse, which the backward reads) comes
 * from each row's max and sum (mha_attn_short_lse) on the float32 loops,
 * so those forwards take whole rows too (the bf16 twin leaves them to the
 * flash driver).
 * The reference (_ref) is the plain loop; tests/unit/test_attention_short.c
 * checks it against mha_sdpa_forward, the avx2 and avx512 kernels against
 * it, and the bf16 loop against the reference kernel on bf16 tensors.
 * Neither allocates: ws holds mha_attn_short_ws_floats(S, d) floats.
 */
#ifndef MHA_KERNELS_ATTENTION_SHORT_H
#define MHA_KERNELS_ATTENTION_SHORT_H

#include "../internal.h"

#include <math.h>

/* The longest rows the avx2 loop serves for mha_sdpa_forward, as S d
 * (mha_attn_short_serves; measured against the flash driver:
 * docs/performance.md, "Whole rows on AVX2"). */
#ifndef MHA_ATTN_SHORT_AVX2_MAX_SD
#define MHA_ATTN_SHORT_AVX2_MAX_SD 131072
#endif
/* The same bound for the avx512 loop, by the machine's caches
 * (mha_attn_short_avx512_max_sd); defining it at build time replaces the
 * rule (to measure the loop against the flash tiles: 0 turns it off). */
#ifndef MHA_ATTN_SHORT_AVX512_MAX_SD
#define MHA_ATTN_SHORT_AVX512_MAX_SD (-1)
#endif

/* The longest rows the avx512 loop serves, as S d: on AMD 524288 (one
 * head's float32 K^T and V up to 2 MiB each: Zen 4's 1 MiB L2 backed by
 * its fast L3 held them, 1.05-1.17x the flash tiles there); elsewhere
 * (Intel Xeon, whose L3 is far slower) as long as K^T and V (8 S d bytes)
 * fit in half of a core's L2: 131072 with 2 MiB, where the loop is
 * 1.0-1.2x the flash tiles and 0.5-0.9x beyond (docs/performance.md,
 * "Intel Xeon with AMX, third visit"). */
int64_t mha_attn_short_avx512_max_sd(void);

/* Workspace floats for S keys and head width d. */
int64_t mha_attn_short_ws_floats(int64_t S, int64_t d);

/* Workspace floats of the whole-row backward of one pair
 * (mha_attn_short_bwd_avx512_loop, attention_bwd.h): S keys, head widths
 * d and dv, G query heads of L rows. */
int64_t mha_attn_short_bwd_ws_floats(int64_t S, int64_t d, int64_t dv, int64_t G, int64_t L);

void mha_attn_short_f32_ref(float *ctx, int64_t ldo, const float *q, const float *k,
                            const float *v, int64_t ld, int64_t L, int64_t S, int64_t H,
                            int64_t d, float scale, float *ws);

/* The SIMD loops' signature (their exported pointers): the kernel's, and
 * diag: -1, or causal masking with row i attending to keys 0..diag + i
 * (diag + L <= S: a block of query rows starting at row diag of a causal
 * L = S problem, given the keys 0..diag + L - 1 it can see); p_dtype:
 * MHA_F32, or the half dtype each row of P is rounded to (relative to the
 * row's max, after its sum l) for P V: half inputs widened to float32 keep
 * the P of the flash driver and the reference (v's dtype, as
 * FlashAttention); lse: NULL, or (H = 1 only) row i's natural log-sum-exp
 * of its scaled scores at lse[i * lse_ld] (mha_attn_short_lse), what the
 * flash driver saves for the backward. */
typedef void (*mha_attn_short_fn)(float *ctx, int64_t ldo, const float *q, const float *k,
                                  const float *v, int64_t ld, int64_t L, int64_t S,
                                  int64_t H, int64_t d, float scale, int64_t diag, float *ws,
                                  mha_dtype p_dtype, float *lse, int64_t lse_ld);

/* The natural log-sum-exp of a whole-row softmax from its max m and sum l =
 * sum_j 2^(s_j - m) in log2 units (scores times log2 e): ln 2 (m + log2 l);
 * -inf when every key was skipped (m = -inf, l = 0), NaN when m is (as the
 * flash driver's m + log l). */
static inline float mha_attn_short_lse(float m, float l) {
    return (m + log2f(l)) * 0.693147180559945309f;
}
/* o (dv) = sum over the unmarked keys j < S of p[j] v[j ld] / l: the P V
 * row of a row whose scores hold -inf (an infinite q or k), as the
 * reference computes it, skipping the keys the SIMD loops' softmax marked
 * -0.0, so a skipped key is never multiplied by zero (its v may be inf or
 * NaN); 0 when every key is marked.  Rare: plain scalar loops, inline in
 * each SIMD loop's file (no call between the kernel files). */
static inline void mha_attn_short_pv_skipping(float *o, const float *p, const float *v,
                                              int64_t ld, int64_t S, int64_t dv, float l) {
    bool any = false;
    for (int64_t c = 0; c < dv; c++)
        o[c] = 0.0f;
    for (int64_t j = 0; j < S; j++) {
        if (p[j] == 0.0f && signbit(p[j]))
            continue;
        any = true;
        for (int64_t c = 0; c < dv; c++)
            o[c] += p[j] * v[j * ld + c];
    }
    for (int64_t c = 0; any && c < dv; c++)
        o[c] /= l;
}

/* The last key j in [j0, j1) whose value row (d values at v + j ld)
 * holds an inf or NaN, -1 when none; _bf16 for bf16 rows.  A causal block
 * of rows runs its P V product to its last row's keys, so a row meets the
 * keys past its own with weight 0; a non-finite v there (a cache's
 * unwritten tail, say) would make 0 * inf = NaN, so the SIMD loops redo
 * the rows with a limit <= that key by mha_attn_short_pv_skipping, as the
 * reference (which never reads them) computes them. */
static inline int64_t mha_attn_short_last_nonfinite(const float *v, int64_t ld, int64_t d,
                                                    int64_t j0, int64_t j1) {
    for (int64_t j = j1 - 1; j >= j0; j--)
        for (int64_t c = 0; c < d; c++)
            if (!isfinite(v[j * ld + c]))
                return j;
    return -1;
}

static inline int64_t mha_attn_short_last_nonfinite_bf16(const uint16_t *v, int64_t ld,
                                                         int64_t d, int64_t j0, int64_t j1) {
    for (int64_t j = j1 - 1; j >= j0; j--)
        for (int64_t c = 0; c < d; c++)
            if ((v[j * ld + c] & 0x7f80u) == 0x7f80u) /* all-ones exponent */
                return j;
    return -1;
}

/* After a block's P V product (float32 loops): the rows whose softmax
 * marked a key (skips[r]) and, causal (diag >= 0), those that met a
 * non-finite v past their own keys (mha_attn_short_last_nonfinite over the
 * keys diag + i0 + 1 .. Sb - 1) are redone by mha_attn_short_pv_skipping.
 * orow (rows, d) the block's outputs, sr (rows, >= Sb) its weights, lim and
 * l each row's key limit and sum, v (S, d) rows ld apart. */
static inline void mha_attn_short_redo_rows(float *const *orow, float *const *sr,
                                            const int64_t *lim, const float *l, bool *skips,
                                            int rows, const float *v, int64_t ld, int64_t d,
                                            int64_t diag, int64_t i0, int64_t Sb) {
    if (diag >= 0) {
        const int64_t bad = mha_attn_short_last_nonfinite(v, ld, d, diag + i0 + 1, Sb);
        for (int r = 0; r < rows; r++)
            skips[r] |= lim[r] <= bad;
    }
    for (int r = 0; r < rows; r++)
        if (skips[r])
            mha_attn_short_pv_skipping(orow[r], sr[r], v, ld, lim[r], d, l[r]);
}

/* The AVX2+FMA loop (attention_short_avx2.c; any d >= 1): only after
 * mha_cpu_has_avx2_fma(). */
extern const mha_attn_short_fn mha_attn_short_avx2_loop;
/* The same problem on the avx2 loop; MHA_ERR_UNSUPPORTED (ctx untouched)
 * unless mha_cpu_has_avx2_fma(). */
mha_status mha_attn_short_f32_avx2(float *ctx, int64_t ldo, const float *q, const float *k,
                                   const float *v, int64_t ld, int64_t L, int64_t S, int64_t H,
                                   int64_t d, float scale, float *ws);
/* The AVX-512 loop (attention_short_avx512.c; any d >= 1): taken only by
 * mha_attn_short_f32_avx512 with MHA_AVX512_PICK. */
MHA_AVX512_DECLARE(mha_attn_short_fn, mha_attn_short_avx512_loop);
/* The same problem on the avx512 loop; MHA_ERR_UNSUPPORTED (naming AVX-512,
 * ctx untouched) unless mha_avx512_runs(). */
mha_status mha_attn_short_f32_avx512(float *ctx, int64_t ldo, const float *q, const float *k,
                                     const float *v, int64_t ld, int64_t L, int64_t S,
                                     int64_t H, int64_t d, float scale, float *ws);

/* The bf16 loop's signature: q, k, v bf16 as above, ctx float32 (out
 * MHA_F32) or bf16 (MHA_BF16) rows ldo elements apart; diag as above. */
typedef void (*mha_attn_short_bf16_fn)(void *ctx, mha_dtype out, int64_t ldo, const uint16_t *q,
                                       const uint16_t *k, const uint16_t *v, int64_t ld,
                                       int64_t L, int64_t S, int64_t H, int64_t d, float scale,
                                       int64_t diag, float *ws);
/* The AVX512_BF16 loop (attention_short_avx512bf16.c; any d >= 1): taken
 * only by mha_attn_short_bf16_avx512 and mha_attn_short_run. */
MHA_AVX512_DECLARE(mha_attn_short_bf16_fn, mha_attn_short_bf16_avx512_loop);
/* The bf16 problem on that loop; MHA_ERR_UNSUPPORTED (ctx untouched)
 * unless mha_avx512_bf16_runs(). */
mha_status mha_attn_short_bf16_avx512(void *ctx, mha_dtype out, int64_t ldo, const uint16_t *q,
                                      const uint16_t *k, const uint16_t *v, int64_t ld,
                                      int64_t L, int64_t S, int64_t H, int64_t d, float scale,
                                      float *ws);

/* True when the whole-row loops of kernel (MHA_KERNEL_AVX2 or
 * MHA_KERNEL_AVX512, after its CPU check) serve p better than the flash
 * driver: q, k, v and out float32; or (avx512 only) q, k, v bf16 with out
 * float32 or bf16 when bf16_dots (the caller's word that the flash driver
 * would take the vdpbf16ps products: an AVX512_BF16 CPU without AMX, whose
 * tiles keep bf16); or q, k, v fp16, or bf16 without bf16_dots, with out
 * of any float dtype (the flash driver would widen them at packing; the
 * whole rows widen them item by item, mha_attn_short_run); unit column
 * strides and one row stride for q, k and v,
 * d = dv, L = S, no mask, bias, dropout, weights, LSE, sinks or ONNX
 * outputs (causal masking either way is taken: with L = S top-left and
 * bottom-right are the same); and S d up to the kernel's limit, measured
 * (see the top of this file): avx512 524288 (one head's float32 K^T and V
 * up to 2 MiB each), avx2 MHA_ATTN_SHORT_AVX2_MAX_SD. */
bool mha_attn_short_serves(const mha_attn_problem *p, mha_kernel kernel, bool bf16_dots);
/* p (mha_attn_short_serves for kernel and bf16_dots) on the whole-row loop
 * of kernel and its dtype: items of (batch, query head, rows), as many as
 * the threads want; the caller's scratch when it is large enough, else an
 * allocation.  Half q, k, v the bf16 loop does not take are widened item
 * by item into per-thread float32 rows (one more allocation: q, K, V and,
 * for a half out, out rows of one item per thread) and P is rounded to v's
 * dtype.  Bits depend on neither the threads nor the items. */
mha_status mha_attn_short_run(const mha_attn_problem *p, mha_kernel kernel, bool bf16_dots);
/* Bytes of the workspace mha_attn_short_run takes for S keys, head width d
 * and nthreads threads (part of mha_attn_scratch_bound). */
size_t mha_attn_short_scratch_bound(int64_t S, int64_t d, int nthreads);

#endif /* MHA_KERNELS_ATTENTION_SHORT_H */
