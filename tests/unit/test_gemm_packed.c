/* test_gemm_packed.c - the packed-weight GEMM of the trained model
 * (src/kernels/gemm_packed.h): y (M,N) = [y +] bias + x (M,K) w^T [GELU].
 *
 * Letters: M rows, N output features, K input features, NR = 24.
 * Rules:
 *   - the layout: wp[(p K + k) NR + j] = w[p NR + j][k], zeros past N;
 *   - the reference against a float64 product: per element |y - ref| <=
 *     (K + 2) 1.2e-7 (sum_k |x w| + |bias| + |y0|) + 1e-30;
 *   - the avx2 kernel against the reference: bit-identical without GELU
 *     (one FMA chain in k order on both), for odd shapes (M = 1..4 tails,
 *     N not a multiple of NR, K = 0, 1 and across the KC = 384 slices),
 *     strided x and y with guard values, bias or not, accumulate or not,
 *     1, 2 and 3 threads; with GELU |diff| <= 2e-7 + 4.8e-7 |y| from the
 *     scalar GELU (the same formula; FMA and exp differ by ulps);
 *   - the A&S GELU against the erff one: |diff| <= 3e-7 max(1, |x|)
 *     (A&S's 1.5e-7 on erf plus the roundings of both).
 */
#include "test.h"

#include "kernels/gemm_packed.h"

#define GUARD 12345.0f

static float *randn_buf(size_t n, uint64_t seed) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    test_randn(p, n, seed);
    return p;
}

static float gelu_erff(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

TEST(gemm_packed_layout) {
    enum { NR = MHA_PACK_NR };
    const int64_t Ns[] = {1, 23, 24, 25, 50}, K = 7, ldw = 9;
    for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++) {
        const int64_t N = Ns[a], P = (N + NR - 1) / NR;
        CHECK(mha_gemm_packed_floats(N, K) == P * NR * K);
        float *w = randn_buf((size_t)(N * ldw), 5 + (uint64_t)a);
        float *wp = malloc(sizeof(float) * (size_t)(P * NR * K));
        mha_gemm_pack(wp, w, ldw, N, K);
        int bad = 0;
        for (int64_t p = 0; p < P; p++)
            for (int64_t k = 0; k < K; k++)
                for (int64_t j = 0; j < NR; j++) {
                    const int64_t n = p * NR + j;
                    const float want = n < N ? w[n * ldw + k] : 0.0f;
                    bad += wp[(p * K + k) * NR + j] != want;
                }
        if (bad)
            test_fail(__FILE__, __LINE__, "N=%lld: %d packed values misplaced", (long long)N, bad);
        free(w), free(wp);
    }
}

TEST(gemm_packed_gelu_matches_erff) {
    /* the scalar GELU of the packed path against 0.5 x (1 + erff(x/sqrt2)) */
    double worst = 0;
    for (int i = -200000; i <= 200000; i++) {
        const float x = (float)i * 5e-5f; /* [-10, 10] */
        const float d = fabsf(mha_gelu_as_f32(x) - gelu_erff(x));
        const double rel = d / fmax(1.0, fabs(x));
        worst = rel > worst ? rel : worst;
    }
    if (!(worst <= 3e-7))
        test_fail(__FILE__, __LINE__, "A&S GELU vs erff GELU: %.3g > 3e-7", worst);
    CHECK(mha_gelu_as_f32(0.0f) == 0.0f);
    CHECK(mha_gelu_as_f32(30.0f) == 30.0f);           /* erf = 1 exactly */
    CHECK(fabsf(mha_gelu_as_f32(-30.0f)) == 0.0f);    /* the tail vanishes */
    CHECK(isinf(mha_gelu_as_f32(INFINITY)));
    CHECK(isnan(mha_gelu_as_f32(NAN)));
    /* the negative tail keeps its relative precision: gelu(-5) = -5 Phi(-5) */
    const double tail = -5.0 * 0.5 * erfc(5.0 / sqrt(2.0));
    CHECK(fabs(mha_gelu_as_f32(-5.0f) - tail) <= 2e-3 * fabs(tail));
}

TEST(gemm_packed_gelu_avx2_matches_scalar) {
    if (!mha_cpu_has_avx2_fma()) {
        SKIP("no AVX2+FMA on this CPU");
    }
    enum { N = 40007 }; /* a tail of 7 */
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++)
        x[i] = (float)(i - N / 2) * 6e-4f; /* [-12, 12] */
    x[0] = 0.0f, x[1] = -0.0f, x[2] = INFINITY, x[3] = NAN, x[4] = -1e30f, x[5] = 1e30f;
    mha_gelu_as_f32_avx2(y, x, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const float want = mha_gelu_as_f32(x[i]);
        const bool ok = isnan(want) ? isnan(y[i])
                                    : y[i] == want || fabsf(y[i] - want) <= 2e-7f + 4.8e-7f * fabsf(want);
        if (!ok && bad++ < 3)
            test_fail(__FILE__, __LINE__, "gelu(%.9g): avx2 %.9g, scalar %.9g", x[i], y[i], want);
    }
    free(x), free(y);
}

typedef struct {
    int64_t M, N, K, ldx, ldy;
    float *x, *w, *wp, *bias, *y0;
} packed_case;

static void case_make(packed_case *c, int64_t M, int64_t N, int64_t K, int64_t pad,
                      uint64_t seed) {
    c->M = M, c->N = N, c->K = K, c->ldx = K + pad, c->ldy = N + 2 * pad;
    c->x = randn_buf((size_t)(M * c->ldx), seed);
    c->w = randn_buf((size_t)(N * K), seed + 1);
    c->bias = randn_buf((size_t)N, seed + 2);
    c->y0 = randn_buf((size_t)(M * c->ldy), seed + 3);
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = N; j < c->ldy; j++)
            c->y0[r * c->ldy + j] = GUARD;
    c->wp = malloc(sizeof(float) * (size_t)(mha_gemm_packed_floats(N, K) + 1));
    mha_gemm_pack(c->wp, c->w, K, N, K);
}

static void case_free(packed_case *c) {
    free(c->x), free(c->w), free(c->wp), free(c->bias), free(c->y0);
}

/* The reference against float64 and its guards; y holds its result. */
static void check_ref(const packed_case *c, const float *y, const float *bias, int acc,
                      int gelu) {
    int bad = 0;
    for (int64_t i = 0; i < c->M && bad < 3; i++)
        for (int64_t j = 0; j < c->ldy && bad < 3; j++) {
            const float got = y[i * c->ldy + j];
            if (j >= c->N) {
                if (got != GUARD && bad++ < 3)
                    test_fail(__FILE__, __LINE__, "ref: guard at (%lld,%lld) overwritten",
                              (long long)i, (long long)j);
                continue;
            }
            double s = 0, mag = 0;
            for (int64_t k = 0; k < c->K; k++) {
                double p = (double)c->x[i * c->ldx + k] * c->w[j * c->K + k];
                s += p, mag += fabs(p);
            }
            if (bias)
                s += bias[j], mag += fabs(bias[j]);
            if (acc)
                s += c->y0[i * c->ldy + j], mag += fabs(c->y0[i * c->ldy + j]);
            double tol = (double)(c->K + 2) * 1.2e-7 * mag + 1e-30;
            if (gelu) { /* gelu is 1-Lipschitz-ish (slope <= 1.13), plus its own error */
                tol = 1.13 * tol + 3e-7 * fmax(1.0, fabs(s));
                s = 0.5 * s * erfc(-s / sqrt(2.0));
            }
            if (!(fabs(got - s) <= tol) && bad++ < 3)
                test_fail(__FILE__, __LINE__,
                          "ref M=%lld N=%lld K=%lld acc=%d gelu=%d (%lld,%lld): %.9g vs %.9g",
                          (long long)c->M, (long long)c->N, (long long)c->K, acc, gelu,
                          (long long)i, (long long)j, got, s);
        }
}

/* The avx2 kernel against the reference on one case, every option. */
static void check_case(const packed_case *c, bool avx2) {
    const size_t n = (size_t)(c->M * c->ldy);
    float *ref = malloc(sizeof(float) * (n + 1)), *got = malloc(sizeof(float) * (n + 1));
    for (int use_bias = 0; use_bias < 2; use_bias++)
        for (int acc = 0; acc < 2; acc++)
            for (int gelu = 0; gelu < 2; gelu++) {
                const float *bias = use_bias ? c->bias : NULL;
                memcpy(ref, c->y0, sizeof(float) * n);
                mha_gemm_packed_f32_ref(ref, c->ldy, c->x, c->ldx, c->wp, bias, c->M, c->N, c->K,
                                        acc, gelu);
                check_ref(c, ref, bias, acc, gelu);
                if (!avx2)
                    continue;
                memcpy(got, c->y0, sizeof(float) * n);
                mha_gemm_packed_f32_avx2(got, c->ldy, c->x, c->ldx, c->wp, bias, c->M, c->N,
                                         c->K, acc, gelu);
                int bad = 0;
                for (size_t e = 0; e < n; e++) {
                    const float r = ref[e], g = got[e];
                    const bool ok = gelu ? fabsf(g - r) <= 2e-7f + 4.8e-7f * fabsf(r)
                                         : memcmp(&g, &r, sizeof g) == 0;
                    if (!ok && bad++ < 3)
                        test_fail(__FILE__, __LINE__,
                                  "avx2 M=%lld N=%lld K=%lld bias=%d acc=%d gelu=%d at %zu: "
                                  "%.9g vs ref %.9g", (long long)c->M, (long long)c->N,
                                  (long long)c->K, use_bias, acc, gelu, e, g, r);
                }
                if (!mha_avx512_runs())
                    continue;
                /* the avx512 block: the avx2 block's bits, GELU included */
                memcpy(ref, c->y0, sizeof(float) * n);
                mha_gemm_packed_f32_avx512(ref, c->ldy, c->x, c->ldx, c->wp, bias, c->M, c->N,
                                           c->K, acc, gelu);
                for (size_t e = 0, bad512 = 0; e < n; e++)
                    if (memcmp(&ref[e], &got[e], sizeof(float)) != 0 && bad512++ < 3)
                        test_fail(__FILE__, __LINE__,
                                  "avx512 M=%lld N=%lld K=%lld bias=%d acc=%d gelu=%d at %zu: "
                                  "%.9g vs avx2 %.9g", (long long)c->M, (long long)c->N,
                                  (long long)c->K, use_bias, acc, gelu, e, ref[e], got[e]);
            }
    free(ref), free(got);
}

TEST(gemm_packed_avx2_bits_equal_reference) {
    const bool avx2 = mha_cpu_has_avx2_fma();
    if (!avx2)
        SKIP_PART("packed avx2 kernel: no AVX2+FMA on this CPU (reference checked alone)");
    if (!mha_avx512_runs())
        SKIP_PART("packed avx512 block: this CPU lacks AVX-512 and no emulation is built");
    const int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 17, 37};
    const int64_t Ns[] = {1, 5, 23, 24, 25, 49};
    const int64_t Ks[] = {0, 1, 3, 17, 383, 385};
    uint64_t seed = 100;
    for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
        for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
            for (size_t k = 0; k < sizeof Ks / sizeof *Ks; k++) {
                packed_case c;
                case_make(&c, Ms[a], Ns[b], Ks[k], (int64_t)(a + b) % 3 * 5, seed += 4);
                check_case(&c, avx2);
                case_free(&c);
            }
    /* the blocks of the avx2 kernel: rows past MC = 144, panels past NP = 16
     * (384 columns), four KC = 384 slices */
    const int64_t big[][3] = {{150, 400, 20}, {289, 30, 769}, {9, 24 * 17 + 1, 1537}};
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
        packed_case c;
        case_make(&c, big[i][0], big[i][1], big[i][2], 3, seed += 4);
        check_case(&c, avx2);
        case_free(&c);
    }
}

TEST(gemm_packed_avx2_bits_independent_of_threads_and_rows) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("no AVX2+FMA on this CPU");
    packed_case c;
    case_make(&c, 301, 1152 / 8 + 1, 385, 0, 7);
    const size_t n = (size_t)(c.M * c.ldy);
    float *one = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    mha_set_num_threads(1);
    mha_gemm_packed_f32_avx2(one, c.ldy, c.x, c.ldx, c.wp, c.bias, c.M, c.N, c.K, 0, 1);
    for (int t = 2; t <= 3; t++) {
        mha_set_num_threads(t);
        mha_gemm_packed_f32_avx2(y, c.ldy, c.x, c.ldx, c.wp, c.bias, c.M, c.N, c.K, 0, 1);
        CHECK(memcmp(y, one, sizeof(float) * n) == 0);
    }
    /* a row alone (M = 1) and a block of rows from the middle give the same bits */
    for (int64_t r = 0; r < c.M; r += 37) {
        mha_gemm_packed_f32_avx2(y, c.ldy, c.x + r * c.ldx, c.ldx, c.wp, c.bias, 1, c.N, c.K, 0, 1);
        CHECK(memcmp(y, one + r * c.ldy, sizeof(float) * (size_t)c.N) == 0);
    }
    mha_gemm_packed_f32_avx2(y, c.ldy, c.x + 5 * c.ldx, c.ldx, c.wp, c.bias, 150, c.N, c.K, 0, 1);
    CHECK(memcmp(y, one + 5 * c.ldy, sizeof(float) * (size_t)(150 * c.ldy)) == 0);
    mha_set_num_threads(0);
    free(one), free(y);
    case_free(&c);
}
