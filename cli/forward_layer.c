/* forward_layer.c - `mha forward --layer encoder|decoder`: a Transformer
 * layer or stack (--num-layers N) on .npy inputs with safetensors weights
 * named as the PyTorch module's state_dict.  Parsing and printing only. */
#include "cli.h"
#include "mha_inputs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXL 64

static int usage(FILE *f) {
    fprintf(f,
            "usage: mha forward --layer encoder|decoder --weights W.safetensors --heads H\n"
            "                   --query X.npy [--memory M.npy] [--norm-first]\n"
            "                   [--activation relu|gelu] [--eps E] [--causal] [--attn-mask M.npy]\n"
            "                   [--key-padding-mask M.npy] [--memory-mask M.npy]\n"
            "                   [--memory-key-padding-mask M.npy] [--num-layers N] --out Y.npy\n"
            "  Weights: self_attn.*, multihead_attn.*, linear1.*, linear2.*, norm1/2/3.*;\n"
            "  with --num-layers N: layers.<i>.* and an optional final norm.*.\n"
            "  Masks: bool true = masked, float added (nn.MultiheadAttention).  For the\n"
            "  decoder, --causal/--attn-mask/--key-padding-mask act on the target.\n");
    return f == stdout ? CLI_OK : CLI_BAD_INPUT;
}

typedef struct views {
    mha_safetensors *st;
    mha_tensor t[MAXL * 26 + 2];
    int n;
    int bad;
} views;

/* The tensor `prefix+name` as a view, NULL when absent (or on error: bad). */
static const mha_tensor *view(views *v, const char *prefix, const char *name) {
    char key[256];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    if (mha_safetensors_find(v->st, key) < 0 || v->n >= (int)(sizeof v->t / sizeof *v->t))
        return NULL;
    if (mha_safetensors_view_f32(v->st, key, &v->t[v->n]) != MHA_OK) {
        v->bad = 1;
        return NULL;
    }
    return &v->t[v->n++];
}

static void attn(views *v, const char *prefix, const char *mod, mha_multihead_weights *w) {
    char p[192];
    snprintf(p, sizeof p, "%s%s.", prefix, mod);
    memset(w, 0, sizeof *w);
    w->in_proj_weight = view(v, p, "in_proj_weight");
    w->in_proj_bias = view(v, p, "in_proj_bias");
    w->out_proj_weight = view(v, p, "out_proj.weight");
    w->out_proj_bias = view(v, p, "out_proj.bias");
}

int cli_forward_layer(int argc, char **argv) {
    const char *layer = NULL, *weights = NULL, *query = NULL, *memory = NULL, *out = NULL;
    const char *am = NULL, *kpm = NULL, *mm = NULL, *mkpm = NULL, *act = "relu";
    long heads = 0, num_layers = 0;
    int norm_first = 0, causal = 0;
    float eps = 1e-5f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(flag, dst)                                                                  \
    if (!strcmp(a, flag)) {                                                             \
        if (!val) {                                                                     \
            fprintf(stderr, "mha forward: %s needs a value\n", flag);                   \
            return CLI_BAD_INPUT;                                                       \
        }                                                                               \
        dst = val, i++;                                                                 \
        continue;                                                                       \
    }
        const char *hs = NULL, *es = NULL, *ns = NULL;
        OPT("--layer", layer) OPT("--weights", weights) OPT("--query", query)
        OPT("--memory", memory) OPT("--out", out) OPT("--attn-mask", am)
        OPT("--key-padding-mask", kpm) OPT("--memory-mask", mm)
        OPT("--memory-key-padding-mask", mkpm) OPT("--activation", act)
        if (!strcmp(a, "--heads") || !strcmp(a, "--eps") || !strcmp(a, "--num-layers")) {
            if (!val) {
                fprintf(stderr, "mha forward: %s needs a value\n", a);
                return CLI_BAD_INPUT;
            }
            bool ok;
            if (!strcmp(a, "--eps")) {
                es = val, ok = cli_parse_f32(es, &eps);
            } else {
                int64_t n = 0;
                ok = cli_parse_i64(val, INT64_MIN, INT64_MAX, &n);
                if (!strcmp(a, "--heads"))
                    hs = val, heads = n;
                else
                    ns = val, num_layers = n;
            }
            if (!ok) {
                fprintf(stderr, "mha forward: %s: not a number: '%s'\n", a, val);
                return CLI_BAD_INPUT;
            }
            (void)hs, (void)es, (void)ns;
            i++;
            continue;
        }
#undef OPT
        if (!strcmp(a, "--norm-first")) norm_first = 1;
        else if (!strcmp(a, "--causal")) causal = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout);
        else {
            fprintf(stderr, "mha forward: unknown option '%s'\n", a);
            return usage(stderr);
        }
    }
    int dec = layer && !strcmp(layer, "decoder");
    if (!layer || (!dec && strcmp(layer, "encoder"))) {
        fprintf(stderr, "mha forward: --layer must be encoder or decoder\n");
        return CLI_BAD_INPUT;
    }
    if (!weights || !query || !out || heads <= 0 || (dec && !memory) || (!dec && (memory || mm || mkpm))) {
        fprintf(stderr, "mha forward: need --weights, --query, --out, --heads > 0%s\n",
                dec ? " and --memory" : " (and no --memory* for the encoder)");
        return CLI_BAD_INPUT;
    }
    if (num_layers < 0 || num_layers > MAXL) {
        fprintf(stderr, "mha forward: --num-layers must be 1..%d\n", MAXL);
        return CLI_BAD_INPUT;
    }
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = heads;
    opt.norm_first = norm_first;
    opt.layer_norm_eps = eps;
    if (!strcmp(act, "gelu")) opt.activation = MHA_ACT_GELU;
    else if (strcmp(act, "relu")) {
        fprintf(stderr, "mha forward: --activation must be relu or gelu\n");
        return CLI_BAD_INPUT;
    }

    int rc = CLI_OK;
    mha_status st;
    views *v = calloc(1, sizeof *v);
    mha_tensor x = {0}, m = {0}, y = {0}, masks_t[4] = {{0}};
    mha_encoder_layer_weights *ew = calloc(MAXL, sizeof *ew);
    mha_decoder_layer_weights *dw = calloc(MAXL, sizeof *dw);
    if (!v || !ew || !dw) {
        rc = cli_fail("forward", MHA_ERR_NOMEM, NULL);
        goto done;
    }
    if ((st = mha_safetensors_open(&v->st, weights))) {
        rc = cli_input_fail("forward", "--weights", st);
        goto done;
    }
    if ((st = mha_npy_load(&x, query, MHA_F32))) {
        rc = cli_input_fail("forward", "--query", st);
        goto done;
    }
    if (memory && (st = mha_npy_load(&m, memory, MHA_F32))) {
        rc = cli_input_fail("forward", "--memory", st);
        goto done;
    }
    const char *mpaths[4] = {am, kpm, mm, mkpm};
    const mha_tensor *mp[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++) {
        if (!mpaths[i])
            continue;
        mha_dtype fd;
        if ((st = mha_npy_load_any(&masks_t[i], &fd, mpaths[i], 1))) {
            rc = cli_input_fail("forward", mpaths[i], st);
            goto done;
        }
        mp[i] = &masks_t[i];
    }
    mha_layer_masks masks = {mp[0], mp[1], causal, mp[2], mp[3]};

    int64_t nl = num_layers ? num_layers : 1;
    for (int64_t l = 0; l < nl; l++) {
        char p[64] = "";
        if (num_layers)
            snprintf(p, sizeof p, "layers.%lld.", (long long)l);
        if (dec) {
            mha_decoder_layer_weights *w = &dw[l];
            attn(v, p, "self_attn", &w->self_attn);
            attn(v, p, "multihead_attn", &w->multihead_attn);
            w->linear1_weight = view(v, p, "linear1.weight"), w->linear1_bias = view(v, p, "linear1.bias");
            w->linear2_weight = view(v, p, "linear2.weight"), w->linear2_bias = view(v, p, "linear2.bias");
            w->norm1_weight = view(v, p, "norm1.weight"), w->norm1_bias = view(v, p, "norm1.bias");
            w->norm2_weight = view(v, p, "norm2.weight"), w->norm2_bias = view(v, p, "norm2.bias");
            w->norm3_weight = view(v, p, "norm3.weight"), w->norm3_bias = view(v, p, "norm3.bias");
        } else {
            mha_encoder_layer_weights *w = &ew[l];
            attn(v, p, "self_attn", &w->self_attn);
            w->linear1_weight = view(v, p, "linear1.weight"), w->linear1_bias = view(v, p, "linear1.bias");
            w->linear2_weight = view(v, p, "linear2.weight"), w->linear2_bias = view(v, p, "linear2.bias");
            w->norm1_weight = view(v, p, "norm1.weight"), w->norm1_bias = view(v, p, "norm1.bias");
            w->norm2_weight = view(v, p, "norm2.weight"), w->norm2_bias = view(v, p, "norm2.bias");
        }
    }
    const mha_tensor *nw = num_layers ? view(v, "", "norm.weight") : NULL;
    const mha_tensor *nb = num_layers ? view(v, "", "norm.bias") : NULL;
    if (v->bad) {
        rc = cli_fail("forward", MHA_ERR_FORMAT, weights);
        goto done;
    }
    if ((st = mha_tensor_create(&y, MHA_F32, x.ndim, x.shape))) {
        rc = cli_fail("forward", st, NULL);
        goto done;
    }
    if (dec) {
        mha_decoder_weights s = {nl, dw, nw || nb, nw, nb};
        st = mha_decoder_forward(&y, &x, &m, &s, &masks, &opt, NULL, 0);
    } else {
        mha_encoder_weights s = {nl, ew, nw || nb, nw, nb};
        st = mha_encoder_forward(&y, &x, &s, &masks, &opt, NULL, 0);
    }
    if (st) {
        rc = cli_fail("forward", st, layer);
        goto done;
    }
    if ((st = mha_npy_save(&y, out, MHA_F32)))
        rc = cli_fail("forward", st, out);
done:
    for (int i = 0; i < 4; i++)
        mha_tensor_free(&masks_t[i]);
    mha_tensor_free(&x);
    mha_tensor_free(&m);
    mha_tensor_free(&y);
    if (v)
        mha_safetensors_free(v->st);
    free(v), free(ew), free(dw);
    return rc;
}
