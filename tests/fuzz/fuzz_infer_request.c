/* fuzz_infer_request.c - libFuzzer target for the KServe v2 request codec:
 * the Inference-Header-Content-Length header, the JSON header and the binary
 * tensor payloads, then binding to a model configuration and encoding a
 * response from outputs shaped like the request's.
 *
 * Input layout: the header value up to the first '\n' (empty = header absent),
 * then the body. Built by tools/fuzz.sh:
 */
// fuzz-sources: common/*.c config/model_*.c config/pbtxt.c server/kserve*.c server/shm.c kernels/plugin.c
// fuzz-corpus: tests/fuzz/corpus/infer_request/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "config/model_config.h"
#include "models/model.h"
#include "server/kserve.h"
#include "tests/fuzz/fuzz_kit.h"

static struct model_config g_cfg;
static struct model_config g_cfg_fixed;

static void exercise(struct kserve_request *r, struct model_config *c) {
    struct tensor outs[2];
    char err[256];
    if (fuzz_bind(r, c, outs)) return;
    struct buf body = {0};
    size_t json_len = 0;
    if (kserve_response_encode(r, c, "fuzz", "1", outs, &body, &json_len, err, sizeof err) == 0) {
        if (json_len > body.len) abort();
    }
    buf_free(&body);
    fuzz_outputs_free(outs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_cfg.name) {
        fuzz_config(&g_cfg, 1);
        fuzz_config(&g_cfg_fixed, 0);
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
