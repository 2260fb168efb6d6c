/* test_attention_merge.c - the log-sum-exp merge of attention over key
 * blocks (what the split-KV decode uses) equals attention over all keys. */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

TEST(modern_merge_of_key_blocks_equals_whole) {
    enum { B = 2, H = 3, L = 4, S = 11, D = 5 };
    float q[B * H * L * D], k[B * H * S * D], v[B * H * S * D], whole[B * H * L * D],
        lw[B * H * L], parts[3][B * H * L * D], lp[3][B * H * L], merged[B * H * L * D],
        lm[B * H * L];
    mha_randn(q, B * H * L * D, 51, 1.0f);
    mha_randn(k, B * H * S * D, 52, 1.0f);
    mha_randn(v, B * H * S * D, 53, 1.0f);
    mha_tensor Q = test_view4(q, B, H, L, D), K = test_view4(k, B, H, S, D), V = test_view4(v, B, H, S, D);
    mha_tensor W = test_view4(whole, B, H, L, D), LW;
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
        PO[p] = test_view4(parts[p], B, H, L, D);
        mha_tensor_init(&PL[p], MHA_F32, lp[p], 3, (int64_t[]){B, H, L});
        mha_sdpa_options_init(&o);
        o.causal = MHA_CAUSAL_OFFSET, o.causal_offset = S - L - j0[p], o.lse = &PL[p];
        REQUIRE_OK(mha_sdpa_forward(&PO[p], &Q, &Kp, &Vp, &o));
        po[p] = &PO[p], pl[p] = &PL[p];
    }
    mha_tensor M = test_view4(merged, B, H, L, D), LM;
    mha_tensor_init(&LM, MHA_F32, lm, 3, (int64_t[]){B, H, L});
    REQUIRE_OK(mha_attention_merge(&M, &LM, 3, po, pl));
    CHECK(test_max_diff(merged, whole, B * H * L * D) < 1e-5);
    CHECK(test_max_diff(lm, lw, B * H * L) < 1e-5);
}
