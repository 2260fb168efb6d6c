/* test_attention_options.c - the modern attention options against hand-computed cases
 * and the reference kernel: sliding windows, per-batch offsets and key
 * lengths, softcap, ALiBi, sinks and the log-sum-exp output, every option on
 * the fused kernels.  ONNX-specific outputs: test_onnx_attention.c; RoPE:
 * test_rope.c; KV cache and decode: test_decode.c. */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* q = 0, v_j = j (dv = 1): every visible key weighs the same, so each
 * output is the mean of the visible key indices. */
static void mean_case(int64_t B, int64_t L, int64_t S, mha_sdpa_options *opt, float *out) {
    float q[64] = {0}, k[64] = {0}, v[64];
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < S; j++)
            v[b * S + j] = (float)j;
    mha_tensor Q = test_view4(q, B, 1, L, 1), K = test_view4(k, B, 1, S, 1), V = test_view4(v, B, 1, S, 1);
    mha_tensor O = test_view4(out, B, 1, L, 1);
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
    CHECK(test_max_diff(out, want, 5) < 1e-6);
    /* causal + left 2: keys i-2..i */
    mha_sdpa_options_init(&o);
    o.causal = MHA_CAUSAL_TOP_LEFT, o.window_left = 2;
    float want2[5] = {0.0f, 0.5f, 1.0f, 2.0f, 3.0f};
    mean_case(1, 5, 5, &o, out);
    CHECK(test_max_diff(out, want2, 5) < 1e-6);
    o.window_left = -2;
    float q = 0;
    mha_tensor Q = test_view4(&q, 1, 1, 1, 1), O = test_view4(out, 1, 1, 1, 1);
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
    CHECK(test_max_diff(out, want, 4) < 1e-6);
    mha_sdpa_options_init(&o);
    o.causal = MHA_CAUSAL_OFFSET, o.causal_offsets = &Os;
    mean_case(2, 2, 6, &o, out);
    CHECK(test_max_diff(out, want, 4) < 1e-6);
    /* lengths alone: no causal, keys j < S_b */
    mha_sdpa_options_init(&o);
    o.kv_lengths = &Ls;
    float want3[4] = {1.0f, 1.0f, 2.0f, 2.0f};
    mean_case(2, 2, 6, &o, out);
    CHECK(test_max_diff(out, want3, 4) < 1e-6);
    /* a negative offset empties the leading rows: zero */
    int64_t neg[2] = {-1, -1};
    mha_tensor Ns;
    mha_tensor_init(&Ns, MHA_I64, neg, 1, (int64_t[]){2});
    mha_sdpa_options_init(&o);
    o.causal = MHA_CAUSAL_OFFSET, o.causal_offsets = &Ns;
    float want4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mean_case(2, 2, 6, &o, out);
    CHECK(test_max_diff(out, want4, 4) < 1e-6);
}

TEST(modern_softcap_alibi_sinks_lse_by_hand) {
    /* one query, keys k = (1, -1, 0.5), d = 1, q = 2, scale 1: s = (2, -2, 1) */
    float q = 2.0f, k[3] = {1.0f, -1.0f, 0.5f}, v[3] = {1.0f, 10.0f, 100.0f}, out, lse;
    mha_tensor Q = test_view4(&q, 1, 1, 1, 1), K = test_view4(k, 1, 1, 3, 1), V = test_view4(v, 1, 1, 3, 1);
    mha_tensor O = test_view4(&out, 1, 1, 1, 1), LSE;
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
    o.softcap = 0.5f, o.attn_mask = &M, o.lse = &LSE;
    REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &V, &o));
    CHECK(out == 1.0f);
    /* fully masked: 0 and lse -inf */
    mk[0] = -INFINITY;
    REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &V, &o));
    CHECK(out == 0.0f && lse == -INFINITY);
}

/* Every option on the fused kernels against the reference: random shapes
 * with tails, GQA, per-batch offsets and lengths, windows, softcap, ALiBi,
 * sinks, LSE, weights, qk mode 3, ONNX scale. */
TEST(modern_fused_kernels_match_reference_on_every_option) {
    enum { B = 2, HQ = 6, HKV = 2, L = 37, S = 53, D = 12, DV = 9 };
    static float q[B * HQ * L * D], k[B * HKV * S * D], v[B * HKV * S * DV];
    static float o[4][B * HQ * L * DV], w[4][B * HQ * L * S], qk[4][B * HQ * L * S],
        lse[4][B * HQ * L], mk[L * S];
    mha_randn(q, sizeof q / sizeof *q, 71, 1.5f);
    mha_randn(k, sizeof k / sizeof *k, 72, 1.5f);
    mha_randn(v, sizeof v / sizeof *v, 73, 1.0f);
    mha_randn(mk, L * S, 74, 1.0f);
    for (int x = 0; x < L * S; x += 7)
        mk[x] = -INFINITY;
    int64_t lens[B] = {41, 0 + 29}, offs[B] = {9, -5};
    float slopes[HQ] = {0.5f, 0.25f, 0.1f, 0.05f, 0.0f, 1.0f};
    float sinks[HQ] = {0.0f, 1.0f, -2.0f, 3.0f, 0.5f, -0.5f};
    mha_tensor Q = test_view4(q, B, HQ, L, D), K = test_view4(k, B, HKV, S, D), V = test_view4(v, B, HKV, S, DV);
    mha_tensor Ls, Os, A, Sk, M;
    mha_tensor_init(&Ls, MHA_I64, lens, 1, (int64_t[]){B});
    mha_tensor_init(&Os, MHA_I64, offs, 1, (int64_t[]){B});
    mha_tensor_init(&A, MHA_F32, slopes, 1, (int64_t[]){HQ});
    mha_tensor_init(&Sk, MHA_F32, sinks, 1, (int64_t[]){HQ});
    mha_tensor_init(&M, MHA_F32, mk, 2, (int64_t[]){L, S});
    const mha_kernel kernels[4] = {MHA_KERNEL_REF, MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2,
                                   MHA_KERNEL_AVX512};
    const int nk = !test_kernel_runs(MHA_KERNEL_AVX2) ? 2 : test_kernel_runs(MHA_KERNEL_AVX512) ? 4 : 3;
    for (int combo = 0; combo < 8; combo++) {
        for (int kk = 0; kk < nk; kk++) {
            mha_tensor O = test_view4(o[kk], B, HQ, L, DV), W = test_view4(w[kk], B, HQ, L, S);
            mha_tensor QK = test_view4(qk[kk], B, HQ, L, S), LSE;
            mha_tensor_init(&LSE, MHA_F32, lse[kk], 3, (int64_t[]){B, HQ, L});
            mha_sdpa_options op;
            mha_sdpa_options_init(&op);
            op.kernel = kernels[kk];
            op.lse = &LSE;
            op.qk_out = &QK, op.qk_mode = 3;
            if (combo & 1)
                op.attn_weights = &W;
            if (combo & 2)
                op.causal = MHA_CAUSAL_OFFSET, op.causal_offsets = &Os;
            else
                op.causal = MHA_CAUSAL_BOTTOM_RIGHT, op.kv_lengths = &Ls;
            if (combo & 4)
                op.window_left = 7, op.window_right = combo & 2 ? -1 : 3, op.attn_mask = &M;
            op.softcap = combo == 3 || combo == 6 ? 0.0f : 4.0f;
            op.alibi_slopes = combo % 3 ? &A : NULL;
            op.sinks = combo % 3 != 1 ? &Sk : NULL;
            op.onnx_scale = combo >= 5;
            REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &V, &op));
        }
        for (int kk = 1; kk < nk; kk++) {
            CHECK(test_max_diff(o[kk], o[0], B * HQ * L * DV) < 2e-5);
            CHECK(test_max_diff(lse[kk], lse[0], B * HQ * L) < 2e-5);
            CHECK(test_max_diff(qk[kk], qk[0], B * HQ * L * S) < 2e-5);
            if (combo & 1)
                CHECK(test_max_diff(w[kk], w[0], B * HQ * L * S) < 2e-5);
        }
    }
    /* the ONNX debug scores of modes 0-2 (masked keys included) */
    for (int mode = 0; mode < 3; mode++) {
        for (int kk = 0; kk < nk; kk++) {
            mha_tensor O = test_view4(o[kk], B, HQ, L, DV), QK = test_view4(qk[kk], B, HQ, L, S);
            mha_sdpa_options op;
            mha_sdpa_options_init(&op);
            op.kernel = kernels[kk];
            op.qk_out = &QK, op.qk_mode = mode, op.softcap = 3.0f, op.attn_mask = &M;
            op.causal = MHA_CAUSAL_OFFSET, op.causal_offsets = &Os, op.alibi_slopes = &A;
            op.window_left = 5, op.onnx_scale = mode == 1;
            REQUIRE_OK(mha_sdpa_forward(&O, &Q, &K, &V, &op));
        }
        for (int kk = 1; kk < nk; kk++) {
            CHECK(test_max_diff(qk[kk], qk[0], B * HQ * L * S) < 2e-5);
            CHECK(test_max_diff(o[kk], o[0], B * HQ * L * DV) < 2e-5);
        }
    }
    /* float64 softmax is the reference's: an explicit fused kernel refuses it */
    mha_tensor O = test_view4(o[1], B, HQ, L, DV);
    mha_sdpa_options op;
    mha_sdpa_options_init(&op);
    op.softmax_precision = MHA_SOFTMAX_F64, op.kernel = MHA_KERNEL_SCALAR;
    CHECK_STATUS(mha_sdpa_forward(&O, &Q, &K, &V, &op), MHA_ERR_UNSUPPORTED);
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
    mha_tensor Os, Q = test_view4(q, B, H, L, D), K = test_view4(k, B, H, S, D);
    mha_tensor_init(&Os, MHA_I64, offs, 1, (int64_t[]){B});
    const int64_t wins[3][2] = {{150, 20}, {0, 0}, {300, -1}};
    for (int c = 0; c < 3; c++) {
        for (int kk = 0; kk < 2; kk++) {
            mha_tensor O = test_view4(kk ? o1 : o0, B, H, L, D), LSE;
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
        CHECK(test_max_diff(o0, o1, B * H * L * D) < 2e-5);
        CHECK(test_max_diff(lse0, lse1, B * H * L) < 2e-5);
    }
    free(q), free(k), free(o0), free(o1);
}
