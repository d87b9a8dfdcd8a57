/* batcher.h - per-model dynamic batcher: the queue policy and a thread per
 * instance.
 *
 * The inference core (server/infer.h) submits a validated request as a
 * batcher_request. The batcher queues it (priority levels, queue limit,
 * timeouts), forms batches of requests whose non-batch shapes agree and
 * hands each batch, on a free instance's thread, to its executor
 * (server/instance.h: gather, run, scatter), then calls each request's
 * done() exactly once: on an instance thread, or on the batcher's timer
 * thread for a queue timeout or cancellation. done() must be quick (hand the
 * result to the I/O thread and return). After done() the batcher does not
 * touch the request again.
 *
 * Threads: all functions are thread-safe. Times are in nanoseconds on
 * CLOCK_MONOTONIC unless a name says otherwise. */
#ifndef KILN_BATCHER_H
#define KILN_BATCHER_H

#include <stdatomic.h>
#include <stdint.h>

#include "common/tensor.h"
#include "server/instance.h"
#include "server/metrics.h"
#include "server/padding.h"

typedef struct batcher batcher_t;

enum batcher_timeout_action { BATCHER_TIMEOUT_REJECT = 0, BATCHER_TIMEOUT_DELAY = 1 };

struct batcher_queue_policy {
    enum batcher_timeout_action timeout_action;
    uint64_t default_timeout_us;   /* 0 = none */
    int allow_timeout_override;
    int max_queue_size;            /* 0 = unbounded */
};

struct batcher_params {
    /* What runs the batches, one thread per executor instance. The batcher
     * owns it from batcher_create on (freed by batcher_free, or by
     * batcher_create when it fails). */
    struct executor executor;
    const char *model_name;        /* for logs */
    int max_batch_size;            /* 0: no batching, inputs have no batch dim */
    int dynamic_batching;          /* 0: every request is its own batch */
    int preferred_batch_size[MODEL_CONFIG_MAX_PREFERRED];
    int npreferred;
    uint64_t max_queue_delay_us;
    uint64_t latency_budget_us;    /* kiln's own: 0 = off (use max_queue_delay_us) */
    int preserve_ordering;
    int priority_levels;           /* 0 or 1 = one level */
    int default_priority_level;    /* 1 = highest */
    struct batcher_queue_policy default_queue_policy;
    /* Padded batching (server/padding.h), or NULL: requests whose padded
     * lengths share a bucket share batches, and the execution profile is
     * kept per bucket. Borrowed; outlives the batcher. */
    const struct pad_spec *pad;
    /* Test hook: a clock to use instead of CLOCK_MONOTONIC (NULL = real). */
    uint64_t (*now_ns)(void *arg);
    void *now_arg;
    /* 0 (default): a batch is cut back to a preferred size, or else to a
     * power of two (or max_batch_size), when its requests allow, so that
     * the engine builds and keeps few plans; the rest leads the next batch.
     * 1: run batches of whatever size they formed. */
    int any_batch_size;
    /* A request the profile says runs in at most this long (ns), arriving
     * to a waiting instance with nothing ahead of it, runs on the
     * submitting thread (batcher.c: the inline run) when the executor's
     * inline_ok agrees. 0: always on the instances' threads. */
    uint64_t inline_max_ns;
};

struct batcher_request {
    /* Set by the submitter, who has checked them against the model
     * (kserve_request_bind): inputs[i] is model input i; with max_batch_size
     * > 0 rows is this request's row count, dims[0] of every input, 1 to
     * max_batch_size (without a batch dim the batcher sets it to 1). The
     * batcher reads the input buffers until done() and never frees them. */
    const struct tensor *inputs;
    int ninputs;
    int64_t rows;
    int priority;                  /* 0 = default level, 1 = highest */
    /* 0: any instance runs it; k > 0: instance k - 1 only (the sequence
     * batcher pins a sequence to its slot's instance). Pinned requests are
     * batched with the same instance's pinned requests only. */
    int pin;
    uint64_t timeout_us;           /* 0 = the queue policy's default */
    /* The client's own deadline (a gRPC call's grpc-timeout), on the
     * batcher's clock (CLOCK_MONOTONIC ns, clock_now_ns); 0 = none. Still
     * queued when it passes, the request is dropped with STATUS_DEADLINE
     * "Request timeout expired: ..." whatever the policy's timeout action,
     * and counted in rejected_timeout. A running request completes. */
    uint64_t deadline_ns;
    atomic_int cancelled;          /* set by batcher_cancel() */
    void (*done)(struct batcher_request *r);
    void *user;
    /* Room for the executor's noutputs tensors, filled by the batcher: the
     * submitter's array, so that no request allocates one. */
    struct tensor *outputs;

    /* Set by the batcher before done(). On success outputs[0..noutputs)
     * (noutputs = the executor's) hold this request's rows, each one owned
     * block (common/tensor.h) that the submitter frees with
     * tensor_free_data; on failure noutputs is 0 and no block is left. */
    int status;                    /* 0 or a negative status */
    char err[256];
    int noutputs;
    uint64_t enqueue_ns, start_ns, end_ns; /* queue time = start - enqueue */
    uint64_t compute_input_ns, compute_infer_ns, compute_output_ns;
    int batch_size;                /* rows in the batch this request ran in */

    /* Private to the batcher: queue links and state, set by batcher_submit. */
    struct {
        struct batcher_request *prev, *next;
        uint64_t deadline_ns;      /* queue timeout, 0 = none */
        int heap_idx;              /* index in the timeout heap, -1 = not there */
        int level;                 /* queue index */
        int set;                   /* FIFO set: 0 shared, k the pinned to instance k - 1 */
        int state;
    } q_;
};

struct batcher_stats {
    uint64_t queued;               /* currently waiting */
    uint64_t executions;           /* batches run */
    uint64_t inferences;           /* rows run */
    uint64_t rejected_queue_full, rejected_timeout, cancelled, failed;
    uint64_t queue_ns_total;
    uint64_t batch_hist[METRICS_MAX_BATCH + 1]; /* [n] = batches of n rows (METRICS_MAX_BATCH
                                                   and more in [METRICS_MAX_BATCH]) */
    uint64_t requests;             /* requests run (ok or failed by the model) */
    uint64_t exec_ns_total;        /* time executing (the executor's exec_ns), summed over batches */
    uint64_t delayed;              /* timeouts with action DELAY (not rejected) */
    uint64_t rejected_invalid;     /* requests that broke batcher_submit's contract */
    uint64_t inline_runs;          /* batches run on the submitting thread (inline_max_ns) */
    uint64_t profile_ns[METRICS_MAX_BATCH + 1]; /* running mean (EWMA) of a batch's execution
                                                   time by rows, as batch_hist; 0 = not seen */
    /* Padded batching: per length bucket ([npad - 1]: longer than every
     * bucket, run at their own length), batches and rows run, and the
     * elements of the first padded input: the requests' own and the
     * batch's (the difference is padding). */
    int npad;
    struct batcher_pad_stats {
        int64_t length;            /* the bucket; 0 for the last */
        uint64_t batches, rows, real, padded;
    } pad[MODEL_PAD_MAX_BUCKETS + 1];
};

batcher_t *batcher_create(const struct batcher_params *p, char *err, size_t err_len);
/* Finishes queued work (drain) and joins the threads; NULL is a no-op. */
void batcher_free(batcher_t *b);
/* Returns 0 (done() will be called, and may already have been, on this
 * thread: the inline run, batcher_params.inline_max_ns; either way r is the
 * batcher's until done(), so the caller must not touch it after a 0) or a
 * negative status with r->err set and
 * done() never called: STATUS_QUEUE_FULL "Exceeds maximum queue size",
 * STATUS_INVALID for a request with another input count than the
 * executor's, or rows outside 1..max_batch_size (a caller's bug: shapes are
 * the submitter's to check). */
int batcher_submit(batcher_t *b, struct batcher_request *r);
/* Marks r cancelled (its client went away); a queued request is dropped
 * before execution and done() is called with STATUS_CANCELLED (on the timer
 * thread, never inside this call). A request already running completes
 * normally. r must not have been freed: calling this after done() ran but
 * before the submitter released r is harmless. */
void batcher_cancel(batcher_t *b, struct batcher_request *r);
/* Runs one request of rows rows (inputs as a batcher_request's, checked by
 * the caller) count times on every instance, each on the instance's own
 * thread, and waits for each: a model's warmup at load, before it takes
 * requests (server/warmup.c). Counted in no statistics and kept out of the
 * execution profile. 0, or the first failure's status with err naming the
 * instance. Not while requests are being submitted. */
int batcher_warmup(batcher_t *b, const struct tensor *inputs, int ninputs, int64_t rows, int count, char *err,
                   size_t err_len);
/* Stops admitting (submit returns STATUS_UNAVAILABLE), runs what is queued. */
void batcher_stop_admission(batcher_t *b);
/* Requests queued or running. */
int batcher_pending(batcher_t *b);
void batcher_get_stats(batcher_t *b, struct batcher_stats *out);

#endif
