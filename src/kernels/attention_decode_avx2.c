/* attention_decode_avx2.c - AVX2+FMA(+F16C) inner loops of the decode step
 * (see attention_decode.h; portable twins in attention_decode.c).
 * Letter legend: G heads per kv head, n keys, d, dv.
 *
 * K/V rows are read in their storage dtype and widened in registers: fp16
 * by F16C (vcvtph2ps), fp32 as is, bf16 (the top half of a float) 16
 * elements a 32-byte load split into its even and odd elements by a shift
 * and a mask (bf16_even256, bf16_odd256), one operation per 8 elements where
 * zero-extending 16 -> 32 bits and shifting left 16 took two; q is split the
 * same way once per split of keys and P.V's accumulators permuted once per
 * block of keys (where G <= 2, see pv_chunks), as the avx512 loops do.
 * q.k against the zero-extension (`build/decode_loops 256 G 128 avx2`, best
 * of 8 alternated runs, Zen 3, keys in L2): 21.3 -> 28.0 GB/s of K at G = 1,
 * 22.2 -> 23.8 at G = 2, 11.7 -> 12.3 at G = 4.  Each loop body is written
 * once and specialised per dtype and tile shape by inlining. */
#include "attention_decode.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "convert.h"
#include "simd_avx2.h"

#include <immintrin.h>

/* Elements [off, off + 8) of a row of dtype dt, as float32. */
static inline __attribute__((always_inline)) __m256 load8(const void *p, mha_dtype dt,
                                                          int64_t off) {
    switch (dt) {
    case MHA_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + off)));
    case MHA_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + off))),
            16));
    default: return _mm256_loadu_ps((const float *)p + off);
    }
}

/* A bf16 row's 16 elements from one 32-byte load x as float32 without a
 * widening shuffle: in 32-bit lane i sit elements 2i (low half) and 2i + 1
 * (high half), so the even elements are the lanes shifted left 16 and the
 * odd ones the lanes with the low half cleared. */
static inline __attribute__((always_inline)) __m256 bf16_even256(__m256i x) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}
static inline __attribute__((always_inline)) __m256 bf16_odd256(__m256i x) {
    return _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
}

/* 16 consecutive floats (lo = elements 0-7, hi = 8-15) as their even and
 * odd elements (vshufps picks them per 128-bit lane, vpermpd puts the
 * lanes' halves in order), and back. */
static inline __attribute__((always_inline)) __m256 even256(__m256 lo, __m256 hi) {
    return _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xd8));
}
static inline __attribute__((always_inline)) __m256 odd256(__m256 lo, __m256 hi) {
    return _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xdd)), 0xd8));
}
static inline __attribute__((always_inline)) void interleave256(__m256 e, __m256 o, __m256 *lo,
                                                                __m256 *hi) {
    const __m256 l = _mm256_unpacklo_ps(e, o), h = _mm256_unpackhi_ps(e, o);
    *lo = _mm256_permute2f128_ps(l, h, 0x20);
    *hi = _mm256_permute2f128_ps(l, h, 0x31);
}

/* r[i] = the sum of the 8 lanes of a[i], i < 8. */
static inline __m256 hsum8(const __m256 *a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3); /* lo | hi halves */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* r[i] = the sum of the 8 lanes of a[i], i < 4. */
static inline __m128 hsum4(const __m256 *a) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* A bf16 chunk of 16 elements [x, x + 16) of d: a[g*KB + b] += the even
 * elements' products, then the odd ones' (qs: q split the same way, see
 * qk_avx2_dt), each key's 32 bytes loaded once per half. */
static inline __attribute__((always_inline)) void qk_pair_chunk(__m256 *a, const float *qs,
                                                                int64_t dqs, const uint16_t *k,
                                                                int64_t d, int64_t j, int64_t x,
                                                                const int GN, const int KB) {
    __m256 kv[8];
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) {
#pragma GCC unroll 8
        for (int b = 0; b < KB; b++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(k + (j + b) * d + x));
            kv[b] = half ? bf16_odd256(raw) : bf16_even256(raw);
        }
#pragma GCC unroll 4
        for (int g = 0; g < GN; g++) {
            const __m256 qv = _mm256_loadu_ps(qs + g * dqs + x + 8 * half);
#pragma GCC unroll 8
            for (int b = 0; b < KB; b++)
                a[g * KB + b] = _mm256_fmadd_ps(qv, kv[b], a[g * KB + b]);
        }
    }
}

/* s[g*n + j+b] = q[g] . k[j+b] for GN heads and KB keys (GN*KB <= 12
 * independent FMA chains, enough to cover the FMA latency): each 8-element
 * chunk of a key row is loaded (and widened) once for the GN heads.
 * qs (GN, dqs) non-NULL (a bf16 cache): q's first dqs elements split into
 * even and odd halves per 16, those elements taken 16 at a time by
 * qk_pair_chunk; the rest 8 at a time, then one at a time. */
static inline __attribute__((always_inline)) void qk_tile(float *s, const float *q,
                                                          const float *qs, int64_t dqs,
                                                          const void *k, mha_dtype dt, int64_t n,
                                                          int64_t d, int64_t j, const int GN,
                                                          const int KB) {
    const int64_t d8 = d & ~(int64_t)7;
    __m256 a[12], kv[8];
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++)
        a[i] = _mm256_setzero_ps();
    int64_t x = 0;
    if (dt == MHA_BF16 && qs)
        for (; x < dqs; x += 16)
            qk_pair_chunk(a, qs, dqs, k, d, j, x, GN, KB);
    for (; x < d8; x += 8) {
#pragma GCC unroll 8
        for (int b = 0; b < KB; b++)
            kv[b] = load8(k, dt, (j + b) * d + x);
#pragma GCC unroll 4
        for (int g = 0; g < GN; g++) {
            const __m256 qv = _mm256_loadu_ps(q + g * d + x);
#pragma GCC unroll 8
            for (int b = 0; b < KB; b++)
                a[g * KB + b] = _mm256_fmadd_ps(qv, kv[b], a[g * KB + b]);
        }
    }
    float r[12];
    _mm256_storeu_ps(r, hsum8(a));
    if (GN * KB > 8)
        _mm_storeu_ps(r + 8, hsum4(a + 8));
    for (int g = 0; g < GN; g++)
        for (int b = 0; b < KB; b++) {
            float dot = r[g * KB + b];
            for (int64_t t = d8; t < d; t++)
                dot += q[g * d + t] * mha_load_f(k, dt, (j + b) * d + t);
            s[g * n + j + b] = dot;
        }
}

/* All n keys for GN heads: KB keys a tile, then one at a time; each
 * tile's rows asked for at once (mha_decode_touch_lines; prefetching rows
 * ahead measured no different on Zen 1). */
static inline __attribute__((always_inline)) void qk_heads(float *s, const float *q,
                                                           const float *qs, int64_t dqs,
                                                           const void *k, mha_dtype dt, int64_t n,
                                                           int64_t d,
                                                           const mha_decode_ahead *ahead,
                                                           const int GN, const int KB) {
    const size_t es = dt == MHA_F32 ? 4 : 2;
    int64_t j = 0;
    for (; j + KB <= n; j += KB) {
        mha_decode_touch_lines((const char *)k + (size_t)(j * d) * es, (size_t)(KB * d) * es);
        mha_decode_ask_ahead(ahead, j, KB);
        qk_tile(s, q, qs, dqs, k, dt, n, d, j, GN, KB);
    }
    mha_decode_ask_ahead(ahead, j, n - j);
    for (; j < n; j++)
        qk_tile(s, q, qs, dqs, k, dt, n, d, j, GN, 1);
}

/* The longest q prefix split for the bf16 pairs: (4 heads, 512) floats on
 * the stack; a longer head dim takes its first 512 elements in pairs. */
enum { QS_MAX = 512 };

/* Heads in blocks of up to 4, keys in tiles so that 8 chains run (12 for
 * 4 heads: 3 keys a tile, where 2 left the two FMA pipes waiting;
 * `build/decode_loops 256 G 128 avx2`, best of 8 alternated runs on Zen 3,
 * GB/s of K at G = 4: float32 22.4 -> 29.1, bf16 12.9 -> 14.9, fp16 10.6 ->
 * 12.2; at G = 8 (two blocks of 4) 11.7 -> 14.1, 6.1 -> 7.4, 5.1 -> 6.0.
 * 12 chains at G = 1-3 (tiles of 12, 6, 4 keys) measured slower or mixed:
 * 16 registers no longer hold the chains, the key chunks and q). */
static inline __attribute__((always_inline)) void qk_avx2_dt(float *s, const float *q,
                                                             const void *k, mha_dtype dt,
                                                             int64_t n, int64_t G, int64_t d,
                                                             const mha_decode_ahead *ahead) {
    /* bf16: q's whole 16-element chunks (up to QS_MAX) split per 16 into
     * its 8 even and 8 odd elements, as qk_pair_chunk takes the keys */
    const int64_t dqs = dt == MHA_BF16 ? (d < QS_MAX ? d : QS_MAX) / 16 * 16 : 0;
    float qs[dqs > 0 ? 4 * dqs : 1];
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
        float *sg = s + g0 * n;
        const float *qg = q + g0 * d;
        const int gn = G - g0 < 4 ? (int)(G - g0) : 4;
        for (int g = 0; g < gn && dqs > 0; g++)
            for (int64_t x = 0; x < dqs; x += 16) {
                const __m256 lo = _mm256_loadu_ps(qg + g * d + x);
                const __m256 hi = _mm256_loadu_ps(qg + g * d + x + 8);
                _mm256_storeu_ps(qs + g * dqs + x, even256(lo, hi));
                _mm256_storeu_ps(qs + g * dqs + x + 8, odd256(lo, hi));
            }
        const float *qsg = dqs > 0 ? qs : NULL;
        const mha_decode_ahead *ah = g0 == 0 ? ahead : &(const mha_decode_ahead){0}; /* once */
        switch (gn) {
        case 1: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 1, 8); break;
        case 2: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 2, 4); break;
        case 3: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 3, 2); break;
        default: qk_heads(sg, qg, qsg, dqs, k, dt, n, d, ah, 4, 3); break;
        }
    }
}

static void qk_avx2(float *s, const float *q, const void *k, mha_dtype dt, int64_t n, int64_t G,
                    int64_t d, const mha_decode_ahead *ahead) {
    switch (dt) {
    case MHA_F16: qk_avx2_dt(s, q, k, MHA_F16, n, G, d, ahead); break;
    case MHA_BF16: qk_avx2_dt(s, q, k, MHA_BF16, n, G, d, ahead); break;
    default: qk_avx2_dt(s, q, k, MHA_F32, n, G, d, ahead); break;
    }
}

/* acc (GN, 8*CB columns from x) += p (GN, nb of a row of n) v (nb, those
 * columns): the GN*CB accumulators stay in registers while the V columns
 * stream by; each V chunk is loaded (and widened) once for the GN heads. */
static inline __attribute__((always_inline)) void pv_tile(float *acc, const float *p,
                                                          const void *v, mha_dtype dt, int64_t n,
                                                          int64_t nb, int64_t dv, int64_t x,
                                                          const int GN, const int CB) {
    __m256 a[8], vv[4];
#pragma GCC unroll 8
    for (int g = 0; g < GN; g++)
#pragma GCC unroll 4
        for (int c = 0; c < CB; c++)
            a[g * CB + c] = _mm256_loadu_ps(acc + g * dv + x + 8 * c);
    for (int64_t j = 0; j < nb; j++) {
#pragma GCC unroll 4
        for (int c = 0; c < CB; c++)
            vv[c] = load8(v, dt, j * dv + x + 8 * c);
#pragma GCC unroll 8
        for (int g = 0; g < GN; g++) {
            const __m256 pb = _mm256_broadcast_ss(p + g * n + j);
#pragma GCC unroll 4
            for (int c = 0; c < CB; c++)
                a[g * CB + c] = _mm256_fmadd_ps(pb, vv[c], a[g * CB + c]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < GN; g++)
#pragma GCC unroll 4
        for (int c = 0; c < CB; c++)
            _mm256_storeu_ps(acc + g * dv + x + 8 * c, a[g * CB + c]);
}

/* acc (GN, 16*CP columns from x) += p (GN, nb of a row of n) v (nb, those
 * columns) on a bf16 V, 16 columns a 32-byte load split into even and odd
 * elements (bf16_even256, bf16_odd256): the accumulators hold the even and
 * odd columns of each 16, permuted from acc on load and back on store, so
 * each element's sum is the same FMA chain over keys as pv_tile's. */
static inline __attribute__((always_inline)) void pv_pair_tile(float *acc, const float *p,
                                                               const uint16_t *v, int64_t n,
                                                               int64_t nb, int64_t dv, int64_t x,
                                                               const int GN, const int CP) {
    __m256 a[8], vv[4];
#pragma GCC unroll 8
    for (int g = 0; g < GN; g++)
#pragma GCC unroll 2
        for (int c = 0; c < CP; c++) {
            const float *ac = acc + g * dv + x + 16 * c;
            const __m256 lo = _mm256_loadu_ps(ac), hi = _mm256_loadu_ps(ac + 8);
            a[g * 2 * CP + 2 * c] = even256(lo, hi);
            a[g * 2 * CP + 2 * c + 1] = odd256(lo, hi);
        }
    for (int64_t j = 0; j < nb; j++) {
#pragma GCC unroll 2
        for (int c = 0; c < CP; c++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(v + j * dv + x + 16 * c));
            vv[2 * c] = bf16_even256(raw), vv[2 * c + 1] = bf16_odd256(raw);
        }
#pragma GCC unroll 8
        for (int g = 0; g < GN; g++) {
            const __m256 pb = _mm256_broadcast_ss(p + g * n + j);
#pragma GCC unroll 4
            for (int c = 0; c < 2 * CP; c++)
                a[g * 2 * CP + c] = _mm256_fmadd_ps(pb, vv[c], a[g * 2 * CP + c]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < GN; g++)
#pragma GCC unroll 2
        for (int c = 0; c < CP; c++) {
            float *ac = acc + g * dv + x + 16 * c;
            __m256 lo, hi;
            interleave256(a[g * 2 * CP + 2 * c], a[g * 2 * CP + 2 * c + 1], &lo, &hi);
            _mm256_storeu_ps(ac, lo);
            _mm256_storeu_ps(ac + 8, hi);
        }
}

/* CB whole 8-column chunks from x: pv_tile, or on a bf16 V pv_pair_tile
 * where CB is 4 (G <= 2; `build/decode_loops 256 G 128 avx2`, best of
 * alternated runs on Zen 3: P.V 32 -> 36 GB/s at G = 1, 26 -> 29 at G = 2).
 * With one pair a tile (CB = 2, G = 3, 4) the permutes of its 8
 * accumulators, once per block of keys, cost more than the widening they
 * save: 16.7 against 15.5 GB/s at G = 4, so there the plain tile. */
static inline __attribute__((always_inline)) void pv_chunks(float *acc, const float *p,
                                                            const void *v, mha_dtype dt, int64_t n,
                                                            int64_t nb, int64_t dv, int64_t x,
                                                            const int GN, const int CB) {
    if (dt == MHA_BF16 && CB % 4 == 0)
        pv_pair_tile(acc, p, v, n, nb, dv, x, GN, CB / 2);
    else
        pv_tile(acc, p, v, dt, n, nb, dv, x, GN, CB);
}

/* All dv columns for GN heads, keys in blocks of PV_KEYS: within a block,
 * CB chunks a tile, then two, then single chunks, then the scalar tail, so
 * the block's rows (contiguous) are read front to back while the
 * accumulators of each tile stay in registers (their loads and stores are
 * once per block; 32-key blocks for bf16, as avx512 takes them, measured
 * level). */
enum { PV_KEYS = 16 };
static inline __attribute__((always_inline)) void pv_heads(float *acc, const float *p,
                                                           const void *v, mha_dtype dt, int64_t n,
                                                           int64_t dv,
                                                           const mha_decode_ahead *ahead,
                                                           const int GN, const int CB) {
    const size_t es = dt == MHA_F32 ? 4 : 2;
    const int64_t keys = PV_KEYS;
    for (int64_t j0 = 0; j0 < n; j0 += keys) {
        const int64_t nb = n - j0 < keys ? n - j0 : keys;
        const void *vb = (const char *)v + (size_t)(j0 * dv) * es;
        const float *pb = p + j0;
        mha_decode_touch_lines(vb, (size_t)(nb * dv) * es);
        mha_decode_ask_ahead(ahead, j0, nb);
        int64_t x = 0;
        for (; x + 8 * CB <= dv; x += 8 * CB)
            pv_chunks(acc, pb, vb, dt, n, nb, dv, x, GN, CB);
        if (CB > 2 && x + 16 <= dv)
            pv_chunks(acc, pb, vb, dt, n, nb, dv, x, GN, 2), x += 16;
        for (; x + 8 <= dv; x += 8)
            pv_tile(acc, pb, vb, dt, n, nb, dv, x, GN, 1);
        for (; x < dv; x++)
            for (int64_t j = 0; j < nb; j++)
                for (int g = 0; g < GN; g++)
                    acc[g * dv + x] += pb[g * n + j] * mha_load_f(vb, dt, j * dv + x);
    }
}

/* Heads in blocks of up to 8, columns in tiles so that 6-8 chains run. */
static inline __attribute__((always_inline)) void pv_avx2_dt(float *acc, const float *p,
                                                             const void *v, mha_dtype dt,
                                                             int64_t n, int64_t G, int64_t dv,
                                                             const mha_decode_ahead *ahead) {
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
        float *ag = acc + g0 * dv;
        const float *pg = p + g0 * n;
        const mha_decode_ahead *ah = g0 == 0 ? ahead : &(const mha_decode_ahead){0}; /* once */
        switch (G - g0 < 8 ? G - g0 : 8) {
        case 1: pv_heads(ag, pg, v, dt, n, dv, ah, 1, 4); break;
        case 2: pv_heads(ag, pg, v, dt, n, dv, ah, 2, 4); break;
        case 3: pv_heads(ag, pg, v, dt, n, dv, ah, 3, 2); break;
        case 4: pv_heads(ag, pg, v, dt, n, dv, ah, 4, 2); break;
        case 5: pv_heads(ag, pg, v, dt, n, dv, ah, 5, 1); break;
        case 6: pv_heads(ag, pg, v, dt, n, dv, ah, 6, 1); break;
        case 7: pv_heads(ag, pg, v, dt, n, dv, ah, 7, 1); break;
        default: pv_heads(ag, pg, v, dt, n, dv, ah, 8, 1); break;
        }
    }
}

static void pv_avx2(float *acc, const float *p, const void *v, mha_dtype dt, int64_t n,
                    int64_t G, int64_t dv, const mha_decode_ahead *ahead) {
    switch (dt) {
    case MHA_F16: pv_avx2_dt(acc, p, v, MHA_F16, n, G, dv, ahead); break;
    case MHA_BF16: pv_avx2_dt(acc, p, v, MHA_BF16, n, G, dv, ahead); break;
    default: pv_avx2_dt(acc, p, v, MHA_F32, n, G, dv, ahead); break;
    }
}

/* The max 8 lanes at a time: vmaxps returns its second operand when the
 * first is NaN, so the running max skips NaNs and an unordered compare
 * notes them; the tail padded with -inf. */
static float row_max_avx2(const float *s, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 x = _mm256_loadu_ps(s + j);
        m = _mm256_max_ps(x, m);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    float t[8];
    _mm256_storeu_ps(t, m);
    float r = -INFINITY;
    for (int i = 0; i < 8; i++)
        r = t[i] > r ? t[i] : r;
    for (; j < n; j++) {
        if (isnan(s[j]))
            return NAN;
        r = s[j] > r ? s[j] : r;
    }
    return _mm256_movemask_ps(nan) ? NAN : r;
}

/* s = exp(s - m) 8 at a time by exp256 (1-2 ulp; the tail padded with
 * -inf, whose exp is 0); the sum in 8 lanes, then across them. */
static float exp_sum_avx2(float *s, int64_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 l = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, e);
        l = _mm256_add_ps(l, e);
    }
    if (j < n) {
        float t[8];
        for (int i = 0; i < 8; i++)
            t[i] = j + i < n ? s[j + i] : -INFINITY;
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(t), mv));
        _mm256_storeu_ps(t, e);
        l = _mm256_add_ps(l, e);
        for (int64_t i = 0; j + i < n; i++)
            s[j + i] = t[i];
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* p rounded to dt and back, 8 at a time, as mha_round_to does: fp16 by a
 * vcvtps2ph/vcvtph2ps round trip (round to nearest even, subnormals kept);
 * bf16 by adding 0x7fff + the lowest kept bit and clearing the low half,
 * NaN kept quiet with its top payload (0x00400000 set). */
static void round_p_avx2(float *p, int64_t n, mha_dtype dt) {
    int64_t j = 0;
    if (dt == MHA_F16)
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(p + j, _mm256_cvtph_ps(_mm256_cvtps_ph(
                                        _mm256_loadu_ps(p + j), _MM_FROUND_TO_NEAREST_INT)));
    else if (dt == MHA_BF16)
        for (; j + 8 <= n; j += 8) {
            const __m256 x = _mm256_loadu_ps(p + j);
            const __m256i b = _mm256_castps_si256(x);
            const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
            __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
            const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
            r = _mm256_and_si256(r, top);
            const __m256i qnan =
                _mm256_or_si256(_mm256_and_si256(b, top), _mm256_set1_epi32(0x00400000));
            const __m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
            _mm256_storeu_ps(p + j, _mm256_blendv_ps(_mm256_castsi256_ps(r),
                                                     _mm256_castsi256_ps(qnan), isnan));
        }
    for (; j < n; j++)
        p[j] = mha_round_to(dt, p[j]);
}

const mha_decode_isa mha_decode_isa_avx2 = {qk_avx2, pv_avx2, row_max_avx2, exp_sum_avx2,
                                             round_p_avx2};
#else
const mha_decode_isa mha_decode_isa_avx2 = {0, 0, 0, 0, 0};
#endif
