/* runtime.c - what a call runs on, in one place: the thread count, the one
 * CPU-feature probe, the attention kernel and GEMM path selection (the
 * MHA_KERNEL and MHA_GEMM environment choices, read and validated here) and
 * the machine's measured peak for benchmarks.  Everything here sits above
 * the kernels (src/kernels/ call only mha_threads from this file).
 *
 * MHA_KERNEL=auto|ref|scalar|avx2|avx512 overrides MHA_KERNEL_AUTO for
 * attention;
 * MHA_GEMM=auto|blas|avx2|portable forces the projections' GEMM path.
 * Unset or empty means auto.  Any other value is an error: every call that
 * would select a kernel or a GEMM path returns MHA_ERR_VALUE naming the
 * variable and the valid values (mha_runtime_check), never a silent
 * fallback.
 */
#include "internal.h"
#include "private_api.h"
#include "kernels/attention_flash.h"
#include "kernels/gemm.h"

#include <stdlib.h>
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif
#include <string.h>
#include <strings.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef MHA_HAVE_CBLAS
#include <cblas.h>
#endif

/* ---- threads ----------------------------------------------------------------- */

static _Atomic int requested_threads;

void mha_set_num_threads(int n) { requested_threads = n > 0 ? n : 0; }

int mha_get_num_threads(void) { return mha_threads(); }

int mha_threads(void) {
    int n = requested_threads;
#ifdef _OPENMP
    if (n <= 0)
        n = omp_get_max_threads();
#endif
    return n > 0 ? n : 1;
}

/* ---- the CPU ------------------------------------------------------------------ */

/* A probe's answer, computed once (CPUID exits to the hypervisor in a VM,
 * so it is not asked on every call; idempotent, so a race is harmless). */
static bool probe_once(_Atomic int *known, bool (*probe)(void)) {
    int v = *known; /* 0: not yet asked, 1: yes, 2: no */
    if (!v)
        *known = v = probe() ? 1 : 2;
    return v == 1;
}

/* The fused attention kernels and the GEMM's avx2 path need AVX2 and FMA;
 * the half-precision loads F16C (every AVX2 CPU made has it, Haswell and Zen
 * on). */
static bool probe_avx2_fma(void) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    /* F16C from CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports
     * has no "f16c") */
    unsigned a, b, c, d;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
    return false;
#endif
}

#if defined(__GNUC__) && defined(__x86_64__)
/* XCR0: the state components the OS saves (Intel SDM vol. 1, 13.3). */
static uint64_t os_saved_state(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE */
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}
#endif

/* AVX-512 F, DQ, BW and VL (CPUID leaf 7 EBX bits 16, 17, 30, 31), the
 * AVX2 set, and an OS that saves the opmask and ZMM state (XCR0 bits 1, 2,
 * 5, 6, 7): the avx512 kernels' requirement. */
static bool probe_avx512(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    unsigned a, b, c, d;
    if (!mha_cpu_has_avx2_fma() || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return false;
    const unsigned need = 1u << 16 | 1u << 17 | 1u << 30 | 1u << 31;
    return (b & need) == need && (os_saved_state() & 0xe6) == 0xe6;
#else
    return false;
#endif
}

/* AVX512_BF16 (CPUID leaf 7 sub-leaf 1 EAX bit 5): vdpbf16ps. */
static bool probe_avx512_bf16(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    unsigned a, b, c, d;
    return mha_cpu_has_avx512() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
#else
    return false;
#endif
}

/* AMX-BF16 and AMX-TILE (CPUID leaf 7 EDX bits 22, 24), XCR0's tile
 * config and tile data (bits 17, 18), and on Linux the permission to use
 * the tile data (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, kernel 5.16
 * on: without it the first tile load is SIGILL).  The permission is the
 * process's, granted once; a refusal only means no AMX. */
static bool probe_amx_bf16(void) {
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
    const char *env = getenv("MHA_AMX");
    if (env && strcmp(env, "off") == 0)
        return false;
    unsigned a, b, c, d;
    if (!mha_cpu_has_avx512_bf16() || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return false;
    const unsigned need = 1u << 22 | 1u << 24;
    const uint64_t tiles = 3ull << 17;
    if ((d & need) != need || (os_saved_state() & tiles) != tiles)
        return false;
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
}

bool mha_cpu_has_avx2_fma(void) {
    static _Atomic int known;
    return probe_once(&known, probe_avx2_fma);
}

bool mha_cpu_has_avx512(void) {
    static _Atomic int known;
    return probe_once(&known, probe_avx512);
}

bool mha_cpu_has_avx512_bf16(void) {
    static _Atomic int known;
    return probe_once(&known, probe_avx512_bf16);
}

bool mha_cpu_has_amx_bf16(void) {
    static _Atomic int known;
    return probe_once(&known, probe_amx_bf16);
}

/* The test hook MHA_TEST_AVX512=emulate (test builds with SIMDe only; see
 * tests/emu/avx512_emulation.h): the avx512 kernel then runs the emulated
 * twins of its loops, as if the CPU had AVX-512 and AVX512_BF16. */
bool mha_avx512_emulated(void) {
#if defined(MHA_TEST_HOOKS) && defined(MHA_HAVE_AVX512_EMULATION)
    const char *v = getenv("MHA_TEST_AVX512");
    return v && strcmp(v, "emulate") == 0;
#else
    return false;
#endif
}

bool mha_avx512_runs(void) { return mha_avx512_emulated() || mha_cpu_has_avx512(); }

bool mha_avx512_bf16_runs(void) { return mha_avx512_emulated() || mha_cpu_has_avx512_bf16(); }

/* CPUID leaf 0's vendor string is "AuthenticAMD". */
static bool probe_amd(void) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    unsigned a, b, c, d;
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u &&
           c == 0x444d4163u;
#else
    return false;
#endif
}

bool mha_cpu_is_amd(void) {
    static _Atomic int known;
    return probe_once(&known, probe_amd);
}

/* glibc reads the L2 size from CPUID (leaf 4 on Intel, 0x80000006 on
 * AMD); a machine that does not say is taken as 512 KiB, the smallest
 * L2 of the AVX2 server cores we run on (Zen 2/3). */
int64_t mha_cpu_l2_bytes(void) {
    static _Atomic int64_t known;
    int64_t v = known;
    if (!v) {
#ifdef _SC_LEVEL2_CACHE_SIZE
        const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        v = l2 > 0 ? (int64_t)l2 : (int64_t)512 << 10;
#else
        v = (int64_t)512 << 10;
#endif
        known = v;
    }
    return v;
}

/* Whether vdpbf16ps outruns the float32 FMA loops it would replace: on AMD
 * (Zen 4: one 512-bit vdpbf16ps per cycle, 64 FLOPs, twice the FMA rate),
 * not on the Intel Xeon measured (an AVX-512 server core: 0.5 per cycle,
 * 77-82 GFLOP/s per core against 152-168 for the FMA loop, bench/dot_peak.c;
 * the bf16 forward ran at 0.64x its float32 time).  Decided by vendor, never by a
 * timing, so a given CPU always takes the same loops and the same bits. */
static bool probe_bf16_dot_fast(void) { return mha_cpu_has_avx512_bf16() && mha_cpu_is_amd(); }

bool mha_cpu_bf16_dot_is_fast(void) {
    static _Atomic int known;
    return probe_once(&known, probe_bf16_dot_fast);
}

int64_t mha_chunk_items_wanted(int nthreads) {
    return 2 * (int64_t)nthreads > 16 ? 2 * (int64_t)nthreads : 16;
}

mha_status mha_avx512_check(void) {
    MHA_CHECK(mha_avx512_runs(), MHA_ERR_UNSUPPORTED,
              "kernel: avx512 requested but this CPU lacks AVX-512 (F/BW/VL/DQ)");
    return MHA_OK;
}


/* ---- the environment's choices ---------------------------------------------------- */

/* Index of env's value in names[0..n), 0 (auto) when unset or empty, -1
 * when unknown. */
static int env_choice(const char *var, const char *const *names, int n) {
    const char *v = getenv(var);
    if (!v || !*v)
        return 0;
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0)
            return i;
    return -1;
}

/* Index = the enum value (AUTO first). */
static const char *const kernel_names[] = {"auto", "ref", "scalar", "avx2", "avx512"};
static const char *const gemm_names[] = {"auto", "blas", "avx2", "portable"};

mha_kernel mha_runtime_kernel_env(void) {
    int i = env_choice("MHA_KERNEL", kernel_names, 5);
    return i > 0 ? (mha_kernel)i : MHA_KERNEL_AUTO;
}

mha_gemm_path mha_runtime_gemm_env(void) {
    int i = env_choice("MHA_GEMM", gemm_names, 4);
    return i > 0 ? (mha_gemm_path)i : MHA_GEMM_AUTO;
}

/* ---- attention kernels ------------------------------------------------------------ */

const char *mha_kernel_name(mha_kernel kernel) {
    switch (kernel) {
    case MHA_KERNEL_AUTO: return "auto";
    case MHA_KERNEL_REF: return "ref";
    case MHA_KERNEL_SCALAR: return "scalar";
    case MHA_KERNEL_AVX2: return "avx2";
    case MHA_KERNEL_AVX512: return "avx512";
    }
    return "unknown";
}

mha_kernel mha_kernel_resolve(mha_kernel requested) {
    if (requested != MHA_KERNEL_AUTO)
        return requested;
    mha_kernel env = mha_runtime_kernel_env();
    return env != MHA_KERNEL_AUTO ? env : mha_attn_best_kernel();
}

mha_kernel mha_attn_best_kernel(void) {
    if (mha_cpu_has_avx512())
        return MHA_KERNEL_AVX512;
    return mha_cpu_has_avx2_fma() ? MHA_KERNEL_AVX2 : MHA_KERNEL_SCALAR;
}

/* ---- GEMM paths -------------------------------------------------------------------- */

const char *mha_gemm_path_name(mha_gemm_path path) {
    switch (path) {
    case MHA_GEMM_AUTO: return "auto";
    case MHA_GEMM_BLAS: return "blas";
    case MHA_GEMM_AVX2: return "avx2";
    case MHA_GEMM_PORTABLE: return "portable";
    }
    return "unknown";
}

#ifdef MHA_HAVE_CBLAS
/* True when OpenBLAS's run-time core has AVX2 sgemm kernels.  OpenBLAS
 * 0.3.21 (Debian 12) does not know newer CPUs (e.g. Xeon family 6 model
 * 207) and falls back to "Prescott" (SSE3), 3-4x slower than its Haswell
 * kernel on the same machine; the names below are its cores without AVX2
 * (driver/others/dynamic.c's corename table). */
static bool blas_core_has_avx2(void) {
    static const char *const pre_avx2[] = {
        "unknown",  "katmai",    "coppermine", "northwood", "prescott",     "banias",
        "atom",     "core2",     "penryn",     "dunnington", "nehalem",     "athlon",
        "opteron",  "opteron_sse3", "barcelona", "nano",     "sandybridge", "bobcat",
        "bulldozer", "piledriver", "steamroller"};
    const char *core = openblas_get_corename();
    if (!core)
        return false;
    for (size_t i = 0; i < sizeof pre_avx2 / sizeof pre_avx2[0]; i++)
        if (strcasecmp(core, pre_avx2[i]) == 0)
            return false;
    return true;
}
#endif

/* The automatic choice, computed once (idempotent, so a race is harmless). */
static mha_gemm_path gemm_best(void) {
    static _Atomic int best; /* 0: not yet computed */
    int b = best;
    if (b)
        return (mha_gemm_path)b;
    bool avx2 = mha_cpu_has_avx2_fma();
#ifdef MHA_HAVE_CBLAS
    b = (avx2 && !blas_core_has_avx2()) ? MHA_GEMM_AVX2 : MHA_GEMM_BLAS;
#else
    b = avx2 ? MHA_GEMM_AVX2 : MHA_GEMM_PORTABLE;
#endif
    best = b;
    return (mha_gemm_path)b;
}

mha_gemm_path mha_gemm_resolve(mha_gemm_path requested) {
    if (requested == MHA_GEMM_AUTO) {
        requested = mha_runtime_gemm_env();
        if (requested == MHA_GEMM_AUTO)
            return gemm_best();
    }
#ifndef MHA_HAVE_CBLAS
    if (requested == MHA_GEMM_BLAS)
        return gemm_best();
#endif
    if (requested == MHA_GEMM_AVX2 && !mha_cpu_has_avx2_fma())
        return gemm_best();
    return requested;
}

mha_gemm_path mha_gemm_resolve_for(mha_gemm_path requested, int64_t M, int64_t N, int64_t K) {
    const bool automatic = requested == MHA_GEMM_AUTO && mha_runtime_gemm_env() == MHA_GEMM_AUTO;
    const mha_gemm_path path = mha_gemm_resolve(requested);
    if (automatic && path == MHA_GEMM_BLAS && mha_cpu_has_avx512() &&
        (double)M * (double)N * (double)K <= MHA_GEMM_OWN_MAX_MNK)
        return MHA_GEMM_AVX2;
    return path;
}

/* ---- the environment, checked --------------------------------------------------- */

mha_status mha_runtime_check(void) {
    MHA_CHECK(env_choice("MHA_KERNEL", kernel_names, 5) >= 0, MHA_ERR_VALUE,
              "MHA_KERNEL=%s: unknown kernel (valid: auto, ref, scalar, avx2, avx512)",
              getenv("MHA_KERNEL"));
    MHA_CHECK(env_choice("MHA_GEMM", gemm_names, 4) >= 0, MHA_ERR_VALUE,
              "MHA_GEMM=%s: unknown GEMM path (valid: auto, blas, avx2, portable)",
              getenv("MHA_GEMM"));
    return MHA_OK;
}

/* ---- machine peak (for benchmarks) ------------------------------------------ */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Portable stand-in when AVX2 is absent: 8 independent multiply-add chains. */
static double peak_loop_scalar(int64_t iters, double *flops) {
    float acc[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int64_t i = 0; i < iters; i++)
        for (int u = 0; u < 8; u++)
            acc[u] = acc[u] * 0.999999f + 1e-6f;
    *flops = 16.0 * (double)iters;
    return (double)(acc[0] + acc[7]);
}

double mha_peak_gflops(int threads, double seconds) {
    if (threads < 1)
        threads = mha_threads();
    if (!(seconds > 0.0))
        seconds = 0.2;
    const bool avx2 = mha_cpu_has_avx2_fma(), avx512 = mha_cpu_has_avx512();
    const int64_t iters = avx512 ? 2000000 : avx2 ? 4000000 : 20000000;
    double total = 0.0, t0 = now_seconds(), t1 = t0, sink = 0.0;
    int rounds = 0;
    do {
        double flops_round = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : flops_round, sink)
        {
            double f = 0.0;
            sink += avx512 ? mha_fma_peak_loop_avx512(iters, &f)
                    : avx2 ? mha_fma_peak_loop_avx2(iters, &f)
                           : peak_loop_scalar(iters, &f);
            flops_round += f;
        }
        total += flops_round;
        rounds++;
        t1 = now_seconds();
    } while (t1 - t0 < seconds || rounds < 2);
    return sink == 12345.0 ? 0.0 : total / (t1 - t0) * 1e-9;
}
