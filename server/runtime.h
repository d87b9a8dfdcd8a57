/* runtime.h - the threads every front end runs on: N I/O loops, each an
 * event_base on its own thread with a job queue other threads post to and
 * its own Redis connection (the result cache's tier 2), and one control
 * thread for what may block (model load and unload, repository polling).
 * It also holds what the front ends share: the drain state and the
 * --max-connections count.
 *
 * commands/serve.c makes the inference core, then the runtime, and the
 * front ends (HTTP, gRPC) attach to it as peers: each adds its listeners to
 * the loops' event bases and answers on them; none owns the threads.
 *
 * Jobs are libuv-style: a struct runtime_job lives inside the object it
 * completes (a request, a control call), so posting allocates nothing and
 * cannot fail. A job's drop, when the runtime is freed before it ran,
 * releases what the job's arg holds; each job type brings its own.
 *
 * Life: runtime_create (bases, queues, Redis; no thread yet), the front
 * ends attach (they may use the bases directly: nothing runs), runtime_start
 * (threads), ... runtime_stop (the threads end after the jobs queued before
 * the call; nothing runs after it returns), the front ends free what they
 * put on the bases, runtime_free (drops the jobs still queued, frees the
 * bases).
 *
 * Threads: create, start, stop and free from one thread (main); post,
 * control_post, leave, ready, draining, begin_drain and conn_* from any thread; a loop's
 * base and Redis connection only on that loop's thread once started. */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include <stddef.h>

#include "config/server_config.h"
#include "server/repository.h"

typedef struct runtime runtime_t;
struct runtime_loop;
struct event_base;
struct cache_redis;
struct infer_core;

/* A unit of work for a loop or the control thread, embedded in the object
 * it works on. run(arg) runs once on the thread it was posted to; drop(arg)
 * (NULL: nothing to release) instead when the runtime goes before it ran.
 * A job is on at most one queue at a time; once run it may be posted again. */
struct runtime_job {
    void (*run)(void *arg);
    void (*drop)(void *arg);
    void *arg;
    struct runtime_job *next;
};

static inline void runtime_job_init(struct runtime_job *j, void (*run)(void *), void (*drop)(void *), void *arg) {
    j->run = run;
    j->drop = drop;
    j->arg = arg;
    j->next = NULL;
}

struct runtime_params {
    const struct server_config *config; /* borrowed: http_threads, max_connections, polling */
    struct infer_core *core;            /* borrowed: its result cache gives each loop a Redis connection; may be NULL */
    repository_t *repo;                 /* borrowed: polled by the control thread (--model-control-mode poll) */
};

/* Makes the loops (--http-threads, default one per core) and their Redis
 * connections (which connect once the loops run). NULL with err set. */
runtime_t *runtime_create(const struct runtime_params *p, char *err, size_t err_len);
/* Starts the I/O threads and the control thread. 0, or a negative status
 * with err set (the threads that started are stopped again). */
int runtime_start(runtime_t *rt, char *err, size_t err_len);
/* Ends the threads: each loop runs the jobs posted before this call, then
 * stops; the control thread finishes the job it runs. Then the loops' Redis
 * connections close (a reply still awaited is called back as a miss, from
 * this thread). Jobs posted later stay queued until runtime_free.
 * Idempotent. */
void runtime_stop(runtime_t *rt);
/* Stops if needed, drops the jobs left (their drop), frees the loops.
 * The front ends must have freed what they put on the bases; libevent may
 * run the finalizers it deferred (a bufferevent's destructor) here, so those
 * touch only what outlives the runtime (the core, the runtime itself).
 * NULL is a no-op. */
void runtime_free(runtime_t *rt);

int runtime_loops(const runtime_t *rt);
struct runtime_loop *runtime_loop(runtime_t *rt, int i);
struct event_base *runtime_loop_base(struct runtime_loop *l);
/* The loop's Redis connection (the result cache's tier 2), or NULL. */
struct cache_redis *runtime_loop_redis(struct runtime_loop *l);
struct infer_core *runtime_core(const runtime_t *rt);

/* Runs job->run(job->arg) on loop l's thread, from any thread. Repeated
 * posts before the loop wakes merge into one wakeup. */
void runtime_post(struct runtime_loop *l, struct runtime_job *job);
/* The same with l as a void *: the inference core's reply post
 * (server/infer.h) for a front end whose requests run on a loop. */
void runtime_post_any(void *l, struct runtime_job *job);
/* Runs the job on the control thread, where repository load and unload may
 * block; its run posts the answer back to its loop. Any thread. */
void runtime_control_post(runtime_t *rt, struct runtime_job *job);

/* The server is leaving (SIGTERM, --shutdown-delay-secs): ready turns false
 * so that load balancers and orchestrators stop sending work, while every
 * request that still comes is served as before. Any thread. */
void runtime_leave(runtime_t *rt);
/* Whether the server reports ready: neither leaving nor draining. */
int runtime_ready(const runtime_t *rt);
/* The drain began: ready is false, new work is refused. Any thread. */
void runtime_begin_drain(runtime_t *rt);
int runtime_draining(const runtime_t *rt);
/* Whether a new inference request is taken, for every front end: STATUS_OK,
 * or STATUS_UNAVAILABLE with err saying the server is shutting down. */
int runtime_accepting(const runtime_t *rt, char *err, size_t err_len);

/* --max-connections counts every front end's connections: 1 when a new
 * connection takes one (give it back with runtime_conn_release when it
 * closes), 0 when all are taken (the refusal is logged, at most one line
 * every 10 s; front says which transport and how it refused). Any thread. */
int runtime_conn_admit(runtime_t *rt, const char *front);
void runtime_conn_release(runtime_t *rt);
/* The --max-connections in force (held below the open file limit). */
int runtime_max_connections(const runtime_t *rt);

/* Each I/O thread keeps one descriptor in reserve (on /dev/null): at the
 * open file limit a front end gives it up for a moment to accept a waiting
 * connection and refuse it, so the kernel's accept queue drains. release
 * closes the calling thread's spare (1 when it had one); reserve opens it
 * again when it is missing (another thread may have taken the slot). */
int runtime_spare_release(void);
void runtime_spare_reserve(void);

#endif
