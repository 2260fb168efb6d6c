/* decoder_decode.c - token-by-token decoding through a TransformerDecoder
 * stack: each layer's self-attention K/V go to a KV cache, the memory's
 * cross-attention K/V are projected once when the cache is made.
 *
 * Letter legend: B batch, S memory length, E model width, H heads, d = E/H,
 * T tokens decoded so far (<= capacity).
 *
 * One step, per layer (PyTorch's TransformerDecoderLayer, eval mode):
 *   post-norm:  h1 = norm1(x + SA(x));  h2 = norm2(h1 + CA(h1));
 *               y = norm3(h2 + FF(h2))
 *   pre-norm:   h1 = x + SA(norm1(x));  h2 = h1 + CA(norm2(h1));
 *               y = h2 + FF(norm3(h2))
 * SA: q, k, v = x W^T + b for the new token; k, v appended to the layer's
 * cache; mha_attention_decode; out_proj.  CA: q projection, attention over
 * the memory K/V (B,H,S,d) views of the precomputed (B,S,E) projections,
 * out_proj.  The result equals the last row of mha_decoder_forward with a
 * causal target mask over the whole sequence (tests/unit/test_decode.c).
 */
#include "internal.h"
#include "layers.h"

#include <string.h>

struct mha_decoder_cache {
    int64_t layers, B, S, E, H, capacity;
    mha_kv_cache **self;   /* per layer                                    */
    float *mem_kv;         /* per layer: K (B,S,E) then V (B,S,E)           */
    float *scratch;        /* 8 x (B,E) rows                                */
    char *undo;            /* per layer: the self cache's next slot (2 x (B,E) float32) */
    int64_t *undo_pos;     /* per layer: the self cache's position before a step */
};

/* Rows [r0, r0 + n) of a (3E,E) packed weight or the separate one. */
static mha_tensor rows_of(const mha_tensor *packed, const mha_tensor *sep, int64_t r0,
                          int64_t n) {
    if (!packed)
        return *sep;
    mha_tensor t = *packed;
    t.data = (float *)packed->data + r0 * packed->stride[0];
    t.shape[0] = n;
    return t;
}

static mha_tensor vec_of(const mha_tensor *b, int64_t off, int64_t n) {
    mha_tensor t = *b;
    t.data = (float *)b->data + off * (b->ndim ? b->stride[b->ndim - 1] : 1);
    t.ndim = 1;
    t.shape[0] = n;
    t.stride[0] = b->stride[b->ndim - 1];
    return t;
}

/* y (N,E) = x (N,in) W[r0:r0+E]^T + b[r0:r0+E] of an attention block. */
static mha_status project(mha_tensor *y, const mha_tensor *x, const mha_multihead_weights *w,
                          int which, int64_t E) {
    const mha_tensor *sep = which == 0 ? w->q_proj_weight : which == 1 ? w->k_proj_weight
                                                                       : w->v_proj_weight;
    MHA_CHECK(w->in_proj_weight || sep, MHA_ERR_NULL, "decoder: attention weights missing");
    mha_tensor W = rows_of(w->in_proj_weight, sep, which * E, E);
    mha_tensor bias;
    if (w->in_proj_bias)
        bias = vec_of(w->in_proj_bias, which * E, E);
    return mha_linear_forward(y, x, &W, w->in_proj_bias ? &bias : NULL);
}

static mha_tensor rows2(float *data, int64_t N, int64_t E) {
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, data, 2, (int64_t[]){N, E});
    return t;
}

/* (B,E) rows viewed as (B,H,1,d) */
static mha_tensor heads1(float *data, int64_t B, int64_t H, int64_t E) {
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, data, 4, (int64_t[]){B, H, 1, E / H});
    t.stride[0] = E, t.stride[1] = E / H, t.stride[2] = E, t.stride[3] = 1;
    return t;
}

mha_status mha_decoder_cache_create(mha_decoder_cache **cache, const mha_decoder_weights *w,
                                    const mha_tensor *memory, int64_t num_heads,
                                    int64_t capacity) {
    char sb[MHA_SHAPE_BUF];
    MHA_CHECK(cache && w && w->layers, MHA_ERR_NULL, "decoder cache: NULL argument");
    *cache = NULL;
    MHA_TRY(mha_check_tensor(memory, "memory", 3, MHA_F32));
    const int64_t B = memory->shape[0], S = memory->shape[1], E = memory->shape[2];
    MHA_CHECK(w->num_layers >= 1 && num_heads > 0 && E % num_heads == 0 && B > 0 && S > 0,
              MHA_ERR_SHAPE, "decoder cache: %lld layers, %lld heads, memory %s",
              (long long)w->num_layers, (long long)num_heads, mha_shape_str(memory, sb, sizeof sb));
    mha_decoder_cache *c = mha_calloc(1, sizeof *c);
    MHA_CHECK(c, MHA_ERR_NOMEM, "decoder cache: cannot allocate");
    c->layers = w->num_layers, c->B = B, c->S = S, c->E = E, c->H = num_heads;
    c->capacity = capacity;
    c->self = mha_calloc((size_t)c->layers, sizeof *c->self);
    c->mem_kv = mha_malloc(sizeof(float) * (size_t)(c->layers * 2 * B * S * E));
    c->scratch = mha_malloc(sizeof(float) * (size_t)(8 * B * E));
    c->undo = mha_malloc(sizeof(float) * (size_t)(c->layers * 2 * B * E));
    c->undo_pos = mha_malloc(sizeof(int64_t) * (size_t)c->layers);
    mha_status st = c->self && c->mem_kv && c->scratch && c->undo && c->undo_pos
                        ? MHA_OK
                        : mha_error(MHA_ERR_NOMEM, "decoder cache: cannot allocate");
    mha_tensor mem2 = *memory; /* (B*S, E) rows, contiguous required */
    if (st == MHA_OK && !(memory->stride[2] == 1 && memory->stride[1] == E &&
                          memory->stride[0] == S * E))
        st = mha_error(MHA_ERR_SHAPE, "memory: must be contiguous");
    mem2.ndim = 2, mem2.shape[0] = B * S, mem2.shape[1] = E, mem2.stride[0] = E;
    mem2.stride[1] = 1;
    for (int64_t l = 0; st == MHA_OK && l < c->layers; l++) {
        st = mha_kv_cache_create(&c->self[l], MHA_F32, B, num_heads, capacity, E / num_heads,
                                 E / num_heads, 0);
        for (int which = 1; st == MHA_OK && which <= 2; which++) { /* memory K, V once */
            mha_tensor y = rows2(c->mem_kv + (l * 2 + which - 1) * B * S * E, B * S, E);
            st = project(&y, &mem2, &w->layers[l].multihead_attn, which, E);
        }
    }
    if (st != MHA_OK) {
        mha_decoder_cache_free(c);
        return st;
    }
    *cache = c;
    return MHA_OK;
}

const mha_kv_cache *mha_decoder_cache_layer(const mha_decoder_cache *c, int64_t l) {
    return c && l >= 0 && l < c->layers ? c->self[l] : NULL;
}

void mha_decoder_cache_free(mha_decoder_cache *c) {
    if (!c)
        return;
    for (int64_t l = 0; c->self && l < c->layers; l++)
        mha_kv_cache_free(c->self[l]);
    mha_free(c->self);
    mha_free(c->mem_kv);
    mha_free(c->scratch);
    mha_free(c->undo);
    mha_free(c->undo_pos);
    mha_free(c);
}

/* t (B,E) = out_proj(attention): self (cache) or cross (memory of layer l). */
static mha_status attend(const mha_decoder_cache *c, int64_t l, bool cross, const float *x,
                         const mha_multihead_weights *w, float *q, float *k, float *v, float *a,
                         float *t, const mha_layer_options *opt) {
    const int64_t B = c->B, E = c->E, H = c->H, S = c->S;
    mha_tensor X = rows2((float *)x, B, E), Qr = rows2(q, B, E);
    MHA_TRY(project(&Qr, &X, w, 0, E));
    mha_tensor Q = heads1(q, B, H, E), A = heads1(a, B, H, E);
    mha_sdpa_options so;
    mha_sdpa_options_init(&so);
    so.kernel = opt->kernel;
    if (!cross) {
        mha_tensor Kr = rows2(k, B, E), Vr = rows2(v, B, E);
        MHA_TRY(project(&Kr, &X, w, 1, E));
        MHA_TRY(project(&Vr, &X, w, 2, E));
        mha_tensor K = heads1(k, B, H, E), V = heads1(v, B, H, E);
        MHA_TRY(mha_kv_cache_append(c->self[l], &K, &V));
        MHA_TRY(mha_attention_decode(&A, &Q, c->self[l], &so));
    } else {
        const float *mk = c->mem_kv + l * 2 * B * S * E, *mv = mk + B * S * E;
        mha_tensor K, V;
        mha_tensor_init(&K, MHA_F32, (void *)mk, 4, (int64_t[]){B, H, S, E / H});
        K.stride[0] = S * E, K.stride[1] = E / H, K.stride[2] = E, K.stride[3] = 1;
        V = K;
        V.data = (void *)mv;
        MHA_TRY(mha_sdpa_forward(&A, &Q, &K, &V, &so));
    }
    mha_tensor Ar = rows2(a, B, E), T = rows2(t, B, E);
    return mha_linear_forward(&T, &Ar, w->out_proj_weight, w->out_proj_bias);
}

static mha_status layer_norm(float *y, const float *x, int64_t B, int64_t E, const mha_tensor *w,
                             const mha_tensor *b, float eps) {
    mha_tensor Y = rows2(y, B, E), X = rows2((float *)x, B, E);
    return mha_layernorm_forward(&Y, &X, w, b, eps);
}

static mha_status ff(float *t, const float *x, int64_t B, int64_t E,
                     const mha_decoder_layer_weights *lw, mha_activation act) {
    mha_mlp_weights m = {lw->linear1_weight, lw->linear1_bias, lw->linear2_weight,
                         lw->linear2_bias, NULL, NULL};
    mha_tensor T = rows2(t, B, E), X = rows2((float *)x, B, E);
    return mha_mlp_forward(&T, &X, &m, act, NULL, 0);
}

static void add(float *o, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        o[i] = a[i] + b[i];
}

/* The layers of one step: h (B,E) holds x on entry and the result on exit.
 * Appends the token's K/V to every layer's self cache. */
static mha_status decode_layers(float *h, const mha_decoder_weights *w, mha_decoder_cache *c,
                                const mha_layer_options *opt) {
    const int64_t B = c->B, E = c->E, n = B * E;
    float *nrm = h + n, *t = nrm + n, *q = t + n, *k = q + n, *v = k + n, *a = v + n, *h2 = a + n;
    const float eps = opt->layer_norm_eps;
    for (int64_t l = 0; l < c->layers; l++) {
        const mha_decoder_layer_weights *lw = &w->layers[l];
        mha_layer_parts p; /* self attention, cross attention, MLP (layers.h) */
        mha_layer_blocks_decoder(lw, &p);
        for (int s = 0; s < p.n; s++) {
            const mha_layer_block *b = &p.block[s];
            const float *in = opt->norm_first ? nrm : h; /* the sublayer's input */
            if (opt->norm_first)
                MHA_TRY(layer_norm(nrm, h, B, E, b->norm_weight, b->norm_bias, eps));
            if (b->attn)
                MHA_TRY(attend(c, l, b->cross, in, b->attn, q, k, v, a, t, opt));
            else
                MHA_TRY(ff(t, in, B, E, lw, opt->activation));
            if (opt->norm_first) {
                add(h, h, t, n);
            } else {
                add(h2, h, t, n);
                MHA_TRY(layer_norm(h, h2, B, E, b->norm_weight, b->norm_bias, eps));
            }
        }
    }
    if (w->final_norm)
        MHA_TRY(layer_norm(h, h, B, E, w->norm_weight, w->norm_bias, eps));
    return MHA_OK;
}

/* A failed step changes nothing: the options are checked first, and every
 * layer's self cache is rewound (position and the appended slot's bytes)
 * when a later layer fails (a weight's shape, the kernel, ...). */
mha_status mha_decoder_decode_step(mha_tensor *out, const mha_tensor *x,
                                   const mha_decoder_weights *w, mha_decoder_cache *c,
                                   const mha_layer_options *opt) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    char sb[MHA_SHAPE_BUF];
    MHA_CHECK(w && c, MHA_ERR_NULL, "decoder decode: NULL argument");
    MHA_CHECK(w->num_layers == c->layers && w->layers, MHA_ERR_VALUE,
              "decoder decode: %lld layers but the cache has %lld", (long long)w->num_layers,
              (long long)c->layers);
    MHA_CHECK(!(opt->training && opt->dropout_p > 0.0f), MHA_ERR_UNSUPPORTED,
              "decoder decode: eval only (training with dropout)");
    MHA_TRY(mha_layer_check_options(opt));
    const int64_t B = c->B, E = c->E, n = B * E;
    MHA_TRY(mha_check_tensor(x, "x", 3, MHA_F32));
    MHA_TRY(mha_check_tensor(out, "out", 3, MHA_F32));
    MHA_CHECK(x->shape[0] == B && x->shape[1] == 1 && x->shape[2] == E && x->stride[2] == 1 &&
                  x->stride[0] == E,
              MHA_ERR_SHAPE, "x: shape %s, want contiguous (%lld,1,%lld)",
              mha_shape_str(x, sb, sizeof sb), (long long)B, (long long)E);
    MHA_CHECK(out->shape[0] == B && out->shape[1] == 1 && out->shape[2] == E &&
                  out->stride[2] == 1 && out->stride[0] == E,
              MHA_ERR_SHAPE, "out: shape %s, want contiguous (%lld,1,%lld)",
              mha_shape_str(out, sb, sizeof sb), (long long)B, (long long)E);
    for (int64_t l = 0; l < c->layers; l++) {
        c->undo_pos[l] = mha_kv_cache_position(c->self[l]);
        MHA_CHECK(c->undo_pos[l] < c->capacity, MHA_ERR_VALUE,
                  "decoder decode: the cache is full (%lld of %lld tokens)",
                  (long long)c->undo_pos[l], (long long)c->capacity);
        mha_kv_cache_slot_save(c->self[l], c->undo + l * mha_kv_cache_slot_bytes(c->self[l]));
    }
    float *h = c->scratch;
    memcpy(h, x->data, sizeof(float) * (size_t)n);
    mha_status st = decode_layers(h, w, c, opt);
    if (st != MHA_OK) {
        for (int64_t l = 0; l < c->layers; l++)
            if (mha_kv_cache_position(c->self[l]) != c->undo_pos[l])
                mha_kv_cache_rewind(c->self[l], c->undo_pos[l],
                                    c->undo + l * mha_kv_cache_slot_bytes(c->self[l]));
        return st;
    }
    memcpy(out->data, h, sizeof(float) * (size_t)n);
    return MHA_OK;
}
