/* linear.c - y = x w^T + bias, the projections' GEMM; and the backward's
 * C += A B, C += A^T B (mha_gemm_f32_ab).
 *
 * THE GEMM route: every product of the library goes through the two
 * dispatchers here.  Three paths (src/kernels/gemm.h): one cblas_sgemm call
 * (OpenBLAS), mha's packed SIMD GEMM (src/kernels/gemm_avx2.c: the 6x16 AVX2 or
 * the 12x32 AVX-512 block, gemm_avx512.c), or the
 * cache-blocked portable loops (src/kernels/gemm_ref.c, the reference,
 * always built); the choice is src/runtime.c's.  Also the public Linear
 * functions (nn.Linear forward and backward).  Letters: M rows of x, K input
 * features, N output features.
 */
#include "internal.h"
#include "kernels/gemm.h"
#include "layers.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifdef MHA_HAVE_CBLAS
#include <cblas.h>
#endif

/* ---- the product ------------------------------------------------------------- */

#ifdef MHA_HAVE_CBLAS
/* The leading dimension cblas_sgemm accepts for a row-major (rows, cols)
 * operand stored ld apart, or 0 when it accepts none.  CBLAS rejects
 * ld < max(1, cols) (OpenBLAS prints "parameter number N had an illegal
 * value" and skips the product).  The stride of a single row is never read,
 * so it is normalised (a broadcast view of one row has stride 0); rows that
 * truly overlap (0 < ld < cols) cannot be described to BLAS. */
static int64_t blas_ld(int64_t ld, int64_t rows, int64_t cols) {
    const int64_t need = cols > 1 ? cols : 1;
    if (rows <= 1 && ld < need)
        ld = need;
    return ld >= need && ld <= INT32_MAX ? ld : 0;
}

static bool blas_fits(int64_t M, int64_t N, int64_t K) {
    return M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX;
}

/* Where a product BLAS cannot take runs instead: mha's own kernels take any
 * stride (overlapping rows are only read). */
static mha_gemm_path blas_fallback(void) {
    return mha_cpu_has_avx2_fma() ? MHA_GEMM_AVX2 : MHA_GEMM_PORTABLE;
}
#endif

mha_gemm_path mha_linear_f32_path(mha_gemm_path requested, float *y, int64_t ldy, const float *x,
                                  int64_t ldx, const float *w, int64_t ldw, const float *bias,
                                  int64_t M, int64_t N, int64_t K, int accumulate) {
    mha_gemm_path path = mha_gemm_resolve_for(requested, M, N, K);
    if (M == 0 || N == 0)
        return path;
    if (path == MHA_GEMM_AVX2 && K > 0 && !accumulate) {
        /* the bias enters at the kernel's first k slice: y is written once
         * instead of filled with the bias, read back and written again */
        mha_gemm_f32_avx2(y, ldy, x, ldx, w, ldw, M, N, K, bias, 1);
        return path;
    }
    if (!accumulate) {
        for (int64_t r = 0; r < M; r++) {
            if (bias)
                memcpy(y + r * ldy, bias, sizeof(float) * (size_t)N);
            else
                memset(y + r * ldy, 0, sizeof(float) * (size_t)N);
        }
    } else if (bias) {
        for (int64_t r = 0; r < M; r++)
            for (int64_t c = 0; c < N; c++)
                y[r * ldy + c] += bias[c];
    }
    if (K == 0)
        return path;
    if (path == MHA_GEMM_AVX2) {
        mha_gemm_f32_avx2(y, ldy, x, ldx, w, ldw, M, N, K, NULL, 0);
        return path;
    }
#ifdef MHA_HAVE_CBLAS
    if (path == MHA_GEMM_BLAS) {
        /* x (M,K), w (N,K), y (M,N), all row-major */
        const int64_t lx = blas_ld(ldx, M, K), lw = blas_ld(ldw, N, K), ly = blas_ld(ldy, M, N);
        if (blas_fits(M, N, K) && lx && lw && ly) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, x,
                        (int)lx, w, (int)lw, 1.0f, y, (int)ly);
            return path;
        }
        path = blas_fallback();
        if (path == MHA_GEMM_AVX2) {
            mha_gemm_f32_avx2(y, ldy, x, ldx, w, ldw, M, N, K, NULL, 0);
            return path;
        }
    }
#endif
    mha_gemm_f32_ref(y, ldy, x, ldx, w, ldw, M, N, K);
    return MHA_GEMM_PORTABLE;
}

mha_gemm_path mha_gemm_f32_ab_path(mha_gemm_path requested, int trans_a, float *c, int64_t ldc,
                                   const float *a, int64_t lda, const float *b, int64_t ldb,
                                   int64_t M, int64_t N, int64_t K) {
    mha_gemm_path path = mha_gemm_resolve_for(requested, M, N, K);
    if (M <= 0 || N <= 0 || K <= 0)
        return path;
    if (path == MHA_GEMM_AVX2) {
        mha_gemm_f32_ab_avx2(trans_a, c, ldc, a, lda, b, ldb, M, N, K);
        return path;
    }
#ifdef MHA_HAVE_CBLAS
    if (path == MHA_GEMM_BLAS) {
        /* A (M,K) or, transposed, (K,M); B (K,N); C (M,N); all row-major */
        const int64_t la = trans_a ? blas_ld(lda, K, M) : blas_ld(lda, M, K);
        const int64_t lb = blas_ld(ldb, K, N), lc = blas_ld(ldc, M, N);
        if (blas_fits(M, N, K) && la && lb && lc) {
            cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, CblasNoTrans, (int)M,
                        (int)N, (int)K, 1.0f, a, (int)la, b, (int)lb, 1.0f, c, (int)lc);
            return path;
        }
        path = blas_fallback();
        if (path == MHA_GEMM_AVX2) {
            mha_gemm_f32_ab_avx2(trans_a, c, ldc, a, lda, b, ldb, M, N, K);
            return path;
        }
    }
#endif
    mha_gemm_f32_ab_ref(trans_a, c, ldc, a, lda, b, ldb, M, N, K);
    return MHA_GEMM_PORTABLE;
}

void mha_gemm_f32_ab(int trans_a, float *c, int64_t ldc, const float *a, int64_t lda,
                     const float *b, int64_t ldb, int64_t M, int64_t N, int64_t K) {
    mha_gemm_f32_ab_path(MHA_GEMM_AUTO, trans_a, c, ldc, a, lda, b, ldb, M, N, K);
}

void mha_linear_f32(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                    int64_t ldw, const float *bias, int64_t M, int64_t N, int64_t K,
                    int accumulate) {
    mha_linear_f32_path(MHA_GEMM_AUTO, y, ldy, x, ldx, w, ldw, bias, M, N, K, accumulate);
}

/* ---- the Linear backward -------------------------------------------------------
 * Linear y (N,F) = x (N,K) w^T + b:
 *   dx (N,K) += dout (N,F) w (F,K)     one GEMM over F
 *   dw (F,K) += dout^T (F,N) x (N,K)   one GEMM over the rows
 *   db (F)   += sum over rows of dout
 * Both products go through the GEMM dispatcher above, like every
 * other GEMM: MHA_GEMM and the avx2 path apply; each path sums every
 * element in one fixed order whatever the thread count. */

void mha_linear_backward_f32(float *dx, float *dw, float *db, const float *dout, const float *x,
                             const float *w, int64_t N, int64_t F, int64_t K) {
    if (db)
        for (int64_t r = 0; r < N; r++)
            for (int64_t f = 0; f < F; f++)
                db[f] += dout[r * F + f];
    if (N == 0 || F == 0 || K == 0)
        return;
    if (dx) /* dx (N,K) += dout (N,F) w (F,K) */
        mha_gemm_f32_ab(0, dx, K, dout, F, w, K, N, K, F);
    if (dw) /* dw (F,K) += dout^T (F,N) x (N,K) */
        mha_gemm_f32_ab(1, dw, K, dout, F, x, K, F, K, N);
}

void mha_linear_backward_ref(float *dx, float *dw, float *db, const float *dout, const float *x,
                             const float *w, int64_t N, int64_t F, int64_t K) {
    for (int64_t r = 0; r < N && dx; r++)
        for (int64_t k = 0; k < K; k++) {
            double acc = 0.0;
            for (int64_t f = 0; f < F; f++)
                acc += (double)dout[r * F + f] * w[f * K + k];
            dx[r * K + k] += (float)acc;
        }
    for (int64_t f = 0; f < F; f++) {
        for (int64_t k = 0; k < K && dw; k++) {
            double acc = 0.0;
            for (int64_t r = 0; r < N; r++)
                acc += (double)dout[r * F + f] * x[r * K + k];
            dw[f * K + k] += (float)acc;
        }
        if (db) {
            double acc = 0.0;
            for (int64_t r = 0; r < N; r++)
                acc += dout[r * F + f];
            db[f] += (float)acc;
        }
    }
}

/* ---- nn.Linear, the public entries --------------------------------------------------- */

/* x (N,K) rows and weight (F,K), the environment's choices valid. */
static mha_status linear_check(const mha_tensor *x, const mha_tensor *weight, int64_t *N,
                               int64_t *K, int64_t *F) {
    MHA_TRY(mha_runtime_check());
    MHA_TRY(mha_rows_check(x, "x", -1, N, K));
    MHA_CHECK(weight != NULL, MHA_ERR_NULL, "weight: NULL tensor");
    MHA_TRY(mha_check_tensor(weight, "weight", 2, MHA_F32));
    *F = weight->shape[0];
    int64_t k = *K;
    return mha_matrix_check(weight, "weight", *F, &k);
}

mha_status mha_linear_forward(mha_tensor *out, const mha_tensor *x, const mha_tensor *weight,
                              const mha_tensor *bias) {
    int64_t N, K, F;
    MHA_TRY(linear_check(x, weight, &N, &K, &F));
    MHA_TRY(mha_vector_check(bias, "bias", F));
    MHA_TRY(mha_rows_check_out(out, x, "out", N, F, false));
    MHA_CHECK(!mha_tensors_overlap(out, weight) && (!bias || !mha_tensors_overlap(out, bias)),
              MHA_ERR_ALIAS, "out: overlaps weight or bias");
    mha_linear_f32(out->data, F, x->data, K, weight->data, K, mha_fdata(bias), N, F, K, 0);
    return MHA_OK;
}

mha_status mha_linear_backward(mha_tensor *dx, mha_tensor *dweight, mha_tensor *dbias,
                               const mha_tensor *dout, const mha_tensor *x,
                               const mha_tensor *weight) {
    int64_t N, K, F, k;
    MHA_TRY(linear_check(x, weight, &N, &K, &F));
    MHA_TRY(mha_rows_check_out(dout, x, "dout", N, F, false));
    if (dx) {
        MHA_TRY(mha_rows_check_out(dx, x, "dx", N, K, false));
        MHA_CHECK(!mha_tensors_overlap(dx, dout) && !mha_tensors_overlap(dx, weight),
                  MHA_ERR_ALIAS, "dx: overlaps dout or weight");
    }
    if (dweight) {
        k = K;
        MHA_TRY(mha_matrix_check(dweight, "dweight", F, &k));
        MHA_CHECK(!mha_tensors_overlap(dweight, dout) && !mha_tensors_overlap(dweight, x) &&
                      !mha_tensors_overlap(dweight, weight),
                  MHA_ERR_ALIAS, "dweight: overlaps an input");
    }
    MHA_TRY(mha_vector_check(dbias, "dbias", F));
    mha_linear_backward_f32(mha_gdata(dx), mha_gdata(dweight), mha_gdata(dbias), dout->data, x->data,
                            weight->data, N, F, K);
    return MHA_OK;
}
