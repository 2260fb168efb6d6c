/* attention_short_avx512.c - the whole-row attention (attention_short.h)
 * with AVX-512 (F/DQ/BW/VL).  Letters: L query rows, S keys, H heads, d
 * head width (any d >= 1), Lp = S rounded up to 32 (a panel of keys), R = 8
 * query rows.
 * Compiled with AVX512_FLAGS; reached only through mha_attn_short_f32_avx512
 * (attention_short.c), after mha_avx512_runs() - natively or emulated.
 *
 * Per head: K^T (Lp/32, d, 32) is gathered once, in panels of 32 keys (zeros
 * past S; each panel one contiguous stream for Q K^T).  Per block of R = 8
 * query rows:
 *   sc (8, Lp) = scale * q K^T      (mm_block: A = the q rows, B = K^T)
 *   per row  p = exp(s - max s), l = sum p   (16 keys a vector, the last
 *            one under a mask: keys past S are neither maxed nor summed;
 *            an -inf score, from an infinite q or k, marks its key -0.0
 *            and the row's P V is redone skipping it, as the reference)
 *   ctx (8, d) = P V / l            (mm_block: A = the P rows, B = V
 *            packed once per head in panels of 32 columns, pack_v)
 *
 * Register blocking (mm_block): C (8, 32) += A (8, K) B (K, 32) as 8 rows x
 * 2 ZMM = 16 accumulators; per step of K 2 loads of B, 8 broadcasts of A
 * and 16 FMAs (10 loads per 16 FMAs: the FMA ports, not the two load
 * ports, bound it), 19 of the 32 ZMM registers live.  Both products are the
 * same block because both have a short B row (32 keys of K^T, or d = 32
 * columns of v) and a long, cheap-to-broadcast A: the encoder's d = 32 is
 * exactly one 2-ZMM panel, so P V runs 8 independent rows at once instead
 * of the avx2 kernel's one row (4 chains of FMAs waiting on each other).
 * Panels narrower than 32 (the last 16 keys of Lp; d = 16; a d tail) take
 * the 8 x 1 ZMM block; partial vectors are masked loads and stores, never
 * scalar tails.  Rows past the text (L not a multiple of 8) repeat the
 * block's first row and are not stored.  8 rows, not the flash kernel's 6:
 * the encoder's L = 128 (and 40, 64, ...) is a whole number of blocks, and
 * 16 accumulators leave room for the broadcasts.
 *
 * Memory: one head's K^T and V (S d floats each, 16 KB at S = 128, d = 32)
 * and sc (8 Lp) stay in L1 for the whole head at the encoder's lengths; at
 * the longest served (S d = 524288) K^T and V are 2 MiB each and stream
 * from L2/L3, a panel of K^T or V contiguous.  K^T is gathered by 16 x 16
 * register transposes (transpose16_ps): 64 shuffles per 256 floats, where
 * scalar moves took 11% of the time at L = 128, d = 32 (perf, Zen 4).
 *
 * Every value depends only on the text (sums in a fixed order: c, then j):
 * bits do not depend on the batch or the threads.  The scores come out of
 * Q K^T times scale log2(e), so the softmax's e^x is exp2_softmax512's
 * 2^t (simd_avx512.h, relative error 1.5e-7; 8 operations against
 * 13 for e^x by Cephes' range reduction); the avx2 kernel's exp256 has 1-2 ulp, so the two
 * kernels agree within the tests' bound, not bit for bit.
 */
#include "attention_short.h"
#include "attention_bwd.h"

#include <math.h>
#include <string.h>

#include "simd_avx512.h"

enum { R = 8, NV = 16 }; /* query rows per block; floats per ZMM */

/* C (R, nv*16) = A (R, K) B (K, nv*16), nv = 1 or 2 (a constant when inlined):
 * a[r] is A's row r (step 1), B's rows ldb apart with columns under m0, m1.
 * Epilogue: row r < rows is stored to c[r] (same masks) as acc * f (div =
 * 0) or acc / f[r] (div = 1). */
static inline __attribute__((always_inline)) void
mm_block(float *const c[R], const float *const a[R], const float *b, int64_t ldb, int64_t K,
         __mmask16 m0, __mmask16 m1, int rows, const float *f, const int div, const int nv) {
    __m512 acc[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *bk = b + k * ldb;
        const __m512 b0 = _mm512_maskz_loadu_ps(m0, bk);
        const __m512 b1 = nv == 2 ? _mm512_maskz_loadu_ps(m1, bk + NV) : b0;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512 x = _mm512_set1_ps(a[r][k]);
            acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
            if (nv == 2)
                acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        if (r >= rows)
            break;
        const __m512 fr = _mm512_set1_ps(div ? f[r] : f[0]);
        __m512 y0 = div ? _mm512_div_ps(acc[r][0], fr) : _mm512_mul_ps(acc[r][0], fr);
        _mm512_mask_storeu_ps(c[r], m0, y0);
        if (nv == 2) {
            __m512 y1 = div ? _mm512_div_ps(acc[r][1], fr) : _mm512_mul_ps(acc[r][1], fr);
            _mm512_mask_storeu_ps(c[r] + NV, m1, y1);
        }
    }
}

/* C (rows, n) = A B as above over column panels of 32 (c[r] with the
 * panel), panel P of B at b + P pstride (rows ldb apart within it); the
 * last panel's vectors under masks.  div as in mm_block. */
static void mm_rows(float *const c[R], const float *const a[R], const float *b, int64_t ldb,
                    int64_t pstride, int64_t K, int64_t n, int rows, const float *f,
                    const int div) {
    for (int64_t p = 0; p < n; p += 2 * NV) {
        float *cp[R];
        for (int r = 0; r < R; r++)
            cp[r] = c[r] + p;
        const float *bp = b + p / (2 * NV) * pstride;
        const int64_t left = n - p;
        if (left > NV) {
            if (div)
                mm_block(cp, a, bp, ldb, K, mask16(left), mask16(left - NV), rows, f, 1, 2);
            else
                mm_block(cp, a, bp, ldb, K, mask16(left), mask16(left - NV), rows, f, 0, 2);
        } else {
            if (div)
                mm_block(cp, a, bp, ldb, K, mask16(left), 0, rows, f, 1, 1);
            else
                mm_block(cp, a, bp, ldb, K, mask16(left), 0, rows, f, 0, 1);
        }
    }
}

/* s (S) = 2^(s - max s) in place (s: scores times log2(e), so this is the
 * softmax's e^x), -0.0f (the mark of a skipped key) where s is -inf;
 * returns the sum, sets *max to the max and *skips when some key is
 * marked.  s has Sp floats; the lanes past S are left alone (the P V
 * product reads only keys < S).  The values stored are rounded to pdt (P
 * in v's dtype for P V, -0.0 marks staying -0.0); the sum is of the
 * unrounded ones. */
static inline __attribute__((always_inline)) float
softmax_row_as(float *s, int64_t S, bool *skips, float *max, mha_dtype pdt) {
    *max = row_max512(s, S);
    const __m512 vm = _mm512_set1_ps(*max);
    __m512 sum = _mm512_setzero_ps();
    __mmask16 marked = 0;
    int64_t j = 0;
    for (; j + NV <= S; j += NV) { /* whole vectors: no mask to compute or apply */
        const __m512 e = exp2_marked512(_mm512_loadu_ps(s + j), vm, 0xffff, &marked);
        _mm512_storeu_ps(s + j, round_half512(e, pdt));
        sum = _mm512_add_ps(sum, e);
    }
    if (j < S) { /* the tail under a mask: the same sum, lanes past S adding 0 */
        const __mmask16 k = mask16(S - j);
        const __m512 e = exp2_marked512(_mm512_maskz_loadu_ps(k, s + j), vm, k, &marked);
        _mm512_mask_storeu_ps(s + j, k, round_half512(e, pdt));
        sum = _mm512_add_ps(sum, e);
    }
    *skips = marked != 0;
    return _mm512_reduce_add_ps(sum);
}

/* softmax_row_as with pdt a constant. */
static float softmax_row(float *s, int64_t S, bool *skips, float *max, mha_dtype pdt) {
    return pdt == MHA_F16    ? softmax_row_as(s, S, skips, max, MHA_F16)
           : pdt == MHA_BF16 ? softmax_row_as(s, S, skips, max, MHA_BF16)
                             : softmax_row_as(s, S, skips, max, MHA_F32);
}

/* kt (Sp/32, d, 32) = K^T of k (S, d) rows ld apart in panels of 32 keys,
 * zeros for the keys S..Sp (Sp a multiple of 32): 16 x 16 blocks by
 * transpose16_ps, partial ones under masks. */
static void gather_kt(float *kt, int64_t Sp, const float *k, int64_t ld, int64_t S, int64_t d) {
    for (int64_t j0 = 0; j0 < Sp; j0 += NV)
        for (int64_t c0 = 0; c0 < d; c0 += NV) {
            const __mmask16 cols = mask16(d - c0);
            __m512 r[NV];
#pragma GCC unroll 16
            for (int j = 0; j < NV; j++)
                r[j] = j0 + j < S ? _mm512_maskz_loadu_ps(cols, k + (j0 + j) * ld + c0)
                                  : _mm512_setzero_ps();
            transpose16_ps(r);
            const int64_t nc = d - c0;
            float *panel = kt + j0 / (2 * NV) * d * 2 * NV + j0 % (2 * NV);
#pragma GCC unroll 16
            for (int c = 0; c < NV; c++)
                if (c < nc)
                    _mm512_storeu_ps(panel + (c0 + c) * 2 * NV, r[c]);
        }
}

/* vp (ceil(d/32), Sp, 32) = v (S, d) rows ld apart in panels of 32
 * columns (zeros past d), so each panel of P V is one contiguous stream:
 * read in place, a head's v rows are ld apart (3 E floats in the
 * projections' (L, 3E) buffer, 6 KiB at E = 512), every row on a page of
 * its own, and the P V of the whole MHA ran at half the speed of the same
 * attention on contiguous heads (docs/performance.md, "Whole rows on
 * Intel").  Rows S..Sp are not written (P V reads keys < S only). */
static void pack_v(float *vp, int64_t Sp, const float *v, int64_t ld, int64_t S, int64_t d) {
    for (int64_t c0 = 0; c0 < d; c0 += 2 * NV) {
        const __mmask16 m0 = mask16(d - c0), m1 = d - c0 > NV ? mask16(d - c0 - NV) : 0;
        float *panel = vp + c0 / (2 * NV) * Sp * 2 * NV;
        for (int64_t j = 0; j < S; j++) {
            const float *row = v + j * ld + c0;
            _mm512_storeu_ps(panel + j * 2 * NV, _mm512_maskz_loadu_ps(m0, row));
            _mm512_storeu_ps(panel + j * 2 * NV + NV, _mm512_maskz_loadu_ps(m1, row + NV));
        }
    }
}

/* The kernel (attention_short.h's signature; ws: mha_attn_short_ws_floats).
 * diag >= 0 (causal): row i sees keys 0..diag + i, so a block of rows
 * stops its products at its last row's keys and each row's softmax at its
 * own, the P entries between the two set to zero. */
static void attn_short_avx512(float *ctx, int64_t ldo, const float *q, const float *k,
                              const float *v, int64_t ld, int64_t L, int64_t S, int64_t H,
                              int64_t d, float scale, int64_t diag, float *ws, mha_dtype p_dtype,
                              float *lse, int64_t lse_ld) {
    const int64_t Lp = (S + 2 * NV - 1) / (2 * NV) * (2 * NV);
    /* scores in log2 units: the softmax's e^(x) is 2^(x log2 e) */
    const float scale2 = scale * 1.44269504088896341f;
    const int64_t dp = (d + 2 * NV - 1) / (2 * NV) * (2 * NV);
    /* K^T (Lp/32, d, 32), V (dp/32, Lp, 32), scores (R, Lp) */
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
            mm_rows(sr, qr, kt, 2 * NV, d * 2 * NV, d, Sb, rows, &scale2, 0);
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
            mm_rows(orow, pr, vp, 2 * NV, Lp * 2 * NV, Sb, d, rows, l, 1);
            /* -inf scores; causal: inf/NaN v past a row's keys */
            mha_attn_short_redo_rows(orow, sr, lim, l, skips, rows, v + h * d, ld, d, diag, i0,
                                     Sb);
        }
    }
}

const mha_attn_short_fn MHA_AVX512_SYMBOL(mha_attn_short_avx512_loop) = attn_short_avx512;

/* ---- the whole-row backward (mha_bwd_pair_rows_fn, attention_bwd.h) -------- */

/* c (n, m) rows ldc apart += a^T b over the R rows of a block: c[j] +=
 * sum_r a[r][j] b[r] (a[r]: n values, b[r]: m values), each element one
 * FMA chain over r in order.  b's rows sit in 16 registers, 32 columns at
 * a time, while the n rows of c stream by (2 loads, 8 broadcasts, 16 FMAs
 * and 2 stores a row). */
static void rank_rows(float *c, int64_t ldc, const float *const a[R], const float *const b[R],
                      int64_t n, int64_t m) {
    for (int64_t x0 = 0; x0 < m; x0 += 2 * NV) {
        const __mmask16 m0 = mask16(m - x0), m1 = m - x0 > NV ? mask16(m - x0 - NV) : 0;
        __m512 b0[R], b1[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            b0[r] = _mm512_maskz_loadu_ps(m0, b[r] + x0);
            b1[r] = _mm512_maskz_loadu_ps(m1, b[r] + x0 + NV);
        }
        for (int64_t j = 0; j < n; j++) {
            float *cj = c + j * ldc + x0;
            __m512 c0 = _mm512_maskz_loadu_ps(m0, cj), c1 = _mm512_maskz_loadu_ps(m1, cj + NV);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const __m512 x = _mm512_set1_ps(a[r][j]);
                c0 = _mm512_fmadd_ps(x, b0[r], c0);
                c1 = _mm512_fmadd_ps(x, b1[r], c1);
            }
            _mm512_mask_storeu_ps(cj, m0, c0);
            _mm512_mask_storeu_ps(cj + NV, m1, c1);
        }
    }
}

/* Whether the n rows (m floats each, ld apart) at x are all finite (no
 * element with the all-ones exponent of inf and NaN). */
static bool rows_finite(const float *x, int64_t ld, int64_t n, int64_t m) {
    const __m512i ones = _mm512_set1_epi32(0x7f800000);
    __mmask16 bad = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < m; c += NV) {
            const __mmask16 k = mask16(m - c);
            const __m512i e = _mm512_and_si512(
                _mm512_castps_si512(_mm512_maskz_loadu_ps(k, x + i * ld + c)), ones);
            bad |= _mm512_mask_cmpeq_epi32_mask(k, e, ones);
        }
    return bad == 0;
}

/* dst (n rows, ld apart) += f * src (n rows, lds apart), m floats a row. */
static void add_rows_scaled(float *dst, int64_t ld, const float *src, int64_t lds, int64_t n,
                            int64_t m, float f) {
    const __m512 vf = _mm512_set1_ps(f);
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < m; c += NV) {
            const __mmask16 k = mask16(m - c);
            float *o = dst + i * ld + c;
            _mm512_mask_storeu_ps(o, k,
                                  _mm512_fmadd_ps(vf, _mm512_maskz_loadu_ps(k, src + i * lds + c),
                                                  _mm512_maskz_loadu_ps(k, o)));
        }
}

/* See mha_bwd_pair_rows_fn (attention_bwd.h).  Per pair: K^T and V^T
 * gathered in panels of 32 keys (gather_kt), K in panels of 32 columns
 * (pack_v); per query head of the group and block of R rows: S = Q K^T and
 * dP = dO V^T (mm_rows; causal: over the keys of the block's last row),
 * P and dS by the ISA's row_grad (exactly the flash tiles' epilogue), dV
 * += P^T dO and dK += dS^T Q (rank_rows, into the pair's accumulators),
 * dQ = scale dS K (mm_rows); the caller's gradients are added to at the
 * end, only when every input row of the pair was finite. */
static bool bwd_pair_rows(const mha_attn_problem *p, const mha_attn_grad *g,
                          const mha_bwd_isa *isa, const float *lse, const float *delta,
                          int64_t b, int64_t hk, float *ws) {
    const int64_t S = p->S, L = p->L, d = p->d, dv = p->dv, G = p->Hq / p->Hkv;
    const int64_t Sp = (S + 2 * NV - 1) / (2 * NV) * (2 * NV);
    const int64_t dp = (d + 2 * NV - 1) / (2 * NV) * (2 * NV);
    const int64_t dvp = (dv + 2 * NV - 1) / (2 * NV) * (2 * NV);
    const float *k = (const float *)p->k.data + b * p->k.stride[0] + hk * p->k.stride[1];
    const float *v = (const float *)p->v.data + b * p->v.stride[0] + hk * p->v.stride[1];
    const int64_t ldk = p->k.stride[2], ldv = p->v.stride[2];
    if (!rows_finite(k, ldk, S, d) || !rows_finite(v, ldv, S, dv))
        return false;
    /* mha_attn_short_bwd_ws_floats's layout */
    float *kt = ws, *vt = kt + d * Sp, *kp = vt + dv * Sp, *dka = kp + dp * Sp;
    float *dva = dka + S * dp, *sc = dva + S * dvp, *ds = sc + R * Sp, *zero = ds + R * Sp;
    float *dqw = zero + Sp;
    gather_kt(kt, Sp, k, ldk, S, d);
    gather_kt(vt, Sp, v, ldv, S, dv);
    if (g->dq.data)
        pack_v(kp, Sp, k, ldk, S, d);
    memset(dka, 0, sizeof(float) * (size_t)(S * dp));
    memset(dva, 0, sizeof(float) * (size_t)(S * dvp));
    memset(zero, 0, sizeof(float) * (size_t)Sp);
    const float one = 1.0f, scale = p->scale;
    const bool causal = p->causal != MHA_CAUSAL_NONE; /* the main diagonal, L = S */
    for (int64_t g0 = 0; g0 < G; g0++) {
        const int64_t h = hk * G + g0, row0 = (b * p->Hq + h) * L;
        const float *q = (const float *)p->q.data + b * p->q.stride[0] + h * p->q.stride[1];
        const float *dout =
            (const float *)g->dout.data + b * g->dout.stride[0] + h * g->dout.stride[1];
        const int64_t ldq = p->q.stride[2], ldo = g->dout.stride[2];
        if (!rows_finite(q, ldq, L, d) || !rows_finite(dout, ldo, L, dv))
            return false;
        for (int64_t i0 = 0; i0 < L; i0 += R) {
            const int rows = L - i0 < R ? (int)(L - i0) : R;
            const float *qr[R], *orow[R], *pr[R], *dr[R], *dsa[R];
            float *sr[R], *dsr[R], *dqr[R];
            for (int r = 0; r < R; r++) { /* rows past L repeat row 0 (not stored) */
                const int rr = r < rows ? r : 0;
                qr[r] = q + (i0 + rr) * ldq, orow[r] = dout + (i0 + rr) * ldo;
                sr[r] = sc + rr * Sp, dsr[r] = ds + rr * Sp, dsa[r] = dsr[r];
                dqr[r] = dqw + (g0 * L + i0 + rr) * dp;
            }
            /* keys the block sees (causal: those of its last row) */
            const int64_t Sb = causal ? i0 + rows : S;
            mm_rows(sr, qr, kt, 2 * NV, d * 2 * NV, d, Sb, rows, &one, 0);
            mm_rows(dsr, orow, vt, 2 * NV, dv * 2 * NV, dv, Sb, rows, &one, 0);
            for (int r = 0; r < rows; r++) { /* P = dS = 0 past a row's own keys */
                const float l = lse[row0 + i0 + r];
                const int64_t lim = l == -INFINITY ? 0 : causal ? i0 + r + 1 : S;
                isa->row_grad(sr[r], dsr[r], Sb, lim, scale, NULL, l, delta[row0 + i0 + r]);
            }
            for (int r = 0; r < R; r++) /* rows past L add nothing */
                pr[r] = r < rows ? sr[r] : zero, dr[r] = r < rows ? dsr[r] : zero;
            if (g->dv.data)
                rank_rows(dva, dvp, pr, orow, Sb, dv);
            if (g->dk.data)
                rank_rows(dka, dp, dr, qr, Sb, d);
            if (g->dq.data)
                mm_rows(dqr, dsa, kp, 2 * NV, Sp * 2 * NV, Sb, d, rows, &scale, 0);
        }
    }
    /* every input finite: into the caller's gradients */
    if (g->dk.data)
        add_rows_scaled((float *)g->dk.data + b * g->dk.stride[0] + hk * g->dk.stride[1],
                        g->dk.stride[2], dka, dp, S, d, scale);
    if (g->dv.data)
        add_rows_scaled((float *)g->dv.data + b * g->dv.stride[0] + hk * g->dv.stride[1],
                        g->dv.stride[2], dva, dvp, S, dv, 1.0f);
    if (g->dq.data)
        for (int64_t g0 = 0; g0 < G; g0++)
            add_rows_scaled((float *)g->dq.data + b * g->dq.stride[0] +
                                (hk * G + g0) * g->dq.stride[1],
                            g->dq.stride[2], dqw + g0 * L * dp, dp, L, d, 1.0f);
    return true;
}

const mha_bwd_pair_rows_fn MHA_AVX512_SYMBOL(mha_attn_short_bwd_avx512_loop) = bwd_pair_rows;
