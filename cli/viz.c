/* viz.c - `mha viz`: attention maps people can look at.
 *
 * Runs nn.MultiheadAttention with per-head weights (need_weights=True,
 * average_attn_weights=False) on the inputs of `mha forward`, or on the
 * seeds' example when given no inputs, and draws one heat map per head plus
 * the head average (render.c) as SVG and PNG.
 *
 * Letter legend: B batch, H heads, L queries, S keys, S' = S + bias_k +
 * add_zero_attn columns, E model width.
 */
#include "cli.h"
#include "mha_inputs.h"
#include "render.h"
#include "seeds.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const DEMO_TOKENS[] = {"远", "方", "有", "颗", "苹", "果", "树"};
enum { DEMO_L = 7, DEMO_D = 8, DEMO_H = 2, DEMO_SEED = 42 };
enum { TOKENS_FILE_MAX = 16 << 20 };

static void usage(FILE *f) {
    fprintf(f,
            "usage: mha viz [input options] [--tokens \"t1 t2 ...\" | --tokens-file F]\n"
            "               [--key-tokens \"...\"] [--batch N] [--svg F] [--png F] [--vmax V]\n"
            "\n"
            "Draws the attention weights of every head and of the head average as heat maps\n"
            "(rows: queries, columns: keys; viridis colour scale with a legend).\n"
            "With no input options it draws the seeds' example: L=7 tokens 远 方 有 颗 苹 果 树,\n"
            "d_model 8, 2 heads, seed 42 (what `mha demo` walks through).\n"
            "\n"
            "  --tokens \"...\"      query labels, one per whitespace-separated word (UTF-8);\n"
            "                      also the key labels in self-attention.  Count must be L.\n"
            "  --tokens-file F     the same, read from a file\n"
            "  --key-tokens \"...\"  key labels (cross-attention); count S, or S' with the\n"
            "                      bias_k / zero-attention columns\n"
            "  --batch N           which sequence of a batched query (default 0)\n"
            "  --svg F             write the SVG (text labels, opens in any browser)\n"
            "  --png F             write the PNG (needs libpng; ASCII labels, others by index)\n"
            "                      with neither: ./mha-viz.svg and ./mha-viz.png\n"
            "  --vmax V            top of the colour scale (default: the largest weight)\n"
            "\n"
            "input options (as `mha forward`):\n%s"
            "\n"
            "exit status: 0 written, 2 bad input (options, files, token counts), 1 write failure\n",
            cli_mha_inputs_help);
}

/* ---- tokens ---------------------------------------------------------------- */

typedef struct tokens {
    char *buf;           /* owned copy, split in place */
    const char **v;      /* n pointers into buf        */
    int64_t n;
} tokens;

static void tokens_free(tokens *t) {
    free(t->buf);
    free(t->v);
    memset(t, 0, sizeof *t);
}

static int is_space(const char *p, int *len) {
    unsigned char c = (unsigned char)*p;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
        *len = 1;
        return 1;
    }
    if (c == 0xe3 && (unsigned char)p[1] == 0x80 && (unsigned char)p[2] == 0x80) { /* U+3000 */
        *len = 3;
        return 1;
    }
    return 0;
}

/* Splits text (owned by t afterwards: pass a malloc'd buffer) at whitespace. */
static int tokens_split_owned(tokens *t, char *text) {
    memset(t, 0, sizeof *t);
    t->buf = text;
    size_t cap = 0;
    char *p = text;
    for (;;) {
        int len;
        while (*p && is_space(p, &len))
            p += len;
        if (!*p)
            break;
        if ((size_t)t->n == cap) {
            cap = cap ? 2 * cap : 16;
            const char **v = realloc(t->v, cap * sizeof *v);
            if (!v)
                return CLI_INTERNAL;
            t->v = v;
        }
        t->v[t->n++] = p;
        while (*p && !is_space(p, &len))
            p++;
        if (*p) {
            is_space(p, &len);
            *p = 0;
            p += len;
        }
    }
    return CLI_OK;
}

static int tokens_from_string(tokens *t, const char *s) {
    char *copy = strdup(s);
    if (!copy) {
        memset(t, 0, sizeof *t);
        return CLI_INTERNAL;
    }
    return tokens_split_owned(t, copy);
}

static int tokens_from_file(tokens *t, const char *path) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "mha viz: --tokens-file %s: %s\n", path, strerror(errno));
        return CLI_BAD_INPUT;
    }
    char *buf = malloc(TOKENS_FILE_MAX + 1);
    if (!buf) {
        fclose(f);
        fprintf(stderr, "mha viz: out of memory\n");
        return CLI_INTERNAL;
    }
    size_t n = fread(buf, 1, TOKENS_FILE_MAX + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > TOKENS_FILE_MAX) {
        fprintf(stderr, "mha viz: --tokens-file %s: %s\n", path,
                bad ? "read error" : "larger than 16 MiB");
        free(buf);
        return CLI_BAD_INPUT;
    }
    if (memchr(buf, 0, n)) {
        fprintf(stderr, "mha viz: --tokens-file %s: contains a NUL byte (not text)\n", path);
        free(buf);
        return CLI_BAD_INPUT;
    }
    buf[n] = 0;
    if (tokens_split_owned(t, buf)) {
        fprintf(stderr, "mha viz: out of memory\n");
        return CLI_INTERNAL;
    }
    return CLI_OK;
}

/* ---- rendering ------------------------------------------------------------- */

/* Writes the maps of w (H,L,S) to svg / png (either may be NULL) and says
 * where on stdout; png_optional: skip the PNG with a note when this build
 * has no libpng instead of failing (cli.h). */
int cli_viz_write_maps(const char *cmd, const float *w, int64_t H, int64_t L, int64_t S,
                       const char *const *qlabels, const char *const *klabels, const char *title,
                       float vmax, const char *svg, const char *png, int png_optional) {
    render_maps m = {H, L, S, w, qlabels, klabels, title, vmax};
    char err[512];
    int64_t P = render_panel_count(&m);
    char what[128];
    snprintf(what, sizeof what, "%lld heads%s, L=%lld queries x S=%lld keys", (long long)H,
             P > H ? " + average" : "", (long long)L, (long long)S);
    if (svg) {
        render_status st = render_svg_write(&m, svg, err, sizeof err);
        if (st) {
            fprintf(stderr, "mha %s: %s\n", cmd, err);
            return st == RENDER_ERR_ARG ? CLI_BAD_INPUT : CLI_INTERNAL;
        }
        printf("mha %s: wrote %s (%s)\n", cmd, svg, what);
    }
    if (png) {
        if (!render_png_available() && png_optional) {
            fprintf(stderr, "mha %s: no PNG written: this build has no libpng (make deps; rebuild)\n",
                    cmd);
            return CLI_OK;
        }
        render_status st = render_png_write(&m, png, err, sizeof err);
        if (st) {
            fprintf(stderr, "mha %s: %s\n", cmd, err);
            return st == RENDER_ERR_ARG ? CLI_BAD_INPUT : CLI_INTERNAL;
        }
        printf("mha %s: wrote %s (%s)\n", cmd, png, what);
    }
    fflush(stdout);
    return CLI_OK;
}

/* The seeds' example: per-head weights (H,L,L) of L=7, D=8, H=2, seed 42. */
static int demo_weights(const char *cmd, float *w /* (DEMO_H,DEMO_L,DEMO_L) */) {
    seed_example ex;
    if (seed_example_make(&ex, DEMO_L, DEMO_D, DEMO_H, DEMO_SEED)) {
        fprintf(stderr, "mha %s: out of memory for the seed example\n", cmd);
        return CLI_INTERNAL;
    }
    mha_status st = seed_example_forward(&ex, NULL, w);
    seed_example_free(&ex);
    return st ? cli_fail(cmd, st, "seed example") : CLI_OK;
}

static const char DEMO_TITLE[] =
    "seed example: 7 tokens, d_model 8, 2 heads (rows: queries, columns: keys)";

int cli_viz_write_demo_maps(const char *svg_path, const char *png_path) {
    float w[DEMO_H * DEMO_L * DEMO_L];
    int rc = demo_weights("demo", w);
    if (rc)
        return rc;
    return cli_viz_write_maps("demo", w, DEMO_H, DEMO_L, DEMO_L, DEMO_TOKENS, DEMO_TOKENS, DEMO_TITLE, 0,
                      svg_path, png_path, 1);
}

/* ---- mha viz ----------------------------------------------------------------- */

typedef struct viz_args {
    const char *tokens, *tokens_file, *key_tokens, *svg, *png, *title;
    int64_t batch;
    int batch_given;
    float vmax;
    int any_input;      /* an option of the shared input parser was given */
    int png_optional;   /* default outputs: skip the PNG without libpng    */
} viz_args;

static int parse_int64(const char *s, int64_t *v) {
    return cli_parse_i64(s, 0, INT64_MAX, v);
}

/* Key labels for S' columns: given S' tokens, or S tokens plus names for the
 * extra bias_k / zero-attention columns.  Returns NULL on out of memory. */
static const char **key_labels(const tokens *t, int64_t S, int has_bias_k, int add_zero_attn) {
    int64_t Sp = S + has_bias_k + add_zero_attn;
    const char **v = malloc((size_t)Sp * sizeof *v);
    if (!v)
        return NULL;
    for (int64_t j = 0; j < Sp; j++)
        v[j] = j < t->n ? t->v[j] : (j == S && has_bias_k) ? "bias_k" : "zero";
    return v;
}

static int run_inputs(viz_args *a, cli_mha_inputs *in, const tokens *qt, const tokens *kt) {
    int rc = cli_mha_inputs_load(in, "viz");
    if (rc)
        return rc;
    const int64_t B = in->B, L = in->L, S = in->S, Sp = in->S + in->S_extra, H = in->opt.num_heads;
    if (a->batch >= B) {
        fprintf(stderr, "mha viz: --batch %lld: the query has B = %lld sequence%s\n",
                (long long)a->batch, (long long)B, B == 1 ? "" : "s");
        return CLI_BAD_INPUT;
    }
    if (qt->n && qt->n != L) {
        fprintf(stderr, "mha viz: %lld tokens but the query has L = %lld positions\n",
                (long long)qt->n, (long long)L);
        return CLI_BAD_INPUT;
    }
    int self = in->key_ptr == &in->query;
    const tokens *kl = kt->n ? kt : (self && qt->n) ? qt : NULL;
    if (kt->n && kt->n != S && kt->n != Sp) {
        fprintf(stderr, "mha viz: --key-tokens: %lld tokens but the keys have S = %lld positions%s\n",
                (long long)kt->n, (long long)S, Sp != S ? " (plus bias_k / zero-attention columns)" : "");
        return CLI_BAD_INPUT;
    }

    mha_tensor out, wt;
    memset(&out, 0, sizeof out);
    memset(&wt, 0, sizeof wt);
    const char **klabels = NULL;
    mha_status st = in->batched
                        ? mha_tensor_create(&out, MHA_F32, 3, (int64_t[]){B, L, in->E})
                        : mha_tensor_create(&out, MHA_F32, 2, (int64_t[]){L, in->E});
    if (!st)
        st = in->batched ? mha_tensor_create(&wt, MHA_F32, 4, (int64_t[]){B, H, L, Sp})
                         : mha_tensor_create(&wt, MHA_F32, 3, (int64_t[]){H, L, Sp});
    if (st) {
        rc = cli_fail("viz", st, "output");
        goto done;
    }
    in->opt.attn_weights = &wt;
    in->opt.average_attn_weights = 0;
    st = mha_multihead_forward(&out, &in->query, in->key_ptr, in->value_ptr, &in->w, &in->opt);
    if (st) {
        rc = cli_fail("viz", st, "forward");
        goto done;
    }
    if (kl) {
        klabels = key_labels(kl, S, in->w.bias_k != NULL, in->opt.add_zero_attn);
        if (!klabels) {
            rc = cli_fail("viz", MHA_ERR_NOMEM, "labels");
            goto done;
        }
    }
    char title[256];
    const char *base = strrchr(in->weights_path ? in->weights_path : "", '/');
    base = base ? base + 1 : in->weights_path ? in->weights_path : "";
    if (in->batched)
        snprintf(title, sizeof title, "%s, sequence %lld of %lld (rows: queries, columns: keys)", base,
                 (long long)a->batch, (long long)B);
    else
        snprintf(title, sizeof title, "%s (rows: queries, columns: keys)", base);
    const float *w = (const float *)wt.data + a->batch * H * L * Sp;
    rc = cli_viz_write_maps("viz", w, H, L, Sp, qt->n ? qt->v : NULL, klabels, a->title ? a->title : title,
                    a->vmax, a->svg, a->png, a->png_optional);
done:
    free(klabels);
    in->opt.attn_weights = NULL;
    mha_tensor_free(&wt);
    mha_tensor_free(&out);
    return rc;
}

static int run_demo(viz_args *a, const tokens *qt, const tokens *kt) {
    if (a->batch_given && a->batch != 0) {
        fprintf(stderr, "mha viz: --batch %lld: the seed example has one sequence\n", (long long)a->batch);
        return CLI_BAD_INPUT;
    }
    if (qt->n && qt->n != DEMO_L) {
        fprintf(stderr, "mha viz: %lld tokens but the seed example has L = %d positions\n",
                (long long)qt->n, DEMO_L);
        return CLI_BAD_INPUT;
    }
    if (kt->n && kt->n != DEMO_L) {
        fprintf(stderr, "mha viz: --key-tokens: %lld tokens but the seed example has S = %d keys\n",
                (long long)kt->n, DEMO_L);
        return CLI_BAD_INPUT;
    }
    float w[DEMO_H * DEMO_L * DEMO_L];
    int rc = demo_weights("viz", w);
    if (rc)
        return rc;
    const char *const *q = qt->n ? qt->v : DEMO_TOKENS;
    const char *const *k = kt->n ? kt->v : q;
    return cli_viz_write_maps("viz", w, DEMO_H, DEMO_L, DEMO_L, q, k, a->title ? a->title : DEMO_TITLE,
                      a->vmax, a->svg, a->png, a->png_optional);
}

int cli_viz(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--model"))
            return cli_viz_model(argc, argv);
    viz_args a;
    memset(&a, 0, sizeof a);
    cli_mha_inputs in;
    cli_mha_inputs_init(&in);
    tokens qt, kt;
    memset(&qt, 0, sizeof qt);
    memset(&kt, 0, sizeof kt);
    int rc = CLI_OK;

    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            goto done;
        }
        int takes_value = !strcmp(o, "--tokens") || !strcmp(o, "--tokens-file") ||
                          !strcmp(o, "--key-tokens") || !strcmp(o, "--batch") ||
                          !strcmp(o, "--svg") || !strcmp(o, "--png") || !strcmp(o, "--vmax") ||
                          !strcmp(o, "--title");
        if (takes_value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "mha viz: %s needs a value\n", o);
                rc = CLI_BAD_INPUT;
                goto done;
            }
            const char *v = argv[++i];
            if (!strcmp(o, "--tokens"))
                a.tokens = v;
            else if (!strcmp(o, "--tokens-file"))
                a.tokens_file = v;
            else if (!strcmp(o, "--key-tokens"))
                a.key_tokens = v;
            else if (!strcmp(o, "--svg"))
                a.svg = v;
            else if (!strcmp(o, "--png"))
                a.png = v;
            else if (!strcmp(o, "--title"))
                a.title = v;
            else if (!strcmp(o, "--batch")) {
                if (!parse_int64(v, &a.batch)) {
                    fprintf(stderr, "mha viz: --batch %s: want an integer >= 0\n", v);
                    rc = CLI_BAD_INPUT;
                    goto done;
                }
                a.batch_given = 1;
            } else { /* --vmax */
                float x;
                if (!cli_parse_f32(v, &x) || !(x > 0)) {
                    fprintf(stderr, "mha viz: --vmax %s: want a number > 0\n", v);
                    rc = CLI_BAD_INPUT;
                    goto done;
                }
                a.vmax = (float)x;
            }
            continue;
        }
        int r = cli_mha_inputs_parse(&in, "viz", argc, argv, &i);
        if (r < 0) {
            rc = CLI_BAD_INPUT;
            goto done;
        }
        if (r == 0) {
            fprintf(stderr, "mha viz: unknown option '%s' (mha viz --help)\n", o);
            rc = CLI_BAD_INPUT;
            goto done;
        }
        a.any_input = 1;
    }
    if (a.tokens && a.tokens_file) {
        fprintf(stderr, "mha viz: give --tokens or --tokens-file, not both\n");
        rc = CLI_BAD_INPUT;
        goto done;
    }
    if (!a.svg && !a.png) {
        a.svg = "mha-viz.svg";
        a.png = "mha-viz.png";
        a.png_optional = 1; /* without libpng: the SVG alone, with a note */
    } else if (a.png && !render_png_available()) {
        fprintf(stderr, "mha viz: --png %s: PNG output needs libpng, which this build lacks "
                        "(install libpng-dev, e.g. `make deps`, and rebuild; --svg works)\n", a.png);
        rc = CLI_INTERNAL;
        goto done;
    }
    if (a.tokens)
        rc = tokens_from_string(&qt, a.tokens);
    else if (a.tokens_file)
        rc = tokens_from_file(&qt, a.tokens_file);
    if (!rc && a.key_tokens)
        rc = tokens_from_string(&kt, a.key_tokens);
    if (rc) {
        if (rc == CLI_INTERNAL)
            fprintf(stderr, "mha viz: out of memory\n");
        goto done;
    }
    if ((a.tokens || a.tokens_file) && qt.n == 0) {
        fprintf(stderr, "mha viz: %s has no tokens\n", a.tokens ? "--tokens" : "--tokens-file");
        rc = CLI_BAD_INPUT;
        goto done;
    }
    if (!a.any_input) {
        rc = run_demo(&a, &qt, &kt);
    } else {
        rc = run_inputs(&a, &in, &qt, &kt);
    }
done:
    tokens_free(&qt);
    tokens_free(&kt);
    cli_mha_inputs_free(&in);
    return rc;
}
