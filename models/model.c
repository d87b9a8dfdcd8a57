/* model.c - a loaded model (graph after the load-time passes, input and
 * output metadata, the plan cache) and its execution contexts. */
#include "models/model.h"

#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "graph/graph.h"
#include "kernels/backend.h"
#include "models/onnx_load.h"
#include "models/eval.h"
#include "models/lower_fp16.h"
#include "models/model_tokenizer.h"
#include "models/passes.h"
#include "models/plan.h"
#include "models/valrun.h"

struct model {
    char *path; /* for logs */
    struct graph *g;
    struct model_io *ins, *outs;
    struct tensor *defaults; /* per input; data NULL: none */
    struct plan_cache *plans; /* host plans, shared by every CPU execution context */
    int max_plans;
    int plans_limit; /* the plan caches may grow to this many when plans are rebuilt */
    int64_t max_dim;
    /* Inputs whose values decide shapes (a Reshape's shape or TopK's K fed
     * by the caller): learned on the first plan that cannot be built
     * without them; from then on their values are part of the signature. */
    _Atomic uint64_t bind_values;
    /* 1 once a plan could not be built because a shape depends on values
     * computed at run time: from then on every request runs node by node
     * on the CPU (models/valrun.h), on no plan. */
    _Atomic int value_driven;
    /* The graph has an op whose output shape follows its input's values
     * (NonZero, NonMaxSuppression, Unique) on a computed input: its output
     * shapes may differ per request, so it is not batched. */
    int shapes_follow_values;
    int fp16;        /* device contexts build FP16 plans */
    int cuda_graphs; /* device contexts capture and replay */
    size_t max_run_bytes; /* model_params.max_run_bytes */
    struct tokenizer *tok; /* a tokenizer model: runs it instead of plans */
};

struct model_exec {
    struct model *m;
    struct backend *be;
    int own_be;
    struct plan_exec *pe;
    /* Device plans hold device constants of this backend: cached per context. */
    struct plan_cache *dev_plans;
    uint64_t builds; /* plans built for this context's runs */
    int requests;    /* model_exec_set_requests; 0 = 1 */
};

static void io_from_value(struct model_io *io, const struct graph_value *v) {
    io->name = v->name;
    io->dtype = v->t.dtype;
    io->ndim = v->t.ndim;
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) io->dims[d] = d < v->t.ndim ? v->t.dims[d] : -1;
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) io->dim_param[d] = d < v->t.ndim ? v->dim_param[d] : NULL;
}

/* 1 if g or a subgraph of it has a node whose output shape follows the
 * values of an input that is not a constant of the graph. */
static int graph_shapes_follow_values(const struct graph *g) {
    static const char *const ops[] = {"NonZero", "NonMaxSuppression", "Unique"};
    for (int i = 0; i < g->nnodes; i++) {
        const struct graph_node *n = &g->nodes[i];
        for (size_t k = 0; !n->domain[0] && k < sizeof ops / sizeof ops[0]; k++)
            if (strcmp(n->op_type, ops[k]) == 0 && n->nin > 0 && n->in[0] >= 0 && !g->values[n->in[0]].t.data)
                return 1;
        for (int a = 0; a < n->nattr; a++) {
            const struct graph_attr *at = &n->attrs[a];
            if (at->type != ATTR_GRAPH && at->type != ATTR_GRAPHS) continue;
            for (int j = 0; j < at->n; j++)
                if (at->graphs && at->graphs[j] && graph_shapes_follow_values(at->graphs[j])) return 1;
        }
    }
    return 0;
}

/* A plain input named in model_params.defaults that no node reads (nor
 * the graph's outputs): the graph runs the same whatever it holds, so its
 * default is zeros of its shape (a symbolic dim 0). 0 or STATUS_NOMEM. */
static int unread_input_default(struct model *m, int v) {
    struct graph *g = m->g;
    if (g->values[v].flags & VALUE_OUTPUT) return 0;
    for (int i = 0; i < g->nnodes; i++) /* subgraphs' captures are their node's inputs too */
        for (int j = 0; j < g->nodes[i].nin; j++)
            if (g->nodes[i].in[j] == v) return 0;
    int i = 0;
    while (g->inputs[i] != v) i++;
    struct tensor *t = &m->defaults[i];
    const struct tensor *vt = &g->values[v].t;
    if (vt->ndim < 0) return 0; /* no rank to give it */
    struct tensor z = {.dtype = vt->dtype, .ndim = vt->ndim};
    for (int d = 0; d < vt->ndim; d++) z.dims[d] = vt->dims[d] < 0 ? 0 : vt->dims[d];
    if (z.dtype == DT_STRING && tensor_numel(&z) != 0) return 0; /* strings: only an empty one is all zeros */
    *t = z;
    size_t n = tensor_nbytes(t);
    t->data = calloc(n ? n : 1, 1);
    return t->data ? 0 : STATUS_NOMEM;
}

/* model_params.defaults: each initializer named there that the file lists
 * as a graph input becomes an input again, before any pass could fold it,
 * its data moved to m->defaults (by input index). The loader sized
 * g->inputs for every input the file lists, so there is room. */
static int promote_defaults(struct model *m, const struct model_params *p, char *err, size_t err_len) {
    struct graph *g = m->g;
    m->defaults = calloc((size_t)g->ninputs + (size_t)p->ndefaults + 1, sizeof *m->defaults);
    if (!m->defaults) return status_set(err, err_len, STATUS_NOMEM, "out of memory loading %s", m->path);
    for (int k = 0; k < p->ndefaults; k++) {
        int v = graph_find_value(g, p->defaults[k]);
        if (v >= 0 && (g->values[v].flags & VALUE_INPUT)) {
            if (unread_input_default(m, v)) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
            continue;
        }
        if (v < 0 || !(g->values[v].flags & VALUE_LISTED_INPUT) || !g->values[v].t.data)
            return status_set(err, err_len, STATUS_INVALID, "'%s' is not a graph input of the model%s", p->defaults[k],
                              v >= 0 ? " (an initializer the graph's inputs do not list cannot be overridden)" : "");
        struct graph_value *val = &g->values[v];
        val->flags |= VALUE_INPUT;
        m->defaults[g->ninputs] = val->t;
        val->t.data = NULL;
        g->inputs[g->ninputs++] = v;
    }
    return 0;
}

/* An ImageDecoder that reads a graph input names that input (what the
 * request sent) in its errors rather than the operator's 'encoded_stream':
 * the kernel reads the name from kiln_input_name. 0, or -1 out of memory. */
static int name_decoder_inputs(struct graph *g) {
    for (int i = 0; i < g->nnodes; i++) {
        struct graph_node *n = &g->nodes[i];
        if (strcmp(n->op_type, "ImageDecoder") || n->nin < 1 || n->in[0] < 0) continue;
        const struct graph_value *v = &g->values[n->in[0]];
        if ((v->flags & VALUE_INPUT) && node_set_attr_str(n, "kiln_input_name", v->name)) return -1;
    }
    return 0;
}

struct model *model_load(const struct model_params *p, char *err, size_t err_len) {
    if (!p || !p->path) {
        status_set(err, err_len, STATUS_INVALID, "no model path given");
        return NULL;
    }
    struct model *m = calloc(1, sizeof *m);
    if (!m) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory loading %s", p->path);
        return NULL;
    }
    if (!(m->path = strdup(p->path))) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory loading %s", p->path);
        goto fail;
    }
    m->max_plans = p->max_plans > 0 ? p->max_plans : 16;
    m->plans_limit = p->max_plans > 0 ? p->max_plans : MODEL_PLANS_LIMIT;
    m->max_dim = p->max_dim > 0 ? p->max_dim : MODEL_MAX_DIM;
    m->fp16 = p->fp16 != 0;
    m->cuda_graphs = p->cuda_graphs >= 0;
    m->max_run_bytes = p->max_run_bytes;
    if (p->tokenizer) {
        m->tok = model_tokenizer_load(p->path, p->tokenizer_max_length, err, err_len);
        if (!m->tok) goto fail;
        if (!(m->g = model_tokenizer_graph(p->tokenizer_pair, p->tokenizer_batched)) ||
            !(m->defaults = calloc((size_t)m->g->ninputs, sizeof *m->defaults))) {
            status_set(err, err_len, STATUS_NOMEM, "out of memory loading %s", p->path);
            goto fail;
        }
    } else {
        m->g = onnx_load_file(p->path, err, err_len);
        if (!m->g || promote_defaults(m, p, err, err_len)) goto fail;
        if (lower_fp16(m->g, err, err_len) || passes_run_for(m->g, p->cpu_only, err, err_len)) goto fail;
        if (name_decoder_inputs(m->g)) {
            status_set(err, err_len, STATUS_NOMEM, "out of memory loading %s", p->path);
            goto fail;
        }
    }
    struct graph *g = m->g;
    m->ins = calloc((size_t)(g->ninputs > 0 ? g->ninputs : 1), sizeof *m->ins);
    m->outs = calloc((size_t)(g->noutputs > 0 ? g->noutputs : 1), sizeof *m->outs);
    m->plans = plan_cache_create(m->max_plans);
    if (m->plans) plan_cache_set_limit(m->plans, m->plans_limit);
    if (!m->ins || !m->outs || !m->plans) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory loading %s", p->path);
        goto fail;
    }
    for (int i = 0; i < g->ninputs; i++) io_from_value(&m->ins[i], &g->values[g->inputs[i]]);
    for (int i = 0; i < g->noutputs; i++) io_from_value(&m->outs[i], &g->values[g->outputs[i]]);
    atomic_init(&m->bind_values, 0);
    atomic_init(&m->value_driven, 0);
    m->shapes_follow_values = graph_shapes_follow_values(g);
    log_debug("loaded %s: %d nodes after passes, %d inputs, %d outputs", p->path, g->nnodes, g->ninputs,
              g->noutputs);
    return m;
fail:
    model_free(m);
    return NULL;
}

void model_free(struct model *m) {
    if (!m) return;
    plan_cache_free(m->plans);
    tokenizer_free(m->tok);
    for (int i = 0; m->defaults && m->g && i < m->g->ninputs; i++) onnx_tensor_clear(&m->defaults[i]);
    free(m->defaults);
    graph_free(m->g);
    free(m->path);
    free(m->ins);
    free(m->outs);
    free(m);
}

int model_ninputs(const struct model *m) { return m->g->ninputs; }
int model_noutputs(const struct model *m) { return m->g->noutputs; }

const struct tensor *model_input_default(const struct model *m, int i) {
    return m->defaults && m->defaults[i].data ? &m->defaults[i] : NULL;
}

const struct model_io *model_input(const struct model *m, int i) {
    return i >= 0 && i < m->g->ninputs ? &m->ins[i] : NULL;
}

const struct model_io *model_output(const struct model *m, int i) {
    return i >= 0 && i < m->g->noutputs ? &m->outs[i] : NULL;
}

int model_find_input(const struct model *m, const char *name) {
    for (int i = 0; name && i < m->g->ninputs; i++)
        if (strcmp(m->ins[i].name, name) == 0) return i;
    return -1;
}

int model_find_output(const struct model *m, const char *name) {
    for (int i = 0; name && i < m->g->noutputs; i++)
        if (strcmp(m->outs[i].name, name) == 0) return i;
    return -1;
}

int model_node_count(const struct model *m) { return m->g->nnodes; }

uint64_t model_plan_builds(const struct model *m) { return plan_cache_builds(m->plans); }
int model_shapes_follow_values(const struct model *m) {
    return m->shapes_follow_values || atomic_load_explicit(&m->value_driven, memory_order_relaxed);
}

int model_grow_plans(struct model *m, int max_plans) {
    if (max_plans <= m->max_plans) return 0;
    int rc = plan_cache_grow(m->plans, max_plans);
    if (!rc) m->max_plans = max_plans;
    if (!rc && m->plans_limit < max_plans) m->plans_limit = max_plans;
    return rc;
}
const char *model_producer(const struct model *m) { return m->g->producer_name ? m->g->producer_name : ""; }

struct model_exec *model_exec_create(struct model *m, struct backend *be, int nthreads) {
    if (!m) return NULL;
    struct model_exec *x = calloc(1, sizeof *x);
    if (!x) goto nomem;
    x->m = m;
    int nt = nthreads > 0 ? nthreads : omp_get_num_procs();
    if (nt < 1) nt = 1;
    if (be) {
        x->be = be;
    } else {
        struct backend_params bp = {.device = -1, .nthreads = nt};
        x->be = backend_cpu_create(&bp);
        if (!x->be) goto nomem;
        x->own_be = 1;
    }
    x->pe = plan_exec_create(x->be, nt);
    if (!x->pe) goto nomem;
    if (!x->be->host_memory) {
        x->dev_plans = plan_cache_create(m->max_plans);
        if (!x->dev_plans) goto nomem;
        plan_cache_set_limit(x->dev_plans, m->plans_limit);
        plan_cache_set_fp16(x->dev_plans, m->fp16);
        plan_exec_set_cuda_graphs(x->pe, m->cuda_graphs);
    }
    return x;
nomem:
    log_error("out of memory");
    model_exec_free(x);
    return NULL;
}

void model_exec_free(struct model_exec *x) {
    if (!x) return;
    /* Plans first: device plans release their states through the backend. */
    plan_exec_free(x->pe);
    plan_cache_free(x->dev_plans);
    if (x->own_be) backend_free(x->be);
    free(x);
}

static int check_inputs(const struct model *m, const struct tensor *inputs, int ninputs, char *err, size_t err_len) {
    const struct graph *g = m->g;
    if (ninputs != g->ninputs)
        return status_set(err, err_len, STATUS_INVALID, "the model takes %d input%s, got %d", g->ninputs,
                          g->ninputs == 1 ? "" : "s", ninputs);
    if (ninputs && !inputs) return status_set(err, err_len, STATUS_INVALID, "no inputs given");
    for (int i = 0; i < ninputs; i++) {
        const struct model_io *io = &m->ins[i];
        const struct tensor *t = &inputs[i];
        char got[160], want[160];
        if (io->dtype != DT_UNDEFINED && t->dtype != io->dtype)
            return status_set(err, err_len, STATUS_INVALID, "input '%s': expected datatype %s, got %s", io->name,
                              dtype_name(io->dtype), dtype_name(t->dtype));
        if (t->ndim < 0 || t->ndim > TENSOR_MAX_DIMS)
            return status_set(err, err_len, STATUS_INVALID, "input '%s': rank %d is not supported", io->name, t->ndim);
        if (io->ndim >= 0 && t->ndim != io->ndim) {
            struct tensor w = {.dtype = io->dtype, .ndim = io->ndim};
            memcpy(w.dims, io->dims, sizeof w.dims);
            return status_set(err, err_len, STATUS_INVALID, "input '%s': expected shape %s (rank %d), got %s",
                              io->name, tensor_shape_str(&w, want, sizeof want), io->ndim,
                              tensor_shape_str(t, got, sizeof got));
        }
        for (int d = 0; d < t->ndim; d++) {
            if (t->dims[d] < 0 || t->dims[d] > m->max_dim)
                return status_set(err, err_len, STATUS_INVALID, "input '%s': dim %d is %lld, outside [0, %lld]",
                                  io->name, d, (long long)t->dims[d], (long long)m->max_dim);
            if (io->ndim >= 0 && io->dims[d] >= 0 && io->dims[d] != t->dims[d]) {
                struct tensor w = {.dtype = io->dtype, .ndim = io->ndim};
                memcpy(w.dims, io->dims, sizeof w.dims);
                return status_set(err, err_len, STATUS_INVALID,
                                  "input '%s': expected shape %s, got %s (dim %d must be %lld)", io->name,
                                  tensor_shape_str(&w, want, sizeof want), tensor_shape_str(t, got, sizeof got), d,
                                  (long long)io->dims[d]);
            }
        }
        if (!t->data && tensor_numel(t) > 0)
            return status_set(err, err_len, STATUS_INVALID, "input '%s': no data", io->name);
    }
    return 0;
}

/* What both entries check of the caller's side: a context and room for
 * every output, emptied so that an error leaves nothing allocated. */
static int check_outputs(const struct model_exec *x, struct tensor *outputs, int noutputs, char *err,
                         size_t err_len) {
    if (!x) return status_set(err, err_len, STATUS_INVALID, "no execution context");
    const struct graph *g = x->m->g;
    if (noutputs != g->noutputs || (noutputs && !outputs))
        return status_set(err, err_len, STATUS_INVALID, "the model has %d output%s, %d requested", g->noutputs,
                          g->noutputs == 1 ? "" : "s", noutputs);
    for (int o = 0; o < noutputs; o++) outputs[o].data = NULL;
    return 0;
}

static int run_plan_in(struct model_exec *x, const struct tensor *inputs, int ninputs, struct tensor *outputs,
                       char *err, size_t err_len);

/* The run, under the model's bound on what it may allocate (eval.h's
 * per-thread bound reaches plan building and node-by-node runs). */
static int run_plan(struct model_exec *x, const struct tensor *inputs, int ninputs, struct tensor *outputs,
                    char *err, size_t err_len) {
    size_t prev = eval_max_bytes(), max = x->m->max_run_bytes, n = x->requests > 1 ? (size_t)x->requests : 1;
    if (x->m->tok)
        return model_tokenizer_run(x->m->tok, inputs, ninputs, outputs, max > SIZE_MAX / n ? SIZE_MAX : max * n, err,
                                   err_len);
    eval_set_max_bytes(max > SIZE_MAX / n ? SIZE_MAX : max * n);
    int rc = run_plan_in(x, inputs, ninputs, outputs, err, err_len);
    eval_set_max_bytes(prev);
    return rc;
}

/* The small inputs whose values were bound (more, besides bind) made a
 * plan *p build; bound, each is part of the plan's signature, so a new
 * value builds a new plan. Most such inputs do not decide a shape (a
 * streaming model's audio frame and state, beside the sample rate that an
 * If tests): each is tried unbound, and left so when the plan still builds
 * without its value. What is returned is what must stay bound; *p is the
 * plan for it (the others' references dropped). Tried once per model, when
 * binding starts; a plan that builds is one that needs no more values. */
static uint64_t bind_fewest(struct model_exec *x, struct plan_cache *cache, const struct tensor *inputs,
                            uint64_t bind, uint64_t more, struct plan **p) {
    const struct graph *g = x->m->g;
    for (int i = 0; i < 64 && i < g->ninputs; i++) {
        uint64_t bit = (uint64_t)1 << i;
        if (!(more & bit) || (bind & bit)) continue;
        struct plan *q = NULL;
        int built = 0;
        char e[256];
        if (plan_cache_get(cache, g, inputs, more & ~bit, x->be, plan_exec_nthreads(x->pe), &q, &built, e,
                           sizeof e))
            continue; /* its value decides a shape: it stays bound */
        if (built) x->builds++;
        plan_release(*p);
        *p = q;
        more &= ~bit;
    }
    return more;
}

/* Runs checked inputs on the plan for their shapes (built on first use). */
static int run_plan_in(struct model_exec *x, const struct tensor *inputs, int ninputs, struct tensor *outputs,
                       char *err, size_t err_len) {
    struct model *m = x->m;
    const struct graph *g = m->g;
    struct plan_cache *cache = x->dev_plans ? x->dev_plans : m->plans;
    /* The same shapes as last time: no lookup, no lock. */
    struct plan *p = plan_exec_bound(x->pe);
    if (p && plan_matches(p, inputs, ninputs)) {
        plan_cache_touch(cache, p);
        return plan_exec_run(x->pe, p, inputs, outputs, err, err_len);
    }
    if (atomic_load_explicit(&m->value_driven, memory_order_relaxed))
        return valrun_graph(g, inputs, outputs, err, err_len);
    uint64_t bind = atomic_load(&m->bind_values);
    int built = 0;
    int rc = plan_cache_get(cache, g, inputs, bind, x->be, plan_exec_nthreads(x->pe), &p, &built, err, err_len);
    uint64_t small = 0; /* inputs of at most 1024 elements in this call */
    for (int i = 0; i < ninputs && i < 64; i++)
        if (tensor_numel(&inputs[i]) <= 1024) small |= (uint64_t)1 << i;
    if (rc && rc != STATUS_NOMEM && (small & ~bind)) {
        /* Maybe an input decides a shape: retry with the values of the small
         * inputs bound, and keep that only if it helps. */
        char err2[512];
        uint64_t more = bind | small;
        int rc2 = plan_cache_get(cache, g, inputs, more, x->be, plan_exec_nthreads(x->pe), &p, &built, err2, sizeof err2);
        if (rc2 == 0) {
            more = bind_fewest(x, cache, inputs, bind, more, &p);
            atomic_fetch_or(&m->bind_values, more);
            log_debug("model inputs decide output shapes; plans are built per value of those inputs");
            rc = 0;
        } else if (rc2 == STATUS_INVALID) {
            /* With the values known the plan got further and found them
             * wrong (a string that is not UTF-8): that is the answer. */
            snprintf(err, err_len, "%s", err2);
            rc = rc2;
        }
    }
    if (built) x->builds++;
    if (rc == STATUS_DATA_DEPENDENT) {
        if (!atomic_exchange(&m->value_driven, 1))
            log_info("%s runs node by node on the CPU, without plans or batching: %s", m->path, err);
        return valrun_graph(g, inputs, outputs, err, err_len);
    }
    if (rc) return rc;
    rc = plan_exec_run(x->pe, p, inputs, outputs, err, err_len);
    plan_release(p);
    return rc;
}

uint64_t model_exec_builds(const struct model_exec *x) { return x ? x->builds : 0; }

int model_exec_one_thread(const struct model_exec *x, const struct tensor *inputs, int ninputs) {
    if (!x || atomic_load_explicit(&x->m->value_driven, memory_order_relaxed)) return 0;
    return plan_exec_one_thread(x->pe, inputs, ninputs);
}

void model_exec_set_requests(struct model_exec *x, int n) { x->requests = n; }

int model_run(struct model_exec *x, const struct tensor *inputs, int ninputs, struct tensor *outputs,
              int noutputs, char *err, size_t err_len) {
    int rc = check_outputs(x, outputs, noutputs, err, err_len);
    if (!rc) rc = check_inputs(x->m, inputs, ninputs, err, err_len);
    return rc ? rc : run_plan(x, inputs, ninputs, outputs, err, err_len);
}

int model_run_unchecked(struct model_exec *x, const struct tensor *inputs, int ninputs, struct tensor *outputs,
                        int noutputs, char *err, size_t err_len) {
    int rc = check_outputs(x, outputs, noutputs, err, err_len);
    return rc ? rc : run_plan(x, inputs, ninputs, outputs, err, err_len);
}
