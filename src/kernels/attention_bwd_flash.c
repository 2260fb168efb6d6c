/* attention_bwd_flash.c - fused (flash-style) attention backward: the driver
 * shared by every ISA, and the portable inner loops (attention_bwd_avx2.c has
 * the AVX2+FMA ones, attention_bwd_avx512.c the AVX-512 ones).
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
 * 2. Query tiles of BR rows: Q and dO packed once (rows and NR-column
 *    panels).  Tasks (b, kv head, split): a split is a fixed contiguous range
 *    of key blocks.  Per key block: pack K^T, V^T and K panels; then for each
 *    query head of the group and each query tile, through the ISA's
 *    register-blocked product (A read through a row and a column stride;
 *    twelve rows at a time where the product's B is at most 32 columns
 *    (d for dK and dQ, dv for dV) and the ISA has gemm_tall):
 *    S = Q K^T, dP = dO V^T; per row P = exp(scale s + bias - lse), Z the
 *    dropout factor, dS = P (Z dP - D) (row_grad); dV_blk += (P Z)^T dO,
 *    dK_blk += dS^T Q (A = the tile read transposed), dQ_part += dS K.
 *    dK/dV of the block are then added to the caller's (the task owns those
 *    rows); dQ goes to the split's own partial buffer.
 * 3. dq += scale * the sum over splits of the partial buffers (dS K,
 *    unscaled), in split order; with one split (B*Hkv >= 16 pairs) each
 *    task sums its heads' dQ in its thread's workspace and adds it to dq
 *    when it ends (the same operations, without the (B*Hq*L, dp) buffer).
 * The number of splits depends only on the problem size (enough tasks for
 * small B*Hkv), never on the thread count; every task runs the same code
 * wherever it lands, so results are bit-identical for any thread count.
 * Masked entries get P = dS = 0 exactly (selected, never multiplied); a key
 * block, query tile or dO tile holding a NaN/Inf takes a zero-skipping
 * product wherever it is the B operand, so NaN/Inf in masked keys, values or
 * dead rows never reach a gradient.
 */
#include "attention_bwd.h"
#include "attention_bias.h"
#include "attention_short.h" /* mha_attn_short_bwd_ws_floats */

#include <math.h>
#include <string.h>


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
        const int tid = mha_thread_index();
        int64_t i = r % p->L, h = (r / p->L) % p->Hq, b = r / (p->L * p->Hq);
        row_stats(p, g, b, h, i, scratch + (size_t)tid * per, lse + r, delta ? delta + r : NULL);
    }
    mha_free(scratch);
    return MHA_OK;
}

/* ---- portable inner loops ---------------------------------------------------- */

enum { MR = MHA_BWD_MR, NR = MHA_BWD_NR, BR = MHA_BWD_BR, BC = MHA_BWD_BC, TASKS_WANTED = 16 };
_Static_assert(BC % MR == 0 && BC % NR == 0, "a key block is whole row groups and panels");

/* The packed query tiles (Q and dO) of a chunk of (b, kv head) pairs are
 * capped near this size (one pair at least), as the forward's packed K/V
 * (attention_flash.c): a small workspace, read back from cache soon after
 * it is written (at least mha_chunk_items_wanted tasks a chunk).  No
 * result depends on the chunk. */
#define TILE_BUDGET_BYTES ((size_t)1 << 20)

/* With one split a task owns every dQ row of its G heads: they are summed in
 * the thread's workspace (up to this size) and added to dq when the task
 * ends, instead of a (B*Hq*L, dp) partial buffer zeroed, filled and read
 * back in a last pass (three trips to memory: at B32 H12 L128 d32 6 MiB). */
#define DQ_TASK_BUDGET_BYTES ((size_t)256 << 10)

/* c (MR, np*NR) (+)= a (MR, k) . b (np, k, NR); see mha_bwd_isa.gemm. */
static void gemm_scalar(float *c, int64_t ldc, const float *a, int64_t rsa, int64_t csa,
                        const float *b, int64_t pstride, int64_t k, int64_t np, bool acc) {
    for (int64_t pn = 0; pn < np; pn++) {
        const float *bp = b + pn * pstride;
        float t[MR][NR];
        for (int r = 0; r < MR; r++)
            for (int jj = 0; jj < NR; jj++)
                t[r][jj] = acc ? c[r * ldc + pn * NR + jj] : 0.0f;
        for (int64_t x = 0; x < k; x++)
            for (int r = 0; r < MR; r++) {
                const float av = a[r * rsa + x * csa];
                for (int jj = 0; jj < NR; jj++)
                    t[r][jj] += av * bp[x * NR + jj];
            }
        for (int r = 0; r < MR; r++)
            memcpy(c + r * ldc + pn * NR, t[r], sizeof t[r]);
    }
}

static void row_grad_scalar(float *s, float *dp, int64_t n, int64_t lim, float scale,
                            const float *bias, float lse, float D) {
    for (int64_t j = 0; j < n; j++) {
        const float bj = bias ? bias[j] : 0.0f;
        if (j >= lim || bj == -INFINITY) {
            s[j] = dp[j] = 0.0f;
            continue;
        }
        const float x = s[j] * scale + bj - lse;
        if (x < MHA_SOFTMAX_FLUSH_X) { /* P < 1e-30: 0 (see mha_bwd_isa.row_grad) */
            s[j] = dp[j] = 0.0f;
            continue;
        }
        const float pr = expf(x);
        s[j] = pr;
        dp[j] = pr * (dp[j] - D);
    }
}

const mha_bwd_isa mha_bwd_isa_scalar = {"scalar", gemm_scalar, row_grad_scalar, NULL, NULL};

/* The same product skipping a == 0, so a NaN/Inf in b (a key, query or dO
 * row that only masked entries touch) never meets a zero weight.  Used only
 * for blocks holding a non-finite value; same summation order otherwise. */
static void gemm_skip_zero(float *c, int64_t ldc, const float *a, int64_t rsa, int64_t csa,
                           const float *b, int64_t pstride, int64_t k, int64_t np, bool acc) {
    for (int r = 0; r < MR; r++) {
        float *cr = c + r * ldc;
        if (!acc)
            memset(cr, 0, sizeof(float) * (size_t)(np * NR));
        for (int64_t x = 0; x < k; x++) {
            const float av = a[r * rsa + x * csa];
            if (av == 0.0f)
                continue;
            for (int64_t pn = 0; pn < np; pn++)
                for (int jj = 0; jj < NR; jj++)
                    cr[pn * NR + jj] += av * b[pn * pstride + x * NR + jj];
        }
    }
}

/* c (rows, np*NR) += a . b row group by row group, a(r, x) = a[r*rsa +
 * x*csa], rows a multiple of MR: twelve rows at once on gemm_tall where
 * `tall` (np <= 2), else MR; the zero-skipping loop where b holds a
 * non-finite value (`finite` false), so masked entries never multiply it. */
static void product_rows(const mha_bwd_isa *isa, bool tall, bool finite, float *c, int64_t ldc,
                         const float *a, int64_t rsa, int64_t csa, const float *b,
                         int64_t pstride, int64_t k, int64_t np, int64_t rows) {
    for (int64_t g0 = 0; g0 < rows; g0 += MR) {
        if (tall && finite && g0 + 2 * MR <= rows) {
            isa->gemm_tall(c + g0 * ldc, ldc, a + g0 * rsa, rsa, csa, b, pstride, k, np, true);
            g0 += MR;
            continue;
        }
        (finite ? isa->gemm : gemm_skip_zero)(c + g0 * ldc, ldc, a + g0 * rsa, rsa, csa, b,
                                               pstride, k, np, true);
    }
}

/* ---- the fused backward ---------------------------------------------------- */

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Per-thread workspace (floats, each array on its own 64-byte line). */
typedef struct bwd_ws {
    float *kt;   /* (BC/NR, d, NR)  K^T panels of the key block       */
    float *vt;   /* (BC/NR, dv, NR) V^T panels                         */
    float *kp;   /* (dp/NR, BC, NR) K panels                           */
    float *dk;   /* (BC, dp)  dK of the block (unscaled)               */
    float *dv;   /* (BC, dvp) dV of the block                          */
    float *s;    /* (BR, BC)  S, then P (times the dropout factor)     */
    float *dp;   /* (BR, BC)  dP, then dS                              */
    float *bias; /* (BC)      one row's additive bias                  */
    float *dq;   /* (MR, dp)  dS K of a tile's last, partial row group  */
    float *dqt;  /* (G*L, dp) the task's dQ / scale (dq_task), else empty */
} bwd_ws;

typedef struct bwd_ctx {
    const mha_attn_problem *p;
    const mha_attn_grad *g;
    const mha_bwd_isa *isa;
    const float *lse, *delta; /* (B*Hq*L) row statistics                     */
    float *dq_part;           /* (nsplit, B*Hq*L, dp) dQ / scale partials    */
    bool dq_task;             /* one split: dQ summed per task (bwd_ws.dqt)  */
    float *tiles;             /* (chunk*G, ntile, tile_floats) packed Q and dO
                                 of the heads bh0.. of the chunk of pairs   */
    int64_t bh0;
    int64_t nblk, nsplit, dp, dvp, ntile, tile_floats;
    bool plain;               /* bias is 0 or causal -inf (no mask tensors,
                                 window, key lengths, ALiBi)                 */
    bool scalar_rows;         /* dropout or softcap: per-element epilogue    */
    const bool *served;       /* (B*Hkv) pairs the whole rows did, or NULL   */
} bwd_ctx;

static size_t ws_layout(const bwd_ctx *c, float *base, bwd_ws *w) {
    const int64_t d = c->p->d, dv = c->p->dv, dp = c->dp, dvp = c->dvp;
    const int64_t dqt = c->dq_task ? (c->p->Hq / c->p->Hkv) * c->p->L * dp : 0;
    const size_t sizes[10] = {(size_t)(BC * d),   (size_t)(BC * dv),  (size_t)(dp * BC),
                              (size_t)(BC * dp),  (size_t)(BC * dvp), (size_t)(BR * BC),
                              (size_t)(BR * BC),  BC,                 (size_t)(MR * dp),
                              (size_t)dqt};
    float **dst[10] = {&w->kt, &w->vt, &w->kp,   &w->dk, &w->dv,
                       &w->s,  &w->dp, &w->bias, &w->dq, &w->dqt};
    size_t off = 0;
    for (int i = 0; i < 10; i++) {
        if (base)
            *dst[i] = base + off;
        off += (sizes[i] + 15) / 16 * 16;
    }
    return off;
}

/* 0x80000000 when some of x[0..n) is inf or NaN (exponent bits all ones),
 * else 0.  Integer operations only, so the loop vectorises: the packing's
 * per-element isfinite branch had taken a tenth of a short backward (B32
 * H12 L128 d32, perf on the Xeon). */
static uint32_t nonfinite_bits(const float *x, int64_t n) {
    uint32_t acc = 0;
#pragma omp simd reduction(| : acc) /* -O2 alone left it one float a step */
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, sizeof b);
        acc |= ((b & 0x7f800000u) + 0x00800000u) & 0x80000000u;
    }
    return acc;
}

/* rows (n, k) of src (row r at src + r*rs, column x at + x*cs) into row-major
 * dst (n, k) and panels pk (kp/NR, ld, NR); returns false on a non-finite
 * value.  Rows n..rows_to of dst are zeroed; the columns k..kp of the last
 * panel are zero (its other rows too), the rows n..ld of the other panels
 * are left as they were (the products read rows < n only). */
static bool pack_rows(const float *src, int64_t rs, int64_t cs, int64_t n, int64_t k,
                      int64_t rows_to, int64_t ld, float *dst, float *pk) {
    uint32_t bad = 0;
    const int64_t kp = round_up(k, NR);
    if (k < kp)
        memset(pk + (kp / NR - 1) * ld * NR, 0, sizeof(float) * (size_t)(ld * NR));
    for (int64_t r = 0; r < n; r++) {
        const float *sr = src + r * rs;
        if (cs == 1) { /* a contiguous row: one test, then NR floats a copy
                          of constant size (inlined; the library call per
                          short copy had been 16 % of a d = 32 backward) */
            bad |= nonfinite_bits(sr, k);
            int64_t x0 = 0;
            for (; x0 + NR <= k; x0 += NR) {
                memcpy(pk + (x0 / NR) * ld * NR + r * NR, sr + x0, sizeof(float) * NR);
                if (dst)
                    memcpy(dst + r * k + x0, sr + x0, sizeof(float) * NR);
            }
            if (x0 < k) {
                memcpy(pk + (x0 / NR) * ld * NR + r * NR, sr + x0, sizeof(float) * (size_t)(k - x0));
                if (dst)
                    memcpy(dst + r * k + x0, sr + x0, sizeof(float) * (size_t)(k - x0));
            }
            continue;
        }
        for (int64_t x0 = 0; x0 < k; x0 += NR) { /* strided: element by element */
            float *pr = pk + (x0 / NR) * ld * NR + r * NR;
            const int64_t w = k - x0 < NR ? k - x0 : NR;
            for (int64_t x = 0; x < w; x++)
                pr[x] = sr[(x0 + x) * cs];
            bad |= nonfinite_bits(pr, w);
            if (dst)
                memcpy(dst + r * k + x0, pr, sizeof(float) * (size_t)w);
        }
    }
    if (dst && rows_to > n)
        memset(dst + n * k, 0, sizeof(float) * (size_t)((rows_to - n) * k));
    return bad == 0;
}

/* K^T-style panels (n/NR, k, NR) of rows (n, k): column r of panel r/NR;
 * the columns n..NR of a last partial panel are zero (the products read
 * the panels up to it only).  No finiteness test: the K rows' is
 * pack_rows's (the K panels of the same block), and a non-finite V only
 * reaches dP columns of its own key, which the epilogue replaces with 0
 * where masked. */
static void pack_cols(const mha_bwd_isa *isa, const float *src, int64_t rs, int64_t cs,
                      int64_t n, int64_t k, float *pk) {
    for (int64_t r0 = 0; r0 < n; r0 += NR) {
        float *panel = pk + (r0 / NR) * k * NR;
        const int64_t w = n - r0 < NR ? n - r0 : NR;
        if (cs == 1 && isa->transpose_rows) { /* register tiles (the one-float
                                                 loop was 12 % of a d = 32
                                                 backward) */
            isa->transpose_rows(panel, src + r0 * rs, rs, w, k);
            continue;
        }
        if (w < NR)
            memset(panel, 0, sizeof(float) * (size_t)(k * NR));
        for (int64_t rr = 0; rr < w; rr++) {
            const float *sr = src + (r0 + rr) * rs;
            for (int64_t x = 0; x < k; x++)
                panel[x * NR + rr] = sr[x * cs];
        }
    }
}

/* Columns of key block [j0, j0+nc) that query row i may see (causal). */
static int64_t visible(const mha_attn_problem *p, int64_t b, int64_t i, int64_t j0, int64_t nc) {
    if (p->causal == MHA_CAUSAL_NONE)
        return nc;
    return clamp64(i + mha_attn_offset(p, b) + 1 - j0, 0, nc);
}

/* Per-element epilogue with dropout and/or softcap (scalar). */
static void row_grad_general(const bwd_ctx *c, float *s, float *dp, int64_t lim,
                             const float *bias, float lse, float D, int64_t b, int64_t h,
                             int64_t i, int64_t j0) {
    const mha_attn_problem *p = c->p;
    const float keep_scale = p->dropout ? 1.0f / (1.0f - p->dropout_p) : 1.0f;
    for (int64_t j = 0; j < BC; j++) {
        const float bj = bias ? bias[j] : 0.0f;
        if (j >= lim || bj == -INFINITY) {
            s[j] = dp[j] = 0.0f;
            continue;
        }
        float sc = s[j] * p->scale, dcap = 1.0f;
        if (p->softcap > 0.0f) { /* s = cap tanh(sc/cap): ds/dsc = 1 - tanh^2 */
            const float t = tanhf(sc / p->softcap);
            sc = p->softcap * t;
            dcap = 1.0f - t * t;
        }
        const float pr = mha_softmax_weight(sc + bj - lse);
        float z = keep_scale;
        if (p->dropout && mha_dropout_uniform(p->seed, b, h, i, j0 + j) < p->dropout_p)
            z = 0.0f;
        s[j] = pr * z;
        dp[j] = (z == 0.0f ? -pr * D : pr * (z * dp[j] - D)) * dcap;
    }
}

/* The packed query tile t of row block bh = b*Hq + h, each part on its own
 * 64-byte line: Q rows (BR, d) and panels (dp/NR, BR, NR), dO rows (BR, dv)
 * and panels (dvp/NR, BR, NR), then one float: 1 when all are finite.
 * Packed once before the key blocks, which all reuse it. */
typedef struct bwd_tile {
    float *q, *qp, *dout, *dop, *finite;
} bwd_tile;

static int64_t tile_layout(const bwd_ctx *c, float *base, bwd_tile *t) {
    const int64_t sizes[5] = {BR * c->p->d, c->dp * BR, BR * c->p->dv, c->dvp * BR, 1};
    float **dst[5] = {&t->q, &t->qp, &t->dout, &t->dop, &t->finite};
    int64_t off = 0;
    for (int i = 0; i < 5; i++) {
        if (base)
            *dst[i] = base + off;
        off += round_up(sizes[i], 16);
    }
    return off;
}

static void pack_tile(const bwd_ctx *c, int64_t bh, int64_t qt) {
    const mha_attn_problem *p = c->p;
    const mha_attn_grad *g = c->g;
    const int64_t b = bh / p->Hq, h = bh % p->Hq, i0 = qt * BR;
    const int64_t nr = p->L - i0 < BR ? p->L - i0 : BR;
    bwd_tile t;
    tile_layout(c, c->tiles + ((bh - c->bh0) * c->ntile + qt) * c->tile_floats, &t);
    const float *qsrc = (const float *)p->q.data + b * p->q.stride[0] + h * p->q.stride[1] +
                        i0 * p->q.stride[2];
    const float *osrc = (const float *)g->dout.data + b * g->dout.stride[0] +
                        h * g->dout.stride[1] + i0 * g->dout.stride[2];
    bool fin = pack_rows(qsrc, p->q.stride[2], p->q.stride[3], nr, p->d, BR, BR, t.q, t.qp);
    bool ofin = pack_rows(osrc, g->dout.stride[2], g->dout.stride[3], nr, p->dv, BR, BR, t.dout,
                          t.dop);
    t.finite[0] = (float)(fin ? 1 : 0) + (float)(ofin ? 2 : 0);
}

/* One query tile [i0, i0+nr) of head h against the packed key block
 * [j0, j0+nc): adds into w->dk, w->dv and dq_head (L, dp), head h's rows
 * of dQ / scale (NULL: dQ not wanted). */
static void tile_backward(const bwd_ctx *c, bwd_ws *w, int64_t b, int64_t h, int64_t i0,
                          int64_t nr, int64_t j0, int64_t nc, bool kfinite, float *dq_head) {
    const mha_attn_problem *p = c->p;
    const mha_bwd_isa *isa = c->isa;
    const int64_t d = p->d, dvd = p->dv, dp = c->dp, dvp = c->dvp;
    const int64_t nrp = round_up(nr, MR), row0 = (b * p->Hq + h) * p->L;

    /* the packed Q and dO: rows (A of S, dP) and panels (B of dK, dV) */
    bwd_tile t;
    tile_layout(c, c->tiles + ((b * p->Hq + h - c->bh0) * c->ntile + i0 / BR) * c->tile_floats,
                &t);
    const int fin = (int)t.finite[0];
    const bool qfinite = (fin & 1) != 0, ofinite = (fin & 2) != 0;

    /* S = Q K^T, dP = dO V^T per group of MR rows, only over the panels the
     * group's last row can see */
    int64_t ncv = 0; /* columns any row of the tile sees */
    for (int64_t g0 = 0; g0 < nrp; g0 += MR) {
        const int64_t ng = visible(p, b, i0 + (g0 + MR < nr ? g0 + MR : nr) - 1, j0, nc);
        if (ng == 0)
            continue;
        const int64_t np = (ng + NR - 1) / NR;
        isa->gemm(w->s + g0 * BC, BC, t.q + g0 * d, d, 1, w->kt, d * NR, d, np, false);
        isa->gemm(w->dp + g0 * BC, BC, t.dout + g0 * dvd, dvd, 1, w->vt, dvd * NR, dvd, np,
                  false);
        ncv = ng > ncv ? ng : ncv;
    }
    if (ncv == 0)
        return;

    /* P (times Z) into s, dS into dp; every column the products below read
     * (< ncvp: dV and dK; < ncv: dQ) of every row is written, up to whole
     * NR-column chunks (<= BC, both multiples of MR and NR) */
    const int64_t ncw = round_up(round_up(ncv, MR), NR);
    for (int64_t r = 0; r < nrp; r++) {
        float *s = w->s + r * BC, *dpr = w->dp + r * BC;
        const int64_t i = i0 + r;
        const float lse = r < nr ? c->lse[row0 + i] : -INFINITY;
        const float D = r < nr ? c->delta[row0 + i] : 0.0f;
        int64_t lim = r < nr && lse != -INFINITY ? visible(p, b, i, j0, nc) : 0;
        const float *bias = NULL;
        if (lim > 0 && !c->plain) {
            for (int64_t j = 0; j < lim; j++)
                w->bias[j] = mha_attn_bias(p, b, h, i, j0 + j);
            bias = w->bias;
        }
        if (c->scalar_rows && lim > 0)
            row_grad_general(c, s, dpr, lim, bias, lse, D, b, h, i, j0);
        else
            isa->row_grad(s, dpr, ncw, lim, p->scale, bias, lse, D);
    }

    /* dV += (P Z)^T dO and dK += dS^T Q over the key rows some query sees
     * (A = the tile read transposed); dQ_tile = dS K.  Twelve rows at once
     * where B is at most 2 panels (d <= 32 for dK and dQ, dv <= 32 for dV). */
    const int64_t ncvp = round_up(ncv, MR);
    const bool tall_k = isa->gemm_tall && dp <= 2 * NR, tall_v = isa->gemm_tall && dvp <= 2 * NR;
    product_rows(isa, tall_v, ofinite, w->dv, dvp, w->s, 1, BC, t.dop, BR * NR, nr, dvp / NR,
                 ncvp);
    product_rows(isa, tall_k, qfinite, w->dk, dp, w->dp, 1, BC, t.qp, BR * NR, nr, dp / NR, ncvp);
    if (!dq_head)
        return;
    /* whole groups of MR rows accumulate into their rows of dq_head (the
     * product loads and stores them); a last group with rows past nr (zero
     * dS rows, whose stores would reach the next head's rows, which another
     * task may be updating) goes through w->dq, and its real rows are added */
    const int64_t whole = nr / MR * MR;
    product_rows(isa, tall_k, kfinite, dq_head + i0 * dp, dp, w->dp, BC, 1, w->kp, BC * NR, ncv,
                 dp / NR, whole);
    if (whole < nrp)
        (kfinite ? isa->gemm : gemm_skip_zero)(w->dq, dp, w->dp + whole * BC, BC, 1, w->kp,
                                                BC * NR, ncv, dp / NR, false);
    for (int64_t r = whole; r < nr; r++) {
        float *restrict dst = dq_head + (i0 + r) * dp;
        const float *restrict src = w->dq + (r - whole) * dp;
#pragma omp simd
        for (int64_t x = 0; x < d; x++)
            dst[x] += src[x];
    }
}

/* Rows [j0, j0+n) of head (b, h) of t (B,H,*,k) += f * src (n, k) rows ld
 * apart: a task's block of dK or dV into the caller's gradient. */
static void add_rows(const mha_tensor *t, int64_t b, int64_t h, int64_t j0, int64_t n, int64_t k,
                     float f, const float *src, int64_t ld) {
    float *base = (float *)t->data + b * t->stride[0] + h * t->stride[1];
    for (int64_t j = 0; j < n; j++) {
        float *restrict dr = base + (j0 + j) * t->stride[2];
        const float *restrict sr = src + j * ld;
        if (t->stride[3] == 1) {
#pragma omp simd
            for (int64_t x = 0; x < k; x++)
                dr[x] += f * sr[x];
        } else {
            for (int64_t x = 0; x < k; x++)
                dr[x * t->stride[3]] += f * sr[x];
        }
    }
}

/* dq row i of head (b, h) += scale * the sum of nsplit partial rows (part,
 * part + split_stride, ...), in split order. */
static void add_dq_row(const bwd_ctx *c, int64_t b, int64_t h, int64_t i, const float *part,
                       int64_t nsplit, size_t split_stride) {
    const mha_attn_problem *p = c->p;
    const mha_tensor *dq = &c->g->dq;
    const int64_t cs = dq->stride[3];
    float *restrict dqr = (float *)dq->data + b * dq->stride[0] + h * dq->stride[1] +
                          i * dq->stride[2];
    if (cs == 1 && nsplit == 1) { /* the same operations as below, acc = 0 + part */
#pragma omp simd
        for (int64_t x = 0; x < p->d; x++)
            dqr[x] += p->scale * (0.0f + part[x]);
        return;
    }
    if (cs == 1) { /* the same sums, 64 columns at a time in SIMD lanes */
        for (int64_t x0 = 0; x0 < p->d; x0 += 64) {
            const int64_t nx = p->d - x0 < 64 ? p->d - x0 : 64;
            float acc[64] = {0};
            for (int64_t s = 0; s < nsplit; s++) {
                const float *restrict ps = part + (size_t)s * split_stride + x0;
#pragma omp simd
                for (int64_t x = 0; x < nx; x++)
                    acc[x] += ps[x];
            }
#pragma omp simd
            for (int64_t x = 0; x < nx; x++)
                dqr[x0 + x] += p->scale * acc[x];
        }
        return;
    }
    for (int64_t x = 0; x < p->d; x++) { /* each element summed in split order */
        float acc = 0.0f;
        for (int64_t s = 0; s < nsplit; s++)
            acc += part[(size_t)s * split_stride + x];
        dqr[x * cs] += p->scale * acc;
    }
}

/* Task (b, kv head hk, split): key blocks [lo, hi). */
static void task_backward(const bwd_ctx *c, bwd_ws *w, int64_t b, int64_t hk, int64_t split) {
    const mha_attn_problem *p = c->p;
    const mha_attn_grad *g = c->g;
    const int64_t d = p->d, dvd = p->dv, G = p->Hq / p->Hkv, dp = c->dp, dvp = c->dvp;
    const int64_t lo = c->nblk * split / c->nsplit, hi = c->nblk * (split + 1) / c->nsplit;
    /* dQ / scale of head h: rows (L, dp) from dq_rows + (h - hk*G) * L * dp */
    float *dq_rows = c->dq_part ? c->dq_part + (split * p->B * p->Hq + (b * p->Hq + hk * G)) *
                                                   p->L * dp
                   : c->dq_task ? w->dqt
                                : NULL;
    if (c->dq_task)
        memset(w->dqt, 0, sizeof(float) * (size_t)(G * p->L * dp));
    const float *kbase = (const float *)p->k.data + b * p->k.stride[0] + hk * p->k.stride[1];
    const float *vbase = (const float *)p->v.data + b * p->v.stride[0] + hk * p->v.stride[1];

    for (int64_t blk = lo; blk < hi; blk++) {
        const int64_t j0 = blk * BC, nc = p->S - j0 < BC ? p->S - j0 : BC;
        const float *ksrc = kbase + j0 * p->k.stride[2], *vsrc = vbase + j0 * p->v.stride[2];
        pack_cols(c->isa, ksrc, p->k.stride[2], p->k.stride[3], nc, d, w->kt);
        pack_cols(c->isa, vsrc, p->v.stride[2], p->v.stride[3], nc, dvd, w->vt);
        const bool kfinite =
            pack_rows(ksrc, p->k.stride[2], p->k.stride[3], nc, d, 0, BC, NULL, w->kp);
        if (nc < BC) /* rows past S of the K panels */
            for (int64_t pn = 0; pn < dp / NR; pn++)
                memset(w->kp + pn * BC * NR + nc * NR, 0, sizeof(float) * (size_t)((BC - nc) * NR));
        memset(w->dk, 0, sizeof(float) * (size_t)(BC * dp));
        memset(w->dv, 0, sizeof(float) * (size_t)(BC * dvp));
        for (int64_t h = hk * G; h < (hk + 1) * G; h++)
            for (int64_t i0 = 0; i0 < p->L; i0 += BR) {
                const int64_t nr = p->L - i0 < BR ? p->L - i0 : BR;
                if (p->causal != MHA_CAUSAL_NONE && j0 > i0 + nr - 1 + mha_attn_offset(p, b))
                    continue; /* the whole tile is above the diagonal */
                tile_backward(c, w, b, h, i0, nr, j0, nc, kfinite,
                              dq_rows ? dq_rows + (h - hk * G) * p->L * dp : NULL);
            }
        if (g->dk.data)
            add_rows(&g->dk, b, hk, j0, nc, d, p->scale, w->dk, dp);
        if (g->dv.data)
            add_rows(&g->dv, b, hk, j0, nc, dvd, 1.0f, w->dv, dvp);
    }
    if (c->dq_task) /* (index arithmetic, no divisions: they had been most of this) */
        for (int64_t h = hk * G; h < (hk + 1) * G; h++)
            for (int64_t i = 0; i < p->L; i++)
                add_dq_row(c, b, h, i, w->dqt + ((h - hk * G) * p->L + i) * dp, 1, 0);
}

/* Row r of the (B, Hq, L) row order as (b, h, i): row_at divides once,
 * row_next steps without dividing (the per-row divisions had been most of
 * the loops over rows below).  The loops take ROWS_PER_STEP rows per
 * cursor. */
enum { ROWS_PER_STEP = 64 };
typedef struct row_cursor {
    int64_t b, h, i;
} row_cursor;

static row_cursor row_at(const mha_attn_problem *p, int64_t r) {
    return (row_cursor){r / (p->L * p->Hq), (r / p->L) % p->Hq, r % p->L};
}

static void row_next(const mha_attn_problem *p, row_cursor *at) {
    if (++at->i == p->L) { /* the next head's first row */
        at->i = 0;
        if (++at->h == p->Hq)
            at->h = 0, at->b++;
    }
}

/* Row i of head (b, h) from what the forward saved: *lse (non-NULL) its
 * saved log-sum-exp; *delta (non-NULL) = dO_i . O_i in float64. */
static void saved_row_stats(const mha_attn_grad *g, int64_t dv, int64_t b, int64_t h, int64_t i,
                            float *lse, float *delta) {
    if (lse)
        *lse = ((const float *)g->lse.data)[b * g->lse.stride[0] + h * g->lse.stride[1] +
                                            i * g->lse.stride[2]];
    if (!delta)
        return;
    const float *o = g->out.data, *dO = g->dout.data;
    const int64_t o0 = b * g->out.stride[0] + h * g->out.stride[1] + i * g->out.stride[2];
    const int64_t d0 = b * g->dout.stride[0] + h * g->dout.stride[1] + i * g->dout.stride[2];
    const int64_t so = g->out.stride[3], sd = g->dout.stride[3];
    double D = 0.0;
    if (so == 1 && sd == 1) { /* in SIMD lanes: one chain of dependent double
                                 adds per row had been 5 % of a d = 32
                                 backward */
#pragma omp simd reduction(+ : D)
        for (int64_t x = 0; x < dv; x++)
            D += (double)o[o0 + x] * (double)dO[d0 + x];
    } else
        for (int64_t x = 0; x < dv; x++)
            D += (double)o[o0 + x * so] * (double)dO[d0 + x * sd];
    *delta = (float)D;
}

/* Whether the tiles still owe pair its gradients (the whole rows did not
 * serve it). */
static bool tiles_take(const bwd_ctx *c, int64_t pair) { return !c->served || !c->served[pair]; }

bool mha_attn_bwd_rows_serve(const mha_attn_problem *p, const mha_attn_grad *g) {
    const mha_tensor *t[7] = {&p->q, &p->k, &p->v, &g->dout, &g->dq, &g->dk, &g->dv};
    for (int i = 0; i < 7; i++)
        if (t[i]->data && (t[i]->dtype != MHA_F32 || t[i]->stride[3] != 1))
            return false;
    /* causal masking off, or on the main diagonal (L = S, row i sees keys
     * 0..i) */
    const bool diagonal = p->causal == MHA_CAUSAL_NONE ||
                          (p->L == p->S && p->offsets.data == NULL && !p->bottom_right_kv &&
                           p->causal_offset == 0);
    const bool plain = p->mask.data == NULL && p->kpm.data == NULL && !p->window &&
                       p->kv_len.data == NULL && p->alibi.data == NULL && diagonal &&
                       !p->dropout && !(p->softcap > 0.0f);
    const int64_t dmax = p->d > p->dv ? p->d : p->dv, G = p->Hq / p->Hkv;
    const double bound =
        p->causal == MHA_CAUSAL_NONE ? MHA_BWD_ROWS_MAX_SD : MHA_BWD_ROWS_CAUSAL_MAX_SD;
    return plain && p->S > 0 && (double)p->S * (double)dmax <= bound &&
           (double)G * (double)p->L * (double)round_up(p->d, 32) * sizeof(float) <=
               (double)DQ_TASK_BUDGET_BYTES;
}

mha_status mha_attn_bwd_flash_run(const mha_attn_problem *p, const mha_attn_grad *g,
                                  const mha_bwd_isa *isa, mha_bwd_pair_rows_fn whole_rows) {
    const int64_t rows = p->B * p->Hq * p->L, pairs = p->B * p->Hkv;
    if (rows == 0 || p->S == 0)
        return MHA_OK; /* no key: every row fully masked, zero gradient */
    const int nthreads = mha_threads();
    bwd_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p, c.g = g, c.isa = isa;
    c.plain = p->mask.data == NULL && p->kpm.data == NULL && !p->window &&
              p->kv_len.data == NULL && p->alibi.data == NULL;
    c.scalar_rows = p->dropout || p->softcap > 0.0f;
    c.dp = round_up(p->d, NR), c.dvp = round_up(p->dv, NR);
    c.nblk = (p->S + BC - 1) / BC;
    c.nsplit = 1;
    if (pairs < TASKS_WANTED) { /* a function of the problem, never of threads */
        c.nsplit = (TASKS_WANTED + pairs - 1) / pairs;
        if (c.nsplit > c.nblk)
            c.nsplit = c.nblk;
    }

    c.dq_task = g->dq.data && c.nsplit == 1 &&
                (double)(p->Hq / p->Hkv) * (double)p->L * (double)c.dp * sizeof(float) <=
                    (double)DQ_TASK_BUDGET_BYTES;

    /* one allocation: lse, delta (rows each), thread workspace, packed
     * query tiles of a chunk of pairs, dQ partials */
    const size_t per = ws_layout(&c, NULL, &(bwd_ws){0});
    c.ntile = (p->L + BR - 1) / BR;
    c.tile_floats = tile_layout(&c, NULL, &(bwd_tile){0});
    const int64_t G = p->Hq / p->Hkv;
    size_t pair_bytes; /* one pair's packed tiles; on overflow the chunk is one pair */
    int64_t chunk = 1;
    if (!mha_size_mul_overflows((size_t)(G * c.ntile), sizeof(float) * (size_t)c.tile_floats,
                                &pair_bytes) &&
        pair_bytes < TILE_BUDGET_BYTES)
        chunk = (int64_t)(TILE_BUDGET_BYTES / pair_bytes);
    const int64_t least = (mha_chunk_items_wanted(nthreads) + c.nsplit - 1) / c.nsplit;
    chunk = chunk > least ? chunk : least; /* tasks for the threads */
    chunk = chunk < pairs ? chunk : pairs;
    size_t n_part = 0, n_ws = 0, n_tiles = 0, total = 0;
    MHA_CHECK(!mha_size_mul_overflows((size_t)c.nsplit * (size_t)rows, (size_t)c.dp, &n_part) &&
                  !mha_size_mul_overflows(per, (size_t)nthreads, &n_ws) &&
                  !mha_size_mul_overflows((size_t)(chunk * G * c.ntile),
                                          (size_t)c.tile_floats, &n_tiles) &&
                  !__builtin_add_overflow(n_ws, n_tiles, &n_ws) &&
                  !__builtin_add_overflow(n_part, n_ws, &total) &&
                  !__builtin_add_overflow(total, 2 * (size_t)rows + 16, &total),
              MHA_ERR_OVERFLOW, "attention backward: workspace size overflows");
    if (!g->dq.data || c.dq_task)
        total -= n_part, n_part = 0;
    float *buf = mha_malloc(sizeof(float) * total);
    if (!buf)
        return mha_error(MHA_ERR_NOMEM, "attention backward: cannot allocate %zu floats", total);
    float *lse = buf, *delta = buf + rows;
    float *scratch = buf + round_up(2 * rows, 16); /* 64-byte aligned */
    c.tiles = scratch + (n_ws - n_tiles);
    c.dq_part = n_part ? scratch + n_ws : NULL;
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
    const int64_t saved_rows = have_lse || have_out ? rows : 0;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r0 = 0; r0 < saved_rows; r0 += ROWS_PER_STEP) {
        row_cursor at = row_at(p, r0);
        const int64_t r1 = saved_rows - r0 < ROWS_PER_STEP ? saved_rows : r0 + ROWS_PER_STEP;
        for (int64_t r = r0; r < r1; r++, row_next(p, &at))
            saved_row_stats(g, p->dv, at.b, at.h, at.i, have_lse ? lse + r : NULL,
                            have_out ? delta + r : NULL);
    }
    c.lse = lse, c.delta = delta;

    /* whole rows, pair by pair; a pair they leave (a non-finite input)
     * takes the tiles below */
    void *rows_buf = NULL;
    if (whole_rows && mha_attn_bwd_rows_serve(p, g)) {
        const size_t per_rows = (size_t)round_up(
            mha_attn_short_bwd_ws_floats(p->S, p->d, p->dv, G, p->L), 16);
        const size_t rows_bytes = sizeof(float) * per_rows * (size_t)nthreads + (size_t)pairs;
        rows_buf = mha_malloc(rows_bytes);
        if (!rows_buf) {
            mha_free(buf);
            return mha_error(MHA_ERR_NOMEM, "attention backward: cannot allocate %zu bytes",
                             rows_bytes);
        }
        float *rws = rows_buf;
        bool *served = (bool *)(rws + per_rows * (size_t)nthreads);
        int64_t left = 0;
#pragma omp parallel for num_threads(nthreads) schedule(static) reduction(+ : left)
        for (int64_t pair = 0; pair < pairs; pair++) {
            served[pair] = whole_rows(p, g, isa, lse, delta, pair / p->Hkv, pair % p->Hkv,
                                rws + (size_t)mha_thread_index() * per_rows);
            left += !served[pair];
        }
        if (left == 0) {
            mha_free(rows_buf);
            mha_free(buf);
            return MHA_OK;
        }
        c.served = served;
    }

#pragma omp parallel num_threads(nthreads)
    {
        const int tid = mha_thread_index();
        bwd_ws w;
        ws_layout(&c, scratch + (size_t)tid * per, &w);
        for (int64_t c0 = 0; c0 < pairs; c0 += chunk) {
            const int64_t np = pairs - c0 < chunk ? pairs - c0 : chunk;
            const int64_t ntiles = np * G * c.ntile, tasks = np * c.nsplit;
#pragma omp single
            c.bh0 = c0 * G; /* (implied barrier: no task still reads the last chunk) */
#pragma omp for schedule(static)
            for (int64_t t = 0; t < ntiles; t++)
                if (tiles_take(&c, (c0 * G + t / c.ntile) / G))
                    pack_tile(&c, c0 * G + t / c.ntile, t % c.ntile);
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < tasks; t++) {
                int64_t split = t % c.nsplit, pair = c0 + t / c.nsplit;
                if (tiles_take(&c, pair))
                    task_backward(&c, &w, pair / p->Hkv, pair % p->Hkv, split);
            }
        }
    }

    if (c.dq_part) { /* dq += sum of the split partials, in split order */
        const size_t split_stride = (size_t)rows * (size_t)c.dp;
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t r0 = 0; r0 < rows; r0 += ROWS_PER_STEP) {
            row_cursor at = row_at(p, r0);
            const int64_t r1 = rows - r0 < ROWS_PER_STEP ? rows : r0 + ROWS_PER_STEP;
            for (int64_t r = r0; r < r1; r++, row_next(p, &at))
                if (tiles_take(&c, (at.b * p->Hq + at.h) / G))
                    add_dq_row(&c, at.b, at.h, at.i, c.dq_part + r * c.dp, c.nsplit,
                               split_stride);
        }
    }
    mha_free(rows_buf);
    mha_free(buf);
    return MHA_OK;
}

mha_status mha_attn_bwd_f32_scalar(const mha_attn_problem *p, const mha_attn_grad *g) {
    return mha_attn_bwd_flash_run(p, g, &mha_bwd_isa_scalar, NULL);
}

mha_status mha_attn_bwd_f32_avx2(const mha_attn_problem *p, const mha_attn_grad *g) {
    MHA_CHECK(mha_cpu_has_avx2_fma(), MHA_ERR_UNSUPPORTED,
              "kernel: avx2 requested but this CPU lacks AVX2/FMA");
    return mha_attn_bwd_flash_run(p, g, &mha_bwd_isa_avx2, NULL);
}

mha_status mha_attn_bwd_f32_avx512(const mha_attn_problem *p, const mha_attn_grad *g) {
    MHA_TRY(mha_avx512_check());
    return mha_attn_bwd_flash_run(p, g, MHA_AVX512_PICK(mha_bwd_isa_avx512),
                                  *MHA_AVX512_PICK(mha_attn_short_bwd_avx512_loop));
}
