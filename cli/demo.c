/* demo.c - `mha demo` (being built). */
#include "cli.h"

#include <stdio.h>

int cli_demo(int argc, char **argv) {
    (void)argc, (void)argv;
    printf("mha demo\n");
    return CLI_OK;
}
