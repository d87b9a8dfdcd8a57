/* test_runtime.c - the runtime's loops, job queues and control thread,
 * with real threads and event bases and no front end: jobs posted from
 * other threads run on their loop's thread, once each, in order; a job the
 * runtime never ran is dropped through its own drop at free; the control
 * thread runs its jobs off the loops and can answer back on one; the
 * --max-connections count and the drain flag are shared. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "common/status.h"
#include "config/server_config.h"
#include "server/runtime.h"

static struct server_config cfg;

static runtime_t *make(int loops, int max_connections) {
    server_config_init(&cfg);
    cfg.http_threads = loops;
    cfg.max_connections = max_connections;
    char err[256];
    struct runtime_params p = {.config = &cfg};
    runtime_t *rt = runtime_create(&p, err, sizeof err);
    assert_non_null(rt);
    return rt;
}

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
        cmocka_unit_test(test_connections_and_drain_are_shared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
