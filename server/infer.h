/* infer.h - the inference core: one request's life, whatever transport
 * carried it.
 *
 * A transport (HTTP, gRPC) decodes a request into a struct kserve_request
 * and hands it to the core, which does the rest: checks it against the
 * model's configuration (kserve_request_bind: names, data types, shapes,
 * batch size) and orders the inputs as the model wants them, looks the
 * result cache up (in-process, Redis, single flight), submits a miss to the
 * model's batcher, stores the computed result, records the model's metrics
 * and answers through the transport's reply interface.
 * Nothing here knows libevent or HTTP.
 *
 * The reply interface (struct infer_reply_i) is three calls:
 *   post(thread, job)      runs the job (server/runtime.h) on the transport
 *                          thread that owns the request, from any thread (an
 *                          instance thread, the batcher's timer, another I/O
 *                          thread of a single flight). The job lives in the
 *                          core's request, so posting allocates nothing and
 *                          cannot fail (a lost completion would hang a client
 *                          and a drain forever). A front end on the runtime's
 *                          loops passes its loop as thread and runtime_post_any.
 *   encode(ctx, res, ...)  a request succeeded: prepare the answer from res
 *                          (borrowed for the call, except the output blocks
 *                          it takes: struct infer_result). Returns 0, or a negative
 *                          status with err set: the core then counts a
 *                          failure and sends that error instead.
 *   send(ctx, status, msg) the last call for the request: send the prepared
 *                          answer (status 0) or an error (status < 0, msg says
 *                          what was wrong). ctx may be freed inside it; the
 *                          core frees its own request right after.
 * encode and send run on the request's own thread, possibly inside
 * infer_request_start (a validation error, an in-process cache hit, a full
 * queue).
 *
 * A transport's part is: begin, decode into infer_request_decoded, start
 * (or fail/drop when its own decoding failed), infer_request_cancel when
 * its client goes away, and the three calls above. server/http.c and
 * server/grpc_infer.c are two; tests/server/test_infer.c drives the core
 * with a fake one.
 *
 * Threads: infer_core_create/free from one thread; every other function on
 * the thread that owns the request, except infer_core_inflight (any). */
#ifndef KILN_INFER_H
#define KILN_INFER_H

#include <stddef.h>
#include <stdint.h>

#include "cache/cache.h"
#include "common/tensor.h"
#include "config/model_config.h"
#include "config/server_config.h"
#include "server/repository.h"
#include "server/runtime.h"
#include "server/kserve.h"
#include "server/shm.h"

typedef struct infer_core infer_core_t;
struct infer_request;

struct infer_core_params {
    const struct server_config *config; /* borrowed: the result cache's settings */
    repository_t *repo;                 /* borrowed; outlives the core */
};

/* A successful request's outputs, as encode sees them. */
struct infer_result {
    const struct kserve_request *request;  /* what the client asked for */
    const struct model_config *config;     /* the model's, outputs in its order */
    const char *model_name, *model_version;
    /* config->noutputs, in the model's order, each one block
     * (common/tensor.h). encode may take a block, to send it after encode
     * returns without a copy: it sets that output's data to NULL and frees
     * the block itself. The core frees the blocks left, after send. The
     * result cache has its own copy already. */
    struct tensor *outputs;
};

struct infer_reply_i {
    void (*post)(void *thread, struct runtime_job *job);
    int (*encode)(void *ctx, const struct infer_result *res, char *err, size_t err_len);
    void (*send)(void *ctx, int status, const char *msg);
};

/* Makes the core and the result cache the configuration asks for (none when
 * its size is 0 and no Redis is named). NULL with err set on failure. */
infer_core_t *infer_core_create(const struct infer_core_params *p, char *err, size_t err_len);
/* NULL is a no-op. Every request must be finished. */
void infer_core_free(infer_core_t *core);
/* The result cache, or NULL: a transport thread makes its Redis connection
 * from it (cache_redis_create) and the metrics page shows its counters. */
cache_t *infer_core_cache(const infer_core_t *core);
/* The registry of system shared-memory regions requests may name
 * (server/shm.h); the transports' register, unregister and status calls
 * go to it. */
shm_registry_t *infer_core_shm(const infer_core_t *core);
/* Requests begun and not yet answered. */
int infer_core_inflight(const infer_core_t *core);

/* Begins a request for version `version` of `model` (0 = the highest): the
 * model is referenced and the request counted in flight (and pending for
 * the model). Returns NULL with *status and err set when there is no such
 * model (nothing is counted: the transport answers). reply and ctx stay the
 * transport's; thread is what reply->post takes; redis is that thread's
 * Redis connection, or NULL. */
struct infer_request *infer_request_begin(infer_core_t *core, const char *model, int64_t version,
                                          const struct infer_reply_i *reply, void *ctx, void *thread,
                                          cache_redis_t *redis, int *status, char *err, size_t err_len);
/* Where the transport decodes the request (kserve_request_parse). */
struct kserve_request *infer_request_decoded(struct infer_request *r);
/* Validates the decoded request against the model and runs it: reply->send
 * is called exactly once, maybe before this returns. */
void infer_request_start(struct infer_request *r);
/* The transport could not decode the request: answered with status and msg
 * through reply->send, counted as the model's failure. */
void infer_request_fail(struct infer_request *r, int status, const char *msg);
/* The same, but the transport answers itself (an HTTP status of its own):
 * counted as an invalid request, reply is not called, r is freed. */
void infer_request_drop(struct infer_request *r);
/* The client stops waiting at deadline_ns (clock_now_ns; 0 = never): a
 * request still queued then is dropped and answered STATUS_UNAVAILABLE
 * ("Request timeout expired: ...", counted as a timeout). Before start. */
void infer_request_set_deadline(struct infer_request *r, uint64_t deadline_ns);
/* The caller's shared-memory scope (server/shm.h): the regions its tensors
 * may name. Before start; a request that names none needs no call. */
void infer_request_set_shm_owner(struct infer_request *r, shm_owner_t owner);
/* The client went away: a request still queued is dropped before it runs
 * (answered STATUS_CANCELLED later, never inside this call). Harmless before
 * infer_request_start and until send. */
void infer_request_cancel(struct infer_request *r);

#endif
