/* test_grad_rows.c - the whole-row attention backward
 * (attention_short_avx512.c's bwd_pair_rows, served by
 * mha_attn_bwd_flash_run for the problems mha_attn_bwd_rows_serve accepts)
 * where test_grad_avx512.c's shape sweep does not reach: gradient subsets,
 * a pair with a non-finite input (left to the tiles) and the rule.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v.
 *
 * The whole rows sum every gradient element in the tiles' order (dQ too
 * where the tiles have one key block, as in every case here), so their
 * gradients must be BIT-IDENTICAL to the avx2 tiles' (NaN against NaN
 * counted equal) and within 1e-4 * max(1, max|ref|) of the float64
 * reference wherever the inputs are finite.
 */
#include "test.h"

#include "../../src/kernels/attention_bwd.h" /* MHA_BWD_ROWS_MAX_SD */

typedef struct rows_cfg {
    int64_t B, Hq, Hkv, L, S, d, dv;
    bool dq, dk, dv_wanted; /* which gradients are asked for */
    mha_causal causal;      /* NONE, or on the main diagonal (L = S) */
} rows_cfg;

typedef struct rows_case {
    int64_t shape[4][4]; /* q, k, v, dout */
    mha_tensor q, k, v, dout;
    float *data[4];
    mha_sdpa_options opt;
} rows_case;

static void case_make(rows_case *t, const rows_cfg *c, uint64_t seed) {
    memset(t, 0, sizeof *t);
    test_sdpa_grad_inputs(&t->q, &t->k, &t->v, &t->dout, t->data, t->shape,
                          (const int64_t[7]){c->B, c->Hq, c->Hkv, c->L, c->S, c->d, c->dv}, seed);
    mha_sdpa_options_init(&t->opt);
    t->opt.causal = c->causal;
}

static void case_free(rows_case *t) {
    for (int x = 0; x < 4; x++)
        free(t->data[x]);
}

/* The gradients c asks for (fresh, zeroed; the others data NULL) on
 * `kernel` at `threads`. */
static mha_status grads(rows_case *t, const rows_cfg *c, mha_kernel kernel, int threads,
                        mha_tensor g[3]) {
    const bool want[3] = {c->dq, c->dk, c->dv_wanted};
    mha_status st = MHA_OK;
    for (int x = 0; x < 3; x++) {
        memset(&g[x], 0, sizeof g[x]);
        if (want[x] && mha_tensor_create(&g[x], MHA_F32, 4, t->shape[x]) != MHA_OK)
            st = MHA_ERR_NOMEM;
    }
    mha_sdpa_options o = t->opt;
    o.kernel = kernel;
    mha_set_num_threads(threads);
    if (st == MHA_OK)
        st = mha_sdpa_backward(want[0] ? &g[0] : NULL, want[1] ? &g[1] : NULL,
                               want[2] ? &g[2] : NULL, &t->dout, NULL, NULL, &t->q, &t->k,
                               &t->v, &o);
    mha_set_num_threads(0);
    return st;
}

static void free3(mha_tensor g[3]) {
    for (int x = 0; x < 3; x++)
        if (g[x].data)
            mha_tensor_free(&g[x]);
}

/* Elements of the gradients asked for whose bit patterns differ (NaN
 * against NaN equal). */
static size_t differ3(mha_tensor a[3], mha_tensor b[3]) {
    size_t n = 0;
    for (int x = 0; x < 3; x++)
        if (a[x].data)
            n += test_bits_differ(a[x].data, b[x].data, test_numel(&a[x]));
    return n;
}

/* The worst normalised error of the gradients asked for against ref. */
static double err3(mha_tensor g[3], mha_tensor ref[3]) {
    double e = 0.0;
    for (int x = 0; x < 3; x++) {
        if (!g[x].data)
            continue;
        const double ex = test_rel_err(g[x].data, ref[x].data, test_numel(&g[x]));
        e = ex > e || ex != ex ? ex : e;
    }
    return e;
}

/* Whether t with the gradients g (data NULL: not asked for) is served. */
static bool served(rows_case *t, mha_tensor g[3]) {
    return test_bwd_rows_served(&t->q, &t->k, &t->v, &t->dout, g[0].data ? &g[0] : NULL,
                                g[1].data ? &g[1] : NULL, g[2].data ? &g[2] : NULL, &t->opt);
}

/* dq alone, and dk with dv (GQA 3 / 1): bit-identical to the tiles. */
TEST(grad_rows_gradient_subsets) {
    if (!test_kernel_runs(MHA_KERNEL_AVX512))
        SKIP("kernel avx512: no AVX-512 on this CPU and no emulation in this build");
    if (!test_kernel_runs(MHA_KERNEL_AVX2))
        SKIP("kernel avx2: not on this CPU (the tiles to compare with)");
    const rows_cfg cases[2] = {{2, 3, 3, 9, 50, 24, 24, true, false, false, MHA_CAUSAL_NONE},
                               {2, 3, 1, 9, 50, 24, 24, false, true, true, MHA_CAUSAL_NONE}};
    for (int x = 0; x < 2; x++) {
        rows_case t;
        case_make(&t, &cases[x], 40 + (uint64_t)x);
        mha_tensor g5[3], g2[3], gr[3];
        REQUIRE_OK(grads(&t, &cases[x], MHA_KERNEL_AVX512, 2, g5));
        REQUIRE_OK(grads(&t, &cases[x], MHA_KERNEL_AVX2, 2, g2));
        REQUIRE_OK(grads(&t, &cases[x], MHA_KERNEL_REF, 1, gr));
        CHECK(served(&t, g5));
        CHECK(differ3(g5, g2) == 0);
        CHECK(err3(g5, gr) <= 1e-4);
        free3(g5), free3(g2), free3(gr);
        case_free(&t);
    }
}

/* A NaN in the K of pair (0, 1) and an inf in the dO of a query head of
 * pair (1, 0): those pairs take the tiles, pair (1, 1) the whole rows. */
TEST(grad_rows_nonfinite_pair_takes_tiles) {
    if (!test_kernel_runs(MHA_KERNEL_AVX512))
        SKIP("kernel avx512: no AVX-512 on this CPU and no emulation in this build");
    if (!test_kernel_runs(MHA_KERNEL_AVX2))
        SKIP("kernel avx2: not on this CPU (the tiles to compare with)");
    const rows_cfg c = {2, 4, 2, 19, 40, 16, 16, true, true, true, MHA_CAUSAL_NONE};
    rows_case t;
    case_make(&t, &c, 77);
    ((float *)t.k.data)[(0 * 2 + 1) * 40 * 16 + 5 * 16 + 3] = NAN;
    ((float *)t.dout.data)[(1 * 4 + 1) * 19 * 16 + 7 * 16 + 2] = INFINITY;
    mha_tensor g5[3], g2[3], gr[3];
    REQUIRE_OK(grads(&t, &c, MHA_KERNEL_AVX512, 2, g5));
    REQUIRE_OK(grads(&t, &c, MHA_KERNEL_AVX2, 2, g2));
    REQUIRE_OK(grads(&t, &c, MHA_KERNEL_REF, 1, gr));
    CHECK(served(&t, g5));
    const size_t bits = differ3(g5, g2);
    CHECK(bits == 0);
    /* the clean pair (1, 1): query heads 2 and 3 of batch 1, kv head 1 */
    const float *dq5 = g5[0].data, *dqr = gr[0].data, *dk5 = g5[1].data, *dkr = gr[1].data;
    const size_t q0 = (size_t)(1 * 4 + 2) * 19 * 16, k0 = (size_t)(1 * 2 + 1) * 40 * 16;
    const double eq = test_rel_err(dq5 + q0, dqr + q0, 2 * 19 * 16);
    const double ek = test_rel_err(dk5 + k0, dkr + k0, 40 * 16);
    CHECK(eq <= 1e-4 && ek <= 1e-4);
    /* the NaN pair's gradients are not all finite (it was not skipped) */
    size_t nan_k = 0;
    for (size_t e = 0; e < 40 * 16; e++)
        nan_k += dk5[(size_t)(0 * 2 + 1) * 40 * 16 + e] != dk5[(size_t)(0 * 2 + 1) * 40 * 16 + e];
    CHECK(nan_k > 0);
    printf("  grad whole rows with a NaN and an inf pair: %zu elements differ from the avx2 "
           "tiles, the clean pair %.3g / %.3g from the reference\n",
           bits, eq, ek);
    free3(g5), free3(g2), free3(gr);
    case_free(&t);
}

TEST(grad_rows_serve_only_plain_problems) {
    const rows_cfg c = {1, 2, 2, 40, 64, 32, 32, true, true, true, MHA_CAUSAL_NONE};
    rows_case t;
    case_make(&t, &c, 5);
    mha_tensor g[3];
    for (int x = 0; x < 3; x++)
        g[x] = x == 0 ? t.q : x == 1 ? t.k : t.v; /* views of the right shapes */
    CHECK(served(&t, g));
    t.opt.causal = MHA_CAUSAL_TOP_LEFT; /* L 40 != S 64: not the main diagonal */
    CHECK(!served(&t, g));
    mha_sdpa_options_init(&t.opt);
    t.opt.training = 1, t.opt.dropout_p = 0.1f;
    CHECK(!served(&t, g));
    mha_sdpa_options_init(&t.opt);
    uint8_t m[40 * 64];
    memset(m, 1, sizeof m);
    mha_tensor mt;
    mha_tensor_init(&mt, MHA_BOOL, m, 2, (int64_t[]){40, 64});
    t.opt.attn_mask = &mt;
    CHECK(!served(&t, g));
    mha_sdpa_options_init(&t.opt);
    g[1].stride[3] = 2; /* a dk with a column stride */
    CHECK(!served(&t, g));
    g[1] = t.k;
    g[0].data = NULL; /* dq not asked for: still served */
    CHECK(served(&t, g));
    case_free(&t);
    /* causal on a square problem: the main diagonal served, another not */
    const rows_cfg square = {1, 2, 2, 40, 40, 32, 32, true, true, true, MHA_CAUSAL_TOP_LEFT};
    case_make(&t, &square, 8);
    g[0] = t.q, g[1] = t.k, g[2] = t.v;
    CHECK(served(&t, g));
    t.opt.causal = MHA_CAUSAL_BOTTOM_RIGHT;
    CHECK(served(&t, g));
    t.opt.causal = MHA_CAUSAL_OFFSET, t.opt.causal_offset = 3;
    CHECK(!served(&t, g));
    t.opt.causal_offset = 0;
    CHECK(served(&t, g));
    case_free(&t);
    /* S max(d, dv) at the bound (served) and one key past it (not) */
    const rows_cfg edge = {1, 1, 1, 8, MHA_BWD_ROWS_MAX_SD / 32, 32, 32, true, true, true, MHA_CAUSAL_NONE};
    case_make(&t, &edge, 6);
    g[0] = t.q, g[1] = t.k, g[2] = t.v;
    CHECK(served(&t, g));
    case_free(&t);
    const rows_cfg past = {1, 1, 1, 8, MHA_BWD_ROWS_MAX_SD / 32 + 1, 32, 32, true, true, true, MHA_CAUSAL_NONE};
    case_make(&t, &past, 7);
    g[0] = t.q, g[1] = t.k, g[2] = t.v;
    CHECK(!served(&t, g));
    case_free(&t);
    /* causal: its own bound (L = S at it, and one past it) */
    const int64_t lc = MHA_BWD_ROWS_CAUSAL_MAX_SD / 64;
    const rows_cfg cedge = {1, 1, 1, lc, lc, 64, 64, true, true, true, MHA_CAUSAL_TOP_LEFT};
    case_make(&t, &cedge, 9);
    g[0] = t.q, g[1] = t.k, g[2] = t.v;
    CHECK(served(&t, g));
    case_free(&t);
    const rows_cfg cpast = {1, 1, 1, lc + 1, lc + 1, 64, 64, true, true, true, MHA_CAUSAL_TOP_LEFT};
    case_make(&t, &cpast, 10);
    g[0] = t.q, g[1] = t.k, g[2] = t.v;
    CHECK(!served(&t, g));
    case_free(&t);
}
