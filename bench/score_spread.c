/* score_spread.c - attention forward time against the spread of the scores.
 *
 *   make bench && build/score_spread [L] [d] [threads] [reps]
 *       (defaults 2048 64 2 5; B = 1, H = 8; the automatic kernel, or
 *       MHA_KERNEL's)
 *
 * q, k, v uniform in [-0.5, 0.5), q then multiplied by 1, 40 and 400: at
 * 400 most scores of a row lie more than 87 (natural log units) below its
 * max, so most softmax weights are below FLT_MIN.  A kernel that lets such
 * weights become denormal floats pays microcode assists on Intel (17-20x
 * the time of spread 1, docs/performance.md "ninth visit"); one that
 * flushes them to 0 runs every spread in about the same time.  The three
 * spreads are interleaved, reps rounds; prints one JSON line per spread
 * with the median ms and its ratio to spread 1.
 */
#include "mha.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { SPREADS = 3, MAX_REPS = 101 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* x (n) uniform in [-mul/2, mul/2) from a fixed sequence. */
static void fill(float *x, int64_t n, float mul, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = mul * ((float)(seed >> 40) / (float)(1u << 24) - 0.5f);
    }
}

int main(int argc, char **argv) {
    const int64_t L = argc > 1 ? atoll(argv[1]) : 2048, d = argc > 2 ? atoll(argv[2]) : 64;
    const int threads = argc > 3 ? atoi(argv[3]) : 2, reps = argc > 4 ? atoi(argv[4]) : 5;
    if (L < 1 || d < 1 || threads < 1 || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "usage: score_spread [L >= 1] [d >= 1] [threads >= 1] [reps 1..%d]\n",
                MAX_REPS);
        return 2;
    }
    const int64_t shape[4] = {1, 8, L, d};
    const float muls[SPREADS] = {1.0f, 40.0f, 400.0f};
    mha_tensor q[SPREADS], k, v, o;
    mha_status st = mha_tensor_create(&k, MHA_F32, 4, shape);
    if (st == MHA_OK)
        st = mha_tensor_create(&v, MHA_F32, 4, shape);
    if (st == MHA_OK)
        st = mha_tensor_create(&o, MHA_F32, 4, shape);
    for (int s = 0; s < SPREADS && st == MHA_OK; s++)
        if ((st = mha_tensor_create(&q[s], MHA_F32, 4, shape)) == MHA_OK)
            fill(q[s].data, 8 * L * d, muls[s], 1);
    if (st != MHA_OK) {
        fprintf(stderr, "score_spread: %s\n", mha_last_error());
        return 1;
    }
    fill(k.data, 8 * L * d, 1.0f, 2);
    fill(v.data, 8 * L * d, 1.0f, 3);
    mha_set_num_threads(threads);
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    double t[SPREADS][MAX_REPS];
    for (int r = -1; r < reps; r++) /* round -1: a warm-up */
        for (int s = 0; s < SPREADS; s++) {
            const double t0 = now();
            if ((st = mha_sdpa_forward(&o, &q[s], &k, &v, &opt)) != MHA_OK) {
                fprintf(stderr, "score_spread: %s\n", mha_last_error());
                return 1;
            }
            if (r >= 0)
                t[s][r] = now() - t0;
        }
    double base = 0.0;
    for (int s = 0; s < SPREADS; s++) {
        qsort(t[s], (size_t)reps, sizeof(double), cmp);
        const double ms = 1e3 * t[s][reps / 2];
        base = s == 0 ? ms : base;
        printf("{\"op\": \"score_spread\", \"L\": %lld, \"d\": %lld, \"threads\": %d, "
               "\"q_mul\": %g, \"ms\": %.3f, \"vs_spread_1\": %.2f}\n",
               (long long)L, (long long)d, threads, (double)muls[s], ms, ms / base);
    }
    for (int s = 0; s < SPREADS; s++)
        mha_tensor_free(&q[s]);
    mha_tensor_free(&k), mha_tensor_free(&v), mha_tensor_free(&o);
    return 0;
}
