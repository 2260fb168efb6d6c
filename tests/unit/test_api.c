/* test_api.c - the API rules of 0.2.0 (docs/api-migration.md): one causal
 * enum whose values mean the same everywhere, refused where a module does
 * not serve them, with nothing written; NULL options are the defaults
 * everywhere (bit-identical to passing *_init()'s options), and where the
 * defaults lack num_heads the call names it instead of a NULL pointer. */
#include "fixture.h"

/* A small self-attention problem: query (B,L,E), packed weights, H = 2. */
typedef struct mh_case {
    mha_tensor X, Wi, Bi, Wo, Bo, Y;
    float *bufs[6];
    mha_multihead_weights w;
} mh_case;

enum { MB = 2, ML = 5, ME = 6 };

static void mh_case_init(mh_case *c) {
    c->bufs[0] = test_tensor(&c->X, 3, (int64_t[]){MB, ML, ME}, 1);
    c->bufs[1] = test_tensor(&c->Wi, 2, (int64_t[]){3 * ME, ME}, 2);
    c->bufs[2] = test_tensor(&c->Bi, 1, (int64_t[]){3 * ME}, 3);
    c->bufs[3] = test_tensor(&c->Wo, 2, (int64_t[]){ME, ME}, 4);
    c->bufs[4] = test_tensor(&c->Bo, 1, (int64_t[]){ME}, 5);
    c->bufs[5] = test_tensor(&c->Y, 3, (int64_t[]){MB, ML, ME}, 6);
    c->w = (mha_multihead_weights){&c->Wi, NULL, NULL, NULL, &c->Bi, &c->Wo, &c->Bo, NULL, NULL};
}

static void mh_case_free(mh_case *c) {
    for (int i = 0; i < 6; i++)
        free(c->bufs[i]);
}

TEST(api_causal_top_left_is_one) {
    /* 0.1.0 callers set causal = 1 in multihead, layers and the model */
    CHECK(MHA_CAUSAL_NONE == 0 && MHA_CAUSAL_TOP_LEFT == 1);
    mha_multihead_options mo;
    mha_multihead_options_init(&mo);
    CHECK(mo.causal == MHA_CAUSAL_NONE);
    mha_model_config mc;
    mha_model_config_init(&mc);
    CHECK(mc.causal == MHA_CAUSAL_NONE);
}

TEST(api_causal_multihead_refuses_unserved_alignments) {
    mh_case c;
    mh_case_init(&c);
    mha_multihead_options opt;
    mha_multihead_options_init(&opt);
    opt.num_heads = 2;
    opt.causal = MHA_CAUSAL_TOP_LEFT;
    REQUIRE_OK(mha_multihead_forward(&c.Y, &c.X, &c.X, &c.X, &c.w, &opt));
    /* TOP_LEFT is tril(ones(L,S)): the same as a bool attn_mask with true
     * (masked) where j > i */
    uint8_t tri[ML * ML];
    for (int i = 0; i < ML; i++)
        for (int j = 0; j < ML; j++)
            tri[i * ML + j] = j > i;
    mha_tensor M, Z;
    mha_tensor_init(&M, MHA_BOOL, tri, 2, (int64_t[]){ML, ML});
    float *z = test_tensor(&Z, 3, (int64_t[]){MB, ML, ME}, 9);
    mha_multihead_options masked = opt;
    masked.causal = MHA_CAUSAL_NONE, masked.attn_mask = &M;
    REQUIRE_OK(mha_multihead_forward(&Z, &c.X, &c.X, &c.X, &c.w, &masked));
    CHECK(test_rel_err(c.Y.data, z, MB * ML * ME) < 1e-6);
    free(z);
    float keep[MB * ML * ME];
    memcpy(keep, c.Y.data, sizeof keep);
    const mha_causal bad[] = {MHA_CAUSAL_BOTTOM_RIGHT, MHA_CAUSAL_OFFSET, (mha_causal)7};
    for (int i = 0; i < 3; i++) {
        opt.causal = bad[i];
        CHECK_STATUS(mha_multihead_forward(&c.Y, &c.X, &c.X, &c.X, &c.w, &opt), MHA_ERR_VALUE);
        CHECK_ERROR_MENTIONS("MHA_CAUSAL_TOP_LEFT");
        CHECK(memcmp(keep, c.Y.data, sizeof keep) == 0); /* nothing written */
    }
    mh_case_free(&c);
}

TEST(api_causal_layers_and_model_refuse_unserved_alignments) {
    mh_case c;
    mh_case_init(&c);
    const int64_t F = 7;
    mha_tensor W1, W2;
    float *w1 = test_tensor(&W1, 2, (int64_t[]){F, ME}, 7);
    float *w2 = test_tensor(&W2, 2, (int64_t[]){ME, F}, 8);
    mha_encoder_layer_weights w = {c.w, &W1, NULL, &W2, NULL, NULL, NULL, NULL, NULL};
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = 2;
    mha_layer_masks masks = {0};
    masks.causal = MHA_CAUSAL_TOP_LEFT;
    REQUIRE_OK(mha_encoder_layer_forward(&c.Y, &c.X, &w, &masks, &opt, NULL, 0));
    float keep[MB * ML * ME];
    memcpy(keep, c.X.data, sizeof keep);
    masks.causal = MHA_CAUSAL_OFFSET;
    /* in place: a refused call must leave src = out untouched */
    CHECK_STATUS(mha_encoder_layer_forward(&c.X, &c.X, &w, &masks, &opt, NULL, 0), MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("causal");
    CHECK(memcmp(keep, c.X.data, sizeof keep) == 0);

    mha_model_config mc;
    mha_model_config_init(&mc);
    mc.causal = MHA_CAUSAL_BOTTOM_RIGHT;
    mha_model *m = (mha_model *)&mc; /* must be set to NULL on failure */
    CHECK_STATUS(mha_model_create(&m, &mc, 1), MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("causal");
    CHECK(m == NULL);
    mc.causal = MHA_CAUSAL_TOP_LEFT;
    REQUIRE_OK(mha_model_create(&m, &mc, 1));
    CHECK(mha_model_get_config(m)->causal == MHA_CAUSAL_TOP_LEFT);
    mha_model_free(m);
    free(w1), free(w2);
    mh_case_free(&c);
}

/* ---- NULL options are the defaults (mha.h, OPTIONS) ------------------------- */

TEST(api_null_options_sdpa_and_decode_are_the_defaults) {
    const int64_t B = 2, H = 3, L = 4, S = 6, d = 5;
    mha_tensor Q, K, V, O1, O2;
    float *b[] = {test_tensor(&Q, 4, (int64_t[]){B, H, L, d}, 1),
                  test_tensor(&K, 4, (int64_t[]){B, H, S, d}, 2),
                  test_tensor(&V, 4, (int64_t[]){B, H, S, d}, 3),
                  test_tensor(&O1, 4, (int64_t[]){B, H, L, d}, 4),
                  test_tensor(&O2, 4, (int64_t[]){B, H, L, d}, 5)};
    const size_t bytes = sizeof(float) * B * H * L * d;
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    REQUIRE_OK(mha_sdpa_forward(&O1, &Q, &K, &V, &opt));
    REQUIRE_OK(mha_sdpa_forward(&O2, &Q, &K, &V, NULL));
    CHECK(memcmp(O1.data, O2.data, bytes) == 0);
    mha_tensor dQ1, dQ2;
    float *g1 = test_tensor(&dQ1, 4, (int64_t[]){B, H, L, d}, 6);
    float *g2 = test_tensor(&dQ2, 4, (int64_t[]){B, H, L, d}, 6);
    REQUIRE_OK(mha_sdpa_backward(&dQ1, NULL, NULL, &O1, NULL, NULL, &Q, &K, &V, &opt));
    REQUIRE_OK(mha_sdpa_backward(&dQ2, NULL, NULL, &O1, NULL, NULL, &Q, &K, &V, NULL));
    CHECK(memcmp(g1, g2, bytes) == 0);

    mha_onnx_attention_options oo;
    mha_onnx_attention_options_init(&oo);
    REQUIRE_OK(mha_onnx_attention(&O1, NULL, NULL, NULL, &Q, &K, &V, NULL, NULL, NULL, NULL, &oo));
    REQUIRE_OK(mha_onnx_attention(&O2, NULL, NULL, NULL, &Q, &K, &V, NULL, NULL, NULL, NULL, NULL));
    CHECK(memcmp(O1.data, O2.data, bytes) == 0);

    mha_adamw a;
    REQUIRE_OK(mha_adamw_create(&a, 3, NULL));
    mha_adamw_options ao;
    mha_adamw_options_init(&ao);
    CHECK(a.opt.lr == ao.lr && a.opt.weight_decay == ao.weight_decay);
    mha_adamw_free(&a);
    for (size_t i = 0; i < sizeof b / sizeof *b; i++)
        free(b[i]);
    free(g1), free(g2);
}

TEST(api_null_options_multihead_and_layers_fail_on_num_heads_not_null) {
    mh_case c;
    mh_case_init(&c);
    float keep[MB * ML * ME];
    memcpy(keep, c.Y.data, sizeof keep);
    /* the defaults set num_heads 0: refused as a value, never as a NULL pointer */
    CHECK_STATUS(mha_multihead_forward(&c.Y, &c.X, &c.X, &c.X, &c.w, NULL), MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("num_heads");
    CHECK(memcmp(keep, c.Y.data, sizeof keep) == 0);
    float saved[4096];
    CHECK_STATUS(mha_multihead_forward_train(&c.Y, saved, sizeof saved, &c.X, &c.X, &c.X, &c.w,
                                             NULL),
                 MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("num_heads");

    const int64_t F = 7;
    mha_tensor W1, W2;
    float *w1 = test_tensor(&W1, 2, (int64_t[]){F, ME}, 7);
    float *w2 = test_tensor(&W2, 2, (int64_t[]){ME, F}, 8);
    mha_encoder_layer_weights w = {c.w, &W1, NULL, &W2, NULL, NULL, NULL, NULL, NULL};
    memcpy(keep, c.X.data, sizeof keep);
    CHECK_STATUS(mha_encoder_layer_forward(&c.X, &c.X, &w, NULL, NULL, NULL, 0), MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("num_heads");
    CHECK(memcmp(keep, c.X.data, sizeof keep) == 0);
    mha_status st = mha_encoder_layer_forward_train(&c.Y, saved, sizeof saved, &c.X, &w, NULL,
                                                    NULL, NULL, 0);
    CHECK(st != MHA_OK && st != MHA_ERR_NULL);
    CHECK_ERROR_MENTIONS("num_heads");

    /* with num_heads set, every other default is what NULL would give */
    mha_layer_options lo;
    mha_layer_options_init(&lo);
    lo.num_heads = 2;
    REQUIRE_OK(mha_encoder_layer_forward(&c.Y, &c.X, &w, NULL, &lo, NULL, 0));
    free(w1), free(w2);
    mh_case_free(&c);
}

TEST(api_null_config_is_the_default_model) {
    mha_model *m = NULL;
    REQUIRE_OK(mha_model_create(&m, NULL, 3));
    mha_model_config c;
    mha_model_config_init(&c);
    const mha_model_config *got = mha_model_get_config(m);
    CHECK(got->vocab == c.vocab && got->dim == c.dim && got->layers == c.layers &&
          got->causal == c.causal && got->norm_first == c.norm_first);
    mha_model_free(m);
}
