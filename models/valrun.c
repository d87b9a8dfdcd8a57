/* valrun.c - a graph run node by node with every value known (valrun.h). */
#include "models/valrun.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/ops.h"
#include "models/eval.h"

/* The values of one graph run: borrowed (constants, inputs) or owned
 * (computed here), and how many readers each still has. */
struct vr {
    const struct graph *g;
    struct tensor *t;
    uint8_t *owned;
    int *left;
};

static void vr_drop(struct vr *r, int v) {
    if (!r->owned[v]) return;
    tensor_free_data(&r->t[v]);
    r->owned[v] = 0;
}

static void vr_free(struct vr *r) {
    for (int v = 0; r->t && r->owned && v < r->g->nvalues; v++) vr_drop(r, v);
    free(r->t);
    free(r->owned);
    free(r->left);
}

static int vr_init(struct vr *r, const struct graph *g, const struct tensor *inputs, char *err, size_t err_len) {
    memset(r, 0, sizeof *r);
    r->g = g;
    size_t n = (size_t)(g->nvalues ? g->nvalues : 1);
    r->t = calloc(n, sizeof *r->t);
    r->owned = calloc(n, 1);
    r->left = calloc(n, sizeof *r->left);
    if (!r->t || !r->owned || !r->left) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    for (int v = 0; v < g->nvalues; v++)
        if (g->values[v].t.data) r->t[v] = g->values[v].t;
    for (int i = 0; i < g->ninputs; i++) r->t[g->inputs[i]] = inputs[i];
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (g->nodes[i].in[k] >= 0) r->left[g->nodes[i].in[k]]++;
    for (int o = 0; o < g->noutputs; o++) r->left[g->outputs[o]]++;
    return 0;
}

/* An owned copy of src in dst (strings packed into their own block). */
static int copy_owned(struct tensor *dst, const struct tensor *src) {
    *dst = *src;
    dst->data = NULL;
    if (src->dtype == DT_STRING) return tensor_strings_pack(dst, tensor_strs(src));
    if (tensor_alloc_data(dst)) return STATUS_NOMEM;
    size_t nb = tensor_nbytes(src);
    if (nb) memcpy(dst->data, src->data, nb);
    return 0;
}

static int truthy(const struct tensor *t) {
    return t && t->data && tensor_numel(t) > 0 && op_int_at(t, 0) != 0;
}

/* An If: the branch its condition picks, run the same way on the values it
 * captures from this graph. */
static int run_if(const struct graph_node *n, const struct tensor *const *in, struct tensor *out, char *err,
                  size_t err_len) {
    const char *name = truthy(in[0]) ? "then_branch" : "else_branch";
    const struct graph *b = node_attr_graph(n, name);
    if (!b) return status_set(err, err_len, STATUS_INVALID, "node '%s' (If): attribute '%s' is missing", n->name, name);
    if (b->noutputs != n->nout || graph_nformal(b) != 0)
        return status_set(err, err_len, STATUS_INVALID, "node '%s' (If): %s has %d inputs and %d outputs; the node "
                          "has %d outputs", n->name, name, graph_nformal(b), b->noutputs, n->nout);
    struct tensor *bin = calloc((size_t)(b->ninputs ? b->ninputs : 1), sizeof *bin);
    if (!bin) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    int rc = 0;
    for (int j = 0; j < b->ncaptured && !rc; j++) {
        int k = b->capture_in[j];
        if (k >= n->nin || !in[k])
            rc = status_set(err, err_len, STATUS_INTERNAL, "node '%s' (If): captured value %d is missing", n->name, j);
        else bin[j] = *in[k];
    }
    if (!rc) rc = valrun_graph(b, bin, out, err, err_len);
    free(bin);
    return rc;
}

/* Node i with its actual inputs; its outputs join the run's values, and the
 * inputs it was the last reader of are freed. */
static int run_node(struct vr *r, int i, char *err, size_t err_len) {
    const struct graph_node *n = &r->g->nodes[i];
    if (n->nin > OP_MAX_IO || n->nout > OP_MAX_IO)
        return status_set(err, err_len, STATUS_UNSUPPORTED, "node '%s' (%s): more than %d inputs or outputs", n->name,
                          n->op_type, OP_MAX_IO);
    const struct tensor *in[OP_MAX_IO];
    struct tensor res[OP_MAX_IO];
    for (int k = 0; k < n->nin; k++) {
        int v = n->in[k];
        in[k] = v >= 0 ? &r->t[v] : NULL;
        if (v >= 0 && !r->t[v].data && tensor_numel(&r->t[v]) != 0)
            return status_set(err, err_len, STATUS_INTERNAL, "node '%s' (%s): input '%s' is not computed before it",
                              n->name, n->op_type, r->g->values[v].name);
    }
    memset(res, 0, sizeof res);
    int rc = strcmp(n->op_type, "If") == 0 && !n->domain[0]
                 ? run_if(n, in, res, err, err_len)
                 : eval_node(n, in, n->nin, res, n->nout, SIZE_MAX, err, err_len);
    if (rc) return rc < 0 ? rc : STATUS_INTERNAL;
    for (int k = 0; k < n->nout; k++) {
        int v = n->out[k];
        if (v < 0 || !r->left[v]) {
            tensor_free_data(&res[k]);
            continue;
        }
        vr_drop(r, v);
        r->t[v] = res[k];
        r->owned[v] = 1;
    }
    for (int k = 0; k < n->nin; k++) {
        int v = n->in[k];
        if (v >= 0 && --r->left[v] == 0) vr_drop(r, v);
    }
    return 0;
}

int valrun_graph(const struct graph *g, const struct tensor *inputs, struct tensor *outputs, char *err,
                 size_t err_len) {
    struct vr r;
    for (int o = 0; o < g->noutputs; o++) outputs[o].data = NULL;
    int rc = vr_init(&r, g, inputs, err, err_len);
    for (int i = 0; !rc && i < g->nnodes; i++) rc = run_node(&r, i, err, err_len);
    for (int o = 0; !rc && o < g->noutputs; o++) {
        int v = g->outputs[o];
        const struct tensor *t = &r.t[v];
        if (!t->data && tensor_numel(t) != 0)
            rc = status_set(err, err_len, STATUS_INTERNAL, "output '%s' is not computed", g->values[v].name);
        else if (r.owned[v] && r.left[v] == 1) {
            outputs[o] = *t; /* its last reader: the block moves */
            r.owned[v] = 0;
            r.left[v] = 0;
        } else if (copy_owned(&outputs[o], t)) {
            rc = status_set(err, err_len, STATUS_NOMEM, "out of memory for output '%s'", g->values[v].name);
        } else {
            r.left[v]--;
        }
    }
    vr_free(&r);
    if (rc)
        for (int o = 0; o < g->noutputs; o++) tensor_free_data(&outputs[o]);
    return rc;
}
