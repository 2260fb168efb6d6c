/* model_dir.h - where `mha` commands find a sentence-transformers model
 * directory (tokenizer.json, config.json, model.safetensors, ...), and the
 * truncation length that model's sentence_bert_config.json asks for. */
#ifndef MHA_CLI_MODEL_DIR_H
#define MHA_CLI_MODEL_DIR_H

#include <stddef.h>
#include <stdint.h>

/* The default model, as `make model` extracts it into the checkout. */
#define MHA_CLI_DEFAULT_MODEL "models/all-MiniLM-L6-v2"

/* The model directory, first found of: flag (--model DIR; may be NULL),
 * $MHA_MODEL_DIR, MHA_CLI_DEFAULT_MODEL under the current directory, the
 * same under the parent of the executable's directory (build/mha finds the
 * checkout's models/).  Writes it to out[0..cap) and returns 0; when the
 * one named is not a directory, or none is found, prints why to stderr
 * (with how to get the model: `make model`) and returns 2 (CLI_BAD_INPUT). */
int mha_cli_model_dir(const char *flag, char *out, size_t cap);

/* max_seq_length of DIR/sentence_bert_config.json into *max_len: 256 when
 * the file is absent (sentence-transformers' default for this model).
 * Returns 0, or 2 after printing why (not JSON, not a positive integer, or
 * a build without libcjson). */
int mha_cli_max_seq_length(const char *dir, int64_t *max_len);

#endif
