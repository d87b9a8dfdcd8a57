/* fuzz_grpc_message.c - libFuzzer target for the gRPC transport's message
 * decoding (server/grpc_codec.c): a ModelInferRequest unpacked by protobuf-c
 * and decoded into a struct kserve_request (raw and typed contents, BYTES
 * elements, parameters, outputs asked for), bound to a model configuration
 * and answered with an encoded ModelInferResponse (streamed or not); the
 * grpc.health.v1 request read without generated code; and the other
 * request messages the service unpacks.
 *
 * Input layout: one selector byte, then the message. Built by tools/fuzz.sh:
 */
// fuzz-sources: common/*.c config/model_*.c config/pbtxt.c server/kserve*.c server/shm.c kernels/plugin.c server/grpc_codec.c
// fuzz-corpus: tests/fuzz/corpus/grpc_message/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "server/grpc_impl.h"
#include "server/kserve.h"
#include "tests/fuzz/fuzz_kit.h"
#include "triton/grpc_service.pb-c.h"

static struct model_config g_cfg;
static struct model_config g_cfg_fixed;

static void exercise(struct kserve_request *r, struct model_config *c, int streaming) {
    struct tensor outs[2];
    char err[256];
    if (fuzz_bind(r, c, outs)) return;
    struct infer_result res = {.request = r, .config = c, .model_name = "fuzz", .model_version = "1", .outputs = outs};
    struct grpc_pool pool = {0};
    uint8_t *msg = NULL;
    size_t len = 0;
    if (grpc_infer_response_encode(&res, streaming, &pool, &msg, &len, err, sizeof err) == 0) {
        /* The frame's prefix says how long the message is. */
        if (len < 5 || ((size_t)msg[1] << 24 | (size_t)msg[2] << 16 | (size_t)msg[3] << 8 | msg[4]) != len - 5)
            abort();
        free(msg);
    }
    grpc_pool_free(&pool);
    fuzz_outputs_free(outs);
}

static void infer_request(const uint8_t *data, size_t size, int streaming) {
    Inference__ModelInferRequest *q = inference__model_infer_request__unpack(NULL, size, data);
    if (!q) return;
    char err[512];
    for (int k = 0; k < 2; k++) {
        struct kserve_request r;
        memset(&r, 0, sizeof r);
        err[0] = 0;
        int rc = grpc_infer_request_decode(&r, q, err, sizeof err);
        if (rc == 0) exercise(&r, k ? &g_cfg_fixed : &g_cfg, streaming);
        else if (rc == STATUS_INVALID && !err[0]) abort(); /* every refusal of bad input carries a message */
        kserve_request_clear(&r);
    }
    inference__model_infer_request__free_unpacked(q, NULL);
}

static void health_request(const uint8_t *data, size_t size) {
    const uint8_t *svc;
    size_t n;
    if (grpc_health_request_service(data, size, &svc, &n) == 0) {
        if (svc < data || svc + n > data + size) abort();
        char name[64];
        memcpy(name, svc, n < sizeof name ? n : sizeof name);
    }
}

/* The service's other requests: what their handlers read of them. */
static void other_request(const uint8_t *data, size_t size) {
    Inference__RepositoryModelLoadRequest *l = inference__repository_model_load_request__unpack(NULL, size, data);
    for (size_t i = 0; l && i < l->n_parameters; i++)
        if (l->parameters[i]->value && l->parameters[i]->key && strcmp(l->parameters[i]->key, "config") == 0 &&
            l->parameters[i]->value->parameter_choice_case ==
                INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_STRING_PARAM)
            (void)strlen(l->parameters[i]->value->string_param);
    if (l) inference__repository_model_load_request__free_unpacked(l, NULL);
    Inference__ModelStatisticsRequest *s = inference__model_statistics_request__unpack(NULL, size, data);
    if (s) inference__model_statistics_request__free_unpacked(s, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_cfg.name) {
        fuzz_config(&g_cfg, 1);
        fuzz_config(&g_cfg_fixed, 0);
    }
    if (size < 1) return 0;
    /* A private copy, so reads past the message are caught by ASan. */
    size_t len = size - 1;
    uint8_t *msg = malloc(len ? len : 1);
    memcpy(msg, data + 1, len);
    switch (data[0] & 3) {
    case 0: infer_request(msg, len, 0); break;
    case 3: infer_request(msg, len, 1); break;
    case 1: health_request(msg, len); break;
    default: other_request(msg, len); break;
    }
    free(msg);
    return 0;
}
