/* test_api.c - the API rules of 0.2.0 (docs/api-migration.md): one causal
 * enum whose values mean the same everywhere, refused where a module does
 * not serve them, with nothing written. */
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
    /* top-left equals SDPA's TOP_LEFT on the same projections: row 0 sees key 0 only */
    const float *before = c.Y.data;
    float keep[MB * ML * ME];
    memcpy(keep, before, sizeof keep);
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
