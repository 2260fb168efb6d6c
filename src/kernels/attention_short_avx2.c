/* attention_short_avx2.c - the whole-row attention (attention_short.h) with
 * AVX2+FMA: the twin of attention_short_avx512.c in 8-lane vectors.
 * Letters: L query rows, S keys, H heads, d head width (any d >= 1), Lp = S
 * rounded up to 16 (a panel of keys), R = 6 query rows.
 * Compiled with -mavx2 -mfma; reached only through mha_attn_short_f32_avx2
 * and mha_attn_short_run (attention_short.c), after a CPU check.
 *
 * Per head: K^T (Lp/16, d, 16) is gathered once, in panels of 16 keys (zeros
 * past S; each panel one contiguous stream for Q K^T), by 8 x 8 register
 * transposes.  Per block of R = 6 query rows:
 *   sc (6, Lp) = scale log2(e) q K^T   (mm_block: A = the q rows, B = K^T)
 *   per row  p = 2^(s - max s), l = sum p   (8 keys a vector, the last one
 *            under a mask: keys past the row's limit are neither maxed nor
 *            summed; an -inf score, from an infinite q or k, marks its key
 *            -0.0 and the row's P V is redone skipping it, as the reference)
 *   ctx (6, d) = P V / l               (mm_block: A = the P rows, B = V
 *            packed once per head in panels of 16 columns (pack_v), a last
 *            partial panel under masks)
 *
 * Register blocking (mm_block; BLIS's haswell sgemm shape): C (6, 16) +=
 * A (6, K) B (K, 16) as 6 rows x 2 YMM = 12 accumulators + 2 loads of B +
 * 1 broadcast = 15 of the 16 YMM registers; per step of K 2 loads of B, 6
 * broadcasts of A and 12 FMAs, which cover the 4-cycle latency of two FMA
 * pipes (8 chains needed).  Both products are the same block: a short B row
 * (16 keys of K^T, or 16 columns of v) against a long, cheap-to-broadcast A.
 * Rows past the text (L not a multiple of 6) repeat the block's first row
 * and are not stored.
 *
 * Against the flash driver (attention_flash.c) on the same CPU: no packing
 * of K and V per 128-key block, no online rescaling of the output, one
 * softmax per row, and the score scale folded into the product's epilogue
 * (in log2 units, so e^x is exp2_softmax256's 2^t: 12 operations against
 * exp_softmax256's 15).  Measured: docs/performance.md, "Whole rows on
 * AVX2"; which problems it takes: mha_attn_short_serves.
 *
 * Every value depends only on the text (sums in a fixed order: c, then j):
 * bits do not depend on the batch or the threads.  The avx512 loop takes
 * 16-lane partial sums, so the two agree within the tests' bound, not bit
 * for bit.
 */
#include "attention_short.h"

#include <math.h>

#include "simd_avx2.h"

enum { R = 6, NV = 8, PW = 16 }; /* rows per block; floats per YMM; keys per panel */

/* Lanes [0, n) of 8 set (n <= 0: none). */
static inline __m256i mask8(int64_t n) {
    const int k = n <= 0 ? 0 : n >= NV ? NV : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 2^t for the softmax's t = x - max <= 0, or NaN (which propagates): t =
 * n + r, n = floor(t), 2^r on [0, 1) by exp2_softmax512's degree-5
 * polynomial (simd_avx512.h, relative error 1.5e-7), 2^n built in the
 * exponent field.  t is clamped at -127, where the field is 0 and the
 * result exactly 0 (such a weight is below any row sum >= 1 by 38
 * decades). */
static inline __m256 exp2_softmax256(__m256 t) {
    t = _mm256_max_ps(_mm256_set1_ps(-127.0f), t); /* operand order keeps NaN */
    const __m256 n = _mm256_floor_ps(t);
    const __m256 r = _mm256_sub_ps(t, n);
    __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(1.877576578e-3f), r, _mm256_set1_ps(8.989340626e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.582631752e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(2.401536107e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(6.931530833e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(9.999999404e-1f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static inline float hmax256(__m256 x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline float hsum256(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* C (R, nv*8) = A (R, K) B (K, nv*8), nv = 1 or 2, masked = 0 or 1 (constants
 * when inlined): a[r] is A's row r (step 1), B's rows ldb apart, their
 * columns under m0, m1 when masked (unmasked: all 8 lanes of each).
 * Epilogue: row r < rows is stored to c[r] (same masks) as acc * f[0]
 * (div = 0) or acc / f[r] (div = 1). */
static inline __attribute__((always_inline)) void
mm_block(float *const c[R], const float *const a[R], const float *b, int64_t ldb, int64_t K,
         __m256i m0, __m256i m1, int rows, const float *f, const int div, const int nv,
         const int masked) {
    __m256 acc[R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *bk = b + k * ldb;
        const __m256 b0 = masked ? _mm256_maskload_ps(bk, m0) : _mm256_loadu_ps(bk);
        const __m256 b1 = nv == 1   ? b0
                          : masked ? _mm256_maskload_ps(bk + NV, m1)
                                   : _mm256_loadu_ps(bk + NV);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 x = _mm256_broadcast_ss(a[r] + k);
            acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
            if (nv == 2)
                acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        if (r >= rows)
            break;
        const __m256 fr = _mm256_set1_ps(div ? f[r] : f[0]);
        for (int v = 0; v < nv; v++) {
            const __m256 y = div ? _mm256_div_ps(acc[r][v], fr) : _mm256_mul_ps(acc[r][v], fr);
            if (masked)
                _mm256_maskstore_ps(c[r] + v * NV, v ? m1 : m0, y);
            else
                _mm256_storeu_ps(c[r] + v * NV, y);
        }
    }
}

/* sc rows (rows, Sb rounded up to 16) = scale2 q K^T, panel by panel of the
 * K^T panels kt (Lp/16, d, 16) (a panel's columns past S are zero, and the
 * score rows have room to Lp). */
static void scores_rows(float *const sr[R], const float *const qr[R], const float *kt,
                        int64_t d, int64_t Sb, int rows, float scale2) {
    const __m256i all = _mm256_set1_epi32(-1);
    for (int64_t p = 0; p < Sb; p += PW) {
        float *cp[R];
        for (int r = 0; r < R; r++)
            cp[r] = sr[r] + p;
        mm_block(cp, qr, kt + p / PW * d * PW, PW, d, all, all, rows, &scale2, 0, 2, 0);
    }
}

/* ctx rows (rows, d) = P (rows, Sb) V (Sb, d) / l[r], V packed in column
 * panels of 16 (vp (ceil(d/16), Lp, 16), pack_v); the last partial panel
 * under masks. */
static void context_rows(float *const orow[R], const float *const pr[R], const float *vp,
                         int64_t Lp, int64_t Sb, int64_t d, int rows, const float *l) {
    const __m256i all = _mm256_set1_epi32(-1);
    int64_t p = 0;
    for (; p + PW <= d; p += PW) {
        float *cp[R];
        for (int r = 0; r < R; r++)
            cp[r] = orow[r] + p;
        mm_block(cp, pr, vp + p / PW * Lp * PW, PW, Sb, all, all, rows, l, 1, 2, 0);
    }
    if (p < d) {
        float *cp[R];
        for (int r = 0; r < R; r++)
            cp[r] = orow[r] + p;
        const float *panel = vp + p / PW * Lp * PW;
        const int64_t left = d - p;
        if (left > NV)
            mm_block(cp, pr, panel, PW, Sb, all, mask8(left - NV), rows, l, 1, 2, 1);
        else
            mm_block(cp, pr, panel, PW, Sb, mask8(left), all, rows, l, 1, 1, 1);
    }
}

/* s (S) = 2^(s - max s) in place (s: scores times log2(e), so this is the
 * softmax's e^x), -0.0f (the mark of a skipped key) where s is -inf;
 * returns the sum, sets *max to the max and *skips when some key is
 * marked.  Lanes past S are neither read nor written.  The values stored
 * are rounded to pdt (P in v's dtype for P V, -0.0 marks staying -0.0);
 * the sum is of the unrounded ones. */
static inline __attribute__((always_inline)) float
softmax_row_as(float *s, int64_t S, bool *skips, float *max, mha_dtype pdt) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), sign = _mm256_set1_ps(-0.0f);
    /* four independent max chains (one was latency-bound: 4 cycles a
     * vector on Intel); the max does not depend on the order */
    __m256 mx = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    int64_t j = 0;
    for (; j + 4 * NV <= S; j += 4 * NV) {
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(s + j + NV));
        m2 = _mm256_max_ps(m2, _mm256_loadu_ps(s + j + 2 * NV));
        m3 = _mm256_max_ps(m3, _mm256_loadu_ps(s + j + 3 * NV));
    }
    for (; j + NV <= S; j += NV)
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
    mx = _mm256_max_ps(_mm256_max_ps(mx, m1), _mm256_max_ps(m2, m3));
    const __m256i tail = mask8(S - j);
    if (j < S) /* a NaN may or may not win: its row comes out NaN either way */
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + j, tail),
                                                _mm256_castsi256_ps(tail)));
    *max = hmax256(mx);
    const __m256 vm = _mm256_set1_ps(*max);
    __m256 sum = _mm256_setzero_ps(), marked = _mm256_setzero_ps();
    for (j = 0; j < S; j += NV) {
        const bool part = S - j < NV;
        const __m256 x = part ? _mm256_maskload_ps(s + j, tail) : _mm256_loadu_ps(s + j);
        const __m256 neg = _mm256_cmp_ps(x, ninf, _CMP_EQ_OQ);
        __m256 e = _mm256_blendv_ps(exp2_softmax256(_mm256_sub_ps(x, vm)), sign, neg);
        if (part) {
            e = _mm256_and_ps(e, _mm256_castsi256_ps(tail));
            _mm256_maskstore_ps(s + j, tail, round_half256(e, pdt));
            marked = _mm256_or_ps(marked, _mm256_and_ps(neg, _mm256_castsi256_ps(tail)));
        } else {
            _mm256_storeu_ps(s + j, round_half256(e, pdt));
            marked = _mm256_or_ps(marked, neg);
        }
        sum = _mm256_add_ps(sum, e);
    }
    *skips = _mm256_movemask_ps(marked) != 0;
    return hsum256(sum);
}

/* softmax_row_as with pdt a constant. */
static float softmax_row(float *s, int64_t S, bool *skips, float *max, mha_dtype pdt) {
    return pdt == MHA_F16    ? softmax_row_as(s, S, skips, max, MHA_F16)
           : pdt == MHA_BF16 ? softmax_row_as(s, S, skips, max, MHA_BF16)
                             : softmax_row_as(s, S, skips, max, MHA_F32);
}

/* kt (Lp/16, d, 16) = K^T of k (S, d) rows ld apart in panels of 16 keys,
 * zeros for the keys S..Lp (Lp a multiple of 16): 8 x 8 blocks by
 * transpose8_ps, a partial one's columns under a mask. */
static void gather_kt(float *kt, int64_t Lp, const float *k, int64_t ld, int64_t S, int64_t d) {
    for (int64_t j0 = 0; j0 < Lp; j0 += NV)
        for (int64_t c0 = 0; c0 < d; c0 += NV) {
            const int64_t nc = d - c0;
            const __m256i cols = mask8(nc);
            __m256 r[NV];
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++)
                r[j] = j0 + j >= S ? _mm256_setzero_ps()
                       : nc >= NV  ? _mm256_loadu_ps(k + (j0 + j) * ld + c0)
                                   : _mm256_maskload_ps(k + (j0 + j) * ld + c0, cols);
            transpose8_ps(r);
            float *panel = kt + j0 / PW * d * PW + j0 % PW;
#pragma GCC unroll 8
            for (int c = 0; c < NV; c++)
                if (c < nc)
                    _mm256_storeu_ps(panel + (c0 + c) * PW, r[c]);
        }
}

/* vp (ceil(d/16), Lp, 16) = v (S, d) rows ld apart in panels of 16 columns
 * (zeros past d), so each panel of P V is one contiguous stream, where v
 * read in place strides ld floats a key (3 E in the whole MHA's (L, 3E)
 * buffer: a page a row); as the avx512 loop's pack_v.  Rows S..Lp are not
 * written (P V reads keys < S only). */
static void pack_v(float *vp, int64_t Lp, const float *v, int64_t ld, int64_t S, int64_t d) {
    for (int64_t c0 = 0; c0 < d; c0 += PW) {
        const __m256i m0 = mask8(d - c0), m1 = mask8(d - c0 - NV);
        float *panel = vp + c0 / PW * Lp * PW;
        for (int64_t j = 0; j < S; j++) {
            const float *row = v + j * ld + c0;
            _mm256_storeu_ps(panel + j * PW, _mm256_maskload_ps(row, m0));
            _mm256_storeu_ps(panel + j * PW + NV, _mm256_maskload_ps(row + NV, m1));
        }
    }
}

/* The kernel (attention_short.h's signature; ws: mha_attn_short_ws_floats).
 * diag >= 0 (causal): row i sees keys 0..diag + i, so a block of rows
 * stops its products at its last row's keys and each row's softmax at its
 * own, the P entries between the two set to zero. */
static void attn_short_avx2(float *ctx, int64_t ldo, const float *q, const float *k,
                            const float *v, int64_t ld, int64_t L, int64_t S, int64_t H,
                            int64_t d, float scale, int64_t diag, float *ws, mha_dtype p_dtype,
                            float *lse, int64_t lse_ld) {
    const int64_t Lp = (S + PW - 1) / PW * PW;
    /* scores in log2 units: the softmax's e^(x) is 2^(x log2 e) */
    const float scale2 = scale * 1.44269504088896341f;
    const int64_t dp = (d + PW - 1) / PW * PW;
    /* K^T (Lp/16, d, 16), V (dp/16, Lp, 16), scores (R, Lp) */
    float *kt = ws, *vp = ws + d * Lp, *sc = vp + dp * Lp;
    for (int64_t h = 0; h < H; h++) {
        gather_kt(kt, Lp, k + h * d, ld, S, d);
        pack_v(vp, Lp, v + h * d, ld, S, d);
        for (int64_t i0 = 0; i0 < L; i0 += R) {
            const int rows = L - i0 < R ? (int)(L - i0) : R;
            const float *qr[R], *pr[R];
            float *sr[R], *orow[R], l[R];
            bool skips[R];
            for (int r = 0; r < R; r++) { /* rows past the text repeat row 0 */
                const int64_t i = i0 + (r < rows ? r : 0);
                qr[r] = q + i * ld + h * d;
                sr[r] = sc + (r < rows ? r : 0) * Lp;
                pr[r] = sr[r];
                orow[r] = ctx + i * ldo + h * d;
            }
            const int64_t Sb = diag >= 0 ? diag + i0 + rows : S; /* keys the block sees */
            scores_rows(sr, qr, kt, d, Sb, rows, scale2);
            int64_t lim[R]; /* keys row r sees */
            for (int r = 0; r < rows; r++) {
                lim[r] = diag >= 0 ? diag + i0 + r + 1 : S;
                float m;
                l[r] = softmax_row(sr[r], lim[r], &skips[r], &m, p_dtype);
                if (lse)
                    lse[(i0 + r) * lse_ld] = mha_attn_short_lse(m, l[r]);
                for (int64_t j = lim[r]; j < Sb; j++)
                    sr[r][j] = 0.0f;
            }
            context_rows(orow, pr, vp, Lp, Sb, d, rows, l);
            /* -inf scores; causal: inf/NaN v past a row's keys */
            mha_attn_short_redo_rows(orow, sr, lim, l, skips, rows, v + h * d, ld, d, diag, i0,
                                     Sb);
        }
    }
}

const mha_attn_short_fn mha_attn_short_avx2_loop = attn_short_avx2;
