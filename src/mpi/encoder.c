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

static mha_status check_local(const mha_tensor *out, const mha_tensor *src,
                              const mha_encoder_layer_weights *w, const mha_layer_options *opt) {
    char sb[MHA_SHAPE_BUF];
    MHA_CHECK(w && opt, MHA_ERR_NULL, "w/opt: NULL");
    MHA_TRY(mha_check_tensor(src, "src", 3, MHA_F32));
    MHA_TRY(mha_check_tensor(out, "out", 3, MHA_F32));
    const int64_t E = src->shape[2];
    MHA_CHECK(out->shape[0] == src->shape[0] && out->shape[1] == src->shape[1] &&
                  out->shape[2] == E,
              MHA_ERR_SHAPE, "out: shape %s, want src's", mha_shape_str(out, sb, sizeof sb));
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

/* The per-token work before the ring: the normalised input (pre-norm) and
 * q, k, v (N,E) each. */
static mha_status project(float *q, float *k, float *v, float *xn, const mha_tensor *src,
                          const mha_encoder_layer_weights *w, const mha_layer_options *opt) {
    const int64_t B = src->shape[0], L = src->shape[1], E = src->shape[2];
    const mha_multihead_weights *a = &w->self_attn;
    mha_tensor x = *src, n = rows3(xn, B, L, E);
    if (opt->norm_first) {
        MHA_TRY(mha_layernorm_forward(&n, src, w->norm1_weight, w->norm1_bias, opt->layer_norm_eps));
        x = n;
    }
    float *dst[3] = {q, k, v};
    const mha_tensor *sep[3] = {a->q_proj_weight, a->k_proj_weight, a->v_proj_weight};
    for (int i = 0; i < 3; i++) {
        mha_tensor o = rows3(dst[i], B, L, E);
        mha_tensor wi = a->in_proj_weight ? third(a->in_proj_weight, i, E) : *sep[i];
        mha_tensor bi = a->in_proj_bias ? third(a->in_proj_bias, i, E) : (mha_tensor){0};
        MHA_TRY(mha_linear_forward(&o, &x, &wi, a->in_proj_bias ? &bi : NULL));
    }
    return MHA_OK;
}

/* The per-token work after the ring: out_proj, residuals, norms, MLP. */
static mha_status finish(mha_tensor *out, const mha_tensor *src, float *heads, float *t,
                         float *x1, float *xn, const mha_encoder_layer_weights *w,
                         const mha_layer_options *opt) {
    const int64_t B = src->shape[0], L = src->shape[1], E = src->shape[2];
    const float eps = opt->layer_norm_eps;
    mha_tensor A = rows3(heads, B, L, E), Tt = rows3(t, B, L, E), X1 = rows3(x1, B, L, E);
    mha_tensor Xn = rows3(xn, B, L, E);
    MHA_TRY(mha_linear_forward(&Tt, &A, w->self_attn.out_proj_weight, w->self_attn.out_proj_bias));
    MHA_TRY(mha_residual_forward(&X1, src, &Tt));
    if (!opt->norm_first)
        MHA_TRY(mha_layernorm_forward(&X1, &X1, w->norm1_weight, w->norm1_bias, eps));
    const mha_tensor *ff_in = &X1;
    if (opt->norm_first) {
        MHA_TRY(mha_layernorm_forward(&Xn, &X1, w->norm2_weight, w->norm2_bias, eps));
        ff_in = &Xn;
    }
    const mha_mlp_weights mlp = {w->linear1_weight, w->linear1_bias, w->linear2_weight,
                                 w->linear2_bias, NULL, NULL};
    MHA_TRY(mha_mlp_forward(&Tt, ff_in, &mlp, opt->activation, NULL, 0));
    MHA_TRY(mha_residual_forward(out, &X1, &Tt));
    if (!opt->norm_first)
        MHA_TRY(mha_layernorm_forward(out, out, w->norm2_weight, w->norm2_bias, eps));
    return MHA_OK;
}

mha_status mha_ring_encoder_layer_forward(MPI_Comm comm, mha_tensor *out, const mha_tensor *src,
                                          const mha_encoder_layer_weights *w,
                                          const mha_layer_options *opt, int causal,
                                          mha_ring_layout layout) {
    mha_status st = check_local(out, src, w, opt);
    const int64_t B = st == MHA_OK ? src->shape[0] : 0, L = st == MHA_OK ? src->shape[1] : 0;
    const int64_t E = st == MHA_OK ? src->shape[2] : 0, H = st == MHA_OK ? opt->num_heads : 1;
    float *buf = NULL;
    int64_t nf = 0;
    if (st == MHA_OK) {
        if (!mha_product((int64_t[]){B, L, E, 7}, 4, &nf))
            st = mha_error(MHA_ERR_OVERFLOW, "src: sizes overflow");
        else if (!(buf = mha_malloc(sizeof(float) * (size_t)(nf + 1))))
            st = mha_error(MHA_ERR_NOMEM, "ring encoder: out of memory");
    }
    const int64_t N = nf / 7;
    float *q = buf, *k = buf + N, *v = buf + 2 * N, *heads = buf + 3 * N, *t = buf + 4 * N;
    float *x1 = buf + 5 * N, *xn = buf + 6 * N;
    if (st == MHA_OK)
        st = project(q, k, v, xn, src, w, opt);
    st = mha_mpi_agree(comm, st); /* every rank reaches the ring, or none */
    if (st == MHA_OK) {
        mha_ring_options ro;
        mha_ring_options_init(&ro);
        ro.layout = layout;
        ro.sdpa.causal = causal ? MHA_CAUSAL_TOP_LEFT : MHA_CAUSAL_NONE;
        ro.sdpa.masked_rows = opt->masked_rows;
        ro.sdpa.kernel = opt->kernel;
        const int64_t dh = E / H;
        mha_tensor Q = heads_view(q, B, L, H, dh), K = heads_view(k, B, L, H, dh);
        mha_tensor V = heads_view(v, B, L, H, dh), O = heads_view(heads, B, L, H, dh);
        st = mha_ring_attention_forward(comm, &O, NULL, &Q, &K, &V, &ro);
    }
    if (st == MHA_OK)
        st = finish(out, src, heads, t, x1, xn, w, opt);
    mha_free(buf);
    return mha_mpi_agree(comm, st);
}
