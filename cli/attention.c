/* attention.c - `mha attention`: scaled dot-product attention on .npy files,
 * q (B,Hq,L,d) k (B,Hkv,S,d) v (B,Hkv,S,dv) -> out (B,Hq,L,dv). */
#include "cli.h"
#include "mha_inputs.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: mha attention --q Q.npy --k K.npy --v V.npy [--mask M.npy] [--causal]\n"
            "                     [--scale S] --out Y.npy\n"
            "\n"
            "Scaled dot-product attention: Y = softmax(Q K^T * scale + mask) V.\n"
            "  --q Q.npy      (B,Hq,L,d)\n"
            "  --k K.npy      (B,Hkv,S,d), Hq a multiple of Hkv (grouped-query heads)\n"
            "  --v V.npy      (B,Hkv,S,dv)\n"
            "  --mask M.npy   bool/int: True = attend; float: added to the scores;\n"
            "                 broadcast right-aligned to (B,Hq,L,S)\n"
            "  --causal       mask j > i (top-left)\n"
            "  --scale S      default 1/sqrt(d)\n"
            "  --out Y.npy    (B,Hq,L,dv); float16 when Q.npy is float16\n"
            "Fully masked rows give 0.\n"
            "\nexit status: 0 ok, 2 bad input (arguments, files, shapes), 1 internal failure\n");
}

static int load_qkv(const char *opt, const char *path, mha_tensor *t, mha_dtype *fd) {
    mha_status st = mha_npy_load_any(path, 0, t, fd);
    if (st != MHA_OK)
        return cli_input_fail("attention", opt, st);
    if (t->dtype != MHA_F32 || t->ndim != 4) {
        fprintf(stderr, "mha attention: %s: %s: %s, want a 4-D float array\n", opt, path,
                t->dtype != MHA_F32 ? "integer or bool data" : "not 4-D");
        mha_tensor_free(t);
        return CLI_BAD_INPUT;
    }
    return CLI_OK;
}

int cli_attention(int argc, char **argv) {
    const char *cmd = "attention";
    const char *path[5] = {NULL}; /* q k v mask out */
    static const char *names[5] = {"--q", "--k", "--v", "--mask", "--out"};
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return CLI_OK;
        }
        if (!strcmp(a, "--causal")) {
            opt.causal = MHA_CAUSAL_TOP_LEFT;
            continue;
        }
        int k = 0;
        while (k < 5 && strcmp(a, names[k]))
            k++;
        if ((k < 5 || !strcmp(a, "--scale")) && i + 1 >= argc) {
            fprintf(stderr, "mha %s: %s needs a value\n", cmd, a);
            return CLI_BAD_INPUT;
        }
        if (k < 5) {
            path[k] = argv[++i];
        } else if (!strcmp(a, "--scale")) {
            const char *v = argv[++i];
            char *end;
            errno = 0;
            double s = strtod(v, &end);
            if (errno || end == v || *end || !isfinite(s) || !isfinite((float)s)) {
                fprintf(stderr, "mha %s: --scale: '%s' is not a finite number\n", cmd, v);
                return CLI_BAD_INPUT;
            }
            opt.scale_set = 1;
            opt.scale = (float)s;
        } else {
            fprintf(stderr, "mha %s: unknown option '%s' (see mha %s --help)\n", cmd, a, cmd);
            return CLI_BAD_INPUT;
        }
    }
    for (int k = 0; k < 5; k++)
        if (k != 3 && !path[k]) {
            fprintf(stderr, "mha %s: %s is required (see mha %s --help)\n", cmd, names[k], cmd);
            return CLI_BAD_INPUT;
        }
    mha_tensor q = {0}, k = {0}, v = {0}, m = {0}, y = {0};
    mha_dtype qd = MHA_F32;
    int rc = load_qkv("--q", path[0], &q, &qd);
    if (rc == CLI_OK)
        rc = load_qkv("--k", path[1], &k, NULL);
    if (rc == CLI_OK)
        rc = load_qkv("--v", path[2], &v, NULL);
    if (rc == CLI_OK && path[3]) {
        mha_status st = mha_npy_load_any(path[3], 1, &m, NULL);
        if (st != MHA_OK)
            rc = cli_input_fail(cmd, "--mask", st);
        opt.mask = &m;
        opt.mask_polarity = MHA_TRUE_KEEPS;
    }
    if (rc == CLI_OK) {
        mha_status st = mha_tensor_alloc(&y, MHA_F32, 4,
                                         (int64_t[]){q.shape[0], q.shape[1], q.shape[2],
                                                     v.shape[3]});
        if (st == MHA_OK)
            st = mha_sdpa_forward(&y, &q, &k, &v, &opt);
        if (st != MHA_OK)
            rc = cli_fail(cmd, st, NULL);
    }
    if (rc == CLI_OK && mha_npy_save(path[4], &y, qd == MHA_F16 ? MHA_F16 : MHA_F32) != MHA_OK) {
        fprintf(stderr, "mha %s: %s\n", cmd, mha_last_error());
        rc = CLI_INTERNAL;
    }
    mha_tensor_free(&q);
    mha_tensor_free(&k);
    mha_tensor_free(&v);
    mha_tensor_free(&m);
    mha_tensor_free(&y);
    return rc;
}
