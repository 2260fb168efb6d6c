/* mlp.c - nn.Linear and the position-wise MLP of the Transformer block
 * (linear1 -> activation -> dropout -> linear2), plus the gated form
 * (SwiGLU: linear2(silu(linear1 x) * linear3 x)).
 *
 * Letter legend: N rows, E model width, F hidden width.
 * The GEMMs are mha_linear_f32 (CBLAS when built with it); the reference
 * (mha_mlp_ref) is triple loops in float64.
 */
#include "layers.h"

#include <math.h>
#include <string.h>

mha_status mha_linear_forward(mha_tensor *out, const mha_tensor *x, const mha_tensor *weight,
                              const mha_tensor *bias) {
    int64_t N, K, F = -1;
    MHA_TRY(mha_rows_check(x, "x", -1, &N, &K));
    MHA_CHECK(weight != NULL, MHA_ERR_NULL, "weight: NULL tensor");
    MHA_TRY(mha_check_tensor(weight, "weight", 2, MHA_F32));
    F = weight->shape[0];
    int64_t k = K;
    MHA_TRY(mha_matrix_check(weight, "weight", F, &k));
    MHA_TRY(mha_vector_check(bias, "bias", F));
    MHA_TRY(mha_rows_check_out(out, x, "out", N, F, false));
    MHA_CHECK(!mha_tensors_overlap(out, weight) && (!bias || !mha_tensors_overlap(out, bias)),
              MHA_ERR_ALIAS, "out: overlaps weight or bias");
    mha_linear_f32(out->data, F, x->data, K, weight->data, K, mha_fdata(bias), N, F, K, 0);
    return MHA_OK;
}

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

mha_status mha_mlp_workspace_size(int64_t N, int64_t F, int gated, size_t *bytes) {
    MHA_CHECK(bytes != NULL, MHA_ERR_NULL, "mlp: NULL bytes");
    MHA_CHECK(N >= 0 && F >= 0, MHA_ERR_SHAPE, "mlp: negative size");
    int64_t n = mha_mlp_hidden_floats(N, F, gated != 0);
    MHA_CHECK(n >= 0 && !mha_size_mul_overflows((size_t)n, sizeof(float), bytes),
              MHA_ERR_OVERFLOW, "mlp: workspace size overflows");
    return MHA_OK;
}

mha_status mha_mlp_forward(mha_tensor *out, const mha_tensor *x, const mha_mlp_weights *w,
                           mha_activation act, void *workspace, size_t workspace_bytes) {
    int64_t N, E;
    mha_mlp_raw m;
    MHA_CHECK(act >= MHA_ACT_RELU && act <= MHA_ACT_SILU, MHA_ERR_VALUE,
              "activation: unknown value %d", (int)act);
    MHA_TRY(mha_rows_check(x, "x", -1, &N, &E));
    MHA_TRY(mha_mlp_resolve(w, E, &m));
    MHA_TRY(mha_rows_check_out(out, x, "out", N, E, false));
    const mha_tensor *ws[] = {w->linear1_weight, w->linear1_bias, w->linear2_weight,
                              w->linear2_bias, w->linear3_weight, w->linear3_bias};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
        MHA_CHECK(!ws[i] || !mha_tensors_overlap(out, ws[i]), MHA_ERR_ALIAS,
                  "out: overlaps a weight");
    size_t need;
    MHA_TRY(mha_mlp_workspace_size(N, m.F, m.w3 != NULL, &need));
    float *hidden = workspace;
    if (hidden) {
        MHA_CHECK(workspace_bytes >= need, MHA_ERR_VALUE, "mlp: workspace of %zu bytes, need %zu",
                  workspace_bytes, need);
        MHA_CHECK(((uintptr_t)workspace % sizeof(float)) == 0, MHA_ERR_VALUE,
                  "mlp: workspace must be float-aligned");
    } else {
        hidden = mha_malloc(need ? need : 1);
        MHA_CHECK(hidden != NULL, MHA_ERR_NOMEM, "mlp: cannot allocate %zu bytes", need);
    }
    mha_mlp_f32(out->data, x->data, N, &m, act, hidden, 0.0f, 0, 0);
    if (hidden != workspace)
        mha_free(hidden);
    return MHA_OK;
}
