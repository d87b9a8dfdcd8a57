/* http_impl.h - private to the HTTP transport (http.c, http_conn.c): the
 * server, its I/O threads, and the connection layer's entry points.
 *
 * Each I/O thread owns an event_base, an evhttp on its own listening
 * socket, a completion queue other threads post to (io_post in http.c) and
 * its Redis connection. Connections pass through http_conn.c's filter
 * bufferevent (http_guard's framing check, deadlines, --max-connections)
 * before evhttp parses them. */
#ifndef KILN_HTTP_IMPL_H
#define KILN_HTTP_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "cache/cache.h"
#include "config/server_config.h"
#include "server/http.h"
#include "server/http_guard.h"
#include "server/infer.h"
#include "server/repository.h"

struct event_base;
struct evhttp;
struct event;
struct bufferevent;
struct evconnlistener;

/* The largest request header a connection may send. */
#define CONN_MAX_HEADER (64 * 1024)
/* accept() failed (no fd left): wait this long before the next try. */
#define ACCEPT_PAUSE_MS 50

struct job {
    void (*fn)(void *arg);
    void *arg;
    struct job *next;
};

struct io_thread {
    http_server_t *srv;
    int index;
    struct event_base *base;
    struct evhttp *http;
    struct event *wake;          /* activated by other threads to run the queue */
    pthread_mutex_t qlock;
    struct job *qhead, *qtail;
    int fd;
    pthread_t tid;
    cache_redis_t *redis;        /* this loop's Redis connection (result cache tier 2) */
};

struct http_server {
    const struct server_config *cfg;
    repository_t *repo;
    char backend[16];
    int port;
    int nthreads;
    struct io_thread *io;
    atomic_int draining;
    atomic_int unflushed;        /* answered, bytes not yet all written */
    atomic_int conns;            /* admitted connections open (shed ones not counted) */
    int max_conns;               /* --max-connections, or derived from the open file limit */
    struct http_guard_limits guard;
    infer_core_t *core;          /* a request's life past its decoding; owns the result cache */

    /* Control thread: load/unload and polling, which block. */
    pthread_t control_tid;
    pthread_mutex_t clock;
    pthread_cond_t ccond;
    struct job *chead, *ctail;
    int cstop;
    int control_started;
};

/* evhttp's bufferevent callback (evhttp_set_bevcb, arg = the io_thread):
 * the connection's filter over its socket, or NULL for a plain one. A
 * connection over --max-connections is answered 503 and closed. */
struct bufferevent *http_conn_new(struct event_base *base, void *arg);
/* The listener's error callback: sheds a waiting connection with the spare
 * descriptor at the open file limit, else pauses accepting. */
void http_conn_accept_error(struct evconnlistener *lev, void *arg);
/* The calling I/O thread's spare descriptor: open it at the thread's start,
 * close it at its end. */
void http_conn_spare_open(void);
void http_conn_spare_close(void);
/* Descriptors an explicit --max-connections leaves to everything else. */
#define HTTP_CONN_FD_RESERVE 64
/* --max-connections (held below the open file limit), or what the open file
 * limit (*fd_limit) leaves. */
int http_conn_max(const struct server_config *cfg, long long *fd_limit);

#endif
