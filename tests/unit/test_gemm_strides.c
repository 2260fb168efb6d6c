/* test_gemm_strides.c - row strides below the row width on every GEMM path
 * (issue 12, defect 3).
 *
 * A broadcast view (stride 0, e.g. NumPy's x[:, None, :] for L = 1) or a
 * short stride (3 for rows of 8: overlapping rows, read-only) is a legal
 * input view; cblas_sgemm rejects ld < cols ("parameter number 10 had an
 * illegal value") and skips the product.  Each case runs the strided call
 * and the same call on a contiguous copy on one path (MHA_GEMM=blas|avx2|
 * portable, and the internal selector directly) and compares: equal
 * within 1e-5 (the unfixed blas path is off by O(1)).
 *
 * Letters: B batch, L query length, S key length, E model width, F hidden
 * width; M, N, K the GEMM's rows, outputs, inputs.
 */
#include "test.h"

#include "kernels/gemm.h"

static const char *const path_env[] = {"blas", "avx2", "portable"};
static const mha_gemm_path path_ids[] = {MHA_GEMM_BLAS, MHA_GEMM_AVX2, MHA_GEMM_PORTABLE};
#define TOL 1e-5

/* The path is available here (else the case reports itself skipped). */
static bool path_available(int i, const char *what) {
    if (mha_gemm_resolve(path_ids[i]) == path_ids[i])
        return true;
    printf("skipped: %s on the %s GEMM path (not in this build/CPU)\n", what, path_env[i]);
    return false;
}

/* Saves MHA_GEMM and sets it to path i; restore with gemm_env_restore. */
static char saved_env[64];
static bool had_env;
static void gemm_env_set(int i) {
    const char *old = getenv("MHA_GEMM");
    had_env = old != NULL;
    if (old)
        snprintf(saved_env, sizeof saved_env, "%s", old);
    setenv("MHA_GEMM", path_env[i], 1);
}
static void gemm_env_restore(void) {
    if (had_env)
        setenv("MHA_GEMM", saved_env, 1);
    else
        unsetenv("MHA_GEMM");
}

/* A view of `data` with an explicit shape and strides. */
static mha_tensor view(float *data, int ndim, const int64_t *shape, const int64_t *stride) {
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, data, ndim, shape);
    for (int i = 0; i < ndim; i++)
        t.stride[i] = stride[i];
    return t;
}

/* A contiguous copy of any view (malloc'd data; free t->data). */
static mha_tensor dense_copy(const mha_tensor *src) {
    mha_tensor t;
    int64_t n = 1;
    for (int i = 0; i < src->ndim; i++)
        n *= src->shape[i];
    float *d = malloc(sizeof(float) * (size_t)(n ? n : 1));
    mha_tensor_init(&t, MHA_F32, d, src->ndim, src->shape);
    for (int64_t e = 0; e < n; e++) {
        int64_t rem = e, off = 0;
        for (int i = src->ndim - 1; i >= 0; i--) {
            off += (rem % src->shape[i]) * src->stride[i];
            rem /= src->shape[i];
        }
        d[e] = ((const float *)src->data)[off];
    }
    return t;
}

static float *randf(int64_t n, uint64_t seed) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    test_randn(p, (size_t)n, seed);
    return p;
}

/* ---- the internal selector: every leading dimension, both products ------------ */

/* float64 y (M,N) = x (M,K) w^T with any strides. */
static void ref_linear(double *y, const float *x, int64_t ldx, const float *w, int64_t ldw,
                       int64_t M, int64_t N, int64_t K) {
    for (int64_t r = 0; r < M; r++)
        for (int64_t c = 0; c < N; c++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++)
                s += (double)x[r * ldx + k] * w[c * ldw + k];
            y[r * N + c] = s;
        }
}

static double err_vs(const float *y, int64_t ldy, const double *ref, int64_t M, int64_t N) {
    double worst = 0.0;
    for (int64_t r = 0; r < M; r++)
        for (int64_t c = 0; c < N; c++)
            worst = fmax(worst, fabs(y[r * ldy + c] - ref[r * N + c]) / fmax(1.0, fabs(ref[r * N + c])));
    return worst;
}

TEST(gemm_strides_selector_linear_and_ab) {
    /* {M, N, K, ldx, ldw, ldy}: broadcast single rows (0), overlapping rows (3 < K = 8) */
    static const int64_t cases[][6] = {
        {1, 8, 8, 0, 8, 0},   {1, 1, 8, 0, 0, 0},  {4, 8, 8, 3, 8, 8},  {4, 8, 8, 0, 8, 8},
        {5, 6, 8, 8, 0, 6},   {5, 6, 8, 8, 3, 6},  {3, 7, 1, 0, 1, 7},  {1, 5, 7, 2, 7, 1},
    };
    for (int p = 0; p < 3; p++) {
        if (!path_available(p, "selector strides"))
            continue;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const int64_t M = cases[c][0], N = cases[c][1], K = cases[c][2];
            const int64_t ldx = cases[c][3], ldw = cases[c][4], ldy = cases[c][5];
            float *x = randf((M - 1) * ldx + K, 10 + c), *w = randf((N - 1) * ldw + K, 20 + c);
            float *y = calloc((size_t)((M - 1) * ldy + N), sizeof(float));
            double *ref = malloc(sizeof(double) * (size_t)(M * N));
            ref_linear(ref, x, ldx, w, ldw, M, N, K);
            mha_linear_f32_path(path_ids[p], y, ldy, x, ldx, w, ldw, NULL, M, N, K, 0);
            double e = err_vs(y, ldy, ref, M, N);
            if (!(e <= TOL))
                test_fail(__FILE__, __LINE__, "linear %s case %zu: error %.3g", path_env[p], c, e);

            /* C (M,N) += A B with A (M,K) rows ldx apart, B (K,N) = w's first K*N view */
            const int64_t ldb = ldw; /* B (K,N) rows ldw apart: 0, short or full */
            float *b = randf((K - 1) * ldb + N, 30 + c);
            double *rab = malloc(sizeof(double) * (size_t)(M * N));
            for (int trans = 0; trans < 2; trans++) {
                /* trans: A stored (K,M) with rows lda apart; use lda = ldx
                 * over a buffer sized for it */
                const int64_t lda = ldx;
                float *a = randf(trans ? (K - 1) * lda + M : (M - 1) * lda + K, 40 + c);
                for (int64_t r = 0; r < M; r++)
                    for (int64_t j = 0; j < N; j++) {
                        double s = 0.0;
                        for (int64_t k = 0; k < K; k++)
                            s += (double)(trans ? a[k * lda + r] : a[r * lda + k]) * b[k * ldb + j];
                        rab[r * N + j] = s;
                    }
                float *cc = calloc((size_t)((M - 1) * ldy + N), sizeof(float));
                mha_gemm_f32_ab_path(path_ids[p], trans, cc, ldy, a, lda, b, ldb, M, N, K);
                e = err_vs(cc, ldy, rab, M, N);
                if (!(e <= TOL))
                    test_fail(__FILE__, __LINE__, "ab%s %s case %zu: error %.3g",
                              trans ? "^T" : "", path_env[p], c, e);
                free(a), free(cc);
            }
            free(x), free(w), free(y), free(ref), free(b), free(rab);
        }
    }
}

/* ---- multihead forward and backward with strided query/key/value/out ---------- */

typedef struct {
    int64_t B, L, S, E, H;
    int64_t q_row, k_row, wo_row; /* row strides of query, key/value, out_proj_weight */
} mh_strides;

static void check_close(const char *what, const char *path, const float *y, const float *ref,
                        int64_t n) {
    double e = test_rel_err(y, ref, (size_t)n);
    if (!(e <= TOL))
        test_fail(__FILE__, __LINE__, "%s (%s): error %.3g vs the contiguous run", what, path, e);
}

/* Runs forward_train + backward on views v[3] (query, key, value) with
 * out/dout/dquery of shape (B,L,E) and row stride o_row; writes out and the
 * input/weight gradients (dq, dk, dv, dW_in, dW_out). */
static mha_status mh_run(const mh_strides *c, const mha_tensor v[3], const mha_tensor *wo,
                         const mha_tensor *win, const mha_tensor *bin, int64_t o_row, float *out,
                         float *dq, float *dk, float *dvv, float *dwin, float *dwo,
                         const float *dout_data) {
    const int64_t B = c->B, L = c->L, S = c->S, E = c->E;
    const int64_t oshape[3] = {B, L, E}, ostride[3] = {L == 1 ? E : L * o_row, o_row, 1};
    mha_tensor O = view(out, 3, oshape, ostride);
    mha_tensor DO = view((float *)dout_data, 3, oshape, ostride);
    mha_tensor DQ = view(dq, 3, oshape, ostride);
    mha_tensor DK, DV, DWIN, DWO;
    mha_tensor_init(&DK, MHA_F32, dk, 3, (int64_t[]){B, S, E});
    mha_tensor_init(&DV, MHA_F32, dvv, 3, (int64_t[]){B, S, E});
    mha_tensor_init(&DWIN, MHA_F32, dwin, 2, (int64_t[]){3 * E, E});
    mha_tensor_init(&DWO, MHA_F32, dwo, 2, (int64_t[]){E, E});
    mha_multihead_weights w = {.in_proj_weight = win, .in_proj_bias = bin, .out_proj_weight = wo};
    mha_multihead_grads g = {.in_proj_weight = &DWIN, .out_proj_weight = &DWO};
    mha_multihead_options opt;
    mha_multihead_options_init(&opt);
    opt.num_heads = c->H;
    size_t bytes;
    mha_status st = mha_multihead_saved_size(B, L, S, E, c->H, 0, 0, &bytes);
    if (st != MHA_OK)
        return st;
    void *saved = malloc(bytes);
    st = mha_multihead_forward_train(&O, saved, bytes, &v[0], &v[1], &v[2], &w, &opt);
    if (st == MHA_OK)
        st = mha_multihead_backward(&DQ, &DK, &DV, &g, &DO, saved, bytes, &v[0], &v[1], &v[2], &w,
                                    &opt, NULL, 0);
    free(saved);
    if (st != MHA_OK)
        return st;
    /* the plain forward too: same result as the training forward */
    float *out2 = calloc((size_t)((B - 1) * ostride[0] + (L - 1) * o_row + E), sizeof(float));
    mha_tensor O2 = view(out2, 3, oshape, ostride);
    st = mha_multihead_forward(&O2, &v[0], &v[1], &v[2], &w, &opt);
    if (st == MHA_OK && memcmp(out, out2, sizeof(float) * (size_t)((B - 1) * ostride[0] + (L - 1) * o_row + E)))
        st = MHA_ERR_VALUE; /* the plain forward differs from the training one */
    free(out2);
    return st;
}

static void mh_case(const mh_strides *c) {
    const int64_t B = c->B, L = c->L, S = c->S, E = c->E;
    /* strided storage */
    const int64_t qs[3] = {L == 1 ? E : (L - 1) * c->q_row + E, c->q_row, 1};
    const int64_t ks[3] = {(S - 1) * c->k_row + E, c->k_row, 1};
    float *qd = randf(B * qs[0], 1), *kd = randf(B * ks[0], 2), *vd = randf(B * ks[0], 3);
    mha_tensor v[3] = {view(qd, 3, (int64_t[]){B, L, E}, qs), view(kd, 3, (int64_t[]){B, S, E}, ks),
                       view(vd, 3, (int64_t[]){B, S, E}, ks)};
    mha_tensor dense[3] = {dense_copy(&v[0]), dense_copy(&v[1]), dense_copy(&v[2])};
    float *wod = randf((E - 1) * c->wo_row + E, 4);
    mha_tensor WO = view(wod, 2, (int64_t[]){E, E}, (int64_t[]){c->wo_row, 1});
    mha_tensor WOd = dense_copy(&WO);
    mha_tensor WIN, BIN;
    float *wind = test_tensor(&WIN, 2, (int64_t[]){3 * E, E}, 5);
    float *bind = test_tensor(&BIN, 1, (int64_t[]){3 * E}, 6);
    for (int64_t i = 0; i < 3 * E * E; i++)
        wind[i] *= 0.3f;
    const int64_t n_out = B * L * E;
    float *dout = randf(n_out, 7);
    float *r[2][7]; /* [strided, dense]: out, dq, dk, dv, dwin, dwo, (unused) */
    const int64_t sizes[6] = {n_out, n_out, B * S * E, B * S * E, 3 * E * E, E * E};
    for (int p = 0; p < 3; p++) {
        if (!path_available(p, "multihead strided views"))
            continue;
        gemm_env_set(p);
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < 6; i++)
                r[s][i] = calloc((size_t)sizes[i], sizeof(float));
        /* out/dout/dquery: row stride 0 when L == 1 (a broadcast row), else E */
        mha_status st = mh_run(c, v, &WO, &WIN, &BIN, L == 1 ? 0 : E, r[0][0], r[0][1], r[0][2],
                               r[0][3], r[0][4], r[0][5], dout);
        mha_status sd = mh_run(c, dense, &WOd, &WIN, &BIN, E, r[1][0], r[1][1], r[1][2], r[1][3],
                               r[1][4], r[1][5], dout);
        gemm_env_restore();
        if (st != MHA_OK || sd != MHA_OK) {
            test_fail(__FILE__, __LINE__, "%s: %s / %s (%s)", path_env[p], mha_status_string(st),
                      mha_status_string(sd), mha_last_error());
        } else {
            static const char *const names[6] = {"out", "dquery", "dkey", "dvalue",
                                                 "d in_proj_weight", "d out_proj_weight"};
            for (int i = 0; i < 6; i++)
                check_close(names[i], path_env[p], r[0][i], r[1][i], sizes[i]);
        }
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < 6; i++)
                free(r[s][i]);
    }
    for (int i = 0; i < 3; i++)
        free(dense[i].data);
    free(qd), free(kd), free(vd), free(wod), free(WOd.data), free(wind), free(bind), free(dout);
}

TEST(gemm_strides_multihead_broadcast_query_l1) {
    /* x[:, None, :]: query and out (B,1,E) with row stride 0 */
    mh_case(&(mh_strides){.B = 2, .L = 1, .S = 5, .E = 8, .H = 2, .q_row = 0, .k_row = 8, .wo_row = 8});
}

TEST(gemm_strides_multihead_short_query_stride) {
    /* query rows 3 floats apart for E = 8 (overlapping rows) */
    mh_case(&(mh_strides){.B = 2, .L = 4, .S = 3, .E = 8, .H = 2, .q_row = 3, .k_row = 8, .wo_row = 8});
}

TEST(gemm_strides_multihead_broadcast_key_and_weight) {
    /* key/value: one row broadcast over S = 6 (stride 0); out_proj_weight
     * rows 3 apart (a projection BLAS cannot describe) */
    mh_case(&(mh_strides){.B = 3, .L = 2, .S = 6, .E = 8, .H = 4, .q_row = 8, .k_row = 0, .wo_row = 3});
}

/* ---- Linear and MLP: size-1 dimensions with any stride ------------------------ */

TEST(gemm_strides_linear_and_mlp_size1_dims) {
    const int64_t E = 8, F = 12, B = 3;
    mha_tensor W1, W2, B1, B2, W;
    float *w1 = test_tensor(&W1, 2, (int64_t[]){F, E}, 51);
    float *w2 = test_tensor(&W2, 2, (int64_t[]){E, F}, 52);
    float *b1 = test_tensor(&B1, 1, (int64_t[]){F}, 53);
    float *b2 = test_tensor(&B2, 1, (int64_t[]){E}, 54);
    /* a one-row weight whose row stride is 0 */
    float *w = randf(E, 55);
    W = view(w, 2, (int64_t[]){1, E}, (int64_t[]){0, 1});
    mha_tensor Wd = dense_copy(&W);
    /* x (B,1,E) broadcast middle dim, stride 0 */
    float *xd = randf(B * E, 56);
    mha_tensor X = view(xd, 3, (int64_t[]){B, 1, E}, (int64_t[]){E, 0, 1});
    mha_tensor Xd = dense_copy(&X);
    mha_mlp_weights mw = {&W1, &B1, &W2, &B2, NULL, NULL};
    for (int p = 0; p < 3; p++) {
        if (!path_available(p, "linear/mlp strided views"))
            continue;
        gemm_env_set(p);
        float *y[2], *h[2], *dx[2], *dw1[2], *dw2[2], *dwl[2];
        for (int s = 0; s < 2; s++) {
            const mha_tensor *x = s ? &Xd : &X;
            y[s] = calloc((size_t)(B * E), sizeof(float));
            h[s] = calloc((size_t)B, sizeof(float));
            dx[s] = calloc((size_t)(B * E), sizeof(float));
            dw1[s] = calloc((size_t)(F * E), sizeof(float));
            dw2[s] = calloc((size_t)(E * F), sizeof(float));
            dwl[s] = calloc((size_t)E, sizeof(float));
            mha_tensor Y = view(y[s], 3, (int64_t[]){B, 1, E}, (int64_t[]){E, s ? 1 : 0, 1});
            mha_tensor Hh = view(h[s], 3, (int64_t[]){B, 1, 1}, (int64_t[]){1, 0, 0});
            mha_tensor DX = view(dx[s], 3, (int64_t[]){B, 1, E}, (int64_t[]){E, s ? E : 0, 1});
            mha_tensor DW1, DW2, DWL, DH;
            mha_tensor_init(&DW1, MHA_F32, dw1[s], 2, (int64_t[]){F, E});
            mha_tensor_init(&DW2, MHA_F32, dw2[s], 2, (int64_t[]){E, F});
            DWL = view(dwl[s], 2, (int64_t[]){1, E}, (int64_t[]){s ? E : 0, 1});
            float ones[3] = {1.0f, -0.5f, 2.0f};
            DH = view(ones, 3, (int64_t[]){B, 1, 1}, (int64_t[]){1, 0, 0});
            mha_mlp_grads mg = {&DW1, NULL, &DW2, NULL, NULL, NULL};
            CHECK_STATUS(mha_linear_forward(&Hh, x, s ? &Wd : &W, NULL), MHA_OK);
            CHECK_STATUS(mha_mlp_forward(&Y, x, &mw, MHA_ACT_GELU, NULL, 0), MHA_OK);
            CHECK_STATUS(mha_mlp_backward(&DX, &mg, &Y, x, &mw, MHA_ACT_GELU, NULL, 0), MHA_OK);
            CHECK_STATUS(mha_linear_backward(NULL, &DWL, NULL, &DH, x, s ? &Wd : &W), MHA_OK);
        }
        gemm_env_restore();
        check_close("linear out", path_env[p], h[0], h[1], B);
        check_close("mlp out", path_env[p], y[0], y[1], B * E);
        check_close("mlp dx", path_env[p], dx[0], dx[1], B * E);
        check_close("mlp dw1", path_env[p], dw1[0], dw1[1], F * E);
        check_close("mlp dw2", path_env[p], dw2[0], dw2[1], E * F);
        check_close("linear dweight", path_env[p], dwl[0], dwl[1], E);
        /* and the values are right, not merely equal: linear out vs float64 */
        double ref[3];
        ref_linear(ref, xd, E, w, 0, B, 1, E);
        CHECK(err_vs(h[0], 1, ref, B, 1) <= TOL);
        for (int s = 0; s < 2; s++)
            free(y[s]), free(h[s]), free(dx[s]), free(dw1[s]), free(dw2[s]), free(dwl[s]);
    }
    free(w1), free(w2), free(b1), free(b2), free(w), free(xd), free(Xd.data), free(Wd.data);
}
