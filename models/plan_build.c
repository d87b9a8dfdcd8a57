/* plan_build.c - building a plan: shape inference, plan-time folding, kernel
 * preparation and memory planning in one arena (see models/plan.h). */
#include "models/plan_impl.h"

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

struct plan_devstore *plan_devstore_create(struct backend *be, int n) {
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

void plan_devstore_free(struct plan_devstore *ds) {
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

int plan_build(const struct graph *g, const struct tensor *inputs, uint64_t bind_values, struct backend *be,
               int nthreads, struct plan **out, char *err, size_t err_len) {
    return plan_build_ds(g, inputs, bind_values, 0, be, nthreads, 0, NULL, out, err, err_len);
}

int plan_build_sub(const struct graph *g, const struct tensor *inputs, uint64_t bind_values, uint64_t ref_values,
                   int nthreads, struct plan **out, char *err, size_t err_len) {
    return plan_build_ds(g, inputs, bind_values, ref_values & bind_values, NULL, nthreads, 0, NULL, out, err, err_len);
}

int plan_build_opts(const struct graph *g, const struct tensor *inputs, uint64_t bind_values, struct backend *be,
                    int nthreads, int fp16, struct plan **out, char *err, size_t err_len) {
    return plan_build_ds(g, inputs, bind_values, 0, be, nthreads, fp16, NULL, out, err, err_len);
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
 * plans), and those in bind_values are copied in as constants (those in
 * ref_values taken by reference: plan_build_sub). Sets the signature and its
 * hash. */
static int values_init(struct plan *p, const struct tensor *inputs, uint64_t bind_values, uint64_t ref_values,
                       char *err, size_t err_len) {
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
        if (i >= 64 || !(bind_values >> i & 1)) continue;
        const int by_ref = (ref_values >> i & 1) && inputs[i].data && pv->t.dtype != DT_STRING;
        size_t nb = tensor_nbytes(&pv->t);
        if (by_ref) {
            pv->t.data = inputs[i].data; /* the enclosing plan's constant, not ours to free */
        } else if (pv->t.dtype == DT_STRING) {
            if (tensor_strings_pack(&pv->t, tensor_strs(&inputs[i]))) return build_nomem(err, err_len);
        } else {
            pv->t.data = malloc(nb ? nb : 1);
            if (!pv->t.data) return build_nomem(err, err_len);
            if (nb) memcpy(pv->t.data, inputs[i].data, nb);
        }
        pv->owned = pv->from_client = !by_ref;
        pv->kind = PLAN_VALUE_CONST;
        p->sig[i].data = pv->t.data;
        p->bind |= (uint64_t)1 << i;
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
    int from_client = 0;
    for (int k = 0; k < n->nin; k++)
        if (n->in[k] >= 0 && p->vals[n->in[k]].from_client) from_client = 1;
    struct tensor res[OP_MAX_IO];
    int rc = eval_node(n, (const struct tensor *const *)c->in, n->nin, res, n->nout,
                       from_client ? PLAN_CLIENT_FOLD_MAX_BYTES : EVAL_FOLD_MAX_BYTES, err, err_len);
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
            p->vals[v].from_client = (unsigned char)from_client;
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

/* A view: output 0 is input 0's bytes under another shape (an alias op, a
 * Cast to the datatype it already has, or a Transpose the layout planner
 * found to move nothing: kiln_layout, models/passes_layout.c), when nothing
 * reads its other outputs. 1 if n became one. */
static int make_view(struct build *b, const struct graph_node *n) {
    struct plan *p = b->p;
    int v0 = n->nout > 0 ? n->out[0] : -1, i0 = n->nin > 0 ? n->in[0] : -1;
    int same_cast = strcmp(n->op_type, "Cast") == 0 && !n->domain[0] && v0 >= 0 && i0 >= 0 &&
                    p->vals[v0].t.dtype == p->vals[i0].t.dtype;
    int same_bytes = strcmp(n->op_type, "Transpose") == 0 && !n->domain[0] &&
                     node_attr_int(n, "kiln_layout", 0) != 0;
    if (!((n->op->flags & OP_ALIAS_INPUT0) || same_cast || same_bytes) || v0 < 0 || i0 < 0 ||
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

/* A Conv that sums a residual Z (input 3, models/passes_layout.c's
 * passes_fuse_residual) writes its Y over Z's bytes when this step is the
 * last to read them: oneDNN's sum post-op adds the products to what the
 * destination holds, so the kernel then neither copies Z nor reads it
 * twice. Z must be a step's bytes in the arena (no input, constant or
 * graph output) of Y's size, not X's, W's or B's, and read by no later
 * step; Y and its views move to Z's root. Host plans. */
static void sum_in_place(struct plan *p) {
    const struct graph *g = p->g;
    if (!p->host) return;
    for (int si = 0; si < p->nsteps; si++) {
        const struct graph_node *n = &g->nodes[p->steps[si].node];
        if (strcmp(n->op_type, "Conv") || n->domain[0] || n->nin < 4 || n->in[3] < 0 || n->nout != 1 || n->out[0] < 0)
            continue;
        const int y = n->out[0], zr = p->vals[n->in[3]].root;
        const struct pval *pz = &p->vals[zr], *py = &p->vals[y];
        if (py->kind != PLAN_VALUE_ARENA || py->root != y || pz->kind != PLAN_VALUE_ARENA || !pz->is_step_out ||
            pz->t.dtype != py->t.dtype || tensor_nbytes(&pz->t) != tensor_nbytes(&py->t))
            continue;
        int ok = 1;
        for (int k = 0; k < 3 && ok; k++)
            if (n->in[k] >= 0 && p->vals[n->in[k]].root == zr) ok = 0;
        for (int o = 0; o < g->noutputs && ok; o++)
            if (p->vals[g->outputs[o]].root == zr) ok = 0;
        for (int sj = si + 1; sj < p->nsteps && ok; sj++) {
            const struct graph_node *m = &g->nodes[p->steps[sj].node];
            for (int k = 0; k < m->nin && ok; k++)
                if (m->in[k] >= 0 && p->vals[m->in[k]].root == zr) ok = 0;
        }
        if (!ok) continue;
        for (int v = 0; v < p->nvals; v++)
            if (p->vals[v].root == y && p->vals[v].kind == PLAN_VALUE_ARENA) p->vals[v].root = zr;
        p->nsum_in_place++;
    }
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
    plan_threads_decide(p, s, mode);
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
    enum step_threads_mode mode = plan_threads_mode();
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
    log_debug("plan for %s%s: %d steps, %d nodes folded, %d activations applied in place, %d residual sums in place, "
              "%d views, arena %zu bytes%s%s",
              s, g->ninputs > 1 ? ",..." : "", p->nsteps, p->nfolded, p->npost_act, p->nsum_in_place,
              g->nnodes - p->nsteps - p->nfolded - p->npost_act, p->arena_size,
              p->nfallback ? " (some nodes on the CPU)" : "", p->fp16 ? ", FP16" : "");
}

int plan_build_ds(const struct graph *g, const struct tensor *inputs, uint64_t bind_values, uint64_t ref_values,
                  struct backend *be, int nthreads, int fp16, struct plan_devstore *ds, struct plan **out,
                  char *err, size_t err_len) {
    *out = NULL;
    struct plan *p = plan_alloc(g, be, nthreads);
    if (!p) return build_nomem(err, err_len);
    struct build b = {.g = g, .p = p, .err = err, .err_len = err_len};
    int rc;
    if ((rc = values_init(p, inputs, bind_values, ref_values, err, err_len)) || (rc = count_reads(&b)) ||
        (rc = walk_nodes(&b)) || (rc = drop_unread_steps(p, err, err_len)))
        goto fail;
    sum_in_place(p);
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
