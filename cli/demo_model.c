/* demo_model.c - the last section of `mha demo`: what the heads of a
 * trained model (all-MiniLM-L6-v2) do, against randomly initialised ones,
 * and sentence similarities.  Prints one line and moves on when the model
 * is not there.
 *
 * Letter legend: H heads, L tokens, D hidden width.
 *
 * Diversity between heads: for each query row i and each pair of heads
 * (g,h), the Jensen-Shannon distance sqrt(JSD(P_g[i] || P_h[i])) in bits
 * (0 = the same distribution, 1 = disjoint supports), averaged over rows
 * and pairs.  ref: J. Lin, "Divergence measures based on the Shannon
 * entropy", IEEE Trans. Inf. Theory 37(1), 1991; Endres & Schindelin 2003
 * (the square root is a metric).  The random baseline: the same layer input
 * through query/key weights drawn like BERT's initialiser (normal, std
 * initializer_range 0.02, zero biases). */
#include "cli.h"
#include "embedder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DEMO_LAYER = 2, DEMO_TOP = 3 };
static const char SENTENCE[] = "The animal didn't cross the street because it was too tired";
static const char *const SIMILAR[] = {"A man is playing a guitar.", "Someone plays an instrument.",
                                      "The cat sleeps on the sofa.",
                                      "A kitten is napping on the couch."};
enum { N_SIMILAR = 4 };

/* Jensen-Shannon distance of two distributions p, q (n), in bits. */
static double js_distance(const float *p, const float *q, int64_t n) {
    double js = 0;
    for (int64_t j = 0; j < n; j++) {
        double m = 0.5 * ((double)p[j] + q[j]);
        if (p[j] > 0)
            js += 0.5 * p[j] * log2(p[j] / m);
        if (q[j] > 0)
            js += 0.5 * q[j] * log2(q[j] / m);
    }
    return sqrt(js > 0 ? js : 0);
}

/* Mean over rows and head pairs of w (H,L,L). */
static double head_diversity(const float *w, int64_t H, int64_t L) {
    double s = 0;
    int64_t n = 0;
    for (int64_t i = 0; i < L; i++)
        for (int64_t g = 0; g < H; g++)
            for (int64_t h = g + 1; h < H; h++, n++)
                s += js_distance(w + (g * L + i) * L, w + (h * L + i) * L, L);
    return n ? s / (double)n : 0;
}

/* w (H,L,L) = attention of hidden x (L,D) through random query/key weights
 * (std 0.02, zero bias): the same layer at initialisation. */
static mha_status random_heads(float *w, const float *x, int64_t H, int64_t L, int64_t D) {
    float *wq = malloc(sizeof(float) * (size_t)(2 * D * D + 2 * L * D));
    if (!wq)
        return MHA_ERR_NOMEM;
    float *wk = wq + D * D, *q = wk + D * D, *k = q + L * D;
    mha_randn(wq, 2 * D * D, 2026, 0.02f);
    mha_tensor X, WQ, WK, Q, K;
    mha_tensor_init(&X, MHA_F32, (void *)x, 2, (int64_t[]){L, D});
    mha_tensor_init(&WQ, MHA_F32, wq, 2, (int64_t[]){D, D});
    mha_tensor_init(&WK, MHA_F32, wk, 2, (int64_t[]){D, D});
    mha_tensor_init(&Q, MHA_F32, q, 2, (int64_t[]){L, D});
    mha_tensor_init(&K, MHA_F32, k, 2, (int64_t[]){L, D});
    mha_status st = mha_linear_forward(&Q, &X, &WQ, NULL);
    if (st == MHA_OK)
        st = mha_linear_forward(&K, &X, &WK, NULL);
    const int64_t dh = D / H;
    mha_tensor q4 = {q, MHA_F32, 4, {1, H, L, dh}, {L * D, dh, D, 1}};
    mha_tensor k4 = {k, MHA_F32, 4, {1, H, L, dh}, {L * D, dh, D, 1}};
    float *o = malloc(sizeof(float) * (size_t)(L * D));
    mha_tensor o4 = {o, MHA_F32, 4, {1, H, L, dh}, {L * D, dh, D, 1}};
    mha_tensor w4;
    mha_tensor_init(&w4, MHA_F32, w, 4, (int64_t[]){1, H, L, L});
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.attn_weights = &w4;
    if (st == MHA_OK)
        st = o ? mha_sdpa_forward(&o4, &q4, &k4, &k4, &opt) : MHA_ERR_NOMEM;
    free(o);
    free(wq);
    return st;
}

static int heads_section(cli_embedder *e) {
    int32_t *ids = NULL;
    int64_t L = 0;
    int rc = cli_embedder_tokenize(e, "demo", SENTENCE, strlen(SENTENCE), &ids, &L);
    if (rc)
        return rc;
    const int64_t H = e->info->heads, D = e->info->hidden;
    int64_t it = -1;
    for (int64_t t = 0; t < L; t++)
        if (!strcmp(cli_embedder_token(e, ids[t]), "it"))
            it = t;
    float *w = malloc(sizeof(float) * (size_t)(2 * H * L * L + L * D));
    if (!w || it < 0) {
        free(ids);
        free(w);
        fprintf(stderr, "mha demo: %s\n", w ? "no token \"it\" in the sentence" : "out of memory");
        return CLI_INTERNAL;
    }
    float *wr = w + H * L * L, *x = wr + H * L * L;
    mha_tensor W, X;
    mha_tensor_init(&W, MHA_F32, w, 3, (int64_t[]){H, L, L});
    mha_tensor_init(&X, MHA_F32, x, 2, (int64_t[]){L, D});
    mha_status st = mha_bert_attention(e->bert, &W, ids, L, DEMO_LAYER);
    if (st == MHA_OK)
        st = mha_bert_hidden(e->bert, &X, ids, L, DEMO_LAYER);
    if (st == MHA_OK)
        st = random_heads(wr, x, H, L, D);
    if (st != MHA_OK) {
        free(ids);
        free(w);
        return cli_fail("demo", st, "model");
    }
    printf("\"%s\"\n%lld tokens:", SENTENCE, (long long)L);
    for (int64_t t = 0; t < L; t++)
        printf(" %s", cli_embedder_token(e, ids[t]));
    printf("\n\nlayer %d, from \"it\" (token %lld), each head's %d most attended tokens:\n",
           DEMO_LAYER, (long long)it, DEMO_TOP);
    for (int64_t h = 0; h < H; h++) {
        const float *row = w + (h * L + it) * L;
        int64_t best[DEMO_TOP];
        for (int k = 0; k < DEMO_TOP; k++) {
            best[k] = -1;
            for (int64_t j = 0; j < L; j++) {
                int taken = 0;
                for (int m = 0; m < k; m++)
                    taken |= best[m] == j;
                if (!taken && (best[k] < 0 || row[j] > row[best[k]]))
                    best[k] = j;
            }
        }
        printf("  head %2lld:", (long long)h);
        for (int k = 0; k < DEMO_TOP; k++)
            printf("  %-10s %.2f", cli_embedder_token(e, ids[best[k]]), row[best[k]]);
        printf("\n");
    }
    double trained = head_diversity(w, H, L), random = head_diversity(wr, H, L);
    printf("\nmean pairwise Jensen-Shannon distance between the %lld heads' attention rows\n"
           "(bits; 0 = identical, 1 = disjoint):\n"
           "  trained all-MiniLM-L6-v2 layer %d        %.3f\n"
           "  same layer, random init (std 0.02)        %.3f\n"
           "  the trained heads attend differently: they learned different relations;\n"
           "  at initialisation every head is close to uniform.\n",
           (long long)H, DEMO_LAYER, trained, random);
    free(ids);
    free(w);
    return CLI_OK;
}

static int similarity_section(cli_embedder *e) {
    const int64_t D = e->info->hidden;
    float emb[N_SIMILAR * 1024];
    size_t lens[N_SIMILAR];
    if (D > 1024)
        return CLI_OK;
    for (int i = 0; i < N_SIMILAR; i++)
        lens[i] = strlen(SIMILAR[i]);
    int rc = cli_embedder_embed(e, "demo", SIMILAR, lens, N_SIMILAR, N_SIMILAR, 0, emb);
    if (rc)
        return rc;
    printf("\ncosine similarity of sentence embeddings (mha embed):\n%38s", "");
    for (int j = 0; j < N_SIMILAR; j++)
        printf("  [%d] ", j);
    printf("\n");
    for (int i = 0; i < N_SIMILAR; i++) {
        printf("  [%d] %-33s", i, SIMILAR[i]);
        for (int j = 0; j < N_SIMILAR; j++) {
            double s = 0;
            for (int64_t c = 0; c < D; c++)
                s += (double)emb[i * D + c] * emb[j * D + c];
            printf(" %5.2f", s);
        }
        printf("\n");
    }
    return CLI_OK;
}

int cli_demo_model(void) {
    printf("\n== A trained model: all-MiniLM-L6-v2 ==\n");
    fflush(stdout);
    cli_embedder e;
    if (cli_embedder_open(&e, "demo", NULL, 1)) {
        printf("(skipped: the model or its tokenizer is not available; `make model` fetches "
               "all-MiniLM-L6-v2)\n");
        return CLI_OK;
    }
    int rc = heads_section(&e);
    if (rc == CLI_OK)
        rc = similarity_section(&e);
    cli_embedder_close(&e);
    return rc;
}
