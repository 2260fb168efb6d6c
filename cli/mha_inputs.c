/* mha_inputs.c - parsing and loading the nn.MultiheadAttention inputs of
 * `mha forward` (and `mha viz`, `mha grad`).  Parsing and file loading only:
 * shapes beyond rank are checked by mha_multihead_forward, which names the
 * offending field. */
#include "mha_inputs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cli_mha_inputs_help[] =
    "  --weights W.safetensors  nn.MultiheadAttention state_dict: in_proj_weight or\n"
    "                           q_proj_weight/k_proj_weight/v_proj_weight, in_proj_bias,\n"
    "                           out_proj.weight, out_proj.bias, bias_k/bias_v (optional)\n"
    "  --prefix P               tensor names start with P (e.g. self_attn.)\n"
    "  --heads H                number of heads (divides E)\n"
    "  --query Q.npy            (B,L,E), or (L,E) unbatched\n"
    "  --key K.npy --value V.npy  (B,S,kdim) (B,S,vdim); default key = value = query\n"
    "  --key-padding-mask M.npy (B,S) or (S): bool/int True = masked, float added\n"
    "  --attn-mask M.npy        (L,S) or (B*H,L,S), unbatched (H,L,S): same dtypes\n"
    "  --causal                 also mask j > i (top-left tril(ones(L,S)))\n"
    "  --add-zero-attn          append a zero key and value\n"
    "  --masked-rows zero|nan   output of fully masked query rows (default zero)\n";

void cli_mha_inputs_init(cli_mha_inputs *in) {
    memset(in, 0, sizeof *in);
    in->prefix = "";
    in->masked_rows = MHA_MASKED_ROWS_ZERO;
    mha_multihead_options_init(&in->opt);
}

int cli_mha_inputs_parse(cli_mha_inputs *in, const char *cmd, int argc, char **argv, int *i) {
    static const char *valued[] = {"--weights", "--heads", "--query", "--key", "--value",
                                   "--prefix", "--key-padding-mask", "--attn-mask",
                                   "--masked-rows"};
    const char *a = argv[*i];
    if (!strcmp(a, "--causal")) {
        in->causal = 1;
        return 1;
    }
    if (!strcmp(a, "--add-zero-attn")) {
        in->add_zero_attn = 1;
        return 1;
    }
    size_t k = 0, nv = sizeof valued / sizeof *valued;
    while (k < nv && strcmp(a, valued[k]))
        k++;
    if (k == nv)
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "mha %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    switch (k) {
    case 0: in->weights_path = v; break;
    case 1: {
        int64_t h;
        if (!cli_parse_i64(v, 1, INT64_MAX, &h)) {
            fprintf(stderr, "mha %s: --heads: '%s' is not a positive integer\n", cmd, v);
            return -1;
        }
        in->heads = h;
        break;
    }
    case 2: in->query_path = v; break;
    case 3: in->key_path = v; break;
    case 4: in->value_path = v; break;
    case 5: in->prefix = v; break;
    case 6: in->key_padding_mask_path = v; break;
    case 7: in->attn_mask_path = v; break;
    case 8:
        if (!strcmp(v, "zero"))
            in->masked_rows = MHA_MASKED_ROWS_ZERO;
        else if (!strcmp(v, "nan"))
            in->masked_rows = MHA_MASKED_ROWS_NAN;
        else {
            fprintf(stderr, "mha %s: --masked-rows: '%s' is not zero or nan\n", cmd, v);
            return -1;
        }
        break;
    }
    return 1;
}

int cli_input_fail(const char *cmd, const char *option, mha_status st) {
    fprintf(stderr, "mha %s: %s: %s\n", cmd, option,
            mha_last_error()[0] ? mha_last_error() : mha_status_string(st));
    return st == MHA_ERR_NOMEM ? CLI_INTERNAL : CLI_BAD_INPUT;
}

/* Loads a float input; ints are refused (they are not activations). */
static int load_float(const char *cmd, const char *option, const char *path, mha_tensor *t,
                      mha_dtype *file_dtype) {
    mha_dtype fd;
    mha_status st = mha_npy_load_any(t, &fd, path, 0);
    if (st != MHA_OK)
        return cli_input_fail(cmd, option, st);
    if (t->dtype != MHA_F32) {
        fprintf(stderr, "mha %s: %s: %s: integer or bool data, want float\n", cmd, option, path);
        mha_tensor_free(t);
        return CLI_BAD_INPUT;
    }
    if (file_dtype)
        *file_dtype = fd;
    return CLI_OK;
}

/* Looks up prefix+name; absent is fine unless required. */
static int load_weight(cli_mha_inputs *in, const char *cmd, const char *name, int slot,
                       int required, const mha_tensor **dst) {
    char full[512];
    snprintf(full, sizeof full, "%s%s", in->prefix, name);
    *dst = NULL;
    if (mha_safetensors_find(in->st, full) < 0) {
        if (!required)
            return CLI_OK;
        fprintf(stderr, "mha %s: --weights: %s: no tensor named '%s'\n", cmd, in->weights_path,
                full);
        return CLI_BAD_INPUT;
    }
    mha_status st = mha_safetensors_view_f32(in->st, full, &in->wt[slot]);
    if (st != MHA_OK)
        return cli_input_fail(cmd, "--weights", st);
    *dst = &in->wt[slot];
    return CLI_OK;
}

int cli_mha_inputs_load(cli_mha_inputs *in, const char *cmd) {
    const char *missing = !in->weights_path ? "--weights"
                          : !in->heads      ? "--heads"
                          : !in->query_path ? "--query"
                                            : NULL;
    if (missing) {
        fprintf(stderr, "mha %s: %s is required (see mha %s --help)\n", cmd, missing, cmd);
        return CLI_BAD_INPUT;
    }
    if (!in->key_path != !in->value_path) {
        fprintf(stderr, "mha %s: --key and --value go together\n", cmd);
        return CLI_BAD_INPUT;
    }
    int rc;
    mha_status st;
    if ((rc = load_float(cmd, "--query", in->query_path, &in->query, &in->query_file_dtype)))
        return rc;
    if (in->query.ndim != 2 && in->query.ndim != 3) {
        fprintf(stderr, "mha %s: --query: %s: %d dimensions, want (B,L,E) or (L,E)\n", cmd,
                in->query_path, in->query.ndim);
        return CLI_BAD_INPUT;
    }
    in->batched = in->query.ndim == 3;
    in->key_ptr = in->value_ptr = &in->query;
    if (in->key_path) {
        if ((rc = load_float(cmd, "--key", in->key_path, &in->key, NULL)) ||
            (rc = load_float(cmd, "--value", in->value_path, &in->value, NULL)))
            return rc;
        in->key_ptr = &in->key;
        in->value_ptr = &in->value;
        const char *bad = in->key.ndim != in->query.ndim     ? "--key"
                          : in->value.ndim != in->query.ndim ? "--value"
                                                             : NULL;
        if (bad) {
            fprintf(stderr, "mha %s: %s: %s: %d dimensions but the query has %d (batched and "
                    "unbatched inputs cannot be mixed)\n",
                    cmd, bad, bad[2] == 'k' ? in->key_path : in->value_path,
                    (bad[2] == 'k' ? in->key : in->value).ndim, in->query.ndim);
            return CLI_BAD_INPUT;
        }
    }
    int b = in->batched;
    in->B = b ? in->query.shape[0] : 1;
    in->L = in->query.shape[b];
    in->E = in->query.shape[b + 1];
    in->S = in->key_ptr->shape[b];
    in->kdim = in->key_ptr->shape[b + 1];
    in->vdim = in->value_ptr->shape[b + 1];
    if (in->heads > in->E || in->E % in->heads != 0) { /* before any buffer is sized by it */
        fprintf(stderr, "mha %s: --heads: %lld does not divide the query's embedding width %lld\n",
                cmd, (long long)in->heads, (long long)in->E);
        return CLI_BAD_INPUT;
    }

    if (in->key_padding_mask_path) {
        st = mha_npy_load_any(&in->key_padding_mask, NULL, in->key_padding_mask_path, 1);
        if (st != MHA_OK)
            return cli_input_fail(cmd, "--key-padding-mask", st);
        in->opt.key_padding_mask = &in->key_padding_mask;
    }
    if (in->attn_mask_path) {
        st = mha_npy_load_any(&in->attn_mask, NULL, in->attn_mask_path, 1);
        if (st != MHA_OK)
            return cli_input_fail(cmd, "--attn-mask", st);
        in->opt.attn_mask = &in->attn_mask;
    }

    st = mha_safetensors_open(&in->st, in->weights_path);
    if (st != MHA_OK)
        return cli_input_fail(cmd, "--weights", st);
    mha_multihead_weights *w = &in->w;
    memset(w, 0, sizeof *w);
    int packed = 0;
    {
        char full[512];
        snprintf(full, sizeof full, "%sin_proj_weight", in->prefix);
        packed = mha_safetensors_find(in->st, full) >= 0;
        char sep[512];
        snprintf(sep, sizeof sep, "%sq_proj_weight", in->prefix);
        if (!packed && mha_safetensors_find(in->st, sep) < 0) {
            fprintf(stderr, "mha %s: --weights: %s: no tensor named '%s' nor '%s' (wrong "
                    "--prefix?)\n", cmd, in->weights_path, full, sep);
            return CLI_BAD_INPUT;
        }
    }
    if ((rc = load_weight(in, cmd, "in_proj_weight", 0, packed, &w->in_proj_weight)) ||
        (rc = load_weight(in, cmd, "q_proj_weight", 1, !packed, &w->q_proj_weight)) ||
        (rc = load_weight(in, cmd, "k_proj_weight", 2, !packed, &w->k_proj_weight)) ||
        (rc = load_weight(in, cmd, "v_proj_weight", 3, !packed, &w->v_proj_weight)) ||
        (rc = load_weight(in, cmd, "in_proj_bias", 4, 0, &w->in_proj_bias)) ||
        (rc = load_weight(in, cmd, "out_proj.weight", 5, 1, &w->out_proj_weight)) ||
        (rc = load_weight(in, cmd, "out_proj.bias", 6, 0, &w->out_proj_bias)) ||
        (rc = load_weight(in, cmd, "bias_k", 7, 0, &w->bias_k)) ||
        (rc = load_weight(in, cmd, "bias_v", 8, 0, &w->bias_v)))
        return rc;
    if (packed) /* PyTorch leaves the separate weights unregistered then; ignore strays */
        w->q_proj_weight = w->k_proj_weight = w->v_proj_weight = NULL;
    if (!w->bias_k != !w->bias_v) {
        fprintf(stderr, "mha %s: --weights: %s: %sbias_k and %sbias_v go together "
                "(add_bias_kv); only %s is present\n",
                cmd, in->weights_path, in->prefix, in->prefix, w->bias_k ? "bias_k" : "bias_v");
        return CLI_BAD_INPUT;
    }
    in->S_extra = (w->bias_k ? 1 : 0) + (in->add_zero_attn ? 1 : 0);

    in->opt.num_heads = in->heads;
    in->opt.add_zero_attn = in->add_zero_attn;
    in->opt.causal = in->causal;
    in->opt.masked_rows = in->masked_rows;
    return CLI_OK;
}

void cli_mha_inputs_free(cli_mha_inputs *in) {
    mha_tensor_free(&in->query);
    mha_tensor_free(&in->key);
    mha_tensor_free(&in->value);
    mha_tensor_free(&in->key_padding_mask);
    mha_tensor_free(&in->attn_mask);
    mha_safetensors_free(in->st); /* the weight views die with it */
    in->st = NULL;
    memset(in->wt, 0, sizeof in->wt);
}
