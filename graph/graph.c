/* graph.c - kiln's graph IR: value table with a name index, nodes, attribute
 * lookups and topological ordering. */
#include "graph/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

/* ---- name index ---------------------------------------------------------
 * Open addressing over value indices (-1 = empty slot). The graph's value
 * array may be reallocated; the index only stores indices, so it survives. */
struct name_index {
    int *slots;
    size_t cap; /* power of two */
    size_t used;
};

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static int index_grow(struct graph *g, size_t want_cap) {
    struct name_index *ix = g->name_index;
    int *slots = malloc(want_cap * sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < want_cap; i++) slots[i] = -1;
    for (int v = 0; v < g->nvalues; v++) {
        size_t h = (size_t)name_hash(g->values[v].name) & (want_cap - 1);
        while (slots[h] >= 0) h = (h + 1) & (want_cap - 1);
        slots[h] = v;
    }
    free(ix->slots);
    ix->slots = slots;
    ix->cap = want_cap;
    ix->used = (size_t)g->nvalues;
    return 0;
}

struct graph *graph_create(void) {
    struct graph *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->name_index = calloc(1, sizeof(struct name_index));
    if (!g->name_index || index_grow(g, 64) != 0) {
        graph_free(g);
        return NULL;
    }
    return g;
}

void graph_attr_clear(struct graph_attr *a) {
    free(a->name);
    free(a->s);
    free(a->ints);
    free(a->floats);
    if (a->strings)
        for (int i = 0; i < a->n; i++) free(a->strings[i]);
    free(a->strings);
    free(a->lens);
    if (a->t) {
        tensor_free_data(a->t);
        free(a->t);
    }
    if (a->graphs)
        for (int i = 0; i < (a->type == ATTR_GRAPHS ? a->n : 1); i++) graph_free(a->graphs[i]);
    free(a->graphs);
}

void graph_free(struct graph *g) {
    if (!g) return;
    for (int i = 0; i < g->nvalues; i++) {
        struct graph_value *v = &g->values[i];
        free(v->name);
        tensor_free_data(&v->t);
        for (int d = 0; d < TENSOR_MAX_DIMS; d++) free(v->dim_param[d]);
    }
    free(g->values);
    for (int i = 0; i < g->nnodes; i++) {
        struct graph_node *n = &g->nodes[i];
        free(n->name);
        free(n->op_type);
        free(n->domain);
        free(n->in);
        free(n->out);
        for (int a = 0; a < n->nattr; a++) graph_attr_clear(&n->attrs[a]);
        free(n->attrs);
    }
    free(g->nodes);
    free(g->inputs);
    free(g->outputs);
    free(g->capture_in);
    free(g->name);
    free(g->producer_name);
    if (g->name_index) {
        free(((struct name_index *)g->name_index)->slots);
        free(g->name_index);
    }
    free(g);
}

int graph_find_value(const struct graph *g, const char *name) {
    if (!g || !name) return -1;
    const struct name_index *ix = g->name_index;
    size_t h = (size_t)name_hash(name) & (ix->cap - 1);
    while (ix->slots[h] >= 0) {
        int v = ix->slots[h];
        if (v < g->nvalues && strcmp(g->values[v].name, name) == 0) return v;
        h = (h + 1) & (ix->cap - 1);
    }
    return -1;
}

int graph_intern_value(struct graph *g, const char *name) {
    if (!g || !name) return -1;
    int v = graph_find_value(g, name);
    if (v >= 0) return v;
    struct name_index *ix = g->name_index;
    /* Keep the load factor under 1/2 so probes stay short. */
    if ((ix->used + 1) * 2 > ix->cap && index_grow(g, ix->cap * 2) != 0) return -1;
    if (g->nvalues == g->values_cap) {
        int cap = g->values_cap ? g->values_cap * 2 : 32;
        struct graph_value *nv = realloc(g->values, (size_t)cap * sizeof *nv);
        if (!nv) return -1;
        g->values = nv;
        g->values_cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return -1;
    v = g->nvalues++;
    struct graph_value *val = &g->values[v];
    memset(val, 0, sizeof *val);
    val->name = copy;
    val->t.dtype = DT_UNDEFINED;
    val->t.ndim = -1;
    val->producer = -1;
    size_t h = (size_t)name_hash(name) & (ix->cap - 1);
    while (ix->slots[h] >= 0) h = (h + 1) & (ix->cap - 1);
    ix->slots[h] = v;
    ix->used++;
    return v;
}

int graph_new_value(struct graph *g, const char *name) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", name);
    while (graph_find_value(g, buf) >= 0) {
        size_t n = strlen(buf);
        if (n + 1 >= sizeof buf) return -1;
        buf[n] = '_';
        buf[n + 1] = 0;
    }
    return graph_intern_value(g, buf);
}

int graph_add_node(struct graph *g, const char *name, const char *op_type, const char *domain,
                   const int *in, int nin, const int *out, int nout) {
    if (!g || !op_type || nin < 0 || nout < 0) return -1;
    if (g->nnodes == g->nodes_cap) {
        int cap = g->nodes_cap ? g->nodes_cap * 2 : 32;
        struct graph_node *nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return -1;
        g->nodes = nn;
        g->nodes_cap = cap;
    }
    struct graph_node n;
    memset(&n, 0, sizeof n);
    char fallback[96];
    if (!name || !*name) {
        snprintf(fallback, sizeof fallback, "%s_%d", op_type, g->nnodes);
        name = fallback;
    }
    n.name = strdup(name);
    n.op_type = strdup(op_type);
    n.domain = strdup(domain ? domain : "");
    n.in = malloc((size_t)(nin ? nin : 1) * sizeof(int));
    n.out = malloc((size_t)(nout ? nout : 1) * sizeof(int));
    if (!n.name || !n.op_type || !n.domain || !n.in || !n.out) {
        free(n.name);
        free(n.op_type);
        free(n.domain);
        free(n.in);
        free(n.out);
        return -1;
    }
    if (nin) memcpy(n.in, in, (size_t)nin * sizeof(int));
    if (nout) memcpy(n.out, out, (size_t)nout * sizeof(int));
    n.nin = nin;
    n.nout = nout;
    g->nodes[g->nnodes] = n;
    return g->nnodes++;
}

/* ---- topological order --------------------------------------------------
 * Kahn's algorithm over node->node edges through values. Ties keep the file
 * order, so a graph already in order is left unchanged. */
int graph_toposort(struct graph *g, char *err, size_t err_len) {
    int nn = g->nnodes > 0 ? g->nnodes : 0, nv = g->nvalues > 0 ? g->nvalues : 0;
    size_t nn_sz = nn ? (size_t)nn : 1, nv_sz = nv ? (size_t)nv : 1;
    int rc = STATUS_NOMEM;
    int *producer = malloc(nv_sz * sizeof(int));
    int *indeg = calloc(nn_sz, sizeof(int));
    int *order = malloc(nn_sz * sizeof(int));
    int *nuse = calloc(nv_sz + 1, sizeof(int)); /* CSR: consumers per value */
    int *users = NULL;
    unsigned char *done = calloc(nn_sz, 1);
    if (!producer || !indeg || !order || !nuse || !done) goto out;
    for (int v = 0; v < nv; v++) producer[v] = -1;

    for (int i = 0; i < nn; i++) {
        const struct graph_node *n = &g->nodes[i];
        for (int o = 0; o < n->nout; o++) {
            int v = n->out[o];
            if (v < 0) continue;
            if (v >= nv) {
                rc = status_set(err, err_len, STATUS_INVALID, "node '%s' (%s): output %d refers to no value",
                                n->name, n->op_type, o);
                goto out;
            }
            if (producer[v] >= 0) {
                rc = status_set(err, err_len, STATUS_INVALID,
                                "value '%s' is produced twice, by node '%s' and node '%s'", g->values[v].name,
                                g->nodes[producer[v]].name, n->name);
                goto out;
            }
            if (g->values[v].flags & VALUE_INPUT) {
                rc = status_set(err, err_len, STATUS_INVALID,
                                "node '%s' (%s) writes '%s', which is a graph input", n->name,
                                n->op_type, g->values[v].name);
                goto out;
            }
            producer[v] = i;
        }
    }
    /* Each input value must be a graph input, a constant, or produced. */
    size_t nedges = 0;
    for (int i = 0; i < nn; i++) {
        const struct graph_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int v = n->in[k];
            if (v < 0) continue;
            if (v >= nv) {
                rc = status_set(err, err_len, STATUS_INVALID, "node '%s' (%s): input %d refers to no value",
                                n->name, n->op_type, k);
                goto out;
            }
            const struct graph_value *val = &g->values[v];
            if (producer[v] < 0) {
                if (!val->t.data && !(val->flags & VALUE_INPUT)) {
                    rc = status_set(err, err_len, STATUS_INVALID,
                                    "node '%s' (%s): input '%s' is not a graph input, an initializer or "
                                    "the output of any node",
                                    n->name, n->op_type, val->name);
                    goto out;
                }
                continue;
            }
            indeg[i]++;
            nuse[v + 1]++;
            nedges++;
        }
    }
    for (int o = 0; o < g->noutputs; o++) {
        int v = g->outputs[o];
        if (v < 0 || v >= nv) continue;
        const struct graph_value *val = &g->values[v];
        if (producer[v] < 0 && !val->t.data && !(val->flags & VALUE_INPUT)) {
            rc = status_set(err, err_len, STATUS_INVALID, "graph output '%s' is not produced by any node",
                            val->name);
            goto out;
        }
    }
    for (int v = 0; v < nv; v++) nuse[v + 1] += nuse[v];
    users = malloc((nedges ? nedges : 1) * sizeof(int));
    int *fill = calloc(nv_sz, sizeof(int));
    if (!users || !fill) {
        free(fill);
        goto out;
    }
    for (int i = 0; i < nn; i++) {
        const struct graph_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int v = n->in[k];
            if (v < 0 || producer[v] < 0) continue;
            users[nuse[v] + fill[v]++] = i;
        }
    }
    free(fill);

    /* Take the earliest ready node in file order each time (a min-heap of
     * ready node indices), so sorting is O(n log n) and stable. */
    int nout_done = 0, hn = 0;
    int *ready = malloc(nn_sz * sizeof(int));
    if (!ready) goto out;
#define HEAP_PUSH(x)                                                                                                   \
    do {                                                                                                               \
        int _i = hn++;                                                                                                 \
        ready[_i] = (x);                                                                                               \
        while (_i > 0 && ready[(_i - 1) / 2] > ready[_i]) {                                                            \
            int _p = (_i - 1) / 2, _t = ready[_p];                                                                     \
            ready[_p] = ready[_i];                                                                                     \
            ready[_i] = _t;                                                                                            \
            _i = _p;                                                                                                   \
        }                                                                                                              \
    } while (0)
    for (int i = 0; i < nn; i++)
        if (indeg[i] == 0) HEAP_PUSH(i);
    while (hn > 0) {
        int top = ready[0];
        ready[0] = ready[--hn];
        for (int i = 0;;) {
            int l = 2 * i + 1, r = l + 1, m = i;
            if (l < hn && ready[l] < ready[m]) m = l;
            if (r < hn && ready[r] < ready[m]) m = r;
            if (m == i) break;
            int t = ready[m];
            ready[m] = ready[i];
            ready[i] = t;
            i = m;
        }
        order[nout_done++] = top;
        done[top] = 1;
        const struct graph_node *n = &g->nodes[top];
        for (int o = 0; o < n->nout; o++) {
            int v = n->out[o];
            if (v < 0) continue;
            for (int u = nuse[v]; u < nuse[v + 1]; u++)
                if (--indeg[users[u]] == 0) HEAP_PUSH(users[u]);
        }
    }
#undef HEAP_PUSH
    free(ready);
    if (nout_done < nn) {
        int bad = -1;
        for (int i = 0; i < nn && bad < 0; i++)
            if (!done[i]) bad = i;
        rc = status_set(err, err_len, STATUS_INVALID, "graph has a cycle through node '%s' (%s)",
                        g->nodes[bad].name, g->nodes[bad].op_type);
        goto out;
    }
    struct graph_node *sorted = malloc(nn_sz * sizeof *sorted);
    if (!sorted) goto out;
    for (int i = 0; i < nn; i++) sorted[i] = g->nodes[order[i]];
    if (nn) memcpy(g->nodes, sorted, (size_t)nn * sizeof *sorted);
    free(sorted);
    for (int v = 0; v < nv; v++) g->values[v].producer = -1;
    for (int i = 0; i < nn; i++)
        for (int o = 0; o < g->nodes[i].nout; o++)
            if (g->nodes[i].out[o] >= 0) g->values[g->nodes[i].out[o]].producer = i;
    rc = 0;
out:
    if (rc == STATUS_NOMEM) status_set(err, err_len, STATUS_NOMEM, "out of memory sorting the graph");
    free(producer);
    free(indeg);
    free(order);
    free(nuse);
    free(users);
    free(done);
    return rc;
}

/* ---- attributes --------------------------------------------------------- */
const struct graph_attr *node_attr(const struct graph_node *n, const char *name) {
    for (int i = 0; i < n->nattr; i++)
        if (strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
    return NULL;
}

int64_t node_attr_int(const struct graph_node *n, const char *name, int64_t def) {
    const struct graph_attr *a = node_attr(n, name);
    if (!a) return def;
    if (a->type == ATTR_INT) return a->i;
    if (a->type == ATTR_FLOAT) return (int64_t)a->f;
    return def;
}

/* Sets a (its name and values owned by the node from here, freed on
 * failure), replacing the attribute of its name. */
static int set_attr(struct graph_node *n, struct graph_attr a) {
    for (int k = 0; k < n->nattr; k++)
        if (strcmp(n->attrs[k].name, a.name) == 0) {
            graph_attr_clear(&n->attrs[k]);
            n->attrs[k] = a;
            return 0;
        }
    struct graph_attr *at = realloc(n->attrs, (size_t)(n->nattr + 1) * sizeof *at);
    if (!at) {
        graph_attr_clear(&a);
        return -1;
    }
    n->attrs = at;
    at[n->nattr++] = a;
    return 0;
}

int node_set_attr_int(struct graph_node *n, const char *name, int64_t v) {
    char *nm = strdup(name);
    return nm ? set_attr(n, (struct graph_attr){.name = nm, .type = ATTR_INT, .i = v}) : -1;
}

int node_set_attr_str(struct graph_node *n, const char *name, const char *v) {
    char *nm = strdup(name), *s = strdup(v);
    if (!nm || !s) {
        free(nm);
        free(s);
        return -1;
    }
    return set_attr(n, (struct graph_attr){.name = nm, .type = ATTR_STRING, .s = s, .s_len = strlen(s)});
}

float node_attr_float(const struct graph_node *n, const char *name, float def) {
    const struct graph_attr *a = node_attr(n, name);
    if (!a) return def;
    if (a->type == ATTR_FLOAT) return a->f;
    if (a->type == ATTR_INT) return (float)a->i;
    return def;
}

const char *node_attr_str(const struct graph_node *n, const char *name, const char *def) {
    const struct graph_attr *a = node_attr(n, name);
    if (!a || a->type != ATTR_STRING || !a->s) return def;
    return a->s;
}

int node_attr_ints(const struct graph_node *n, const char *name, const int64_t **out) {
    const struct graph_attr *a = node_attr(n, name);
    if (!a || a->type != ATTR_INTS) {
        *out = NULL;
        return -1;
    }
    *out = a->ints;
    return a->n;
}

int node_attr_floats(const struct graph_node *n, const char *name, const float **out) {
    const struct graph_attr *a = node_attr(n, name);
    if (!a || a->type != ATTR_FLOATS) {
        *out = NULL;
        return -1;
    }
    *out = a->floats;
    return a->n;
}

const struct tensor *node_attr_tensor(const struct graph_node *n, const char *name) {
    const struct graph_attr *a = node_attr(n, name);
    if (!a || a->type != ATTR_TENSOR) return NULL;
    return a->t;
}

const struct graph *node_attr_graph(const struct graph_node *n, const char *name) {
    const struct graph_attr *a = node_attr(n, name);
    if (!a || a->type != ATTR_GRAPH || !a->graphs) return NULL;
    return a->graphs[0];
}
