/* norm.c - LayerNorm and RMSNorm over the last dimension (nn.LayerNorm,
 * nn.RMSNorm).
 *
 * Letter legend: N rows, E normalised width.
 * Both use the biased variance / mean square of the row.  The fast path
 * keeps the row statistics and the centring in double (E is small next to
 * the GEMMs, and a float mean loses digits when |mean| >> std), parallel over
 * rows; the reference is a literal float64 transcription of the formula.
 * The AVX2 and AVX-512 LayerNorm loops of the same plan are in
 * src/kernels/norm_avx*.c (the avx512 one dispatched here).
 */
#include "layers.h"

#include <math.h>

/* Statistics of one LayerNorm row xr (E), both f32 paths (forward and
 * backward): *mean, and the return 1/sqrt(var + eps), var biased; in double,
 * two passes (the variance of the centred values). */
static inline double row_mean_rstd(const float *xr, int64_t E, float eps, double *mean_out) {
    double sum = 0.0;
    for (int64_t c = 0; c < E; c++)
        sum += xr[c];
    const double mean = sum / (double)E;
    double sq = 0.0;
    for (int64_t c = 0; c < E; c++)
        sq += (xr[c] - mean) * (xr[c] - mean);
    *mean_out = mean;
    return 1.0 / sqrt(sq / (double)E + (double)eps);
}

void mha_layernorm_f32(float *y, const float *x, int64_t N, int64_t E, const float *w,
                       const float *b, float eps) {
#pragma omp parallel for schedule(static) num_threads(mha_threads()) if (N * E > 65536)
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E;
        float *yr = y + r * E;
        double mean;
        const double rstd = row_mean_rstd(xr, E, eps, &mean);
        for (int64_t c = 0; c < E; c++)
            yr[c] = mha_layernorm_value(xr[c], mean, rstd, w, b, c);
    }
}

mha_status mha_layernorm_f32_avx512(float *y, const float *x, int64_t N, int64_t E,
                                    const float *w, const float *b, float eps) {
    MHA_TRY(mha_avx512_check());
    (*MHA_AVX512_PICK(mha_layernorm_avx512_loop))(y, x, N, E, w, b, eps);
    return MHA_OK;
}

/* The float64 mean and (biased) variance of row xr (E), two passes. */
static void row_stats_ref(const float *xr, int64_t E, double *mean, double *var) {
    double m = 0.0, v = 0.0;
    for (int64_t c = 0; c < E; c++)
        m += xr[c];
    m /= (double)E;
    for (int64_t c = 0; c < E; c++)
        v += (xr[c] - m) * (xr[c] - m);
    *mean = m, *var = v / (double)E;
}

void mha_layernorm_ref(float *y, const float *x, int64_t N, int64_t E, const float *w,
                       const float *b, float eps) {
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E;
        double mean, var;
        row_stats_ref(xr, E, &mean, &var);
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

/* ---- backward ---------------------------------------------------------------
 * ref: docs/layers.md; llm.c doc/layernorm.  With xhat = (x - mean) * rstd
 * and g = dout * w (dout when w is NULL), the forward y = xhat * w + b gives
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
 *   dw += dout * xhat,  db += dout.
 * RMSNorm y = x * r * w, r = 1/sqrt(mean(x^2) + eps):
 *   dx = r * g - x * r^3 * mean(g * x),  dw += dout * x * r.
 * Rows run serially (E is small next to the GEMMs; dw/db sum over rows, and
 * one fixed order keeps results independent of the thread count).  The row
 * statistics and the two means are in double, as in the forward. */

void mha_layernorm_backward_f32(float *dx, float *dw, float *db, const float *dout,
                                const float *x, const float *w, int64_t N, int64_t E, float eps) {
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E, *dr = dout + r * E;
        double mean;
        const double rstd = row_mean_rstd(xr, E, eps, &mean);
        double gmean = 0.0, gxmean = 0.0;
        for (int64_t c = 0; c < E; c++) {
            double xh = (xr[c] - mean) * rstd, g = w ? (double)dr[c] * w[c] : dr[c];
            gmean += g;
            gxmean += g * xh;
            if (dw)
                dw[c] += (float)(dr[c] * xh);
            if (db)
                db[c] += dr[c];
        }
        gmean /= (double)E, gxmean /= (double)E;
        if (dx)
            for (int64_t c = 0; c < E; c++) {
                double xh = (xr[c] - mean) * rstd, g = w ? (double)dr[c] * w[c] : dr[c];
                dx[r * E + c] += (float)(rstd * (g - gmean - xh * gxmean));
            }
    }
}

void mha_layernorm_backward_ref(float *dx, float *dw, float *db, const float *dout,
                                const float *x, const float *w, int64_t N, int64_t E, float eps) {
    /* literal chain rule through mean and variance, float64 throughout:
     * dy/dx_j = w * (delta_ij - 1/E) * rstd - w * xhat_i * xhat_j * rstd / E */
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E, *dr = dout + r * E;
        double mean, var;
        row_stats_ref(xr, E, &mean, &var);
        const double rstd = 1.0 / sqrt(var + eps);
        for (int64_t j = 0; j < E; j++) {
            double xj = (xr[j] - mean) * rstd, acc = 0.0;
            for (int64_t i = 0; i < E; i++) {
                double xi = (xr[i] - mean) * rstd;
                double jac = ((i == j) - 1.0 / (double)E) * rstd - xi * xj * rstd / (double)E;
                acc += (double)dr[i] * (w ? w[i] : 1.0) * jac;
            }
            if (dx)
                dx[r * E + j] += (float)acc;
            if (dw)
                dw[j] += (float)(dr[j] * xj);
            if (db)
                db[j] += dr[j];
        }
    }
}

void mha_rmsnorm_backward_f32(float *dx, float *dw, const float *dout, const float *x,
                              const float *w, int64_t N, int64_t E, float eps) {
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E, *dr = dout + r * E;
        double sq = 0.0, gx = 0.0;
        for (int64_t c = 0; c < E; c++) {
            sq += (double)xr[c] * xr[c];
            gx += (double)dr[c] * (w ? w[c] : 1.0f) * xr[c];
        }
        const double rs = 1.0 / sqrt(sq / (double)E + (double)eps);
        const double k = rs * rs * rs * gx / (double)E;
        for (int64_t c = 0; c < E; c++) {
            if (dx)
                dx[r * E + c] += (float)(rs * dr[c] * (w ? w[c] : 1.0f) - xr[c] * k);
            if (dw)
                dw[c] += (float)(dr[c] * xr[c] * rs);
        }
    }
}

void mha_rmsnorm_backward_ref(float *dx, float *dw, const float *dout, const float *x,
                              const float *w, int64_t N, int64_t E, float eps) {
    /* dy_i/dx_j = w_i * (delta_ij * r - x_i * x_j * r^3 / E) */
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * E, *dr = dout + r * E;
        double ms = 0.0;
        for (int64_t c = 0; c < E; c++)
            ms += (double)xr[c] * xr[c];
        const double rs = 1.0 / sqrt(ms / (double)E + eps);
        for (int64_t j = 0; j < E; j++) {
            double acc = 0.0;
            for (int64_t i = 0; i < E; i++)
                acc += (double)dr[i] * (w ? w[i] : 1.0) *
                       ((i == j) * rs - (double)xr[i] * xr[j] * rs * rs * rs / (double)E);
            if (dx)
                dx[r * E + j] += (float)acc;
            if (dw)
                dw[j] += (float)((double)dr[j] * xr[j] * rs);
        }
    }
}

/* ---- public backward ------------------------------------------------------- */

/* A gradient tensor: NULL, or a contiguous float (N,E) / vector (E) apart
 * from the inputs. */
static mha_status grad_rows(const mha_tensor *g, const mha_tensor *x, const char *name,
                            int64_t N, int64_t E) {
    if (!g)
        return MHA_OK;
    return mha_rows_check_out(g, x, name, N, E, false);
}

/* The checks of both norms' backward, in order: x (N,E) rows, dout, dx,
 * weight, dweight, dbias (NULL for RMSNorm), eps (named by norm), aliasing. */
static mha_status backward_check(const mha_tensor *dx, const mha_tensor *dweight,
                                 const mha_tensor *dbias, const mha_tensor *dout,
                                 const mha_tensor *x, const mha_tensor *weight, float eps,
                                 const char *norm, int64_t *N, int64_t *E) {
    MHA_TRY(mha_rows_check(x, "x", -1, N, E));
    MHA_TRY(mha_rows_check_out(dout, x, "dout", *N, *E, true));
    MHA_TRY(grad_rows(dx, x, "dx", *N, *E));
    MHA_TRY(mha_vector_check(weight, "weight", *E));
    MHA_TRY(mha_vector_check(dweight, "dweight", *E));
    MHA_TRY(mha_vector_check(dbias, "dbias", *E));
    MHA_TRY(check_eps(eps, norm));
    MHA_CHECK(!dx || !mha_tensors_overlap(dx, dout), MHA_ERR_ALIAS, "dx: overlaps dout");
    return MHA_OK;
}

mha_status mha_layernorm_backward(mha_tensor *dx, mha_tensor *dweight, mha_tensor *dbias,
                                  const mha_tensor *dout, const mha_tensor *x,
                                  const mha_tensor *weight, float eps) {
    int64_t N, E;
    MHA_TRY(backward_check(dx, dweight, dbias, dout, x, weight, eps, "layernorm", &N, &E));
    mha_layernorm_backward_f32(dx ? dx->data : NULL, dweight ? dweight->data : NULL,
                               dbias ? dbias->data : NULL, dout->data, x->data,
                               mha_fdata(weight), N, E, eps);
    return MHA_OK;
}

mha_status mha_rmsnorm_backward(mha_tensor *dx, mha_tensor *dweight, const mha_tensor *dout,
                                const mha_tensor *x, const mha_tensor *weight, float eps) {
    int64_t N, E;
    MHA_TRY(backward_check(dx, dweight, NULL, dout, x, weight, eps, "rmsnorm", &N, &E));
    mha_rmsnorm_backward_f32(dx ? dx->data : NULL, dweight ? dweight->data : NULL, dout->data,
                             x->data, mha_fdata(weight), N, E, eps);
    return MHA_OK;
}
