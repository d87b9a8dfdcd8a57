/* plan_impl.h - what the plan files share: the plan's, its steps' and the
 * executor's layouts, and the functions one phase calls in another. Internal to
 * models/plan_*.c (and their unit tests); models/plan.h is the contract.
 *
 *   plan_build.c    node -> step and kernel choice, memory planning in one arena
 *   plan_threads.c  each step's thread count: estimated at build, timed on the
 *                   plan's first run (one thread against all)
 *   plan_exec.c     executors: binding a plan to an arena and running it
 *   plan_cache.c    plans per shape signature, eviction and growth */
#ifndef KILN_PLAN_IMPL_H
#define KILN_PLAN_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "models/plan.h"

#define PLAN_ALIGN 64
/* A host arena larger than this, sized by an input's value (a plan with
 * bind set), is given back after its run (plan_exec_run). */
#define PLAN_VALUE_ARENA_KEEP ((size_t)256 << 20)
#define PLAN_CLIENT_FOLD_MAX_BYTES ((size_t)1 << 20)

static inline size_t align_up(size_t n) { return (n + PLAN_ALIGN - 1) & ~(size_t)(PLAN_ALIGN - 1); }

struct pval {
    struct tensor t; /* concrete shape; data = host bytes for constants */
    enum plan_value_kind kind;
    int root;        /* value that owns the bytes (itself unless a view) */
    int input;       /* graph input index, for PLAN_VALUE_INPUT */
    size_t off;      /* arena offset (roots), or offset in the device constant block */
    size_t size;     /* bytes, rounded to PLAN_ALIGN for arena roots */
    int first, last; /* live range of an arena root, in step indices */
    unsigned char owned; /* t.data was malloc'd by the plan (folded) */
    /* Its bytes come from a request: a bound input's value, or folded from
     * one. Folding such values stays small (PLAN_CLIENT_FOLD_MAX_BYTES): a
     * client's number must not become a large constant the plan cache keeps. */
    unsigned char from_client;
    void *dev;       /* device plans: a graph constant's copy in the executor's store */
    unsigned char is_step_out;
    /* Device plans: the datatype on the device. FP16 plans store every
     * FP32 value as FP16 (half the bytes); the API and CPU fallback steps
     * still see FP32 (t.dtype), converted when bytes cross. */
    enum dtype ddt;
    size_t hoff;     /* offset in the executor's host mirror (CPU fallback steps) */
    void *h16;       /* FP16 plans, while building: the constant's FP16 bytes */
};

struct pstep {
    int node;
    /* An activation that followed this node, applied by the executor to
     * output 0 right after the kernel (for kernels that do not fuse it). */
    enum act_kind post_act;
    float act_a, act_b;
    void *state;
    unsigned char prepared; /* release needed */
    unsigned char on_host;  /* device plan: this node falls back to the CPU */
    size_t scratch_off, scratch_size;
    size_t hscratch_off;    /* on_host steps: scratch offset in the host mirror */
    /* Threads the step's kernel was prepared for and runs with (see
     * "threads per step"). A measured step is prepared for one thread as
     * well (state_one) and, once timed, runs with the faster: chosen is 0
     * until then, afterwards 1 or nthreads. */
    int nthreads;
    unsigned char measured, prepared_one;
    void *state_one;
    atomic_int chosen;
};

struct plan {
    atomic_int refs;
    const struct graph *g;
    int nvals;
    struct pval *vals;
    int nsteps;
    struct pstep *steps;
    int nfolded;
    int nfallback;
    int npost_act;
    int nsum_in_place; /* Convs writing their residual sum over Z (sum_in_place) */
    size_t arena_size;
    int ninputs;
    struct tensor *sig; /* shapes of the inputs it was built for */
    uint64_t hash;
    /* OpenMP threads the steps were prepared for: oneDNN splits the work
     * and sizes the scratchpad for them when a primitive is made, so a
     * plan serves executions with this thread count only. */
    int nthreads;
    int host;
    struct backend *be; /* the backend that prepared the steps */
    void *dev_consts;   /* device plans: every constant a step reads */
    size_t consts_size;
    uint64_t bind; /* inputs whose values are part of the signature */
    int *in_vals; /* host plans: values read in place from graph inputs */
    int nin_vals;
    atomic_ullong last_used;
    int fp16;              /* device plan storing FP32 values as FP16 */
    int nfp16;             /* values stored as FP16 */
    size_t mirror_size;    /* bytes of the host mirror CPU fallback steps use */
    int nmeasured;         /* steps whose thread count the first run measures */
    atomic_int timed;      /* 0: not yet, 1: one executor is timing them, 2: done */
    atomic_int pick;       /* plan_threads_pick(): 1 + the step_config kept once timed, -1 inherited */
    atomic_int recheck;    /* timing them again (plan_threads.c): 0 not due, 1 due at recheck_at, 2 under way */
    double recheck_at;     /* now_ms() from which it is due (written before recheck's release store of 1) */
    int nrechecks;         /* times they were timed again (by the executor that won recheck) */
    atomic_int gen;        /* bumped when the choices are made: executors bound to older ones rebind */
};

/* Widens n FP16 values at p to FP32 in place (the buffer holds 4n bytes):
 * backwards, so each half is read before its bytes are overwritten. */
static inline void widen_in_place(void *p, size_t n) {
    const uint16_t *h = p;
    float *f = p;
    for (size_t i = n; i-- > 0;) f[i] = fp16_to_fp32(h[i]);
}

/* Narrows n FP32 values at p to FP16 in place: forwards, for the same reason. */
static inline void narrow_in_place(void *p, size_t n) {
    const float *f = p;
    uint16_t *h = p;
    for (size_t i = 0; i < n; i++) h[i] = fp32_to_fp16(f[i]);
}

/* Bytes of value v on the device (FP16 plans halve FP32 values). */
static inline size_t dev_nbytes(const struct pval *pv) {
    struct tensor t = pv->t;
    t.dtype = pv->ddt ? pv->ddt : pv->t.dtype;
    return tensor_nbytes(&t);
}

/* ---- helpers --------------------------------------------------------------- */

/* The kernel state step s runs with now, and its thread count. */
static inline void *step_state(const struct pstep *s, int *nthreads) {
    if (s->measured && atomic_load_explicit(&s->chosen, memory_order_acquire) == 1) {
        *nthreads = 1;
        return s->state_one;
    }
    *nthreads = s->nthreads;
    return s->state;
}

/* ---- building ---------------------------------------------------------------- */

struct plan_devstore;

/* Device copies of a graph's n values' constants, shared by a device plan
 * cache's plans (plan_build.c); NULL when out of memory. Free after the plans. */
struct plan_devstore *plan_devstore_create(struct backend *be, int n);
void plan_devstore_free(struct plan_devstore *ds);

/* plan_build_opts with the device constants taken from (and added to) ds,
 * which may be NULL. */
int plan_build_ds(const struct graph *g, const struct tensor *inputs, uint64_t bind_values, uint64_t ref_values,
                  struct backend *be, int nthreads, int fp16, struct plan_devstore *ds, struct plan **out,
                  char *err, size_t err_len);

/* ---- threads per step (plan_threads.c) ------------------------------------------- */

enum step_threads_mode { STEP_THREADS_OFF, STEP_THREADS_STATIC, STEP_THREADS_MEASURE };

/* The mode KILN_STEP_THREADS asks for (measure when unset). */
enum step_threads_mode plan_threads_mode(void);

/* Decides step s's thread count (and whether it is measured) before its
 * kernel is prepared. Device plans and one-thread plans keep the plan's. */
void plan_threads_decide(struct plan *p, struct pstep *s, enum step_threads_mode mode);

/* The configurations of a plan's measured steps timed on its first run: all
 * on all threads, all on one, each on the count it ran faster with (the plan
 * keeps 1 + the one chosen in its pick, which the plan cache reads). */
enum step_config { MEASURED_ALL = 0, MEASURED_ONE = 1, MEASURED_CHOSEN = 2 };

/* Runs a host plan with measured steps, timing them on its first run. */
int plan_threads_run_measured(struct plan_exec *x, struct plan *p, char *err, size_t err_len);

/* ---- executors (plan_exec.c) ------------------------------------------------------ */

struct plan_exec {
    struct backend *be;
    int host;
    int nthreads;
    void *arena;
    size_t arena_cap;
    void *mirror; /* device executors: host copy of the arena for CPU fallback steps */
    size_t mirror_cap;
    struct plan *bound; /* the plan calls[] and tv[] describe (one reference held) */
    struct tensor *tv;  /* per value: shape and the pointer kernels use */
    struct tensor *tvh; /* device executors: the same with host pointers */
    int tv_cap;
    struct op_call *calls;
    int calls_cap;
    void *graph;    /* device graph captured for the bound plan, or NULL */
    int graph_runs; /* runs of the bound plan before capture */
    int graph_off;  /* capture failed or is not possible for the bound plan */
    int graphs_disabled; /* optimization.cuda_graphs false: never capture */
    struct op_strpool *strings; /* strings kernels make during a run (kernels/ops.h) */
    int choices_bound; /* calls[] follow the bound plan's timed thread choices */
    int bound_gen;     /* ... those of its gen */
    int one_thread; /* host plan, choices bound, every call on one thread (plan_exec_one_thread) */
    void *stage;    /* FP16 plans: host staging for inputs converted to FP16 */
    size_t stage_cap;
    /* KILN_PROFILE=1: time per op type, logged when the executor is freed. */
    int profile;
    struct prof_entry *prof;
    int nprof;
    uint64_t nruns;
};

static inline double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Runs the bound plan's steps once; times (if not NULL) gets each step's
 * milliseconds. */
int plan_exec_steps(struct plan_exec *x, struct plan *p, double *times, char *err, size_t err_len);

/* Points the calls of measured steps at the variant their timing chose. */
void plan_exec_bind_choices(struct plan_exec *x, const struct plan *p);

#endif
