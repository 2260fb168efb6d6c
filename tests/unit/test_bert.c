/* test_bert.c - the trained sentence encoder (src/bert.c) on the real
 * all-MiniLM-L6-v2 against sentence-transformers (tests/fixtures/bert/,
 * from tests/fixtures/gen_embedding_fixtures.py), the bits that must not
 * depend on batch or threads, and model files that are wrong.
 *
 * The model lives in models/all-MiniLM-L6-v2 (`make model`) or
 * $MHA_MODEL_DIR; without it every test here prints "skip" and passes.
 * Letters: T packed tokens, n texts, D = 384. */
#include "test.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FIX "tests/fixtures/bert/"

static const char *model_dir(void) {
    const char *env = getenv("MHA_MODEL_DIR");
    const char *dir = env && env[0] ? env : "models/all-MiniLM-L6-v2";
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    return access(p, R_OK) == 0 ? dir : NULL;
}

/* True (and the test counted as skipped) when the model cannot load here:
 * no model directory, or a build without libcjson (config.json reader). */
static bool skip_without_model(const char *test) {
    (void)test;
#ifndef MHA_HAVE_CJSON
    test_skip(1, "built without libcjson: mha_bert_open cannot read config.json");
    return true;
#else
    if (model_dir())
        return false;
    test_skip(1, "no model (models/all-MiniLM-L6-v2 or $MHA_MODEL_DIR; `make model`)");
    return true;
#endif
}

/* The fixture: packed ids (T) as int32, offsets (n+1), embeddings (n,D). */
typedef struct bert_fixture {
    int32_t *ids;
    int64_t *offsets;
    int64_t n, T;
    mha_tensor ref;
} bert_fixture;

static bool fixture_load_bert(bert_fixture *f) {
    memset(f, 0, sizeof *f);
    mha_tensor ids, off;
    if (mha_npy_load(&ids, FIX "ids.npy", MHA_I64) != MHA_OK)
        return false;
    if (mha_npy_load(&off, FIX "offsets.npy", MHA_I64) != MHA_OK) {
        mha_tensor_free(&ids);
        return false;
    }
    if (mha_npy_load(&f->ref, FIX "embeddings.npy", MHA_F32) != MHA_OK) {
        mha_tensor_free(&ids);
        mha_tensor_free(&off);
        return false;
    }
    f->T = ids.shape[0];
    f->n = off.shape[0] - 1;
    f->ids = malloc(sizeof(int32_t) * (size_t)f->T);
    f->offsets = malloc(sizeof(int64_t) * (size_t)(f->n + 1));
    for (int64_t t = 0; t < f->T; t++)
        f->ids[t] = (int32_t)((int64_t *)ids.data)[t];
    memcpy(f->offsets, off.data, sizeof(int64_t) * (size_t)(f->n + 1));
    mha_tensor_free(&ids);
    mha_tensor_free(&off);
    return true;
}

static void fixture_free_bert(bert_fixture *f) {
    free(f->ids);
    free(f->offsets);
    mha_tensor_free(&f->ref);
}

/* out (n,D) = the embeddings of texts [i0, i0+n) of f in one call. */
static mha_status embed_range(mha_bert *m, const bert_fixture *f, int64_t i0, int64_t n,
                              float *out) {
    const int64_t D = mha_bert_get_info(m)->hidden;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(n + 1));
    for (int64_t i = 0; i <= n; i++)
        off[i] = f->offsets[i0 + i] - f->offsets[i0];
    mha_tensor o;
    mha_tensor_init(&o, MHA_F32, out, 2, (int64_t[]){n, D});
    mha_status st = mha_bert_embed(m, &o, f->ids + f->offsets[i0], off, n);
    free(off);
    return st;
}

TEST(bert_info_from_config) {
    if (skip_without_model("bert_info_from_config"))
        return;
    mha_bert *m = NULL;
    REQUIRE_OK(mha_bert_open(&m, model_dir()));
    const mha_bert_info *c = mha_bert_get_info(m);
    CHECK(c->hidden == 384 && c->heads == 12 && c->layers == 6 && c->intermediate == 1536);
    CHECK(c->vocab == 30522 && c->max_positions == 512 && c->max_seq_length == 256);
    CHECK(c->type_vocab == 2 && c->layer_norm_eps == 1e-12f);
    CHECK(c->pooling == MHA_BERT_POOL_MEAN && c->normalize == 1);
    mha_bert_free(m);
}

/* Every text: cosine >= 0.99999 and max|diff| <= 2e-5 against
 * SentenceTransformer.encode, row norm 1 within 1e-6.  The fixture has
 * empty and blank texts, typed [PAD] (id 0, attended), multilingual text and
 * texts truncated at 256 tokens. */
TEST(bert_embeddings_match_sentence_transformers) {
    if (skip_without_model("bert_embeddings_match_sentence_transformers"))
        return;
    bert_fixture f;
    REQUIRE(fixture_load_bert(&f));
    mha_bert *m = NULL;
    REQUIRE_OK(mha_bert_open(&m, model_dir()));
    const int64_t D = mha_bert_get_info(m)->hidden;
    REQUIRE(f.ref.shape[0] == f.n && f.ref.shape[1] == D);
    float *out = malloc(sizeof(float) * (size_t)(f.n * D));
    REQUIRE(out);
    CHECK_STATUS(embed_range(m, &f, 0, f.n, out), MHA_OK);
    double worst_cos = 1, worst_diff = 0, worst_norm = 0;
    int64_t max_len = 0, pads = 0;
    for (int64_t i = 0; i < f.n; i++) {
        const float *y = out + i * D, *r = (const float *)f.ref.data + i * D;
        double yr = 0, yy = 0, rr = 0, diff = 0;
        for (int64_t j = 0; j < D; j++) {
            yr += (double)y[j] * r[j], yy += (double)y[j] * y[j], rr += (double)r[j] * r[j];
            diff = fabs(y[j] - r[j]) > diff ? fabs(y[j] - r[j]) : diff;
        }
        double cos = yr / sqrt(yy * rr), norm_err = fabs(sqrt(yy) - 1);
        if (cos < 0.99999 || diff > 2e-5 || norm_err > 1e-6)
            test_fail(__FILE__, __LINE__, "text %lld: cosine %.8f, max|diff| %.3g, |norm-1| %.3g",
                      (long long)i, cos, diff, norm_err);
        worst_cos = cos < worst_cos ? cos : worst_cos;
        worst_diff = diff > worst_diff ? diff : worst_diff;
        worst_norm = norm_err > worst_norm ? norm_err : worst_norm;
        int64_t L = f.offsets[i + 1] - f.offsets[i];
        max_len = L > max_len ? L : max_len;
    }
    for (int64_t t = 0; t < f.T; t++)
        pads += f.ids[t] == 0;
    CHECK(max_len == 256); /* a text was truncated as sentence-transformers does */
    CHECK(pads >= 4);      /* typed [PAD] tokens are in the fixture, and they matched */
    if (getenv("MHA_TEST_VERBOSE"))
        printf("bert parity: %lld texts, worst cosine %.9f, max|diff| %.3g, |norm-1| %.3g\n",
               (long long)f.n, worst_cos, worst_diff, worst_norm);
    free(out);
    mha_bert_free(m);
    fixture_free_bert(&f);
}

/* Row i depends only on text i: bit-identical for 1, 2, 3 threads and for
 * each text alone (batch 1), groups of 3, and all in one call (batch 64),
 * on the fixture's first 24 texts (short, empty, blank, [PAD]; kept small:
 * the suite runs on shared cores). */
TEST(bert_bits_independent_of_batch_and_threads) {
    if (skip_without_model("bert_bits_independent_of_batch_and_threads"))
        return;
    bert_fixture f;
    REQUIRE(fixture_load_bert(&f));
    mha_bert *m = NULL;
    REQUIRE_OK(mha_bert_open(&m, model_dir()));
    const int64_t D = mha_bert_get_info(m)->hidden, n = f.n < 24 ? f.n : 24;
    const size_t bytes = sizeof(float) * (size_t)(n * D);
    float *all = malloc(bytes), *other = malloc(bytes);
    REQUIRE(all && other);
    int saved = mha_get_num_threads();
    mha_set_num_threads(1);
    CHECK_STATUS(embed_range(m, &f, 0, n, all), MHA_OK);
    /* (threads, texts per call): 1, 2 and 3 threads; batches 1, 3 and 64 */
    const int runs[][2] = {{2, 64}, {3, 64}, {1, 1}, {2, 3}, {3, 1}};
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        mha_set_num_threads(runs[r][0]);
        memset(other, 0xff, bytes);
        for (int64_t i0 = 0; i0 < n; i0 += runs[r][1]) {
            int64_t k = n - i0 < runs[r][1] ? n - i0 : runs[r][1];
            CHECK_STATUS(embed_range(m, &f, i0, k, other + i0 * D), MHA_OK);
        }
        if (memcmp(all, other, bytes) != 0)
            test_fail(__FILE__, __LINE__, "threads %d, batch %d: bits differ", runs[r][0],
                      runs[r][1]);
    }
    /* the same text twice in one call, and a long text beside short ones */
    mha_set_num_threads(2);
    int64_t L = f.offsets[1];
    int32_t *twice = malloc(sizeof(int32_t) * (size_t)(2 * L));
    memcpy(twice, f.ids, sizeof(int32_t) * (size_t)L);
    memcpy(twice + L, f.ids, sizeof(int32_t) * (size_t)L);
    float two[2 * 384];
    mha_tensor o;
    mha_tensor_init(&o, MHA_F32, two, 2, (int64_t[]){2, D});
    CHECK_STATUS(mha_bert_embed(m, &o, twice, (int64_t[]){0, L, 2 * L}, 2), MHA_OK);
    CHECK(memcmp(two, all, sizeof(float) * (size_t)D) == 0);
    CHECK(memcmp(two + D, all, sizeof(float) * (size_t)D) == 0);
    free(twice);
    mha_set_num_threads(saved);
    free(all);
    free(other);
    mha_bert_free(m);
    fixture_free_bert(&f);
}

/* Cheap algebraic checks on the inspection entry points: attention rows sum
 * to 1; the last hidden state, mean-pooled and normalised, is the embedding. */
TEST(bert_attention_and_hidden) {
    if (skip_without_model("bert_attention_and_hidden"))
        return;
    bert_fixture f;
    REQUIRE(fixture_load_bert(&f));
    mha_bert *m = NULL;
    REQUIRE_OK(mha_bert_open(&m, model_dir()));
    const mha_bert_info *c = mha_bert_get_info(m);
    const int64_t D = c->hidden, H = c->heads, i = 5, L = f.offsets[i + 1] - f.offsets[i];
    float *w = malloc(sizeof(float) * (size_t)(H * L * L)), *x = malloc(sizeof(float) * (size_t)(L * D));
    REQUIRE(w && x);
    mha_tensor W, X;
    mha_tensor_init(&W, MHA_F32, w, 3, (int64_t[]){H, L, L});
    mha_tensor_init(&X, MHA_F32, x, 2, (int64_t[]){L, D});
    CHECK_STATUS(mha_bert_attention(m, &W, f.ids + f.offsets[i], L, c->layers - 1), MHA_OK);
    double worst = 0;
    for (int64_t r = 0; r < H * L; r++) {
        double s = 0;
        for (int64_t j = 0; j < L; j++)
            s += w[r * L + j];
        worst = fabs(s - 1) > worst ? fabs(s - 1) : worst;
    }
    CHECK(worst < 1e-5);
    CHECK_STATUS(mha_bert_hidden(m, &X, f.ids + f.offsets[i], L, c->layers), MHA_OK);
    double ss = 0, pooled[384];
    for (int64_t j = 0; j < D; j++) {
        pooled[j] = 0;
        for (int64_t t = 0; t < L; t++)
            pooled[j] += x[t * D + j];
        ss += pooled[j] * pooled[j];
    }
    double diff = 0;
    const float *ref = (const float *)f.ref.data + i * D;
    for (int64_t j = 0; j < D; j++)
        diff = fmax(diff, fabs(pooled[j] / sqrt(ss) - ref[j]));
    CHECK(diff < 2e-5);
    /* layer out of range, wrong shapes */
    CHECK_STATUS(mha_bert_attention(m, &W, f.ids, L, c->layers), MHA_ERR_VALUE);
    CHECK_STATUS(mha_bert_hidden(m, &X, f.ids, L, c->layers + 1), MHA_ERR_VALUE);
    CHECK_STATUS(mha_bert_hidden(m, &X, f.ids, L - 1, 0), MHA_ERR_SHAPE);
    free(w);
    free(x);
    mha_bert_free(m);
    fixture_free_bert(&f);
}

/* Bad packed ids are refused before anything is written. */
TEST(bert_embed_bad_ids) {
    if (skip_without_model("bert_embed_bad_ids"))
        return;
    mha_bert *m = NULL;
    REQUIRE_OK(mha_bert_open(&m, model_dir()));
    float out[2 * 384];
    for (int i = 0; i < 2 * 384; i++)
        out[i] = 7.0f;
    mha_tensor o;
    mha_tensor_init(&o, MHA_F32, out, 2, (int64_t[]){2, 384});
    int32_t ids[4] = {101, 7592, 30522, 102};
    CHECK_STATUS(mha_bert_embed(m, &o, ids, (int64_t[]){0, 2, 4}, 2), MHA_ERR_VALUE);
    CHECK(strstr(mha_last_error(), "vocabulary") != NULL);
    ids[2] = -1;
    CHECK_STATUS(mha_bert_embed(m, &o, ids, (int64_t[]){0, 2, 4}, 2), MHA_ERR_VALUE);
    ids[2] = 2088;
    CHECK_STATUS(mha_bert_embed(m, &o, ids, (int64_t[]){0, 0, 4}, 2), MHA_ERR_VALUE); /* empty */
    CHECK_STATUS(mha_bert_embed(m, &o, ids, (int64_t[]){1, 2, 4}, 2), MHA_ERR_VALUE);
    CHECK_STATUS(mha_bert_embed(m, &o, ids, (int64_t[]){0, 3, 2}, 2), MHA_ERR_VALUE);
    CHECK_STATUS(mha_bert_embed(m, &o, ids, (int64_t[]){0, 4}, 1), MHA_ERR_SHAPE);
    int32_t *many = calloc(513, sizeof(int32_t));
    mha_tensor o1;
    mha_tensor_init(&o1, MHA_F32, out, 2, (int64_t[]){1, 384});
    CHECK_STATUS(mha_bert_embed(m, &o1, many, (int64_t[]){0, 513}, 1), MHA_ERR_VALUE);
    CHECK(strstr(mha_last_error(), "max_position_embeddings") != NULL);
    free(many);
    int unchanged = 1;
    for (int i = 0; i < 2 * 384; i++)
        unchanged &= out[i] == 7.0f;
    CHECK(unchanged);
    CHECK_STATUS(mha_bert_embed(NULL, &o, ids, (int64_t[]){0, 2, 4}, 2), MHA_ERR_NULL);
    mha_bert_free(m);
}

/* ---- model files that are wrong ------------------------------------------------- */

static char tmp_root[256];

/* A scratch model directory: symlinks to the real files except `except`
 * (relative name), which the caller writes.  Returns its path. */
static const char *scratch_model(const char *name, const char *except) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmp_root, name);
    mkdir(dir, 0700);
    char sub[600];
    snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
    mkdir(sub, 0700);
    const char *files[] = {"config.json", "model.safetensors", "modules.json",
                           "1_Pooling/config.json", "sentence_bert_config.json",
                           "tokenizer.json"};
    char real[1024], link[1024], cwd[512];
    if (!getcwd(cwd, sizeof cwd))
        return dir;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        if (except && !strcmp(files[i], except))
            continue;
        const char *md = model_dir();
        snprintf(real, sizeof real, "%s%s%s/%s", md[0] == '/' ? "" : cwd, md[0] == '/' ? "" : "/",
                 md, files[i]);
        snprintf(link, sizeof link, "%s/%s", dir, files[i]);
        if (symlink(real, link) != 0 && errno != EEXIST)
            test_fail(__FILE__, __LINE__, "symlink %s: %s", link, strerror(errno));
    }
    return dir;
}

static void write_file(const char *dir, const char *name, const void *data, size_t n) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, n, f) != n)
        test_fail(__FILE__, __LINE__, "cannot write %s", p);
    if (f)
        fclose(f);
}

/* config.json of the real model with `from` replaced by `to`. */
static void write_config_edit(const char *dir, const char *from, const char *to) {
    char p[1024], buf[4096];
    snprintf(p, sizeof p, "%s/config.json", model_dir());
    FILE *f = fopen(p, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    char *at = strstr(buf, from), out[4200];
    if (!at) {
        test_fail(__FILE__, __LINE__, "config.json has no '%s'", from);
        return;
    }
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
    write_file(dir, "config.json", out, strlen(out));
}

/* The first `keep` bytes of the real model.safetensors. */
static void write_truncated_weights(const char *dir, size_t keep) {
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", model_dir());
    FILE *f = fopen(p, "rb");
    char *buf = malloc(keep);
    size_t n = f && buf ? fread(buf, 1, keep, f) : 0;
    if (f)
        fclose(f);
    write_file(dir, "model.safetensors", buf, n);
    free(buf);
}

static void remove_tree(const char *dir) {
    /* only what scratch_model and the writers made: fixed names */
    const char *files[] = {"config.json", "model.safetensors", "modules.json",
                           "1_Pooling/config.json", "sentence_bert_config.json",
                           "tokenizer.json"};
    char p[1024];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/1_Pooling", dir);
    rmdir(p);
    rmdir(dir);
}

/* One failure class per case: the status and a word the message must hold. */
static void expect_open_fails(const char *dir, mha_status want, const char *needle) {
    mha_bert *m = (mha_bert *)1;
    mha_status st = mha_bert_open(&m, dir);
    if (st != want || m != NULL || !strstr(mha_last_error(), needle))
        test_fail(__FILE__, __LINE__, "%s: got %s \"%s\", want %s mentioning \"%s\"", dir,
                  mha_status_string(st), mha_last_error(), mha_status_string(want), needle);
    if (st == MHA_OK)
        mha_bert_free(m);
}

TEST(bert_open_bad_model_files) {
    if (skip_without_model("bert_open_bad_model_files"))
        return;
    snprintf(tmp_root, sizeof tmp_root, "%s/mha-bert.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    REQUIRE(mkdtemp(tmp_root));
    static const struct {
        const char *name, *file, *from, *to;
        mha_status want;
        const char *needle;
    } edits[] = {
        {"hidden", "config.json", "\"hidden_size\": 384", "\"hidden_size\": 372", MHA_ERR_FORMAT,
         "hidden_size 372"},
        {"ffn", "config.json", "\"intermediate_size\": 1536", "\"intermediate_size\": 1024",
         MHA_ERR_FORMAT, "intermediate.dense.weight"},
        {"vocab", "config.json", "\"vocab_size\": 30522", "\"vocab_size\": 30000",
         MHA_ERR_FORMAT, "word_embeddings"},
        {"layers7", "config.json", "\"num_hidden_layers\": 6", "\"num_hidden_layers\": 7",
         MHA_ERR_FORMAT, "encoder.layer.6.attention.self.query.weight' missing"},
        {"layers5", "config.json", "\"num_hidden_layers\": 6", "\"num_hidden_layers\": 5",
         MHA_ERR_FORMAT, "num_hidden_layers is 5"},
        {"heads", "config.json", "\"num_attention_heads\": 12", "\"num_attention_heads\": 7",
         MHA_ERR_FORMAT, "multiple"},
        {"act", "config.json", "\"hidden_act\": \"gelu\"", "\"hidden_act\": \"relu\"",
         MHA_ERR_UNSUPPORTED, "hidden_act"},
        {"arch", "config.json", "\"BertModel\"", "\"GPT2Model\"", MHA_ERR_UNSUPPORTED,
         "not a BERT"},
        {"eps", "config.json", "\"layer_norm_eps\": 1e-12", "\"layer_norm_eps\": -1",
         MHA_ERR_FORMAT, "layer_norm_eps"},
        {"size", "config.json", "\"hidden_size\": 384", "\"hidden_size\": 3.5", MHA_ERR_FORMAT,
         "hidden_size"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        const char *dir = scratch_model(edits[i].name, edits[i].file);
        write_config_edit(dir, edits[i].from, edits[i].to);
        expect_open_fails(dir, edits[i].want, edits[i].needle);
        remove_tree(dir);
    }
    /* config.json not JSON, or not an object */
    const char *dir = scratch_model("notjson", "config.json");
    write_file(dir, "config.json", "{\"hidden_size\": 384,", 20);
    expect_open_fails(dir, MHA_ERR_FORMAT, "not JSON");
    write_file(dir, "config.json", "[1, 2]", 6);
    expect_open_fails(dir, MHA_ERR_FORMAT, "not a JSON object");
    remove_tree(dir);
    /* model.safetensors cut short: in the header, and in the data */
    dir = scratch_model("trunc", "model.safetensors");
    write_truncated_weights(dir, 4);
    expect_open_fails(dir, MHA_ERR_FORMAT, "model.safetensors");
    write_truncated_weights(dir, 1 << 20);
    expect_open_fails(dir, MHA_ERR_FORMAT, "model.safetensors");
    remove_tree(dir);
    /* files missing */
    dir = scratch_model("noweights", "model.safetensors");
    expect_open_fails(dir, MHA_ERR_IO, "model.safetensors");
    remove_tree(dir);
    dir = scratch_model("noconfig", "config.json");
    expect_open_fails(dir, MHA_ERR_IO, "config.json");
    remove_tree(dir);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/does-not-exist", tmp_root);
    expect_open_fails(missing, MHA_ERR_IO, "config.json");
    /* modules and pooling mha does not run */
    dir = scratch_model("dense", "modules.json");
    const char *dense = "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers."
                        "models.Transformer\"},{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\","
                        "\"type\":\"sentence_transformers.models.Pooling\"},{\"idx\":2,\"name\":"
                        "\"2\",\"path\":\"2_Dense\",\"type\":\"sentence_transformers.models.Dense\"}]";
    write_file(dir, "modules.json", dense, strlen(dense));
    expect_open_fails(dir, MHA_ERR_UNSUPPORTED, "Dense");
    write_file(dir, "modules.json", "{}", 2);
    expect_open_fails(dir, MHA_ERR_FORMAT, "not a JSON array");
    remove_tree(dir);
    dir = scratch_model("maxpool", "1_Pooling/config.json");
    const char *maxpool = "{\"word_embedding_dimension\": 384, \"pooling_mode_cls_token\": false,"
                          " \"pooling_mode_mean_tokens\": false, \"pooling_mode_max_tokens\": true}";
    write_file(dir, "1_Pooling/config.json", maxpool, strlen(maxpool));
    expect_open_fails(dir, MHA_ERR_UNSUPPORTED, "pooling");
    remove_tree(dir);
    /* CLS pooling loads (and gives the first token's vector, normalised) */
    dir = scratch_model("cls", "1_Pooling/config.json");
    const char *cls = "{\"word_embedding_dimension\": 384, \"pooling_mode_cls_token\": true,"
                      " \"pooling_mode_mean_tokens\": false}";
    write_file(dir, "1_Pooling/config.json", cls, strlen(cls));
    mha_bert *m = NULL;
    CHECK_STATUS(mha_bert_open(&m, dir), MHA_OK);
    if (m) {
        CHECK(mha_bert_get_info(m)->pooling == MHA_BERT_POOL_CLS);
        float e[384], x[3 * 384];
        int32_t ids[3] = {101, 7592, 102};
        mha_tensor E, X;
        mha_tensor_init(&E, MHA_F32, e, 2, (int64_t[]){1, 384});
        mha_tensor_init(&X, MHA_F32, x, 2, (int64_t[]){3, 384});
        CHECK_STATUS(mha_bert_embed(m, &E, ids, (int64_t[]){0, 3}, 1), MHA_OK);
        CHECK_STATUS(mha_bert_hidden(m, &X, ids, 3, 6), MHA_OK);
        double ss = 0, diff = 0;
        for (int j = 0; j < 384; j++)
            ss += (double)x[j] * x[j];
        for (int j = 0; j < 384; j++)
            diff = fmax(diff, fabs(x[j] / sqrt(ss) - e[j]));
        CHECK(diff < 1e-6);
        mha_bert_free(m);
    }
    remove_tree(dir);
    rmdir(tmp_root);
}
