/* examples/self_attention.c - the README's example: one nn.MultiheadAttention
 * forward pass on a (L, E) sequence.  Build: cc example.c -lmha (see README). */
#include <mha.h>
#include <stdio.h>

int main(void) {
    enum { L = 7, E = 8, H = 2 };
    static float x[L * E], in_w[3 * E * E], out_w[E * E], y[L * E];
    mha_randn(x, L * E, 1, 1.0f);            /* your token embeddings  */
    mha_randn(in_w, 3 * E * E, 2, 0.35f);    /* in_proj_weight (3E, E) */
    mha_randn(out_w, E * E, 3, 0.35f);       /* out_proj.weight (E, E) */

    mha_tensor X, Y, W_in, W_out;
    mha_tensor_init(&X, MHA_F32, x, 2, (int64_t[]){L, E});
    mha_tensor_init(&Y, MHA_F32, y, 2, (int64_t[]){L, E});
    mha_tensor_init(&W_in, MHA_F32, in_w, 2, (int64_t[]){3 * E, E});
    mha_tensor_init(&W_out, MHA_F32, out_w, 2, (int64_t[]){E, E});

    mha_multihead_weights w = {.in_proj_weight = &W_in, .out_proj_weight = &W_out};
    mha_multihead_options opt;
    mha_multihead_options_init(&opt);
    opt.num_heads = H;
    opt.causal = MHA_CAUSAL_TOP_LEFT;        /* tril(ones(L, L)) */

    mha_status st = mha_multihead_forward(&Y, &X, &X, &X, &w, &opt);
    if (st != MHA_OK) {
        fprintf(stderr, "mha: %s: %s\n", mha_status_string(st), mha_last_error());
        return 1;
    }
    printf("y[0][0..3] = %.4f %.4f %.4f %.4f\n", y[0], y[1], y[2], y[3]);

    opt.num_heads = 3;                       /* 3 does not divide 8: a clear error */
    st = mha_multihead_forward(&Y, &X, &X, &X, &w, &opt);
    printf("%s: %s\n", mha_status_string(st), mha_last_error());
    return st == MHA_ERR_SHAPE ? 0 : 1;
}
