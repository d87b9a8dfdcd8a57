/* fuzz_kit.h - what the fuzz targets of the request codecs share: the
 * model configuration they bind requests to, and outputs shaped as an
 * engine would give them for a bound request. Header-only: each target is
 * one translation unit (tools/fuzz.sh). */
#ifndef KILN_FUZZ_KIT_H
#define KILN_FUZZ_KIT_H

#include <stdlib.h>
#include <string.h>

#include "common/tensor.h"
#include "config/model_config.h"
#include "server/kserve.h"
#include "common/model_io.h"

/* x: FP32 [N,4]; s: BYTES [N,2]; outputs probs FP32 [N,3] (labelled a, b,
 * c), label INT64 [N]. Without batching N is 2. */
static void fuzz_config(struct model_config *c, int batching) {
    model_config_init(c, "fuzz");
    struct model_io ins[2] = {{.name = "x", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 4}},
                              {.name = "s", .dtype = DT_STRING, .ndim = 2, .dims = {-1, 2}}};
    struct model_io outs[2] = {{.name = "probs", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 3}},
                               {.name = "label", .dtype = DT_INT64, .ndim = 1, .dims = {-1}}};
    if (!batching) {
        ins[0].dims[0] = ins[1].dims[0] = outs[0].dims[0] = outs[1].dims[0] = 2;
        c->max_batch_size_set = 1;
    }
    char err[256];
    if (model_config_complete(c, ins, 2, outs, 2, err, sizeof err)) abort();
    static char *labels[] = {"a", "b", "c"};
    c->outputs[0].labels = malloc(sizeof labels);
    for (int i = 0; i < 3; i++) c->outputs[0].labels[i] = strdup(labels[i]);
    c->outputs[0].nlabels = 3;
}

/* The outputs for a request of rows rows bound to c: owned blocks, freed by fuzz_outputs_free. */
static void fuzz_outputs(struct tensor outs[2], const struct model_config *c, int64_t rows) {
    memset(outs, 0, 2 * sizeof *outs);
    int b = c->max_batch_size > 0;
    outs[0].dtype = DT_FP32;
    outs[0].ndim = 1 + b;
    outs[0].dims[0] = b ? rows : 3;
    if (b) outs[0].dims[1] = 3;
    outs[1].dtype = DT_INT64;
    outs[1].ndim = 1;
    outs[1].dims[0] = b ? rows : 2;
    size_t n0 = (size_t)tensor_numel(&outs[0]), n1 = (size_t)tensor_numel(&outs[1]);
    outs[0].data = calloc(n0 + 1, sizeof(float));
    outs[1].data = calloc(n1 + 1, sizeof(int64_t));
    for (size_t i = 0; i < n0; i++) ((float *)outs[0].data)[i] = (float)i * 0.25f - 1.0f;
}

/* Binds r to c and makes its outputs: 0, or -1 when r does not bind. */
static int fuzz_bind(struct kserve_request *r, const struct model_config *c, struct tensor outs[2]) {
    struct tensor ordered[2];
    int64_t rows = 0;
    char err[256];
    if (kserve_request_bind(r, c, ordered, &rows, err, sizeof err)) return -1;
    fuzz_outputs(outs, c, rows);
    return 0;
}

static void fuzz_outputs_free(struct tensor outs[2]) {
    free(outs[0].data);
    free(outs[1].data);
}

#endif
