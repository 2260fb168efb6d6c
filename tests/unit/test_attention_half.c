/* test_attention_half.c - mha_sdpa_forward and the backward on MHA_F16 and
 * MHA_BF16 tensors.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v.
 *
 * The oracle is the reference kernel on the same half tensors: it reads the
 * half values exactly, rounds P = exp(s - max) to v's dtype before P.V as
 * the fused kernels do, and sums in float64.  Rules (test_rel_err, max|y -
 * ref| / max(1, max|ref|)), out in float32:
 *   fused vs reference   bf16 <= 2e-3, fp16 <= 5e-4 (the bounds);
 *   half out             bit-identical to the float32 out rounded once;
 *   threads 1, 2, 3      bit-identical;
 *   vs float32 inputs    measured and printed (docs/performance.md), bounded
 *                        loosely (bf16 3e-2, fp16 4e-3) so a wrong dtype
 *                        path cannot hide.
 * P rounding is observable: the reference with v widened to float32 (no
 * rounding) must differ from the one with half v.
 */
#include "test.h"
#include "internal.h"
#include "kernels/attention_flash.h"
#include "kernels/convert.h"

typedef struct hcase {
    int64_t B, Hq, Hkv, L, S, d, dv;
    mha_causal causal;
    bool strided; /* half q, k, v as views with element step 2 */
    bool mask;    /* a float (L,S) mask with -inf holes */
    float dropout;
} hcase;

static const hcase cases[] = {
    {1, 1, 1, 1, 1, 1, 1, MHA_CAUSAL_NONE, false, false, 0.0f},
    {2, 4, 2, 7, 13, 5, 3, MHA_CAUSAL_NONE, false, false, 0.0f},
    {1, 2, 1, 130, 257, 64, 64, MHA_CAUSAL_NONE, false, false, 0.0f},
    {1, 1, 1, 97, 129, 32, 40, MHA_CAUSAL_TOP_LEFT, false, false, 0.0f},
    {2, 3, 3, 33, 1, 8, 8, MHA_CAUSAL_NONE, true, false, 0.0f},
    {1, 2, 2, 50, 70, 17, 9, MHA_CAUSAL_BOTTOM_RIGHT, true, true, 0.0f},
    {1, 2, 1, 40, 40, 16, 16, MHA_CAUSAL_NONE, false, true, 0.25f},
    {1, 1, 1, 200, 300, 128, 128, MHA_CAUSAL_NONE, false, false, 0.0f},
};

typedef struct hdata {
    float *buf[3];        /* float32 q, k, v (contiguous) */
    uint16_t *hbuf[3];    /* their half copies (maybe strided) */
    mha_tensor f[3], h[3];
    float *mask;
    mha_tensor mask_t;
} hdata;

static void hdata_free(hdata *x) {
    for (int i = 0; i < 3; i++)
        free(x->buf[i]), free(x->hbuf[i]);
    free(x->mask);
}

/* q, k, v of case c in float32 and in dtype dt (rounded once). */
static bool hdata_make(hdata *x, const hcase *c, mha_dtype dt, uint64_t seed) {
    memset(x, 0, sizeof *x);
    const int64_t shapes[3][4] = {{c->B, c->Hq, c->L, c->d}, {c->B, c->Hkv, c->S, c->d},
                                  {c->B, c->Hkv, c->S, c->dv}};
    for (int i = 0; i < 3; i++) {
        const int64_t *sh = shapes[i];
        const int64_t n = sh[0] * sh[1] * sh[2] * sh[3];
        x->buf[i] = malloc(sizeof(float) * (size_t)(n ? n : 1));
        test_randn(x->buf[i], (size_t)n, seed + (uint64_t)i);
        if (mha_tensor_init(&x->f[i], MHA_F32, x->buf[i], 4, sh) != MHA_OK)
            return false;
        const int64_t step = c->strided ? 2 : 1;
        x->hbuf[i] = calloc((size_t)(n * step + 1), sizeof(uint16_t));
        if (mha_tensor_init(&x->h[i], dt, x->hbuf[i], 4, sh) != MHA_OK)
            return false;
        for (int a = 0; a < 4; a++)
            x->h[i].stride[a] *= step;
        if (mha_tensor_convert(&x->h[i], &x->f[i]) != MHA_OK)
            return false;
    }
    if (c->mask) {
        x->mask = test_float_mask(c->L, c->S, seed + 7);
        const int64_t msh[2] = {c->L, c->S};
        mha_tensor_init(&x->mask_t, MHA_F32, x->mask, 2, msh);
    }
    return true;
}

static void opts_of(mha_sdpa_options *o, const hcase *c, const hdata *x, mha_kernel kernel) {
    mha_sdpa_options_init(o);
    o->causal = c->causal;
    o->kernel = kernel;
    if (c->mask)
        o->attn_mask = &x->mask_t;
    if (c->dropout > 0.0f)
        o->training = 1, o->dropout_p = c->dropout, o->seed = 77;
}

/* out (B,Hq,L,dv) float32 of attention over q, k, v with the kernel. */
static mha_status run(float *out, const hcase *c, const hdata *x, const mha_tensor *q,
                      const mha_tensor *k, const mha_tensor *v, mha_kernel kernel) {
    mha_tensor o;
    const int64_t sh[4] = {c->B, c->Hq, c->L, c->dv};
    MHA_TRY(mha_tensor_init(&o, MHA_F32, out, 4, sh));
    mha_sdpa_options opt;
    opts_of(&opt, c, x, kernel);
    return mha_sdpa_forward(&o, q, k, v, &opt);
}

static const char *dt_name(mha_dtype dt) { return dt == MHA_BF16 ? "bf16" : "f16"; }

TEST(attention_half_fused_matches_reference) {
    const mha_dtype dts[2] = {MHA_BF16, MHA_F16};
    const mha_kernel kernels[3] = {MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2, MHA_KERNEL_AVX512};
    for (int t = 0; t < 2; t++) {
        const mha_dtype dt = dts[t];
        const double tol = dt == MHA_BF16 ? 2e-3 : 5e-4, loose = dt == MHA_BF16 ? 3e-2 : 4e-3;
        double worst_fused = 0.0, worst_f32 = 0.0;
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
            const hcase *c = &cases[ci];
            hdata x;
            REQUIRE(hdata_make(&x, c, dt, 100 + ci));
            const size_t no = (size_t)(c->B * c->Hq * c->L * c->dv);
            float *ref = malloc(sizeof(float) * no), *y = malloc(sizeof(float) * no);
            float *f32 = malloc(sizeof(float) * no);
            uint16_t *yh = malloc(sizeof(uint16_t) * no);
            REQUIRE_OK(run(ref, c, &x, &x.h[0], &x.h[1], &x.h[2], MHA_KERNEL_REF));
            REQUIRE_OK(run(f32, c, &x, &x.f[0], &x.f[1], &x.f[2], MHA_KERNEL_REF));
            double e32 = test_rel_err(ref, f32, no);
            worst_f32 = e32 > worst_f32 ? e32 : worst_f32;
            if (!(e32 <= loose))
                test_fail(__FILE__, __LINE__, "%s case %zu: %.3g from the float32 result",
                          dt_name(dt), ci, e32);
            for (int kk = 0; kk < 3; kk++) {
                if (!test_kernel_runs(kernels[kk]))
                    continue;
                CHECK_STATUS(run(y, c, &x, &x.h[0], &x.h[1], &x.h[2], kernels[kk]), MHA_OK);
                double e = test_rel_err(y, ref, no);
                worst_fused = e > worst_fused ? e : worst_fused;
                if (!(e <= tol))
                    test_fail(__FILE__, __LINE__, "%s case %zu kernel %d: %.3g > %.1g",
                              dt_name(dt), ci, (int)kernels[kk], e, tol);
                /* half out: the float32 result rounded once */
                mha_tensor oh;
                const int64_t sh[4] = {c->B, c->Hq, c->L, c->dv};
                mha_tensor_init(&oh, dt, yh, 4, sh);
                mha_sdpa_options opt;
                opts_of(&opt, c, &x, kernels[kk]);
                CHECK_STATUS(mha_sdpa_forward(&oh, &x.h[0], &x.h[1], &x.h[2], &opt), MHA_OK);
                size_t bad = 0;
                for (size_t e2 = 0; e2 < no; e2++) {
                    uint16_t want = dt == MHA_BF16 ? mha_float_to_bf16(y[e2]) : mha_float_to_half(y[e2]);
                    bad += yh[e2] != want;
                }
                if (bad)
                    test_fail(__FILE__, __LINE__, "%s case %zu: %zu half outputs differ from "
                              "the rounded float32 out", dt_name(dt), ci, bad);
            }
            free(ref), free(y), free(f32), free(yh);
            hdata_free(&x);
        }
        printf("  %s: fused vs reference %.2e (bound %.0e); vs float32 inputs %.2e\n",
               dt_name(dt), worst_fused, tol, worst_f32);
    }
}

TEST(attention_half_p_is_rounded_to_v_dtype) {
    /* one key block (S <= 128): the fused kernels' running max is the final
     * one, so they round the same P as the reference */
    const hcase c = {1, 2, 1, 64, 120, 32, 32, MHA_CAUSAL_NONE, false, false, 0.0f};
    for (int t = 0; t < 2; t++) {
        const mha_dtype dt = t ? MHA_F16 : MHA_BF16;
        hdata x;
        REQUIRE(hdata_make(&x, &c, dt, 300));
        const size_t no = (size_t)(c.B * c.Hq * c.L * c.dv), nv = (size_t)(c.S * c.dv);
        float *a = malloc(sizeof(float) * no), *b = malloc(sizeof(float) * no);
        float *vw = malloc(sizeof(float) * nv);
        mha_tensor vwide;
        mha_tensor_init(&vwide, MHA_F32, vw, 4, x.h[2].shape);
        REQUIRE_OK(mha_tensor_convert(&vwide, &x.h[2])); /* the same values, float32 */
        REQUIRE_OK(run(a, &c, &x, &x.h[0], &x.h[1], &x.h[2], MHA_KERNEL_REF));
        REQUIRE_OK(run(b, &c, &x, &x.h[0], &x.h[1], &vwide, MHA_KERNEL_REF));
        double diff = test_rel_err(a, b, no);
        CHECK(diff > 1e-6);                            /* P was rounded ... */
        CHECK(diff < (dt == MHA_BF16 ? 4e-3 : 5e-4)); /* ... by half an ulp at most */
        float *f = malloc(sizeof(float) * no), *r = malloc(sizeof(float) * no);
        memcpy(r, a, sizeof(float) * no); /* the reference with P rounded */
        for (int kk = 0; kk < 3; kk++) {
            const mha_kernel kr = kk == 2 ? MHA_KERNEL_AVX512 : kk ? MHA_KERNEL_AVX2 : MHA_KERNEL_SCALAR;
            if (!test_kernel_runs(kr))
                continue;
            REQUIRE_OK(run(a, &c, &x, &x.h[0], &x.h[1], &vwide, kr)); /* float32 v: fp32 rule */
            CHECK(test_rel_err(a, b, no) <= 1e-5);
            /* half v: the fused kernel rounds P too (nearer the rounding
             * reference than the unrounded one) */
            REQUIRE_OK(run(f, &c, &x, &x.h[0], &x.h[1], &x.h[2], kr));
            const double near = test_rel_err(f, r, no), far = test_rel_err(f, b, no);
            if (!(near < 0.5 * far))
                test_fail(__FILE__, __LINE__, "%s kernel %d: %.3g from the rounding reference, "
                          "%.3g from the unrounded one", dt_name(dt), kk, near, far);
        }
        free(f), free(r);
        free(a), free(b), free(vw);
        hdata_free(&x);
    }
}

TEST(attention_half_mixed_dtypes_and_threads) {
    const hcase c = {2, 4, 2, 101, 150, 24, 20, MHA_CAUSAL_TOP_LEFT, false, false, 0.0f};
    hdata x, y;
    REQUIRE(hdata_make(&x, &c, MHA_BF16, 400));
    REQUIRE(hdata_make(&y, &c, MHA_F16, 400));
    const size_t no = (size_t)(c.B * c.Hq * c.L * c.dv);
    float *ref = malloc(sizeof(float) * no), *o1 = malloc(sizeof(float) * no);
    float *o2 = malloc(sizeof(float) * no);
    /* float32 q against a bf16 K and an fp16 V */
    REQUIRE_OK(run(ref, &c, &x, &x.f[0], &x.h[1], &y.h[2], MHA_KERNEL_REF));
    const mha_kernel kernels[3] = {MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2, MHA_KERNEL_AVX512};
    const int saved = mha_get_num_threads();
    for (int kk = 0; kk < 3; kk++) {
        if (!test_kernel_runs(kernels[kk]))
            continue;
        mha_set_num_threads(1);
        REQUIRE_OK(run(o1, &c, &x, &x.f[0], &x.h[1], &y.h[2], kernels[kk]));
        CHECK(test_rel_err(o1, ref, no) <= 5e-4);
        for (int th = 2; th <= 3; th++) {
            mha_set_num_threads(th);
            REQUIRE_OK(run(o2, &c, &x, &x.f[0], &x.h[1], &y.h[2], kernels[kk]));
            CHECK(memcmp(o1, o2, sizeof(float) * no) == 0);
        }
    }
    mha_set_num_threads(saved);
    free(ref), free(o1), free(o2);
    hdata_free(&x), hdata_free(&y);
}

/* The output rows of a half tensor (mha_flash_isa.narrow_row): the bits of
 * mha_store_f for every value kind - zeros, ties, subnormals, overflow to
 * inf, NaN with payloads (quiet and signalling) - and every tail length,
 * on the AVX2 loop and, where the CPU runs it, the AVX-512 one. */
TEST(attention_half_narrow_rows_match_mha_store_f) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("no AVX2+FMA+F16C on this CPU");
    enum { N = 1043 };
    float *s = malloc(sizeof(float) * N);
    uint16_t *want = malloc(sizeof(uint16_t) * N), *got = malloc(sizeof(uint16_t) * (N + 8));
    test_randn(s, N, 777);
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x3f800000u, 0x477fe000u, 0x477ff000u,
                                0x00000001u, 0x00400000u, 0x807fffffu, 0x7f800000u, 0xff800000u,
                                0x7fc00000u, 0x7f800001u, 0xffc12345u, 0x7fbfffffu, 0x3f808000u,
                                0x3f818000u, 0x7f7fffffu, 0x33c00000u, 0x34200000u, 0x387fc000u};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        memcpy(&s[i], &special[i], 4);
    for (int i = 40; i < N; i += 3)
        s[i] *= ldexpf(1.0f, i % 60 - 40); /* a spread of magnitudes */
    const mha_flash_isa *isas[2] = {&mha_flash_isa_avx2,
                                    mha_avx512_runs() ? MHA_AVX512_PICK(mha_flash_isa_avx512)
                                                      : NULL};
    if (!isas[1])
        SKIP_PART("AVX-512 narrow_row: no AVX-512 on this CPU");
    for (int t = 0; t < 2; t++) {
        const mha_dtype dt = t ? MHA_F16 : MHA_BF16;
        for (int i = 0; i < N; i++)
            mha_store_f(want, dt, i, s[i]);
        for (int a = 0; a < 2; a++) {
            if (!isas[a])
                continue;
            for (int n = N - 17; n <= N; n++) { /* every tail length */
                for (int i = 0; i < N + 8; i++)
                    got[i] = 0xabcd;
                isas[a]->narrow_row(got, s, n, dt);
                int bad = 0;
                for (int i = 0; i < n; i++)
                    if (got[i] != want[i] && bad++ < 3)
                        test_fail(__FILE__, __LINE__, "%s %s at %d of %d: %a -> 0x%04x, want 0x%04x",
                                  isas[a]->name, dt_name(dt), i, n, s[i], got[i], want[i]);
                for (int i = n; i < N + 8; i++)
                    CHECK(got[i] == 0xabcd); /* nothing past n written */
            }
        }
    }
    free(s), free(want), free(got);
}

TEST(attention_half_avx2_round_and_widen_match_scalar) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("no AVX2+FMA+F16C on this CPU");
    enum { N = 4099 };
    float *s = malloc(sizeof(float) * N), *want = malloc(sizeof(float) * N);
    uint16_t *bits = malloc(sizeof(uint16_t) * 65536);
    float *wide = malloc(sizeof(float) * 65536);
    for (int t = 0; t < 2; t++) {
        const mha_dtype dt = t ? MHA_F16 : MHA_BF16;
        test_randn(s, N, 500 + (uint64_t)t);
        const float special[] = {0.0f,     -0.0f,     1.0f,       65504.0f, 65520.0f, 1e-8f,
                                 6.0e-5f,  3.0e-38f,  INFINITY,   NAN,      1.00390625f,
                                 1.01171875f, 3.4e38f, 1.5f * 0x1p-24f, 2.5f * 0x1p-24f};
        for (size_t i = 0; i < sizeof special / sizeof *special; i++)
            s[i] = special[i];
        for (int i = 100; i < N; i += 3)
            s[i] *= (float)(i % 40) - 20.0f; /* a spread of magnitudes */
        for (int i = 0; i < N; i++)
            want[i] = mha_round_to(dt, s[i]);
        mha_flash_isa_avx2.round_row(s, N, dt);
        int bad = 0;
        for (int i = 0; i < N; i++)
            if (memcmp(&s[i], &want[i], 4) != 0 && bad++ < 3)
                test_fail(__FILE__, __LINE__, "%s at %d: %a vs %a", dt_name(dt), i, s[i],
                          want[i]);
        /* widening: every one of the 65536 half bit patterns, exactly (an
         * fp16 signalling NaN comes out quiet from F16C, with its payload
         * kept by the scalar rule, which matches NumPy: both NaN) */
        for (uint32_t i = 0; i < 65536; i++)
            bits[i] = (uint16_t)i;
        mha_flash_isa_avx2.widen_row(wide, bits, dt, 65536);
        bad = 0;
        for (uint32_t i = 0; i < 65536; i++) {
            const float x = dt == MHA_F16 ? mha_half_to_float(bits[i]) : mha_bf16_to_float(bits[i]);
            if (memcmp(&wide[i], &x, 4) != 0 && !(isnan(x) && isnan(wide[i])) && bad++ < 3)
                test_fail(__FILE__, __LINE__, "%s widen 0x%04x: %a vs %a", dt_name(dt),
                          (unsigned)i, wide[i], x);
        }
    }
    free(s), free(want), free(bits), free(wide);
}

TEST(attention_half_backward_on_float32_copies) {
    const hcase c = {1, 2, 1, 37, 45, 12, 10, MHA_CAUSAL_TOP_LEFT, false, false, 0.0f};
    hdata x;
    REQUIRE(hdata_make(&x, &c, MHA_BF16, 600));
    const int64_t so[4] = {c.B, c.Hq, c.L, c.dv};
    const size_t no = (size_t)(c.B * c.Hq * c.L * c.dv), nq = (size_t)(c.B * c.Hq * c.L * c.d);
    const size_t nk = (size_t)(c.B * c.Hkv * c.S * c.d), nv = (size_t)(c.B * c.Hkv * c.S * c.dv);
    float *dout = malloc(sizeof(float) * no);
    test_randn(dout, no, 601);
    mha_tensor dout_t;
    mha_tensor_init(&dout_t, MHA_F32, dout, 4, so);
    /* the oracle: the float32 backward on the widened half values */
    float *w[3], *g32[3], *gbf[3];
    uint16_t *gh[3];
    const size_t ns[3] = {nq, nk, nv};
    mha_tensor wt[3], g32t[3], gbft[3], ght[3];
    for (int i = 0; i < 3; i++) {
        w[i] = malloc(sizeof(float) * ns[i]);
        g32[i] = calloc(ns[i], sizeof(float));
        gbf[i] = calloc(ns[i], sizeof(float));
        gh[i] = calloc(ns[i], sizeof(uint16_t));
        mha_tensor_init(&wt[i], MHA_F32, w[i], 4, x.h[i].shape);
        REQUIRE_OK(mha_tensor_convert(&wt[i], &x.h[i]));
        mha_tensor_init(&g32t[i], MHA_F32, g32[i], 4, x.h[i].shape);
        mha_tensor_init(&gbft[i], MHA_F32, gbf[i], 4, x.h[i].shape);
        mha_tensor_init(&ght[i], MHA_BF16, gh[i], 4, x.h[i].shape);
    }
    mha_sdpa_options opt;
    opts_of(&opt, &c, &x, MHA_KERNEL_AUTO);
    REQUIRE_OK(mha_sdpa_backward(&g32t[0], &g32t[1], &g32t[2], &dout_t, NULL, NULL, &wt[0], &wt[1],
                                 &wt[2], &opt));
    /* bf16 inputs, float32 gradients: the same numbers */
    REQUIRE_OK(mha_sdpa_backward(&gbft[0], &gbft[1], &gbft[2], &dout_t, NULL, NULL, &x.h[0],
                                 &x.h[1], &x.h[2], &opt));
    for (int i = 0; i < 3; i++)
        CHECK(memcmp(gbf[i], g32[i], sizeof(float) * ns[i]) == 0);
    /* bf16 gradients: added, then rounded once (twice: 2 g, exact in bf16
     * up to one rounding of g) */
    REQUIRE_OK(mha_sdpa_backward(&ght[0], &ght[1], &ght[2], &dout_t, NULL, NULL, &x.h[0], &x.h[1],
                                 &x.h[2], &opt));
    for (int i = 0; i < 3; i++) {
        size_t bad = 0;
        for (size_t e = 0; e < ns[i]; e++)
            bad += gh[i][e] != mha_float_to_bf16(g32[i][e]);
        CHECK(bad == 0);
    }
    for (int i = 0; i < 3; i++)
        free(w[i]), free(g32[i]), free(gbf[i]), free(gh[i]);
    free(dout);
    hdata_free(&x);
}

TEST(attention_half_bad_dtypes) {
    float f[4] = {0};
    int64_t one[4] = {1, 1, 1, 1};
    mha_tensor q, k, v, o;
    mha_tensor_init(&q, MHA_F32, f, 4, one);
    mha_tensor_init(&k, MHA_F32, f + 1, 4, one);
    mha_tensor_init(&v, MHA_F32, f + 2, 4, one);
    mha_tensor_init(&o, MHA_F32, f + 3, 4, one);
    k.dtype = MHA_I64;
    CHECK_STATUS(mha_sdpa_forward(&o, &q, &k, &v, NULL), MHA_ERR_DTYPE);
    CHECK_ERROR_MENTIONS("float32, float16 or bfloat16");
    k.dtype = MHA_F32, o.dtype = MHA_BOOL;
    CHECK_STATUS(mha_sdpa_forward(&o, &q, &k, &v, NULL), MHA_ERR_DTYPE);
    /* conversion: shape mismatch and overlap refused */
    uint16_t h[4];
    mha_tensor a, b;
    int64_t s2[1] = {2}, s3[1] = {3};
    mha_tensor_init(&a, MHA_F32, f, 1, s2);
    mha_tensor_init(&b, MHA_BF16, h, 1, s3);
    CHECK_STATUS(mha_tensor_convert(&b, &a), MHA_ERR_SHAPE);
    mha_tensor_init(&b, MHA_BF16, (uint16_t *)f, 1, s2);
    CHECK_STATUS(mha_tensor_convert(&b, &a), MHA_ERR_ALIAS);
    mha_tensor_init(&b, MHA_I64, h, 1, s2);
    CHECK_STATUS(mha_tensor_convert(&b, &a), MHA_ERR_DTYPE);
}
