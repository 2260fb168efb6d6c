/* attention.c - `mha attention`: the ONNX Attention operator (opsets 23-25)
 * on .npy files, a thin client of mha_onnx_attention().
 * q (B,Hq,L,d) k (B,Hkv,S,d) v (B,Hkv,S,dv) -> out (B,Hq,L,dv), or the 3-D
 * forms (B,L,H*d) with --q-heads/--kv-heads.  docs/onnx.md.
 * --dtype f16|bf16: q, k, v (and the pasts) converted once to that storage
 * and handed to mha_sdpa_forward as half tensors (docs/onnx.md "dtypes"). */
#include "cli.h"
#include "mha_inputs.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: mha attention --q Q.npy --k K.npy --v V.npy [--mask M.npy] [--causal]\n"
            "                     [--scale S] --out Y.npy [more, below]\n"
            "\n"
            "The ONNX Attention operator (opsets 23, 24, 25 of onnx 1.23):\n"
            "Y = softmax(softcap(Q K^T * scale) + mask) V.\n"
            "inputs (.npy):\n"
            "  --q Q.npy      (B,Hq,L,d), or 3-D (B,L,Hq*d) with --q-heads\n"
            "  --k K.npy      (B,Hkv,S,d) or (B,S,Hkv*d), Hq a multiple of Hkv (grouped-query)\n"
            "  --v V.npy      (B,Hkv,S,dv) or (B,S,Hkv*dv)\n"
            "  --mask M.npy   bool: True = attend; float or integer: added to the scores;\n"
            "                 broadcast right-aligned to (B,Hq,L,T), T = past + S; a last dim\n"
            "                 shorter than T is padded with -inf (False)\n"
            "  --past-key PK.npy --past-value PV.npy   (B,Hkv,P,d) (B,Hkv,P,dv), together\n"
            "  --nonpad-kv-seqlen N.npy   (B) int64: valid keys per batch (external cache)\n"
            "options:\n"
            "  --causal       key j masked when j > i + offset; offset = P with a past,\n"
            "                 nonpad[b] - L with --nonpad-kv-seqlen, else 0 (top-left)\n"
            "  --scale S      default 1/sqrt(d); q and k are each multiplied by sqrt(S)\n"
            "  --q-heads N --kv-heads N   head counts of 3-D inputs\n"
            "  --softcap C    C*tanh(s/C) on the scaled scores, before the mask (0 = off)\n"
            "  --qk-mode M    what --qk-out holds: 0 scaled QK^T, 1 after softcap,\n"
            "                 2 after softcap and mask, 3 softmax (default 0)\n"
            "  --softmax-precision T   ONNX TensorProto dtype: 1 float, 10 float16,\n"
            "                 16 bfloat16 (all computed in float32), 11 double (float64)\n"
            "  --window-left N --window-right N   keys p-N <= j <= p+N, p = i + offset\n"
            "                 (-1 = unbounded, the default)\n"
            "  --dtype D      compute storage f32 (default), f16 or bf16: Q, K, V and the\n"
            "                 pasts are converted once to D (round to nearest even) and\n"
            "                 attention reads them as D, computing in float32 (P rounded\n"
            "                 to D before P.V).  Half files (<f2; bf16 as <u2 raw bits)\n"
            "                 are widened exactly to float32 unless --dtype says otherwise\n"
            "outputs (.npy): float32, or Q.npy's dtype when it is half (<f2 float16,\n"
            "                <u2 bfloat16 bits); present_value follows V.npy:\n"
            "  --out Y.npy    (B,Hq,L,dv) or (B,L,Hq*dv) for 3-D inputs\n"
            "  --present-key PK.npy --present-value PV.npy   concat(past, new): (B,Hkv,T,*)\n"
            "  --qk-out QK.npy   (B,Hq,L,T)\n"
            "Fully masked rows give 0.\n"
            "\nexit status: 0 ok, 2 bad input (arguments, files, shapes), 1 internal failure\n");
}

enum { IN_Q, IN_K, IN_V, IN_MASK, IN_PK, IN_PV, IN_NONPAD, OUT_Y, OUT_PK, OUT_PV, OUT_QK, NPATH };
static const char *const path_opt[NPATH] = {
    "--q",   "--k",           "--v",           "--mask",   "--past-key", "--past-value",
    "--nonpad-kv-seqlen",     "--out",         "--present-key",          "--present-value",
    "--qk-out"};

/* A float input: Q, K, V, past_key, past_value. */
static int load_float(const char *opt, const char *path, mha_tensor *t, mha_dtype *fd) {
    mha_status st = mha_npy_load_any(t, fd, path, 0);
    if (st != MHA_OK)
        return cli_input_fail("attention", opt, st);
    if (t->dtype != MHA_F32 || t->ndim < 3) {
        fprintf(stderr, "mha attention: %s: %s: %s\n", opt, path,
                t->dtype != MHA_F32 ? "integer or bool data, want a float array"
                                    : "not 4-D (nor 3-D with --q-heads/--kv-heads)");
        mha_tensor_free(t);
        return CLI_BAD_INPUT;
    }
    return CLI_OK;
}

static int parse_i64(const char *opt, const char *v, int64_t lo, int64_t *out) {
    if (!cli_parse_i64(v, lo, INT64_MAX, out)) {
        fprintf(stderr, "mha attention: %s: '%s' is not an integer >= %lld\n", opt, v,
                (long long)lo);
        return CLI_BAD_INPUT;
    }
    return CLI_OK;
}

static int parse_float(const char *opt, const char *v, float *out) {
    if (!cli_parse_f32(v, out)) {
        fprintf(stderr, "mha attention: %s: '%s' is not a finite number\n", opt, v);
        return CLI_BAD_INPUT;
    }
    return CLI_OK;
}

int cli_attention(int argc, char **argv) {
    const char *cmd = "attention";
    const char *path[NPATH] = {NULL};
    mha_dtype dtype = MHA_F32; /* --dtype: the storage attention reads */
    mha_onnx_attention_options opt;
    mha_onnx_attention_options_init(&opt);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return CLI_OK;
        }
        if (!strcmp(a, "--causal")) {
            opt.is_causal = 1;
            continue;
        }
        int k = 0;
        while (k < NPATH && strcmp(a, path_opt[k]))
            k++;
        static const char *const valued[] = {"--scale",           "--q-heads",     "--kv-heads",
                                             "--softcap",         "--qk-mode",
                                             "--softmax-precision", "--window-left",
                                             "--window-right",     "--dtype"};
        int vk = 0;
        while (vk < 9 && strcmp(a, valued[vk]))
            vk++;
        if (k == NPATH && vk == 9) {
            fprintf(stderr, "mha %s: unknown option '%s' (see mha %s --help)\n", cmd, a, cmd);
            return CLI_BAD_INPUT;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "mha %s: %s needs a value\n", cmd, a);
            return CLI_BAD_INPUT;
        }
        const char *v = argv[++i];
        int rc = CLI_OK;
        int64_t n = 0;
        switch (k < NPATH ? -1 : vk) {
        case -1: path[k] = v; break;
        case 0:
            rc = parse_float(a, v, &opt.scale);
            opt.scale_set = 1;
            break;
        case 1: rc = parse_i64(a, v, 1, &opt.q_num_heads); break;
        case 2: rc = parse_i64(a, v, 1, &opt.kv_num_heads); break;
        case 3: rc = parse_float(a, v, &opt.softcap); break;
        case 4:
            if ((rc = parse_i64(a, v, 0, &n)) == CLI_OK && n > 3) {
                fprintf(stderr, "mha %s: --qk-mode: %lld, want 0..3\n", cmd, (long long)n);
                rc = CLI_BAD_INPUT;
            }
            opt.qk_matmul_output_mode = (int)n;
            break;
        case 5:
            if ((rc = parse_i64(a, v, 1, &n)) == CLI_OK && n != 1 && n != 10 && n != 11 &&
                n != 16) {
                fprintf(stderr,
                        "mha %s: --softmax-precision: %lld, want 1 (float), 10 (float16), "
                        "11 (double) or 16 (bfloat16)\n",
                        cmd, (long long)n);
                rc = CLI_BAD_INPUT;
            }
            opt.softmax_precision = (int)n;
            break;
        case 6: rc = parse_i64(a, v, -1, &opt.left_window_size); break;
        case 7: rc = parse_i64(a, v, -1, &opt.right_window_size); break;
        case 8: rc = cli_dtype_option(cmd, a, v, &dtype); break;
        }
        if (rc != CLI_OK)
            return rc;
    }
    for (int k = 0; k < NPATH; k++)
        if ((k == IN_Q || k == IN_K || k == IN_V || k == OUT_Y) && !path[k]) {
            fprintf(stderr, "mha %s: %s is required (see mha %s --help)\n", cmd, path_opt[k], cmd);
            return CLI_BAD_INPUT;
        }
    if (!path[IN_PK] != !path[IN_PV] || !path[OUT_PK] != !path[OUT_PV]) {
        fprintf(stderr, "mha %s: %s go together\n", cmd,
                !path[IN_PK] != !path[IN_PV] ? "--past-key and --past-value"
                                             : "--present-key and --present-value");
        return CLI_BAD_INPUT;
    }

    mha_tensor in[7] = {{0}}, out[4] = {{0}};
    mha_dtype fd[7] = {MHA_F32, MHA_F32, MHA_F32, MHA_F32, MHA_F32, MHA_F32, MHA_F32};
    int rc = CLI_OK;
    for (int k = 0; rc == CLI_OK && k < 7; k++) {
        if (!path[k])
            continue;
        if (k == IN_MASK) {
            mha_status st = mha_npy_load_any(&in[k], &fd[k], path[k], 0);
            if (st != MHA_OK)
                rc = cli_input_fail(cmd, path_opt[k], st);
        } else if (k == IN_NONPAD) {
            mha_status st = mha_npy_load(&in[k], path[k], MHA_I64);
            if (st != MHA_OK)
                rc = cli_input_fail(cmd, path_opt[k], st);
        } else {
            rc = load_float(path_opt[k], path[k], &in[k], &fd[k]);
        }
    }
    /* ONNX types: Q, K, past_key share T1; V and past_value share T2 */
    if (rc == CLI_OK && (fd[IN_K] != fd[IN_Q] || (path[IN_PK] && fd[IN_PK] != fd[IN_Q]) ||
                         (path[IN_PV] && fd[IN_PV] != fd[IN_V]))) {
        fprintf(stderr, "mha %s: --q, --k, --past-key (and --v, --past-value) must have one "
                        "float dtype\n", cmd);
        rc = CLI_BAD_INPUT;
    }
    if (rc == CLI_OK && in[IN_Q].ndim == 3 && (!opt.q_num_heads || !opt.kv_num_heads)) {
        fprintf(stderr, "mha %s: --q: a 3-D (B,L,H*d) input needs --q-heads and --kv-heads "
                        "(it is not 4-D)\n", cmd);
        rc = CLI_BAD_INPUT;
    }
    /* --dtype: the float inputs converted once to the compute storage */
    for (int k = 0; rc == CLI_OK && k < 7; k++) {
        if (!path[k] || k == IN_MASK || k == IN_NONPAD)
            continue;
        mha_status st = cli_tensor_to_dtype(&in[k], dtype);
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, path_opt[k]);
    }
    /* outputs in the input's float type: T1 for Y, present_key, qk; T2 for
     * present_value; float32 unless that file was half */
    mha_dtype as[4];
    for (int o = 0; o < 4; o++) {
        mha_dtype t = fd[o == 2 ? IN_V : IN_Q];
        as[o] = t == MHA_F16 || t == MHA_BF16 ? t : MHA_F32;
    }
    const mha_tensor *ip[7];
    for (int k = 0; k < 7; k++)
        ip[k] = path[k] ? &in[k] : NULL;
    mha_onnx_attention_shapes sh;
    if (rc == CLI_OK) {
        mha_status st = mha_onnx_attention_shapes_get(&sh, ip[0], ip[1], ip[2], ip[3], ip[4],
                                                      ip[5], ip[6], &opt);
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, NULL);
    }
    const int64_t *shapes[4] = {sh.y, sh.present_key, sh.present_value, sh.qk};
    for (int o = 0; rc == CLI_OK && o < 4; o++) {
        if (!path[OUT_Y + o])
            continue;
        /* half compute: y and the presents in their file dtype (rounded once);
         * qk_matmul_output stays float32 */
        mha_dtype odt = dtype == MHA_F32 || o == 3 ? MHA_F32 : as[o];
        mha_status st = mha_tensor_create(&out[o], odt, o == 0 ? sh.y_ndim : 4, shapes[o]);
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, NULL);
    }
    if (rc == CLI_OK) {
        mha_status st = mha_onnx_attention(&out[0], path[OUT_PK] ? &out[1] : NULL,
                                           path[OUT_PV] ? &out[2] : NULL,
                                           path[OUT_QK] ? &out[3] : NULL, ip[0], ip[1], ip[2],
                                           ip[3], ip[4], ip[5], ip[6], &opt);
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, NULL);
    }
    for (int o = 0; rc == CLI_OK && o < 4; o++) {
        if (!path[OUT_Y + o])
            continue;
        if (mha_npy_save(&out[o], path[OUT_Y + o], as[o]) != MHA_OK) {
            fprintf(stderr, "mha %s: %s\n", cmd, mha_last_error());
            rc = CLI_INTERNAL;
        }
    }
    for (int k = 0; k < 7; k++)
        mha_tensor_free(&in[k]);
    for (int o = 0; o < 4; o++)
        mha_tensor_free(&out[o]);
    return rc;
}
