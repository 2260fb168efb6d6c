/* test_bert_paths.c - the trained model's two GEMM routes agree: the
 * weights packed at load on the avx2 kernel (src/kernels/gemm_packed*.c,
 * the default where the CPU has AVX2+FMA) and the generic route that
 * MHA_GEMM=portable forces (the reference loops, erff GELU).  The default
 * route is checked against sentence-transformers in test_bert.c; here the
 * reference route must give the same vectors within the same bounds (max
 * |diff| <= 2e-5, cosine >= 0.99999), for texts of 1, 2, 5, 61 and 300
 * tokens (T = 369 packed, rows of every tile tail).  The same for the avx512
 * route (MHA_KERNEL=avx512: the AVX-512 attention and LayerNorm loops,
 * emulated where the CPU lacks AVX-512) against the full reference route
 * (MHA_KERNEL=ref MHA_GEMM=portable), and its refusal where it cannot run.
 * Skipped without the model or libcjson, like test_bert.c. */
#include "test.h"

#include "internal.h" /* mha_cpu_has_avx2_fma, mha_avx512_runs */

#include <unistd.h>

enum { TEXTS = 5, D = 384 };

/* The model's folder ($MHA_MODEL_DIR or models/all-MiniLM-L6-v2), or NULL
 * when its weights are not there. */
static const char *model_dir(void) {
    const char *env = getenv("MHA_MODEL_DIR");
    const char *dir = env && env[0] ? env : "models/all-MiniLM-L6-v2";
    char weights[1024];
    snprintf(weights, sizeof weights, "%s/model.safetensors", dir);
    return access(weights, R_OK) == 0 ? dir : NULL;
}

/* The model's folder, or NULL with *why (libcjson missing: no config.json
 * reader; or no weights). */
static const char *usable_model(const char **why) {
#ifndef MHA_HAVE_CJSON
    *why = "built without libcjson: mha_bert_open cannot read config.json";
    return NULL;
#endif
    const char *dir = model_dir();
    *why = "no model (models/all-MiniLM-L6-v2 or $MHA_MODEL_DIR; `make model`)";
    return dir;
}

static bool env_set(const char *name) {
    const char *v = getenv(name);
    return v && v[0];
}

/* ids of TEXTS texts packed (T), offsets (TEXTS+1): deterministic ids in
 * the vocabulary, [CLS] ... [SEP]. */
static int64_t make_ids(int32_t *ids, int64_t *off) {
    static const int64_t len[TEXTS] = {1, 2, 5, 61, 300};
    int64_t t = 0;
    off[0] = 0;
    for (int i = 0; i < TEXTS; i++) {
        for (int64_t j = 0; j < len[i]; j++)
            ids[t + j] = j == 0 ? 101 : j == len[i] - 1 ? 102 : (int32_t)(1000 + (t + j) * 37 % 28000);
        t += len[i];
        off[i + 1] = t;
    }
    return t;
}

/* A route: MHA_KERNEL and MHA_GEMM values (NULL: unset). */
typedef struct {
    const char *kernel, *gemm;
} route;

static void env_put(const char *name, const char *value) {
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

/* out (TEXTS, D): the texts of make_ids embedded on route r. */
static mha_status embed_on(mha_bert *m, route r, float *out) {
    int32_t ids[400];
    int64_t off[TEXTS + 1];
    make_ids(ids, off);
    env_put("MHA_KERNEL", r.kernel), env_put("MHA_GEMM", r.gemm);
    mha_tensor o;
    mha_tensor_init(&o, MHA_F32, out, 2, (int64_t[]){TEXTS, D});
    mha_status st = mha_bert_embed(m, &o, ids, off, TEXTS);
    unsetenv("MHA_KERNEL"), unsetenv("MHA_GEMM");
    return st;
}

/* fa, fb (TEXTS, D) on routes a and b, the model opened from dir. */
static mha_status embed_two_routes(const char *dir, route a, float *fa, route b, float *fb) {
    mha_bert *m;
    mha_status st = mha_bert_open(&m, dir);
    if (st != MHA_OK)
        return st;
    if (mha_bert_get_info(m)->hidden != D)
        st = MHA_ERR_SHAPE;
    if (st == MHA_OK)
        st = embed_on(m, a, fa);
    if (st == MHA_OK)
        st = embed_on(m, b, fb);
    mha_bert_free(m);
    return st;
}

/* Embeddings fast and ref (TEXTS, D) within max |diff| <= 2e-5 and cosine >=
 * 0.99999 per text (a failure names the fast route); returns the largest
 * |diff|. */
static double routes_agree(const char *name, const float *fast, const float *ref) {
    double any = 0;
    for (int i = 0; i < TEXTS; i++) {
        double dot = 0, na = 0, nb = 0, worst = 0;
        for (int j = 0; j < D; j++) {
            const double a = fast[i * D + j], b = ref[i * D + j];
            dot += a * b, na += a * a, nb += b * b;
            worst = fmax(worst, fabs(a - b));
        }
        const double cosine = dot / sqrt(na * nb);
        if (!(worst <= 2e-5 && cosine >= 0.99999))
            test_fail(__FILE__, __LINE__, "%s text %d: max |diff| %.3g, cosine %.8f", name, i,
                      worst, cosine);
        any = fmax(any, worst);
    }
    return any;
}

TEST(bert_packed_route_matches_reference_route) {
    const char *why, *dir = usable_model(&why);
    if (!dir)
        SKIP("%s", why);
    if (env_set("MHA_GEMM"))
        SKIP("MHA_GEMM is set: this test chooses the routes itself");
    static float fast[TEXTS * D], ref[TEXTS * D];
    REQUIRE_OK(embed_two_routes(dir, (route){NULL, NULL}, fast, (route){NULL, "portable"}, ref));
    if (!mha_cpu_has_avx2_fma())
        SKIP_PART("packed avx2 route: no AVX2+FMA here (both runs took the portable route)");
    CHECK(routes_agree("packed", fast, ref) > 0 || !mha_cpu_has_avx2_fma()); /* both ran */
}

/* ---- the avx512 encoder (issue 14) ------------------------------------------------- */

/* MHA_KERNEL=avx512 (the short-text attention's avx512 loop; emulated where
 * the CPU lacks AVX-512) against the reference route MHA_KERNEL=ref
 * MHA_GEMM=portable (mha_sdpa_forward's reference, the reference norms and
 * products): the same bounds as above, and the two really differ. */
TEST(bert_avx512_route_matches_reference_route) {
    const char *why, *dir = usable_model(&why);
    if (!dir)
        SKIP("%s", why);
    if (env_set("MHA_GEMM") || env_set("MHA_KERNEL"))
        SKIP("MHA_GEMM or MHA_KERNEL is set: this test chooses the routes itself");
    if (!mha_avx512_runs())
        SKIP("avx512: this CPU lacks AVX-512 and the test library has no emulation");
    static float fast[TEXTS * D], ref[TEXTS * D];
    REQUIRE_OK(embed_two_routes(dir, (route){"avx512", NULL}, fast, (route){"ref", "portable"},
                                ref));
    CHECK(routes_agree("avx512", fast, ref) > 0); /* two routes really ran */
}

/* MHA_KERNEL=avx512 where it cannot run (emulation off, no AVX-512):
 * MHA_ERR_UNSUPPORTED naming AVX-512 before any work, out untouched. */
TEST(bert_avx512_unsupported_is_an_error) {
    if (mha_cpu_has_avx512())
        SKIP("this CPU has AVX-512: the refusal is not reachable");
    const char *why, *dir = usable_model(&why);
    if (!dir)
        SKIP("%s", why);
    if (env_set("MHA_GEMM") || env_set("MHA_KERNEL"))
        SKIP("MHA_GEMM or MHA_KERNEL is set: this test chooses the routes itself");
    mha_bert *m;
    REQUIRE_OK(mha_bert_open(&m, dir));
    test_avx512_emulation_off();
    static float out[TEXTS * D];
    for (int e = 0; e < TEXTS * D; e++)
        out[e] = 7.0f;
    CHECK_STATUS(embed_on(m, (route){"avx512", NULL}, out), MHA_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("AVX-512");
    CHECK(out[0] == 7.0f && out[TEXTS * D - 1] == 7.0f);
    mha_bert_free(m);
    test_avx512_emulation_restore();
}
