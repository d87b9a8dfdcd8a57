/* http.h - kiln's HTTP front end: KServe v2 over HTTP/1.1 on libevent.
 *
 * http_server_create attaches to the runtime (server/runtime.h): on each of
 * its I/O loops a listener on its own SO_REUSEPORT socket (the kernel
 * spreads connections over them), and kiln's own HTTP/1.1 connections
 * (server/http_conn.c). Requests are routed by a table of (path
 * pattern, method, handler). An inference request is decoded on its loop
 * and handed to the inference core (server/infer.h), which answers it
 * through the reply interface on the same loop: the core's post() only
 * queues the request's completion job on that loop and wakes it. Model load
 * and unload run on the runtime's control thread. A connection frames its
 * requests with http_guard (framing, body size), and keeps the deadlines
 * and --max-connections.
 *
 * Threads: create before runtime_start and free after runtime_stop, from
 * the thread that owns the runtime (main); unflushed from any thread. */
#ifndef KILN_HTTP_H
#define KILN_HTTP_H

#include <stddef.h>

#include "config/server_config.h"
#include "server/repository.h"
#include "server/runtime.h"

typedef struct http_server http_server_t;

struct http_server_params {
    const struct server_config *config; /* borrowed; outlives the server */
    runtime_t *runtime;                 /* borrowed: the loops, the core, the drain state */
    repository_t *repo;                 /* borrowed */
};

/* Binds --http-address:--http-port on every loop. NULL with err set.
 * Nothing is answered before runtime_start, which commands/serve.c logs as
 * "listening on http://...". */
http_server_t *http_server_create(const struct http_server_params *p, char *err, size_t err_len);
/* The port actually bound (useful with --http-port 0). */
int http_server_port(const http_server_t *s);
/* Inference answers not yet completely written to their sockets. */
int http_server_unflushed(const http_server_t *s);
/* Closes the listeners and every connection; NULL is a no-op. */
void http_server_free(http_server_t *s);

#endif
