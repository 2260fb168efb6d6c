/* transformer.c - torch.nn.TransformerEncoderLayer / TransformerDecoderLayer
 * (batch_first=True) and their stacks nn.TransformerEncoder / Decoder.
 *
 * Letter legend: B batch, L target (query) length, S memory length, E model
 * width, F MLP width, N = B*L rows, H heads.
 *
 * Semantics (PyTorch 1.13-2.x, torch/nn/modules/transformer.py, slow path):
 *   encoder, post-norm:  x = norm1(x + drop1(SA(x)));  x = norm2(x + drop2(FF(x)))
 *   encoder, pre-norm:   x = x + drop1(SA(norm1(x)));  x = x + drop2(FF(norm2(x)))
 *   decoder, post-norm:  x = norm1(x + drop1(SA(x)))
 *                        x = norm2(x + drop2(CA(x, mem)))
 *                        x = norm3(x + drop3(FF(x)))
 *   decoder, pre-norm:   x = x + drop1(SA(norm1(x)))
 *                        x = x + drop2(CA(norm2(x), mem))
 *                        x = x + drop3(FF(norm3(x)))
 *   FF(x) = linear2(drop(act(linear1(x)))); attention dropout inside SA/CA.
 *
 * Workspace plan (floats, each part rounded up to a 64-byte line):
 *   mha  the attention's qkv (B,max(L,S),3E) + heads (B,L,E)
 *   t    (N,E)  the output of a sublayer (attention or MLP)
 *   n    (N,E)  the normalised input of a pre-norm sublayer
 *   h    (N,F)  the MLP's hidden activations
 * Layers run in place on out (out may be src), so a stack needs no more
 * than one layer.  With a caller workspace no call allocates.
 */
#include "layers.h"

#include <string.h>

void mha_layer_options_init(mha_layer_options *opt) {
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->activation = MHA_ACT_RELU;
    opt->layer_norm_eps = 1e-5f;
    opt->masked_rows = MHA_MASKED_ROWS_ZERO;
    opt->kernel = MHA_KERNEL_AUTO;
}

/* ---- workspace ----------------------------------------------------------- */

typedef struct ws_plan {
    int64_t mha, t, n, h; /* offsets in floats */
    int64_t mha_floats, total;
} ws_plan;

static int64_t round_line(int64_t n) { return (n + 15) / 16 * 16; }

static mha_status plan_workspace(int64_t B, int64_t L, int64_t S, int64_t E, int64_t F,
                                 ws_plan *p) {
    MHA_CHECK(B >= 0 && L >= 0 && S >= 0 && E >= 0 && F >= 0, MHA_ERR_SHAPE,
              "layer: negative size in (B,L,S,E,F) = (%lld,%lld,%lld,%lld,%lld)", (long long)B,
              (long long)L, (long long)S, (long long)E, (long long)F);
    int64_t ne, nf;
    /* the attention kernel's scratch depends on the head count, which the
     * plan does not take: plan for the largest over every H dividing E */
    p->mha_floats = 0;
    for (int64_t H = 1; H <= (E > 0 ? E : 1); H++) {
        int64_t floats;
        if (E > 0 && E % H != 0)
            continue;
        MHA_TRY(mha_multihead_workspace_floats(B, L, S > L ? S : L, E, H, &floats));
        p->mha_floats = floats > p->mha_floats ? floats : p->mha_floats;
    }
    MHA_CHECK(mha_product((int64_t[]){B, L, E}, 3, &ne) && mha_product((int64_t[]){B, L, F}, 3, &nf) &&
                  p->mha_floats < INT64_MAX / 8 && ne < INT64_MAX / 8 && nf < INT64_MAX / 8,
              MHA_ERR_OVERFLOW, "layer: workspace size overflows");
    p->mha = 0;
    p->t = p->mha + round_line(p->mha_floats);
    p->n = p->t + round_line(ne);
    p->h = p->n + round_line(ne);
    p->total = p->h + round_line(nf);
    MHA_CHECK((uint64_t)p->total <= SIZE_MAX / sizeof(float), MHA_ERR_OVERFLOW,
              "layer: workspace size overflows");
    return MHA_OK;
}

mha_status mha_encoder_workspace_size(int64_t B, int64_t L, int64_t E, int64_t F, size_t *bytes) {
    ws_plan p;
    MHA_CHECK(bytes != NULL, MHA_ERR_NULL, "encoder: NULL bytes");
    MHA_TRY(plan_workspace(B, L, L, E, F, &p));
    *bytes = (size_t)p.total * sizeof(float);
    return MHA_OK;
}

mha_status mha_decoder_workspace_size(int64_t B, int64_t L, int64_t S, int64_t E, int64_t F,
                                      size_t *bytes) {
    ws_plan p;
    MHA_CHECK(bytes != NULL, MHA_ERR_NULL, "decoder: NULL bytes");
    MHA_TRY(plan_workspace(B, L, S, E, F, &p));
    *bytes = (size_t)p.total * sizeof(float);
    return MHA_OK;
}

/* ---- shared state of one call -------------------------------------------- */

typedef struct layer_run {
    bool batched;
    int64_t B, L, S, E, F, N;
    const mha_layer_options *opt;
    mha_layer_masks masks;
    ws_plan plan;
    float *ws;
    mha_tensor t, n; /* (B,L,E) views of the workspace parts */
} layer_run;

/* A (B,L,E) or (L,E) sequence, contiguous. */
static mha_status check_seq(const mha_tensor *t, const char *name, int64_t *B, int64_t *L,
                            int64_t *E) {
    char sb[MHA_SHAPE_BUF];
    int64_t N;
    MHA_CHECK(t != NULL, MHA_ERR_NULL, "%s: NULL tensor", name);
    MHA_CHECK(t->ndim == 2 || t->ndim == 3, MHA_ERR_SHAPE, "%s: shape %s, want (B,L,E) or (L,E)",
              name, mha_shape_str(t, sb, sizeof sb));
    MHA_TRY(mha_rows_check(t, name, -1, &N, E));
    *B = t->ndim == 3 ? t->shape[0] : 1;
    *L = t->shape[t->ndim - 2];
    return MHA_OK;
}

mha_status mha_layer_check_options(const mha_layer_options *opt) {
    MHA_CHECK(opt != NULL, MHA_ERR_NULL, "layer: NULL options");
    MHA_TRY(mha_runtime_check());
    MHA_CHECK(opt->activation >= MHA_ACT_RELU && opt->activation <= MHA_ACT_SILU, MHA_ERR_VALUE,
              "activation: unknown value %d", (int)opt->activation);
    MHA_CHECK(opt->layer_norm_eps > 0.0f && opt->layer_norm_eps < __builtin_inff(),
              MHA_ERR_VALUE, "layer_norm_eps: %g must be positive and finite",
              (double)opt->layer_norm_eps);
    MHA_CHECK(opt->dropout_p >= 0.0f && opt->dropout_p < 1.0f, MHA_ERR_VALUE,
              "dropout_p: %g must be in [0,1)", (double)opt->dropout_p);
    MHA_CHECK(opt->kernel >= MHA_KERNEL_AUTO && opt->kernel <= MHA_KERNEL_AVX2, MHA_ERR_VALUE,
              "kernel: unknown kernel %d", (int)opt->kernel);
    return MHA_OK;
}

/* Sets up dims, views and the workspace (allocated when the caller gave
 * none: *owned then holds it). */
static mha_status run_begin(layer_run *r, const mha_tensor *x, const mha_tensor *memory,
                            int64_t F, const mha_layer_masks *masks, const mha_layer_options *opt,
                            void *workspace, size_t workspace_bytes, float **owned) {
    char sb[MHA_SHAPE_BUF];
    memset(r, 0, sizeof *r);
    *owned = NULL;
    MHA_TRY(mha_layer_check_options(opt));
    MHA_TRY(check_seq(x, memory ? "tgt" : "src", &r->B, &r->L, &r->E));
    r->batched = x->ndim == 3;
    r->S = r->L;
    if (memory) {
        int64_t Bm, Em;
        MHA_TRY(check_seq(memory, "memory", &Bm, &r->S, &Em));
        MHA_CHECK(memory->ndim == x->ndim && Bm == r->B && Em == r->E, MHA_ERR_SHAPE,
                  "memory: shape %s does not fit tgt's batch %lld and width %lld",
                  mha_shape_str(memory, sb, sizeof sb), (long long)r->B, (long long)r->E);
    }
    r->F = F;
    r->N = r->B * r->L;
    r->opt = opt;
    if (masks)
        r->masks = *masks;
    MHA_TRY(mha_check_causal_top_left(r->masks.causal, "masks"));
    MHA_TRY(plan_workspace(r->B, r->L, r->S, r->E, F, &r->plan));
    size_t need = (size_t)r->plan.total * sizeof(float);
    MHA_TRY(mha_workspace_get(workspace, workspace_bytes, need, "layer", &r->ws, owned));
    r->t = *x, r->n = *x;
    r->t.data = r->ws + r->plan.t;
    r->n.data = r->ws + r->plan.n;
    return MHA_OK;
}

/* Streams: 16 per layer; attention dropout seeds differ per layer and module. */
static uint64_t stream_id(int64_t layer, int k) { return (uint64_t)layer * 16u + (uint64_t)k; }

/* The options of a layer's self (cross = false) or cross attention: the
 * layer's masks, and an attention-dropout seed per layer and module. */
static mha_status attn_options(const mha_layer_options *opt, const mha_layer_masks *masks,
                               const mha_multihead_weights *w, bool cross, int64_t layer,
                               mha_multihead_options *o) {
    MHA_CHECK(w->bias_k == NULL && w->bias_v == NULL, MHA_ERR_UNSUPPORTED,
              "%s: bias_k/bias_v are not part of a Transformer layer",
              cross ? "multihead_attn" : "self_attn");
    mha_multihead_options_init(o);
    o->num_heads = opt->num_heads;
    o->masked_rows = opt->masked_rows;
    o->training = opt->training;
    o->dropout_p = opt->dropout_p;
    o->seed = opt->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(2 * layer + (cross ? 2 : 1)));
    o->kernel = opt->kernel;
    if (cross) {
        o->attn_mask = masks->memory_mask;
        o->key_padding_mask = masks->memory_key_padding_mask;
    } else {
        o->attn_mask = masks->attn_mask;
        o->key_padding_mask = masks->key_padding_mask;
        o->causal = masks->causal;
    }
    return MHA_OK;
}

/* t = attention(q, kv) with the masks of self (mem = 0) or cross attention. */
static mha_status attention(layer_run *r, const mha_tensor *q, const mha_tensor *kv,
                            const mha_multihead_weights *w, bool cross, int64_t layer) {
    mha_multihead_options o;
    MHA_TRY(attn_options(r->opt, &r->masks, w, cross, layer, &o));
    return mha_multihead_forward_ws(&r->t, q, kv, kv, w, &o, r->ws + r->plan.mha,
                                    r->plan.mha_floats, NULL);
}

static bool dropping(const layer_run *r) { return r->opt->training && r->opt->dropout_p > 0.0f; }

/* o = base + drop(t): the residual, with the sublayer's dropout. */
static void residual(layer_run *r, float *o, const float *base, int64_t layer, int k) {
    float *t = r->t.data;
    const int64_t n = r->N * r->E;
    if (dropping(r))
        mha_dropout_f32(t, t, n, r->opt->dropout_p, r->opt->seed, stream_id(layer, k));
    for (int64_t i = 0; i < n; i++)
        o[i] = base[i] + t[i];
}

static void norm(const layer_run *r, float *y, const float *x, const mha_tensor *w,
                 const mha_tensor *b) {
    mha_layernorm_f32(y, x, r->N, r->E, mha_fdata(w), mha_fdata(b), r->opt->layer_norm_eps);
}

static void feed_forward(layer_run *r, const float *x, const mha_mlp_raw *mlp, int64_t layer,
                         int k) {
    mha_mlp_f32(r->t.data, x, r->N, mlp, r->opt->activation, r->ws + r->plan.h,
                dropping(r) ? r->opt->dropout_p : 0.0f, r->opt->seed, stream_id(layer, k));
}

/* ---- weight checks --------------------------------------------------------- */

static mha_status check_norms(const mha_tensor *const *t, const char *const *names, int n,
                              int64_t E) {
    for (int i = 0; i < n; i++)
        MHA_TRY(mha_vector_check(t[i], names[i], E));
    return MHA_OK;
}

static mha_status encoder_check(const mha_encoder_layer_weights *w, int64_t E, mha_mlp_raw *mlp) {
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "encoder: NULL layer weights");
    mha_mlp_weights m = {w->linear1_weight, w->linear1_bias, w->linear2_weight, w->linear2_bias,
                         NULL, NULL};
    MHA_TRY(mha_mlp_resolve(&m, E, mlp));
    const mha_tensor *t[] = {w->norm1_weight, w->norm1_bias, w->norm2_weight, w->norm2_bias};
    const char *names[] = {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"};
    return check_norms(t, names, 4, E);
}

static mha_status decoder_check(const mha_decoder_layer_weights *w, int64_t E, mha_mlp_raw *mlp) {
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "decoder: NULL layer weights");
    mha_mlp_weights m = {w->linear1_weight, w->linear1_bias, w->linear2_weight, w->linear2_bias,
                         NULL, NULL};
    MHA_TRY(mha_mlp_resolve(&m, E, mlp));
    const mha_tensor *t[] = {w->norm1_weight, w->norm1_bias, w->norm2_weight,
                             w->norm2_bias,   w->norm3_weight, w->norm3_bias};
    const char *names[] = {"norm1.weight", "norm1.bias", "norm2.weight",
                           "norm2.bias",   "norm3.weight", "norm3.bias"};
    return check_norms(t, names, 6, E);
}

/* ---- the layers (in place on o, which holds the layer input or is src) ---- */

static mha_status encoder_layer(layer_run *r, float *o, const float *x,
                                const mha_encoder_layer_weights *w, int64_t layer) {
    mha_mlp_raw mlp;
    MHA_TRY(encoder_check(w, r->E, &mlp));
    mha_tensor xv = r->t, nv = r->n;
    xv.data = (void *)x;
    if (r->opt->norm_first) {
        norm(r, nv.data, x, w->norm1_weight, w->norm1_bias);
        MHA_TRY(attention(r, &nv, &nv, &w->self_attn, false, layer));
        residual(r, o, x, layer, 0);
        norm(r, nv.data, o, w->norm2_weight, w->norm2_bias);
        feed_forward(r, nv.data, &mlp, layer, 1);
        residual(r, o, o, layer, 2);
    } else {
        MHA_TRY(attention(r, &xv, &xv, &w->self_attn, false, layer));
        residual(r, o, x, layer, 0);
        norm(r, o, o, w->norm1_weight, w->norm1_bias);
        feed_forward(r, o, &mlp, layer, 1);
        residual(r, o, o, layer, 2);
        norm(r, o, o, w->norm2_weight, w->norm2_bias);
    }
    return MHA_OK;
}

static mha_status decoder_layer(layer_run *r, float *o, const float *x, const mha_tensor *memory,
                                const mha_decoder_layer_weights *w, int64_t layer) {
    mha_mlp_raw mlp;
    MHA_TRY(decoder_check(w, r->E, &mlp));
    mha_tensor xv = r->t, nv = r->n, ov = r->t;
    xv.data = (void *)x;
    ov.data = o;
    if (r->opt->norm_first) {
        norm(r, nv.data, x, w->norm1_weight, w->norm1_bias);
        MHA_TRY(attention(r, &nv, &nv, &w->self_attn, false, layer));
        residual(r, o, x, layer, 0);
        norm(r, nv.data, o, w->norm2_weight, w->norm2_bias);
        MHA_TRY(attention(r, &nv, memory, &w->multihead_attn, true, layer));
        residual(r, o, o, layer, 1);
        norm(r, nv.data, o, w->norm3_weight, w->norm3_bias);
        feed_forward(r, nv.data, &mlp, layer, 2);
        residual(r, o, o, layer, 3);
    } else {
        MHA_TRY(attention(r, &xv, &xv, &w->self_attn, false, layer));
        residual(r, o, x, layer, 0);
        norm(r, o, o, w->norm1_weight, w->norm1_bias);
        MHA_TRY(attention(r, &ov, memory, &w->multihead_attn, true, layer));
        residual(r, o, o, layer, 1);
        norm(r, o, o, w->norm2_weight, w->norm2_bias);
        feed_forward(r, o, &mlp, layer, 2);
        residual(r, o, o, layer, 3);
        norm(r, o, o, w->norm3_weight, w->norm3_bias);
    }
    return MHA_OK;
}

/* out: the same view as x, or apart from it and from memory. */
static mha_status check_out(const mha_tensor *out, const mha_tensor *x, const mha_tensor *memory,
                            const layer_run *r) {
    MHA_TRY(mha_rows_check_out(out, x, "out", r->N, r->E, true));
    MHA_CHECK(out->ndim == x->ndim, MHA_ERR_SHAPE, "out: rank %d, want %d like the input",
              out->ndim, x->ndim);
    if (memory)
        MHA_CHECK(!mha_tensors_overlap(out, memory), MHA_ERR_ALIAS, "out: overlaps memory");
    return MHA_OK;
}

/* ---- public entry points ----------------------------------------------------- */

mha_status mha_encoder_layer_forward(mha_tensor *out, const mha_tensor *src,
                                     const mha_encoder_layer_weights *w,
                                     const mha_layer_masks *masks, const mha_layer_options *opt,
                                     void *workspace, size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    mha_encoder_weights stack = {1, w, 0, NULL, NULL};
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "encoder: NULL layer weights");
    return mha_encoder_forward(out, src, &stack, masks, opt, workspace, workspace_bytes);
}

mha_status mha_decoder_layer_forward(mha_tensor *out, const mha_tensor *tgt,
                                     const mha_tensor *memory, const mha_decoder_layer_weights *w,
                                     const mha_layer_masks *masks, const mha_layer_options *opt,
                                     void *workspace, size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    mha_decoder_weights stack = {1, w, 0, NULL, NULL};
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "decoder: NULL layer weights");
    return mha_decoder_forward(out, tgt, memory, &stack, masks, opt, workspace, workspace_bytes);
}

mha_status mha_encoder_forward(mha_tensor *out, const mha_tensor *src, const mha_encoder_weights *w,
                               const mha_layer_masks *masks, const mha_layer_options *opt,
                               void *workspace, size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    MHA_CHECK(w != NULL && w->layers != NULL, MHA_ERR_NULL, "encoder: NULL weights");
    MHA_CHECK(w->num_layers >= 1, MHA_ERR_VALUE, "encoder: num_layers %lld, want >= 1",
              (long long)w->num_layers);
    int64_t F = 0, B, L, E;
    MHA_TRY(check_seq(src, "src", &B, &L, &E));
    for (int64_t l = 0; l < w->num_layers; l++) {
        mha_mlp_raw mlp;
        MHA_TRY(encoder_check(&w->layers[l], E, &mlp));
        F = mlp.F > F ? mlp.F : F;
    }
    if (w->final_norm) {
        MHA_TRY(mha_vector_check(w->norm_weight, "norm.weight", E));
        MHA_TRY(mha_vector_check(w->norm_bias, "norm.bias", E));
    }
    layer_run r;
    float *owned;
    MHA_TRY(run_begin(&r, src, NULL, F, masks, opt, workspace, workspace_bytes, &owned));
    mha_status st = check_out(out, src, NULL, &r);
    const float *x = src->data;
    for (int64_t l = 0; st == MHA_OK && l < w->num_layers; l++) {
        st = encoder_layer(&r, out->data, x, &w->layers[l], l);
        x = out->data;
    }
    if (st == MHA_OK && w->final_norm)
        norm(&r, out->data, out->data, w->norm_weight, w->norm_bias);
    mha_free(owned);
    return st;
}

mha_status mha_decoder_forward(mha_tensor *out, const mha_tensor *tgt, const mha_tensor *memory,
                               const mha_decoder_weights *w, const mha_layer_masks *masks,
                               const mha_layer_options *opt, void *workspace,
                               size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    MHA_CHECK(w != NULL && w->layers != NULL, MHA_ERR_NULL, "decoder: NULL weights");
    MHA_CHECK(memory != NULL, MHA_ERR_NULL, "memory: NULL tensor");
    MHA_CHECK(w->num_layers >= 1, MHA_ERR_VALUE, "decoder: num_layers %lld, want >= 1",
              (long long)w->num_layers);
    int64_t F = 0, B, L, E;
    MHA_TRY(check_seq(tgt, "tgt", &B, &L, &E));
    for (int64_t l = 0; l < w->num_layers; l++) {
        mha_mlp_raw mlp;
        MHA_TRY(decoder_check(&w->layers[l], E, &mlp));
        F = mlp.F > F ? mlp.F : F;
    }
    if (w->final_norm) {
        MHA_TRY(mha_vector_check(w->norm_weight, "norm.weight", E));
        MHA_TRY(mha_vector_check(w->norm_bias, "norm.bias", E));
    }
    layer_run r;
    float *owned;
    MHA_TRY(run_begin(&r, tgt, memory, F, masks, opt, workspace, workspace_bytes, &owned));
    mha_status st = check_out(out, tgt, memory, &r);
    const float *x = tgt->data;
    for (int64_t l = 0; st == MHA_OK && l < w->num_layers; l++) {
        st = decoder_layer(&r, out->data, x, memory, &w->layers[l], l);
        x = out->data;
    }
    if (st == MHA_OK && w->final_norm)
        norm(&r, out->data, out->data, w->norm_weight, w->norm_bias);
    mha_free(owned);
    return st;
}

/* ============================================================================
 * Training: the forward that saves, and the backward.
 *
 * Saved state of one layer (floats, parts rounded to a 64-byte line):
 *   header  16 floats: magic, B, L, S, E, H (checked by the backward)
 *   s[0..4] (N,E) each: the residual stream at the sublayer boundaries
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
 * ========================================================================== */

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
        p->s[i] = at, at += round_line(ne);
    p->sa = at, p->sa_floats = bytes_floats(sa), at += round_line(p->sa_floats);
    p->ca = at, p->ca_floats = bytes_floats(ca), at += round_line(p->ca_floats);
    p->total = at;
    int64_t mlp_floats = mha_mlp_backward_floats(B * L, F, false);
    MHA_CHECK(mlp_floats >= 0 && mlp_floats < INT64_MAX / 8, MHA_ERR_OVERFLOW,
              "layer: workspace size overflows");
    at = 0;
    p->t = at, at += round_line(ne);
    for (int i = 0; i < 3; i++)
        p->g[i] = at, at += round_line(ne);
    p->mlp = at, at += round_line(mlp_floats);
    p->mbw_floats = bytes_floats(wsa > wca ? wsa : wca);
    p->mbw = at, at += round_line(p->mbw_floats);
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
    char sb[MHA_SHAPE_BUF];
    memset(r, 0, sizeof *r);
    MHA_TRY(mha_layer_check_options(opt));
    MHA_TRY(check_seq(x, memory ? "tgt" : "src", &r->B, &r->L, &r->E));
    r->S = r->L;
    if (memory) {
        int64_t Bm, Em;
        MHA_TRY(check_seq(memory, "memory", &Bm, &r->S, &Em));
        MHA_CHECK(memory->ndim == x->ndim && Bm == r->B && Em == r->E, MHA_ERR_SHAPE,
                  "memory: shape %s does not fit tgt's batch %lld and width %lld",
                  mha_shape_str(memory, sb, sizeof sb), (long long)r->B, (long long)r->E);
    }
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

static bool tr_dropping(const train_run *r) {
    return r->opt->training && r->opt->dropout_p > 0.0f;
}

/* t = SA(q) or CA(q, mem), saving into sa / ca. */
static mha_status tr_attention(train_run *r, const mha_tensor *q, const mha_tensor *kv,
                               const mha_multihead_weights *w, bool cross) {
    mha_multihead_options o;
    MHA_TRY(attn_options(r->opt, &r->masks, w, cross, r->layer, &o));
    mha_tensor t = part(r, r->ws + r->plan.t);
    const int64_t at = cross ? r->plan.ca : r->plan.sa;
    const int64_t n = cross ? r->plan.ca_floats : r->plan.sa_floats;
    return mha_multihead_forward_train(&t, r->saved + at, (size_t)n * sizeof(float), q, kv, kv, w,
                                       &o);
}

/* o = base + drop(t), dropout stream k. */
static void tr_residual(train_run *r, float *o, const float *base, int k) {
    float *t = r->ws + r->plan.t;
    const int64_t n = r->N * r->E;
    if (tr_dropping(r))
        mha_dropout_f32(t, t, n, r->opt->dropout_p, r->opt->seed, stream_id(r->layer, k));
    for (int64_t i = 0; i < n; i++)
        o[i] = base[i] + t[i];
}

static void tr_norm(const train_run *r, float *y, const float *x, const mha_tensor *w,
                    const mha_tensor *b) {
    mha_layernorm_f32(y, x, r->N, r->E, mha_fdata(w), mha_fdata(b), r->opt->layer_norm_eps);
}

static void tr_ff(train_run *r, const float *x, const mha_mlp_raw *mlp, int k) {
    mha_mlp_f32(r->ws + r->plan.t, x, r->N, mlp, r->opt->activation, r->ws + r->plan.mlp,
                tr_dropping(r) ? r->opt->dropout_p : 0.0f, r->opt->seed, stream_id(r->layer, k));
}

/* ---- backward helpers: gradients accumulate ----------------------------------- */

static void zero(const train_run *r, float *g) {
    memset(g, 0, sizeof(float) * (size_t)(r->N * r->E));
}

/* g += drop'(d) of stream k (g += d when not dropping). */
static void drop_bwd(const train_run *r, float *g, const float *d, int k) {
    const int64_t n = r->N * r->E;
    if (tr_dropping(r))
        mha_dropout_backward_f32(g, d, n, r->opt->dropout_p, r->opt->seed, stream_id(r->layer, k));
    else
        for (int64_t i = 0; i < n; i++)
            g[i] += d[i];
}

static void norm_bwd(const train_run *r, float *dx, mha_tensor *dw, mha_tensor *db,
                     const float *dout, const float *x, const mha_tensor *w) {
    mha_layernorm_backward_f32(dx, dw ? dw->data : NULL, db ? db->data : NULL, dout, x,
                               mha_fdata(w), r->N, r->E, r->opt->layer_norm_eps);
}

static void ff_bwd(train_run *r, float *dx, const mha_mlp_raw_grads *g, const float *dout,
                   const float *x, const mha_mlp_raw *mlp, int k) {
    mha_mlp_backward_f32(dx, g, dout, x, r->N, mlp, r->opt->activation, r->ws + r->plan.mlp,
                         tr_dropping(r) ? r->opt->dropout_p : 0.0f, r->opt->seed,
                         stream_id(r->layer, k));
}

/* dq += dL/dq (and dmem += dL/dmem for cross attention) from d, the
 * attention output's gradient. */
static mha_status attn_bwd(train_run *r, float *dq, mha_tensor *dmem,
                           const mha_multihead_grads *g, const float *d, const mha_tensor *q,
                           const mha_tensor *kv, const mha_multihead_weights *w, bool cross) {
    mha_multihead_options o;
    MHA_TRY(attn_options(r->opt, &r->masks, w, cross, r->layer, &o));
    mha_tensor dqv = part(r, dq), dv = part(r, (float *)d);
    const int64_t at = cross ? r->plan.ca : r->plan.sa;
    const int64_t n = cross ? r->plan.ca_floats : r->plan.sa_floats;
    return mha_multihead_backward(&dqv, cross ? dmem : NULL, cross ? dmem : NULL, g, &dv,
                                  r->saved + at, (size_t)n * sizeof(float), q, kv, kv, w, &o,
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

static float *gd(mha_tensor *t) { return t ? (float *)t->data : NULL; }

static mha_status ff_grads(mha_tensor *w1, mha_tensor *b1, mha_tensor *w2, mha_tensor *b2,
                           const mha_tensor *const *ws, mha_mlp_raw_grads *g) {
    MHA_TRY(grad_of(w1, ws[0], "grad linear1.weight"));
    MHA_TRY(grad_of(b1, ws[1], "grad linear1.bias"));
    MHA_TRY(grad_of(w2, ws[2], "grad linear2.weight"));
    MHA_TRY(grad_of(b2, ws[3], "grad linear2.bias"));
    *g = (mha_mlp_raw_grads){gd(w1), gd(b1), gd(w2), gd(b2), NULL, NULL};
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

/* ---- encoder layer ---------------------------------------------------------------- */

mha_status mha_encoder_layer_forward_train_at(mha_tensor *out, void *saved, size_t saved_bytes,
                                              const mha_tensor *src,
                                              const mha_encoder_layer_weights *w,
                                              const mha_layer_masks *masks,
                                              const mha_layer_options *opt, void *workspace,
                                              size_t workspace_bytes, int64_t layer) {
    mha_mlp_raw mlp;
    train_run r;
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "encoder: NULL layer weights");
    MHA_CHECK(src != NULL, MHA_ERR_NULL, "src: NULL tensor");
    MHA_TRY(encoder_check(w, src->ndim ? src->shape[src->ndim - 1] : 0, &mlp));
    MHA_TRY(train_begin(&r, src, NULL, mlp.F, saved, saved_bytes, false, masks, opt, workspace,
                        workspace_bytes, layer));
    mha_status st = mha_rows_check_out(out, src, "out", r.N, r.E, false);
    if (st == MHA_OK && out->ndim != src->ndim)
        st = mha_error(MHA_ERR_SHAPE, "out: rank %d, want %d like src", out->ndim, src->ndim);
    float *o = st == MHA_OK ? out->data : NULL;
    const float *x = src->data;
    if (st == MHA_OK && opt->norm_first) {
        mha_tensor n1 = part(&r, S_(&r, 0));
        tr_norm(&r, S_(&r, 0), x, w->norm1_weight, w->norm1_bias);
        st = tr_attention(&r, &n1, &n1, &w->self_attn, false);
        if (st == MHA_OK) {
            tr_residual(&r, S_(&r, 1), x, 0);
            tr_norm(&r, S_(&r, 2), S_(&r, 1), w->norm2_weight, w->norm2_bias);
            tr_ff(&r, S_(&r, 2), &mlp, 1);
            tr_residual(&r, o, S_(&r, 1), 2);
        }
    } else if (st == MHA_OK) {
        st = tr_attention(&r, src, src, &w->self_attn, false);
        if (st == MHA_OK) {
            tr_residual(&r, S_(&r, 0), x, 0);
            tr_norm(&r, S_(&r, 1), S_(&r, 0), w->norm1_weight, w->norm1_bias);
            tr_ff(&r, S_(&r, 1), &mlp, 1);
            tr_residual(&r, S_(&r, 2), S_(&r, 1), 2);
            tr_norm(&r, o, S_(&r, 2), w->norm2_weight, w->norm2_bias);
        }
    }
    mha_free(r.owned);
    return st;
}

mha_status mha_encoder_layer_backward_at(mha_tensor *dsrc, const mha_encoder_layer_grads *grads,
                                         const mha_tensor *dout, const void *saved,
                                         size_t saved_bytes, const mha_tensor *src,
                                         const mha_encoder_layer_weights *w,
                                         const mha_layer_masks *masks,
                                         const mha_layer_options *opt, void *workspace,
                                         size_t workspace_bytes, int64_t layer) {
    mha_mlp_raw mlp;
    train_run r;
    mha_encoder_layer_grads none;
    memset(&none, 0, sizeof none);
    const mha_encoder_layer_grads *g = grads ? grads : &none;
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "encoder: NULL layer weights");
    MHA_CHECK(src != NULL && dout != NULL, MHA_ERR_NULL, "src/dout: NULL tensor");
    MHA_TRY(encoder_check(w, src->ndim ? src->shape[src->ndim - 1] : 0, &mlp));
    const mha_tensor *lw[4] = {w->linear1_weight, w->linear1_bias, w->linear2_weight,
                               w->linear2_bias};
    mha_mlp_raw_grads fg;
    MHA_TRY(ff_grads(g->linear1_weight, g->linear1_bias, g->linear2_weight, g->linear2_bias, lw,
                     &fg));
    MHA_TRY(grad_of(g->norm1_weight, w->norm1_weight, "grad norm1.weight"));
    MHA_TRY(grad_of(g->norm1_bias, w->norm1_bias, "grad norm1.bias"));
    MHA_TRY(grad_of(g->norm2_weight, w->norm2_weight, "grad norm2.weight"));
    MHA_TRY(grad_of(g->norm2_bias, w->norm2_bias, "grad norm2.bias"));
    MHA_TRY(dinput_check(dsrc, src, "dsrc"));
    MHA_TRY(dinput_check(dout, src, "dout"));
    MHA_TRY(train_begin(&r, src, NULL, mlp.F, saved, saved_bytes, true, masks, opt, workspace,
                        workspace_bytes, layer));
    MHA_CHECK(!dsrc || !mha_tensors_overlap(dsrc, dout), MHA_ERR_ALIAS, "dsrc: overlaps dout");
    float *gA = G_(&r, 0), *gB = G_(&r, 1), *gC = G_(&r, 2);
    const float *dy = dout->data;
    const int64_t n = r.N * r.E;
    mha_status st;
    float *dx = dsrc ? dsrc->data : NULL;
    if (opt->norm_first) {
        /* out = x1 + drop(FF(n2));  n2 = LN2(x1);  x1 = x + drop(SA(n1));  n1 = LN1(x) */
        memcpy(gB, dy, sizeof(float) * (size_t)n);                /* dx1 (residual) */
        zero(&r, gC), drop_bwd(&r, gC, dy, 2);                    /* d FF out */
        zero(&r, gA), ff_bwd(&r, gA, &fg, gC, S_(&r, 2), &mlp, 1); /* d n2 */
        norm_bwd(&r, gB, g->norm2_weight, g->norm2_bias, gA, S_(&r, 1), w->norm2_weight);
        if (dx)
            for (int64_t i = 0; i < n; i++)
                dx[i] += gB[i];                                   /* residual to x */
        zero(&r, gC), drop_bwd(&r, gC, gB, 0);                    /* d SA out */
        mha_tensor n1 = part(&r, S_(&r, 0));
        zero(&r, gA);
        st = attn_bwd(&r, gA, NULL, &g->self_attn, gC, &n1, &n1, &w->self_attn, false);
        if (st == MHA_OK) /* dx NULL: only the norm's weight gradients */
            norm_bwd(&r, dx, g->norm1_weight, g->norm1_bias, gA, src->data, w->norm1_weight);
    } else {
        /* out = LN2(u2);  u2 = x1 + drop(FF(x1));  x1 = LN1(u1);  u1 = x + drop(SA(x)) */
        zero(&r, gA);
        norm_bwd(&r, gA, g->norm2_weight, g->norm2_bias, dy, S_(&r, 2), w->norm2_weight);
        memcpy(gB, gA, sizeof(float) * (size_t)n);               /* dx1 (residual) */
        zero(&r, gC), drop_bwd(&r, gC, gA, 2);
        ff_bwd(&r, gB, &fg, gC, S_(&r, 1), &mlp, 1);             /* dx1 complete */
        zero(&r, gA);
        norm_bwd(&r, gA, g->norm1_weight, g->norm1_bias, gB, S_(&r, 0), w->norm1_weight);
        if (dx)
            for (int64_t i = 0; i < n; i++)
                dx[i] += gA[i];
        zero(&r, gC), drop_bwd(&r, gC, gA, 0);
        /* SA backward into dsrc directly (or a scratch when dsrc is NULL,
         * for the weight gradients) */
        zero(&r, gB);
        st = attn_bwd(&r, dx ? dx : gB, NULL, &g->self_attn, gC, src, src, &w->self_attn, false);
    }
    mha_free(r.owned);
    return st;
}

/* ---- decoder layer ----------------------------------------------------------------- */

static mha_status decoder_grads(const mha_decoder_layer_grads *g, const mha_decoder_layer_weights *w,
                                mha_mlp_raw_grads *fg) {
    const mha_tensor *lw[4] = {w->linear1_weight, w->linear1_bias, w->linear2_weight,
                               w->linear2_bias};
    MHA_TRY(ff_grads(g->linear1_weight, g->linear1_bias, g->linear2_weight, g->linear2_bias, lw,
                     fg));
    MHA_TRY(grad_of(g->norm1_weight, w->norm1_weight, "grad norm1.weight"));
    MHA_TRY(grad_of(g->norm1_bias, w->norm1_bias, "grad norm1.bias"));
    MHA_TRY(grad_of(g->norm2_weight, w->norm2_weight, "grad norm2.weight"));
    MHA_TRY(grad_of(g->norm2_bias, w->norm2_bias, "grad norm2.bias"));
    MHA_TRY(grad_of(g->norm3_weight, w->norm3_weight, "grad norm3.weight"));
    MHA_TRY(grad_of(g->norm3_bias, w->norm3_bias, "grad norm3.bias"));
    return MHA_OK;
}

mha_status mha_decoder_layer_forward_train_at(mha_tensor *out, void *saved, size_t saved_bytes,
                                              const mha_tensor *tgt, const mha_tensor *memory,
                                              const mha_decoder_layer_weights *w,
                                              const mha_layer_masks *masks,
                                              const mha_layer_options *opt, void *workspace,
                                              size_t workspace_bytes, int64_t layer) {
    mha_mlp_raw mlp;
    train_run r;
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "decoder: NULL layer weights");
    MHA_CHECK(tgt != NULL && memory != NULL, MHA_ERR_NULL, "tgt/memory: NULL tensor");
    MHA_TRY(decoder_check(w, tgt->ndim ? tgt->shape[tgt->ndim - 1] : 0, &mlp));
    MHA_TRY(train_begin(&r, tgt, memory, mlp.F, saved, saved_bytes, false, masks, opt, workspace,
                        workspace_bytes, layer));
    mha_status st = mha_rows_check_out(out, tgt, "out", r.N, r.E, false);
    if (st == MHA_OK && out->ndim != tgt->ndim)
        st = mha_error(MHA_ERR_SHAPE, "out: rank %d, want %d like tgt", out->ndim, tgt->ndim);
    if (st == MHA_OK && mha_tensors_overlap(out, memory))
        st = mha_error(MHA_ERR_ALIAS, "out: overlaps memory");
    float *o = st == MHA_OK ? out->data : NULL;
    const float *x = tgt->data;
    if (st == MHA_OK && opt->norm_first) {
        mha_tensor n1 = part(&r, S_(&r, 0)), n2 = part(&r, S_(&r, 2));
        tr_norm(&r, S_(&r, 0), x, w->norm1_weight, w->norm1_bias);
        st = tr_attention(&r, &n1, &n1, &w->self_attn, false);
        if (st == MHA_OK) {
            tr_residual(&r, S_(&r, 1), x, 0);
            tr_norm(&r, S_(&r, 2), S_(&r, 1), w->norm2_weight, w->norm2_bias);
            st = tr_attention(&r, &n2, memory, &w->multihead_attn, true);
        }
        if (st == MHA_OK) {
            tr_residual(&r, S_(&r, 3), S_(&r, 1), 1);
            tr_norm(&r, S_(&r, 4), S_(&r, 3), w->norm3_weight, w->norm3_bias);
            tr_ff(&r, S_(&r, 4), &mlp, 2);
            tr_residual(&r, o, S_(&r, 3), 3);
        }
    } else if (st == MHA_OK) {
        mha_tensor x1 = part(&r, S_(&r, 1));
        st = tr_attention(&r, tgt, tgt, &w->self_attn, false);
        if (st == MHA_OK) {
            tr_residual(&r, S_(&r, 0), x, 0);
            tr_norm(&r, S_(&r, 1), S_(&r, 0), w->norm1_weight, w->norm1_bias);
            st = tr_attention(&r, &x1, memory, &w->multihead_attn, true);
        }
        if (st == MHA_OK) {
            tr_residual(&r, S_(&r, 2), S_(&r, 1), 1);
            tr_norm(&r, S_(&r, 3), S_(&r, 2), w->norm2_weight, w->norm2_bias);
            tr_ff(&r, S_(&r, 3), &mlp, 2);
            tr_residual(&r, S_(&r, 4), S_(&r, 3), 3);
            tr_norm(&r, o, S_(&r, 4), w->norm3_weight, w->norm3_bias);
        }
    }
    mha_free(r.owned);
    return st;
}

mha_status mha_decoder_layer_backward_at(mha_tensor *dtgt, mha_tensor *dmemory,
                                         const mha_decoder_layer_grads *grads,
                                         const mha_tensor *dout, const void *saved,
                                         size_t saved_bytes, const mha_tensor *tgt,
                                         const mha_tensor *memory,
                                         const mha_decoder_layer_weights *w,
                                         const mha_layer_masks *masks,
                                         const mha_layer_options *opt, void *workspace,
                                         size_t workspace_bytes, int64_t layer) {
    mha_mlp_raw mlp;
    train_run r;
    mha_decoder_layer_grads none;
    memset(&none, 0, sizeof none);
    const mha_decoder_layer_grads *g = grads ? grads : &none;
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "decoder: NULL layer weights");
    MHA_CHECK(tgt != NULL && memory != NULL && dout != NULL, MHA_ERR_NULL,
              "tgt/memory/dout: NULL tensor");
    MHA_TRY(decoder_check(w, tgt->ndim ? tgt->shape[tgt->ndim - 1] : 0, &mlp));
    mha_mlp_raw_grads fg;
    MHA_TRY(decoder_grads(g, w, &fg));
    MHA_TRY(dinput_check(dtgt, tgt, "dtgt"));
    MHA_TRY(dinput_check(dout, tgt, "dout"));
    MHA_TRY(dinput_check(dmemory, memory, "dmemory"));
    MHA_TRY(train_begin(&r, tgt, memory, mlp.F, saved, saved_bytes, true, masks, opt, workspace,
                        workspace_bytes, layer));
    MHA_CHECK(!dtgt || !mha_tensors_overlap(dtgt, dout), MHA_ERR_ALIAS, "dtgt: overlaps dout");
    MHA_CHECK(!dmemory || (!mha_tensors_overlap(dmemory, dout) && !mha_tensors_overlap(dmemory, tgt) &&
                           (!dtgt || !mha_tensors_overlap(dmemory, dtgt))),
              MHA_ERR_ALIAS, "dmemory: overlaps another argument");
    float *gA = G_(&r, 0), *gB = G_(&r, 1), *gC = G_(&r, 2);
    const float *dy = dout->data;
    const int64_t n = r.N * r.E;
    float *dx = dtgt ? dtgt->data : NULL;
    mha_status st;
    if (opt->norm_first) {
        /* out = x2 + drop(FF(n3)); n3 = LN3(x2); x2 = x1 + drop(CA(n2, mem));
         * n2 = LN2(x1); x1 = x + drop(SA(n1)); n1 = LN1(x) */
        memcpy(gB, dy, sizeof(float) * (size_t)n);                 /* dx2 */
        zero(&r, gC), drop_bwd(&r, gC, dy, 3);
        zero(&r, gA), ff_bwd(&r, gA, &fg, gC, S_(&r, 4), &mlp, 2);  /* d n3 */
        norm_bwd(&r, gB, g->norm3_weight, g->norm3_bias, gA, S_(&r, 3), w->norm3_weight);
        zero(&r, gC), drop_bwd(&r, gC, gB, 1);                     /* d CA out */
        mha_tensor n2 = part(&r, S_(&r, 2)), n1 = part(&r, S_(&r, 0));
        zero(&r, gA);
        st = attn_bwd(&r, gA, dmemory, &g->multihead_attn, gC, &n2, memory, &w->multihead_attn,
                      true);                                       /* d n2 */
        if (st == MHA_OK) {
            norm_bwd(&r, gB, g->norm2_weight, g->norm2_bias, gA, S_(&r, 1), w->norm2_weight);
            if (dx)
                for (int64_t i = 0; i < n; i++)
                    dx[i] += gB[i];
            zero(&r, gC), drop_bwd(&r, gC, gB, 0);
            zero(&r, gA);
            st = attn_bwd(&r, gA, NULL, &g->self_attn, gC, &n1, &n1, &w->self_attn, false);
        }
        if (st == MHA_OK)
            norm_bwd(&r, dx, g->norm1_weight, g->norm1_bias, gA, tgt->data, w->norm1_weight);
    } else {
        /* out = LN3(u3); u3 = x2 + drop(FF(x2)); x2 = LN2(u2);
         * u2 = x1 + drop(CA(x1, mem)); x1 = LN1(u1); u1 = x + drop(SA(x)) */
        zero(&r, gA);
        norm_bwd(&r, gA, g->norm3_weight, g->norm3_bias, dy, S_(&r, 4), w->norm3_weight);
        memcpy(gB, gA, sizeof(float) * (size_t)n);
        zero(&r, gC), drop_bwd(&r, gC, gA, 3);
        ff_bwd(&r, gB, &fg, gC, S_(&r, 3), &mlp, 2);                /* dx2 */
        zero(&r, gA);
        norm_bwd(&r, gA, g->norm2_weight, g->norm2_bias, gB, S_(&r, 2), w->norm2_weight);
        memcpy(gB, gA, sizeof(float) * (size_t)n);                 /* dx1 (residual) */
        zero(&r, gC), drop_bwd(&r, gC, gA, 1);
        mha_tensor x1 = part(&r, S_(&r, 1));
        st = attn_bwd(&r, gB, dmemory, &g->multihead_attn, gC, &x1, memory, &w->multihead_attn,
                      true);                                       /* dx1 complete */
        if (st == MHA_OK) {
            zero(&r, gA);
            norm_bwd(&r, gA, g->norm1_weight, g->norm1_bias, gB, S_(&r, 0), w->norm1_weight);
            if (dx)
                for (int64_t i = 0; i < n; i++)
                    dx[i] += gA[i];
            zero(&r, gC), drop_bwd(&r, gC, gA, 0);
            zero(&r, gB);
            st = attn_bwd(&r, dx ? dx : gB, NULL, &g->self_attn, gC, tgt, tgt, &w->self_attn,
                          false);
        }
    }
    mha_free(r.owned);
    return st;
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
    return mha_decoder_layer_forward_train_at(out, saved, saved_bytes, tgt, memory, w, masks, opt,
                                              workspace, workspace_bytes, 0);
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
    return mha_decoder_layer_backward_at(dtgt, dmemory, grads, dout, saved, saved_bytes, tgt,
                                         memory, w, masks, opt, workspace, workspace_bytes, 0);
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
    p->layer_saved = round_line(t.total), p->layer_ws = round_line(t.ws_total);
    int64_t ne = round_line(p->N * E), a, b;
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
    MHA_TRY(check_seq(x, memory ? "tgt" : "src", &B, &L, &E));
    S = L;
    if (memory) {
        int64_t Bm, Em;
        MHA_TRY(check_seq(memory, "memory", &Bm, &S, &Em));
    }
    MHA_TRY(plan_stack(NL, B, L, S, E, F, opt->num_heads, p));
    MHA_CHECK(saved_bytes >= (size_t)p->total_saved * sizeof(float), MHA_ERR_VALUE,
              "saved: %zu bytes, the stack needs %zu", saved_bytes,
              (size_t)p->total_saved * sizeof(float));
    size_t need = (size_t)p->total_ws * sizeof(float);
    return mha_workspace_get(workspace, workspace_bytes, need, "stack", ws, owned);
}

static mha_status stack_forward_train(mha_tensor *out, void *saved, size_t saved_bytes,
                                      const mha_tensor *x, const mha_tensor *memory,
                                      const mha_encoder_weights *ew, const mha_decoder_weights *dw,
                                      const mha_layer_masks *masks, const mha_layer_options *opt,
                                      void *workspace, size_t workspace_bytes) {
    const bool dec = dw != NULL;
    const int64_t NL = dec ? dw->num_layers : ew->num_layers;
    const int final_norm = dec ? dw->final_norm : ew->final_norm;
    const mha_tensor *nw = dec ? dw->norm_weight : ew->norm_weight;
    const mha_tensor *nb = dec ? dw->norm_bias : ew->norm_bias;
    MHA_CHECK(x != NULL && saved != NULL, MHA_ERR_NULL, "stack: NULL input or saved buffer");
    MHA_CHECK((uintptr_t)saved % sizeof(float) == 0, MHA_ERR_VALUE, "saved: must be float-aligned");
    int64_t F = 0, B, L, E;
    MHA_TRY(check_seq(x, dec ? "tgt" : "src", &B, &L, &E));
    for (int64_t l = 0; l < NL; l++) {
        mha_mlp_raw mlp;
        MHA_TRY(dec ? decoder_check(&dw->layers[l], E, &mlp) : encoder_check(&ew->layers[l], E, &mlp));
        F = mlp.F > F ? mlp.F : F;
    }
    if (final_norm) {
        MHA_TRY(mha_vector_check(nw, "norm.weight", E));
        MHA_TRY(mha_vector_check(nb, "norm.bias", E));
    }
    stack_plan p;
    float *ws, *owned;
    MHA_TRY(stack_begin(x, memory, NL, F, opt, saved_bytes, workspace, workspace_bytes, &p, &ws,
                        &owned));
    mha_status st = mha_rows_check_out(out, x, "out", p.N, E, false);
    if (st == MHA_OK && out->ndim != x->ndim)
        st = mha_error(MHA_ERR_SHAPE, "out: rank %d, want %d like the input", out->ndim, x->ndim);
    float *sv = saved;
    const int64_t ne = round_line(p.N * E);
    for (int64_t l = 0; st == MHA_OK && l < NL; l++) {
        mha_tensor in = *x, o = *x;
        in.data = l ? sv + (l - 1) * ne : x->data;
        o.data = sv + l * ne;
        float *ls = sv + NL * ne + l * p.layer_saved;
        size_t lsb = (size_t)p.layer_saved * sizeof(float), lwb = (size_t)p.layer_ws * sizeof(float);
        st = dec ? mha_decoder_layer_forward_train_at(&o, ls, lsb, &in, memory, &dw->layers[l],
                                                      masks, opt, ws, lwb, l)
                 : mha_encoder_layer_forward_train_at(&o, ls, lsb, &in, &ew->layers[l], masks,
                                                      opt, ws, lwb, l);
    }
    if (st == MHA_OK) {
        const float *top = sv + (NL - 1) * ne;
        if (final_norm)
            mha_layernorm_f32(out->data, top, p.N, E, mha_fdata(nw), mha_fdata(nb),
                              opt->layer_norm_eps);
        else
            memcpy(out->data, top, sizeof(float) * (size_t)(p.N * E));
    }
    mha_free(owned);
    return st;
}

static mha_status stack_backward(mha_tensor *dx, mha_tensor *dmemory,
                                 const mha_encoder_layer_grads *eg,
                                 const mha_decoder_layer_grads *dg, mha_tensor *dnorm_weight,
                                 mha_tensor *dnorm_bias, const mha_tensor *dout, const void *saved,
                                 size_t saved_bytes, const mha_tensor *x, const mha_tensor *memory,
                                 const mha_encoder_weights *ew, const mha_decoder_weights *dw,
                                 const mha_layer_masks *masks, const mha_layer_options *opt,
                                 void *workspace, size_t workspace_bytes) {
    const bool dec = dw != NULL;
    const int64_t NL = dec ? dw->num_layers : ew->num_layers;
    const int final_norm = dec ? dw->final_norm : ew->final_norm;
    const mha_tensor *nw = dec ? dw->norm_weight : ew->norm_weight;
    MHA_CHECK(x != NULL && dout != NULL && saved != NULL, MHA_ERR_NULL,
              "stack: NULL input, dout or saved buffer");
    int64_t F = 0, B, L, E;
    MHA_TRY(check_seq(x, dec ? "tgt" : "src", &B, &L, &E));
    for (int64_t l = 0; l < NL; l++) {
        mha_mlp_raw mlp;
        MHA_TRY(dec ? decoder_check(&dw->layers[l], E, &mlp) : encoder_check(&ew->layers[l], E, &mlp));
        F = mlp.F > F ? mlp.F : F;
    }
    MHA_TRY(dinput_check(dout, x, "dout"));
    MHA_TRY(dinput_check(dx, x, dec ? "dtgt" : "dsrc"));
    MHA_CHECK(!dx || !mha_tensors_overlap(dx, dout), MHA_ERR_ALIAS, "dx: overlaps dout");
    if (final_norm) {
        MHA_TRY(grad_of(dnorm_weight, nw, "grad norm.weight"));
        MHA_TRY(grad_of(dnorm_bias, dec ? dw->norm_bias : ew->norm_bias, "grad norm.bias"));
    }
    stack_plan p;
    float *ws, *owned;
    MHA_TRY(stack_begin(x, memory, NL, F, opt, saved_bytes, workspace, workspace_bytes, &p, &ws,
                        &owned));
    const float *sv = saved;
    const int64_t ne = round_line(p.N * E), n = p.N * E;
    float *ga = ws + p.layer_ws, *gb = ga + ne;
    memset(ga, 0, sizeof(float) * (size_t)n);
    if (final_norm)
        mha_layernorm_backward_f32(ga, dnorm_weight ? dnorm_weight->data : NULL,
                                   dnorm_bias ? dnorm_bias->data : NULL, dout->data,
                                   sv + (NL - 1) * ne, mha_fdata(nw), p.N, E, opt->layer_norm_eps);
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
        st = dec ? mha_decoder_layer_backward_at(&gin, dmemory, dg ? &dg[l] : NULL, &gout, ls, lsb,
                                                 &in, memory, &dw->layers[l], masks, opt, ws, lwb, l)
                 : mha_encoder_layer_backward_at(&gin, eg ? &eg[l] : NULL, &gout, ls, lsb, &in,
                                                 &ew->layers[l], masks, opt, ws, lwb, l);
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
    return stack_forward_train(out, saved, saved_bytes, src, NULL, w, NULL, masks, opt, workspace,
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
    return stack_forward_train(out, saved, saved_bytes, tgt, memory, NULL, w, masks, opt,
                               workspace, workspace_bytes);
}

mha_status mha_encoder_backward(mha_tensor *dsrc, const mha_encoder_grads *grads,
                                const mha_tensor *dout, const void *saved, size_t saved_bytes,
                                const mha_tensor *src, const mha_encoder_weights *w,
                                const mha_layer_masks *masks, const mha_layer_options *opt,
                                void *workspace, size_t workspace_bytes) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    MHA_CHECK(w != NULL && w->layers != NULL, MHA_ERR_NULL, "encoder: NULL weights");
    return stack_backward(dsrc, NULL, grads ? grads->layers : NULL, NULL,
                          grads ? grads->norm_weight : NULL, grads ? grads->norm_bias : NULL, dout,
                          saved, saved_bytes, src, NULL, w, NULL, masks, opt, workspace,
                          workspace_bytes);
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
    return stack_backward(dtgt, dmemory, NULL, grads ? grads->layers : NULL,
                          grads ? grads->norm_weight : NULL, grads ? grads->norm_bias : NULL, dout,
                          saved, saved_bytes, tgt, memory, NULL, w, masks, opt, workspace,
                          workspace_bytes);
}
