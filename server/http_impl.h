/* http_impl.h - private to the HTTP transport (http.c, http_conn.c): the
 * server, its I/O threads, and the connection layer's entry points.
 *
 * On each of the runtime's loops (server/runtime.h) the server has an
 * evhttp on its own listening socket. Connections pass through http_conn.c's
 * filter bufferevent (http_guard's framing and body size checks, deadlines,
 * --max-connections) before evhttp parses them. */
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

struct event_base;
struct evhttp;
struct event;
struct bufferevent;
struct evconnlistener;

/* The largest request header a connection may send. */
#define CONN_MAX_HEADER (64 * 1024)
/* accept() failed (no fd left): wait this long before the next try. */
#define ACCEPT_PAUSE_MS 50

/* The front end on one of the runtime's loops. */
struct io_thread {
    http_server_t *srv;
    struct runtime_loop *loop;
    struct event_base *base;     /* the loop's */
    struct evhttp *http;
    int fd;
};

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

/* evhttp's bufferevent callback (evhttp_set_bevcb, arg = the io_thread):
 * the connection's filter over its socket, or NULL for a plain one. A
 * connection over --max-connections is answered 503 and closed. */
struct bufferevent *http_conn_new(struct event_base *base, void *arg);
/* The listener's error callback: sheds a waiting connection with the spare
 * descriptor at the open file limit, else pauses accepting. */
void http_conn_accept_error(struct evconnlistener *lev, void *arg);
#endif
