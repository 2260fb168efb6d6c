/* transformer_train.c - the training half of the Transformer layers
 * (transformer.c has the inference forward and the shared steps): each
 * layer's and stack's forward_train, which saves the residual stream, and
 * its backward.  Both walk the layer's blocks (mha_layer_parts, layers.h),
 * the forward in order and the backward in reverse, so the encoder and the
 * decoder, post-norm and pre-norm, are one loop each.
 *
 * Letter legend: B batch, L target (query) length, S memory length, E model
 * width, F MLP width, N = B*L rows, H heads.
 *
 * Saved state of one layer (floats, parts rounded to a 64-byte line):
 *   header  16 floats: magic, B, L, S, E, H (checked by the backward)
 *   s[0..4] (N,E) each: the residual stream at the sublayer boundaries;
 *           block k keeps s[2k] (its norm's input post-norm, its normalised
 *           input pre-norm) and s[2k+1] (its output; the last block's is out)
 *           post-norm  encoder: u1 = x+SA(x), x1 = LN1(u1), u2 = x1+FF(x1)
 *                      decoder: u1, x1, u2 = x1+CA(x1), x2 = LN2(u2), u3
 *           pre-norm   encoder: n1 = LN1(x), x1 = x+SA(n1), n2 = LN2(x1)
 *                      decoder: n1, x1, n2 = LN2(x1), x2 = x1+CA(n2), n3
 *   sa, ca  the attention modules' saved states (ca: decoder only, S keys)
 * Train workspace: t (N,E) a sublayer's output; g[0..2] (N,E) gradients in
 * flight; the MLP's backward scratch (6 N F); the attention backward's.
 * Backward, post-norm encoder (the forward statements, reversed):
 *   out = LN2(u2)          du2 = LN2'(dout)
 *   u2 = x1 + drop(FF(x1)) dx1 = du2 + FF'(drop'(du2))
 *   x1 = LN1(u1)           du1 = LN1'(dx1)
 *   u1 = x + drop(SA(x))   dx += du1 + SA'(drop'(du1))
 * and likewise for the other three forms.
 */
#include "layers.h"

#include <stdio.h>
#include <string.h>

#define SAVED_MAGIC 0x3176617379616c6dull /* "mlaysav1" */

typedef struct train_plan {
    int64_t s[5], sa, ca, total;     /* saved offsets, floats */
    int64_t sa_floats, ca_floats;
    int64_t t, g[3], mlp, mbw, ws_total; /* workspace offsets, floats */
    int64_t mbw_floats;
} train_plan;

static int64_t bytes_floats(size_t b) { return (int64_t)((b + sizeof(float) - 1) / sizeof(float)); }

static mha_status plan_train(int64_t B, int64_t L, int64_t S, int64_t E, int64_t F, int64_t H,
                             train_plan *p) {
    MHA_CHECK(B >= 0 && L >= 0 && S >= 0 && E >= 0 && F >= 0, MHA_ERR_SHAPE,
              "layer: negative size in (B,L,S,E,F) = (%lld,%lld,%lld,%lld,%lld)", (long long)B,
              (long long)L, (long long)S, (long long)E, (long long)F);
    MHA_CHECK(H > 0 && E % H == 0, MHA_ERR_SHAPE, "num_heads: %lld does not divide E = %lld",
              (long long)H, (long long)E);
    int64_t ne, nf;
    MHA_CHECK(mha_product((int64_t[]){B, L, E}, 3, &ne) && mha_product((int64_t[]){B, L, F}, 3, &nf) &&
                  ne < INT64_MAX / 64 && nf < INT64_MAX / 64,
              MHA_ERR_OVERFLOW, "layer: saved state size overflows");
    size_t sa, ca, wsa, wca;
    MHA_TRY(mha_multihead_saved_size(B, L, L, E, H, 0, 0, &sa));
    MHA_TRY(mha_multihead_saved_size(B, L, S, E, H, 0, 0, &ca));
    MHA_TRY(mha_multihead_backward_workspace_size(B, L, L, E, H, 0, 0, &wsa));
    MHA_TRY(mha_multihead_backward_workspace_size(B, L, S, E, H, 0, 0, &wca));
    MHA_CHECK(sa < SIZE_MAX / 8 && ca < SIZE_MAX / 8 && wsa < SIZE_MAX / 8 && wca < SIZE_MAX / 8,
              MHA_ERR_OVERFLOW, "layer: saved state size overflows");
    int64_t at = 16;
    for (int i = 0; i < 5; i++)
        p->s[i] = at, at += mha_round_line(ne);
    p->sa = at, p->sa_floats = bytes_floats(sa), at += mha_round_line(p->sa_floats);
    p->ca = at, p->ca_floats = bytes_floats(ca), at += mha_round_line(p->ca_floats);
    p->total = at;
    int64_t mlp_floats = mha_mlp_backward_floats(B * L, F, false);
    MHA_CHECK(mlp_floats >= 0 && mlp_floats < INT64_MAX / 8, MHA_ERR_OVERFLOW,
              "layer: workspace size overflows");
    at = 0;
    p->t = at, at += mha_round_line(ne);
    for (int i = 0; i < 3; i++)
        p->g[i] = at, at += mha_round_line(ne);
    p->mlp = at, at += mha_round_line(mlp_floats);
    p->mbw_floats = bytes_floats(wsa > wca ? wsa : wca);
    p->mbw = at, at += mha_round_line(p->mbw_floats);
    p->ws_total = at;
    MHA_CHECK((uint64_t)p->total <= SIZE_MAX / sizeof(float) &&
                  (uint64_t)p->ws_total <= SIZE_MAX / sizeof(float),
              MHA_ERR_OVERFLOW, "layer: saved state size overflows");
    return MHA_OK;
}

mha_status mha_layer_saved_size(int64_t B, int64_t L, int64_t S, int64_t E, int64_t H,
                                size_t *bytes) {
    train_plan p;
    MHA_CHECK(bytes != NULL, MHA_ERR_NULL, "layer: NULL bytes");
    MHA_TRY(plan_train(B, L, S, E, 0, H, &p));
    *bytes = (size_t)p.total * sizeof(float);
    return MHA_OK;
}

mha_status mha_layer_train_workspace_size(int64_t B, int64_t L, int64_t S, int64_t E, int64_t F,
                                          int64_t H, size_t *bytes) {
    train_plan p;
    MHA_CHECK(bytes != NULL, MHA_ERR_NULL, "layer: NULL bytes");
    MHA_TRY(plan_train(B, L, S, E, F, H, &p));
    *bytes = (size_t)p.ws_total * sizeof(float);
    return MHA_OK;
}

/* One training call: dimensions, views of the saved parts and workspace. */
typedef struct train_run {
    int64_t B, L, S, E, F, N, layer;
    const mha_layer_options *opt;
    mha_layer_masks masks;
    train_plan plan;
    float *saved, *ws, *owned;
    mha_tensor seq;  /* a (B,L,E) view to copy for the parts */
} train_run;

static mha_tensor part(const train_run *r, float *data) {
    mha_tensor t = r->seq;
    t.data = data;
    return t;
}

static mha_status train_begin(train_run *r, const mha_tensor *x, const mha_tensor *memory,
                              int64_t F, const void *saved, size_t saved_bytes, bool need_filled,
                              const mha_layer_masks *masks, const mha_layer_options *opt,
                              void *workspace, size_t workspace_bytes, int64_t layer) {
    memset(r, 0, sizeof *r);
    MHA_TRY(mha_layer_check_options(opt));
    MHA_TRY(mha_layer_seq_dims(x, memory, &r->B, &r->L, &r->S, &r->E));
    r->F = F, r->N = r->B * r->L, r->layer = layer, r->opt = opt;
    if (masks)
        r->masks = *masks;
    MHA_TRY(plan_train(r->B, r->L, r->S, r->E, F, opt->num_heads, &r->plan));
    MHA_CHECK(saved != NULL, MHA_ERR_NULL, "saved: NULL buffer");
    MHA_CHECK((uintptr_t)saved % sizeof(float) == 0, MHA_ERR_VALUE,
              "saved: must be float-aligned");
    MHA_CHECK(saved_bytes >= (size_t)r->plan.total * sizeof(float), MHA_ERR_VALUE,
              "saved: %zu bytes, the layer needs %zu", saved_bytes,
              (size_t)r->plan.total * sizeof(float));
    r->saved = (float *)saved;
    const int64_t want[6] = {(int64_t)SAVED_MAGIC, r->B, r->L, r->S, r->E, opt->num_heads};
    if (need_filled) {
        int64_t hdr[6];
        memcpy(hdr, saved, sizeof hdr);
        MHA_CHECK(memcmp(hdr, want, sizeof hdr) == 0, MHA_ERR_VALUE,
                  "saved: not filled by a forward_train call with these shapes");
    } else {
        memcpy(r->saved, want, sizeof want);
    }
    size_t need = (size_t)r->plan.ws_total * sizeof(float);
    MHA_TRY(mha_workspace_get(workspace, workspace_bytes, need, "layer", &r->ws, &r->owned));
    r->seq = *x;
    return MHA_OK;
}

static float *S_(const train_run *r, int i) { return r->saved + r->plan.s[i]; }
static float *G_(const train_run *r, int i) { return r->ws + r->plan.g[i]; }

static uint64_t tr_stream(const train_run *r, int k) { return mha_layer_stream(r->layer, k); }

/* Block b's attention module: its saved state (offset, floats). */
static void attn_saved(const train_run *r, const mha_layer_block *b, float **at, int64_t *n) {
    *at = r->saved + (b->cross ? r->plan.ca : r->plan.sa);
    *n = b->cross ? r->plan.ca_floats : r->plan.sa_floats;
}

/* t = block b's attention of q over kv (q itself, or memory), saving its state. */
static mha_status tr_attention(train_run *r, const mha_tensor *q, const mha_tensor *kv,
                               const mha_layer_block *b) {
    mha_multihead_options o;
    float *sv;
    int64_t n;
    MHA_TRY(mha_layer_attn_options(r->opt, &r->masks, b, r->layer, &o));
    mha_tensor t = part(r, r->ws + r->plan.t);
    attn_saved(r, b, &sv, &n);
    return mha_multihead_forward_train(&t, sv, (size_t)n * sizeof(float), q, kv, kv, b->attn, &o);
}

/* o = base + drop(t), dropout stream k. */
static void tr_residual(train_run *r, float *o, const float *base, int k) {
    mha_layer_residual(o, base, r->ws + r->plan.t, r->N * r->E, r->opt, tr_stream(r, k));
}

static void tr_norm(const train_run *r, float *y, const float *x, const mha_tensor *w,
                    const mha_tensor *b) {
    mha_layernorm_f32(y, x, r->N, r->E, mha_fdata(w), mha_fdata(b), r->opt->layer_norm_eps);
}

static void tr_ff(train_run *r, const float *x, const mha_mlp_raw *mlp, int k) {
    mha_mlp_f32(r->ws + r->plan.t, x, r->N, mlp, r->opt->activation, r->ws + r->plan.mlp,
                mha_layer_dropping(r->opt) ? r->opt->dropout_p : 0.0f, r->opt->seed,
                tr_stream(r, k));
}

/* ---- backward helpers: gradients accumulate ----------------------------------- */

static void zero(const train_run *r, float *g) {
    memset(g, 0, sizeof(float) * (size_t)(r->N * r->E));
}

/* dx += g (dx NULL: nothing). */
static void add_into(const train_run *r, float *dx, const float *g) {
    if (dx)
        for (int64_t i = 0; i < r->N * r->E; i++)
            dx[i] += g[i];
}

/* g += drop'(d) of stream k (g += d when not dropping). */
static void drop_bwd(const train_run *r, float *g, const float *d, int k) {
    const int64_t n = r->N * r->E;
    if (mha_layer_dropping(r->opt))
        mha_dropout_backward_f32(g, d, n, r->opt->dropout_p, r->opt->seed, tr_stream(r, k));
    else
        for (int64_t i = 0; i < n; i++)
            g[i] += d[i];
}

static void norm_bwd(const train_run *r, float *dx, mha_tensor *dw, mha_tensor *db,
                     const float *dout, const float *x, const mha_tensor *w) {
    mha_layernorm_backward_f32(dx, mha_gdata(dw), mha_gdata(db), dout, x, mha_fdata(w), r->N,
                               r->E, r->opt->layer_norm_eps);
}

static void ff_bwd(train_run *r, float *dx, const mha_mlp_raw_grads *g, const float *dout,
                   const float *x, const mha_mlp_raw *mlp, int k) {
    mha_mlp_backward_f32(dx, g, dout, x, r->N, mlp, r->opt->activation, r->ws + r->plan.mlp,
                         mha_layer_dropping(r->opt) ? r->opt->dropout_p : 0.0f, r->opt->seed,
                         tr_stream(r, k));
}

/* dq += dL/dq (and dmem += dL/dmem for cross attention) from d, the
 * gradient of block b's attention output. */
static mha_status attn_bwd(train_run *r, float *dq, mha_tensor *dmem,
                           const mha_multihead_grads *g, const float *d, const mha_tensor *q,
                           const mha_tensor *kv, const mha_layer_block *b) {
    mha_multihead_options o;
    float *sv;
    int64_t n;
    MHA_TRY(mha_layer_attn_options(r->opt, &r->masks, b, r->layer, &o));
    mha_tensor dqv = part(r, dq), dv = part(r, (float *)d);
    attn_saved(r, b, &sv, &n);
    return mha_multihead_backward(&dqv, b->cross ? dmem : NULL, b->cross ? dmem : NULL, g, &dv,
                                  sv, (size_t)n * sizeof(float), q, kv, kv, b->attn, &o,
                                  r->ws + r->plan.mbw, (size_t)r->plan.mbw_floats * sizeof(float));
}

/* ---- gradient argument checks ----------------------------------------------------- */

static mha_status grad_of(const mha_tensor *g, const mha_tensor *w, const char *name) {
    char s1[MHA_SHAPE_BUF], s2[MHA_SHAPE_BUF];
    if (!g)
        return MHA_OK;
    MHA_CHECK(w != NULL, MHA_ERR_VALUE, "%s: gradient given for an absent parameter", name);
    MHA_TRY(mha_check_tensor(g, name, w->ndim, MHA_F32));
    for (int i = 0; i < w->ndim; i++)
        MHA_CHECK(g->shape[i] == w->shape[i], MHA_ERR_SHAPE, "%s: shape %s, want %s", name,
                  mha_shape_str(g, s1, sizeof s1), mha_shape_str(w, s2, sizeof s2));
    int64_t want = 1;
    for (int i = g->ndim - 1; i >= 0; i--) {
        MHA_CHECK(g->shape[i] == 1 || g->stride[i] == want, MHA_ERR_SHAPE,
                  "%s: must be contiguous", name);
        want *= g->shape[i];
    }
    return MHA_OK;
}

/* dinput: NULL or a contiguous tensor of x's rows, apart from x. */
static mha_status dinput_check(const mha_tensor *d, const mha_tensor *x, const char *name) {
    if (!d)
        return MHA_OK;
    int64_t N, E, n, e;
    MHA_TRY(mha_rows_check(x, "input", -1, &N, &E));
    MHA_TRY(mha_rows_check(d, name, -1, &n, &e));
    MHA_CHECK(n == N && e == E && d->ndim == x->ndim, MHA_ERR_SHAPE,
              "%s: shape does not match the input", name);
    MHA_CHECK(!mha_tensors_overlap(d, x), MHA_ERR_ALIAS, "%s: overlaps the input", name);
    return MHA_OK;
}

/* A layer's gradients in block order, beside the weights they belong to. */
typedef struct layer_grads {
    const mha_multihead_grads *attn[3];        /* block k's attention module     */
    mha_tensor *norm_weight[3], *norm_bias[3]; /* normK+1 (E) or NULL each       */
    mha_tensor *linear[4];                     /* linear1.weight, .bias, linear2.* */
    const mha_tensor *linear_of[4];            /* the weights of those           */
    mha_mlp_raw_grads mlp;                     /* raw, filled by grads_check     */
} layer_grads;

static mha_status grads_check(layer_grads *g, const mha_layer_parts *p) {
    static const char *const lin[4] = {"grad linear1.weight", "grad linear1.bias",
                                       "grad linear2.weight", "grad linear2.bias"};
    char name[32];
    for (int i = 0; i < 4; i++)
        MHA_TRY(grad_of(g->linear[i], g->linear_of[i], lin[i]));
    g->mlp = (mha_mlp_raw_grads){mha_gdata(g->linear[0]), mha_gdata(g->linear[1]),
                                 mha_gdata(g->linear[2]), mha_gdata(g->linear[3]), NULL, NULL};
    for (int k = 0; k < p->n; k++) {
        snprintf(name, sizeof name, "grad norm%d.weight", k + 1);
        MHA_TRY(grad_of(g->norm_weight[k], p->block[k].norm_weight, name));
        snprintf(name, sizeof name, "grad norm%d.bias", k + 1);
        MHA_TRY(grad_of(g->norm_bias[k], p->block[k].norm_bias, name));
    }
    return MHA_OK;
}

static layer_grads encoder_grads(const mha_encoder_layer_grads *g,
                                 const mha_encoder_layer_weights *w) {
    return (layer_grads){{&g->self_attn},
                         {g->norm1_weight, g->norm2_weight},
                         {g->norm1_bias, g->norm2_bias},
                         {g->linear1_weight, g->linear1_bias, g->linear2_weight, g->linear2_bias},
                         {w->linear1_weight, w->linear1_bias, w->linear2_weight, w->linear2_bias},
                         {0}};
}

static layer_grads decoder_grads(const mha_decoder_layer_grads *g,
                                 const mha_decoder_layer_weights *w) {
    return (layer_grads){{&g->self_attn, &g->multihead_attn},
                         {g->norm1_weight, g->norm2_weight, g->norm3_weight},
                         {g->norm1_bias, g->norm2_bias, g->norm3_bias},
                         {g->linear1_weight, g->linear1_bias, g->linear2_weight, g->linear2_bias},
                         {w->linear1_weight, w->linear1_bias, w->linear2_weight, w->linear2_bias},
                         {0}};
}

/* ---- one layer, block by block -------------------------------------------------------
 * Block k reads in = x (k = 0) or s[2k-1] and writes s[2k+1] (out for the
 * last block):  post-norm  s[2k] = in + drop(sub(in)),  s[2k+1] = normK(s[2k])
 *               pre-norm   s[2k] = normK(in),  s[2k+1] = in + drop(sub(s[2k]))  */

static mha_status train_blocks(train_run *r, float *o, const float *x, const mha_tensor *memory,
                               const mha_layer_parts *p) {
    const bool pre = r->opt->norm_first;
    for (int k = 0; k < p->n; k++) {
        const mha_layer_block *b = &p->block[k];
        const float *in = k ? S_(r, 2 * k - 1) : x;
        float *mid = S_(r, 2 * k), *end = k + 1 < p->n ? S_(r, 2 * k + 1) : o;
        if (pre)
            tr_norm(r, mid, in, b->norm_weight, b->norm_bias);
        mha_tensor sub = part(r, pre ? mid : (float *)in); /* the sublayer's input */
        if (b->attn)
            MHA_TRY(tr_attention(r, &sub, b->cross ? memory : &sub, b));
        else
            tr_ff(r, sub.data, &p->mlp, k);
        tr_residual(r, pre ? end : mid, in, mha_layer_residual_stream(p, k));
        if (!pre)
            tr_norm(r, end, mid, b->norm_weight, b->norm_bias);
    }
    return MHA_OK;
}

/* dx += dL/dx (dx may be NULL), the weight gradients and dmem from dy, the
 * gradient of the layer's output: the blocks in reverse.  gB carries the
 * gradient of the block input between blocks. */
static mha_status backward_blocks(train_run *r, float *dx, mha_tensor *dmem, const layer_grads *g,
                                  const float *dy, const float *x, const mha_tensor *memory,
                                  const mha_layer_parts *p) {
    float *gA = G_(r, 0), *gB = G_(r, 1), *gC = G_(r, 2);
    const bool pre = r->opt->norm_first;
    const float *gout = dy; /* the gradient of block k's output */
    mha_status st = MHA_OK;
    for (int k = p->n - 1; st == MHA_OK && k >= 0; k--) {
        const mha_layer_block *b = &p->block[k];
        const float *in = k ? S_(r, 2 * k - 1) : x;
        const int stream = mha_layer_residual_stream(p, k);
        mha_tensor sub = part(r, pre ? S_(r, 2 * k) : (float *)in);
        float *dsub; /* where the sublayer's input gradient accumulates */
        if (pre) {   /* out = in + drop(sub(normK(in))) */
            if (k == p->n - 1)
                memcpy(gB, gout, sizeof(float) * (size_t)(r->N * r->E)); /* d in (residual) */
            else if (k == 0)
                add_into(r, dx, gB);                                     /* residual to x */
            zero(r, gC), drop_bwd(r, gC, gout, stream);                  /* d sub out */
            zero(r, gA);
            dsub = gA;                                                   /* d normK out */
        } else {     /* out = normK(u),  u = in + drop(sub(in)) */
            zero(r, gA);
            norm_bwd(r, gA, g->norm_weight[k], g->norm_bias[k], gout, S_(r, 2 * k),
                     b->norm_weight);                                    /* du */
            if (k)
                memcpy(gB, gA, sizeof(float) * (size_t)(r->N * r->E));   /* d in (residual) */
            else
                add_into(r, dx, gA);
            zero(r, gC), drop_bwd(r, gC, gA, stream);                    /* d sub out */
            if (!k) /* the first block's sublayer straight into dx (or a scratch
                     * when dx is NULL, for the weight gradients) */
                zero(r, gB);
            dsub = k || !dx ? gB : dx;
        }
        if (b->attn)
            st = attn_bwd(r, dsub, dmem, g->attn[k], gC, &sub, b->cross ? memory : &sub, b);
        else
            ff_bwd(r, dsub, &g->mlp, gC, sub.data, &p->mlp, k);
        if (st == MHA_OK && pre) /* dx NULL: only the norm's weight gradients */
            norm_bwd(r, k ? gB : dx, g->norm_weight[k], g->norm_bias[k], gA, in, b->norm_weight);
        gout = gB;
    }
    return st;
}

/* forward_train of one layer whose parts p are checked. */
static mha_status layer_train(mha_tensor *out, void *saved, size_t saved_bytes,
                              const mha_tensor *x, const mha_tensor *memory,
                              const mha_layer_parts *p, const mha_layer_masks *masks,
                              const mha_layer_options *opt, void *workspace,
                              size_t workspace_bytes, int64_t layer) {
    train_run r;
    MHA_TRY(train_begin(&r, x, memory, p->mlp.F, saved, saved_bytes, false, masks, opt, workspace,
                        workspace_bytes, layer));
    mha_status st = mha_rows_check_out(out, x, "out", r.N, r.E, false);
    if (st == MHA_OK && out->ndim != x->ndim)
        st = mha_error(MHA_ERR_SHAPE, "out: rank %d, want %d like %s", out->ndim, x->ndim,
                       memory ? "tgt" : "src");
    if (st == MHA_OK && memory && mha_tensors_overlap(out, memory))
        st = mha_error(MHA_ERR_ALIAS, "out: overlaps memory");
    if (st == MHA_OK)
        st = train_blocks(&r, out->data, x->data, memory, p);
    mha_free(r.owned);
    return st;
}

/* backward of one layer whose parts p are checked; g's gradients are checked here. */
static mha_status layer_backward(mha_tensor *dx, mha_tensor *dmemory, layer_grads *g,
                                 const mha_tensor *dout, const void *saved, size_t saved_bytes,
                                 const mha_tensor *x, const mha_tensor *memory,
                                 const mha_layer_parts *p, const mha_layer_masks *masks,
                                 const mha_layer_options *opt, void *workspace,
                                 size_t workspace_bytes, int64_t layer) {
    train_run r;
    const char *dname = memory ? "dtgt" : "dsrc";
    MHA_TRY(grads_check(g, p));
    MHA_TRY(dinput_check(dx, x, dname));
    MHA_TRY(dinput_check(dout, x, "dout"));
    if (memory)
        MHA_TRY(dinput_check(dmemory, memory, "dmemory"));
    MHA_TRY(train_begin(&r, x, memory, p->mlp.F, saved, saved_bytes, true, masks, opt, workspace,
                        workspace_bytes, layer));
    mha_status st = MHA_OK;
    if (dx && mha_tensors_overlap(dx, dout))
        st = mha_error(MHA_ERR_ALIAS, "%s: overlaps dout", dname);
    else if (memory && dmemory &&
             (mha_tensors_overlap(dmemory, dout) || mha_tensors_overlap(dmemory, x) ||
              (dx && mha_tensors_overlap(dmemory, dx))))
        st = mha_error(MHA_ERR_ALIAS, "dmemory: overlaps another argument");
    if (st == MHA_OK)
        st = backward_blocks(&r, mha_gdata(dx), memory ? dmemory : NULL, g, dout->data, x->data,
                             memory, p);
    mha_free(r.owned);
    return st;
}

/* ---- the layers' entry points (the stacks pass their layer index) ---------------------- */

static int64_t width_of(const mha_tensor *x) { return x->ndim ? x->shape[x->ndim - 1] : 0; }

mha_status mha_encoder_layer_forward_train_at(mha_tensor *out, void *saved, size_t saved_bytes,
                                              const mha_tensor *src,
                                              const mha_encoder_layer_weights *w,
                                              const mha_layer_masks *masks,
                                              const mha_layer_options *opt, void *workspace,
                                              size_t workspace_bytes, int64_t layer) {
    mha_layer_parts p;
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "encoder: NULL layer weights");
    MHA_CHECK(src != NULL, MHA_ERR_NULL, "src: NULL tensor");
    MHA_TRY(mha_layer_parts_encoder(w, width_of(src), &p));
    return layer_train(out, saved, saved_bytes, src, NULL, &p, masks, opt, workspace,
                       workspace_bytes, layer);
}

mha_status mha_encoder_layer_backward_at(mha_tensor *dsrc, const mha_encoder_layer_grads *grads,
                                         const mha_tensor *dout, const void *saved,
                                         size_t saved_bytes, const mha_tensor *src,
                                         const mha_encoder_layer_weights *w,
                                         const mha_layer_masks *masks,
                                         const mha_layer_options *opt, void *workspace,
                                         size_t workspace_bytes, int64_t layer) {
    mha_layer_parts p;
    const mha_encoder_layer_grads none = {0};
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "encoder: NULL layer weights");
    MHA_CHECK(src != NULL && dout != NULL, MHA_ERR_NULL, "src/dout: NULL tensor");
    MHA_TRY(mha_layer_parts_encoder(w, width_of(src), &p));
    layer_grads g = encoder_grads(grads ? grads : &none, w);
    return layer_backward(dsrc, NULL, &g, dout, saved, saved_bytes, src, NULL, &p, masks, opt,
                          workspace, workspace_bytes, layer);
}

/* ---- public single-layer entry points (layer index 0) -------------------------------- */

mha_status mha_encoder_layer_forward_train(mha_tensor *out, void *saved, size_t saved_bytes,
                                           const mha_tensor *src,
                                           const mha_encoder_layer_weights *w,
                                           const mha_layer_masks *masks,
                                           const mha_layer_options *opt, void *workspace,
                                           size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    return mha_encoder_layer_forward_train_at(out, saved, saved_bytes, src, w, masks, opt,
                                              workspace, workspace_bytes, 0);
}

mha_status mha_decoder_layer_forward_train(mha_tensor *out, void *saved, size_t saved_bytes,
                                           const mha_tensor *tgt, const mha_tensor *memory,
                                           const mha_decoder_layer_weights *w,
                                           const mha_layer_masks *masks,
                                           const mha_layer_options *opt, void *workspace,
                                           size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    mha_layer_parts p;
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "decoder: NULL layer weights");
    MHA_CHECK(tgt != NULL && memory != NULL, MHA_ERR_NULL, "tgt/memory: NULL tensor");
    MHA_TRY(mha_layer_parts_decoder(w, width_of(tgt), &p));
    return layer_train(out, saved, saved_bytes, tgt, memory, &p, masks, opt, workspace,
                       workspace_bytes, 0);
}

mha_status mha_encoder_layer_backward(mha_tensor *dsrc, const mha_encoder_layer_grads *grads,
                                      const mha_tensor *dout, const void *saved,
                                      size_t saved_bytes, const mha_tensor *src,
                                      const mha_encoder_layer_weights *w,
                                      const mha_layer_masks *masks, const mha_layer_options *opt,
                                      void *workspace, size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    return mha_encoder_layer_backward_at(dsrc, grads, dout, saved, saved_bytes, src, w, masks, opt,
                                         workspace, workspace_bytes, 0);
}

mha_status mha_decoder_layer_backward(mha_tensor *dtgt, mha_tensor *dmemory,
                                      const mha_decoder_layer_grads *grads,
                                      const mha_tensor *dout, const void *saved,
                                      size_t saved_bytes, const mha_tensor *tgt,
                                      const mha_tensor *memory,
                                      const mha_decoder_layer_weights *w,
                                      const mha_layer_masks *masks, const mha_layer_options *opt,
                                      void *workspace, size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    mha_layer_parts p;
    const mha_decoder_layer_grads none = {0};
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "decoder: NULL layer weights");
    MHA_CHECK(tgt != NULL && memory != NULL && dout != NULL, MHA_ERR_NULL,
              "tgt/memory/dout: NULL tensor");
    MHA_TRY(mha_layer_parts_decoder(w, width_of(tgt), &p));
    layer_grads g = decoder_grads(grads ? grads : &none, w);
    return layer_backward(dtgt, dmemory, &g, dout, saved, saved_bytes, tgt, memory, &p, masks,
                          opt, workspace, workspace_bytes, 0);
}

/* ---- stacks (nn.TransformerEncoder / Decoder): forward_train and backward ---------
 * Saved: the output of every layer x_1..x_NL (N,E) each, then each layer's
 * saved state.  Layer l reads x_l (x_0 = src); the final norm reads x_NL.
 * Backward: g = norm'(dout) (or dout), then for l = NL-1..0 g = layer_l'(g);
 * dsrc += g.  The decoder's dmemory collects every layer's cross-attention
 * gradient.  Workspace: one layer's train workspace (the widest F) and two
 * (N,E) gradient buffers. */

typedef struct stack_plan {
    int64_t NL, N, E, layer_saved, layer_ws, total_saved, total_ws;
} stack_plan;

static mha_status plan_stack(int64_t NL, int64_t B, int64_t L, int64_t S, int64_t E, int64_t F,
                             int64_t H, stack_plan *p) {
    train_plan t;
    MHA_CHECK(NL >= 1 && NL <= 1 << 16, MHA_ERR_VALUE, "stack: num_layers %lld, want >= 1",
              (long long)NL);
    MHA_TRY(plan_train(B, L, S, E, F, H, &t));
    p->NL = NL, p->N = B * L, p->E = E;
    p->layer_saved = mha_round_line(t.total), p->layer_ws = mha_round_line(t.ws_total);
    int64_t ne = mha_round_line(p->N * E), a, b;
    MHA_CHECK(!mha_mul_overflows(NL, ne + p->layer_saved, &a) &&
                  !__builtin_add_overflow(p->layer_ws, 2 * ne, &b) &&
                  (uint64_t)a <= SIZE_MAX / sizeof(float) && (uint64_t)b <= SIZE_MAX / sizeof(float),
              MHA_ERR_OVERFLOW, "stack: saved state size overflows");
    p->total_saved = a, p->total_ws = b;
    return MHA_OK;
}

mha_status mha_stack_saved_size(int64_t num_layers, int64_t B, int64_t L, int64_t S, int64_t E,
                                int64_t H, size_t *bytes) {
    stack_plan p;
    MHA_CHECK(bytes != NULL, MHA_ERR_NULL, "stack: NULL bytes");
    MHA_TRY(plan_stack(num_layers, B, L, S, E, 0, H, &p));
    *bytes = (size_t)p.total_saved * sizeof(float);
    return MHA_OK;
}

mha_status mha_stack_train_workspace_size(int64_t B, int64_t L, int64_t S, int64_t E, int64_t F,
                                          int64_t H, size_t *bytes) {
    stack_plan p;
    MHA_CHECK(bytes != NULL, MHA_ERR_NULL, "stack: NULL bytes");
    MHA_TRY(plan_stack(1, B, L, S, E, F, H, &p));
    *bytes = (size_t)p.total_ws * sizeof(float);
    return MHA_OK;
}

/* Shared setup: dims, the plan, saved/workspace checks (ws allocated when
 * the caller gave none: *owned). */
static mha_status stack_begin(const mha_tensor *x, const mha_tensor *memory, int64_t NL,
                              int64_t F, const mha_layer_options *opt, size_t saved_bytes,
                              void *workspace, size_t workspace_bytes, stack_plan *p, float **ws,
                              float **owned) {
    int64_t B, L, E, S;
    *owned = NULL;
    MHA_TRY(mha_layer_check_options(opt));
    MHA_TRY(mha_layer_seq_dims(x, memory, &B, &L, &S, &E));
    MHA_TRY(plan_stack(NL, B, L, S, E, F, opt->num_heads, p));
    MHA_CHECK(saved_bytes >= (size_t)p->total_saved * sizeof(float), MHA_ERR_VALUE,
              "saved: %zu bytes, the stack needs %zu", saved_bytes,
              (size_t)p->total_saved * sizeof(float));
    size_t need = (size_t)p->total_ws * sizeof(float);
    return mha_workspace_get(workspace, workspace_bytes, need, "stack", ws, owned);
}

static mha_status stack_forward_train(mha_tensor *out, void *saved, size_t saved_bytes,
                                      const mha_tensor *x, const mha_tensor *memory,
                                      const mha_layer_stack *s, const mha_layer_masks *masks,
                                      const mha_layer_options *opt, void *workspace,
                                      size_t workspace_bytes) {
    const int64_t NL = s->num_layers;
    MHA_CHECK(x != NULL && saved != NULL, MHA_ERR_NULL, "stack: NULL input or saved buffer");
    MHA_CHECK((uintptr_t)saved % sizeof(float) == 0, MHA_ERR_VALUE, "saved: must be float-aligned");
    int64_t F, B, L, E;
    MHA_TRY(mha_layer_seq_check(x, memory ? "tgt" : "src", &B, &L, &E));
    MHA_TRY(mha_layer_stack_width(s, E, &F));
    MHA_TRY(mha_layer_stack_check_norm(s, E));
    stack_plan p;
    float *ws, *owned;
    MHA_TRY(stack_begin(x, memory, NL, F, opt, saved_bytes, workspace, workspace_bytes, &p, &ws,
                        &owned));
    mha_status st = mha_rows_check_out(out, x, "out", p.N, E, false);
    if (st == MHA_OK && out->ndim != x->ndim)
        st = mha_error(MHA_ERR_SHAPE, "out: rank %d, want %d like the input", out->ndim, x->ndim);
    float *sv = saved;
    const int64_t ne = mha_round_line(p.N * E);
    for (int64_t l = 0; st == MHA_OK && l < NL; l++) {
        mha_tensor in = *x, o = *x;
        in.data = l ? sv + (l - 1) * ne : x->data;
        o.data = sv + l * ne;
        float *ls = sv + NL * ne + l * p.layer_saved;
        size_t lsb = (size_t)p.layer_saved * sizeof(float), lwb = (size_t)p.layer_ws * sizeof(float);
        mha_layer_parts lp;
        st = mha_layer_stack_parts(s, l, E, &lp);
        if (st == MHA_OK)
            st = layer_train(&o, ls, lsb, &in, memory, &lp, masks, opt, ws, lwb, l);
    }
    if (st == MHA_OK) {
        const float *top = sv + (NL - 1) * ne;
        if (s->final_norm)
            mha_layernorm_f32(out->data, top, p.N, E, mha_fdata(s->norm_weight),
                              mha_fdata(s->norm_bias), opt->layer_norm_eps);
        else
            memcpy(out->data, top, sizeof(float) * (size_t)(p.N * E));
    }
    mha_free(owned);
    return st;
}

/* The stack's gradients: per layer (eg or dg, or NULL: none) and the final norm's. */
typedef struct stack_grads {
    const mha_encoder_layer_grads *enc;
    const mha_decoder_layer_grads *dec;
    mha_tensor *norm_weight, *norm_bias;
} stack_grads;

/* Layer l's gradients (none when g has no layers). */
static void stack_layer_grads(const mha_layer_stack *s, const stack_grads *g, int64_t l,
                              layer_grads *lg) {
    static const mha_encoder_layer_grads no_enc;
    static const mha_decoder_layer_grads no_dec;
    *lg = s->dec ? decoder_grads(g->dec ? &g->dec[l] : &no_dec, &s->dec[l])
                 : encoder_grads(g->enc ? &g->enc[l] : &no_enc, &s->enc[l]);
}

static mha_status stack_backward(mha_tensor *dx, mha_tensor *dmemory, const stack_grads *g,
                                 const mha_tensor *dout, const void *saved, size_t saved_bytes,
                                 const mha_tensor *x, const mha_tensor *memory,
                                 const mha_layer_stack *s, const mha_layer_masks *masks,
                                 const mha_layer_options *opt, void *workspace,
                                 size_t workspace_bytes) {
    const int64_t NL = s->num_layers;
    MHA_CHECK(x != NULL && dout != NULL && saved != NULL, MHA_ERR_NULL,
              "stack: NULL input, dout or saved buffer");
    int64_t F, B, L, E;
    MHA_TRY(mha_layer_seq_check(x, memory ? "tgt" : "src", &B, &L, &E));
    MHA_TRY(mha_layer_stack_width(s, E, &F));
    MHA_TRY(dinput_check(dout, x, "dout"));
    MHA_TRY(dinput_check(dx, x, memory ? "dtgt" : "dsrc"));
    MHA_CHECK(!dx || !mha_tensors_overlap(dx, dout), MHA_ERR_ALIAS, "dx: overlaps dout");
    if (s->final_norm) {
        MHA_TRY(grad_of(g->norm_weight, s->norm_weight, "grad norm.weight"));
        MHA_TRY(grad_of(g->norm_bias, s->norm_bias, "grad norm.bias"));
    }
    stack_plan p;
    float *ws, *owned;
    MHA_TRY(stack_begin(x, memory, NL, F, opt, saved_bytes, workspace, workspace_bytes, &p, &ws,
                        &owned));
    const float *sv = saved;
    const int64_t ne = mha_round_line(p.N * E), n = p.N * E;
    float *ga = ws + p.layer_ws, *gb = ga + ne;
    memset(ga, 0, sizeof(float) * (size_t)n);
    if (s->final_norm)
        mha_layernorm_backward_f32(ga, mha_gdata(g->norm_weight), mha_gdata(g->norm_bias),
                                   dout->data, sv + (NL - 1) * ne, mha_fdata(s->norm_weight), p.N,
                                   E, opt->layer_norm_eps);
    else
        memcpy(ga, dout->data, sizeof(float) * (size_t)n);
    mha_status st = MHA_OK;
    for (int64_t l = NL - 1; st == MHA_OK && l >= 0; l--) {
        mha_tensor in = *x, gout = *x, gin = *x;
        in.data = l ? (void *)(sv + (l - 1) * ne) : x->data;
        gout.data = ga, gin.data = gb;
        memset(gb, 0, sizeof(float) * (size_t)n);
        const float *ls = sv + NL * ne + l * p.layer_saved;
        size_t lsb = (size_t)p.layer_saved * sizeof(float), lwb = (size_t)p.layer_ws * sizeof(float);
        mha_layer_parts lp;
        layer_grads lg;
        st = mha_layer_stack_parts(s, l, E, &lp);
        if (st == MHA_OK) {
            stack_layer_grads(s, g, l, &lg);
            st = layer_backward(&gin, dmemory, &lg, &gout, ls, lsb, &in, memory, &lp, masks, opt,
                                ws, lwb, l);
        }
        float *t = ga;
        ga = gb, gb = t;
    }
    if (st == MHA_OK && dx) {
        float *d = dx->data;
        for (int64_t i = 0; i < n; i++)
            d[i] += ga[i];
    }
    mha_free(owned);
    return st;
}

mha_status mha_encoder_forward_train(mha_tensor *out, void *saved, size_t saved_bytes,
                                     const mha_tensor *src, const mha_encoder_weights *w,
                                     const mha_layer_masks *masks, const mha_layer_options *opt,
                                     void *workspace, size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    MHA_CHECK(w != NULL && w->layers != NULL, MHA_ERR_NULL, "encoder: NULL weights");
    const mha_layer_stack s = mha_layer_stack_encoder(w);
    return stack_forward_train(out, saved, saved_bytes, src, NULL, &s, masks, opt, workspace,
                               workspace_bytes);
}

mha_status mha_decoder_forward_train(mha_tensor *out, void *saved, size_t saved_bytes,
                                     const mha_tensor *tgt, const mha_tensor *memory,
                                     const mha_decoder_weights *w, const mha_layer_masks *masks,
                                     const mha_layer_options *opt, void *workspace,
                                     size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    MHA_CHECK(w != NULL && w->layers != NULL, MHA_ERR_NULL, "decoder: NULL weights");
    MHA_CHECK(memory != NULL, MHA_ERR_NULL, "memory: NULL tensor");
    const mha_layer_stack s = mha_layer_stack_decoder(w);
    return stack_forward_train(out, saved, saved_bytes, tgt, memory, &s, masks, opt, workspace,
                               workspace_bytes);
}

mha_status mha_encoder_backward(mha_tensor *dsrc, const mha_encoder_grads *grads,
                                const mha_tensor *dout, const void *saved, size_t saved_bytes,
                                const mha_tensor *src, const mha_encoder_weights *w,
                                const mha_layer_masks *masks, const mha_layer_options *opt,
                                void *workspace, size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    MHA_CHECK(w != NULL && w->layers != NULL, MHA_ERR_NULL, "encoder: NULL weights");
    const mha_layer_stack s = mha_layer_stack_encoder(w);
    const stack_grads g = {grads ? grads->layers : NULL, NULL, grads ? grads->norm_weight : NULL,
                           grads ? grads->norm_bias : NULL};
    return stack_backward(dsrc, NULL, &g, dout, saved, saved_bytes, src, NULL, &s, masks, opt,
                          workspace, workspace_bytes);
}

mha_status mha_decoder_backward(mha_tensor *dtgt, mha_tensor *dmemory,
                                const mha_decoder_grads *grads, const mha_tensor *dout,
                                const void *saved, size_t saved_bytes, const mha_tensor *tgt,
                                const mha_tensor *memory, const mha_decoder_weights *w,
                                const mha_layer_masks *masks, const mha_layer_options *opt,
                                void *workspace, size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    MHA_CHECK(w != NULL && w->layers != NULL, MHA_ERR_NULL, "decoder: NULL weights");
    MHA_CHECK(memory != NULL, MHA_ERR_NULL, "memory: NULL tensor");
    const mha_layer_stack s = mha_layer_stack_decoder(w);
    const stack_grads g = {NULL, grads ? grads->layers : NULL, grads ? grads->norm_weight : NULL,
                           grads ? grads->norm_bias : NULL};
    return stack_backward(dtgt, dmemory, &g, dout, saved, saved_bytes, tgt, memory, &s, masks,
                          opt, workspace, workspace_bytes);
}
