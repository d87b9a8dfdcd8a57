/* plan.h - an execution plan for one input shape signature of a graph, the
 * executor that runs plans on a backend, and the LRU cache of plans.
 *
 * plan_build walks the graph's nodes in topological order with concrete input
 * shapes: every node is shape-inferred; a node whose inputs are all known at
 * plan time (constants, or shape-only ops such as Shape on a value whose shape
 * is now concrete) is executed at once on the CPU and its outputs become plan
 * constants, so Shape -> Gather -> Concat -> Reshape chains vanish; the other
 * nodes become steps. Ops that only reinterpret their input (OP_ALIAS_INPUT0:
 * Reshape, Flatten, Squeeze, Identity...) become views of their input's bytes
 * and no step. Every intermediate value and each step's scratch gets an offset
 * in one arena (greedy best-fit by size over live ranges, 64-byte aligned),
 * and each step's kernel is prepared once (op prepare, e.g. a oneDNN
 * primitive) and released when the plan is freed.
 *
 * Plans are reference-counted and immutable once built: several threads may
 * run one plan at the same time, each with its own plan_exec (arena, scratch).
 * Op states made by prepare must therefore be read-only during run.
 *
 * A plan built for a host-memory backend (CPU) reads graph inputs in place and
 * may be shared by every thread; a plan for a device backend copies its
 * constants to the device once, keeps a device pointer, and so belongs to that
 * backend instance (cache it per plan_exec).
 *
 * Device plans, for backend writers: prepare_node sees concrete shapes, and
 * host data for constant inputs (NULL for the others); run_node sees device
 * pointers for everything (arena, constants, scratch). Graph inputs are copied
 * into the arena before the first step and outputs copied back after the last
 * one, with one synchronize at the end. A node whose supports_op says 0 runs
 * on the CPU between explicit copies. A plan with no such node is captured
 * (graph_begin/graph_end, on its second run) and replayed from then on. */
#ifndef KILN_PLAN_H
#define KILN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/tensor.h"
#include "graph/graph.h"

struct plan;
struct plan_exec;
struct plan_cache;
struct backend;

/* ---- plans --------------------------------------------------------------- */

/* Builds a plan for g with graph input i shaped like inputs[i] (dtype, ndim,
 * dims; g->ninputs entries). Data is ignored except for the inputs whose bit
 * is set in bind_values (i < 64): their values are copied into the plan as
 * constants and become part of its signature, for models where an input
 * decides shapes (Reshape's shape, TopK's K fed by the caller). be prepares
 * the steps (NULL = the CPU kernels directly) for nthreads threads (oneDNN
 * fixes its work split then). Returns 0 and *out with one reference, or a
 * negative status with a message naming the node. */
int plan_build(const struct graph *g, const struct tensor *inputs, uint64_t bind_values, struct backend *be,
               int nthreads, struct plan **out, char *err, size_t err_len);
/* plan_build with options: fp16 != 0 makes a device plan (be not host
 * memory) store every FP32 value as FP16 on the device: constants are
 * converted once on upload, intermediates take half the arena, graph inputs
 * are narrowed on the host before their copy and outputs widened after
 * theirs, so the API still sees FP32. supports_op and prepare_node are asked
 * with the FP16 descriptors; a node the device refuses runs on the CPU in
 * FP32 with conversions at its copies. Ignored for host plans. */
int plan_build_opts(const struct graph *g, const struct tensor *inputs, uint64_t bind_values, struct backend *be,
                    int nthreads, int fp16, struct plan **out, char *err, size_t err_len);
/* plan_build for a subgraph (If, Loop, Scan): the inputs in ref_values
 * (a subset of bind_values) are constants of the enclosing plan, which
 * outlives this one: they are bound by reference, not copied, and a later
 * call whose input has the same address matches without comparing bytes
 * (an LSTM's weights read from the enclosing graph: packed once at plan
 * time, not at every run). */
int plan_build_sub(const struct graph *g, const struct tensor *inputs, uint64_t bind_values, uint64_t ref_values,
                   int nthreads, struct plan **out, char *err, size_t err_len);
void plan_retain(struct plan *p);
/* Drops one reference; the last one frees the plan. NULL is a no-op. */
void plan_release(struct plan *p);

/* Facts for tests and logs. */
size_t plan_arena_size(const struct plan *p);
int plan_nsteps(const struct plan *p);
int plan_nconst_folded(const struct plan *p);
/* Node index (into g->nodes) of step i. */
int plan_step_node(const struct plan *p, int i);
/* Values stored as FP16 on the device (0 unless an FP16 device plan). */
int plan_nfp16(const struct plan *p);
/* Steps of a device plan that run on the CPU; 1 if step i is one of them. */
int plan_nfallback(const struct plan *p);
int plan_step_on_host(const struct plan *p, int i);
/* Threads step i runs with: host plans give a small step one thread and a
 * large one all of the plan's; a step in between is "measured": timed both
 * ways on the plan's first run, which fixes its count (until then it runs
 * on all). KILN_STEP_THREADS=0 keeps every step on all the threads, =static
 * skips the timing. plan_nmeasured counts the measured steps. */
int plan_step_threads(const struct plan *p, int i);
int plan_step_measured(const struct plan *p, int i);
int plan_nmeasured(const struct plan *p);
/* How a plan's measured steps got their thread counts: 0 not yet, 1 timed
 * and all on one thread kept, 2 timed and all on all kept, 3 timed and each
 * its own, -1 taken untimed from the plans of its cache (plan_cache_get). */
int plan_threads_pick(const struct plan *p);

enum plan_value_kind {
    PLAN_VALUE_UNUSED = 0,
    PLAN_VALUE_CONST = 1, /* graph constant or folded at plan time */
    PLAN_VALUE_INPUT = 2, /* a graph input (or a view of one) read in place */
    PLAN_VALUE_ARENA = 3, /* bytes [offset, offset + size) of the arena */
};
/* Describes value v of the graph in this plan: its kind, concrete shape, and
 * for arena values the byte range and the live range [first_step, last_step]
 * (of the bytes: a view shares its root's range). */
enum plan_value_kind plan_value_info(const struct plan *p, int v, struct tensor *shape, size_t *offset,
                                     size_t *size, int *first_step, int *last_step);


/* ---- executors ------------------------------------------------------------ */

/* An executor owns the arena (grown as plans need, reused across runs) and
 * the per-step call records of the plan it ran last. One thread at a time.
 * be is borrowed and must outlive the executor; nthreads >= 1. */
struct plan_exec *plan_exec_create(struct backend *be, int nthreads);
void plan_exec_free(struct plan_exec *x); /* NULL is a no-op */
struct backend *plan_exec_backend(const struct plan_exec *x);
int plan_exec_nthreads(const struct plan_exec *x);
/* The plan this executor ran last (it holds a reference), or NULL. Lets a
 * caller skip the cache lookup when the shapes did not change. */
struct plan *plan_exec_bound(const struct plan_exec *x);
/* 0 turns device graph capture and replay off for this executor (the
 * model's optimization.cuda_graphs); on by default. */
void plan_exec_set_cuda_graphs(struct plan_exec *x, int on);

/* Runs p with host input tensors (shapes as the plan's signature). Each of
 * the graph's outputs is written to outputs[i] with a malloc'd buffer the
 * caller frees with tensor_free_data (one block in common/tensor.h's layout,
 * strings included).
 * On error nothing is left allocated in outputs. */
int plan_exec_run(struct plan_exec *x, struct plan *p, const struct tensor *inputs, struct tensor *outputs,
                  char *err, size_t err_len);
/* 1 if inputs would run on the plan x has bound, a host plan whose every
 * step runs on the calling thread alone (no OpenMP team), its thread
 * choices made: the plan's next run with such inputs needs no other thread. */
int plan_exec_one_thread(const struct plan_exec *x, const struct tensor *inputs, int ninputs);

/* ---- the plan cache ---------------------------------------------------------- */

/* An LRU of at most max_plans plans keyed by the input shape signature.
 * Thread-safe (one mutex, never held while a plan is built or run). For a
 * device backend the cache also keeps one device copy of each graph
 * constant, shared by its plans: such a cache belongs to one executor (one
 * thread), is freed after that executor, and before the backend. */
struct plan_cache *plan_cache_create(int max_plans);
void plan_cache_free(struct plan_cache *c); /* drops the cache's references */

/* Hash of an input signature: ndim and dims of each input, and the values
 * of the inputs in bind_values. */
uint64_t plan_signature_hash(const struct tensor *inputs, int ninputs, uint64_t bind_values);
/* 1 if p was built for exactly these input shapes (and bound values). */
int plan_matches(const struct plan *p, const struct tensor *inputs, int ninputs);

/* Returns the cached plan for these input shapes with a new reference, or
 * builds one (outside the lock), inserts it (evicting the least recently used
 * plan beyond max_plans) and returns it with a reference. *built (if
 * non-NULL) tells whether a build happened. */
int plan_cache_get(struct plan_cache *c, const struct graph *g, const struct tensor *inputs, uint64_t bind_values,
                   struct backend *be, int nthreads, struct plan **out, int *built, char *err, size_t err_len);
/* Marks p as just used (for a caller that reused it without plan_cache_get). */
void plan_cache_touch(struct plan_cache *c, struct plan *p);
/* Plans this cache builds from now on are FP16 device plans (see
 * plan_build_opts). Set before the first plan_cache_get. */
void plan_cache_set_fp16(struct plan_cache *c, int on);
/* Raises the bound to max_plans (never lowers it). 0 or STATUS_NOMEM. */
int plan_cache_grow(struct plan_cache *c, int max_plans);
/* Lets the bound double, up to limit, each time half as many plans as it
 * holds were rebuilt after their eviction (default: no growth). */
void plan_cache_set_limit(struct plan_cache *c, int limit);
int plan_cache_max(struct plan_cache *c);
uint64_t plan_cache_rebuilds(struct plan_cache *c);
/* Number of plans in the cache; number of builds and evictions so far
 * (plan_cache_rebuilds: builds of a recently evicted plan). */
int plan_cache_size(struct plan_cache *c);
uint64_t plan_cache_builds(struct plan_cache *c);
uint64_t plan_cache_evictions(struct plan_cache *c);

#endif
