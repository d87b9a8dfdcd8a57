/* http_impl.h - private to the HTTP transport (http.c, http_conn.c): the
 * server, its I/O threads, the request a connection hands to the router,
 * and the connection layer's entry points.
 *
 * On each of the runtime's loops (server/runtime.h) the server listens on
 * its own socket (SO_REUSEPORT). http_conn.c is the HTTP/1.1 connection
 * (framing by http_guard, deadlines, --max-connections, answers); http.c
 * routes each request and answers it through http_req_reply. */
#ifndef KILN_HTTP_IMPL_H
#define KILN_HTTP_IMPL_H

#include <stdatomic.h>

#include "cache/cache.h"
#include "config/server_config.h"
#include "server/http.h"
#include "server/http_guard.h"
#include "server/infer.h"
#include "server/repository.h"
#include "server/runtime.h"
#include "server/shm.h"
#include "common/buf.h"

struct event_base;
struct evbuffer;
struct evconnlistener;
struct http_conn;

/* The largest request header a connection may send. */
#define CONN_MAX_HEADER (64 * 1024)
/* accept() failed (no fd left): wait this long before the next try. */
#define ACCEPT_PAUSE_MS 50

/* The front end on one of the runtime's loops. */
struct io_thread {
    http_server_t *srv;
    struct runtime_loop *loop;
    struct event_base *base;     /* the loop's */
    struct evconnlistener *listener;
    int fd;                      /* the listening socket until the listener owns it */
    struct http_conn *conns;     /* open connections */
};

/* A header field of a request: name and value NUL-terminated (the value
 * without the whitespace around it). */
struct http_field {
    const char *name, *value;
};

/* A request, from its connection (one at a time per connection): valid
 * until http_req_reply. The body is de-chunked; path and query are the
 * target's parts, not percent-decoded. */
struct http_req {
    struct http_conn *conn;
    int method;                  /* enum http_method (server/http_guard.h) */
    int minor;                   /* HTTP/1.minor */
    const char *target, *path, *query; /* query: after '?', or NULL */
    const struct http_field *fields;
    int nfields;
    struct evbuffer *body;
    struct evbuffer *out;        /* the answer's body, filled by the handler */
    struct buf ohdr;             /* header lines the handler adds (http_req_add_header) */
    int close;                   /* the connection closes after the answer */
    int keep_alive_10;           /* HTTP/1.0 with Connection: keep-alive */
    /* The client went away while the request was served: called once, on
     * the loop; the handler still answers (http_req_reply frees then). */
    void (*on_hangup)(void *arg);
    void *hangup_arg;
    /* The answer's bytes are all in the kernel. */
    void (*on_flushed)(void *arg);
    void *flushed_arg;
};

/* The first header field named name (any case), or NULL; how many there are. */
const char *http_req_header(const struct http_req *r, const char *name);
int http_req_header_count(const struct http_req *r, const char *name);
/* A header line on the answer. */
void http_req_add_header(struct http_req *r, const char *name, const char *value);
/* Sends the answer: the status line with code's reason phrase, Date,
 * Content-Type (ctype, else application/json where a body may be), the
 * Content-Length of r->out, the handler's headers, then r->out (not for
 * HEAD). The connection goes on with its next request, or closes. */
void http_req_reply(struct http_req *r, int code, const char *ctype);
/* The connection's shared-memory scope (server/shm.h). */
shm_owner_t http_req_shm_owner(const struct http_req *r);

/* The router (http.c): called once per complete request, on its loop. */
void http_route(struct io_thread *io, struct http_req *req);

struct http_server {
    const struct server_config *cfg;
    repository_t *repo;
    runtime_t *rt;
    int port;
    int nthreads;
    struct io_thread *io;
    atomic_int unflushed;        /* answered, bytes not yet all written */
    struct http_guard_limits guard;
    infer_core_t *core;          /* a request's life past its decoding; owns the result cache */
};

/* Accepts connections on io->fd (the listener owns it then). A connection
 * over --max-connections is answered 503 and closed; at the open file
 * limit a waiting one is shed with the spare descriptor, else accepting
 * pauses. 0, or -1 when libevent could not make the listener. */
int http_conn_listen(struct io_thread *io);
/* Closes every connection of io (its loop has stopped). */
void http_conn_close_all(struct io_thread *io);
#endif
