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

/* Fused tiles: recomputes P from lse per (query tile, key block), never
 * builds the L x S matrix; deterministic for any thread count. */
mha_status mha_attn_bwd_f32_flash(const mha_attn_problem *p, const mha_attn_grad *g);

/* Runs a validated backward on the requested kernel: REF the reference,
 * SCALAR/AVX2 the fused backward (AUTO resolves as the forward does). */
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
