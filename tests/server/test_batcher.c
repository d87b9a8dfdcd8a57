/* test_batcher.c - the batcher's policy with an injected clock and an
 * injected executor: batch formation, rows, shapes, queue limit, timeouts
 * (REJECT and DELAY), priorities, cancellation, ordering, admission, drain,
 * latency budget. The executor computes y = 2x + 1 row by row, so every
 * request can check that it got exactly its own rows back. The test that
 * runs a real ONNX model through the batcher is at the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <unistd.h>

#include "common/status.h"
#include "models/model.h"
#include "server/batcher.c"

/* ---- fixtures ---------------------------------------------------------- */

static atomic_uint_fast64_t fake_clock;

static uint64_t fake_now(void *arg) {
    (void)arg;
    return atomic_load(&fake_clock);
}

static void advance_us(uint64_t us) {
    atomic_fetch_add(&fake_clock, us * 1000ull);
}

#define MAX_LOG 4096
/* What the executor saw: one entry per batch. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int gate_closed;          /* executor blocks while set */
    int blocked;              /* executors currently blocked at the gate */
    int nbatch;
    int64_t rows[MAX_LOG];
    float first[MAX_LOG];     /* first input value of the batch */
    int64_t cols[MAX_LOG];    /* dims[1] of input 0 (0 without) */
    int instance[MAX_LOG];
    uint64_t cost_ns;         /* added to the fake clock per batch... */
    uint64_t cost_per_row_ns; /* ... plus this per row */
} ex = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static void ex_reset(void) {
    pthread_mutex_lock(&ex.mu);
    ex.gate_closed = 0;
    ex.blocked = 0;
    ex.nbatch = 0;
    ex.cost_ns = ex.cost_per_row_ns = 0;
    pthread_mutex_unlock(&ex.mu);
    atomic_store(&fake_clock, 1000000000ull);
}

static void gate_close(void) {
    pthread_mutex_lock(&ex.mu);
    ex.gate_closed = 1;
    pthread_mutex_unlock(&ex.mu);
}

static void gate_open(void) {
    pthread_mutex_lock(&ex.mu);
    ex.gate_closed = 0;
    pthread_cond_broadcast(&ex.cv);
    pthread_mutex_unlock(&ex.mu);
}

static int ex_nbatch(void) {
    pthread_mutex_lock(&ex.mu);
    int n = ex.nbatch;
    pthread_mutex_unlock(&ex.mu);
    return n;
}

static int ex_blocked(void) {
    pthread_mutex_lock(&ex.mu);
    int n = ex.blocked;
    pthread_mutex_unlock(&ex.mu);
    return n;
}

/* y = 2x + 1 over FP32 input 0, same shape. */
static int test_execute(void *arg, int instance, const struct tensor *in, int nin, struct tensor *out, int nout,
                        char *err, size_t err_len) {
    (void)arg;
    pthread_mutex_lock(&ex.mu);
    int slot = ex.nbatch < MAX_LOG ? ex.nbatch : MAX_LOG - 1;
    ex.rows[slot] = in[0].dims[0];
    ex.first[slot] = ((const float *)in[0].data)[0];
    ex.cols[slot] = in[0].ndim > 1 ? in[0].dims[1] : 0;
    ex.instance[slot] = instance;
    ex.nbatch++;
    ex.blocked++;
    while (ex.gate_closed)
        pthread_cond_wait(&ex.cv, &ex.mu);
    ex.blocked--;
    uint64_t cost = ex.cost_ns + ex.cost_per_row_ns * (uint64_t)in[0].dims[0];
    pthread_mutex_unlock(&ex.mu);
    if (cost)
        atomic_fetch_add(&fake_clock, cost);
    if (nin < 1 || in[0].dtype != DT_FP32)
        return status_set(err, err_len, STATUS_INVALID, "test executor wants FP32");
    int64_t n = tensor_numel(&in[0]);
    out[0] = in[0];
    out[0].data = malloc((size_t)n * sizeof(float) + 1);
    if (!out[0].data)
        return STATUS_NOMEM;
    for (int64_t i = 0; i < n; i++)
        ((float *)out[0].data)[i] = 2.0f * ((const float *)in[0].data)[i] + 1.0f;
    for (int o = 1; o < nout; o++)
        memset(&out[o], 0, sizeof out[o]);
    return 0;
}

/* A request with rows x cols FP32 values base, base+1, ... */
struct treq {
    struct batcher_request r;
    struct tensor in;
    struct tensor out[2];
    float data[64];
    atomic_int ndone;
    int done_order;
    pthread_t done_thread;
};

static atomic_int done_counter;

static void treq_done(struct batcher_request *r) {
    struct treq *t = r->user;
    t->done_order = atomic_fetch_add(&done_counter, 1);
    t->done_thread = pthread_self();
    atomic_fetch_add(&t->ndone, 1);
}

static void treq_init(struct treq *t, int64_t rows, int64_t cols, float base) {
    memset(t, 0, sizeof *t);
    t->in.dtype = DT_FP32;
    t->in.ndim = 2;
    t->in.dims[0] = rows;
    t->in.dims[1] = cols;
    for (int64_t i = 0; i < rows * cols && i < 64; i++)
        t->data[i] = base + (float)i;
    t->in.data = t->data;
    t->r.inputs = &t->in;
    t->r.ninputs = 1;
    t->r.outputs = t->out;
    t->r.rows = rows;
    t->r.done = treq_done;
    t->r.user = t;
    atomic_init(&t->ndone, 0);
    atomic_init(&t->r.cancelled, 0);
}

static void treq_release(struct treq *t) {
    for (int i = 0; i < t->r.noutputs; i++)
        tensor_free_data(&t->r.outputs[i]);
    t->r.noutputs = 0;
}

/* Checks that t got exactly 2x+1 of its own inputs. */
static void treq_check_ok(struct treq *t) {
    assert_int_equal(atomic_load(&t->ndone), 1);
    if (t->r.status != 0)
        fail_msg("request failed: %s", t->r.err);
    assert_int_equal(t->r.noutputs, 1);
    assert_int_equal(t->r.outputs[0].dims[0], t->in.dims[0]);
    assert_int_equal(t->r.outputs[0].dims[1], t->in.dims[1]);
    const float *y = t->r.outputs[0].data;
    for (int64_t i = 0; i < t->in.dims[0] * t->in.dims[1]; i++)
        assert_true(y[i] == 2.0f * t->data[i] + 1.0f);
}

/* Polls (real time, up to 5 s) until cond() holds. */
#define WAIT_FOR(cond)                                                  \
    do {                                                                \
        int waited_ = 0;                                                \
        while (!(cond) && waited_ < 5000) {                             \
            usleep(1000);                                               \
            waited_++;                                                  \
        }                                                               \
        if (!(cond))                                                    \
            fail_msg("timed out waiting for %s", #cond);                \
    } while (0)

static void settle(void) {
    usleep(20000); /* long enough for a poll at 1 ms to have acted */
}

/* The instances the next make() runs on: the executor the server uses
 * (server/instance.h), with test_execute (or another) instead of a model. */
static struct instances_params inst;

static struct batcher_params base_params(void) {
    struct batcher_params p;
    memset(&p, 0, sizeof p);
    p.model_name = "test";
    p.now_ns = fake_now;
    inst = (struct instances_params){.model_name = "test", .count = 1, .execute = test_execute, .execute_noutputs = 1};
    return p;
}

/* Dynamic batching up to 8 rows, waiting up to 1 ms for more, any batch size. */
static struct batcher_params delay_params(void) {
    struct batcher_params p = base_params();
    p.max_batch_size = 8;
    p.dynamic_batching = 1;
    p.max_queue_delay_us = 1000;
    p.any_batch_size = 1;
    return p;
}

/* Gives p the executor that inst describes, sized for p's batches. */
static void attach(struct batcher_params *p) {
    char err[256] = "";
    inst.max_rows = p->max_batch_size > 0 ? p->max_batch_size : 1;
    if (instances_create(&inst, &p->executor, err, sizeof err))
        fail_msg("instances_create: %s", err);
}

static batcher_t *make(struct batcher_params *p) {
    char err[256] = "";
    attach(p);
    batcher_t *b = batcher_create(p, err, sizeof err);
    if (!b)
        fail_msg("batcher_create: %s", err);
    return b;
}

/* ---- tests ---------------------------------------------------------------- */

static void test_no_batching_runs_each_alone(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    inst.count = 2;
    batcher_t *b = make(&p);
    enum { N = 50 };
    static struct treq t[N];
    for (int i = 0; i < N; i++) {
        treq_init(&t[i], 1, 4, (float)(i * 10));
        t[i].r.rows = 0; /* without a batch dim rows are not needed */
        t[i].in.ndim = 1;
        t[i].in.dims[0] = 4;
        t[i].in.dims[1] = 0;
        assert_int_equal(batcher_submit(b, &t[i].r), 0);
    }
    batcher_free(b);
    assert_int_equal(ex_nbatch(), N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&t[i].ndone), 1);
        assert_int_equal(t[i].r.status, 0);
        const float *y = t[i].r.outputs[0].data;
        for (int k = 0; k < 4; k++)
            assert_true(y[k] == 2.0f * t[i].data[k] + 1.0f);
        treq_release(&t[i]);
    }
}

static void test_delay_then_one_batch(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = delay_params();
    batcher_t *b = make(&p);
    static struct treq t[3];
    for (int i = 0; i < 3; i++) {
        treq_init(&t[i], 1, 2, (float)(100 * i));
        assert_int_equal(batcher_submit(b, &t[i].r), 0);
    }
    settle();
    /* The clock has not moved: the batcher is still waiting for more. */
    assert_int_equal(ex_nbatch(), 0);
    assert_int_equal(batcher_pending(b), 3);
    advance_us(999);
    settle();
    assert_int_equal(ex_nbatch(), 0);
    advance_us(1);
    WAIT_FOR(atomic_load(&t[2].ndone) == 1);
    assert_int_equal(ex_nbatch(), 1);
    assert_int_equal(ex.rows[0], 3);
    for (int i = 0; i < 3; i++) {
        treq_check_ok(&t[i]);
        assert_int_equal(t[i].r.batch_size, 3);
        assert_int_equal(t[i].r.start_ns - t[i].r.enqueue_ns, 1000000);
        treq_release(&t[i]);
    }
    struct batcher_stats st;
    batcher_get_stats(b, &st);
    assert_int_equal(st.executions, 1);
    assert_int_equal(st.inferences, 3);
    assert_int_equal(st.batch_hist[3], 1);
    assert_int_equal(st.queue_ns_total, 3 * 1000000ull);
    batcher_free(b);
}

/* s -> s + "!" over a STRING input, the output one block as model_run
 * returns it (common/tensor.h). */
static int string_execute(void *arg, int instance, const struct tensor *in, int nin, struct tensor *out, int nout,
                          char *err, size_t err_len) {
    (void)arg;
    (void)instance;
    if (nin < 1 || in[0].dtype != DT_STRING)
        return status_set(err, err_len, STATUS_INVALID, "test executor wants STRING");
    int64_t n = tensor_numel(&in[0]);
    struct tensor_str *tmp = calloc((size_t)n + 1, sizeof *tmp);
    for (int64_t i = 0; i < n; i++) {
        struct tensor_str x = tensor_strs(&in[0])[i];
        char *s = malloc(x.len + 1);
        memcpy(s, x.p, x.len);
        s[x.len] = '!';
        tmp[i] = (struct tensor_str){s, x.len + 1};
    }
    out[0] = in[0];
    int rc = tensor_strings_pack(&out[0], tmp);
    for (int64_t i = 0; i < n; i++)
        free((char *)tmp[i].p);
    free(tmp);
    for (int o = 1; o < nout; o++)
        memset(&out[o], 0, sizeof out[o]);
    return rc;
}

/* String tensors through a batch of several requests: gathered into one
 * block, scattered back into one block per request, each freed alone (a
 * batch once freed pointers into the model's string block). */
static void test_strings_batched_and_scattered(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = delay_params();
    inst.execute = string_execute;
    batcher_t *b = make(&p);
    static struct treq t[3];
    const int64_t rows[3] = {1, 3, 2};
    for (int k = 0; k < 3; k++) {
        treq_init(&t[k], rows[k], 2, 0);
        /* A NUL inside each element: the batch carries every byte. */
        char words[6][32];
        struct tensor_str w[6];
        for (int i = 0; i < rows[k] * 2; i++) {
            int len = snprintf(words[i], sizeof words[i], "request %d%celement %d", k, 0, i);
            w[i] = (struct tensor_str){words[i], (size_t)len};
        }
        t[k].in.dtype = DT_STRING;
        assert_int_equal(tensor_strings_pack(&t[k].in, w), 0);
        assert_int_equal(batcher_submit(b, &t[k].r), 0);
    }
    advance_us(1000);
    WAIT_FOR(atomic_load(&t[0].ndone) + atomic_load(&t[1].ndone) + atomic_load(&t[2].ndone) == 3);
    for (int k = 0; k < 3; k++) {
        if (t[k].r.status != 0)
            fail_msg("request %d failed: %s", k, t[k].r.err);
        assert_int_equal(t[k].r.noutputs, 1);
        const struct tensor *y = &t[k].r.outputs[0];
        assert_int_equal(y->dtype, DT_STRING);
        assert_int_equal(y->dims[0], rows[k]);
        assert_int_equal(y->dims[1], 2);
        for (int i = 0; i < rows[k] * 2; i++) {
            char want[40];
            int len = snprintf(want, sizeof want, "request %d%celement %d!", k, 0, i);
            struct tensor_str got = tensor_strs(y)[i];
            assert_int_equal(got.len, (size_t)len);
            assert_memory_equal(got.p, want, (size_t)len);
        }
    }
    struct batcher_stats st;
    batcher_get_stats(b, &st);
    assert_int_equal(st.executions, 1);
    for (int k = 0; k < 3; k++) {
        treq_release(&t[k]);
        tensor_free_data(&t[k].in);
    }
    batcher_free(b);
}

static void test_full_batch_goes_at_once_rows_counted(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.max_batch_size = 4;
    p.dynamic_batching = 1;
    p.max_queue_delay_us = 1000000; /* never reached: the clock stands still */
    batcher_t *b = make(&p);
    static struct treq t[5];
    /* rows 1 + 2 + 1 = 4: full; then 3 rows wait (3 + the next would not fit). */
    treq_init(&t[0], 1, 3, 0);
    treq_init(&t[1], 2, 3, 100);
    treq_init(&t[2], 1, 3, 200);
    treq_init(&t[3], 3, 3, 300);
    treq_init(&t[4], 2, 3, 400);
    for (int i = 0; i < 3; i++)
        assert_int_equal(batcher_submit(b, &t[i].r), 0);
    WAIT_FOR(atomic_load(&t[2].ndone) == 1);
    assert_int_equal(ex.rows[0], 4);
    for (int i = 0; i < 3; i++) {
        treq_check_ok(&t[i]);
        assert_int_equal(t[i].r.batch_size, 4);
        treq_release(&t[i]);
    }
    assert_int_equal(batcher_submit(b, &t[3].r), 0);
    assert_int_equal(batcher_submit(b, &t[4].r), 0);
    /* 3 + 2 > 4: the 3-row batch cannot grow without skipping ahead, so it
     * goes at once; the 2-row request then waits for company until drain. */
    WAIT_FOR(atomic_load(&t[3].ndone) == 1);
    settle();
    assert_int_equal(ex_nbatch(), 2);
    assert_int_equal(atomic_load(&t[4].ndone), 0);
    batcher_free(b);
    assert_int_equal(ex_nbatch(), 3);
    assert_int_equal(ex.rows[1], 3);
    assert_int_equal(ex.rows[2], 2);
    treq_check_ok(&t[3]);
    treq_check_ok(&t[4]);
    treq_release(&t[3]);
    treq_release(&t[4]);
}

static void test_bad_rows_rejected(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.max_batch_size = 4;
    p.dynamic_batching = 1;
    batcher_t *b = make(&p);
    struct treq t;
    treq_init(&t, 5, 1, 0);
    assert_int_equal(batcher_submit(b, &t.r), STATUS_INVALID);
    assert_non_null(strstr(t.r.err, "max_batch_size"));
    treq_init(&t, 0, 1, 0);
    assert_int_equal(batcher_submit(b, &t.r), STATUS_INVALID);
    /* Inputs whose batch dims disagree are kserve_request_bind's to refuse
     * (tests/server/test_kserve.c): the batcher takes the rows it is told. */
    assert_int_equal(atomic_load(&t.ndone), 0);
    struct batcher_stats st;
    batcher_get_stats(b, &st);
    assert_int_equal(st.rejected_invalid, 2);
    batcher_free(b);
    assert_int_equal(atomic_load(&t.ndone), 0);
}

static void test_shapes_not_mixed(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.max_batch_size = 8;
    p.dynamic_batching = 1;
    p.max_queue_delay_us = 500;
    p.any_batch_size = 1;
    batcher_t *b = make(&p);
    static struct treq t[4];
    treq_init(&t[0], 1, 2, 0);
    treq_init(&t[1], 1, 3, 10);
    treq_init(&t[2], 2, 2, 20);
    treq_init(&t[3], 1, 3, 30);
    for (int i = 0; i < 4; i++)
        assert_int_equal(batcher_submit(b, &t[i].r), 0);
    advance_us(500);
    WAIT_FOR(atomic_load(&t[0].ndone) + atomic_load(&t[1].ndone) + atomic_load(&t[2].ndone) +
                 atomic_load(&t[3].ndone) == 4);
    assert_int_equal(ex_nbatch(), 2);
    /* [1,2]+[2,2] -> 3 rows; [1,3]+[1,3] -> 2 rows. */
    assert_int_equal(ex.rows[0], 3);
    assert_int_equal(ex.rows[1], 2);
    for (int i = 0; i < 4; i++) {
        treq_check_ok(&t[i]);
        treq_release(&t[i]);
    }
    batcher_free(b);
}

/* Batches are cut back to powers of two (the engine keeps a plan per batch
 * size): 7 queued rows run as 4, 2 and 1, or as one batch of 7 with
 * any_batch_size. */
static void test_batch_sizes_rounded_to_buckets(void **state) {
    (void)state;
    for (int any = 0; any <= 1; any++) {
        ex_reset();
        struct batcher_params p = base_params();
        p.max_batch_size = 16;
        p.dynamic_batching = 1;
        p.max_queue_delay_us = 100;
        p.any_batch_size = any;
        batcher_t *b = make(&p);
        static struct treq t[7];
        for (int i = 0; i < 7; i++) {
            treq_init(&t[i], 1, 1, (float)i);
            assert_int_equal(batcher_submit(b, &t[i].r), 0);
        }
        advance_us(100);
        WAIT_FOR(batcher_pending(b) == 0);
        if (any) {
            assert_int_equal(ex_nbatch(), 1);
            assert_int_equal(ex.rows[0], 7);
        } else {
            assert_int_equal(ex_nbatch(), 3);
            assert_int_equal(ex.rows[0], 4);
            assert_int_equal(ex.rows[1], 2);
            assert_int_equal(ex.rows[2], 1);
        }
        for (int i = 0; i < 7; i++) {
            treq_check_ok(&t[i]);
            treq_release(&t[i]);
        }
        batcher_free(b);
    }
}

static void test_preferred_batch_size(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.max_batch_size = 8;
    p.dynamic_batching = 1;
    p.max_queue_delay_us = 100000;
    p.preferred_batch_size[0] = 2;
    p.preferred_batch_size[1] = 4;
    p.npreferred = 2;
    batcher_t *b = make(&p);
    static struct treq t[5];
    for (int i = 0; i < 5; i++)
        treq_init(&t[i], 1, 1, (float)i);
    for (int i = 0; i < 3; i++)
        assert_int_equal(batcher_submit(b, &t[i].r), 0);
    settle();
    assert_int_equal(ex_nbatch(), 0); /* 3 rows: below the largest preferred size */
    assert_int_equal(batcher_submit(b, &t[3].r), 0);
    WAIT_FOR(atomic_load(&t[3].ndone) == 1);
    assert_int_equal(ex.rows[0], 4);
    assert_int_equal(batcher_submit(b, &t[4].r), 0);
    settle();
    assert_int_equal(ex_nbatch(), 1);
    advance_us(100000);
    WAIT_FOR(atomic_load(&t[4].ndone) == 1);
    assert_int_equal(ex.rows[1], 1);
    for (int i = 0; i < 5; i++) {
        treq_check_ok(&t[i]);
        treq_release(&t[i]);
    }
    batcher_free(b);
}

static void test_queue_full(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.default_queue_policy.max_queue_size = 2;
    batcher_t *b = make(&p);
    static struct treq t[4];
    for (int i = 0; i < 4; i++) {
        treq_init(&t[i], 1, 1, (float)i);
        t[i].r.rows = 0;
    }
    gate_close();
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    WAIT_FOR(ex_blocked() == 1); /* t0 is running, not queued */
    assert_int_equal(batcher_submit(b, &t[1].r), 0);
    assert_int_equal(batcher_submit(b, &t[2].r), 0);
    assert_int_equal(batcher_submit(b, &t[3].r), STATUS_QUEUE_FULL);
    assert_string_equal(t[3].r.err, "Exceeds maximum queue size");
    struct batcher_stats st;
    batcher_get_stats(b, &st);
    assert_int_equal(st.rejected_queue_full, 1);
    assert_int_equal(st.queued, 2);
    assert_int_equal(batcher_pending(b), 3);
    gate_open();
    batcher_free(b);
    for (int i = 0; i < 3; i++) {
        treq_check_ok(&t[i]);
        treq_release(&t[i]);
    }
    assert_int_equal(atomic_load(&t[3].ndone), 0);
}

static void test_timeout_rejects_at_deadline(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.default_queue_policy.default_timeout_us = 500;
    p.default_queue_policy.allow_timeout_override = 1;
    batcher_t *b = make(&p);
    static struct treq t[4];
    for (int i = 0; i < 4; i++) {
        treq_init(&t[i], 1, 1, (float)i);
        t[i].r.rows = 0;
    }
    t[2].r.timeout_us = 2000; /* overrides the default */
    gate_close();
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    WAIT_FOR(ex_blocked() == 1);
    assert_int_equal(batcher_submit(b, &t[1].r), 0);
    assert_int_equal(batcher_submit(b, &t[2].r), 0);
    advance_us(499);
    settle();
    assert_int_equal(atomic_load(&t[1].ndone), 0);
    advance_us(1);
    /* The instance is still busy with t0: t1 fails now, not when it frees up. */
    WAIT_FOR(atomic_load(&t[1].ndone) == 1);
    assert_int_equal(ex_blocked(), 1);
    assert_int_equal(t[1].r.status, STATUS_TIMEOUT);
    assert_string_equal(t[1].r.err, "Request timeout expired");
    assert_int_equal(t[1].r.noutputs, 0);
    assert_int_equal(atomic_load(&t[2].ndone), 0);
    advance_us(1500);
    WAIT_FOR(atomic_load(&t[2].ndone) == 1);
    assert_int_equal(t[2].r.status, STATUS_TIMEOUT);
    assert_string_equal(t[2].r.err, "Request timeout expired");
    /* A request that is running is not timed out. */
    assert_int_equal(atomic_load(&t[0].ndone), 0);
    assert_int_equal(batcher_submit(b, &t[3].r), 0);
    gate_open();
    WAIT_FOR(atomic_load(&t[3].ndone) == 1);
    treq_check_ok(&t[0]);
    treq_check_ok(&t[3]);
    struct batcher_stats st;
    batcher_get_stats(b, &st);
    assert_int_equal(st.rejected_timeout, 2);
    assert_int_equal(st.executions, 2);
    treq_release(&t[0]);
    treq_release(&t[3]);
    batcher_free(b);
}

static void test_timeout_override_not_allowed(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.default_queue_policy.default_timeout_us = 0;
    p.default_queue_policy.allow_timeout_override = 0;
    batcher_t *b = make(&p);
    static struct treq t[2];
    for (int i = 0; i < 2; i++) {
        treq_init(&t[i], 1, 1, (float)i);
        t[i].r.rows = 0;
    }
    t[1].r.timeout_us = 10;
    gate_close();
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    WAIT_FOR(ex_blocked() == 1);
    assert_int_equal(batcher_submit(b, &t[1].r), 0);
    advance_us(100);
    settle();
    assert_int_equal(atomic_load(&t[1].ndone), 0);
    gate_open();
    batcher_free(b);
    treq_check_ok(&t[1]);
    treq_release(&t[0]);
    treq_release(&t[1]);
}

static void test_timeout_delay_action(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.default_queue_policy.timeout_action = BATCHER_TIMEOUT_DELAY;
    p.default_queue_policy.default_timeout_us = 100;
    p.default_queue_policy.allow_timeout_override = 1;
    batcher_t *b = make(&p);
    static struct treq t[3];
    for (int i = 0; i < 3; i++) {
        treq_init(&t[i], 1, 1, (float)(i * 10));
        t[i].r.rows = 0;
    }
    t[2].r.timeout_us = 1000000;
    gate_close();
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    WAIT_FOR(ex_blocked() == 1);
    assert_int_equal(batcher_submit(b, &t[1].r), 0);
    advance_us(150);
    settle();
    assert_int_equal(batcher_submit(b, &t[2].r), 0);
    /* t1 expired with DELAY: kept, but served after t2, which is in time. */
    gate_open();
    batcher_free(b);
    for (int i = 0; i < 3; i++)
        treq_check_ok(&t[i]);
    assert_true(ex.first[1] == 20.0f);
    assert_true(ex.first[2] == 10.0f);
    for (int i = 0; i < 3; i++)
        treq_release(&t[i]);
}

/* A client's deadline (gRPC's grpc-timeout) drops a queued request even
 * where the policy delays rather than rejects, and even with no queue
 * timeout at all; the earlier of the two applies. */
static void test_client_deadline(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.default_queue_policy.timeout_action = BATCHER_TIMEOUT_DELAY;
    p.default_queue_policy.default_timeout_us = 100;
    batcher_t *b = make(&p);
    static struct treq t[4];
    for (int i = 0; i < 4; i++) {
        treq_init(&t[i], 1, 1, (float)(i * 10));
        t[i].r.rows = 0;
    }
    uint64_t now = atomic_load(&fake_clock);
    t[1].r.deadline_ns = now + 50000;    /* before the policy's 100 us */
    t[2].r.deadline_ns = now + 1000000;  /* after it: delayed first, then dropped */
    gate_close();
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    WAIT_FOR(ex_blocked() == 1);
    for (int i = 1; i < 4; i++)
        assert_int_equal(batcher_submit(b, &t[i].r), 0);
    advance_us(60);
    WAIT_FOR(atomic_load(&t[1].ndone) == 1);
    assert_int_equal(t[1].r.status, STATUS_DEADLINE);
    assert_non_null(strstr(t[1].r.err, "client's deadline"));
    /* gRPC's own words first, which Triton's clients match. */
    assert_int_equal(strncmp(t[1].r.err, "Deadline Exceeded", 17), 0);
    advance_us(100);
    settle();
    assert_int_equal(atomic_load(&t[2].ndone), 0); /* delayed by the policy, still in its client's time */
    advance_us(1000);
    WAIT_FOR(atomic_load(&t[2].ndone) == 1);
    assert_int_equal(t[2].r.status, STATUS_DEADLINE);
    assert_non_null(strstr(t[2].r.err, "client's deadline"));
    gate_open();
    batcher_free(b);
    treq_check_ok(&t[0]);
    treq_check_ok(&t[3]); /* no deadline of its own: delayed, then served */
    treq_release(&t[0]);
    treq_release(&t[3]);
}

static void test_priorities_highest_first(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.priority_levels = 3;
    p.default_priority_level = 2;
    batcher_t *b = make(&p);
    static struct treq t[6];
    int prio[6] = { 0, 3, 0, 1, 3, 1 }; /* 0 = default (2) */
    for (int i = 0; i < 6; i++) {
        treq_init(&t[i], 1, 1, (float)i);
        t[i].r.rows = 0;
        t[i].r.priority = prio[i];
    }
    gate_close();
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    WAIT_FOR(ex_blocked() == 1);
    for (int i = 1; i < 6; i++)
        assert_int_equal(batcher_submit(b, &t[i].r), 0);
    gate_open();
    batcher_free(b);
    /* t0 first (already running), then priority 1: t3, t5; 2: t2; 3: t1, t4. */
    float want[6] = { 0, 3, 5, 2, 1, 4 };
    assert_int_equal(ex_nbatch(), 6);
    for (int i = 0; i < 6; i++)
        assert_true(ex.first[i] == want[i]);
    for (int i = 0; i < 6; i++) {
        treq_check_ok(&t[i]);
        treq_release(&t[i]);
    }
}

static void test_priority_batches_fill_in_priority_order(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.priority_levels = 2;
    p.default_priority_level = 2;
    p.max_batch_size = 2;
    p.dynamic_batching = 1;
    batcher_t *b = make(&p);
    static struct treq t[4];
    for (int i = 0; i < 4; i++)
        treq_init(&t[i], 1, 1, (float)i);
    t[3].r.priority = 1;
    gate_close();
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    WAIT_FOR(ex_blocked() == 1);
    for (int i = 1; i < 4; i++)
        assert_int_equal(batcher_submit(b, &t[i].r), 0);
    gate_open();
    batcher_free(b);
    assert_int_equal(ex_nbatch(), 3);
    assert_true(ex.first[1] == 3.0f); /* t3 leads, t1 joins */
    assert_int_equal(ex.rows[1], 2);
    assert_true(ex.first[2] == 2.0f);
    for (int i = 0; i < 4; i++) {
        treq_check_ok(&t[i]);
        treq_release(&t[i]);
    }
}

static void test_cancel_queued(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    batcher_t *b = make(&p);
    static struct treq t[4];
    for (int i = 0; i < 4; i++) {
        treq_init(&t[i], 1, 1, (float)(i * 10));
        t[i].r.rows = 0;
    }
    gate_close();
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    WAIT_FOR(ex_blocked() == 1);
    for (int i = 1; i < 4; i++)
        assert_int_equal(batcher_submit(b, &t[i].r), 0);
    batcher_cancel(b, &t[1].r);
    WAIT_FOR(atomic_load(&t[1].ndone) == 1);
    assert_int_equal(t[1].r.status, STATUS_CANCELLED);
    /* A request whose flag is set without the call is dropped when reached. */
    atomic_store(&t[2].r.cancelled, 1);
    /* Cancelling a running request does nothing: it completes. */
    batcher_cancel(b, &t[0].r);
    gate_open();
    batcher_free(b);
    assert_int_equal(ex_nbatch(), 2);
    assert_true(ex.first[1] == 30.0f);
    treq_check_ok(&t[0]);
    treq_check_ok(&t[3]);
    assert_int_equal(atomic_load(&t[2].ndone), 1);
    assert_int_equal(t[2].r.status, STATUS_CANCELLED);
    treq_release(&t[0]);
    treq_release(&t[3]);
    /* Cancelling after done() is harmless. */
    batcher_cancel(NULL, &t[3].r);
}

static void test_cancel_counted(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    batcher_t *b = make(&p);
    static struct treq t[3];
    for (int i = 0; i < 3; i++) {
        treq_init(&t[i], 1, 1, (float)i);
        t[i].r.rows = 0;
    }
    gate_close();
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    WAIT_FOR(ex_blocked() == 1);
    assert_int_equal(batcher_submit(b, &t[1].r), 0);
    assert_int_equal(batcher_submit(b, &t[2].r), 0);
    batcher_cancel(b, &t[1].r);
    batcher_cancel(b, &t[1].r); /* twice: still one done() */
    batcher_cancel(b, &t[2].r);
    WAIT_FOR(atomic_load(&t[2].ndone) == 1);
    struct batcher_stats st;
    batcher_get_stats(b, &st);
    assert_int_equal(st.cancelled, 2);
    assert_int_equal(st.queued, 0);
    gate_open();
    batcher_free(b);
    assert_int_equal(atomic_load(&t[1].ndone), 1);
    treq_check_ok(&t[0]);
    treq_release(&t[0]);
}

static void test_stop_admission_runs_queued(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    batcher_t *b = make(&p);
    static struct treq t[3];
    for (int i = 0; i < 3; i++) {
        treq_init(&t[i], 1, 1, (float)i);
        t[i].r.rows = 0;
    }
    gate_close();
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    assert_int_equal(batcher_submit(b, &t[1].r), 0);
    batcher_stop_admission(b);
    assert_int_equal(batcher_submit(b, &t[2].r), STATUS_UNAVAILABLE);
    assert_non_null(strstr(t[2].r.err, "not accepting"));
    gate_open();
    WAIT_FOR(batcher_pending(b) == 0);
    treq_check_ok(&t[0]);
    treq_check_ok(&t[1]);
    assert_int_equal(atomic_load(&t[2].ndone), 0);
    batcher_free(b);
    treq_release(&t[0]);
    treq_release(&t[1]);
}

static void test_preserve_ordering(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    inst.count = 2;
    p.preserve_ordering = 1;
    batcher_t *b = make(&p);
    static struct treq t[2];
    for (int i = 0; i < 2; i++) {
        treq_init(&t[i], 1, 1, (float)i);
        t[i].r.rows = 0;
    }
    atomic_store(&done_counter, 0);
    gate_close();
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    WAIT_FOR(ex_blocked() == 1);
    /* t1 runs on the other instance and finishes first, but its done()
     * waits for t0's. */
    assert_int_equal(batcher_submit(b, &t[1].r), 0);
    WAIT_FOR(ex_blocked() == 2);
    pthread_mutex_lock(&ex.mu);
    ex.gate_closed = 0;
    pthread_cond_broadcast(&ex.cv);
    pthread_mutex_unlock(&ex.mu);
    batcher_free(b);
    assert_int_equal(t[0].done_order, 0);
    assert_int_equal(t[1].done_order, 1);
    treq_check_ok(&t[0]);
    treq_check_ok(&t[1]);
    treq_release(&t[0]);
    treq_release(&t[1]);
}

/* Many threads submit concurrently to several instances; every request
 * gets exactly its own rows back once. */
struct storm {
    batcher_t *b;
    struct treq *t;
    int n;
};

static void *storm_main(void *arg) {
    struct storm *s = arg;
    for (int i = 0; i < s->n; i++) {
        while (batcher_submit(s->b, &s->t[i].r) != 0)
            usleep(100);
    }
    return NULL;
}

static void test_concurrent_storm(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.now_ns = NULL; /* real clock */
    inst.count = 3;
    p.max_batch_size = 16;
    p.dynamic_batching = 1;
    p.max_queue_delay_us = 200;
    p.default_queue_policy.max_queue_size = 64;
    batcher_t *b = make(&p);
    enum { THREADS = 4, PER = 200 };
    static struct treq t[THREADS * PER];
    for (int i = 0; i < THREADS * PER; i++)
        treq_init(&t[i], 1 + i % 3, 2, (float)(i * 8));
    pthread_t th[THREADS];
    struct storm s[THREADS];
    for (int k = 0; k < THREADS; k++) {
        s[k] = (struct storm){ b, &t[k * PER], PER };
        pthread_create(&th[k], NULL, storm_main, &s[k]);
    }
    for (int k = 0; k < THREADS; k++)
        pthread_join(th[k], NULL);
    batcher_free(b);
    int64_t rows = 0;
    for (int i = 0; i < THREADS * PER; i++) {
        treq_check_ok(&t[i]);
        rows += t[i].in.dims[0];
        treq_release(&t[i]);
    }
    int64_t seen = 0;
    int nb = ex_nbatch();
    for (int i = 0; i < nb && i < MAX_LOG; i++) {
        assert_true(ex.rows[i] >= 1 && ex.rows[i] <= 16);
        seen += ex.rows[i];
    }
    assert_int_equal(seen, rows);
}

/* The policy as the batcher calls it (worker_decide, on its own queues),
 * with the instance held busy so the test owns the queue: latency budget
 * decisions against a known profile. The policy alone, on tables of queue
 * states, is tests/server/test_batch_policy.c. */
static void test_latency_budget_decisions(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.max_batch_size = 8;
    p.dynamic_batching = 1;
    p.latency_budget_us = 1000;
    p.any_batch_size = 1;
    batcher_t *b = make(&p);
    static struct treq t[4];
    for (int i = 0; i < 4; i++)
        treq_init(&t[i], 1, 1, (float)i);
    gate_close();
    /* Alone in the queue and nothing learnt: the first request waits for
     * its budget and then goes; the instance is then held at the gate. */
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    settle();
    assert_int_equal(ex_nbatch(), 0);
    advance_us(1000);
    WAIT_FOR(ex_blocked() == 1);
    uint64_t t0 = atomic_load(&fake_clock);
    for (int i = 1; i < 4; i++)
        assert_int_equal(batcher_submit(b, &t[i].r), 0);

    pthread_mutex_lock(&b->mu);
    /* Deadline arithmetic alone: no arrival rate known. */
    b->rates.gap_ewma_ns = 0;
    b->prof.ns[1] = 100000;
    b->prof.ns[2] = 150000;
    b->prof.ns[4] = 250000;
    b->prof.ns[8] = 400000;
    assert_int_equal(batch_predict_ns(&b->prof, 0, 3), 250000); /* the next size seen above */
    assert_int_equal(batch_predict_ns(&b->prof, 0, 8), 400000);
    struct worker scratch;
    memset(&scratch, 0, sizeof scratch);
    struct batcher_request *sel[8];
    scratch.sel = sel;
    uint64_t wake = 0;
    /* The plan is to finish 100 us (a tenth) early: by t0+900 us. 3 rows
     * queued at t0; a 4th would need 250 us: wait until t0+650 us. */
    assert_int_equal(worker_decide(b, &scratch, t0, &wake), BATCH_WAIT);
    assert_int_equal(scratch.rows, 3);
    assert_int_equal(wake, t0 + 650000);
    assert_int_equal(worker_decide(b, &scratch, t0 + 649000, &wake), BATCH_WAIT);
    assert_int_equal(worker_decide(b, &scratch, t0 + 650000, &wake), BATCH_SEND);
    assert_int_equal(scratch.rows, 3);
    /* At t0+700 us 2 rows would make it (700+150 <= 900) and 3 not, but
     * the third, cut off, could not run after them in time (+100 > 900):
     * all three go. */
    assert_int_equal(worker_decide(b, &scratch, t0 + 700000, &wake), BATCH_SEND);
    assert_int_equal(scratch.rows, 3);
    /* Were the third younger (enqueued at t0+300 us), it could: 2 go. */
    scratch.sel[2]->enqueue_ns = t0 + 300000;
    assert_int_equal(worker_decide(b, &scratch, t0 + 700000, &wake), BATCH_SEND);
    assert_int_equal(scratch.rows, 2);
    scratch.sel[2]->enqueue_ns = t0;
    /* Too late even for the head alone (880+100 > 900): all three go. */
    assert_int_equal(worker_decide(b, &scratch, t0 + 880000, &wake), BATCH_SEND);
    assert_int_equal(scratch.rows, 3);
    /* With requests arriving every 800 us (the last at t0), the next is
     * due after the latest start (t0+650 us): waiting would not pay. */
    b->rates.gap_ewma_ns = 800000;
    b->rates.last_arrival_ns = t0;
    assert_int_equal(worker_decide(b, &scratch, t0, &wake), BATCH_SEND);
    assert_int_equal(scratch.rows, 3);
    /* Every 100 us: one is due by t0+100 us, and batches of 3 (250 us
     * for 300 us of arrivals) would keep the instance busy: wait. */
    b->rates.gap_ewma_ns = 100000;
    assert_int_equal(worker_decide(b, &scratch, t0, &wake), BATCH_WAIT);
    assert_int_equal(wake, t0 + 650000);
    /* Every 200 us: one is due before the latest start, but the instance
     * would be busy 250 us out of every 600 us (under half): it keeps up
     * without waiting, so the batch goes now. */
    b->rates.gap_ewma_ns = 200000;
    assert_int_equal(worker_decide(b, &scratch, t0, &wake), BATCH_SEND);
    assert_int_equal(scratch.rows, 3);
    /* The same rate with a slower model (400 us for 3 rows): wait. */
    b->prof.ns[4] = 400000;
    assert_int_equal(worker_decide(b, &scratch, t0, &wake), BATCH_WAIT);
    b->prof.ns[4] = 250000;
    /* A size that once ran slow is bounded by a faster larger size. */
    b->prof.ns[2] = 900000;
    assert_int_equal(batch_predict_ns(&b->prof, 0, 2), 250000);
    b->prof.ns[2] = 150000;
    b->rates.gap_ewma_ns = 0;
    pthread_mutex_unlock(&b->mu);

    /* Let the instance go (its batch takes no fake time): whenever it looks
     * at the queue, before or after the clock reaches t0+650 us, the three
     * rows go together. */
    gate_open();
    advance_us(650);
    batcher_free(b);
    for (int i = 0; i < 4; i++) {
        treq_check_ok(&t[i]);
        treq_release(&t[i]);
    }
    assert_int_equal(ex.rows[1], 3);
}

static void test_latency_budget_learns_and_meets_budget(void **state) {
    (void)state;
    ex_reset();
    pthread_mutex_lock(&ex.mu);
    ex.cost_ns = 200000;        /* 200 us a batch */
    ex.cost_per_row_ns = 10000; /* + 10 us a row */
    pthread_mutex_unlock(&ex.mu);
    struct batcher_params p = base_params();
    p.max_batch_size = 32;
    p.dynamic_batching = 1;
    p.latency_budget_us = 1000;
    batcher_t *b = make(&p);
    enum { N = 80 };
    static struct treq t[N];
    /* Warm-up: one request alone teaches the profile its cost. */
    treq_init(&t[0], 1, 1, 0);
    assert_int_equal(batcher_submit(b, &t[0].r), 0);
    advance_us(1000);
    WAIT_FOR(atomic_load(&t[0].ndone) == 1);
    struct batcher_stats st;
    batcher_get_stats(b, &st);
    assert_int_equal(st.profile_ns[1], 210000);
    /* Then requests arrive every 50 us; each must finish within 1000 us. */
    for (int i = 1; i < N; i++) {
        treq_init(&t[i], 1, 1, (float)i);
        assert_int_equal(batcher_submit(b, &t[i].r), 0);
        settle();
        advance_us(50);
    }
    /* The clock keeps moving in the same steps until the queue is empty. */
    for (int step = 0; step < 100 && batcher_pending(b) > 0; step++) {
        settle();
        advance_us(50);
    }
    assert_int_equal(batcher_pending(b), 0);
    int maxb = 0;
    for (int i = 1; i < N; i++) {
        treq_check_ok(&t[i]);
        uint64_t lat = t[i].r.end_ns - t[i].r.enqueue_ns;
        if (lat > 1000000 + 50000) /* + one arrival step of clock granularity */
            fail_msg("request %d took %llu ns in a batch of %d, budget 1000000", i, (unsigned long long)lat,
                     t[i].r.batch_size);
        if (t[i].r.batch_size > maxb)
            maxb = t[i].r.batch_size;
    }
    /* Each run of one request moves the clock by 210 us while requests
     * come every 50 us: one at a time, the instance cannot keep up, so
     * with ~800 us of slack batches grow past 1 (to 4 and beyond; sizes
     * are rounded down to powers of two). */
    assert_true(maxb >= 4);
    for (int i = 0; i < N; i++)
        treq_release(&t[i]);
    batcher_free(b);
}

/* The execution profile: a slow first run (plan building) is replaced by
 * the second; a later stalled run counts at most twice the mean. */
static void test_profile_ignores_outliers(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = base_params();
    p.max_batch_size = 8;
    p.dynamic_batching = 1;
    batcher_t *b = make(&p);
    pthread_mutex_lock(&b->mu);
    batch_profile_add(&b->prof, 0, 4, 5000000); /* first run: builds the plan */
    batch_profile_add(&b->prof, 0, 4, 100000);
    assert_int_equal(b->prof.ns[4], 100000);
    batch_profile_add(&b->prof, 0, 4, 40000000); /* stalled: counted as 200 us */
    assert_int_equal(b->prof.ns[4], 125000);
    batch_profile_add(&b->prof, 0, 4, 100000);
    assert_true(b->prof.ns[4] < 125000);
    pthread_mutex_unlock(&b->mu);
    batcher_free(b);
}

static void test_create_errors(void **state) {
    (void)state;
    char err[256] = "";
    struct batcher_params p = base_params();
    assert_null(batcher_create(&p, err, sizeof err));
    assert_non_null(strstr(err, "no executor"));
    p = base_params();
    p.max_batch_size = 4;
    p.preferred_batch_size[0] = 5;
    p.npreferred = 1;
    attach(&p); /* the batcher frees it when it fails */
    assert_null(batcher_create(&p, err, sizeof err));
    assert_non_null(strstr(err, "preferred_batch_size"));
    p = base_params();
    p.priority_levels = 2;
    p.default_priority_level = 3;
    attach(&p);
    assert_null(batcher_create(&p, err, sizeof err));
    assert_non_null(strstr(err, "default_priority_level"));
    batcher_free(NULL);
}

/* The real engine behind the batcher: the digits model (input [N,64] FP32,
 * outputs label [N] INT64 and probabilities [N,10] FP32) on the CPU backend.
 * Requests of 1..3 rows with distinct inputs, submitted from several threads
 * to two instances, each get exactly what the model gives for their rows run
 * on their own. */
#define DIGITS_MODEL "model_repository/digits/1/model.onnx"

static struct model *load_digits(void) {
    char err[256] = "";
    struct model_params mp = { .path = DIGITS_MODEL };
    struct model *m = model_load(&mp, err, sizeof err);
    if (!m)
        fail_msg("%s: %s (run from the repository root)", DIGITS_MODEL, err);
    return m;
}

static void test_real_model_digits(void **state) {
    (void)state;
    char err[256] = "";
    struct model *m = load_digits();
    assert_int_equal(model_ninputs(m), 1);
    assert_int_equal(model_noutputs(m), 2);

    enum { N = 120, THREADS = 4 };
    static struct treq t[N];
    static float x[N][3 * 64];
    static int64_t ref_label[N][3];
    static float ref_prob[N][3 * 10];
    struct model_exec *solo = model_exec_create(m, NULL, 1);
    assert_non_null(solo);
    uint32_t seed = 12345;
    for (int i = 0; i < N; i++) {
        int rows = 1 + i % 3;
        for (int k = 0; k < rows * 64; k++) {
            seed = seed * 1664525u + 1013904223u;
            x[i][k] = (float)(seed >> 8) / (float)(1u << 24);
        }
        treq_init(&t[i], rows, 64, 0);
        t[i].in.data = x[i];
        struct tensor out[2];
        if (model_run(solo, &t[i].in, 1, out, 2, err, sizeof err))
            fail_msg("model_run: %s", err);
        assert_int_equal(out[0].dtype, DT_INT64);
        assert_int_equal(out[1].dtype, DT_FP32);
        memcpy(ref_label[i], out[0].data, sizeof(int64_t) * (size_t)rows);
        memcpy(ref_prob[i], out[1].data, sizeof(float) * 10 * (size_t)rows);
        free(out[0].data);
        free(out[1].data);
    }
    model_exec_free(solo);

    struct batcher_params p;
    memset(&p, 0, sizeof p);
    inst = (struct instances_params){.model = m, .model_name = "digits", .count = 2, .threads = 1, .backend = "cpu"};
    p.model_name = "digits";
    p.max_batch_size = 16;
    p.dynamic_batching = 1;
    p.max_queue_delay_us = 2000;
    batcher_t *b = make(&p);
    pthread_t th[THREADS];
    struct storm s[THREADS];
    for (int k = 0; k < THREADS; k++) {
        s[k] = (struct storm){ b, &t[k * (N / THREADS)], N / THREADS };
        pthread_create(&th[k], NULL, storm_main, &s[k]);
    }
    for (int k = 0; k < THREADS; k++)
        pthread_join(th[k], NULL);
    WAIT_FOR(batcher_pending(b) == 0);
    struct batcher_stats st;
    batcher_get_stats(b, &st);
    batcher_free(b);
    /* 240 rows submitted at once with a 2 ms delay: batches of several. */
    assert_int_equal(st.inferences, 240);
    assert_true(st.executions < N);
    assert_int_equal(st.failed, 0);

    for (int i = 0; i < N; i++) {
        struct batcher_request *r = &t[i].r;
        assert_int_equal(atomic_load(&t[i].ndone), 1);
        if (r->status)
            fail_msg("request %d: %s", i, r->err);
        int rows = 1 + i % 3;
        assert_int_equal(r->noutputs, 2);
        assert_int_equal(r->outputs[0].dims[0], rows);
        assert_int_equal(r->outputs[1].dims[0], rows);
        assert_int_equal(r->outputs[1].dims[1], 10);
        assert_memory_equal(r->outputs[0].data, ref_label[i], sizeof(int64_t) * (size_t)rows);
        const float *pr = r->outputs[1].data;
        for (int k = 0; k < rows * 10; k++)
            if (fabsf(pr[k] - ref_prob[i][k]) > 1e-5f)
                fail_msg("request %d prob %d: %g batched vs %g alone", i, k, pr[k], ref_prob[i][k]);
        treq_release(&t[i]);
    }
    model_free(m);
}

/* One thread submitting a request and waiting for it before the next, as
 * an I/O thread's client at concurrency 1 does; counts the requests whose
 * done() ran on this thread (the inline run). */
struct serial {
    batcher_t *b;
    struct treq *t;
    int n;
    const float *x;
    int on_self;
};

static void *serial_main(void *arg) {
    struct serial *s = arg;
    for (int i = 0; i < s->n; i++) {
        struct treq *t = &s->t[i];
        treq_init(t, 1, 64, 0);
        t->in.data = (float *)s->x;
        if (batcher_submit(s->b, &t->r) != 0)
            return NULL;
        while (atomic_load(&t->ndone) == 0)
            usleep(50);
        s->on_self += pthread_equal(t->done_thread, pthread_self()) != 0;
    }
    return NULL;
}

/* A small model's request that finds its instance waiting and no batch
 * running runs on the submitting thread, once the instance has run its
 * shape (plan bound, every step on one thread, the time known); with
 * inline_max_ns 0, never. Serial and from four threads at once, every
 * answer is the model's own. */
static void test_inline_runs_on_submitter(void **state) {
    (void)state;
    char err[256] = "";
    struct model *m = load_digits();
    static float x[64];
    for (int k = 0; k < 64; k++)
        x[k] = (float)(k % 17);
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {1, 64}, .data = x}, ref[2];
    struct model_exec *solo = model_exec_create(m, NULL, 1);
    assert_non_null(solo);
    if (model_run(solo, &in, 1, ref, 2, err, sizeof err))
        fail_msg("model_run: %s", err);
    model_exec_free(solo);

    enum { N = 40, THREADS = 4 };
    static struct treq t[THREADS][N];
    for (int mode = 0; mode < 3; mode++) {
        struct batcher_params p;
        memset(&p, 0, sizeof p);
        inst = (struct instances_params){.model = m, .model_name = "digits", .count = 1, .threads = 1, .backend = "cpu"};
        p.model_name = "digits";
        p.max_batch_size = 16;
        p.dynamic_batching = 1;
        p.inline_max_ns = mode ? 1000000000ull : 0;
        batcher_t *b = make(&p);
        int nthreads = mode == 2 ? THREADS : 1, on_self = 0;
        pthread_t th[THREADS];
        struct serial s[THREADS];
        for (int k = 0; k < nthreads; k++) {
            s[k] = (struct serial){b, t[k], N, x, 0};
            pthread_create(&th[k], NULL, serial_main, &s[k]);
        }
        for (int k = 0; k < nthreads; k++) {
            pthread_join(th[k], NULL);
            on_self += s[k].on_self;
        }
        struct batcher_stats st;
        batcher_get_stats(b, &st);
        batcher_free(b);
        for (int k = 0; k < nthreads; k++)
            for (int i = 0; i < N; i++) {
                struct batcher_request *r = &t[k][i].r;
                assert_int_equal(atomic_load(&t[k][i].ndone), 1);
                if (r->status)
                    fail_msg("mode %d request %d: %s", mode, i, r->err);
                assert_int_equal(r->noutputs, 2);
                assert_memory_equal(r->outputs[0].data, ref[0].data, sizeof(int64_t));
                assert_memory_equal(r->outputs[1].data, ref[1].data, 10 * sizeof(float));
                treq_release(&t[k][i]);
            }
        assert_int_equal(st.requests, (uint64_t)(nthreads * N));
        assert_int_equal(st.inline_runs, (uint64_t)on_self);
        if (mode == 0)
            assert_int_equal(on_self, 0);
        else if (mode == 1)
            assert_true(on_self >= N - 5); /* all but the first runs (plan, profile) */
        /* From four threads at once, whether one finds the instance idle
         * with no batch running depends on the machine's timing: the
         * answers are checked, the count is not. */
    }
    free(ref[0].data);
    free(ref[1].data);
    model_free(m);
}

/* Warmup runs the sample count times on every instance, each on its own
 * thread, and counts it nowhere; a failure names the instance. */
static void test_warmup_every_instance(void **state) {
    (void)state;
    ex_reset();
    struct batcher_params p = delay_params();
    inst.count = 3;
    batcher_t *b = make(&p);
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {2, 4}};
    float data[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    in.data = data;
    char err[256] = "";
    assert_int_equal(batcher_warmup(b, &in, 1, 2, 2, err, sizeof err), 0);
    assert_int_equal(ex_nbatch(), 6);
    int per[3] = {0};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(ex.rows[i], 2);
        assert_true(ex.first[i] == 5.0f);
        per[ex.instance[i]]++;
    }
    for (int i = 0; i < 3; i++) assert_int_equal(per[i], 2);
    struct batcher_stats st;
    batcher_get_stats(b, &st);
    assert_int_equal(st.executions, 0);
    assert_int_equal(st.requests, 0);
    assert_int_equal(st.profile_ns[2], 0);
    /* The executor refuses INT64: the first instance's failure is the answer. */
    in.dtype = DT_INT64;
    in.dims[1] = 2;
    assert_int_equal(batcher_warmup(b, &in, 1, 2, 1, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "instance 0"));
    assert_non_null(strstr(err, "wants FP32"));
    batcher_free(b);
}

/* Padded batching: lengths in one bucket share a batch padded to it, each
 * answer is cut back to its own length; other buckets and lengths past the
 * last bucket run apart; the profile is kept per bucket. */
static void test_padded_batches(void **state) {
    (void)state;
    ex_reset();
    static struct pad_spec pad;
    memset(&pad, 0, sizeof pad);
    pad.nin = 1;
    pad.in[0].axis = 1;
    pad.in[0].value = -1;
    pad.nout = 1;
    pad.out[0].axis = 1;
    pad.buckets[0] = 4;
    pad.buckets[1] = 8;
    pad.nbuckets = 2;
    struct batcher_params p = base_params();
    p.max_batch_size = 8;
    p.dynamic_batching = 1;
    p.max_queue_delay_us = 500;
    p.any_batch_size = 1;
    p.pad = &pad;
    inst.pad = &pad;
    attach(&p);
    char err[256] = "";
    batcher_t *b = batcher_create(&p, err, sizeof err);
    assert_non_null(b);
    static struct treq t[5];
    treq_init(&t[0], 1, 2, 0);
    treq_init(&t[1], 1, 3, 10);
    treq_init(&t[2], 2, 4, 20);
    treq_init(&t[3], 1, 6, 30);
    treq_init(&t[4], 1, 10, 40);
    for (int i = 0; i < 5; i++)
        assert_int_equal(batcher_submit(b, &t[i].r), 0);
    advance_us(500);
    WAIT_FOR(atomic_load(&t[0].ndone) + atomic_load(&t[1].ndone) + atomic_load(&t[2].ndone) +
                 atomic_load(&t[3].ndone) + atomic_load(&t[4].ndone) == 5);
    assert_int_equal(ex_nbatch(), 3);
    /* Bucket 4: 1 + 1 + 2 rows at 4 columns; bucket 8: one row at 8; 10 alone. */
    assert_int_equal(ex.rows[0], 4);
    assert_int_equal(ex.cols[0], 4);
    assert_int_equal(ex.rows[1], 1);
    assert_int_equal(ex.cols[1], 8);
    assert_int_equal(ex.cols[2], 10);
    for (int i = 0; i < 5; i++) {
        treq_check_ok(&t[i]);
        treq_release(&t[i]);
    }
    struct batcher_stats st;
    batcher_get_stats(b, &st);
    assert_int_equal(st.npad, 3);
    assert_int_equal(st.pad[0].length, 4);
    assert_int_equal(st.pad[0].batches, 1);
    assert_int_equal(st.pad[0].real, 2 + 3 + 8);
    assert_int_equal(st.pad[0].padded, 16);
    assert_int_equal(st.pad[1].padded, 8);
    assert_int_equal(st.pad[2].real, 10);
    /* One profile per bucket: bucket 1's times do not predict bucket 0's. */
    pthread_mutex_lock(&b->mu);
    assert_true(batch_predict_ns(&b->prof, 0, 4) > 0);
    batch_profile_add(&b->prof, 1, 4, 999999);
    assert_true(batch_predict_ns(&b->prof, 0, 4) != 999999);
    assert_int_equal(batch_predict_ns(&b->prof, 1, 4), 999999);
    pthread_mutex_unlock(&b->mu);
    batcher_free(b);
    inst.pad = NULL;
}

int main(void) {
    /* oneDNN shares primitive descriptors between threads through its own
     * cache, synchronized inside the (uninstrumented) library: under TSan
     * two instances building plans at once would be reported. Without the
     * cache every instance makes its own. */
    setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_batching_runs_each_alone),
        cmocka_unit_test(test_warmup_every_instance),
        cmocka_unit_test(test_delay_then_one_batch),
        cmocka_unit_test(test_strings_batched_and_scattered),
        cmocka_unit_test(test_full_batch_goes_at_once_rows_counted),
        cmocka_unit_test(test_bad_rows_rejected),
        cmocka_unit_test(test_shapes_not_mixed),
        cmocka_unit_test(test_padded_batches),
        cmocka_unit_test(test_batch_sizes_rounded_to_buckets),
        cmocka_unit_test(test_preferred_batch_size),
        cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_timeout_rejects_at_deadline),
        cmocka_unit_test(test_timeout_override_not_allowed),
        cmocka_unit_test(test_timeout_delay_action),
        cmocka_unit_test(test_client_deadline),
        cmocka_unit_test(test_priorities_highest_first),
        cmocka_unit_test(test_priority_batches_fill_in_priority_order),
        cmocka_unit_test(test_cancel_queued),
        cmocka_unit_test(test_cancel_counted),
        cmocka_unit_test(test_stop_admission_runs_queued),
        cmocka_unit_test(test_preserve_ordering),
        cmocka_unit_test(test_concurrent_storm),
        cmocka_unit_test(test_latency_budget_decisions),
        cmocka_unit_test(test_latency_budget_learns_and_meets_budget),
        cmocka_unit_test(test_profile_ignores_outliers),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_real_model_digits),
        cmocka_unit_test(test_inline_runs_on_submitter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
