/* test_ops_ml.c - the ai.onnx.ml family through its op table entries, on
 * answers worked out by hand here: a softmax LinearClassifier, the binary
 * one-score form, a two-tree ensemble classifier and an averaging
 * regressor, Normalizer's three norms, Scaler, LabelEncoder's default,
 * ArrayFeatureExtractor's bounds, and ZipMap's refusal message. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/ops.h"

struct tnode {
    struct graph_node n;
    struct graph_attr a[24];
};

static void tn_init(struct tnode *t, const char *op, int opset) {
    memset(t, 0, sizeof *t);
    t->n.name = "n0";
    t->n.op_type = (char *)op;
    t->n.domain = "ai.onnx.ml";
    t->n.opset = opset;
    t->n.attrs = t->a;
}
static struct graph_attr *tn_add(struct tnode *t, const char *name, enum attr_type ty) {
    struct graph_attr *a = &t->a[t->n.nattr++];
    a->name = (char *)name;
    a->type = ty;
    return a;
}
static void tn_ints(struct tnode *t, const char *name, int64_t *v, int n) {
    struct graph_attr *a = tn_add(t, name, ATTR_INTS);
    a->ints = v;
    a->n = n;
}
static void tn_floats(struct tnode *t, const char *name, float *v, int n) {
    struct graph_attr *a = tn_add(t, name, ATTR_FLOATS);
    a->floats = v;
    a->n = n;
}
static void tn_strs(struct tnode *t, const char *name, char **v, int n) {
    struct graph_attr *a = tn_add(t, name, ATTR_STRINGS);
    a->strings = v;
    a->n = n;
}
static void tn_str(struct tnode *t, const char *name, const char *v) {
    struct graph_attr *a = tn_add(t, name, ATTR_STRING);
    a->s = (char *)v;
    a->s_len = strlen(v);
}
static void tn_int(struct tnode *t, const char *name, int64_t v) { tn_add(t, name, ATTR_INT)->i = v; }

static char g_err[512];

static int call(struct tnode *tn, const struct tensor **in, int nin, struct tensor **out, int nout) {
    const struct op_def *d = op_find("ai.onnx.ml", tn->n.op_type);
    assert_non_null(d);
    struct op_call c = {0};
    c.node = &tn->n;
    c.nin = nin;
    c.nout = nout;
    for (int i = 0; i < nin; i++) c.in[i] = in[i];
    for (int i = 0; i < nout; i++) c.out[i] = out[i];
    c.nthreads = 1;
    c.err = g_err;
    c.err_len = sizeof g_err;
    g_err[0] = 0;
    int rc = d->infer(&c);
    if (rc) return rc;
    void *state = NULL;
    size_t scratch = 0;
    if (d->prepare && (rc = d->prepare(&c, &state, &scratch))) return rc;
    c.state = state;
    c.scratch = scratch ? aligned_alloc(64, (scratch + 63) / 64 * 64) : NULL;
    c.scratch_size = scratch;
    for (int i = 0; i < nout; i++) {
        if (!out[i]) continue;
        int64_t n = tensor_numel(out[i]);
        out[i]->data = calloc((size_t)(n > 0 ? n : 1), dtype_size(out[i]->dtype));
    }
    rc = d->run(&c);
    if (d->release) d->release(state);
    free(c.scratch);
    return rc;
}

#define F(t) ((float *)(t).data)
#define I64(t) ((int64_t *)(t).data)

static void test_linear_classifier_softmax(void **st) {
    (void)st;
    /* 2 features, 3 classes: scores are [x0, x1, 0], so row0 = [1, 2, 0] and row1 = [3, 0, 0] */
    float x[4] = {1, 2, 3, 0};
    float coef[6] = {1, 0, 0, 1, 0, 0};
    float icp[3] = {0, 0, 0};
    int64_t labels[3] = {10, 20, 30};
    struct tensor X = {DT_FP32, 2, {2, 2}, x}, Y = {0}, Z = {0};
    struct tnode tn;
    tn_init(&tn, "LinearClassifier", 1);
    tn_floats(&tn, "coefficients", coef, 6);
    tn_floats(&tn, "intercepts", icp, 3);
    tn_ints(&tn, "classlabels_ints", labels, 3);
    tn_str(&tn, "post_transform", "SOFTMAX");
    const struct tensor *in[1] = {&X};
    struct tensor *out[2] = {&Y, &Z};
    assert_int_equal(call(&tn, in, 1, out, 2), 0);
    assert_int_equal(Z.dims[1], 3);
    assert_int_equal(I64(Y)[0], 20);
    assert_int_equal(I64(Y)[1], 10);
    double e1 = exp(1), e2 = exp(2), s0 = e1 + e2 + 1;
    assert_float_equal(F(Z)[0], e1 / s0, 1e-6);
    assert_float_equal(F(Z)[1], e2 / s0, 1e-6);
    assert_float_equal(F(Z)[2], 1 / s0, 1e-6);
    double s1 = exp(3) + 2;
    assert_float_equal(F(Z)[3], exp(3) / s1, 1e-6);
    free(Y.data);
    free(Z.data);
}

static void test_linear_classifier_binary(void **st) {
    (void)st;
    /* One score column, two labels: label by sign, scores [1 - s, s]. */
    float x[2] = {2, -3};
    float coef[1] = {0.25f}, icp[1] = {0};
    int64_t labels[2] = {7, 9};
    struct tensor X = {DT_FP32, 2, {2, 1}, x}, Y = {0}, Z = {0};
    struct tnode tn;
    tn_init(&tn, "LinearClassifier", 1);
    tn_floats(&tn, "coefficients", coef, 1);
    tn_floats(&tn, "intercepts", icp, 1);
    tn_ints(&tn, "classlabels_ints", labels, 2);
    const struct tensor *in[1] = {&X};
    struct tensor *out[2] = {&Y, &Z};
    assert_int_equal(call(&tn, in, 1, out, 2), 0);
    assert_int_equal(Z.dims[1], 2);
    assert_int_equal(I64(Y)[0], 9);
    assert_int_equal(I64(Y)[1], 7);
    assert_float_equal(F(Z)[0], 0.5f, 1e-6);
    assert_float_equal(F(Z)[1], 0.5f, 1e-6);
    assert_float_equal(F(Z)[2], 1.75f, 1e-6);
    assert_float_equal(F(Z)[3], -0.75f, 1e-6);
    free(Y.data);
    free(Z.data);
}

/* Two stumps on feature 0 (threshold 0.5) and feature 1 (threshold 2). */
static void tree_attrs(struct tnode *tn, int64_t *tid, int64_t *nid, int64_t *fid, char **modes, float *vals, int64_t *tt,
                       int64_t *ff) {
    tn_ints(tn, "nodes_treeids", tid, 6);
    tn_ints(tn, "nodes_nodeids", nid, 6);
    tn_ints(tn, "nodes_featureids", fid, 6);
    tn_strs(tn, "nodes_modes", modes, 6);
    tn_floats(tn, "nodes_values", vals, 6);
    tn_ints(tn, "nodes_truenodeids", tt, 6);
    tn_ints(tn, "nodes_falsenodeids", ff, 6);
}

static void test_tree_classifier(void **st) {
    (void)st;
    int64_t tid[6] = {0, 0, 0, 1, 1, 1}, nid[6] = {0, 1, 2, 0, 1, 2}, fid[6] = {0, 0, 0, 1, 0, 0};
    char *modes[6] = {"BRANCH_LEQ", "LEAF", "LEAF", "BRANCH_LT", "LEAF", "LEAF"};
    float vals[6] = {0.5f, 0, 0, 2, 0, 0};
    int64_t tt[6] = {1, 0, 0, 1, 0, 0}, ff[6] = {2, 0, 0, 2, 0, 0};
    /* leaf weights: tree 0 leaf 1 -> class 0, leaf 2 -> class 1; tree 1 leaf 1 -> class 2, leaf 2 -> class 1 */
    int64_t ctid[4] = {0, 0, 1, 1}, cnid[4] = {1, 2, 1, 2}, cid[4] = {0, 1, 2, 1};
    float cw[4] = {0.5f, 0.5f, 0.75f, 0.25f};
    int64_t labels[3] = {100, 200, 300};
    struct tnode tn;
    tn_init(&tn, "TreeEnsembleClassifier", 1);
    tree_attrs(&tn, tid, nid, fid, modes, vals, tt, ff);
    tn_ints(&tn, "class_treeids", ctid, 4);
    tn_ints(&tn, "class_nodeids", cnid, 4);
    tn_ints(&tn, "class_ids", cid, 4);
    tn_floats(&tn, "class_weights", cw, 4);
    tn_ints(&tn, "classlabels_int64s", labels, 3);
    float x[6] = {0, 0, 1, 1, 1, 5}; /* rows: (0,0), (1,1), (1,5) */
    struct tensor X = {DT_FP32, 2, {3, 2}, x}, Y = {0}, Z = {0};
    const struct tensor *in[1] = {&X};
    struct tensor *out[2] = {&Y, &Z};
    assert_int_equal(call(&tn, in, 1, out, 2), 0);
    /* (0,0): c0 0.5, c2 0.75 -> 300; (1,1): c1 0.5, c2 0.75 -> 300; (1,5): c1 0.5 + 0.25 -> 200 */
    assert_int_equal(I64(Y)[0], 300);
    assert_int_equal(I64(Y)[1], 300);
    assert_int_equal(I64(Y)[2], 200);
    const float want[9] = {0.5f, 0, 0.75f, 0, 0.5f, 0.75f, 0, 0.75f, 0};
    for (int i = 0; i < 9; i++) assert_float_equal(F(Z)[i], want[i], 1e-6);
    free(Y.data);
    free(Z.data);

    /* a child id that does not exist is named in the error */
    ff[0] = 9;
    tn_init(&tn, "TreeEnsembleClassifier", 1);
    tree_attrs(&tn, tid, nid, fid, modes, vals, tt, ff);
    tn_ints(&tn, "class_treeids", ctid, 4);
    tn_ints(&tn, "class_nodeids", cnid, 4);
    tn_ints(&tn, "class_ids", cid, 4);
    tn_floats(&tn, "class_weights", cw, 4);
    tn_ints(&tn, "classlabels_int64s", labels, 3);
    Y = (struct tensor){0};
    Z = (struct tensor){0};
    assert_int_equal(call(&tn, in, 1, out, 2), STATUS_INVALID);
    assert_non_null(strstr(g_err, "missing child"));
}

static void test_tree_regressor_average(void **st) {
    (void)st;
    int64_t tid[6] = {0, 0, 0, 1, 1, 1}, nid[6] = {0, 1, 2, 0, 1, 2}, fid[6] = {0, 0, 0, 1, 0, 0};
    char *modes[6] = {"BRANCH_LEQ", "LEAF", "LEAF", "BRANCH_LEQ", "LEAF", "LEAF"};
    float vals[6] = {0.5f, 0, 0, 2, 0, 0};
    int64_t tt[6] = {1, 0, 0, 1, 0, 0}, ff[6] = {2, 0, 0, 2, 0, 0};
    int64_t ttid[4] = {0, 0, 1, 1}, tnid[4] = {1, 2, 1, 2}, tgt[4] = {0, 0, 0, 0};
    float tw[4] = {1, 3, 10, 20}, base[1] = {0.5f};
    struct tnode tn;
    tn_init(&tn, "TreeEnsembleRegressor", 1);
    tree_attrs(&tn, tid, nid, fid, modes, vals, tt, ff);
    tn_ints(&tn, "target_treeids", ttid, 4);
    tn_ints(&tn, "target_nodeids", tnid, 4);
    tn_ints(&tn, "target_ids", tgt, 4);
    tn_floats(&tn, "target_weights", tw, 4);
    tn_floats(&tn, "base_values", base, 1);
    tn_int(&tn, "n_targets", 1);
    tn_str(&tn, "aggregate_function", "AVERAGE");
    float x[4] = {0, 9, NAN, 1}; /* NaN goes false without missing_value_tracks_true */
    struct tensor X = {DT_FP32, 2, {2, 2}, x}, Y = {0};
    const struct tensor *in[1] = {&X};
    struct tensor *out[1] = {&Y};
    assert_int_equal(call(&tn, in, 1, out, 1), 0);
    assert_float_equal(F(Y)[0], (1 + 20) / 2.0 + 0.5, 1e-6);
    assert_float_equal(F(Y)[1], (3 + 10) / 2.0 + 0.5, 1e-6);
    free(Y.data);
}

static void test_normalizer_scaler(void **st) {
    (void)st;
    float x[3] = {3, -4, 0};
    struct tensor X = {DT_FP32, 2, {1, 3}, x};
    const char *norms[3] = {"MAX", "L1", "L2"};
    const float want[3][3] = {{1, -4.0f / 3, 0}, {3.0f / 7, -4.0f / 7, 0}, {0.6f, -0.8f, 0}};
    for (int k = 0; k < 3; k++) {
        struct tnode tn;
        tn_init(&tn, "Normalizer", 1);
        tn_str(&tn, "norm", norms[k]);
        struct tensor Y = {0};
        const struct tensor *in[1] = {&X};
        struct tensor *out[1] = {&Y};
        assert_int_equal(call(&tn, in, 1, out, 1), 0);
        for (int i = 0; i < 3; i++) assert_float_equal(F(Y)[i], want[k][i], 1e-6);
        free(Y.data);
    }
    int64_t xi[3] = {1, 2, 3};
    float off[3] = {1, 1, 1}, sc[1] = {2};
    struct tensor XI = {DT_INT64, 2, {1, 3}, xi}, Y = {0};
    struct tnode tn;
    tn_init(&tn, "Scaler", 1);
    tn_floats(&tn, "offset", off, 3);
    tn_floats(&tn, "scale", sc, 1);
    const struct tensor *in[1] = {&XI};
    struct tensor *out[1] = {&Y};
    assert_int_equal(call(&tn, in, 1, out, 1), 0);
    assert_int_equal(Y.dtype, DT_FP32);
    assert_float_equal(F(Y)[2], 4, 0);
    free(Y.data);
}

static void test_label_encoder(void **st) {
    (void)st;
    int64_t keys[3] = {30, 10, 20}, vals[3] = {3, 1, 2}, x[4] = {20, 5, 30, 10};
    struct tnode tn;
    tn_init(&tn, "LabelEncoder", 2);
    tn_ints(&tn, "keys_int64s", keys, 3);
    tn_ints(&tn, "values_int64s", vals, 3);
    tn_int(&tn, "default_int64", -7);
    struct tensor X = {DT_INT64, 1, {4}, x}, Y = {0};
    const struct tensor *in[1] = {&X};
    struct tensor *out[1] = {&Y};
    assert_int_equal(call(&tn, in, 1, out, 1), 0);
    assert_int_equal(I64(Y)[0], 2);
    assert_int_equal(I64(Y)[1], -7);
    assert_int_equal(I64(Y)[2], 3);
    assert_int_equal(I64(Y)[3], 1);
    free(Y.data);
}

static void test_array_feature_extractor(void **st) {
    (void)st;
    float x[6] = {0, 1, 2, 3, 4, 5};
    int64_t idx[2] = {2, 0};
    struct tensor X = {DT_FP32, 2, {2, 3}, x}, I = {DT_INT64, 1, {2}, idx}, Y = {0};
    struct tnode tn;
    tn_init(&tn, "ArrayFeatureExtractor", 1);
    const struct tensor *in[2] = {&X, &I};
    struct tensor *out[1] = {&Y};
    assert_int_equal(call(&tn, in, 2, out, 1), 0);
    const float want[4] = {2, 0, 5, 3};
    for (int i = 0; i < 4; i++) assert_float_equal(F(Y)[i], want[i], 0);
    free(Y.data);
    idx[0] = 3;
    Y = (struct tensor){0};
    assert_int_equal(call(&tn, in, 2, out, 1), STATUS_INVALID);
    assert_non_null(strstr(g_err, "index 3 is out of range [0, 3)"));
    free(Y.data);
}

/* String labels and values point into the node's attributes. */
static void test_string_labels(void **st) {
    (void)st;
    float x[2] = {2, -3};
    float coef[2] = {1, -1};
    char *names[2] = {"cat", "dog"};
    struct tensor X = {DT_FP32, 2, {2, 1}, x}, Y = {0}, Z = {0};
    struct tnode tn;
    tn_init(&tn, "LinearClassifier", 1);
    tn_floats(&tn, "coefficients", coef, 2);
    tn_strs(&tn, "classlabels_strings", names, 2);
    const struct tensor *in[1] = {&X};
    struct tensor *out[2] = {&Y, &Z};
    assert_int_equal(call(&tn, in, 1, out, 2), 0);
    assert_int_equal(Y.dtype, DT_STRING);
    assert_string_equal(((char **)Y.data)[0], "cat");
    assert_string_equal(((char **)Y.data)[1], "dog");
    free(Y.data);
    free(Z.data);

    int64_t keys[2] = {4, 9}, xi[3] = {9, 1, 4};
    tn_init(&tn, "LabelEncoder", 2);
    tn_ints(&tn, "keys_int64s", keys, 2);
    tn_strs(&tn, "values_strings", names, 2);
    tn_str(&tn, "default_string", "none");
    struct tensor XI = {DT_INT64, 1, {3}, xi}, L = {0};
    const struct tensor *in2[1] = {&XI};
    struct tensor *out2[1] = {&L};
    assert_int_equal(call(&tn, in2, 1, out2, 1), 0);
    assert_string_equal(((char **)L.data)[0], "dog");
    assert_string_equal(((char **)L.data)[1], "none");
    assert_string_equal(((char **)L.data)[2], "cat");
    free(L.data);
}

static void test_zipmap_refused(void **st) {
    (void)st;
    float x[2] = {0.25f, 0.75f};
    struct tensor X = {DT_FP32, 2, {1, 2}, x}, Y = {0};
    struct tnode tn;
    tn_init(&tn, "ZipMap", 1);
    const struct tensor *in[1] = {&X};
    struct tensor *out[1] = {&Y};
    assert_int_equal(call(&tn, in, 1, out, 1), STATUS_UNSUPPORTED);
    assert_non_null(strstr(g_err, "ZipMap outputs a sequence of maps, which kiln does not serve; export with zipmap=False"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_classifier_softmax), cmocka_unit_test(test_linear_classifier_binary),
        cmocka_unit_test(test_tree_classifier),           cmocka_unit_test(test_tree_regressor_average),
        cmocka_unit_test(test_normalizer_scaler),         cmocka_unit_test(test_label_encoder),
        cmocka_unit_test(test_array_feature_extractor),   cmocka_unit_test(test_zipmap_refused),
        cmocka_unit_test(test_string_labels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
