/* test_rope.c - rotary position embedding: mha_rope_apply against its
 * formula, the SDPA rope option equal to rotating q and k first, and its
 * allocation failures. */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

TEST(modern_rope_matches_formula) {
    enum { B = 2, H = 3, L = 5, D = 8 };
    float x[B * H * L * D], y[B * H * L * D];
    mha_randn(x, B * H * L * D, 9, 1.0f);
    int64_t offs[2] = {0, 7};
    mha_tensor Of;
    mha_tensor_init(&Of, MHA_I64, offs, 1, (int64_t[]){2});
    for (int mode = 1; mode <= 2; mode++) {
        memcpy(y, x, sizeof x);
        mha_tensor Y = test_view4(y, B, H, L, D);
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
    mha_tensor Y1 = test_view4(y, 1, 1, 1, D);
    REQUIRE_OK(mha_rope_apply(&Y1, 0, NULL, 0.0f, MHA_ROPE_HALF_SPLIT));
    CHECK(memcmp(x, y, sizeof(float) * D) == 0);
    mha_tensor Y2 = test_view4(y, 1, 1, 1, 7);
    CHECK_STATUS(mha_rope_apply(&Y2, 0, NULL, 0.0f, MHA_ROPE_HALF_SPLIT), MHA_ERR_SHAPE);
}

TEST(modern_rope_option_equals_rotating_first) {
    enum { B = 1, H = 2, L = 6, D = 4 };
    float q[B * H * L * D], k[B * H * L * D], v[B * H * L * D], a[B * H * L * D],
        b[B * H * L * D];
    mha_randn(q, B * H * L * D, 11, 1.0f);
    mha_randn(k, B * H * L * D, 12, 1.0f);
    mha_randn(v, B * H * L * D, 13, 1.0f);
    mha_tensor Q = test_view4(q, B, H, L, D), K = test_view4(k, B, H, L, D), V = test_view4(v, B, H, L, D);
    mha_tensor A = test_view4(a, B, H, L, D), Bo = test_view4(b, B, H, L, D);
    mha_sdpa_options o;
    mha_sdpa_options_init(&o);
    o.causal = MHA_CAUSAL_TOP_LEFT, o.rope = MHA_ROPE_INTERLEAVED;
    REQUIRE_OK(mha_sdpa_forward(&A, &Q, &K, &V, &o));
    REQUIRE_OK(mha_rope_apply(&Q, 0, NULL, 0.0f, MHA_ROPE_INTERLEAVED));
    REQUIRE_OK(mha_rope_apply(&K, 0, NULL, 0.0f, MHA_ROPE_INTERLEAVED));
    o.rope = MHA_ROPE_NONE;
    REQUIRE_OK(mha_sdpa_forward(&Bo, &Q, &K, &V, &o));
    CHECK(test_max_diff(a, b, B * H * L * D) < 1e-6);
}

static mha_status oom_rope_sdpa(void) {
    static float q[1 * 2 * 5 * 4], o[1 * 2 * 5 * 4];
    mha_tensor Q = test_view4(q, 1, 2, 5, 4), O = test_view4(o, 1, 2, 5, 4);
    mha_sdpa_options op;
    mha_sdpa_options_init(&op);
    op.rope = MHA_ROPE_HALF_SPLIT, op.causal = MHA_CAUSAL_TOP_LEFT;
    return mha_sdpa_forward(&O, &Q, &Q, &Q, &op);
}

/* Allocation failures: every k-th allocation fails (once, then
 * persistently) -> MHA_ERR_NOMEM with a message, nothing leaked. */
TEST(modern_rope_allocation_failures_leak_nothing) {
    test_alloc_failures("mha_sdpa_forward rope", oom_rope_sdpa);
}
