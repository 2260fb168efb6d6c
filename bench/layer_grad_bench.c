/* layer_grad_bench.c - Transformer-layer backward time against forward.
 *
 *   make bench && build/layer_grad_bench [threads]
 *
 * For encoder and decoder layers (post- and pre-norm) prints one JSON line
 * per case: the best-of-N milliseconds of the inference forward
 * (mha_*_layer_forward), the saving forward (forward_train) and the
 * backward, and the ratios backward / forward and (forward_train +
 * backward) / forward.  FlashAttention's accounting counts backward against
 * the inference forward.  bench/layer_grad_torch.py times PyTorch autograd on
 * the same shapes.  Gradients are checked elsewhere (tests/unit/
 * test_grad_layers_parity.c); this only times.
 */
#include "mha.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static mha_tensor make(int ndim, const int64_t *shape, uint64_t seed, float std, float add) {
    mha_tensor t;
    mha_tensor_create(&t, MHA_F32, ndim, shape);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    mha_randn(t.data, n, seed, std);
    for (int64_t i = 0; i < n; i++)
        ((float *)t.data)[i] += add;
    return t;
}

int main(int argc, char **argv) {
    if (argc > 1)
        mha_set_num_threads(atoi(argv[1]));
    const int64_t cases[][6] = {/* B L S E H F */
                                {4, 128, 128, 256, 8, 1024},
                                {2, 512, 512, 256, 4, 1024},
                                {8, 64, 64, 512, 8, 2048}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int dec = 0; dec < 2; dec++)
            for (int nf = 0; nf < 2; nf++) {
                const int64_t B = cases[c][0], L = cases[c][1], S = cases[c][2],
                              E = cases[c][3], H = cases[c][4], F = cases[c][5];
                mha_tensor x = make(3, (int64_t[]){B, L, E}, 1, 1, 0);
                mha_tensor mem = make(3, (int64_t[]){B, S, E}, 2, 1, 0);
                mha_tensor y = make(3, (int64_t[]){B, L, E}, 3, 0, 0);
                mha_tensor dy = make(3, (int64_t[]){B, L, E}, 4, 1, 0);
                mha_tensor dx = make(3, (int64_t[]){B, L, E}, 5, 0, 0);
                mha_tensor dm = make(3, (int64_t[]){B, S, E}, 6, 0, 0);
                /* weights and their gradients */
                mha_tensor W[26], G[26];
                int nw = 0;
#define P(ndim, a, b, std, add) \
    (W[nw] = make(ndim, (int64_t[]){a, b}, 100 + nw, std, add), \
     G[nw] = make(ndim, (int64_t[]){a, b}, 0, 0, 0), nw++)
                mha_encoder_layer_weights ew;
                mha_decoder_layer_weights dw;
                mha_encoder_layer_grads eg;
                mha_decoder_layer_grads dg;
                memset(&ew, 0, sizeof ew), memset(&dw, 0, sizeof dw);
                memset(&eg, 0, sizeof eg), memset(&dg, 0, sizeof dg);
                mha_multihead_weights *aw[2] = {dec ? &dw.self_attn : &ew.self_attn,
                                                &dw.multihead_attn};
                mha_multihead_grads *ag[2] = {dec ? &dg.self_attn : &eg.self_attn,
                                              &dg.multihead_attn};
                for (int a = 0; a < 1 + dec; a++) {
                    P(2, 3 * E, E, 0.05f, 0), aw[a]->in_proj_weight = &W[nw - 1], ag[a]->in_proj_weight = &G[nw - 1];
                    P(1, 3 * E, 1, 0.02f, 0), aw[a]->in_proj_bias = &W[nw - 1], ag[a]->in_proj_bias = &G[nw - 1];
                    P(2, E, E, 0.05f, 0), aw[a]->out_proj_weight = &W[nw - 1], ag[a]->out_proj_weight = &G[nw - 1];
                    P(1, E, 1, 0.02f, 0), aw[a]->out_proj_bias = &W[nw - 1], ag[a]->out_proj_bias = &G[nw - 1];
                }
                const mha_tensor **lw[10];
                mha_tensor **lg[10];
                if (dec) {
                    const mha_tensor **a[10] = {&dw.linear1_weight, &dw.linear1_bias, &dw.linear2_weight, &dw.linear2_bias, &dw.norm1_weight, &dw.norm1_bias, &dw.norm2_weight, &dw.norm2_bias, &dw.norm3_weight, &dw.norm3_bias};
                    mha_tensor **b[10] = {&dg.linear1_weight, &dg.linear1_bias, &dg.linear2_weight, &dg.linear2_bias, &dg.norm1_weight, &dg.norm1_bias, &dg.norm2_weight, &dg.norm2_bias, &dg.norm3_weight, &dg.norm3_bias};
                    memcpy(lw, a, sizeof a), memcpy(lg, b, sizeof b);
                } else {
                    const mha_tensor **a[8] = {&ew.linear1_weight, &ew.linear1_bias, &ew.linear2_weight, &ew.linear2_bias, &ew.norm1_weight, &ew.norm1_bias, &ew.norm2_weight, &ew.norm2_bias};
                    mha_tensor **b[8] = {&eg.linear1_weight, &eg.linear1_bias, &eg.linear2_weight, &eg.linear2_bias, &eg.norm1_weight, &eg.norm1_bias, &eg.norm2_weight, &eg.norm2_bias};
                    memcpy(lw, a, sizeof a), memcpy(lg, b, sizeof b);
                }
                P(2, F, E, 0.05f, 0), *lw[0] = &W[nw - 1], *lg[0] = &G[nw - 1];
                P(1, F, 1, 0.02f, 0), *lw[1] = &W[nw - 1], *lg[1] = &G[nw - 1];
                P(2, E, F, 0.03f, 0), *lw[2] = &W[nw - 1], *lg[2] = &G[nw - 1];
                P(1, E, 1, 0.02f, 0), *lw[3] = &W[nw - 1], *lg[3] = &G[nw - 1];
                for (int k = 0; k < 2 + dec; k++) {
                    P(1, E, 1, 0.1f, 1), *lw[4 + 2 * k] = &W[nw - 1], *lg[4 + 2 * k] = &G[nw - 1];
                    P(1, E, 1, 0.1f, 0), *lw[5 + 2 * k] = &W[nw - 1], *lg[5 + 2 * k] = &G[nw - 1];
                }
#undef P
                for (int i = 0; i < nw; i++)
                    if (W[i].shape[1] == 1)
                        W[i].ndim = 1, G[i].ndim = 1, W[i].stride[0] = 1, G[i].stride[0] = 1;
                mha_layer_options opt;
                mha_layer_options_init(&opt);
                opt.num_heads = H, opt.norm_first = nf, opt.activation = MHA_ACT_GELU;
                mha_layer_masks masks = {NULL, NULL, dec, NULL, NULL};
                size_t sb, wb, fb;
                mha_layer_saved_size(B, L, S, E, H, &sb);
                mha_layer_train_workspace_size(B, L, S, E, F, H, &wb);
                if (dec)
                    mha_decoder_workspace_size(B, L, S, E, F, &fb);
                else
                    mha_encoder_workspace_size(B, L, E, F, &fb);
                void *saved = malloc(sb), *ws = malloc(wb), *fws = malloc(fb);
                double best[3] = {1e30, 1e30, 1e30};
                mha_status st = MHA_OK;
                for (int rep = 0; rep < 6 && st == MHA_OK; rep++) {
                    double t0 = now_ms();
                    st = dec ? mha_decoder_layer_forward(&y, &x, &mem, &dw, &masks, &opt, fws, fb)
                             : mha_encoder_layer_forward(&y, &x, &ew, &masks, &opt, fws, fb);
                    double t1 = now_ms();
                    if (st == MHA_OK)
                        st = dec ? mha_decoder_layer_forward_train(&y, saved, sb, &x, &mem, &dw, &masks, &opt, ws, wb)
                                 : mha_encoder_layer_forward_train(&y, saved, sb, &x, &ew, &masks, &opt, ws, wb);
                    double t2 = now_ms();
                    if (st == MHA_OK)
                        st = dec ? mha_decoder_layer_backward(&dx, &dm, &dg, &dy, saved, sb, &x, &mem, &dw, &masks, &opt, ws, wb)
                                 : mha_encoder_layer_backward(&dx, &eg, &dy, saved, sb, &x, &ew, &masks, &opt, ws, wb);
                    double t3 = now_ms();
                    if (rep > 0) { /* the first call warms caches and pages */
                        best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
                        best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
                        best[2] = t3 - t2 < best[2] ? t3 - t2 : best[2];
                    }
                }
                if (st != MHA_OK) {
                    fprintf(stderr, "layer_grad_bench: %s\n", mha_last_error());
                    return 1;
                }
                printf("{\"op\":\"%s_layer_bwd\",\"norm_first\":%d,\"B\":%lld,\"L\":%lld,\"S\":%lld,"
                       "\"E\":%lld,\"H\":%lld,\"F\":%lld,\"threads\":%d,\"fwd_ms\":%.3f,"
                       "\"fwd_train_ms\":%.3f,\"bwd_ms\":%.3f,\"bwd_over_fwd\":%.2f,"
                       "\"train_step_over_fwd\":%.2f}\n",
                       dec ? "decoder" : "encoder", nf, (long long)B, (long long)L, (long long)S,
                       (long long)E, (long long)H, (long long)F, mha_get_num_threads(), best[0],
                       best[1], best[2], best[2] / best[0], (best[1] + best[2]) / best[0]);
                fflush(stdout);
                for (int i = 0; i < nw; i++)
                    mha_tensor_free(&W[i]), mha_tensor_free(&G[i]);
                mha_tensor_free(&x), mha_tensor_free(&mem), mha_tensor_free(&y);
                mha_tensor_free(&dy), mha_tensor_free(&dx), mha_tensor_free(&dm);
                free(saved), free(ws), free(fws);
            }
    return 0;
}
