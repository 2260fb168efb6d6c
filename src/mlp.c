/* mlp.c - the position-wise MLP of the Transformer block
 * (linear1 -> activation -> dropout -> linear2), plus the gated form
 * (SwiGLU: linear2(silu(linear1 x) * linear3 x)).
 *
 * Letter legend: N rows, E model width, F hidden width.
 * The GEMMs go through linear.c's dispatcher (mha_linear_f32,
 * mha_gemm_f32_ab); the reference (mha_mlp_ref) is triple loops in float64.
 * The nn.Linear functions, forward and backward, are in linear.c.
 */
#include "layers.h"

#include <math.h>
#include <string.h>


mha_status mha_mlp_resolve(const mha_mlp_weights *w, int64_t E, mha_mlp_raw *m) {
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "mlp: NULL weights");
    MHA_CHECK(w->linear1_weight && w->linear2_weight, MHA_ERR_NULL,
              "mlp: linear1_weight and linear2_weight are required");
    MHA_TRY(mha_check_tensor(w->linear1_weight, "linear1_weight", 2, MHA_F32));
    int64_t F = w->linear1_weight->shape[0], e = E, f = F;
    MHA_TRY(mha_matrix_check(w->linear1_weight, "linear1_weight", F, &e));
    MHA_TRY(mha_vector_check(w->linear1_bias, "linear1_bias", F));
    MHA_TRY(mha_matrix_check(w->linear2_weight, "linear2_weight", E, &f));
    MHA_TRY(mha_vector_check(w->linear2_bias, "linear2_bias", E));
    if (w->linear3_weight) {
        e = E;
        MHA_TRY(mha_matrix_check(w->linear3_weight, "linear3_weight", F, &e));
        MHA_TRY(mha_vector_check(w->linear3_bias, "linear3_bias", F));
    } else {
        MHA_CHECK(w->linear3_bias == NULL, MHA_ERR_NULL, "linear3_bias: given without linear3_weight");
    }
    m->E = E, m->F = F;
    m->w1 = mha_fdata(w->linear1_weight), m->b1 = mha_fdata(w->linear1_bias);
    m->w2 = mha_fdata(w->linear2_weight), m->b2 = mha_fdata(w->linear2_bias);
    m->w3 = mha_fdata(w->linear3_weight), m->b3 = mha_fdata(w->linear3_bias);
    return MHA_OK;
}

int64_t mha_mlp_hidden_floats(int64_t N, int64_t F, bool gated) {
    int64_t n;
    if (!mha_product((int64_t[]){N, F, gated ? 2 : 1}, 3, &n))
        return -1;
    return n;
}

void mha_mlp_f32(float *y, const float *x, int64_t N, const mha_mlp_raw *m, mha_activation act,
                 float *hidden, float dropout_p, uint64_t seed, uint64_t stream) {
    const int64_t E = m->E, F = m->F;
    mha_linear_f32(hidden, F, x, E, m->w1, E, m->b1, N, F, E, 0);
    mha_activation_f32(hidden, hidden, N * F, act);
    if (m->w3) {
        float *up = hidden + N * F;
        mha_linear_f32(up, F, x, E, m->w3, E, m->b3, N, F, E, 0);
        for (int64_t i = 0; i < N * F; i++)
            hidden[i] *= up[i];
    }
    if (dropout_p > 0.0f)
        mha_dropout_f32(hidden, hidden, N * F, dropout_p, seed, stream);
    mha_linear_f32(y, E, hidden, F, m->w2, F, m->b2, N, E, F, 0);
}

void mha_mlp_ref(float *y, const float *x, int64_t N, const mha_mlp_raw *m, mha_activation act) {
    const int64_t E = m->E, F = m->F;
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E;
        for (int64_t o = 0; o < E; o++) {
            double acc = m->b2 ? m->b2[o] : 0.0;
            for (int64_t f = 0; f < F; f++) {
                /* h_f recomputed per output: slow and obviously right */
                double a = m->b1 ? m->b1[f] : 0.0, g = m->b3 ? m->b3[f] : 0.0;
                for (int64_t c = 0; c < E; c++) {
                    a += (double)xr[c] * m->w1[f * E + c];
                    if (m->w3)
                        g += (double)xr[c] * m->w3[f * E + c];
                }
                double h = mha_activation_ref(a, act);
                if (m->w3)
                    h *= g;
                acc += h * m->w2[o * F + f];
            }
            y[r * E + o] = (float)acc;
        }
    }
}

/* bytes = the floats(N, F, gated) of a forward or backward workspace, checked. */
static mha_status workspace_bytes(int64_t N, int64_t F, int gated,
                                  int64_t (*floats)(int64_t, int64_t, bool), size_t *bytes) {
    MHA_CHECK(bytes != NULL, MHA_ERR_NULL, "mlp: NULL bytes");
    MHA_CHECK(N >= 0 && F >= 0, MHA_ERR_SHAPE, "mlp: negative size");
    int64_t n = floats(N, F, gated != 0);
    MHA_CHECK(n >= 0 && !mha_size_mul_overflows((size_t)n, sizeof(float), bytes),
              MHA_ERR_OVERFLOW, "mlp: workspace size overflows");
    return MHA_OK;
}

mha_status mha_mlp_workspace_size(int64_t N, int64_t F, int gated, size_t *bytes) {
    return workspace_bytes(N, F, gated, mha_mlp_hidden_floats, bytes);
}

/* The checks the forward and the backward begin with: the runtime, act,
 * x (N,E) rows and the weights against E (filling m). */
static mha_status mlp_check(const mha_tensor *x, const mha_mlp_weights *w, mha_activation act,
                            int64_t *N, int64_t *E, mha_mlp_raw *m) {
    MHA_TRY(mha_runtime_check());
    MHA_CHECK(act >= MHA_ACT_RELU && act <= MHA_ACT_SILU, MHA_ERR_VALUE,
              "activation: unknown value %d", (int)act);
    MHA_TRY(mha_rows_check(x, "x", -1, N, E));
    return mha_mlp_resolve(w, *E, m);
}

mha_status mha_mlp_forward(mha_tensor *out, const mha_tensor *x, const mha_mlp_weights *w,
                           mha_activation act, void *workspace, size_t workspace_bytes) {
    int64_t N, E;
    mha_mlp_raw m;
    MHA_TRY(mlp_check(x, w, act, &N, &E, &m));
    MHA_TRY(mha_rows_check_out(out, x, "out", N, E, false));
    const mha_tensor *ws[] = {w->linear1_weight, w->linear1_bias, w->linear2_weight,
                              w->linear2_bias, w->linear3_weight, w->linear3_bias};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
        MHA_CHECK(!ws[i] || !mha_tensors_overlap(out, ws[i]), MHA_ERR_ALIAS,
                  "out: overlaps a weight");
    size_t need;
    MHA_TRY(mha_mlp_workspace_size(N, m.F, m.w3 != NULL, &need));
    float *hidden, *owned;
    MHA_TRY(mha_workspace_get(workspace, workspace_bytes, need, "mlp", &hidden, &owned));
    mha_mlp_f32(out->data, x->data, N, &m, act, hidden, 0.0f, 0, 0);
    mha_free(owned);
    return MHA_OK;
}

/* ---- backward ---------------------------------------------------------------- */

/* MLP backward.  Workspace (N,F) blocks:
 *   a1 = x w1^T + b1 (pre-activation)   up = x w3^T + b3 (gated)
 *   s  = act(a1)                        h  = dropout(s [* up]), linear2's input
 *   d1, d2: the gradient through h and the one through a1.
 * Then: dh = dout w2 (and dw2, db2); dropout backward; gated: d up = dh * s,
 * d s = dh * up; da1 = d s * act'(a1); linear1 (and linear3) backward. */
int64_t mha_mlp_backward_floats(int64_t N, int64_t F, bool gated) {
    int64_t n;
    (void)gated; /* one plan for both forms (the plain MLP leaves `up` unused) */
    if (!mha_product((int64_t[]){N, F, 6}, 3, &n))
        return -1;
    return n;
}

void mha_mlp_backward_f32(float *dx, const mha_mlp_raw_grads *g, const float *dout,
                          const float *x, int64_t N, const mha_mlp_raw *m, mha_activation act,
                          float *ws, float dropout_p, uint64_t seed, uint64_t stream) {
    const int64_t E = m->E, F = m->F, NF = N * F;
    float *a1 = ws, *up = a1 + NF, *s = up + NF, *h = s + NF, *d1 = h + NF, *d2 = d1 + NF;
    mha_linear_f32(a1, F, x, E, m->w1, E, m->b1, N, F, E, 0);
    mha_activation_f32(s, a1, NF, act);
    if (m->w3) {
        mha_linear_f32(up, F, x, E, m->w3, E, m->b3, N, F, E, 0);
        for (int64_t i = 0; i < NF; i++)
            h[i] = s[i] * up[i];
    } else {
        memcpy(h, s, sizeof(float) * (size_t)NF);
    }
    if (dropout_p > 0.0f)
        mha_dropout_f32(h, h, NF, dropout_p, seed, stream);
    /* in the forward: out = h w2^T + b2 */
    memset(d1, 0, sizeof(float) * (size_t)NF);
    mha_linear_backward_f32(d1, g->w2, g->b2, dout, h, m->w2, N, E, F);
    float *dh = d1, *free_ = d2;
    if (dropout_p > 0.0f) {
        memset(d2, 0, sizeof(float) * (size_t)NF);
        mha_dropout_backward_f32(d2, d1, NF, dropout_p, seed, stream);
        dh = d2, free_ = d1;
    }
    if (m->w3) {
        /* h = s * up: d up = dh * s (into s), d s = dh * up (into up) */
        for (int64_t i = 0; i < NF; i++) {
            const float gs = dh[i] * up[i];
            s[i] *= dh[i];
            up[i] = gs;
        }
        dh = up;
    }
    memset(free_, 0, sizeof(float) * (size_t)NF);
    mha_activation_backward_f32(free_, dh, a1, NF, act);
    mha_linear_backward_f32(dx, g->w1, g->b1, free_, x, m->w1, N, F, E);
    if (m->w3)
        mha_linear_backward_f32(dx, g->w3, g->b3, s, x, m->w3, N, F, E);
}

/* Hidden unit f of row xr in float64: pre-activation and gate. */
static void mlp_unit_ref(const mha_mlp_raw *m, const float *xr, int64_t f, double *a,
                         double *gate) {
    const int64_t E = m->E;
    double acc = m->b1 ? m->b1[f] : 0.0, acc3 = m->b3 ? m->b3[f] : 0.0;
    for (int64_t c = 0; c < E; c++) {
        acc += (double)xr[c] * m->w1[f * E + c];
        if (m->w3)
            acc3 += (double)xr[c] * m->w3[f * E + c];
    }
    *a = acc;
    *gate = m->w3 ? acc3 : 1.0;
}

void mha_mlp_backward_ref(float *dx, const mha_mlp_raw_grads *g, const float *dout,
                          const float *x, int64_t N, const mha_mlp_raw *m, mha_activation act) {
    const int64_t E = m->E, F = m->F;
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E, *dr = dout + r * E;
        for (int64_t o = 0; o < E && g->b2; o++)
            g->b2[o] += dr[o];
        for (int64_t f = 0; f < F; f++) {
            double a, gate, dh = 0.0;
            mlp_unit_ref(m, xr, f, &a, &gate);
            const double s = mha_activation_ref(a, act);
            for (int64_t o = 0; o < E; o++) {
                dh += (double)dr[o] * m->w2[o * F + f];
                if (g->w2)
                    g->w2[o * F + f] += (float)(dr[o] * s * gate);
            }
            const double da = dh * gate * mha_activation_grad_ref(a, act), dgate = dh * s;
            if (g->b1)
                g->b1[f] += (float)da;
            if (m->w3 && g->b3)
                g->b3[f] += (float)dgate;
            for (int64_t c = 0; c < E; c++) {
                if (g->w1)
                    g->w1[f * E + c] += (float)(da * xr[c]);
                if (m->w3 && g->w3)
                    g->w3[f * E + c] += (float)(dgate * xr[c]);
            }
        }
        for (int64_t c = 0; c < E && dx; c++) {
            double acc = 0.0;
            for (int64_t f = 0; f < F; f++) {
                double a, gate, dh = 0.0;
                mlp_unit_ref(m, xr, f, &a, &gate);
                for (int64_t o = 0; o < E; o++)
                    dh += (double)dr[o] * m->w2[o * F + f];
                acc += dh * gate * mha_activation_grad_ref(a, act) * m->w1[f * E + c];
                if (m->w3)
                    acc += dh * mha_activation_ref(a, act) * m->w3[f * E + c];
            }
            dx[r * E + c] += (float)acc;
        }
    }
}

/* ---- public backward ------------------------------------------------------- */


mha_status mha_mlp_backward_workspace_size(int64_t N, int64_t F, int gated, size_t *bytes) {
    return workspace_bytes(N, F, gated, mha_mlp_backward_floats, bytes);
}

/* A gradient of the same shape as its weight (or NULL / weight NULL). */
static mha_status grad_like(mha_tensor *g, const mha_tensor *w, const char *name) {
    char sb[MHA_SHAPE_BUF];
    if (!g)
        return MHA_OK;
    MHA_CHECK(w != NULL, MHA_ERR_VALUE, "%s: given for an absent weight", name);
    int64_t n, want;
    MHA_TRY(mha_check_tensor(g, name, g->ndim, MHA_F32));
    MHA_CHECK(mha_tensor_numel(g, &n) == MHA_OK && mha_tensor_numel(w, &want) == MHA_OK &&
                  n == want && g->ndim == w->ndim,
              MHA_ERR_SHAPE, "%s: shape %s does not match its weight", name,
              mha_shape_str(g, sb, sizeof sb));
    for (int i = 0; i < g->ndim; i++)
        MHA_CHECK(g->shape[i] == w->shape[i], MHA_ERR_SHAPE, "%s: shape %s does not match its weight",
                  name, mha_shape_str(g, sb, sizeof sb));
    if (g->ndim == 2)
        MHA_TRY(mha_matrix_check(g, name, g->shape[0], &(int64_t){g->shape[1]}));
    else
        MHA_TRY(mha_vector_check(g, name, g->shape[g->ndim - 1]));
    return MHA_OK;
}

mha_status mha_mlp_backward(mha_tensor *dx, const mha_mlp_grads *grads, const mha_tensor *dout,
                            const mha_tensor *x, const mha_mlp_weights *w, mha_activation act,
                            void *workspace, size_t workspace_bytes) {
    int64_t N, E;
    mha_mlp_raw m;
    MHA_TRY(mlp_check(x, w, act, &N, &E, &m));
    MHA_TRY(mha_rows_check_out(dout, x, "dout", N, E, true));
    if (dx) {
        MHA_TRY(mha_rows_check_out(dx, x, "dx", N, E, false));
        MHA_CHECK(!mha_tensors_overlap(dx, dout), MHA_ERR_ALIAS, "dx: overlaps dout");
    }
    mha_mlp_grads none = {0};
    const mha_mlp_grads *gr = grads ? grads : &none;
    MHA_TRY(grad_like(gr->linear1_weight, w->linear1_weight, "dlinear1_weight"));
    MHA_TRY(grad_like(gr->linear1_bias, w->linear1_bias, "dlinear1_bias"));
    MHA_TRY(grad_like(gr->linear2_weight, w->linear2_weight, "dlinear2_weight"));
    MHA_TRY(grad_like(gr->linear2_bias, w->linear2_bias, "dlinear2_bias"));
    MHA_TRY(grad_like(gr->linear3_weight, w->linear3_weight, "dlinear3_weight"));
    MHA_TRY(grad_like(gr->linear3_bias, w->linear3_bias, "dlinear3_bias"));
    size_t need;
    MHA_TRY(mha_mlp_backward_workspace_size(N, m.F, m.w3 != NULL, &need));
    float *ws, *owned;
    MHA_TRY(mha_workspace_get(workspace, workspace_bytes, need, "mlp", &ws, &owned));
    mha_mlp_raw_grads g = {mha_gdata(gr->linear1_weight), mha_gdata(gr->linear1_bias),
                           mha_gdata(gr->linear2_weight), mha_gdata(gr->linear2_bias),
                           mha_gdata(gr->linear3_weight), mha_gdata(gr->linear3_bias)};
    mha_mlp_backward_f32(mha_gdata(dx), &g, dout->data, x->data, N, &m, act, ws, 0.0f, 0, 0);
    mha_free(owned);
    return MHA_OK;
}
