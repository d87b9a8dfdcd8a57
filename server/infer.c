/* infer.c - the inference core: validation, result cache, batcher,
 * completion, metrics. See infer.h for the reply interface.
 *
 * A request's path:
 *   begin    reference the model version; count it in flight
 *   start    bind the decoded request to the model (the one validation)
 *            -> cache lookup (LRU, Redis, single flight)  -- hit --> finish
 *            -> batcher_submit                            -- done --> post -> finish
 *               (an ensemble: each step through its model's batcher,
 *               server/ensemble.h; the last step's done posts)
 *   finish   store or abandon the cache entry, encode, record metrics, send
 * finish always runs on the request's own thread: the batcher's done()
 * (an instance or timer thread) only posts it there. */
#include "server/infer.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/status.h"
#include "server/batcher.h"
#include "server/ensemble.h"
#include "server/infer_cache.h"
#include "server/infer_shm.h"
#include "server/metrics.h"

struct infer_core {
    repository_t *repo;
    cache_t *cache;              /* result cache; NULL when off */
    shm_registry_t *shm;         /* registered shared-memory regions */
    atomic_int inflight;
};

struct infer_request {
    infer_core_t *core;
    const struct infer_reply_i *reply;
    void *ctx;                   /* the transport's, for encode and send */
    void *thread;                /* the transport's, for post */
    cache_redis_t *redis;
    struct repo_version *v;
    struct kserve_request kr;
    /* One block for both (one allocation): the model's inputs in its order,
     * views of kr's, and its outputs, from the batcher or the cache. */
    struct tensor *ordered;
    struct tensor *outputs;
    struct batcher_request br;
    struct ensemble_run *run;    /* an ensemble's steps (server/ensemble.h), else NULL */
    struct sequence_item seq;    /* a sequence model's request: its correlation ID and flags */
    uint64_t t0;
    shm_owner_t shm_owner;       /* whose shared-memory regions the request may name */
    int cached;                  /* the result cache is consulted for this request */
    int hit;                     /* and answered it */
    struct infer_cache_op cop;
    struct runtime_job done;     /* the batcher's answer, posted to the request's thread */
};

/* ==== the core =========================================================== */

infer_core_t *infer_core_create(const struct infer_core_params *p, char *err, size_t err_len) {
    infer_core_t *core = calloc(1, sizeof *core);
    if (!core) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    core->repo = p->repo;
    const struct server_config *cfg = p->config;
    struct shm_params sp = {.allow = cfg->allow_client_shm,
                            .key_prefix = cfg->shm_key_prefix,
                            .max_regions = cfg->shm_max_regions,
                            .max_regions_per_owner = cfg->shm_max_regions_per_client,
                            .max_bytes = cfg->shm_max_bytes > 0 ? (uint64_t)cfg->shm_max_bytes : 0};
    core->shm = shm_registry_create(&sp);
    if (!core->shm) {
        free(core);
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    if (cfg->cache_size > 0 || (cfg->redis_url && *cfg->redis_url)) {
        struct cache_params cp = {.lru_bytes = (size_t)cfg->cache_size,
                                  .secret = cfg->cache_secret,
                                  .redis_url = cfg->redis_url,
                                  .redis_timeout_ms = cfg->redis_timeout_ms > 0 ? (uint32_t)cfg->redis_timeout_ms : 0,
                                  .ttl_secs = cfg->cache_ttl_secs > 0 ? (uint32_t)cfg->cache_ttl_secs : 0};
        core->cache = cache_create(&cp, err, err_len);
        if (!core->cache) {
            shm_registry_free(core->shm);
            free(core);
            return NULL;
        }
    }
    return core;
}

void infer_core_free(infer_core_t *core) {
    if (!core) return;
    cache_free(core->cache);
    shm_registry_free(core->shm);
    free(core);
}

cache_t *infer_core_cache(const infer_core_t *core) { return core->cache; }

shm_registry_t *infer_core_shm(const infer_core_t *core) { return core->shm; }

int infer_core_inflight(const infer_core_t *core) { return atomic_load(&((infer_core_t *)core)->inflight); }

/* ==== a request ========================================================== */

/* Uncounts r and frees it. */
static void request_end(struct infer_request *r) {
    atomic_fetch_sub_explicit(&r->v->metrics->pending, 1, memory_order_relaxed);
    atomic_fetch_sub(&r->core->inflight, 1);
    ensemble_run_free(r->run); /* before the ensemble it runs is released */
    repository_release(r->v);
    kserve_request_clear(&r->kr);
    /* One block per output, strings included (common/tensor.h). */
    for (int i = 0; i < r->br.noutputs; i++) tensor_free_data(&r->outputs[i]);
    free(r->ordered);
    free(r);
}

struct infer_request *infer_request_begin(infer_core_t *core, const char *model, int64_t version,
                                          const struct infer_reply_i *reply, void *ctx, void *thread,
                                          cache_redis_t *redis, int *status, char *err, size_t err_len) {
    struct infer_request *r = calloc(1, sizeof *r);
    if (!r) {
        *status = status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    r->t0 = clock_now_ns();
    r->v = repository_acquire(core->repo, model, version, status, err, err_len);
    if (!r->v) {
        /* Not counted per model: there is no such model. */
        free(r);
        return NULL;
    }
    r->core = core;
    r->reply = reply;
    r->ctx = ctx;
    r->thread = thread;
    r->redis = redis;
    atomic_fetch_add(&core->inflight, 1);
    atomic_fetch_add_explicit(&r->v->metrics->pending, 1, memory_order_relaxed);
    return r;
}

struct kserve_request *infer_request_decoded(struct infer_request *r) { return &r->kr; }

/* Answers r through the transport and frees it; on r's thread. */
static void infer_finish(struct infer_request *r, int status, const char *msg) {
    struct metrics_model *m = r->v->metrics;
    if (r->cached) {
        if (status) infer_cache_abandon(&r->cop);
        else if (!r->hit) infer_cache_store(&r->cop, r->outputs);
    }
    char err[512];
    /* Outputs asked for in shared memory go there, from a computed result
     * or a cached one alike. */
    if (!status && (status = infer_shm_write_outputs(&r->kr, &r->v->config, r->outputs, err, sizeof err))) msg = err;
    if (!status) {
        struct infer_result res = {.request = &r->kr, .config = &r->v->config, .model_name = r->v->name,
                                   .model_version = r->v->version_str, .outputs = r->outputs};
        status = r->reply->encode(r->ctx, &res, err, sizeof err);
        if (status) msg = err;
        else if (r->hit) metrics_record_cached(m, clock_now_ns() - r->t0, r->br.rows);
        else
            metrics_record_success(m, clock_now_ns() - r->t0, r->br.start_ns - r->br.enqueue_ns, r->br.compute_input_ns,
                                   r->br.compute_infer_ns, r->br.compute_output_ns, r->br.rows, r->br.batch_size);
    }
    /* A request whose client left is still "answered": the transport drops it. */
    if (status) metrics_record_failure(m, status, clock_now_ns() - r->t0);
    r->reply->send(r->ctx, status, msg);
    request_end(r);
}

void infer_request_fail(struct infer_request *r, int status, const char *msg) { infer_finish(r, status, msg); }

void infer_request_drop(struct infer_request *r) {
    metrics_record_failure(r->v->metrics, STATUS_INVALID, clock_now_ns() - r->t0);
    request_end(r);
}

void infer_request_set_shm_owner(struct infer_request *r, shm_owner_t owner) { r->shm_owner = owner; }

void infer_request_set_deadline(struct infer_request *r, uint64_t deadline_ns) { r->br.deadline_ns = deadline_ns; }

void infer_request_cancel(struct infer_request *r) { ensemble_unschedule(r->v, &r->br, r->run); }

static void infer_complete_cb(void *arg) {
    struct infer_request *r = arg;
    infer_finish(r, r->br.status, r->br.err);
}

/* The outputs asked for with classification, classified here, on the
 * instance thread that computed them: a top-k over many classes formats a
 * string per class, work that would otherwise hold the request's I/O thread
 * and every other client on it. A failure (out of memory) leaves the output
 * to the encoder, which classifies it itself or reports why not. A cached
 * answer is classified by the encoder: the cache keeps the model's outputs. */
static void classify_outputs(struct infer_request *r) {
    const struct model_config *mc = &r->v->config;
    for (int i = 0; i < r->kr.noutputs; i++) {
        struct kserve_output *o = &r->kr.outputs[i];
        int k = o->classification > 0 ? model_config_find_output(mc, o->name) : -1;
        if (k < 0 || !r->outputs[k].data) continue;
        if (kserve_classify(&r->outputs[k], o->classification, mc, k, &o->classified))
            memset(&o->classified, 0, sizeof o->classified);
    }
}

/* On an instance thread (or the batcher's timer thread): hand back to the
 * request's thread and return at once. */
static void infer_done(struct batcher_request *br) {
    struct infer_request *r = br->user;
    if (!br->status) {
        kserve_reshape_outputs(&r->v->config, r->outputs);
        classify_outputs(r);
    }
    runtime_job_init(&r->done, infer_complete_cb, NULL, r);
    r->reply->post(r->thread, &r->done);
}

static void infer_submit(struct infer_request *r) {
    r->br.inputs = r->ordered;
    r->br.outputs = r->outputs;
    r->br.ninputs = r->v->config.ninputs;
    r->br.priority = (int)r->kr.priority;
    r->br.timeout_us = r->kr.timeout_us;
    r->br.done = infer_done;
    r->br.user = r;
    atomic_init(&r->br.cancelled, 0);
    int rc;
    if (r->v->sequencer) {
        /* The sequencer fills the hidden inputs in ordered, then submits. */
        r->seq = (struct sequence_item){.id = r->kr.seq_id, .sid = r->kr.seq_sid, .start = r->kr.seq_start,
                                        .end = r->kr.seq_end};
        rc = sequencer_submit(r->v->sequencer, &r->seq, &r->br, r->ordered);
    } else {
        /* The model's batcher, or an ensemble's steps through theirs. A
         * result to be cached holds every output: the steps all run. */
        rc = ensemble_schedule(r->v, &r->br, r->kr.no_cache ? NULL : r->core->cache, r->cached ? NULL : &r->kr,
                               &r->run);
    }
    if (rc) infer_finish(r, rc, r->br.err);
}

/* The cache's answer: a hit carries the outputs; a miss goes to the batcher. */
static void infer_cache_done(void *arg, int hit) {
    struct infer_request *r = arg;
    metrics_record_cache(r->v->metrics, hit, r->cop.lookup_ns);
    if (!hit) {
        infer_submit(r);
        return;
    }
    r->hit = 1;
    r->br.noutputs = r->v->config.noutputs;
    r->br.enqueue_ns = r->br.start_ns = clock_now_ns();
    infer_finish(r, 0, NULL);
}

void infer_request_start(struct infer_request *r) {
    char err[512];
    int ni = r->v->config.ninputs;
    r->ordered = calloc((size_t)(ni + r->v->config.noutputs) + 1, sizeof *r->ordered);
    r->outputs = r->ordered ? r->ordered + ni : NULL;
    int rc = r->ordered ? infer_shm_resolve(&r->kr, r->v->name, r->core->shm, r->shm_owner, err, sizeof err)
                        : status_set(err, sizeof err, STATUS_NOMEM, "out of memory");
    if (!rc) rc = kserve_request_bind(&r->kr, &r->v->config, r->ordered, &r->br.rows, err, sizeof err);
    /* A sequence model's state outputs are kept, not sent: "every output" means the visible ones. */
    if (!rc && r->v->sequencer && kserve_request_name_outputs(&r->kr, &r->v->config))
        rc = status_set(err, sizeof err, STATUS_NOMEM, "out of memory");
    if (rc) {
        infer_finish(r, rc, err);
        return;
    }
    /* The result cache answers from a stored result, or the batcher computes it. */
    cache_t *cache = r->core->cache;
    if (cache && r->v->config.response_cache && !r->kr.no_cache) {
        r->cop = (struct infer_cache_op){.cache = cache, .redis = r->redis, .mc = &r->v->config,
                                         .rows = r->v->config.max_batch_size > 0 ? r->br.rows : -1,
                                         .outputs = r->outputs,
                                         .done = infer_cache_done, .arg = r, .post = r->reply->post, .io = r->thread};
        if (infer_cache_key(cache, r->v->name, r->v->version, &r->v->config, r->ordered, &r->kr, &r->cop.key) == 0) {
            r->cached = 1;
            infer_cache_start(&r->cop);
            return;
        }
    }
    infer_submit(r);
}
