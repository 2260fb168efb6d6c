/* bench.c - `mha bench` (being built). */
#include "cli.h"

#include <stdio.h>

int cli_bench(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "mha bench: not available in this build yet\n");
    return CLI_INTERNAL;
}
