/* gemm_packed.c - the packed-weight GEMM's portable half: the packing, the
 * scalar GELU and the reference product that gemm_packed_avx2.c's 4x24
 * kernel must match bit for bit (before GELU).  Layout and the sum's order:
 * gemm_packed.h.  Letters: M rows, N output features, K input features.
 */
#include "gemm_packed.h"

#include <math.h>
#include <string.h>

int64_t mha_gemm_packed_floats(int64_t N, int64_t K) {
    return (N + MHA_PACK_NR - 1) / MHA_PACK_NR * MHA_PACK_NR * K;
}

void mha_gemm_pack(float *wp, const float *w, int64_t ldw, int64_t N, int64_t K) {
    enum { NR = MHA_PACK_NR };
    for (int64_t n0 = 0; n0 < N; n0 += NR) {
        float *panel = wp + n0 * K; /* panel n0/NR starts at (n0/NR) * K * NR */
        const int64_t nr = N - n0 < NR ? N - n0 : NR;
        if (nr < NR)
            memset(panel, 0, sizeof(float) * (size_t)(K * NR));
        for (int64_t j = 0; j < nr; j++) {
            const float *row = w + (n0 + j) * ldw;
            for (int64_t k = 0; k < K; k++)
                panel[k * NR + j] = row[k];
        }
    }
}

float mha_gelu_as_f32(float x) {
    const float z = x * 0.70710678118654752f, a = fabsf(z);
    const float t = 1.0f / (0.3275911f * a + 1.0f);
    float r = 1.061405429f * t + -1.453152027f;
    r = r * t + 1.421413741f;
    r = r * t + -0.284496736f;
    r = r * t + 0.254829592f;
    const float e = r * t * expf(-(a * a)); /* erfc(|z|) */
    return 0.5f * x * (z < 0.0f ? e : 2.0f - e);
}

/* Obviously correct and slow: one element at a time, its FMA chain in k
 * order exactly as gemm_packed.h states it. */
void mha_gemm_packed_f32_ref(float *y, int64_t ldy, const float *x, int64_t ldx,
                             const float *wp, const float *bias, int64_t M, int64_t N,
                             int64_t K, int accumulate, int gelu) {
    enum { NR = MHA_PACK_NR };
    for (int64_t m = 0; m < M; m++) {
        for (int64_t n = 0; n < N; n++) {
            const float *wcol = wp + n / NR * K * NR + n % NR; /* w[n][k] = wcol[k * NR] */
            float acc = bias ? bias[n] : 0.0f;
            if (accumulate)
                acc = y[m * ldy + n] + acc;
            for (int64_t k = 0; k < K; k++)
                acc = fmaf(x[m * ldx + k], wcol[k * NR], acc);
            y[m * ldy + n] = gelu ? mha_gelu_as_f32(acc) : acc;
        }
    }
}
