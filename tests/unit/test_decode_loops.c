/* test_decode_loops.c - the SIMD loops of the decode step
 * (src/kernels/attention_decode_avx2.c, attention_decode_avx512.c), each
 * where it runs (avx512 also emulated: main.c sets MHA_TEST_AVX512=emulate
 * where the CPU lacks AVX-512), and the avx512 step as a whole.
 *
 * Letter legend: G query heads per kv head, n keys of one split, d head dim
 * of q/k, dv of v; B, Hq, Hkv, T tokens appended, W window (0 = none).
 *
 * Each loop against its reference, on the shapes that reach every tile and
 * tail (d = 1, 15, 16, 17, 40, 128, 300, 520 - a bf16 cache's q split in
 * 16- (avx2) or 32-element (avx512) pairs up to 512; dv = 1, 15, 16, 33,
 * 100, 128, 200; G = 1..9, 16; n = 1, 15, 17, 255, 256 keys of a split):
 *   qk       vs a float64 dot product, |err| <= 1e-6 sum |q k|;
 *   pv       within 1e-6 of the float64 sum |p v|; a half V bit-identical
 *            to a float32 V holding the same values (the bf16 pair tiles
 *            keep each element's FMA chain over keys); avx512 bit-identical
 *            to the AVX2 loop where dv is a multiple of 8 (the same fma
 *            order over keys; AVX2's scalar tail columns use a separate
 *            multiply and add);
 *   exp_sum  every exp within 2 float ulp of exp() and the sum within
 *            1e-6, and exp(-inf) exactly 0, NaN kept;
 *   round_p  bit-identical to mha_round_to (ties, subnormals, inf, NaN),
 *            at every tail length.
 * Then the whole decode step on the avx512 kernel against the reference
 * kernel for fp32, fp16 and bf16 caches (lengths 1, 255, 257, 1000, a
 * sliding window wrapped, G = 1 and 4), bit-identical for 1, 2 and 3
 * threads (the avx2 step: test_decode.c, test_decode_half.c).  Tolerances
 * were measured (worst seen printed) and bounded with a margin; a loop with
 * a wrong index or tail is off by far more.
 */
#include "test.h"
#include "internal.h"
#include "kernels/attention_decode.h"
#include "kernels/convert.h"

/* The table of kernel k, or NULL (skipped) where it does not run. */
static const mha_decode_isa *simd_isa(mha_kernel k) {
    const mha_decode_isa *isa = NULL;
    if (mha_decode_isa_for(k, &isa) != MHA_OK)
        return NULL;
    return isa;
}
static const mha_decode_isa *avx512_isa(void) { return simd_isa(MHA_KERNEL_AVX512); }

static const mha_dtype DTYPES[3] = {MHA_F32, MHA_F16, MHA_BF16};

/* n values of dtype dt from x (rounded for a half type): a K or V block. */
static void *to_dtype(const float *x, int64_t n, mha_dtype dt) {
    void *p = malloc((size_t)n * (dt == MHA_F32 ? 4 : 2) + 1);
    if (p)
        for (int64_t i = 0; i < n; i++)
            mha_store_f(p, dt, i, x[i]);
    return p;
}

/* isa->qk against a float64 dot product on every shape and dtype. */
static void check_qk(const mha_decode_isa *isa, const char *name) {
    static const int64_t ds[] = {1, 15, 16, 17, 40, 128, 300, 520},
                         Gs[] = {1, 2, 3, 4, 5, 8, 9, 16};
    static const int64_t ns[] = {1, 15, 17, 255, 256};
    double worst = 0.0;
    for (size_t di = 0; di < sizeof ds / sizeof *ds; di++)
        for (size_t gi = 0; gi < sizeof Gs / sizeof *Gs; gi++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
                for (int t = 0; t < 3; t++) {
                    const int64_t d = ds[di], G = Gs[gi], n = ns[ni];
                    float *q = malloc(sizeof(float) * (size_t)(G * d + n * d + G * n + 1));
                    REQUIRE(q);
                    float *k = q + G * d, *s = k + n * d;
                    test_randn(q, (size_t)(G * d), 100 + di * 10 + gi);
                    test_randn(k, (size_t)(n * d), 200 + ni);
                    void *kh = to_dtype(k, n * d, DTYPES[t]);
                    REQUIRE(kh);
                    s[G * n] = 42.0f; /* guard: nothing written past s */
                    /* asking for rows ahead (here the keys' own) changes no value */
                    const mha_decode_ahead ahead = {kh, n, (size_t)d * mha_dtype_size(DTYPES[t])};
                    isa->qk(s, q, kh, DTYPES[t], n, G, d, &ahead);
                    CHECK(s[G * n] == 42.0f);
                    for (int64_t g = 0; g < G; g++)
                        for (int64_t j = 0; j < n; j++) {
                            double dot = 0.0, mag = 0.0;
                            for (int64_t x = 0; x < d; x++) {
                                const double a = q[g * d + x] * (double)mha_load_f(kh, DTYPES[t], j * d + x);
                                dot += a, mag += fabs(a);
                            }
                            const double e = fabs(s[g * n + j] - dot) / (mag > 0 ? mag : 1.0);
                            worst = e > worst || isnan(e) ? (isnan(e) ? INFINITY : e) : worst;
                        }
                    free(kh), free(q);
                }
    printf("  decode %s qk: worst |s - f64 dot| / sum |q k| %.2g\n", name, worst);
    CHECK(worst <= 1e-6);
}

TEST(decode_avx2_qk_matches_f64_dot) {
    const mha_decode_isa *isa = simd_isa(MHA_KERNEL_AVX2);
    if (!isa)
        SKIP("avx2 decode loops: %s", mha_last_error());
    check_qk(isa, "avx2");
}

TEST(decode_avx512_qk_matches_f64_dot) {
    const mha_decode_isa *isa = avx512_isa();
    if (!isa)
        SKIP("avx512 decode loops: %s", mha_last_error());
    check_qk(isa, "avx512");
}

/* isa->pv within 1e-6 of float64 on every shape and dtype; a half V's
 * result bit-identical to that of a float32 V of the same values; with
 * avx2 (the avx512 table's twin, NULL: none) bit-identical to avx2's where
 * dv is a multiple of 8. */
static void check_pv(const mha_decode_isa *isa, const char *name, const mha_decode_isa *avx2) {
    static const int64_t dvs[] = {1, 15, 16, 33, 100, 128, 200}, Gs[] = {1, 2, 3, 4, 5, 8, 9, 16};
    static const int64_t ns[] = {1, 15, 17, 255, 256};
    double worst = 0.0;
    bool same = true, same_f32 = true;
    for (size_t di = 0; di < sizeof dvs / sizeof *dvs; di++)
        for (size_t gi = 0; gi < sizeof Gs / sizeof *Gs; gi++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
                for (int t = 0; t < 3; t++) {
                    const int64_t dv = dvs[di], G = Gs[gi], n = ns[ni];
                    float *p = malloc(sizeof(float) * (size_t)(G * n + 2 * n * dv + 3 * G * dv + 2));
                    REQUIRE(p);
                    float *v = p + G * n, *vf = v + n * dv, *a = vf + n * dv, *b = a + G * dv + 1,
                          *c = b + G * dv;
                    test_randn(p, (size_t)(G * n), 300 + di * 10 + gi);
                    for (int64_t i = 0; i < G * n; i++)
                        p[i] = fabsf(p[i]);
                    test_randn(v, (size_t)(n * dv), 400 + ni);
                    test_randn(a, (size_t)(G * dv), 500); /* acc accumulates onto what is there */
                    memcpy(b, a, sizeof(float) * (size_t)(G * dv));
                    memcpy(c, a, sizeof(float) * (size_t)(G * dv));
                    a[G * dv] = 42.0f;
                    void *vh = to_dtype(v, n * dv, DTYPES[t]);
                    REQUIRE(vh);
                    for (int64_t i = 0; i < n * dv; i++) /* the values vh holds, as float32 */
                        vf[i] = mha_load_f(vh, DTYPES[t], i);
                    /* rows ahead, fewer than the keys (the clamp) */
                    const mha_decode_ahead ahead = {vh, n / 2, (size_t)dv * mha_dtype_size(DTYPES[t])};
                    isa->pv(a, p, vh, DTYPES[t], n, G, dv, &ahead);
                    CHECK(a[G * dv] == 42.0f);
                    for (int64_t g = 0; g < G; g++)
                        for (int64_t x = 0; x < dv; x++) {
                            double acc = b[g * dv + x], mag = fabs(acc);
                            for (int64_t j = 0; j < n; j++) {
                                const double y = p[g * n + j] * (double)vf[j * dv + x];
                                acc += y, mag += fabs(y);
                            }
                            const double e = fabs(a[g * dv + x] - acc) / (mag > 0 ? mag : 1.0);
                            worst = e > worst || isnan(e) ? (isnan(e) ? INFINITY : e) : worst;
                        }
                    if (DTYPES[t] != MHA_F32) {
                        const mha_decode_ahead none = {0};
                        isa->pv(c, p, vf, MHA_F32, n, G, dv, &none);
                        same_f32 = same_f32 && !memcmp(a, c, sizeof(float) * (size_t)(G * dv));
                    }
                    if (avx2 && dv % 8 == 0) { /* avx2's scalar column tail: mul + add */
                        avx2->pv(b, p, vh, DTYPES[t], n, G, dv, &ahead);
                        same = same && !memcmp(a, b, sizeof(float) * (size_t)(G * dv));
                    }
                    free(vh), free(p);
                }
    printf("  decode %s pv: worst |acc - f64| / sum |p v| %.2g, half V %s float32 V%s\n", name,
           worst, same_f32 ? "bit-identical to" : "DIFFERS from",
           avx2 ? (same ? ", bit-identical to avx2 (dv % 8 == 0)" : ", DIFFERS from avx2") : "");
    CHECK(worst <= 1e-6);
    CHECK(same_f32);
    CHECK(same);
}

TEST(decode_avx2_pv_matches_f64_and_float32_v) {
    const mha_decode_isa *isa = simd_isa(MHA_KERNEL_AVX2);
    if (!isa)
        SKIP("avx2 decode loops: %s", mha_last_error());
    check_pv(isa, "avx2", NULL);
}

TEST(decode_avx512_pv_matches_avx2_bitwise) {
    const mha_decode_isa *isa = avx512_isa();
    if (!isa)
        SKIP("avx512 decode loops: %s", mha_last_error());
    const mha_decode_isa *avx2 = simd_isa(MHA_KERNEL_AVX2);
    if (!avx2)
        SKIP_PART("pv bit-identical to avx2: no AVX2+FMA; checked against float64 only");
    check_pv(isa, "avx512", avx2);
}

/* distance in float ulps between a and b (finite, same sign) */
static double ulps(float a, double b) {
    const float fb = (float)b;
    if (a == fb)
        return 0.0;
    return fabs((double)a - b) / (nextafterf(fabsf(fb), INFINITY) - fabsf(fb));
}

TEST(decode_avx512_exp_sum_matches_expf) {
    const mha_decode_isa *isa = avx512_isa();
    if (!isa)
        SKIP("avx512 decode loops: %s", mha_last_error());
    enum { N = 259 };
    float s[N + 1], x[N];
    double worst = 0.0, worst_sum = 0.0;
    for (int64_t n = 1; n <= N; n += n < 40 ? 1 : 37) {
        test_randn(x, N, (uint64_t)n);
        for (int64_t j = 0; j < n; j++)
            x[j] *= 20.0f; /* down to e^-100: exp512's underflow to 0 */
        float m = -INFINITY;
        for (int64_t j = 0; j < n; j++)
            m = x[j] > m ? x[j] : m;
        if (n > 3)
            x[n / 2] = -INFINITY; /* a -inf score: exp exactly 0 */
        memcpy(s, x, sizeof(float) * (size_t)n);
        s[n] = 42.0f;
        const float l = isa->exp_sum(s, n, m);
        CHECK(s[n] == 42.0f);
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) {
            const double e = exp((double)(x[j] - m)); /* the float difference, as the loop takes */
            sum += (float)e;
            if (e < 1e-37) /* below exp512's range: 0 */
                CHECK(s[j] == 0.0f || fabs(s[j] - e) < 1e-38);
            else {
                const double u = ulps(s[j], e);
                worst = u > worst ? u : worst;
            }
        }
        const double es = fabs(l - sum) / sum;
        worst_sum = es > worst_sum ? es : worst_sum;
    }
    printf("  decode avx512 exp_sum: worst exp %.2g ulp, sum rel err %.2g\n", worst, worst_sum);
    CHECK(worst <= 2.0 && worst_sum <= 1e-6);
    /* a NaN max (a NaN score in the row) propagates to every term */
    float t[3] = {0.0f, -1.0f, 2.0f};
    CHECK(isnan(isa->exp_sum(t, 3, NAN)) && isnan(t[0]) && isnan(t[2]));
}

/* isa->round_p equals mha_round_to bit for bit (normals, subnormals, ties,
 * 0, 1, inf, NaN payloads), at every tail length, so a kernel choice
 * changes only the accumulation order. */
static void check_round_p(const mha_decode_isa *isa) {
    enum { N = 4099 };
    float *x = malloc(sizeof(float) * N * 3);
    REQUIRE(x);
    float *a = x + N, *b = a + N;
    test_rounding_inputs(x, N);
    const mha_dtype dts[2] = {MHA_BF16, MHA_F16};
    for (int i = 0; i < 2; i++)
        for (int64_t n = N - 17; n <= N; n++) {
            memcpy(a, x, sizeof(float) * N), memcpy(b, x, sizeof(float) * N);
            mha_decode_isa_scalar.round_p(a, n, dts[i]);
            isa->round_p(b, n, dts[i]);
            if (memcmp(a, b, sizeof(float) * N)) {
                test_fail(__FILE__, __LINE__, "%s round_p differs at n = %lld",
                          dts[i] == MHA_F16 ? "fp16" : "bf16", (long long)n);
                break;
            }
        }
    free(x);
}

TEST(decode_avx2_round_p_matches_scalar) {
    const mha_decode_isa *isa = simd_isa(MHA_KERNEL_AVX2);
    if (!isa)
        SKIP("avx2 decode loops: %s", mha_last_error());
    check_round_p(isa);
}

TEST(decode_avx512_round_p_matches_scalar) {
    const mha_decode_isa *isa = avx512_isa();
    if (!isa)
        SKIP("avx512 decode loops: %s", mha_last_error());
    check_round_p(isa);
}

typedef struct step_case {
    int64_t B, Hq, Hkv, d, dv, T, W;
} step_case;

/* The whole step, avx512 vs the reference kernel (out and LSE), and
 * bit-identical across 1, 2 and 3 threads.  tol: normalised out error. */
static double step_err(const step_case *c, mha_dtype dt, double *lse_err) {
    const int64_t nk = c->B * c->Hkv * c->T * c->d, nv = c->B * c->Hkv * c->T * c->dv;
    const int64_t nq = c->B * c->Hq * c->d, no = c->B * c->Hq * c->dv, nl = c->B * c->Hq;
    float *k = malloc(sizeof(float) * (size_t)(nk + nv + nq + 4 * no + 4 * nl));
    if (!k)
        return INFINITY;
    float *v = k + nk, *q = v + nv, *ref = q + nq, *o1 = ref + no, *o2 = o1 + no, *o3 = o2 + no;
    float *lref = o3 + no, *l1 = lref + nl, *l2 = l1 + nl, *l3 = l2 + nl;
    test_randn(k, (size_t)nk, 61), test_randn(v, (size_t)nv, 62), test_randn(q, (size_t)nq, 63);
    for (int64_t i = 0; i < nk; i++)
        k[i] *= 2.0f; /* a sharper softmax */
    double err = INFINITY;
    mha_kv_cache *kv = NULL;
    if (mha_kv_cache_create(&kv, dt, c->B, c->Hkv, c->W ? c->W : c->T, c->d, c->dv, c->W) != MHA_OK)
        goto done;
    for (int64_t t0 = 0; t0 < c->T;) { /* 3 tokens, then the rest: a ring wraps mid-append */
        const int64_t n = t0 == 0 && c->T > 3 ? 3 : c->T - t0;
        mha_tensor K = test_view4(k, c->B, c->Hkv, c->T, c->d), V = test_view4(v, c->B, c->Hkv, c->T, c->dv);
        K.data = k + t0 * c->d, K.shape[2] = n;
        V.data = v + t0 * c->dv, V.shape[2] = n;
        if (mha_kv_cache_append(kv, &K, &V) != MHA_OK)
            goto done;
        t0 += n;
    }
    mha_tensor Q = test_view4(q, c->B, c->Hq, 1, c->d);
    const mha_kernel kernels[4] = {MHA_KERNEL_REF, MHA_KERNEL_AVX512, MHA_KERNEL_AVX512,
                                   MHA_KERNEL_AVX512};
    float *outs[4] = {ref, o1, o2, o3}, *lses[4] = {lref, l1, l2, l3};
    const int before = mha_get_num_threads();
    for (int i = 0; i < 4; i++) {
        mha_tensor O = test_view4(outs[i], c->B, c->Hq, 1, c->dv), L;
        mha_tensor_init(&L, MHA_F32, lses[i], 3, (int64_t[]){c->B, c->Hq, 1});
        mha_sdpa_options o;
        mha_sdpa_options_init(&o);
        o.kernel = kernels[i], o.lse = &L;
        mha_set_num_threads(i ? i : 1);
        const mha_status st = mha_attention_decode(&O, &Q, kv, &o);
        mha_set_num_threads(before);
        if (st != MHA_OK)
            goto done;
    }
    if (memcmp(o1, o2, sizeof(float) * (size_t)no) || memcmp(o1, o3, sizeof(float) * (size_t)no) ||
        memcmp(l1, l2, sizeof(float) * (size_t)nl) || memcmp(l1, l3, sizeof(float) * (size_t)nl))
        goto done; /* thread counts differ: infinite error */
    double md = 0.0, mr = 0.0;
    for (int64_t i = 0; i < no; i++) {
        const double dd = fabs((double)o1[i] - ref[i]);
        md = dd > md || isnan(dd) ? (isnan(dd) ? INFINITY : dd) : md;
        mr = fabs((double)ref[i]) > mr ? fabs((double)ref[i]) : mr;
    }
    err = md / (mr > 0 ? mr : 1.0);
    *lse_err = test_max_diff(l1, lref, nl);
done:
    mha_kv_cache_free(kv);
    free(k);
    return err;
}

TEST(decode_avx512_step_matches_reference_all_dtypes) {
    if (!avx512_isa())
        SKIP("avx512 decode: %s", mha_last_error());
    /* d = 1, 17, 128; dv = 1, 33, 128; G = 1, 4 (and 3, 9 for head-block
     * tails); lengths 1, 255, 257, 1000 (not multiples of the 256-key
     * split); a window of 300 wrapped over 1000 tokens. */
    static const step_case cases[] = {
        {1, 1, 1, 1, 1, 1, 0},       {2, 4, 1, 17, 33, 255, 0},  {1, 8, 2, 128, 128, 257, 0},
        {1, 2, 2, 17, 33, 1000, 0},  {1, 4, 1, 128, 33, 1000, 300}, {1, 9, 1, 16, 9, 257, 0},
        {2, 6, 2, 40, 128, 1000, 0}, {1, 1, 1, 128, 128, 257, 100},
    };
    /* measured worst: fp32 1e-6, fp16 2.5e-4, bf16 1.4e-3 (P rounded per split
     * here, per row in the reference kernel); bounds as test_decode_half.c */
    const double tol[3] = {1e-5, 5e-4, 2e-3};
    const char *names[3] = {"fp32", "fp16", "bf16"};
    for (int t = 0; t < 3; t++) {
        double worst = 0.0, worst_lse = 0.0;
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
            double el = INFINITY;
            const double e = step_err(&cases[ci], DTYPES[t], &el);
            if (!(e <= tol[t] && el <= 1e-5))
                test_fail(__FILE__, __LINE__,
                          "%s case %zu (B %lld Hq %lld Hkv %lld d %lld dv %lld T %lld W %lld): "
                          "err %.3g, lse diff %.3g",
                          names[t], ci, (long long)cases[ci].B, (long long)cases[ci].Hq,
                          (long long)cases[ci].Hkv, (long long)cases[ci].d, (long long)cases[ci].dv,
                          (long long)cases[ci].T, (long long)cases[ci].W, e, el);
            worst = e > worst ? e : worst, worst_lse = el > worst_lse ? el : worst_lse;
        }
        printf("  decode avx512 %s cache vs ref kernel: worst out err %.2g (tol %.0e), lse %.2g\n",
               names[t], worst, tol[t], worst_lse);
    }
}
