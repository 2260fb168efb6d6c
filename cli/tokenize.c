/* tokenize.c - `mha tokenize`: a model's WordPiece ids (or tokens) for each
 * text, a thin client of mha_tokenizer_encode().  docs/models.md. */
#include "cli.h"
#include "model_dir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: mha tokenize [--model DIR] [--tokens] [--max-length N] [--time] [TEXT ...]\n"
            "\n"
            "The ids the model's tokenizer.json gives each TEXT, as Hugging Face tokenizers\n"
            "and sentence-transformers give them: one line of space-separated ids per text,\n"
            "[CLS] first and [SEP] last.  Without TEXT, one text per line of standard input.\n"
            "  --model DIR       the model directory (default: $MHA_MODEL_DIR, else\n"
            "                    " MHA_CLI_DEFAULT_MODEL " here or beside the executable;\n"
            "                    `make model` fetches it)\n"
            "  --tokens          print the token strings instead of the ids\n"
            "  --max-length N    ids per text at most, specials included (default: the\n"
            "                    model's sentence_bert_config.json max_seq_length, else 256;\n"
            "                    0 = no truncation)\n"
            "  --time            print the tokenizer's load and encode times to stderr\n"
            "\nexit status: 0 ok, 2 bad input (arguments, model files), 1 internal failure\n");
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct tk_run {
    const mha_tokenizer *tok;
    int64_t max_length;
    int tokens;
    int32_t *ids;
    int64_t cap;
    int64_t texts, total;
    double encode_ms;
} tk_run;

/* Encodes one text and prints its line. */
static int one_text(tk_run *r, const char *s, size_t len) {
    int64_t n = 0;
    double t0 = now_ms();
    mha_status st = mha_tokenizer_encode(r->tok, s, len, r->max_length, r->ids, r->cap, &n);
    if (st == MHA_ERR_SHAPE && n > r->cap) {
        int32_t *ids = realloc(r->ids, (size_t)n * sizeof *ids);
        if (!ids) {
            fprintf(stderr, "mha tokenize: out of memory for %lld ids\n", (long long)n);
            return CLI_INTERNAL;
        }
        r->ids = ids;
        r->cap = n;
        st = mha_tokenizer_encode(r->tok, s, len, r->max_length, r->ids, r->cap, &n);
    }
    r->encode_ms += now_ms() - t0;
    if (st != MHA_OK)
        return cli_fail("tokenize", st, NULL);
    for (int64_t i = 0; i < n; i++) {
        if (i)
            putchar(' ');
        if (r->tokens)
            fputs(mha_tokenizer_id_to_token(r->tok, r->ids[i]), stdout);
        else { /* printf is the cost of this loop otherwise */
            char buf[16], *e = buf + sizeof buf, *q = e;
            uint32_t v = (uint32_t)r->ids[i];
            do
                *--q = (char)('0' + v % 10);
            while (v /= 10);
            fwrite(q, 1, (size_t)(e - q), stdout);
        }
    }
    putchar('\n');
    r->texts++;
    r->total += n;
    return CLI_OK;
}

int cli_tokenize(int argc, char **argv) {
    const char *model = NULL;
    int tokens = 0, timing = 0, first_text = argc;
    int64_t max_length = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return CLI_OK;
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(argv[i], "--max-length") && i + 1 < argc) {
            int64_t v;
            if (!cli_parse_i64(argv[++i], 0, INT64_MAX, &v)) {
                fprintf(stderr, "mha tokenize: --max-length: '%s' is not an integer >= 0\n",
                        argv[i]);
                return CLI_BAD_INPUT;
            }
            max_length = v;
        } else if (!strcmp(argv[i], "--tokens")) {
            tokens = 1;
        } else if (!strcmp(argv[i], "--time")) {
            timing = 1;
        } else if (!strcmp(argv[i], "--")) {
            first_text = i + 1;
            break;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "mha tokenize: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return CLI_BAD_INPUT;
        } else {
            first_text = i;
            break;
        }
    }
    char dir[4096], path[4200];
    if (mha_cli_model_dir(model, dir, sizeof dir) != CLI_OK)
        return CLI_BAD_INPUT;
    if (max_length < 0 && mha_cli_max_seq_length(dir, &max_length) != CLI_OK)
        return CLI_BAD_INPUT;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    double t0 = now_ms();
    mha_tokenizer *tok;
    mha_status st = mha_tokenizer_open(&tok, path);
    if (st != MHA_OK) { /* a missing or unreadable model file is bad input too */
        int rc = cli_fail("tokenize", st, NULL);
        return st == MHA_ERR_NOMEM ? rc : CLI_BAD_INPUT;
    }
    double load_ms = now_ms() - t0;
    tk_run r = {.tok = tok, .max_length = max_length, .tokens = tokens};
    int rc = CLI_OK;
    for (int i = first_text; i < argc && rc == CLI_OK; i++)
        rc = one_text(&r, argv[i], strlen(argv[i]));
    if (first_text >= argc) {
        char *line = NULL;
        size_t cap = 0;
        for (ssize_t n; rc == CLI_OK && (n = getline(&line, &cap, stdin)) >= 0;)
            rc = one_text(&r, line, (size_t)n - (n > 0 && line[n - 1] == '\n'));
        free(line);
    }
    if (timing)
        fprintf(stderr, "mha tokenize: %lld texts, %lld ids: load %.1f ms, encode %.2f ms "
                "(%.2f us per text)\n", (long long)r.texts, (long long)r.total, load_ms,
                r.encode_ms, r.texts ? 1e3 * r.encode_ms / (double)r.texts : 0.0);
    free(r.ids);
    mha_tokenizer_free(tok);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "mha tokenize: writing the output failed\n");
        return CLI_INTERNAL;
    }
    return rc;
}
