/* optim.c - AdamW with global-norm gradient clipping, the optimiser of
 * `mha train`.
 *
 * llm.c's layout (gpt2_update): parameters, gradients and each moment
 * buffer are ONE flat allocation of n floats, so a step is one flat loop.
 * The formula is PyTorch's torch.optim.AdamW (1.13, single-tensor path)
 * operation for operation, in float32 with the scalars PyTorch computes in
 * double (ref: Loshchilov & Hutter, "Decoupled Weight Decay
 * Regularization", arXiv:1711.05101):
 *   step += 1
 *   p  = p * (1 - lr*wd)                       decoupled weight decay
 *   m  = m * b1 + (1-b1) * g
 *   v  = v * b2 + (1-b2) * g * g
 *   bc1 = 1 - b1^step,  bc2 = 1 - b2^step      (double)
 *   p  = p - (lr/bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
 * Clipping is torch.nn.utils.clip_grad_norm_: total = ||g||_2 over every
 * parameter, g *= min(1, max_norm / (total + 1e-6)).  The norm is summed in
 * double in one fixed order (thread-count independent).
 */
#include "internal.h"

#include <math.h>
#include <string.h>

void mha_adamw_options_init(mha_adamw_options *o) {
    if (!o)
        return;
    o->lr = 1e-3;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->weight_decay = 1e-2;
    o->max_grad_norm = 0.0;
}

static mha_status check_options(const mha_adamw_options *o) {
    MHA_CHECK(o != NULL, MHA_ERR_NULL, "adamw: NULL options");
    MHA_CHECK(isfinite(o->lr) && o->lr >= 0.0, MHA_ERR_VALUE, "adamw: lr %g must be >= 0", o->lr);
    MHA_CHECK(o->beta1 >= 0.0 && o->beta1 < 1.0 && o->beta2 >= 0.0 && o->beta2 < 1.0,
              MHA_ERR_VALUE, "adamw: betas (%g,%g) must be in [0,1)", o->beta1, o->beta2);
    MHA_CHECK(isfinite(o->eps) && o->eps >= 0.0, MHA_ERR_VALUE, "adamw: eps %g must be >= 0",
              o->eps);
    MHA_CHECK(isfinite(o->weight_decay) && o->weight_decay >= 0.0, MHA_ERR_VALUE,
              "adamw: weight_decay %g must be >= 0", o->weight_decay);
    MHA_CHECK(isfinite(o->max_grad_norm), MHA_ERR_VALUE, "adamw: max_grad_norm %g not finite",
              o->max_grad_norm);
    return MHA_OK;
}

mha_status mha_adamw_create(mha_adamw *a, int64_t n, const mha_adamw_options *o) {
    MHA_OPTIONS_DEFAULT(mha_adamw_options, o);
    MHA_CHECK(a != NULL, MHA_ERR_NULL, "adamw: NULL optimiser");
    memset(a, 0, sizeof *a);
    MHA_TRY(check_options(o));
    MHA_CHECK(n >= 0 && (uint64_t)n <= SIZE_MAX / sizeof(float), MHA_ERR_OVERFLOW,
              "adamw: %lld parameters", (long long)n);
    a->m = mha_calloc((size_t)(n ? n : 1), sizeof(float));
    a->v = mha_calloc((size_t)(n ? n : 1), sizeof(float));
    if (!a->m || !a->v) {
        mha_free(a->m), mha_free(a->v);
        a->m = a->v = NULL;
        return mha_error(MHA_ERR_NOMEM, "adamw: cannot allocate 2 x %lld floats", (long long)n);
    }
    a->n = n;
    a->opt = *o;
    return MHA_OK;
}

void mha_adamw_free(mha_adamw *a) {
    if (!a)
        return;
    mha_free(a->m), mha_free(a->v);
    a->m = a->v = NULL;
    a->n = 0;
}

mha_status mha_grad_clip_norm(float *grads, int64_t n, double max_norm, double *norm) {
    MHA_CHECK(grads != NULL || n == 0, MHA_ERR_NULL, "clip: NULL gradients");
    double sq = 0.0;
    for (int64_t i = 0; i < n; i++)
        sq += (double)grads[i] * grads[i];
    const double total = sqrt(sq);
    if (norm)
        *norm = total;
    if (max_norm > 0.0) {
        const float coef = (float)(max_norm / (total + 1e-6));
        if (coef < 1.0f)
            for (int64_t i = 0; i < n; i++)
                grads[i] *= coef;
    }
    return MHA_OK;
}

mha_status mha_adamw_step(mha_adamw *a, float *params, float *grads, double *grad_norm) {
    MHA_CHECK(a != NULL && a->m != NULL, MHA_ERR_NULL, "adamw: not initialised");
    MHA_CHECK((params && grads) || a->n == 0, MHA_ERR_NULL, "adamw: NULL params or grads");
    MHA_TRY(check_options(&a->opt));
    MHA_TRY(mha_grad_clip_norm(grads, a->n, a->opt.max_grad_norm, grad_norm));
    const mha_adamw_options *o = &a->opt;
    a->step++;
    const double bc1 = 1.0 - pow(o->beta1, (double)a->step);
    const double bc2 = 1.0 - pow(o->beta2, (double)a->step);
    /* the scalars as PyTorch hands them to its float kernels */
    const float decay = (float)(1.0 - o->lr * o->weight_decay);
    const float b1 = (float)o->beta1, b2 = (float)o->beta2;
    const float a1 = (float)(1.0 - o->beta1), a2 = (float)(1.0 - o->beta2);
    const float step_size = (float)(o->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float eps = (float)o->eps;
    float *m = a->m, *v = a->v;
    for (int64_t i = 0; i < a->n; i++) {
        const float g = grads[i];
        params[i] *= decay;
        m[i] = m[i] * b1 + a1 * g;
        v[i] = v[i] * b2 + a2 * (g * g);
        const float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        params[i] += -step_size * (m[i] / denom);
    }
    return MHA_OK;
}
