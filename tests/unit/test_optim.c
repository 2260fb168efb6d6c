/* test_optim.c - AdamW and clip_grad_norm_ against torch.optim.AdamW
 * (tests/fixtures/adamw, gen_layer_grad_fixtures.py): parameters after every
 * step and the final moments, max|x - ref| <= 1e-6 * max(1, max|ref|). */
#include "fixture.h"
#include "internal.h"

TEST(optim_adamw_matches_torch) {
    char names[16][128];
    int n_cases = fixture_list("adamw", names, 16);
    CHECK(n_cases >= 5);
    double worst = 0.0;
    for (int c = 0; c < n_cases; c++) {
        fixture f;
        REQUIRE(fixture_open(&f, "adamw", names[c]));
        mha_tensor p0, grads, params, m, v;
        REQUIRE_OK(fixture_load(&f, "params0.npy", MHA_F32, &p0));
        REQUIRE_OK(fixture_load(&f, "grads.npy", MHA_F32, &grads));
        REQUIRE_OK(fixture_load(&f, "params.npy", MHA_F32, &params));
        REQUIRE_OK(fixture_load(&f, "exp_avg.npy", MHA_F32, &m));
        REQUIRE_OK(fixture_load(&f, "exp_avg_sq.npy", MHA_F32, &v));
        const int64_t n = fixture_int(&f, "n"), steps = fixture_int(&f, "steps");
        mha_adamw_options o;
        mha_adamw_options_init(&o);
        o.lr = atof(fixture_str(&f, "lr"));
        o.beta1 = atof(fixture_str(&f, "beta1"));
        o.beta2 = atof(fixture_str(&f, "beta2"));
        o.eps = atof(fixture_str(&f, "eps"));
        o.weight_decay = atof(fixture_str(&f, "weight_decay"));
        o.max_grad_norm = atof(fixture_str(&f, "max_grad_norm"));
        mha_adamw a;
        REQUIRE_OK(mha_adamw_create(&a, n, &o));
        float *p = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n);
        memcpy(p, p0.data, sizeof(float) * n);
        for (int64_t s = 0; s < steps; s++) {
            memcpy(g, (float *)grads.data + s * n, sizeof(float) * n);
            double norm;
            CHECK_STATUS(mha_adamw_step(&a, p, g, &norm), MHA_OK);
            CHECK(norm > 0.0);
            double e = test_rel_err(p, (float *)params.data + s * n, n);
            worst = fmax(worst, e);
            if (e > 1e-6)
                printf("    %s step %lld: error %.3g\n", names[c], (long long)s + 1, e);
            CHECK(e <= 1e-6);
        }
        CHECK(a.step == steps);
        CHECK(test_rel_err(a.m, m.data, n) <= 1e-6);
        CHECK(test_rel_err(a.v, v.data, n) <= 1e-6);
        mha_adamw_free(&a);
        free(p), free(g);
        mha_tensor_free(&p0), mha_tensor_free(&grads), mha_tensor_free(&params);
        mha_tensor_free(&m), mha_tensor_free(&v);
    }
    printf("    adamw: %d cases, worst error %.3g\n", n_cases, worst);
}

TEST(optim_clip_and_errors) {
    float g[4] = {3, 4, 0, 0};
    double norm;
    CHECK_STATUS(mha_grad_clip_norm(g, 4, 1.0, &norm), MHA_OK);
    CHECK(fabs(norm - 5.0) < 1e-12);
    CHECK(fabsf(g[0] - 0.6f) < 1e-6f && fabsf(g[1] - 0.8f) < 1e-6f);
    float h[2] = {0.3f, 0.4f};
    CHECK_STATUS(mha_grad_clip_norm(h, 2, 1.0, &norm), MHA_OK);
    CHECK(h[0] == 0.3f && h[1] == 0.4f); /* under the limit: untouched */
    mha_adamw a;
    mha_adamw_options o;
    mha_adamw_options_init(&o);
    CHECK(o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.999 && o.eps == 1e-8 &&
          o.weight_decay == 1e-2);
    o.beta1 = 1.0;
    CHECK_STATUS(mha_adamw_create(&a, 4, &o), MHA_ERR_VALUE);
    o.beta1 = 0.9, o.lr = NAN;
    CHECK_STATUS(mha_adamw_create(&a, 4, &o), MHA_ERR_VALUE);
    o.lr = 1e-3;
    CHECK_STATUS(mha_adamw_create(&a, -1, &o), MHA_ERR_OVERFLOW);
    CHECK_STATUS(mha_adamw_create(NULL, 4, &o), MHA_ERR_NULL);
    mha_test_fail_alloc(1, 0);
    CHECK_STATUS(mha_adamw_create(&a, 4, &o), MHA_ERR_NOMEM);
    mha_test_fail_alloc(0, 0);
    REQUIRE_OK(mha_adamw_create(&a, 4, &o));
    CHECK_STATUS(mha_adamw_step(&a, NULL, g, NULL), MHA_ERR_NULL);
    mha_adamw_free(&a);
    mha_adamw_free(&a); /* twice is fine */
}
