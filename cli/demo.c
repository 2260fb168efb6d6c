/* demo.c - `mha demo`: the seeds' walkthrough, live, with shapes.
 * All numbers come from the library (see seeds.c); this file prints. */
#include "cli.h"
#include "seeds.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const TOKENS[] = {"远", "方", "有", "颗", "苹", "果", "树"};
enum { SEED_L = 7, SEED_D = 8, SEED_H = 2 };
#define DEMO_SEED 42

static void shape(const char *label, int n, const int64_t *dims) {
    printf("%-44s (", label);
    for (int i = 0; i < n; i++)
        printf(i ? ", %lld" : "%lld", (long long)dims[i]);
    printf(n == 1 ? ",)\n" : ")\n");
}

static void row(const char *label, const float *x, int64_t n) {
    printf("    %s [", label);
    for (int64_t i = 0; i < n; i++)
        printf(i ? " %7.3f" : "%7.3f", x[i]);
    printf("]\n");
}

static int walkthrough(void) {
    seed_example ex;
    seed_walk walk;
    if (seed_example_make(&ex, SEED_L, SEED_D, SEED_H, DEMO_SEED))
        return cli_fail("demo", MHA_ERR_NOMEM, "example");
    if (seed_walk_run(&ex, &walk)) {
        seed_example_free(&ex);
        return cli_fail("demo", MHA_ERR_NOMEM, "walkthrough");
    }
    const int64_t L = SEED_L, D = SEED_D, h = SEED_H, d = D / h;
    printf("== Multi-head attention, step by step (seed 003's example) ==\n");
    printf("tokens:");
    for (int i = 0; i < SEED_L; i++)
        printf(" %s", TOKENS[i]);
    printf("   L = %lld, d_model = %lld, h = %lld, d_k = d_model / h = %lld, mha_randn seed %d\n\n",
           (long long)L, (long long)D, (long long)h, (long long)d, DEMO_SEED);
    shape("输入 X (input)", 2, (int64_t[]){L, D});
    shape("[1 线性映射 projections] Q = X W_Q^T, K, V", 2, (int64_t[]){L, D});
    row("Q[0] =", walk.q, D);
    shape("[2 Head拆分 split] Q_h/K_h/V_h (strided view)", 3, (int64_t[]){h, L, d});
    for (int64_t r = 0; r < h; r++) {
        char label[64];
        snprintf(label, sizeof label, "[3 并行Attention] head %lld output", (long long)r);
        shape(label, 2, (int64_t[]){L, d});
        row("row 0 =", walk.heads + r * L * d, d);
    }
    shape("[4 Concat拼接] concat (heads merged by strides)", 2, (int64_t[]){L, D});
    shape("[5 输出投影 W_O] output", 2, (int64_t[]){L, D});
    row("out[0] =", walk.out, D);
    printf("    output shape equals input shape: %s\n", "True");
    printf("    step-by-step result vs one mha_multihead_forward call: max rel error %.2e\n\n",
           walk.err_vs_api);

    printf("Attention weights per head (rows: queries, columns: keys; ░▒▓█ = 0.05/0.15/0.3/0.5+)\n");
    for (int64_t r = 0; r < h; r++) {
        printf("  head %lld\n", (long long)r);
        const float *w = walk.attn_weights + r * L * L;
        printf("        ");
        for (int64_t j = 0; j < L; j++)
            printf("%s", TOKENS[j]);
        printf("\n");
        for (int64_t i = 0; i < L; i++) {
            static const char *const shades[] = {"  ", "░░", "▒▒", "▓▓", "██"};
            int64_t best = 0;
            printf("     %s ", TOKENS[i]);
            for (int64_t j = 0; j < L; j++) {
                float p = w[i * L + j];
                int s = p < 0.05f ? 0 : p < 0.15f ? 1 : p < 0.30f ? 2 : p < 0.50f ? 3 : 4;
                printf("%s", shades[s]);
                if (p > w[i * L + best])
                    best = j;
            }
            printf("   strongest: %s (%.2f)\n", TOKENS[best], (double)w[i * L + best]);
        }
    }
    seed_walk_free(&walk);
    seed_example_free(&ex);
    return CLI_OK;
}

static void table_row(const char *name, int n, const int64_t *dims, const char *note) {
    char buf[64];
    int k = snprintf(buf, sizeof buf, "(");
    for (int i = 0; i < n; i++)
        k += snprintf(buf + k, sizeof buf - (size_t)k, i ? ", %lld" : "%lld", (long long)dims[i]);
    snprintf(buf + k, sizeof buf - (size_t)k, ")");
    printf("  %-28s %-16s %s\n", name, buf, note);
}

/* Seed 000's shape table, read off the views of a real forward run. */
static int shape_table(void) {
    enum { B = 2, L = 10, D = 64, H = 8 };
    printf("\n== Shapes for B = %d, L = %d, D = %d, h = %d (seed 000's table) ==\n", B, L, D, H);
    size_t n = (size_t)B * L * D;
    float *buf = calloc(2 * n + 4 * D * D + (size_t)B * H * L * L, sizeof(float));
    if (!buf)
        return cli_fail("demo", MHA_ERR_NOMEM, "shape table");
    float *x = buf, *y = x + n, *in_w = y + n, *out_w = in_w + 3 * D * D, *w = out_w + D * D;
    mha_randn(x, n, 7, 1.0f);
    mha_randn(in_w, 3 * D * D, 8, 0.125f);
    mha_randn(out_w, D * D, 9, 0.125f);
    mha_tensor X, Y, IW, OW, W;
    mha_tensor_init(&X, MHA_F32, x, 3, (int64_t[]){B, L, D});
    mha_tensor_init(&Y, MHA_F32, y, 3, (int64_t[]){B, L, D});
    mha_tensor_init(&IW, MHA_F32, in_w, 2, (int64_t[]){3 * D, D});
    mha_tensor_init(&OW, MHA_F32, out_w, 2, (int64_t[]){D, D});
    mha_tensor_init(&W, MHA_F32, w, 4, (int64_t[]){B, H, L, L});
    mha_multihead_weights wt = {.in_proj_weight = &IW, .out_proj_weight = &OW};
    mha_multihead_options opt;
    mha_multihead_options_init(&opt);
    opt.num_heads = H;
    opt.attn_weights = &W;
    opt.average_attn_weights = 0;
    mha_status st = mha_multihead_forward(&Y, &X, &X, &X, &wt, &opt);
    if (st != MHA_OK) {
        free(buf);
        return cli_fail("demo", st, "shape table");
    }
    const int64_t d = D / H;
    printf("  %-28s %-16s %s\n", "tensor", "shape", "note");
    table_row("input X", 3, X.shape, "sequence in the middle");
    table_row("Q before split", 3, (int64_t[]){B, L, D}, "linear layer keeps D");
    table_row("Q after split", 4, (int64_t[]){B, H, L, d}, "head is dim 1, d_k = D/h");
    table_row("attention scores", 4, W.shape, "one L x L map per head");
    table_row("attention output", 4, (int64_t[]){B, H, L, d}, "weighted sum of V");
    table_row("concat", 3, (int64_t[]){B, L, H * d}, "heads merged by strides");
    table_row("output projection", 3, Y.shape, "same shape as the input");
    free(buf);

    int64_t wide = mha_multihead_param_count(512, 512, 512, 1, 0);
    printf("\n== Parameters (D = 512) ==\n");
    printf("  W_Q, W_K, W_V, W_O (D x D each) + 4 biases (D each) = %lld for one wide head (h = 1)\n"
           "  and the same %lld for h = 8 heads of d_k = 64: the heads reshape, they add nothing\n"
           "  (4*D^2 + 4*D = %lld)\n",
           (long long)wide, (long long)wide, (long long)(4LL * 512 * 512 + 4 * 512));
    return CLI_OK;
}

static int claims(void) {
    seed_claim c[SEED_CLAIMS_MAX];
    int n = seed_claims_check(c, SEED_L, SEED_D, SEED_H, DEMO_SEED);
    if (n < 0)
        return cli_fail("demo", MHA_ERR_NOMEM, "claims");
    printf("\n== The seeds' claims, checked live on the example ==\n");
    int failed = 0;
    for (int i = 0; i < n; i++) {
        printf("  [%s] %s\n         %s = %.3g (%s %.3g)\n", c[i].holds ? "ok" : "FAIL",
               c[i].statement, c[i].measure, c[i].measured, c[i].at_least ? ">=" : "<=",
               c[i].bound);
        failed += !c[i].holds;
    }
    return failed ? CLI_INTERNAL : CLI_OK;
}

int cli_demo(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: mha demo\n\nWalks the seeds' multi-head attention example (L=7 tokens, D=8, "
               "h=2)\nstep by step with shapes, the B=2 L=10 D=64 h=8 shape table, parameter\n"
               "counts, the seeds' claims measured live, and per-head attention maps.\n");
        return CLI_OK;
    }
    if (argc > 1)
        return fprintf(stderr, "mha demo: unexpected argument '%s'\n", argv[1]), CLI_BAD_INPUT;
    int rc = walkthrough();
    if (rc == CLI_OK)
        rc = cli_viz_write_demo_maps("mha-demo.svg", "mha-demo.png");
    if (rc == CLI_OK)
        rc = shape_table();
    if (rc == CLI_OK)
        rc = cli_demo_block();
    if (rc == CLI_OK)
        rc = claims();
    if (rc == CLI_OK)
        rc = cli_demo_model();
    return rc;
}
