/* attention_decode.h - the inner loops of the decode step (one query token
 * per head against a block of cached keys), one set per ISA.
 *
 * Letter legend: G query heads sharing one kv head, n keys in the block,
 * d head dim of q/k, dv head dim of v.  Rows are contiguous (the cache's
 * layout); k and v are in the cache's storage dtype dt (MHA_F32, MHA_F16 or
 * MHA_BF16), read directly and widened to float32 in registers; q, p, s and
 * acc are float32.  Reference: the loops of attention_decode.c; the whole
 * step is checked against mha_attn_fwd_f32_ref (tests/unit/test_decode.c,
 * tests/unit/test_decode_half.c). */
#ifndef MHA_ATTENTION_DECODE_H
#define MHA_ATTENTION_DECODE_H

#include "../internal.h"

/* C: keys per split of the decode step (kv_cache.c).  Fixed, not derived
 * from the thread count, so results are bit-identical for any thread count;
 * with a half cache P is rounded relative to each split's own maximum. */
enum { MHA_DECODE_SPLIT_KEYS = 256 };

/* Asks for every 64-byte line of [p, p + bytes) at once, right before a
 * tile's loads use them (the SIMD loops call it on each q.k tile's K rows
 * and each P.V block's V rows).  The loads of a tile are spread over its
 * FMA chains, so on their own only a few of its lines are in flight;
 * asking for the tile's 2-8 KiB up front overlaps those misses.  Measured
 * on Zen 4 (H 32, Hkv 8, d 128, S 32768, 2 threads, medians of 5-7
 * alternated runs, docs/performance.md): avx512 float32 23.0 -> 18.3 ms,
 * bf16 13.1 -> 9.2, fp16 12.0 -> 10.3.  Asking for the next tile's lines
 * instead (4-16 rows ahead) was no better for K and worse for V. */
static inline __attribute__((always_inline)) void mha_decode_touch_lines(const void *p,
                                                                         size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64)
        __builtin_prefetch((const char *)p + o, 0, 3);
}

/* Rows the SIMD loops ask for into L2 while they stream their own: with
 * their row j, row j of the n rows at p (row_bytes each); p NULL: none.
 * Q.K asks for the split's V rows (P.V reads them next), P.V for the K
 * rows of the thread's next split, so the memory is kept busy through the
 * softmax and the turn from K to V, where each stream had waited on its
 * first misses.  Measured on the Intel Xeon (H 32, Hkv 8, d 128, S 32768,
 * 2 threads, docs/performance.md, "Intel Xeon with AMX, third visit"),
 * medians of 5 alternated runs: float32 15.1 -> 13.4 ms (0.75 -> 0.82 of
 * the measured read bandwidth), bf16 9.5 -> 7.5, fp16 9.5 -> 7.7; S 16384:
 * 0.83-0.91x the time.  The requests only cost instructions where K and V
 * are in the last-level cache (1.0-1.08x the time at S 2048-8192 when
 * `mha bench --decode` still ran the steps back to back), which a model's
 * decode loop does not see: between two steps of one layer every other
 * layer's weights and cache stream through.  With each step after a
 * 256 MiB read pass (the bench since the Zen 3's fourth visit), asking
 * took float32 S 1024 and 2048 (8 and 16 MiB) 0.90x and 0.89x the time and
 * bf16 S 4096 (16 MiB) 0.94x, and was level for bf16 from 4 to 8 MiB
 * (medians of 5-7 alternated runs), hence the bound: the step asks from
 * MHA_DECODE_AHEAD_MIN_BYTES of K and V on.  The scalar loops ignore it.
 * No value depends on it. */
enum { MHA_DECODE_AHEAD_MIN_BYTES = 8 << 20 }; /* 8 MiB: below it, level within the noise */
typedef struct mha_decode_ahead {
    const void *p;
    int64_t n;
    size_t row_bytes;
} mha_decode_ahead;

/* Asks for rows [j, j + rows) of a (those that exist) into L2. */
static inline __attribute__((always_inline)) void mha_decode_ask_ahead(const mha_decode_ahead *a,
                                                                        int64_t j, int64_t rows) {
    if (!a->p || j >= a->n)
        return;
    if (j + rows > a->n)
        rows = a->n - j;
    const char *p = (const char *)a->p + (size_t)j * a->row_bytes;
    for (size_t o = 0; o < (size_t)rows * a->row_bytes; o += 64)
        __builtin_prefetch(p + o, 0, 2);
}

typedef struct mha_decode_isa {
    /* s (G,n) = q (G,d) . k (n,d)^T: each key row read once for the G heads;
     * the rows of ahead asked for alongside */
    void (*qk)(float *s, const float *q, const void *k, mha_dtype dt, int64_t n, int64_t G,
               int64_t d, const mha_decode_ahead *ahead);
    /* acc (G,dv) += p (G,n) v (n,dv): each value row read once; the rows
     * of ahead asked for alongside */
    void (*pv)(float *acc, const float *p, const void *v, mha_dtype dt, int64_t n, int64_t G,
               int64_t dv, const mha_decode_ahead *ahead);
    /* the largest of s (n): NaN if any is NaN, -inf if n = 0 */
    float (*row_max)(const float *s, int64_t n);
    /* s (n) = exp(s - m) in place; returns their sum */
    float (*exp_sum)(float *s, int64_t n, float m);
    /* p (n) rounded in place to dt and back (mha_round_to), dt a half type */
    void (*round_p)(float *p, int64_t n, mha_dtype dt);
} mha_decode_isa;

extern const mha_decode_isa mha_decode_isa_scalar;
/* NULL members when the build has no AVX2 code; callers check the CPU. */
extern const mha_decode_isa mha_decode_isa_avx2;
/* The AVX-512 loops (attention_decode_avx512.c); callers check
 * mha_avx512_runs() and take them with MHA_AVX512_PICK. */
MHA_AVX512_DECLARE(mha_decode_isa, mha_decode_isa_avx512);

/* The loops of kernel kr (MHA_KERNEL_SCALAR, AVX2 or AVX512; kv_cache.c's
 * one dispatch point, also used by the tests) into *isa, or
 * MHA_ERR_UNSUPPORTED naming the ISA this build or CPU lacks. */
mha_status mha_decode_isa_for(mha_kernel kr, const mha_decode_isa **isa);

#endif
