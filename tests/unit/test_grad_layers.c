/* test_grad_layers.c - backward passes of the Transformer-layer pieces.
 *
 * Three checks per op, on small odd shapes:
 *  1. the float64 reference backward (*_ref) against central finite
 *     differences of a float64 forward written here: the loss is
 *     L = sum(c * y) for a fixed random c (= dout), accumulated in double;
 *     step h = 1e-5 on a float64 copy of every input, tolerance
 *     max|g - fd| <= 1e-5 * max(1, max|fd|) (truncation ~h^2, rounding
 *     ~1e-16/h, the reference's float rounding ~6e-8 dominate);
 *  2. the float32 kernel against the reference: same normalised error
 *     <= 2e-5 (float accumulation);
 *  3. bit-identical results for 1, 2 and 3 threads, and the public entry
 *     points (accumulate, NULL skips, errors).
 */
#include "test.h"
#include "layers.h"

#define FD_STEP 1e-5
#define FD_TOL 1e-5
#define F32_TOL 2e-5

/* ---- helpers ---------------------------------------------------------------- */

static double *to_double(const float *x, int64_t n) {
    double *d = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

static float *randf(int64_t n, uint64_t seed, float scale) {
    float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
    test_randn(x, (size_t)n, seed);
    for (int64_t i = 0; i < n; i++)
        x[i] *= scale;
    return x;
}

static float *zerof(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }

/* max|g - fd| / max(1, max|fd|) */
static double grad_err(const float *g, const double *fd, int64_t n) {
    double worst = 0.0, top = 1.0;
    for (int64_t i = 0; i < n; i++) {
        top = fmax(top, fabs(fd[i]));
        worst = fmax(worst, fabs(g[i] - fd[i]));
    }
    return worst / top;
}

/* A double-precision problem: loss(ctx) reads the double inputs. */
typedef double (*loss_fn)(void *ctx);

/* Central differences of loss over the n entries of p. */
static double *finite_diff(loss_fn loss, void *ctx, double *p, int64_t n) {
    double *fd = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        const double keep = p[i];
        p[i] = keep + FD_STEP;
        const double lp = loss(ctx);
        p[i] = keep - FD_STEP;
        const double lm = loss(ctx);
        p[i] = keep;
        fd[i] = (lp - lm) / (2.0 * FD_STEP);
    }
    return fd;
}

/* Checks analytic gradient g (n) of parameter p against finite differences. */
static bool fd_ok(const char *what, loss_fn loss, void *ctx, double *p, const float *g,
                  int64_t n) {
    double *fd = finite_diff(loss, ctx, p, n);
    double e = grad_err(g, fd, n);
    free(fd);
    if (!(e <= FD_TOL))
        printf("    %s: finite-difference error %.3g\n", what, e);
    return e <= FD_TOL;
}

static bool close_ok(const char *what, const float *y, const float *ref, int64_t n) {
    double e = test_rel_err(y, ref, (size_t)n);
    if (!(e <= F32_TOL))
        printf("    %s: f32 vs reference error %.3g\n", what, e);
    return e <= F32_TOL;
}

/* ---- double forwards ------------------------------------------------------------ */

typedef struct prob {
    int64_t N, E, F;
    double *x, *w, *b, *c; /* input, weight, bias, loss coefficients */
    double *w2, *b2, *w3, *b3;
    float eps;
    mha_activation act;
    int gated, has_w, has_b;
    float p; /* dropout */
} prob;

static double loss_linear(void *ctx) {
    prob *q = ctx;
    double L = 0.0;
    for (int64_t r = 0; r < q->N; r++)
        for (int64_t f = 0; f < q->F; f++) {
            double y = q->has_b ? q->b[f] : 0.0;
            for (int64_t k = 0; k < q->E; k++)
                y += q->x[r * q->E + k] * q->w[f * q->E + k];
            L += q->c[r * q->F + f] * y;
        }
    return L;
}

static double loss_norm(void *ctx, bool rms) {
    prob *q = ctx;
    double L = 0.0;
    for (int64_t r = 0; r < q->N; r++) {
        const double *x = q->x + r * q->E;
        double mean = 0.0, var = 0.0;
        if (!rms) {
            for (int64_t c = 0; c < q->E; c++)
                mean += x[c];
            mean /= (double)q->E;
        }
        for (int64_t c = 0; c < q->E; c++)
            var += (x[c] - mean) * (x[c] - mean);
        var /= (double)q->E;
        for (int64_t c = 0; c < q->E; c++) {
            double y = (x[c] - mean) / sqrt(var + q->eps);
            y = y * (q->has_w ? q->w[c] : 1.0) + (q->has_b && !rms ? q->b[c] : 0.0);
            L += q->c[r * q->E + c] * y;
        }
    }
    return L;
}
static double loss_layernorm(void *ctx) { return loss_norm(ctx, false); }
static double loss_rmsnorm(void *ctx) { return loss_norm(ctx, true); }

static double loss_act(void *ctx) {
    prob *q = ctx;
    double L = 0.0;
    for (int64_t i = 0; i < q->N * q->E; i++)
        L += q->c[i] * mha_activation_ref(q->x[i], q->act);
    return L;
}

static double loss_mlp(void *ctx) {
    prob *q = ctx;
    const int64_t E = q->E, F = q->F;
    double L = 0.0;
    for (int64_t r = 0; r < q->N; r++)
        for (int64_t f = 0; f < F; f++) {
            double a = q->has_b ? q->b[f] : 0.0, g = q->gated && q->has_b ? q->b3[f] : 0.0;
            for (int64_t c = 0; c < E; c++) {
                a += q->x[r * E + c] * q->w[f * E + c];
                if (q->gated)
                    g += q->x[r * E + c] * q->w3[f * E + c];
            }
            double h = mha_activation_ref(a, q->act) * (q->gated ? g : 1.0);
            if (q->p > 0.0f)
                h = mha_dropout_keep(7, 3, r * F + f, q->p) ? h / (1.0 - q->p) : 0.0;
            for (int64_t o = 0; o < E; o++)
                L += q->c[r * E + o] * h * q->w2[o * F + f];
        }
    for (int64_t r = 0; r < q->N && q->has_b; r++)
        for (int64_t o = 0; o < E; o++)
            L += q->c[r * E + o] * q->b2[o];
    return L;
}

/* ---- linear ------------------------------------------------------------------------ */

TEST(grad_linear_fd_reference_f32) {
    const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {7, 3, 2}, {5, 13, 11}, {2, 1, 9}};
    for (int s = 0; s < 5; s++)
        for (int has_b = 0; has_b < 2; has_b++) {
            const int64_t N = shapes[s][0], K = shapes[s][1], F = shapes[s][2];
            float *x = randf(N * K, 1 + s, 1.0f), *w = randf(F * K, 2 + s, 0.5f),
                  *c = randf(N * F, 3 + s, 1.0f);
            float *dx = zerof(N * K), *dw = zerof(F * K), *db = zerof(F);
            float *fx = zerof(N * K), *fw = zerof(F * K), *fb = zerof(F);
            mha_linear_backward_ref(dx, dw, has_b ? db : NULL, c, x, w, N, F, K);
            prob q = {.N = N, .E = K, .F = F, .x = to_double(x, N * K), .w = to_double(w, F * K),
                      .b = calloc((size_t)F, sizeof(double)), .c = to_double(c, N * F),
                      .has_b = has_b};
            CHECK(fd_ok("linear dx", loss_linear, &q, q.x, dx, N * K));
            CHECK(fd_ok("linear dw", loss_linear, &q, q.w, dw, F * K));
            if (has_b)
                CHECK(fd_ok("linear db", loss_linear, &q, q.b, db, F));
            mha_linear_backward_f32(fx, fw, has_b ? fb : NULL, c, x, w, N, F, K);
            CHECK(close_ok("linear dx", fx, dx, N * K));
            CHECK(close_ok("linear dw", fw, dw, F * K));
            CHECK(close_ok("linear db", fb, db, F));
            free(q.x), free(q.w), free(q.b), free(q.c);
            free(x), free(w), free(c), free(dx), free(dw), free(db), free(fx), free(fw), free(fb);
        }
}

/* ---- norms ---------------------------------------------------------------------------- */

TEST(grad_norms_fd_reference_f32) {
    const int64_t shapes[][2] = {{1, 1}, {3, 2}, {5, 7}, {2, 33}, {4, 5}};
    for (int s = 0; s < 5; s++)
        for (int variant = 0; variant < 4; variant++)
            for (int rms = 0; rms < 2; rms++) {
                const int64_t N = shapes[s][0], E = shapes[s][1];
                const int has_w = variant & 1, has_b = (variant & 2) && !rms;
                if (rms && (variant & 2))
                    continue;
                if (E == 1 && !rms)
                    continue; /* LayerNorm of one element is constant: fd is 0/0-ish */
                float *x = randf(N * E, 10 + s, 2.0f), *w = randf(E, 11 + s, 1.0f),
                      *b = randf(E, 12 + s, 1.0f), *c = randf(N * E, 13 + s, 1.0f);
                for (int64_t i = 0; i < N * E; i++)
                    x[i] += 3.0f; /* an offset mean */
                float *dx = zerof(N * E), *dw = zerof(E), *db = zerof(E);
                float *fx = zerof(N * E), *fw = zerof(E), *fb = zerof(E);
                const float eps = 1e-5f;
                const float *wp = has_w ? w : NULL;
                if (rms) {
                    mha_rmsnorm_backward_ref(dx, has_w ? dw : NULL, c, x, wp, N, E, eps);
                    mha_rmsnorm_backward_f32(fx, has_w ? fw : NULL, c, x, wp, N, E, eps);
                } else {
                    mha_layernorm_backward_ref(dx, has_w ? dw : NULL, has_b ? db : NULL, c, x, wp,
                                               N, E, eps);
                    mha_layernorm_backward_f32(fx, has_w ? fw : NULL, has_b ? fb : NULL, c, x, wp,
                                               N, E, eps);
                }
                prob q = {.N = N, .E = E, .x = to_double(x, N * E), .w = to_double(w, E),
                          .b = to_double(b, E), .c = to_double(c, N * E), .eps = eps,
                          .has_w = has_w, .has_b = has_b};
                loss_fn L = rms ? loss_rmsnorm : loss_layernorm;
                CHECK(fd_ok(rms ? "rmsnorm dx" : "layernorm dx", L, &q, q.x, dx, N * E));
                if (has_w)
                    CHECK(fd_ok("norm dw", L, &q, q.w, dw, E));
                if (has_b)
                    CHECK(fd_ok("norm db", L, &q, q.b, db, E));
                CHECK(close_ok("norm dx", fx, dx, N * E));
                CHECK(close_ok("norm dw", fw, dw, E));
                CHECK(close_ok("norm db", fb, db, E));
                free(q.x), free(q.w), free(q.b), free(q.c);
                free(x), free(w), free(b), free(c), free(dx), free(dw), free(db), free(fx),
                    free(fw), free(fb);
            }
}

/* ---- activations ------------------------------------------------------------------------ */

TEST(grad_activations_fd_reference_f32) {
    enum { n = 301 };
    float x[n], c[n], dx[n], fx[n];
    test_randn(c, n, 21);
    for (int i = 0; i < n; i++)
        x[i] = -6.0f + 12.0f * (float)i / (n - 1) + 0.0173f; /* no sample at ReLU's kink */
    for (int a = MHA_ACT_RELU; a <= MHA_ACT_SILU; a++) {
        memset(dx, 0, sizeof dx), memset(fx, 0, sizeof fx);
        for (int i = 0; i < n; i++)
            dx[i] = (float)(c[i] * mha_activation_grad_ref(x[i], (mha_activation)a));
        mha_activation_backward_f32(fx, c, x, n, (mha_activation)a);
        prob q = {.N = 1, .E = n, .x = to_double(x, n), .c = to_double(c, n),
                  .act = (mha_activation)a};
        CHECK(fd_ok(mha_activation_name((mha_activation)a), loss_act, &q, q.x, dx, n));
        CHECK(close_ok(mha_activation_name((mha_activation)a), fx, dx, n));
        free(q.x), free(q.c);
    }
    /* ReLU'(0) = 0 as torch's threshold_backward; NaN input gives 0 too */
    CHECK(mha_activation_grad_ref(0.0, MHA_ACT_RELU) == 0.0);
}

/* ---- MLP and SwiGLU ---------------------------------------------------------------------- */

TEST(grad_mlp_fd_reference_f32) {
    const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {4, 9, 13}, {2, 3, 2}};
    for (int s = 0; s < 4; s++)
        for (int gated = 0; gated < 2; gated++)
            for (int has_b = 0; has_b < 2; has_b++)
                for (int a = MHA_ACT_RELU; a <= MHA_ACT_SILU; a++) {
                    const int64_t N = shapes[s][0], E = shapes[s][1], F = shapes[s][2];
                    const mha_activation act = gated ? MHA_ACT_SILU : (mha_activation)a;
                    if (gated && a != MHA_ACT_RELU)
                        continue; /* SwiGLU: SiLU only, once */
                    float *x = randf(N * E, 31 + s, 1.0f), *w1 = randf(F * E, 32 + s, 0.5f),
                          *b1 = randf(F, 33 + s, 0.5f), *w2 = randf(E * F, 34 + s, 0.5f),
                          *b2 = randf(E, 35 + s, 0.5f), *w3 = randf(F * E, 36 + s, 0.5f),
                          *b3 = randf(F, 37 + s, 0.5f), *c = randf(N * E, 38 + s, 1.0f);
                    mha_mlp_raw m = {E, F, w1, has_b ? b1 : NULL, w2, has_b ? b2 : NULL,
                                     gated ? w3 : NULL, gated && has_b ? b3 : NULL};
                    float *g[7], *h[7]; /* dx dw1 db1 dw2 db2 dw3 db3 */
                    const int64_t sz[7] = {N * E, F * E, F, E * F, E, F * E, F};
                    for (int k = 0; k < 7; k++)
                        g[k] = zerof(sz[k]), h[k] = zerof(sz[k]);
                    mha_mlp_raw_grads rg = {g[1], has_b ? g[2] : NULL, g[3], has_b ? g[4] : NULL,
                                            gated ? g[5] : NULL, gated && has_b ? g[6] : NULL};
                    mha_mlp_raw_grads fg = {h[1], has_b ? h[2] : NULL, h[3], has_b ? h[4] : NULL,
                                            gated ? h[5] : NULL, gated && has_b ? h[6] : NULL};
                    mha_mlp_backward_ref(g[0], &rg, c, x, N, &m, act);
                    float *ws = malloc(sizeof(float) * (size_t)mha_mlp_backward_floats(N, F, gated));
                    mha_mlp_backward_f32(h[0], &fg, c, x, N, &m, act, ws, 0.0f, 0, 0);
                    prob q = {.N = N, .E = E, .F = F, .x = to_double(x, N * E),
                              .w = to_double(w1, F * E), .b = to_double(b1, F),
                              .w2 = to_double(w2, E * F), .b2 = to_double(b2, E),
                              .w3 = to_double(w3, F * E), .b3 = to_double(b3, F),
                              .c = to_double(c, N * E), .act = act, .gated = gated,
                              .has_b = has_b};
                    double *ps[7] = {q.x, q.w, q.b, q.w2, q.b2, q.w3, q.b3};
                    const char *names[7] = {"dx", "dw1", "db1", "dw2", "db2", "dw3", "db3"};
                    for (int k = 0; k < 7; k++) {
                        if ((k == 2 || k == 4 || k == 6) && !has_b)
                            continue;
                        if (k >= 5 && !gated)
                            continue;
                        CHECK(fd_ok(names[k], loss_mlp, &q, ps[k], g[k], sz[k]));
                        CHECK(close_ok(names[k], h[k], g[k], sz[k]));
                    }
                    for (int k = 0; k < 7; k++)
                        free(g[k]), free(h[k]), free(ps[k]);
                    free(q.c), free(ws);
                    free(x), free(w1), free(b1), free(w2), free(b2), free(w3), free(b3), free(c);
                }
}

/* The MLP with dropout on the hidden units: the same keep decisions as the
 * forward (finite differences of the double forward with the same mask). */
TEST(grad_mlp_dropout_fd) {
    for (int gated = 0; gated < 2; gated++) {
        const int64_t N = 5, E = 7, F = 11;
        const float p = 0.3f;
        float *x = randf(N * E, 41, 1.0f), *w1 = randf(F * E, 42, 0.5f), *b1 = randf(F, 43, 0.5f),
              *w2 = randf(E * F, 44, 0.5f), *b2 = randf(E, 45, 0.5f),
              *w3 = randf(F * E, 46, 0.5f), *b3 = randf(F, 47, 0.5f), *c = randf(N * E, 48, 1.0f);
        mha_activation act = gated ? MHA_ACT_SILU : MHA_ACT_GELU;
        mha_mlp_raw m = {E, F, w1, b1, w2, b2, gated ? w3 : NULL, gated ? b3 : NULL};
        float *dx = zerof(N * E), *dw1 = zerof(F * E), *dw3 = zerof(F * E), *db2 = zerof(E);
        mha_mlp_raw_grads g = {dw1, NULL, NULL, db2, gated ? dw3 : NULL, NULL};
        float *ws = malloc(sizeof(float) * (size_t)mha_mlp_backward_floats(N, F, gated));
        mha_mlp_backward_f32(dx, &g, c, x, N, &m, act, ws, p, 7, 3);
        prob q = {.N = N, .E = E, .F = F, .x = to_double(x, N * E), .w = to_double(w1, F * E),
                  .b = to_double(b1, F), .w2 = to_double(w2, E * F), .b2 = to_double(b2, E),
                  .w3 = to_double(w3, F * E), .b3 = to_double(b3, F), .c = to_double(c, N * E),
                  .act = act, .gated = gated, .has_b = 1, .p = p};
        /* f32 path against fd directly: float accumulation, looser bound */
        double *fd = finite_diff(loss_mlp, &q, q.x, N * E);
        CHECK(grad_err(dx, fd, N * E) < 1e-4);
        free(fd);
        fd = finite_diff(loss_mlp, &q, q.w, F * E);
        CHECK(grad_err(dw1, fd, F * E) < 1e-4);
        free(fd);
        if (gated) {
            fd = finite_diff(loss_mlp, &q, q.w3, F * E);
            CHECK(grad_err(dw3, fd, F * E) < 1e-4);
            free(fd);
        }
        fd = finite_diff(loss_mlp, &q, q.b2, E);
        CHECK(grad_err(db2, fd, E) < 1e-4);
        free(fd);
        free(q.x), free(q.w), free(q.b), free(q.w2), free(q.b2), free(q.w3), free(q.b3), free(q.c);
        free(x), free(w1), free(b1), free(w2), free(b2), free(w3), free(b3), free(c), free(dx),
            free(dw1), free(dw3), free(db2), free(ws);
    }
}

/* ---- dropout and residual ------------------------------------------------------------ */

TEST(grad_dropout_same_keep_as_forward) {
    enum { n = 5003 };
    float *x = randf(n, 51, 1.0f), *y = zerof(n), *c = randf(n, 52, 1.0f), *dx = zerof(n);
    mha_dropout_f32(y, x, n, 0.4f, 9, 2);
    mha_dropout_backward_f32(dx, c, n, 0.4f, 9, 2);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        /* y is linear in x: dy/dx = y/x exactly where x != 0 */
        float want = y[i] == 0.0f ? 0.0f : c[i] / 0.6f;
        if (fabsf(dx[i] - want) > 1e-6f * fabsf(want))
            bad++;
    }
    CHECK(bad == 0);
    /* public: not training is identity, p validated */
    mha_tensor D, C;
    mha_tensor_init(&D, MHA_F32, dx, 1, (int64_t[]){n});
    mha_tensor_init(&C, MHA_F32, c, 1, (int64_t[]){n});
    memset(dx, 0, sizeof(float) * n);
    CHECK_STATUS(mha_dropout_backward(&D, &C, 0.4f, 0, 9, 2), MHA_OK);
    CHECK(memcmp(dx, c, sizeof(float) * n) == 0);
    CHECK_STATUS(mha_dropout_backward(&D, &C, 1.0f, 1, 9, 2), MHA_ERR_VALUE);
    CHECK_STATUS(mha_dropout_backward(&D, &D, 0.4f, 1, 9, 2), MHA_ERR_ALIAS);
    free(x), free(y), free(c), free(dx);
}

TEST(grad_residual_accumulates) {
    float a[6] = {1, 1, 1, 1, 1, 1}, b[6] = {0}, g[6] = {1, 2, 3, 4, 5, 6};
    mha_tensor A, B, G;
    mha_tensor_init(&A, MHA_F32, a, 2, (int64_t[]){2, 3});
    mha_tensor_init(&B, MHA_F32, b, 2, (int64_t[]){2, 3});
    mha_tensor_init(&G, MHA_F32, g, 2, (int64_t[]){2, 3});
    CHECK_STATUS(mha_residual_backward(&A, &B, &G), MHA_OK);
    CHECK_STATUS(mha_residual_backward(NULL, &B, &G), MHA_OK);
    for (int i = 0; i < 6; i++)
        CHECK(a[i] == 1 + g[i] && b[i] == 2 * g[i]);
    mha_tensor wrong;
    mha_tensor_init(&wrong, MHA_F32, b, 2, (int64_t[]){3, 2});
    CHECK_STATUS(mha_residual_backward(&A, &wrong, &G), MHA_ERR_SHAPE);
}

/* ---- public entry points: accumulate, NULL skips, errors -------------------------------- */

TEST(grad_public_entry_points) {
    const int64_t N = 4, E = 5, F = 6;
    mha_tensor X, W, DOUT, DX, DW, DB, LW, DLW, DLB, DN;
    float *x = test_tensor(&X, 2, (int64_t[]){N, E}, 61);
    float *w = test_tensor(&W, 2, (int64_t[]){F, E}, 62);
    float *dout = test_tensor(&DOUT, 2, (int64_t[]){N, F}, 63);
    float *dx = test_tensor(&DX, 2, (int64_t[]){N, E}, 64);
    float *dw = test_tensor(&DW, 2, (int64_t[]){F, E}, 65);
    float *db = test_tensor(&DB, 1, (int64_t[]){F}, 66);
    float *keep = malloc(sizeof(float) * N * E), *rx = malloc(sizeof(float) * N * E);
    memcpy(keep, dx, sizeof(float) * N * E);
    memcpy(rx, dx, sizeof(float) * N * E);
    /* accumulate: the public call adds to what is there */
    CHECK_STATUS(mha_linear_backward(&DX, &DW, &DB, &DOUT, &X, &W), MHA_OK);
    mha_linear_backward_ref(rx, NULL, NULL, dout, x, w, N, F, E);
    CHECK(test_rel_err(dx, rx, N * E) < 1e-5);
    CHECK_STATUS(mha_linear_backward(NULL, NULL, NULL, &DOUT, &X, &W), MHA_OK);
    CHECK_STATUS(mha_linear_backward(&DX, NULL, NULL, &DX, &X, &W), MHA_ERR_SHAPE);
    CHECK_STATUS(mha_linear_backward(&X, NULL, NULL, &DOUT, &X, &W), MHA_ERR_ALIAS);
    CHECK_STATUS(mha_linear_backward(&DX, &DB, NULL, &DOUT, &X, &W), MHA_ERR_SHAPE);

    /* norms */
    float *lw = test_tensor(&LW, 1, (int64_t[]){E}, 67);
    float *dlw = test_tensor(&DLW, 1, (int64_t[]){E}, 68);
    float *dlb = test_tensor(&DLB, 1, (int64_t[]){E}, 69);
    float *dn = test_tensor(&DN, 2, (int64_t[]){N, E}, 70);
    CHECK_STATUS(mha_layernorm_backward(&DX, &DLW, &DLB, &DN, &X, &LW, 1e-5f), MHA_OK);
    CHECK_STATUS(mha_layernorm_backward(&DX, NULL, NULL, &DN, &X, NULL, 1e-5f), MHA_OK);
    CHECK_STATUS(mha_layernorm_backward(&DX, &DLW, &DLB, &DN, &X, &LW, 0.0f), MHA_ERR_VALUE);
    CHECK_STATUS(mha_layernorm_backward(&DX, &DB, NULL, &DN, &X, &LW, 1e-5f), MHA_ERR_SHAPE);
    CHECK_STATUS(mha_rmsnorm_backward(&DX, &DLW, &DN, &X, &LW, 1e-6f), MHA_OK);
    CHECK_STATUS(mha_rmsnorm_backward(&DN, &DLW, &DN, &X, &LW, 1e-6f), MHA_ERR_ALIAS);
    CHECK_STATUS(mha_activation_backward(&DX, &DN, &X, MHA_ACT_GELU), MHA_OK);
    CHECK_STATUS(mha_activation_backward(&DX, &DN, &X, (mha_activation)9), MHA_ERR_VALUE);
    CHECK_STATUS(mha_activation_backward(&DX, &DX, &X, MHA_ACT_GELU), MHA_ERR_ALIAS);

    /* MLP: planned workspace allocates nothing; too small is refused */
    mha_tensor W1, W2, DW1, DW2, DB2, DY;
    float *w1 = test_tensor(&W1, 2, (int64_t[]){F, E}, 71);
    float *w2 = test_tensor(&W2, 2, (int64_t[]){E, F}, 72);
    float *dw1 = test_tensor(&DW1, 2, (int64_t[]){F, E}, 73);
    float *dw2 = test_tensor(&DW2, 2, (int64_t[]){E, F}, 74);
    float *db2 = test_tensor(&DB2, 1, (int64_t[]){E}, 75);
    float *dy = test_tensor(&DY, 2, (int64_t[]){N, E}, 76);
    mha_mlp_weights mw = {&W1, NULL, &W2, NULL, NULL, NULL};
    mha_mlp_grads mg = {&DW1, NULL, &DW2, NULL, NULL, NULL};
    size_t bytes;
    CHECK_STATUS(mha_mlp_backward_workspace_size(N, F, 0, &bytes), MHA_OK);
    void *ws = malloc(bytes);
    int64_t before = mha_test_alloc_count();
    CHECK_STATUS(mha_mlp_backward(&DX, &mg, &DY, &X, &mw, MHA_ACT_RELU, ws, bytes), MHA_OK);
    CHECK(mha_test_alloc_count() == before);
    CHECK_STATUS(mha_mlp_backward(&DX, &mg, &DY, &X, &mw, MHA_ACT_RELU, ws, bytes - 4),
                 MHA_ERR_VALUE);
    CHECK_STATUS(mha_mlp_backward(&DX, &mg, &DY, &X, &mw, MHA_ACT_RELU, NULL, 0), MHA_OK);
    mha_mlp_grads bad = {&DW1, NULL, &DW2, &DB2, &DW1, NULL}; /* no linear3 weight */
    CHECK_STATUS(mha_mlp_backward(&DX, &bad, &DY, &X, &mw, MHA_ACT_RELU, NULL, 0), MHA_ERR_VALUE);
    free(ws);
    free(x), free(w), free(dout), free(dx), free(dw), free(db), free(keep), free(rx), free(lw),
        free(dlw), free(dlb), free(dn), free(w1), free(w2), free(dw1), free(dw2), free(db2),
        free(dy);
}

/* ---- thread count never changes a bit -------------------------------------------------- */

TEST(grad_layers_bit_identical_threads) {
    const int64_t N = 67, E = 45, F = 131;
    float *x = randf(N * E, 81, 1.0f), *w1 = randf(F * E, 82, 0.3f), *w2 = randf(E * F, 83, 0.3f),
          *w3 = randf(F * E, 84, 0.3f), *b = randf(F, 85, 0.3f), *c = randf(N * E, 86, 1.0f);
    mha_mlp_raw m = {E, F, w1, b, w2, NULL, w3, NULL};
    float *ws = malloc(sizeof(float) * (size_t)mha_mlp_backward_floats(N, F, true));
    float *out[3][5];
    const int threads[3] = {1, 2, 3};
    const int old = mha_get_num_threads();
    for (int t = 0; t < 3; t++) {
        mha_set_num_threads(threads[t]);
        float *dx = zerof(N * E), *dw1 = zerof(F * E), *dw3 = zerof(F * E), *db1 = zerof(F),
              *dln = zerof(E);
        mha_mlp_raw_grads g = {dw1, db1, NULL, NULL, dw3, NULL};
        mha_mlp_backward_f32(dx, &g, c, x, N, &m, MHA_ACT_SILU, ws, 0.1f, 3, 4);
        mha_layernorm_backward_f32(dx, dln, NULL, c, x, b, N, E, 1e-5f);
        out[t][0] = dx, out[t][1] = dw1, out[t][2] = dw3, out[t][3] = db1, out[t][4] = dln;
    }
    mha_set_num_threads(old);
    const int64_t sz[5] = {N * E, F * E, F * E, F, E};
    for (int t = 1; t < 3; t++)
        for (int k = 0; k < 5; k++)
            CHECK(memcmp(out[0][k], out[t][k], sizeof(float) * (size_t)sz[k]) == 0);
    for (int t = 0; t < 3; t++)
        for (int k = 0; k < 5; k++)
            free(out[t][k]);
    free(x), free(w1), free(w2), free(w3), free(b), free(c), free(ws);
}
