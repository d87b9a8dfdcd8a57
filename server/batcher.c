/* batcher.c - per-model dynamic batcher: queue policy, batch formation,
 * instance threads, timeouts, cancellation, latency budget. What runs a
 * batch (gather, model, scatter) is the executor's (server/instance.h).
 *
 * One mutex guards everything shared (queues, timeout heap, stats, profile).
 * Nothing slow happens under it: the executor's run and done() calls run
 * with the lock released.
 *
 * Threads:
 *   - instance threads (instance_count): each waits for work, forms a batch
 *     under the lock (the policy, server/batch_policy.h: batch_decide, a pure
 *     function of the queue, the profile, the configuration and the time,
 *     which this file calls with its lock held), runs it and calls done() for
 *     its requests. Only a free instance forms a batch, so batches grow while
 *     every instance is busy ("natural" batching) and, with a delay or a
 *     latency budget, while a free instance chooses to wait.
 *   - the submitting thread (an I/O thread), sometimes: when a request finds
 *     an instance waiting and nothing ahead of it, the policy would send it
 *     alone at once, and the model runs it in little time on one thread
 *     (inline_max_ns, and the executor's inline_ok), the submitter borrows
 *     the waiting instance and runs the batch itself. Waking the instance's
 *     thread and then the I/O thread back cost two context switches, more
 *     than such a model's whole run. A borrowed instance's thread sleeps on.
 *   - the timer thread: sleeps until the earliest queue deadline and fails
 *     expired requests at that moment; it also delivers the done() of
 *     cancelled requests, so batcher_cancel never calls back into its caller.
 *
 * Pinned requests (batcher_request.pin: the sequence batcher's) wait in
 * their instance's own FIFOs, which that instance serves before the shared
 * ones; while any wait, a wake-up goes to every waiting instance.
 *
 * Request states: QUEUED (in a level's FIFO, maybe in the heap) -> RUNNING
 * (taken by an instance) -> DONE (set under the lock just before done()). */
#include "server/batcher.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "server/batch_policy.h"

enum { REQ_NEW = 0, REQ_QUEUED = 1, REQ_RUNNING = 2, REQ_DONE = 3 };

/* With an injected clock the threads cannot sleep until a deadline in that
 * clock's time; they re-check it this often instead (ns of real time). */
#define BATCHER_POLL_NS 1000000ull

/* An instance's thread: it forms batches under the policy and hands each
 * to the executor for its instance. */
struct worker {
    batcher_t *b;
    int index;           /* the executor's instance */
    pthread_t thread;
    int started;
    struct batcher_request **sel; /* the batch being formed/run */
    int nsel;
    int64_t rows;
    int bi;              /* the batch's length bucket (padded batching), else 0 */
    struct batcher_request *warm; /* batcher_warmup's request for this instance */
    int waiting;         /* its thread waits for work (under the lock) */
    int borrowed;        /* a submitter runs a batch on it: its thread must not */
};

struct batcher {
    struct batcher_params p;
    char name[128];
    int ninputs;          /* the executor's; -1 = not known */
    int nlevels;          /* priority levels; queue index nlevels = delayed */
    int default_level;    /* 1-based */
    int64_t cap_rows;     /* rows per batch: max_batch_size, or 1 */

    pthread_mutex_t mu;
    pthread_cond_t work_cv;   /* instances: new work or a state change */
    pthread_cond_t timer_cv;  /* timer thread: earlier deadline, cancel, exit */
    pthread_cond_t order_cv;  /* preserve_ordering: next batch to deliver */
    pthread_cond_t warm_cv;   /* batcher_warmup: a warmup request is done */

    /* (ninst + 1) sets of nlevels + 1 FIFOs, the policy's queue views: set 0
     * is shared by the instances, set k + 1 holds the requests pinned to
     * instance k (batcher_request.pin). */
    struct batch_fifo *q;
    int queued;               /* requests in all FIFOs */
    int pinned;               /* of them, pinned to an instance */
    int running;              /* requests taken by instances, done() pending */
    int idle;                 /* instances waiting for work */
    int nborrowed;            /* of them, borrowed by a submitter (inline run) */
    struct batcher_request **heap; /* min-heap on q_.deadline_ns */
    int heap_n, heap_cap;
    struct batch_fifo finished; /* cancelled, done() to be called by the timer */

    int admitting;
    int draining;             /* batcher_free: send at once, then exit */
    int timer_exit;
    uint64_t next_seq, deliver_seq;

    /* The policy's inputs besides the queue (server/batch_policy.h): its
     * configuration, the execution profile by length bucket and rows, and
     * what was learnt of arrivals and wake-ups. */
    struct batch_config cfg;
    struct batch_profile prof;
    struct batch_rates rates;
    struct batcher_stats st;

    struct worker *inst;
    int ninst;
    pthread_t timer;
    int timer_started;
};

/* ---- clock ------------------------------------------------------------- */

static uint64_t now_ns(const batcher_t *b) {
    return b->p.now_ns ? b->p.now_ns(b->p.now_arg) : clock_now_ns();
}

/* Waits on cv until the batcher's clock reaches deadline (0 = no deadline).
 * With an injected clock the wait is a short real-time poll. */
static void cond_wait_until(batcher_t *b, pthread_cond_t *cv, uint64_t deadline) {
    if (!deadline && !b->p.now_ns) {
        pthread_cond_wait(cv, &b->mu);
        return;
    }
    uint64_t wake;
    if (b->p.now_ns)
        wake = clock_now_ns() + BATCHER_POLL_NS;
    else
        wake = deadline;
    struct timespec ts = { .tv_sec = (time_t)(wake / 1000000000ull),
                           .tv_nsec = (long)(wake % 1000000000ull) };
    pthread_cond_timedwait(cv, &b->mu, &ts);
}

/* ---- queues ------------------------------------------------------------ */

static void heap_swap(batcher_t *b, int i, int j) {
    struct batcher_request *t = b->heap[i];
    b->heap[i] = b->heap[j];
    b->heap[j] = t;
    b->heap[i]->q_.heap_idx = i;
    b->heap[j]->q_.heap_idx = j;
}

static void heap_up(batcher_t *b, int i) {
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (b->heap[parent]->q_.deadline_ns <= b->heap[i]->q_.deadline_ns)
            break;
        heap_swap(b, i, parent);
        i = parent;
    }
}

static void heap_down(batcher_t *b, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < b->heap_n && b->heap[l]->q_.deadline_ns < b->heap[m]->q_.deadline_ns)
            m = l;
        if (r < b->heap_n && b->heap[r]->q_.deadline_ns < b->heap[m]->q_.deadline_ns)
            m = r;
        if (m == i)
            return;
        heap_swap(b, i, m);
        i = m;
    }
}

static int heap_push(batcher_t *b, struct batcher_request *r) {
    if (b->heap_n == b->heap_cap) {
        int cap = b->heap_cap ? b->heap_cap * 2 : 64;
        struct batcher_request **h = realloc(b->heap, (size_t)cap * sizeof(*h));
        if (!h)
            return STATUS_NOMEM;
        b->heap = h;
        b->heap_cap = cap;
    }
    b->heap[b->heap_n] = r;
    r->q_.heap_idx = b->heap_n++;
    heap_up(b, r->q_.heap_idx);
    return 0;
}

static void heap_remove(batcher_t *b, struct batcher_request *r) {
    int i = r->q_.heap_idx;
    if (i < 0)
        return;
    r->q_.heap_idx = -1;
    b->heap_n--;
    if (i == b->heap_n)
        return;
    struct batcher_request *moved = b->heap[b->heap_n];
    b->heap[i] = moved;
    moved->q_.heap_idx = i;
    heap_down(b, i);
    heap_up(b, moved->q_.heap_idx);
}

/* The FIFOs of set k (0 shared, i + 1 pinned to instance i). */
static struct batch_fifo *fifo_set(batcher_t *b, int k) { return &b->q[(size_t)k * (size_t)(b->nlevels + 1)]; }

/* r's FIFO. */
static struct batch_fifo *fifo_of(batcher_t *b, const struct batcher_request *r) {
    return &fifo_set(b, r->q_.set)[r->q_.level];
}

/* Requests in set k. */
static int set_count(batcher_t *b, int k) {
    int n = 0;
    for (int l = 0; l <= b->nlevels; l++) n += fifo_set(b, k)[l].n;
    return n;
}

/* Wakes a waiting instance for new work (lock held or not): any one for a
 * shared request; every one while pinned requests wait, since only their
 * own instance may take them. */
static void wake_for_work(batcher_t *b, int pinned) {
    if (pinned)
        pthread_cond_broadcast(&b->work_cv);
    else
        pthread_cond_signal(&b->work_cv);
}

/* Takes r out of its FIFO and the heap (lock held). */
static void unqueue(batcher_t *b, struct batcher_request *r) {
    batch_fifo_remove(fifo_of(b, r), r);
    heap_remove(b, r);
    b->queued--;
    b->pinned -= r->q_.set != 0;
}

/* Moves a queued request to the finished list, to be failed by the timer
 * thread with status/msg (lock held). */
static void fail_queued(batcher_t *b, struct batcher_request *r, int status, const char *msg) {
    unqueue(b, r);
    r->status = status;
    snprintf(r->err, sizeof r->err, "%s", msg);
    r->noutputs = 0;
    r->q_.state = REQ_DONE;
    batch_fifo_push(&b->finished, r);
    pthread_cond_signal(&b->timer_cv);
}

static struct batcher_request *queue_head(batcher_t *b) {
    for (int k = 0; k <= b->ninst; k++)
        for (int l = 0; l <= b->nlevels; l++)
            if (fifo_set(b, k)[l].head)
                return fifo_set(b, k)[l].head;
    return NULL;
}

/* ---- policy ------------------------------------------------------------- */

/* Asks the policy (server/batch_policy.h) for the worker's next batch (lock
 * held): BATCH_SEND with inst->sel/nsel/rows/bi set, BATCH_WAIT with *wake
 * set, or BATCH_IDLE. Requests it found cancelled are failed here, before
 * they can run. */
static int worker_decide(batcher_t *b, struct worker *inst, uint64_t now, uint64_t *wake) {
    /* The instance's pinned requests first, then the shared ones. */
    int k = b->pinned && set_count(b, inst->index + 1) ? inst->index + 1 : 0;
    struct batch_queue q = {.fifo = fifo_set(b, k), .nfifo = b->nlevels + 1, .draining = b->draining};
    struct batch_decision d = {.sel = inst->sel};
    int a;
    do {
        a = batch_decide(&b->cfg, &b->prof, &b->rates, &q, now, &d);
        for (int k = 0; k < d.ndrop; k++) {
            b->st.cancelled++;
            fail_queued(b, d.drop[k], STATUS_CANCELLED, "request cancelled: the client went away");
        }
    } while (a == BATCH_DROP);
    inst->nsel = d.nsel;
    inst->rows = d.rows;
    inst->bi = d.bucket;
    *wake = d.wake;
    return a;
}

/* ---- execution ----------------------------------------------------------- */

static uint64_t batch_clock(void *arg) { return now_ns(arg); }

/* Runs the selected batch on the worker's instance (lock NOT held). */
static void run_batch(batcher_t *b, struct worker *inst, struct executor_batch *bt) {
    *bt = (struct executor_batch){.reqs = inst->sel, .n = inst->nsel, .rows = inst->rows, .now_ns = batch_clock,
                                  .now_arg = b};
    b->p.executor.iface->run(b->p.executor.ctx, inst->index, bt);
}

/* Runs the worker's warmup request alone (lock held on entry and exit):
 * counted nowhere, and kept out of the profile (a first run builds plans). */
static void run_warm(batcher_t *b, struct worker *inst) {
    struct batcher_request *r = inst->warm;
    inst->warm = NULL;
    inst->sel[0] = r;
    inst->nsel = 1;
    inst->rows = r->rows;
    pthread_mutex_unlock(&b->mu);
    struct executor_batch bt;
    run_batch(b, inst, &bt);
    r->done(r);
    pthread_mutex_lock(&b->mu);
    inst->nsel = 0;
}

/* Runs the batch worker_decide selected for inst (lock held on entry and
 * exit, released while the model runs and while done() is called): on the
 * instance's thread, or on a submitter's that borrowed the instance. */
static void run_selected(batcher_t *b, struct worker *inst, uint64_t now) {
    for (int k = 0; k < inst->nsel; k++) {
        struct batcher_request *r = inst->sel[k];
        unqueue(b, r);
        r->q_.state = REQ_RUNNING;
        r->start_ns = now;
        b->st.queue_ns_total += now - r->enqueue_ns;
    }
    b->running += inst->nsel;
    uint64_t seq = b->next_seq++;
    /* Others may form a batch from what is left. */
    if (b->queued && b->idle > b->nborrowed)
        wake_for_work(b, b->pinned);
    pthread_mutex_unlock(&b->mu);

    struct executor_batch bt;
    run_batch(b, inst, &bt);
    uint64_t exec_ns = bt.exec_ns;

    pthread_mutex_lock(&b->mu);
    b->st.executions++;
    b->st.inferences += (uint64_t)inst->rows;
    b->st.requests += (uint64_t)inst->nsel;
    b->st.exec_ns_total += exec_ns;
    b->st.batch_hist[inst->rows < METRICS_MAX_BATCH ? inst->rows : METRICS_MAX_BATCH]++;
    if (b->p.pad) {
        struct batcher_pad_stats *ps = &b->st.pad[inst->bi];
        ps->batches++;
        ps->rows += (uint64_t)inst->rows;
        ps->real += bt.pad_real;
        ps->padded += bt.pad_total;
    }
    int grow = 0;
    if (inst->sel[0]->status) {
        b->st.failed += (uint64_t)inst->nsel;
    } else if (!bt.planned) {
        batch_profile_add(&b->prof, inst->bi, inst->rows, exec_ns);
        grow = b->p.executor.iface->heavy && batch_profile_heavy(&b->prof, inst->bi, inst->rows, inst->nsel);
    }
    if (b->p.preserve_ordering)
        while (b->deliver_seq != seq)
            pthread_cond_wait(&b->order_cv, &b->mu);
    for (int k = 0; k < inst->nsel; k++)
        inst->sel[k]->q_.state = REQ_DONE;
    pthread_mutex_unlock(&b->mu);

    for (int k = 0; k < inst->nsel; k++)
        inst->sel[k]->done(inst->sel[k]);
    if (grow)
        b->p.executor.iface->heavy(b->p.executor.ctx, inst->index, &bt);

    pthread_mutex_lock(&b->mu);
    b->running -= inst->nsel;
    inst->nsel = 0;
    if (b->p.preserve_ordering) {
        b->deliver_seq++;
        pthread_cond_broadcast(&b->order_cv);
    }
}

static void *instance_main(void *arg) {
    struct worker *inst = arg;
    batcher_t *b = inst->b;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        if (inst->warm && !inst->borrowed) {
            run_warm(b, inst);
            continue;
        }
        /* A submitter runs a batch on this instance (batcher_submit): sleep
         * on, passing on a wake-up that was meant for a waiting instance. */
        if (inst->borrowed && b->queued && b->idle > b->nborrowed - 1)
            wake_for_work(b, b->pinned);
        uint64_t now = now_ns(b), wake = 0;
        int d = inst->borrowed ? BATCH_IDLE : worker_decide(b, inst, now, &wake);
        if (d == BATCH_IDLE && b->draining && !inst->borrowed)
            break;
        if (d != BATCH_SEND) {
            b->idle++;
            inst->waiting = 1;
            cond_wait_until(b, &b->work_cv, wake);
            inst->waiting = 0;
            b->idle--;
            if (wake && !b->p.now_ns)
                batch_note_wakeup(&b->rates, wake, now_ns(b));
            continue;
        }
        run_selected(b, inst, now);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* ---- timer thread ---------------------------------------------------------- */

static void *timer_main(void *arg) {
    batcher_t *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        uint64_t now = now_ns(b);
        while (b->heap_n > 0 && b->heap[0]->q_.deadline_ns <= now) {
            struct batcher_request *r = b->heap[0];
            /* Nobody waits for a request past its client's deadline: it is
             * dropped whatever the policy's action. */
            int client = r->deadline_ns && r->deadline_ns <= now;
            if (!client && b->p.default_queue_policy.timeout_action == BATCHER_TIMEOUT_DELAY) {
                /* Not rejected: served after every request still in time. */
                heap_remove(b, r);
                batch_fifo_remove(fifo_of(b, r), r);
                r->q_.level = b->nlevels;
                batch_fifo_push(fifo_of(b, r), r);
                b->st.delayed++;
                /* Its client's deadline still holds (no room for it: it runs anyway). */
                if (r->deadline_ns) {
                    r->q_.deadline_ns = r->deadline_ns;
                    (void)heap_push(b, r);
                }
            } else {
                b->st.rejected_timeout++;
                fail_queued(b, r, client ? STATUS_DEADLINE : STATUS_TIMEOUT,
                            client ? "Deadline Exceeded: the client's deadline passed while the request was queued"
                                   : "Request timeout expired");
            }
        }
        if (b->finished.head) {
            struct batcher_request *list = b->finished.head;
            b->finished.head = b->finished.tail = NULL;
            b->finished.n = 0;
            /* Queued requests left: instances may have been waiting on them. */
            pthread_cond_broadcast(&b->work_cv);
            pthread_mutex_unlock(&b->mu);
            while (list) {
                struct batcher_request *next = list->q_.next;
                list->q_.next = list->q_.prev = NULL;
                list->done(list);
                list = next;
            }
            pthread_mutex_lock(&b->mu);
            continue;
        }
        if (b->timer_exit)
            break;
        cond_wait_until(b, &b->timer_cv, b->heap_n ? b->heap[0]->q_.deadline_ns : 0);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* ---- public API -------------------------------------------------------------- */

void batcher_free(batcher_t *b) {
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->admitting = 0;
    b->draining = 1;
    pthread_cond_broadcast(&b->work_cv);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->ninst; i++)
        if (b->inst[i].started)
            pthread_join(b->inst[i].thread, NULL);
    pthread_mutex_lock(&b->mu);
    /* Instances only leave with the queue empty, unless none ever started:
     * then fail what is queued so that every done() still runs once. */
    struct batcher_request *r;
    while ((r = queue_head(b)))
        fail_queued(b, r, STATUS_UNAVAILABLE, "model is unloading");
    b->timer_exit = 1;
    pthread_cond_signal(&b->timer_cv);
    pthread_mutex_unlock(&b->mu);
    if (b->timer_started)
        pthread_join(b->timer, NULL);
    for (int i = 0; b->inst && i < b->ninst; i++)
        free(b->inst[i].sel);
    free(b->inst);
    executor_free(&b->p.executor);
    free(b->q);
    free(b->heap);
    batch_profile_release(&b->prof);
    pthread_cond_destroy(&b->work_cv);
    pthread_cond_destroy(&b->timer_cv);
    pthread_cond_destroy(&b->order_cv);
    pthread_cond_destroy(&b->warm_cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

batcher_t *batcher_create(const struct batcher_params *p, char *err, size_t err_len) {
    struct executor ex = p ? p->executor : (struct executor){0};
    if (!ex.iface || ex.instances < 1) {
        executor_free(&ex);
        status_set(err, err_len, STATUS_INVALID, "batcher: no executor given");
        return NULL;
    }
    const char *name = p->model_name ? p->model_name : "?";
    if (p->max_batch_size < 0 || p->priority_levels < 0 || p->priority_levels > MODEL_CONFIG_MAX_PRIORITIES ||
        p->npreferred < 0 || p->npreferred > MODEL_CONFIG_MAX_PREFERRED || p->default_queue_policy.max_queue_size < 0) {
        executor_free(&ex);
        status_set(err, err_len, STATUS_INVALID, "model '%s': batcher parameters out of range", name);
        return NULL;
    }
    for (int k = 0; k < p->npreferred; k++)
        if (p->preferred_batch_size[k] < 1 || (p->max_batch_size > 0 && p->preferred_batch_size[k] > p->max_batch_size)) {
            executor_free(&ex);
            status_set(err, err_len, STATUS_INVALID,
                       "model '%s': dynamic_batching.preferred_batch_size %d is outside 1..max_batch_size (%d)", name,
                       p->preferred_batch_size[k], p->max_batch_size);
            return NULL;
        }
    int nlevels = p->priority_levels > 1 ? p->priority_levels : 1;
    int deflevel = p->default_priority_level > 0 ? p->default_priority_level : (nlevels + 1) / 2;
    if (deflevel > nlevels) {
        executor_free(&ex);
        status_set(err, err_len, STATUS_INVALID,
                   "model '%s': dynamic_batching.default_priority_level %d is above priority_levels %d", name,
                   p->default_priority_level, nlevels);
        return NULL;
    }

    batcher_t *b = calloc(1, sizeof *b);
    if (!b) {
        executor_free(&ex);
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    b->p = *p;
    snprintf(b->name, sizeof b->name, "%s", name);
    b->p.model_name = b->name;
    b->nlevels = nlevels;
    b->default_level = deflevel;
    b->cap_rows = p->max_batch_size > 0 ? p->max_batch_size : 1;
    b->ninputs = ex.ninputs;
    b->admitting = 1;
    b->ninst = ex.instances;

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->work_cv, &ca);
    pthread_cond_init(&b->timer_cv, &ca);
    pthread_cond_init(&b->order_cv, &ca);
    pthread_cond_init(&b->warm_cv, &ca);
    pthread_condattr_destroy(&ca);

    b->q = calloc(((size_t)nlevels + 1) * ((size_t)b->ninst + 1), sizeof *b->q);
    b->cfg = (struct batch_config){.max_batch_size = p->max_batch_size,
                                   .dynamic_batching = p->dynamic_batching,
                                   .npreferred = p->npreferred,
                                   .max_queue_delay_us = p->max_queue_delay_us,
                                   .latency_budget_us = p->latency_budget_us,
                                   .any_batch_size = p->any_batch_size,
                                   .instances = ex.instances,
                                   .pad = p->pad};
    memcpy(b->cfg.preferred_batch_size, p->preferred_batch_size, sizeof b->cfg.preferred_batch_size);
    int prof_rc = batch_profile_init(&b->prof, b->p.pad ? b->p.pad->nbuckets + 1 : 1, b->cap_rows);
    b->inst = calloc((size_t)b->ninst, sizeof *b->inst);
    if (!b->q || prof_rc || !b->inst) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < b->ninst; i++) {
        b->inst[i].b = b;
        b->inst[i].index = i;
        b->inst[i].sel = calloc((size_t)b->cap_rows, sizeof *b->inst[i].sel);
        if (!b->inst[i].sel) {
            status_set(err, err_len, STATUS_NOMEM, "out of memory");
            goto fail;
        }
    }
    if (pthread_create(&b->timer, NULL, timer_main, b)) {
        status_set(err, err_len, STATUS_INTERNAL, "model '%s': cannot start the timer thread", name);
        goto fail;
    }
    b->timer_started = 1;
    for (int i = 0; i < b->ninst; i++) {
        if (pthread_create(&b->inst[i].thread, NULL, instance_main, &b->inst[i])) {
            status_set(err, err_len, STATUS_INTERNAL, "model '%s': cannot start instance thread %d", name, i);
            goto fail;
        }
        b->inst[i].started = 1;
    }
    log_info("model '%s': %d instance(s) on %s, %d thread(s) each, max_batch_size %d, dynamic batching %s", name,
             b->ninst, ex.backend[0] ? ex.backend : "?", ex.threads, p->max_batch_size,
             p->dynamic_batching ? "on" : "off");
    return b;
fail:
    log_error("%s", err ? err : "batcher_create failed");
    batcher_free(b);
    return NULL;
}

/* The submitter checked the request against the model (the inference core:
 * kserve_request_bind), so no shape is looked at here. What is checked is
 * what the batcher itself relies on, which only a caller's bug breaks: the
 * executor's input count (gather reads that many) and rows within a batch
 * (a larger request would never be run). */
static int check_contract(const batcher_t *b, struct batcher_request *r) {
    int want = b->ninputs >= 0 ? b->ninputs : EXECUTOR_MAX_INPUTS;
    if (r->ninputs < 1 || !r->inputs || (b->ninputs >= 0 ? r->ninputs != want : r->ninputs > want))
        return status_set(r->err, sizeof r->err, STATUS_INVALID, "model '%s' expects %s%d inputs, got %d", b->name,
                          b->ninputs >= 0 ? "" : "at most ", want, r->ninputs);
    if (b->p.max_batch_size > 0 && (r->rows < 1 || r->rows > b->p.max_batch_size))
        return status_set(r->err, sizeof r->err, STATUS_INVALID,
                          "batch size %lld of model '%s' is outside 1..max_batch_size (%d)", (long long)r->rows,
                          b->name, b->p.max_batch_size);
    return 0;
}

/* The inline run (the file's opening comment): r, just queued, runs on the
 * calling thread when an instance waits and no batch runs (under load the
 * instances' threads run the model while the I/O threads read and write:
 * an I/O thread running it would hold up its other clients, and measured
 * at concurrency 64 that cost more than the hand-offs saved), the policy
 * sends r alone now, the
 * profile predicts at most inline_max_ns for it and the executor says its
 * instance would run it on the calling thread alone. Returns 1 when r ran
 * (its done() has been called), 0 to leave it to the instances. Lock held. */
static int run_inline(batcher_t *b, struct batcher_request *r, uint64_t now) {
    const struct executor_i *ex = b->p.executor.iface;
    if (!b->p.inline_max_ns || !ex->inline_ok || b->p.pad || b->p.preserve_ordering || b->p.now_ns ||
        b->idle <= b->nborrowed || b->queued != 1 || b->running || b->nborrowed)
        return 0;
    uint64_t predicted = batch_predict_ns(&b->prof, 0, r->rows);
    if (!predicted || predicted > b->p.inline_max_ns)
        return 0;
    struct worker *w = NULL;
    for (int i = 0; i < b->ninst && !w; i++)
        if (b->inst[i].waiting && !b->inst[i].borrowed && !b->inst[i].warm && (!r->pin || r->pin == i + 1))
            w = &b->inst[i];
    if (!w || !ex->inline_ok(b->p.executor.ctx, w->index, r))
        return 0;
    uint64_t wake = 0;
    if (worker_decide(b, w, now, &wake) != BATCH_SEND || w->nsel != 1 || w->sel[0] != r) {
        w->nsel = 0;
        return 0;
    }
    w->borrowed = 1;
    b->nborrowed++;
    b->st.inline_runs++;
    run_selected(b, w, now);
    w->borrowed = 0;
    b->nborrowed--;
    /* What came meanwhile waits for an instance; an unloading batcher
     * waits for this one's thread to leave. */
    if (b->draining)
        pthread_cond_broadcast(&b->work_cv);
    else if (b->queued && b->idle > b->nborrowed)
        wake_for_work(b, b->pinned);
    return 1;
}

int batcher_submit(batcher_t *b, struct batcher_request *r) {
    r->status = 0;
    r->err[0] = 0;
    r->noutputs = 0;
    r->batch_size = 0;
    r->start_ns = r->end_ns = 0;
    r->compute_input_ns = r->compute_infer_ns = r->compute_output_ns = 0;
    r->q_.prev = r->q_.next = NULL;
    r->q_.heap_idx = -1;
    r->q_.deadline_ns = 0;
    r->q_.state = REQ_NEW;

    if (!r->done || !r->outputs)
        return status_set(r->err, sizeof r->err, STATUS_INTERNAL, "batcher_submit: request without %s",
                          r->done ? "room for outputs" : "done()");
    int rc = check_contract(b, r);
    if (rc) {
        pthread_mutex_lock(&b->mu);
        b->st.rejected_invalid++;
        pthread_mutex_unlock(&b->mu);
        return rc;
    }
    if (b->p.max_batch_size <= 0)
        r->rows = 1;
    if (r->pin < 0 || r->pin > b->ninst)
        return status_set(r->err, sizeof r->err, STATUS_INTERNAL, "batcher_submit: pinned to instance %d of %d",
                          r->pin - 1, b->ninst);
    r->q_.set = r->pin;
    int level = r->priority;
    if (level < 1 || level > b->nlevels)
        level = b->default_level;

    pthread_mutex_lock(&b->mu);
    if (!b->admitting) {
        pthread_mutex_unlock(&b->mu);
        return status_set(r->err, sizeof r->err, STATUS_UNAVAILABLE, "model '%s' is not accepting requests", b->name);
    }
    const struct batcher_queue_policy *qp = &b->p.default_queue_policy;
    if (qp->max_queue_size > 0 && fifo_set(b, r->q_.set)[level - 1].n >= qp->max_queue_size) {
        b->st.rejected_queue_full++;
        pthread_mutex_unlock(&b->mu);
        return status_set(r->err, sizeof r->err, STATUS_QUEUE_FULL, "Exceeds maximum queue size");
    }
    uint64_t now = now_ns(b);
    r->enqueue_ns = now;
    batch_note_arrival(&b->rates, now);
    uint64_t tmo = qp->default_timeout_us;
    if (qp->allow_timeout_override && r->timeout_us)
        tmo = r->timeout_us;
    r->q_.level = level - 1;
    r->q_.state = REQ_QUEUED;
    /* The earlier of the queue policy's timeout and the client's deadline. */
    uint64_t deadline = tmo ? now + tmo * 1000ull : 0;
    if (r->deadline_ns && (!deadline || r->deadline_ns < deadline))
        deadline = r->deadline_ns;
    if (deadline) {
        r->q_.deadline_ns = deadline;
        if (heap_push(b, r)) {
            pthread_mutex_unlock(&b->mu);
            return status_set(r->err, sizeof r->err, STATUS_NOMEM, "out of memory queueing a request");
        }
        if (r->q_.heap_idx == 0)
            pthread_cond_signal(&b->timer_cv);
    }
    batch_fifo_push(fifo_of(b, r), r);
    b->queued++;
    b->pinned += r->q_.set != 0;
    if (run_inline(b, r, now)) {
        pthread_mutex_unlock(&b->mu);
        return 0;
    }
    int wake = b->idle > b->nborrowed, pinned = b->pinned;
    pthread_mutex_unlock(&b->mu);
    /* Signalled after the unlock: a waiter woken under the lock would run
     * only to block on it again (two more context switches per request). */
    if (wake)
        wake_for_work(b, pinned);
    return 0;
}

void batcher_cancel(batcher_t *b, struct batcher_request *r) {
    if (!b || !r)
        return;
    atomic_store(&r->cancelled, 1);
    pthread_mutex_lock(&b->mu);
    if (r->q_.state == REQ_QUEUED) {
        b->st.cancelled++;
        fail_queued(b, r, STATUS_CANCELLED, "request cancelled: the client went away");
    }
    pthread_mutex_unlock(&b->mu);
}

void batcher_stop_admission(batcher_t *b) {
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->admitting = 0;
    pthread_mutex_unlock(&b->mu);
}

int batcher_pending(batcher_t *b) {
    if (!b)
        return 0;
    pthread_mutex_lock(&b->mu);
    int n = b->queued + b->running + b->finished.n;
    pthread_mutex_unlock(&b->mu);
    return n;
}

void batcher_get_stats(batcher_t *b, struct batcher_stats *out) {
    memset(out, 0, sizeof *out);
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    *out = b->st;
    out->queued = (uint64_t)b->queued;
    for (int64_t n = 1; n <= b->cap_rows; n++)
        if (b->prof.ns[n])
            out->profile_ns[n < METRICS_MAX_BATCH ? n : METRICS_MAX_BATCH] = b->prof.ns[n];
    if (b->p.pad) {
        out->npad = b->p.pad->nbuckets + 1;
        for (int i = 0; i < b->p.pad->nbuckets; i++)
            out->pad[i].length = b->p.pad->buckets[i];
    }
    pthread_mutex_unlock(&b->mu);
}

/* ---- warmup ----------------------------------------------------------------- */

static void warm_done(struct batcher_request *r) {
    batcher_t *b = r->user;
    pthread_mutex_lock(&b->mu);
    r->q_.state = REQ_DONE;
    pthread_cond_broadcast(&b->warm_cv);
    pthread_mutex_unlock(&b->mu);
}

int batcher_warmup(batcher_t *b, const struct tensor *inputs, int ninputs, int64_t rows, int count, char *err,
                   size_t err_len) {
    int no = b->p.executor.noutputs;
    struct tensor *out = calloc((size_t)(no > 0 ? no : 1), sizeof *out);
    if (!out)
        return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    int rc = 0;
    for (int i = 0; i < b->ninst && !rc; i++) {
        for (int k = 0; k < count && !rc; k++) {
            struct batcher_request r;
            memset(&r, 0, sizeof r);
            r.inputs = inputs;
            r.ninputs = ninputs;
            r.outputs = out;
            r.rows = rows;
            r.done = warm_done;
            r.user = b;
            r.q_.state = REQ_RUNNING;
            pthread_mutex_lock(&b->mu);
            b->inst[i].warm = &r;
            pthread_cond_broadcast(&b->work_cv);
            while (r.q_.state != REQ_DONE)
                pthread_cond_wait(&b->warm_cv, &b->mu);
            pthread_mutex_unlock(&b->mu);
            for (int o = 0; o < r.noutputs; o++) tensor_free_data(&out[o]);
            if (r.status)
                rc = status_set(err, err_len, r.status, "instance %d: %s", i, r.err[0] ? r.err : "failed");
        }
    }
    free(out);
    return rc;
}
