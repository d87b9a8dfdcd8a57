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
#include "server/shm.h"

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

/* ---- sharing the I/O threads with another transport (server/grpc.c) ----
 * A second front end runs on the same loops rather than threads of its own:
 * it adds its listeners to these event bases, answers inference through
 * the same core (so the drain's in-flight count sees its requests) and
 * posts completions through the same queues. The bases are used only from
 * their own threads, except through http_server_post. */
struct event_base;
struct infer_core;
struct cache_redis;
int http_server_threads(const http_server_t *s);
struct event_base *http_server_loop_base(http_server_t *s, int i);
/* Loop i's Redis connection (the result cache's tier 2), or NULL. */
struct cache_redis *http_server_loop_redis(http_server_t *s, int i);
/* Runs fn(arg) on I/O thread i, from any thread (infer_reply_i.post). */
void http_server_post(http_server_t *s, int i, void (*fn)(void *), void *arg);
struct infer_core *http_server_core(http_server_t *s);
/* Runs fn(arg) on the control thread, where repository load/unload may
 * block; fn posts its answer back to its I/O thread. Any thread. */
void http_server_control_post(http_server_t *s, void (*fn)(void *), void *arg);
/* 1 once http_server_begin_drain ran. Any thread. */
int http_server_draining(const http_server_t *s);
/* --max-connections counts both front ends' connections: 1 when a new
 * connection takes one of them (give it back with http_server_conn_release
 * when it closes), 0 when all are taken (the refusal is logged, at most one
 * line every 10 s; front says which transport and how it refused). Any thread. */
int http_server_conn_admit(http_server_t *s, const char *front);
void http_server_conn_release(http_server_t *s);
/* The --max-connections in force (held below the open file limit). */
int http_server_max_connections(const http_server_t *s);

#endif
