/* decode_loops.c - the decode step's two inner loops alone: GB/s of q.k and
 * P.V over one split of cached keys that stays in L2, for each storage
 * dtype, on one thread.
 *
 *   build/decode_loops [n keys] [G heads] [d] [kernel]
 *       defaults: 256 4 128 avx512 (kernel: scalar, avx2 or avx512)
 *
 * The whole step (`mha bench --decode`) also reads the cache from L3 or
 * memory, merges splits and runs the softmax; this isolates the loops'
 * own throughput (their widening of half rows, the reductions), which is
 * what a change to them moves.  Each loop runs 1e9 multiply-adds a pass, best of
 * 5 passes; GB/s counts the K (or V) bytes read.  Results are printed, not
 * checked: tests/unit/test_decode*.c check the values.
 */
#include "kernels/attention_decode.h"
#include "kernels/convert.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* n rounded up to a multiple of 64 (whole lines for aligned_alloc). */
static int64_t round64(int64_t n) { return (n + 63) / 64 * 64; }

/* Best of 5 passes of reps calls of qk (which = 0) or pv (1), seconds. */
static double best_pass(const mha_decode_isa *isa, int which, int reps, float *s, const float *q,
                        const void *kv, float *acc, mha_dtype dt, int64_t n, int64_t G,
                        int64_t d) {
    const mha_decode_ahead none = {0};
    double best = INFINITY;
    for (int pass = 0; pass < 5; pass++) {
        const double t0 = now_s();
        for (int r = 0; r < reps; r++)
            if (which == 0)
                isa->qk(s, q, kv, dt, n, G, d, &none);
            else
                isa->pv(acc, s, kv, dt, n, G, d, &none);
        const double t = now_s() - t0;
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? atoll(argv[1]) : 256, G = argc > 2 ? atoll(argv[2]) : 4;
    const int64_t d = argc > 3 ? atoll(argv[3]) : 128;
    const char *kname = argc > 4 ? argv[4] : "avx512";
    const mha_kernel kr = !strcmp(kname, "scalar") ? MHA_KERNEL_SCALAR
                          : !strcmp(kname, "avx2") ? MHA_KERNEL_AVX2
                                                   : MHA_KERNEL_AVX512;
    if (n < 1 || n > MHA_DECODE_SPLIT_KEYS || G < 1 || G > 64 || d < 1 || d > 1024) {
        fprintf(stderr, "usage: decode_loops [n 1..%d] [G 1..64] [d 1..1024] [kernel]\n",
                MHA_DECODE_SPLIT_KEYS);
        return 2;
    }
    const mha_decode_isa *isa;
    if (mha_decode_isa_for(kr, &isa) != MHA_OK) {
        printf("%s: skipped (%s)\n", kname, mha_last_error());
        return 0;
    }
    /* 64-byte aligned, as the cache's rows are (a row split across two
     * lines costs every load a second access) */
    float *q = aligned_alloc(64, sizeof(float) * (size_t)round64(G * d));
    float *s = aligned_alloc(64, sizeof(float) * (size_t)round64(G * n));
    float *acc = aligned_alloc(64, sizeof(float) * (size_t)round64(G * d));
    void *kv = aligned_alloc(64, sizeof(float) * (size_t)round64(n * d));
    if (!q || !s || !acc || !kv)
        return 1;
    memset(acc, 0, sizeof(float) * (size_t)(G * d));
    for (int64_t i = 0; i < G * d; i++)
        q[i] = sinf(0.37f * (float)i);
    for (int64_t i = 0; i < G * n; i++)
        s[i] = 1.0f / (float)(1 + i % 7);
    const int reps = (int)(1e9 / (double)(n * d * G)) + 1; /* ~1e9 multiply-adds a pass */
    static const mha_dtype dts[3] = {MHA_F32, MHA_F16, MHA_BF16};
    printf("# decode loops, %s, n %lld keys, G %lld heads, d = dv = %lld, 1 thread\n", kname,
           (long long)n, (long long)G, (long long)d);
    for (int t = 0; t < 3; t++) {
        for (int64_t i = 0; i < n * d; i++)
            mha_store_f(kv, dts[t], i, cosf(0.11f * (float)i));
        const double bytes = (double)(n * d) * (double)mha_dtype_size(dts[t]) * reps;
        const double tq = best_pass(isa, 0, reps, s, q, kv, acc, dts[t], n, G, d);
        const double tv = best_pass(isa, 1, reps, s, q, kv, acc, dts[t], n, G, d);
        printf("%-4s  q.k %6.1f GB/s  P.V %6.1f GB/s\n", dts[t] == MHA_F32 ? "f32" : dts[t] == MHA_F16 ? "f16" : "bf16",
               1e-9 * bytes / tq, 1e-9 * bytes / tv);
    }
    free(q), free(s), free(acc), free(kv);
    return 0;
}
