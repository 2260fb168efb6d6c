/* main.c - `mha` entry point: dispatches to a subcommand. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

/* `mha ring` (cli/mpi/ring.c, the MPI build only; issue 18). */
#ifdef MHA_HAVE_MPI
int cli_ring(int argc, char **argv);
#else
static int cli_ring(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "mha ring: needs the MPI build (install libopenmpi-dev and openmpi-bin, "
                    "then rebuild: make)\n");
    return CLI_BAD_INPUT;
}
#endif

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
    {"tokenize", cli_tokenize, "WordPiece ids of texts, as the model's tokenizer.json gives them"},
    {"embed", cli_embed, "sentence embeddings with all-MiniLM-L6-v2 (or another BERT model)"},
    {"search", cli_search, "the lines of a file most similar to a query (sentence embeddings)"},
    {"ring", cli_ring, "ring attention across MPI ranks (mpirun -np P mha ring), validated"},
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
