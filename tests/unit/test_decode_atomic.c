/* test_decode_atomic.c - a failed call changes nothing (issue 12, defect 4).
 *
 * mha_decoder_decode_step used to append the new token to layer 0's KV
 * cache before a later check failed (bad activation, layer_norm_eps = 0,
 * an unknown kernel, a later layer's bad weight); every later step was then
 * wrong.  Each failure below must leave every layer's cache storage and
 * position bit-identical, and a retry with good options must give the
 * outputs of a clean run, bit for bit.  Also: a rejected kv_cache_append
 * leaves the cache as it was.
 *
 * Letters: NL layers, B batch, S memory length, E width, H heads, F MLP
 * width, T steps.
 */
#include "test.h"

#include "internal.h"

enum { NL = 3, B = 2, S = 4, E = 8, H = 2, F = 12, T = 5 };

typedef struct {
    float buf[NL][2 * (4 * E * E + 4 * E) + 2 * F * E + F + E + 6 * E];
    mha_tensor t[NL][18];
    mha_decoder_layer_weights lw[NL];
    mha_decoder_weights w;
    float mem[B * S * E], tgt[T][B * E];
    mha_tensor M;
} decoder_case;

static void case_make(decoder_case *d) {
    uint64_t seed = 700;
    for (int l = 0; l < NL; l++) {
        float *p = d->buf[l];
        int n = 0;
        const mha_tensor **slots[18];
        mha_decoder_layer_weights *lw = &d->lw[l];
        memset(lw, 0, sizeof *lw);
        int64_t shapes[18][2] = {{3 * E, E}, {3 * E, 0}, {E, E}, {E, 0}, {3 * E, E}, {3 * E, 0},
                                 {E, E},     {E, 0},     {F, E}, {F, 0}, {E, F},     {E, 0},
                                 {E, 0},     {E, 0},     {E, 0}, {E, 0}, {E, 0},     {E, 0}};
        slots[0] = &lw->self_attn.in_proj_weight, slots[1] = &lw->self_attn.in_proj_bias;
        slots[2] = &lw->self_attn.out_proj_weight, slots[3] = &lw->self_attn.out_proj_bias;
        slots[4] = &lw->multihead_attn.in_proj_weight, slots[5] = &lw->multihead_attn.in_proj_bias;
        slots[6] = &lw->multihead_attn.out_proj_weight;
        slots[7] = &lw->multihead_attn.out_proj_bias;
        slots[8] = &lw->linear1_weight, slots[9] = &lw->linear1_bias;
        slots[10] = &lw->linear2_weight, slots[11] = &lw->linear2_bias;
        slots[12] = &lw->norm1_weight, slots[13] = &lw->norm1_bias;
        slots[14] = &lw->norm2_weight, slots[15] = &lw->norm2_bias;
        slots[16] = &lw->norm3_weight, slots[17] = &lw->norm3_bias;
        for (; n < 18; n++) {
            int nd = shapes[n][1] ? 2 : 1;
            int64_t cnt = shapes[n][0] * (nd == 2 ? shapes[n][1] : 1);
            mha_randn(p, cnt, seed++, 0.3f);
            mha_tensor_init(&d->t[l][n], MHA_F32, p, nd, shapes[n]);
            *slots[n] = &d->t[l][n];
            p += cnt;
        }
    }
    d->w = (mha_decoder_weights){NL, d->lw, 0, NULL, NULL};
    mha_randn(d->mem, B * S * E, 7, 1.0f);
    for (int t = 0; t < T; t++)
        mha_randn(d->tgt[t], B * E, 20 + (uint64_t)t, 1.0f);
    mha_tensor_init(&d->M, MHA_F32, d->mem, 3, (int64_t[]){B, S, E});
}

static void good_options(mha_layer_options *o) {
    mha_layer_options_init(o);
    o->num_heads = H, o->activation = MHA_ACT_GELU;
}

static mha_status step(decoder_case *d, mha_decoder_cache *c, int t, float *y,
                       const mha_decoder_weights *w, const mha_layer_options *o) {
    mha_tensor X, Y;
    mha_tensor_init(&X, MHA_F32, d->tgt[t], 3, (int64_t[]){B, 1, E});
    mha_tensor_init(&Y, MHA_F32, y, 3, (int64_t[]){B, 1, E});
    return mha_decoder_decode_step(&Y, &X, w, c, o);
}

/* A copy of every layer's cache storage and position. */
typedef struct {
    void *k[NL], *v[NL]; /* bytes of the storage */
    size_t nk[NL], nv[NL];
    int64_t pos[NL];
} cache_snapshot;

static void snap(const mha_decoder_cache *c, cache_snapshot *s) {
    for (int l = 0; l < NL; l++) {
        const mha_kv_cache *kv = mha_decoder_cache_layer(c, l);
        const void *k, *v;
        mha_kv_cache_storage(kv, &k, &s->nk[l], &v, &s->nv[l]);
        s->k[l] = malloc(s->nk[l]);
        s->v[l] = malloc(s->nv[l]);
        memcpy(s->k[l], k, s->nk[l]);
        memcpy(s->v[l], v, s->nv[l]);
        s->pos[l] = mha_kv_cache_position(kv);
    }
}

static bool snap_same(const mha_decoder_cache *c, const cache_snapshot *s) {
    bool same = true;
    for (int l = 0; l < NL; l++) {
        const mha_kv_cache *kv = mha_decoder_cache_layer(c, l);
        const void *k, *v;
        size_t nk, nv;
        mha_kv_cache_storage(kv, &k, &nk, &v, &nv);
        same = same && nk == s->nk[l] && nv == s->nv[l] && mha_kv_cache_position(kv) == s->pos[l] &&
               !memcmp(k, s->k[l], nk) && !memcmp(v, s->v[l], nv);
    }
    return same;
}

static void snap_free(cache_snapshot *s) {
    for (int l = 0; l < NL; l++)
        free(s->k[l]), free(s->v[l]);
}

/* The failures: options, and weights that only a later layer's check sees. */
enum { BAD_ACT, BAD_EPS, BAD_KERNEL, BAD_LAST_LAYER_WEIGHT, BAD_LAST_CROSS_WEIGHT, BAD_LAST_FF,
       N_BAD };
static const char *const bad_names[N_BAD] = {"activation", "layer_norm_eps = 0", "unknown kernel",
                                             "layer 2 out_proj_weight shape",
                                             "layer 2 cross q weight missing",
                                             "layer 2 linear1 shape"};

TEST(decode_step_failure_leaves_cache_identical) {
    static decoder_case d;
    case_make(&d);
    mha_layer_options good;
    good_options(&good);
    /* the clean run */
    float clean[T][B * E];
    mha_decoder_cache *c0;
    REQUIRE_OK(mha_decoder_cache_create(&c0, &d.w, &d.M, H, T));
    for (int t = 0; t < T; t++)
        REQUIRE_OK(step(&d, c0, t, clean[t], &d.w, &good));
    /* the cache is full now: one more step fails and changes nothing */
    {
        cache_snapshot s;
        snap(c0, &s);
        float y[B * E];
        CHECK_STATUS(step(&d, c0, 0, y, &d.w, &good), MHA_ERR_VALUE);
        CHECK(snap_same(c0, &s));
        snap_free(&s);
    }
    mha_decoder_cache_free(c0);

    for (int bad = 0; bad < N_BAD; bad++) {
        for (int fail_at = 0; fail_at < T; fail_at += 2) { /* fail before step fail_at */
            mha_decoder_cache *c;
            REQUIRE_OK(mha_decoder_cache_create(&c, &d.w, &d.M, H, T));
            float y[B * E];
            for (int t = 0; t < T; t++) {
                if (t == fail_at) {
                    mha_layer_options o = good;
                    mha_decoder_layer_weights lw[NL];
                    memcpy(lw, d.lw, sizeof lw);
                    mha_decoder_weights w = {NL, lw, 0, NULL, NULL};
                    mha_tensor wrong; /* (E,E-1): a shape no layer accepts */
                    mha_tensor_init(&wrong, MHA_F32, d.buf[0], 2, (int64_t[]){E, E - 1});
                    switch (bad) {
                    case BAD_ACT: o.activation = (mha_activation)42; break;
                    case BAD_EPS: o.layer_norm_eps = 0.0f; break;
                    case BAD_KERNEL: o.kernel = (mha_kernel)99; break;
                    case BAD_LAST_LAYER_WEIGHT: lw[NL - 1].self_attn.out_proj_weight = &wrong; break;
                    case BAD_LAST_CROSS_WEIGHT:
                        lw[NL - 1].multihead_attn.in_proj_weight = NULL;
                        break;
                    case BAD_LAST_FF: lw[NL - 1].linear1_weight = &wrong; break;
                    }
                    cache_snapshot s;
                    snap(c, &s);
                    float keep[B * E];
                    memset(y, 0x5a, sizeof y);
                    memcpy(keep, y, sizeof y);
                    mha_status st = step(&d, c, t, y, &w, &o);
                    if (st == MHA_OK)
                        test_fail(__FILE__, __LINE__, "%s: accepted", bad_names[bad]);
                    if (!snap_same(c, &s))
                        test_fail(__FILE__, __LINE__, "%s at step %d: the cache changed",
                                  bad_names[bad], t);
                    if (memcmp(y, keep, sizeof y))
                        test_fail(__FILE__, __LINE__, "%s at step %d: out was written",
                                  bad_names[bad], t);
                    snap_free(&s);
                }
                /* the retry (and every later step) equals the clean run */
                REQUIRE_OK(step(&d, c, t, y, &d.w, &good));
                if (memcmp(y, clean[t], sizeof y))
                    test_fail(__FILE__, __LINE__, "%s before step %d: step %d differs from a clean run",
                              bad_names[bad], fail_at, t);
            }
            mha_decoder_cache_free(c);
        }
    }
}

TEST(decode_kv_cache_append_failure_leaves_cache_identical) {
    mha_kv_cache *c;
    REQUIRE_OK(mha_kv_cache_create(&c, MHA_F32, 1, 2, 3, 4, 4, 0));
    float k[2 * 2 * 4], v[2 * 2 * 4];
    mha_randn(k, 16, 1, 1.0f), mha_randn(v, 16, 2, 1.0f);
    mha_tensor K, V, Vbad;
    mha_tensor_init(&K, MHA_F32, k, 4, (int64_t[]){1, 2, 2, 4});
    mha_tensor_init(&V, MHA_F32, v, 4, (int64_t[]){1, 2, 2, 4});
    mha_tensor_init(&Vbad, MHA_F32, v, 4, (int64_t[]){1, 2, 1, 4});
    REQUIRE_OK(mha_kv_cache_append(c, &K, &V));
    const void *ck, *cv;
    size_t nk, nv;
    mha_kv_cache_storage(c, &ck, &nk, &cv, &nv);
    void *sk = malloc(nk), *sv = malloc(nv);
    memcpy(sk, ck, nk), memcpy(sv, cv, nv);
    CHECK_STATUS(mha_kv_cache_append(c, &K, &Vbad), MHA_ERR_SHAPE); /* v's length differs */
    CHECK_STATUS(mha_kv_cache_append(c, &K, &V), MHA_ERR_VALUE);    /* 2 + 2 > capacity 3 */
    CHECK(mha_kv_cache_position(c) == 2);
    CHECK(!memcmp(ck, sk, nk) && !memcmp(cv, sv, nv));
    free(sk), free(sv);
    mha_kv_cache_free(c);
}
