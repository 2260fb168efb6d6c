/* encoder.c - a sequence-parallel nn.TransformerEncoderLayer forward: each
 * rank holds a slice of the tokens; everything but attention is per token
 * and runs locally through the public layer pieces (mha_linear_forward,
 * mha_layernorm_forward, mha_residual_forward, mha_mlp_forward); attention
 * is the ring (ring.c).  Semantics as src/transformer.c:
 *   post-norm: x = norm1(x + SA(x));  x = norm2(x + FF(x))
 *   pre-norm:  x = x + SA(norm1(x));  x = x + FF(norm2(x))
 *
 * Letter legend: B batch, Ll the rank's tokens, E model width, H heads,
 * dh = E/H head width, N = B*Ll rows, F MLP width.
 *
 * The head split needs no copy: the (B,Ll,E) projection read as (B,H,Ll,dh)
 * with strides (Ll*E, dh, E, 1) is the ring's q/k/v, and its output written
 * through the same strides is the (B,Ll,E) input of out_proj.
 */
#include "mpi_internal.h"

#include <string.h>

/* Rows [a*E, (a+1)*E) of a packed (3E,E) in_proj weight, or of its (3E) bias. */
static mha_tensor third(const mha_tensor *t, int64_t a, int64_t E) {
    mha_tensor r = *t;
    r.data = (float *)t->data + a * E * t->stride[0];
    r.shape[0] = E;
    return r;
}

/* (B,Ll,E) floats read as (B,H,Ll,dh). */
static mha_tensor heads_view(float *x, int64_t B, int64_t L, int64_t H, int64_t dh) {
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, x, 4, (int64_t[]){B, H, L, dh});
    t.stride[0] = L * H * dh, t.stride[1] = dh, t.stride[2] = H * dh, t.stride[3] = 1;
    return t;
}

static mha_tensor rows3(float *x, int64_t B, int64_t L, int64_t E) {
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, x, 3, (int64_t[]){B, L, E});
    return t;
}

/* dst = src, two contiguous (B,Ll,E) tensors. */
static void move_rows_3(mha_tensor *dst, const mha_tensor *src) {
    int64_t n = 0;
    mha_tensor_numel(dst, &n);
    if (dst->data != src->data)
        memmove(dst->data, src->data, sizeof(float) * (size_t)n);
}

/* src (B,Ll,E), a tensor `name` of its shape, the weights and options. */
static mha_status check_local(const mha_tensor *out, const char *name, const mha_tensor *src,
                              const mha_encoder_layer_weights *w, const mha_layer_options *opt) {
    char sb[MHA_SHAPE_BUF];
    MHA_CHECK(w && opt, MHA_ERR_NULL, "w/opt: NULL");
    MHA_TRY(mha_check_tensor(src, "src", 3, MHA_F32));
    MHA_TRY(mha_check_tensor(out, name, 3, MHA_F32));
    const int64_t E = src->shape[2];
    MHA_CHECK(out->shape[0] == src->shape[0] && out->shape[1] == src->shape[1] &&
                  out->shape[2] == E,
              MHA_ERR_SHAPE, "%s: shape %s, want src's", name, mha_shape_str(out, sb, sizeof sb));
    MHA_CHECK(opt->num_heads > 0 && E > 0 && E % opt->num_heads == 0, MHA_ERR_SHAPE,
              "num_heads: %lld does not divide E = %lld", (long long)opt->num_heads, (long long)E);
    MHA_CHECK(!(opt->training && opt->dropout_p > 0.0f), MHA_ERR_UNSUPPORTED,
              "dropout: not served by the sequence-parallel layer");
    const mha_multihead_weights *a = &w->self_attn;
    MHA_CHECK(!a->bias_k && !a->bias_v, MHA_ERR_UNSUPPORTED, "self_attn: bias_k/bias_v not taken");
    MHA_CHECK(a->in_proj_weight || (a->q_proj_weight && a->k_proj_weight && a->v_proj_weight),
              MHA_ERR_NULL, "self_attn: in_proj_weight or q/k/v_proj_weight required");
    MHA_CHECK(a->out_proj_weight && w->linear1_weight && w->linear2_weight, MHA_ERR_NULL,
              "out_proj_weight, linear1_weight and linear2_weight are required");
    if (a->in_proj_weight) {
        MHA_TRY(mha_check_tensor(a->in_proj_weight, "in_proj_weight", 2, MHA_F32));
        MHA_CHECK(a->in_proj_weight->shape[0] == 3 * E, MHA_ERR_SHAPE,
                  "in_proj_weight: shape %s, want (3E,E) = (%lld,%lld)",
                  mha_shape_str(a->in_proj_weight, sb, sizeof sb), (long long)(3 * E), (long long)E);
    }
    if (a->in_proj_bias) {
        MHA_TRY(mha_check_tensor(a->in_proj_bias, "in_proj_bias", 1, MHA_F32));
        MHA_CHECK(a->in_proj_bias->shape[0] == 3 * E, MHA_ERR_SHAPE,
                  "in_proj_bias: shape %s, want (3E) = (%lld)",
                  mha_shape_str(a->in_proj_bias, sb, sizeof sb), (long long)(3 * E));
    }
    return MHA_OK;
}

/* The forward's activations, each (N,E) packed, lse (B,H,Ll). */
typedef struct acts {
    float *xa;           /* the attention's input: LN1(src) pre-norm (else src itself) */
    float *q, *k, *v;    /* projections */
    float *heads, *lse;  /* the ring's output (the input of out_proj), its lse */
    float *t;            /* out_proj's output, then reused for the MLP's */
    float *y1, *x1;      /* src + attention; x1 = LN1(y1) post-norm, = y1 pre-norm */
    float *xf, *y2;      /* the MLP's input (LN2(x1) pre-norm); x1 + MLP */
} acts;
enum { ACT_ROWS = 12 }; /* (N,E) blocks in one activation allocation (lse fits in one) */

static mha_status acts_alloc(acts *A, float **buf, int64_t N, int64_t E) {
    int64_t nf;
    MHA_CHECK(mha_product((int64_t[]){N, E, ACT_ROWS}, 3, &nf), MHA_ERR_OVERFLOW,
              "src: sizes overflow");
    *buf = mha_malloc(sizeof(float) * (size_t)(nf + 1));
    MHA_CHECK(*buf, MHA_ERR_NOMEM, "ring encoder: out of memory for (N,E) = (%lld,%lld)",
              (long long)N, (long long)E);
    float **f[] = {&A->xa, &A->q, &A->k, &A->v, &A->heads, &A->lse, &A->t, &A->y1, &A->x1, &A->xf, &A->y2};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        *f[i] = *buf + (int64_t)i * N * E;
    return MHA_OK;
}

static mha_ring_options ring_opts(const mha_layer_options *opt, mha_causal causal,
                                  mha_ring_layout layout) {
    mha_ring_options ro;
    mha_ring_options_init(&ro);
    ro.layout = layout;
    ro.sdpa.causal = causal;
    ro.sdpa.masked_rows = opt->masked_rows;
    ro.sdpa.kernel = opt->kernel;
    return ro;
}

/* q/k/v (B,Ll,E) read as (B,H,Ll,dh): the ring's views. */
typedef struct ring_views {
    mha_tensor q, k, v, o, lse;
} ring_views;

static ring_views views_of(const acts *A, int64_t B, int64_t L, int64_t E, int64_t H) {
    ring_views r;
    r.q = heads_view(A->q, B, L, H, E / H), r.k = heads_view(A->k, B, L, H, E / H);
    r.v = heads_view(A->v, B, L, H, E / H), r.o = heads_view(A->heads, B, L, H, E / H);
    mha_tensor_init(&r.lse, MHA_F32, A->lse, 3, (int64_t[]){B, H, L});
    return r;
}

/* The input projection's weight and bias for q (0), k (1) or v (2). */
static void in_proj(const mha_multihead_weights *a, int i, int64_t E, mha_tensor *wi, mha_tensor *bi) {
    const mha_tensor *sep[3] = {a->q_proj_weight, a->k_proj_weight, a->v_proj_weight};
    *wi = a->in_proj_weight ? third(a->in_proj_weight, i, E) : *sep[i];
    *bi = a->in_proj_bias ? third(a->in_proj_bias, i, E) : (mha_tensor){0};
}

/* The whole forward, keeping every activation; out (B,Ll,E) last (it may
 * be src).  Collective: the ranks agree before the ring and at the end. */
static mha_status forward_pass(MPI_Comm comm, mha_tensor *out, const mha_tensor *src,
                               const mha_encoder_layer_weights *w, const mha_layer_options *opt,
                               mha_causal causal, mha_ring_layout layout, mha_status st,
                               const acts *A) {
    const int64_t B = st == MHA_OK ? src->shape[0] : 0, L = st == MHA_OK ? src->shape[1] : 0;
    const int64_t E = st == MHA_OK ? src->shape[2] : 0, H = st == MHA_OK ? opt->num_heads : 1;
    const float eps = st == MHA_OK ? opt->layer_norm_eps : 1.0f;
    mha_tensor Xa = rows3(A->xa, B, L, E), T = rows3(A->t, B, L, E), Y1 = rows3(A->y1, B, L, E);
    mha_tensor X1 = rows3(A->x1, B, L, E), Xf = rows3(A->xf, B, L, E), Y2 = rows3(A->y2, B, L, E);
    mha_tensor Hd = rows3(A->heads, B, L, E);
    const mha_multihead_weights *a = st == MHA_OK ? &w->self_attn : NULL;
    if (st == MHA_OK) /* the attention's input */
        st = opt->norm_first ? mha_layernorm_forward(&Xa, src, w->norm1_weight, w->norm1_bias, eps)
                             : (move_rows_3(&Xa, src), MHA_OK);
    for (int i = 0; i < 3 && st == MHA_OK; i++) {
        mha_tensor o = rows3(i == 0 ? A->q : i == 1 ? A->k : A->v, B, L, E), wi, bi;
        in_proj(a, i, E, &wi, &bi);
        st = mha_linear_forward(&o, &Xa, &wi, a->in_proj_bias ? &bi : NULL);
    }
    st = mha_mpi_agree(comm, st); /* every rank reaches the ring, or none */
    if (st == MHA_OK) {
        const mha_ring_options ro = ring_opts(opt, causal, layout);
        ring_views r = views_of(A, B, L, E, H);
        st = mha_ring_attention_forward(comm, &r.o, &r.lse, &r.q, &r.k, &r.v, &ro);
    }
    if (st == MHA_OK)
        st = mha_linear_forward(&T, &Hd, a->out_proj_weight, a->out_proj_bias);
    if (st == MHA_OK)
        st = mha_residual_forward(&Y1, src, &T);
    if (st == MHA_OK)
        st = opt->norm_first ? (move_rows_3(&X1, &Y1), MHA_OK)
                             : mha_layernorm_forward(&X1, &Y1, w->norm1_weight, w->norm1_bias, eps);
    if (st == MHA_OK)
        st = opt->norm_first ? mha_layernorm_forward(&Xf, &X1, w->norm2_weight, w->norm2_bias, eps)
                             : (move_rows_3(&Xf, &X1), MHA_OK);
    const mha_mlp_weights mlp = {w ? w->linear1_weight : NULL, w ? w->linear1_bias : NULL,
                                 w ? w->linear2_weight : NULL, w ? w->linear2_bias : NULL, NULL, NULL};
    if (st == MHA_OK)
        st = mha_mlp_forward(&T, &Xf, &mlp, opt->activation, NULL, 0);
    if (st == MHA_OK)
        st = mha_residual_forward(&Y2, &X1, &T);
    if (st == MHA_OK)
        st = opt->norm_first ? (move_rows_3(out, &Y2), MHA_OK)
                             : mha_layernorm_forward(out, &Y2, w->norm2_weight, w->norm2_bias, eps);
    return mha_mpi_agree(comm, st);
}

mha_status mha_ring_encoder_layer_forward(MPI_Comm comm, mha_tensor *out, const mha_tensor *src,
                                          const mha_encoder_layer_weights *w,
                                          const mha_layer_options *opt, mha_causal causal,
                                          mha_ring_layout layout) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    mha_status st = check_local(out, "out", src, w, opt);
    if (st == MHA_OK)
        st = mha_check_causal_top_left(causal, "ring encoder");
    acts A = {0};
    float *buf = NULL;
    if (st == MHA_OK)
        st = acts_alloc(&A, &buf, src->shape[0] * src->shape[1], src->shape[2]);
    st = forward_pass(comm, out, src, w, opt, causal, layout, st, &A);
    mha_free(buf);
    return st;
}

/* ---- backward ---------------------------------------------------------------- */

/* The weight gradients: local sums in one flat scratch (reduced over the
 * ranks in one MPI_Allreduce), then added to the caller's tensors. */
enum { WG_IN, WG_IN_B, WG_Q, WG_K, WG_V, WG_OUT, WG_OUT_B, WG_L1, WG_L1_B, WG_L2, WG_L2_B,
       WG_N1, WG_N1_B, WG_N2, WG_N2_B, WG_COUNT };

typedef struct wgrads {
    mha_tensor *dst[WG_COUNT];    /* the caller's (NULL: not wanted)            */
    const mha_tensor *of[WG_COUNT]; /* the weight each belongs to (NULL: absent) */
    mha_tensor local[WG_COUNT];   /* views into the scratch, the weight's shape */
    int64_t offset[WG_COUNT], total;
} wgrads;

static mha_status wgrads_plan(wgrads *g, const mha_encoder_layer_grads *d,
                              const mha_encoder_layer_weights *w) {
    const mha_multihead_weights *a = &w->self_attn;
    const mha_multihead_grads *da = &d->self_attn;
    mha_tensor *dst[WG_COUNT] = {da->in_proj_weight, da->in_proj_bias, da->q_proj_weight,
                                 da->k_proj_weight, da->v_proj_weight, da->out_proj_weight,
                                 da->out_proj_bias, d->linear1_weight, d->linear1_bias,
                                 d->linear2_weight, d->linear2_bias, d->norm1_weight,
                                 d->norm1_bias, d->norm2_weight, d->norm2_bias};
    const mha_tensor *of[WG_COUNT] = {a->in_proj_weight, a->in_proj_bias, a->q_proj_weight,
                                      a->k_proj_weight, a->v_proj_weight, a->out_proj_weight,
                                      a->out_proj_bias, w->linear1_weight, w->linear1_bias,
                                      w->linear2_weight, w->linear2_bias, w->norm1_weight,
                                      w->norm1_bias, w->norm2_weight, w->norm2_bias};
    static const char *const names[WG_COUNT] = {
        "in_proj_weight", "in_proj_bias", "q_proj_weight", "k_proj_weight", "v_proj_weight",
        "out_proj_weight", "out_proj_bias", "linear1_weight", "linear1_bias", "linear2_weight",
        "linear2_bias", "norm1_weight", "norm1_bias", "norm2_weight", "norm2_bias"};
    memset(g, 0, sizeof *g);
    for (int i = 0; i < WG_COUNT; i++) {
        g->dst[i] = dst[i], g->of[i] = of[i];
        if (!of[i])
            continue;
        int64_t n = 0, m = 0;
        MHA_TRY(mha_tensor_numel(of[i], &n));
        if (dst[i]) {
            MHA_TRY(mha_check_tensor(dst[i], names[i], of[i]->ndim, MHA_F32));
            MHA_TRY(mha_tensor_numel(dst[i], &m));
            MHA_CHECK(m == n && !memcmp(dst[i]->shape, of[i]->shape, sizeof(int64_t) * (size_t)of[i]->ndim),
                      MHA_ERR_SHAPE, "grads.%s: not the weight's shape", names[i]);
        }
        MHA_TRY(mha_tensor_init(&g->local[i], MHA_F32, NULL, of[i]->ndim, of[i]->shape));
        g->offset[i] = g->total;
        g->total += n;
    }
    MHA_CHECK(g->total <= INT32_MAX, MHA_ERR_OVERFLOW, "grads: too many weights for one message");
    return MHA_OK;
}

static void wgrads_place(wgrads *g, float *base) {
    for (int i = 0; i < WG_COUNT; i++)
        if (g->of[i])
            g->local[i].data = base + g->offset[i];
}

static mha_tensor *wg(wgrads *g, int i) { return g->of[i] ? &g->local[i] : NULL; }

/* Every rank's sums, added into the caller's gradients. */
static mha_status wgrads_reduce(MPI_Comm comm, wgrads *g, float *base) {
    int rc = MPI_Allreduce(MPI_IN_PLACE, base, (int)g->total, MPI_FLOAT, MPI_SUM, comm);
    if (rc != MPI_SUCCESS)
        return mha_error(MHA_ERR_IO, "MPI_Allreduce of the weight gradients failed");
    for (int i = 0; i < WG_COUNT; i++) {
        if (!g->of[i] || !g->dst[i])
            continue;
        int64_t n = 0;
        mha_tensor_numel(g->of[i], &n);
        float *d = g->dst[i]->data;
        const float *s = g->local[i].data;
        for (int64_t j = 0; j < n; j++)
            d[j] += s[j];
    }
    return MHA_OK;
}

/* Gradients through the per-token tail (the MLP, norms, out_proj) to the
 * ring's output: dheads (N,E); dsrc gets the residual's share. */
static mha_status tail_backward(mha_tensor *dsrc, float *dheads, float *g1, float *g2,
                                const mha_tensor *dout, const mha_tensor *src, const acts *A,
                                const mha_encoder_layer_weights *w, const mha_layer_options *opt,
                                wgrads *g) {
    const int64_t B = src->shape[0], L = src->shape[1], E = src->shape[2];
    const float eps = opt->layer_norm_eps;
    const mha_mlp_weights mlp = {w->linear1_weight, w->linear1_bias, w->linear2_weight,
                                 w->linear2_bias, NULL, NULL};
    mha_mlp_grads dmlp = {wg(g, WG_L1), wg(g, WG_L1_B), wg(g, WG_L2), wg(g, WG_L2_B), NULL, NULL};
    mha_tensor G1 = rows3(g1, B, L, E), G2 = rows3(g2, B, L, E), Dh = rows3(dheads, B, L, E);
    mha_tensor X1 = rows3(A->x1, B, L, E), Xf = rows3(A->xf, B, L, E), Y1 = rows3(A->y1, B, L, E);
    mha_tensor Y2 = rows3(A->y2, B, L, E), Hd = rows3(A->heads, B, L, E);
    /* G1 = dL/dx1 */
    if (opt->norm_first) { /* out = x1 + MLP(LN2(x1)) */
        MHA_TRY(mha_residual_backward(&G1, NULL, dout));
        MHA_TRY(mha_mlp_backward(&G2, &dmlp, dout, &Xf, &mlp, opt->activation, NULL, 0));
        MHA_TRY(mha_layernorm_backward(&G1, wg(g, WG_N2), wg(g, WG_N2_B), &G2, &X1,
                                       w->norm2_weight, eps));
    } else { /* out = LN2(x1 + MLP(x1)) */
        MHA_TRY(mha_layernorm_backward(&G2, wg(g, WG_N2), wg(g, WG_N2_B), dout, &Y2,
                                       w->norm2_weight, eps));
        MHA_TRY(mha_residual_backward(&G1, NULL, &G2));
        MHA_TRY(mha_mlp_backward(&G1, &dmlp, &G2, &X1, &mlp, opt->activation, NULL, 0));
    }
    /* dL/dy1 (y1 = src + out_proj(heads)) */
    const mha_tensor *dy1 = &G1;
    if (!opt->norm_first) {
        memset(g2, 0, sizeof(float) * (size_t)(B * L * E));
        MHA_TRY(mha_layernorm_backward(&G2, wg(g, WG_N1), wg(g, WG_N1_B), &G1, &Y1,
                                       w->norm1_weight, eps));
        dy1 = &G2;
    }
    MHA_TRY(mha_residual_backward(dsrc, NULL, dy1));
    return mha_linear_backward(&Dh, wg(g, WG_OUT), wg(g, WG_OUT_B), dy1, &Hd,
                               w->self_attn.out_proj_weight);
}

/* From the ring's dq, dk, dv (N,E each) through the input projection (and
 * LN1 pre-norm) into dsrc. */
static mha_status head_backward(mha_tensor *dsrc, float *const *dqkv, float *gx,
                                const mha_tensor *src, const acts *A,
                                const mha_encoder_layer_weights *w, const mha_layer_options *opt,
                                wgrads *g) {
    const int64_t B = src->shape[0], L = src->shape[1], E = src->shape[2];
    const mha_multihead_weights *a = &w->self_attn;
    mha_tensor Gx = rows3(gx, B, L, E), Xa = rows3(A->xa, B, L, E);
    memset(gx, 0, sizeof(float) * (size_t)(B * L * E));
    for (int i = 0; i < 3; i++) {
        mha_tensor wi, bi, dw, db, *dwp = NULL, *dbp = NULL;
        in_proj(a, i, E, &wi, &bi);
        if (a->in_proj_weight)
            dw = third(&g->local[WG_IN], i, E), dwp = &dw;
        else
            dwp = wg(g, WG_Q + i);
        if (a->in_proj_bias)
            db = third(&g->local[WG_IN_B], i, E), dbp = &db;
        mha_tensor D = rows3(dqkv[i], B, L, E);
        MHA_TRY(mha_linear_backward(&Gx, dwp, dbp, &D, &Xa, &wi));
    }
    if (opt->norm_first)
        return mha_layernorm_backward(dsrc, wg(g, WG_N1), wg(g, WG_N1_B), &Gx, src,
                                      w->norm1_weight, opt->layer_norm_eps);
    return mha_residual_backward(dsrc, NULL, &Gx);
}

mha_status mha_ring_encoder_layer_backward(MPI_Comm comm, mha_tensor *dsrc,
                                           const mha_encoder_layer_grads *grads,
                                           const mha_tensor *dout, const mha_tensor *src,
                                           const mha_encoder_layer_weights *w,
                                           const mha_layer_options *opt, mha_causal causal,
                                           mha_ring_layout layout) {
    MHA_OPTIONS_DEFAULT(mha_layer_options, opt);
    mha_tensor fwd_out;
    mha_status st = check_local(dsrc, "dsrc", src, w, opt);
    if (st == MHA_OK)
        st = mha_check_causal_top_left(causal, "ring encoder");
    if (st == MHA_OK)
        st = check_local(dout, "dout", src, w, opt);
    if (st == MHA_OK && !grads)
        st = mha_error(MHA_ERR_NULL, "grads: NULL");
    wgrads g;
    if (st == MHA_OK)
        st = wgrads_plan(&g, grads, w);
    const int64_t N = st == MHA_OK ? src->shape[0] * src->shape[1] : 0;
    const int64_t E = st == MHA_OK ? src->shape[2] : 0;
    acts A = {0};
    float *buf = NULL, *gbuf = NULL;
    if (st == MHA_OK)
        st = acts_alloc(&A, &buf, N, E);
    /* gradient scratch: the weights' sums, then (N,E) x 6: dheads, dq, dk,
     * dv, and two row scratches */
    if (st == MHA_OK && !(gbuf = mha_calloc((size_t)(g.total + 6 * N * E + 1), sizeof(float))))
        st = mha_error(MHA_ERR_NOMEM, "ring encoder: out of memory for the gradients");
    if (st == MHA_OK) {
        wgrads_place(&g, gbuf);
        mha_tensor_init(&fwd_out, MHA_F32, A.t, 3, src->shape); /* t is free after the MLP */
    }
    st = forward_pass(comm, &fwd_out, src, w, opt, causal, layout, st, &A);
    float *dh = gbuf + g.total, *dqkv[3] = {dh + N * E, dh + 2 * N * E, dh + 3 * N * E};
    float *g1 = dh + 4 * N * E, *g2 = dh + 5 * N * E;
    if (st == MHA_OK)
        st = tail_backward(dsrc, dh, g1, g2, dout, src, &A, w, opt, &g);
    st = mha_mpi_agree(comm, st);
    if (st == MHA_OK) {
        const mha_ring_options ro = ring_opts(opt, causal, layout);
        const int64_t B = src->shape[0], L = src->shape[1], H = opt->num_heads;
        ring_views r = views_of(&A, B, L, E, H);
        mha_tensor dQ = heads_view(dqkv[0], B, L, H, E / H), dK = heads_view(dqkv[1], B, L, H, E / H);
        mha_tensor dV = heads_view(dqkv[2], B, L, H, E / H), dO = heads_view(dh, B, L, H, E / H);
        st = mha_ring_attention_backward(comm, &dQ, &dK, &dV, &dO, &r.o, &r.lse, &r.q, &r.k, &r.v,
                                         &ro);
    }
    if (st == MHA_OK)
        st = head_backward(dsrc, dqkv, g1, src, &A, w, opt, &g);
    st = mha_mpi_agree(comm, st);
    if (st == MHA_OK)
        st = mha_mpi_agree(comm, wgrads_reduce(comm, &g, gbuf));
    mha_free(buf);
    mha_free(gbuf);
    return st;
}
