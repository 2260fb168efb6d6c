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
    MHA_TRY(mha_multihead_workspace_floats(B, L, S > L ? S : L, E, &p->mha_floats));
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

static mha_status check_options(const mha_layer_options *opt) {
    MHA_CHECK(opt != NULL, MHA_ERR_NULL, "layer: NULL options");
    MHA_CHECK(opt->activation >= MHA_ACT_RELU && opt->activation <= MHA_ACT_SILU, MHA_ERR_VALUE,
              "activation: unknown value %d", (int)opt->activation);
    MHA_CHECK(opt->layer_norm_eps > 0.0f && opt->layer_norm_eps < __builtin_inff(),
              MHA_ERR_VALUE, "layer_norm_eps: %g must be positive and finite",
              (double)opt->layer_norm_eps);
    MHA_CHECK(opt->dropout_p >= 0.0f && opt->dropout_p < 1.0f, MHA_ERR_VALUE,
              "dropout_p: %g must be in [0,1)", (double)opt->dropout_p);
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
    MHA_TRY(check_options(opt));
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
    MHA_TRY(plan_workspace(r->B, r->L, r->S, r->E, F, &r->plan));
    size_t need = (size_t)r->plan.total * sizeof(float);
    if (workspace) {
        MHA_CHECK(workspace_bytes >= need, MHA_ERR_VALUE,
                  "workspace: %zu bytes, the plan needs %zu", workspace_bytes, need);
        MHA_CHECK((uintptr_t)workspace % sizeof(float) == 0, MHA_ERR_VALUE,
                  "workspace: must be float-aligned");
        r->ws = workspace;
    } else {
        r->ws = *owned = mha_malloc(need ? need : 1);
        MHA_CHECK(r->ws != NULL, MHA_ERR_NOMEM, "layer: cannot allocate %zu bytes of workspace",
                  need);
    }
    r->t = *x, r->n = *x;
    r->t.data = r->ws + r->plan.t;
    r->n.data = r->ws + r->plan.n;
    return MHA_OK;
}

/* Streams: 16 per layer; attention dropout seeds differ per layer and module. */
static uint64_t stream_id(int64_t layer, int k) { return (uint64_t)layer * 16u + (uint64_t)k; }

/* t = attention(q, kv) with the masks of self (mem = 0) or cross attention. */
static mha_status attention(layer_run *r, const mha_tensor *q, const mha_tensor *kv,
                            const mha_multihead_weights *w, bool cross, int64_t layer) {
    MHA_CHECK(w->bias_k == NULL && w->bias_v == NULL, MHA_ERR_UNSUPPORTED,
              "%s: bias_k/bias_v are not part of a Transformer layer",
              cross ? "multihead_attn" : "self_attn");
    mha_multihead_options o;
    mha_multihead_options_init(&o);
    o.num_heads = r->opt->num_heads;
    o.masked_rows = r->opt->masked_rows;
    o.training = r->opt->training;
    o.dropout_p = r->opt->dropout_p;
    o.seed = r->opt->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(2 * layer + (cross ? 2 : 1)));
    o.kernel = r->opt->kernel;
    if (cross) {
        o.attn_mask = r->masks.memory_mask;
        o.key_padding_mask = r->masks.memory_key_padding_mask;
    } else {
        o.attn_mask = r->masks.attn_mask;
        o.key_padding_mask = r->masks.key_padding_mask;
        o.causal = r->masks.causal;
    }
    return mha_multihead_forward_ws(&r->t, q, kv, kv, w, &o, r->ws + r->plan.mha,
                                    r->plan.mha_floats);
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
    mha_encoder_weights stack = {1, w, 0, NULL, NULL};
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "encoder: NULL layer weights");
    return mha_encoder_forward(out, src, &stack, masks, opt, workspace, workspace_bytes);
}

mha_status mha_decoder_layer_forward(mha_tensor *out, const mha_tensor *tgt,
                                     const mha_tensor *memory, const mha_decoder_layer_weights *w,
                                     const mha_layer_masks *masks, const mha_layer_options *opt,
                                     void *workspace, size_t workspace_bytes) {
    mha_decoder_weights stack = {1, w, 0, NULL, NULL};
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "decoder: NULL layer weights");
    return mha_decoder_forward(out, tgt, memory, &stack, masks, opt, workspace, workspace_bytes);
}

mha_status mha_encoder_forward(mha_tensor *out, const mha_tensor *src, const mha_encoder_weights *w,
                               const mha_layer_masks *masks, const mha_layer_options *opt,
                               void *workspace, size_t workspace_bytes) {
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
