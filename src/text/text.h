/* text.h - internals of the WordPiece tokenizer (src/text/): code points,
 * the character classes and the BertNormalizer steps, shared by
 * tokenizer.c, unicode.c and the unit tests (which check every code point
 * against the `tokenizers` library through these functions).
 * Internal to the library; never installed. */
#ifndef MHA_TEXT_H
#define MHA_TEXT_H

#include "../internal.h"

#include <stddef.h>
#include <stdint.h>

/* A growable array of code points (free with mha_cps_free).  {0} is an
 * empty one; mha_cps_on starts in a caller's buffer (a stack array), left
 * for the heap only when it outgrows it. */
typedef struct mha_cps {
    uint32_t *v;
    size_t n, cap;
    int borrowed;            /* v is the caller's buffer: never freed here */
} mha_cps;

static inline mha_cps mha_cps_on(uint32_t *buf, size_t cap) {
    mha_cps a = {buf, 0, cap, 1};
    return a;
}

/* Appends c (grows the array: MHA_ERR_NOMEM / MHA_ERR_OVERFLOW on failure). */
mha_status mha_cps_grow_push(mha_cps *a, uint32_t c);
static inline mha_status mha_cps_push(mha_cps *a, uint32_t c) {
    if (a->n < a->cap) {
        a->v[a->n++] = c;
        return MHA_OK;
    }
    return mha_cps_grow_push(a, c);
}
void mha_cps_free(mha_cps *a);

/* Appends the code points of UTF-8 bytes s[0..len) to *out.  A byte
 * sequence that is not well-formed UTF-8 (Unicode 15 table 3-7: stray
 * continuation bytes, overlong forms, surrogates, above U+10FFFF, cut
 * sequences) becomes one U+FFFD per maximal subpart, as Python's
 * bytes.decode('utf-8', 'replace') does.  NUL bytes are code points. */
mha_status mha_utf8_decode(const char *s, size_t len, mha_cps *out);

/* Appends the UTF-8 encoding of c (a scalar value) to buf, returns bytes (1..4). */
int mha_utf8_put(uint32_t c, char *buf);

/* The character classes as Hugging Face tokenizers has them (tables
 * generated from the library itself, src/text/unicode_tables.h). */
int mha_char_is_deleted(uint32_t c);     /* clean_text removes it        */
int mha_char_is_cjk(uint32_t c);         /* handle_chinese_chars spaces it */
int mha_char_in_punct_table(uint32_t c); /* the table, any code point    */

/* BertPreTokenizer isolates it: ASCII punctuation ($+<=>^`|~ included),
 * else the generated table (inline: the pre-tokenizer asks per character). */
static inline int mha_char_is_punct(uint32_t c) {
    if (c < 0x80)
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
               (c >= 0x7B && c <= 0x7E);
    return mha_char_in_punct_table(c);
}

/* Rust's char::is_whitespace, the White_Space property.
 * ref: Unicode PropList.txt White_Space (unchanged since Unicode 6.3). */
static inline int mha_char_is_whitespace(uint32_t c) {
    if (c < 0x80)
        return (c >= 0x09 && c <= 0x0D) || c == 0x20;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* BertNormalizer's options (tokenizer.json "normalizer"). */
typedef struct mha_bert_normalizer {
    int clean_text, handle_chinese_chars, strip_accents, lowercase;
} mha_bert_normalizer;

/* 1 when utf8proc is compiled in (NFD and case mapping need it). */
int mha_text_have_unicode(void);

/* Normalizes in[0..n) into *out (appended) as BertNormalizer does: clean
 * text, space CJK ideographs, NFD + drop nonspacing marks, lowercase per
 * code point.  scratch: any array (reused, so a caller can keep it across
 * calls).  MHA_ERR_UNSUPPORTED without utf8proc when NFD or lowercasing is
 * asked for. */
mha_status mha_bert_normalize(const mha_bert_normalizer *opt, const uint32_t *in, size_t n,
                              mha_cps *out, mha_cps *scratch);

/* mha_tokenizer_open on a tokenizer.json held in memory (json[0..size),
 * not NUL-terminated); name is used in messages.  For the fuzz target. */
mha_status mha_tokenizer_open_mem(mha_tokenizer **tok, const char *json, size_t size,
                                  const char *name);

#endif
