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
 * releases what the job's arg holds; each job type brings its own. Work too
 * slow for a loop (tokenizing a long text) goes to the text threads
 * (--text-threads), as libuv's uv_queue_work: a struct runtime_work,
 * embedded the same way, runs there and its done comes back to the loop
 * that queued it as a job.
 *
 * Life: runtime_create (bases, queues, Redis; no thread yet), the front
 * ends attach (they may use the bases directly: nothing runs), runtime_start
 * (threads), ... runtime_stop (the text threads finish the work they run,
 * the work still waiting is cancelled and its done posted all the same;
 * then the loops end after the jobs queued before; nothing runs after it
 * returns), the front ends free what they put on the bases, runtime_free
 * (drops the jobs still queued, frees the bases).
 *
 * Threads: create, start, stop and free from one thread (main);
 * work_queue from a loop's thread; post, control_post, leave, ready,
 * draining, begin_drain, work_pending and conn_* from any thread; a loop's
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

/* Work for the text threads, embedded in the object it works on (libuv's
 * uv_work_t): work(w) runs once on a text thread, then done(arg) is run on
 * the loop that queued w. status tells done which: 0 when work ran,
 * STATUS_CANCELLED when the runtime stopped before it could (work never
 * runs then). drop(arg) instead of done, as for any job, when the runtime
 * was freed before done ran. The fields are the runtime's. */
struct runtime_work {
    void (*work)(struct runtime_work *w);
    void (*done)(void *arg);
    void (*drop)(void *arg);
    void *arg;
    struct runtime_job job;    /* runs done (or drop) on the loop */
    struct runtime_loop *loop;
    int status;
    struct runtime_work *next;
};

void runtime_work_init(struct runtime_work *w, void (*work)(struct runtime_work *), void (*done)(void *),
                       void (*drop)(void *), void *arg);

/* Work waiting for a text thread, per thread, beyond the ones running: a
 * full queue refuses more rather than let the waits grow without bound
 * (each waiting request holds its body, which may be many megabytes). */
#define RUNTIME_WORK_QUEUE_PER_THREAD 4

struct runtime_params {
    const struct server_config *config; /* borrowed: http_threads, text_threads, max_connections, polling */
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

/* Queues w to run on a text thread; its done comes back to loop l (the
 * caller's). 0, or STATUS_UNAVAILABLE with err set when the queue is full
 * or the runtime stopped (w is not queued and done is never called). */
int runtime_work_queue(struct runtime_loop *l, struct runtime_work *w, char *err, size_t err_len);
/* The text threads (--text-threads); 0: none, work_queue always refuses. */
int runtime_text_threads(const runtime_t *rt);
/* Work queued whose done has not returned yet: a drain waits for it as for
 * the requests in the core (the done of such work may begin some). Read
 * it before infer_core_inflight: done begins its requests before this
 * count drops. Any thread. */
int runtime_work_pending(const runtime_t *rt);
runtime_t *runtime_loop_runtime(struct runtime_loop *l);

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
