/* viz.c - `mha viz` (being built). */
#include "cli.h"

#include <stdio.h>

int cli_viz(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "mha viz: not available in this build yet\n");
    return CLI_INTERNAL;
}
