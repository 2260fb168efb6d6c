/* kv_cache.c - the KV cache of autoregressive decoding, the decode step
 * (one new query token against every cached key, split across threads) and
 * the log-sum-exp merge of partial attention results.
 *
 * Letter legend: B batch, Hq query heads, Hkv key/value heads, G = Hq/Hkv
 * query heads per kv head, d head dim of q/k, dv head dim of v, W window,
 * C keys per split.
 *
 * Layout: k (B,Hkv,slots,d), v (B,Hkv,slots,dv), one allocation each, in
 * the storage dtype (MHA_F32, or MHA_BF16 / MHA_F16: 2 bytes an element).
 * Without a window slot t holds position t; with a window of W the slots
 * are a ring and position t lives in slot t mod W.
 *
 * Decode: ref: Dao et al., "Flash-Decoding for long-context inference"
 * (2023): the keys of each (b, kv head) are cut into splits of C keys (C
 * fixed, not derived from the thread count, so results are bit-identical
 * for any thread count); a split computes, for the G query heads of its kv
 * head (K and V read once for the group: GQA never replicates K/V), the
 * scores, their max m, the sum l of exp(s - m) and acc = sum exp(s - m) v;
 * the splits are merged in order by
 *     M = max m_c,  l = sum l_c e^{m_c - M},  out = sum acc_c e^{m_c - M} / l
 * with the sink as one more term of l.  The reference path (kernel REF or
 * float64 softmax) runs mha_attn_fwd_f32_ref on the cache in position order.
 *
 * Half caches: append rounds k and v to the storage dtype (nearest even);
 * the split loops read the half rows directly (never a whole-cache
 * conversion), round P to the storage dtype before P.V (as FlashAttention
 * does; l sums the unrounded P) and accumulate in float32.  The reference
 * path hands the cache's half values to the reference kernel, which rounds
 * P the same way relative to the row's max (float64 sums).
 */
#include "internal.h"
#include "kernels/attention_decode.h"
#include "kernels/convert.h"

#include <string.h>


struct mha_kv_cache {
    int64_t B, Hkv, capacity, d, dv, window;
    mha_dtype dtype;  /* storage of k and v                               */
    int64_t slots;    /* capacity, or W with a window                    */
    int64_t pos;      /* tokens appended since create/reset              */
    size_t es;        /* bytes of one element of dtype                    */
    void *k;          /* (B,Hkv,slots,d) of dtype                         */
    void *v;          /* (B,Hkv,slots,dv) of dtype                        */
};

/* Row `slot` of (b*Hkv + h) = bh in k / v. */
static char *k_row(const mha_kv_cache *c, int64_t bh, int64_t slot) {
    return (char *)c->k + (size_t)((bh * c->slots + slot) * c->d) * c->es;
}
static char *v_row(const mha_kv_cache *c, int64_t bh, int64_t slot) {
    return (char *)c->v + (size_t)((bh * c->slots + slot) * c->dv) * c->es;
}

mha_status mha_kv_cache_create(mha_kv_cache **cache, mha_dtype dtype, int64_t B, int64_t Hkv,
                               int64_t capacity, int64_t d, int64_t dv, int64_t window) {
    MHA_CHECK(cache, MHA_ERR_NULL, "cache: NULL");
    *cache = NULL;
    MHA_CHECK(mha_dtype_is_float(dtype), MHA_ERR_DTYPE,
              "kv cache: storage dtype %d, want MHA_F32, MHA_F16 or MHA_BF16", (int)dtype);
    MHA_CHECK(B > 0 && Hkv > 0 && capacity > 0 && d > 0 && dv > 0, MHA_ERR_SHAPE,
              "kv cache: B %lld, Hkv %lld, capacity %lld, d %lld, dv %lld must be > 0",
              (long long)B, (long long)Hkv, (long long)capacity, (long long)d, (long long)dv);
    MHA_CHECK(window >= 0 && window <= capacity, MHA_ERR_VALUE,
              "window: %lld, want 0 (none) or 1..capacity (%lld)", (long long)window,
              (long long)capacity);
    const size_t es = mha_dtype_size(dtype);
    int64_t slots = window > 0 ? window : capacity, nk, nv;
    MHA_CHECK(mha_product((int64_t[]){B, Hkv, slots, d}, 4, &nk) &&
                  mha_product((int64_t[]){B, Hkv, slots, dv}, 4, &nv) &&
                  (uint64_t)nk < SIZE_MAX / es && (uint64_t)nv < SIZE_MAX / es,
              MHA_ERR_OVERFLOW, "kv cache: B*Hkv*slots*d overflows");
    mha_kv_cache *c = mha_calloc(1, sizeof *c);
    MHA_CHECK(c, MHA_ERR_NOMEM, "kv cache: cannot allocate the object");
    c->k = mha_malloc(es * (size_t)nk);
    c->v = mha_malloc(es * (size_t)nv);
    if (!c->k || !c->v) {
        mha_kv_cache_free(c);
        return mha_error(MHA_ERR_NOMEM,
                         "kv cache: cannot allocate %lld + %lld elements of %zu bytes",
                         (long long)nk, (long long)nv, es);
    }
    c->B = B, c->Hkv = Hkv, c->capacity = capacity, c->d = d, c->dv = dv, c->dtype = dtype;
    c->es = es;
    c->window = window, c->slots = slots;
    *cache = c;
    return MHA_OK;
}

void mha_kv_cache_free(mha_kv_cache *cache) {
    if (!cache)
        return;
    mha_free(cache->k);
    mha_free(cache->v);
    mha_free(cache);
}

void mha_kv_cache_reset(mha_kv_cache *cache) {
    if (cache)
        cache->pos = 0;
}

int64_t mha_kv_cache_position(const mha_kv_cache *cache) { return cache ? cache->pos : 0; }

int64_t mha_kv_cache_length(const mha_kv_cache *cache) {
    if (!cache)
        return 0;
    return cache->pos < cache->slots ? cache->pos : cache->slots;
}

size_t mha_kv_cache_slot_bytes(const mha_kv_cache *c) {
    return (size_t)(c->B * c->Hkv * (c->d + c->dv)) * c->es;
}

/* Copies (or, restore != 0, writes back) the slot the next append fills:
 * saved (B,Hkv,d) keys then (B,Hkv,dv) values, in the storage dtype. */
static void slot_copy(mha_kv_cache *c, char *saved, int restore) {
    const int64_t slot = c->pos % c->slots;
    const size_t kb = (size_t)c->d * c->es, vb = (size_t)c->dv * c->es;
    char *sk = saved, *sv = saved + (size_t)(c->B * c->Hkv) * kb;
    for (int64_t bh = 0; bh < c->B * c->Hkv; bh++) {
        char *kd = k_row(c, bh, slot), *vd = v_row(c, bh, slot);
        char *ks = sk + (size_t)bh * kb, *vs = sv + (size_t)bh * vb;
        memcpy(restore ? kd : ks, restore ? ks : kd, kb);
        memcpy(restore ? vd : vs, restore ? vs : vd, vb);
    }
}

void mha_kv_cache_slot_save(const mha_kv_cache *c, void *saved) {
    slot_copy((mha_kv_cache *)c, saved, 0);
}

void mha_kv_cache_storage(const mha_kv_cache *c, const void **k, size_t *k_bytes, const void **v,
                          size_t *v_bytes) {
    *k = c->k, *v = c->v;
    *k_bytes = (size_t)(c->B * c->Hkv * c->slots * c->d) * c->es;
    *v_bytes = (size_t)(c->B * c->Hkv * c->slots * c->dv) * c->es;
}

void mha_kv_cache_rewind(mha_kv_cache *c, int64_t pos, const void *saved) {
    c->pos = pos;
    slot_copy(c, (char *)saved, 1);
}

mha_status mha_kv_cache_append(mha_kv_cache *c, const mha_tensor *k, const mha_tensor *v) {
    char s1[MHA_SHAPE_BUF];
    MHA_CHECK(c, MHA_ERR_NULL, "cache: NULL");
    MHA_TRY(mha_check_float_tensor(k, "k", 4));
    MHA_TRY(mha_check_float_tensor(v, "v", 4));
    const int64_t n = k->shape[2];
    MHA_CHECK(k->shape[0] == c->B && k->shape[1] == c->Hkv && k->shape[3] == c->d, MHA_ERR_SHAPE,
              "k: shape %s, want (%lld,%lld,n,%lld)", mha_shape_str(k, s1, sizeof s1),
              (long long)c->B, (long long)c->Hkv, (long long)c->d);
    MHA_CHECK(v->shape[0] == c->B && v->shape[1] == c->Hkv && v->shape[2] == n &&
                  v->shape[3] == c->dv,
              MHA_ERR_SHAPE, "v: shape %s, want (%lld,%lld,%lld,%lld)",
              mha_shape_str(v, s1, sizeof s1), (long long)c->B, (long long)c->Hkv, (long long)n,
              (long long)c->dv);
    MHA_CHECK(c->window > 0 || n <= c->capacity - c->pos, MHA_ERR_VALUE,
              "kv cache: appending %lld steps to %lld of capacity %lld", (long long)n,
              (long long)c->pos, (long long)c->capacity);
    MHA_CHECK(n <= INT64_MAX - c->pos, MHA_ERR_OVERFLOW, "kv cache: position overflows");
    /* converted (rounded to nearest even) to the storage dtype */
    for (int64_t t = 0; t < n; t++) {
        const int64_t slot = (c->pos + t) % c->slots;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < c->Hkv; h++) {
                char *kd = k_row(c, b * c->Hkv + h, slot), *vd = v_row(c, b * c->Hkv + h, slot);
                const int64_t k0 = b * k->stride[0] + h * k->stride[1] + t * k->stride[2];
                const int64_t v0 = b * v->stride[0] + h * v->stride[1] + t * v->stride[2];
                for (int64_t x = 0; x < c->d; x++)
                    mha_store_f(kd, c->dtype, x,
                                mha_load_f(k->data, k->dtype, k0 + x * k->stride[3]));
                for (int64_t x = 0; x < c->dv; x++)
                    mha_store_f(vd, c->dtype, x,
                                mha_load_f(v->data, v->dtype, v0 + x * v->stride[3]));
            }
    }
    c->pos += n;
    return MHA_OK;
}

/* ---- merge ------------------------------------------------------------------ */

mha_status mha_attention_merge(mha_tensor *out, mha_tensor *lse_out, int64_t n,
                               const mha_tensor *const *parts_out,
                               const mha_tensor *const *parts_lse) {
    char s1[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_tensor(out, "out", 4, MHA_F32));
    MHA_TRY(mha_check_writable(out, "out"));
    MHA_CHECK(n >= 1 && parts_out && parts_lse, MHA_ERR_VALUE, "n: %lld parts, want >= 1",
              (long long)n);
    const int64_t B = out->shape[0], H = out->shape[1], L = out->shape[2], dv = out->shape[3];
    if (lse_out) {
        MHA_TRY(mha_check_tensor(lse_out, "lse_out", 3, MHA_F32));
        MHA_TRY(mha_check_writable(lse_out, "lse_out"));
        MHA_CHECK(lse_out->shape[0] == B && lse_out->shape[1] == H && lse_out->shape[2] == L,
                  MHA_ERR_SHAPE, "lse_out: shape %s, want (%lld,%lld,%lld)",
                  mha_shape_str(lse_out, s1, sizeof s1), (long long)B, (long long)H,
                  (long long)L);
        MHA_CHECK(!mha_tensors_overlap(out, lse_out), MHA_ERR_ALIAS, "lse_out: overlaps out");
    }
    for (int64_t p = 0; p < n; p++) {
        const mha_tensor *o = parts_out[p], *l = parts_lse[p];
        MHA_TRY(mha_check_tensor(o, "parts_out[p]", 4, MHA_F32));
        MHA_TRY(mha_check_tensor(l, "parts_lse[p]", 3, MHA_F32));
        MHA_CHECK(o->shape[0] == B && o->shape[1] == H && o->shape[2] == L && o->shape[3] == dv &&
                      l->shape[0] == B && l->shape[1] == H && l->shape[2] == L,
                  MHA_ERR_SHAPE, "parts %lld: shapes %s and lse do not fit out", (long long)p,
                  mha_shape_str(o, s1, sizeof s1));
        MHA_CHECK(!mha_tensors_overlap(out, o) && !mha_tensors_overlap(out, l) &&
                      !mha_tensors_overlap(lse_out, o) && !mha_tensors_overlap(lse_out, l),
                  MHA_ERR_ALIAS, "out/lse_out: overlap part %lld", (long long)p);
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                double m = -INFINITY;
                bool nan = false;
                for (int64_t p = 0; p < n; p++) {
                    const mha_tensor *l = parts_lse[p];
                    double x = ((const float *)l->data)[b * l->stride[0] + h * l->stride[1] +
                                                        i * l->stride[2]];
                    if (isnan(x))
                        nan = true;
                    else if (x > m)
                        m = x;
                }
                float *o = (float *)out->data + b * out->stride[0] + h * out->stride[1] +
                           i * out->stride[2];
                double sum = 0.0;
                for (int64_t c = 0; c < dv; c++)
                    o[c * out->stride[3]] = 0.0f;
                if (m == -INFINITY && !nan) { /* empty everywhere */
                    if (lse_out)
                        ((float *)lse_out->data)[b * lse_out->stride[0] + h * lse_out->stride[1] +
                                                 i * lse_out->stride[2]] = -INFINITY;
                    continue;
                }
                if (nan)
                    m = NAN;
                for (int64_t p = 0; p < n; p++) {
                    const mha_tensor *l = parts_lse[p];
                    double x = ((const float *)l->data)[b * l->stride[0] + h * l->stride[1] +
                                                        i * l->stride[2]];
                    sum += x == -INFINITY ? 0.0 : exp(x - m);
                }
                for (int64_t c = 0; c < dv; c++) {
                    double acc = 0.0;
                    for (int64_t p = 0; p < n; p++) {
                        const mha_tensor *l = parts_lse[p], *po = parts_out[p];
                        double x = ((const float *)l->data)[b * l->stride[0] + h * l->stride[1] +
                                                            i * l->stride[2]];
                        if (x == -INFINITY)
                            continue; /* an empty part: its out is not read */
                        acc += exp(x - m) / sum *
                               ((const float *)po->data)[b * po->stride[0] + h * po->stride[1] +
                                                         i * po->stride[2] + c * po->stride[3]];
                    }
                    o[c * out->stride[3]] = (float)acc;
                }
                if (lse_out)
                    ((float *)lse_out->data)[b * lse_out->stride[0] + h * lse_out->stride[1] +
                                             i * lse_out->stride[2]] = (float)(m + log(sum));
            }
    return MHA_OK;
}

/* ---- decode ----------------------------------------------------------------- */

enum { SPLIT_KEYS = MHA_DECODE_SPLIT_KEYS }; /* C (attention_decode.h) */

/* Position of slot s when the cache holds len keys ending at pos - 1. */
static int64_t slot_position(const mha_kv_cache *c, int64_t s, int64_t len) {
    if (c->window == 0)
        return s;
    int64_t base = c->pos - len; /* oldest position held */
    return base + ((s - base % c->slots) % c->slots + c->slots) % c->slots;
}

typedef struct decode_args {
    const mha_kv_cache *c;
    const mha_decode_isa *isa;
    const float *q;          /* (B,Hq,d) contiguous, rotated and pre-scaled */
    int64_t Hq, G, len, nsplit;
    int64_t tasks;           /* B*Hkv*nsplit splits, task t = (b, hk, split) */
    bool ask_ahead;          /* K and V >= MHA_DECODE_AHEAD_MIN_BYTES        */
    float softcap;
    const mha_tensor *alibi; /* (Hq) or data NULL */
    float *part;             /* (B,Hkv,nsplit,G,dv+2): acc, m, l            */
} decode_args;

/* Task t's split: (b, kv head hk) = pair, keys [j0, j0 + n). */
static void split_of(const decode_args *a, int64_t t, int64_t *pair, int64_t *j0, int64_t *n) {
    *pair = t / a->nsplit;
    *j0 = t % a->nsplit * SPLIT_KEYS;
    *n = *j0 + SPLIT_KEYS < a->len ? SPLIT_KEYS : a->len - *j0;
}

/* Task t: one split, keys [j0, j0+n) of (b, kv head hk) for the G query
 * heads; s (G, SPLIT_KEYS) is this thread's scratch.  Q.K asks for the
 * split's V rows and P.V for the K rows of task t + 1, the same thread's
 * next task but at the end of its static range (mha_decode_ahead). */
static void decode_split(const decode_args *a, int64_t t, float *s) {
    const mha_kv_cache *c = a->c;
    const int64_t dv = c->dv, G = a->G;
    int64_t bh, j0, n;
    split_of(a, t, &bh, &j0, &n);
    const int64_t b = bh / c->Hkv, hk = bh % c->Hkv;
    const void *kb = k_row(c, bh, j0), *vb = v_row(c, bh, j0);
    float *part = a->part + t * G * (dv + 2);
    mha_decode_ahead ahead = {a->ask_ahead ? vb : NULL, n, (size_t)dv * c->es};
    /* scores (G, n): each K row read once for the group */
    a->isa->qk(s, a->q + (b * a->Hq + hk * G) * c->d, kb, c->dtype, n, G, c->d, &ahead);
    for (int64_t g = 0; g < G; g++) {
        float *sg = s + g * n;
        const float slope =
            a->alibi->data ? ((const float *)a->alibi->data)[(hk * G + g) * a->alibi->stride[0]]
                           : 0.0f;
        if (a->softcap > 0.0f || slope != 0.0f)
            for (int64_t j = 0; j < n; j++) {
                float sc = mha_attn_softcap(sg[j], a->softcap);
                if (slope != 0.0f) /* ALiBi on positions: |pos_q - pos_j| */
                    sc -= slope * (float)(c->pos - 1 - slot_position(c, j0 + j, a->len));
                sg[j] = sc;
            }
        const float m = a->isa->row_max(sg, n);
        part[g * (dv + 2) + dv] = m, part[g * (dv + 2) + dv + 1] = a->isa->exp_sum(sg, n, m);
    }
    /* P rounded to the storage dtype for P.V (l above summed it unrounded) */
    if (c->dtype != MHA_F32)
        a->isa->round_p(s, G * n, c->dtype);
    /* acc (G, dv) += P V: each V row read once for the group */
    float *acc = s + G * SPLIT_KEYS;
    for (int64_t x = 0; x < G * dv; x++)
        acc[x] = 0.0f;
    ahead.p = NULL;
    if (a->ask_ahead && t + 1 < a->tasks) {
        int64_t bh1, j1, n1;
        split_of(a, t + 1, &bh1, &j1, &n1);
        ahead = (mha_decode_ahead){k_row(c, bh1, j1), n1, (size_t)c->d * c->es};
    }
    a->isa->pv(acc, s, vb, c->dtype, n, G, dv, &ahead);
    for (int64_t g = 0; g < G; g++)
        for (int64_t x = 0; x < dv; x++)
            part[g * (dv + 2) + x] = acc[g * dv + x];
}

/* The reference decode: the cache in position order, in its storage
 * dtype, through the reference kernel (float64 sums; for a half cache P
 * rounded to the dtype before P.V, relative to the row's max where the
 * split path takes each split's); out (B,Hq,1,dv) float32. */
static mha_status decode_ref(mha_tensor *out, const mha_tensor *q, const mha_kv_cache *c,
                             const mha_sdpa_options *opt, int64_t len) {
    int64_t nk = c->B * c->Hkv * len * c->d, nv = c->B * c->Hkv * len * c->dv;
    uint8_t *buf = mha_malloc(c->es * (size_t)(nk + nv > 0 ? nk + nv : 1));
    MHA_CHECK(buf, MHA_ERR_NOMEM, "decode: cannot allocate %lld elements", (long long)(nk + nv));
    uint8_t *vbuf = buf + c->es * (size_t)nk;
    for (int64_t bh = 0; bh < c->B * c->Hkv; bh++)
        for (int64_t s = 0; s < len; s++) {
            int64_t j = slot_position(c, s, len) - (c->pos - len);
            memcpy(buf + c->es * (size_t)((bh * len + j) * c->d), k_row(c, bh, s),
                   c->es * (size_t)c->d);
            memcpy(vbuf + c->es * (size_t)((bh * len + j) * c->dv), v_row(c, bh, s),
                   c->es * (size_t)c->dv);
        }
    mha_tensor K, V;
    mha_tensor_init(&K, c->dtype, buf, 4, (int64_t[]){c->B, c->Hkv, len, c->d});
    mha_tensor_init(&V, c->dtype, vbuf, 4, (int64_t[]){c->B, c->Hkv, len, c->dv});
    mha_sdpa_options o = *opt;
    o.kernel = MHA_KERNEL_REF;
    o.rope = MHA_ROPE_NONE; /* q is already rotated by the caller */
    mha_status st = mha_sdpa_forward(out, q, &K, &V, &o);
    mha_free(buf);
    return st;
}

/* The decode loops of kernel kr (scalar for MHA_KERNEL_SCALAR), or
 * MHA_ERR_UNSUPPORTED naming the ISA when the build or CPU lacks it. */
mha_status mha_decode_isa_for(mha_kernel kr, const mha_decode_isa **isa) {
    *isa = &mha_decode_isa_scalar;
    if (kr == MHA_KERNEL_AVX512) {
        MHA_TRY(mha_avx512_check());
        *isa = MHA_AVX512_PICK(mha_decode_isa_avx512);
    } else if (kr == MHA_KERNEL_AVX2) {
        MHA_CHECK(mha_decode_isa_avx2.qk && mha_cpu_has_avx2_fma(), MHA_ERR_UNSUPPORTED,
                  "kernel: avx2 requested but this CPU lacks AVX2/FMA");
        *isa = &mha_decode_isa_avx2;
    }
    return MHA_OK;
}

/* Head (b, h) of out (B,Hq,1,dv) and its LSE from its nsplit partials of
 * a->part, merged in split order in double with the sink as one more term;
 * w (nsplit + dv) doubles of scratch: the weights e^{m_c - M}, then the
 * row's sums (each element's sum over the splits in order, whatever the
 * thread count). */
static void merge_head(mha_tensor *out, const decode_args *a, const mha_attn_problem *p,
                       int64_t b, int64_t h, double *w) {
    const int64_t G = a->G, dv = a->c->dv, nsplit = a->nsplit, hk = h / G, g = h % G;
    const float *pb = a->part + ((b * a->c->Hkv + hk) * nsplit * G + g) * (dv + 2);
    const int64_t ps = G * (dv + 2); /* stride between splits */
    const float sink = p->sinks.data ? ((const float *)p->sinks.data)[h * p->sinks.stride[0]]
                                     : -INFINITY;
    double m = sink;
    bool nan = false;
    for (int64_t sp = 0; sp < nsplit; sp++) {
        double x = pb[sp * ps + dv];
        if (isnan(x))
            nan = true;
        else if (x > m)
            m = x;
    }
    if (nan)
        m = NAN;
    double l = p->sinks.data ? exp((double)sink - m) : 0.0;
    double *restrict acc = w + nsplit;
    for (int64_t x = 0; x < dv; x++)
        acc[x] = 0.0;
    for (int64_t sp = 0; sp < nsplit; sp++) {
        const float *restrict r = pb + sp * ps;
        const double wsp = exp(r[dv] - m); /* a local: the x loop vectorises */
        w[sp] = wsp;
        l += r[dv + 1] * wsp;
#pragma omp simd
        for (int64_t x = 0; x < dv; x++)
            acc[x] += r[x] * wsp;
    }
    /* times 1/l in double (the float32 result is the rounded quotient but
     * for a double rounding step, 1e-16 of it); the loops are `omp simd`:
     * scalar, with a divide an element, the merge had been a tenth of a
     * short step (S 256, perf) */
    const double inv_l = 1.0 / l;
    float *orow = (float *)out->data + b * out->stride[0] + h * out->stride[1];
    const int64_t os = out->stride[3];
    if (os == 1)
#pragma omp simd
        for (int64_t x = 0; x < dv; x++)
            orow[x] = (float)(acc[x] * inv_l);
    else
        for (int64_t x = 0; x < dv; x++)
            orow[x * os] = (float)(acc[x] * inv_l);
    if (p->lse.data)
        ((float *)p->lse.data)[b * p->lse.stride[0] + h * p->lse.stride[1]] = (float)(m + log(l));
}

/* The split path: q (B,Hq,d) contiguous float32 (rotated; scaled here in
 * place), out (B,Hq,1,dv) float32; work (B,Hkv,nsplit,G,dv+2) partials then
 * nthreads scratch slices of G*(SPLIT_KEYS+dv); wmerge nthreads slices of
 * nsplit + dv doubles for merge_head. */
static mha_status decode_splits(mha_tensor *out, float *q, const mha_kv_cache *c,
                                const mha_attn_problem *p, mha_kernel kr, int64_t len,
                                int64_t nsplit, float *work, double *wmerge, int nthreads) {
    const int64_t B = c->B, Hq = p->Hq, G = Hq / c->Hkv, d = c->d, dv = c->dv;
    /* q pre-scaled: q*scale, or (q*sqrt(scale))*sqrt(scale) for the ONNX
     * convention (k is not rescaled: the last bits may differ from the
     * forward, well inside the tests' 1e-5) */
    const int64_t nq = B * Hq * d;
    const float scale = p->onnx_scale ? p->qk_scale : p->scale; /* locals: the loops vectorise */
#pragma omp simd
    for (int64_t x = 0; x < nq; x++)
        q[x] *= scale;
    if (p->onnx_scale)
#pragma omp simd
        for (int64_t x = 0; x < nq; x++)
            q[x] *= scale;
    const mha_decode_isa *isa;
    MHA_TRY(mha_decode_isa_for(kr, &isa));
    const double bytes = (double)(B * c->Hkv * len) * (double)(d + dv) * (double)c->es;
    decode_args a = {c, isa, q, Hq, G, len, nsplit, B * c->Hkv * nsplit,
                     bytes >= MHA_DECODE_AHEAD_MIN_BYTES, p->softcap, &p->alibi, work};
    float *scratch = work + a.tasks * G * (dv + 2);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < a.tasks; t++) {
        const int tid = mha_thread_index();
        decode_split(&a, t, scratch + (size_t)tid * (size_t)(G * (SPLIT_KEYS + dv)));
    }
    /* merge each head's splits (heads in parallel; each thread its slice
     * of wmerge) */
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t bh = 0; bh < B * Hq; bh++)
        merge_head(out, &a, p, bh / Hq, bh % Hq,
                   wmerge + (size_t)mha_thread_index() * (size_t)(nsplit + dv));
    return MHA_OK;
}

mha_status mha_attention_decode(mha_tensor *out, const mha_tensor *q, const mha_kv_cache *c,
                                const mha_sdpa_options *opt) {
    char s1[MHA_SHAPE_BUF];
    MHA_TRY(mha_runtime_check());
    MHA_OPTIONS_DEFAULT(mha_sdpa_options, opt);
    MHA_CHECK(c, MHA_ERR_NULL, "cache: NULL");
    MHA_TRY(mha_check_float_tensor(q, "q", 4));
    MHA_TRY(mha_check_float_tensor(out, "out", 4));
    const int64_t B = c->B, Hq = q->shape[1], d = c->d, dv = c->dv;
    MHA_CHECK(q->shape[0] == B && q->shape[2] == 1 && q->shape[3] == d, MHA_ERR_SHAPE,
              "q: shape %s, want (%lld,Hq,1,%lld)", mha_shape_str(q, s1, sizeof s1), (long long)B,
              (long long)d);
    MHA_CHECK(Hq > 0 && Hq % c->Hkv == 0, MHA_ERR_SHAPE,
              "q: %lld heads are not a multiple of the cache's %lld kv heads", (long long)Hq,
              (long long)c->Hkv);
    MHA_CHECK(out->shape[0] == B && out->shape[1] == Hq && out->shape[2] == 1 &&
                  out->shape[3] == dv,
              MHA_ERR_SHAPE, "out: shape %s, want (%lld,%lld,1,%lld)",
              mha_shape_str(out, s1, sizeof s1), (long long)B, (long long)Hq, (long long)dv);
    MHA_TRY(mha_check_writable(out, "out"));
    MHA_CHECK(!mha_tensors_overlap(out, q), MHA_ERR_ALIAS, "out: overlaps q");
    MHA_CHECK(!opt->attn_mask && !opt->key_padding_mask && !opt->attn_weights && !opt->qk_out &&
                  opt->causal == MHA_CAUSAL_NONE && opt->window_left == -1 &&
                  opt->window_right == -1 && !opt->kv_lengths && !opt->causal_offsets &&
                  !(opt->training && opt->dropout_p > 0.0f),
              MHA_ERR_VALUE,
              "decode: masks, causal, windows, attn_weights, qk_out and dropout come from the cache "
              "(leave them at their defaults)");
    const int64_t len = mha_kv_cache_length(c);

    /* validation of the remaining options through the common checker */
    mha_attn_problem p;
    memset(&p, 0, sizeof p);
    p.B = B, p.Hq = Hq, p.Hkv = c->Hkv, p.L = 1, p.S = len, p.d = d, p.dv = dv;
    p.q = *q, p.o = *out;
    MHA_TRY(mha_attn_resolve_scale(&p, opt));
    mha_sdpa_options o = *opt;
    o.rope = MHA_ROPE_NONE; /* rotated here, at position pos - 1 */
    float *unused = NULL;
    MHA_TRY(mha_attn_check_modern(&p, &o, out, &unused));
    MHA_CHECK(opt->rope == MHA_ROPE_NONE || d % 2 == 0, MHA_ERR_SHAPE, "rope: d = %lld is odd",
              (long long)d);
    MHA_CHECK(opt->rope == MHA_ROPE_NONE || opt->rope == MHA_ROPE_HALF_SPLIT ||
                  opt->rope == MHA_ROPE_INTERLEAVED,
              MHA_ERR_VALUE, "rope: unknown mode %d", (int)opt->rope);

    /* q contiguous (B,Hq,d) float32, rotated at position pos - 1; a half out
     * is computed as float32 in buf (oc) and rounded once at the end */
    const int64_t G = Hq / c->Hkv;
    const int64_t nsplit = (len + SPLIT_KEYS - 1) / SPLIT_KEYS;
    const int nthreads = mha_threads();
    const size_t qn = (size_t)(B * Hq * d), pn = (size_t)(B * c->Hkv * nsplit * G * (dv + 2));
    const size_t on = out->dtype == MHA_F32 ? 0 : (size_t)(B * Hq * dv);
    const size_t sn = (size_t)(G * (SPLIT_KEYS + dv)) * (size_t)nthreads;
    const size_t wo = (qn + on + pn + sn + 1) & ~(size_t)1; /* the doubles, 8-byte aligned */
    const size_t wn = 2 * (size_t)(nsplit + dv) * (size_t)nthreads; /* merge_head's doubles */
    float *buf = mha_malloc(sizeof(float) * (wo + wn));
    MHA_CHECK(buf, MHA_ERR_NOMEM, "decode: cannot allocate %zu floats", wo + wn);
    mha_tensor qc, oc = *out;
    mha_tensor_init(&qc, MHA_F32, buf, 4, (int64_t[]){B, Hq, 1, d});
    if (on)
        mha_tensor_init(&oc, MHA_F32, buf + qn, 4, (int64_t[]){B, Hq, 1, dv});
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            float *row = buf + (b * Hq + h) * d;
            const int64_t at = b * q->stride[0] + h * q->stride[1];
            if (q->dtype == MHA_F32 && q->stride[3] == 1) /* the usual q: a row copy */
                memcpy(row, (const float *)q->data + at, sizeof(float) * (size_t)d);
            else
                for (int64_t x = 0; x < d; x++)
                    row[x] = mha_load_f(q->data, q->dtype, at + x * q->stride[3]);
        }
    mha_status st = MHA_OK;
    if (opt->rope != MHA_ROPE_NONE)
        st = mha_rope_apply(&qc, c->pos - 1, NULL, opt->rope_base, opt->rope);
    mha_kernel kr = mha_kernel_resolve(opt->kernel);
    if (st == MHA_OK && (kr == MHA_KERNEL_REF || p.softmax_f64 || len == 0))
        st = decode_ref(&oc, &qc, c, &o, len);
    else if (st == MHA_OK)
        st = decode_splits(&oc, buf, c, &p, kr, len, nsplit, buf + qn + on, (double *)(buf + wo),
                           nthreads);
    if (st == MHA_OK && on)
        st = mha_tensor_convert(out, &oc);
    mha_free(buf);
    return st;
}

mha_dtype mha_kv_cache_dtype(const mha_kv_cache *cache) { return cache ? cache->dtype : MHA_F32; }
