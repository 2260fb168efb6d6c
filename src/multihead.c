/* multihead.c - torch.nn.MultiheadAttention (batch_first=True), exactly.
 *
 * Letter legend: B batch, L query length, S key length, S' = S plus the
 * bias_k/bias_v column and the zero-attention column, E model width,
 * H heads, d = E/H head dim, kdim/vdim the key/value input widths.
 *
 * Steps (as F.multi_head_attention_forward):
 *   1. project q, k, v into one buffer qkv (B, R, 3E), R = max(L, S'):
 *      columns [0,E) q, [E,2E) k, [2E,3E) v; self-attention with packed
 *      weights is a single GEMM with N = 3E;
 *   2. append bias_k/bias_v as key/value row S, then a zero row;
 *   3. split heads by strides (no copies): q_h = qkv[b, i, h*d + c];
 *   4. attention per head (the SDPA kernels) into attn (B, L, E), heads
 *      merged by strides;
 *   5. out = attn W_O^T + b_O.
 */
#include "internal.h"
#include "layers.h"
#include "multihead.h"
#include "kernels/attention_bias.h"

#include <math.h>
#include <string.h>

void mha_multihead_options_init(mha_multihead_options *opt) {
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->average_attn_weights = 1;
    opt->masked_rows = MHA_MASKED_ROWS_ZERO;
    opt->kernel = MHA_KERNEL_AUTO;
}

/* A (rows, cols) float32 weight, contiguous in its last dimension. */
static mha_status check_matrix(const mha_tensor *t, const char *name, int64_t rows, int64_t cols) {
    char sb[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_tensor(t, name, 2, MHA_F32));
    MHA_CHECK(t->shape[0] == rows && t->shape[1] == cols, MHA_ERR_SHAPE,
              "%s: shape %s, want (%lld,%lld)", name, mha_shape_str(t, sb, sizeof sb),
              (long long)rows, (long long)cols);
    MHA_CHECK(cols <= 1 || t->stride[1] == 1, MHA_ERR_SHAPE,
              "%s: must be contiguous in its last dimension", name);
    return MHA_OK;
}

/* A float32 vector of n elements stored contiguously, any leading 1-dims
 * ((E) or (1,1,E) for bias_k). */
static mha_status check_vector(const mha_tensor *t, const char *name, int64_t n) {
    MHA_CHECK(t != NULL, MHA_ERR_NULL, "%s: NULL tensor", name);
    return mha_vector_check(t, name, n); /* activation.c: the one vector check */
}

/* query/key/value: (B,N,width) or unbatched (N,width), rows contiguous. */
mha_status mha_mh_check_sequence(const mha_tensor *t, const char *name, bool batched,
                                 int64_t *B, int64_t *N, int64_t *width) {
    char sb[MHA_SHAPE_BUF];
    MHA_CHECK(t != NULL, MHA_ERR_NULL, "%s: NULL tensor", name);
    MHA_CHECK(t->ndim == (batched ? 3 : 2), MHA_ERR_SHAPE,
              "%s: shape %s, want %s (batched and unbatched inputs cannot be mixed)", name,
              mha_shape_str(t, sb, sizeof sb), batched ? "(B,N,width)" : "(N,width)");
    MHA_TRY(mha_check_tensor(t, name, t->ndim, MHA_F32));
    int o = batched ? 1 : 0;
    *B = batched ? t->shape[0] : 1;
    *N = t->shape[o];
    *width = t->shape[o + 1];
    MHA_CHECK(*width <= 1 || t->stride[o + 1] == 1, MHA_ERR_SHAPE,
              "%s: must be contiguous in its last dimension", name);
    return MHA_OK;
}

/* Row stride and batch stride of a (B,N,width) or (N,width) sequence. */
void mha_mh_sequence_strides(const mha_tensor *t, bool batched, int64_t *ld, int64_t *bs) {
    *ld = t->stride[batched ? 1 : 0];
    *bs = batched ? t->stride[0] : 0;
}

mha_status mha_mh_check_dims(mh_dims *m, const mha_tensor *query, const mha_tensor *key,
                             const mha_tensor *value, const mha_multihead_weights *w,
                             const mha_multihead_options *opt) {
    char s1[MHA_SHAPE_BUF], s2[MHA_SHAPE_BUF];
    memset(m, 0, sizeof *m);
    MHA_TRY(mha_runtime_check());
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "w: NULL weights");
    MHA_CHECK(opt != NULL, MHA_ERR_NULL, "opt: NULL options");
    MHA_CHECK(query != NULL, MHA_ERR_NULL, "query: NULL tensor");
    MHA_TRY(mha_check_causal_top_left(opt->causal, "multihead"));
    m->batched = query->ndim == 3;
    MHA_CHECK(query->ndim == 2 || query->ndim == 3, MHA_ERR_SHAPE,
              "query: shape %s, want (B,L,E) or (L,E)", mha_shape_str(query, s1, sizeof s1));
    int64_t Bk, Bv, Sv;
    MHA_TRY(mha_mh_check_sequence(query, "query", m->batched, &m->B, &m->L, &m->E));
    MHA_TRY(mha_mh_check_sequence(key, "key", m->batched, &Bk, &m->S, &m->kdim));
    MHA_TRY(mha_mh_check_sequence(value, "value", m->batched, &Bv, &Sv, &m->vdim));
    MHA_CHECK(Bk == m->B && Bv == m->B, MHA_ERR_SHAPE,
              "key/value: batch sizes %lld/%lld differ from query's %lld", (long long)Bk,
              (long long)Bv, (long long)m->B);
    MHA_CHECK(Sv == m->S, MHA_ERR_SHAPE, "value: shape %s, but key %s has %lld keys",
              mha_shape_str(value, s1, sizeof s1), mha_shape_str(key, s2, sizeof s2),
              (long long)m->S);
    m->H = opt->num_heads;
    MHA_CHECK(m->H > 0, MHA_ERR_VALUE, "num_heads: %lld, must be positive", (long long)m->H);
    MHA_CHECK(m->E % m->H == 0 && m->E > 0, MHA_ERR_SHAPE,
              "num_heads: %lld does not divide embed_dim %lld", (long long)m->H,
              (long long)m->E);
    m->d = m->E / m->H;
    m->self_attn = mha_tensors_same(query, key) && mha_tensors_same(query, value);

    const int64_t E = m->E;
    m->packed = w->in_proj_weight != NULL;
    if (m->packed) {
        MHA_CHECK(m->kdim == E && m->vdim == E, MHA_ERR_SHAPE,
                  "in_proj_weight: packed weights need kdim == vdim == E, got %lld/%lld/%lld",
                  (long long)m->kdim, (long long)m->vdim, (long long)E);
        MHA_TRY(check_matrix(w->in_proj_weight, "in_proj_weight", 3 * E, E));
    } else {
        MHA_CHECK(w->q_proj_weight && w->k_proj_weight && w->v_proj_weight, MHA_ERR_NULL,
                  "weights: need in_proj_weight or all of q/k/v_proj_weight");
        MHA_TRY(check_matrix(w->q_proj_weight, "q_proj_weight", E, E));
        MHA_TRY(check_matrix(w->k_proj_weight, "k_proj_weight", E, m->kdim));
        MHA_TRY(check_matrix(w->v_proj_weight, "v_proj_weight", E, m->vdim));
    }
    if (w->in_proj_bias)
        MHA_TRY(check_vector(w->in_proj_bias, "in_proj_bias", 3 * E));
    MHA_TRY(check_matrix(w->out_proj_weight, "out_proj_weight", E, E));
    if (w->out_proj_bias)
        MHA_TRY(check_vector(w->out_proj_bias, "out_proj_bias", E));
    MHA_CHECK((w->bias_k == NULL) == (w->bias_v == NULL), MHA_ERR_NULL,
              "bias_k/bias_v: one is given without the other");
    m->bias_kv = w->bias_k != NULL;
    if (m->bias_kv) {
        MHA_TRY(check_vector(w->bias_k, "bias_k", E));
        MHA_TRY(check_vector(w->bias_v, "bias_v", E));
    }
    m->Sx = m->S + (m->bias_kv ? 1 : 0) + (opt->add_zero_attn ? 1 : 0);
    m->R = m->L > m->Sx ? m->L : m->Sx;
    return MHA_OK;
}

/* Checks a PyTorch-MHA mask and gives its (B,H,L,S) broadcast view. */
mha_status mha_mh_mask_view(const mh_dims *m, const mha_tensor *t, bool is_kpm,
                            mha_tensor *view) {
    char sb[MHA_SHAPE_BUF];
    const char *name = is_kpm ? "key_padding_mask" : "attn_mask";
    MHA_CHECK(t->dtype == MHA_F32 || t->dtype == MHA_BOOL, MHA_ERR_DTYPE,
              "%s: must be bool (true = masked) or float32 (added)", name);
    MHA_TRY(mha_check_extent(t, name));
    mha_tensor v = *t;
    v.ndim = 4;
    if (is_kpm) {
        int want = m->batched ? 2 : 1;
        MHA_CHECK(t->ndim == want && t->shape[want - 1] == m->S &&
                      (!m->batched || t->shape[0] == m->B),
                  MHA_ERR_SHAPE, "key_padding_mask: shape %s, want %s (%lld keys)",
                  mha_shape_str(t, sb, sizeof sb), m->batched ? "(B,S)" : "(S)",
                  (long long)m->S);
        v.shape[0] = m->B, v.shape[1] = 1, v.shape[2] = 1, v.shape[3] = m->S;
        v.stride[0] = m->batched ? t->stride[0] : 0;
        v.stride[1] = v.stride[2] = 0;
        v.stride[3] = t->stride[want - 1];
    } else if (t->ndim == 2) {
        MHA_CHECK(t->shape[0] == m->L && t->shape[1] == m->S, MHA_ERR_SHAPE,
                  "attn_mask: 2-D shape %s, want (L,S) = (%lld,%lld)",
                  mha_shape_str(t, sb, sizeof sb), (long long)m->L, (long long)m->S);
        v.shape[0] = 1, v.shape[1] = 1, v.shape[2] = m->L, v.shape[3] = m->S;
        v.stride[0] = v.stride[1] = 0, v.stride[2] = t->stride[0], v.stride[3] = t->stride[1];
    } else if (t->ndim == 3) {
        MHA_CHECK(t->shape[0] == m->B * m->H && t->shape[1] == m->L && t->shape[2] == m->S,
                  MHA_ERR_SHAPE, "attn_mask: 3-D shape %s, want (%s,L,S) = (%lld,%lld,%lld)",
                  mha_shape_str(t, sb, sizeof sb), m->batched ? "B*H" : "H",
                  (long long)(m->B * m->H), (long long)m->L, (long long)m->S);
        v.shape[0] = m->B, v.shape[1] = m->H, v.shape[2] = m->L, v.shape[3] = m->S;
        v.stride[0] = m->H * t->stride[0], v.stride[1] = t->stride[0];
        v.stride[2] = t->stride[1], v.stride[3] = t->stride[2];
    } else {
        return mha_error(MHA_ERR_SHAPE, "attn_mask: shape %s, want 2-D (L,S) or 3-D (%s,L,S)",
                         mha_shape_str(t, sb, sizeof sb), m->batched ? "B*H" : "H");
    }
    MHA_CHECK(v.data != NULL || m->B == 0 || m->L == 0 || m->S == 0, MHA_ERR_NULL,
              "%s: NULL data", name);
    *view = v;
    return MHA_OK;
}

static mha_status check_weights_out(const mh_dims *m, const mha_multihead_options *opt) {
    const mha_tensor *t = opt->attn_weights;
    char sb[MHA_SHAPE_BUF];
    int64_t want[4];
    int n = 0;
    if (m->batched)
        want[n++] = m->B;
    if (!opt->average_attn_weights)
        want[n++] = m->H;
    want[n++] = m->L;
    want[n++] = m->Sx;
    MHA_TRY(mha_check_tensor(t, "attn_weights", n, MHA_F32));
    MHA_TRY(mha_check_writable(t, "attn_weights"));
    for (int i = 0; i < n; i++)
        MHA_CHECK(t->shape[i] == want[i], MHA_ERR_SHAPE,
                  "attn_weights: shape %s, want %s(%s%sL,S') with L=%lld S'=%lld",
                  mha_shape_str(t, sb, sizeof sb),
                  opt->average_attn_weights ? "averaged " : "per-head ",
                  m->batched ? "B," : "", opt->average_attn_weights ? "" : "H,", (long long)m->L,
                  (long long)m->Sx);
    return MHA_OK;
}

/* Combined additive mask (Bm,Hm,L,S') when extra key columns exist: the
 * bias rule (src/kernels/attention_bias.h, causality ADDED to the masks) on
 * the first S columns, 0 on the appended ones. */
mha_status mha_mh_build_padded_mask(const mh_dims *m, const mha_tensor *attn,
                                    const mha_tensor *kpm, int causal, mha_tensor *out) {
    int64_t shape[4] = {kpm || (attn && attn->stride[0]) ? m->B : 1,
                        attn && attn->stride[1] ? m->H : 1, m->L, m->Sx};
    mha_attn_problem p;
    memset(&p, 0, sizeof p);
    p.L = m->L, p.S = m->S;
    if (attn)
        p.mask = *attn, p.mask_polarity = MHA_TRUE_MASKS;
    if (kpm)
        p.kpm = *kpm, p.kpm_polarity = MHA_TRUE_MASKS;
    p.causal = causal ? MHA_CAUSAL_TOP_LEFT : MHA_CAUSAL_NONE;
    MHA_TRY(mha_tensor_create(out, MHA_F32, 4, shape));
    float *dst = out->data;
    for (int64_t b = 0; b < shape[0]; b++)
        for (int64_t h = 0; h < shape[1]; h++)
            for (int64_t i = 0; i < m->L; i++)
                for (int64_t j = 0; j < m->S; j++)
                    dst[((b * shape[1] + h) * m->L + i) * m->Sx + j] =
                        mha_attn_bias_with(&p, b, h, i, j, MHA_CAUSAL_ADDED);
    return MHA_OK;
}

/* Step 1-2: the projections into qkv (B,R,3E) plus the appended rows. */
static void project_qkv(const mh_dims *m, float *qkv, const mha_tensor *query,
                        const mha_tensor *key, const mha_tensor *value,
                        const mha_multihead_weights *w, int add_zero_attn) {
    const int64_t E = m->E, E3 = 3 * E;
    const float *bias = w->in_proj_bias ? w->in_proj_bias->data : NULL;
    int64_t ldq, bsq, ldk, bsk, ldv, bsv;
    mha_mh_sequence_strides(query, m->batched, &ldq, &bsq);
    mha_mh_sequence_strides(key, m->batched, &ldk, &bsk);
    mha_mh_sequence_strides(value, m->batched, &ldv, &bsv);
    const float *wq, *wk, *wv;
    int64_t ldwq, ldwk, ldwv;
    if (m->packed) {
        wq = w->in_proj_weight->data;
        ldwq = ldwk = ldwv = w->in_proj_weight->stride[0];
        wk = wq + E * ldwq;
        wv = wq + 2 * E * ldwq;
    } else {
        wq = w->q_proj_weight->data, ldwq = w->q_proj_weight->stride[0];
        wk = w->k_proj_weight->data, ldwk = w->k_proj_weight->stride[0];
        wv = w->v_proj_weight->data, ldwv = w->v_proj_weight->stride[0];
    }
    /* Every batch in one GEMM of B*L rows when the rows are evenly spaced in
     * the inputs and in qkv (L = S, no appended rows): large GEMMs instead
     * of B small ones (B = 32, L = 128 runs twice as fast). */
    int64_t nb = m->B, rq = m->L, rs = m->S;
    if (m->B > 1 && m->R == m->L && m->R == m->S && bsq == m->L * ldq && bsk == m->S * ldk &&
        bsv == m->S * ldv)
        nb = 1, rq = m->B * m->L, rs = m->B * m->S;
    for (int64_t b = 0; b < nb; b++) {
        float *dst = qkv + b * m->R * E3;
        const float *x = (const float *)query->data + b * bsq;
        if (m->self_attn && m->packed) {
            mha_linear_f32(dst, E3, x, ldq, wq, ldwq, bias, rq, E3, E, 0);
        } else {
            mha_linear_f32(dst, E3, x, ldq, wq, ldwq, bias, rq, E, E, 0);
            mha_linear_f32(dst + E, E3, (const float *)key->data + b * bsk, ldk, wk, ldwk,
                           bias ? bias + E : NULL, rs, E, m->kdim, 0);
            mha_linear_f32(dst + 2 * E, E3, (const float *)value->data + b * bsv, ldv, wv,
                           ldwv, bias ? bias + 2 * E : NULL, rs, E, m->vdim, 0);
        }
        int64_t row = m->S;
        if (m->bias_kv) {
            memcpy(dst + row * E3 + E, w->bias_k->data, sizeof(float) * (size_t)E);
            memcpy(dst + row * E3 + 2 * E, w->bias_v->data, sizeof(float) * (size_t)E);
            row++;
        }
        if (add_zero_attn)
            memset(dst + row * E3 + E, 0, sizeof(float) * (size_t)(2 * E));
    }
}

/* Step 3: p's dimensions, scale and head views q, k, v (B,H,L|S',d) of
 * qkv (B,R,3E) and o (B,H,L,d) of attn (B,L,E), heads split by strides. */
void mha_mh_head_views(const mh_dims *m, float *qkv, float *attn, mha_attn_problem *p) {
    const int64_t E = m->E, E3 = 3 * E;
    int64_t qshape[4] = {m->B, m->H, m->L, m->d}, kshape[4] = {m->B, m->H, m->Sx, m->d};
    int64_t qkv_strides[4] = {m->R * E3, m->d, E3, 1};
    p->B = m->B, p->Hq = m->H, p->Hkv = m->H, p->L = m->L, p->S = m->Sx, p->d = m->d;
    p->dv = m->d;
    p->scale = (float)(1.0 / sqrt((double)m->d));
    mha_tensor *views[] = {&p->q, &p->k, &p->v, &p->o};
    float *bases[] = {qkv, qkv + E, qkv + 2 * E, attn};
    for (int t = 0; t < 4; t++) {
        views[t]->data = bases[t];
        views[t]->dtype = MHA_F32;
        views[t]->ndim = 4;
        memcpy(views[t]->shape, t == 0 || t == 3 ? qshape : kshape, sizeof qshape);
        memcpy(views[t]->stride, qkv_strides, sizeof qkv_strides);
    }
    p->o.stride[0] = m->L * E, p->o.stride[2] = E;
}

/* Mean over heads: avg (B,L,S') = sum_h per_head (B,H,L,S') / H. */
static void average_heads(const mh_dims *m, const float *per_head, mha_tensor *avg) {
    float *dst = avg->data;
    int o = m->batched ? 1 : 0;
    for (int64_t b = 0; b < m->B; b++)
        for (int64_t i = 0; i < m->L; i++)
            for (int64_t j = 0; j < m->Sx; j++) {
                float sum = 0.0f;
                for (int64_t h = 0; h < m->H; h++)
                    sum += per_head[((b * m->H + h) * m->L + i) * m->Sx + j];
                int64_t off = (m->batched ? b * avg->stride[0] : 0) + i * avg->stride[o] +
                              j * avg->stride[o + 1];
                dst[off] = sum / (float)m->H;
            }
}

/* Floats of kernel scratch after the buffers, 64-byte aligned. */
static int64_t scratch_floats(int64_t B, int64_t L, int64_t Sx, int64_t E, int64_t H) {
    int64_t d = H > 0 && E % H == 0 && E > 0 ? E / H : 1;
    size_t bytes = mha_attn_scratch_bound(B, H, H, L, Sx, d, d);
    return 16 + (int64_t)((bytes + 63) / 64 * 16);
}

mha_status mha_multihead_workspace_floats(int64_t B, int64_t L, int64_t Sx, int64_t E, int64_t H,
                                          int64_t *floats) {
    int64_t R = L > Sx ? L : Sx, n_qkv, n_attn;
    MHA_CHECK(mha_product((int64_t[]){B, R, 3, E}, 4, &n_qkv) &&
                  mha_product((int64_t[]){B, L, E}, 3, &n_attn) &&
                  !__builtin_add_overflow(n_qkv, n_attn, floats) &&
                  !__builtin_add_overflow(*floats, scratch_floats(B, L, Sx, E, H), floats),
              MHA_ERR_OVERFLOW, "multihead: workspace size overflows");
    return MHA_OK;
}

mha_status mha_multihead_forward(mha_tensor *out, const mha_tensor *query, const mha_tensor *key,
                                 const mha_tensor *value, const mha_multihead_weights *w,
                                 const mha_multihead_options *opt) {
    MHA_OPTIONS_DEFAULT(mha_multihead_options, opt);
    return mha_multihead_forward_ws(out, query, key, value, w, opt, NULL, 0, NULL);
}

mha_status mha_multihead_forward_ws(mha_tensor *out, const mha_tensor *query,
                                    const mha_tensor *key, const mha_tensor *value,
                                    const mha_multihead_weights *w,
                                    const mha_multihead_options *opt, float *workspace,
                                    int64_t workspace_floats, float *lse) {
    mh_dims m;
    memset(&m, 0, sizeof m);
    MHA_TRY(mha_mh_check_dims(&m, query, key, value, w, opt));

    int64_t ob, ol, oe;
    MHA_TRY(mha_mh_check_sequence(out, "out", m.batched, &ob, &ol, &oe));
    MHA_CHECK(ob == m.B && ol == m.L && oe == m.E, MHA_ERR_SHAPE,
              "out: shape does not match query's (B,L,E) = (%lld,%lld,%lld)", (long long)m.B,
              (long long)m.L, (long long)m.E);
    MHA_TRY(mha_check_writable(out, "out"));
    const mha_tensor *inputs[] = {query, key, value, w->in_proj_weight, w->q_proj_weight,
                                  w->k_proj_weight, w->v_proj_weight, w->in_proj_bias,
                                  w->out_proj_weight, w->out_proj_bias, w->bias_k, w->bias_v,
                                  opt->attn_mask, opt->key_padding_mask};
    for (size_t i = 0; i < sizeof inputs / sizeof *inputs; i++) {
        MHA_CHECK(!mha_tensors_overlap(out, inputs[i]), MHA_ERR_ALIAS, "out: overlaps an input");
        if (opt->attn_weights)
            MHA_CHECK(!mha_tensors_overlap(opt->attn_weights, inputs[i]), MHA_ERR_ALIAS,
                      "attn_weights: overlaps an input");
    }
    MHA_CHECK(!opt->attn_weights || !mha_tensors_overlap(opt->attn_weights, out), MHA_ERR_ALIAS,
              "attn_weights: overlaps out");

    mha_tensor attn_view = {0}, kpm_view = {0};
    if (opt->attn_mask)
        MHA_TRY(mha_mh_mask_view(&m, opt->attn_mask, false, &attn_view));
    if (opt->key_padding_mask)
        MHA_TRY(mha_mh_mask_view(&m, opt->key_padding_mask, true, &kpm_view));
    if (opt->attn_weights)
        MHA_TRY(check_weights_out(&m, opt));

    mha_attn_problem p;
    memset(&p, 0, sizeof p);
    MHA_TRY(mha_attn_check_common(&p, opt->masked_rows, opt->training, opt->dropout_p, opt->seed));
    if (m.B == 0 || m.L == 0)
        return MHA_OK;

    /* workspace: qkv (B,R,3E) | attn (B,L,E) | per-head weights (B,H,L,S') */
    const int64_t E = m.E, E3 = 3 * E;
    int64_t n_qkv, n_attn, n_w = 0;
    MHA_CHECK(mha_product((int64_t[]){m.B, m.R, E3}, 3, &n_qkv) &&
                  mha_product((int64_t[]){m.B, m.L, E}, 3, &n_attn) &&
                  (!opt->attn_weights || !opt->average_attn_weights ||
                   mha_product((int64_t[]){m.B, m.H, m.L, m.Sx}, 4, &n_w)),
              MHA_ERR_OVERFLOW, "multihead: workspace size overflows");
    size_t total;
    MHA_CHECK(!__builtin_add_overflow((size_t)n_qkv, (size_t)n_attn, &total) &&
                  !__builtin_add_overflow(total, (size_t)n_w, &total) &&
                  !mha_size_mul_overflows(total, sizeof(float), &total),
              MHA_ERR_OVERFLOW, "multihead: workspace size overflows");
    /* then the attention kernel's scratch: planned by the caller's workspace,
     * or part of the one allocation made here */
    const size_t used = total / sizeof(float);
    size_t ws_floats = workspace ? (size_t)workspace_floats : used;
    if (!workspace) {
        int64_t extra = scratch_floats(m.B, m.L, m.Sx, m.E, m.H);
        MHA_CHECK(!__builtin_add_overflow(used, (size_t)extra, &ws_floats) &&
                      !mha_size_mul_overflows(ws_floats, sizeof(float), &total),
                  MHA_ERR_OVERFLOW, "multihead: workspace size overflows");
    }
    float *ws, *owned;
    MHA_TRY(mha_workspace_get(workspace, (size_t)workspace_floats * sizeof(float), total,
                              "multihead", &ws, &owned));
    float *qkv = ws, *attn = ws + n_qkv, *per_head = n_w ? attn + n_attn : NULL;
    /* the kernel's scratch starts on a 64-byte line (its tiles need it),
     * whatever the caller's workspace alignment: float-aligned suffices */
    const uintptr_t line = ((uintptr_t)(ws + used) + 63) / 64 * 64;
    const size_t scratch_at = (size_t)((float *)line - ws);
    if (ws_floats > scratch_at) {
        p.scratch = ws + scratch_at;
        p.scratch_bytes = (ws_floats - scratch_at) * sizeof(float);
    }
    mha_tensor padded = {0};
    mha_status st = MHA_OK;

    project_qkv(&m, qkv, query, key, value, w, opt->add_zero_attn);

    /* step 3: head views of qkv and attn */
    mha_mh_head_views(&m, qkv, attn, &p);

    /* masks */
    if (m.Sx != m.S && (opt->attn_mask || opt->key_padding_mask || opt->causal)) {
        st = mha_mh_build_padded_mask(&m, opt->attn_mask ? &attn_view : NULL,
                               opt->key_padding_mask ? &kpm_view : NULL, opt->causal, &padded);
        if (st != MHA_OK)
            goto done;
        mha_tensor_init(&p.mask, MHA_F32, padded.data, 4, padded.shape);
        for (int i = 0; i < 2; i++)
            if (padded.shape[i] == 1)
                p.mask.stride[i] = 0;
        p.mask.shape[0] = m.B, p.mask.shape[1] = m.H;
    } else {
        if (opt->attn_mask)
            p.mask = attn_view, p.mask_polarity = MHA_TRUE_MASKS;
        if (opt->key_padding_mask)
            p.kpm = kpm_view, p.kpm_polarity = MHA_TRUE_MASKS;
        if (opt->causal)
            p.causal = MHA_CAUSAL_TOP_LEFT, p.causal_offset = 0;
    }
    for (mha_tensor *v = &p.mask; v; v = v == &p.mask ? &p.kpm : NULL)
        if (v->data)
            for (int i = 0; i < 4; i++)
                if (v->shape[i] == 1)
                    v->shape[i] = i == 0 ? m.B : i == 1 ? m.H : v->shape[i];

    /* weights: per head straight into the caller's tensor, or via a buffer */
    if (opt->attn_weights && !opt->average_attn_weights) {
        const mha_tensor *t = opt->attn_weights;
        int o = m.batched ? 1 : 0;
        p.attn_weights = *t;
        p.attn_weights.ndim = 4;
        p.attn_weights.shape[0] = m.B, p.attn_weights.stride[0] = m.batched ? t->stride[0] : 0;
        for (int i = 0; i < 3; i++)
            p.attn_weights.shape[i + 1] = t->shape[i + o], p.attn_weights.stride[i + 1] = t->stride[i + o];
    } else if (opt->attn_weights) {
        mha_tensor_init(&p.attn_weights, MHA_F32, per_head, 4, (int64_t[]){m.B, m.H, m.L, m.Sx});
    }

    if (lse) /* (B,H,L) log-sum-exp rows, for the backward */
        mha_tensor_init(&p.lse, MHA_F32, lse, 3, (int64_t[]){m.B, m.H, m.L});
    st = mha_attn_run(&p, opt->kernel);
    if (st != MHA_OK)
        goto done;
    if (per_head)
        average_heads(&m, per_head, opt->attn_weights);

    /* step 5: output projection */
    int64_t ldo, bso;
    mha_mh_sequence_strides(out, m.batched, &ldo, &bso);
    const bool one_gemm = bso == m.L * ldo; /* evenly spaced batches: B*L rows at once */
    for (int64_t b = 0; b < (one_gemm ? 1 : m.B); b++)
        mha_linear_f32((float *)out->data + b * bso, ldo, attn + b * m.L * E, E,
                       w->out_proj_weight->data, w->out_proj_weight->stride[0],
                       w->out_proj_bias ? w->out_proj_bias->data : NULL,
                       one_gemm ? m.B * m.L : m.L, E, E, 0);
done:
    mha_tensor_free(&padded);
    mha_free(owned);
    return st;
}

int64_t mha_multihead_param_count(int64_t E, int64_t kdim, int64_t vdim, int bias,
                                  int add_bias_kv) {
    int64_t n = E * E + E * kdim + E * vdim; /* W_Q, W_K, W_V */
    n += E * E;                               /* W_O */
    if (bias)
        n += 3 * E + E;                       /* in_proj_bias, out_proj.bias */
    if (add_bias_kv)
        n += 2 * E;                           /* bias_k, bias_v */
    return n;
}
