/* test_onnx_attention.c - ONNX Attention specifics: the qk outputs
 * (qk_matmul_output_mode) against their definitions, ONNX's scale and the
 * float64 softmax, mha_onnx_attention's checks, and its allocation failures.
 * The operator's own backend cases run in tests/cli/test_onnx_conformance.sh. */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

TEST(modern_qk_modes_match_their_definitions) {
    enum { B = 2, H = 3, L = 4, S = 5, D = 6 };
    float q[B * H * L * D], k[B * H * S * D], v[B * H * S * D], out[B * H * L * D];
    float qk[B * H * L * S], w[B * H * L * S], mk[L * S];
    mha_randn(q, B * H * L * D, 1, 1.0f);
    mha_randn(k, B * H * S * D, 2, 1.0f);
    mha_randn(v, B * H * S * D, 3, 1.0f);
    mha_randn(mk, L * S, 4, 1.0f);
    mk[3] = -INFINITY;
    mha_tensor Q = test_view4(q, B, H, L, D), K = test_view4(k, B, H, S, D), V = test_view4(v, B, H, S, D);
    mha_tensor O = test_view4(out, B, H, L, D), QK = test_view4(qk, B, H, L, S), W = test_view4(w, B, H, L, S), M;
    mha_tensor_init(&M, MHA_F32, mk, 2, (int64_t[]){L, S});
    for (int mode = 0; mode < 4; mode++) {
        mha_sdpa_options o;
        mha_sdpa_options_init(&o);
        o.softcap = 2.0f, o.attn_mask = &M, o.causal = MHA_CAUSAL_BOTTOM_RIGHT;
        o.qk_out = &QK, o.qk_mode = mode, o.attn_weights = &W;
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
    mha_tensor Q = test_view4(q, 2, 3, 7, 8), K = test_view4(k, 2, 3, 7, 8), V = test_view4(v, 2, 3, 7, 8);
    mha_tensor A = test_view4(a, 2, 3, 7, 8), Bt = test_view4(b, 2, 3, 7, 8);
    mha_sdpa_options o;
    mha_sdpa_options_init(&o);
    REQUIRE_OK(mha_sdpa_forward(&A, &Q, &K, &V, &o));
    o.onnx_scale = 1;
    REQUIRE_OK(mha_sdpa_forward(&Bt, &Q, &K, &V, &o));
    CHECK(test_max_diff(a, b, N) < 1e-5); /* the last bits only */
    o.onnx_scale = 0, o.softmax_precision = MHA_SOFTMAX_F64;
    REQUIRE_OK(mha_sdpa_forward(&Bt, &Q, &K, &V, &o));
    CHECK(test_max_diff(a, b, N) < 1e-5);
    o.kernel = MHA_KERNEL_SCALAR; /* float64 is the reference's: no silent fallback */
    CHECK_STATUS(mha_sdpa_forward(&Bt, &Q, &K, &V, &o), MHA_ERR_UNSUPPORTED);
}

TEST(modern_onnx_attention_checks) {
    float q[2 * 3 * 4 * 8] = {0}, k[2 * 3 * 6 * 8] = {0}, y[2 * 3 * 4 * 8];
    mha_tensor Q = test_view4(q, 2, 3, 4, 8), K = test_view4(k, 2, 3, 6, 8), Y = test_view4(y, 2, 3, 4, 8);
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
    mha_tensor Y4 = test_view4(y4, 2, 3, 4, 8);
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

static mha_status oom_onnx(void) {
    static float q[2 * 3 * 4 * 8], k[2 * 3 * 6 * 8], pk[2 * 3 * 5 * 8], y[2 * 3 * 4 * 8];
    static float mk[4 * 7];
    mha_tensor Q = test_view4(q, 2, 3, 4, 8), K = test_view4(k, 2, 3, 6, 8), P = test_view4(pk, 2, 3, 5, 8);
    mha_tensor Y = test_view4(y, 2, 3, 4, 8), M;
    mha_tensor_init(&M, MHA_F32, mk, 2, (int64_t[]){4, 7}); /* shorter than 11: padded */
    mha_onnx_attention_options o;
    mha_onnx_attention_options_init(&o);
    o.is_causal = 1, o.left_window_size = 3;
    return mha_onnx_attention(&Y, NULL, NULL, NULL, &Q, &K, &K, &M, &P, &P, NULL, &o);
}

/* Allocation failures: every k-th allocation fails (once, then
 * persistently) -> MHA_ERR_NOMEM with a message, nothing leaked. */
TEST(modern_onnx_allocation_failures_leak_nothing) {
    test_alloc_failures("mha_onnx_attention", oom_onnx);
}
