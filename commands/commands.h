/* commands.h - entry points of kiln's subcommands; argv[0] is the command name. */
#ifndef KILN_COMMANDS_H
#define KILN_COMMANDS_H

#include "common/version.h"

int cmd_serve(int argc, char **argv);  /* commands/serve.c */
int cmd_run(int argc, char **argv);    /* commands/run.c */
int cmd_bench(int argc, char **argv);  /* commands/bench.c */
int cmd_doctor(int argc, char **argv); /* commands/doctor.c */
int cmd_tokenize(int argc, char **argv); /* commands/tokenize.c */

#endif
