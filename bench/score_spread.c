/* score_spread.c - attention forward time against the spread of the scores.
 *
 *   make bench && build/score_spread [L] [d] [threads] [reps] [fwd|bwd]
 *       (defaults 2048 64 2 5 fwd; B = 1, H = 8; the automatic kernel, or
 *       MHA_KERNEL's; bwd times mha_sdpa_backward given the forward's out
 *       and lse, as training passes them)
 *
 * q, k, v uniform in [-0.5, 0.5), q then multiplied by 1, 40 and 400: at
 * 400 most scores of a row lie more than 87 (natural log units) below its
 * max, so most softmax weights are below FLT_MIN.  A kernel that lets such
 * weights become denormal floats pays microcode assists on Intel (17-20x
 * the time of spread 1, docs/performance.md "ninth visit"); one that
 * flushes them to 0 runs every spread in about the same time; the same
 * holds for the backward's P and dS.  The three
 * spreads are interleaved, reps rounds; prints one JSON line per spread
 * with the median ms and its ratio to spread 1.
 */
#include "mha.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    const bool bwd = argc > 5 && strcmp(argv[5], "bwd") == 0;
    if (L < 1 || d < 1 || threads < 1 || reps < 1 || reps > MAX_REPS ||
        (argc > 5 && !bwd && strcmp(argv[5], "fwd") != 0)) {
        fprintf(stderr,
                "usage: score_spread [L >= 1] [d >= 1] [threads >= 1] [reps 1..%d] [fwd|bwd]\n",
                MAX_REPS);
        return 2;
    }
    const int64_t shape[4] = {1, 8, L, d};
    const float muls[SPREADS] = {1.0f, 40.0f, 400.0f};
    /* per spread: q, the forward's out and lse (bwd); shared: k, v, dout
     * and the gradients */
    mha_tensor q[SPREADS], o[SPREADS], lse[SPREADS], k, v, dout, g[3];
    const int64_t lse_shape[3] = {1, 8, L};
    mha_status st = MHA_OK;
    mha_tensor *shared[] = {&k, &v, &dout, &g[0], &g[1], &g[2]};
    for (int i = 0; i < 6 && st == MHA_OK; i++)
        st = mha_tensor_create(shared[i], MHA_F32, 4, shape);
    for (int s = 0; s < SPREADS && st == MHA_OK; s++)
        if ((st = mha_tensor_create(&q[s], MHA_F32, 4, shape)) == MHA_OK &&
            (st = mha_tensor_create(&o[s], MHA_F32, 4, shape)) == MHA_OK &&
            (st = mha_tensor_create(&lse[s], MHA_F32, 3, lse_shape)) == MHA_OK)
            fill(q[s].data, 8 * L * d, muls[s], 1);
    if (st != MHA_OK) {
        fprintf(stderr, "score_spread: %s\n", mha_last_error());
        return 1;
    }
    fill(k.data, 8 * L * d, 1.0f, 2);
    fill(v.data, 8 * L * d, 1.0f, 3);
    fill(dout.data, 8 * L * d, 1.0f, 4);
    mha_set_num_threads(threads);
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    for (int s = 0; s < SPREADS && bwd && st == MHA_OK; s++) { /* the backward's inputs */
        opt.lse = &lse[s];
        st = mha_sdpa_forward(&o[s], &q[s], &k, &v, &opt);
    }
    opt.lse = NULL;
    double t[SPREADS][MAX_REPS];
    for (int r = -1; r < reps && st == MHA_OK; r++) /* round -1: a warm-up */
        for (int s = 0; s < SPREADS && st == MHA_OK; s++) {
            const double t0 = now();
            st = bwd ? mha_sdpa_backward(&g[0], &g[1], &g[2], &dout, &o[s], &lse[s], &q[s], &k,
                                         &v, &opt)
                     : mha_sdpa_forward(&o[s], &q[s], &k, &v, &opt);
            if (r >= 0)
                t[s][r] = now() - t0;
        }
    if (st != MHA_OK) {
        fprintf(stderr, "score_spread: %s\n", mha_last_error());
        return 1;
    }
    double base = 0.0;
    for (int s = 0; s < SPREADS; s++) {
        qsort(t[s], (size_t)reps, sizeof(double), cmp);
        const double ms = 1e3 * t[s][reps / 2];
        base = s == 0 ? ms : base;
        printf("{\"op\": \"score_spread\", \"pass\": \"%s\", \"L\": %lld, \"d\": %lld, "
               "\"threads\": %d, \"q_mul\": %g, \"ms\": %.3f, \"vs_spread_1\": %.2f}\n",
               bwd ? "bwd" : "fwd", (long long)L, (long long)d, threads, (double)muls[s], ms,
               ms / base);
    }
    for (int s = 0; s < SPREADS; s++)
        mha_tensor_free(&q[s]), mha_tensor_free(&o[s]), mha_tensor_free(&lse[s]);
    for (int i = 0; i < 6; i++)
        mha_tensor_free(shared[i]);
    return 0;
}
