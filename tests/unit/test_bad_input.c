/* test_bad_input.c - the bad-input matrix: every hostile or degenerate
 * argument gets a named test with the status and the message it must give.
 *
 * Cases: NaN/Inf in inputs (propagated where attended, never leaking from
 * masked positions), non-finite options, logits up to +-1e4, fully masked
 * rows, empty dimensions, heads not dividing E, masks of the wrong shape or
 * dtype, overflowing sizes and strides, NULL pointers, outputs overlapping
 * inputs.  Numerical cases run on every kernel this build and CPU have.
 *
 * Every case is recorded (area, case, status, message);
 * `MHA_ERRORS_MD=path build/mha-tests bad_input` writes the table that
 * docs/errors.md holds, so the document is what the library really says.
 */
#include "test.h"

#include "io/io.h"

#include <unistd.h>

/* ---- the case table ------------------------------------------------------------ */

typedef struct err_row {
    const char *area;
    char what[160];
    mha_status status;
    char message[240];
} err_row;

static err_row rows[512];
static int n_rows;

static void record(const char *area, const char *what, mha_status st, const char *message) {
    if (n_rows >= (int)(sizeof rows / sizeof *rows))
        return;
    err_row *r = &rows[n_rows++];
    r->area = area;
    snprintf(r->what, sizeof r->what, "%s", what);
    r->status = st;
    snprintf(r->message, sizeof r->message, "%s", message);
}

/* The call must fail with `want` and a message containing `needle` (the
 * argument's name). */
static void expect_error(const char *area, const char *what, mha_status got, mha_status want,
                         const char *needle, const char *file, int line) {
    const char *msg = got == MHA_OK ? "" : mha_last_error();
    if (got != want)
        test_fail(file, line, "%s: %s -> %s (%s), want %s", area, what, mha_status_string(got),
                  msg, mha_status_string(want));
    else if (needle && !strstr(msg, needle))
        test_fail(file, line, "%s: %s: message \"%s\" lacks \"%s\"", area, what, msg, needle);
    record(area, what, got, msg);
}
#define EXPECT_ERR(area, what, call, want, needle) \
    expect_error(area, what, (call), want, needle, __FILE__, __LINE__)

/* A behaviour case (status MHA_OK): cond must hold; `effect` describes it. */
static void expect_ok(const char *area, const char *what, mha_status got, bool cond,
                      const char *effect, const char *file, int line) {
    if (got != MHA_OK)
        test_fail(file, line, "%s: %s -> %s (%s), want ok", area, what, mha_status_string(got),
                  mha_last_error());
    else if (!cond)
        test_fail(file, line, "%s: %s: expected %s", area, what, effect);
    record(area, what, got, effect);
}
#define EXPECT_OK(area, what, call, cond, effect) \
    do {                                          \
        mha_status st_ = (call);                  \
        expect_ok(area, what, st_, (cond), effect, __FILE__, __LINE__); \
    } while (0)

/* ---- an SDPA problem ------------------------------------------------------------- */

typedef struct sdpa_case {
    int64_t B, Hq, Hkv, L, S, d, dv;
    mha_tensor q, k, v, o, w;
    float *qd, *kd, *vd, *od, *wd;
    mha_sdpa_options opt;
} sdpa_case;

static float *alloc_fill(size_t n, uint64_t seed) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    test_randn(p, n, seed);
    return p;
}

static void sdpa_make(sdpa_case *c, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S,
                      int64_t d, int64_t dv, mha_kernel kernel) {
    memset(c, 0, sizeof *c);
    c->B = B, c->Hq = Hq, c->Hkv = Hkv, c->L = L, c->S = S, c->d = d, c->dv = dv;
    c->qd = alloc_fill((size_t)(B * Hq * L * d), 1);
    c->kd = alloc_fill((size_t)(B * Hkv * S * d), 2);
    c->vd = alloc_fill((size_t)(B * Hkv * S * dv), 3);
    c->od = alloc_fill((size_t)(B * Hq * L * dv), 4); /* garbage the call must overwrite */
    c->wd = alloc_fill((size_t)(B * Hq * L * S), 5);
    mha_tensor_init(&c->q, MHA_F32, c->qd, 4, (int64_t[]){B, Hq, L, d});
    mha_tensor_init(&c->k, MHA_F32, c->kd, 4, (int64_t[]){B, Hkv, S, d});
    mha_tensor_init(&c->v, MHA_F32, c->vd, 4, (int64_t[]){B, Hkv, S, dv});
    mha_tensor_init(&c->o, MHA_F32, c->od, 4, (int64_t[]){B, Hq, L, dv});
    mha_tensor_init(&c->w, MHA_F32, c->wd, 4, (int64_t[]){B, Hq, L, S});
    mha_sdpa_options_init(&c->opt);
    c->opt.kernel = kernel;
}

static void sdpa_free(sdpa_case *c) {
    free(c->qd), free(c->kd), free(c->vd), free(c->od), free(c->wd);
}

static mha_status sdpa_run(sdpa_case *c) {
    return mha_sdpa_forward(&c->o, &c->q, &c->k, &c->v, &c->opt);
}

/* Pointer to out[b,h,i,0] (rows are contiguous, dv floats). */
static float *out_row(sdpa_case *c, int64_t b, int64_t h, int64_t i) {
    return c->od + ((b * c->Hq + h) * c->L + i) * c->dv;
}
static float *w_row(sdpa_case *c, int64_t b, int64_t h, int64_t i) {
    return c->wd + ((b * c->Hq + h) * c->L + i) * c->S;
}

static bool all_nan(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]))
            return false;
    return n > 0;
}
static bool all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return false;
    return true;
}
static bool all_zero(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] != 0.0f)
            return false;
    return true;
}

static const mha_kernel kernels[] = {MHA_KERNEL_REF, MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2,
                                     MHA_KERNEL_AVX512};
#define N_KERNELS (int)(sizeof kernels / sizeof *kernels)

static bool kernel_runs(mha_kernel kernel) {
    sdpa_case c;
    sdpa_make(&c, 1, 1, 1, 2, 2, 2, 2, kernel);
    mha_status st = sdpa_run(&c);
    sdpa_free(&c);
    if (st != MHA_OK)
        SKIP_PART("kernel %s: not in this build or on this CPU", mha_kernel_name(kernel));
    return st == MHA_OK;
}

static const char *area_of(mha_kernel kernel) {
    switch (kernel) {
    case MHA_KERNEL_SCALAR: return "sdpa (scalar)";
    case MHA_KERNEL_AVX2: return "sdpa (avx2)";
    case MHA_KERNEL_AVX512: return "sdpa (avx512)";
    default: return "sdpa (ref)";
    }
}

/* ---- NaN / Inf ---------------------------------------------------------------- */

TEST(bad_input_nan_inf_in_attended_query_gives_nan_rows) {
    for (int kk = 0; kk < N_KERNELS; kk++) {
        if (!kernel_runs(kernels[kk]))
            continue;
        const char *area = area_of(kernels[kk]);
        sdpa_case c;
        sdpa_make(&c, 2, 4, 2, 5, 7, 3, 6, kernels[kk]);
        c.qd[((1 * 4 + 2) * 5 + 3) * 3 + 1] = NAN; /* q[1,2,3,1] */
        bool ok = true;
        EXPECT_OK(area, "NaN in q[1,2,3,:]", sdpa_run(&c), all_nan(out_row(&c, 1, 2, 3), 6),
                  "output row (1,2,3) all NaN, as PyTorch");
        for (int64_t r = 0; r < 2 * 4 * 5; r++)
            if (r != (1 * 4 + 2) * 5 + 3 && !all_finite(c.od + r * 6, 6))
                ok = false;
        EXPECT_OK(area, "NaN in q[1,2,3,:]: other rows", MHA_OK, ok, "every other row finite");
        sdpa_free(&c);

        sdpa_make(&c, 2, 4, 2, 5, 7, 3, 6, kernels[kk]);
        for (int64_t j = 0; j < 2 * 2 * 7; j++)
            c.kd[j * 3] = 1.0f + (float)(j % 3); /* k[...,0] > 0: q.k = +inf */
        c.qd[((0 * 4 + 1) * 5 + 4) * 3 + 0] = INFINITY; /* q[0,1,4,0] */
        EXPECT_OK(area, "+Inf in q[0,1,4,0]", sdpa_run(&c), all_nan(out_row(&c, 0, 1, 4), 6),
                  "output row (0,1,4) all NaN (inf - inf in the softmax), as PyTorch");
        sdpa_free(&c);
    }
}

TEST(bad_input_nan_in_attended_value_poisons_its_column) {
    for (int kk = 0; kk < N_KERNELS; kk++) {
        if (!kernel_runs(kernels[kk]))
            continue;
        sdpa_case c;
        sdpa_make(&c, 1, 2, 1, 3, 4, 2, 3, kernels[kk]);
        c.vd[2 * 3 + 1] = NAN; /* v[0,0,2,1], attended by every row */
        mha_status st = sdpa_run(&c);
        bool ok = true;
        for (int64_t r = 0; r < 2 * 3; r++)
            ok = ok && isnan(c.od[r * 3 + 1]) && isfinite(c.od[r * 3]) && isfinite(c.od[r * 3 + 2]);
        EXPECT_OK(area_of(kernels[kk]), "NaN in v[0,0,2,1] (attended)", st, ok,
                  "column 1 of every row NaN, other columns finite");
        sdpa_free(&c);
    }
}

/* NaN/Inf in keys and values that every query masks out must not reach the
 * output: the result is finite and equals the run on clean data (bit for
 * bit on the reference kernel, which skips masked keys; the fused kernels
 * may round differently when a NaN score enters their running maximum). */
TEST(bad_input_nan_inf_in_masked_keys_values_do_not_leak) {
    for (int kk = 0; kk < N_KERNELS; kk++) {
        if (!kernel_runs(kernels[kk]))
            continue;
        const char *area = area_of(kernels[kk]);
        for (int how = 0; how < 4; how++) {
            /* masked key j = 3 of batch 0 via: 0 key_padding_mask, 1 bool mask,
             * 2 float mask -inf, 3 causal (key 6 never attended: L=5 <= 6) */
            sdpa_case c, ref;
            sdpa_make(&c, 2, 2, 1, 5, 7, 4, 3, kernels[kk]);
            sdpa_make(&ref, 2, 2, 1, 5, 7, 4, 3, kernels[kk]);
            int64_t j = how == 3 ? 6 : 3;
            uint8_t kpm[2 * 7] = {0};
            uint8_t bmask[7] = {1, 1, 1, 1, 1, 1, 1};
            float fmask[7] = {0};
            mha_tensor m;
            kpm[j] = 1, kpm[7 + j] = 1;
            bmask[j] = 0;
            fmask[j] = -INFINITY;
            if (how == 0) {
                mha_tensor_init(&m, MHA_BOOL, kpm, 2, (int64_t[]){2, 7});
                c.opt.key_padding_mask = ref.opt.key_padding_mask = &m;
            } else if (how == 1) {
                mha_tensor_init(&m, MHA_BOOL, bmask, 1, (int64_t[]){7});
                c.opt.attn_mask = ref.opt.attn_mask = &m;
            } else if (how == 2) {
                mha_tensor_init(&m, MHA_F32, fmask, 1, (int64_t[]){7});
                c.opt.attn_mask = ref.opt.attn_mask = &m;
            } else {
                c.opt.causal = ref.opt.causal = MHA_CAUSAL_TOP_LEFT;
            }
            c.opt.attn_weights = &c.w, ref.opt.attn_weights = &ref.w;
            for (int64_t b = 0; b < 2; b++) {
                for (int64_t x = 0; x < 4; x++)
                    c.kd[(b * 7 + j) * 4 + x] = x % 2 ? NAN : INFINITY;
                for (int64_t x = 0; x < 3; x++)
                    c.vd[(b * 7 + j) * 3 + x] = x % 2 ? -INFINITY : NAN;
            }
            REQUIRE_OK(sdpa_run(&ref));
            static const char *names[] = {"key_padding_mask", "bool mask", "float mask -inf",
                                          "causal"};
            char what[128];
            snprintf(what, sizeof what, "NaN/Inf in k and v of a key masked by %s", names[how]);
            mha_status st = sdpa_run(&c);
            size_t no = 2 * 2 * 5 * 3, nw = 2 * 2 * 5 * 7;
            bool exact = kernels[kk] == MHA_KERNEL_REF;
            bool same = exact ? !memcmp(c.od, ref.od, no * sizeof(float)) &&
                                    !memcmp(c.wd, ref.wd, nw * sizeof(float))
                              : test_rel_err(c.od, ref.od, no) < 1e-6 &&
                                    test_rel_err(c.wd, ref.wd, nw) < 1e-6;
            EXPECT_OK(area, what, st, all_finite(c.od, (int64_t)no) && same,
                      exact ? "output and weights finite and bit-identical to the clean run"
                            : "output and weights finite and equal to the clean run to 1e-6");
            sdpa_free(&c);
            sdpa_free(&ref);
        }
    }
}

TEST(bad_input_non_finite_options) {
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    static const char *bad_names[] = {"NaN", "+Inf", "-Inf"};
    for (int i = 0; i < 3; i++) {
        sdpa_case c;
        sdpa_make(&c, 1, 1, 1, 2, 3, 2, 2, MHA_KERNEL_REF);
        char what[64];
        c.opt.scale_set = 1, c.opt.scale = bad[i];
        snprintf(what, sizeof what, "scale = %s", bad_names[i]);
        EXPECT_ERR("sdpa", what, sdpa_run(&c), MHA_ERR_VALUE, "scale");
        c.opt.scale_set = 0, c.opt.training = 1, c.opt.dropout_p = bad[i];
        snprintf(what, sizeof what, "dropout_p = %s", bad_names[i]);
        EXPECT_ERR("sdpa", what, sdpa_run(&c), MHA_ERR_VALUE, "dropout_p");
        sdpa_free(&c);
    }
    sdpa_case c;
    sdpa_make(&c, 1, 1, 1, 2, 3, 2, 2, MHA_KERNEL_REF);
    c.opt.dropout_p = 1.0f;
    EXPECT_ERR("sdpa", "dropout_p = 1", sdpa_run(&c), MHA_ERR_VALUE, "dropout_p");
    c.opt.dropout_p = -0.25f;
    EXPECT_ERR("sdpa", "dropout_p = -0.25", sdpa_run(&c), MHA_ERR_VALUE, "dropout_p");
    c.opt.dropout_p = 0.0f;
    c.opt.causal = (mha_causal)7;
    EXPECT_ERR("sdpa", "causal = 7 (unknown)", sdpa_run(&c), MHA_ERR_VALUE, "causal");
    c.opt.causal = MHA_CAUSAL_NONE;
    c.opt.masked_rows = (mha_masked_rows)5;
    EXPECT_ERR("sdpa", "masked_rows = 5 (unknown)", sdpa_run(&c), MHA_ERR_VALUE, "masked_rows");
    c.opt.masked_rows = MHA_MASKED_ROWS_ZERO;
    c.opt.kernel = (mha_kernel)9;
    EXPECT_ERR("sdpa", "kernel = 9 (unknown)", sdpa_run(&c), MHA_ERR_VALUE, "kernel");
    c.opt.kernel = MHA_KERNEL_REF;
    uint8_t mb[3] = {1, 1, 1};
    mha_tensor m;
    mha_tensor_init(&m, MHA_BOOL, mb, 1, (int64_t[]){3});
    c.opt.attn_mask = &m, c.opt.attn_mask_polarity = (mha_mask_polarity)3;
    EXPECT_ERR("sdpa", "mask_polarity = 3 (unknown)", sdpa_run(&c), MHA_ERR_VALUE, "attn_mask_polarity");
    sdpa_free(&c);
}

/* Logits of magnitude up to 1e4 (both signs): finite output, rows of the
 * weights sum to 1, and every kernel agrees with the reference. */
TEST(bad_input_logits_1e4_do_not_overflow) {
    static const float scales[] = {2500.0f, -2500.0f, 1e4f};
    for (int si = 0; si < 3; si++) {
        sdpa_case ref;
        sdpa_make(&ref, 2, 2, 2, 9, 11, 4, 5, MHA_KERNEL_REF);
        ref.opt.scale_set = 1, ref.opt.scale = scales[si];
        ref.opt.attn_weights = &ref.w;
        if (si == 2) /* |q.k| <= 1: logits up to 1e4 exactly */
            for (int64_t x = 0; x < 2 * 2 * 9 * 4; x++)
                ref.qd[x] = 0.5f * (float)((x % 3) - 1);
        if (si == 2)
            for (int64_t x = 0; x < 2 * 2 * 11 * 4; x++)
                ref.kd[x] = 0.5f * (float)((x % 5) - 2) / 2.0f;
        REQUIRE_OK(sdpa_run(&ref));
        float maxlogit = 0.0f;
        for (int64_t b = 0; b < 2; b++)
            for (int64_t h = 0; h < 2; h++)
                for (int64_t i = 0; i < 9; i++)
                    for (int64_t j = 0; j < 11; j++) {
                        float s = 0.0f;
                        for (int64_t x = 0; x < 4; x++)
                            s += ref.qd[((b * 2 + h) * 9 + i) * 4 + x] *
                                 ref.kd[((b * 2 + h) * 11 + j) * 4 + x];
                        s = fabsf(s * scales[si]);
                        maxlogit = s > maxlogit ? s : maxlogit;
                    }
        CHECK(maxlogit >= 5e3f);
        for (int kk = 0; kk < N_KERNELS; kk++) {
            if (!kernel_runs(kernels[kk]))
                continue;
            sdpa_case c;
            sdpa_make(&c, 2, 2, 2, 9, 11, 4, 5, kernels[kk]);
            memcpy(c.qd, ref.qd, sizeof(float) * 2 * 2 * 9 * 4);
            memcpy(c.kd, ref.kd, sizeof(float) * 2 * 2 * 11 * 4);
            c.opt = ref.opt, c.opt.kernel = kernels[kk], c.opt.attn_weights = &c.w;
            mha_status st = sdpa_run(&c);
            bool ok = all_finite(c.od, 2 * 2 * 9 * 5) && all_finite(c.wd, 2 * 2 * 9 * 11);
            for (int64_t r = 0; ok && r < 2 * 2 * 9; r++) {
                double sum = 0.0;
                for (int64_t j = 0; j < 11; j++)
                    sum += c.wd[r * 11 + j];
                ok = fabs(sum - 1.0) < 1e-5;
            }
            ok = ok && test_rel_err(c.od, ref.od, 2 * 2 * 9 * 5) < 1e-5;
            char what[96];
            snprintf(what, sizeof what, "logits up to %.0f (scale %g)", (double)maxlogit,
                     (double)scales[si]);
            EXPECT_OK(area_of(kernels[kk]), what, st, ok,
                      "output finite, weight rows sum to 1, agrees with ref to 1e-5");
            sdpa_free(&c);
        }
        sdpa_free(&ref);
    }
}

/* ---- fully masked rows ------------------------------------------------------------ */

TEST(bad_input_fully_masked_rows_zero_or_nan) {
    for (int kk = 0; kk < N_KERNELS; kk++) {
        if (!kernel_runs(kernels[kk]))
            continue;
        for (int policy = 0; policy < 2; policy++) {
            sdpa_case c;
            sdpa_make(&c, 2, 2, 1, 4, 5, 3, 3, kernels[kk]);
            uint8_t mb[4 * 5];
            for (int x = 0; x < 20; x++)
                mb[x] = x / 5 != 2; /* query row 2 keeps nothing */
            mha_tensor m;
            mha_tensor_init(&m, MHA_BOOL, mb, 2, (int64_t[]){4, 5});
            c.opt.attn_mask = &m;
            c.opt.attn_weights = &c.w;
            c.opt.masked_rows = policy ? MHA_MASKED_ROWS_NAN : MHA_MASKED_ROWS_ZERO;
            mha_status st = sdpa_run(&c);
            bool ok = true;
            for (int64_t b = 0; b < 2; b++)
                for (int64_t h = 0; h < 2; h++) {
                    float *o = out_row(&c, b, h, 2), *w = w_row(&c, b, h, 2);
                    ok = ok && (policy ? all_nan(o, 3) && all_nan(w, 5)
                                       : all_zero(o, 3) && all_zero(w, 5));
                    ok = ok && all_finite(out_row(&c, b, h, 1), 3);
                }
            EXPECT_OK(area_of(kernels[kk]),
                      policy ? "fully masked row, MHA_MASKED_ROWS_NAN"
                             : "fully masked row, default (MHA_MASKED_ROWS_ZERO)",
                      st, ok,
                      policy ? "output and weights of the row NaN (PyTorch MHA)"
                             : "output and weights of the row exactly 0; other rows finite");
            sdpa_free(&c);
        }
    }
}

/* ---- empty dimensions ----------------------------------------------------------- */

TEST(bad_input_empty_dimensions) {
    for (int kk = 0; kk < N_KERNELS; kk++) {
        if (!kernel_runs(kernels[kk]))
            continue;
        const char *area = area_of(kernels[kk]);
        sdpa_case c;
        sdpa_make(&c, 0, 2, 1, 3, 4, 2, 2, kernels[kk]);
        c.q.data = c.k.data = c.v.data = c.o.data = NULL; /* empty views need no data */
        EXPECT_OK(area, "B = 0 (data NULL)", sdpa_run(&c), true, "empty output, MHA_OK");
        sdpa_free(&c);
        sdpa_make(&c, 2, 2, 1, 0, 4, 2, 2, kernels[kk]);
        EXPECT_OK(area, "L = 0", sdpa_run(&c), true, "empty output, MHA_OK");
        sdpa_free(&c);
        for (int policy = 0; policy < 2; policy++) {
            sdpa_make(&c, 2, 2, 1, 3, 0, 2, 2, kernels[kk]);
            c.opt.masked_rows = policy ? MHA_MASKED_ROWS_NAN : MHA_MASKED_ROWS_ZERO;
            c.opt.attn_weights = &c.w;
            mha_status st = sdpa_run(&c);
            EXPECT_OK(area, policy ? "S = 0, MHA_MASKED_ROWS_NAN" : "S = 0", st,
                      policy ? all_nan(c.od, 12) : all_zero(c.od, 12),
                      policy ? "every row fully masked: NaN" : "every row fully masked: zeros");
            sdpa_free(&c);
        }
        sdpa_make(&c, 2, 2, 1, 3, 4, 2, 0, kernels[kk]);
        EXPECT_OK(area, "dv = 0", sdpa_run(&c), true, "empty output, MHA_OK");
        sdpa_free(&c);
    }
    sdpa_case c;
    sdpa_make(&c, 2, 2, 1, 3, 4, 0, 2, MHA_KERNEL_REF);
    EXPECT_ERR("sdpa", "d = 0", sdpa_run(&c), MHA_ERR_SHAPE, "head dim d is 0");
    sdpa_free(&c);
}

/* ---- shapes --------------------------------------------------------------------- */

TEST(bad_input_shapes_heads_masks_dtypes) {
    sdpa_case c;
    sdpa_make(&c, 2, 3, 2, 4, 5, 3, 3, MHA_KERNEL_REF);
    EXPECT_ERR("sdpa", "Hq = 3 not a multiple of Hkv = 2", sdpa_run(&c), MHA_ERR_SHAPE,
               "kv heads do not divide");
    sdpa_free(&c);

    sdpa_make(&c, 2, 4, 2, 4, 5, 3, 3, MHA_KERNEL_REF);
    mha_tensor bad = c.q;
    bad.ndim = 3;
    EXPECT_ERR("sdpa", "q of rank 3", mha_sdpa_forward(&c.o, &bad, &c.k, &c.v, NULL),
               MHA_ERR_SHAPE, "q:");
    bad = c.q, bad.dtype = MHA_BOOL;
    EXPECT_ERR("sdpa", "q of dtype bool", mha_sdpa_forward(&c.o, &bad, &c.k, &c.v, NULL),
               MHA_ERR_DTYPE, "q:");
    bad = c.k, bad.shape[0] = 1;
    EXPECT_ERR("sdpa", "k batch 1 vs q batch 2", mha_sdpa_forward(&c.o, &c.q, &bad, &c.v, NULL),
               MHA_ERR_SHAPE, "k:");
    bad = c.k, bad.shape[3] = 2;
    EXPECT_ERR("sdpa", "k head dim 2 vs q 3", mha_sdpa_forward(&c.o, &c.q, &bad, &c.v, NULL),
               MHA_ERR_SHAPE, "k:");
    bad = c.v, bad.shape[2] = 4;
    EXPECT_ERR("sdpa", "v length 4 vs k 5", mha_sdpa_forward(&c.o, &c.q, &c.k, &bad, NULL),
               MHA_ERR_SHAPE, "v:");
    bad = c.o, bad.shape[3] = 2;
    EXPECT_ERR("sdpa", "out of shape (2,4,4,2)", mha_sdpa_forward(&bad, &c.q, &c.k, &c.v, NULL),
               MHA_ERR_SHAPE, "out:");

    uint8_t mb[64] = {0};
    int64_t i64[64] = {0};
    mha_tensor m;
    mha_tensor_init(&m, MHA_BOOL, mb, 2, (int64_t[]){4, 6});
    c.opt.attn_mask = &m;
    EXPECT_ERR("sdpa", "mask (4,6) for S = 5", sdpa_run(&c), MHA_ERR_SHAPE, "mask:");
    mha_tensor_init(&m, MHA_BOOL, mb, 3, (int64_t[]){3, 4, 5});
    EXPECT_ERR("sdpa", "mask (3,4,5) for Hq = 4", sdpa_run(&c), MHA_ERR_SHAPE, "mask:");
    mha_tensor_init(&m, MHA_BOOL, mb, 0, NULL);
    EXPECT_ERR("sdpa", "mask of rank 0", sdpa_run(&c), MHA_ERR_SHAPE, "mask:");
    mha_tensor_init(&m, MHA_I64, i64, 2, (int64_t[]){4, 5});
    EXPECT_ERR("sdpa", "mask of dtype int64", sdpa_run(&c), MHA_ERR_DTYPE, "mask:");
    mha_tensor_init(&m, MHA_F16, mb, 2, (int64_t[]){4, 5});
    EXPECT_ERR("sdpa", "mask of dtype float16", sdpa_run(&c), MHA_ERR_DTYPE, "mask:");
    c.opt.attn_mask = NULL;
    c.opt.key_padding_mask = &m;
    mha_tensor_init(&m, MHA_BOOL, mb, 2, (int64_t[]){2, 6});
    EXPECT_ERR("sdpa", "key_padding_mask (2,6) for S = 5", sdpa_run(&c), MHA_ERR_SHAPE,
               "key_padding_mask:");
    mha_tensor_init(&m, MHA_BOOL, mb, 1, (int64_t[]){5});
    EXPECT_ERR("sdpa", "key_padding_mask (5): rank 1", sdpa_run(&c), MHA_ERR_SHAPE,
               "key_padding_mask:");
    mha_tensor_init(&m, MHA_I64, i64, 2, (int64_t[]){2, 5});
    EXPECT_ERR("sdpa", "key_padding_mask of dtype int64", sdpa_run(&c), MHA_ERR_DTYPE,
               "key_padding_mask:");
    c.opt.key_padding_mask = NULL;
    bad = c.w, bad.shape[3] = 4;
    c.opt.attn_weights = &bad;
    EXPECT_ERR("sdpa", "weights (2,4,4,4) for S = 5", sdpa_run(&c), MHA_ERR_SHAPE, "weights:");
    bad = c.w, bad.dtype = MHA_BOOL;
    EXPECT_ERR("sdpa", "weights of dtype bool", sdpa_run(&c), MHA_ERR_DTYPE, "weights:");
    sdpa_free(&c);
}

/* ---- overflow ---------------------------------------------------------------- */

TEST(bad_input_overflowing_sizes_and_strides) {
    mha_tensor t;
    const int64_t big = (int64_t)1 << 40;
    EXPECT_ERR("tensor", "mha_tensor_init shape (2^40,2^40)",
               mha_tensor_init(&t, MHA_F32, NULL, 2, (int64_t[]){big, big}), MHA_ERR_OVERFLOW,
               "element count overflows");
    EXPECT_ERR("tensor", "mha_tensor_init shape (2^62) float32 (bytes overflow)",
               mha_tensor_init(&t, MHA_F32, NULL, 1, (int64_t[]){(int64_t)1 << 62}),
               MHA_ERR_OVERFLOW, "byte count overflows");
    EXPECT_ERR("tensor", "mha_tensor_create shape (2^40,2^40)",
               mha_tensor_create(&t, MHA_F32, 2, (int64_t[]){big, big}), MHA_ERR_OVERFLOW,
               "overflows");
    EXPECT_ERR("tensor", "mha_tensor_init negative size",
               mha_tensor_init(&t, MHA_F32, NULL, 2, (int64_t[]){3, -1}), MHA_ERR_SHAPE,
               "negative size");
    EXPECT_ERR("tensor", "mha_tensor_init 5 dimensions",
               mha_tensor_init(&t, MHA_F32, NULL, 5, (int64_t[]){1, 1, 1, 1, 1}), MHA_ERR_SHAPE,
               "dimensions");
    EXPECT_ERR("tensor", "mha_tensor_init unknown dtype 17",
               mha_tensor_init(&t, (mha_dtype)17, NULL, 1, (int64_t[]){1}), MHA_ERR_DTYPE,
               "dtype");
    mha_tensor_init(&t, MHA_F32, NULL, 2, (int64_t[]){2, 2});
    t.shape[0] = t.shape[1] = big;
    int64_t n;
    EXPECT_ERR("tensor", "mha_tensor_numel of a (2^40,2^40) view", mha_tensor_numel(&t, &n),
               MHA_ERR_OVERFLOW, "element count overflows");

    sdpa_case c;
    sdpa_make(&c, 2, 2, 1, 3, 4, 2, 2, MHA_KERNEL_REF);
    mha_tensor bad = c.q;
    bad.stride[0] = INT64_MAX / 2;
    EXPECT_ERR("sdpa", "q with stride 2^62 on a dim of size 2",
               mha_sdpa_forward(&c.o, &bad, &c.k, &c.v, NULL), MHA_ERR_OVERFLOW, "q: ");
    bad = c.k, bad.stride[2] = INT64_MAX / 4;
    EXPECT_ERR("sdpa", "k with stride 2^61 on a dim of size 4",
               mha_sdpa_forward(&c.o, &c.q, &bad, &c.v, NULL), MHA_ERR_OVERFLOW, "k: ");
    bad = c.v, bad.stride[1] = -3;
    EXPECT_ERR("sdpa", "v with a negative stride", mha_sdpa_forward(&c.o, &c.q, &c.k, &bad, NULL),
               MHA_ERR_SHAPE, "v: negative stride");
    /* broadcast (stride 0) inputs of astronomic shape: no memory behind them */
    mha_tensor hq = c.q, hk = c.k, hv = c.v, ho = c.o;
    hq.shape[0] = hk.shape[0] = hv.shape[0] = ho.shape[0] = (int64_t)1 << 62;
    hq.stride[0] = hk.stride[0] = hv.stride[0] = 0;
    EXPECT_ERR("sdpa", "B = 2^62 with broadcast inputs, out of stride 0 on B",
               (ho.stride[0] = 0, mha_sdpa_forward(&ho, &hq, &hk, &hv, NULL)), MHA_ERR_ALIAS,
               "out:");
    ho.stride[0] = 12;
    EXPECT_ERR("sdpa", "B = 2^62 with broadcast inputs, out (2^62,2,3,2)",
               mha_sdpa_forward(&ho, &hq, &hk, &hv, NULL), MHA_ERR_OVERFLOW, "out:");
    sdpa_free(&c);
}

/* ---- aliasing --------------------------------------------------------------------- */

TEST(bad_input_output_overlapping_input) {
    sdpa_case c;
    sdpa_make(&c, 1, 2, 2, 3, 3, 2, 2, MHA_KERNEL_REF);
    EXPECT_ERR("sdpa", "out is q (same buffer)", mha_sdpa_forward(&c.q, &c.q, &c.k, &c.v, NULL),
               MHA_ERR_ALIAS, "out:");
    mha_tensor o = c.o;
    o.data = c.vd + 3;
    EXPECT_ERR("sdpa", "out overlaps v partly", mha_sdpa_forward(&o, &c.q, &c.k, &c.v, NULL),
               MHA_ERR_ALIAS, "out:");
    o = c.o, o.data = c.kd;
    EXPECT_ERR("sdpa", "out is k", mha_sdpa_forward(&o, &c.q, &c.k, &c.v, NULL), MHA_ERR_ALIAS,
               "out:");
    mha_tensor w = c.w;
    w.data = c.od;
    c.opt.attn_weights = &w;
    EXPECT_ERR("sdpa", "weights overlap out", sdpa_run(&c), MHA_ERR_ALIAS, "weights:");
    w.data = c.qd + 1;
    EXPECT_ERR("sdpa", "weights overlap q", sdpa_run(&c), MHA_ERR_ALIAS, "weights:");
    float mf[2 * 2 * 3 * 3];
    mha_tensor m;
    mha_tensor_init(&m, MHA_F32, mf, 4, (int64_t[]){1, 2, 3, 3});
    memset(mf, 0, sizeof mf);
    c.opt.attn_mask = &m;
    c.opt.attn_weights = NULL;
    o = c.o, o.data = mf;
    EXPECT_ERR("sdpa", "out overlaps mask", mha_sdpa_forward(&o, &c.q, &c.k, &c.v, &c.opt),
               MHA_ERR_ALIAS, "out:");
    w = c.w, w.data = mf;
    c.opt.attn_weights = &w;
    EXPECT_ERR("sdpa", "weights overlap mask", sdpa_run(&c), MHA_ERR_ALIAS, "weights:");
    c.opt.attn_mask = NULL;
    w = c.w, w.stride[2] = 0;
    c.opt.attn_weights = &w;
    EXPECT_ERR("sdpa", "weights with stride 0 on L (a broadcast view)", sdpa_run(&c),
               MHA_ERR_ALIAS, "weights:");
    c.opt.attn_weights = NULL;
    o = c.o, o.stride[1] = 0;
    EXPECT_ERR("sdpa", "out with stride 0 on H (a broadcast view)",
               mha_sdpa_forward(&o, &c.q, &c.k, &c.v, NULL), MHA_ERR_ALIAS, "out:");
    o = c.o, o.stride[3] = 1, o.stride[2] = 1;
    EXPECT_ERR("sdpa", "out whose rows overlap each other (strides (..,1,1))",
               mha_sdpa_forward(&o, &c.q, &c.k, &c.v, NULL), MHA_ERR_ALIAS, "out:");
    sdpa_free(&c);
}

/* ---- NULL pointers ---------------------------------------------------------------- */

TEST(bad_input_null_pointers_sdpa_tensor_files) {
    sdpa_case c;
    sdpa_make(&c, 1, 2, 2, 3, 3, 2, 2, MHA_KERNEL_REF);
    EXPECT_ERR("sdpa", "out NULL", mha_sdpa_forward(NULL, &c.q, &c.k, &c.v, NULL), MHA_ERR_NULL,
               "out");
    EXPECT_ERR("sdpa", "q NULL", mha_sdpa_forward(&c.o, NULL, &c.k, &c.v, NULL), MHA_ERR_NULL,
               "q");
    EXPECT_ERR("sdpa", "k NULL", mha_sdpa_forward(&c.o, &c.q, NULL, &c.v, NULL), MHA_ERR_NULL,
               "k");
    EXPECT_ERR("sdpa", "v NULL", mha_sdpa_forward(&c.o, &c.q, &c.k, NULL, NULL), MHA_ERR_NULL,
               "v");
    EXPECT_OK("sdpa", "opt NULL", mha_sdpa_forward(&c.o, &c.q, &c.k, &c.v, NULL), true,
              "the defaults of mha_sdpa_options_init");
    mha_tensor bad = c.q;
    bad.data = NULL;
    EXPECT_ERR("sdpa", "q.data NULL", mha_sdpa_forward(&c.o, &bad, &c.k, &c.v, NULL),
               MHA_ERR_NULL, "q: NULL data");
    bad = c.o, bad.data = NULL;
    EXPECT_ERR("sdpa", "out.data NULL", mha_sdpa_forward(&bad, &c.q, &c.k, &c.v, NULL),
               MHA_ERR_NULL, "out: NULL data");
    mha_tensor m;
    mha_tensor_init(&m, MHA_BOOL, NULL, 2, (int64_t[]){3, 3});
    c.opt.attn_mask = &m;
    EXPECT_ERR("sdpa", "mask.data NULL", sdpa_run(&c), MHA_ERR_NULL, "mask: NULL data");
    c.opt.attn_mask = NULL;
    mha_tensor_init(&m, MHA_BOOL, NULL, 2, (int64_t[]){1, 3});
    c.opt.key_padding_mask = &m;
    EXPECT_ERR("sdpa", "key_padding_mask.data NULL", sdpa_run(&c), MHA_ERR_NULL,
               "key_padding_mask: NULL data");
    c.opt.key_padding_mask = NULL;
    bad = c.w, bad.data = NULL;
    c.opt.attn_weights = &bad;
    EXPECT_ERR("sdpa", "weights.data NULL", sdpa_run(&c), MHA_ERR_NULL, "weights: NULL data");
    sdpa_free(&c);
    mha_sdpa_options_init(NULL); /* harmless */

    mha_tensor t;
    int64_t n;
    EXPECT_ERR("tensor", "mha_tensor_init(NULL, ...)",
               mha_tensor_init(NULL, MHA_F32, NULL, 1, (int64_t[]){1}), MHA_ERR_NULL, "NULL view");
    EXPECT_ERR("tensor", "mha_tensor_init shape NULL", mha_tensor_init(&t, MHA_F32, NULL, 2, NULL),
               MHA_ERR_NULL, "NULL shape");
    EXPECT_ERR("tensor", "mha_tensor_create(NULL, ...)",
               mha_tensor_create(NULL, MHA_F32, 1, (int64_t[]){1}), MHA_ERR_NULL, "NULL view");
    EXPECT_ERR("tensor", "mha_tensor_create shape NULL", mha_tensor_create(&t, MHA_F32, 2, NULL),
               MHA_ERR_NULL, "NULL shape");
    EXPECT_ERR("tensor", "mha_tensor_numel(NULL, &n)", mha_tensor_numel(NULL, &n), MHA_ERR_NULL,
               "NULL");
    mha_tensor_init(&t, MHA_F32, NULL, 1, (int64_t[]){1});
    EXPECT_ERR("tensor", "mha_tensor_numel(&t, NULL)", mha_tensor_numel(&t, NULL), MHA_ERR_NULL,
               "NULL");
    mha_tensor_free(NULL);
    CHECK(mha_last_error() != NULL);
    CHECK(mha_status_string((mha_status)99) != NULL);
    CHECK(mha_kernel_name((mha_kernel)99) != NULL);

    char path[512];
    snprintf(path, sizeof path, "%s/io/np_f4_3x5.npy", test_fixture_root());
    mha_dtype fd;
    EXPECT_ERR("npy", "mha_npy_load(NULL path)", mha_npy_load(&t, NULL, MHA_F32), MHA_ERR_NULL,
               NULL);
    EXPECT_ERR("npy", "mha_npy_load(NULL out, path, want)", mha_npy_load(NULL, path, MHA_F32),
               MHA_ERR_NULL, NULL);
    EXPECT_ERR("npy", "mha_npy_load_any(NULL path)", mha_npy_load_any(&t, &fd, NULL, 0),
               MHA_ERR_NULL, NULL);
    EXPECT_ERR("npy", "mha_npy_load_any(NULL out, fd, path, 0)",
               mha_npy_load_any(NULL, &fd, path, 0),
               MHA_ERR_NULL, NULL);
    mha_tensor_init(&t, MHA_F32, (float[4]){0}, 1, (int64_t[]){4});
    EXPECT_ERR("npy", "mha_npy_save(NULL path)", mha_npy_save(&t, NULL, MHA_F32), MHA_ERR_NULL,
               NULL);
    EXPECT_ERR("npy", "mha_npy_save(NULL tensor, path, as)",
               mha_npy_save(NULL, "/tmp/x.npy", MHA_F32),
               MHA_ERR_NULL, NULL);
    mha_tensor nodata = t;
    nodata.data = NULL;
    EXPECT_ERR("npy", "mha_npy_save of a tensor with data NULL",
               mha_npy_save(&nodata, "/tmp/mha-bad-input.npy", MHA_F32), MHA_ERR_NULL, NULL);
    remove("/tmp/mha-bad-input.npy");

    mha_safetensors *st = NULL;
    EXPECT_ERR("safetensors", "mha_safetensors_open(NULL path)", mha_safetensors_open(&st, NULL),
               MHA_ERR_NULL, NULL);
    snprintf(path, sizeof path, "%s/io/st_dtypes.safetensors", test_fixture_root());
    EXPECT_ERR("safetensors", "mha_safetensors_open(NULL, path)", mha_safetensors_open(NULL, path),
               MHA_ERR_NULL, NULL);
    mha_safetensors_free(NULL);
    CHECK(mha_safetensors_count(NULL) == 0);
    CHECK(mha_safetensors_find(NULL, "x") == -1);
    CHECK(mha_safetensors_metadata_count(NULL) == 0);
    CHECK(mha_safetensors_metadata(NULL, "format") == NULL);
    EXPECT_ERR("safetensors", "mha_safetensors_get_f32(NULL st)",
               mha_safetensors_get_f32(NULL, "f32", &t), MHA_ERR_NULL, NULL);
    EXPECT_ERR("safetensors", "mha_safetensors_info(NULL st)",
               mha_safetensors_info(NULL, 0, NULL, NULL, NULL), MHA_ERR_NULL, NULL);
    if (mha_safetensors_open(&st, path) == MHA_OK) {
        EXPECT_ERR("safetensors", "mha_safetensors_get_f32(st, NULL name)",
                   mha_safetensors_get_f32(st, NULL, &t), MHA_ERR_NULL, NULL);
        EXPECT_ERR("safetensors", "mha_safetensors_get_f32(st, name, NULL out)",
                   mha_safetensors_get_f32(st, "f32", NULL), MHA_ERR_NULL, NULL);
        EXPECT_ERR("safetensors", "mha_safetensors_view_f32(st, NULL name)",
                   mha_safetensors_view_f32(st, NULL, &t), MHA_ERR_NULL, NULL);
        EXPECT_ERR("safetensors", "mha_safetensors_view_f32(st, name, NULL view)",
                   mha_safetensors_view_f32(st, "f32", NULL), MHA_ERR_NULL, NULL);
        CHECK(mha_safetensors_find(st, NULL) == -1);
        CHECK(mha_safetensors_name(st, -1) == NULL);
        CHECK(mha_safetensors_name(st, 1 << 20) == NULL);
        CHECK(mha_safetensors_metadata(st, NULL) == NULL);
        CHECK(mha_safetensors_metadata_key(st, -1) == NULL);
        EXPECT_ERR("safetensors", "mha_safetensors_info(st, -1)",
                   mha_safetensors_info(st, -1, NULL, NULL, NULL), MHA_ERR_VALUE, NULL);
        mha_safetensors_free(st);
    }
    const char *names[] = {"a"};
    const mha_tensor *ts[] = {&t};
    EXPECT_ERR("safetensors", "mha_safetensors_write(NULL path)",
               mha_safetensors_write(NULL, names, ts, 1, NULL, NULL, 0), MHA_ERR_NULL, NULL);
    EXPECT_ERR("safetensors", "mha_safetensors_write(names NULL)",
               mha_safetensors_write("/tmp/mha-bad-input.st", NULL, ts, 1, NULL, NULL, 0),
               MHA_ERR_NULL, NULL);
    EXPECT_ERR("safetensors", "mha_safetensors_write(tensors NULL)",
               mha_safetensors_write("/tmp/mha-bad-input.st", names, NULL, 1, NULL, NULL, 0),
               MHA_ERR_NULL, NULL);
    const mha_tensor *nts[] = {NULL};
    EXPECT_ERR("safetensors", "mha_safetensors_write(tensors[0] NULL)",
               mha_safetensors_write("/tmp/mha-bad-input.st", names, nts, 1, NULL, NULL, 0),
               MHA_ERR_NULL, NULL);
    EXPECT_ERR("safetensors", "mha_safetensors_write(1 metadata pair, keys NULL)",
               mha_safetensors_write("/tmp/mha-bad-input.st", names, ts, 1, NULL, NULL, 1),
               MHA_ERR_NULL, NULL);
    CHECK(access("/tmp/mha-bad-input.st", F_OK) != 0);
    remove("/tmp/mha-bad-input.st");
}

/* ---- multi-head attention ------------------------------------------------------- */

typedef struct mh_case {
    float x[2 * 4 * 6], kx[2 * 5 * 6], o[2 * 4 * 6], w_in[18 * 6], b_in[18], w_out[36], b_out[6];
    float wts[2 * 2 * 4 * 5];
    mha_tensor X, K, O, W_in, B_in, W_out, B_out, Wts;
    mha_multihead_weights w;
    mha_multihead_options opt;
} mh_case;

/* E=6 H=2 B=2 L=4 S=5, packed weights. */
static void mh_make(mh_case *c) {
    memset(c, 0, sizeof *c);
    test_randn(c->x, 48, 21), test_randn(c->kx, 60, 22), test_randn(c->w_in, 108, 23);
    test_randn(c->b_in, 18, 24), test_randn(c->w_out, 36, 25), test_randn(c->b_out, 6, 26);
    mha_tensor_init(&c->X, MHA_F32, c->x, 3, (int64_t[]){2, 4, 6});
    mha_tensor_init(&c->K, MHA_F32, c->kx, 3, (int64_t[]){2, 5, 6});
    mha_tensor_init(&c->O, MHA_F32, c->o, 3, (int64_t[]){2, 4, 6});
    mha_tensor_init(&c->W_in, MHA_F32, c->w_in, 2, (int64_t[]){18, 6});
    mha_tensor_init(&c->B_in, MHA_F32, c->b_in, 1, (int64_t[]){18});
    mha_tensor_init(&c->W_out, MHA_F32, c->w_out, 2, (int64_t[]){6, 6});
    mha_tensor_init(&c->B_out, MHA_F32, c->b_out, 1, (int64_t[]){6});
    mha_tensor_init(&c->Wts, MHA_F32, c->wts, 3, (int64_t[]){2, 4, 5});
    c->w.in_proj_weight = &c->W_in, c->w.in_proj_bias = &c->B_in;
    c->w.out_proj_weight = &c->W_out, c->w.out_proj_bias = &c->B_out;
    mha_multihead_options_init(&c->opt);
    c->opt.num_heads = 2;
}

static mha_status mh_run(mh_case *c) {
    return mha_multihead_forward(&c->O, &c->X, &c->K, &c->K, &c->w, &c->opt);
}

TEST(bad_input_multihead) {
    mh_case c;
    mh_make(&c);
    REQUIRE_OK(mh_run(&c));
    c.opt.num_heads = 4;
    EXPECT_ERR("multihead", "num_heads = 4 does not divide E = 6", mh_run(&c), MHA_ERR_SHAPE,
               "num_heads");
    c.opt.num_heads = 0;
    EXPECT_ERR("multihead", "num_heads = 0", mh_run(&c), MHA_ERR_VALUE, "num_heads");
    c.opt.num_heads = -2;
    EXPECT_ERR("multihead", "num_heads = -2", mh_run(&c), MHA_ERR_VALUE, "num_heads");
    c.opt.num_heads = 2;
    c.opt.dropout_p = NAN, c.opt.training = 1;
    EXPECT_ERR("multihead", "dropout_p = NaN", mh_run(&c), MHA_ERR_VALUE, "dropout_p");
    c.opt.dropout_p = INFINITY;
    EXPECT_ERR("multihead", "dropout_p = +Inf", mh_run(&c), MHA_ERR_VALUE, "dropout_p");
    c.opt.dropout_p = 0.0f, c.opt.training = 0;

    /* masks */
    uint8_t mb[64] = {0};
    int64_t i64[64] = {0};
    mha_tensor m;
    mha_tensor_init(&m, MHA_BOOL, mb, 1, (int64_t[]){5});
    c.opt.attn_mask = &m;
    EXPECT_ERR("multihead", "attn_mask of rank 1", mh_run(&c), MHA_ERR_SHAPE, "attn_mask");
    mha_tensor_init(&m, MHA_BOOL, mb, 2, (int64_t[]){4, 6});
    EXPECT_ERR("multihead", "attn_mask (4,6) for S = 5", mh_run(&c), MHA_ERR_SHAPE, "attn_mask");
    mha_tensor_init(&m, MHA_BOOL, mb, 3, (int64_t[]){2, 4, 5});
    EXPECT_ERR("multihead", "attn_mask (2,4,5), want (B*H,L,S) = (4,4,5)", mh_run(&c),
               MHA_ERR_SHAPE, "attn_mask");
    mha_tensor_init(&m, MHA_I64, i64, 2, (int64_t[]){4, 5});
    EXPECT_ERR("multihead", "attn_mask of dtype int64", mh_run(&c), MHA_ERR_DTYPE, "attn_mask");
    mha_tensor_init(&m, MHA_BOOL, NULL, 2, (int64_t[]){4, 5});
    EXPECT_ERR("multihead", "attn_mask.data NULL", mh_run(&c), MHA_ERR_NULL, "attn_mask");
    c.opt.attn_mask = NULL;
    c.opt.key_padding_mask = &m;
    mha_tensor_init(&m, MHA_BOOL, mb, 2, (int64_t[]){2, 4});
    EXPECT_ERR("multihead", "key_padding_mask (2,4) for S = 5", mh_run(&c), MHA_ERR_SHAPE,
               "key_padding_mask");
    mha_tensor_init(&m, MHA_F16, mb, 2, (int64_t[]){2, 5});
    EXPECT_ERR("multihead", "key_padding_mask of dtype float16", mh_run(&c), MHA_ERR_DTYPE,
               "key_padding_mask");
    c.opt.key_padding_mask = NULL;

    /* fully masked rows: batch 1 masks every key */
    for (int x = 0; x < 10; x++)
        mb[x] = x >= 5;
    mha_tensor_init(&m, MHA_BOOL, mb, 2, (int64_t[]){2, 5});
    c.opt.key_padding_mask = &m;
    c.opt.attn_weights = &c.Wts;
    mha_status st = mh_run(&c);
    bool ok = all_finite(c.o, 24) && all_zero(c.wts + 20, 20);
    for (int i = 0; i < 4; i++)
        ok = ok && !memcmp(c.o + 24 + i * 6, c.b_out, sizeof c.b_out);
    EXPECT_OK("multihead", "key_padding_mask masks every key of batch 1", st, ok,
              "batch 1: weights 0, output = out_proj_bias (attention rows 0)");
    c.opt.masked_rows = MHA_MASKED_ROWS_NAN;
    EXPECT_OK("multihead", "same, MHA_MASKED_ROWS_NAN", mh_run(&c),
              all_nan(c.o + 24, 24) && all_nan(c.wts + 20, 20) && all_finite(c.o, 24),
              "batch 1 output and weights NaN (PyTorch), batch 0 finite");
    c.opt.masked_rows = MHA_MASKED_ROWS_ZERO;
    c.opt.key_padding_mask = NULL, c.opt.attn_weights = NULL;

    /* empty dimensions */
    mha_tensor X0 = c.X, K0 = c.K, O0 = c.O;
    X0.shape[0] = K0.shape[0] = O0.shape[0] = 0;
    EXPECT_OK("multihead", "B = 0", mha_multihead_forward(&O0, &X0, &K0, &K0, &c.w, &c.opt), true,
              "empty output, MHA_OK");
    X0 = c.X, O0 = c.O, X0.shape[1] = O0.shape[1] = 0;
    EXPECT_OK("multihead", "L = 0", mha_multihead_forward(&O0, &X0, &c.K, &c.K, &c.w, &c.opt),
              true, "empty output, MHA_OK");
    K0 = c.K, K0.shape[1] = 0;
    st = mha_multihead_forward(&c.O, &c.X, &K0, &K0, &c.w, &c.opt);
    ok = true;
    for (int i = 0; i < 8; i++)
        ok = ok && !memcmp(c.o + i * 6, c.b_out, sizeof c.b_out);
    EXPECT_OK("multihead", "S = 0", st, ok,
              "every row fully masked: attention 0, output = out_proj_bias");
    mha_tensor X3 = c.X, O3 = c.O, W3 = c.W_in, Wo3 = c.W_out;
    X3.shape[2] = O3.shape[2] = 0, W3.shape[0] = 0, W3.shape[1] = 0, Wo3.shape[0] = 0,
    Wo3.shape[1] = 0;
    mha_multihead_weights w0 = {0};
    w0.in_proj_weight = &W3, w0.out_proj_weight = &Wo3;
    EXPECT_ERR("multihead", "E = 0", mha_multihead_forward(&O3, &X3, &X3, &X3, &w0, &c.opt),
               MHA_ERR_SHAPE, "embed_dim");

    /* shapes */
    mha_tensor bad = c.K;
    bad.shape[0] = 1;
    EXPECT_ERR("multihead", "key batch 1 vs query batch 2",
               mha_multihead_forward(&c.O, &c.X, &bad, &bad, &c.w, &c.opt), MHA_ERR_SHAPE, "key");
    bad = c.K, bad.ndim = 2;
    EXPECT_ERR("multihead", "unbatched key with batched query",
               mha_multihead_forward(&c.O, &c.X, &bad, &bad, &c.w, &c.opt), MHA_ERR_SHAPE, "key");
    bad = c.W_in, bad.shape[0] = 17;
    c.w.in_proj_weight = &bad;
    EXPECT_ERR("multihead", "in_proj_weight (17,6)", mh_run(&c), MHA_ERR_SHAPE, "in_proj_weight");
    c.w.in_proj_weight = &c.W_in;
    bad = c.B_in, bad.shape[0] = 6;
    c.w.in_proj_bias = &bad;
    EXPECT_ERR("multihead", "in_proj_bias (6)", mh_run(&c), MHA_ERR_SHAPE, "in_proj_bias");
    c.w.in_proj_bias = &c.B_in;
    c.w.bias_k = &c.B_out;
    EXPECT_ERR("multihead", "bias_k without bias_v", mh_run(&c), MHA_ERR_NULL, "bias_k");
    c.w.bias_k = NULL;
    bad = c.O, bad.shape[2] = 5;
    EXPECT_ERR("multihead", "out (2,4,5)",
               mha_multihead_forward(&bad, &c.X, &c.K, &c.K, &c.w, &c.opt), MHA_ERR_SHAPE, "out");
    bad = c.Wts, bad.shape[2] = 4;
    c.opt.attn_weights = &bad;
    EXPECT_ERR("multihead", "weights (2,4,4) for S = 5", mh_run(&c), MHA_ERR_SHAPE, "weights");
    c.opt.attn_weights = NULL;

    /* overflow: broadcast query of batch 2^62 */
    mha_tensor hx = c.X, hk = c.K, ho = c.O;
    hx.shape[0] = hk.shape[0] = ho.shape[0] = (int64_t)1 << 62;
    hx.stride[0] = hk.stride[0] = 0;
    EXPECT_ERR("multihead", "B = 2^62 with broadcast inputs, out of stride 0 on B",
               (ho.stride[0] = 0, mha_multihead_forward(&ho, &hx, &hk, &hk, &c.w, &c.opt)),
               MHA_ERR_ALIAS, "out");
    ho.stride[0] = 24;
    EXPECT_ERR("multihead", "B = 2^62 with broadcast inputs, out (2^62,4,6)",
               mha_multihead_forward(&ho, &hx, &hk, &hk, &c.w, &c.opt), MHA_ERR_OVERFLOW, "out");

    /* aliasing */
    EXPECT_ERR("multihead", "out is query",
               mha_multihead_forward(&c.X, &c.X, &c.K, &c.K, &c.w, &c.opt), MHA_ERR_ALIAS, "out");
    bad = c.O, bad.data = c.w_in + 6;
    EXPECT_ERR("multihead", "out overlaps in_proj_weight",
               mha_multihead_forward(&bad, &c.X, &c.K, &c.K, &c.w, &c.opt), MHA_ERR_ALIAS, "out");
    bad = c.Wts, bad.data = c.o;
    c.opt.attn_weights = &bad;
    EXPECT_ERR("multihead", "weights overlap out", mh_run(&c), MHA_ERR_ALIAS, "weights");
    bad.data = c.kx;
    EXPECT_ERR("multihead", "weights overlap key", mh_run(&c), MHA_ERR_ALIAS, "weights");
    c.opt.attn_weights = NULL;

    /* NULL pointers */
    EXPECT_ERR("multihead", "out NULL", mha_multihead_forward(NULL, &c.X, &c.K, &c.K, &c.w, &c.opt),
               MHA_ERR_NULL, "out");
    EXPECT_ERR("multihead", "query NULL",
               mha_multihead_forward(&c.O, NULL, &c.K, &c.K, &c.w, &c.opt), MHA_ERR_NULL, "query");
    EXPECT_ERR("multihead", "key NULL", mha_multihead_forward(&c.O, &c.X, NULL, &c.K, &c.w, &c.opt),
               MHA_ERR_NULL, "key");
    EXPECT_ERR("multihead", "value NULL",
               mha_multihead_forward(&c.O, &c.X, &c.K, NULL, &c.w, &c.opt), MHA_ERR_NULL, "value");
    EXPECT_ERR("multihead", "weights struct NULL",
               mha_multihead_forward(&c.O, &c.X, &c.K, &c.K, NULL, &c.opt), MHA_ERR_NULL, "w:");
    /* NULL options are the defaults (0.2.0), whose num_heads 0 is refused */
    EXPECT_ERR("multihead", "options NULL",
               mha_multihead_forward(&c.O, &c.X, &c.K, &c.K, &c.w, NULL), MHA_ERR_VALUE,
               "num_heads");
    c.w.in_proj_weight = NULL;
    EXPECT_ERR("multihead", "in_proj_weight NULL and no q/k/v_proj_weight", mh_run(&c),
               MHA_ERR_NULL, "in_proj_weight");
    c.w.in_proj_weight = &c.W_in;
    c.w.out_proj_weight = NULL;
    EXPECT_ERR("multihead", "out_proj_weight NULL", mh_run(&c), MHA_ERR_NULL, "out_proj_weight");
    c.w.out_proj_weight = &c.W_out;
    bad = c.X, bad.data = NULL;
    EXPECT_ERR("multihead", "query.data NULL",
               mha_multihead_forward(&c.O, &bad, &c.K, &c.K, &c.w, &c.opt), MHA_ERR_NULL, "query");
    bad = c.W_out, bad.data = NULL;
    c.w.out_proj_weight = &bad;
    EXPECT_ERR("multihead", "out_proj_weight.data NULL", mh_run(&c), MHA_ERR_NULL,
               "out_proj_weight");
    c.w.out_proj_weight = &c.W_out;
    mha_multihead_options_init(NULL);
    CHECK(mh_run(&c) == MHA_OK);
}

/* ---- layers ------------------------------------------------------------------------ */

TEST(bad_input_layers) {
    float x[3 * 4], y[3 * 4], w[5 * 4], b[5], o[3 * 5];
    test_randn(x, 12, 31), test_randn(y, 12, 34), test_randn(w, 20, 32), test_randn(b, 5, 33);
    mha_tensor X, Y, W, Bv, O;
    mha_tensor_init(&X, MHA_F32, x, 2, (int64_t[]){3, 4});
    mha_tensor_init(&Y, MHA_F32, y, 2, (int64_t[]){3, 4});
    mha_tensor_init(&W, MHA_F32, w, 2, (int64_t[]){5, 4});
    mha_tensor_init(&Bv, MHA_F32, b, 1, (int64_t[]){5});
    mha_tensor_init(&O, MHA_F32, o, 2, (int64_t[]){3, 5});
    REQUIRE_OK(mha_linear_forward(&O, &X, &W, &Bv));
    EXPECT_ERR("layers", "linear: out NULL", mha_linear_forward(NULL, &X, &W, &Bv), MHA_ERR_NULL,
               "out");
    EXPECT_ERR("layers", "linear: x NULL", mha_linear_forward(&O, NULL, &W, &Bv), MHA_ERR_NULL,
               "x");
    EXPECT_ERR("layers", "linear: weight NULL", mha_linear_forward(&O, &X, NULL, &Bv),
               MHA_ERR_NULL, "weight");
    mha_tensor bad = O;
    bad.data = x;
    EXPECT_ERR("layers", "linear: out overlaps x", mha_linear_forward(&bad, &X, &W, &Bv),
               MHA_ERR_ALIAS, "out");
    bad = Bv, bad.shape[0] = 4;
    EXPECT_ERR("layers", "linear: bias (4) for 5 outputs", mha_linear_forward(&O, &X, &W, &bad),
               MHA_ERR_SHAPE, "bias");

    mha_tensor g;
    mha_tensor_init(&g, MHA_F32, w, 1, (int64_t[]){4});
    EXPECT_ERR("layers", "layernorm: eps = NaN", mha_layernorm_forward(&Y, &X, &g, NULL, NAN),
               MHA_ERR_VALUE, "eps");
    EXPECT_ERR("layers", "layernorm: eps = 0", mha_layernorm_forward(&Y, &X, &g, NULL, 0.0f),
               MHA_ERR_VALUE, "eps");
    EXPECT_ERR("layers", "rmsnorm: eps = +Inf", mha_rmsnorm_forward(&Y, &X, &g, INFINITY),
               MHA_ERR_VALUE, "eps");
    EXPECT_ERR("layers", "layernorm: x NULL", mha_layernorm_forward(&Y, NULL, &g, NULL, 1e-5f),
               MHA_ERR_NULL, "x");
    EXPECT_ERR("layers", "layernorm: out NULL", mha_layernorm_forward(NULL, &X, &g, NULL, 1e-5f),
               MHA_ERR_NULL, "out");
    EXPECT_OK("layers", "layernorm: out is x (in place)",
              mha_layernorm_forward(&Y, &Y, &g, NULL, 1e-5f), true, "allowed");
    bad = Y, bad.data = y + 1, bad.shape[0] = 2;
    mha_tensor Y2 = Y;
    Y2.shape[0] = 2;
    EXPECT_ERR("layers", "layernorm: out overlaps x partly",
               mha_layernorm_forward(&bad, &Y2, &g, NULL, 1e-5f), MHA_ERR_ALIAS, "out");
    EXPECT_ERR("layers", "dropout: p = NaN", mha_dropout_forward(&Y, &X, NAN, 1, 1, 0),
               MHA_ERR_VALUE, "p");
    EXPECT_ERR("layers", "activation: unknown 9",
               mha_activation_forward(&Y, &X, (mha_activation)9), MHA_ERR_VALUE, "activation");
    EXPECT_ERR("layers", "residual: y NULL", mha_residual_forward(&Y, &X, NULL), MHA_ERR_NULL,
               "y");

    mha_layer_options lo;
    mha_layer_options_init(&lo);
    lo.num_heads = 2;
    mha_encoder_layer_weights ew;
    memset(&ew, 0, sizeof ew);
    float win[12 * 4], wout[16], w1[8 * 4], w2[4 * 8];
    test_randn(win, 48, 41), test_randn(wout, 16, 42), test_randn(w1, 32, 43), test_randn(w2, 32, 44);
    mha_tensor Win, Wout, W1, W2, src;
    mha_tensor_init(&Win, MHA_F32, win, 2, (int64_t[]){12, 4});
    mha_tensor_init(&Wout, MHA_F32, wout, 2, (int64_t[]){4, 4});
    mha_tensor_init(&W1, MHA_F32, w1, 2, (int64_t[]){8, 4});
    mha_tensor_init(&W2, MHA_F32, w2, 2, (int64_t[]){4, 8});
    ew.self_attn.in_proj_weight = &Win, ew.self_attn.out_proj_weight = &Wout;
    ew.linear1_weight = &W1, ew.linear2_weight = &W2;
    mha_tensor_init(&src, MHA_F32, x, 3, (int64_t[]){1, 3, 4});
    REQUIRE_OK(mha_encoder_layer_forward(&src, &src, &ew, NULL, &lo, NULL, 0));
    lo.layer_norm_eps = NAN;
    EXPECT_ERR("layers", "encoder layer: layer_norm_eps = NaN",
               mha_encoder_layer_forward(&src, &src, &ew, NULL, &lo, NULL, 0), MHA_ERR_VALUE,
               "layer_norm_eps");
    lo.layer_norm_eps = 1e-5f, lo.dropout_p = NAN;
    EXPECT_ERR("layers", "encoder layer: dropout_p = NaN",
               mha_encoder_layer_forward(&src, &src, &ew, NULL, &lo, NULL, 0), MHA_ERR_VALUE,
               "dropout_p");
    lo.dropout_p = 0.0f;
    EXPECT_ERR("layers", "encoder layer: options NULL (the defaults: num_heads 0)",
               mha_encoder_layer_forward(&src, &src, &ew, NULL, NULL, NULL, 0), MHA_ERR_VALUE,
               "num_heads");
    EXPECT_ERR("layers", "encoder layer: weights NULL",
               mha_encoder_layer_forward(&src, &src, NULL, NULL, &lo, NULL, 0), MHA_ERR_NULL,
               "weights");
    EXPECT_ERR("layers", "encoder layer: src NULL",
               mha_encoder_layer_forward(&src, NULL, &ew, NULL, &lo, NULL, 0), MHA_ERR_NULL, "src");
    EXPECT_ERR("layers", "encoder: weights NULL",
               mha_encoder_forward(&src, &src, NULL, NULL, &lo, NULL, 0), MHA_ERR_NULL, "weights");
    size_t bytes;
    EXPECT_ERR("layers", "encoder workspace size: bytes NULL",
               mha_encoder_workspace_size(1, 3, 4, 8, NULL), MHA_ERR_NULL, "bytes");
    EXPECT_ERR("layers", "encoder workspace size: B = 2^62, L = 2^62",
               mha_encoder_workspace_size((int64_t)1 << 62, (int64_t)1 << 62, 4, 8, &bytes),
               MHA_ERR_OVERFLOW, NULL);
}

static const char *status_name(mha_status st) {
    static const char *names[] = {"MHA_OK", "MHA_ERR_NULL", "MHA_ERR_SHAPE", "MHA_ERR_DTYPE",
                                  "MHA_ERR_VALUE", "MHA_ERR_OVERFLOW", "MHA_ERR_NOMEM",
                                  "MHA_ERR_IO", "MHA_ERR_FORMAT", "MHA_ERR_ALIAS",
                                  "MHA_ERR_UNSUPPORTED"};
    return (unsigned)st < sizeof names / sizeof *names ? names[st] : "?";
}

/* Writes the recorded table as Markdown when MHA_ERRORS_MD names a file. */
TEST(zz_bad_input_table) {
    CHECK(n_rows > 0);
    const char *path = getenv("MHA_ERRORS_MD");
    if (!path)
        return;
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    fprintf(f, "| Area | Case | Status | Message / effect |\n|---|---|---|---|\n");
    for (int i = 0; i < n_rows; i++) {
        fprintf(f, "| %s | %s | `%s` | ", rows[i].area, rows[i].what,
                status_name(rows[i].status));
        for (const char *p = rows[i].message; *p; p++)
            fputs(*p == '|' ? "\\|" : (char[]){*p, 0}, f);
        fprintf(f, " |\n");
    }
    fclose(f);
    printf("bad input: %d cases written to %s\n", n_rows, path);
}
