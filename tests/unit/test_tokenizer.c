/* test_tokenizer.c - the WordPiece tokenizer (src/text/) against the
 * Hugging Face `tokenizers` library: ids of the committed corpora
 * (tests/fixtures/tokenizer/NAME_ids.txt, gen_tokenizer_fixtures.py) for the
 * hand-made tokenizers and, when models/all-MiniLM-L6-v2 (make model) or
 * $MHA_MODEL_DIR is there, the real one; every code point's normalisation
 * and class (unicode_blocks.txt); the API's rules (truncation, capacity,
 * special tokens, NULLs); the malformed tokenizer.json corpus
 * (tests/corpus/tokenizer, expected errors in tests/corpus/tokenizer.txt);
 * allocation failures.  Builds without cJSON or utf8proc report skipped. */
#include "fixture.h"
#include "text/text.h"

#include <dirent.h>
#include <sys/stat.h>

static int tokenizer_available(const char *test) {
    mha_tokenizer *t = NULL;
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer/tiny/tokenizer.json", test_fixture_root());
    mha_status st = mha_tokenizer_open(&t, p);
    mha_tokenizer_free(t);
    if (st == MHA_ERR_UNSUPPORTED) {
        printf("skip %s: %s\n", test, mha_last_error());
        return 0;
    }
    return 1;
}

/* ---- the fixture format: "t <JSON string>\t<ids>" or "b <hex>\t<ids>" ---- */

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Decodes the text field into out (bytes, NUL allowed); returns its length or -1. */
static long decode_text(const char *s, char *out, size_t cap) {
    size_t n = 0;
    if (s[0] == 'b' && s[1] == ' ') {
        for (s += 2; hexval(s[0]) >= 0 && hexval(s[1]) >= 0 && n < cap; s += 2)
            out[n++] = (char)(hexval(s[0]) * 16 + hexval(s[1]));
        return (long)n;
    }
    if (s[0] != 't' || s[1] != ' ' || s[2] != '"')
        return -1;
    for (s += 3; *s && *s != '"' && n + 4 < cap; s++) {
        if (*s != '\\') {
            out[n++] = *s;
            continue;
        }
        s++;
        const char *esc = "\"\\/bfnrt", *val = "\"\\/\b\f\n\r\t";
        const char *e = *s ? strchr(esc, *s) : NULL;
        if (e) {
            out[n++] = val[e - esc];
            continue;
        }
        if (*s != 'u')
            return -1;
        uint32_t c = 0;
        for (int k = 1; k <= 4; k++)
            c = c * 16 + (uint32_t)hexval(s[k] | 0x20);
        s += 4;
        if (c >= 0xD800 && c < 0xDC00 && s[1] == '\\' && s[2] == 'u') {
            uint32_t lo = 0;
            for (int k = 3; k <= 6; k++)
                lo = lo * 16 + (uint32_t)hexval(s[k] | 0x20);
            c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
            s += 6;
        }
        n += (size_t)mha_utf8_put(c, out + n);
    }
    return *s == '"' ? (long)n : -1;
}

/* Compares every text of an ids file with tok's encoding (max_length 256);
 * returns the texts compared, counting mismatches into *bad. */
static int compare_ids_file(const mha_tokenizer *tok, const char *path, int *bad) {
    FILE *f = fopen(path, "r");
    if (!f) {
        test_fail(__FILE__, __LINE__, "cannot open %s", path);
        return 0;
    }
    static char line[1 << 16], text[1 << 16];
    static int32_t ids[4096];
    int texts = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#')
            continue;
        char *tab = strrchr(line, '\t');
        if (!tab) {
            test_fail(__FILE__, __LINE__, "%s: line without a tab", path);
            break;
        }
        *tab = 0;
        long len = decode_text(line, text, sizeof text);
        int32_t want[512];
        int nw = 0;
        for (char *p = tab + 1, *q; nw < 512; p = q) {
            long v = strtol(p, &q, 10);
            if (q == p)
                break;
            want[nw++] = (int32_t)v;
        }
        int64_t n = -1;
        mha_status st = len < 0 ? MHA_ERR_FORMAT
                                : mha_tokenizer_encode(tok, text, (size_t)len, 256, ids, 4096, &n);
        int same = st == MHA_OK && n == nw && !memcmp(ids, want, (size_t)nw * sizeof *ids);
        if (!same && (*bad)++ < 5) {
            fprintf(stderr, "  %s: %.60s: got", path, line);
            for (int64_t i = 0; st == MHA_OK && i < n && i < 24; i++)
                fprintf(stderr, " %d", (int)ids[i]);
            fprintf(stderr, " (%s)\n  want", st == MHA_OK ? "ok" : mha_last_error());
            for (int i = 0; i < nw && i < 24; i++)
                fprintf(stderr, " %d", (int)want[i]);
            fprintf(stderr, "\n");
        }
        texts++;
    }
    fclose(f);
    return texts;
}

static void check_corpus(const char *tokenizer_json, const char *ids_file, const char *label,
                         int64_t want_vocab) {
    mha_tokenizer *tok;
    REQUIRE_OK(mha_tokenizer_open(&tok, tokenizer_json));
    if (want_vocab)
        CHECK(mha_tokenizer_vocab_size(tok) == want_vocab);
    int bad = 0;
    int n = compare_ids_file(tok, ids_file, &bad);
    printf("tokenizer %s: %d texts compared with tokenizers, %d mismatches\n", label, n, bad);
    CHECK(n >= 700);
    CHECK(bad == 0);
    mha_tokenizer_free(tok);
}

TEST(tokenizer_ids_equal_tokenizers_hand_made) {
    if (!tokenizer_available("tokenizer_ids_equal_tokenizers_hand_made"))
        return;
    static const char *names[] = {"tiny", "tiny_cased"};
    for (int i = 0; i < 2; i++) {
        char tj[512], ids[512];
        snprintf(tj, sizeof tj, "%s/tokenizer/%s/tokenizer.json", test_fixture_root(), names[i]);
        snprintf(ids, sizeof ids, "%s/tokenizer/%s_ids.txt", test_fixture_root(), names[i]);
        check_corpus(tj, ids, names[i], 0);
    }
}

TEST(tokenizer_ids_equal_tokenizers_minilm) {
    if (!tokenizer_available("tokenizer_ids_equal_tokenizers_minilm"))
        return;
    const char *dir = getenv("MHA_MODEL_DIR");
    char tj[512], ids[512];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir ? dir : "models/all-MiniLM-L6-v2");
    struct stat sb;
    if (stat(tj, &sb) != 0) {
        printf("skip tokenizer_ids_equal_tokenizers_minilm: no %s (make model)\n", tj);
        return;
    }
    snprintf(ids, sizeof ids, "%s/tokenizer/minilm_ids.txt", test_fixture_root());
    check_corpus(tj, ids, "all-MiniLM-L6-v2", 30522);
}

/* ---- every code point: the normaliser and the classes ------------------ */

TEST(tokenizer_every_code_point_as_tokenizers) {
    if (!tokenizer_available("tokenizer_every_code_point_as_tokenizers"))
        return;
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer/unicode_blocks.txt", test_fixture_root());
    FILE *f = fopen(p, "r");
    REQUIRE(f != NULL);
    mha_bert_normalizer bert = {1, 1, 1, 1}; /* tokenizers' BertNormalizer() */
    mha_cps out = {0}, scratch = {0};
    char line[128];
    int blocks = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned block;
        unsigned long long want;
        if (line[0] == '#' || sscanf(line, "%u %llx", &block, &want) != 2)
            continue;
        uint64_t h = 0xcbf29ce484222325ull;
        for (uint32_t c = block * 1024; c < block * 1024 + 1024 && c < 0x110000; c++) {
            if (c >= 0xD800 && c <= 0xDFFF)
                continue;
            out.n = 0;
            if (mha_bert_normalize(&bert, &c, 1, &out, &scratch) != MHA_OK) {
                bad++;
                break;
            }
            char buf[256];
            size_t nb = 0;
            for (size_t i = 0; i < out.n && nb + 8 < sizeof buf; i++)
                nb += (size_t)mha_utf8_put(out.v[i], buf + nb);
            buf[nb++] = 1;
            buf[nb++] = (char)('0' + (mha_char_is_whitespace(c) ? 1 : mha_char_is_punct(c) ? 2 : 0));
            buf[nb++] = 2;
            for (size_t i = 0; i < nb; i++)
                h = (h ^ (uint8_t)buf[i]) * 0x100000001b3ull;
        }
        if (h != want && bad++ < 5)
            fprintf(stderr, "  code points %04X..%04X differ from tokenizers\n", block * 1024,
                    block * 1024 + 1023);
        blocks++;
    }
    fclose(f);
    mha_cps_free(&out);
    mha_cps_free(&scratch);
    printf("tokenizer: %d blocks of 1024 code points compared with tokenizers, %d differ\n",
           blocks, bad);
    CHECK(blocks == 1088);
    CHECK(bad == 0);
}

/* ---- the API's rules, on the hand-made tokenizer -------------------------- */

static mha_tokenizer *open_tiny(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer/tiny/tokenizer.json", test_fixture_root());
    mha_tokenizer *t = NULL;
    if (mha_tokenizer_open(&t, p) != MHA_OK)
        test_fail(__FILE__, __LINE__, "open %s: %s", p, mha_last_error());
    return t;
}

/* Encodes s (strlen unless len >= 0) and compares with the tokens named. */
static void expect_tokens(const mha_tokenizer *t, const char *s, long len, int64_t max_length,
                          const char *want) {
    int32_t ids[64];
    int64_t n;
    size_t l = len >= 0 ? (size_t)len : strlen(s);
    mha_status st = mha_tokenizer_encode(t, s, l, max_length, ids, 64, &n);
    char got[512] = "";
    for (int64_t i = 0; st == MHA_OK && i < n; i++) {
        const char *tok = mha_tokenizer_id_to_token(t, ids[i]);
        strncat(got, i ? " " : "", sizeof got - strlen(got) - 1);
        strncat(got, tok ? tok : "?", sizeof got - strlen(got) - 1);
    }
    if (st != MHA_OK || strcmp(got, want))
        test_fail(__FILE__, __LINE__, "'%s' -> '%s' (%s), want '%s'", s, got,
                  mha_status_string(st), want);
}

TEST(tokenizer_rules) {
    if (!tokenizer_available("tokenizer_rules"))
        return;
    mha_tokenizer *t = open_tiny();
    REQUIRE(t != NULL);
    expect_tokens(t, "foo[MASK]bar", -1, 0, "[CLS] f ##o ##o [MASK] b ##a ##r [SEP]");
    expect_tokens(t, "[mask]", -1, 0, "[CLS] [ mask ] [SEP]");
    expect_tokens(t, "x[PAD]", -1, 0, "[CLS] x [PAD] [SEP]");
    expect_tokens(t, "", -1, 0, "[CLS] [SEP]");
    expect_tokens(t, " \t\n\xe3\x80\x80", -1, 0, "[CLS] [SEP]");
    expect_tokens(t, "a\0b", 3, 0, "[CLS] ab [SEP]");        /* NUL deleted, no space */
    expect_tokens(t, "a\xff" "b", -1, 0, "[CLS] ab [SEP]");  /* invalid byte -> U+FFFD */
    expect_tokens(t, "Unaffable", -1, 0, "[CLS] un ##aff ##able [SEP]");
    expect_tokens(t, "\xe3\x81\x8c", -1, 0, "[CLS] \xe3\x81\x8b [SEP]"); /* ga -> ka */
    expect_tokens(t, "xxxxxxxxxxxx", -1, 0, "[CLS] x ##x ##x ##x ##x ##x ##x ##x ##x ##x ##x ##x [SEP]");
    expect_tokens(t, "xxxxxxxxxxxxx", -1, 0, "[CLS] [UNK] [SEP]"); /* 13 > 12 chars */
    expect_tokens(t, "a b c", -1, 2, "[CLS] [SEP]");
    expect_tokens(t, "a b c", -1, 4, "[CLS] a b [SEP]");
    expect_tokens(t, "a b c", -1, 5, "[CLS] a b c [SEP]");
    expect_tokens(t, "q!", -1, 0, "[CLS] q ! [SEP]");
    CHECK(mha_tokenizer_num_special(t) == 2);
    CHECK(mha_tokenizer_token_to_id(t, "[MASK]") == 4);
    CHECK(mha_tokenizer_token_to_id(t, "no such token") == -1);
    CHECK(mha_tokenizer_id_to_token(t, -1) == NULL);
    CHECK(mha_tokenizer_id_to_token(t, (int32_t)mha_tokenizer_vocab_size(t)) == NULL);
    CHECK(!strcmp(mha_tokenizer_id_to_token(t, 0), "[PAD]"));

    /* capacity: too small -> SHAPE, the need in *n, ids untouched */
    int32_t ids[8] = {-7, -7, -7, -7, -7, -7, -7, -7};
    int64_t n = 0;
    CHECK_STATUS(mha_tokenizer_encode(t, "a b c", 5, 0, ids, 4, &n), MHA_ERR_SHAPE);
    CHECK(n == 5);
    for (int i = 0; i < 8; i++)
        CHECK(ids[i] == -7);
    CHECK_STATUS(mha_tokenizer_encode(t, "a b c", 5, 0, NULL, 0, &n), MHA_ERR_SHAPE);
    CHECK(n == 5);
    CHECK_STATUS(mha_tokenizer_encode(t, "a b c", 5, 0, ids, 5, &n), MHA_OK);
    CHECK(ids[5] == -7);
    CHECK_STATUS(mha_tokenizer_encode(t, "a", 1, 1, ids, 8, &n), MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("max_length 1");
    CHECK_STATUS(mha_tokenizer_encode(NULL, "a", 1, 0, ids, 8, &n), MHA_ERR_NULL);
    CHECK_STATUS(mha_tokenizer_encode(t, NULL, 1, 0, ids, 8, &n), MHA_ERR_NULL);
    CHECK_STATUS(mha_tokenizer_encode(t, NULL, 0, 0, ids, 8, &n), MHA_OK);
    CHECK(n == 2);
    CHECK_STATUS(mha_tokenizer_encode(t, "a", 1, 0, NULL, 8, &n), MHA_ERR_NULL);
    CHECK_STATUS(mha_tokenizer_encode(t, "a", 1, 0, ids, 8, NULL), MHA_ERR_NULL);
    mha_tokenizer *none = (mha_tokenizer *)1;
    CHECK_STATUS(mha_tokenizer_open(&none, NULL), MHA_ERR_NULL);
    CHECK_STATUS(mha_tokenizer_open(&none, "tests/fixtures/tokenizer/no/such.json"), MHA_ERR_IO);
    CHECK(none == NULL);
    CHECK(mha_tokenizer_vocab_size(NULL) == 0);
    mha_tokenizer_free(NULL);
    mha_tokenizer_free(t);
}

/* ---- malformed files ------------------------------------------------------- */

TEST(tokenizer_malformed_files_fail_as_listed) {
    if (!tokenizer_available("tokenizer_malformed_files_fail_as_listed"))
        return;
    FILE *f = fopen("tests/corpus/tokenizer.txt", "r");
    REQUIRE(f != NULL);
    char line[1024];
    int checked = 0;
    char listed[128][96];
    int n_listed = 0;
    int want;
    const char *needle;
    char file[96];
    while (fixture_corpus_next(f, line, file, &want, &needle)) {
        CHECK(file[0] && want >= 0);
        if (n_listed < 128)
            strcpy(listed[n_listed++], file);
        char path[256];
        snprintf(path, sizeof path, "tests/corpus/tokenizer/%s", file);
        mha_tokenizer *t = (mha_tokenizer *)1;
        mha_status st = mha_tokenizer_open(&t, path);
        CHECK(t == NULL || st == MHA_OK);
        mha_tokenizer_free(st == MHA_OK ? t : NULL);
        if ((int)st != want || !strstr(mha_last_error(), needle) || !strstr(mha_last_error(), file))
            test_fail(__FILE__, __LINE__, "%s: got %s \"%s\", want %s \"%s\"", file,
                      mha_status_string(st), mha_last_error(), mha_status_string((mha_status)want),
                      needle);
        checked++;
    }
    fclose(f);
    printf("tokenizer: %d malformed tokenizer.json files refused as listed\n", checked);
    CHECK(checked >= 20);
    DIR *d = opendir("tests/corpus/tokenizer");
    REQUIRE(d != NULL);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int found = e->d_name[0] == '.';
        for (int i = 0; i < n_listed && !found; i++)
            found = !strcmp(listed[i], e->d_name);
        if (!found)
            test_fail(__FILE__, __LINE__, "tests/corpus/tokenizer/%s is not in tokenizer.txt",
                      e->d_name);
    }
    closedir(d);
}

/* ---- allocation failures: a clean error, nothing leaked ------------------- */

TEST(tokenizer_out_of_memory) {
    if (!tokenizer_available("tokenizer_out_of_memory"))
        return;
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer/tiny/tokenizer.json", test_fixture_root());
    int failures = 0;
    for (int64_t k = 1; k < 64; k++) {
        int64_t live = mha_test_live_allocs();
        mha_tokenizer *t = NULL;
        mha_test_fail_alloc(k, 0);
        mha_status st = mha_tokenizer_open(&t, p);
        mha_test_fail_alloc(0, 0);
        if (st != MHA_OK) {
            CHECK(st == MHA_ERR_NOMEM && t == NULL);
            CHECK(mha_test_live_allocs() == live);
            failures++;
            continue;
        }
        /* longer than the stack buffers (TK_STACK), and a 300-char word */
        char text[1200] = "";
        for (int r = 0; r < 12; r++)
            strcat(text, "Unaffable caf\xc3\xa9 [MASK] playing xxxxxxxxxxxxxxxxx ");
        memset(text + strlen(text), 'y', 300);
        static int32_t ids[2048];
        int64_t n;
        int encode_failures = 0;
        for (int64_t j = 1; j < 12; j++) {
            int64_t live2 = mha_test_live_allocs();
            mha_test_fail_alloc(j, 0);
            st = mha_tokenizer_encode(t, text, strlen(text), 0, ids, 2048, &n);
            mha_test_fail_alloc(0, 0);
            CHECK(st == MHA_OK || st == MHA_ERR_NOMEM);
            encode_failures += st == MHA_ERR_NOMEM;
            CHECK(mha_test_live_allocs() == live2);
        }
        CHECK(encode_failures >= 2);
        mha_tokenizer_free(t);
        CHECK(mha_test_live_allocs() == live);
    }
    CHECK(failures >= 5);
}
