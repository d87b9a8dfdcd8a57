/* runtime.c - the I/O loops, their job queues, the control thread and
 * the state the front ends share. See runtime.h for the life cycle.
 *
 * Sections: job queues; the loops' threads; the control thread; the text
 * threads; the runtime; connections and descriptors. */
#include "server/runtime.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "cache/cache.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "server/infer.h"

/* Descriptors an explicit --max-connections leaves to everything else. */
#define RUNTIME_FD_RESERVE 64
#define RATELOG_NS (10ull * 1000000000ull)

/* A FIFO of embedded jobs: no allocation to add one. */
struct job_queue {
    struct runtime_job *head, *tail;
};

struct runtime_loop {
    runtime_t *rt;
    struct event_base *base;
    struct event *wake;          /* activated by other threads to run the queue */
    pthread_mutex_t qlock;
    struct job_queue q;
    pthread_t tid;
    int started;
    struct runtime_job stop;     /* the last job a stopping loop runs */
    cache_redis_t *redis;        /* this loop's Redis connection (result cache tier 2) */
};

struct runtime {
    const struct server_config *cfg;
    infer_core_t *core;
    repository_t *repo;
    int nloops;
    struct runtime_loop *loops;
    atomic_int leaving;          /* ready is false; requests are still served (--shutdown-delay-secs) */
    atomic_int draining;
    atomic_int conns;            /* admitted connections open, every front end's */
    int max_conns;               /* --max-connections, or derived from the open file limit */
    int stopped;

    /* The control thread: load, unload and polling, which block. */
    pthread_t control_tid;
    pthread_mutex_t clock;
    pthread_cond_t ccond;
    struct job_queue cq;
    int cstop;
    int control_started;

    /* The text threads: work off the loops (runtime_work_queue). */
    int nworkers, workers_started;
    pthread_t *worker_tids;
    pthread_mutex_t wlock;
    pthread_cond_t wcond;
    struct runtime_work *whead, *wtail;
    int wwaiting;                /* work queued, not yet taken by a thread */
    atomic_int wpending;         /* work queued whose done has not returned */
    int wstop;
};

/* ==== job queues ========================================================= */

static void queue_push(struct job_queue *q, struct runtime_job *j) {
    j->next = NULL;
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
}

/* Jobs that never ran: each releases what its arg holds. */
static void queue_drop(struct job_queue *q) {
    for (struct runtime_job *j = q->head, *n; j; j = n) {
        n = j->next;
        if (j->drop) j->drop(j->arg);
    }
    q->head = q->tail = NULL;
}

void runtime_post(struct runtime_loop *l, struct runtime_job *job) {
    pthread_mutex_lock(&l->qlock);
    queue_push(&l->q, job);
    pthread_mutex_unlock(&l->qlock);
    /* Repeated activations before the loop runs merge into one callback. */
    event_active(l->wake, EV_READ, 0);
}

void runtime_post_any(void *l, struct runtime_job *job) { runtime_post(l, job); }

static void wake_cb(evutil_socket_t fd, short what, void *arg) {
    struct runtime_loop *l = arg;
    pthread_mutex_lock(&l->qlock);
    struct runtime_job *j = l->q.head;
    l->q.head = l->q.tail = NULL;
    pthread_mutex_unlock(&l->qlock);
    while (j) {
        /* run may free the object the job lives in, or post it again. */
        struct runtime_job *next = j->next;
        j->run(j->arg);
        j = next;
    }
}

/* ==== the loops' threads ================================================= */

static void *loop_main(void *arg) {
    struct runtime_loop *l = arg;
    runtime_spare_reserve();
    event_base_loop(l->base, EVLOOP_NO_EXIT_ON_EMPTY);
    runtime_spare_release();
    return NULL;
}

static void loop_stop_cb(void *arg) {
    struct runtime_loop *l = arg;
    event_base_loopbreak(l->base);
}

/* ==== the control thread ================================================= */

void runtime_control_post(runtime_t *rt, struct runtime_job *job) {
    pthread_mutex_lock(&rt->clock);
    queue_push(&rt->cq, job);
    pthread_cond_signal(&rt->ccond);
    pthread_mutex_unlock(&rt->clock);
}

static void *control_main(void *arg) {
    runtime_t *rt = arg;
    const struct server_config *cfg = rt->cfg;
    uint64_t next_poll = clock_now_ns() + (uint64_t)cfg->repository_poll_secs * 1000000000ull;
    pthread_mutex_lock(&rt->clock);
    for (;;) {
        while (!rt->cq.head && !rt->cstop) {
            if (cfg->model_control_mode == SERVER_CONTROL_POLL) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                uint64_t now = clock_now_ns();
                if (now >= next_poll) break;
                uint64_t wait = next_poll - now;
                ts.tv_sec += (time_t)(wait / 1000000000ull);
                ts.tv_nsec += (long)(wait % 1000000000ull);
                if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
                pthread_cond_timedwait(&rt->ccond, &rt->clock, &ts);
            } else pthread_cond_wait(&rt->ccond, &rt->clock);
        }
        if (rt->cstop) break;
        struct runtime_job *j = rt->cq.head;
        if (j) {
            rt->cq.head = j->next;
            if (!rt->cq.head) rt->cq.tail = NULL;
        }
        pthread_mutex_unlock(&rt->clock);
        if (j) j->run(j->arg);
        else if (cfg->model_control_mode == SERVER_CONTROL_POLL && !atomic_load(&rt->draining)) {
            repository_poll(rt->repo);
            next_poll = clock_now_ns() + (uint64_t)cfg->repository_poll_secs * 1000000000ull;
        }
        pthread_mutex_lock(&rt->clock);
    }
    pthread_mutex_unlock(&rt->clock);
    return NULL;
}

/* ==== the text threads ================================================== */

runtime_t *runtime_loop_runtime(struct runtime_loop *l) { return l->rt; }

int runtime_text_threads(const runtime_t *rt) { return rt->nworkers; }

int runtime_work_pending(const runtime_t *rt) { return atomic_load(&((runtime_t *)rt)->wpending); }

void runtime_work_init(struct runtime_work *w, void (*work)(struct runtime_work *), void (*done)(void *),
                       void (*drop)(void *), void *arg) {
    memset(w, 0, sizeof *w);
    w->work = work;
    w->done = done;
    w->drop = drop;
    w->arg = arg;
}

/* On the loop: done may free the object w lives in, so the count the drain
 * reads drops after it, through what was read before. */
static void work_done_run(void *arg) {
    struct runtime_work *w = arg;
    runtime_t *rt = w->loop->rt;
    w->done(w->arg);
    atomic_fetch_sub(&rt->wpending, 1);
}

static void work_done_drop(void *arg) {
    struct runtime_work *w = arg;
    runtime_t *rt = w->loop->rt;
    if (w->drop) w->drop(w->arg);
    atomic_fetch_sub(&rt->wpending, 1);
}

int runtime_work_queue(struct runtime_loop *l, struct runtime_work *w, char *err, size_t err_len) {
    runtime_t *rt = l->rt;
    int limit = RUNTIME_WORK_QUEUE_PER_THREAD * rt->nworkers;
    if (rt->nworkers == 0)
        return status_set(err, err_len, STATUS_UNAVAILABLE, "no text threads (--text-threads 0)");
    pthread_mutex_lock(&rt->wlock);
    if (rt->wstop || rt->wwaiting >= limit) {
        int stopping = rt->wstop;
        pthread_mutex_unlock(&rt->wlock);
        if (stopping)
            return status_set(err, err_len, STATUS_UNAVAILABLE, "the server is shutting down: no new requests are "
                              "accepted");
        return status_set(err, err_len, STATUS_UNAVAILABLE, "the server is busy: %d long texts are already waiting "
                          "for the %d text thread%s (--text-threads); try again later", limit, rt->nworkers,
                          rt->nworkers == 1 ? "" : "s");
    }
    w->loop = l;
    w->status = 0;
    w->next = NULL;
    runtime_job_init(&w->job, work_done_run, work_done_drop, w);
    atomic_fetch_add(&rt->wpending, 1);
    if (rt->wtail) rt->wtail->next = w;
    else rt->whead = w;
    rt->wtail = w;
    rt->wwaiting++;
    pthread_cond_signal(&rt->wcond);
    pthread_mutex_unlock(&rt->wlock);
    return 0;
}

static void *worker_main(void *arg) {
    runtime_t *rt = arg;
    pthread_mutex_lock(&rt->wlock);
    for (;;) {
        while (!rt->whead && !rt->wstop) pthread_cond_wait(&rt->wcond, &rt->wlock);
        if (rt->wstop) break;
        struct runtime_work *w = rt->whead;
        rt->whead = w->next;
        if (!rt->whead) rt->wtail = NULL;
        rt->wwaiting--;
        pthread_mutex_unlock(&rt->wlock);
        w->work(w);
        /* done may free the object w lives in: w is not touched after. */
        runtime_post(w->loop, &w->job);
        pthread_mutex_lock(&rt->wlock);
    }
    pthread_mutex_unlock(&rt->wlock);
    return NULL;
}

/* Joins the text threads once they finish the work they run; the work still
 * waiting is cancelled, its done posted to its loop (which still runs), so
 * that every request queued is answered. */
static void workers_stop(runtime_t *rt) {
    pthread_mutex_lock(&rt->wlock);
    rt->wstop = 1;
    pthread_cond_broadcast(&rt->wcond);
    pthread_mutex_unlock(&rt->wlock);
    for (int i = 0; i < rt->workers_started; i++) pthread_join(rt->worker_tids[i], NULL);
    struct runtime_work *w = rt->whead;
    rt->whead = rt->wtail = NULL;
    rt->wwaiting = 0;
    while (w) {
        struct runtime_work *next = w->next;
        w->status = STATUS_CANCELLED;
        runtime_post(w->loop, &w->job);
        w = next;
    }
}

/* ==== the runtime ======================================================== */

static int max_connections(const struct server_config *cfg, long long *fd_limit);

runtime_t *runtime_create(const struct runtime_params *p, char *err, size_t err_len) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, (void (*)(void))evthread_use_pthreads);
    runtime_t *rt = calloc(1, sizeof *rt);
    if (!rt) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    rt->cfg = p->config;
    rt->core = p->core;
    rt->repo = p->repo;
    pthread_mutex_init(&rt->clock, NULL);
    pthread_cond_init(&rt->ccond, NULL);
    pthread_mutex_init(&rt->wlock, NULL);
    pthread_cond_init(&rt->wcond, NULL);
    rt->nworkers = p->config->text_threads;
    if (rt->nworkers && !(rt->worker_tids = calloc((size_t)rt->nworkers, sizeof *rt->worker_tids))) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        goto fail;
    }
    int n = p->config->http_threads > 0 ? p->config->http_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    rt->loops = calloc((size_t)n, sizeof *rt->loops);
    if (!rt->loops) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        struct runtime_loop *l = &rt->loops[i];
        l->rt = rt;
        pthread_mutex_init(&l->qlock, NULL);
        rt->nloops++;
        /* The changelist merges the read/write toggles made around an
         * asynchronous reply into at most one epoll_ctl per loop iteration. */
        struct event_config *ec = event_config_new();
        if (ec) event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
        l->base = ec ? event_base_new_with_config(ec) : NULL;
        if (ec) event_config_free(ec);
        if (!l->base) l->base = event_base_new();
        l->wake = l->base ? event_new(l->base, -1, 0, wake_cb, l) : NULL;
        if (!l->wake) {
            status_set(err, err_len, STATUS_INTERNAL, "libevent initialization failed");
            goto fail;
        }
        runtime_job_init(&l->stop, loop_stop_cb, NULL, l);
        /* Connects once the loop runs; none without a core (tests) or a Redis URL. */
        l->redis = p->core ? cache_redis_create(infer_core_cache(p->core), l->base) : NULL;
    }
    long long fd_limit;
    rt->max_conns = max_connections(p->config, &fd_limit);
    log_info("connections: at most %d open (%s; open file limit %lld)", rt->max_conns,
             p->config->max_connections > 0 ? "--max-connections" : "from the open file limit", fd_limit);
    if (p->config->max_connections > rt->max_conns)
        log_warn("--max-connections %d is over what the open file limit (%lld) allows: at most %d connections are "
                 "kept, more are answered 503 (raise ulimit -n for more)", p->config->max_connections, fd_limit,
                 rt->max_conns);
    return rt;
fail:
    runtime_free(rt);
    return NULL;
}

int runtime_start(runtime_t *rt, char *err, size_t err_len) {
    for (int i = 0; i < rt->nloops; i++) {
        int prc = pthread_create(&rt->loops[i].tid, NULL, loop_main, &rt->loops[i]);
        if (prc) {
            runtime_stop(rt);
            return status_set(err, err_len, STATUS_INTERNAL, "cannot start I/O thread %d: %s", i, strerror(prc));
        }
        rt->loops[i].started = 1;
    }
    /* Without it a load, an unload or a poll would wait forever. */
    int prc = pthread_create(&rt->control_tid, NULL, control_main, rt);
    if (prc) {
        runtime_stop(rt);
        return status_set(err, err_len, STATUS_INTERNAL,
                          "cannot start the control thread (model load, unload and polling): %s", strerror(prc));
    }
    rt->control_started = 1;
    for (int i = 0; i < rt->nworkers; i++) {
        prc = pthread_create(&rt->worker_tids[i], NULL, worker_main, rt);
        if (prc) {
            runtime_stop(rt);
            return status_set(err, err_len, STATUS_INTERNAL, "cannot start text thread %d (--text-threads): %s", i,
                              strerror(prc));
        }
        pthread_mutex_lock(&rt->wlock);
        rt->workers_started++;
        pthread_mutex_unlock(&rt->wlock);
    }
    return 0;
}

void runtime_stop(runtime_t *rt) {
    if (!rt || rt->stopped) return;
    rt->stopped = 1;
    /* First, while the loops still run the done jobs the text threads post. */
    workers_stop(rt);
    if (rt->control_started) {
        pthread_mutex_lock(&rt->clock);
        rt->cstop = 1;
        pthread_cond_signal(&rt->ccond);
        pthread_mutex_unlock(&rt->clock);
        pthread_join(rt->control_tid, NULL);
    }
    for (int i = 0; i < rt->nloops; i++)
        if (rt->loops[i].started) {
            runtime_post(&rt->loops[i], &rt->loops[i].stop);
            pthread_join(rt->loops[i].tid, NULL);
        }
    for (int i = 0; i < rt->nloops; i++) {
        cache_redis_free(rt->loops[i].redis);
        rt->loops[i].redis = NULL;
    }
}

void runtime_free(runtime_t *rt) {
    if (!rt) return;
    runtime_stop(rt);
    for (int i = 0; i < rt->nloops; i++) {
        struct runtime_loop *l = &rt->loops[i];
        /* Jobs left (answers of requests that never finished, a control
         * call's reply) go with the loop: exiting. */
        queue_drop(&l->q);
        if (l->wake) event_free(l->wake);
        if (l->base) event_base_free(l->base);
        pthread_mutex_destroy(&l->qlock);
    }
    queue_drop(&rt->cq); /* control jobs that never ran */
    free(rt->loops);
    free(rt->worker_tids);
    pthread_mutex_destroy(&rt->wlock);
    pthread_cond_destroy(&rt->wcond);
    pthread_mutex_destroy(&rt->clock);
    pthread_cond_destroy(&rt->ccond);
    free(rt);
}

int runtime_loops(const runtime_t *rt) { return rt->nloops; }

struct runtime_loop *runtime_loop(runtime_t *rt, int i) { return &rt->loops[i]; }

struct event_base *runtime_loop_base(struct runtime_loop *l) { return l->base; }

struct cache_redis *runtime_loop_redis(struct runtime_loop *l) { return l->redis; }

struct infer_core *runtime_core(const runtime_t *rt) { return rt->core; }

void runtime_leave(runtime_t *rt) { atomic_store(&rt->leaving, 1); }

int runtime_ready(const runtime_t *rt) {
    runtime_t *m = (runtime_t *)rt;
    return !atomic_load_explicit(&m->leaving, memory_order_relaxed) && !runtime_draining(rt);
}

void runtime_begin_drain(runtime_t *rt) {
    atomic_store(&rt->leaving, 1);
    atomic_store(&rt->draining, 1);
}

int runtime_draining(const runtime_t *rt) { return atomic_load_explicit(&((runtime_t *)rt)->draining, memory_order_relaxed); }

int runtime_accepting(const runtime_t *rt, char *err, size_t err_len) {
    if (!runtime_draining(rt)) return STATUS_OK;
    return status_set(err, err_len, STATUS_UNAVAILABLE, "the server is shutting down: no new requests are accepted");
}

/* ==== connections and descriptors ======================================== */

static struct log_every shed_log;

int runtime_conn_admit(runtime_t *rt, const char *front) {
    if (atomic_fetch_add(&rt->conns, 1) < rt->max_conns) return 1;
    atomic_fetch_sub(&rt->conns, 1);
    unsigned n;
    if (log_every_due(&shed_log, RATELOG_NS, &n))
        log_warn("shed %u connection%s in the last %llu s (the last: %s): %d open, --max-connections %d", n,
                 n == 1 ? "" : "s", RATELOG_NS / 1000000000ull, front, atomic_load(&rt->conns), rt->max_conns);
    return 0;
}

void runtime_conn_release(runtime_t *rt) { atomic_fetch_sub(&rt->conns, 1); }

int runtime_max_connections(const runtime_t *rt) { return rt->max_conns; }

/* --max-connections, or what the open file limit leaves after room for
 * models, Redis, logs and connections being shed. An explicit value is held
 * below the limit too: connections that run the descriptors out leave new
 * clients queued in the kernel behind idle ones, where no 503 reaches them
 * (the spare descriptor is a fallback, and the I/O threads race for it). */
static int max_connections(const struct server_config *cfg, long long *fd_limit) {
    struct rlimit rl;
    long long lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long long)rl.rlim_cur : 1 << 20;
    *fd_limit = lim;
    if (cfg->max_connections > 0) {
        long long cap = lim > 128 ? lim - RUNTIME_FD_RESERVE : lim / 2;
        if (cap < 1) cap = 1;
        return cfg->max_connections < cap ? cfg->max_connections : (int)(cap > INT32_MAX ? INT32_MAX : cap);
    }
    long long reserve = lim / 8;
    if (reserve < 32) reserve = 32;
    if (reserve > 4096) reserve = 4096;
    long long n = lim > 2 * reserve ? lim - reserve : lim / 2;
    if (n < 1) n = 1;
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

static __thread int spare_fd = -1;

int runtime_spare_release(void) {
    if (spare_fd < 0) return 0;
    close(spare_fd);
    spare_fd = -1;
    return 1;
}

void runtime_spare_reserve(void) {
    if (spare_fd < 0) spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}
