/* attention_ref.c - the reference attention kernel: naive loops, float64.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v.
 *
 * For each query row (b,h,i): bias_j from causal/mask/padding; masked keys
 * (bias = -inf) are skipped, never multiplied by zero, so NaN/Inf in masked
 * K/V cannot leak.  The softmax subtracts the row maximum.  A row without an
 * unmasked key follows p->masked_rows.  Used as the oracle for every fast
 * kernel, so it favours clarity over speed.
 */
#include "../internal.h"
#include "attention_short.h"
#include "attention_bias.h"
#include "convert.h"

#include <math.h>


/* q row (offset q0) . k row (offset k0) in float64; with the ONNX scale q
 * and k each times sqrt(scale), rounded to float.  float32 tensors take a
 * loop without the per-element dtype switch (the reference's speed). */
static double dot_qk(const mha_attn_problem *p, int64_t q0, int64_t k0) {
    const int64_t qs = p->q.stride[3], ks = p->k.stride[3];
    const float m = p->qk_scale;
    double dot = 0.0;
    if (p->q.dtype == MHA_F32 && p->k.dtype == MHA_F32) {
        const float *q = (const float *)p->q.data + q0, *k = (const float *)p->k.data + k0;
        if (p->onnx_scale)
            for (int64_t c = 0; c < p->d; c++)
                dot += (double)(q[c * qs] * m) * (double)(k[c * ks] * m);
        else
            for (int64_t c = 0; c < p->d; c++)
                dot += (double)q[c * qs] * (double)k[c * ks];
        return dot;
    }
    for (int64_t c = 0; c < p->d; c++) {
        const float a = mha_load_f(p->q.data, p->q.dtype, q0 + c * qs);
        const float b = mha_load_f(p->k.data, p->k.dtype, k0 + c * ks);
        dot += p->onnx_scale ? (double)(a * m) * (double)(b * m) : (double)a * (double)b;
    }
    return dot;
}

/* One query row: o_row (dv), w_row (S) or NULL; scores (S) is scratch. */
static void attend_row(const mha_attn_problem *p, int64_t b, int64_t h, int64_t i,
                       double *scores) {
    const int64_t hk = h / (p->Hq / p->Hkv);
    const void *v = p->v.data; /* q, k, v, out: any float dtype */
    void *o = p->o.data;
    const mha_dtype vt = p->v.dtype, ot = p->o.dtype;
    float *w = p->attn_weights.data;
    float *qk = p->qk.data;
    const int64_t q0 = b * p->q.stride[0] + h * p->q.stride[1] + i * p->q.stride[2];
    const int64_t k0 = b * p->k.stride[0] + hk * p->k.stride[1];
    const int64_t v0 = b * p->v.stride[0] + hk * p->v.stride[1];
    const int64_t o0 = b * p->o.stride[0] + h * p->o.stride[1] + i * p->o.stride[2];
    const int64_t w0 = w ? b * p->attn_weights.stride[0] + h * p->attn_weights.stride[1] +
                               i * p->attn_weights.stride[2]
                         : 0;
    const int64_t qk0 = qk ? b * p->qk.stride[0] + h * p->qk.stride[1] + i * p->qk.stride[2] : 0;
    float *lse = p->lse.data
                     ? (float *)p->lse.data + b * p->lse.stride[0] + h * p->lse.stride[1] +
                           i * p->lse.stride[2]
                     : NULL;
    /* modes 0-2 of qk show every score, masked ones included */
    const bool all_scores = qk && p->qk_mode < 3;

    /* scores, with -inf marking masked keys */
    double max = -INFINITY;
    bool any = false, nan = false;
    for (int64_t j = 0; j < p->S; j++) {
        float bias = mha_attn_bias(p, b, h, i, j);
        if (bias == -INFINITY && !all_scores) {
            scores[j] = -INFINITY;
            continue;
        }
        const double dot = dot_qk(p, q0, k0 + j * p->k.stride[2]);
        const double raw = p->onnx_scale ? dot : dot * (double)p->scale;
        const double capped =
            p->softcap > 0.0f ? (double)p->softcap * tanh(raw / (double)p->softcap) : raw;
        const double s = bias == -INFINITY ? -INFINITY : capped + (double)bias;
        if (all_scores)
            qk[qk0 + j * p->qk.stride[3]] =
                (float)(p->qk_mode == 0 ? raw : p->qk_mode == 1 ? capped : s);
        scores[j] = s;
        if (bias == -INFINITY)
            continue;
        any = true;
        if (isnan(s))
            nan = true;
        else if (s > max)
            max = s;
    }

    if (!any) { /* fully masked row */
        float fill = p->masked_rows == MHA_MASKED_ROWS_NAN ? NAN : 0.0f;
        for (int64_t c = 0; c < p->dv; c++)
            mha_store_f(o, ot, o0 + c * p->o.stride[3], fill);
        for (int64_t j = 0; w && j < p->S; j++)
            w[w0 + j * p->attn_weights.stride[3]] = fill;
        for (int64_t j = 0; qk && !all_scores && j < p->S; j++)
            qk[qk0 + j * p->qk.stride[3]] = fill;
        if (lse)
            *lse = -INFINITY;
        return;
    }
    /* the sink joins the denominator (and the max, for range) */
    const double sink =
        p->sinks.data ? (double)((const float *)p->sinks.data)[h * p->sinks.stride[0]] : -INFINITY;
    if (nan)
        max = NAN; /* as torch.max: NaN anywhere poisons the row */
    else if (sink > max)
        max = sink;

    /* float64 throughout: the reference serves MHA_SOFTMAX_F64 as is */
    double sum = sink == -INFINITY ? 0.0 : exp(sink - max);
    for (int64_t j = 0; j < p->S; j++) {
        if (scores[j] == -INFINITY)
            continue;
        scores[j] = exp(scores[j] - max);
        sum += scores[j];
    }
    if (lse)
        *lse = (float)(max + log(sum));
    const double keep_scale = p->dropout ? 1.0 / (1.0 - (double)p->dropout_p) : 1.0;
    for (int64_t j = 0; j < p->S; j++) {
        if (scores[j] == -INFINITY) { /* masked: weight 0, skipped below */
            if (w)
                w[w0 + j * p->attn_weights.stride[3]] = 0.0f;
            if (qk && !all_scores)
                qk[qk0 + j * p->qk.stride[3]] = 0.0f;
            continue;
        }
        const bool dropped = p->dropout && mha_dropout_uniform(p->seed, b, h, i, j) < p->dropout_p;
        double pj = scores[j] / sum;
        if (p->dropout)
            pj = dropped ? 0.0 : pj * keep_scale;
        /* half v: P.V takes exp(s - max) (after dropout) rounded to v's dtype,
         * then divided by the sum: the fused kernels' rule; the weights stay
         * unrounded */
        const double e = dropped ? 0.0 : scores[j] * keep_scale;
        scores[j] = p->p_dtype == MHA_F32 ? pj : (double)mha_round_to(p->p_dtype, (float)e) / sum;
        if (w)
            w[w0 + j * p->attn_weights.stride[3]] = (float)pj;
        if (qk && !all_scores)
            qk[qk0 + j * p->qk.stride[3]] = (float)pj;
    }
    for (int64_t c = 0; c < p->dv; c++) {
        double acc = 0.0;
        for (int64_t j = 0; j < p->S; j++) {
            if (scores[j] == -INFINITY)
                continue; /* masked: skipped, not multiplied by zero */
            const int64_t at = v0 + j * p->v.stride[2] + c * p->v.stride[3];
            acc += scores[j] * (double)(vt == MHA_F32 ? ((const float *)v)[at] : mha_load_f(v, vt, at));
        }
        mha_store_f(o, ot, o0 + c * p->o.stride[3], (float)acc);
    }
}

mha_status mha_attn_fwd_f32_ref(const mha_attn_problem *p) {
    const int64_t rows = p->B * p->Hq * p->L;
    const int nthreads = mha_threads();
    const size_t need = sizeof(double) * (size_t)(p->S > 0 ? p->S : 1) * (size_t)nthreads;
    const bool planned = p->scratch && p->scratch_bytes >= need;
    double *scratch = planned ? p->scratch : mha_malloc(need);
    if (!scratch)
        return mha_error(MHA_ERR_NOMEM, "attention: cannot allocate %lld score doubles",
                         (long long)p->S * nthreads);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int tid = mha_thread_index();
        int64_t i = r % p->L, h = (r / p->L) % p->Hq, b = r / (p->L * p->Hq);
        attend_row(p, b, h, i, scratch + (size_t)tid * (size_t)(p->S > 0 ? p->S : 1));
    }
    if (!planned)
        mha_free(scratch);
    return MHA_OK;
}

size_t mha_attn_scratch_bound(int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S,
                              int64_t d, int64_t dv) {
    (void)Hq, (void)L;
    const int nthreads = mha_threads();
    size_t ref = sizeof(double) * (size_t)(S > 0 ? S : 1) * (size_t)nthreads;
    size_t flash = mha_attn_flash_scratch_bound(B, Hkv, S, d, dv, nthreads);
    size_t rows = mha_attn_short_scratch_bound(S, d, nthreads); /* d = dv there */
    size_t most = ref > flash ? ref : flash;
    return rows > most ? rows : most;
}
