/* test_runtime.c - the runtime's loops, job queues and control thread,
 * with real threads and event bases and no front end: jobs posted from
 * other threads run on their loop's thread, once each, in order; a job the
 * runtime never ran is dropped through its own drop at free; the control
 * thread runs its jobs off the loops and can answer back on one; work runs
 * on the text threads and its done on the loop that queued it, a full queue
 * refuses work and a stop cancels what still waits; the --max-connections
 * count and the drain flag are shared. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "config/server_config.h"
#include "server/runtime.h"

static struct server_config cfg;

static runtime_t *make_with(int loops, int max_connections, int text_threads) {
    server_config_init(&cfg);
    cfg.http_threads = loops;
    cfg.text_threads = text_threads;
    cfg.max_connections = max_connections;
    char err[256];
    struct runtime_params p = {.config = &cfg};
    runtime_t *rt = runtime_create(&p, err, sizeof err);
    assert_non_null(rt);
    return rt;
}

static runtime_t *make(int loops, int max_connections) { return make_with(loops, max_connections, 2); }

static void unmake(runtime_t *rt) {
    runtime_free(rt);
    server_config_clear(&cfg);
}

/* ---- a job that records where and in what order it ran ---- */

#define NJOBS 200

struct rec {
    struct runtime_job job;
    int seq;
    pthread_t ran_on;
    atomic_int runs, drops;
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int order[NJOBS];
    int n;
} done = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void rec_run(void *arg) {
    struct rec *r = arg;
    r->ran_on = pthread_self();
    atomic_fetch_add(&r->runs, 1);
    pthread_mutex_lock(&done.mu);
    done.order[done.n++] = r->seq;
    pthread_cond_broadcast(&done.cv);
    pthread_mutex_unlock(&done.mu);
}

static void rec_drop(void *arg) {
    struct rec *r = arg;
    atomic_fetch_add(&r->drops, 1);
}

static void wait_done(int n) {
    pthread_mutex_lock(&done.mu);
    while (done.n < n) pthread_cond_wait(&done.cv, &done.mu);
    pthread_mutex_unlock(&done.mu);
}

static void reset_done(void) {
    pthread_mutex_lock(&done.mu);
    done.n = 0;
    pthread_mutex_unlock(&done.mu);
}

struct poster {
    struct runtime_loop *loop;
    struct rec *recs;
    int from, to;
};

static void *post_range(void *arg) {
    struct poster *p = arg;
    for (int i = p->from; i < p->to; i++) runtime_post(p->loop, &p->recs[i].job);
    return NULL;
}

static void test_jobs_run_on_their_loop_in_order(void **state) {
    runtime_t *rt = make(2, 0);
    assert_int_equal(runtime_loops(rt), 2);
    char err[256];
    assert_int_equal(runtime_start(rt, err, sizeof err), 0);
    static struct rec recs[NJOBS];
    memset(recs, 0, sizeof recs);
    for (int i = 0; i < NJOBS; i++) {
        recs[i].seq = i;
        runtime_job_init(&recs[i].job, rec_run, rec_drop, &recs[i]);
    }
    reset_done();
    /* One thread posts to loop 1, in order. */
    struct poster p = {.loop = runtime_loop(rt, 1), .recs = recs, .from = 0, .to = NJOBS};
    pthread_t t;
    pthread_create(&t, NULL, post_range, &p);
    pthread_join(t, NULL);
    wait_done(NJOBS);
    for (int i = 0; i < NJOBS; i++) {
        assert_int_equal(done.order[i], i);
        assert_int_equal(atomic_load(&recs[i].runs), 1);
        assert_int_equal(atomic_load(&recs[i].drops), 0);
        assert_false(pthread_equal(recs[i].ran_on, pthread_self()));
        assert_true(pthread_equal(recs[i].ran_on, recs[0].ran_on)); /* all on loop 1's one thread */
    }
    unmake(rt);
    for (int i = 0; i < NJOBS; i++) assert_int_equal(atomic_load(&recs[i].drops), 0);
}

static void test_jobs_left_are_dropped_at_free(void **state) {
    runtime_t *rt = make(1, 0);
    char err[256];
    assert_int_equal(runtime_start(rt, err, sizeof err), 0);
    runtime_stop(rt);
    static struct rec left[3];
    memset(left, 0, sizeof left);
    runtime_job_init(&left[0].job, rec_run, rec_drop, &left[0]);
    runtime_job_init(&left[1].job, rec_run, NULL, &left[1]); /* nothing to release */
    runtime_job_init(&left[2].job, rec_run, rec_drop, &left[2]);
    runtime_post(runtime_loop(rt, 0), &left[0].job);
    runtime_post(runtime_loop(rt, 0), &left[1].job);
    runtime_control_post(rt, &left[2].job);
    unmake(rt);
    for (int i = 0; i < 3; i++) assert_int_equal(atomic_load(&left[i].runs), 0);
    assert_int_equal(atomic_load(&left[0].drops), 1);
    assert_int_equal(atomic_load(&left[1].drops), 0);
    assert_int_equal(atomic_load(&left[2].drops), 1);
}

/* ---- the control thread: runs off the loops, answers on one ---- */

struct call {
    struct runtime_job job;
    struct runtime_loop *loop;
    pthread_t control_on, answer_on;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int answered;
};

static void call_answer(void *arg) {
    struct call *c = arg;
    pthread_mutex_lock(&c->mu);
    c->answer_on = pthread_self();
    c->answered = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void call_run(void *arg) {
    struct call *c = arg;
    c->control_on = pthread_self();
    runtime_job_init(&c->job, call_answer, NULL, c); /* the same job, now for the loop */
    runtime_post(c->loop, &c->job);
}

static void test_control_thread_answers_on_the_loop(void **state) {
    runtime_t *rt = make(1, 0);
    char err[256];
    assert_int_equal(runtime_start(rt, err, sizeof err), 0);
    struct call c = {.loop = runtime_loop(rt, 0), .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    runtime_job_init(&c.job, call_run, NULL, &c);
    runtime_control_post(rt, &c.job);
    pthread_mutex_lock(&c.mu);
    while (!c.answered) pthread_cond_wait(&c.cv, &c.mu);
    pthread_mutex_unlock(&c.mu);
    assert_false(pthread_equal(c.control_on, pthread_self()));
    assert_false(pthread_equal(c.answer_on, pthread_self()));
    assert_false(pthread_equal(c.control_on, c.answer_on));
    unmake(rt);
}

/* ---- the text threads ---- */

#define NWORK 40

struct task {
    struct runtime_work w;
    int seq;
    pthread_t work_on, done_on;
    int worked, dones, drops, status;
};

/* A gate the first task of a test may wait on, and the count of dones. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, entered, dones;
} gate = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void task_work(struct runtime_work *w) {
    struct task *t = w->arg;
    t->work_on = pthread_self();
    t->worked++;
}

static void gated_work(struct runtime_work *w) {
    pthread_mutex_lock(&gate.mu);
    gate.entered = 1;
    pthread_cond_broadcast(&gate.cv);
    while (!gate.open) pthread_cond_wait(&gate.cv, &gate.mu);
    pthread_mutex_unlock(&gate.mu);
    task_work(w);
}

static void task_done(void *arg) {
    struct task *t = arg;
    t->done_on = pthread_self();
    t->status = t->w.status;
    t->dones++;
    pthread_mutex_lock(&gate.mu);
    gate.dones++;
    pthread_cond_broadcast(&gate.cv);
    pthread_mutex_unlock(&gate.mu);
}

static void task_drop(void *arg) { ((struct task *)arg)->drops++; }

static void gate_reset(void) {
    pthread_mutex_lock(&gate.mu);
    gate.open = gate.entered = gate.dones = 0;
    pthread_mutex_unlock(&gate.mu);
}

static void gate_wait(int *field, int n) {
    pthread_mutex_lock(&gate.mu);
    while (*field < n) pthread_cond_wait(&gate.cv, &gate.mu);
    pthread_mutex_unlock(&gate.mu);
}

static void gate_open(void) {
    pthread_mutex_lock(&gate.mu);
    gate.open = 1;
    pthread_cond_broadcast(&gate.cv);
    pthread_mutex_unlock(&gate.mu);
}

/* The loop's thread, from a job run there. */
static pthread_t loop_thread(struct runtime_loop *l) {
    struct rec r = {0};
    runtime_job_init(&r.job, rec_run, NULL, &r);
    reset_done();
    runtime_post(l, &r.job);
    wait_done(1);
    return r.ran_on;
}

static void test_work_runs_off_the_loop_and_answers_on_it(void **state) {
    runtime_t *rt = make_with(2, 0, 2);
    assert_int_equal(runtime_text_threads(rt), 2);
    char err[256];
    assert_int_equal(runtime_start(rt, err, sizeof err), 0);
    struct runtime_loop *l = runtime_loop(rt, 1);
    assert_ptr_equal(runtime_loop_runtime(l), rt);
    pthread_t lt = loop_thread(l);
    static struct task ts[NWORK];
    memset(ts, 0, sizeof ts);
    gate_reset();
    /* At most 4 per thread wait; the threads take them as they come, so
     * queue in rounds that the queue holds. */
    for (int i = 0; i < NWORK; i++) {
        runtime_work_init(&ts[i].w, task_work, task_done, task_drop, &ts[i]);
        assert_int_equal(runtime_work_queue(l, &ts[i].w, err, sizeof err), 0);
        if (i % 8 == 7) gate_wait(&gate.dones, i + 1);
    }
    gate_wait(&gate.dones, NWORK);
    for (int i = 0; i < NWORK; i++) {
        assert_int_equal(ts[i].worked, 1);
        assert_int_equal(ts[i].dones, 1);
        assert_int_equal(ts[i].status, 0);
        assert_false(pthread_equal(ts[i].work_on, lt));
        assert_false(pthread_equal(ts[i].work_on, pthread_self()));
        assert_true(pthread_equal(ts[i].done_on, lt));
    }
    unmake(rt);
    for (int i = 0; i < NWORK; i++) assert_int_equal(ts[i].drops, 0);
}

static void test_work_queue_is_bounded(void **state) {
    runtime_t *rt = make_with(1, 0, 1);
    char err[256];
    assert_int_equal(runtime_start(rt, err, sizeof err), 0);
    struct runtime_loop *l = runtime_loop(rt, 0);
    enum { N = RUNTIME_WORK_QUEUE_PER_THREAD + 2 };
    static struct task ts[N];
    memset(ts, 0, sizeof ts);
    gate_reset();
    for (int i = 0; i < N; i++) runtime_work_init(&ts[i].w, i ? task_work : gated_work, task_done, task_drop, &ts[i]);
    /* The first runs (and waits at the gate): it holds no place in the queue. */
    assert_int_equal(runtime_work_queue(l, &ts[0].w, err, sizeof err), 0);
    gate_wait(&gate.entered, 1);
    for (int i = 1; i <= RUNTIME_WORK_QUEUE_PER_THREAD; i++)
        assert_int_equal(runtime_work_queue(l, &ts[i].w, err, sizeof err), 0);
    assert_int_equal(runtime_work_queue(l, &ts[N - 1].w, err, sizeof err), STATUS_UNAVAILABLE);
    assert_int_equal(runtime_work_pending(rt), N - 1); /* the refused one is not counted */
    assert_non_null(strstr(err, "busy"));
    assert_non_null(strstr(err, "--text-threads"));
    gate_open();
    gate_wait(&gate.dones, N - 1);
    /* Room again. */
    assert_int_equal(runtime_work_queue(l, &ts[N - 1].w, err, sizeof err), 0);
    gate_wait(&gate.dones, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(ts[i].worked, 1);
        assert_int_equal(ts[i].dones, 1);
        assert_int_equal(ts[i].status, 0);
    }
    runtime_stop(rt); /* the loop ran every done to its end */
    assert_int_equal(runtime_work_pending(rt), 0);
    unmake(rt);
}

static void *stop_main(void *arg) {
    runtime_stop(arg);
    return NULL;
}

static void test_stop_cancels_waiting_work(void **state) {
    runtime_t *rt = make_with(1, 0, 1);
    char err[256];
    assert_int_equal(runtime_start(rt, err, sizeof err), 0);
    struct runtime_loop *l = runtime_loop(rt, 0);
    static struct task ts[RUNTIME_WORK_QUEUE_PER_THREAD + 1];
    memset(ts, 0, sizeof ts);
    gate_reset();
    runtime_work_init(&ts[0].w, gated_work, task_done, task_drop, &ts[0]);
    assert_int_equal(runtime_work_queue(l, &ts[0].w, err, sizeof err), 0);
    gate_wait(&gate.entered, 1);
    for (int i = 1; i < 3; i++) {
        runtime_work_init(&ts[i].w, task_work, task_done, task_drop, &ts[i]);
        assert_int_equal(runtime_work_queue(l, &ts[i].w, err, sizeof err), 0);
    }
    /* Stop while the first still runs: it is waited for, the two waiting
     * are cancelled, and their dones still run on the loop before it ends. */
    pthread_t st;
    pthread_create(&st, NULL, stop_main, rt);
    /* The stop has begun once a work is refused as shutting down; the ones
     * queued before that wait, and are cancelled with the others. */
    int n = 3;
    for (;;) {
        if (n < RUNTIME_WORK_QUEUE_PER_THREAD + 1) runtime_work_init(&ts[n].w, task_work, task_done, task_drop, &ts[n]);
        if (n < RUNTIME_WORK_QUEUE_PER_THREAD + 1 && runtime_work_queue(l, &ts[n].w, err, sizeof err) == 0) n++;
        else if (n < RUNTIME_WORK_QUEUE_PER_THREAD + 1 && strstr(err, "shutting down")) break;
        else {
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
            /* With the queue full the refusal says busy; probe with one more. */
            static struct task probe;
            runtime_work_init(&probe.w, task_work, task_done, task_drop, &probe);
            if (runtime_work_queue(l, &probe.w, err, sizeof err) == STATUS_UNAVAILABLE && strstr(err, "shutting down"))
                break;
        }
    }
    gate_open();
    pthread_join(st, NULL);
    assert_int_equal(runtime_work_pending(rt), 0);
    assert_int_equal(ts[0].worked, 1);
    assert_int_equal(ts[0].status, 0);
    assert_int_equal(ts[0].dones, 1);
    for (int i = 1; i < n; i++) {
        assert_int_equal(ts[i].worked, 0);
        assert_int_equal(ts[i].dones, 1);
        assert_int_equal(ts[i].status, STATUS_CANCELLED);
    }
    unmake(rt);
    for (int i = 0; i < 3; i++) assert_int_equal(ts[i].drops, 0);
}

static void test_no_text_threads(void **state) {
    runtime_t *rt = make_with(1, 0, 0);
    assert_int_equal(runtime_text_threads(rt), 0);
    char err[256];
    struct task t = {0};
    runtime_work_init(&t.w, task_work, task_done, task_drop, &t);
    assert_int_equal(runtime_work_queue(runtime_loop(rt, 0), &t.w, err, sizeof err), STATUS_UNAVAILABLE);
    assert_non_null(strstr(err, "--text-threads 0"));
    unmake(rt);
    assert_int_equal(t.dones + t.drops, 0);
}

/* ---- shared state ---- */

static void test_connections_and_drain_are_shared(void **state) {
    runtime_t *rt = make(1, 2);
    assert_int_equal(runtime_max_connections(rt), 2);
    assert_int_equal(runtime_conn_admit(rt, "test"), 1);
    assert_int_equal(runtime_conn_admit(rt, "test"), 1);
    assert_int_equal(runtime_conn_admit(rt, "test"), 0); /* full: refused, not counted */
    runtime_conn_release(rt);
    assert_int_equal(runtime_conn_admit(rt, "test"), 1);
    char err[200];
    assert_int_equal(runtime_draining(rt), 0);
    assert_int_equal(runtime_accepting(rt, err, sizeof err), STATUS_OK);
    runtime_begin_drain(rt);
    assert_int_equal(runtime_draining(rt), 1);
    assert_int_equal(runtime_accepting(rt, err, sizeof err), STATUS_UNAVAILABLE);
    assert_non_null(strstr(err, "shutting down"));
    unmake(rt); /* never started: nothing to stop */
    runtime_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jobs_run_on_their_loop_in_order),
        cmocka_unit_test(test_jobs_left_are_dropped_at_free),
        cmocka_unit_test(test_control_thread_answers_on_the_loop),
        cmocka_unit_test(test_work_runs_off_the_loop_and_answers_on_it),
        cmocka_unit_test(test_work_queue_is_bounded),
        cmocka_unit_test(test_stop_cancels_waiting_work),
        cmocka_unit_test(test_no_text_threads),
        cmocka_unit_test(test_connections_and_drain_are_shared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
