/* bert.c - a trained BERT sentence encoder (sentence-transformers layout):
 * loading (config.json, modules.json, 1_Pooling/config.json,
 * sentence_bert_config.json, model.safetensors) and the packed forward.
 *
 * Letter legend: T tokens of a packed group of texts, n texts, D hidden
 * width, H heads, dh = D/H, F intermediate (MLP) width, L one text's length.
 *
 * THE MODEL (Hugging Face BertModel, post-norm; names as in the file, with
 * an optional "bert." prefix)
 *   x = LayerNorm_emb((word[id] + token_type[0]) + position[t])       (T,D)
 *   per layer l ("encoder.layer.l."):
 *     q, k, v = x Wq^T + bq, x Wk^T + bk, x Wv^T + bv   ("attention.self.";
 *               one (T,3D) product on the fast route)
 *     ctx = per text, per head softmax(q k^T / sqrt(dh)) v   (own slice only)
 *     x = LayerNorm_1(ctx Wo^T + bo + x)          ("attention.output.")
 *     x = LayerNorm_2(gelu(x Wi^T + bi) Wout^T + bout + x)  ("intermediate.",
 *                                                            "output.")
 *   pooled = mean over the text's tokens (or its first token); / ||.||_2
 * The pooler (pooler.dense) is not used by sentence-transformers.
 *
 * PACKED BATCHING (FlashAttention's varlen layout, without the padding)
 *   A group of texts is one (T,D) matrix with offsets; every projection,
 *   the MLP, the norms and GELU run on the whole matrix, attention runs per
 *   text on its own rows (q, k, v are column blocks of one (T,3D) buffer).
 *   Nothing is computed on padding, so the cost follows the sum of the
 *   lengths.  A call's texts form groups, each encoded start to end by one
 *   thread (mha_bert_embed).
 *
 * TWO ROUTES (product, attend, layernorm)
 *   With AVX2+FMA: the layers' products on weights packed once at load
 *   (pack_weights; src/kernels/gemm_packed*.c: q|k|v as one product, the
 *   residual added in place, GELU in the epilogue), the short-text
 *   attention (src/kernels/attention_short*.c) and LayerNorm rows
 *   (src/kernels/norm_avx*.c), on their avx512 loops where the attention
 *   kernel in force (MHA_KERNEL, AUTO on an AVX-512 CPU) is avx512; the
 *   products then take the 8x24 AVX-512 block, the same bits as the AVX2
 *   block, GELU included (gemm_packed_avx512.c).
 *   Otherwise, or when MHA_GEMM / MHA_KERNEL ask for the reference paths:
 *   mha_linear_f32, mha_sdpa_forward (B = 1 strided views),
 *   mha_layernorm_forward, mha_activation_forward.
 *
 * BITS DO NOT DEPEND ON THE BATCH
 *   Every GEMM element is summed in an order fixed by K alone on mha's own
 *   paths (the packed kernel: one FMA chain in k order; the portable loop);
 *   OpenBLAS picks kernels and blockings by M, so the forward never routes
 *   through it (see bert_gemm and docs/models.md).  Norms, GELU and pooling
 *   are per row, attention per text: row i of the output depends only on
 *   text i, whichever group or thread computes it.
 */
#include "internal.h"
#include "layers.h"
#include "io/io.h"
#include "kernels/gemm.h"
#include "kernels/attention_short.h"
#include "kernels/gemm_packed.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef MHA_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

#define BERT_MAX_JSON (1 << 20)   /* config files are a few hundred bytes  */
#define BERT_MAX_DIM 65536        /* caps on config sizes before any product */
#define BERT_MAX_LAYERS 256
#define BERT_MAX_VOCAB (1 << 24)
/* Tokens per packed group: GEMMs of this many rows keep the cores busy and
 * the workspace (4D + F floats per token, 12 MiB for MiniLM) small. */
#define BERT_GROUP_TOKENS 1024
/* The smallest group worth a thread of its own (GEMMs of 128 rows still run
 * at the kernel's full rate). */
#define BERT_MIN_GROUP 128

typedef struct bert_layer {
    const float *q_w, *q_b, *k_w, *k_b, *v_w, *v_b;  /* (D,D), (D)        */
    const float *o_w, *o_b, *ln1_w, *ln1_b;          /* (D,D), (D) x3      */
    const float *i_w, *i_b;                          /* (F,D), (F)         */
    const float *out_w, *out_b, *ln2_w, *ln2_b;      /* (D,F), (D) x3      */
    /* the same products packed for gemm_packed_avx2.c and _avx512.c (one
     * layout; NULL without AVX2):
     * q|k|v fused, (3D,D) with its bias (3D); o (D,D); i (F,D); out (D,F) */
    float *qkv_p, *qkv_b, *o_p, *i_p, *out_p;
} bert_layer;

struct mha_bert {
    mha_bert_info info;
    mha_safetensors *st;             /* owns the mapping the views point into */
    const float *word, *pos, *type;  /* (V,D), (P,D), (TV,D)                */
    const float *emb_ln_w, *emb_ln_b;/* (D)                                 */
    bert_layer *layer;               /* [layers]                            */
    float *packed;                   /* every layer's packed products, or NULL */
    float *ws;                       /* workspace (workspace_reserve)        */
    size_t ws_floats;
    int64_t ws_slot_tokens, ws_slots;/* its current layout                  */
};

/* One group's buffers (workspace_slot): x (T,D), qkv (T,3D), h
 * (T,max(F,D)), during attention the context. */
typedef struct bert_ws {
    float *x, *qkv, *h;
} bert_ws;

/* ---- reading the JSON files ---------------------------------------------- */

#ifdef MHA_HAVE_CJSON
/* *json = parsed dir/name, an array when want_array else an object;
 * MHA_ERR_IO when the file is missing, FORMAT when it is not that JSON.  Free with cJSON_Delete. */
static mha_status read_json(const char *dir, const char *name, int want_array, cJSON **json) {
    char path[PATH_MAX];
    MHA_CHECK(snprintf(path, sizeof path, "%s/%s", dir, name) < (int)sizeof path, MHA_ERR_VALUE,
              "model directory path too long");
    mha_file f;
    MHA_TRY(mha_file_open(&f, path));
    mha_status st = MHA_OK;
    char *text = NULL;
    if (f.size > BERT_MAX_JSON) {
        st = mha_error(MHA_ERR_FORMAT, "%s: %lld bytes, more than a config file can be", path,
                       (long long)f.size);
    } else if (!(text = mha_malloc((size_t)f.size + 1))) {
        st = mha_error(MHA_ERR_NOMEM, "%s: no memory", path);
    } else if ((st = mha_file_read(&f, 0, text, (size_t)f.size, name)) == MHA_OK) {
        text[f.size] = '\0';
        *json = cJSON_ParseWithLength(text, (size_t)f.size);
        if (!*json)
            st = mha_error(MHA_ERR_FORMAT, "%s: not JSON (parse error near byte %lld)", path,
                           (long long)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - text : 0));
        else if (!(want_array ? cJSON_IsArray(*json) : cJSON_IsObject(*json))) {
            cJSON_Delete(*json);
            *json = NULL;
            st = mha_error(MHA_ERR_FORMAT, "%s: not a JSON %s", path,
                           want_array ? "array" : "object");
        }
    }
    mha_free(text);
    mha_file_close(&f);
    return st;
}

/* *v = the integer field `key` of config.json, 1..cap. */
static mha_status config_int(const cJSON *cfg, const char *key, int64_t cap, int64_t *v) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(cfg, key);
    MHA_CHECK(cJSON_IsNumber(it), MHA_ERR_FORMAT, "config.json: '%s' missing or not a number",
              key);
    double d = it->valuedouble;
    MHA_CHECK(d >= 1 && d <= (double)cap && d == (double)(int64_t)d, MHA_ERR_FORMAT,
              "config.json: '%s' = %g is not an integer in 1..%lld", key, d, (long long)cap);
    *v = (int64_t)d;
    return MHA_OK;
}

static bool json_true(const cJSON *obj, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(obj, key));
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

/* The sizes and options of config.json into info. */
static mha_status read_config(const char *dir, mha_bert_info *info) {
    cJSON *cfg = NULL;
    MHA_TRY(read_json(dir, "config.json", 0, &cfg));
    mha_status st = MHA_OK;
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(cfg, "hidden_act");
    const cJSON *pet = cJSON_GetObjectItemCaseSensitive(cfg, "position_embedding_type");
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(cfg, "layer_norm_eps");
    /* architectures names the class ("BertModel"; the "...ForXxx" heads
     * carry a BertModel); without it model_type "bert" */
    bool bert = !arch && cJSON_IsString(type) && strcmp(type->valuestring, "bert") == 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, arch) {
        bert = bert || (cJSON_IsString(a) && (ends_with(a->valuestring, "BertModel") ||
                                              strncmp(a->valuestring, "BertFor", 7) == 0));
    }
    if (!bert)
        st = mha_error(MHA_ERR_UNSUPPORTED, "config.json: not a BERT model (architectures "
                       "BertModel or model_type \"bert\" expected)");
    else if (!cJSON_IsString(act) || strcmp(act->valuestring, "gelu") != 0)
        st = mha_error(MHA_ERR_UNSUPPORTED, "config.json: hidden_act %s%s%s unsupported (gelu, "
                       "exact erf, only)", cJSON_IsString(act) ? "\"" : "",
                       cJSON_IsString(act) ? act->valuestring : "missing",
                       cJSON_IsString(act) ? "\"" : "");
    else if (pet && !(cJSON_IsString(pet) && strcmp(pet->valuestring, "absolute") == 0))
        st = mha_error(MHA_ERR_UNSUPPORTED, "config.json: position_embedding_type must be "
                       "\"absolute\"");
    else if (!cJSON_IsNumber(eps) || !(eps->valuedouble > 0) || !(eps->valuedouble < 1))
        st = mha_error(MHA_ERR_FORMAT, "config.json: layer_norm_eps missing or not in (0,1)");
    if (st == MHA_OK)
        st = config_int(cfg, "hidden_size", BERT_MAX_DIM, &info->hidden);
    if (st == MHA_OK)
        st = config_int(cfg, "num_attention_heads", BERT_MAX_DIM, &info->heads);
    if (st == MHA_OK)
        st = config_int(cfg, "num_hidden_layers", BERT_MAX_LAYERS, &info->layers);
    if (st == MHA_OK)
        st = config_int(cfg, "intermediate_size", 4 * BERT_MAX_DIM, &info->intermediate);
    if (st == MHA_OK)
        st = config_int(cfg, "vocab_size", BERT_MAX_VOCAB, &info->vocab);
    if (st == MHA_OK)
        st = config_int(cfg, "max_position_embeddings", BERT_MAX_DIM, &info->max_positions);
    if (st == MHA_OK)
        st = config_int(cfg, "type_vocab_size", BERT_MAX_DIM, &info->type_vocab);
    if (st == MHA_OK && info->hidden % info->heads != 0)
        st = mha_error(MHA_ERR_FORMAT, "config.json: hidden_size %lld is not a multiple of "
                       "num_attention_heads %lld", (long long)info->hidden,
                       (long long)info->heads);
    if (st == MHA_OK)
        info->layer_norm_eps = (float)eps->valuedouble;
    cJSON_Delete(cfg);
    return st;
}

/* modules.json: a Transformer module at path "" (this directory), then a
 * Pooling module (its directory's config.json: mean or CLS), then
 * optionally Normalize; anything else is unsupported.  max_seq_length from
 * sentence_bert_config.json when present (else max_position_embeddings). */
static mha_status read_modules(const char *dir, mha_bert_info *info) {
    cJSON *mods = NULL;
    MHA_TRY(read_json(dir, "modules.json", 1, &mods));
    mha_status st = MHA_OK;
    int seen_transformer = 0, seen_pooling = 0;
    char pool_dir[PATH_MAX] = "";
    info->normalize = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, mods) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(m, "type");
        const cJSON *path = cJSON_GetObjectItemCaseSensitive(m, "path");
        if (!cJSON_IsString(type) || !cJSON_IsString(path)) {
            st = mha_error(MHA_ERR_FORMAT, "modules.json: a module without string type and path");
            break;
        }
        const char *t = type->valuestring;
        if (ends_with(t, ".Transformer") && !seen_transformer && !seen_pooling) {
            if (path->valuestring[0]) {
                st = mha_error(MHA_ERR_UNSUPPORTED, "modules.json: Transformer in '%s'; only "
                               "the model directory itself (path \"\") is supported",
                               path->valuestring);
                break;
            }
            seen_transformer = 1;
        } else if (ends_with(t, ".Pooling") && seen_transformer && !seen_pooling) {
            if (strstr(path->valuestring, "..") ||
                snprintf(pool_dir, sizeof pool_dir, "%s/%s", dir, path->valuestring) >=
                    (int)sizeof pool_dir) {
                st = mha_error(MHA_ERR_FORMAT, "modules.json: bad Pooling path");
                break;
            }
            seen_pooling = 1;
        } else if (ends_with(t, ".Normalize") && seen_pooling && !info->normalize) {
            info->normalize = 1;
        } else {
            st = mha_error(MHA_ERR_UNSUPPORTED, "modules.json: module %s unsupported here (mha "
                           "runs Transformer, Pooling, Normalize in that order)", t);
            break;
        }
    }
    cJSON_Delete(mods);
    MHA_TRY(st);
    MHA_CHECK(seen_transformer && seen_pooling, MHA_ERR_UNSUPPORTED,
              "modules.json: a Transformer and a Pooling module are required");

    cJSON *pool = NULL;
    MHA_TRY(read_json(pool_dir, "config.json", 0, &pool));
    bool mean = json_true(pool, "pooling_mode_mean_tokens");
    bool cls = json_true(pool, "pooling_mode_cls_token");
    bool other = json_true(pool, "pooling_mode_max_tokens") ||
                 json_true(pool, "pooling_mode_mean_sqrt_len_tokens") ||
                 json_true(pool, "pooling_mode_weightedmean_tokens") ||
                 json_true(pool, "pooling_mode_lasttoken");
    const cJSON *width = cJSON_GetObjectItemCaseSensitive(pool, "word_embedding_dimension");
    bool width_ok = !width || (cJSON_IsNumber(width) && width->valuedouble == (double)info->hidden);
    cJSON_Delete(pool);
    MHA_CHECK(width_ok, MHA_ERR_FORMAT, "%s/config.json: word_embedding_dimension differs from "
              "config.json hidden_size %lld", pool_dir, (long long)info->hidden);
    MHA_CHECK(mean + cls == 1 && !other, MHA_ERR_UNSUPPORTED,
              "%s/config.json: pooling must be exactly one of mean or cls (max, sqrt-len, "
              "weighted, last-token are not supported)", pool_dir);
    info->pooling = mean ? MHA_BERT_POOL_MEAN : MHA_BERT_POOL_CLS;

    info->max_seq_length = info->max_positions;
    cJSON *sb = NULL;
    char sb_path[PATH_MAX];
    snprintf(sb_path, sizeof sb_path, "%s/sentence_bert_config.json", dir);
    FILE *probe = fopen(sb_path, "rb");
    if (!probe)
        return MHA_OK; /* optional file */
    fclose(probe);
    MHA_TRY(read_json(dir, "sentence_bert_config.json", 0, &sb));
    const cJSON *msl = cJSON_GetObjectItemCaseSensitive(sb, "max_seq_length");
    double v = cJSON_IsNumber(msl) ? msl->valuedouble : -1;
    cJSON_Delete(sb);
    MHA_CHECK(msl == NULL || (v >= 2 && v <= (double)info->max_positions && v == (int64_t)v),
              MHA_ERR_FORMAT, "sentence_bert_config.json: max_seq_length must be an integer in "
              "2..max_position_embeddings (%lld)", (long long)info->max_positions);
    if (msl)
        info->max_seq_length = (int64_t)v;
    return MHA_OK;
}
#endif /* MHA_HAVE_CJSON */

/* ---- the tensors ---------------------------------------------------------- */

/* *data = the F32 tensor prefix+name of shape (d0) or (d0,d1) (d1 = 0: a
 * vector), a view into the mapping. */
static mha_status weight(mha_bert *m, const char *prefix, const char *name, int64_t d0,
                         int64_t d1, const float **data) {
    char full[256];
    MHA_CHECK(snprintf(full, sizeof full, "%s%s", prefix, name) < (int)sizeof full,
              MHA_ERR_FORMAT, "tensor name too long");
    int64_t i = mha_safetensors_find(m->st, full);
    MHA_CHECK(i >= 0, MHA_ERR_FORMAT, "model.safetensors: tensor '%s' missing", full);
    const char *dtype;
    int ndim;
    int64_t shape[MHA_SAFETENSORS_MAX_DIMS];
    MHA_TRY(mha_safetensors_info(m->st, i, &dtype, &ndim, shape));
    MHA_CHECK(strcmp(dtype, "F32") == 0, MHA_ERR_UNSUPPORTED,
              "model.safetensors: tensor '%s' is %s; mha runs F32 models", full, dtype);
    int want_ndim = d1 ? 2 : 1;
    bool ok = ndim == want_ndim && shape[0] == d0 && (!d1 || shape[1] == d1);
    if (!ok) {
        char got[MHA_SHAPE_BUF] = "(", *p = got + 1;
        for (int k = 0; k < ndim && p < got + sizeof got - 24; k++)
            p += snprintf(p, (size_t)(got + sizeof got - p), k ? ",%lld" : "%lld",
                          (long long)shape[k]);
        snprintf(p, (size_t)(got + sizeof got - p), ")");
        if (d1)
            return mha_error(MHA_ERR_FORMAT, "model.safetensors: tensor '%s' has shape %s but "
                             "config.json says (%lld,%lld)", full, got, (long long)d0,
                             (long long)d1);
        return mha_error(MHA_ERR_FORMAT, "model.safetensors: tensor '%s' has shape %s but "
                         "config.json says (%lld)", full, got, (long long)d0);
    }
    mha_tensor v;
    MHA_TRY(mha_safetensors_view_f32(m->st, full, &v));
    *data = v.data;
    return MHA_OK;
}

/* One layer's modules, each a weight and a bias: name after
 * "encoder.layer.N.", weight shape in letters ('D' hidden, 'F' intermediate,
 * 0: a vector, LayerNorm), the bias is (rows); the bert_layer fields. */
typedef struct layer_module {
    const char *name;
    char rows, cols;
    size_t weight, bias;
} layer_module;
#define LM(name, rows, cols, w, b) {name, rows, cols, offsetof(bert_layer, w), offsetof(bert_layer, b)}
static const layer_module LAYER_MODULES[] = {
    LM("attention.self.query", 'D', 'D', q_w, q_b),   LM("attention.self.key", 'D', 'D', k_w, k_b),
    LM("attention.self.value", 'D', 'D', v_w, v_b),   LM("attention.output.dense", 'D', 'D', o_w, o_b),
    LM("attention.output.LayerNorm", 'D', 0, ln1_w, ln1_b),
    LM("intermediate.dense", 'F', 'D', i_w, i_b),     LM("output.dense", 'D', 'F', out_w, out_b),
    LM("output.LayerNorm", 'D', 0, ln2_w, ln2_b),
};
#undef LM

static mha_status bind_weights(mha_bert *m) {
    const mha_bert_info *c = &m->info;
    const int64_t D = c->hidden, F = c->intermediate;
    /* BertModel's own names, or BertForXxx's "bert." prefix */
    const char *pre = mha_safetensors_find(m->st, "embeddings.word_embeddings.weight") < 0 &&
                              mha_safetensors_find(m->st, "bert.embeddings.word_embeddings.weight") >= 0
                          ? "bert."
                          : "";
    MHA_TRY(weight(m, pre, "embeddings.word_embeddings.weight", c->vocab, D, &m->word));
    MHA_TRY(weight(m, pre, "embeddings.position_embeddings.weight", c->max_positions, D, &m->pos));
    MHA_TRY(weight(m, pre, "embeddings.token_type_embeddings.weight", c->type_vocab, D,
                   &m->type));
    MHA_TRY(weight(m, pre, "embeddings.LayerNorm.weight", D, 0, &m->emb_ln_w));
    MHA_TRY(weight(m, pre, "embeddings.LayerNorm.bias", D, 0, &m->emb_ln_b));
    for (int64_t l = 0; l < c->layers; l++) {
        char p[96];
        snprintf(p, sizeof p, "%sencoder.layer.%lld.", pre, (long long)l);
        for (size_t k = 0; k < sizeof LAYER_MODULES / sizeof *LAYER_MODULES; k++) {
            const layer_module *t = &LAYER_MODULES[k];
            char *base = (char *)&m->layer[l], name[96];
            const int64_t rows = t->rows == 'F' ? F : D;
            const int64_t cols = t->cols == 'F' ? F : t->cols == 'D' ? D : 0;
            snprintf(name, sizeof name, "%s.weight", t->name);
            MHA_TRY(weight(m, p, name, rows, cols, (const float **)(base + t->weight)));
            snprintf(name, sizeof name, "%s.bias", t->name);
            MHA_TRY(weight(m, p, name, rows, 0, (const float **)(base + t->bias)));
        }
    }
    /* a layer past the config's count means the config is not this file's */
    char extra[96];
    snprintf(extra, sizeof extra, "%sencoder.layer.%lld.attention.self.query.weight", pre,
             (long long)c->layers);
    MHA_CHECK(mha_safetensors_find(m->st, extra) < 0, MHA_ERR_FORMAT,
              "model.safetensors has a layer %lld but config.json num_hidden_layers is %lld",
              (long long)c->layers, (long long)c->layers);
    return MHA_OK;
}

/* The layers' products packed once into the avx2 kernel's panels
 * (gemm_packed.h), on machines that have it: q, k and v as one (3D,D)
 * product with one bias, o, i and out.  One allocation for all layers
 * (about 4 (4D^2 + 2DF) bytes per layer, 42 MiB for MiniLM); the mapped
 * file keeps the originals for the portable path. */
static mha_status pack_weights(mha_bert *m) {
    if (!mha_cpu_has_avx2_fma())
        return MHA_OK;
    const int64_t D = m->info.hidden, F = m->info.intermediate, L = m->info.layers;
    const int64_t qkv = mha_gemm_packed_floats(3 * D, D), o = mha_gemm_packed_floats(D, D);
    const int64_t i = mha_gemm_packed_floats(F, D), out = mha_gemm_packed_floats(D, F);
    const int64_t bias = (3 * D + 15) / 16 * 16; /* keeps every block 64-byte aligned */
    const int64_t per = qkv + o + i + out + bias;
    size_t bytes;
    MHA_CHECK(!mha_size_mul_overflows((size_t)(L * per), sizeof(float), &bytes), MHA_ERR_OVERFLOW,
              "mha_bert_open: packed weights size overflows");
    m->packed = mha_malloc(bytes);
    MHA_CHECK(m->packed, MHA_ERR_NOMEM, "mha_bert_open: no memory for the packed weights "
              "(%zu bytes)", bytes);
#ifdef MADV_HUGEPAGE
    /* 2 MiB pages where the kernel allows them: 512 times fewer page faults
     * while packing (a hint; its failure changes nothing) */
    const uintptr_t lo = ((uintptr_t)m->packed + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1);
    const uintptr_t hi = ((uintptr_t)m->packed + bytes) & ~(uintptr_t)((2u << 20) - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#endif
    for (int64_t l = 0; l < L; l++) {
        bert_layer *w = &m->layer[l];
        float *p = m->packed + l * per;
        w->qkv_p = p, w->o_p = p + qkv, w->i_p = p + qkv + o, w->out_p = p + qkv + o + i;
        float *b = p + qkv + o + i + out;
        memcpy(b, w->q_b, sizeof(float) * (size_t)D);
        memcpy(b + D, w->k_b, sizeof(float) * (size_t)D);
        memcpy(b + 2 * D, w->v_b, sizeof(float) * (size_t)D);
        w->qkv_b = b;
    }
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(mha_threads())
    for (int64_t job = 0; job < L * 4; job++) {
        bert_layer *w = &m->layer[job / 4];
        if (job % 4 == 0) { /* q, k, v stacked into one (3D,D) matrix first */
            float *stack = mha_malloc(sizeof(float) * (size_t)(3 * D * D));
            if (!stack) {
                failed = 1;
                continue;
            }
            memcpy(stack, w->q_w, sizeof(float) * (size_t)(D * D));
            memcpy(stack + D * D, w->k_w, sizeof(float) * (size_t)(D * D));
            memcpy(stack + 2 * D * D, w->v_w, sizeof(float) * (size_t)(D * D));
            mha_gemm_pack(w->qkv_p, stack, D, 3 * D, D);
            mha_free(stack);
        } else if (job % 4 == 1) {
            mha_gemm_pack(w->o_p, w->o_w, D, D, D);
        } else if (job % 4 == 2) {
            mha_gemm_pack(w->i_p, w->i_w, D, F, D);
        } else {
            mha_gemm_pack(w->out_p, w->out_w, F, D, F);
        }
    }
    MHA_CHECK(!failed, MHA_ERR_NOMEM, "mha_bert_open: no memory to pack the weights");
    return MHA_OK;
}

mha_status mha_bert_open(mha_bert **model, const char *model_dir) {
    MHA_CHECK(model && model_dir, MHA_ERR_NULL, "mha_bert_open: model and model_dir required");
    *model = NULL;
#ifndef MHA_HAVE_CJSON
    (void)bind_weights; /* reached only through read_config */
    (void)pack_weights;
    return mha_error(MHA_ERR_UNSUPPORTED, "mha_bert_open: this build has no libcjson (install "
                     "libcjson-dev and rebuild) to read config.json");
#else
    mha_bert_info info;
    memset(&info, 0, sizeof info);
    MHA_TRY(read_config(model_dir, &info));
    MHA_TRY(read_modules(model_dir, &info));
    mha_bert *m = mha_calloc(1, sizeof *m);
    MHA_CHECK(m, MHA_ERR_NOMEM, "mha_bert_open: no memory");
    m->info = info;
    m->layer = mha_calloc((size_t)info.layers, sizeof *m->layer);
    char path[PATH_MAX];
    mha_status st = m->layer ? MHA_OK : mha_error(MHA_ERR_NOMEM, "mha_bert_open: no memory");
    if (st == MHA_OK && snprintf(path, sizeof path, "%s/model.safetensors", model_dir) >=
                            (int)sizeof path)
        st = mha_error(MHA_ERR_VALUE, "model directory path too long");
    if (st == MHA_OK)
        st = mha_safetensors_open(&m->st, path);
    if (st == MHA_OK)
        st = bind_weights(m);
    if (st == MHA_OK)
        st = pack_weights(m);
    if (st != MHA_OK) {
        mha_bert_free(m);
        return st;
    }
    *model = m;
    return MHA_OK;
#endif
}

void mha_bert_free(mha_bert *model) {
    if (!model)
        return;
    mha_safetensors_free(model->st);
    mha_free(model->layer);
    mha_free(model->packed);
    mha_free(model->ws);
    mha_free(model);
}

const mha_bert_info *mha_bert_get_info(const mha_bert *model) {
    return model ? &model->info : NULL;
}

/* ---- the forward ------------------------------------------------------------ */

/* The GEMM path of the forward: mha's own (row bits independent of M), never
 * OpenBLAS (see the top of the file).  MHA_GEMM=portable still forces the
 * reference loop. */
static mha_gemm_path bert_gemm(void) {
    mha_gemm_path p = mha_gemm_resolve(MHA_GEMM_AUTO);
    if (p == MHA_GEMM_BLAS)
        p = mha_cpu_has_avx2_fma() ? MHA_GEMM_AVX2 : MHA_GEMM_PORTABLE;
    return p;
}

/* y (T,N) rows ldy apart = x (T,K) w^T + b on the generic route. */
static void linear(float *y, int64_t ldy, const float *x, int64_t K, const float *w,
                   const float *b, int64_t T, int64_t N, int accumulate) {
    mha_linear_f32_path(bert_gemm(), y, ldy, x, K, w, K, b, T, N, K, accumulate);
}

/* Rows (T,E) as a 2-D view for the row-wise library layers. */
static mha_tensor rows(float *data, int64_t T, int64_t E) {
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, data, 2, (int64_t[]){T, E});
    return t;
}
static mha_tensor vec(const float *data, int64_t n) {
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, (void *)data, 1, (int64_t[]){n});
    return t;
}

/* True when the attention kernel in force is avx2 or avx512 (MHA_KERNEL
 * may ask for the reference or portable paths) and the CPU runs AVX2: the
 * encoder's own AVX2 LayerNorm and short-text attention then serve. */
static bool kernels_are_simd(void) {
    const mha_kernel kr = mha_kernel_resolve(MHA_KERNEL_AUTO);
    return (kr == MHA_KERNEL_AVX2 || kr == MHA_KERNEL_AVX512) && mha_cpu_has_avx2_fma();
}

/* x (T,D) = LayerNorm(x) in place: where the kernels are avx2 (avx512),
 * rows in chunks over threads through mha_layernorm_f32_avx2
 * (mha_layernorm_f32_avx512; per row: the split changes no bits); otherwise
 * mha_layernorm_forward. */
static mha_status layernorm(float *x, int64_t T, int64_t D, const float *w, const float *b,
                            float eps) {
    const bool avx512 = mha_kernel_resolve(MHA_KERNEL_AUTO) == MHA_KERNEL_AVX512;
    if (avx512 || kernels_are_simd()) {
        enum { CHUNK = 32 };
        int failed = 0;
#pragma omp parallel for schedule(static) num_threads(mha_threads()) if (T > 2 * CHUNK)
        for (int64_t r0 = 0; r0 < T; r0 += CHUNK) {
            float *xr = x + r0 * D;
            const int64_t n = T - r0 < CHUNK ? T - r0 : CHUNK;
            if (!avx512)
                mha_layernorm_f32_avx2(xr, xr, n, D, w, b, eps);
            else if (mha_layernorm_f32_avx512(xr, xr, n, D, w, b, eps) != MHA_OK) {
#pragma omp atomic write
                failed = 1;
            }
        }
        return failed ? mha_avx512_check() : MHA_OK;
    }
    mha_tensor X = rows(x, T, D), W = vec(w, D), Bv = vec(b, D);
    return mha_layernorm_forward(&X, &X, &W, &Bv, eps);
}

/* h (T,F) = gelu(h) in place, rows split over threads (elementwise: the
 * split changes no bits). */
static mha_status gelu(float *h, int64_t T, int64_t F) {
    enum { CHUNK = 16 };
    int failed = 0;
#pragma omp parallel for schedule(static) num_threads(mha_threads()) if (T > CHUNK)
    for (int64_t r0 = 0; r0 < T; r0 += CHUNK) {
        int64_t n = T - r0 < CHUNK ? T - r0 : CHUNK;
        mha_tensor H = rows(h + r0 * F, n, F);
        if (mha_activation_forward(&H, &H, MHA_ACT_GELU) != MHA_OK)
            failed = 1;
    }
    MHA_CHECK(!failed, MHA_ERR_VALUE, "gelu failed");
    return MHA_OK;
}

/* A layer's four products. */
typedef enum { PROJ_QKV, PROJ_O, PROJ_I, PROJ_OUT } bert_proj;

/* One product of layer w on the T rows of x:
 *   PROJ_QKV  y (T,3D)  = x (T,D) [Wq|Wk|Wv]^T + [bq|bk|bv]
 *   PROJ_O    y (T,D)  += x (T,D) Wo^T + bo      (y holds the residual)
 *   PROJ_I    y (T,F)   = gelu(x (T,D) Wi^T + bi)
 *   PROJ_OUT  y (T,D)  += x (T,F) Wout^T + bout  (y holds the residual)
 * On the avx2 path through the weights packed at load (one FMA chain per
 * element, GELU in the kernel's epilogue); otherwise the generic GEMM and
 * mha_activation_forward. */
static mha_status product(const mha_bert *m, const bert_layer *w, bert_proj which, float *y,
                          const float *x, int64_t T) {
    const int64_t D = m->info.hidden, F = m->info.intermediate;
    const int64_t N = which == PROJ_QKV ? 3 * D : which == PROJ_I ? F : D;
    const int64_t K = which == PROJ_OUT ? F : D;
    const int accumulate = which == PROJ_O || which == PROJ_OUT, act = which == PROJ_I;
    if (m->packed && bert_gemm() == MHA_GEMM_AVX2) {
        const float *wp = which == PROJ_QKV ? w->qkv_p : which == PROJ_O ? w->o_p
                          : which == PROJ_I ? w->i_p : w->out_p;
        const float *b = which == PROJ_QKV ? w->qkv_b : which == PROJ_O ? w->o_b
                         : which == PROJ_I ? w->i_b : w->out_b;
        if (mha_kernel_resolve(MHA_KERNEL_AUTO) == MHA_KERNEL_AVX512 && mha_avx512_runs())
            mha_gemm_packed_f32_avx512(y, N, x, K, wp, b, T, N, K, accumulate, act);
        else
            mha_gemm_packed_f32_avx2(y, N, x, K, wp, b, T, N, K, accumulate, act);
        return MHA_OK;
    }
    switch (which) {
    case PROJ_QKV:
        linear(y, N, x, K, w->q_w, w->q_b, T, D, 0);
        linear(y + D, N, x, K, w->k_w, w->k_b, T, D, 0);
        linear(y + 2 * D, N, x, K, w->v_w, w->v_b, T, D, 0);
        return MHA_OK;
    case PROJ_O: linear(y, N, x, K, w->o_w, w->o_b, T, N, 1); return MHA_OK;
    case PROJ_I: linear(y, N, x, K, w->i_w, w->i_b, T, N, 0); return gelu(y, T, N);
    case PROJ_OUT: linear(y, N, x, K, w->out_w, w->out_b, T, N, 1); return MHA_OK;
    }
    return MHA_OK;
}

/* One text's attention: ctx (L,D) rows ld_ctx apart from its q|k|v rows
 * (L,3D) of the packed buffer; weights (H,L,L) when not NULL (through
 * mha_sdpa_forward).  Without weights the short-text kernel with `scratch`
 * (attention_short.h): its avx512 loop where the attention kernel is avx512
 * (MHA_ERR_UNSUPPORTED, as mha_sdpa_forward gives, unless
 * mha_avx512_runs()), its avx2 loop where the kernel is avx2; otherwise
 * mha_sdpa_forward, which honours MHA_KERNEL. */
static mha_status attend(float *ctx, int64_t ld_ctx, const float *qkv, int64_t L, int64_t D,
                         int64_t H, mha_tensor *weights, float *scratch) {
    const int64_t dh = D / H;
    if (!weights && mha_kernel_resolve(MHA_KERNEL_AUTO) == MHA_KERNEL_AVX512)
        return mha_attn_short_f32_avx512(ctx, ld_ctx, qkv, qkv + D, qkv + 2 * D, 3 * D, L, L,
                                         H, dh, 1.0f / sqrtf((float)dh), scratch);
    if (!weights && kernels_are_simd())
        return mha_attn_short_f32_avx2(ctx, ld_ctx, qkv, qkv + D, qkv + 2 * D, 3 * D, L, L, H,
                                       dh, 1.0f / sqrtf((float)dh), scratch);
    mha_tensor q = {(void *)qkv, MHA_F32, 4, {1, H, L, dh}, {L * 3 * D, dh, 3 * D, 1}};
    mha_tensor k = q, v = q;
    k.data = (void *)(qkv + D);
    v.data = (void *)(qkv + 2 * D);
    mha_tensor o = {ctx, MHA_F32, 4, {1, H, L, dh}, {L * ld_ctx, dh, ld_ctx, 1}};
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.attn_weights = weights;
    return mha_sdpa_forward(&o, &q, &k, &v, &opt);
}

/* THE WORKSPACE  slots of T tokens, one per group a thread encodes: x
 * (T,D), qkv (T,3D), h (T,max(F,D)) (during attention the context); then
 * one short-attention scratch (attention_short.h) per thread that can run
 * attention at once. */
static int64_t slot_floats(const mha_bert *m, int64_t T) {
    const int64_t D = m->info.hidden, F = m->info.intermediate;
    return T * (4 * D + (F > D ? F : D));
}
static int64_t scratch_floats(const mha_bert *m) {
    const int64_t f = mha_attn_short_ws_floats(m->info.max_positions,
                                               m->info.hidden / m->info.heads);
    return (f + 15) / 16 * 16; /* keeps each one 64-byte aligned */
}

/* Room for `slots` slots of T tokens and `scratches` attention scratches. */
static mha_status workspace_reserve(mha_bert *m, int64_t slots, int64_t T, int64_t scratches) {
    size_t a, b, floats, bytes;
    MHA_CHECK(!mha_size_mul_overflows((size_t)slots, (size_t)slot_floats(m, T), &a) &&
                  !mha_size_mul_overflows((size_t)scratches, (size_t)scratch_floats(m), &b) &&
                  (floats = a + b) >= a && !mha_size_mul_overflows(floats, sizeof(float), &bytes),
              MHA_ERR_OVERFLOW, "workspace size overflows");
    if (floats > m->ws_floats) {
        float *ws = mha_malloc(bytes);
        MHA_CHECK(ws, MHA_ERR_NOMEM, "mha_bert: no memory for a %lld-token workspace",
                  (long long)(slots * T));
        mha_free(m->ws);
        m->ws = ws;
        m->ws_floats = floats;
    }
    m->ws_slot_tokens = T;
    m->ws_slots = slots;
    return MHA_OK;
}

/* Slot `slot`'s buffers of the reserved workspace. */
static bert_ws workspace_slot(const mha_bert *m, int64_t slot) {
    const int64_t D = m->info.hidden, T = m->ws_slot_tokens;
    bert_ws w;
    w.x = m->ws + slot * slot_floats(m, T);
    w.qkv = w.x + T * D;
    w.h = w.qkv + T * 3 * D;
    return w;
}

/* Attention scratch number i of the reserved workspace. */
static float *workspace_scratch(const mha_bert *m, int64_t i) {
    return m->ws + m->ws_slots * slot_floats(m, m->ws_slot_tokens) + i * scratch_floats(m);
}

/* x (T,D) of a packed group of n texts = the embeddings' output. */
static void embed_tokens(const mha_bert *m, float *x, const int32_t *ids, const int64_t *off,
                         int64_t n) {
    const int64_t D = m->info.hidden;
#pragma omp parallel for schedule(static) num_threads(mha_threads()) if (off[n] - off[0] > 64)
    for (int64_t t = off[0]; t < off[n]; t++) {
        int64_t i = 0; /* the text holding token t (n is small; texts ordered) */
        while (off[i + 1] <= t)
            i++;
        const float *w = m->word + (int64_t)ids[t] * D, *p = m->pos + (t - off[i]) * D;
        float *xr = x + (t - off[0]) * D;
        for (int64_t c = 0; c < D; c++)
            xr[c] = (w[c] + m->type[c]) + p[c]; /* HF order: (word + type) + position */
    }
}

/* Runs the group's texts [off[0], off[n]) through encoder layers 0..stop-1
 * (their output in ws->x); with weights (n = 1), layer `stop` computes its
 * attention probabilities into weights instead.  worker >= 0: a thread of
 * mha_bert_embed's group loop (attention serial, scratch `worker`); -1: the
 * only group (attention over texts in parallel, scratch = thread). */
static mha_status encode(mha_bert *m, const bert_ws *ws, int64_t worker, const int32_t *ids,
                         const int64_t *off, int64_t n, int64_t stop, mha_tensor *weights) {
    float *x = ws->x, *qkv = ws->qkv, *h = ws->h;
    const mha_bert_info *c = &m->info;
    const int64_t D = c->hidden, H = c->heads, T = off[n] - off[0];
    const float eps = c->layer_norm_eps;
    embed_tokens(m, x, ids, off, n);
    MHA_TRY(layernorm(x, T, D, m->emb_ln_w, m->emb_ln_b, eps));
    for (int64_t l = 0; l < stop || (weights && l == stop); l++) {
        const bert_layer *w = &m->layer[l];
        MHA_TRY(product(m, w, PROJ_QKV, qkv, x, T));
        if (weights && l == stop)
            return attend(h, D, qkv, T, D, H, weights, NULL);
        /* texts across threads (one parallel region, not one per text: the
         * SDPA call inside runs single-threaded, nested); one text alone:
         * its heads across threads inside SDPA */
        mha_status failed = MHA_OK;
#pragma omp parallel for schedule(dynamic, 1) num_threads(mha_threads()) if (n > 1 && worker < 0)
        for (int64_t i = 0; i < n; i++) {
            const int64_t o = off[i] - off[0], L = off[i + 1] - off[i];
            int64_t scratch = worker;
#ifdef _OPENMP
            if (worker < 0)
                scratch = omp_get_thread_num();
#endif
            if (scratch < 0)
                scratch = 0;
            mha_status st = attend(h + o * D, D, qkv + o * 3 * D, L, D, H, NULL,
                                   workspace_scratch(m, scratch));
            if (st != MHA_OK) {
#pragma omp critical(mha_bert_attend)
                failed = st;
            }
        }
        /* the worker's message is thread-local: restate it here */
        MHA_CHECK(failed == MHA_OK, failed, "mha_bert: attention failed (%s)",
                  mha_status_string(failed));
        /* the residual branches add into x in place: x += ctx Wo^T + bo */
        MHA_TRY(product(m, w, PROJ_O, x, h, T));
        MHA_TRY(layernorm(x, T, D, w->ln1_w, w->ln1_b, eps));
        MHA_TRY(product(m, w, PROJ_I, h, x, T));
        MHA_TRY(product(m, w, PROJ_OUT, x, h, T));
        MHA_TRY(layernorm(x, T, D, w->ln2_w, w->ln2_b, eps));
    }
    return MHA_OK;
}

/* Checks packed ids: offsets nondecreasing from 0, lengths 1..max_positions,
 * ids in the vocabulary. */
static mha_status check_ids(const mha_bert *m, const int32_t *ids, const int64_t *offsets,
                            int64_t n) {
    MHA_CHECK(n >= 0, MHA_ERR_VALUE, "mha_bert: n = %lld texts", (long long)n);
    MHA_CHECK(offsets, MHA_ERR_NULL, "mha_bert: offsets is NULL");
    MHA_CHECK(offsets[0] == 0, MHA_ERR_VALUE, "mha_bert: offsets[0] = %lld, not 0",
              (long long)offsets[0]);
    MHA_CHECK(ids || offsets[n] == 0, MHA_ERR_NULL, "mha_bert: ids is NULL");
    for (int64_t i = 0; i < n; i++) {
        int64_t L = offsets[i + 1] - offsets[i];
        MHA_CHECK(L >= 1 && L <= m->info.max_positions, MHA_ERR_VALUE,
                  "mha_bert: text %lld has %lld ids; 1..%lld (max_position_embeddings) "
                  "allowed", (long long)i, (long long)L, (long long)m->info.max_positions);
    }
    for (int64_t t = 0; t < offsets[n]; t++)
        MHA_CHECK(ids[t] >= 0 && ids[t] < m->info.vocab, MHA_ERR_VALUE,
                  "mha_bert: id %d at position %lld is outside the vocabulary (0..%lld)",
                  (int)ids[t], (long long)t, (long long)m->info.vocab - 1);
    return MHA_OK;
}

/* The kernel choice, checked before any work (the workers' messages are
 * thread-local): MHA_KERNEL / MHA_GEMM valid, and the avx512 kernel only
 * where it runs (attend). */
static mha_status check_kernel(void) {
    MHA_TRY(mha_runtime_check());
    if (mha_kernel_resolve(MHA_KERNEL_AUTO) == MHA_KERNEL_AVX512)
        return mha_avx512_check();
    return MHA_OK;
}

/* out row (D) = pooled and optionally normalised rows x (L,D). */
static void pool(const mha_bert_info *c, float *out, int64_t ld_out, const float *x, int64_t L) {
    const int64_t D = c->hidden;
    for (int64_t j = 0; j < D; j++) {
        if (c->pooling == MHA_BERT_POOL_CLS) {
            out[j * ld_out] = x[j];
            continue;
        }
        float s = 0.0f; /* sentence-transformers: a float32 sum, then / L */
        for (int64_t t = 0; t < L; t++)
            s += x[t * D + j];
        out[j * ld_out] = s / (float)L;
    }
    if (!c->normalize)
        return;
    double ss = 0.0;
    for (int64_t j = 0; j < D; j++)
        ss += (double)out[j * ld_out] * out[j * ld_out];
    /* F.normalize: x / max(||x||, 1e-12) */
    float norm = (float)sqrt(ss);
    norm = norm > 1e-12f ? norm : 1e-12f;
    for (int64_t j = 0; j < D; j++)
        out[j * ld_out] /= norm;
}

mha_status mha_bert_embed(mha_bert *model, mha_tensor *out, const int32_t *ids,
                          const int64_t *offsets, int64_t n) {
    MHA_CHECK(model, MHA_ERR_NULL, "mha_bert_embed: model is NULL");
    MHA_TRY(mha_check_tensor(out, "out", 2, MHA_F32));
    MHA_CHECK(out->shape[0] == n && out->shape[1] == model->info.hidden, MHA_ERR_SHAPE,
              "mha_bert_embed: out must be (%lld,%lld)", (long long)n,
              (long long)model->info.hidden);
    MHA_TRY(mha_check_writable(out, "out"));
    MHA_TRY(check_ids(model, ids, offsets, n));
    MHA_TRY(check_kernel());
    const int64_t D = model->info.hidden, T = offsets[n];
    const int64_t cap = BERT_GROUP_TOKENS > model->info.max_positions
                            ? BERT_GROUP_TOKENS
                            : model->info.max_positions;
    /* Groups of whole texts, each encoded by one thread from start to end
     * (no barrier between layers; row bits do not depend on the grouping
     * nor on who computes it).  With several threads a group takes about
     * T / (16 threads) tokens (at least BERT_MIN_GROUP, at most cap):
     * sixteen groups per thread, so the dynamic schedule leaves a thread
     * idle for about half a group's time (~3 %) at the end of a call, while
     * groups of >= 128 tokens still run the GEMMs at the kernel's rate (the
     * weights stream from L3 once per group).  A call with one group runs
     * it with every thread inside each GEMM instead. */
    const int threads = mha_threads();
    int64_t target = cap;
    if (threads > 1 && T / (16 * threads) < target)
        target = T / (16 * threads) > BERT_MIN_GROUP ? T / (16 * threads) : BERT_MIN_GROUP;
    int64_t *group = mha_malloc(sizeof(int64_t) * (size_t)(n + 1));
    MHA_CHECK(group, MHA_ERR_NOMEM, "mha_bert_embed: no memory");
    int64_t groups = 0, longest = 0;
    for (int64_t i0 = 0; i0 < n; groups++) {
        int64_t i1 = i0 + 1;
        while (i1 < n && offsets[i1 + 1] - offsets[i0] <= target)
            i1++;
        group[groups] = i0;
        longest = offsets[i1] - offsets[i0] > longest ? offsets[i1] - offsets[i0] : longest;
        i0 = i1;
    }
    group[groups] = n;
    const int slots = groups < threads ? (int)groups : threads;
    mha_status st = n > 0 ? workspace_reserve(model, slots, longest, threads) : MHA_OK;
    if (st != MHA_OK) {
        mha_free(group);
        return st;
    }
    if (n > 0) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(slots) if (slots > 1)
        for (int64_t g = 0; g < groups; g++) {
            int slot = 0;
#ifdef _OPENMP
            slot = omp_get_thread_num();
#endif
            const bert_ws ws = workspace_slot(model, slot);
            const int64_t i0 = group[g], i1 = group[g + 1];
            mha_status gs = encode(model, &ws, slots > 1 ? slot : -1, ids, offsets + i0, i1 - i0,
                                   model->info.layers, NULL);
            if (gs != MHA_OK) {
#pragma omp critical(mha_bert_group)
                st = gs;
                continue;
            }
            for (int64_t i = i0; i < i1; i++) {
                float *o = (float *)out->data + i * out->stride[0];
                pool(&model->info, o, out->stride[1], ws.x + (offsets[i] - offsets[i0]) * D,
                     offsets[i + 1] - offsets[i]);
            }
        }
    }
    mha_free(group);
    /* a worker's message is thread-local: restate it here */
    MHA_CHECK(st == MHA_OK, st, "mha_bert_embed: %s", mha_status_string(st));
    return MHA_OK;
}

mha_status mha_bert_hidden(mha_bert *model, mha_tensor *hidden, const int32_t *ids, int64_t L,
                           int64_t layer) {
    MHA_CHECK(model, MHA_ERR_NULL, "mha_bert_hidden: model is NULL");
    MHA_TRY(mha_check_tensor(hidden, "hidden", 2, MHA_F32));
    const int64_t D = model->info.hidden;
    MHA_CHECK(hidden->shape[0] == L && hidden->shape[1] == D, MHA_ERR_SHAPE,
              "mha_bert_hidden: hidden must be (%lld,%lld)", (long long)L, (long long)D);
    MHA_CHECK(layer >= 0 && layer <= model->info.layers, MHA_ERR_VALUE,
              "mha_bert_hidden: layer %lld outside 0..%lld", (long long)layer,
              (long long)model->info.layers);
    MHA_TRY(mha_check_writable(hidden, "hidden"));
    const int64_t off[2] = {0, L};
    MHA_TRY(check_ids(model, ids, off, 1));
    MHA_TRY(check_kernel());
    MHA_TRY(workspace_reserve(model, 1, L, 1));
    const bert_ws ws = workspace_slot(model, 0);
    MHA_TRY(encode(model, &ws, -1, ids, off, 1, layer, NULL));
    for (int64_t t = 0; t < L; t++)
        for (int64_t j = 0; j < D; j++)
            ((float *)hidden->data)[t * hidden->stride[0] + j * hidden->stride[1]] =
                ws.x[t * D + j];
    return MHA_OK;
}

mha_status mha_bert_attention(mha_bert *model, mha_tensor *attn_weights, const int32_t *ids,
                              int64_t L, int64_t layer) {
    MHA_CHECK(model, MHA_ERR_NULL, "mha_bert_attention: model is NULL");
    MHA_TRY(mha_check_tensor(attn_weights, "attn_weights", 3, MHA_F32));
    const int64_t H = model->info.heads;
    MHA_CHECK(attn_weights->shape[0] == H && attn_weights->shape[1] == L &&
                  attn_weights->shape[2] == L,
              MHA_ERR_SHAPE, "mha_bert_attention: attn_weights must be (%lld,%lld,%lld)",
              (long long)H, (long long)L, (long long)L);
    MHA_CHECK(layer >= 0 && layer < model->info.layers, MHA_ERR_VALUE,
              "mha_bert_attention: layer %lld outside 0..%lld", (long long)layer,
              (long long)model->info.layers - 1);
    MHA_TRY(mha_check_writable(attn_weights, "attn_weights"));
    const int64_t off[2] = {0, L};
    MHA_TRY(check_ids(model, ids, off, 1));
    MHA_TRY(check_kernel());
    MHA_TRY(workspace_reserve(model, 1, L, 1));
    const bert_ws ws = workspace_slot(model, 0);
    mha_tensor w4 = {attn_weights->data, MHA_F32, 4, {1, H, L, L},
                     {H * attn_weights->stride[0], attn_weights->stride[0],
                      attn_weights->stride[1], attn_weights->stride[2]}};
    return encode(model, &ws, -1, ids, off, 1, layer, &w4);
}
