/* ring.c - `mpirun -np P mha ring`: ring attention across MPI ranks
 * (include/mha_mpi.h), validated against a single-process run on rank 0,
 * then timed.  Rank 0 prints one line per case (--json: one JSON object).
 *
 * Inputs: row i of tensor t, batch b, head h of the global sequence is
 * mha_randn over its own seed (t, b, h, i), so every rank makes its own
 * rows and rank 0 the whole tensors.  Timing: per repetition the slowest
 * rank's wall time, median over --reps.  comm_hidden = 1 - (time blocked in
 * MPI_Wait) / (the same hops timed alone with MPI_Sendrecv, no compute),
 * clamped to [0, 1]; the wait also holds any load imbalance (a causal
 * contiguous ring waits for its last rank), so it is a lower bound.
 * cpu_ms: the busiest rank's process CPU time per call (median), which a
 * shared machine's load does not inflate.
 *
 * Letter legend: B batch, H heads, Hkv kv heads, L global rows, n local rows,
 * d head dim.
 */
#include "cli.h"
#include "mha_mpi.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct ring_args {
    int64_t B, L, H, Hkv, d, threads, reps;
    int causal, backward, json, validate;
    mha_ring_layout layout;
} ring_args;

static int P, rank;

static void usage(FILE *f) {
    fprintf(f, "usage: mpirun -np P mha ring [--batch B] [--seq L] [--heads H] [--kv-heads Hkv]\n"
               "         [--head-dim d] [--causal] [--layout contiguous|zigzag] [--backward]\n"
               "         [--threads N] [--reps N] [--no-validate] [--json]\n"
               "  sequence-parallel ring attention over the ranks; validated against a\n"
               "  single-process run on rank 0 (max_err; exit 1 when over 1e-4), then timed.\n");
}

static int parse_count(const char *flag, const char *v, int64_t lo, int64_t *out) {
    int64_t x;
    if (!cli_parse_i64(v, lo, (int64_t)1 << 40, &x)) {
        if (rank == 0)
            fprintf(stderr, "mha ring: %s: want an integer >= %lld, got '%s'\n", flag,
                    (long long)lo, v ? v : "");
        return CLI_BAD_INPUT;
    }
    *out = x;
    return CLI_OK;
}

static int parse(int argc, char **argv, ring_args *a) {
    *a = (ring_args){1, 4096, 8, 0, 64, 1, 3, 0, 0, 0, 1, MHA_RING_CONTIGUOUS};
    static const struct {
        const char *flag;
        size_t field;
        int64_t lo;
    } counts[] = {{"--batch", offsetof(ring_args, B), 1},    {"--seq", offsetof(ring_args, L), 1},
                  {"--heads", offsetof(ring_args, H), 1},    {"--kv-heads", offsetof(ring_args, Hkv), 1},
                  {"--head-dim", offsetof(ring_args, d), 1}, {"--threads", offsetof(ring_args, threads), 1},
                  {"--reps", offsetof(ring_args, reps), 1}};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        size_t c = 0;
        for (; c < sizeof counts / sizeof *counts; c++)
            if (!strcmp(f, counts[c].flag))
                break;
        if (c < sizeof counts / sizeof *counts) {
            int rc = parse_count(f, i + 1 < argc ? argv[++i] : NULL, counts[c].lo,
                                 (int64_t *)((char *)a + counts[c].field));
            if (rc)
                return rc;
        } else if (!strcmp(f, "--causal")) {
            a->causal = 1;
        } else if (!strcmp(f, "--backward")) {
            a->backward = 1;
        } else if (!strcmp(f, "--json")) {
            a->json = 1;
        } else if (!strcmp(f, "--no-validate")) {
            a->validate = 0;
        } else if (!strcmp(f, "--layout") && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "contiguous") && strcmp(v, "zigzag")) {
                if (rank == 0)
                    fprintf(stderr, "mha ring: --layout: want contiguous or zigzag, got '%s'\n", v);
                return CLI_BAD_INPUT;
            }
            a->layout = strcmp(v, "zigzag") ? MHA_RING_CONTIGUOUS : MHA_RING_ZIGZAG;
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            if (rank == 0)
                usage(stdout);
            return -1;
        } else {
            if (rank == 0) {
                fprintf(stderr, "mha ring: unknown or incomplete option '%s'\n", f);
                usage(stderr);
            }
            return CLI_BAD_INPUT;
        }
    }
    if (!a->Hkv)
        a->Hkv = a->H;
    const int64_t chunks = a->layout == MHA_RING_ZIGZAG ? 2 * (int64_t)P : P;
    if (a->H % a->Hkv || a->L % chunks) {
        if (rank == 0)
            fprintf(stderr, "mha ring: --kv-heads %lld must divide --heads %lld, and --seq %lld "
                            "split into %lld equal %s\n", (long long)a->Hkv, (long long)a->H,
                    (long long)a->L, (long long)chunks,
                    a->layout == MHA_RING_ZIGZAG ? "chunks (2P)" : "shards (P)");
        return CLI_BAD_INPUT;
    }
    return CLI_OK;
}

/* ---- inputs and the layout -------------------------------------------- */

static int64_t global_row(const ring_args *a, int r, int64_t i) {
    const int64_t n = a->L / P;
    if (a->layout == MHA_RING_CONTIGUOUS)
        return r * n + i;
    const int64_t c = n / 2;
    return i < c ? r * c + i : (2 * (int64_t)P - 1 - r) * c + (i - c);
}

/* Rows of tensor `which` (B,Hh,rows,x) for rank r (r < 0: the whole sequence). */
static float *make_rows(const ring_args *a, int which, int64_t Hh, int64_t x, int r) {
    const int64_t n = r < 0 ? a->L : a->L / P;
    float *t = malloc(sizeof(float) * (size_t)(a->B * Hh * n * x) + 1);
    for (int64_t b = 0; t && b < a->B; b++)
        for (int64_t h = 0; h < Hh; h++)
            for (int64_t i = 0; i < n; i++) {
                const int64_t g = r < 0 ? i : global_row(a, r, i);
                const uint64_t seed = ((((uint64_t)which * 131 + (uint64_t)b) * 8191 + (uint64_t)h) << 32) ^
                                      (uint64_t)g;
                mha_randn(t + ((b * Hh + h) * n + i) * x, x, seed, 1.0f);
            }
    return t;
}

static mha_tensor view(float *p, int64_t B, int64_t Hh, int64_t n, int64_t x) {
    mha_tensor t;
    if (x)
        mha_tensor_init(&t, MHA_F32, p, 4, (int64_t[]){B, Hh, n, x});
    else
        mha_tensor_init(&t, MHA_F32, p, 3, (int64_t[]){B, Hh, n});
    return t;
}

/* Rank 0: max |gathered local rows - full| / max |full| over the ranks' shards. */
static double gather_err(const ring_args *a, const float *mine, const float *full, int64_t Hh,
                         int64_t x) {
    const int64_t n = a->L / P, cnt = a->B * Hh * n * x;
    if (rank != 0) {
        MPI_Send(mine, (int)cnt, MPI_FLOAT, 0, 7, MPI_COMM_WORLD);
        return 0.0;
    }
    float *buf = malloc(sizeof(float) * (size_t)cnt + 1);
    double err = 0.0, scale = 0.0;
    for (int64_t i = 0; i < a->B * Hh * a->L * x; i++)
        scale = fabs(full[i]) > scale ? fabs(full[i]) : scale;
    for (int r = 0; r < P && buf; r++) {
        if (r)
            MPI_Recv(buf, (int)cnt, MPI_FLOAT, r, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        const float *src = r ? buf : mine;
        for (int64_t bh = 0; bh < a->B * Hh; bh++)
            for (int64_t i = 0; i < n; i++)
                for (int64_t c = 0; c < x; c++) {
                    double e = fabs((double)src[(bh * n + i) * x + c] -
                                    (double)full[(bh * a->L + global_row(a, r, i)) * x + c]);
                    err = isnan(e) ? INFINITY : e > err ? e : err;
                }
    }
    const double rel = buf ? err / (scale > 0 ? scale : 1.0) : INFINITY;
    free(buf);
    return rel;
}

/* ---- timing ------------------------------------------------------------- */

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The slowest rank's value. */
static double slowest(double x) {
    double m = 0;
    MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

/* Seconds of the ring's hops alone: P-1 K/V hops (plus P dK/dV hops for the
 * backward) of one shard through MPI_Sendrecv, no compute. */
static double comm_alone(const ring_args *a, int backward) {
    if (P == 1)
        return 0.0;
    const int64_t n = a->L / P, cnt = a->B * a->Hkv * n * 2 * a->d;
    float *s = calloc((size_t)cnt + 1, sizeof(float)), *r = calloc((size_t)cnt + 1, sizeof(float));
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int h = 0; h < (P - 1) + (backward ? P : 0); h++)
        MPI_Sendrecv(s, (int)cnt, MPI_FLOAT, (rank + 1) % P, 9, r, (int)cnt, MPI_FLOAT,
                     (rank + P - 1) % P, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    const double t = slowest(MPI_Wtime() - t0);
    free(s);
    free(r);
    return t;
}

/* CPU seconds of this process (all its threads): a load-independent measure. */
static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void print_case(const ring_args *a, const char *op, double ms, double cpu_ms, double max_err,
                       const mha_ring_stats *st, double comm_s, double wait_s) {
    int64_t bytes = 0, mine = st->bytes_sent;
    MPI_Allreduce(&mine, &bytes, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    double hidden = comm_s > 0 ? 1.0 - wait_s / comm_s : 1.0;
    hidden = hidden < 0 ? 0 : hidden > 1 ? 1 : hidden;
    if (rank != 0)
        return;
    const char *layout = a->layout == MHA_RING_ZIGZAG ? "zigzag" : "contiguous";
    char err[32];
    if (a->validate)
        snprintf(err, sizeof err, "%.3g", max_err);
    else
        snprintf(err, sizeof err, "null");
    if (a->json)
        printf("{\"op\":\"%s\",\"P\":%d,\"B\":%lld,\"H\":%lld,\"Hkv\":%lld,\"L\":%lld,\"d\":%lld,"
               "\"causal\":%s,\"layout\":\"%s\",\"threads\":%lld,\"ms\":%.3f,\"max_err\":%s,"
               "\"bytes_sent\":%lld,\"comm_hidden\":%.3f,\"comm_alone_ms\":%.3f,\"wait_ms\":%.3f,"
               "\"cpu_ms\":%.3f}\n",
               op, P, (long long)a->B, (long long)a->H, (long long)a->Hkv, (long long)a->L,
               (long long)a->d, a->causal ? "true" : "false", layout, (long long)a->threads, ms,
               err, (long long)bytes, hidden, comm_s * 1e3, wait_s * 1e3, cpu_ms);
    else
        printf("%s P=%d B=%lld H=%lld Hkv=%lld L=%lld d=%lld causal=%d layout=%s threads=%lld  "
               "%.3f ms  max_err %s  bytes_sent %lld  comm_hidden %.3f\n",
               op, P, (long long)a->B, (long long)a->H, (long long)a->Hkv, (long long)a->L,
               (long long)a->d, a->causal, layout, (long long)a->threads, ms, err,
               (long long)bytes, hidden);
    fflush(stdout);
}

/* ---- the command --------------------------------------------------------- */

static int run(const ring_args *a) {
    const int64_t B = a->B, H = a->H, Hkv = a->Hkv, d = a->d, n = a->L / P;
    mha_set_num_threads((int)a->threads);
    float *q = make_rows(a, 0, H, d, rank), *k = make_rows(a, 1, Hkv, d, rank);
    float *v = make_rows(a, 2, Hkv, d, rank);
    /* the backward's buffers only when timed (per-rank memory of a forward) */
    float *dout = a->backward ? make_rows(a, 3, H, d, rank) : calloc(1, sizeof(float));
    float *o = calloc((size_t)(B * H * n * d) + 1, sizeof(float));
    float *l = calloc((size_t)(B * H * n) + 1, sizeof(float));
    const int64_t g = a->backward ? 1 : 0;
    float *dq = calloc((size_t)(g * B * H * n * d) + 1, sizeof(float));
    float *dk = calloc((size_t)(g * B * Hkv * n * d) + 1, sizeof(float));
    float *dv = calloc((size_t)(g * B * Hkv * n * d) + 1, sizeof(float));
    int rc = CLI_OK;
    if (!q || !k || !v || !dout || !o || !l || !dq || !dk || !dv) {
        fprintf(stderr, "mha ring: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, CLI_INTERNAL);
    }
    mha_tensor Q = view(q, B, H, n, d), K = view(k, B, Hkv, n, d), V = view(v, B, Hkv, n, d);
    mha_tensor O = view(o, B, H, n, d), Lse = view(l, B, H, n, 0), dO = view(dout, B, H, n, d);
    mha_tensor dQ = view(dq, B, H, n, d), dK = view(dk, B, Hkv, n, d), dV = view(dv, B, Hkv, n, d);
    mha_ring_stats stats;
    mha_ring_options opt;
    mha_ring_options_init(&opt);
    opt.layout = a->layout;
    opt.sdpa.causal = a->causal ? MHA_CAUSAL_TOP_LEFT : MHA_CAUSAL_NONE;
    opt.stats = &stats;

    /* validation: one ring call against the single process on rank 0 (the
     * backward's timing needs the forward's out and lse anyway) */
    mha_status st = MHA_OK;
    if (a->validate || a->backward)
        st = mha_ring_attention_forward(MPI_COMM_WORLD, &O, &Lse, &Q, &K, &V, &opt);
    if (st == MHA_OK && a->validate && a->backward)
        st = mha_ring_attention_backward(MPI_COMM_WORLD, &dQ, &dK, &dV, &dO, &O, &Lse, &Q, &K, &V,
                                         &opt);
    if (st != MHA_OK)
        return rank == 0 ? cli_fail("ring", st, NULL) : CLI_BAD_INPUT;
    double err_f = 0.0, err_b = 0.0;
    if (a->validate) {
        float *fq = NULL, *fk = NULL, *fv = NULL, *fdo = NULL, *fo = NULL, *fl = NULL;
        float *fdq = NULL, *fdk = NULL, *fdv = NULL;
        int ok = 1;
        if (rank == 0) {
            const int64_t L = a->L;
            fq = make_rows(a, 0, H, d, -1), fk = make_rows(a, 1, Hkv, d, -1);
            fv = make_rows(a, 2, Hkv, d, -1), fdo = make_rows(a, 3, H, d, -1);
            fo = calloc((size_t)(B * H * L * d) + 1, sizeof(float));
            fl = calloc((size_t)(B * H * L) + 1, sizeof(float));
            fdq = calloc((size_t)(B * H * L * d) + 1, sizeof(float));
            fdk = calloc((size_t)(B * Hkv * L * d) + 1, sizeof(float));
            fdv = calloc((size_t)(B * Hkv * L * d) + 1, sizeof(float));
            ok = fq && fk && fv && fdo && fo && fl && fdq && fdk && fdv;
            if (ok) {
                mha_tensor FQ = view(fq, B, H, L, d), FK = view(fk, B, Hkv, L, d);
                mha_tensor FV = view(fv, B, Hkv, L, d), FO = view(fo, B, H, L, d);
                mha_tensor FL = view(fl, B, H, L, 0), FdO = view(fdo, B, H, L, d);
                mha_tensor FdQ = view(fdq, B, H, L, d), FdK = view(fdk, B, Hkv, L, d);
                mha_tensor FdV = view(fdv, B, Hkv, L, d);
                mha_sdpa_options so = opt.sdpa;
                so.lse = &FL;
                ok = mha_sdpa_forward(&FO, &FQ, &FK, &FV, &so) == MHA_OK;
                so.lse = NULL;
                if (ok && a->backward)
                    ok = mha_sdpa_backward(&FdQ, &FdK, &FdV, &FdO, &FO, &FL, &FQ, &FK, &FV, &so) ==
                         MHA_OK;
            }
            if (!ok)
                fprintf(stderr, "mha ring: rank 0: the single-process run failed: %s\n",
                        mha_last_error());
        }
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (ok) {
            err_f = gather_err(a, o, fo, H, d);
            if (a->backward) {
                double e[3] = {gather_err(a, dq, fdq, H, d), gather_err(a, dk, fdk, Hkv, d),
                               gather_err(a, dv, fdv, Hkv, d)};
                err_b = fmax(e[0], fmax(e[1], e[2]));
            }
        } else {
            rc = CLI_INTERNAL;
        }
        free(fq), free(fk), free(fv), free(fdo), free(fo), free(fl), free(fdq), free(fdk),
            free(fdv);
        MPI_Bcast(&err_f, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        MPI_Bcast(&err_b, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        if (!(err_f <= 1e-4) || !(err_b <= 1e-4)) {
            if (rank == 0)
                fprintf(stderr, "mha ring: validation failed: max_err forward %.3g backward %.3g\n",
                        err_f, err_b);
            rc = CLI_INTERNAL;
        }
    }

    /* timing */
    for (int pass = 0; pass < 1 + a->backward && rc == CLI_OK; pass++) {
        double *ms = malloc(sizeof(double) * (size_t)a->reps), *wait = malloc(sizeof(double) * (size_t)a->reps);
        double *cpu = malloc(sizeof(double) * (size_t)a->reps);
        for (int64_t r = 0; r < a->reps && st == MHA_OK; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = MPI_Wtime(), c0 = cpu_seconds();
            st = pass == 0 ? mha_ring_attention_forward(MPI_COMM_WORLD, &O, &Lse, &Q, &K, &V, &opt)
                           : mha_ring_attention_backward(MPI_COMM_WORLD, &dQ, &dK, &dV, &dO, &O,
                                                         &Lse, &Q, &K, &V, &opt);
            ms[r] = slowest(MPI_Wtime() - t0) * 1e3;
            cpu[r] = slowest(cpu_seconds() - c0) * 1e3;
            wait[r] = slowest(stats.wait_seconds);
        }
        if (st != MHA_OK) {
            rc = rank == 0 ? cli_fail("ring", st, NULL) : CLI_BAD_INPUT;
        } else {
            qsort(ms, (size_t)a->reps, sizeof *ms, cmp_double);
            qsort(wait, (size_t)a->reps, sizeof *wait, cmp_double);
            qsort(cpu, (size_t)a->reps, sizeof *cpu, cmp_double);
            print_case(a, pass ? "ring_attention_bwd" : "ring_attention", ms[a->reps / 2], cpu[a->reps / 2],
                       pass ? err_b : err_f, &stats, comm_alone(a, pass), wait[a->reps / 2]);
        }
        free(ms);
        free(wait);
        free(cpu);
    }
    free(q), free(k), free(v), free(dout), free(o), free(l), free(dq), free(dk), free(dv);
    return rc;
}

int cli_ring(int argc, char **argv) {
    int provided = 0, inited = 0;
    MPI_Initialized(&inited);
    if (!inited)
        MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    ring_args a;
    int rc = parse(argc, argv, &a);
    if (rc == CLI_OK)
        rc = run(&a);
    /* the same exit code on every rank */
    int worst = rc < 0 ? 0 : rc;
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return worst;
}
