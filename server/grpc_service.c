/* grpc_service.c - the method table of inference.GRPCInferenceService (and
 * of grpc.health.v1.Health) and the RPCs other than inference: health,
 * metadata, configuration, statistics, the repository index, load and
 * unload, and the shared-memory extension's RPCs (server/shm.h).
 *
 * Their answers are the JSON bodies HTTP serves (http_bodies.c,
 * model_config_to_json, repository_index) turned into the protobuf message
 * (grpc_json.c), and their errors carry the same messages. Inference is in
 * grpc_infer.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/log.h"
#include "common/status.h"
#include "server/access.h"
#include "server/grpc_impl.h"
#include "server/http_bodies.h"
#include "server/model_control.h"
#include "server/shm.h"
#include "server/upload.h"
#include "triton/grpc_service.pb-c.h"

#define SERVICE "/inference.GRPCInferenceService/"
#define HEALTH "/grpc.health.v1.Health/"

/* A request message that does not parse is the client's error; so is one
 * whose string fields hold a NUL, which protobuf-c would read up to it
 * (grpc_strings_nul): "tiny\0x" must not name model tiny. */
#define UNPACK(type, fn, st, msg, len)                                                                      \
    type *req = fn(NULL, len, msg);                                                                          \
    if (!req) {                                                                                              \
        grpc_stream_errorf(st, STATUS_INVALID, "the request is not a valid %s message", #type + 11);         \
        return;                                                                                              \
    }                                                                                                        \
    const char *nul_in_ = grpc_strings_nul(req->base.descriptor, msg, len);                                  \
    if (nul_in_) {                                                                                           \
        protobuf_c_message_free_unpacked(&req->base, NULL);                                                  \
        grpc_stream_errorf(st, STATUS_INVALID, "the request's string field '%s' holds a NUL byte",           \
                           nul_in_);                                                                         \
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
        grpc_stream_errorf(st, STATUS_INVALID, "version '%.100s' of model '%.200s' is not a positive integer", v,
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
    if (!rv) grpc_stream_finish(st, status, err);
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
    res.ready = runtime_ready(grpc_stream_server(st)->rt);
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
        res.ready = rv && runtime_ready(s->rt);
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
        else grpc_stream_finish(st, status, err);
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

/* ==== load and unload ==================================================== */

/* A load or unload (server/model_control.h): it runs on the runtime's
 * control thread (it may take seconds), and its answer comes back to the
 * stream's loop. The stream may be gone by then (the client cancelled): st
 * is NULL and the answer is dropped; the load itself is not undone, as over
 * HTTP. */
struct grpc_control {
    struct model_control mc;     /* first: the call is freed through it */
    struct grpc_stream *st;
};

void grpc_control_detach(struct grpc_stream *st) {
    if (st->control) st->control->st = NULL;
    st->control = NULL;
}

/* The runtime went before the answer (exiting): the streams were closed. */
static void control_free(struct model_control *mc) {
    model_control_clear(mc);
    free(mc);
}

static void control_done(struct model_control *mc) {
    struct grpc_control *c = (struct grpc_control *)mc;
    struct grpc_stream *st = c->st;
    if (st) {
        st->control = NULL;
        if (mc->status) grpc_stream_finish(st, mc->status, mc->err);
        else if (mc->load) {
            Inference__RepositoryModelLoadResponse res = INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
            grpc_stream_reply(st, &res.base);
        } else {
            Inference__RepositoryModelUnloadResponse res = INFERENCE__REPOSITORY_MODEL_UNLOAD_RESPONSE__INIT;
            grpc_stream_reply(st, &res.base);
        }
    }
    control_free(mc);
}

/* The checks HTTP's load and unload pass too (model_control_check). 0 when
 * the call may go on; otherwise the error is sent. */
static int control_allowed(struct grpc_stream *st) {
    grpc_server_t *s = grpc_stream_server(st);
    char err[300];
    int rc = model_control_check(s->rt, s->cfg, st->authorization, ACCESS_VIA_GRPC, err, sizeof err);
    if (rc) grpc_stream_finish(st, rc, err);
    return rc;
}

/* Sends the call to the control thread; takes config and files. */
static void control_start(struct grpc_stream *st, const char *name, char *config, struct upload_set *files,
                          int load) {
    struct grpc_control *c = calloc(1, sizeof *c);
    if (!c) {
        free(config);
        if (files) upload_set_clear(files);
        grpc_stream_errorf(st, STATUS_NOMEM, "out of memory");
        return;
    }
    grpc_server_t *s = grpc_stream_server(st);
    c->st = st;
    c->mc = (struct model_control){.loop = grpc_stream_loop(st)->rl, .repo = s->repo, .config = config, .load = load,
                                   .done = control_done, .release = control_free};
    if (files) c->mc.files = *files;
    snprintf(c->mc.name, sizeof c->mc.name, "%s", name);
    st->control = c;
    model_control_start(s->rt, &c->mc);
}

/* The model's name: required, as HTTP's path segment is. */
static int control_name(struct grpc_stream *st, const char *name, int load) {
    char err[300];
    int rc = model_control_name_check(name, load, err, sizeof err);
    if (rc) grpc_stream_finish(st, rc, err);
    else if (strlen(name) >= sizeof ((struct model_control *)0)->name)
        grpc_stream_errorf(st, STATUS_INVALID, "model_name must name a model (1 to 255 bytes)");
    else return 0;
    return -1;
}

/* A load's parameters: config (string_param) and the files (bytes_param,
 * "file:<version>/<name>") into *files; 0, or a status with err set. */
static int load_params(struct grpc_stream *st, const Inference__RepositoryModelLoadRequest *req, const char **config,
                       struct upload_set *files, char *err, size_t err_len) {
    size_t max = (size_t)grpc_stream_server(st)->cfg->max_model_upload_size;
    for (size_t i = 0; i < req->n_parameters; i++) {
        const char *k = req->parameters[i]->key;
        const Inference__ModelRepositoryParameter *p = req->parameters[i]->value;
        int rc = 0;
        if (k && strncmp(k, "file:", 5) == 0) {
            if (!p || p->parameter_choice_case != INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_BYTES_PARAM)
                rc = status_set(err, err_len, STATUS_INVALID, "parameter '%.200s' must be a bytes_param (the file's bytes)",
                                k);
            else rc = upload_set_add(files, k + 5, p->bytes_param.data, p->bytes_param.len, max, err, err_len);
        } else if (k && strcmp(k, "config") == 0) {
            if (!p || p->parameter_choice_case != INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_STRING_PARAM)
                rc = status_set(err, err_len, STATUS_INVALID,
                                "parameters.config must be a string_param holding the model configuration JSON");
            else *config = p->string_param;
        }
        if (rc) return rc;
    }
    return 0;
}

/* The permission comes first: a client without it learns nothing of what
 * its parameters would have done. */
static void model_load(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__RepositoryModelLoadRequest, inference__repository_model_load_request__unpack, st, msg, len);
    const char *config = NULL;
    struct upload_set files = {0};
    char err[512];
    if (control_allowed(st) == 0 && control_name(st, req->model_name, 1) == 0) {
        int rc = load_params(st, req, &config, &files, err, sizeof err);
        char *cfg = !rc && config ? strdup(config) : NULL;
        if (!rc && config && !cfg) rc = status_set(err, sizeof err, STATUS_NOMEM, "out of memory");
        if (rc) {
            upload_set_clear(&files);
            grpc_stream_finish(st, rc, err);
        } else control_start(st, req->model_name, cfg, &files, 1);
    }
    inference__repository_model_load_request__free_unpacked(req, NULL);
}

static void model_unload(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    UNPACK(Inference__RepositoryModelUnloadRequest, inference__repository_model_unload_request__unpack, st, msg, len);
    if (control_allowed(st) == 0 && control_name(st, req->model_name, 0) == 0)
        control_start(st, req->model_name, NULL, NULL, 0);
    inference__repository_model_unload_request__free_unpacked(req, NULL);
}

/* ==== grpc.health.v1.Health ============================================== */

/* The serving status of the services Check and Watch answer for. */
static int health_status(struct grpc_stream *st) { return runtime_ready(grpc_stream_server(st)->rt) ? 1 : 2; }

/* HealthCheckResponse {status = 1: enum}, framed: 7 bytes. */
static void health_send(struct grpc_stream *st, int status) {
    uint8_t *buf = malloc(7);
    if (!buf) return;
    /* The gRPC prefix (uncompressed, 2 bytes), then field 1 = SERVING (1) or NOT_SERVING (2). */
    memcpy(buf, "\0\0\0\0\2\x08", 6);
    buf[6] = (uint8_t)status;
    grpc_stream_queue(st, buf, 7);
}

/* The request names the whole server ("") or the inference service: 0;
 * otherwise the call is answered (INVALID_ARGUMENT or NOT_FOUND) and -1. */
static int health_request(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    static const char inference[] = "inference.GRPCInferenceService";
    const uint8_t *svc;
    size_t n;
    if (grpc_health_request_service(msg, len, &svc, &n)) {
        grpc_stream_errorf(st, STATUS_INVALID, "the request is not a valid HealthCheckRequest message");
        return -1;
    }
    if (n && !(n == sizeof inference - 1 && memcmp(svc, inference, n) == 0)) {
        grpc_stream_errorf(st, STATUS_NOT_FOUND, "unknown service '%.*s': kiln serves '' and '%s'",
                           (int)(n > 200 ? 200 : n), (const char *)svc, inference);
        return -1;
    }
    return 0;
}

/* Check: SERVING for the whole server ("") and for the inference service,
 * NOT_SERVING once the drain began; NOT_FOUND for another service. The
 * answer is HealthCheckResponse {status = 1: enum}, two bytes. */
static void health_check(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    if (health_request(st, msg, len)) return;
    health_send(st, health_status(st));
    grpc_stream_finish(st, STATUS_OK, NULL);
}

/* Watch: the status now, then each change, until the client cancels or the
 * server exits. Leaving (SIGTERM) is the one change there is
 * (grpc_server_begin_drain). */
void grpc_health_detach(struct grpc_stream *st) {
    if (!st->watch_status) return;
    struct grpc_loop *l = grpc_stream_loop(st);
    if (st->wprev) st->wprev->wnext = st->wnext;
    else l->watchers = st->wnext;
    if (st->wnext) st->wnext->wprev = st->wprev;
    st->watch_status = 0;
}

void grpc_health_notify(struct grpc_loop *l) {
    for (struct grpc_stream *st = l->watchers; st; st = st->wnext) {
        int now = health_status(st);
        if (now != st->watch_status) {
            st->watch_status = now;
            health_send(st, now);
        }
    }
    grpc_loop_flush(l); /* after the walk: a flush may free streams */
}

static void health_watch(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    if (health_request(st, msg, len)) return;
    struct grpc_loop *l = grpc_stream_loop(st);
    st->watch_status = health_status(st);
    st->wnext = l->watchers;
    if (l->watchers) l->watchers->wprev = st;
    l->watchers = st;
    health_send(st, st->watch_status);
}

/* ==== shared memory ====================================================== */

/* Triton's status array as the gRPC message's map: {"regions": {name: status}}. */
static void reply_shm_status(struct grpc_stream *st, const ProtobufCMessageDescriptor *d, cJSON *arr, int status,
                             const char *err) {
    if (!arr) {
        grpc_stream_finish(st, status, err);
        return;
    }
    cJSON *o = cJSON_CreateObject(), *regions = cJSON_AddObjectToObject(o, "regions");
    for (cJSON *r; regions && (r = cJSON_DetachItemFromArray(arr, 0)) != NULL;)
        cJSON_AddItemToObject(regions, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "name")), r);
    cJSON_Delete(arr);
    grpc_stream_reply_json(st, d, regions ? o : NULL);
    if (!regions) cJSON_Delete(o);
}

/* The access check of every shared-memory RPC (access_check, the one
 * HTTP's routes make): 1 with *owner the caller's scope, or 0 once the
 * refusal is sent. */
static int shm_call_allowed(struct grpc_stream *st, enum access_action action, shm_owner_t *owner) {
    grpc_server_t *s = grpc_stream_server(st);
    char err[300];
    int rc = access_check(s->cfg, st->authorization, action, ACCESS_VIA_GRPC, err, sizeof err);
    if (rc) {
        grpc_stream_finish(st, rc, err);
        return 0;
    }
    *owner = access_shm_owner(s->cfg, st->authorization, shm_owner_of(st->conn));
    return 1;
}

static void system_shm_status(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    shm_owner_t owner;
    if (!shm_call_allowed(st, ACCESS_SHM_STATUS, &owner)) return;
    UNPACK(Inference__SystemSharedMemoryStatusRequest, inference__system_shared_memory_status_request__unpack, st, msg,
           len);
    char err[512];
    int status = 0;
    cJSON *arr =
        shm_status_json(infer_core_shm(grpc_stream_server(st)->core), owner, req->name, &status, err, sizeof err);
    reply_shm_status(st, &inference__system_shared_memory_status_response__descriptor, arr, status, err);
    inference__system_shared_memory_status_request__free_unpacked(req, NULL);
}

static void system_shm_register(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    shm_owner_t owner;
    if (!shm_call_allowed(st, ACCESS_SHM, &owner)) return;
    UNPACK(Inference__SystemSharedMemoryRegisterRequest, inference__system_shared_memory_register_request__unpack, st,
           msg, len);
    char err[600];
    int rc = shm_register(infer_core_shm(grpc_stream_server(st)->core), owner, req->name, req->key, req->offset,
                          req->byte_size, err, sizeof err);
    inference__system_shared_memory_register_request__free_unpacked(req, NULL);
    Inference__SystemSharedMemoryRegisterResponse res = INFERENCE__SYSTEM_SHARED_MEMORY_REGISTER_RESPONSE__INIT;
    if (rc) grpc_stream_finish(st, rc, err);
    else grpc_stream_reply(st, &res.base);
}

static void system_shm_unregister(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    shm_owner_t owner;
    if (!shm_call_allowed(st, ACCESS_SHM, &owner)) return;
    UNPACK(Inference__SystemSharedMemoryUnregisterRequest, inference__system_shared_memory_unregister_request__unpack,
           st, msg, len);
    shm_registry_t *reg = infer_core_shm(grpc_stream_server(st)->core);
    if (req->name && *req->name) shm_unregister(reg, owner, req->name);
    else shm_unregister_all(reg, owner);
    inference__system_shared_memory_unregister_request__free_unpacked(req, NULL);
    Inference__SystemSharedMemoryUnregisterResponse res = INFERENCE__SYSTEM_SHARED_MEMORY_UNREGISTER_RESPONSE__INIT;
    grpc_stream_reply(st, &res.base);
}

static void cuda_shm_status(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    shm_owner_t owner;
    if (!shm_call_allowed(st, ACCESS_SHM_STATUS, &owner)) return;
    UNPACK(Inference__CudaSharedMemoryStatusRequest, inference__cuda_shared_memory_status_request__unpack, st, msg, len);
    char err[512];
    int status = 0;
    cJSON *arr = shm_cuda_status_json(infer_core_shm(grpc_stream_server(st)->core), owner, req->name, &status, err,
                                      sizeof err);
    reply_shm_status(st, &inference__cuda_shared_memory_status_response__descriptor, arr, status, err);
    inference__cuda_shared_memory_status_request__free_unpacked(req, NULL);
}

/* raw_handle carries the cudaIpcMemHandle_t's bytes (tritonclient decodes
 * its base64 before sending). */
static void cuda_shm_register(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    shm_owner_t owner;
    if (!shm_call_allowed(st, ACCESS_SHM, &owner)) return;
    UNPACK(Inference__CudaSharedMemoryRegisterRequest, inference__cuda_shared_memory_register_request__unpack, st, msg,
           len);
    char err[900];
    int rc = shm_cuda_register(infer_core_shm(grpc_stream_server(st)->core), owner, req->name, req->raw_handle.data,
                               req->raw_handle.len, req->device_id, req->byte_size, err, sizeof err);
    inference__cuda_shared_memory_register_request__free_unpacked(req, NULL);
    Inference__CudaSharedMemoryRegisterResponse res = INFERENCE__CUDA_SHARED_MEMORY_REGISTER_RESPONSE__INIT;
    if (rc) grpc_stream_finish(st, rc, err);
    else grpc_stream_reply(st, &res.base);
}

static void cuda_shm_unregister(struct grpc_stream *st, const uint8_t *msg, size_t len) {
    shm_owner_t owner;
    if (!shm_call_allowed(st, ACCESS_SHM, &owner)) return;
    UNPACK(Inference__CudaSharedMemoryUnregisterRequest, inference__cuda_shared_memory_unregister_request__unpack, st,
           msg, len);
    shm_registry_t *reg = infer_core_shm(grpc_stream_server(st)->core);
    if (req->name && *req->name) shm_cuda_unregister(reg, owner, req->name);
    else shm_cuda_unregister_all(reg, owner);
    inference__cuda_shared_memory_unregister_request__free_unpacked(req, NULL);
    Inference__CudaSharedMemoryUnregisterResponse res = INFERENCE__CUDA_SHARED_MEMORY_UNREGISTER_RESPONSE__INIT;
    grpc_stream_reply(st, &res.base);
}

/* ==== the method table =================================================== */

static const struct grpc_method methods[] = {
    /* Inference first: it is most of the traffic. */
    {SERVICE "ModelInfer", 0, grpc_model_infer},
    {SERVICE "ModelStreamInfer", 1, grpc_model_stream_infer},
    {SERVICE "ServerLive", 0, server_live},
    {SERVICE "ServerReady", 0, server_ready},
    {SERVICE "ModelReady", 0, model_ready},
    {SERVICE "ServerMetadata", 0, server_metadata},
    {SERVICE "ModelMetadata", 0, model_metadata},
    {SERVICE "ModelConfig", 0, model_config},
    {SERVICE "ModelStatistics", 0, model_statistics},
    {SERVICE "RepositoryIndex", 0, repository_index_rpc},
    {SERVICE "RepositoryModelLoad", 0, model_load},
    {SERVICE "RepositoryModelUnload", 0, model_unload},
    {HEALTH "Check", 0, health_check},
    {HEALTH "Watch", 0, health_watch},
    {SERVICE "SystemSharedMemoryStatus", 0, system_shm_status},
    {SERVICE "SystemSharedMemoryRegister", 0, system_shm_register},
    {SERVICE "SystemSharedMemoryUnregister", 0, system_shm_unregister},
    {SERVICE "CudaSharedMemoryStatus", 0, cuda_shm_status},
    {SERVICE "CudaSharedMemoryRegister", 0, cuda_shm_register},
    {SERVICE "CudaSharedMemoryUnregister", 0, cuda_shm_unregister},
};

const struct grpc_method *grpc_method_find(const char *path) {
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strcmp(path, methods[i].name) == 0) return &methods[i];
    return NULL;
}
