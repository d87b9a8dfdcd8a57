/* backend_cpu.c - the CPU backend: host memory, and each node run by its
 * op table entry (kernels/cpu/ops_*.c: oneDNN primitives and C loops). It is
 * the reference every other backend is checked against. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/backend.h"

#define CPU_ALIGN 64

struct cpu_ctx {
    int nthreads;
};

/* OpenMP's thread count is a per-thread setting (reading it is cheap): set
 * it on the calling thread only when it differs. A plan gives each step its
 * own count (models/plan.c: a small node runs on one thread, without waking
 * the team), so the count follows the call. */
static void use_threads(int n) {
    if (n < 1) n = 1;
    if (omp_get_max_threads() != n) omp_set_num_threads(n);
}

static void cpu_free(struct backend *be) {
    free(be->context);
    free(be);
}

static void *cpu_buffer_alloc(struct backend *be, size_t size) {
    (void)be;
    size = (size + CPU_ALIGN - 1) & ~(size_t)(CPU_ALIGN - 1);
    return aligned_alloc(CPU_ALIGN, size ? size : CPU_ALIGN);
}

static void cpu_buffer_free(struct backend *be, void *ptr) {
    (void)be;
    free(ptr);
}

static int cpu_copy(struct backend *be, void *dst, const void *src, size_t size) {
    (void)be;
    if (size) memmove(dst, src, size);
    return 0;
}

static int cpu_supports_op(struct backend *be, const struct op_call *c) {
    (void)be;
    return c->node && c->node->op && c->node->op->run != NULL;
}

static int cpu_prepare_node(struct backend *be, struct op_call *c, void **state, size_t *workspace) {
    (void)be;
    *state = NULL;
    *workspace = 0;
    const struct op_def *op = c->node->op;
    /* oneDNN fixes a primitive's work split (and its scratchpad) for the
     * thread count in force when it is created: the step runs with that one. */
    use_threads(c->nthreads);
    return op->prepare ? op->prepare(c, state, workspace) : 0;
}

static int cpu_run_node(struct backend *be, struct op_call *c) {
    struct cpu_ctx *ctx = be->context;
    use_threads(c->nthreads < ctx->nthreads ? c->nthreads : ctx->nthreads);
    return c->node->op->run(c);
}

/* Called with be == NULL by plans that outlive the backend that prepared
 * them: it must not need the instance. */
static void cpu_release_node(struct backend *be, const struct graph_node *node, void *state) {
    (void)be;
    if (node->op->release) node->op->release(state);
}

static int cpu_synchronize(struct backend *be) {
    (void)be;
    return 0;
}

static const struct backend_i cpu_iface = {
    .name = "cpu",
    .free = cpu_free,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .supports_op = cpu_supports_op,
    .prepare_node = cpu_prepare_node,
    .run_node = cpu_run_node,
    .release_node = cpu_release_node,
    .synchronize = cpu_synchronize,
};

struct backend *backend_cpu_create(const struct backend_params *p) {
    struct backend *be = calloc(1, sizeof *be);
    struct cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        log_error("out of memory");
        return NULL;
    }
    ctx->nthreads = p && p->nthreads > 0 ? p->nthreads : omp_get_num_procs();
    if (ctx->nthreads < 1) ctx->nthreads = 1;
    be->iface = &cpu_iface;
    be->context = ctx;
    be->device = -1;
    be->host_memory = 1;
    return be;
}
