/* model.h - a loaded ONNX model, ready to run: the public face of the engine.
 *
 * model_load parses the file, checks it, runs the load-time passes (constant
 * folding, Conv+BatchNorm folding, activation/bias fusion) and keeps the graph.
 * A plan (kernels, memory offsets, workspaces) is built on first use of each
 * input shape signature and kept in an LRU of max_plans entries; by default
 * the LRU doubles, up to MODEL_PLANS_LIMIT, when plans are evicted and soon
 * rebuilt (a model fed more shapes than it holds).
 *
 * Threads: a struct model is shared and immutable after load except for its
 * plan cache, which has its own lock. A struct model_exec (arena, backend
 * context) belongs to one thread at a time: make one per instance thread. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include <stddef.h>

#include "common/model_io.h"
#include "common/tensor.h"

#define MODEL_PLANS_LIMIT 256

struct model;
struct model_exec;
struct backend;

struct model_params {
    const char *path;     /* model.onnx; external data files are read beside it */
    int max_plans;        /* LRU bound on cached plans, fixed; 0 = 16, growing to MODEL_PLANS_LIMIT */
    int max_dim;          /* largest accepted value of any input dim; 0 = MODEL_MAX_DIM */
    /* The model's optimization settings, for device backends (the CPU runs
     * FP32 and has no graphs): fp16 = 1 stores weights and activations as
     * FP16 on the device (inputs and outputs stay FP32 at this API);
     * cuda_graphs: 1 = capture and replay (the default, also for 0), -1 = off. */
    int fp16;
    int cuda_graphs;
    /* 1: every execution context of this model runs on the CPU, so the
     * graph may take fusions into operators only the CPU kernels have (a
     * device plan would run those on the host). */
    int cpu_only;
    /* Bytes one run may make the engine allocate (a tensor, or a plan's
     * arena with the outputs): larger is STATUS_INVALID naming the node or
     * output, before the allocation. 0 = only EVAL_MAX_TENSOR_BYTES. */
    size_t max_run_bytes;
    /* Initializers the file also lists as graph inputs that stay inputs
     * (Triton's optional inputs): the initializer is the value a caller
     * that leaves the input out gets (model_input_default). A name that is
     * a plain input changes nothing; any other name fails the load. */
    const char *const *defaults;
    int ndefaults;
    /* A tokenizer model (models/model_tokenizer.h): path is a Hugging Face
     * tokenizer.json, not an ONNX file; the graph is one node from TEXT
     * (and TEXT_PAIR when tokenizer_pair) to input_ids, attention_mask and
     * token_type_ids; tokenizer_batched gives the texts a batch dim [-1, 1];
     * tokenizer_max_length > 0 replaces the file's truncation. */
    int tokenizer, tokenizer_pair, tokenizer_batched;
    int64_t tokenizer_max_length;
};

/* The bound on an input dim that model_load applies when max_dim is 0, and
 * which the server's requests are checked against before they reach a model
 * (server/kserve_bind.c). */
#define MODEL_MAX_DIM (1 << 24)

struct model *model_load(const struct model_params *p, char *err, size_t err_len);
void model_free(struct model *m); /* NULL is a no-op; no model_exec may be live */
/* Raises the plan bound to max_plans (the model's cache and the device
 * caches of execution contexts made after this call). 0 or STATUS_NOMEM. */
int model_grow_plans(struct model *m, int max_plans);

int model_ninputs(const struct model *m);
int model_noutputs(const struct model *m);
const struct model_io *model_input(const struct model *m, int i);
const struct model_io *model_output(const struct model *m, int i);
/* Input i's default (model_params.defaults), owned by the model, or NULL. */
const struct tensor *model_input_default(const struct model *m, int i);
/* Index of the input/output with this name, or -1. */
int model_find_input(const struct model *m, const char *name);
int model_find_output(const struct model *m, const char *name);
/* Graph facts for logs and metadata: node count, opset, producer. */
int model_node_count(const struct model *m);
/* Plans built for the model's host runs so far, every execution context
 * together: a steady stream of one shape builds none once warm. */
uint64_t model_plan_builds(const struct model *m);
/* 1 if the model's output shapes may depend on its input values, not only
 * on their shapes (NonZero, NonMaxSuppression on computed values), or if
 * its requests run node by node because a plan could not hold such a shape
 * (models/valrun.h): requests of such a model must not be batched. */
int model_shapes_follow_values(const struct model *m);
const char *model_producer(const struct model *m);

/* An execution context on a backend (NULL = a CPU backend made for it, using
 * nthreads threads, 0 = all cores). The backend, if given, is borrowed. */
struct model_exec *model_exec_create(struct model *m, struct backend *be, int nthreads);
void model_exec_free(struct model_exec *x);

/* Runs the model. inputs[i] matches model_input(m, i) (dtype and every known
 * dim are checked; a mismatch is STATUS_INVALID with a message naming the
 * input). outputs has model_noutputs() entries; each gets dtype, shape and an
 * owned data block (common/tensor.h's layout, strings included) that the
 * caller frees with tensor_free_data. Returns 0 or a
 * negative status with err set; on error no output is left allocated. */
int model_run(struct model_exec *x, const struct tensor *inputs, int ninputs,
              struct tensor *outputs, int noutputs, char *err, size_t err_len);
/* model_run for inputs the caller has already checked against the model: the
 * server's requests, which kserve_request_bind checks against a
 * configuration that agrees with the model and within MODEL_MAX_DIM before
 * they are batched. The same contract otherwise; inputs that do not match
 * the model are not detected. */
int model_run_unchecked(struct model_exec *x, const struct tensor *inputs, int ninputs,
                        struct tensor *outputs, int noutputs, char *err, size_t err_len);
/* Plans this context has built so far: a run that raised it paid for a plan
 * (a new shape), so its time says little about the next run of its size. */
uint64_t model_exec_builds(const struct model_exec *x);
/* 1 if a run of inputs on x would use the plan x ran last, on the host,
 * every step on the calling thread alone: then any thread may run it
 * without starting an OpenMP team (server/batcher.c's inline run). */
int model_exec_one_thread(const struct model_exec *x, const struct tensor *inputs, int ninputs);
/* The requests the next runs serve together (a batch of n): their bound is
 * n times model_params.max_run_bytes, each request's. 1 until set. */
void model_exec_set_requests(struct model_exec *x, int n);

#endif
