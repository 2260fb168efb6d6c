/* forward.c - `mha forward`: torch.nn.MultiheadAttention (batch_first=True)
 * on .npy inputs and safetensors weights; `--layer` hands over to the
 * Transformer layer command (cli/forward_layer.c).  --dtype f16|bf16 rounds
 * the inputs and weights once to that dtype; the module computes in float32
 * (its projections and attention take float32 only). */
#include "cli.h"
#include "mha_inputs.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: mha forward --weights W.safetensors --heads H --query Q.npy\n"
            "                   [--key K.npy --value V.npy] [--prefix P]\n"
            "                   [--key-padding-mask M.npy] [--attn-mask M.npy] [--causal]\n"
            "                   [--add-zero-attn] [--attn-weights-out A.npy [--no-average-weights]]\n"
            "                   [--masked-rows zero|nan] [--dtype f32|f16|bf16] --out Y.npy\n"
            "       mha forward --layer encoder|decoder ...   (mha forward --layer encoder --help)\n"
            "\n"
            "torch.nn.MultiheadAttention(batch_first=True) in eval mode: Y (B,L,E), and with\n"
            "--attn-weights-out the weights (B,L,S') averaged over heads or (B,H,L,S') per head,\n"
            "S' = S + 1 with bias_k/bias_v + 1 with --add-zero-attn.  Unbatched inputs give\n"
            "unbatched outputs.  Y is float32, or Q.npy's dtype when it is half (<f2\n"
            "float16, <u2 bfloat16 bits); the attention weights are float32.\n\n%s"
            "  --dtype D                f32 (default), f16 or bf16: query, key, value and\n"
            "                           every weight rounded once to D (nearest even), then\n"
            "                           computed in float32 as D-valued numbers\n"
            "  --attn-weights-out A.npy need_weights=True: write the attention weights\n"
            "  --no-average-weights     per-head weights (average_attn_weights=False)\n"
            "  --out Y.npy              the output\n"
            "\nexit status: 0 ok, 2 bad input (arguments, files, shapes), 1 internal failure\n",
            cli_mha_inputs_help);
}

int cli_forward(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--layer"))
            return cli_forward_layer(argc, argv);
    const char *cmd = "forward", *out_path = NULL, *weights_out = NULL;
    int average = 1;
    mha_dtype dtype = MHA_F32; /* --dtype: what inputs and weights are rounded to */
    cli_mha_inputs in;
    cli_mha_inputs_init(&in);
    for (int i = 1; i < argc; i++) {
        int r = cli_mha_inputs_parse(&in, cmd, argc, argv, &i);
        if (r < 0)
            return CLI_BAD_INPUT;
        if (r > 0)
            continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return CLI_OK;
        } else if (!strcmp(argv[i], "--no-average-weights")) {
            average = 0;
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            if (cli_dtype_option(cmd, argv[i], argv[i + 1], &dtype) != CLI_OK)
                return CLI_BAD_INPUT;
            i++;
        } else if ((!strcmp(argv[i], "--out") || !strcmp(argv[i], "--attn-weights-out")) &&
                   i + 1 < argc) {
            *(argv[i][2] == 'o' ? &out_path : &weights_out) = argv[i + 1];
            i++;
        } else {
            fprintf(stderr, "mha %s: unknown or incomplete option '%s' (see mha %s --help)\n",
                    cmd, argv[i], cmd);
            return CLI_BAD_INPUT;
        }
    }
    if (!out_path) {
        fprintf(stderr, "mha %s: --out is required (see mha %s --help)\n", cmd, cmd);
        return CLI_BAD_INPUT;
    }
    int rc = cli_mha_inputs_load(&in, cmd);
    mha_tensor y = {0}, a = {0};
    mha_tensor rounded[9] = {{0}}; /* --dtype: owned rounded copies of in.wt */
    mha_status st = MHA_OK;
    if (rc == CLI_OK && dtype != MHA_F32) {
        mha_tensor *x[3] = {&in.query, &in.key, &in.value}, r;
        for (int k = 0; k < 3 && st == MHA_OK; k++)
            if (x[k]->data && (st = cli_tensor_rounded(&r, x[k], dtype)) == MHA_OK) {
                mha_tensor_free(x[k]);
                *x[k] = r;
            }
        /* the weights are views of the file: round copies, the views now point there */
        for (int k = 0; k < 9 && st == MHA_OK; k++)
            if (in.wt[k].data && (st = cli_tensor_rounded(&rounded[k], &in.wt[k], dtype)) == MHA_OK)
                in.wt[k] = rounded[k];
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, "--dtype");
    }
    if (rc == CLI_OK) {
        int b = in.batched;
        int64_t yshape[3] = {in.B, in.L, in.E};
        st = mha_tensor_create(&y, MHA_F32, b ? 3 : 2, yshape + !b);
        if (st == MHA_OK && weights_out) {
            int64_t Sx = in.S + in.S_extra;
            int64_t ashape[4] = {in.B, in.heads, in.L, Sx};
            int64_t avg[3] = {in.B, in.L, Sx};
            st = average ? mha_tensor_create(&a, MHA_F32, b ? 3 : 2, avg + !b)
                         : mha_tensor_create(&a, MHA_F32, b ? 4 : 3, ashape + !b);
            in.opt.attn_weights = &a;
            in.opt.average_attn_weights = average;
        }
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, NULL);
    }
    if (rc == CLI_OK) {
        st = mha_multihead_forward(&y, &in.query, in.key_ptr, in.value_ptr, &in.w, &in.opt);
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, NULL);
    }
    if (rc == CLI_OK) {
        mha_dtype fd = in.query_file_dtype;
        mha_dtype as = fd == MHA_F16 || fd == MHA_BF16 ? fd : MHA_F32;
        st = mha_npy_save(&y, out_path, as);
        if (st == MHA_OK && weights_out)
            st = mha_npy_save(&a, weights_out, MHA_F32);
        if (st != MHA_OK) {
            fprintf(stderr, "mha %s: %s\n", cmd, mha_last_error());
            rc = CLI_INTERNAL;
        }
    }
    mha_tensor_free(&y);
    mha_tensor_free(&a);
    for (int k = 0; k < 9; k++)
        mha_tensor_free(&rounded[k]);
    cli_mha_inputs_free(&in);
    return rc;
}
