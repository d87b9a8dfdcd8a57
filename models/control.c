/* control.c - If, Loop and Scan: subgraphs run by plans of the engine's own
 * planner (models/control.h). */
#include "models/control.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/backend.h"
#include "models/plan.h"

/* Plans kept per subgraph (one per shape signature of its inputs). */
#define SUB_MAX_PLANS 8
/* Values from the enclosing graph that are constants when it is planned are
 * bound into the subgraph's plans (so that shapes they decide fold): copied
 * up to this many elements, larger ones (weights) by reference
 * (plan_build_sub), so that kernels prepare them once as constants. */
#define SUB_BIND_MAX_ELEMS 4096
/* Plan-time iterations of a Loop whose loop-carried shapes keep changing. */
#define LOOP_MAX_SIMULATED 65536

/* ---- a subgraph run by the engine ------------------------------------------- */

struct sub {
    const struct graph *g;
    int nthreads;
    uint64_t bind;       /* inputs whose values are part of the plans' signatures */
    uint64_t ref;        /* of those, the enclosing plan's large constants, bound by reference */
    int may_bind_iter;   /* Loop bodies: input 0 (the iteration) may decide shapes */
    struct backend *be;  /* made on the first run */
    struct plan_exec *x;
    struct plan *plans[SUB_MAX_PLANS];
    int nplans, next;
    struct tensor *in;   /* g->ninputs descriptors, filled by the op before each plan or run */
    struct tensor *out;  /* g->noutputs results of the last run (data owned, NULL once taken) */
    /* The op's state is the plan's, and a plan is shared by every execution
     * context of its model: two instances running it at once would share
     * in, out, the executor and (Loop, Scan) the iteration state. A run
     * holds this for its whole length. */
    pthread_mutex_t run_mu;
};

static void sub_clear_outputs(struct sub *s) {
    for (int o = 0; s->out && o < s->g->noutputs; o++) {
        tensor_free_data(&s->out[o]);
        s->out[o].data = NULL;
    }
}

static void sub_free(struct sub *s) {
    if (!s->g) return;
    sub_clear_outputs(s);
    for (int i = 0; i < s->nplans; i++) plan_release(s->plans[i]);
    plan_exec_free(s->x);
    backend_free(s->be);
    free(s->in);
    free(s->out);
    pthread_mutex_destroy(&s->run_mu);
    memset(s, 0, sizeof *s);
}

static int sub_init(struct op_call *c, struct sub *s, const struct graph *g, const char *what) {
    memset(s, 0, sizeof *s);
    if (!g) return op_error(c, "attribute '%s' (a graph) is missing", what);
    pthread_mutex_init(&s->run_mu, NULL);
    s->g = g;
    s->nthreads = c->nthreads;
    s->in = calloc((size_t)(g->ninputs ? g->ninputs : 1), sizeof *s->in);
    s->out = calloc((size_t)(g->noutputs ? g->noutputs : 1), sizeof *s->out);
    if (!s->in || !s->out) {
        sub_free(s);
        return op_error(c, "out of memory");
    }
    return 0;
}

/* Fills the subgraph's captured inputs from the node's inputs. When the
 * enclosing graph is being planned (planning), those that are small
 * constants of its plan are bound; at run time every input has data. */
static void sub_captures(struct sub *s, const struct op_call *c, int planning) {
    const struct graph *g = s->g;
    int nf = graph_nformal(g);
    for (int j = 0; j < g->ncaptured; j++) {
        int k = g->capture_in[j], i = nf + j;
        const struct tensor *t = k < c->nin ? c->in[k] : NULL;
        if (!t) continue;
        s->in[i] = *t;
        if (planning && t->data && t->dtype != DT_STRING && i < 64) {
            s->bind |= (uint64_t)1 << i;
            if (tensor_numel(t) > SUB_BIND_MAX_ELEMS) s->ref |= (uint64_t)1 << i;
        }
    }
}

/* The plan for the current input descriptors: cached, or built. */
static int sub_plan(struct op_call *c, struct sub *s, struct plan **out) {
    const struct graph *g = s->g;
    for (int i = 0; i < s->nplans; i++)
        if (plan_matches(s->plans[i], s->in, g->ninputs)) {
            *out = s->plans[i];
            return 0;
        }
    char err[512] = "";
    struct plan *p = NULL;
    int rc = plan_build_sub(g, s->in, s->bind, s->ref, s->nthreads, &p, err, sizeof err);
    if (rc && s->may_bind_iter && !(s->bind & 1)) {
        /* The iteration number decides a shape in the body: plans per value. */
        char err2[512];
        if (plan_build_sub(g, s->in, s->bind | 1, s->ref, s->nthreads, &p, err2, sizeof err2) == 0) {
            s->bind |= 1;
            rc = 0;
        }
    }
    if (rc) {
        /* A shape that depends on computed values keeps its status: the
         * enclosing model then runs node by node (models/valrun.h). */
        int e = op_error(c, "subgraph '%s': %s", g->name ? g->name : "", err);
        return rc == STATUS_DATA_DEPENDENT ? rc : e;
    }
    if (s->nplans == SUB_MAX_PLANS) {
        plan_release(s->plans[s->next]);
        s->plans[s->next] = p;
        s->next = (s->next + 1) % SUB_MAX_PLANS;
    } else {
        s->plans[s->nplans++] = p;
    }
    *out = p;
    return 0;
}

/* Shape and datatype of subgraph output o in plan p (no data). */
static struct tensor sub_out_shape(const struct sub *s, const struct plan *p, int o) {
    struct tensor t;
    memset(&t, 0, sizeof t);
    plan_value_info(p, s->g->outputs[o], &t, NULL, NULL, NULL, NULL);
    t.data = NULL;
    return t;
}

/* Runs the subgraph on s->in; its outputs land in s->out. */
static int sub_run(struct op_call *c, struct sub *s) {
    sub_clear_outputs(s);
    if (!s->x) {
        struct backend_params bp = {.device = -1, .nthreads = s->nthreads};
        s->be = backend_cpu_create(&bp);
        s->x = s->be ? plan_exec_create(s->be, s->nthreads) : NULL;
        if (!s->x) return op_error(c, "out of memory for the subgraph's executor");
    }
    struct plan *p;
    int rc = sub_plan(c, s, &p);
    if (rc) return rc;
    char err[512] = "";
    struct tensor none;
    rc = plan_exec_run(s->x, p, s->g->ninputs ? s->in : &none, s->out, err, sizeof err);
    if (rc) return op_error(c, "subgraph '%s': %s", s->g->name ? s->g->name : "", err);
    return 0;
}

/* Runs fn, a Loop's or Scan's whole run, holding its body's run_mu: one
 * run at a time per plan. */
static int sub_locked(struct op_call *c, struct sub *s, int (*fn)(struct op_call *c)) {
    pthread_mutex_lock(&s->run_mu);
    int rc = fn(c);
    pthread_mutex_unlock(&s->run_mu);
    return rc;
}

static int same_shape(const struct tensor *a, const struct tensor *b) {
    return a->dtype == b->dtype && tensor_same_shape(a, b);
}

static void set_shape(struct tensor *dst, const struct tensor *src) {
    dst->dtype = src->dtype;
    dst->ndim = src->ndim;
    memcpy(dst->dims, src->dims, sizeof dst->dims);
}

/* Copies a subgraph result into the node's output, whose shape the plan fixed. */
static int copy_result(struct op_call *c, int o, const struct tensor *r, const char *what) {
    struct tensor *dst = c->out[o];
    if (!dst) return 0;
    if (!same_shape(dst, r)) {
        char a[128], b[128];
        return op_error(c, "%s gives output %d of shape %s %s at run time; the plan has %s %s", what, o,
                        tensor_shape_str(r, a, sizeof a), dtype_name(r->dtype), tensor_shape_str(dst, b, sizeof b),
                        dtype_name(dst->dtype));
    }
    size_t nb = tensor_nbytes(r);
    if (nb) memcpy(dst->data, r->data, nb);
    return 0;
}

static int no_strings(struct op_call *c, const struct tensor *t) {
    if (t->dtype == DT_STRING) return op_error(c, "string values in control flow are not supported");
    return 0;
}

static int truthy(const struct tensor *t) { return t && t->data && tensor_numel(t) > 0 && op_int_at(t, 0) != 0; }

/* ---- If ----------------------------------------------------------------------- */

/* Lanes per branch: the instances that share a plan run its If at once,
 * each in a lane of its own (a branch's executor, inputs and outputs, and
 * plans built by that lane); past IF_LANES runs at once wait for lane 0. */
#define IF_LANES 8

struct if_state {
    struct sub br[2];                    /* then, else: lane 0, planned when the enclosing plan is */
    struct sub more[2][IF_LANES - 1];    /* lanes 1.., made on first use (g NULL before) */
    uint8_t busy[2][IF_LANES];
    pthread_mutex_t lanes_mu;            /* busy and making lanes */
    int lanes_init;
};

static void if_release(void *state) {
    struct if_state *st = state;
    if (!st) return;
    for (int b = 0; b < 2; b++) {
        sub_free(&st->br[b]);
        for (int l = 0; l < IF_LANES - 1; l++) sub_free(&st->more[b][l]);
    }
    if (st->lanes_init) pthread_mutex_destroy(&st->lanes_mu);
    free(st);
}

/* A free lane of branch b (marked busy), made on first use with lane 0's
 * graph and bound inputs; lane 0 (busy or not) when every lane is busy or
 * a lane cannot be made. Returns the lane's index. */
static int if_lane_take(struct op_call *c, struct if_state *st, int b) {
    static const char *const names[2] = {"then_branch", "else_branch"};
    pthread_mutex_lock(&st->lanes_mu);
    int l = 0;
    while (l < IF_LANES && st->busy[b][l]) l++;
    if (l == IF_LANES) l = 0;
    if (l > 0 && !st->more[b][l - 1].g) {
        struct sub *s = &st->more[b][l - 1];
        if (sub_init(c, s, st->br[b].g, names[b])) l = 0;
        else s->bind = st->br[b].bind, s->ref = st->br[b].ref;
    }
    st->busy[b][l] = 1;
    pthread_mutex_unlock(&st->lanes_mu);
    return l;
}

static void if_lane_give(struct if_state *st, int b, int l) {
    pthread_mutex_lock(&st->lanes_mu);
    st->busy[b][l] = 0;
    pthread_mutex_unlock(&st->lanes_mu);
}

/* Builds the branches' plans (only the taken one when the condition is
 * known) and, when shapes is non-NULL, gives the node's output shapes. */
static int if_plan(struct op_call *c, struct if_state *st, int set_shapes) {
    const struct graph_node *n = c->node;
    static const char *const names[2] = {"then_branch", "else_branch"};
    const struct tensor *cond = c->in[0];
    if (!cond) return op_error(c, "the condition is missing");
    struct plan *p[2] = {NULL, NULL};
    int rc;
    for (int b = 0; b < 2; b++) {
        if ((rc = sub_init(c, &st->br[b], node_attr_graph(n, names[b]), names[b]))) return rc;
        if (st->br[b].g->noutputs != n->nout)
            return op_error(c, "%s has %d outputs; the node has %d", names[b], st->br[b].g->noutputs, n->nout);
        sub_captures(&st->br[b], c, 1);
        if (cond->data && truthy(cond) != !b) continue;
        if ((rc = sub_plan(c, &st->br[b], &p[b]))) return rc;
    }
    if (!set_shapes) return 0;
    for (int o = 0; o < n->nout; o++) {
        struct tensor t[2];
        for (int b = 0; b < 2; b++)
            if (p[b]) t[b] = sub_out_shape(&st->br[b], p[b], o);
        if (p[0] && p[1] && !same_shape(&t[0], &t[1])) {
            char a[128], bb[128];
            op_error(c, "output %d is %s %s in then_branch and %s %s in else_branch, and the condition is "
                        "computed at run time", o, tensor_shape_str(&t[0], a, sizeof a), dtype_name(t[0].dtype),
                     tensor_shape_str(&t[1], bb, sizeof bb), dtype_name(t[1].dtype));
            return STATUS_DATA_DEPENDENT;
        }
        const struct tensor *r = p[0] ? &t[0] : &t[1];
        if ((rc = no_strings(c, r))) return rc;
        if (c->out[o]) set_shape(c->out[o], r);
    }
    return 0;
}

static int if_infer(struct op_call *c) {
    struct if_state *st = calloc(1, sizeof *st);
    if (!st) return op_error(c, "out of memory");
    int rc = if_plan(c, st, 1);
    if_release(st);
    return rc;
}

static int if_prepare(struct op_call *c, void **state, size_t *scratch) {
    (void)scratch;
    struct if_state *st = op_params_alloc(c, sizeof *st);
    if (!st) return STATUS_NOMEM;
    pthread_mutex_init(&st->lanes_mu, NULL);
    st->lanes_init = 1;
    int rc = if_plan(c, st, 0);
    if (rc) {
        if_release(st);
        return rc;
    }
    *state = st;
    return 0;
}

static int if_run(struct op_call *c) {
    struct if_state *st = c->state;
    int b = truthy(c->in[0]) ? 0 : 1;
    int l = if_lane_take(c, st, b);
    struct sub *s = l ? &st->more[b][l - 1] : &st->br[b];
    pthread_mutex_lock(&s->run_mu);
    sub_captures(s, c, 0);
    int rc = sub_run(c, s);
    for (int o = 0; !rc && o < c->nout; o++)
        rc = copy_result(c, o, &s->out[o], b ? "else_branch" : "then_branch");
    sub_clear_outputs(s);
    pthread_mutex_unlock(&s->run_mu);
    if_lane_give(st, b, l);
    return rc;
}

/* ---- Loop ---------------------------------------------------------------------- */

struct loop_state {
    struct sub body;
    int n, k;      /* loop-carried values, scan outputs */
    int64_t iter;  /* the body's input 0 */
    uint8_t cond;  /* the body's input 1: always true when the body runs */
};

static void loop_release(void *state) {
    struct loop_state *st = state;
    if (!st) return;
    sub_free(&st->body);
    free(st);
}

/* The body, its counts checked against the node, inputs 0 and 1 set up. */
static int loop_init(struct op_call *c, struct loop_state *st) {
    const struct graph_node *n = c->node;
    int rc = sub_init(c, &st->body, node_attr_graph(n, "body"), "body");
    if (rc) return rc;
    const struct graph *g = st->body.g;
    st->n = graph_nformal(g) - 2;
    st->k = g->noutputs - 1 - st->n;
    if (st->n < 0 || st->k < 0 || c->nin < 2 + st->n || c->nout != st->n + st->k)
        return op_error(c, "the body takes %d inputs and gives %d outputs, which does not fit a node of %d outputs",
                        graph_nformal(g), g->noutputs, c->nout);
    struct sub *s = &st->body;
    s->may_bind_iter = 1;
    st->cond = 1;
    s->in[0] = (struct tensor){.dtype = DT_INT64, .ndim = 0, .data = &st->iter};
    s->in[1] = (struct tensor){.dtype = DT_BOOL, .ndim = 0, .data = &st->cond};
    s->bind |= 2; /* the body only runs while its condition is true */
    sub_captures(s, c, 1);
    for (int j = 0; j < st->n; j++) {
        if (!c->in[2 + j]) return op_error(c, "loop-carried input %d is missing", j);
        if ((rc = no_strings(c, c->in[2 + j]))) return rc;
    }
    return 0;
}

/* Plans the body for the shapes its iterations will see and, if out is
 * non-NULL, gives the node's output shapes. The trip count is known when M
 * and the condition are constants and the body's condition is a constant
 * of its plan; otherwise the loop-carried values must keep their shapes and
 * there may be no scan outputs. */
static int loop_plan(struct op_call *c, struct loop_state *st, int set_shapes) {
    struct sub *s = &st->body;
    const struct graph *g = s->g;
    int n = st->n, k = st->k, rc;
    const struct tensor *M = c->in[0], *cond = c->in[1];
    int known = (!M || M->data) && (!cond || cond->data);
    int64_t m = M && M->data ? op_int_at(M, 0) : -1;
    int start = !cond || truthy(cond);
    struct tensor cur[OP_MAX_IO], slice[OP_MAX_IO];
    for (int j = 0; j < n; j++) {
        cur[j] = *c->in[2 + j];
        cur[j].data = NULL;
    }
    int64_t trips = -1;
    for (int64_t i = 0;; i++) {
        if (i >= LOOP_MAX_SIMULATED)
            return op_error(c, "the loop-carried values change shape over more than %d iterations", LOOP_MAX_SIMULATED);
        st->iter = i;
        for (int j = 0; j < n; j++) s->in[2 + j] = cur[j];
        struct plan *p;
        if ((rc = sub_plan(c, s, &p))) return rc;
        struct tensor co = sub_out_shape(s, p, 0), outs[OP_MAX_IO];
        for (int j = 0; j < n + k; j++) outs[j] = sub_out_shape(s, p, 1 + j);
        if (i == 0) {
            struct tensor cv;
            enum plan_value_kind kind = plan_value_info(p, g->outputs[0], &cv, NULL, NULL, NULL, NULL);
            if (!known) trips = -1;
            else if (!start || m == 0) trips = 0;
            else if (kind == PLAN_VALUE_CONST && cv.data) {
                if (truthy(&cv) && !M)
                    return op_error(c, "the loop has no trip count and its condition is always true: it never ends");
                trips = truthy(&cv) ? m : 1;
            }
            if (co.dtype != DT_BOOL || tensor_numel(&co) != 1)
                return op_error(c, "the body's condition output is not one bool");
            for (int j = 0; j < k; j++) {
                slice[j] = outs[n + j];
                if ((rc = no_strings(c, &slice[j]))) return rc;
                if (slice[j].ndim >= TENSOR_MAX_DIMS) return op_error(c, "scan output %d has too high a rank", j);
            }
        } else {
            for (int j = 0; j < k; j++)
                if (!same_shape(&slice[j], &outs[n + j]))
                    return op_error(c, "scan output %d changes shape between iterations", j);
        }
        int same = 1;
        for (int j = 0; j < n; j++) {
            if (outs[j].dtype != cur[j].dtype)
                return op_error(c, "loop-carried value %d is %s in and %s out of the body", j, dtype_name(cur[j].dtype),
                                dtype_name(outs[j].dtype));
            if (!tensor_same_shape(&outs[j], &cur[j])) same = 0;
        }
        if (trips < 0) {
            if (k > 0)
                return op_error(c, "the number of iterations is only known at run time, and the loop has scan outputs "
                                "whose shape depends on it; kiln needs the trip count and condition known when the "
                                "model is planned");
            if (!same)
                return op_error(c, "loop-carried values change shape between iterations and the number of iterations "
                                "is only known at run time");
            break;
        }
        if (trips == 0) break;
        for (int j = 0; j < n; j++) cur[j] = outs[j];
        if (i + 1 >= trips || (same && !(s->bind & 1))) break;
    }
    if (!set_shapes) return 0;
    for (int j = 0; j < n; j++)
        if (c->out[j]) set_shape(c->out[j], &cur[j]);
    for (int j = 0; j < k; j++) {
        struct tensor *o = c->out[n + j];
        if (!o) continue;
        o->dtype = slice[j].dtype;
        o->ndim = slice[j].ndim + 1;
        o->dims[0] = trips;
        for (int d = 0; d < slice[j].ndim; d++) o->dims[d + 1] = slice[j].dims[d];
    }
    return 0;
}

static int loop_infer(struct op_call *c) {
    struct loop_state st;
    memset(&st, 0, sizeof st);
    int rc = loop_init(c, &st);
    if (!rc) rc = loop_plan(c, &st, 1);
    sub_free(&st.body);
    return rc;
}

static int loop_prepare(struct op_call *c, void **state, size_t *scratch) {
    (void)scratch;
    struct loop_state *st = op_params_alloc(c, sizeof *st);
    if (!st) return STATUS_NOMEM;
    int rc = loop_init(c, st);
    if (!rc) rc = loop_plan(c, st, 0);
    if (rc) {
        loop_release(st);
        return rc;
    }
    *state = st;
    return 0;
}

/* Loop-carried values between iterations: the node's inputs at first, then
 * results taken over from the body's run (owned). */
struct carried {
    struct tensor t[OP_MAX_IO];
    unsigned char owned[OP_MAX_IO];
};

static void carried_free(struct carried *cv, int n) {
    for (int j = 0; j < n; j++)
        if (cv->owned[j]) tensor_free_data(&cv->t[j]);
}

/* Takes result r of the body as loop-carried value j. */
static void carried_take(struct carried *cv, int j, struct tensor *r) {
    if (cv->owned[j]) tensor_free_data(&cv->t[j]);
    cv->t[j] = *r;
    cv->owned[j] = 1;
    r->data = NULL;
}

/* Copies slice r into position pos of the node's output o, stacked along axis. */
static int stack_slice(struct op_call *c, int o, const struct tensor *r, int axis, int64_t pos, const char *what) {
    struct tensor *dst = c->out[o];
    if (!dst) return 0;
    int ok = dst->dtype == r->dtype && dst->ndim == r->ndim + 1 && pos < dst->dims[axis];
    for (int d = 0, e = 0; ok && d < dst->ndim; d++)
        if (d != axis && dst->dims[d] != r->dims[e++]) ok = 0;
    if (!ok) {
        char a[128], b[128];
        return op_error(c, "%s: slice %lld of output %d is %s, which does not fit the planned %s", what, (long long)pos, o,
                        tensor_shape_str(r, a, sizeof a), tensor_shape_str(dst, b, sizeof b));
    }
    int64_t outer = 1, len = dst->dims[axis];
    for (int d = 0; d < axis; d++) outer *= dst->dims[d];
    size_t inner = tensor_nbytes(r) / (size_t)(outer ? outer : 1);
    for (int64_t q = 0; q < outer && inner; q++)
        memcpy((char *)dst->data + ((size_t)(q * len + pos)) * inner, (const char *)r->data + (size_t)q * inner, inner);
    return 0;
}

static int loop_run_locked(struct op_call *c) {
    struct loop_state *st = c->state;
    struct sub *s = &st->body;
    int n = st->n, k = st->k, rc = 0;
    const struct tensor *M = c->in[0], *cond = c->in[1];
    int64_t m = M ? op_int_at(M, 0) : INT64_MAX;
    int go = !cond || truthy(cond);
    struct carried cv;
    memset(&cv, 0, sizeof cv);
    for (int j = 0; j < n; j++) cv.t[j] = *c->in[2 + j];
    sub_captures(s, c, 0);
    int64_t i = 0;
    for (; go && i < m; i++) {
        st->iter = i;
        for (int j = 0; j < n; j++) s->in[2 + j] = cv.t[j];
        if ((rc = sub_run(c, s))) goto out;
        go = truthy(&s->out[0]);
        for (int j = 0; j < k; j++)
            if ((rc = stack_slice(c, n + j, &s->out[1 + n + j], 0, i, "scan output"))) goto out;
        for (int j = 0; j < n; j++) carried_take(&cv, j, &s->out[1 + j]);
        sub_clear_outputs(s);
    }
    for (int j = 0; j < k; j++)
        if (c->out[n + j] && c->out[n + j]->dims[0] != i) {
            rc = op_error(c, "the loop ran %lld iterations; its plan expected %lld", (long long)i,
                          (long long)c->out[n + j]->dims[0]);
            goto out;
        }
    for (int j = 0; j < n && !rc; j++) rc = copy_result(c, j, &cv.t[j], "the loop");
out:
    carried_free(&cv, n);
    sub_clear_outputs(s);
    return rc;
}

/* ---- Scan (opset 9 and later) -------------------------------------------------- */

struct scan_state {
    struct sub body;
    int n, m, k;   /* states, scan inputs, scan outputs */
    int64_t trips;
    int in_axis[OP_MAX_IO], in_rev[OP_MAX_IO], out_axis[OP_MAX_IO], out_rev[OP_MAX_IO];
    void *buf[OP_MAX_IO]; /* one slice of each scan input */
};

static void scan_release(void *state) {
    struct scan_state *st = state;
    if (!st) return;
    sub_free(&st->body);
    for (int j = 0; j < st->m; j++) free(st->buf[j]);
    free(st);
}

/* Reads attribute name (one entry per count, default 0) into out. */
static int scan_ints(struct op_call *c, const char *name, int count, int *out) {
    const int64_t *v;
    int nv = node_attr_ints(c->node, name, &v);
    if (nv >= 0 && nv != count) return op_error(c, "%s has %d entries for %d values", name, nv, count);
    for (int j = 0; j < count; j++) out[j] = nv >= 0 ? (int)v[j] : 0;
    return 0;
}

/* The body, attributes decoded, trip count, slice shapes and the body's plan;
 * the node's output shapes when set_shapes. */
static int scan_init(struct op_call *c, struct scan_state *st, int set_shapes) {
    const struct graph_node *n = c->node;
    if (n->opset < 9)
        return op_error(c, "Scan before opset 9 (a batch axis and sequence_lens) is not supported; re-export with "
                        "opset 9 or later");
    int rc = sub_init(c, &st->body, node_attr_graph(n, "body"), "body");
    if (rc) return rc;
    struct sub *s = &st->body;
    const struct graph *g = s->g;
    st->m = (int)node_attr_int(n, "num_scan_inputs", -1);
    st->n = graph_nformal(g) - st->m;
    st->k = g->noutputs - st->n;
    if (st->m < 1 || st->n < 0 || st->k < 0 || c->nin < st->n + st->m || c->nout != st->n + st->k)
        return op_error(c, "num_scan_inputs %d and a body of %d inputs and %d outputs do not fit the node", st->m,
                        graph_nformal(g), g->noutputs);
    if ((rc = scan_ints(c, "scan_input_axes", st->m, st->in_axis)) ||
        (rc = scan_ints(c, "scan_input_directions", st->m, st->in_rev)) ||
        (rc = scan_ints(c, "scan_output_axes", st->k, st->out_axis)) ||
        (rc = scan_ints(c, "scan_output_directions", st->k, st->out_rev)))
        return rc;
    sub_captures(s, c, 1);
    for (int j = 0; j < st->n; j++) {
        if (!c->in[j]) return op_error(c, "state input %d is missing", j);
        if ((rc = no_strings(c, c->in[j]))) return rc;
        s->in[j] = *c->in[j];
        s->in[j].data = NULL;
    }
    st->trips = -1;
    for (int j = 0; j < st->m; j++) {
        const struct tensor *x = c->in[st->n + j];
        if (!x) return op_error(c, "scan input %d is missing", j);
        if ((rc = no_strings(c, x))) return rc;
        int a = op_axis(c, st->in_axis[j], x->ndim);
        if (a < 0) return STATUS_INVALID;
        st->in_axis[j] = a;
        if (st->trips >= 0 && x->dims[a] != st->trips)
            return op_error(c, "scan input %d has %lld entries along axis %d; scan input 0 has %lld", j,
                            (long long)x->dims[a], a, (long long)st->trips);
        st->trips = x->dims[a];
        struct tensor *sl = &s->in[st->n + j];
        sl->dtype = x->dtype;
        sl->ndim = x->ndim - 1;
        for (int d = 0, e = 0; d < x->ndim; d++)
            if (d != a) sl->dims[e++] = x->dims[d];
        sl->data = NULL;
    }
    struct plan *p;
    if ((rc = sub_plan(c, s, &p))) return rc;
    for (int j = 0; j < st->n; j++) {
        struct tensor t = sub_out_shape(s, p, j);
        if (!same_shape(&t, &s->in[j]))
            return op_error(c, "state %d changes shape or type in the body", j);
        if (set_shapes && c->out[j]) set_shape(c->out[j], &t);
    }
    for (int j = 0; j < st->k; j++) {
        struct tensor t = sub_out_shape(s, p, st->n + j);
        if ((rc = no_strings(c, &t))) return rc;
        if (t.ndim >= TENSOR_MAX_DIMS) return op_error(c, "scan output %d has too high a rank", j);
        int a = st->out_axis[j] < 0 ? st->out_axis[j] + t.ndim + 1 : st->out_axis[j];
        if (a < 0 || a > t.ndim) return op_error(c, "scan_output_axes[%d] = %d is out of range", j, st->out_axis[j]);
        st->out_axis[j] = a;
        struct tensor *o = c->out[st->n + j];
        if (!set_shapes || !o) continue;
        o->dtype = t.dtype;
        o->ndim = t.ndim + 1;
        for (int d = 0, e = 0; d < o->ndim; d++) o->dims[d] = d == a ? st->trips : t.dims[e++];
    }
    return 0;
}

static int scan_infer(struct op_call *c) {
    struct scan_state st;
    memset(&st, 0, sizeof st);
    int rc = scan_init(c, &st, 1);
    sub_free(&st.body);
    return rc;
}

static int scan_prepare(struct op_call *c, void **state, size_t *scratch) {
    (void)scratch;
    struct scan_state *st = op_params_alloc(c, sizeof *st);
    if (!st) return STATUS_NOMEM;
    int rc = scan_init(c, st, 0);
    for (int j = 0; !rc && j < st->m; j++) {
        size_t nb = tensor_nbytes(&st->body.in[st->n + j]);
        if (!(st->buf[j] = malloc(nb ? nb : 1))) rc = op_error(c, "out of memory");
    }
    if (rc) {
        scan_release(st);
        return rc;
    }
    *state = st;
    return 0;
}

/* Copies entry pos along axis of x into dst (contiguous). */
static void take_slice(const struct tensor *x, int axis, int64_t pos, void *dst) {
    int64_t outer = 1, len = x->dims[axis];
    for (int d = 0; d < axis; d++) outer *= x->dims[d];
    size_t inner = len && outer ? tensor_nbytes(x) / (size_t)(outer * len) : 0;
    for (int64_t q = 0; q < outer && inner; q++)
        memcpy((char *)dst + (size_t)q * inner, (const char *)x->data + ((size_t)(q * len + pos)) * inner, inner);
}

static int scan_run_locked(struct op_call *c) {
    struct scan_state *st = c->state;
    struct sub *s = &st->body;
    int n = st->n, rc = 0;
    struct carried cv;
    memset(&cv, 0, sizeof cv);
    for (int j = 0; j < n; j++) cv.t[j] = *c->in[j];
    sub_captures(s, c, 0);
    for (int64_t t = 0; t < st->trips; t++) {
        for (int j = 0; j < n; j++) s->in[j] = cv.t[j];
        for (int j = 0; j < st->m; j++) {
            take_slice(c->in[n + j], st->in_axis[j], st->in_rev[j] ? st->trips - 1 - t : t, st->buf[j]);
            s->in[n + j].data = st->buf[j];
        }
        if ((rc = sub_run(c, s))) goto out;
        for (int j = 0; j < st->k; j++)
            if ((rc = stack_slice(c, n + j, &s->out[n + j], st->out_axis[j], st->out_rev[j] ? st->trips - 1 - t : t,
                                  "scan output")))
                goto out;
        for (int j = 0; j < n; j++) carried_take(&cv, j, &s->out[j]);
        sub_clear_outputs(s);
    }
    for (int j = 0; j < n && !rc; j++) rc = copy_result(c, j, &cv.t[j], "the scan");
out:
    carried_free(&cv, n);
    sub_clear_outputs(s);
    return rc;
}

static int loop_run(struct op_call *c) {
    return sub_locked(c, &((struct loop_state *)c->state)->body, loop_run_locked);
}

static int scan_run(struct op_call *c) {
    return sub_locked(c, &((struct scan_state *)c->state)->body, scan_run_locked);
}

/* ---- the table ----------------------------------------------------------------- */

static const struct op_def control_ops[] = {
    {"If", "", if_infer, if_prepare, if_run, if_release, 0},
    {"Loop", "", loop_infer, loop_prepare, loop_run, loop_release, 0},
    {"Scan", "", scan_infer, scan_prepare, scan_run, scan_release, 0},
};

const struct op_def *control_op_find(const char *domain, const char *op_type) {
    if (domain && *domain && strcmp(domain, "ai.onnx") != 0) return NULL;
    for (size_t i = 0; i < sizeof control_ops / sizeof control_ops[0]; i++)
        if (strcmp(control_ops[i].op_type, op_type) == 0) return &control_ops[i];
    return NULL;
}
