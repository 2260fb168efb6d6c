/* attention_decode_avx512.c - AVX-512 inner loops of the decode step (see
 * attention_decode.h; portable twins in attention_decode.c, AVX2 ones in
 * attention_decode_avx2.c).  Letter legend: G heads per kv head, n keys (at
 * most one split, MHA_DECODE_SPLIT_KEYS), d head dim of q/k, dv of v.
 * Compiled with AVX512_FLAGS; only reached after mha_avx512_runs()
 * (natively, or emulated in the test library).
 *
 * Decode is memory-bound: every K and V element of the split is used by
 * only the G heads of its group, so the loops stream the rows once, front
 * to back with unit stride, in their storage dtype, and widen 16 elements
 * a ZMM in registers (fp16 by vcvtph2ps; bf16 32 elements a 64-byte load,
 * split into its even and odd elements by a shift and a mask, one
 * operation per 16 where a vpmovzxwd + vpslld took two: q is split the same
 * way once per step, P.V's accumulators permuted once per block of keys;
 * no gathers, no widened copy).  Tails (d or dv not a multiple of 16 or
 * 32) are one masked chunk, never a scalar loop.  Each loop body is
 * written once and specialised per dtype and tile shape by inlining.
 * bf16 pairs against the 16-element widening (`build/decode_loops 256 G`:
 * keys in L2, one thread, d = dv = 128; Intel Xeon, best of alternated
 * runs), G = 1, 2, 4, 8: q.k 41 -> 50, 33 -> 39, 20 -> 23.5, 9.9 -> 10.8
 * GB/s of K; P.V see pv_heads.  A whole step on 2 threads (B1 H32 Hkv8
 * d128, S 4k-32k) moved within that host's noise (0-5 %): it waits on
 * the cache's reads from L3 and memory there.
 *
 * Register blocking (32 ZMM):
 *   q.k: GN heads x KB keys = 16 accumulators (1x16, 2x8, 4x4, 8x2; 3x4
 *        = 12, 5..7 x 2 = 10..14), each over d in 16-lane chunks: a chunk
 *        of a key row is loaded once for the GN heads, 16 independent FMA
 *        chains cover the FMA latency (4 cycles x 2 ports needs 8).  The 16
 *        accumulators are reduced together by a 4-level transpose-add tree
 *        (15 shuffles + 15 adds for 16 dot products), written back with one
 *        masked store per head.  Fewer than KB keys left: tiles of KB/2,
 *        KB/4, ..., 1 keys.
 *   P.V: GN heads x CB 16-column chunks (1x8, 2x8, 3x4, 4x4, 5..8 x 2; up
 *        to 16 accumulators + CB widened V chunks + a broadcast, <= 25
 *        ZMM), held in registers over a block of PV_KEYS keys while the V
 *        rows of the block stream by; each V chunk is loaded and widened
 *        once for the GN heads.  Fewer than CB chunks left: tiles of CB/2,
 *        ..., 1 chunks, then the masked tail chunk.  The accumulation order
 *        of each output element (fma over keys in order) is that of the
 *        AVX2 loop, so P.V is bit-identical to it.
 *   Heads in blocks of up to 8 (G = 32/8 = 4 and 64/8 = 8 take one block:
 *        each K/V row is read once for the whole group).
 */
#include "attention_decode.h"

#include "simd_avx512.h"

/* Elements [off, off + 16) of a row of dtype dt as float32; lanes outside
 * k are 0 and not read.  A full chunk (k = 0xffff) is a plain load. */
static inline __attribute__((always_inline)) __m512 load16(const void *p, mha_dtype dt,
                                                           int64_t off, __mmask16 k,
                                                           const int full) {
    const uint16_t *h = (const uint16_t *)p + off;
    switch (dt) {
    case MHA_F16:
    case MHA_BF16:
        return widen_half512(full ? _mm256_loadu_si256((const __m256i *)h)
                                  : _mm256_maskz_loadu_epi16(k, h),
                             dt);
    default:
        return full ? _mm512_loadu_ps((const float *)p + off)
                    : _mm512_maskz_loadu_ps(k, (const float *)p + off);
    }
}

/* bf16 rows 32 at a time as two float32 vectors without a widening
 * shuffle: a bf16 value is the top half of its float32, so within the 32
 * 32-bit lanes of one 64-byte load the even elements are the lanes shifted
 * left 16 and the odd ones the lanes with the low half cleared - one
 * operation per 16 elements where vpmovzxwd + vpslld took two, on the same
 * two ports as the FMAs.  The even/odd order is undone where it matters
 * (qk: q split the same way; pv: the accumulators, permuted on load and
 * store). */
static inline __attribute__((always_inline)) __m512 bf16_even512(__m512i x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}
static inline __attribute__((always_inline)) __m512 bf16_odd512(__m512i x) {
    return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}

/* 32 consecutive floats (lo = elements 0-15, hi = 16-31) as their even and
 * odd elements, and back. */
static inline __attribute__((always_inline)) __m512 even512(__m512 lo, __m512 hi) {
    return _mm512_permutex2var_ps(
        lo, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), hi);
}
static inline __attribute__((always_inline)) __m512 odd512(__m512 lo, __m512 hi) {
    return _mm512_permutex2var_ps(
        lo, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), hi);
}
static inline __attribute__((always_inline)) __m512 interleave_lo512(__m512 e, __m512 o) {
    return _mm512_permutex2var_ps(
        e, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), o);
}
static inline __attribute__((always_inline)) __m512 interleave_hi512(__m512 e, __m512 o) {
    return _mm512_permutex2var_ps(
        e, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), o);
}

/* r[i] = the sum of the 16 lanes of a[i], i < 16: a transpose-add tree.
 * Level 1 adds 256-bit halves of pairs, level 2 128-bit quarters of pairs
 * of those, levels 3 and 4 pairs of floats then single floats within each
 * 128-bit lane; the inputs go in 4x4-transposed so lane i ends up a[i]. */
static inline __attribute__((always_inline)) __m512 hsum16(const __m512 *a) {
    __m512 t[16], u[8], v[4], w[2];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        t[i] = a[4 * (i & 3) + (i >> 2)];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* 256-bit lane L of u[i]: t[2i + L], 8 partial sums */
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xee));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* 128-bit lane L of v[i]: t[4i + L], 4 partial sums */
        v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xdd));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) /* lane L: (x, y, x, y) partial pairs of t[8i + L], t[8i + 4 + L] */
        w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    /* element 4L + m: t[L + 4m] = a[4L + m] */
    return _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(w[0]), _mm512_castps_pd(w[1]))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(w[0]), _mm512_castps_pd(w[1]))));
}

/* One 16-element chunk [x, x + 16) of d under mask k: a[g*KB + b] +=
 * q[g] * k[j+b] lane by lane, the key chunk loaded once for the GN heads. */
static inline __attribute__((always_inline)) void
qk_chunk(__m512 *a, const float *q, const void *k, mha_dtype dt, int64_t d, int64_t j, int64_t x,
         __mmask16 m, const int full, const int GN, const int KB) {
    __m512 kv[16];
#pragma GCC unroll 16
    for (int b = 0; b < KB; b++)
        kv[b] = load16(k, dt, (j + b) * d + x, m, full);
#pragma GCC unroll 8
    for (int g = 0; g < GN; g++) {
        const __m512 qv =
            full ? _mm512_loadu_ps(q + g * d + x) : _mm512_maskz_loadu_ps(m, q + g * d + x);
#pragma GCC unroll 16
        for (int b = 0; b < KB; b++)
            a[g * KB + b] = _mm512_fmadd_ps(qv, kv[b], a[g * KB + b]);
    }
}

/* A bf16 chunk of 32 elements [x, x + 32) of d: a[g*KB + b] += the even
 * elements' products, then the odd ones' (qs: q split the same way, see
 * qk_tile), each key's 64 bytes loaded once per half. */
static inline __attribute__((always_inline)) void
qk_pair_chunk(__m512 *a, const float *qs, int64_t dqs, const uint16_t *k, int64_t d, int64_t j,
              int64_t x, const int GN, const int KB) {
    __m512 kv[16];
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) {
#pragma GCC unroll 16
        for (int b = 0; b < KB; b++) {
            const __m512i raw = _mm512_loadu_si512(k + (j + b) * d + x);
            kv[b] = half ? bf16_odd512(raw) : bf16_even512(raw);
        }
#pragma GCC unroll 8
        for (int g = 0; g < GN; g++) {
            const __m512 qv = _mm512_loadu_ps(qs + g * dqs + x + 16 * half);
#pragma GCC unroll 16
            for (int b = 0; b < KB; b++)
                a[g * KB + b] = _mm512_fmadd_ps(qv, kv[b], a[g * KB + b]);
        }
    }
}

/* s[g*n + j+b] = q[g] . k[j+b] for GN heads and KB keys, GN*KB <= 16.
 * qs (GN, dqs) non-NULL (a bf16 cache): q's first dqs elements split into
 * even and odd halves per 32 (qk_avx512_dt), those elements taken 32 at a
 * time by qk_pair_chunk; the rest as for the other dtypes. */
static inline __attribute__((always_inline)) void
qk_tile(float *s, const float *q, const float *qs, int64_t dqs, const void *k, mha_dtype dt,
        int64_t n, int64_t d, int64_t j, const int GN, const int KB) {
    __m512 a[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        a[i] = _mm512_setzero_ps();
    int64_t x = 0;
    if (dt == MHA_BF16 && qs)
        for (; x < dqs; x += 32)
            qk_pair_chunk(a, qs, dqs, k, d, j, x, GN, KB);
    for (; x + 16 <= d; x += 16)
        qk_chunk(a, q, k, dt, d, j, x, 0xffff, 1, GN, KB);
    if (x < d)
        qk_chunk(a, q, k, dt, d, j, x, mask16(d - x), 0, GN, KB);
    /* lanes [g*KB, (g+1)*KB) of r are head g's: stored at s[g*n + j] */
    const __m512 r = hsum16(a);
#pragma GCC unroll 8
    for (int g = 0; g < GN; g++)
        _mm512_mask_storeu_ps(s + g * n + j - g * KB, (__mmask16)(((1u << KB) - 1u) << (g * KB)),
                              r);
}

/* All n keys for GN heads: KB keys a tile, then KB/2, ..., 1 (KB a power
 * of two). */
static inline __attribute__((always_inline)) void
qk_heads(float *s, const float *q, const float *qs, int64_t dqs, const void *k, mha_dtype dt,
         int64_t n, int64_t d, const mha_decode_ahead *ahead, const int GN, const int KB) {
    const size_t es = dt == MHA_F32 ? 4 : 2;
    int64_t j = 0;
    for (; j + KB <= n; j += KB) {
        mha_decode_touch_lines((const char *)k + (size_t)(j * d) * es, (size_t)(KB * d) * es);
        mha_decode_ask_ahead(ahead, j, KB);
        qk_tile(s, q, qs, dqs, k, dt, n, d, j, GN, KB);
    }
    mha_decode_ask_ahead(ahead, j, n - j);
    if (KB > 8 && j + 8 <= n)
        qk_tile(s, q, qs, dqs, k, dt, n, d, j, GN, 8), j += 8;
    if (KB > 4 && j + 4 <= n)
        qk_tile(s, q, qs, dqs, k, dt, n, d, j, GN, 4), j += 4;
    if (KB > 2 && j + 2 <= n)
        qk_tile(s, q, qs, dqs, k, dt, n, d, j, GN, 2), j += 2;
    if (KB > 1 && j < n)
        qk_tile(s, q, qs, dqs, k, dt, n, d, j, GN, 1);
}

/* The longest q prefix split for the bf16 pairs: (8 heads, 512) floats on
 * the stack; a longer head dim takes its first 512 elements in pairs. */
enum { QS_MAX = 512 };

/* Heads in blocks of up to 8, keys in tiles of 16 / GN (rounded down to a
 * power of two). */
static inline __attribute__((always_inline)) void qk_avx512_dt(float *s, const float *q,
                                                               const void *k, mha_dtype dt,
                                                               int64_t n, int64_t G, int64_t d,
                                                               const mha_decode_ahead *ahead) {
    /* bf16: q's whole 32-element chunks (up to QS_MAX) split per 32 into
     * its 16 even and 16 odd elements, as qk_pair_chunk takes the keys */
    const int64_t dqs = dt == MHA_BF16 ? (d < QS_MAX ? d : QS_MAX) / 32 * 32 : 0;
    float qs[dqs > 0 ? 8 * dqs : 1];
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
        float *sg = s + g0 * n;
        const float *qg = q + g0 * d;
        const int gn = G - g0 < 8 ? (int)(G - g0) : 8;
        for (int g = 0; g < gn && dqs > 0; g++)
            for (int64_t x = 0; x < dqs; x += 32) {
                const __m512 lo = _mm512_loadu_ps(qg + g * d + x);
                const __m512 hi = _mm512_loadu_ps(qg + g * d + x + 16);
                _mm512_storeu_ps(qs + g * dqs + x, even512(lo, hi));
                _mm512_storeu_ps(qs + g * dqs + x + 16, odd512(lo, hi));
            }
        const float *qsg = dqs > 0 ? qs : NULL;
        const mha_decode_ahead *ah = g0 == 0 ? ahead : &(const mha_decode_ahead){0}; /* once */
        switch (gn) {
        case 1: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 1, 16); break;
        case 2: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 2, 8); break;
        case 3: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 3, 4); break;
        case 4: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 4, 4); break;
        case 5: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 5, 2); break;
        case 6: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 6, 2); break;
        case 7: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 7, 2); break;
        default: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 8, 2); break;
        }
    }
}

static void qk_avx512(float *s, const float *q, const void *k, mha_dtype dt, int64_t n,
                      int64_t G, int64_t d, const mha_decode_ahead *ahead) {
    switch (dt) {
    case MHA_F16: qk_avx512_dt(s, q, k, MHA_F16, n, G, d, ahead); break;
    case MHA_BF16: qk_avx512_dt(s, q, k, MHA_BF16, n, G, d, ahead); break;
    default: qk_avx512_dt(s, q, k, MHA_F32, n, G, d, ahead); break;
    }
}

/* acc (GN, 16*CB columns from x) += p (GN, nb of a row of n) v (nb, those
 * columns); the chunk is masked by m when !full (then CB = 1).  The GN*CB
 * accumulators stay in registers while the V chunks stream by. */
static inline __attribute__((always_inline)) void
pv_tile(float *acc, const float *p, const void *v, mha_dtype dt, int64_t n, int64_t nb,
        int64_t dv, int64_t x, __mmask16 m, const int full, const int GN, const int CB) {
    __m512 a[16], vv[8];
#pragma GCC unroll 8
    for (int g = 0; g < GN; g++)
#pragma GCC unroll 8
        for (int c = 0; c < CB; c++)
            a[g * CB + c] = full ? _mm512_loadu_ps(acc + g * dv + x + 16 * c)
                                 : _mm512_maskz_loadu_ps(m, acc + g * dv + x);
    for (int64_t j = 0; j < nb; j++) {
#pragma GCC unroll 8
        for (int c = 0; c < CB; c++)
            vv[c] = load16(v, dt, j * dv + x + 16 * c, m, full);
#pragma GCC unroll 8
        for (int g = 0; g < GN; g++) {
            const __m512 pb = _mm512_set1_ps(p[g * n + j]);
#pragma GCC unroll 8
            for (int c = 0; c < CB; c++)
                a[g * CB + c] = _mm512_fmadd_ps(pb, vv[c], a[g * CB + c]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < GN; g++)
#pragma GCC unroll 8
        for (int c = 0; c < CB; c++) {
            if (full)
                _mm512_storeu_ps(acc + g * dv + x + 16 * c, a[g * CB + c]);
            else
                _mm512_mask_storeu_ps(acc + g * dv + x, m, a[g * CB + c]);
        }
}

/* acc (GN, 32*CP columns from x) += p (GN, nb of a row of n) v (nb, those
 * columns) on a bf16 V, 32 columns a 64-byte load split into even and odd
 * elements (bf16_even512, bf16_odd512): the accumulators hold the even and
 * odd columns of each 32, permuted from acc on load and back on store, so
 * each element's sum is the same FMA chain over keys as pv_tile's. */
static inline __attribute__((always_inline)) void pv_pair_tile(float *acc, const float *p,
                                                               const uint16_t *v, int64_t n,
                                                               int64_t nb, int64_t dv, int64_t x,
                                                               const int GN, const int CP) {
    __m512 a[16], vv[8];
#pragma GCC unroll 8
    for (int g = 0; g < GN; g++)
#pragma GCC unroll 4
        for (int c = 0; c < CP; c++) {
            const float *ac = acc + g * dv + x + 32 * c;
            const __m512 lo = _mm512_loadu_ps(ac), hi = _mm512_loadu_ps(ac + 16);
            a[g * 2 * CP + 2 * c] = even512(lo, hi);
            a[g * 2 * CP + 2 * c + 1] = odd512(lo, hi);
        }
    for (int64_t j = 0; j < nb; j++) {
#pragma GCC unroll 4
        for (int c = 0; c < CP; c++) {
            const __m512i raw = _mm512_loadu_si512(v + j * dv + x + 32 * c);
            vv[2 * c] = bf16_even512(raw), vv[2 * c + 1] = bf16_odd512(raw);
        }
#pragma GCC unroll 8
        for (int g = 0; g < GN; g++) {
            const __m512 pb = _mm512_set1_ps(p[g * n + j]);
#pragma GCC unroll 8
            for (int c = 0; c < 2 * CP; c++)
                a[g * 2 * CP + c] = _mm512_fmadd_ps(pb, vv[c], a[g * 2 * CP + c]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < GN; g++)
#pragma GCC unroll 4
        for (int c = 0; c < CP; c++) {
            float *ac = acc + g * dv + x + 32 * c;
            const __m512 e = a[g * 2 * CP + 2 * c], o = a[g * 2 * CP + 2 * c + 1];
            _mm512_storeu_ps(ac, interleave_lo512(e, o));
            _mm512_storeu_ps(ac + 16, interleave_hi512(e, o));
        }
}

/* CB whole 16-column chunks from x: pv_tile, or on a bf16 V (CB even)
 * pv_pair_tile. */
static inline __attribute__((always_inline)) void pv_chunks(float *acc, const float *p,
                                                            const void *v, mha_dtype dt, int64_t n,
                                                            int64_t nb, int64_t dv, int64_t x,
                                                            const int GN, const int CB) {
    if (dt == MHA_BF16 && CB % 2 == 0)
        pv_pair_tile(acc, p, v, n, nb, dv, x, GN, CB / 2);
    else
        pv_tile(acc, p, v, dt, n, nb, dv, x, 0xffff, 1, GN, CB);
}

/* All dv columns for GN heads, keys in blocks of PV_KEYS (bf16: twice as
 * many, over which pv_pair_tile's permutes of the accumulators spread):
 * within a block, CB chunks a tile, then CB/2, ..., 1, then the masked
 * tail chunk, so the block's rows (contiguous, in L1 after the first tile)
 * are read front to back and each tile's accumulators are loaded and
 * stored once a block.  bf16 against the 16-key blocks of vpmovzxwd +
 * vpslld (`build/decode_loops 256 G`, G = 1, 2, 4, 8): P.V 46 -> 54, 35 ->
 * 40, 24 -> 26, 14.7 -> 15.4 GB/s. */
enum { PV_KEYS = 16 };
static inline __attribute__((always_inline)) void pv_heads(float *acc, const float *p,
                                                           const void *v, mha_dtype dt, int64_t n,
                                                           int64_t dv,
                                                           const mha_decode_ahead *ahead,
                                                           const int GN, const int CB) {
    const size_t es = dt == MHA_F32 ? 4 : 2;
    const int64_t keys = dt == MHA_BF16 ? 2 * PV_KEYS : PV_KEYS;
    for (int64_t j0 = 0; j0 < n; j0 += keys) {
        const int64_t nb = n - j0 < keys ? n - j0 : keys;
        const void *vb = (const char *)v + (size_t)(j0 * dv) * es;
        const float *pb = p + j0;
        mha_decode_touch_lines(vb, (size_t)(nb * dv) * es);
        mha_decode_ask_ahead(ahead, j0, nb);
        int64_t x = 0;
        for (; x + 16 * CB <= dv; x += 16 * CB)
            pv_chunks(acc, pb, vb, dt, n, nb, dv, x, GN, CB);
        if (CB > 4 && x + 64 <= dv)
            pv_chunks(acc, pb, vb, dt, n, nb, dv, x, GN, 4), x += 64;
        if (CB > 2 && x + 32 <= dv)
            pv_chunks(acc, pb, vb, dt, n, nb, dv, x, GN, 2), x += 32;
        if (CB > 1 && x + 16 <= dv)
            pv_chunks(acc, pb, vb, dt, n, nb, dv, x, GN, 1), x += 16;
        if (x < dv)
            pv_tile(acc, pb, vb, dt, n, nb, dv, x, mask16(dv - x), 0, GN, 1);
    }
}

/* Heads in blocks of up to 8, columns in tiles of up to 8 chunks so that
 * 8-16 chains run (dv = 128: one tile covers the row for G <= 2). */
static inline __attribute__((always_inline)) void pv_avx512_dt(float *acc, const float *p,
                                                               const void *v, mha_dtype dt,
                                                               int64_t n, int64_t G, int64_t dv,
                                                               const mha_decode_ahead *ahead) {
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
        float *ag = acc + g0 * dv;
        const float *pg = p + g0 * n;
        const mha_decode_ahead *ah = g0 == 0 ? ahead : &(const mha_decode_ahead){0}; /* once */
        switch (G - g0 < 8 ? G - g0 : 8) {
        case 1: pv_heads(ag, pg, v, dt, n, dv, ah, 1, 8); break;
        case 2: pv_heads(ag, pg, v, dt, n, dv, ah, 2, 8); break;
        case 3: pv_heads(ag, pg, v, dt, n, dv, ah, 3, 4); break;
        case 4: pv_heads(ag, pg, v, dt, n, dv, ah, 4, 4); break;
        case 5: pv_heads(ag, pg, v, dt, n, dv, ah, 5, 2); break;
        case 6: pv_heads(ag, pg, v, dt, n, dv, ah, 6, 2); break;
        case 7: pv_heads(ag, pg, v, dt, n, dv, ah, 7, 2); break;
        default: pv_heads(ag, pg, v, dt, n, dv, ah, 8, 2); break;
        }
    }
}

static void pv_avx512(float *acc, const float *p, const void *v, mha_dtype dt, int64_t n,
                      int64_t G, int64_t dv, const mha_decode_ahead *ahead) {
    switch (dt) {
    case MHA_F16: pv_avx512_dt(acc, p, v, MHA_F16, n, G, dv, ahead); break;
    case MHA_BF16: pv_avx512_dt(acc, p, v, MHA_BF16, n, G, dv, ahead); break;
    default: pv_avx512_dt(acc, p, v, MHA_F32, n, G, dv, ahead); break;
    }
}

/* The max 16 lanes at a time, the tail under a mask: vmaxps returns its
 * second operand when the first is NaN, so the running max skips NaNs and
 * an unordered compare notes them. */
static float row_max_avx512(const float *s, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        const __m512 x = _mm512_maskz_loadu_ps(k, s + j);
        m = _mm512_mask_max_ps(m, k, x, m);
        nan |= _mm512_mask_cmp_ps_mask(k, x, x, _CMP_UNORD_Q);
    }
    return nan ? NAN : _mm512_reduce_max_ps(m);
}

/* s = exp(s - m) 16 at a time by exp512, the AVX2 loop's Cephes expf (1-2
 * ulp, exp256's values bit for bit): its full range is needed, since s may
 * hold -inf (whose exp is 0) and m may be NaN; a softmax exp's clamp at
 * -87 would make e^-inf tiny instead of 0.  The sum in 16 lanes, then
 * across them; the tail under a mask. */
static float exp_sum_avx512(float *s, int64_t n, float m) {
    const __m512 mv = _mm512_set1_ps(m);
    __m512 l = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = mask16(n - j);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), mv));
        _mm512_mask_storeu_ps(s + j, k, e);
        l = _mm512_mask_add_ps(l, k, l, e);
    }
    return _mm512_reduce_add_ps(l);
}

const mha_decode_isa MHA_AVX512_SYMBOL(mha_decode_isa_avx512) = {
    qk_avx512, pv_avx512, row_max_avx512, exp_sum_avx512, round_half_row512};
