/* attention_backward.c - SDPA backward: validation and dispatch.
 *
 * Letter legend: B batch, Hq query heads, Hkv key/value heads, L query
 * length, S key length, d head dim of q/k, dv head dim of v.
 *
 * The problem is resolved exactly as mha_sdpa_forward resolves it (scale,
 * causal alignment, mask broadcast, key padding, dropout), then handed to
 * mha_attn_bwd_f32_ref (kernel REF), mha_attn_bwd_f32_scalar (SCALAR),
 * mha_attn_bwd_f32_avx2 (AVX2) or mha_attn_bwd_f32_avx512 (AVX512; AUTO
 * picks the best the CPU runs).
 */
#include "internal.h"
#include "kernels/attention_bwd.h"

#include <math.h>
#include <string.h>

/* A (B,H,N,c) tensor of any float dtype and the given shape. */
static mha_status check_shape4(const mha_tensor *t, const char *name, int64_t a, int64_t b,
                               int64_t c, int64_t e) {
    char sb[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_float_tensor(t, name, 4));
    MHA_CHECK(t->shape[0] == a && t->shape[1] == b && t->shape[2] == c && t->shape[3] == e,
              MHA_ERR_SHAPE, "%s: shape %s, want (%lld,%lld,%lld,%lld)", name,
              mha_shape_str(t, sb, sizeof sb), (long long)a, (long long)b, (long long)c,
              (long long)e);
    return MHA_OK;
}

/* The forward's problem from (q, k, v, opt) (mha_sdpa_problem_init); out is
 * not part of it. */
static mha_status sdpa_problem(mha_attn_problem *p, const mha_tensor *q, const mha_tensor *k,
                               const mha_tensor *v, const mha_sdpa_options *opt) {
    MHA_TRY(mha_sdpa_problem_init(p, q, k, v, NULL, opt));
    /* softcap, window, per-batch offsets and key lengths, ALiBi, sinks:
     * resolved by the forward's own validation */
    MHA_CHECK(opt->rope == MHA_ROPE_NONE, MHA_ERR_UNSUPPORTED,
              "rope: the backward does not take rotary embeddings yet (rotate q and k "
              "with mha_rope_apply before the forward and its gradients back after)");
    float *rope_buf = NULL;
    MHA_TRY(mha_attn_check_modern(p, opt, NULL, &rope_buf));
    mha_free(rope_buf);
    p->lse = (mha_tensor){0}, p->qk = (mha_tensor){0}, p->attn_weights = (mha_tensor){0};
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
    case MHA_KERNEL_AVX512: return mha_attn_bwd_f32_avx512(p, g);
    case MHA_KERNEL_AUTO: break;
    }
    return mha_error(MHA_ERR_VALUE, "kernel: unknown kernel %d", (int)kernel);
}

/* Half tensors among q, k, v, dout, out and the gradients: the kernels
 * run on float32 copies (the half values, exactly), and each half gradient
 * gets its copy back rounded once; P and dS are not rounded.  *buf holds
 * the copies (NULL when every tensor is float32); free with mha_free. */
static mha_status widen_half(mha_attn_problem *p, mha_attn_grad *g, float **buf) {
    mha_tensor *ts[] = {&p->q, &p->k, &p->v, &g->dout, &g->out, &g->dq, &g->dk, &g->dv};
    const int nt = (int)(sizeof ts / sizeof *ts);
    int64_t total = 0, n;
    *buf = NULL;
    for (int t = 0; t < nt; t++)
        if (ts[t]->data && ts[t]->dtype != MHA_F32) {
            MHA_TRY(mha_tensor_numel(ts[t], &n));
            total += n;
        }
    if (total == 0)
        return MHA_OK;
    float *wide = mha_malloc(sizeof(float) * (size_t)total);
    MHA_CHECK(wide, MHA_ERR_NOMEM, "backward: cannot allocate %lld floats for the float32 copies "
                                   "of the half tensors", (long long)total);
    int64_t off = 0;
    for (int t = 0; t < nt; t++) {
        if (!ts[t]->data || ts[t]->dtype == MHA_F32)
            continue;
        mha_tensor f32;
        mha_status st = mha_tensor_init(&f32, MHA_F32, wide + off, 4, ts[t]->shape);
        if (st == MHA_OK)
            st = mha_tensor_convert(&f32, ts[t]);
        if (st != MHA_OK) { /* GCOVR_EXCL_START: the shapes were checked */
            mha_free(wide);
            return st;
        } /* GCOVR_EXCL_STOP */
        MHA_TRY(mha_tensor_numel(ts[t], &n));
        off += n;
        *ts[t] = f32;
    }
    *buf = wide;
    return MHA_OK;
}

mha_status mha_sdpa_backward(mha_tensor *dq, mha_tensor *dk, mha_tensor *dv,
                             const mha_tensor *dout, const mha_tensor *out, const mha_tensor *lse,
                             const mha_tensor *q, const mha_tensor *k, const mha_tensor *v,
                             const mha_sdpa_options *opt) {
    MHA_OPTIONS_DEFAULT(mha_sdpa_options, opt);
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
    const mha_tensor *inputs[] = {q, k, v, dout, out, lse, opt->attn_mask, opt->key_padding_mask};
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
    p.p_dtype = MHA_F32; /* the backward computes in float32 throughout */
    float *wide;
    MHA_TRY(widen_half(&p, &g, &wide));
    mha_status st = mha_attn_bwd_run(&p, &g, opt->kernel);
    const mha_tensor *wg[3] = {&g.dq, &g.dk, &g.dv};
    for (int t = 0; t < 3 && st == MHA_OK && wide; t++)
        if (grads[t] && grads[t]->dtype != MHA_F32)
            st = mha_tensor_convert(grads[t], wg[t]);
    mha_free(wide);
    return st;
}
