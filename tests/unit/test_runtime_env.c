/* test_runtime_env.c - an unknown MHA_KERNEL / MHA_GEMM value is an error
 * (issue 12, defect 7): mha_runtime_check and every computing entry return
 * MHA_ERR_VALUE naming the variable and the valid values; unset, empty and
 * every valid value are accepted.  The variables are restored afterwards. */
#include "test.h"

static void restore(const char *var, const char *saved, bool had) {
    if (had)
        setenv(var, saved, 1);
    else
        unsetenv(var);
}

TEST(runtime_env_unknown_values_are_errors) {
    static const char *const vars[2] = {"MHA_KERNEL", "MHA_GEMM"};
    static const char *const valid[2][4] = {{"auto", "ref", "scalar", "avx2"},
                                            {"auto", "blas", "avx2", "portable"}};
    float x[2 * 4], w[3 * 4], y[2 * 3];
    mha_randn(x, 8, 1, 1.0f), mha_randn(w, 12, 2, 1.0f);
    mha_tensor X, W, Y, Q, O;
    mha_tensor_init(&X, MHA_F32, x, 2, (int64_t[]){2, 4});
    mha_tensor_init(&W, MHA_F32, w, 2, (int64_t[]){3, 4});
    mha_tensor_init(&Y, MHA_F32, y, 2, (int64_t[]){2, 3});
    float o[8];
    mha_tensor_init(&Q, MHA_F32, x, 4, (int64_t[]){1, 1, 2, 4});
    mha_tensor_init(&O, MHA_F32, o, 4, (int64_t[]){1, 1, 2, 4});
    for (int v = 0; v < 2; v++) {
        const char *old = getenv(vars[v]);
        char saved[64] = "";
        bool had = old != NULL;
        if (old)
            snprintf(saved, sizeof saved, "%s", old);
        setenv(vars[v], "fastest", 1);
        CHECK_STATUS(mha_runtime_check(), MHA_ERR_VALUE);
        CHECK_ERROR_MENTIONS(vars[v]);
        CHECK_ERROR_MENTIONS("fastest");
        CHECK_ERROR_MENTIONS(v ? "valid: auto, blas, avx2, portable" : "valid: auto, ref, scalar, avx2");
        CHECK_STATUS(mha_linear_forward(&Y, &X, &W, NULL), MHA_ERR_VALUE);
        CHECK_STATUS(mha_sdpa_forward(&O, &Q, &Q, &Q, NULL), MHA_ERR_VALUE);
        setenv(vars[v], " ref", 1); /* no trimming */
        CHECK_STATUS(mha_runtime_check(), MHA_ERR_VALUE);
        setenv(vars[v], "", 1);
        CHECK_STATUS(mha_runtime_check(), MHA_OK);
        for (int i = 0; i < 4; i++) {
            setenv(vars[v], valid[v][i], 1);
            CHECK_STATUS(mha_runtime_check(), MHA_OK);
            CHECK_STATUS(mha_linear_forward(&Y, &X, &W, NULL), MHA_OK);
            /* avx2 may be unsupported on this CPU, but never "unknown" */
            CHECK(mha_sdpa_forward(&O, &Q, &Q, &Q, NULL) != MHA_ERR_VALUE);
        }
        restore(vars[v], saved, had);
    }
    CHECK_STATUS(mha_runtime_check(), MHA_OK);
}
