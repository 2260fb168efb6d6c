/* linear.c - y = x w^T + bias, the projections' GEMM.
 *
 * With CBLAS (OpenBLAS) this is one sgemm call; without, a cache-blocked
 * portable loop.  Letters: M rows of x, K input features, N output features.
 */
#include "internal.h"

#include <string.h>

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

void mha_linear_f32(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                    int64_t ldw, const float *bias, int64_t M, int64_t N, int64_t K,
                    int accumulate) {
    if (M == 0 || N == 0)
        return;
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
        return;
#ifdef MHA_HAVE_CBLAS
    if (M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && ldx <= INT32_MAX &&
        ldy <= INT32_MAX && ldw <= INT32_MAX) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, x,
                    (int)ldx, w, (int)ldw, 1.0f, y, (int)ldy);
        return;
    }
#endif
    linear_blocked(y, ldy, x, ldx, w, ldw, M, N, K);
}
