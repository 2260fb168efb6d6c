/* viz_model.c - `mha viz --model DIR --text "..." [--layer N]`: the
 * attention heads of a trained sentence-embedding model on one text, drawn
 * by the viz renderer with the WordPiece tokens as labels.
 *
 * Letter legend: H heads, L tokens of the text ([CLS] ... [SEP]). */
#include "cli.h"
#include "embedder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: mha viz --model DIR --text \"...\" [--layer N] [--svg F] [--png F]\n"
            "\n"
            "Draws every attention head of encoder layer N (default 0) of the model in DIR\n"
            "(`--model ''` or --model default: the default model, see mha embed --help) on\n"
            "the text, rows: query tokens, columns: key tokens, plus the head average.\n"
            "With neither --svg nor --png: ./mha-viz.svg and ./mha-viz.png.\n"
            "\nexit status: 0 written, 2 bad input (options, model files), 1 write failure\n");
}

int cli_viz_model(int argc, char **argv) {
    const char *cmd = "viz", *model = NULL, *text = NULL, *svg = NULL, *png = NULL;
    int64_t layer = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return CLI_OK;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "mha %s: unknown or incomplete option '%s' (mha viz --model DIR "
                    "--help)\n", cmd, o);
            return CLI_BAD_INPUT;
        }
        const char *v = argv[++i];
        if (!strcmp(o, "--model"))
            model = (!v[0] || !strcmp(v, "default")) ? NULL : v;
        else if (!strcmp(o, "--text"))
            text = v;
        else if (!strcmp(o, "--svg"))
            svg = v;
        else if (!strcmp(o, "--png"))
            png = v;
        else if (!strcmp(o, "--layer")) {
            int64_t x;
            if (!cli_parse_i64(v, 0, 4096, &x)) {
                fprintf(stderr, "mha %s: --layer %s: want an integer >= 0\n", cmd, v);
                return CLI_BAD_INPUT;
            }
            layer = x;
        } else {
            fprintf(stderr, "mha %s: option '%s' does not go with --model (mha viz --model DIR "
                    "--help)\n", cmd, o);
            return CLI_BAD_INPUT;
        }
    }
    if (!text) {
        fprintf(stderr, "mha %s: --model needs --text \"...\"\n", cmd);
        return CLI_BAD_INPUT;
    }
    int png_optional = 0;
    if (!svg && !png) {
        svg = "mha-viz.svg", png = "mha-viz.png";
        png_optional = 1;
    }
    cli_embedder e;
    int rc = cli_embedder_open(&e, cmd, model, 1);
    if (rc)
        return rc;
    if (layer >= e.info->layers) {
        fprintf(stderr, "mha %s: --layer %lld: the model has layers 0..%lld\n", cmd,
                (long long)layer, (long long)e.info->layers - 1);
        cli_embedder_close(&e);
        return CLI_BAD_INPUT;
    }
    int32_t *ids = NULL;
    int64_t L = 0;
    rc = cli_embedder_tokenize(&e, cmd, text, strlen(text), &ids, &L);
    const int64_t H = e.info->heads;
    float *w = rc ? NULL : malloc(sizeof(float) * (size_t)(H * L * L));
    const char **labels = rc ? NULL : malloc(sizeof(char *) * (size_t)L);
    if (!rc && (!w || !labels)) {
        fprintf(stderr, "mha %s: out of memory\n", cmd);
        rc = CLI_INTERNAL;
    }
    if (!rc) {
        mha_tensor W;
        mha_tensor_init(&W, MHA_F32, w, 3, (int64_t[]){H, L, L});
        mha_status st = mha_bert_attention(e.bert, &W, ids, L, layer);
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, "attention");
    }
    if (!rc) {
        for (int64_t t = 0; t < L; t++)
            labels[t] = cli_embedder_token(&e, ids[t]);
        char title[4400];
        snprintf(title, sizeof title, "%s, layer %lld: %lld heads (rows: queries, columns: keys)",
                 e.dir, (long long)layer, (long long)H);
        rc = cli_viz_write_maps(cmd, w, H, L, L, labels, labels, title, 0, svg, png,
                                png_optional);
    }
    free(labels);
    free(w);
    free(ids);
    cli_embedder_close(&e);
    return rc;
}
