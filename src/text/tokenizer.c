/* tokenizer.c - a WordPiece tokenizer from a Hugging Face tokenizer.json,
 * giving the ids the `tokenizers` library gives (tokenizers/src: added
 * vocabulary, normalizers/bert.rs, pre_tokenizers/bert.rs,
 * models/wordpiece, processors/template.rs).
 *
 * WHAT IS READ (tokenizer.json, a JSON object; other keys ignored)
 *   model          {"type": "WordPiece", "vocab": {TOKEN: ID, ...},
 *                   "unk_token": S, "continuing_subword_prefix": S,
 *                   "max_input_chars_per_word": N}
 *                  ids are 0..V-1, each once; unk_token is in the vocab.
 *   normalizer     null or {"type": "BertNormalizer", "clean_text",
 *                   "handle_chinese_chars", "lowercase": bool,
 *                   "strip_accents": bool or null (= lowercase)}
 *   pre_tokenizer  null or {"type": "BertPreTokenizer"}
 *   post_processor null, {"type": "TemplateProcessing", "single": [...],
 *                   "special_tokens": {...}} (one $A between special
 *                   tokens) or {"type": "BertProcessing", "cls": [S, ID],
 *                   "sep": [S, ID]}
 *   added_tokens   [{"id", "content", "normalized": false, "single_word",
 *                   "lstrip", "rstrip": false}, ...]: matched in the raw
 *                   text, before normalisation.
 *   "truncation" and "padding" are ignored: the caller's max_length rules
 *   (sentence-transformers overrides them the same way).
 *   Anything else (BPE, Unigram, other normalizers, normalized added
 *   tokens) is refused with MHA_ERR_UNSUPPORTED naming it.
 *
 * PIPELINE (one text)
 *   raw bytes -> split at added tokens (leftmost-longest, case-sensitive,
 *   anywhere) -> each piece: UTF-8 decoded (invalid bytes -> U+FFFD),
 *   BertNormalizer, split at whitespace (dropped) and punctuation (kept
 *   alone) -> each word: WordPiece (greedy longest match, "##" after the
 *   first piece; [UNK] for the whole word when a piece has no match or the
 *   word has more than max_input_chars_per_word code points) -> truncated
 *   to max_length - specials -> the template's specials around it.
 *
 * WHY LIBCJSON
 *   The file is ordinary JSON of ~700 KB with a 30522-entry object; nothing
 *   needs exact 64-bit integers (ids < 2^31 are exact in a double) and
 *   duplicate vocab keys are caught by the vocab's own hash table.  What
 *   cJSON does not check is checked here: types of every field read, id
 *   ranges, text after the JSON value.  Nesting is bounded by cJSON
 *   (CJSON_NESTING_LIMIT); the file by MHA_TOKENIZER_MAX_FILE.
 */
#include "../io/io.h"
#include "text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MHA_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

#define TK_MAX_FILE (256ll << 20) /* bytes of tokenizer.json               */
#define TK_MAX_SPECIAL 16         /* ids the post-processor adds            */
#define TK_MAX_ADDED 4096         /* added tokens                           */
#define TK_MAX_PREFIX 64          /* bytes of continuing_subword_prefix     */

typedef struct tk_added {
    const char *s;  /* content (into the arena) */
    size_t len;
    int32_t id;
} tk_added;

struct mha_tokenizer {
    char *arena;                  /* every string, NUL-terminated           */
    const char **token;           /* [V] id -> token                        */
    uint32_t *token_len;          /* [V] bytes                              */
    int64_t vocab_size;           /* V                                      */
    int32_t *slot;                /* [mask+1] open-addressing table: id, -1 */
    uint64_t mask;
    size_t max_token_bytes;       /* the longest vocab entry                */

    int32_t unk_id;
    char prefix[TK_MAX_PREFIX + 1];
    size_t prefix_len;
    int64_t max_chars;            /* max_input_chars_per_word               */

    int has_normalizer;
    mha_bert_normalizer norm;
    int has_pre_tokenizer;

    tk_added *added;              /* [n_added] raw-text tokens              */
    int n_added;
    uint8_t added_first[32];      /* bitmap of their first bytes            */
    int added_one_first;          /* that byte when all share it (BERT's
                                   * '['), else -1                          */

    int32_t head[TK_MAX_SPECIAL]; /* ids before $A                          */
    int32_t tail[TK_MAX_SPECIAL]; /* ids after $A                           */
    int n_head, n_tail;
};

/* ---- the vocab's hash table ------------------------------------------------ */

static uint64_t fnv1a(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ull

/* Id of the token a[0..na) followed by b[0..nb), or -1. */
static int32_t lookup2(const mha_tokenizer *t, const char *a, size_t na, const char *b,
                       size_t nb) {
    if (na + nb > t->max_token_bytes)
        return -1;
    uint64_t h = fnv1a(fnv1a(FNV_OFFSET, a, na), b, nb);
    for (uint64_t i = h & t->mask;; i = (i + 1) & t->mask) {
        int32_t id = t->slot[i];
        if (id < 0)
            return -1;
        if (t->token_len[id] == na + nb && !memcmp(t->token[id], a, na) &&
            !memcmp(t->token[id] + na, b, nb))
            return id;
    }
}

/* ---- loading ---------------------------------------------------------------- */

MHA_API void mha_tokenizer_free(mha_tokenizer *tok) {
    if (!tok)
        return;
    mha_free(tok->arena);
    mha_free(tok->token);
    mha_free(tok->token_len);
    mha_free(tok->slot);
    mha_free(tok->added);
    mha_free(tok);
}

#ifdef MHA_HAVE_CJSON

typedef struct tk_load {
    mha_tokenizer *t;
    const char *path;
    char *next;                   /* free space in the arena                */
} tk_load;

/* Copies s (n bytes) into the arena. */
static const char *arena_put(tk_load *L, const char *s, size_t n) {
    char *p = L->next;
    memcpy(p, s, n);
    p[n] = 0;
    L->next += n + 1;
    return p;
}

static int is_int_in(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi &&
           v->valuedouble == (double)(int64_t)v->valuedouble;
}

/* An optional boolean field: absent or null -> dflt; else must be a bool. */
static mha_status get_bool(tk_load *L, const cJSON *obj, const char *where, const char *key,
                           int dflt, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return MHA_OK;
    }
    MHA_CHECK(cJSON_IsBool(v), MHA_ERR_FORMAT, "%s: %s.%s is not true or false", L->path, where,
              key);
    *out = cJSON_IsTrue(v);
    return MHA_OK;
}

/* The "type" string of a component object, or NULL after recording an error. */
static const char *component_type(tk_load *L, const cJSON *obj, const char *where) {
    if (!cJSON_IsObject(obj)) {
        mha_error(MHA_ERR_FORMAT, "%s: %s is not an object", L->path, where);
        return NULL;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(obj, "type");
    if (!cJSON_IsString(ty)) {
        mha_error(MHA_ERR_FORMAT, "%s: %s has no \"type\" string", L->path, where);
        return NULL;
    }
    return ty->valuestring;
}

static mha_status load_vocab(tk_load *L, const cJSON *model) {
    mha_tokenizer *t = L->t;
    const char *ty = component_type(L, model, "model");
    if (!ty)
        return MHA_ERR_FORMAT;
    MHA_CHECK(!strcmp(ty, "WordPiece"), MHA_ERR_UNSUPPORTED,
              "%s: model type '%.40s' is not supported (WordPiece only)", L->path, ty);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    MHA_CHECK(cJSON_IsObject(vocab), MHA_ERR_FORMAT, "%s: model.vocab is not an object", L->path);
    int64_t V = 0;
    for (const cJSON *e = vocab->child; e; e = e->next)
        V++;
    MHA_CHECK(V >= 1 && V <= INT32_MAX, MHA_ERR_FORMAT, "%s: model.vocab has %lld tokens", L->path,
              (long long)V);
    t->vocab_size = V;
    uint64_t slots = 1;
    while (slots < (uint64_t)V * 2)
        slots <<= 1;
    t->mask = slots - 1;
    t->token = mha_calloc((size_t)V, sizeof *t->token);
    t->token_len = mha_calloc((size_t)V, sizeof *t->token_len);
    t->slot = mha_malloc(slots * sizeof *t->slot);
    MHA_CHECK(t->token && t->token_len && t->slot, MHA_ERR_NOMEM,
              "%s: out of memory for a vocab of %lld tokens", L->path, (long long)V);
    memset(t->slot, 0xFF, slots * sizeof *t->slot);
    for (const cJSON *e = vocab->child; e; e = e->next) {
        MHA_CHECK(is_int_in(e, 0, (double)(V - 1)), MHA_ERR_FORMAT,
                  "%s: model.vocab: token '%.40s' has no id in 0..%lld", L->path,
                  e->string ? e->string : "", (long long)(V - 1));
        int32_t id = (int32_t)e->valuedouble;
        MHA_CHECK(t->token[id] == NULL, MHA_ERR_FORMAT,
                  "%s: model.vocab: id %d is given twice ('%.40s' and '%.40s')", L->path, (int)id,
                  t->token[id] ? t->token[id] : "", e->string ? e->string : "");
        size_t n = strlen(e->string ? e->string : "");
        MHA_CHECK(n <= UINT32_MAX, MHA_ERR_FORMAT, "%s: model.vocab: token %d is too long",
                  L->path, (int)id);
        MHA_CHECK(lookup2(t, e->string, n, "", 0) < 0, MHA_ERR_FORMAT,
                  "%s: model.vocab: duplicate token '%.40s'", L->path, e->string);
        t->token[id] = arena_put(L, e->string ? e->string : "", n);
        t->token_len[id] = (uint32_t)n;
        if (n > t->max_token_bytes)
            t->max_token_bytes = n;
        uint64_t i = fnv1a(FNV_OFFSET, t->token[id], n) & t->mask;
        while (t->slot[i] >= 0)
            i = (i + 1) & t->mask;
        t->slot[i] = id;
    }

    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    MHA_CHECK(cJSON_IsString(unk), MHA_ERR_FORMAT, "%s: model.unk_token is not a string", L->path);
    t->unk_id = lookup2(t, unk->valuestring, strlen(unk->valuestring), "", 0);
    MHA_CHECK(t->unk_id >= 0, MHA_ERR_FORMAT, "%s: model.unk_token '%.40s' is not in the vocab",
              L->path, unk->valuestring);
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix");
    const char *p = "##";
    if (pre && !cJSON_IsNull(pre)) {
        MHA_CHECK(cJSON_IsString(pre) && strlen(pre->valuestring) <= TK_MAX_PREFIX,
                  MHA_ERR_FORMAT, "%s: model.continuing_subword_prefix is not a string of at "
                  "most %d bytes", L->path, TK_MAX_PREFIX);
        p = pre->valuestring;
    }
    t->prefix_len = strlen(p);
    memcpy(t->prefix, p, t->prefix_len + 1);
    const cJSON *mc = cJSON_GetObjectItemCaseSensitive(model, "max_input_chars_per_word");
    t->max_chars = 100;
    if (mc && !cJSON_IsNull(mc)) {
        MHA_CHECK(is_int_in(mc, 0, 9007199254740992.0), MHA_ERR_FORMAT,
                  "%s: model.max_input_chars_per_word is not a count", L->path);
        t->max_chars = (int64_t)mc->valuedouble;
    }
    return MHA_OK;
}

static mha_status load_normalizer(tk_load *L, const cJSON *n) {
    mha_tokenizer *t = L->t;
    if (!n || cJSON_IsNull(n))
        return MHA_OK;
    const char *ty = component_type(L, n, "normalizer");
    if (!ty)
        return MHA_ERR_FORMAT;
    MHA_CHECK(!strcmp(ty, "BertNormalizer"), MHA_ERR_UNSUPPORTED,
              "%s: normalizer '%.40s' is not supported (BertNormalizer or none)", L->path, ty);
    t->has_normalizer = 1;
    mha_bert_normalizer *o = &t->norm;
    MHA_TRY(get_bool(L, n, "normalizer", "clean_text", 1, &o->clean_text));
    MHA_TRY(get_bool(L, n, "normalizer", "handle_chinese_chars", 1, &o->handle_chinese_chars));
    MHA_TRY(get_bool(L, n, "normalizer", "lowercase", 1, &o->lowercase));
    /* strip_accents: null follows lowercase (BertNormalizer::normalize) */
    MHA_TRY(get_bool(L, n, "normalizer", "strip_accents", o->lowercase, &o->strip_accents));
    return MHA_OK;
}

static mha_status load_pre_tokenizer(tk_load *L, const cJSON *p) {
    if (!p || cJSON_IsNull(p))
        return MHA_OK;
    const char *ty = component_type(L, p, "pre_tokenizer");
    if (!ty)
        return MHA_ERR_FORMAT;
    MHA_CHECK(!strcmp(ty, "BertPreTokenizer"), MHA_ERR_UNSUPPORTED,
              "%s: pre_tokenizer '%.40s' is not supported (BertPreTokenizer or none)", L->path,
              ty);
    L->t->has_pre_tokenizer = 1;
    return MHA_OK;
}

/* Appends id to the head or tail list, checking it is in the vocab. */
static mha_status add_special(tk_load *L, int tail, const cJSON *id, const char *what) {
    mha_tokenizer *t = L->t;
    MHA_CHECK(is_int_in(id, 0, (double)(t->vocab_size - 1)), MHA_ERR_FORMAT,
              "%s: post_processor: %s has no id in the vocab (0..%lld)", L->path, what,
              (long long)(t->vocab_size - 1));
    int *n = tail ? &t->n_tail : &t->n_head;
    MHA_CHECK(*n < TK_MAX_SPECIAL, MHA_ERR_UNSUPPORTED,
              "%s: post_processor adds more than %d tokens", L->path, TK_MAX_SPECIAL);
    (tail ? t->tail : t->head)[(*n)++] = (int32_t)id->valuedouble;
    return MHA_OK;
}

static mha_status load_template(tk_load *L, const cJSON *p) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    MHA_CHECK(cJSON_IsArray(single), MHA_ERR_FORMAT,
              "%s: post_processor.single is not an array", L->path);
    int seen_a = 0;
    for (const cJSON *e = single->child; e; e = e->next) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        if (seq) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(seq, "id");
            MHA_CHECK(cJSON_IsString(id) && !strcmp(id->valuestring, "A") && !seen_a,
                      MHA_ERR_FORMAT, "%s: post_processor.single must hold one Sequence A",
                      L->path);
            seen_a = 1;
            continue;
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
        MHA_CHECK(cJSON_IsString(name), MHA_ERR_FORMAT,
                  "%s: post_processor.single: an item is neither Sequence nor SpecialToken",
                  L->path);
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids");
        MHA_CHECK(cJSON_IsArray(ids), MHA_ERR_FORMAT,
                  "%s: post_processor: special token '%.40s' is not in special_tokens", L->path,
                  name->valuestring);
        for (const cJSON *id = ids->child; id; id = id->next)
            MHA_TRY(add_special(L, seen_a, id, name->valuestring));
    }
    MHA_CHECK(seen_a, MHA_ERR_FORMAT, "%s: post_processor.single must hold one Sequence A",
              L->path);
    return MHA_OK;
}

static mha_status load_post_processor(tk_load *L, const cJSON *p) {
    if (!p || cJSON_IsNull(p))
        return MHA_OK;
    const char *ty = component_type(L, p, "post_processor");
    if (!ty)
        return MHA_ERR_FORMAT;
    if (!strcmp(ty, "TemplateProcessing"))
        return load_template(L, p);
    MHA_CHECK(!strcmp(ty, "BertProcessing"), MHA_ERR_UNSUPPORTED,
              "%s: post_processor '%.40s' is not supported (TemplateProcessing, BertProcessing "
              "or none)", L->path, ty);
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(p, "cls");
    const cJSON *sep = cJSON_GetObjectItemCaseSensitive(p, "sep");
    MHA_CHECK(cJSON_GetArraySize(cls) == 2 && cJSON_GetArraySize(sep) == 2, MHA_ERR_FORMAT,
              "%s: post_processor: cls and sep must be [token, id]", L->path);
    MHA_TRY(add_special(L, 0, cJSON_GetArrayItem(cls, 1), "cls"));
    return add_special(L, 1, cJSON_GetArrayItem(sep, 1), "sep");
}

static mha_status load_added(tk_load *L, const cJSON *a) {
    mha_tokenizer *t = L->t;
    if (!a || cJSON_IsNull(a))
        return MHA_OK;
    MHA_CHECK(cJSON_IsArray(a), MHA_ERR_FORMAT, "%s: added_tokens is not an array", L->path);
    int n = cJSON_GetArraySize(a);
    MHA_CHECK(n <= TK_MAX_ADDED, MHA_ERR_UNSUPPORTED, "%s: more than %d added_tokens", L->path,
              TK_MAX_ADDED);
    t->added = mha_calloc((size_t)(n ? n : 1), sizeof *t->added);
    MHA_CHECK(t->added != NULL, MHA_ERR_NOMEM, "%s: out of memory", L->path);
    for (const cJSON *e = a->child; e; e = e->next) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        MHA_CHECK(cJSON_IsString(content) && content->valuestring[0], MHA_ERR_FORMAT,
                  "%s: added_tokens: an entry has no content string", L->path);
        const char *s = content->valuestring;
        MHA_CHECK(is_int_in(id, 0, (double)(t->vocab_size - 1)), MHA_ERR_UNSUPPORTED,
                  "%s: added token '%.40s' has no id inside the WordPiece vocab (0..%lld)",
                  L->path, s, (long long)(t->vocab_size - 1));
        static const char *const must_be_false[] = {"normalized", "single_word", "lstrip",
                                                    "rstrip"};
        for (int k = 0; k < 4; k++) {
            int on;
            MHA_TRY(get_bool(L, e, "added_tokens[]", must_be_false[k], 0, &on));
            MHA_CHECK(!on, MHA_ERR_UNSUPPORTED,
                      "%s: added token '%.40s': %s true is not supported", L->path, s,
                      must_be_false[k]);
        }
        tk_added *d = &t->added[t->n_added++];
        d->len = strlen(s);
        d->s = arena_put(L, s, d->len);
        d->id = (int32_t)id->valuedouble;
        t->added_first[(uint8_t)s[0] >> 3] |= (uint8_t)(1u << ((uint8_t)s[0] & 7));
        int same = t->n_added == 1 || t->added_one_first == (uint8_t)s[0];
        t->added_one_first = same ? (uint8_t)s[0] : -1;
    }
    return MHA_OK;
}

/* Bytes the arena needs: every string the loader copies, with its NUL. */
static size_t arena_bytes(const cJSON *root) {
    size_t n = 1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    for (const cJSON *e = vocab ? vocab->child : NULL; e; e = e->next)
        n += (e->string ? strlen(e->string) : 0) + 1;
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    for (const cJSON *e = cJSON_IsArray(added) ? added->child : NULL; e; e = e->next) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        n += (cJSON_IsString(c) ? strlen(c->valuestring) : 0) + 1;
    }
    return n;
}

static mha_status load_json(tk_load *L, const char *text, size_t size) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, size, &end, 0);
    if (!root)
        return mha_error(MHA_ERR_FORMAT, "%s: not JSON (parse error at byte %lld)", L->path,
                         (long long)(end && end >= text ? end - text : 0));
    mha_status st = MHA_OK;
    while (end < text + size && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
        end++;
    if (end != text + size)
        st = mha_error(MHA_ERR_FORMAT, "%s: text after the JSON value at byte %lld", L->path,
                       (long long)(end - text));
    else if (!cJSON_IsObject(root))
        st = mha_error(MHA_ERR_FORMAT, "%s: not a JSON object", L->path);
    if (st == MHA_OK) {
        L->t->arena = L->next = mha_malloc(arena_bytes(root));
        if (!L->t->arena)
            st = mha_error(MHA_ERR_NOMEM, "%s: out of memory", L->path);
    }
    if (st == MHA_OK)
        st = load_vocab(L, cJSON_GetObjectItemCaseSensitive(root, "model"));
    if (st == MHA_OK)
        st = load_normalizer(L, cJSON_GetObjectItemCaseSensitive(root, "normalizer"));
    if (st == MHA_OK)
        st = load_pre_tokenizer(L, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
    if (st == MHA_OK)
        st = load_post_processor(L, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    if (st == MHA_OK)
        st = load_added(L, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    cJSON_Delete(root);
    return st;
}
#endif /* MHA_HAVE_CJSON */

mha_status mha_tokenizer_open_mem(mha_tokenizer **tok, const char *json, size_t size,
                                  const char *name) {
    MHA_CHECK(tok != NULL, MHA_ERR_NULL, "tokenizer: tok is NULL");
    *tok = NULL;
    MHA_CHECK(json != NULL || size == 0, MHA_ERR_NULL, "tokenizer: json is NULL");
#ifndef MHA_HAVE_CJSON
    return mha_error(MHA_ERR_UNSUPPORTED, "%s: this build has no libcjson (install "
                     "libcjson-dev and rebuild to read tokenizer.json)", name);
#else
    MHA_CHECK(mha_text_have_unicode(), MHA_ERR_UNSUPPORTED,
              "%s: this build has no utf8proc (install libutf8proc-dev and rebuild to "
              "tokenize)", name);
    mha_tokenizer *t = mha_calloc(1, sizeof *t);
    MHA_CHECK(t != NULL, MHA_ERR_NOMEM, "%s: out of memory", name);
    t->added_one_first = -1;
    tk_load L = {t, name, NULL};
    mha_status st = load_json(&L, json, size);
    if (st != MHA_OK) {
        mha_tokenizer_free(t);
        return st;
    }
    *tok = t;
    return MHA_OK;
#endif
}

MHA_API mha_status mha_tokenizer_open(mha_tokenizer **tok, const char *path) {
    MHA_CHECK(tok != NULL && path != NULL, MHA_ERR_NULL, "tokenizer: tok or path is NULL");
    *tok = NULL;
#ifndef MHA_HAVE_CJSON
    return mha_tokenizer_open_mem(tok, NULL, 0, path);
#else
    MHA_CHECK(mha_text_have_unicode(), MHA_ERR_UNSUPPORTED,
              "%s: this build has no utf8proc (install libutf8proc-dev and rebuild to "
              "tokenize)", path);
    mha_file f;
    MHA_TRY(mha_file_open(&f, path));
    mha_status st = MHA_OK;
    char *buf = NULL;
    if (f.size > TK_MAX_FILE)
        st = mha_error(MHA_ERR_FORMAT, "%s: %lld bytes, larger than the %lld a tokenizer.json "
                       "may have", path, (long long)f.size, (long long)TK_MAX_FILE);
    else if (!(buf = mha_malloc((size_t)f.size + 1)))
        st = mha_error(MHA_ERR_NOMEM, "%s: out of memory", path);
    else
        st = mha_file_read(&f, 0, buf, (size_t)f.size, "tokenizer.json");
    mha_file_close(&f);
    if (st == MHA_OK)
        st = mha_tokenizer_open_mem(tok, buf, (size_t)f.size, path);
    mha_free(buf);
    return st;
#endif
}

MHA_API int64_t mha_tokenizer_vocab_size(const mha_tokenizer *tok) {
    return tok ? tok->vocab_size : 0;
}

MHA_API const char *mha_tokenizer_id_to_token(const mha_tokenizer *tok, int32_t id) {
    return tok && id >= 0 && id < tok->vocab_size ? tok->token[id] : NULL;
}

MHA_API int32_t mha_tokenizer_token_to_id(const mha_tokenizer *tok, const char *token) {
    return tok && token ? lookup2(tok, token, strlen(token), "", 0) : -1;
}

MHA_API int64_t mha_tokenizer_num_special(const mha_tokenizer *tok) {
    return tok ? tok->n_head + tok->n_tail : 0;
}

/* ---- encoding --------------------------------------------------------------- */

#define TK_STACK 256 /* code points / chars a call holds without the heap */

/* One call's scratch and output: on the stack until a text outgrows it. */
typedef struct tk_work {
    const mha_tokenizer *t;
    mha_cps raw, norm, scratch;   /* a piece's code points, then normalised */
    mha_cps out;                  /* token ids (>= 0), without the specials */
    size_t limit;                 /* stop after this many (SIZE_MAX: none)  */
    char *bytes;                  /* a word's UTF-8                         */
    size_t *off;                  /* [chars + 1] byte offset of each char   */
    size_t cap_word;              /* chars + 1 that bytes and off hold      */
    uint32_t stack[4][TK_STACK];  /* first storage of raw, norm, scratch, out */
    char stack_bytes[4 * TK_STACK];
    size_t stack_off[TK_STACK];
} tk_work;

static mha_status emit(tk_work *w, int32_t id) {
    return w->out.n < w->limit ? mha_cps_push(&w->out, (uint32_t)id) : MHA_OK;
}

/* WordPiece of one word c[0..m): greedy longest match from the left.
 * ref: tokenizers models/wordpiece/mod.rs WordPiece::tokenize. */
static mha_status wordpiece(tk_work *w, const uint32_t *c, size_t m) {
    const mha_tokenizer *t = w->t;
    if ((uint64_t)m > (uint64_t)t->max_chars)
        return emit(w, t->unk_id);
    if (m + 1 > w->cap_word) {
        size_t cap = m + 1 > 2 * w->cap_word ? m + 1 : 2 * w->cap_word;
        if (w->bytes != w->stack_bytes) {
            mha_free(w->bytes);
            mha_free(w->off);
        }
        w->cap_word = 0;
        w->bytes = mha_malloc(4 * cap);
        w->off = mha_malloc(cap * sizeof *w->off);
        MHA_CHECK(w->bytes && w->off, MHA_ERR_NOMEM, "tokenizer: out of memory for a word");
        w->cap_word = cap;
    }
    size_t nb = 0;
    for (size_t i = 0; i < m; i++) {
        w->off[i] = nb;
        nb += (size_t)mha_utf8_put(c[i], w->bytes + nb);
    }
    w->off[m] = nb;
    size_t mark = w->out.n;
    for (size_t start = 0; start < m;) {
        const char *pre = start ? t->prefix : "";
        size_t npre = start ? t->prefix_len : 0;
        int32_t id = -1;
        size_t end = m;
        while (end > start && npre + w->off[end] - w->off[start] > t->max_token_bytes)
            end--; /* longer than any vocab entry: cannot match */
        for (; end > start; end--) {
            id = lookup2(t, pre, npre, w->bytes + w->off[start], w->off[end] - w->off[start]);
            if (id >= 0)
                break;
        }
        if (id < 0) { /* no piece fits here: the whole word is [UNK] */
            w->out.n = mark < w->out.n ? mark : w->out.n;
            return emit(w, t->unk_id);
        }
        MHA_TRY(emit(w, id));
        start = end;
    }
    return MHA_OK;
}

/* One piece of raw text between added tokens: decode, normalise,
 * pre-tokenize (BertPreTokenizer), WordPiece each word. */
static mha_status encode_piece(tk_work *w, const char *s, size_t len) {
    const mha_tokenizer *t = w->t;
    w->raw.n = w->norm.n = 0;
    MHA_TRY(mha_utf8_decode(s, len, &w->raw));
    const mha_cps *c = &w->raw;
    if (t->has_normalizer) {
        MHA_TRY(mha_bert_normalize(&t->norm, w->raw.v, w->raw.n, &w->norm, &w->scratch));
        c = &w->norm;
    }
    if (!t->has_pre_tokenizer)
        return c->n ? wordpiece(w, c->v, c->n) : MHA_OK;
    size_t word = 0; /* start of the current word */
    for (size_t i = 0; i <= c->n && w->out.n < w->limit; i++) {
        int ws = i < c->n && mha_char_is_whitespace(c->v[i]);
        int punct = i < c->n && !ws && mha_char_is_punct(c->v[i]);
        if (i < c->n && !ws && !punct)
            continue;
        if (i > word)
            MHA_TRY(wordpiece(w, c->v + word, i - word));
        if (punct)
            MHA_TRY(wordpiece(w, c->v + i, 1));
        word = i + 1;
    }
    return MHA_OK;
}

/* The added token starting at s[0..len) (longest), or NULL. */
static const tk_added *added_at(const mha_tokenizer *t, const char *s, size_t len) {
    uint8_t b = (uint8_t)s[0];
    if (!(t->added_first[b >> 3] & (1u << (b & 7))))
        return NULL;
    const tk_added *best = NULL;
    for (int k = 0; k < t->n_added; k++) {
        const tk_added *a = &t->added[k];
        if (a->len <= len && (!best || a->len > best->len) && !memcmp(s, a->s, a->len))
            best = a;
    }
    return best;
}

MHA_API mha_status mha_tokenizer_encode(const mha_tokenizer *tok, const char *text, size_t len,
                                        int64_t max_length, int32_t *ids, int64_t capacity,
                                        int64_t *n) {
    MHA_CHECK(tok != NULL && n != NULL, MHA_ERR_NULL, "tokenizer_encode: tok or n is NULL");
    MHA_CHECK(text != NULL || len == 0, MHA_ERR_NULL, "tokenizer_encode: text is NULL");
    MHA_CHECK(capacity >= 0 && (ids != NULL || capacity == 0), MHA_ERR_NULL,
              "tokenizer_encode: ids is NULL with capacity %lld", (long long)capacity);
    int64_t specials = tok->n_head + tok->n_tail;
    MHA_CHECK(max_length <= 0 || max_length >= specials, MHA_ERR_VALUE,
              "tokenizer_encode: max_length %lld cannot hold the %lld special tokens",
              (long long)max_length, (long long)specials);
    tk_work w;
    w.t = tok;
    w.limit = SIZE_MAX;
    w.raw = mha_cps_on(w.stack[0], TK_STACK);
    w.norm = mha_cps_on(w.stack[1], TK_STACK);
    w.scratch = mha_cps_on(w.stack[2], TK_STACK);
    w.out = mha_cps_on(w.stack[3], TK_STACK);
    w.bytes = w.stack_bytes;
    w.off = w.stack_off;
    w.cap_word = TK_STACK;
    if (max_length > 0)
        w.limit = (size_t)(max_length - specials);
    mha_status st = MHA_OK;
    size_t piece = 0;
    for (size_t i = 0; i < len && st == MHA_OK && w.out.n < w.limit;) {
        if (tok->added_one_first >= 0) { /* jump to the next candidate byte */
            const char *next = memchr(text + i, tok->added_one_first, len - i);
            if (!next)
                break;
            i = (size_t)(next - text);
        }
        const tk_added *a = tok->n_added ? added_at(tok, text + i, len - i) : NULL;
        if (!a) {
            i++;
            continue;
        }
        if (i > piece)
            st = encode_piece(&w, text + piece, i - piece);
        if (st == MHA_OK)
            st = emit(&w, a->id);
        i += a->len;
        piece = i;
    }
    if (st == MHA_OK && piece < len && w.out.n < w.limit)
        st = encode_piece(&w, text + piece, len - piece);
    if (st == MHA_OK) {
        int64_t need = specials + (int64_t)w.out.n;
        *n = need;
        if (need > capacity) {
            st = mha_error(MHA_ERR_SHAPE, "tokenizer_encode: ids has room for %lld but the "
                           "text needs %lld", (long long)capacity, (long long)need);
        } else if (need > 0) {
            memcpy(ids, tok->head, (size_t)tok->n_head * sizeof *ids);
            for (size_t i = 0; i < w.out.n; i++)
                ids[tok->n_head + (int64_t)i] = (int32_t)w.out.v[i];
            memcpy(ids + tok->n_head + w.out.n, tok->tail, (size_t)tok->n_tail * sizeof *ids);
        }
    }
    mha_cps_free(&w.raw);
    mha_cps_free(&w.norm);
    mha_cps_free(&w.scratch);
    mha_cps_free(&w.out);
    if (w.bytes != w.stack_bytes) {
        mha_free(w.bytes);
        mha_free(w.off);
    }
    return st;
}
