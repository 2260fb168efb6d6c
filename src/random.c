/* random.c - the library's randomness, all counter-based: SplitMix64 (the one
 * copy), normal samples (weights, demos, tests) and the dropout hash. */
#include "internal.h"

#include <math.h>

/* SplitMix64 finaliser; ref: Steele, Lea, Flood, OOPSLA 2014. */
uint64_t mha_splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void mha_randn(float *x, int64_t n, uint64_t seed, float std) {
    /* Box-Muller on pairs: element pair (2k, 2k+1) uses counter k. */
    const uint64_t key = mha_splitmix64(seed ^ 0x6D68615F72616E64ull); /* "mha_rand" */
    for (int64_t k = 0; 2 * k < n; k++) {
        uint64_t a = mha_splitmix64(key ^ (uint64_t)(2 * k)),
                 b = mha_splitmix64(key ^ (uint64_t)(2 * k + 1));
        double u1 = ((double)(a >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
        x[2 * k] = (float)(std * r * cos(th));
        if (2 * k + 1 < n)
            x[2 * k + 1] = (float)(std * r * sin(th));
    }
}

float mha_dropout_uniform(uint64_t seed, int64_t b, int64_t h, int64_t i, int64_t j) {
    uint64_t x = mha_splitmix64(seed);
    x = mha_splitmix64(x ^ (uint64_t)b);
    x = mha_splitmix64(x ^ (uint64_t)h);
    x = mha_splitmix64(x ^ (uint64_t)i);
    x = mha_splitmix64(x ^ (uint64_t)j);
    return (float)(x >> 40) * (1.0f / 16777216.0f); /* 24 random bits */
}
