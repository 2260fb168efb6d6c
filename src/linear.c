/* linear.c - y = x w^T + bias, the projections' GEMM; and the backward's
 * C += A B, C += A^T B (mha_gemm_f32_ab).
 *
 * Three paths (src/kernels/gemm.h): one cblas_sgemm call (OpenBLAS), mha's
 * packed AVX2+FMA kernel (src/kernels/gemm_avx2.c), or the cache-blocked
 * portable loop below (the reference, always built).  Letters: M rows of x,
 * K input features, N output features.
 */
#include "internal.h"
#include "kernels/gemm.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifdef MHA_HAVE_CBLAS
#include <cblas.h>
#endif

/* Portable fallback: blocks of rows x columns so a panel of w stays in cache;
 * the k-loop is innermost and contiguous in both x and w. */
static void linear_blocked(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                           int64_t ldw, int64_t M, int64_t N, int64_t K) {
    enum { ROWS = 32, COLS = 64 };
#pragma omp parallel for collapse(2) schedule(static) num_threads(mha_threads())
    for (int64_t r0 = 0; r0 < M; r0 += ROWS) {
        for (int64_t c0 = 0; c0 < N; c0 += COLS) {
            int64_t r1 = r0 + ROWS < M ? r0 + ROWS : M;
            int64_t c1 = c0 + COLS < N ? c0 + COLS : N;
            for (int64_t r = r0; r < r1; r++) {
                const float *xr = x + r * ldx;
                for (int64_t c = c0; c < c1; c++) {
                    const float *wc = w + c * ldw;
                    float acc[8] = {0};
                    int64_t kk = 0;
                    for (; kk + 8 <= K; kk += 8)
                        for (int u = 0; u < 8; u++)
                            acc[u] += xr[kk + u] * wc[kk + u];
                    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                              ((acc[4] + acc[5]) + (acc[6] + acc[7]));
                    for (; kk < K; kk++)
                        s += xr[kk] * wc[kk];
                    y[r * ldy + c] += s;
                }
            }
        }
    }
}

/* Portable C (M,N) += op(A) (M,K) B (K,N), op(A) = A (M,K) or A^T for A
 * (K,M): blocks of rows x columns of C (fixed by the problem size), each
 * owned by one thread; per row, k ascending, an axpy of a row of B into C
 * (contiguous, vectorisable), so every element sums k in order. */
static void gemm_ab_blocked(int trans_a, float *c, int64_t ldc, const float *a, int64_t lda,
                            const float *b, int64_t ldb, int64_t M, int64_t N, int64_t K) {
    enum { ROWS = 16, COLS = 256, KB = 256 };
    const int64_t nrb = (M + ROWS - 1) / ROWS, ncb = (N + COLS - 1) / COLS;
#pragma omp parallel for schedule(static) num_threads(mha_threads())
    for (int64_t t = 0; t < nrb * ncb; t++) {
        const int64_t r0 = t / ncb * ROWS, c0 = t % ncb * COLS;
        const int64_t r1 = r0 + ROWS < M ? r0 + ROWS : M, c1 = c0 + COLS < N ? c0 + COLS : N;
        for (int64_t k0 = 0; k0 < K; k0 += KB) {
            const int64_t k1 = k0 + KB < K ? k0 + KB : K;
            for (int64_t r = r0; r < r1; r++) {
                float *cr = c + r * ldc;
                for (int64_t k = k0; k < k1; k++) {
                    const float s = trans_a ? a[k * lda + r] : a[r * lda + k];
                    const float *br = b + k * ldb;
                    for (int64_t j = c0; j < c1; j++)
                        cr[j] += s * br[j];
                }
            }
        }
    }
}

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
    mha_gemm_path path = mha_gemm_resolve(requested);
    if (M == 0 || N == 0)
        return path;
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
        mha_gemm_f32_avx2(y, ldy, x, ldx, w, ldw, M, N, K);
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
            mha_gemm_f32_avx2(y, ldy, x, ldx, w, ldw, M, N, K);
            return path;
        }
    }
#endif
    linear_blocked(y, ldy, x, ldx, w, ldw, M, N, K);
    return MHA_GEMM_PORTABLE;
}

mha_gemm_path mha_gemm_f32_ab_path(mha_gemm_path requested, int trans_a, float *c, int64_t ldc,
                                   const float *a, int64_t lda, const float *b, int64_t ldb,
                                   int64_t M, int64_t N, int64_t K) {
    mha_gemm_path path = mha_gemm_resolve(requested);
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
    gemm_ab_blocked(trans_a, c, ldc, a, lda, b, ldb, M, N, K);
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
