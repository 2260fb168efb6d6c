/* model_dir.h - where the `mha` commands find a sentence-embedding model
 * (mha embed, search, tokenize, viz --model, demo). */
#ifndef MHA_CLI_MODEL_DIR_H
#define MHA_CLI_MODEL_DIR_H

#include <stddef.h>

/* Resolves the model directory into out (cap bytes), in this order:
 *   1. flag (the --model DIR value) when not NULL;
 *   2. the environment variable MHA_MODEL_DIR when set and not empty;
 *   3. models/all-MiniLM-L6-v2 relative to the current directory;
 *   4. models/all-MiniLM-L6-v2 relative to the executable's directory and
 *      to its parent (build/mha in a checkout finds the checkout's model).
 * 1 and 2 must name a directory (no fallback past an explicit choice); 3 and
 * 4 count when they hold a config.json.  Returns 0 on success; nonzero when
 * nothing is found, after printing to stderr what was tried and that
 * `make model` fetches the model. */
int mha_cli_model_dir(const char *flag, char *out, size_t cap);

#define MHA_CLI_DEFAULT_MODEL "models/all-MiniLM-L6-v2"

#endif
