/* instance.h - executors: what runs the batches a batcher forms.
 *
 * The batcher (server/batcher.h) keeps the queue policy and one thread per
 * instance; when an instance's thread has formed a batch it hands it to the
 * batcher's executor for that instance. An executor is a table of functions
 * and its context ({iface, ctx}, as kernels/backend.h's backends are).
 * instances_create makes the model's: per instance a backend and an
 * execution context (struct model_exec), gather buffers reused across
 * batches (grown, never shrunk, so a steady load allocates nothing but the
 * requests' outputs) and, on the CPU, a move to more threads once the
 * batcher's profile shows a heavy model. The batcher's tests make the same
 * executor with an execute function of their own instead of the model, so
 * the policy is tested through the seam the real instances use.
 *
 * Threads: run and heavy are called for one instance one batch at a time,
 * from that instance's thread, or (run only, when inline_ok said so) from a
 * request's submitting thread while the instance's own thread sleeps;
 * different instances run in parallel.
 * create and free from one thread, with no batch running. */
#ifndef KILN_INSTANCE_H
#define KILN_INSTANCE_H

#include <stddef.h>
#include <stdint.h>

#include "common/tensor.h"

struct model;
struct pad_spec;
struct batcher_request;

/* Inputs a request may have when the executor does not know the model's count. */
#define EXECUTOR_MAX_INPUTS 16

/* One formed batch. */
struct executor_batch {
    struct batcher_request *const *reqs;  /* its requests, in batch order */
    int n;
    int64_t rows;                         /* their rows, summed */
    uint64_t (*now_ns)(void *arg);        /* the batcher's clock (compute times) */
    void *now_arg;
    uint64_t exec_ns;                     /* set by run: time in the model (the profile's sample) */
    int planned;                          /* set by run: the model built a plan for this batch's
                                             shapes first, so exec_ns is no sample of a run */
    uint64_t pad_real, pad_total;         /* set by run when it padded: the first padded input's
                                             elements, the requests' own and the batch's */
};

struct executor_i {
    /* Runs the batch on instance `instance`: gathers the requests' inputs,
     * executes, and sets every request's status and err, its outputs (its
     * own rows, in its outputs array, each an owned block: common/tensor.h;
     * none on failure), its compute times, end_ns and batch_size. */
    void (*run)(void *ctx, int instance, struct executor_batch *batch);
    /* Optional (NULL: nothing to do). The batcher's profile says batches of
     * this size are heavy (BATCHER_HEAVY_NS a request, BATCHER_HEAVY_RUN_NS
     * a run): the instance may move to more threads. Called after the
     * batch's done() calls. */
    void (*heavy)(void *ctx, int instance, const struct executor_batch *batch);
    /* Optional (NULL: never). Whether instance `instance` would run r alone
     * on the calling thread only (no thread team, no device), so that the
     * batcher may run it on the submitter's thread instead of the
     * instance's (batcher.c: the inline run). Called with the batcher's
     * lock held and the instance idle: quick, and it must not block. */
    int (*inline_ok)(void *ctx, int instance, const struct batcher_request *r);
    void (*free)(void *ctx);
};

struct executor {
    const struct executor_i *iface;       /* NULL: none */
    void *ctx;
    int instances;                        /* >= 1: the batcher runs a thread for each */
    int ninputs;                          /* -1: not known (up to EXECUTOR_MAX_INPUTS) */
    int noutputs;
    int threads;                          /* per instance, for logs */
    char backend[32];                     /* for logs */
};

struct instances_params {
    struct model *model;        /* borrowed; outlives the executor. May be NULL with execute */
    const char *model_name;     /* for logs and messages */
    const char *backend;        /* "cpu" (NULL, "") or "cuda" */
    int count;                  /* instances; 0 = 1 */
    int threads;                /* per instance; 0 = kiln chooses: (cores - 1) / count, at least 1,
                                 * and cores / count on the CPU once runs show a heavy model */
    int max_rows;               /* rows a batch may have: max_batch_size, or 1 */
    const struct pad_spec *pad; /* padded batching (server/padding.h), or NULL; borrowed */
    /* Test hook: runs one batch instead of model_run on the instance's
     * execution context. With it, model may be NULL: then no backend or
     * execution context is made and execute_noutputs gives the output
     * count. The hook has model_run's contract (outputs owned blocks, none
     * left on error). */
    int (*execute)(void *arg, int instance, const struct tensor *inputs, int ninputs, struct tensor *outputs,
                   int noutputs, char *err, size_t err_len);
    void *execute_arg;
    int execute_noutputs;
};

/* Makes the instances into *out. Returns 0, or a negative status with err
 * naming the instance and the reason (a backend not available, no
 * execution context), logged, and *out left empty. */
int instances_create(const struct instances_params *p, struct executor *out, char *err, size_t err_len);
/* Frees an executor's context and empties it; an empty one is a no-op. */
void executor_free(struct executor *ex);

#endif
