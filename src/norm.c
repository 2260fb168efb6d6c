/* norm.c - LayerNorm and RMSNorm over the last dimension (nn.LayerNorm,
 * nn.RMSNorm).
 *
 * Letter legend: N rows, E normalised width.
 * Both use the biased variance / mean square of the row.  The fast path
 * keeps the row statistics and the centring in double (E is small next to
 * the GEMMs, and a float mean loses digits when |mean| >> std), parallel over
 * rows; the reference is a literal float64 transcription of the formula.
 */
#include "layers.h"

#include <math.h>

void mha_layernorm_f32(float *y, const float *x, int64_t N, int64_t E, const float *w,
                       const float *b, float eps) {
#pragma omp parallel for schedule(static) num_threads(mha_threads()) if (N * E > 65536)
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E;
        float *yr = y + r * E;
        double sum = 0.0;
        for (int64_t c = 0; c < E; c++)
            sum += xr[c];
        const double mean = sum / (double)E;
        double sq = 0.0;
        for (int64_t c = 0; c < E; c++)
            sq += (xr[c] - mean) * (xr[c] - mean);
        const double rstd = 1.0 / sqrt(sq / (double)E + (double)eps);
        for (int64_t c = 0; c < E; c++) {
            /* centred in double: a float mean loses digits when |mean| >> std */
            float v = (float)((xr[c] - mean) * rstd);
            if (w)
                v *= w[c];
            if (b)
                v += b[c];
            yr[c] = v;
        }
    }
}

void mha_layernorm_ref(float *y, const float *x, int64_t N, int64_t E, const float *w,
                       const float *b, float eps) {
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E;
        double mean = 0.0, var = 0.0;
        for (int64_t c = 0; c < E; c++)
            mean += xr[c];
        mean /= (double)E;
        for (int64_t c = 0; c < E; c++)
            var += (xr[c] - mean) * (xr[c] - mean);
        var /= (double)E;
        for (int64_t c = 0; c < E; c++) {
            double v = (xr[c] - mean) / sqrt(var + eps);
            y[r * E + c] = (float)(v * (w ? w[c] : 1.0) + (b ? b[c] : 0.0));
        }
    }
}

void mha_rmsnorm_f32(float *y, const float *x, int64_t N, int64_t E, const float *w, float eps) {
#pragma omp parallel for schedule(static) num_threads(mha_threads()) if (N * E > 65536)
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E;
        float *yr = y + r * E;
        double sq = 0.0;
        for (int64_t c = 0; c < E; c++)
            sq += (double)xr[c] * xr[c];
        const float rms = (float)(1.0 / sqrt(sq / (double)E + (double)eps));
        for (int64_t c = 0; c < E; c++)
            yr[c] = w ? xr[c] * rms * w[c] : xr[c] * rms;
    }
}

void mha_rmsnorm_ref(float *y, const float *x, int64_t N, int64_t E, const float *w, float eps) {
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E;
        double ms = 0.0;
        for (int64_t c = 0; c < E; c++)
            ms += (double)xr[c] * xr[c];
        ms /= (double)E;
        for (int64_t c = 0; c < E; c++)
            y[r * E + c] = (float)(xr[c] / sqrt(ms + eps) * (w ? w[c] : 1.0));
    }
}

static mha_status check_eps(float eps, const char *who) {
    MHA_CHECK(isfinite(eps) && eps > 0.0f, MHA_ERR_VALUE, "%s: eps %g must be positive and finite",
              who, (double)eps);
    return MHA_OK;
}

mha_status mha_layernorm_forward(mha_tensor *out, const mha_tensor *x, const mha_tensor *weight,
                                 const mha_tensor *bias, float eps) {
    int64_t N, E;
    MHA_TRY(mha_rows_check(x, "x", -1, &N, &E));
    MHA_TRY(mha_rows_check_out(out, x, "out", N, E, true));
    MHA_TRY(mha_vector_check(weight, "weight", E));
    MHA_TRY(mha_vector_check(bias, "bias", E));
    MHA_TRY(check_eps(eps, "layernorm"));
    mha_layernorm_f32(out->data, x->data, N, E, mha_fdata(weight), mha_fdata(bias), eps);
    return MHA_OK;
}

mha_status mha_rmsnorm_forward(mha_tensor *out, const mha_tensor *x, const mha_tensor *weight,
                               float eps) {
    int64_t N, E;
    MHA_TRY(mha_rows_check(x, "x", -1, &N, &E));
    MHA_TRY(mha_rows_check_out(out, x, "out", N, E, true));
    MHA_TRY(mha_vector_check(weight, "weight", E));
    MHA_TRY(check_eps(eps, "rmsnorm"));
    mha_rmsnorm_f32(out->data, x->data, N, E, mha_fdata(weight), eps);
    return MHA_OK;
}
