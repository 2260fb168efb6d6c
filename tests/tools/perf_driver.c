/* perf_driver.c - fixed, single-threaded workloads for the instruction-count
 * speed guard (tests/perf_guard.sh runs each under callgrind, counting only
 * inside the entry point named by the workload's toggle).
 *
 *   perf_driver WORKLOAD      runs it once; exit 0, or 2 when the build or
 *                             CPU lacks the kernel, 1 on failure
 *   perf_driver --list        prints "WORKLOAD TOGGLE" lines
 *
 * Shapes are small and odd (tile tails), inputs deterministic.
 */
#include "mha.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* SDPA: B=1 Hq=4 Hkv=2 L=61 S=67 d=dv=32, bottom-right causal. */
static int sdpa(mha_kernel kernel, int with_weights) {
    enum { B = 1, HQ = 4, HKV = 2, L = 61, S = 67, D = 32 };
    static float q[B * HQ * L * D], k[B * HKV * S * D], v[B * HKV * S * D], o[B * HQ * L * D],
        w[B * HQ * L * S];
    mha_randn(q, sizeof q / sizeof *q, 1, 1.0f);
    mha_randn(k, sizeof k / sizeof *k, 2, 1.0f);
    mha_randn(v, sizeof v / sizeof *v, 3, 1.0f);
    mha_tensor Q, K, V, O, W;
    mha_tensor_init(&Q, MHA_F32, q, 4, (int64_t[]){B, HQ, L, D});
    mha_tensor_init(&K, MHA_F32, k, 4, (int64_t[]){B, HKV, S, D});
    mha_tensor_init(&V, MHA_F32, v, 4, (int64_t[]){B, HKV, S, D});
    mha_tensor_init(&O, MHA_F32, o, 4, (int64_t[]){B, HQ, L, D});
    mha_tensor_init(&W, MHA_F32, w, 4, (int64_t[]){B, HQ, L, S});
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.kernel = kernel;
    opt.causal = MHA_CAUSAL_BOTTOM_RIGHT;
    if (with_weights)
        opt.attn_weights = &W;
    mha_status st = mha_sdpa_forward(&O, &Q, &K, &V, &opt);
    if (st == MHA_ERR_UNSUPPORTED)
        return 2;
    return st == MHA_OK ? 0 : 1;
}

/* nn.MultiheadAttention self-attention: B=1 L=33 E=64 H=4, causal. */
static int multihead(void) {
    enum { L = 33, E = 64 };
    static float x[L * E], o[L * E], w_in[3 * E * E], b_in[3 * E], w_out[E * E], b_out[E];
    mha_randn(x, L * E, 4, 1.0f);
    mha_randn(w_in, 3 * E * E, 5, 0.1f);
    mha_randn(b_in, 3 * E, 6, 0.1f);
    mha_randn(w_out, E * E, 7, 0.1f);
    mha_randn(b_out, E, 8, 0.1f);
    mha_tensor X, O, Wi, Bi, Wo, Bo;
    mha_tensor_init(&X, MHA_F32, x, 3, (int64_t[]){1, L, E});
    mha_tensor_init(&O, MHA_F32, o, 3, (int64_t[]){1, L, E});
    mha_tensor_init(&Wi, MHA_F32, w_in, 2, (int64_t[]){3 * E, E});
    mha_tensor_init(&Bi, MHA_F32, b_in, 1, (int64_t[]){3 * E});
    mha_tensor_init(&Wo, MHA_F32, w_out, 2, (int64_t[]){E, E});
    mha_tensor_init(&Bo, MHA_F32, b_out, 1, (int64_t[]){E});
    mha_multihead_weights w = {0};
    w.in_proj_weight = &Wi, w.in_proj_bias = &Bi, w.out_proj_weight = &Wo, w.out_proj_bias = &Bo;
    mha_multihead_options opt;
    mha_multihead_options_init(&opt);
    opt.num_heads = 4;
    opt.causal = 1;
    opt.kernel = MHA_KERNEL_SCALAR; /* portable: the same count on any x86-64 */
    return mha_multihead_forward(&O, &X, &X, &X, &w, &opt) == MHA_OK ? 0 : 1;
}

/* LayerNorm over 97 rows of 64. */
static int layernorm(void) {
    enum { N = 97, E = 64 };
    static float x[N * E], y[N * E], g[E], b[E];
    mha_randn(x, N * E, 9, 1.0f);
    mha_randn(g, E, 10, 1.0f);
    mha_randn(b, E, 11, 1.0f);
    mha_tensor X, Y, G, Bt;
    mha_tensor_init(&X, MHA_F32, x, 2, (int64_t[]){N, E});
    mha_tensor_init(&Y, MHA_F32, y, 2, (int64_t[]){N, E});
    mha_tensor_init(&G, MHA_F32, g, 1, (int64_t[]){E});
    mha_tensor_init(&Bt, MHA_F32, b, 1, (int64_t[]){E});
    return mha_layernorm_forward(&Y, &X, &G, &Bt, 1e-5f) == MHA_OK ? 0 : 1;
}

static const struct {
    const char *name, *toggle;
} workloads[] = {
    {"sdpa_ref", "mha_sdpa_forward"},          {"sdpa_scalar", "mha_sdpa_forward"},
    {"sdpa_avx2", "mha_sdpa_forward"},         {"sdpa_avx2_weights", "mha_sdpa_forward"},
    {"multihead_scalar", "mha_multihead_forward"}, {"layernorm", "mha_layernorm_forward"},
};

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: perf_driver WORKLOAD | --list\n");
        return 1;
    }
    mha_set_num_threads(1);
    const char *w = argv[1];
    if (!strcmp(w, "--list")) {
        for (size_t i = 0; i < sizeof workloads / sizeof *workloads; i++)
            printf("%s %s\n", workloads[i].name, workloads[i].toggle);
        return 0;
    }
    if (!strcmp(w, "sdpa_ref"))
        return sdpa(MHA_KERNEL_REF, 0);
    if (!strcmp(w, "sdpa_scalar"))
        return sdpa(MHA_KERNEL_SCALAR, 0);
    if (!strcmp(w, "sdpa_avx2"))
        return sdpa(MHA_KERNEL_AVX2, 0);
    if (!strcmp(w, "sdpa_avx2_weights"))
        return sdpa(MHA_KERNEL_AVX2, 1);
    if (!strcmp(w, "multihead_scalar"))
        return multihead();
    if (!strcmp(w, "layernorm"))
        return layernorm();
    fprintf(stderr, "perf_driver: unknown workload '%s'\n", w);
    return 1;
}
