/* model.c - a small Transformer to train: token + positional embeddings, a
 * stack of encoder layers (bidirectional, or causal = decoder-only), an
 * optional final LayerNorm and a Linear output head, with cross-entropy.
 *
 * Letter legend: B batch, T sequence length (<= max_len), E model width,
 * H heads, F MLP width, V vocabulary, N = B*T rows, NL layers.
 *
 * llm.c's layout (train_gpt2.c): the parameters are ONE allocation (the
 * table below points views into it), the gradients another of the same
 * layout, the activations a third (sized for the largest B*T seen).  Loading
 * a checkpoint fills the parameter block; zero_grad is one memset.
 *
 * Parameter names are the PyTorch state_dict of
 *     class Model(nn.Module):          # docs/training.md has it in full
 *         tok_emb = nn.Embedding(V, E);  pos_emb = nn.Embedding(max_len, E)
 *         encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, F,
 *                   dropout, activation, batch_first=True, norm_first),
 *                   NL, norm=nn.LayerNorm(E) if norm_first else None)
 *         head = nn.Linear(E, V)
 *     forward(tokens (B,T)): head(encoder(tok_emb(tokens) + pos_emb(arange(T)),
 *                                       mask=causal mask if causal))
 * so a strict load_state_dict takes a checkpoint.
 *
 * Forward (training): x0 = tok_emb[tok] + pos_emb[t]; x_{l+1} = layer_l(x_l)
 * saving each layer's state; h = norm(x_NL) (pre-norm) or x_NL; logits =
 * h head^T + b; loss = mean over targets >= 0 of -log softmax(logits)[tgt].
 * Backward: the same list reversed (dlogits = (p - onehot) / count).
 */
#include "layers.h"
#include "io/io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARAMS_PER_LAYER 12
#define NAME_LEN 64

typedef struct param {
    char name[NAME_LEN];
    int ndim;
    int64_t shape[2];
    int64_t offset, numel;
    int init;  /* how to initialise (enum below) */
    int64_t fan_in, fan_out;
} param_info;

enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS, INIT_XAVIER, INIT_KAIMING };

struct mha_model {
    mha_model_config cfg;
    int64_t n_tensors, n_params;
    param_info *table;
    float *params, *grads;       /* (n_params) each: one allocation each */
    mha_tensor *pv, *gv;         /* views into them, table order */
    mha_encoder_layer_weights *lw;
    mha_encoder_layer_grads *lg;
    int64_t i_tok, i_pos, i_norm, i_head; /* table indices */

    /* activations: one allocation for the largest N seen */
    int64_t cap_rows, B, T;
    float *acts;
    float *x;            /* (NL+1, N, E): layer inputs and the last output */
    float *saved;        /* NL x saved_floats */
    int64_t saved_floats;
    float *h;            /* (N,E) final norm output (pre-norm) */
    float *logits;       /* (N,V) */
    float *probs;        /* (N,V) softmax, for the backward */
    float *dx, *dy;      /* (N,E) gradients in flight */
    float *dlogits;      /* (N,V) */
    float *ws;           /* train workspace */
    int64_t ws_floats;
    int64_t *tokens, *targets; /* (N) copies */
    int have_targets, training;
    uint64_t step_seed;
    float loss;
    int64_t count;       /* targets counted in the loss */
};

void mha_model_config_init(mha_model_config *c) {
    if (!c)
        return;
    memset(c, 0, sizeof *c);
    c->vocab = 12;
    c->max_len = 12;
    c->dim = 64;
    c->heads = 4;
    c->ffn = 128;
    c->layers = 2;
    c->causal = 0;
    c->norm_first = 1;
    c->activation = MHA_ACT_GELU;
    c->dropout = 0.0f;
    c->layer_norm_eps = 1e-5f;
}

static mha_status check_config(const mha_model_config *c) {
    MHA_CHECK(c != NULL, MHA_ERR_NULL, "model: NULL config");
    MHA_CHECK(c->vocab >= 1 && c->vocab <= (1 << 24) && c->max_len >= 1 && c->max_len <= (1 << 20),
              MHA_ERR_VALUE, "model: vocab %lld and max_len %lld must be in 1..2^24 / 1..2^20",
              (long long)c->vocab, (long long)c->max_len);
    MHA_CHECK(c->dim >= 1 && c->dim <= 65536 && c->ffn >= 1 && c->ffn <= 1 << 20 &&
                  c->layers >= 1 && c->layers <= 1024,
              MHA_ERR_VALUE, "model: dim %lld, ffn %lld, layers %lld out of range",
              (long long)c->dim, (long long)c->ffn, (long long)c->layers);
    MHA_CHECK(c->heads >= 1 && c->dim % c->heads == 0, MHA_ERR_VALUE,
              "model: heads %lld must divide dim %lld", (long long)c->heads, (long long)c->dim);
    MHA_CHECK(c->activation >= MHA_ACT_RELU && c->activation <= MHA_ACT_SILU, MHA_ERR_VALUE,
              "model: unknown activation %d", (int)c->activation);
    MHA_TRY(mha_check_causal_top_left(c->causal, "model"));
    MHA_CHECK(c->dropout >= 0.0f && c->dropout < 1.0f, MHA_ERR_VALUE,
              "model: dropout %g must be in [0,1)", (double)c->dropout);
    MHA_CHECK(c->layer_norm_eps > 0.0f && isfinite(c->layer_norm_eps), MHA_ERR_VALUE,
              "model: layer_norm_eps must be positive");
    return MHA_OK;
}

/* ---- the parameter table ---------------------------------------------------- */

static void add(param_info *t, int64_t *n, int64_t *off, const char *name, int ndim, int64_t a,
                int64_t b, int init, int64_t fan_in, int64_t fan_out) {
    param_info *p = &t[(*n)++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim, p->shape[0] = a, p->shape[1] = b;
    p->numel = ndim == 1 ? a : a * b;
    p->offset = *off;
    p->init = init, p->fan_in = fan_in, p->fan_out = fan_out;
    *off += p->numel;
}

/* Fills the table (NULL: only counts); returns the tensor count. */
static int64_t fill_table(const mha_model_config *c, param_info *t, int64_t *n_params) {
    param_info scratch;
    int64_t n = 0, off = 0;
    const int64_t V = c->vocab, T = c->max_len, E = c->dim, F = c->ffn;
    char nm[NAME_LEN];
#define ADD(name, nd, a, b, init, fi, fo)                             \
    do {                                                              \
        if (t)                                                        \
            add(t, &n, &off, name, nd, a, b, init, fi, fo);           \
        else {                                                        \
            int64_t z = 0;                                            \
            add(&scratch, &z, &off, name, nd, a, b, init, fi, fo);    \
            n++;                                                      \
        }                                                             \
    } while (0)
    ADD("tok_emb.weight", 2, V, E, INIT_NORMAL, 0, 0);
    ADD("pos_emb.weight", 2, T, E, INIT_NORMAL, 0, 0);
    for (int64_t l = 0; l < c->layers; l++) {
        const char *const parts[] = {"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                     "self_attn.out_proj.weight", "self_attn.out_proj.bias",
                                     "linear1.weight", "linear1.bias", "linear2.weight",
                                     "linear2.bias", "norm1.weight", "norm1.bias",
                                     "norm2.weight", "norm2.bias"};
        const int nds[] = {2, 1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1};
        const int64_t as[] = {3 * E, 3 * E, E, E, F, F, E, E, E, E, E, E};
        const int64_t bs[] = {E, 0, E, 0, E, 0, F, 0, 0, 0, 0, 0};
        const int inits[] = {INIT_XAVIER,  INIT_ZEROS,   INIT_KAIMING, INIT_ZEROS,
                             INIT_KAIMING, INIT_KAIMING, INIT_KAIMING, INIT_KAIMING,
                             INIT_ONES,    INIT_ZEROS,   INIT_ONES,    INIT_ZEROS};
        const int64_t fi[] = {E, 0, E, 0, E, E, F, F, 0, 0, 0, 0};
        const int64_t fo[] = {3 * E, 0, E, 0, F, F, E, E, 0, 0, 0, 0};
        for (int k = 0; k < MAX_PARAMS_PER_LAYER; k++) {
            snprintf(nm, sizeof nm, "encoder.layers.%lld.%s", (long long)l, parts[k]);
            ADD(nm, nds[k], as[k], bs[k], inits[k], fi[k], fo[k]);
        }
    }
    if (c->norm_first) {
        ADD("encoder.norm.weight", 1, E, 0, INIT_ONES, 0, 0);
        ADD("encoder.norm.bias", 1, E, 0, INIT_ZEROS, 0, 0);
    }
    ADD("head.weight", 2, V, E, INIT_KAIMING, E, V);
    ADD("head.bias", 1, V, 0, INIT_KAIMING, E, V);
#undef ADD
    *n_params = off;
    return n;
}

/* SplitMix64 finaliser; ref: Steele, Lea, Flood, OOPSLA 2014. */
static uint64_t mix64(uint64_t x) { return mha_splitmix64(x); }

/* uniform(-a, a) for element i of tensor k */
static float uniform(uint64_t seed, int64_t k, int64_t i, double a) {
    uint64_t r = mix64(seed ^ mix64((uint64_t)k * 0x100000001B3ull ^ (uint64_t)i));
    return (float)(a * (2.0 * ((double)(r >> 11) / 9007199254740992.0) - 1.0));
}

/* PyTorch's initialisers (same distributions, not the same draws):
 * Embedding N(0,1); MHA in_proj xavier_uniform, biases 0; Linear
 * kaiming_uniform(a=sqrt(5)) = U(+-1/sqrt(fan_in)) for weight and bias. */
static void init_params(mha_model *m, uint64_t seed) {
    for (int64_t k = 0; k < m->n_tensors; k++) {
        const param_info *p = &m->table[k];
        float *x = m->params + p->offset;
        switch (p->init) {
        case INIT_NORMAL: mha_randn(x, p->numel, mix64(seed + (uint64_t)k), 1.0f); break;
        case INIT_ONES:
            for (int64_t i = 0; i < p->numel; i++)
                x[i] = 1.0f;
            break;
        case INIT_ZEROS: memset(x, 0, sizeof(float) * (size_t)p->numel); break;
        case INIT_XAVIER: {
            double a = sqrt(6.0 / (double)(p->fan_in + p->fan_out));
            for (int64_t i = 0; i < p->numel; i++)
                x[i] = uniform(seed, k, i, a);
            break;
        }
        case INIT_KAIMING: {
            double a = 1.0 / sqrt((double)p->fan_in);
            for (int64_t i = 0; i < p->numel; i++)
                x[i] = uniform(seed, k, i, a);
            break;
        }
        }
    }
}

/* Points the layer weight / gradient structs at the views. */
static void bind_layers(mha_model *m) {
    int64_t k = 2;
    for (int64_t l = 0; l < m->cfg.layers; l++, k += MAX_PARAMS_PER_LAYER) {
        mha_encoder_layer_weights *w = &m->lw[l];
        mha_encoder_layer_grads *g = &m->lg[l];
        const mha_tensor *p = m->pv + k;
        mha_tensor *d = m->gv + k;
        memset(w, 0, sizeof *w), memset(g, 0, sizeof *g);
        w->self_attn.in_proj_weight = &p[0], w->self_attn.in_proj_bias = &p[1];
        w->self_attn.out_proj_weight = &p[2], w->self_attn.out_proj_bias = &p[3];
        w->linear1_weight = &p[4], w->linear1_bias = &p[5];
        w->linear2_weight = &p[6], w->linear2_bias = &p[7];
        w->norm1_weight = &p[8], w->norm1_bias = &p[9];
        w->norm2_weight = &p[10], w->norm2_bias = &p[11];
        g->self_attn.in_proj_weight = &d[0], g->self_attn.in_proj_bias = &d[1];
        g->self_attn.out_proj_weight = &d[2], g->self_attn.out_proj_bias = &d[3];
        g->linear1_weight = &d[4], g->linear1_bias = &d[5];
        g->linear2_weight = &d[6], g->linear2_bias = &d[7];
        g->norm1_weight = &d[8], g->norm1_bias = &d[9];
        g->norm2_weight = &d[10], g->norm2_bias = &d[11];
    }
    m->i_tok = 0, m->i_pos = 1;
    m->i_norm = m->cfg.norm_first ? k : -1;
    m->i_head = m->cfg.norm_first ? k + 2 : k;
}

mha_status mha_model_create(mha_model **out, const mha_model_config *cfg, uint64_t seed) {
    MHA_OPTIONS_DEFAULT(mha_model_config, cfg);
    MHA_CHECK(out != NULL, MHA_ERR_NULL, "model: NULL out");
    *out = NULL;
    MHA_TRY(check_config(cfg));
    mha_model *m = mha_calloc(1, sizeof *m);
    MHA_CHECK(m != NULL, MHA_ERR_NOMEM, "model: cannot allocate");
    m->cfg = *cfg;
    m->n_tensors = fill_table(cfg, NULL, &m->n_params);
    m->table = mha_calloc((size_t)m->n_tensors, sizeof *m->table);
    m->pv = mha_calloc((size_t)m->n_tensors, sizeof *m->pv);
    m->gv = mha_calloc((size_t)m->n_tensors, sizeof *m->gv);
    m->lw = mha_calloc((size_t)cfg->layers, sizeof *m->lw);
    m->lg = mha_calloc((size_t)cfg->layers, sizeof *m->lg);
    m->params = mha_calloc((size_t)m->n_params, sizeof(float));
    m->grads = mha_calloc((size_t)m->n_params, sizeof(float));
    if (!m->table || !m->pv || !m->gv || !m->lw || !m->lg || !m->params || !m->grads) {
        mha_model_free(m);
        return mha_error(MHA_ERR_NOMEM, "model: cannot allocate %lld parameters",
                         (long long)cfg->layers);
    }
    fill_table(cfg, m->table, &m->n_params);
    for (int64_t k = 0; k < m->n_tensors; k++) {
        const param_info *p = &m->table[k];
        mha_tensor_init(&m->pv[k], MHA_F32, m->params + p->offset, p->ndim, p->shape);
        mha_tensor_init(&m->gv[k], MHA_F32, m->grads + p->offset, p->ndim, p->shape);
    }
    bind_layers(m);
    init_params(m, seed);
    *out = m;
    return MHA_OK;
}

void mha_model_free(mha_model *m) {
    if (!m)
        return;
    mha_free(m->table), mha_free(m->pv), mha_free(m->gv), mha_free(m->lw), mha_free(m->lg);
    mha_free(m->params), mha_free(m->grads), mha_free(m->acts);
    mha_free(m);
}

const mha_model_config *mha_model_get_config(const mha_model *m) { return m ? &m->cfg : NULL; }
int64_t mha_model_num_params(const mha_model *m) { return m ? m->n_params : 0; }
float *mha_model_params(mha_model *m) { return m ? m->params : NULL; }
float *mha_model_grads(mha_model *m) { return m ? m->grads : NULL; }
int64_t mha_model_num_tensors(const mha_model *m) { return m ? m->n_tensors : 0; }

mha_status mha_model_tensor(const mha_model *m, int64_t i, const char **name, mha_tensor *param,
                            mha_tensor *grad) {
    MHA_CHECK(m != NULL, MHA_ERR_NULL, "model: NULL model");
    MHA_CHECK(i >= 0 && i < m->n_tensors, MHA_ERR_VALUE, "model: tensor %lld of %lld",
              (long long)i, (long long)m->n_tensors);
    if (name)
        *name = m->table[i].name;
    if (param)
        *param = m->pv[i];
    if (grad)
        *grad = m->gv[i];
    return MHA_OK;
}

void mha_model_zero_grad(mha_model *m) {
    if (m)
        memset(m->grads, 0, sizeof(float) * (size_t)m->n_params);
}

/* ---- activations ------------------------------------------------------------- */

static int64_t line(int64_t n) { return (n + 15) / 16 * 16; }

static mha_status ensure_acts(mha_model *m, int64_t B, int64_t T) {
    const mha_model_config *c = &m->cfg;
    const int64_t N = B * T, E = c->dim, V = c->vocab;
    size_t sb, wb;
    MHA_TRY(mha_layer_saved_size(B, T, T, E, c->heads, &sb));
    MHA_TRY(mha_layer_train_workspace_size(B, T, T, E, c->ffn, c->heads, &wb));
    int64_t sf = line((int64_t)(sb / sizeof(float)) + 1), wf = line((int64_t)(wb / sizeof(float)) + 1);
    int64_t need = line((c->layers + 1) * N * E) + c->layers * sf + line(N * E) + 3 * line(N * V) +
                   2 * line(N * E) + wf + 2 * line(N * 2); /* int64 tokens/targets as 2 floats */
    if (!m->acts || need > m->cap_rows) {
        mha_free(m->acts);
        m->acts = mha_malloc(sizeof(float) * (size_t)need);
        m->cap_rows = m->acts ? need : 0;
        MHA_CHECK(m->acts != NULL, MHA_ERR_NOMEM, "model: cannot allocate %lld activation floats",
                  (long long)need);
    }
    float *a = m->acts;
    m->B = B, m->T = T; /* only once the activations fit them */
    m->x = a, a += line((c->layers + 1) * N * E);
    m->saved = a, m->saved_floats = sf, a += c->layers * sf;
    m->h = a, a += line(N * E);
    m->logits = a, a += line(N * V);
    m->probs = a, a += line(N * V);
    m->dlogits = a, a += line(N * V);
    m->dx = a, a += line(N * E);
    m->dy = a, a += line(N * E);
    m->ws = a, m->ws_floats = wf, a += wf;
    m->tokens = (int64_t *)a, a += line(N * 2);
    m->targets = (int64_t *)a;
    return MHA_OK;
}

static void layer_options(const mha_model *m, mha_layer_options *o) {
    mha_layer_options_init(o);
    o->num_heads = m->cfg.heads;
    o->norm_first = m->cfg.norm_first;
    o->activation = m->cfg.activation;
    o->layer_norm_eps = m->cfg.layer_norm_eps;
    o->training = m->training;
    o->dropout_p = m->cfg.dropout;
    o->seed = m->step_seed;
}

static mha_tensor seq_view(const mha_model *m, float *data) {
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, data, 3, (int64_t[]){m->B, m->T, m->cfg.dim});
    return t;
}

/* ---- forward ------------------------------------------------------------------ */

mha_status mha_model_forward(mha_model *m, const int64_t *tokens, const int64_t *targets,
                             int64_t B, int64_t T, int training, uint64_t step_seed,
                             float *loss) {
    MHA_CHECK(m != NULL && tokens != NULL, MHA_ERR_NULL, "model: NULL model or tokens");
    MHA_TRY(mha_runtime_check());
    const mha_model_config *c = &m->cfg;
    MHA_CHECK(B >= 1 && T >= 1 && T <= c->max_len, MHA_ERR_SHAPE,
              "model: tokens (B,T) = (%lld,%lld), T must be in 1..max_len %lld", (long long)B,
              (long long)T, (long long)c->max_len);
    int64_t N;
    MHA_CHECK(!mha_mul_overflows(B, T, &N) && N < (INT64_C(1) << 40) / (c->dim + c->vocab),
              MHA_ERR_OVERFLOW, "model: batch too large");
    for (int64_t i = 0; i < N; i++) {
        MHA_CHECK(tokens[i] >= 0 && tokens[i] < c->vocab, MHA_ERR_VALUE,
                  "tokens: element %lld is %lld, outside the vocabulary 0..%lld", (long long)i,
                  (long long)tokens[i], (long long)c->vocab - 1);
        MHA_CHECK(!targets || (targets[i] >= -1 && targets[i] < c->vocab), MHA_ERR_VALUE,
                  "targets: element %lld is %lld, want -1 (ignored) or 0..%lld", (long long)i,
                  (long long)targets[i], (long long)c->vocab - 1);
    }
    MHA_TRY(ensure_acts(m, B, T));
    m->training = training;
    m->step_seed = step_seed;
    const int64_t E = c->dim, V = c->vocab;
    memcpy(m->tokens, tokens, sizeof(int64_t) * (size_t)N);
    m->have_targets = targets != NULL;
    if (targets)
        memcpy(m->targets, targets, sizeof(int64_t) * (size_t)N);

    /* x0 (B,T,E) = tok_emb[tokens] + pos_emb[t] */
    const float *te = m->params + m->table[m->i_tok].offset;
    const float *pe = m->params + m->table[m->i_pos].offset;
    for (int64_t i = 0; i < N; i++) {
        const float *a = te + tokens[i] * E, *p = pe + (i % T) * E;
        float *x = m->x + i * E;
        for (int64_t e = 0; e < E; e++)
            x[e] = a[e] + p[e];
    }
    /* the encoder stack, saving each layer's state */
    mha_layer_options o;
    layer_options(m, &o);
    mha_layer_masks masks = {NULL, NULL, c->causal, NULL, NULL};
    for (int64_t l = 0; l < c->layers; l++) {
        mha_tensor in = seq_view(m, m->x + l * N * E), out = seq_view(m, m->x + (l + 1) * N * E);
        mha_status st = mha_encoder_layer_forward_train_at(
            &out, m->saved + l * m->saved_floats, sizeof(float) * (size_t)m->saved_floats, &in,
            &m->lw[l], &masks, &o, m->ws, sizeof(float) * (size_t)m->ws_floats, l);
        if (st != MHA_OK) { /* half-written activations: a backward must not use them */
            m->have_targets = 0;
            return st;
        }
    }
    const float *top = m->x + c->layers * N * E;
    if (c->norm_first) {
        mha_layernorm_f32(m->h, top, N, E, m->params + m->table[m->i_norm].offset,
                          m->params + m->table[m->i_norm + 1].offset, c->layer_norm_eps);
        top = m->h;
    }
    /* logits (N,V) = h head^T + b */
    mha_linear_f32(m->logits, V, top, E, m->params + m->table[m->i_head].offset, E,
                   m->params + m->table[m->i_head + 1].offset, N, V, E, 0);
    /* softmax and the mean cross-entropy (in double) */
    double sum = 0.0;
    m->count = 0;
    for (int64_t i = 0; i < N; i++) {
        const float *z = m->logits + i * V;
        float *p = m->probs + i * V;
        double mx = -INFINITY, s = 0.0;
        for (int64_t v = 0; v < V; v++)
            mx = z[v] > mx ? z[v] : mx;
        for (int64_t v = 0; v < V; v++)
            s += exp((double)z[v] - mx);
        for (int64_t v = 0; v < V; v++)
            p[v] = (float)(exp((double)z[v] - mx) / s);
        if (targets && targets[i] >= 0) {
            sum += -((double)z[targets[i]] - mx - log(s));
            m->count++;
        }
    }
    m->loss = m->count ? (float)(sum / (double)m->count) : 0.0f;
    if (loss)
        *loss = m->loss;
    return MHA_OK;
}

const float *mha_model_logits(const mha_model *m) { return m ? m->logits : NULL; }

/* ---- backward ------------------------------------------------------------------ */

mha_status mha_model_backward(mha_model *m) {
    MHA_CHECK(m != NULL, MHA_ERR_NULL, "model: NULL model");
    MHA_CHECK(m->acts != NULL && m->have_targets, MHA_ERR_VALUE,
              "model: backward needs a forward call with targets first");
    MHA_TRY(mha_runtime_check());
    const mha_model_config *c = &m->cfg;
    const int64_t B = m->B, T = m->T, N = B * T, E = c->dim, V = c->vocab;
    /* dlogits = (p - onehot(target)) / count, 0 on ignored rows */
    const float inv = m->count ? 1.0f / (float)m->count : 0.0f;
    for (int64_t i = 0; i < N; i++) {
        float *d = m->dlogits + i * V;
        const float *p = m->probs + i * V;
        const int64_t t = m->targets[i];
        for (int64_t v = 0; v < V; v++)
            d[v] = t >= 0 ? (p[v] - (v == t ? 1.0f : 0.0f)) * inv : 0.0f;
    }
    const float *top = c->norm_first ? m->h : m->x + c->layers * N * E;
    /* head: dtop (N,E) = dlogits W; dW += dlogits^T top; db += sum dlogits */
    memset(m->dy, 0, sizeof(float) * (size_t)(N * E));
    mha_linear_backward_f32(m->dy, m->grads + m->table[m->i_head].offset,
                            m->grads + m->table[m->i_head + 1].offset, m->dlogits, top,
                            m->params + m->table[m->i_head].offset, N, V, E);
    float *d_out = m->dy, *d_in = m->dx;
    if (c->norm_first) {
        memset(d_in, 0, sizeof(float) * (size_t)(N * E));
        mha_layernorm_backward_f32(d_in, m->grads + m->table[m->i_norm].offset,
                                   m->grads + m->table[m->i_norm + 1].offset, d_out,
                                   m->x + c->layers * N * E,
                                   m->params + m->table[m->i_norm].offset, N, E,
                                   c->layer_norm_eps);
        float *t = d_out;
        d_out = d_in, d_in = t;
    }
    mha_layer_options o;
    layer_options(m, &o);
    mha_layer_masks masks = {NULL, NULL, c->causal, NULL, NULL};
    for (int64_t l = c->layers - 1; l >= 0; l--) {
        mha_tensor in = seq_view(m, m->x + l * N * E), dout = seq_view(m, d_out),
                   din = seq_view(m, d_in);
        memset(d_in, 0, sizeof(float) * (size_t)(N * E));
        MHA_TRY(mha_encoder_layer_backward_at(
            &din, &m->lg[l], &dout, m->saved + l * m->saved_floats,
            sizeof(float) * (size_t)m->saved_floats, &in, &m->lw[l], &masks, &o, m->ws,
            sizeof(float) * (size_t)m->ws_floats, l));
        float *t = d_out;
        d_out = d_in, d_in = t;
    }
    /* embeddings: rows scatter-add in a fixed order */
    float *dte = m->grads + m->table[m->i_tok].offset, *dpe = m->grads + m->table[m->i_pos].offset;
    for (int64_t i = 0; i < N; i++) {
        const float *g = d_out + i * E;
        float *a = dte + m->tokens[i] * E, *p = dpe + (i % T) * E;
        for (int64_t e = 0; e < E; e++) {
            a[e] += g[e];
            p[e] += g[e];
        }
    }
    return MHA_OK;
}

/* ---- checkpoints ----------------------------------------------------------------- */

#define META_MAX 24

typedef struct meta {
    const char *k[META_MAX];
    char v[META_MAX][48];
    int n;
} meta;

static void meta_add(meta *m, const char *k, const char *fmt, double x) {
    if (m->n == META_MAX)
        return;
    m->k[m->n] = k;
    snprintf(m->v[m->n], sizeof m->v[0], fmt, x);
    m->n++;
}

static void meta_add_u64(meta *m, const char *k, uint64_t x) {
    if (m->n == META_MAX)
        return;
    m->k[m->n] = k;
    snprintf(m->v[m->n], sizeof m->v[0], "%llu", (unsigned long long)x);
    m->n++;
}

/* The run id as metadata: 16 hex digits. */
static void run_id_string(uint64_t id, char out[17]) {
    snprintf(out, 17, "%016llx", (unsigned long long)id);
}

/* keys/values of md followed by the caller's extra pairs (one allocation). */
static mha_status meta_merge(const meta *md, const mha_checkpoint_info *info, const char ***keys,
                             const char ***values, int64_t *n) {
    int64_t extra = info->n_extra > 0 ? info->n_extra : 0;
    MHA_CHECK(extra == 0 || (info->extra_keys && info->extra_values), MHA_ERR_NULL,
              "checkpoint: NULL extra metadata");
    for (int64_t i = 0; i < extra; i++) {
        MHA_CHECK(info->extra_keys[i] && info->extra_values[i], MHA_ERR_NULL,
                  "checkpoint: extra metadata %lld: NULL key or value", (long long)i);
        for (int j = 0; j < md->n; j++)
            MHA_CHECK(strcmp(info->extra_keys[i], md->k[j]) != 0, MHA_ERR_VALUE,
                      "checkpoint: extra metadata key '%s' is the checkpoint's own",
                      info->extra_keys[i]);
    }
    *n = md->n + extra;
    const char **kv = mha_malloc(sizeof(char *) * (size_t)(2 * *n));
    MHA_CHECK(kv != NULL, MHA_ERR_NOMEM, "checkpoint: cannot allocate the metadata");
    for (int i = 0; i < md->n; i++)
        kv[i] = md->k[i], kv[*n + i] = md->v[i];
    for (int64_t i = 0; i < extra; i++)
        kv[md->n + i] = info->extra_keys[i], kv[*n + md->n + i] = info->extra_values[i];
    *keys = kv, *values = kv + *n;
    return MHA_OK;
}

mha_status mha_model_save(const mha_model *m, const char *path, const char *optim_path,
                          const mha_adamw *opt, int64_t step, uint64_t seed) {
    mha_checkpoint_info info = {step, seed, 0, 0, NULL, NULL};
    return mha_model_save_checkpoint(m, path, optim_path, opt, &info);
}

/* Both files are written to temporaries and synced first, then the
 * optimiser file is renamed into place, then the model file: a failure
 * before the renames changes nothing, and a crash between them leaves a
 * pair whose steps or run ids differ, which mha_model_open refuses. */
mha_status mha_model_save_checkpoint(const mha_model *m, const char *path,
                                     const char *optim_path, const mha_adamw *opt,
                                     const mha_checkpoint_info *info) {
    MHA_CHECK(m != NULL && path != NULL && info != NULL, MHA_ERR_NULL,
              "model: NULL model, path or checkpoint info");
    MHA_CHECK(!optim_path || opt, MHA_ERR_NULL, "model: optimiser file without an optimiser");
    MHA_CHECK(!opt || opt->n == m->n_params, MHA_ERR_VALUE,
              "model: optimiser has %lld parameters, the model %lld",
              opt ? (long long)opt->n : 0LL, (long long)m->n_params);
    MHA_CHECK(info->step >= 0, MHA_ERR_VALUE, "model: step %lld", (long long)info->step);
    const mha_model_config *c = &m->cfg;
    char run[17];
    run_id_string(info->run_id, run);
    meta md = {.n = 0};
    meta_add_u64(&md, "step", (uint64_t)info->step);
    meta_add_u64(&md, "seed", info->seed);
    meta_add(&md, "format", "%.0f", 1);
    meta_add(&md, "vocab", "%.0f", (double)c->vocab);
    meta_add(&md, "max_len", "%.0f", (double)c->max_len);
    meta_add(&md, "dim", "%.0f", (double)c->dim);
    meta_add(&md, "heads", "%.0f", (double)c->heads);
    meta_add(&md, "ffn", "%.0f", (double)c->ffn);
    meta_add(&md, "layers", "%.0f", (double)c->layers);
    meta_add(&md, "causal", "%.0f", (double)c->causal);
    meta_add(&md, "norm_first", "%.0f", (double)c->norm_first);
    meta_add(&md, "activation", "%.0f", (double)c->activation);
    meta_add(&md, "dropout", "%.9g", (double)c->dropout);
    meta_add(&md, "layer_norm_eps", "%.9g", (double)c->layer_norm_eps);
    if (info->run_id) {
        md.k[md.n] = "run_id";
        snprintf(md.v[md.n++], sizeof md.v[0], "%s", run);
    }
    const char **keys = NULL, **vals = NULL;
    int64_t n_meta = 0;
    MHA_TRY(meta_merge(&md, info, &keys, &vals, &n_meta));
    const char **names = mha_malloc(sizeof(char *) * (size_t)(2 * m->n_tensors));
    const mha_tensor **ts = mha_malloc(sizeof(mha_tensor *) * (size_t)(2 * m->n_tensors));
    mha_tensor *views = mha_malloc(sizeof(mha_tensor) * (size_t)(2 * m->n_tensors));
    char(*onames)[NAME_LEN + 16] = mha_malloc(sizeof *onames * (size_t)(2 * m->n_tensors));
    mha_status st = MHA_OK;
    if (!names || !ts || !views || !onames)
        st = mha_error(MHA_ERR_NOMEM, "model: cannot allocate the checkpoint index");
    for (int64_t k = 0; st == MHA_OK && k < m->n_tensors; k++)
        names[k] = m->table[k].name, ts[k] = &m->pv[k];
    mha_wfile wm, wo;
    memset(&wm, 0, sizeof wm), memset(&wo, 0, sizeof wo);
    wm.fd = wo.fd = -1;
    if (st == MHA_OK)
        st = mha_safetensors_write_synced(&wm, path, names, ts, m->n_tensors, keys, vals, n_meta);
    if (st == MHA_OK && optim_path) {
        /* exp_avg.<name> and exp_avg_sq.<name>, the step, run id and AdamW's options */
        meta om = {.n = 0};
        meta_add_u64(&om, "step", (uint64_t)opt->step);
        meta_add_u64(&om, "seed", info->seed);
        meta_add(&om, "lr", "%.17g", opt->opt.lr);
        meta_add(&om, "beta1", "%.17g", opt->opt.beta1);
        meta_add(&om, "beta2", "%.17g", opt->opt.beta2);
        meta_add(&om, "eps", "%.17g", opt->opt.eps);
        meta_add(&om, "weight_decay", "%.17g", opt->opt.weight_decay);
        meta_add(&om, "max_grad_norm", "%.17g", opt->opt.max_grad_norm);
        if (info->run_id) {
            om.k[om.n] = "run_id";
            snprintf(om.v[om.n++], sizeof om.v[0], "%s", run);
        }
        const char *ov[META_MAX];
        for (int i = 0; i < om.n; i++)
            ov[i] = om.v[i];
        for (int64_t k = 0; k < m->n_tensors; k++) {
            const param_info *p = &m->table[k];
            for (int j = 0; j < 2; j++) {
                int64_t i = 2 * k + j;
                snprintf(onames[i], sizeof onames[0], "%s.%s", j ? "exp_avg_sq" : "exp_avg",
                         p->name);
                views[i] = m->pv[k];
                views[i].data = (j ? opt->v : opt->m) + p->offset;
                names[i] = onames[i], ts[i] = &views[i];
            }
        }
        st = mha_safetensors_write_synced(&wo, optim_path, names, ts, 2 * m->n_tensors, om.k, ov,
                                          om.n);
        if (st == MHA_OK)
            st = mha_wfile_commit(&wo);
    }
    if (st == MHA_OK)
        st = mha_wfile_commit(&wm);
    mha_wfile_discard(&wo), mha_wfile_discard(&wm);
    mha_free(names), mha_free(ts), mha_free(views), mha_free(onames), mha_free(keys);
    return st;
}

/* An integer metadata value in [lo, hi]. */
static mha_status meta_int(mha_safetensors *st, const char *key, int64_t lo, int64_t hi,
                           int64_t *out) {
    const char *v = mha_safetensors_metadata(st, key);
    MHA_CHECK(v != NULL, MHA_ERR_FORMAT, "checkpoint: metadata '%s' missing", key);
    char *end;
    long long x = strtoll(v, &end, 10);
    MHA_CHECK(*v && !*end && x >= lo && x <= hi, MHA_ERR_FORMAT,
              "checkpoint: metadata %s = '%s', want an integer in %lld..%lld", key, v,
              (long long)lo, (long long)hi);
    *out = x;
    return MHA_OK;
}

static mha_status meta_u64(mha_safetensors *st, const char *key, uint64_t *out) {
    const char *v = mha_safetensors_metadata(st, key);
    MHA_CHECK(v != NULL, MHA_ERR_FORMAT, "checkpoint: metadata '%s' missing", key);
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    MHA_CHECK(*v >= '0' && *v <= '9' && !*end, MHA_ERR_FORMAT,
              "checkpoint: metadata %s = '%s', want an unsigned integer", key, v);
    *out = x;
    return MHA_OK;
}

static mha_status meta_double(mha_safetensors *st, const char *key, double *out) {
    const char *v = mha_safetensors_metadata(st, key);
    MHA_CHECK(v != NULL, MHA_ERR_FORMAT, "checkpoint: metadata '%s' missing", key);
    char *end;
    *out = strtod(v, &end);
    MHA_CHECK(*v && !*end && isfinite(*out), MHA_ERR_FORMAT,
              "checkpoint: metadata %s = '%s' is not a number", key, v);
    return MHA_OK;
}

/* Checks, before anything is allocated for them, that st (read from path)
 * holds exactly the table's tensors under each prefix: present, F32 and of
 * the table's shape (the reader has checked that each one's bytes are in
 * the file and match shape x dtype). */
static mha_status check_tensors(mha_safetensors *st, const char *path, const param_info *table,
                                int64_t n, const char *const *prefixes, int n_prefixes) {
    MHA_CHECK(mha_safetensors_count(st) == n * n_prefixes, MHA_ERR_FORMAT,
              "checkpoint: %s has %lld tensors, its metadata describes a model with %lld", path,
              (long long)mha_safetensors_count(st), (long long)(n * n_prefixes));
    char name[NAME_LEN + 16];
    for (int64_t k = 0; k < n; k++)
        for (int j = 0; j < n_prefixes; j++) {
            const param_info *p = &table[k];
            snprintf(name, sizeof name, "%s%s", prefixes[j], p->name);
            int64_t i = mha_safetensors_find(st, name);
            MHA_CHECK(i >= 0, MHA_ERR_FORMAT, "checkpoint: %s: tensor '%s' missing", path, name);
            const char *dtype;
            int ndim;
            int64_t shape[MHA_SAFETENSORS_MAX_DIMS];
            MHA_TRY(mha_safetensors_info(st, i, &dtype, &ndim, shape));
            MHA_CHECK(!strcmp(dtype, "F32") && ndim == p->ndim && shape[0] == p->shape[0] &&
                          (ndim == 1 || shape[1] == p->shape[1]),
                      MHA_ERR_FORMAT,
                      "checkpoint: %s: tensor '%s' is %s rank %d, want F32 of the model's shape",
                      path, name, dtype, ndim);
        }
    return MHA_OK;
}

/* The model file and the optimiser file are one checkpoint: the same step
 * and the same run id (or neither has one: files from before run ids). */
static mha_status check_pair(mha_safetensors *st, const char *path, int64_t step,
                             mha_safetensors *os, const char *optim_path) {
    int64_t ostep;
    MHA_TRY(meta_int(os, "step", 0, INT64_MAX, &ostep));
    const char *run = mha_safetensors_metadata(st, "run_id");
    const char *orun = mha_safetensors_metadata(os, "run_id");
    bool same_run = run ? orun && !strcmp(run, orun) : !orun;
    MHA_CHECK(ostep == step && same_run, MHA_ERR_FORMAT,
              "checkpoint: %s (step %lld, run %s) and %s (step %lld, run %s) are not one "
              "checkpoint (a save was interrupted, or files of two runs were mixed)",
              path, (long long)step, run ? run : "none", optim_path, (long long)ostep,
              orun ? orun : "none");
    return MHA_OK;
}

/* Copies tensor `name` (checked by check_tensors) of st into dst (numel floats). */
static mha_status load_into(mha_safetensors *st, const char *name, const param_info *p, float *dst) {
    mha_tensor v;
    MHA_TRY(mha_safetensors_view_f32(st, name, &v));
    memcpy(dst, v.data, sizeof(float) * (size_t)p->numel);
    return MHA_OK;
}

mha_status mha_model_open(mha_model **out, const char *path, const char *optim_path,
                          mha_adamw *opt, int64_t *step, uint64_t *seed) {
    MHA_CHECK(out != NULL && path != NULL, MHA_ERR_NULL, "model: NULL out or path");
    MHA_CHECK(!optim_path || opt, MHA_ERR_NULL, "model: optimiser file without an optimiser");
    *out = NULL;
    if (optim_path)
        memset(opt, 0, sizeof *opt); /* released below on failure, so known state */
    mha_safetensors *st = NULL, *os = NULL;
    mha_model *m = NULL;
    MHA_TRY(mha_safetensors_open(&st, path));
    mha_model_config c;
    mha_model_config_init(&c);
    int64_t v[9], stp = 0;
    uint64_t sd = 0;
    const char *keys[9] = {"vocab", "max_len", "dim", "heads", "ffn", "layers",
                           "causal", "norm_first", "activation"};
    const int64_t hi[9] = {1 << 24, 1 << 20, 65536, 65536, 1 << 20, 1024, 1, 1, 3};
    double dropout, eps;
    mha_status s = MHA_OK;
    for (int i = 0; i < 9 && s == MHA_OK; i++)
        s = meta_int(st, keys[i], 0, hi[i], &v[i]);
    if (s == MHA_OK)
        s = meta_int(st, "step", 0, INT64_MAX, &stp);
    if (s == MHA_OK)
        s = meta_u64(st, "seed", &sd);
    if (s == MHA_OK)
        s = meta_double(st, "dropout", &dropout);
    if (s == MHA_OK)
        s = meta_double(st, "layer_norm_eps", &eps);
    if (s == MHA_OK) {
        c.vocab = v[0], c.max_len = v[1], c.dim = v[2], c.heads = v[3], c.ffn = v[4];
        c.layers = v[5], c.causal = (mha_causal)v[6], c.norm_first = (int)v[7];
        c.activation = (mha_activation)v[8];
        c.dropout = (float)dropout, c.layer_norm_eps = (float)eps;
        s = check_config(&c);
    }
    /* the files must hold every tensor the metadata promises before the
     * model (sized by that metadata) is allocated */
    param_info *table = NULL;
    int64_t n_tensors = 0, n_params = 0;
    if (s == MHA_OK) {
        n_tensors = fill_table(&c, NULL, &n_params);
        table = mha_calloc((size_t)n_tensors, sizeof *table);
        if (!table)
            s = mha_error(MHA_ERR_NOMEM, "model: cannot allocate the parameter table");
        else
            fill_table(&c, table, &n_params);
    }
    static const char *const model_prefix[1] = {""};
    static const char *const moment_prefixes[2] = {"exp_avg.", "exp_avg_sq."};
    if (s == MHA_OK)
        s = check_tensors(st, path, table, n_tensors, model_prefix, 1);
    if (s == MHA_OK && optim_path) {
        s = mha_safetensors_open(&os, optim_path);
        if (s != MHA_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", mha_last_error());
            s = mha_error(s, "checkpoint: %s has no usable optimiser state beside it: %s", path,
                          why);
        }
        if (s == MHA_OK)
            s = check_pair(st, path, stp, os, optim_path);
        if (s == MHA_OK)
            s = check_tensors(os, optim_path, table, n_tensors, moment_prefixes, 2);
    }
    mha_free(table);
    if (s == MHA_OK)
        s = mha_model_create(&m, &c, 0);
    for (int64_t k = 0; s == MHA_OK && k < m->n_tensors; k++)
        s = load_into(st, m->table[k].name, &m->table[k], m->params + m->table[k].offset);
    if (s == MHA_OK && optim_path) {
        mha_adamw_options o;
        mha_adamw_options_init(&o);
        int64_t ostep;
        s = meta_int(os, "step", 0, INT64_MAX, &ostep);
        const char *ok[6] = {"lr", "beta1", "beta2", "eps", "weight_decay", "max_grad_norm"};
        double *ov[6] = {&o.lr, &o.beta1, &o.beta2, &o.eps, &o.weight_decay, &o.max_grad_norm};
        for (int i = 0; i < 6 && s == MHA_OK; i++)
            s = meta_double(os, ok[i], ov[i]);
        if (s == MHA_OK)
            s = mha_adamw_create(opt, m->n_params, &o);
        char name[NAME_LEN + 16];
        for (int64_t k = 0; s == MHA_OK && k < m->n_tensors; k++) {
            const param_info *p = &m->table[k];
            snprintf(name, sizeof name, "exp_avg.%s", p->name);
            s = load_into(os, name, p, opt->m + p->offset);
            snprintf(name, sizeof name, "exp_avg_sq.%s", p->name);
            if (s == MHA_OK)
                s = load_into(os, name, p, opt->v + p->offset);
        }
        if (s == MHA_OK)
            opt->step = ostep;
        else if (opt->m)
            mha_adamw_free(opt);
    }
    mha_safetensors_free(st);
    mha_safetensors_free(os);
    if (s != MHA_OK) {
        mha_model_free(m);
        return s;
    }
    if (step)
        *step = stp;
    if (seed)
        *seed = (uint64_t)sd;
    *out = m;
    return MHA_OK;
}
