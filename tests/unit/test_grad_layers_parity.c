/* test_grad_layers_parity.c - layer backward against PyTorch autograd
 * (tests/fixtures/layer_grad, gen_layer_grad_fixtures.py: float64 autograd
 * of nn.TransformerEncoderLayer / DecoderLayer and of the pieces, on the
 * fixtures' float32 inputs and weights).  Every gradient tensor must satisfy
 * the rule max|g - ref| <= 1e-4 * max(1, max|ref|); the forward
 * output of forward_train is checked too.  Some cases rerun with 1 and 3
 * threads and must agree bit for bit. */
#include "fixture.h"
#include "layers.h"

#define GRAD_TOL 1e-4
#define MAX_T 400

typedef struct bag {
    const fixture *f;
    mha_tensor t[MAX_T];
    char names[MAX_T][64];
    int n;
    bool failed;
} bag;

static mha_tensor *load(bag *b, const char *name, bool mask) {
    char file[96];
    snprintf(file, sizeof file, "%s.npy", name);
    if (!fixture_has(b->f, file) || b->n == MAX_T)
        return NULL;
    if (fixture_load(b->f, file, mask ? -1 : MHA_F32, &b->t[b->n]) != MHA_OK) {
        b->failed = true;
        return NULL;
    }
    snprintf(b->names[b->n], sizeof b->names[0], "%s", name);
    return &b->t[b->n++];
}

/* A zeroed gradient shaped like `like` (NULL when like is NULL). */
static mha_tensor *zeros_like(bag *b, const mha_tensor *like, const char *name) {
    if (!like || b->n == MAX_T)
        return NULL;
    if (mha_tensor_create(&b->t[b->n], MHA_F32, like->ndim, like->shape) != MHA_OK) {
        b->failed = true;
        return NULL;
    }
    snprintf(b->names[b->n], sizeof b->names[0], "mine_%s", name);
    return &b->t[b->n++];
}

static void drop(bag *b) {
    for (int i = 0; i < b->n; i++)
        mha_tensor_free(&b->t[i]);
    b->n = 0;
}

static int64_t numel(const mha_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* Compares every "mine_X" with "grad_X" from the fixture; worst error. */
static double compare_all(bag *b, double *worst_all) {
    double worst = 0.0;
    int n = b->n;
    for (int i = 0; i < n; i++) {
        if (strncmp(b->names[i], "mine_", 5))
            continue;
        char ref_name[80];
        snprintf(ref_name, sizeof ref_name, "grad_%s", b->names[i] + 5);
        mha_tensor *ref = load(b, ref_name, false);
        if (!ref || numel(ref) != numel(&b->t[i])) {
            printf("    %s: no reference %s\n", b->f->dir, ref_name);
            return INFINITY;
        }
        double e = test_rel_err(b->t[i].data, ref->data, (size_t)numel(ref));
        if (e > GRAD_TOL)
            printf("    %s: %s error %.3g\n", b->f->dir, ref_name, e);
        worst = fmax(worst, e);
    }
    *worst_all = fmax(*worst_all, worst);
    return worst;
}

static mha_activation act_named(const char *s) {
    return !strcmp(s, "gelu") ? MHA_ACT_GELU : !strcmp(s, "gelu_tanh") ? MHA_ACT_GELU_TANH
         : !strcmp(s, "silu") ? MHA_ACT_SILU : MHA_ACT_RELU;
}

static void attn_w(bag *b, const char *p, mha_multihead_weights *w, mha_multihead_grads *g) {
    char n[128];
    memset(w, 0, sizeof *w), memset(g, 0, sizeof *g);
#define ATT(field)                                              \
    snprintf(n, sizeof n, "%s_" #field, p);                     \
    w->field = load(b, n, false);                               \
    g->field = zeros_like(b, w->field, n);
    ATT(in_proj_weight) ATT(in_proj_bias) ATT(out_proj_weight) ATT(out_proj_bias)
#undef ATT
}

#define PARAM(w, g, field)                                      \
    (w)->field = load(b, #field, false);                        \
    (g)->field = zeros_like(b, (w)->field, #field);

/* the same under a prefix (stacks: "layers_0_") */
#define PPARAM(pre, w, g, field)                                \
    do {                                                        \
        char nm_[128];                                          \
        snprintf(nm_, sizeof nm_, "%s" #field, pre);            \
        (w)->field = load(b, nm_, false);                       \
        (g)->field = zeros_like(b, (w)->field, nm_);            \
    } while (0)

/* One layer case; threads > 0 sets the thread count.  Returns the worst
 * gradient error (inf on failure) and copies the input gradient to keep. */
static double run_stack(const fixture *f, bag *b, int threads, double *worst_all);

static double run_layer(const fixture *f, bag *b, int threads, float **keep, int64_t *keep_n,
                        double *worst_all) {
    bool dec = !strncmp(fixture_str(f, "kind"), "decoder", 7);
    if (!strcmp(fixture_str(f, "kind"), "encoder") || !strcmp(fixture_str(f, "kind"), "decoder"))
        return run_stack(f, b, threads, worst_all);
    mha_tensor *x = load(b, dec ? "tgt" : "src", false);
    mha_tensor *mem = dec ? load(b, "memory", false) : NULL;
    mha_tensor *dout = load(b, "dout", false), *ref_out = load(b, "out", false);
    mha_layer_masks masks = {load(b, "attn_mask", true), load(b, "key_padding_mask", true),
                             (int)fixture_int(f, "causal"), load(b, "memory_mask", true),
                             load(b, "memory_key_padding_mask", true)};
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = fixture_int(f, "heads");
    opt.norm_first = (int)fixture_int(f, "norm_first");
    opt.activation = act_named(fixture_str(f, "activation"));
    opt.layer_norm_eps = strtof(fixture_str(f, "eps"), NULL);
    opt.training = 1; /* dropout 0: same as PyTorch's train() with p = 0 */
    mha_encoder_layer_weights ew;
    mha_decoder_layer_weights dw;
    mha_encoder_layer_grads eg;
    mha_decoder_layer_grads dg;
    memset(&ew, 0, sizeof ew), memset(&dw, 0, sizeof dw);
    memset(&eg, 0, sizeof eg), memset(&dg, 0, sizeof dg);
    mha_tensor *dx = zeros_like(b, x, dec ? "tgt" : "src");
    mha_tensor *dmem = dec ? zeros_like(b, mem, "memory") : NULL;
    if (dec) {
        attn_w(b, "self_attn", &dw.self_attn, &dg.self_attn);
        attn_w(b, "multihead_attn", &dw.multihead_attn, &dg.multihead_attn);
        PARAM(&dw, &dg, linear1_weight) PARAM(&dw, &dg, linear1_bias)
        PARAM(&dw, &dg, linear2_weight) PARAM(&dw, &dg, linear2_bias)
        PARAM(&dw, &dg, norm1_weight) PARAM(&dw, &dg, norm1_bias)
        PARAM(&dw, &dg, norm2_weight) PARAM(&dw, &dg, norm2_bias)
        PARAM(&dw, &dg, norm3_weight) PARAM(&dw, &dg, norm3_bias)
    } else {
        attn_w(b, "self_attn", &ew.self_attn, &eg.self_attn);
        PARAM(&ew, &eg, linear1_weight) PARAM(&ew, &eg, linear1_bias)
        PARAM(&ew, &eg, linear2_weight) PARAM(&ew, &eg, linear2_bias)
        PARAM(&ew, &eg, norm1_weight) PARAM(&ew, &eg, norm1_bias)
        PARAM(&ew, &eg, norm2_weight) PARAM(&ew, &eg, norm2_bias)
    }
    if (b->failed || !x || !dout || !ref_out || (dec && !mem))
        return INFINITY;
    int64_t B = x->ndim == 3 ? x->shape[0] : 1, L = x->shape[x->ndim - 2],
            E = x->shape[x->ndim - 1], S = mem ? mem->shape[mem->ndim - 2] : L;
    int64_t F = (dec ? dw.linear1_weight : ew.linear1_weight)->shape[0];
    size_t sb, wb;
    if (mha_layer_saved_size(B, L, S, E, opt.num_heads, &sb) != MHA_OK ||
        mha_layer_train_workspace_size(B, L, S, E, F, opt.num_heads, &wb) != MHA_OK)
        return INFINITY;
    float *saved = malloc(sb), *ws = malloc(wb);
    mha_tensor out;
    mha_tensor_create(&out, MHA_F32, x->ndim, x->shape);
    int old = mha_get_num_threads();
    if (threads > 0)
        mha_set_num_threads(threads);
    mha_status st = dec ? mha_decoder_layer_forward_train(&out, saved, sb, x, mem, &dw, &masks,
                                                          &opt, ws, wb)
                        : mha_encoder_layer_forward_train(&out, saved, sb, x, &ew, &masks, &opt,
                                                          ws, wb);
    if (st == MHA_OK)
        st = dec ? mha_decoder_layer_backward(dx, dmem, &dg, dout, saved, sb, x, mem, &dw, &masks,
                                              &opt, ws, wb)
                 : mha_encoder_layer_backward(dx, &eg, dout, saved, sb, x, &ew, &masks, &opt, ws,
                                              wb);
    mha_set_num_threads(old);
    double e = INFINITY;
    if (st != MHA_OK) {
        printf("    %s: %s\n", f->dir, mha_last_error());
    } else {
        double eo = test_rel_err(out.data, ref_out->data, (size_t)numel(ref_out));
        if (eo > 1e-5)
            printf("    %s: forward_train output error %.3g\n", f->dir, eo);
        e = fmax(compare_all(b, worst_all), eo > 1e-5 ? INFINITY : 0.0);
        if (keep) {
            /* every gradient, concatenated, for the thread comparison */
            int64_t total = 0;
            for (int i = 0; i < b->n; i++)
                if (!strncmp(b->names[i], "mine_", 5))
                    total += numel(&b->t[i]);
            *keep = malloc(sizeof(float) * (size_t)total);
            *keep_n = 0;
            for (int i = 0; i < b->n; i++)
                if (!strncmp(b->names[i], "mine_", 5)) {
                    memcpy(*keep + *keep_n, b->t[i].data, sizeof(float) * (size_t)numel(&b->t[i]));
                    *keep_n += numel(&b->t[i]);
                }
        }
    }
    mha_tensor_free(&out);
    free(saved), free(ws);
    return e;
}

/* nn.TransformerEncoder / Decoder: layers_<i>_* and norm_*. */
static double run_stack(const fixture *f, bag *b, int threads, double *worst_all) {
    bool dec = !strcmp(fixture_str(f, "kind"), "decoder");
    const int64_t NL = fixture_int(f, "num_layers");
    mha_tensor *x = load(b, dec ? "tgt" : "src", false);
    mha_tensor *mem = dec ? load(b, "memory", false) : NULL;
    mha_tensor *dout = load(b, "dout", false), *ref_out = load(b, "out", false);
    mha_layer_masks masks = {load(b, "attn_mask", true), load(b, "key_padding_mask", true),
                             (int)fixture_int(f, "causal"), load(b, "memory_mask", true),
                             load(b, "memory_key_padding_mask", true)};
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = fixture_int(f, "heads");
    opt.norm_first = (int)fixture_int(f, "norm_first");
    opt.activation = act_named(fixture_str(f, "activation"));
    opt.layer_norm_eps = strtof(fixture_str(f, "eps"), NULL);
    opt.training = 1;
    mha_encoder_layer_weights ew[4];
    mha_decoder_layer_weights dw[4];
    mha_encoder_layer_grads eg[4];
    mha_decoder_layer_grads dg[4];
    memset(ew, 0, sizeof ew), memset(dw, 0, sizeof dw);
    memset(eg, 0, sizeof eg), memset(dg, 0, sizeof dg);
    if (NL < 1 || NL > 4)
        return INFINITY;
    mha_tensor *dx = zeros_like(b, x, dec ? "tgt" : "src");
    mha_tensor *dmem = dec ? zeros_like(b, mem, "memory") : NULL;
    for (int64_t l = 0; l < NL; l++) {
        char p[32], a[64];
        snprintf(p, sizeof p, "layers_%lld_", (long long)l);
        if (dec) {
            snprintf(a, sizeof a, "%sself_attn", p);
            attn_w(b, a, &dw[l].self_attn, &dg[l].self_attn);
            snprintf(a, sizeof a, "%smultihead_attn", p);
            attn_w(b, a, &dw[l].multihead_attn, &dg[l].multihead_attn);
            PPARAM(p, &dw[l], &dg[l], linear1_weight); PPARAM(p, &dw[l], &dg[l], linear1_bias);
            PPARAM(p, &dw[l], &dg[l], linear2_weight); PPARAM(p, &dw[l], &dg[l], linear2_bias);
            PPARAM(p, &dw[l], &dg[l], norm1_weight); PPARAM(p, &dw[l], &dg[l], norm1_bias);
            PPARAM(p, &dw[l], &dg[l], norm2_weight); PPARAM(p, &dw[l], &dg[l], norm2_bias);
            PPARAM(p, &dw[l], &dg[l], norm3_weight); PPARAM(p, &dw[l], &dg[l], norm3_bias);
        } else {
            snprintf(a, sizeof a, "%sself_attn", p);
            attn_w(b, a, &ew[l].self_attn, &eg[l].self_attn);
            PPARAM(p, &ew[l], &eg[l], linear1_weight); PPARAM(p, &ew[l], &eg[l], linear1_bias);
            PPARAM(p, &ew[l], &eg[l], linear2_weight); PPARAM(p, &ew[l], &eg[l], linear2_bias);
            PPARAM(p, &ew[l], &eg[l], norm1_weight); PPARAM(p, &ew[l], &eg[l], norm1_bias);
            PPARAM(p, &ew[l], &eg[l], norm2_weight); PPARAM(p, &ew[l], &eg[l], norm2_bias);
        }
    }
    const int fn = (int)fixture_int(f, "final_norm");
    mha_tensor *nw = fn ? load(b, "norm_weight", false) : NULL;
    mha_tensor *nb = fn ? load(b, "norm_bias", false) : NULL;
    mha_tensor *dnw = zeros_like(b, nw, "norm_weight"), *dnb = zeros_like(b, nb, "norm_bias");
    if (b->failed || !x || !dout || !ref_out || (dec && !mem))
        return INFINITY;
    int64_t B = x->ndim == 3 ? x->shape[0] : 1, L = x->shape[x->ndim - 2],
            E = x->shape[x->ndim - 1], S = mem ? mem->shape[mem->ndim - 2] : L;
    int64_t F = (dec ? dw[0].linear1_weight : ew[0].linear1_weight)->shape[0];
    size_t sb, wb;
    if (mha_stack_saved_size(NL, B, L, S, E, opt.num_heads, &sb) != MHA_OK ||
        mha_stack_train_workspace_size(B, L, S, E, F, opt.num_heads, &wb) != MHA_OK)
        return INFINITY;
    float *saved = malloc(sb), *ws = malloc(wb);
    mha_tensor out;
    mha_tensor_create(&out, MHA_F32, x->ndim, x->shape);
    mha_encoder_weights es = {NL, ew, fn, nw, nb};
    mha_decoder_weights ds = {NL, dw, fn, nw, nb};
    mha_encoder_grads egs = {eg, dnw, dnb};
    mha_decoder_grads dgs = {dg, dnw, dnb};
    int old = mha_get_num_threads();
    if (threads > 0)
        mha_set_num_threads(threads);
    mha_status st = dec ? mha_decoder_forward_train(&out, saved, sb, x, mem, &ds, &masks, &opt, ws, wb)
                        : mha_encoder_forward_train(&out, saved, sb, x, &es, &masks, &opt, ws, wb);
    if (st == MHA_OK)
        st = dec ? mha_decoder_backward(dx, dmem, &dgs, dout, saved, sb, x, mem, &ds, &masks, &opt,
                                        ws, wb)
                 : mha_encoder_backward(dx, &egs, dout, saved, sb, x, &es, &masks, &opt, ws, wb);
    mha_set_num_threads(old);
    double e = INFINITY;
    if (st != MHA_OK) {
        printf("    %s: %s\n", f->dir, mha_last_error());
    } else {
        double eo = test_rel_err(out.data, ref_out->data, (size_t)numel(ref_out));
        if (eo > 1e-5)
            printf("    %s: forward_train output error %.3g\n", f->dir, eo);
        e = fmax(compare_all(b, worst_all), eo > 1e-5 ? INFINITY : 0.0);
    }
    mha_tensor_free(&out);
    free(saved), free(ws);
    return e;
}

TEST(grad_layers_match_pytorch_autograd) {
    static char names[128][128];
    int n = fixture_list("layer_grad", names, 128);
    CHECK(n >= 60);
    int layers = 0, pieces = 0, bad = 0;
    double worst = 0.0;
    for (int c = 0; c < n; c++) {
        fixture f;
        REQUIRE(fixture_open(&f, "layer_grad", names[c]));
        const char *kind = fixture_str(&f, "kind");
        bag bs = {.f = &f}, *b = &bs;
        double e;
        if (!strcmp(kind, "encoder_layer") || !strcmp(kind, "decoder_layer") ||
            !strcmp(kind, "encoder") || !strcmp(kind, "decoder")) {
            e = run_layer(&f, b, 0, NULL, NULL, &worst);
            layers++;
        } else {
            pieces++;
            mha_tensor *x = load(b, "x", false), *dout = load(b, "dout", false);
            mha_tensor *dx = zeros_like(b, x, "x");
            const float eps = strtof(fixture_str(&f, "eps"), NULL);
            mha_status st = MHA_ERR_VALUE;
            if (!strcmp(kind, "layernorm") || !strcmp(kind, "rmsnorm") ||
                !strcmp(kind, "linear")) {
                mha_tensor *w = load(b, "weight", false), *bi = load(b, "bias", false);
                mha_tensor *dw = zeros_like(b, w, "weight"), *db = zeros_like(b, bi, "bias");
                if (!strcmp(kind, "layernorm"))
                    st = mha_layernorm_backward(dx, dw, db, dout, x, w, eps);
                else if (!strcmp(kind, "rmsnorm"))
                    st = mha_rmsnorm_backward(dx, dw, dout, x, w, eps);
                else
                    st = mha_linear_backward(dx, dw, db, dout, x, w);
            } else if (!strcmp(kind, "activation")) {
                st = mha_activation_backward(dx, dout, x, act_named(fixture_str(&f, "activation")));
            } else if (!strcmp(kind, "mlp")) {
                mha_mlp_weights w;
                mha_mlp_grads g;
                PARAM(&w, &g, linear1_weight) PARAM(&w, &g, linear1_bias)
                PARAM(&w, &g, linear2_weight) PARAM(&w, &g, linear2_bias)
                PARAM(&w, &g, linear3_weight) PARAM(&w, &g, linear3_bias)
                st = mha_mlp_backward(dx, &g, dout, x, &w, act_named(fixture_str(&f, "activation")),
                                      NULL, 0);
            }
            if (st != MHA_OK)
                printf("    %s: %s\n", f.dir, mha_last_error());
            e = st == MHA_OK && !b->failed ? compare_all(b, &worst) : INFINITY;
        }
        if (!(e <= GRAD_TOL))
            bad++;
        drop(b);
    }
    CHECK(bad == 0);
    CHECK(layers >= 56 && pieces >= 15);
    printf("    layer_grad: %d layer/stack + %d piece cases, worst normalised error %.3g\n", layers,
           pieces, worst);
}

TEST(grad_layers_bit_identical_any_threads) {
    static char names[128][128];
    int n = fixture_list("layer_grad", names, 128), done = 0;
    for (int c = 0; c < n; c++) {
        fixture f;
        REQUIRE(fixture_open(&f, "layer_grad", names[c]));
        const char *kind = fixture_str(&f, "kind");
        if (strcmp(kind, "encoder_layer") && strcmp(kind, "decoder_layer"))
            continue;
        if (c % 5)
            continue; /* a spread of encoder/decoder, pre/post, masks */
        float *g[2] = {NULL, NULL};
        int64_t gn[2] = {0, 0};
        double worst = 0.0;
        for (int t = 0; t < 2; t++) {
            bag b = {.f = &f};
            run_layer(&f, &b, t ? 3 : 1, &g[t], &gn[t], &worst);
            drop(&b);
        }
        CHECK(g[0] && g[1] && gn[0] == gn[1] && memcmp(g[0], g[1], sizeof(float) * gn[0]) == 0);
        free(g[0]), free(g[1]);
        done++;
    }
    CHECK(done >= 8);
}

TEST(grad_layer_errors) {
    mha_tensor X;
    float *x = test_tensor(&X, 3, (int64_t[]){2, 3, 4}, 1);
    mha_encoder_layer_weights w;
    memset(&w, 0, sizeof w);
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = 3;
    size_t bytes;
    CHECK_STATUS(mha_layer_saved_size(2, 3, 3, 4, 3, &bytes), MHA_ERR_SHAPE); /* 3 !| 4 */
    CHECK_STATUS(mha_layer_saved_size(2, 3, 3, 4, 2, NULL), MHA_ERR_NULL);
    CHECK_STATUS(mha_layer_train_workspace_size(-1, 3, 3, 4, 5, 2, &bytes), MHA_ERR_SHAPE);
    CHECK_STATUS(mha_encoder_layer_forward_train(&X, NULL, 0, &X, &w, NULL, &opt, NULL, 0),
                 MHA_ERR_NULL);
    free(x);
}

/* Layers with dropout (every site: attention weights, the residual
 * branches, the MLP hidden units): the backward must use the forward's keep
 * decisions.  PyTorch's RNG differs, so the check is central differences of
 * forward_train itself (same seed = same masks) on entries of the inputs and
 * of every parameter: loss sum(dout * out) accumulated in double, step 1e-2,
 * |g - fd| <= 2e-3 |fd| + 5e-4 (float32 forward noise / h).  GELU replaces
 * the fixtures' ReLU: a kink inside the step makes differences useless. */
TEST(grad_layers_dropout_finite_differences) {
    static char names[128][128];
    int n = fixture_list("layer_grad", names, 128), done = 0;
    const char *want[] = {"000_enc_post_relu", "011_enc_pre_relu", "023_dec_post_gelu",
                          "040_dec_pre_kpmb"};
    for (int c = 0; c < n; c++) {
        int pick = 0;
        for (int k = 0; k < 4; k++)
            pick |= !strcmp(names[c], want[k]);
        if (!pick)
            continue;
        fixture f;
        REQUIRE(fixture_open(&f, "layer_grad", names[c]));
        bag bs = {.f = &f}, *b = &bs;
        /* run_layer's setup, then dropout on, and gradients by hand */
        bool dec = !strncmp(fixture_str(&f, "kind"), "decoder", 7);
        mha_tensor *x = load(b, dec ? "tgt" : "src", false);
        mha_tensor *mem = dec ? load(b, "memory", false) : NULL;
        mha_tensor *dout = load(b, "dout", false);
        mha_layer_masks masks = {load(b, "attn_mask", true), load(b, "key_padding_mask", true),
                                 (int)fixture_int(&f, "causal"), load(b, "memory_mask", true),
                                 load(b, "memory_key_padding_mask", true)};
        mha_layer_options opt;
        mha_layer_options_init(&opt);
        opt.num_heads = fixture_int(&f, "heads");
        opt.norm_first = (int)fixture_int(&f, "norm_first");
        opt.activation = MHA_ACT_GELU; /* smooth: no ReLU kink within the step */
        opt.training = 1, opt.dropout_p = 0.2f, opt.seed = 99;
        mha_encoder_layer_weights ew;
        mha_decoder_layer_weights dw;
        mha_encoder_layer_grads eg;
        mha_decoder_layer_grads dg;
        memset(&ew, 0, sizeof ew), memset(&dw, 0, sizeof dw);
        memset(&eg, 0, sizeof eg), memset(&dg, 0, sizeof dg);
        mha_tensor *dx = zeros_like(b, x, "x");
        mha_tensor *dmem = dec ? zeros_like(b, mem, "memory") : NULL;
        if (dec) {
            attn_w(b, "self_attn", &dw.self_attn, &dg.self_attn);
            attn_w(b, "multihead_attn", &dw.multihead_attn, &dg.multihead_attn);
            PARAM(&dw, &dg, linear1_weight) PARAM(&dw, &dg, linear1_bias)
            PARAM(&dw, &dg, linear2_weight) PARAM(&dw, &dg, linear2_bias)
            PARAM(&dw, &dg, norm1_weight) PARAM(&dw, &dg, norm1_bias)
            PARAM(&dw, &dg, norm2_weight) PARAM(&dw, &dg, norm2_bias)
            PARAM(&dw, &dg, norm3_weight) PARAM(&dw, &dg, norm3_bias)
        } else {
            attn_w(b, "self_attn", &ew.self_attn, &eg.self_attn);
            PARAM(&ew, &eg, linear1_weight) PARAM(&ew, &eg, linear1_bias)
            PARAM(&ew, &eg, linear2_weight) PARAM(&ew, &eg, linear2_bias)
            PARAM(&ew, &eg, norm1_weight) PARAM(&ew, &eg, norm1_bias)
            PARAM(&ew, &eg, norm2_weight) PARAM(&ew, &eg, norm2_bias)
        }
        REQUIRE(!b->failed && x && dout);
        int64_t B = x->ndim == 3 ? x->shape[0] : 1, L = x->shape[x->ndim - 2],
                E = x->shape[x->ndim - 1], S = mem ? mem->shape[mem->ndim - 2] : L;
        int64_t F = (dec ? dw.linear1_weight : ew.linear1_weight)->shape[0];
        size_t sb, wb;
        REQUIRE_OK(mha_layer_saved_size(B, L, S, E, opt.num_heads, &sb));
        REQUIRE_OK(mha_layer_train_workspace_size(B, L, S, E, F, opt.num_heads, &wb));
        float *saved = malloc(sb), *ws = malloc(wb);
        mha_tensor out;
        REQUIRE_OK(mha_tensor_create(&out, MHA_F32, x->ndim, x->shape));
#define FWD()                                                                                  \
    (dec ? mha_decoder_layer_forward_train(&out, saved, sb, x, mem, &dw, &masks, &opt, ws, wb) \
         : mha_encoder_layer_forward_train(&out, saved, sb, x, &ew, &masks, &opt, ws, wb))
        REQUIRE_OK(FWD());
        REQUIRE_OK(dec ? mha_decoder_layer_backward(dx, dmem, &dg, dout, saved, sb, x, mem, &dw,
                                                    &masks, &opt, ws, wb)
                       : mha_encoder_layer_backward(dx, &eg, dout, saved, sb, x, &ew, &masks,
                                                    &opt, ws, wb));
        /* every (input or weight, its gradient) pair: 4 entries each */
        int bad = 0, checked = 0, nb = b->n;
        for (int i = 0; i < nb; i++) {
            if (strncmp(b->names[i], "mine_", 5))
                continue;
            const char *base = b->names[i] + 5;
            mha_tensor *p = NULL;
            for (int j = 0; j < nb; j++)
                if (!strcmp(b->names[j], base) ||
                    (!strcmp(base, "x") && !strcmp(b->names[j], dec ? "tgt" : "src")))
                    p = &b->t[j];
            REQUIRE(p != NULL);
            const int64_t ne = numel(p);
            for (int k = 0; k < 4; k++) {
                const int64_t e = (ne - 1) * k / 3;
                float *v = (float *)p->data + e;
                const float keep = *v, h = 1e-2f;
                double l[2];
                for (int s = 0; s < 2; s++) {
                    *v = keep + (s ? -h : h);
                    REQUIRE_OK(FWD());
                    l[s] = 0.0;
                    for (int64_t q = 0; q < numel(&out); q++)
                        l[s] += (double)((float *)out.data)[q] * ((float *)dout->data)[q];
                }
                *v = keep;
                const double fd = (l[0] - l[1]) / (2.0 * h), g = ((float *)b->t[i].data)[e];
                if (fabs(g - fd) > 2e-3 * fabs(fd) + 5e-4) {
                    bad++;
                    printf("    %s dropout: %s[%lld] grad %.6g fd %.6g\n", names[c], base,
                           (long long)e, g, fd);
                }
                checked++;
            }
        }
#undef FWD
        CHECK(bad == 0);
        CHECK(checked >= 4 * 13);
        mha_tensor_free(&out);
        free(saved), free(ws);
        drop(b);
        done++;
    }
    CHECK(done == 4);
}
