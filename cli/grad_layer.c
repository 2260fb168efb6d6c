/* grad_layer.c - `mha grad --layer encoder|decoder`: gradients of one
 * nn.TransformerEncoderLayer / DecoderLayer (batch_first=True, dropout off)
 * for an upstream gradient dY: L = sum(dY * layer(X[, M])).
 *
 * Writes DIR/grad_query.npy (dL/dX), DIR/grad_memory.npy (decoder: dL/dM)
 * and DIR/grad_weights.safetensors with one gradient per parameter present
 * in the weights file, under the parameter's own name (prefix kept).
 * cli_grad (grad.c) hands --layer over to it; parsing and printing only.
 */
#include "cli.h"
#include "mha_inputs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAXL 64                /* --num-layers at most                 */
#define MAXP (26 * MAXL + 2)   /* a decoder layer has 26 parameters     */

static int usage(FILE *f) {
    fprintf(f,
            "usage: mha grad --layer encoder|decoder --weights W.safetensors --heads H\n"
            "                --query X.npy [--memory M.npy] [--prefix P] [--norm-first]\n"
            "                [--activation relu|gelu|gelu_tanh|silu] [--eps E] [--causal]\n"
            "                [--attn-mask M.npy] [--key-padding-mask M.npy]\n"
            "                [--memory-mask M.npy] [--memory-key-padding-mask M.npy]\n"
            "                [--num-layers N] --grad-out dY.npy --out-dir DIR\n"
            "\n"
            "Gradients of L = sum(dY * layer(X[, M])) for one Transformer layer (dropout off):\n"
            "  DIR/grad_query.npy           dL/dX (the src / tgt)\n"
            "  DIR/grad_memory.npy          dL/dM (decoder)\n"
            "  DIR/grad_weights.safetensors one gradient per parameter, under the\n"
            "                               parameter's own name (P prefix included)\n"
            "Weights: P+self_attn.*, P+multihead_attn.*, P+linear1.*, P+linear2.*,\n"
            "P+norm1/2/3.* as the module's state_dict; with --num-layers N a stack\n"
            "(nn.TransformerEncoder/Decoder): P+layers.<i>.* and an optional P+norm.*.\n"
            "Masks: bool true = masked,\n"
            "float added; for the decoder --causal/--attn-mask/--key-padding-mask act on\n"
            "the target.\n"
            "\nexit status: 0 ok, 2 bad input (arguments, files, shapes), 1 internal failure\n");
    return f == stdout ? CLI_OK : CLI_BAD_INPUT;
}

/* The parameters: names, views into the file, gradient tensors. */
typedef struct params {
    mha_safetensors *st;
    int n, bad;
    char names[MAXP][256];
    mha_tensor w[MAXP], g[MAXP];
} params;

/* Binds `prefix+name` to *w and its gradient to *g (both NULL when absent). */
static void bind(params *p, const char *prefix, const char *name, const mha_tensor **w,
                 mha_tensor **g) {
    char key[256];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    *w = NULL, *g = NULL;
    if (mha_safetensors_find(p->st, key) < 0 || p->n >= MAXP)
        return;
    int i = p->n;
    if (mha_safetensors_view_f32(p->st, key, &p->w[i]) != MHA_OK ||
        mha_tensor_create(&p->g[i], MHA_F32, p->w[i].ndim, p->w[i].shape) != MHA_OK) {
        p->bad = 1;
        return;
    }
    snprintf(p->names[i], sizeof p->names[i], "%s", key);
    *w = &p->w[i], *g = &p->g[i];
    p->n++;
}

static void bind_attn(params *p, const char *prefix, const char *mod, mha_multihead_weights *w,
                      mha_multihead_grads *g) {
    char pre[200];
    snprintf(pre, sizeof pre, "%s%s.", prefix, mod);
    memset(w, 0, sizeof *w), memset(g, 0, sizeof *g);
    bind(p, pre, "in_proj_weight", &w->in_proj_weight, &g->in_proj_weight);
    bind(p, pre, "in_proj_bias", &w->in_proj_bias, &g->in_proj_bias);
    bind(p, pre, "out_proj.weight", &w->out_proj_weight, &g->out_proj_weight);
    bind(p, pre, "out_proj.bias", &w->out_proj_bias, &g->out_proj_bias);
}

int cli_grad_layer(int argc, char **argv) {
    const char *cmd = "grad";
    const char *layer = NULL, *weights = NULL, *query = NULL, *memory = NULL, *dy_path = NULL;
    const char *out_dir = NULL, *prefix = "", *act = "relu", *heads_s = NULL, *eps_s = NULL;
    const char *nl_s = NULL;
    const char *mpath[4] = {NULL, NULL, NULL, NULL};
    int norm_first = 0, causal = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const char **dst = !strcmp(a, "--layer") ? &layer
                         : !strcmp(a, "--weights") ? &weights
                         : !strcmp(a, "--query") ? &query
                         : !strcmp(a, "--memory") ? &memory
                         : !strcmp(a, "--grad-out") ? &dy_path
                         : !strcmp(a, "--out-dir") ? &out_dir
                         : !strcmp(a, "--prefix") ? &prefix
                         : !strcmp(a, "--activation") ? &act
                         : !strcmp(a, "--heads") ? &heads_s
                         : !strcmp(a, "--eps") ? &eps_s
                         : !strcmp(a, "--num-layers") ? &nl_s
                         : !strcmp(a, "--attn-mask") ? &mpath[0]
                         : !strcmp(a, "--key-padding-mask") ? &mpath[1]
                         : !strcmp(a, "--memory-mask") ? &mpath[2]
                         : !strcmp(a, "--memory-key-padding-mask") ? &mpath[3]
                         : NULL;
        if (dst) {
            if (!v) {
                fprintf(stderr, "mha grad: %s needs a value\n", a);
                return CLI_BAD_INPUT;
            }
            *dst = v, i++;
        } else if (!strcmp(a, "--norm-first")) {
            norm_first = 1;
        } else if (!strcmp(a, "--causal")) {
            causal = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            return usage(stdout);
        } else {
            fprintf(stderr, "mha grad: unknown or incomplete option '%s' (see --help)\n", a);
            return CLI_BAD_INPUT;
        }
    }
    const int dec = layer && !strcmp(layer, "decoder");
    if (!layer || (!dec && strcmp(layer, "encoder"))) {
        fprintf(stderr, "mha grad: --layer must be encoder or decoder\n");
        return CLI_BAD_INPUT;
    }
    int64_t heads, num_layers = 0;
    if (!cli_parse_i64(heads_s, 1, INT64_MAX, &heads)) {
        fprintf(stderr, "mha grad: --heads wants a positive integer\n");
        return CLI_BAD_INPUT;
    }
    if (nl_s && !cli_parse_i64(nl_s, 1, MAXL, &num_layers)) {
        fprintf(stderr, "mha grad: --num-layers wants 1..%d\n", MAXL);
        return CLI_BAD_INPUT;
    }
    float eps = 1e-5f;
    if (eps_s && (!cli_parse_f32(eps_s, &eps) || !(eps > 0))) {
        fprintf(stderr, "mha grad: --eps wants a positive number\n");
        return CLI_BAD_INPUT;
    }
    if (!weights || !query || !dy_path || !out_dir || (dec && !memory) ||
        (!dec && (memory || mpath[2] || mpath[3]))) {
        fprintf(stderr, "mha grad: --layer %s needs --weights, --query, --grad-out and "
                        "--out-dir%s\n", layer, dec ? " and --memory" : " (and no --memory*)");
        return CLI_BAD_INPUT;
    }
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = heads;
    opt.norm_first = norm_first;
    opt.layer_norm_eps = eps;
    if (!strcmp(act, "relu")) opt.activation = MHA_ACT_RELU;
    else if (!strcmp(act, "gelu")) opt.activation = MHA_ACT_GELU;
    else if (!strcmp(act, "gelu_tanh")) opt.activation = MHA_ACT_GELU_TANH;
    else if (!strcmp(act, "silu")) opt.activation = MHA_ACT_SILU;
    else {
        fprintf(stderr, "mha grad: --activation must be relu, gelu, gelu_tanh or silu\n");
        return CLI_BAD_INPUT;
    }

    int rc = CLI_OK;
    mha_status st;
    params *p = calloc(1, sizeof *p);
    mha_tensor x = {0}, m = {0}, dy = {0}, y = {0}, dx = {0}, dm = {0}, mt[4];
    memset(mt, 0, sizeof mt);
    void *saved = NULL;
    mha_encoder_layer_weights *ew = NULL;
    mha_decoder_layer_weights *dw = NULL;
    mha_encoder_layer_grads *eg = NULL;
    mha_decoder_layer_grads *dg = NULL;
    if (!p)
        return cli_fail(cmd, MHA_ERR_NOMEM, NULL);
    if ((st = mha_safetensors_open(&p->st, weights))) {
        rc = cli_input_fail(cmd, "--weights", st);
        goto done;
    }
    if ((st = mha_npy_load(&x, query, MHA_F32))) {
        rc = cli_input_fail(cmd, "--query", st);
        goto done;
    }
    if (memory && (st = mha_npy_load(&m, memory, MHA_F32))) {
        rc = cli_input_fail(cmd, "--memory", st);
        goto done;
    }
    if ((st = mha_npy_load(&dy, dy_path, MHA_F32))) {
        rc = cli_input_fail(cmd, dy_path, st);
        goto done;
    }
    const mha_tensor *mp[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++) {
        mha_dtype fd;
        if (mpath[i] && (st = mha_npy_load_any(&mt[i], &fd, mpath[i], 1))) {
            rc = cli_input_fail(cmd, mpath[i], st);
            goto done;
        }
        mp[i] = mpath[i] ? &mt[i] : NULL;
    }
    mha_layer_masks masks = {mp[0], mp[1], causal, mp[2], mp[3]};
    const int64_t nl = num_layers ? num_layers : 1;
    ew = calloc((size_t)nl, sizeof *ew), dw = calloc((size_t)nl, sizeof *dw);
    eg = calloc((size_t)nl, sizeof *eg), dg = calloc((size_t)nl, sizeof *dg);
    const mha_tensor *nw = NULL, *nb = NULL;
    mha_tensor *dnw = NULL, *dnb = NULL;
    if (!ew || !dw || !eg || !dg) {
        rc = cli_fail(cmd, MHA_ERR_NOMEM, NULL);
        goto done;
    }
#define BIND(W, G, field, name) bind(p, lp, name, &(W).field, &(G).field)
    for (int64_t l = 0; l < nl; l++) {
        char lp[256];
        if (num_layers)
            snprintf(lp, sizeof lp, "%slayers.%lld.", prefix, (long long)l);
        else
            snprintf(lp, sizeof lp, "%s", prefix);
        if (dec) {
            bind_attn(p, lp, "self_attn", &dw[l].self_attn, &dg[l].self_attn);
            bind_attn(p, lp, "multihead_attn", &dw[l].multihead_attn, &dg[l].multihead_attn);
            BIND(dw[l], dg[l], linear1_weight, "linear1.weight");
            BIND(dw[l], dg[l], linear1_bias, "linear1.bias");
            BIND(dw[l], dg[l], linear2_weight, "linear2.weight");
            BIND(dw[l], dg[l], linear2_bias, "linear2.bias");
            BIND(dw[l], dg[l], norm1_weight, "norm1.weight"), BIND(dw[l], dg[l], norm1_bias, "norm1.bias");
            BIND(dw[l], dg[l], norm2_weight, "norm2.weight"), BIND(dw[l], dg[l], norm2_bias, "norm2.bias");
            BIND(dw[l], dg[l], norm3_weight, "norm3.weight"), BIND(dw[l], dg[l], norm3_bias, "norm3.bias");
        } else {
            bind_attn(p, lp, "self_attn", &ew[l].self_attn, &eg[l].self_attn);
            BIND(ew[l], eg[l], linear1_weight, "linear1.weight");
            BIND(ew[l], eg[l], linear1_bias, "linear1.bias");
            BIND(ew[l], eg[l], linear2_weight, "linear2.weight");
            BIND(ew[l], eg[l], linear2_bias, "linear2.bias");
            BIND(ew[l], eg[l], norm1_weight, "norm1.weight"), BIND(ew[l], eg[l], norm1_bias, "norm1.bias");
            BIND(ew[l], eg[l], norm2_weight, "norm2.weight"), BIND(ew[l], eg[l], norm2_bias, "norm2.bias");
        }
    }
#undef BIND
    if (num_layers) {
        bind(p, prefix, "norm.weight", &nw, &dnw);
        bind(p, prefix, "norm.bias", &nb, &dnb);
    }
    if (p->bad) {
        rc = cli_fail(cmd, MHA_ERR_FORMAT, weights);
        goto done;
    }
    if (x.ndim < 2 || x.ndim > 3) {
        fprintf(stderr, "mha grad: --query: want (B,L,E) or (L,E)\n");
        rc = CLI_BAD_INPUT;
        goto done;
    }
    const int64_t B = x.ndim == 3 ? x.shape[0] : 1, L = x.shape[x.ndim - 2],
                  E = x.shape[x.ndim - 1], S = dec ? m.shape[m.ndim - 2] : L;
    const mha_tensor *l1 = dec ? dw[0].linear1_weight : ew[0].linear1_weight;
    int64_t Fmax = 0;
    for (int64_t l = 0; l < nl; l++) {
        const mha_tensor *t = dec ? dw[l].linear1_weight : ew[l].linear1_weight;
        if (t && t->ndim == 2 && t->shape[0] > Fmax)
            Fmax = t->shape[0];
    }
    if (!l1 || l1->ndim != 2) {
        fprintf(stderr, "mha grad: %s: %slinear1.weight missing\n", weights, prefix);
        rc = CLI_BAD_INPUT;
        goto done;
    }
    size_t sb, wb;
    if ((st = mha_stack_saved_size(nl, B, L, S, E, heads, &sb)) ||
        (st = mha_stack_train_workspace_size(B, L, S, E, Fmax, heads, &wb))) {
        rc = cli_fail(cmd, st, "--heads");
        goto done;
    }
    saved = malloc(sb ? sb : 1);
    if (!saved || (st = mha_tensor_create(&y, MHA_F32, x.ndim, x.shape)) ||
        (st = mha_tensor_create(&dx, MHA_F32, x.ndim, x.shape)) ||
        (dec && (st = mha_tensor_create(&dm, MHA_F32, m.ndim, m.shape)))) {
        rc = cli_fail(cmd, saved ? st : MHA_ERR_NOMEM, NULL);
        goto done;
    }
    if (dy.ndim != x.ndim || memcmp(dy.shape, x.shape, sizeof(int64_t) * (size_t)x.ndim)) {
        fprintf(stderr, "mha grad: --grad-out: shape must be the output's, as --query\n");
        rc = CLI_BAD_INPUT;
        goto done;
    }
    /* a single layer is a stack of one without a final norm (same math) */
    mha_encoder_weights es = {nl, ew, nw || nb, nw, nb};
    mha_decoder_weights ds = {nl, dw, nw || nb, nw, nb};
    mha_encoder_grads egs = {eg, dnw, dnb};
    mha_decoder_grads dgs = {dg, dnw, dnb};
    st = dec ? mha_decoder_forward_train(&y, saved, sb, &x, &m, &ds, &masks, &opt, NULL, 0)
             : mha_encoder_forward_train(&y, saved, sb, &x, &es, &masks, &opt, NULL, 0);
    if (st == MHA_OK)
        st = dec ? mha_decoder_backward(&dx, &dm, &dgs, &dy, saved, sb, &x, &m, &ds, &masks, &opt,
                                        NULL, 0)
                 : mha_encoder_backward(&dx, &egs, &dy, saved, sb, &x, &es, &masks, &opt, NULL, 0);
    if (st) {
        rc = cli_fail(cmd, st, layer);
        goto done;
    }
    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "mha grad: cannot create %s: %s\n", out_dir, strerror(errno));
        rc = CLI_INTERNAL;
        goto done;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/grad_query.npy", out_dir);
    if ((st = mha_npy_save(&dx, path, MHA_F32))) {
        rc = cli_fail(cmd, st, path);
        goto done;
    }
    snprintf(path, sizeof path, "%s/grad_memory.npy", out_dir);
    if (dec && (st = mha_npy_save(&dm, path, MHA_F32))) {
        rc = cli_fail(cmd, st, path);
        goto done;
    }
    const char **names = malloc(sizeof *names * MAXP);
    const mha_tensor **gs = malloc(sizeof *gs * MAXP);
    for (int i = 0; names && gs && i < p->n; i++)
        names[i] = p->names[i], gs[i] = &p->g[i];
    snprintf(path, sizeof path, "%s/grad_weights.safetensors", out_dir);
    if (!names || !gs)
        rc = cli_fail(cmd, MHA_ERR_NOMEM, NULL);
    else if ((st = mha_safetensors_write(path, names, gs, p->n, NULL, NULL, 0)))
        rc = cli_fail(cmd, st, path);
    free(names), free(gs);
done:
    for (int i = 0; i < 4; i++)
        mha_tensor_free(&mt[i]);
    mha_tensor_free(&x), mha_tensor_free(&m), mha_tensor_free(&dy), mha_tensor_free(&y);
    mha_tensor_free(&dx), mha_tensor_free(&dm);
    for (int i = 0; i < p->n; i++)
        mha_tensor_free(&p->g[i]);
    mha_safetensors_free(p->st);
    free(p), free(saved), free(ew), free(dw), free(eg), free(dg);
    return rc;
}
