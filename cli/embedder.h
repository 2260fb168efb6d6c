/* embedder.h - text in, sentence embeddings out, for the `mha` commands
 * (embed, search, viz --model, demo): the model directory resolved
 * (model_dir.h), the model (mha_bert_*) and its tokenizer (mha_tokenizer_*)
 * opened together, texts tokenised to sentence_bert_config.json's
 * max_seq_length and embedded in batches.  The only CLI file that calls the
 * tokenizer. */
#ifndef MHA_CLI_EMBEDDER_H
#define MHA_CLI_EMBEDDER_H

#include "mha.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cli_embedder {
    mha_bert *bert;
    mha_tokenizer *tok;
    const mha_bert_info *info;
    char dir[4096];
} cli_embedder;

/* Opens the model found from model_flag (--model value or NULL) and, when
 * with_tokenizer, its tokenizer.  On failure prints "mha CMD: ..." and returns the exit code
 * (CLI_BAD_INPUT / CLI_INTERNAL); 0 on success. */
int cli_embedder_open(cli_embedder *e, const char *cmd, const char *model_flag,
                      int with_tokenizer);
void cli_embedder_close(cli_embedder *e);

/* ids of one text: [CLS] ... [SEP], at most max_seq_length.  *ids is
 * malloc'd (free it); returns 0 or an exit code after printing. */
int cli_embedder_tokenize(cli_embedder *e, const char *cmd, const char *text, size_t len,
                          int32_t **ids, int64_t *n);

/* The vocabulary string of id ("?" when unknown). */
const char *cli_embedder_token(const cli_embedder *e, int32_t id);

/* out (n,D) row-major = embeddings of texts[i] (lens[i] bytes), batch texts
 * per library call (>= 1).  as_ids: each text is whitespace-separated token
 * ids (no tokenizer needed), taken as they are.  Returns 0 or an exit code after printing. */
int cli_embedder_embed(cli_embedder *e, const char *cmd, const char *const *texts,
                       const size_t *lens, int64_t n, int64_t batch, int as_ids, float *out);

#endif
