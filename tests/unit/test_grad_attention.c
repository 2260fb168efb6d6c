/* test_grad_attention.c - gradient checks of the attention backward passes.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v.
 *
 * Finite differences: loss = sum(dout * y) accumulated in double over the
 * float32 output of the REFERENCE forward (float64 inside, one rounding per
 * output element).  Central differences with step h = 1e-3 on the float32
 * input (the step actually taken, (float)(x+h) - x, is used); the rounding
 * of y bounds the noise near 1e-4, so the check is
 *   max|g_fd - g| <= 2e-3 * max(1, max|g|) per tensor.
 * The fused backward (scalar and, where the CPU has them, AVX2 and AVX-512
 * inner loops; AVX-512 emulated in the test library on CPUs without it) is
 * compared with the float64 reference backward at
 * max|g - ref| <= 1e-4 * max(1, max|ref|) and must be bit-identical for
 * 1, 2, 3 and 7 threads.
 */
#include "test.h"
#include "internal.h"
#include "kernels/attention_bwd.h"

typedef struct grad_cfg {
    int64_t B, Hq, Hkv, L, S, d, dv;
    mha_causal causal;
    int64_t offset;
    int mask;     /* 0 none, 1 bool (L,S), 2 float (B,1,L,S), 3 bool (B,Hq,L,S) */
    int kpm;      /* 0 none, 1 bool (B,S), 2 float (B,S)                      */
    int dropout;  /* p = 0.3, fixed seed                                      */
    int scale;    /* custom scale 0.7                                         */
    int softcap;  /* softcap 2.0                                              */
    int dead_row; /* row 1 of every head fully masked (through the mask)      */
} grad_cfg;

typedef struct grad_case {
    grad_cfg c;
    mha_tensor q, k, v, dout, mask, kpm;
    float *qd, *kd, *vd, *dod, *md, *kd_pm;
    mha_sdpa_options opt;
} grad_case;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
    return x;
}

static void case_make(grad_case *t, const grad_cfg *c, uint64_t seed) {
    memset(t, 0, sizeof *t);
    t->c = *c;
    t->qd = test_tensor(&t->q, 4, (int64_t[]){c->B, c->Hq, c->L, c->d}, seed + 1);
    t->kd = test_tensor(&t->k, 4, (int64_t[]){c->B, c->Hkv, c->S, c->d}, seed + 2);
    t->vd = test_tensor(&t->v, 4, (int64_t[]){c->B, c->Hkv, c->S, c->dv}, seed + 3);
    t->dod = test_tensor(&t->dout, 4, (int64_t[]){c->B, c->Hq, c->L, c->dv}, seed + 4);
    mha_sdpa_options_init(&t->opt);
    mha_sdpa_options *o = &t->opt;
    o->kernel = MHA_KERNEL_REF;
    o->causal = c->causal;
    o->causal_offset = c->offset;
    if (c->mask || c->dead_row) {
        int kind = c->mask ? c->mask : 2;
        int64_t shape[4] = {c->B, kind == 3 ? c->Hq : 1, c->L, c->S};
        int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
        t->md = malloc(sizeof(float) * (size_t)n);
        if (kind == 1) {
            mha_tensor_init(&t->mask, MHA_BOOL, t->md, 2, (int64_t[]){c->L, c->S});
            uint8_t *m = (uint8_t *)t->md;
            for (int64_t x = 0; x < c->L * c->S; x++)
                m[x] = (mix(seed * 31 + (uint64_t)x) % 4) != 0; /* true keeps */
            for (int64_t i = 0; i < c->L; i++)
                m[i * c->S + i % c->S] = !(c->dead_row && i == 1);
            if (c->dead_row)
                for (int64_t j = 0; j < c->S; j++)
                    m[1 * c->S + j] = 0;
        } else if (kind == 3) {
            mha_tensor_init(&t->mask, MHA_BOOL, t->md, 4, shape);
            uint8_t *m = (uint8_t *)t->md;
            for (int64_t x = 0; x < n; x++)
                m[x] = (mix(seed * 17 + (uint64_t)x) % 3) != 0;
            for (int64_t x = 0; x < n / c->S; x++) {
                m[x * c->S + (x % c->S)] = 1;
                if (c->dead_row && (x % c->L) == 1)
                    for (int64_t j = 0; j < c->S; j++)
                        m[x * c->S + j] = 0;
            }
        } else {
            mha_tensor_init(&t->mask, MHA_F32, t->md, 4, shape);
            test_randn(t->md, (size_t)n, seed + 5);
            for (int64_t x = 0; x < n; x++) {
                if (!c->mask)
                    t->md[x] = 0.0f;
                if (c->dead_row && (x / c->S) % c->L == 1)
                    t->md[x] = -INFINITY;
            }
        }
        o->attn_mask = &t->mask;
    }
    if (c->kpm) {
        t->kd_pm = malloc(sizeof(float) * (size_t)(c->B * c->S));
        if (c->kpm == 1) {
            mha_tensor_init(&t->kpm, MHA_BOOL, t->kd_pm, 2, (int64_t[]){c->B, c->S});
            uint8_t *m = (uint8_t *)t->kd_pm;
            for (int64_t x = 0; x < c->B * c->S; x++)
                m[x] = (x % c->S) == c->S - 1 && c->S > 2; /* true masks: last key */
        } else {
            mha_tensor_init(&t->kpm, MHA_F32, t->kd_pm, 2, (int64_t[]){c->B, c->S});
            test_randn(t->kd_pm, (size_t)(c->B * c->S), seed + 6);
        }
        o->key_padding_mask = &t->kpm;
    }
    if (c->dropout) {
        o->training = 1;
        o->dropout_p = 0.3f;
        o->seed = 1234 + seed;
    }
    if (c->scale)
        o->scale_set = 1, o->scale = 0.7f;
    if (c->softcap)
        o->softcap = 2.0f;
}

static void case_free(grad_case *t) {
    free(t->qd), free(t->kd), free(t->vd), free(t->dod), free(t->md), free(t->kd_pm);
}

static int64_t numel(const mha_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* loss = sum(dout * forward) in double, reference forward. */
static double loss(grad_case *t) {
    mha_tensor y;
    if (mha_tensor_create(&y, MHA_F32, 4, t->dout.shape) != MHA_OK)
        return NAN;
    double l = NAN;
    if (mha_sdpa_forward(&y, &t->q, &t->k, &t->v, &t->opt) == MHA_OK) {
        l = 0.0;
        const float *yd = y.data;
        for (int64_t x = 0; x < numel(&y); x++)
            l += (double)yd[x] * (double)t->dod[x];
    }
    mha_tensor_free(&y);
    return l;
}

/* Analytic gradients with `kernel` into fresh zeroed dq/dk/dv (caller frees). */
static mha_status grads(grad_case *t, mha_kernel kernel, mha_tensor g[3], int with_saved) {
    const mha_tensor *in[3] = {&t->q, &t->k, &t->v};
    for (int x = 0; x < 3; x++)
        if (mha_tensor_create(&g[x], MHA_F32, 4, in[x]->shape) != MHA_OK)
            return MHA_ERR_NOMEM;
    mha_sdpa_options o = t->opt;
    o.kernel = kernel;
    if (!with_saved)
        return mha_sdpa_backward(&g[0], &g[1], &g[2], &t->dout, NULL, NULL, &t->q, &t->k, &t->v,
                                 &o);
    /* saved out and lse from the forward */
    mha_tensor out, lse;
    mha_tensor_create(&out, MHA_F32, 4, t->dout.shape);
    mha_tensor_create(&lse, MHA_F32, 3, t->dout.shape);
    mha_sdpa_options fo = t->opt;
    fo.lse = &lse;
    mha_status st = mha_sdpa_forward(&out, &t->q, &t->k, &t->v, &fo);
    if (st == MHA_OK)
        st = mha_sdpa_backward(&g[0], &g[1], &g[2], &t->dout, &out, &lse, &t->q, &t->k, &t->v,
                               &o);
    mha_tensor_free(&out);
    mha_tensor_free(&lse);
    return st;
}

static void free3(mha_tensor g[3]) {
    for (int x = 0; x < 3; x++)
        mha_tensor_free(&g[x]);
}

/* The fused backward's kernels: portable, AVX2, AVX-512 inner loops. */
static const mha_kernel FUSED[3] = {MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2, MHA_KERNEL_AVX512};

/* True when this CPU (or the test library's AVX-512 emulation) runs the
 * backward on `kernel`; otherwise notes the part skipped. */
static bool bwd_runs(mha_kernel kernel) {
    static int known[8]; /* per kernel: 0 not probed, 1 runs, 2 does not */
    const int x = (int)kernel & 7;
    if (!known[x]) {
        mha_tensor q, k, v, o, dq;
        float *a = test_tensor(&q, 4, (int64_t[]){1, 1, 1, 1}, 1);
        float *b = test_tensor(&k, 4, (int64_t[]){1, 1, 1, 1}, 2);
        float *c = test_tensor(&v, 4, (int64_t[]){1, 1, 1, 1}, 3);
        float *d = test_tensor(&o, 4, (int64_t[]){1, 1, 1, 1}, 4);
        float *e = test_tensor(&dq, 4, (int64_t[]){1, 1, 1, 1}, 5);
        mha_sdpa_options opt;
        mha_sdpa_options_init(&opt);
        opt.kernel = kernel;
        known[x] = mha_sdpa_backward(&dq, NULL, NULL, &o, NULL, NULL, &q, &k, &v, &opt) == MHA_OK
                       ? 1
                       : 2;
        free(a), free(b), free(c), free(d), free(e);
    }
    if (known[x] != 1)
        SKIP_PART("kernel %s backward: not in this build or on this CPU",
                  mha_kernel_name(kernel));
    return known[x] == 1;
}

static double worst_fd = 0.0, worst_flash = 0.0;
static int configs_checked = 0;

/* Central differences of every element of q, k, v against g. */
static double fd_error(grad_case *t, mha_tensor g[3]) {
    float *data[3] = {t->qd, t->kd, t->vd};
    const mha_tensor *in[3] = {&t->q, &t->k, &t->v};
    double worst = 0.0;
    for (int x = 0; x < 3; x++) {
        const float *ga = g[x].data;
        double gmax = 0.0, emax = 0.0;
        for (int64_t n = 0; n < numel(in[x]); n++)
            gmax = fmax(gmax, fabs(ga[n]));
        for (int64_t n = 0; n < numel(in[x]); n++) {
            float keep = data[x][n];
            data[x][n] = keep + 1e-3f;
            double up = (double)data[x][n] - keep;
            double lp = loss(t);
            data[x][n] = keep - 1e-3f;
            double dn = (double)keep - data[x][n];
            double lm = loss(t);
            data[x][n] = keep;
            double fd = (lp - lm) / (up + dn);
            emax = fmax(emax, fabs(fd - ga[n]));
        }
        worst = fmax(worst, emax / fmax(1.0, gmax));
    }
    return worst;
}

static double rel3(mha_tensor a[3], mha_tensor b[3]) {
    double w = 0.0;
    for (int x = 0; x < 3; x++)
        w = fmax(w, test_rel_err(a[x].data, b[x].data, (size_t)numel(&a[x])));
    return w;
}

static void check_config(const grad_cfg *c, uint64_t seed) {
    grad_case t;
    case_make(&t, c, seed);
    mha_tensor gr[3];
    mha_status sr = grads(&t, MHA_KERNEL_REF, gr, 0);
    CHECK_STATUS(sr, MHA_OK);
    /* each fused kernel that runs, recomputing and from the saved out/lse */
    double efl = 0.0;
    const char *worst_kernel = "";
    bool ok = sr == MHA_OK;
    for (int kk = 0; kk < 3 && ok; kk++) {
        if (!bwd_runs(FUSED[kk]))
            continue;
        for (int saved = 0; saved < 2; saved++) {
            mha_tensor gf[3];
            mha_status sf = grads(&t, FUSED[kk], gf, saved);
            CHECK_STATUS(sf, MHA_OK);
            if (sf == MHA_OK) {
                const double e = rel3(gf, gr);
                if (!(e <= efl)) /* NaN sticks */
                    efl = e, worst_kernel = mha_kernel_name(FUSED[kk]);
            }
            ok &= sf == MHA_OK;
            free3(gf);
        }
    }
    if (ok) {
        double efd = fd_error(&t, gr);
        worst_fd = fmax(worst_fd, efd);
        worst_flash = fmax(worst_flash, efl);
        configs_checked++;
        if (!(efd <= 2e-3) || !(efl <= 1e-4))
            test_fail(__FILE__, __LINE__,
                      "config B%lld Hq%lld Hkv%lld L%lld S%lld d%lld dv%lld causal%d off%lld "
                      "mask%d kpm%d drop%d scale%d cap%d dead%d: fd err %.3g, flash err %.3g (%s)",
                      (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->L,
                      (long long)c->S, (long long)c->d, (long long)c->dv, (int)c->causal,
                      (long long)c->offset, c->mask, c->kpm, c->dropout, c->scale, c->softcap,
                      c->dead_row, efd, efl, worst_kernel);
    }
    free3(gr);
    case_free(&t);
}

/* 64 configurations: odd shapes crossed with every option. */
TEST(grad_sdpa_finite_differences) {
    static const int64_t shapes[][7] = {
        {1, 1, 1, 3, 5, 4, 3},  {2, 2, 1, 5, 3, 3, 5}, {1, 3, 3, 7, 6, 5, 2},
        {2, 4, 2, 4, 7, 2, 3},  {1, 6, 2, 6, 9, 3, 4}, {3, 2, 2, 2, 4, 6, 1},
        {1, 2, 1, 9, 5, 4, 4},  {2, 3, 1, 3, 3, 5, 5},
    };
    int n = 0;
    for (int v = 0; v < 8; v++)
        for (int sh = 0; sh < 8; sh++) {
            grad_cfg c;
            memset(&c, 0, sizeof c);
            const int64_t *s = shapes[sh];
            c.B = s[0], c.Hq = s[1], c.Hkv = s[2], c.L = s[3], c.S = s[4], c.d = s[5], c.dv = s[6];
            int k = (v * 8 + sh) % 8;
            switch (v) {
            case 0: break;
            case 1: c.causal = (mha_causal)(1 + k % 3), c.offset = (k % 5) - 2; break;
            case 2: c.mask = 1 + k % 3; break;
            case 3: c.kpm = 1 + k % 2, c.mask = k % 4; break;
            case 4: c.dropout = 1, c.causal = (mha_causal)(k % 3); break;
            case 5: c.scale = 1, c.softcap = 1, c.mask = k % 3; break;
            case 6: c.dead_row = 1, c.mask = k % 4 == 0 ? 0 : 1 + k % 3; c.L = c.L < 2 ? 2 : c.L; break;
            case 7:
                c.causal = MHA_CAUSAL_BOTTOM_RIGHT, c.mask = 2, c.kpm = 1, c.dropout = 1,
                c.softcap = k % 2;
                break;
            }
            check_config(&c, (uint64_t)(100 + n));
            n++;
        }
    CHECK(configs_checked == 64);
    printf("  grad_sdpa: %d configurations, worst finite-difference error %.3g, "
           "worst fused-vs-reference error %.3g\n",
           configs_checked, worst_fd, worst_flash);
}

/* Larger shapes (several tiles and blocks, splits) against the reference and
 * bit-identical across thread counts. */
TEST(grad_sdpa_fused_tiles_and_threads) {
    static const grad_cfg cfgs[] = {
        {1, 1, 1, 77, 150, 16, 16, MHA_CAUSAL_NONE, 0, 0, 0, 0, 0, 0, 0},
        {2, 4, 2, 65, 129, 8, 12, MHA_CAUSAL_TOP_LEFT, 0, 0, 1, 0, 0, 0, 0},
        {1, 2, 1, 100, 70, 32, 8, MHA_CAUSAL_BOTTOM_RIGHT, 0, 2, 0, 1, 0, 0, 0},
        {3, 3, 3, 33, 200, 5, 7, MHA_CAUSAL_OFFSET, -5, 3, 2, 0, 1, 1, 1},
        {1, 8, 1, 40, 300, 64, 64, MHA_CAUSAL_NONE, 0, 0, 0, 1, 0, 0, 0},
    };
    for (size_t x = 0; x < sizeof cfgs / sizeof *cfgs; x++) {
        grad_case t;
        case_make(&t, &cfgs[x], 900 + x);
        mha_tensor gr[3];
        mha_set_num_threads(1);
        REQUIRE_OK(grads(&t, MHA_KERNEL_REF, gr, 0));
        const mha_kernel *kinds = FUSED;
        for (int kk = 0; kk < 3; kk++) {
            if (!bwd_runs(kinds[kk]))
                continue;
            mha_tensor g1[3];
            mha_set_num_threads(1);
            REQUIRE_OK(grads(&t, kinds[kk], g1, 1));
            double e = rel3(g1, gr);
            CHECK(e <= 1e-4);
            if (!(e <= 1e-4))
                printf("  config %zu %s: fused vs reference %.3g\n", x,
                       mha_kernel_name(kinds[kk]), e);
            const int threads[] = {2, 3, 7};
            for (int n = 0; n < 3; n++) {
                mha_tensor gt[3], rt[3];
                mha_set_num_threads(threads[n]);
                REQUIRE_OK(grads(&t, kinds[kk], gt, 1));
                REQUIRE_OK(grads(&t, MHA_KERNEL_REF, rt, 0));
                for (int y = 0; y < 3; y++) {
                    CHECK(memcmp(gt[y].data, g1[y].data, sizeof(float) * (size_t)numel(&g1[y])) ==
                          0);
                    CHECK(memcmp(rt[y].data, gr[y].data, sizeof(float) * (size_t)numel(&gr[y])) ==
                          0);
                }
                free3(gt), free3(rt);
            }
            free3(g1);
        }
        mha_set_num_threads(0);
        free3(gr);
        case_free(&t);
    }
}

/* The register-blocked backward on shapes around its tiles (48 query rows,
 * 192 keys, 6x16 register blocks): L and S one off a tile (S = 191, 193),
 * a partial last group of 6 rows (L = 49, 95, 97, 61), d = 1, d and dv
 * past 16, GQA, every mask kind, dropout, every causal alignment, enough
 * (b, kv head) pairs for one split (dQ summed per task), each
 * kernel against the reference and bit-identical for 1, 2, 3, 7 threads;
 * then NaN/Inf planted in masked keys, values, a fully masked query row and
 * its dout must leave every gradient finite and equal to the clean run's. */
TEST(grad_sdpa_blocked_odd_shapes) {
    static const grad_cfg cfgs[] = {
        {1, 2, 2, 49, 97, 1, 1, MHA_CAUSAL_NONE, 0, 0, 0, 0, 0, 0, 0},
        {2, 3, 1, 95, 191, 17, 33, MHA_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 0, 0, 0},
        {1, 4, 2, 97, 47, 40, 24, MHA_CAUSAL_BOTTOM_RIGHT, 0, 1, 0, 0, 1, 0, 0},
        {1, 2, 1, 144, 96, 16, 16, MHA_CAUSAL_OFFSET, -50, 0, 1, 0, 0, 0, 0},
        {2, 2, 2, 48, 289, 7, 5, MHA_CAUSAL_OFFSET, 140, 3, 2, 1, 0, 0, 1},
        {1, 6, 3, 61, 113, 65, 3, MHA_CAUSAL_NONE, 0, 2, 0, 1, 0, 1, 0},
        {1, 2, 2, 95, 193, 32, 32, MHA_CAUSAL_NONE, 0, 0, 0, 0, 0, 0, 0},
        /* B*Hkv >= 16 pairs: one split, dQ summed per task (G = 2, a
         * partial last row group, 12-row products at d, dv <= 32) */
        {8, 4, 2, 37, 50, 24, 20, MHA_CAUSAL_NONE, 0, 0, 0, 0, 0, 0, 0},
        {17, 1, 1, 61, 200, 32, 32, MHA_CAUSAL_TOP_LEFT, 0, 0, 1, 0, 0, 0, 1},
    };
    const mha_kernel *kinds = FUSED;
    double worst = 0.0;
    for (size_t x = 0; x < sizeof cfgs / sizeof *cfgs; x++) {
        grad_case t;
        case_make(&t, &cfgs[x], 700 + x);
        mha_tensor gr[3];
        REQUIRE_OK(grads(&t, MHA_KERNEL_REF, gr, 0));
        for (int kk = 0; kk < 3; kk++) {
            if (!bwd_runs(kinds[kk]))
                continue;
            mha_tensor g1[3];
            mha_set_num_threads(1);
            REQUIRE_OK(grads(&t, kinds[kk], g1, 1));
            double e = rel3(g1, gr);
            worst = fmax(worst, e);
            CHECK(e <= 1e-4);
            if (!(e <= 1e-4))
                printf("  config %zu %s: blocked vs reference %.3g\n", x,
                       mha_kernel_name(kinds[kk]), e);
            const int threads[] = {2, 3, 7};
            for (int n = 0; n < 3; n++) {
                mha_tensor gt[3];
                mha_set_num_threads(threads[n]);
                REQUIRE_OK(grads(&t, kinds[kk], gt, n == 1 ? 0 : 1));
                mha_tensor g1b[3];
                if (n == 1) { /* recomputed statistics: compare with the same at 1 thread */
                    mha_set_num_threads(1);
                    REQUIRE_OK(grads(&t, kinds[kk], g1b, 0));
                }
                for (int y = 0; y < 3; y++)
                    CHECK(memcmp(gt[y].data, (n == 1 ? g1b : g1)[y].data,
                                 sizeof(float) * (size_t)numel(&g1[y])) == 0);
                if (n == 1)
                    free3(g1b);
                free3(gt);
            }
            free3(g1);
        }
        mha_set_num_threads(0);
        free3(gr);
        case_free(&t);
    }
    printf("  grad_sdpa blocked: %zu odd shapes, worst error %.3g\n",
           sizeof cfgs / sizeof *cfgs, worst);

    /* non-finite values where only masked entries reach them */
    grad_cfg c = {1, 2, 1, 53, 101, 19, 21, MHA_CAUSAL_NONE, 0, 0, 1, 0, 0, 0, 1};
    grad_case t;
    case_make(&t, &c, 77); /* kpm 1: the last key is padding; row 1 is dead */
    for (int kk = 0; kk < 3; kk++) {
        if (!bwd_runs(kinds[kk]))
            continue;
        mha_tensor clean[3], dirty[3];
        REQUIRE_OK(grads(&t, kinds[kk], clean, 1));
        float *kd = t.kd + (c.S - 1) * c.d, *vd = t.vd + (c.S - 1) * c.dv;
        float *qd = t.qd + 1 * c.d, *od = t.dod + 1 * c.dv; /* head 0, dead row 1 */
        kd[0] = NAN, kd[c.d - 1] = INFINITY, vd[0] = -INFINITY, vd[3] = NAN;
        qd[2] = NAN, od[1] = INFINITY;
        mha_status st = grads(&t, kinds[kk], dirty, 1);
        CHECK_STATUS(st, MHA_OK);
        if (st == MHA_OK) {
            /* the same gradients as the clean run (a block holding a
             * non-finite value takes the zero-skipping loop: another
             * rounding), all finite; the poisoned key's dk/dv and the dead
             * row's dq exactly 0 */
            const float *dk = dirty[1].data, *dv = dirty[2].data, *dq = dirty[0].data;
            const double e = rel3(dirty, clean);
            CHECK(e <= 1e-6);
            if (!(e <= 1e-6))
                printf("  %s: non-finite masked inputs change gradients by %.3g\n",
                       mha_kernel_name(kinds[kk]), e);
            CHECK(dk[(c.S - 1) * c.d] == 0.0f && dv[(c.S - 1) * c.dv] == 0.0f);
            CHECK(dq[1 * c.d + 2] == 0.0f);
        }
        kd[0] = 0.5f, kd[c.d - 1] = 0.5f, vd[0] = 0.5f, vd[3] = 0.5f, qd[2] = 0.5f, od[1] = 0.5f;
        free3(clean);
        if (st == MHA_OK)
            free3(dirty);
    }
    case_free(&t);
}

/* Gradients written through strided views (every other float of a larger
 * buffer, so rows and elements are both strided): the same bits as into
 * contiguous tensors, the floats between them untouched.  Two shapes: one
 * split with dQ summed per task (B*Hkv = 16), and several splits. */
TEST(grad_sdpa_strided_gradients) {
    static const grad_cfg cfgs[] = {
        {4, 8, 4, 30, 40, 20, 12, MHA_CAUSAL_NONE, 0, 0, 0, 0, 0, 0, 0},
        {1, 2, 1, 50, 400, 20, 12, MHA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0, 0, 0},
    };
    const float guard = -777.0f;
    for (size_t x = 0; x < sizeof cfgs / sizeof *cfgs; x++) {
        grad_case t;
        case_make(&t, &cfgs[x], 950 + x);
        for (int kk = 0; kk < 3; kk++) {
            if (!bwd_runs(FUSED[kk]))
                continue;
            mha_tensor g[3], v[3];
            REQUIRE_OK(grads(&t, FUSED[kk], g, 0)); /* statistics recomputed, as below */
            const mha_tensor *in[3] = {&t.q, &t.k, &t.v};
            float *buf[3];
            for (int y = 0; y < 3; y++) {
                const int64_t *sh = in[y]->shape, n = numel(in[y]);
                buf[y] = malloc(sizeof(float) * (size_t)(2 * n));
                for (int64_t e = 0; e < 2 * n; e++)
                    buf[y][e] = e % 2 ? guard : 0.0f;
                mha_tensor_init(&v[y], MHA_F32, buf[y], 4, sh);
                v[y].stride[3] = 2, v[y].stride[2] = 2 * sh[3], v[y].stride[1] = 2 * sh[3] * sh[2],
                v[y].stride[0] = 2 * sh[3] * sh[2] * sh[1];
            }
            mha_sdpa_options o = t.opt;
            o.kernel = FUSED[kk];
            REQUIRE_OK(mha_sdpa_backward(&v[0], &v[1], &v[2], &t.dout, NULL, NULL, &t.q, &t.k,
                                         &t.v, &o));
            size_t differ = 0, guards = 0;
            for (int y = 0; y < 3; y++) {
                const float *gd = g[y].data;
                for (int64_t e = 0; e < numel(in[y]); e++) {
                    differ += memcmp(&buf[y][2 * e], &gd[e], sizeof(float)) != 0;
                    guards += buf[y][2 * e + 1] != guard;
                }
                free(buf[y]);
            }
            CHECK(differ == 0 && guards == 0);
            if (differ || guards)
                printf("  config %zu %s: %zu elements differ from contiguous, %zu guards hit\n",
                       x, mha_kernel_name(FUSED[kk]), differ, guards);
            free3(g);
        }
        case_free(&t);
    }
}

/* The accumulate rule: a second call adds the same gradients again; NULL
 * gradients are skipped; bad shapes and aliasing are refused. */
TEST(grad_sdpa_accumulates_and_validates) {
    grad_cfg c = {2, 2, 1, 5, 6, 4, 3, MHA_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 0, 0, 0};
    grad_case t;
    case_make(&t, &c, 77);
    t.opt.kernel = MHA_KERNEL_SCALAR;
    mha_tensor g[3];
    REQUIRE_OK(grads(&t, MHA_KERNEL_SCALAR, g, 0));
    mha_tensor dq2;
    REQUIRE_OK(mha_tensor_create(&dq2, MHA_F32, 4, t.q.shape));
    CHECK_STATUS(mha_sdpa_backward(&dq2, NULL, NULL, &t.dout, NULL, NULL, &t.q, &t.k, &t.v,
                                   &t.opt), MHA_OK);
    CHECK_STATUS(mha_sdpa_backward(&dq2, NULL, NULL, &t.dout, NULL, NULL, &t.q, &t.k, &t.v,
                                   &t.opt), MHA_OK);
    const float *a = g[0].data, *b = dq2.data;
    bool twice = true;
    for (int64_t x = 0; x < numel(&dq2); x++)
        twice = twice && fabsf(b[x] - 2.0f * a[x]) <= 1e-6f * (1.0f + fabsf(a[x]));
    CHECK(twice);
    /* errors */
    CHECK_STATUS(mha_sdpa_backward(&g[1], NULL, NULL, &t.dout, NULL, NULL, &t.q, &t.k, &t.v,
                                   &t.opt), MHA_ERR_SHAPE);
    CHECK_ERROR_MENTIONS("dq");
    CHECK_STATUS(mha_sdpa_backward(&t.q, NULL, NULL, &t.dout, NULL, NULL, &t.q, &t.k, &t.v,
                                   &t.opt), MHA_ERR_ALIAS);
    CHECK_STATUS(mha_sdpa_backward(&dq2, NULL, NULL, &t.q, NULL, NULL, &t.q, &t.k, &t.v,
                                   &t.opt), t.q.shape[3] == t.dout.shape[3] ? MHA_OK
                                                                             : MHA_ERR_SHAPE);
    CHECK_STATUS(mha_sdpa_backward(&dq2, NULL, NULL, NULL, NULL, NULL, &t.q, &t.k, &t.v,
                                   &t.opt), MHA_ERR_NULL);
    mha_tensor_free(&dq2);
    free3(g);
    case_free(&t);
}

/* ---- multi-head attention ------------------------------------------------ */

typedef struct mh_cfg {
    int64_t E, H, B, L, S, kdim, vdim;
    int batched, self, packed, bias, bias_kv, zero_attn, kpm, mask3, causal, dropout;
} mh_cfg;

typedef struct mh_case {
    mh_cfg c;
    mha_tensor x[3], dout, kpm, mask, wt[9];
    float *xd[3], *dod, *wd[9];
    uint8_t kpm_data[512];
    float *maskd;
    mha_multihead_weights w;
    mha_multihead_options opt;
} mh_case;

static void mh_make(mh_case *t, const mh_cfg *c, uint64_t seed) {
    memset(t, 0, sizeof *t);
    t->c = *c;
    int64_t E = c->E, S = c->self ? c->L : c->S;
    int64_t widths[3] = {E, c->self ? E : c->kdim, c->self ? E : c->vdim};
    int64_t lens[3] = {c->L, S, S};
    for (int i = 0; i < 3; i++) {
        if (i > 0 && c->self)
            break;
        int64_t shape[3] = {c->B, lens[i], widths[i]};
        t->xd[i] = test_tensor(&t->x[i], c->batched ? 3 : 2, c->batched ? shape : shape + 1,
                               seed + (uint64_t)i);
    }
    int64_t oshape[3] = {c->B, c->L, E};
    t->dod = test_tensor(&t->dout, c->batched ? 3 : 2, c->batched ? oshape : oshape + 1, seed + 7);
    const mha_tensor **slots[9] = {&t->w.in_proj_weight, &t->w.q_proj_weight,
                                   &t->w.k_proj_weight,  &t->w.v_proj_weight,
                                   &t->w.in_proj_bias,   &t->w.out_proj_weight,
                                   &t->w.out_proj_bias,  &t->w.bias_k, &t->w.bias_v};
    int64_t shapes[9][2] = {{3 * E, E}, {E, E}, {E, widths[1]}, {E, widths[2]}, {3 * E, 0},
                            {E, E},     {E, 0}, {E, 0},         {E, 0}};
    bool want[9] = {c->packed, !c->packed, !c->packed, !c->packed, c->bias, true, c->bias,
                    c->bias_kv, c->bias_kv};
    for (int i = 0; i < 9; i++) {
        if (!want[i])
            continue;
        t->wd[i] = test_tensor(&t->wt[i], shapes[i][1] ? 2 : 1, shapes[i], seed + 10 + i);
        for (int64_t n = 0; n < numel(&t->wt[i]); n++)
            t->wd[i][n] *= 0.5f;
        *slots[i] = &t->wt[i];
    }
    mha_multihead_options_init(&t->opt);
    t->opt.num_heads = c->H;
    t->opt.add_zero_attn = c->zero_attn;
    t->opt.causal = c->causal;
    t->opt.kernel = MHA_KERNEL_REF;
    if (c->kpm) {
        for (int64_t n = 0; n < c->B * S; n++)
            t->kpm_data[n] = (n % S) != 0 && (mix(seed + (uint64_t)n) % 3) == 0;
        int64_t shape[2] = {c->B, S};
        mha_tensor_init(&t->kpm, MHA_BOOL, t->kpm_data, c->batched ? 2 : 1,
                        c->batched ? shape : shape + 1);
        t->opt.key_padding_mask = &t->kpm;
    }
    if (c->mask3) {
        int64_t shape[3] = {c->B * c->H, c->L, S};
        t->maskd = test_tensor(&t->mask, 3, shape, seed + 30);
        t->opt.attn_mask = &t->mask;
    }
    if (c->dropout)
        t->opt.training = 1, t->opt.dropout_p = 0.2f, t->opt.seed = seed * 3 + 1;
}

static void mh_free(mh_case *t) {
    for (int i = 0; i < 3; i++)
        free(t->xd[i]);
    for (int i = 0; i < 9; i++)
        free(t->wd[i]);
    free(t->dod), free(t->maskd);
}

static const mha_tensor *mh_in(mh_case *t, int i) { return t->c.self ? &t->x[0] : &t->x[i]; }

static double mh_loss(mh_case *t) {
    mha_tensor y;
    if (mha_tensor_create(&y, MHA_F32, t->dout.ndim, t->dout.shape) != MHA_OK)
        return NAN;
    double l = NAN;
    if (mha_multihead_forward(&y, mh_in(t, 0), mh_in(t, 1), mh_in(t, 2), &t->w, &t->opt) ==
        MHA_OK) {
        l = 0.0;
        for (int64_t n = 0; n < numel(&y); n++)
            l += (double)((float *)y.data)[n] * (double)t->dod[n];
    }
    mha_tensor_free(&y);
    return l;
}

/* Analytic gradients: g[0..2] inputs (g[1], g[2] unused for self), gw[9]. */
static mha_status mh_grads(mh_case *t, mha_kernel kernel, mha_tensor g[3], mha_tensor gw[9]) {
    memset(g, 0, 3 * sizeof *g);
    memset(gw, 0, 9 * sizeof *gw);
    mha_multihead_grads dw;
    mha_tensor **slots[9] = {&dw.in_proj_weight, &dw.q_proj_weight, &dw.k_proj_weight,
                             &dw.v_proj_weight,  &dw.in_proj_bias,  &dw.out_proj_weight,
                             &dw.out_proj_bias,  &dw.bias_k,        &dw.bias_v};
    for (int i = 0; i < 9; i++) {
        *slots[i] = NULL;
        if (t->wd[i] && mha_tensor_create(&gw[i], MHA_F32, t->wt[i].ndim, t->wt[i].shape) == MHA_OK)
            *slots[i] = &gw[i];
    }
    for (int i = 0; i < 3; i++)
        if (mha_tensor_create(&g[i], MHA_F32, mh_in(t, i)->ndim, mh_in(t, i)->shape) != MHA_OK)
            return MHA_ERR_NOMEM;
    mha_multihead_options o = t->opt;
    o.kernel = kernel;
    size_t bytes;
    int64_t S = mh_in(t, 1)->shape[t->c.batched];
    mha_status st = mha_multihead_saved_size(t->c.B, t->c.L, S, t->c.E, t->c.H, t->c.bias_kv,
                                             t->c.zero_attn, &bytes);
    if (st != MHA_OK)
        return st;
    void *saved = malloc(bytes);
    mha_tensor y;
    mha_tensor_create(&y, MHA_F32, t->dout.ndim, t->dout.shape);
    st = mha_multihead_forward_train(&y, saved, bytes, mh_in(t, 0), mh_in(t, 1), mh_in(t, 2),
                                     &t->w, &o);
    if (st == MHA_OK)
        st = mha_multihead_backward(&g[0], t->c.self ? NULL : &g[1], t->c.self ? NULL : &g[2], &dw,
                                    &t->dout, saved, bytes, mh_in(t, 0), mh_in(t, 1), mh_in(t, 2),
                                    &t->w, &o, NULL, 0);
    mha_tensor_free(&y);
    free(saved);
    return st;
}

static double mh_fd_error(mh_case *t, mha_tensor g[3], mha_tensor gw[9]) {
    double worst = 0.0;
    for (int v = 0; v < 12; v++) {
        float *data;
        const float *ga;
        int64_t n;
        if (v < 3) {
            if (v > 0 && t->c.self)
                continue;
            data = t->xd[v], ga = g[v].data, n = numel(&t->x[v]);
        } else {
            if (!t->wd[v - 3])
                continue;
            data = t->wd[v - 3], ga = gw[v - 3].data, n = numel(&t->wt[v - 3]);
        }
        double gmax = 0.0, emax = 0.0;
        for (int64_t x = 0; x < n; x++)
            gmax = fmax(gmax, fabs(ga[x]));
        for (int64_t x = 0; x < n; x++) {
            float keep = data[x];
            data[x] = keep + 1e-3f;
            double up = (double)data[x] - keep, lp = mh_loss(t);
            data[x] = keep - 1e-3f;
            double dn = (double)keep - data[x], lm = mh_loss(t);
            data[x] = keep;
            emax = fmax(emax, fabs((lp - lm) / (up + dn) - ga[x]));
        }
        worst = fmax(worst, emax / fmax(1.0, gmax));
    }
    return worst;
}

static const mh_cfg MH_CFGS[] = {
    /* E  H  B  L  S kd vd  bat self pack bias bkv zero kpm m3 causal drop */
    {6, 2, 2, 3, 4, 6, 6, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {6, 3, 2, 3, 5, 7, 9, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0},
    {6, 2, 2, 4, 4, 6, 6, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0},
    {8, 4, 2, 3, 5, 8, 8, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0},
    {5, 1, 1, 4, 3, 5, 5, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0},
    {6, 2, 2, 3, 4, 6, 6, 1, 0, 1, 1, 0, 0, 0, 1, 0, 1},
    {6, 3, 1, 5, 5, 6, 6, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1},
    {4, 2, 3, 2, 3, 5, 3, 1, 0, 0, 0, 1, 1, 0, 1, 0, 0},
};

TEST(grad_multihead_finite_differences) {
    double worst = 0.0;
    for (size_t x = 0; x < sizeof MH_CFGS / sizeof *MH_CFGS; x++) {
        mh_case t;
        mh_make(&t, &MH_CFGS[x], 500 + x);
        mha_tensor g[3], gw[9], f[3], fw[9];
        mha_status s1 = mh_grads(&t, MHA_KERNEL_REF, g, gw);
        mha_status s2 = mh_grads(&t, MHA_KERNEL_SCALAR, f, fw);
        CHECK_STATUS(s1, MHA_OK);
        CHECK_STATUS(s2, MHA_OK);
        if (s1 == MHA_OK && s2 == MHA_OK) {
            double e = mh_fd_error(&t, g, gw), ef = rel3(f, g);
            for (int i = 0; i < 9; i++)
                if (gw[i].data)
                    ef = fmax(ef, test_rel_err(fw[i].data, gw[i].data, (size_t)numel(&gw[i])));
            worst = fmax(worst, e);
            if (!(e <= 2e-3) || !(ef <= 1e-4))
                test_fail(__FILE__, __LINE__, "mha config %zu: fd error %.3g, fused %.3g", x, e, ef);
        }
        free3(g), free3(f);
        for (int i = 0; i < 9; i++)
            mha_tensor_free(&gw[i]), mha_tensor_free(&fw[i]);
        mh_free(&t);
    }
    printf("  grad_multihead: %zu configurations, worst finite-difference error %.3g\n",
           sizeof MH_CFGS / sizeof *MH_CFGS, worst);
}

TEST(grad_multihead_threads_bit_identical) {
    mh_cfg c = {16, 4, 3, 37, 41, 16, 16, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1};
    mh_case t;
    mh_make(&t, &c, 4242);
    mha_tensor g1[3], w1[9];
    mha_set_num_threads(1);
    REQUIRE_OK(mh_grads(&t, MHA_KERNEL_SCALAR, g1, w1));
    const int threads[] = {2, 3, 7};
    for (int n = 0; n < 3; n++) {
        mha_tensor g[3], w[9];
        mha_set_num_threads(threads[n]);
        REQUIRE_OK(mh_grads(&t, MHA_KERNEL_SCALAR, g, w));
        for (int i = 0; i < 3; i++)
            CHECK(memcmp(g[i].data, g1[i].data, sizeof(float) * (size_t)numel(&g[i])) == 0);
        for (int i = 0; i < 9; i++)
            if (w[i].data)
                CHECK(memcmp(w[i].data, w1[i].data, sizeof(float) * (size_t)numel(&w[i])) == 0);
        free3(g);
        for (int i = 0; i < 9; i++)
            mha_tensor_free(&w[i]);
    }
    mha_set_num_threads(0);
    free3(g1);
    for (int i = 0; i < 9; i++)
        mha_tensor_free(&w1[i]);
    mh_free(&t);
}

/* The backward's row epilogue (mha_bwd_isa.row_grad) on each ISA: P =
 * e^x and dS = P (dP - D) for x = s scale - lse at or above
 * MHA_SOFTMAX_FLUSH_X, both exactly 0 below it and past lim, never a
 * denormal (denormal P or dS took microcode assists on Intel: 1.75-8x
 * slower backwards of rows whose scores spread past 87), NaN kept; every
 * tail length.  AVX-512 equals AVX2 bit for bit (the driver's rule; a NaN
 * may differ in sign). */
TEST(grad_row_grad_flushes_tiny_weights) {
    const mha_bwd_isa *isas[3] = {
        &mha_bwd_isa_scalar, mha_cpu_has_avx2_fma() ? &mha_bwd_isa_avx2 : NULL,
        mha_avx512_runs() ? MHA_AVX512_PICK(mha_bwd_isa_avx512) : NULL};
    if (!isas[1])
        SKIP_PART("AVX2 row_grad: no AVX2+FMA on this CPU");
    if (!isas[2])
        SKIP_PART("AVX-512 row_grad: no AVX-512 on this CPU");
    enum { N = 208 };
    const float scale = 0.5f, lse = 2.0f, D = 0.25f;
    float s0[N], dp0[N], s[3][N], dp[3][N];
    for (int j = 0; j < N; j++) { /* x = 0.5 s - 2 from 0 down to -103.5 */
        s0[j] = 4.0f - (float)j;
        dp0[j] = 0.3f + 1e-3f * (float)j;
    }
    s0[5] = NAN;
    for (int64_t lim = N - 17; lim <= N; lim++) {
        for (int a = 0; a < 3; a++) {
            if (!isas[a])
                continue;
            memcpy(s[a], s0, sizeof s0), memcpy(dp[a], dp0, sizeof dp0);
            isas[a]->row_grad(s[a], dp[a], N, lim, scale, NULL, lse, D);
            int bad = 0;
            for (int j = 0; j < N; j++) {
                const float x = s0[j] * scale - lse;
                const bool live = j < lim && !(x < MHA_SOFTMAX_FLUSH_X);
                const double p = live ? exp((double)x) : 0.0;
                const double ds = p * ((double)dp0[j] - D);
                bool ok = fpclassify(s[a][j]) != FP_SUBNORMAL &&
                          fpclassify(dp[a][j]) != FP_SUBNORMAL;
                if (j == 5 && j < lim)
                    ok = ok && isnan(s[a][j]) && isnan(dp[a][j]);
                else
                    ok = ok && fabs(s[a][j] - p) <= 1e-6 * p &&
                         fabs(dp[a][j] - ds) <= 2e-6 * fabs(ds);
                if (!ok && bad++ < 3)
                    test_fail(__FILE__, __LINE__, "%s lim %lld j %d x %g: P %g dS %g, want %g %g",
                              isas[a]->name, (long long)lim, j, (double)x, (double)s[a][j],
                              (double)dp[a][j], p, ds);
            }
        }
        /* NaN against NaN counted equal: the avx512 loop emulated by
         * SIMDe under clang gives the NaN of s[5] the other sign */
        if (isas[1] && isas[2])
            CHECK(test_bits_differ(s[1], s[2], N) == 0 && test_bits_differ(dp[1], dp[2], N) == 0);
    }
}
