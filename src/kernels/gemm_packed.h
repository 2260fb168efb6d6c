/* gemm_packed.h - y (M,N) = [y +] bias + x (M,K) w^T [then GELU], with w
 * packed once (at model load) into the micro-kernel's panel layout.
 *
 * Letters: M rows of x and y (tokens), N output features (rows of w), K
 * input features; NR = 24 columns per panel.
 *
 * PACKED LAYOUT  wp (P, K, NR), P = ceil(N / NR): panel p holds columns
 *   [p*NR, p*NR + NR) of w^T, k-major: wp[(p*K + k)*NR + j] = w[p*NR + j][k],
 *   zero past N.  One contiguous NR-float row per k is what the 4x24 kernel
 *   loads, so no product ever packs w again.
 *
 * THE SUM  every y element is, in this order,
 *     acc = bias[n] (0 without bias);  acc = y[m][n] + acc when accumulating;
 *     acc = fma(x[m][k], w[n][k], acc) for k = 0, 1, ..., K-1;
 *     y[m][n] = gelu ? gelu_as(acc) : acc
 *   one fused multiply-add chain in k order.  It depends on nothing but the
 *   element's own row, column and K: the same bits for any M, any blocking,
 *   any thread count, on the avx2 kernel and on the reference alike (the
 *   reference's fmaf is correctly rounded, like the FMA instruction; GELU
 *   is the one part that may differ, by an ulp or so).
 *
 * GELU here is 0.5 x (1 + erf(x / sqrt 2)) with erf from Abramowitz and
 * Stegun 7.1.26 (|error| <= 1.5e-7), PyTorch's own vectorised erf for the
 * exact GELU on CPU, written as 1 + erf(z) = erfc(-z) so the negative tail
 * keeps its relative precision.
 */
#ifndef MHA_KERNELS_GEMM_PACKED_H
#define MHA_KERNELS_GEMM_PACKED_H

#include "../internal.h"

enum { MHA_PACK_NR = 24, MHA_PACK_MR_MAX = 8 };

/* One ISA's register block: c (mr, NR) rows ldc apart op= a (mr, kc) .
 * b (kc, NR), b a packed panel slice (rows NR floats apart), a's rows the
 * pointers a[0..mr).  first: the sums start from bias (NR floats) [+ c when
 * accumulate], otherwise from c; gelu: GELU before the store (the last k
 * slice).  The driver (gemm_packed.c, mha_gemm_packed_run) owns the loop
 * nest, tails and threads. */
typedef struct mha_gemm_packed_isa {
    int mr; /* rows per block, <= MHA_PACK_MR_MAX */
    void (*block)(int64_t kc, const float *const *a, const float *b, float *c, int64_t ldc,
                  const float *bias, int first, int accumulate, int gelu);
} mha_gemm_packed_isa;

/* The 4x24 AVX2 block (gemm_packed_avx2.c) and the 8x24 AVX-512 one
 * (gemm_packed_avx512.c; check mha_avx512_runs(), take it with
 * MHA_AVX512_PICK). */
extern const mha_gemm_packed_isa mha_gemm_packed_isa_avx2;
MHA_AVX512_DECLARE(mha_gemm_packed_isa, mha_gemm_packed_isa_avx512);

/* The product below on isa's block. */
void mha_gemm_packed_run(const mha_gemm_packed_isa *isa, float *y, int64_t ldy, const float *x,
                         int64_t ldx, const float *wp, const float *bias, int64_t M, int64_t N,
                         int64_t K, int accumulate, int gelu);

/* Floats of w (N,K) once packed: ceil(N/NR) * NR * K. */
int64_t mha_gemm_packed_floats(int64_t N, int64_t K);

/* wp (ceil(N/NR), K, NR) = w (N,K) rows ldw apart, in panels. */
void mha_gemm_pack(float *wp, const float *w, int64_t ldw, int64_t N, int64_t K);

/* Scalar GELU of the packed products (A&S erf, see above). */
float mha_gelu_as_f32(float x);

/* y (M,N) rows ldy apart = [y +] bias (N or NULL) + x (M,K) rows ldx apart
 * times wp^T, then GELU when gelu != 0.  Threads over row x column tasks.
 * _ref: the reference loop (fmaf); _avx2: the 4x24 block, only after a CPU
 * check; _avx512: the 8x24 block, only after mha_avx512_runs().  None
 * allocates. */
void mha_gemm_packed_f32_ref(float *y, int64_t ldy, const float *x, int64_t ldx,
                             const float *wp, const float *bias, int64_t M, int64_t N,
                             int64_t K, int accumulate, int gelu);
void mha_gemm_packed_f32_avx2(float *y, int64_t ldy, const float *x, int64_t ldx,
                              const float *wp, const float *bias, int64_t M, int64_t N,
                              int64_t K, int accumulate, int gelu);
void mha_gemm_packed_f32_avx512(float *y, int64_t ldy, const float *x, int64_t ldx,
                                const float *wp, const float *bias, int64_t M, int64_t N,
                                int64_t K, int accumulate, int gelu);

/* For tests: GELU of n floats through the avx2 kernel's vector code. */
void mha_gelu_as_f32_avx2(float *y, const float *x, int64_t n);

#endif /* MHA_KERNELS_GEMM_PACKED_H */
