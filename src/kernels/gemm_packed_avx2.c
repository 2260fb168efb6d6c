/* gemm_packed_avx2.c - y (M,N) = [y +] bias + x (M,K) w^T [then GELU] with
 * AVX2+FMA on weights packed once (gemm_packed.h): the trained model's
 * projections and MLP (src/bert.c).  The reference is
 * mha_gemm_packed_f32_ref (gemm_packed.c); before GELU the two agree bit
 * for bit (tests/unit/test_gemm_packed.c).
 *
 * Letters: M rows of x and y, N output features, K input features; MR x NR
 * = 4 x 24 register block, KC the k slice, MC rows and NP panels per task.
 *
 * ref: K. Goto, R. van de Geijn, "Anatomy of High-Performance Matrix
 * Multiplication", ACM TOMS 34(3), 2008 (the loop nest); the 4x24 block is
 * the one MLAS and OpenBLAS's Haswell sgemm also offer beside 6x16.
 *
 *   per task (MC rows x NP panels), per KC slice, per panel: the kernel
 *   walks the task's rows 4 at a time with the panel's KC x 24 slice (36
 *   KiB, L1/L2) and x read in place through 4 row pointers (any ldx), so
 *   nothing is packed per call and nothing is allocated;
 *   4x24 keeps 12 YMM accumulators, loads 3 YMM of the panel and broadcasts
 *   4 floats of x per k: 12 FMAs per 7 loads.  Measured on a Zen 1 core
 *   (one 256-bit FMA per cycle) at 92-95 % of the FMA loop's rate, against
 *   85-91 % for 6x16 (12 FMAs per 8 loads) on the same packed panels.
 *
 * Sizes: KC = 384 (one slice for K = 384, four for K = 1536; a panel slice
 * is 36 KiB); MC <= 144 rows (x block MC x KC = 216 KiB and the y tile in
 * L2), NP = 16 panels (384 columns).  The blocking never changes a bit:
 * every element is one FMA chain in k order (gemm_packed.h), stored and
 * reloaded unchanged between slices.
 */
#include "gemm_packed.h"
#include "simd_avx2.h" /* gelu256 */

#include <string.h>

enum { MR = 4, NR = MHA_PACK_NR, KC = 384, MC = 144, NP = 16 };

/* c (MR, NR) rows ldc apart op= a (MR, kc) . b (kc, NR), b a packed panel
 * slice, a rows the pointers a[0..3].  first: the accumulators start from
 * bias (NR floats) [+ c when accumulate]; otherwise from c.  gelu: GELU
 * before the store (the last slice).  Inlined with constant flags. */
static inline __attribute__((always_inline)) void
kernel_4x24(int64_t kc, const float *const a[MR], const float *b, float *c, int64_t ldc,
            const float *bias, int first, int accumulate, int gelu) {
    __m256 acc[MR][3]; /* the loops over it unroll fully: 12 registers */
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++) {
            if (first) {
                acc[r][j] = _mm256_loadu_ps(bias + 8 * j);
                if (accumulate)
                    acc[r][j] = _mm256_add_ps(_mm256_loadu_ps(c + r * ldc + 8 * j), acc[r][j]);
            } else {
                acc[r][j] = _mm256_loadu_ps(c + r * ldc + 8 * j);
            }
        }
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3];
    for (int64_t k = 0; k < kc; k++, b += NR) {
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), b2 = _mm256_loadu_ps(b + 16);
        __m256 s = _mm256_broadcast_ss(a0 + k);
        acc[0][0] = _mm256_fmadd_ps(s, b0, acc[0][0]);
        acc[0][1] = _mm256_fmadd_ps(s, b1, acc[0][1]);
        acc[0][2] = _mm256_fmadd_ps(s, b2, acc[0][2]);
        s = _mm256_broadcast_ss(a1 + k);
        acc[1][0] = _mm256_fmadd_ps(s, b0, acc[1][0]);
        acc[1][1] = _mm256_fmadd_ps(s, b1, acc[1][1]);
        acc[1][2] = _mm256_fmadd_ps(s, b2, acc[1][2]);
        s = _mm256_broadcast_ss(a2 + k);
        acc[2][0] = _mm256_fmadd_ps(s, b0, acc[2][0]);
        acc[2][1] = _mm256_fmadd_ps(s, b1, acc[2][1]);
        acc[2][2] = _mm256_fmadd_ps(s, b2, acc[2][2]);
        s = _mm256_broadcast_ss(a3 + k);
        acc[3][0] = _mm256_fmadd_ps(s, b0, acc[3][0]);
        acc[3][1] = _mm256_fmadd_ps(s, b1, acc[3][1]);
        acc[3][2] = _mm256_fmadd_ps(s, b2, acc[3][2]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++)
            _mm256_storeu_ps(c + r * ldc + 8 * j, gelu ? gelu256(acc[r][j]) : acc[r][j]);
}

/* The kernel with its flags as constants (one copy per combination). */
static void kernel_dispatch(int64_t kc, const float *const a[MR], const float *b, float *c,
                            int64_t ldc, const float *bias, int first, int accumulate,
                            int gelu) {
    if (first && accumulate)
        gelu ? kernel_4x24(kc, a, b, c, ldc, bias, 1, 1, 1)
             : kernel_4x24(kc, a, b, c, ldc, bias, 1, 1, 0);
    else if (first)
        gelu ? kernel_4x24(kc, a, b, c, ldc, bias, 1, 0, 1)
             : kernel_4x24(kc, a, b, c, ldc, bias, 1, 0, 0);
    else
        gelu ? kernel_4x24(kc, a, b, c, ldc, bias, 0, 0, 1)
             : kernel_4x24(kc, a, b, c, ldc, bias, 0, 0, 0);
}

typedef struct packed_gemm {
    float *y;
    int64_t ldy;
    const float *x;
    int64_t ldx;
    const float *wp, *bias;
    int64_t M, N, K;
    int accumulate, gelu;
} packed_gemm;

/* Rows [r0, r0+mc) x panels [p0, p0+np) of y, all of K. */
static void packed_task(const packed_gemm *g, int64_t r0, int64_t mc, int64_t p0, int64_t np) {
    float t[MR * NR] __attribute__((aligned(32))) = {0};
    float bias_pad[NR];
    const int64_t K = g->K;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = K - k0 < KC ? K - k0 : KC;
        const int first = k0 == 0, gelu = g->gelu && k0 + kc == K;
        for (int64_t p = p0; p < p0 + np; p++) {
            const int64_t n0 = p * NR, nr = g->N - n0 < NR ? g->N - n0 : NR;
            const float *b = g->wp + (n0 * K + k0 * NR); /* panel p, row k0 */
            const float *bias = g->bias ? g->bias + n0 : NULL;
            if (!bias || nr < NR) { /* zeros past N (and without bias) */
                memset(bias_pad, 0, sizeof bias_pad);
                if (g->bias)
                    memcpy(bias_pad, g->bias + n0, sizeof(float) * (size_t)nr);
                bias = bias_pad;
            }
            for (int64_t i = 0; i < mc; i += MR) {
                const int64_t mr = mc - i < MR ? mc - i : MR;
                const float *a[MR];
                for (int r = 0; r < MR; r++) /* rows past mr repeat row 0, dropped below */
                    a[r] = g->x + (r0 + i + (r < mr ? r : 0)) * g->ldx + k0;
                float *c = g->y + (r0 + i) * g->ldy + n0;
                if (mr == MR && nr == NR) {
                    kernel_dispatch(kc, a, b, c, g->ldy, bias, first, g->accumulate, gelu);
                    continue;
                }
                /* a partial block through a full tile: the same arithmetic */
                if (!first || g->accumulate)
                    for (int64_t r = 0; r < mr; r++)
                        memcpy(t + r * NR, c + r * g->ldy, sizeof(float) * (size_t)nr);
                kernel_dispatch(kc, a, b, t, NR, bias, first, g->accumulate, gelu);
                for (int64_t r = 0; r < mr; r++)
                    memcpy(c + r * g->ldy, t + r * NR, sizeof(float) * (size_t)nr);
            }
        }
    }
}

void mha_gemm_packed_f32_avx2(float *y, int64_t ldy, const float *x, int64_t ldx,
                              const float *wp, const float *bias, int64_t M, int64_t N,
                              int64_t K, int accumulate, int gelu) {
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { /* no products: the sum is its start, then GELU */
        mha_gemm_packed_f32_ref(y, ldy, x, ldx, wp, bias, M, N, K, accumulate, gelu);
        return;
    }
    const packed_gemm g = {y, ldy, x, ldx, wp, bias, M, N, K, accumulate != 0, gelu != 0};
    /* tasks of about MC rows (a multiple of MR, evened out over the row
     * blocks) x NP panels; which thread runs which task changes no bit */
    const int64_t P = (N + NR - 1) / NR, npb = (P + NP - 1) / NP, np = (P + npb - 1) / npb;
    const int64_t nmb = (M + MC - 1) / MC;
    const int64_t mc = ((M + nmb - 1) / nmb + MR - 1) / MR * MR;
    const int64_t tasks = nmb * npb;
    int nt = mha_threads();
    if (nt > tasks)
        nt = (int)tasks;
    if ((double)M * (double)N * (double)K < 2.0e6) /* not worth waking threads */
        nt = 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t r0 = t / npb * mc, p0 = t % npb * np;
        if (r0 < M)
            packed_task(&g, r0, M - r0 < mc ? M - r0 : mc, p0, P - p0 < np ? P - p0 : np);
    }
}

void mha_gelu_as_f32_avx2(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, gelu256(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float in[8] = {0}, out[8];
        memcpy(in, x + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(out, gelu256(_mm256_loadu_ps(in)));
        memcpy(y + i, out, sizeof(float) * (size_t)(n - i));
    }
}
