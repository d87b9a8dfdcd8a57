/* passes_util.h - the pass runner of passes.c for the passes kept in files
 * of their own (passes_dynq.c). Private to models/. */
#ifndef KILN_PASSES_UTIL_H
#define KILN_PASSES_UTIL_H

#include <stddef.h>
#include <string.h>

#include "graph/graph.h"

/* onnxruntime's QLinearAdd (com.microsoft) with its eight inputs, as the
 * QDQ fusion leaves residual sums of 8-bit values. */
static inline int is_qlinear_add(const struct graph_node *n) {
    return strcmp(n->domain, "com.microsoft") == 0 && strcmp(n->op_type, "QLinearAdd") == 0 && n->nin >= 8;
}

/* QLinearGlobalAveragePool of an x in ONNX's layout (channels_last 0): it
 * reads NHWC bytes too (kiln_layout 1); its [N, C, 1, 1] output is the
 * same either way. */
static inline int is_qgap_nchw(const struct graph_node *n) {
    return strcmp(n->domain, "com.microsoft") == 0 && strcmp(n->op_type, "QLinearGlobalAveragePool") == 0 &&
           !node_attr_int(n, "channels_last", 0);
}

/* What a pass's rewrite of one node sees: the graph; how many nodes (and
 * graph outputs, which is_out marks) read each value when the pass began;
 * the nodes removed so far, dropped from the graph when the pass ends; and
 * the pass's own state. */
struct pass {
    struct graph *g;
    int *nuse;
    unsigned char *is_out;
    unsigned char *dead;
    void *ctx;
    const char *what;
    char *err;
    size_t err_len;
};

/* A rewrite of node i: 1 if it changed the graph (marking dead the nodes it
 * replaced), 0 if not, or a negative status with its message. */
typedef int (*pass_node_fn)(struct pass *ps, int i);

struct pass_def {
    const char *what;      /* its out-of-memory message: "out of memory <what>" */
    pass_node_fn rewrite;
    int backwards;         /* last node first: a value's readers are seen before its producer */
};

/* Runs def's rewrite on every node, then removes the nodes it marked dead
 * (the others keep their order, so the graph stays sorted). *ndone, if
 * non-NULL, gets the number of rewrites; it stays 0 when the pass fails, and
 * then nothing is removed. */
int pass_run(const struct pass_def *def, struct graph *g, void *ctx, int *ndone, char *err, size_t err_len);
/* Sets "out of memory <what>" and returns STATUS_NOMEM. */
int pass_nomem(struct pass *ps);
/* 1 if n is op_type of the default domain. */
int pass_is_op(const struct graph_node *n, const char *op_type);
/* Value v's constant tensor, or NULL (v < 0 included). */
const struct tensor *pass_const_of(const struct graph *g, int v);
/* Value v's dtype where the file or its producers say it, else DT_UNDEFINED. */
enum dtype pass_known_dtype(const struct graph *g, int v);
/* Replaces node n's attributes with copies of src[0..nat) (scalars and
 * strings); -1 when out of memory, n unchanged. */
int pass_set_attrs(struct graph_node *n, const struct graph_attr *src, int nat);
/* The sole live reader of node i's output 0 that is op (that output no
 * graph output), or -1. */
int pass_next_op(struct pass *ps, int i, const char *op);
/* The live producer of v when it is op (one output) and v has one reader
 * and is no graph output, or -1. */
int pass_sole_producer(struct pass *ps, int v, const char *op);
/* Binary node n's input other than v, or -1 when n does not read v. */
static inline int pass_other_of(const struct graph_node *n, int v) {
    return n->in[0] == v ? n->in[1] : n->in[1] == v ? n->in[0] : -1;
}
/* For a binary node n reading v: its other input when that is a scalar
 * FP32/FP64 constant within 1e-4 of want (either order), else -1 (-2: n
 * does not read v). */
int pass_other_input(const struct graph *g, const struct graph_node *n, int v, double want);
/* Turns node ni into op_type (domain) with inputs in[0..nin) (copied),
 * keeping its attributes when keep_attrs. 1, 0 when no kernel has that
 * op, or STATUS_NOMEM after pass_nomem. */
int pass_become(struct pass *ps, int ni, const char *domain, const char *op_type, const int *in, int nin,
                int keep_attrs);
/* Node pi takes over output 0 of node ai, its output's one reader, and ai
 * goes when the pass ends. */
void pass_take_output(struct pass *ps, int pi, int ai);

#endif
