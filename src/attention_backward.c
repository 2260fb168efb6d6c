/* attention_backward.c - SDPA backward: validation and dispatch.
 *
 * Letter legend: B batch, Hq query heads, Hkv key/value heads, L query
 * length, S key length, d head dim of q/k, dv head dim of v.
 *
 * The problem is resolved exactly as mha_sdpa_forward resolves it (scale,
 * causal alignment, mask broadcast, key padding, dropout), then handed to
 * mha_attn_bwd_f32_ref (kernel REF), mha_attn_bwd_f32_scalar (SCALAR) or
 * mha_attn_bwd_f32_avx2 (AVX2; AUTO picks the best the CPU runs).
 */
#include "internal.h"
#include "kernels/attention_bwd.h"

#include <math.h>
#include <string.h>

static mha_status check_polarity(mha_mask_polarity pol, const char *name) {
    MHA_CHECK(pol == MHA_TRUE_KEEPS || pol == MHA_TRUE_MASKS, MHA_ERR_VALUE,
              "%s: unknown polarity %d", name, (int)pol);
    return MHA_OK;
}

/* A (B,H,N,c) float32 tensor of the given shape. */
static mha_status check_shape4(const mha_tensor *t, const char *name, int64_t a, int64_t b,
                               int64_t c, int64_t e) {
    char sb[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_tensor(t, name, 4, MHA_F32));
    MHA_CHECK(t->shape[0] == a && t->shape[1] == b && t->shape[2] == c && t->shape[3] == e,
              MHA_ERR_SHAPE, "%s: shape %s, want (%lld,%lld,%lld,%lld)", name,
              mha_shape_str(t, sb, sizeof sb), (long long)a, (long long)b, (long long)c,
              (long long)e);
    return MHA_OK;
}

/* The forward's problem from (q, k, v, opt); out is not part of it. */
static mha_status sdpa_problem(mha_attn_problem *p, const mha_tensor *q, const mha_tensor *k,
                               const mha_tensor *v, const mha_sdpa_options *opt) {
    char s1[MHA_SHAPE_BUF], s2[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_tensor(q, "q", 4, MHA_F32));
    MHA_TRY(mha_check_tensor(k, "k", 4, MHA_F32));
    MHA_TRY(mha_check_tensor(v, "v", 4, MHA_F32));
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
    int64_t work;
    MHA_CHECK(mha_product((int64_t[]){p->B, p->Hq, p->L, p->S > p->d ? p->S : p->d}, 4, &work) &&
                  mha_product((int64_t[]){p->B, p->Hq, p->L, p->dv}, 4, &work) &&
                  mha_product((int64_t[]){p->B, p->Hkv, p->S, p->d > p->dv ? p->d : p->dv}, 4,
                              &work),
              MHA_ERR_OVERFLOW, "q: sizes overflow for q %s and k %s",
              mha_shape_str(q, s1, sizeof s1), mha_shape_str(k, s2, sizeof s2));
    if (opt->scale_set) {
        MHA_CHECK(isfinite(opt->scale), MHA_ERR_VALUE, "scale: %g is not finite",
                  (double)opt->scale);
        p->scale = opt->scale;
    } else {
        p->scale = (float)(1.0 / sqrt((double)p->d));
    }
    switch (opt->causal) {
    case MHA_CAUSAL_NONE: break;
    case MHA_CAUSAL_TOP_LEFT: p->causal_offset = 0; break;
    case MHA_CAUSAL_BOTTOM_RIGHT: p->causal_offset = p->S - p->L; break;
    case MHA_CAUSAL_OFFSET: p->causal_offset = opt->causal_offset; break;
    default: return mha_error(MHA_ERR_VALUE, "causal: unknown mode %d", (int)opt->causal);
    }
    p->causal = opt->causal;
    int64_t full[4] = {p->B, p->Hq, p->L, p->S};
    if (opt->mask) {
        MHA_TRY(check_polarity(opt->mask_polarity, "mask_polarity"));
        MHA_TRY(mha_broadcast4(opt->mask, "mask", full, &p->mask));
        p->mask_polarity = opt->mask_polarity;
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
        p->kpm_polarity = opt->key_padding_polarity;
    }
    MHA_TRY(mha_attn_check_common(p, opt->masked_rows, opt->training, opt->dropout_p, opt->seed));
    p->q = *q, p->k = *k, p->v = *v;
    /* softcap, window, per-batch offsets and key lengths, ALiBi, sinks:
     * resolved by the forward's own validation */
    MHA_CHECK(opt->rope == MHA_ROPE_NONE, MHA_ERR_UNSUPPORTED,
              "rope: the backward does not take rotary embeddings yet (rotate q and k "
              "with mha_rope_apply before the forward and its gradients back after)");
    float *rope_buf = NULL;
    MHA_TRY(mha_attn_check_modern(p, opt, NULL, &rope_buf));
    mha_free(rope_buf);
    p->lse = (mha_tensor){0}, p->qk = (mha_tensor){0}, p->weights = (mha_tensor){0};
    p->softmax_f64 = false;
    return MHA_OK;
}

mha_status mha_attn_bwd_run(const mha_attn_problem *p, const mha_attn_grad *g,
                            mha_kernel kernel) {
    MHA_TRY(mha_runtime_check());
    if (p->B == 0 || p->Hq == 0 || p->L == 0 || p->S == 0)
        return MHA_OK; /* nothing attends: zero gradient */
    switch (mha_kernel_resolve(kernel)) {
    case MHA_KERNEL_REF: return mha_attn_bwd_f32_ref(p, g);
    case MHA_KERNEL_SCALAR: return mha_attn_bwd_f32_scalar(p, g);
    case MHA_KERNEL_AVX2: return mha_attn_bwd_f32_avx2(p, g);
    case MHA_KERNEL_AUTO: break;
    }
    return mha_error(MHA_ERR_VALUE, "kernel: unknown kernel %d", (int)kernel);
}

mha_status mha_sdpa_backward(mha_tensor *dq, mha_tensor *dk, mha_tensor *dv,
                             const mha_tensor *dout, const mha_tensor *out, const mha_tensor *lse,
                             const mha_tensor *q, const mha_tensor *k, const mha_tensor *v,
                             const mha_sdpa_options *opt) {
    mha_sdpa_options defaults;
    if (!opt) {
        mha_sdpa_options_init(&defaults);
        opt = &defaults;
    }
    mha_attn_problem p;
    MHA_TRY(sdpa_problem(&p, q, k, v, opt));
    mha_attn_grad g;
    memset(&g, 0, sizeof g);
    MHA_TRY(check_shape4(dout, "dout", p.B, p.Hq, p.L, p.dv));
    g.dout = *dout;
    if (out) {
        MHA_TRY(check_shape4(out, "out", p.B, p.Hq, p.L, p.dv));
        g.out = *out;
    }
    if (lse) {
        char sb[MHA_SHAPE_BUF];
        MHA_TRY(mha_check_tensor(lse, "lse", 3, MHA_F32));
        MHA_CHECK(lse->shape[0] == p.B && lse->shape[1] == p.Hq && lse->shape[2] == p.L,
                  MHA_ERR_SHAPE, "lse: shape %s, want (B,Hq,L) = (%lld,%lld,%lld)",
                  mha_shape_str(lse, sb, sizeof sb), (long long)p.B, (long long)p.Hq,
                  (long long)p.L);
        g.lse = *lse;
    }
    mha_tensor *grads[3] = {dq, dk, dv};
    const char *names[3] = {"dq", "dk", "dv"};
    const int64_t want[3][4] = {{p.B, p.Hq, p.L, p.d}, {p.B, p.Hkv, p.S, p.d},
                                {p.B, p.Hkv, p.S, p.dv}};
    const mha_tensor *inputs[] = {q, k, v, dout, out, lse, opt->mask, opt->key_padding_mask};
    for (int t = 0; t < 3; t++) {
        if (!grads[t])
            continue;
        MHA_TRY(check_shape4(grads[t], names[t], want[t][0], want[t][1], want[t][2], want[t][3]));
        MHA_TRY(mha_check_writable(grads[t], names[t]));
        for (size_t i = 0; i < sizeof inputs / sizeof *inputs; i++)
            MHA_CHECK(!mha_tensors_overlap(grads[t], inputs[i]), MHA_ERR_ALIAS,
                      "%s: overlaps an input", names[t]);
        for (int u = 0; u < t; u++)
            MHA_CHECK(!grads[u] || !mha_tensors_overlap(grads[t], grads[u]), MHA_ERR_ALIAS,
                      "%s: overlaps %s", names[t], names[u]);
    }
    if (dq)
        g.dq = *dq;
    if (dk)
        g.dk = *dk;
    if (dv)
        g.dv = *dv;
    if (!dq && !dk && !dv)
        return MHA_OK;
    return mha_attn_bwd_run(&p, &g, opt->kernel);
}
