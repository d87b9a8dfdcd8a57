/* test_batch_policy.c - the dynamic batcher's policy (server/batch_policy.h)
 * on tables: each row a queue state, a profile, a configuration and the
 * time, and the decision expected (the batch, its rows and length bucket,
 * when to wake up, which cancelled requests to fail). No batcher, no
 * threads: the same calls the batcher makes under its lock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "server/batch_policy.h"
#include "server/padding.h"

/* Every table's clock starts here; times in the tables are microseconds
 * after it. */
#define T0 1000000000ull
#define US(x) (T0 + (uint64_t)(x) * 1000ull)

#define MAXQ 8    /* requests in a row's queue */
#define NFIFO 3   /* levels 1 and 2, then the delayed FIFO */
#define MAXPROF 8 /* profile entries in a row (bucket 0) */

/* A queued request: its FIFO (0 = highest level, NFIFO - 1 = delayed),
 * rows, the length of its one input's second dim (4 unless given), when it
 * arrived and whether its client went away. */
struct qreq {
    int fifo;
    int64_t rows;
    int64_t len;
    uint64_t at_us;
    int cancelled;
};

struct row {
    const char *name;
    struct batch_config cfg;
    int padded;                   /* cfg.pad = buckets 4 and 8 on input 0's axis 1 */
    struct qreq q[MAXQ];
    int nq;
    struct { int64_t rows; uint64_t ns; } prof[MAXPROF]; /* bucket 0's */
    struct batch_rates rates;     /* in us after T0 (last_arrival) or us (gap, late) */
    int draining;
    uint64_t now_us;
    /* Expected. */
    int action;
    int sel[MAXQ];                /* indices into q, in batch order */
    int nsel;
    int64_t rows;
    int bucket;
    uint64_t wake_us;             /* BATCH_WAIT only */
    int drop[MAXQ];
    int ndrop;
};

/* Configurations the tables start from (instances: 1 unless given). */
#define BATCHING(max) .max_batch_size = (max), .dynamic_batching = 1
#define PREF(...) .preferred_batch_size = {__VA_ARGS__}, .npreferred = sizeof((int[]){__VA_ARGS__}) / sizeof(int)

static const struct row decisions[] = {
    /* ---- the queue and the configuration alone ---- */
    {.name = "an empty queue idles", .cfg = {BATCHING(8), .max_queue_delay_us = 500}, .action = BATCH_IDLE},
    {.name = "without dynamic batching the head goes alone",
     .cfg = {.max_batch_size = 8, .dynamic_batching = 0, .instances = 1},
     .q = {{0, 1}, {0, 1}, {0, 1}}, .nq = 3,
     .action = BATCH_SEND, .sel = {0}, .nsel = 1, .rows = 1},
    {.name = "a model that does not batch runs each request alone",
     .cfg = {.max_batch_size = 0, .dynamic_batching = 1, .instances = 1},
     .q = {{0, 1}, {0, 1}}, .nq = 2,
     .action = BATCH_SEND, .sel = {0}, .nsel = 1, .rows = 1},
    {.name = "a full max batch goes at once, whatever the delay",
     .cfg = {BATCHING(4), .max_queue_delay_us = 1000},
     .q = {{0, 1}, {0, 1}, {0, 2}, {0, 1}}, .nq = 4,
     .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 4},
    {.name = "requests of several rows fill max_batch_size exactly",
     .cfg = {BATCHING(8), .max_queue_delay_us = 1000},
     .q = {{0, 3}, {0, 3}, {0, 2}, {0, 1}}, .nq = 4,
     .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 8},
    {.name = "a request that does not fit ends the batch (no later smaller one passes it)",
     .cfg = {BATCHING(4), .max_queue_delay_us = 1000},
     .q = {{0, 2}, {0, 3}, {0, 1}}, .nq = 3,
     .action = BATCH_SEND, .sel = {0}, .nsel = 1, .rows = 2},

    /* ---- max_queue_delay ---- */
    {.name = "under the delay: wait until the head's delay runs out",
     .cfg = {BATCHING(8), .max_queue_delay_us = 500},
     .q = {{0, 1, 0, 0}, {0, 1, 0, 100}, {0, 1, 0, 200}}, .nq = 3, .now_us = 300,
     .action = BATCH_WAIT, .sel = {0, 1, 2}, .nsel = 3, .rows = 3, .wake_us = 500},
    {.name = "the delay expired: what is there goes, rounded down to a power of two",
     .cfg = {BATCHING(8), .max_queue_delay_us = 500},
     .q = {{0, 1, 0, 0}, {0, 1, 0, 100}, {0, 1, 0, 200}}, .nq = 3, .now_us = 500,
     .action = BATCH_SEND, .sel = {0, 1}, .nsel = 2, .rows = 2},
    {.name = "the delay expired with any_batch_size: all of it goes",
     .cfg = {BATCHING(8), .max_queue_delay_us = 500, .any_batch_size = 1},
     .q = {{0, 1, 0, 0}, {0, 1, 0, 100}, {0, 1, 0, 200}}, .nq = 3, .now_us = 500,
     .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 3},
    {.name = "no delay configured: the batch goes at once",
     .cfg = {BATCHING(8), .any_batch_size = 1},
     .q = {{0, 1}, {0, 1}, {0, 1}}, .nq = 3,
     .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 3},
    {.name = "draining: the batch goes at once whatever the delay",
     .cfg = {BATCHING(8), .max_queue_delay_us = 1000, .any_batch_size = 1},
     .q = {{0, 1}, {0, 1}, {0, 1}}, .nq = 3, .draining = 1,
     .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 3},

    /* ---- preferred batch sizes ---- */
    {.name = "the largest preferred size reached goes at once",
     .cfg = {BATCHING(8), .max_queue_delay_us = 1000, PREF(2, 4)},
     .q = {{0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}}, .nq = 5,
     .action = BATCH_SEND, .sel = {0, 1, 2, 3}, .nsel = 4, .rows = 4},
    {.name = "below the largest preferred size: wait for the delay",
     .cfg = {BATCHING(8), .max_queue_delay_us = 500, PREF(2, 4)},
     .q = {{0, 1}, {0, 1}, {0, 1}}, .nq = 3, .now_us = 100,
     .action = BATCH_WAIT, .sel = {0, 1, 2}, .nsel = 3, .rows = 3, .wake_us = 500},
    {.name = "the delay expired: the largest preferred size formed goes",
     .cfg = {BATCHING(8), .max_queue_delay_us = 500, PREF(2, 4)},
     .q = {{0, 1}, {0, 1}, {0, 1}}, .nq = 3, .now_us = 600,
     .action = BATCH_SEND, .sel = {0, 1}, .nsel = 2, .rows = 2},
    {.name = "past the largest preferred size without forming one: all of it goes (no prefix is one)",
     .cfg = {BATCHING(8), .max_queue_delay_us = 500, PREF(4)},
     .q = {{0, 3}, {0, 2}}, .nq = 2,
     .action = BATCH_SEND, .sel = {0, 1}, .nsel = 2, .rows = 5},
    {.name = "rounding cuts back to the longest prefix of a preferred size",
     .cfg = {BATCHING(8), PREF(2, 6)},
     .q = {{0, 1}, {0, 1}, {0, 1}}, .nq = 3,
     .action = BATCH_SEND, .sel = {0, 1}, .nsel = 2, .rows = 2},

    /* ---- priorities ---- */
    {.name = "the highest level's oldest leads, then fill in priority then arrival order",
     .cfg = {BATCHING(8), .any_batch_size = 1},
     .q = {{1, 1, 0, 0}, {0, 1, 0, 100}, {0, 1, 0, 200}, {1, 1, 0, 300}}, .nq = 4,
     .action = BATCH_SEND, .sel = {1, 2, 0, 3}, .nsel = 4, .rows = 4},
    {.name = "the delayed FIFO is served after every level",
     .cfg = {BATCHING(8), .any_batch_size = 1},
     .q = {{2, 1, 0, 0}, {1, 1, 0, 100}}, .nq = 2,
     .action = BATCH_SEND, .sel = {1, 0}, .nsel = 2, .rows = 2},
    {.name = "a lower level's requests fill what the higher one leaves",
     .cfg = {BATCHING(2), .max_queue_delay_us = 1000},
     .q = {{1, 1, 0, 0}, {1, 1, 0, 10}, {0, 1, 0, 20}}, .nq = 3,
     .action = BATCH_SEND, .sel = {2, 0}, .nsel = 2, .rows = 2},

    /* ---- shapes and padding buckets ---- */
    {.name = "incompatible shapes are not mixed",
     .cfg = {BATCHING(8), .any_batch_size = 1},
     .q = {{0, 1, 4}, {0, 1, 8}, {0, 1, 4}, {0, 1, 8}}, .nq = 4,
     .action = BATCH_SEND, .sel = {0, 2}, .nsel = 2, .rows = 2},
    {.name = "padding: lengths in one bucket share a batch (bucket 4)",
     .cfg = {BATCHING(8), .any_batch_size = 1}, .padded = 1,
     .q = {{0, 1, 3}, {0, 1, 6}, {0, 1, 4}, {0, 1, 2}}, .nq = 4,
     .action = BATCH_SEND, .sel = {0, 2, 3}, .nsel = 3, .rows = 3, .bucket = 0},
    {.name = "padding: a head in the second bucket (8)",
     .cfg = {BATCHING(8), .any_batch_size = 1}, .padded = 1,
     .q = {{0, 1, 6}, {0, 1, 3}, {0, 1, 7}}, .nq = 3,
     .action = BATCH_SEND, .sel = {0, 2}, .nsel = 2, .rows = 2, .bucket = 1},
    {.name = "padding: longer than every bucket, only with its own length",
     .cfg = {BATCHING(8), .any_batch_size = 1}, .padded = 1,
     .q = {{0, 1, 10}, {0, 1, 12}, {0, 1, 10}}, .nq = 3,
     .action = BATCH_SEND, .sel = {0, 2}, .nsel = 2, .rows = 2, .bucket = 2},
    {.name = "padding: the profile of the head's bucket decides under a budget",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1}, .padded = 1,
     .q = {{0, 1, 6}, {0, 1, 7}}, .nq = 2,
     .prof = {{1, 800000}, {2, 800000}, {3, 800000}}, /* bucket 0's: not the head's */
     .action = BATCH_WAIT, .sel = {0, 1}, .nsel = 2, .rows = 2, .bucket = 1, .wake_us = 900},

    /* ---- cancelled requests ---- */
    {.name = "cancelled requests are left out and reported",
     .cfg = {BATCHING(8), .any_batch_size = 1},
     .q = {{0, 1, 0, 0, 1}, {0, 1}, {0, 1, 0, 0, 1}, {0, 1}}, .nq = 4,
     .action = BATCH_SEND, .sel = {1, 3}, .nsel = 2, .rows = 2, .drop = {0, 2}, .ndrop = 2},
    {.name = "only cancelled requests: idle, and they are reported",
     .cfg = {BATCHING(8)},
     .q = {{0, 1, 0, 0, 1}, {1, 1, 0, 0, 1}}, .nq = 2,
     .action = BATCH_IDLE, .drop = {0, 1}, .ndrop = 2},

    /* ---- latency budget: 1000 us, to finish 100 us early; 3 rows queued
     * at T0; a batch of 4 would take 250 us ---- */
#define BUDGET_PROFILE .prof = {{1, 100000}, {2, 150000}, {4, 250000}, {8, 400000}}
#define BUDGET_QUEUE .q = {{0, 1}, {0, 1}, {0, 1}}, .nq = 3
    {.name = "budget: wait for a 4th row until its latest start (900 - 250)",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1}, BUDGET_PROFILE, BUDGET_QUEUE,
     .action = BATCH_WAIT, .sel = {0, 1, 2}, .nsel = 3, .rows = 3, .wake_us = 650},
    {.name = "budget: still waiting just before the latest start",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1}, BUDGET_PROFILE, BUDGET_QUEUE,
     .now_us = 649, .action = BATCH_WAIT, .sel = {0, 1, 2}, .nsel = 3, .rows = 3, .wake_us = 650},
    {.name = "budget: the latest start runs the batch",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1}, BUDGET_PROFILE, BUDGET_QUEUE,
     .now_us = 650, .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 3},
    {.name = "budget: the budget wins over a longer max_queue_delay",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .max_queue_delay_us = 5000, .any_batch_size = 1},
     BUDGET_PROFILE, BUDGET_QUEUE,
     .action = BATCH_WAIT, .sel = {0, 1, 2}, .nsel = 3, .rows = 3, .wake_us = 650},
    {.name = "budget: too late for all, and the cut-off could not run after: all go",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1}, BUDGET_PROFILE, BUDGET_QUEUE,
     .now_us = 700, .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 3},
    {.name = "budget: too late for all, a younger third can run after: two go",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1}, BUDGET_PROFILE,
     .q = {{0, 1}, {0, 1}, {0, 1, 0, 300}}, .nq = 3,
     .now_us = 700, .action = BATCH_SEND, .sel = {0, 1}, .nsel = 2, .rows = 2},
    {.name = "budget: too late even for the head alone: all go",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1}, BUDGET_PROFILE, BUDGET_QUEUE,
     .now_us = 880, .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 3},
    {.name = "budget: rounded down when the cut-off still makes its budget",
     .cfg = {BATCHING(8), .latency_budget_us = 1000}, BUDGET_PROFILE, BUDGET_QUEUE,
     .now_us = 650, .action = BATCH_SEND, .sel = {0, 1}, .nsel = 2, .rows = 2},
    {.name = "budget: not rounded down when the cut-off would miss its budget",
     .cfg = {BATCHING(8), .latency_budget_us = 1000}, BUDGET_PROFILE, BUDGET_QUEUE,
     .now_us = 700, .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 3},
    {.name = "budget: arrivals every 800 us come after the latest start: go now",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1}, BUDGET_PROFILE, BUDGET_QUEUE,
     .rates = {.last_arrival_ns = T0, .gap_ewma_ns = 800000},
     .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 3},
    {.name = "budget: arrivals every 100 us keep the instance busy: wait",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1}, BUDGET_PROFILE, BUDGET_QUEUE,
     .rates = {.last_arrival_ns = T0, .gap_ewma_ns = 100000},
     .action = BATCH_WAIT, .sel = {0, 1, 2}, .nsel = 3, .rows = 3, .wake_us = 650},
    {.name = "budget: arrivals every 200 us, instance under half busy: go now",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1}, BUDGET_PROFILE, BUDGET_QUEUE,
     .rates = {.last_arrival_ns = T0, .gap_ewma_ns = 200000},
     .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 3},
    {.name = "budget: the same rate on two instances: each less busy, go now",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1, .instances = 2},
     .prof = {{1, 100000}, {2, 150000}, {4, 400000}}, BUDGET_QUEUE,
     .rates = {.last_arrival_ns = T0, .gap_ewma_ns = 200000},
     .action = BATCH_SEND, .sel = {0, 1, 2}, .nsel = 3, .rows = 3},
    {.name = "budget: the same rate with a slower model (400 us for 3 rows): wait",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1},
     .prof = {{1, 100000}, {2, 150000}, {4, 400000}, {8, 400000}}, BUDGET_QUEUE,
     .rates = {.last_arrival_ns = T0, .gap_ewma_ns = 200000},
     .action = BATCH_WAIT, .sel = {0, 1, 2}, .nsel = 3, .rows = 3, .wake_us = 500},
    {.name = "budget: late wake-ups (100 us) widen the margin: an earlier latest start",
     .cfg = {BATCHING(8), .latency_budget_us = 1000, .any_batch_size = 1}, BUDGET_PROFILE, BUDGET_QUEUE,
     .rates = {.late_ewma_ns = 100000},
     .action = BATCH_WAIT, .sel = {0, 1, 2}, .nsel = 3, .rows = 3, .wake_us = 450},
    {.name = "budget: nothing learnt: wait until the planned finish",
     .cfg = {BATCHING(8), .latency_budget_us = 1000},
     .q = {{0, 1}}, .nq = 1, .now_us = 10,
     .action = BATCH_WAIT, .sel = {0}, .nsel = 1, .rows = 1, .wake_us = 900},
    {.name = "budget: nothing learnt, the planned finish forces the run",
     .cfg = {BATCHING(8), .latency_budget_us = 1000},
     .q = {{0, 1}}, .nq = 1, .now_us = 900,
     .action = BATCH_SEND, .sel = {0}, .nsel = 1, .rows = 1},
    {.name = "budget: a full batch goes at once",
     .cfg = {BATCHING(2), .latency_budget_us = 1000}, .prof = {{1, 100000}, {2, 150000}}, BUDGET_QUEUE,
     .action = BATCH_SEND, .sel = {0, 1}, .nsel = 2, .rows = 2},
};

/* The pad spec of the padded rows: input 0, axis 1, buckets 4 and 8. */
static const struct pad_spec test_pad = {.nin = 1, .in = {{.input = 0, .axis = 1}}, .buckets = {4, 8}, .nbuckets = 2};

static void run_row(const struct row *w) {
    struct batch_config cfg = w->cfg;
    if (!cfg.instances)
        cfg.instances = 1;
    if (w->padded)
        cfg.pad = &test_pad;
    struct batch_profile prof;
    assert_int_equal(batch_profile_init(&prof, w->padded ? test_pad.nbuckets + 1 : 1, batch_cap_rows(&cfg)), 0);
    for (int k = 0; k < MAXPROF && w->prof[k].rows; k++) {
        assert_true(w->prof[k].rows <= batch_cap_rows(&cfg));
        prof.ns[w->prof[k].rows] = w->prof[k].ns;
    }

    static struct tensor in[MAXQ];
    static struct batcher_request req[MAXQ];
    struct batch_fifo fifo[NFIFO];
    memset(fifo, 0, sizeof fifo);
    memset(req, 0, sizeof req);
    for (int i = 0; i < w->nq; i++) {
        in[i] = (struct tensor){.dtype = DT_FP32, .ndim = 2, .dims = {w->q[i].rows, w->q[i].len ? w->q[i].len : 4}};
        struct batcher_request *r = &req[i];
        r->inputs = &in[i];
        r->ninputs = 1;
        r->rows = w->q[i].rows;
        r->enqueue_ns = US(w->q[i].at_us);
        atomic_store(&r->cancelled, w->q[i].cancelled);
        batch_fifo_push(&fifo[w->q[i].fifo], r);
    }
    struct batch_queue q = {.fifo = fifo, .nfifo = NFIFO, .draining = w->draining};
    struct batcher_request *sel[MAXQ];
    struct batch_decision d = {.sel = sel};
    int a = batch_decide(&cfg, &prof, &w->rates, &q, US(w->now_us), &d);

    char got[256];
    int n = snprintf(got, sizeof got, "action %d sel {", a);
    for (int k = 0; k < d.nsel && n < (int)sizeof got; k++)
        n += snprintf(got + n, sizeof got - (size_t)n, " %d", (int)(d.sel[k] - req));
    if (n < (int)sizeof got)
        snprintf(got + n, sizeof got - (size_t)n, " } rows %lld bucket %d wake %+lld us ndrop %d", (long long)d.rows,
                 d.bucket, d.wake ? (long long)(d.wake - T0) / 1000 : -1, d.ndrop);
    int ok = a == w->action && d.nsel == w->nsel && d.rows == w->rows && d.bucket == w->bucket &&
             d.wake == (w->action == BATCH_WAIT ? US(w->wake_us) : 0) && d.ndrop == w->ndrop;
    for (int k = 0; ok && k < w->nsel; k++) ok = d.sel[k] == &req[w->sel[k]];
    for (int k = 0; ok && k < w->ndrop; k++) ok = d.drop[k] == &req[w->drop[k]];
    batch_profile_release(&prof);
    if (!ok)
        fail_msg("row '%s': got %s", w->name, got);
}

static void test_decisions(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof decisions / sizeof decisions[0]; i++) run_row(&decisions[i]);
}

/* More cancelled requests than one decision reports: BATCH_DROP with the
 * first BATCH_DROP_MAX, and once those are gone the batch. */
static void test_many_cancelled(void **state) {
    (void)state;
    enum { N = BATCH_DROP_MAX + 3 };
    static struct tensor in[N];
    static struct batcher_request req[N];
    struct batch_fifo fifo[1] = {{0}};
    for (int i = 0; i < N; i++) {
        in[i] = (struct tensor){.dtype = DT_FP32, .ndim = 2, .dims = {1, 4}};
        req[i] = (struct batcher_request){.inputs = &in[i], .ninputs = 1, .rows = 1, .enqueue_ns = T0};
        atomic_store(&req[i].cancelled, i < N - 1);
        batch_fifo_push(&fifo[0], &req[i]);
    }
    struct batch_config cfg = {BATCHING(8)};
    struct batch_profile prof;
    struct batch_rates rt = {0};
    assert_int_equal(batch_profile_init(&prof, 1, 8), 0);
    struct batch_queue q = {.fifo = fifo, .nfifo = 1};
    struct batcher_request *sel[8];
    struct batch_decision d = {.sel = sel};
    assert_int_equal(batch_decide(&cfg, &prof, &rt, &q, T0, &d), BATCH_DROP);
    assert_int_equal(d.ndrop, BATCH_DROP_MAX);
    assert_int_equal(d.nsel, 0);
    for (int k = 0; k < d.ndrop; k++) assert_ptr_equal(d.drop[k], &req[k]);
    /* The caller takes them out of the queue. */
    for (int k = 0; k < d.ndrop; k++) batch_fifo_remove(&fifo[0], d.drop[k]);
    assert_int_equal(batch_decide(&cfg, &prof, &rt, &q, T0, &d), BATCH_SEND);
    assert_int_equal(d.ndrop, N - 1 - BATCH_DROP_MAX);
    assert_int_equal(d.nsel, 1);
    assert_ptr_equal(d.sel[0], &req[N - 1]);
    batch_profile_release(&prof);
}

/* Predictions from a profile: each row the sizes seen (cap 8) and a size
 * asked for. */
static void test_predict(void **state) {
    (void)state;
    static const struct {
        const char *name;
        struct { int64_t rows; uint64_t ns; } prof[4];
        int64_t n;
        uint64_t want;
    } t[] = {
        {"nothing learnt", {{0, 0}}, 4, 0},
        {"the size itself", {{4, 250000}}, 4, 250000},
        {"the next size seen above", {{1, 100000}, {2, 150000}, {4, 250000}, {8, 400000}}, 3, 250000},
        {"a slow size bounded by a faster larger one", {{2, 900000}, {4, 250000}}, 2, 250000},
        {"the line through the two largest smaller sizes", {{1, 100000}, {2, 150000}}, 4, 250000},
        {"the line never slopes down", {{1, 200000}, {2, 150000}}, 4, 150000},
        {"one smaller size, scaled by rows", {{2, 150000}}, 4, 300000},
        {"past max_batch_size: max_batch_size", {{8, 400000}}, 20, 400000},
        {"below 1 row: 1 row", {{1, 100000}}, 0, 100000},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        struct batch_profile pr;
        assert_int_equal(batch_profile_init(&pr, 1, 8), 0);
        for (int k = 0; k < 4 && t[i].prof[k].rows; k++) pr.ns[t[i].prof[k].rows] = t[i].prof[k].ns;
        uint64_t got = batch_predict_ns(&pr, 0, t[i].n);
        batch_profile_release(&pr);
        if (got != t[i].want)
            fail_msg("%s: predicted %llu ns, want %llu", t[i].name, (unsigned long long)got,
                     (unsigned long long)t[i].want);
    }
}

/* Learning: a slow first run (plan building) is replaced by the second; a
 * later stalled run counts at most twice the mean; buckets apart; and the
 * heavy mark. */
static void test_profile_learning(void **state) {
    (void)state;
    struct batch_profile pr;
    assert_int_equal(batch_profile_init(&pr, 2, 8), 0);
    static const struct {
        uint64_t ns, want;
    } seq[] = {
        {5000000, 5000000}, /* first run: builds the plan */
        {100000, 100000},   /* the second, lower, replaces it */
        {40000000, 125000}, /* stalled: counted as 200 us (3/4 * 100 + 1/4 * 200) */
        {125000, 125000},
        {25000, 100000},
    };
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        batch_profile_add(&pr, 0, 4, seq[i].ns);
        assert_int_equal(pr.ns[4], seq[i].want);
    }
    assert_int_equal(batch_predict_ns(&pr, 1, 4), 0); /* bucket 1 learnt nothing */
    batch_profile_add(&pr, 1, 4, 999999);
    assert_int_equal(batch_predict_ns(&pr, 1, 4), 999999);
    assert_int_equal(batch_predict_ns(&pr, 0, 4), 100000);
    batch_profile_add(&pr, 0, 9, 1);                  /* past max_batch_size: ignored */
    batch_profile_add(&pr, 0, 0, 1);
    assert_int_equal(pr.n[9], 0); /* where rows 9 of bucket 0 would be: bucket 1's row 0 */

    /* Heavy: at least 2 samples, 250 us a request and 2 ms a run. */
    batch_profile_add(&pr, 0, 8, 3000000);
    assert_false(batch_profile_heavy(&pr, 0, 8, 8)); /* one sample */
    batch_profile_add(&pr, 0, 8, 3000000);
    assert_true(batch_profile_heavy(&pr, 0, 8, 8));  /* 375 us a request */
    assert_false(batch_profile_heavy(&pr, 0, 8, 16)); /* 188 us a request */
    assert_false(batch_profile_heavy(&pr, 0, 4, 1));  /* 100 us a run */
    assert_false(batch_profile_heavy(&pr, 0, 9, 1));
    batch_profile_release(&pr);
    batch_profile_release(&pr); /* harmless twice */
}

static void test_rates(void **state) {
    (void)state;
    struct batch_rates rt = {0};
    batch_note_arrival(&rt, 1000);
    assert_int_equal(rt.gap_ewma_ns, 0); /* one arrival: no gap yet */
    assert_int_equal(rt.last_arrival_ns, 1000);
    batch_note_arrival(&rt, 1100);
    assert_int_equal(rt.gap_ewma_ns, 100);
    batch_note_arrival(&rt, 1300);
    assert_int_equal(rt.gap_ewma_ns, (100 * 7 + 200) / 8);
    /* Lateness rises fast, decays slowly; early is on time. */
    batch_note_wakeup(&rt, 5000, 5400);
    assert_int_equal(rt.late_ewma_ns, 100);
    batch_note_wakeup(&rt, 5000, 4000);
    assert_int_equal(rt.late_ewma_ns, 100 - 100 / 32);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decisions),
        cmocka_unit_test(test_many_cancelled),
        cmocka_unit_test(test_predict),
        cmocka_unit_test(test_profile_learning),
        cmocka_unit_test(test_rates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
