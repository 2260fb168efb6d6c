/* attention_short.c - the short-text attention's workspace size, its
 * reference (the plain loop, one head and one query row at a time) and the
 * avx512 dispatch (see attention_short.h).  Letters: L tokens, H heads, d head width. */
#include "attention_short.h"

#include <math.h>

int64_t mha_attn_short_ws_floats(int64_t L, int64_t d) {
    /* avx2: K^T (d, L rounded to 8) and 4 score rows; avx512: K^T (d, L
     * rounded to 16) and 8 score rows, the larger; the reference: 1 row */
    const int64_t Lp8 = (L + 7) / 8 * 8, Lp16 = (L + 15) / 16 * 16;
    const int64_t avx2 = (d + 4) * Lp8 + 8, avx512 = (d + 8) * Lp16;
    return avx2 > avx512 ? avx2 : avx512;
}

bool mha_attn_short_avx2_fits(int64_t d) {
    return d > 0 && d % 8 == 0 && d <= 64;
}

mha_status mha_attn_short_f32_avx512(float *ctx, int64_t ldo, const float *q, const float *k,
                                     const float *v, int64_t ld, int64_t L, int64_t H,
                                     int64_t d, float scale, float *ws) {
    MHA_TRY(mha_avx512_check());
    (*MHA_AVX512_PICK(mha_attn_short_avx512_loop))(ctx, ldo, q, k, v, ld, L, H, d, scale, ws);
    return MHA_OK;
}

void mha_attn_short_f32_ref(float *ctx, int64_t ldo, const float *q, const float *k,
                            const float *v, int64_t ld, int64_t L, int64_t H, int64_t d,
                            float scale, float *ws) {
    float *s = ws; /* (L) scores of one query row */
    for (int64_t h = 0; h < H; h++) {
        for (int64_t i = 0; i < L; i++) {
            const float *qi = q + i * ld + h * d;
            float m = -INFINITY;
            for (int64_t j = 0; j < L; j++) {
                const float *kj = k + j * ld + h * d;
                float dot = 0.0f;
                for (int64_t c = 0; c < d; c++)
                    dot += qi[c] * kj[c];
                s[j] = dot * scale;
                m = s[j] > m ? s[j] : m;
            }
            float l = 0.0f;
            for (int64_t j = 0; j < L; j++) {
                s[j] = expf(s[j] - m);
                l += s[j];
            }
            float *o = ctx + i * ldo + h * d;
            for (int64_t c = 0; c < d; c++) {
                float acc = 0.0f;
                for (int64_t j = 0; j < L; j++)
                    acc += s[j] * v[j * ld + h * d + c];
                o[c] = acc / l;
            }
        }
    }
}
