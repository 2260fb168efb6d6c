/* test_gemm.c - the projections' GEMM, y (M,N) = x (M,K) w^T (+ bias) (+ y),
 * on every path (blas, avx2, portable; src/kernels/gemm.h) against a float64
 * product.
 *
 * Letters: M rows of x/y, N rows of w (outputs), K columns of x and w.
 * Rule: per element |y - ref| <= (K + 2) * 1.2e-7 * (sum_k |x w| + |bias| +
 * |y0|) + 1e-30, the worst-case float rounding bound of any summation order
 * (u = 2^-24, gamma_K ~ K u, with slack for the bias and accumulate adds).
 * Odd shapes 1..70 (primes, K = 0), shapes crossing the avx2 blocks (MC 144,
 * NC 256, KC 256), strided x, w, y with guard values in the gaps.
 * Every check asserts the path that ran is the one it names (the dispatcher
 * returns it); a path this build or CPU lacks is reported skipped.
 */
#include "test.h"

#include "kernels/gemm.h"

static const mha_gemm_path paths[] = {MHA_GEMM_BLAS, MHA_GEMM_AVX2, MHA_GEMM_PORTABLE};
#define GUARD 12345.0f

typedef struct {
    int64_t M, N, K, ldx, ldw, ldy;
    float *x, *w, *bias, *y0, *y;
} gemm_case;

static float *randn_buf(size_t n, uint64_t seed) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    test_randn(p, n, seed);
    return p;
}

/* Allocates a case; pad adds to each leading dimension (filled with GUARD in y). */
static void case_make(gemm_case *c, int64_t M, int64_t N, int64_t K, int64_t pad, uint64_t seed) {
    c->M = M, c->N = N, c->K = K;
    c->ldx = K + pad, c->ldw = K + 2 * pad, c->ldy = N + 3 * pad;
    c->x = randn_buf((size_t)(M * c->ldx), seed);
    c->w = randn_buf((size_t)(N * c->ldw), seed + 1);
    c->bias = randn_buf((size_t)N, seed + 2);
    c->y0 = randn_buf((size_t)(M * c->ldy), seed + 3);
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = N; j < c->ldy; j++)
            c->y0[r * c->ldy + j] = GUARD;
    c->y = malloc(sizeof(float) * (size_t)(M * c->ldy + 1));
}

static void case_free(gemm_case *c) {
    free(c->x), free(c->w), free(c->bias), free(c->y0), free(c->y);
}

/* True when this build and CPU run `path`; otherwise notes it skipped (a
 * fallback is never checked under the name of the path asked for). */
static bool path_runs_here(mha_gemm_path path) {
    if (mha_gemm_resolve(path) == path)
        return true;
    SKIP_PART("gemm path %s: not in this build or on this CPU", mha_gemm_path_name(path));
    return false;
}

/* Fails unless the product asked for `path` ran on it. */
static void check_ran(mha_gemm_path path, mha_gemm_path ran, int64_t M, int64_t N, int64_t K) {
    if (ran != path)
        test_fail(__FILE__, __LINE__, "M=%lld N=%lld K=%lld: asked for path %s, %s ran",
                  (long long)M, (long long)N, (long long)K, mha_gemm_path_name(path),
                  mha_gemm_path_name(ran));
}

/* Runs one path and checks every element and the guards, and that the
 * path ran; a path this machine lacks is skipped. */
static void case_check(const gemm_case *c, mha_gemm_path path, int use_bias, int acc) {
    if (!path_runs_here(path))
        return;
    memcpy(c->y, c->y0, sizeof(float) * (size_t)(c->M * c->ldy));
    const float *bias = use_bias ? c->bias : NULL;
    check_ran(path, mha_linear_f32_path(path, c->y, c->ldy, c->x, c->ldx, c->w, c->ldw, bias, c->M,
                                        c->N, c->K, acc),
              c->M, c->N, c->K);
    int bad = 0;
    for (int64_t i = 0; i < c->M && bad < 3; i++) {
        for (int64_t j = 0; j < c->ldy && bad < 3; j++) {
            float got = c->y[i * c->ldy + j];
            if (j >= c->N) {
                if (got != GUARD) {
                    test_fail(__FILE__, __LINE__, "%s M=%lld N=%lld K=%lld: guard (%lld,%lld) overwritten",
                              mha_gemm_path_name(path), (long long)c->M, (long long)c->N,
                              (long long)c->K, (long long)i, (long long)j);
                    bad++;
                }
                continue;
            }
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < c->K; k++) {
                double t = (double)c->x[i * c->ldx + k] * (double)c->w[j * c->ldw + k];
                ref += t, mag += fabs(t);
            }
            if (bias)
                ref += bias[j], mag += fabs(bias[j]);
            if (acc)
                ref += c->y0[i * c->ldy + j], mag += fabs(c->y0[i * c->ldy + j]);
            double tol = (double)(c->K + 2) * 1.2e-7 * mag + 1e-30;
            if (!(fabs(got - ref) <= tol)) {
                test_fail(__FILE__, __LINE__,
                          "%s M=%lld N=%lld K=%lld bias=%d acc=%d: y(%lld,%lld) = %.9g, ref %.9g, "
                          "tol %.3g",
                          mha_gemm_path_name(path), (long long)c->M, (long long)c->N,
                          (long long)c->K, use_bias, acc, (long long)i, (long long)j, got, ref, tol);
                bad++;
            }
        }
    }
}

static void check_all_variants(int64_t M, int64_t N, int64_t K, int64_t pad, uint64_t seed) {
    gemm_case c;
    case_make(&c, M, N, K, pad, seed);
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++)
        for (int v = 0; v < 4; v++)
            case_check(&c, paths[p], v & 1, v >> 1);
    case_free(&c);
}

TEST(gemm_paths_resolve) {
    /* the test covers the path it names wherever this machine has it */
    CHECK(mha_gemm_resolve(MHA_GEMM_PORTABLE) == MHA_GEMM_PORTABLE);
    if (mha_cpu_has_avx2_fma())
        CHECK(mha_gemm_resolve(MHA_GEMM_AVX2) == MHA_GEMM_AVX2);
    else
        SKIP_PART("gemm path avx2: this CPU lacks AVX2+FMA");
#ifdef MHA_HAVE_CBLAS
    CHECK(mha_gemm_resolve(MHA_GEMM_BLAS) == MHA_GEMM_BLAS);
#else
    SKIP_PART("gemm path blas: built without OpenBLAS");
#endif
    /* MHA_GEMM forces a path: the one that then runs; whatever the caller's
     * environment, the automatic path is the one without the variable */
    const char *old = getenv("MHA_GEMM");
    char saved[32] = "";
    if (old)
        snprintf(saved, sizeof saved, "%s", old);
    unsetenv("MHA_GEMM");
    mha_gemm_path best = mha_gemm_resolve(MHA_GEMM_AUTO);
    CHECK(best != MHA_GEMM_AUTO);
    gemm_case c;
    case_make(&c, 5, 7, 3, 1, 30);
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (mha_gemm_resolve(paths[p]) != paths[p])
            continue; /* noted skipped above */
        setenv("MHA_GEMM", mha_gemm_path_name(paths[p]), 1);
        CHECK(mha_gemm_resolve(MHA_GEMM_AUTO) == paths[p]);
        check_ran(paths[p], mha_linear_f32_path(MHA_GEMM_AUTO, c.y, c.ldy, c.x, c.ldx, c.w, c.ldw,
                                                NULL, c.M, c.N, c.K, 0), c.M, c.N, c.K);
    }
    case_free(&c);
    setenv("MHA_GEMM", "nonsense", 1); /* an unknown value leaves the automatic one */
    mha_gemm_path fallback = mha_gemm_resolve(MHA_GEMM_AUTO);
    if (old)
        setenv("MHA_GEMM", saved, 1);
    else
        unsetenv("MHA_GEMM");
    CHECK(fallback == best);
}

/* Products up to MHA_GEMM_OWN_MAX_MNK = 2^31 multiply-adds run on mha's own
 * GEMM where the automatic choice is OpenBLAS on an AVX-512 machine (one
 * thread team); a larger one, and any forced path, keep the resolved one. */
TEST(gemm_small_products_stay_on_the_own_gemm) {
    const char *old = getenv("MHA_GEMM");
    char saved[32] = "";
    if (old)
        snprintf(saved, sizeof saved, "%s", old);
    unsetenv("MHA_GEMM");
    const mha_gemm_path best = mha_gemm_resolve(MHA_GEMM_AUTO);
    const bool swaps = best == MHA_GEMM_BLAS && mha_cpu_has_avx512();
    CHECK(mha_gemm_resolve_for(MHA_GEMM_AUTO, 512, 1536, 512) ==
          (swaps ? MHA_GEMM_AVX2 : best));
    CHECK(mha_gemm_resolve_for(MHA_GEMM_AUTO, 4096, 1152, 384) ==
          (swaps ? MHA_GEMM_AVX2 : best)); /* B 32 L 128 E 384: 2^30.8 */
    CHECK(mha_gemm_resolve_for(MHA_GEMM_AUTO, 2048, 1024, 1024) ==
          (swaps ? MHA_GEMM_AVX2 : best)); /* 2^31 exactly */
    CHECK(mha_gemm_resolve_for(MHA_GEMM_AUTO, 2049, 1024, 1024) == best);
    CHECK(mha_gemm_resolve_for(MHA_GEMM_PORTABLE, 4, 4, 4) == MHA_GEMM_PORTABLE);
#ifdef MHA_HAVE_CBLAS
    CHECK(mha_gemm_resolve_for(MHA_GEMM_BLAS, 4, 4, 4) == MHA_GEMM_BLAS);
    setenv("MHA_GEMM", "blas", 1); /* the variable forces it too */
    CHECK(mha_gemm_resolve_for(MHA_GEMM_AUTO, 4, 4, 4) == MHA_GEMM_BLAS);
#endif
    if (old)
        setenv("MHA_GEMM", saved, 1);
    else
        unsetenv("MHA_GEMM");
    if (!swaps)
        SKIP_PART("the swap to the own GEMM: the automatic path here is not OpenBLAS on AVX-512");
}

TEST(gemm_small_odd_shapes) {
    static const int64_t dims[] = {1, 2, 3, 5, 6, 7, 11, 13, 16, 17, 23, 31, 32, 37, 47, 64, 70};
    const int nd = (int)(sizeof dims / sizeof dims[0]);
    uint64_t seed = 100;
    /* M x N over every pair, K cycling through the list (and a stride pad cycling 0..2) */
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < nd; b++) {
            int64_t K = dims[(a * 7 + b * 3) % nd];
            check_all_variants(dims[a], dims[b], K, (a + b) % 3, seed++);
        }
    /* every K of the list on one odd M x N */
    for (int k = 0; k < nd; k++)
        check_all_variants(13, 29, dims[k], 1, seed++);
}

TEST(gemm_k_zero_and_empty) {
    check_all_variants(7, 19, 0, 2, 7);
    check_all_variants(1, 1, 0, 0, 8);
    check_all_variants(0, 5, 3, 1, 9);
    check_all_variants(5, 0, 3, 1, 10);
}

TEST(gemm_block_crossing_shapes) {
    /* around MC = 144, NC = 256, KC = 256 of the avx2 path, and the MHA sizes */
    check_all_variants(145, 257, 257, 1, 20);
    check_all_variants(150, 270, 513, 3, 21);
    check_all_variants(289, 65, 256, 0, 22);
    check_all_variants(67, 1536, 64, 0, 23);
    check_all_variants(300, 96, 600, 5, 24);
}

TEST(gemm_avx2_bit_identical_across_threads) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("gemm path avx2: this CPU lacks AVX2+FMA");
    gemm_case c;
    case_make(&c, 301, 531, 517, 3, 40);
    size_t n = (size_t)(c.M * c.ldy);
    float *first = malloc(sizeof(float) * n);
    static const int threads[] = {1, 2, 3, 7};
    for (int t = 0; t < 4; t++) {
        mha_set_num_threads(threads[t]);
        memcpy(c.y, c.y0, sizeof(float) * n);
        CHECK(mha_linear_f32_path(MHA_GEMM_AVX2, c.y, c.ldy, c.x, c.ldx, c.w, c.ldw, c.bias, c.M,
                                  c.N, c.K, 1) == MHA_GEMM_AVX2);
        if (t == 0)
            memcpy(first, c.y, sizeof(float) * n);
        else if (memcmp(first, c.y, sizeof(float) * n) != 0)
            test_fail(__FILE__, __LINE__, "avx2 gemm differs at %d threads", threads[t]);
    }
    mha_set_num_threads(0);
    free(first);
    case_free(&c);
}

TEST(gemm_no_path_allocates) {
    gemm_case c;
    case_make(&c, 150, 270, 300, 1, 50);
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        int64_t before = mha_test_alloc_count();
        case_check(&c, paths[p], 1, 0);
        CHECK(mha_test_alloc_count() == before);
    }
    case_free(&c);
}

/* ---- the backward's products: C (M,N) += op(A) B (K,N) -------------------------
 * trans_a = 0: A (M,K); trans_a = 1: A (K,M), op(A) = A^T.  Same rule as
 * above (tolerance from sum_k |a b| + |c0|), guards in every stride gap. */

typedef struct {
    int trans_a;
    int64_t M, N, K, lda, ldb, ldc;
    float *a, *b, *c0, *c;
} ab_case;

static void ab_make(ab_case *t, int trans_a, int64_t M, int64_t N, int64_t K, int64_t pad,
                    uint64_t seed) {
    t->trans_a = trans_a, t->M = M, t->N = N, t->K = K;
    int64_t arows = trans_a ? K : M, acols = trans_a ? M : K;
    t->lda = acols + pad, t->ldb = N + 2 * pad, t->ldc = N + 3 * pad;
    t->a = randn_buf((size_t)(arows * t->lda), seed);
    t->b = randn_buf((size_t)(K * t->ldb), seed + 1);
    t->c0 = randn_buf((size_t)(M * t->ldc), seed + 2);
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = N; j < t->ldc; j++)
            t->c0[r * t->ldc + j] = GUARD;
    t->c = malloc(sizeof(float) * (size_t)(M * t->ldc + 1));
}

static void ab_free(ab_case *t) { free(t->a), free(t->b), free(t->c0), free(t->c); }

static mha_gemm_path ab_run(const ab_case *t, mha_gemm_path path) {
    memcpy(t->c, t->c0, sizeof(float) * (size_t)(t->M * t->ldc));
    return mha_gemm_f32_ab_path(path, t->trans_a, t->c, t->ldc, t->a, t->lda, t->b, t->ldb, t->M,
                                t->N, t->K);
}

static void ab_check(const ab_case *t, mha_gemm_path path) {
    if (!path_runs_here(path))
        return;
    check_ran(path, ab_run(t, path), t->M, t->N, t->K);
    int bad = 0;
    for (int64_t i = 0; i < t->M && bad < 3; i++)
        for (int64_t j = 0; j < t->ldc && bad < 3; j++) {
            float got = t->c[i * t->ldc + j];
            if (j >= t->N) {
                if (got != GUARD) {
                    test_fail(__FILE__, __LINE__, "ab %s trans_a=%d M=%lld N=%lld K=%lld: guard "
                              "(%lld,%lld) overwritten", mha_gemm_path_name(path), t->trans_a,
                              (long long)t->M, (long long)t->N, (long long)t->K, (long long)i,
                              (long long)j);
                    bad++;
                }
                continue;
            }
            double ref = t->c0[i * t->ldc + j], mag = fabs(ref);
            for (int64_t k = 0; k < t->K; k++) {
                double av = t->trans_a ? t->a[k * t->lda + i] : t->a[i * t->lda + k];
                double p = av * (double)t->b[k * t->ldb + j];
                ref += p, mag += fabs(p);
            }
            double tol = (double)(t->K + 2) * 1.2e-7 * mag + 1e-30;
            if (!(fabs(got - ref) <= tol)) {
                test_fail(__FILE__, __LINE__,
                          "ab %s trans_a=%d M=%lld N=%lld K=%lld: c(%lld,%lld) = %.9g, ref %.9g, "
                          "tol %.3g", mha_gemm_path_name(path), t->trans_a, (long long)t->M,
                          (long long)t->N, (long long)t->K, (long long)i, (long long)j, got, ref,
                          tol);
                bad++;
            }
        }
}

static void ab_all_paths(int64_t M, int64_t N, int64_t K, int64_t pad, uint64_t seed) {
    for (int tr = 0; tr < 2; tr++) {
        ab_case t;
        ab_make(&t, tr, M, N, K, pad, seed);
        for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++)
            ab_check(&t, paths[p]);
        ab_free(&t);
    }
}

TEST(gemm_ab_small_odd_shapes) {
    static const int64_t dims[] = {1, 2, 3, 5, 6, 7, 11, 16, 17, 31, 47, 49, 64, 70};
    const int nd = (int)(sizeof dims / sizeof dims[0]);
    uint64_t seed = 300;
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < nd; b++)
            ab_all_paths(dims[a], dims[b], dims[(a * 5 + b * 3) % nd], (a + b) % 3, seed++);
    for (int k = 0; k < nd; k++)
        ab_all_paths(13, 29, dims[k], 2, seed++);
    /* empty products leave C (and its guards) untouched */
    ab_all_paths(7, 19, 0, 1, seed++);
    ab_all_paths(0, 5, 3, 1, seed++);
    ab_all_paths(5, 0, 3, 1, seed++);
}

TEST(gemm_ab_block_crossing_shapes) {
    /* MC 144, NC 256, KC 256 and the packed-A chunk AC 48 of the avx2 path;
     * the MHA backward's dW (E,E) K = L and dX (L,E) K = E */
    ab_all_paths(145, 257, 257, 1, 400);
    ab_all_paths(150, 270, 513, 3, 401);
    ab_all_paths(97, 65, 300, 0, 402);
    ab_all_paths(49, 530, 40, 2, 403);
    ab_all_paths(96, 96, 600, 5, 404);
}

TEST(gemm_ab_bit_identical_across_threads) {
    static const int threads[] = {1, 2, 3, 7};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (paths[p] == MHA_GEMM_BLAS || !path_runs_here(paths[p]))
            continue; /* OpenBLAS's own threading is not ours to promise */
        for (int tr = 0; tr < 2; tr++) {
            ab_case t;
            ab_make(&t, tr, 301, 531, 517, 3, 410 + (uint64_t)tr);
            size_t n = (size_t)(t.M * t.ldc);
            float *first = malloc(sizeof(float) * n);
            for (int k = 0; k < 4; k++) {
                mha_set_num_threads(threads[k]);
                ab_run(&t, paths[p]);
                if (k == 0)
                    memcpy(first, t.c, sizeof(float) * n);
                else if (memcmp(first, t.c, sizeof(float) * n) != 0)
                    test_fail(__FILE__, __LINE__, "ab %s trans_a=%d differs at %d threads",
                              mha_gemm_path_name(paths[p]), tr, threads[k]);
            }
            mha_set_num_threads(0);
            free(first);
            ab_free(&t);
        }
    }
}

TEST(gemm_ab_no_path_allocates) {
    for (int tr = 0; tr < 2; tr++) {
        ab_case t;
        ab_make(&t, tr, 150, 270, 300, 1, 420 + (uint64_t)tr);
        for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
            int64_t before = mha_test_alloc_count();
            ab_check(&t, paths[p]);
            CHECK(mha_test_alloc_count() == before);
        }
        ab_free(&t);
    }
}

/* ---- the avx2 path's blocks: 6x16 AVX2 against 12x32 AVX-512 --------------------
 * Both blocks run in one driver and sum each element as one FMA chain in k
 * order, so they must agree bit for bit, on y += x w^T and on both C += op(A)
 * B; and each against the float64 product (the rule above).  Shapes cross
 * every tail of both blocks (M 1, 13; N 1, 33; K 1, 257), strided operands
 * with guards.  Skipped where AVX-512 neither runs nor is emulated. */

/* Runs y += x w^T (kind 0) or C += op(A) B (kind 1: trans_a 0, 2: 1) on isa
 * into out (M, ld), from the case's initial values. */
static void blocks_run(const mha_gemm_isa *isa, int kind, const gemm_case *g, const ab_case *t,
                       float *out) {
    if (kind == 0) {
        memcpy(out, g->y0, sizeof(float) * (size_t)(g->M * g->ldy));
        mha_gemm_f32_run(isa, out, g->ldy, g->x, g->ldx, g->w, g->ldw, g->M, g->N, g->K, NULL,
                         0);
    } else {
        memcpy(out, t->c0, sizeof(float) * (size_t)(t->M * t->ldc));
        mha_gemm_f32_ab_run(isa, t->trans_a, out, t->ldc, t->a, t->lda, t->b, t->ldb, t->M, t->N,
                            t->K);
    }
}

/* |out - float64 product| within the rule, guards kept; op(A)(i,k) and
 * B(k,j) read through the case's layout. */
static void blocks_check_ref(int kind, const gemm_case *g, const ab_case *t, const float *out) {
    const int64_t M = kind ? t->M : g->M, N = kind ? t->N : g->N, K = kind ? t->K : g->K;
    const int64_t ld = kind ? t->ldc : g->ldy;
    const float *init = kind ? t->c0 : g->y0;
    int bad = 0;
    for (int64_t i = 0; i < M && bad < 3; i++)
        for (int64_t j = 0; j < ld && bad < 3; j++) {
            const float got = out[i * ld + j];
            if (j >= N) {
                if (got != GUARD)
                    test_fail(__FILE__, __LINE__, "kind %d: guard (%lld,%lld) overwritten", kind,
                              (long long)i, (long long)j), bad++;
                continue;
            }
            double ref = init[i * ld + j], mag = fabs(ref);
            for (int64_t k = 0; k < K; k++) {
                const double av = kind == 0   ? g->x[i * g->ldx + k]
                                  : kind == 1 ? t->a[i * t->lda + k]
                                              : t->a[k * t->lda + i];
                const double bv = kind == 0 ? g->w[j * g->ldw + k] : t->b[k * t->ldb + j];
                ref += av * bv, mag += fabs(av * bv);
            }
            if (!(fabs(got - ref) <= (double)(K + 2) * 1.2e-7 * mag + 1e-30))
                test_fail(__FILE__, __LINE__, "kind %d M=%lld N=%lld K=%lld: (%lld,%lld) = %.9g, ref %.9g",
                          kind, (long long)M, (long long)N, (long long)K, (long long)i,
                          (long long)j, got, ref), bad++;
        }
}

TEST(gemm_avx512_block_matches_avx2_block) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("gemm avx2 driver: this CPU lacks AVX2+FMA");
    if (!mha_avx512_runs())
        SKIP("gemm avx512 block: this CPU lacks AVX-512 (and it is not emulated here)");
    const mha_gemm_isa *b512 = MHA_AVX512_PICK(mha_gemm_isa_avx512);
    static const int64_t shapes[][4] = {/* M, N, K, pad */
                                        {1, 1, 1, 0},     {1, 33, 257, 1},  {13, 1, 5, 2},
                                        {13, 33, 1, 3},   {13, 33, 257, 1}, {12, 32, 256, 0},
                                        {25, 65, 513, 2}, {145, 97, 300, 1}, {7, 1536, 64, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], pad = shapes[s][3];
        for (int kind = 0; kind < 3; kind++) {
            gemm_case g = {0};
            ab_case t = {0};
            if (kind == 0)
                case_make(&g, M, N, K, pad, 600 + s);
            else
                ab_make(&t, kind - 1, M, N, K, pad, 700 + s * 2 + (uint64_t)kind);
            const size_t n = kind ? (size_t)(M * t.ldc) : (size_t)(M * g.ldy);
            float *o2 = malloc(sizeof(float) * n), *o5 = malloc(sizeof(float) * n);
            blocks_run(&mha_gemm_isa_avx2, kind, &g, &t, o2);
            blocks_run(b512, kind, &g, &t, o5);
            blocks_check_ref(kind, &g, &t, o5);
            if (memcmp(o2, o5, sizeof(float) * n) != 0)
                test_fail(__FILE__, __LINE__, "kind %d M=%lld N=%lld K=%lld: avx512 and avx2 blocks differ",
                          kind, (long long)M, (long long)N, (long long)K);
            free(o2), free(o5);
            if (kind == 0)
                case_free(&g);
            else
                ab_free(&t);
        }
    }
}

TEST(gemm_avx512_block_bit_identical_across_threads) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("gemm avx2 driver: this CPU lacks AVX2+FMA");
    if (!mha_avx512_runs())
        SKIP("gemm avx512 block: this CPU lacks AVX-512 (and it is not emulated here)");
    const mha_gemm_isa *b512 = MHA_AVX512_PICK(mha_gemm_isa_avx512);
    static const int threads[] = {1, 2, 3, 7};
    for (int kind = 0; kind < 3; kind++) {
        gemm_case g = {0};
        ab_case t = {0};
        if (kind == 0)
            case_make(&g, 301, 531, 517, 3, 800);
        else
            ab_make(&t, kind - 1, 301, 531, 517, 3, 810 + (uint64_t)kind);
        const size_t n = kind ? (size_t)(t.M * t.ldc) : (size_t)(g.M * g.ldy);
        float *first = malloc(sizeof(float) * n), *o = malloc(sizeof(float) * n);
        for (int k = 0; k < 4; k++) {
            mha_set_num_threads(threads[k]);
            blocks_run(b512, kind, &g, &t, k ? o : first);
            if (k && memcmp(first, o, sizeof(float) * n) != 0)
                test_fail(__FILE__, __LINE__, "avx512 block kind %d differs at %d threads", kind,
                          threads[k]);
        }
        mha_set_num_threads(0);
        free(first), free(o);
        if (kind == 0)
            case_free(&g);
        else
            ab_free(&t);
    }
}

/* y = bias + x w^T with the bias entering at the block's first k slice (y's
 * old values never read: NaN here) gives the bits of y filled with the bias
 * and then accumulated, on both blocks, with bias NULL as zero; guards kept.
 * Shapes cross the block edges and the k slices (K 257, 513). */
TEST(gemm_set_bias_in_block_matches_bias_filled) {
    if (!mha_cpu_has_avx2_fma())
        SKIP("gemm avx2 driver: this CPU lacks AVX2+FMA");
    const mha_gemm_isa *isas[2] = {&mha_gemm_isa_avx2,
                                   mha_avx512_runs() ? MHA_AVX512_PICK(mha_gemm_isa_avx512) : NULL};
    static const int64_t shapes[][4] = {/* M, N, K, pad */
                                        {1, 1, 1, 0},   {13, 33, 257, 1}, {12, 32, 256, 0},
                                        {25, 65, 513, 2}, {145, 97, 300, 1}, {7, 1536, 64, 0}};
    for (int b = 0; b < 2; b++) {
        if (!isas[b])
            continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            gemm_case g;
            case_make(&g, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], 900 + s);
            const size_t n = (size_t)(g.M * g.ldy);
            float *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                for (int64_t i = 0; i < g.M; i++)
                    for (int64_t j = 0; j < g.ldy; j++) {
                        want[i * g.ldy + j] = j >= g.N ? GUARD : with_bias ? g.bias[j] : 0.0f;
                        got[i * g.ldy + j] = j >= g.N ? GUARD : NAN;
                    }
                mha_gemm_f32_run(isas[b], want, g.ldy, g.x, g.ldx, g.w, g.ldw, g.M, g.N, g.K,
                                 NULL, 0);
                mha_gemm_f32_run(isas[b], got, g.ldy, g.x, g.ldx, g.w, g.ldw, g.M, g.N, g.K,
                                 with_bias ? g.bias : NULL, 1);
                if (memcmp(want, got, sizeof(float) * n) != 0)
                    test_fail(__FILE__, __LINE__, "block %d M=%lld N=%lld K=%lld bias %d: set "
                              "differs from bias-filled", b, (long long)g.M, (long long)g.N,
                              (long long)g.K, with_bias);
            }
            free(want), free(got);
            case_free(&g);
        }
    }
    if (!isas[1])
        SKIP_PART("the avx512 block: this CPU lacks AVX-512 (and it is not emulated here)");
}
