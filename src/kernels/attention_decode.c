/* attention_decode.c - portable inner loops of the decode step (see
 * attention_decode.h).  Letter legend: G heads per kv head, n keys, d, dv. */
#include "attention_decode.h"

static void qk_scalar(float *s, const float *q, const float *k, int64_t n, int64_t G, int64_t d) {
    for (int64_t j = 0; j < n; j++) {
        const float *kr = k + j * d;
        for (int64_t g = 0; g < G; g++) {
            const float *qr = q + g * d;
            float acc[8] = {0}; /* 8 partial sums: lets the compiler vectorize */
            int64_t x = 0;
            for (; x + 8 <= d; x += 8)
                for (int u = 0; u < 8; u++)
                    acc[u] += qr[x + u] * kr[x + u];
            float dot = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (; x < d; x++)
                dot += qr[x] * kr[x];
            s[g * n + j] = dot;
        }
    }
}

static void pv_scalar(float *acc, const float *p, const float *v, int64_t n, int64_t G,
                      int64_t dv) {
    for (int64_t j = 0; j < n; j++) {
        const float *vr = v + j * dv;
        for (int64_t g = 0; g < G; g++) {
            const float pj = p[g * n + j];
            float *a = acc + g * dv;
            for (int64_t x = 0; x < dv; x++)
                a[x] += pj * vr[x];
        }
    }
}

const mha_decode_isa mha_decode_isa_scalar = {qk_scalar, pv_scalar};
