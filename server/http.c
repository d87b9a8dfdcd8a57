/* http.c - the HTTP transport: KServe v2 over kiln's HTTP/1.1 connections
 * (http_conn.c).
 *
 * Sections: replies; request bodies (Content-Encoding) and response compression;
 * inference, which decodes a request and hands it to the inference core
 * (server/infer.h) through the reply interface; the repository control
 * endpoints; the route table; attaching to the runtime's loops (sockets).
 * Threads and job queues are the runtime's (server/runtime.h). Connections pass
 * through http_conn.c first; the read-only endpoints' bodies are built in
 * http_bodies.c. */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h> /* evhttp_uridecode */
#include <event2/listener.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "server/access.h"
#include "server/http_bodies.h"
#include "server/http_coding.h"
#include "server/http_impl.h"
#include "server/infer.h"
#include "server/kserve.h"
#include "server/listen.h"
#include "server/model_control.h"
#include "server/openai.h"
#include "server/upload.h"

/* ==== replies ============================================================ */

static void free_cb(const void *data, size_t len, void *arg) { free(arg); }

/* Sends body (taking ownership of a malloc'd buffer) with a status code. */
static void reply_raw(http_server_t *s, struct http_req *req, int code, const char *ctype, char *body,
                      size_t len) {
    if (body && len) evbuffer_add_reference(req->out, body, len, free_cb, body);
    else free(body);
    http_req_reply(req, code, ctype);
}

static void reply_json(http_server_t *s, struct http_req *req, int code, cJSON *j) {
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    reply_raw(s, req, code, "application/json", txt, txt ? strlen(txt) : 0);
}

static void reply_error(http_server_t *s, struct http_req *req, int code, const char *msg) {
    struct buf b = {0};
    kserve_error_body(&b, msg);
    reply_raw(s, req, code, "application/json", b.data, b.len);
}

/* A failure with status: its HTTP code from the status table; a request
 * without the control token is told which scheme to use. */
static void reply_status(http_server_t *s, struct http_req *req, int status, const char *msg) {
    if (status == STATUS_UNAUTHENTICATED)
        http_req_add_header(req, "WWW-Authenticate", "Bearer");
    reply_error(s, req, status_http(status), msg);
}

static void reply_empty(http_server_t *s, struct http_req *req, int code) {
    reply_raw(s, req, code, NULL, NULL, 0);
}

/* ==== request bodies ===================================================== */

/* The body as one contiguous buffer, inflated when Content-Encoding says
 * gzip or deflate. *owned is set when the caller must free the result.
 * Returns NULL with *status and err set on failure. */
static unsigned char *read_body_as(http_server_t *s, struct http_req *req, const char *enc, size_t *len,
                                   int *owned, int *status, char *err, size_t err_len) {
    struct evbuffer *in = req->body;
    size_t n = evbuffer_get_length(in);
    unsigned char *raw = n ? evbuffer_pullup(in, -1) : (unsigned char *)"";
    *owned = 0;
    if (!enc || !*enc || strcasecmp(enc, "identity") == 0) {
        *len = n;
        return raw;
    }
    unsigned char *out;
    *status = http_coding_inflate(enc, raw, n, (size_t)s->cfg->max_request_size, &out, len, err, err_len);
    if (*status) return NULL;
    *owned = 1;
    return out;
}

/* read_body_as with the request's Content-Encoding header. */
static unsigned char *read_body(http_server_t *s, struct http_req *req, size_t *len, int *owned, int *status,
                                char *err, size_t err_len) {
    const char *enc = http_req_header(req, "Content-Encoding");
    return read_body_as(s, req, enc, len, owned, status, err, err_len);
}

/* The request headers an inference request reads, found in one walk over
 * them rather than one per name. The first of a repeated header counts. */
struct infer_headers {
    const char *authorization, *header_length, *content_encoding, *accept_encoding;
};

static void infer_headers_find(struct http_req *req, struct infer_headers *h) {
    memset(h, 0, sizeof *h);
    for (int i = 0; i < req->nfields; i++) {
        const struct http_field *kv = &req->fields[i];
        const char **slot = NULL;
        switch (strlen(kv->name)) {
        case 13: slot = strcasecmp(kv->name, "Authorization") ? NULL : &h->authorization; break;
        case 15: slot = strcasecmp(kv->name, "Accept-Encoding") ? NULL : &h->accept_encoding; break;
        case 16: slot = strcasecmp(kv->name, "Content-Encoding") ? NULL : &h->content_encoding; break;
        case 31: slot = strcasecmp(kv->name, "Inference-Header-Content-Length") ? NULL : &h->header_length; break;
        }
        if (slot && !*slot) *slot = kv->value;
    }
}

/* A NUL byte in the JSON of a request: cJSON reads a string or a number up
 * to it, so the request would be taken for something shorter than it is. */
static int json_has_nul(const unsigned char *json, size_t len, char *err, size_t err_len) {
    const unsigned char *z = len ? memchr(json, 0, len) : NULL;
    if (!z) return 0;
    snprintf(err, err_len, "the request JSON holds a NUL byte at offset %zu", (size_t)(z - json));
    return 1;
}

/* ==== response compression =============================================== */

/* Compresses the answer in body when the client asked for it with Accept-Encoding
 * (tritonclient's response_compression_algorithm). The
 * Inference-Header-Content-Length header keeps the uncompressed JSON length,
 * as Triton does. On any failure the body goes out uncompressed. */
static void compress_reply(struct http_req *req, const char *accept_encoding, struct evbuffer *body) {
    enum http_coding coding = http_coding_accepted(accept_encoding);
    size_t len = evbuffer_get_length(body), n;
    if (coding == HTTP_CODING_IDENTITY || len == 0) return;
    /* The answer's pieces (outputs sent by reference) made one block. */
    unsigned char *in = evbuffer_pullup(body, -1), *out;
    if (!in || http_coding_deflate(coding, in, len, &out, &n)) return;
    if (evbuffer_drain(body, len) != 0) {
        free(out);
        return;
    }
    evbuffer_add_reference(body, out, n, free_cb, out);
    http_req_add_header(req, "Content-Encoding", http_coding_name(coding));
}

/* ==== inference ========================================================== */

/* Binary outputs an answer sends by reference; more are copied. */
#define HTTP_INFER_PARTS 4

/* An inference request's transport half: its request and the encoded
 * answer. The inference core (server/infer.h) holds the rest and calls
 * back through http_infer_reply. */
struct http_infer {
    http_server_t *srv;
    struct io_thread *io;
    struct http_req *req;
    struct infer_request *r;
    int gone;              /* the client went away while the request was served */
    char *body;            /* the encoded answer, between encode and send */
    size_t body_len;
    const char *ctype;
    const char *accept_encoding; /* the request's header (owned by req), or NULL */
    /* Binary outputs sent from their own blocks, taken from the core by
     * encode (struct infer_result) and freed once written: no copy. */
    struct kserve_splice parts[HTTP_INFER_PARTS];
    void *blocks[HTTP_INFER_PARTS];
    int nparts;
};

/* The connection saw its client go (a reset, or EOF after a wait): a
 * queued request is dropped before it runs. */
static void infer_hangup(void *arg) {
    struct http_infer *c = arg;
    c->gone = 1;
    infer_request_cancel(c->r);
}

static void reply_flushed_cb(void *arg) {
    http_server_t *s = arg;
    atomic_fetch_sub(&s->unflushed, 1);
}

/* The core's encode: the KServe response, binary outputs after the JSON. */
static int infer_encode(void *arg, const struct infer_result *res, char *err, size_t err_len) {
    struct http_infer *c = arg;
    struct buf body = {0};
    size_t json_len = 0;
    int rc = kserve_response_encode_spliced(res->request, res->config, res->model_name, res->model_version,
                                            res->outputs, &body, &json_len, c->parts, HTTP_INFER_PARTS, &c->nparts,
                                            err, err_len);
    if (rc) {
        buf_free(&body);
        return rc;
    }
    for (int i = 0; i < c->nparts; i++) {
        struct tensor *t = &res->outputs[c->parts[i].output];
        c->blocks[i] = t->data;
        t->data = NULL;
    }
    c->ctype = "application/json";
    if (json_len < body.len || c->nparts) {
        char hl[32];
        snprintf(hl, sizeof hl, "%zu", json_len);
        http_req_add_header(c->req, "Inference-Header-Content-Length", hl);
        c->ctype = "application/octet-stream";
    }
    c->body = body.data;
    c->body_len = body.len;
    return 0;
}

/* The encoded answer into out: the body's bytes with each taken output
 * block at its place, by reference (freed once written). */
static void add_answer(struct evbuffer *out, struct http_infer *c) {
    if (!c->nparts) {
        evbuffer_add_reference(out, c->body, c->body_len, free_cb, c->body);
        return;
    }
    size_t at = 0;
    for (int i = 0; i < c->nparts; i++) {
        evbuffer_add(out, c->body + at, c->parts[i].at - at);
        at = c->parts[i].at;
        evbuffer_add_reference(out, c->blocks[i], c->parts[i].len, free_cb, c->blocks[i]);
    }
    evbuffer_add(out, c->body + at, c->body_len - at);
    free(c->body);
}

/* The core's send: the answer goes out and the transport half is freed. */
static void infer_send(void *arg, int status, const char *msg) {
    struct http_infer *c = arg;
    http_server_t *s = c->srv;
    if (!c->gone) {
        /* The drain waits for the bytes to leave, not just for the answer
         * (not for a peer that hung up: nothing is written). */
        atomic_fetch_add(&s->unflushed, 1);
        c->req->on_flushed = reply_flushed_cb;
        c->req->flushed_arg = s;
    }
    /* A request whose client left is still "answered": the connection frees it. */
    if (status) {
        free(c->body);
        for (int i = 0; i < c->nparts; i++) free(c->blocks[i]);
        reply_status(s, c->req, status, msg);
    } else {
        struct evbuffer *out = c->req->out;
        add_answer(out, c);
        compress_reply(c->req, c->accept_encoding, out);
        http_req_reply(c->req, 200, c->ctype);
    }
    free(c);
}

static const struct infer_reply_i http_infer_reply = {runtime_post_any, infer_encode, infer_send};

static const char *authorization(struct http_req *req) { return http_req_header(req, "Authorization"); }

/* Decodes an inference request and hands it to the core. */
static void handle_infer(http_server_t *s, struct io_thread *io, struct http_req *req, const char *model,
                         int64_t version) {
    char err[512];
    int status = 0;
    if ((status = runtime_accepting(s->rt, err, sizeof err))) {
        reply_status(s, req, status, err);
        return;
    }
    struct http_infer *c = calloc(1, sizeof *c);
    if (!c) {
        reply_status(s, req, STATUS_NOMEM, "out of memory");
        return;
    }
    c->srv = s;
    c->io = io;
    c->req = req;
    c->r = infer_request_begin(s->core, model, version, &http_infer_reply, c, io->loop, runtime_loop_redis(io->loop),
                               &status, err, sizeof err);
    if (!c->r) {
        reply_status(s, req, status, err);
        free(c);
        return;
    }
    struct infer_headers h;
    infer_headers_find(req, &h);
    c->accept_encoding = h.accept_encoding;
    infer_request_set_shm_owner(c->r, access_shm_owner(s->cfg, h.authorization, http_req_shm_owner(req)));
    const char *hl = h.header_length;
    int64_t header_len = -1;
    if (hl && kserve_parse_header_length(hl, &header_len, err, sizeof err)) {
        infer_request_fail(c->r, STATUS_INVALID, err);
        return;
    }
    size_t len;
    int owned;
    unsigned char *body = read_body_as(s, req, h.content_encoding, &len, &owned, &status, err, sizeof err);
    if (!body) {
        infer_request_drop(c->r);
        reply_status(s, req, status, err);
        free(c);
        return;
    }
    if (header_len >= 0 && (uint64_t)header_len > len) {
        /* Else the NUL check below would read binary data as JSON and blame a NUL byte. */
        snprintf(err, sizeof err, "Inference-Header-Content-Length (%lld) exceeds the request body (%zu bytes%s)",
                 (long long)header_len, len, owned ? ", decompressed" : "");
        if (owned) free(body);
        infer_request_fail(c->r, STATUS_INVALID, err);
        return;
    }
    size_t json_len = header_len >= 0 ? (size_t)header_len : len;
    int nul = json_has_nul(body, json_len, err, sizeof err);
    if (nul && header_len < 0) /* most likely binary tensor data sent without its header's length */
        snprintf(err + strlen(err), sizeof err - strlen(err),
                 " (binary tensor data needs the Inference-Header-Content-Length header)");
    int rc = nul ? STATUS_INVALID
                 : kserve_request_parse(infer_request_decoded(c->r), body, len, header_len, err, sizeof err);
    if (owned) free(body);
    if (rc) {
        infer_request_fail(c->r, rc, err);
        return;
    }
    req->on_hangup = infer_hangup;
    req->hangup_arg = c;
    infer_request_start(c->r);
}

/* ==== metrics ============================================================ */

static void handle_metrics(http_server_t *s, struct http_req *req) {
    char *txt = http_body_metrics(s->repo, infer_core_cache(s->core));
    reply_raw(s, req, 200, "text/plain; version=0.0.4; charset=utf-8", txt, strlen(txt));
}


/* ==== repository control ================================================= */

/* A load or unload (server/model_control.h) and the request it answers. */
struct control_req {
    struct model_control mc;     /* first: the call is freed through it */
    http_server_t *srv;
    struct http_req *req;
};

/* The runtime went before the answer (exiting): the connection goes with its loop. */
static void control_free(struct model_control *mc) {
    model_control_clear(mc);
    free(mc);
}

static void control_done(struct model_control *mc) {
    struct control_req *c = (struct control_req *)mc;
    if (mc->status) reply_status(c->srv, c->req, mc->status, mc->err);
    else reply_raw(c->srv, c->req, 200, "application/json", strdup("{}"), 2);
    control_free(mc);
}

static void handle_control(http_server_t *s, struct io_thread *io, struct http_req *req, const char *name,
                           int load) {
    char err[300];
    int rc = model_control_check(s->rt, s->cfg, authorization(req), ACCESS_VIA_HTTP, err, sizeof err);
    if (!rc) rc = model_control_name_check(name, load, err, sizeof err);
    if (rc) {
        reply_status(s, req, rc, err);
        return;
    }
    struct control_req *c = calloc(1, sizeof *c);
    if (!c) {
        reply_status(s, req, STATUS_NOMEM, "out of memory");
        return;
    }
    c->srv = s;
    c->req = req;
    c->mc = (struct model_control){.loop = io->loop, .repo = s->repo, .load = load, .done = control_done,
                                   .release = control_free};
    snprintf(c->mc.name, sizeof c->mc.name, "%s", name);
    /* Body: {"parameters": {"config": "<model config JSON>", "unload_dependents": bool}}. */
    size_t len;
    int owned, status;
    unsigned char *body = read_body(s, req, &len, &owned, &status, err, sizeof err);
    if (!body) {
        free(c);
        reply_status(s, req, status, err);
        return;
    }
    if (len && json_has_nul(body, len, err, sizeof err)) {
        if (owned) free(body);
        free(c);
        reply_status(s, req, STATUS_INVALID, err);
        return;
    }
    if (len) {
        cJSON *j = cJSON_ParseWithLength((const char *)body, len);
        cJSON *params = cJSON_GetObjectItemCaseSensitive(j, "parameters");
        cJSON *cfg = cJSON_GetObjectItemCaseSensitive(params, "config");
        const char *bad = !cJSON_IsObject(j) ? "the request body must be a JSON object"
                          : params && !cJSON_IsObject(params) ? "field 'parameters' must be an object"
                          : cfg && !cJSON_IsString(cfg) ? "parameters.config must be a string holding the model configuration JSON"
                          : cfg && !load ? "parameters.config is only accepted by load"
                          : NULL;
        int brc = bad ? STATUS_INVALID : 0;
        for (const cJSON *p = cJSON_IsObject(params) ? params->child : NULL; p && !brc; p = p->next)
            if (p->string && strncmp(p->string, "file:", 5) == 0) {
                if (!load || !cJSON_IsString(p))
                    brc = status_set(err, sizeof err, STATUS_INVALID, "parameter '%.200s' must be a string (the "
                                     "file's bytes in base64) and is only accepted by load", p->string);
                else brc = upload_set_add_base64(&c->mc.files, p->string + 5, p->valuestring,
                                                 (size_t)s->cfg->max_model_upload_size, err, sizeof err);
            }
        if (!brc && cfg) c->mc.config = strdup(cfg->valuestring);
        cJSON_Delete(j);
        if (owned) free(body);
        if (brc) {
            model_control_clear(&c->mc);
            free(c);
            reply_status(s, req, brc, bad ? bad : err);
            return;
        }
    } else if (owned) free(body);
    model_control_start(s->rt, &c->mc);
}

static void handle_index(http_server_t *s, struct http_req *req) {
    int ready_only = 0;
    size_t len;
    int owned, status;
    char err[256];
    unsigned char *body = read_body(s, req, &len, &owned, &status, err, sizeof err);
    if (!body) {
        reply_status(s, req, status, err);
        return;
    }
    if (len && json_has_nul(body, len, err, sizeof err)) {
        if (owned) free(body);
        reply_status(s, req, STATUS_INVALID, err);
        return;
    }
    if (len) {
        cJSON *j = cJSON_ParseWithLength((const char *)body, len);
        if (!cJSON_IsObject(j)) {
            cJSON_Delete(j);
            if (owned) free(body);
            reply_status(s, req, STATUS_INVALID,
                         "the repository index request body must be a JSON object such as {\"ready\": true}");
            return;
        }
        cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "ready");
        if (r && !cJSON_IsBool(r)) {
            cJSON_Delete(j);
            if (owned) free(body);
            reply_status(s, req, STATUS_INVALID, "Invalid value for 'ready': expected a boolean");
            return;
        }
        ready_only = cJSON_IsTrue(r);
        cJSON_Delete(j);
    }
    if (owned) free(body);
    reply_json(s, req, 200, repository_index(s->repo, ready_only));
}

/* ==== routing ============================================================ */

/* A routed request: its path's parameters and where it came in. */
struct http_call {
    http_server_t *srv;
    struct io_thread *io;
    struct http_req *req;
    const char *model;     /* the path's {model}, NULL when the route has none */
    int64_t version;       /* the path's {version}; 0 = none (the highest loaded) */
    const char *region;    /* the path's {region}, NULL when the route has none */
};

/* ==== shared memory ====================================================== */

/* The request's body as JSON, or NULL: when it cannot be read, *status is
 * the status to answer with err; when it is empty or not JSON, *status is 0. */
static cJSON *read_json_body(const struct http_call *c, int *status, char *err, size_t err_len) {
    size_t len;
    int owned;
    unsigned char *body = read_body(c->srv, c->req, &len, &owned, status, err, err_len);
    if (!body) return NULL;
    *status = 0;
    cJSON *j = len && !json_has_nul(body, len, err, err_len) ? cJSON_ParseWithLength((const char *)body, len) : NULL;
    if (owned) free(body);
    return j;
}

/* 1 when v is an integer >= 0 that fits in 64 bits (JSON numbers are doubles). */
static int json_uint(const cJSON *v) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble == floor(v->valuedouble) &&
           v->valuedouble <= 1.8e19;
}

/* The access check of every shared-memory route (access_check): 1 with
 * *owner the caller's scope, or 0 once the refusal is answered. */
static int shm_route_allowed(const struct http_call *c, enum access_action action, shm_owner_t *owner) {
    char err[300];
    const char *auth = authorization(c->req);
    int rc = access_check(c->srv->cfg, auth, action, ACCESS_VIA_HTTP, err, sizeof err);
    if (rc) {
        reply_status(c->srv, c->req, rc, err);
        return 0;
    }
    *owner = access_shm_owner(c->srv->cfg, auth, http_req_shm_owner(c->req));
    return 1;
}

/* The start of either register call: access, then the JSON body into *j.
 * 0 when the call is answered already (refused), 1 to go on. */
static int shm_register_begin(const struct http_call *c, shm_owner_t *owner, cJSON **j, char *err, size_t err_len) {
    int status;
    if (!shm_route_allowed(c, ACCESS_SHM, owner)) return 0;
    *j = read_json_body(c, &status, err, err_len);
    if (!status) return 1;
    reply_status(c->srv, c->req, status, err);
    return 0;
}

/* The end of either register call: rc is the registration's status. */
static void shm_register_end(const struct http_call *c, cJSON *j, int rc, const char *err) {
    cJSON_Delete(j);
    if (rc) reply_status(c->srv, c->req, rc, err);
    else reply_empty(c->srv, c->req, 200);
}

/* POST /v2/systemsharedmemory/region/{region}/register: {"key", "offset", "byte_size"}. */
static void route_shm_register(const struct http_call *c) {
    http_server_t *s = c->srv;
    char err[600];
    shm_owner_t owner;
    cJSON *j;
    if (!shm_register_begin(c, &owner, &j, err, sizeof err)) return;
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(j, "key");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(j, "offset");
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(j, "byte_size");
    int rc = STATUS_INVALID;
    if (!cJSON_IsObject(j))
        snprintf(err, sizeof err, "the register request for shared memory region '%.200s' must be a JSON object "
                 "{\"key\", \"offset\", \"byte_size\"}", c->region);
    else if (!cJSON_IsString(key))
        snprintf(err, sizeof err, "the register request for shared memory region '%.200s' has no string 'key'", c->region);
    else if (!json_uint(size))
        snprintf(err, sizeof err, "the register request for shared memory region '%.200s' has no integer 'byte_size' >= 0",
                 c->region);
    else if (off && !json_uint(off))
        snprintf(err, sizeof err, "the register request for shared memory region '%.200s': 'offset' must be an "
                 "integer >= 0", c->region);
    else
        rc = shm_register(infer_core_shm(s->core), owner, c->region, key->valuestring,
                          off ? (uint64_t)off->valuedouble : 0, (uint64_t)size->valuedouble, err, sizeof err);
    shm_register_end(c, j, rc, err);
}

static void route_shm_unregister(const struct http_call *c) {
    shm_owner_t owner;
    if (!shm_route_allowed(c, ACCESS_SHM, &owner)) return;
    if (c->region) shm_unregister(infer_core_shm(c->srv->core), owner, c->region);
    else shm_unregister_all(infer_core_shm(c->srv->core), owner);
    reply_empty(c->srv, c->req, 200);
}

static void route_shm_status(const struct http_call *c) {
    char err[512];
    int status = 0;
    shm_owner_t owner;
    if (!shm_route_allowed(c, ACCESS_SHM_STATUS, &owner)) return;
    cJSON *o = shm_status_json(infer_core_shm(c->srv->core), owner, c->region, &status, err, sizeof err);
    if (o) reply_json(c->srv, c->req, 200, o);
    else reply_status(c->srv, c->req, status, err);
}

/* POST /v2/cudasharedmemory/region/{region}/register:
 * {"raw_handle": {"b64": base64 of the cudaIpcMemHandle_t}, "device_id", "byte_size"}. */
static void route_cuda_shm_register(const struct http_call *c) {
    http_server_t *s = c->srv;
    char err[900];
    shm_owner_t owner;
    cJSON *j;
    if (!shm_register_begin(c, &owner, &j, err, sizeof err)) return;
    const cJSON *handle = cJSON_GetObjectItemCaseSensitive(j, "raw_handle");
    const cJSON *b64 = cJSON_GetObjectItemCaseSensitive(handle, "b64");
    const cJSON *dev = cJSON_GetObjectItemCaseSensitive(j, "device_id");
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(j, "byte_size");
    int rc = STATUS_INVALID;
    if (!cJSON_IsObject(j))
        snprintf(err, sizeof err, "the register request for cuda shared memory region '%.200s' must be a JSON object "
                 "{\"raw_handle\": {\"b64\"}, \"device_id\", \"byte_size\"}", c->region);
    else if (!cJSON_IsString(b64))
        snprintf(err, sizeof err, "the register request for cuda shared memory region '%.200s' has no string "
                 "'raw_handle': {'b64'}", c->region);
    else if (!json_uint(dev) || dev->valuedouble > INT32_MAX)
        snprintf(err, sizeof err, "the register request for cuda shared memory region '%.200s' has no integer "
                 "'device_id' >= 0", c->region);
    else if (!json_uint(size))
        snprintf(err, sizeof err, "the register request for cuda shared memory region '%.200s' has no integer "
                 "'byte_size' >= 0", c->region);
    else
        rc = shm_cuda_register_b64(infer_core_shm(s->core), owner, c->region, b64->valuestring,
                                   (int64_t)dev->valuedouble, (uint64_t)size->valuedouble, err, sizeof err);
    shm_register_end(c, j, rc, err);
}

static void route_cuda_shm_unregister(const struct http_call *c) {
    shm_owner_t owner;
    if (!shm_route_allowed(c, ACCESS_SHM, &owner)) return;
    if (c->region) shm_cuda_unregister(infer_core_shm(c->srv->core), owner, c->region);
    else shm_cuda_unregister_all(infer_core_shm(c->srv->core), owner);
    reply_empty(c->srv, c->req, 200);
}

static void route_cuda_shm_status(const struct http_call *c) {
    char err[512];
    int status = 0;
    shm_owner_t owner;
    if (!shm_route_allowed(c, ACCESS_SHM_STATUS, &owner)) return;
    cJSON *o = shm_cuda_status_json(infer_core_shm(c->srv->core), owner, c->region, &status, err, sizeof err);
    if (o) reply_json(c->srv, c->req, 200, o);
    else reply_status(c->srv, c->req, status, err);
}

/* A route is a path pattern, the one method it answers (GET also answers
 * HEAD) and its handler. In a pattern, {model}, {version} and {region} each
 * match one segment. The first route whose pattern matches the path wins: literal
 * routes come before the ones a model's name could also match. */
struct http_route {
    const char *pattern;
    int method;
    void (*handle)(const struct http_call *c);
};

static void route_metrics(const struct http_call *c) { handle_metrics(c->srv, c->req); }

static void route_server_metadata(const struct http_call *c) {
    reply_json(c->srv, c->req, 200, http_body_server_metadata());
}

static void route_live(const struct http_call *c) { reply_empty(c->srv, c->req, 200); }

static void route_ready(const struct http_call *c) {
    if (!runtime_ready(c->srv->rt)) reply_error(c->srv, c->req, 400, "the server is shutting down");
    else reply_empty(c->srv, c->req, 200);
}

static void route_index(const struct http_call *c) { handle_index(c->srv, c->req); }

static void route_load(const struct http_call *c) { handle_control(c->srv, c->io, c->req, c->model, 1); }

static void route_unload(const struct http_call *c) { handle_control(c->srv, c->io, c->req, c->model, 0); }

static void route_stats(const struct http_call *c) {
    char err[512];
    int status = 0;
    cJSON *o = http_body_stats(c->srv->repo, c->model, c->version, &status, err, sizeof err);
    if (o) reply_json(c->srv, c->req, 200, o);
    else reply_status(c->srv, c->req, status, err);
}

static void route_infer(const struct http_call *c) { handle_infer(c->srv, c->io, c->req, c->model, c->version); }

/* ==== OpenAI's API (server/openai.h) ======================================== */

/* An embeddings call's transport half. */
struct http_openai {
    http_server_t *srv;
    struct http_req *req;
    openai_call_t *call;   /* while its texts run */
    int gone;              /* the client went away */
};

static void reply_openai(http_server_t *s, struct http_req *req, int code, char *body, size_t len) {
    struct evbuffer *out = req->out;
    if (body && len) evbuffer_add_reference(out, body, len, free_cb, body);
    else free(body);
    compress_reply(req, http_req_header(req, "Accept-Encoding"), out);
    http_req_reply(req, code, "application/json");
}

static void openai_error(http_server_t *s, struct http_req *req, int code, const char *msg, const char *code_s) {
    size_t len;
    char *body = openai_error_body(code, msg, NULL, code_s, &len);
    reply_openai(s, req, code, body, len);
}

/* The API keys' check of every /v1/ route: 1 to go on, 0 once refused.
 * Several Authorization headers (a proxy's and the client's) are refused
 * rather than decided by whichever comes first. */
static int openai_allowed(const struct http_call *c) {
    const char *auth = authorization(c->req);
    int n = http_req_header_count(c->req, "Authorization");
    if ((n <= 1 || !c->srv->cfg->openai_api_keys) && access_api_key_ok(c->srv->cfg, auth)) return 1;
    http_req_add_header(c->req, "WWW-Authenticate", "Bearer");
    openai_error(c->srv, c->req, 401,
                 n > 1 ? "Send one Authorization header: this request has several."
                 : auth ? "Incorrect API key provided."
                        : "You didn't provide an API key. You need to provide your API key in an Authorization header "
                          "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                 "invalid_api_key");
    return 0;
}

static void openai_hangup(void *arg) {
    struct http_openai *o = arg;
    o->gone = 1;
    openai_cancel(o->call);
}

static void openai_done(void *ctx, int code, char *body, size_t len) {
    struct http_openai *o = ctx;
    /* A request whose client left is still answered: the connection frees it. */
    reply_openai(o->srv, o->req, code, body, len);
    free(o);
}

static void route_embeddings(const struct http_call *c) {
    http_server_t *s = c->srv;
    char err[512];
    int status;
    if (!openai_allowed(c)) return;
    if ((status = runtime_accepting(s->rt, err, sizeof err))) {
        openai_error(s, c->req, status_http(status), err, NULL);
        return;
    }
    size_t len;
    int owned;
    unsigned char *body = read_body(s, c->req, &len, &owned, &status, err, sizeof err);
    if (!body || json_has_nul(body, len, err, sizeof err)) {
        openai_error(s, c->req, body ? 400 : status_http(status), err, NULL);
        if (owned) free(body);
        return;
    }
    struct http_openai *o = calloc(1, sizeof *o);
    if (!o) {
        if (owned) free(body);
        openai_error(s, c->req, 500, "out of memory", NULL);
        return;
    }
    o->srv = s;
    o->req = c->req;
    struct openai_env env = {.core = s->core, .repo = s->repo, .thread = c->io->loop,
                             .redis = runtime_loop_redis(c->io->loop)};
    openai_call_t *call = openai_embeddings(&env, (const char *)body, len, openai_done, o);
    if (owned) free(body);
    if (!call) return; /* answered already; o is freed */
    o->call = call;
    c->req->on_hangup = openai_hangup;
    c->req->hangup_arg = o;
}

static void route_openai_models(const struct http_call *c) {
    if (!openai_allowed(c)) return;
    int code;
    size_t len;
    char *body = openai_models(c->srv->repo, c->model, &code, &len);
    reply_openai(c->srv, c->req, code, body, len);
}

static void route_model_ready(const struct http_call *c) {
    char err[512];
    int status = 0;
    struct repo_version *v = repository_acquire(c->srv->repo, c->model, c->version, &status, err, sizeof err);
    if (v && runtime_ready(c->srv->rt)) reply_empty(c->srv, c->req, 200);
    else reply_error(c->srv, c->req, 400, v ? "the server is shutting down" : err);
    repository_release(v);
}

/* GET of a model's configuration or metadata: 404 (or 503) when it is not loaded. */
static void route_model_get(const struct http_call *c, int config) {
    char err[512];
    int status = 0;
    struct repo_version *v = repository_acquire(c->srv->repo, c->model, c->version, &status, err, sizeof err);
    if (!v) reply_status(c->srv, c->req, status, err);
    else if (config) reply_json(c->srv, c->req, 200, model_config_to_json(&v->config));
    else reply_json(c->srv, c->req, 200, http_body_model_metadata(c->srv->repo, v));
    repository_release(v);
}

static void route_model_config(const struct http_call *c) { route_model_get(c, 1); }

static void route_model_metadata(const struct http_call *c) { route_model_get(c, 0); }

#define GET HTTP_GET
#define POST HTTP_POST
static const struct http_route routes[] = {
    /* Inference first: it is most of the traffic, and no other route has its shape. */
    {"/v2/models/{model}/infer", POST, route_infer},
    {"/v2/models/{model}/versions/{version}/infer", POST, route_infer},
    {"/v1/embeddings", POST, route_embeddings},
    {"/v1/models", GET, route_openai_models},
    {"/v1/models/{model}", GET, route_openai_models},
    {"/metrics", GET, route_metrics},
    {"/v2", GET, route_server_metadata},
    {"/v2/health/live", GET, route_live},
    {"/v2/health/ready", GET, route_ready},
    {"/v2/repository/index", POST, route_index},
    {"/v2/repository/models/{model}/load", POST, route_load},
    {"/v2/repository/models/{model}/unload", POST, route_unload},
    {"/v2/models/stats", GET, route_stats},
    {"/v2/models/{model}", GET, route_model_metadata},
    {"/v2/models/{model}/ready", GET, route_model_ready},
    {"/v2/models/{model}/config", GET, route_model_config},
    {"/v2/models/{model}/stats", GET, route_stats},
    {"/v2/models/{model}/versions/{version}", GET, route_model_metadata},
    {"/v2/models/{model}/versions/{version}/ready", GET, route_model_ready},
    {"/v2/models/{model}/versions/{version}/config", GET, route_model_config},
    {"/v2/models/{model}/versions/{version}/stats", GET, route_stats},
    {"/v2/systemsharedmemory/status", GET, route_shm_status},
    {"/v2/systemsharedmemory/unregister", POST, route_shm_unregister},
    {"/v2/systemsharedmemory/region/{region}/status", GET, route_shm_status},
    {"/v2/systemsharedmemory/region/{region}/register", POST, route_shm_register},
    {"/v2/systemsharedmemory/region/{region}/unregister", POST, route_shm_unregister},
    {"/v2/cudasharedmemory/status", GET, route_cuda_shm_status},
    {"/v2/cudasharedmemory/unregister", POST, route_cuda_shm_unregister},
    {"/v2/cudasharedmemory/region/{region}/status", GET, route_cuda_shm_status},
    {"/v2/cudasharedmemory/region/{region}/register", POST, route_cuda_shm_register},
    {"/v2/cudasharedmemory/region/{region}/unregister", POST, route_cuda_shm_unregister},
};
#undef GET
#undef POST

#define MAX_SEGS 12

/* A version in a path: a positive decimal integer. */
static int parse_version(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 1) return -1;
    *out = v;
    return 0;
}

/* Does the path (its n decoded segments) match pattern? Fills the call's parameters. */
static int route_match(const char *pattern, char *const *segs, int n, struct http_call *c) {
    c->model = c->region = NULL;
    c->version = 0;
    int i = 0;
    for (const char *p = pattern; *p == '/'; i++) {
        p++;
        size_t len = strcspn(p, "/");
        if (i == n) return 0;
        if (len == 7 && memcmp(p, "{model}", 7) == 0) c->model = segs[i];
        else if (len == 8 && memcmp(p, "{region}", 8) == 0) c->region = segs[i];
        else if (len == 9 && memcmp(p, "{version}", 9) == 0) {
            if (parse_version(segs[i], &c->version)) return 0;
        } else if (strlen(segs[i]) != len || memcmp(segs[i], p, len) != 0) return 0;
        p += len;
    }
    return i == n;
}

static int method_is(struct http_req *req, int want) {
    int m = req->method;
    if (want == HTTP_GET) return m == HTTP_GET || m == HTTP_HEAD;
    return m == want;
}

static void method_not_allowed(http_server_t *s, struct http_req *req, const char *path, const char *allowed) {
    char msg[600];
    http_req_add_header(req, "Allow", allowed);
    snprintf(msg, sizeof msg, "method not allowed for %.500s: use %s", path, allowed);
    reply_status(s, req, STATUS_METHOD, msg);
}

/* Splits the path into percent-decoded segments (decoded[] owns those that
 * were decoded); n > MAX_SEGS when it has more. Returns -1 when a segment
 * decodes to a NUL byte: "tiny%00x" would read as the C string "tiny". */
static int split_path(const char *path, char *pathbuf, size_t bufsize, char **segs, char **decoded, int *n) {
    *n = 0;
    size_t plen = strnlen(path, bufsize - 1);
    memcpy(pathbuf, path, plen);
    pathbuf[plen] = '\0';
    for (char *save = NULL, *t = strtok_r(pathbuf, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        if (*n == MAX_SEGS) {
            *n = MAX_SEGS + 1;
            break;
        }
        segs[(*n)++] = t;
    }
    for (int i = 0; i < *n && i < MAX_SEGS; i++) {
        if (!strchr(segs[i], '%')) continue; /* nothing to decode: '+' stays '+' in a path */
        size_t dlen = 0;
        decoded[i] = evhttp_uridecode(segs[i], 0, &dlen);
        if (decoded[i]) segs[i] = decoded[i];
        if (decoded[i] && strlen(decoded[i]) != dlen) return -1;
    }
    return 0;
}

void http_route(struct io_thread *io, struct http_req *req) {
    http_server_t *s = io->srv;
    const char *path = req->path;
    char *segs[MAX_SEGS], *decoded[MAX_SEGS] = {0};
    char pathbuf[2048], msg[2300];
    int n;
    if (split_path(path, pathbuf, sizeof pathbuf, segs, decoded, &n)) {
        snprintf(msg, sizeof msg, "the path %.2000s holds an encoded NUL byte (%%00)", path);
        reply_status(s, req, STATUS_INVALID, msg);
        goto out;
    }
    /* A model path with a version that is not one is a bad request, whatever follows. */
    int64_t version;
    if (n >= 5 && n <= MAX_SEGS && strcmp(segs[0], "v2") == 0 && strcmp(segs[1], "models") == 0 &&
        strcmp(segs[3], "versions") == 0 && parse_version(segs[4], &version)) {
        snprintf(msg, sizeof msg, "version '%.100s' of model '%.200s' is not a positive integer", segs[4], segs[2]);
        reply_status(s, req, STATUS_INVALID, msg);
        goto out;
    }
    struct http_call call = {.srv = s, .io = io, .req = req};
    for (size_t i = 0; n <= MAX_SEGS && i < sizeof routes / sizeof routes[0]; i++) {
        if (!route_match(routes[i].pattern, segs, n, &call)) continue;
        if (!method_is(req, routes[i].method))
            method_not_allowed(s, req, path, routes[i].method == HTTP_POST ? "POST" : "GET");
        else routes[i].handle(&call);
        goto out;
    }
    snprintf(msg, sizeof msg, "not found: %.2000s", path);
    reply_status(s, req, STATUS_NOT_FOUND, msg);
out:
    for (int i = 0; i < n && i < MAX_SEGS; i++) free(decoded[i]);
}


/* ==== the loops' sockets ================================================ */

http_server_t *http_server_create(const struct http_server_params *p, char *err, size_t err_len) {
    http_server_t *s = calloc(1, sizeof *s);
    if (!s) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    s->cfg = p->config;
    s->repo = p->repo;
    s->rt = p->runtime;
    s->core = runtime_core(p->runtime);
    s->nthreads = runtime_loops(p->runtime);
    s->io = calloc((size_t)s->nthreads, sizeof *s->io);
    if (!s->io) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        s->nthreads = 0;
        goto fail;
    }
    for (int i = 0; i < s->nthreads; i++) s->io[i].fd = -1;
    s->guard = (struct http_guard_limits){.max_header = CONN_MAX_HEADER, .max_body = (uint64_t)p->config->max_request_size};
    int port = p->config->http_port;
    int probe = listen_socket("http", p->config->http_address, port, 1, &port, err, err_len);
    if (probe < 0) goto fail;
    close(probe);
    for (int i = 0; i < s->nthreads; i++) {
        struct io_thread *io = &s->io[i];
        io->srv = s;
        io->loop = runtime_loop(p->runtime, i);
        io->base = runtime_loop_base(io->loop);
        io->fd = listen_socket("http", p->config->http_address, port, 0, &s->port, err, err_len);
        if (io->fd < 0) goto fail;
        port = s->port; /* the others join the port the first one got */
        /* The guard (http_conn.c) is the one owner of the body and header
         * limits: it refuses a body over --max-request-size and a header
         * over CONN_MAX_HEADER with a JSON answer. */
        if (http_conn_listen(io)) {
            status_set(err, err_len, STATUS_INTERNAL, "libevent could not listen on the HTTP socket");
            goto fail;
        }
    }
    return s;
fail:
    http_server_free(s);
    return NULL;
}

int http_server_port(const http_server_t *s) { return s->port; }

int http_server_unflushed(const http_server_t *s) { return atomic_load(&((http_server_t *)s)->unflushed); }

void http_server_free(http_server_t *s) {
    if (!s) return;
    for (int i = 0; s->io && i < s->nthreads; i++) {
        struct io_thread *io = &s->io[i];
        if (io->listener) evconnlistener_free(io->listener);
        else if (io->fd >= 0) close(io->fd);
        http_conn_close_all(io);
    }
    free(s->io);
    free(s);
}
