/* attention_bwd.h - the attention backward kernels (reference and fused).
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v; G = Hq/Hkv query heads
 * per kv head.
 *
 * Both kernels take the forward's validated problem (mha_attn_problem: q, k,
 * v, masks, causal, scale, dropout) plus the gradient views below, and ADD
 * into dq/dk/dv (the caller zeroes).  With s_ij = scale q_i.k_j + bias_ij,
 * P = softmax_j(s), Z_ij = keep_ij/(1-p) (1 without dropout):
 *   dV_j += sum_i P_ij Z_ij dO_i
 *   dP_ij = Z_ij dO_i.v_j,   D_i = sum_j P_ij dP_ij = dO_i.O_i
 *   dS_ij = P_ij (dP_ij - D_i)
 *   dQ_i += scale sum_j dS_ij k_j,   dK_j += scale sum_i dS_ij q_i
 * ref: Dao, "FlashAttention-2" (2023), Algorithm 2 (backward pass).
 */
#ifndef MHA_ATTENTION_BWD_H
#define MHA_ATTENTION_BWD_H

#include "../internal.h"

typedef struct mha_attn_grad {
    mha_tensor dq;   /* (B,Hq,L,d), data NULL when not wanted            */
    mha_tensor dk;   /* (B,Hkv,S,d), data NULL when not wanted           */
    mha_tensor dv;   /* (B,Hkv,S,dv), data NULL when not wanted          */
    mha_tensor dout; /* (B,Hq,L,dv) upstream gradient                    */
    mha_tensor out;  /* (B,Hq,L,dv) forward output, data NULL: recompute */
    mha_tensor lse;  /* (B,Hq,L) forward log-sum-exp, data NULL: recompute */
} mha_attn_grad;

/* Naive loops in float64, recomputing P row by row (ignores out and lse);
 * threads split over (b, kv head) pairs, each owning its dk/dv rows. */
mha_status mha_attn_bwd_f32_ref(const mha_attn_problem *p, const mha_attn_grad *g);

/* ---- the fused backward (attention_bwd_flash.c driver) ------------------- *
 * Tile letters: BR query rows per tile, BC keys per block, MR = 6 rows and
 * NR = 16 columns per register block, dp = d and dvp = dv rounded up to NR.
 * Packed panels (contiguous, 64-byte aligned): a "panel matrix" (n/NR, k, NR)
 * holds columns [NR*p, NR*p+NR) of a (k, n) matrix as panel p, rows k
 * contiguous within the panel, columns past n zero.
 *
 * The driver owns tiling, packing, masks, dropout, softcap, threads and the
 * fixed-order reductions; an ISA supplies the two inner loops below. */
enum {
    MHA_BWD_MR = 6,  /* rows per register block                    */
    MHA_BWD_NR = 16, /* columns per register block (2 YMM, 1 ZMM)  */
    MHA_BWD_BR = 48, /* query rows per tile (8 register blocks)     */
    MHA_BWD_BC = 192 /* keys per block (12 panels, 32 register rows) */
};

typedef struct mha_bwd_isa {
    const char *name;
    /* c (MR, np*NR) rows ld ldc  = (acc: c +) a (MR, k) . b (np, k, NR)
     * where a(r, x) = a[r*rsa + x*csa] and panel p starts at b + p*pstride.
     * The same loop serves the five products: a row-major (rsa = ld, csa = 1)
     * or transposed (rsa = 1, csa = ld) operand. */
    void (*gemm)(float *c, int64_t ldc, const float *a, int64_t rsa, int64_t csa,
                 const float *b, int64_t pstride, int64_t k, int64_t np, bool acc);
    /* One score row of a tile, in place over [0, n):
     *   j < lim and bias[j] != -inf (bias NULL: 0):
     *     P = exp(s*scale + bias - lse);  s = P;  dp = P (dp - D)
     *   otherwise, and where s*scale + bias - lse < MHA_SOFTMAX_FLUSH_X
     *   (internal.h: P < 1e-30, whose P and dS would risk denormal
     *   floats, microcode assists on Intel: a backward of rows whose
     *   scores spread past 87 ran 1.75-8x slower), s = dp = 0 (exactly;
     *   NaN in s or dp is dropped; a NaN x is kept and propagates). */
    void (*row_grad)(float *s, float *dp, int64_t n, int64_t lim, float scale, const float *bias,
                     float lse, float D);
    /* One K^T/V^T panel: panel (k, NR) = rows (w, k) of src (row r at
     * src + r*rs, columns contiguous) transposed, panel[x*NR + r] =
     * src[r*rs + x] for r < w <= NR, zero for w <= r < NR; panel 64-byte
     * aligned.  NULL: the driver's one-float loop. */
    void (*transpose_rows)(float *panel, const float *src, int64_t rs, int64_t w, int64_t k);
    /* gemm on 2*MR rows, c (2*MR, np*NR), for np <= 2 panels (head dims up
     * to 32), where MR rows would leave most accumulator registers idle;
     * each element the same FMA chain as gemm's.  NULL: the driver calls
     * gemm twice. */
    void (*gemm_tall)(float *c, int64_t ldc, const float *a, int64_t rsa, int64_t csa,
                      const float *b, int64_t pstride, int64_t k, int64_t np, bool acc);
} mha_bwd_isa;

/* The whole-row backward of the (b, kv head hk) pair of a plain problem
 * (attention_short_avx512.c; served by mha_attn_bwd_flash_run, which
 * says which problems): lse and delta the run's row statistics (B*Hq*L),
 * ws mha_attn_short_bwd_ws_floats(S, d, dv, G, L) floats.  Adds the pair's
 * dK, dV and its query heads' dQ into g (those wanted) and returns true;
 * returns false having written nothing when some K, V, Q or dO row of the
 * pair is not finite (the flash tiles' zero-skipping products take it). */
typedef bool (*mha_bwd_pair_rows_fn)(const mha_attn_problem *p, const mha_attn_grad *g,
                                     const mha_bwd_isa *isa, const float *lse,
                                     const float *delta, int64_t b, int64_t hk, float *ws);
MHA_AVX512_DECLARE(mha_bwd_pair_rows_fn, mha_attn_short_bwd_avx512_loop);

/* The longest rows the whole-row backward serves, as S max(d, dv): its
 * pair's K^T, V^T and K panels and dK, dV accumulators (about 20 S d
 * bytes) within 160 KiB; past it the tiles were as fast or faster
 * (docs/backward.md, "Whole rows"). */
#ifndef MHA_BWD_ROWS_MAX_SD
#define MHA_BWD_ROWS_MAX_SD 8192
#endif
/* The same bound with causal masking, whose blocks see half the keys on
 * average: up to 32768 the whole rows were 8-14 % faster than the tiles at
 * d = 64 and level at d = 32 (docs/backward.md, "Whole rows"). */
#ifndef MHA_BWD_ROWS_CAUSAL_MAX_SD
#define MHA_BWD_ROWS_CAUSAL_MAX_SD 32768
#endif

/* Whether the whole-row backward serves p (the shape's and options' alone,
 * never the threads'): a plain problem (no mask, bias, window, dropout or
 * softcap; causal masking only on the main diagonal), float32 tensors with
 * unit column strides, S max(d, dv) <= MHA_BWD_ROWS_MAX_SD (causal:
 * MHA_BWD_ROWS_CAUSAL_MAX_SD) and the group's dQ rows (G L d) within the
 * driver's dQ budget. */
bool mha_attn_bwd_rows_serve(const mha_attn_problem *p, const mha_attn_grad *g);

/* Fused tiles: recomputes P from lse per (query tile, key block), never
 * builds the L x S matrix; deterministic for any thread count.
 * whole_rows: NULL, or the whole-row backward, which then serves the pairs
 * of the problems mha_attn_bwd_rows_serve accepts. */
mha_status mha_attn_bwd_flash_run(const mha_attn_problem *p, const mha_attn_grad *g,
                                  const mha_bwd_isa *isa, mha_bwd_pair_rows_fn whole_rows);
/* The fused backward on the portable inner loops, on AVX2+FMA and on
 * AVX-512 (MHA_ERR_UNSUPPORTED when the CPU lacks them). */
mha_status mha_attn_bwd_f32_scalar(const mha_attn_problem *p, const mha_attn_grad *g);
mha_status mha_attn_bwd_f32_avx2(const mha_attn_problem *p, const mha_attn_grad *g);
mha_status mha_attn_bwd_f32_avx512(const mha_attn_problem *p, const mha_attn_grad *g);

/* The portable inner loops (attention_bwd_flash.c; any CPU). */
extern const mha_bwd_isa mha_bwd_isa_scalar;
/* The AVX2+FMA inner loops (attention_bwd_avx2.c; only call when the CPU
 * has AVX2 and FMA). */
extern const mha_bwd_isa mha_bwd_isa_avx2;
/* The AVX-512 loops (attention_bwd_avx512.c; check mha_avx512_runs()). */
MHA_AVX512_DECLARE(mha_bwd_isa, mha_bwd_isa_avx512);

/* Runs a validated backward on the requested kernel: REF the reference,
 * SCALAR/AVX2/AVX512 the fused backward (AUTO resolves as the forward does). */
mha_status mha_attn_bwd_run(const mha_attn_problem *p, const mha_attn_grad *g,
                            mha_kernel kernel);

/* Per-row statistics of the forward, for a caller that did not save them:
 * lse (B*Hq*L floats, row index (b*Hq+h)*L+i) always; delta (same size)
 * = sum_j P_ij dP_ij when non-NULL (needs g->dout).  Used by the flash
 * backward when g->lse or g->out is absent, and by the multi-head forward
 * to save the log-sum-exp. */
mha_status mha_attn_row_stats(const mha_attn_problem *p, const mha_attn_grad *g, float *lse,
                              float *delta);

#endif /* MHA_ATTENTION_BWD_H */
