/* attention.c - scaled dot-product attention: options, validation, dispatch.
 *
 * Letter legend: B batch, Hq query heads, Hkv key/value heads, L query
 * length, S key length, d head dim of q/k, dv head dim of v.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the public entry --------------------------------------------------- */

void mha_sdpa_options_init(mha_sdpa_options *opt) {
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->attn_mask_polarity = MHA_TRUE_KEEPS;
    opt->key_padding_polarity = MHA_TRUE_MASKS;
    opt->masked_rows = MHA_MASKED_ROWS_ZERO;
    opt->kernel = MHA_KERNEL_AUTO;
    opt->window_left = opt->window_right = -1; /* no window */
}

mha_status mha_attn_check_common(mha_attn_problem *p, mha_masked_rows masked_rows, int training,
                                 float dropout_p, uint64_t seed) {
    MHA_CHECK(masked_rows == MHA_MASKED_ROWS_ZERO || masked_rows == MHA_MASKED_ROWS_NAN,
              MHA_ERR_VALUE, "masked_rows: unknown policy %d", (int)masked_rows);
    MHA_CHECK(isfinite(dropout_p) && dropout_p >= 0.0f && dropout_p < 1.0f, MHA_ERR_VALUE,
              "dropout_p: %g is not in [0, 1)", (double)dropout_p);
    p->masked_rows = masked_rows;
    p->dropout = training && dropout_p > 0.0f;
    p->dropout_p = dropout_p;
    p->seed = seed;
    return MHA_OK;
}

static mha_status check_polarity(mha_mask_polarity pol, const char *name) {
    MHA_CHECK(pol == MHA_TRUE_KEEPS || pol == MHA_TRUE_MASKS, MHA_ERR_VALUE,
              "%s: unknown polarity %d", name, (int)pol);
    return MHA_OK;
}

mha_status mha_attn_resolve_scale(mha_attn_problem *p, const mha_sdpa_options *opt) {
    if (opt->scale_set) {
        MHA_CHECK(isfinite(opt->scale), MHA_ERR_VALUE, "scale: %g is not finite",
                  (double)opt->scale);
        p->scale = opt->scale;
    } else {
        p->scale = (float)(1.0 / sqrt((double)p->d));
    }
    return MHA_OK;
}

/* out (B,Hq,L,dv): shape, writable, no overlap with q, k, v. */
static mha_status check_out(const mha_attn_problem *p, const mha_tensor *out, const mha_tensor *q,
                            const mha_tensor *k, const mha_tensor *v) {
    char s1[MHA_SHAPE_BUF];
    MHA_CHECK(out->shape[0] == p->B && out->shape[1] == p->Hq && out->shape[2] == p->L &&
                  out->shape[3] == p->dv,
              MHA_ERR_SHAPE, "out: shape %s, want (%lld,%lld,%lld,%lld)",
              mha_shape_str(out, s1, sizeof s1), (long long)p->B, (long long)p->Hq,
              (long long)p->L, (long long)p->dv);
    MHA_TRY(mha_check_writable(out, "out"));
    MHA_CHECK(!mha_tensors_overlap(out, q) && !mha_tensors_overlap(out, k) &&
                  !mha_tensors_overlap(out, v),
              MHA_ERR_ALIAS, "out: overlaps an input");
    return MHA_OK;
}

mha_status mha_sdpa_problem_init(mha_attn_problem *p, const mha_tensor *q, const mha_tensor *k,
                                 const mha_tensor *v, const mha_tensor *out,
                                 const mha_sdpa_options *opt) {
    char s1[MHA_SHAPE_BUF], s2[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_float_tensor(q, "q", 4));
    MHA_TRY(mha_check_float_tensor(k, "k", 4));
    MHA_TRY(mha_check_float_tensor(v, "v", 4));
    if (out)
        MHA_TRY(mha_check_float_tensor(out, "out", 4));
    memset(p, 0, sizeof *p);
    p->B = q->shape[0], p->Hq = q->shape[1], p->L = q->shape[2], p->d = q->shape[3];
    p->Hkv = k->shape[1], p->S = k->shape[2], p->dv = v->shape[3];
    MHA_CHECK(k->shape[0] == p->B && k->shape[3] == p->d, MHA_ERR_SHAPE,
              "k: shape %s does not fit q %s (want (B,Hkv,S,d))", mha_shape_str(k, s1, sizeof s1),
              mha_shape_str(q, s2, sizeof s2));
    MHA_CHECK(v->shape[0] == p->B && v->shape[1] == p->Hkv && v->shape[2] == p->S,
              MHA_ERR_SHAPE, "v: shape %s does not fit k %s (want (B,Hkv,S,dv))",
              mha_shape_str(v, s1, sizeof s1), mha_shape_str(k, s2, sizeof s2));
    MHA_CHECK(p->d > 0, MHA_ERR_SHAPE, "q: head dim d is 0 in shape %s",
              mha_shape_str(q, s1, sizeof s1));
    MHA_CHECK(p->Hkv > 0 || p->Hq == 0, MHA_ERR_SHAPE, "k: 0 kv heads for %lld query heads",
              (long long)p->Hq);
    MHA_CHECK(p->Hkv == 0 || p->Hq % p->Hkv == 0, MHA_ERR_SHAPE,
              "k: %lld kv heads do not divide %lld query heads", (long long)p->Hkv,
              (long long)p->Hq);
    if (out)
        MHA_TRY(check_out(p, out, q, k, v));
    int64_t work; /* the kernels index rows B*Hq*L of max(S,d) and dv, B*Hkv*S of max(d,dv) */
    MHA_CHECK(mha_product((int64_t[]){p->B, p->Hq, p->L, p->S > p->d ? p->S : p->d}, 4, &work) &&
                  mha_product((int64_t[]){p->B, p->Hq, p->L, p->dv}, 4, &work) &&
                  mha_product((int64_t[]){p->B, p->Hkv, p->S, p->d > p->dv ? p->d : p->dv}, 4,
                              &work),
              MHA_ERR_OVERFLOW, "q: B*Hq*L*max(S,d,dv) overflows for q %s and k %s",
              mha_shape_str(q, s1, sizeof s1), mha_shape_str(k, s2, sizeof s2));
    MHA_TRY(mha_attn_resolve_scale(p, opt));
    switch (opt->causal) {
    case MHA_CAUSAL_NONE: break;
    case MHA_CAUSAL_TOP_LEFT: p->causal_offset = 0; break;
    case MHA_CAUSAL_BOTTOM_RIGHT: p->causal_offset = p->S - p->L; break;
    case MHA_CAUSAL_OFFSET: p->causal_offset = opt->causal_offset; break;
    default: return mha_error(MHA_ERR_VALUE, "causal: unknown mode %d", (int)opt->causal);
    }
    p->causal = opt->causal;
    int64_t full[4] = {p->B, p->Hq, p->L, p->S};
    if (opt->attn_mask) {
        MHA_TRY(check_polarity(opt->attn_mask_polarity, "attn_mask_polarity"));
        MHA_TRY(mha_broadcast4(opt->attn_mask, "attn_mask", full, &p->mask));
        MHA_CHECK(!mha_tensors_overlap(out, opt->attn_mask), MHA_ERR_ALIAS, "out: overlaps attn_mask");
        p->mask_polarity = opt->attn_mask_polarity;
    }
    if (opt->key_padding_mask) {
        const mha_tensor *m = opt->key_padding_mask;
        MHA_TRY(check_polarity(opt->key_padding_polarity, "key_padding_polarity"));
        MHA_CHECK(m->ndim == 2 && m->shape[0] == p->B && m->shape[1] == p->S, MHA_ERR_SHAPE,
                  "key_padding_mask: shape %s, want (B,S) = (%lld,%lld)",
                  mha_shape_str(m, s1, sizeof s1), (long long)p->B, (long long)p->S);
        mha_tensor as4 = *m;
        as4.ndim = 4;
        as4.shape[0] = p->B, as4.shape[1] = 1, as4.shape[2] = 1, as4.shape[3] = p->S;
        as4.stride[3] = m->stride[1], as4.stride[0] = m->stride[0];
        as4.stride[1] = as4.stride[2] = 0;
        MHA_TRY(mha_broadcast4(&as4, "key_padding_mask", full, &p->kpm));
        MHA_CHECK(!mha_tensors_overlap(out, m), MHA_ERR_ALIAS, "out: overlaps key_padding_mask");
        p->kpm_polarity = opt->key_padding_polarity;
    }
    MHA_TRY(mha_attn_check_common(p, opt->masked_rows, opt->training, opt->dropout_p, opt->seed));
    p->q = *q, p->k = *k, p->v = *v;
    p->p_dtype = v->dtype; /* F32: P not rounded */
    if (out)
        p->o = *out;
    return MHA_OK;
}

mha_status mha_check_causal_top_left(mha_causal causal, const char *who) {
    MHA_CHECK(causal == MHA_CAUSAL_NONE || causal == MHA_CAUSAL_TOP_LEFT, MHA_ERR_VALUE,
              "%s: causal %d, want MHA_CAUSAL_NONE or MHA_CAUSAL_TOP_LEFT (no bottom-right or "
              "offset alignment here)",
              who, (int)causal);
    return MHA_OK;
}

mha_status mha_sdpa_forward(mha_tensor *out, const mha_tensor *q, const mha_tensor *k,
                            const mha_tensor *v, const mha_sdpa_options *opt) {
    MHA_OPTIONS_DEFAULT(mha_sdpa_options, opt);
    MHA_CHECK(out != NULL, MHA_ERR_NULL, "out: NULL tensor");
    mha_attn_problem p;
    MHA_TRY(mha_sdpa_problem_init(&p, q, k, v, out, opt));
    char s1[MHA_SHAPE_BUF];
    if (opt->attn_weights) {
        MHA_TRY(mha_check_tensor(opt->attn_weights, "attn_weights", 4, MHA_F32));
        const mha_tensor *w = opt->attn_weights;
        MHA_CHECK(w->shape[0] == p.B && w->shape[1] == p.Hq && w->shape[2] == p.L &&
                      w->shape[3] == p.S,
                  MHA_ERR_SHAPE, "attn_weights: shape %s, want (%lld,%lld,%lld,%lld)",
                  mha_shape_str(w, s1, sizeof s1), (long long)p.B, (long long)p.Hq,
                  (long long)p.L, (long long)p.S);
        MHA_TRY(mha_check_writable(w, "attn_weights"));
        MHA_CHECK(!mha_tensors_overlap(w, q) && !mha_tensors_overlap(w, k) &&
                      !mha_tensors_overlap(w, v) && !mha_tensors_overlap(w, out) &&
                      !mha_tensors_overlap(w, opt->attn_mask) &&
                      !mha_tensors_overlap(w, opt->key_padding_mask),
                  MHA_ERR_ALIAS, "attn_weights: overlaps another argument");
        p.attn_weights = *w;
    }
    float *rope_buf = NULL; /* rotated q and k when opt->rope */
    MHA_TRY(mha_attn_check_modern(&p, opt, out, &rope_buf));
    mha_status st = mha_attn_run(&p, opt->kernel);
    mha_free(rope_buf);
    return st;
}

mha_status mha_attn_run(const mha_attn_problem *p, mha_kernel kernel) {
    MHA_TRY(mha_runtime_check());
    if (p->B == 0 || p->Hq == 0 || p->L == 0)
        return MHA_OK; /* empty output, nothing to compute */
    mha_kernel kr = mha_kernel_resolve(kernel);
    if (kr != MHA_KERNEL_REF && mha_attn_needs_ref(p)) {
        MHA_CHECK(kernel == MHA_KERNEL_AUTO, MHA_ERR_UNSUPPORTED,
                  "kernel: %s does not serve these options (float64 softmax or an option "
                  "the fused kernels lack); use MHA_KERNEL_REF or AUTO",
                  mha_kernel_name(kr));
        kr = MHA_KERNEL_REF;
    }
    switch (kr) {
    case MHA_KERNEL_REF: return mha_attn_fwd_f32_ref(p);
    case MHA_KERNEL_SCALAR: return mha_attn_fwd_f32_scalar(p);
    case MHA_KERNEL_AVX2: return mha_attn_fwd_f32_avx2(p);
    case MHA_KERNEL_AVX512: return mha_attn_fwd_f32_avx512(p);
    case MHA_KERNEL_AUTO: break; /* GCOVR_EXCL_LINE: resolve never returns AUTO */
    }
    return mha_error(MHA_ERR_VALUE, "kernel: unknown kernel %d", (int)kernel);
}
