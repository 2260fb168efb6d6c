/* attention.c - `mha attention` (being built). */
#include "cli.h"

#include <stdio.h>

int cli_attention(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "mha attention: not available in this build yet\n");
    return CLI_INTERNAL;
}
