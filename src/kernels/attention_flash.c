/* attention_flash.c - placeholder until the fused kernels land (issue 5). */
#include "../internal.h"

mha_kernel mha_attn_best_kernel(void) { return MHA_KERNEL_REF; }

mha_status mha_attn_fwd_f32_scalar(const mha_attn_problem *p) {
    (void)p;
    return mha_error(MHA_ERR_UNSUPPORTED, "kernel: the scalar fused kernel is not built yet");
}

mha_status mha_attn_fwd_f32_avx2(const mha_attn_problem *p) {
    (void)p;
    return mha_error(MHA_ERR_UNSUPPORTED, "kernel: the avx2 fused kernel is not built yet");
}
