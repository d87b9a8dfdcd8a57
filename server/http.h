/* http.h - kiln's HTTP front end: KServe v2 over libevent.
 *
 * http_server_create binds the listening address and starts N I/O threads,
 * each with its own event_base and evhttp on its own SO_REUSEPORT socket (the
 * kernel spreads connections over them), plus one control thread for model
 * load/unload and repository polling, which may block. Requests are routed
 * by a table of (path pattern, method, handler). An inference request is
 * decoded on its I/O thread and handed to the inference core
 * (server/infer.h), which answers it through the reply interface on the same
 * I/O thread: the core's post() only queues a completion on that thread's
 * queue and wakes its loop. Connections pass through http_guard (framing,
 * deadlines, --max-connections) before evhttp reads them.
 *
 * Threads: create/free from one thread (main); begin_drain and inflight from
 * any thread. */
#ifndef KILN_HTTP_H
#define KILN_HTTP_H

#include <stddef.h>

#include "config/server_config.h"
#include "server/repository.h"

typedef struct http_server http_server_t;

struct http_server_params {
    const struct server_config *config; /* borrowed; outlives the server */
    repository_t *repo;                 /* borrowed */
    const char *backend;                /* "cpu" or "cuda", for logs and metadata */
};

http_server_t *http_server_create(const struct http_server_params *p, char *err, size_t err_len);
/* The port actually bound (useful with --http-port 0). */
int http_server_port(const http_server_t *s);
/* Ready turns false; new inference and control requests get 503 and every
 * answer carries "Connection: close". Requests already accepted complete. */
void http_server_begin_drain(http_server_t *s);
/* Inference requests accepted and not yet answered. */
int http_server_inflight(const http_server_t *s);
/* Inference answers not yet completely written to their sockets. */
int http_server_unflushed(const http_server_t *s);
/* Stops the loops, closes every connection, joins the threads; NULL is a no-op. */
void http_server_free(http_server_t *s);

#endif
