/* ops_ml_encode.c - ai.onnx.ml preprocessing that scikit-learn pipelines
 * export (skl2onnx: SimpleImputer, OneHotEncoder in a ColumnTransformer):
 * Imputer and OneHotEncoder, after onnxruntime's kernels. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/params_util.h"
#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

/* ---- Imputer ----------------------------------------------------------------- */

/* The values that replace the missing one: one for every column, or one
 * per column; the missing value (NaN compares as NaN). */
struct imputer_params {
    const float *fill_f;
    const int64_t *fill_i;
    int nfill;
    double missing;
    int64_t missing_i;
};

static int imputer_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    if (x->dtype != DT_FP32 && x->dtype != DT_FP64 && x->dtype != DT_INT64 && x->dtype != DT_INT32)
        return op_error(c, "input dtype %s is not supported (float, double, int64, int32)", dtype_name(x->dtype));
    if (x->ndim < 1 || x->ndim > 2) return op_error(c, "input must be [N, C] or [C], got rank %d", x->ndim);
    *c->out[0] = (struct tensor){.dtype = x->dtype, .ndim = x->ndim};
    memcpy(c->out[0]->dims, x->dims, sizeof x->dims);
    return 0;
}

static int imputer_prepare(struct op_call *c, void **state, size_t *scratch) {
    const struct tensor *x = c->in[0];
    struct imputer_params p = {0};
    int is_float = x->dtype == DT_FP32 || x->dtype == DT_FP64;
    p.nfill = is_float ? node_attr_floats(c->node, "imputed_value_floats", &p.fill_f)
                       : node_attr_ints(c->node, "imputed_value_int64s", &p.fill_i);
    int64_t cols = x->dims[x->ndim - 1];
    if (p.nfill < 1 || (p.nfill != 1 && p.nfill != cols))
        return op_error(c, "%s must hold 1 or %lld values (the columns), has %d",
                        is_float ? "imputed_value_floats" : "imputed_value_int64s", (long long)cols,
                        p.nfill < 0 ? 0 : p.nfill);
    p.missing = node_attr_float(c->node, "replaced_value_float", 0);
    p.missing_i = node_attr_int(c->node, "replaced_value_int64", 0);
    return params_keep(c, &p, sizeof p, state);
}

static int imputer_run(struct op_call *c) {
    const struct imputer_params *p = c->state;
    const struct tensor *x = c->in[0];
    int64_t n = tensor_numel(x), cols = x->dims[x->ndim - 1];
    void *y = c->out[0]->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t col = cols ? i % cols : 0, k = p->nfill == 1 ? 0 : col;
        if (x->dtype == DT_FP32 || x->dtype == DT_FP64) {
            double v = op_double_at(x, i);
            int missing = isnan(p->missing) ? isnan(v) : v == p->missing;
            shape_store_double(x->dtype, y, i, missing ? (double)p->fill_f[k] : v);
        } else {
            int64_t v = op_int_at(x, i);
            shape_store_double(x->dtype, y, i, (double)(v == p->missing_i ? p->fill_i[k] : v));
        }
    }
    return 0;
}

/* ---- OneHotEncoder --------------------------------------------------------- */

/* The categories, and for strings an index sorted by value for lookups. */
struct onehot_params {
    const int64_t *ints;
    const struct graph_attr *strs; /* cats_strings */
    int ncats;
    int zeros;          /* 1: an unknown category is a row of zeros; 0: an error */
    int *order;         /* strings: category indices sorted by their string */
};

static void onehot_free(void *state) {
    struct onehot_params *p = state;
    if (p) free(p->order);
    op_params_free(p);
}

static int onehot_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int nints = node_attr_ints(c->node, "cats_int64s", &(const int64_t *){0});
    const struct graph_attr *s = node_attr(c->node, "cats_strings");
    int ncats = nints > 0 ? nints : (s && s->type == ATTR_STRINGS ? s->n : 0);
    if (ncats < 1) return op_error(c, "one of cats_int64s or cats_strings must list the categories");
    if ((x->dtype == DT_STRING) != (nints <= 0))
        return op_error(c, "a %s input needs %s", dtype_name(x->dtype), x->dtype == DT_STRING ? "cats_strings" : "cats_int64s");
    if (x->dtype != DT_STRING && x->dtype != DT_INT64 && x->dtype != DT_INT32 && x->dtype != DT_FP32 &&
        x->dtype != DT_FP64)
        return op_error(c, "input dtype %s is not supported (string, int64, int32, float, double)", dtype_name(x->dtype));
    if (x->ndim + 1 > TENSOR_MAX_DIMS) return op_error(c, "input rank %d is too high", x->ndim);
    *c->out[0] = (struct tensor){.dtype = DT_FP32, .ndim = x->ndim + 1};
    memcpy(c->out[0]->dims, x->dims, sizeof x->dims);
    c->out[0]->dims[x->ndim] = ncats;
    return 0;
}

static int cmp_cat(const void *a, const void *b, void *strs) {
    const struct graph_attr *s = strs;
    return tensor_str_cmp(graph_attr_str(s, *(const int *)a), graph_attr_str(s, *(const int *)b));
}

static int onehot_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct onehot_params p = {0};
    p.ncats = node_attr_ints(c->node, "cats_int64s", &p.ints);
    if (p.ncats <= 0) {
        const struct graph_attr *s = node_attr(c->node, "cats_strings");
        p.strs = s;
        p.ncats = s->n;
        p.ints = NULL;
    }
    p.zeros = (int)node_attr_int(c->node, "zeros", 1);
    if (p.strs) {
        p.order = malloc((size_t)p.ncats * sizeof *p.order);
        if (!p.order) return op_error(c, "out of memory");
        for (int i = 0; i < p.ncats; i++) p.order[i] = i;
        qsort_r(p.order, (size_t)p.ncats, sizeof *p.order, cmp_cat, (void *)p.strs);
    }
    int rc = params_keep(c, &p, sizeof p, state);
    if (rc) free(p.order);
    return rc;
}

/* The category index of element i, or -1. */
static int onehot_find(const struct onehot_params *p, const struct tensor *x, int64_t i) {
    if (p->strs) {
        struct tensor_str v = tensor_strs(x)[i]; /* every byte counts: "a\0b" is not "a" */
        int lo = 0, hi = p->ncats - 1;
        while (lo <= hi) {
            int mid = (lo + hi) / 2, cmp = tensor_str_cmp(v, graph_attr_str(p->strs, p->order[mid]));
            if (!cmp) return p->order[mid];
            if (cmp < 0) hi = mid - 1;
            else lo = mid + 1;
        }
        return -1;
    }
    int64_t v = x->dtype == DT_FP32 || x->dtype == DT_FP64 ? (int64_t)op_double_at(x, i) : op_int_at(x, i);
    for (int k = 0; k < p->ncats; k++)
        if (p->ints[k] == v) return k;
    return -1;
}

static int onehot_run(struct op_call *c) {
    const struct onehot_params *p = c->state;
    const struct tensor *x = c->in[0];
    int64_t n = tensor_numel(x);
    float *y = c->out[0]->data;
    memset(y, 0, (size_t)(n * p->ncats) * sizeof *y);
    for (int64_t i = 0; i < n; i++) {
        int k = onehot_find(p, x, i);
        if (k >= 0) y[i * p->ncats + k] = 1;
        else if (!p->zeros) return op_error(c, "value at %lld is not one of the %d categories (zeros is 0)",
                                            (long long)i, p->ncats);
    }
    return 0;
}

const struct op_def op_defs_ml_encode[] = {
    {"Imputer", "ai.onnx.ml", imputer_infer, imputer_prepare, imputer_run, op_params_free, 0},
    {"OneHotEncoder", "ai.onnx.ml", onehot_infer, onehot_prepare, onehot_run, onehot_free, 0},
    {NULL, NULL, NULL, NULL, NULL, NULL, 0},
};
