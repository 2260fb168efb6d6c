/* test_ring.c - ring attention (include/mha_mpi.h) under mpirun, against the
 * single-process mha_sdpa_forward / mha_sdpa_backward on the gathered
 * tensors.  Run by tests/cli/test_mpi.sh with P = 1, 2, 3, 4 ranks:
 *
 *   mpirun -np P build/mha-mpi-tests [filter]
 *
 * Every rank builds the same global tensors from fixed seeds, takes its own
 * rows (the layout's map of global rows to ranks), runs the collective
 * call, and compares its rows with the single-process result; the worst
 * error of any rank is agreed by MPI_Allreduce.  Tolerances: forward <= 1e-6
 * and gradients <= 1e-5, relative to the tensor's largest magnitude.
 * Rank 0 prints one line per check and "N passed, N failed".
 *
 * The sequence-parallel encoder layer is compared with
 * mha_encoder_layer_forward on the whole sequence (<= 1e-5).
 *
 * Letter legend: B batch, H heads, Hkv kv heads, L global rows, n local
 * rows, d head dim, dv value head dim.
 */
#include "mha_mpi.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* src/internal.h's test hook: library allocations not yet freed (the
 * ASan build cannot leak-check under Open MPI, whose own allocations at
 * exit it would report; this checks ours instead). */
int64_t mha_test_live_allocs(void);

static int P, rank, passed, failed;
static const char *filter;

static void report(const char *name, int ok_here, const char *detail) {
    int ok = 0;
    MPI_Allreduce(&ok_here, &ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("%s P=%d %s%s%s\n", ok ? "ok" : "FAIL", P, name, detail ? ": " : "",
               detail ? detail : "");
        fflush(stdout);
    }
    ok ? passed++ : failed++;
}

/* ---- the layouts' map of rows ------------------------------------------- */

typedef struct layout {
    mha_ring_layout kind;
    int64_t rows[16]; /* per rank */
    int64_t L;
} layout;

/* Contiguous shards of the given per-rank sizes (rows_of(r)), or zigzag
 * chunks of c rows. */
static layout make_layout(mha_ring_layout kind, int64_t chunk, int uneven) {
    layout y = {kind, {0}, 0};
    for (int r = 0; r < P; r++) {
        y.rows[r] = kind == MHA_RING_ZIGZAG ? 2 * chunk : uneven ? 1 + (3 * r + 2) % 5 : chunk;
        y.L += y.rows[r];
    }
    return y;
}

static int64_t global_row(const layout *y, int r, int64_t i) {
    if (y->kind == MHA_RING_ZIGZAG) {
        const int64_t c = y->rows[r] / 2;
        return i < c ? r * c + i : (2 * (int64_t)P - 1 - r) * c + (i - c);
    }
    int64_t o = 0;
    for (int j = 0; j < r; j++)
        o += y->rows[j];
    return o + i;
}

/* A (B,Hh,L,x) global tensor from a seed, and this rank's rows of it. */
typedef struct pair {
    float *full, *mine;
    mha_tensor F, M;
} pair;

static void pair_make(pair *p, const layout *y, int64_t B, int64_t Hh, int64_t x, uint64_t seed,
                      int fill) {
    const int64_t n = y->rows[rank];
    const size_t nf = (size_t)(B * Hh * y->L * x), nm = (size_t)(B * Hh * n * x);
    p->full = calloc(nf ? nf : 1, sizeof(float));
    p->mine = calloc(nm ? nm : 1, sizeof(float));
    if (fill)
        mha_randn(p->full, nf, seed, 1.0f);
    if (x > 0) {
        mha_tensor_init(&p->F, MHA_F32, p->full, 4, (int64_t[]){B, Hh, y->L, x});
        mha_tensor_init(&p->M, MHA_F32, p->mine, 4, (int64_t[]){B, Hh, n, x});
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hh; h++)
            for (int64_t i = 0; i < n; i++)
                memcpy(p->mine + ((b * Hh + h) * n + i) * x,
                       p->full + ((b * Hh + h) * y->L + global_row(y, rank, i)) * x,
                       sizeof(float) * (size_t)x);
}

static void pair_free(pair *p) {
    free(p->full);
    free(p->mine);
}

/* max |mine - full's rows| over every rank / max |full| (x = 0: (B,Hh,L)). */
static double rel_err(const float *mine, const float *full, const layout *y, int64_t B,
                      int64_t Hh, int64_t x) {
    const int64_t n = y->rows[rank], X = x > 0 ? x : 1;
    double err = 0.0, scale = 0.0, all_err = 0.0;
    for (int64_t i = 0; i < B * Hh * y->L * X; i++)
        if (isfinite(full[i]) && fabs(full[i]) > scale)
            scale = fabs(full[i]);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hh; h++)
            for (int64_t i = 0; i < n; i++)
                for (int64_t c = 0; c < X; c++) {
                    double a = mine[((b * Hh + h) * n + i) * X + c];
                    double e = full[((b * Hh + h) * y->L + global_row(y, rank, i)) * X + c];
                    double diff = (isnan(a) && isnan(e)) || (a == e) ? 0.0 : fabs(a - e);
                    if (isnan(diff))
                        diff = INFINITY;
                    err = diff > err ? diff : err;
                }
    MPI_Allreduce(&err, &all_err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return all_err / (scale > 0 ? scale : 1.0);
}

/* ---- one configuration: forward and backward against the single process -- */

typedef struct config {
    const char *name;
    int64_t B, H, Hkv, d, dv, chunk;
    mha_ring_layout layout;
    int uneven;
    mha_causal causal;
    float softcap;
    int kv_lengths;  /* batch b has L - 3 - b valid keys (batch 1: none when nan_rows) */
    int nan_rows;    /* masked_rows NAN with one batch fully masked */
} config;

static void run_config(const config *c) {
    if (filter && !strstr(c->name, filter))
        return;
    const layout y = make_layout(c->layout, c->chunk, c->uneven);
    const int64_t B = c->B, H = c->H, Hkv = c->Hkv, d = c->d, dv = c->dv, n = y.rows[rank];
    pair q, k, v, dout, o, lse, dq, dk, dv_;
    pair_make(&q, &y, B, H, d, 11, 1);
    pair_make(&k, &y, B, Hkv, d, 12, 1);
    pair_make(&v, &y, B, Hkv, dv, 13, 1);
    pair_make(&dout, &y, B, H, dv, 14, 1);
    pair_make(&o, &y, B, H, dv, 0, 0);
    pair_make(&dq, &y, B, H, d, 0, 0);
    pair_make(&dk, &y, B, Hkv, d, 0, 0);
    pair_make(&dv_, &y, B, Hkv, dv, 0, 0);
    lse.full = calloc((size_t)(B * H * y.L) + 1, sizeof(float));
    lse.mine = calloc((size_t)(B * H * n) + 1, sizeof(float));
    mha_tensor_init(&lse.F, MHA_F32, lse.full, 3, (int64_t[]){B, H, y.L});
    mha_tensor_init(&lse.M, MHA_F32, lse.mine, 3, (int64_t[]){B, H, n});

    int64_t kvl[8];
    mha_tensor KVL;
    for (int64_t b = 0; b < B; b++)
        kvl[b] = c->nan_rows && b == 1 ? 0 : y.L - 3 - b;
    mha_tensor_init(&KVL, MHA_I64, kvl, 1, (int64_t[]){B});
    mha_ring_options opt;
    mha_ring_options_init(&opt);
    opt.layout = c->layout;
    opt.sdpa.causal = c->causal;
    opt.sdpa.softcap = c->softcap;
    opt.sdpa.kv_lengths = c->kv_lengths ? &KVL : NULL;
    opt.sdpa.masked_rows = c->nan_rows ? MHA_MASKED_ROWS_NAN : MHA_MASKED_ROWS_ZERO;

    /* the single process on the gathered tensors */
    mha_sdpa_options ref = opt.sdpa;
    ref.lse = &lse.F;
    mha_status st = mha_sdpa_forward(&o.F, &q.F, &k.F, &v.F, &ref);
    ref.lse = NULL;
    if (st == MHA_OK)
        st = mha_sdpa_backward(&dq.F, &dk.F, &dv_.F, &dout.F, &o.F, &lse.F, &q.F, &k.F, &v.F, &ref);
    char name[160], detail[200];
    snprintf(name, sizeof name, "%s single-process reference", c->name);
    report(name, st == MHA_OK, st == MHA_OK ? NULL : mha_last_error());

    float *o1 = calloc((size_t)(B * H * n * dv) + 1, sizeof(float));
    float *l1 = calloc((size_t)(B * H * n) + 1, sizeof(float));
    mha_tensor O1, L1;
    mha_tensor_init(&O1, MHA_F32, o1, 4, (int64_t[]){B, H, n, dv});
    mha_tensor_init(&L1, MHA_F32, l1, 3, (int64_t[]){B, H, n});
    st = mha_ring_attention_forward(MPI_COMM_WORLD, &O1, &L1, &q.M, &k.M, &v.M, &opt);
    double eo = st == MHA_OK ? rel_err(o1, o.full, &y, B, H, dv) : INFINITY;
    double el = st == MHA_OK ? rel_err(l1, lse.full, &y, B, H, 0) : INFINITY;
    snprintf(name, sizeof name, "%s forward (L=%lld)", c->name, (long long)y.L);
    snprintf(detail, sizeof detail, "out %.2e lse %.2e%s%s", eo, el, st ? " " : "",
             st ? mha_last_error() : "");
    report(name, st == MHA_OK && eo <= 1e-6 && el <= 1e-6, detail);

    /* gradients: zeroed buffers, then add; a second run must be bit-identical */
    float *g[2][3];
    const int64_t gn[3] = {B * H * n * d, B * Hkv * n * d, B * Hkv * n * dv};
    int same = 1;
    for (int run = 0; run < 2; run++) {
        mha_tensor DQ, DK, DV;
        for (int i = 0; i < 3; i++)
            g[run][i] = calloc((size_t)gn[i] + 1, sizeof(float));
        mha_tensor_init(&DQ, MHA_F32, g[run][0], 4, (int64_t[]){B, H, n, d});
        mha_tensor_init(&DK, MHA_F32, g[run][1], 4, (int64_t[]){B, Hkv, n, d});
        mha_tensor_init(&DV, MHA_F32, g[run][2], 4, (int64_t[]){B, Hkv, n, dv});
        mha_status sb = st != MHA_OK ? st
                        : mha_ring_attention_backward(MPI_COMM_WORLD, &DQ, &DK, &DV, &dout.M,
                                                      &O1, &L1, &q.M, &k.M, &v.M, &opt);
        if (run == 0) {
            double e[3] = {INFINITY, INFINITY, INFINITY};
            if (sb == MHA_OK) {
                e[0] = rel_err(g[0][0], dq.full, &y, B, H, d);
                e[1] = rel_err(g[0][1], dk.full, &y, B, Hkv, d);
                e[2] = rel_err(g[0][2], dv_.full, &y, B, Hkv, dv);
            }
            snprintf(name, sizeof name, "%s backward", c->name);
            snprintf(detail, sizeof detail, "dq %.2e dk %.2e dv %.2e%s%s", e[0], e[1], e[2],
                     sb ? " " : "", sb ? mha_last_error() : "");
            report(name, sb == MHA_OK && e[0] <= 1e-5 && e[1] <= 1e-5 && e[2] <= 1e-5, detail);
        } else {
            for (int i = 0; i < 3; i++)
                same &= !memcmp(g[0][i], g[1][i], sizeof(float) * (size_t)gn[i]);
            float *o2 = calloc((size_t)(B * H * n * dv) + 1, sizeof(float));
            mha_tensor O2;
            mha_tensor_init(&O2, MHA_F32, o2, 4, (int64_t[]){B, H, n, dv});
            same &= mha_ring_attention_forward(MPI_COMM_WORLD, &O2, NULL, &q.M, &k.M, &v.M,
                                               &opt) == MHA_OK &&
                    !memcmp(o1, o2, sizeof(float) * (size_t)(B * H * n * dv));
            free(o2);
            snprintf(name, sizeof name, "%s bit-identical run to run", c->name);
            report(name, same, NULL);
        }
    }
    for (int run = 0; run < 2; run++)
        for (int i = 0; i < 3; i++)
            free(g[run][i]);
    free(o1);
    free(l1);
    pair *all[] = {&q, &k, &v, &dout, &o, &lse, &dq, &dk, &dv_};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

/* ---- bad input on one rank: every rank returns the same error ------------ */

/* Same status everywhere and the same message (rank 0's, compared). */
static int agreed(mha_status st, mha_status want, const char *needle) {
    char msg[512] = {0}, root[512] = {0};
    snprintf(msg, sizeof msg, "%s", mha_last_error());
    memcpy(root, msg, sizeof root);
    MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0 && (st != want || !strstr(msg, needle)))
        printf("  got %s \"%s\", want %s with \"%s\"\n", mha_status_string(st), msg,
               mha_status_string(want), needle);
    return st == want && !strcmp(msg, root) && strstr(msg, needle) != NULL;
}

static void test_bad_inputs(void) {
    if (filter && !strstr("bad input", filter))
        return;
    const int64_t B = 1, H = 2, n = 4, d = 8;
    float *buf = calloc((size_t)(B * H * n * d * 5), sizeof(float));
    mha_tensor q, k, v, o, kbad;
    mha_tensor_init(&q, MHA_F32, buf, 4, (int64_t[]){B, H, n, d});
    mha_tensor_init(&k, MHA_F32, buf + B * H * n * d, 4, (int64_t[]){B, H, n, d});
    mha_tensor_init(&v, MHA_F32, buf + 2 * B * H * n * d, 4, (int64_t[]){B, H, n, d});
    mha_tensor_init(&o, MHA_F32, buf + 3 * B * H * n * d, 4, (int64_t[]){B, H, n, d});
    mha_tensor_init(&kbad, MHA_F32, buf + B * H * n * d, 4, (int64_t[]){B, H, n, d - 1});
    const int bad = P - 1;
    mha_ring_options opt;
    mha_ring_options_init(&opt);

    /* the last rank's k has a wrong head dim */
    mha_status st = mha_ring_attention_forward(MPI_COMM_WORLD, &o, NULL, &q,
                                               rank == bad ? &kbad : &k, &v, &opt);
    char needle[32];
    snprintf(needle, sizeof needle, "rank %d: k: shape", bad);
    report("bad input: one rank's k shape -> the same MHA_ERR_SHAPE on every rank",
           agreed(st, MHA_ERR_SHAPE, needle), NULL);

    /* valid alone, but the ranks disagree on an option */
    mha_ring_options other = opt;
    other.sdpa.causal = MHA_CAUSAL_TOP_LEFT;
    st = mha_ring_attention_forward(MPI_COMM_WORLD, &o, NULL, &q, &k, &v,
                                    rank == bad && P > 1 ? &other : &opt);
    if (P > 1)
        report("bad input: ranks disagree on causal -> the same MHA_ERR_VALUE",
               agreed(st, MHA_ERR_VALUE, "causal is 1 but rank 0 has 0"), NULL);

    /* an option no rank can serve */
    other = opt;
    other.sdpa.training = 1, other.sdpa.dropout_p = 0.5f;
    st = mha_ring_attention_forward(MPI_COMM_WORLD, &o, NULL, &q, &k, &v, &other);
    report("bad input: dropout -> MHA_ERR_UNSUPPORTED", agreed(st, MHA_ERR_UNSUPPORTED, "dropout"),
           NULL);

    /* zigzag with uneven shards: refused naming the sizes */
    mha_tensor q3 = q, k3 = k, v3 = v, o3 = o;
    const int64_t odd = rank == bad ? 3 : n;
    q3.shape[2] = k3.shape[2] = v3.shape[2] = o3.shape[2] = odd;
    other = opt;
    other.layout = MHA_RING_ZIGZAG;
    st = mha_ring_attention_forward(MPI_COMM_WORLD, &o3, NULL, &q3, &k3, &v3, &other);
    snprintf(needle, sizeof needle, "rank %d holds 3 rows", bad);
    report("bad input: zigzag uneven shards -> MHA_ERR_SHAPE naming the sizes",
           agreed(st, MHA_ERR_SHAPE, needle), NULL);

    /* the backward without the forward's lse; and with the reference kernel */
    mha_tensor lse;
    mha_tensor_init(&lse, MHA_F32, buf + 4 * B * H * n * d, 3, (int64_t[]){B, H, n});
    st = mha_ring_attention_backward(MPI_COMM_WORLD, NULL, NULL, NULL, &o, &o,
                                     rank == bad ? NULL : &lse, &q, &k, &v, &opt);
    report("bad input: backward without lse on one rank -> MHA_ERR_NULL",
           agreed(st, MHA_ERR_NULL, "lse"), NULL);
    free(buf);
}

/* ---- the sequence-parallel encoder layer against the single-process one -- */

static void test_encoder(mha_ring_layout kind, int uneven, int causal, int norm_first) {
    char name[160];
    snprintf(name, sizeof name, "encoder layer %s%s%s%s", kind == MHA_RING_ZIGZAG ? "zigzag" : "contiguous",
             uneven ? " uneven" : "", causal ? " causal" : "", norm_first ? " norm_first" : "");
    if (filter && !strstr(name, filter))
        return;
    const int64_t B = 2, E = 16, H = 4, F = 24;
    const layout y = make_layout(kind, 3, uneven);
    const int64_t n = y.rows[rank];
    /* the state_dict: every rank makes the same weights */
    const int64_t sizes[10] = {3 * E * E, 3 * E, E * E, E, F * E, F, E * F, E, E, E};
    float *wbuf[10];
    mha_tensor wt[10];
    for (int i = 0; i < 10; i++) {
        wbuf[i] = malloc(sizeof(float) * (size_t)sizes[i]);
        mha_randn(wbuf[i], sizes[i], 100 + (uint64_t)i, 0.3f);
    }
    mha_tensor_init(&wt[0], MHA_F32, wbuf[0], 2, (int64_t[]){3 * E, E});
    mha_tensor_init(&wt[1], MHA_F32, wbuf[1], 1, (int64_t[]){3 * E});
    mha_tensor_init(&wt[2], MHA_F32, wbuf[2], 2, (int64_t[]){E, E});
    mha_tensor_init(&wt[3], MHA_F32, wbuf[3], 1, (int64_t[]){E});
    mha_tensor_init(&wt[4], MHA_F32, wbuf[4], 2, (int64_t[]){F, E});
    mha_tensor_init(&wt[5], MHA_F32, wbuf[5], 1, (int64_t[]){F});
    mha_tensor_init(&wt[6], MHA_F32, wbuf[6], 2, (int64_t[]){E, F});
    for (int i = 7; i < 10; i++)
        mha_tensor_init(&wt[i], MHA_F32, wbuf[i], 1, (int64_t[]){E});
    mha_encoder_layer_weights w;
    memset(&w, 0, sizeof w);
    w.self_attn.in_proj_weight = &wt[0], w.self_attn.in_proj_bias = &wt[1];
    w.self_attn.out_proj_weight = &wt[2], w.self_attn.out_proj_bias = &wt[3];
    w.linear1_weight = &wt[4], w.linear1_bias = &wt[5];
    w.linear2_weight = &wt[6], w.linear2_bias = &wt[7];
    w.norm1_weight = &wt[8], w.norm1_bias = &wt[9]; /* norm2: ones/zeros (NULL) */
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = H;
    opt.norm_first = norm_first;
    opt.activation = MHA_ACT_GELU;

    pair src;
    pair_make(&src, &y, B, 1, E, 21, 1);
    mha_tensor S, O, SL, OL;
    float *ref = calloc((size_t)(B * y.L * E) + 1, sizeof(float));
    float *mine = calloc((size_t)(B * n * E) + 1, sizeof(float));
    mha_tensor_init(&S, MHA_F32, src.full, 3, (int64_t[]){B, y.L, E});
    mha_tensor_init(&O, MHA_F32, ref, 3, (int64_t[]){B, y.L, E});
    mha_tensor_init(&SL, MHA_F32, src.mine, 3, (int64_t[]){B, n, E});
    mha_tensor_init(&OL, MHA_F32, mine, 3, (int64_t[]){B, n, E});
    mha_layer_masks masks = {0};
    masks.causal = causal;
    mha_status st = mha_encoder_layer_forward(&O, &S, &w, &masks, &opt, NULL, 0);
    if (st == MHA_OK)
        st = mha_ring_encoder_layer_forward(MPI_COMM_WORLD, &OL, &SL, &w, &opt, causal, kind);
    double e = st == MHA_OK ? rel_err(mine, ref, &y, B, 1, E) : INFINITY;
    char detail[200];
    snprintf(detail, sizeof detail, "%.2e%s%s", e, st ? " " : "", st ? mha_last_error() : "");
    report(name, st == MHA_OK && e <= 1e-5, detail);

    /* the backward against mha_encoder_layer_forward_train + _backward */
    size_t saved_bytes = 0;
    mha_layer_saved_size(B, y.L, y.L, E, H, &saved_bytes);
    void *saved = malloc(saved_bytes);
    pair dout, dsrc;
    pair_make(&dout, &y, B, 1, E, 22, 1);
    pair_make(&dsrc, &y, B, 1, E, 0, 0);
    float *gref = calloc(1024 * 4, sizeof(float)), *gmine = calloc(1024 * 4, sizeof(float));
    mha_tensor gt[2][10];
    mha_encoder_layer_grads gr[2];
    for (int side = 0; side < 2; side++) {
        float *base = side ? gmine : gref;
        int64_t off = 0;
        for (int i = 0; i < 10; i++) {
            gt[side][i] = wt[i];
            gt[side][i].data = base + off;
            off += sizes[i];
        }
        memset(&gr[side], 0, sizeof gr[side]);
        gr[side].self_attn.in_proj_weight = &gt[side][0], gr[side].self_attn.in_proj_bias = &gt[side][1];
        gr[side].self_attn.out_proj_weight = &gt[side][2], gr[side].self_attn.out_proj_bias = &gt[side][3];
        gr[side].linear1_weight = &gt[side][4], gr[side].linear1_bias = &gt[side][5];
        gr[side].linear2_weight = &gt[side][6], gr[side].linear2_bias = &gt[side][7];
        gr[side].norm1_weight = &gt[side][8], gr[side].norm1_bias = &gt[side][9];
    }
    mha_tensor DO, DS, DOL, DSL;
    mha_tensor_init(&DO, MHA_F32, dout.full, 3, (int64_t[]){B, y.L, E});
    mha_tensor_init(&DS, MHA_F32, dsrc.full, 3, (int64_t[]){B, y.L, E});
    mha_tensor_init(&DOL, MHA_F32, dout.mine, 3, (int64_t[]){B, n, E});
    mha_tensor_init(&DSL, MHA_F32, dsrc.mine, 3, (int64_t[]){B, n, E});
    st = mha_encoder_layer_forward_train(&O, saved, saved_bytes, &S, &w, &masks, &opt, NULL, 0);
    if (st == MHA_OK)
        st = mha_encoder_layer_backward(&DS, &gr[0], &DO, saved, saved_bytes, &S, &w, &masks, &opt,
                                        NULL, 0);
    if (st == MHA_OK)
        st = mha_ring_encoder_layer_backward(MPI_COMM_WORLD, &DSL, &gr[1], &DOL, &SL, &w, &opt,
                                             causal, kind);
    double eg = st == MHA_OK ? rel_err(dsrc.mine, dsrc.full, &y, B, 1, E) : INFINITY;
    for (int i = 0; i < 10 && st == MHA_OK; i++) {
        double m = 0, sc = 0;
        for (int64_t j = 0; j < sizes[i]; j++) {
            const float *a = gt[0][i].data, *b = gt[1][i].data;
            m = fmax(m, fabs((double)a[j] - (double)b[j]));
            sc = fmax(sc, fabs((double)a[j]));
        }
        eg = fmax(eg, m / (sc > 0 ? sc : 1));
    }
    snprintf(detail, sizeof detail, "dsrc and every weight %.2e%s%s", eg, st ? " " : "",
             st ? mha_last_error() : "");
    char bname[200];
    snprintf(bname, sizeof bname, "%s backward", name);
    report(bname, st == MHA_OK && eg <= 1e-5, detail);
    free(saved), free(gref), free(gmine);
    pair_free(&dout), pair_free(&dsrc);

    if (!causal && !norm_first && !uneven) { /* in place, and a bad rank */
        st = mha_ring_encoder_layer_forward(MPI_COMM_WORLD, &SL, &SL, &w, &opt, causal, kind);
        report("encoder layer in place (out = src)",
               st == MHA_OK && !memcmp(src.mine, mine, sizeof(float) * (size_t)(B * n * E)), NULL);
        mha_layer_options bad = opt;
        bad.num_heads = rank == P - 1 ? 3 : H;
        st = mha_ring_encoder_layer_forward(MPI_COMM_WORLD, &OL, &SL, &w, &bad, causal, kind);
        char needle[40];
        snprintf(needle, sizeof needle, "rank %d: num_heads: 3", P - 1);
        report("encoder layer: one rank's bad num_heads -> the same error everywhere",
               agreed(st, MHA_ERR_SHAPE, needle), NULL);
    }
    free(ref);
    free(mine);
    pair_free(&src);
    for (int i = 0; i < 10; i++)
        free(wbuf[i]);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    filter = argc > 1 ? argv[1] : NULL;
    mha_set_num_threads(1);
    const int64_t live0 = mha_test_live_allocs();
    static const config configs[] = {
        {"contiguous", 2, 4, 4, 16, 16, 9, MHA_RING_CONTIGUOUS, 0, MHA_CAUSAL_NONE, 0, 0, 0},
        {"contiguous causal", 2, 4, 4, 16, 16, 9, MHA_RING_CONTIGUOUS, 0, MHA_CAUSAL_TOP_LEFT, 0, 0, 0},
        {"zigzag", 2, 4, 4, 16, 16, 5, MHA_RING_ZIGZAG, 0, MHA_CAUSAL_NONE, 0, 0, 0},
        {"zigzag causal", 2, 4, 4, 16, 16, 5, MHA_RING_ZIGZAG, 0, MHA_CAUSAL_TOP_LEFT, 0, 0, 0},
        {"zigzag causal GQA dv!=d", 1, 6, 2, 12, 20, 7, MHA_RING_ZIGZAG, 0, MHA_CAUSAL_TOP_LEFT, 0, 0, 0},
        {"contiguous GQA", 2, 4, 1, 8, 8, 6, MHA_RING_CONTIGUOUS, 0, MHA_CAUSAL_NONE, 0, 0, 0},
        {"uneven causal", 2, 3, 3, 8, 8, 0, MHA_RING_CONTIGUOUS, 1, MHA_CAUSAL_TOP_LEFT, 0, 0, 0},
        {"uneven GQA", 1, 4, 2, 8, 8, 0, MHA_RING_CONTIGUOUS, 1, MHA_CAUSAL_NONE, 0, 0, 0},
        {"zigzag causal softcap", 2, 2, 2, 8, 8, 4, MHA_RING_ZIGZAG, 0, MHA_CAUSAL_TOP_LEFT, 5.0f, 0, 0},
        {"contiguous causal kv_lengths", 3, 2, 2, 8, 8, 5, MHA_RING_CONTIGUOUS, 0, MHA_CAUSAL_TOP_LEFT, 0, 1, 0},
        {"zigzag kv_lengths NaN rows", 2, 2, 1, 8, 8, 3, MHA_RING_ZIGZAG, 0, MHA_CAUSAL_NONE, 0, 1, 1},
        {"long zigzag causal", 1, 1, 1, 8, 8, 520, MHA_RING_ZIGZAG, 0, MHA_CAUSAL_TOP_LEFT, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof configs / sizeof *configs; i++)
        run_config(&configs[i]);
    test_bad_inputs();
    for (int c = 0; c < 2; c++)
        for (int nf = 0; nf < 2; nf++)
            test_encoder(MHA_RING_ZIGZAG, 0, c, nf);
    test_encoder(MHA_RING_CONTIGUOUS, 0, 0, 0);
    test_encoder(MHA_RING_CONTIGUOUS, 1, 1, 0);
    char live[64];
    snprintf(live, sizeof live, "%lld live", (long long)(mha_test_live_allocs() - live0));
    report("no library allocation left live after every call", mha_test_live_allocs() == live0,
           live);
    if (rank == 0)
        printf("%d passed, %d failed\n", passed, failed);
    MPI_Finalize();
    return failed ? 1 : 0;
}
