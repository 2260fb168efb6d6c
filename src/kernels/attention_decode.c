/* attention_decode.c - portable inner loops of the decode step (see
 * attention_decode.h).  Letter legend: G heads per kv head, n keys, d, dv.
 * K/V elements are read through mha_load_f in the storage dtype; each loop
 * body is written once and specialised per dtype by inlining (the dtype a
 * constant in each instance). */
#include "attention_decode.h"
#include "convert.h"

#include <math.h>

static inline __attribute__((always_inline)) void
qk_scalar_dt(float *s, const float *q, const void *k, mha_dtype dt, int64_t n, int64_t G,
             int64_t d) {
    for (int64_t j = 0; j < n; j++) {
        const int64_t kr = j * d;
        for (int64_t g = 0; g < G; g++) {
            const float *qr = q + g * d;
            float acc[8] = {0}; /* 8 partial sums: lets the compiler vectorize */
            int64_t x = 0;
            for (; x + 8 <= d; x += 8)
                for (int u = 0; u < 8; u++)
                    acc[u] += qr[x + u] * mha_load_f(k, dt, kr + x + u);
            float dot = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (; x < d; x++)
                dot += qr[x] * mha_load_f(k, dt, kr + x);
            s[g * n + j] = dot;
        }
    }
}

static void qk_scalar(float *s, const float *q, const void *k, mha_dtype dt, int64_t n, int64_t G,
                      int64_t d, const mha_decode_ahead *ahead) {
    (void)ahead; /* the portable loops leave the lines to the hardware */
    switch (dt) {
    case MHA_F16: qk_scalar_dt(s, q, k, MHA_F16, n, G, d); break;
    case MHA_BF16: qk_scalar_dt(s, q, k, MHA_BF16, n, G, d); break;
    default: qk_scalar_dt(s, q, k, MHA_F32, n, G, d); break;
    }
}

static inline __attribute__((always_inline)) void
pv_scalar_dt(float *acc, const float *p, const void *v, mha_dtype dt, int64_t n, int64_t G,
             int64_t dv) {
    for (int64_t j = 0; j < n; j++) {
        const int64_t vr = j * dv;
        for (int64_t g = 0; g < G; g++) {
            const float pj = p[g * n + j];
            float *a = acc + g * dv;
            for (int64_t x = 0; x < dv; x++)
                a[x] += pj * mha_load_f(v, dt, vr + x);
        }
    }
}

static void pv_scalar(float *acc, const float *p, const void *v, mha_dtype dt, int64_t n,
                      int64_t G, int64_t dv, const mha_decode_ahead *ahead) {
    (void)ahead;
    switch (dt) {
    case MHA_F16: pv_scalar_dt(acc, p, v, MHA_F16, n, G, dv); break;
    case MHA_BF16: pv_scalar_dt(acc, p, v, MHA_BF16, n, G, dv); break;
    default: pv_scalar_dt(acc, p, v, MHA_F32, n, G, dv); break;
    }
}

static float row_max_scalar(const float *s, int64_t n) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        if (isnan(s[j]))
            return NAN;
        if (s[j] > m)
            m = s[j];
    }
    return m;
}

static float exp_sum_scalar(float *s, int64_t n, float m) {
    float l = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        s[j] = mha_softmax_weight(s[j] - m);
        l += s[j];
    }
    return l;
}

static void round_p_scalar(float *p, int64_t n, mha_dtype dt) {
    for (int64_t j = 0; j < n; j++)
        p[j] = mha_round_to(dt, p[j]);
}

const mha_decode_isa mha_decode_isa_scalar = {qk_scalar, pv_scalar, row_max_scalar,
                                               exp_sum_scalar, round_p_scalar};
