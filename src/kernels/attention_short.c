/* attention_short.c - the short-text attention's workspace size and its
 * reference: the plain loop, one head and one query row at a time (see
 * attention_short.h).  Letters: L tokens, H heads, d head width. */
#include "attention_short.h"

#include <math.h>

int64_t mha_attn_short_ws_floats(int64_t L, int64_t d) {
    const int64_t Lp = (L + 7) / 8 * 8;
    return (d + 4) * Lp + 8; /* K^T (d, Lp) and 4 score rows (avx2); the reference: 1 row */
}

bool mha_attn_short_avx2_fits(int64_t d) {
    return d > 0 && d % 8 == 0 && d <= 64;
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
