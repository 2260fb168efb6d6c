/* gemm_bench.c - GFLOP/s of the projections' GEMM paths (src/kernels/gemm.h).
 *
 *   bench/gemm.sh [threads]     builds this against $MHA_BUILD/libmha.a and runs
 *                               it for avx2, portable, and OpenBLAS under its
 *                               detected core and OPENBLAS_CORETYPE=Haswell.
 *
 * Usage: gemm_bench PATH M N K [reps]; prints one JSON line:
 * y (M,N) = x (M,K) w^T + bias, FLOP 2*M*N*K, median of reps after a
 * warm-up; max_err against the portable path.  PATH "packed" times the
 * trained model's kernel (src/kernels/gemm_packed.h) on w packed once
 * before timing (needs AVX2+FMA).
 */
#include "kernels/gemm.h"
#include "kernels/gemm_packed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef MHA_HAVE_CBLAS
#include <cblas.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: gemm_bench blas|avx2|portable|packed M N K [reps]\n");
        return 2;
    }
    mha_gemm_path path = strcmp(argv[1], "blas") == 0   ? MHA_GEMM_BLAS
                         : strcmp(argv[1], "avx2") == 0 ? MHA_GEMM_AVX2
                                                        : MHA_GEMM_PORTABLE;
    int64_t M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]);
    int reps = argc > 5 ? atoi(argv[5]) : 7;
    if (M <= 0 || N <= 0 || K <= 0 || reps < 1 || reps > 101)
        return 2;
    float *x = malloc(sizeof(float) * (size_t)(M * K)), *w = malloc(sizeof(float) * (size_t)(N * K));
    float *b = malloc(sizeof(float) * (size_t)N), *y = malloc(sizeof(float) * (size_t)(M * N));
    float *r = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++)
        x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < N * K; i++)
        w[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < N; i++)
        b[i] = (float)i / (float)N;
    mha_linear_f32_path(MHA_GEMM_PORTABLE, r, N, x, K, w, K, b, M, N, K, 0);
    const int packed = strcmp(argv[1], "packed") == 0;
    float *wp = NULL;
    if (packed) {
        if (!mha_cpu_has_avx2_fma() || !(wp = malloc(sizeof(float) *
                                                     (size_t)mha_gemm_packed_floats(N, K))))
            return 2;
        mha_gemm_pack(wp, w, K, N, K);
    }
    mha_gemm_path ran = packed ? MHA_GEMM_AVX2
                               : mha_linear_f32_path(path, y, N, x, K, w, K, b, M, N, K, 0);
    if (packed) /* warm-up */
        mha_gemm_packed_f32_avx2(y, N, x, K, wp, b, M, N, K, 0, 0);
    double t[101];
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        if (packed)
            mha_gemm_packed_f32_avx2(y, N, x, K, wp, b, M, N, K, 0, 0);
        else
            mha_linear_f32_path(path, y, N, x, K, w, K, b, M, N, K, 0);
        t[i] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp);
    double err = 0;
    for (int64_t i = 0; i < M * N; i++)
        err = fabs(y[i] - r[i]) > err ? fabs(y[i] - r[i]) : err;
    const char *core = "none";
#ifdef MHA_HAVE_CBLAS
    core = openblas_get_corename();
#endif
    double ms = 1e3 * t[reps / 2];
    printf("{\"op\": \"gemm\", \"path\": \"%s\", \"blas_core\": \"%s\", \"M\": %lld, \"N\": %lld, "
           "\"K\": %lld, \"threads\": %d, \"ms\": %.3f, \"gflops\": %.2f, \"max_err\": %.3g}\n",
           packed ? "packed" : mha_gemm_path_name(ran), core, (long long)M, (long long)N, (long long)K,
           mha_get_num_threads(), ms, 2e-9 * (double)M * (double)N * (double)K / t[reps / 2], err);
    free(x), free(w), free(b), free(y), free(r), free(wp);
    return 0;
}
