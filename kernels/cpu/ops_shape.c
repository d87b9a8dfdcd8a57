/* ops_shape.c - operators that move bytes rather than compute: reshapes,
 * transposes, slicing, gathers and scatters, padding, tiling, and the small
 * generators (Shape, Range, ConstantOfShape...). Most kernels only know the
 * element size, so they serve every dtype except strings (whose elements are
 * owned pointers and cannot be duplicated by a byte copy).
 *
 * Shapes that depend on an input's values (Reshape's shape, Slice's starts,
 * Tile's repeats...) are read in infer() from constant inputs; when such an
 * input is only known at run time, infer() fails with STATUS_UNSUPPORTED
 * since kiln plans memory before running. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

/* ------------------------------------------------------------------------
 * Common helpers
 * ------------------------------------------------------------------------ */

static const struct tensor *in_opt(const struct op_call *c, int i) { return i < c->nin ? c->in[i] : NULL; }
static struct tensor *out_opt(const struct op_call *c, int i) { return i < c->nout ? c->out[i] : NULL; }

static int need_input(struct op_call *c, int i, const char *what) {
    if (!in_opt(c, i)) return op_error(c, "input %d (%s) is required", i, what);
    return 0;
}

/* Fails unless input i is present and its values are known now. */
static int need_const(struct op_call *c, int i, const char *what) {
    int rc = need_input(c, i, what);
    if (rc) return rc;
    if (!c->in[i]->data) {
        op_error(c, "input %d (%s) must be a constant known when the plan is built; kiln does not support "
                    "output shapes that depend on values computed at run time",
                 i, what);
        return STATUS_UNSUPPORTED;
    }
    return 0;
}

static int need_bytes_dtype(struct op_call *c, const struct tensor *t, const char *what) {
    if (t->dtype == DT_STRING || dtype_size(t->dtype) == 0)
        return op_error(c, "%s has dtype %s, which this operator does not support", what, dtype_name(t->dtype));
    return 0;
}

__attribute__((unused)) static int need_int_dtype(struct op_call *c, const struct tensor *t, const char *what) {
    if (t->dtype != DT_INT64 && t->dtype != DT_INT32)
        return op_error(c, "%s must be int64 or int32, got %s", what, dtype_name(t->dtype));
    return 0;
}

/* Reads the integer values of input i (which must be constant now) into v;
 * returns the count or a negative status. */
static int read_int_input(struct op_call *c, int i, const char *what, int64_t *v, int max) {
    int rc = need_const(c, i, what);
    if (rc) return rc;
    const struct tensor *t = c->in[i];
    if (t->dtype != DT_INT64 && t->dtype != DT_INT32)
        return op_error(c, "%s must be int64 or int32, got %s", what, dtype_name(t->dtype));
    int64_t n = tensor_numel(t);
    if (n < 0 || n > max) return op_error(c, "%s has %lld values; at most %d are supported", what, (long long)n, max);
    for (int64_t k = 0; k < n; k++) v[k] = op_int_at(t, k);
    return (int)n;
}

/* Reads an int list from attribute name; returns the count, -1 if absent. */
static int read_int_attr(struct op_call *c, const char *name, int64_t *v, int max) {
    const int64_t *a;
    int n = node_attr_ints(c->node, name, &a);
    if (n < 0) return -1;
    if (n > max) return op_error(c, "attribute '%s' has %d values; at most %d are supported", name, n, max);
    for (int k = 0; k < n; k++) v[k] = a[k];
    return n;
}

static int set_shape(struct op_call *c, struct tensor *o, enum dtype dt, int nd, const int64_t *dims) {
    if (nd > TENSOR_MAX_DIMS) return op_error(c, "output rank %d exceeds kiln's limit of %d", nd, TENSOR_MAX_DIMS);
    o->dtype = dt;
    o->ndim = nd;
    for (int k = 0; k < nd; k++) o->dims[k] = dims[k];
    return 0;
}

static int64_t prod(const int64_t *d, int from, int to) {
    int64_t p = 1;
    for (int k = from; k < to; k++) p *= d[k];
    return p;
}

/* Copies input 0 to output 0 unless the plan made them share bytes. */
static int run_copy0(struct op_call *c) {
    if (c->out[0]->data != c->in[0]->data) {
        size_t n = tensor_nbytes(c->out[0]);
        if (n) memmove(c->out[0]->data, c->in[0]->data, n);
    }
    return 0;
}

static int check_same_numel(struct op_call *c, const struct tensor *x, const struct tensor *o) {
    if (tensor_numel(x) != tensor_numel(o)) {
        char a[128], b[128];
        return op_error(c, "cannot reshape %s to %s", tensor_shape_str(x, a, sizeof a), tensor_shape_str(o, b, sizeof b));
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout
 * ------------------------------------------------------------------------ */

static int reshape_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t sh[TENSOR_MAX_DIMS + 1];
    int n;
    if (c->node->opset < 5) n = read_int_attr(c, "shape", sh, TENSOR_MAX_DIMS);
    else n = read_int_input(c, 1, "shape", sh, TENSOR_MAX_DIMS);
    if (n < 0) return n == -1 ? op_error(c, "the target shape is missing") : n;
    int allowzero = c->node->opset >= 14 ? (int)node_attr_int(c->node, "allowzero", 0) : 0;
    int64_t known = 1;
    int neg = -1;
    for (int k = 0; k < n; k++) {
        int64_t v = sh[k];
        if (v == 0 && !allowzero) {
            if (k >= x->ndim) return op_error(c, "shape[%d] is 0 (copy) but the input has rank %d", k, x->ndim);
            v = x->dims[k];
        } else if (v == -1) {
            if (neg >= 0) return op_error(c, "the target shape has more than one -1");
            neg = k;
            continue;
        } else if (v < 0) {
            return op_error(c, "shape[%d] is %lld", k, (long long)v);
        }
        sh[k] = v;
        known *= v;
    }
    int64_t numel = tensor_numel(x);
    if (neg >= 0) {
        if (known == 0) {
            if (numel != 0) return op_error(c, "cannot infer the -1 dimension next to a 0 dimension");
            sh[neg] = 0;
        } else {
            if (numel % known) {
                char a[128];
                return op_error(c, "cannot reshape %s: %lld elements are not divisible by %lld",
                                tensor_shape_str(x, a, sizeof a), (long long)numel, (long long)known);
            }
            sh[neg] = numel / known;
        }
    }
    int rc = set_shape(c, c->out[0], x->dtype, n, sh);
    return rc ? rc : check_same_numel(c, x, c->out[0]);
}

static int flatten_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t axis = node_attr_int(c->node, "axis", 1);
    if (axis < 0) axis += x->ndim;
    if (axis < 0 || axis > x->ndim) return op_error(c, "axis %lld is out of range for rank %d", (long long)node_attr_int(c->node, "axis", 1), x->ndim);
    int64_t d[2] = {prod(x->dims, 0, (int)axis), prod(x->dims, (int)axis, x->ndim)};
    return set_shape(c, c->out[0], x->dtype, 2, d);
}

static int squeeze_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t axes[TENSOR_MAX_DIMS];
    int n;
    if (c->node->opset < 13) n = read_int_attr(c, "axes", axes, TENSOR_MAX_DIMS);
    else if (in_opt(c, 1)) n = read_int_input(c, 1, "axes", axes, TENSOR_MAX_DIMS);
    else n = -1;
    if (n < -1) return n;
    int drop[TENSOR_MAX_DIMS] = {0};
    if (n < 0) {
        for (int k = 0; k < x->ndim; k++) drop[k] = x->dims[k] == 1;
    } else {
        for (int k = 0; k < n; k++) {
            int a = op_axis(c, axes[k], x->ndim);
            if (a < 0) return STATUS_INVALID;
            if (x->dims[a] != 1) return op_error(c, "cannot squeeze axis %d of size %lld", a, (long long)x->dims[a]);
            drop[a] = 1;
        }
    }
    int64_t d[TENSOR_MAX_DIMS];
    int m = 0;
    for (int k = 0; k < x->ndim; k++)
        if (!drop[k]) d[m++] = x->dims[k];
    return set_shape(c, c->out[0], x->dtype, m, d);
}

static int unsqueeze_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t axes[TENSOR_MAX_DIMS];
    int n;
    if (c->node->opset < 13) n = read_int_attr(c, "axes", axes, TENSOR_MAX_DIMS);
    else n = read_int_input(c, 1, "axes", axes, TENSOR_MAX_DIMS);
    if (n < 0) return n == -1 ? op_error(c, "attribute 'axes' is required") : n;
    int r = x->ndim + n;
    if (r > TENSOR_MAX_DIMS) return op_error(c, "output rank %d exceeds kiln's limit of %d", r, TENSOR_MAX_DIMS);
    int ins[TENSOR_MAX_DIMS] = {0};
    for (int k = 0; k < n; k++) {
        int a = op_axis(c, axes[k], r);
        if (a < 0) return STATUS_INVALID;
        if (ins[a]) return op_error(c, "axis %d is repeated", a);
        ins[a] = 1;
    }
    int64_t d[TENSOR_MAX_DIMS];
    int j = 0;
    for (int k = 0; k < r; k++) d[k] = ins[k] ? 1 : x->dims[j++];
    return set_shape(c, c->out[0], x->dtype, r, d);
}

static int identity_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    return set_shape(c, c->out[0], x->dtype, x->ndim, x->dims);
}

static int dropout_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    const struct tensor *ratio = in_opt(c, 1), *train = in_opt(c, 2);
    if (train) {
        if (!train->data) {
            op_error(c, "training_mode must be a constant; kiln runs Dropout for inference only");
            return STATUS_UNSUPPORTED;
        }
        double r = 0.5;
        if (ratio) {
            if (!ratio->data) {
                op_error(c, "ratio must be a constant when training_mode is given");
                return STATUS_UNSUPPORTED;
            }
            r = op_double_at(ratio, 0);
        }
        if (op_int_at(train, 0) && r != 0) {
            op_error(c, "training_mode is true with ratio %g; kiln runs Dropout for inference only", r);
            return STATUS_UNSUPPORTED;
        }
    }
    int rc = set_shape(c, c->out[0], x->dtype, x->ndim, x->dims);
    if (rc) return rc;
    struct tensor *mask = out_opt(c, 1);
    if (mask) rc = set_shape(c, mask, c->node->opset >= 10 ? DT_BOOL : x->dtype, x->ndim, x->dims);
    return rc;
}

static int dropout_run(struct op_call *c) {
    run_copy0(c);
    struct tensor *mask = out_opt(c, 1);
    if (mask && mask->data) {
        int64_t n = tensor_numel(mask);
        if (mask->dtype == DT_BOOL) memset(mask->data, 1, (size_t)n);
        else
            for (int64_t i = 0; i < n; i++) shape_store_double(mask->dtype, mask->data, i, 1.0);
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Shape, Size, Constant, ConstantOfShape
 * ------------------------------------------------------------------------ */

static void shape_range(const struct op_call *c, int *start, int *end) {
    int r = c->in[0]->ndim;
    int64_t s = 0, e = r;
    if (c->node->opset >= 15) {
        s = node_attr_int(c->node, "start", 0);
        e = node_attr_int(c->node, "end", r);
    }
    if (s < 0) s += r;
    if (e < 0) e += r;
    s = s < 0 ? 0 : (s > r ? r : s);
    e = e < 0 ? 0 : (e > r ? r : e);
    *start = (int)s;
    *end = (int)(e > s ? e : s);
}

static int shape_infer(struct op_call *c) {
    int s, e;
    shape_range(c, &s, &e);
    int64_t d = e - s;
    return set_shape(c, c->out[0], DT_INT64, 1, &d);
}

static int shape_run(struct op_call *c) {
    int s, e;
    shape_range(c, &s, &e);
    int64_t *o = c->out[0]->data;
    for (int k = s; k < e; k++) o[k - s] = c->in[0]->dims[k];
    return 0;
}

static int size_infer(struct op_call *c) { return set_shape(c, c->out[0], DT_INT64, 0, NULL); }

static int size_run(struct op_call *c) {
    *(int64_t *)c->out[0]->data = tensor_numel(c->in[0]);
    return 0;
}

/* The value of a Constant node as a tensor view; scalar attributes are
 * viewed in place (graph_attr keeps i and f). */
static int constant_value(struct op_call *c, struct tensor *v) {
    const struct graph_attr *a;
    memset(v, 0, sizeof *v);
    if ((a = node_attr(c->node, "value")) && a->type == ATTR_TENSOR && a->t) {
        *v = *a->t;
        if (v->dtype == DT_STRING) {
            op_error(c, "string constants are not supported");
            return STATUS_UNSUPPORTED;
        }
        return 0;
    }
    if ((a = node_attr(c->node, "value_float")) && a->type == ATTR_FLOAT) {
        v->dtype = DT_FP32;
        v->data = (void *)&a->f;
        return 0;
    }
    if ((a = node_attr(c->node, "value_int")) && a->type == ATTR_INT) {
        v->dtype = DT_INT64;
        v->data = (void *)&a->i;
        return 0;
    }
    if ((a = node_attr(c->node, "value_floats")) && a->type == ATTR_FLOATS) {
        v->dtype = DT_FP32;
        v->ndim = 1;
        v->dims[0] = a->n;
        v->data = a->floats;
        return 0;
    }
    if ((a = node_attr(c->node, "value_ints")) && a->type == ATTR_INTS) {
        v->dtype = DT_INT64;
        v->ndim = 1;
        v->dims[0] = a->n;
        v->data = a->ints;
        return 0;
    }
    if (node_attr(c->node, "value_string") || node_attr(c->node, "value_strings")) {
        op_error(c, "string constants are not supported");
        return STATUS_UNSUPPORTED;
    }
    if (node_attr(c->node, "sparse_value")) {
        op_error(c, "sparse constants are not supported");
        return STATUS_UNSUPPORTED;
    }
    return op_error(c, "no value attribute (value, value_float(s), value_int(s))");
}

static int constant_infer(struct op_call *c) {
    struct tensor v;
    int rc = constant_value(c, &v);
    if (rc) return rc;
    return set_shape(c, c->out[0], v.dtype, v.ndim, v.dims);
}

static int constant_run(struct op_call *c) {
    struct tensor v;
    int rc = constant_value(c, &v);
    if (rc) return rc;
    size_t n = tensor_nbytes(&v);
    if (n) memcpy(c->out[0]->data, v.data, n);
    return 0;
}

static int cos_value(struct op_call *c, struct tensor *v) {
    const struct tensor *t = node_attr_tensor(c->node, "value");
    static const float zero = 0;
    memset(v, 0, sizeof *v);
    if (!t) {
        v->dtype = DT_FP32;
        v->data = (void *)&zero;
        return 0;
    }
    if (tensor_numel(t) != 1 || !t->data) return op_error(c, "attribute 'value' must hold exactly one element");
    if (need_bytes_dtype(c, t, "attribute 'value'")) return STATUS_INVALID;
    *v = *t;
    return 0;
}

static int cos_infer(struct op_call *c) {
    int64_t d[TENSOR_MAX_DIMS];
    int n = read_int_input(c, 0, "shape", d, TENSOR_MAX_DIMS);
    if (n < 0) return n;
    for (int k = 0; k < n; k++)
        if (d[k] < 0) return op_error(c, "shape[%d] is %lld", k, (long long)d[k]);
    struct tensor v;
    int rc = cos_value(c, &v);
    return rc ? rc : set_shape(c, c->out[0], v.dtype, n, d);
}

static int cos_run(struct op_call *c) {
    struct tensor v;
    int rc = cos_value(c, &v);
    if (rc) return rc;
    size_t es = dtype_size(v.dtype);
    int64_t n = tensor_numel(c->out[0]);
    char *o = c->out[0]->data;
    int zero = 1;
    for (size_t b = 0; b < es; b++) zero &= ((const unsigned char *)v.data)[b] == 0;
    if (zero) memset(o, 0, (size_t)n * es);
    else
        for (int64_t i = 0; i < n; i++) memcpy(o + i * (int64_t)es, v.data, es);
    return 0;
}

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

const struct op_def op_defs_shape[] = {
    {"Reshape", "", reshape_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"Flatten", "", flatten_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"Squeeze", "", squeeze_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"Unsqueeze", "", unsqueeze_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"Identity", "", identity_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"Dropout", "", dropout_infer, NULL, dropout_run, NULL, OP_ALIAS_INPUT0},
    {"Shape", "", shape_infer, NULL, shape_run, NULL, OP_SHAPE_ONLY},
    {"Size", "", size_infer, NULL, size_run, NULL, OP_SHAPE_ONLY},
    {"Constant", "", constant_infer, NULL, constant_run, NULL, 0},
    {"ConstantOfShape", "", cos_infer, NULL, cos_run, NULL, 0},
    {0},
};
