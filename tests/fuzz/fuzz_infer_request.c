/* fuzz_infer_request.c - libFuzzer target for the KServe v2 request codec:
 * the Inference-Header-Content-Length header, the JSON header and the binary
 * tensor payloads, then binding to a model configuration and encoding a
 * response from outputs shaped like the request's.
 *
 * Input layout: the header value up to the first '\n' (empty = header absent),
 * then the body. Built by tools/fuzz.sh:
 */
// fuzz-sources: common/*.c config/model_config.c server/kserve.c
// fuzz-corpus: tests/fuzz/corpus/infer_request/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "config/model_config.h"
#include "models/model.h"
#include "server/kserve.h"

static struct model_config g_cfg;
static struct model_config g_cfg_fixed;

static void make_config(struct model_config *c, int batching) {
    model_config_init(c, "fuzz");
    /* x: FP32 [N,4]; s: BYTES [N,2]; outputs probs FP32 [N,3], label INT64 [N]. */
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

static void exercise(struct kserve_request *r, struct model_config *c) {
    struct tensor ordered[2];
    int64_t rows = 0;
    char err[256];
    if (kserve_request_bind(r, c, ordered, &rows, err, sizeof err)) return;
    /* Outputs as an engine would give them. */
    struct tensor outs[2];
    memset(outs, 0, sizeof outs);
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
    struct kserve_buf body = {0};
    size_t json_len = 0;
    if (kserve_response_encode(r, c, "fuzz", "1", outs, &body, &json_len, err, sizeof err) == 0) {
        if (json_len > body.len) abort();
    }
    kserve_buf_free(&body);
    free(outs[0].data);
    free(outs[1].data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_cfg.name) {
        make_config(&g_cfg, 1);
        make_config(&g_cfg_fixed, 0);
    }
    const uint8_t *nl = memchr(data, '\n', size < 64 ? size : 64);
    if (!nl) return 0;
    char hv[72];
    size_t hl = (size_t)(nl - data);
    memcpy(hv, data, hl);
    hv[hl] = 0;
    const uint8_t *body = nl + 1;
    size_t len = size - hl - 1;
    int64_t header_len = -1;
    char err[256];
    if (hl && kserve_parse_header_length(hv, &header_len, err, sizeof err)) return 0;
    /* A private copy, so reads past the body are caught by ASan. */
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, body, len);
    struct kserve_request r;
    err[0] = 0;
    int rc = kserve_request_parse(&r, copy, len, header_len, err, sizeof err);
    if (rc == 0) {
        exercise(&r, &g_cfg);
        exercise(&r, &g_cfg_fixed);
        kserve_request_clear(&r);
    } else if (rc == STATUS_INVALID && !err[0]) {
        abort(); /* every refusal of bad input carries a message */
    }
    free(copy);
    return 0;
}
