/* test_onnx_load.c - the ONNX loader on good files and on broken ones.
 *
 * Models are built with protobuf-c in memory, packed, and loaded from a
 * buffer or a temporary folder (for external data). Broken inputs must fail
 * with a message naming the tensor or node, never crash. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <protobuf-c/protobuf-c.h>

#include "common/status.h"
#include "graph/graph.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "models/onnx_load.h"
#include "models/passes.h"
#include "models/plan.h"
#include "onnx/onnx.pb-c.h"

/* ---- building protobufs ------------------------------------------------
 * Every allocation goes into one list that a test frees at its end. */

static void *g_allocs[4096];
static int g_nallocs;

static void *tcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    assert_non_null(p);
    assert_true(g_nallocs < 4096);
    g_allocs[g_nallocs++] = p;
    return p;
}

static char *tstr(const char *s) {
    char *p = tcalloc(strlen(s) + 1, 1);
    memcpy(p, s, strlen(s));
    return p;
}

static void tfree_all(void) {
    while (g_nallocs) free(g_allocs[--g_nallocs]);
}

static Onnx__TensorShapeProto__Dimension *dim_value(int64_t v) {
    Onnx__TensorShapeProto__Dimension *d = tcalloc(1, sizeof *d);
    onnx__tensor_shape_proto__dimension__init(d);
    d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
    d->dim_value = v;
    return d;
}

static Onnx__TensorShapeProto__Dimension *dim_param(const char *p) {
    Onnx__TensorShapeProto__Dimension *d = tcalloc(1, sizeof *d);
    onnx__tensor_shape_proto__dimension__init(d);
    d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
    d->dim_param = tstr(p);
    return d;
}

/* A tensor value info; dims[i] < 0 becomes dim_param "N". */
static Onnx__ValueInfoProto *value_info(const char *name, int dt, int nd, const int64_t *dims) {
    Onnx__ValueInfoProto *v = tcalloc(1, sizeof *v);
    onnx__value_info_proto__init(v);
    v->name = tstr(name);
    Onnx__TypeProto *tp = tcalloc(1, sizeof *tp);
    onnx__type_proto__init(tp);
    Onnx__TypeProto__Tensor *tt = tcalloc(1, sizeof *tt);
    onnx__type_proto__tensor__init(tt);
    tt->has_elem_type = 1;
    tt->elem_type = dt;
    Onnx__TensorShapeProto *sh = tcalloc(1, sizeof *sh);
    onnx__tensor_shape_proto__init(sh);
    sh->n_dim = (size_t)nd;
    sh->dim = tcalloc((size_t)nd, sizeof *sh->dim);
    for (int i = 0; i < nd; i++) sh->dim[i] = dims[i] < 0 ? dim_param("N") : dim_value(dims[i]);
    tt->shape = sh;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    v->type = tp;
    return v;
}

static Onnx__TensorProto *tensor_raw(const char *name, int dt, int nd, const int64_t *dims, const void *raw,
                                     size_t len) {
    Onnx__TensorProto *t = tcalloc(1, sizeof *t);
    onnx__tensor_proto__init(t);
    t->name = tstr(name);
    t->has_data_type = 1;
    t->data_type = dt;
    t->n_dims = (size_t)nd;
    t->dims = tcalloc((size_t)nd, sizeof *t->dims);
    memcpy(t->dims, dims, (size_t)nd * sizeof *dims);
    if (raw) {
        t->has_raw_data = 1;
        t->raw_data.len = len;
        t->raw_data.data = tcalloc(len, 1);
        memcpy(t->raw_data.data, raw, len);
    }
    return t;
}

static Onnx__NodeProto *node(const char *name, const char *op, int nin, const char **ins, int nout,
                             const char **outs) {
    Onnx__NodeProto *n = tcalloc(1, sizeof *n);
    onnx__node_proto__init(n);
    n->name = tstr(name);
    n->op_type = tstr(op);
    n->n_input = (size_t)nin;
    n->input = tcalloc((size_t)nin, sizeof(char *));
    for (int i = 0; i < nin; i++) n->input[i] = tstr(ins[i]);
    n->n_output = (size_t)nout;
    n->output = tcalloc((size_t)nout, sizeof(char *));
    for (int i = 0; i < nout; i++) n->output[i] = tstr(outs[i]);
    return n;
}

static void node_add_attr(Onnx__NodeProto *n, Onnx__AttributeProto *a) {
    Onnx__AttributeProto **v = tcalloc(n->n_attribute + 1, sizeof *v);
    if (n->n_attribute) memcpy(v, n->attribute, n->n_attribute * sizeof *v);
    v[n->n_attribute++] = a;
    n->attribute = v;
}

static Onnx__AttributeProto *attr(const char *name, Onnx__AttributeProto__AttributeType type) {
    Onnx__AttributeProto *a = tcalloc(1, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = tstr(name);
    a->has_type = 1;
    a->type = type;
    return a;
}

struct mb {
    Onnx__ModelProto m;
    Onnx__GraphProto g;
    Onnx__OperatorSetIdProto opset;
    Onnx__OperatorSetIdProto *opsets[1];
};

static void mb_init(struct mb *b, int64_t ir, int64_t opset) {
    onnx__model_proto__init(&b->m);
    onnx__graph_proto__init(&b->g);
    onnx__operator_set_id_proto__init(&b->opset);
    b->opset.domain = tstr("");
    b->opset.has_version = 1;
    b->opset.version = opset;
    b->opsets[0] = &b->opset;
    b->m.has_ir_version = 1;
    b->m.ir_version = ir;
    b->m.n_opset_import = 1;
    b->m.opset_import = b->opsets;
    b->m.producer_name = tstr("test");
    b->m.graph = &b->g;
    b->g.name = tstr("g");
}

#define MB_LIST(field, nfield, item)                                                                                   \
    do {                                                                                                               \
        void **v_ = tcalloc(b->g.nfield + 1, sizeof(void *));                                                          \
        if (b->g.nfield) memcpy(v_, b->g.field, b->g.nfield * sizeof(void *));                                         \
        v_[b->g.nfield++] = (item);                                                                                    \
        b->g.field = (void *)v_;                                                                                       \
    } while (0)

static void mb_input(struct mb *b, Onnx__ValueInfoProto *v) { MB_LIST(input, n_input, v); }
static void mb_output(struct mb *b, Onnx__ValueInfoProto *v) { MB_LIST(output, n_output, v); }
static void mb_node(struct mb *b, Onnx__NodeProto *n) { MB_LIST(node, n_node, n); }
static void mb_init_tensor(struct mb *b, Onnx__TensorProto *t) { MB_LIST(initializer, n_initializer, t); }

static uint8_t *mb_pack(struct mb *b, size_t *len) {
    *len = onnx__model_proto__get_packed_size(&b->m);
    uint8_t *buf = tcalloc(*len, 1);
    onnx__model_proto__pack(&b->m, buf);
    return buf;
}

static struct graph *mb_load(struct mb *b, char *err, size_t err_len) {
    size_t len;
    uint8_t *buf = mb_pack(b, &len);
    err[0] = 0;
    return onnx_load_buffer(buf, len, NULL, err, err_len);
}

/* x[N,3] -> Identity -> y, plus an initializer and a Transpose using it. */
static void build_simple(struct mb *b) {
    mb_init(b, 8, 13);
    int64_t dx[2] = {-1, 3}, dw[2] = {2, 3};
    float w[6] = {1, 2, 3, 4, 5, 6};
    mb_input(b, value_info("x", DT_FP32, 2, dx));
    mb_init_tensor(b, tensor_raw("w", DT_FP32, 2, dw, w, sizeof w));
    const char *in1[] = {"x"}, *out1[] = {"y"}, *in2[] = {"w"}, *out2[] = {"wt"};
    mb_node(b, node("", "Identity", 1, in1, 1, out1));
    mb_node(b, node("tr", "Transpose", 1, in2, 1, out2));
    mb_output(b, value_info("y", DT_FP32, 2, dx));
    mb_output(b, value_info("wt", DT_FP32, 2, (int64_t[]){3, 2}));
}

/* ---- good files ---------------------------------------------------------- */

static void test_simple_model(void **state) {
    (void)state;
    struct mb b;
    build_simple(&b);
    char err[512];
    struct graph *g = mb_load(&b, err, sizeof err);
    assert_non_null(g);
    assert_int_equal(g->ninputs, 1);
    const struct graph_value *x = &g->values[g->inputs[0]];
    assert_string_equal(x->name, "x");
    assert_int_equal(x->t.ndim, 2);
    assert_int_equal(x->t.dims[0], -1);
    assert_string_equal(x->dim_param[0], "N");
    assert_int_equal(x->t.dims[1], 3);
    assert_true(x->flags & VALUE_INPUT);
    int w = graph_find_value(g, "w");
    assert_true(w >= 0);
    assert_non_null(g->values[w].t.data);
    assert_true(((float *)g->values[w].t.data)[5] == 6.0f);
    assert_int_equal(g->nnodes, 2);
    assert_string_equal(g->nodes[0].name, "Identity_0"); /* invented for an empty name */
    assert_int_equal(g->nodes[0].opset, 13);
    assert_non_null(g->nodes[0].op);
    assert_int_equal(g->noutputs, 2);
    assert_true(g->values[g->outputs[0]].flags & VALUE_OUTPUT);
    assert_int_equal(g->opset_default, 13);
    assert_int_equal(g->ir_version, 8);
    assert_string_equal(g->producer_name, "test");
    graph_free(g);
    tfree_all();
}

static void test_initializer_listed_as_input(void **state) {
    (void)state;
    struct mb b;
    build_simple(&b);
    int64_t dw[2] = {2, 3};
    mb_input(&b, value_info("w", DT_FP32, 2, dw)); /* IR < 4 style */
    char err[512];
    struct graph *g = mb_load(&b, err, sizeof err);
    assert_non_null(g);
    assert_int_equal(g->ninputs, 1);
    assert_false(g->values[graph_find_value(g, "w")].flags & VALUE_INPUT);
    assert_true(g->values[graph_find_value(g, "w")].flags & VALUE_LISTED_INPUT);
    assert_false(g->values[graph_find_value(g, "x")].flags & VALUE_LISTED_INPUT);
    graph_free(g);
    tfree_all();
}

/* Every typed field of TensorProto, as attribute tensors of Constant-like
 * nodes and as initializers. */
static void test_typed_fields(void **state) {
    (void)state;
    char err[512];
    int64_t d3[1] = {3};
    struct tensor t;

    Onnx__TensorProto *tp = tensor_raw("i8", DT_INT8, 1, d3, NULL, 0);
    int32_t i32[3] = {-1, 2, 127};
    tp->n_int32_data = 3;
    tp->int32_data = i32;
    assert_int_equal(onnx_tensor_from_proto(tp, NULL, &t, err, sizeof err), 0);
    assert_int_equal(((int8_t *)t.data)[0], -1);
    assert_int_equal(((int8_t *)t.data)[2], 127);
    onnx_tensor_clear(&t);

    tp->data_type = DT_BOOL;
    assert_int_equal(onnx_tensor_from_proto(tp, NULL, &t, err, sizeof err), 0);
    assert_int_equal(((uint8_t *)t.data)[0], 1);
    onnx_tensor_clear(&t);

    tp->data_type = DT_FP16;
    int32_t h[3] = {0x3c00, 0xc000, 0};
    tp->int32_data = h;
    assert_int_equal(onnx_tensor_from_proto(tp, NULL, &t, err, sizeof err), 0);
    assert_true(fp16_to_fp32(((uint16_t *)t.data)[0]) == 1.0f);
    assert_true(fp16_to_fp32(((uint16_t *)t.data)[1]) == -2.0f);
    onnx_tensor_clear(&t);

    Onnx__TensorProto *t64 = tensor_raw("i64", DT_INT64, 1, d3, NULL, 0);
    int64_t v64[3] = {INT64_MIN, 0, INT64_MAX};
    t64->n_int64_data = 3;
    t64->int64_data = v64;
    assert_int_equal(onnx_tensor_from_proto(t64, NULL, &t, err, sizeof err), 0);
    assert_true(((int64_t *)t.data)[2] == INT64_MAX);
    onnx_tensor_clear(&t);

    Onnx__TensorProto *tf = tensor_raw("f64", DT_FP64, 1, d3, NULL, 0);
    double vd[3] = {0.5, -1e300, 3};
    tf->n_double_data = 3;
    tf->double_data = vd;
    assert_int_equal(onnx_tensor_from_proto(tf, NULL, &t, err, sizeof err), 0);
    assert_true(((double *)t.data)[1] == -1e300);
    onnx_tensor_clear(&t);

    Onnx__TensorProto *tu = tensor_raw("u32", DT_UINT32, 1, d3, NULL, 0);
    uint64_t vu[3] = {1, 4000000000u, 7};
    tu->n_uint64_data = 3;
    tu->uint64_data = vu;
    assert_int_equal(onnx_tensor_from_proto(tu, NULL, &t, err, sizeof err), 0);
    assert_true(((uint32_t *)t.data)[1] == 4000000000u);
    onnx_tensor_clear(&t);

    Onnx__TensorProto *ts = tensor_raw("s", DT_STRING, 1, d3, NULL, 0);
    /* string_data is counted bytes: a NUL inside is one of them. */
    ProtobufCBinaryData sd[3] = {{1, (uint8_t *)"a"}, {0, NULL}, {4, (uint8_t *)"x\0yz"}};
    ts->n_string_data = 3;
    ts->string_data = sd;
    assert_int_equal(onnx_tensor_from_proto(ts, NULL, &t, err, sizeof err), 0);
    assert_true(tensor_str_eq(tensor_strs(&t)[0], tensor_str_of("a")));
    assert_int_equal(tensor_strs(&t)[1].len, 0);
    assert_int_equal(tensor_strs(&t)[2].len, 4);
    assert_memory_equal(tensor_strs(&t)[2].p, "x\0yz", 4);
    onnx_tensor_clear(&t);

    /* The 4- and 2-bit dtypes are packed in the file (element 0 low), one
     * byte each in memory; float8 takes an int32 per element. */
    int64_t d5[1] = {5};
    uint8_t packed[3] = {0x87, 0xA9, 0x0B};
    Onnx__TensorProto *t4 = tensor_raw("i4", DT_INT4, 1, d5, packed, 3);
    assert_int_equal(onnx_tensor_from_proto(t4, NULL, &t, err, sizeof err), 0);
    int8_t w4[5] = {7, -8, -7, -6, -5};
    assert_memory_equal(t.data, w4, 5);
    onnx_tensor_clear(&t);
    Onnx__TensorProto *u2 = tensor_raw("u2", DT_UINT2, 1, d5, NULL, 0);
    int32_t p2[2] = {0xE4, 0x01};
    u2->n_int32_data = 2;
    u2->int32_data = p2;
    assert_int_equal(onnx_tensor_from_proto(u2, NULL, &t, err, sizeof err), 0);
    uint8_t w2[5] = {0, 1, 2, 3, 1};
    assert_memory_equal(t.data, w2, 5);
    onnx_tensor_clear(&t);
    u2->n_int32_data = 5; /* one int32 per element is not ONNX's packing */
    assert_int_not_equal(onnx_tensor_from_proto(u2, NULL, &t, err, sizeof err), 0);
    assert_non_null(strstr(err, "packed"));
    Onnx__TensorProto *f8 = tensor_raw("f8", DT_FP8E4M3FN, 1, d3, NULL, 0);
    int32_t c8[3] = {0x38, 0x7E, 0xFF};
    f8->n_int32_data = 3;
    f8->int32_data = c8;
    assert_int_equal(onnx_tensor_from_proto(f8, NULL, &t, err, sizeof err), 0);
    assert_true(fp8_to_fp32(((uint8_t *)t.data)[0], DT_FP8E4M3FN) == 1.0f);
    assert_true(fp8_to_fp32(((uint8_t *)t.data)[1], DT_FP8E4M3FN) == 448.0f);
    assert_true(isnan(fp8_to_fp32(((uint8_t *)t.data)[2], DT_FP8E4M3FN)));
    onnx_tensor_clear(&t);

    /* A scalar float and an empty tensor: an empty constant still has data. */
    Onnx__TensorProto *sc = tensor_raw("scalar", DT_FP32, 0, NULL, NULL, 0);
    float one = 1.5f;
    sc->n_float_data = 1;
    sc->float_data = &one;
    assert_int_equal(onnx_tensor_from_proto(sc, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.ndim, 0);
    assert_true(*(float *)t.data == 1.5f);
    onnx_tensor_clear(&t);
    Onnx__TensorProto *em = tensor_raw("empty", DT_FP32, 1, (int64_t[]){0}, NULL, 0);
    assert_int_equal(onnx_tensor_from_proto(em, NULL, &t, err, sizeof err), 0);
    assert_non_null(t.data);
    onnx_tensor_clear(&t);
    tfree_all();
}

static void test_attributes(void **state) {
    (void)state;
    struct mb b;
    build_simple(&b);
    Onnx__NodeProto *n = b.g.node[1];
    Onnx__AttributeProto *perm = attr("perm", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    int64_t p[2] = {1, 0};
    perm->n_ints = 2;
    perm->ints = p;
    node_add_attr(n, perm);
    Onnx__AttributeProto *f = attr("alpha", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    f->has_f = 1;
    f->f = 0.25f;
    node_add_attr(n, f);
    Onnx__AttributeProto *s = attr("mode", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
    s->has_s = 1;
    s->s.len = 4;
    s->s.data = (uint8_t *)"edge";
    node_add_attr(n, s);
    Onnx__AttributeProto *fs = attr("scales", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS);
    float sc[3] = {1, 2, 3};
    fs->n_floats = 3;
    fs->floats = sc;
    node_add_attr(n, fs);
    Onnx__AttributeProto *ss = attr("names", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS);
    ProtobufCBinaryData sv[2] = {{2, (uint8_t *)"ab"}, {1, (uint8_t *)"c"}};
    ss->n_strings = 2;
    ss->strings = sv;
    node_add_attr(n, ss);
    Onnx__AttributeProto *ta = attr("value", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR);
    int64_t v[2] = {7, 8};
    ta->t = tensor_raw("", DT_INT64, 1, (int64_t[]){2}, v, sizeof v);
    node_add_attr(n, ta);
    /* IR version 1 style: no type, inferred from the field that is set */
    Onnx__AttributeProto *untyped = attr("axis", 0);
    untyped->has_type = 0;
    untyped->has_i = 1;
    untyped->i = -2;
    node_add_attr(n, untyped);

    char err[512];
    struct graph *g = mb_load(&b, err, sizeof err);
    assert_non_null(g);
    const struct graph_node *tr = NULL;
    for (int i = 0; i < g->nnodes; i++)
        if (!strcmp(g->nodes[i].name, "tr")) tr = &g->nodes[i];
    assert_non_null(tr);
    const int64_t *ints;
    assert_int_equal(node_attr_ints(tr, "perm", &ints), 2);
    assert_int_equal(ints[0], 1);
    assert_true(node_attr_float(tr, "alpha", 0) == 0.25f);
    assert_string_equal(node_attr_str(tr, "mode", ""), "edge");
    const float *fl;
    assert_int_equal(node_attr_floats(tr, "scales", &fl), 3);
    assert_true(fl[2] == 3.0f);
    const struct graph_attr *sa = node_attr(tr, "names");
    assert_non_null(sa);
    assert_int_equal(sa->n, 2);
    assert_string_equal(sa->strings[0], "ab");
    const struct tensor *tv = node_attr_tensor(tr, "value");
    assert_non_null(tv);
    assert_int_equal(tv->dtype, DT_INT64);
    assert_int_equal(((int64_t *)tv->data)[1], 8);
    assert_int_equal(node_attr_int(tr, "axis", 0), -2);
    graph_free(g);
    tfree_all();
}

/* ---- external data ------------------------------------------------------- */

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static Onnx__StringStringEntryProto *kv(const char *k, const char *v) {
    Onnx__StringStringEntryProto *e = tcalloc(1, sizeof *e);
    onnx__string_string_entry_proto__init(e);
    e->key = tstr(k);
    e->value = tstr(v);
    return e;
}

static struct graph *load_with_external(const char *dir, const char *location, const char *offset,
                                        const char *length, char *err, size_t err_len) {
    struct mb b;
    build_simple(&b);
    Onnx__TensorProto *w = b.g.initializer[0];
    w->has_raw_data = 0;
    w->has_data_location = 1;
    w->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    w->external_data = tcalloc(3, sizeof *w->external_data);
    w->external_data[w->n_external_data++] = kv("location", location);
    if (offset) w->external_data[w->n_external_data++] = kv("offset", offset);
    if (length) w->external_data[w->n_external_data++] = kv("length", length);
    size_t len;
    uint8_t *buf = mb_pack(&b, &len);
    char path[512];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    write_bytes(path, buf, len);
    err[0] = 0;
    return onnx_load_file(path, err, err_len);
}

/* model_params.defaults (Triton's optional inputs): an initializer listed
 * as an input becomes an input whose initializer is its default, and a
 * caller may override it; an input no node reads gets zeros; a name that is
 * no listed input fails the load naming it. */
static void test_model_defaults(void **state) {
    (void)state;
    struct mb b;
    build_simple(&b);
    int64_t dw[2] = {2, 3}, du[1] = {-1};
    mb_input(&b, value_info("w", DT_FP32, 2, dw));
    mb_input(&b, value_info("u", DT_FP32, 1, du)); /* read by no node */
    size_t len;
    uint8_t *buf = mb_pack(&b, &len);
    char dir[] = "/tmp/kiln_defaults_XXXXXX", path[600], err[512] = "";
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    write_bytes(path, buf, len);

    const char *names[] = {"w", "u", "x"};
    struct model_params p = {.path = path, .defaults = names, .ndefaults = 3};
    struct model *m = model_load(&p, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(model_ninputs(m), 3);
    int w = model_find_input(m, "w"), u = model_find_input(m, "u"), x = model_find_input(m, "x");
    assert_true(w >= 0 && u >= 0 && x >= 0);
    assert_null(model_input_default(m, x));
    const struct tensor *dwt = model_input_default(m, w), *dut = model_input_default(m, u);
    assert_non_null(dwt);
    assert_true(dwt->ndim == 2 && dwt->dims[0] == 2 && ((const float *)dwt->data)[5] == 6.0f);
    assert_non_null(dut);
    assert_true(dut->ndim == 1 && dut->dims[0] == 0);
    assert_int_equal(model_input(m, w)->dims[1], 3);

    /* Run with the default, then with the caller's own w. */
    struct model_exec *ex = model_exec_create(m, NULL, 1);
    assert_non_null(ex);
    float xv[3] = {1, 2, 3}, other[6] = {10, 20, 30, 40, 50, 60};
    struct tensor in[3], out[2];
    in[x] = (struct tensor){.dtype = DT_FP32, .ndim = 2, .dims = {1, 3}, .data = xv};
    in[w] = *dwt;
    in[u] = *dut;
    int wt = model_find_output(m, "wt");
    for (int round = 0; round < 2; round++) {
        if (round) in[w].data = other;
        if (model_run(ex, in, 3, out, 2, err, sizeof err)) fail_msg("%s", err);
        const float *r = out[wt].data, *src = round ? other : (const float *)dwt->data;
        assert_true(out[wt].dims[0] == 3 && out[wt].dims[1] == 2);
        assert_true(r[1] == src[3] && r[2] == src[1]); /* wt[0][1] = w[1][0], wt[1][0] = w[0][1] */
        for (int o = 0; o < 2; o++) tensor_free_data(&out[o]);
    }
    model_exec_free(ex);
    model_free(m);

    const char *bad[] = {"nope"};
    p.defaults = bad;
    p.ndefaults = 1;
    assert_null(model_load(&p, err, sizeof err));
    assert_non_null(strstr(err, "'nope' is not a graph input"));
    unlink(path);
    rmdir(dir);
    tfree_all();
}

static void test_external_data(void **state) {
    (void)state;
    char dir[] = "/tmp/kiln_onnx_test_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[600], path[700], outside[700];
    snprintf(sub, sizeof sub, "%s/m", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    float w[8] = {9, 9, 1, 2, 3, 4, 5, 6};
    snprintf(path, sizeof path, "%s/weights.bin", sub);
    write_bytes(path, w, sizeof w);
    snprintf(outside, sizeof outside, "%s/secret.bin", dir);
    write_bytes(outside, w, sizeof w);

    char err[512];
    struct graph *g = load_with_external(sub, "weights.bin", "8", "24", err, sizeof err);
    assert_non_null(g);
    const struct tensor *t = &g->values[graph_find_value(g, "w")].t;
    assert_true(((float *)t->data)[0] == 1.0f && ((float *)t->data)[5] == 6.0f);
    graph_free(g);

    g = load_with_external(sub, "../secret.bin", NULL, NULL, err, sizeof err);
    assert_null(g);
    assert_non_null(strstr(err, "escapes the model's folder"));
    assert_non_null(strstr(err, "'w'"));

    g = load_with_external(sub, outside, NULL, NULL, err, sizeof err);
    assert_null(g);
    assert_non_null(strstr(err, "absolute"));

    g = load_with_external(sub, "weights.bin", "16", NULL, err, sizeof err); /* 24 bytes needed, 16 left */
    assert_null(g);
    assert_non_null(strstr(err, "'w'"));

    g = load_with_external(sub, "weights.bin", NULL, "20", err, sizeof err);
    assert_null(g);
    assert_non_null(strstr(err, "length"));

    g = load_with_external(sub, "missing.bin", NULL, NULL, err, sizeof err);
    assert_null(g);
    assert_non_null(strstr(err, "missing.bin"));

    /* A buffer has no folder: external data is refused. */
    struct mb b;
    build_simple(&b);
    b.g.initializer[0]->has_data_location = 1;
    b.g.initializer[0]->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    assert_null(mb_load(&b, err, sizeof err));
    assert_non_null(strstr(err, "external"));

    snprintf(path, sizeof path, "%s/model.onnx", sub);
    unlink(path);
    unlink(outside);
    snprintf(path, sizeof path, "%s/weights.bin", sub);
    unlink(path);
    rmdir(sub);
    rmdir(dir);
    tfree_all();
}

/* ---- broken files -------------------------------------------------------- */

static void test_every_truncation_fails_cleanly(void **state) {
    (void)state;
    struct mb b;
    build_simple(&b);
    size_t len;
    uint8_t *buf = mb_pack(&b, &len);
    char err[512];
    int loaded = 0;
    for (size_t n = 0; n < len; n++) {
        err[0] = 0;
        uint8_t *copy = malloc(n ? n : 1); /* exact size so ASan sees any overread */
        memcpy(copy, buf, n);
        struct graph *g = onnx_load_buffer(copy, n, NULL, err, sizeof err);
        if (g) loaded++; /* a prefix may be a valid smaller model; it must still be consistent */
        else assert_true(err[0] != 0);
        graph_free(g);
        free(copy);
    }
    assert_true(loaded < (int)len);
    tfree_all();
}

static void test_garbage(void **state) {
    (void)state;
    char err[512];
    uint8_t junk[4096];
    uint64_t s = 42;
    for (int round = 0; round < 200; round++) {
        for (size_t i = 0; i < sizeof junk; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            junk[i] = (uint8_t)(s >> 56);
        }
        err[0] = 0;
        struct graph *g = onnx_load_buffer(junk, (size_t)(round * 20), NULL, err, sizeof err);
        if (!g) assert_true(err[0] != 0);
        graph_free(g);
    }
    assert_null(onnx_load_file("/nonexistent/model.onnx", err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/model.onnx"));
}

static void test_cycle(void **state) {
    (void)state;
    struct mb b;
    mb_init(&b, 8, 13);
    int64_t d[1] = {2};
    mb_input(&b, value_info("x", DT_FP32, 1, d));
    const char *i1[] = {"x", "c"}, *o1[] = {"a"}, *i2[] = {"a"}, *o2[] = {"c"};
    mb_node(&b, node("loop_a", "Concat", 2, i1, 1, o1));
    mb_node(&b, node("loop_b", "Identity", 1, i2, 1, o2));
    mb_output(&b, value_info("c", DT_FP32, 1, d));
    char err[512];
    assert_null(mb_load(&b, err, sizeof err));
    assert_non_null(strstr(err, "cycle"));
    assert_non_null(strstr(err, "loop_a"));
    tfree_all();
}

static void test_missing_producer(void **state) {
    (void)state;
    struct mb b;
    build_simple(&b);
    b.g.node[0]->input[0] = tstr("ghost");
    char err[512];
    assert_null(mb_load(&b, err, sizeof err));
    assert_non_null(strstr(err, "'ghost'"));
    assert_non_null(strstr(err, "Identity_0"));
    tfree_all();
}

static void test_node_overwrites_initializer(void **state) {
    (void)state;
    struct mb b;
    build_simple(&b);
    b.g.node[0]->output[0] = tstr("w");
    char err[512];
    assert_null(mb_load(&b, err, sizeof err));
    assert_non_null(strstr(err, "'w', which is an initializer"));
    tfree_all();
}

static void test_unknown_op(void **state) {
    (void)state;
    struct mb b;
    build_simple(&b);
    b.g.node[1]->op_type = tstr("Frobnicate");
    b.g.node[1]->domain = tstr("com.example");
    char err[512];
    assert_null(mb_load(&b, err, sizeof err));
    assert_string_equal(err, "node 'tr' : operator 'Frobnicate' (domain 'com.example', opset 1) is not supported");
    tfree_all();
}

static void test_subgraph(void **state) {
    (void)state;
    struct mb b;
    build_simple(&b);
    Onnx__AttributeProto *a = attr("then_branch", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH);
    Onnx__GraphProto *sub = tcalloc(1, sizeof *sub);
    onnx__graph_proto__init(sub);
    a->g = sub;
    node_add_attr(b.g.node[1], a);
    char err[512];
    assert_null(mb_load(&b, err, sizeof err));
    assert_non_null(strstr(err, "subgraph 'then_branch'"));
    assert_non_null(strstr(err, "declares no graph outputs"));
    assert_non_null(strstr(err, "'tr'"));
    tfree_all();
}

/* A graph of its own for a subgraph attribute: nodes given, one output. */
static Onnx__GraphProto *subgraph(const char *name, Onnx__NodeProto **nodes, int nn, const char *out) {
    Onnx__GraphProto *g = tcalloc(1, sizeof *g);
    onnx__graph_proto__init(g);
    g->name = tstr(name);
    g->n_node = (size_t)nn;
    g->node = tcalloc((size_t)nn, sizeof *g->node);
    for (int i = 0; i < nn; i++) g->node[i] = nodes[i];
    g->n_output = 1;
    g->output = tcalloc(1, sizeof *g->output);
    g->output[0] = value_info(out, DT_FP32, 0, NULL);
    return g;
}

static void add_branches(Onnx__NodeProto *n, Onnx__GraphProto *then_g, Onnx__GraphProto *else_g) {
    Onnx__AttributeProto *a = attr("then_branch", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH);
    a->g = then_g;
    node_add_attr(n, a);
    a = attr("else_branch", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH);
    a->g = else_g;
    node_add_attr(n, a);
}

/* y = If(c) { If(c) { x + w } else { x } } else { -x }: the inner branches
 * read x and w two scopes out, and c one scope out. With c_const, c is an
 * initializer (true) instead of an input. */
static void build_nested_if(struct mb *b, int c_const) {
    mb_init(b, 8, 13);
    int64_t d2[1] = {2};
    float w[2] = {10, 20};
    uint8_t one = 1;
    mb_input(b, value_info("x", DT_FP32, 1, d2));
    if (c_const) mb_init_tensor(b, tensor_raw("c", DT_BOOL, 0, NULL, &one, 1));
    else mb_input(b, value_info("c", DT_BOOL, 0, NULL));
    mb_init_tensor(b, tensor_raw("w", DT_FP32, 1, d2, w, sizeof w));
    const char *xw[] = {"x", "w"}, *x1[] = {"x"}, *c1[] = {"c"};
    Onnx__NodeProto *add = node("add", "Add", 2, xw, 1, (const char *[]){"t2"});
    Onnx__NodeProto *idn = node("idn", "Identity", 1, x1, 1, (const char *[]){"e2"});
    Onnx__NodeProto *inner = node("inner", "If", 1, c1, 1, (const char *[]){"i1"});
    add_branches(inner, subgraph("T2", &add, 1, "t2"), subgraph("E2", &idn, 1, "e2"));
    Onnx__NodeProto *neg = node("neg", "Neg", 1, x1, 1, (const char *[]){"e1"});
    Onnx__NodeProto *outer = node("outer", "If", 1, c1, 1, (const char *[]){"y"});
    add_branches(outer, subgraph("T1", &inner, 1, "i1"), subgraph("E1", &neg, 1, "e1"));
    mb_node(b, outer);
    mb_output(b, value_info("y", DT_FP32, 1, d2));
}

static const struct graph *branch_of(const struct graph_node *n, const char *name) {
    const struct graph *g = node_attr_graph(n, name);
    assert_non_null(g);
    return g;
}

/* Runs g on x (and c when it is an input) on the CPU. */
static void run_graph(const struct graph *g, const float *x, uint8_t c, float *y) {
    struct tensor in[2] = {{.dtype = DT_FP32, .ndim = 1, .dims = {2}, .data = (void *)x},
                           {.dtype = DT_BOOL, .ndim = 0, .data = &c}};
    char err[512];
    struct plan *p = NULL;
    int rc = plan_build(g, in, 0, NULL, 1, &p, err, sizeof err);
    if (rc) fail_msg("%s", err);
    struct backend *be = backend_cpu_create(&(struct backend_params){.device = -1, .nthreads = 1});
    struct plan_exec *px = plan_exec_create(be, 1);
    struct tensor out;
    rc = plan_exec_run(px, p, in, &out, err, sizeof err);
    if (rc) fail_msg("%s", err);
    memcpy(y, out.data, 2 * sizeof *y);
    tensor_free_data(&out);
    plan_exec_free(px);
    plan_release(p);
    backend_free(be);
}

static void test_subgraph_outer_scope(void **state) {
    (void)state;
    struct mb b;
    build_nested_if(&b, 0);
    char err[512];
    struct graph *g = mb_load(&b, err, sizeof err);
    if (!g) fail_msg("%s", err);
    assert_int_equal(g->nnodes, 1);
    const struct graph_node *outer = &g->nodes[0];
    /* c (its own condition) and x, w for the branches, each once. */
    assert_int_equal(outer->nin, 3);
    assert_int_equal(outer->in[1], graph_find_value(g, "x"));
    assert_int_equal(outer->in[2], graph_find_value(g, "w"));
    const struct graph *t1 = branch_of(outer, "then_branch"), *e1 = branch_of(outer, "else_branch");
    assert_int_equal(t1->ncaptured, 3);
    assert_int_equal(graph_nformal(t1), 0);
    assert_int_equal(e1->ncaptured, 1);
    assert_int_equal(e1->capture_in[0], 1);
    const struct graph_node *inner = &t1->nodes[0];
    assert_int_equal(inner->nin, 3);
    const struct graph *t2 = branch_of(inner, "then_branch");
    assert_int_equal(t2->ncaptured, 2);
    assert_int_equal(inner->in[t2->capture_in[0]], graph_find_value(t1, "x"));
    assert_int_equal(inner->in[t2->capture_in[1]], graph_find_value(t1, "w"));
    float x[2] = {1, 2}, y[2];
    run_graph(g, x, 1, y);
    assert_float_equal(y[0], 11, 0);
    assert_float_equal(y[1], 22, 0);
    run_graph(g, x, 0, y);
    assert_float_equal(y[0], -1, 0);
    assert_float_equal(y[1], -2, 0);
    graph_free(g);
    tfree_all();
}

/* A constant condition: both levels of If are replaced by their taken
 * branches at load, and the result is the same. */
static void test_if_constant_inlined(void **state) {
    (void)state;
    struct mb b;
    build_nested_if(&b, 1);
    char err[512];
    struct graph *g = mb_load(&b, err, sizeof err);
    if (!g) fail_msg("%s", err);
    if (passes_run(g, err, sizeof err)) fail_msg("%s", err);
    for (int i = 0; i < g->nnodes; i++) assert_string_not_equal(g->nodes[i].op_type, "If");
    float x[2] = {1, 2}, y[2];
    run_graph(g, x, 1, y);
    assert_float_equal(y[0], 11, 0);
    assert_float_equal(y[1], 22, 0);
    graph_free(g);
    tfree_all();
}

/* A name no scope defines fails at the top with the name. */
static void test_subgraph_undefined_name(void **state) {
    (void)state;
    struct mb b;
    build_nested_if(&b, 0);
    b.g.node[0]->attribute[1]->g->node[0]->input[0] = tstr("nowhere");
    char err[512];
    assert_null(mb_load(&b, err, sizeof err));
    assert_non_null(strstr(err, "'nowhere'"));
    tfree_all();
}

static void expect_bad_initializer(Onnx__TensorProto *t, const char *needle) {
    struct mb b;
    build_simple(&b);
    b.g.initializer[0] = t;
    b.g.node[1]->input[0] = t->name;
    char err[512];
    struct graph *g = mb_load(&b, err, sizeof err);
    assert_null(g);
    assert_non_null(strstr(err, t->name));
    if (!strstr(err, needle)) fail_msg("'%s' lacks '%s'", err, needle);
}

static void test_absurd_tensors(void **state) {
    (void)state;
    float f[6] = {0};
    expect_bad_initializer(tensor_raw("neg", DT_FP32, 2, (int64_t[]){-2, 3}, f, sizeof f), "negative");
    expect_bad_initializer(tensor_raw("huge", DT_FP32, 3, (int64_t[]){1 << 20, 1 << 20, 1 << 20}, f, sizeof f),
                           "2^31");
    expect_bad_initializer(tensor_raw("over", DT_FP32, 2, (int64_t[]){INT64_MAX, INT64_MAX}, f, sizeof f), "2^31");
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 6};
    expect_bad_initializer(tensor_raw("deep", DT_FP32, 9, nine, f, sizeof f), "rank");
    /* declares 1000 floats, holds 24 bytes: nothing may be sized from the shape */
    expect_bad_initializer(tensor_raw("short", DT_FP32, 1, (int64_t[]){1000}, f, sizeof f), "raw_data");
    Onnx__TensorProto *typed = tensor_raw("typed", DT_INT64, 1, (int64_t[]){1000000000}, NULL, 0);
    int64_t one = 1;
    typed->n_int64_data = 1;
    typed->int64_data = &one;
    expect_bad_initializer(typed, "int64_data");
    expect_bad_initializer(tensor_raw("c64", 14, 1, (int64_t[]){6}, f, sizeof f), "complex64");
    /* five int4 take three packed bytes, not two */
    expect_bad_initializer(tensor_raw("i4", DT_INT4, 1, (int64_t[]){5}, f, 2), "3 bytes");
    expect_bad_initializer(tensor_raw("notype", 0, 1, (int64_t[]){6}, f, sizeof f), "no data type");
    tfree_all();
}

static void test_absurd_input_dims(void **state) {
    (void)state;
    struct mb b;
    build_simple(&b);
    b.g.input[0]->type->tensor_type->shape->dim[1]->dim_value = -7;
    char err[512];
    assert_null(mb_load(&b, err, sizeof err));
    assert_non_null(strstr(err, "'x'"));
    tfree_all();

    build_simple(&b);
    b.g.input[0]->type->tensor_type->elem_type = 15;
    assert_null(mb_load(&b, err, sizeof err));
    assert_non_null(strstr(err, "complex128"));
    tfree_all();

    build_simple(&b);
    Onnx__TypeProto__Sequence *seq = tcalloc(1, sizeof *seq);
    onnx__type_proto__sequence__init(seq);
    seq->elem_type = b.g.input[0]->type; /* a sequence of the tensor type */
    Onnx__TypeProto *outer = tcalloc(1, sizeof *outer);
    onnx__type_proto__init(outer);
    outer->value_case = ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE;
    outer->sequence_type = seq;
    b.g.input[0]->type = outer;
    assert_null(mb_load(&b, err, sizeof err));
    if (!strstr(err, "sequence")) fail_msg("%s", err);
    tfree_all();
}

/* ModelProto.graph(7) > GraphProto.node(1) > NodeProto.attribute(5) >
 * AttributeProto.g(6) > GraphProto.node(1) ... built from the inside out:
 * protobuf-c would recurse once per level. */
static void test_deep_nesting(void **state) {
    (void)state;
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap), *tmp = malloc(cap);
    static const uint8_t tags[3] = {(1 << 3) | 2, (5 << 3) | 2, (6 << 3) | 2}; /* node, attribute, g */
    const int levels = 3000;
    for (int level = 0; level < levels; level++) {
        uint8_t tag = tags[(levels - 1 - level) % 3]; /* the outermost is GraphProto.node */
        size_t n = 0;
        tmp[n++] = tag;
        size_t v = len;
        do {
            tmp[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
            v >>= 7;
        } while (v);
        assert_true(n + len + 8 < cap);
        memcpy(tmp + n, buf, len);
        memcpy(buf, tmp, n + len);
        len += n;
    }
    /* wrap as ModelProto.graph */
    memmove(buf + 4, buf, len);
    buf[0] = (7 << 3) | 2;
    buf[1] = (uint8_t)((len & 0x7f) | 0x80);
    buf[2] = (uint8_t)(((len >> 7) & 0x7f) | 0x80);
    buf[3] = (uint8_t)(len >> 14);
    len += 4;
    char err[512];
    assert_null(onnx_load_buffer(buf, len, NULL, err, sizeof err));
    if (!strstr(err, "levels deep")) fail_msg("%s", err);
    free(buf);
    free(tmp);
}


static void test_tensor_file(void **state) {
    (void)state;
    int64_t d[2] = {2, 2};
    int32_t v[4] = {1, -2, 3, -4};
    Onnx__TensorProto *t = tensor_raw("in0", DT_INT32, 2, d, v, sizeof v);
    size_t len = onnx__tensor_proto__get_packed_size(t);
    uint8_t *buf = tcalloc(len, 1);
    onnx__tensor_proto__pack(t, buf);
    char path[] = "/tmp/kiln_tensor_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_bytes(path, buf, len);
    struct tensor out;
    char *name = NULL, err[512];
    assert_int_equal(onnx_load_tensor_file(path, &out, &name, err, sizeof err), 0);
    assert_string_equal(name, "in0");
    assert_int_equal(out.dtype, DT_INT32);
    assert_int_equal(((int32_t *)out.data)[3], -4);
    onnx_tensor_clear(&out);
    free(name);
    write_bytes(path, buf, len - 3); /* truncated inside raw_data */
    assert_true(onnx_load_tensor_file(path, &out, &name, err, sizeof err) < 0);
    assert_non_null(strstr(err, path));
    unlink(path);
    tfree_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simple_model),
        cmocka_unit_test(test_initializer_listed_as_input),
        cmocka_unit_test(test_model_defaults),
        cmocka_unit_test(test_typed_fields),
        cmocka_unit_test(test_attributes),
        cmocka_unit_test(test_external_data),
        cmocka_unit_test(test_every_truncation_fails_cleanly),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_cycle),
        cmocka_unit_test(test_missing_producer),
        cmocka_unit_test(test_node_overwrites_initializer),
        cmocka_unit_test(test_unknown_op),
        cmocka_unit_test(test_subgraph),
        cmocka_unit_test(test_subgraph_outer_scope),
        cmocka_unit_test(test_if_constant_inlined),
        cmocka_unit_test(test_subgraph_undefined_name),
        cmocka_unit_test(test_absurd_tensors),
        cmocka_unit_test(test_absurd_input_dims),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_tensor_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
