/* dot_peak.c - the fp32 FMA rate against the vdpbf16ps rate on this core.
 *
 *   build/dot_peak [seconds]      (make bench builds it; default 0.5 s each)
 *
 * Loops of independent chains on one thread: vfmadd231ps on 256-bit
 * registers (12 chains, 16 FLOPs an instruction: the peak of the avx2
 * kernels), on 512-bit ones (16 chains, 32 FLOPs) and vdpbf16ps (64 FLOPs:
 * 16 lanes x 2 products + sums), each where the CPU has it.  Prints GFLOP/s of each and their ratio, the measurement behind
 * mha_cpu_bf16_dot_is_fast (src/runtime.c): on Zen 4 vdpbf16ps runs at twice
 * the FMA rate, on the Intel Xeon measured at half of it (docs/performance.md).
 * Compiled without ISA flags: the two loops carry target attributes and run
 * only after __builtin_cpu_supports says the CPU has the instructions.
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* iters steps of 12 256-bit FMA chains (enough for 2 ports x 5 cycles);
 * returns a value that keeps them alive */
__attribute__((target("avx2,fma"))) static float fma256_loop(long iters) {
    __m256 acc[12];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int u = 0; u < 12; u++)
        acc[u] = _mm256_set1_ps((float)u);
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int u = 0; u < 12; u++)
            acc[u] = _mm256_fmadd_ps(acc[u], a, b);
    float t[8], s = 0.0f;
    for (int u = 0; u < 12; u++) {
        _mm256_storeu_ps(t, acc[u]);
        for (int i = 0; i < 8; i++)
            s += t[i];
    }
    return s;
}

/* iters steps of 16 FMA chains; returns a value that keeps them alive */
__attribute__((target("avx512f"))) static float fma_loop(long iters) {
    __m512 acc[16];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int u = 0; u < 16; u++)
        acc[u] = _mm512_set1_ps((float)u);
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++)
            acc[u] = _mm512_fmadd_ps(acc[u], a, b);
    float s = 0.0f;
    for (int u = 0; u < 16; u++)
        s += _mm512_reduce_add_ps(acc[u]);
    return s;
}

/* iters steps of 16 vdpbf16ps chains on bf16 pairs of 1.0 */
__attribute__((target("avx512f,avx512bf16"))) static float dot_loop(long iters) {
    __m512 acc[16];
    const __m512i one = _mm512_set1_epi32(0x3f803f80); /* two bf16 1.0 */
    __m512bh a;
    __builtin_memcpy(&a, &one, sizeof a);
    for (int u = 0; u < 16; u++)
        acc[u] = _mm512_set1_ps((float)u);
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++)
            acc[u] = _mm512_dpbf16_ps(acc[u], a, a);
    float s = 0.0f;
    for (int u = 0; u < 16; u++)
        s += _mm512_reduce_add_ps(acc[u]);
    return s;
}

/* GFLOP/s of loop over about `seconds` (flops_per_step per step) */
static double rate(float (*loop)(long), double flops_per_step, double seconds, float *sink) {
    long iters = 1 << 16;
    double t = 0.0;
    for (;;) {
        const double t0 = now();
        *sink += loop(iters);
        t = now() - t0;
        if (t >= seconds)
            break;
        iters *= 2;
    }
    return (double)iters * flops_per_step / t * 1e-9;
}

int main(int argc, char **argv) {
    const double seconds = argc > 1 ? atof(argv[1]) : 0.5;
    __builtin_cpu_init();
    float sink = 0.0f;
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("dot_peak: skipped (this CPU lacks AVX2+FMA)\n");
        return 0;
    }
    const double fma256 = rate(fma256_loop, 12.0 * 16.0, seconds, &sink);
    printf("fp32 FMA   %7.1f GFLOP/s (1 thread, vfmadd231ps ymm)\n", fma256);
    if (!__builtin_cpu_supports("avx512f")) {
        printf("zmm FMA    skipped (this CPU lacks AVX-512F)\n");
        return sink == 1234.5f;
    }
    const double fma = rate(fma_loop, 16.0 * 32.0, seconds, &sink);
    printf("fp32 FMA   %7.1f GFLOP/s (1 thread, vfmadd231ps zmm)\n", fma);
    if (!__builtin_cpu_supports("avx512bf16")) {
        printf("vdpbf16ps  skipped (this CPU lacks AVX512_BF16)\n");
        return sink == 1234.5f;
    }
    const double dot = rate(dot_loop, 16.0 * 64.0, seconds, &sink);
    printf("vdpbf16ps  %7.1f GFLOP/s (1 thread), %.2fx the FMA rate\n", dot, dot / fma);
    return sink == 1234.5f;
}
