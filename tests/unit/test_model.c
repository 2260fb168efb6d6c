/* test_model.c - the trainable Transformer (src/model.c): its backward
 * against central finite differences of the loss, checkpoints (round trip,
 * errors) and exact resumption (bit-identical continuation). */
#include "test.h"

#include <unistd.h>

static void tokens_for(int64_t *tok, int64_t *tgt, int64_t n, int64_t V, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        tok[i] = (int64_t)(s % (uint64_t)V);
        tgt[i] = (i % 5 == 3) ? -1 : (int64_t)((s >> 20) % (uint64_t)V);
    }
}

/* Central differences of the float32 forward's loss (accumulated in double)
 * on a sample of parameters: step h = 1e-2 on weights of size ~0.3, so the
 * float rounding of the loss (~1e-7) contributes ~1e-5 and the truncation
 * ~h^2.  Tolerance |g - fd| <= 2e-3 * max(1e-2, max|fd|) + 2e-4 per entry:
 * a check that every parameter's gradient is wired, not a precision test
 * (the layers' precision is tested against PyTorch autograd). */
TEST(model_backward_finite_differences) {
    for (int variant = 0; variant < 4; variant++) {
        mha_model_config c;
        mha_model_config_init(&c);
        c.vocab = 7, c.max_len = 6, c.dim = 8, c.heads = 2, c.ffn = 12, c.layers = 2;
        c.norm_first = variant & 1, c.causal = (variant >> 1) & 1;
        c.activation = variant == 2 ? MHA_ACT_SILU : MHA_ACT_GELU; /* smooth: no ReLU kink within h */
        mha_model *m;
        REQUIRE_OK(mha_model_create(&m, &c, 11 + variant));
        float *p = mha_model_params(m), *g = mha_model_grads(m);
        const int64_t n = mha_model_num_params(m), B = 2, T = 5;
        /* moderate weights so the loss is smooth at the step size */
        for (int64_t i = 0; i < n; i++)
            p[i] *= 0.5f;
        int64_t tok[10], tgt[10];
        tokens_for(tok, tgt, B * T, c.vocab, 3 + variant);
        float loss;
        mha_model_zero_grad(m);
        REQUIRE_OK(mha_model_forward(m, tok, tgt, B, T, 1, 0, &loss));
        REQUIRE_OK(mha_model_backward(m));
        double worst = 0.0, top = 0.0;
        int checked = 0, bad = 0;
        for (int64_t k = 0; k < mha_model_num_tensors(m); k++) {
            const char *name;
            mha_tensor pt;
            REQUIRE_OK(mha_model_tensor(m, k, &name, &pt, NULL));
            int64_t numel = 1;
            for (int d = 0; d < pt.ndim; d++)
                numel *= pt.shape[d];
            int64_t off = (float *)pt.data - p;
            /* 3 entries per tensor: first, middle, last */
            const int64_t pick[3] = {0, numel / 2, numel - 1};
            for (int j = 0; j < 3; j++) {
                const int64_t i = off + pick[j];
                const float keep = p[i], h = 1e-2f;
                float lp, lm;
                p[i] = keep + h;
                REQUIRE_OK(mha_model_forward(m, tok, tgt, B, T, 1, 0, &lp));
                p[i] = keep - h;
                REQUIRE_OK(mha_model_forward(m, tok, tgt, B, T, 1, 0, &lm));
                p[i] = keep;
                const double fd = ((double)lp - lm) / (2.0 * h);
                const double e = fabs(g[i] - fd);
                top = fmax(top, fabs(fd));
                worst = fmax(worst, e);
                if (e > 2e-3 * fabs(fd) + 2e-4) {
                    bad++;
                    printf("    variant %d %s[%lld]: grad %.6g fd %.6g\n", variant, name,
                           (long long)pick[j], g[i], fd);
                }
                checked++;
            }
        }
        CHECK(bad == 0);
        CHECK(checked >= 3 * 28);
        CHECK(top > 1e-3); /* the loss does depend on the parameters */
        mha_model_free(m);
    }
}

/* n steps of AdamW on random batches that depend only on (seed, step). */
static void train_steps(mha_model *m, mha_adamw *opt, int64_t from, int64_t to) {
    const mha_model_config *c = mha_model_get_config(m);
    int64_t tok[3 * 6], tgt[3 * 6];
    for (int64_t s = from; s < to; s++) {
        tokens_for(tok, tgt, 3 * 6, c->vocab, 100 + (uint64_t)s);
        mha_model_zero_grad(m);
        float loss;
        CHECK_STATUS(mha_model_forward(m, tok, tgt, 3, 6, 1, 1000 + (uint64_t)s, &loss), MHA_OK);
        CHECK_STATUS(mha_model_backward(m), MHA_OK);
        CHECK_STATUS(mha_adamw_step(opt, mha_model_params(m), mha_model_grads(m), NULL), MHA_OK);
    }
}

TEST(model_checkpoint_resume_is_bit_identical) {
    char dir[] = "/tmp/mha_model_XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    char wpath[64], opath[64];
    snprintf(wpath, sizeof wpath, "%s/model.safetensors", dir);
    snprintf(opath, sizeof opath, "%s/optimizer.safetensors", dir);
    mha_model_config c;
    mha_model_config_init(&c);
    c.vocab = 9, c.max_len = 6, c.dim = 12, c.heads = 3, c.ffn = 10, c.layers = 2;
    c.dropout = 0.1f; /* the dropout stream must continue exactly too */
    mha_adamw_options o;
    mha_adamw_options_init(&o);
    o.lr = 3e-3, o.max_grad_norm = 1.0;

    /* straight: 8 steps */
    mha_model *a;
    mha_adamw oa;
    REQUIRE_OK(mha_model_create(&a, &c, 5));
    REQUIRE_OK(mha_adamw_create(&oa, mha_model_num_params(a), &o));
    train_steps(a, &oa, 0, 8);

    /* 4 steps, checkpoint, fresh process state, 4 more */
    mha_model *b, *r;
    mha_adamw ob, orr;
    memset(&orr, 0, sizeof orr);
    REQUIRE_OK(mha_model_create(&b, &c, 5));
    REQUIRE_OK(mha_adamw_create(&ob, mha_model_num_params(b), &o));
    train_steps(b, &ob, 0, 4);
    CHECK_STATUS(mha_model_save(b, wpath, opath, &ob, 4, 5), MHA_OK);
    int64_t step;
    uint64_t seed;
    REQUIRE_OK(mha_model_open(&r, wpath, opath, &orr, &step, &seed));
    CHECK(step == 4 && seed == 5 && orr.step == 4);
    CHECK(orr.opt.lr == o.lr && orr.opt.max_grad_norm == 1.0);
    const mha_model_config *rc = mha_model_get_config(r);
    CHECK(rc->dim == 12 && rc->heads == 3 && rc->layers == 2 && rc->dropout == 0.1f);
    CHECK(memcmp(mha_model_params(r), mha_model_params(b),
                 sizeof(float) * (size_t)mha_model_num_params(b)) == 0);
    train_steps(r, &orr, 4, 8);
    const size_t bytes = sizeof(float) * (size_t)mha_model_num_params(a);
    CHECK(memcmp(mha_model_params(r), mha_model_params(a), bytes) == 0);
    CHECK(memcmp(orr.m, oa.m, bytes) == 0 && memcmp(orr.v, oa.v, bytes) == 0);
    CHECK(orr.step == 8);

    /* names are the state_dict's */
    const char *name;
    REQUIRE_OK(mha_model_tensor(a, 2, &name, NULL, NULL));
    CHECK(strcmp(name, "encoder.layers.0.self_attn.in_proj_weight") == 0);
    REQUIRE_OK(mha_model_tensor(a, mha_model_num_tensors(a) - 1, &name, NULL, NULL));
    CHECK(strcmp(name, "head.bias") == 0);

    /* errors: missing optimizer file, a weights file that is not a checkpoint */
    mha_model *bad = NULL;
    mha_adamw ox;
    memset(&ox, 0, sizeof ox);
    CHECK_STATUS(mha_model_open(&bad, wpath, "/nonexistent/opt.safetensors", &ox, NULL, NULL),
                 MHA_ERR_IO);
    CHECK(bad == NULL);
    CHECK_STATUS(mha_model_open(&bad, opath, NULL, NULL, NULL, NULL), MHA_ERR_FORMAT);
    CHECK_STATUS(mha_model_save(a, wpath, opath, NULL, 0, 0), MHA_ERR_NULL);

    mha_model_free(a), mha_model_free(b), mha_model_free(r);
    mha_adamw_free(&oa), mha_adamw_free(&ob), mha_adamw_free(&orr);
    unlink(wpath), unlink(opath), rmdir(dir);
}

TEST(model_errors) {
    mha_model_config c;
    mha_model_config_init(&c);
    mha_model *m;
    c.heads = 5; /* does not divide 64 */
    CHECK_STATUS(mha_model_create(&m, &c, 1), MHA_ERR_VALUE);
    c.heads = 4, c.vocab = 0;
    CHECK_STATUS(mha_model_create(&m, &c, 1), MHA_ERR_VALUE);
    c.vocab = 5, c.max_len = 4, c.dim = 8, c.heads = 2, c.ffn = 8, c.layers = 1;
    REQUIRE_OK(mha_model_create(&m, &c, 1));
    int64_t tok[4] = {0, 1, 2, 5}, tgt[4] = {0, 1, -1, -2};
    CHECK_STATUS(mha_model_forward(m, tok, NULL, 1, 4, 0, 0, NULL), MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("tokens");
    tok[3] = 4;
    CHECK_STATUS(mha_model_forward(m, tok, tgt, 1, 4, 0, 0, NULL), MHA_ERR_VALUE);
    CHECK_STATUS(mha_model_forward(m, tok, NULL, 1, 5, 0, 0, NULL), MHA_ERR_SHAPE);
    CHECK_STATUS(mha_model_forward(m, tok, NULL, 1, 4, 0, 0, NULL), MHA_OK);
    CHECK_STATUS(mha_model_backward(m), MHA_ERR_VALUE); /* no targets */
    mha_model_free(m);
    mha_model_free(NULL);
}

/* One training step's gradients (and the AdamW update) do not depend on the
 * thread count. */
TEST(model_step_bit_identical_any_threads) {
    mha_model_config c;
    mha_model_config_init(&c);
    c.vocab = 11, c.max_len = 12, c.dim = 32, c.heads = 4, c.ffn = 48, c.layers = 2;
    c.causal = MHA_CAUSAL_TOP_LEFT, c.dropout = 0.1f;
    float *g[3] = {NULL, NULL, NULL}, *p[3] = {NULL, NULL, NULL};
    int64_t n = 0;
    const int old = mha_get_num_threads(), threads[3] = {1, 2, 3};
    for (int t = 0; t < 3; t++) {
        mha_set_num_threads(threads[t]);
        mha_model *m;
        mha_adamw o;
        mha_adamw_options oo;
        mha_adamw_options_init(&oo);
        REQUIRE_OK(mha_model_create(&m, &c, 9));
        REQUIRE_OK(mha_adamw_create(&o, mha_model_num_params(m), &oo));
        n = mha_model_num_params(m);
        int64_t tok[8 * 12], tgt[8 * 12];
        tokens_for(tok, tgt, 8 * 12, c.vocab, 77);
        mha_model_zero_grad(m);
        REQUIRE_OK(mha_model_forward(m, tok, tgt, 8, 12, 1, 5, NULL));
        REQUIRE_OK(mha_model_backward(m));
        g[t] = malloc(sizeof(float) * (size_t)n), p[t] = malloc(sizeof(float) * (size_t)n);
        memcpy(g[t], mha_model_grads(m), sizeof(float) * (size_t)n);
        REQUIRE_OK(mha_adamw_step(&o, mha_model_params(m), mha_model_grads(m), NULL));
        memcpy(p[t], mha_model_params(m), sizeof(float) * (size_t)n);
        mha_model_free(m);
        mha_adamw_free(&o);
    }
    mha_set_num_threads(old);
    for (int t = 1; t < 3; t++) {
        CHECK(memcmp(g[0], g[t], sizeof(float) * (size_t)n) == 0);
        CHECK(memcmp(p[0], p[t], sizeof(float) * (size_t)n) == 0);
    }
    for (int t = 0; t < 3; t++)
        free(g[t]), free(p[t]);
}

/* Allocation failure at every point of a training step with the optimiser
 * and its checkpoint (save and load), and of a layer backward with an
 * internal workspace: NOMEM or OK, never a leak. */
MHA_API void mha_test_fail_alloc(int64_t k, int persistent);
MHA_API int64_t mha_test_alloc_count(void);
MHA_API int64_t mha_test_live_allocs(void);

static mha_status step_and_checkpoint(const char *wpath, const char *opath) {
    mha_model_config c;
    mha_model_config_init(&c);
    c.vocab = 6, c.max_len = 4, c.dim = 8, c.heads = 2, c.ffn = 6, c.layers = 2, c.causal = MHA_CAUSAL_TOP_LEFT;
    mha_model *m = NULL, *r = NULL;
    mha_adamw o, o2;
    memset(&o, 0, sizeof o);
    mha_adamw_options oo;
    mha_adamw_options_init(&oo);
    int64_t tok[8] = {1, 2, 3, 4, 5, 0, 1, 2}, tgt[8] = {2, 3, -1, 5, 0, 1, 2, 3};
    mha_status st = mha_model_create(&m, &c, 4);
    if (st == MHA_OK)
        st = mha_adamw_create(&o, mha_model_num_params(m), &oo);
    if (st == MHA_OK)
        st = mha_model_forward(m, tok, tgt, 2, 4, 1, 3, NULL);
    if (st == MHA_OK)
        st = mha_model_backward(m);
    if (st == MHA_OK)
        st = mha_adamw_step(&o, mha_model_params(m), mha_model_grads(m), NULL);
    if (st == MHA_OK)
        st = mha_model_save(m, wpath, opath, &o, 1, 4);
    if (st == MHA_OK) {
        st = mha_model_open(&r, wpath, opath, &o2, NULL, NULL);
        if (st == MHA_OK)
            mha_adamw_free(&o2);
        else
            CHECK(r == NULL && o2.m == NULL && o2.v == NULL);
    }
    mha_model_free(r), mha_model_free(m);
    mha_adamw_free(&o);
    return st;
}

TEST(model_allocation_failures) {
    char dir[] = "/tmp/mha_oom_XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    char wpath[64], opath[64];
    snprintf(wpath, sizeof wpath, "%s/m.safetensors", dir);
    snprintf(opath, sizeof opath, "%s/o.safetensors", dir);
    int points = 0;
    for (int persistent = 0; persistent <= 1; persistent++)
        for (int64_t k = 1; k < 10000; k++) {
            const int64_t live0 = mha_test_live_allocs(), count0 = mha_test_alloc_count();
            mha_test_fail_alloc(k, persistent);
            mha_status st = step_and_checkpoint(wpath, opath);
            mha_test_fail_alloc(0, 0);
            CHECK(mha_test_live_allocs() == live0);
            if (mha_test_alloc_count() - count0 < k) {
                CHECK_STATUS(st, MHA_OK);
                break;
            }
            points++;
            CHECK(st == MHA_ERR_NOMEM);
            if (test_failures() > 10)
                break;
        }
    CHECK(points > 20);
    unlink(wpath), unlink(opath), rmdir(dir);
}
