/* demo_block.c - `mha demo`'s Transformer block section: the seed example
 * (L=7 tokens "远方有颗苹果树", D=8, h=2) through one encoder layer, post-norm
 * and pre-norm, printing the shape after attention, residual, norm and MLP.
 * The pieces are the public API; the composed result is checked against
 * mha_encoder_layer_forward.  Printing only: no math of its own. */
#include "cli.h"
#include "seeds.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BL = 7, BD = 8, BH = 2, BF = 32 };
#define BLOCK_SEED 42

static const char *const TOKENS[BL] = {"远", "方", "有", "颗", "苹", "果", "树"};

/* Seeded weights, one block: in_proj (3D,D) in_bias (3D) out (D,D) out_b (D)
 * lin1 (F,D) b1 (F) lin2 (D,F) b2 (D) g1 b1n g2 b2n (D). */
typedef struct block {
    float in_w[3 * BD * BD], in_b[3 * BD], out_w[BD * BD], out_b[BD];
    float l1_w[BF * BD], l1_b[BF], l2_w[BD * BF], l2_b[BD];
    float n1_w[BD], n1_b[BD], n2_w[BD], n2_b[BD];
    mha_tensor t[12];
} block;

static void block_make(block *k) {
    float *arrs[] = {k->in_w, k->in_b, k->out_w, k->out_b, k->l1_w, k->l1_b,
                     k->l2_w, k->l2_b, k->n1_w, k->n1_b, k->n2_w, k->n2_b};
    const int64_t shapes[12][2] = {{3 * BD, BD}, {3 * BD, 0}, {BD, BD}, {BD, 0},
                                   {BF, BD},     {BF, 0},     {BD, BF}, {BD, 0},
                                   {BD, 0},      {BD, 0},     {BD, 0},  {BD, 0}};
    for (int i = 0; i < 12; i++) {
        int nd = shapes[i][1] ? 2 : 1;
        mha_tensor_init(&k->t[i], MHA_F32, arrs[i], nd, shapes[i]);
        size_t n = (size_t)shapes[i][0] * (size_t)(nd == 2 ? shapes[i][1] : 1);
        mha_randn(arrs[i], n, BLOCK_SEED + 100 + (uint64_t)i, 0.3f);
    }
    for (int c = 0; c < BD; c++) /* norms near identity, as after init */
        k->n1_w[c] += 1.0f, k->n2_w[c] += 1.0f;
}

static void shape_line(const char *step, const char *what) {
    printf("   %-13s (%d, %d)   %s\n", step, BL, BD, what);
}

/* Runs one layer by pieces, printing shapes; y (L,D) gets the result. */
static mha_status block_by_pieces(block *k, const float *x, float *y, int norm_first) {
    float a[BL * BD], n[BL * BD], r[BL * BD], m[BL * BD];
    mha_tensor X, A, N, R, M;
    const int64_t sh[2] = {BL, BD};
    mha_tensor_init(&X, MHA_F32, (void *)x, 2, sh);
    mha_tensor_init(&A, MHA_F32, a, 2, sh);
    mha_tensor_init(&N, MHA_F32, n, 2, sh);
    mha_tensor_init(&R, MHA_F32, r, 2, sh);
    mha_tensor_init(&M, MHA_F32, m, 2, sh);
    mha_multihead_weights aw = {&k->t[0], NULL, NULL, NULL, &k->t[1], &k->t[2], &k->t[3], NULL, NULL};
    mha_mlp_weights mw = {&k->t[4], &k->t[5], &k->t[6], &k->t[7], NULL, NULL};
    mha_multihead_options o;
    mha_multihead_options_init(&o);
    o.num_heads = BH;
    mha_status st;
    shape_line("[input]", "X: token embeddings");
    if (norm_first) {
        if ((st = mha_layernorm_forward(&N, &X, &k->t[8], &k->t[9], 1e-5f)))
            return st;
        shape_line("[norm1]", "LayerNorm(X), before attention");
        if ((st = mha_multihead_forward(&A, &N, &N, &N, &aw, &o)))
            return st;
        shape_line("[attention]", "MultiheadAttention(norm1(X)), h=2 heads of d=4");
        if ((st = mha_residual_forward(&R, &X, &A)))
            return st;
        shape_line("[residual]", "X + attention");
        if ((st = mha_layernorm_forward(&N, &R, &k->t[10], &k->t[11], 1e-5f)))
            return st;
        shape_line("[norm2]", "LayerNorm, before the MLP");
        if ((st = mha_mlp_forward(&M, &N, &mw, MHA_ACT_RELU, NULL, 0)))
            return st;
        printf("   %-13s (%d, %d) -> (%d, %d) -> (%d, %d)   linear1, ReLU, linear2\n", "[mlp]", BL,
               BD, BL, BF, BL, BD);
        if ((st = mha_residual_forward(&R, &R, &M)))
            return st;
        shape_line("[residual]", "+ MLP = block output");
    } else {
        if ((st = mha_multihead_forward(&A, &X, &X, &X, &aw, &o)))
            return st;
        shape_line("[attention]", "MultiheadAttention(X), h=2 heads of d=4");
        if ((st = mha_residual_forward(&R, &X, &A)))
            return st;
        shape_line("[residual]", "X + attention");
        if ((st = mha_layernorm_forward(&R, &R, &k->t[8], &k->t[9], 1e-5f)))
            return st;
        shape_line("[norm1]", "LayerNorm(X + attention)");
        if ((st = mha_mlp_forward(&M, &R, &mw, MHA_ACT_RELU, NULL, 0)))
            return st;
        printf("   %-13s (%d, %d) -> (%d, %d) -> (%d, %d)   linear1, ReLU, linear2\n", "[mlp]", BL,
               BD, BL, BF, BL, BD);
        if ((st = mha_residual_forward(&R, &R, &M)))
            return st;
        shape_line("[residual]", "+ MLP");
        if ((st = mha_layernorm_forward(&R, &R, &k->t[10], &k->t[11], 1e-5f)))
            return st;
        shape_line("[norm2]", "LayerNorm = block output");
    }
    memcpy(y, r, sizeof r);
    return MHA_OK;
}

int cli_demo_block(void) {
    seed_example ex;
    if (seed_example_make(&ex, BL, BD, BH, BLOCK_SEED))
        return cli_fail("demo", MHA_ERR_NOMEM, "block example");
    block *k = malloc(sizeof *k);
    if (!k) {
        seed_example_free(&ex);
        return cli_fail("demo", MHA_ERR_NOMEM, "block weights");
    }
    block_make(k);
    printf("== The Transformer block (nn.TransformerEncoderLayer) on the same example ==\n");
    printf("   tokens:");
    for (int i = 0; i < BL; i++)
        printf(" %s", TOKENS[i]);
    printf("   L = %d, d_model = %d, h = %d, MLP width %d, seeded weights (mha_randn %d)\n\n", BL,
           BD, BH, BF, BLOCK_SEED);
    mha_encoder_layer_weights w = {{&k->t[0], NULL, NULL, NULL, &k->t[1], &k->t[2], &k->t[3], NULL, NULL},
                                   &k->t[4], &k->t[5], &k->t[6], &k->t[7],
                                   &k->t[8], &k->t[9], &k->t[10], &k->t[11]};
    int rc = CLI_OK;
    for (int nf = 0; nf < 2 && rc == CLI_OK; nf++) {
        printf("-- %s: %s\n", nf ? "pre-norm (norm_first=True)" : "post-norm (PyTorch default)",
               nf ? "x = x + SA(norm1(x)); x = x + MLP(norm2(x))"
                  : "x = norm1(x + SA(x)); x = norm2(x + MLP(x))");
        float by_pieces[BL * BD], layer[BL * BD];
        mha_status st = block_by_pieces(k, ex.x, by_pieces, nf);
        mha_tensor X, Y;
        mha_tensor_init(&X, MHA_F32, ex.x, 2, (int64_t[]){BL, BD});
        mha_tensor_init(&Y, MHA_F32, layer, 2, (int64_t[]){BL, BD});
        mha_layer_options opt;
        mha_layer_options_init(&opt);
        opt.num_heads = BH;
        opt.norm_first = nf;
        if (st == MHA_OK)
            st = mha_encoder_layer_forward(&Y, &X, &w, NULL, &opt, NULL, 0);
        if (st != MHA_OK) {
            rc = cli_fail("demo", st, "block");
            break;
        }
        double diff = 0.0, mean = 0.0;
        for (int i = 0; i < BL * BD; i++) {
            diff = fmax(diff, fabs((double)by_pieces[i] - layer[i]));
            mean += by_pieces[i];
        }
        printf("   pieces vs mha_encoder_layer_forward: max |diff| = %.2g; output mean %.3f\n\n",
               diff, mean / (BL * BD));
    }
    free(k);
    seed_example_free(&ex);
    return rc;
}
