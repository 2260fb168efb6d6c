/* forward.c - `mha forward` (being built). */
#include "cli.h"

#include <stdio.h>

int cli_forward(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "mha forward: not available in this build yet\n");
    return CLI_INTERNAL;
}
