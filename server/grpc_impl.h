/* grpc_impl.h - private to the gRPC transport: grpc_conn.c (listeners,
 * HTTP/2 connections and streams), grpc_service.c (the method table and
 * the RPCs other than inference), grpc_infer.c (ModelInfer and
 * ModelStreamInfer through the inference core), grpc_codec.c (messages:
 * inference requests and responses, framing) and grpc_json.c (protobuf
 * messages built from the JSON bodies HTTP serves).
 *
 * Everything here runs on the I/O thread that owns the connection. */
#ifndef KILN_GRPC_IMPL_H
#define KILN_GRPC_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "common/status.h"
#include "server/grpc.h"
#include "server/infer.h"

struct event_base;
struct evconnlistener;
struct evbuffer;
struct bufferevent;
typedef struct nghttp2_session nghttp2_session;
typedef struct cJSON cJSON;

/* Streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS). */
#define GRPC_MAX_STREAMS 128

struct grpc_conn;
struct grpc_infer;
struct grpc_control;

struct grpc_loop {
    grpc_server_t *srv;
    struct runtime_loop *rl;     /* the runtime's loop it runs on */
    struct event_base *base;     /* the loop's */
    struct runtime_job drain;    /* tells the Watch calls, once the drain began */
    struct evconnlistener *lev;
    int fd;
    struct grpc_conn *conns;     /* open connections, for the close at exit */
    struct grpc_stream *watchers; /* grpc.health.v1 Watch calls, linked by wnext/wprev */
};

struct grpc_server {
    const struct server_config *cfg;
    repository_t *repo;
    runtime_t *rt;
    infer_core_t *core;
    int port;
    size_t max_message;          /* --grpc-max-message-size: the largest request message */
    size_t max_buffered;         /* --grpc-max-buffered-bytes: one connection's unfinished request bytes */
    size_t max_buffered_total;   /* --grpc-max-buffered-total: every connection's together */
    atomic_size_t buffered;      /* unfinished request bytes held now, all loops (buffer capacity) */
    int idle_secs, header_secs, body_secs; /* the HTTP front end's deadlines (0 = none) */
    int nloops;
    struct grpc_loop *loops;
    void *h2_callbacks;          /* nghttp2_session_callbacks *, shared by every connection */
    void *h2_options;            /* nghttp2_option *: the flood limits, shared too */
};

/* A stream's request bytes not yet taken as messages: one block, malloc'd
 * while small and mmap'd once large, so that what a slow or abandoned call
 * held goes back to the system when it is released rather than staying in
 * the allocator's arenas. */
struct grpc_inbuf {
    uint8_t *data;
    size_t off, len, cap;        /* data[off..len) unread; cap bytes reserved (counted against the limits) */
    uint64_t since_ns;           /* when the message in progress began (clock_now_ns); 0 = none */
};

/* One RPC: an HTTP/2 stream. */
struct grpc_stream {
    struct grpc_conn *conn;
    int32_t id;
    const struct grpc_method *method;
    char *path;
    char *authorization;         /* the "authorization" header, for load and unload */
    uint64_t deadline_ns;        /* from grpc-timeout (clock_now_ns); 0 = none */
    size_t header_bytes;         /* of the request's header list, as SETTINGS_MAX_HEADER_LIST_SIZE counts */
    int bad_request;             /* a header made the call unanswerable except by an error */
    int coding_in;               /* grpc-encoding: enum http_coding, or -1 for one kiln lacks */
    char *coding_unknown;        /* that grpc-encoding's value, for the error */
    unsigned coding_accepted;    /* grpc-accept-encoding: bit 1 << enum http_coding per coding named */
    int coding_out;              /* the answer's messages: the request's coding when the client accepts it */
    uint8_t *plain;              /* the inflated message a handler is reading (malloc'd), or NULL */
    struct grpc_inbuf in;        /* request bytes not yet taken as messages */
    uint64_t opened_ns;          /* its HEADERS began (clock_now_ns) */
    int headers_done;            /* the request's header block arrived whole */
    int handling;                /* a handler is reading a message in in: it stays until it returns */
    struct evbuffer *out;        /* framed answers nghttp2 has not taken yet */
    int started;                 /* response headers submitted */
    int finished;                /* grpc-status decided: trailers follow the data */
    int code;
    char *message;
    int remote_done;             /* the client half-closed the stream */
    struct grpc_infer *calls;    /* inference requests in the core */
    int ncalls;
    struct grpc_control *control; /* a load or unload on the control thread */
    int watch_status;            /* a Watch call's last status sent; 0 = not watching */
    struct grpc_stream *wnext, *wprev;
    struct grpc_stream *next, *prev;
};

/* A method of inference.GRPCInferenceService. A unary method's handler
 * runs once, with the one request message, when the client half-closes;
 * a streaming method's runs for each message as it arrives, and its
 * stream ends after the client half-closed and every call answered. */
struct grpc_method {
    const char *name;
    int streaming;
    void (*handle)(struct grpc_stream *st, const uint8_t *msg, size_t len);
};

/* Looks a request's :path up; NULL when no handler serves it. */
const struct grpc_method *grpc_method_find(const char *path);

/* ---- grpc_conn.c: answering a stream ---- */
/* The server the stream's connection belongs to, and its loop. */
grpc_server_t *grpc_stream_server(const struct grpc_stream *st);
struct grpc_loop *grpc_stream_loop(const struct grpc_stream *st);
/* Queues one message (a packed protobuf message with its 5-byte gRPC
 * prefix, made by grpc_frame); takes buf. Nothing is sent yet. */
void grpc_stream_queue(struct grpc_stream *st, uint8_t *buf, size_t len);
/* Sends what was queued. Sending may close the connection (the peer is
 * gone), freeing st: the calls that send (this, finish, reply, errorf) come
 * last in their caller's use of st. */
void grpc_stream_flush(struct grpc_stream *st);
/* Sends what every connection of the loop queued (each may close). */
void grpc_loop_flush(struct grpc_loop *l);
/* Ends the call: the gRPC code of status (common/status.h) and grpc-message
 * msg (NULL = none) in the trailers, after what was queued. Once per stream. */
void grpc_stream_finish(struct grpc_stream *st, int status, const char *msg);
/* Sends m and ends the call with OK. */
void grpc_stream_reply(struct grpc_stream *st, const ProtobufCMessage *m);
/* Ends the call with status and a message formatted like printf. */
void grpc_stream_errorf(struct grpc_stream *st, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- grpc_service.c ---- */
/* The stream is going away: a load or unload still running answers nobody,
 * and a health Watch stops. */
void grpc_control_detach(struct grpc_stream *st);
void grpc_health_detach(struct grpc_stream *st);
/* The serving status changed (the drain began): the loop's Watch calls
 * hear it. On the loop's thread. */
void grpc_health_notify(struct grpc_loop *l);

/* ---- grpc_codec.c: messages, no connection ---- */
/* The 5-byte prefix of a message of n bytes at h: the compressed flag (0
 * or 1), then the length, big-endian. */
void grpc_prefix_write(uint8_t *h, int compressed, size_t n);
struct Inference__ModelInferRequest;
struct kserve_request;
/* Allocations freed together (a reply's message tree). */
struct grpc_pool {
    void *blocks;
};
void *grpc_pool_alloc(struct grpc_pool *p, size_t size); /* zeroed; NULL when out of memory */
char *grpc_pool_strdup(struct grpc_pool *p, const char *s);
void grpc_pool_free(struct grpc_pool *p);
/* Fills r (zeroed; the caller clears it) from q: the inputs' bytes copied
 * into their tensors, the outputs asked for, the parameters kiln knows.
 * Errors name the field, as HTTP's do (STATUS_INVALID, err set). */
int grpc_infer_request_decode(struct kserve_request *r, const struct Inference__ModelInferRequest *q, char *err,
                              size_t err_len);
/* The ModelInferResponse for res, framed, in a ModelStreamInferResponse when
 * streaming: *out malloc'd; the message tree in pool (the caller frees it). */
int grpc_infer_response_encode(const struct infer_result *res, int streaming, struct grpc_pool *pool, uint8_t **out,
                               size_t *out_len, char *err, size_t err_len);
/* grpc.health.v1.HealthCheckRequest's service field, decoded without
 * generated code (the message is one string): 0 with *service pointing into
 * msg (not NUL-terminated, *len bytes), or -1 when msg is not that message. */
int grpc_health_request_service(const uint8_t *msg, size_t len, const uint8_t **service, size_t *service_len);
/* The name of the first string field (of message type d, nested messages
 * and map entries included) whose bytes in msg hold a NUL, or NULL. protobuf-c
 * ends each string at its length with a NUL and keeps no length, so a name
 * "x\0junk" would read as "x": such a request is refused before it is
 * unpacked. A malformed msg gives NULL (the unpack refuses it). */
const char *grpc_strings_nul(const ProtobufCMessageDescriptor *d, const uint8_t *msg, size_t len);

/* ---- grpc_infer.c ---- */
void grpc_model_infer(struct grpc_stream *st, const uint8_t *msg, size_t len);
void grpc_model_stream_infer(struct grpc_stream *st, const uint8_t *msg, size_t len);
/* The stream is going away: its calls answer nobody when they finish, and
 * those still queued are cancelled. */
void grpc_infer_detach(struct grpc_stream *st);
/* A streaming call's client half-closed: ends it once its calls answered. */
void grpc_infer_stream_done(struct grpc_stream *st);

/* ---- grpc_json.c ---- */
/* The message of type d whose fields are j's members (proto field names, as
 * Triton's JSON uses them): objects become messages or map entries, arrays
 * repeated fields, strings enum values by name. Members with no field are
 * skipped. NULL when out of memory or when j is not an object. */
ProtobufCMessage *grpc_json_message(const ProtobufCMessageDescriptor *d, const cJSON *j, struct grpc_pool *p);
/* Answers st with the message that j describes (NULL j: out of memory) and deletes j. */
void grpc_stream_reply_json(struct grpc_stream *st, const ProtobufCMessageDescriptor *d, cJSON *j);

#endif
