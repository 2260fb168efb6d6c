/* grad.c - `mha grad`: gradients of nn.MultiheadAttention (batch_first=True)
 * for an upstream gradient dY, written as .npy and safetensors so they can be
 * checked against PyTorch autograd from outside.
 *
 * Loss convention: L = sum(dY * Y); the files hold dL/dinput and dL/dparam.
 * Dropout is off (eval); the attention-weights flags of `mha forward` are
 * refused.  Layer gradients (--layer encoder|decoder) hand over to
 * cli_grad_layer (cli/grad_layer.c).
 */
#include "cli.h"
#include "mha_inputs.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: mha grad --weights W.safetensors --heads H --query Q.npy\n"
            "                [--key K.npy --value V.npy] [--prefix P]\n"
            "                [--key-padding-mask M.npy] [--attn-mask M.npy] [--causal]\n"
            "                [--add-zero-attn] [--masked-rows zero|nan]\n"
            "                --grad-out dY.npy --out-dir DIR\n"
            "       mha grad --layer encoder|decoder ...\n"
            "\n"
            "Gradients of L = sum(dY * MultiheadAttention(Q, K, V)) (eval mode, no dropout):\n"
            "  DIR/grad_query.npy          dL/dQ; without --key/--value (self-attention) the\n"
            "                              whole gradient through query, key and value\n"
            "  DIR/grad_key.npy, grad_value.npy   with --key/--value\n"
            "  DIR/grad_weights.safetensors one gradient per parameter, under the\n"
            "                              parameter's own name (with --prefix)\n\n%s"
            "  --grad-out dY.npy        the upstream gradient, shaped as the output (B,L,E)\n"
            "  --out-dir DIR            created when missing\n"
            "\nexit status: 0 ok, 2 bad input (arguments, files, shapes), 1 internal failure\n",
            cli_mha_inputs_help);
}

/* Writes t to DIR/name.npy. */
static mha_status save_npy(const char *dir, const char *name, const mha_tensor *t) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    return mha_npy_save(t, path, MHA_F32);
}

int cli_grad(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--layer"))
            return cli_grad_layer(argc, argv);
    const char *cmd = "grad", *dy_path = NULL, *out_dir = NULL;
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
        } else if (!strcmp(argv[i], "--attn-weights-out") ||
                   !strcmp(argv[i], "--no-average-weights")) {
            fprintf(stderr, "mha %s: %s: attention weights are not an output of mha grad\n", cmd,
                    argv[i]);
            return CLI_BAD_INPUT;
        } else if ((!strcmp(argv[i], "--grad-out") || !strcmp(argv[i], "--out-dir")) &&
                   i + 1 < argc) {
            *(argv[i][2] == 'g' ? &dy_path : &out_dir) = argv[i + 1];
            i++;
        } else {
            fprintf(stderr, "mha %s: unknown or incomplete option '%s' (see mha %s --help)\n",
                    cmd, argv[i], cmd);
            return CLI_BAD_INPUT;
        }
    }
    if (!dy_path || !out_dir) {
        fprintf(stderr, "mha %s: --grad-out and --out-dir are required (see mha %s --help)\n",
                cmd, cmd);
        return CLI_BAD_INPUT;
    }
    if ((in.key_path != NULL) != (in.value_path != NULL)) {
        fprintf(stderr, "mha %s: --key and --value go together\n", cmd);
        return CLI_BAD_INPUT;
    }
    int rc = cli_mha_inputs_load(&in, cmd);
    mha_tensor dy = {0}, y = {0}, dx[3] = {{0}}, dw[9] = {{0}};
    void *saved = NULL;
    mha_status st = MHA_OK;
    const int self = in.key_path == NULL;
    if (rc == CLI_OK) {
        st = mha_npy_load(&dy, dy_path, MHA_F32);
        if (st != MHA_OK)
            rc = cli_input_fail(cmd, "--grad-out", st);
    }
    if (rc == CLI_OK) {
        int b = in.batched;
        int64_t yshape[3] = {in.B, in.L, in.E};
        bool fits = dy.ndim == (b ? 3 : 2);
        for (int i = 0; fits && i < dy.ndim; i++)
            fits = dy.shape[i] == yshape[i + !b];
        if (!fits) {
            fprintf(stderr, "mha %s: --grad-out: %s has the wrong shape; want the output's %s(%lld,%lld%s%lld)\n",
                    cmd, dy_path, b ? "(B,L,E) = " : "(L,E) = ", (long long)(b ? in.B : in.L),
                    (long long)(b ? in.L : in.E), b ? "," : ")", (long long)(b ? in.E : 0));
            rc = CLI_BAD_INPUT;
        }
    }
    /* the gradient buffers, shaped as what they differentiate, zeroed */
    const mha_tensor *src[3] = {&in.query, in.key_ptr, in.value_ptr};
    const mha_tensor *params[9] = {in.w.in_proj_weight, in.w.q_proj_weight, in.w.k_proj_weight,
                                   in.w.v_proj_weight,  in.w.in_proj_bias,  in.w.out_proj_weight,
                                   in.w.out_proj_bias,  in.w.bias_k,        in.w.bias_v};
    static const char *const names[9] = {"in_proj_weight", "q_proj_weight",   "k_proj_weight",
                                         "v_proj_weight",  "in_proj_bias",    "out_proj.weight",
                                         "out_proj.bias",  "bias_k",          "bias_v"};
    size_t bytes = 0;
    if (rc == CLI_OK) {
        for (int i = 0; st == MHA_OK && i < 3; i++)
            if (i == 0 || !self)
                st = mha_tensor_create(&dx[i], MHA_F32, src[i]->ndim, src[i]->shape);
        for (int i = 0; st == MHA_OK && i < 9; i++)
            if (params[i])
                st = mha_tensor_create(&dw[i], MHA_F32, params[i]->ndim, params[i]->shape);
        if (st == MHA_OK)
            st = mha_tensor_create(&y, MHA_F32, dy.ndim, dy.shape);
        if (st == MHA_OK)
            st = mha_multihead_saved_size(in.B, in.L, in.S, in.E, in.heads, in.w.bias_k != NULL,
                                          in.add_zero_attn, &bytes);
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, NULL);
    }
    mha_tensor saved_t = {0};
    if (rc == CLI_OK) {
        /* the saved state as one float tensor (aligned, freed with the rest) */
        int64_t n = (int64_t)((bytes + sizeof(float) - 1) / sizeof(float));
        st = mha_tensor_create(&saved_t, MHA_F32, 1, &n);
        if (st == MHA_OK) {
            saved = saved_t.data;
            st = mha_multihead_forward_train(&y, saved, bytes, &in.query, in.key_ptr,
                                             in.value_ptr, &in.w, &in.opt);
        }
        if (st == MHA_OK) {
            mha_multihead_grads g = {
                dw[0].data ? &dw[0] : NULL, dw[1].data ? &dw[1] : NULL, dw[2].data ? &dw[2] : NULL,
                dw[3].data ? &dw[3] : NULL, dw[4].data ? &dw[4] : NULL, dw[5].data ? &dw[5] : NULL,
                dw[6].data ? &dw[6] : NULL, dw[7].data ? &dw[7] : NULL, dw[8].data ? &dw[8] : NULL};
            st = mha_multihead_backward(&dx[0], self ? NULL : &dx[1], self ? NULL : &dx[2], &g,
                                        &dy, saved, bytes, &in.query, in.key_ptr, in.value_ptr,
                                        &in.w, &in.opt, NULL, 0);
        }
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, NULL);
    }
    if (rc == CLI_OK) {
        if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "mha %s: --out-dir: cannot create %s: %s\n", cmd, out_dir,
                    strerror(errno));
            rc = CLI_INTERNAL;
        }
    }
    if (rc == CLI_OK) {
        static const char *const xnames[3] = {"grad_query", "grad_key", "grad_value"};
        for (int i = 0; st == MHA_OK && i < 3; i++)
            if (dx[i].data)
                st = save_npy(out_dir, xnames[i], &dx[i]);
        char full[9][512];
        const char *wn[9];
        const mha_tensor *wt[9];
        int64_t n = 0;
        for (int i = 0; i < 9; i++)
            if (dw[i].data) {
                snprintf(full[n], sizeof full[n], "%s%s", in.prefix, names[i]);
                wn[n] = full[n];
                wt[n] = &dw[i];
                n++;
            }
        char path[4096];
        snprintf(path, sizeof path, "%s/grad_weights.safetensors", out_dir);
        if (st == MHA_OK)
            st = mha_safetensors_write(path, wn, wt, n, NULL, NULL, 0);
        if (st != MHA_OK) {
            fprintf(stderr, "mha %s: %s\n", cmd, mha_last_error());
            rc = CLI_INTERNAL;
        }
    }
    mha_tensor_free(&saved_t);
    mha_tensor_free(&dy);
    mha_tensor_free(&y);
    for (int i = 0; i < 3; i++)
        mha_tensor_free(&dx[i]);
    for (int i = 0; i < 9; i++)
        mha_tensor_free(&dw[i]);
    cli_mha_inputs_free(&in);
    return rc;
}
