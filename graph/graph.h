/* graph.h - kiln's graph IR: values (named tensors) and nodes (operators).
 *
 * A graph owns everything it points to. Values are referenced by index;
 * node inputs use -1 for an absent optional input. Nodes are kept in
 * topological order once graph_toposort() succeeds (the loader calls it).
 *
 * A value whose t.data is non-NULL is a constant (initializer, Constant
 * node output or folded); its data is owned by the graph (freed by graph_free).
 * Graph inputs have dims from the ONNX file; a symbolic or unknown dim is -1
 * with its name, if any, in dim_param[]. */
#ifndef KILN_GRAPH_H
#define KILN_GRAPH_H

#include "common/tensor.h"

enum attr_type { /* ONNX AttributeProto.AttributeType values */
    ATTR_UNDEFINED = 0,
    ATTR_FLOAT = 1,
    ATTR_INT = 2,
    ATTR_STRING = 3,
    ATTR_TENSOR = 4,
    ATTR_GRAPH = 5,
    ATTR_FLOATS = 6,
    ATTR_INTS = 7,
    ATTR_STRINGS = 8,
    ATTR_GRAPHS = 10,
};

struct graph_attr {
    char *name;
    enum attr_type type;
    int64_t i;
    float f;
    char *s;          /* ATTR_STRING: NUL-terminated copy (s_len bytes before the NUL) */
    size_t s_len;
    int n;            /* element count for FLOATS / INTS / STRINGS */
    int64_t *ints;
    float *floats;
    char **strings;   /* ATTR_STRINGS: each NUL-terminated, but lens says where it ends */
    size_t *lens;     /* ATTR_STRINGS: each string's bytes (a NUL may be one); NULL: up to its NUL */
    struct tensor *t; /* ATTR_TENSOR: owned, data owned */
    /* ATTR_GRAPH (n = 1) and ATTR_GRAPHS (n graphs): owned subgraphs (If's
     * branches, Loop's and Scan's body). */
    struct graph **graphs;
};

enum graph_value_flags {
    VALUE_INPUT = 1,  /* a graph input the caller feeds */
    VALUE_OUTPUT = 2, /* a graph output */
    /* An initializer the file also lists as a graph input (ONNX IR >= 4: a
     * default a caller may override); the loader keeps it a constant. */
    VALUE_LISTED_INPUT = 4,
};

struct graph_value {
    char *name;
    struct tensor t;  /* dtype, shape (ndim -1 if rank unknown), data if constant */
    char *dim_param[TENSOR_MAX_DIMS];
    int producer;     /* index of the producing node, -1 for inputs and constants */
    unsigned flags;
};

/* Activation fused into the node that produces a value (see kernels/ops.h). */
enum act_kind {
    ACT_NONE = 0,
    ACT_RELU,
    ACT_LEAKY_RELU, /* alpha */
    ACT_CLIP,       /* alpha = min, beta = max */
    ACT_SIGMOID,
    ACT_TANH,
    ACT_GELU,       /* exact (erf) form */
    ACT_HARD_SIGMOID, /* alpha, beta */
    ACT_HARD_SWISH,
    ACT_SILU,         /* x * sigmoid(x) (CPU only: passes_fuse_silu) */
    ACT_QDQ,          /* alpha = scale, beta = lo: scale * clip(round(x / scale), lo, lo + 255), an 8-bit
                         QuantizeLinear and its DequantizeLinear (CPU only: passes_fuse_fake_quant) */
};

struct graph_node {
    char *name;     /* never NULL: the loader invents "<op_type>_<index>" when empty */
    char *op_type;
    char *domain;   /* "" for the default domain, "ai.onnx.ml"... */
    int opset;      /* opset version in force for this node's domain */
    int *in;
    int nin;
    int *out;
    int nout;
    struct graph_attr *attrs;
    int nattr;
    const struct op_def *op; /* resolved by the loader; NULL never survives loading */
    /* Set by fusion passes. A fused activation is applied by the node's kernel
     * to its (single) output after everything else. */
    enum act_kind act;
    float act_alpha, act_beta;
    /* With act_affine, y = act(...) * act_scale + act_shift, each rounded as
     * the Mul and Add it replaces (passes_fuse_post_affine: Conv alone). */
    int act_affine;
    float act_scale, act_shift;
};

struct graph {
    char *name;
    struct graph_value *values;
    int nvalues, values_cap;
    struct graph_node *nodes;
    int nnodes, nodes_cap;
    int *inputs;      /* value indices of real inputs (initializers excluded), in ONNX order */
    int ninputs;
    int *outputs;     /* value indices of graph outputs, in ONNX order */
    int noutputs;
    int64_t opset_default; /* "" / "ai.onnx" domain */
    int64_t opset_ml;      /* "ai.onnx.ml" domain, 0 if not imported */
    int64_t ir_version;
    char *producer_name;
    void *name_index;      /* private hash: name -> value index */
    /* Subgraphs: the last ncaptured entries of inputs[] are values of an
     * enclosing graph the body reads (ONNX's outer-scope names). The node
     * that owns the subgraph receives each of them as an extra input after
     * its ONNX inputs: captured input j arrives on the node's input
     * capture_in[j], so the enclosing graph's order, liveness and planning
     * see the dependency like any other. 0 and NULL at the top level. */
    int ncaptured;
    int *capture_in;
};

struct graph *graph_create(void);
void graph_free(struct graph *g); /* NULL is a no-op */

/* Returns the index of the value with this name, or -1. */
int graph_find_value(const struct graph *g, const char *name);
/* Returns the index of the value with this name, creating it (dtype undefined,
 * ndim -1) when absent; -1 on allocation failure. */
int graph_intern_value(struct graph *g, const char *name);
/* Creates a new value named name, or name with '_' appended until no value
 * has it (a rewrite's intermediate); its index, or -1 on allocation failure. */
int graph_new_value(struct graph *g, const char *name);
/* Appends a node (copies op_type/domain/name; in/out arrays are copied);
 * returns its index or -1. */
int graph_add_node(struct graph *g, const char *name, const char *op_type, const char *domain,
                   const int *in, int nin, const int *out, int nout);

/* Reorders nodes topologically and sets each value's producer. Fails with a
 * message naming a node on a cycle, or a value that nothing produces. */
int graph_toposort(struct graph *g, char *err, size_t err_len);

/* String i of an ATTR_STRINGS attribute as a DT_STRING element: its
 * counted bytes (ONNX's attribute strings are bytes, NULs included). */
static inline struct tensor_str graph_attr_str(const struct graph_attr *a, int i) {
    if (!a->lens) return tensor_str_of(a->strings[i]);
    struct tensor_str s = {a->strings[i], a->lens[i]};
    return s;
}

/* Frees what an attribute owns (its name, strings, arrays, tensor). */
void graph_attr_clear(struct graph_attr *a);

/* Attribute lookups on a node; the default is returned when absent. */
const struct graph_attr *node_attr(const struct graph_node *n, const char *name);
int64_t node_attr_int(const struct graph_node *n, const char *name, int64_t def);
float node_attr_float(const struct graph_node *n, const char *name, float def);
const char *node_attr_str(const struct graph_node *n, const char *name, const char *def);
/* Returns the count and sets *out, or -1 (and *out = NULL) when absent. */
int node_attr_ints(const struct graph_node *n, const char *name, const int64_t **out);
int node_attr_floats(const struct graph_node *n, const char *name, const float **out);
const struct tensor *node_attr_tensor(const struct graph_node *n, const char *name);
/* Sets an integer attribute (a kiln-internal decision a pass records for
 * the kernel), replacing one of that name; 0, or -1 out of memory. */
int node_set_attr_int(struct graph_node *n, const char *name, int64_t v);
int node_set_attr_str(struct graph_node *n, const char *name, const char *v); /* the same, a string */
/* The subgraph held by an ATTR_GRAPH attribute, or NULL. */
const struct graph *node_attr_graph(const struct graph_node *n, const char *name);
/* Inputs of a subgraph that its op defines (the others are captured). */
static inline int graph_nformal(const struct graph *g) { return g->ninputs - g->ncaptured; }

#endif
