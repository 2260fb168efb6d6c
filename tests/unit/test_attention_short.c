/* test_attention_short.c - the short-text attention of the trained encoder
 * (src/kernels/attention_short.h): its reference against mha_sdpa_forward
 * (the library's attention, itself checked against PyTorch), and the avx2
 * and avx512 kernels against the reference.
 *
 * Then mha_sdpa_forward's plain problems on the avx2 and avx512 loops
 * (mha_attn_short_serves): odd shapes, GQA and interleaved heads against
 * the reference kernel, bits across threads, the log-sum-exp of a
 * training forward, what is not served, and -inf scores.
 *
 * Letters: L tokens, H heads, d head width.  q, k, v are column blocks of
 * one (L, 3 H d + 5) buffer as in the encoder; ctx rows H d + 3 apart with
 * guard values in the gaps.  The reference against SDPA: L in {1, 2, 7, 8,
 * 9, 37, 100, 256}, H in {1, 3, 12}, d in {1, 5, 8, 32, 33, 64}.  The avx2
 * and avx512 loops (avx512 emulated where the CPU lacks it) against the
 * reference: L in {1, 2, 5, 6, 7, 8, 9, 13, 15, 16, 17, 37, 100, 128, 130}
 * (every tail of the 8- and 16-key vectors, the 16- and 32-key panels and
 * the 6- and 8-row blocks), d in {1, 5, 8, 16, 17, 31, 32, 33, 48, 64, 80}
 * (every head-column mask), half of them with q|k|v and ctx rows packed as
 * tightly as the encoder's.  Bound: per element |diff| <= 2e-6 (1 + max
 * |v|) (the softmax weights sum to 1, so a row is a convex mix of v rows).
 */
#include "test.h"

#include "internal.h" /* mha_avx512_runs, mha_cpu_has_avx512 */
#include "kernels/attention_flash.h"
#include "kernels/attention_short.h"
#include "kernels/convert.h"

#include <string.h>

#define GUARD 777.0f

typedef struct {
    int64_t L, H, d, ld, ldo;
    float *qkv, *ws, *got, *want;
} short_case;

/* tight: ld = 3 H d and ldo = H d exactly, as the encoder passes them
 * (nothing past the last v row or ctx row: under ASan a lane read or
 * written past d faults); else gaps of 5 and 3 floats. */
static void case_make_ld(short_case *c, int64_t L, int64_t H, int64_t d, uint64_t seed,
                         bool tight) {
    c->L = L, c->H = H, c->d = d;
    c->ld = 3 * H * d + (tight ? 0 : 5), c->ldo = H * d + (tight ? 0 : 3);
    c->qkv = malloc(sizeof(float) * (size_t)(L * c->ld));
    test_randn(c->qkv, (size_t)(L * c->ld), seed);
    c->ws = malloc(sizeof(float) * (size_t)mha_attn_short_ws_floats(L, d));
    c->got = malloc(sizeof(float) * (size_t)(L * c->ldo));
    c->want = malloc(sizeof(float) * (size_t)(L * c->ldo));
    for (int64_t e = 0; e < L * c->ldo; e++)
        c->got[e] = c->want[e] = GUARD;
}

static void case_make(short_case *c, int64_t L, int64_t H, int64_t d, uint64_t seed) {
    case_make_ld(c, L, H, d, seed, false);
}

static void case_free(short_case *c) {
    free(c->qkv), free(c->ws), free(c->got), free(c->want);
}

/* got against want, guards included; name says which comparison. */
static void compare(const short_case *c, const char *name) {
    const int64_t D = c->H * c->d;
    float vmax = 0;
    for (int64_t i = 0; i < c->L; i++)
        for (int64_t e = 0; e < D; e++)
            vmax = fmaxf(vmax, fabsf(c->qkv[i * c->ld + 2 * D + e]));
    int bad = 0;
    for (int64_t i = 0; i < c->L && bad < 3; i++)
        for (int64_t e = 0; e < c->ldo && bad < 3; e++) {
            const float g = c->got[i * c->ldo + e], w = c->want[i * c->ldo + e];
            const bool ok = e >= D ? g == GUARD : fabsf(g - w) <= 2e-6f * (1.0f + vmax);
            if (!ok && bad++ < 3)
                test_fail(__FILE__, __LINE__, "%s L=%lld H=%lld d=%lld (%lld,%lld): %.9g vs %.9g",
                          name, (long long)c->L, (long long)c->H, (long long)c->d, (long long)i,
                          (long long)e, g, w);
        }
}

static const int64_t Ls[] = {1, 2, 7, 8, 9, 37, 100, 256}, Hs[] = {1, 3, 12};

TEST(attention_short_ref_matches_sdpa) {
    const int64_t ds[] = {1, 5, 8, 32, 33, 64};
    uint64_t seed = 40;
    for (size_t a = 0; a < sizeof Ls / sizeof *Ls; a++)
        for (size_t b = 0; b < sizeof Hs / sizeof *Hs; b++)
            for (size_t k = 0; k < sizeof ds / sizeof *ds; k++) {
                const int64_t L = Ls[a], H = Hs[b], d = ds[k];
                if (L * H * d > 256 * 12 * 32)
                    continue; /* the reference is slow; the largest cases add nothing */
                short_case c;
                case_make(&c, L, H, d, seed++);
                mha_attn_short_f32_ref(c.got, c.ldo, c.qkv, c.qkv + H * d, c.qkv + 2 * H * d,
                                       c.ld, L, L, H, d, 1.0f / sqrtf((float)d), c.ws);
                /* the same problem as (1, H, L, d) strided views for SDPA */
                mha_tensor q = {c.qkv, MHA_F32, 4, {1, H, L, d}, {L * c.ld, d, c.ld, 1}};
                mha_tensor kk = q, v = q;
                kk.data = c.qkv + H * d;
                v.data = c.qkv + 2 * H * d;
                mha_tensor o = {c.want, MHA_F32, 4, {1, H, L, d}, {L * c.ldo, d, c.ldo, 1}};
                mha_sdpa_options opt;
                mha_sdpa_options_init(&opt);
                CHECK_STATUS(mha_sdpa_forward(&o, &q, &kk, &v, &opt), MHA_OK);
                compare(&c, "ref vs sdpa");
                case_free(&c);
            }
}

/* The kernel under test: avx2 or avx512 (the emulated loop where the CPU
 * lacks AVX-512). */
typedef enum { ON_AVX2, ON_AVX512 } short_kernel;

static mha_status run_on(short_kernel kernel, short_case *c, float scale) {
    const int64_t D = c->H * c->d;
    if (kernel == ON_AVX512)
        return mha_attn_short_f32_avx512(c->got, c->ldo, c->qkv, c->qkv + D, c->qkv + 2 * D,
                                         c->ld, c->L, c->L, c->H, c->d, scale, c->ws);
    return mha_attn_short_f32_avx2(c->got, c->ldo, c->qkv, c->qkv + D, c->qkv + 2 * D, c->ld,
                                   c->L, c->L, c->H, c->d, scale, c->ws);
}

/* Scores far apart (a one-hot softmax) and equal (a plain mean): no
 * overflow, no NaN, the limits exactly where they are exact. */
static void large_scores(short_kernel kernel, int64_t L, int64_t D) {
    short_case c;
    case_make(&c, L, 1, D, 9);
    for (int64_t i = 0; i < L; i++)
        for (int64_t e = 0; e < D; e++) {
            c.qkv[i * c.ld + e] = 30.0f;                             /* q */
            c.qkv[i * c.ld + D + e] = i == 4 ? 30.0f : -30.0f;       /* k: key 4 wins */
        }
    CHECK_STATUS(run_on(kernel, &c, 1.0f), MHA_OK);
    for (int64_t i = 0; i < L; i++)
        for (int64_t e = 0; e < D; e++)
            CHECK(c.got[i * c.ldo + e] == c.qkv[4 * c.ld + 2 * D + e]);
    for (int64_t i = 0; i < L; i++)
        for (int64_t e = 0; e < D; e++)
            c.qkv[i * c.ld + D + e] = 1.0f; /* every key alike */
    CHECK_STATUS(run_on(kernel, &c, 1.0f), MHA_OK);
    for (int64_t e = 0; e < D; e++) {
        double mean = 0;
        for (int64_t j = 0; j < L; j++)
            mean += c.qkv[j * c.ld + 2 * D + e] / (double)L;
        CHECK(fabs(c.got[e] - mean) <= 1e-6 * (1 + fabs(mean)));
    }
    case_free(&c);
}

TEST(attention_short_avx2_large_scores) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("no AVX2+FMA on this CPU");
    large_scores(ON_AVX2, 9, 8);
    large_scores(ON_AVX2, 37, 32); /* a 5-key tail of the 8-lane vectors, the encoder's d */
}

/* ---- the avx512 loop (attention_short_avx512.c) ------------------------------------ */

/* The kernel against the reference: every tail of the 8- and 16-key
 * vectors, the 16- and 32-key panels and the 6- and 8-row blocks; every
 * head-column mask; each d with gapped and tight rows; a workspace of NaN
 * (the kernel must not read what it did not write). */
static void matches_ref(short_kernel kernel, const char *name) {
    static const int64_t L5[] = {1, 2, 5, 6, 7, 8, 9, 13, 15, 16, 17, 37, 100, 128, 130};
    static const int64_t d5[] = {1, 5, 8, 16, 17, 31, 32, 33, 48, 64, 80};
    uint64_t seed = 4000;
    for (size_t a = 0; a < sizeof L5 / sizeof *L5; a++)
        for (size_t b = 0; b < sizeof Hs / sizeof *Hs; b++)
            for (size_t k = 0; k < sizeof d5 / sizeof *d5; k++) {
                const int64_t L = L5[a], H = Hs[b], d = d5[k];
                short_case c;
                case_make_ld(&c, L, H, d, seed++, (a + b + k) % 2 == 0); /* each d both ways */
                const float scale = 1.0f / sqrtf((float)d);
                mha_attn_short_f32_ref(c.want, c.ldo, c.qkv, c.qkv + H * d, c.qkv + 2 * H * d,
                                       c.ld, L, L, H, d, scale, c.ws);
                for (int64_t e = 0; e < mha_attn_short_ws_floats(L, d); e++)
                    c.ws[e] = NAN;
                CHECK_STATUS(run_on(kernel, &c, scale), MHA_OK);
                compare(&c, name);
                case_free(&c);
            }
}

TEST(attention_short_avx2_matches_ref) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("no AVX2+FMA on this CPU");
    matches_ref(ON_AVX2, "avx2 vs ref");
}

TEST(attention_short_avx512_matches_ref) {
    if (!mha_avx512_runs())
        SKIP("avx512: this CPU lacks AVX-512 and the test library has no emulation");
    matches_ref(ON_AVX512, "avx512 vs ref");
}

TEST(attention_short_avx512_large_scores) {
    if (!mha_avx512_runs())
        SKIP("avx512: this CPU lacks AVX-512 and the test library has no emulation");
    large_scores(ON_AVX512, 9, 8);
    large_scores(ON_AVX512, 37, 32); /* a 16-key tail, the encoder's d */
}

/* Asked for where it cannot run (emulation off, no AVX-512):
 * MHA_ERR_UNSUPPORTED naming AVX-512, ctx untouched. */
TEST(attention_short_avx512_unsupported_is_an_error) {
    if (mha_cpu_has_avx512())
        SKIP("this CPU has AVX-512: the refusal is not reachable");
    test_avx512_emulation_off();
    short_case c;
    case_make(&c, 7, 2, 32, 77);
    CHECK_STATUS(run_on(ON_AVX512, &c, 1.0f), MHA_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("AVX-512");
    for (int64_t e = 0; e < c.L * c.ldo; e++)
        if (c.got[e] != GUARD) {
            CHECK(c.got[e] == GUARD);
            break;
        }
    case_free(&c);
    test_avx512_emulation_restore();
}

/* ---- mha_sdpa_forward's plain problems on the whole-row kernel ------------------ */

/* (B, Hq, Hkv, L, d, strided): q, k, v (B, H, L, d) views; strided: heads
 * interleaved in one (B, L, 3 H d) buffer as an in-projection writes them. */
typedef struct {
    int64_t B, Hq, Hkv, L, d;
    bool strided;
} rows_case;

/* q, k, v, out views over fresh buffers (randn, seed) of case rc. */
typedef struct {
    float *qkv, *want, *got;
    mha_tensor q, k, v, o, o_ref;
} rows_data;

static void rows_make(rows_data *r, const rows_case *rc, uint64_t seed) {
    const int64_t B = rc->B, Hq = rc->Hq, Hkv = rc->Hkv, L = rc->L, d = rc->d;
    const int64_t row = rc->strided ? (Hq + 2 * Hkv) * d : 0; /* floats per token */
    const size_t n = (size_t)(B * L * (Hq + 2 * Hkv) * d), no = (size_t)(B * Hq * L * d);
    r->qkv = malloc(sizeof(float) * n);
    r->want = malloc(sizeof(float) * no);
    r->got = malloc(sizeof(float) * no);
    test_randn(r->qkv, n, seed);
    if (rc->strided) {
        r->q = (mha_tensor){r->qkv, MHA_F32, 4, {B, Hq, L, d}, {L * row, d, row, 1}};
        r->k = (mha_tensor){r->qkv + Hq * d, MHA_F32, 4, {B, Hkv, L, d}, {L * row, d, row, 1}};
        r->v = (mha_tensor){r->qkv + (Hq + Hkv) * d, MHA_F32, 4, {B, Hkv, L, d},
                            {L * row, d, row, 1}};
    } else {
        r->q = (mha_tensor){r->qkv, MHA_F32, 4, {B, Hq, L, d}, {Hq * L * d, L * d, d, 1}};
        r->k = (mha_tensor){r->qkv + B * Hq * L * d, MHA_F32, 4, {B, Hkv, L, d},
                            {Hkv * L * d, L * d, d, 1}};
        r->v = (mha_tensor){r->qkv + B * (Hq + Hkv) * L * d, MHA_F32, 4, {B, Hkv, L, d},
                            {Hkv * L * d, L * d, d, 1}};
    }
    r->o = (mha_tensor){r->got, MHA_F32, 4, {B, Hq, L, d}, {Hq * L * d, L * d, d, 1}};
    r->o_ref = r->o;
    r->o_ref.data = r->want;
}

static void rows_free(rows_data *r) { free(r->qkv), free(r->want), free(r->got); }

/* The problem mha_attn_run sees for these views and options, served on
 * kernel's whole rows? */
static bool served_on(const rows_data *r, const mha_sdpa_options *opt, mha_kernel kernel) {
    mha_attn_problem p;
    if (mha_sdpa_problem_init(&p, &r->q, &r->k, &r->v, &r->o, opt) != MHA_OK)
        return false;
    if (opt->attn_weights) /* mha_sdpa_forward adds them after the init */
        p.attn_weights = *opt->attn_weights;
    return mha_attn_short_serves(&p, kernel, false);
}

static bool served(const rows_data *r, const mha_sdpa_options *opt) {
    return served_on(r, opt, MHA_KERNEL_AVX512);
}

/* got against want: |diff| <= 2e-6 (1 + max |v|) per element (rows are
 * convex mixes of v rows); returns the largest difference. */
static double rows_compare(const rows_data *r, const rows_case *rc, const char *name) {
    const size_t n = (size_t)(rc->B * rc->Hq * rc->L * rc->d);
    double vmax = 0, worst = 0;
    for (int64_t b = 0; b < rc->B; b++)
        for (int64_t h = 0; h < rc->Hkv; h++)
            for (int64_t j = 0; j < rc->L; j++)
                for (int64_t c = 0; c < rc->d; c++) {
                    const float *v = r->v.data;
                    vmax = fmax(vmax, fabsf(v[b * r->v.stride[0] + h * r->v.stride[1] +
                                              j * r->v.stride[2] + c]));
                }
    for (size_t e = 0; e < n; e++)
        worst = fmax(worst, fabs((double)r->got[e] - r->want[e]));
    if (!(worst <= 2e-6 * (1 + vmax)))
        test_fail(__FILE__, __LINE__,
                  "%s B=%lld Hq=%lld Hkv=%lld L=%lld d=%lld%s: max |diff| %.3g > %.3g", name,
                  (long long)rc->B, (long long)rc->Hq, (long long)rc->Hkv, (long long)rc->L,
                  (long long)rc->d, rc->strided ? " strided" : "", worst, 2e-6 * (1 + vmax));
    return worst;
}

/* Case i's masking: none, causal top-left, causal bottom-right in turn
 * (with L = S the two are the same diagonal). */
static mha_causal causal_of(size_t i) {
    const mha_causal modes[3] = {MHA_CAUSAL_NONE, MHA_CAUSAL_TOP_LEFT, MHA_CAUSAL_BOTTOM_RIGHT};
    return modes[i % 3];
}

/* A training forward (opt.lse) on the same whole rows: served, out the
 * same bits as without lse (one: those; the flash tiles would round
 * otherwise), lse within 2e-6 (1 + |ref|) of the reference kernel's (which
 * sums in float64), written through a strided view (strided: every other
 * float, the gaps untouched) when asked. */
static void lse_matches_ref(const rows_data *r, const rows_case *rc, const mha_sdpa_options *base,
                            mha_kernel kernel, const float *one, bool strided) {
    const int64_t B = rc->B, H = rc->Hq, L = rc->L, n = B * H * L, st = strided ? 2 : 1;
    float *want = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)(st * n));
    for (int64_t e = 0; e < st * n; e++)
        got[e] = GUARD;
    mha_tensor lw = {want, MHA_F32, 3, {B, H, L}, {H * L, L, 1}};
    mha_tensor lg = {got, MHA_F32, 3, {B, H, L}, {st * H * L, st * L, st}};
    mha_sdpa_options opt = *base;
    rows_data rr = *r;
    opt.lse = &lw, opt.kernel = MHA_KERNEL_REF;
    CHECK_STATUS(mha_sdpa_forward(&rr.o_ref, &rr.q, &rr.k, &rr.v, &opt), MHA_OK);
    opt.lse = &lg, opt.kernel = kernel;
    CHECK(served_on(&rr, &opt, kernel));
    CHECK_STATUS(mha_sdpa_forward(&rr.o, &rr.q, &rr.k, &rr.v, &opt), MHA_OK);
    CHECK(memcmp(one, rr.got, sizeof(float) * (size_t)(n * rc->d)) == 0);
    double worst = 0;
    size_t guards = 0;
    for (int64_t e = 0; e < n; e++) {
        worst = fmax(worst, fabs((double)got[e * st] - want[e]) / (1 + fabs(want[e])));
        guards += strided && got[e * st + 1] != GUARD;
    }
    CHECK(worst <= 2e-6 && guards == 0);
    if (!(worst <= 2e-6) || guards)
        printf("  lse B=%lld Hq=%lld L=%lld d=%lld: relative difference %.3g, %zu guards hit\n",
               (long long)B, (long long)H, (long long)L, (long long)rc->d, worst, guards);
    free(want), free(got);
}

/* mha_sdpa_forward's kernel (avx2 or avx512) takes plain problems whose
 * rows fit to its whole-row loop, causal ones too: odd shapes (L = 1, L and
 * d not multiples of 16 or 8, d = 1, h = 1, GQA, interleaved heads) against
 * the reference kernel; bit-identical for 1 and 3 threads; what it must not
 * take goes elsewhere. */
static void serves_sdpa_on(mha_kernel kernel) {
    static const rows_case cases[] = {
        {1, 1, 1, 1, 1, false},   {2, 3, 3, 7, 5, false},    {1, 2, 2, 17, 16, true},
        {3, 4, 2, 37, 33, false}, {2, 6, 3, 130, 32, true},  {1, 2, 1, 64, 80, false},
        {1, 1, 1, 200, 64, true}, {1, 2, 2, 300, 128, false}, {4, 3, 3, 9, 1, true},
        {1, 1, 1, 700, 100, false}, /* S d past 65536: the panels at length */
    };
    const int threads = mha_get_num_threads();
    uint64_t seed = 900;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const rows_case *rc = &cases[i];
        rows_data r;
        rows_make(&r, rc, seed++);
        mha_sdpa_options opt;
        mha_sdpa_options_init(&opt);
        opt.causal = causal_of(i); /* every third case plain, causal either way */
        CHECK(served_on(&r, &opt, kernel));
        opt.kernel = MHA_KERNEL_REF;
        CHECK_STATUS(mha_sdpa_forward(&r.o_ref, &r.q, &r.k, &r.v, &opt), MHA_OK);
        opt.kernel = kernel;
        mha_set_num_threads(1);
        CHECK_STATUS(mha_sdpa_forward(&r.o, &r.q, &r.k, &r.v, &opt), MHA_OK);
        const double worst = rows_compare(&r, rc, "whole rows vs ref");
        CHECK(worst > 0 || rc->L == 1); /* a real comparison: the kernels differ in bits */
        float *one = malloc(sizeof(float) * (size_t)(rc->B * rc->Hq * rc->L * rc->d));
        memcpy(one, r.got, sizeof(float) * (size_t)(rc->B * rc->Hq * rc->L * rc->d));
        mha_set_num_threads(3);
        CHECK_STATUS(mha_sdpa_forward(&r.o, &r.q, &r.k, &r.v, &opt), MHA_OK);
        CHECK(memcmp(one, r.got, sizeof(float) * (size_t)(rc->B * rc->Hq * rc->L * rc->d)) == 0);
        mha_set_num_threads(threads);
        lse_matches_ref(&r, rc, &opt, kernel, one, i % 2 == 1);
        free(one);
        rows_free(&r);
    }
}

TEST(attention_short_serves_sdpa_on_avx2) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("no AVX2+FMA on this CPU");
    serves_sdpa_on(MHA_KERNEL_AVX2);
}

TEST(attention_short_serves_sdpa_on_avx512) {
    if (!mha_avx512_runs())
        SKIP("avx512: this CPU lacks AVX-512 and the test library has no emulation");
    serves_sdpa_on(MHA_KERNEL_AVX512);
}

/* Options, shapes and layouts the whole-row loop lacks are not served. */
TEST(attention_short_serves_only_plain_problems) {
    rows_case rc = {1, 2, 2, 40, 16, false};
    rows_data r;
    rows_make(&r, &rc, 5);
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    CHECK(served(&r, &opt));
    opt.causal = MHA_CAUSAL_TOP_LEFT; /* the main diagonal: served */
    CHECK(served(&r, &opt));
    opt.causal = MHA_CAUSAL_BOTTOM_RIGHT;
    CHECK(served(&r, &opt));
    opt.causal = MHA_CAUSAL_OFFSET, opt.causal_offset = 3; /* another diagonal: not */
    CHECK(!served(&r, &opt));
    opt.causal_offset = 0;
    CHECK(served(&r, &opt));
    mha_sdpa_options_init(&opt);
    opt.training = 1, opt.dropout_p = 0.1f;
    CHECK(!served(&r, &opt));
    mha_sdpa_options_init(&opt);
    float w[2 * 40 * 40];
    mha_tensor wt = {w, MHA_F32, 4, {1, 2, 40, 40}, {3200, 1600, 40, 1}};
    opt.attn_weights = &wt;
    CHECK(!served(&r, &opt));
    mha_sdpa_options_init(&opt);
    r.k.shape[2] = r.v.shape[2] = 39; /* S != L */
    CHECK(!served(&r, &opt));
    r.k.shape[2] = r.v.shape[2] = 40;
    r.v.shape[3] = 8; /* dv != d */
    r.o.shape[3] = 8;
    CHECK(!served(&r, &opt));
    rows_free(&r);
    /* one head's rows past the measured bounds: S d > 524288, and past
     * the avx2 loop's; the scalar and reference kernels have no whole rows */
    rows_case big = {1, 1, 1, 6600, 80, false};
    rows_make(&r, &big, 6);
    CHECK(!served(&r, &opt) && !served_on(&r, &opt, MHA_KERNEL_AVX2));
    rows_free(&r);
    /* the avx2 bound exactly (served) and one key past it (not) */
    rows_case edge = {1, 1, 1, MHA_ATTN_SHORT_AVX2_MAX_SD / 16, 16, false};
    rows_make(&r, &edge, 7);
    CHECK(served_on(&r, &opt, MHA_KERNEL_AVX2));
    rows_free(&r);
    edge.L++;
    rows_make(&r, &edge, 7);
    CHECK(!served_on(&r, &opt, MHA_KERNEL_AVX2));
    CHECK(!served_on(&r, &opt, MHA_KERNEL_SCALAR) && !served_on(&r, &opt, MHA_KERNEL_REF));
    rows_free(&r);
    /* the avx512 bound of this machine's caches: 524288 on AMD, half the
     * L2 per core for K^T and V elsewhere (131072 with 2 MiB); served
     * exactly at it, not one key past */
    const int64_t most = mha_attn_short_avx512_max_sd();
    rows_case edge512 = {1, 1, 1, most / 16, 16, false};
    rows_make(&r, &edge512, 7);
    CHECK(served(&r, &opt));
    rows_free(&r);
    edge512.L++;
    rows_make(&r, &edge512, 7);
    CHECK(!served(&r, &opt));
    rows_free(&r);
}

/* An infinite k gives an -inf score: that key is skipped, never multiplied
 * by zero, so an inf or NaN in its v stays out of the output, as in the
 * reference. */
static void skips_neg_inf_on(mha_kernel kernel) {
    rows_case rc = {1, 1, 1, 20, 16, false};
    rows_data r;
    rows_make(&r, &rc, 8);
    float *q = r.q.data, *k = r.k.data, *v = r.v.data;
    for (int64_t c = 0; c < 16; c++) {
        q[0 * 16 + c] = q[5 * 16 + c] = 1.0f; /* rows 0 and 5: positive q */
        k[3 * 16 + c] = -INFINITY;           /* key 3: score -inf for them */
        v[3 * 16 + c] = c % 2 ? INFINITY : NAN;
    }
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.kernel = MHA_KERNEL_REF;
    CHECK_STATUS(mha_sdpa_forward(&r.o_ref, &r.q, &r.k, &r.v, &opt), MHA_OK);
    opt.kernel = kernel;
    CHECK(served_on(&r, &opt, kernel));
    CHECK_STATUS(mha_sdpa_forward(&r.o, &r.q, &r.k, &r.v, &opt), MHA_OK);
    for (int64_t c = 0; c < 16; c++)
        CHECK(isfinite(r.got[0 * 16 + c]) && isfinite(r.got[5 * 16 + c]));
    for (int64_t c = 0; c < 16; c++)
        CHECK(fabsf(r.got[5 * 16 + c] - r.want[5 * 16 + c]) <= 1e-5f);
    /* the log-sum-exp skips the key too: finite, the reference's */
    float lw[20], lg[20];
    mha_tensor tw = {lw, MHA_F32, 3, {1, 1, 20}, {20, 20, 1}}, tg = tw;
    tg.data = lg;
    opt.lse = &tw, opt.kernel = MHA_KERNEL_REF;
    CHECK_STATUS(mha_sdpa_forward(&r.o_ref, &r.q, &r.k, &r.v, &opt), MHA_OK);
    opt.lse = &tg, opt.kernel = kernel;
    CHECK(served_on(&r, &opt, kernel));
    CHECK_STATUS(mha_sdpa_forward(&r.o, &r.q, &r.k, &r.v, &opt), MHA_OK);
    for (int i = 0; i <= 5; i += 5) /* rows 0 and 5 (the others' scores are NaN) */
        CHECK(isfinite(lg[i]) && fabsf(lg[i] - lw[i]) <= 1e-5f * (1 + fabsf(lw[i])));
    rows_free(&r);
}

/* Causal rows never see the keys past their own: a NaN or inf in those
 * keys' v (a cache's unwritten tail, say) stays out of every row that
 * cannot see it, as in the reference, though a block of rows shares its
 * last row's keys. */
static void causal_hides_future_values_on(mha_kernel kernel) {
    rows_case rc = {1, 2, 1, 23, 16, false};
    rows_data r;
    rows_make(&r, &rc, 9);
    float *v = r.v.data;
    for (int64_t c = 0; c < 16; c++) {
        v[22 * 16 + c] = c % 2 ? INFINITY : NAN; /* the last key: only row 22 sees it */
        v[13 * 16 + c] = c % 3 ? -INFINITY : NAN; /* rows 13.. see it */
    }
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.causal = MHA_CAUSAL_TOP_LEFT;
    opt.kernel = MHA_KERNEL_REF;
    CHECK_STATUS(mha_sdpa_forward(&r.o_ref, &r.q, &r.k, &r.v, &opt), MHA_OK);
    opt.kernel = kernel;
    CHECK(served_on(&r, &opt, kernel));
    CHECK_STATUS(mha_sdpa_forward(&r.o, &r.q, &r.k, &r.v, &opt), MHA_OK);
    int bad = 0;
    for (int64_t h = 0; h < 2; h++)
        for (int64_t i = 0; i < 23; i++)
            for (int64_t c = 0; c < 16; c++) {
                const float g = r.got[(h * 23 + i) * 16 + c], w = r.want[(h * 23 + i) * 16 + c];
                const bool ok = i < 13 ? isfinite(g) && fabsf(g - w) <= 1e-5f * (1 + fabsf(w))
                                       : isnan(g) == isnan(w);
                if (!ok && bad++ < 3)
                    test_fail(__FILE__, __LINE__, "causal head %lld row %lld col %lld: %g vs %g",
                              (long long)h, (long long)i, (long long)c, g, w);
            }
    rows_free(&r);
}

TEST(attention_short_causal_hides_future_values_avx2) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("no AVX2+FMA on this CPU");
    causal_hides_future_values_on(MHA_KERNEL_AVX2);
}

TEST(attention_short_causal_hides_future_values_avx512) {
    if (!mha_avx512_runs())
        SKIP("avx512: this CPU lacks AVX-512 and the test library has no emulation");
    causal_hides_future_values_on(MHA_KERNEL_AVX512);
}

TEST(attention_short_skips_neg_inf_scores_avx2) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("no AVX2+FMA on this CPU");
    skips_neg_inf_on(MHA_KERNEL_AVX2);
}

TEST(attention_short_skips_neg_inf_scores) {
    if (!mha_avx512_runs())
        SKIP("avx512: this CPU lacks AVX-512 and the test library has no emulation");
    skips_neg_inf_on(MHA_KERNEL_AVX512);
}

/* ---- bf16 q, k, v on the vdpbf16ps whole-row loop (attention_short_avx512bf16.c) -- */

/* Whether mha_sdpa_forward's avx512 kernel takes bf16 whole rows here: the
 * vdpbf16ps products (natively or emulated; an AMX CPU keeps its tiles). */
static bool bf16_rows_run(void) {
    uint16_t x[4] = {0};
    const int64_t sh[4] = {1, 1, 1, 1};
    mha_tensor t[4];
    for (int i = 0; i < 4; i++)
        mha_tensor_init(&t[i], MHA_BF16, &x[i], 4, sh);
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    mha_attn_problem p;
    const mha_flash_bf16 *dot = mha_flash_bf16_pick(); /* by name: the _emu twin too */
    return mha_avx512_runs() && dot && strcmp(dot->name, "avx512bf16") == 0 &&
           mha_sdpa_problem_init(&p, &t[0], &t[1], &t[2], &t[3], &opt) == MHA_OK &&
           mha_attn_short_serves(&p, MHA_KERNEL_AVX512, true);
}

/* Half (dt) copies of r's q, k and v, times 1.5 (same layout and
 * strides) in *buf, and a half out of r's shape in *obuf. */
static void rows_to_half(const rows_data *r, const rows_case *rc, mha_dtype dt, uint16_t **buf,
                         uint16_t **obuf, mha_tensor t[4]) {
    const size_t n = (size_t)(rc->B * rc->L * (rc->Hq + 2 * rc->Hkv) * rc->d);
    const size_t no = (size_t)(rc->B * rc->Hq * rc->L * rc->d);
    *buf = malloc(sizeof(uint16_t) * n);
    *obuf = malloc(sizeof(uint16_t) * no);
    for (size_t e = 0; e < n; e++)
        mha_store_f(*buf, dt, (int64_t)e, r->qkv[e] * 1.5f);
    const mha_tensor *src[4] = {&r->q, &r->k, &r->v, &r->o};
    for (int i = 0; i < 4; i++) {
        t[i] = *src[i];
        t[i].dtype = dt;
        t[i].data = i < 3 ? (void *)(*buf + ((const float *)src[i]->data - r->qkv)) : *obuf;
    }
}

static void rows_to_bf16(const rows_data *r, const rows_case *rc, uint16_t **buf,
                         uint16_t **obuf, mha_tensor t[4]) {
    rows_to_half(r, rc, MHA_BF16, buf, obuf, t);
}

/* bf16 problems go to the bf16 loop where the avx512 kernel has it: odd
 * shapes (L = 1, d = 1, odd d: a half pair; L, d not multiples of 16 or 32;
 * GQA; interleaved heads) against the reference kernel on the same bf16
 * values, normalised (test_rel_err), plain and causal either way (cases in
 * turn).  The reference rounds P relative to
 * the row's max, as whole rows do, so only the float32 sum order and the
 * exp differ - but an exp one ulp apart can put a weight on the other side
 * of a bf16 rounding boundary (2^-8 of that weight): <= 5e-4, against the
 * 2e-3 of the flash driver, whose P is rounded against running maxima.
 * Out bf16 adds its own rounding (8 significant bits: up to 2^-8 of a
 * value): <= 4.5e-3.  Bit-identical for 1 and 3 threads. */
TEST(attention_short_bf16_serves_sdpa) {
    if (!bf16_rows_run())
        SKIP("bf16 whole rows: no AVX512_BF16 (or AMX takes bf16 here) and no emulation");
    static const rows_case cases[] = {
        {1, 1, 1, 1, 1, false},   {2, 3, 3, 7, 5, false},    {1, 2, 2, 17, 16, true},
        {3, 4, 2, 37, 33, false}, {2, 6, 3, 130, 32, true},  {1, 2, 1, 64, 80, false},
        {1, 1, 1, 200, 64, true}, {1, 2, 2, 300, 128, false}, {4, 3, 3, 9, 1, true},
        {1, 1, 1, 33, 2, false},  {1, 2, 2, 31, 3, true},    {1, 1, 1, 65, 48, false},
        {1, 1, 1, 600, 120, false},
    };
    const int threads = mha_get_num_threads();
    double worst = 0.0, worst16 = 0.0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const rows_case *rc = &cases[i];
        const size_t no = (size_t)(rc->B * rc->Hq * rc->L * rc->d);
        rows_data r;
        rows_make(&r, rc, 1300 + i);
        uint16_t *buf, *o16;
        mha_tensor t[4];
        rows_to_bf16(&r, rc, &buf, &o16, t);
        mha_sdpa_options opt;
        mha_sdpa_options_init(&opt);
        opt.causal = causal_of(i + 1);
        mha_attn_problem p;
        REQUIRE_OK(mha_sdpa_problem_init(&p, &t[0], &t[1], &t[2], &r.o, &opt));
        CHECK(mha_attn_short_serves(&p, MHA_KERNEL_AVX512, true));
        /* without the vdpbf16ps products: widened to the float32 loop */
        CHECK(mha_attn_short_serves(&p, MHA_KERNEL_AVX512, false));
        REQUIRE_OK(mha_sdpa_problem_init(&p, &t[0], &t[1], &t[2], &t[3], &opt));
        CHECK(mha_attn_short_serves(&p, MHA_KERNEL_AVX512, true));
        opt.kernel = MHA_KERNEL_REF;
        REQUIRE_OK(mha_sdpa_forward(&r.o_ref, &t[0], &t[1], &t[2], &opt));
        opt.kernel = MHA_KERNEL_AVX512;
        mha_set_num_threads(1);
        REQUIRE_OK(mha_sdpa_forward(&r.o, &t[0], &t[1], &t[2], &opt));
        const double e = test_rel_err(r.got, r.want, no);
        worst = e > worst ? e : worst;
        if (!(e <= 5e-4))
            test_fail(__FILE__, __LINE__, "bf16 rows case %zu (L %lld d %lld): %.3g > 5e-4", i,
                      (long long)rc->L, (long long)rc->d, e);
        CHECK(e > 0 || rc->L == 1); /* a real comparison */
        REQUIRE_OK(mha_sdpa_forward(&t[3], &t[0], &t[1], &t[2], &opt));
        uint16_t *one = malloc(sizeof(uint16_t) * no);
        memcpy(one, o16, sizeof(uint16_t) * no);
        for (size_t e2 = 0; e2 < no; e2++)
            r.got[e2] = mha_bf16_to_float(o16[e2]);
        const double e16 = test_rel_err(r.got, r.want, no);
        worst16 = e16 > worst16 ? e16 : worst16;
        CHECK(e16 <= 4.5e-3);
        mha_set_num_threads(3);
        REQUIRE_OK(mha_sdpa_forward(&t[3], &t[0], &t[1], &t[2], &opt));
        CHECK(memcmp(one, o16, sizeof(uint16_t) * no) == 0);
        mha_set_num_threads(threads);
        free(one), free(buf), free(o16);
        rows_free(&r);
    }
    printf("  bf16 whole rows vs reference: out f32 %.2e (bound 5e-4), out bf16 %.2e (bound 4.5e-3)\n",
           worst, worst16);
}

/* bf16 rows with an -inf score (an infinite k): the key is skipped as in
 * the float32 loop, its inf / NaN v never reaching the output; mixed
 * dtypes and other out dtypes are not served by the bf16 loop. */
/* Causal bf16 rows never see the keys past their own either (as
 * causal_hides_future_values_on): a NaN or inf in those keys' bf16 v stays
 * out of the rows that cannot see it. */
TEST(attention_short_bf16_causal_hides_future_values) {
    if (!bf16_rows_run())
        SKIP("bf16 whole rows: no AVX512_BF16 (or AMX takes bf16 here) and no emulation");
    const rows_case rc = {1, 2, 1, 23, 16, false};
    rows_data r;
    rows_make(&r, &rc, 1400);
    uint16_t *buf, *o16;
    mha_tensor t[4];
    rows_to_bf16(&r, &rc, &buf, &o16, t);
    uint16_t *v = t[2].data;
    for (int64_t c = 0; c < 16; c++) {
        v[22 * 16 + c] = c % 2 ? 0x7f80u : 0x7fc0u; /* inf, NaN: only row 22 sees key 22 */
        v[13 * 16 + c] = c % 3 ? 0xff80u : 0x7fc0u; /* rows 13.. see key 13 */
    }
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.causal = MHA_CAUSAL_TOP_LEFT;
    opt.kernel = MHA_KERNEL_REF;
    REQUIRE_OK(mha_sdpa_forward(&r.o_ref, &t[0], &t[1], &t[2], &opt));
    opt.kernel = MHA_KERNEL_AVX512;
    REQUIRE_OK(mha_sdpa_forward(&r.o, &t[0], &t[1], &t[2], &opt));
    int bad = 0;
    for (int64_t h = 0; h < 2; h++)
        for (int64_t i = 0; i < 23; i++)
            for (int64_t c = 0; c < 16; c++) {
                const float g = r.got[(h * 23 + i) * 16 + c], w = r.want[(h * 23 + i) * 16 + c];
                const bool ok = i < 13 ? isfinite(g) && fabsf(g - w) <= 5e-3f * (1 + fabsf(w))
                                       : isnan(g) == isnan(w);
                if (!ok && bad++ < 3)
                    test_fail(__FILE__, __LINE__,
                              "bf16 causal head %lld row %lld col %lld: %g vs %g", (long long)h,
                              (long long)i, (long long)c, g, w);
            }
    free(buf), free(o16);
    rows_free(&r);
}

TEST(attention_short_bf16_skips_and_declines) {
    if (!bf16_rows_run())
        SKIP("bf16 whole rows: no AVX512_BF16 (or AMX takes bf16 here) and no emulation");
    rows_case rc = {1, 1, 1, 20, 17, false};
    rows_data r;
    rows_make(&r, &rc, 8);
    uint16_t *buf, *o16;
    mha_tensor t[4];
    rows_to_bf16(&r, &rc, &buf, &o16, t);
    uint16_t *q = t[0].data, *k = t[1].data, *v = t[2].data;
    for (int64_t c = 0; c < 17; c++) {
        q[0 * 17 + c] = q[5 * 17 + c] = mha_float_to_bf16(1.0f);
        k[3 * 17 + c] = mha_float_to_bf16(-INFINITY);
        v[3 * 17 + c] = mha_float_to_bf16(c % 2 ? INFINITY : NAN);
    }
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.kernel = MHA_KERNEL_REF;
    REQUIRE_OK(mha_sdpa_forward(&r.o_ref, &t[0], &t[1], &t[2], &opt));
    opt.kernel = MHA_KERNEL_AVX512;
    REQUIRE_OK(mha_sdpa_forward(&r.o, &t[0], &t[1], &t[2], &opt));
    for (int64_t c = 0; c < 17; c++) {
        CHECK(isfinite(r.got[c]) && isfinite(r.got[5 * 17 + c]));
        CHECK(fabsf(r.got[5 * 17 + c] - r.want[5 * 17 + c]) <= 1e-4f);
    }
    CHECK(test_rel_err(r.got, r.want, 20 * 17) <= 1e-4);
    mha_attn_problem p;
    mha_tensor vf = r.v; /* float32 v beside bf16 q, k */
    REQUIRE_OK(mha_sdpa_problem_init(&p, &t[0], &t[1], &vf, &r.o, &opt));
    CHECK(!mha_attn_short_serves(&p, MHA_KERNEL_AVX512, true));
    mha_tensor o16t = t[3]; /* f16 out */
    o16t.dtype = MHA_F16;
    if (mha_sdpa_problem_init(&p, &t[0], &t[1], &t[2], &o16t, &opt) == MHA_OK)
        CHECK(!mha_attn_short_serves(&p, MHA_KERNEL_AVX512, true));
    uint16_t ctx[17];
    CHECK_STATUS(mha_attn_short_bf16_avx512(ctx, MHA_F16, 17, q, k, v, 17, 1, 20, 1, 17, 1.0f,
                                            NULL),
                 MHA_ERR_DTYPE);
    free(buf), free(o16);
    rows_free(&r);
}

/* ---- half q, k, v widened to the float32 loop (attention_short.c, run_widened) -- */

/* fp16, and bf16 where the vdpbf16ps loop is not taken, go to the float32
 * whole rows widened once, P rounded to v's dtype relative to each row's
 * max as the reference rounds it: odd shapes, GQA, interleaved heads,
 * plain and causal, against the reference kernel on the same half values
 * (normalised, test_rel_err): <= 5e-4 with out float32 (float32 sum order
 * and exp ulps; a weight near a rounding boundary of P can go the other
 * way); out half adds its own rounding: <= 4.5e-3 (bf16), 1e-3 (fp16).
 * P really is rounded: for bf16 the errors sum to under a tenth of those
 * against the reference on the widened values (P float32); fp16's
 * rounding (2^-12 of a weight) is as large as the flips an exp one ulp
 * apart causes at rounding boundaries (causal rows of few keys: up to
 * 1.2e-4 here), so it is not told apart this way (the rounding itself is
 * the flash loops' round_row, tested there).  Bit-identical for 1 and 3
 * threads. */
static void half_widened_on(mha_kernel kernel) {
    static const rows_case cases[] = {
        {1, 1, 1, 1, 1, false},   {2, 3, 3, 7, 5, false},   {1, 2, 2, 17, 16, true},
        {3, 4, 2, 37, 33, false}, {2, 6, 3, 130, 32, true}, {1, 2, 1, 64, 80, false},
        {4, 3, 3, 9, 1, true},    {2, 12, 12, 128, 32, true},
    };
    const mha_dtype dts[2] = {MHA_BF16, MHA_F16};
    const char *names[2] = {"bf16", "fp16"};
    const int threads = mha_get_num_threads();
    for (int di = 0; di < 2; di++) {
        const mha_dtype dt = dts[di];
        const char *name = names[di];
        double worst = 0, worst16 = 0, sum = 0, sum_raw = 0;
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            const rows_case *rc = &cases[i];
            const size_t n = (size_t)(rc->B * rc->L * (rc->Hq + 2 * rc->Hkv) * rc->d);
            const size_t no = (size_t)(rc->B * rc->Hq * rc->L * rc->d);
            rows_data r;
            rows_make(&r, rc, 2100 + i);
            uint16_t *buf, *o16;
            mha_tensor t[4];
            rows_to_half(&r, rc, dt, &buf, &o16, t);
            float *raw = malloc(sizeof(float) * no);
            REQUIRE(buf && o16 && raw);
            mha_sdpa_options opt;
            mha_sdpa_options_init(&opt);
            opt.causal = causal_of(i);
            mha_attn_problem p;
            REQUIRE_OK(mha_sdpa_problem_init(&p, &t[0], &t[1], &t[2], &r.o, &opt));
            CHECK(mha_attn_short_serves(&p, kernel, false));
            REQUIRE_OK(mha_sdpa_problem_init(&p, &t[0], &t[1], &t[2], &t[3], &opt));
            CHECK(mha_attn_short_serves(&p, kernel, false));
            opt.kernel = MHA_KERNEL_REF;
            REQUIRE_OK(mha_sdpa_forward(&r.o_ref, &t[0], &t[1], &t[2], &opt));
            for (size_t e = 0; e < n; e++) /* the half values, float32: P unrounded */
                r.qkv[e] = mha_load_f(buf, dt, (int64_t)e);
            mha_tensor oraw = r.o_ref;
            oraw.data = raw;
            REQUIRE_OK(mha_sdpa_forward(&oraw, &r.q, &r.k, &r.v, &opt));
            opt.kernel = kernel;
            mha_set_num_threads(1);
            REQUIRE_OK(mha_sdpa_forward(&r.o, &t[0], &t[1], &t[2], &opt));
            const double e = test_rel_err(r.got, r.want, no), er = test_rel_err(r.got, raw, no);
            worst = e > worst ? e : worst, sum += e, sum_raw += er;
            if (!(e <= 5e-4))
                test_fail(__FILE__, __LINE__, "%s widened rows case %zu (L %lld d %lld): %.3g",
                          name, i, (long long)rc->L, (long long)rc->d, e);
            CHECK(e > 0 || rc->L == 1); /* a real comparison */
            float *one = malloc(sizeof(float) * no);
            REQUIRE(one);
            memcpy(one, r.got, sizeof(float) * no);
            mha_set_num_threads(3);
            REQUIRE_OK(mha_sdpa_forward(&r.o, &t[0], &t[1], &t[2], &opt));
            CHECK(memcmp(one, r.got, sizeof(float) * no) == 0);
            mha_set_num_threads(1);
            REQUIRE_OK(mha_sdpa_forward(&t[3], &t[0], &t[1], &t[2], &opt));
            for (size_t e2 = 0; e2 < no; e2++)
                r.got[e2] = mha_load_f(o16, dt, (int64_t)e2);
            const double e16 = test_rel_err(r.got, r.want, no);
            worst16 = e16 > worst16 ? e16 : worst16;
            CHECK(e16 <= (dt == MHA_BF16 ? 4.5e-3 : 1e-3));
            mha_set_num_threads(threads);
            free(one), free(raw), free(buf), free(o16);
            rows_free(&r);
        }
        if (dt == MHA_BF16) /* fp16's 2^-12 is the size of the exp's boundary flips */
            CHECK(sum <= 0.1 * sum_raw);
        printf("  %s widened whole rows (%s) vs reference: out f32 %.2e (bound 5e-4; P unrounded "
               "%.2e), out %s %.2e\n",
               name, mha_kernel_name(kernel), worst,
               sum_raw / (double)(sizeof cases / sizeof *cases), name, worst16);
    }
}

TEST(attention_short_half_widened_on_avx2) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("no AVX2+FMA on this CPU");
    half_widened_on(MHA_KERNEL_AVX2);
}

TEST(attention_short_half_widened_on_avx512) {
    if (!mha_avx512_runs())
        SKIP("avx512: this CPU lacks AVX-512 and the test library has no emulation");
    half_widened_on(MHA_KERNEL_AVX512);
}
