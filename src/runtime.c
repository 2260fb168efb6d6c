/* runtime.c - what a call runs on: the MHA_KERNEL and MHA_GEMM environment
 * choices, read and validated in this one place.
 *
 * MHA_KERNEL=auto|ref|scalar|avx2 overrides MHA_KERNEL_AUTO for attention;
 * MHA_GEMM=auto|blas|avx2|portable forces the projections' GEMM path.
 * Unset or empty means auto.  Any other value is an error: every call that
 * would select a kernel or a GEMM path returns MHA_ERR_VALUE naming the
 * variable and the valid values (mha_runtime_check), never a silent
 * fallback.
 */
#include "internal.h"
#include "kernels/gemm.h"

#include <stdlib.h>
#include <string.h>

/* Index of env's value in names[0..n), 0 (auto) when unset or empty, -1
 * when unknown. */
static int env_choice(const char *var, const char *const *names, int n) {
    const char *v = getenv(var);
    if (!v || !*v)
        return 0;
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0)
            return i;
    return -1;
}

/* Index = the enum value (AUTO first). */
static const char *const kernel_names[] = {"auto", "ref", "scalar", "avx2"};
static const char *const gemm_names[] = {"auto", "blas", "avx2", "portable"};

mha_kernel mha_runtime_kernel_env(void) {
    int i = env_choice("MHA_KERNEL", kernel_names, 4);
    return i > 0 ? (mha_kernel)i : MHA_KERNEL_AUTO;
}

mha_gemm_path mha_runtime_gemm_env(void) {
    int i = env_choice("MHA_GEMM", gemm_names, 4);
    return i > 0 ? (mha_gemm_path)i : MHA_GEMM_AUTO;
}

mha_status mha_runtime_check(void) {
    MHA_CHECK(env_choice("MHA_KERNEL", kernel_names, 4) >= 0, MHA_ERR_VALUE,
              "MHA_KERNEL=%s: unknown kernel (valid: auto, ref, scalar, avx2)",
              getenv("MHA_KERNEL"));
    MHA_CHECK(env_choice("MHA_GEMM", gemm_names, 4) >= 0, MHA_ERR_VALUE,
              "MHA_GEMM=%s: unknown GEMM path (valid: auto, blas, avx2, portable)",
              getenv("MHA_GEMM"));
    return MHA_OK;
}
