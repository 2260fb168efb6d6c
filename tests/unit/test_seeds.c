/* test_seeds.c - the seed tutorials' claims, measured (see cli/seeds.c). */
#include "seeds.h"
#include "test.h"

static void check_claims(int64_t L, int64_t D, int64_t h, uint64_t seed) {
    seed_claim c[SEED_CLAIMS_MAX];
    int n = seed_claims_check(c, L, D, h, seed);
    REQUIRE(n == 9);
    for (int i = 0; i < n; i++)
        if (!c[i].holds)
            test_fail(__FILE__, __LINE__, "L=%lld D=%lld h=%lld: \"%s\": %s = %g, bound %g",
                      (long long)L, (long long)D, (long long)h, c[i].statement, c[i].measure,
                      c[i].measured, c[i].bound);
}

TEST(seeds_claims_hold_on_the_seed_example) { check_claims(7, 8, 2, 42); }
TEST(seeds_claims_hold_on_seed_000_sizes) { check_claims(10, 64, 8, 3); }
TEST(seeds_claims_hold_on_odd_sizes) {
    check_claims(5, 12, 3, 11);
    check_claims(1, 6, 2, 12); /* one token: a single key, weights are 1 */
    check_claims(9, 10, 5, 13);
}

TEST(seeds_walkthrough_matches_one_library_call) {
    seed_example ex;
    seed_walk walk;
    REQUIRE(seed_example_make(&ex, 7, 8, 2, 42) == 0);
    REQUIRE(seed_walk_run(&ex, &walk) == 0);
    CHECK(walk.err_vs_api <= 1e-6);
    /* each head's weights are a distribution over the 7 tokens */
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 7; i++) {
            double s = 0.0;
            for (int j = 0; j < 7; j++)
                s += walk.attn_weights[(r * 7 + i) * 7 + j];
            CHECK(fabs(s - 1.0) < 1e-6);
        }
    seed_walk_free(&walk);
    seed_example_free(&ex);
}

TEST(seeds_parameter_count_is_4D2_plus_4D) {
    for (int64_t D = 8; D <= 512; D *= 4)
        CHECK(mha_multihead_param_count(D, D, D, 1, 0) == 4 * D * D + 4 * D);
    CHECK(mha_multihead_param_count(8, 8, 8, 0, 0) == 4 * 64);
    CHECK(mha_multihead_param_count(8, 8, 8, 1, 1) == 4 * 64 + 4 * 8 + 2 * 8);
    CHECK(mha_multihead_param_count(6, 3, 5, 1, 0) == 36 + 18 + 30 + 36 + 24);
}
