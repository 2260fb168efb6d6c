/* test_grad_avx512.c - the AVX-512 inner loops of the fused attention
 * backward (src/kernels/attention_bwd_avx512.c) on shapes at their edges.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v.
 *
 * The AVX-512 product sums every output element over k in the AVX2 loop's
 * order with one FMA per step, and its row epilogue uses the same exp
 * polynomial (2^n by vscalefps instead of the exponent field, exact for
 * normal results), so with the shared driver the AVX-512 gradients must be
 * BIT-IDENTICAL to the AVX2 ones: any wrong lane, panel, tail mask or
 * accumulate flag shows up as a difference.  Each case also meets the
 * float64 reference at max|g - ref| <= 1e-4 * max(1, max|ref|) and is
 * bit-identical for 1, 2 and 5 threads.  The plain problems with short
 * rows take the whole-row backward instead of the tiles
 * (attention_short_avx512.c, checked to be served), which sums in the
 * tiles' order: the same bitwise check holds for them, dQ only where the
 * tiles have one key block (S <= MHA_BWD_BC; past it they add per-block
 * partial sums of dQ for some rows).  On CPUs without AVX-512 the test
 * library runs the emulated build of the same source (tests/unit/main.c);
 * test_avx512.c checks that where it cannot run it is refused.
 */
#include "test.h"

#include "../../src/kernels/attention_bwd.h" /* MHA_BWD_BC */

typedef struct bwd512_cfg {
    int64_t B, Hq, Hkv, L, S, d, dv;
    mha_causal causal;
    int64_t offset;
    int mask;    /* 1: bool (L,S), about a quarter masked, row 1 all masked */
    int kpm;     /* 1: float (B,S) additive key padding                     */
    int special; /* 1: dropout 0.2 and softcap 3 (the per-element epilogue) */
    int rows;    /* 1: taken by the whole rows (mha_attn_bwd_rows_serve)    */
} bwd512_cfg;

static const bwd512_cfg CASES[] = {
    /* L = S = d = dv = 1: one row, one key, one column of one panel */
    {1, 1, 1, 1, 1, 1, 1, MHA_CAUSAL_NONE, 0, 0, 0, 0, 1},
    /* one query row; S one past a key block (a 1-key block: one panel) */
    {1, 2, 1, 1, 97, 16, 32, MHA_CAUSAL_NONE, 0, 0, 0, 0, 1},
    /* d 3 panels (2 + the odd one), dv 2 panels with 15 zero columns (12-row
     * products for dV only) */
    {2, 1, 1, 7, 33, 48, 17, MHA_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 0},
    /* L one past a query tile, S a whole block, d 5 panels, dv = 1 */
    {1, 1, 1, 49, 96, 80, 1, MHA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0},
    /* GQA 6/2, bool mask with a dead row, causal, d 3 panels, dv 4 */
    {1, 6, 2, 13, 200, 33, 64, MHA_CAUSAL_TOP_LEFT, 0, 1, 0, 0, 0},
    /* float key padding, offset causal, several tiles and blocks */
    {2, 2, 2, 100, 150, 8, 5, MHA_CAUSAL_OFFSET, 30, 0, 1, 0, 0},
    /* dropout and softcap with a mask: scalar epilogue, AVX-512 products */
    {1, 3, 1, 20, 40, 24, 24, MHA_CAUSAL_NONE, 0, 1, 0, 1, 0},
    /* 16 (b, kv head) pairs, one split: dQ summed per task; 12-row products
     * (d, dv <= 32) on 37 rows (three groups of 12 and one row) */
    {8, 4, 2, 37, 50, 32, 17, MHA_CAUSAL_NONE, 0, 0, 0, 0, 1},
    /* d <= 32 < dv: 12-row products for dK and dQ only; 31 rows (two
     * groups of 12, one of 6 and one past nr), a kv head shared by two */
    {2, 2, 1, 31, 70, 20, 40, MHA_CAUSAL_NONE, 0, 0, 0, 0, 1},
    /* whole rows (attention_short_avx512.c's bwd_pair_rows), which sum in
     * the tiles' order: L and S past every block and panel (7 rows of a
     * block of 8; 17 keys, 15 lanes of a 32-key panel past S), d 5, dv 33 */
    {2, 2, 2, 7, 17, 5, 33, MHA_CAUSAL_NONE, 0, 0, 0, 0, 1},
    /* GQA 6 / 2 (three query heads add into one dK, dV), L 37, d 16, dv 1 */
    {1, 6, 2, 37, 130, 16, 1, MHA_CAUSAL_NONE, 0, 0, 0, 0, 1},
    /* the embedding shape, smaller: L = S = 128, d 32; d 64, S 127 */
    {2, 2, 2, 128, 128, 32, 32, MHA_CAUSAL_NONE, 0, 0, 0, 0, 1},
    {1, 4, 1, 40, 127, 64, 48, MHA_CAUSAL_NONE, 0, 0, 0, 0, 1},
    /* causal on the main diagonal (each block's products stop at its last
     * row's keys, each row's P and dS at its own) */
    {1, 1, 1, 1, 1, 1, 1, MHA_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 1},
    {2, 2, 2, 17, 17, 5, 33, MHA_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 1},
    {1, 6, 2, 37, 37, 16, 1, MHA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 1},
    {2, 2, 2, 128, 128, 32, 32, MHA_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 1},
    /* causal past the plain bound, within its own (S d = 19200) */
    {1, 2, 1, 300, 300, 64, 40, MHA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 1},
};

typedef struct bwd512_case {
    int64_t shape[4][4]; /* q, k, v, dout */
    mha_tensor q, k, v, dout, mask, kpm;
    float *data[4], *md, *kd;
    mha_sdpa_options opt;
} bwd512_case;

static void case_make(bwd512_case *t, const bwd512_cfg *c, uint64_t seed) {
    memset(t, 0, sizeof *t);
    test_sdpa_grad_inputs(&t->q, &t->k, &t->v, &t->dout, t->data, t->shape,
                          (const int64_t[7]){c->B, c->Hq, c->Hkv, c->L, c->S, c->d, c->dv}, seed);
    mha_sdpa_options_init(&t->opt);
    t->opt.causal = c->causal;
    t->opt.causal_offset = c->offset;
    if (c->mask) {
        t->md = malloc((size_t)(c->L * c->S));
        uint8_t *m = (uint8_t *)t->md;
        for (int64_t x = 0; x < c->L * c->S; x++) /* true keeps */
            m[x] = ((uint64_t)x * 2654435761u + seed) % 4 != 0 && !(x / c->S == 1);
        mha_tensor_init(&t->mask, MHA_BOOL, t->md, 2, (int64_t[]){c->L, c->S});
        t->opt.attn_mask = &t->mask;
    }
    if (c->kpm) {
        t->kd = test_tensor(&t->kpm, 2, (int64_t[]){c->B, c->S}, seed * 8 + 5);
        t->opt.key_padding_mask = &t->kpm;
    }
    if (c->special) {
        t->opt.training = 1, t->opt.dropout_p = 0.2f, t->opt.seed = 99 + seed;
        t->opt.softcap = 3.0f;
    }
}

static void case_free(bwd512_case *t) {
    for (int x = 0; x < 4; x++)
        free(t->data[x]);
    free(t->md), free(t->kd);
}

/* dq, dk, dv (fresh, zeroed; caller frees) on `kernel` at `threads`. */
static mha_status grads(bwd512_case *t, mha_kernel kernel, int threads, mha_tensor g[3]) {
    mha_status st = MHA_OK;
    for (int x = 0; x < 3; x++) /* all three created, so free3 is always safe */
        if (mha_tensor_create(&g[x], MHA_F32, 4, t->shape[x]) != MHA_OK)
            st = MHA_ERR_NOMEM;
    mha_sdpa_options o = t->opt;
    o.kernel = kernel;
    mha_set_num_threads(threads);
    if (st == MHA_OK)
        st = mha_sdpa_backward(&g[0], &g[1], &g[2], &t->dout, NULL, NULL, &t->q, &t->k, &t->v,
                               &o);
    mha_set_num_threads(0);
    return st;
}

static void free3(mha_tensor g[3]) {
    for (int x = 0; x < 3; x++)
        mha_tensor_free(&g[x]);
}

/* Elements whose bit patterns differ, over the gradients from `from` (0:
 * dq, dk, dv; 1: dk, dv). */
static size_t differ3(mha_tensor a[3], mha_tensor b[3], int from) {
    size_t n = 0;
    for (int x = from; x < 3; x++)
        n += test_bits_differ(a[x].data, b[x].data, test_numel(&a[x]));
    return n;
}

TEST(grad_avx512_matches_avx2_and_reference) {
    if (!test_kernel_runs(MHA_KERNEL_AVX512))
        SKIP("kernel avx512: no AVX-512 on this CPU and no emulation in this build");
    const bool avx2 = test_kernel_runs(MHA_KERNEL_AVX2);
    if (!avx2)
        SKIP_PART("kernel avx2: not on this CPU (no bitwise comparison)");
    double worst = 0.0;
    size_t worst_bits = 0;
    for (size_t x = 0; x < sizeof CASES / sizeof *CASES; x++) {
        const bwd512_cfg *c = &CASES[x];
        bwd512_case t;
        case_make(&t, c, 300 + x);
        mha_tensor gr[3], g5[3], g2[3];
        REQUIRE_OK(grads(&t, MHA_KERNEL_REF, 1, gr));
        REQUIRE_OK(grads(&t, MHA_KERNEL_AVX512, 1, g5));
        CHECK(test_bwd_rows_served(&t.q, &t.k, &t.v, &t.dout, &g5[0], &g5[1], &g5[2], &t.opt) ==
              (c->rows != 0));
        double e = 0.0;
        for (int y = 0; y < 3; y++) {
            const double ey = test_rel_err(g5[y].data, gr[y].data, test_numel(&gr[y]));
            e = ey > e || ey != ey ? ey : e;
        }
        worst = e > worst || e != e ? e : worst;
        CHECK(e <= 1e-4);
        size_t bits = 0;
        if (avx2) {
            REQUIRE_OK(grads(&t, MHA_KERNEL_AVX2, 1, g2));
            /* the whole rows sum each dQ element in one chain over the
             * keys, the tiles per key block (their partial last row group,
             * or their splits, add the blocks' sums): dQ is compared
             * bitwise where the tiles have one block, dK and dV always */
            bits = differ3(g5, g2, c->rows && c->S > MHA_BWD_BC ? 1 : 0);
            worst_bits = bits > worst_bits ? bits : worst_bits;
            CHECK(bits == 0);
            free3(g2);
        }
        if (!(e <= 1e-4) || bits)
            printf("  case %zu (L%lld S%lld d%lld dv%lld): avx512 vs reference %.3g, "
                   "%zu elements differ from avx2\n",
                   x, (long long)c->L, (long long)c->S, (long long)c->d, (long long)c->dv, e,
                   bits);
        const int threads[2] = {2, 5};
        for (int n = 0; n < 2; n++) {
            mha_tensor gt[3];
            REQUIRE_OK(grads(&t, MHA_KERNEL_AVX512, threads[n], gt));
            CHECK(differ3(gt, g5, 0) == 0);
            free3(gt);
        }
        free3(gr), free3(g5);
        case_free(&t);
    }
    printf("  grad avx512: %zu edge shapes, worst error vs reference %.3g, "
           "%zu elements differ from avx2\n",
           sizeof CASES / sizeof *CASES, worst, worst_bits);
}
