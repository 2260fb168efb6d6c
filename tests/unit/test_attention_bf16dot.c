/* test_attention_bf16dot.c - the avx512 kernel's bf16 tile products: the
 * vdpbf16ps ones (attention_flash_avx512bf16.c: Q.K^T and P.V on bf16
 * pairs) and the AMX ones (attention_flash_amx.c, tdpbf16ps; natively only,
 * skipped without AMX).  mha_sdpa_forward runs whichever
 * mha_flash_bf16_pick() takes on this CPU.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v; d2 = ceil(d/2) pairs.
 *
 * The vdpbf16ps products run natively on AVX512_BF16 CPUs and emulated
 * elsewhere (the test library's _emu twins, tests/emu/avx512_emulation.h);
 * without either the tests report themselves skipped.  Rules:
 *   each table's products   vs float64 sums of the same bf16 values, within
 *   alone                   2e-6 of the sum of |terms| (exact products,
 *                           float32 sums), rows 1..96; garbage past n, past
 *                           the panels and past the padded rows never read
 *                           or written;
 *   mha_sdpa_forward        bf16 q, k, v on MHA_KERNEL_AVX512 vs the
 *                           reference on the same tensors (which rounds P
 *                           as the fused kernels do): <= 2e-3 relative
 *                           (test_rel_err), also weights and the LSE, on odd
 *                           shapes and options; bf16 q, k with float32 v
 *                           and float32 q, k with bf16 v the same; the
 *                           last two also within 2e-5 of the avx2 kernel,
 *                           which widens the same values and rounds P by the
 *                           same rule (with both products on pairs a score's
 *                           last bit can move P's rounding: 2e-3 there, and
 *                           for bf16 v, whose softmax then has its own exp,
 *                           row_exp_bf16);
 *   threads 1, 2, 3         bit-identical.
 * The worst errors are printed.
 */
#include "test.h"
#include "internal.h"
#include "kernels/attention_flash.h"
#include "kernels/convert.h"

#include <math.h>

enum { NR = MHA_FLASH_NR, MR = MHA_FLASH_MR, BC = MHA_FLASH_BC };

/* The vdpbf16ps tile products wherever they run (emulated, or a CPU with
 * AVX512_BF16, fast or not), or NULL (the test then skips). */
static const mha_flash_bf16 *bf16_loops(void) {
    const mha_flash_bf16 *dot =
        mha_avx512_bf16_runs() ? MHA_AVX512_PICK(mha_flash_bf16_avx512) : NULL;
    if (!dot)
        test_skip(1, "no AVX512_BF16 on this CPU and no emulated build");
    return dot;
}

static uint16_t bf16_of(float x) { return mha_float_to_bf16(x); }

/* bf16 pairs of 2n float32 values: x[2i] low, x[2i+1] high. */
static void to_pairs(uint32_t *dst, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = bf16_of(x[2 * i]) | (uint32_t)bf16_of(x[2 * i + 1]) << 16;
}

static double pair_half(uint32_t a, int64_t c) {
    return (double)mha_bf16_to_float((uint16_t)(a >> (16 * (c % 2))));
}

/* Whether got is within 2e-6 of the sum of |terms| mag (at least 1) from
 * the float64 sum want; *worst takes the largest such error seen. */
static bool near_sum(double got, double want, double mag, double *worst) {
    const double e = fabs(got - want) / (mag > 1 ? mag : 1);
    *worst = e > *worst ? e : *worst;
    return e <= 2e-6;
}

static void tiles_on(const mha_flash_bf16 *dot) {
    if (dot->tiles_on)
        dot->tiles_on();
}

static void tiles_off(const mha_flash_bf16 *dot) {
    if (dot->tiles_off)
        dot->tiles_off();
}

/* One table's tile products alone (tiles_on/off around them), against
 * float64 sums of the same bf16 values, with whole 16-row tiles: rows past
 * `rows` are scratch, columns past npanels*NR (qk) and past dvp (pv), rows
 * past rows16 and p past n are never touched or read. */
static void check_tile_products(const mha_flash_bf16 *dot) {
    enum { BR = MHA_FLASH_BR };
    const int64_t al = dot->d2_align;
    const int64_t rowss[] = {1, 15, 16, 17, 50, 96};
    /* d2 as the driver pads it: a multiple of d2_align */
    const int64_t d2s[] = {1, 2, 3, 8, 17, 40, 64};
    double worst = 0.0, worst_pv = 0.0;
    /* qk: q (rows16, d2) pairs, kp (npanels, d2, NR) pairs */
    for (size_t ri = 0; ri < sizeof rowss / sizeof *rowss; ri++)
        for (size_t di = 0; di < sizeof d2s / sizeof *d2s; di++)
            for (int64_t np = 1; np <= 8; np += np < 3 ? 1 : 5) {
                const int64_t rows = rowss[ri], lds = BC, d2 = (d2s[di] + al - 1) / al * al;
                uint32_t *q = aligned_alloc(64, (size_t)(BR * d2) * 4);
                uint32_t *kp = aligned_alloc(64, (size_t)(np * d2 * NR) * 4);
                float *s = malloc(sizeof(float) * BR * BC);
                float *rq = malloc(sizeof(float) * BR * d2 * 2);
                float *rk = malloc(sizeof(float) * (size_t)(np * d2 * NR * 2));
                test_randn(rq, (size_t)(BR * d2 * 2), 60 + (uint64_t)(ri + di));
                test_randn(rk, (size_t)(np * d2 * NR * 2), 70 + (uint64_t)np);
                to_pairs(q, rq, BR * d2);
                to_pairs(kp, rk, np * d2 * NR);
                for (int i = 0; i < BR * BC; i++)
                    s[i] = NAN;
                tiles_on(dot);
                dot->tile_qk(s, lds, q, d2, kp, d2, np, rows);
                tiles_off(dot);
                const int64_t rows16 = (rows + 15) / 16 * 16;
                for (int64_t r = 0; r < BR; r++)
                    for (int64_t j = 0; j < BC; j++) {
                        if (j >= np * NR || r >= rows16) {
                            CHECK(isnan(s[r * lds + j]));
                            continue;
                        }
                        if (r >= rows)
                            continue; /* scratch row */
                        double want = 0.0, mag = 0.0;
                        for (int64_t c = 0; c < 2 * d2; c++) {
                            const uint32_t ka = kp[(j / NR) * d2 * NR + (c / 2) * NR + j % NR];
                            const double x = pair_half(q[r * d2 + c / 2], c) * pair_half(ka, c);
                            want += x, mag += fabs(x);
                        }
                        if (!near_sum(s[r * lds + j], want, mag, &worst) && test_failures() < 3)
                            test_fail(__FILE__, __LINE__,
                                      "%s qk rows %lld d2 %lld np %lld (%lld,%lld): %.9g vs %.9g",
                                      dot->name, (long long)rows, (long long)d2, (long long)np, (long long)r,
                                      (long long)j, s[r * lds + j], want);
                    }
                free(q), free(kp), free(s), free(rq), free(rk);
            }
    /* pv: o (rows16, dvp) += p (rows, n) . vp (dvp/NR, BC/2, NR) pairs */
    const int64_t ns[] = {1, 31, 32, 33, 100, 128};
    for (size_t ri = 0; ri < sizeof rowss / sizeof *rowss; ri++)
        for (size_t t = 0; t < sizeof ns / sizeof *ns; t++)
            for (int64_t dvp = NR; dvp <= 8 * NR; dvp += dvp < 3 * NR ? NR : 5 * NR) {
                const int64_t rows = rowss[ri], n = ns[t], ldp = BC, ldo = dvp + 16;
                float *p = malloc(sizeof(float) * BR * BC), *o = malloc(sizeof(float) * BR * ldo);
                float *o0 = malloc(sizeof(float) * BR * ldo);
                float *rv = malloc(sizeof(float) * (size_t)(dvp * BC));
                uint32_t *vp = aligned_alloc(64, (size_t)(dvp * BC / 2) * 4);
                test_randn(p, BR * BC, 80 + (uint64_t)t);
                test_randn(o0, (size_t)(BR * ldo), 90 + (uint64_t)ri);
                test_randn(rv, (size_t)(dvp * BC), 100 + (uint64_t)dvp);
                for (int64_t i = 0; i < BR * BC; i++) {
                    /* bf16 in [0, 1], -0.0 marks; NaN unread */
                    const int64_t r = i / BC, j = i % BC;
                    p[i] = j >= n || r >= rows ? NAN
                           : i % 7 == 3        ? -0.0f /* the driver's masked mark */
                                               : mha_bf16_to_float(bf16_of(fabsf(p[i]) / 4));
                }
                to_pairs(vp, rv, dvp * BC / 2);
                /* P's bf16 rows as the driver writes them: zero past n (to
                 * the next 32) and in the rows past `rows`; NaN beyond, unread */
                uint16_t *pb = aligned_alloc(64, sizeof(uint16_t) * BR * BC);
                for (int64_t i = 0; i < BR * BC; i++) {
                    const int64_t r = i / BC, j = i % BC;
                    pb[i] = j >= (n + 31) / 32 * 32 || r >= (rows + 15) / 16 * 16 ? 0x7fc0
                            : j >= n || r >= rows                               ? 0
                                                                                : bf16_of(p[i]);
                }
                memcpy(o, o0, sizeof(float) * BR * (size_t)ldo);
                tiles_on(dot);
                dot->tile_pv(o, ldo, pb, ldp, vp, n, dvp, rows);
                tiles_off(dot);
                free(pb);
                for (int64_t r = 0; r < BR; r++)
                    for (int64_t c = 0; c < ldo; c++) {
                        if (c >= dvp || r >= (rows + 15) / 16 * 16) {
                            CHECK(memcmp(&o[r * ldo + c], &o0[r * ldo + c], 4) == 0);
                            continue;
                        }
                        double want = o0[r * ldo + c], mag = fabs(want);
                        for (int64_t j = 0; j < n && r < rows; j++) {
                            const int64_t at = (c / NR) * (BC / 2) * NR + (j / 2) * NR + c % NR;
                            const uint32_t va = vp[at];
                            const double x = (double)p[r * ldp + j] * pair_half(va, j);
                            want += x, mag += fabs(x);
                        }
                        if (!near_sum(o[r * ldo + c], want, mag, &worst_pv) && test_failures() < 3)
                            test_fail(__FILE__, __LINE__,
                                      "%s pv rows %lld n %lld dvp %lld (%lld,%lld): %.9g vs %.9g",
                                      dot->name, (long long)rows, (long long)n, (long long)dvp, (long long)r,
                                      (long long)c, o[r * ldo + c], want);
                    }
                free(p), free(o), free(o0), free(rv), free(vp);
            }
    printf("  %s tile products vs float64: qk %.2e, pv %.2e of the sum of |terms| (bound 2e-6)\n",
           dot->name, worst, worst_pv);
}

/* tile_qk_max: the same s bits as tile_qk, and rmax[r] the max of row r's
 * products with NaN ones ignored: a NaN q pair (a whole row NaN: -inf), a
 * NaN k pair (one column NaN in every row), an infinite q pair (+-inf
 * products) among finite rows. */
static void check_qk_max(const mha_flash_bf16 *dot) {
    enum { BR = MHA_FLASH_BR };
    const int64_t al = dot->d2_align;
    const int64_t rowss[] = {1, 2, 15, 16, 50, 96}, d2s[] = {1, 3, 32};
    int64_t checked = 0;
    for (size_t ri = 0; ri < sizeof rowss / sizeof *rowss; ri++)
        for (size_t di = 0; di < sizeof d2s / sizeof *d2s; di++)
            for (int64_t np = 1; np <= 8; np += np < 2 ? 1 : 3) {
                const int64_t rows = rowss[ri], d2 = (d2s[di] + al - 1) / al * al;
                uint32_t *q = aligned_alloc(64, (size_t)(BR * d2) * 4);
                uint32_t *kp = aligned_alloc(64, (size_t)(np * d2 * NR) * 4);
                float *s = malloc(sizeof(float) * BR * BC), *s2 = malloc(sizeof(float) * BR * BC);
                float *rq = malloc(sizeof(float) * BR * d2 * 2);
                float *rk = malloc(sizeof(float) * (size_t)(np * d2 * NR * 2));
                float rmax[BR];
                test_randn(rq, (size_t)(BR * d2 * 2), 160 + (uint64_t)(ri + di));
                test_randn(rk, (size_t)(np * d2 * NR * 2), 170 + (uint64_t)np);
                to_pairs(q, rq, BR * d2);
                to_pairs(kp, rk, np * d2 * NR);
                const uint32_t nan2 = 0x7fc07fc0u, inf2 = 0x3f807f80u; /* (inf, 1) */
                if (rows > 1)
                    q[1 * d2] = nan2;            /* row 1: every product NaN */
                if (rows > 3)
                    q[3 * d2] = inf2;            /* row 3: +-inf products    */
                kp[(np - 1) * d2 * NR + 5] = nan2; /* column 16 (np-1) + 5 NaN */
                for (int i = 0; i < BR * BC; i++)
                    s[i] = s2[i] = NAN;
                for (int i = 0; i < BR; i++)
                    rmax[i] = 12345.0f;
                tiles_on(dot);
                dot->tile_qk(s, BC, q, d2, kp, d2, np, rows);
                dot->tile_qk_max(s2, BC, rmax, q, d2, kp, d2, np, rows);
                tiles_off(dot);
                CHECK(memcmp(s, s2, sizeof(float) * BR * BC) == 0);
                for (int64_t r = 0; r < rows; r++) {
                    float want = -INFINITY;
                    for (int64_t j = 0; j < np * NR; j++)
                        if (!isnan(s[r * BC + j]) && s[r * BC + j] > want)
                            want = s[r * BC + j];
                    if (r == 1)
                        CHECK(want == -INFINITY);
                    if (!(rmax[r] == want) && test_failures() < 3)
                        test_fail(__FILE__, __LINE__, "%s qk_max rows %lld d2 %lld np %lld row %lld: %g vs %g",
                                  dot->name, (long long)rows, (long long)d2, (long long)np,
                                  (long long)r, rmax[r], want);
                    checked++;
                }
                for (int64_t r = rows + (rows & 1); r < BR; r++)
                    CHECK(rmax[r] == 12345.0f); /* past the rows: untouched */
                free(q), free(kp), free(s), free(s2), free(rq), free(rk);
            }
    printf("  %s tile_qk_max: %lld row maxima exact, NaN products ignored\n", dot->name,
           (long long)checked);
}

TEST(attention_bf16dot_tiles_match_float64) {
    const mha_flash_bf16 *dot = bf16_loops();
    if (!dot)
        return;
    check_tile_products(dot);
    CHECK(dot->tile_qk_max != NULL);
    if (dot->tile_qk_max)
        check_qk_max(dot);
}

TEST(attention_amx_tiles_match_float64) {
    if (!mha_cpu_has_amx_bf16())
        SKIP("AMX bf16 tile products: this CPU (or OS) has no AMX-BF16 tiles");
    check_tile_products(&mha_flash_bf16_amx);
}

/* ---- mha_sdpa_forward on bf16 tensors ------------------------------------- */

typedef struct bcase {
    int64_t B, Hq, Hkv, L, S, d, dv;
    mha_causal causal;
    bool strided;   /* q, k, v views with element step 2 */
    bool mask;      /* a float (L,S) mask with -inf holes */
    bool kv_len;    /* per-batch key lengths, +inf in V past them */
    bool weights;   /* attn_weights and lse requested */
    float softcap;
    bool onnx;      /* the ONNX scale: Q.K^T widened, P.V on pairs */
} bcase;

static const bcase cases[] = {
    {1, 1, 1, 1, 1, 1, 1, MHA_CAUSAL_NONE, false, false, false, false, 0, false},
    {1, 1, 1, 1, 300, 64, 64, MHA_CAUSAL_NONE, false, false, false, true, 0, false},
    {2, 4, 2, 7, 13, 3, 5, MHA_CAUSAL_NONE, false, false, false, false, 0, false},
    {1, 2, 1, 9, 129, 1, 17, MHA_CAUSAL_BOTTOM_RIGHT, false, false, false, false, 0, false},
    {1, 2, 2, 100, 131, 17, 9, MHA_CAUSAL_TOP_LEFT, true, false, false, false, 0, false},
    {1, 3, 1, 97, 257, 32, 40, MHA_CAUSAL_NONE, false, true, false, true, 0, false},
    {2, 2, 1, 50, 200, 64, 20, MHA_CAUSAL_BOTTOM_RIGHT, false, false, true, false, 0, false},
    {1, 2, 2, 41, 77, 80, 80, MHA_CAUSAL_NONE, false, false, false, false, 30.0f, false},
    {1, 4, 2, 130, 255, 96, 33, MHA_CAUSAL_TOP_LEFT, false, true, false, false, 0, false},
    {1, 1, 1, 200, 301, 128, 128, MHA_CAUSAL_NONE, false, false, false, true, 0, false},
    {2, 1, 1, 33, 128, 33, 48, MHA_CAUSAL_NONE, true, false, true, false, 0, false},
    {1, 2, 1, 20, 150, 24, 16, MHA_CAUSAL_NONE, false, false, false, true, 0, true},
};

typedef struct bdata {
    uint16_t *h[3];   /* bf16 q, k, v (maybe strided) */
    float *f[3];      /* the same values in float32   */
    mha_tensor th[3], tf[3];
    float *mask;
    int64_t lens[2];
    mha_tensor mask_t, lens_t;
} bdata;

static void bdata_free(bdata *x) {
    for (int i = 0; i < 3; i++)
        free(x->h[i]), free(x->f[i]);
    free(x->mask);
}

/* q (B,Hq,L,d), k (B,Hkv,S,d), v (B,Hkv,S,dv) of case c, bf16 and float32. */
static void bdata_make(bdata *x, const bcase *c, uint64_t seed) {
    memset(x, 0, sizeof *x);
    const int64_t sh[3][4] = {{c->B, c->Hq, c->L, c->d}, {c->B, c->Hkv, c->S, c->d},
                              {c->B, c->Hkv, c->S, c->dv}};
    const int64_t step = c->strided ? 2 : 1;
    for (int i = 0; i < 3; i++) {
        const int64_t n = sh[i][0] * sh[i][1] * sh[i][2] * sh[i][3];
        x->f[i] = malloc(sizeof(float) * (size_t)n);
        x->h[i] = calloc((size_t)(n * step), sizeof(uint16_t));
        test_randn(x->f[i], (size_t)n, seed + (uint64_t)i);
        mha_tensor_init(&x->tf[i], MHA_F32, x->f[i], 4, sh[i]);
        mha_tensor_init(&x->th[i], MHA_BF16, x->h[i], 4, sh[i]);
        for (int a = 0; a < 4; a++)
            x->th[i].stride[a] *= step;
        for (int64_t e = 0; e < n; e++) {
            x->f[i][e] = mha_bf16_to_float(bf16_of(x->f[i][e] * (i == 0 ? 1.5f : 1.0f)));
            x->h[i][e * step] = bf16_of(x->f[i][e]);
        }
    }
    if (c->kv_len) { /* keys past S_b masked; their V rows +inf (never read) */
        x->lens[0] = c->S / 2 + 1, x->lens[1] = c->S;
        const int64_t n1[1] = {c->B};
        mha_tensor_init(&x->lens_t, MHA_I64, x->lens, 1, n1);
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t hk = 0; hk < c->Hkv; hk++)
                for (int64_t j = x->lens[b]; j < c->S; j++)
                    for (int64_t e = 0; e < c->dv; e++) {
                        const int64_t at = ((b * c->Hkv + hk) * c->S + j) * c->dv + e;
                        x->f[2][at] = INFINITY, x->h[2][at * step] = bf16_of(INFINITY);
                    }
    }
    if (c->mask) {
        x->mask = test_float_mask(c->L, c->S, seed + 7);
        const int64_t msh[2] = {c->L, c->S};
        mha_tensor_init(&x->mask_t, MHA_F32, x->mask, 2, msh);
    }
}

typedef struct bout {
    float *o, *w, *lse; /* (B,Hq,L,dv), (B,Hq,L,S) or NULL, (B,Hq,L) or NULL */
} bout;

static mha_status run(bout *y, const bcase *c, const bdata *x, const mha_tensor *q,
                      const mha_tensor *k, const mha_tensor *v, mha_kernel kernel) {
    mha_tensor o, w, lse;
    const int64_t so[4] = {c->B, c->Hq, c->L, c->dv}, sw[4] = {c->B, c->Hq, c->L, c->S};
    MHA_TRY(mha_tensor_init(&o, MHA_F32, y->o, 4, so));
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.kernel = kernel;
    opt.causal = c->causal;
    opt.softcap = c->softcap;
    opt.onnx_scale = c->onnx;
    if (c->mask)
        opt.attn_mask = &x->mask_t;
    if (c->kv_len)
        opt.kv_lengths = &x->lens_t;
    if (c->weights) {
        MHA_TRY(mha_tensor_init(&w, MHA_F32, y->w, 4, sw));
        MHA_TRY(mha_tensor_init(&lse, MHA_F32, y->lse, 3, sw));
        opt.attn_weights = &w, opt.lse = &lse;
    }
    return mha_sdpa_forward(&o, q, k, v, &opt);
}

static void bout_alloc(bout *y, const bcase *c) {
    y->o = malloc(sizeof(float) * (size_t)(c->B * c->Hq * c->L * c->dv));
    y->w = c->weights ? malloc(sizeof(float) * (size_t)(c->B * c->Hq * c->L * c->S)) : NULL;
    y->lse = c->weights ? malloc(sizeof(float) * (size_t)(c->B * c->Hq * c->L)) : NULL;
}

static void bout_free(bout *y) { free(y->o), free(y->w), free(y->lse); }

/* Worst of out, weights and lse errors of y against ref. */
static double bout_err(const bout *y, const bout *ref, const bcase *c) {
    double e = test_rel_err(y->o, ref->o, (size_t)(c->B * c->Hq * c->L * c->dv));
    if (c->weights) {
        const double ew = test_rel_err(y->w, ref->w, (size_t)(c->B * c->Hq * c->L * c->S));
        const double el = test_rel_err(y->lse, ref->lse, (size_t)(c->B * c->Hq * c->L));
        e = ew > e ? ew : e, e = el > e ? el : e;
    }
    return e;
}

/* The three dtype mixes: all bf16; bf16 q, k with float32 v (Q.K^T on
 * pairs only); float32 q, k with bf16 v (P.V on pairs only). */
static const char *const mix_names[3] = {"bf16 q,k,v", "bf16 q,k + f32 v", "f32 q,k + bf16 v"};

static void mix_tensors(const bdata *x, int mix, const mha_tensor **q, const mha_tensor **k,
                        const mha_tensor **v) {
    *q = mix == 2 ? &x->tf[0] : &x->th[0];
    *k = mix == 2 ? &x->tf[1] : &x->th[1];
    *v = mix == 1 ? &x->tf[2] : &x->th[2];
}

TEST(attention_bf16dot_matches_reference) {
    if (!bf16_loops())
        return;
    /* the avx2 kernel widens the same values and rounds P by the same rule
     * (the same running max): only float32 sums differ from the bf16 loops */
    const bool avx2 = test_kernel_runs(MHA_KERNEL_AVX2);
    const mha_flash_bf16 *pick = mha_flash_bf16_pick();
    double worst[3] = {0, 0, 0}, worst2[3] = {0, 0, 0};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const bcase *c = &cases[ci];
        bdata x;
        bdata_make(&x, c, 700 + 10 * ci);
        bout ref, y, w2;
        bout_alloc(&ref, c), bout_alloc(&y, c), bout_alloc(&w2, c);
        for (int mix = 0; mix < 3; mix++) {
            const mha_tensor *q, *k, *v;
            mix_tensors(&x, mix, &q, &k, &v);
            REQUIRE_OK(run(&ref, c, &x, q, k, v, MHA_KERNEL_REF));
            REQUIRE_OK(run(&y, c, &x, q, k, v, MHA_KERNEL_AVX512));
            const double e = bout_err(&y, &ref, c);
            worst[mix] = e > worst[mix] ? e : worst[mix];
            if (!(e <= 2e-3))
                test_fail(__FILE__, __LINE__,
                          "%s case %zu (B %lld Hq %lld Hkv %lld L %lld S %lld d %lld dv %lld): "
                          "%.3g > 2e-3",
                          mix_names[mix], ci, (long long)c->B, (long long)c->Hq,
                          (long long)c->Hkv, (long long)c->L, (long long)c->S, (long long)c->d,
                          (long long)c->dv, e);
            if (!avx2)
                continue;
            REQUIRE_OK(run(&w2, c, &x, q, k, v, MHA_KERNEL_AVX2));
            /* Q.K^T alone on pairs: the scores equal but for float32 sums;
             * both: a score's last bit can move P's bf16 rounding by an ulp,
             * and so can the tile products' own exp (a last-bit difference
             * from the float32 loops' exp) with P.V alone on tiles */
            const double tol2 = mix == 1 ? 2e-5 : 2e-3;
            const double e2 = bout_err(&y, &w2, c);
            worst2[mix] = e2 > worst2[mix] ? e2 : worst2[mix];
            if (!(e2 <= tol2))
                test_fail(__FILE__, __LINE__, "%s case %zu: %.3g from the avx2 widening path",
                          mix_names[mix], ci, e2);
        }
        bout_free(&ref), bout_free(&y), bout_free(&w2);
        bdata_free(&x);
    }
    for (int mix = 0; mix < 3; mix++) {
        printf("  %s: avx512 (bf16 products: %s) vs reference %.2e (bound 2e-3)", mix_names[mix],
               pick ? pick->name : "none, widened", worst[mix]);
        if (avx2)
            printf(", vs avx2 widening %.2e (bound %.0e)", worst2[mix],
                   mix == 1 ? 2e-5 : 2e-3);
        printf("\n");
    }
}

/* One key block (S <= BC): the fused running max is the final one, so the
 * kernel rounds the same P as the reference and only float32 sums differ. */
TEST(attention_bf16dot_single_block_is_tight) {
    if (!bf16_loops())
        return;
    const bcase cs[] = {
        {1, 2, 1, 64, 120, 32, 32, MHA_CAUSAL_NONE, false, false, false, false, 0, false},
        {1, 1, 1, 13, 7, 5, 3, MHA_CAUSAL_NONE, false, false, false, false, 0, false}};
    double worst = 0.0;
    for (size_t ci = 0; ci < 2; ci++) {
        const bcase *c = &cs[ci];
        bdata x;
        bdata_make(&x, c, 900 + ci);
        bout ref, y;
        bout_alloc(&ref, c), bout_alloc(&y, c);
        REQUIRE_OK(run(&ref, c, &x, &x.th[0], &x.th[1], &x.th[2], MHA_KERNEL_REF));
        REQUIRE_OK(run(&y, c, &x, &x.th[0], &x.th[1], &x.th[2], MHA_KERNEL_AVX512));
        const double e = bout_err(&y, &ref, c);
        worst = e > worst ? e : worst;
        CHECK(e <= 2e-5);
        bout_free(&ref), bout_free(&y);
        bdata_free(&x);
    }
    printf("  one key block: %.2e from the reference (bound 2e-5)\n", worst);
}

/* The softmax max folded into Q.K^T (tile_qk_max, whole key blocks of
 * plain rows) against the reference: a max that moves in every block (key
 * norms growing along S), a NaN key in the second block (every row NaN),
 * an infinite and a NaN query element (their rows NaN, the NaN row's
 * folded max -inf: the max pass then decides); NaN exactly where the
 * reference has it, else within 2e-3. */
TEST(attention_bf16dot_fused_max_matches_reference) {
    if (!bf16_loops())
        return;
    const bcase c = {1, 2, 1, 40, 3 * BC, 64, 64, MHA_CAUSAL_NONE, false, false, false, false,
                     0, false};
    double worst = 0.0;
    for (int variant = 0; variant < 3; variant++) {
        bdata x;
        bdata_make(&x, &c, 1200 + (uint64_t)variant);
        uint16_t *q = x.h[0], *k = x.h[1];
        for (int64_t j = 0; j < c.S; j++) /* growing norms: the max moves each block */
            for (int64_t e = 0; e < c.d; e++)
                k[j * c.d + e] = bf16_of(mha_bf16_to_float(k[j * c.d + e]) * (1.0f + j / 64.0f));
        if (variant == 1)
            k[(BC + 7) * c.d + 3] = bf16_of(NAN);
        if (variant == 2) {
            q[5 * c.d] = bf16_of(INFINITY);              /* head 0 row 5 */
            q[(c.L + 9) * c.d + 1] = bf16_of(NAN);       /* head 1 row 9 */
        }
        bout ref, y;
        bout_alloc(&ref, &c), bout_alloc(&y, &c);
        REQUIRE_OK(run(&ref, &c, &x, &x.th[0], &x.th[1], &x.th[2], MHA_KERNEL_REF));
        REQUIRE_OK(run(&y, &c, &x, &x.th[0], &x.th[1], &x.th[2], MHA_KERNEL_AVX512));
        const int64_t n = c.B * c.Hq * c.L * c.dv;
        int64_t nans = 0, bad = 0;
        for (int64_t i = 0; i < n; i++) {
            nans += isnan(ref.o[i]);
            bad += isnan(ref.o[i]) != isnan(y.o[i]);
            if (isnan(ref.o[i]))
                ref.o[i] = y.o[i] = 0.0f; /* compared: where, not what */
        }
        CHECK(bad == 0);
        CHECK(variant == 0 ? nans == 0 : variant == 1 ? nans == n : nans == 2 * c.dv);
        const double e = test_rel_err(y.o, ref.o, (size_t)n);
        worst = e > worst ? e : worst;
        CHECK(e <= 2e-3);
        bout_free(&ref), bout_free(&y);
        bdata_free(&x);
    }
    printf("  fused max over 3 blocks (moving max, NaN key, inf/NaN query): NaN where the "
           "reference has it, else %.2e (bound 2e-3)\n", worst);
}

TEST(attention_bf16dot_threads_bit_identical) {
    if (!bf16_loops())
        return;
    const bcase c = {2, 4, 2, 101, 270, 40, 24, MHA_CAUSAL_TOP_LEFT, false, true, false, true, 0,
                     false};
    bdata x;
    bdata_make(&x, &c, 1000);
    bout y[3];
    const int saved = mha_get_num_threads();
    for (int mix = 0; mix < 3; mix++) {
        const mha_tensor *q, *k, *v;
        mix_tensors(&x, mix, &q, &k, &v);
        for (int t = 0; t < 3; t++) {
            bout_alloc(&y[t], &c);
            mha_set_num_threads(t + 1);
            REQUIRE_OK(run(&y[t], &c, &x, q, k, v, MHA_KERNEL_AVX512));
        }
        const size_t no = sizeof(float) * (size_t)(c.B * c.Hq * c.L * c.dv);
        const size_t nw = sizeof(float) * (size_t)(c.B * c.Hq * c.L * c.S);
        for (int t = 1; t < 3; t++) {
            CHECK(memcmp(y[0].o, y[t].o, no) == 0);
            CHECK(memcmp(y[0].w, y[t].w, nw) == 0);
        }
        for (int t = 0; t < 3; t++)
            bout_free(&y[t]);
    }
    mha_set_num_threads(saved);
    bdata_free(&x);
}

/* The workspace bound (planned on the float32 layout) covers the bf16 pair
 * layouts: with that much caller scratch a bf16 run allocates nothing. */
TEST(attention_bf16dot_scratch_bound_covers_pairs) {
    if (!bf16_loops())
        return;
    const bcase c = {2, 6, 3, 150, 1000, 65, 24, MHA_CAUSAL_NONE, false, true, false, false, 0,
                     false};
    bdata x;
    bdata_make(&x, &c, 1100);
    bout ref, y;
    bout_alloc(&ref, &c), bout_alloc(&y, &c);
    mha_tensor o;
    const int64_t so[4] = {c.B, c.Hq, c.L, c.dv};
    mha_tensor_init(&o, MHA_F32, y.o, 4, so);
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.attn_mask = &x.mask_t;
    mha_attn_problem p;
    memset(&p, 0, sizeof p);
    REQUIRE_OK(mha_sdpa_problem_init(&p, &x.th[0], &x.th[1], &x.th[2], &o, &opt));
    const size_t bytes = mha_attn_flash_scratch_bound(c.B, c.Hkv, c.S, c.d, c.dv, mha_threads());
    REQUIRE(bytes > 0);
    p.scratch = aligned_alloc(64, (bytes + 63) / 64 * 64);
    p.scratch_bytes = bytes;
    REQUIRE(p.scratch);
    const int64_t before = mha_test_alloc_count();
    CHECK_STATUS(mha_attn_run(&p, MHA_KERNEL_AVX512), MHA_OK);
    CHECK(mha_test_alloc_count() == before);
    REQUIRE_OK(run(&ref, &c, &x, &x.th[0], &x.th[1], &x.th[2], MHA_KERNEL_REF));
    CHECK(test_rel_err(y.o, ref.o, (size_t)(c.B * c.Hq * c.L * c.dv)) <= 2e-3);
    free(p.scratch);
    bout_free(&ref), bout_free(&y);
    bdata_free(&x);
}
