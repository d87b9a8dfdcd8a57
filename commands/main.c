/* main.c - kiln's subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln <command> [options]\n"
            "\n"
            "commands:\n"
            "  serve    serve a model repository over HTTP (KServe v2 / Open Inference Protocol)\n"
            "  run      run an ONNX model offline and print its outputs\n"
            "  bench    load-test a KServe v2 server against a latency budget\n"
            "  doctor   check the GPU environment (driver, CUDA, cuDNN, cuBLAS, self-tests)\n"
            "  tokenize encode lines of text with a Hugging Face tokenizer.json\n"
            "\n"
            "`kiln <command> --help` describes each command.\n");
}

/* OpenMP's worker threads (oneDNN and the CPU kernels) wait between
 * parallel regions. libgomp's default, spinning for milliseconds after each
 * region, takes the cores that other threads (I/O, other instances, the load
 * generator) need: on a 2-core machine a ResNet-50 run with 2 threads was
 * 5-25x slower spinning than sleeping. Sleeping at once costs a wake-up per
 * region instead, tens of microseconds, as much as a depthwise CNN's whole
 * convolution at batch 1. So kiln has the workers spin a while, then sleep:
 * GOMP_SPINCOUNT 20000 (about a millisecond where a pause takes 140 cycles,
 * less elsewhere), which covers the gap between one parallel step and the
 * next across the single-thread steps between them. 2 threads, 2 cores, vs
 * 1000 spins: efficientnet_b0 9.5 -> 5.6 ms, mobilenet_v3_large 3.75 -> 2.7;
 * digits at concurrency 64 over HTTP unchanged (its steps run on one thread,
 * the workers never wake), BERT batches of mixed lengths 3-5% more infer/s.
 * The policy is ACTIVE because libgomp caps the spin, once it manages more
 * threads than there are cores (two models with 2-thread instances on 2
 * cores), at 1000 under ACTIVE but at 0 under PASSIVE: where instances share
 * the cores, workers that spin would take them from each other. libgomp
 * reads these variables once, when it is loaded, so kiln sets them by
 * running itself again. An explicit OMP_WAIT_POLICY or GOMP_SPINCOUNT wins. */
static void default_omp_wait(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    setenv("OMP_WAIT_POLICY", "ACTIVE", 1);
    setenv("GOMP_SPINCOUNT", "20000", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with libgomp's defaults. */
}

int main(int argc, char **argv) {
    default_omp_wait(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "serve") == 0) return cmd_serve(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0) return cmd_run(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "doctor") == 0) return cmd_doctor(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenize") == 0) return cmd_tokenize(argc - 1, argv + 1);
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
