/* util.c - helpers shared by the unit tests. */
#include "test.h"
#include "internal.h" /* mha_test_* allocation hooks */
#include "kernels/attention_bwd.h" /* mha_attn_bwd_rows_serve */

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

size_t test_numel(const mha_tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

size_t test_bits_differ(const float *a, const float *b, size_t n) {
    size_t k = 0;
    for (size_t e = 0; e < n; e++)
        k += memcmp(&a[e], &b[e], sizeof(float)) != 0 && !(a[e] != a[e] && b[e] != b[e]);
    return k;
}

void test_sdpa_grad_inputs(mha_tensor *q, mha_tensor *k, mha_tensor *v, mha_tensor *dout,
                           float *data[4], int64_t shape[4][4], const int64_t dims[7],
                           uint64_t seed) {
    const int64_t B = dims[0], Hq = dims[1], Hkv = dims[2], L = dims[3], S = dims[4];
    const int64_t d = dims[5], dv = dims[6]; /* B, Hq, Hkv, L, S, d, dv */
    const int64_t shapes[4][4] = {{B, Hq, L, d}, {B, Hkv, S, d}, {B, Hkv, S, dv}, {B, Hq, L, dv}};
    memcpy(shape, shapes, sizeof shapes);
    mha_tensor *t[4] = {q, k, v, dout};
    for (int x = 0; x < 4; x++)
        data[x] = test_tensor(t[x], 4, shapes[x], seed * 8 + (uint64_t)x);
}

bool test_bwd_rows_served(const mha_tensor *q, const mha_tensor *k, const mha_tensor *v,
                          const mha_tensor *dout, const mha_tensor *dq, const mha_tensor *dk,
                          const mha_tensor *dv, const mha_sdpa_options *opt) {
    mha_attn_problem p;
    mha_tensor o; /* the forward's output: its shape and checks only */
    float *od = test_tensor(&o, 4, dout->shape, 1);
    bool ok = mha_sdpa_problem_init(&p, q, k, v, &o, opt) == MHA_OK;
    const mha_tensor none = {0};
    mha_attn_grad g = {dq ? *dq : none, dk ? *dk : none, dv ? *dv : none, *dout, none, none};
    ok = ok && mha_attn_bwd_rows_serve(&p, &g);
    free(od);
    return ok;
}

const char *test_fixture_root(void) {
    const char *env = getenv("MHA_FIXTURES");
    return env ? env : "tests/fixtures";
}

bool test_kernel_runs(mha_kernel kernel) {
    static int known[8]; /* per kernel: 0 not probed, 1 runs, 2 does not */
    const int i = (int)kernel & 7;
    if (!known[i]) {
        float qd = 1.0f, kd = 1.0f, vd = 1.0f, od = 0.0f;
        const int64_t one[4] = {1, 1, 1, 1};
        mha_tensor q, k, v, o;
        mha_tensor_init(&q, MHA_F32, &qd, 4, one);
        mha_tensor_init(&k, MHA_F32, &kd, 4, one);
        mha_tensor_init(&v, MHA_F32, &vd, 4, one);
        mha_tensor_init(&o, MHA_F32, &od, 4, one);
        mha_sdpa_options opt;
        mha_sdpa_options_init(&opt);
        opt.kernel = kernel;
        known[i] = mha_sdpa_forward(&o, &q, &k, &v, &opt) == MHA_OK ? 1 : 2;
    }
    if (known[i] != 1)
        SKIP_PART("kernel %s: not in this build or on this CPU", mha_kernel_name(kernel));
    return known[i] == 1;
}

mha_tensor test_view4(float *x, int64_t a, int64_t b, int64_t c, int64_t d) {
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, x, 4, (int64_t[]){a, b, c, d});
    return t;
}

double test_max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(a[i]) != isnan(b[i]) || (isinf(a[i]) && a[i] != b[i]))
            return INFINITY;
        if (!isinf(a[i]) && d > m)
            m = d;
    }
    return m;
}

void test_alloc_failures(const char *name, mha_status (*call)(void)) {
    int64_t points = 0;
    for (int persistent = 0; persistent <= 1; persistent++)
        for (int64_t k = 1; k < 1000; k++) {
            int64_t live0 = mha_test_live_allocs(), count0 = mha_test_alloc_count();
            mha_test_fail_alloc(k, persistent);
            mha_status st = call();
            mha_test_fail_alloc(0, 0);
            if (mha_test_live_allocs() != live0)
                test_fail(__FILE__, __LINE__, "%s: k=%lld leaked", name, (long long)k);
            if (mha_test_alloc_count() - count0 < k) {
                if (st != MHA_OK)
                    test_fail(__FILE__, __LINE__, "%s: %s", name, mha_last_error());
                break;
            }
            points++;
            if (st != MHA_ERR_NOMEM || !mha_last_error()[0])
                test_fail(__FILE__, __LINE__, "%s: k=%lld -> %s, want NOMEM", name, (long long)k,
                          mha_status_string(st));
        }
    if (points == 0)
        test_fail(__FILE__, __LINE__, "%s: no allocation failure was injected", name);
}

char *test_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    fclose(f);
    if (s) {
        s[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    return s;
}

int test_count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static char avx512_saved[32];
static bool avx512_was_set;

void test_avx512_emulation_off(void) {
    const char *v = getenv("MHA_TEST_AVX512");
    avx512_was_set = v != NULL;
    if (v)
        snprintf(avx512_saved, sizeof avx512_saved, "%s", v);
    unsetenv("MHA_TEST_AVX512");
}

void test_avx512_emulation_restore(void) {
    if (avx512_was_set)
        setenv("MHA_TEST_AVX512", avx512_saved, 1);
}

void test_rounding_inputs(float *x, int n) {
    test_randn(x, (size_t)n, 77);
    for (int i = 0; i < n; i++)
        x[i] = i % 3 == 0 ? fabsf(x[i]) : i % 3 == 1 ? expf(-fabsf(x[i]) * 12.0f)
                                                     : ldexpf(1.0f + (float)(i % 64) / 64.0f, -(i % 30));
    x[0] = 0.0f, x[1] = 1.0f, x[2] = INFINITY, x[3] = 1.0f + 1.0f / 256.0f; /* a bf16 tie */
    x[4] = 6e-8f, x[5] = 70000.0f, x[6] = NAN, x[7] = -NAN;                 /* fp16 subnormal, overflow */
    x[8] = 1e-40f, x[9] = 1.0f + 3.0f / 256.0f; /* a float subnormal, a bf16 tie rounding up */
    /* NaNs whose payload is only in the low half (signalling): the rounding
     * add alone would make 0x7f800001 an infinity, 0x7fffffff carry into
     * the sign */
    const uint32_t nans[3] = {0x7f800001u, 0xff80ffffu, 0x7fffffffu};
    for (int i = 0; i < 3; i++)
        memcpy(&x[10 + 20 * i], &nans[i], sizeof(float));
}

float *test_float_mask(int64_t L, int64_t S, uint64_t seed) {
    float *m = malloc(sizeof(float) * (size_t)(L * S));
    if (!m)
        return NULL;
    test_randn(m, (size_t)(L * S), seed);
    for (int64_t e = 0; e < L * S; e++)
        if (e % 5 == 2)
            m[e] = -INFINITY;
    return m;
}
