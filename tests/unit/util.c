/* util.c - helpers shared by the unit tests. */
#include "test.h"

void test_randn(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < n; i += 2) {
        double u[2];
        for (int k = 0; k < 2; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            u[k] = ((double)(s >> 11) + 0.5) / 9007199254740992.0;
        }
        double r = sqrt(-2.0 * log(u[0])), th = 6.283185307179586 * u[1];
        x[i] = (float)(r * cos(th));
        if (i + 1 < n)
            x[i + 1] = (float)(r * sin(th));
    }
}

double test_rel_err(const float *y, const float *ref, size_t n) {
    double maxref = 0.0, maxdiff = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i]) != isnan(y[i]))
            return INFINITY;
        if (isnan(ref[i]))
            continue;
        if (isinf(ref[i]) || isinf(y[i])) {
            if (ref[i] != y[i])
                return INFINITY;
            continue;
        }
        double a = fabs((double)ref[i]);
        if (a > maxref)
            maxref = a;
        double dd = fabs((double)y[i] - (double)ref[i]);
        if (dd > maxdiff)
            maxdiff = dd;
    }
    return maxdiff / (maxref > 1.0 ? maxref : 1.0);
}

float *test_tensor(mha_tensor *t, int ndim, const int64_t *shape, uint64_t seed) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)shape[i];
    float *data = malloc((n ? n : 1) * sizeof(float));
    if (!data)
        return NULL;
    test_randn(data, n, seed);
    if (mha_tensor_init(t, MHA_F32, data, ndim, shape) != MHA_OK) {
        free(data);
        return NULL;
    }
    return data;
}

const char *test_fixture_root(void) {
    const char *env = getenv("MHA_FIXTURES");
    return env ? env : "tests/fixtures";
}
