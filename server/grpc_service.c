/* grpc_service.c - inference.GRPCInferenceService's method table and its
 * read-only RPCs: health, metadata, configuration, statistics and the
 * repository index; and the shared-memory extension's RPCs (server/shm.h).
 *
 * Their answers are the JSON bodies HTTP serves (http_bodies.c,
 * model_config_to_json, repository_index) turned into the protobuf message
 * (grpc_json.c), and their errors carry the same messages. Inference is in
 * grpc_infer.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "server/grpc_impl.h"
#include "server/http_bodies.h"
#include "server/shm.h"
#include "triton/grpc_service.pb-c.h"

#define SERVICE "/inference.GRPCInferenceService/"

/* A request message that does not parse is the client's error. */
#define UNPACK(type, fn, st, msg, len)                                                                      \
    type *req = fn(NULL, len, msg);                                                                          \
    if (!req) {                                                                                              \
        grpc_stream_errorf(st, GRPC_INVALID_ARGUMENT, "the request is not a valid %s message", #type + 11); \
        return;                                                                                              \
    }

/* A model version in a request: "" is the highest loaded. -1 when it is not
 * a positive integer (the error is sent). */
static int64_t request_version(struct grpc_stream *st, const char *model, const char *v) {
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end || x < 1) {
        grpc_stream_errorf(st, GRPC_INVALID_ARGUMENT, "version '%.100s' of model '%.200s' is not a positive integer", v,
                           model);
        return -1;
    }
    return x;
}

static struct repo_version *acquire(struct grpc_stream *st, const char *model, const char *version) {
    int64_t v = request_version(st, model, version);
    if (v < 0) return NULL;
    char err[512];
    int status = 0;
    struct repo_version *rv = repository_acquire(grpc_stream_server(st)->repo, model, v, &status, err, sizeof err);
    if (!rv) grpc_stream_finish(st, grpc_code_of(status), err);
    return rv;
}

/* ==== health ============================================================= */

static void server_live(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__ServerLiveRequest, inference__server_live_request__unpack, st, msg, len);
    inference__server_live_request__free_unpacked(req, NULL);
    Inference__ServerLiveResponse res = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
    res.live = 1;
    grpc_stream_reply(st, &res.base);
}

static void server_ready(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__ServerReadyRequest, inference__server_ready_request__unpack, st, msg, len);
    inference__server_ready_request__free_unpacked(req, NULL);
    Inference__ServerReadyResponse res = INFERENCE__SERVER_READY_RESPONSE__INIT;
    res.ready = !http_server_draining(grpc_stream_server(st)->http);
    grpc_stream_reply(st, &res.base);
}

/* Triton answers ready = false, not an error, for a model it cannot serve. */
static void model_ready(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__ModelReadyRequest, inference__model_ready_request__unpack, st, msg, len);
    Inference__ModelReadyResponse res = INFERENCE__MODEL_READY_RESPONSE__INIT;
    int64_t v = request_version(st, req->name, req->version);
    if (v >= 0) {
        char err[512];
        int status;
        grpc_server_t *s = grpc_stream_server(st);
        struct repo_version *rv = repository_acquire(s->repo, req->name, v, &status, err, sizeof err);
        res.ready = rv && !http_server_draining(s->http);
        repository_release(rv);
        grpc_stream_reply(st, &res.base);
    }
    inference__model_ready_request__free_unpacked(req, NULL);
}

/* ==== metadata and configuration ========================================= */

static void server_metadata(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__ServerMetadataRequest, inference__server_metadata_request__unpack, st, msg, len);
    inference__server_metadata_request__free_unpacked(req, NULL);
    grpc_stream_reply_json(st, &inference__server_metadata_response__descriptor, http_body_server_metadata());
}

static void model_metadata(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__ModelMetadataRequest, inference__model_metadata_request__unpack, st, msg, len);
    struct repo_version *v = acquire(st, req->name, req->version);
    if (v)
        grpc_stream_reply_json(st, &inference__model_metadata_response__descriptor,
                               http_body_model_metadata(grpc_stream_server(st)->repo, v));
    repository_release(v);
    inference__model_metadata_request__free_unpacked(req, NULL);
}

static void model_config(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__ModelConfigRequest, inference__model_config_request__unpack, st, msg, len);
    struct repo_version *v = acquire(st, req->name, req->version);
    if (v) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "config", model_config_to_json(&v->config));
        grpc_stream_reply_json(st, &inference__model_config_response__descriptor, o);
    }
    repository_release(v);
    inference__model_config_request__free_unpacked(req, NULL);
}

/* ==== statistics and the repository ====================================== */

static void model_statistics(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__ModelStatisticsRequest, inference__model_statistics_request__unpack, st, msg, len);
    const char *model = req->name && *req->name ? req->name : NULL;
    int64_t v = model ? request_version(st, model, req->version) : 0;
    if (v >= 0) {
        char err[512];
        int status = 0;
        cJSON *o = http_body_stats(grpc_stream_server(st)->repo, model, v, &status, err, sizeof err);
        if (o) grpc_stream_reply_json(st, &inference__model_statistics_response__descriptor, o);
        else grpc_stream_finish(st, grpc_code_of(status), err);
    }
    inference__model_statistics_request__free_unpacked(req, NULL);
}

static void repository_index_rpc(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__RepositoryIndexRequest, inference__repository_index_request__unpack, st, msg, len);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "models", repository_index(grpc_stream_server(st)->repo, req->ready));
    grpc_stream_reply_json(st, &inference__repository_index_response__descriptor, o);
    inference__repository_index_request__free_unpacked(req, NULL);
}

/* ==== shared memory ====================================================== */

/* Triton's status array as the gRPC message's map: {"regions": {name: status}}. */
static void reply_shm_status(struct grpc_stream *st, const ProtobufCMessageDescriptor *d, cJSON *arr, int status,
                             const char *err) {
    if (!arr) {
        grpc_stream_finish(st, grpc_code_of(status), err);
        return;
    }
    cJSON *o = cJSON_CreateObject(), *regions = cJSON_AddObjectToObject(o, "regions");
    for (cJSON *r; regions && (r = cJSON_DetachItemFromArray(arr, 0)) != NULL;)
        cJSON_AddItemToObject(regions, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "name")), r);
    cJSON_Delete(arr);
    grpc_stream_reply_json(st, d, regions ? o : NULL);
    if (!regions) cJSON_Delete(o);
}

static void system_shm_status(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__SystemSharedMemoryStatusRequest, inference__system_shared_memory_status_request__unpack, st, msg,
           len);
    char err[512];
    int status = 0;
    cJSON *arr = shm_status_json(infer_core_shm(grpc_stream_server(st)->core), req->name, &status, err, sizeof err);
    reply_shm_status(st, &inference__system_shared_memory_status_response__descriptor, arr, status, err);
    inference__system_shared_memory_status_request__free_unpacked(req, NULL);
}

static void system_shm_register(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__SystemSharedMemoryRegisterRequest, inference__system_shared_memory_register_request__unpack, st,
           msg, len);
    char err[600];
    int rc = shm_register(infer_core_shm(grpc_stream_server(st)->core), req->name, req->key, req->offset,
                          req->byte_size, err, sizeof err);
    inference__system_shared_memory_register_request__free_unpacked(req, NULL);
    Inference__SystemSharedMemoryRegisterResponse res = INFERENCE__SYSTEM_SHARED_MEMORY_REGISTER_RESPONSE__INIT;
    if (rc) grpc_stream_finish(st, grpc_code_of(rc), err);
    else grpc_stream_reply(st, &res.base);
}

static void system_shm_unregister(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__SystemSharedMemoryUnregisterRequest, inference__system_shared_memory_unregister_request__unpack,
           st, msg, len);
    shm_registry_t *reg = infer_core_shm(grpc_stream_server(st)->core);
    if (req->name && *req->name) shm_unregister(reg, req->name);
    else shm_unregister_all(reg);
    inference__system_shared_memory_unregister_request__free_unpacked(req, NULL);
    Inference__SystemSharedMemoryUnregisterResponse res = INFERENCE__SYSTEM_SHARED_MEMORY_UNREGISTER_RESPONSE__INIT;
    grpc_stream_reply(st, &res.base);
}

static void cuda_shm_status(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__CudaSharedMemoryStatusRequest, inference__cuda_shared_memory_status_request__unpack, st, msg, len);
    char err[512];
    int status = 0;
    cJSON *arr = shm_cuda_status_json(infer_core_shm(grpc_stream_server(st)->core), req->name, &status, err,
                                      sizeof err);
    reply_shm_status(st, &inference__cuda_shared_memory_status_response__descriptor, arr, status, err);
    inference__cuda_shared_memory_status_request__free_unpacked(req, NULL);
}

/* raw_handle carries the cudaIpcMemHandle_t's bytes (tritonclient decodes
 * its base64 before sending). */
static void cuda_shm_register(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__CudaSharedMemoryRegisterRequest, inference__cuda_shared_memory_register_request__unpack, st, msg,
           len);
    char err[900];
    int rc = shm_cuda_register(infer_core_shm(grpc_stream_server(st)->core), req->name, req->raw_handle.data,
                               req->raw_handle.len, req->device_id, req->byte_size, err, sizeof err);
    inference__cuda_shared_memory_register_request__free_unpacked(req, NULL);
    Inference__CudaSharedMemoryRegisterResponse res = INFERENCE__CUDA_SHARED_MEMORY_REGISTER_RESPONSE__INIT;
    if (rc) grpc_stream_finish(st, grpc_code_of(rc), err);
    else grpc_stream_reply(st, &res.base);
}

static void cuda_shm_unregister(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__CudaSharedMemoryUnregisterRequest, inference__cuda_shared_memory_unregister_request__unpack, st,
           msg, len);
    shm_registry_t *reg = infer_core_shm(grpc_stream_server(st)->core);
    if (req->name && *req->name) shm_cuda_unregister(reg, req->name);
    else shm_cuda_unregister_all(reg);
    inference__cuda_shared_memory_unregister_request__free_unpacked(req, NULL);
    Inference__CudaSharedMemoryUnregisterResponse res = INFERENCE__CUDA_SHARED_MEMORY_UNREGISTER_RESPONSE__INIT;
    grpc_stream_reply(st, &res.base);
}

/* ==== the method table =================================================== */

static const struct grpc_method methods[] = {
    /* Inference first: it is most of the traffic. */
    {"ModelInfer", 0, grpc_model_infer},
    {"ModelStreamInfer", 1, grpc_model_stream_infer},
    {"ServerLive", 0, server_live},
    {"ServerReady", 0, server_ready},
    {"ModelReady", 0, model_ready},
    {"ServerMetadata", 0, server_metadata},
    {"ModelMetadata", 0, model_metadata},
    {"ModelConfig", 0, model_config},
    {"ModelStatistics", 0, model_statistics},
    {"RepositoryIndex", 0, repository_index_rpc},
    {"SystemSharedMemoryStatus", 0, system_shm_status},
    {"SystemSharedMemoryRegister", 0, system_shm_register},
    {"SystemSharedMemoryUnregister", 0, system_shm_unregister},
    {"CudaSharedMemoryStatus", 0, cuda_shm_status},
    {"CudaSharedMemoryRegister", 0, cuda_shm_register},
    {"CudaSharedMemoryUnregister", 0, cuda_shm_unregister},
};

const struct grpc_method *grpc_method_find(const char *path) {
    size_t n = strlen(SERVICE);
    if (strncmp(path, SERVICE, n) != 0) return NULL;
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strcmp(path + n, methods[i].name) == 0) return &methods[i];
    return NULL;
}
