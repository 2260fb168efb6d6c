/* private_api.h - library functions that are not part of the ABI: for mha's
 * own CLI (`mha bench`) and tests.  They are hidden in libmha.so (built with
 * -fvisibility=hidden and declared without MHA_API) and reached through the
 * static library libmha.a, which the CLI and the tests link.  Not installed.
 * The test hooks (mha_test_*) are elsewhere: src/internal.h and src/io/io.h,
 * in test builds only (docs/errors.md "Test hooks"). */
#ifndef MHA_PRIVATE_API_H
#define MHA_PRIVATE_API_H

/* Measured fp32 multiply-add throughput of this machine in GFLOP/s: an
 * FMA-bound loop (AVX2+FMA when the CPU has it) on `threads` threads
 * (0 = the mha_set_num_threads count) for about `seconds` (0 = 0.2 s).
 * For benchmarks: "100 % of peak". */
double mha_peak_gflops(int threads, double seconds);

#endif
