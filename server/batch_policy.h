/* batch_policy.h - the dynamic batcher's policy as pure functions.
 *
 * Given a view of what is queued, the execution profile, what the batcher
 * has learnt of arrivals and wake-ups, its configuration and the time,
 * batch_decide says which requests form the next batch, how many rows it
 * has and which length bucket it runs in, and whether to run it now or
 * decide again at a given time. The batcher (server/batcher.c) owns the
 * queues, the locks, the threads and the clock, and calls these functions
 * under its lock; the unit tests (tests/server/test_batch_policy.c) call
 * them on tables of queue states, through the same seam.
 *
 * Nothing here takes a lock, starts a thread or reads a clock: the time is
 * a parameter, and a request's enqueue_ns, rows, inputs and cancelled flag
 * (read as part of the queue view) are all the policy looks at; batch_decide
 * changes nothing it is handed but the decision. The learning functions
 * (batch_profile_add, batch_note_*) update the struct they are handed, and
 * batch_fifo_* the FIFO. Times are nanoseconds on the batcher's clock. */
#ifndef KILN_BATCH_POLICY_H
#define KILN_BATCH_POLICY_H

#include <stdint.h>

#include "server/batcher.h"

/* The batcher's configuration, as the policy reads it (from struct
 * batcher_params, checked by batcher_create). */
struct batch_config {
    int max_batch_size;            /* 0: no batching, every request alone */
    int dynamic_batching;          /* 0: every request is its own batch */
    int preferred_batch_size[MODEL_CONFIG_MAX_PREFERRED];
    int npreferred;
    uint64_t max_queue_delay_us;
    uint64_t latency_budget_us;    /* 0 = off (use max_queue_delay_us) */
    int any_batch_size;            /* 1: no rounding of batch sizes */
    int instances;                 /* threads that run batches */
    /* Padded batching, or NULL: requests share a batch when their padded
     * lengths share a bucket; the profile has a row per bucket. Borrowed. */
    const struct pad_spec *pad;
};

/* Rows per batch: max_batch_size, or 1 for a model that does not batch. */
static inline int64_t batch_cap_rows(const struct batch_config *c) {
    return c->max_batch_size > 0 ? c->max_batch_size : 1;
}

/* The execution profile: running mean of a batch's execution time by
 * length bucket and rows, [bucket * (cap_rows + 1) + rows], 0 = not seen;
 * n counts the samples the same way. */
struct batch_profile {
    uint64_t *ns;
    uint32_t *n;
    int nbuckets;                  /* 1, or the padding's buckets + 1 (longer) */
    int64_t cap_rows;
};

/* Allocates a profile of nbuckets rows of cap_rows sizes, all unseen: 0 or
 * STATUS_NOMEM. batch_profile_release frees it (harmless twice). */
int batch_profile_init(struct batch_profile *pr, int nbuckets, int64_t cap_rows);
void batch_profile_release(struct batch_profile *pr);
/* Predicted execution time of a batch of rows rows in bucket, 0 when
 * nothing is known yet. */
uint64_t batch_predict_ns(const struct batch_profile *pr, int bucket, int64_t rows);
/* Adds one run's execution time (a run that built no plan). */
void batch_profile_add(struct batch_profile *pr, int bucket, int64_t rows, uint64_t ns);
/* 1 if the profile says batches of rows rows (nreq requests) in bucket mark
 * the model heavy: see batch_policy.c, BATCH_HEAVY_NS. */
int batch_profile_heavy(const struct batch_profile *pr, int bucket, int64_t rows, int nreq);

/* What the batcher learns of its clients and its own wake-ups. */
struct batch_rates {
    uint64_t last_arrival_ns;      /* of the last admitted request, 0 = none */
    uint64_t gap_ewma_ns;          /* running mean of the gaps between arrivals, 0 = unknown */
    uint64_t late_ewma_ns;         /* high-end lateness of instances' timed wake-ups */
};

/* A request was admitted at now. */
void batch_note_arrival(struct batch_rates *rt, uint64_t now);
/* An instance asked to wake at wake woke at t. */
void batch_note_wakeup(struct batch_rates *rt, uint64_t wake, uint64_t t);

/* One priority level's FIFO, linked through the requests' q_.prev/q_.next:
 * the batcher's own queues are these. */
struct batch_fifo {
    struct batcher_request *head, *tail;
    int n;
};

/* Appends r to f / takes r out of f. */
void batch_fifo_push(struct batch_fifo *f, struct batcher_request *r);
void batch_fifo_remove(struct batch_fifo *f, struct batcher_request *r);

/* The queue as the policy sees it. */
struct batch_queue {
    const struct batch_fifo *fifo; /* highest priority first; the last holds
                                      requests whose queue timeout passed with
                                      the DELAY action */
    int nfifo;
    int draining;                  /* the batcher is closing: send at once */
};

enum batch_action {
    BATCH_IDLE = 0,                /* nothing (live) is queued */
    BATCH_WAIT = 1,                /* decide again at wake, or when a request arrives */
    BATCH_SEND = 2,                /* run sel[0..nsel) now */
    BATCH_DROP = 3,                /* drop[] filled up: fail those, then decide again */
};

/* Cancelled requests one decision reports at most. */
#define BATCH_DROP_MAX 64

struct batch_decision {
    /* The caller's room for cap_rows requests; filled with the batch, the
     * first being its head (its oldest request of the highest level). */
    struct batcher_request **sel;
    int nsel;
    int64_t rows;                  /* rows of sel[0..nsel) */
    int bucket;                    /* the head's length bucket (padded batching), else 0 */
    uint64_t wake;                 /* BATCH_WAIT: when to decide again; else 0 */
    /* Queued requests found cancelled: the caller fails them (whatever the
     * action) before they can run. */
    struct batcher_request *drop[BATCH_DROP_MAX];
    int ndrop;
};

/* The batching policy: fills d (d->sel is the caller's) and returns its
 * enum batch_action. */
int batch_decide(const struct batch_config *c, const struct batch_profile *pr, const struct batch_rates *rt,
                 const struct batch_queue *q, uint64_t now, struct batch_decision *d);

#endif
