/* multihead.h - private: the nn.MultiheadAttention problem setup shared by
 * the forward (multihead.c, where these are defined) and the backward
 * (multihead_backward.c).
 *
 * Letter legend: B batch, L query length, S key length, S' = Sx = S plus the
 * bias_k/bias_v column and the zero-attention column, R = max(L, S'),
 * E model width, H heads, d = E/H, kdim/vdim the key/value input widths.
 */
#ifndef MHA_MULTIHEAD_H
#define MHA_MULTIHEAD_H

#include "internal.h"

typedef struct mh_dims {
    bool batched, self_attn, packed, bias_kv;
    int64_t B, L, S, Sx, R, E, H, d, kdim, vdim;
} mh_dims;

/* t: query/key/value-like (B,N,width) or unbatched (N,width), rows
 * contiguous; gives B (1 when unbatched), N and width. */
mha_status mha_mh_check_sequence(const mha_tensor *t, const char *name, bool batched,
                                 int64_t *B, int64_t *N, int64_t *width);
/* Row stride and batch stride (0 when unbatched) of a checked sequence. */
void mha_mh_sequence_strides(const mha_tensor *t, bool batched, int64_t *ld, int64_t *bs);
/* Checks query (B,L,E), key (B,S,kdim), value (B,S,vdim), the weights and
 * num_heads; fills every field of *m. */
mha_status mha_mh_check_dims(mh_dims *m, const mha_tensor *query, const mha_tensor *key,
                             const mha_tensor *value, const mha_multihead_weights *w,
                             const mha_multihead_options *opt);
/* Checks a PyTorch-MHA mask (attn_mask (L,S) or (B*H,L,S); key_padding_mask
 * (B,S) or (S)) and gives its (B,H,L,S) broadcast view. */
mha_status mha_mh_mask_view(const mh_dims *m, const mha_tensor *t, bool is_kpm,
                            mha_tensor *view);
/* out (Bm,Hm,L,S'): combined additive mask when extra key columns exist
 * (attn, kpm: views from mha_mh_mask_view, or NULL); the caller frees it. */
mha_status mha_mh_build_padded_mask(const mh_dims *m, const mha_tensor *attn,
                                    const mha_tensor *kpm, int causal, mha_tensor *out);
/* p's B,Hq,Hkv,L,S,d,dv,scale and its head views: q, k, v (B,H,L|S',d) of
 * qkv (B,R,3E) at columns 0, E, 2E, o (B,H,L,d) of attn (B,L,E). */
void mha_mh_head_views(const mh_dims *m, float *qkv, float *attn, mha_attn_problem *p);

#endif
