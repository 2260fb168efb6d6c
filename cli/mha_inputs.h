/* mha_inputs.h - the nn.MultiheadAttention inputs of `mha forward`, parsed
 * from the command line and loaded from files; shared by `mha forward`,
 * `mha viz` and `mha grad`.
 *
 *   --weights W.safetensors   state_dict tensors: in_proj_weight (3E,E) or
 *                             q_proj_weight (E,E) k_proj_weight (E,kdim)
 *                             v_proj_weight (E,vdim); in_proj_bias (3E);
 *                             out_proj.weight (E,E); out_proj.bias (E);
 *                             bias_k, bias_v (1,1,E) (add_bias_kv)
 *   --prefix P                names are P + the above (e.g. "self_attn.")
 *   --heads H                 H divides E
 *   --query Q.npy             (B,L,E) or unbatched (L,E)
 *   --key K.npy --value V.npy (B,S,kdim) (B,S,vdim); default K = V = Q
 *   --key-padding-mask M.npy  (B,S) or (S); bool/int True = masked, float added
 *   --attn-mask M.npy         (L,S) or (B*H,L,S) [(H,L,S) unbatched]; same dtypes
 *   --causal                  top-left tril(ones(L,S)), combined with the masks
 *   --add-zero-attn           append a zero key/value
 *   --masked-rows zero|nan    output of fully masked query rows (default zero)
 *
 * Usage:
 *   cli_mha_inputs in; cli_mha_inputs_init(&in);
 *   for (i = 1; i < argc; i++) { int r = cli_mha_inputs_parse(&in, "forward", argc, argv, &i);
 *       if (r < 0) return CLI_BAD_INPUT; if (r == 0) { ...own options... } }
 *   rc = cli_mha_inputs_load(&in, "forward");  // then in.query, in.key, in.value, in.w, in.opt
 *   ... mha_multihead_forward(&out, &in.query, in.key_ptr, in.value_ptr, &in.w, &in.opt) ...
 *   cli_mha_inputs_free(&in);
 */
#ifndef MHA_CLI_MHA_INPUTS_H
#define MHA_CLI_MHA_INPUTS_H

#include "cli.h"

typedef struct cli_mha_inputs {
    /* from the command line (pointers into argv) */
    const char *weights_path, *prefix;
    const char *query_path, *key_path, *value_path;
    const char *key_padding_mask_path, *attn_mask_path;
    int64_t heads;                 /* 0 until --heads                          */
    int causal, add_zero_attn;
    mha_masked_rows masked_rows;

    /* loaded by cli_mha_inputs_load */
    mha_safetensors *st;           /* the weights file (owns the weight views) */
    mha_tensor query;              /* (B,L,E) or (L,E), owned                   */
    mha_tensor key, value;         /* owned when given, else data NULL          */
    const mha_tensor *key_ptr;     /* &key, or &query when --key is absent      */
    const mha_tensor *value_ptr;   /* &value, or &query                         */
    mha_tensor key_padding_mask;   /* owned, data NULL when absent              */
    mha_tensor attn_mask;          /* owned, data NULL when absent              */
    mha_tensor wt[9];              /* weight views, see w                       */
    mha_multihead_weights w;       /* points into wt                            */
    mha_multihead_options opt;     /* heads, masks, causal, zero attn, rows     */
    mha_dtype query_file_dtype;    /* what Q.npy held (mha_npy_load_any)        */
    int batched;                   /* query was (B,L,E)                         */
    int64_t B, L, S, E;            /* B = 1 when unbatched                      */
    int64_t S_extra;               /* S' = S + S_extra: bias_kv + zero attn     */
    int64_t kdim, vdim;
} cli_mha_inputs;

void cli_mha_inputs_init(cli_mha_inputs *in);

/* If argv[*i] is one of --weights --heads --query --key --value --prefix
 * --key-padding-mask --attn-mask --causal --add-zero-attn --masked-rows,
 * consume it (and its value, advancing *i) and return 1; return 0 if not
 * one of them; on a bad value print "mha CMD: ..." and return -1. */
int cli_mha_inputs_parse(cli_mha_inputs *in, const char *cmd, int argc, char **argv, int *i);

/* Loads files, checks presence of required options; prints errors naming
 * the file and field; returns CLI_OK / CLI_BAD_INPUT / CLI_INTERNAL. */
int cli_mha_inputs_load(cli_mha_inputs *in, const char *cmd);

void cli_mha_inputs_free(cli_mha_inputs *in);

/* The option lines of the help text above, for the commands' --help. */
extern const char cli_mha_inputs_help[];

/* Prints "mha CMD: OPTION: msg" for a failed load and returns the exit code
 * (CLI_INTERNAL for out of memory, CLI_BAD_INPUT otherwise: an unreadable
 * input file is the user's input). */
int cli_input_fail(const char *cmd, const char *option, mha_status st);

#endif
