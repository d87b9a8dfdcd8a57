/* passes_gelu_tanh.c - GELU's tanh form as one node.
 *
 * GPT-2's NewGELU (and transformers' gelu_new, "gelu_pytorch_tanh")
 * exports as (jax2tf, as in magika: the cube as Mul(x, Mul(x, Mul(x,
 * 0.044715))) and the end as x * (0.5 * (t + 1)))
 *
 *   h = Mul(x, 0.5)                p = Pow(x, 3)
 *   t = Tanh(Mul(Add(x, Mul(p, 0.044715)), sqrt(2/pi)))
 *   y = Mul(h, Add(t, 1))          (or Mul(Mul(x, Add(t, 1)), 0.5))
 *
 * eight passes over the tensor, each its own team of threads: it becomes
 * one Gelu with approximate="tanh" (opset 20), whose kernel computes the
 * same formula in one vectorised pass (x * x * x for the cube: within
 * float rounding of the graph). Matched at the Tanh; every intermediate
 * must have that one reader. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/ops.h"
#include "models/passes.h"
#include "models/passes_util.h"

/* The producer of v when it is op, live, and v's only reader is the
 * pattern (no graph output), or -1. */
static int inner(struct pass *ps, int v, const char *op) {
    const int pi = pass_sole_producer(ps, v, op);
    return pi >= 0 && ps->g->nodes[pi].nin == 2 ? pi : -1;
}

/* The non-constant input of binary node n whose other input is a scalar
 * near want, or -1. */
static int scaled_input(const struct graph *g, const struct graph_node *n, double want) {
    for (int k = 0; k < 2; k++)
        if (pass_other_input(g, n, n->in[k], want) >= 0) return n->in[k];
    return -1;
}

static int gelu_tanh_node(struct pass *ps, int ti) {
    struct graph *g = ps->g;
    const struct graph_node *t = &g->nodes[ti];
    if (ps->dead[ti] || !pass_is_op(t, "Tanh") || t->nin != 1 || t->nout != 1) return 0;
    /* Tanh(Mul(v, sqrt(2/pi))) */
    const int ui = inner(ps, t->in[0], "Mul");
    const int v = ui >= 0 ? scaled_input(g, &g->nodes[ui], 0.7978845608028654) : -1;
    /* v = Add(x, Mul(Pow(x, 3), 0.044715)) */
    const int vi = inner(ps, v, "Add");
    if (vi < 0) return 0;
    int x = -1, wi = -1, pi = -1, qi = -1;
    for (int k = 0; k < 2 && x < 0; k++) {
        const int w = g->nodes[vi].in[k], xc = g->nodes[vi].in[1 - k];
        qi = -1;
        wi = inner(ps, w, "Mul");
        const int p = wi >= 0 ? scaled_input(g, &g->nodes[wi], 0.044715) : -1;
        pi = inner(ps, p, "Pow");
        if (pi >= 0 && g->nodes[pi].in[0] == xc && pass_other_input(g, &g->nodes[pi], xc, 3.0) >= 0) {
            x = xc;
            continue;
        }
        /* jax2tf's cube: Mul(x, Mul(x, Mul(x, 0.044715))) */
        const int q = wi >= 0 ? pass_other_of(&g->nodes[wi], xc) : -1;
        if ((qi = inner(ps, q, "Mul")) < 0) continue;
        const int r = pass_other_of(&g->nodes[qi], xc);
        if ((pi = inner(ps, r, "Mul")) >= 0 && scaled_input(g, &g->nodes[pi], 0.044715) == xc) x = xc;
    }
    if (x < 0) return 0;
    /* Add(t, 1), then 0.5 x times it in any order */
    const int ai = pass_next_op(ps, ti, "Add");
    if (ai < 0 || pass_other_input(g, &g->nodes[ai], t->out[0], 1.0) < 0) return 0;
    const int mi = pass_next_op(ps, ai, "Mul");
    if (mi < 0 || g->nodes[mi].nin != 2) return 0;
    const int a_out = g->nodes[ai].out[0], other = g->nodes[mi].in[0] == a_out ? g->nodes[mi].in[1] : g->nodes[mi].in[0];
    int last = -1, hi = -1;
    if (other == x) { /* (x * a) * 0.5 */
        last = pass_next_op(ps, mi, "Mul");
        if (last < 0 || pass_other_input(g, &g->nodes[last], g->nodes[mi].out[0], 0.5) < 0) return 0;
    } else if ((hi = inner(ps, other, "Mul")) >= 0 && scaled_input(g, &g->nodes[hi], 0.5) == x) {
        last = mi; /* (x * 0.5) * a */
    } else if (pass_other_input(g, &g->nodes[mi], a_out, 0.5) >= 0) {
        last = pass_next_op(ps, mi, "Mul"); /* x * (0.5 * a) */
        if (last < 0 || g->nodes[last].nin != 2 || pass_other_of(&g->nodes[last], g->nodes[mi].out[0]) != x)
            return 0;
    } else {
        return 0;
    }
    const int rc = pass_become(ps, last, "", "Gelu", &x, 1, 0);
    if (rc <= 0) return rc;
    struct graph_node *y = &g->nodes[last];
    y->opset = 20;
    const struct graph_attr at = {.name = "approximate", .type = ATTR_STRING, .s = "tanh", .s_len = 4};
    if (pass_set_attrs(y, &at, 1)) return pass_nomem(ps);
    ps->dead[ti] = ps->dead[ui] = ps->dead[vi] = ps->dead[wi] = ps->dead[pi] = ps->dead[ai] = 1;
    if (last != mi) ps->dead[mi] = 1;
    if (hi >= 0) ps->dead[hi] = 1;
    if (qi >= 0) ps->dead[qi] = 1;
    log_debug("tanh GELU from '%s' (Tanh) and its parts: one Gelu node", g->nodes[ti].name);
    return 1;
}

static const struct pass_def gelu_tanh_pass = {"fusing tanh GELU", gelu_tanh_node, 0};

int passes_fuse_gelu_tanh(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&gelu_tanh_pass, g, NULL, nfused, err, err_len);
}
