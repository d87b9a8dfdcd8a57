/* bench_grpc.c - `kiln bench`'s gRPC client: see bench_grpc.h.
 *
 * nghttp2's client session drives one connection; its output goes to the
 * bufferevent as nghttp2 produces it, and what the socket reads goes back
 * in from the read callback. A call is one stream: HEADERS, the message in
 * DATA with END_STREAM, and the answer's trailers carry grpc-status. The
 * answer's message is not decoded: a load generator only needs its status. */
#include "commands/bench_grpc.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "server/grpc.h"
#include "triton/grpc_service.pb-c.h"

/* Windows large enough that a big answer never waits for an update. */
#define WINDOW (16 << 20)

struct call {
    bench_grpc_done_fn done;
    void *arg;
    const uint8_t *msg;
    size_t len, off;
    int32_t id;
    int status;              /* -1 until the trailers say */
    char message[200];
    struct call *next, *prev;
};

struct bench_grpc_conn {
    struct bufferevent *bev;
    nghttp2_session *h2;
    char authority[300];
    int dead;
    int busy;                /* inside nghttp2_session_mem_recv */
    struct call *calls;
};

static void call_end(bench_grpc_conn_t *c, struct call *k) {
    if (k->prev) k->prev->next = k->next;
    else c->calls = k->next;
    if (k->next) k->next->prev = k->prev;
    k->done(k->arg, k->status, k->message);
    free(k);
}

/* The connection failed: every open call ends with -1, and nghttp2 hears
 * nothing more from it. */
static void conn_fail(bench_grpc_conn_t *c) {
    c->dead = 1;
    if (c->bev) bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    while (c->calls) {
        struct call *k = c->calls;
        nghttp2_session_set_stream_user_data(c->h2, k->id, NULL);
        k->status = -1;
        call_end(c, k);
    }
}

static void conn_send(bench_grpc_conn_t *c) {
    if (!c->dead && !c->busy && nghttp2_session_send(c->h2) != 0) conn_fail(c);
}

/* ==== nghttp2's callbacks ================================================ */

static ssize_t send_cb(nghttp2_session *h2, const uint8_t *data, size_t len, int flags, void *user) {
    bench_grpc_conn_t *c = user;
    if (evbuffer_add(bufferevent_get_output(c->bev), data, len)) return NGHTTP2_ERR_CALLBACK_FAILURE;
    return (ssize_t)len;
}

static int header_cb(nghttp2_session *h2, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user) {
    struct call *k = nghttp2_session_get_stream_user_data(h2, frame->hd.stream_id);
    if (!k) return 0;
    if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0) {
        char v[16];
        snprintf(v, sizeof v, "%.*s", (int)(valuelen < 15 ? valuelen : 15), (const char *)value);
        k->status = atoi(v);
    } else if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0) {
        snprintf(k->message, sizeof k->message, "%.*s", (int)(valuelen < 199 ? valuelen : 199), (const char *)value);
    }
    return 0;
}

static int stream_close_cb(nghttp2_session *h2, int32_t id, uint32_t error_code, void *user) {
    struct call *k = nghttp2_session_get_stream_user_data(h2, id);
    if (!k) return 0;
    nghttp2_session_set_stream_user_data(h2, id, NULL);
    if (k->status < 0 && !k->message[0])
        snprintf(k->message, sizeof k->message, "the stream ended without a grpc-status (HTTP/2 error %u)", error_code);
    call_end(user, k);
    return 0;
}

static ssize_t data_read_cb(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                            nghttp2_data_source *src, void *user) {
    struct call *k = src->ptr;
    size_t n = k->len - k->off < len ? k->len - k->off : len;
    memcpy(buf, k->msg + k->off, n);
    k->off += n;
    if (k->off == k->len) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* ==== the connection ===================================================== */

static void read_cb(struct bufferevent *bev, void *arg) {
    bench_grpc_conn_t *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t n = evbuffer_get_length(in);
    c->busy = 1;
    ssize_t used = nghttp2_session_mem_recv(c->h2, evbuffer_pullup(in, -1), n);
    c->busy = 0;
    if (used < 0) {
        fprintf(stderr, "kiln bench: gRPC connection: %s\n", nghttp2_strerror((int)used));
        conn_fail(c);
        return;
    }
    evbuffer_drain(in, (size_t)used);
    conn_send(c);
}

static void event_cb(struct bufferevent *bev, short what, void *arg) {
    bench_grpc_conn_t *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return;
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) conn_fail(c);
}

static nghttp2_session_callbacks *callbacks(void) {
    static nghttp2_session_callbacks *cb;
    if (!cb && nghttp2_session_callbacks_new(&cb) == 0) {
        nghttp2_session_callbacks_set_send_callback(cb, send_cb);
        nghttp2_session_callbacks_set_on_header_callback(cb, header_cb);
        nghttp2_session_callbacks_set_on_stream_close_callback(cb, stream_close_cb);
    }
    return cb;
}

bench_grpc_conn_t *bench_grpc_connect(struct event_base *base, const char *host, int port, int timeout_ms) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc) {
        fprintf(stderr, "kiln bench: %s: %s\n", host, gai_strerror(rc));
        return NULL;
    }
    bench_grpc_conn_t *c = calloc(1, sizeof *c);
    nghttp2_session_callbacks *cb = callbacks();
    if (c) c->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!c || !c->bev || !cb || nghttp2_session_client_new(&c->h2, cb, c) != 0) {
        fprintf(stderr, "kiln bench: out of memory opening a gRPC connection\n");
        if (c && c->bev) bufferevent_free(c->bev);
        free(c);
        freeaddrinfo(ai);
        return NULL;
    }
    snprintf(c->authority, sizeof c->authority, "%s:%d", host, port);
    bufferevent_setcb(c->bev, read_cb, NULL, event_cb, c);
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    bufferevent_set_timeouts(c->bev, &tv, NULL);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, WINDOW}, {NGHTTP2_SETTINGS_ENABLE_PUSH, 0}};
    nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, 2);
    nghttp2_session_set_local_window_size(c->h2, NGHTTP2_FLAG_NONE, 0, WINDOW);
    if (bufferevent_socket_connect(c->bev, ai->ai_addr, (int)ai->ai_addrlen) != 0) c->dead = 1;
    freeaddrinfo(ai);
    conn_send(c);
    return c;
}

#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), strlen(n), strlen(v), NGHTTP2_NV_FLAG_NO_COPY_NAME}

int bench_grpc_call(bench_grpc_conn_t *c, const char *path, const uint8_t *msg, size_t len, bench_grpc_done_fn done,
                    void *arg) {
    if (c->dead) return -1;
    struct call *k = calloc(1, sizeof *k);
    if (!k) return -1;
    *k = (struct call){.done = done, .arg = arg, .msg = msg, .len = len, .status = -1};
    const nghttp2_nv hdrs[] = {NV(":method", "POST"), NV(":scheme", "http"), NV(":path", path),
                               NV(":authority", c->authority), NV("content-type", "application/grpc"),
                               NV("te", "trailers")};
    nghttp2_data_provider prd = {.source.ptr = k, .read_callback = data_read_cb};
    int32_t id = nghttp2_submit_request(c->h2, NULL, hdrs, sizeof hdrs / sizeof hdrs[0], &prd, k);
    if (id < 0) {
        free(k);
        return -1;
    }
    k->id = id;
    k->next = c->calls;
    if (c->calls) c->calls->prev = k;
    c->calls = k;
    conn_send(c);
    return 0;
}

void bench_grpc_free(bench_grpc_conn_t *c) {
    if (!c) return;
    conn_fail(c);
    nghttp2_session_del(c->h2);
    bufferevent_free(c->bev);
    free(c);
}

/* ==== the request ======================================================== */

uint8_t *bench_grpc_infer_request(const char *model, const char *version, const char *const *names,
                                  const struct tensor *t, int n, size_t *len) {
    Inference__ModelInferRequest q = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor *ins = calloc((size_t)n + 1, sizeof *ins);
    Inference__ModelInferRequest__InferInputTensor **inp = calloc((size_t)n + 1, sizeof *inp);
    ProtobufCBinaryData *raw = calloc((size_t)n + 1, sizeof *raw);
    uint8_t *buf = NULL;
    if (!ins || !inp || !raw) goto done;
    q.model_name = (char *)model;
    q.model_version = (char *)(version ? version : "");
    for (int i = 0; i < n; i++) {
        inference__model_infer_request__infer_input_tensor__init(&ins[i]);
        ins[i].name = (char *)names[i];
        ins[i].datatype = (char *)dtype_kserve_name(t[i].dtype);
        ins[i].n_shape = (size_t)t[i].ndim;
        ins[i].shape = (int64_t *)t[i].dims;
        inp[i] = &ins[i];
        raw[i].data = t[i].data;
        raw[i].len = tensor_nbytes(&t[i]);
    }
    q.n_inputs = q.n_raw_input_contents = (size_t)n;
    q.inputs = inp;
    q.raw_input_contents = raw;
    buf = grpc_frame(&q.base, len);
done:
    free(ins);
    free(inp);
    free(raw);
    return buf;
}
