/* dispatch.cpp - ONNX nodes -> custom kernel launches (see dispatch.h). */
#include "kernels/cuda/dispatch.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the op table -------------------------------------------------------- */

enum kd_kind {
    KD_UNARY,     /* code: kc_unary_op (or KU_ACT_BASE + act_kind) */
    KD_BINARY,    /* code: kc_binary_op; variadic when the op allows it */
    KD_WHERE,
    KD_COPY,      /* Identity, Dropout and the views (Reshape...) when not aliased */
    KD_EXPAND,
    KD_TILE,
    KD_TRANSPOSE,
    KD_SLICE,
    KD_PAD,
    KD_CONCAT,
    KD_SPLIT,
    KD_GATHER,
    KD_GATHER_ELEMENTS,
    KD_CAST,
    KD_SOFTMAX,   /* code: 1 for LogSoftmax */
    KD_LAYERNORM,
    KD_INSTANCENORM,
    KD_POOL,      /* code: 1 MaxPool, 0 AveragePool */
    KD_LRN,
    KD_REDUCE,    /* code: kc_reduce_op */
    KD_GLOBALPOOL, /* code: KR_MEAN / KR_MAX */
    KD_ARGMAX,    /* code: 1 for ArgMin */
    KD_BATCHNORM,
};

struct kd_op {
    const char *op_type;
    enum kd_kind kind;
    int code;
};

static const struct kd_op g_ops[] = {
    {"Relu", KD_UNARY, KU_ACT_BASE + ACT_RELU},
    {"LeakyRelu", KD_UNARY, KU_ACT_BASE + ACT_LEAKY_RELU},
    {"Sigmoid", KD_UNARY, KU_ACT_BASE + ACT_SIGMOID},
    {"Tanh", KD_UNARY, KU_ACT_BASE + ACT_TANH},
    {"Gelu", KD_UNARY, KU_ACT_BASE + ACT_GELU},
    {"HardSigmoid", KD_UNARY, KU_ACT_BASE + ACT_HARD_SIGMOID},
    {"HardSwish", KD_UNARY, KU_ACT_BASE + ACT_HARD_SWISH},
    {"Clip", KD_UNARY, KU_ACT_BASE + ACT_CLIP},
    {"Neg", KD_UNARY, KU_NEG},
    {"Abs", KD_UNARY, KU_ABS},
    {"Exp", KD_UNARY, KU_EXP},
    {"Log", KD_UNARY, KU_LOG},
    {"Sqrt", KD_UNARY, KU_SQRT},
    {"Reciprocal", KD_UNARY, KU_RECIPROCAL},
    {"Floor", KD_UNARY, KU_FLOOR},
    {"Ceil", KD_UNARY, KU_CEIL},
    {"Round", KD_UNARY, KU_ROUND},
    {"Erf", KD_UNARY, KU_ERF},
    {"Sin", KD_UNARY, KU_SIN},
    {"Cos", KD_UNARY, KU_COS},
    {"Tan", KD_UNARY, KU_TAN},
    {"Asin", KD_UNARY, KU_ASIN},
    {"Acos", KD_UNARY, KU_ACOS},
    {"Atan", KD_UNARY, KU_ATAN},
    {"Sinh", KD_UNARY, KU_SINH},
    {"Cosh", KD_UNARY, KU_COSH},
    {"Asinh", KD_UNARY, KU_ASINH},
    {"Acosh", KD_UNARY, KU_ACOSH},
    {"Atanh", KD_UNARY, KU_ATANH},
    {"Sign", KD_UNARY, KU_SIGN},
    {"Softplus", KD_UNARY, KU_SOFTPLUS},
    {"Softsign", KD_UNARY, KU_SOFTSIGN},
    {"Elu", KD_UNARY, KU_ELU},
    {"Selu", KD_UNARY, KU_SELU},
    {"Celu", KD_UNARY, KU_CELU},
    {"Mish", KD_UNARY, KU_MISH},
    {"ThresholdedRelu", KD_UNARY, KU_THRESHOLDED_RELU},
    {"Not", KD_UNARY, KU_NOT},
    {"IsNaN", KD_UNARY, KU_ISNAN},
    {"IsInf", KD_UNARY, KU_ISINF},
    {"Add", KD_BINARY, KB_ADD},
    {"Sub", KD_BINARY, KB_SUB},
    {"Mul", KD_BINARY, KB_MUL},
    {"Div", KD_BINARY, KB_DIV},
    {"Pow", KD_BINARY, KB_POW},
    {"Max", KD_BINARY, KB_MAX},
    {"Min", KD_BINARY, KB_MIN},
    {"Sum", KD_BINARY, KB_ADD},
    {"Mean", KD_BINARY, KB_ADD},
    {"Mod", KD_BINARY, KB_MOD},
    {"PRelu", KD_BINARY, KB_PRELU},
    {"Equal", KD_BINARY, KB_EQUAL},
    {"Less", KD_BINARY, KB_LESS},
    {"Greater", KD_BINARY, KB_GREATER},
    {"LessOrEqual", KD_BINARY, KB_LESS_EQUAL},
    {"GreaterOrEqual", KD_BINARY, KB_GREATER_EQUAL},
    {"And", KD_BINARY, KB_AND},
    {"Or", KD_BINARY, KB_OR},
    {"Xor", KD_BINARY, KB_XOR},
    {"BitShift", KD_BINARY, KB_BITSHIFT_LEFT},
    {"Where", KD_WHERE, 0},
    {"Identity", KD_COPY, 0},
    {"Dropout", KD_COPY, 0},
    {"Reshape", KD_COPY, 0},
    {"Flatten", KD_COPY, 0},
    {"Squeeze", KD_COPY, 0},
    {"Unsqueeze", KD_COPY, 0},
    {"Expand", KD_EXPAND, 0},
    {"Tile", KD_TILE, 0},
    {"Transpose", KD_TRANSPOSE, 0},
    {"Slice", KD_SLICE, 0},
    {"Pad", KD_PAD, 0},
    {"Concat", KD_CONCAT, 0},
    {"Split", KD_SPLIT, 0},
    {"Gather", KD_GATHER, 0},
    {"Cast", KD_CAST, 0},
    {"CastLike", KD_CAST, 0},
    {"GatherElements", KD_GATHER_ELEMENTS, 0},
    {"Softmax", KD_SOFTMAX, 0},
    {"LogSoftmax", KD_SOFTMAX, 1},
    {"LayerNormalization", KD_LAYERNORM, 0},
    {"InstanceNormalization", KD_INSTANCENORM, 0},
    {"LRN", KD_LRN, 0},
    {"MaxPool", KD_POOL, 1},
    {"AveragePool", KD_POOL, 0},
    {"ReduceSum", KD_REDUCE, KR_SUM},
    {"ReduceMean", KD_REDUCE, KR_MEAN},
    {"ReduceMax", KD_REDUCE, KR_MAX},
    {"ReduceMin", KD_REDUCE, KR_MIN},
    {"ReduceProd", KD_REDUCE, KR_PROD},
    {"ReduceL1", KD_REDUCE, KR_L1},
    {"ReduceL2", KD_REDUCE, KR_L2},
    {"ReduceSumSquare", KD_REDUCE, KR_SUM_SQUARE},
    {"ReduceLogSum", KD_REDUCE, KR_LOG_SUM},
    {"ReduceLogSumExp", KD_REDUCE, KR_LOG_SUM_EXP},
    {"GlobalAveragePool", KD_GLOBALPOOL, KR_MEAN},
    {"GlobalMaxPool", KD_GLOBALPOOL, KR_MAX},
    {"ArgMax", KD_ARGMAX, 0},
    {"ArgMin", KD_ARGMAX, 1},
    {"BatchNormalization", KD_BATCHNORM, 0},
};

static const struct kd_op *kd_find(const struct graph_node *n) {
    if (!n || (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0)) return NULL;
    for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++)
        if (strcmp(g_ops[i].op_type, n->op_type) == 0) return &g_ops[i];
    return NULL;
}

int kc_op_known(const char *op_type) {
    for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++)
        if (strcmp(g_ops[i].op_type, op_type) == 0) return 1;
    return 0;
}

void kd_foreach_op(void (*fn)(const char *op_type, void *arg), void *arg) {
    for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++) fn(g_ops[i].op_type, arg);
}

/* ---- the prepared state --------------------------------------------------- */

struct kd_state {
    const struct kd_op *op;
    enum dtype dt;
    int code;
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
    int flag;              /* LogSoftmax, ArgMin, select_last_index, noop reduce */
    float eps;
    float alpha, beta, bias; /* LRN */
    int size;
};

static int64_t kd_prod(const struct tensor *t, int from, int to) {
    int64_t p = 1;
    for (int d = from; d < to; d++) p *= t->dims[d];
    return p;
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
#ifndef KILN_CUDA_EMU
    cudaPointerAttributes pa;
    if (cudaPointerGetAttributes(&pa, t->data) == cudaSuccess && pa.type == cudaMemoryTypeDevice) {
        if (cudaMemcpy(buf, t->data, (size_t)n * es, cudaMemcpyDeviceToHost) != cudaSuccess) return -1;
    } else {
        (void)cudaGetLastError();
        memcpy(buf, t->data, (size_t)n * es);
    }
#else
    memcpy(buf, t->data, (size_t)n * es);
#endif
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
#ifndef KILN_CUDA_EMU
    cudaPointerAttributes pa;
    if (cudaPointerGetAttributes(&pa, t->data) == cudaSuccess && pa.type == cudaMemoryTypeDevice) {
        if (cudaMemcpy(buf, t->data, es, cudaMemcpyDeviceToHost) != cudaSuccess) return -1;
    } else {
        (void)cudaGetLastError();
        memcpy(buf, t->data, es);
    }
#else
    memcpy(buf, t->data, es);
#endif
    struct tensor h = *t;
    h.data = buf;
    *v = op_double_at(&h, 0);
    return 0;
}

static int kd_is_float(enum dtype dt) { return dt == DT_FP32 || dt == DT_FP16; }

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

/* Builds the state; why (may be NULL) receives the reason when the node is
 * outside what the kernels do. Returns 0, or -1 (unsupported). */
static int kd_build(const struct op_call *c, struct kd_state *st, char *why, size_t why_len) {
#define KD_NO(...) do { if (why && why_len) snprintf(why, why_len, __VA_ARGS__); return -1; } while (0)
    const struct graph_node *n = c->node;
    const struct kd_op *op = kd_find(n);
    if (!op) KD_NO("no CUDA kernel for %s", n ? n->op_type : "?");
    memset(st, 0, sizeof *st);
    st->op = op;
    st->code = op->code;
    st->act.kind = n->act;
    st->act.a = n->act_alpha;
    st->act.b = n->act_beta;
    if (c->nin < 1 || !c->in[0] || c->nout < 1 || !c->out[0]) KD_NO("missing input or output");
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    st->dt = x->dtype;
    if (x->ndim < 0 || x->ndim > KC_MAX_DIMS || y->ndim < 0 || y->ndim > KC_MAX_DIMS) KD_NO("rank out of range");
    for (int k = 0; k < c->nin; k++)
        if (c->in[k] && (c->in[k]->dtype == DT_STRING || c->in[k]->ndim > KC_MAX_DIMS)) KD_NO("string or high-rank input");
    if (n->act != ACT_NONE && !kd_is_float(y->dtype)) KD_NO("fused activation on a non-float output");
    switch (op->kind) {
    case KD_UNARY: {
        int code = op->code;
        if (strcmp(n->op_type, "Gelu") == 0 && strcmp(node_attr_str(n, "approximate", "none"), "none") != 0)
            KD_NO("Gelu with approximate=tanh");
        if (code == KU_NOT) {
            if (x->dtype != DT_BOOL) KD_NO("Not on %s", dtype_name(x->dtype));
        } else if (code == KU_NEG || code == KU_ABS || code == KU_SIGN) {
            if (!kd_is_float(x->dtype) && x->dtype != DT_INT32 && x->dtype != DT_INT64) KD_NO("%s on %s", n->op_type, dtype_name(x->dtype));
        } else if (!kd_is_float(x->dtype)) {
            KD_NO("%s on %s", n->op_type, dtype_name(x->dtype));
        }
        if (code == KU_ISINF && (node_attr_int(n, "detect_positive", 1) != 1 || node_attr_int(n, "detect_negative", 1) != 1))
            KD_NO("IsInf detecting one sign only");
        st->a = 0;
        st->b = 0;
        switch (code) {
        case KU_ACT_BASE + ACT_LEAKY_RELU: st->a = node_attr_float(n, "alpha", 0.01f); break;
        case KU_ACT_BASE + ACT_HARD_SIGMOID:
            st->a = node_attr_float(n, "alpha", 0.2f);
            st->b = node_attr_float(n, "beta", 0.5f);
            break;
        case KU_ACT_BASE + ACT_CLIP: {
            st->a = -FLT_MAX;
            st->b = FLT_MAX;
            if (n->opset > 0 && n->opset < 11) {
                st->a = node_attr_float(n, "min", -FLT_MAX);
                st->b = node_attr_float(n, "max", FLT_MAX);
            } else {
                double v;
                if (c->nin > 1 && c->in[1]) {
                    if (kd_read_double(c->in[1], &v)) KD_NO("Clip min is not a constant");
                    st->a = (float)v;
                }
                if (c->nin > 2 && c->in[2]) {
                    if (kd_read_double(c->in[2], &v)) KD_NO("Clip max is not a constant");
                    st->b = (float)v;
                }
            }
            break;
        }
        case KU_ELU: st->a = node_attr_float(n, "alpha", 1.0f); break;
        case KU_CELU: st->a = node_attr_float(n, "alpha", 1.0f); break;
        case KU_THRESHOLDED_RELU: st->a = node_attr_float(n, "alpha", 1.0f); break;
        case KU_SELU:
            st->a = node_attr_float(n, "alpha", 1.67326319217681884765625f);
            st->b = node_attr_float(n, "gamma", 1.05070102214813232421875f);
            break;
        }
        if (!kd_is_float(x->dtype) && n->act != ACT_NONE) KD_NO("fused activation on integers");
        break;
    }
    case KD_BINARY: {
        int variadic = !strcmp(n->op_type, "Sum") || !strcmp(n->op_type, "Mean") || !strcmp(n->op_type, "Max") ||
                       !strcmp(n->op_type, "Min");
        if (!variadic && c->nin != 2) KD_NO("%s with %d inputs", n->op_type, c->nin);
        if (c->nin < 1 || c->nin > OP_MAX_IO) KD_NO("input count");
        for (int k = 0; k < c->nin; k++) {
            if (!c->in[k]) KD_NO("absent input");
            if (c->in[k]->dtype != x->dtype) KD_NO("mixed input dtypes (%s, %s)", dtype_name(x->dtype), dtype_name(c->in[k]->dtype));
            int ndim[1] = {c->in[k]->ndim};
            const int64_t *dims[1] = {c->in[k]->dims};
            struct kc_bcast tmp;
            if (kc_bcast_init(&tmp, y->ndim, y->dims, 1, ndim, dims)) KD_NO("input %d does not broadcast to the output", k);
        }
        int cmp = op->code >= KB_EQUAL && op->code <= KB_XOR;
        if (op->code == KB_AND || op->code == KB_OR || op->code == KB_XOR) {
            if (x->dtype != DT_BOOL) KD_NO("%s on %s", n->op_type, dtype_name(x->dtype));
        } else if (cmp) {
            if (!kd_is_float(x->dtype) && x->dtype != DT_INT32 && x->dtype != DT_INT64 && x->dtype != DT_BOOL &&
                x->dtype != DT_UINT8 && x->dtype != DT_INT8 && x->dtype != DT_FP64)
                KD_NO("%s on %s", n->op_type, dtype_name(x->dtype));
        } else if (op->code == KB_BITSHIFT_LEFT) {
            if (x->dtype != DT_UINT8 && x->dtype != DT_INT32 && x->dtype != DT_INT64) KD_NO("BitShift on %s", dtype_name(x->dtype));
            if (!strcmp(node_attr_str(n, "direction", "LEFT"), "RIGHT")) st->code = KB_BITSHIFT_RIGHT;
        } else {
            if (!kd_is_float(x->dtype) && x->dtype != DT_INT32 && x->dtype != DT_INT64) KD_NO("%s on %s", n->op_type, dtype_name(x->dtype));
            if (!strcmp(n->op_type, "Mod") && node_attr_int(n, "fmod", 0)) st->code = KB_FMOD;
            if (!strcmp(n->op_type, "Mod") && kd_is_float(x->dtype) && !node_attr_int(n, "fmod", 0))
                KD_NO("Mod with fmod=0 on floats");
        }
        if (!kd_is_float(y->dtype) && n->act != ACT_NONE) KD_NO("fused activation on a non-float output");
        /* Multi-input ops apply the activation once, after the last step. */
        st->act_after = c->nin > 2 || !strcmp(n->op_type, "Mean");
        break;
    }
    case KD_WHERE: {
        if (c->nin != 3 || !c->in[1] || !c->in[2]) KD_NO("Where needs 3 inputs");
        if (x->dtype != DT_BOOL || c->in[1]->dtype != c->in[2]->dtype) KD_NO("Where dtypes");
        size_t es = dtype_size(c->in[1]->dtype);
        if (es != 1 && es != 2 && es != 4 && es != 8) KD_NO("Where element size");
        int ndim[3] = {c->in[0]->ndim, c->in[1]->ndim, c->in[2]->ndim};
        const int64_t *dims[3] = {c->in[0]->dims, c->in[1]->dims, c->in[2]->dims};
        if (kc_bcast_init(&st->bc, y->ndim, y->dims, 3, ndim, dims)) KD_NO("Where inputs do not broadcast");
        st->act_after = 1;
        break;
    }
    case KD_COPY:
        if (tensor_nbytes(x) != tensor_nbytes(y)) KD_NO("%s changes the byte size", n->op_type);
        if (c->nout > 1 && c->out[1] && strcmp(n->op_type, "Dropout") == 0) KD_NO("Dropout with a mask output");
        st->act_after = 1;
        break;
    case KD_EXPAND:
    case KD_TILE:
    case KD_TRANSPOSE:
    case KD_SLICE:
    case KD_PAD: {
        size_t es = dtype_size(x->dtype);
        if (es != 1 && es != 2 && es != 4 && es != 8) KD_NO("element size %zu", es);
        if (y->ndim != x->ndim && op->kind != KD_EXPAND) KD_NO("output rank differs from the input's");
        if (y->ndim < x->ndim) KD_NO("output rank below the input's");
        struct kc_remap_desc *m = &st->rm;
        int64_t xst[KC_MAX_DIMS];
        kd_contig_strides(x, xst);
        m->ndim = y->ndim;
        m->n = tensor_numel(y);
        for (int d = 0; d < y->ndim; d++) {
            m->out_dims[d] = y->dims[d];
            m->mode[d] = KM_LINEAR;
            m->step[d] = 1;
        }
        if (op->kind == KD_EXPAND) {
            int off = y->ndim - x->ndim;
            for (int d = 0; d < y->ndim; d++) {
                int id = d - off;
                int64_t dim = id >= 0 ? x->dims[id] : 1;
                if (dim != 1 && dim != y->dims[d]) KD_NO("Expand shapes");
                m->in_dims[d] = dim;
                m->in_stride[d] = id >= 0 ? xst[id] : 0;
                m->step[d] = dim == 1 ? 0 : 1;
            }
        } else if (op->kind == KD_TILE) {
            for (int d = 0; d < y->ndim; d++) {
                if (x->dims[d] == 0 || y->dims[d] % x->dims[d]) KD_NO("Tile shapes");
                m->in_dims[d] = x->dims[d];
                m->in_stride[d] = xst[d];
                m->mode[d] = KM_MOD;
            }
        } else if (op->kind == KD_TRANSPOSE) {
            const int64_t *perm = NULL;
            int np = node_attr_ints(n, "perm", &perm);
            for (int d = 0; d < y->ndim; d++) {
                int64_t p = np >= 0 ? (d < np ? perm[d] : -1) : y->ndim - 1 - d;
                if (p < 0 || p >= x->ndim || x->dims[p] != y->dims[d]) KD_NO("Transpose perm");
                m->in_dims[d] = x->dims[p];
                m->in_stride[d] = xst[p];
            }
        } else if (op->kind == KD_SLICE) {
            int64_t starts[KC_MAX_DIMS], ends[KC_MAX_DIMS], axes[KC_MAX_DIMS], steps[KC_MAX_DIMS];
            int ns, ne, na, nst;
            if (n->opset > 0 && n->opset < 10) {
                const int64_t *p;
                ns = node_attr_ints(n, "starts", &p);
                if (ns < 0 || ns > KC_MAX_DIMS) KD_NO("Slice starts");
                memcpy(starts, p, (size_t)ns * 8);
                ne = node_attr_ints(n, "ends", &p);
                if (ne != ns) KD_NO("Slice ends");
                memcpy(ends, p, (size_t)ne * 8);
                na = node_attr_ints(n, "axes", &p);
                if (na > KC_MAX_DIMS) KD_NO("Slice axes");
                if (na > 0) memcpy(axes, p, (size_t)na * 8);
                nst = -1;
            } else {
                ns = kd_read_ints(c->nin > 1 ? c->in[1] : NULL, starts, KC_MAX_DIMS);
                ne = kd_read_ints(c->nin > 2 ? c->in[2] : NULL, ends, KC_MAX_DIMS);
                if (ns < 0 || ne != ns) KD_NO("Slice starts/ends are not constants");
                na = c->nin > 3 && c->in[3] ? kd_read_ints(c->in[3], axes, KC_MAX_DIMS) : -1;
                nst = c->nin > 4 && c->in[4] ? kd_read_ints(c->in[4], steps, KC_MAX_DIMS) : -1;
                if ((c->nin > 3 && c->in[3] && na != ns) || (c->nin > 4 && c->in[4] && nst != ns))
                    KD_NO("Slice axes/steps are not constants");
            }
            for (int d = 0; d < x->ndim; d++) {
                m->in_dims[d] = x->dims[d];
                m->in_stride[d] = xst[d];
                m->start[d] = 0;
            }
            for (int i = 0; i < ns; i++) {
                int64_t ax = na > 0 ? axes[i] : i;
                if (ax < 0) ax += x->ndim;
                if (ax < 0 || ax >= x->ndim) KD_NO("Slice axis");
                int64_t dim = x->dims[ax], s = starts[i], step = nst > 0 ? steps[i] : 1;
                if (step == 0) KD_NO("Slice step 0");
                if (s < 0) s += dim;
                if (step > 0) s = s < 0 ? 0 : (s > dim ? dim : s);
                else s = s < 0 ? 0 : (s > dim - 1 ? dim - 1 : s);
                m->start[ax] = s;
                m->step[ax] = step;
            }
        } else { /* Pad */
            int64_t pads[2 * KC_MAX_DIMS], axes[KC_MAX_DIMS];
            int np, na = -1;
            double value = 0;
            if (n->opset > 0 && n->opset < 11) {
                const int64_t *p;
                np = node_attr_ints(n, "pads", &p);
                if (np != 2 * x->ndim) KD_NO("Pad pads");
                memcpy(pads, p, (size_t)np * 8);
                value = node_attr_float(n, "value", 0.0f);
            } else {
                np = kd_read_ints(c->nin > 1 ? c->in[1] : NULL, pads, 2 * KC_MAX_DIMS);
                if (np < 0) KD_NO("Pad pads are not a constant");
                if (c->nin > 2 && c->in[2] && kd_read_double(c->in[2], &value)) KD_NO("Pad value is not a constant");
                if (c->nin > 3 && c->in[3]) {
                    na = kd_read_ints(c->in[3], axes, KC_MAX_DIMS);
                    if (na < 0) KD_NO("Pad axes are not a constant");
                }
            }
            int64_t begin[KC_MAX_DIMS] = {0}, end[KC_MAX_DIMS] = {0};
            if (na >= 0) {
                if (np != 2 * na) KD_NO("Pad pads/axes");
                for (int i = 0; i < na; i++) {
                    int64_t ax = axes[i] < 0 ? axes[i] + x->ndim : axes[i];
                    if (ax < 0 || ax >= x->ndim) KD_NO("Pad axis");
                    begin[ax] = pads[i];
                    end[ax] = pads[i + na];
                }
            } else {
                if (np != 2 * x->ndim) KD_NO("Pad pads length");
                for (int d = 0; d < x->ndim; d++) {
                    begin[d] = pads[d];
                    end[d] = pads[d + x->ndim];
                }
            }
            const char *mode = node_attr_str(n, "mode", "constant");
            int md = !strcmp(mode, "constant") ? KM_PAD_CONSTANT
                     : !strcmp(mode, "edge")   ? KM_PAD_EDGE
                     : !strcmp(mode, "reflect") ? KM_PAD_REFLECT
                     : !strcmp(mode, "wrap")   ? KM_PAD_WRAP
                                               : -1;
            if (md < 0) KD_NO("Pad mode '%s'", mode);
            for (int d = 0; d < x->ndim; d++) {
                if (y->dims[d] != x->dims[d] + begin[d] + end[d]) KD_NO("Pad output shape");
                if (md != KM_PAD_CONSTANT && x->dims[d] == 0 && y->dims[d] > 0) KD_NO("Pad of an empty dim");
                m->in_dims[d] = x->dims[d];
                m->in_stride[d] = xst[d];
                m->start[d] = begin[d];
                m->mode[d] = md;
            }
            m->pad_bits = kd_bits_of(x->dtype, value);
        }
        st->act_after = 1;
        break;
    }
    case KD_CONCAT: {
        int axis = op_axis((struct op_call *)c, node_attr_int(n, "axis", 0), y->ndim);
        if (axis < 0) KD_NO("Concat axis");
        for (int k = 0; k < c->nin; k++) {
            if (!c->in[k] || c->in[k]->dtype != y->dtype || c->in[k]->ndim != y->ndim) KD_NO("Concat inputs");
            size_t es = dtype_size(y->dtype);
            if (es != 1 && es != 2 && es != 4 && es != 8) KD_NO("element size");
        }
        st->axis = axis;
        st->act_after = 1;
        break;
    }
    case KD_SPLIT: {
        int axis = op_axis((struct op_call *)c, node_attr_int(n, "axis", 0), x->ndim);
        if (axis < 0) KD_NO("Split axis");
        int64_t total = 0;
        for (int k = 0; k < c->nout; k++) {
            if (!c->out[k] || c->out[k]->ndim != x->ndim) KD_NO("Split outputs");
            total += c->out[k]->dims[axis];
        }
        if (total != x->dims[axis]) KD_NO("Split sizes");
        size_t es = dtype_size(x->dtype);
        if (es != 1 && es != 2 && es != 4 && es != 8) KD_NO("element size");
        if (n->act != ACT_NONE) KD_NO("fused activation on Split");
        st->axis = axis;
        break;
    }
    case KD_GATHER: {
        if (c->nin != 2 || !c->in[1]) KD_NO("Gather inputs");
        if (c->in[1]->dtype != DT_INT64 && c->in[1]->dtype != DT_INT32) KD_NO("Gather indices of %s", dtype_name(c->in[1]->dtype));
        int axis = op_axis((struct op_call *)c, node_attr_int(n, "axis", 0), x->ndim);
        if (axis < 0) KD_NO("Gather axis");
        size_t es = dtype_size(x->dtype);
        if (es != 1 && es != 2 && es != 4 && es != 8) KD_NO("element size");
        st->outer = kd_prod(x, 0, axis);
        st->mid = x->dims[axis];
        st->inner = kd_prod(x, axis + 1, x->ndim);
        st->axis = axis;
        st->act_after = 1;
        break;
    }
    case KD_GATHER_ELEMENTS: {
        const struct tensor *ix = c->nin == 2 ? c->in[1] : NULL;
        if (!ix || (ix->dtype != DT_INT64 && ix->dtype != DT_INT32)) KD_NO("GatherElements indices");
        if (ix->ndim != x->ndim || y->ndim != ix->ndim) KD_NO("GatherElements ranks");
        for (int d = 0; d < y->ndim; d++)
            if (y->dims[d] != ix->dims[d]) KD_NO("GatherElements output shape");
        int axis = op_axis((struct op_call *)c, node_attr_int(n, "axis", 0), x->ndim);
        if (axis < 0) KD_NO("GatherElements axis");
        size_t es = dtype_size(x->dtype);
        if (es != 1 && es != 2 && es != 4 && es != 8) KD_NO("element size");
        int64_t xst[KC_MAX_DIMS];
        kd_contig_strides(x, xst);
        struct kc_gather_el_desc *g = &st->ge;
        g->ndim = x->ndim;
        g->axis = axis;
        g->n = tensor_numel(y);
        g->axis_dim = x->dims[axis];
        for (int d = 0; d < x->ndim; d++) {
            g->dims[d] = y->dims[d];
            g->xstride[d] = xst[d];
        }
        st->act_after = 1;
        break;
    }
    case KD_CAST:
        if (!kc_cast_supported(x->dtype, y->dtype)) KD_NO("Cast from %s to %s", dtype_name(x->dtype), dtype_name(y->dtype));
        st->act_after = 1;
        break;
    case KD_SOFTMAX: {
        if (!kd_is_float(x->dtype)) KD_NO("%s on %s", n->op_type, dtype_name(x->dtype));
        int old = n->opset > 0 && n->opset < 13;
        int axis = op_axis((struct op_call *)c, node_attr_int(n, "axis", old ? 1 : -1), x->ndim);
        if (axis < 0) KD_NO("axis");
        st->outer = kd_prod(x, 0, axis);
        if (old) {
            st->mid = kd_prod(x, axis, x->ndim);
            st->inner = 1;
        } else {
            st->mid = x->dims[axis];
            st->inner = kd_prod(x, axis + 1, x->ndim);
        }
        st->act_after = 1;
        break;
    }
    case KD_LAYERNORM: {
        if (!kd_is_float(x->dtype)) KD_NO("LayerNormalization on %s", dtype_name(x->dtype));
        int axis = op_axis((struct op_call *)c, node_attr_int(n, "axis", -1), x->ndim);
        if (axis < 0) KD_NO("axis");
        st->outer = kd_prod(x, 0, axis);
        st->inner = kd_prod(x, axis, x->ndim);
        for (int k = 1; k < c->nin && k < 3; k++)
            if (c->in[k] && (c->in[k]->dtype != x->dtype || tensor_numel(c->in[k]) != st->inner))
                KD_NO("LayerNormalization scale/bias that broadcast partially");
        for (int k = 1; k < c->nout; k++)
            if (c->out[k] && c->out[k]->dtype != DT_FP32) KD_NO("Mean/InvStdDev outputs not float");
        st->eps = node_attr_float(n, "epsilon", 1e-5f);
        st->act_after = 1;
        break;
    }
    case KD_INSTANCENORM: {
        if (!kd_is_float(x->dtype) || x->ndim < 3) KD_NO("InstanceNormalization on %s of rank %d", dtype_name(x->dtype), x->ndim);
        if (c->nin != 3 || !c->in[1] || !c->in[2]) KD_NO("InstanceNormalization inputs");
        for (int k = 1; k < 3; k++)
            if (c->in[k]->dtype != x->dtype || tensor_numel(c->in[k]) != x->dims[1]) KD_NO("scale/B not one per channel");
        st->outer = x->dims[0] * x->dims[1];
        st->inner = kd_prod(x, 2, x->ndim);
        st->mid = x->dims[1];
        st->eps = node_attr_float(n, "epsilon", 1e-5f);
        st->act_after = 1;
        break;
    }
    case KD_POOL: {
        if (!kd_is_float(x->dtype) || y->dtype != x->dtype) KD_NO("%s on %s", n->op_type, dtype_name(x->dtype));
        int nsp = x->ndim - 2;
        if (nsp < 1 || nsp > 3 || y->ndim != x->ndim) KD_NO("%d spatial dims", nsp);
        if (c->nout > 1 && c->out[1]) KD_NO("MaxPool Indices output");
        const int64_t *ks = NULL, *st_ = NULL, *dl = NULL, *pads = NULL;
        if (node_attr_ints(n, "kernel_shape", &ks) != nsp) KD_NO("kernel_shape");
        int nst = node_attr_ints(n, "strides", &st_), ndl = node_attr_ints(n, "dilations", &dl);
        int np = node_attr_ints(n, "pads", &pads);
        const char *auto_pad = node_attr_str(n, "auto_pad", "NOTSET");
        struct kc_pool_desc *p = &st->pool;
        p->nsp = 3; /* unused leading... trailing dims stay 1 */
        p->is_max = op->code;
        p->include_pad = (int)node_attr_int(n, "count_include_pad", 0);
        p->n = tensor_numel(y);
        for (int d = 0; d < 3; d++) {
            p->in[d] = p->out[d] = 1;
            p->k[d] = p->s[d] = p->dil[d] = 1;
            p->pb[d] = p->pe[d] = 0;
        }
        for (int d = 0; d < nsp; d++) {
            p->in[d] = x->dims[2 + d];
            p->out[d] = y->dims[2 + d];
            p->k[d] = (int)ks[d];
            p->s[d] = nst == nsp ? (int)st_[d] : 1;
            p->dil[d] = ndl == nsp ? (int)dl[d] : 1;
            if (p->k[d] < 1 || p->s[d] < 1 || p->dil[d] < 1) KD_NO("kernel, strides or dilations");
            if (!strcmp(auto_pad, "SAME_UPPER") || !strcmp(auto_pad, "SAME_LOWER")) {
                int64_t total = (p->out[d] - 1) * p->s[d] + (int64_t)(p->k[d] - 1) * p->dil[d] + 1 - p->in[d];
                if (total < 0) total = 0;
                p->pb[d] = (int)(!strcmp(auto_pad, "SAME_UPPER") ? total / 2 : total - total / 2);
                p->pe[d] = (int)(total - p->pb[d]);
            } else if (!strcmp(auto_pad, "NOTSET") && np == 2 * nsp) {
                p->pb[d] = (int)pads[d];
                p->pe[d] = (int)pads[d + nsp];
            } else if (strcmp(auto_pad, "VALID") && strcmp(auto_pad, "NOTSET")) {
                KD_NO("auto_pad %s", auto_pad);
            }
        }
        p->nsp = nsp;
        /* Trailing unused dims must be 1 for the kernel's flat indexing. */
        st->act_after = 1;
        break;
    }
    case KD_LRN: {
        if (!kd_is_float(x->dtype) || x->ndim < 2) KD_NO("LRN on %s of rank %d", dtype_name(x->dtype), x->ndim);
        int64_t size = node_attr_int(n, "size", 0);
        if (size < 1) KD_NO("LRN size");
        st->size = (int)size;
        st->alpha = node_attr_float(n, "alpha", 1e-4f);
        st->beta = node_attr_float(n, "beta", 0.75f);
        st->bias = node_attr_float(n, "bias", 1.0f);
        st->outer = x->dims[0];
        st->mid = x->dims[1];
        st->inner = kd_prod(x, 2, x->ndim);
        st->act_after = 1;
        break;
    }
    case KD_REDUCE:
    case KD_GLOBALPOOL: {
        if (!kd_is_float(x->dtype)) KD_NO("%s on %s", n->op_type, dtype_name(x->dtype));
        int red[KC_MAX_DIMS] = {0};
        if (op->kind == KD_GLOBALPOOL) {
            if (x->ndim < 3) KD_NO("global pooling of rank %d", x->ndim);
            for (int d = 2; d < x->ndim; d++) red[d] = 1;
        } else {
            int64_t axes[KC_MAX_DIMS];
            int na;
            int from_input = (!strcmp(n->op_type, "ReduceSum") && n->opset >= 13) || n->opset >= 18;
            if (from_input) {
                na = c->nin > 1 && c->in[1] ? kd_read_ints(c->in[1], axes, KC_MAX_DIMS) : 0;
                if (na < 0) KD_NO("axes are not a constant");
            } else {
                const int64_t *p;
                na = node_attr_ints(n, "axes", &p);
                if (na > KC_MAX_DIMS) KD_NO("axes");
                if (na > 0) memcpy(axes, p, (size_t)na * 8);
                if (na < 0) na = 0;
            }
            if (na == 0) {
                if (from_input && node_attr_int(n, "noop_with_empty_axes", 0)) st->flag = 1; /* identity */
                for (int d = 0; d < x->ndim; d++) red[d] = 1;
            }
            for (int i = 0; i < na; i++) {
                int64_t a = axes[i] < 0 ? axes[i] + x->ndim : axes[i];
                if (a < 0 || a >= x->ndim) KD_NO("axis out of range");
                red[a] = 1;
            }
        }
        if (st->flag) {
            if (tensor_nbytes(x) != tensor_nbytes(y)) KD_NO("noop reduction shape");
            st->act_after = 1;
            break;
        }
        int64_t xst[KC_MAX_DIMS];
        kd_contig_strides(x, xst);
        struct kc_reduce_desc *r = &st->rd;
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
        if (r->out_n != tensor_numel(y)) KD_NO("reduction output size");
        if (r->r_n == 0) KD_NO("reduction over an empty dim");
        st->act_after = 1;
        break;
    }
    case KD_ARGMAX: {
        if (!kd_is_float(x->dtype) && x->dtype != DT_INT32 && x->dtype != DT_INT64) KD_NO("%s on %s", n->op_type, dtype_name(x->dtype));
        if (y->dtype != DT_INT64) KD_NO("output not int64");
        int axis = op_axis((struct op_call *)c, node_attr_int(n, "axis", 0), x->ndim);
        if (axis < 0) KD_NO("axis");
        if (x->dims[axis] == 0) KD_NO("ArgMax over an empty dim");
        st->outer = kd_prod(x, 0, axis);
        st->mid = x->dims[axis];
        st->inner = kd_prod(x, axis + 1, x->ndim);
        st->flag = (int)node_attr_int(n, "select_last_index", 0);
        break;
    }
    case KD_BATCHNORM: {
        if (!kd_is_float(x->dtype)) KD_NO("BatchNormalization on %s", dtype_name(x->dtype));
        if (c->nin != 5 || c->nout != 1 || x->ndim < 2) KD_NO("BatchNormalization in training form");
        if (node_attr_int(n, "training_mode", 0)) KD_NO("training_mode");
        for (int k = 1; k < 5; k++)
            if (!c->in[k] || (c->in[k]->dtype != DT_FP32 && c->in[k]->dtype != x->dtype) ||
                c->in[k]->dtype != c->in[1]->dtype || tensor_numel(c->in[k]) != x->dims[1])
                KD_NO("BatchNormalization parameters not one per channel in FP32 or the input's dtype");
        st->outer = x->dims[0];
        st->mid = x->dims[1];
        st->inner = kd_prod(x, 2, x->ndim);
        st->eps = node_attr_float(n, "epsilon", 1e-5f);
        break;
    }
    }
    if (st->act_after && n->act != ACT_NONE && !kd_is_float(y->dtype)) KD_NO("fused activation on a non-float output");
    return 0;
#undef KD_NO
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

static int kd_check(struct op_call *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    op_error(c, "CUDA %s failed: %s", what, cudaGetErrorString(e));
    return STATUS_INTERNAL;
}

static int kd_run_state(struct op_call *c, const struct kd_state *st, cudaStream_t s) {
    const struct graph_node *n = c->node;
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    int64_t ny = tensor_numel(y);
    cudaError_t e = cudaSuccess;
    struct kc_act none = {0, 0, 0};
    struct kc_act act = st->act_after ? none : st->act;
    switch (st->op->kind) {
    case KD_UNARY:
        e = kc_unary(st->code, x->dtype, x->data, y->data, ny, st->a, st->b, act, s);
        break;
    case KD_BINARY: {
        int nin = c->nin;
        if (nin == 1) {
            if (y->data != x->data)
                e = cudaMemcpyAsync(y->data, x->data, tensor_nbytes(y), cudaMemcpyDeviceToDevice, s);
        }
        for (int k = 1; k < nin && e == cudaSuccess; k++) {
            /* Step k: y = (k == 1 ? in0 : y) op in_k, every operand broadcast to y's shape. */
            const struct tensor *a = k == 1 ? x : y;
            const struct tensor *b = c->in[k];
            int ndim[2] = {a->ndim, b->ndim};
            const int64_t *dims[2] = {a->dims, b->dims};
            struct kc_bcast bc;
            if (kc_bcast_init(&bc, y->ndim, y->dims, 2, ndim, dims)) return op_error(c, "inputs do not broadcast");
            e = kc_binary(st->code, x->dtype, a->data, b->data, y->data, &bc, act, s);
        }
        if (e == cudaSuccess && !strcmp(n->op_type, "Mean") && nin > 1)
            e = kc_unary(KU_SCALE, y->dtype, y->data, y->data, ny, 1.0f / (float)nin, 0, none, s);
        break;
    }
    case KD_WHERE:
        e = kc_where(dtype_size(c->in[1]->dtype), x->data, c->in[1]->data, c->in[2]->data, y->data, &st->bc, s);
        break;
    case KD_COPY:
        if (y->data != x->data && tensor_nbytes(y))
            e = cudaMemcpyAsync(y->data, x->data, tensor_nbytes(y), cudaMemcpyDeviceToDevice, s);
        break;
    case KD_EXPAND:
    case KD_TILE:
    case KD_TRANSPOSE:
    case KD_SLICE:
    case KD_PAD:
        e = kc_remap(dtype_size(x->dtype), x->data, y->data, &st->rm, s);
        break;
    case KD_CONCAT: {
        size_t es = dtype_size(y->dtype);
        int64_t outer = kd_prod(y, 0, st->axis), inner = kd_prod(y, st->axis + 1, y->ndim);
        int64_t ld = y->dims[st->axis] * inner, off = 0;
        for (int k = 0; k < c->nin && e == cudaSuccess; k++) {
            int64_t cols = c->in[k]->dims[st->axis] * inner;
            e = kc_copy2d(es, (char *)y->data + (size_t)off * es, ld, c->in[k]->data, cols, outer, cols, s);
            off += cols;
        }
        break;
    }
    case KD_SPLIT: {
        size_t es = dtype_size(x->dtype);
        int64_t outer = kd_prod(x, 0, st->axis), inner = kd_prod(x, st->axis + 1, x->ndim);
        int64_t ld = x->dims[st->axis] * inner, off = 0;
        for (int k = 0; k < c->nout && e == cudaSuccess; k++) {
            int64_t cols = c->out[k]->dims[st->axis] * inner;
            e = kc_copy2d(es, c->out[k]->data, cols, (const char *)x->data + (size_t)off * es, ld, outer, cols, s);
            off += cols;
        }
        break;
    }
    case KD_GATHER:
        e = kc_gather(dtype_size(x->dtype), x->data, c->in[1]->data, c->in[1]->dtype, y->data, st->outer, st->mid,
                      st->inner, tensor_numel(c->in[1]), s);
        break;
    case KD_GATHER_ELEMENTS:
        e = kc_gather_elements(dtype_size(x->dtype), x->data, c->in[1]->data, c->in[1]->dtype, y->data, &st->ge, s);
        break;
    case KD_CAST:
        e = kc_cast(x->dtype, y->dtype, x->data, y->data, ny, s);
        break;
    case KD_SOFTMAX:
        e = kc_softmax(x->dtype, x->data, y->data, st->outer, st->mid, st->inner, st->code, s);
        break;
    case KD_LAYERNORM:
        e = kc_layernorm(x->dtype, x->data, c->nin > 1 && c->in[1] ? c->in[1]->data : NULL,
                         c->nin > 2 && c->in[2] ? c->in[2]->data : NULL, y->data,
                         c->nout > 1 && c->out[1] ? (float *)c->out[1]->data : NULL,
                         c->nout > 2 && c->out[2] ? (float *)c->out[2]->data : NULL, st->outer, st->inner, st->eps, 0, s);
        break;
    case KD_INSTANCENORM:
        e = kc_layernorm(x->dtype, x->data, c->in[1]->data, c->in[2]->data, y->data, NULL, NULL, st->outer, st->inner,
                         st->eps, st->mid, s);
        break;
    case KD_POOL:
        e = kc_pool(x->dtype, x->data, y->data, &st->pool, s);
        break;
    case KD_LRN:
        e = kc_lrn(x->dtype, x->data, y->data, st->outer, st->mid, st->inner, st->size, st->alpha, st->beta, st->bias, s);
        break;
    case KD_REDUCE:
    case KD_GLOBALPOOL:
        if (st->flag) {
            if (y->data != x->data) e = cudaMemcpyAsync(y->data, x->data, tensor_nbytes(y), cudaMemcpyDeviceToDevice, s);
        } else {
            e = kc_reduce(st->code, x->dtype, x->data, y->data, &st->rd, s);
        }
        break;
    case KD_ARGMAX:
        e = kc_argmax(x->dtype, x->data, (int64_t *)y->data, st->outer, st->mid, st->inner, st->code, st->flag, s);
        break;
    case KD_BATCHNORM:
        e = kc_batchnorm(x->dtype, c->in[1]->dtype, x->data, c->in[1]->data, c->in[2]->data, c->in[3]->data,
                         c->in[4]->data, y->data, st->outer, st->mid, st->inner, st->eps, act, s);
        break;
    }
    if (e == cudaSuccess && st->act_after && st->act.kind != ACT_NONE)
        e = kc_bias_act(y->dtype, y->data, NULL, ny, 1, 1, st->act, s);
    return kd_check(c, e, n->op_type);
}

int kd_run(struct op_call *c, void *state, cudaStream_t s) {
    if (state) return kd_run_state(c, (const struct kd_state *)state, s);
    void *tmp = NULL;
    int rc = kd_prepare(c, &tmp);
    if (rc) return rc;
    rc = kd_run_state(c, (const struct kd_state *)tmp, s);
    kd_release(tmp);
    return rc;
}
