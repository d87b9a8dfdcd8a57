/* Placeholder until this command lands. */
#include <stdio.h>

#include "server/commands.h"

int cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kiln serve: not available in this build\n");
    return 2;
}
