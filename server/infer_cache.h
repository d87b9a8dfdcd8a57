/* infer_cache.h - the result cache on the inference path: between a decoded,
 * validated request and the batcher.
 *
 * infer_cache_start looks the request up in the in-process LRU, then in
 * Redis (asynchronously, on the request's I/O thread), then joins the
 * single-flight table: done(arg, 1) means op->outputs hold the answer
 * (copied out of the cache, one block per output as model.h hands them),
 * done(arg, 0) means "compute it": submit to the batcher, then call
 * infer_cache_store with the outputs, or infer_cache_abandon on failure,
 * exactly once. done runs on the request's I/O thread, possibly before
 * infer_cache_start returns. Followers of a single flight are woken on the
 * leader's thread and posted back to their own with post(). */
#ifndef KILN_INFER_CACHE_H
#define KILN_INFER_CACHE_H

#include <stdint.h>

#include "cache/cache.h"
#include "config/model_config.h"
#include "server/kserve.h"
#include "server/runtime.h"

struct infer_cache_op {
    cache_t *cache;
    cache_redis_t *redis;                   /* the I/O thread's connection, or NULL */
    struct cache_key key;
    int leader;                             /* others wait for this request's result */
    uint64_t t0;                            /* lookup start, ns */
    uint64_t lookup_ns;                     /* set before done() */
    struct cache_value *value;              /* a follower's result, while posted */
    const struct model_config *mc;
    int64_t rows;                           /* the request's batch rows; -1 when the model has no batch dim */
    struct tensor *outputs;                 /* the caller's room for mc->noutputs tensors: on a
                                               hit, each a malloc'd block the caller frees */
    struct cache_flight_node flight;        /* single-flight record or queue place, no malloc */
    void (*done)(void *arg, int hit);
    void *arg;
    void (*post)(void *io, struct runtime_job *job);
    void *io;
    struct runtime_job job;                 /* a follower's resume on its own thread */
};

/* Builds the key of a bound request: model name and version, each input in
 * name order (name, dtype, shape, bytes), the requested outputs in name order
 * with their parameters, and the binary_data_output default. Returns 0, or
 * -1 when out of memory (the request is then not cached). */
int infer_cache_key(cache_t *c, const char *model, int64_t version, const struct model_config *mc,
                    const struct tensor *ordered, const struct kserve_request *kr, struct cache_key *out);

void infer_cache_start(struct infer_cache_op *op);
/* Stores the outputs of a computed request (LRU, Redis) and wakes followers. */
void infer_cache_store(struct infer_cache_op *op, const struct tensor *outputs);
void infer_cache_abandon(struct infer_cache_op *op);

/* The in-process tier alone, from any thread: an ensemble's steps, which
 * run on instance threads, where neither Redis (an I/O thread's) nor a
 * single flight's wait fits. Lookup: 1 with outputs[mc->noutputs] filled
 * (as infer_cache_start's hit: rows as there), else 0 and nothing left.
 * Store: the computed outputs under k. */
int infer_cache_lru_lookup(cache_t *c, const struct cache_key *k, const struct model_config *mc, int64_t rows,
                           struct tensor *outputs);
void infer_cache_lru_store(cache_t *c, const struct cache_key *k, const struct model_config *mc,
                           const struct tensor *outputs);

/* Prometheus text for the cache's own counters, appended to buf. */
char *infer_cache_metrics(cache_t *c, char *buf, size_t *len, size_t *cap);

#endif
