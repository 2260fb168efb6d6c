/* attention_short_avx512bf16.c - the whole-row attention (attention_short.h)
 * on bf16 q, k and v with vdpbf16ps (AVX512_BF16): the float32 loop of
 * attention_short_avx512.c with both products on bf16 pairs.  Letters: L
 * query rows, S keys, H heads, d head width (any d >= 1), d2 = ceil(d/2)
 * pairs of a q or k row, S2 = ceil(S/2) pairs of keys, Lp = S rounded up to
 * 32, dvp = d rounded up to 32 (panels of 32 columns), R = 8 query rows.
 * Compiled with AVX512BF16_FLAGS; reached only through
 * mha_attn_short_bf16_avx512 (attention_short.c), after
 * mha_avx512_bf16_runs() - natively or emulated.
 *
 * Per head, packed once (zeros in every padding lane):
 *   kt (Lp/32, d2, 32)  K^T as pairs along d, kt[t][j] = (k[j][2t],
 *                k[j][2t+1]), by 16 x 16 transposes of 32-bit lanes
 *                (transpose16_ps);
 *   vp (dvp/32, S2, 32) V as pairs along the keys, vp[t][c] = (v[2t][c],
 *                v[2t+1][c]), two rows zero-extended and merged;
 * both panel-major, so a 32-column product streams one contiguous panel
 * (d2 or S2 rows of 128 bytes) where row-major rows S or d apart made its
 * loads stride through L2.
 * Per block of R = 8 query rows (q rows copied as pairs, an odd d's last
 * pair completed by a zero):
 *   sc (8, Lp) = scale log2(e) q K^T        (dp_block: A q pairs, B kt)
 *   per row  e = 2^(s - max s), l = sum e in float32, P = bf16(e) with
 *            zeros past S (exactly FlashAttention's rounding point; here
 *            relative to the row's own max, as the reference rounds);
 *            an -inf score marks its key -0.0 and the row's P V is redone
 *            skipping it, as the float32 loop does
 *   ctx (8, d) = P V / l                    (dp_block: A P pairs, B vp),
 *            stored as float32 or rounded to bf16;
 * causal (diag >= 0), the products stop at the block's last row's keys
 * and each row's softmax at its own, zeros between: half the work.
 * Register blocking (dp_block): 8 rows x 2 ZMM = 16 accumulators; per pair
 * step 2 loads of B, 8 broadcasts of an A pair and 16 vdpbf16ps (32 MACs
 * each): the float32 block's shape at twice its multiply-adds.  Products of
 * bf16 values are exact in float32 and vdpbf16ps sums them in float32
 * (attention_flash_avx512bf16.c, "Precision"), so the scores differ from
 * the float32 loop on the same values only in the order of the sums.
 *
 * Why whole rows for bf16 too: the flash driver's per-block softmax
 * (running max, rescaling, 128-key calls) costs the same cycles as in
 * float32 while the products take half, so at L = 128 it made the bf16
 * forward slower than the float32 whole-row loop (docs/performance.md).
 * Memory: kt and vp hold S d 2-byte values each, half the float32 loop's
 * K^T and V; the serving bound is the float32 one (mha_attn_short_serves).
 */
#include "attention_short.h"
#include "convert.h"

#include <math.h>
#include <string.h>

#include "simd_avx512.h"

enum { R = 8, NV = 16, PW = 32 }; /* query rows per block; lanes per ZMM; panel width */

/* The first n lanes of 16 (none for n <= 0: the padding past S or d). */
static inline __mmask16 lanes(int64_t n) { return n <= 0 ? 0 : mask16(n); }

static inline __m512bh as_bh(__m512i x) {
    __m512bh r;
    memcpy(&r, &x, sizeof r);
    return r;
}

/* C (R, nv*16) = A (R, K pairs) B (K pairs, nv*16 columns), nv = 1 or 2: a[r]
 * is A's row r of pairs, B's rows of pairs ldb apart with columns under m0,
 * m1 (the padding lanes of B are zeros).  Epilogue for rows r < rows:
 * c[r] = acc * f[0] (div = 0) or acc / f[r] (div = 1), stored as float32
 * or, with bf16 out, rounded to bf16 (c[r] then a uint16_t row). */
static inline __attribute__((always_inline)) void
dp_block(void *const c[R], const uint32_t *const a[R], const uint32_t *b, int64_t ldb, int64_t K,
         __mmask16 m0, __mmask16 m1, int rows, const float *f, const int div, const int nv,
         const int bf16_out) {
    __m512 acc[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const uint32_t *bk = b + k * ldb;
        const __m512bh b0 = as_bh(_mm512_maskz_loadu_epi32(m0, bk));
        const __m512bh b1 = nv == 2 ? as_bh(_mm512_maskz_loadu_epi32(m1, bk + NV)) : b0;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512bh x = as_bh(_mm512_set1_epi32((int)a[r][k]));
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
            if (nv == 2)
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        if (r >= rows)
            break;
        const __m512 fr = _mm512_set1_ps(div ? f[r] : f[0]);
#pragma GCC unroll 2
        for (int u = 0; u < nv; u++) {
            const __m512 y = div ? _mm512_div_ps(acc[r][u], fr) : _mm512_mul_ps(acc[r][u], fr);
            const __mmask16 m = u ? m1 : m0;
            if (bf16_out) {
                const __m256bh h = _mm512_cvtneps_pbh(y);
                __m256i bits;
                memcpy(&bits, &h, sizeof bits);
                _mm256_mask_storeu_epi16((uint16_t *)c[r] + u * NV, m, bits);
            } else {
                _mm512_mask_storeu_ps((float *)c[r] + u * NV, m, y);
            }
        }
    }
}

/* C (rows, n) = A B as above over column panels of 32 (c[r] advancing by
 * es bytes a column), B panel-major: panel P at b + P rows 32, its first K
 * rows of 32 pairs taken; the last panel under masks. */
static void dp_rows(void *const c[R], size_t es, const uint32_t *const a[R], const uint32_t *b,
                    int64_t rows_b, int64_t K, int64_t n, int rows, const float *f,
                    const int div, const int bf16_out) {
    for (int64_t p = 0; p < n; p += PW) {
        void *cp[R];
        for (int r = 0; r < R; r++)
            cp[r] = (char *)c[r] + (size_t)p * es;
        const int64_t left = n - p;
        const __mmask16 m0 = mask16(left), m1 = left > NV ? mask16(left - NV) : 0;
        const uint32_t *bp = b + p * rows_b; /* panel p / PW */
#define MHA_DP(div_, nv_, out_) dp_block(cp, a, bp, PW, K, m0, m1, rows, f, div_, nv_, out_)
        if (!div)
            left > NV ? MHA_DP(0, 2, 0) : MHA_DP(0, 1, 0);
        else if (!bf16_out)
            left > NV ? MHA_DP(1, 2, 0) : MHA_DP(1, 1, 0);
        else
            left > NV ? MHA_DP(1, 2, 1) : MHA_DP(1, 1, 1);
#undef MHA_DP
    }
}

/* kt (Lp/32, d2, 32) = K^T pairs of k (S, d) bf16 rows ld apart, in panels
 * of 32 keys; zeros for the keys S..Lp and an odd d's last high half. */
static void pack_kt(uint32_t *kt, int64_t Lp, const uint16_t *k, int64_t ld, int64_t S,
                    int64_t d) {
    const int64_t d2 = (d + 1) / 2;
    for (int64_t j0 = 0; j0 < Lp; j0 += NV)
        for (int64_t t0 = 0; t0 < d2; t0 += NV) {
            const int64_t left = d - 2 * t0; /* bf16 elements of the 16 pairs */
            const __mmask32 m = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1u);
            __m512 r[NV];
#pragma GCC unroll 16
            for (int j = 0; j < NV; j++)
                r[j] = j0 + j < S ? _mm512_castsi512_ps(
                                        _mm512_maskz_loadu_epi16(m, k + (j0 + j) * ld + 2 * t0))
                                  : _mm512_setzero_ps();
            transpose16_ps(r);
            const int64_t nt = d2 - t0;
#pragma GCC unroll 16
            for (int t = 0; t < NV; t++)
                if (t < nt)
                    _mm512_storeu_ps((float *)(kt + ((j0 / PW) * d2 + t0 + t) * PW + j0 % PW),
                                     r[t]);
        }
}

/* vp (dvp/32, S2, 32) = V pairs of v (S, d) bf16 rows ld apart along the
 * keys, in panels of 32 columns; zeros past d and for key S when S is odd. */
static void pack_vp(uint32_t *vp, int64_t dvp, const uint16_t *v, int64_t ld, int64_t S,
                    int64_t d) {
    const int64_t S2 = (S + 1) / 2;
    for (int64_t t = 0; 2 * t < S; t++)
        for (int64_t c0 = 0; c0 < dvp; c0 += NV) {
            const __mmask16 m = lanes(d - c0);
            const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, v + 2 * t * ld + c0));
            const __m512i hi = 2 * t + 1 < S ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                                   m, v + (2 * t + 1) * ld + c0))
                                             : _mm512_setzero_si512();
            _mm512_storeu_si512(vp + ((c0 / PW) * S2 + t) * PW + c0 % PW,
                                _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
}

/* pb (Lp) = bf16(2^(s - max s)) of the score row s (S; scores times log2 e,
 * so this is the softmax's e^x), zeros past S, -0.0 (the mark of a
 * skipped key) where s is -inf; returns the float32 sum and sets *skips
 * when some key is marked. */
static float softmax_row_bf16(uint16_t *pb, const float *s, int64_t S, int64_t Lp, bool *skips) {
    const __m512 vm = _mm512_set1_ps(row_max512(s, S));
    __m512 sum = _mm512_setzero_ps();
    __mmask16 marked = 0;
    for (int64_t j = 0; j < Lp; j += NV) {
        const __mmask16 k = lanes(S - j);
        const __m512 e = exp2_marked512(_mm512_maskz_loadu_ps(k, s + j), vm, k, &marked);
        sum = _mm512_add_ps(sum, e);
        const __m256bh h = _mm512_cvtneps_pbh(e);
        __m256i bits;
        memcpy(&bits, &h, sizeof bits);
        _mm256_storeu_si256((__m256i *)(pb + j), bits);
    }
    *skips = marked != 0;
    return _mm512_reduce_add_ps(sum);
}

/* Row o (d) = sum over the unmarked keys j < S of P[j] v[j ld] / l, as the
 * reference computes a row with an -inf score (a skipped key never
 * multiplied by zero: its v may be inf or NaN); 0 when every key is
 * marked.  Rare: plain scalar loops, float32 sums. */
static void pv_row_skipping(void *o, bool bf16_out, const uint16_t *pb, const uint16_t *v,
                            int64_t ld, int64_t S, int64_t d, float l) {
    for (int64_t c = 0; c < d; c++) {
        bool any = false;
        float acc = 0.0f;
        for (int64_t j = 0; j < S; j++) {
            if (pb[j] == 0x8000u) /* -0.0: skipped */
                continue;
            any = true;
            acc += mha_bf16_to_float(pb[j]) * mha_bf16_to_float(v[j * ld + c]);
        }
        const float y = any ? acc / l : 0.0f;
        if (bf16_out)
            ((uint16_t *)o)[c] = mha_float_to_bf16(y);
        else
            ((float *)o)[c] = y;
    }
}

/* The kernel (attention_short.h's bf16 signature; ws:
 * mha_attn_short_ws_floats). */
static void attn_short_bf16_avx512(void *ctx, mha_dtype out, int64_t ldo, const uint16_t *q,
                                   const uint16_t *k, const uint16_t *v, int64_t ld, int64_t L,
                                   int64_t S, int64_t H, int64_t d, float scale, int64_t diag,
                                   float *ws) {
    const int64_t Lp = (S + PW - 1) / PW * PW, d2 = (d + 1) / 2, S2 = (S + 1) / 2;
    const int64_t dvp = (d + PW - 1) / PW * PW;
    const bool bf16_out = out == MHA_BF16;
    const size_t es = bf16_out ? 2 : 4;
    const float scale2 = scale * 1.44269504088896341f; /* scores in log2 units */
    /* K^T pairs (Lp/32, d2, 32), V pairs (dvp/32, S2, 32), scores (R, Lp),
     * P (R, Lp) bf16, q pairs (R, d2): 64-byte lines apart */
    uint32_t *kt = (uint32_t *)ws;
    uint32_t *vp = kt + (d2 * Lp + 15) / 16 * 16;
    float *sc = (float *)(vp + (S2 * dvp + 15) / 16 * 16);
    uint16_t *pb = (uint16_t *)(sc + R * Lp);
    uint32_t *qb = (uint32_t *)(pb + R * Lp);
    for (int64_t h = 0; h < H; h++) {
        pack_kt(kt, Lp, k + h * d, ld, S, d);
        pack_vp(vp, dvp, v + h * d, ld, S, d);
        for (int64_t i0 = 0; i0 < L; i0 += R) {
            const int rows = L - i0 < R ? (int)(L - i0) : R;
            const uint32_t *qr[R], *pr[R];
            void *sr[R], *orow[R];
            float l[R];
            int64_t lim[R]; /* keys row r sees */
            bool skips[R];
            for (int r = 0; r < R; r++) { /* rows past the text repeat row 0 */
                const int64_t i = i0 + (r < rows ? r : 0), rr = r < rows ? r : 0;
                if (r < rows) {
                    uint16_t *qh = (uint16_t *)(qb + r * d2);
                    memcpy(qh, q + i * ld + h * d, sizeof(uint16_t) * (size_t)d);
                    if (d % 2)
                        qh[d] = 0;
                }
                lim[r] = diag >= 0 ? diag + i0 + r + 1 : S;
                qr[r] = qb + rr * d2;
                sr[r] = sc + rr * Lp;
                pr[r] = (const uint32_t *)(const void *)(pb + rr * Lp);
                orow[r] = (char *)ctx + (size_t)(i * ldo + h * d) * es;
            }
            /* diag >= 0 (causal): the block's keys end at its last row's,
             * each row's P at its own (zeros between, to the block's panels) */
            const int64_t Sb = diag >= 0 ? diag + i0 + rows : S, Lb = (Sb + PW - 1) / PW * PW;
            dp_rows(sr, 4, qr, kt, d2, d2, Lb, rows, &scale2, 0, 0);
            for (int r = 0; r < rows; r++)
                l[r] = softmax_row_bf16(pb + r * Lp, sc + r * Lp, lim[r], Lb, &skips[r]);
            if (diag >= 0) { /* the pairs reach key Sb when Sb is odd */
                const int64_t j1 = (Sb + 1) / 2 * 2 < S ? (Sb + 1) / 2 * 2 : S;
                const int64_t bad =
                    mha_attn_short_last_nonfinite_bf16(v + h * d, ld, d, diag + i0 + 1, j1);
                for (int r = 0; r < rows; r++)
                    skips[r] |= lim[r] <= bad;
            }
            dp_rows(orow, es, pr, vp, S2, (Sb + 1) / 2, d, rows, l, 1, bf16_out);
            for (int r = 0; r < rows; r++)
                if (skips[r])
                    pv_row_skipping(orow[r], bf16_out, pb + r * Lp, v + h * d, ld, lim[r], d,
                                    l[r]);
        }
    }
}

const mha_attn_short_bf16_fn MHA_AVX512_SYMBOL(mha_attn_short_bf16_avx512_loop) =
    attn_short_bf16_avx512;
