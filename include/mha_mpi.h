/*
 * mha_mpi.h - attention across processes: sequence-parallel ring attention
 * over MPI (the optional component libmha_mpi.a, built when mpicc is found;
 * docs/distributed.md has the algorithm, the layouts and the measurements).
 *
 * OVERVIEW
 *   The sequence of length L is split over the P ranks of an MPI
 *   communicator.  Every rank passes its own shard of Q, K, V (the rows of
 *   the global sequence it holds); K/V shards travel around the ring of
 *   ranks, each rank attends its Q shard to every K/V shard it receives
 *   (mha_sdpa_forward with LSE output) and merges the partial results by
 *   their log-sum-exp (mha_attention_merge).  The next shard is received
 *   with non-blocking MPI while the current one is computed.  The result on
 *   every rank is its shard of the single-process attention on the gathered
 *   tensors, to fp32 rounding.
 *
 *   Link with -lmha_mpi -lmha and compile with mpicc; programs that do not
 *   use MPI link only -lmha, exactly as before.
 *
 * LAYOUTS (how global rows map to ranks)
 *   MHA_RING_CONTIGUOUS: rank r holds rows [o_r, o_r + L_r), o_r the sum of
 *     the L_j of ranks j < r; shards may be uneven (any L_r >= 0).
 *   MHA_RING_ZIGZAG: the sequence is cut into 2P equal chunks of c = L/(2P)
 *     rows; rank r holds chunk r then chunk 2P-1-r (its L_r = 2c rows), so
 *     causal work is balanced.  Every rank must hold the same even L_r.
 *
 * LETTER LEGEND: B batch, H query heads, Hkv key/value heads, Ll the rank's
 *   local rows (L_r), d head dim of q/k, dv head dim of v.
 *
 * ERRORS
 *   The calls are collective: every rank of comm must call them together.
 *   Each rank validates its own arguments, then the ranks agree (one
 *   MPI_Allreduce on the status) before any data moves: when any rank's
 *   input is bad every rank returns the same status and the same message
 *   ("rank 1: k: shape ..."), never a hang.  The communicator is duplicated
 *   inside each call (MPI_Comm_dup), so its messages never mix with the
 *   caller's; MPI failures return MHA_ERR_IO.
 *
 * THREADS
 *   Inside a call mha uses mha_set_num_threads() threads per rank.  MPI is
 *   called only from the calling thread (MPI_THREAD_FUNNELED is enough).
 *   Results are bit-identical run to run for a fixed P, layout and shapes.
 */
#ifndef MHA_MPI_H
#define MHA_MPI_H

#include <mpi.h>

#include "mha.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mha_ring_layout {
    MHA_RING_CONTIGUOUS = 0, /* rank r: rows [o_r, o_r + L_r)                 */
    MHA_RING_ZIGZAG = 1      /* rank r: chunks r and 2P-1-r of 2P equal ones */
} mha_ring_layout;

/* What one call did on this rank (filled on success when opt->stats is set). */
typedef struct mha_ring_stats {
    int64_t bytes_sent;     /* bytes this rank sent to its ring neighbour     */
    int64_t messages;       /* MPI sends posted                               */
    int64_t blocks;         /* attention blocks computed (skipped ones not)   */
    double wait_seconds;    /* blocked in MPI_Wait: communication not hidden  */
    double compute_seconds; /* in the attention blocks and merges             */
    double total_seconds;   /* the whole call                                 */
} mha_ring_stats;

typedef struct mha_ring_options {
    /* The attention: scale, causal (NONE, TOP_LEFT, BOTTOM_RIGHT = TOP_LEFT
     * for self-attention, OFFSET with causal_offset, all in global row
     * positions), softcap, kv_lengths (B) MHA_I64 global valid key counts,
     * masked_rows, onnx_scale, kernel.  Not served across ranks (refused with
     * MHA_ERR_UNSUPPORTED): attn_mask, key_padding_mask, dropout in
     * training, attn_weights, qk_out, window, causal_offsets, alibi_slopes, sinks, rope;
     * the backward also refuses kernel REF (its reference recomputes the
     * softmax per block instead of reading the global lse). */
    mha_sdpa_options sdpa;
    mha_ring_layout layout;    /* default MHA_RING_CONTIGUOUS                 */
    mha_ring_stats *stats;     /* optional output                              */
} mha_ring_options;

/* Defaults: mha_sdpa_options_init's attention, contiguous layout, no stats. */
void mha_ring_options_init(mha_ring_options *opt);

/* Forward, collective over comm.  Per rank:
 *   out (B,H,Ll,dv) = this rank's rows of softmax(Q K^T * scale) V over the
 *   gathered sequence; lse (B,H,Ll) its rows' log-sum-exp (natural log,
 *   -inf for a fully masked row) or NULL.
 *   q (B,H,Ll,d), k (B,Hkv,Ll,d), v (B,Hkv,Ll,dv): the rank's shards, H a
 *   multiple of Hkv (GQA: only the Hkv kv heads travel).
 * B, H, Hkv, d, dv and the options are the same on every rank. */
mha_status mha_ring_attention_forward(MPI_Comm comm, mha_tensor *out, mha_tensor *lse,
                                      const mha_tensor *q, const mha_tensor *k,
                                      const mha_tensor *v, const mha_ring_options *opt);

/* Backward, collective over comm; THE GRADIENT RULE of mha.h (adds):
 *   dq (B,H,Ll,d) += dL/dq, dk (B,Hkv,Ll,d) += dL/dk, dv (B,Hkv,Ll,dv) +=
 *   dL/dv for this rank's rows (each may be NULL), of L = sum(dout * out)
 *   over every rank.  dout (B,H,Ll,dv); out and lse: this rank's outputs of
 *   mha_ring_attention_forward with the same options (both required: every
 *   block recomputes its probabilities from the global lse and its D = dout.out
 *   from the global out, so the per-block gradients are exact).  dq
 *   accumulates locally; the dK/dV accumulators travel the ring with their
 *   K/V and return to their owner. */
mha_status mha_ring_attention_backward(MPI_Comm comm, mha_tensor *dq, mha_tensor *dk,
                                       mha_tensor *dv, const mha_tensor *dout,
                                       const mha_tensor *out, const mha_tensor *lse,
                                       const mha_tensor *q, const mha_tensor *k,
                                       const mha_tensor *v, const mha_ring_options *opt);

/* Sequence-parallel nn.TransformerEncoderLayer(batch_first=True) forward,
 * collective over comm: every rank holds a slice of the tokens,
 *   out (B,Ll,E) = this rank's rows of mha_encoder_layer_forward(src) over
 *   the gathered sequence, src (B,Ll,E) the rank's tokens, laid out over the
 *   ranks as `layout` says (dimension 1 is the sequence).
 * Projections, norms and the MLP run per token on the rank; the attention
 * is mha_ring_attention_forward.  w: the single-process layer's weights (the
 * same state_dict on every rank; packed in_proj_weight or separate q/k/v,
 * no bias_k/bias_v); opt as for mha_encoder_layer_forward (no dropout in
 * training); causal MHA_CAUSAL_TOP_LEFT masks later tokens (is_causal),
 * MHA_CAUSAL_NONE none (other values: MHA_ERR_VALUE).  out may be src. */
mha_status mha_ring_encoder_layer_forward(MPI_Comm comm, mha_tensor *out, const mha_tensor *src,
                                          const mha_encoder_layer_weights *w,
                                          const mha_layer_options *opt, mha_causal causal,
                                          mha_ring_layout layout);

/* Its backward, collective: dsrc (B,Ll,E) += dL/dsrc for this rank's
 * tokens; grads += dL/dweights of the whole sequence (each rank's sums
 * reduced by MPI_Allreduce, so every rank adds the same values); from dout
 * (B,Ll,E), with the forward's src, weights, options, causal and layout.
 * The forward is recomputed inside (no saved state).  grads' fields as
 * mha_encoder_layer_grads (NULL: not wanted); dsrc must not overlap the
 * inputs. */
mha_status mha_ring_encoder_layer_backward(MPI_Comm comm, mha_tensor *dsrc,
                                           const mha_encoder_layer_grads *grads,
                                           const mha_tensor *dout, const mha_tensor *src,
                                           const mha_encoder_layer_weights *w,
                                           const mha_layer_options *opt, mha_causal causal,
                                           mha_ring_layout layout);

#ifdef __cplusplus
}
#endif

#endif
