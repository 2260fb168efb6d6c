/* embedder.c - the model and tokenizer behind `mha embed`, `mha search`,
 * `mha viz --model` and the demo's model section (see embedder.h). */
#include "embedder.h"
#include "cli.h"
#include "model_dir.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_embedder_open(cli_embedder *e, const char *cmd, const char *model_flag,
                      int with_tokenizer) {
    memset(e, 0, sizeof *e);
    if (mha_cli_model_dir(model_flag, e->dir, sizeof e->dir))
        return CLI_BAD_INPUT;
    mha_status st = mha_bert_open(&e->bert, e->dir);
    if (st != MHA_OK) { /* a missing or unreadable model file is bad input too */
        int rc = cli_fail(cmd, st, e->dir);
        return st == MHA_ERR_NOMEM ? rc : CLI_BAD_INPUT;
    }
    e->info = mha_bert_get_info(e->bert);
    if (!with_tokenizer)
        return CLI_OK;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", e->dir);
    st = mha_tokenizer_open(&e->tok, path);
    if (st != MHA_OK) {
        int rc = cli_fail(cmd, st, path);
        cli_embedder_close(e);
        return st == MHA_ERR_NOMEM ? rc : CLI_BAD_INPUT;
    }
    if (mha_tokenizer_vocab_size(e->tok) != e->info->vocab) {
        fprintf(stderr, "mha %s: %s has %lld tokens but config.json vocab_size is %lld\n", cmd,
                path, (long long)mha_tokenizer_vocab_size(e->tok), (long long)e->info->vocab);
        cli_embedder_close(e);
        return CLI_BAD_INPUT;
    }
    return CLI_OK;
}

void cli_embedder_close(cli_embedder *e) {
    mha_tokenizer_free(e->tok);
    mha_bert_free(e->bert);
    memset(e, 0, sizeof *e);
}

int cli_embedder_tokenize(cli_embedder *e, const char *cmd, const char *text, size_t len,
                          int32_t **ids, int64_t *n) {
    const int64_t cap = e->info->max_seq_length;
    *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!*ids) {
        fprintf(stderr, "mha %s: out of memory\n", cmd);
        return CLI_INTERNAL;
    }
    mha_status st = mha_tokenizer_encode(e->tok, text, len, cap, *ids, cap, n);
    if (st != MHA_OK) {
        free(*ids);
        *ids = NULL;
        return cli_fail(cmd, st, "tokenizer");
    }
    return CLI_OK;
}

/* ids (up to cap) = the whitespace-separated integers of text[0..len). */
static int parse_ids(const char *cmd, const char *text, size_t len, int64_t cap, int32_t *ids,
                     int64_t *n) {
    *n = 0;
    size_t i = 0;
    while (i < len) {
        while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == ','))
            i++;
        if (i == len)
            break;
        int64_t v = 0;
        size_t j = i;
        while (j < len && text[j] >= '0' && text[j] <= '9' && v <= INT32_MAX)
            v = v * 10 + (text[j++] - '0');
        if (j == i || v > INT32_MAX || (j < len && text[j] != ' ' && text[j] != '\t' &&
                                         text[j] != ',')) {
            fprintf(stderr, "mha %s: --ids: '%.*s' is not a list of token ids\n", cmd,
                    (int)(len < 60 ? len : 60), text);
            return CLI_BAD_INPUT;
        }
        if (*n == cap) {
            fprintf(stderr, "mha %s: --ids: more than %lld ids in one text\n", cmd,
                    (long long)cap);
            return CLI_BAD_INPUT;
        }
        ids[(*n)++] = (int32_t)v;
        i = j;
    }
    return CLI_OK;
}

int cli_embedder_embed(cli_embedder *e, const char *cmd, const char *const *texts,
                       const size_t *lens, int64_t n, int64_t batch, int as_ids, float *out) {
    const int64_t D = e->info->hidden, P = e->info->max_positions;
    const int64_t cap = as_ids ? P : e->info->max_seq_length;
    if (batch < 1)
        batch = 1;
    int64_t nb = batch < n ? batch : n;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(nb * cap + 1));
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(nb + 1));
    int rc = CLI_OK;
    if (!ids || !off) {
        fprintf(stderr, "mha %s: out of memory\n", cmd);
        rc = CLI_INTERNAL;
    }
    for (int64_t i0 = 0; rc == CLI_OK && i0 < n; i0 += batch) {
        int64_t m = n - i0 < batch ? n - i0 : batch;
        off[0] = 0;
        for (int64_t i = 0; i < m && rc == CLI_OK; i++) {
            int64_t k = 0;
            if (as_ids) {
                rc = parse_ids(cmd, texts[i0 + i], lens[i0 + i], e->info->max_positions,
                               ids + off[i], &k);
            } else {
                mha_status st = mha_tokenizer_encode(e->tok, texts[i0 + i], lens[i0 + i], cap,
                                                     ids + off[i], cap, &k);
                if (st != MHA_OK)
                    rc = cli_fail(cmd, st, "tokenizer");
            }
            off[i + 1] = off[i] + k;
        }
        if (rc != CLI_OK)
            break;
        mha_tensor o;
        mha_tensor_init(&o, MHA_F32, out + i0 * D, 2, (int64_t[]){m, D});
        mha_status st = mha_bert_embed(e->bert, &o, ids, off, m);
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, "embed");
    }
    free(ids);
    free(off);
    return rc;
}

const char *cli_embedder_token(const cli_embedder *e, int32_t id) {
    const char *t = e->tok ? mha_tokenizer_id_to_token(e->tok, id) : NULL;
    return t ? t : "?";
}
