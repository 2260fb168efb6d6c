/* test_modern.c - the modern attention options against hand-computed cases
 * (softcap, windows, per-batch offsets and key lengths, ALiBi, sinks, LSE,
 * ONNX qk outputs, float64 softmax, ONNX scale), RoPE against its formula,
 * the KV cache and decode step against the last row of a full causal
 * forward (100 steps), the split-KV decode (threads bit-identical) and the
 * log-sum-exp merge, and mha_onnx_attention's checks. */
#include "internal.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static mha_tensor t4(float *x, int64_t a, int64_t b, int64_t c, int64_t d) {
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, x, 4, (int64_t[]){a, b, c, d});
    return t;
}

static double maxdiff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(a[i]) != isnan(b[i]) || (isinf(a[i]) && a[i] != b[i]))
            return INFINITY;
        if (!isinf(a[i]) && d > m)
            m = d;
    }
    return m;
}

/* q = 0, v_j = j (dv = 1): every visible key weighs the same, so each
 * output is the mean of the visible key indices. */
static void mean_case(int64_t B, int64_t L, int64_t S, mha_sdpa_options *opt, float *out) {
    float q[64] = {0}, k[64] = {0}, v[64];
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < S; j++)
            v[b * S + j] = (float)j;
    mha_tensor Q = t4(q, B, 1, L, 1), K = t4(k, B, 1, S, 1), V = t4(v, B, 1, S, 1);
    mha_tensor O = t4(out, B, 1, L, 1);
    opt->kernel = MHA_KERNEL_AUTO;
    CHECK_STATUS(mha_sdpa_forward(&O, &Q, &K, &V, opt), MHA_OK);
}

TEST(modern_window_bidirectional_is_onnx_example) {
    /* onnx test_attention_bidirectional_window: left 1, right 2 */
    mha_sdpa_options o;
    mha_sdpa_options_init(&o);
    o.window_left = 1, o.window_right = 2;
    float out[5], want[5] = {1.0f, 1.5f, 2.5f, 3.0f, 3.5f};
    mean_case(1, 5, 5, &o, out);
    CHECK(maxdiff(out, want, 5) < 1e-6);
    /* causal + left 2: keys i-2..i */
    mha_sdpa_options_init(&o);
    o.causal = MHA_CAUSAL_TOP_LEFT, o.window_left = 2;
    float want2[5] = {0.0f, 0.5f, 1.0f, 2.0f, 3.0f};
    mean_case(1, 5, 5, &o, out);
    CHECK(maxdiff(out, want2, 5) < 1e-6);
    o.window_left = -2;
    float q = 0;
    mha_tensor Q = t4(&q, 1, 1, 1, 1), O = t4(out, 1, 1, 1, 1);
    CHECK_STATUS(mha_sdpa_forward(&O, &Q, &Q, &Q, &o), MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("window");
}

TEST(modern_kv_lengths_and_per_batch_offsets) {
    int64_t lens[2] = {3, 5}, offs[2] = {1, 3};
    mha_tensor Ls, Os;
    mha_tensor_init(&Ls, MHA_I64, lens, 1, (int64_t[]){2});
    mha_tensor_init(&Os, MHA_I64, offs, 1, (int64_t[]){2});
    mha_sdpa_options o;
    mha_sdpa_options_init(&o);
    o.causal = MHA_CAUSAL_BOTTOM_RIGHT, o.kv_lengths = &Ls; /* o_b = S_b - L */
    float out[4], want[4] = {0.5f, 1.0f, 1.5f, 2.0f};
    mean_case(2, 2, 6, &o, out);
    CHECK(maxdiff(out, want, 4) < 1e-6);
    mha_sdpa_options_init(&o);
    o.causal = MHA_CAUSAL_OFFSET, o.causal_offsets = &Os;
    mean_case(2, 2, 6, &o, out);
    CHECK(maxdiff(out, want, 4) < 1e-6);
    /* lengths alone: no causal, keys j < S_b */
    mha_sdpa_options_init(&o);
    o.kv_lengths = &Ls;
    float want3[4] = {1.0f, 1.0f, 2.0f, 2.0f};
    mean_case(2, 2, 6, &o, out);
    CHECK(maxdiff(out, want3, 4) < 1e-6);
    /* a negative offset empties the leading rows: zero */
    int64_t neg[2] = {-1, -1};
    mha_tensor Ns;
    mha_tensor_init(&Ns, MHA_I64, neg, 1, (int64_t[]){2});
    mha_sdpa_options_init(&o);
    o.causal = MHA_CAUSAL_OFFSET, o.causal_offsets = &Ns;
    float want4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mean_case(2, 2, 6, &o, out);
    CHECK(maxdiff(out, want4, 4) < 1e-6);
}

TEST(modern_softcap_alibi_sinks_lse_by_hand) {
    /* one query, keys k = (1, -1, 0.5), d = 1, q = 2, scale 1: s = (2, -2, 1) */
    float q = 2.0f, k[3] = {1.0f, -1.0f, 0.5f}, v[3] = {1.0f, 10.0f, 100.0f}, out, lse;
    mha_tensor Q = t4(&q, 1, 1, 1, 1), K = t4(k, 1, 1, 3, 1), V = t4(v, 1, 1, 3, 1);
    mha_tensor O = t4(&out, 1, 1, 1, 1), LSE;
    mha_tensor_init(&LSE, MHA_F32, &lse, 3, (int64_t[]){1, 1, 1});
    for (int kernel = 0; kernel < 2; kernel++) {
        mha_sdpa_options o;
        mha_sdpa_options_init(&o);
        o.scale_set = 1, o.scale = 1.0f;
        o.softcap = 1.5f;
        o.lse = &LSE;
        o.kernel = kernel ? MHA_KERNEL_REF : MHA_KERNEL_AUTO;
        float slope = 0.25f, sink = 0.3f;
        mha_tensor A, Sk;
        mha_tensor_init(&A, MHA_F32, &slope, 1, (int64_t[]){1});
        mha_tensor_init(&Sk, MHA_F32, &sink, 1, (int64_t[]){1});
        o.alibi_slopes = &A, o.sinks = &Sk;
        REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &V, &o));
        double s[3], raw[3] = {2, -2, 1}, sum = exp(0.3), num = 0;
        for (int j = 0; j < 3; j++) {
            /* ALiBi: -slope * |i + S - L - j| = -0.25 * |2 - j| */
            s[j] = 1.5 * tanh(raw[j] / 1.5) - 0.25 * fabs(2.0 - j);
            sum += exp(s[j]);
            num += exp(s[j]) * v[j];
        }
        CHECK(fabs(out - num / sum) < 1e-5 * fabs(num / sum));
        CHECK(fabs(lse - log(sum)) < 1e-5);
    }
    /* softcap before the mask: -inf stays -inf */
    float mk[3] = {0.0f, -INFINITY, -INFINITY};
    mha_tensor M;
    mha_tensor_init(&M, MHA_F32, mk, 1, (int64_t[]){3});
    mha_sdpa_options o;
    mha_sdpa_options_init(&o);
    o.softcap = 0.5f, o.mask = &M, o.lse = &LSE;
    REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &V, &o));
    CHECK(out == 1.0f);
    /* fully masked: 0 and lse -inf */
    mk[0] = -INFINITY;
    REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &V, &o));
    CHECK(out == 0.0f && lse == -INFINITY);
}

TEST(modern_qk_modes_match_their_definitions) {
    enum { B = 2, H = 3, L = 4, S = 5, D = 6 };
    float q[B * H * L * D], k[B * H * S * D], v[B * H * S * D], out[B * H * L * D];
    float qk[B * H * L * S], w[B * H * L * S], mk[L * S];
    mha_randn(q, B * H * L * D, 1, 1.0f);
    mha_randn(k, B * H * S * D, 2, 1.0f);
    mha_randn(v, B * H * S * D, 3, 1.0f);
    mha_randn(mk, L * S, 4, 1.0f);
    mk[3] = -INFINITY;
    mha_tensor Q = t4(q, B, H, L, D), K = t4(k, B, H, S, D), V = t4(v, B, H, S, D);
    mha_tensor O = t4(out, B, H, L, D), QK = t4(qk, B, H, L, S), W = t4(w, B, H, L, S), M;
    mha_tensor_init(&M, MHA_F32, mk, 2, (int64_t[]){L, S});
    for (int mode = 0; mode < 4; mode++) {
        mha_sdpa_options o;
        mha_sdpa_options_init(&o);
        o.softcap = 2.0f, o.mask = &M, o.causal = MHA_CAUSAL_BOTTOM_RIGHT;
        o.qk_out = &QK, o.qk_mode = mode, o.weights = &W;
        REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &V, &o));
        double worst = 0;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < L; i++)
                    for (int j = 0; j < S; j++) {
                        double dot = 0;
                        for (int c = 0; c < D; c++)
                            dot += (double)q[((b * H + h) * L + i) * D + c] *
                                   k[((b * H + h) * S + j) * D + c];
                        double raw = dot / sqrt((double)D), cap = 2.0 * tanh(raw / 2.0);
                        double bias = j > i + S - L ? -INFINITY : mk[i * S + j];
                        double want = mode == 0   ? raw
                                      : mode == 1 ? cap
                                      : mode == 2 ? cap + bias
                                                  : w[((b * H + h) * L + i) * S + j];
                        double got = qk[((b * H + h) * L + i) * S + j];
                        if (isinf(want))
                            CHECK(got == want);
                        else if (fabs(got - want) > worst)
                            worst = fabs(got - want);
                    }
        CHECK(worst < 1e-5);
    }
}

TEST(modern_onnx_scale_and_f64_softmax) {
    enum { N = 2 * 3 * 7 * 8 };
    float q[N], k[N], v[N], a[N], b[N];
    mha_randn(q, N, 5, 1.0f);
    mha_randn(k, N, 6, 1.0f);
    mha_randn(v, N, 7, 1.0f);
    mha_tensor Q = t4(q, 2, 3, 7, 8), K = t4(k, 2, 3, 7, 8), V = t4(v, 2, 3, 7, 8);
    mha_tensor A = t4(a, 2, 3, 7, 8), Bt = t4(b, 2, 3, 7, 8);
    mha_sdpa_options o;
    mha_sdpa_options_init(&o);
    REQUIRE_OK(mha_sdpa_forward(&A, &Q, &K, &V, &o));
    o.onnx_scale = 1;
    REQUIRE_OK(mha_sdpa_forward(&Bt, &Q, &K, &V, &o));
    CHECK(maxdiff(a, b, N) < 1e-5); /* the last bits only */
    o.onnx_scale = 0, o.softmax_precision = MHA_SOFTMAX_F64;
    REQUIRE_OK(mha_sdpa_forward(&Bt, &Q, &K, &V, &o));
    CHECK(maxdiff(a, b, N) < 1e-5);
    o.kernel = MHA_KERNEL_SCALAR; /* float64 is the reference's: no silent fallback */
    CHECK_STATUS(mha_sdpa_forward(&Bt, &Q, &K, &V, &o), MHA_ERR_UNSUPPORTED);
}

TEST(modern_rope_matches_formula) {
    enum { B = 2, H = 3, L = 5, D = 8 };
    float x[B * H * L * D], y[B * H * L * D];
    mha_randn(x, B * H * L * D, 9, 1.0f);
    int64_t offs[2] = {0, 7};
    mha_tensor Of;
    mha_tensor_init(&Of, MHA_I64, offs, 1, (int64_t[]){2});
    for (int mode = 1; mode <= 2; mode++) {
        memcpy(y, x, sizeof x);
        mha_tensor Y = t4(y, B, H, L, D);
        REQUIRE_OK(mha_rope_apply(&Y, 3, &Of, 500.0f, (mha_rope_mode)mode));
        double worst = 0;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < L; i++)
                    for (int c = 0; c < D / 2; c++) {
                        int ia = mode == 1 ? c : 2 * c, ib = mode == 1 ? c + D / 2 : 2 * c + 1;
                        const float *xr = x + ((b * H + h) * L + i) * D;
                        const float *yr = y + ((b * H + h) * L + i) * D;
                        double th = (3 + offs[b] + i) * pow(500.0, -2.0 * c / D);
                        double wa = xr[ia] * cos(th) - xr[ib] * sin(th);
                        double wb = xr[ia] * sin(th) + xr[ib] * cos(th);
                        worst = fmax(worst, fmax(fabs(yr[ia] - wa), fabs(yr[ib] - wb)));
                    }
        CHECK(worst < 1e-6);
    }
    /* position 0 is the identity; odd d is refused */
    memcpy(y, x, sizeof x);
    mha_tensor Y1 = t4(y, 1, 1, 1, D);
    REQUIRE_OK(mha_rope_apply(&Y1, 0, NULL, 0.0f, MHA_ROPE_HALF_SPLIT));
    CHECK(memcmp(x, y, sizeof(float) * D) == 0);
    mha_tensor Y2 = t4(y, 1, 1, 1, 7);
    CHECK_STATUS(mha_rope_apply(&Y2, 0, NULL, 0.0f, MHA_ROPE_HALF_SPLIT), MHA_ERR_SHAPE);
}

TEST(modern_rope_option_equals_rotating_first) {
    enum { B = 1, H = 2, L = 6, D = 4 };
    float q[B * H * L * D], k[B * H * L * D], v[B * H * L * D], a[B * H * L * D],
        b[B * H * L * D];
    mha_randn(q, B * H * L * D, 11, 1.0f);
    mha_randn(k, B * H * L * D, 12, 1.0f);
    mha_randn(v, B * H * L * D, 13, 1.0f);
    mha_tensor Q = t4(q, B, H, L, D), K = t4(k, B, H, L, D), V = t4(v, B, H, L, D);
    mha_tensor A = t4(a, B, H, L, D), Bo = t4(b, B, H, L, D);
    mha_sdpa_options o;
    mha_sdpa_options_init(&o);
    o.causal = MHA_CAUSAL_TOP_LEFT, o.rope = MHA_ROPE_INTERLEAVED;
    REQUIRE_OK(mha_sdpa_forward(&A, &Q, &K, &V, &o));
    REQUIRE_OK(mha_rope_apply(&Q, 0, NULL, 0.0f, MHA_ROPE_INTERLEAVED));
    REQUIRE_OK(mha_rope_apply(&K, 0, NULL, 0.0f, MHA_ROPE_INTERLEAVED));
    o.rope = MHA_ROPE_NONE;
    REQUIRE_OK(mha_sdpa_forward(&Bo, &Q, &K, &V, &o));
    CHECK(maxdiff(a, b, B * H * L * D) < 1e-6);
}

/* Decode over `steps` tokens vs row t of a full causal forward each step. */
static double decode_vs_forward(int64_t window, int extras, int steps) {
    enum { B = 2, HQ = 4, HKV = 2, D = 8, DV = 6, T = 100 };
    static float qa[B * HQ * T * D], ka[B * HKV * T * D], va[B * HKV * T * DV];
    static float full[B * HQ * T * DV];
    mha_randn(qa, sizeof qa / sizeof *qa, 21, 1.0f);
    mha_randn(ka, sizeof ka / sizeof *ka, 22, 1.0f);
    mha_randn(va, sizeof va / sizeof *va, 23, 1.0f);
    mha_kv_cache *c;
    if (mha_kv_cache_create(&c, B, HKV, T, D, DV, window) != MHA_OK)
        return INFINITY;
    float slopes[HQ] = {0.5f, 0.25f, 0.125f, 0.0625f}, sinks[HQ] = {0.1f, -1.0f, 2.0f, 0.0f};
    mha_tensor A, Sk;
    mha_tensor_init(&A, MHA_F32, slopes, 1, (int64_t[]){HQ});
    mha_tensor_init(&Sk, MHA_F32, sinks, 1, (int64_t[]){HQ});
    double worst = 0;
    for (int t = 0; t < steps; t++) {
        float kt[B * HKV * D], vt[B * HKV * DV], qt[B * HQ * D], out[B * HQ * DV];
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < HKV; h++) {
                memcpy(kt + (b * HKV + h) * D, ka + ((b * HKV + h) * T + t) * D, sizeof(float) * D);
                memcpy(vt + (b * HKV + h) * DV, va + ((b * HKV + h) * T + t) * DV,
                       sizeof(float) * DV);
            }
            for (int h = 0; h < HQ; h++)
                memcpy(qt + (b * HQ + h) * D, qa + ((b * HQ + h) * T + t) * D, sizeof(float) * D);
        }
        mha_tensor Kt = t4(kt, B, HKV, 1, D), Vt = t4(vt, B, HKV, 1, DV);
        mha_tensor Qt = t4(qt, B, HQ, 1, D), Ot = t4(out, B, HQ, 1, DV);
        if (extras) /* keys rotated at their position before append */
            mha_rope_apply(&Kt, t, NULL, 0.0f, MHA_ROPE_HALF_SPLIT);
        if (mha_kv_cache_append(c, &Kt, &Vt) != MHA_OK)
            return INFINITY;
        mha_sdpa_options o;
        mha_sdpa_options_init(&o);
        if (extras) {
            o.softcap = 3.0f, o.alibi_slopes = &A, o.sinks = &Sk, o.rope = MHA_ROPE_HALF_SPLIT;
        }
        if (mha_attention_decode(&Ot, &Qt, c, &o) != MHA_OK)
            return INFINITY;
        /* the full forward over tokens 0..t (views into the whole arrays) */
        mha_tensor Q = t4(qa, B, HQ, t + 1, D), K = t4(ka, B, HKV, t + 1, D);
        mha_tensor V = t4(va, B, HKV, t + 1, DV), O = t4(full, B, HQ, t + 1, DV);
        Q.stride[1] = T * D, Q.stride[0] = HQ * T * D;
        K.stride[1] = T * D, K.stride[0] = HKV * T * D;
        V.stride[1] = T * DV, V.stride[0] = HKV * T * DV;
        o.causal = MHA_CAUSAL_TOP_LEFT;
        o.kernel = MHA_KERNEL_REF;
        if (window > 0)
            o.window_left = window - 1, o.window_right = 0;
        if (mha_sdpa_forward(&O, &Q, &K, &V, &o) != MHA_OK)
            return INFINITY;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < HQ; h++)
                for (int x = 0; x < DV; x++)
                    worst = fmax(worst, fabs(out[(b * HQ + h) * DV + x] -
                                             full[((b * HQ + h) * (t + 1) + t) * DV + x]));
    }
    mha_kv_cache_free(c);
    return worst;
}

TEST(modern_decode_equals_last_row_of_causal_forward_100_steps) {
    CHECK(decode_vs_forward(0, 0, 100) < 1e-5);
    CHECK(decode_vs_forward(16, 0, 100) < 1e-5); /* sliding window, ring of 16 */
}

TEST(modern_decode_with_rope_alibi_sinks_softcap) {
    /* the forward rotates the stored (already rotated) keys again when
     * opt.rope is set, so compare on a fresh pair: rotate keys at append,
     * the forward rotates raw ones.  Done by running the forward without
     * rotation on pre-rotated keys is what decode_vs_forward does for q;
     * here only ALiBi, sinks and softcap (rope covered separately). */
    enum { B = 1, HQ = 2, HKV = 1, D = 4, DV = 3, T = 40 };
    float qa[B * HQ * T * D], ka[B * HKV * T * D], va[B * HKV * T * DV], full[B * HQ * T * DV];
    mha_randn(qa, B * HQ * T * D, 31, 1.0f);
    mha_randn(ka, B * HKV * T * D, 32, 1.0f);
    mha_randn(va, B * HKV * T * DV, 33, 1.0f);
    float slopes[HQ] = {0.5f, 0.03f}, sinks[HQ] = {0.7f, -0.2f};
    mha_tensor A, Sk;
    mha_tensor_init(&A, MHA_F32, slopes, 1, (int64_t[]){HQ});
    mha_tensor_init(&Sk, MHA_F32, sinks, 1, (int64_t[]){HQ});
    for (int64_t window = 0; window <= 8; window += 8) {
        mha_kv_cache *c;
        REQUIRE_OK(mha_kv_cache_create(&c, B, HKV, T, D, DV, window));
        double worst = 0;
        for (int t = 0; t < T; t++) {
            mha_tensor Kt = t4(ka + t * D, B, HKV, 1, D), Vt = t4(va + t * DV, B, HKV, 1, DV);
            REQUIRE_OK(mha_kv_cache_append(c, &Kt, &Vt));
            float qt[HQ * D], out[HQ * DV];
            for (int h = 0; h < HQ; h++)
                memcpy(qt + h * D, qa + (h * T + t) * D, sizeof(float) * D);
            mha_tensor Qt = t4(qt, B, HQ, 1, D), Ot = t4(out, B, HQ, 1, DV);
            mha_sdpa_options o;
            mha_sdpa_options_init(&o);
            o.softcap = 1.0f, o.alibi_slopes = &A, o.sinks = &Sk;
            REQUIRE_OK(mha_attention_decode(&Ot, &Qt, c, &o));
            /* ALiBi is relative: the full forward's bottom-right |i + S - L - j|
             * on tokens 0..t equals |t - j| for its last row */
            mha_tensor Q = t4(qa, B, HQ, t + 1, D), K = t4(ka, B, HKV, t + 1, D);
            mha_tensor V = t4(va, B, HKV, t + 1, DV), O = t4(full, B, HQ, t + 1, DV);
            Q.stride[1] = T * D;
            o.causal = MHA_CAUSAL_TOP_LEFT, o.kernel = MHA_KERNEL_REF;
            if (window > 0)
                o.window_left = window - 1;
            REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &V, &o));
            for (int h = 0; h < HQ; h++)
                for (int x = 0; x < DV; x++)
                    worst = fmax(worst, fabs(out[h * DV + x] - full[(h * (t + 1) + t) * DV + x]));
        }
        CHECK(worst < 1e-5);
        mha_kv_cache_free(c);
    }
}

TEST(modern_decode_with_rope_positions) {
    CHECK(decode_vs_forward(0, 1, 30) < 1e-5);
}

TEST(modern_decode_splits_long_cache_bit_identical_across_threads) {
    enum { B = 1, HQ = 6, HKV = 2, D = 16, DV = 16, T = 700 };
    float *k = malloc(sizeof(float) * B * HKV * T * D), *v = malloc(sizeof(float) * B * HKV * T * DV);
    float q[B * HQ * D], o1[B * HQ * DV], o2[B * HQ * DV], o3[B * HQ * DV], lse[B * HQ],
        lser[B * HQ];
    REQUIRE(k && v);
    mha_randn(k, B * HKV * T * D, 41, 1.0f);
    mha_randn(v, B * HKV * T * DV, 42, 1.0f);
    mha_randn(q, B * HQ * D, 43, 1.0f);
    mha_kv_cache *c;
    REQUIRE_OK(mha_kv_cache_create(&c, B, HKV, T, D, DV, 0));
    mha_tensor K = t4(k, B, HKV, T, D), V = t4(v, B, HKV, T, DV), Q = t4(q, B, HQ, 1, D);
    REQUIRE_OK(mha_kv_cache_append(c, &K, &V)); /* prefill: 3 splits of 256 */
    mha_tensor O1 = t4(o1, B, HQ, 1, DV), O2 = t4(o2, B, HQ, 1, DV), O3 = t4(o3, B, HQ, 1, DV);
    mha_tensor Lse, Lser;
    mha_tensor_init(&Lse, MHA_F32, lse, 3, (int64_t[]){B, HQ, 1});
    mha_tensor_init(&Lser, MHA_F32, lser, 3, (int64_t[]){B, HQ, 1});
    mha_sdpa_options o;
    mha_sdpa_options_init(&o);
    o.lse = &Lse;
    int before = mha_get_num_threads();
    mha_set_num_threads(1);
    REQUIRE_OK(mha_attention_decode(&O1, &Q, c, &o));
    mha_set_num_threads(2);
    REQUIRE_OK(mha_attention_decode(&O2, &Q, c, &o));
    mha_set_num_threads(before);
    CHECK(memcmp(o1, o2, sizeof o1) == 0);
    o.kernel = MHA_KERNEL_REF, o.lse = &Lser;
    REQUIRE_OK(mha_attention_decode(&O3, &Q, c, &o));
    CHECK(maxdiff(o1, o3, B * HQ * DV) < 1e-5);
    CHECK(maxdiff(lse, lser, B * HQ) < 1e-5);
    o.kernel = MHA_KERNEL_SCALAR, o.lse = &Lse; /* the portable inner loops */
    REQUIRE_OK(mha_attention_decode(&O2, &Q, c, &o));
    CHECK(maxdiff(o2, o3, B * HQ * DV) < 1e-5);
    CHECK(maxdiff(lse, lser, B * HQ) < 1e-5);
    /* capacity is planned: one more token is refused */
    mha_tensor K1 = t4(k, B, HKV, 1, D), V1 = t4(v, B, HKV, 1, DV);
    CHECK_STATUS(mha_kv_cache_append(c, &K1, &V1), MHA_ERR_VALUE);
    mha_kv_cache_reset(c);
    CHECK(mha_kv_cache_length(c) == 0);
    mha_kv_cache_free(c);
    free(k);
    free(v);
}

TEST(modern_merge_of_key_blocks_equals_whole) {
    enum { B = 2, H = 3, L = 4, S = 11, D = 5 };
    float q[B * H * L * D], k[B * H * S * D], v[B * H * S * D], whole[B * H * L * D],
        lw[B * H * L], parts[3][B * H * L * D], lp[3][B * H * L], merged[B * H * L * D],
        lm[B * H * L];
    mha_randn(q, B * H * L * D, 51, 1.0f);
    mha_randn(k, B * H * S * D, 52, 1.0f);
    mha_randn(v, B * H * S * D, 53, 1.0f);
    mha_tensor Q = t4(q, B, H, L, D), K = t4(k, B, H, S, D), V = t4(v, B, H, S, D);
    mha_tensor W = t4(whole, B, H, L, D), LW;
    mha_tensor_init(&LW, MHA_F32, lw, 3, (int64_t[]){B, H, L});
    mha_sdpa_options o;
    mha_sdpa_options_init(&o);
    o.causal = MHA_CAUSAL_BOTTOM_RIGHT, o.lse = &LW;
    REQUIRE_OK(mha_sdpa_forward(&W, &Q, &K, &V, &o));
    /* blocks [0,4) [4,8) [8,11), each with the causal frontier of the whole */
    int64_t j0[3] = {0, 4, 8}, n[3] = {4, 4, 3};
    mha_tensor PO[3], PL[3];
    const mha_tensor *po[3], *pl[3];
    for (int p = 0; p < 3; p++) {
        mha_tensor Kp = K, Vp = V;
        Kp.data = k + j0[p] * D, Kp.shape[2] = n[p];
        Vp.data = v + j0[p] * D, Vp.shape[2] = n[p];
        PO[p] = t4(parts[p], B, H, L, D);
        mha_tensor_init(&PL[p], MHA_F32, lp[p], 3, (int64_t[]){B, H, L});
        mha_sdpa_options_init(&o);
        o.causal = MHA_CAUSAL_OFFSET, o.causal_offset = S - L - j0[p], o.lse = &PL[p];
        REQUIRE_OK(mha_sdpa_forward(&PO[p], &Q, &Kp, &Vp, &o));
        po[p] = &PO[p], pl[p] = &PL[p];
    }
    mha_tensor M = t4(merged, B, H, L, D), LM;
    mha_tensor_init(&LM, MHA_F32, lm, 3, (int64_t[]){B, H, L});
    REQUIRE_OK(mha_attention_merge(&M, &LM, 3, po, pl));
    CHECK(maxdiff(merged, whole, B * H * L * D) < 1e-5);
    CHECK(maxdiff(lm, lw, B * H * L) < 1e-5);
}

TEST(modern_onnx_attention_checks) {
    float q[2 * 3 * 4 * 8] = {0}, k[2 * 3 * 6 * 8] = {0}, y[2 * 3 * 4 * 8];
    mha_tensor Q = t4(q, 2, 3, 4, 8), K = t4(k, 2, 3, 6, 8), Y = t4(y, 2, 3, 4, 8);
    mha_onnx_attention_options o;
    mha_onnx_attention_options_init(&o);
    REQUIRE_OK(mha_onnx_attention(&Y, NULL, NULL, NULL, &Q, &K, &K, NULL, NULL, NULL, NULL, &o));
    CHECK_STATUS(mha_onnx_attention(&Y, NULL, NULL, NULL, &Q, &K, &K, NULL, &K, NULL, NULL, &o),
                 MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("together");
    int64_t np[2] = {3, 6};
    mha_tensor N;
    mha_tensor_init(&N, MHA_I64, np, 1, (int64_t[]){2});
    CHECK_STATUS(mha_onnx_attention(&Y, NULL, NULL, NULL, &Q, &K, &K, NULL, &K, &K, &N, &o),
                 MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("nonpad_kv_seqlen");
    o.qk_matmul_output_mode = 4;
    CHECK_STATUS(mha_onnx_attention(&Y, NULL, NULL, NULL, &Q, &K, &K, NULL, NULL, NULL, NULL, &o),
                 MHA_ERR_VALUE);
    mha_onnx_attention_options_init(&o);
    o.softmax_precision = 7;
    CHECK_STATUS(mha_onnx_attention(&Y, NULL, NULL, NULL, &Q, &K, &K, NULL, NULL, NULL, NULL, &o),
                 MHA_ERR_VALUE);
    /* 3-D views: (B,L,H*d) with head counts gives the same numbers as 4-D */
    float q3[2 * 4 * 24], k3[2 * 6 * 24], y3[2 * 4 * 24], y4[2 * 3 * 4 * 8];
    mha_randn(q3, 2 * 4 * 24, 61, 1.0f);
    mha_randn(k3, 2 * 6 * 24, 62, 1.0f);
    mha_tensor Q3, K3, Y3;
    mha_tensor_init(&Q3, MHA_F32, q3, 3, (int64_t[]){2, 4, 24});
    mha_tensor_init(&K3, MHA_F32, k3, 3, (int64_t[]){2, 6, 24});
    mha_tensor_init(&Y3, MHA_F32, y3, 3, (int64_t[]){2, 4, 24});
    mha_onnx_attention_options_init(&o);
    o.q_num_heads = 3, o.kv_num_heads = 3, o.is_causal = 1;
    REQUIRE_OK(mha_onnx_attention(&Y3, NULL, NULL, NULL, &Q3, &K3, &K3, NULL, NULL, NULL, NULL, &o));
    for (int b = 0; b < 2; b++) /* transpose to 4-D by hand */
        for (int h = 0; h < 3; h++) {
            for (int i = 0; i < 4; i++)
                memcpy(q + ((b * 3 + h) * 4 + i) * 8, q3 + (b * 4 + i) * 24 + h * 8, 32);
            for (int j = 0; j < 6; j++)
                memcpy(k + ((b * 3 + h) * 6 + j) * 8, k3 + (b * 6 + j) * 24 + h * 8, 32);
        }
    mha_onnx_attention_options_init(&o);
    o.is_causal = 1;
    mha_tensor Y4 = t4(y4, 2, 3, 4, 8);
    REQUIRE_OK(mha_onnx_attention(&Y4, NULL, NULL, NULL, &Q, &K, &K, NULL, NULL, NULL, NULL, &o));
    double worst = 0;
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 3; h++)
            for (int i = 0; i < 4; i++)
                for (int c = 0; c < 8; c++)
                    worst = fmax(worst, fabs(y3[(b * 4 + i) * 24 + h * 8 + c] -
                                             y4[((b * 3 + h) * 4 + i) * 8 + c]));
    CHECK(worst == 0);
}

/* Every option on the fused kernels against the reference: random shapes
 * with tails, GQA, per-batch offsets and lengths, windows, softcap, ALiBi,
 * sinks, LSE, weights, qk mode 3, ONNX scale. */
TEST(modern_fused_kernels_match_reference_on_every_option) {
    enum { B = 2, HQ = 6, HKV = 2, L = 37, S = 53, D = 12, DV = 9 };
    static float q[B * HQ * L * D], k[B * HKV * S * D], v[B * HKV * S * DV];
    static float o[3][B * HQ * L * DV], w[3][B * HQ * L * S], qk[3][B * HQ * L * S],
        lse[3][B * HQ * L], mk[L * S];
    mha_randn(q, sizeof q / sizeof *q, 71, 1.5f);
    mha_randn(k, sizeof k / sizeof *k, 72, 1.5f);
    mha_randn(v, sizeof v / sizeof *v, 73, 1.0f);
    mha_randn(mk, L * S, 74, 1.0f);
    for (int x = 0; x < L * S; x += 7)
        mk[x] = -INFINITY;
    int64_t lens[B] = {41, 0 + 29}, offs[B] = {9, -5};
    float slopes[HQ] = {0.5f, 0.25f, 0.1f, 0.05f, 0.0f, 1.0f};
    float sinks[HQ] = {0.0f, 1.0f, -2.0f, 3.0f, 0.5f, -0.5f};
    mha_tensor Q = t4(q, B, HQ, L, D), K = t4(k, B, HKV, S, D), V = t4(v, B, HKV, S, DV);
    mha_tensor Ls, Os, A, Sk, M;
    mha_tensor_init(&Ls, MHA_I64, lens, 1, (int64_t[]){B});
    mha_tensor_init(&Os, MHA_I64, offs, 1, (int64_t[]){B});
    mha_tensor_init(&A, MHA_F32, slopes, 1, (int64_t[]){HQ});
    mha_tensor_init(&Sk, MHA_F32, sinks, 1, (int64_t[]){HQ});
    mha_tensor_init(&M, MHA_F32, mk, 2, (int64_t[]){L, S});
    const mha_kernel kernels[3] = {MHA_KERNEL_REF, MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2};
    const int nk = mha_attn_best_kernel() == MHA_KERNEL_AVX2 ? 3 : 2;
    for (int combo = 0; combo < 8; combo++) {
        for (int kk = 0; kk < nk; kk++) {
            mha_tensor O = t4(o[kk], B, HQ, L, DV), W = t4(w[kk], B, HQ, L, S);
            mha_tensor QK = t4(qk[kk], B, HQ, L, S), LSE;
            mha_tensor_init(&LSE, MHA_F32, lse[kk], 3, (int64_t[]){B, HQ, L});
            mha_sdpa_options op;
            mha_sdpa_options_init(&op);
            op.kernel = kernels[kk];
            op.lse = &LSE;
            op.qk_out = &QK, op.qk_mode = 3;
            if (combo & 1)
                op.weights = &W;
            if (combo & 2)
                op.causal = MHA_CAUSAL_OFFSET, op.causal_offsets = &Os;
            else
                op.causal = MHA_CAUSAL_BOTTOM_RIGHT, op.kv_lengths = &Ls;
            if (combo & 4)
                op.window_left = 7, op.window_right = combo & 2 ? -1 : 3, op.mask = &M;
            op.softcap = combo == 3 || combo == 6 ? 0.0f : 4.0f;
            op.alibi_slopes = combo % 3 ? &A : NULL;
            op.sinks = combo % 3 != 1 ? &Sk : NULL;
            op.onnx_scale = combo >= 5;
            REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &V, &op));
        }
        for (int kk = 1; kk < nk; kk++) {
            CHECK(maxdiff(o[kk], o[0], B * HQ * L * DV) < 2e-5);
            CHECK(maxdiff(lse[kk], lse[0], B * HQ * L) < 2e-5);
            CHECK(maxdiff(qk[kk], qk[0], B * HQ * L * S) < 2e-5);
            if (combo & 1)
                CHECK(maxdiff(w[kk], w[0], B * HQ * L * S) < 2e-5);
        }
    }
    /* the ONNX debug scores of modes 0-2 (masked keys included) */
    for (int mode = 0; mode < 3; mode++) {
        for (int kk = 0; kk < nk; kk++) {
            mha_tensor O = t4(o[kk], B, HQ, L, DV), QK = t4(qk[kk], B, HQ, L, S);
            mha_sdpa_options op;
            mha_sdpa_options_init(&op);
            op.kernel = kernels[kk];
            op.qk_out = &QK, op.qk_mode = mode, op.softcap = 3.0f, op.mask = &M;
            op.causal = MHA_CAUSAL_OFFSET, op.causal_offsets = &Os, op.alibi_slopes = &A;
            op.window_left = 5, op.onnx_scale = mode == 1;
            REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &V, &op));
        }
        for (int kk = 1; kk < nk; kk++) {
            CHECK(maxdiff(qk[kk], qk[0], B * HQ * L * S) < 2e-5);
            CHECK(maxdiff(o[kk], o[0], B * HQ * L * DV) < 2e-5);
        }
    }
    /* float64 softmax is the reference's: an explicit fused kernel refuses it */
    mha_tensor O = t4(o[1], B, HQ, L, DV);
    mha_sdpa_options op;
    mha_sdpa_options_init(&op);
    op.softmax_precision = MHA_SOFTMAX_F64, op.kernel = MHA_KERNEL_SCALAR;
    CHECK_STATUS(mha_sdpa_forward(&O, &Q, &K, &V, &op), MHA_ERR_UNSUPPORTED);
}

/* The decoder stack decoded token by token = the last row of the full
 * causal forward, each step; pre- and post-norm; memory K/V projected once. */
TEST(modern_decoder_decode_equals_causal_stack_forward) {
    enum { NL = 2, B = 2, S = 5, E = 12, H = 3, F = 20, T = 9 };
    static float wbuf[NL][4 * E * E + 4 * E + 4 * E * E + 4 * E + 2 * F * E + F + E + 6 * E];
    static mha_tensor wt[NL][20];
    mha_decoder_layer_weights lw[NL];
    int64_t seed = 100;
    for (int l = 0; l < NL; l++) {
        float *p = wbuf[l];
        int n = 0;
#define MK(dst, nd, ...)                                                                  \
    do {                                                                                  \
        int64_t sh_[] = {__VA_ARGS__};                                                    \
        int64_t cnt_ = 1;                                                                 \
        for (int z_ = 0; z_ < nd; z_++)                                                   \
            cnt_ *= sh_[z_];                                                              \
        mha_randn(p, (size_t)cnt_, (uint64_t)seed++, 0.3f);                               \
        mha_tensor_init(&wt[l][n], MHA_F32, p, nd, sh_);                                  \
        dst = &wt[l][n++];                                                                \
        p += cnt_;                                                                        \
    } while (0)
        memset(&lw[l], 0, sizeof lw[l]);
        MK(lw[l].self_attn.in_proj_weight, 2, 3 * E, E);
        MK(lw[l].self_attn.in_proj_bias, 1, 3 * E);
        MK(lw[l].self_attn.out_proj_weight, 2, E, E);
        MK(lw[l].self_attn.out_proj_bias, 1, E);
        MK(lw[l].multihead_attn.in_proj_weight, 2, 3 * E, E);
        MK(lw[l].multihead_attn.in_proj_bias, 1, 3 * E);
        MK(lw[l].multihead_attn.out_proj_weight, 2, E, E);
        MK(lw[l].multihead_attn.out_proj_bias, 1, E);
        MK(lw[l].linear1_weight, 2, F, E);
        MK(lw[l].linear1_bias, 1, F);
        MK(lw[l].linear2_weight, 2, E, F);
        MK(lw[l].linear2_bias, 1, E);
        MK(lw[l].norm1_weight, 1, E);
        MK(lw[l].norm1_bias, 1, E);
        MK(lw[l].norm2_weight, 1, E);
        MK(lw[l].norm2_bias, 1, E);
        MK(lw[l].norm3_weight, 1, E);
        MK(lw[l].norm3_bias, 1, E);
#undef MK
    }
    float mem[B * S * E], tgt[B * T * E], full[B * T * E], step[B * E], nw[E], nb[E];
    mha_randn(mem, B * S * E, 7, 1.0f);
    mha_randn(tgt, B * T * E, 8, 1.0f);
    mha_randn(nw, E, 9, 0.3f);
    mha_randn(nb, E, 10, 0.3f);
    mha_tensor NW, NB, M;
    mha_tensor_init(&NW, MHA_F32, nw, 1, (int64_t[]){E});
    mha_tensor_init(&NB, MHA_F32, nb, 1, (int64_t[]){E});
    mha_tensor_init(&M, MHA_F32, mem, 3, (int64_t[]){B, S, E});
    mha_decoder_weights w = {NL, lw, 1, &NW, &NB};
    for (int nf = 0; nf < 2; nf++) {
        mha_layer_options o;
        mha_layer_options_init(&o);
        o.num_heads = H, o.norm_first = nf, o.activation = MHA_ACT_GELU;
        mha_decoder_cache *c;
        REQUIRE_OK(mha_decoder_cache_create(&c, &w, &M, H, T));
        double worst = 0;
        for (int t = 0; t < T; t++) {
            float xt[B * E];
            for (int b = 0; b < B; b++)
                memcpy(xt + b * E, tgt + (b * T + t) * E, sizeof(float) * E);
            mha_tensor X, Y;
            mha_tensor_init(&X, MHA_F32, xt, 3, (int64_t[]){B, 1, E});
            mha_tensor_init(&Y, MHA_F32, step, 3, (int64_t[]){B, 1, E});
            REQUIRE_OK(mha_decoder_decode_step(&Y, &X, &w, c, &o));
            /* the full stack over tokens 0..t with a causal target mask */
            float tg[B * T * E];
            for (int b = 0; b < B; b++)
                memcpy(tg + b * (t + 1) * E, tgt + b * T * E, sizeof(float) * (size_t)((t + 1) * E));
            mha_tensor TG, FO;
            mha_tensor_init(&TG, MHA_F32, tg, 3, (int64_t[]){B, t + 1, E});
            mha_tensor_init(&FO, MHA_F32, full, 3, (int64_t[]){B, t + 1, E});
            mha_layer_masks mk = {0};
            mk.causal = 1;
            REQUIRE_OK(mha_decoder_forward(&FO, &TG, &M, &w, &mk, &o, NULL, 0));
            for (int b = 0; b < B; b++)
                for (int e = 0; e < E; e++)
                    worst = fmax(worst, fabs(step[b * E + e] - full[(b * (t + 1) + t) * E + e]));
        }
        CHECK(worst < 2e-5);
        if (nf == 1)
            printf("  decoder decode: %d steps x 2 layers, pre/post-norm, worst |step - full| %.2g\n",
                   T, worst);
        mha_decoder_cache_free(c);
    }
}

/* Allocation failures in the new entry points: every k-th allocation fails
 * (once, then persistently) -> MHA_ERR_NOMEM with a message, nothing leaked. */
typedef mha_status (*modern_call)(void);

static void modern_oom(const char *name, modern_call call) {
    for (int persistent = 0; persistent <= 1; persistent++)
        for (int64_t k = 1; k < 1000; k++) {
            int64_t live0 = mha_test_live_allocs(), count0 = mha_test_alloc_count();
            mha_test_fail_alloc(k, persistent);
            mha_status st = call();
            mha_test_fail_alloc(0, 0);
            if (mha_test_live_allocs() != live0)
                test_fail(__FILE__, __LINE__, "%s: k=%lld leaked", name, (long long)k);
            if (mha_test_alloc_count() - count0 < k) {
                if (st != MHA_OK)
                    test_fail(__FILE__, __LINE__, "%s: %s", name, mha_last_error());
                break;
            }
            if (st != MHA_ERR_NOMEM || !mha_last_error()[0])
                test_fail(__FILE__, __LINE__, "%s: k=%lld -> %s, want NOMEM", name, (long long)k,
                          mha_status_string(st));
        }
}

static mha_status oom_onnx(void) {
    static float q[2 * 3 * 4 * 8], k[2 * 3 * 6 * 8], pk[2 * 3 * 5 * 8], y[2 * 3 * 4 * 8];
    static float mk[4 * 7];
    mha_tensor Q = t4(q, 2, 3, 4, 8), K = t4(k, 2, 3, 6, 8), P = t4(pk, 2, 3, 5, 8);
    mha_tensor Y = t4(y, 2, 3, 4, 8), M;
    mha_tensor_init(&M, MHA_F32, mk, 2, (int64_t[]){4, 7}); /* shorter than 11: padded */
    mha_onnx_attention_options o;
    mha_onnx_attention_options_init(&o);
    o.is_causal = 1, o.left_window_size = 3;
    return mha_onnx_attention(&Y, NULL, NULL, NULL, &Q, &K, &K, &M, &P, &P, NULL, &o);
}

static mha_status oom_rope_sdpa(void) {
    static float q[1 * 2 * 5 * 4], o[1 * 2 * 5 * 4];
    mha_tensor Q = t4(q, 1, 2, 5, 4), O = t4(o, 1, 2, 5, 4);
    mha_sdpa_options op;
    mha_sdpa_options_init(&op);
    op.rope = MHA_ROPE_HALF_SPLIT, op.causal = MHA_CAUSAL_TOP_LEFT;
    return mha_sdpa_forward(&O, &Q, &Q, &Q, &op);
}

static mha_status oom_decode(void) {
    static float kv[2 * 2 * 300 * 4], q[2 * 4 * 4], o[2 * 4 * 4];
    mha_kv_cache *c;
    MHA_TRY(mha_kv_cache_create(&c, 2, 2, 300, 4, 4, 0));
    mha_tensor K = t4(kv, 2, 2, 300, 4), Q = t4(q, 2, 4, 1, 4), O = t4(o, 2, 4, 1, 4);
    mha_status st = mha_kv_cache_append(c, &K, &K);
    mha_sdpa_options op;
    mha_sdpa_options_init(&op);
    if (st == MHA_OK)
        st = mha_attention_decode(&O, &Q, c, &op);
    op.kernel = MHA_KERNEL_REF;
    if (st == MHA_OK)
        st = mha_attention_decode(&O, &Q, c, &op);
    mha_kv_cache_free(c);
    return st;
}

TEST(modern_allocation_failures_leak_nothing) {
    modern_oom("mha_onnx_attention", oom_onnx);
    modern_oom("mha_sdpa_forward rope", oom_rope_sdpa);
    modern_oom("kv cache + decode", oom_decode);
}

/* A sliding window larger than a split, wrapped several times: the ring's
 * slots out of position order, ALiBi on positions, merged over splits. */
TEST(modern_decode_window_ring_across_splits) {
    enum { HQ = 4, HKV = 2, D = 8, T = 1000, W = 600 };
    float *k = malloc(sizeof(float) * HKV * T * D), *v = malloc(sizeof(float) * HKV * T * D);
    float *full = malloc(sizeof(float) * HQ * T * D), q[HQ * D], out[HQ * D];
    float *qa = malloc(sizeof(float) * HQ * T * D);
    REQUIRE(k && v && full && qa);
    mha_randn(k, HKV * T * D, 81, 1.0f);
    mha_randn(v, HKV * T * D, 82, 1.0f);
    mha_randn(qa, HQ * T * D, 83, 1.0f);
    float slopes[HQ] = {0.01f, 0.002f, 0.0f, 0.05f};
    mha_tensor A;
    mha_tensor_init(&A, MHA_F32, slopes, 1, (int64_t[]){HQ});
    mha_kv_cache *c;
    REQUIRE_OK(mha_kv_cache_create(&c, 1, HKV, W, D, D, W));
    /* prefill 950 tokens one block (the ring keeps the last 600), then 50 steps */
    mha_tensor K = t4(k, 1, HKV, 950, D), V = t4(v, 1, HKV, 950, D);
    K.stride[1] = T * D, V.stride[1] = T * D;
    REQUIRE_OK(mha_kv_cache_append(c, &K, &V));
    double worst = 0;
    for (int t = 950; t < T; t++) {
        mha_tensor Kt = t4(k + t * D, 1, HKV, 1, D), Vt = t4(v + t * D, 1, HKV, 1, D);
        Kt.stride[1] = T * D, Vt.stride[1] = T * D;
        REQUIRE_OK(mha_kv_cache_append(c, &Kt, &Vt));
        for (int h = 0; h < HQ; h++)
            memcpy(q + h * D, qa + (h * T + t) * D, sizeof(float) * D);
        mha_tensor Qt = t4(q, 1, HQ, 1, D), Ot = t4(out, 1, HQ, 1, D);
        mha_sdpa_options o;
        mha_sdpa_options_init(&o);
        o.alibi_slopes = &A;
        REQUIRE_OK(mha_attention_decode(&Ot, &Qt, c, &o));
        if (t % 7 != 0 && t != T - 1)
            continue; /* the full forward is the slow part: every 7th step */
        mha_tensor Q = t4(qa, 1, HQ, t + 1, D), Kf = t4(k, 1, HKV, t + 1, D);
        mha_tensor Vf = t4(v, 1, HKV, t + 1, D), O = t4(full, 1, HQ, t + 1, D);
        Q.stride[1] = T * D, Kf.stride[1] = T * D, Vf.stride[1] = T * D;
        o.causal = MHA_CAUSAL_TOP_LEFT, o.window_left = W - 1, o.window_right = 0;
        REQUIRE_OK(mha_sdpa_forward(&O, &Q, &Kf, &Vf, &o));
        for (int h = 0; h < HQ; h++)
            for (int x = 0; x < D; x++)
                worst = fmax(worst, fabs(out[h * D + x] - full[(h * (t + 1) + t) * D + x]));
    }
    CHECK(worst < 1e-5);
    CHECK(mha_kv_cache_length(c) == W && mha_kv_cache_position(c) == T);
    mha_kv_cache_free(c);
    free(k), free(v), free(full), free(qa);
}

/* Windows over many key blocks (the fused kernels start at the first block
 * a tile's window reaches): fused = reference. */
TEST(modern_fused_window_over_many_blocks) {
    enum { B = 2, H = 2, L = 300, S = 700, D = 16 };
    float *q = malloc(sizeof(float) * B * H * L * D), *k = malloc(sizeof(float) * B * H * S * D);
    float *o0 = malloc(sizeof(float) * B * H * L * D), *o1 = malloc(sizeof(float) * B * H * L * D);
    float lse0[B * H * L], lse1[B * H * L];
    REQUIRE(q && k && o0 && o1);
    mha_randn(q, B * H * L * D, 91, 1.0f);
    mha_randn(k, B * H * S * D, 92, 1.0f);
    int64_t offs[B] = {400, 150};
    mha_tensor Os, Q = t4(q, B, H, L, D), K = t4(k, B, H, S, D);
    mha_tensor_init(&Os, MHA_I64, offs, 1, (int64_t[]){B});
    const int64_t wins[3][2] = {{150, 20}, {0, 0}, {300, -1}};
    for (int c = 0; c < 3; c++) {
        for (int kk = 0; kk < 2; kk++) {
            mha_tensor O = t4(kk ? o1 : o0, B, H, L, D), LSE;
            mha_tensor_init(&LSE, MHA_F32, kk ? lse1 : lse0, 3, (int64_t[]){B, H, L});
            mha_sdpa_options op;
            mha_sdpa_options_init(&op);
            op.kernel = kk ? MHA_KERNEL_AUTO : MHA_KERNEL_REF;
            op.causal = c == 2 ? MHA_CAUSAL_NONE : MHA_CAUSAL_OFFSET;
            op.causal_offsets = &Os;
            op.window_left = wins[c][0], op.window_right = wins[c][1];
            op.lse = &LSE;
            REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &K, &op));
        }
        CHECK(maxdiff(o0, o1, B * H * L * D) < 2e-5);
        CHECK(maxdiff(lse0, lse1, B * H * L) < 2e-5);
    }
    free(q), free(k), free(o0), free(o1);
}
