/* test_flash.c - the fused attention kernels (scalar, avx2) against the
 * reference kernel on many shapes and every option.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v.
 * Rule: max|y - ref| <= 1e-5 * max(1, max|ref|) (test_rel_err), for the
 * output and, when requested, the attention weights.
 */
#include "test.h"
#include "private_api.h"
#include "internal.h"
#include "kernels/attention_flash.h"
#include "kernels/convert.h" /* mha_round_to */

#include <float.h>

#include <fenv.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define TOL 1e-5

enum { MASK_NONE, MASK_BOOL_LS, MASK_FLOAT_B1LS, MASK_BOOL_FULL, MASK_FLOAT_S };
enum { KPM_NONE, KPM_BOOL, KPM_FLOAT };

typedef struct fcase {
    int64_t B, Hq, Hkv, L, S, d, dv;
    mha_causal causal;
    int64_t offset;
    int mask, kpm;
    mha_mask_polarity polarity;
    mha_masked_rows rows;
    float dropout;
    bool weights;
    bool strided;     /* q, k, v, out through non-contiguous views */
    float scale;      /* 0: default 1/sqrt(d)                         */
    bool poison;      /* NaN/Inf in K and V rows that every row masks */
    bool dead_row;    /* query row 0 fully masked by the mask          */
    bool nan_mask;    /* the float mask holds a NaN at column 3        */
    bool int_qk;      /* q, k rounded to {-1,0,1}: exact fp32 scores   */
} fcase;

/* A (n0,n1,n2,n3) view stored as (n0,n2,n1,n3+pad) with element step 2 in
 * the last dim when strided, else contiguous; data randn. */
static float *make_view(mha_tensor *t, const int64_t shape[4], bool strided, uint64_t seed) {
    size_t n;
    if (!strided) {
        n = (size_t)(shape[0] * shape[1] * shape[2] * shape[3]);
        float *x = malloc((n ? n : 1) * sizeof(float));
        test_randn(x, n, seed);
        mha_tensor_init(t, MHA_F32, x, 4, shape);
        return x;
    }
    int64_t w = 2 * shape[3] + 3; /* step 2 and a gap per row */
    n = (size_t)(shape[0] * shape[2] * shape[1] * w);
    float *x = malloc((n ? n : 1) * sizeof(float));
    test_randn(x, n, seed);
    memset(t, 0, sizeof *t);
    t->data = x, t->dtype = MHA_F32, t->ndim = 4;
    memcpy(t->shape, shape, 4 * sizeof(int64_t));
    t->stride[3] = 2;
    t->stride[1] = w;
    t->stride[2] = shape[1] * w;
    t->stride[0] = shape[2] * shape[1] * w;
    return x;
}

/* Copies a 4-D view into a contiguous array. */
static void gather(float *dst, const mha_tensor *t) {
    const float *x = t->data;
    size_t k = 0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t e = 0; e < t->shape[3]; e++)
                    dst[k++] = x[a * t->stride[0] + b * t->stride[1] + c * t->stride[2] +
                                 e * t->stride[3]];
}

static float *at4(const mha_tensor *t, int64_t a, int64_t b, int64_t c, int64_t e) {
    return (float *)t->data + a * t->stride[0] + b * t->stride[1] + c * t->stride[2] +
           e * t->stride[3];
}

typedef struct fout {
    float *o, *w; /* contiguous copies (B,Hq,L,dv), (B,Hq,L,S) */
} fout;

/* Runs the case on `kernel`; false when the call failed. */
static bool run_case(const fcase *c, mha_kernel kernel, int threads, fout *res) {
    int64_t qs[4] = {c->B, c->Hq, c->L, c->d}, ks[4] = {c->B, c->Hkv, c->S, c->d};
    int64_t vs[4] = {c->B, c->Hkv, c->S, c->dv}, os[4] = {c->B, c->Hq, c->L, c->dv};
    int64_t ws[4] = {c->B, c->Hq, c->L, c->S};
    mha_tensor Q, K, V, O, W, M, P;
    float *q = make_view(&Q, qs, c->strided, 11), *k = make_view(&K, ks, c->strided, 12);
    float *v = make_view(&V, vs, c->strided, 13), *o = make_view(&O, os, c->strided, 14);
    float *w = NULL;
    uint8_t *mb = NULL, *pb = NULL;
    float *mf = NULL, *pf = NULL;
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.kernel = kernel;
    opt.causal = c->causal;
    opt.causal_offset = c->offset;
    opt.masked_rows = c->rows;
    if (c->scale != 0.0f)
        opt.scale_set = 1, opt.scale = c->scale;
    if (c->dropout > 0.0f)
        opt.training = 1, opt.dropout_p = c->dropout, opt.seed = 1234;

    if (c->int_qk) { /* exact scores, so huge logits test softmax, not rounding */
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t j = 0; j < c->S; j++)
                for (int64_t e = 0; e < c->d; e++)
                    for (int64_t h = 0; h < c->Hkv; h++)
                        *at4(&K, b, h, j, e) = fmaxf(-1.0f, fminf(1.0f, roundf(*at4(&K, b, h, j, e))));
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t i = 0; i < c->L; i++)
                    for (int64_t e = 0; e < c->d; e++)
                        *at4(&Q, b, h, i, e) = fmaxf(-1.0f, fminf(1.0f, roundf(*at4(&Q, b, h, i, e))));
    }
    uint64_t rng = 99;
#define RND() (rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17, rng)
    if (c->mask == MASK_BOOL_LS || c->mask == MASK_BOOL_FULL) {
        int64_t shape[4] = {c->B, c->Hq, c->L, c->S};
        int nd = c->mask == MASK_BOOL_LS ? 2 : 4;
        size_t n = (size_t)(c->L * c->S) * (nd == 4 ? (size_t)(c->B * c->Hq) : 1);
        mb = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++) {
            bool keep = RND() % 10 < 7;
            mb[i] = (uint8_t)(c->polarity == MHA_TRUE_KEEPS ? keep : !keep);
        }
        if (c->dead_row) /* row 0 of every (b,h) masked entirely */
            for (size_t i = 0; i < n; i += (size_t)(c->L * c->S))
                for (int64_t j = 0; j < c->S; j++)
                    mb[i + (size_t)j] = c->polarity == MHA_TRUE_KEEPS ? 0 : 1;
        mha_tensor_init(&M, MHA_BOOL, mb, nd, nd == 2 ? shape + 2 : shape);
        opt.attn_mask = &M, opt.attn_mask_polarity = c->polarity;
    } else if (c->mask == MASK_FLOAT_B1LS || c->mask == MASK_FLOAT_S) {
        int64_t shape[4] = {c->B, 1, c->L, c->S};
        size_t n = c->mask == MASK_FLOAT_S ? (size_t)c->S : (size_t)(c->B * c->L * c->S);
        mf = malloc((n ? n : 1) * sizeof(float));
        test_randn(mf, n, 77);
        for (size_t i = 0; i < n; i++)
            if (RND() % 10 == 0)
                mf[i] = -INFINITY;
        if (c->dead_row && c->mask == MASK_FLOAT_B1LS)
            for (size_t i = 0; i < n; i += (size_t)(c->L * c->S))
                for (int64_t j = 0; j < c->S; j++)
                    mf[i + (size_t)j] = -INFINITY;
        if (c->nan_mask)
            mf[3] = NAN;
        if (c->mask == MASK_FLOAT_S)
            mha_tensor_init(&M, MHA_F32, mf, 1, &c->S);
        else
            mha_tensor_init(&M, MHA_F32, mf, 4, shape);
        opt.attn_mask = &M;
    }
    if (c->kpm != KPM_NONE) {
        int64_t shape[2] = {c->B, c->S};
        size_t n = (size_t)(c->B * c->S);
        if (c->kpm == KPM_BOOL) {
            pb = malloc(n ? n : 1);
            for (size_t i = 0; i < n; i++)
                pb[i] = RND() % 5 == 0; /* true = padded (default polarity) */
            if (c->poison)
                for (int64_t b = 0; b < c->B; b++)
                    pb[b * c->S + c->S - 1] = 1, pb[b * c->S] = 1;
            mha_tensor_init(&P, MHA_BOOL, pb, 2, shape);
        } else {
            pf = malloc((n ? n : 1) * sizeof(float));
            test_randn(pf, n, 78);
            if (c->poison)
                for (int64_t b = 0; b < c->B; b++)
                    pf[b * c->S + c->S - 1] = -INFINITY, pf[b * c->S] = -INFINITY;
            mha_tensor_init(&P, c->kpm == KPM_BOOL ? MHA_BOOL : MHA_F32, pf, 2, shape);
        }
        opt.key_padding_mask = &P;
    }
    if (c->poison)
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < c->Hkv; h++) {
                for (int64_t e = 0; e < c->d; e++)
                    *at4(&K, b, h, c->S - 1, e) = NAN, *at4(&K, b, h, 0, e) = INFINITY;
                for (int64_t e = 0; e < c->dv; e++)
                    *at4(&V, b, h, c->S - 1, e) = INFINITY, *at4(&V, b, h, 0, e) = NAN;
            }
    if (c->weights) {
        size_t n = (size_t)(c->B * c->Hq * c->L * c->S);
        w = malloc((n ? n : 1) * sizeof(float));
        for (size_t i = 0; i < n; i++)
            w[i] = 123.0f; /* every element must be written */
        mha_tensor_init(&W, MHA_F32, w, 4, ws);
        opt.attn_weights = &W;
    }
#undef RND
    mha_set_num_threads(threads);
    mha_status st = mha_sdpa_forward(&O, &Q, &K, &V, &opt);
    mha_set_num_threads(0);
    if (st == MHA_OK) {
        size_t no = (size_t)(c->B * c->Hq * c->L * c->dv);
        res->o = malloc((no ? no : 1) * sizeof(float));
        gather(res->o, &O);
        res->w = w;
        w = NULL;
    } else {
        test_fail(__FILE__, __LINE__, "kernel %s: %s", mha_kernel_name(kernel), mha_last_error());
    }
    free(q), free(k), free(v), free(o), free(w), free(mb), free(pb), free(mf), free(pf);
    return st == MHA_OK;
}

/* Every fused kernel against the reference; returns the worst error. */
static double check_case(const fcase *c, const char *label) {
    fout ref = {0};
    if (!run_case(c, MHA_KERNEL_REF, 2, &ref))
        return INFINITY;
    size_t no = (size_t)(c->B * c->Hq * c->L * c->dv), nw = (size_t)(c->B * c->Hq * c->L * c->S);
    double worst = 0.0;
    mha_kernel kernels[3] = {MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2, MHA_KERNEL_AVX512};
    for (int kk = 0; kk < 3; kk++) {
        if (!test_kernel_runs(kernels[kk]))
            continue;
        fout got = {0};
        if (!run_case(c, kernels[kk], 2, &got))
            return INFINITY;
        double e = test_rel_err(got.o, ref.o, no);
        if (c->weights) {
            double ew = test_rel_err(got.w, ref.w, nw);
            e = ew > e ? ew : e;
        }
        if (!(e <= TOL))
            test_fail(__FILE__, __LINE__, "%s: kernel %s error %g", label,
                      mha_kernel_name(kernels[kk]), e);
        worst = e > worst ? e : worst;
        free(got.o), free(got.w);
    }
    free(ref.o), free(ref.w);
    return worst;
}

static fcase base(int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t d,
                  int64_t dv) {
    fcase c;
    memset(&c, 0, sizeof c);
    c.B = B, c.Hq = Hq, c.Hkv = Hkv, c.L = L, c.S = S, c.d = d, c.dv = dv;
    return c;
}

TEST(flash_shapes) {
    const int64_t shapes[][7] = {
        {1, 1, 1, 1, 1, 1, 1},       {1, 1, 1, 1, 7, 5, 3},     {2, 3, 3, 5, 1, 4, 4},
        {1, 2, 2, 97, 131, 64, 64},  {2, 4, 2, 100, 129, 33, 17}, {1, 6, 2, 200, 257, 128, 128},
        {1, 4, 1, 193, 300, 1, 9},   {3, 2, 1, 13, 17, 80, 48}, {1, 1, 1, 250, 250, 96, 40},
        {1, 3, 3, 7, 600, 16, 16},   {1, 1, 1, 300, 5, 24, 70},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const int64_t *s = shapes[i];
        fcase c = base(s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
        char label[96];
        snprintf(label, sizeof label, "shape %zu", i);
        check_case(&c, label);
        c.strided = true;
        check_case(&c, label);
    }
}

TEST(flash_causal) {
    const int64_t offsets[] = {0, 5, -3, -300, 1000};
    const int64_t shapes[][2] = {{97, 131}, {200, 150}, {1, 40}, {130, 130}};
    for (size_t s = 0; s < 4; s++) {
        fcase c = base(2, 2, 1, shapes[s][0], shapes[s][1], 32, 24);
        c.causal = MHA_CAUSAL_TOP_LEFT;
        check_case(&c, "top-left");
        c.causal = MHA_CAUSAL_BOTTOM_RIGHT;
        check_case(&c, "bottom-right");
        for (size_t o = 0; o < sizeof offsets / sizeof *offsets; o++) {
            c.causal = MHA_CAUSAL_OFFSET, c.offset = offsets[o];
            c.rows = MHA_MASKED_ROWS_NAN;
            check_case(&c, "offset nan rows");
            c.rows = MHA_MASKED_ROWS_ZERO, c.weights = true;
            check_case(&c, "offset zero rows + weights");
            c.weights = false;
        }
    }
}

TEST(flash_masks) {
    const int kinds[] = {MASK_BOOL_LS, MASK_FLOAT_B1LS, MASK_BOOL_FULL, MASK_FLOAT_S};
    for (size_t k = 0; k < 4; k++)
        for (int kpm = KPM_NONE; kpm <= KPM_FLOAT; kpm++)
            for (int pol = 0; pol < 2; pol++) {
                fcase c = base(2, 3, 3, 101, 150, 20, 12);
                c.mask = kinds[k], c.kpm = kpm, c.polarity = (mha_mask_polarity)pol;
                c.weights = (k + kpm) % 2 == 0;
                c.dead_row = true;
                c.rows = pol ? MHA_MASKED_ROWS_NAN : MHA_MASKED_ROWS_ZERO;
                check_case(&c, "mask");
                c.causal = MHA_CAUSAL_BOTTOM_RIGHT, c.strided = true;
                check_case(&c, "mask causal strided");
            }
}

TEST(flash_dropout_weights) {
    fcase c = base(2, 4, 2, 130, 140, 16, 16);
    c.dropout = 0.3f, c.weights = true;
    check_case(&c, "dropout");
    c.mask = MASK_BOOL_LS, c.causal = MHA_CAUSAL_TOP_LEFT, c.kpm = KPM_BOOL;
    check_case(&c, "dropout masked");
    c.weights = false;
    check_case(&c, "dropout no weights");
}

TEST(flash_nan_in_masked_kv_does_not_leak) {
    for (int kpm = KPM_BOOL; kpm <= KPM_FLOAT; kpm++) {
        fcase c = base(2, 2, 2, 40, 150, 8, 8);
        c.kpm = kpm, c.poison = true, c.weights = true;
        double e = check_case(&c, "poisoned masked K/V");
        CHECK(e <= TOL);
        fout got = {0};
        REQUIRE(run_case(&c, MHA_KERNEL_AUTO, 1, &got));
        bool finite = true;
        for (size_t i = 0; i < (size_t)(c.B * c.Hq * c.L * c.dv); i++)
            finite &= isfinite(got.o[i]) != 0;
        CHECK(finite);
        free(got.o), free(got.w);
    }
}

TEST(flash_nan_attended_poisons_row) {
    /* a NaN in the float mask poisons exactly the rows that attend it */
    fcase c = base(1, 2, 1, 5, 140, 4, 4);
    c.weights = true, c.mask = MASK_FLOAT_S, c.nan_mask = true;
    check_case(&c, "NaN in an attended score");
    c.causal = MHA_CAUSAL_TOP_LEFT; /* rows 0..2 never see column 3 */
    check_case(&c, "NaN behind the causal diagonal");
}

TEST(flash_large_logits) {
    /* q, k in {-1,0,1} and a power-of-two scale: scores are exact in fp32 and
     * reach +-1e4, so any overflow in exp or the sums would show */
    fcase c = base(2, 2, 2, 70, 200, 32, 32);
    c.int_qk = true, c.scale = 512.0f, c.weights = true;
    CHECK(check_case(&c, "logits 1e4") <= TOL);
    c.scale = -512.0f, c.causal = MHA_CAUSAL_TOP_LEFT;
    CHECK(check_case(&c, "logits -1e4 causal") <= TOL);
    c.scale = 1.0f / 64.0f, c.mask = MASK_FLOAT_S; /* mild logits, exact too */
    CHECK(check_case(&c, "small exact logits") <= TOL);
}

/* The row loops' ISAs: scalar, then avx2 and avx512 where they run here
 * (NULL, reported as a skipped part, where they do not). */
static void row_loop_isas(const mha_flash_isa *isas[3]) {
    isas[0] = &mha_flash_isa_scalar;
    isas[1] = mha_cpu_has_avx2_fma() ? &mha_flash_isa_avx2 : NULL;
    isas[2] = mha_avx512_runs() ? MHA_AVX512_PICK(mha_flash_isa_avx512) : NULL;
    if (!isas[1])
        SKIP_PART("AVX2 row_exp: no AVX2+FMA on this CPU");
    if (!isas[2])
        SKIP_PART("AVX-512 row_exp: no AVX-512 on this CPU");
}

/* The softmax weights of the ISA row loops (mha_flash_isa.row_exp; the
 * AVX-512 one is exp2_softmax512, which the whole-row kernel shares, the
 * scalar one mha_softmax_weight, which the scalar decode shares): e^(s - m)
 * within 1e-5 relative (+ 2e-38: the AVX2 clamp at e^-87, the AVX-512
 * flush below FLT_MIN; + 1.1e-30: the scalar flush below e^-69), and never
 * a denormal - denormal weights took microcode assists
 * on Intel, a row whose scores spread past 87 ran 5.5-20x slower
 * (docs/performance.md, "ninth visit") - -0.0 for -inf, NaN for NaN; every
 * tail length. */
TEST(flash_row_exp_normal_or_zero) {
    const mha_flash_isa *isas[3];
    row_loop_isas(isas);
    enum { N = 451 };
    const float m = 3.0f;
    float x[N], s[N];
    for (int i = 0; i < N; i++) /* m down to m - 112.5, across e^-87.3 = FLT_MIN */
        x[i] = m - 0.25f * (float)i;
    x[7] = -INFINITY;
    for (int a = 0; a < 3; a++) {
        if (!isas[a])
            continue;
        for (int n = N - 16; n <= N; n++) {
            memcpy(s, x, sizeof(float) * (size_t)n);
            const double sum = isas[a]->row_exp(s, n, m, MHA_F32);
            double want_sum = 0.0;
            int bad = 0;
            for (int i = 0; i < n; i++) {
                if (i == 7) {
                    CHECK(s[i] == 0.0f && signbit(s[i]));
                    continue;
                }
                const double e = exp((double)x[i] - m);
                want_sum += e;
                const double slack = a == 0 ? 1.1e-30 : 2e-38;
                if ((fpclassify(s[i]) == FP_SUBNORMAL || fabs(s[i] - e) > 1e-5 * e + slack) &&
                    bad++ < 3)
                    test_fail(__FILE__, __LINE__, "%s n %d: e^%g -> %g (%a), want %g",
                              isas[a]->name, n, (double)x[i] - m, (double)s[i], (double)s[i], e);
            }
            CHECK(fabs(sum - want_sum) <= 1e-5 * want_sum);
        }
        float row[20];
        for (int i = 0; i < 20; i++)
            row[i] = (float)i - 10.0f;
        row[13] = NAN;
        CHECK(isnan(isas[a]->row_exp(row, 20, m, MHA_F32)) && isnan(row[13]) && row[0] > 0.0f);
    }
}

/* row_exp with P's dtype (fp16, bf16): the values stored are exactly the
 * float32 pass's rounded by mha_round_to (what round_row after the pass
 * gave: the products see the same P), the sum is the float32 pass's bit
 * for bit (l sums the unrounded weights, as FlashAttention's); -0.0 marks
 * stay -0.0; every ISA, every tail length. */
TEST(flash_row_exp_rounds_p_in_the_pass) {
    const mha_flash_isa *isas[3];
    row_loop_isas(isas);
    enum { N = 83 };
    const float m = 1.5f;
    float x[N], want[N], got[N];
    for (int i = 0; i < N; i++) /* weights across [e^-20, 1], no two alike */
        x[i] = m - 0.2417f * (float)i;
    x[5] = x[40] = -INFINITY;
    const mha_dtype dts[2] = {MHA_F16, MHA_BF16};
    for (int a = 0; a < 3; a++)
        for (int t = 0; isas[a] && t < 2; t++)
            for (int n = N - 20; n <= N; n++) {
                memcpy(want, x, sizeof want);
                memcpy(got, x, sizeof got);
                const float sum32 = isas[a]->row_exp(want, n, m, MHA_F32);
                const float sum = isas[a]->row_exp(got, n, m, dts[t]);
                int rounded = 0;
                for (int i = 0; i < n; i++) {
                    const float r = mha_round_to(dts[t], want[i]);
                    rounded += r != want[i];
                    if (memcmp(&r, &got[i], sizeof r) != 0) {
                        test_fail(__FILE__, __LINE__, "%s %s n %d: p[%d] %a, want %a",
                                  isas[a]->name, dts[t] == MHA_F16 ? "f16" : "bf16", n, i,
                                  (double)got[i], (double)r);
                        break;
                    }
                }
                CHECK(rounded > n / 2); /* the rounding did something */
                CHECK(memcmp(&sum, &sum32, sizeof sum) == 0);
                CHECK(got[5] == 0.0f && signbit(got[5]));
                CHECK(memcmp(got + n, x + n, sizeof(float) * (size_t)(N - n)) == 0);
            }
}

TEST(flash_threads_bit_identical) {
    fcase c = base(2, 3, 1, 300, 290, 64, 40);
    c.mask = MASK_FLOAT_B1LS, c.causal = MHA_CAUSAL_BOTTOM_RIGHT, c.dropout = 0.1f;
    c.weights = true;
    mha_kernel kernels[3] = {MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2, MHA_KERNEL_AVX512};
    for (int kk = 0; kk < 3; kk++) {
        if (!test_kernel_runs(kernels[kk]))
            continue;
        fout one = {0};
        REQUIRE(run_case(&c, kernels[kk], 1, &one));
        const int counts[] = {2, 3, 7};
        for (int t = 0; t < 3; t++) {
            fout got = {0};
            REQUIRE(run_case(&c, kernels[kk], counts[t], &got));
            CHECK(memcmp(got.o, one.o, sizeof(float) * (size_t)(c.B * c.Hq * c.L * c.dv)) == 0);
            CHECK(memcmp(got.w, one.w, sizeof(float) * (size_t)(c.B * c.Hq * c.L * c.S)) == 0);
            free(got.o), free(got.w);
        }
        free(one.o), free(one.w);
    }
}

TEST(flash_fp_environment_untouched) {
    fcase c = base(1, 2, 2, 50, 60, 16, 16);
    int round0 = fegetround();
    fesetround(FE_UPWARD);
#if defined(__x86_64__) || defined(__i386__)
    unsigned csr0 = _mm_getcsr();
    _mm_setcsr(csr0 | 0x8040); /* FTZ + DAZ on: must survive the call */
    unsigned csr1 = _mm_getcsr();
#endif
    fout got = {0};
    CHECK(run_case(&c, MHA_KERNEL_AUTO, 2, &got));
    CHECK(fegetround() == FE_UPWARD);
#if defined(__x86_64__) || defined(__i386__)
    CHECK((_mm_getcsr() & ~0x3Fu) == (csr1 & ~0x3Fu)); /* all but the sticky flags */
    _mm_setcsr(csr0);
#endif
    fesetround(round0);
    free(got.o), free(got.w);
    /* and still within tolerance under a directed rounding mode */
    fesetround(FE_TOWARDZERO);
    check_case(&c, "round toward zero");
    fesetround(round0);
}

TEST(flash_kernel_names_and_best) {
    mha_kernel best = mha_kernel_resolve(MHA_KERNEL_AUTO);
    CHECK(best == MHA_KERNEL_AVX512 || best == MHA_KERNEL_AVX2 || best == MHA_KERNEL_SCALAR ||
          best == MHA_KERNEL_REF);
    CHECK(mha_peak_gflops(1, 0.01) > 0.0);
}
