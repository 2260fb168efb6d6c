/* tokenizer_stub_REMOVE_AT_MERGE.c - TEMPORARY stand-in for the WordPiece
 * tokenizer of branch `tokenizer` (src/text/), so that branch `bert` links.
 * Every call reports MHA_ERR_UNSUPPORTED "tokenizer not built"; the tests
 * that need a tokenizer report skipped.  THE LEAD DELETES THIS FILE AT MERGE
 * (the real functions then come from src/text/). */
#include "mha.h"

#include <stddef.h>

/* the library's error recorder (src/status.c), not in the public header */
extern mha_status mha_error(mha_status status, const char *fmt, ...);

mha_status mha_tokenizer_open(mha_tokenizer **tok, const char *tokenizer_json_path) {
    (void)tokenizer_json_path;
    if (tok)
        *tok = NULL;
    return mha_error(MHA_ERR_UNSUPPORTED, "tokenizer not built");
}

void mha_tokenizer_free(mha_tokenizer *tok) { (void)tok; }

mha_status mha_tokenizer_encode(const mha_tokenizer *tok, const char *text, size_t len,
                                int64_t max_length, int32_t *ids, int64_t capacity, int64_t *n) {
    (void)tok, (void)text, (void)len, (void)max_length, (void)ids, (void)capacity;
    if (n)
        *n = 0;
    return mha_error(MHA_ERR_UNSUPPORTED, "tokenizer not built");
}

int64_t mha_tokenizer_vocab_size(const mha_tokenizer *tok) {
    (void)tok;
    return 0;
}

const char *mha_tokenizer_id_to_token(const mha_tokenizer *tok, int32_t id) {
    (void)tok, (void)id;
    return NULL;
}
