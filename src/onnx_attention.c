/* onnx_attention.c - the ONNX Attention operator (opsets 23, 24, 25 as the
 * onnx 1.23 release defines them) on top of mha_sdpa_forward.
 *
 * Letter legend: B batch, Hq query heads, Hkv key/value heads, L query
 * length, S new key length, P past length, T = P + S total keys, d head dim
 * of q/k, dv head dim of v.
 *
 * ref: onnx/defs/nn/defs.cc (Attention-23/24/25 schema text) and the numpy
 * reference onnx/reference/ops/op_attention.py (_compute_attention), which
 * generates the backend test data.  What this file does, step by step:
 *   1. 3-D (B,L,H*d) inputs are viewed as (B,H,L,d) (reshape then transpose:
 *      head h is the h-th chunk of d channels) - strides only, no copy;
 *   2. present = concat(past, new) along the key axis (written into the
 *      caller's present_* outputs when given, else into a temporary);
 *   3. the mask: bool (true = attend) or numeric (added; integers too, as
 *      the reference adds them), its last dim padded to T with -inf/false;
 *   4. causal and window offset o_b: P with past_key, nonpad[b] - L with
 *      nonpad_kv_seqlen, else 0; keys j >= nonpad[b] are masked;
 *   5. mha_sdpa_forward with the ONNX scale convention (q and k each times
 *      sqrt(scale)), softcap before the mask, qk_matmul_output modes, and
 *      float64 softmax for softmax_precision = 11 (DOUBLE).
 */
#include "internal.h"
#include "kernels/convert.h"

#include <string.h>

void mha_onnx_attention_options_init(mha_onnx_attention_options *opt) {
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->left_window_size = opt->right_window_size = -1;
    opt->kernel = MHA_KERNEL_AUTO;
}

typedef struct onnx_plan {
    int rank;
    int64_t B, Hq, Hkv, L, S, P, T, d, dv;
    mha_tensor q4, k4, v4; /* (B,Hq,L,d) (B,Hkv,S,d) (B,Hkv,S,dv) views */
} onnx_plan;

/* x (B,N,H*c) viewed as (B,H,N,c). */
static mha_status heads_view(const mha_tensor *x, const char *name, int64_t heads,
                             mha_tensor *v4) {
    char sb[MHA_SHAPE_BUF];
    MHA_CHECK(heads > 0, MHA_ERR_VALUE, "%s: 3-D input needs %s_num_heads > 0", name,
              name[0] == 'q' ? "q" : "kv");
    MHA_CHECK(x->shape[2] % heads == 0, MHA_ERR_SHAPE,
              "%s: hidden size %lld of shape %s is not a multiple of %lld heads", name,
              (long long)x->shape[2], mha_shape_str(x, sb, sizeof sb), (long long)heads);
    int64_t c = x->shape[2] / heads;
    *v4 = *x;
    v4->ndim = 4;
    v4->shape[0] = x->shape[0], v4->shape[1] = heads, v4->shape[2] = x->shape[1];
    v4->shape[3] = c;
    v4->stride[0] = x->stride[0], v4->stride[1] = c * x->stride[2];
    v4->stride[2] = x->stride[1], v4->stride[3] = x->stride[2];
    return MHA_OK;
}

static mha_status plan_onnx(onnx_plan *pl, const mha_tensor *q, const mha_tensor *k,
                            const mha_tensor *v, const mha_tensor *mask, const mha_tensor *pk,
                            const mha_tensor *pv, const mha_tensor *nonpad,
                            const mha_onnx_attention_options *opt) {
    char s1[MHA_SHAPE_BUF], s2[MHA_SHAPE_BUF];
    memset(pl, 0, sizeof *pl);
    MHA_CHECK(q && k && v, MHA_ERR_NULL, "q, k, v: required");
    MHA_CHECK(opt, MHA_ERR_NULL, "opt: required");
    MHA_CHECK(q->ndim == 3 || q->ndim == 4, MHA_ERR_SHAPE, "q: rank %d, want 3 or 4", q->ndim);
    pl->rank = q->ndim;
    MHA_TRY(mha_check_float_tensor(q, "q", pl->rank));
    MHA_TRY(mha_check_float_tensor(k, "k", pl->rank));
    MHA_TRY(mha_check_float_tensor(v, "v", pl->rank));
    MHA_CHECK(opt->q_num_heads >= 0 && opt->kv_num_heads >= 0, MHA_ERR_VALUE,
              "q_num_heads/kv_num_heads: negative");
    if (pl->rank == 3) {
        MHA_TRY(heads_view(q, "q", opt->q_num_heads, &pl->q4));
        MHA_TRY(heads_view(k, "k", opt->kv_num_heads, &pl->k4));
        MHA_TRY(heads_view(v, "v", opt->kv_num_heads, &pl->v4));
    } else {
        MHA_CHECK(opt->q_num_heads == 0 || opt->q_num_heads == q->shape[1], MHA_ERR_VALUE,
                  "q_num_heads: %lld but 4-D q %s has %lld heads", (long long)opt->q_num_heads,
                  mha_shape_str(q, s1, sizeof s1), (long long)q->shape[1]);
        MHA_CHECK(opt->kv_num_heads == 0 || opt->kv_num_heads == k->shape[1], MHA_ERR_VALUE,
                  "kv_num_heads: %lld but 4-D k %s has %lld heads", (long long)opt->kv_num_heads,
                  mha_shape_str(k, s1, sizeof s1), (long long)k->shape[1]);
        pl->q4 = *q, pl->k4 = *k, pl->v4 = *v;
    }
    const mha_tensor *q4 = &pl->q4, *k4 = &pl->k4, *v4 = &pl->v4;
    pl->B = q4->shape[0], pl->Hq = q4->shape[1], pl->L = q4->shape[2], pl->d = q4->shape[3];
    pl->Hkv = k4->shape[1], pl->S = k4->shape[2], pl->dv = v4->shape[3];
    MHA_CHECK(k4->shape[0] == pl->B && v4->shape[0] == pl->B, MHA_ERR_SHAPE,
              "k, v: batch %lld and %lld, q has %lld", (long long)k4->shape[0],
              (long long)v4->shape[0], (long long)pl->B);
    MHA_CHECK(k4->shape[3] == pl->d, MHA_ERR_SHAPE, "k: head size %lld, q has %lld",
              (long long)k4->shape[3], (long long)pl->d);
    MHA_CHECK(v4->shape[1] == pl->Hkv && v4->shape[2] == pl->S, MHA_ERR_SHAPE,
              "v: shape %s does not fit k %s (same kv heads and length)",
              mha_shape_str(v, s1, sizeof s1), mha_shape_str(k, s2, sizeof s2));
    MHA_CHECK(pl->Hkv > 0 && pl->Hq % pl->Hkv == 0, MHA_ERR_SHAPE,
              "k: %lld kv heads do not divide %lld query heads", (long long)pl->Hkv,
              (long long)pl->Hq);
    MHA_CHECK(pl->d > 0, MHA_ERR_SHAPE, "q: head size 0");

    MHA_CHECK(!pk == !pv, MHA_ERR_VALUE, "past_key, past_value: must be given together");
    if (pk) {
        MHA_TRY(mha_check_float_tensor(pk, "past_key", 4));
        MHA_TRY(mha_check_float_tensor(pv, "past_value", 4));
        pl->P = pk->shape[2];
        MHA_CHECK(pk->shape[0] == pl->B && pk->shape[1] == pl->Hkv && pk->shape[3] == pl->d,
                  MHA_ERR_SHAPE, "past_key: shape %s, want (%lld,%lld,P,%lld)",
                  mha_shape_str(pk, s1, sizeof s1), (long long)pl->B, (long long)pl->Hkv,
                  (long long)pl->d);
        MHA_CHECK(pv->shape[0] == pl->B && pv->shape[1] == pl->Hkv && pv->shape[2] == pl->P &&
                      pv->shape[3] == pl->dv,
                  MHA_ERR_SHAPE, "past_value: shape %s, want (%lld,%lld,%lld,%lld)",
                  mha_shape_str(pv, s1, sizeof s1), (long long)pl->B, (long long)pl->Hkv,
                  (long long)pl->P, (long long)pl->dv);
        MHA_CHECK(!nonpad, MHA_ERR_VALUE,
                  "nonpad_kv_seqlen: cannot be combined with past_key/past_value");
    }
    MHA_CHECK(!__builtin_add_overflow(pl->P, pl->S, &pl->T), MHA_ERR_OVERFLOW,
              "past_key: past + new length overflows");
    if (nonpad) {
        MHA_TRY(mha_check_tensor(nonpad, "nonpad_kv_seqlen", 1, MHA_I64));
        MHA_CHECK(nonpad->shape[0] == pl->B, MHA_ERR_SHAPE,
                  "nonpad_kv_seqlen: shape %s, want (%lld)", mha_shape_str(nonpad, s1, sizeof s1),
                  (long long)pl->B);
    }
    if (mask) {
        MHA_CHECK(mask->ndim >= 1 && mask->ndim <= 4, MHA_ERR_SHAPE,
                  "attn_mask: rank %d, want 1..4", mask->ndim);
        MHA_CHECK(mask->dtype == MHA_BOOL || mask->dtype == MHA_F32 || mask->dtype == MHA_I64,
                  MHA_ERR_DTYPE, "attn_mask: dtype %d, want bool, float or integer",
                  (int)mask->dtype);
        MHA_TRY(mha_check_tensor(mask, "attn_mask", mask->ndim, mask->dtype));
        const int64_t full[4] = {pl->B, pl->Hq, pl->L, pl->T};
        for (int a = 0; a < mask->ndim; a++) {
            int64_t n = mask->shape[mask->ndim - 1 - a], want = full[3 - a];
            if (a == 0)
                MHA_CHECK(n <= want, MHA_ERR_SHAPE,
                          "attn_mask: shape %s, last dim %lld is longer than the %lld keys",
                          mha_shape_str(mask, s1, sizeof s1), (long long)n, (long long)want);
            else
                MHA_CHECK(n == 1 || n == want, MHA_ERR_SHAPE,
                          "attn_mask: shape %s does not broadcast to (%lld,%lld,%lld,%lld)",
                          mha_shape_str(mask, s1, sizeof s1), (long long)full[0],
                          (long long)full[1], (long long)full[2], (long long)full[3]);
        }
    }
    MHA_CHECK(opt->is_causal == 0 || opt->is_causal == 1, MHA_ERR_VALUE,
              "is_causal: %d, want 0 or 1", opt->is_causal);
    MHA_CHECK(!opt->scale_set || (isfinite(opt->scale) && opt->scale >= 0.0f), MHA_ERR_VALUE,
              "scale: %g, want a finite value >= 0 (q and k are multiplied by its root)",
              (double)opt->scale);
    MHA_CHECK(!isnan(opt->softcap) && isfinite(opt->softcap), MHA_ERR_VALUE,
              "softcap: %g is not finite", (double)opt->softcap);
    MHA_CHECK(opt->qk_matmul_output_mode >= 0 && opt->qk_matmul_output_mode <= 3, MHA_ERR_VALUE,
              "qk_matmul_output_mode: %d, want 0..3", opt->qk_matmul_output_mode);
    int sp = opt->softmax_precision;
    MHA_CHECK(sp == 0 || sp == 1 || sp == 10 || sp == 11 || sp == 16, MHA_ERR_VALUE,
              "softmax_precision: %d, want 1 (FLOAT), 10 (FLOAT16), 11 (DOUBLE) or "
              "16 (BFLOAT16)",
              sp);
    MHA_CHECK(opt->left_window_size >= -1 && opt->right_window_size >= -1, MHA_ERR_VALUE,
              "left_window_size %lld, right_window_size %lld: want -1 or >= 0",
              (long long)opt->left_window_size, (long long)opt->right_window_size);
    return MHA_OK;
}

mha_status mha_onnx_attention_shapes_get(mha_onnx_attention_shapes *s, const mha_tensor *q,
                                         const mha_tensor *k, const mha_tensor *v,
                                         const mha_tensor *attn_mask, const mha_tensor *past_key,
                                         const mha_tensor *past_value,
                                         const mha_tensor *nonpad_kv_seqlen,
                                         const mha_onnx_attention_options *opt) {
    MHA_CHECK(s, MHA_ERR_NULL, "s: required");
    onnx_plan pl;
    MHA_TRY(plan_onnx(&pl, q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, opt));
    memset(s, 0, sizeof *s);
    s->y_ndim = pl.rank;
    if (pl.rank == 3) {
        int64_t hid;
        MHA_CHECK(!mha_mul_overflows(pl.Hq, pl.dv, &hid), MHA_ERR_OVERFLOW, "y: Hq*dv overflows");
        s->y[0] = pl.B, s->y[1] = pl.L, s->y[2] = hid, s->y[3] = 0;
    } else {
        s->y[0] = pl.B, s->y[1] = pl.Hq, s->y[2] = pl.L, s->y[3] = pl.dv;
    }
    const int64_t pk[4] = {pl.B, pl.Hkv, pl.T, pl.d}, pv[4] = {pl.B, pl.Hkv, pl.T, pl.dv};
    const int64_t qk[4] = {pl.B, pl.Hq, pl.L, pl.T};
    memcpy(s->present_key, pk, sizeof pk);
    memcpy(s->present_value, pv, sizeof pv);
    memcpy(s->qk, qk, sizeof qk);
    return MHA_OK;
}

static mha_status check_shape(const mha_tensor *t, const char *name, int ndim,
                              const int64_t *want) {
    char sb[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_float_tensor(t, name, ndim));
    for (int i = 0; i < ndim; i++)
        MHA_CHECK(t->shape[i] == want[i], MHA_ERR_SHAPE,
                  "%s: shape %s, want the shape mha_onnx_attention_shapes_get gives", name,
                  mha_shape_str(t, sb, sizeof sb));
    return MHA_OK;
}

/* dst (B,H,P+S,c) = concat(past (B,H,P,c), x (B,H,S,c)) along dim 2; each
 * of the three may be F32, F16 or BF16 (a value rounded when dst is half). */
static void concat_keys(mha_tensor *dst, const mha_tensor *past, const mha_tensor *x) {
    for (int64_t b = 0; b < dst->shape[0]; b++)
        for (int64_t h = 0; h < dst->shape[1]; h++)
            for (int64_t t = 0; t < dst->shape[2]; t++) {
                const mha_tensor *src = past && t < past->shape[2] ? past : x;
                int64_t ts = src == past ? t : t - (past ? past->shape[2] : 0);
                int64_t in = b * src->stride[0] + h * src->stride[1] + ts * src->stride[2];
                int64_t out = b * dst->stride[0] + h * dst->stride[1] + t * dst->stride[2];
                for (int64_t c = 0; c < dst->shape[3]; c++)
                    mha_store_f(dst->data, dst->dtype, out + c * dst->stride[3],
                                mha_load_f(src->data, src->dtype, in + c * src->stride[3]));
            }
}

/* A contiguous mask of the caller's rank with its last dim padded to T:
 * bool stays bool (pad false), numbers become float (pad -inf). */
static mha_status pad_mask(const mha_tensor *m, int64_t T, mha_tensor *out) {
    int64_t shape[4];
    memcpy(shape, m->shape, sizeof(int64_t) * (size_t)m->ndim);
    shape[m->ndim - 1] = T;
    MHA_TRY(mha_tensor_create(out, m->dtype == MHA_BOOL ? MHA_BOOL : MHA_F32, m->ndim, shape));
    int64_t n = 1, rows;
    for (int a = 0; a < m->ndim - 1; a++)
        n *= shape[a];
    rows = n;
    const int64_t ml = m->shape[m->ndim - 1];
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = 0, rem = r; /* offset of row r in the caller's view */
        for (int a = m->ndim - 2; a >= 0; a--) {
            off += (rem % shape[a]) * m->stride[a];
            rem /= shape[a];
        }
        for (int64_t j = 0; j < T; j++) {
            int64_t src = off + j * m->stride[m->ndim - 1];
            if (m->dtype == MHA_BOOL)
                ((uint8_t *)out->data)[r * T + j] =
                    j < ml ? (((const uint8_t *)m->data)[src] != 0) : 0;
            else if (m->dtype == MHA_F32)
                ((float *)out->data)[r * T + j] =
                    j < ml ? ((const float *)m->data)[src] : -INFINITY;
            else
                ((float *)out->data)[r * T + j] =
                    j < ml ? (float)((const int64_t *)m->data)[src] : -INFINITY;
        }
    }
    return MHA_OK;
}

mha_status mha_onnx_attention(mha_tensor *y, mha_tensor *present_key, mha_tensor *present_value,
                              mha_tensor *qk_matmul_output, const mha_tensor *q,
                              const mha_tensor *k, const mha_tensor *v,
                              const mha_tensor *attn_mask, const mha_tensor *past_key,
                              const mha_tensor *past_value, const mha_tensor *nonpad_kv_seqlen,
                              const mha_onnx_attention_options *opt) {
    MHA_OPTIONS_DEFAULT(mha_onnx_attention_options, opt);
    mha_onnx_attention_shapes sh;
    MHA_TRY(mha_onnx_attention_shapes_get(&sh, q, k, v, attn_mask, past_key, past_value,
                                          nonpad_kv_seqlen, opt));
    onnx_plan pl;
    MHA_TRY(plan_onnx(&pl, q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, opt));
    MHA_CHECK(y, MHA_ERR_NULL, "y: required");
    MHA_TRY(check_shape(y, "y", sh.y_ndim, sh.y));
    if (present_key)
        MHA_TRY(check_shape(present_key, "present_key", 4, sh.present_key));
    if (present_value)
        MHA_TRY(check_shape(present_value, "present_value", 4, sh.present_value));
    if (qk_matmul_output)
        MHA_TRY(check_shape(qk_matmul_output, "qk_matmul_output", 4, sh.qk));
    const mha_tensor *ins[6] = {q, k, v, attn_mask, past_key, past_value};
    mha_tensor *outs[4] = {y, present_key, present_value, qk_matmul_output};
    for (int o = 0; o < 4; o++) {
        if (!outs[o])
            continue;
        MHA_TRY(mha_check_writable(outs[o], "output"));
        for (int i = 0; i < 6; i++)
            MHA_CHECK(!mha_tensors_overlap(outs[o], ins[i]), MHA_ERR_ALIAS,
                      "outputs: output %d overlaps an input", o);
        for (int o2 = 0; o2 < o; o2++)
            MHA_CHECK(!mha_tensors_overlap(outs[o], outs[o2]), MHA_ERR_ALIAS,
                      "outputs: outputs %d and %d overlap", o2, o);
    }

    /* y as (B,Hq,L,dv) */
    mha_tensor y4 = *y;
    if (pl.rank == 3) {
        y4.ndim = 4;
        y4.shape[0] = pl.B, y4.shape[1] = pl.Hq, y4.shape[2] = pl.L, y4.shape[3] = pl.dv;
        y4.stride[0] = y->stride[0], y4.stride[1] = pl.dv * y->stride[2];
        y4.stride[2] = y->stride[1], y4.stride[3] = y->stride[2];
    }

    mha_status st = MHA_OK;
    mha_tensor kt = {0}, vt = {0}, mask = {0}, offs = {0};
    mha_tensor K = pl.k4, V = pl.v4;
    /* present = concat(past, new): into the outputs, else temporaries */
    if (past_key || present_key) {
        if (present_key)
            K = *present_key;
        else if ((st = mha_tensor_create(&kt, pl.k4.dtype, 4, sh.present_key)) == MHA_OK)
            K = kt;
        if (st == MHA_OK)
            concat_keys(&K, past_key, &pl.k4);
    }
    if (st == MHA_OK && (past_value || present_value)) {
        if (present_value)
            V = *present_value;
        else if ((st = mha_tensor_create(&vt, pl.v4.dtype, 4, sh.present_value)) == MHA_OK)
            V = vt;
        if (st == MHA_OK)
            concat_keys(&V, past_value, &pl.v4);
    }

    mha_sdpa_options so;
    mha_sdpa_options_init(&so);
    so.onnx_scale = 1;
    so.scale_set = opt->scale_set;
    so.scale = opt->scale;
    so.softcap = opt->softcap > 0.0f ? opt->softcap : 0.0f; /* the reference: > 0 only */
    so.window_left = opt->left_window_size;
    so.window_right = opt->right_window_size;
    so.softmax_precision = opt->softmax_precision == 11 ? MHA_SOFTMAX_F64 : MHA_SOFTMAX_F32;
    so.kernel = opt->kernel;
    so.masked_rows = MHA_MASKED_ROWS_ZERO;
    if (st == MHA_OK && attn_mask) {
        const mha_tensor *m = attn_mask;
        if (m->shape[m->ndim - 1] == pl.T && m->dtype != MHA_I64) {
            so.attn_mask = m;
        } else if ((st = pad_mask(m, pl.T, &mask)) == MHA_OK) {
            so.attn_mask = &mask;
        }
        so.attn_mask_polarity = MHA_TRUE_KEEPS;
    }
    /* offset o_b: P with past, nonpad[b] - L with an external cache, else 0 */
    so.causal = opt->is_causal ? MHA_CAUSAL_OFFSET : MHA_CAUSAL_NONE;
    so.causal_offset = pl.P;
    if (st == MHA_OK && nonpad_kv_seqlen) {
        so.kv_lengths = nonpad_kv_seqlen;
        if ((st = mha_tensor_create(&offs, MHA_I64, 1, (int64_t[]){pl.B})) == MHA_OK) {
            for (int64_t b = 0; b < pl.B; b++) {
                int64_t n = ((const int64_t *)nonpad_kv_seqlen->data)[b * nonpad_kv_seqlen->stride[0]];
                if (n < -((int64_t)1 << 60) || n > ((int64_t)1 << 60)) {
                    st = mha_error(MHA_ERR_VALUE, "nonpad_kv_seqlen: %lld out of range",
                                   (long long)n);
                    break;
                }
                ((int64_t *)offs.data)[b] = n - pl.L;
            }
            so.causal_offsets = &offs;
        }
    }
    if (qk_matmul_output) {
        so.qk_out = qk_matmul_output;
        so.qk_mode = opt->qk_matmul_output_mode;
    }
    if (st == MHA_OK)
        st = mha_sdpa_forward(&y4, &pl.q4, &K, &V, &so);
    mha_tensor_free(&kt);
    mha_tensor_free(&vt);
    mha_tensor_free(&mask);
    mha_tensor_free(&offs);
    return st;
}
