/* bench.c - `mha bench`: times the attention kernels and the whole MHA
 * forward, each validated against the reference kernel first.
 *
 * Letter legend: B batch, H query heads, Hkv key/value heads, L query length,
 * S key length, d head dim, E = H*d model width.
 *
 * FLOP convention (docs/performance.md): attention 4*B*H*L*S*d, halved when
 * causal; each projection GEMM 2*M*N*K.  Peak = mha_peak_gflops() with the
 * case's threads, measured once per thread count.  Times are the median of
 * --reps runs after warm-up runs for 0.2 s, the first of which is the one
 * validated.
 * Large cases are validated on a window of query rows (the last rows, which
 * see every key under causal masking) against the reference on that window.
 * --backward times mha_sdpa_backward (op attention_bwd) or
 * mha_multihead_backward (op mha_bwd) beside their forward: backward FLOPs
 * = 2.5 x attention forward FLOPs (FlashAttention's accounting) + 2 x the
 * projections'.  The attention backward is validated with dout zero outside
 * a window of query rows, against the reference backward of that window.
 * --dtype f16|bf16 (op attention only): q, k, v and out of that storage
 * (values rounded once from the float32 fill); the reference kernel on the
 * same half q, k, v writes float32, so the error includes out's rounding.
 */
#include "cli.h"
#include "../src/private_api.h" /* mha_peak_gflops: not in the ABI */

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Work the reference may spend on validation (multiply-adds). */
#define REF_BUDGET 4e8
/* Cases above these FLOP counts skip timing the slow kernels. */
#define REF_TIME_MAX 2e10
#define SCALAR_TIME_MAX 3e11

typedef struct bench_case {
    int64_t B, H, Hkv, L, S, d;
    bool causal;
} bench_case;

typedef struct bench_cfg {
    int threads, reps;
    bool json, mha, backward; /* backward: time the backward beside the forward */
    int kernel; /* -1 all, 0 auto, else mha_kernel */
    mha_dtype dtype; /* --dtype: q, k, v, out of op attention; "dtype" of each line */
} bench_cfg;

/* Whether to time kernel k for this case: the one --kernel names (AUTO:
 * the one AUTO resolves to; all: every kernel this CPU runs), and not the
 * slow ones past their size limits (work in FLOPs; they print why). */
static bool kernel_selected(const bench_cfg *cfg, mha_kernel k, double work, int64_t L) {
    if (cfg->kernel == 0 && k != mha_kernel_resolve(MHA_KERNEL_AUTO))
        return false;
    if (cfg->kernel > 0 && (int)k != cfg->kernel)
        return false;
    if (cfg->kernel == -1 && k >= MHA_KERNEL_AVX2 && k > mha_kernel_resolve(MHA_KERNEL_AUTO))
        return false; /* a SIMD kernel this CPU lacks */
    if ((k == MHA_KERNEL_REF && work > REF_TIME_MAX) ||
        (k == MHA_KERNEL_SCALAR && work > SCALAR_TIME_MAX)) {
        fprintf(stderr, "mha bench: %s skipped at L=%lld (too slow to time)\n",
                mha_kernel_name(k), (long long)L);
        return false;
    }
    return true;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: mha bench [--batch B --heads H [--kv-heads Hkv] --seq L [--kv-seq S]\n"
            "                  --head-dim d] [--causal] [--threads N] [--mha] [--json]\n"
            "                  [--kernel ref|scalar|avx2|avx512|all] [--reps N] [--backward]\n"
            "                  [--dtype f32|f16|bf16]\n"
            "\n"
            "Times scaled dot-product attention (or, with --mha, the whole\n"
            "nn.MultiheadAttention self-attention forward, E = H*d, need_weights off),\n"
            "after validating each kernel against the reference kernel.\n"
            "Without a shape: a default grid (L 128..16384, d 64/128, H 8..16, B 1..8).\n"
            "  --kernel K   default: the fastest kernel of this CPU; all: every one it runs\n"
            "  --reps N     timed runs per case after 0.2 s of warm-up runs, default\n"
            "               5; the median reported (the JSON's ms_min: the fastest)\n"
            "  --json       one JSON object per case and kernel per line\n"
            "  --backward   time the backward beside the forward of the same case and\n"
            "               kernel (ops attention_bwd, with --mha mha_bwd): bwd and fwd\n"
            "               ms, the bwd/fwd ratio, GFLOP/s of the backward counted as\n"
            "               2.5 x the attention forward FLOPs (+ 2 x the projections')\n"
            "  --dtype D    storage of q, k, v and out of the attention forward: f32\n"
            "               (default), f16 or bf16 (not with --mha or --backward); every\n"
            "               line says its \"dtype\"; validated to 2e-3 (f16), 1e-2 (bf16)\n"
            "FLOPs: attention 4*B*H*L*S*d (halved when causal), projections 2*M*N*K.\n"
            "peak_gflops: an FMA-bound loop measured with the case's threads.\n"
            "\nexit status: 0 ok, 2 bad arguments, 1 validation failure or internal error\n");
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double cli_median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static void fill(float *x, size_t n, uint64_t seed, float amp) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = amp * ((float)(s >> 40) * (1.0f / 8388608.0f) - 1.0f);
    }
}

/* max|y - ref| / max(1, max|ref|) over n values (NaN mismatch: inf). */
static double rel_err(const float *y, const float *ref, size_t n) {
    double md = 0.0, mr = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(y[i]) != isnan(ref[i]))
            return INFINITY;
        double dd = fabs((double)y[i] - (double)ref[i]), a = fabs((double)ref[i]);
        md = dd > md ? dd : md;
        mr = a > mr ? a : mr;
    }
    return md / (mr > 1.0 ? mr : 1.0);
}

static double peak_for(int threads) {
    static double cache[256];
    int t = threads > 0 && threads < 256 ? threads : 0;
    if (cache[t] == 0.0)
        cache[t] = mha_peak_gflops(threads, 0.3);
    return cache[t];
}

/* OpenBLAS (the pthreads build Debian ships) starts its worker threads when
 * the library loads, and each spins on sched_yield for about 2^28 cycles
 * (0.1-0.15 s) before it sleeps, after load as after every call.  On a
 * machine with as many cores as OpenMP threads they take a core from the
 * team meanwhile: the first calls of a process ran 1.3-2.5x slower (MHA
 * forward E 512 L 512, attention L 1024; docs/performance.md, "fifth
 * visit").  A benchmark reports the steady state, so it starts after they
 * have parked; the start-up cost of a one-shot process is documented, not
 * hidden. */
void cli_bench_settle(void) {
    static bool settled;
    if (settled)
        return;
    settled = true;
    const struct timespec wait = {0, 250 * 1000 * 1000};
    nanosleep(&wait, NULL);
}

/* Runs fn reps times after the caller's warm-up (one run of first_ms) and
 * more warm-up runs up to WARM_MS in all; returns the median in ms and
 * sets *min_ms to the fastest run (on a shared host the least disturbed:
 * load only ever adds time).  The first calls of a case pay for fresh
 * workspace pages (a page fault per 4 KiB) until malloc reuses its freed
 * blocks: 9 calls with aligned_alloc, 2 since mha_malloc (src/alloc.c;
 * docs/performance.md, "fifth visit").
 * The warm-up is by time, so short cases get many runs and long ones one. */
enum { WARM_MS = 200 };
typedef mha_status (*run_fn)(void *ctx);
static double time_median(run_fn fn, void *ctx, int reps, double first_ms, double *min_ms) {
    *min_ms = NAN;
    if (first_ms > 0 && reps > 3 && first_ms * reps > 4000.0)
        reps = 3; /* long cases: three runs suffice for a median */
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!t)
        return NAN;
    for (double w0 = now_ms(); first_ms + now_ms() - w0 < WARM_MS;)
        fn(ctx);
    for (int r = 0; r < reps; r++) {
        double t0 = now_ms();
        fn(ctx);
        t[r] = now_ms() - t0;
    }
    const double med = cli_median(t, reps);
    *min_ms = t[0]; /* sorted */
    free(t);
    return med;
}

/* One JSON (or text) line per case and kernel.  fwd_ms NaN: a forward op
 * (ms its time); else a backward op (ms the backward's, fwd_ms the
 * forward's of the same case and kernel, and their ratio).  ms_min: the
 * fastest run of the op timed in ms (JSON only).  flops: of the op timed
 * in ms.  bytes > 0 adds GB/s.  err NaN: not validated (null). */
static void emit(const bench_cfg *cfg, const char *op, const char *kernel, const bench_case *c,
                 double ms, double ms_min, double fwd_ms, double flops, double bytes,
                 double err) {
    const bool bwd = !isnan(fwd_ms);
    const double gf = flops / (ms * 1e6), peak = peak_for(cfg->threads);
    int threads = cfg->threads > 0 ? cfg->threads : mha_get_num_threads();
    if (cfg->json) {
        printf("{\"op\":\"%s\",\"kernel\":\"%s\",\"dtype\":\"%s\",\"B\":%lld,\"H\":%lld,\"Hkv\":%lld,\"L\":%lld,"
               "\"S\":%lld,\"d\":%lld,\"causal\":%s,\"threads\":%d,\"ms\":%.4f,\"ms_min\":%.4f",
               op, kernel, cli_dtype_name(cfg->dtype), (long long)c->B, (long long)c->H, (long long)c->Hkv, (long long)c->L,
               (long long)c->S, (long long)c->d, c->causal ? "true" : "false", threads, ms, ms_min);
        if (bwd)
            printf(",\"fwd_ms\":%.4f,\"ratio\":%.3f", fwd_ms, ms / fwd_ms);
        printf(",\"gflops\":%.2f,\"peak_gflops\":%.1f,\"max_err\":", gf, peak);
        if (isnan(err))
            printf("null");
        else
            printf("%.3g", err);
        if (bytes > 0)
            printf(",\"gbps\":%.2f", bytes / (ms * 1e6));
        printf("}\n");
    } else {
        printf(bwd ? "%-13s" : "%-9s", op);
        printf(" %-6s %-4s B=%-2lld H=%-2lld Hkv=%-2lld L=%-5lld S=%-5lld d=%-3lld %-6s t=%d ",
               kernel, cli_dtype_name(cfg->dtype), (long long)c->B, (long long)c->H, (long long)c->Hkv, (long long)c->L,
               (long long)c->S, (long long)c->d, c->causal ? "causal" : "full", threads);
        if (bwd)
            printf("bwd %9.3f ms fwd %9.3f ms ratio %5.2f", ms, fwd_ms, ms / fwd_ms);
        else
            printf("%10.3f ms", ms);
        printf(" %8.1f GFLOP/s %5.1f%% of %.0f  err %.2g\n", gf, 100.0 * gf / peak, peak, err);
    }
    fflush(stdout);
}

/* One op of a case for bench_kernels: how to run, validate, time and emit
 * it with each selected kernel.  Every callback gets ctx. */
typedef struct bench_op {
    const char *op;         /* the JSON "op"                                   */
    const char *who, *what; /* "mha bench: <who>kernel K<what> fails validation" */
    void *ctx;
    mha_kernel *kernel;     /* the options field the runs read                 */
    double work;            /* FLOPs that decide whether a slow kernel is timed */
    double flops, bytes;    /* emit's                                          */
    double tol;             /* the largest error that passes                   */
    run_fn fwd, bwd;        /* the forward, and the backward (NULL: forward op) */
    void (*prepare)(void *ctx);            /* before the first runs, or NULL    */
    double (*error)(void *ctx, bool *checked); /* after them; !checked: none   */
    void (*before_timing)(void *ctx);      /* or NULL                           */
    void (*after)(void *ctx);              /* after the line, or NULL           */
} bench_op;

/* For each selected kernel: one run (the forward, then the backward),
 * validated; then the median of cfg->reps timed runs of each, one line. */
static int bench_kernels(const bench_cfg *cfg, const bench_case *c, const bench_op *op) {
    static const mha_kernel all[4] = {MHA_KERNEL_REF, MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2,
                                      MHA_KERNEL_AVX512};
    int rc = CLI_OK;
    for (int kk = 0; kk < 4; kk++) {
        const mha_kernel k = all[kk];
        if (!kernel_selected(cfg, k, op->work, c->L))
            continue;
        *op->kernel = k;
        if (op->prepare)
            op->prepare(op->ctx);
        double first[2] = {0.0, 0.0};
        for (int b = 0; b < (op->bwd ? 2 : 1); b++) {
            double t0 = now_ms();
            mha_status st = (b ? op->bwd : op->fwd)(op->ctx);
            if (st != MHA_OK)
                return cli_fail("bench", st, mha_kernel_name(k));
            first[b] = now_ms() - t0;
        }
        bool checked = true;
        double err = op->error(op->ctx, &checked);
        if (checked && !(err <= op->tol)) {
            fprintf(stderr, "mha bench: %skernel %s%s fails validation (error %g)\n", op->who,
                    mha_kernel_name(k), op->what, err);
            rc = CLI_INTERNAL;
            continue;
        }
        if (op->before_timing)
            op->before_timing(op->ctx);
        double ms_min, ms = time_median(op->fwd, op->ctx, cfg->reps, first[0], &ms_min);
        double fwd_ms = NAN;
        if (op->bwd)
            fwd_ms = ms, ms = time_median(op->bwd, op->ctx, cfg->reps, first[1], &ms_min);
        emit(cfg, op->op, mha_kernel_name(k), c, ms, ms_min, fwd_ms, op->flops, op->bytes,
             checked ? err : NAN);
        if (op->after)
            op->after(op->ctx);
    }
    return rc;
}

/* ---- attention ---------------------------------------------------------- */

typedef struct attn_ctx {
    mha_tensor q, k, v, o; /* of the --dtype storage */
    mha_tensor of;         /* o as float32 for the error, when o is half  */
    mha_sdpa_options opt;
} attn_ctx;

static mha_status run_attn(void *p) {
    attn_ctx *a = p;
    return mha_sdpa_forward(&a->o, &a->q, &a->k, &a->v, &a->opt);
}

/* Reference output of query rows [i0, L) of every (b,h): ref (B,H,L-i0,d). */
static mha_status reference_window(const bench_case *c, attn_ctx *a, int64_t i0, float *ref) {
    attn_ctx w = *a;
    w.q.data = (char *)a->q.data + i0 * a->q.stride[2] * (int64_t)mha_dtype_size(a->q.dtype);
    w.q.shape[2] = c->L - i0;
    int64_t shape[4] = {c->B, c->H, c->L - i0, c->d};
    mha_tensor_init(&w.o, MHA_F32, ref, 4, shape);
    w.opt.kernel = MHA_KERNEL_REF;
    if (c->causal)
        w.opt.causal = MHA_CAUSAL_OFFSET, w.opt.causal_offset = i0;
    return run_attn(&w);
}

/* Error of a's output rows [i0, L) against ref. */
static double window_err(const bench_case *c, attn_ctx *a, int64_t i0, const float *ref) {
    double worst = 0.0;
    const int64_t rows = c->L - i0;
    const mha_tensor *out = &a->o;
    if (a->o.dtype != MHA_F32) {
        if (mha_tensor_convert(&a->of, &a->o) != MHA_OK)
            return INFINITY;
        out = &a->of;
    }
    for (int64_t bh = 0; bh < c->B * c->H; bh++) {
        const float *o = (const float *)out->data + (bh * c->L + i0) * c->d;
        double e = rel_err(o, ref + bh * rows * c->d, (size_t)(rows * c->d));
        worst = e > worst ? e : worst;
    }
    return worst;
}

/* The forward op's context: a, and the reference of its output rows [i0, L). */
typedef struct attn_window {
    const bench_case *c;
    attn_ctx *a;
    int64_t i0;
    const float *ref;
} attn_window;

static mha_status run_attn_window(void *p) { return run_attn(((attn_window *)p)->a); }

static double attn_window_err(void *p, bool *checked) {
    const attn_window *w = p;
    return window_err(w->c, w->a, w->i0, w->ref);
}

static int bench_attention(const bench_cfg *cfg, const bench_case *c) {
    const char *cmd = "bench";
    int64_t qs[4] = {c->B, c->H, c->L, c->d}, ks[4] = {c->B, c->Hkv, c->S, c->d};
    attn_ctx a;
    memset(&a, 0, sizeof a);
    mha_status st;
    const mha_dtype dt = cfg->dtype;
    if ((st = mha_tensor_create(&a.q, MHA_F32, 4, qs)) != MHA_OK ||
        (st = mha_tensor_create(&a.k, MHA_F32, 4, ks)) != MHA_OK ||
        (st = mha_tensor_create(&a.v, MHA_F32, 4, ks)) != MHA_OK ||
        (st = mha_tensor_create(&a.o, dt, 4, qs)) != MHA_OK ||
        (dt != MHA_F32 && (st = mha_tensor_create(&a.of, MHA_F32, 4, qs)) != MHA_OK)) {
        mha_tensor_free(&a.q), mha_tensor_free(&a.k), mha_tensor_free(&a.v);
        mha_tensor_free(&a.o);
        return cli_fail(cmd, st, "allocating the case");
    }
    fill(a.q.data, (size_t)(c->B * c->H * c->L * c->d), 1, 1.0f);
    fill(a.k.data, (size_t)(c->B * c->Hkv * c->S * c->d), 2, 1.0f);
    fill(a.v.data, (size_t)(c->B * c->Hkv * c->S * c->d), 3, 1.0f);
    if ((st = cli_tensor_to_dtype(&a.q, dt)) != MHA_OK ||
        (st = cli_tensor_to_dtype(&a.k, dt)) != MHA_OK ||
        (st = cli_tensor_to_dtype(&a.v, dt)) != MHA_OK) {
        mha_tensor_free(&a.q), mha_tensor_free(&a.k), mha_tensor_free(&a.v);
        mha_tensor_free(&a.o), mha_tensor_free(&a.of);
        return cli_fail(cmd, st, "converting the case");
    }
    mha_sdpa_options_init(&a.opt);
    a.opt.causal = c->causal ? MHA_CAUSAL_TOP_LEFT : MHA_CAUSAL_NONE;

    const double macs = (double)c->B * c->H * c->L * c->S * c->d;
    const double flops = 4.0 * macs / (c->causal ? 2.0 : 1.0);
    int64_t rows = c->L;
    if (macs > REF_BUDGET) {
        rows = (int64_t)(REF_BUDGET / ((double)c->B * c->H * c->S * c->d));
        rows = rows < 1 ? 1 : rows > c->L ? c->L : rows;
    }
    const int64_t i0 = c->L - rows;
    float *ref = malloc(sizeof(float) * (size_t)(c->B * c->H * rows * c->d));
    int rc = CLI_OK;
    if (!ref) {
        rc = cli_fail(cmd, MHA_ERR_NOMEM, "allocating the reference window");
        goto done;
    }
    if ((st = reference_window(c, &a, i0, ref)) != MHA_OK) {
        rc = cli_fail(cmd, st, "reference");
        goto done;
    }

    attn_window win = {c, &a, i0, ref};
    const double es = (double)mha_dtype_size(dt);
    const double bytes = c->L <= 16 ? es * ((double)c->B * c->Hkv * c->S * c->d * 2 +
                                             2.0 * c->B * c->H * c->L * c->d)
                                    : 0.0;
    /* half: out's own rounding (2^-11, 2^-8 relative) plus P rounded to v's dtype */
    const double tol = dt == MHA_F16 ? 2e-3 : dt == MHA_BF16 ? 1e-2 : 1e-5;
    const bench_op op = {"attention", "", "", &win, &a.opt.kernel, flops, flops, bytes, tol,
                         run_attn_window, NULL, NULL, attn_window_err, NULL, NULL};
    rc = bench_kernels(cfg, c, &op);
done:
    free(ref);
    mha_tensor_free(&a.q), mha_tensor_free(&a.k), mha_tensor_free(&a.v), mha_tensor_free(&a.o);
    mha_tensor_free(&a.of);
    return rc;
}

/* ---- attention backward ------------------------------------------------ */

typedef struct bwd_ctx {
    mha_tensor q, k, v, o, lse, dout, dq, dk, dv;
    mha_sdpa_options opt;
} bwd_ctx;

static mha_status run_fwd_lse(void *p) {
    bwd_ctx *a = p;
    return mha_sdpa_forward(&a->o, &a->q, &a->k, &a->v, &a->opt);
}

static mha_status run_bwd(void *p) {
    bwd_ctx *a = p;
    return mha_sdpa_backward(&a->dq, &a->dk, &a->dv, &a->dout, &a->o, &a->lse, &a->q, &a->k,
                             &a->v, &a->opt);
}

/* Worst error of (dq, dk, dv) of a against r. */
static double grads_err(const bwd_ctx *a, const bwd_ctx *r, const bench_case *c) {
    const size_t nq = (size_t)(c->B * c->H * c->L * c->d);
    const size_t nk = (size_t)(c->B * c->Hkv * c->S * c->d);
    double e[3] = {rel_err(a->dq.data, r->dq.data, nq), rel_err(a->dk.data, r->dk.data, nk),
                   rel_err(a->dv.data, r->dv.data, nk)};
    double w = e[0] > e[1] ? e[0] : e[1];
    return w > e[2] ? w : e[2];
}

static void zero_grads(bwd_ctx *a, const bench_case *c) {
    memset(a->dq.data, 0, sizeof(float) * (size_t)(c->B * c->H * c->L * c->d));
    memset(a->dk.data, 0, sizeof(float) * (size_t)(c->B * c->Hkv * c->S * c->d));
    memset(a->dv.data, 0, sizeof(float) * (size_t)(c->B * c->Hkv * c->S * c->d));
}

/* The backward op's context: a (timed), r (the reference's gradients of the
 * dout window: query rows [i0, L), rows of them). */
typedef struct bwd_bench {
    const bench_case *c;
    bwd_ctx *a, *r;
    int64_t i0, rows;
} bwd_bench;

static mha_status run_bb_fwd(void *p) { return run_fwd_lse(((bwd_bench *)p)->a); }
static mha_status run_bb_bwd(void *p) { return run_bwd(((bwd_bench *)p)->a); }

static void bb_zero(void *p) {
    const bwd_bench *b = p;
    zero_grads(b->a, b->c);
}

static double bb_err(void *p, bool *checked) {
    const bwd_bench *b = p;
    return grads_err(b->a, b->r, b->c);
}

/* dout on every row, for timing. */
static void bb_fill_dout(void *p) {
    const bwd_bench *b = p;
    fill(b->a->dout.data, (size_t)(b->c->B * b->c->H * b->c->L * b->c->d), 9, 1.0f);
}

/* dout zero outside rows [i0, L): the validation window (for the next kernel). */
static void bb_window_dout(void *p) {
    const bwd_bench *b = p;
    const bench_case *c = b->c;
    const size_t ld = (size_t)c->d;
    float *dout = b->a->dout.data;
    for (int64_t bh = 0; bh < c->B * c->H; bh++) {
        memset(dout + (size_t)bh * (size_t)c->L * ld, 0, sizeof(float) * (size_t)b->i0 * ld);
        fill(dout + ((size_t)bh * (size_t)c->L + (size_t)b->i0) * ld, (size_t)b->rows * ld,
             (uint64_t)(10 + bh), 1.0f);
    }
}

/* Validation: dout is zero outside query rows [i0, L), so only those rows
 * contribute to dk/dv and dq; the reference backward of that window (the
 * rows' q, causal offset i0) gives the exact expected dq/dk/dv at a
 * fraction of the full cost.  Then dout is filled everywhere for timing. */
static int bench_attention_bwd(const bench_cfg *cfg, const bench_case *c) {
    const char *cmd = "bench";
    int64_t qs[4] = {c->B, c->H, c->L, c->d}, ks[4] = {c->B, c->Hkv, c->S, c->d};
    int64_t ls[3] = {c->B, c->H, c->L};
    bwd_ctx a, r;
    mha_tensor ro, rlse, rdq, rdk, rdv; /* the reference's outputs */
    memset(&a, 0, sizeof a);
    memset(&ro, 0, sizeof ro), rlse = rdq = rdk = rdv = ro;
    mha_tensor *all[] = {&a.q, &a.k, &a.v, &a.o, &a.lse, &a.dout, &a.dq, &a.dk, &a.dv,
                         &ro, &rlse, &rdq, &rdk, &rdv};
    const int64_t *shapes[] = {qs, ks, ks, qs, ls, qs, qs, ks, ks, qs, ls, qs, ks, ks};
    mha_status st = MHA_OK;
    int rc = CLI_OK;
    for (size_t t = 0; t < sizeof all / sizeof *all && st == MHA_OK; t++)
        st = mha_tensor_create(all[t], MHA_F32, shapes[t] == ls ? 3 : 4, shapes[t]);
    if (st != MHA_OK) {
        rc = cli_fail(cmd, st, "allocating the case");
        goto done;
    }
    fill(a.q.data, (size_t)(c->B * c->H * c->L * c->d), 1, 1.0f);
    fill(a.k.data, (size_t)(c->B * c->Hkv * c->S * c->d), 2, 1.0f);
    fill(a.v.data, (size_t)(c->B * c->Hkv * c->S * c->d), 3, 1.0f);
    mha_sdpa_options_init(&a.opt);
    a.opt.causal = c->causal ? MHA_CAUSAL_TOP_LEFT : MHA_CAUSAL_NONE;
    a.opt.lse = &a.lse;

    const double macs = (double)c->B * c->H * c->L * c->S * c->d;
    const double flops = 4.0 * macs / (c->causal ? 2.0 : 1.0);
    int64_t rows = c->L;
    if (macs > REF_BUDGET / 4) { /* the reference backward does ~4 products in double */
        rows = (int64_t)(REF_BUDGET / 4 / ((double)c->B * c->H * c->S * c->d));
        rows = rows < 1 ? 1 : rows > c->L ? c->L : rows;
    }
    const int64_t i0 = c->L - rows;
    /* the windowed dout and the reference gradients */
    float *dout = a.dout.data;
    const size_t ld = (size_t)c->d;
    bb_window_dout(&(bwd_bench){c, &a, NULL, i0, rows});
    r = a;
    r.o = ro, r.lse = rlse, r.dq = rdq, r.dk = rdk, r.dv = rdv;
    r.opt.kernel = MHA_KERNEL_REF;
    r.opt.lse = &r.lse;
    {
        bwd_ctx w = r; /* query rows [i0, L) of q, dout, o, lse, dq */
        w.q.data = (float *)a.q.data + i0 * ld, w.q.shape[2] = rows;
        w.dout.data = dout + i0 * ld, w.dout.shape[2] = rows;
        w.o.data = (float *)r.o.data + i0 * ld, w.o.shape[2] = rows;
        w.lse.data = (float *)r.lse.data + i0, w.lse.shape[2] = rows;
        w.dq.data = (float *)r.dq.data + i0 * ld, w.dq.shape[2] = rows;
        w.opt.lse = &w.lse;
        if (c->causal)
            w.opt.causal = MHA_CAUSAL_OFFSET, w.opt.causal_offset = i0;
        if ((st = run_fwd_lse(&w)) != MHA_OK || (st = run_bwd(&w)) != MHA_OK) {
            rc = cli_fail(cmd, st, "reference");
            goto done;
        }
    }

    bwd_bench bb = {c, &a, &r, i0, rows};
    const bench_op op = {"attention_bwd", "", " backward", &bb, &a.opt.kernel, 2.5 * flops,
                         2.5 * flops, 0.0, 1e-4, run_bb_fwd, run_bb_bwd, bb_zero, bb_err,
                         bb_fill_dout, bb_window_dout};
    rc = bench_kernels(cfg, c, &op);
done:
    for (size_t t = 0; t < sizeof all / sizeof *all; t++)
        mha_tensor_free(all[t]);
    return rc;
}

/* ---- whole MHA self-attention ------------------------------------------ */

typedef struct mha_ctx {
    mha_tensor x, out, w_in, b_in, w_out, b_out, mask;
    mha_multihead_weights w;
    mha_multihead_options opt;
    const mha_tensor *query;
} mha_ctx;

static mha_status run_mha(void *p) {
    mha_ctx *m = p;
    return mha_multihead_forward(&m->out, m->query, &m->x, &m->x, &m->w, &m->opt);
}

static void mha_case_free(mha_ctx *m) {
    mha_tensor_free(&m->x), mha_tensor_free(&m->w_in), mha_tensor_free(&m->b_in);
    mha_tensor_free(&m->w_out), mha_tensor_free(&m->b_out);
}

/* Case c's self-attention in m: x (B,L,E) and the packed in_proj and
 * out_proj with biases (E = H*d), filled; the options (H heads, c's
 * causality).  m->out and m->mask are the caller's.  On failure nothing of
 * these stays allocated. */
static mha_status mha_case_make(mha_ctx *m, const bench_case *c) {
    const int64_t E = c->H * c->d;
    int64_t xs[3] = {c->B, c->L, E}, wi[2] = {3 * E, E}, bi[1] = {3 * E}, wo[2] = {E, E},
            bo[1] = {E};
    mha_status st;
    if ((st = mha_tensor_create(&m->x, MHA_F32, 3, xs)) != MHA_OK ||
        (st = mha_tensor_create(&m->w_in, MHA_F32, 2, wi)) != MHA_OK ||
        (st = mha_tensor_create(&m->b_in, MHA_F32, 1, bi)) != MHA_OK ||
        (st = mha_tensor_create(&m->w_out, MHA_F32, 2, wo)) != MHA_OK ||
        (st = mha_tensor_create(&m->b_out, MHA_F32, 1, bo)) != MHA_OK) {
        mha_case_free(m);
        return st;
    }
    const float wamp = 1.0f / sqrtf((float)E);
    fill(m->x.data, (size_t)(c->B * c->L * E), 4, 1.0f);
    fill(m->w_in.data, (size_t)(3 * E * E), 5, wamp);
    fill(m->b_in.data, (size_t)(3 * E), 6, 0.1f);
    fill(m->w_out.data, (size_t)(E * E), 7, wamp);
    fill(m->b_out.data, (size_t)E, 8, 0.1f);
    m->w.in_proj_weight = &m->w_in, m->w.in_proj_bias = &m->b_in;
    m->w.out_proj_weight = &m->w_out, m->w.out_proj_bias = &m->b_out;
    mha_multihead_options_init(&m->opt);
    m->opt.num_heads = c->H;
    m->opt.causal = c->causal;
    m->query = &m->x;
    return MHA_OK;
}

/* The forward op's context: m, and the reference rout of its rows [i0, L). */
typedef struct mha_window {
    const bench_case *c;
    mha_ctx *m;
    const mha_tensor *rout;
    int64_t i0, rows;
} mha_window;

static mha_status run_mha_window(void *p) { return run_mha(((mha_window *)p)->m); }

static double mha_window_err(void *p, bool *checked) {
    const mha_window *w = p;
    const int64_t E = w->c->H * w->c->d, L = w->c->L;
    double err = 0.0;
    for (int64_t b = 0; b < w->c->B; b++) {
        double e = rel_err((const float *)w->m->out.data + (b * L + w->i0) * E,
                           (const float *)w->rout->data + b * w->rows * E, (size_t)(w->rows * E));
        err = e > err ? e : err;
    }
    return err;
}

static int bench_mha(const bench_cfg *cfg, const bench_case *c) {
    const char *cmd = "bench";
    const int64_t E = c->H * c->d, L = c->L;
    int64_t xs[3] = {c->B, L, E};
    mha_ctx m;
    memset(&m, 0, sizeof m);
    mha_status st;
    if ((st = mha_tensor_create(&m.out, MHA_F32, 3, xs)) != MHA_OK ||
        (st = mha_case_make(&m, c)) != MHA_OK) {
        mha_tensor_free(&m.out);
        return cli_fail(cmd, st, "allocating the case");
    }

    const double attn = 4.0 * c->B * c->H * (double)L * L * c->d / (c->causal ? 2.0 : 1.0);
    const double flops = attn + 2.0 * c->B * L * 3 * E * E + 2.0 * c->B * L * E * E;
    int rc = CLI_OK;

    /* validation window: query rows [i0, L) against the full keys, with the
     * causal diagonal as an explicit float mask (ref kernel) */
    const double macs = (double)c->B * c->H * L * L * c->d;
    int64_t rows = macs > REF_BUDGET ? (int64_t)(REF_BUDGET / ((double)c->B * c->H * L * c->d))
                                     : L;
    rows = rows < 1 ? 1 : rows > L ? L : rows;
    const int64_t i0 = L - rows;
    mha_ctx r = m;
    mha_tensor qwin = m.x, rout;
    int64_t ws[3] = {c->B, rows, E}, ms2[2] = {rows, L};
    qwin.data = (float *)m.x.data + i0 * E;
    qwin.shape[1] = rows;
    float *mk = NULL;
    if ((st = mha_tensor_create(&rout, MHA_F32, 3, ws)) != MHA_OK) {
        rc = cli_fail(cmd, st, "allocating the reference window");
        goto done;
    }
    if (c->causal) {
        if ((st = mha_tensor_create(&m.mask, MHA_F32, 2, ms2)) != MHA_OK) {
            rc = cli_fail(cmd, st, "allocating the mask");
            goto done2;
        }
        mk = m.mask.data;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < L; j++)
                mk[i * L + j] = j > i0 + i ? -INFINITY : 0.0f;
        r.opt.causal = 0, r.opt.attn_mask = &m.mask;
    }
    r.query = &qwin, r.out = rout, r.opt.kernel = MHA_KERNEL_REF;
    if ((st = run_mha(&r)) != MHA_OK) {
        rc = cli_fail(cmd, st, "reference");
        goto done2;
    }

    mha_window mw = {c, &m, &rout, i0, rows};
    const bench_op op = {"mha", "mha with ", "", &mw, &m.opt.kernel, attn, flops, 0.0, 1e-5,
                         run_mha_window, NULL, NULL, mha_window_err, NULL, NULL};
    rc = bench_kernels(cfg, c, &op);
done2:
    mha_tensor_free(&rout);
done:
    mha_tensor_free(&m.mask), mha_tensor_free(&m.out);
    mha_case_free(&m);
    return rc;
}

/* ---- whole MHA self-attention backward ---------------------------------- */

typedef struct mha_bwd_ctx {
    mha_ctx m;
    void *saved;
    size_t saved_bytes;
    mha_tensor dx, dout, dw_in, db_in, dw_out, db_out;
    mha_multihead_grads g;
} mha_bwd_ctx;

static mha_status run_mha_train(void *p) {
    mha_bwd_ctx *t = p;
    return mha_multihead_forward_train(&t->m.out, t->saved, t->saved_bytes, &t->m.x, &t->m.x,
                                       &t->m.x, &t->m.w, &t->m.opt);
}

static mha_status run_mha_bwd(void *p) {
    mha_bwd_ctx *t = p;
    return mha_multihead_backward(&t->dx, NULL, NULL, &t->g, &t->dout, t->saved,
                                  t->saved_bytes, &t->m.x, &t->m.x, &t->m.x, &t->m.w, &t->m.opt,
                                  NULL, 0);
}

/* All gradients of t, flattened for comparison. */
static double mha_grads_err(const mha_bwd_ctx *t, const mha_bwd_ctx *r) {
    const mha_tensor *a[5] = {&t->dx, &t->dw_in, &t->db_in, &t->dw_out, &t->db_out};
    const mha_tensor *b[5] = {&r->dx, &r->dw_in, &r->db_in, &r->dw_out, &r->db_out};
    double w = 0.0;
    for (int i = 0; i < 5; i++) {
        size_t n = 1;
        for (int x = 0; x < a[i]->ndim; x++)
            n *= (size_t)a[i]->shape[x];
        double e = rel_err(a[i]->data, b[i]->data, n);
        w = e > w ? e : w;
    }
    return w;
}

static void mha_zero_grads(mha_bwd_ctx *t) {
    mha_tensor *a[5] = {&t->dx, &t->dw_in, &t->db_in, &t->dw_out, &t->db_out};
    for (int i = 0; i < 5; i++) {
        size_t n = 1;
        for (int x = 0; x < a[i]->ndim; x++)
            n *= (size_t)a[i]->shape[x];
        memset(a[i]->data, 0, sizeof(float) * n);
    }
}

/* The backward op's context: t[0] timed, t[1] the reference (validate). */
typedef struct mha_bwd_bench {
    const bench_case *c;
    mha_bwd_ctx *t;
    bool validate;
} mha_bwd_bench;

static mha_status run_mb_train(void *p) { return run_mha_train(((mha_bwd_bench *)p)->t); }
static mha_status run_mb_bwd(void *p) { return run_mha_bwd(((mha_bwd_bench *)p)->t); }
static void mb_zero(void *p) { mha_zero_grads(((mha_bwd_bench *)p)->t); }

static double mb_err(void *p, bool *checked) {
    const mha_bwd_bench *b = p;
    if ((*checked = b->validate))
        return mha_grads_err(&b->t[0], &b->t[1]);
    fprintf(stderr, "mha bench: mha_bwd L=%lld not validated (reference too slow; "
                    "--backward without --mha validates the attention part)\n",
            (long long)b->c->L);
    return NAN;
}

/* mha_multihead_forward_train vs mha_multihead_backward (packed in_proj,
 * biases, self-attention).  Validated against the REF kernel's backward of
 * the same case when the reference fits REF_BUDGET; larger cases are not
 * validated here (the attention part is: `--backward` without --mha). */
static int bench_mha_bwd(const bench_cfg *cfg, const bench_case *c) {
    const char *cmd = "bench";
    const int64_t E = c->H * c->d, L = c->L;
    int64_t xs[3] = {c->B, L, E}, wi[2] = {3 * E, E}, bi[1] = {3 * E}, wo[2] = {E, E},
            bo[1] = {E};
    mha_bwd_ctx t[2]; /* t[0] timed, t[1] reference */
    memset(t, 0, sizeof t);
    mha_ctx *m = &t[0].m;
    mha_status st = MHA_OK;
    int rc = CLI_OK;
    const bool validate = (double)c->B * c->H * L * L * c->d <= REF_BUDGET;
    for (int u = 0; u < (validate ? 2 : 1) && st == MHA_OK; u++) {
        mha_tensor *all[] = {&t[u].dx, &t[u].dout, &t[u].dw_in, &t[u].db_in, &t[u].dw_out,
                             &t[u].db_out, &t[u].m.out};
        const int64_t *sh[] = {xs, xs, wi, bi, wo, bo, xs};
        const int nd[] = {3, 3, 2, 1, 2, 1, 3};
        for (int i = 0; i < 7 && st == MHA_OK; i++)
            st = mha_tensor_create(all[i], MHA_F32, nd[i], sh[i]);
        if (st == MHA_OK)
            st = mha_multihead_saved_size(c->B, L, L, E, c->H, 0, 0, &t[u].saved_bytes);
        if (st == MHA_OK && !(t[u].saved = malloc(t[u].saved_bytes)))
            st = MHA_ERR_NOMEM;
    }
    if (st != MHA_OK || (st = mha_case_make(m, c)) != MHA_OK) {
        rc = cli_fail(cmd, st, "allocating the case");
        goto done;
    }
    for (int u = 0; u < 2; u++) {
        t[u].g.in_proj_weight = &t[u].dw_in, t[u].g.in_proj_bias = &t[u].db_in;
        t[u].g.out_proj_weight = &t[u].dw_out, t[u].g.out_proj_bias = &t[u].db_out;
    }
    fill(t[0].dout.data, (size_t)(c->B * L * E), 9, 1.0f);
    if (validate) {
        mha_tensor keep_out = t[1].m.out, keep_dout = t[1].dout;
        t[1].m = *m, t[1].m.out = keep_out, t[1].m.opt.kernel = MHA_KERNEL_REF;
        memcpy(keep_dout.data, t[0].dout.data, sizeof(float) * (size_t)(c->B * L * E));
        if ((st = run_mha_train(&t[1])) != MHA_OK || (st = run_mha_bwd(&t[1])) != MHA_OK) {
            rc = cli_fail(cmd, st, "reference");
            goto done;
        }
    }
    const double attn = 4.0 * c->B * c->H * (double)L * L * c->d / (c->causal ? 2.0 : 1.0);
    const double proj = 2.0 * c->B * L * 3 * E * E + 2.0 * c->B * L * E * E;
    mha_bwd_bench mb = {c, t, validate};
    const bench_op op = {"mha_bwd", "mha backward with ", "", &mb, &m->opt.kernel, 2.5 * attn,
                         2.5 * attn + 2.0 * proj, 0.0, 1e-4, run_mb_train, run_mb_bwd, mb_zero,
                         mb_err, NULL, NULL};
    rc = bench_kernels(cfg, c, &op);
done:
    for (int u = 0; u < 2; u++) {
        mha_tensor *all[] = {&t[u].dx, &t[u].dout, &t[u].dw_in, &t[u].db_in, &t[u].dw_out,
                             &t[u].db_out, &t[u].m.out};
        for (int i = 0; i < 7; i++)
            mha_tensor_free(all[i]);
        free(t[u].saved);
    }
    mha_case_free(m);
    return rc;
}

/* ---- arguments and the default grid ------------------------------------- */

static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    return cli_parse_i64(s, lo, hi, out);
}

static int bench_one(const bench_cfg *cfg, const bench_case *c) {
    if (cfg->backward)
        return cfg->mha ? bench_mha_bwd(cfg, c) : bench_attention_bwd(cfg, c);
    return cfg->mha ? bench_mha(cfg, c) : bench_attention(cfg, c);
}

int cli_bench(int argc, char **argv) {
    bench_cfg cfg = {.threads = 0, .reps = 5, .json = false, .mha = false, .kernel = 0,
                     .backward = false, .dtype = MHA_F32};
    bench_case one = {1, 8, 0, 1024, 0, 64, false};
    bool shaped = false;
    for (int i = 1; i < argc; i++) /* op "decode": cli/bench_decode.c */
        if (!strcmp(argv[i], "--decode"))
            return cli_bench_decode(argc, argv);
    static const char *int_opts[] = {"--batch", "--heads", "--kv-heads", "--seq",
                                     "--kv-seq", "--head-dim", "--threads", "--reps"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return CLI_OK;
        }
        if (!strcmp(a, "--causal")) {
            one.causal = true;
            continue;
        }
        if (!strcmp(a, "--backward")) {
            cfg.backward = true;
            continue;
        }
        if (!strcmp(a, "--json") || !strcmp(a, "--mha")) {
            *(a[2] == 'j' ? &cfg.json : &cfg.mha) = true;
            continue;
        }
        if (!strcmp(a, "--dtype")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "mha bench: --dtype needs a value (%s)\n", CLI_DTYPES);
                return CLI_BAD_INPUT;
            }
            if (cli_dtype_option("bench", a, argv[++i], &cfg.dtype) != CLI_OK)
                return CLI_BAD_INPUT;
            continue;
        }
        if (!strcmp(a, "--kernel")) {
            const char *k = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(k, "all"))
                cfg.kernel = -1;
            else if ((cfg.kernel = cli_kernel_named(k)) <= 0) {
                fprintf(stderr,
                        "mha bench: --kernel: '%s' is not ref, scalar, avx2, avx512 or all\n", k);
                return CLI_BAD_INPUT;
            }
            continue;
        }
        size_t o = 0;
        while (o < sizeof int_opts / sizeof *int_opts && strcmp(a, int_opts[o]))
            o++;
        if (o == sizeof int_opts / sizeof *int_opts) {
            fprintf(stderr, "mha bench: unknown option '%s' (see mha bench --help)\n", a);
            return CLI_BAD_INPUT;
        }
        int64_t v;
        if (i + 1 >= argc || !parse_int(argv[i + 1], 1,
                                        o == 6 ? 1024 : (int64_t)1 << 30, &v)) {
            fprintf(stderr, "mha bench: %s needs a positive integer%s\n", a,
                    i + 1 < argc ? "" : " (missing)");
            return CLI_BAD_INPUT;
        }
        i++;
        switch (o) {
        case 0: one.B = v, shaped = true; break;
        case 1: one.H = v, shaped = true; break;
        case 2: one.Hkv = v, shaped = true; break;
        case 3: one.L = v, shaped = true; break;
        case 4: one.S = v, shaped = true; break;
        case 5: one.d = v, shaped = true; break;
        case 6: cfg.threads = (int)v; break;
        default: cfg.reps = (int)v; break;
        }
    }
    if (one.Hkv == 0)
        one.Hkv = one.H;
    if (one.S == 0)
        one.S = one.L;
    if (one.H % one.Hkv) {
        fprintf(stderr, "mha bench: --kv-heads %lld does not divide --heads %lld\n",
                (long long)one.Hkv, (long long)one.H);
        return CLI_BAD_INPUT;
    }
    if (cfg.mha && (one.Hkv != one.H || one.S != one.L)) {
        fprintf(stderr, "mha bench: --mha is self-attention: no --kv-heads or --kv-seq\n");
        return CLI_BAD_INPUT;
    }
    if (cfg.dtype != MHA_F32 && (cfg.mha || cfg.backward)) {
        fprintf(stderr, "mha bench: --dtype %s times the attention forward only (not with "
                        "--mha or --backward)\n", cli_dtype_name(cfg.dtype));
        return CLI_BAD_INPUT;
    }
    if (cfg.threads > 0)
        mha_set_num_threads(cfg.threads);
    cli_bench_settle();
    if (!cfg.json)
        printf("# peak %.1f GFLOP/s (FMA loop, %d threads); kernel auto = %s\n",
               peak_for(cfg.threads), mha_get_num_threads(),
               mha_kernel_name(mha_kernel_resolve(MHA_KERNEL_AUTO)));

    int rc = CLI_OK;
    if (shaped) {
        rc = bench_one(&cfg, &one);
        return rc;
    }
    /* default grid: B, H, L, d; each non-causal and causal; a few minutes */
    static const int64_t grid[][4] = {
        {8, 8, 128, 64},   {8, 16, 128, 128}, {4, 8, 512, 64},   {4, 16, 512, 128},
        {2, 8, 1024, 64},  {1, 16, 1024, 128}, {1, 8, 2048, 64},  {1, 8, 2048, 128},
        {1, 8, 4096, 64},  {1, 8, 4096, 128}, {1, 8, 16384, 64},
    };
    for (size_t g = 0; g < sizeof grid / sizeof *grid; g++)
        for (int causal = 0; causal < 2; causal++) {
            bench_case c = {grid[g][0], grid[g][1], grid[g][1], grid[g][2], grid[g][2],
                            grid[g][3], causal != 0};
            int r = bench_one(&cfg, &c);
            if (r != CLI_OK)
                rc = r;
        }
    return rc;
}
