/* ops.h - the operator table: for each ONNX operator, its shape rule and its
 * CPU reference kernel, side by side (as ONNX keeps an op's schema and its
 * reference together). Backends other than the CPU dispatch on op_type and
 * use infer() from here, so every backend agrees on shapes.
 *
 * Tables live per family in kernels/cpu/ops_<family>.c, each an array
 * terminated by an entry with op_type == NULL; kernels/ops.c lists the tables.
 *
 * Contract of the callbacks, all given one struct op_call:
 *  - infer: sets dtype, ndim and dims of every out[i] from the inputs' dtypes
 *    and shapes and the node's attributes. in[i]->data is non-NULL when that
 *    input is constant at plan time (always so for shape-like inputs such as
 *    Reshape's shape, once constant folding ran) and NULL otherwise; an op that
 *    needs a value it does not have fails with a message. Absent optional
 *    inputs are NULL pointers in in[]. Never touches out[i]->data.
 *  - prepare (optional): called once per plan with concrete shapes; may
 *    build a primitive (oneDNN) into *state and ask for scratch bytes.
 *  - run: computes out[i]->data (already allocated, out[i] shapes set) from
 *    in[i]->data. Must honour node->act (fused activation) if the op declares
 *    OP_FUSE_ACT. Must not allocate on the heap per call when it can use
 *    scratch. Threads: may use OpenMP.
 *  - release (optional): frees what prepare made.
 * Errors: return a negative status after op_error(c, ...), which prefixes
 * the node's name and op type. */
#ifndef KILN_OPS_H
#define KILN_OPS_H

#include <math.h>
#include <string.h>

#include "common/status.h"
#include "common/tensor.h"
#include "graph/graph.h"

#define OP_MAX_IO 64 /* Concat/Sum/Max/Min/Mean may have many inputs */

struct op_strpool;

struct op_call {
    const struct graph_node *node;
    const struct tensor *in[OP_MAX_IO];
    int nin;
    struct tensor *out[OP_MAX_IO];
    int nout;
    void *state;       /* from prepare */
    void *scratch;     /* scratch_size bytes asked for in prepare, 64-byte aligned */
    size_t scratch_size;
    int nthreads;      /* threads this call may use (>= 1) */
    struct op_strpool *strings; /* where run() makes new strings (op_string_new); NULL: none */
    char *err;
    size_t err_len;
};

/* Sets up a call of node n: everything zeroed, nin and nout from the node
 * (a caller with other counts sets them after), at least one thread, and
 * errors into err. The caller fills in[] and out[]. */
static inline void op_call_init(struct op_call *c, const struct graph_node *n, int nthreads, char *err,
                                size_t err_len) {
    memset(c, 0, sizeof *c);
    c->node = n;
    c->nin = n ? n->nin : 0;
    c->nout = n ? n->nout : 0;
    c->nthreads = nthreads > 0 ? nthreads : 1;
    c->err = err;
    c->err_len = err_len;
}

enum op_flags {
    OP_FUSE_ACT = 1,      /* run() applies node->act: fusion passes may fold activations in */
    OP_SHAPE_ONLY = 2,    /* output depends only on input shapes (Shape, Size): foldable once shapes are known */
    OP_ALIAS_INPUT0 = 4,  /* output 0 has the same bytes as input 0 (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout): the plan may skip the copy */
    OP_BIAS_INPUT = 8,    /* run() accepts an extra kiln-internal bias input (MatMul: in[2], 1-D over the last dim) added before the activation */
};

struct op_def {
    const char *op_type;
    const char *domain;  /* "" default, "ai.onnx.ml", "com.microsoft" */
    int (*infer)(struct op_call *c);
    int (*prepare)(struct op_call *c, void **state, size_t *scratch_size);
    int (*run)(struct op_call *c);
    void (*release)(void *state);
    unsigned flags;
};

/* Finds an operator; domain "ai.onnx" is the same as "". NULL if unknown. */
const struct op_def *op_find(const char *domain, const char *op_type);
/* Calls fn for every registered op (tests, docs, `kiln run --list-ops`). */
void op_foreach(void (*fn)(const struct op_def *op, void *arg), void *arg);

/* Formats "node 'name' (OpType): <msg>" into c->err; returns STATUS_INVALID. */
int op_error(struct op_call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Decoded parameters (ggml's op_params): an op whose run() needs its
 * attributes decodes them once, in prepare, into a struct allocated here
 * (zeroed; op_error and NULL when out of memory) and stored as its state;
 * op_params_free is then its release. run() reads the struct and never
 * looks an attribute up by name. */
void *op_params_alloc(struct op_call *c, size_t size);
void op_params_free(void *params);

/* Strings a kernel makes at run time (StringConcat, StringSplit, a case
 * change) for a string output, which is an array of {pointer, length} (common/tensor.h):
 * the caller of run() gives each call the pool of its executor, and the
 * strings live until that executor's next run, when the pool is emptied
 * (op_strpool_reset) after its outputs were copied out. The pool keeps its
 * blocks across resets, so a steady workload allocates nothing. One thread
 * at a time: a kernel makes its strings outside parallel loops. */
struct op_strpool *op_strpool_create(void);
void op_strpool_free(struct op_strpool *pool); /* NULL is a no-op */
void op_strpool_reset(struct op_strpool *pool); /* NULL is a no-op */
/* A NUL-terminated copy of s[0..len) in c->strings; NULL after op_error
 * when the call has no pool or memory ran out. */
char *op_string_new(struct op_call *c, const char *s, size_t len);
/* The same with the len bytes left for the caller to write (the NUL after
 * them is written). */
char *op_string_alloc(struct op_call *c, size_t len);

/* Applies a fused activation to one value. */
static inline float act_apply(enum act_kind act, float x, float a, float b) {
    switch (act) {
    case ACT_NONE: return x;
    case ACT_RELU: return x > 0 ? x : 0;
    case ACT_LEAKY_RELU: return x >= 0 ? x : a * x;
    case ACT_CLIP: return x < a ? a : (x > b ? b : x);
    case ACT_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case ACT_TANH: return tanhf(x);
    case ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case ACT_HARD_SIGMOID: { float y = a * x + b; return y < 0 ? 0 : (y > 1 ? 1 : y); }
    case ACT_HARD_SWISH: { float y = x / 6.0f + 0.5f; return x * (y < 0 ? 0 : (y > 1 ? 1 : y)); }
    case ACT_SILU: return x / (1.0f + expf(-x));
    case ACT_QDQ: { float q = nearbyintf(x / a); return a * (q < b ? b : (q > b + 255.0f ? b + 255.0f : q)); }
    }
    return x;
}

/* Applies node->act to n floats in place (no-op for ACT_NONE). */
void op_apply_act(const struct graph_node *node, float *x, int64_t n);

/* Helpers for infer(): numpy-style broadcast of a and b into out (dims and
 * ndim only); returns 0 or op_error. */
int op_broadcast_shape(struct op_call *c, const struct tensor *a, const struct tensor *b, struct tensor *out);
/* Normalizes a possibly negative axis against rank; -1 with op_error if out of range. */
int op_axis(struct op_call *c, int64_t axis, int rank);
/* Reads element i of an integer tensor (INT32/INT64/UINT8/BOOL...) as int64. */
int64_t op_int_at(const struct tensor *t, int64_t i);
double op_double_at(const struct tensor *t, int64_t i);

/* The family tables. */
extern const struct op_def op_defs_elementwise[];
extern const struct op_def op_defs_reduce[];
extern const struct op_def op_defs_shape[];
extern const struct op_def op_defs_grid[];
extern const struct op_def op_defs_resize[];
extern const struct op_def op_defs_nms[];
extern const struct op_def op_defs_scan[];
extern const struct op_def op_defs_nn[];
extern const struct op_def op_defs_ml[];
extern const struct op_def op_defs_ml_encode[];
extern const struct op_def op_defs_softmax_fused[];
extern const struct op_def op_defs_rnn[];
extern const struct op_def op_defs_einsum[];
extern const struct op_def op_defs_attention[];
extern const struct op_def op_defs_signal[];
extern const struct op_def op_defs_string[];
extern const struct op_def op_defs_image[];
extern const struct op_def op_defs_contrib[];
extern const struct op_def op_defs_contrib_matmul[];
extern const struct op_def op_defs_contrib_qlinear[];

#endif
