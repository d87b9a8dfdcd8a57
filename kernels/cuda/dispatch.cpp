/* dispatch.cpp - ONNX nodes -> custom kernel launches (see dispatch.h).
 *
 * Sections: the prepared state and its helpers; one section per op family,
 * each with its builders (decode attributes and constant inputs, check the
 * shapes, fill the state, pick the runner) and its runner (queue the
 * kernels from the state alone); the op table, one line per op; the entry
 * points. */
#include "kernels/cuda/dispatch.h"

#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the prepared state --------------------------------------------------- */

struct kd_state;
/* Queues the node's kernels from its state; returns 0 or a status after
 * op_error(). Never reads an attribute: the builder decoded them. */
typedef int (*kd_run_fn)(struct op_call *c, const struct kd_state *st, cudaStream_t s);

struct kd_state {
    kd_run_fn run;
    int code;              /* the table's code, or what the attributes made of it */
    struct kc_act act;     /* node->act, applied by the kernel or afterwards */
    int act_after;         /* 1: the kernel does not apply act; run kc_bias_act after it */
    float a, b;            /* unary parameters */
    struct kc_bcast bc;
    struct kc_remap_desc rm;
    struct kc_reduce_desc rd;
    struct kc_pool_desc pool;
    struct kc_gather_el_desc ge;
    int64_t outer, mid, inner; /* softmax, argmax, gather, layernorm rows/cols */
    int axis;
    int flag;              /* Mean's final scaling, ArgMax's select_last_index */
    float eps;
    float alpha, beta, bias; /* LRN */
    int size;
};

/* What a builder works from: the call, its table row, the state it fills,
 * and where it says why it refuses the node (why may be NULL). */
struct kd_builder {
    const struct op_call *c;
    const struct graph_node *n;
    const struct kd_op *op;
    const struct tensor *x; /* in[0] */
    const struct tensor *y; /* out[0] */
    struct kd_state *st;
    char *why;
    size_t why_len;
};

/* Fills b->st for the node, or returns -1 (outside what the kernels do). */
typedef int (*kd_build_fn)(struct kd_builder *b);

/* One line per op: its builder, and the code the builder hands the kernel
 * (kc_unary_op, KU_ACT_BASE + act_kind, kc_binary_op, kc_reduce_op, or the
 * family's flag: LogSoftmax, MaxPool, ArgMin). */
struct kd_op {
    const char *op_type;
    kd_build_fn build;
    int code;
};

/* Records why the node is refused; returns -1 for the builder to return. */
static int kd_no(const struct kd_builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int kd_no(const struct kd_builder *b, const char *fmt, ...) {
    if (b->why && b->why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->why, b->why_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* The node's axis attribute (dflt when absent) against rank; -1 when out of
 * range. */
static int kd_axis(const struct kd_builder *b, int64_t dflt, int rank) {
    return op_axis((struct op_call *)b->c, node_attr_int(b->n, "axis", dflt), rank);
}

static int64_t kd_prod(const struct tensor *t, int from, int to) {
    int64_t p = 1;
    for (int d = from; d < to; d++) p *= t->dims[d];
    return p;
}

/* Copies a constant input's n bytes to buf: plan-time constants may be in
 * host or device memory. Returns 0 or -1. */
static int kd_fetch(void *buf, const void *src, size_t n) {
#ifndef KILN_CUDA_EMU
    cudaPointerAttributes pa;
    if (cudaPointerGetAttributes(&pa, src) == cudaSuccess && pa.type == cudaMemoryTypeDevice)
        return cudaMemcpy(buf, src, n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
    (void)cudaGetLastError();
#endif
    memcpy(buf, src, n);
    return 0;
}

/* Reads a constant integer input (host or device memory) into vals; returns
 * the count or -1 when the input is absent or not constant. */
static int kd_read_ints(const struct tensor *t, int64_t *vals, int max) {
    if (!t || !t->data) return -1;
    int64_t n = tensor_numel(t);
    if (n < 0 || n > max) return -1;
    size_t es = dtype_size(t->dtype);
    unsigned char buf[8 * KC_MAX_DIMS * 2];
    if (es == 0 || (size_t)n * es > sizeof buf) return -1;
    if (kd_fetch(buf, t->data, (size_t)n * es)) return -1;
    struct tensor h = *t;
    h.data = buf;
    for (int64_t i = 0; i < n; i++) vals[i] = op_int_at(&h, i);
    return (int)n;
}

static int kd_read_double(const struct tensor *t, double *v) {
    if (!t || !t->data || tensor_numel(t) != 1) return -1;
    unsigned char buf[16];
    size_t es = dtype_size(t->dtype);
    if (es == 0 || es > sizeof buf) return -1;
    if (kd_fetch(buf, t->data, es)) return -1;
    struct tensor h = *t;
    h.data = buf;
    *v = op_double_at(&h, 0);
    return 0;
}

static int kd_is_float(enum dtype dt) { return dt == DT_FP32 || dt == DT_FP16; }

/* The element sizes the data-movement kernels copy. */
static int kd_elem_ok(size_t es) { return es == 1 || es == 2 || es == 4 || es == 8; }

static void kd_contig_strides(const struct tensor *t, int64_t *st) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        st[d] = s;
        s *= t->dims[d];
    }
}

/* Element bits of value v in dtype dt (Pad's constant). */
static uint64_t kd_bits_of(enum dtype dt, double v) {
    uint64_t bits = 0;
    switch (dt) {
    case DT_FP32: { float f = (float)v; memcpy(&bits, &f, 4); break; }
    case DT_FP64: memcpy(&bits, &v, 8); break;
    case DT_FP16: bits = kc_f2h((float)v); break;
    case DT_BF16: bits = kc_f2bf((float)v); break;
    case DT_INT8: { int8_t x = (int8_t)v; memcpy(&bits, &x, 1); break; }
    case DT_INT16: { int16_t x = (int16_t)v; memcpy(&bits, &x, 2); break; }
    case DT_INT32: { int32_t x = (int32_t)v; memcpy(&bits, &x, 4); break; }
    case DT_INT64: { int64_t x = (int64_t)v; memcpy(&bits, &x, 8); break; }
    default: bits = (uint64_t)(int64_t)v; break;
    }
    return bits;
}

static int kd_check(struct op_call *c, cudaError_t e) {
    if (e == cudaSuccess) return 0;
    op_error(c, "CUDA %s failed: %s", c->node->op_type, cudaGetErrorString(e));
    return STATUS_INTERNAL;
}

/* The activation the kernel itself applies: none when it runs afterwards. */
static struct kc_act kd_fused_act(const struct kd_state *st) {
    struct kc_act none = {0, 0, 0};
    return st->act_after ? none : st->act;
}

/* y = x, unless the plan made them one buffer. */
static cudaError_t kd_copy(const struct tensor *x, struct tensor *y, cudaStream_t s) {
    if (y->data == x->data || !tensor_nbytes(y)) return cudaSuccess;
    return cudaMemcpyAsync(y->data, x->data, tensor_nbytes(y), cudaMemcpyDeviceToDevice, s);
}

/* ---- elementwise unary and activations ----------------------------------- */

static int kd_run_unary(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    return kd_check(c, kc_unary(st->code, x->dtype, x->data, y->data, tensor_numel(y), st->a, st->b, kd_fused_act(st), s));
}

/* Not takes bool; Neg, Abs and Sign signed integers too; the rest floats. */
static int kd_unary_dtype_ok(int code, enum dtype dt) {
    if (code == KU_NOT) return dt == DT_BOOL;
    if (code == KU_NEG || code == KU_ABS || code == KU_SIGN) return kd_is_float(dt) || dt == DT_INT32 || dt == DT_INT64;
    return kd_is_float(dt);
}

static int kd_build_unary(struct kd_builder *b) {
    enum dtype dt = b->x->dtype;
    if (!kd_unary_dtype_ok(b->op->code, dt)) return kd_no(b, "%s on %s", b->n->op_type, dtype_name(dt));
    if (!kd_is_float(dt) && b->n->act != ACT_NONE) return kd_no(b, "fused activation on integers");
    b->st->run = kd_run_unary;
    return 0;
}

/* A unary op with parameters pa and pb (the kernel's a and b). */
static int kd_build_unary_ab(struct kd_builder *b, float pa, float pb) {
    if (kd_build_unary(b)) return -1;
    b->st->a = pa;
    b->st->b = pb;
    return 0;
}

static int kd_build_leaky_relu(struct kd_builder *b) {
    return kd_build_unary_ab(b, node_attr_float(b->n, "alpha", 0.01f), 0);
}

/* Elu, Celu, ThresholdedRelu: alpha, 1 by default. */
static int kd_build_alpha_one(struct kd_builder *b) { return kd_build_unary_ab(b, node_attr_float(b->n, "alpha", 1.0f), 0); }

static int kd_build_hard_sigmoid(struct kd_builder *b) {
    return kd_build_unary_ab(b, node_attr_float(b->n, "alpha", 0.2f), node_attr_float(b->n, "beta", 0.5f));
}

static int kd_build_selu(struct kd_builder *b) {
    return kd_build_unary_ab(b, node_attr_float(b->n, "alpha", 1.67326319217681884765625f),
                             node_attr_float(b->n, "gamma", 1.05070102214813232421875f));
}

/* The kernel is the exact (erf) form only. */
static int kd_build_gelu(struct kd_builder *b) {
    if (strcmp(node_attr_str(b->n, "approximate", "none"), "none") != 0) return kd_no(b, "Gelu with approximate=tanh");
    return kd_build_unary(b);
}

static int kd_build_isinf(struct kd_builder *b) {
    if (kd_build_unary(b)) return -1;
    if (node_attr_int(b->n, "detect_positive", 1) != 1 || node_attr_int(b->n, "detect_negative", 1) != 1)
        return kd_no(b, "IsInf detecting one sign only");
    return 0;
}

/* Clip's bounds: attributes before opset 11, optional constant inputs since. */
static int kd_build_clip(struct kd_builder *b) {
    const struct op_call *c = b->c;
    struct kd_state *st = b->st;
    if (kd_build_unary(b)) return -1;
    st->a = -FLT_MAX;
    st->b = FLT_MAX;
    if (b->n->opset > 0 && b->n->opset < 11) {
        st->a = node_attr_float(b->n, "min", -FLT_MAX);
        st->b = node_attr_float(b->n, "max", FLT_MAX);
        return 0;
    }
    double v;
    if (c->nin > 1 && c->in[1]) {
        if (kd_read_double(c->in[1], &v)) return kd_no(b, "Clip min is not a constant");
        st->a = (float)v;
    }
    if (c->nin > 2 && c->in[2]) {
        if (kd_read_double(c->in[2], &v)) return kd_no(b, "Clip max is not a constant");
        st->b = (float)v;
    }
    return 0;
}

/* ---- elementwise binary (variadic Sum, Mean, Max, Min included), Where --- */

static int kd_run_binary(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    struct kc_act act = kd_fused_act(st), none = {0, 0, 0};
    cudaError_t e = c->nin == 1 ? kd_copy(x, y, s) : cudaSuccess;
    for (int k = 1; k < c->nin && e == cudaSuccess; k++) {
        /* Step k: y = (k == 1 ? in0 : y) op in_k, every operand broadcast to y's shape. */
        const struct tensor *l = k == 1 ? x : y, *r = c->in[k];
        int ndim[2] = {l->ndim, r->ndim};
        const int64_t *dims[2] = {l->dims, r->dims};
        struct kc_bcast bc;
        if (kc_bcast_init(&bc, y->ndim, y->dims, 2, ndim, dims)) return op_error(c, "inputs do not broadcast");
        e = kc_binary(st->code, x->dtype, l->data, r->data, y->data, &bc, act, s);
    }
    if (e == cudaSuccess && st->flag && c->nin > 1)
        e = kc_unary(KU_SCALE, y->dtype, y->data, y->data, tensor_numel(y), 1.0f / (float)c->nin, 0, none, s);
    return kd_check(c, e);
}

/* Logic takes bool; comparisons most types; BitShift unsigned 8 and signed
 * 32/64-bit integers; arithmetic floats and signed 32/64-bit integers. */
static int kd_binary_dtype_ok(int code, enum dtype dt) {
    if (code == KB_AND || code == KB_OR || code == KB_XOR) return dt == DT_BOOL;
    if (code >= KB_EQUAL && code <= KB_GREATER_EQUAL)
        return kd_is_float(dt) || dt == DT_INT32 || dt == DT_INT64 || dt == DT_BOOL || dt == DT_UINT8 ||
               dt == DT_INT8 || dt == DT_FP64;
    if (code == KB_BITSHIFT_LEFT) return dt == DT_UINT8 || dt == DT_INT32 || dt == DT_INT64;
    return kd_is_float(dt) || dt == DT_INT32 || dt == DT_INT64;
}

/* Any number of inputs of one dtype, each broadcasting to the output (so
 * every step's pair does too). */
static int kd_build_variadic(struct kd_builder *b) {
    const struct op_call *c = b->c;
    const struct tensor *x = b->x, *y = b->y;
    if (c->nin < 1 || c->nin > OP_MAX_IO) return kd_no(b, "input count");
    for (int k = 0; k < c->nin; k++) {
        const struct tensor *t = c->in[k];
        if (!t) return kd_no(b, "absent input");
        if (t->dtype != x->dtype) return kd_no(b, "mixed input dtypes (%s, %s)", dtype_name(x->dtype), dtype_name(t->dtype));
        int ndim[1] = {t->ndim};
        const int64_t *dims[1] = {t->dims};
        struct kc_bcast tmp;
        if (kc_bcast_init(&tmp, y->ndim, y->dims, 1, ndim, dims)) return kd_no(b, "input %d does not broadcast to the output", k);
    }
    if (!kd_binary_dtype_ok(b->op->code, x->dtype)) return kd_no(b, "%s on %s", b->n->op_type, dtype_name(x->dtype));
    /* Multi-input ops apply the activation once, after the last step. */
    b->st->act_after = c->nin > 2;
    b->st->run = kd_run_binary;
    return 0;
}

static int kd_build_binary(struct kd_builder *b) {
    if (b->c->nin != 2) return kd_no(b, "%s with %d inputs", b->n->op_type, b->c->nin);
    return kd_build_variadic(b);
}

/* Sum of the inputs, then one scaling by 1/n (flag). */
static int kd_build_mean(struct kd_builder *b) {
    if (kd_build_variadic(b)) return -1;
    b->st->flag = 1;
    b->st->act_after = 1;
    return 0;
}

/* fmod=1 is C's fmod; fmod=0 (Python's sign rule) only on integers. */
static int kd_build_mod(struct kd_builder *b) {
    if (kd_build_binary(b)) return -1;
    if (node_attr_int(b->n, "fmod", 0)) b->st->code = KB_FMOD;
    else if (kd_is_float(b->x->dtype)) return kd_no(b, "Mod with fmod=0 on floats");
    return 0;
}

static int kd_build_bitshift(struct kd_builder *b) {
    if (kd_build_binary(b)) return -1;
    if (!strcmp(node_attr_str(b->n, "direction", "LEFT"), "RIGHT")) b->st->code = KB_BITSHIFT_RIGHT;
    return 0;
}

static int kd_run_where(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[1];
    return kd_check(c, kc_where(dtype_size(x->dtype), c->in[0]->data, x->data, c->in[2]->data, c->out[0]->data, &st->bc, s));
}

static int kd_build_where(struct kd_builder *b) {
    const struct op_call *c = b->c;
    if (c->nin != 3 || !c->in[1] || !c->in[2]) return kd_no(b, "Where needs 3 inputs");
    if (b->x->dtype != DT_BOOL || c->in[1]->dtype != c->in[2]->dtype) return kd_no(b, "Where dtypes");
    if (!kd_elem_ok(dtype_size(c->in[1]->dtype))) return kd_no(b, "Where element size");
    int ndim[3] = {c->in[0]->ndim, c->in[1]->ndim, c->in[2]->ndim};
    const int64_t *dims[3] = {c->in[0]->dims, c->in[1]->dims, c->in[2]->dims};
    if (kc_bcast_init(&b->st->bc, b->y->ndim, b->y->dims, 3, ndim, dims)) return kd_no(b, "Where inputs do not broadcast");
    b->st->act_after = 1;
    b->st->run = kd_run_where;
    return 0;
}

/* ---- data movement: copies and views, remaps, Concat, Split ------------- */

static int kd_run_copy(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    (void)st;
    return kd_check(c, kd_copy(c->in[0], c->out[0], s));
}

/* Identity and the views (Reshape...) when the plan did not alias them. */
static int kd_build_copy(struct kd_builder *b) {
    if (tensor_nbytes(b->x) != tensor_nbytes(b->y)) return kd_no(b, "%s changes the byte size", b->n->op_type);
    b->st->act_after = 1;
    b->st->run = kd_run_copy;
    return 0;
}

static int kd_build_dropout(struct kd_builder *b) {
    if (kd_build_copy(b)) return -1;
    if (b->c->nout > 1 && b->c->out[1]) return kd_no(b, "Dropout with a mask output");
    return 0;
}

static int kd_run_remap(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0];
    return kd_check(c, kc_remap(dtype_size(x->dtype), x->data, c->out[0]->data, &st->rm, s));
}

/* The remap every movement starts from: each output dim read linearly;
 * xst receives the input's strides. same_rank: the output keeps the input's
 * rank (all but Expand). */
static int kd_remap_init(struct kd_builder *b, int64_t *xst, int same_rank) {
    const struct tensor *x = b->x, *y = b->y;
    size_t es = dtype_size(x->dtype);
    if (!kd_elem_ok(es)) return kd_no(b, "element size %zu", es);
    if (same_rank && y->ndim != x->ndim) return kd_no(b, "output rank differs from the input's");
    if (y->ndim < x->ndim) return kd_no(b, "output rank below the input's");
    struct kc_remap_desc *m = &b->st->rm;
    kd_contig_strides(x, xst);
    m->ndim = y->ndim;
    m->n = tensor_numel(y);
    for (int d = 0; d < y->ndim; d++) {
        m->out_dims[d] = y->dims[d];
        m->mode[d] = KM_LINEAR;
        m->step[d] = 1;
    }
    b->st->act_after = 1;
    b->st->run = kd_run_remap;
    return 0;
}

static int kd_build_expand(struct kd_builder *b) {
    const struct tensor *x = b->x, *y = b->y;
    struct kc_remap_desc *m = &b->st->rm;
    int64_t xst[KC_MAX_DIMS];
    if (kd_remap_init(b, xst, 0)) return -1;
    int off = y->ndim - x->ndim;
    for (int d = 0; d < y->ndim; d++) {
        int id = d - off;
        int64_t dim = id >= 0 ? x->dims[id] : 1;
        if (dim != 1 && dim != y->dims[d]) return kd_no(b, "Expand shapes");
        m->in_dims[d] = dim;
        m->in_stride[d] = id >= 0 ? xst[id] : 0;
        m->step[d] = dim == 1 ? 0 : 1;
    }
    return 0;
}

static int kd_build_tile(struct kd_builder *b) {
    const struct tensor *x = b->x, *y = b->y;
    struct kc_remap_desc *m = &b->st->rm;
    int64_t xst[KC_MAX_DIMS];
    if (kd_remap_init(b, xst, 1)) return -1;
    for (int d = 0; d < y->ndim; d++) {
        if (x->dims[d] == 0 || y->dims[d] % x->dims[d]) return kd_no(b, "Tile shapes");
        m->in_dims[d] = x->dims[d];
        m->in_stride[d] = xst[d];
        m->mode[d] = KM_MOD;
    }
    return 0;
}

static int kd_build_transpose(struct kd_builder *b) {
    const struct tensor *x = b->x, *y = b->y;
    struct kc_remap_desc *m = &b->st->rm;
    int64_t xst[KC_MAX_DIMS];
    if (kd_remap_init(b, xst, 1)) return -1;
    const int64_t *perm = NULL;
    int np = node_attr_ints(b->n, "perm", &perm);
    for (int d = 0; d < y->ndim; d++) {
        int64_t p = np >= 0 ? (d < np ? perm[d] : -1) : y->ndim - 1 - d;
        if (p < 0 || p >= x->ndim || x->dims[p] != y->dims[d]) return kd_no(b, "Transpose perm");
        m->in_dims[d] = x->dims[p];
        m->in_stride[d] = xst[p];
    }
    return 0;
}

/* Slice's starts, axes and steps (counts n*; -1: absent). The ends only
 * have to match: the output's shape says where each axis stops. */
struct kd_slice_args {
    int64_t starts[KC_MAX_DIMS], ends[KC_MAX_DIMS], axes[KC_MAX_DIMS], steps[KC_MAX_DIMS];
    int ns, na, nst;
};

/* Before opset 10: attributes, no steps. */
static int kd_slice_attrs(struct kd_builder *b, struct kd_slice_args *a) {
    const int64_t *p;
    a->ns = node_attr_ints(b->n, "starts", &p);
    if (a->ns < 0 || a->ns > KC_MAX_DIMS) return kd_no(b, "Slice starts");
    memcpy(a->starts, p, (size_t)a->ns * 8);
    int ne = node_attr_ints(b->n, "ends", &p);
    if (ne != a->ns) return kd_no(b, "Slice ends");
    memcpy(a->ends, p, (size_t)ne * 8);
    a->na = node_attr_ints(b->n, "axes", &p);
    if (a->na > KC_MAX_DIMS) return kd_no(b, "Slice axes");
    if (a->na > 0) memcpy(a->axes, p, (size_t)a->na * 8);
    a->nst = -1;
    return 0;
}

/* Since opset 10: constant inputs. */
static int kd_slice_inputs(struct kd_builder *b, struct kd_slice_args *a) {
    const struct op_call *c = b->c;
    a->ns = kd_read_ints(c->nin > 1 ? c->in[1] : NULL, a->starts, KC_MAX_DIMS);
    int ne = kd_read_ints(c->nin > 2 ? c->in[2] : NULL, a->ends, KC_MAX_DIMS);
    if (a->ns < 0 || ne != a->ns) return kd_no(b, "Slice starts/ends are not constants");
    a->na = c->nin > 3 && c->in[3] ? kd_read_ints(c->in[3], a->axes, KC_MAX_DIMS) : -1;
    a->nst = c->nin > 4 && c->in[4] ? kd_read_ints(c->in[4], a->steps, KC_MAX_DIMS) : -1;
    if ((c->nin > 3 && c->in[3] && a->na != a->ns) || (c->nin > 4 && c->in[4] && a->nst != a->ns))
        return kd_no(b, "Slice axes/steps are not constants");
    return 0;
}

static int kd_build_slice(struct kd_builder *b) {
    const struct tensor *x = b->x;
    struct kc_remap_desc *m = &b->st->rm;
    int64_t xst[KC_MAX_DIMS];
    struct kd_slice_args a;
    if (kd_remap_init(b, xst, 1)) return -1;
    int attrs = b->n->opset > 0 && b->n->opset < 10;
    if (attrs ? kd_slice_attrs(b, &a) : kd_slice_inputs(b, &a)) return -1;
    for (int d = 0; d < x->ndim; d++) {
        m->in_dims[d] = x->dims[d];
        m->in_stride[d] = xst[d];
        m->start[d] = 0;
    }
    for (int i = 0; i < a.ns; i++) {
        int64_t ax = a.na > 0 ? a.axes[i] : i;
        if (ax < 0) ax += x->ndim;
        if (ax < 0 || ax >= x->ndim) return kd_no(b, "Slice axis");
        int64_t dim = x->dims[ax], s = a.starts[i], step = a.nst > 0 ? a.steps[i] : 1;
        if (step == 0) return kd_no(b, "Slice step 0");
        if (s < 0) s += dim;
        if (step > 0) s = s < 0 ? 0 : (s > dim ? dim : s);
        else s = s < 0 ? 0 : (s > dim - 1 ? dim - 1 : s);
        m->start[ax] = s;
        m->step[ax] = step;
    }
    return 0;
}

/* Pad's pads (np of them), axes (na; -1: all) and constant value. */
struct kd_pad_args {
    int64_t pads[2 * KC_MAX_DIMS], axes[KC_MAX_DIMS];
    int np, na;
    double value;
};

/* Attributes before opset 11, constant inputs since. */
static int kd_pad_args_of(struct kd_builder *b, struct kd_pad_args *a) {
    const struct op_call *c = b->c;
    a->na = -1;
    a->value = 0;
    if (b->n->opset > 0 && b->n->opset < 11) {
        const int64_t *p;
        a->np = node_attr_ints(b->n, "pads", &p);
        if (a->np != 2 * b->x->ndim) return kd_no(b, "Pad pads");
        memcpy(a->pads, p, (size_t)a->np * 8);
        a->value = node_attr_float(b->n, "value", 0.0f);
        return 0;
    }
    a->np = kd_read_ints(c->nin > 1 ? c->in[1] : NULL, a->pads, 2 * KC_MAX_DIMS);
    if (a->np < 0) return kd_no(b, "Pad pads are not a constant");
    if (c->nin > 2 && c->in[2] && kd_read_double(c->in[2], &a->value)) return kd_no(b, "Pad value is not a constant");
    if (c->nin > 3 && c->in[3]) {
        a->na = kd_read_ints(c->in[3], a->axes, KC_MAX_DIMS);
        if (a->na < 0) return kd_no(b, "Pad axes are not a constant");
    }
    return 0;
}

/* Padding before (begin) and after (end) each input dim. */
static int kd_pad_sides(struct kd_builder *b, const struct kd_pad_args *a, int64_t *begin, int64_t *end) {
    int rank = b->x->ndim;
    if (a->na < 0) {
        if (a->np != 2 * rank) return kd_no(b, "Pad pads length");
        for (int d = 0; d < rank; d++) {
            begin[d] = a->pads[d];
            end[d] = a->pads[d + rank];
        }
        return 0;
    }
    if (a->np != 2 * a->na) return kd_no(b, "Pad pads/axes");
    for (int i = 0; i < a->na; i++) {
        int64_t ax = a->axes[i] < 0 ? a->axes[i] + rank : a->axes[i];
        if (ax < 0 || ax >= rank) return kd_no(b, "Pad axis");
        begin[ax] = a->pads[i];
        end[ax] = a->pads[i + a->na];
    }
    return 0;
}

/* The remap mode of a Pad mode, -1 for one the kernel lacks. */
static int kd_pad_mode(const char *mode) {
    if (!strcmp(mode, "constant")) return KM_PAD_CONSTANT;
    if (!strcmp(mode, "edge")) return KM_PAD_EDGE;
    if (!strcmp(mode, "reflect")) return KM_PAD_REFLECT;
    if (!strcmp(mode, "wrap")) return KM_PAD_WRAP;
    return -1;
}

static int kd_build_pad(struct kd_builder *b) {
    const struct tensor *x = b->x, *y = b->y;
    struct kc_remap_desc *m = &b->st->rm;
    int64_t xst[KC_MAX_DIMS], begin[KC_MAX_DIMS] = {0}, end[KC_MAX_DIMS] = {0};
    struct kd_pad_args a;
    if (kd_remap_init(b, xst, 1) || kd_pad_args_of(b, &a) || kd_pad_sides(b, &a, begin, end)) return -1;
    const char *mode = node_attr_str(b->n, "mode", "constant");
    int md = kd_pad_mode(mode);
    if (md < 0) return kd_no(b, "Pad mode '%s'", mode);
    for (int d = 0; d < x->ndim; d++) {
        if (y->dims[d] != x->dims[d] + begin[d] + end[d]) return kd_no(b, "Pad output shape");
        if (md != KM_PAD_CONSTANT && x->dims[d] == 0 && y->dims[d] > 0) return kd_no(b, "Pad of an empty dim");
        m->in_dims[d] = x->dims[d];
        m->in_stride[d] = xst[d];
        m->start[d] = begin[d];
        m->mode[d] = md;
    }
    m->pad_bits = kd_bits_of(x->dtype, a.value);
    return 0;
}

/* Concat and Split as 2-D copies: the whole tensor is [outer, dim(axis) *
 * inner] rows, part k the block of columns after parts 0..k-1. to_whole:
 * the parts are copied into the whole (Concat), else out of it (Split). */
static int kd_run_blocks(struct op_call *c, const struct tensor *whole, const struct tensor *const *parts, int nparts,
                         int axis, int to_whole, cudaStream_t s) {
    size_t es = dtype_size(whole->dtype);
    int64_t outer = kd_prod(whole, 0, axis), inner = kd_prod(whole, axis + 1, whole->ndim);
    int64_t ld = whole->dims[axis] * inner, off = 0;
    cudaError_t e = cudaSuccess;
    for (int k = 0; k < nparts && e == cudaSuccess; k++) {
        int64_t cols = parts[k]->dims[axis] * inner;
        char *w = (char *)whole->data + (size_t)off * es;
        if (to_whole) e = kc_copy2d(es, w, ld, parts[k]->data, cols, outer, cols, s);
        else e = kc_copy2d(es, parts[k]->data, cols, w, ld, outer, cols, s);
        off += cols;
    }
    return kd_check(c, e);
}

static int kd_run_concat(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    return kd_run_blocks(c, c->out[0], c->in, c->nin, st->axis, 1, s);
}

static int kd_build_concat(struct kd_builder *b) {
    const struct op_call *c = b->c;
    const struct tensor *y = b->y;
    int axis = kd_axis(b, 0, y->ndim);
    if (axis < 0) return kd_no(b, "Concat axis");
    for (int k = 0; k < c->nin; k++) {
        if (!c->in[k] || c->in[k]->dtype != y->dtype || c->in[k]->ndim != y->ndim) return kd_no(b, "Concat inputs");
        if (!kd_elem_ok(dtype_size(y->dtype))) return kd_no(b, "element size");
    }
    b->st->axis = axis;
    b->st->act_after = 1;
    b->st->run = kd_run_concat;
    return 0;
}

static int kd_run_split(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    return kd_run_blocks(c, c->in[0], c->out, c->nout, st->axis, 0, s);
}

static int kd_build_split(struct kd_builder *b) {
    const struct op_call *c = b->c;
    const struct tensor *x = b->x;
    int axis = kd_axis(b, 0, x->ndim);
    if (axis < 0) return kd_no(b, "Split axis");
    int64_t total = 0;
    for (int k = 0; k < c->nout; k++) {
        if (!c->out[k] || c->out[k]->ndim != x->ndim) return kd_no(b, "Split outputs");
        total += c->out[k]->dims[axis];
    }
    if (total != x->dims[axis]) return kd_no(b, "Split sizes");
    if (!kd_elem_ok(dtype_size(x->dtype))) return kd_no(b, "element size");
    if (b->n->act != ACT_NONE) return kd_no(b, "fused activation on Split");
    b->st->axis = axis;
    b->st->run = kd_run_split;
    return 0;
}

/* ---- Gather, GatherElements, Cast ------------------------------------------ */

static int kd_run_gather(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0], *ix = c->in[1];
    return kd_check(c, kc_gather(dtype_size(x->dtype), x->data, ix->data, ix->dtype, c->out[0]->data, st->outer,
                                 st->mid, st->inner, tensor_numel(ix), s));
}

static int kd_build_gather(struct kd_builder *b) {
    const struct op_call *c = b->c;
    const struct tensor *x = b->x;
    struct kd_state *st = b->st;
    if (c->nin != 2 || !c->in[1]) return kd_no(b, "Gather inputs");
    if (c->in[1]->dtype != DT_INT64 && c->in[1]->dtype != DT_INT32)
        return kd_no(b, "Gather indices of %s", dtype_name(c->in[1]->dtype));
    int axis = kd_axis(b, 0, x->ndim);
    if (axis < 0) return kd_no(b, "Gather axis");
    if (!kd_elem_ok(dtype_size(x->dtype))) return kd_no(b, "element size");
    st->outer = kd_prod(x, 0, axis);
    st->mid = x->dims[axis];
    st->inner = kd_prod(x, axis + 1, x->ndim);
    st->axis = axis;
    st->act_after = 1;
    st->run = kd_run_gather;
    return 0;
}

static int kd_run_gather_elements(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0], *ix = c->in[1];
    return kd_check(c, kc_gather_elements(dtype_size(x->dtype), x->data, ix->data, ix->dtype, c->out[0]->data, &st->ge, s));
}

static int kd_build_gather_elements(struct kd_builder *b) {
    const struct op_call *c = b->c;
    const struct tensor *x = b->x, *y = b->y;
    const struct tensor *ix = c->nin == 2 ? c->in[1] : NULL;
    if (!ix || (ix->dtype != DT_INT64 && ix->dtype != DT_INT32)) return kd_no(b, "GatherElements indices");
    if (ix->ndim != x->ndim || y->ndim != ix->ndim) return kd_no(b, "GatherElements ranks");
    for (int d = 0; d < y->ndim; d++)
        if (y->dims[d] != ix->dims[d]) return kd_no(b, "GatherElements output shape");
    int axis = kd_axis(b, 0, x->ndim);
    if (axis < 0) return kd_no(b, "GatherElements axis");
    if (!kd_elem_ok(dtype_size(x->dtype))) return kd_no(b, "element size");
    int64_t xst[KC_MAX_DIMS];
    kd_contig_strides(x, xst);
    struct kc_gather_el_desc *g = &b->st->ge;
    g->ndim = x->ndim;
    g->axis = axis;
    g->n = tensor_numel(y);
    g->axis_dim = x->dims[axis];
    for (int d = 0; d < x->ndim; d++) {
        g->dims[d] = y->dims[d];
        g->xstride[d] = xst[d];
    }
    b->st->act_after = 1;
    b->st->run = kd_run_gather_elements;
    return 0;
}

static int kd_run_cast(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    (void)st;
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    return kd_check(c, kc_cast(x->dtype, y->dtype, x->data, y->data, tensor_numel(y), s));
}

/* Cast and CastLike: the output's dtype says the target. */
static int kd_build_cast(struct kd_builder *b) {
    if (!kc_cast_supported(b->x->dtype, b->y->dtype))
        return kd_no(b, "Cast from %s to %s", dtype_name(b->x->dtype), dtype_name(b->y->dtype));
    b->st->act_after = 1;
    b->st->run = kd_run_cast;
    return 0;
}

/* ---- Softmax, LogSoftmax (code 1) ------------------------------------------ */

static int kd_run_softmax(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0];
    return kd_check(c, kc_softmax(x->dtype, x->data, c->out[0]->data, st->outer, st->mid, st->inner, st->code, s));
}

/* Before opset 13 the rows are everything from axis on (flattened 2-D);
 * since, the axis alone. */
static int kd_build_softmax(struct kd_builder *b) {
    const struct tensor *x = b->x;
    struct kd_state *st = b->st;
    if (!kd_is_float(x->dtype)) return kd_no(b, "%s on %s", b->n->op_type, dtype_name(x->dtype));
    int old = b->n->opset > 0 && b->n->opset < 13;
    int axis = kd_axis(b, old ? 1 : -1, x->ndim);
    if (axis < 0) return kd_no(b, "axis");
    st->outer = kd_prod(x, 0, axis);
    if (old) {
        st->mid = kd_prod(x, axis, x->ndim);
        st->inner = 1;
    } else {
        st->mid = x->dims[axis];
        st->inner = kd_prod(x, axis + 1, x->ndim);
    }
    st->act_after = 1;
    st->run = kd_run_softmax;
    return 0;
}

/* ---- normalizations: LayerNormalization, InstanceNormalization, LRN,
 *      BatchNormalization -------------------------------------------------- */

/* An optional input's or output's data, NULL when absent. */
static const void *kd_in_data(const struct op_call *c, int k) { return c->nin > k && c->in[k] ? c->in[k]->data : NULL; }
static float *kd_out_f32(const struct op_call *c, int k) {
    return c->nout > k && c->out[k] ? (float *)c->out[k]->data : NULL;
}

static int kd_run_layernorm(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0];
    return kd_check(c, kc_layernorm(x->dtype, x->data, kd_in_data(c, 1), kd_in_data(c, 2), c->out[0]->data,
                                    kd_out_f32(c, 1), kd_out_f32(c, 2), st->outer, st->inner, st->eps, 0, s));
}

static int kd_build_layernorm(struct kd_builder *b) {
    const struct op_call *c = b->c;
    const struct tensor *x = b->x;
    struct kd_state *st = b->st;
    if (!kd_is_float(x->dtype)) return kd_no(b, "LayerNormalization on %s", dtype_name(x->dtype));
    int axis = kd_axis(b, -1, x->ndim);
    if (axis < 0) return kd_no(b, "axis");
    st->outer = kd_prod(x, 0, axis);
    st->inner = kd_prod(x, axis, x->ndim);
    for (int k = 1; k < c->nin && k < 3; k++)
        if (c->in[k] && (c->in[k]->dtype != x->dtype || tensor_numel(c->in[k]) != st->inner))
            return kd_no(b, "LayerNormalization scale/bias that broadcast partially");
    for (int k = 1; k < c->nout; k++)
        if (c->out[k] && c->out[k]->dtype != DT_FP32) return kd_no(b, "Mean/InvStdDev outputs not float");
    st->eps = node_attr_float(b->n, "epsilon", 1e-5f);
    st->act_after = 1;
    st->run = kd_run_layernorm;
    return 0;
}

/* Layer normalization of [N*C, spatial] rows, scale and B by channel. */
static int kd_run_instancenorm(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0];
    return kd_check(c, kc_layernorm(x->dtype, x->data, c->in[1]->data, c->in[2]->data, c->out[0]->data, NULL, NULL,
                                    st->outer, st->inner, st->eps, st->mid, s));
}

static int kd_build_instancenorm(struct kd_builder *b) {
    const struct op_call *c = b->c;
    const struct tensor *x = b->x;
    struct kd_state *st = b->st;
    if (!kd_is_float(x->dtype) || x->ndim < 3)
        return kd_no(b, "InstanceNormalization on %s of rank %d", dtype_name(x->dtype), x->ndim);
    if (c->nin != 3 || !c->in[1] || !c->in[2]) return kd_no(b, "InstanceNormalization inputs");
    for (int k = 1; k < 3; k++)
        if (c->in[k]->dtype != x->dtype || tensor_numel(c->in[k]) != x->dims[1]) return kd_no(b, "scale/B not one per channel");
    st->outer = x->dims[0] * x->dims[1];
    st->inner = kd_prod(x, 2, x->ndim);
    st->mid = x->dims[1];
    st->eps = node_attr_float(b->n, "epsilon", 1e-5f);
    st->act_after = 1;
    st->run = kd_run_instancenorm;
    return 0;
}

static int kd_run_lrn(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0];
    return kd_check(c, kc_lrn(x->dtype, x->data, c->out[0]->data, st->outer, st->mid, st->inner, st->size, st->alpha,
                              st->beta, st->bias, s));
}

static int kd_build_lrn(struct kd_builder *b) {
    const struct tensor *x = b->x;
    struct kd_state *st = b->st;
    if (!kd_is_float(x->dtype) || x->ndim < 2) return kd_no(b, "LRN on %s of rank %d", dtype_name(x->dtype), x->ndim);
    int64_t size = node_attr_int(b->n, "size", 0);
    if (size < 1) return kd_no(b, "LRN size");
    st->size = (int)size;
    st->alpha = node_attr_float(b->n, "alpha", 1e-4f);
    st->beta = node_attr_float(b->n, "beta", 0.75f);
    st->bias = node_attr_float(b->n, "bias", 1.0f);
    st->outer = x->dims[0];
    st->mid = x->dims[1];
    st->inner = kd_prod(x, 2, x->ndim);
    st->act_after = 1;
    st->run = kd_run_lrn;
    return 0;
}

/* Inference form only; the kernel applies the fused activation. */
static int kd_run_batchnorm(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0];
    return kd_check(c, kc_batchnorm(x->dtype, c->in[1]->dtype, x->data, c->in[1]->data, c->in[2]->data, c->in[3]->data,
                                    c->in[4]->data, c->out[0]->data, st->outer, st->mid, st->inner, st->eps,
                                    kd_fused_act(st), s));
}

static int kd_build_batchnorm(struct kd_builder *b) {
    const struct op_call *c = b->c;
    const struct tensor *x = b->x;
    struct kd_state *st = b->st;
    if (!kd_is_float(x->dtype)) return kd_no(b, "BatchNormalization on %s", dtype_name(x->dtype));
    if (c->nin != 5 || c->nout != 1 || x->ndim < 2) return kd_no(b, "BatchNormalization in training form");
    if (node_attr_int(b->n, "training_mode", 0)) return kd_no(b, "training_mode");
    for (int k = 1; k < 5; k++)
        if (!c->in[k] || (c->in[k]->dtype != DT_FP32 && c->in[k]->dtype != x->dtype) ||
            c->in[k]->dtype != c->in[1]->dtype || tensor_numel(c->in[k]) != x->dims[1])
            return kd_no(b, "BatchNormalization parameters not one per channel in FP32 or the input's dtype");
    st->outer = x->dims[0];
    st->mid = x->dims[1];
    st->inner = kd_prod(x, 2, x->ndim);
    st->eps = node_attr_float(b->n, "epsilon", 1e-5f);
    st->run = kd_run_batchnorm;
    return 0;
}

/* ---- MaxPool (code 1), AveragePool (code 0) ------------------------------- */

static int kd_run_pool(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0];
    return kd_check(c, kc_pool(x->dtype, x->data, c->out[0]->data, &st->pool, s));
}

/* Padding of spatial dim d: auto_pad's SAME_* split, explicit pads, or
 * none (VALID). Returns 0, or -1 for an auto_pad the kernel lacks. */
static int kd_pool_pads(struct kc_pool_desc *p, int d, const char *auto_pad, const int64_t *pads, int np) {
    if (!strcmp(auto_pad, "SAME_UPPER") || !strcmp(auto_pad, "SAME_LOWER")) {
        int64_t total = (p->out[d] - 1) * p->s[d] + (int64_t)(p->k[d] - 1) * p->dil[d] + 1 - p->in[d];
        if (total < 0) total = 0;
        p->pb[d] = (int)(!strcmp(auto_pad, "SAME_UPPER") ? total / 2 : total - total / 2);
        p->pe[d] = (int)(total - p->pb[d]);
    } else if (!strcmp(auto_pad, "NOTSET") && np == 2 * p->nsp) {
        p->pb[d] = (int)pads[d];
        p->pe[d] = (int)pads[d + p->nsp];
    } else if (strcmp(auto_pad, "VALID") && strcmp(auto_pad, "NOTSET")) {
        return -1;
    }
    return 0;
}

/* Unused trailing spatial dims stay 1 (size, kernel, stride, dilation) for
 * the kernel's flat indexing. */
static void kd_pool_init(struct kc_pool_desc *p, int nsp, int is_max, int include_pad, int64_t n) {
    p->nsp = nsp;
    p->is_max = is_max;
    p->include_pad = include_pad;
    p->n = n;
    for (int d = 0; d < 3; d++) {
        p->in[d] = p->out[d] = 1;
        p->k[d] = p->s[d] = p->dil[d] = 1;
        p->pb[d] = p->pe[d] = 0;
    }
}

static int kd_build_pool(struct kd_builder *b) {
    const struct graph_node *n = b->n;
    const struct tensor *x = b->x, *y = b->y;
    struct kc_pool_desc *p = &b->st->pool;
    if (!kd_is_float(x->dtype) || y->dtype != x->dtype) return kd_no(b, "%s on %s", n->op_type, dtype_name(x->dtype));
    int nsp = x->ndim - 2;
    if (nsp < 1 || nsp > 3 || y->ndim != x->ndim) return kd_no(b, "%d spatial dims", nsp);
    if (b->c->nout > 1 && b->c->out[1]) return kd_no(b, "MaxPool Indices output");
    const int64_t *ks = NULL, *st = NULL, *dl = NULL, *pads = NULL;
    if (node_attr_ints(n, "kernel_shape", &ks) != nsp) return kd_no(b, "kernel_shape");
    int nst = node_attr_ints(n, "strides", &st), ndl = node_attr_ints(n, "dilations", &dl);
    int np = node_attr_ints(n, "pads", &pads);
    const char *auto_pad = node_attr_str(n, "auto_pad", "NOTSET");
    kd_pool_init(p, nsp, b->op->code, (int)node_attr_int(n, "count_include_pad", 0), tensor_numel(y));
    for (int d = 0; d < nsp; d++) {
        p->in[d] = x->dims[2 + d];
        p->out[d] = y->dims[2 + d];
        p->k[d] = (int)ks[d];
        p->s[d] = nst == nsp ? (int)st[d] : 1;
        p->dil[d] = ndl == nsp ? (int)dl[d] : 1;
        if (p->k[d] < 1 || p->s[d] < 1 || p->dil[d] < 1) return kd_no(b, "kernel, strides or dilations");
        if (kd_pool_pads(p, d, auto_pad, pads, np)) return kd_no(b, "auto_pad %s", auto_pad);
    }
    b->st->act_after = 1;
    b->st->run = kd_run_pool;
    return 0;
}

/* ---- reductions: Reduce* (code: kc_reduce_op), global pools, ArgMax/ArgMin */

static int kd_run_reduce(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0];
    return kd_check(c, kc_reduce(st->code, x->dtype, x->data, c->out[0]->data, &st->rd, s));
}

/* The kept and reduced dims of the input (red[d] 1: reduced). */
static int kd_reduce_desc(struct kd_builder *b, const int *red) {
    const struct tensor *x = b->x;
    struct kc_reduce_desc *r = &b->st->rd;
    int64_t xst[KC_MAX_DIMS];
    kd_contig_strides(x, xst);
    r->out_n = 1;
    r->r_n = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (red[d]) {
            r->rdims[r->nr] = x->dims[d];
            r->rstride[r->nr++] = xst[d];
            r->r_n *= x->dims[d];
        } else {
            r->kdims[r->nk] = x->dims[d];
            r->kstride[r->nk++] = xst[d];
            r->out_n *= x->dims[d];
        }
    }
    if (r->out_n != tensor_numel(b->y)) return kd_no(b, "reduction output size");
    if (r->r_n == 0) return kd_no(b, "reduction over an empty dim");
    b->st->act_after = 1;
    b->st->run = kd_run_reduce;
    return 0;
}

/* The axes a Reduce* node lists: an attribute, or a constant input
 * (ReduceSum since opset 13, the others since 18). Returns the count (0:
 * none listed), or -1. *from_input says where they came from. */
static int kd_reduce_axes(struct kd_builder *b, int64_t *axes, int *from_input) {
    const struct op_call *c = b->c;
    *from_input = (b->op->code == KR_SUM && b->n->opset >= 13) || b->n->opset >= 18;
    if (*from_input) {
        int na = c->nin > 1 && c->in[1] ? kd_read_ints(c->in[1], axes, KC_MAX_DIMS) : 0;
        return na < 0 ? kd_no(b, "axes are not a constant") : na;
    }
    const int64_t *p;
    int na = node_attr_ints(b->n, "axes", &p);
    if (na > KC_MAX_DIMS) return kd_no(b, "axes");
    if (na > 0) memcpy(axes, p, (size_t)na * 8);
    return na < 0 ? 0 : na;
}

/* No axes reduce every dim, or none with noop_with_empty_axes (a copy). */
static int kd_build_reduce(struct kd_builder *b) {
    const struct tensor *x = b->x;
    if (!kd_is_float(x->dtype)) return kd_no(b, "%s on %s", b->n->op_type, dtype_name(x->dtype));
    int64_t axes[KC_MAX_DIMS];
    int red[KC_MAX_DIMS] = {0}, from_input;
    int na = kd_reduce_axes(b, axes, &from_input);
    if (na < 0) return -1;
    int noop = na == 0 && from_input && node_attr_int(b->n, "noop_with_empty_axes", 0);
    for (int d = 0; d < x->ndim && na == 0; d++) red[d] = 1;
    for (int i = 0; i < na; i++) {
        int64_t a = axes[i] < 0 ? axes[i] + x->ndim : axes[i];
        if (a < 0 || a >= x->ndim) return kd_no(b, "axis out of range");
        red[a] = 1;
    }
    if (!noop) return kd_reduce_desc(b, red);
    if (tensor_nbytes(x) != tensor_nbytes(b->y)) return kd_no(b, "noop reduction shape");
    b->st->act_after = 1;
    b->st->run = kd_run_copy;
    return 0;
}

/* GlobalAveragePool (KR_MEAN), GlobalMaxPool (KR_MAX): every spatial dim. */
static int kd_build_global_pool(struct kd_builder *b) {
    const struct tensor *x = b->x;
    if (!kd_is_float(x->dtype)) return kd_no(b, "%s on %s", b->n->op_type, dtype_name(x->dtype));
    if (x->ndim < 3) return kd_no(b, "global pooling of rank %d", x->ndim);
    int red[KC_MAX_DIMS] = {0};
    for (int d = 2; d < x->ndim; d++) red[d] = 1;
    return kd_reduce_desc(b, red);
}

/* ArgMax, ArgMin (code 1); flag: select_last_index. */
static int kd_run_argmax(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct tensor *x = c->in[0];
    return kd_check(c, kc_argmax(x->dtype, x->data, (int64_t *)c->out[0]->data, st->outer, st->mid, st->inner, st->code,
                                 st->flag, s));
}

static int kd_build_argmax(struct kd_builder *b) {
    const struct tensor *x = b->x;
    struct kd_state *st = b->st;
    if (!kd_is_float(x->dtype) && x->dtype != DT_INT32 && x->dtype != DT_INT64)
        return kd_no(b, "%s on %s", b->n->op_type, dtype_name(x->dtype));
    if (b->y->dtype != DT_INT64) return kd_no(b, "output not int64");
    int axis = kd_axis(b, 0, x->ndim);
    if (axis < 0) return kd_no(b, "axis");
    if (x->dims[axis] == 0) return kd_no(b, "ArgMax over an empty dim");
    st->outer = kd_prod(x, 0, axis);
    st->mid = x->dims[axis];
    st->inner = kd_prod(x, axis + 1, x->ndim);
    st->flag = (int)node_attr_int(b->n, "select_last_index", 0);
    st->run = kd_run_argmax;
    return 0;
}

/* ---- the op table: one line per op ----------------------------------------- */


static const struct kd_op g_ops[] = {
    {"Relu", kd_build_unary, KU_ACT_BASE + ACT_RELU},
    {"LeakyRelu", kd_build_leaky_relu, KU_ACT_BASE + ACT_LEAKY_RELU},
    {"Sigmoid", kd_build_unary, KU_ACT_BASE + ACT_SIGMOID},
    {"Tanh", kd_build_unary, KU_ACT_BASE + ACT_TANH},
    {"Gelu", kd_build_gelu, KU_ACT_BASE + ACT_GELU},
    {"HardSigmoid", kd_build_hard_sigmoid, KU_ACT_BASE + ACT_HARD_SIGMOID},
    {"HardSwish", kd_build_unary, KU_ACT_BASE + ACT_HARD_SWISH},
    {"Clip", kd_build_clip, KU_ACT_BASE + ACT_CLIP},
    {"Neg", kd_build_unary, KU_NEG},
    {"Abs", kd_build_unary, KU_ABS},
    {"Exp", kd_build_unary, KU_EXP},
    {"Log", kd_build_unary, KU_LOG},
    {"Sqrt", kd_build_unary, KU_SQRT},
    {"Reciprocal", kd_build_unary, KU_RECIPROCAL},
    {"Floor", kd_build_unary, KU_FLOOR},
    {"Ceil", kd_build_unary, KU_CEIL},
    {"Round", kd_build_unary, KU_ROUND},
    {"Erf", kd_build_unary, KU_ERF},
    {"Sin", kd_build_unary, KU_SIN},
    {"Cos", kd_build_unary, KU_COS},
    {"Tan", kd_build_unary, KU_TAN},
    {"Asin", kd_build_unary, KU_ASIN},
    {"Acos", kd_build_unary, KU_ACOS},
    {"Atan", kd_build_unary, KU_ATAN},
    {"Sinh", kd_build_unary, KU_SINH},
    {"Cosh", kd_build_unary, KU_COSH},
    {"Asinh", kd_build_unary, KU_ASINH},
    {"Acosh", kd_build_unary, KU_ACOSH},
    {"Atanh", kd_build_unary, KU_ATANH},
    {"Sign", kd_build_unary, KU_SIGN},
    {"Softplus", kd_build_unary, KU_SOFTPLUS},
    {"Softsign", kd_build_unary, KU_SOFTSIGN},
    {"Elu", kd_build_alpha_one, KU_ELU},
    {"Selu", kd_build_selu, KU_SELU},
    {"Celu", kd_build_alpha_one, KU_CELU},
    {"Mish", kd_build_unary, KU_MISH},
    {"ThresholdedRelu", kd_build_alpha_one, KU_THRESHOLDED_RELU},
    {"Not", kd_build_unary, KU_NOT},
    {"IsNaN", kd_build_unary, KU_ISNAN},
    {"IsInf", kd_build_isinf, KU_ISINF},
    {"Add", kd_build_binary, KB_ADD},
    {"Sub", kd_build_binary, KB_SUB},
    {"Mul", kd_build_binary, KB_MUL},
    {"Div", kd_build_binary, KB_DIV},
    {"Pow", kd_build_binary, KB_POW},
    {"Max", kd_build_variadic, KB_MAX},
    {"Min", kd_build_variadic, KB_MIN},
    {"Sum", kd_build_variadic, KB_ADD},
    {"Mean", kd_build_mean, KB_ADD},
    {"Mod", kd_build_mod, KB_MOD},
    {"PRelu", kd_build_binary, KB_PRELU},
    {"Equal", kd_build_binary, KB_EQUAL},
    {"Less", kd_build_binary, KB_LESS},
    {"Greater", kd_build_binary, KB_GREATER},
    {"LessOrEqual", kd_build_binary, KB_LESS_EQUAL},
    {"GreaterOrEqual", kd_build_binary, KB_GREATER_EQUAL},
    {"And", kd_build_binary, KB_AND},
    {"Or", kd_build_binary, KB_OR},
    {"Xor", kd_build_binary, KB_XOR},
    {"BitShift", kd_build_bitshift, KB_BITSHIFT_LEFT},
    {"Where", kd_build_where, 0},
    {"Identity", kd_build_copy, 0},
    {"Dropout", kd_build_dropout, 0},
    {"Reshape", kd_build_copy, 0},
    {"Flatten", kd_build_copy, 0},
    {"Squeeze", kd_build_copy, 0},
    {"Unsqueeze", kd_build_copy, 0},
    {"Expand", kd_build_expand, 0},
    {"Tile", kd_build_tile, 0},
    {"Transpose", kd_build_transpose, 0},
    {"Slice", kd_build_slice, 0},
    {"Pad", kd_build_pad, 0},
    {"Concat", kd_build_concat, 0},
    {"Split", kd_build_split, 0},
    {"Gather", kd_build_gather, 0},
    {"Cast", kd_build_cast, 0},
    {"CastLike", kd_build_cast, 0},
    {"GatherElements", kd_build_gather_elements, 0},
    {"Softmax", kd_build_softmax, 0},
    {"LogSoftmax", kd_build_softmax, 1},
    {"LayerNormalization", kd_build_layernorm, 0},
    {"InstanceNormalization", kd_build_instancenorm, 0},
    {"LRN", kd_build_lrn, 0},
    {"MaxPool", kd_build_pool, 1},
    {"AveragePool", kd_build_pool, 0},
    {"ReduceSum", kd_build_reduce, KR_SUM},
    {"ReduceMean", kd_build_reduce, KR_MEAN},
    {"ReduceMax", kd_build_reduce, KR_MAX},
    {"ReduceMin", kd_build_reduce, KR_MIN},
    {"ReduceProd", kd_build_reduce, KR_PROD},
    {"ReduceL1", kd_build_reduce, KR_L1},
    {"ReduceL2", kd_build_reduce, KR_L2},
    {"ReduceSumSquare", kd_build_reduce, KR_SUM_SQUARE},
    {"ReduceLogSum", kd_build_reduce, KR_LOG_SUM},
    {"ReduceLogSumExp", kd_build_reduce, KR_LOG_SUM_EXP},
    {"GlobalAveragePool", kd_build_global_pool, KR_MEAN},
    {"GlobalMaxPool", kd_build_global_pool, KR_MAX},
    {"ArgMax", kd_build_argmax, 0},
    {"ArgMin", kd_build_argmax, 1},
    {"BatchNormalization", kd_build_batchnorm, 0},
};

static const struct kd_op *kd_find_type(const char *op_type) {
    for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++)
        if (strcmp(g_ops[i].op_type, op_type) == 0) return &g_ops[i];
    return NULL;
}

static const struct kd_op *kd_find(const struct graph_node *n) {
    if (!n || (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0)) return NULL;
    return kd_find_type(n->op_type);
}

int kc_op_known(const char *op_type) { return kd_find_type(op_type) != NULL; }

void kd_foreach_op(void (*fn)(const char *op_type, void *arg), void *arg) {
    for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++) fn(g_ops[i].op_type, arg);
}

/* ---- build ----------------------------------------------------------------- */

/* What every kernel needs: an input and an output of a rank the descriptors
 * hold, no strings, and a fused activation only on a float output. */
static int kd_check_io(struct kd_builder *b) {
    const struct op_call *c = b->c;
    if (c->nin < 1 || !c->in[0] || c->nout < 1 || !c->out[0]) return kd_no(b, "missing input or output");
    b->x = c->in[0];
    b->y = c->out[0];
    if (b->x->ndim < 0 || b->x->ndim > KC_MAX_DIMS || b->y->ndim < 0 || b->y->ndim > KC_MAX_DIMS)
        return kd_no(b, "rank out of range");
    for (int k = 0; k < c->nin; k++)
        if (c->in[k] && (c->in[k]->dtype == DT_STRING || c->in[k]->ndim > KC_MAX_DIMS))
            return kd_no(b, "string or high-rank input");
    /* float8, float4 and the 4- and 2-bit integers run on the CPU. */
    for (int k = 0; k < c->nin + c->nout; k++) {
        const struct tensor *t = k < c->nin ? c->in[k] : c->out[k - c->nin];
        if (t && t->dtype >= DT_FP8E4M3FN && t->dtype < DT_MAX_)
            return kd_no(b, "%s tensors run on the CPU only", dtype_name(t->dtype));
    }
    if (b->n->act != ACT_NONE && !kd_is_float(b->y->dtype)) return kd_no(b, "fused activation on a non-float output");
    return 0;
}

/* Builds the state through the op's table line; why (may be NULL) receives
 * the reason when the node is outside what the kernels do. Returns 0, or -1
 * (unsupported). */
static int kd_build(const struct op_call *c, struct kd_state *st, char *why, size_t why_len) {
    const struct graph_node *n = c->node;
    struct kd_builder b = {c, n, kd_find(n), NULL, NULL, st, why, why_len};
    if (!b.op) return kd_no(&b, "no CUDA kernel for %s", n ? n->op_type : "?");
    memset(st, 0, sizeof *st);
    st->code = b.op->code;
    st->act.kind = n->act;
    st->act.a = n->act_alpha;
    st->act.b = n->act_beta;
    if (kd_check_io(&b)) return -1;
    return b.op->build(&b);
}

int kd_supports(const struct op_call *c, char *why, size_t why_len) {
    struct kd_state *st = (struct kd_state *)malloc(sizeof *st);
    if (!st) return 0;
    int ok = kd_build(c, st, why, why_len) == 0;
    free(st);
    return ok;
}

int kd_prepare(struct op_call *c, void **state) {
    *state = NULL;
    struct kd_state *st = (struct kd_state *)malloc(sizeof *st);
    if (!st) return op_error(c, "out of memory preparing the CUDA kernel");
    char why[256] = "";
    if (kd_build(c, st, why, sizeof why)) {
        free(st);
        return op_error(c, "the CUDA kernels cannot run this node: %s", why);
    }
    *state = st;
    return 0;
}

void kd_release(void *state) { free(state); }

/* ---- run ----------------------------------------------------------------- */

/* The family's runner, then the activation where the kernel did not apply
 * it. Only a prepared node runs: building here would decode its attributes
 * (and allocate) on every run. */
int kd_run(struct op_call *c, void *state, cudaStream_t s) {
    if (!state) return op_error(c, "the CUDA kernels run a node only once prepared");
    const struct kd_state *st = (const struct kd_state *)state;
    int rc = st->run(c, st, s);
    if (rc || !st->act_after || st->act.kind == ACT_NONE) return rc;
    struct tensor *y = c->out[0];
    return kd_check(c, kc_bias_act(y->dtype, y->data, NULL, tensor_numel(y), 1, 1, st->act, s));
}
