/* gemm_ref.c - the portable GEMMs, the reference of the avx2 kernel beside
 * it (gemm_avx2.c) and the path every build has (src/kernels/gemm.h):
 *   mha_gemm_f32_ref     y (M,N) += x (M,K) w^T, w (N,K);
 *   mha_gemm_f32_ab_ref  C (M,N) += op(A) B (K,N), op(A) = A (M,K) or A^T.
 * Letters: M rows, N columns of the result, K the summed dimension.  Any
 * leading dimension (0 and overlapping input rows included) is read as
 * given.  The split into blocks depends only on the problem size, so every
 * element is summed in one order for any thread count.
 */
#include "gemm.h"

/* Portable fallback: blocks of rows x columns so a panel of w stays in cache;
 * the k-loop is innermost and contiguous in both x and w. */
void mha_gemm_f32_ref(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
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
void mha_gemm_f32_ab_ref(int trans_a, float *c, int64_t ldc, const float *a, int64_t lda,
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
