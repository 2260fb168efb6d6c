/* main.c - `mha` entry point: dispatches to a subcommand. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *summary;
} commands[] = {
    {"demo", cli_demo, "walk the seeds' multi-head attention example with shapes"},
    {"forward", cli_forward, "run nn.MultiheadAttention (or a Transformer layer) on .npy inputs"},
    {"attention", cli_attention, "scaled dot-product attention on .npy inputs"},
    {"bench", cli_bench, "time the attention kernels and MHA, validated first"},
    {"viz", cli_viz, "render attention maps as SVG and PNG"},
    {"grad", cli_grad, "gradients of nn.MultiheadAttention for an upstream gradient"},
    {"train", cli_train, "train a small Transformer on a digit task (AdamW, checkpoints)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: mha <command> [options]   (mha <command> --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n  --version  print the version\n");
}

int cli_fail(const char *cmd, mha_status st, const char *context) {
    fprintf(stderr, "mha %s: %s%s%s\n", cmd, context ? context : "", context ? ": " : "",
            mha_last_error()[0] ? mha_last_error() : mha_status_string(st));
    return (st == MHA_ERR_NOMEM || st == MHA_ERR_IO) ? CLI_INTERNAL : CLI_BAD_INPUT;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_BAD_INPUT;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("mha %s\n", mha_version());
        return CLI_OK;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return CLI_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            /* an unknown MHA_KERNEL/MHA_GEMM value: said once, exit 2 */
            mha_status env = mha_runtime_check();
            if (env != MHA_OK)
                return cli_fail(argv[1], env, NULL);
            return commands[i].run(argc - 1, argv + 1);
        }
    fprintf(stderr, "mha: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return CLI_BAD_INPUT;
}
