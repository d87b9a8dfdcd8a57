/* plan.c - plans (shape inference, plan-time folding, memory planning,
 * kernel preparation), the executor that runs them, and the plan cache. */
#include "models/plan.h"

#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "models/eval.h"
#include "models/passes.h"

#define PLAN_ALIGN 64

static size_t align_up(size_t n) { return (n + PLAN_ALIGN - 1) & ~(size_t)(PLAN_ALIGN - 1); }

struct pval {
    struct tensor t; /* concrete shape; data = host bytes for constants */
    enum plan_value_kind kind;
    int root;        /* value that owns the bytes (itself unless a view) */
    int input;       /* graph input index, for PLAN_VALUE_INPUT */
    size_t off;      /* arena offset (roots), or offset in the device constant block */
    size_t size;     /* bytes, rounded to PLAN_ALIGN for arena roots */
    int first, last; /* live range of an arena root, in step indices */
    unsigned char owned; /* t.data was malloc'd by the plan (folded) */
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
};

/* Widens n FP16 values at p to FP32 in place (the buffer holds 4n bytes):
 * backwards, so each half is read before its bytes are overwritten. */
static void widen_in_place(void *p, size_t n) {
    const uint16_t *h = p;
    float *f = p;
    for (size_t i = n; i-- > 0;) f[i] = fp16_to_fp32(h[i]);
}

/* Narrows n FP32 values at p to FP16 in place: forwards, for the same reason. */
static void narrow_in_place(void *p, size_t n) {
    const float *f = p;
    uint16_t *h = p;
    for (size_t i = 0; i < n; i++) h[i] = fp32_to_fp16(f[i]);
}

/* Bytes of value v on the device (FP16 plans halve FP32 values). */
static size_t dev_nbytes(const struct pval *pv) {
    struct tensor t = pv->t;
    t.dtype = pv->ddt ? pv->ddt : pv->t.dtype;
    return tensor_nbytes(&t);
}

/* ---- helpers --------------------------------------------------------------- */

/* The kernel state step s runs with now, and its thread count. */
static void *step_state(const struct pstep *s, int *nthreads) {
    if (s->measured && atomic_load_explicit(&s->chosen, memory_order_acquire) == 1) {
        *nthreads = 1;
        return s->state_one;
    }
    *nthreads = s->nthreads;
    return s->state;
}

/* ---- building ---------------------------------------------------------------- */

static void plan_free(struct plan *p) {
    if (!p) return;
    for (int i = 0; i < p->nsteps; i++) {
        struct pstep *s = &p->steps[i];
        if (!s->prepared) continue;
        const struct graph_node *n = &p->g->nodes[s->node];
        if (s->prepared_one && n->op->release) n->op->release(s->state_one);
        if (p->host || s->on_host) {
            if (n->op->release) n->op->release(s->state);
        } else if (p->be->iface->release_node) {
            p->be->iface->release_node(p->be, n, s->state);
        }
    }
    if (p->dev_consts && p->be) p->be->iface->buffer_free(p->be, p->dev_consts);
    for (int v = 0; v < p->nvals; v++) {
        if (p->vals[v].owned) tensor_free_data(&p->vals[v].t);
        free(p->vals[v].h16);
    }
    free(p->vals);
    free(p->steps);
    free(p->sig);
    free(p->in_vals);
    free(p);
}

void plan_retain(struct plan *p) { atomic_fetch_add(&p->refs, 1); }

void plan_release(struct plan *p) {
    if (p && atomic_fetch_sub(&p->refs, 1) == 1) plan_free(p);
}

/* Placement item for the arena: a root value or a step's scratch. */
struct item {
    size_t size;
    int first, last;
    int value; /* -1 for scratch */
    int step;
    size_t off;
};

static int item_cmp_size(const void *a, const void *b) {
    const struct item *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return 0;
}

struct span {
    size_t lo, hi;
};

static int span_cmp(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    return x->lo < y->lo ? -1 : (x->lo > y->lo ? 1 : 0);
}

static int item_cmp_first(const void *a, const void *b) {
    const struct item *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    return 0;
}

/* Linear scan for very large graphs, where placing by size would cost
 * O(n^2): items in order of first use take the best-fitting free block
 * left by items whose live range ended, or grow the arena. */
static int place_items_scan(struct item *it, int n, size_t *arena_size) {
    qsort(it, (size_t)n, sizeof *it, item_cmp_first);
    struct span *fr = malloc((size_t)(n + 1) * sizeof *fr); /* free blocks, by offset */
    int *act = malloc((size_t)(n + 1) * sizeof *act);       /* live items */
    if (!fr || !act) {
        free(fr);
        free(act);
        return -1;
    }
    int nf = 0, na = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        for (int a = 0; a < na;) { /* release what died before this item starts */
            struct item *d = &it[act[a]];
            if (d->last >= it[i].first) {
                a++;
                continue;
            }
            struct span b = {d->off, d->off + d->size};
            int k = 0;
            while (k < nf && fr[k].lo < b.lo) k++;
            memmove(&fr[k + 1], &fr[k], (size_t)(nf - k) * sizeof *fr);
            fr[k] = b;
            nf++;
            if (k + 1 < nf && fr[k].hi == fr[k + 1].lo) { /* merge with the next */
                fr[k].hi = fr[k + 1].hi;
                memmove(&fr[k + 1], &fr[k + 2], (size_t)(nf - k - 2) * sizeof *fr);
                nf--;
            }
            if (k > 0 && fr[k - 1].hi == fr[k].lo) { /* and with the previous */
                fr[k - 1].hi = fr[k].hi;
                memmove(&fr[k], &fr[k + 1], (size_t)(nf - k - 1) * sizeof *fr);
                nf--;
            }
            act[a] = act[--na];
        }
        int best = -1;
        for (int k = 0; k < nf; k++)
            if (fr[k].hi - fr[k].lo >= it[i].size && (best < 0 || fr[k].hi - fr[k].lo < fr[best].hi - fr[best].lo))
                best = k;
        if (best >= 0) {
            it[i].off = fr[best].lo;
            fr[best].lo += it[i].size;
            if (fr[best].lo == fr[best].hi) {
                memmove(&fr[best], &fr[best + 1], (size_t)(nf - best - 1) * sizeof *fr);
                nf--;
            }
        } else if (nf > 0 && fr[nf - 1].hi == total) { /* extend the free tail */
            it[i].off = fr[nf - 1].lo;
            total = it[i].off + it[i].size;
            nf--;
        } else {
            it[i].off = total;
            total += it[i].size;
        }
        act[na++] = i;
    }
    free(fr);
    free(act);
    *arena_size = total;
    return 0;
}

#define PLACE_BY_SIZE_MAX 4096

/* Greedy best-fit by size: the largest buffers are placed first; each one
 * takes the smallest gap between already placed buffers whose live ranges
 * overlap its own, or goes past the last of them. Returns the arena size.
 * Beyond PLACE_BY_SIZE_MAX buffers, a linear scan keeps planning fast. */
static int place_items(struct item *it, int n, size_t *arena_size) {
    if (n > PLACE_BY_SIZE_MAX) return place_items_scan(it, n, arena_size);
    qsort(it, (size_t)n, sizeof *it, item_cmp_size);
    struct span *sp = malloc((size_t)(n ? n : 1) * sizeof *sp);
    if (!sp) return -1;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        int ns = 0;
        for (int j = 0; j < i; j++)
            if (it[j].first <= it[i].last && it[i].first <= it[j].last)
                sp[ns++] = (struct span){it[j].off, it[j].off + it[j].size};
        qsort(sp, (size_t)ns, sizeof *sp, span_cmp);
        size_t best = SIZE_MAX, best_gap = SIZE_MAX, cur = 0;
        for (int k = 0; k < ns; k++) {
            if (sp[k].lo > cur) {
                size_t gap = sp[k].lo - cur;
                if (gap >= it[i].size && gap < best_gap) {
                    best_gap = gap;
                    best = cur;
                }
            }
            if (sp[k].hi > cur) cur = sp[k].hi;
        }
        it[i].off = best != SIZE_MAX ? best : cur;
        if (it[i].off + it[i].size > total) total = it[i].off + it[i].size;
    }
    free(sp);
    *arena_size = total;
    return 0;
}

/* Device copies of the graph's constants, shared by every plan of one
 * device plan cache (each batch size would otherwise upload all weights
 * again). Used by one thread at a time, like the executor that owns the
 * cache; outlives the plans, which only borrow its pointers. */
struct plan_devstore {
    struct backend *be;
    int n;
    void **ptr;
};

static struct plan_devstore *devstore_create(struct backend *be, int n) {
    struct plan_devstore *ds = calloc(1, sizeof *ds);
    if (!ds) return NULL;
    ds->ptr = calloc((size_t)(n > 0 ? n : 1), sizeof *ds->ptr);
    if (!ds->ptr) {
        free(ds);
        return NULL;
    }
    ds->be = be;
    ds->n = n;
    return ds;
}

static void devstore_free(struct plan_devstore *ds) {
    if (!ds) return;
    for (int v = 0; v < ds->n; v++)
        if (ds->ptr[v]) ds->be->iface->buffer_free(ds->be, ds->ptr[v]);
    free(ds->ptr);
    free(ds);
}

/* Returns the device copy of graph constant v, uploading it on first use
 * (the plan synchronizes before it is used); NULL on failure. */
static void *devstore_get(struct plan_devstore *ds, int v, const struct tensor *t) {
    if (ds->ptr[v]) return ds->ptr[v];
    size_t nb = tensor_nbytes(t);
    void *d = ds->be->iface->buffer_alloc(ds->be, align_up(nb ? nb : 1));
    if (!d) return NULL;
    if (nb && ds->be->iface->copy_to_device(ds->be, d, t->data, nb)) {
        ds->be->iface->buffer_free(ds->be, d);
        return NULL;
    }
    ds->ptr[v] = d;
    return d;
}

static int plan_build_ds(const struct graph *g, const struct tensor *inputs, uint64_t bind_values,
                         struct backend *be, int nthreads, int fp16, struct plan_devstore *ds, struct plan **out,
                         char *err, size_t err_len);

int plan_build(const struct graph *g, const struct tensor *inputs, uint64_t bind_values, struct backend *be,
               int nthreads, struct plan **out, char *err, size_t err_len) {
    return plan_build_ds(g, inputs, bind_values, be, nthreads, 0, NULL, out, err, err_len);
}

int plan_build_opts(const struct graph *g, const struct tensor *inputs, uint64_t bind_values, struct backend *be,
                    int nthreads, int fp16, struct plan **out, char *err, size_t err_len) {
    return plan_build_ds(g, inputs, bind_values, be, nthreads, fp16, NULL, out, err, err_len);
}

/* ---- building: the phases ------------------------------------------------------ */

/* Every phase below returns 0 or a negative status with its message in err,
 * and leaves what it made in the plan (plan_free undoes all of it). */

static int build_nomem(char *err, size_t err_len) {
    return status_set(err, err_len, STATUS_NOMEM, "out of memory building the plan");
}

/* What the node walk and the step preparation share besides the plan: the
 * readers of each value, and the tensors that stand for absent outputs
 * (their shapes are inferred in the walk; prepare sees them again). */
struct build {
    const struct graph *g;
    struct plan *p;
    int *nuse; /* readers of each value; a graph output counts as one */
    struct tensor dummy[OP_MAX_IO];
    char *err;
    size_t err_len;
};

/* An empty plan for g: one reference, a table for every value and step, and
 * the signature's room. NULL when out of memory. */
static struct plan *plan_alloc(const struct graph *g, struct backend *be, int nthreads) {
    struct plan *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    atomic_init(&p->refs, 1);
    atomic_init(&p->last_used, 0);
    p->g = g;
    p->host = !be || be->host_memory;
    p->be = be;
    p->ninputs = g->ninputs;
    p->nthreads = nthreads > 0 ? nthreads : 1;
    p->vals = calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *p->vals);
    p->steps = calloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof *p->steps);
    p->sig = calloc((size_t)(g->ninputs ? g->ninputs : 1), sizeof *p->sig);
    if (!p->vals || !p->steps || !p->sig) {
        plan_free(p);
        return NULL;
    }
    p->nvals = g->nvalues; /* only now: plan_free walks vals[] */
    return p;
}

/* Graph constants become plan constants; graph inputs take the given
 * shapes (read in place by host plans, copied into the arena by device
 * plans), and those in bind_values are copied in as constants. Sets the
 * signature and its hash. */
static int values_init(struct plan *p, const struct tensor *inputs, uint64_t bind_values, char *err,
                       size_t err_len) {
    const struct graph *g = p->g;
    for (int v = 0; v < g->nvalues; v++) {
        struct pval *pv = &p->vals[v];
        pv->root = v;
        pv->input = -1;
        if (g->values[v].t.data) {
            pv->t = g->values[v].t;
            pv->kind = PLAN_VALUE_CONST;
        }
    }
    for (int i = 0; i < g->ninputs; i++) {
        int v = g->inputs[i];
        struct pval *pv = &p->vals[v];
        p->sig[i] = inputs[i];
        p->sig[i].data = NULL;
        pv->t = inputs[i];
        pv->t.data = NULL;
        pv->t.dtype = g->values[v].t.dtype != DT_UNDEFINED ? g->values[v].t.dtype : inputs[i].dtype;
        pv->kind = p->host ? PLAN_VALUE_INPUT : PLAN_VALUE_ARENA;
        pv->input = i;
        if (i < 64 && (bind_values >> i & 1)) {
            size_t nb = tensor_nbytes(&pv->t);
            if (pv->t.dtype == DT_STRING) {
                if (tensor_strings_pack(&pv->t, tensor_strs(&inputs[i]))) return build_nomem(err, err_len);
            } else {
                pv->t.data = malloc(nb ? nb : 1);
                if (!pv->t.data) return build_nomem(err, err_len);
                if (nb) memcpy(pv->t.data, inputs[i].data, nb);
            }
            pv->kind = PLAN_VALUE_CONST;
            pv->owned = 1;
            p->sig[i].data = pv->t.data;
            p->bind |= (uint64_t)1 << i;
        }
    }
    p->hash = plan_signature_hash(inputs, g->ninputs, p->bind);
    return 0;
}

/* b->nuse: how many node inputs and graph outputs read each value. */
static int count_reads(struct build *b) {
    const struct graph *g = b->g;
    b->nuse = calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *b->nuse);
    if (!b->nuse) return build_nomem(b->err, b->err_len);
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (g->nodes[i].in[k] >= 0) b->nuse[g->nodes[i].in[k]]++;
    for (int o = 0; o < g->noutputs; o++) b->nuse[g->outputs[o]]++;
    return 0;
}

/* Shape inference for node n: c gets the plan's tensors (absent outputs
 * are b->dummy), each output its concrete shape, and *known tells whether
 * every input is a constant now. */
static int infer_node(struct build *b, const struct graph_node *n, struct op_call *c, int *known) {
    struct plan *p = b->p;
    char *err = b->err;
    size_t err_len = b->err_len;
    if (n->nin > OP_MAX_IO || n->nout > OP_MAX_IO)
        return status_set(err, err_len, STATUS_UNSUPPORTED, "node '%s' (%s): more than %d inputs or outputs", n->name,
                          n->op_type, OP_MAX_IO);
    op_call_init(c, n, 1, err, err_len);
    *known = 1;
    for (int k = 0; k < n->nin; k++) {
        int v = n->in[k];
        if (v < 0) continue;
        if (p->vals[v].kind == PLAN_VALUE_UNUSED)
            return status_set(err, err_len, STATUS_INTERNAL, "node '%s' (%s): input '%s' is not computed before it",
                              n->name, n->op_type, b->g->values[v].name);
        c->in[k] = &p->vals[v].t;
        if (p->vals[v].kind != PLAN_VALUE_CONST) *known = 0;
    }
    for (int k = 0; k < n->nout; k++) {
        int v = n->out[k];
        struct tensor *t = v >= 0 ? &p->vals[v].t : &b->dummy[k];
        memset(t, 0, sizeof *t);
        c->out[k] = t;
    }
    if (!n->op || !n->op->infer)
        return status_set(err, err_len, STATUS_UNSUPPORTED, "node '%s' (%s): no kernel", n->name, n->op_type);
    if (err && err_len) err[0] = 0;
    int rc = n->op->infer(c);
    if (rc) {
        if (err && err_len && !err[0])
            status_set(err, err_len, rc, "node '%s' (%s): shape inference failed", n->name, n->op_type);
        return rc;
    }
    for (int k = 0; k < n->nout; k++)
        if ((rc = eval_check_shape(n, c->out[k], n->out[k] >= 0 ? b->g->values[n->out[k]].name : "", err, err_len)))
            return rc;
    return 0;
}

/* What fold_node decided for a node. */
enum node_fate {
    NODE_OPEN = 0,    /* not folded: it may still be a view or an activation in place */
    NODE_FOLDED = 1,  /* its outputs are plan constants */
    NODE_AS_STEP = 2, /* too large to keep as constants: it runs */
};

/* Plan-time folding: a node whose inputs are all constants now, or a
 * shape-only op (its inputs' shapes are), runs on the CPU at once and its
 * outputs become plan constants. Returns a node_fate or a negative status. */
static int fold_node(struct plan *p, const struct graph_node *n, struct op_call *c, int known, char *err,
                     size_t err_len) {
    const struct op_def *op = n->op;
    if (!(known || (op->flags & OP_SHAPE_ONLY)) || !op->run) return NODE_OPEN;
    struct tensor res[OP_MAX_IO];
    int rc = eval_node(n, (const struct tensor *const *)c->in, n->nin, res, n->nout, EVAL_FOLD_MAX_BYTES, err,
                       err_len);
    if (rc < 0) return rc;
    if (rc == 0) {
        for (int k = 0; k < n->nout; k++) {
            int v = n->out[k];
            if (v < 0) {
                free(res[k].data);
                continue;
            }
            p->vals[v].t = res[k];
            p->vals[v].kind = PLAN_VALUE_CONST;
            p->vals[v].owned = 1;
        }
        p->nfolded++;
        return NODE_FOLDED;
    }
    /* Too large to keep as a constant: it runs as a step. Shape-only ops
     * cannot, since their inputs have no data here. (With every input a
     * constant, it can be neither a view nor an activation in place.) */
    if (op->flags & OP_SHAPE_ONLY)
        return status_set(err, err_len, STATUS_INVALID, "node '%s' (%s): output too large", n->name, n->op_type);
    return NODE_AS_STEP;
}

/* An activation right after a step whose only reader it is: the executor
 * applies it in place after that step (host plans). 1 if n became that. */
static int absorb_activation(struct build *b, const struct graph_node *n) {
    struct plan *p = b->p;
    if (!p->host || n->nin < 1 || n->nout != 1 || n->out[0] < 0 || n->in[0] < 0) return 0;
    int v = n->in[0], bo = n->out[0];
    struct pval *pv = &p->vals[v];
    if (pv->kind != PLAN_VALUE_ARENA || pv->root != v || !pv->is_step_out || b->nuse[v] != 1 ||
        pv->t.dtype != DT_FP32 || p->vals[bo].t.dtype != DT_FP32 || !tensor_same_shape(&pv->t, &p->vals[bo].t))
        return 0;
    struct pstep *a = &p->steps[pv->first];
    const struct graph_node *an = &b->g->nodes[a->node];
    enum act_kind ak;
    float aa, ab;
    if (an->nout != 1 || a->post_act != ACT_NONE || an->act != ACT_NONE || !passes_activation_of(b->g, n, &ak, &aa, &ab))
        return 0;
    a->post_act = ak;
    a->act_a = aa;
    a->act_b = ab;
    p->vals[bo].root = v;
    p->vals[bo].kind = PLAN_VALUE_ARENA;
    p->npost_act++;
    return 1;
}

/* A view: output 0 is input 0's bytes under another shape (an alias op, or
 * a Cast to the datatype it already has), when nothing reads its other
 * outputs. 1 if n became one. */
static int make_view(struct build *b, const struct graph_node *n) {
    struct plan *p = b->p;
    int v0 = n->nout > 0 ? n->out[0] : -1, i0 = n->nin > 0 ? n->in[0] : -1;
    int same_cast = strcmp(n->op_type, "Cast") == 0 && !n->domain[0] && v0 >= 0 && i0 >= 0 &&
                    p->vals[v0].t.dtype == p->vals[i0].t.dtype;
    if (!((n->op->flags & OP_ALIAS_INPUT0) || same_cast) || v0 < 0 || i0 < 0 ||
        p->vals[i0].kind == PLAN_VALUE_CONST || p->vals[v0].t.dtype != p->vals[i0].t.dtype ||
        tensor_nbytes(&p->vals[v0].t) != tensor_nbytes(&p->vals[i0].t))
        return 0;
    for (int k = 1; k < n->nout; k++)
        if (n->out[k] >= 0 && b->nuse[n->out[k]] > 0) return 0;
    struct pval *src = &p->vals[p->vals[i0].root], *dst = &p->vals[v0];
    dst->root = p->vals[i0].root;
    dst->kind = src->kind;
    dst->input = src->input;
    for (int k = 1; k < n->nout; k++)
        if (n->out[k] >= 0) p->vals[n->out[k]].kind = PLAN_VALUE_UNUSED;
    return 1;
}

/* Node i runs: its outputs live in the arena from this step on. */
static void add_step(struct plan *p, int i) {
    const struct graph_node *n = &p->g->nodes[i];
    struct pstep *s = &p->steps[p->nsteps];
    s->node = i;
    for (int k = 0; k < n->nout; k++) {
        int v = n->out[k];
        if (v < 0) continue;
        p->vals[v].kind = PLAN_VALUE_ARENA;
        p->vals[v].is_step_out = 1;
        p->vals[v].first = p->vals[v].last = p->nsteps;
    }
    p->nsteps++;
}

/* Shape inference, plan-time folding, views and steps, in node order. */
static int walk_nodes(struct build *b) {
    for (int i = 0; i < b->g->nnodes; i++) {
        const struct graph_node *n = &b->g->nodes[i];
        struct op_call c;
        int known = 0, rc = infer_node(b, n, &c, &known);
        if (rc) return rc;
        if ((rc = fold_node(b->p, n, &c, known, b->err, b->err_len)) < 0) return rc;
        if (rc == NODE_FOLDED) continue;
        if (rc == NODE_OPEN && (absorb_activation(b, n) || make_view(b, n))) continue;
        add_step(b->p, i);
    }
    return 0;
}

/* Drops steps whose results nobody reads (e.g. a value whose only reader
 * was a Shape node folded in the walk), and the views of their outputs. */
static int drop_unread_steps(struct plan *p, char *err, size_t err_len) {
    const struct graph *g = p->g;
    int *need = calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *need);
    if (!need) return build_nomem(err, err_len);
    for (int o = 0; o < g->noutputs; o++) need[p->vals[g->outputs[o]].root] = 1;
    for (int si = p->nsteps - 1; si >= 0; si--) {
        const struct graph_node *n = &g->nodes[p->steps[si].node];
        int live = 0;
        for (int k = 0; k < n->nout; k++)
            if (n->out[k] >= 0 && need[n->out[k]]) live = 1;
        if (!live) {
            p->steps[si].node = -1;
            for (int k = 0; k < n->nout; k++)
                if (n->out[k] >= 0) p->vals[n->out[k]].kind = PLAN_VALUE_UNUSED;
            continue;
        }
        for (int k = 0; k < n->nin; k++)
            if (n->in[k] >= 0) need[p->vals[n->in[k]].root] = 1;
    }
    free(need);
    for (int v = 0; v < g->nvalues; v++)
        if (p->vals[v].root != v && p->vals[p->vals[v].root].kind == PLAN_VALUE_UNUSED)
            p->vals[v].kind = PLAN_VALUE_UNUSED;
    int w = 0;
    for (int si = 0; si < p->nsteps; si++)
        if (p->steps[si].node >= 0) p->steps[w++] = p->steps[si];
    p->nsteps = w;
    return 0;
}

/* Live ranges of arena roots, in the final step numbering: from the step
 * that writes a value to the last that reads it (graph outputs to the end;
 * device plans copy inputs in before step 0). */
static void live_ranges(struct plan *p) {
    const struct graph *g = p->g;
    for (int v = 0; v < g->nvalues; v++) {
        struct pval *pv = &p->vals[v];
        if (pv->kind == PLAN_VALUE_ARENA && pv->root == v) pv->first = pv->last = -1;
    }
    for (int si = 0; si < p->nsteps; si++) {
        const struct graph_node *n = &g->nodes[p->steps[si].node];
        for (int k = 0; k < n->nout; k++)
            if (n->out[k] >= 0) p->vals[n->out[k]].first = p->vals[n->out[k]].last = si;
        for (int k = 0; k < n->nin; k++) {
            if (n->in[k] < 0) continue;
            struct pval *r = &p->vals[p->vals[n->in[k]].root];
            if (r->kind == PLAN_VALUE_ARENA && r->last < si) r->last = si;
        }
    }
    for (int i = 0; i < g->ninputs; i++) {
        struct pval *pv = &p->vals[g->inputs[i]];
        if (pv->kind == PLAN_VALUE_ARENA) {
            pv->first = 0;
            if (pv->last < 0) pv->last = 0;
        }
    }
    for (int o = 0; o < g->noutputs; o++) {
        struct pval *r = &p->vals[p->vals[g->outputs[o]].root];
        if (r->kind == PLAN_VALUE_ARENA) r->last = p->nsteps;
    }
}

/* Datatypes on the device. FP16 device plans: every FP32 value lives on
 * the device as FP16, and the constants steps read get their FP16 bytes
 * now (prepare reads constant parameters from them; they are uploaded by
 * device_constants, then freed). */
static int device_dtypes(struct plan *p, int fp16, char *err, size_t err_len) {
    const struct graph *g = p->g;
    for (int v = 0; v < g->nvalues; v++) p->vals[v].ddt = p->vals[v].t.dtype;
    p->fp16 = fp16 && !p->host;
    if (!p->fp16) return 0;
    for (int v = 0; v < g->nvalues; v++) {
        struct pval *pv = &p->vals[v];
        if ((pv->kind == PLAN_VALUE_ARENA || pv->kind == PLAN_VALUE_CONST) && pv->t.dtype == DT_FP32) {
            pv->ddt = DT_FP16;
            p->nfp16++;
        }
    }
    for (int si = 0; si < p->nsteps; si++) {
        const struct graph_node *n = &g->nodes[p->steps[si].node];
        for (int k = 0; k < n->nin; k++) {
            int v = n->in[k];
            struct pval *pv = v >= 0 ? &p->vals[v] : NULL;
            if (!pv || pv->kind != PLAN_VALUE_CONST || pv->ddt != DT_FP16 || pv->h16 || !pv->t.data) continue;
            int64_t ne = tensor_numel(&pv->t);
            uint16_t *h = malloc((size_t)(ne ? ne : 1) * sizeof *h);
            if (!h) return build_nomem(err, err_len);
            const float *f = pv->t.data;
            for (int64_t e = 0; e < ne; e++) h[e] = fp32_to_fp16(f[e]);
            pv->h16 = h;
        }
    }
    return 0;
}

/* Points c at the plan's FP32 descriptors of node n's values. */
static void call_host_tensors(struct build *b, const struct graph_node *n, struct op_call *c) {
    for (int k = 0; k < n->nin; k++) c->in[k] = n->in[k] >= 0 ? &b->p->vals[n->in[k]].t : NULL;
    for (int k = 0; k < n->nout; k++) c->out[k] = n->out[k] >= 0 ? &b->p->vals[n->out[k]].t : &b->dummy[k];
}

/* FP16 plans: points c at descriptors with the device's datatypes (din,
 * dout) and at the FP16 bytes of constants. */
static void call_device_tensors(const struct plan *p, const struct graph_node *n, struct op_call *c,
                                struct tensor *din, struct tensor *dout) {
    for (int k = 0; k < n->nin; k++) {
        if (n->in[k] < 0) continue;
        const struct pval *pv = &p->vals[n->in[k]];
        din[k] = pv->t;
        din[k].dtype = pv->ddt;
        if (pv->h16) din[k].data = pv->h16;
        c->in[k] = &din[k];
    }
    for (int k = 0; k < n->nout; k++) {
        if (n->out[k] < 0) continue;
        dout[k] = p->vals[n->out[k]].t;
        dout[k].dtype = p->vals[n->out[k]].ddt;
        c->out[k] = &dout[k];
    }
}

/* ---- building: threads per step ----------------------------------------------
 * Starting an OpenMP team for a parallel region costs microseconds (more on a
 * busy machine, where the sleeping thread must be woken), as much as a small
 * node's whole work: at two threads every node of a small model paid it and
 * the model ran slower than on one. So each step of a host plan gets its own
 * thread count, fixed before its kernel is prepared (oneDNN sizes a
 * primitive's work split for the threads in force at its creation). A node
 * with little work runs on the calling thread alone; one with much work on
 * all the plan's threads; one in between is prepared both ways and timed on
 * the plan's first run, with that run's real inputs, and keeps the faster
 * (choose_threads: measured, so it holds on every CPU whatever its vector
 * width or core count, and on a machine other work shares).
 *
 * KILN_STEP_THREADS: unset or "measure" as above; "static" decides by the
 * estimate alone (a step in between keeps all the threads); "0" runs every
 * step on all the threads. */

/* Work (elements read and written, or multiply-adds) below which a node runs
 * on one thread, and above which on all without timing: a few microseconds
 * of work at most, and milliseconds. */
#define STEP_WORK_ONE 8192.0
#define STEP_WORK_ALL 67108864.0

enum step_threads_mode { STEP_THREADS_OFF, STEP_THREADS_STATIC, STEP_THREADS_MEASURE };

static enum step_threads_mode step_threads_mode(void) {
    const char *e = getenv("KILN_STEP_THREADS");
    if (!e || !*e || !strcmp(e, "measure")) return STEP_THREADS_MEASURE;
    if (!strcmp(e, "static")) return STEP_THREADS_STATIC;
    if (!strcmp(e, "0") || !strcmp(e, "off")) return STEP_THREADS_OFF;
    log_warn("KILN_STEP_THREADS=%s: expected measure, static or 0; measuring", e);
    return STEP_THREADS_MEASURE;
}

static double value_numel(const struct plan *p, int v) {
    return v >= 0 ? (double)tensor_numel(&p->vals[v].t) : 0;
}

/* A rough size of node n's work: the elements it reads and writes, or for a
 * node that contracts a dimension (MatMul, Gemm, convolutions and their
 * fused and quantized forms) its multiply-adds, whichever is larger. */
static double step_work(const struct plan *p, const struct graph_node *n) {
    double elems = 0, macs = 0;
    for (int k = 0; k < n->nin; k++) elems += value_numel(p, n->in[k]);
    for (int k = 0; k < n->nout; k++) elems += value_numel(p, n->out[k]);
    double out = n->nout > 0 ? value_numel(p, n->out[0]) : 0;
    const struct tensor *x = n->nin > 0 && n->in[0] >= 0 ? &p->vals[n->in[0]].t : NULL;
    const struct tensor *w = n->nin > 1 && n->in[1] >= 0 ? &p->vals[n->in[1]].t : NULL;
    if (strstr(n->op_type, "Conv") && w && w->ndim >= 3 && w->dims[0] > 0)
        macs = out * ((double)tensor_numel(w) / (double)w->dims[0]);
    else if ((strstr(n->op_type, "MatMul") || strstr(n->op_type, "Gemm")) && x && x->ndim >= 1)
        macs = out * (double)x->dims[x->ndim - 1];
    return macs > elems ? macs : elems;
}

/* Nodes whose work does not show in their tensors: subgraphs (If, Loop,
 * Scan) and the ai.onnx.ml models, whose trees and vectors are attributes. */
static int work_hidden(const struct graph_node *n) {
    if (n->domain && !strcmp(n->domain, "ai.onnx.ml")) return 1;
    for (int a = 0; a < n->nattr; a++)
        if (n->attrs[a].graphs) return 1;
    return 0;
}

/* Decides step s's thread count (and whether it is measured) before its
 * kernel is prepared. Device plans and one-thread plans keep the plan's. */
static void step_threads(struct plan *p, struct pstep *s, enum step_threads_mode mode) {
    s->nthreads = p->nthreads;
    s->measured = 0;
    if (!p->host || p->nthreads < 2 || mode == STEP_THREADS_OFF) return;
    const struct graph_node *n = &p->g->nodes[s->node];
    double work = step_work(p, n);
    if (work >= STEP_WORK_ALL) return;
    if (work < STEP_WORK_ONE && !work_hidden(n)) s->nthreads = 1;
    else if (mode == STEP_THREADS_MEASURE) s->measured = 1;
}

/* Prepares the kernel of the node in c for c->nthreads threads, where the
 * step runs: on the plan's backend, or on the CPU for host steps of a
 * plan built without one and for a device plan's fallback steps. */
static int prepare_kernel(struct plan *p, const struct pstep *s, struct op_call *c, void **state, size_t *scratch,
                          unsigned char *prepared) {
    struct backend *be = p->be;
    const struct graph_node *n = c->node;
    int rc = 0;
    *state = NULL;
    *scratch = 0;
    if (p->host && be && be->iface->prepare_node) {
        rc = be->iface->prepare_node(be, c, state, scratch);
        *prepared = !rc;
    } else if (p->host || s->on_host) {
        if (n->op->prepare) {
            /* What the CPU backend's prepare_node does first: a oneDNN
             * primitive must not be made for fewer threads than it runs on. */
            if (omp_get_max_threads() != c->nthreads) omp_set_num_threads(c->nthreads);
            rc = n->op->prepare(c, state, scratch);
            *prepared = !rc;
        }
    } else if (be->iface->prepare_node) {
        rc = be->iface->prepare_node(be, c, state, scratch);
        *prepared = !rc;
    }
    return rc;
}

/* Prepares step s once: chooses where it runs (a device plan falls back to
 * the CPU for a node the device refuses, in FP32, converted at the copies)
 * and on how many threads, and learns its state and scratch size. */
static int prepare_step(struct build *b, struct pstep *s, enum step_threads_mode mode) {
    struct plan *p = b->p;
    struct backend *be = p->be;
    const struct graph_node *n = &b->g->nodes[s->node];
    struct op_call c;
    struct tensor din[OP_MAX_IO], dout[OP_MAX_IO];
    step_threads(p, s, mode);
    op_call_init(&c, n, s->nthreads, b->err, b->err_len);
    call_host_tensors(b, n, &c);
    if (p->fp16) call_device_tensors(p, n, &c, din, dout);
    if (!p->host && be->iface->supports_op && !be->iface->supports_op(be, &c)) {
        s->on_host = 1;
        p->nfallback++;
        call_host_tensors(b, n, &c);
    }
    if (b->err && b->err_len) b->err[0] = 0;
    void *state = NULL, *state_one = NULL;
    size_t scratch = 0, scratch_one = 0;
    int rc = prepare_kernel(p, s, &c, &state, &scratch, &s->prepared);
    if (!rc) s->state = state;
    if (!rc && s->measured) {
        c.nthreads = 1;
        rc = prepare_kernel(p, s, &c, &state_one, &scratch_one, &s->prepared_one);
        if (!rc) {
            s->state_one = state_one;
            p->nmeasured++;
        }
    }
    if (rc) {
        if (b->err && b->err_len && !b->err[0])
            status_set(b->err, b->err_len, rc, "node '%s' (%s): preparing the kernel failed", n->name, n->op_type);
        return rc;
    }
    s->scratch_size = scratch > scratch_one ? scratch : scratch_one;
    return 0;
}

static int prepare_steps(struct build *b) {
    enum step_threads_mode mode = step_threads_mode();
    for (int si = 0; si < b->p->nsteps; si++) {
        int rc = prepare_step(b, &b->p->steps[si], mode);
        if (rc) return rc;
    }
    return 0;
}

/* The arena's items: each arena root (device bytes, 64-byte aligned, never
 * empty so that pointers stay distinct) and each step's scratch. */
static int arena_items(struct plan *p, struct item *items) {
    int n = 0;
    for (int v = 0; v < p->nvals; v++) {
        struct pval *pv = &p->vals[v];
        if (pv->kind != PLAN_VALUE_ARENA || pv->root != v) continue;
        pv->size = align_up(dev_nbytes(pv));
        if (!pv->size) pv->size = PLAN_ALIGN;
        items[n++] = (struct item){pv->size, pv->first, pv->last, v, -1, 0};
    }
    for (int si = 0; si < p->nsteps; si++)
        if (p->steps[si].scratch_size)
            items[n++] = (struct item){align_up(p->steps[si].scratch_size), si, si, -1, si, 0};
    return n;
}

/* Copies placed offsets to the values and steps: the arena's, or the host
 * mirror's. */
static void item_offsets(struct plan *p, const struct item *items, int n, int mirror) {
    for (int i = 0; i < n; i++) {
        if (items[i].value >= 0) {
            struct pval *pv = &p->vals[items[i].value];
            if (mirror) pv->hoff = items[i].off;
            else pv->off = items[i].off;
        } else {
            struct pstep *s = &p->steps[items[i].step];
            if (mirror) s->hscratch_off = items[i].off;
            else s->scratch_off = items[i].off;
        }
    }
}

/* The host mirror of CPU fallback steps holds FP32: in FP16 plans it gets
 * a layout of its own, with FP32 sizes, by the same placement; otherwise
 * it is laid out as the arena. */
static int place_mirror(struct plan *p, struct item *items, int n) {
    p->mirror_size = p->arena_size;
    for (int v = 0; v < p->nvals; v++) p->vals[v].hoff = p->vals[v].off;
    for (int si = 0; si < p->nsteps; si++) p->steps[si].hscratch_off = p->steps[si].scratch_off;
    if (!p->fp16 || !p->nfallback) return 0;
    for (int i = 0; i < n; i++)
        if (items[i].value >= 0) {
            size_t nb = align_up(tensor_nbytes(&p->vals[items[i].value].t));
            items[i].size = nb ? nb : PLAN_ALIGN;
        }
    if (place_items(items, n, &p->mirror_size)) return -1;
    item_offsets(p, items, n, 1);
    return 0;
}

/* A request's run takes the arena and a copy of each output: refused when
 * together they pass the thread's request bound (eval_max_bytes), before
 * the executor allocates anything, naming the largest output. */
static int check_budget(const struct plan *p, char *err, size_t err_len) {
    size_t max = eval_max_bytes();
    if (!max) return 0;
    const struct graph *g = p->g;
    size_t total = p->arena_size, big = 0;
    int bo = -1;
    for (int o = 0; o < g->noutputs; o++) {
        size_t nb = tensor_nbytes(&p->vals[g->outputs[o]].t);
        total += nb;
        if (nb >= big) {
            big = nb;
            bo = o;
        }
    }
    if (total <= max) return 0;
    return status_set(err, err_len, STATUS_INVALID,
                      "these inputs need %zu bytes (an arena of %zu, output '%s' %zu), over the %zu bytes one "
                      "request may use (--max-request-memory)", total, p->arena_size,
                      bo >= 0 ? g->values[g->outputs[bo]].name : "", big, max);
}

/* Memory: one arena, best-fit over live ranges; views take their root's
 * bytes and range. */
static int place_memory(struct plan *p, char *err, size_t err_len) {
    struct item *items = malloc((size_t)(p->nvals + p->nsteps + 1) * sizeof *items);
    if (!items) return build_nomem(err, err_len);
    int n = arena_items(p, items);
    int rc = place_items(items, n, &p->arena_size);
    if (!rc) {
        item_offsets(p, items, n, 0);
        rc = place_mirror(p, items, n);
    }
    free(items);
    if (rc) return build_nomem(err, err_len);
    if ((rc = check_budget(p, err, err_len))) return rc;
    for (int v = 0; v < p->nvals; v++) {
        struct pval *pv = &p->vals[v];
        if (pv->root != v && pv->kind == PLAN_VALUE_ARENA) {
            pv->off = p->vals[pv->root].off;
            pv->hoff = p->vals[pv->root].hoff;
            pv->size = p->vals[pv->root].size;
            pv->first = p->vals[pv->root].first;
            pv->last = p->vals[pv->root].last;
        }
    }
    return 0;
}

/* Host plans read graph inputs (and their views) in place: their list. */
static int list_input_values(struct plan *p, char *err, size_t err_len) {
    p->in_vals = malloc((size_t)(p->nvals > 0 ? (unsigned)p->nvals : 1u) * sizeof(int));
    if (!p->in_vals) return build_nomem(err, err_len);
    for (int v = 0; v < p->nvals; v++)
        if (p->vals[v].kind == PLAN_VALUE_INPUT) p->in_vals[p->nin_vals++] = v;
    return 0;
}

/* Gives constant v, read by a device step, its device bytes: a graph
 * constant comes from the store shared by the cache's plans; the plan's
 * own (folded, bound inputs) get a place in its block, *total so far. */
static int device_const_place(struct plan *p, struct plan_devstore *ds, int v, size_t *total, char *err,
                              size_t err_len) {
    struct pval *pv = &p->vals[v];
    if (ds && !pv->owned && v < ds->n) {
        struct tensor up = pv->t;
        if (pv->h16) {
            up.dtype = DT_FP16;
            up.data = pv->h16;
        }
        pv->dev = devstore_get(ds, v, &up);
        if (!pv->dev)
            return status_set(err, err_len, STATUS_NOMEM, "copying constant '%s' to the device failed",
                              p->g->values[v].name);
        return 0;
    }
    pv->off = *total;
    pv->size = align_up(dev_nbytes(pv));
    if (!pv->size) pv->size = PLAN_ALIGN;
    *total += pv->size;
    return 0;
}

/* Copies the plan's own constants into one device block and waits. */
static int device_const_upload(struct plan *p, char *err, size_t err_len) {
    struct backend *be = p->be;
    int rc;
    p->dev_consts = be->iface->buffer_alloc(be, p->consts_size);
    if (!p->dev_consts)
        return status_set(err, err_len, STATUS_NOMEM, "out of device memory for %zu bytes of constants",
                          p->consts_size);
    for (int v = 0; v < p->nvals; v++) {
        struct pval *pv = &p->vals[v];
        if (pv->kind != PLAN_VALUE_CONST || !pv->size) continue;
        size_t nb = dev_nbytes(pv);
        const void *src = pv->h16 ? pv->h16 : pv->t.data;
        if (nb && (rc = be->iface->copy_to_device(be, (char *)p->dev_consts + pv->off, src, nb))) {
            status_set(err, err_len, rc, "copying constant '%s' to the device failed", p->g->values[v].name);
            return rc;
        }
    }
    if (be->iface->synchronize && (rc = be->iface->synchronize(be))) {
        status_set(err, err_len, rc, "copying constants to the device failed");
        return rc;
    }
    return 0;
}

/* Device plans: the constants that device steps read go up once; the FP16
 * host copies are done with then. */
static int device_constants(struct plan *p, struct plan_devstore *ds, char *err, size_t err_len) {
    if (p->host) return 0;
    struct backend *be = p->be;
    size_t total = 0;
    int rc;
    for (int si = 0; si < p->nsteps; si++) {
        if (p->steps[si].on_host) continue;
        const struct graph_node *n = &p->g->nodes[p->steps[si].node];
        for (int k = 0; k < n->nin; k++) {
            int v = n->in[k];
            if (v < 0 || p->vals[v].kind != PLAN_VALUE_CONST || p->vals[v].size || p->vals[v].dev) continue;
            if ((rc = device_const_place(p, ds, v, &total, err, err_len))) return rc;
        }
    }
    p->consts_size = total;
    if (ds && be->iface->synchronize && (rc = be->iface->synchronize(be))) {
        status_set(err, err_len, rc, "copying constants to the device failed");
        return rc;
    }
    if (total && (rc = device_const_upload(p, err, err_len))) return rc;
    for (int v = 0; v < p->nvals; v++) {
        free(p->vals[v].h16);
        p->vals[v].h16 = NULL;
    }
    return 0;
}

static void log_plan(const struct plan *p, const struct tensor *inputs) {
    if (!log_enabled(LOG_DEBUG)) return;
    const struct graph *g = p->g;
    char s[160] = "";
    if (g->ninputs) tensor_shape_str(&inputs[0], s, sizeof s);
    log_debug("plan for %s%s: %d steps, %d nodes folded, %d activations applied in place, %d views, arena %zu "
              "bytes%s%s",
              s, g->ninputs > 1 ? ",..." : "", p->nsteps, p->nfolded, p->npost_act,
              g->nnodes - p->nsteps - p->nfolded - p->npost_act, p->arena_size,
              p->nfallback ? " (some nodes on the CPU)" : "", p->fp16 ? ", FP16" : "");
}

static int plan_build_ds(const struct graph *g, const struct tensor *inputs, uint64_t bind_values,
                         struct backend *be, int nthreads, int fp16, struct plan_devstore *ds, struct plan **out,
                         char *err, size_t err_len) {
    *out = NULL;
    struct plan *p = plan_alloc(g, be, nthreads);
    if (!p) return build_nomem(err, err_len);
    struct build b = {.g = g, .p = p, .err = err, .err_len = err_len};
    int rc;
    if ((rc = values_init(p, inputs, bind_values, err, err_len)) || (rc = count_reads(&b)) ||
        (rc = walk_nodes(&b)) || (rc = drop_unread_steps(p, err, err_len)))
        goto fail;
    live_ranges(p);
    if ((rc = device_dtypes(p, fp16, err, err_len)) || (rc = prepare_steps(&b)) ||
        (rc = place_memory(p, err, err_len)) || (rc = list_input_values(p, err, err_len)) ||
        (rc = device_constants(p, ds, err, err_len)))
        goto fail;
    free(b.nuse);
    log_plan(p, inputs);
    *out = p;
    return 0;
fail:
    free(b.nuse);
    plan_free(p);
    return rc;
}

size_t plan_arena_size(const struct plan *p) { return p->arena_size; }
int plan_nsteps(const struct plan *p) { return p->nsteps; }
int plan_nconst_folded(const struct plan *p) { return p->nfolded; }
int plan_step_node(const struct plan *p, int i) { return i >= 0 && i < p->nsteps ? p->steps[i].node : -1; }
int plan_nfp16(const struct plan *p) { return p->fp16 ? p->nfp16 : 0; }
int plan_nfallback(const struct plan *p) { return p->nfallback; }
int plan_step_on_host(const struct plan *p, int i) { return i >= 0 && i < p->nsteps ? p->steps[i].on_host : 0; }
int plan_threads_pick(const struct plan *p) { return atomic_load_explicit(&((struct plan *)p)->pick, memory_order_relaxed); }

int plan_nmeasured(const struct plan *p) { return p->nmeasured; }
int plan_step_measured(const struct plan *p, int i) { return i >= 0 && i < p->nsteps ? p->steps[i].measured : 0; }

int plan_step_threads(const struct plan *p, int i) {
    if (i < 0 || i >= p->nsteps) return 0;
    int nt;
    step_state(&p->steps[i], &nt);
    return nt;
}

enum plan_value_kind plan_value_info(const struct plan *p, int v, struct tensor *shape, size_t *offset,
                                     size_t *size, int *first_step, int *last_step) {
    if (v < 0 || v >= p->nvals) return PLAN_VALUE_UNUSED;
    const struct pval *pv = &p->vals[v];
    if (shape) *shape = pv->t;
    if (offset) *offset = pv->off;
    if (size) *size = pv->kind == PLAN_VALUE_ARENA ? pv->size : tensor_nbytes(&pv->t);
    if (first_step) *first_step = pv->first;
    if (last_step) *last_step = pv->last;
    return pv->kind;
}

uint64_t plan_signature_hash(const struct tensor *inputs, int ninputs, uint64_t bind_values) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < ninputs; i++) {
        h = (h ^ (uint64_t)(inputs[i].ndim + 1)) * 1099511628211ull;
        for (int d = 0; d < inputs[i].ndim && d < TENSOR_MAX_DIMS; d++)
            h = (h ^ (uint64_t)inputs[i].dims[d]) * 1099511628211ull;
        if (i < 64 && (bind_values >> i & 1) && inputs[i].data && inputs[i].dtype == DT_STRING) {
            const struct tensor_str *sv = tensor_strs(&inputs[i]);
            /* Each element's bytes and length: "ab","c" differs from "a","bc", "a\0" from "a". */
            for (int64_t e = 0, ne = tensor_numel(&inputs[i]); e < ne; e++)
                h = ((h ^ tensor_str_hash(sv[e])) * 1099511628211ull ^ sv[e].len) * 1099511628211ull;
        } else if (i < 64 && (bind_values >> i & 1) && inputs[i].data) {
            const unsigned char *b = inputs[i].data;
            size_t nb = tensor_nbytes(&inputs[i]);
            for (size_t k = 0; k < nb; k++) h = (h ^ b[k]) * 1099511628211ull;
        }
    }
    return h;
}

int plan_matches(const struct plan *p, const struct tensor *inputs, int ninputs) {
    if (ninputs != p->ninputs) return 0;
    for (int i = 0; i < ninputs; i++) {
        if (inputs[i].ndim != p->sig[i].ndim) return 0;
        for (int d = 0; d < inputs[i].ndim; d++)
            if (inputs[i].dims[d] != p->sig[i].dims[d]) return 0;
        if (!p->sig[i].data) continue;
        if (!inputs[i].data) return 0;
        if (inputs[i].dtype == DT_STRING) {
            const struct tensor_str *a = tensor_strs(&inputs[i]), *b = tensor_strs(&p->sig[i]);
            for (int64_t e = 0, ne = tensor_numel(&inputs[i]); e < ne; e++)
                if (!tensor_str_eq(a[e], b[e])) return 0;
        } else if (memcmp(inputs[i].data, p->sig[i].data, tensor_nbytes(&inputs[i]))) {
            return 0;
        }
    }
    return 1;
}

/* ---- executors ------------------------------------------------------------------ */

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
    void *stage;    /* FP16 plans: host staging for inputs converted to FP16 */
    size_t stage_cap;
    /* KILN_PROFILE=1: time per op type, logged when the executor is freed. */
    int profile;
    struct prof_entry *prof;
    int nprof;
    uint64_t nruns;
};

struct prof_entry {
    const char *op_type;
    double ms;
    int64_t calls;
    int64_t calls_one; /* of them on one thread (see "threads per step") */
};

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void prof_add(struct plan_exec *x, const char *op_type, double ms, int nthreads) {
    for (int i = 0; i < x->nprof; i++)
        if (strcmp(x->prof[i].op_type, op_type) == 0) {
            x->prof[i].ms += ms;
            x->prof[i].calls++;
            x->prof[i].calls_one += nthreads == 1;
            return;
        }
    struct prof_entry *np = realloc(x->prof, (size_t)(x->nprof + 1) * sizeof *np);
    if (!np) return;
    x->prof = np;
    x->prof[x->nprof++] = (struct prof_entry){op_type, ms, 1, nthreads == 1};
}

static int prof_cmp(const void *a, const void *b) {
    double x = ((const struct prof_entry *)a)->ms, y = ((const struct prof_entry *)b)->ms;
    return x > y ? -1 : (x < y ? 1 : 0);
}

static void prof_dump(struct plan_exec *x) {
    if (!x->nprof || !x->nruns) return;
    qsort(x->prof, (size_t)x->nprof, sizeof *x->prof, prof_cmp);
    double total = 0;
    for (int i = 0; i < x->nprof; i++) total += x->prof[i].ms;
    log_info("profile over %llu runs: %.3f ms per run in kernels", (unsigned long long)x->nruns, total / (double)x->nruns);
    for (int i = 0; i < x->nprof; i++)
        log_info("  %-24s %9.3f ms/run %5.1f%% %6lld calls, %6lld on 1 thread", x->prof[i].op_type,
                 x->prof[i].ms / (double)x->nruns, 100.0 * x->prof[i].ms / (total > 0 ? total : 1),
                 (long long)x->prof[i].calls, (long long)x->prof[i].calls_one);
}

struct plan_exec *plan_exec_create(struct backend *be, int nthreads) {
    if (!be) return NULL;
    struct plan_exec *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    x->be = be;
    x->host = be->host_memory;
    x->nthreads = nthreads > 0 ? nthreads : 1;
    if (!(x->strings = op_strpool_create())) {
        free(x);
        return NULL;
    }
    const char *pe = getenv("KILN_PROFILE");
    x->profile = pe && *pe && strcmp(pe, "0") != 0;
    return x;
}

static void drop_graph(struct plan_exec *x) {
    if (x->graph && x->be->iface->graph_free) x->be->iface->graph_free(x->be, x->graph);
    x->graph = NULL;
    x->graph_runs = 0;
    x->graph_off = 0;
}

static void arena_free(struct plan_exec *x) {
    if (!x->arena) return;
    if (x->host) free(x->arena);
    else x->be->iface->buffer_free(x->be, x->arena);
    x->arena = NULL;
    x->arena_cap = 0;
}

void plan_exec_free(struct plan_exec *x) {
    if (!x) return;
    prof_dump(x);
    free(x->prof);
    drop_graph(x);
    plan_release(x->bound);
    arena_free(x);
    free(x->mirror);
    free(x->stage);
    free(x->tv);
    free(x->tvh);
    free(x->calls);
    op_strpool_free(x->strings);
    free(x);
}

struct backend *plan_exec_backend(const struct plan_exec *x) { return x->be; }
int plan_exec_nthreads(const struct plan_exec *x) { return x->nthreads; }
struct plan *plan_exec_bound(const struct plan_exec *x) { return x->bound; }

void plan_exec_set_cuda_graphs(struct plan_exec *x, int on) {
    x->graphs_disabled = !on;
    if (!on) drop_graph(x);
}

static void fill_call(struct op_call *c, const struct plan *p, const struct pstep *s, struct tensor *tv,
                      char *base, size_t scratch_off, struct op_strpool *strings) {
    const struct graph_node *n = &p->g->nodes[s->node];
    memset(c, 0, sizeof *c);
    c->node = n;
    c->nin = n->nin;
    c->nout = n->nout;
    for (int k = 0; k < n->nin; k++) c->in[k] = n->in[k] >= 0 ? &tv[n->in[k]] : NULL;
    for (int k = 0; k < n->nout; k++) c->out[k] = n->out[k] >= 0 ? &tv[n->out[k]] : NULL;
    c->state = step_state(s, &c->nthreads);
    c->scratch = s->scratch_size ? base + scratch_off : NULL;
    c->scratch_size = s->scratch_size;
    c->strings = strings;
}

/* Points the calls of measured steps at the variant their timing chose. */
static void bind_choices(struct plan_exec *x, const struct plan *p) {
    for (int si = 0; si < p->nsteps; si++)
        if (p->steps[si].measured) x->calls[si].state = step_state(&p->steps[si], &x->calls[si].nthreads);
    x->choices_bound = 1;
}

/* Points the executor's tensors and call records at p and the arena. Done
 * when the plan or the arena changes, never per run. */
static int bind(struct plan_exec *x, struct plan *p, char *err, size_t err_len) {
    drop_graph(x); /* it holds the old arena's and plan's pointers */
    /* Unbound until this succeeds, so a half-done bind is never trusted. */
    plan_release(x->bound);
    x->bound = NULL;
    if (p->arena_size > x->arena_cap || !x->arena) {
        arena_free(x);
        size_t cap = align_up(p->arena_size ? p->arena_size : PLAN_ALIGN);
        x->arena = x->host ? aligned_alloc(PLAN_ALIGN, cap) : x->be->iface->buffer_alloc(x->be, cap);
        if (!x->arena)
            return status_set(err, err_len, STATUS_NOMEM, "out of memory for a %zu-byte arena", cap);
        x->arena_cap = cap;
    }
    if (p->nfallback && p->mirror_size > x->mirror_cap) {
        free(x->mirror);
        x->mirror = aligned_alloc(PLAN_ALIGN, align_up(p->mirror_size));
        x->mirror_cap = x->mirror ? align_up(p->mirror_size) : 0;
        if (!x->mirror) return status_set(err, err_len, STATUS_NOMEM, "out of memory for a host arena");
    }
    int nv = p->nvals > 0 ? p->nvals : 1;
    /* For each absent output a node has, a dummy tensor sits past the values. */
    int nextra = OP_MAX_IO;
    if (nv + nextra > x->tv_cap) {
        free(x->tv);
        free(x->tvh);
        x->tv_cap = 0;
        x->tv = malloc((size_t)(nv + nextra) * sizeof *x->tv);
        x->tvh = malloc((size_t)(nv + nextra) * sizeof *x->tvh);
        if (!x->tv || !x->tvh) return status_set(err, err_len, STATUS_NOMEM, "out of memory binding a plan");
        x->tv_cap = nv + nextra;
    }
    if (p->nsteps > x->calls_cap) {
        free(x->calls);
        x->calls_cap = 0;
        x->calls = malloc((size_t)p->nsteps * sizeof *x->calls);
        if (!x->calls) return status_set(err, err_len, STATUS_NOMEM, "out of memory binding a plan");
        x->calls_cap = p->nsteps;
    }
    char *base = x->arena, *hbase = x->mirror;
    for (int v = 0; v < p->nvals; v++) {
        const struct pval *pv = &p->vals[v];
        x->tv[v] = pv->t;
        x->tv[v].dtype = pv->ddt ? pv->ddt : pv->t.dtype;
        x->tvh[v] = pv->t;
        switch (pv->kind) {
        case PLAN_VALUE_CONST:
            x->tv[v].data = x->host ? pv->t.data
                                    : pv->dev ? pv->dev : (pv->size ? (char *)p->dev_consts + pv->off : NULL);
            break;
        case PLAN_VALUE_ARENA:
            x->tv[v].data = base + pv->off;
            x->tvh[v].data = hbase ? hbase + pv->hoff : NULL;
            break;
        default:
            x->tv[v].data = NULL;
            x->tvh[v].data = NULL;
        }
    }
    for (int si = 0; si < p->nsteps; si++) {
        const struct pstep *s = &p->steps[si];
        fill_call(&x->calls[si], p, s, s->on_host ? x->tvh : x->tv, s->on_host ? hbase : base,
                  s->on_host ? s->hscratch_off : s->scratch_off, x->strings);
        const struct graph_node *n = &p->g->nodes[s->node];
        for (int k = 0; k < n->nout; k++) /* absent optional outputs still get somewhere to be described */
            if (n->out[k] < 0) {
                struct tensor *d = &(s->on_host ? x->tvh : x->tv)[p->nvals + k];
                memset(d, 0, sizeof *d);
                x->calls[si].out[k] = d;
            }
    }
    x->choices_bound = !p->nmeasured || atomic_load_explicit(&p->timed, memory_order_acquire) == 2;
    plan_retain(p);
    x->bound = p;
    return 0;
}

static int copy_output(struct plan_exec *x, struct plan *p, int o, struct tensor *dst, const struct tensor *inputs,
                       char *err, size_t err_len) {
    const struct graph *g = p->g;
    int v = g->outputs[o];
    const struct pval *pv = &p->vals[v];
    const struct tensor *src = &x->tv[v];
    *dst = pv->t;
    dst->data = NULL;
    size_t nb = tensor_nbytes(&pv->t);
    const void *from = NULL;
    if (pv->kind == PLAN_VALUE_CONST) from = pv->t.data;
    else if (pv->kind == PLAN_VALUE_INPUT) from = inputs[pv->input].data;
    else if (pv->kind == PLAN_VALUE_ARENA && x->host) from = src->data;
    if (pv->t.dtype == DT_STRING) {
        /* The arena holds elements pointing at strings owned elsewhere:
         * the output gets its own block (common/tensor.h). */
        if (!from) return status_set(err, err_len, STATUS_UNSUPPORTED, "output '%s': strings on a device backend", g->values[v].name);
        if (tensor_strings_pack(dst, from))
            return status_set(err, err_len, STATUS_NOMEM, "out of memory for output '%s'", g->values[v].name);
        return 0;
    }
    dst->data = malloc(nb ? nb : 1);
    if (!dst->data) return status_set(err, err_len, STATUS_NOMEM, "out of memory for output '%s' (%zu bytes)", g->values[v].name, nb);
    if (!nb) return 0;
    if (from) {
        memcpy(dst->data, from, nb);
        return 0;
    }
    /* FP16 values come back as FP16 into the first half of the buffer and
     * are widened after the final synchronize (plan_exec_run). */
    int rc = x->be->iface->copy_to_host(x->be, dst->data, src->data, pv->ddt == DT_FP16 && pv->t.dtype == DT_FP32 ? nb / 2 : nb);
    if (rc) status_set(err, err_len, rc, "copying output '%s' from the device failed", g->values[v].name);
    return rc;
}

static int run_device_fallback(struct plan_exec *x, struct plan *p, int si, char *err, size_t err_len) {
    const struct backend_i *be = x->be->iface;
    const struct graph_node *n = &p->g->nodes[p->steps[si].node];
    int rc;
    /* In FP16 plans the CPU still computes in FP32: FP16 inputs are widened
     * in the mirror after the copy (once per root: an input read twice, or
     * through a view, shares its bytes) and outputs narrowed before theirs. */
    int widen[OP_MAX_IO], nwiden = 0;
    for (int k = 0; k < n->nin; k++) {
        int v = n->in[k];
        if (v < 0 || p->vals[v].kind != PLAN_VALUE_ARENA) continue;
        int dup = 0;
        for (int j = 0; j < k; j++)
            if (n->in[j] >= 0 && p->vals[n->in[j]].kind == PLAN_VALUE_ARENA && p->vals[n->in[j]].root == p->vals[v].root)
                dup = 1;
        if (dup) continue;
        size_t nb = dev_nbytes(&p->vals[v]);
        if (nb && (rc = be->copy_to_host(x->be, x->tvh[v].data, x->tv[v].data, nb))) goto fail;
        if (p->vals[v].ddt != p->vals[v].t.dtype) widen[nwiden++] = v;
    }
    if (be->synchronize && (rc = be->synchronize(x->be))) goto fail;
    for (int i = 0; i < nwiden; i++) widen_in_place(x->tvh[widen[i]].data, (size_t)tensor_numel(&p->vals[widen[i]].t));
    struct op_call *c = &x->calls[si];
    c->err = err;
    c->err_len = err_len;
    if ((rc = n->op->run(c))) return rc;
    for (int k = 0; k < n->nout; k++) {
        int v = n->out[k];
        if (v < 0 || p->vals[v].kind != PLAN_VALUE_ARENA) continue;
        size_t nb = dev_nbytes(&p->vals[v]);
        if (p->vals[v].ddt != p->vals[v].t.dtype) narrow_in_place(x->tvh[v].data, (size_t)tensor_numel(&p->vals[v].t));
        if (nb && (rc = be->copy_to_device(x->be, x->tv[v].data, x->tvh[v].data, nb))) goto fail;
    }
    return 0;
fail:
    return status_set(err, err_len, rc, "node '%s' (%s): copying between host and device failed", n->name, n->op_type);
}

/* Runs the plan's steps. times (if not NULL) gets each host step's time in
 * milliseconds, the kernel and its activation. */
static int run_steps(struct plan_exec *x, struct plan *p, double *times, char *err, size_t err_len) {
    const struct backend_i *be = x->be->iface;
    int rc;
    for (int si = 0; si < p->nsteps; si++) {
        struct op_call *c = &x->calls[si];
        double t0 = x->profile || times ? now_ms() : 0;
        if (!x->host && p->steps[si].on_host) rc = run_device_fallback(x, p, si, err, err_len);
        else {
            c->err = err;
            c->err_len = err_len;
            rc = be->run_node(x->be, c);
        }
        if (x->profile) {
            if (!x->host && be->synchronize) be->synchronize(x->be);
            prof_add(x, c->node->op_type, now_ms() - t0, c->nthreads);
        }
        if (rc) {
            if (err && err_len && !err[0])
                status_set(err, err_len, rc, "node '%s' (%s) failed (%s)", c->node->name, c->node->op_type,
                           status_str(rc));
            return rc < 0 ? rc : STATUS_INTERNAL;
        }
        const struct pstep *s = &p->steps[si];
        if (s->post_act != ACT_NONE) {
            struct graph_node an = *c->node;
            an.act = s->post_act;
            an.act_alpha = s->act_a;
            an.act_beta = s->act_b;
            op_apply_act(&an, c->out[0]->data, tensor_numel(c->out[0]));
        }
        if (times) times[si] = now_ms() - t0;
    }
    return 0;
}

/* Whole timed runs per configuration of the measured steps, at most, and
 * the time they may take together (the plan's first run pays it, once per
 * input shape): a large model gets fewer runs (at least one each), and none
 * when the plan's first run alone took longer, and then its measured steps
 * keep all the threads (the static choice). The first run is cold (page
 * faults in a new arena, caches), often ten times a warm one: a small
 * model's first run does not exclude it. */
#define TIMING_RUNS 9
#define TIMING_BUDGET_MS 100.0

enum step_config { MEASURED_ALL = 0, MEASURED_ONE = 1, MEASURED_CHOSEN = 2 };

/* Points the calls of the measured steps at the variant for all the
 * threads, for one, or at the one each chose. */
static void configure_measured(struct plan_exec *x, const struct plan *p, enum step_config cfg) {
    for (int si = 0; si < p->nsteps; si++) {
        const struct pstep *s = &p->steps[si];
        if (!s->measured) continue;
        int one = cfg == MEASURED_ONE ||
                  (cfg == MEASURED_CHOSEN && atomic_load_explicit(&s->chosen, memory_order_relaxed) == 1);
        x->calls[si].state = one ? s->state_one : s->state;
        x->calls[si].nthreads = one ? 1 : s->nthreads;
    }
}

/* Runs the plan n times more in configuration cfg (every step recomputes
 * its outputs from its inputs, so the results stay those of this run),
 * keeping each step's fastest time in best[] (if not NULL) and returning
 * the fastest whole run in *run_ms. */
static int timed_runs(struct plan_exec *x, struct plan *p, enum step_config cfg, int n, double *times, double *best,
                      double *run_ms, char *err, size_t err_len) {
    configure_measured(x, p, cfg);
    *run_ms = 1e300;
    for (int r = 0; r < n; r++) {
        double t0 = now_ms();
        int rc = run_steps(x, p, times, err, err_len);
        if (rc) return rc;
        double ms = now_ms() - t0;
        if (ms < *run_ms) *run_ms = ms;
        for (int si = 0; best && si < p->nsteps; si++)
            if (times[si] < best[si]) best[si] = times[si];
    }
    return 0;
}

/* Chooses the thread count of each measured step by timing whole runs of
 * the plan on this run's inputs: the measured steps all on all threads, all
 * on one, and each on its own best count (all threads where they took at
 * most 85% of its time on one). Whole runs, not one step again and again,
 * because a step's cost depends on its neighbours: a step reads its input
 * from the other cores' caches when the step before ran on other threads,
 * and the team's threads sleep, or lose their cores on a busy machine, over
 * a long stretch on one. So a plan of large tensors may do best with every
 * step on all threads and a small plan with every step on one. The fastest
 * of the three wins; one that uses more threads must be 3% faster than one
 * that uses fewer (within the noise, a thread left idle serves other
 * instances and requests). Each configuration runs twice in a row and keeps
 * its faster run: the first after the other configuration pays for data in
 * the other core's cache and sleeping workers (efficientnet_b0 on 2 threads
 * timed 9.0-9.4 ms so, 7.6-7.9 in steady runs, and lost to one thread). */
static int choose_threads(struct plan_exec *x, struct plan *p, double first_ms, char *err, size_t err_len) {
    if (first_ms > TIMING_BUDGET_MS) {
        log_debug("one run takes %.1f ms: the %d measured steps keep %d threads untimed", first_ms, p->nmeasured,
                  p->nthreads);
        return 0;
    }
    int ns = p->nsteps > 0 ? p->nsteps : 1;
    double *times = malloc((size_t)ns * 3 * sizeof *times);
    if (!times) return status_set(err, err_len, STATUS_NOMEM, "out of memory timing the plan's steps");
    double *best_all = times + ns, *best_one = times + 2 * ns;
    for (int si = 0; si < ns; si++) best_all[si] = best_one[si] = 1e300;
    int profile = x->profile; /* these runs are not the caller's */
    x->profile = 0;
    double all_ms = 0, one_ms = 0, chosen_ms = 0, t0 = now_ms();
    int rc = 0, nall = 0;
    for (int r = 0; r < TIMING_RUNS && !rc && (r == 0 || now_ms() - t0 + all_ms + one_ms <= TIMING_BUDGET_MS); r++) {
        double ms;
        rc = timed_runs(x, p, MEASURED_ALL, 2, times, best_all, &ms, err, err_len);
        if (!rc) all_ms = r ? (ms < all_ms ? ms : all_ms) : ms;
        if (!rc) rc = timed_runs(x, p, MEASURED_ONE, 2, times, best_one, &ms, err, err_len);
        if (!rc) one_ms = r ? (ms < one_ms ? ms : one_ms) : ms;
    }
    for (int si = 0; si < p->nsteps && !rc; si++) {
        struct pstep *s = &p->steps[si];
        if (!s->measured) continue;
        int nt = best_all[si] <= 0.85 * best_one[si] ? s->nthreads : 1;
        nall += nt > 1;
        atomic_store_explicit(&s->chosen, nt, memory_order_relaxed);
        log_debug("step %d '%s' (%s): %.1f us on %d threads, %.1f us on 1: runs on %d", si,
                  p->g->nodes[s->node].name, p->g->nodes[s->node].op_type, best_all[si] * 1e3, s->nthreads,
                  best_one[si] * 1e3, nt);
    }
    int mixed = nall > 0 && nall < p->nmeasured;
    if (!rc && mixed) {
        double left = TIMING_BUDGET_MS - (now_ms() - t0), run = all_ms < one_ms ? all_ms : one_ms;
        int n = left > run * TIMING_RUNS ? TIMING_RUNS : left > run ? (int)(left / run) : 1;
        rc = timed_runs(x, p, MEASURED_CHOSEN, n, times, NULL, &chosen_ms, err, err_len);
    }
    x->profile = profile;
    free(times);
    if (rc) return rc;
    enum step_config pick = MEASURED_ONE;
    double pick_ms = one_ms;
    if (mixed && chosen_ms < 0.97 * pick_ms) {
        pick = MEASURED_CHOSEN;
        pick_ms = chosen_ms;
    }
    if (all_ms < 0.97 * pick_ms) pick = MEASURED_ALL;
    for (int si = 0; si < p->nsteps && pick != MEASURED_CHOSEN; si++)
        if (p->steps[si].measured)
            atomic_store_explicit(&p->steps[si].chosen, pick == MEASURED_ALL ? p->steps[si].nthreads : 1,
                                  memory_order_relaxed);
    log_debug("measured steps all on %d threads: %.3f ms a run; all on 1: %.3f ms; %d of %d on %d: %.3f ms; "
              "runs %s", p->nthreads, all_ms, one_ms, nall, p->nmeasured, p->nthreads, mixed ? chosen_ms : 0.0,
              pick == MEASURED_ALL ? "all on all" : pick == MEASURED_ONE ? "all on 1" : "each on its own");
    /* Other executors read the choices after p->timed's release store
     * (run_host_measured), which publishes them. */
    atomic_store_explicit(&p->pick, 1 + (int)pick, memory_order_relaxed);
    bind_choices(x, p);
    /* The caller's outputs come from the configuration kept, as the next
     * runs' will: oneDNN's AVX2 GEMM rounds differently per thread count. */
    if (pick != (mixed ? MEASURED_CHOSEN : MEASURED_ONE)) {
        x->profile = 0;
        rc = run_steps(x, p, NULL, err, err_len);
        x->profile = profile;
    }
    return rc;
}

/* Logs how a plan's steps divide between one thread and all of them: at
 * info level under KILN_PROFILE, with the profile. */
static void log_threads(const struct plan *p, int profile) {
    if (!profile && !log_enabled(LOG_DEBUG)) return;
    int one = 0, timed_one = 0;
    for (int si = 0; si < p->nsteps; si++) {
        int nt;
        step_state(&p->steps[si], &nt);
        one += nt == 1;
        timed_one += p->steps[si].measured && nt == 1;
    }
    log_write(profile ? LOG_INFO : LOG_DEBUG, __func__,
              "plan threads: %d of %d steps on 1 thread, %d on %d; %d measured (%d of them on 1)", one, p->nsteps,
              p->nsteps - one, p->nthreads, p->nmeasured, timed_one);
}

/* Host plans with measured steps: the first executor to run the plan runs
 * it, then times it again on the same inputs to choose their thread counts
 * (choose_threads: a few milliseconds of a small model's first run, a few
 * whole runs of a large one's); another executor running the plan meanwhile
 * uses all the threads for them, and the choices once made. */
static int run_host_measured(struct plan_exec *x, struct plan *p, char *err, size_t err_len) {
    if (!x->choices_bound) {
        int st = atomic_load_explicit(&p->timed, memory_order_acquire);
        if (st == 2) {
            bind_choices(x, p);
        } else if (st == 0 && atomic_compare_exchange_strong(&p->timed, &st, 1)) {
            double t0 = now_ms();
            int rc = run_steps(x, p, NULL, err, err_len);
            if (!rc) rc = choose_threads(x, p, now_ms() - t0, err, err_len);
            atomic_store_explicit(&p->timed, rc ? 0 : 2, memory_order_release);
            if (rc) return rc;
            x->choices_bound = 1;
            log_threads(p, x->profile);
            return 0;
        }
    }
    return run_steps(x, p, NULL, err, err_len);
}

int plan_exec_run(struct plan_exec *x, struct plan *p, const struct tensor *inputs, struct tensor *outputs,
                  char *err, size_t err_len) {
    const struct graph *g = p->g;
    int rc;
    for (int o = 0; o < g->noutputs; o++) outputs[o].data = NULL;
    /* The last run's outputs were copied out: its strings can go. */
    op_strpool_reset(x->strings);
    if (x->bound != p || !x->arena || p->arena_size > x->arena_cap) {
        if ((rc = bind(x, p, err, err_len))) return rc;
    }
    const struct backend_i *be = x->be->iface;
    if (x->host) {
        for (int i = 0; i < p->nin_vals; i++) {
            int v = p->in_vals[i];
            x->tv[v].data = inputs[p->vals[v].input].data;
        }
    } else {
        /* FP16 plans: FP32 inputs are narrowed on the host into one staging
         * buffer (each input its own part, as copies may still be queued). */
        size_t need = 0;
        for (int i = 0; i < g->ninputs; i++) {
            const struct pval *pv = &p->vals[g->inputs[i]];
            if (pv->kind == PLAN_VALUE_ARENA && pv->ddt != pv->t.dtype) need += align_up(dev_nbytes(pv));
        }
        if (need > x->stage_cap) {
            free(x->stage);
            x->stage_cap = 0;
            if (!(x->stage = aligned_alloc(PLAN_ALIGN, need)))
                return status_set(err, err_len, STATUS_NOMEM, "out of memory for %zu bytes of FP16 inputs", need);
            x->stage_cap = need;
        }
        size_t so = 0;
        for (int i = 0; i < g->ninputs; i++) {
            const struct pval *pv = &p->vals[g->inputs[i]];
            size_t nb = dev_nbytes(pv);
            if (pv->kind != PLAN_VALUE_ARENA || !nb) continue;
            const void *src = inputs[i].data;
            if (pv->ddt != pv->t.dtype) {
                uint16_t *h = (uint16_t *)((char *)x->stage + so);
                const float *f = inputs[i].data;
                for (int64_t e = 0, ne = tensor_numel(&pv->t); e < ne; e++) h[e] = fp32_to_fp16(f[e]);
                src = h;
                so += align_up(nb);
            }
            if ((rc = be->copy_to_device(x->be, (char *)x->arena + pv->off, src, nb)))
                return status_set(err, err_len, rc, "copying input '%s' to the device failed", g->values[g->inputs[i]].name);
        }
    }
    if (err && err_len) err[0] = 0;
    if (x->profile) x->nruns++;
    /* Device plans without CPU fallback are captured on their second run
     * (the first may have tuned algorithms) and replayed from then on: the
     * arena, constants and scratch never move while the plan stays bound.
     * Capture may or may not execute; replaying right after is right in
     * both cases, since every step recomputes its outputs from its inputs. */
    if (!x->host && be->graph_begin && be->graph_end && be->graph_replay && !p->nfallback && !x->profile &&
        !x->graph_off && !x->graphs_disabled) {
        if (x->graph) {
            if ((rc = be->graph_replay(x->be, x->graph)))
                return status_set(err, err_len, rc, "replaying the captured device graph failed");
        } else if (x->graph_runs++ == 0) {
            if ((rc = run_steps(x, p, NULL, err, err_len))) return rc;
        } else if (be->graph_begin(x->be) != 0) {
            x->graph_off = 1;
            if ((rc = run_steps(x, p, NULL, err, err_len))) return rc;
        } else {
            rc = run_steps(x, p, NULL, err, err_len);
            void *gr = NULL;
            int erc = be->graph_end(x->be, &gr);
            if (rc || erc || !gr) {
                if (gr && be->graph_free) be->graph_free(x->be, gr);
                x->graph_off = 1;
                if (rc) return rc;
                log_debug("device graph capture failed; running node by node");
                if ((rc = run_steps(x, p, NULL, err, err_len))) return rc;
            } else {
                x->graph = gr;
                if ((rc = be->graph_replay(x->be, x->graph)))
                    return status_set(err, err_len, rc, "replaying the captured device graph failed");
            }
        }
    } else if ((rc = x->host && p->nmeasured ? run_host_measured(x, p, err, err_len)
                                             : run_steps(x, p, NULL, err, err_len))) {
        return rc;
    }
    if (!x->host && be->synchronize && (rc = be->synchronize(x->be)))
        return status_set(err, err_len, rc, "the device failed while running the model");
    for (int o = 0; o < g->noutputs; o++)
        if ((rc = copy_output(x, p, o, &outputs[o], inputs, err, err_len))) goto fail;
    if (!x->host && be->synchronize && (rc = be->synchronize(x->be))) {
        status_set(err, err_len, rc, "copying outputs from the device failed");
        goto fail;
    }
    for (int o = 0; o < g->noutputs; o++) {
        const struct pval *pv = &p->vals[g->outputs[o]];
        if (!x->host && pv->kind == PLAN_VALUE_ARENA && pv->ddt != pv->t.dtype)
            widen_in_place(outputs[o].data, (size_t)tensor_numel(&pv->t));
    }
    return 0;
fail:
    for (int o = 0; o < g->noutputs; o++) {
        free(outputs[o].data);
        outputs[o].data = NULL;
    }
    return rc;
}

/* ---- the plan cache ---------------------------------------------------------------- */

/* Hashes of recently evicted plans: a build of one of them is a rebuild. */
#define EVICTED_RING 64

struct plan_cache {
    pthread_mutex_t mu;
    int max;
    int limit; /* max grows up to this when plans are rebuilt (plan_cache_set_limit) */
    int n;
    struct plan **plans;
    atomic_ullong tick;
    uint64_t builds, evictions, rebuilds;
    uint64_t evicted[EVICTED_RING];
    int nevicted, rebuilt_since_growth;
    struct plan_devstore *ds; /* device caches: the graph's constants on the device */
    int fp16;                 /* device plans store FP32 values as FP16 */
};

struct plan_cache *plan_cache_create(int max_plans) {
    struct plan_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->max = max_plans > 0 ? max_plans : 16;
    c->limit = c->max;
    c->plans = calloc((size_t)c->max, sizeof *c->plans);
    if (!c->plans || pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c->plans);
        free(c);
        return NULL;
    }
    atomic_init(&c->tick, 0);
    return c;
}

void plan_cache_free(struct plan_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) plan_release(c->plans[i]);
    devstore_free(c->ds); /* after the plans, which borrow from it */
    pthread_mutex_destroy(&c->mu);
    free(c->plans);
    free(c);
}

static struct plan *cache_find(struct plan_cache *c, uint64_t h, const struct tensor *inputs, int ninputs,
                               int nthreads) {
    for (int i = 0; i < c->n; i++) {
        struct plan *p = c->plans[i];
        if (p->hash == h && p->nthreads == nthreads && plan_matches(p, inputs, ninputs)) {
            plan_retain(p);
            atomic_store(&p->last_used, atomic_fetch_add(&c->tick, 1) + 1);
            return p;
        }
    }
    return NULL;
}

/* Timing a new plan's thread counts costs a few of its runs (up to
 * TIMING_BUDGET_MS), once per input shape: a model fed many shapes (text of
 * every length) would pay it over and over as its plans are evicted and
 * rebuilt. Once this many of the cache's plans were timed, a new plan takes
 * what most of them kept for their measured steps, all on one thread or all
 * on all, untimed (lock held). */
#define TIMED_PLANS_ENOUGH 4

static void inherit_threads(struct plan_cache *c, struct plan *np) {
    if (!np->nmeasured) return;
    int n = 0, one = 0, all = 0;
    for (int i = 0; i < c->n; i++) {
        int pk = atomic_load_explicit(&c->plans[i]->pick, memory_order_relaxed);
        n += pk > 0;
        one += pk == 1 + MEASURED_ONE;
        all += pk == 1 + MEASURED_ALL;
    }
    if (n < TIMED_PLANS_ENOUGH || one == all) return;
    for (int si = 0; si < np->nsteps; si++)
        if (np->steps[si].measured)
            atomic_store_explicit(&np->steps[si].chosen, one > all ? 1 : np->steps[si].nthreads, memory_order_relaxed);
    atomic_store_explicit(&np->pick, -1, memory_order_relaxed);
    atomic_store_explicit(&np->timed, 2, memory_order_release);
    log_debug("plan threads: %d of the model's %d timed plans keep their measured steps on %s: a new plan does, "
              "untimed", one > all ? one : all, n, one > all ? "1 thread" : "all threads");
}

/* Raises the bound to max_plans (lock held): 0 or STATUS_NOMEM. */
static int cache_resize(struct plan_cache *c, int max_plans) {
    struct plan **p = realloc(c->plans, (size_t)max_plans * sizeof *p);
    if (!p) return STATUS_NOMEM;
    c->plans = p;
    c->max = max_plans;
    if (c->limit < max_plans) c->limit = max_plans;
    return 0;
}

/* A model fed more input shapes than the cache holds (text of every length,
 * unpadded) evicts plans it soon needs again and rebuilds them on every
 * other request: BERT fed 121 lengths served a third fewer requests a second
 * for it. When half as many rebuilds as the cache holds plans happened since
 * it last grew, it doubles, up to its limit (lock held). */
static void cache_note_rebuild(struct plan_cache *c, uint64_t h) {
    int n = c->nevicted < EVICTED_RING ? c->nevicted : EVICTED_RING;
    int hit = 0;
    for (int i = 0; i < n && !hit; i++) hit = c->evicted[i] == h;
    if (!hit) return;
    c->rebuilds++;
    if (++c->rebuilt_since_growth < (c->max + 1) / 2 || c->max >= c->limit) return;
    int want = c->max * 2 < c->limit ? c->max * 2 : c->limit, was = c->max;
    if (cache_resize(c, want)) return; /* stays as it is: rebuilding is slower, not wrong */
    log_info("plan cache: %d plans rebuilt after eviction since it held %d; it holds %d now (at most %d)",
             c->rebuilt_since_growth, was, want, c->limit);
    c->rebuilt_since_growth = 0;
}

int plan_cache_get(struct plan_cache *c, const struct graph *g, const struct tensor *inputs, uint64_t bind_values,
                   struct backend *be, int nthreads, struct plan **out, int *built, char *err, size_t err_len) {
    uint64_t h = plan_signature_hash(inputs, g->ninputs, bind_values);
    if (nthreads < 1) nthreads = 1;
    if (built) *built = 0;
    pthread_mutex_lock(&c->mu);
    struct plan *p = cache_find(c, h, inputs, g->ninputs, nthreads);
    pthread_mutex_unlock(&c->mu);
    if (p) {
        *out = p;
        return 0;
    }
    struct plan *np;
    if (be && !be->host_memory && !c->ds && !(c->ds = devstore_create(be, g->nvalues)))
        return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    int rc = plan_build_ds(g, inputs, bind_values, be, nthreads, c->fp16, be && !be->host_memory ? c->ds : NULL, &np,
                           err, err_len);
    if (rc) return rc;
    pthread_mutex_lock(&c->mu);
    c->builds++;
    p = cache_find(c, h, inputs, g->ninputs, nthreads); /* another thread may have built it meanwhile */
    if (p) {
        pthread_mutex_unlock(&c->mu);
        plan_release(np);
        *out = p;
        return 0;
    }
    cache_note_rebuild(c, h);
    struct plan *evicted = NULL;
    if (c->n == c->max) {
        int lru = 0;
        for (int i = 1; i < c->n; i++)
            if (atomic_load(&c->plans[i]->last_used) < atomic_load(&c->plans[lru]->last_used)) lru = i;
        evicted = c->plans[lru];
        c->plans[lru] = c->plans[--c->n];
        c->evictions++;
        c->evicted[c->nevicted++ % EVICTED_RING] = evicted->hash;
    }
    inherit_threads(c, np);
    atomic_store(&np->last_used, atomic_fetch_add(&c->tick, 1) + 1);
    plan_retain(np); /* the cache's reference */
    c->plans[c->n++] = np;
    pthread_mutex_unlock(&c->mu);
    plan_release(evicted); /* a run still holding it keeps it alive */
    if (built) *built = 1;
    *out = np;
    return 0;
}

void plan_cache_set_fp16(struct plan_cache *c, int on) { c->fp16 = on; }

int plan_cache_grow(struct plan_cache *c, int max_plans) {
    pthread_mutex_lock(&c->mu);
    int rc = max_plans > c->max ? cache_resize(c, max_plans) : 0;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void plan_cache_set_limit(struct plan_cache *c, int limit) {
    pthread_mutex_lock(&c->mu);
    c->limit = limit > c->max ? limit : c->max;
    pthread_mutex_unlock(&c->mu);
}

void plan_cache_touch(struct plan_cache *c, struct plan *p) {
    atomic_store(&p->last_used, atomic_fetch_add(&c->tick, 1) + 1);
}

/* The counters, read under the lock. */
static uint64_t cache_read(struct plan_cache *c, const uint64_t *field) {
    pthread_mutex_lock(&c->mu);
    uint64_t n = *field;
    pthread_mutex_unlock(&c->mu);
    return n;
}

int plan_cache_size(struct plan_cache *c) {
    pthread_mutex_lock(&c->mu);
    int n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

int plan_cache_max(struct plan_cache *c) {
    pthread_mutex_lock(&c->mu);
    int n = c->max;
    pthread_mutex_unlock(&c->mu);
    return n;
}

uint64_t plan_cache_builds(struct plan_cache *c) { return cache_read(c, &c->builds); }
uint64_t plan_cache_evictions(struct plan_cache *c) { return cache_read(c, &c->evictions); }
uint64_t plan_cache_rebuilds(struct plan_cache *c) { return cache_read(c, &c->rebuilds); }
