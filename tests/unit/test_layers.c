/* test_layers.c - the Transformer layers: pieces against their float64
 * references, PyTorch parity on tests/fixtures/layers, the workspace plan
 * (zero allocations), error paths. */
#include "fixture.h"
#include "layers.h"

/* ---- pieces against their references -------------------------------------- */

TEST(layers_layernorm_matches_reference) {
    const int64_t widths[] = {1, 2, 7, 33, 100};
    for (int k = 0; k < 5; k++)
        for (int variant = 0; variant < 4; variant++) {
            int64_t N = 5, E = widths[k];
            float *x = malloc(sizeof(float) * N * E), *y = malloc(sizeof(float) * N * E),
                  *r = malloc(sizeof(float) * N * E), w[100], b[100];
            test_randn(x, N * E, 11 + k);
            for (int64_t i = 0; i < N * E; i++)
                x[i] = x[i] * 3.0f + 5.0f; /* an offset mean tests the two passes */
            test_randn(w, 100, 12), test_randn(b, 100, 13);
            const float *wp = variant & 1 ? w : NULL, *bp = variant & 2 ? b : NULL;
            mha_layernorm_f32(y, x, N, E, wp, bp, 1e-5f);
            mha_layernorm_ref(r, x, N, E, wp, bp, 1e-5f);
            CHECK(test_rel_err(y, r, N * E) < 1e-6);
            mha_rmsnorm_f32(y, x, N, E, wp, 1e-6f);
            mha_rmsnorm_ref(r, x, N, E, wp, 1e-6f);
            CHECK(test_rel_err(y, r, N * E) < 1e-6);
            free(x), free(y), free(r);
        }
}

TEST(layers_activations_match_reference) {
    enum { n = 2001 };
    static float x[n], y[n], r[n];
    for (int i = 0; i < n; i++)
        x[i] = -10.0f + 20.0f * (float)i / (n - 1);
    for (int a = MHA_ACT_RELU; a <= MHA_ACT_SILU; a++) {
        mha_activation_f32(y, x, n, (mha_activation)a);
        for (int i = 0; i < n; i++)
            r[i] = (float)mha_activation_ref(x[i], (mha_activation)a);
        CHECK(test_rel_err(y, r, n) < 1e-6);
    }
    CHECK(strcmp(mha_activation_name(MHA_ACT_GELU_TANH), "gelu_tanh") == 0);
    /* ReLU keeps NaN, like torch.relu */
    float nan_in = NAN, out;
    mha_activation_f32(&out, &nan_in, 1, MHA_ACT_RELU);
    CHECK(isnan(out));
}

TEST(layers_mlp_matches_reference) {
    for (int gated = 0; gated < 2; gated++)
        for (int bias = 0; bias < 2; bias++) {
            int64_t N = 6, E = 9, F = 13;
            mha_tensor X, W1, B1, W2, B2, W3, B3, Y;
            float *x = test_tensor(&X, 2, (int64_t[]){N, E}, 1);
            float *w1 = test_tensor(&W1, 2, (int64_t[]){F, E}, 2);
            float *b1 = test_tensor(&B1, 1, (int64_t[]){F}, 3);
            float *w2 = test_tensor(&W2, 2, (int64_t[]){E, F}, 4);
            float *b2 = test_tensor(&B2, 1, (int64_t[]){E}, 5);
            float *w3 = test_tensor(&W3, 2, (int64_t[]){F, E}, 6);
            float *b3 = test_tensor(&B3, 1, (int64_t[]){F}, 7);
            float *y = test_tensor(&Y, 2, (int64_t[]){N, E}, 8), ref[6 * 9];
            mha_mlp_weights w = {&W1, bias ? &B1 : NULL, &W2, bias ? &B2 : NULL,
                                 gated ? &W3 : NULL, gated && bias ? &B3 : NULL};
            mha_activation act = gated ? MHA_ACT_SILU : MHA_ACT_GELU;
            CHECK_STATUS(mha_mlp_forward(&Y, &X, &w, act, NULL, 0), MHA_OK);
            mha_mlp_raw raw;
            CHECK_STATUS(mha_mlp_resolve(&w, E, &raw), MHA_OK);
            mha_mlp_ref(ref, x, N, &raw, act);
            CHECK(test_rel_err(y, ref, N * E) < 1e-5);
            /* planned: no allocation */
            size_t bytes;
            CHECK_STATUS(mha_mlp_workspace_size(N, F, gated, &bytes), MHA_OK);
            float *ws = malloc(bytes);
            int64_t before = mha_test_alloc_count();
            CHECK_STATUS(mha_mlp_forward(&Y, &X, &w, act, ws, bytes), MHA_OK);
            CHECK(mha_test_alloc_count() == before);
            CHECK_STATUS(mha_mlp_forward(&Y, &X, &w, act, ws, bytes - 4), MHA_ERR_VALUE);
            CHECK_STATUS(mha_mlp_forward(&X, &X, &w, act, ws, bytes), MHA_ERR_ALIAS);
            free(ws);
            free(x), free(w1), free(b1), free(w2), free(b2), free(w3), free(b3), free(y);
        }
}

TEST(layers_linear_residual_dropout) {
    mha_tensor X, W, B, Y, Z;
    float *x = test_tensor(&X, 3, (int64_t[]){2, 3, 5}, 1);
    float *w = test_tensor(&W, 2, (int64_t[]){4, 5}, 2);
    float *b = test_tensor(&B, 1, (int64_t[]){4}, 3);
    float *y = test_tensor(&Y, 3, (int64_t[]){2, 3, 4}, 4);
    CHECK_STATUS(mha_linear_forward(&Y, &X, &W, &B), MHA_OK);
    double worst = 0;
    for (int r = 0; r < 6; r++)
        for (int o = 0; o < 4; o++) {
            double acc = b[o];
            for (int c = 0; c < 5; c++)
                acc += (double)x[r * 5 + c] * w[o * 5 + c];
            worst = fmax(worst, fabs(acc - y[r * 4 + o]));
        }
    CHECK(worst < 1e-5);
    CHECK_STATUS(mha_linear_forward(&X, &X, &W, &B), MHA_ERR_SHAPE);
    CHECK_STATUS(mha_linear_forward(&Y, &X, &W, &W), MHA_ERR_SHAPE);

    /* residual, in place */
    float *z = test_tensor(&Z, 3, (int64_t[]){2, 3, 5}, 5), keep[30];
    memcpy(keep, z, sizeof keep);
    CHECK_STATUS(mha_residual_forward(&Z, &X, &Z), MHA_OK);
    for (int i = 0; i < 30; i++)
        CHECK(z[i] == keep[i] + x[i]);

    /* dropout: identity when not training, about p dropped, kept scaled */
    enum { n = 20000 };
    mha_tensor D, O;
    float *d = test_tensor(&D, 1, (int64_t[]){n}, 6), *o = test_tensor(&O, 1, (int64_t[]){n}, 7);
    CHECK_STATUS(mha_dropout_forward(&O, &D, 0.3f, 0, 1, 0), MHA_OK);
    CHECK(memcmp(o, d, sizeof(float) * n) == 0);
    CHECK_STATUS(mha_dropout_forward(&O, &D, 0.3f, 1, 1, 0), MHA_OK);
    int zeros = 0, scaled = 1;
    for (int i = 0; i < n; i++) {
        if (o[i] == 0.0f)
            zeros++;
        else if (fabsf(o[i] - d[i] / 0.7f) > 1e-6f * fabsf(d[i]) + 1e-7f)
            scaled = 0;
    }
    CHECK(scaled);
    CHECK(fabs(zeros / (double)n - 0.3) < 0.02);
    int same = 1, other_stream_same = 1;
    float *o2 = malloc(sizeof(float) * n);
    mha_tensor O2 = O;
    O2.data = o2;
    CHECK_STATUS(mha_dropout_forward(&O2, &D, 0.3f, 1, 1, 0), MHA_OK);
    same = memcmp(o, o2, sizeof(float) * n) == 0;
    CHECK_STATUS(mha_dropout_forward(&O2, &D, 0.3f, 1, 1, 1), MHA_OK);
    other_stream_same = memcmp(o, o2, sizeof(float) * n) == 0;
    CHECK(same && !other_stream_same);
    CHECK_STATUS(mha_dropout_forward(&O, &D, 1.0f, 1, 1, 0), MHA_ERR_VALUE);
    CHECK_STATUS(mha_dropout_forward(&O, &D, NAN, 1, 1, 0), MHA_ERR_VALUE);
    free(o2), free(d), free(o), free(x), free(w), free(b), free(y), free(z);
}

TEST(layers_norm_errors) {
    mha_tensor X, Y, W;
    float *x = test_tensor(&X, 2, (int64_t[]){3, 4}, 1), *y = test_tensor(&Y, 2, (int64_t[]){3, 4}, 2);
    float *w = test_tensor(&W, 1, (int64_t[]){5}, 3);
    CHECK_STATUS(mha_layernorm_forward(&Y, &X, &W, NULL, 1e-5f), MHA_ERR_SHAPE);
    CHECK_ERROR_MENTIONS("weight");
    CHECK_STATUS(mha_layernorm_forward(&Y, &X, NULL, NULL, 0.0f), MHA_ERR_VALUE);
    CHECK_STATUS(mha_rmsnorm_forward(&Y, &X, NULL, NAN), MHA_ERR_VALUE);
    CHECK_STATUS(mha_layernorm_forward(NULL, &X, NULL, NULL, 1e-5f), MHA_ERR_NULL);
    CHECK_STATUS(mha_layernorm_forward(&X, &X, NULL, NULL, 1e-5f), MHA_OK); /* in place */
    mha_tensor part = X; /* overlaps x shifted by one row: not allowed */
    part.data = x + 4, part.shape[0] = 2;
    mha_tensor src2 = X;
    src2.shape[0] = 2;
    CHECK_STATUS(mha_layernorm_forward(&part, &src2, NULL, NULL, 1e-5f), MHA_ERR_ALIAS);
    mha_tensor strided = X;
    strided.stride[0] = 8, strided.shape[0] = 1;
    strided.shape[1] = 4, strided.stride[1] = 2;
    CHECK_STATUS(mha_layernorm_forward(&Y, &strided, NULL, NULL, 1e-5f), MHA_ERR_SHAPE);
    free(x), free(y), free(w);
}

/* ---- PyTorch parity ----------------------------------------------------------- */

#define MAX_HELD 160

typedef struct held {
    mha_tensor t[MAX_HELD];
    int n;
    const fixture *f;
    bool failed;
} held;

/* DIR/<name>.npy as float (or its own kind for masks), NULL when absent. */
static const mha_tensor *get(held *h, const char *name, bool mask) {
    char file[160];
    snprintf(file, sizeof file, "%s.npy", name);
    if (!fixture_has(h->f, file) || h->n == MAX_HELD)
        return NULL;
    if (fixture_load(h->f, file, mask ? -1 : MHA_F32, &h->t[h->n]) != MHA_OK) {
        h->failed = true;
        return NULL;
    }
    return &h->t[h->n++];
}

static const mha_tensor *getp(held *h, const char *prefix, const char *name) {
    char key[160];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    return get(h, key, false);
}

static void release(held *h) {
    for (int i = 0; i < h->n; i++)
        mha_tensor_free(&h->t[i]);
    h->n = 0;
}

static void attn_weights(held *h, const char *prefix, mha_multihead_weights *w) {
    memset(w, 0, sizeof *w);
    char p[128];
    snprintf(p, sizeof p, "%s_", prefix);
    w->in_proj_weight = getp(h, p, "in_proj_weight");
    w->in_proj_bias = getp(h, p, "in_proj_bias");
    w->out_proj_weight = getp(h, p, "out_proj_weight");
    w->out_proj_bias = getp(h, p, "out_proj_bias");
}

static void enc_weights(held *h, const char *p, mha_encoder_layer_weights *w) {
    char a[128];
    snprintf(a, sizeof a, "%sself_attn", p);
    attn_weights(h, a, &w->self_attn);
    w->linear1_weight = getp(h, p, "linear1_weight"), w->linear1_bias = getp(h, p, "linear1_bias");
    w->linear2_weight = getp(h, p, "linear2_weight"), w->linear2_bias = getp(h, p, "linear2_bias");
    w->norm1_weight = getp(h, p, "norm1_weight"), w->norm1_bias = getp(h, p, "norm1_bias");
    w->norm2_weight = getp(h, p, "norm2_weight"), w->norm2_bias = getp(h, p, "norm2_bias");
}

static void dec_weights(held *h, const char *p, mha_decoder_layer_weights *w) {
    char a[128];
    snprintf(a, sizeof a, "%sself_attn", p);
    attn_weights(h, a, &w->self_attn);
    snprintf(a, sizeof a, "%smultihead_attn", p);
    attn_weights(h, a, &w->multihead_attn);
    w->linear1_weight = getp(h, p, "linear1_weight"), w->linear1_bias = getp(h, p, "linear1_bias");
    w->linear2_weight = getp(h, p, "linear2_weight"), w->linear2_bias = getp(h, p, "linear2_bias");
    w->norm1_weight = getp(h, p, "norm1_weight"), w->norm1_bias = getp(h, p, "norm1_bias");
    w->norm2_weight = getp(h, p, "norm2_weight"), w->norm2_bias = getp(h, p, "norm2_bias");
    w->norm3_weight = getp(h, p, "norm3_weight"), w->norm3_bias = getp(h, p, "norm3_bias");
}

static mha_activation act_of(const char *s) {
    return !strcmp(s, "gelu") ? MHA_ACT_GELU : !strcmp(s, "gelu_tanh") ? MHA_ACT_GELU_TANH
         : !strcmp(s, "silu") ? MHA_ACT_SILU : MHA_ACT_RELU;
}


/* Runs one layer case twice: workspace inside, then planned (no allocation
 * but the attention kernel's own); returns the normalised error (inf on
 * failure). */
static double run_layer_case(const fixture *f, held *h) {
    const char *kind = fixture_str(f, "kind");
    bool dec = !strncmp(kind, "decoder", 7), stack = !strcmp(kind, "encoder") || !strcmp(kind, "decoder");
    int64_t nl = stack ? fixture_int(f, "num_layers") : 1;
    const mha_tensor *x = get(h, dec ? "tgt" : "src", false);
    const mha_tensor *mem = dec ? get(h, "memory", false) : NULL;
    const mha_tensor *ref = get(h, "out", false);
    mha_layer_masks masks = {get(h, "attn_mask", true), get(h, "key_padding_mask", true),
                             (int)fixture_int(f, "causal"), get(h, "memory_mask", true),
                             get(h, "memory_key_padding_mask", true)};
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = fixture_int(f, "heads");
    opt.norm_first = (int)fixture_int(f, "norm_first");
    opt.activation = act_of(fixture_str(f, "activation"));
    opt.layer_norm_eps = strtof(fixture_str(f, "eps"), NULL);
    opt.kernel = MHA_KERNEL_SCALAR; /* the ref kernel allocates scratch */
    mha_encoder_layer_weights ew[3];
    mha_decoder_layer_weights dw[3];
    memset(ew, 0, sizeof ew), memset(dw, 0, sizeof dw);
    for (int64_t l = 0; l < nl && l < 3; l++) {
        char p[32] = "";
        if (stack)
            snprintf(p, sizeof p, "layers_%lld_", (long long)l);
        if (dec)
            dec_weights(h, p, &dw[l]);
        else
            enc_weights(h, p, &ew[l]);
    }
    int fn = (int)fixture_int(f, "final_norm");
    const mha_tensor *nw = fn ? get(h, "norm_weight", false) : NULL, *nb = fn ? get(h, "norm_bias", false) : NULL;
    if (h->failed || !x || !ref || (dec && !mem))
        return INFINITY;
    mha_tensor out;
    if (mha_tensor_create(&out, MHA_F32, x->ndim, x->shape) != MHA_OK)
        return INFINITY;
    int64_t B = x->ndim == 3 ? x->shape[0] : 1, L = x->shape[x->ndim - 2], E = x->shape[x->ndim - 1];
    int64_t S = mem ? mem->shape[mem->ndim - 2] : L;
    int64_t F = (dec ? dw[0].linear1_weight : ew[0].linear1_weight)->shape[0];
    size_t bytes;
    double err = INFINITY;
    mha_status st = dec ? mha_decoder_workspace_size(B, L, S, E, F, &bytes)
                        : mha_encoder_workspace_size(B, L, E, F, &bytes);
    void *ws = st == MHA_OK ? malloc(bytes) : NULL;
    for (int pass = 0; ws && pass < 2; pass++) {
        void *w = pass ? ws : NULL;
        int64_t before = mha_test_alloc_count();
        mha_encoder_weights es = {nl, ew, fn, nw, nb};
        mha_decoder_weights ds = {nl, dw, fn, nw, nb};
        if (dec)
            st = stack ? mha_decoder_forward(&out, x, mem, &ds, &masks, &opt, w, bytes)
                       : mha_decoder_layer_forward(&out, x, mem, &dw[0], &masks, &opt, w, bytes);
        else
            st = stack ? mha_encoder_forward(&out, x, &es, &masks, &opt, w, bytes)
                       : mha_encoder_layer_forward(&out, x, &ew[0], &masks, &opt, w, bytes);
        if (st != MHA_OK) {
            fprintf(stderr, "  %s: %s\n", f->dir, mha_last_error());
            err = INFINITY;
            break;
        }
        if (pass == 1 && mha_test_alloc_count() != before) { /* issue 4: a planned forward allocates nothing */
            fprintf(stderr, "  %s: planned forward allocated %lld times, want 0\n", f->dir,
                    (long long)(mha_test_alloc_count() - before));
            err = INFINITY;
            break;
        }
        int64_t n;
        mha_tensor_numel(&out, &n);
        double e = test_rel_err(out.data, ref->data, (size_t)n);
        err = pass ? fmax(err, e) : e;
    }
    free(ws);
    mha_tensor_free(&out);
    return err;
}

static double run_piece_case(const fixture *f, held *h) {
    const char *kind = fixture_str(f, "kind");
    const mha_tensor *x = get(h, "src", false), *ref = get(h, "out", false);
    if (!x || !ref)
        return INFINITY;
    mha_tensor out;
    if (mha_tensor_create(&out, MHA_F32, ref->ndim, ref->shape) != MHA_OK)
        return INFINITY;
    float eps = strtof(fixture_str(f, "eps"), NULL);
    mha_activation act = act_of(fixture_str(f, "activation"));
    mha_status st;
    if (!strcmp(kind, "layernorm"))
        st = mha_layernorm_forward(&out, x, get(h, "weight", false), get(h, "bias", false), eps);
    else if (!strcmp(kind, "rmsnorm"))
        st = mha_rmsnorm_forward(&out, x, get(h, "weight", false), eps);
    else if (!strcmp(kind, "activation"))
        st = mha_activation_forward(&out, x, act);
    else {
        mha_mlp_weights w = {get(h, "linear1_weight", false), get(h, "linear1_bias", false),
                             get(h, "linear2_weight", false), get(h, "linear2_bias", false),
                             get(h, "linear3_weight", false), get(h, "linear3_bias", false)};
        st = mha_mlp_forward(&out, x, &w, act, NULL, 0);
    }
    double err = INFINITY;
    if (st == MHA_OK) {
        int64_t n;
        mha_tensor_numel(&out, &n);
        err = test_rel_err(out.data, ref->data, (size_t)n);
    } else {
        fprintf(stderr, "  %s: %s\n", f->dir, mha_last_error());
    }
    mha_tensor_free(&out);
    return err;
}

TEST(layers_parity_pytorch) {
    static char names[512][128];
    int n = fixture_list("layers", names, 512), n_layer = 0;
    REQUIRE(n >= 60);
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        fixture f;
        REQUIRE(fixture_open(&f, "layers", names[i]));
        held *h = calloc(1, sizeof *h);
        REQUIRE(h != NULL);
        h->f = &f;
        const char *kind = fixture_str(&f, "kind");
        bool layer = !strcmp(kind, "encoder_layer") || !strcmp(kind, "decoder_layer") ||
                     !strcmp(kind, "encoder") || !strcmp(kind, "decoder");
        double e = layer ? run_layer_case(&f, h) : run_piece_case(&f, h);
        n_layer += layer;
        if (!(e <= 1e-5))
            test_fail(__FILE__, __LINE__, "%s: error %.3g > 1e-5", names[i], e);
        worst = fmax(worst, e);
        release(h);
        free(h);
    }
    CHECK(n_layer >= 60);
    if (getenv("MHA_TEST_VERBOSE"))
        printf("  layers parity: %d cases (%d layers/stacks), worst normalised error %.3g\n", n,
               n_layer, worst);
}

/* ---- layer behaviour beyond parity ---------------------------------------------- */

TEST(layers_encoder_inplace_workspace_errors_dropout) {
    const int64_t B = 2, L = 5, E = 6, F = 10;
    mha_tensor X, Wi, Bi, Wo, Bo, W1, B1, W2, B2, G1, H1, G2, H2, Y, Z;
    float *bufs[] = {
        test_tensor(&X, 3, (int64_t[]){B, L, E}, 1), test_tensor(&Wi, 2, (int64_t[]){3 * E, E}, 2),
        test_tensor(&Bi, 1, (int64_t[]){3 * E}, 3), test_tensor(&Wo, 2, (int64_t[]){E, E}, 4),
        test_tensor(&Bo, 1, (int64_t[]){E}, 5),     test_tensor(&W1, 2, (int64_t[]){F, E}, 6),
        test_tensor(&B1, 1, (int64_t[]){F}, 7),     test_tensor(&W2, 2, (int64_t[]){E, F}, 8),
        test_tensor(&B2, 1, (int64_t[]){E}, 9),     test_tensor(&G1, 1, (int64_t[]){E}, 10),
        test_tensor(&H1, 1, (int64_t[]){E}, 11),    test_tensor(&G2, 1, (int64_t[]){E}, 12),
        test_tensor(&H2, 1, (int64_t[]){E}, 13),    test_tensor(&Y, 3, (int64_t[]){B, L, E}, 14),
        test_tensor(&Z, 3, (int64_t[]){B, L, E}, 15)};
    mha_encoder_layer_weights w = {{&Wi, NULL, NULL, NULL, &Bi, &Wo, &Bo, NULL, NULL},
                                   &W1, &B1, &W2, &B2, &G1, &H1, &G2, &H2};
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = 2;
    for (int nf = 0; nf < 2; nf++) {
        opt.norm_first = nf;
        REQUIRE_OK(mha_encoder_layer_forward(&Y, &X, &w, NULL, &opt, NULL, 0));
        memcpy(Z.data, X.data, sizeof(float) * B * L * E);
        REQUIRE_OK(mha_encoder_layer_forward(&Z, &Z, &w, NULL, &opt, NULL, 0)); /* in place */
        CHECK(memcmp(Y.data, Z.data, sizeof(float) * B * L * E) == 0);
    }
    size_t bytes;
    REQUIRE_OK(mha_encoder_workspace_size(B, L, E, F, &bytes));
    void *ws = malloc(bytes);
    CHECK_STATUS(mha_encoder_layer_forward(&Y, &X, &w, NULL, &opt, ws, bytes - 1), MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("workspace");
    opt.layer_norm_eps = 0.0f;
    CHECK_STATUS(mha_encoder_layer_forward(&Y, &X, &w, NULL, &opt, ws, bytes), MHA_ERR_VALUE);
    opt.layer_norm_eps = 1e-5f;
    opt.num_heads = 4; /* does not divide 6 */
    CHECK_STATUS(mha_encoder_layer_forward(&Y, &X, &w, NULL, &opt, ws, bytes), MHA_ERR_SHAPE);
    opt.num_heads = 2;
    mha_encoder_layer_weights bad = w;
    bad.linear2_weight = &W1; /* (F,E) where (E,F) is wanted */
    CHECK_STATUS(mha_encoder_layer_forward(&Y, &X, &bad, NULL, &opt, ws, bytes), MHA_ERR_SHAPE);
    CHECK_ERROR_MENTIONS("linear2");
    mha_tensor part = Y; /* partial overlap with src */
    part.data = (float *)X.data + 1;
    CHECK_STATUS(mha_encoder_layer_forward(&part, &X, &w, NULL, &opt, ws, bytes), MHA_ERR_ALIAS);
    /* allocation failure without a workspace: NOMEM, no crash */
    mha_test_fail_alloc(1, 0);
    CHECK_STATUS(mha_encoder_layer_forward(&Y, &X, &w, NULL, &opt, NULL, 0), MHA_ERR_NOMEM);
    mha_test_fail_alloc(0, 0);
    /* dropout: deterministic per seed, different across seeds, off in eval */
    opt.training = 1, opt.dropout_p = 0.25f, opt.seed = 7;
    REQUIRE_OK(mha_encoder_layer_forward(&Y, &X, &w, NULL, &opt, ws, bytes));
    REQUIRE_OK(mha_encoder_layer_forward(&Z, &X, &w, NULL, &opt, ws, bytes));
    CHECK(memcmp(Y.data, Z.data, sizeof(float) * B * L * E) == 0);
    opt.seed = 8;
    REQUIRE_OK(mha_encoder_layer_forward(&Z, &X, &w, NULL, &opt, ws, bytes));
    CHECK(memcmp(Y.data, Z.data, sizeof(float) * B * L * E) != 0);
    opt.training = 0;
    REQUIRE_OK(mha_encoder_layer_forward(&Y, &X, &w, NULL, &opt, ws, bytes));
    opt.dropout_p = 0.0f;
    REQUIRE_OK(mha_encoder_layer_forward(&Z, &X, &w, NULL, &opt, ws, bytes));
    CHECK(memcmp(Y.data, Z.data, sizeof(float) * B * L * E) == 0);
    free(ws);
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
}
