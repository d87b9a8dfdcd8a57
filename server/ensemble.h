/* ensemble.h - Triton's ensembles: a model whose requests run as steps,
 * each a request to another model of the repository, in process.
 *
 * An ensemble (platform "ensemble", config/model_config.h's steps) is a
 * repo_version with no model file and no batcher of its own: its
 * ensemble_t. The inference core (server/infer.c) hands an ensemble's
 * request to ensemble_schedule exactly as it would hand another model's to
 * its batcher (a struct batcher_request: bound inputs in, outputs and done()
 * back), so the result cache, requested outputs, shared memory, binary data
 * and classification work on an ensemble's outputs unchanged.
 *
 * A request's steps: each step runs as soon as the tensors it reads exist,
 * so independent steps run at once. A step's request goes through its
 * model's own batcher (server/batcher.h), where it batches with other
 * ensembles' steps and with direct requests to that model. Tensors are
 * handed over as they are: a step reads the ensemble's inputs and earlier
 * steps' outputs in place (views; bound by kserve_request_bind against the
 * step model's configuration, the same check a client's request gets), and
 * the outputs the ensemble returns are the blocks the producing step's
 * instance wrote. The step models are looked up per request, so a step
 * model reloaded serves the next request at once. Cancellation and the
 * client's deadline reach every step queued; the first step that fails
 * ends the request with the step's model named in the error, and the steps
 * still queued are cancelled.
 *
 * Threads: ensemble_create/free on the repository's control thread;
 * ensemble_schedule and ensemble_cancel on the request's thread; a run's
 * steps finish on the step models' instance threads, the last one calling
 * the ensemble request's done(). */
#ifndef KILN_ENSEMBLE_H
#define KILN_ENSEMBLE_H

#include <stddef.h>

#include "cache/cache.h"
#include "server/batcher.h"
#include "server/repository.h"

typedef struct ensemble ensemble_t;
struct kserve_request;
struct ensemble_run;

/* Checks c (an ensemble's configuration, parsed: config/model_ensemble.c)
 * against the step models loaded now: each is loaded in the version the
 * step asks for; each input_map key is an input of its model, each
 * output_map key an output; the data type and shape of every tensor a step
 * reads agree with the step model's input; every input a step model needs
 * is mapped; the ensemble's outputs agree with what produces them.
 * max_batch_size: a batching ensemble's steps must batch at least as much.
 * Errors name the step, its model and the tensor. An output without
 * labels of its own gets those of the step output that produces it (for
 * classification). c is borrowed and outlives the ensemble (the
 * repo_version's own). NULL with err set. */
ensemble_t *ensemble_create(repository_t *repo, struct model_config *c, char *err, size_t err_len);
/* NULL is a no-op. No request may be running. */
void ensemble_free(ensemble_t *e);
/* Per step: its model, the requests that ran it (succeeded or failed, a
 * step never started not counted) and their time in it, from submission
 * (the step's inputs bound) to done, summed, in ns. Thread-safe. */
struct ensemble_step_stats {
    const char *model;              /* e's, for as long as e */
    uint64_t success, failure, ns;
};
int ensemble_nsteps(const ensemble_t *e); /* 0 for NULL */
void ensemble_step_stats(ensemble_t *e, int step, struct ensemble_step_stats *out);
/* 1 if step model name is one of e's. */
int ensemble_uses(const ensemble_t *e, const char *name);

/* Runs br on v: v's batcher, or, for an ensemble, its steps (*run is then
 * the request's run, which the caller frees with ensemble_run_free after
 * done(); NULL otherwise). cache (NULL: none) is the result cache a step
 * whose model has response_cache looks up and stores into (its
 * in-process tier: server/infer_cache.h). kr (NULL: every output is
 * needed) is the client's request: when it asks for some outputs only,
 * only the steps that lead to them run, and the others' outputs are left
 * empty (ndim 0, no data). The batcher_submit contract: 0 and done()
 * called exactly once (maybe already), or a negative status with br->err
 * set and done() never called. */
int ensemble_schedule(struct repo_version *v, struct batcher_request *br, cache_t *cache,
                      const struct kserve_request *kr, struct ensemble_run **run);
/* batcher_cancel for a request ensemble_schedule took: a run's steps still
 * queued are dropped and it ends STATUS_CANCELLED; steps running complete. */
void ensemble_unschedule(struct repo_version *v, struct batcher_request *br, struct ensemble_run *run);
/* A tensor between a model that batches and one that does not (Triton
 * compares an ensemble's shapes without the batch dim or whole): for mc
 * and its input or output io, one without a batch dim gets a batch of 1
 * when mc batches; one batch of 1 loses the batch dim when mc does not. A
 * view: only t's dims change. */
void ensemble_fit_batch(const struct model_config *mc, const struct model_config_io *io, struct tensor *t);
/* After done(); NULL is a no-op. Releases the step models. */
void ensemble_run_free(struct ensemble_run *run);

#endif
