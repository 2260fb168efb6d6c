/* attention_bwd_flash.c - fused (flash-style) attention backward, portable C.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v, G = Hq/Hkv; tiles of
 * BR query rows and blocks of BC keys.  Reference: attention_bwd_ref.c.
 *
 * ref: Dao, "FlashAttention-2: Faster Attention with Better Parallelism and
 * Work Partitioning" (2023), Algorithm 2.
 *
 * 1. Row statistics: lse (from the forward, or recomputed) and
 *    D_i = dO_i . O_i (from the forward's output, or recomputed).
 * 2. Tasks (b, kv head, split): a split is a fixed contiguous range of key
 *    blocks.  Per key block: pack K, K^T, V^T; then for each query head of
 *    the group and each query tile: S = Q K^T, dP = dO V^T, and per element
 *    P = exp(scale s + bias - lse), Z the dropout factor,
 *    dV_blk += (P Z)^T dO,  dS = P (Z dP - D),  dK_blk += dS^T Q,
 *    dQ_part += dS K.  dK/dV of the block are then added to the caller's
 *    (the task owns those rows); dQ goes to the split's own partial buffer.
 * 3. dq += sum over splits of the partial buffers, in split order.
 * The number of splits depends only on the problem size (enough tasks for
 * small B*Hkv), never on the thread count; every task runs the same code
 * wherever it lands, so results are bit-identical for any thread count.
 * Masked entries get dS = 0 exactly and are skipped in the products, so
 * NaN/Inf in masked keys or values never reach a gradient.
 */
#include "attention_bwd.h"

#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

enum { BR = 32, BC = 64, TASKS_WANTED = 16 };

/* ---- row statistics -------------------------------------------------------- */

/* One row in float64: lse, and delta = sum_j P_j Z_j dO.v_j when wanted. */
static void row_stats(const mha_attn_problem *p, const mha_attn_grad *g, int64_t b, int64_t h,
                      int64_t i, double *s, float *lse, float *delta) {
    const int64_t hk = h / (p->Hq / p->Hkv);
    const float *q = p->q.data, *k = p->k.data, *v = p->v.data;
    const int64_t q0 = b * p->q.stride[0] + h * p->q.stride[1] + i * p->q.stride[2];
    const int64_t k0 = b * p->k.stride[0] + hk * p->k.stride[1];
    const int64_t v0 = b * p->v.stride[0] + hk * p->v.stride[1];
    double max = -INFINITY;
    bool any = false, nan = false;
    for (int64_t j = 0; j < p->S; j++) {
        float bias = mha_attn_bias(p, b, h, i, j);
        s[j] = -INFINITY;
        if (bias == -INFINITY)
            continue;
        double dot = 0.0;
        for (int64_t c = 0; c < p->d; c++)
            dot += (double)q[q0 + c * p->q.stride[3]] *
                   (double)k[k0 + j * p->k.stride[2] + c * p->k.stride[3]];
        double raw = dot * (double)p->scale;
        if (p->softcap > 0.0f)
            raw = (double)p->softcap * tanh(raw / (double)p->softcap);
        s[j] = raw + (double)bias;
        any = true;
        if (isnan(s[j]))
            nan = true;
        else if (s[j] > max)
            max = s[j];
    }
    if (!any) {
        *lse = -INFINITY;
        if (delta)
            *delta = 0.0f;
        return;
    }
    if (nan)
        max = NAN;
    double sink = -INFINITY; /* a sink joins the denominator only */
    if (p->sinks.data) {
        sink = ((const float *)p->sinks.data)[h * p->sinks.stride[0]];
        if (sink > max)
            max = sink;
    }
    double sum = sink == -INFINITY ? 0.0 : exp(sink - max);
    for (int64_t j = 0; j < p->S; j++)
        if (s[j] != -INFINITY)
            sum += exp(s[j] - max);
    double l = max + log(sum);
    *lse = (float)l;
    if (!delta)
        return;
    const float *dO = g->dout.data;
    const int64_t o0 = b * g->dout.stride[0] + h * g->dout.stride[1] + i * g->dout.stride[2];
    const double keep_scale = p->dropout ? 1.0 / (1.0 - (double)p->dropout_p) : 1.0;
    double D = 0.0;
    for (int64_t j = 0; j < p->S; j++) {
        if (s[j] == -INFINITY)
            continue;
        if (p->dropout && mha_dropout_uniform(p->seed, b, h, i, j) < p->dropout_p)
            continue;
        double dp = 0.0;
        for (int64_t c = 0; c < p->dv; c++)
            dp += (double)dO[o0 + c * g->dout.stride[3]] *
                  (double)v[v0 + j * p->v.stride[2] + c * p->v.stride[3]];
        D += exp(s[j] - l) * keep_scale * dp;
    }
    *delta = (float)D;
}

mha_status mha_attn_row_stats(const mha_attn_problem *p, const mha_attn_grad *g, float *lse,
                              float *delta) {
    const int64_t rows = p->B * p->Hq * p->L;
    const int nthreads = mha_threads();
    const size_t per = (size_t)(p->S > 0 ? p->S : 1);
    double *scratch = mha_malloc(sizeof(double) * per * (size_t)nthreads);
    if (!scratch)
        return mha_error(MHA_ERR_NOMEM, "attention: cannot allocate %zu score doubles",
                         per * (size_t)nthreads);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        int64_t i = r % p->L, h = (r / p->L) % p->Hq, b = r / (p->L * p->Hq);
        row_stats(p, g, b, h, i, scratch + (size_t)tid * per, lse + r, delta ? delta + r : NULL);
    }
    mha_free(scratch);
    return MHA_OK;
}

/* ---- the fused backward ---------------------------------------------------- */

/* Per-thread scratch, floats: K (BC,d), K^T (d,BC), V^T (dv,BC), dK (BC,d),
 * dV (BC,dv), Q (BR,d), dO (BR,dv), S (BR,BC), dP (BR,BC), dQ (BR,d). */
typedef struct bwd_scratch {
    float *k, *kt, *vt, *dk, *dv, *q, *dout, *s, *dp, *dq;
} bwd_scratch;

static size_t scratch_floats(const mha_attn_problem *p) {
    return (size_t)(3 * BC * p->d + BC * p->dv + BC * p->dv + BR * p->d + BR * p->dv +
                    2 * BR * BC + BR * p->d);
}

static void scratch_split(const mha_attn_problem *p, float *base, bwd_scratch *w) {
    w->k = base, base += BC * p->d;
    w->kt = base, base += BC * p->d;
    w->vt = base, base += BC * p->dv;
    w->dk = base, base += BC * p->d;
    w->dv = base, base += BC * p->dv;
    w->q = base, base += BR * p->d;
    w->dout = base, base += BR * p->dv;
    w->s = base, base += BR * BC;
    w->dp = base, base += BR * BC;
    w->dq = base;
}

typedef struct bwd_ctx {
    const mha_attn_problem *p;
    const mha_attn_grad *g;
    const float *lse, *delta; /* (B*Hq*L) row statistics                     */
    float *dq_part;           /* (nsplit, B*Hq*L, d) partial dQ, or NULL     */
    int64_t nblk, nsplit;
    bool plain;               /* bias is 0 or causal -inf (no mask tensors,
                                 window, key lengths, ALiBi)                 */
} bwd_ctx;

/* One query tile [i0, i0+nr) of head h against the packed key block
 * [j0, j0+nc): accumulates w->dk, w->dv and the split's dQ partial. */
static void tile_backward(const bwd_ctx *c, bwd_scratch *w, int64_t b, int64_t h, int64_t i0,
                          int64_t nr, int64_t j0, int64_t nc, float *dq_part) {
    const mha_attn_problem *p = c->p;
    const mha_attn_grad *g = c->g;
    const int64_t d = p->d, dvd = p->dv;
    const float scale = p->scale;
    const float keep_scale = p->dropout ? 1.0f / (1.0f - p->dropout_p) : 1.0f;
    const float *qv = p->q.data, *dov = g->dout.data;
    const int64_t row0 = (b * p->Hq + h) * p->L;

    /* pack Q and dO rows; S = Q K^T, dP = dO V^T */
    for (int64_t r = 0; r < nr; r++) {
        const int64_t i = i0 + r;
        const int64_t q0 = b * p->q.stride[0] + h * p->q.stride[1] + i * p->q.stride[2];
        const int64_t o0 = b * g->dout.stride[0] + h * g->dout.stride[1] + i * g->dout.stride[2];
        for (int64_t x = 0; x < d; x++)
            w->q[r * d + x] = qv[q0 + x * p->q.stride[3]];
        for (int64_t x = 0; x < dvd; x++)
            w->dout[r * dvd + x] = dov[o0 + x * g->dout.stride[3]];
        float *s = w->s + r * BC, *dp = w->dp + r * BC;
        memset(s, 0, sizeof(float) * BC);
        memset(dp, 0, sizeof(float) * BC);
        for (int64_t x = 0; x < d; x++) {
            const float a = w->q[r * d + x], *kt = w->kt + x * BC;
#pragma omp simd
            for (int jj = 0; jj < BC; jj++)
                s[jj] += a * kt[jj];
        }
        for (int64_t x = 0; x < dvd; x++) {
            const float a = w->dout[r * dvd + x], *vt = w->vt + x * BC;
#pragma omp simd
            for (int jj = 0; jj < BC; jj++)
                dp[jj] += a * vt[jj];
        }
    }

    /* P, dS (into s); dV += (P Z)^T dO */
    for (int64_t r = 0; r < nr; r++) {
        const int64_t i = i0 + r;
        const float lse = c->lse[row0 + i], D = c->delta[row0 + i];
        float *s = w->s + r * BC;
        const float *dp = w->dp + r * BC;
        int64_t lim = nc; /* columns visible under causal */
        if (p->causal != MHA_CAUSAL_NONE) {
            int64_t last = i + mha_attn_offset(p, b) - j0; /* last visible column */
            lim = last < 0 ? 0 : last + 1 < nc ? last + 1 : nc;
        }
        if (lse == -INFINITY)
            lim = 0; /* fully masked row */
        for (int64_t jj = 0; jj < BC; jj++) {
            float bias = 0.0f;
            if (jj < lim && !c->plain)
                bias = mha_attn_bias(p, b, h, i, j0 + jj);
            if (jj >= lim || bias == -INFINITY) {
                s[jj] = 0.0f;
                continue;
            }
            float sc = s[jj] * scale, dcap = 1.0f;
            if (p->softcap > 0.0f) { /* s = cap tanh(sc/cap): ds/dsc = 1 - tanh^2 */
                float t = tanhf(sc / p->softcap);
                sc = p->softcap * t;
                dcap = 1.0f - t * t;
            }
            float pr = expf(sc + bias - lse);
            float z = keep_scale;
            if (p->dropout && mha_dropout_uniform(p->seed, b, h, i, j0 + jj) < p->dropout_p)
                z = 0.0f;
            const float pz = pr * z;
            if (pz != 0.0f) {
                float *dvr = w->dv + jj * dvd;
                const float *dor = w->dout + r * dvd;
#pragma omp simd
                for (int64_t x = 0; x < dvd; x++)
                    dvr[x] += pz * dor[x];
            }
            s[jj] = pr * (z * dp[jj] - D) * dcap;
        }
    }

    /* dK += dS^T Q, dQ += dS K (scale applied when the block/row is stored) */
    for (int64_t r = 0; r < nr; r++) {
        const float *s = w->s + r * BC, *qr = w->q + r * d;
        float *dqr = w->dq + r * d;
        memset(dqr, 0, sizeof(float) * (size_t)d);
        for (int64_t jj = 0; jj < nc; jj++) {
            const float ds = s[jj];
            if (ds == 0.0f)
                continue; /* masked or exactly zero: skip, never 0 * Inf */
            float *dkr = w->dk + jj * d;
            const float *kr = w->k + jj * d;
#pragma omp simd
            for (int64_t x = 0; x < d; x++) {
                dkr[x] += ds * qr[x];
                dqr[x] += ds * kr[x];
            }
        }
        if (dq_part) {
            float *dst = dq_part + (row0 + i0 + r) * d;
#pragma omp simd
            for (int64_t x = 0; x < d; x++)
                dst[x] += scale * dqr[x];
        }
    }
}

/* Task (b, kv head hk, split): key blocks [lo, hi). */
static void task_backward(const bwd_ctx *c, bwd_scratch *w, int64_t b, int64_t hk, int64_t split) {
    const mha_attn_problem *p = c->p;
    const mha_attn_grad *g = c->g;
    const int64_t d = p->d, dvd = p->dv, G = p->Hq / p->Hkv;
    const int64_t lo = c->nblk * split / c->nsplit, hi = c->nblk * (split + 1) / c->nsplit;
    float *dq_part = c->dq_part ? c->dq_part + split * (p->B * p->Hq * p->L * d) : NULL;
    const float *kv = p->k.data, *vv = p->v.data;
    const int64_t k0 = b * p->k.stride[0] + hk * p->k.stride[1];
    const int64_t v0 = b * p->v.stride[0] + hk * p->v.stride[1];

    for (int64_t blk = lo; blk < hi; blk++) {
        const int64_t j0 = blk * BC, nc = p->S - j0 < BC ? p->S - j0 : BC;
        memset(w->kt, 0, sizeof(float) * (size_t)(BC * d));
        memset(w->vt, 0, sizeof(float) * (size_t)(BC * dvd));
        memset(w->dk, 0, sizeof(float) * (size_t)(BC * d));
        memset(w->dv, 0, sizeof(float) * (size_t)(BC * dvd));
        for (int64_t jj = 0; jj < nc; jj++) {
            for (int64_t x = 0; x < d; x++) {
                float val = kv[k0 + (j0 + jj) * p->k.stride[2] + x * p->k.stride[3]];
                w->k[jj * d + x] = val;
                w->kt[x * BC + jj] = val;
            }
            for (int64_t x = 0; x < dvd; x++)
                w->vt[x * BC + jj] = vv[v0 + (j0 + jj) * p->v.stride[2] + x * p->v.stride[3]];
        }
        /* a non-finite K/V value in a column some row masks must not leak
         * through S or dP into other columns: each column's S/dP entry only
         * depends on its own key, and masked columns are zeroed per element. */
        for (int64_t h = hk * G; h < (hk + 1) * G; h++)
            for (int64_t i0 = 0; i0 < p->L; i0 += BR) {
                const int64_t nr = p->L - i0 < BR ? p->L - i0 : BR;
                if (p->causal != MHA_CAUSAL_NONE && j0 > i0 + nr - 1 + mha_attn_offset(p, b))
                    continue; /* the whole tile is above the diagonal */
                tile_backward(c, w, b, h, i0, nr, j0, nc, dq_part);
            }
        if (g->dk.data) {
            float *dst = g->dk.data;
            for (int64_t jj = 0; jj < nc; jj++)
                for (int64_t x = 0; x < d; x++)
                    dst[b * g->dk.stride[0] + hk * g->dk.stride[1] + (j0 + jj) * g->dk.stride[2] +
                        x * g->dk.stride[3]] += p->scale * w->dk[jj * d + x];
        }
        if (g->dv.data) {
            float *dst = g->dv.data;
            for (int64_t jj = 0; jj < nc; jj++)
                for (int64_t x = 0; x < dvd; x++)
                    dst[b * g->dv.stride[0] + hk * g->dv.stride[1] + (j0 + jj) * g->dv.stride[2] +
                        x * g->dv.stride[3]] += w->dv[jj * dvd + x];
        }
    }
}

mha_status mha_attn_bwd_f32_flash(const mha_attn_problem *p, const mha_attn_grad *g) {
    const int64_t rows = p->B * p->Hq * p->L, pairs = p->B * p->Hkv;
    if (rows == 0 || p->S == 0)
        return MHA_OK; /* no key: every row fully masked, zero gradient */
    const int nthreads = mha_threads();
    bwd_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p, c.g = g;
    c.plain = p->mask.data == NULL && p->kpm.data == NULL && !p->window &&
              p->kv_len.data == NULL && p->alibi.data == NULL;
    c.nblk = (p->S + BC - 1) / BC;
    c.nsplit = 1;
    if (pairs < TASKS_WANTED) {
        c.nsplit = (TASKS_WANTED + pairs - 1) / pairs;
        if (c.nsplit > c.nblk)
            c.nsplit = c.nblk;
    }

    /* one allocation: lse, delta (rows each), dQ partials, thread scratch */
    const size_t per = scratch_floats(p);
    const size_t n_part = g->dq.data ? (size_t)c.nsplit * (size_t)rows * (size_t)p->d : 0;
    size_t total = 2 * (size_t)rows + n_part + per * (size_t)nthreads;
    float *buf = mha_malloc(sizeof(float) * total);
    if (!buf)
        return mha_error(MHA_ERR_NOMEM, "attention backward: cannot allocate %zu floats", total);
    float *lse = buf, *delta = buf + rows;
    c.dq_part = n_part ? delta + rows : NULL;
    float *scratch = delta + rows + n_part;
    if (n_part)
        memset(c.dq_part, 0, sizeof(float) * n_part);

    mha_status st = MHA_OK;
    const bool have_lse = g->lse.data != NULL, have_out = g->out.data != NULL;
    if (!have_lse || !have_out)
        st = mha_attn_row_stats(p, g, lse, have_out ? NULL : delta);
    if (st != MHA_OK) {
        mha_free(buf);
        return st;
    }
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t i = r % p->L, h = (r / p->L) % p->Hq, b = r / (p->L * p->Hq);
        if (have_lse)
            lse[r] = ((const float *)g->lse.data)[b * g->lse.stride[0] + h * g->lse.stride[1] +
                                                  i * g->lse.stride[2]];
        if (have_out) {
            const float *o = g->out.data, *dO = g->dout.data;
            const int64_t o0 = b * g->out.stride[0] + h * g->out.stride[1] + i * g->out.stride[2];
            const int64_t d0 =
                b * g->dout.stride[0] + h * g->dout.stride[1] + i * g->dout.stride[2];
            double D = 0.0;
            for (int64_t x = 0; x < p->dv; x++)
                D += (double)o[o0 + x * g->out.stride[3]] *
                     (double)dO[d0 + x * g->dout.stride[3]];
            delta[r] = (float)D;
        }
    }
    c.lse = lse, c.delta = delta;

    const int64_t tasks = pairs * c.nsplit;
#pragma omp parallel num_threads(nthreads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        bwd_scratch w;
        scratch_split(p, scratch + (size_t)tid * per, &w);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t split = t % c.nsplit, pair = t / c.nsplit;
            task_backward(&c, &w, pair / p->Hkv, pair % p->Hkv, split);
        }
    }

    if (g->dq.data) { /* dq += sum of the split partials, in split order */
        float *dq = g->dq.data;
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            int64_t i = r % p->L, h = (r / p->L) % p->Hq, b = r / (p->L * p->Hq);
            const int64_t q0 = b * g->dq.stride[0] + h * g->dq.stride[1] + i * g->dq.stride[2];
            for (int64_t x = 0; x < p->d; x++) {
                float acc = 0.0f;
                for (int64_t s = 0; s < c.nsplit; s++)
                    acc += c.dq_part[(s * rows + r) * p->d + x];
                dq[q0 + x * g->dq.stride[3]] += acc;
            }
        }
    }
    mha_free(buf);
    return MHA_OK;
}
