/* test_decode_half.c - half-precision KV caches (MHA_BF16, MHA_F16) and the
 * decode step that reads them.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, G = Hq/Hkv, d head
 * dim of q/k, dv of v, T tokens appended, W window (0 = none), len keys held.
 *
 * The oracle (decode_f64 below) is written here, in float64: its K/V are the
 * half values themselves (what append stores), and it rounds P exactly where
 * the decode step does: per split of MHA_DECODE_SPLIT_KEYS slots, P =
 * exp(s - m_split) rounded to the cache dtype for P.V, l summed from the
 * unrounded P, splits merged by log-sum-exp.  Tolerances (normalised: max
 * |out - ref| / max |ref|) are measured, not guessed: the worst seen over
 * these cases was 2e-6 (bf16) and 2.3e-5 (fp16, one P near 1 rounding the
 * other way: the float32 and float64 scores straddle a rounding boundary,
 * an error of up to one ulp of P times |v| / l); we assert the issue's
 * bounds, 2e-3 (bf16) and 5e-4 (fp16).  Those bounds alone would pass an
 * unrounded P too, so the sum of the errors over the cases must also be
 * under a tenth of the errors against the unrounded-P oracle.  The error
 * against the fp32 cache (the price of storing K/V in half) is printed.
 */
#include "test.h"
#include "internal.h"
#include "kernels/attention_decode.h"
#include "kernels/convert.h"

typedef struct half_case {
    int64_t B, Hq, Hkv, d, dv, T, W;
} half_case;

/* Odd shapes: d = 1, d and dv not multiples of 8, G = 1, 3, 4, 6, 9, 16,
 * Hkv = 1, lengths 1, 7, 129, 1000+, a ring of W slots, several splits;
 * two blocks of 8 heads (G = 16), d = 96 over 1-3 threads. */
static const half_case CASES[] = {
    {1, 1, 1, 1, 1, 1, 0},        {2, 3, 1, 13, 7, 7, 0},     {1, 8, 2, 128, 128, 129, 0},
    {1, 4, 4, 24, 24, 1000, 0},   {2, 6, 2, 40, 33, 1100, 300}, {1, 12, 2, 64, 64, 1300, 0},
    {1, 18, 2, 16, 9, 513, 0},    {1, 2, 1, 9, 17, 777, 260},  {1, 32, 2, 32, 64, 300, 0},
    {2, 3, 1, 96, 96, 517, 0},
};

static int64_t held(const half_case *c) { return c->W && c->T > c->W ? c->W : c->T; }

/* Position held by slot s once T tokens went in (ring of W slots). */
static int64_t slot_pos(const half_case *c, int64_t s) {
    if (!c->W)
        return s;
    const int64_t len = held(c), base = c->T - len;
    return base + ((s - base % c->W) % c->W + c->W) % c->W;
}

/* out (B,Hq,dv), lse (B,Hq): the float64 decode over the cache's values
 * kh (B,Hkv,T,d), vh (B,Hkv,T,dv) (already rounded to dt), q (B,Hq,d);
 * round_p: P rounded to dt per split as the decode step does. */
static void decode_f64(float *out, float *lse, const half_case *c, const float *q,
                       const float *kh, const float *vh, mha_dtype dt, int round_p) {
    const int64_t len = held(c), G = c->Hq / c->Hkv, C = MHA_DECODE_SPLIT_KEYS;
    const double scale = 1.0 / sqrt((double)c->d);
    double *s = malloc(sizeof(double) * (size_t)len), *acc = malloc(sizeof(double) * (size_t)c->dv);
    double *num = malloc(sizeof(double) * (size_t)c->dv);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++) {
            const int64_t bh = b * c->Hkv + h / G;
            for (int64_t j = 0; j < len; j++) {
                const float *kr = kh + (bh * c->T + slot_pos(c, j)) * c->d;
                double dot = 0.0;
                for (int64_t x = 0; x < c->d; x++)
                    dot += (double)q[(b * c->Hq + h) * c->d + x] * scale * kr[x];
                s[j] = dot;
            }
            double M = -INFINITY, l = 0.0;
            for (int64_t j = 0; j < len; j++)
                M = s[j] > M ? s[j] : M;
            for (int64_t x = 0; x < c->dv; x++)
                num[x] = 0.0;
            for (int64_t j0 = 0; j0 < len; j0 += C) {
                const int64_t j1 = j0 + C < len ? j0 + C : len;
                double m = -INFINITY, lc = 0.0;
                for (int64_t j = j0; j < j1; j++)
                    m = s[j] > m ? s[j] : m;
                for (int64_t x = 0; x < c->dv; x++)
                    acc[x] = 0.0;
                for (int64_t j = j0; j < j1; j++) {
                    const double p = exp(s[j] - m);
                    const double pr = round_p ? (double)mha_round_to(dt, (float)p) : p;
                    const float *vr = vh + (bh * c->T + slot_pos(c, j)) * c->dv;
                    lc += p;
                    for (int64_t x = 0; x < c->dv; x++)
                        acc[x] += pr * vr[x];
                }
                l += lc * exp(m - M);
                for (int64_t x = 0; x < c->dv; x++)
                    num[x] += acc[x] * exp(m - M);
            }
            for (int64_t x = 0; x < c->dv; x++)
                out[(b * c->Hq + h) * c->dv + x] = (float)(num[x] / l);
            lse[b * c->Hq + h] = (float)(M + log(l));
        }
    free(s), free(acc), free(num);
}

/* max |y - ref| / max |ref| over n */
static double norm_err(const float *y, const float *ref, int64_t n) {
    double md = 0.0, mr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double dd = fabs((double)y[i] - ref[i]);
        if (!(dd <= md)) /* NaN counts as worst */
            md = isnan(dd) ? INFINITY : dd;
        mr = fabs((double)ref[i]) > mr ? fabs((double)ref[i]) : mr;
    }
    return md / (mr > 0.0 ? mr : 1.0);
}

/* A cache of dtype dt holding the case's T tokens (appended in chunks of 7
 * then the rest, so a ring wraps mid-append); k (B,Hkv,T,d), v (B,Hkv,T,dv). */
static mha_kv_cache *fill_cache(const half_case *c, mha_dtype dt, const float *k, const float *v) {
    mha_kv_cache *kv = NULL;
    if (mha_kv_cache_create(&kv, dt, c->B, c->Hkv, c->W ? c->W : c->T, c->d, c->dv, c->W) != MHA_OK)
        return NULL;
    for (int64_t t0 = 0; t0 < c->T;) {
        const int64_t n = t0 == 0 && c->T > 7 ? 7 : c->T - t0;
        mha_tensor K = test_view4((float *)k, c->B, c->Hkv, c->T, c->d);
        mha_tensor V = test_view4((float *)v, c->B, c->Hkv, c->T, c->dv);
        K.data = (float *)k + t0 * c->d, K.shape[2] = n;
        V.data = (float *)v + t0 * c->dv, V.shape[2] = n;
        if (mha_kv_cache_append(kv, &K, &V) != MHA_OK) {
            mha_kv_cache_free(kv);
            return NULL;
        }
        t0 += n;
    }
    return kv;
}

static mha_status decode_with(float *out, float *lse, const half_case *c, float *q,
                              const mha_kv_cache *kv, mha_kernel kernel, int threads) {
    mha_tensor Q = test_view4(q, c->B, c->Hq, 1, c->d), O = test_view4(out, c->B, c->Hq, 1, c->dv);
    mha_tensor L;
    mha_tensor_init(&L, MHA_F32, lse, 3, (int64_t[]){c->B, c->Hq, 1});
    mha_sdpa_options o;
    mha_sdpa_options_init(&o);
    o.kernel = kernel, o.lse = &L;
    const int before = mha_get_num_threads();
    mha_set_num_threads(threads);
    mha_status st = mha_attention_decode(&O, &Q, kv, &o);
    mha_set_num_threads(before);
    return st;
}

static void check_dtype(mha_dtype dt, double tol) {
    const char *name = dt == MHA_BF16 ? "bf16" : "fp16";
    double worst[3] = {0, 0, 0}, worst_fp32 = 0.0, worst_ref = 0.0;
    double sum_err[3] = {0, 0, 0}, sum_raw[3] = {0, 0, 0}; /* vs the P-rounded / unrounded oracle */
    for (size_t ci = 0; ci < sizeof CASES / sizeof *CASES; ci++) {
        const half_case *c = &CASES[ci];
        const int64_t nk = c->B * c->Hkv * c->T * c->d, nv = c->B * c->Hkv * c->T * c->dv;
        const int64_t nq = c->B * c->Hq * c->d, no = c->B * c->Hq * c->dv, nl = c->B * c->Hq;
        float *k = malloc(sizeof(float) * (size_t)(2 * (nk + nv) + nq + 6 * no + 6 * nl));
        REQUIRE(k);
        float *v = k + nk, *kh = v + nv, *vh = kh + nk, *q = vh + nv, *ref = q + nq;
        float *ref_raw = ref + no, *o32 = ref_raw + no, *o1 = o32 + no, *o2 = o1 + no,
              *o3 = o2 + no, *lref = o3 + no, *lraw = lref + nl, *l32 = lraw + nl, *l1 = l32 + nl,
              *l2 = l1 + nl, *l3 = l2 + nl;
        test_randn(k, (size_t)nk, 700 + ci), test_randn(v, (size_t)nv, 800 + ci);
        test_randn(q, (size_t)nq, 900 + ci);
        for (int64_t i = 0; i < nk; i++)
            k[i] *= 2.0f, kh[i] = mha_round_to(dt, k[i]); /* sharper softmax */
        for (int64_t i = 0; i < nv; i++)
            vh[i] = mha_round_to(dt, v[i]);
        decode_f64(ref, lref, c, q, kh, vh, dt, 1);
        decode_f64(ref_raw, lraw, c, q, kh, vh, dt, 0);
        mha_kv_cache *kv = fill_cache(c, dt, k, v), *kv32 = fill_cache(c, MHA_F32, k, v);
        REQUIRE(kv && kv32);
        /* append stored the rounded values, at the storage size */
        const void *sk, *sv;
        size_t bk, bv;
        mha_kv_cache_storage(kv, &sk, &bk, &sv, &bv);
        CHECK(bk == (size_t)(c->B * c->Hkv * (c->W ? c->W : c->T) * c->d) * 2);
        CHECK(mha_load_f(sk, dt, 0) == kh[slot_pos(c, 0) * c->d]); /* slot 0 of (0,0) */
        REQUIRE_OK(decode_with(o32, l32, c, q, kv32, MHA_KERNEL_SCALAR, 1));
        const double e32 = norm_err(o32, ref_raw, no);
        worst_fp32 = e32 > worst_fp32 ? e32 : worst_fp32;
        /* the reference kernel: the half values in float64, P rounded to
         * the dtype relative to the row's max (the oracle rounds per split:
         * the two round slightly different numbers); the LSE is unaffected */
        REQUIRE_OK(decode_with(o1, l1, c, q, kv, MHA_KERNEL_REF, 1));
        const double er = norm_err(o1, ref, no);
        worst_ref = er > worst_ref ? er : worst_ref;
        CHECK(er <= tol && test_max_diff(l1, lraw, nl) < 1e-5);
        const mha_kernel kernels[3] = {MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2, MHA_KERNEL_AVX512};
        for (int ki = 0; ki < 3; ki++) {
            if (!test_kernel_runs(kernels[ki]))
                continue;
            REQUIRE_OK(decode_with(o1, l1, c, q, kv, kernels[ki], 1));
            REQUIRE_OK(decode_with(o2, l2, c, q, kv, kernels[ki], 2));
            REQUIRE_OK(decode_with(o3, l3, c, q, kv, kernels[ki], 3));
            CHECK(!memcmp(o1, o2, sizeof(float) * (size_t)no) &&
                  !memcmp(o1, o3, sizeof(float) * (size_t)no));
            CHECK(!memcmp(l1, l2, sizeof(float) * (size_t)nl) &&
                  !memcmp(l1, l3, sizeof(float) * (size_t)nl));
            const double e = norm_err(o1, ref, no);
            sum_err[ki] += e, sum_raw[ki] += norm_err(o1, ref_raw, no);
            worst[ki] = e > worst[ki] ? e : worst[ki];
            if (!(e <= tol && test_max_diff(l1, lref, nl) < 1e-5))
                test_fail(__FILE__, __LINE__,
                          "%s %s case %zu (B %lld Hq %lld Hkv %lld d %lld dv %lld T %lld W %lld): "
                          "err %.3g, lse diff %.3g",
                          name, mha_kernel_name(kernels[ki]), ci, (long long)c->B,
                          (long long)c->Hq, (long long)c->Hkv, (long long)c->d, (long long)c->dv,
                          (long long)c->T, (long long)c->W, e, test_max_diff(l1, lref, nl));
        }
        mha_kv_cache_free(kv), mha_kv_cache_free(kv32);
        free(k);
    }
    /* P really is rounded: the fast paths sit far closer to the P-rounded
     * oracle than to the unrounded one (the tolerance alone would not tell) */
    for (int ki = 0; ki < 3; ki++)
        CHECK(sum_err[ki] <= 0.1 * sum_raw[ki]);
    printf("  decode %s cache: err vs float64 ref (P rounded) scalar %.2g, avx2 %.2g, avx512 %.2g "
           "(tol %.0e; vs P unrounded %.2g, %.2g, %.2g); ref kernel vs float64 (P rounded per split) "
           "%.2g; fp32-cache decode vs the half-value oracle (the half cache's price) %.2g\n",
           name, worst[0], worst[1], worst[2], tol, sum_raw[0] / (sizeof CASES / sizeof *CASES),
           sum_raw[1] / (sizeof CASES / sizeof *CASES), sum_raw[2] / (sizeof CASES / sizeof *CASES),
           worst_ref, worst_fp32);
}

TEST(decode_half_bf16_cache_matches_f64_reference) { check_dtype(MHA_BF16, 2e-3); }
TEST(decode_half_f16_cache_matches_f64_reference) { check_dtype(MHA_F16, 5e-4); }

/* The price of a half cache: decode over the rounded cache against decode
 * over the fp32 cache of the same tokens (printed; asserted only loosely:
 * it must look like the dtype's precision, not like garbage). */
TEST(decode_half_error_against_fp32_cache_measured) {
    const half_case c = {1, 32, 8, 128, 128, 2000, 0};
    const int64_t nk = c.Hkv * c.T * c.d, nq = c.Hq * c.d, no = c.Hq * c.dv;
    float *k = malloc(sizeof(float) * (size_t)(2 * nk + nq + 2 * no + 2 * c.Hq));
    REQUIRE(k);
    float *v = k + nk, *q = v + nk, *o32 = q + nq, *oh = o32 + no, *l32 = oh + no, *lh = l32 + c.Hq;
    test_randn(k, (size_t)(2 * nk + nq), 31);
    mha_kv_cache *kv32 = fill_cache(&c, MHA_F32, k, v);
    REQUIRE(kv32);
    REQUIRE_OK(decode_with(o32, l32, &c, q, kv32, MHA_KERNEL_AUTO, 2));
    const mha_dtype dts[2] = {MHA_BF16, MHA_F16};
    const double bound[2] = {2e-2, 3e-3};
    for (int i = 0; i < 2; i++) {
        mha_kv_cache *kv = fill_cache(&c, dts[i], k, v);
        REQUIRE(kv);
        REQUIRE_OK(decode_with(oh, lh, &c, q, kv, MHA_KERNEL_AUTO, 2));
        const double e = norm_err(oh, o32, no), el = test_max_diff(lh, l32, c.Hq);
        printf("  decode H %lld Hkv %lld d %lld len %lld: %s cache vs fp32 cache: out err %.2g "
               "(normalised), lse diff %.2g\n",
               (long long)c.Hq, (long long)c.Hkv, (long long)c.d, (long long)c.T,
               i ? "fp16" : "bf16", e, el);
        CHECK(e > 0.0 && e < bound[i] && el < bound[i]);
        mha_kv_cache_free(kv);
    }
    mha_kv_cache_free(kv32);
    free(k);
}

/* Half q and a half out: q is widened (exact), out rounded once from the
 * float32 result. */
TEST(decode_half_q_and_out_dtypes) {
    const half_case c = {1, 4, 2, 24, 20, 300, 0};
    const int64_t nk = c.Hkv * c.T * c.d, nv = c.Hkv * c.T * c.dv, nq = c.Hq * c.d, no = c.Hq * c.dv;
    float *k = malloc(sizeof(float) * (size_t)(nk + nv + 2 * nq + 2 * no + 2 * c.Hq));
    uint16_t qh[4 * 24], oh[4 * 20];
    REQUIRE(k);
    float *v = k + nk, *q = v + nv, *qr = q + nq, *o = qr + nq, *o2 = o + no, *l = o2 + no;
    test_randn(k, (size_t)(nk + nv + nq), 5);
    for (int64_t i = 0; i < nq; i++)
        qh[i] = mha_float_to_half(q[i]), qr[i] = mha_half_to_float(qh[i]);
    mha_kv_cache *kv = fill_cache(&c, MHA_BF16, k, v);
    REQUIRE(kv);
    const mha_kernel kernels[4] = {MHA_KERNEL_REF, MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2,
                                   MHA_KERNEL_AVX512};
    for (int ki = 0; ki < 4; ki++) {
        if (!test_kernel_runs(kernels[ki]))
            continue;
        REQUIRE_OK(decode_with(o, l, &c, qr, kv, kernels[ki], 1));
        mha_tensor Q, O;
        mha_tensor_init(&Q, MHA_F16, qh, 4, (int64_t[]){1, c.Hq, 1, c.d});
        mha_tensor_init(&O, MHA_BF16, oh, 4, (int64_t[]){1, c.Hq, 1, c.dv});
        mha_sdpa_options opt;
        mha_sdpa_options_init(&opt);
        opt.kernel = kernels[ki];
        REQUIRE_OK(mha_attention_decode(&O, &Q, kv, &opt));
        bool same = true;
        for (int64_t i = 0; i < no; i++)
            same = same && oh[i] == mha_float_to_bf16(o[i]);
        CHECK(same);
        O.dtype = MHA_F32, O.data = o2; /* fp16 q, fp32 out: as the widened q */
        REQUIRE_OK(mha_attention_decode(&O, &Q, kv, &opt));
        CHECK(!memcmp(o, o2, sizeof(float) * (size_t)no));
    }
    mha_kv_cache_free(kv);
    free(k);
}

/* Append converts from any float dtype and strides, rounding to nearest
 * even; a failed append changes nothing. */
TEST(decode_half_append_converts_and_validates_first) {
    enum { HKV = 2, T = 5, D = 3, DV = 4 };
    float kf[HKV * T * D], vf[HKV * T * DV];
    uint16_t kb[D * T * HKV]; /* k as bf16, stored transposed: (d,T,Hkv) order */
    test_randn(kf, HKV * T * D, 1), test_randn(vf, HKV * T * DV, 2);
    for (int h = 0; h < HKV; h++)
        for (int t = 0; t < T; t++)
            for (int x = 0; x < D; x++)
                kb[(x * T + t) * HKV + h] = mha_float_to_bf16(kf[(h * T + t) * D + x]);
    mha_kv_cache *c;
    CHECK_STATUS(mha_kv_cache_create(&c, MHA_I64, 1, HKV, T, D, DV, 0), MHA_ERR_DTYPE);
    CHECK(strstr(mha_last_error(), "MHA_BF16") != NULL);
    CHECK_STATUS(mha_kv_cache_create(&c, MHA_BOOL, 1, HKV, T, D, DV, 0), MHA_ERR_DTYPE);
    CHECK_STATUS(mha_kv_cache_create(&c, (mha_dtype)99, 1, HKV, T, D, DV, 0), MHA_ERR_DTYPE);
    REQUIRE_OK(mha_kv_cache_create(&c, MHA_F16, 1, HKV, T, D, DV, 0));
    CHECK(mha_kv_cache_dtype(c) == MHA_F16);
    mha_tensor K, V;
    mha_tensor_init(&K, MHA_BF16, kb, 4, (int64_t[]){1, HKV, T, D});
    K.stride[0] = 0, K.stride[1] = 1, K.stride[2] = HKV, K.stride[3] = T * HKV;
    V = test_view4(vf, 1, HKV, T, DV);
    REQUIRE_OK(mha_kv_cache_append(c, &K, &V));
    const void *sk, *sv;
    size_t bk, bv;
    mha_kv_cache_storage(c, &sk, &bk, &sv, &bv);
    CHECK(bk == sizeof(uint16_t) * HKV * T * D && bv == sizeof(uint16_t) * HKV * T * DV);
    bool ok = true;
    for (int i = 0; i < HKV * T * D; i++) /* bf16 -> fp16: rounded once from the bf16 value */
        ok = ok && ((const uint16_t *)sk)[i] ==
                       mha_float_to_half(mha_bf16_to_float(mha_float_to_bf16(kf[i])));
    for (int i = 0; i < HKV * T * DV; i++)
        ok = ok && ((const uint16_t *)sv)[i] == mha_float_to_half(vf[i]);
    CHECK(ok);
    /* nothing changes on a refused append: full, wrong dtype, wrong shape */
    uint8_t before[sizeof(uint16_t) * HKV * T * (D + DV)];
    memcpy(before, sk, bk), memcpy(before + bk, sv, bv);
    mha_kv_cache_reset(c);
    mha_tensor K1 = K, V1 = V;
    K1.shape[2] = V1.shape[2] = 1;
    REQUIRE_OK(mha_kv_cache_append(c, &K1, &V1));
    memcpy(before, sk, bk), memcpy(before + bk, sv, bv);
    mha_tensor Ki = K1, Vs = V1;
    int64_t idata[HKV * D] = {0};
    Ki.dtype = MHA_I64, Ki.data = idata;
    CHECK_STATUS(mha_kv_cache_append(c, &Ki, &V1), MHA_ERR_DTYPE);
    Vs.shape[3] = DV - 1;
    CHECK_STATUS(mha_kv_cache_append(c, &K1, &Vs), MHA_ERR_SHAPE);
    Vs = V1, Vs.shape[2] = 2;
    CHECK_STATUS(mha_kv_cache_append(c, &K1, &Vs), MHA_ERR_SHAPE);
    K.shape[2] = V.shape[2] = T;
    CHECK_STATUS(mha_kv_cache_append(c, &K, &V), MHA_ERR_VALUE); /* 1 + 5 > capacity 5 */
    CHECK(mha_kv_cache_position(c) == 1);
    CHECK(!memcmp(before, sk, bk) && !memcmp(before + bk, sv, bv));
    /* decode: wrong dtypes and shapes are refused */
    float q[4 * D], o[4 * DV];
    int64_t iq[4 * D];
    mha_tensor Q = test_view4(q, 1, 4, 1, D), O = test_view4(o, 1, 4, 1, DV), Qi = Q, Ob = O;
    test_randn(q, 4 * D, 3);
    REQUIRE_OK(mha_attention_decode(&O, &Q, c, NULL));
    Qi.dtype = MHA_I64, Qi.data = iq;
    CHECK_STATUS(mha_attention_decode(&O, &Qi, c, NULL), MHA_ERR_DTYPE);
    Ob.dtype = MHA_BOOL;
    CHECK_STATUS(mha_attention_decode(&Ob, &Q, c, NULL), MHA_ERR_DTYPE);
    Ob = test_view4(o, 1, 4, 1, DV - 1);
    CHECK_STATUS(mha_attention_decode(&Ob, &Q, c, NULL), MHA_ERR_SHAPE);
    Qi = test_view4(q, 1, 3, 1, D); /* 3 heads over 2 kv heads */
    CHECK_STATUS(mha_attention_decode(&O, &Qi, c, NULL), MHA_ERR_SHAPE);
    mha_kv_cache_free(c);
}

/* Resident memory of a large cache, by its allocation: a bf16 or fp16
 * cache of 32k positions (Hkv 8, d 128) is half the fp32 one. */
TEST(decode_half_cache_memory_is_half) {
    const mha_dtype dts[3] = {MHA_F32, MHA_BF16, MHA_F16};
    size_t bytes[3];
    for (int i = 0; i < 3; i++) {
        mha_kv_cache *c;
        REQUIRE_OK(mha_kv_cache_create(&c, dts[i], 1, 8, 32768, 128, 128, 0));
        const void *k, *v;
        size_t bk, bv;
        mha_kv_cache_storage(c, &k, &bk, &v, &bv);
        bytes[i] = bk + bv;
        mha_kv_cache_free(c);
    }
    printf("  kv cache 1x8x32768x128 (k+v): fp32 %zu MiB, bf16 %zu MiB, fp16 %zu MiB\n",
           bytes[0] >> 20, bytes[1] >> 20, bytes[2] >> 20);
    CHECK(bytes[0] == (size_t)2 * 8 * 32768 * 128 * 4 && bytes[1] * 2 == bytes[0] &&
          bytes[2] == bytes[1]);
}
