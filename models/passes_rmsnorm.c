/* passes_rmsnorm.c - RMS normalization written out, as one node.
 *
 * T5's and Llama's RMSNorm (transformers' T5LayerNorm, LlamaRMSNorm and
 * their many copies) export as
 *
 *   v = ReduceMean(Pow(x, 2), axes=[-1], keepdims=1)      (or Mul(x, x))
 *   r = Div(1, Sqrt(Add(v, eps)))                         (or Reciprocal)
 *   y = Mul(w, [Cast to float](Mul(x, r)))                (either order)
 *
 * (or x / Sqrt(...) for the Div and Mul by r): seven nodes, five passes
 * over x-sized tensors and two reductions' worth of kernels per norm. It
 * becomes one RMSNormalization (opset 23) over the last axis with w as its
 * scale, computed in one pass a row (ew_norm_row_f32): t5_encoder spent 5%
 * of its time in these nodes. Within float rounding of the graph: the mean
 * of squares summed in another order, 1 / sqrt once. Matched at the
 * ReduceMean; every intermediate must have that one reader and w be a
 * 1-D float constant (of x's last axis' length where that is known). */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/ops.h"
#include "models/passes.h"
#include "models/passes_util.h"

/* The float scalar constant among binary node n's inputs other than v, in
 * *f: 1, or 0. */
static int scalar_of(const struct graph *g, const struct graph_node *n, int v, float *f) {
    if (n->nin != 2) return 0;
    const struct tensor *t = pass_const_of(g, pass_other_of(n, v));
    if (!t || t->dtype != DT_FP32 || tensor_numel(t) != 1) return 0;
    *f = ((const float *)t->data)[0];
    return 1;
}

/* 1 when ReduceMean node r reduces x (of rank nd, -1 unknown) over its last
 * axis alone and keeps it. */
static int reduces_last_axis(const struct graph *g, const struct graph_node *r, int nd) {
    if (node_attr_int(r, "keepdims", 1) != 1) return 0;
    int64_t axis;
    const struct graph_attr *a = node_attr(r, "axes");
    if (a) {
        if (a->type != ATTR_INTS || a->n != 1) return 0;
        axis = a->ints[0];
    } else {
        const struct tensor *t = r->nin >= 2 ? pass_const_of(g, r->in[1]) : NULL;
        if (!t || t->dtype != DT_INT64 || tensor_numel(t) != 1) return 0;
        axis = ((const int64_t *)t->data)[0];
    }
    return axis == -1 || axis == nd - 1;
}

static int rmsnorm_node(struct pass *ps, int ri) {
    struct graph *g = ps->g;
    const struct graph_node *r = &g->nodes[ri];
    if (ps->dead[ri] || !pass_is_op(r, "ReduceMean") || r->nin < 1 || r->nout != 1) return 0;
    /* the square: Pow(x, 2) or Mul(x, x) */
    int x = -1, qi = pass_sole_producer(ps, r->in[0], "Pow");
    if (qi >= 0 && g->nodes[qi].nin == 2 && pass_other_input(g, &g->nodes[qi], g->nodes[qi].in[0], 2.0) >= 0)
        x = g->nodes[qi].in[0];
    else if ((qi = pass_sole_producer(ps, r->in[0], "Mul")) >= 0 && g->nodes[qi].nin == 2 &&
             g->nodes[qi].in[0] == g->nodes[qi].in[1])
        x = g->nodes[qi].in[0];
    if (x < 0) return 0;
    /* x's last axis where the file says it (exporters seldom do), else
     * unknown (-1): a scale of another length then fails at run time with
     * the kernel's message, as the Mul would unless that axis were 1 */
    const struct tensor *xt = &g->values[x].t;
    const int64_t C = xt->ndim >= 1 ? xt->dims[xt->ndim - 1] : -1;
    if (!reduces_last_axis(g, r, xt->ndim)) return 0;
    /* + eps, Sqrt */
    float eps;
    const int ai = pass_next_op(ps, ri, "Add");
    if (ai < 0 || !scalar_of(g, &g->nodes[ai], r->out[0], &eps) || !(eps >= 0.0f)) return 0;
    const int si = pass_next_op(ps, ai, "Sqrt");
    if (si < 0) return 0;
    const int s_out = g->nodes[si].out[0];
    /* x / s, or x * (1 / s) with the reciprocal as Div(1, s) or Reciprocal(s) */
    int ni = -1, di = pass_next_op(ps, si, "Div");
    if (di >= 0 && g->nodes[di].nin == 2 && g->nodes[di].in[1] == s_out) {
        const struct graph_node *d = &g->nodes[di];
        if (d->in[0] == x) ni = di, di = -1;
        else if (pass_other_input(g, d, s_out, 1.0) < 0) return 0;
    } else if ((di = pass_next_op(ps, si, "Reciprocal")) < 0) {
        return 0;
    }
    if (ni < 0) { /* Mul(x, r) */
        ni = pass_next_op(ps, di, "Mul");
        if (ni < 0 || g->nodes[ni].nin != 2 || pass_other_of(&g->nodes[ni], g->nodes[di].out[0]) != x) return 0;
    }
    /* [Cast to float], then the scale */
    int ci = pass_next_op(ps, ni, "Cast");
    if (ci >= 0 && (node_attr_int(&g->nodes[ci], "to", 0) != DT_FP32 || pass_known_dtype(g, x) != DT_FP32)) return 0;
    const int from = ci >= 0 ? ci : ni;
    const int wi = pass_next_op(ps, from, "Mul");
    if (wi < 0 || g->nodes[wi].nin != 2) return 0;
    const int w = pass_other_of(&g->nodes[wi], g->nodes[from].out[0]);
    const struct tensor *wt = pass_const_of(g, w);
    /* a float w (so x is float: Mul and Div keep their operands' type) */
    if (!wt || wt->dtype != DT_FP32 || wt->ndim != 1 || (C > 0 && wt->dims[0] != C && wt->dims[0] != 1)) return 0;
    const int in[2] = {x, w};
    const int rc = pass_become(ps, wi, "", "RMSNormalization", in, 2, 0);
    if (rc <= 0) return rc;
    struct graph_node *y = &g->nodes[wi];
    y->opset = 23;
    const struct graph_attr at[2] = {{.name = "axis", .type = ATTR_INT, .i = -1},
                                     {.name = "epsilon", .type = ATTR_FLOAT, .f = eps}};
    if (pass_set_attrs(y, at, 2)) return pass_nomem(ps);
    ps->dead[qi] = ps->dead[ri] = ps->dead[ai] = ps->dead[si] = ps->dead[ni] = 1;
    if (di >= 0) ps->dead[di] = 1;
    if (ci >= 0) ps->dead[ci] = 1;
    log_debug("RMS normalization from '%s' (ReduceMean) and its parts: one RMSNormalization node",
              g->nodes[ri].name);
    return 1;
}

static const struct pass_def rmsnorm_pass = {"fusing RMS normalization", rmsnorm_node, 0};

int passes_fuse_rmsnorm(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&rmsnorm_pass, g, NULL, nfused, err, err_len);
}
