/* main.c - kiln's subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln <command> [options]\n"
            "\n"
            "commands:\n"
            "  serve    serve a model repository over HTTP (KServe v2 / Open Inference Protocol)\n"
            "  run      run an ONNX model offline and print its outputs\n"
            "  bench    load-test a KServe v2 server against a latency budget\n"
            "  doctor   check the GPU environment (driver, CUDA, cuDNN, cuBLAS, self-tests)\n"
            "\n"
            "`kiln <command> --help` describes each command.\n");
}

/* OpenMP's worker threads (oneDNN and the CPU kernels) spin after every
 * parallel region by default, taking the cores that other threads (I/O,
 * other instances, the load generator) need: on a 2-core machine a ResNet-50
 * run with 2 threads was 5-25x slower spinning than sleeping. libgomp reads
 * OMP_WAIT_POLICY once, when it is loaded, so kiln defaults it to passive by
 * running itself again with it set. An explicit OMP_WAIT_POLICY wins. */
static void default_omp_passive(char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the default policy. */
}

int main(int argc, char **argv) {
    default_omp_passive(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "serve") == 0) return cmd_serve(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0) return cmd_run(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "doctor") == 0) return cmd_doctor(argc - 1, argv + 1);
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("kiln %s\n", KILN_VERSION);
        return 0;
    }
    fprintf(stderr, "kiln: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
