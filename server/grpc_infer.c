/* grpc_infer.c - ModelInfer and ModelStreamInfer through the inference core.
 *
 * A ModelInferRequest is decoded (grpc_codec.c) into the same struct
 * kserve_request HTTP fills (server/kserve.h), so the core checks it the
 * same way (names, data types, shapes: kserve_request_bind's messages) and
 * runs it through the same cache, batcher and statistics.
 *
 * A streaming call may have many requests in the core at once; each answer
 * is a ModelStreamInferResponse sent as it finishes, an error as its
 * error_message, and the stream ends once the client half-closed and the
 * last one answered. */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "server/access.h"
#include "server/grpc_impl.h"
#include "triton/grpc_service.pb-c.h"

/* One request in the core: the reply interface's ctx. */
struct grpc_infer {
    struct grpc_stream *st;      /* NULL once the stream is gone */
    struct grpc_loop *loop;
    struct infer_request *r;
    int streaming;
    uint8_t *reply;              /* the framed answer, between encode and send */
    size_t reply_len;
    struct grpc_infer *next, *prev;
};

/* ==== the reply interface ================================================ */

static int infer_encode(void *ctx, const struct infer_result *res, char *err, size_t err_len) {
    struct grpc_infer *c = ctx;
    struct grpc_pool pool = {0};
    int rc = grpc_infer_response_encode(res, c->streaming, &pool, &c->reply, &c->reply_len, err, err_len);
    grpc_pool_free(&pool);
    if (rc == STATUS_NOMEM) status_set(err, err_len, rc, "out of memory encoding the response");
    return rc;
}

static void call_unlink(struct grpc_infer *c) {
    struct grpc_stream *st = c->st;
    if (c->prev) c->prev->next = c->next;
    else st->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    st->ncalls--;
}

/* A streaming call's error is a message of the stream, not its end. */
static void stream_error(struct grpc_stream *st, const char *msg) {
    Inference__ModelStreamInferResponse sm = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    sm.error_message = (char *)msg;
    size_t len;
    uint8_t *buf = grpc_frame(&sm.base, &len);
    if (buf) grpc_stream_queue(st, buf, len);
}

static void infer_send(void *ctx, int status, const char *msg) {
    struct grpc_infer *c = ctx;
    struct grpc_stream *st = c->st;
    uint8_t *reply = c->reply;
    size_t len = c->reply_len;
    int streaming = c->streaming;
    if (st) call_unlink(c);
    free(c);
    if (!st) {
        free(reply);
        return;
    }
    if (!streaming) {
        if (status) {
            free(reply);
            grpc_stream_finish(st, status, msg);
            return;
        }
        grpc_stream_queue(st, reply, len);
        grpc_stream_finish(st, STATUS_OK, NULL);
        return;
    }
    if (status) {
        free(reply);
        stream_error(st, msg);
    } else grpc_stream_queue(st, reply, len);
    if (st->remote_done && st->ncalls == 0) grpc_stream_finish(st, STATUS_OK, NULL);
    else grpc_stream_flush(st);
}

static const struct infer_reply_i grpc_infer_reply = {runtime_post_any, infer_encode, infer_send};

/* ==== the RPCs =========================================================== */

static void start(struct grpc_stream *st, const uint8_t *msg, size_t len, int streaming) {
    grpc_server_t *s = grpc_stream_server(st);
    const char *nul = grpc_strings_nul(&inference__model_infer_request__descriptor, msg, len);
    if (nul) {
        char e[160];
        snprintf(e, sizeof e, "the request's string field '%s' holds a NUL byte: names and parameters may not", nul);
        if (streaming) stream_error(st, e);
        else grpc_stream_errorf(st, STATUS_INVALID, "%s", e);
        return;
    }
    Inference__ModelInferRequest *q = inference__model_infer_request__unpack(NULL, len, msg);
    if (!q) {
        if (streaming) stream_error(st, "the request is not a valid ModelInferRequest message");
        else grpc_stream_errorf(st, STATUS_INVALID, "the request is not a valid ModelInferRequest message");
        return;
    }
    char err[512];
    int status = 0;
    int64_t version = 0;
    if (q->model_version && *q->model_version) {
        char *end;
        long long v = strtoll(q->model_version, &end, 10);
        version = *end || v < 1 ? -1 : v;
    }
    if (version < 0)
        status = status_set(err, sizeof err, STATUS_INVALID, "version '%.100s' of model '%.200s' is not a positive integer",
                            q->model_version, q->model_name);
    else status = runtime_accepting(s->rt, err, sizeof err);
    struct grpc_infer *c = status ? NULL : calloc(1, sizeof *c);
    if (!status && !c) status = status_set(err, sizeof err, STATUS_NOMEM, "out of memory");
    struct grpc_loop *l = grpc_stream_loop(st);
    if (c) {
        *c = (struct grpc_infer){.st = st, .loop = l, .streaming = streaming};
        c->r = infer_request_begin(s->core, q->model_name ? q->model_name : "", version, &grpc_infer_reply, c, l->rl,
                                   runtime_loop_redis(l->rl), &status, err, sizeof err);
        if (!c->r) {
            free(c);
            c = NULL;
        }
    }
    if (!c) {
        inference__model_infer_request__free_unpacked(q, NULL);
        if (streaming) stream_error(st, err);
        else grpc_stream_finish(st, status, err);
        return;
    }
    c->next = st->calls;
    if (st->calls) st->calls->prev = c;
    st->calls = c;
    st->ncalls++;
    infer_request_set_deadline(c->r, st->deadline_ns);
    infer_request_set_shm_owner(c->r, access_shm_owner(s->cfg, st->authorization, shm_owner_of(st->conn)));
    int rc = grpc_infer_request_decode(infer_request_decoded(c->r), q, err, sizeof err);
    inference__model_infer_request__free_unpacked(q, NULL);
    if (rc) infer_request_fail(c->r, rc, err);
    else infer_request_start(c->r);
}

void grpc_model_infer(struct grpc_stream *st, const uint8_t *msg, size_t len) { start(st, msg, len, 0); }

void grpc_model_stream_infer(struct grpc_stream *st, const uint8_t *msg, size_t len) { start(st, msg, len, 1); }

void grpc_infer_stream_done(struct grpc_stream *st) {
    if (st->ncalls == 0) grpc_stream_finish(st, STATUS_OK, NULL);
}

void grpc_infer_detach(struct grpc_stream *st) {
    for (struct grpc_infer *c = st->calls; c; c = c->next) {
        c->st = NULL;
        infer_request_cancel(c->r);
    }
    st->calls = NULL;
    st->ncalls = 0;
}
