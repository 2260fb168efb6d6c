/* gemm.h - the projections' GEMM, y (M,N) += x (M,K) w^T (w is (N,K)).
 *
 * Letters: M rows of x and y, N output features (rows of w), K input
 * features.  Three paths compute the same product (rounding differs):
 *   blas      cblas_sgemm (OpenBLAS, when the build found it);
 *   avx2      mha's own packed SIMD GEMM (gemm_avx2.c): the 6x16 AVX2+FMA
 *             block, or the 12x32 AVX-512 one (gemm_avx512.c) where it runs;
 *   portable  the blocked C loops in gemm_ref.c (always built, the reference).
 * mha_linear_f32 (internal.h) picks one: MHA_GEMM=blas|avx2|portable forces
 * a path; otherwise OpenBLAS unless its run-time core has no AVX2 kernels
 * (Debian's 0.3.21 calls unknown CPUs "Prescott" and runs SSE3 code) while
 * the CPU has AVX2+FMA, in which case avx2.  See docs/performance.md.
 */
#ifndef MHA_KERNELS_GEMM_H
#define MHA_KERNELS_GEMM_H

#include "../internal.h"

typedef enum {
    MHA_GEMM_AUTO = 0,
    MHA_GEMM_BLAS,
    MHA_GEMM_AVX2,
    MHA_GEMM_PORTABLE,
} mha_gemm_path;

const char *mha_gemm_path_name(mha_gemm_path path);

/* MHA_GEMM's choice, AUTO when unset, empty or unknown (runtime.c). */
mha_gemm_path mha_runtime_gemm_env(void);

/* The path a call with `requested` runs on this machine and build (never
 * AUTO): AUTO reads MHA_GEMM, then the CPU / OpenBLAS check; an unavailable
 * path (blas without CBLAS, avx2 without AVX2/FMA) falls back to the best
 * available one. */
mha_gemm_path mha_gemm_resolve(mha_gemm_path requested);

/* The path of one product of M*N*K multiply-adds: mha_gemm_resolve's,
 * except that an automatic choice of OpenBLAS gives way to mha's own GEMM
 * for products up to MHA_GEMM_OWN_MAX_MNK on AVX-512 machines.  After each
 * call OpenBLAS's threads spin (sched_yield) for about 2^28 cycles and take
 * a core from the library's OpenMP team through the attention and the next
 * products; OpenBLAS's kernel is faster (1.2x on one thread), which pays
 * only on large products.  Measured on the Intel Xeon, 2 threads, whole MHA
 * forward in a steady run of calls (docs/performance.md, "Intel Xeon with
 * AMX, third visit" and "fifth visit"): E 512 L 256: 0.46x, L 512: 0.71x
 * the time of the OpenBLAS route; B 32 L 128 E 384 (qkv 2^30.8): 30-31 ms
 * against 35-41; E 512 L 4096 (2^31.6): level; B 8 L 512 E 512 (2^31.6):
 * 1.07x, E 1024 L 1024 (2^31.6): 1.05x the OpenBLAS route's time.
 * MHA_GEMM=blas still forces OpenBLAS. */
#define MHA_GEMM_OWN_MAX_MNK ((double)(1u << 31))
mha_gemm_path mha_gemm_resolve_for(mha_gemm_path requested, int64_t M, int64_t N, int64_t K);

/* mha_linear_f32 on a chosen path; returns the path that ran.  No path
 * allocates (the avx2 packing buffer is on the stack). */
mha_gemm_path mha_linear_f32_path(mha_gemm_path requested, float *y, int64_t ldy, const float *x,
                                  int64_t ldx, const float *w, int64_t ldw, const float *bias,
                                  int64_t M, int64_t N, int64_t K, int accumulate);

/* portable path (gemm_ref.c, the reference): y (M,N) += x (M,K) w^T and
 * C (M,N) += op(A) B as below. */
void mha_gemm_f32_ref(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                      int64_t ldw, int64_t M, int64_t N, int64_t K);
void mha_gemm_f32_ab_ref(int trans_a, float *c, int64_t ldc, const float *a, int64_t lda,
                         const float *b, int64_t ldb, int64_t M, int64_t N, int64_t K);

/* The avx2 path's register block, one per ISA: c (mr, nr) rows ldc apart +=
 * a (mr, kc) . b (kc, nr), a's rows the pointers a[0..mr) (any stride), b a
 * packed panel (kc rows of nr floats, 64-byte aligned); with init non-NULL
 * every row of c starts from init (nr floats) instead of c's old values
 * (c = init + a . b: the bias of a first k slice, which y then never has to
 * hold beforehand).  Each c element is one FMA chain in k order from its
 * start value, so every block gives the same bits.  The driver
 * (gemm_avx2.c: packing, loop nest, tails, threads) is shared:
 *   mha_gemm_isa_avx2    the 6x16 AVX2+FMA block (gemm_avx2.c);
 *   mha_gemm_isa_avx512  the 12x32 AVX-512 block (gemm_avx512.c; check
 *                        mha_avx512_runs(), take it with MHA_AVX512_PICK). */
enum { MHA_GEMM_MR_MAX = 12, MHA_GEMM_NR_MAX = 32 };
typedef struct mha_gemm_isa {
    int mr, nr; /* rows <= MHA_GEMM_MR_MAX, columns <= MHA_GEMM_NR_MAX (a multiple of 16) */
    int mc;     /* rows of y per task, a multiple of mr (the x block kept in L2) */
    void (*block)(int64_t kc, const float *const *a, const float *b, float *c, int64_t ldc,
                  const float *init);
} mha_gemm_isa;
extern const mha_gemm_isa mha_gemm_isa_avx2;
MHA_AVX512_DECLARE(mha_gemm_isa, mha_gemm_isa_avx512);

/* The block the avx2 path runs here: avx512 where the kernel choice
 * resolves to avx512 and mha_avx512_runs() (as src/bert.c picks the packed
 * blocks), else avx2.  MHA_KERNEL=avx2 keeps the 6x16 block. */
const mha_gemm_isa *mha_gemm_isa_pick(void);

/* The two products below on a chosen block (tests compare blocks). */
void mha_gemm_f32_run(const mha_gemm_isa *isa, float *y, int64_t ldy, const float *x,
                      int64_t ldx, const float *w, int64_t ldw, int64_t M, int64_t N, int64_t K,
                      const float *bias, int set);
void mha_gemm_f32_ab_run(const mha_gemm_isa *isa, int trans_a, float *c, int64_t ldc,
                         const float *a, int64_t lda, const float *b, int64_t ldb, int64_t M,
                         int64_t N, int64_t K);

/* avx2 path, on mha_gemm_isa_pick()'s block: set = 0: y (M,N) += x (M,K)
 * w^T (y holds its initial value); set = 1: y = bias + x w^T, bias (N) or
 * NULL for zero, y's old values never read (the same bits as y filled with
 * bias first: each element's FMA chain starts from its bias value).  K >= 1.
 * Only call after a CPU check. */
void mha_gemm_f32_avx2(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                       int64_t ldw, int64_t M, int64_t N, int64_t K, const float *bias, int set);

/* The backward's products, C (M,N) += op(A) B (K,N), on a chosen path;
 * returns the path that ran.
 *   trans_a = 0: op(A) = A, A (M,K) rows lda apart (dX = dY W);
 *   trans_a = 1: op(A) = A^T, A (K,M) rows lda apart (dW = dY^T X).
 * B (K,N) rows ldb apart, C rows ldc apart; C always accumulates.  Each C
 * element is owned by one task whose sum order is fixed by the problem
 * size: bit-identical for any thread count.  No path allocates. */
mha_gemm_path mha_gemm_f32_ab_path(mha_gemm_path requested, int trans_a, float *c, int64_t ldc,
                                   const float *a, int64_t lda, const float *b, int64_t ldb,
                                   int64_t M, int64_t N, int64_t K);

/* avx2 path of the above (same packed kernel as mha_gemm_f32_avx2; only the
 * packing of A and B differs).  Only call after a CPU check. */
void mha_gemm_f32_ab_avx2(int trans_a, float *c, int64_t ldc, const float *a, int64_t lda,
                          const float *b, int64_t ldb, int64_t M, int64_t N, int64_t K);

#endif /* MHA_KERNELS_GEMM_H */
