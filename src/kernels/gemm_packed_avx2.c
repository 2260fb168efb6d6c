/* gemm_packed_avx2.c - y (M,N) = [y +] bias + x (M,K) w^T [then GELU] with
 * AVX2+FMA on weights packed once (gemm_packed.h): the trained model's
 * projections and MLP (src/bert.c).  The reference is
 * mha_gemm_packed_f32_ref (gemm_packed.c); before GELU the two agree bit
 * for bit (tests/unit/test_gemm_packed.c).
 *
 * Letters: M rows of x and y, N output features, K input features; MR x NR
 * = 4 x 24 register block.  The loop nest around it (k slices, row and
 * panel tasks, tails, threads) is mha_gemm_packed_run in gemm_packed.c.
 *
 * The 4x24 block is the one MLAS and OpenBLAS's Haswell sgemm also offer
 * beside 6x16.  It keeps 12 YMM accumulators, loads 3 YMM of the panel and
 * broadcasts 4 floats of x per k: 12 FMAs per 7 loads.  Measured on a Zen 1
 * core (one 256-bit FMA per cycle) at 92-95 % of the FMA loop's rate,
 * against 85-91 % for 6x16 (12 FMAs per 8 loads) on the same packed panels.
 */
#include "gemm_packed.h"
#include "simd_avx2.h" /* gelu256 */

#include <string.h> /* mha_gelu_as_f32_avx2's tail */

enum { MR = 4, NR = MHA_PACK_NR };

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
static void kernel_dispatch(int64_t kc, const float *const *a, const float *b, float *c,
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

const mha_gemm_packed_isa mha_gemm_packed_isa_avx2 = {MR, kernel_dispatch};

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
