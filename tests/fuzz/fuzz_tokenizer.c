/* fuzz_tokenizer.c - libFuzzer target for the tokenizer.json reader and the
 * text pipeline; without MHA_LIBFUZZER a plain program replaying files and
 * directories:
 *     fuzz_tokenizer tests/corpus/tokenizer tests/fixtures/tokenizer/tiny
 * Each input is read as a tokenizer.json (accepted ones encode a few texts
 * and the input itself) and encoded as text by a small built-in tokenizer,
 * with and without truncation. */
#include "../../src/text/text.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char builtin_json[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"[PAD]\"}, {\"id\": 4, \"content\": "
    "\"[MASK]\"}, {\"id\": 5, \"content\": \"[MASKED]\"}],"
    "\"normalizer\": {\"type\": \"BertNormalizer\", \"strip_accents\": null},"
    "\"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"},"
    "\"post_processor\": {\"type\": \"BertProcessing\", \"cls\": [\"[CLS]\", 2], \"sep\": "
    "[\"[SEP]\", 3]},"
    "\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"max_input_chars_per_word\": "
    "7, \"vocab\": {\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, \"[SEP]\": 3, \"[MASK]\": 4, "
    "\"[MASKED]\": 5, \"a\": 6, \"##a\": 7, \"b\": 8, \"##b\": 9, \"ab\": 10, \"\xe4\xb8\xad\": "
    "11, \"!\": 12, \"\xe3\x81\x8b\": 13, \"##\xe1\x85\xa1\": 14}}}";

static void encode_all(const mha_tokenizer *t, const char *s, size_t n) {
    static int32_t ids[1 << 16];
    int64_t got;
    static const int64_t lengths[] = {0, 2, 5, 300};
    for (int i = 0; i < 4; i++)
        if (mha_tokenizer_encode(t, s, n, lengths[i], ids, 1 << 16, &got) == MHA_OK)
            for (int64_t k = 0; k < got; k++) /* every id names a token */
                if (!mha_tokenizer_id_to_token(t, ids[k]))
                    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static mha_tokenizer *builtin;
    if (!builtin &&
        mha_tokenizer_open_mem(&builtin, builtin_json, sizeof builtin_json - 1, "builtin") !=
            MHA_OK)
        return 0; /* a build without cJSON or utf8proc: nothing to fuzz */
    if (size > (1 << 20))
        return 0;
    mha_tokenizer *t;
    if (mha_tokenizer_open_mem(&t, (const char *)data, size, "fuzz.json") == MHA_OK) {
        static const char text[] = "Hello, World! caf\xc3\xa9 [MASK]x\0y \xe4\xb8\xad\xff";
        encode_all(t, text, sizeof text - 1);
        encode_all(t, (const char *)data, size);
        mha_tokenizer_free(t);
    }
    encode_all(builtin, (const char *)data, size);
    return 0;
}

#ifndef MHA_LIBFUZZER
#include "../fuzz/replay.h"
int main(int argc, char **argv) { return fuzz_replay_main(argc, argv, LLVMFuzzerTestOneInput); }
#endif
