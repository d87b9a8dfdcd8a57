/* eval.h - one node evaluated on the CPU, outside any plan.
 *
 * Constant folding runs nodes whose inputs are all known: at load time
 * (models/passes.c) and at plan time for values a shape makes constant
 * (models/plan_build.c). Both use this, so neither calls into the other. */
#ifndef KILN_EVAL_H
#define KILN_EVAL_H

#include <stddef.h>

#include "common/tensor.h"
#include "graph/graph.h"

/* One tensor larger than this is refused: no real model needs it, and a
 * hostile shape must fail with a message, not an allocation. */
#define EVAL_MAX_TENSOR_BYTES ((size_t)1 << 34)

/* The calling thread's bound on one tensor while it serves a request (the
 * server's --max-request-memory, set by model_run around a run): a shape
 * that needs more is refused before anything is allocated, naming the node.
 * 0 = EVAL_MAX_TENSOR_BYTES alone. Per thread, so plans and node-by-node
 * runs of one model see their request's bound without it in every call. */
void eval_set_max_bytes(size_t bytes);
size_t eval_max_bytes(void);

/* 0 if t, the inferred shape of node n's output vname, has a datatype, a
 * known rank and dims, and at most EVAL_MAX_TENSOR_BYTES (and the thread's
 * eval_max_bytes); otherwise a negative status with a message naming the
 * node and the output. */
int eval_check_shape(const struct graph_node *n, const struct tensor *t, const char *vname, char *err,
                     size_t err_len);

/* Evaluates one node on the CPU with host tensors: infers the output shapes,
 * allocates each out[i]->data with malloc (the caller frees), prepares, runs
 * and releases the kernel. in[i]->data may be NULL for the inputs of an
 * OP_SHAPE_ONLY op. Returns EVAL_TOO_LARGE (positive, nothing allocated)
 * when the outputs would take more than max_bytes together and more than
 * twice the constant inputs (an Expand of a scalar, not a Transpose of a
 * weight): such a node is better left to run. */
#define EVAL_TOO_LARGE 1
/* Light test models build their weights with ConstantOfShape, VGG's first
 * dense layer is 411 MB: folding must keep those; it refuses beyond this. */
#define EVAL_FOLD_MAX_BYTES ((size_t)1 << 30)
int eval_node(const struct graph_node *n, const struct tensor *const *in, int nin, struct tensor *out, int nout,
              size_t max_bytes, char *err, size_t err_len);

#endif
