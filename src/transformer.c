/* transformer.c - torch.nn.TransformerEncoderLayer / TransformerDecoderLayer
 * (batch_first=True) and their stacks nn.TransformerEncoder / Decoder: the
 * inference forward, and the steps both halves share (a layer as its blocks,
 * the weight and sequence checks, the attention options).  The training half
 * (forward_train, backward, the stacks' training) is transformer_train.c.
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
 * Both are one loop over the layer's blocks (mha_layer_parts, layers.h):
 *   post-norm  x = normK(x + drop(sub(x)));  pre-norm  x = x + drop(sub(normK(x)))
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

#include <stdio.h>
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
    MHA_CHECK(opt->kernel >= MHA_KERNEL_AUTO && opt->kernel <= MHA_KERNEL_AVX512, MHA_ERR_VALUE,
              "kernel: unknown kernel %d", (int)opt->kernel);
    return MHA_OK;
}

/* ---- shapes and weights: a layer as its blocks ------------------------------ */

mha_status mha_layer_seq_check(const mha_tensor *t, const char *name, int64_t *B, int64_t *L,
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

mha_status mha_layer_seq_dims(const mha_tensor *x, const mha_tensor *memory, int64_t *B,
                              int64_t *L, int64_t *S, int64_t *E) {
    char sb[MHA_SHAPE_BUF];
    MHA_TRY(mha_layer_seq_check(x, memory ? "tgt" : "src", B, L, E));
    *S = *L;
    if (memory) {
        int64_t Bm, Em;
        MHA_TRY(mha_layer_seq_check(memory, "memory", &Bm, S, &Em));
        MHA_CHECK(memory->ndim == x->ndim && Bm == *B && Em == *E, MHA_ERR_SHAPE,
                  "memory: shape %s does not fit tgt's batch %lld and width %lld",
                  mha_shape_str(memory, sb, sizeof sb), (long long)*B, (long long)*E);
    }
    return MHA_OK;
}

/* Lays out p's blocks from a layer's attention modules (ca NULL for the
 * encoder) and its norms (norm1.weight, norm1.bias, ... in block order). */
static void blocks_fill(mha_layer_parts *p, const mha_multihead_weights *sa,
                        const mha_multihead_weights *ca, const mha_tensor *const *norms) {
    p->n = ca ? 3 : 2;
    p->block[0] = (mha_layer_block){sa, false, norms[0], norms[1]};
    if (ca)
        p->block[1] = (mha_layer_block){ca, true, norms[2], norms[3]};
    p->block[p->n - 1] = (mha_layer_block){NULL, false, norms[2 * p->n - 2], norms[2 * p->n - 1]};
}

void mha_layer_blocks_encoder(const mha_encoder_layer_weights *w, mha_layer_parts *p) {
    const mha_tensor *norms[] = {w->norm1_weight, w->norm1_bias, w->norm2_weight, w->norm2_bias};
    blocks_fill(p, &w->self_attn, NULL, norms);
}

void mha_layer_blocks_decoder(const mha_decoder_layer_weights *w, mha_layer_parts *p) {
    const mha_tensor *norms[] = {w->norm1_weight, w->norm1_bias, w->norm2_weight,
                                 w->norm2_bias,   w->norm3_weight, w->norm3_bias};
    blocks_fill(p, &w->self_attn, &w->multihead_attn, norms);
}

/* Checks the MLP linear1, linear2 (filling p->mlp), then the norms of p's
 * blocks, against width E. */
static mha_status parts_check(mha_layer_parts *p, int64_t E, const mha_tensor *l1w,
                              const mha_tensor *l1b, const mha_tensor *l2w,
                              const mha_tensor *l2b) {
    char name[32];
    const mha_mlp_weights m = {l1w, l1b, l2w, l2b, NULL, NULL};
    MHA_TRY(mha_mlp_resolve(&m, E, &p->mlp));
    for (int k = 0; k < p->n; k++) {
        snprintf(name, sizeof name, "norm%d.weight", k + 1);
        MHA_TRY(mha_vector_check(p->block[k].norm_weight, name, E));
        snprintf(name, sizeof name, "norm%d.bias", k + 1);
        MHA_TRY(mha_vector_check(p->block[k].norm_bias, name, E));
    }
    return MHA_OK;
}

mha_status mha_layer_parts_encoder(const mha_encoder_layer_weights *w, int64_t E,
                                   mha_layer_parts *p) {
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "encoder: NULL layer weights");
    mha_layer_blocks_encoder(w, p);
    return parts_check(p, E, w->linear1_weight, w->linear1_bias, w->linear2_weight,
                       w->linear2_bias);
}

mha_status mha_layer_parts_decoder(const mha_decoder_layer_weights *w, int64_t E,
                                   mha_layer_parts *p) {
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "decoder: NULL layer weights");
    mha_layer_blocks_decoder(w, p);
    return parts_check(p, E, w->linear1_weight, w->linear1_bias, w->linear2_weight,
                       w->linear2_bias);
}

mha_layer_stack mha_layer_stack_encoder(const mha_encoder_weights *w) {
    return (mha_layer_stack){w->num_layers, w->layers, NULL, w->final_norm, w->norm_weight,
                             w->norm_bias};
}

mha_layer_stack mha_layer_stack_decoder(const mha_decoder_weights *w) {
    return (mha_layer_stack){w->num_layers, NULL, w->layers, w->final_norm, w->norm_weight,
                             w->norm_bias};
}

mha_status mha_layer_stack_parts(const mha_layer_stack *s, int64_t l, int64_t E,
                                 mha_layer_parts *p) {
    return s->dec ? mha_layer_parts_decoder(&s->dec[l], E, p)
                  : mha_layer_parts_encoder(&s->enc[l], E, p);
}

mha_status mha_layer_stack_width(const mha_layer_stack *s, int64_t E, int64_t *F) {
    *F = 0;
    for (int64_t l = 0; l < s->num_layers; l++) {
        mha_layer_parts p;
        MHA_TRY(mha_layer_stack_parts(s, l, E, &p));
        *F = p.mlp.F > *F ? p.mlp.F : *F;
    }
    return MHA_OK;
}

mha_status mha_layer_stack_check_norm(const mha_layer_stack *s, int64_t E) {
    if (s->final_norm) {
        MHA_TRY(mha_vector_check(s->norm_weight, "norm.weight", E));
        MHA_TRY(mha_vector_check(s->norm_bias, "norm.bias", E));
    }
    return MHA_OK;
}

/* ---- attention and dropout of a block ---------------------------------------- */

/* Streams: 16 per layer; attention dropout seeds differ per layer and module. */
uint64_t mha_layer_stream(int64_t layer, int k) { return (uint64_t)layer * 16u + (uint64_t)k; }

bool mha_layer_dropping(const mha_layer_options *opt) {
    return opt->training && opt->dropout_p > 0.0f;
}

void mha_layer_residual(float *o, const float *base, float *t, int64_t n,
                        const mha_layer_options *opt, uint64_t stream) {
    if (mha_layer_dropping(opt))
        mha_dropout_f32(t, t, n, opt->dropout_p, opt->seed, stream);
    for (int64_t i = 0; i < n; i++)
        o[i] = base[i] + t[i];
}

int mha_layer_residual_stream(const mha_layer_parts *p, int k) {
    return p->block[k].attn ? k : k + 1;
}

mha_status mha_layer_attn_options(const mha_layer_options *opt, const mha_layer_masks *masks,
                                  const mha_layer_block *b, int64_t layer,
                                  mha_multihead_options *o) {
    const bool cross = b->cross;
    MHA_CHECK(b->attn->bias_k == NULL && b->attn->bias_v == NULL, MHA_ERR_UNSUPPORTED,
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

/* ---- workspace ----------------------------------------------------------- */

typedef struct ws_plan {
    int64_t mha, t, n, h; /* offsets in floats */
    int64_t mha_floats, total;
} ws_plan;

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
    p->t = p->mha + mha_round_line(p->mha_floats);
    p->n = p->t + mha_round_line(ne);
    p->h = p->n + mha_round_line(ne);
    p->total = p->h + mha_round_line(nf);
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
    int64_t B, L, S, E, F, N;
    const mha_layer_options *opt;
    mha_layer_masks masks;
    ws_plan plan;
    float *ws;
    mha_tensor t, n; /* (B,L,E) views of the workspace parts */
} layer_run;

/* Sets up dims, views and the workspace (allocated when the caller gave
 * none: *owned then holds it). */
static mha_status run_begin(layer_run *r, const mha_tensor *x, const mha_tensor *memory,
                            int64_t F, const mha_layer_masks *masks, const mha_layer_options *opt,
                            void *workspace, size_t workspace_bytes, float **owned) {
    memset(r, 0, sizeof *r);
    *owned = NULL;
    MHA_TRY(mha_layer_check_options(opt));
    MHA_TRY(mha_layer_seq_dims(x, memory, &r->B, &r->L, &r->S, &r->E));
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

/* t = block b's attention of q over kv (q itself, or memory). */
static mha_status attention(layer_run *r, const mha_tensor *q, const mha_tensor *kv,
                            const mha_layer_block *b, int64_t layer) {
    mha_multihead_options o;
    MHA_TRY(mha_layer_attn_options(r->opt, &r->masks, b, layer, &o));
    return mha_multihead_forward_ws(&r->t, q, kv, kv, b->attn, &o, r->ws + r->plan.mha,
                                    r->plan.mha_floats, NULL);
}

/* o = base + drop(t): the residual, with the sublayer's dropout. */
static void residual(layer_run *r, float *o, const float *base, int64_t layer, int k) {
    mha_layer_residual(o, base, r->t.data, r->N * r->E, r->opt, mha_layer_stream(layer, k));
}

static void norm(const layer_run *r, float *y, const float *x, const mha_tensor *w,
                 const mha_tensor *b) {
    mha_layernorm_f32(y, x, r->N, r->E, mha_fdata(w), mha_fdata(b), r->opt->layer_norm_eps);
}

static void feed_forward(layer_run *r, const float *x, const mha_mlp_raw *mlp, int64_t layer,
                         int k) {
    mha_mlp_f32(r->t.data, x, r->N, mlp, r->opt->activation, r->ws + r->plan.h,
                mha_layer_dropping(r->opt) ? r->opt->dropout_p : 0.0f, r->opt->seed,
                mha_layer_stream(layer, k));
}

/* ---- one layer, block by block (in place on o, which holds the layer
 * input or is src); a block's input is x for the first block, o after. */
static mha_status layer_forward(layer_run *r, float *o, const float *x, const mha_tensor *memory,
                                const mha_layer_parts *p, int64_t layer) {
    const bool pre = r->opt->norm_first;
    for (int k = 0; k < p->n; k++) {
        const mha_layer_block *b = &p->block[k];
        const float *in = k ? o : x;
        mha_tensor sub = r->t; /* the sublayer's input: normK(in) or in */
        sub.data = pre ? r->n.data : (void *)in;
        if (pre)
            norm(r, sub.data, in, b->norm_weight, b->norm_bias);
        if (b->attn)
            MHA_TRY(attention(r, &sub, b->cross ? memory : &sub, b, layer));
        else
            feed_forward(r, sub.data, &p->mlp, layer, k);
        residual(r, o, in, layer, mha_layer_residual_stream(p, k));
        if (!pre)
            norm(r, o, o, b->norm_weight, b->norm_bias);
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

/* out = stack(x[, memory]): every layer in place on out, then the final norm. */
static mha_status stack_forward(mha_tensor *out, const mha_tensor *x, const mha_tensor *memory,
                                const mha_layer_stack *s, const mha_layer_masks *masks,
                                const mha_layer_options *opt, void *workspace,
                                size_t workspace_bytes) {
    int64_t F, B, L, E;
    MHA_TRY(mha_layer_seq_check(x, memory ? "tgt" : "src", &B, &L, &E));
    MHA_TRY(mha_layer_stack_width(s, E, &F));
    MHA_TRY(mha_layer_stack_check_norm(s, E));
    layer_run r;
    float *owned;
    MHA_TRY(run_begin(&r, x, memory, F, masks, opt, workspace, workspace_bytes, &owned));
    mha_status st = check_out(out, x, memory, &r);
    const float *in = x->data;
    for (int64_t l = 0; st == MHA_OK && l < s->num_layers; l++) {
        mha_layer_parts p;
        st = mha_layer_stack_parts(s, l, r.E, &p);
        if (st == MHA_OK)
            st = layer_forward(&r, out->data, in, memory, &p, l);
        in = out->data;
    }
    if (st == MHA_OK && s->final_norm)
        norm(&r, out->data, out->data, s->norm_weight, s->norm_bias);
    mha_free(owned);
    return st;
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
    const mha_layer_stack s = mha_layer_stack_encoder(w);
    return stack_forward(out, src, NULL, &s, masks, opt, workspace, workspace_bytes);
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
    const mha_layer_stack s = mha_layer_stack_decoder(w);
    return stack_forward(out, tgt, memory, &s, masks, opt, workspace, workspace_bytes);
}
