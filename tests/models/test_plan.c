/* Plans and passes on graphs built in memory with the real op tables:
 * results, plan-time folding, views, memory planning (no two live values
 * share bytes), the LRU of plans, and the load-time fusions checked
 * numerically against the unfused graph. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "graph/graph.h"
#include "kernels/backend.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/ops.h"
#include "models/eval.h"
#include "models/onnx_load.h"
#include "models/passes.h"
#include "models/control.h"
#include "models/plan.h"
#include "models/valrun.h"

#define DATA ".venv/lib/python3.11/site-packages/onnx/backend/test/data"

/* ---- graph building helpers ---------------------------------------------------- */

static int val(struct graph *g, const char *name) {
    int v = graph_intern_value(g, name);
    assert_true(v >= 0);
    return v;
}

static int add_input(struct graph *g, const char *name, enum dtype dt, int ndim, const int64_t *dims) {
    int v = val(g, name);
    g->values[v].t.dtype = dt;
    g->values[v].t.ndim = ndim;
    for (int d = 0; d < ndim; d++) g->values[v].t.dims[d] = dims[d];
    g->values[v].flags |= VALUE_INPUT;
    g->inputs = realloc(g->inputs, (size_t)(g->ninputs + 1) * sizeof(int));
    g->inputs[g->ninputs++] = v;
    return v;
}

static void add_output(struct graph *g, const char *name) {
    int v = val(g, name);
    g->values[v].flags |= VALUE_OUTPUT;
    g->outputs = realloc(g->outputs, (size_t)(g->noutputs + 1) * sizeof(int));
    g->outputs[g->noutputs++] = v;
}

static int add_const(struct graph *g, const char *name, enum dtype dt, int ndim, const int64_t *dims,
                     const void *data) {
    int v = val(g, name);
    struct tensor *t = &g->values[v].t;
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->dims[d] = dims[d];
    size_t nb = tensor_nbytes(t);
    t->data = malloc(nb ? nb : 1);
    memcpy(t->data, data, nb);
    return v;
}

static int add_const_f(struct graph *g, const char *name, int ndim, const int64_t *dims, const float *data) {
    return add_const(g, name, DT_FP32, ndim, dims, data);
}

/* Adds a node from value names ("" = absent input); returns its index. */
static int node(struct graph *g, const char *op, const char *const *ins, int nin, const char *const *outs, int nout) {
    int in[16], out[16];
    for (int i = 0; i < nin; i++) in[i] = ins[i][0] ? val(g, ins[i]) : -1;
    for (int i = 0; i < nout; i++) out[i] = val(g, outs[i]);
    int n = graph_add_node(g, NULL, op, "", in, nin, out, nout);
    assert_true(n >= 0);
    g->nodes[n].op = op_find("", op);
    g->nodes[n].opset = 17;
    assert_non_null(g->nodes[n].op);
    return n;
}

static struct graph_attr *new_attr(struct graph *g, int n, const char *name, enum attr_type type) {
    struct graph_node *nd = &g->nodes[n];
    nd->attrs = realloc(nd->attrs, (size_t)(nd->nattr + 1) * sizeof *nd->attrs);
    struct graph_attr *a = &nd->attrs[nd->nattr++];
    memset(a, 0, sizeof *a);
    a->name = strdup(name);
    a->type = type;
    return a;
}

static void attr_int(struct graph *g, int n, const char *name, int64_t v) { new_attr(g, n, name, ATTR_INT)->i = v; }
static void attr_float(struct graph *g, int n, const char *name, float v) { new_attr(g, n, name, ATTR_FLOAT)->f = v; }
static void attr_ints(struct graph *g, int n, const char *name, int cnt, const int64_t *v) {
    struct graph_attr *a = new_attr(g, n, name, ATTR_INTS);
    a->n = cnt;
    a->ints = malloc((size_t)cnt * sizeof(int64_t));
    memcpy(a->ints, v, (size_t)cnt * sizeof(int64_t));
}

static void sort(struct graph *g) {
    char err[256];
    assert_int_equal(graph_toposort(g, err, sizeof err), 0);
}

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* Runs g once on the CPU with the given inputs; returns output 0 (malloc'd). */
static float *run1(struct graph *g, const struct tensor *inputs, struct tensor *out0) {
    struct backend *be = backend_cpu_create(&(struct backend_params){.nthreads = 2});
    struct plan_exec *x = plan_exec_create(be, 2);
    struct plan *p;
    char err[512] = "";
    int rc = plan_build(g, inputs, 0, be, 2, &p, err, sizeof err);
    if (rc) fail_msg("plan_build: %s", err);
    struct tensor outs[8];
    rc = plan_exec_run(x, p, inputs, outs, err, sizeof err);
    if (rc) fail_msg("run: %s", err);
    for (int o = 1; o < g->noutputs; o++) free(outs[o].data);
    plan_release(p);
    plan_exec_free(x);
    backend_free(be);
    *out0 = outs[0];
    return outs[0].data;
}

/* No two arena values whose live ranges overlap share a byte; every arena
 * value lies inside the arena. */
static void check_no_overlap(const struct plan *p, const struct graph *g) {
    size_t arena = plan_arena_size(p);
    int n = 0;
    for (int v = 0; v < g->nvalues; v++) {
        size_t off, size;
        int f, l;
        if (plan_value_info(p, v, NULL, &off, &size, &f, &l) != PLAN_VALUE_ARENA) continue;
        n++;
        assert_true(off % 64 == 0);
        assert_true(off + size <= arena);
        for (int w = v + 1; w < g->nvalues; w++) {
            size_t off2, size2;
            int f2, l2;
            if (plan_value_info(p, w, NULL, &off2, &size2, &f2, &l2) != PLAN_VALUE_ARENA) continue;
            if (off == off2 && size == size2 && f == f2 && l == l2) continue; /* a view of the same bytes */
            int live_together = f <= l2 && f2 <= l;
            int share = off < off2 + size2 && off2 < off + size;
            if (live_together && share)
                fail_msg("values '%s' [%d,%d] @%zu+%zu and '%s' [%d,%d] @%zu+%zu overlap", g->values[v].name, f, l,
                         off, size, g->values[w].name, f2, l2, off2, size2);
        }
    }
    assert_true(n > 0);
}

/* ---- tests --------------------------------------------------------------------- */

/* x -> Relu -> a; a -> Sigmoid -> b; a + b -> c; c * x -> y: a diamond whose
 * values live across steps. */
static struct graph *diamond(void) {
    struct graph *g = graph_create();
    int64_t d[2] = {-1, 5};
    add_input(g, "x", DT_FP32, 2, d);
    node(g, "Relu", (const char *[]){"x"}, 1, (const char *[]){"a"}, 1);
    node(g, "Sigmoid", (const char *[]){"a"}, 1, (const char *[]){"b"}, 1);
    node(g, "Add", (const char *[]){"a", "b"}, 2, (const char *[]){"c"}, 1);
    node(g, "Mul", (const char *[]){"c", "x"}, 2, (const char *[]){"y"}, 1);
    add_output(g, "y");
    sort(g);
    return g;
}

static void test_diamond_results_and_memory(void **state) {
    (void)state;
    struct graph *g = diamond();
    float xd[15];
    unsigned s = 1;
    for (int i = 0; i < 15; i++) xd[i] = frand(&s) * 3;
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {3, 5}, .data = xd}, y;
    float *yd = run1(g, &in, &y);
    assert_int_equal(y.ndim, 2);
    assert_int_equal(y.dims[0], 3);
    for (int i = 0; i < 15; i++) {
        float a = xd[i] > 0 ? xd[i] : 0, b = 1.0f / (1.0f + expf(-a));
        assert_float_equal(yd[i], (a + b) * xd[i], 1e-5);
    }
    free(yd);

    struct plan *p;
    char err[256];
    assert_int_equal(plan_build(g, &in, 0, NULL, 2, &p, err, sizeof err), 0);
    assert_int_equal(plan_nsteps(p), 4);
    check_no_overlap(p, g);
    /* The input is read in place; a (used by steps 1 and 2) outlives b's birth. */
    assert_int_equal(plan_value_info(p, graph_find_value(g, "x"), NULL, NULL, NULL, NULL, NULL), PLAN_VALUE_INPUT);
    int f, l;
    plan_value_info(p, graph_find_value(g, "a"), NULL, NULL, NULL, &f, &l);
    assert_int_equal(f, 0);
    assert_int_equal(l, 2);
    plan_value_info(p, graph_find_value(g, "y"), NULL, NULL, NULL, &f, &l);
    assert_int_equal(l, plan_nsteps(p)); /* outputs live to the end */
    plan_release(p);
    graph_free(g);
}

/* A chain of 8 Relus: memory is reused, so the arena holds about two
 * buffers plus the output, not eight. */
static void test_chain_reuses_memory(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int64_t d[1] = {1000};
    add_input(g, "v0", DT_FP32, 1, d);
    char a[8], b[8];
    for (int i = 0; i < 8; i++) {
        snprintf(a, sizeof a, "v%d", i);
        snprintf(b, sizeof b, "v%d", i + 1);
        node(g, i % 2 ? "Neg" : "Abs", (const char *[]){a}, 1, (const char *[]){b}, 1);
    }
    add_output(g, "v8");
    sort(g);
    struct tensor in = {.dtype = DT_FP32, .ndim = 1, .dims = {1000}};
    struct plan *p;
    char err[256];
    assert_int_equal(plan_build(g, &in, 0, NULL, 2, &p, err, sizeof err), 0);
    check_no_overlap(p, g);
    size_t one = 4032; /* 4000 bytes rounded to 64 */
    assert_true(plan_arena_size(p) <= 3 * one);
    assert_true(plan_arena_size(p) >= 2 * one);
    plan_release(p);
    graph_free(g);
}

/* Shape -> Gather -> Unsqueeze -> Concat -> Reshape folds away at plan time
 * for a fixed shape; the Reshape is a view of the input: no steps at all. */
static void test_shape_chain_folds(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int64_t d[3] = {-1, 4, 6};
    add_input(g, "x", DT_FP32, 3, d);
    int64_t zero = 0, minus1 = -1, one1[1] = {1}, ax0 = 0;
    add_const(g, "idx0", DT_INT64, 0, NULL, &zero);
    add_const(g, "m1", DT_INT64, 1, one1, &minus1);
    add_const(g, "axes", DT_INT64, 1, one1, &ax0);
    node(g, "Shape", (const char *[]){"x"}, 1, (const char *[]){"shp"}, 1);
    int gn = node(g, "Gather", (const char *[]){"shp", "idx0"}, 2, (const char *[]){"n"}, 1);
    attr_int(g, gn, "axis", 0);
    node(g, "Unsqueeze", (const char *[]){"n", "axes"}, 2, (const char *[]){"n1"}, 1);
    int cn = node(g, "Concat", (const char *[]){"n1", "m1"}, 2, (const char *[]){"newshape"}, 1);
    attr_int(g, cn, "axis", 0);
    node(g, "Reshape", (const char *[]){"x", "newshape"}, 2, (const char *[]){"y"}, 1);
    add_output(g, "y");
    sort(g);

    float xd[2 * 24];
    for (int i = 0; i < 48; i++) xd[i] = (float)i;
    struct tensor in = {.dtype = DT_FP32, .ndim = 3, .dims = {2, 4, 6}, .data = xd};
    struct plan *p;
    char err[256];
    assert_int_equal(plan_build(g, &in, 0, NULL, 2, &p, err, sizeof err), 0);
    assert_int_equal(plan_nsteps(p), 0);
    assert_int_equal(plan_nconst_folded(p), 4);
    struct tensor shape;
    assert_int_equal(plan_value_info(p, graph_find_value(g, "y"), &shape, NULL, NULL, NULL, NULL), PLAN_VALUE_INPUT);
    assert_int_equal(shape.ndim, 2);
    assert_int_equal(shape.dims[0], 2);
    assert_int_equal(shape.dims[1], 24);
    plan_release(p);

    struct tensor y;
    float *yd = run1(g, &in, &y);
    assert_int_equal(y.dims[1], 24);
    assert_memory_equal(yd, xd, sizeof xd);
    free(yd);
    graph_free(g);
}

/* A view whose source is still read later keeps the source's bytes alive:
 * x -> Relu -> a; Reshape(a) -> r; Neg(r) -> n; a + 1 ... (Add(a, n)) -> y. */
static void test_view_extends_lifetime(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int64_t d[2] = {4, 4}, sd[1] = {1}, sv = 16;
    add_input(g, "x", DT_FP32, 2, d);
    add_const(g, "s16", DT_INT64, 1, sd, &sv);
    node(g, "Relu", (const char *[]){"x"}, 1, (const char *[]){"a"}, 1);
    node(g, "Reshape", (const char *[]){"a", "s16"}, 2, (const char *[]){"r"}, 1);
    node(g, "Neg", (const char *[]){"r"}, 1, (const char *[]){"n"}, 1);
    node(g, "Exp", (const char *[]){"n"}, 1, (const char *[]){"e"}, 1);
    node(g, "Reshape", (const char *[]){"e", "s16"}, 2, (const char *[]){"e2"}, 1);
    node(g, "Add", (const char *[]){"r", "e2"}, 2, (const char *[]){"y"}, 1);
    add_output(g, "y");
    sort(g);
    float xd[16];
    unsigned s = 7;
    for (int i = 0; i < 16; i++) xd[i] = frand(&s);
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {4, 4}, .data = xd}, y;
    struct plan *p;
    char err[256];
    assert_int_equal(plan_build(g, &in, 0, NULL, 2, &p, err, sizeof err), 0);
    assert_int_equal(plan_nsteps(p), 4); /* Relu, Neg, Exp, Add: the Reshapes are views */
    check_no_overlap(p, g);
    int fa, la, fr, lr;
    plan_value_info(p, graph_find_value(g, "a"), NULL, NULL, NULL, &fa, &la);
    plan_value_info(p, graph_find_value(g, "r"), NULL, NULL, NULL, &fr, &lr);
    assert_int_equal(la, 3); /* read through the view by the last step */
    assert_int_equal(lr, la);
    plan_release(p);
    float *yd = run1(g, &in, &y);
    for (int i = 0; i < 16; i++) {
        float a = xd[i] > 0 ? xd[i] : 0;
        assert_float_equal(yd[i], a + expf(-a), 1e-5);
    }
    free(yd);
    graph_free(g);
}

/* Conv -> BatchNormalization -> Relu: after the passes one Conv with a fused
 * Relu remains, and it computes what the three nodes computed. */
static struct graph *conv_bn_relu(void) {
    struct graph *g = graph_create();
    int64_t xd[4] = {1, 3, 6, 6}, wd[4] = {4, 3, 3, 3}, cd[1] = {4};
    add_input(g, "x", DT_FP32, 4, xd);
    float w[4 * 27], b[4], sc[4], be[4], mu[4], var[4];
    unsigned s = 3;
    for (int i = 0; i < 108; i++) w[i] = frand(&s);
    for (int i = 0; i < 4; i++) {
        b[i] = frand(&s);
        sc[i] = 1 + frand(&s) * 0.5f;
        be[i] = frand(&s);
        mu[i] = frand(&s);
        var[i] = 1.5f + frand(&s);
    }
    add_const_f(g, "w", 4, wd, w);
    add_const_f(g, "b", 1, cd, b);
    add_const_f(g, "scale", 1, cd, sc);
    add_const_f(g, "beta", 1, cd, be);
    add_const_f(g, "mean", 1, cd, mu);
    add_const_f(g, "var", 1, cd, var);
    int c = node(g, "Conv", (const char *[]){"x", "w", "b"}, 3, (const char *[]){"c"}, 1);
    int64_t pads[4] = {1, 1, 1, 1};
    attr_ints(g, c, "pads", 4, pads);
    int bn = node(g, "BatchNormalization", (const char *[]){"c", "scale", "beta", "mean", "var"}, 5,
                  (const char *[]){"bn"}, 1);
    attr_float(g, bn, "epsilon", 1e-3f);
    node(g, "Relu", (const char *[]){"bn"}, 1, (const char *[]){"y"}, 1);
    add_output(g, "y");
    sort(g);
    return g;
}

static void test_conv_bn_relu_fusion(void **state) {
    (void)state;
    if (!op_find("", "BatchNormalization")) skip();
    float xd[108];
    unsigned s = 11;
    for (int i = 0; i < 108; i++) xd[i] = frand(&s) * 2;
    struct tensor in = {.dtype = DT_FP32, .ndim = 4, .dims = {1, 3, 6, 6}, .data = xd}, y1, y2;
    struct graph *ref = conv_bn_relu();
    float *r = run1(ref, &in, &y1);
    struct graph *g = conv_bn_relu();
    char err[256];
    assert_int_equal(passes_run(g, err, sizeof err), 0);
    assert_int_equal(g->nnodes, 1);
    assert_string_equal(g->nodes[0].op_type, "Conv");
    assert_int_equal(g->nodes[0].act, ACT_RELU);
    float *f = run1(g, &in, &y2);
    assert_true(tensor_same_shape(&y1, &y2));
    for (int i = 0; i < 4 * 36; i++) assert_float_equal(f[i], r[i], 1e-4);
    free(r);
    free(f);
    graph_free(ref);
    graph_free(g);
}

/* x -> QuantizeLinear -> DequantizeLinear -> Conv (weights and bias
 * dequantized per channel, as quantize_static writes them) -> Relu ->
 * QuantizeLinear -> DequantizeLinear -> Add (with x's DequantizeLinear) ->
 * QuantizeLinear -> DequantizeLinear -> y: with the CPU's passes the Conv
 * becomes a QLinearConv with the Relu fused (where oneDNN's int8 kernels
 * have VNNI) and the Add a QLinearAdd, within one step of y's scale. */
static struct graph *qdq_block(int two_convs) {
    struct graph *g = graph_create();
    int64_t xd[4] = {1, 4, 6, 6}, wd[4] = {4, 4, 3, 3}, cd[1] = {4}, sd[1] = {1};
    add_input(g, "x", DT_FP32, 4, xd);
    int8_t w[144];
    int32_t bq[4];
    float ws[4], bs[4], xs = 0.02f, cs = 0.03f, ys = 0.04f;
    int8_t wz[4] = {0};
    int32_t bz[4] = {0};
    uint8_t xz = 128, cz = 0, yz = 100;
    unsigned s = 5;
    for (int i = 0; i < 144; i++) w[i] = (int8_t)(frand(&s) * 127);
    for (int i = 0; i < 4; i++) {
        ws[i] = 0.01f + 0.002f * (float)i;
        bs[i] = xs * ws[i];
        bq[i] = (int32_t)(frand(&s) * 2000);
    }
    add_const(g, "wq", DT_INT8, 4, wd, w);
    add_const_f(g, "ws", 1, cd, ws);
    add_const(g, "wz", DT_INT8, 1, cd, wz);
    add_const(g, "bq", DT_INT32, 1, cd, bq);
    add_const_f(g, "bs", 1, cd, bs);
    add_const(g, "bz", DT_INT32, 1, cd, bz);
    add_const_f(g, "xs", 0, sd, &xs);
    add_const(g, "xz", DT_UINT8, 0, sd, &xz);
    add_const_f(g, "cs", 0, sd, &cs);
    add_const(g, "cz", DT_UINT8, 0, sd, &cz);
    add_const_f(g, "ys", 0, sd, &ys);
    add_const(g, "yz", DT_UINT8, 0, sd, &yz);
    node(g, "QuantizeLinear", (const char *[]){"x", "xs", "xz"}, 3, (const char *[]){"xq"}, 1);
    node(g, "DequantizeLinear", (const char *[]){"xq", "xs", "xz"}, 3, (const char *[]){"xf"}, 1);
    int dw = node(g, "DequantizeLinear", (const char *[]){"wq", "ws", "wz"}, 3, (const char *[]){"wf"}, 1);
    attr_int(g, dw, "axis", 0);
    int db = node(g, "DequantizeLinear", (const char *[]){"bq", "bs", "bz"}, 3, (const char *[]){"bf"}, 1);
    attr_int(g, db, "axis", 0);
    int c = node(g, "Conv", (const char *[]){"xf", "wf", "bf"}, 3, (const char *[]){"c"}, 1);
    int64_t pads[4] = {1, 1, 1, 1};
    attr_ints(g, c, "pads", 4, pads);
    node(g, "Relu", (const char *[]){"c"}, 1, (const char *[]){"r"}, 1);
    node(g, "QuantizeLinear", (const char *[]){"r", "cs", "cz"}, 3, (const char *[]){"rq"}, 1);
    node(g, "DequantizeLinear", (const char *[]){"rq", "cs", "cz"}, 3, (const char *[]){"rf"}, 1);
    if (two_convs) { /* a second Conv (no bias) instead of the Add */
        int c2 = node(g, "Conv", (const char *[]){"rf", "wf"}, 2, (const char *[]){"a"}, 1);
        attr_ints(g, c2, "pads", 4, pads);
    } else {
        node(g, "Add", (const char *[]){"rf", "xf"}, 2, (const char *[]){"a"}, 1);
    }
    node(g, "QuantizeLinear", (const char *[]){"a", "ys", "yz"}, 3, (const char *[]){"aq"}, 1);
    node(g, "DequantizeLinear", (const char *[]){"aq", "ys", "yz"}, 3, (const char *[]){"y"}, 1);
    add_output(g, "y");
    sort(g);
    return g;
}

static int count_op(const struct graph *g, const char *op) {
    int n = 0;
    for (int i = 0; i < g->nnodes; i++) n += strcmp(g->nodes[i].op_type, op) == 0;
    return n;
}

static void test_qdq_fusion(void **state) {
    (void)state;
    float xd[144];
    unsigned s = 17;
    for (int i = 0; i < 144; i++) xd[i] = frand(&s) * 2;
    struct tensor in = {.dtype = DT_FP32, .ndim = 4, .dims = {1, 4, 6, 6}, .data = xd}, y1, y2;
    struct graph *ref = qdq_block(0);
    float *r = run1(ref, &in, &y1);
    struct graph *g = qdq_block(0);
    char err[256];
    assert_int_equal(passes_run_for(g, 1, err, sizeof err), 0);
    assert_int_equal(count_op(g, "QLinearAdd"), 1);
    assert_int_equal(count_op(g, "Add"), 0);
    if (dnnl_util_isa_vnni()) {
        assert_int_equal(count_op(g, "Conv"), 0);
        assert_int_equal(count_op(g, "Relu"), 0);
        assert_int_equal(count_op(g, "QLinearConv"), 1);
        for (int i = 0; i < g->nnodes; i++)
            if (strcmp(g->nodes[i].op_type, "QLinearConv") == 0) assert_int_equal(g->nodes[i].act, ACT_RELU);
    }
    /* Of the QuantizeLinears only the input's stays (and the Conv's
     * without VNNI, where the Conv stays float). */
    assert_int_equal(count_op(g, "QuantizeLinear"), dnnl_util_isa_vnni() ? 1 : 2);
    float *f = run1(g, &in, &y2);
    assert_true(tensor_same_shape(&y1, &y2));
    for (int i = 0; i < 144; i++) assert_true(fabsf(f[i] - r[i]) <= 0.04f * 1.0001f);
    /* Without the CPU's fusions the graph stays float. */
    struct graph *h = qdq_block(0);
    assert_int_equal(passes_run_for(h, 0, err, sizeof err), 0);
    assert_int_equal(count_op(h, "QLinearAdd") + count_op(h, "QLinearConv"), 0);
    free(r);
    free(f);
    graph_free(ref);
    graph_free(g);
    graph_free(h);
}

/* Two integer convolutions in a row: the 8-bit activation between them is
 * stored NHWC (the first's y, the second's x), the graph's input and output
 * stay NCHW, and the result is the float graph's within one step. */
static void test_qdq_nhwc_between_convs(void **state) {
    (void)state;
    if (!dnnl_util_isa_vnni()) skip(); /* the Convs stay float there */
    float xd[144];
    unsigned s = 23;
    for (int i = 0; i < 144; i++) xd[i] = frand(&s) * 2;
    struct tensor in = {.dtype = DT_FP32, .ndim = 4, .dims = {1, 4, 6, 6}, .data = xd}, y1, y2;
    struct graph *ref = qdq_block(1);
    float *r = run1(ref, &in, &y1);
    struct graph *g = qdq_block(1);
    char err[256];
    assert_int_equal(passes_run_for(g, 1, err, sizeof err), 0);
    int seen = 0;
    for (int i = 0; i < g->nnodes; i++) {
        if (strcmp(g->nodes[i].op_type, "QLinearConv") != 0) continue;
        /* the first reads the graph's input (NCHW) and writes NHWC */
        int first = g->values[g->nodes[i].in[0]].producer >= 0 &&
                    strcmp(g->nodes[g->values[g->nodes[i].in[0]].producer].op_type, "QuantizeLinear") == 0;
        assert_int_equal(node_attr_int(&g->nodes[i], "kiln_layout", 0), first ? 2 : 1);
        seen++;
    }
    assert_int_equal(seen, 2);
    float *f = run1(g, &in, &y2);
    assert_true(tensor_same_shape(&y1, &y2));
    for (int i = 0; i < 144; i++) assert_true(fabsf(f[i] - r[i]) <= 0.04f * 1.0001f);
    free(r);
    free(f);
    graph_free(ref);
    graph_free(g);
}

/* The kiln_layout the planner gave the only node of this op type whose
 * output feeds an op of type next (NULL: the first of its type). */
static int64_t layout_of_op(const struct graph *g, const char *op, const char *next) {
    for (int i = 0; i < g->nnodes; i++) {
        if (strcmp(g->nodes[i].op_type, op) != 0) continue;
        if (!next) return node_attr_int(&g->nodes[i], "kiln_layout", 0);
        for (int j = 0; j < g->nnodes; j++)
            for (int k = 0; k < g->nodes[j].nin; k++)
                if (g->nodes[j].in[k] == g->nodes[i].out[0] && strcmp(g->nodes[j].op_type, next) == 0)
                    return node_attr_int(&g->nodes[i], "kiln_layout", 0);
    }
    fail_msg("no %s before %s", op, next ? next : "-");
    return -1;
}

/* g (passes for the CPU) computes what ref (plain layout) computes on in,
 * within float rounding. */
static void assert_same_as_plain(struct graph *g, struct graph *ref, const struct tensor *in) {
    struct tensor y1, y2;
    float *r = run1(ref, in, &y1), *f = run1(g, in, &y2);
    assert_true(tensor_same_shape(&y1, &y2));
    for (int64_t i = 0; i < tensor_numel(&y1); i++) assert_true(fabsf(f[i] - r[i]) <= 1e-4f * (1 + fabsf(r[i])));
    free(r);
    free(f);
}

/* tests/data/layout/cnn_mix.onnx (tests/models/make_layout_models.py):
 * after the CPU's passes the activations stay channels-last from the stem
 * Conv's output to the last Conv's input, through the squeeze-excite Mul,
 * SiLU, the residual Add, MaxPool, Concat and Resize; the squeeze-excite
 * branch's 1x1 maps are left alone (either layout), the graph's input is
 * read plain and the last Conv writes plain for the AveragePool whose
 * output is a graph output. The result equals the plain-layout graph's at
 * batch 1 and 3. */
static void test_layout_cnn_mix(void **state) {
    (void)state;
    char err[512] = "";
    struct graph *g = onnx_load_file("tests/data/layout/cnn_mix.onnx", err, sizeof err);
    struct graph *ref = onnx_load_file("tests/data/layout/cnn_mix.onnx", err, sizeof err);
    if (!g || !ref) fail_msg("load: %s", err);
    assert_int_equal(passes_run_for(g, 1, err, sizeof err), 0);
    assert_int_equal(passes_run_for(ref, 0, err, sizeof err), 0);
    /* Convs by kiln_layout: 0 the squeeze-excite pair (1x1 maps), 1 the
     * last (plain out), 2 the stem (plain in), 3 depthwise, pointwise and
     * both branches. */
    int by_lay[4] = {0}, marked = 0;
    for (int i = 0; i < g->nnodes; i++) {
        int64_t lay = node_attr_int(&g->nodes[i], "kiln_layout", 0);
        marked += lay != 0;
        if (strcmp(g->nodes[i].op_type, "Conv") == 0 && lay >= 0 && lay < 4) by_lay[lay]++;
    }
    assert_int_equal(by_lay[0], 2);
    assert_int_equal(by_lay[1], 1);
    assert_int_equal(by_lay[2], 1);
    assert_int_equal(by_lay[3], 4);
    assert_int_equal(layout_of_op(g, "Conv", "AveragePool"), 1);
    assert_int_equal(layout_of_op(g, "GlobalAveragePool", NULL), 1);
    assert_int_equal(layout_of_op(g, "Mul", "Conv"), 3);          /* the squeeze-excite scale */
    assert_int_equal(count_op(g, "Sigmoid"), 0);                  /* SiLU: the pointwise Conv's swish */
    assert_int_equal(layout_of_op(g, "Add", NULL), 3);
    assert_int_equal(layout_of_op(g, "MaxPool", NULL), 3);
    assert_int_equal(layout_of_op(g, "Concat", NULL), 3);
    assert_int_equal(layout_of_op(g, "Resize", NULL), 3);
    assert_int_equal(layout_of_op(g, "AveragePool", NULL), 0);    /* its output is a graph output */
    assert_int_equal(layout_of_op(g, "Gemm", NULL), 0);
    assert_true(marked >= 12);
    for (int n = 1; n <= 3; n += 2) {
        float *xd = malloc(sizeof(float) * (size_t)n * 3 * 32 * 32);
        unsigned s = 5;
        for (int i = 0; i < n * 3 * 32 * 32; i++) xd[i] = frand(&s);
        struct tensor in = {.dtype = DT_FP32, .ndim = 4, .dims = {n, 3, 32, 32}, .data = xd};
        assert_same_as_plain(g, ref, &in);
        free(xd);
    }
    graph_free(g);
    graph_free(ref);
}

/* ConvNeXt's block: a 1x1 Conv, a 3x3 depthwise Conv, the Transpose to
 * NHWC, a LayerNormalization over the channels and a MatMul, the Transpose
 * back, the residual Add, and its head's mean over H and W. */
static struct graph *convnext_block(void) {
    struct graph *g = graph_create();
    int64_t xd[4] = {2, 8, 6, 6}, w0d[4] = {16, 8, 1, 1}, dwd[4] = {16, 1, 3, 3}, hw[2] = {2, 3};
    int64_t cd[1] = {16}, md[2] = {16, 16};
    add_input(g, "x", DT_FP32, 4, xd);
    static float w0[128], dw[144], sc[16], bi[16], mw[256];
    unsigned s = 11;
    for (int i = 0; i < 128; i++) w0[i] = frand(&s) * 0.4f;
    for (int i = 0; i < 144; i++) dw[i] = frand(&s) * 0.4f;
    for (int i = 0; i < 256; i++) mw[i] = frand(&s) * 0.3f;
    for (int i = 0; i < 16; i++) sc[i] = 1 + frand(&s) * 0.2f, bi[i] = frand(&s) * 0.1f;
    add_const_f(g, "w0", 4, w0d, w0);
    add_const_f(g, "dw", 4, dwd, dw);
    add_const_f(g, "sc", 1, cd, sc);
    add_const_f(g, "bi", 1, cd, bi);
    add_const_f(g, "mw", 2, md, mw);
    node(g, "Conv", (const char *[]){"x", "w0"}, 2, (const char *[]){"c0"}, 1);
    int d = node(g, "Conv", (const char *[]){"c0", "dw"}, 2, (const char *[]){"d"}, 1);
    int64_t pads[4] = {1, 1, 1, 1}, to_nhwc[4] = {0, 2, 3, 1}, to_nchw[4] = {0, 3, 1, 2};
    attr_ints(g, d, "pads", 4, pads);
    attr_int(g, d, "group", 16);
    attr_ints(g, node(g, "Transpose", (const char *[]){"d"}, 1, (const char *[]){"t"}, 1), "perm", 4, to_nhwc);
    attr_int(g, node(g, "LayerNormalization", (const char *[]){"t", "sc", "bi"}, 3, (const char *[]){"ln"}, 1), "axis",
             -1);
    node(g, "MatMul", (const char *[]){"ln", "mw"}, 2, (const char *[]){"m"}, 1);
    attr_ints(g, node(g, "Transpose", (const char *[]){"m"}, 1, (const char *[]){"tb"}, 1), "perm", 4, to_nchw);
    node(g, "Add", (const char *[]){"c0", "tb"}, 2, (const char *[]){"r"}, 1);
    int m = node(g, "ReduceMean", (const char *[]){"r"}, 1, (const char *[]){"y"}, 1);
    attr_ints(g, m, "axes", 2, hw);
    attr_int(g, m, "keepdims", 0);
    add_output(g, "y");
    sort(g);
    return g;
}

/* The block stays channels-last from the first Conv's output to the mean's
 * input: both Transposes move no byte (kiln_layout 1 and 2) and are no
 * steps of the plan, and the result equals the plain-layout graph's. */
static void test_layout_convnext_block(void **state) {
    (void)state;
    char err[512] = "";
    struct graph *g = convnext_block(), *ref = convnext_block();
    assert_int_equal(passes_run_for(g, 1, err, sizeof err), 0);
    assert_int_equal(passes_run_for(ref, 0, err, sizeof err), 0);
    assert_int_equal(layout_of_op(g, "Conv", "Conv"), 2);      /* the first: plain in */
    assert_int_equal(layout_of_op(g, "Conv", "Transpose"), 3); /* depthwise */
    assert_int_equal(layout_of_op(g, "Transpose", "LayerNormalization"), 1);
    assert_int_equal(layout_of_op(g, "Transpose", "Add"), 2);
    assert_int_equal(layout_of_op(g, "Add", NULL), 3);
    assert_int_equal(layout_of_op(g, "ReduceMean", NULL), 1);
    float xd[2 * 8 * 36];
    unsigned s = 9;
    for (int i = 0; i < 2 * 8 * 36; i++) xd[i] = frand(&s);
    struct tensor in = {.dtype = DT_FP32, .ndim = 4, .dims = {2, 8, 6, 6}, .data = xd};
    struct plan *p;
    assert_int_equal(plan_build(g, &in, 0, NULL, 1, &p, err, sizeof err), 0);
    for (int i = 0; i < plan_nsteps(p); i++)
        assert_string_not_equal(g->nodes[plan_step_node(p, i)].op_type, "Transpose");
    plan_release(p);
    assert_same_as_plain(g, ref, &in);
    graph_free(g);
    graph_free(ref);
}

/* Scores [2,2,3,40] -> Mul(1/8) -> Add(mask [2,1,3,40]) -> Softmax(-1) ->
 * Where(IsNaN(p), 0, p), the softmax of exported attention: with the CPU's
 * fusions one MaskedSoftmax node. The mask masks with the float minimum, and
 * one row entirely with -inf (NaN, then zeros); one row of x holds a NaN. */
static struct graph *masked_softmax(void) {
    struct graph *g = graph_create();
    int64_t xd[4] = {2, 2, 3, 40}, md[4] = {2, 1, 3, 40}, sd[0] = {};
    add_input(g, "x", DT_FP32, 4, xd);
    static float mask[240];
    for (int i = 0; i < 240; i++) mask[i] = i % 7 == 3 ? -3.4028234663852886e38f : 0.0f;
    for (int j = 0; j < 40; j++) mask[120 + 40 + j] = -INFINITY; /* batch 1, row 1 */
    float scale = 0.125f, zero = 0;
    add_const_f(g, "mask", 4, md, mask);
    add_const_f(g, "scale", 0, sd, &scale);
    add_const_f(g, "zero", 0, sd, &zero);
    node(g, "Mul", (const char *[]){"x", "scale"}, 2, (const char *[]){"s"}, 1);
    node(g, "Add", (const char *[]){"s", "mask"}, 2, (const char *[]){"a"}, 1);
    int sm = node(g, "Softmax", (const char *[]){"a"}, 1, (const char *[]){"p"}, 1);
    attr_int(g, sm, "axis", -1);
    node(g, "IsNaN", (const char *[]){"p"}, 1, (const char *[]){"bad"}, 1);
    node(g, "Where", (const char *[]){"bad", "zero", "p"}, 3, (const char *[]){"y"}, 1);
    add_output(g, "y");
    sort(g);
    return g;
}

static void test_masked_softmax_fusion(void **state) {
    (void)state;
    float xd[480];
    unsigned s = 21;
    for (int i = 0; i < 480; i++) xd[i] = frand(&s) * 30;
    xd[2 * 40 + 5] = NAN; /* batch 0, head 0, row 2 */
    struct tensor in = {.dtype = DT_FP32, .ndim = 4, .dims = {2, 2, 3, 40}, .data = xd}, y1, y2;
    struct graph *ref = masked_softmax();
    char err[256];
    assert_int_equal(passes_run_for(ref, 0, err, sizeof err), 0);
    assert_int_equal(ref->nnodes, 5); /* without the CPU's fusions: as written */
    float *r = run1(ref, &in, &y1);
    struct graph *g = masked_softmax();
    assert_int_equal(passes_run_for(g, 1, err, sizeof err), 0);
    assert_int_equal(g->nnodes, 1);
    assert_string_equal(g->nodes[0].op_type, "MaskedSoftmax");
    float *f = run1(g, &in, &y2);
    assert_true(tensor_same_shape(&y1, &y2));
    int zeros = 0;
    for (int i = 0; i < 480; i++) {
        assert_false(isnan(f[i]));
        assert_float_equal(f[i], r[i], 1e-6);
        zeros += f[i] == 0;
    }
    assert_true(zeros >= 3 * 40); /* the NaN row and the two -inf rows (one per head) */
    free(r);
    free(f);
    graph_free(ref);
    graph_free(g);
}

/* Q [2,4,6] and K^T [2,6,4] each scaled by a scalar (as SDPA exports write
 * it) -> MatMul -> Add(mask [4,4]) -> Softmax: the factors move into the
 * MaskedSoftmax, which leaves the MatMul on the unscaled operands. */
static struct graph *scaled_scores(void) {
    struct graph *g = graph_create();
    int64_t qd[3] = {2, 4, 6}, kd[3] = {2, 6, 4}, md[2] = {4, 4}, sd[0] = {};
    add_input(g, "q", DT_FP32, 3, qd);
    add_input(g, "k", DT_FP32, 3, kd);
    static float mask[16];
    for (int i = 0; i < 16; i++) mask[i] = i % 4 > i / 4 ? -1e9f : 0.0f; /* causal */
    float c1 = 0.5f, c2 = 0.25f;
    add_const_f(g, "mask", 2, md, mask);
    add_const_f(g, "c1", 0, sd, &c1);
    add_const_f(g, "c2", 0, sd, &c2);
    node(g, "Mul", (const char *[]){"q", "c1"}, 2, (const char *[]){"qs"}, 1);
    node(g, "Mul", (const char *[]){"c2", "k"}, 2, (const char *[]){"ks"}, 1);
    node(g, "MatMul", (const char *[]){"qs", "ks"}, 2, (const char *[]){"s"}, 1);
    node(g, "Add", (const char *[]){"s", "mask"}, 2, (const char *[]){"a"}, 1);
    int sm = node(g, "Softmax", (const char *[]){"a"}, 1, (const char *[]){"y"}, 1);
    attr_int(g, sm, "axis", -1);
    add_output(g, "y");
    sort(g);
    return g;
}

static void test_masked_softmax_takes_scales(void **state) {
    (void)state;
    float qd[48], kd[48];
    unsigned s = 8;
    for (int i = 0; i < 48; i++) qd[i] = frand(&s) * 4;
    for (int i = 0; i < 48; i++) kd[i] = frand(&s) * 4;
    struct tensor in[2] = {{.dtype = DT_FP32, .ndim = 3, .dims = {2, 4, 6}, .data = qd},
                           {.dtype = DT_FP32, .ndim = 3, .dims = {2, 6, 4}, .data = kd}},
                  y1, y2;
    struct graph *ref = scaled_scores(), *g = scaled_scores();
    float *r = run1(ref, in, &y1);
    char err[256];
    assert_int_equal(passes_run_for(g, 1, err, sizeof err), 0);
    int mm = -1, ms = -1;
    for (int i = 0; i < g->nnodes; i++) {
        if (strcmp(g->nodes[i].op_type, "MatMul") == 0) mm = i;
        if (strcmp(g->nodes[i].op_type, "MaskedSoftmax") == 0) ms = i;
    }
    assert_true(mm >= 0 && ms >= 0);
    assert_int_equal(g->nnodes, 2);
    assert_float_equal(node_attr_float(&g->nodes[ms], "scale", 0), 0.125f, 1e-7);
    float *f = run1(g, in, &y2);
    for (int i = 0; i < 32; i++) assert_float_equal(f[i], r[i], 1e-6);
    free(r);
    free(f);
    graph_free(ref);
    graph_free(g);
}

/* MatMul -> Add(bias [1,N]) -> Clip(0, 6): one MatMul with a bias input and
 * a fused Clip, same numbers. */
static struct graph *mlp(void) {
    struct graph *g = graph_create();
    int64_t xd[2] = {-1, 8}, wd[2] = {8, 5}, bd[2] = {1, 5}, sd[0] = {};
    add_input(g, "x", DT_FP32, 2, xd);
    float w[40], b[5], lo = 0, hi = 0.5f;
    unsigned s = 5;
    for (int i = 0; i < 40; i++) w[i] = frand(&s);
    for (int i = 0; i < 5; i++) b[i] = frand(&s);
    add_const_f(g, "w", 2, wd, w);
    add_const_f(g, "b", 2, bd, b);
    add_const_f(g, "lo", 0, sd, &lo);
    add_const_f(g, "hi", 0, sd, &hi);
    node(g, "MatMul", (const char *[]){"x", "w"}, 2, (const char *[]){"m"}, 1);
    node(g, "Add", (const char *[]){"b", "m"}, 2, (const char *[]){"a"}, 1);
    node(g, "Clip", (const char *[]){"a", "lo", "hi"}, 3, (const char *[]){"y"}, 1);
    add_output(g, "y");
    sort(g);
    return g;
}

static void test_matmul_bias_clip_fusion(void **state) {
    (void)state;
    const struct op_def *mm = op_find("", "MatMul");
    if (!mm || !(mm->flags & OP_BIAS_INPUT) || !(mm->flags & OP_FUSE_ACT)) skip();
    float xd[24];
    unsigned s = 9;
    for (int i = 0; i < 24; i++) xd[i] = frand(&s);
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {3, 8}, .data = xd}, y1, y2;
    struct graph *ref = mlp();
    float *r = run1(ref, &in, &y1);
    struct graph *g = mlp();
    char err[256];
    assert_int_equal(passes_run(g, err, sizeof err), 0);
    assert_int_equal(g->nnodes, 1);
    assert_int_equal(g->nodes[0].nin, 3);
    assert_int_equal(g->nodes[0].act, ACT_CLIP);
    assert_float_equal(g->nodes[0].act_beta, 0.5f, 0);
    float *f = run1(g, &in, &y2);
    assert_true(tensor_same_shape(&y1, &y2));
    for (int i = 0; i < 15; i++) assert_float_equal(f[i], r[i], 1e-5);
    free(r);
    free(f);
    graph_free(ref);
    graph_free(g);
}

/* Constant subgraphs fold at load; the dead constants they read are freed;
 * a node whose output is a graph output is not fused away. */
static void test_fold_constants_and_dead_nodes(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int64_t d[1] = {3};
    float c1[3] = {1, 2, 3}, c2[3] = {10, 20, 30};
    add_input(g, "x", DT_FP32, 1, d);
    add_const_f(g, "c1", 1, d, c1);
    add_const_f(g, "c2", 1, d, c2);
    node(g, "Add", (const char *[]){"c1", "c2"}, 2, (const char *[]){"k"}, 1);
    node(g, "Neg", (const char *[]){"k"}, 1, (const char *[]){"nk"}, 1);
    node(g, "Mul", (const char *[]){"x", "nk"}, 2, (const char *[]){"y"}, 1);
    node(g, "Exp", (const char *[]){"x"}, 1, (const char *[]){"unused"}, 1);
    add_output(g, "y");
    sort(g);
    char err[256];
    assert_int_equal(passes_run(g, err, sizeof err), 0);
    assert_int_equal(g->nnodes, 1);
    assert_string_equal(g->nodes[0].op_type, "Mul");
    const struct tensor *nk = &g->values[graph_find_value(g, "nk")].t;
    assert_non_null(nk->data);
    assert_float_equal(((float *)nk->data)[2], -33, 0);
    assert_null(g->values[graph_find_value(g, "c1")].t.data); /* freed: nothing reads it */
    float xd[3] = {1, -1, 2};
    struct tensor in = {.dtype = DT_FP32, .ndim = 1, .dims = {3}, .data = xd}, y;
    float *yd = run1(g, &in, &y);
    assert_float_equal(yd[0], -11, 0);
    assert_float_equal(yd[1], 22, 0);
    assert_float_equal(yd[2], -66, 0);
    free(yd);
    graph_free(g);
}

/* The LRU keeps max_plans plans; an evicted plan still held by a runner
 * stays usable; a repeated shape is not rebuilt. */
static void test_plan_cache_lru(void **state) {
    (void)state;
    struct graph *g = diamond();
    struct plan_cache *c = plan_cache_create(2);
    struct backend *be = backend_cpu_create(NULL);
    struct plan_exec *x = plan_exec_create(be, 1);
    char err[256];
    float xd[5 * 4] = {0};
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {1, 5}, .data = xd};
    struct plan *held, *p;
    int built;
    assert_int_equal(plan_cache_get(c, g, &in, 0, be, 1, &held, &built, err, sizeof err), 0);
    assert_true(built);
    assert_int_equal(plan_cache_get(c, g, &in, 0, be, 1, &p, &built, err, sizeof err), 0);
    assert_false(built);
    assert_ptr_equal(p, held);
    plan_release(p);
    for (int b = 2; b <= 4; b++) {
        in.dims[0] = b;
        assert_int_equal(plan_cache_get(c, g, &in, 0, be, 1, &p, &built, err, sizeof err), 0);
        assert_true(built);
        plan_release(p);
    }
    assert_int_equal(plan_cache_size(c), 2);
    assert_int_equal(plan_cache_builds(c), 4);
    assert_int_equal(plan_cache_evictions(c), 2);
    /* The first plan was evicted but our reference keeps it alive. */
    in.dims[0] = 1;
    struct tensor out;
    assert_int_equal(plan_exec_run(x, held, &in, &out, err, sizeof err), 0);
    assert_int_equal(out.dims[0], 1);
    free(out.data);
    plan_release(held);
    assert_int_equal(plan_cache_get(c, g, &in, 0, be, 1, &p, &built, err, sizeof err), 0);
    assert_true(built);
    plan_release(p);
    plan_exec_free(x);
    backend_free(be);
    plan_cache_free(c);
    graph_free(g);
}

/* Shapes cycled through a cache too small for them: the plans it evicts
 * come back, so it doubles (up to its limit) and stops rebuilding them. */
static void test_plan_cache_grows_on_rebuilds(void **state) {
    (void)state;
    struct graph *g = diamond();
    struct plan_cache *c = plan_cache_create(2);
    plan_cache_set_limit(c, 8);
    struct backend *be = backend_cpu_create(NULL);
    char err[256];
    float xd[5 * 4] = {0};
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {1, 5}, .data = xd};
    struct plan *p;
    int built;
    for (int round = 0; round < 3; round++)
        for (int b = 1; b <= 4; b++) {
            in.dims[0] = b;
            assert_int_equal(plan_cache_get(c, g, &in, 0, be, 1, &p, &built, err, sizeof err), 0);
            assert_int_equal(built, round == 0 || (round == 1 && b <= 2));
            plan_release(p);
        }
    assert_int_equal(plan_cache_max(c), 4);
    assert_int_equal(plan_cache_size(c), 4);
    assert_int_equal(plan_cache_builds(c), 6);
    assert_int_equal(plan_cache_rebuilds(c), 2);
    /* Without a limit above its bound, a cache never grows. */
    struct plan_cache *fixed = plan_cache_create(2);
    for (int round = 0; round < 2; round++)
        for (int b = 1; b <= 4; b++) {
            in.dims[0] = b;
            assert_int_equal(plan_cache_get(fixed, g, &in, 0, be, 1, &p, &built, err, sizeof err), 0);
            plan_release(p);
        }
    assert_int_equal(plan_cache_max(fixed), 2);
    assert_int_equal(plan_cache_builds(fixed), 8);
    plan_cache_free(fixed);
    backend_free(be);
    plan_cache_free(c);
    graph_free(g);
}

/* An input that decides a shape: bound by value, a new plan per value. */
static void test_bound_input_values(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int64_t d[2] = {2, 6}, sd[1] = {2};
    add_input(g, "x", DT_FP32, 2, d);
    add_input(g, "shape", DT_INT64, 1, sd);
    node(g, "Reshape", (const char *[]){"x", "shape"}, 2, (const char *[]){"r"}, 1);
    node(g, "Neg", (const char *[]){"r"}, 1, (const char *[]){"y"}, 1);
    add_output(g, "y");
    sort(g);
    float xd[12] = {0};
    int64_t s1[2] = {3, 4}, s2[2] = {4, 3};
    struct tensor in[2] = {{.dtype = DT_FP32, .ndim = 2, .dims = {2, 6}, .data = xd},
                           {.dtype = DT_INT64, .ndim = 1, .dims = {2}, .data = s1}};
    struct plan *p;
    char err[256];
    assert_true(plan_build(g, in, 0, NULL, 2, &p, err, sizeof err) != 0);
    assert_non_null(strstr(err, "Reshape"));
    assert_int_equal(plan_build(g, in, 2, NULL, 2, &p, err, sizeof err), 0);
    assert_true(plan_matches(p, in, 2));
    in[1].data = s2;
    assert_false(plan_matches(p, in, 2));
    plan_release(p);
    graph_free(g);
}

/* Kernel errors come back with the node's name. */
static void test_kernel_error_propagates(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int64_t a[2] = {2, 3}, b[2] = {4, 5};
    add_input(g, "a", DT_FP32, 2, a);
    add_input(g, "b", DT_FP32, 2, b);
    int n = node(g, "Add", (const char *[]){"a", "b"}, 2, (const char *[]){"y"}, 1);
    (void)n;
    add_output(g, "y");
    sort(g);
    struct tensor in[2] = {{.dtype = DT_FP32, .ndim = 2, .dims = {2, 3}}, {.dtype = DT_FP32, .ndim = 2, .dims = {4, 5}}};
    struct plan *p = NULL;
    char err[256] = "";
    int rc = plan_build(g, in, 0, NULL, 2, &p, err, sizeof err);
    assert_true(rc < 0);
    assert_null(p);
    assert_non_null(strstr(err, g->nodes[0].name));
    graph_free(g);
}

/* A real network: every value of SqueezeNet's plan is placed without
 * overlap, and the arena is well under the sum of its values (6.9 MB for
 * 17.8 MB; the first conv's output and the pool after it, live together,
 * are 5.7 MB). */
static void test_squeezenet_memory_plan(void **state) {
    (void)state;
    char err[512];
    struct graph *g = onnx_load_file(DATA "/light/light_squeezenet.onnx", err, sizeof err);
    if (!g) skip(); /* an op it uses is not built in */
    assert_int_equal(passes_run(g, err, sizeof err), 0);
    struct tensor in = {.dtype = DT_FP32, .ndim = 4, .dims = {1, 3, 224, 224}};
    struct plan *p;
    if (plan_build(g, &in, 0, NULL, 2, &p, err, sizeof err)) fail_msg("%s", err);
    check_no_overlap(p, g);
    size_t total = 0;
    for (int v = 0; v < g->nvalues; v++) {
        size_t size;
        if (plan_value_info(p, v, NULL, NULL, &size, NULL, NULL) == PLAN_VALUE_ARENA) total += size;
    }
    if (plan_arena_size(p) * 2 >= total) fail_msg("arena %zu bytes for %zu bytes of values", plan_arena_size(p), total);
    plan_release(p);
    graph_free(g);
}


/* ---- a pretend device backend ------------------------------------------------------
 * Host memory behind a device-style interface (host_memory = 0), counting
 * copies, running only Relu and Add itself: everything else must fall back
 * to the CPU with explicit copies, and the answers must not change. */
struct fake_dev {
    int copies_in, copies_out, runs, syncs, live_buffers;
};

static void fd_free(struct backend *be) {
    free(be->context);
    free(be);
}
static void *fd_alloc(struct backend *be, size_t n) {
    ((struct fake_dev *)be->context)->live_buffers++;
    return aligned_alloc(64, (n + 63) & ~(size_t)63);
}
static void fd_buf_free(struct backend *be, void *p) {
    ((struct fake_dev *)be->context)->live_buffers--;
    free(p);
}
static int fd_to_dev(struct backend *be, void *d, const void *s, size_t n) {
    ((struct fake_dev *)be->context)->copies_in++;
    memcpy(d, s, n);
    return 0;
}
static int fd_to_host(struct backend *be, void *d, const void *s, size_t n) {
    ((struct fake_dev *)be->context)->copies_out++;
    memcpy(d, s, n);
    return 0;
}
static int fd_supports(struct backend *be, const struct op_call *c) {
    return strcmp(c->node->op_type, "Relu") == 0 || strcmp(c->node->op_type, "Add") == 0;
}
static int fd_prepare(struct backend *be, struct op_call *c, void **st, size_t *ws) {
    *st = NULL;
    *ws = 0;
    return 0;
}
static int fd_run(struct backend *be, struct op_call *c) {
    ((struct fake_dev *)be->context)->runs++;
    return c->node->op->run(c);
}
static void fd_release(struct backend *be, const struct graph_node *n, void *st) {}
static int fd_sync(struct backend *be) {
    ((struct fake_dev *)be->context)->syncs++;
    return 0;
}
static const struct backend_i fd_iface = {
    .name = "fake", .free = fd_free, .buffer_alloc = fd_alloc, .buffer_free = fd_buf_free,
    .copy_to_device = fd_to_dev, .copy_to_host = fd_to_host, .supports_op = fd_supports,
    .prepare_node = fd_prepare, .run_node = fd_run, .release_node = fd_release, .synchronize = fd_sync,
};

static void test_device_backend_with_fallback(void **state) {
    (void)state;
    /* x -> Relu -> a; Sigmoid(a) on the CPU -> b; a + b -> c (device); c * x (CPU) -> y;
     * plus a constant added on the device. */
    struct graph *g = diamond();
    struct backend *be = calloc(1, sizeof *be);
    struct fake_dev *fd = calloc(1, sizeof *fd);
    be->iface = &fd_iface;
    be->context = fd;
    be->device = 0;
    be->host_memory = 0;
    float xd[15];
    unsigned s = 21;
    for (int i = 0; i < 15; i++) xd[i] = frand(&s) * 3;
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {3, 5}, .data = xd}, ref, out;
    float *r = run1(g, &in, &ref);
    struct plan_exec *x = plan_exec_create(be, 1);
    struct plan *p;
    char err[256];
    assert_int_equal(plan_build(g, &in, 0, be, 1, &p, err, sizeof err), 0);
    check_no_overlap(p, g);
    for (int rep = 0; rep < 2; rep++) {
        assert_int_equal(plan_exec_run(x, p, &in, &out, err, sizeof err), 0);
        assert_memory_equal(out.data, r, sizeof xd);
        free(out.data);
    }
    assert_int_equal(fd->runs, 4);      /* Relu and Add, twice */
    assert_true(fd->copies_in >= 2 * 3); /* input, Sigmoid's and Mul's results back */
    assert_true(fd->copies_out >= 2 * 3);
    plan_release(p);

    /* Constants a device step reads are uploaded once per plan: Add's bias. */
    struct graph *g2 = mlp();
    float xm[24];
    for (int i = 0; i < 24; i++) xm[i] = frand(&s);
    struct tensor in2 = {.dtype = DT_FP32, .ndim = 2, .dims = {3, 8}, .data = xm}, ref2, out2;
    float *r2 = run1(g2, &in2, &ref2);
    assert_int_equal(plan_build(g2, &in2, 0, be, 1, &p, err, sizeof err), 0);
    int before = fd->copies_in;
    assert_int_equal(plan_exec_run(x, p, &in2, &out2, err, sizeof err), 0);
    for (int i = 0; i < 15; i++) assert_float_equal(((float *)out2.data)[i], r2[i], 1e-6);
    free(out2.data);
    int per_run = fd->copies_in - before;
    assert_int_equal(plan_exec_run(x, p, &in2, &out2, err, sizeof err), 0);
    assert_int_equal(fd->copies_in - before, 2 * per_run);
    free(out2.data);
    free(r2);
    plan_release(p);
    plan_exec_free(x); /* it holds the plan it ran last, which reads the graph */
    graph_free(g2);
    assert_int_equal(fd->live_buffers, 0); /* arena and constants handed back */
    backend_free(be);
    free(r);
    graph_free(g);
}

/* Folding refuses to create large constants from small ones (an Expand or
 * ConstantOfShape of a scalar) but keeps a Transpose of a large weight. */
static void test_fold_size_limit(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int64_t sd[1] = {2}, shape[2] = {600, 600}, wd[2] = {300, 400};
    add_const(g, "shape", DT_INT64, 1, sd, shape);
    float *w = calloc(300 * 400, sizeof(float));
    w[1] = 7;
    add_const_f(g, "w", 2, wd, w);
    free(w);
    int a = node(g, "ConstantOfShape", (const char *[]){"shape"}, 1, (const char *[]){"big"}, 1);
    int b = node(g, "Transpose", (const char *[]){"w"}, 1, (const char *[]){"wt"}, 1);
    const struct tensor *in_a[1] = {&g->values[graph_find_value(g, "shape")].t};
    const struct tensor *in_b[1] = {&g->values[graph_find_value(g, "w")].t};
    struct tensor out;
    char err[256];
    /* 1.44 MB from 16 bytes, limit 1 MB: refused, nothing allocated. */
    assert_int_equal(eval_node(&g->nodes[a], in_a, 1, &out, 1, 1 << 20, err, sizeof err), EVAL_TOO_LARGE);
    assert_int_equal(eval_node(&g->nodes[a], in_a, 1, &out, 1, 2 << 20, err, sizeof err), 0);
    assert_int_equal(out.dims[0], 600);
    free(out.data);
    /* 480 KB from 480 KB, limit 1 KB: allowed, it adds nothing. */
    assert_int_equal(eval_node(&g->nodes[b], in_b, 1, &out, 1, 1024, err, sizeof err), 0);
    assert_int_equal(out.dims[0], 400);
    assert_float_equal(((float *)out.data)[300], 7, 0);
    free(out.data);
    graph_free(g);
}

/* Graph capture: the pretend device records calls between graph_begin and
 * graph_end without running them (as CUDA stream capture does) and replays
 * the record. The executor captures on the second run and replays after. */
static struct op_call *fd_rec[64];
static int fd_nrec, fd_capturing, fd_replays;

static int fdg_run(struct backend *be, struct op_call *c) {
    if (fd_capturing) {
        fd_rec[fd_nrec++] = c;
        return 0;
    }
    return fd_run(be, c);
}
static int fdg_begin(struct backend *be) {
    fd_capturing = 1;
    fd_nrec = 0;
    return 0;
}
static int fdg_end(struct backend *be, void **graph) {
    fd_capturing = 0;
    *graph = fd_rec;
    return 0;
}
static int fdg_replay(struct backend *be, void *graph) {
    fd_replays++;
    for (int i = 0; i < fd_nrec; i++)
        if (fd_run(be, fd_rec[i])) return -1;
    return 0;
}
static void fdg_free(struct backend *be, void *graph) { fd_nrec = 0; }

static const struct backend_i fdg_iface = {
    .name = "fake-graph", .free = fd_free, .buffer_alloc = fd_alloc, .buffer_free = fd_buf_free,
    .copy_to_device = fd_to_dev, .copy_to_host = fd_to_host, .supports_op = fd_supports,
    .prepare_node = fd_prepare, .run_node = fdg_run, .release_node = fd_release, .synchronize = fd_sync,
    .graph_begin = fdg_begin, .graph_end = fdg_end, .graph_replay = fdg_replay, .graph_free = fdg_free,
};

static void test_device_graph_capture(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int64_t d[1] = {6};
    add_input(g, "x", DT_FP32, 1, d);
    node(g, "Relu", (const char *[]){"x"}, 1, (const char *[]){"a"}, 1);
    node(g, "Add", (const char *[]){"a", "x"}, 2, (const char *[]){"y"}, 1);
    add_output(g, "y");
    sort(g);
    struct backend *be = calloc(1, sizeof *be);
    struct fake_dev *fd = calloc(1, sizeof *fd);
    be->iface = &fdg_iface;
    be->context = fd;
    be->host_memory = 0;
    struct plan_exec *x = plan_exec_create(be, 1);
    struct plan *p;
    char err[256];
    assert_int_equal(plan_build(g, &(struct tensor){.dtype = DT_FP32, .ndim = 1, .dims = {6}}, 0, be, 1, &p, err,
                                sizeof err), 0);
    for (int run = 0; run < 4; run++) {
        float xd[6] = {-1, 2, -3, 4, -5, (float)run};
        struct tensor in = {.dtype = DT_FP32, .ndim = 1, .dims = {6}, .data = xd}, out;
        assert_int_equal(plan_exec_run(x, p, &in, &out, err, sizeof err), 0);
        const float *y = out.data;
        for (int i = 0; i < 6; i++) assert_float_equal(y[i], (xd[i] > 0 ? xd[i] : 0) + xd[i], 0);
        free(out.data);
    }
    assert_int_equal(fd_nrec, 2);    /* Relu and Add recorded once */
    assert_int_equal(fd_replays, 3); /* runs 2 (right after capture), 3 and 4 */
    assert_int_equal(fd->runs, 2 + 3 * 2);
    plan_release(p);
    plan_exec_free(x);
    assert_int_equal(fd_nrec, 0); /* the graph was freed with the executor */
    assert_int_equal(fd->live_buffers, 0);
    backend_free(be);
    graph_free(g);
}

/* An activation after a kernel that cannot fuse it (Add, BatchNormalization
 * in DenseNet) is applied in place by the executor right after that kernel:
 * one step, no extra buffer, same numbers. */
static void test_activation_after_add(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int64_t d[2] = {2, 3};
    add_input(g, "a", DT_FP32, 2, d);
    add_input(g, "b", DT_FP32, 2, d);
    node(g, "Add", (const char *[]){"a", "b"}, 2, (const char *[]){"s"}, 1);
    int lr = node(g, "LeakyRelu", (const char *[]){"s"}, 1, (const char *[]){"y"}, 1);
    attr_float(g, lr, "alpha", 0.25f);
    add_output(g, "y");
    sort(g);
    float ad[6] = {1, -2, 3, -4, 5, -6}, bd[6] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    struct tensor in[2] = {{.dtype = DT_FP32, .ndim = 2, .dims = {2, 3}, .data = ad},
                           {.dtype = DT_FP32, .ndim = 2, .dims = {2, 3}, .data = bd}}, y;
    struct plan *p;
    char err[256];
    assert_int_equal(plan_build(g, in, 0, NULL, 1, &p, err, sizeof err), 0);
    assert_int_equal(plan_nsteps(p), 1);
    size_t o1, o2;
    plan_value_info(p, graph_find_value(g, "s"), NULL, &o1, NULL, NULL, NULL);
    plan_value_info(p, graph_find_value(g, "y"), NULL, &o2, NULL, NULL, NULL);
    assert_true(o1 == o2);
    plan_release(p);
    float *yd = run1(g, in, &y);
    for (int i = 0; i < 6; i++) {
        float s = ad[i] + bd[i];
        assert_float_equal(yd[i], s >= 0 ? s : 0.25f * s, 1e-6);
    }
    free(yd);
    graph_free(g);
}

/* Conv without a bias -> Add(constant [1,M,1,1]) -> Relu: the constant
 * becomes the Conv's bias, the Relu its fused activation. */
static struct graph *conv_add_relu(void) {
    struct graph *g = graph_create();
    int64_t xd[4] = {1, 2, 5, 5}, wd[4] = {3, 2, 3, 3}, bd[4] = {1, 3, 1, 1};
    add_input(g, "x", DT_FP32, 4, xd);
    float w[54], b[3] = {0.5f, -1, 2};
    unsigned s = 17;
    for (int i = 0; i < 54; i++) w[i] = frand(&s);
    add_const_f(g, "w", 4, wd, w);
    add_const_f(g, "b", 4, bd, b);
    node(g, "Conv", (const char *[]){"x", "w"}, 2, (const char *[]){"c"}, 1);
    node(g, "Add", (const char *[]){"c", "b"}, 2, (const char *[]){"a"}, 1);
    node(g, "Relu", (const char *[]){"a"}, 1, (const char *[]){"y"}, 1);
    add_output(g, "y");
    sort(g);
    return g;
}

static void test_conv_add_bias_fusion(void **state) {
    (void)state;
    float xd[50];
    unsigned s = 19;
    for (int i = 0; i < 50; i++) xd[i] = frand(&s);
    struct tensor in = {.dtype = DT_FP32, .ndim = 4, .dims = {1, 2, 5, 5}, .data = xd}, y1, y2;
    struct graph *ref = conv_add_relu();
    float *r = run1(ref, &in, &y1);
    struct graph *g = conv_add_relu();
    char err[256];
    assert_int_equal(passes_run(g, err, sizeof err), 0);
    assert_int_equal(g->nnodes, 1);
    assert_int_equal(g->nodes[0].nin, 3);
    assert_int_equal(g->values[g->nodes[0].in[2]].t.ndim, 1);
    assert_int_equal(g->nodes[0].act, ACT_RELU);
    float *f = run1(g, &in, &y2);
    assert_true(tensor_same_shape(&y1, &y2));
    for (int i = 0; i < 27; i++) assert_float_equal(f[i], r[i], 1e-5);
    free(r);
    free(f);
    graph_free(ref);
    graph_free(g);
}

/* BatchNormalization -> Mul(per-channel) -> Add(per-channel) -> Relu and
 * Conv -> Div(scalar) -> Sub(per-channel) fold into the BN and the Conv;
 * numbers unchanged. */
static struct graph *affine_graph(void) {
    struct graph *g = graph_create();
    int64_t xd[4] = {1, 3, 4, 4}, cd[1] = {3}, c3[3] = {3, 1, 1}, wd[4] = {2, 3, 1, 1}, c2[3] = {2, 1, 1}, sd[0] = {};
    add_input(g, "x", DT_FP32, 4, xd);
    float sc[3] = {1, 2, 0.5f}, be[3] = {0, 1, -1}, mu[3] = {0.1f, 0.2f, 0.3f}, var[3] = {1, 2, 3};
    float m3[3] = {2, -1, 3}, a3[3] = {0.5f, 0.25f, -2}, w[6] = {1, -1, 2, 0.5f, 0.25f, -3}, dv = 4, s2[2] = {1, -1};
    add_const_f(g, "sc", 1, cd, sc);
    add_const_f(g, "be", 1, cd, be);
    add_const_f(g, "mu", 1, cd, mu);
    add_const_f(g, "var", 1, cd, var);
    add_const_f(g, "m3", 3, c3, m3);
    add_const_f(g, "a3", 3, c3, a3);
    add_const_f(g, "w", 4, wd, w);
    add_const_f(g, "dv", 0, sd, &dv);
    add_const_f(g, "s2", 3, c2, s2);
    node(g, "BatchNormalization", (const char *[]){"x", "sc", "be", "mu", "var"}, 5, (const char *[]){"bn"}, 1);
    node(g, "Mul", (const char *[]){"m3", "bn"}, 2, (const char *[]){"m"}, 1);
    node(g, "Add", (const char *[]){"m", "a3"}, 2, (const char *[]){"a"}, 1);
    node(g, "Relu", (const char *[]){"a"}, 1, (const char *[]){"r"}, 1);
    node(g, "Conv", (const char *[]){"r", "w"}, 2, (const char *[]){"c"}, 1);
    node(g, "Div", (const char *[]){"c", "dv"}, 2, (const char *[]){"d"}, 1);
    node(g, "Sub", (const char *[]){"d", "s2"}, 2, (const char *[]){"y"}, 1);
    add_output(g, "y");
    sort(g);
    return g;
}

static void test_affine_folding(void **state) {
    (void)state;
    float xd[48];
    unsigned s = 23;
    for (int i = 0; i < 48; i++) xd[i] = frand(&s) * 2;
    struct tensor in = {.dtype = DT_FP32, .ndim = 4, .dims = {1, 3, 4, 4}, .data = xd}, y1, y2;
    struct graph *ref = affine_graph();
    float *r = run1(ref, &in, &y1);
    struct graph *g = affine_graph();
    char err[256];
    assert_int_equal(passes_run(g, err, sizeof err), 0);
    assert_int_equal(g->nnodes, 3); /* BN, Relu (BN fuses no activation), Conv */
    assert_string_equal(g->nodes[0].op_type, "BatchNormalization");
    assert_string_equal(g->nodes[2].op_type, "Conv");
    float *f = run1(g, &in, &y2);
    assert_true(tensor_same_shape(&y1, &y2));
    for (int i = 0; i < 32; i++) assert_float_equal(f[i], r[i], 1e-5);
    free(r);
    free(f);
    graph_free(ref);
    graph_free(g);
}

/* A long chain (more buffers than placement by size handles) is planned by
 * the linear scan: still no overlap, and still about two buffers. Also a
 * diamond-rich graph: many values live at once. */
static void test_long_chain_linear_scan(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int64_t d[1] = {100};
    add_input(g, "v0", DT_FP32, 1, d);
    char a[16], b[16], c[16];
    int n = 5000;
    for (int i = 0; i < n; i++) {
        snprintf(a, sizeof a, "v%d", i);
        snprintf(b, sizeof b, "v%d", i + 1);
        if (i % 7 == 3) { /* a value read again later: longer live ranges */
            snprintf(c, sizeof c, "v%d", i - 3);
            node(g, "Add", (const char *[]){a, c}, 2, (const char *[]){b}, 1);
        } else {
            node(g, i % 2 ? "Neg" : "Abs", (const char *[]){a}, 1, (const char *[]){b}, 1);
        }
    }
    snprintf(b, sizeof b, "v%d", n);
    add_output(g, b);
    sort(g);
    float xd[100];
    for (int i = 0; i < 100; i++) xd[i] = (float)i - 50;
    struct tensor in = {.dtype = DT_FP32, .ndim = 1, .dims = {100}, .data = xd}, y;
    struct plan *p;
    char err[256];
    assert_int_equal(plan_build(g, &in, 0, NULL, 1, &p, err, sizeof err), 0);
    assert_int_equal(plan_nsteps(p), n);
    check_no_overlap(p, g);
    assert_true(plan_arena_size(p) <= 6 * 448);
    plan_release(p);
    float *yd = run1(g, &in, &y);
    assert_int_equal(y.dims[0], 100);
    free(yd);
    graph_free(g);
}

/* Plans of one device cache share the device copies of graph constants:
 * a second batch size uploads nothing again; everything is handed back. */
static void test_device_constants_shared(void **state) {
    (void)state;
    struct graph *g = mlp();
    struct backend *be = calloc(1, sizeof *be);
    struct fake_dev *fd = calloc(1, sizeof *fd);
    be->iface = &fd_iface;
    be->context = fd;
    be->host_memory = 0;
    struct plan_cache *c = plan_cache_create(4);
    struct plan_exec *x = plan_exec_create(be, 1);
    float xm[5 * 8];
    unsigned s = 29;
    for (int i = 0; i < 40; i++) xm[i] = frand(&s);
    char err[256];
    int uploads[2];
    for (int b = 0; b < 2; b++) {
        struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {b ? 5 : 3, 8}, .data = xm}, ref, out;
        int before = fd->copies_in;
        struct plan *p;
        assert_int_equal(plan_cache_get(c, g, &in, 0, be, 1, &p, NULL, err, sizeof err), 0);
        uploads[b] = fd->copies_in - before;
        float *r = run1(g, &in, &ref);
        assert_int_equal(plan_exec_run(x, p, &in, &out, err, sizeof err), 0);
        for (int i = 0; i < (b ? 25 : 15); i++) assert_float_equal(((float *)out.data)[i], r[i], 1e-6);
        free(out.data);
        free(r);
        plan_release(p);
    }
    assert_int_equal(uploads[0], 1); /* Add's bias: the only constant a device step reads */
    assert_int_equal(uploads[1], 0);
    plan_exec_free(x);
    plan_cache_free(c);
    assert_int_equal(fd->live_buffers, 0);
    backend_free(be);
    graph_free(g);
}


/* ---- shapes that follow computed values ------------------------------------------ */

/* A branch of an If: its one output is either the captured value 'picked'
 * (then) or a constant [-1] (else). */
static struct graph *branch(int then) {
    struct graph *b = graph_create();
    assert_non_null(b);
    if (then) {
        add_input(b, "picked", DT_FP32, 1, (int64_t[]){-1});
        b->ncaptured = 1;
        b->capture_in = malloc(sizeof(int));
        b->capture_in[0] = 1; /* the If node's input 1 */
        node(b, "Identity", (const char *[]){"picked"}, 1, (const char *[]){"sel"}, 1);
    } else {
        add_const_f(b, "sel", 1, (int64_t[]){1}, (float[]){-1});
    }
    add_output(b, "sel");
    sort(b);
    return b;
}

/* x [6] -> picked = x[x > 0] (NonZero, Transpose, GatherND), total =
 * ReduceSum(picked), sel = If(total > 1, picked, [-1]): every shape after
 * NonZero follows x's values. */
static struct graph *value_shaped_graph(void) {
    struct graph *g = graph_create();
    assert_non_null(g);
    add_input(g, "x", DT_FP32, 1, (int64_t[]){6});
    add_const_f(g, "zero", 0, NULL, (float[]){0});
    add_const_f(g, "one", 0, NULL, (float[]){1});
    node(g, "Greater", (const char *[]){"x", "zero"}, 2, (const char *[]){"mask"}, 1);
    node(g, "NonZero", (const char *[]){"mask"}, 1, (const char *[]){"idx"}, 1);
    int t = node(g, "Transpose", (const char *[]){"idx"}, 1, (const char *[]){"idxT"}, 1);
    attr_ints(g, t, "perm", 2, (int64_t[]){1, 0});
    node(g, "GatherND", (const char *[]){"x", "idxT"}, 2, (const char *[]){"picked"}, 1);
    int r = node(g, "ReduceSum", (const char *[]){"picked"}, 1, (const char *[]){"total"}, 1);
    attr_int(g, r, "keepdims", 0);
    node(g, "Greater", (const char *[]){"total", "one"}, 2, (const char *[]){"cond"}, 1);
    int in[2] = {val(g, "cond"), val(g, "picked")}, out[1] = {val(g, "sel")};
    int f = graph_add_node(g, "if", "If", "", in, 2, out, 1);
    assert_true(f >= 0);
    g->nodes[f].op = control_op_find("", "If");
    g->nodes[f].opset = 17;
    assert_non_null(g->nodes[f].op);
    static const char *const names[2] = {"then_branch", "else_branch"};
    for (int b = 0; b < 2; b++) {
        struct graph_attr *a = new_attr(g, f, names[b], ATTR_GRAPH);
        a->n = 1;
        a->graphs = malloc(sizeof *a->graphs);
        a->graphs[0] = branch(!b);
    }
    add_output(g, "picked");
    add_output(g, "total");
    add_output(g, "sel");
    sort(g);
    return g;
}

static void check_values(const struct tensor *t, const float *want, int64_t n) {
    assert_int_equal(t->dtype, DT_FP32);
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->dims[0], n);
    for (int64_t i = 0; i < n; i++) assert_float_equal(((const float *)t->data)[i], want[i], 0);
}

/* No plan holds NonZero of a computed mask: building says so with its own
 * status; the graph then runs node by node, each case checked by hand. */
static void test_value_driven_run(void **state) {
    (void)state;
    struct graph *g = value_shaped_graph();
    static const float xs[3][6] = {{0.5f, -1, 2, 0, 3, -2}, {0.25f, -1, -2, 0, 0, 0.5f}, {-1, -2, -3, 0, -4, -5}};
    static const float picked[3][3] = {{0.5f, 2, 3}, {0.25f, 0.5f}, {0}};
    static const int64_t npicked[3] = {3, 2, 0};
    static const float total[3] = {5.5f, 0.75f, 0};
    struct tensor x = {.dtype = DT_FP32, .ndim = 1, .dims = {6}, .data = (void *)xs[0]};
    struct plan *p = NULL;
    char err[512] = "";
    assert_int_equal(plan_build(g, &x, 0, NULL, 1, &p, err, sizeof err), STATUS_DATA_DEPENDENT);
    assert_null(p);
    assert_non_null(strstr(err, "NonZero"));
    for (int k = 0; k < 3; k++) {
        struct tensor outs[3];
        x.data = (void *)xs[k];
        int rc = valrun_graph(g, &x, outs, err, sizeof err);
        if (rc) fail_msg("valrun_graph: %s", err);
        check_values(&outs[0], picked[k], npicked[k]);
        assert_int_equal(outs[1].ndim, 0);
        assert_float_equal(*(const float *)outs[1].data, total[k], 1e-6);
        if (total[k] > 1) check_values(&outs[2], picked[k], npicked[k]);
        else check_values(&outs[2], (const float[]){-1}, 1);
        for (int o = 0; o < 3; o++) tensor_free_data(&outs[o]);
    }
    /* A bad value is a clear error, and nothing is left allocated. */
    struct tensor bad = {.dtype = DT_INT64, .ndim = 1, .dims = {6}, .data = (int64_t[6]){1, 2, 3, 4, 5, 6}};
    struct tensor outs[3];
    assert_true(valrun_graph(g, &bad, outs, err, sizeof err) < 0);
    assert_non_null(strstr(err, "node '"));
    for (int o = 0; o < 3; o++) assert_null(outs[o].data);
    graph_free(g);
}

/* ---- threads per step ------------------------------------------------------------
 * A real exported model (tests/data/modelset/bert_s, transformers' BERT with
 * a small config) at two threads: its small steps get one thread, those in
 * between are timed on the plan's first run and each keeps a count, and the
 * outputs are the same bytes as with every step on both threads
 * (KILN_STEP_THREADS=0), as without the timing, and as on one thread
 * (within float rounding under oneDNN's AVX2 GEMM). */

struct threads_run {
    struct tensor out[2];
    int nsteps, one, measured;
};

static void run_with_step_threads(const struct graph *g, struct backend *be, const struct tensor *in, int nthreads,
                                  const char *mode, struct threads_run *r) {
    char err[512] = "";
    setenv("KILN_STEP_THREADS", mode, 1);
    struct plan *p = NULL;
    if (plan_build(g, in, 0, be, nthreads, &p, err, sizeof err)) fail_msg("plan_build: %s", err);
    unsetenv("KILN_STEP_THREADS");
    struct plan_exec *x = plan_exec_create(be, nthreads);
    assert_non_null(x);
    for (int k = 0; k < 3; k++) { /* the first run times, the others use the choices */
        struct tensor out[2];
        if (plan_exec_run(x, p, in, out, err, sizeof err)) fail_msg("plan_exec_run (%s): %s", mode, err);
        if (k == 0) memcpy(r->out, out, sizeof out);
        for (int o = 0; o < 2 && k > 0; o++) {
            assert_int_equal(tensor_nbytes(&out[o]), tensor_nbytes(&r->out[o]));
            assert_memory_equal(out[o].data, r->out[o].data, tensor_nbytes(&out[o]));
            tensor_free_data(&out[o]);
        }
    }
    r->nsteps = plan_nsteps(p);
    r->one = r->measured = 0;
    for (int i = 0; i < r->nsteps; i++) {
        int nt = plan_step_threads(p, i);
        if (nt != 1 && nt != nthreads) fail_msg("step %d: %d threads (plan: %d)", i, nt, nthreads);
        r->one += nt == 1;
        r->measured += plan_step_measured(p, i);
    }
    assert_int_equal(r->measured, plan_nmeasured(p));
    plan_exec_free(x);
    plan_release(p);
}

static void test_step_threads(void **state) {
    (void)state;
    char err[512];
    struct graph *g = onnx_load_file("tests/data/modelset/bert_s/model.onnx", err, sizeof err);
    if (!g) fail_msg("%s", err);
    assert_int_equal(passes_run(g, err, sizeof err), 0);
    int64_t ids[64], mask[64];
    uint64_t seed = 7;
    for (int i = 0; i < 64; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int64_t)(seed >> 33) % 1000; /* the vocabulary's size */
        mask[i] = i < 48;
    }
    struct tensor in[2] = {{.dtype = DT_INT64, .ndim = 2, .dims = {1, 64}, .data = ids},
                           {.dtype = DT_INT64, .ndim = 2, .dims = {1, 64}, .data = mask}};
    struct backend *be = backend_cpu_create(&(struct backend_params){.device = -1, .nthreads = 2});
    assert_non_null(be);
    struct threads_run all, fixed, timed, single;
    run_with_step_threads(g, be, in, 2, "0", &all);
    run_with_step_threads(g, be, in, 2, "static", &fixed);
    run_with_step_threads(g, be, in, 2, "measure", &timed);
    run_with_step_threads(g, be, in, 1, "measure", &single);
    assert_true(all.nsteps > 20);
    assert_int_equal(all.one, 0); /* every step on both threads */
    assert_int_equal(all.measured, 0);
    assert_true(fixed.one > 0 && fixed.one < fixed.nsteps); /* the small steps on one */
    assert_int_equal(fixed.measured, 0);
    assert_true(timed.measured > 0); /* the steps in between were timed */
    assert_true(timed.one >= fixed.one);
    assert_int_equal(single.one, single.nsteps);
    assert_int_equal(single.measured, 0);
    /* oneDNN's AVX2 GEMM rounds the columns a thread's block leaves over
     * differently (kernels/cpu/dnnl_util.h): its bits depend on the thread
     * count, so there the runs agree to float rounding. */
    const struct threads_run *runs[3] = {&fixed, &timed, &single};
    for (int r = 0; r < 3; r++)
        for (int o = 0; o < 2; o++) {
            assert_int_equal(tensor_nbytes(&runs[r]->out[o]), tensor_nbytes(&all.out[o]));
            if (!dnnl_util_isa_avx2()) {
                assert_memory_equal(runs[r]->out[o].data, all.out[o].data, tensor_nbytes(&all.out[o]));
                continue;
            }
            const float *a = runs[r]->out[o].data, *w = all.out[o].data;
            for (int64_t i = 0, n = tensor_numel(&all.out[o]); i < n; i++)
                if (fabsf(a[i] - w[i]) > 1e-5f * fabsf(w[i]) + 1e-6f) fail_msg("output %d [%lld]: %g vs %g", o, (long long)i, a[i], w[i]);
        }
    for (int o = 0; o < 2; o++) {
        tensor_free_data(&all.out[o]);
        tensor_free_data(&fixed.out[o]);
        tensor_free_data(&timed.out[o]);
        tensor_free_data(&single.out[o]);
    }
    backend_free(be);
    graph_free(g);
}

/* A model fed many shapes: once enough of the cache's plans were timed, a
 * new plan takes what most of them kept instead of timing again, and its
 * results stay those of a plan built alone. */
static void test_step_threads_inherited(void **state) {
    (void)state;
    char err[512];
    struct graph *g = onnx_load_file("tests/data/modelset/bert_s/model.onnx", err, sizeof err);
    if (!g) fail_msg("%s", err);
    assert_int_equal(passes_run(g, err, sizeof err), 0);
    struct backend *be = backend_cpu_create(&(struct backend_params){.device = -1, .nthreads = 2});
    assert_non_null(be);
    struct plan_cache *c = plan_cache_create(16);
    struct plan_exec *x = plan_exec_create(be, 2);
    assert_non_null(c);
    assert_non_null(x);
    int64_t ids[96], mask[96];
    for (int i = 0; i < 96; i++) ids[i] = (i * 37) % 1000, mask[i] = 1;
    int timed = 0, one = 0, all = 0, inherited = 0;
    for (int len = 4; len <= 26; len += 2) {
        struct tensor in[2] = {{.dtype = DT_INT64, .ndim = 2, .dims = {1, len}, .data = ids},
                               {.dtype = DT_INT64, .ndim = 2, .dims = {1, len}, .data = mask}};
        struct plan *p = NULL;
        int built = 0;
        if (plan_cache_get(c, g, in, 0, be, 2, &p, &built, err, sizeof err)) fail_msg("plan_cache_get: %s", err);
        assert_true(built);
        /* Would the cache have passed its choice on? */
        int agree = timed >= 4 && one != all;
        struct tensor out[2], ref[2];
        if (plan_exec_run(x, p, in, out, err, sizeof err)) fail_msg("plan_exec_run: %s", err);
        int pick = plan_threads_pick(p);
        if (plan_nmeasured(p)) {
            if (agree) assert_int_equal(pick, -1);
            else assert_true(pick >= 0);
        }
        if (pick == -1) {
            inherited++;
            for (int i = 0; i < plan_nsteps(p); i++)
                if (plan_step_measured(p, i)) assert_int_equal(plan_step_threads(p, i), one > all ? 1 : 2);
        }
        timed += pick > 0;
        one += pick == 2; /* 1 + MEASURED_ONE */
        all += pick == 1; /* 1 + MEASURED_ALL */
        /* The same results as a plan of this shape alone on one thread. */
        struct plan *q = NULL;
        if (plan_build(g, in, 0, NULL, 1, &q, err, sizeof err)) fail_msg("plan_build: %s", err);
        struct plan_exec *y = plan_exec_create(be, 1);
        if (plan_exec_run(y, q, in, ref, err, sizeof err)) fail_msg("plan_exec_run: %s", err);
        for (int o = 0; o < 2; o++) {
            const float *a = out[o].data, *w = ref[o].data;
            for (int64_t i = 0, n = tensor_numel(&ref[o]); i < n; i++)
                if (fabsf(a[i] - w[i]) > 1e-5f * fabsf(w[i]) + 1e-6f) fail_msg("len %d output %d [%lld]: %g vs %g", len, o, (long long)i, a[i], w[i]);
            tensor_free_data(&ref[o]);
            tensor_free_data(&out[o]);
        }
        plan_exec_free(y);
        plan_release(q);
        plan_release(p);
    }
    print_message("bert_s, 12 shapes: %d plans timed (%d all on 1, %d all on 2), %d inherited\n", timed, one, all,
                  inherited);
    plan_exec_free(x);
    plan_cache_free(c);
    backend_free(be);
    graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_diamond_results_and_memory),
        cmocka_unit_test(test_chain_reuses_memory),
        cmocka_unit_test(test_shape_chain_folds),
        cmocka_unit_test(test_view_extends_lifetime),
        cmocka_unit_test(test_conv_bn_relu_fusion),
        cmocka_unit_test(test_matmul_bias_clip_fusion),
        cmocka_unit_test(test_masked_softmax_fusion),
        cmocka_unit_test(test_masked_softmax_takes_scales),
        cmocka_unit_test(test_qdq_fusion),
        cmocka_unit_test(test_qdq_nhwc_between_convs),
        cmocka_unit_test(test_fold_constants_and_dead_nodes),
        cmocka_unit_test(test_plan_cache_lru),
        cmocka_unit_test(test_plan_cache_grows_on_rebuilds),
        cmocka_unit_test(test_bound_input_values),
        cmocka_unit_test(test_kernel_error_propagates),
        cmocka_unit_test(test_squeezenet_memory_plan),
        cmocka_unit_test(test_device_backend_with_fallback),
        cmocka_unit_test(test_fold_size_limit),
        cmocka_unit_test(test_device_graph_capture),
        cmocka_unit_test(test_activation_after_add),
        cmocka_unit_test(test_conv_add_bias_fusion),
        cmocka_unit_test(test_affine_folding),
        cmocka_unit_test(test_long_chain_linear_scan),
        cmocka_unit_test(test_device_constants_shared),
        cmocka_unit_test(test_value_driven_run),
        cmocka_unit_test(test_step_threads),
        cmocka_unit_test(test_step_threads_inherited),
        cmocka_unit_test(test_layout_cnn_mix),
        cmocka_unit_test(test_layout_convnext_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
