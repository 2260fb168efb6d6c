/* test_workspace_align.c - a caller workspace need only be float-aligned:
 * the layer forward (and the multi-head attention inside it, whose kernel
 * scratch is carved from that workspace) gives the same bits with the
 * workspace at any 4-byte offset from a 64-byte line as with none.  At
 * c0cd990 offsets 4..28 (mod 32) crashed in the fused AVX2 kernel.
 *
 * Letter legend: B batch, L length, E width, F MLP width, H heads.
 */
#include "test.h"

enum { B = 2, L = 5, E = 12, F = 20, H = 3 };

TEST(workspace_any_float_alignment_gives_the_same_bits) {
    float x[B * L * E], ref[B * L * E], out[B * L * E], ipw[3 * E * E], opw[E * E], l1[F * E],
        l2[E * F];
    test_randn(x, B * L * E, 1);
    test_randn(ipw, 3 * E * E, 2);
    test_randn(opw, E * E, 3);
    test_randn(l1, F * E, 4);
    test_randn(l2, E * F, 5);
    mha_tensor X, O, R, IPW, OPW, L1, L2;
    mha_tensor_init(&X, MHA_F32, x, 3, (int64_t[]){B, L, E});
    mha_tensor_init(&O, MHA_F32, out, 3, (int64_t[]){B, L, E});
    mha_tensor_init(&R, MHA_F32, ref, 3, (int64_t[]){B, L, E});
    mha_tensor_init(&IPW, MHA_F32, ipw, 2, (int64_t[]){3 * E, E});
    mha_tensor_init(&OPW, MHA_F32, opw, 2, (int64_t[]){E, E});
    mha_tensor_init(&L1, MHA_F32, l1, 2, (int64_t[]){F, E});
    mha_tensor_init(&L2, MHA_F32, l2, 2, (int64_t[]){E, F});
    mha_encoder_layer_weights w;
    memset(&w, 0, sizeof w);
    w.self_attn.in_proj_weight = &IPW, w.self_attn.out_proj_weight = &OPW;
    w.linear1_weight = &L1, w.linear2_weight = &L2;
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = H;
    size_t bytes;
    CHECK_STATUS(mha_encoder_workspace_size(B, L, E, F, &bytes), MHA_OK);
    char *raw = aligned_alloc(64, (bytes + 64 + 63) / 64 * 64);
    REQUIRE(raw != NULL);
    for (int kernel = MHA_KERNEL_AUTO; kernel <= MHA_KERNEL_AVX512; kernel++) {
        if (kernel != MHA_KERNEL_AUTO && !test_kernel_runs((mha_kernel)kernel))
            continue;
        opt.kernel = (mha_kernel)kernel;
        CHECK_STATUS(mha_encoder_layer_forward(&R, &X, &w, NULL, &opt, NULL, 0), MHA_OK);
        for (int off = 0; off < 64; off += 4) {
            memset(out, 0, sizeof out);
            CHECK_STATUS(mha_encoder_layer_forward(&O, &X, &w, NULL, &opt, raw + off, bytes),
                         MHA_OK);
            if (memcmp(out, ref, sizeof out) != 0)
                test_fail(__FILE__, __LINE__, "kernel %s, workspace at offset %d: bits differ",
                          mha_kernel_name((mha_kernel)kernel), off);
        }
    }
    free(raw);
}
