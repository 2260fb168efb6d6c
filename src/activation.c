/* activation.c - elementwise pieces of the Transformer block: activations
 * (ReLU, GELU exact and tanh, SiLU), the residual add, seeded dropout, and
 * the checks on row tensors the layer files share.
 *
 * Letter legend: N rows, E width, n = N*E elements.
 */
#include "layers.h"

#include <math.h>
#include <string.h>

/* ---- row tensors --------------------------------------------------------- */

static bool contiguous(const mha_tensor *t) {
    int64_t want = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != want)
            return false;
        want *= t->shape[i];
    }
    return true;
}

mha_status mha_rows_check(const mha_tensor *t, const char *name, int64_t want_E, int64_t *N,
                          int64_t *E) {
    char sb[MHA_SHAPE_BUF];
    MHA_CHECK(t != NULL, MHA_ERR_NULL, "%s: NULL tensor", name);
    MHA_CHECK(t->ndim >= 1 && t->ndim <= MHA_MAX_DIMS, MHA_ERR_SHAPE,
              "%s: rank %d, want 1..%d", name, t->ndim, MHA_MAX_DIMS);
    MHA_TRY(mha_check_tensor(t, name, t->ndim, MHA_F32));
    MHA_CHECK(contiguous(t), MHA_ERR_SHAPE, "%s: shape %s must be contiguous (row-major)", name,
              mha_shape_str(t, sb, sizeof sb));
    *E = t->shape[t->ndim - 1];
    MHA_CHECK(want_E < 0 || *E == want_E, MHA_ERR_SHAPE, "%s: shape %s, last dim must be %lld",
              name, mha_shape_str(t, sb, sizeof sb), (long long)want_E);
    MHA_CHECK(mha_product(t->shape, t->ndim - 1, N), MHA_ERR_OVERFLOW, "%s: too many rows", name);
    return MHA_OK;
}

mha_status mha_rows_check_out(const mha_tensor *out, const mha_tensor *x, const char *name,
                              int64_t N, int64_t E, bool allow_same) {
    int64_t n, e;
    char sb[MHA_SHAPE_BUF];
    MHA_TRY(mha_rows_check(out, name, -1, &n, &e));
    MHA_CHECK(n == N && e == E, MHA_ERR_SHAPE, "%s: shape %s, want %lld rows of %lld", name,
              mha_shape_str(out, sb, sizeof sb), (long long)N, (long long)E);
    bool same = out->data == x->data;
    MHA_CHECK((allow_same && same) || !mha_tensors_overlap(out, x), MHA_ERR_ALIAS,
              "%s: overlaps the input%s", name, allow_same ? " without being it" : "");
    return MHA_OK;
}

mha_status mha_vector_check(const mha_tensor *t, const char *name, int64_t n) {
    char sb[MHA_SHAPE_BUF];
    if (!t)
        return MHA_OK;
    MHA_CHECK(t->ndim >= 1, MHA_ERR_SHAPE, "%s: scalar given, want (%lld)", name, (long long)n);
    MHA_TRY(mha_check_tensor(t, name, t->ndim, MHA_F32));
    for (int i = 0; i < t->ndim - 1; i++)
        MHA_CHECK(t->shape[i] == 1, MHA_ERR_SHAPE, "%s: shape %s, want (%lld)", name,
                  mha_shape_str(t, sb, sizeof sb), (long long)n);
    MHA_CHECK(t->shape[t->ndim - 1] == n, MHA_ERR_SHAPE, "%s: shape %s, want (%lld)", name,
              mha_shape_str(t, sb, sizeof sb), (long long)n);
    MHA_CHECK(n <= 1 || t->stride[t->ndim - 1] == 1, MHA_ERR_SHAPE, "%s: must be contiguous",
              name);
    return MHA_OK;
}

mha_status mha_matrix_check(const mha_tensor *t, const char *name, int64_t rows, int64_t *cols) {
    char sb[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_tensor(t, name, 2, MHA_F32));
    MHA_CHECK(t->shape[0] == rows && (*cols < 0 || t->shape[1] == *cols), MHA_ERR_SHAPE,
              "%s: shape %s, want (%lld,%s)", name, mha_shape_str(t, sb, sizeof sb),
              (long long)rows, *cols < 0 ? "any" : "in_features");
    MHA_CHECK(t->shape[1] <= 1 || t->stride[1] == 1, MHA_ERR_SHAPE,
              "%s: must be contiguous in its last dimension", name);
    MHA_CHECK(t->shape[0] <= 1 || t->stride[0] == t->shape[1], MHA_ERR_SHAPE,
              "%s: rows must be packed (stride %lld, width %lld)", name, (long long)t->stride[0],
              (long long)t->shape[1]);
    *cols = t->shape[1];
    return MHA_OK;
}

/* ---- activations --------------------------------------------------------- */

const char *mha_activation_name(mha_activation act) {
    switch (act) {
    case MHA_ACT_RELU: return "relu";
    case MHA_ACT_GELU: return "gelu";
    case MHA_ACT_GELU_TANH: return "gelu_tanh";
    case MHA_ACT_SILU: return "silu";
    }
    return "?";
}

/* sqrt(2/pi) and the cubic coefficient of GELU(approximate='tanh');
 * ref: Hendrycks & Gimpel, "Gaussian Error Linear Units", arXiv:1606.08415. */
#define GELU_TANH_K 0.7978845608028654
#define GELU_TANH_C 0.044715

void mha_activation_f32(float *y, const float *x, int64_t n, mha_activation act) {
    switch (act) {
    case MHA_ACT_RELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] < 0.0f ? 0.0f : x[i]; /* NaN stays NaN, as in PyTorch */
        break;
    case MHA_ACT_GELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
        break;
    case MHA_ACT_GELU_TANH:
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            y[i] = 0.5f * v *
                   (1.0f + tanhf((float)GELU_TANH_K * (v + (float)GELU_TANH_C * v * v * v)));
        }
        break;
    case MHA_ACT_SILU:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] / (1.0f + expf(-x[i]));
        break;
    }
}

double mha_activation_ref(double x, mha_activation act) {
    switch (act) {
    case MHA_ACT_RELU: return x > 0.0 ? x : 0.0;
    case MHA_ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case MHA_ACT_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(GELU_TANH_K * (x + GELU_TANH_C * x * x * x)));
    case MHA_ACT_SILU: return x / (1.0 + exp(-x));
    }
    return NAN;
}

mha_status mha_activation_forward(mha_tensor *out, const mha_tensor *x, mha_activation act) {
    int64_t N, E;
    MHA_CHECK(act >= MHA_ACT_RELU && act <= MHA_ACT_SILU, MHA_ERR_VALUE,
              "activation: unknown value %d", (int)act);
    MHA_TRY(mha_rows_check(x, "x", -1, &N, &E));
    MHA_TRY(mha_rows_check_out(out, x, "out", N, E, true));
    mha_activation_f32(out->data, x->data, N * E, act);
    return MHA_OK;
}

/* ---- residual ------------------------------------------------------------ */

mha_status mha_residual_forward(mha_tensor *out, const mha_tensor *x, const mha_tensor *y) {
    int64_t N, E;
    MHA_TRY(mha_rows_check(x, "x", -1, &N, &E));
    MHA_TRY(mha_rows_check_out(y, x, "y", N, E, true));
    MHA_TRY(mha_rows_check_out(out, x, "out", N, E, true));
    MHA_TRY(mha_rows_check_out(out, y, "out", N, E, true));
    float *o = out->data;
    const float *a = x->data, *b = y->data;
    for (int64_t i = 0; i < N * E; i++)
        o[i] = a[i] + b[i];
    return MHA_OK;
}

/* ---- dropout ------------------------------------------------------------- */

/* Streams live at negative batch coordinates of the attention-dropout hash,
 * so they never collide with an attention kernel's (b >= 0, h, i, j). */
bool mha_dropout_keep(uint64_t seed, uint64_t stream, int64_t index, float p) {
    return mha_dropout_uniform(seed, -1 - (int64_t)(stream & INT64_MAX), 0, index >> 31,
                               index & 0x7FFFFFFF) >= p;
}

void mha_dropout_f32(float *y, const float *x, int64_t n, float p, uint64_t seed,
                     uint64_t stream) {
    const float scale = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n; i++)
        y[i] = mha_dropout_keep(seed, stream, i, p) ? x[i] * scale : 0.0f;
}

mha_status mha_dropout_forward(mha_tensor *out, const mha_tensor *x, float p, int training,
                               uint64_t seed, uint64_t stream) {
    int64_t N, E;
    MHA_TRY(mha_rows_check(x, "x", -1, &N, &E));
    MHA_TRY(mha_rows_check_out(out, x, "out", N, E, true));
    MHA_CHECK(p >= 0.0f && p < 1.0f, MHA_ERR_VALUE, "dropout: p %g must be in [0,1)", (double)p);
    if (training && p > 0.0f)
        mha_dropout_f32(out->data, x->data, N * E, p, seed, stream);
    else if (out->data != x->data)
        memcpy(out->data, x->data, sizeof(float) * (size_t)(N * E));
    return MHA_OK;
}

/* ---- backward ----------------------------------------------------------------
 * Derivatives, as PyTorch's autograd formulas (derivatives.yaml):
 *   ReLU       1 when x > 0, else 0 (threshold_backward)
 *   GELU       Phi(x) + x phi(x)
 *   GELU tanh  0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2),  t = tanh(k (x + c x^3))
 *   SiLU       s (1 + x (1 - s)),  s = sigmoid(x)
 * Evaluated in double per element: the cost is the same order as the
 * float form here, and it keeps the f32 path within a rounding of _ref. */

double mha_activation_grad_ref(double x, mha_activation act) {
    switch (act) {
    case MHA_ACT_RELU: return x > 0.0 ? 1.0 : 0.0;
    case MHA_ACT_GELU:
        return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
    case MHA_ACT_GELU_TANH: {
        double t = tanh(GELU_TANH_K * (x + GELU_TANH_C * x * x * x));
        return 0.5 * (1.0 + t) +
               0.5 * x * (1.0 - t * t) * GELU_TANH_K * (1.0 + 3.0 * GELU_TANH_C * x * x);
    }
    case MHA_ACT_SILU: {
        double s = 1.0 / (1.0 + exp(-x));
        return s * (1.0 + x * (1.0 - s));
    }
    }
    return NAN;
}

void mha_activation_backward_f32(float *dx, const float *dout, const float *x, int64_t n,
                                 mha_activation act) {
    if (act == MHA_ACT_RELU) {
        for (int64_t i = 0; i < n; i++)
            dx[i] += x[i] > 0.0f ? dout[i] : 0.0f;
        return;
    }
    for (int64_t i = 0; i < n; i++)
        dx[i] += (float)(dout[i] * mha_activation_grad_ref(x[i], act));
}

void mha_dropout_backward_f32(float *dx, const float *dout, int64_t n, float p, uint64_t seed,
                              uint64_t stream) {
    const float scale = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n; i++)
        if (mha_dropout_keep(seed, stream, i, p))
            dx[i] += dout[i] * scale;
}

/* dx += dout, with the checks of the public backward entry points. */
static mha_status accumulate(mha_tensor *dx, const mha_tensor *dout, const char *name, int64_t N,
                             int64_t E) {
    if (!dx)
        return MHA_OK;
    MHA_TRY(mha_rows_check_out(dx, dout, name, N, E, false));
    float *d = dx->data;
    const float *g = dout->data;
    for (int64_t i = 0; i < N * E; i++)
        d[i] += g[i];
    return MHA_OK;
}

mha_status mha_activation_backward(mha_tensor *dx, const mha_tensor *dout, const mha_tensor *x,
                                   mha_activation act) {
    int64_t N, E;
    MHA_CHECK(act >= MHA_ACT_RELU && act <= MHA_ACT_SILU, MHA_ERR_VALUE,
              "activation: unknown value %d", (int)act);
    MHA_TRY(mha_rows_check(x, "x", -1, &N, &E));
    MHA_TRY(mha_rows_check_out(dout, x, "dout", N, E, true));
    MHA_TRY(mha_rows_check_out(dx, x, "dx", N, E, false));
    MHA_CHECK(!mha_tensors_overlap(dx, dout), MHA_ERR_ALIAS, "dx: overlaps dout");
    mha_activation_backward_f32(dx->data, dout->data, x->data, N * E, act);
    return MHA_OK;
}

mha_status mha_residual_backward(mha_tensor *dx, mha_tensor *dy, const mha_tensor *dout) {
    int64_t N, E;
    MHA_TRY(mha_rows_check(dout, "dout", -1, &N, &E));
    MHA_TRY(accumulate(dx, dout, "dx", N, E));
    return accumulate(dy, dout, "dy", N, E);
}

mha_status mha_dropout_backward(mha_tensor *dx, const mha_tensor *dout, float p, int training,
                                uint64_t seed, uint64_t stream) {
    int64_t N, E;
    MHA_TRY(mha_rows_check(dout, "dout", -1, &N, &E));
    MHA_CHECK(p >= 0.0f && p < 1.0f, MHA_ERR_VALUE, "dropout: p %g must be in [0,1)", (double)p);
    if (!(training && p > 0.0f))
        return accumulate(dx, dout, "dx", N, E);
    MHA_TRY(mha_rows_check_out(dx, dout, "dx", N, E, false));
    mha_dropout_backward_f32(dx->data, dout->data, N * E, p, seed, stream);
    return MHA_OK;
}
