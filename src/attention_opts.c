/* attention_opts.c - validation of the modern attention options (softcap,
 * windows, per-batch offsets and key lengths, ALiBi, sinks, LSE and ONNX
 * qk outputs, softmax precision, ONNX scale, RoPE) into mha_attn_problem.
 *
 * Letter legend: B batch, Hq query heads, Hkv key/value heads, L query
 * length, S key length, d head dim of q/k, dv head dim of v.
 */
#include "internal.h"

#include <string.h>

/* A (n) vector option of dtype dt: rank 1, length n, no overlap with out. */
static mha_status check_vec(const mha_tensor *t, const char *name, int64_t n, mha_dtype dt,
                            const mha_tensor *out, mha_tensor *dst) {
    char sb[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_tensor(t, name, 1, dt));
    MHA_CHECK(t->shape[0] == n, MHA_ERR_SHAPE, "%s: shape %s, want (%lld)", name,
              mha_shape_str(t, sb, sizeof sb), (long long)n);
    MHA_CHECK(!mha_tensors_overlap(out, t), MHA_ERR_ALIAS, "out: overlaps %s", name);
    *dst = *t;
    return MHA_OK;
}

/* An optional output of the given shape, overlapping no input nor out. */
static mha_status check_out(const mha_tensor *t, const char *name, int ndim, const int64_t *want,
                            const mha_attn_problem *p, const mha_tensor *out) {
    char sb[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_tensor(t, name, ndim, MHA_F32));
    for (int i = 0; i < ndim; i++)
        MHA_CHECK(t->shape[i] == want[i], MHA_ERR_SHAPE,
                  "%s: shape %s, want (%lld,%lld,%lld%s%lld)", name,
                  mha_shape_str(t, sb, sizeof sb), (long long)want[0], (long long)want[1],
                  (long long)want[2], ndim == 4 ? "," : ")", ndim == 4 ? (long long)want[3] : 0LL);
    MHA_TRY(mha_check_writable(t, name));
    MHA_CHECK(!mha_tensors_overlap(t, &p->q) && !mha_tensors_overlap(t, &p->k) &&
                  !mha_tensors_overlap(t, &p->v) && !mha_tensors_overlap(t, out) &&
                  !mha_tensors_overlap(t, p->mask.data ? &p->mask : NULL) &&
                  !mha_tensors_overlap(t, p->attn_weights.data ? &p->attn_weights : NULL),
              MHA_ERR_ALIAS, "%s: overlaps another argument", name);
    return MHA_OK;
}

/* A contiguous copy of x (B,H,N,c) rotated at positions n + o_b. */
static mha_status rope_copy(mha_tensor xv, const mha_attn_problem *p, float base,
                            mha_rope_mode mode, bool queries, float *buf, mha_tensor *dst) {
    const mha_tensor *x = &xv; /* by value: dst may be the very view it came from */
    MHA_TRY(mha_tensor_init(dst, MHA_F32, buf, 4, x->shape));
    MHA_TRY(mha_tensor_convert(dst, x)); /* any float dtype in, float32 out */
    if (!queries)
        return mha_rope_apply(dst, 0, NULL, base, mode);
    for (int64_t b = 0; b < x->shape[0]; b++) { /* per batch: o_b may differ */
        mha_tensor row = *dst;
        row.data = buf + b * dst->stride[0];
        row.shape[0] = 1;
        MHA_TRY(mha_rope_apply(&row, mha_attn_offset(p, b), NULL, base, mode));
    }
    return MHA_OK;
}

mha_status mha_attn_check_modern(mha_attn_problem *p, const mha_sdpa_options *opt,
                                 const mha_tensor *out, float **rope_buf) {
    *rope_buf = NULL;
    MHA_CHECK(isfinite(opt->softcap) && opt->softcap >= 0.0f, MHA_ERR_VALUE,
              "softcap: %g, want a finite value >= 0 (0 = off)", (double)opt->softcap);
    p->softcap = opt->softcap;

    MHA_CHECK(opt->window_left >= -1 && opt->window_right >= -1, MHA_ERR_VALUE,
              "window: left %lld, right %lld; want -1 (unbounded) or >= 0",
              (long long)opt->window_left, (long long)opt->window_right);
    p->window = opt->window_left >= 0 || opt->window_right >= 0;
    p->window_left = opt->window_left;
    p->window_right = opt->window_right;

    if (opt->kv_lengths) {
        MHA_TRY(check_vec(opt->kv_lengths, "kv_lengths", p->B, MHA_I64, out, &p->kv_len));
        p->bottom_right_kv = p->causal == MHA_CAUSAL_BOTTOM_RIGHT;
    }
    if (opt->causal_offsets)
        MHA_TRY(check_vec(opt->causal_offsets, "causal_offsets", p->B, MHA_I64, out,
                          &p->offsets));
    if (p->causal == MHA_CAUSAL_TOP_LEFT && p->offsets.data)
        return mha_error(MHA_ERR_VALUE, "causal_offsets: given with MHA_CAUSAL_TOP_LEFT; use "
                                        "MHA_CAUSAL_OFFSET");
    if (p->causal == MHA_CAUSAL_NONE)
        p->causal_offset = opt->causal_offset; /* the window's alignment */
    /* offsets feed i + o_b and |i + S_b - L - j|: keep them far from overflow */
    const int64_t lim = (int64_t)1 << 60;
    for (int64_t b = 0; b < p->B; b++) {
        int64_t o = mha_attn_offset(p, b), s = mha_attn_kv_len(p, b);
        MHA_CHECK(o > -lim && o < lim && s > -lim && s < lim, MHA_ERR_VALUE,
                  "causal_offsets/kv_lengths: batch %lld has offset %lld, length %lld "
                  "(out of range)", (long long)b, (long long)o, (long long)s);
    }
    MHA_CHECK(p->window_left < lim && p->window_right < lim, MHA_ERR_VALUE,
              "window: sizes out of range");

    if (opt->alibi_slopes) {
        MHA_TRY(check_vec(opt->alibi_slopes, "alibi_slopes", p->Hq, MHA_F32, out, &p->alibi));
        for (int64_t h = 0; h < p->Hq; h++)
            MHA_CHECK(isfinite(((const float *)p->alibi.data)[h * p->alibi.stride[0]]),
                      MHA_ERR_VALUE, "alibi_slopes: slope %lld is not finite", (long long)h);
    }
    if (opt->sinks) {
        MHA_TRY(check_vec(opt->sinks, "sinks", p->Hq, MHA_F32, out, &p->sinks));
        for (int64_t h = 0; h < p->Hq; h++)
            MHA_CHECK(!isnan(((const float *)p->sinks.data)[h * p->sinks.stride[0]]),
                      MHA_ERR_VALUE, "sinks: sink %lld is NaN", (long long)h);
    }
    if (opt->lse) {
        MHA_TRY(check_out(opt->lse, "lse", 3, (int64_t[]){p->B, p->Hq, p->L}, p, out));
        p->lse = *opt->lse;
    }
    if (opt->qk_out) {
        MHA_CHECK(opt->qk_mode >= 0 && opt->qk_mode <= 3, MHA_ERR_VALUE,
                  "qk_mode: %d, want 0..3", opt->qk_mode);
        MHA_TRY(check_out(opt->qk_out, "qk_out", 4, (int64_t[]){p->B, p->Hq, p->L, p->S}, p,
                          out));
        if (opt->lse)
            MHA_CHECK(!mha_tensors_overlap(opt->qk_out, opt->lse), MHA_ERR_ALIAS,
                      "qk_out: overlaps lse");
        p->qk = *opt->qk_out;
        p->qk_mode = opt->qk_mode;
    }
    MHA_CHECK(opt->softmax_precision == MHA_SOFTMAX_F32 ||
                  opt->softmax_precision == MHA_SOFTMAX_F64,
              MHA_ERR_VALUE, "softmax_precision: unknown value %d", (int)opt->softmax_precision);
    p->softmax_f64 = opt->softmax_precision == MHA_SOFTMAX_F64;

    if (opt->onnx_scale) {
        /* ONNX: sqrt of the scale in float64 (the default 1/sqrt(d) unrounded),
         * rounded once to the input type, multiplied into q and k. */
        double s = opt->scale_set ? sqrt((double)opt->scale) : pow((double)p->d, -0.25);
        MHA_CHECK(!opt->scale_set || opt->scale >= 0.0f, MHA_ERR_VALUE,
                  "scale: %g is negative; the ONNX convention takes its square root",
                  (double)opt->scale);
        p->onnx_scale = true;
        p->qk_scale = (float)s;
    }

    MHA_CHECK(opt->rope == MHA_ROPE_NONE || opt->rope == MHA_ROPE_HALF_SPLIT ||
                  opt->rope == MHA_ROPE_INTERLEAVED,
              MHA_ERR_VALUE, "rope: unknown mode %d", (int)opt->rope);
    if (opt->rope != MHA_ROPE_NONE) {
        MHA_CHECK(p->d % 2 == 0, MHA_ERR_SHAPE, "rope: head dim d = %lld is odd", (long long)p->d);
        int64_t nq = p->B * p->Hq * p->L * p->d, nk = p->B * p->Hkv * p->S * p->d;
        float *buf = mha_malloc(sizeof(float) * (size_t)(nq + nk > 0 ? nq + nk : 1));
        MHA_CHECK(buf, MHA_ERR_NOMEM, "rope: cannot allocate %lld floats", (long long)(nq + nk));
        mha_status st = rope_copy(p->q, p, opt->rope_base, opt->rope, true, buf, &p->q);
        if (st == MHA_OK)
            st = rope_copy(p->k, p, opt->rope_base, opt->rope, false, buf + nq, &p->k);
        if (st != MHA_OK) {
            mha_free(buf);
            return st;
        }
        *rope_buf = buf;
    }
    return MHA_OK;
}

bool mha_attn_needs_ref(const mha_attn_problem *p) {
    /* The fused kernels serve every option but float64 softmax, the
     * reference's by design. */
    return p->softmax_f64;
}
