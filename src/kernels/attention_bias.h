/* attention_bias.h - THE bias rule of attention, in one place for every
 * kernel (reference, fused forward, both backwards).
 *
 * Letter legend: B batch, Hq query heads, L query length, S key length,
 * S_b the key length of batch b (kv_len, else S), p_i = i + offset_b the
 * query's position among the keys.
 *
 * The score of query i and key j gets
 *   -inf  when j >= S_b (checked first: a padded mask is never read past
 *         S_b), when causal and j > p_i, or outside the window
 *         [p_i - window_left, p_i + window_right] (a side < 0 is unbounded);
 *   else  -slope_h * |i + S_b - L - j| (ALiBi) + mask + key padding, added
 *         in that order (bool masks through their polarity: masked -> -inf).
 * Everything is static inline and calls nothing above the kernels.
 */
#ifndef MHA_KERNELS_ATTENTION_BIAS_H
#define MHA_KERNELS_ATTENTION_BIAS_H

#include "../internal.h"

#include <math.h>

/* The keys [*lo, *hi] row i of batch b may see by key length and window
 * (causality is separate: j <= p_i). */
static inline void mha_attn_key_range(const mha_attn_problem *p, int64_t b, int64_t i,
                                      int64_t *lo, int64_t *hi) {
    const int64_t pos = i + mha_attn_offset(p, b);
    *lo = INT64_MIN;
    *hi = p->kv_len.data ? mha_attn_kv_len(p, b) - 1 : INT64_MAX;
    if (p->window && p->window_left >= 0)
        *lo = pos - p->window_left;
    if (p->window && p->window_right >= 0 && pos + p->window_right < *hi)
        *hi = pos + p->window_right;
}

/* The additive terms of a visible (i, j): ALiBi, mask, key padding (0 without any). */
static inline float mha_attn_bias_terms(const mha_attn_problem *p, int64_t b, int64_t h,
                                        int64_t i, int64_t j) {
    float bias = 0.0f;
    if (p->alibi.data) { /* -slope * |i + S_b - L - j| */
        float slope = ((const float *)p->alibi.data)[h * p->alibi.stride[0]];
        int64_t dist = i + mha_attn_kv_len(p, b) - p->L - j;
        bias = -slope * (float)(dist < 0 ? -dist : dist);
    }
    if (p->mask.data) {
        int64_t idx[4] = {b, h, i, j};
        bias += mha_mask_value(&p->mask, mha_offset(&p->mask, idx), p->mask_polarity);
    }
    if (p->kpm.data) {
        int64_t idx[4] = {b, h, i, j};
        bias += mha_mask_value(&p->kpm, mha_offset(&p->kpm, idx), p->kpm_polarity);
    }
    return bias;
}

/* The bias of score (b, h, i, j): -inf where masked, else the terms. */
static inline float mha_attn_bias(const mha_attn_problem *p, int64_t b, int64_t h, int64_t i,
                                  int64_t j) {
    if (p->kv_len.data && j >= mha_attn_kv_len(p, b))
        return -INFINITY; /* first: a padded mask is never read past S_b */
    if (p->causal != MHA_CAUSAL_NONE && j > i + mha_attn_offset(p, b))
        return -INFINITY;
    int64_t lo, hi;
    mha_attn_key_range(p, b, i, &lo, &hi);
    if (j < lo || j > hi)
        return -INFINITY;
    return mha_attn_bias_terms(p, b, h, i, j);
}

/* How causality meets the additive terms: the one place the rule has a
 * choice.  HARD (every kernel, SDPA, multi-head attention without extra key
 * columns): a causally masked score is -inf and the terms are not read.
 * ADDED (multi-head attention's padded mask, built when bias_k/bias_v or
 * add_zero_attn append key columns to masked attention, src/multihead.c):
 * -inf + the terms, as additive masks merge (PyTorch adds its float masks).
 * They differ only where a term above the diagonal is +inf or NaN: NaN with
 * ADDED, -inf with HARD.  Tests: test_attention_bias.c. */
typedef enum mha_causal_rule { MHA_CAUSAL_HARD, MHA_CAUSAL_ADDED } mha_causal_rule;

/* mha_attn_bias with the causal rule as a parameter. */
static inline float mha_attn_bias_with(const mha_attn_problem *p, int64_t b, int64_t h, int64_t i,
                                       int64_t j, mha_causal_rule rule) {
    if (rule == MHA_CAUSAL_HARD)
        return mha_attn_bias(p, b, h, i, j);
    if (p->kv_len.data && j >= mha_attn_kv_len(p, b))
        return -INFINITY;
    int64_t lo, hi;
    mha_attn_key_range(p, b, i, &lo, &hi);
    if (j < lo || j > hi)
        return -INFINITY;
    const bool above = p->causal != MHA_CAUSAL_NONE && j > i + mha_attn_offset(p, b);
    return (above ? -INFINITY : 0.0f) + mha_attn_bias_terms(p, b, h, i, j);
}

#endif /* MHA_KERNELS_ATTENTION_BIAS_H */
