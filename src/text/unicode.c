/* unicode.c - UTF-8, the character classes and BertNormalizer, as Hugging
 * Face tokenizers (normalizers/bert.rs, pre_tokenizers/bert.rs) runs them.
 *
 * WHERE THE UNICODE DATA COMES FROM
 *   tokenizers takes Cc/Cf/Co, punctuation and Mn from the unicode_categories
 *   crate, whose tables are frozen at an old Unicode version: utf8proc 2.8's
 *   categories (Unicode 15) disagree on ~600 code points (newer format
 *   characters it does not delete, newer punctuation it does not split, newer
 *   marks it does not strip).  Those three classes are therefore tables
 *   generated from the library itself (unicode_tables.h, by
 *   tests/fixtures/gen_tokenizer_fixtures.py).  Canonical decomposition,
 *   combining classes and case mapping come from utf8proc; the few places
 *   where tokenizers' own libraries differ from utf8proc 2.8 are listed
 *   below (found by the unit test that compares every code point).
 *   White_Space (Rust's char::is_whitespace) is a fixed list.
 */
#include "text.h"

#include <stdlib.h>
#include <string.h>

#include "unicode_tables.h"

#ifdef MHA_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

/* ---- growable code point arrays ------------------------------------------ */

mha_status mha_cps_grow_push(mha_cps *a, uint32_t c) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 1024;
        MHA_CHECK(cap < SIZE_MAX / sizeof *a->v, MHA_ERR_OVERFLOW, "text: too many code points");
        uint32_t *v = mha_malloc(cap * sizeof *v);
        MHA_CHECK(v != NULL, MHA_ERR_NOMEM, "text: out of memory for %zu code points", cap);
        if (a->n)
            memcpy(v, a->v, a->n * sizeof *v);
        if (!a->borrowed)
            mha_free(a->v);
        a->v = v;
        a->cap = cap;
        a->borrowed = 0;
    }
    a->v[a->n++] = c;
    return MHA_OK;
}

void mha_cps_free(mha_cps *a) {
    if (!a->borrowed)
        mha_free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
    a->borrowed = 0;
}

/* ---- UTF-8 ------------------------------------------------------------------ */

/* ref: The Unicode Standard 15.0, §3.9 table 3-7 (well-formed byte sequences)
 * and "U+FFFD substitution of maximal subparts" (§3.9.6). */
mha_status mha_utf8_decode(const char *s, size_t len, mha_cps *out) {
    const uint8_t *b = (const uint8_t *)s;
    size_t i = 0;
    while (i < len) {
        uint8_t c = b[i];
        if (c < 0x80) {
            MHA_TRY(mha_cps_push(out, c));
            i++;
            continue;
        }
        int need;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1, cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2, cp = c & 0x0F;
            if (c == 0xE0)
                lo = 0xA0;
            if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3, cp = c & 0x07;
            if (c == 0xF0)
                lo = 0x90;
            if (c == 0xF4)
                hi = 0x8F;
        } else { /* 80..C1, F5..FF: never a lead byte */
            MHA_TRY(mha_cps_push(out, 0xFFFD));
            i++;
            continue;
        }
        size_t j = i + 1;
        int got = 0;
        for (; got < need && j < len; got++, j++) {
            uint8_t t = b[j];
            if (t < (got ? 0x80 : lo) || t > (got ? 0xBF : hi))
                break;
            cp = (cp << 6) | (t & 0x3F);
        }
        MHA_TRY(mha_cps_push(out, got == need ? cp : 0xFFFD));
        i = j;
    }
    return MHA_OK;
}

int mha_utf8_put(uint32_t c, char *buf) {
    if (c < 0x80) {
        buf[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        buf[0] = (char)(0xC0 | (c >> 6));
        buf[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        buf[0] = (char)(0xE0 | (c >> 12));
        buf[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        buf[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    buf[0] = (char)(0xF0 | (c >> 18));
    buf[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    buf[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    buf[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* ---- character classes -------------------------------------------------- */

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t c) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c < r[mid][0])
            hi = mid;
        else if (c > r[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}
#define IN_TABLE(t, c) in_ranges((t), sizeof(t) / sizeof *(t), (c))

/* ASCII answers without the tables (the common case): same values. */
int mha_char_is_deleted(uint32_t c) {
    if (c < 0x80)
        return (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F;
    return IN_TABLE(tk_deleted, c);
}

int mha_char_in_punct_table(uint32_t c) { return IN_TABLE(tk_punct, c); }

int mha_char_is_cjk(uint32_t c) {
    /* ref: tokenizers normalizers/bert.rs is_chinese_char (the CJK blocks) */
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* ---- BertNormalizer ----------------------------------------------------- */

#ifdef MHA_HAVE_UTF8PROC
int mha_text_have_unicode(void) { return 1; }

/* Canonical decompositions newer than tokenizers' NFD tables
 * (unicode-normalization-alignments): kept whole, as it keeps them. */
static int nfd_is_newer(uint32_t c) { return c == 0x11938; /* DIVES AKURU VOWEL SIGN O */ }

static int ccc(uint32_t c) {
    return c < 0x300 ? 0 : utf8proc_get_property((utf8proc_int32_t)c)->combining_class;
}

/* Appends the NFD of in[0..n) to *out: full canonical decomposition, then
 * the canonical ordering of every run of non-starters (stable by class).
 * ref: UAX #15, §1.3 and Unicode 15.0 §3.11 D108-D109. */
static mha_status nfd(const uint32_t *in, size_t n, mha_cps *out) {
    for (size_t i = 0; i < n; i++) {
        utf8proc_int32_t d[32];
        int last = 0;
        utf8proc_ssize_t k = 1;
        d[0] = (utf8proc_int32_t)in[i];
        if (in[i] < 0xC0) { /* nothing below U+00C0 decomposes, all starters */
            MHA_TRY(mha_cps_push(out, in[i]));
            continue;
        }
        if (!nfd_is_newer(in[i]))
            k = utf8proc_decompose_char((utf8proc_int32_t)in[i], d, 32, UTF8PROC_DECOMPOSE, &last);
        if (k < 1 || k > 32) /* cannot happen for scalar values; keep the char */
            k = 1, d[0] = (utf8proc_int32_t)in[i];
        for (utf8proc_ssize_t j = 0; j < k; j++) {
            uint32_t c = (uint32_t)d[j];
            MHA_TRY(mha_cps_push(out, c));
            int cc = ccc(c);
            /* insertion into the run of non-starters before it */
            for (size_t p = out->n - 1; cc && p > 0 && ccc(out->v[p - 1]) > cc; p--) {
                out->v[p] = out->v[p - 1];
                out->v[p - 1] = c;
            }
        }
    }
    return MHA_OK;
}

/* Lowercase mappings Rust's char::to_lowercase has (Unicode 16) and
 * utf8proc 2.8 (Unicode 15) lacks: [first, last, target of first]. */
static const uint32_t lower_newer[][3] = {
    {0x1C89, 0x1C89, 0x1C8A}, {0xA7CB, 0xA7CB, 0x0264}, {0xA7CC, 0xA7CC, 0xA7CD},
    {0xA7CE, 0xA7CE, 0xA7CF}, {0xA7D2, 0xA7D2, 0xA7D3}, {0xA7D4, 0xA7D4, 0xA7D5},
    {0xA7DA, 0xA7DA, 0xA7DB}, {0xA7DC, 0xA7DC, 0x019B}, {0x10D50, 0x10D65, 0x10D70},
    {0x16EA0, 0x16EB8, 0x16EBB},
};

/* Per code point, as Rust's char::to_lowercase: the full mapping, which
 * differs from the simple one only at U+0130 ("i" + U+0307). */
static mha_status lowercase(uint32_t c, mha_cps *out) {
    if (c < 0x80)
        return mha_cps_push(out, c >= 'A' && c <= 'Z' ? c + 32 : c);
    if (c == 0x130) {
        MHA_TRY(mha_cps_push(out, 'i'));
        return mha_cps_push(out, 0x307);
    }
    for (size_t i = 0; i < sizeof lower_newer / sizeof *lower_newer; i++)
        if (c >= lower_newer[i][0] && c <= lower_newer[i][1])
            return mha_cps_push(out, lower_newer[i][2] + (c - lower_newer[i][0]));
    return mha_cps_push(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)c));
}
#else
int mha_text_have_unicode(void) { return 0; }
#endif

mha_status mha_bert_normalize(const mha_bert_normalizer *opt, const uint32_t *in, size_t n,
                              mha_cps *out, mha_cps *scratch) {
#ifndef MHA_HAVE_UTF8PROC
    (void)scratch;
    MHA_CHECK(!opt->strip_accents && !opt->lowercase, MHA_ERR_UNSUPPORTED,
              "tokenizer: this build has no utf8proc (NFD and lowercasing need it; "
              "install libutf8proc-dev and rebuild)");
#endif
    size_t start = out->n;
    size_t ascii = 0;
    while (ascii < n && in[ascii] < 0x80)
        ascii++;
    if (ascii == n) { /* ASCII only: every step is per character, no NFD */
        for (size_t i = 0; i < n; i++) {
            uint32_t c = in[i];
            if (opt->clean_text && (c < 0x20 || c == 0x7F)) {
                if (mha_char_is_deleted(c))
                    continue;
                c = ' '; /* tab, LF, CR */
            }
            MHA_TRY(mha_cps_push(out, opt->lowercase && c >= 'A' && c <= 'Z' ? c + 32 : c));
        }
        return MHA_OK;
    }
    /* 1. clean_text and 2. handle_chinese_chars, in one pass, into out */
    for (size_t i = 0; i < n; i++) {
        uint32_t c = in[i];
        if (c >= 0x20 && c < 0x7F) { /* printable ASCII: kept as it is */
            MHA_TRY(mha_cps_push(out, c));
            continue;
        }
        if (opt->clean_text) {
            if (mha_char_is_deleted(c))
                continue;
            if (mha_char_is_whitespace(c))
                c = ' ';
        }
        if (opt->handle_chinese_chars && mha_char_is_cjk(c)) {
            MHA_TRY(mha_cps_push(out, ' '));
            MHA_TRY(mha_cps_push(out, c));
            MHA_TRY(mha_cps_push(out, ' '));
        } else {
            MHA_TRY(mha_cps_push(out, c));
        }
    }
#ifdef MHA_HAVE_UTF8PROC
    if (!opt->strip_accents && !opt->lowercase)
        return MHA_OK;
    /* 3. strip accents: NFD, then drop the nonspacing marks (into scratch) */
    scratch->n = 0;
    if (opt->strip_accents) {
        MHA_TRY(nfd(out->v + start, out->n - start, scratch));
        size_t k = 0;
        for (size_t i = 0; i < scratch->n; i++)
            if (scratch->v[i] < 0x300 || !IN_TABLE(tk_marks, scratch->v[i]))
                scratch->v[k++] = scratch->v[i];
        scratch->n = k;
    } else {
        for (size_t i = start; i < out->n; i++)
            MHA_TRY(mha_cps_push(scratch, out->v[i]));
    }
    /* 4. lowercase, per code point (back into out) */
    out->n = start;
    for (size_t i = 0; i < scratch->n; i++) {
        uint32_t c = scratch->v[i];
        if (c < 0x80 || !opt->lowercase)
            MHA_TRY(mha_cps_push(out, opt->lowercase && c >= 'A' && c <= 'Z' ? c + 32 : c));
        else
            MHA_TRY(lowercase(c, out));
    }
#else
    (void)start;
#endif
    return MHA_OK;
}
