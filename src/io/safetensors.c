/* safetensors.c - safetensors files: a hostile-input reader and a writer.
 *
 * FORMAT (huggingface/safetensors README, "Format")
 *
 *   offset   size  field
 *   0        8     N, unsigned little-endian: header length
 *   8        N     header: UTF-8 JSON object, optionally padded with spaces
 *                    { "__metadata__": { "key": "value", ... },        (optional)
 *                      "NAME": { "dtype": "F32", "shape": [2, 3],
 *                                "data_offsets": [BEGIN, END] }, ... }
 *   8+N      ...   data section: each tensor's bytes, little-endian, C order,
 *                  at [BEGIN, END) relative to the data section's start.
 *
 * RULES ENFORCED (as the Rust reference, safetensors/src/tensor.rs)
 *   file >= 8 bytes; N <= 100,000,000 (MAX_HEADER_SIZE) and N <= file - 8;
 *   the header is valid UTF-8 JSON: an object whose values are tensor objects
 *   with exactly the keys dtype, shape, data_offsets (each once), or the
 *   "__metadata__" object of string values; names are unique; dtype is one
 *   of F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2;
 *   shape: at most MHA_SAFETENSORS_MAX_DIMS non-negative integers;
 *   data_offsets: two non-negative integers, BEGIN <= END; prod(shape) and
 *   prod(shape) x dtype size overflow-checked and equal to END - BEGIN;
 *   sorted by offset, each tensor starts where the previous ended (no hole,
 *   no overlap), the first at 0 and the last ends at the end of the file.
 *
 * WHY A DEDICATED JSON PARSER (and not libcjson)
 *   The header grammar is tiny and fixed (three levels at most), offsets
 *   and sizes must be exact 64-bit integers (cJSON keeps numbers as double,
 *   exact only to 2^53, and drops the token text), duplicate keys must be
 *   rejected (cJSON keeps them silently), and a parser that is always
 *   compiled in means every build reads safetensors and the fuzz targets
 *   cover exactly the code that runs.  It is a strict RFC 8259 subset:
 *   strings with all escapes (\uXXXX incl. surrogate pairs, checked), raw
 *   UTF-8 validated, integers only where the format has integers, nesting
 *   bounded by the grammar (no recursion on input).
 */
#include "io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST_MAX_HEADER 100000000ull
#define ST_MAX_DIMS MHA_SAFETENSORS_MAX_DIMS

typedef struct st_entry {
    char *name;                       /* NUL-terminated, owned                 */
    char dtype[12];
    size_t itemsize;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t begin, end;               /* data section offsets                  */
} st_entry;

struct mha_safetensors {
    mha_file f;
    const uint8_t *map;               /* whole file when mapped, else NULL     */
    int64_t data_off;                 /* 8 + N                                 */
    st_entry *t;
    int64_t n, cap;
    char **meta;                      /* key, value, key, value, ...           */
    int64_t n_meta, cap_meta;
    void **copies;                    /* buffers handed out by the views       */
    int64_t n_copies, cap_copies;
};

static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},    {"I32", 4},    {"I16", 2},
    {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},     {"BOOL", 1},   {"F8_E4M3", 1},
    {"F8_E5M2", 1},
};

/* ---- small owned arrays --------------------------------------------------- */

/* Grows *arr (elements of size es) to hold one more; MHA_ERR_NOMEM on failure. */
static mha_status grow(void **arr, int64_t *cap, int64_t n, size_t es) {
    if (n < *cap)
        return MHA_OK;
    int64_t nc = *cap ? *cap * 2 : 16;
    while (nc <= n) /* GCOVR_EXCL_BR_LINE: callers grow one element at a time */
        nc *= 2;
    void *p = mha_malloc((size_t)nc * es);
    MHA_CHECK(p != NULL, MHA_ERR_NOMEM, "safetensors: cannot allocate the tensor table");
    if (*arr) /* the old array holds *cap elements (n may be past them) */
        memcpy(p, *arr, (size_t)*cap * es);
    mha_free(*arr);
    *arr = p;
    *cap = nc;
    return MHA_OK;
}

static char *dup_str(const char *s, size_t n) {
    char *d = mha_malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* ---- JSON subset -------------------------------------------------------- */

typedef struct jp {
    const uint8_t *s, *end, *start;
    const char *name;   /* file name for messages */
    char *buf;          /* decoded string scratch, size >= header length + 1 */
} jp;

static void jws(jp *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

static mha_status jexpect(jp *p, char c, const char *where) {
    jws(p);
    MHA_CHECK(p->s < p->end && *p->s == (uint8_t)c, MHA_ERR_FORMAT,
              "%s: bad safetensors header JSON: expected '%c' %s at byte %lld", p->name, c,
              where, (long long)(p->s - p->start) + 8);
    p->s++;
    return MHA_OK;
}

static int hexval(uint8_t c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10 /* GCOVR_EXCL_BR_LINE: gcc -O0 artifact */
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Length of a valid UTF-8 sequence at s (RFC 3629), or 0. */
static size_t utf8_len(const uint8_t *s, const uint8_t *end) {
    uint8_t c = s[0];
    size_t n;
    uint32_t cp, min;
    if (c < 0x80)
        return 1;
    if ((c & 0xe0) == 0xc0)
        n = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
        n = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
        n = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if ((size_t)(end - s) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* A JSON string, decoded into p->buf (NUL-terminated; *len without it). */
static mha_status jstring(jp *p, size_t *len, const char *what) {
    jws(p);
    MHA_CHECK(p->s < p->end && *p->s == '"', MHA_ERR_FORMAT,
              "%s: bad safetensors header JSON: expected a string for %s", p->name, what);
    p->s++;
    size_t n = 0;
    for (;;) {
        MHA_CHECK(p->s < p->end, MHA_ERR_FORMAT,
                  "%s: bad safetensors header JSON: unterminated string in %s", p->name, what);
        uint8_t c = *p->s;
        if (c == '"') {
            p->s++;
            break;
        }
        MHA_CHECK(c >= 0x20, MHA_ERR_FORMAT,
                  "%s: bad safetensors header JSON: control character in %s", p->name, what);
        if (c != '\\') {
            size_t k = utf8_len(p->s, p->end);
            MHA_CHECK(k > 0, MHA_ERR_FORMAT, "%s: safetensors header is not valid UTF-8 (in %s)",
                      p->name, what);
            memcpy(p->buf + n, p->s, k);
            n += k;
            p->s += k;
            continue;
        }
        MHA_CHECK(p->end - p->s >= 2, MHA_ERR_FORMAT,
                  "%s: bad safetensors header JSON: truncated escape in %s", p->name, what);
        uint8_t e = p->s[1];
        p->s += 2;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char out[] = "\"\\/\b\f\n\r\t";
            p->buf[n++] = out[simple - "\"\\/bfnrt"];
            continue;
        }
        MHA_CHECK(e == 'u', MHA_ERR_FORMAT,
                  "%s: bad safetensors header JSON: bad escape in %s", p->name, what);
        uint32_t cp = 0;
        for (int pair = 0; pair < 2; pair++) {
            uint32_t u = 0;
            MHA_CHECK(p->end - p->s >= 4, MHA_ERR_FORMAT,
                      "%s: bad safetensors header JSON: truncated \\u escape in %s", p->name, what);
            for (int i = 0; i < 4; i++) {
                int h = hexval(p->s[i]);
                MHA_CHECK(h >= 0, MHA_ERR_FORMAT,
                          "%s: bad safetensors header JSON: bad \\u escape in %s", p->name, what);
                u = u << 4 | (uint32_t)h;
            }
            p->s += 4;
            if (pair == 0) {
                cp = u;
                if (u < 0xd800 || u > 0xdfff)
                    break;
                MHA_CHECK(u < 0xdc00 && p->end - p->s >= 2 && p->s[0] == '\\' && p->s[1] == 'u',
                          MHA_ERR_FORMAT,
                          "%s: bad safetensors header JSON: unpaired surrogate in %s", p->name,
                          what);
                p->s += 2;
            } else {
                MHA_CHECK(u >= 0xdc00 && u <= 0xdfff, MHA_ERR_FORMAT,
                          "%s: bad safetensors header JSON: unpaired surrogate in %s", p->name,
                          what);
                cp = 0x10000 + ((cp - 0xd800) << 10) + (u - 0xdc00);
            }
        }
        MHA_CHECK(cp != 0, MHA_ERR_FORMAT, "%s: safetensors header: NUL character in %s",
                  p->name, what);
        n += put_utf8(p->buf + n, cp);
    }
    p->buf[n] = 0;
    *len = n;
    return MHA_OK;
}

/* A non-negative JSON integer (no fraction or exponent) below 2^63. */
static mha_status jint(jp *p, int64_t *v, const char *name, const char *what) {
    jws(p);
    MHA_CHECK(p->s < p->end && *p->s != '-', MHA_ERR_FORMAT,
              "%s: tensor '%s': %s: negative or missing value", p->name, name, what);
    MHA_CHECK(*p->s >= '0' && *p->s <= '9', MHA_ERR_FORMAT,
              "%s: tensor '%s': %s: not an integer", p->name, name, what);
    MHA_CHECK(!(*p->s == '0' && p->end - p->s > 1 && p->s[1] >= '0' && p->s[1] <= '9'),
              MHA_ERR_FORMAT, "%s: tensor '%s': %s: leading zero", p->name, name, what);
    int64_t x = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        MHA_CHECK(!mha_mul_overflows(x, 10, &x) && !__builtin_add_overflow(x, *p->s - '0', &x),
                  MHA_ERR_OVERFLOW, "%s: tensor '%s': %s: integer does not fit in 63 bits",
                  p->name, name, what);
        p->s++;
    }
    MHA_CHECK(p->s >= p->end || (*p->s != '.' && *p->s != 'e' && *p->s != 'E'), MHA_ERR_FORMAT,
              "%s: tensor '%s': %s: not an integer", p->name, name, what);
    *v = x;
    return MHA_OK;
}

/* '[' int, int, ... ']' into v (at most max); *n the count. */
static mha_status jint_array(jp *p, int64_t *v, int max, int *n, const char *name,
                             const char *what) {
    MHA_TRY(jexpect(p, '[', what));
    *n = 0;
    jws(p);
    if (p->s < p->end && *p->s == ']') {
        p->s++;
        return MHA_OK;
    }
    for (;;) {
        MHA_CHECK(*n < max, MHA_ERR_FORMAT, "%s: tensor '%s': %s has more than %d entries",
                  p->name, name, what, max);
        MHA_TRY(jint(p, &v[(*n)++], name, what));
        jws(p);
        MHA_CHECK(p->s < p->end && (*p->s == ',' || *p->s == ']'), MHA_ERR_FORMAT,
                  "%s: tensor '%s': %s: expected ',' or ']'", p->name, name, what);
        if (*p->s++ == ']')
            return MHA_OK;
    }
}

static mha_status parse_tensor(jp *p, st_entry *e) {
    int seen[3] = {0, 0, 0};
    MHA_TRY(jexpect(p, '{', "to open a tensor"));
    jws(p);
    if (p->s < p->end && *p->s == '}')
        return mha_error(MHA_ERR_FORMAT, "%s: tensor '%s': empty tensor entry", p->name, e->name);
    for (;;) {
        size_t len;
        MHA_TRY(jstring(p, &len, "a tensor key"));
        MHA_TRY(jexpect(p, ':', "after a tensor key"));
        int which = !strcmp(p->buf, "dtype")          ? 0
                    : !strcmp(p->buf, "shape")        ? 1
                    : !strcmp(p->buf, "data_offsets") ? 2
                                                      : -1;
        MHA_CHECK(which >= 0, MHA_ERR_FORMAT, "%s: tensor '%s': unknown key '%.40s'", p->name,
                  e->name, p->buf);
        MHA_CHECK(!seen[which]++, MHA_ERR_FORMAT, "%s: tensor '%s': duplicate key '%s'", p->name,
                  e->name, p->buf);
        if (which == 0) {
            MHA_TRY(jstring(p, &len, "dtype"));
            e->itemsize = 0;
            for (size_t i = 0; i < sizeof st_dtypes / sizeof *st_dtypes; i++)
                if (!strcmp(p->buf, st_dtypes[i].name)) {
                    strcpy(e->dtype, st_dtypes[i].name);
                    e->itemsize = st_dtypes[i].size;
                }
            MHA_CHECK(e->itemsize != 0, MHA_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.20s'",
                      p->name, e->name, p->buf);
        } else if (which == 1) {
            MHA_TRY(jint_array(p, e->shape, ST_MAX_DIMS, &e->ndim, e->name, "shape"));
        } else {
            int64_t off[2];
            int n;
            MHA_TRY(jint_array(p, off, 2, &n, e->name, "data_offsets"));
            MHA_CHECK(n == 2, MHA_ERR_FORMAT, "%s: tensor '%s': data_offsets needs 2 integers",
                      p->name, e->name);
            e->begin = off[0];
            e->end = off[1];
        }
        jws(p);
        MHA_CHECK(p->s < p->end && (*p->s == ',' || *p->s == '}'), MHA_ERR_FORMAT,
                  "%s: tensor '%s': bad JSON: expected ',' or '}'", p->name, e->name);
        if (*p->s++ == '}')
            break;
    }
    MHA_CHECK(seen[0] && seen[1] && seen[2], MHA_ERR_FORMAT, "%s: tensor '%s': missing %s",
              p->name, e->name, !seen[0] ? "dtype" : !seen[1] ? "shape" : "data_offsets");
    return MHA_OK;
}

static mha_status parse_metadata(jp *p, mha_safetensors *st) {
    MHA_TRY(jexpect(p, '{', "to open __metadata__"));
    jws(p);
    if (p->s < p->end && *p->s == '}') {
        p->s++;
        return MHA_OK;
    }
    for (;;) {
        size_t len;
        MHA_TRY(jstring(p, &len, "a __metadata__ key"));
        for (int64_t i = 0; i < st->n_meta; i++)
            MHA_CHECK(strcmp(st->meta[2 * i], p->buf) != 0, MHA_ERR_FORMAT,
                      "%s: __metadata__: duplicate key '%.40s'", p->name, p->buf);
        MHA_TRY(grow((void **)&st->meta, &st->cap_meta, 2 * st->n_meta + 1, sizeof(char *)));
        char *k = dup_str(p->buf, len);
        MHA_CHECK(k != NULL, MHA_ERR_NOMEM, "safetensors: cannot allocate metadata");
        st->meta[2 * st->n_meta] = k;
        st->meta[2 * st->n_meta + 1] = NULL;
        st->n_meta++;
        MHA_TRY(jexpect(p, ':', "after a __metadata__ key"));
        jws(p);
        MHA_CHECK(p->s < p->end && *p->s == '"', MHA_ERR_FORMAT,
                  "%s: __metadata__: value of '%.40s' is not a string", p->name, k);
        MHA_TRY(jstring(p, &len, "a __metadata__ value"));
        char *v = dup_str(p->buf, len);
        MHA_CHECK(v != NULL, MHA_ERR_NOMEM, "safetensors: cannot allocate metadata");
        st->meta[2 * st->n_meta - 1] = v;
        jws(p);
        MHA_CHECK(p->s < p->end && (*p->s == ',' || *p->s == '}'), MHA_ERR_FORMAT,
                  "%s: __metadata__: bad JSON: expected ',' or '}'", p->name);
        if (*p->s++ == '}')
            return MHA_OK;
    }
}

static mha_status parse_header(jp *p, mha_safetensors *st) {
    int seen_meta = 0;
    MHA_TRY(jexpect(p, '{', "at the start of the header"));
    jws(p);
    if (p->s < p->end && *p->s == '}') {
        p->s++;
    } else {
        for (;;) {
            size_t len;
            MHA_TRY(jstring(p, &len, "a tensor name"));
            MHA_TRY(jexpect(p, ':', "after a tensor name"));
            if (!strcmp(p->buf, "__metadata__")) {
                MHA_CHECK(!seen_meta++, MHA_ERR_FORMAT, "%s: duplicate __metadata__", p->name);
                MHA_TRY(parse_metadata(p, st));
            } else {
                MHA_TRY(grow((void **)&st->t, &st->cap, st->n, sizeof(st_entry)));
                st_entry *e = &st->t[st->n];
                memset(e, 0, sizeof *e);
                e->name = dup_str(p->buf, len);
                MHA_CHECK(e->name != NULL, MHA_ERR_NOMEM, "safetensors: cannot allocate names");
                st->n++;
                MHA_TRY(parse_tensor(p, e));
            }
            jws(p);
            MHA_CHECK(p->s < p->end && (*p->s == ',' || *p->s == '}'), MHA_ERR_FORMAT,
                      "%s: bad safetensors header JSON: expected ',' or '}' after an entry",
                      p->name);
            if (*p->s++ == '}')
                break;
        }
    }
    jws(p);
    MHA_CHECK(p->s == p->end, MHA_ERR_FORMAT,
              "%s: bad safetensors header JSON: text after the closing '}'", p->name);
    return MHA_OK;
}

/* ---- validation ------------------------------------------------------------ */

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

static int cmp_offset(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static mha_status validate(mha_safetensors *st, int64_t data_size) {
    const char *fn = st->f.name;
    for (int64_t i = 0; i < st->n; i++) {
        st_entry *e = &st->t[i];
        int64_t numel, bytes;
        MHA_CHECK(mha_product(e->shape, e->ndim, &numel) &&
                      !mha_mul_overflows(numel, (int64_t)e->itemsize, &bytes),
                  MHA_ERR_OVERFLOW, "%s: tensor '%s': shape x dtype size overflows", fn, e->name);
        MHA_CHECK(e->begin <= e->end, MHA_ERR_FORMAT,
                  "%s: tensor '%s': data_offsets [%lld, %lld] end before they begin", fn, e->name,
                  (long long)e->begin, (long long)e->end);
        MHA_CHECK(e->end <= data_size, MHA_ERR_FORMAT,
                  "%s: tensor '%s': data_offsets end %lld is past the data section (%lld bytes)",
                  fn, e->name, (long long)e->end, (long long)data_size);
        MHA_CHECK(e->end - e->begin == bytes, MHA_ERR_FORMAT,
                  "%s: tensor '%s': data_offsets span %lld bytes but shape x %s needs %lld", fn,
                  e->name, (long long)(e->end - e->begin), e->dtype, (long long)bytes);
    }
    if (st->n == 0) {
        MHA_CHECK(data_size == 0, MHA_ERR_FORMAT,
                  "%s: %lld data bytes are not indexed by any tensor", fn, (long long)data_size);
        return MHA_OK;
    }
    st_entry **ix = mha_malloc((size_t)st->n * sizeof *ix);
    MHA_CHECK(ix != NULL, MHA_ERR_NOMEM, "safetensors: cannot allocate the index");
    for (int64_t i = 0; i < st->n; i++)
        ix[i] = &st->t[i];
    mha_status s = MHA_OK;
    qsort(ix, (size_t)st->n, sizeof *ix, cmp_name);
    for (int64_t i = 1; i < st->n && s == MHA_OK; i++)
        if (!strcmp(ix[i]->name, ix[i - 1]->name))
            s = mha_error(MHA_ERR_FORMAT, "%s: duplicate tensor name '%s'", fn, ix[i]->name);
    qsort(ix, (size_t)st->n, sizeof *ix, cmp_offset);
    int64_t at = 0;
    for (int64_t i = 0; i < st->n && s == MHA_OK; i++) {
        if (ix[i]->begin > at)
            s = mha_error(MHA_ERR_FORMAT,
                          "%s: tensor '%s': hole: data_offsets begin at %lld but the previous "
                          "tensor ends at %lld",
                          fn, ix[i]->name, (long long)ix[i]->begin, (long long)at);
        else if (ix[i]->begin < at)
            s = mha_error(MHA_ERR_FORMAT,
                          "%s: tensor '%s': overlapping: data_offsets begin at %lld but the "
                          "previous tensor ends at %lld",
                          fn, ix[i]->name, (long long)ix[i]->begin, (long long)at);
        at = ix[i]->end;
    }
    if (s == MHA_OK && at != data_size)
        s = mha_error(MHA_ERR_FORMAT,
                      "%s: tensors end at %lld but the data section has %lld bytes "
                      "(trailing bytes)",
                      fn, (long long)at, (long long)data_size);
    mha_free(ix);
    return s;
}

/* ---- open / free ----------------------------------------------------------- */

void mha_safetensors_free(mha_safetensors *st) {
    if (!st)
        return;
    for (int64_t i = 0; i < st->n; i++)
        mha_free(st->t[i].name);
    for (int64_t i = 0; i < 2 * st->n_meta; i++)
        mha_free(st->meta[i]);
    for (int64_t i = 0; i < st->n_copies; i++)
        mha_free(st->copies[i]);
    mha_free(st->t);
    mha_free(st->meta);
    mha_free(st->copies);
    mha_file_unmap(&st->f, st->map);
    mha_file_close(&st->f);
    mha_free(st);
}

mha_status mha_safetensors_read(mha_file *f, mha_safetensors **out) {
    *out = NULL;
    mha_safetensors *st = mha_calloc(1, sizeof *st);
    if (!st) {
        mha_file_close(f);
        return mha_error(MHA_ERR_NOMEM, "safetensors: cannot allocate");
    }
    st->f = *f;
    f->fd = -1; /* now owned by st */
    const char *fn = st->f.name;
    mha_status s = MHA_OK;
    uint8_t pre[8];
    char *buf = NULL;
    uint8_t *hdr = NULL;
    if (st->f.size < 8)
        s = mha_error(MHA_ERR_FORMAT,
                      "%s: not a safetensors file: %lld bytes, shorter than the 8-byte header "
                      "length",
                      fn, (long long)st->f.size);
    if (s == MHA_OK)
        s = mha_file_read(&st->f, 0, pre, 8, "safetensors header length");
    uint64_t n = s == MHA_OK ? mha_le64(pre) : 0;
    if (s == MHA_OK && n > ST_MAX_HEADER)
        s = mha_error(MHA_ERR_FORMAT,
                      "%s: safetensors header length %llu exceeds the 100,000,000-byte limit", fn,
                      (unsigned long long)n);
    if (s == MHA_OK && n > (uint64_t)(st->f.size - 8))
        s = mha_error(MHA_ERR_FORMAT,
                      "%s: truncated: safetensors header length %llu but only %lld bytes follow",
                      fn, (unsigned long long)n, (long long)(st->f.size - 8));
    if (s == MHA_OK && n < 2)
        s = mha_error(MHA_ERR_FORMAT, "%s: safetensors header length %llu is too small", fn,
                      (unsigned long long)n);
    if (s == MHA_OK)
        s = mha_file_map(&st->f, &st->map);
    if (s == MHA_OK) {
        st->data_off = 8 + (int64_t)n;
        buf = mha_malloc((size_t)n + 1);
        if (!st->map)
            hdr = mha_malloc((size_t)n);
        if (!buf || (!st->map && !hdr))
            s = mha_error(MHA_ERR_NOMEM, "%s: cannot allocate %llu bytes for the header", fn,
                          (unsigned long long)n);
    }
    if (s == MHA_OK && hdr)
        s = mha_file_read(&st->f, 8, hdr, (size_t)n, "safetensors header");
    if (s == MHA_OK) {
        const uint8_t *h = st->map ? st->map + 8 : hdr;
        jp p = {h, h + n, h, fn, buf};
        s = parse_header(&p, st);
    }
    if (s == MHA_OK)
        s = validate(st, st->f.size - st->data_off);
    mha_free(buf);
    mha_free(hdr);
    if (s != MHA_OK) {
        mha_safetensors_free(st);
        return s;
    }
    *out = st;
    return MHA_OK;
}

mha_status mha_safetensors_open(mha_safetensors **st, const char *path) {
    MHA_CHECK(st != NULL, MHA_ERR_NULL, "safetensors: NULL output");
    *st = NULL;
    mha_file f;
    MHA_TRY(mha_file_open(&f, path));
    return mha_safetensors_read(&f, st);
}

/* ---- queries --------------------------------------------------------------- */

int64_t mha_safetensors_count(const mha_safetensors *st) { return st ? st->n : 0; }

const char *mha_safetensors_name(const mha_safetensors *st, int64_t i) {
    return st && i >= 0 && i < st->n ? st->t[i].name : NULL;
}

int64_t mha_safetensors_find(const mha_safetensors *st, const char *name) {
    if (!st || !name)
        return -1;
    for (int64_t i = 0; i < st->n; i++)
        if (!strcmp(st->t[i].name, name))
            return i;
    return -1;
}

mha_status mha_safetensors_info(const mha_safetensors *st, int64_t i, const char **dtype,
                                int *ndim, int64_t *shape) {
    MHA_CHECK(st != NULL, MHA_ERR_NULL, "safetensors: NULL file");
    MHA_CHECK(i >= 0 && i < st->n, MHA_ERR_VALUE, "safetensors: tensor index %lld of %lld",
              (long long)i, (long long)st->n);
    const st_entry *e = &st->t[i];
    if (dtype)
        *dtype = e->dtype;
    if (ndim)
        *ndim = e->ndim;
    if (shape)
        for (int k = 0; k < ST_MAX_DIMS; k++)
            shape[k] = k < e->ndim ? e->shape[k] : 0;
    return MHA_OK;
}

int64_t mha_safetensors_metadata_count(const mha_safetensors *st) { return st ? st->n_meta : 0; }

const char *mha_safetensors_metadata_key(const mha_safetensors *st, int64_t i) {
    return st && i >= 0 && i < st->n_meta ? st->meta[2 * i] : NULL;
}

const char *mha_safetensors_metadata_value(const mha_safetensors *st, int64_t i) {
    return st && i >= 0 && i < st->n_meta ? st->meta[2 * i + 1] : NULL;
}

const char *mha_safetensors_metadata(const mha_safetensors *st, const char *key) {
    for (int64_t i = 0; st && key && i < st->n_meta; i++)
        if (!strcmp(st->meta[2 * i], key))
            return st->meta[2 * i + 1];
    return NULL;
}

/* ---- loading --------------------------------------------------------------- */

static float elem_f32(const uint8_t *p, const char *dt) {
    switch (dt[0]) {
    case 'F':
        if (!strcmp(dt, "F32")) {
            uint32_t u = mha_le32(p);
            float f;
            memcpy(&f, &u, 4);
            return f;
        }
        if (!strcmp(dt, "F16"))
            return mha_half_to_float(mha_le16(p));
        {
            uint64_t u = mha_le64(p);
            double d;
            memcpy(&d, &u, 8);
            return (float)d;
        }
    case 'B':
        return dt[1] == 'F' ? mha_bf16_to_float(mha_le16(p)) : (float)(p[0] != 0);
    case 'I':
        return dt[1] == '8'   ? (float)(int8_t)p[0]
               : dt[1] == '1' ? (float)(int16_t)mha_le16(p)
               : dt[1] == '3' ? (float)(int32_t)mha_le32(p)
                              : (float)(int64_t)mha_le64(p);
    default: /* U */
        return dt[1] == '8'   ? (float)p[0]
               : dt[1] == '1' ? (float)mha_le16(p)
               : dt[1] == '3' ? (float)mha_le32(p)
                              : (float)mha_le64(p);
    }
}

static mha_status lookup(const mha_safetensors *st, const char *name, const st_entry **e) {
    MHA_CHECK(st != NULL && name != NULL, MHA_ERR_NULL, "safetensors: NULL file or name");
    int64_t i = mha_safetensors_find(st, name);
    MHA_CHECK(i >= 0, MHA_ERR_VALUE, "%s: no tensor named '%s'", st->f.name, name);
    *e = &st->t[i];
    MHA_CHECK(strncmp((*e)->dtype, "F8", 2) != 0, MHA_ERR_UNSUPPORTED,
              "%s: tensor '%s': dtype %s cannot be converted to float32", st->f.name, name,
              (*e)->dtype);
    MHA_CHECK((*e)->ndim <= MHA_MAX_DIMS, MHA_ERR_UNSUPPORTED,
              "%s: tensor '%s': %d dimensions (at most %d)", st->f.name, name, (*e)->ndim,
              MHA_MAX_DIMS);
    return MHA_OK;
}

mha_status mha_safetensors_get_f32(const mha_safetensors *st, const char *name, mha_tensor *out) {
    MHA_CHECK(out != NULL, MHA_ERR_NULL, "safetensors: NULL output tensor");
    memset(out, 0, sizeof *out);
    const st_entry *e;
    MHA_TRY(lookup(st, name, &e));
    mha_tensor t;
    MHA_TRY(mha_tensor_create(&t, MHA_F32, e->ndim, e->shape));
    int64_t numel = (e->end - e->begin) / (int64_t)e->itemsize;
    float *dst = t.data;
    mha_status s = MHA_OK;
    if (st->map) {
        const uint8_t *src = st->map + st->data_off + e->begin;
        for (int64_t i = 0; i < numel; i++)
            dst[i] = elem_f32(src + i * (int64_t)e->itemsize, e->dtype);
    } else {
        uint8_t buf[4096];
        int64_t per = (int64_t)(sizeof buf / e->itemsize);
        for (int64_t i = 0; i < numel && s == MHA_OK; i += per) {
            int64_t m = numel - i < per ? numel - i : per;
            s = mha_file_read((mha_file *)&st->f, st->data_off + e->begin + i * (int64_t)e->itemsize,
                              buf, (size_t)m * e->itemsize, "tensor data");
            for (int64_t j = 0; j < m && s == MHA_OK; j++)
                dst[i + j] = elem_f32(buf + j * (int64_t)e->itemsize, e->dtype);
        }
    }
    if (s != MHA_OK) {
        mha_tensor_free(&t);
        return s;
    }
    *out = t;
    return MHA_OK;
}

mha_status mha_safetensors_view_f32(mha_safetensors *st, const char *name, mha_tensor *view) {
    MHA_CHECK(view != NULL, MHA_ERR_NULL, "safetensors: NULL view");
    memset(view, 0, sizeof *view);
    const st_entry *e;
    MHA_TRY(lookup(st, name, &e));
    if (st->map && !strcmp(e->dtype, "F32")) {
        const uint8_t *src = st->map + st->data_off + e->begin;
        if (((uintptr_t)src & 3) == 0) /* aligned: no copy */
            return mha_tensor_init(view, MHA_F32, (void *)src, e->ndim, e->shape);
    }
    MHA_TRY(grow((void **)&st->copies, &st->cap_copies, st->n_copies, sizeof(void *)));
    mha_tensor t;
    MHA_TRY(mha_safetensors_get_f32(st, name, &t));
    st->copies[st->n_copies++] = t.data;
    *view = t;
    return MHA_OK;
}

/* The mha dtype a float tensor of the file keeps in a native view. */
static mha_dtype native_dtype(const char *dt) {
    return !strcmp(dt, "F16") ? MHA_F16 : !strcmp(dt, "BF16") ? MHA_BF16 : MHA_F32;
}

mha_status mha_safetensors_view(mha_safetensors *st, const char *name, mha_tensor *view) {
    MHA_CHECK(view != NULL, MHA_ERR_NULL, "safetensors: NULL view");
    memset(view, 0, sizeof *view);
    const st_entry *e;
    MHA_TRY(lookup(st, name, &e));
    MHA_CHECK(!strcmp(e->dtype, "F32") || !strcmp(e->dtype, "F16") || !strcmp(e->dtype, "BF16"),
              MHA_ERR_DTYPE,
              "%s: tensor '%s': dtype %s has no native view (F32, F16, BF16; "
              "mha_safetensors_view_f32 converts it)",
              st->f.name, name, e->dtype);
    const mha_dtype dt = native_dtype(e->dtype);
    if (st->map) {
        const uint8_t *src = st->map + st->data_off + e->begin;
        if (((uintptr_t)src & (e->itemsize - 1)) == 0) /* element-aligned: no copy */
            return mha_tensor_init(view, dt, (void *)src, e->ndim, e->shape);
    }
    /* not mapped, or misaligned: an aligned copy of the bytes, kept by st */
    MHA_TRY(grow((void **)&st->copies, &st->cap_copies, st->n_copies, sizeof(void *)));
    mha_tensor t;
    MHA_TRY(mha_tensor_create(&t, dt, e->ndim, e->shape));
    mha_status s = e->end > e->begin
                       ? mha_file_read(&st->f, st->data_off + e->begin, t.data,
                                       (size_t)(e->end - e->begin), "tensor data")
                       : MHA_OK;
    if (s != MHA_OK) {
        mha_tensor_free(&t);
        return s;
    }
    st->copies[st->n_copies++] = t.data;
    *view = t;
    return MHA_OK;
}

/* ---- writing --------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int nomem;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->nomem)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->cap ? b->cap * 2 : 256) + n;
        char *q = mha_malloc(nc);
        if (!q) {
            b->nomem = 1;
            return;
        }
        if (b->p)
            memcpy(q, b->p, b->n);
        mha_free(b->p);
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_json(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static const char *st_dtype_of(mha_dtype d) {
    switch (d) {
    case MHA_F32: return "F32";
    case MHA_F16: return "F16";
    case MHA_BF16: return "BF16";
    case MHA_BOOL: return "BOOL";
    case MHA_I64: return "I64";
    }
    return NULL;
}

static mha_status write_tensor(mha_wfile *w, const mha_tensor *t, int64_t numel) {
    size_t es = mha_dtype_size(t->dtype);
    uint8_t buf[8192];
    size_t used = 0;
    int64_t idx[MHA_MAX_DIMS] = {0};
    for (int64_t i = 0; i < numel; i++) {
        const uint8_t *src = (const uint8_t *)t->data + mha_offset(t, idx) * (int64_t)es;
        if (t->dtype == MHA_BOOL)
            buf[used] = src[0] != 0;
        else
            memcpy(buf + used, src, es); /* little-endian host */
        used += es;
        if (used + 8 > sizeof buf || i + 1 == numel) {
            MHA_TRY(mha_wfile_write(w, buf, used));
            used = 0;
        }
        for (int k = t->ndim - 1; k >= 0; k--) {
            if (++idx[k] < t->shape[k])
                break;
            idx[k] = 0;
        }
    }
    return MHA_OK;
}

mha_status mha_safetensors_write_synced(mha_wfile *w, const char *path,
                                        const char *const *names,
                                        const mha_tensor *const *tensors, int64_t n,
                                        const char *const *meta_keys,
                                        const char *const *meta_values, int64_t n_meta) {
    MHA_CHECK(w != NULL, MHA_ERR_NULL, "safetensors: NULL writer");
    memset(w, 0, sizeof *w);
    w->fd = -1;
    MHA_CHECK(path != NULL && (n == 0 || (names && tensors)) &&
                  (n_meta == 0 || (meta_keys && meta_values)),
              MHA_ERR_NULL, "safetensors: NULL path, names, tensors or metadata");
    MHA_CHECK(n >= 0 && n_meta >= 0, MHA_ERR_VALUE, "safetensors: negative count");
    int64_t *numel = mha_malloc((size_t)(n ? n : 1) * sizeof *numel);
    MHA_CHECK(numel != NULL, MHA_ERR_NOMEM, "safetensors: cannot allocate");
    mha_status s = MHA_OK;
    for (int64_t i = 0; i < n && s == MHA_OK; i++) {
        const mha_tensor *t = tensors[i];
        if (!names[i] || !t)
            s = mha_error(MHA_ERR_NULL, "safetensors: tensor %lld: NULL name or tensor",
                          (long long)i);
        else if (!names[i][0] || !strcmp(names[i], "__metadata__"))
            s = mha_error(MHA_ERR_VALUE, "safetensors: tensor %lld: invalid name '%s'",
                          (long long)i, names[i]);
        else if (!st_dtype_of(t->dtype))
            s = mha_error(MHA_ERR_DTYPE, "safetensors: tensor '%s': unknown dtype", names[i]);
        else if (t->ndim < 0 || t->ndim > MHA_MAX_DIMS)
            s = mha_error(MHA_ERR_SHAPE, "safetensors: tensor '%s': %d dimensions", names[i],
                          t->ndim);
        else if ((s = mha_tensor_numel(t, &numel[i])) == MHA_OK && numel[i] > 0 && !t->data)
            s = mha_error(MHA_ERR_NULL, "safetensors: tensor '%s': NULL data", names[i]);
        else if (s == MHA_OK && numel[i] > 0)
            s = mha_check_extent(t, names[i]);
        for (int64_t j = 0; j < i && s == MHA_OK; j++)
            if (!strcmp(names[i], names[j]))
                s = mha_error(MHA_ERR_VALUE, "safetensors: duplicate tensor name '%s'", names[i]);
    }
    for (int64_t i = 0; i < n_meta && s == MHA_OK; i++)
        if (!meta_keys[i] || !meta_values[i])
            s = mha_error(MHA_ERR_NULL, "safetensors: metadata %lld: NULL key or value",
                          (long long)i);
    sbuf b = {0};
    if (s == MHA_OK) {
        sb_str(&b, "{");
        if (n_meta > 0) {
            sb_str(&b, "\"__metadata__\":{");
            for (int64_t i = 0; i < n_meta; i++) {
                sb_str(&b, i ? "," : "");
                sb_json(&b, meta_keys[i]);
                sb_str(&b, ":");
                sb_json(&b, meta_values[i]);
            }
            sb_str(&b, "}");
        }
        int64_t off = 0;
        for (int64_t i = 0; i < n; i++) {
            const mha_tensor *t = tensors[i];
            char tmp[160];
            sb_str(&b, n_meta > 0 || i ? "," : "");
            sb_json(&b, names[i]);
            snprintf(tmp, sizeof tmp, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_of(t->dtype));
            sb_str(&b, tmp);
            for (int k = 0; k < t->ndim; k++) {
                snprintf(tmp, sizeof tmp, "%s%lld", k ? "," : "", (long long)t->shape[k]);
                sb_str(&b, tmp);
            }
            int64_t bytes = numel[i] * (int64_t)mha_dtype_size(t->dtype);
            snprintf(tmp, sizeof tmp, "],\"data_offsets\":[%lld,%lld]}", (long long)off,
                     (long long)(off + bytes));
            sb_str(&b, tmp);
            off += bytes;
        }
        sb_str(&b, "}");
        while (!b.nomem && b.n % 8 != 0) /* data section 8-byte aligned, as the reference */
            sb_str(&b, " ");
        if (b.nomem)
            s = mha_error(MHA_ERR_NOMEM, "safetensors: cannot allocate the header");
    }
    if (s == MHA_OK)
        s = mha_wfile_create(w, path);
    if (s == MHA_OK) {
        uint8_t len[8];
        for (int k = 0; k < 8; k++)
            len[k] = (uint8_t)((uint64_t)b.n >> (8 * k));
        s = mha_wfile_write(w, len, 8);
        if (s == MHA_OK)
            s = mha_wfile_write(w, b.p, b.n);
        for (int64_t i = 0; i < n && s == MHA_OK; i++)
            s = write_tensor(w, tensors[i], numel[i]);
        if (s == MHA_OK)
            s = mha_wfile_sync(w);
        if (s != MHA_OK)
            mha_wfile_discard(w);
    }
    mha_free(b.p);
    mha_free(numel);
    return s;
}

mha_status mha_safetensors_write(const char *path, const char *const *names,
                                 const mha_tensor *const *tensors, int64_t n,
                                 const char *const *meta_keys, const char *const *meta_values,
                                 int64_t n_meta) {
    mha_wfile w;
    MHA_TRY(mha_safetensors_write_synced(&w, path, names, tensors, n, meta_keys, meta_values,
                                         n_meta));
    mha_status s = mha_wfile_commit(&w);
    mha_wfile_discard(&w);
    return s;
}
