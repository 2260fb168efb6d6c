/* bench_decode.c - `mha bench --decode`: op "decode", one new token per
 * head against a filled KV cache (mha_attention_decode), validated first.
 *
 * Letter legend: B batch, H query heads, Hkv key/value heads, S cached keys,
 * d head dim (= dv).
 *
 * --dtype f32|bf16|f16 is the cache's storage.  Bytes moved per step =
 * es * 2 * B*Hkv*S*d (K and V in the storage dtype of es bytes, read once:
 * GQA groups share them) + 4 * 2 * B*H*d (q in, out); gbps = bytes / time.
 * FLOPs = 4*B*H*S*d.  read_gbps: the machine's read bandwidth measured on a
 * buffer of the cache's size, and at least PROBE_MIN_BYTES, with the same
 * threads (a sum of 64-bit words).
 * The output is validated against the reference decode (MHA_KERNEL_REF:
 * float64 over the cache in position order, P unrounded, so a half cache
 * differs by the rounding of P: bound 1e-4 for f32, 2e-3 f16, 1e-2 bf16)
 * before timing.
 * Timing: --reps pairs after one warm-up of each, a read pass then a step.
 * Each step thus finds K and V out of the caches, as in a model's decode
 * loop, where the other layers' weights stream through them between two
 * steps of one layer; and each step's bandwidth is compared with a read
 * pass of the same moment, where a shared host's rate moves by 2-5x within
 * a run (docs/performance.md, "AMD EPYC Zen 3, AVX2 only, fourth visit").
 * ms: the median step, ms_min the fastest; read_gbps: from the median read
 * pass; bw_frac: the median over the pairs of the step's GB/s over its read
 * pass's.
 */
#include "cli.h"

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

static void usage(FILE *f) {
    fprintf(f, "usage: mha bench --decode [--batch B] [--heads H] [--kv-heads Hkv]\n"
               "                 [--kv-seq S[,S...]] [--head-dim d] [--threads N] [--reps N]\n"
               "                 [--kernel ref|scalar|avx2|avx512|auto] [--dtype f32|bf16|f16] [--json]\n"
               "op \"decode\": one token against S cached keys; prints ms (the median step;\n"
               "min: the fastest), GB/s of K/V read (and q/out), GFLOP/s, the read bandwidth\n"
               "of a plain read pass (at least 256 MiB) run before each step, which leaves\n"
               "K and V out of the caches, and the fraction of it reached (the median over\n"
               "the pairs), the error against the reference.  --dtype: the cache's storage.\n"
               "Defaults: B=1 H=32 Hkv=8 d=128 S=1024,4096,16384 (the GQA shape of an 8B\n"
               "model), f32.\n");
}

/* The fewest bytes a read pass reads: more than any last-level cache we
 * run on holds (32 MiB on a Zen 3 or Zen 4 CCD, up to about 100 MiB on a
 * Xeon), so that each pass leaves the step's K and V out of the caches and
 * reads memory, not a cache, whatever the size of the cache. */
enum { PROBE_MIN_BYTES = 256 << 20 };

static volatile uint64_t read_sink; /* keeps the reads of read_gbps */

/* Seconds of one pass reading n bytes (a multiple of 32) with `threads`
 * threads: a sum of 64-bit words in 4 chains (integer adds keep up with
 * memory). */
static double read_pass(const uint64_t *w, size_t n, int threads) {
    const size_t words = n / 8;
    const double t0 = now_s();
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : s0, s1, s2, s3)
    for (size_t i = 0; i < words / 4; i++) {
        s0 += w[4 * i], s1 += w[4 * i + 1], s2 += w[4 * i + 2], s3 += w[4 * i + 3];
    }
    const double t = now_s() - t0;
    read_sink += s0 + s1 + s2 + s3;
    return t;
}

static int run_case(int64_t B, int64_t H, int64_t Hkv, int64_t S, int64_t d, int reps,
                    mha_kernel kernel, mha_dtype dtype, int json, int threads) {
    mha_kv_cache *c = NULL;
    mha_tensor k = {0}, q = {0}, o = {0}, r = {0};
    int rc = CLI_OK;
    mha_status st = mha_kv_cache_create(&c, dtype, B, Hkv, S, d, d, 0);
    if (st == MHA_OK)
        st = mha_tensor_create(&k, MHA_F32, 4, (int64_t[]){B, Hkv, S, d});
    if (st == MHA_OK)
        st = mha_tensor_create(&q, MHA_F32, 4, (int64_t[]){B, H, 1, d});
    if (st == MHA_OK)
        st = mha_tensor_create(&o, MHA_F32, 4, (int64_t[]){B, H, 1, d});
    if (st == MHA_OK)
        st = mha_tensor_create(&r, MHA_F32, 4, (int64_t[]){B, H, 1, d});
    if (st == MHA_OK) {
        mha_randn(k.data, B * Hkv * S * d, 1, 1.0f);
        mha_randn(q.data, B * H * d, 2, 1.0f);
        st = mha_kv_cache_append(c, &k, &k); /* V = K: the bytes are what matter */
    }
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    double err = 0;
    if (st == MHA_OK) { /* validate: the reference decode */
        opt.kernel = MHA_KERNEL_REF;
        st = mha_attention_decode(&r, &q, c, &opt);
    }
    if (st == MHA_OK) {
        opt.kernel = kernel;
        st = mha_attention_decode(&o, &q, c, &opt); /* also the warm-up */
    }
    if (st != MHA_OK) {
        rc = cli_fail("bench", st, "decode");
        goto done;
    }
    for (int64_t x = 0; x < B * H * d; x++) {
        double e = fabs((double)((float *)o.data)[x] - (double)((float *)r.data)[x]);
        err = e > err ? e : err;
    }
    const double cache_bytes = (double)mha_dtype_size(dtype) * 2.0 * (double)(B * Hkv * S * d);
    const double bytes = cache_bytes + 4.0 * 2.0 * (double)(B * H * d);
    const size_t probe_bytes =
        (cache_bytes > PROBE_MIN_BYTES ? (size_t)cache_bytes + 31 : PROBE_MIN_BYTES) / 32 * 32;
    /* step times, read-pass times, their paired bandwidth fractions */
    double *t = malloc(sizeof(double) * 3 * (size_t)reps);
    uint64_t *w = malloc(probe_bytes);
    if (!t || !w) {
        free(t), free(w);
        rc = cli_fail("bench", MHA_ERR_NOMEM, "decode: the timing buffers");
        goto done;
    }
    double *tr = t + reps, *frac = tr + reps;
    memset(w, 1, probe_bytes);
    read_pass(w, probe_bytes, threads); /* warm-up; the step's was the validated run */
    for (int i = 0; i < reps; i++) {
        tr[i] = read_pass(w, probe_bytes, threads);
        const double t0 = now_s();
        mha_attention_decode(&o, &q, c, &opt);
        t[i] = now_s() - t0;
        frac[i] = (bytes / t[i]) / ((double)probe_bytes / tr[i]);
    }
    free(w);
    const double ms = 1e3 * cli_median(t, reps), ms_min = 1e3 * t[0]; /* t sorted */
    const double rgbps = (double)probe_bytes / (cli_median(tr, reps) * 1e9);
    const double bw_frac = cli_median(frac, reps);
    free(t);
    const double gbps = bytes / (ms * 1e6), gf = 4.0 * (double)(B * H * S * d) / (ms * 1e6);
    const char *kn = mha_kernel_name(mha_kernel_resolve(kernel));
    const char *dn = dtype == MHA_BF16 ? "bf16" : dtype == MHA_F16 ? "f16" : "f32";
    if (json)
        printf("{\"op\":\"decode\",\"kernel\":\"%s\",\"dtype\":\"%s\",\"B\":%lld,\"H\":%lld,"
               "\"Hkv\":%lld,\"L\":1,\"S\":%lld,\"d\":%lld,\"threads\":%d,\"ms\":%.4f,\"ms_min\":%.4f,"
               "\"gbps\":%.2f,\"gflops\":%.2f,\"read_gbps\":%.2f,\"bw_frac\":%.3f,"
               "\"max_err\":%.3g}\n",
               kn, dn, (long long)B, (long long)H, (long long)Hkv, (long long)S, (long long)d,
               threads, ms, ms_min, gbps, gf, rgbps, bw_frac, err);
    else
        printf("decode %-6s %-4s B=%-2lld H=%-2lld Hkv=%-2lld S=%-6lld d=%-3lld t=%d %9.3f ms "
               "(min %.3f) %7.2f GB/s %7.1f GFLOP/s  read %6.2f GB/s (%3.0f%%)  err %.2g\n",
               kn, dn, (long long)B, (long long)H, (long long)Hkv, (long long)S, (long long)d,
               threads, ms, ms_min, gbps, gf, rgbps, 100.0 * bw_frac, err);
    fflush(stdout);
    const double tol = dtype == MHA_BF16 ? 1e-2 : dtype == MHA_F16 ? 2e-3 : 1e-4;
    if (!(err <= tol)) {
        fprintf(stderr, "mha bench: decode: error %.3g against the reference\n", err);
        rc = CLI_INTERNAL;
    }
done:
    mha_kv_cache_free(c);
    mha_tensor_free(&k), mha_tensor_free(&q), mha_tensor_free(&o), mha_tensor_free(&r);
    return rc;
}

int cli_bench_decode(int argc, char **argv) {
    int64_t B = 1, H = 32, Hkv = 8, d = 128, S[16] = {1024, 4096, 16384};
    int nS = 3, reps = 9, json = 0, threads = 0;
    mha_kernel kernel = MHA_KERNEL_AUTO;
    mha_dtype dtype = MHA_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--decode"))
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return CLI_OK;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "mha bench: %s needs a value (see mha bench --decode --help)\n", a);
            return CLI_BAD_INPUT;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--kernel")) {
            const int named = cli_kernel_named(v);
            if (named < 0) {
                fprintf(stderr,
                        "mha bench: --kernel: '%s' is not ref, scalar, avx2, avx512 or auto\n", v);
                return CLI_BAD_INPUT;
            }
            kernel = (mha_kernel)named;
            continue;
        }
        if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "f32") || !strcmp(v, "bf16") || !strcmp(v, "f16"))
                dtype = v[0] == 'b' ? MHA_BF16 : v[1] == '1' ? MHA_F16 : MHA_F32;
            else {
                fprintf(stderr, "mha bench: --dtype: '%s' is not f32, bf16 or f16\n", v);
                return CLI_BAD_INPUT;
            }
            continue;
        }
        if (!strcmp(a, "--kv-seq")) {
            nS = cli_parse_i64_list(v, 1, (int64_t)1 << 30, S, 16);
            if (nS < 1) {
                fprintf(stderr, "mha bench: --kv-seq: '%s' is not a list of lengths\n", v);
                return CLI_BAD_INPUT;
            }
            continue;
        }
        int64_t x;
        int64_t *dst = !strcmp(a, "--batch") ? &B : !strcmp(a, "--heads") ? &H
                     : !strcmp(a, "--kv-heads") ? &Hkv : !strcmp(a, "--head-dim") ? &d : NULL;
        if (!cli_parse_i64(v, 1, 1 << 20, &x) ||
            (!dst && strcmp(a, "--threads") && strcmp(a, "--reps"))) {
            fprintf(stderr, "mha bench: %s '%s': unknown option or not a positive integer\n", a,
                    v);
            return CLI_BAD_INPUT;
        }
        if (dst)
            *dst = x;
        else if (!strcmp(a, "--threads"))
            threads = (int)x;
        else
            reps = (int)x;
    }
    if (threads > 0)
        mha_set_num_threads(threads);
    cli_bench_settle();
    int shown = threads > 0 ? threads : mha_get_num_threads();
    for (int i = 0; i < nS; i++) {
        int rc = run_case(B, H, Hkv, S[i], d, reps, kernel, dtype, json, shown);
        if (rc != CLI_OK)
            return rc;
    }
    return CLI_OK;
}
