/* multihead_backward.c - nn.MultiheadAttention backward and the forward
 * that saves what it needs.
 *
 * Letter legend: B batch, L query length, S key length, S' = S plus the
 * bias_k/bias_v column and the zero-attention column, R = max(L, S'),
 * E model width, H heads, d = E/H, kdim/vdim the key/value input widths.
 *
 * Saved buffer (mha_multihead_saved_size bytes):
 *   header (16 floats: magic and the dimensions, checked by the backward)
 *   qkv  (B,R,3E)  the projections, laid out as multihead.c's workspace
 *                  (so mha_multihead_forward_ws writes them in place)
 *   attn (B,L,E)   the merged heads, input of out_proj
 *   lse  (B,H,L)   per-head log-sum-exp of the attention rows
 *
 * Backward, for out = attn W_O^T + b_O, attn = SDPA(q, k, v) per head,
 * q = query W_q^T + b_q (k, v likewise, plus appended rows):
 *   dW_O += dout^T attn, db_O += sum dout, dattn = dout W_O;
 *   dq, dk, dv (into dqkv (B,R,3E)) by the SDPA backward per head;
 *   dbias_k/dbias_v += sum_b of the appended row's dk/dv (the zero row's
 *   gradient is dropped);
 *   dW_q += dq^T query, db_q += sum dq, dquery += dq W_q (k, v likewise;
 *   self-attention adds all three into dquery).
 * The products go through mha_gemm_f32_ab (linear.c: OpenBLAS, mha's AVX2
 * kernel or the portable loop, as the forward's projections), which gives
 * each output element to one task in a fixed order: bit-identical for any
 * thread count.
 *
 * The problem setup (dimensions, PyTorch-convention masks, the padded mask
 * when extra key columns exist) uses multihead.c's helpers (multihead.h).
 */
#include "internal.h"
#include "multihead.h"
#include "kernels/attention_bwd.h"

#include <math.h>
#include <string.h>

#define SAVED_MAGIC 0x3176617364656d68ull /* "hmedsav1" */
#define HEADER_FLOATS 16

typedef struct saved_header {
    uint64_t magic;
    int64_t B, L, S, E, H, Sx;
} saved_header;

/* ---- the attention problem (dimensions and masks: multihead.h) -------------- */

/* The forward's attention problem over the saved qkv/attn; *padded owns a
 * combined mask when extra key columns meet a mask (free it). */
static mha_status build_problem(const mh_dims *m, const mha_multihead_options *opt, float *qkv,
                                float *attn, mha_attn_problem *p, mha_tensor *padded) {
    memset(p, 0, sizeof *p);
    memset(padded, 0, sizeof *padded);
    MHA_TRY(mha_attn_check_common(p, opt->masked_rows, opt->training, opt->dropout_p, opt->seed));
    mha_tensor attn_view = {0}, kpm_view = {0};
    if (opt->attn_mask)
        MHA_TRY(mha_mh_mask_view(m, opt->attn_mask, false, &attn_view));
    if (opt->key_padding_mask)
        MHA_TRY(mha_mh_mask_view(m, opt->key_padding_mask, true, &kpm_view));
    mha_mh_head_views(m, qkv, attn, p);
    if (m->Sx != m->S && (opt->attn_mask || opt->key_padding_mask || opt->causal)) {
        const mha_tensor *am = opt->attn_mask ? &attn_view : NULL;
        const mha_tensor *km = opt->key_padding_mask ? &kpm_view : NULL;
        MHA_TRY(mha_mh_build_padded_mask(m, am, km, opt->causal, padded));
        p->mask = *padded;
        for (int i = 0; i < 2; i++)
            if (padded->shape[i] == 1)
                p->mask.stride[i] = 0;
        p->mask.shape[0] = m->B, p->mask.shape[1] = m->H;
    } else {
        if (opt->attn_mask)
            p->mask = attn_view, p->mask_polarity = MHA_TRUE_MASKS;
        if (opt->key_padding_mask)
            p->kpm = kpm_view, p->kpm_polarity = MHA_TRUE_MASKS;
        if (opt->causal)
            p->causal = MHA_CAUSAL_TOP_LEFT, p->causal_offset = 0;
    }
    for (mha_tensor *v = &p->mask; v; v = v == &p->mask ? &p->kpm : NULL)
        if (v->data)
            for (int i = 0; i < 2; i++)
                if (v->shape[i] == 1)
                    v->shape[i] = i == 0 ? m->B : m->H;
    return MHA_OK;
}

/* ---- sizes ---------------------------------------------------------------------- */

static mha_status saved_floats(int64_t B, int64_t L, int64_t S, int64_t E, int64_t H, int bias_kv,
                               int add_zero_attn, int64_t *n_qkv, int64_t *n_attn,
                               int64_t *n_lse) {
    MHA_CHECK(B >= 0 && L >= 0 && S >= 0 && E >= 0 && H > 0, MHA_ERR_VALUE,
              "saved: negative size or H <= 0 (B %lld L %lld S %lld E %lld H %lld)",
              (long long)B, (long long)L, (long long)S, (long long)E, (long long)H);
    int64_t Sx = S + (bias_kv ? 1 : 0) + (add_zero_attn ? 1 : 0), R = L > Sx ? L : Sx;
    MHA_CHECK(mha_product((int64_t[]){B, R, 3, E}, 4, n_qkv) &&
                  mha_product((int64_t[]){B, L, E}, 3, n_attn) &&
                  mha_product((int64_t[]){B, H, L}, 3, n_lse),
              MHA_ERR_OVERFLOW, "saved: size overflows");
    return MHA_OK;
}

mha_status mha_multihead_saved_size(int64_t B, int64_t L, int64_t S, int64_t E, int64_t H,
                                    int bias_kv, int add_zero_attn, size_t *bytes) {
    MHA_CHECK(bytes != NULL, MHA_ERR_NULL, "bytes: NULL");
    int64_t a, b, c, total;
    MHA_TRY(saved_floats(B, L, S, E, H, bias_kv, add_zero_attn, &a, &b, &c));
    MHA_CHECK(!__builtin_add_overflow(a, b, &total) && !__builtin_add_overflow(total, c, &total) &&
                  !__builtin_add_overflow(total, (int64_t)HEADER_FLOATS, &total) &&
                  !mha_size_mul_overflows((size_t)total, sizeof(float), bytes),
              MHA_ERR_OVERFLOW, "saved: size overflows");
    return MHA_OK;
}

mha_status mha_multihead_backward_workspace_size(int64_t B, int64_t L, int64_t S, int64_t E,
                                                 int64_t H, int bias_kv, int add_zero_attn,
                                                 size_t *bytes) {
    MHA_CHECK(bytes != NULL, MHA_ERR_NULL, "bytes: NULL");
    int64_t a, b, c, total;
    MHA_TRY(saved_floats(B, L, S, E, H, bias_kv, add_zero_attn, &a, &b, &c));
    MHA_CHECK(!__builtin_add_overflow(a, b, &total) &&
                  !mha_size_mul_overflows((size_t)total, sizeof(float), bytes),
              MHA_ERR_OVERFLOW, "workspace: size overflows");
    return MHA_OK;
}

/* ---- forward that saves ------------------------------------------------------ */

mha_status mha_multihead_forward_train(mha_tensor *out, void *saved, size_t saved_bytes,
                                       const mha_tensor *query, const mha_tensor *key,
                                       const mha_tensor *value, const mha_multihead_weights *w,
                                       const mha_multihead_options *opt) {
    MHA_OPTIONS_DEFAULT(mha_multihead_options, opt);
    mh_dims m;
    MHA_TRY(mha_mh_check_dims(&m, query, key, value, w, opt));
    MHA_CHECK(saved != NULL, MHA_ERR_NULL, "saved: NULL buffer");
    MHA_CHECK(((uintptr_t)saved % sizeof(float)) == 0, MHA_ERR_VALUE,
              "saved: buffer is not float-aligned");
    MHA_CHECK(!opt->attn_weights || !opt->average_attn_weights, MHA_ERR_UNSUPPORTED,
              "attn_weights: averaged attention weights are not served with a saved state "
              "(ask for per-head weights, or call mha_multihead_forward)");
    size_t need;
    int64_t n_qkv, n_attn, n_lse;
    MHA_TRY(mha_multihead_saved_size(m.B, m.L, m.S, m.E, m.H, m.bias_kv, opt->add_zero_attn,
                                     &need));
    MHA_TRY(saved_floats(m.B, m.L, m.S, m.E, m.H, m.bias_kv, opt->add_zero_attn, &n_qkv, &n_attn,
                         &n_lse));
    MHA_CHECK(saved_bytes >= need, MHA_ERR_VALUE, "saved: %zu bytes, need %zu", saved_bytes,
              need);
    float *base = saved;
    float *qkv = base + HEADER_FLOATS, *attn = qkv + n_qkv, *lse = attn + n_attn;
    saved_header hdr = {SAVED_MAGIC, m.B, m.L, m.S, m.E, m.H, m.Sx};
    memcpy(base, &hdr, sizeof hdr);
    /* the forward writes qkv and attn in place and each row's log-sum-exp */
    return mha_multihead_forward_ws(out, query, key, value, w, opt, qkv, n_qkv + n_attn, lse);
}

/* ---- sums over the batch ------------------------------------------------------ */

/* db (N) += sum_b sum_i A_b[i][0..N). */
static void bias_grad(float *db, int64_t N, const float *A, int64_t lda, int64_t bsa,
                      int64_t batches, int64_t rows) {
    for (int64_t b = 0; b < batches; b++)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t n = 0; n < N; n++)
                db[n] += A[b * bsa + i * lda + n];
}

/* ---- backward ---------------------------------------------------------------- */

static mha_status check_grad(const mha_tensor *g, const mha_tensor *like, const char *name) {
    char s1[MHA_SHAPE_BUF], s2[MHA_SHAPE_BUF];
    MHA_CHECK(like != NULL, MHA_ERR_VALUE, "%s: gradient given for an absent parameter", name);
    MHA_TRY(mha_check_tensor(g, name, like->ndim, MHA_F32));
    for (int i = 0; i < like->ndim; i++)
        MHA_CHECK(g->shape[i] == like->shape[i], MHA_ERR_SHAPE, "%s: shape %s, want %s", name,
                  mha_shape_str(g, s1, sizeof s1), mha_shape_str(like, s2, sizeof s2));
    MHA_CHECK(g->ndim == 0 || g->shape[g->ndim - 1] <= 1 || g->stride[g->ndim - 1] == 1,
              MHA_ERR_SHAPE, "%s: must be contiguous in its last dimension", name);
    MHA_TRY(mha_check_writable(g, name));
    return MHA_OK;
}

mha_status mha_multihead_backward(mha_tensor *dquery, mha_tensor *dkey, mha_tensor *dvalue,
                                  const mha_multihead_grads *dw, const mha_tensor *dout,
                                  const void *saved, size_t saved_bytes, const mha_tensor *query,
                                  const mha_tensor *key, const mha_tensor *value,
                                  const mha_multihead_weights *w, const mha_multihead_options *opt,
                                  void *workspace, size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_multihead_options, opt);
    mh_dims m;
    MHA_TRY(mha_mh_check_dims(&m, query, key, value, w, opt));
    const int64_t E = m.E, E3 = 3 * E;
    MHA_CHECK(saved != NULL, MHA_ERR_NULL, "saved: NULL buffer");
    size_t need;
    int64_t n_qkv, n_attn, n_lse;
    MHA_TRY(mha_multihead_saved_size(m.B, m.L, m.S, E, m.H, m.bias_kv, opt->add_zero_attn, &need));
    MHA_TRY(saved_floats(m.B, m.L, m.S, E, m.H, m.bias_kv, opt->add_zero_attn, &n_qkv, &n_attn,
                         &n_lse));
    MHA_CHECK(saved_bytes >= need, MHA_ERR_VALUE, "saved: %zu bytes, need %zu", saved_bytes, need);
    saved_header hdr;
    memcpy(&hdr, saved, sizeof hdr);
    MHA_CHECK(hdr.magic == SAVED_MAGIC && hdr.B == m.B && hdr.L == m.L && hdr.S == m.S &&
                  hdr.E == E && hdr.H == m.H && hdr.Sx == m.Sx,
              MHA_ERR_VALUE,
              "saved: not filled by mha_multihead_forward_train for these inputs "
              "(saved B,L,S,E,H = %lld,%lld,%lld,%lld,%lld)",
              (long long)hdr.B, (long long)hdr.L, (long long)hdr.S, (long long)hdr.E,
              (long long)hdr.H);
    int64_t ob, ol, oe;
    MHA_TRY(mha_mh_check_sequence(dout, "dout", m.batched, &ob, &ol, &oe));
    MHA_CHECK(ob == m.B && ol == m.L && oe == E, MHA_ERR_SHAPE,
              "dout: shape does not match the output (B,L,E) = (%lld,%lld,%lld)", (long long)m.B,
              (long long)m.L, (long long)E);

    /* gradients of the inputs */
    if (m.self_attn) {
        MHA_CHECK((!dkey || (dquery && mha_tensors_same(dkey, dquery))) &&
                      (!dvalue || (dquery && mha_tensors_same(dvalue, dquery))),
                  MHA_ERR_VALUE,
                  "dkey/dvalue: self-attention sends every path into dquery; pass NULL");
        dkey = dvalue = NULL;
    }
    int64_t b_, n_, w_;
    if (dquery) {
        MHA_TRY(mha_mh_check_sequence(dquery, "dquery", m.batched, &b_, &n_, &w_));
        MHA_CHECK(b_ == m.B && n_ == m.L && w_ == E, MHA_ERR_SHAPE, "dquery: shape != query's");
        MHA_TRY(mha_check_writable(dquery, "dquery"));
    }
    if (dkey) {
        MHA_TRY(mha_mh_check_sequence(dkey, "dkey", m.batched, &b_, &n_, &w_));
        MHA_CHECK(b_ == m.B && n_ == m.S && w_ == m.kdim, MHA_ERR_SHAPE, "dkey: shape != key's");
        MHA_TRY(mha_check_writable(dkey, "dkey"));
    }
    if (dvalue) {
        MHA_TRY(mha_mh_check_sequence(dvalue, "dvalue", m.batched, &b_, &n_, &w_));
        MHA_CHECK(b_ == m.B && n_ == m.S && w_ == m.vdim, MHA_ERR_SHAPE,
                  "dvalue: shape != value's");
        MHA_TRY(mha_check_writable(dvalue, "dvalue"));
    }
    mha_multihead_grads none;
    memset(&none, 0, sizeof none);
    if (!dw)
        dw = &none;
    if (dw->in_proj_weight)
        MHA_TRY(check_grad(dw->in_proj_weight, w->in_proj_weight, "in_proj_weight"));
    if (dw->q_proj_weight)
        MHA_TRY(check_grad(dw->q_proj_weight, w->q_proj_weight, "q_proj_weight"));
    if (dw->k_proj_weight)
        MHA_TRY(check_grad(dw->k_proj_weight, w->k_proj_weight, "k_proj_weight"));
    if (dw->v_proj_weight)
        MHA_TRY(check_grad(dw->v_proj_weight, w->v_proj_weight, "v_proj_weight"));
    if (dw->in_proj_bias)
        MHA_TRY(check_grad(dw->in_proj_bias, w->in_proj_bias, "in_proj_bias"));
    if (dw->out_proj_weight)
        MHA_TRY(check_grad(dw->out_proj_weight, w->out_proj_weight, "out_proj_weight"));
    if (dw->out_proj_bias)
        MHA_TRY(check_grad(dw->out_proj_bias, w->out_proj_bias, "out_proj_bias"));
    if (dw->bias_k)
        MHA_TRY(check_grad(dw->bias_k, w->bias_k, "bias_k"));
    if (dw->bias_v)
        MHA_TRY(check_grad(dw->bias_v, w->bias_v, "bias_v"));
    /* outputs must not overlap what the pass reads */
    mha_tensor *outs[] = {dquery, dkey, dvalue, dw->in_proj_weight, dw->q_proj_weight,
                          dw->k_proj_weight, dw->v_proj_weight, dw->in_proj_bias,
                          dw->out_proj_weight, dw->out_proj_bias, dw->bias_k, dw->bias_v};
    const mha_tensor *ins[] = {query, key, value, dout, w->in_proj_weight, w->q_proj_weight,
                               w->k_proj_weight, w->v_proj_weight, w->in_proj_bias,
                               w->out_proj_weight, w->out_proj_bias, w->bias_k, w->bias_v,
                               opt->attn_mask, opt->key_padding_mask};
    for (size_t a = 0; a < sizeof outs / sizeof *outs; a++) {
        if (!outs[a])
            continue;
        for (size_t b = 0; b < sizeof ins / sizeof *ins; b++)
            MHA_CHECK(!mha_tensors_overlap(outs[a], ins[b]), MHA_ERR_ALIAS,
                      "gradient %zu: overlaps an input", a);
        for (size_t b = 0; b < a; b++) /* dkey == dvalue is the one allowed sharing */
            MHA_CHECK(!outs[b] || !mha_tensors_overlap(outs[a], outs[b]) ||
                          (a == 2 && b == 1 && mha_tensors_same(dkey, dvalue)),
                      MHA_ERR_ALIAS, "gradient %zu: overlaps gradient %zu", a, b);
    }
    if (m.B == 0 || m.L == 0)
        return MHA_OK;

    /* workspace: dqkv (B,R,3E) | dattn (B,L,E) */
    size_t ws_need;
    MHA_TRY(mha_multihead_backward_workspace_size(m.B, m.L, m.S, E, m.H, m.bias_kv,
                                                  opt->add_zero_attn, &ws_need));
    float *ws, *owned;
    MHA_TRY(mha_workspace_get(workspace, workspace_bytes, ws_need, "multihead backward", &ws,
                              &owned));
    float *dqkv = ws, *dattn = ws + n_qkv;
    memset(ws, 0, ws_need);

    float *qkv = (float *)saved + HEADER_FLOATS, *attn = qkv + n_qkv, *lse = attn + n_attn;
    int64_t ldo, bso;
    mha_mh_sequence_strides(dout, m.batched, &ldo, &bso);
    const float *dO = dout->data;
    const float *WO = w->out_proj_weight->data;
    const int64_t ldWO = w->out_proj_weight->stride[0];

    /* out projection */
    /* dW_O (E,E) += sum_b dout_b^T (L,E) attn_b (L,E); dattn_b (L,E) = dout_b W_O (E,E) */
    for (int64_t b = 0; b < m.B; b++) {
        if (dw->out_proj_weight)
            mha_gemm_f32_ab(1, dw->out_proj_weight->data, dw->out_proj_weight->stride[0],
                            dO + b * bso, ldo, attn + b * m.L * E, E, E, E, m.L);
        mha_gemm_f32_ab(0, dattn + b * m.L * E, E, dO + b * bso, ldo, WO, ldWO, m.L, E, E);
    }
    if (dw->out_proj_bias)
        bias_grad(dw->out_proj_bias->data, E, dO, ldo, bso, m.B, m.L);

    /* attention */
    mha_attn_problem p;
    mha_tensor padded;
    mha_status st = build_problem(&m, opt, qkv, attn, &p, &padded);
    if (st != MHA_OK)
        goto done;
    mha_attn_grad g;
    memset(&g, 0, sizeof g);
    g.dq = p.q, g.dk = p.k, g.dv = p.v;
    g.dq.data = dqkv, g.dk.data = dqkv + E, g.dv.data = dqkv + 2 * E;
    g.out = p.o;
    g.dout = p.o, g.dout.data = dattn;
    mha_tensor_init(&g.lse, MHA_F32, lse, 3, (int64_t[]){m.B, m.H, m.L});
    st = mha_attn_bwd_run(&p, &g, opt->kernel);
    mha_tensor_free(&padded);
    if (st != MHA_OK)
        goto done;

    /* appended key rows: bias_k / bias_v (the zero row's gradient is dropped) */
    if (m.bias_kv)
        for (int64_t b = 0; b < m.B; b++) {
            const float *row = dqkv + b * m.R * E3 + m.S * E3;
            if (dw->bias_k)
                for (int64_t e = 0; e < E; e++)
                    ((float *)dw->bias_k->data)[e] += row[E + e];
            if (dw->bias_v)
                for (int64_t e = 0; e < E; e++)
                    ((float *)dw->bias_v->data)[e] += row[2 * E + e];
        }

    /* input projections: part t = 0 q, 1 k, 2 v */
    for (int t = 0; t < 3; t++) {
        const mha_tensor *x = t == 0 ? query : t == 1 ? key : value;
        mha_tensor *dx = t == 0 ? dquery : t == 1 ? dkey : dvalue;
        if (m.self_attn)
            dx = dquery;
        const int64_t rows = t == 0 ? m.L : m.S, width = t == 0 ? E : t == 1 ? m.kdim : m.vdim;
        const float *W;
        int64_t ldW;
        float *dW = NULL;
        int64_t lddW = 0;
        if (m.packed) {
            ldW = w->in_proj_weight->stride[0];
            W = (const float *)w->in_proj_weight->data + t * E * ldW;
            if (dw->in_proj_weight) {
                lddW = dw->in_proj_weight->stride[0];
                dW = (float *)dw->in_proj_weight->data + t * E * lddW;
            }
        } else {
            const mha_tensor *wt = t == 0 ? w->q_proj_weight : t == 1 ? w->k_proj_weight
                                                                      : w->v_proj_weight;
            mha_tensor *gt = t == 0 ? dw->q_proj_weight : t == 1 ? dw->k_proj_weight
                                                                 : dw->v_proj_weight;
            W = wt->data, ldW = wt->stride[0];
            if (gt)
                dW = gt->data, lddW = gt->stride[0];
        }
        const float *dpart = dqkv + t * E; /* rows ld 3E, batch stride R*3E */
        int64_t ldx, bsx;
        mha_mh_sequence_strides(x, m.batched, &ldx, &bsx);
        /* dW (E,width) += sum_b dpart_b^T (rows,E) x_b (rows,width) */
        if (dW)
            for (int64_t b = 0; b < m.B; b++)
                mha_gemm_f32_ab(1, dW, lddW, dpart + b * m.R * E3, E3,
                                (const float *)x->data + b * bsx, ldx, E, width, rows);
        if (dw->in_proj_bias)
            bias_grad((float *)dw->in_proj_bias->data + t * E, E, dpart, E3, m.R * E3, m.B, rows);
        /* dx_b (rows,width) += dpart_b (rows,E) W (E,width) */
        if (dx) {
            int64_t lddx, bsdx;
            mha_mh_sequence_strides(dx, m.batched, &lddx, &bsdx);
            for (int64_t b = 0; b < m.B; b++)
                mha_gemm_f32_ab(0, (float *)dx->data + b * bsdx, lddx, dpart + b * m.R * E3, E3,
                                W, ldW, rows, width, E);
        }
    }
done:
    mha_free(owned);
    return st;
}
