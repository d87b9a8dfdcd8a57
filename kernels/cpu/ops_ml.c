/* ops_ml.c - the ai.onnx.ml operators that scikit-learn exports use:
 * LinearClassifier, LinearRegressor, TreeEnsembleClassifier,
 * TreeEnsembleRegressor, TreeEnsemble (opset 5), SVMClassifier, SVMRegressor,
 * Normalizer, Scaler, Binarizer, ArrayFeatureExtractor and LabelEncoder.
 * Scores follow onnxruntime's conventions (post_transform, the binary
 * "second class" column), since that is what exporters are tested against.
 * String labels point into the node's attributes, which outlive every run.
 * ZipMap (a sequence of maps) is refused: kiln serves tensors only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/elementwise_util.h"
#include "kernels/cpu/params_util.h"
#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

/* ------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------ */

static const struct tensor *ml_in(const struct op_call *c, int i) { return i < c->nin ? c->in[i] : NULL; }
static struct tensor *ml_out(const struct op_call *c, int i) { return i < c->nout ? c->out[i] : NULL; }

static int ml_set(struct op_call *c, struct tensor *o, enum dtype dt, int nd, const int64_t *dims) {
    if (!o) return 0;
    if (nd > TENSOR_MAX_DIMS) return op_error(c, "output rank %d exceeds kiln's limit of %d", nd, TENSOR_MAX_DIMS);
    o->dtype = dt;
    o->ndim = nd;
    for (int k = 0; k < nd; k++) o->dims[k] = dims[k];
    return 0;
}

static int ml_numeric(struct op_call *c, const struct tensor *x) {
    switch (x->dtype) {
    case DT_FP32: case DT_FP64: case DT_INT64: case DT_INT32: return 0;
    default: return op_error(c, "input dtype %s is not supported (float, double, int64, int32)", dtype_name(x->dtype));
    }
}

/* Rows and features of a [N, C] or [C] input. */
static int ml_rows(struct op_call *c, const struct tensor *x, int64_t *n, int64_t *f) {
    *n = *f = 0;
    if (x->ndim == 1) {
        *n = 1;
        *f = x->dims[0];
    } else if (x->ndim == 2) {
        *n = x->dims[0];
        *f = x->dims[1];
    } else {
        return op_error(c, "input must be [N, C] or [C], got rank %d", x->ndim);
    }
    return 0;
}

enum post_transform { PT_NONE, PT_SOFTMAX, PT_LOGISTIC, PT_SOFTMAX_ZERO, PT_PROBIT };

static int ml_post_transform(struct op_call *c, enum post_transform *pt) {
    const char *s = node_attr_str(c->node, "post_transform", "NONE");
    if (!strcmp(s, "NONE")) *pt = PT_NONE;
    else if (!strcmp(s, "SOFTMAX")) *pt = PT_SOFTMAX;
    else if (!strcmp(s, "LOGISTIC")) *pt = PT_LOGISTIC;
    else if (!strcmp(s, "SOFTMAX_ZERO")) *pt = PT_SOFTMAX_ZERO;
    else if (!strcmp(s, "PROBIT")) *pt = PT_PROBIT;
    else return op_error(c, "unknown post_transform '%s'", s);
    return 0;
}

static float ml_logistic(float v) {
    /* Written so that exp never overflows. */
    return v >= 0 ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));
}

/* Winitzki's approximation of erf^-1, the one onnxruntime uses for PROBIT. */
static float ml_erfinv(float x) {
    float sgn = x < 0 ? -1.0f : 1.0f;
    x = (1 - x) * (1 + x);
    float lg = logf(x);
    float v = 2 / (3.14159f * 0.147f) + 0.5f * lg;
    float v2 = 1 / 0.147f * lg;
    float v3 = -v + sqrtf(v * v - v2);
    return sgn * sqrtf(v3);
}

static float ml_probit(float v) { return 1.41421356f * ml_erfinv(2 * v - 1); }

/* Applies a post transform to one row of n >= 2 scores. */
static void ml_transform_row(float *s, int64_t n, enum post_transform pt) {
    switch (pt) {
    case PT_NONE: return;
    case PT_PROBIT:
        for (int64_t j = 0; j < n; j++) s[j] = ml_probit(s[j]);
        return;
    case PT_LOGISTIC:
        for (int64_t j = 0; j < n; j++) s[j] = ml_logistic(s[j]);
        return;
    case PT_SOFTMAX:
    case PT_SOFTMAX_ZERO: {
        float mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
        for (int64_t j = 0; j < n; j++) {
            /* SOFTMAX_ZERO leaves exact zeros (classes never scored) at zero. */
            if (pt == PT_SOFTMAX_ZERO && s[j] > -1e-7f && s[j] < 1e-7f) s[j] = s[j] * expf(-mx);
            else s[j] = expf(s[j] - mx);
            sum += s[j];
        }
        for (int64_t j = 0; j < n; j++) s[j] /= sum;
        return;
    }
    }
}

static int ml_floats_attr(struct op_call *c, const char *name, const float **v, int required) {
    int n = node_attr_floats(c->node, name, v);
    if (n < 0 && required) return op_error(c, "attribute '%s' is required", name);
    return n;
}

/* ------------------------------------------------------------------------
 * ArrayFeatureExtractor, Binarizer, Normalizer, Scaler, ZipMap
 * ------------------------------------------------------------------------ */

static int afe_infer(struct op_call *c) {
    const struct tensor *x = c->in[0], *y = ml_in(c, 1);
    if (!y) return op_error(c, "input 1 (indices) is required");
    if (y->dtype != DT_INT64 && y->dtype != DT_INT32) return op_error(c, "indices must be int64, got %s", dtype_name(y->dtype));
    /* strings move as the pointers the plan's tensors borrow during a run */
    if (!dtype_size(x->dtype)) return op_error(c, "input dtype %s is not supported", dtype_name(x->dtype));
    if (x->ndim < 1) return op_error(c, "input must have rank >= 1");
    int64_t d[TENSOR_MAX_DIMS];
    int nd = x->ndim;
    memcpy(d, x->dims, sizeof d);
    if (nd == 1) { /* a vector is one row, as onnxruntime treats it */
        nd = 2;
        d[0] = 1;
    }
    d[nd - 1] = tensor_numel(y);
    return ml_set(c, c->out[0], x->dtype, nd, d);
}

static int afe_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *y = c->in[1];
    int64_t cols = x->dims[x->ndim - 1], rows = tensor_numel(x) / (cols ? cols : 1), k = tensor_numel(y);
    size_t es = dtype_size(x->dtype);
    for (int64_t j = 0; j < k; j++) {
        int64_t v = op_int_at(y, j);
        if (v < 0 || v >= cols)
            return op_error(c, "index %lld is out of range [0, %lld)", (long long)v, (long long)cols);
    }
    char *dst = c->out[0]->data;
    const char *src = x->data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < k; j++)
            memcpy(dst + (r * k + j) * (int64_t)es, src + (r * cols + op_int_at(y, j)) * (int64_t)es, es);
    return 0;
}

static int binarizer_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc = ml_numeric(c, x);
    return rc ? rc : ml_set(c, c->out[0], x->dtype, x->ndim, x->dims);
}

/* Binarizer's threshold, decoded at prepare. */
struct binarizer_params {
    double th;
};

static int binarizer_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct binarizer_params p = {node_attr_float(c->node, "threshold", 0)};
    return params_keep(c, &p, sizeof p, state);
}

static int binarizer_run(struct op_call *c) {
    const struct tensor *x = c->in[0];
    double th = ((const struct binarizer_params *)c->state)->th;
    int64_t n = tensor_numel(x);
    for (int64_t i = 0; i < n; i++) shape_store_double(x->dtype, c->out[0]->data, i, op_double_at(x, i) > th ? 1.0 : 0.0);
    return 0;
}

static int normalizer_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t n, f;
    int rc = ml_numeric(c, x);
    if (rc || (rc = ml_rows(c, x, &n, &f))) return rc;
    const char *norm = node_attr_str(c->node, "norm", "MAX");
    if (strcmp(norm, "MAX") && strcmp(norm, "L1") && strcmp(norm, "L2")) return op_error(c, "unknown norm '%s'", norm);
    return ml_set(c, c->out[0], DT_FP32, x->ndim, x->dims);
}

/* Normalizer's norm (0: MAX, 1: L1, 2: L2), decoded at prepare. */
struct normalizer_params {
    int kind;
};

static int normalizer_prepare(struct op_call *c, void **state, size_t *scratch) {
    const char *norm = node_attr_str(c->node, "norm", "MAX");
    struct normalizer_params p = {!strcmp(norm, "L1") ? 1 : (!strcmp(norm, "L2") ? 2 : 0)};
    return params_keep(c, &p, sizeof p, state);
}

static int normalizer_run(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t n, f;
    ml_rows(c, x, &n, &f);
    int kind = ((const struct normalizer_params *)c->state)->kind;
    float *o = c->out[0]->data;
    for (int64_t r = 0; r < n; r++) {
        float *row = o + r * f;
        for (int64_t j = 0; j < f; j++) row[j] = (float)op_double_at(x, r * f + j);
        float d = kind == 0 ? -INFINITY : 0;
        for (int64_t j = 0; j < f; j++) {
            if (kind == 0) d = row[j] > d ? row[j] : d;
            else if (kind == 1) d += fabsf(row[j]);
            else d += row[j] * row[j];
        }
        if (kind == 2) d = sqrtf(d);
        if (d != 0 && f > 0)
            for (int64_t j = 0; j < f; j++) row[j] /= d;
    }
    return 0;
}

static int scaler_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc = ml_numeric(c, x);
    if (rc) return rc;
    const float *v;
    int64_t f = x->ndim ? x->dims[x->ndim - 1] : 1;
    int no = node_attr_floats(c->node, "offset", &v), ns = node_attr_floats(c->node, "scale", &v);
    if (no > 1 && no != f) return op_error(c, "offset has %d values for %lld features", no, (long long)f);
    if (ns > 1 && ns != f) return op_error(c, "scale has %d values for %lld features", ns, (long long)f);
    return ml_set(c, c->out[0], DT_FP32, x->ndim, x->dims);
}

/* Scaler's offset and scale (views of the node's attributes, which
 * outlive the plan), decoded at prepare. */
struct scaler_params {
    const float *off, *sc;
    int no, ns;
};

static int scaler_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct scaler_params p = {NULL, NULL, 0, 0};
    p.no = node_attr_floats(c->node, "offset", &p.off);
    p.ns = node_attr_floats(c->node, "scale", &p.sc);
    return params_keep(c, &p, sizeof p, state);
}

static int scaler_run(struct op_call *c) {
    const struct tensor *x = c->in[0];
    const struct scaler_params *p = c->state;
    const float *off = p->off, *sc = p->sc;
    int no = p->no, ns = p->ns;
    int64_t f = x->ndim ? x->dims[x->ndim - 1] : 1, n = tensor_numel(x);
    float *o = c->out[0]->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = f ? i % f : 0;
        float a = no > 0 ? off[no == 1 ? 0 : j] : 0, s = ns > 0 ? sc[ns == 1 ? 0 : j] : 1;
        o[i] = ((float)op_double_at(x, i) - a) * s;
    }
    return 0;
}

static int zipmap_infer(struct op_call *c) {
    op_error(c, "ZipMap outputs a sequence of maps, which kiln does not serve; export with zipmap=False");
    return STATUS_UNSUPPORTED;
}

static int zipmap_run(struct op_call *c) { return zipmap_infer(c); }

/* ------------------------------------------------------------------------
 * LinearClassifier, LinearRegressor
 * ------------------------------------------------------------------------ */

/* scores[r][e] = x[r] . coef[e] + intercept[e] */
static void ml_linear(const struct tensor *x, int64_t n, int64_t f, const float *coef, int64_t ne, const float *icp, int nicp,
                      float *scores, int64_t stride, int nt) {
#pragma omp parallel for if (n * ne * f > 65536) num_threads(nt > 0 ? nt : 1)
    for (int64_t r = 0; r < n; r++)
        for (int64_t e = 0; e < ne; e++) {
            float acc = nicp > e ? icp[e] : 0;
            for (int64_t j = 0; j < f; j++) acc += (float)op_double_at(x, r * f + j) * coef[e * f + j];
            scores[r * stride + e] = acc;
        }
}

/* Class labels: integers, or strings that label outputs point to (the
 * node's attribute storage outlives every run, as borrowed strings must). */
struct ml_labels {
    int n;
    const int64_t *ints;
    const struct graph_attr *strs; /* classlabels_strings */
};

static void ml_get_labels(const struct graph_node *nd, const char *ints_name, struct ml_labels *l) {
    const struct graph_attr *a = node_attr(nd, "classlabels_strings");
    memset(l, 0, sizeof *l);
    if (a && a->type == ATTR_STRINGS) {
        l->strs = a;
        l->n = a->n;
    } else {
        l->n = node_attr_ints(nd, ints_name, &l->ints);
        if (l->n < 0) l->n = 0;
    }
}

/* Writes label k, or for k < 0 the binary default ("0"/"1", 0/1) of -k-1. */
static void ml_put_label(struct tensor *y, int64_t r, const struct ml_labels *l, int64_t k) {
    if (l->strs) tensor_strs_mut(y)[r] = k >= 0 ? graph_attr_str(l->strs, (int)k) : tensor_str_of(k == -1 ? "0" : "1");
    else ((int64_t *)y->data)[r] = k >= 0 ? l->ints[k] : -k - 1;
}

/* LinearClassifier's problem, decoded at infer and again at prepare; the
 * coefficients and intercepts are views of the node's attributes. */
struct lc_shape {
    int64_t n, f, ne, labels;
    int add_second;
    struct ml_labels lab;
    const float *coef, *icp;
    int ni;
};

static int lc_shape(struct op_call *c, struct lc_shape *s) {
    const struct tensor *x = c->in[0];
    int rc = ml_numeric(c, x);
    if (rc || (rc = ml_rows(c, x, &s->n, &s->f))) return rc;
    int nc = ml_floats_attr(c, "coefficients", &s->coef, 1);
    if (nc < 0) return nc == -1 ? STATUS_INVALID : nc;
    int ni = s->ni = node_attr_floats(c->node, "intercepts", &s->icp);
    ml_get_labels(c->node, "classlabels_ints", &s->lab);
    int nl = s->lab.n;
    if (s->f == 0 || nc % s->f) return op_error(c, "%d coefficients do not divide into %lld features", nc, (long long)s->f);
    s->ne = nc / s->f;
    if (ni > 0 && ni != s->ne) return op_error(c, "%d intercepts for %lld classes", ni, (long long)s->ne);
    s->labels = nl;
    s->add_second = s->ne == 1 && nl == 2;
    if (s->ne > 1 && nl != s->ne) return op_error(c, "%lld classes but %d class labels", (long long)s->ne, nl);
    return 0;
}

static int lc_infer(struct op_call *c) {
    struct lc_shape s;
    enum post_transform pt;
    int rc = lc_shape(c, &s);
    if (rc || (rc = ml_post_transform(c, &pt))) return rc;
    int64_t d[2] = {s.n, s.add_second ? 2 : s.ne};
    if ((rc = ml_set(c, c->out[0], s.lab.strs ? DT_STRING : DT_INT64, 1, d))) return rc;
    return ml_set(c, ml_out(c, 1), DT_FP32, 2, d);
}

/* LinearClassifier's problem and post transform, decoded at prepare. */
struct lc_params {
    struct lc_shape s;
    enum post_transform pt;
};

static int lc_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct lc_params p;
    int rc = lc_shape(c, &p.s);
    if (rc || (rc = ml_post_transform(c, &p.pt))) return rc;
    *scratch = (size_t)(p.s.n * (p.s.ne > 1 ? p.s.ne : 2)) * sizeof(float);
    return params_keep(c, &p, sizeof p, state);
}

static int lc_run(struct op_call *c) {
    const struct lc_params *p = c->state;
    const struct lc_shape s = p->s;
    enum post_transform pt = p->pt;
    const float *coef = s.coef, *icp = s.icp;
    int ni = s.ni;
    struct tensor *z = ml_out(c, 1);
    int64_t cols = s.add_second ? 2 : s.ne;
    float *sc = z && z->data ? z->data : c->scratch;
    if (!sc || (!(z && z->data) && c->scratch_size < (size_t)(s.n * cols) * sizeof(float)))
        return op_error(c, "scratch buffer too small");
    ml_linear(c->in[0], s.n, s.f, coef, s.ne, icp, ni, sc, cols, c->nthreads);
    struct tensor *y = c->out[0];
    for (int64_t r = 0; r < s.n; r++) {
        float *row = sc + r * cols;
        if (s.ne == 1) {
            int have = s.labels == 2;
            ml_put_label(y, r, &s.lab, row[0] > 0 ? (have ? 1 : -2) : (have ? 0 : -1));
            if (s.add_second) {
                if (pt == PT_PROBIT) {
                    row[0] = ml_probit(row[0]);
                } else {
                    row[1] = row[0];
                    row[0] = 1 - row[0];
                }
            } else if (pt == PT_PROBIT) {
                row[0] = ml_probit(row[0]);
            }
        } else {
            int64_t best = 0;
            for (int64_t e = 1; e < s.ne; e++)
                if (row[e] > row[best]) best = e;
            ml_put_label(y, r, &s.lab, best);
            ml_transform_row(row, s.ne, pt);
        }
    }
    return 0;
}

/* LinearRegressor's problem (rows, features, targets), its post
 * transform, and its coefficients and intercepts (views of the node's
 * attributes), decoded at infer and again at prepare. */
struct lr_params {
    int64_t n, f, t;
    enum post_transform pt;
    const float *coef, *icp;
    int ni;
};

static int lr_shape(struct op_call *c, struct lr_params *p) {
    const struct tensor *x = c->in[0];
    int rc = ml_numeric(c, x);
    if (rc || (rc = ml_rows(c, x, &p->n, &p->f))) return rc;
    int nc = ml_floats_attr(c, "coefficients", &p->coef, 1);
    if (nc < 0) return nc == -1 ? STATUS_INVALID : nc;
    p->t = node_attr_int(c->node, "targets", 1);
    if (p->t < 1 || nc != p->t * p->f)
        return op_error(c, "%d coefficients do not match %lld targets x %lld features", nc, (long long)p->t, (long long)p->f);
    p->ni = node_attr_floats(c->node, "intercepts", &p->icp);
    if (p->ni > 0 && p->ni != p->t) return op_error(c, "%d intercepts for %lld targets", p->ni, (long long)p->t);
    return ml_post_transform(c, &p->pt);
}

static int lr_infer(struct op_call *c) {
    struct lr_params p;
    int rc = lr_shape(c, &p);
    if (rc) return rc;
    int64_t d[2] = {p.n, p.t};
    return ml_set(c, c->out[0], DT_FP32, 2, d);
}

static int lr_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct lr_params p;
    int rc = lr_shape(c, &p);
    return rc ? rc : params_keep(c, &p, sizeof p, state);
}

static int lr_run(struct op_call *c) {
    const struct lr_params *p = c->state;
    int64_t n = p->n, f = p->f, t = p->t;
    enum post_transform pt = p->pt;
    const float *coef = p->coef, *icp = p->icp;
    int ni = p->ni;
    float *o = c->out[0]->data;
    ml_linear(c->in[0], n, f, coef, t, icp, ni, o, t, c->nthreads);
    for (int64_t r = 0; r < n; r++) {
        if (t == 1) {
            if (pt == PT_PROBIT) o[r] = ml_probit(o[r]);
        } else {
            ml_transform_row(o + r * t, t, pt);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * TreeEnsembleClassifier, TreeEnsembleRegressor
 * ------------------------------------------------------------------------ */

enum tree_mode { TM_LEAF, TM_LEQ, TM_LT, TM_GTE, TM_GT, TM_EQ, TM_NEQ, TM_MEMBER };

struct tree_node {
    int mode, missing_true;
    int64_t feature;
    double value;
    int64_t child_true, child_false; /* node indices, -1 for none */
    int64_t w_first, w_count;        /* leaf weights in tree_state.w */
    int64_t m_first, m_count;        /* BRANCH_MEMBER: the set in tree_state.mem */
};

struct tree_weight {
    int64_t node, id;
    double w;
};

struct tree_state {
    int classifier;
    int64_t nnodes, ntrees, nw, nout;
    struct tree_node *nodes;
    int64_t *roots;
    struct tree_weight *w;
    double *base, *mem;
    int nbase;
    enum { AGG_SUM, AGG_AVG, AGG_MIN, AGG_MAX } agg;
    enum post_transform pt;
    struct ml_labels lab;
    int binary, all_positive;
};

static void tree_release(void *p) {
    struct tree_state *s = p;
    if (!s) return;
    free(s->nodes);
    free(s->roots);
    free(s->w);
    free(s->base);
    free(s->mem);
    free(s);
}

struct tree_key {
    int64_t tree, node, index;
};

static int tree_key_cmp(const void *pa, const void *pb) {
    const struct tree_key *a = pa, *b = pb;
    if (a->tree != b->tree) return a->tree < b->tree ? -1 : 1;
    if (a->node != b->node) return a->node < b->node ? -1 : 1;
    return 0;
}

static int tree_weight_cmp(const void *pa, const void *pb) {
    const struct tree_weight *a = pa, *b = pb;
    return a->node < b->node ? -1 : (a->node > b->node);
}

static int64_t tree_find(const struct tree_key *keys, int64_t n, int64_t tree, int64_t node) {
    struct tree_key k = {tree, node, 0};
    const struct tree_key *f = bsearch(&k, keys, (size_t)n, sizeof k, tree_key_cmp);
    return f ? f->index : -1;
}

/* Reads the ensemble attributes into a state with resolved child links. */
static int tree_build(struct op_call *c, int classifier, struct tree_state **out) {
    const struct graph_node *nd = c->node;
    const int64_t *tid, *nid, *fid, *tt, *ff, *miss, *wt, *wn, *wi;
    const float *vals, *ww, *bv;
    const struct graph_attr *modes = node_attr(nd, "nodes_modes");
    const char *pre = classifier ? "class_" : "target_";
    char a1[32], a2[32], a3[32], a4[32];
    snprintf(a1, sizeof a1, "%streeids", pre);
    snprintf(a2, sizeof a2, "%snodeids", pre);
    snprintf(a3, sizeof a3, "%sids", pre);
    snprintf(a4, sizeof a4, "%sweights", pre);
    int64_t n = node_attr_ints(nd, "nodes_treeids", &tid);
    if (n <= 0) return op_error(c, "attribute 'nodes_treeids' is required");
    if (node_attr_ints(nd, "nodes_nodeids", &nid) != n || node_attr_ints(nd, "nodes_featureids", &fid) != n ||
        node_attr_ints(nd, "nodes_truenodeids", &tt) != n || node_attr_ints(nd, "nodes_falsenodeids", &ff) != n ||
        !modes || modes->type != ATTR_STRINGS || modes->n != n)
        return op_error(c, "the nodes_* attributes must all have %lld entries", (long long)n);
    const struct tensor *vt = node_attr_tensor(nd, "nodes_values_as_tensor");
    int nv = node_attr_floats(nd, "nodes_values", &vals);
    if (!(nv == n || (vt && tensor_numel(vt) == n))) return op_error(c, "nodes_values must have %lld entries", (long long)n);
    int nmiss = node_attr_ints(nd, "nodes_missing_value_tracks_true", &miss);
    int64_t m = node_attr_ints(nd, a1, &wt);
    const struct tensor *wtens = NULL;
    {
        char a5[40];
        snprintf(a5, sizeof a5, "%s_as_tensor", a4);
        wtens = node_attr_tensor(nd, a5);
    }
    int nww = node_attr_floats(nd, a4, &ww);
    if (m < 0 || node_attr_ints(nd, a2, &wn) != m || node_attr_ints(nd, a3, &wi) != m ||
        !(nww == m || (wtens && tensor_numel(wtens) == m)))
        return op_error(c, "the %s* attributes must all have the same length", pre);
    struct tree_state *s = calloc(1, sizeof *s);
    struct tree_key *keys = calloc((size_t)n, sizeof *keys);
    if (!s || !keys) {
        free(keys);
        tree_release(s);
        return STATUS_NOMEM;
    }
    s->classifier = classifier;
    s->nnodes = n;
    s->nw = m;
    s->nodes = calloc((size_t)n, sizeof *s->nodes);
    s->roots = calloc((size_t)n, sizeof *s->roots);
    s->w = calloc((size_t)(m ? m : 1), sizeof *s->w);
    int rc = 0;
    if (!s->nodes || !s->roots || !s->w) {
        rc = STATUS_NOMEM;
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) keys[i] = (struct tree_key){tid[i], nid[i], i};
    qsort(keys, (size_t)n, sizeof *keys, tree_key_cmp);
    for (int64_t i = 1; i < n; i++)
        if (!tree_key_cmp(&keys[i - 1], &keys[i])) {
            rc = op_error(c, "node %lld of tree %lld is defined twice", (long long)keys[i].node, (long long)keys[i].tree);
            goto fail;
        }
    char *is_child = calloc((size_t)n, 1);
    if (!is_child) {
        rc = STATUS_NOMEM;
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) {
        struct tree_node *t = &s->nodes[i];
        const char *md = modes->strings[i];
        if (!strcmp(md, "LEAF")) t->mode = TM_LEAF;
        else if (!strcmp(md, "BRANCH_LEQ")) t->mode = TM_LEQ;
        else if (!strcmp(md, "BRANCH_LT")) t->mode = TM_LT;
        else if (!strcmp(md, "BRANCH_GTE")) t->mode = TM_GTE;
        else if (!strcmp(md, "BRANCH_GT")) t->mode = TM_GT;
        else if (!strcmp(md, "BRANCH_EQ")) t->mode = TM_EQ;
        else if (!strcmp(md, "BRANCH_NEQ")) t->mode = TM_NEQ;
        else {
            free(is_child);
            rc = op_error(c, "unknown node mode '%s'", md);
            goto fail;
        }
        t->feature = fid[i];
        t->value = nv == n ? vals[i] : op_double_at(vt, i);
        t->missing_true = nmiss == n ? (int)miss[i] : 0;
        t->child_true = t->child_false = -1;
        if (t->mode != TM_LEAF) {
            t->child_true = tree_find(keys, n, tid[i], tt[i]);
            t->child_false = tree_find(keys, n, tid[i], ff[i]);
            if (t->child_true < 0 || t->child_false < 0) {
                free(is_child);
                rc = op_error(c, "node %lld of tree %lld points to a missing child", (long long)nid[i], (long long)tid[i]);
                goto fail;
            }
            is_child[t->child_true] = is_child[t->child_false] = 1;
        }
    }
    /* A tree's root is its node that no other node points to. */
    for (int64_t i = 0; i < n; i++) {
        int64_t k = keys[i].index;
        if (is_child[k]) continue;
        if (s->ntrees && tid[s->roots[s->ntrees - 1]] == tid[k]) continue;
        s->roots[s->ntrees++] = k;
    }
    free(is_child);
    int all_pos = 1;
    int64_t maxid = -1, first_id = m ? wi[0] : 0;
    int single_id = 1;
    for (int64_t j = 0; j < m; j++) {
        int64_t k = tree_find(keys, n, wt[j], wn[j]);
        if (k < 0) {
            rc = op_error(c, "a weight refers to missing node %lld of tree %lld", (long long)wn[j], (long long)wt[j]);
            goto fail;
        }
        if (wi[j] < 0) {
            rc = op_error(c, "negative %sid %lld", pre, (long long)wi[j]);
            goto fail;
        }
        s->w[j] = (struct tree_weight){k, wi[j], nww == m ? ww[j] : op_double_at(wtens, j)};
        if (s->w[j].w < 0) all_pos = 0;
        if (wi[j] > maxid) maxid = wi[j];
        if (wi[j] != first_id) single_id = 0;
    }
    qsort(s->w, (size_t)m, sizeof *s->w, tree_weight_cmp);
    for (int64_t j = 0; j < m; j++) {
        struct tree_node *t = &s->nodes[s->w[j].node];
        if (!t->w_count) t->w_first = j;
        t->w_count++;
    }
    int nb = node_attr_floats(nd, "base_values", &bv);
    if (nb > 0) {
        s->base = malloc(sizeof(double) * (size_t)nb);
        if (!s->base) {
            rc = STATUS_NOMEM;
            goto fail;
        }
        for (int k = 0; k < nb; k++) s->base[k] = bv[k];
        s->nbase = nb;
    }
    if ((rc = ml_post_transform(c, &s->pt))) goto fail;
    if (classifier) {
        ml_get_labels(nd, "classlabels_int64s", &s->lab);
        int nl = s->lab.n;
        if (nl < 1) {
            rc = op_error(c, "attribute 'classlabels_int64s' or 'classlabels_strings' is required");
            goto fail;
        }
        if (maxid >= nl) {
            rc = op_error(c, "class id %lld is out of range for %d labels", (long long)maxid, nl);
            goto fail;
        }
        s->nout = nl;
        s->binary = nl == 2 && single_id;
        s->all_positive = all_pos;
    } else {
        s->nout = node_attr_int(nd, "n_targets", maxid + 1);
        if (s->nout < 1 || maxid >= s->nout) {
            rc = op_error(c, "target id %lld is out of range for n_targets %lld", (long long)maxid, (long long)s->nout);
            goto fail;
        }
        const char *agg = node_attr_str(nd, "aggregate_function", "SUM");
        if (!strcmp(agg, "SUM")) s->agg = AGG_SUM;
        else if (!strcmp(agg, "AVERAGE")) s->agg = AGG_AVG;
        else if (!strcmp(agg, "MIN")) s->agg = AGG_MIN;
        else if (!strcmp(agg, "MAX")) s->agg = AGG_MAX;
        else {
            rc = op_error(c, "unknown aggregate_function '%s'", agg);
            goto fail;
        }
    }
    if (s->nbase && s->nbase != s->nout && !(classifier && s->nbase <= 2)) {
        rc = op_error(c, "base_values has %d values for %lld outputs", s->nbase, (long long)s->nout);
        goto fail;
    }
    free(keys);
    *out = s;
    return 0;
fail:
    free(keys);
    tree_release(s);
    return rc;
}

/* The leaf that row x reaches in the tree rooted at node r; -1 when the
 * walk is longer than the node count (a cycle in a hostile file). */
static int64_t tree_walk(const struct tree_state *s, int64_t r, const double *x, int64_t nf) {
    int64_t k = r;
    for (int64_t steps = 0; steps <= s->nnodes; steps++) {
        const struct tree_node *t = &s->nodes[k];
        if (t->mode == TM_LEAF) return k;
        double v = t->feature < nf ? x[t->feature] : NAN;
        int go;
        if (isnan(v)) {
            go = t->missing_true;
        } else {
            switch (t->mode) {
            case TM_LEQ: go = v <= t->value; break;
            case TM_LT: go = v < t->value; break;
            case TM_GTE: go = v >= t->value; break;
            case TM_GT: go = v > t->value; break;
            case TM_EQ: go = v == t->value; break;
            case TM_MEMBER:
                go = 0;
                for (int64_t m = t->m_first; m < t->m_first + t->m_count; m++) go |= v == s->mem[m];
                break;
            default: go = v != t->value; break;
            }
        }
        k = go ? t->child_true : t->child_false;
    }
    return -1;
}

static int tree_infer_common(struct op_call *c, int classifier) {
    const struct tensor *x = c->in[0];
    int64_t n, f;
    int rc = ml_numeric(c, x);
    if (rc || (rc = ml_rows(c, x, &n, &f))) return rc;
    struct tree_state *s = NULL;
    if ((rc = tree_build(c, classifier, &s))) return rc;
    for (int64_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].mode != TM_LEAF && (s->nodes[i].feature < 0 || s->nodes[i].feature >= f)) {
            rc = op_error(c, "a node tests feature %lld but the input has %lld", (long long)s->nodes[i].feature, (long long)f);
            break;
        }
    int64_t d[2] = {n, s->nout};
    if (!rc && classifier) {
        rc = ml_set(c, c->out[0], s->lab.strs ? DT_STRING : DT_INT64, 1, d);
        if (!rc) rc = ml_set(c, ml_out(c, 1), DT_FP32, 2, d);
    } else if (!rc) {
        rc = ml_set(c, c->out[0], DT_FP32, 2, d);
    }
    tree_release(s);
    return rc;
}

static int tree_classifier_infer(struct op_call *c) { return tree_infer_common(c, 1); }
static int tree_regressor_infer(struct op_call *c) { return tree_infer_common(c, 0); }

static int tree_prepare_common(struct op_call *c, void **state, size_t *scratch, int classifier) {
    struct tree_state *s = NULL;
    int rc = tree_build(c, classifier, &s);
    if (rc) return rc;
    int64_t n, f;
    ml_rows(c, c->in[0], &n, &f);
    *state = s;
    /* per row: features as double, scores, and a has-score flag per output */
    *scratch = (size_t)(f + 2 * s->nout + 2) * sizeof(double);
    return 0;
}

static int tree_classifier_prepare(struct op_call *c, void **state, size_t *scratch) {
    return tree_prepare_common(c, state, scratch, 1);
}
static int tree_regressor_prepare(struct op_call *c, void **state, size_t *scratch) {
    return tree_prepare_common(c, state, scratch, 0);
}

static int tree_run(struct op_call *c) {
    const struct tree_state *s = c->state;
    const struct tensor *x = c->in[0];
    int64_t n, f;
    ml_rows(c, x, &n, &f);
    if (!s || c->scratch_size < (size_t)(f + 2 * s->nout + 2) * sizeof(double)) return op_error(c, "the plan was not prepared");
    double *xr = c->scratch, *sc = xr + f, *has = sc + s->nout;
    float *z = s->classifier ? (ml_out(c, 1) ? ml_out(c, 1)->data : NULL) : c->out[0]->data;
    struct tensor *y = s->classifier ? c->out[0] : NULL;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t j = 0; j < f; j++) xr[j] = x->dtype == DT_FP32 ? (double)((const float *)x->data)[r * f + j] : op_double_at(x, r * f + j);
        for (int64_t k = 0; k < s->nout; k++) sc[k] = has[k] = 0;
        for (int64_t t = 0; t < s->ntrees; t++) {
            int64_t leaf = tree_walk(s, s->roots[t], xr, f);
            if (leaf < 0) return op_error(c, "tree %lld has a cycle", (long long)t);
            const struct tree_node *ln = &s->nodes[leaf];
            for (int64_t j = ln->w_first; j < ln->w_first + ln->w_count; j++) {
                int64_t id = s->w[j].id;
                double w = s->w[j].w;
                if (!has[id]) sc[id] = w;
                else if (s->agg == AGG_MIN) sc[id] = w < sc[id] ? w : sc[id];
                else if (s->agg == AGG_MAX) sc[id] = w > sc[id] ? w : sc[id];
                else sc[id] += w;
                has[id] = 1;
            }
        }
        float out[2];
        float *zr = z ? z + r * s->nout : NULL;
        if (!s->classifier) {
            for (int64_t k = 0; k < s->nout; k++) {
                double v = sc[k];
                if (s->agg == AGG_AVG) v /= (double)(s->ntrees ? s->ntrees : 1);
                zr[k] = (float)(v + (s->nbase ? s->base[k] : 0));
            }
            if (s->nout == 1) {
                if (s->pt == PT_PROBIT) zr[0] = ml_probit(zr[0]);
            } else {
                ml_transform_row(zr, s->nout, s->pt);
            }
            continue;
        }
        if (s->binary) {
            /* One score for the positive class, as boosted binary models export. */
            int64_t id = s->w[0].id;
            double v = sc[id] + (s->nbase == 2 ? s->base[1] : (s->nbase == 1 ? s->base[0] : 0));
            int pos = s->all_positive ? v > 0.5 : v > 0;
            ml_put_label(y, r, &s->lab, pos ? 1 : 0);
            if (s->pt == PT_PROBIT) {
                out[0] = ml_probit((float)v);
                out[1] = 0;
            } else if (s->all_positive) {
                out[0] = (float)(1 - v);
                out[1] = (float)v;
            } else if (s->pt == PT_LOGISTIC) {
                out[0] = ml_logistic((float)-v);
                out[1] = ml_logistic((float)v);
            } else {
                out[0] = (float)-v;
                out[1] = (float)v;
            }
            if (zr) memcpy(zr, out, sizeof out);
            continue;
        }
        for (int64_t k = 0; k < s->nbase && k < s->nout; k++) {
            sc[k] += s->base[k];
            has[k] = 1;
        }
        int64_t best = -1;
        for (int64_t k = 0; k < s->nout; k++)
            if (has[k] && (best < 0 || sc[k] > sc[best])) best = k;
        ml_put_label(y, r, &s->lab, best < 0 ? 0 : best);
        if (zr) {
            for (int64_t k = 0; k < s->nout; k++) zr[k] = (float)sc[k];
            ml_transform_row(zr, s->nout, s->pt);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * TreeEnsemble (ai.onnx.ml opset 5): interior nodes and leaves in separate
 * arrays, read into the same state as the older ensembles (leaves are
 * appended after the interior nodes).
 * ------------------------------------------------------------------------ */

static int te5_ints(struct op_call *c, const char *name, const int64_t **v, int64_t n, int required) {
    int k = node_attr_ints(c->node, name, v);
    if (k < 0 && !required) {
        *v = NULL;
        return 0;
    }
    if (k != n) return op_error(c, "attribute '%s' must have %lld entries", name, (long long)n);
    return 0;
}

static int te5_build(struct op_call *c, struct tree_state **out) {
    const struct graph_node *nd = c->node;
    const int64_t *fid, *tt, *tl, *ff, *fl, *miss, *roots, *lt;
    const struct tensor *splits = node_attr_tensor(nd, "nodes_splits"), *modes = node_attr_tensor(nd, "nodes_modes");
    const struct tensor *lw = node_attr_tensor(nd, "leaf_weights"), *mv = node_attr_tensor(nd, "membership_values");
    int64_t n = node_attr_ints(nd, "nodes_featureids", &fid);
    if (n <= 0 || !splits || !modes || !lw) return op_error(c, "nodes_featureids, nodes_splits, nodes_modes and leaf_weights are required");
    int rc;
    if (tensor_numel(splits) != n || tensor_numel(modes) != n) return op_error(c, "nodes_splits and nodes_modes must have %lld entries", (long long)n);
    if ((rc = te5_ints(c, "nodes_truenodeids", &tt, n, 1)) || (rc = te5_ints(c, "nodes_trueleafs", &tl, n, 1)) ||
        (rc = te5_ints(c, "nodes_falsenodeids", &ff, n, 1)) || (rc = te5_ints(c, "nodes_falseleafs", &fl, n, 1)) ||
        (rc = te5_ints(c, "nodes_missing_value_tracks_true", &miss, n, 0)))
        return rc;
    int64_t nl = tensor_numel(lw), nt = node_attr_ints(nd, "tree_roots", &roots);
    if (nt < 1) return op_error(c, "attribute 'tree_roots' is required");
    if ((rc = te5_ints(c, "leaf_targetids", &lt, nl, 1))) return rc;
    struct tree_state *s = calloc(1, sizeof *s);
    if (!s) return STATUS_NOMEM;
    s->nnodes = n + nl;
    s->ntrees = nt;
    s->nw = nl;
    s->nodes = calloc((size_t)s->nnodes, sizeof *s->nodes);
    s->roots = calloc((size_t)nt, sizeof *s->roots);
    s->w = calloc((size_t)(nl ? nl : 1), sizeof *s->w);
    int64_t nm = mv ? tensor_numel(mv) : 0;
    s->mem = calloc((size_t)(nm ? nm : 1), sizeof(double));
    if (!s->nodes || !s->roots || !s->w || !s->mem) {
        tree_release(s);
        return STATUS_NOMEM;
    }
    s->nout = node_attr_int(nd, "n_targets", 1);
    if (s->nout < 1) {
        tree_release(s);
        return op_error(c, "n_targets must be positive");
    }
    int64_t agg = node_attr_int(nd, "aggregate_function", 1), pt = node_attr_int(nd, "post_transform", 0);
    if (agg < 0 || agg > 3 || pt < 0 || pt > 4) {
        tree_release(s);
        return op_error(c, "aggregate_function %lld or post_transform %lld is unknown", (long long)agg, (long long)pt);
    }
    s->agg = agg == 0 ? AGG_AVG : agg == 1 ? AGG_SUM : agg == 2 ? AGG_MIN : AGG_MAX;
    s->pt = (enum post_transform)pt; /* the enum follows the same order */
    int64_t mpos = 0;
    for (int64_t i = 0; i < n; i++) {
        struct tree_node *t = &s->nodes[i];
        int64_t m = op_int_at(modes, i);
        if (m < 0 || m > 6) {
            tree_release(s);
            return op_error(c, "node %lld has unknown mode %lld", (long long)i, (long long)m);
        }
        t->mode = (int)m + 1; /* TM_LEQ.. TM_MEMBER */
        t->feature = fid[i];
        t->value = op_double_at(splits, i);
        t->missing_true = miss ? (int)miss[i] : 0;
        t->child_true = tl[i] ? n + tt[i] : tt[i];
        t->child_false = fl[i] ? n + ff[i] : ff[i];
        if ((tl[i] ? tt[i] >= nl : tt[i] >= n) || (fl[i] ? ff[i] >= nl : ff[i] >= n) || tt[i] < 0 || ff[i] < 0) {
            tree_release(s);
            return op_error(c, "node %lld points to a missing child", (long long)i);
        }
        if (t->mode == TM_MEMBER) {
            t->m_first = mpos;
            while (mpos < nm && !isnan(op_double_at(mv, mpos))) s->mem[mpos] = op_double_at(mv, mpos), mpos++;
            t->m_count = mpos - t->m_first;
            mpos++; /* the NaN delimiter */
        }
    }
    for (int64_t j = 0; j < nl; j++) {
        struct tree_node *t = &s->nodes[n + j];
        t->mode = TM_LEAF;
        t->w_first = j;
        t->w_count = 1;
        if (lt[j] < 0 || lt[j] >= s->nout) {
            tree_release(s);
            return op_error(c, "leaf %lld targets %lld, outside [0, %lld)", (long long)j, (long long)lt[j], (long long)s->nout);
        }
        s->w[j] = (struct tree_weight){n + j, lt[j], op_double_at(lw, j)};
    }
    for (int64_t k = 0; k < nt; k++) {
        if (roots[k] < 0 || roots[k] >= n) {
            tree_release(s);
            return op_error(c, "tree root %lld is out of range", (long long)roots[k]);
        }
        s->roots[k] = roots[k];
    }
    *out = s;
    return 0;
}

static int te5_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t n, f;
    if (x->dtype != DT_FP32 && x->dtype != DT_FP64 && x->dtype != DT_FP16)
        return op_error(c, "input dtype %s is not supported (float, double, float16)", dtype_name(x->dtype));
    int rc = ml_rows(c, x, &n, &f);
    struct tree_state *s = NULL;
    if (rc || (rc = te5_build(c, &s))) return rc;
    for (int64_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].mode != TM_LEAF && (s->nodes[i].feature < 0 || s->nodes[i].feature >= f)) {
            rc = op_error(c, "a node tests feature %lld but the input has %lld", (long long)s->nodes[i].feature, (long long)f);
            break;
        }
    int64_t d[2] = {n, s->nout};
    tree_release(s);
    return rc ? rc : ml_set(c, c->out[0], x->dtype, 2, d);
}

static int te5_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct tree_state *s = NULL;
    int rc = te5_build(c, &s);
    if (rc) return rc;
    int64_t n, f;
    ml_rows(c, c->in[0], &n, &f);
    *state = s;
    *scratch = (size_t)(f + 3 * s->nout + 2) * sizeof(double);
    return 0;
}

static int te5_run(struct op_call *c) {
    const struct tree_state *s = c->state;
    const struct tensor *x = c->in[0];
    struct tensor *o = c->out[0];
    int64_t n, f;
    ml_rows(c, x, &n, &f);
    if (!s || c->scratch_size < (size_t)(f + 3 * s->nout + 2) * sizeof(double)) return op_error(c, "the plan was not prepared");
    double *xr = c->scratch, *sc = xr + f, *has = sc + s->nout;
    float *row = (float *)(void *)(has + s->nout);
    for (int64_t r = 0; r < n; r++) {
        for (int64_t j = 0; j < f; j++) xr[j] = op_double_at(x, r * f + j);
        for (int64_t k = 0; k < s->nout; k++) sc[k] = has[k] = 0;
        for (int64_t t = 0; t < s->ntrees; t++) {
            int64_t leaf = tree_walk(s, s->roots[t], xr, f);
            if (leaf < 0) return op_error(c, "tree %lld has a cycle", (long long)t);
            const struct tree_weight *w = &s->w[s->nodes[leaf].w_first];
            if (!has[w->id]) sc[w->id] = w->w;
            else if (s->agg == AGG_MIN) sc[w->id] = w->w < sc[w->id] ? w->w : sc[w->id];
            else if (s->agg == AGG_MAX) sc[w->id] = w->w > sc[w->id] ? w->w : sc[w->id];
            else sc[w->id] += w->w;
            has[w->id] = 1;
        }
        if (s->agg == AGG_AVG)
            for (int64_t k = 0; k < s->nout; k++) sc[k] /= (double)s->ntrees;
        if (s->pt != PT_NONE) {
            for (int64_t k = 0; k < s->nout; k++) row[k] = (float)sc[k];
            if (s->nout == 1 && s->pt == PT_PROBIT) row[0] = ml_probit(row[0]);
            else if (s->nout > 1) ml_transform_row(row, s->nout, s->pt);
            for (int64_t k = 0; k < s->nout; k++) sc[k] = row[k];
        }
        for (int64_t k = 0; k < s->nout; k++) shape_store_double(o->dtype, o->data, r * s->nout + k, sc[k]);
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * LabelEncoder
 * ------------------------------------------------------------------------ */

/* A key/value table sorted by key for binary search; keys are strings
 * (compared by length and bytes), int64 or double, values are raw bytes of
 * the output dtype (a struct tensor_str for strings). */
struct le_state {
    enum dtype kdt, vdt;
    int64_t n;
    struct tensor_str *skeys;
    int64_t *ikeys;
    double *fkeys;
    unsigned char *vals;
    unsigned char dflt[16]; /* one value: up to a struct tensor_str */
};

static void le_release(void *p) {
    struct le_state *s = p;
    if (!s) return;
    free(s->skeys);
    free(s->ikeys);
    free(s->fkeys);
    free(s->vals);
    free(s);
}

/* Element i of keys or values: from a strings attribute (sa set) or a
 * keys_tensor / values_tensor, counted bytes either way. */
static struct tensor_str le_str(const struct tensor *t, const struct graph_attr *sa, int64_t i) {
    return sa ? graph_attr_str(sa, (int)i) : tensor_strs(t)[i];
}

/* default_string as counted bytes ("_Unused" when absent). */
static struct tensor_str le_default_str(const struct graph_node *nd) {
    const struct graph_attr *a = node_attr(nd, "default_string");
    if (a && a->type == ATTR_STRING && a->s) return (struct tensor_str){a->s, a->s_len};
    return tensor_str_of("_Unused");
}

/* Finds the keys and values of any opset's attribute spelling; string
 * attributes come back in *kc / *vc with the tensor's data NULL. */
static int le_attrs(struct op_call *c, struct tensor *keys, struct tensor *vals, const struct graph_attr **kc,
                    const struct graph_attr **vc, unsigned char *dflt) {
    const struct graph_node *nd = c->node;
    const struct graph_attr *a;
    memset(keys, 0, sizeof *keys);
    memset(vals, 0, sizeof *vals);
    *kc = *vc = NULL;
    keys->ndim = vals->ndim = 1;
    if (nd->opset < 2) {
        if (!(a = node_attr(nd, "classes_strings")) || a->type != ATTR_STRINGS)
            return op_error(c, "attribute 'classes_strings' is required");
        /* Opset 1 maps a class string to its position, or a position back
         * to its string; a NULL data pointer stands for the positions. */
        memset(dflt, 0, 16);
        if (c->in[0]->dtype == DT_STRING) {
            keys->dtype = DT_STRING;
            *kc = a;
            vals->dtype = DT_INT64;
            int64_t d = node_attr_int(nd, "default_int64", -1);
            memcpy(dflt, &d, 8);
        } else {
            keys->dtype = DT_INT64;
            vals->dtype = DT_STRING;
            *vc = a;
            struct tensor_str d = le_default_str(nd);
            memcpy(dflt, &d, sizeof d);
        }
        keys->dims[0] = vals->dims[0] = a->n;
        return 0;
    }
    const struct tensor *t;
    if ((t = node_attr_tensor(nd, "keys_tensor"))) *keys = *t;
    else if ((a = node_attr(nd, "keys_strings")) && a->type == ATTR_STRINGS) {
        keys->dtype = DT_STRING;
        keys->dims[0] = a->n;
        *kc = a;
    } else if ((a = node_attr(nd, "keys_int64s")) && a->type == ATTR_INTS) {
        keys->dtype = DT_INT64;
        keys->dims[0] = a->n;
        keys->data = a->ints;
    } else if ((a = node_attr(nd, "keys_floats")) && a->type == ATTR_FLOATS) {
        keys->dtype = DT_FP32;
        keys->dims[0] = a->n;
        keys->data = a->floats;
    } else {
        return op_error(c, "no keys attribute (keys_strings, keys_int64s, keys_floats, keys_tensor)");
    }
    if ((t = node_attr_tensor(nd, "values_tensor"))) *vals = *t;
    else if ((a = node_attr(nd, "values_strings")) && a->type == ATTR_STRINGS) {
        vals->dtype = DT_STRING;
        vals->dims[0] = a->n;
        *vc = a;
    }
    else if ((a = node_attr(nd, "values_int64s")) && a->type == ATTR_INTS) {
        vals->dtype = DT_INT64;
        vals->dims[0] = a->n;
        vals->data = a->ints;
    } else if ((a = node_attr(nd, "values_floats")) && a->type == ATTR_FLOATS) {
        vals->dtype = DT_FP32;
        vals->dims[0] = a->n;
        vals->data = a->floats;
    } else {
        return op_error(c, "no values attribute (values_strings, values_int64s, values_floats, values_tensor)");
    }
    if (tensor_numel(keys) != tensor_numel(vals)) return op_error(c, "keys and values differ in length");
    /* A value (a string element the largest) fits the 16-byte default. */
    if (!dtype_size(vals->dtype) || dtype_size(vals->dtype) > 16) return op_error(c, "unsupported value dtype %s", dtype_name(vals->dtype));
    memset(dflt, 0, 16);
    if ((t = node_attr_tensor(nd, "default_tensor"))) {
        if (t->dtype != vals->dtype || tensor_numel(t) < 1) return op_error(c, "default_tensor must hold one %s", dtype_name(vals->dtype));
        memcpy(dflt, t->data, dtype_size(t->dtype));
    } else if (vals->dtype == DT_INT64) {
        int64_t d = node_attr_int(nd, "default_int64", -1);
        memcpy(dflt, &d, 8);
    } else if (vals->dtype == DT_FP32) {
        float d = node_attr_float(nd, "default_float", -0.0f);
        memcpy(dflt, &d, 4);
    } else if (vals->dtype == DT_STRING) {
        /* the attribute's own storage, or a literal: both outlive every run */
        struct tensor_str d = le_default_str(nd);
        memcpy(dflt, &d, sizeof d);
    }
    enum dtype in = c->in[0]->dtype;
    int kstr = keys->dtype == DT_STRING, istr = in == DT_STRING;
    int kflt = keys->dtype == DT_FP32 || keys->dtype == DT_FP64, iflt = in == DT_FP32 || in == DT_FP64;
    if (kstr != istr || kflt != iflt) return op_error(c, "keys are %s but the input is %s", dtype_name(keys->dtype), dtype_name(in));
    return 0;
}

static int le_infer(struct op_call *c) {
    struct tensor k, v;
    const struct graph_attr *kc, *vc;
    unsigned char d[16];
    int rc = le_attrs(c, &k, &v, &kc, &vc, d);
    return rc ? rc : ml_set(c, c->out[0], v.dtype, c->in[0]->ndim, c->in[0]->dims);
}

static int le_cmp_idx(const void *pa, const void *pb, void *arg) {
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    const struct le_state *s = arg;
    if (s->skeys) return tensor_str_cmp(s->skeys[a], s->skeys[b]);
    if (s->ikeys) return s->ikeys[a] < s->ikeys[b] ? -1 : (s->ikeys[a] > s->ikeys[b]);
    return s->fkeys[a] < s->fkeys[b] ? -1 : (s->fkeys[a] > s->fkeys[b]);
}

static int le_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct tensor k, v;
    const struct graph_attr *kc, *vc;
    unsigned char d[16];
    int rc = le_attrs(c, &k, &v, &kc, &vc, d);
    if (rc) return rc;
    int64_t n = tensor_numel(&k);
    size_t es = dtype_size(v.dtype);
    struct le_state *s = calloc(1, sizeof *s);
    int64_t *ord = calloc((size_t)(n ? n : 1), sizeof *ord);
    if (!s || !ord) goto nomem;
    s->kdt = k.dtype;
    s->vdt = v.dtype;
    s->n = n;
    memcpy(s->dflt, d, sizeof d);
    if (k.dtype == DT_STRING) s->skeys = calloc((size_t)(n ? n : 1), sizeof *s->skeys);
    else if (k.dtype == DT_FP32 || k.dtype == DT_FP64) s->fkeys = calloc((size_t)(n ? n : 1), sizeof(double));
    else s->ikeys = calloc((size_t)(n ? n : 1), sizeof(int64_t));
    s->vals = calloc((size_t)(n ? n : 1), es);
    if ((!s->skeys && !s->fkeys && !s->ikeys) || !s->vals) goto nomem;
    for (int64_t i = 0; i < n; i++) {
        ord[i] = i;
        if (s->skeys) s->skeys[i] = le_str(&k, kc, i);
        else if (s->fkeys) s->fkeys[i] = op_double_at(&k, i);
        else s->ikeys[i] = k.data ? op_int_at(&k, i) : i;
    }
    qsort_r(ord, (size_t)n, sizeof *ord, le_cmp_idx, s);
    /* Rewrite keys and values in sorted order. */
    void *sorted_keys = calloc((size_t)(n ? n : 1), sizeof(struct tensor_str));
    if (!sorted_keys) goto nomem;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = ord[i];
        if (s->skeys) ((struct tensor_str *)sorted_keys)[i] = s->skeys[j];
        else if (s->fkeys) ((double *)sorted_keys)[i] = op_double_at(&k, j);
        else ((int64_t *)sorted_keys)[i] = k.data ? op_int_at(&k, j) : j;
        if (vc) {
            struct tensor_str vs = le_str(&v, vc, j);
            memcpy(s->vals + i * (int64_t)es, &vs, es);
        } else if (v.data) memcpy(s->vals + i * (int64_t)es, (const char *)v.data + j * (int64_t)es, es);
        else memcpy(s->vals + i * (int64_t)es, &j, es); /* opset 1: the class position */
    }
    if (s->skeys) {
        free(s->skeys);
        s->skeys = sorted_keys;
    } else if (s->fkeys) {
        free(s->fkeys);
        s->fkeys = sorted_keys;
    } else {
        free(s->ikeys);
        s->ikeys = sorted_keys;
    }
    free(ord);
    *state = s;
    *scratch = 0;
    return 0;
nomem:
    free(ord);
    le_release(s);
    return STATUS_NOMEM;
}

static int le_run(struct op_call *c) {
    const struct le_state *s = c->state;
    if (!s) return op_error(c, "the plan was not prepared");
    const struct tensor *x = c->in[0];
    int64_t n = tensor_numel(x);
    size_t es = dtype_size(s->vdt);
    char *o = c->out[0]->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t lo = 0, hi = s->n - 1, hit = -1;
        struct tensor_str ks = s->skeys ? tensor_strs(x)[i] : (struct tensor_str){0};
        double kf = s->fkeys ? op_double_at(x, i) : 0;
        int64_t ki = s->ikeys ? op_int_at(x, i) : 0;
        while (lo <= hi) {
            int64_t mid = lo + (hi - lo) / 2;
            int cmp = s->skeys ? tensor_str_cmp(ks, s->skeys[mid])
                      : s->fkeys ? (kf < s->fkeys[mid] ? -1 : (kf > s->fkeys[mid]))
                                 : (ki < s->ikeys[mid] ? -1 : (ki > s->ikeys[mid]));
            if (!cmp) {
                hit = mid;
                break;
            }
            if (cmp < 0) hi = mid - 1;
            else lo = mid + 1;
        }
        memcpy(o + i * (int64_t)es, hit >= 0 ? s->vals + hit * (int64_t)es : s->dflt, es);
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * SVMClassifier (support vectors, libsvm's pairwise "one against one"
 * classifiers) and SVMRegressor, as scikit-learn's SVC / SVR export them.
 * Scores follow onnxruntime: without prob_a the scores are the pairwise
 * decision values ([N, 2] as -d, d for two classes); with prob_a they are
 * class probabilities from libsvm's pairwise coupling (Wu, Lin and Weng
 * 2004). The label is the class with the most pairwise votes.
 * ------------------------------------------------------------------------ */

enum svm_kernel { SVM_LINEAR, SVM_POLY, SVM_RBF, SVM_SIGMOID };

struct svm_kernel_params {
    enum svm_kernel type;
    float gamma, coef0, degree;
};

static int svm_kernel_attrs(struct op_call *c, struct svm_kernel_params *k) {
    const char *t = node_attr_str(c->node, "kernel_type", "LINEAR");
    if (!strcmp(t, "LINEAR")) k->type = SVM_LINEAR;
    else if (!strcmp(t, "POLY")) k->type = SVM_POLY;
    else if (!strcmp(t, "RBF")) k->type = SVM_RBF;
    else if (!strcmp(t, "SIGMOID")) k->type = SVM_SIGMOID;
    else return op_error(c, "unknown kernel_type '%s' (LINEAR, POLY, RBF, SIGMOID)", t);
    const float *kp;
    int n = node_attr_floats(c->node, "kernel_params", &kp);
    k->gamma = n > 0 ? kp[0] : 0;
    k->coef0 = n > 1 ? kp[1] : 0;
    k->degree = n > 2 ? kp[2] : 0;
    return 0;
}

/* ---- the kernel matrix, GEMM-shaped ----
 * K[N, nvec] for all the rows at once instead of one (row, vector) pair at a
 * time: the rows converted to float once; LINEAR, POLY and SIGMOID as one
 * sgemm of X by SV^T and the function over the result; RBF as the squared
 * differences summed over features with the support vectors transposed
 * ([f, nvec]), so the innermost loop runs over vectors in vector lanes.
 * RBF keeps the differences (as onnxruntime does) rather than |x|^2 +
 * |sv|^2 - 2 x.sv, which cancels for an input near a support vector. */

/* The support vectors' shared part: SV^T for RBF, owned. */
struct svm_model {
    struct svm_kernel_params k;
    int64_t f, nvec;
    const float *sv; /* [nvec, f], the node's attribute */
    float *svt;      /* [f, nvec]: RBF only, else NULL */
};

static int svm_model_init(struct op_call *c, struct svm_model *m) {
    m->svt = NULL;
    if (m->k.type != SVM_RBF) return 0;
    m->svt = malloc(sizeof(float) * (size_t)(m->f * m->nvec > 0 ? m->f * m->nvec : 1));
    if (!m->svt) return op_error(c, "out of memory for %lld support vector values", (long long)(m->f * m->nvec));
    for (int64_t v = 0; v < m->nvec; v++)
        for (int64_t j = 0; j < m->f; j++) m->svt[j * m->nvec + v] = m->sv[v * m->f + j];
    return 0;
}

/* Scratch floats of svm_kernel_matrix for n rows: the float rows and K. */
static size_t svm_kernel_scratch(const struct svm_model *m, int64_t n) {
    return sizeof(float) * (size_t)(n * m->f + n * m->nvec);
}

/* The input's rows as float: the input itself when it is float32, else
 * converted into xf. */
static const float *svm_rows_f32(const struct tensor *x, int64_t n, int64_t f, float *xf) {
    if (x->dtype == DT_FP32) return x->data;
    for (int64_t i = 0; i < n * f; i++) xf[i] = (float)op_double_at(x, i);
    return xf;
}

/* K (n rows of nvec, in kern) for the input's n rows; work is the scratch
 * of svm_kernel_scratch. */
static int svm_kernel_matrix(struct op_call *c, const struct svm_model *m, int64_t n, float *work, float **kern) {
    int64_t f = m->f, nv = m->nvec;
    const float *x = svm_rows_f32(c->in[0], n, f, work);
    float *K = work + n * f;
    *kern = K;
    if (m->k.type == SVM_RBF) {
        const float g = m->k.gamma;
#pragma omp parallel for if (n * nv * f > 262144) num_threads(c->nthreads)
        for (int64_t r = 0; r < n; r++) {
            float *kr = K + r * nv;
            memset(kr, 0, sizeof(float) * (size_t)nv);
            for (int64_t j = 0; j < f; j++) {
                const float xj = x[r * f + j], *s = m->svt + j * nv;
#pragma omp simd
                for (int64_t v = 0; v < nv; v++) {
                    float d = xj - s[v];
                    kr[v] += d * d;
                }
            }
#pragma omp simd
            for (int64_t v = 0; v < nv; v++) kr[v] = ew_exp_f(-g * kr[v]);
        }
        return 0;
    }
    if (n > 0 && nv > 0) {
        dnnl_util_set_threads(c->nthreads);
        if (f > 0) DNNL_CHECK(dnnl_sgemm('N', 'T', n, nv, f, 1.0f, x, f, m->sv, f, 0.0f, K, nv));
        else memset(K, 0, sizeof(float) * (size_t)(n * nv));
    }
    const float g = m->k.gamma, c0 = m->k.coef0, deg = m->k.degree;
    for (int64_t i = 0; i < n * nv; i++) {
        if (m->k.type == SVM_POLY) K[i] = powf(g * K[i] + c0, deg);
        else if (m->k.type == SVM_SIGMOID) K[i] = tanhf(g * K[i] + c0);
    }
    return 0;
}

/* What SVMClassifier and SVMRegressor check alike: numeric rows of
 * features, the kernel, and no post_transform. */
static int svm_common(struct op_call *c, int64_t *n, int64_t *f, struct svm_kernel_params *k) {
    const struct tensor *x = c->in[0];
    int rc = ml_numeric(c, x);
    if (rc || (rc = ml_rows(c, x, n, f)) || (rc = svm_kernel_attrs(c, k))) return rc;
    enum post_transform pt;
    if ((rc = ml_post_transform(c, &pt))) return rc;
    if (pt != PT_NONE)
        return op_error(c, "post_transform '%s' is not supported (scikit-learn exports NONE)",
                        node_attr_str(c->node, "post_transform", ""));
    return 0;
}

struct svc_shape {
    int64_t n, f, nclass, nvec, npairs, cols;
    const int64_t *vpc;
    const float *sv, *coef, *rho, *pa, *pb;
    int have_proba;
    struct ml_labels lab;
    struct svm_kernel_params k;
    struct svm_model m; /* from prepare */
    float *pc;          /* [nvec, npairs]: each pair's coefficients over all the vectors (prepare; owned) */
};

static int svc_shape(struct op_call *c, struct svc_shape *s) {
    memset(s, 0, sizeof *s);
    int rc = svm_common(c, &s->n, &s->f, &s->k);
    if (rc) return rc;
    ml_get_labels(c->node, "classlabels_ints", &s->lab);
    s->nclass = s->lab.n;
    if (s->nclass < 2) return op_error(c, "needs at least 2 class labels, got %lld", (long long)s->nclass);
    /* The pairwise matrices are nclass^2: bound them. */
    if (s->nclass > 4096) return op_error(c, "%lld classes: kiln supports at most 4096", (long long)s->nclass);
    int nv = node_attr_ints(c->node, "vectors_per_class", &s->vpc);
    if (nv <= 0)
        return op_error(c, "has no vectors_per_class: the linear form of SVMClassifier is not supported "
                           "(scikit-learn exports LinearSVC as LinearClassifier)");
    if (nv != s->nclass) return op_error(c, "vectors_per_class has %d entries for %lld classes", nv, (long long)s->nclass);
    for (int i = 0; i < nv; i++) {
        if (s->vpc[i] < 0 || s->vpc[i] > (1 << 24)) return op_error(c, "vectors_per_class[%d] = %lld is out of range", i, (long long)s->vpc[i]);
        s->nvec += s->vpc[i];
    }
    int nsv = node_attr_floats(c->node, "support_vectors", &s->sv);
    if (s->nvec == 0 || nsv <= 0 || nsv % s->nvec)
        return op_error(c, "%d support_vectors values do not divide into %lld vectors", nsv < 0 ? 0 : nsv, (long long)s->nvec);
    if (nsv / s->nvec != s->f)
        return op_error(c, "support vectors have %lld features but the input has %lld", (long long)(nsv / s->nvec), (long long)s->f);
    s->npairs = s->nclass * (s->nclass - 1) / 2;
    int ncoef = node_attr_floats(c->node, "coefficients", &s->coef);
    if (ncoef < (s->nclass - 1) * s->nvec)
        return op_error(c, "coefficients has %d values; %lld classes and %lld vectors need %lld", ncoef < 0 ? 0 : ncoef,
                        (long long)s->nclass, (long long)s->nvec, (long long)((s->nclass - 1) * s->nvec));
    int nrho = node_attr_floats(c->node, "rho", &s->rho);
    if (nrho < s->npairs) return op_error(c, "rho has %d values for %lld class pairs", nrho < 0 ? 0 : nrho, (long long)s->npairs);
    int na = node_attr_floats(c->node, "prob_a", &s->pa), nb = node_attr_floats(c->node, "prob_b", &s->pb);
    if (na < 0) na = 0;
    if (nb < 0) nb = 0;
    if (na != nb) return op_error(c, "prob_a has %d values but prob_b has %d", na, nb);
    if (na > 0 && na < s->npairs) return op_error(c, "prob_a has %d values for %lld class pairs", na, (long long)s->npairs);
    s->have_proba = na > 0;
    s->cols = s->have_proba ? s->nclass : (s->nclass > 2 ? s->npairs : 2);
    return 0;
}

static int svc_infer(struct op_call *c) {
    struct svc_shape s;
    int rc = svc_shape(c, &s);
    if (rc) return rc;
    int64_t d[2] = {s.n, s.cols};
    if ((rc = ml_set(c, c->out[0], s.lab.strs ? DT_STRING : DT_INT64, 1, d))) return rc;
    return ml_set(c, ml_out(c, 1), DT_FP32, 2, d);
}

/* Work space: the kernel matrix (svm_kernel_scratch), every row's
 * pairwise scores, and per row the votes and, for probabilities, the
 * pairwise matrix r, Q, Qp and p. */
static size_t svc_scratch(const struct svc_shape *s) {
    size_t k = (size_t)s->nclass;
    return svm_kernel_scratch(&s->m, s->n) + (size_t)(s->n * s->npairs) * sizeof(float) +
           (2 * k * k + 2 * k) * sizeof(float) + k * sizeof(int64_t);
}

/* The pairwise decision values as one product: pair (i, j) sums class i's
 * vectors by their coefficients in row j - 1 and class j's by row i
 * (coefficients are [nclass - 1, nvec]), every other vector by 0. */
static void svc_pair_coefs(const struct svc_shape *s, float *pc) {
    memset(pc, 0, sizeof(float) * (size_t)(s->nvec * s->npairs));
    int64_t idx = 0, start_i = 0;
    for (int64_t i = 0; i < s->nclass - 1; i++) {
        int64_t start_j = start_i + s->vpc[i];
        for (int64_t j = i + 1; j < s->nclass; j++, idx++) {
            for (int64_t m = 0; m < s->vpc[i]; m++)
                pc[(start_i + m) * s->npairs + idx] = s->coef[(j - 1) * s->nvec + start_i + m];
            for (int64_t m = 0; m < s->vpc[j]; m++)
                pc[(start_j + m) * s->npairs + idx] = s->coef[i * s->nvec + start_j + m];
            start_j += s->vpc[j];
        }
        start_i += s->vpc[i];
    }
}

static void svc_release(void *state) {
    struct svc_shape *s = state;
    if (s) {
        free(s->m.svt);
        free(s->pc);
    }
    op_params_free(s);
}

/* The whole problem (support vectors, coefficients and the probability
 * pairs are views of the node's attributes) is decoded once, at prepare,
 * with SV^T (RBF) and the pairs' coefficient matrix laid out for the
 * products. */
static int svc_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct svc_shape s;
    int rc = svc_shape(c, &s);
    if (rc) return rc;
    if ((double)s.nvec * (double)s.npairs > 67108864.0)
        return op_error(c, "%lld vectors and %lld class pairs: kiln supports at most 2^26 pair coefficients",
                        (long long)s.nvec, (long long)s.npairs);
    s.m = (struct svm_model){.k = s.k, .f = s.f, .nvec = s.nvec, .sv = s.sv};
    s.pc = malloc(sizeof(float) * (size_t)(s.nvec * s.npairs));
    if (!s.pc) return op_error(c, "out of memory for the pairs' coefficients");
    if ((rc = svm_model_init(c, &s.m))) {
        free(s.pc);
        return rc;
    }
    svc_pair_coefs(&s, s.pc);
    *scratch = svc_scratch(&s);
    if ((rc = params_keep(c, &s, sizeof s, state))) {
        free(s.m.svt);
        free(s.pc);
    }
    return rc;
}

/* Pairwise coupling: class probabilities p[k] from pairwise estimates r[i][j]
 * (libsvm's multiclass_probability, in float as onnxruntime computes it). */
static void svc_coupling(int64_t k, const float *r, float *Q, float *Qp, float *p) {
    float eps = 0.005f / (float)k;
    for (int64_t i = 0; i < k; i++) {
        p[i] = 1.0f / (float)k;
        Q[i * k + i] = 0;
        for (int64_t j = 0; j < k; j++) {
            if (j == i) continue;
            Q[i * k + i] += r[j * k + i] * r[j * k + i];
            Q[i * k + j] = -r[j * k + i] * r[i * k + j];
        }
    }
    for (int it = 0; it < 100; it++) {
        float pQp = 0, max_err = 0;
        for (int64_t i = 0; i < k; i++) {
            Qp[i] = 0;
            for (int64_t j = 0; j < k; j++) Qp[i] += Q[i * k + j] * p[j];
            pQp += p[i] * Qp[i];
        }
        for (int64_t i = 0; i < k; i++) {
            float e = fabsf(Qp[i] - pQp);
            if (e > max_err) max_err = e;
        }
        if (max_err < eps) break;
        for (int64_t i = 0; i < k; i++) {
            float diff = (-Qp[i] + pQp) / Q[i * k + i];
            p[i] += diff;
            pQp = (pQp + diff * (diff * Q[i * k + i] + 2 * Qp[i])) / (1 + diff) / (1 + diff);
            for (int64_t j = 0; j < k; j++) {
                Qp[j] = (Qp[j] + diff * Q[i * k + j]) / (1 + diff);
                p[j] /= (1 + diff);
            }
        }
    }
}

static int svc_run(struct op_call *c) {
    const struct svc_shape s = *(const struct svc_shape *)c->state;
    if (!c->scratch || c->scratch_size < svc_scratch(&s)) return op_error(c, "scratch buffer too small");
    int64_t k = s.nclass;
    /* The int64 votes first: the scratch buffer is aligned, float offsets may not be for int64. */
    int64_t *votes = c->scratch;
    float *pairs = (float *)(votes + k), *r = pairs + s.n * s.npairs, *Q = r + k * k, *Qp = Q + k * k, *p = Qp + k,
          *work = p + k, *kern;
    int rc = svm_kernel_matrix(c, &s.m, s.n, work, &kern);
    if (rc) return rc;
    if (s.n > 0) DNNL_CHECK(dnnl_sgemm('N', 'N', s.n, s.npairs, s.nvec, 1.0f, kern, s.nvec, s.pc, s.npairs, 0.0f, pairs,
                                       s.npairs));
    struct tensor *z = ml_out(c, 1), *y = c->out[0];
    for (int64_t row = 0; row < s.n; row++) {
        float *pair = pairs + row * s.npairs;
        memset(votes, 0, (size_t)k * sizeof *votes);
        int64_t idx = 0;
        for (int64_t i = 0; i < k - 1; i++)
            for (int64_t j = i + 1; j < k; j++, idx++) {
                pair[idx] += s.rho[idx];
                votes[pair[idx] > 0 ? i : j]++;
            }
        int64_t best = 0;
        for (int64_t i = 1; i < k; i++)
            if (votes[i] > votes[best]) best = i;
        ml_put_label(y, row, &s.lab, best);
        if (!z || !z->data) continue;
        float *out = (float *)z->data + row * s.cols;
        if (s.have_proba) {
            idx = 0;
            for (int64_t i = 0; i < k; i++) r[i * k + i] = 0;
            for (int64_t i = 0; i < k - 1; i++)
                for (int64_t j = i + 1; j < k; j++, idx++) {
                    /* libsvm's sigmoid_predict: 1 / (1 + exp(A d + B)), kept off 0 and 1. */
                    float v = 1.0f - ml_logistic(pair[idx] * s.pa[idx] + s.pb[idx]);
                    v = v < 1e-7f ? 1e-7f : v > 1 - 1e-7f ? 1 - 1e-7f : v;
                    r[i * k + j] = v;
                    r[j * k + i] = 1 - v;
                }
            svc_coupling(k, r, Q, Qp, p);
            memcpy(out, p, (size_t)k * sizeof *p);
        } else if (k == 2) {
            out[0] = -pair[0];
            out[1] = pair[0];
        } else {
            memcpy(out, pair, (size_t)s.npairs * sizeof *pair);
        }
    }
    return 0;
}

struct svr_shape {
    int64_t n, f, nvec;
    const float *sv, *coef, *rho;
    int one_class;
    struct svm_kernel_params k;
    struct svm_model m; /* from prepare */
};

static int svr_shape(struct op_call *c, struct svr_shape *s) {
    memset(s, 0, sizeof *s);
    int rc = svm_common(c, &s->n, &s->f, &s->k);
    if (rc) return rc;
    s->nvec = node_attr_int(c->node, "n_supports", 0);
    s->one_class = node_attr_int(c->node, "one_class", 0) != 0;
    if (s->nvec <= 0)
        return op_error(c, "has n_supports %lld: the linear form of SVMRegressor is not supported", (long long)s->nvec);
    int nsv = node_attr_floats(c->node, "support_vectors", &s->sv);
    if (nsv <= 0 || nsv % s->nvec || nsv / s->nvec != s->f)
        return op_error(c, "%d support_vectors values do not make %lld vectors of the input's %lld features",
                        nsv < 0 ? 0 : nsv, (long long)s->nvec, (long long)s->f);
    int ncoef = node_attr_floats(c->node, "coefficients", &s->coef);
    if (ncoef < s->nvec) return op_error(c, "coefficients has %d values for %lld support vectors", ncoef < 0 ? 0 : ncoef, (long long)s->nvec);
    if (node_attr_floats(c->node, "rho", &s->rho) < 1) return op_error(c, "attribute 'rho' is required");
    return 0;
}

static int svr_infer(struct op_call *c) {
    struct svr_shape s;
    int rc = svr_shape(c, &s);
    if (rc) return rc;
    int64_t d[2] = {s.n, 1};
    return ml_set(c, c->out[0], DT_FP32, 2, d);
}

static void svr_release(void *state) {
    struct svr_shape *s = state;
    if (s) free(s->m.svt);
    op_params_free(s);
}

static int svr_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct svr_shape s;
    int rc = svr_shape(c, &s);
    if (rc) return rc;
    s.m = (struct svm_model){.k = s.k, .f = s.f, .nvec = s.nvec, .sv = s.sv};
    if ((rc = svm_model_init(c, &s.m))) return rc;
    *scratch = svm_kernel_scratch(&s.m, s.n);
    if ((rc = params_keep(c, &s, sizeof s, state))) free(s.m.svt);
    return rc;
}

/* The kernel matrix (svm_kernel_matrix) times the coefficients, plus rho. */
static int svr_run(struct op_call *c) {
    const struct svr_shape s = *(const struct svr_shape *)c->state;
    if (!c->scratch && svm_kernel_scratch(&s.m, s.n)) return op_error(c, "scratch buffer too small");
    float *y = c->out[0]->data, *kern;
    int rc = svm_kernel_matrix(c, &s.m, s.n, c->scratch, &kern);
    if (rc) return rc;
    for (int64_t row = 0; row < s.n; row++) {
        float sum = 0;
        const float *kr = kern + row * s.nvec;
        for (int64_t v = 0; v < s.nvec; v++) sum += s.coef[v] * kr[v];
        float score = sum + s.rho[0];
        y[row] = s.one_class ? (score > 0 ? 1.0f : -1.0f) : score;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

const struct op_def op_defs_ml[] = {
    {"ArrayFeatureExtractor", "ai.onnx.ml", afe_infer, NULL, afe_run, NULL, 0},
    {"Binarizer", "ai.onnx.ml", binarizer_infer, binarizer_prepare, binarizer_run, op_params_free, 0},
    {"Normalizer", "ai.onnx.ml", normalizer_infer, normalizer_prepare, normalizer_run, op_params_free, 0},
    {"Scaler", "ai.onnx.ml", scaler_infer, scaler_prepare, scaler_run, op_params_free, 0},
    {"ZipMap", "ai.onnx.ml", zipmap_infer, NULL, zipmap_run, NULL, 0},
    {"LinearClassifier", "ai.onnx.ml", lc_infer, lc_prepare, lc_run, op_params_free, 0},
    {"LinearRegressor", "ai.onnx.ml", lr_infer, lr_prepare, lr_run, op_params_free, 0},
    {"TreeEnsembleClassifier", "ai.onnx.ml", tree_classifier_infer, tree_classifier_prepare, tree_run, tree_release, 0},
    {"TreeEnsembleRegressor", "ai.onnx.ml", tree_regressor_infer, tree_regressor_prepare, tree_run, tree_release, 0},
    {"TreeEnsemble", "ai.onnx.ml", te5_infer, te5_prepare, te5_run, tree_release, 0},
    {"LabelEncoder", "ai.onnx.ml", le_infer, le_prepare, le_run, le_release, 0},
    {"SVMClassifier", "ai.onnx.ml", svc_infer, svc_prepare, svc_run, svc_release, 0},
    {"SVMRegressor", "ai.onnx.ml", svr_infer, svr_prepare, svr_run, svr_release, 0},
    {0},
};
