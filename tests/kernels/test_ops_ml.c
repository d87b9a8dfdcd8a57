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
#include "tests/kernels/harness.h"

static int call(struct tnode *tn, const struct tensor **in, int nin, struct tensor **out, int nout) {
    return tn_call(&tn->n, in, nin, out, nout, 1);
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
    tn_init_domain(&tn, "ai.onnx.ml", "LinearClassifier", 1);
    tn_floats(&tn, "coefficients", 6, coef);
    tn_floats(&tn, "intercepts", 3, icp);
    tn_ints(&tn, "classlabels_ints", 3, labels);
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
    tn_init_domain(&tn, "ai.onnx.ml", "LinearClassifier", 1);
    tn_floats(&tn, "coefficients", 1, coef);
    tn_floats(&tn, "intercepts", 1, icp);
    tn_ints(&tn, "classlabels_ints", 2, labels);
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
    tn_ints(tn, "nodes_treeids", 6, tid);
    tn_ints(tn, "nodes_nodeids", 6, nid);
    tn_ints(tn, "nodes_featureids", 6, fid);
    tn_strs(tn, "nodes_modes", 6, modes);
    tn_floats(tn, "nodes_values", 6, vals);
    tn_ints(tn, "nodes_truenodeids", 6, tt);
    tn_ints(tn, "nodes_falsenodeids", 6, ff);
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
    tn_init_domain(&tn, "ai.onnx.ml", "TreeEnsembleClassifier", 1);
    tree_attrs(&tn, tid, nid, fid, modes, vals, tt, ff);
    tn_ints(&tn, "class_treeids", 4, ctid);
    tn_ints(&tn, "class_nodeids", 4, cnid);
    tn_ints(&tn, "class_ids", 4, cid);
    tn_floats(&tn, "class_weights", 4, cw);
    tn_ints(&tn, "classlabels_int64s", 3, labels);
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
    tn_init_domain(&tn, "ai.onnx.ml", "TreeEnsembleClassifier", 1);
    tree_attrs(&tn, tid, nid, fid, modes, vals, tt, ff);
    tn_ints(&tn, "class_treeids", 4, ctid);
    tn_ints(&tn, "class_nodeids", 4, cnid);
    tn_ints(&tn, "class_ids", 4, cid);
    tn_floats(&tn, "class_weights", 4, cw);
    tn_ints(&tn, "classlabels_int64s", 3, labels);
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
    tn_init_domain(&tn, "ai.onnx.ml", "TreeEnsembleRegressor", 1);
    tree_attrs(&tn, tid, nid, fid, modes, vals, tt, ff);
    tn_ints(&tn, "target_treeids", 4, ttid);
    tn_ints(&tn, "target_nodeids", 4, tnid);
    tn_ints(&tn, "target_ids", 4, tgt);
    tn_floats(&tn, "target_weights", 4, tw);
    tn_floats(&tn, "base_values", 1, base);
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
        tn_init_domain(&tn, "ai.onnx.ml", "Normalizer", 1);
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
    tn_init_domain(&tn, "ai.onnx.ml", "Scaler", 1);
    tn_floats(&tn, "offset", 3, off);
    tn_floats(&tn, "scale", 1, sc);
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
    tn_init_domain(&tn, "ai.onnx.ml", "LabelEncoder", 2);
    tn_ints(&tn, "keys_int64s", 3, keys);
    tn_ints(&tn, "values_int64s", 3, vals);
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
    tn_init_domain(&tn, "ai.onnx.ml", "ArrayFeatureExtractor", 1);
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
    tn_init_domain(&tn, "ai.onnx.ml", "LinearClassifier", 1);
    tn_floats(&tn, "coefficients", 2, coef);
    tn_strs(&tn, "classlabels_strings", 2, names);
    const struct tensor *in[1] = {&X};
    struct tensor *out[2] = {&Y, &Z};
    assert_int_equal(call(&tn, in, 1, out, 2), 0);
    assert_int_equal(Y.dtype, DT_STRING);
    assert_tstr(tensor_strs(&Y)[0], "cat");
    assert_tstr(tensor_strs(&Y)[1], "dog");
    free(Y.data);
    free(Z.data);

    int64_t keys[2] = {4, 9}, xi[3] = {9, 1, 4};
    tn_init_domain(&tn, "ai.onnx.ml", "LabelEncoder", 2);
    tn_ints(&tn, "keys_int64s", 2, keys);
    tn_strs(&tn, "values_strings", 2, names);
    tn_str(&tn, "default_string", "none");
    struct tensor XI = {DT_INT64, 1, {3}, xi}, L = {0};
    const struct tensor *in2[1] = {&XI};
    struct tensor *out2[1] = {&L};
    assert_int_equal(call(&tn, in2, 1, out2, 1), 0);
    assert_tstr(tensor_strs(&L)[0], "dog");
    assert_tstr(tensor_strs(&L)[1], "none");
    assert_tstr(tensor_strs(&L)[2], "cat");
    free(L.data);
}

static void test_zipmap_refused(void **st) {
    (void)st;
    float x[2] = {0.25f, 0.75f};
    struct tensor X = {DT_FP32, 2, {1, 2}, x}, Y = {0};
    struct tnode tn;
    tn_init_domain(&tn, "ai.onnx.ml", "ZipMap", 1);
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
    g_run_without_attrs = 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
