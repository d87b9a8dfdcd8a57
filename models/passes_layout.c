/* passes_layout.c - channels-last activations between float convolutions
 * on the CPU (passes_layout in passes.h).
 *
 * oneDNN's fast convolutions (brgemm 1x1, depthwise, the direct kernels)
 * work on channels-last (NHWC, oneDNN's acdb) memory; ONNX's tensors are
 * NCHW, so each Conv would reorder its input in and its output back, and
 * on MobileNet-class models those reorders cost as much as the
 * convolutions. Here a value a 2-D Conv produces is stored channels-last
 * instead, its dims still NCHW, when every node that reads it can take it
 * so; the nodes downstream of it that only move it along (activations,
 * residual Adds, squeeze-excite Muls, pools, channel Concats, Resizes)
 * keep it so in turn. The node attribute kiln_layout tells the kernels:
 * on Conv, bit 1 says X is channels-last and bit 2 says Y is; on the
 * other ops that honour it, 3 says that the op runs on channels-last
 * memory (every 4-D operand the planner did not find layout-neutral is
 * channels-last, its output too), 1 (global pools) that only X is. A
 * Transpose from NCHW to NHWC of a channels-last value (kiln_layout 1), or
 * from NHWC to NCHW into one (2), moves no byte: the plan makes it a view,
 * so that ConvNeXt's blocks (depthwise Conv, Transpose, LayerNorm and
 * Linears over channels, Transpose back, residual Add) run with no layout
 * round trip.
 *
 * A value is layout-neutral when its NCHW and NHWC memory are the same
 * bytes: one channel, or a 1x1 map ([N,C,1,1], a squeeze-excite scale).
 * Those are never marked and read the same either way. Shapes come from
 * a probe of the graph's shape rules with its symbolic dims made concrete,
 * the shape computations of a dynamic batch (Shape, Gather, Concat into a
 * Reshape) evaluated on the way; twice with different sizes where the
 * inputs have symbolic dims, a value counting as neutral only if it is in
 * both. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "kernels/ops.h"
#include "models/eval.h"
#include "models/passes.h"
#include "models/passes_util.h"

/* ---- the shape probe --------------------------------------------------------------------------- */

/* A shape computation (Shape, Gather, Concat of a few integers...) whose
 * value a Reshape needs: small integer outputs of a node whose inputs are
 * known, or of a shape-only op. */
static int probe_computes(const struct graph_node *n, const struct op_call *c) {
    int shape_only = (n->op->flags & OP_SHAPE_ONLY) != 0;
    for (int k = 0; k < n->nin && !shape_only; k++)
        if (c->in[k] && !c->in[k]->data) return 0;
    for (int k = 0; k < n->nout; k++) {
        const struct tensor *o = c->out[k];
        if (o->dtype != DT_INT64 && o->dtype != DT_INT32) return 0;
        if (o->ndim < 0 || tensor_numel(o) > 64) return 0;
    }
    return n->op->run != NULL;
}

/* Every value's shape with the symbolic dims of the inputs set: dim 0 to
 * batch, the others to other, shape computations evaluated on the way
 * (their data owned by the probe: owned[v], freed by probe_free). Values
 * whose shape rule fails keep rank -1. */
static void probe_shapes(const struct graph *g, struct tensor *t, unsigned char *owned, int64_t batch, int64_t other,
                         int *dynamic) {
    for (int v = 0; v < g->nvalues; v++) {
        t[v] = g->values[v].t;
        owned[v] = 0;
        if (t[v].data) continue;
        if (g->values[v].flags & VALUE_INPUT) {
            for (int d = 0; d < t[v].ndim; d++)
                if (t[v].dims[d] < 0) {
                    t[v].dims[d] = d == 0 ? batch : other;
                    *dynamic = 1;
                }
        } else {
            t[v].ndim = -1;
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        const struct graph_node *n = &g->nodes[i];
        if (!n->op || !n->op->infer || n->nin > OP_MAX_IO || n->nout > OP_MAX_IO) continue;
        struct op_call c;
        struct tensor dummy[OP_MAX_IO];
        op_call_init(&c, n, 1, NULL, 0);
        int known = 1;
        for (int k = 0; k < n->nin; k++) {
            if (n->in[k] < 0) continue;
            c.in[k] = &t[n->in[k]];
            if (t[n->in[k]].ndim < 0) known = 0;
        }
        if (!known) continue;
        for (int k = 0; k < n->nout; k++) {
            struct tensor *o = n->out[k] >= 0 ? &t[n->out[k]] : &dummy[k];
            memset(o, 0, sizeof *o);
            c.out[k] = o;
        }
        if (n->op->infer(&c)) {
            for (int k = 0; k < n->nout; k++) c.out[k]->ndim = -1;
            continue;
        }
        if (!probe_computes(n, &c)) continue;
        struct tensor res[OP_MAX_IO];
        if (eval_node(n, (const struct tensor *const *)c.in, n->nin, res, n->nout, 4096, NULL, 0) != 0) continue;
        for (int k = 0; k < n->nout; k++) {
            if (n->out[k] < 0) {
                tensor_free_data(&res[k]);
                continue;
            }
            t[n->out[k]] = res[k];
            owned[n->out[k]] = 1;
        }
    }
}

static void probe_free(const struct graph *g, struct tensor *t, unsigned char *owned) {
    for (int v = 0; t && owned && v < g->nvalues; v++)
        if (owned[v]) tensor_free_data(&t[v]), owned[v] = 0;
}

/* The probe at batch 1 (other symbolic dims 224) and, when the inputs have
 * symbolic dims, again at batch 2 (97): t2 NULL when they have none. */
struct probes {
    struct tensor *t, *t2;
    unsigned char *owned, *owned2;
};

static int probes_make(const struct graph *g, struct probes *P) {
    size_t nv = (size_t)(g->nvalues > 0 ? g->nvalues : 1);
    P->t = malloc(nv * sizeof *P->t);
    P->t2 = malloc(nv * sizeof *P->t2);
    P->owned = calloc(nv, 1);
    P->owned2 = calloc(nv, 1);
    if (!P->t || !P->t2 || !P->owned || !P->owned2) return -1;
    int dynamic = 0;
    probe_shapes(g, P->t, P->owned, 1, 224, &dynamic);
    if (dynamic) probe_shapes(g, P->t2, P->owned2, 2, 97, &dynamic);
    else free(P->t2), P->t2 = NULL;
    return 0;
}

static void probes_free(const struct graph *g, struct probes *P) {
    probe_free(g, P->t, P->owned);
    probe_free(g, P->t2, P->owned2);
    free(P->t);
    free(P->t2);
    free(P->owned);
    free(P->owned2);
}

/* ---- which nodes can work channels-last --------------------------------------------------------- */

enum lay_role {
    ROLE_NONE = 0, /* reads its inputs plain */
    ROLE_CONV,     /* 2-D Conv: X and Y each either way */
    ROLE_FOLLOW,   /* output channels-last exactly when its spatial inputs are */
    ROLE_GLOBAL,   /* global pool: X either way, output [N,C,1,1] (neutral) */
    ROLE_TO_NHWC,  /* Transpose NCHW -> NHWC: X either way, output plain */
    ROLE_TO_NCHW,  /* Transpose NHWC -> NCHW: X plain, output either way */
};

static int is_op(const struct graph_node *n, const char *op) {
    return n->domain[0] == 0 && strcmp(n->op_type, op) == 0;
}

static int is_one_of(const struct graph_node *n, const char *const *ops) {
    for (; *ops; ops++)
        if (is_op(n, *ops)) return 1;
    return 0;
}

/* Float elementwise operators that treat every element alike: memory order
 * is theirs to ignore. */
static const char *const unary_ops[] = {"Relu",     "LeakyRelu", "Clip",  "Sigmoid", "HardSigmoid", "HardSwish",
                                        "Tanh",     "Elu",       "Selu",  "Celu",    "Softplus",    "Softsign",
                                        "Mish",     "Gelu",      "Erf",   "Exp",     "Neg",         "Abs",
                                        "Sqrt",     "Reciprocal", "Floor", "Ceil",   "Round",       "ThresholdedRelu",
                                        NULL};
/* Binary operators with numpy broadcasting (ops_elementwise.c honours
 * kiln_layout by broadcasting over the channels-last order). */
static const char *const binary_ops[] = {"Add", "Sub", "Mul", "Div", NULL};

static int rank4(const struct tensor *t) { return t->ndim == 4; }

/* A Transpose whose perm is p (rank 4). */
static int is_transpose(const struct graph_node *n, const int64_t p[4]) {
    const int64_t *perm;
    if (!is_op(n, "Transpose") || node_attr_ints(n, "perm", &perm) != 4) return 0;
    return memcmp(perm, p, 4 * sizeof *perm) == 0;
}

/* QuantizeLinear and DequantizeLinear with one scale and zero point (a QDQ
 * model run in float, where oneDNN has no exact integer kernel: AVX2)
 * between two Convs: elementwise, so the Convs keep channels-last across
 * them instead of reordering on both sides of each (QDQ MobileNet V2 under
 * ONEDNN_MAX_CPU_ISA=AVX2: 111 reorders a run). */
static int per_tensor_qdq(const struct graph_node *n, const struct tensor *t) {
    int q = is_op(n, "QuantizeLinear");
    if (!q && !is_op(n, "DequantizeLinear")) return 0;
    if (n->nout != 1 || n->nin < 2 || n->in[1] < 0 || tensor_numel(&t[n->in[1]]) != 1) return 0;
    if (n->nin > 2 && n->in[2] >= 0 && tensor_numel(&t[n->in[2]]) != 1) return 0;
    const struct tensor *x = &t[n->in[0]], *y = &t[n->out[0]];
    if (!rank4(x) || !rank4(y) || memcmp(x->dims, y->dims, 4 * sizeof *x->dims) != 0) return 0;
    return (q ? x : y)->dtype == DT_FP32;
}

/* A float reduction of a 4-D value over H and W only (ConvNeXt's head is
 * a ReduceMean over axes 2 and 3): a global pool, whose kernel walks
 * channels-last memory as well (ops_reduce.c). Its axes are an attribute
 * or, from opset 18 (13 for ReduceSum), a constant input. */
static int spatial_reduce(const struct graph_node *n, const struct tensor *t) {
    static const char *const ops[] = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", NULL};
    if (!is_one_of(n, ops) || !rank4(&t[n->in[0]]) || t[n->in[0]].dtype != DT_FP32) return 0;
    int64_t axes[4];
    int na;
    if (n->opset >= (is_op(n, "ReduceSum") ? 13 : 18)) {
        const struct tensor *a = n->nin > 1 && n->in[1] >= 0 ? &t[n->in[1]] : NULL;
        if (!a || !a->data || a->dtype != DT_INT64 || a->ndim != 1 || a->dims[0] != 2) return 0;
        memcpy(axes, a->data, 2 * sizeof *axes);
        na = 2;
    } else {
        const int64_t *v;
        if ((na = node_attr_ints(n, "axes", &v)) != 2) return 0;
        memcpy(axes, v, 2 * sizeof *axes);
    }
    int red[4] = {0};
    for (int i = 0; i < na; i++) {
        int64_t ax = axes[i] < 0 ? axes[i] + 4 : axes[i];
        if (ax < 0 || ax > 3) return 0;
        red[ax] = 1;
    }
    return red[2] && red[3];
}

static enum lay_role role_of(const struct graph *g, const struct graph_node *n, const struct tensor *t) {
    if (n->nout < 1 || n->out[0] < 0 || n->nin < 1 || n->in[0] < 0) return ROLE_NONE;
    const struct tensor *x = &t[n->in[0]], *y = &t[n->out[0]];
    if (per_tensor_qdq(n, t)) return ROLE_FOLLOW;
    /* The residual sums of such a model, fused on 8-bit values: elementwise
     * when both operands have the output's shape (its kernel checks). */
    if (is_qlinear_add(n) && n->nout == 1 && n->in[3] >= 0 && rank4(y) && tensor_same_shape(x, y) &&
        tensor_same_shape(&t[n->in[3]], y))
        return ROLE_FOLLOW;
    /* Their 8-bit pools: MaxPool on channels-last bytes (no Indices), the
     * global average reading them. */
    if (is_op(n, "MaxPool") && rank4(x) && rank4(y) && (x->dtype == DT_UINT8 || x->dtype == DT_INT8))
        return n->nout == 1 || n->out[1] < 0 ? ROLE_FOLLOW : ROLE_NONE;
    if (is_qgap_nchw(n) && rank4(x)) return ROLE_GLOBAL;
    if (spatial_reduce(n, t)) return n->nout == 1 ? ROLE_GLOBAL : ROLE_NONE;
    if (!rank4(y) || y->dtype != DT_FP32) return ROLE_NONE;
    /* Either operand may be the broadcast one ([C,1,1] * x). */
    if (is_one_of(n, binary_ops)) return n->nout == 1 ? ROLE_FOLLOW : ROLE_NONE;
    if (x->dtype != DT_FP32 || !rank4(x)) return ROLE_NONE;
    if (is_op(n, "Conv")) return n->nin >= 2 && n->in[1] >= 0 && rank4(&t[n->in[1]]) ? ROLE_CONV : ROLE_NONE;
    if (is_one_of(n, unary_ops)) return n->nout == 1 ? ROLE_FOLLOW : ROLE_NONE;
    /* ConvNeXt's blocks and its LayerNorm2d go to NHWC for a LayerNorm and
     * Linears over the channels, and back: of a value stored channels-last
     * the NHWC tensor is the very bytes, and so is the NCHW one of an NHWC
     * tensor stored so. Both Transposes become views, and the depthwise
     * Conv before and the residual Add after stay channels-last. */
    static const int64_t to_nhwc[4] = {0, 2, 3, 1}, to_nchw[4] = {0, 3, 1, 2};
    if (is_transpose(n, to_nhwc)) return ROLE_TO_NHWC;
    if (is_transpose(n, to_nchw)) return ROLE_TO_NCHW;
    /* Sum (ResNet's residual joins in older exports) of operands all of the
     * output's shape: elementwise in any layout, so its kernel needs no
     * marks. Broadcasting ones stay plain. */
    if (is_op(n, "Sum")) {
        for (int k = 0; k < n->nin; k++)
            if (n->in[k] < 0 || !tensor_same_shape(&t[n->in[k]], y) || t[n->in[k]].dtype != DT_FP32) return ROLE_NONE;
        return n->nout == 1 ? ROLE_FOLLOW : ROLE_NONE;
    }
    /* oneDNN pools channels-last (the C loop on plain copies where it
     * refuses a shape); no Indices output. */
    if (is_op(n, "MaxPool") || is_op(n, "AveragePool"))
        return n->nout == 1 || n->out[1] < 0 ? ROLE_FOLLOW : ROLE_NONE;
    if (is_op(n, "GlobalAveragePool") || is_op(n, "GlobalMaxPool")) return ROLE_GLOBAL;
    if (is_op(n, "Concat")) {
        int64_t a = node_attr_int(n, "axis", 0);
        return a == 1 || a == -3 ? ROLE_FOLLOW : ROLE_NONE;
    }
    /* Inference BatchNormalization (DenseNet's, between a Concat and a
     * Conv, which no Conv absorbs): a per-channel affine. */
    if (is_op(n, "BatchNormalization"))
        return n->nout == 1 && !node_attr_int(n, "training_mode", 0) ? ROLE_FOLLOW : ROLE_NONE;
    /* Resize of H and W only (a crop could move along N or C); roi,
     * scales and sizes are constants. */
    if (is_op(n, "Resize") && n->opset >= 11 &&
        strcmp(node_attr_str(n, "coordinate_transformation_mode", ""), "tf_crop_and_resize") != 0)
        return y->dims[0] == x->dims[0] && y->dims[1] == x->dims[1] ? ROLE_FOLLOW : ROLE_NONE;
    (void)g;
    return ROLE_NONE;
}

/* The inputs of a follower that carry its layout (the others are
 * parameters). */
static int nspatial(const struct graph_node *n) {
    return is_op(n, "Resize") || is_op(n, "BatchNormalization") || is_op(n, "QuantizeLinear") ||
                   is_op(n, "DequantizeLinear")
               ? 1
               : n->nin;
}

/* ---- the planner --------------------------------------------------------------------------------- */

/* 1 if t is known to be the same bytes in either layout. */
static int neutral(const struct tensor *t) {
    if (t->ndim < 0 || t->ndim > 4) return 0;
    int64_t d[4] = {1, 1, 1, 1};
    for (int i = 0; i < t->ndim; i++) d[4 - t->ndim + i] = t->dims[i];
    for (int i = 1; i < 4; i++)
        if (d[i] < 0) return 0;
    return d[1] == 1 || d[2] * d[3] == 1;
}

struct lay {
    const struct graph *g;
    const struct tensor *t;
    unsigned char *role; /* per node: enum lay_role */
    unsigned char *cl;   /* per value: stored channels-last */
    unsigned char *neu;  /* per value: layout-neutral */
};

/* 1 if node n can read its input k channels-last, given the marks so far. */
static int reader_ok(const struct lay *L, const struct graph_node *n, int ni, int k) {
    switch ((enum lay_role)L->role[ni]) {
    case ROLE_CONV: return k == 0;
    case ROLE_GLOBAL: return k == 0;
    case ROLE_TO_NHWC: return k == 0;
    case ROLE_FOLLOW: return L->cl[n->out[0]];
    case ROLE_TO_NCHW:
    case ROLE_NONE: break;
    }
    return 0;
}

/* A follower's output stays channels-last only if each of its inputs is
 * channels-last or neutral. */
static int follow_ok(const struct lay *L, const struct graph_node *n) {
    for (int k = 0; k < nspatial(n); k++) {
        int v = n->in[k];
        if (v >= 0 && !L->cl[v] && !L->neu[v]) return 0;
    }
    return 1;
}

static int demote_pass(struct lay *L) {
    const struct graph *g = L->g;
    int changed = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const struct graph_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int v = n->in[k];
            if (v >= 0 && L->cl[v] && !reader_ok(L, n, i, k)) L->cl[v] = 0, changed = 1;
        }
        if (L->role[i] == ROLE_FOLLOW && L->cl[n->out[0]] && !follow_ok(L, n)) L->cl[n->out[0]] = 0, changed = 1;
    }
    return changed;
}

static int mark_nodes(struct lay *L, struct graph *g, int *nmarked) {
    for (int i = 0; i < g->nnodes; i++) {
        struct graph_node *n = &g->nodes[i];
        int64_t lay = 0;
        if (L->role[i] == ROLE_CONV) lay = (L->cl[n->in[0]] ? 1 : 0) | (L->cl[n->out[0]] ? 2 : 0);
        else if (L->role[i] == ROLE_FOLLOW && L->cl[n->out[0]]) lay = 3;
        else if ((L->role[i] == ROLE_GLOBAL || L->role[i] == ROLE_TO_NHWC) && L->cl[n->in[0]]) lay = 1;
        else if (L->role[i] == ROLE_TO_NCHW && L->cl[n->out[0]]) lay = 2;
        if (!lay) continue;
        if (node_set_attr_int(n, "kiln_layout", lay)) return -1;
        (*nmarked)++;
    }
    return 0;
}

int passes_layout(struct graph *g, int *nmarked, char *err, size_t err_len) {
    *nmarked = 0;
    const char *e = getenv("KILN_LAYOUT");
    if (e && strcmp(e, "plain") == 0) return 0;
    size_t nv = (size_t)(g->nvalues > 0 ? g->nvalues : 1), nn = (size_t)(g->nnodes > 0 ? g->nnodes : 1);
    struct probes P = {0};
    int pr = probes_make(g, &P);
    const struct tensor *t = P.t;
    struct lay L = {.g = g, .t = t, .role = calloc(nn, 1), .cl = calloc(nv, 1), .neu = calloc(nv, 1)};
    int rc = 0;
    if (pr || !L.role || !L.cl || !L.neu) {
        rc = status_set(err, err_len, STATUS_NOMEM, "out of memory planning layouts");
        goto done;
    }
    for (int v = 0; v < g->nvalues; v++) L.neu[v] = neutral(&t[v]);
    if (P.t2) /* neutral at both sizes, or not at all */
        for (int v = 0; v < g->nvalues; v++) L.neu[v] &= neutral(&P.t2[v]) && P.t2[v].ndim == t[v].ndim;
    int nconv = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const struct graph_node *n = &g->nodes[i];
        L.role[i] = (unsigned char)role_of(g, n, t);
        if (L.role[i] == ROLE_CONV) nconv++;
        if ((L.role[i] == ROLE_CONV || L.role[i] == ROLE_FOLLOW || L.role[i] == ROLE_TO_NCHW) && !L.neu[n->out[0]])
            L.cl[n->out[0]] = 1;
    }
    for (int o = 0; o < g->noutputs; o++) L.cl[g->outputs[o]] = 0;
    while (demote_pass(&L)) {
    }
    int ncl = 0, nchange = 0;
    for (int v = 0; v < g->nvalues; v++) ncl += L.cl[v];
    for (int i = 0; i < g->nnodes; i++)
        if (L.role[i] == ROLE_CONV) nchange += L.cl[g->nodes[i].in[0]] != L.cl[g->nodes[i].out[0]];
    if (mark_nodes(&L, g, nmarked)) {
        rc = status_set(err, err_len, STATUS_NOMEM, "out of memory planning layouts");
        goto done;
    }
    if (nconv)
        log_debug("layout: %d values channels-last, %d nodes marked, %d of %d Conv change layout", ncl, *nmarked,
                  nchange, nconv);
done:
    probes_free(g, &P);
    free(L.role);
    free(L.cl);
    free(L.neu);
    return rc;
}

/* ---- residual sums into the convolution before them ------------------------------------------------ */

/* Conv -> Add(Y, Z) with Y read by the Add alone and Z of Y's shape: the
 * Add becomes the convolution's sum post-op (Z input 3 of the Conv,
 * kiln_residual 1; oneDNN adds the products to what its destination
 * holds) and the Add's fused activation the convolution's, after the sum
 * as before. ResNet's blocks end so (Conv, Add of the block's input,
 * Relu): a pass over each block's output and a parallel region less, and
 * with the plan's sum_in_place no copy either. onnxruntime fuses the same
 * (its FusedConv's Z). A Sum of two (older exports) is taken alike. Z and
 * Y must be stored alike: both channels-last (the Add marked so,
 * kiln_layout 3, and the Conv's Y too) or both plain. Shapes come from
 * the layout pass's probe, at a second size too when the inputs have
 * symbolic dims; the kernel checks them again. The sum's rounding is
 * oneDNN's (its AVX2 kernels start from Z and the bias, then add each
 * product; the tap products start from B + Z): within float rounding of
 * the Add, not its bits. KILN_RESIDUAL=0 turns the fusion off (for
 * comparisons). */
struct residual_ctx {
    const struct tensor *t, *t2; /* t2: the second probe, or NULL */
};

static int residual_node(struct pass *ps, int ci) {
    struct graph *g = ps->g;
    struct graph_node *cv = &g->nodes[ci];
    const struct residual_ctx *rc = ps->ctx;
    if (ps->dead[ci] || !is_op(cv, "Conv") || cv->act != ACT_NONE || cv->act_affine || cv->nout != 1 ||
        cv->nin < 2 || cv->nin > 3)
        return 0;
    const int y = cv->out[0];
    int ai = pass_next_op(ps, ci, "Add");
    if (ai < 0) ai = pass_next_op(ps, ci, "Sum"); /* older exports' residual joins */
    if (y < 0 || ai < 0) return 0;
    struct graph_node *a = &g->nodes[ai];
    const int z = a->nin == 2 ? pass_other_of(a, y) : -1;
    if (a->nout != 1 || a->out[0] < 0 || z < 0 || z == y || a->act == ACT_QDQ || a->act_affine) return 0;
    for (int p = 0; p < 2; p++) {
        const struct tensor *t = p ? rc->t2 : rc->t;
        if (!t) continue;
        if (!rank4(&t[y]) || t[y].dtype != DT_FP32 || t[z].dtype != DT_FP32 || !tensor_same_shape(&t[y], &t[z]) ||
            !tensor_same_shape(&t[y], &t[a->out[0]]))
            return 0;
    }
    const int y_cl = (node_attr_int(cv, "kiln_layout", 0) & 2) != 0, a_cl = node_attr_int(a, "kiln_layout", 0) == 3;
    if (y_cl != a_cl) return 0;
    int *in = realloc(cv->in, 4 * sizeof *in);
    if (!in) return pass_nomem(ps);
    cv->in = in;
    if (cv->nin < 3) in[2] = -1;
    in[3] = z;
    cv->nin = 4;
    if (node_set_attr_int(cv, "kiln_residual", 1)) return pass_nomem(ps);
    cv->act = a->act;
    cv->act_alpha = a->act_alpha;
    cv->act_beta = a->act_beta;
    cv->out[0] = a->out[0];
    a->out[0] = y;
    /* The Conv moves to the Add's place, where Z is known to be computed
     * (a downsampling branch's Conv may come after it); the Add, at the
     * Conv's, is dropped. */
    struct graph_node tmp = *cv;
    *cv = *a;
    *a = tmp;
    g->values[a->out[0]].producer = ai;
    g->values[y].producer = ci;
    ps->dead[ci] = 1;
    log_debug("fused %s '%s' into Conv '%s' as its residual sum", g->nodes[ci].op_type, g->nodes[ci].name,
              g->nodes[ai].name);
    return 1;
}

static const struct pass_def residual_pass = {"fusing residual sums into convolutions", residual_node, 0};

int passes_fuse_residual(struct graph *g, int *nfused, char *err, size_t err_len) {
    *nfused = 0;
    const char *e = getenv("KILN_RESIDUAL");
    if (e && strcmp(e, "0") == 0) return 0;
    int nconv = 0;
    for (int i = 0; i < g->nnodes && !nconv; i++) nconv = is_op(&g->nodes[i], "Conv");
    if (!nconv) return 0;
    struct probes P = {0};
    int rc = probes_make(g, &P) ? status_set(err, err_len, STATUS_NOMEM, "out of memory fusing residual sums") : 0;
    if (!rc) {
        struct residual_ctx ctx = {.t = P.t, .t2 = P.t2};
        rc = pass_run(&residual_pass, g, &ctx, nfused, err, err_len);
    }
    probes_free(g, &P);
    return rc;
}
