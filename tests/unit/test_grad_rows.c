/* test_grad_rows.c - the whole-row attention backward
 * (attention_short_avx512.c's bwd_pair_rows, served by
 * mha_attn_bwd_flash_run for the problems mha_attn_bwd_rows_serve accepts).
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v.
 *
 * The whole rows sum every gradient element in the flash tiles' order (dK
 * and dV over the query rows in order, one FMA each; dQ, S and dP over
 * their inner dimension in order; P and dS from the same row_grad), so
 * their gradients must be BIT-IDENTICAL to the avx2 tiles' - the strongest
 * check there is of their blocking, tails and group sums.  Each case also
 * meets the float64 reference at max|g - ref| <= 1e-4 * max(1, max|ref|),
 * is bit-identical for 1 and 3 threads, and is checked to be served;
 * causal cases sit on the main diagonal (the rows' other case served).  A
 * pair with a non-finite input is left to the tiles (their zero-skipping
 * products): the gradients must then still equal the avx2 tiles' and the
 * reference's wherever those are finite.
 */
#include "test.h"

#include "../../src/kernels/attention_bwd.h"

typedef struct rows_cfg {
    int64_t B, Hq, Hkv, L, S, d, dv;
    bool dq, dk, dv_wanted; /* which gradients are asked for */
    mha_causal causal;      /* NONE, or on the main diagonal (L = S) */
} rows_cfg;

static const rows_cfg CASES[] = {
    /* one query row, one key, d = dv = 1: one lane of one panel */
    {1, 1, 1, 1, 1, 1, 1, true, true, true, MHA_CAUSAL_NONE},
    /* L and S past every block and panel (7 rows of a block of 8; 17 keys:
     * a panel of 32 with 15 past S), d 5, dv 33 (two panels, one lane) */
    {2, 2, 2, 7, 17, 5, 33, true, true, true, MHA_CAUSAL_NONE},
    /* GQA 6 / 2 (three query heads add into one dK, dV), L 37 = 4 blocks
     * and 5 rows, d 16 (half a panel), dv 1 */
    {1, 6, 2, 37, 130, 16, 1, true, true, true, MHA_CAUSAL_NONE},
    /* the embedding shape, smaller: L = S = 128, d 32 (one whole panel),
     * 4 pairs */
    {2, 2, 2, 128, 128, 32, 32, true, true, true, MHA_CAUSAL_NONE},
    /* d 64 (two panels), S 127, a kv head shared by 4 query heads */
    {1, 4, 1, 40, 127, 64, 48, true, true, true, MHA_CAUSAL_NONE},
    /* only dq; only dk and dv */
    {2, 3, 3, 9, 50, 24, 24, true, false, false, MHA_CAUSAL_NONE},
    {2, 3, 1, 9, 50, 24, 24, false, true, true, MHA_CAUSAL_NONE},
    /* causal on the main diagonal: each block's products stop at its last
     * row's keys, each row's P and dS at its own */
    {1, 1, 1, 1, 1, 1, 1, true, true, true, MHA_CAUSAL_TOP_LEFT},
    {2, 2, 2, 17, 17, 5, 33, true, true, true, MHA_CAUSAL_TOP_LEFT},
    {1, 6, 2, 37, 37, 16, 1, true, true, true, MHA_CAUSAL_BOTTOM_RIGHT},
    {2, 2, 2, 128, 128, 32, 32, true, true, true, MHA_CAUSAL_TOP_LEFT},
    {1, 2, 1, 100, 100, 64, 40, true, false, true, MHA_CAUSAL_BOTTOM_RIGHT},
};

typedef struct rows_case {
    int64_t shape[4][4]; /* q, k, v, dout */
    mha_tensor q, k, v, dout;
    float *data[4];
    mha_sdpa_options opt;
} rows_case;

static void case_make(rows_case *t, const rows_cfg *c, uint64_t seed) {
    memset(t, 0, sizeof *t);
    const int64_t shapes[4][4] = {{c->B, c->Hq, c->L, c->d},
                                  {c->B, c->Hkv, c->S, c->d},
                                  {c->B, c->Hkv, c->S, c->dv},
                                  {c->B, c->Hq, c->L, c->dv}};
    memcpy(t->shape, shapes, sizeof shapes);
    mha_tensor *dst[4] = {&t->q, &t->k, &t->v, &t->dout};
    for (int x = 0; x < 4; x++)
        t->data[x] = test_tensor(dst[x], 4, shapes[x], seed * 8 + (uint64_t)x);
    mha_sdpa_options_init(&t->opt);
    t->opt.causal = c->causal;
}

static void case_free(rows_case *t) {
    for (int x = 0; x < 4; x++)
        free(t->data[x]);
}

static size_t numel(const mha_tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
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

/* Elements of the gradients asked for whose bit patterns differ, NaN
 * against NaN counted equal (payloads are not specified). */
static size_t differ3(mha_tensor a[3], mha_tensor b[3]) {
    size_t n = 0;
    for (int x = 0; x < 3; x++) {
        if (!a[x].data)
            continue;
        const float *fa = a[x].data, *fb = b[x].data;
        for (size_t e = 0; e < numel(&a[x]); e++)
            n += memcmp(&fa[e], &fb[e], sizeof(float)) != 0 && !(fa[e] != fa[e] && fb[e] != fb[e]);
    }
    return n;
}

/* The worst normalised error of the gradients asked for against ref. */
static double err3(mha_tensor g[3], mha_tensor ref[3]) {
    double e = 0.0;
    for (int x = 0; x < 3; x++) {
        if (!g[x].data)
            continue;
        const double ex = test_rel_err(g[x].data, ref[x].data, numel(&g[x]));
        e = ex > e || ex != ex ? ex : e;
    }
    return e;
}

/* The problem and gradient views mha_attn_bwd_flash_run sees for t. */
static bool served(rows_case *t, mha_tensor g[3]) {
    mha_attn_problem p;
    mha_tensor o; /* the forward's output: its shape and checks only */
    float *od = test_tensor(&o, 4, t->shape[3], 1);
    bool ok = mha_sdpa_problem_init(&p, &t->q, &t->k, &t->v, &o, &t->opt) == MHA_OK;
    mha_attn_grad gr = {g[0], g[1], g[2], t->dout, {0}, {0}};
    ok = ok && mha_attn_bwd_rows_serve(&p, &gr);
    free(od);
    return ok;
}

TEST(grad_rows_match_tiles_and_reference) {
    if (!test_kernel_runs(MHA_KERNEL_AVX512))
        SKIP("kernel avx512: no AVX-512 on this CPU and no emulation in this build");
    const bool avx2 = test_kernel_runs(MHA_KERNEL_AVX2);
    double worst = 0.0;
    size_t worst_bits = 0;
    for (size_t x = 0; x < sizeof CASES / sizeof *CASES; x++) {
        const rows_cfg *c = &CASES[x];
        rows_case t;
        case_make(&t, c, 700 + x);
        mha_tensor gr[3], g5[3], g2[3];
        REQUIRE_OK(grads(&t, c, MHA_KERNEL_REF, 1, gr));
        REQUIRE_OK(grads(&t, c, MHA_KERNEL_AVX512, 1, g5));
        CHECK(served(&t, g5));
        const double e = err3(g5, gr);
        worst = e > worst || e != e ? e : worst;
        CHECK(e <= 1e-4);
        size_t bits = 0;
        if (avx2) {
            REQUIRE_OK(grads(&t, c, MHA_KERNEL_AVX2, 1, g2));
            bits = differ3(g5, g2);
            worst_bits = bits > worst_bits ? bits : worst_bits;
            CHECK(bits == 0);
            free3(g2);
        }
        if (!(e <= 1e-4) || bits)
            printf("  case %zu (L%lld S%lld d%lld dv%lld): whole rows vs reference %.3g, "
                   "%zu elements differ from the avx2 tiles\n",
                   x, (long long)c->L, (long long)c->S, (long long)c->d, (long long)c->dv, e,
                   bits);
        mha_tensor gt[3];
        REQUIRE_OK(grads(&t, c, MHA_KERNEL_AVX512, 3, gt));
        CHECK(differ3(gt, g5) == 0);
        free3(gt);
        free3(gr), free3(g5);
        case_free(&t);
    }
    printf("  grad whole rows: %zu shapes, worst error vs reference %.3g, %zu elements "
           "differ from the avx2 tiles%s\n",
           sizeof CASES / sizeof *CASES, worst, worst_bits, avx2 ? "" : " (not compared)");
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
}
