/* attention_bwd_ref.c - the reference attention backward: naive loops, float64.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v, G = Hq/Hkv.
 *
 * For each (b, kv head) pair, in order: for each query head of its group and
 * each query row i, rebuild the score row exactly as attention_ref.c does
 * (masked keys skipped, row maximum subtracted), then
 *   P_j, Z_j (dropout keep / (1-p)), dP_j = Z_j dO.v_j, D = sum_j P_j dP_j,
 *   dS_j = P_j (dP_j - D);  dq_i += scale sum_j dS_j k_j;
 *   dk_j += scale dS_j q_i;  dv_j += P_j Z_j dO_i  (float64 accumulators).
 * A pair owns its dk/dv rows and the dq rows of its query heads, so pairs run
 * on threads without sharing anything; results do not depend on the thread
 * count.  Fully masked rows contribute nothing.  The oracle of the fused
 * backward (attention_bwd_flash.c), so clarity over speed.
 */
#include "attention_bwd.h"
#include "attention_bias.h"

#include <math.h>
#include <string.h>


/* Scratch of one pair: rows (S) P, dS, T (softcap derivative), dk (S,d),
 * dv (S,dv), dq (d). */
static size_t pair_doubles(const mha_attn_problem *p) {
    return (size_t)(3 * p->S + p->S * p->d + p->S * p->dv + p->d);
}

static void pair_backward(const mha_attn_problem *p, const mha_attn_grad *g, int64_t b,
                          int64_t hk, double *scratch) {
    const int64_t G = p->Hq / p->Hkv, S = p->S, d = p->d, dvd = p->dv;
    double *P = scratch, *dS = P + S, *T = dS + S, *dk = T + S, *dv = dk + S * d;
    double *dq = dv + S * dvd;
    memset(dk, 0, sizeof(double) * (size_t)(S * d + S * dvd));
    const float *q = p->q.data, *k = p->k.data, *v = p->v.data, *dO = g->dout.data;
    const int64_t k0 = b * p->k.stride[0] + hk * p->k.stride[1];
    const int64_t v0 = b * p->v.stride[0] + hk * p->v.stride[1];
    const double keep_scale = p->dropout ? 1.0 / (1.0 - (double)p->dropout_p) : 1.0;

    for (int64_t h = hk * G; h < (hk + 1) * G; h++)
        for (int64_t i = 0; i < p->L; i++) {
            const int64_t q0 = b * p->q.stride[0] + h * p->q.stride[1] + i * p->q.stride[2];
            const int64_t o0 =
                b * g->dout.stride[0] + h * g->dout.stride[1] + i * g->dout.stride[2];
            double max = -INFINITY;
            bool any = false, nan = false;
            for (int64_t j = 0; j < S; j++) {
                float bias = mha_attn_bias(p, b, h, i, j);
                if (bias == -INFINITY) {
                    P[j] = -INFINITY;
                    continue;
                }
                double dot = 0.0;
                for (int64_t c = 0; c < d; c++)
                    dot += (double)q[q0 + c * p->q.stride[3]] *
                           (double)k[k0 + j * p->k.stride[2] + c * p->k.stride[3]];
                double raw = dot * (double)p->scale;
                T[j] = 1.0;
                if (p->softcap > 0.0f) { /* s = cap tanh(raw/cap): ds/draw = 1 - tanh^2 */
                    double t = tanh(raw / (double)p->softcap);
                    raw = (double)p->softcap * t;
                    T[j] = 1.0 - t * t;
                }
                P[j] = raw + (double)bias;
                any = true;
                if (isnan(P[j]))
                    nan = true;
                else if (P[j] > max)
                    max = P[j];
            }
            if (!any)
                continue; /* fully masked row: zero gradient */
            if (nan)
                max = NAN; /* as the forward: NaN anywhere poisons the row */
            double sink = -INFINITY; /* a sink joins the denominator only */
            if (p->sinks.data) {
                sink = ((const float *)p->sinks.data)[h * p->sinks.stride[0]];
                if (sink > max)
                    max = sink;
            }
            double sum = sink == -INFINITY ? 0.0 : exp(sink - max);
            for (int64_t j = 0; j < S; j++)
                if (P[j] != -INFINITY)
                    sum += (P[j] = exp(P[j] - max));
            double D = 0.0;
            for (int64_t j = 0; j < S; j++) {
                if (P[j] == -INFINITY) {
                    P[j] = 0.0, dS[j] = 0.0;
                    continue;
                }
                P[j] /= sum;
                double z = 1.0;
                if (p->dropout)
                    z = mha_dropout_uniform(p->seed, b, h, i, j) < p->dropout_p ? 0.0 : keep_scale;
                double dp = 0.0;
                for (int64_t c = 0; c < dvd; c++)
                    dp += (double)dO[o0 + c * g->dout.stride[3]] *
                          (double)v[v0 + j * p->v.stride[2] + c * p->v.stride[3]];
                dp *= z;
                dS[j] = dp; /* dP for now */
                D += P[j] * dp;
                if (g->dv.data)
                    for (int64_t c = 0; c < dvd; c++)
                        dv[j * dvd + c] += P[j] * z * (double)dO[o0 + c * g->dout.stride[3]];
            }
            memset(dq, 0, sizeof(double) * (size_t)d);
            for (int64_t j = 0; j < S; j++) {
                if (P[j] == 0.0)
                    continue;
                double ds = P[j] * (dS[j] - D) * T[j] * (double)p->scale;
                for (int64_t c = 0; c < d; c++) {
                    dq[c] += ds * (double)k[k0 + j * p->k.stride[2] + c * p->k.stride[3]];
                    dk[j * d + c] += ds * (double)q[q0 + c * p->q.stride[3]];
                }
            }
            if (g->dq.data) {
                float *out = g->dq.data;
                const int64_t r0 = b * g->dq.stride[0] + h * g->dq.stride[1] + i * g->dq.stride[2];
                for (int64_t c = 0; c < d; c++)
                    out[r0 + c * g->dq.stride[3]] += (float)dq[c];
            }
        }
    if (g->dk.data) {
        float *out = g->dk.data;
        for (int64_t j = 0; j < S; j++)
            for (int64_t c = 0; c < d; c++)
                out[b * g->dk.stride[0] + hk * g->dk.stride[1] + j * g->dk.stride[2] +
                    c * g->dk.stride[3]] += (float)dk[j * d + c];
    }
    if (g->dv.data) {
        float *out = g->dv.data;
        for (int64_t j = 0; j < S; j++)
            for (int64_t c = 0; c < dvd; c++)
                out[b * g->dv.stride[0] + hk * g->dv.stride[1] + j * g->dv.stride[2] +
                    c * g->dv.stride[3]] += (float)dv[j * dvd + c];
    }
}

mha_status mha_attn_bwd_f32_ref(const mha_attn_problem *p, const mha_attn_grad *g) {
    const int64_t pairs = p->B * p->Hkv;
    const int nthreads = mha_threads();
    const size_t per = pair_doubles(p);
    double *scratch = mha_malloc(sizeof(double) * per * (size_t)nthreads);
    if (!scratch)
        return mha_error(MHA_ERR_NOMEM, "attention backward: cannot allocate %zu doubles",
                         per * (size_t)nthreads);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < pairs; r++) {
        const int tid = mha_thread_index();
        pair_backward(p, g, r / p->Hkv, r % p->Hkv, scratch + (size_t)tid * per);
    }
    mha_free(scratch);
    return MHA_OK;
}
