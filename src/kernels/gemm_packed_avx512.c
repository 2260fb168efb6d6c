/* gemm_packed_avx512.c - the packed-weight GEMM's 8x24 AVX-512 block: y
 * (M,N) = [y +] bias + x (M,K) w^T [then GELU] on weights packed once
 * (gemm_packed.h), for the trained model's projections and MLP (src/bert.c).
 * The loop nest around the block is mha_gemm_packed_run (gemm_packed.c); the
 * reference is mha_gemm_packed_f32_ref, which this block matches bit for bit
 * before GELU (every element is one FMA chain in k order), and GELU is
 * gelu512, lane for lane the bits of the AVX2 block's gelu256.
 *
 * Letters: MR x NR = 8 x 24 register block, kc the k slice.
 *
 * The panel is 24 columns wide (the layout is shared with the AVX2 4x24
 * block, so a model packs its weights once whatever the ISA): one ZMM
 * (columns 0-15) and one YMM (16-23) per row.  8 rows keep 16 accumulators;
 * per k: 2 panel loads, 8 broadcasts (the YMM FMA takes the low half of the
 * ZMM broadcast), 16 FMAs for 384 FLOPs - 19 of 32 vector registers, and 8
 * row pointers in general registers (12 rows would spill them).  On Zen 4
 * (512-bit FMAs in two passes) that is the FMA peak with 10 loads per 12
 * FMA cycles; on cores with two 512-bit FMA ports, 3/4 of their peak
 * against the AVX2 block's 1/2.
 */
#include "gemm_packed.h"
#include "simd_avx2.h"   /* gelu256 */
#include "simd_avx512.h" /* gelu512 */

enum { MR = 8, NR = MHA_PACK_NR };

/* c (MR, NR) rows ldc apart op= a (MR, kc) . b (kc, NR): see
 * mha_gemm_packed_isa.block.  Inlined with constant flags. */
static inline __attribute__((always_inline)) void
block_8x24(int64_t kc, const float *const *a, const float *b, float *c, int64_t ldc,
           const float *bias, int first, int accumulate, int gelu) {
    __m512 lo[MR];
    __m256 hi[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        if (first) {
            lo[r] = _mm512_loadu_ps(bias), hi[r] = _mm256_loadu_ps(bias + 16);
            if (accumulate) {
                lo[r] = _mm512_add_ps(_mm512_loadu_ps(c + r * ldc), lo[r]);
                hi[r] = _mm256_add_ps(_mm256_loadu_ps(c + r * ldc + 16), hi[r]);
            }
        } else {
            lo[r] = _mm512_loadu_ps(c + r * ldc), hi[r] = _mm256_loadu_ps(c + r * ldc + 16);
        }
    }
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5],
                *a6 = a[6], *a7 = a[7];
    for (int64_t k = 0; k < kc; k++, b += NR) {
        const __m512 b0 = _mm512_loadu_ps(b);
        const __m256 b1 = _mm256_loadu_ps(b + 16);
        __m512 s;
#define ROW(r, ar)                                                                            \
    s = _mm512_set1_ps(ar[k]);                                                                \
    lo[r] = _mm512_fmadd_ps(s, b0, lo[r]);                                                    \
    hi[r] = _mm256_fmadd_ps(_mm512_castps512_ps256(s), b1, hi[r])
        ROW(0, a0);
        ROW(1, a1);
        ROW(2, a2);
        ROW(3, a3);
        ROW(4, a4);
        ROW(5, a5);
        ROW(6, a6);
        ROW(7, a7);
#undef ROW
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        _mm512_storeu_ps(c + r * ldc, gelu ? gelu512(lo[r]) : lo[r]);
        _mm256_storeu_ps(c + r * ldc + 16, gelu ? gelu256(hi[r]) : hi[r]);
    }
}

/* The block with its flags as constants (one copy per combination). */
static void block_dispatch(int64_t kc, const float *const *a, const float *b, float *c,
                           int64_t ldc, const float *bias, int first, int accumulate, int gelu) {
    if (first && accumulate)
        gelu ? block_8x24(kc, a, b, c, ldc, bias, 1, 1, 1)
             : block_8x24(kc, a, b, c, ldc, bias, 1, 1, 0);
    else if (first)
        gelu ? block_8x24(kc, a, b, c, ldc, bias, 1, 0, 1)
             : block_8x24(kc, a, b, c, ldc, bias, 1, 0, 0);
    else
        gelu ? block_8x24(kc, a, b, c, ldc, bias, 0, 0, 1)
             : block_8x24(kc, a, b, c, ldc, bias, 0, 0, 0);
}

const mha_gemm_packed_isa MHA_AVX512_SYMBOL(mha_gemm_packed_isa_avx512) = {MR, block_dispatch};
