/* test_core.c - tensor views, status codes, and SDPA/MHA semantics that the
 * PyTorch fixtures do not pin down: mask polarity, causal alignment, GQA,
 * dropout, strided views, batched vs unbatched. */
#include "test.h"

#include "internal.h" /* mha_malloc, mha_free */

static size_t numel4(const int64_t *s) { return (size_t)(s[0] * s[1] * s[2] * s[3]); }

TEST(core_status_strings_are_stable) {
    CHECK(!strcmp(mha_status_string(MHA_OK), "ok"));
    CHECK(!strcmp(mha_status_string(MHA_ERR_SHAPE), "shape mismatch"));
    CHECK(!strcmp(mha_status_string((mha_status)999), "unknown status"));
    CHECK(MHA_ERR_NULL == 1 && MHA_ERR_UNSUPPORTED == 10); /* values never renumbered */
    CHECK(!strcmp(mha_version(), MHA_VERSION_STRING));
}

TEST(core_tensor_init_computes_contiguous_strides) {
    mha_tensor t;
    float x[2 * 3 * 4];
    REQUIRE_OK(mha_tensor_init(&t, MHA_F32, x, 3, (int64_t[]){2, 3, 4}));
    CHECK(t.stride[0] == 12 && t.stride[1] == 4 && t.stride[2] == 1);
    int64_t n;
    REQUIRE_OK(mha_tensor_numel(&t, &n));
    CHECK(n == 24);
    CHECK_STATUS(mha_tensor_init(&t, MHA_F32, x, 5, (int64_t[]){1, 1, 1, 1, 1}), MHA_ERR_SHAPE);
    CHECK_STATUS(mha_tensor_init(&t, MHA_F32, x, 2, (int64_t[]){-1, 2}), MHA_ERR_SHAPE);
    CHECK_STATUS(mha_tensor_init(&t, MHA_F32, x, 3, (int64_t[]){1LL << 31, 1LL << 31, 1LL << 31}),
                 MHA_ERR_OVERFLOW);
    CHECK_STATUS(mha_tensor_init(&t, MHA_F32, x, 2, (int64_t[]){1LL << 31, 1LL << 31}),
                 MHA_ERR_OVERFLOW); /* elements fit, bytes do not */
}

TEST(core_tensor_alloc_zero_fills_and_frees) {
    mha_tensor t;
    REQUIRE_OK(mha_tensor_create(&t, MHA_F32, 2, (int64_t[]){3, 5}));
    const float *p = t.data;
    for (int i = 0; i < 15; i++)
        CHECK(p[i] == 0.0f);
    mha_tensor_free(&t);
    CHECK(t.data == NULL);
    mha_tensor_free(&t); /* twice is harmless */
    mha_tensor_free(NULL);
}

/* mha_malloc gives 64-byte aligned blocks of every size that mha_free takes
 * back (it stores the distance to malloc's block in front of the pointer),
 * and a block freed is written to its last byte without touching another. */
TEST(core_malloc_aligns_and_frees_every_size) {
    static const size_t sizes[] = {0, 1, 15, 16, 17, 63, 64, 65, 4095, 4096, 1 << 20,
                                   (26u << 20) + 3};
    unsigned char *blocks[sizeof sizes / sizeof *sizes];
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        blocks[i] = mha_malloc(sizes[i]);
        REQUIRE(blocks[i] != NULL);
        CHECK((uintptr_t)blocks[i] % 64 == 0);
        memset(blocks[i], (int)(i + 1), sizes[i] ? sizes[i] : 1);
    }
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        const size_t n = sizes[i] ? sizes[i] : 1;
        CHECK(blocks[i][0] == (unsigned char)(i + 1) && blocks[i][n - 1] == (unsigned char)(i + 1));
        mha_free(blocks[i]);
    }
    float *z = mha_calloc(1000, sizeof(float));
    REQUIRE(z != NULL);
    CHECK((uintptr_t)z % 64 == 0 && z[0] == 0.0f && z[999] == 0.0f);
    mha_free(z);
    mha_free(NULL);
}

/* Runs SDPA with fresh random q/k/v; out (B,Hq,L,dv). */
typedef struct sdpa_case {
    int64_t B, Hq, Hkv, L, S, d, dv;
    mha_tensor q, k, v, out;
    float *qd, *kd, *vd, *od;
} sdpa_case;

static bool sdpa_make(sdpa_case *c, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S,
                      int64_t d, int64_t dv, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->B = B, c->Hq = Hq, c->Hkv = Hkv, c->L = L, c->S = S, c->d = d, c->dv = dv;
    c->qd = test_tensor(&c->q, 4, (int64_t[]){B, Hq, L, d}, seed);
    c->kd = test_tensor(&c->k, 4, (int64_t[]){B, Hkv, S, d}, seed + 1);
    c->vd = test_tensor(&c->v, 4, (int64_t[]){B, Hkv, S, dv}, seed + 2);
    c->od = test_tensor(&c->out, 4, (int64_t[]){B, Hq, L, dv}, seed + 3);
    return c->qd && c->kd && c->vd && c->od;
}

static void sdpa_free(sdpa_case *c) {
    free(c->qd), free(c->kd), free(c->vd), free(c->od);
}

TEST(core_bool_mask_polarities_are_opposites) {
    sdpa_case c;
    REQUIRE(sdpa_make(&c, 2, 3, 3, 5, 7, 4, 6, 1));
    uint8_t keep[5 * 7], masked[5 * 7];
    for (int i = 0; i < 35; i++) {
        keep[i] = (uint8_t)((i * 7 + 3) % 5 != 0 || i % 7 == 0);
        masked[i] = !keep[i];
    }
    mha_tensor mk, mm;
    mha_tensor_init(&mk, MHA_BOOL, keep, 2, (int64_t[]){5, 7});
    mha_tensor_init(&mm, MHA_BOOL, masked, 2, (int64_t[]){5, 7});
    float *o1 = malloc(sizeof(float) * numel4(c.out.shape));
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.attn_mask = &mk;
    REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, &opt));
    memcpy(o1, c.od, sizeof(float) * numel4(c.out.shape));
    opt.attn_mask = &mm;
    opt.attn_mask_polarity = MHA_TRUE_MASKS;
    REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, &opt));
    CHECK(memcmp(o1, c.od, sizeof(float) * numel4(c.out.shape)) == 0);
    /* and an equivalent float mask (0 / -inf) */
    float add[35];
    for (int i = 0; i < 35; i++)
        add[i] = keep[i] ? 0.0f : -INFINITY;
    mha_tensor mf;
    mha_tensor_init(&mf, MHA_F32, add, 2, (int64_t[]){5, 7});
    opt.attn_mask = &mf;
    REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, &opt));
    CHECK(test_rel_err(c.od, o1, numel4(c.out.shape)) <= 1e-6);
    free(o1);
    sdpa_free(&c);
}

/* Causal modes equal explicit masks: top-left tril(L,S), bottom-right
 * tril(diagonal = S-L), offset k tril(diagonal = k). */
TEST(core_causal_alignments_equal_explicit_masks) {
    const int64_t shapes[][2] = {{4, 7}, {7, 4}, {5, 5}, {1, 9}, {9, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t L = shapes[s][0], S = shapes[s][1];
        sdpa_case c;
        REQUIRE(sdpa_make(&c, 1, 2, 2, L, S, 3, 3, 10 + s));
        size_t n = numel4(c.out.shape);
        float *o_mode = malloc(n * sizeof(float));
        uint8_t *keep = malloc((size_t)(L * S));
        const mha_causal modes[] = {MHA_CAUSAL_TOP_LEFT, MHA_CAUSAL_BOTTOM_RIGHT, MHA_CAUSAL_OFFSET};
        const int64_t diag[] = {0, S - L, -2};
        for (int m = 0; m < 3; m++) {
            mha_sdpa_options opt;
            mha_sdpa_options_init(&opt);
            opt.causal = modes[m];
            opt.causal_offset = diag[m];
            REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, &opt));
            memcpy(o_mode, c.od, n * sizeof(float));
            for (int64_t i = 0; i < L; i++)
                for (int64_t j = 0; j < S; j++)
                    keep[i * S + j] = j <= i + diag[m];
            mha_tensor mk;
            mha_tensor_init(&mk, MHA_BOOL, keep, 2, (int64_t[]){L, S});
            mha_sdpa_options_init(&opt);
            opt.attn_mask = &mk;
            REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, &opt));
            /* the same bits, but where a causal L = S problem takes the
             * whole-row loop on AVX-512 and the mask the flash tiles: their
             * float32 sums differ in order, not beyond 1e-6 */
            if (L != S)
                CHECK(memcmp(o_mode, c.od, n * sizeof(float)) == 0);
            else
                CHECK(test_rel_err(o_mode, c.od, n) <= 1e-6);
            /* rows above the diagonal's start are fully masked: exactly zero */
            for (int64_t i = 0; i < L; i++)
                if (i + diag[m] < 0)
                    for (int64_t e = 0; e < 3; e++)
                        CHECK(o_mode[i * 3 + e] == 0.0f);
        }
        free(o_mode);
        free(keep);
        sdpa_free(&c);
    }
}

/* GQA: query head h reads kv head h / (Hq/Hkv), as repeat_interleave. */
TEST(core_gqa_equals_expanded_kv_heads) {
    sdpa_case c, e;
    REQUIRE(sdpa_make(&c, 2, 6, 2, 4, 5, 3, 2, 20));
    REQUIRE(sdpa_make(&e, 2, 6, 6, 4, 5, 3, 2, 20));
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < 6; h++)
            for (int64_t j = 0; j < 5; j++) {
                memcpy(e.kd + ((b * 6 + h) * 5 + j) * 3, c.kd + ((b * 2 + h / 3) * 5 + j) * 3,
                       3 * sizeof(float));
                memcpy(e.vd + ((b * 6 + h) * 5 + j) * 2, c.vd + ((b * 2 + h / 3) * 5 + j) * 2,
                       2 * sizeof(float));
            }
    memcpy(e.qd, c.qd, sizeof(float) * 2 * 6 * 4 * 3);
    REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, NULL));
    REQUIRE_OK(mha_sdpa_forward(&e.out, &e.q, &e.k, &e.v, NULL));
    CHECK(memcmp(c.od, e.od, sizeof(float) * numel4(c.out.shape)) == 0);
    sdpa_free(&c);
    sdpa_free(&e);
}

TEST(core_weights_rows_are_distributions) {
    sdpa_case c;
    REQUIRE(sdpa_make(&c, 2, 2, 1, 6, 11, 5, 5, 30));
    mha_tensor w;
    REQUIRE_OK(mha_tensor_create(&w, MHA_F32, 4, (int64_t[]){2, 2, 6, 11}));
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.attn_weights = &w;
    opt.causal = MHA_CAUSAL_BOTTOM_RIGHT;
    REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, &opt));
    const float *p = w.data;
    for (int64_t r = 0; r < 2 * 2 * 6; r++) {
        double s = 0.0;
        for (int64_t j = 0; j < 11; j++) {
            CHECK(p[r * 11 + j] >= 0.0f);
            if ((r % 6) + 11 - 6 < j)
                CHECK(p[r * 11 + j] == 0.0f); /* above the bottom-right diagonal */
            s += p[r * 11 + j];
        }
        CHECK(fabs(s - 1.0) < 1e-5);
    }
    mha_tensor_free(&w);
    sdpa_free(&c);
}

/* Dropout: keep decisions depend only on (seed, b, h, i, j); the kept
 * fraction is about 1-p; kept weights are scaled by 1/(1-p); no dropout
 * unless training. */
TEST(core_dropout_is_seeded_and_unbiased) {
    sdpa_case c;
    REQUIRE(sdpa_make(&c, 2, 2, 2, 32, 64, 4, 4, 40));
    mha_tensor w0, w1;
    REQUIRE_OK(mha_tensor_create(&w0, MHA_F32, 4, (int64_t[]){2, 2, 32, 64}));
    REQUIRE_OK(mha_tensor_create(&w1, MHA_F32, 4, (int64_t[]){2, 2, 32, 64}));
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.attn_weights = &w0;
    opt.dropout_p = 0.25f;
    opt.seed = 1234;
    REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, &opt)); /* not training */
    opt.training = 1;
    opt.attn_weights = &w1;
    REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, &opt));
    const float *a = w0.data, *b = w1.data;
    size_t n = 2 * 2 * 32 * 64, kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (b[i] != 0.0f) {
            kept++;
            CHECK(fabsf(b[i] - a[i] / 0.75f) <= 1e-6f * fmaxf(1.0f, b[i]));
        }
    }
    double frac = (double)kept / (double)n;
    CHECK(frac > 0.72 && frac < 0.78);
    float *first = malloc(n * sizeof(float));
    memcpy(first, b, n * sizeof(float));
    REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, &opt));
    CHECK(memcmp(first, b, n * sizeof(float)) == 0); /* same seed, same mask */
    opt.seed = 1235;
    REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, &opt));
    CHECK(memcmp(first, b, n * sizeof(float)) != 0);
    free(first);
    mha_tensor_free(&w0);
    mha_tensor_free(&w1);
    sdpa_free(&c);
}

/* Strided views (a transposed (B,L,H,d) layout) give the same numbers as
 * contiguous copies. */
TEST(core_strided_inputs_equal_contiguous) {
    sdpa_case c;
    REQUIRE(sdpa_make(&c, 2, 3, 3, 5, 6, 4, 4, 50));
    /* store q as (B,L,H,d) and view it as (B,H,L,d) */
    float *qt = malloc(sizeof(float) * 2 * 5 * 3 * 4);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < 3; h++)
            for (int64_t i = 0; i < 5; i++)
                memcpy(qt + ((b * 5 + i) * 3 + h) * 4, c.qd + ((b * 3 + h) * 5 + i) * 4,
                       4 * sizeof(float));
    mha_tensor qv = c.q;
    qv.data = qt;
    qv.stride[0] = 5 * 3 * 4, qv.stride[1] = 4, qv.stride[2] = 3 * 4, qv.stride[3] = 1;
    size_t n = numel4(c.out.shape);
    float *ref = malloc(n * sizeof(float));
    REQUIRE_OK(mha_sdpa_forward(&c.out, &c.q, &c.k, &c.v, NULL));
    memcpy(ref, c.od, n * sizeof(float));
    REQUIRE_OK(mha_sdpa_forward(&c.out, &qv, &c.k, &c.v, NULL));
    CHECK(memcmp(ref, c.od, n * sizeof(float)) == 0);
    free(ref);
    free(qt);
    sdpa_free(&c);
}

/* MHA: unbatched (L,E) equals batched with B = 1; self-attention through
 * the fused projection equals passing copies of the query as key/value. */
TEST(core_multihead_unbatched_and_self_attention_paths_agree) {
    const int64_t L = 5, E = 6, H = 3;
    mha_tensor x, xc, inw, inb, ow, ob, y1, y2, y3;
    float *xd = test_tensor(&x, 3, (int64_t[]){1, L, E}, 60);
    float *xcd = malloc(sizeof(float) * L * E);
    memcpy(xcd, xd, sizeof(float) * L * E);
    mha_tensor_init(&xc, MHA_F32, xcd, 3, (int64_t[]){1, L, E});
    float *wd = test_tensor(&inw, 2, (int64_t[]){3 * E, E}, 61);
    float *bd = test_tensor(&inb, 1, (int64_t[]){3 * E}, 62);
    float *owd = test_tensor(&ow, 2, (int64_t[]){E, E}, 63);
    float *obd = test_tensor(&ob, 1, (int64_t[]){E}, 64);
    float *y1d = test_tensor(&y1, 3, (int64_t[]){1, L, E}, 0);
    float *y2d = test_tensor(&y2, 3, (int64_t[]){1, L, E}, 0);
    float *y3d = test_tensor(&y3, 2, (int64_t[]){L, E}, 0);
    mha_multihead_weights w = {.in_proj_weight = &inw, .in_proj_bias = &inb,
                               .out_proj_weight = &ow, .out_proj_bias = &ob};
    mha_multihead_options opt;
    mha_multihead_options_init(&opt);
    opt.num_heads = H;
    opt.causal = MHA_CAUSAL_TOP_LEFT;
    REQUIRE_OK(mha_multihead_forward(&y1, &x, &x, &x, &w, &opt));
    REQUIRE_OK(mha_multihead_forward(&y2, &x, &xc, &xc, &w, &opt));
    CHECK(test_rel_err(y2d, y1d, (size_t)(L * E)) <= 1e-6);
    mha_tensor x2 = x;
    x2.ndim = 2, x2.shape[0] = L, x2.shape[1] = E, x2.stride[0] = E, x2.stride[1] = 1;
    REQUIRE_OK(mha_multihead_forward(&y3, &x2, &x2, &x2, &w, &opt));
    CHECK(memcmp(y3d, y1d, sizeof(float) * L * E) == 0);
    /* mixing batched and unbatched is an error naming the argument */
    CHECK_STATUS(mha_multihead_forward(&y1, &x, &x2, &x2, &w, &opt), MHA_ERR_SHAPE);
    CHECK_ERROR_MENTIONS("key");
    opt.num_heads = 4; /* does not divide E = 6 */
    CHECK_STATUS(mha_multihead_forward(&y1, &x, &x, &x, &w, &opt), MHA_ERR_SHAPE);
    CHECK_ERROR_MENTIONS("num_heads");
    free(xd), free(xcd), free(wd), free(bd), free(owd), free(obd), free(y1d), free(y2d), free(y3d);
}
