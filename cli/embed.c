/* embed.c - `mha embed` (sentence embeddings of texts or lines) and
 * `mha search` (the lines of a file most similar to a query), on the model
 * of embedder.h. */
#include "cli.h"
#include "embedder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Texts per model call: enough tokens (~9,000 for sentences) that the
 * library's groups of texts keep every thread busy to the end of a call. */
enum { DEFAULT_BATCH = 256 };

/* ---- lines ------------------------------------------------------------------ */

typedef struct lines {
    char **v;       /* n texts (owned), or borrowed argv entries */
    size_t *len;    /* bytes of each                              */
    int64_t n, cap;
    int owned;
} lines;

static void lines_free(lines *l) {
    if (l->owned)
        for (int64_t i = 0; i < l->n; i++)
            free(l->v[i]);
    free(l->v);
    free(l->len);
    memset(l, 0, sizeof *l);
}

static int lines_push(lines *l, char *s, size_t len) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 64;
        char **v = realloc(l->v, sizeof *v * (size_t)cap);
        if (!v)
            return -1;
        l->v = v;
        size_t *n = realloc(l->len, sizeof *n * (size_t)cap);
        if (!n)
            return -1;
        l->len = n;
        l->cap = cap;
    }
    l->v[l->n] = s;
    l->len[l->n++] = len;
    return 0;
}

/* One text per line of f: the line without its "\n" (or "\r\n"); bytes are
 * kept as they are (NUL included).  skip_blank drops lines of only spaces
 * and tabs (search).  0, or an exit code after printing. */
static int lines_read(lines *l, FILE *f, const char *cmd, const char *name, int skip_blank) {
    memset(l, 0, sizeof *l);
    l->owned = 1;
    char *buf = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&buf, &cap, f)) >= 0) {
        size_t n = (size_t)got;
        if (n && buf[n - 1] == '\n')
            n--;
        if (n && buf[n - 1] == '\r')
            n--;
        if (skip_blank && strspn(buf, " \t") >= n)
            continue;
        char *s = malloc(n + 1);
        if (!s || lines_push(l, s, n)) {
            free(s);
            free(buf);
            fprintf(stderr, "mha %s: out of memory reading %s\n", cmd, name);
            return CLI_INTERNAL;
        }
        memcpy(s, buf, n);
        s[n] = '\0';
    }
    free(buf);
    if (ferror(f)) {
        fprintf(stderr, "mha %s: read error on %s\n", cmd, name);
        return CLI_INTERNAL;
    }
    return CLI_OK;
}

/* ---- options ------------------------------------------------------------------ */

typedef struct embed_args {
    const char *model, *out;
    int64_t batch, top, threads;
    int as_ids;
} embed_args;

static int parse_count(const char *cmd, const char *opt, const char *v, int64_t *out) {
    if (!cli_parse_i64(v, 1, 1 << 20, out)) {
        fprintf(stderr, "mha %s: %s %s: want an integer in 1..%d\n", cmd, opt, v, 1 << 20);
        return CLI_BAD_INPUT;
    }
    return CLI_OK;
}

/* Parses the shared options; positional arguments go to pos[0..*npos).
 * Returns -1 after --help (printed), else 0 or an exit code. */
static int parse_args(const char *cmd, int argc, char **argv, embed_args *a, char **pos,
                      int *npos, void (*usage)(FILE *)) {
    *npos = 0;
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (only_pos || o[0] != '-' || !o[1]) {
            pos[(*npos)++] = argv[i];
            continue;
        }
        if (!strcmp(o, "--")) {
            only_pos = 1;
        } else if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(o, "--ids")) {
            a->as_ids = 1;
        } else if (i + 1 < argc && (!strcmp(o, "--model") || !strcmp(o, "-o") ||
                                    !strcmp(o, "--out"))) {
            *(o[1] == 'm' || o[2] == 'm' ? &a->model : &a->out) = argv[++i];
        } else if (i + 1 < argc && !strcmp(o, "--batch-size")) {
            if (parse_count(cmd, o, argv[++i], &a->batch))
                return CLI_BAD_INPUT;
        } else if (i + 1 < argc && !strcmp(o, "--threads")) {
            if (parse_count(cmd, o, argv[++i], &a->threads))
                return CLI_BAD_INPUT;
        } else if (i + 1 < argc && !strcmp(o, "--top")) {
            if (parse_count(cmd, o, argv[++i], &a->top))
                return CLI_BAD_INPUT;
        } else {
            fprintf(stderr, "mha %s: unknown or incomplete option '%s' (see mha %s --help)\n",
                    cmd, o, cmd);
            return CLI_BAD_INPUT;
        }
    }
    if (a->threads)
        mha_set_num_threads((int)a->threads);
    return CLI_OK;
}

/* ---- mha embed ------------------------------------------------------------------ */

static void embed_usage(FILE *f) {
    fprintf(f,
            "usage: mha embed [--model DIR] [-o OUT.npy] [--batch-size N] [--threads N]\n"
            "                 [--ids] [TEXT ...]\n"
            "\n"
            "Sentence embeddings with a sentence-transformers BERT model (default\n"
            "all-MiniLM-L6-v2: `make model`), equal to SentenceTransformer.encode: WordPiece\n"
            "tokens truncated to max_seq_length, mean (or CLS) pooling, L2 normalisation.\n"
            "With no TEXT, one text per line of standard input (without its newline).\n"
            "\n"
            "  --model DIR       the model directory (else $MHA_MODEL_DIR, else\n"
            "                    ./models/all-MiniLM-L6-v2, else beside the executable)\n"
            "  -o OUT.npy        write the (N, hidden) float32 embeddings in input order;\n"
            "                    without -o a summary is printed\n"
            "  --batch-size N    texts per model call (default %d); results do not depend on it\n"
            "  --threads N       threads (default: all); results do not depend on it\n"
            "  --ids             each TEXT / line is token ids (\"101 7592 102\"), no tokenizer\n"
            "\nexit status: 0 ok, 2 bad input (arguments, model files), 1 internal failure\n",
            DEFAULT_BATCH);
}

static void print_summary(const cli_embedder *e, const lines *l, const float *out) {
    const int64_t D = e->info->hidden;
    printf("%lld texts -> (%lld, %lld) float32 embeddings (%s pooling%s), model %s\n",
           (long long)l->n, (long long)l->n, (long long)D,
           e->info->pooling == MHA_BERT_POOL_CLS ? "cls" : "mean",
           e->info->normalize ? ", L2-normalised" : "", e->dir);
    for (int64_t i = 0; i < l->n; i++) {
        const float *r = out + i * D;
        double ss = 0;
        for (int64_t j = 0; j < D; j++)
            ss += (double)r[j] * r[j];
        printf("%4lld  [%8.5f %8.5f %8.5f %8.5f ...]  |x| %.6f  \"%.*s%s\"\n", (long long)i, r[0],
               r[1], r[2], r[3], sqrt(ss), (int)(l->len[i] > 48 ? 48 : l->len[i]), l->v[i],
               l->len[i] > 48 ? "..." : "");
    }
}

int cli_embed(int argc, char **argv) {
    const char *cmd = "embed";
    embed_args a = {.batch = DEFAULT_BATCH};
    char **pos = malloc(sizeof(char *) * (size_t)(argc + 1));
    if (!pos)
        return CLI_INTERNAL;
    int npos = 0;
    int rc = parse_args(cmd, argc, argv, &a, pos, &npos, embed_usage);
    if (rc) {
        free(pos);
        return rc < 0 ? CLI_OK : rc;
    }
    lines l = {0};
    if (npos) {
        for (int i = 0; i < npos && !rc; i++)
            if (lines_push(&l, pos[i], strlen(pos[i])))
                rc = CLI_INTERNAL;
    } else {
        rc = lines_read(&l, stdin, cmd, "standard input", 0);
    }
    cli_embedder e;
    if (!rc)
        rc = cli_embedder_open(&e, cmd, a.model, !a.as_ids);
    else
        memset(&e, 0, sizeof e);
    float *out = NULL;
    if (!rc && l.n) {
        out = malloc(sizeof(float) * (size_t)(l.n * e.info->hidden));
        if (!out) {
            fprintf(stderr, "mha %s: out of memory\n", cmd);
            rc = CLI_INTERNAL;
        }
    }
    if (!rc && l.n)
        rc = cli_embedder_embed(&e, cmd, (const char *const *)l.v, l.len, l.n, a.batch,
                                a.as_ids, out);
    if (!rc && a.out) {
        float dummy = 0;
        mha_tensor t;
        mha_tensor_init(&t, MHA_F32, out ? out : &dummy, 2, (int64_t[]){l.n, e.info->hidden});
        mha_status st = mha_npy_save(&t, a.out, MHA_F32);
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, a.out);
        else
            fprintf(stderr, "mha %s: wrote %s (%lld, %lld) float32\n", cmd, a.out,
                    (long long)l.n, (long long)e.info->hidden);
    } else if (!rc) {
        print_summary(&e, &l, out);
    }
    free(out);
    cli_embedder_close(&e);
    lines_free(&l);
    free(pos);
    return rc;
}

/* ---- mha search ------------------------------------------------------------------ */

static void search_usage(FILE *f) {
    fprintf(f,
            "usage: mha search [--model DIR] [--top K] [--batch-size N] [--threads N]\n"
            "                  QUERY FILE\n"
            "\n"
            "Prints the K (default 5) lines of FILE most similar to QUERY, best first, with\n"
            "their cosine similarity of sentence embeddings (mha embed's model):\n"
            "  SCORE<TAB>LINE\n"
            "Blank lines are skipped; FILE - reads standard input.\n"
            "\nexit status: 0 ok, 2 bad input (arguments, files), 1 internal failure\n");
}

typedef struct scored {
    float score;
    int64_t index;
} scored;

static int by_score(const void *pa, const void *pb) {
    const scored *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

static float cosine(const float *a, const float *b, int64_t D) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t j = 0; j < D; j++)
        ab += (double)a[j] * b[j], aa += (double)a[j] * a[j], bb += (double)b[j] * b[j];
    return aa > 0 && bb > 0 ? (float)(ab / sqrt(aa * bb)) : 0.0f;
}

int cli_search(int argc, char **argv) {
    const char *cmd = "search";
    embed_args a = {.batch = DEFAULT_BATCH, .top = 5};
    char **pos = malloc(sizeof(char *) * (size_t)(argc + 1));
    if (!pos)
        return CLI_INTERNAL;
    int npos = 0;
    int rc = parse_args(cmd, argc, argv, &a, pos, &npos, search_usage);
    if (rc || npos != 2 || a.out || a.as_ids) {
        if (!rc)
            fprintf(stderr, "mha %s: want QUERY and FILE (see mha %s --help)\n", cmd, cmd);
        free(pos);
        return rc < 0 ? CLI_OK : rc ? rc : CLI_BAD_INPUT;
    }
    const char *query = pos[0], *path = pos[1];
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "mha %s: cannot open %s\n", cmd, path);
        free(pos);
        return CLI_BAD_INPUT;
    }
    lines l;
    rc = lines_read(&l, f, cmd, path, 1);
    if (f != stdin)
        fclose(f);
    cli_embedder e;
    memset(&e, 0, sizeof e);
    if (!rc)
        rc = cli_embedder_open(&e, cmd, a.model, 1);
    const int64_t D = rc ? 0 : e.info->hidden;
    float *emb = NULL;
    scored *s = NULL;
    if (!rc) {
        emb = malloc(sizeof(float) * (size_t)((l.n + 1) * D));
        s = malloc(sizeof(scored) * (size_t)(l.n + 1));
        if (!emb || !s) {
            fprintf(stderr, "mha %s: out of memory\n", cmd);
            rc = CLI_INTERNAL;
        }
    }
    if (!rc) {
        size_t qlen = strlen(query);
        rc = cli_embedder_embed(&e, cmd, &query, &qlen, 1, 1, 0, emb);
    }
    if (!rc && l.n)
        rc = cli_embedder_embed(&e, cmd, (const char *const *)l.v, l.len, l.n, a.batch, 0,
                                emb + D);
    if (!rc) {
        for (int64_t i = 0; i < l.n; i++)
            s[i] = (scored){cosine(emb, emb + (i + 1) * D, D), i};
        qsort(s, (size_t)l.n, sizeof *s, by_score);
        for (int64_t i = 0; i < l.n && i < a.top; i++)
            printf("%.4f\t%.*s\n", s[i].score, (int)l.len[s[i].index], l.v[s[i].index]);
    }
    free(emb);
    free(s);
    cli_embedder_close(&e);
    lines_free(&l);
    free(pos);
    return rc;
}
