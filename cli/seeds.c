/* seeds.c - the seed tutorials' example and claims (see seeds.h).
 * Plain loops in double for the tiny reference products; the library's
 * API for everything it offers. */
#include "seeds.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int seed_example_make(seed_example *ex, int64_t L, int64_t D, int64_t h, uint64_t seed) {
    memset(ex, 0, sizeof *ex);
    ex->L = L, ex->D = D, ex->h = h;
    size_t n = (size_t)(L * D + 3 * D * D + D * D);
    ex->x = malloc(n * sizeof(float));
    if (!ex->x)
        return -1;
    ex->in_proj = ex->x + L * D;
    ex->out_proj = ex->in_proj + 3 * D * D;
    mha_randn(ex->x, L * D, seed, 1.0f);
    mha_randn(ex->in_proj, 3 * D * D, seed + 1, (float)(1.0 / sqrt((double)D)));
    mha_randn(ex->out_proj, D * D, seed + 2, (float)(1.0 / sqrt((double)D)));
    return 0;
}

void seed_example_free(seed_example *ex) {
    free(ex->x);
    memset(ex, 0, sizeof *ex);
}

mha_status seed_example_forward(const seed_example *ex, float *out, float *weights) {
    const int64_t L = ex->L, D = ex->D, h = ex->h;
    mha_tensor x, in_w, out_w, y, w;
    mha_tensor_init(&x, MHA_F32, ex->x, 2, (int64_t[]){L, D});
    mha_tensor_init(&in_w, MHA_F32, ex->in_proj, 2, (int64_t[]){3 * D, D});
    mha_tensor_init(&out_w, MHA_F32, ex->out_proj, 2, (int64_t[]){D, D});
    float *tmp = out ? NULL : malloc(sizeof(float) * (size_t)(L * D));
    mha_tensor_init(&y, MHA_F32, out ? out : tmp, 2, (int64_t[]){L, D});
    mha_multihead_weights wt = {.in_proj_weight = &in_w, .out_proj_weight = &out_w};
    mha_multihead_options opt;
    mha_multihead_options_init(&opt);
    opt.num_heads = h;
    if (weights) {
        mha_tensor_init(&w, MHA_F32, weights, 3, (int64_t[]){h, L, L});
        opt.attn_weights = &w;
        opt.average_attn_weights = 0;
    }
    mha_status st = y.data ? mha_multihead_forward(&y, &x, &x, &x, &wt, &opt) : MHA_ERR_NOMEM;
    free(tmp);
    return st;
}

/* c (m,n) = a (m,k) b^T, b given as (n,k) rows with row stride ldb. */
static void matmul_nt(double *c, const float *a, int64_t lda, const float *b, int64_t ldb,
                      int64_t m, int64_t n, int64_t k) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            for (int64_t t = 0; t < k; t++)
                s += (double)a[i * lda + t] * (double)b[j * ldb + t];
            c[i * n + j] = s;
        }
}

static double max_abs(const double *a, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

/* max|a - b| / max(1, max|b|) */
static double rel_err(const double *a, const double *b, size_t n) {
    double d = 0.0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs(a[i] - b[i]));
    return d / fmax(1.0, max_abs(b, n));
}

static void to_double(double *d, const float *f, size_t n) {
    for (size_t i = 0; i < n; i++)
        d[i] = f[i];
}

/* Per-head attention of projected Q/K/V (L,D) through the SDPA API:
 * o (L,D) heads concatenated, weights (h,L,L). */
static mha_status heads_sdpa(const float *q, const float *k, const float *v, int64_t L, int64_t D,
                             int64_t h, float *o, float *weights) {
    int64_t d = D / h;
    mha_tensor tq, tk, tv, to, tw;
    mha_tensor *ts[] = {&tq, &tk, &tv, &to};
    const float *ps[] = {q, k, v, o};
    for (int i = 0; i < 4; i++) { /* (1,h,L,d) head views of (L,D): split by strides */
        mha_tensor_init(ts[i], MHA_F32, (void *)ps[i], 4, (int64_t[]){1, h, L, d});
        ts[i]->stride[1] = d, ts[i]->stride[2] = D;
    }
    mha_tensor_init(&tw, MHA_F32, weights, 4, (int64_t[]){1, h, L, L});
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.attn_weights = &tw;
    return mha_sdpa_forward(&to, &tq, &tk, &tv, &opt);
}

static void claim(seed_claim *c, const char *statement, const char *measure, double measured,
                  double bound, int at_least) {
    c->statement = statement, c->measure = measure, c->measured = measured, c->bound = bound;
    c->at_least = at_least;
    c->holds = at_least ? measured >= bound : measured <= bound;
}

int seed_claims_check(seed_claim *claims, int64_t L, int64_t D, int64_t h, uint64_t seed) {
    seed_example ex, one;
    if (seed_example_make(&ex, L, D, h, seed) || seed_example_make(&one, L, D, 1, seed))
        return -1;
    const int64_t d = D / h, LD = L * D, LL = L * L;
    size_t nf = (size_t)(4 * LD + 2 * h * LL + 8192), nd = (size_t)(6 * LD + 2 * LL + 4 * LD);
    float *f = calloc(nf, sizeof(float));
    double *g = calloc(nd, sizeof(double));
    int n = -1;
    if (!f || !g)
        goto done;
    float *q = f, *k = q + LD, *v = k + LD, *o = v + LD, *w = o + LD, *w1 = w + h * LL;
    double *y_api = g, *y_ref = y_api + LD, *tmp = y_ref + LD, *P = tmp + LD, *acc = P + LL,
           *acc2 = acc + LD;
    float *yf = (float *)tmp; /* LD floats fit in LD doubles */

    /* Q, K, V = X W^T (float, as the API's projections) */
    for (int part = 0; part < 3; part++) {
        matmul_nt(tmp, ex.x, D, ex.in_proj + part * D * D, D, L, D, D);
        for (int64_t i = 0; i < LD; i++)
            (part == 0 ? q : part == 1 ? k : v)[i] = (float)tmp[i];
    }
    n = 0;

    /* 1. h = 1 is the single-head formula softmax(Q K^T / sqrt(D)) V W_O */
    if (seed_example_forward(&one, yf, NULL) != MHA_OK)
        goto fail;
    to_double(y_api, yf, (size_t)LD);
    {
        double *Qd = acc, *S = P;
        float *Qf = w1, *Kf = w1 + LD, *Vf = w1 + 2 * LD;
        for (int part = 0; part < 3; part++) {
            matmul_nt(Qd, one.x, D, one.in_proj + part * D * D, D, L, D, D);
            for (int64_t i = 0; i < LD; i++)
                (part == 0 ? Qf : part == 1 ? Kf : Vf)[i] = (float)Qd[i];
        }
        matmul_nt(S, Qf, D, Kf, D, L, L, D);
        for (int64_t i = 0; i < L; i++) {
            double m = -INFINITY, s = 0.0;
            for (int64_t j = 0; j < L; j++)
                m = fmax(m, S[i * L + j] / sqrt((double)D));
            for (int64_t j = 0; j < L; j++)
                s += (S[i * L + j] = exp(S[i * L + j] / sqrt((double)D) - m));
            for (int64_t j = 0; j < L; j++)
                S[i * L + j] /= s;
        }
        for (int64_t i = 0; i < L; i++) /* O = P V, then Y = O W_O^T */
            for (int64_t c = 0; c < D; c++) {
                double s = 0.0;
                for (int64_t j = 0; j < L; j++)
                    s += S[i * L + j] * Vf[j * D + c];
                Qf[i * D + c] = (float)s;
            }
        matmul_nt(y_ref, Qf, D, one.out_proj, D, L, D, D);
    }
    claim(&claims[n++], "h = 1 is exactly the single-head formula softmax(QK^T/sqrt(d_k))V W_O",
          "max rel error", rel_err(y_api, y_ref, (size_t)LD), 1e-5, 0);

    /* 2. concat-then-W_O equals the sum over heads of O_r W_O^(r) */
    if (seed_example_forward(&ex, yf, NULL) != MHA_OK || heads_sdpa(q, k, v, L, D, h, o, w))
        goto fail;
    to_double(y_api, yf, (size_t)LD);
    memset(acc, 0, sizeof(double) * (size_t)LD);
    for (int64_t r = 0; r < h; r++) {
        /* O_r (L,d) times block r of W_O^T: columns r*d.. of out_proj (D,D) */
        matmul_nt(acc2, o + r * d, D, ex.out_proj + r * d, D, L, D, d);
        for (int64_t i = 0; i < LD; i++)
            acc[i] += acc2[i];
    }
    claim(&claims[n++], "Concat(heads) W_O equals the sum over heads of O_r W_O^(r)",
          "max rel error vs nn.MultiheadAttention", rel_err(acc, y_api, (size_t)LD), 1e-5, 0);

    /* 3. one D x D projection reshaped into h heads = h separate D x d projections */
    for (int64_t r = 0; r < h; r++) {
        float *qr = w1, *kr = w1 + L * d, *vr = w1 + 2 * L * d, *orr = w1 + 3 * L * d;
        float *wr = orr + L * d;
        for (int part = 0; part < 3; part++) {
            /* W^(r) = rows r*d..(r+1)*d of the part's (D,D) block: its own (d,D) weight */
            matmul_nt(acc2, ex.x, D, ex.in_proj + part * D * D + r * d * D, D, L, d, D);
            for (int64_t i = 0; i < L * d; i++)
                (part == 0 ? qr : part == 1 ? kr : vr)[i] = (float)acc2[i];
        }
        if (heads_sdpa(qr, kr, vr, L, d, 1, orr, wr) != MHA_OK)
            goto fail;
        for (int64_t i = 0; i < L; i++)
            for (int64_t c = 0; c < d; c++)
                yf[i * D + r * d + c] = orr[i * d + c]; /* concat */
    }
    matmul_nt(acc, yf, D, ex.out_proj, D, L, D, D);
    claim(&claims[n++],
          "Reshaping one D x D projection into h heads equals h separate learned D x d projections",
          "max rel error vs nn.MultiheadAttention", rel_err(acc, y_api, (size_t)LD), 1e-5, 0);

    /* 4. heads are learned subspaces, not slices of the input */
    {
        double diff = 0.0, norm = 0.0;
        for (int64_t i = 0; i < L; i++)
            for (int64_t c = 0; c < d; c++) {
                diff += pow((double)q[i * D + c] - (double)ex.x[i * D + c], 2);
                norm += pow((double)ex.x[i * D + c], 2);
            }
        claim(&claims[n++], "Head 0's queries are a learned projection, not the slice X[:, 0:d_k]",
              "||Q_0 - X[:,0:d_k]|| / ||X[:,0:d_k]||", sqrt(diff / norm), 0.1, 1);
    }

    /* 5. parameter count 4 D^2 + 4 D for any h, as one wide head: the same
     *    four weights and biases run every h that divides D */
    {
        float *bias = calloc((size_t)(4 * D), sizeof(float));
        mha_tensor x, in_w, in_b, out_w, out_b, y;
        mha_tensor_init(&x, MHA_F32, ex.x, 2, (int64_t[]){L, D});
        mha_tensor_init(&in_w, MHA_F32, ex.in_proj, 2, (int64_t[]){3 * D, D});
        mha_tensor_init(&in_b, MHA_F32, bias, 1, (int64_t[]){3 * D});
        mha_tensor_init(&out_w, MHA_F32, ex.out_proj, 2, (int64_t[]){D, D});
        mha_tensor_init(&out_b, MHA_F32, bias ? bias + 3 * D : NULL, 1, (int64_t[]){D});
        mha_tensor_init(&y, MHA_F32, yf, 2, (int64_t[]){L, D});
        mha_multihead_weights wt = {.in_proj_weight = &in_w, .in_proj_bias = &in_b,
                                    .out_proj_weight = &out_w, .out_proj_bias = &out_b};
        int64_t params = 3 * D * D + 3 * D + D * D + D, off = 0;
        for (int64_t heads = 1; heads <= D; heads++) {
            if (D % heads)
                continue;
            mha_multihead_options opt;
            mha_multihead_options_init(&opt);
            opt.num_heads = heads;
            if (!bias || mha_multihead_forward(&y, &x, &x, &x, &wt, &opt) != MHA_OK)
                off += params; /* a head count the same parameters could not serve */
        }
        free(bias);
        off += llabs(mha_multihead_param_count(D, D, D, 1, 0) - (4 * D * D + 4 * D));
        off += llabs(params - (4 * D * D + 4 * D));
        claim(&claims[n++],
              "The same 4 D^2 + 4 D parameters serve every h, as for one wide head (h = 1)",
              "parameters off 4D^2+4D, summed over every h dividing D", (double)off, 0, 0);
    }

    /* 6-7. early fusion of attention weights vs late fusion of read results */
    {
        double *early = acc, *late = acc2;
        memset(late, 0, sizeof(double) * (size_t)(L * d));
        for (int64_t i = 0; i < L; i++)
            for (int64_t c = 0; c < d; c++) {
                double e = 0.0;
                for (int64_t j = 0; j < L; j++) {
                    double amean = 0.0;
                    for (int64_t r = 0; r < h; r++) {
                        amean += w[r * LL + i * L + j] / (double)h;
                        late[i * d + c] += w[r * LL + i * L + j] * v[j * D + r * d + c] / (double)h;
                    }
                    e += amean * v[j * D + c]; /* which V? head 0's */
                }
                early[i * d + c] = e;
            }
        claim(&claims[n++],
              "Averaging the heads' weights before reading V differs from late fusion (in general)",
              "max |early - late| / max(1,|late|)", rel_err(early, late, (size_t)(L * d)), 1e-2, 1);
        memset(late, 0, sizeof(double) * (size_t)(L * d));
        for (int64_t i = 0; i < L; i++)
            for (int64_t c = 0; c < d; c++) {
                double e = 0.0;
                for (int64_t j = 0; j < L; j++) {
                    double amix = 0.0;
                    for (int64_t r = 0; r < h; r++) {
                        double lambda = (double)(r + 1) / (double)(h * (h + 1) / 2);
                        amix += lambda * w[r * LL + i * L + j];
                        late[i * d + c] += lambda * w[r * LL + i * L + j] * v[j * D + c];
                    }
                    e += amix * v[j * D + c];
                }
                early[i * d + c] = e;
            }
        claim(&claims[n++],
              "...and equals it when all heads share V and the fusion is a scalar mix",
              "max rel error", rel_err(early, late, (size_t)(L * d)), 1e-12, 0);
    }

    /* 8-9. the variance of q.k is about d_k, and about 1 after scaling */
    {
        const int64_t dk = 64, pairs = 4096;
        float *qv = f + 4 * LD + 2 * h * LL; /* 8192 floats reserved */
        double sum = 0.0, sum2 = 0.0, ssum = 0.0, ssum2 = 0.0;
        for (int64_t t = 0; t < pairs; t++) {
            mha_randn(qv, 2 * dk, seed * 1000003u + (uint64_t)t, 1.0f);
            double dot = 0.0;
            for (int64_t c = 0; c < dk; c++)
                dot += (double)qv[c] * qv[dk + c];
            double scaled = dot / sqrt((double)dk);
            sum += dot, sum2 += dot * dot, ssum += scaled, ssum2 += scaled * scaled;
        }
        double var = sum2 / pairs - (sum / pairs) * (sum / pairs);
        double svar = ssum2 / pairs - (ssum / pairs) * (ssum / pairs);
        claim(&claims[n++], "q.k of unit-variance d_k-vectors has variance close to d_k (d_k = 64)",
              "|var(q.k) / d_k - 1| over 4096 pairs", fabs(var / dk - 1.0), 0.1, 0);
        claim(&claims[n++], "...and variance close to 1 after scaling by 1/sqrt(d_k)",
              "|var(q.k / sqrt(d_k)) - 1|", fabs(svar - 1.0), 0.1, 0);
    }
    goto done;
fail:
    n = -1;
done:
    free(f);
    free(g);
    seed_example_free(&ex);
    seed_example_free(&one);
    return n;
}

int seed_walk_run(const seed_example *ex, seed_walk *walk) {
    const int64_t L = ex->L, D = ex->D, h = ex->h, d = D / h, LD = L * D;
    memset(walk, 0, sizeof *walk);
    float *f = calloc((size_t)(6 * LD + h * L * L + LD), sizeof(float));
    double *tmp = calloc((size_t)(2 * LD), sizeof(double));
    if (!f || !tmp) {
        free(f), free(tmp);
        return -1;
    }
    walk->q = f, walk->k = f + LD, walk->v = f + 2 * LD, walk->heads = f + 3 * LD;
    walk->concat = f + 4 * LD, walk->out = f + 5 * LD, walk->attn_weights = f + 6 * LD;
    float *api = walk->attn_weights + h * L * L;
    /* 1. Q, K, V = X W^T */
    for (int part = 0; part < 3; part++) {
        matmul_nt(tmp, ex->x, D, ex->in_proj + part * D * D, D, L, D, D);
        float *dst = part == 0 ? walk->q : part == 1 ? walk->k : walk->v;
        for (int64_t i = 0; i < LD; i++)
            dst[i] = (float)tmp[i];
    }
    /* 2-3. split into heads by strides and attend per head -> concat layout */
    int rc = 0;
    if (heads_sdpa(walk->q, walk->k, walk->v, L, D, h, walk->concat, walk->attn_weights) != MHA_OK)
        rc = -1;
    for (int64_t r = 0; rc == 0 && r < h; r++) /* head r's output as its own (L,d) */
        for (int64_t i = 0; i < L; i++)
            for (int64_t c = 0; c < d; c++)
                walk->heads[(r * L + i) * d + c] = walk->concat[i * D + r * d + c];
    /* 5. out = concat W_O^T, checked against the library's one call */
    if (rc == 0) {
        matmul_nt(tmp, walk->concat, D, ex->out_proj, D, L, D, D);
        for (int64_t i = 0; i < LD; i++)
            walk->out[i] = (float)tmp[i];
        if (seed_example_forward(ex, api, NULL) != MHA_OK)
            rc = -1;
        for (int64_t i = 0; i < LD; i++)
            tmp[LD + i] = api[i];
        walk->err_vs_api = rel_err(tmp, tmp + LD, (size_t)LD);
    }
    free(tmp);
    if (rc)
        seed_walk_free(walk);
    return rc;
}

void seed_walk_free(seed_walk *walk) {
    free(walk->q);
    memset(walk, 0, sizeof *walk);
}
