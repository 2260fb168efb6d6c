/* gemm_avx512.c - the avx2 GEMM path's AVX-512 register block: c (12, 32)
 * += a (12, kc) . b (kc, 32), run by the shared driver in gemm_avx2.c
 * (packing, loop nest, tails, threads) through mha_gemm_isa (gemm.h).
 *
 * Letters: MR x NR = 12 x 32 register block, kc the k slice; a's rows are
 * read in place (x rows, any ldx) or from the driver's packed block of a
 * transposed A; b is a packed panel, kc rows of 32 floats.
 *
 * Per k: 2 ZMM panel loads, 12 broadcasts, 24 FMAs (768 FLOP) into 24 ZMM
 * accumulators - 26 + 1 of 32 vector registers.  On cores with two 512-bit
 * FMA ports that is 12 FMA cycles per 14 loads (3 load ports), the FMA
 * bound; the 6x16 AVX2 block reaches at most half of that peak.  Each c
 * element is the same FMA chain in k order as in the AVX2 block, so the two
 * give identical bits (tests/unit/test_gemm.c).
 */
#include "gemm.h"

#include "simd_avx512.h" /* the intrinsics, or their emulation (test library) */

enum { MR = 12, NR = 32, MC = 576 }; /* MC: rows per task (gemm_avx2.c, Sizes) */

/* c (MR, NR) rows ldc apart += a (MR, kc) . b (kc, NR), or c = init + a . b
 * with init (NR) non-NULL: mha_gemm_isa.block. */
static void block_12x32(int64_t kc, const float *const *a, const float *b, float *c,
                        int64_t ldc, const float *init) {
    __m512 lo[MR], hi[MR];
    if (init) {
        const __m512 i0 = _mm512_loadu_ps(init), i1 = _mm512_loadu_ps(init + 16);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++)
            lo[r] = i0, hi[r] = i1;
    } else {
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++)
            lo[r] = _mm512_loadu_ps(c + r * ldc), hi[r] = _mm512_loadu_ps(c + r * ldc + 16);
    }
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5],
                *a6 = a[6], *a7 = a[7], *a8 = a[8], *a9 = a[9], *a10 = a[10], *a11 = a[11];
    for (int64_t k = 0; k < kc; k++, b += NR) {
        const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        __m512 s;
#define ROW(r, ar)                                                                            \
    s = _mm512_set1_ps(ar[k]);                                                                \
    lo[r] = _mm512_fmadd_ps(s, b0, lo[r]);                                                    \
    hi[r] = _mm512_fmadd_ps(s, b1, hi[r])
        ROW(0, a0);
        ROW(1, a1);
        ROW(2, a2);
        ROW(3, a3);
        ROW(4, a4);
        ROW(5, a5);
        ROW(6, a6);
        ROW(7, a7);
        ROW(8, a8);
        ROW(9, a9);
        ROW(10, a10);
        ROW(11, a11);
#undef ROW
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
        _mm512_storeu_ps(c + r * ldc, lo[r]), _mm512_storeu_ps(c + r * ldc + 16, hi[r]);
}

const mha_gemm_isa MHA_AVX512_SYMBOL(mha_gemm_isa_avx512) = {MR, NR, MC, block_12x32};
