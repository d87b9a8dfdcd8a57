/* valrun.h - a graph run node by node on the CPU with every value known.
 *
 * A plan fixes every shape when it is built, from the input shapes alone. A
 * node whose output shape depends on values computed at run time (NonZero,
 * NonMaxSuppression, TopK of a computed K, an If whose branches differ in
 * shape) cannot be planned: building says STATUS_DATA_DEPENDENT. Such a
 * request runs here instead: the nodes in order, each evaluated with its
 * actual input tensors (models/eval.h: infer with the values known,
 * allocate, prepare, run, release), an If running only its taken branch, and
 * each value freed after its last reader. Slower than a plan (a kernel is
 * prepared per node per request), and the output shapes may differ per
 * request, so such a model is not batched. */
#ifndef KILN_VALRUN_H
#define KILN_VALRUN_H

#include <stddef.h>

#include "common/tensor.h"
#include "graph/graph.h"

/* Runs g on inputs (g->ninputs host tensors, borrowed, checked by the
 * caller). Each of g->noutputs outputs gets an owned block (common/tensor.h's
 * layout) that the caller frees with tensor_free_data. Returns 0 or a
 * negative status with a message naming the node; on error no output is
 * left allocated. Thread-safe: g is only read. */
int valrun_graph(const struct graph *g, const struct tensor *inputs, struct tensor *outputs, char *err,
                 size_t err_len);

#endif
