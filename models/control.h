/* control.h - ONNX control flow: If, Loop and Scan.
 *
 * Their subgraphs (graph/graph.h: values read from an enclosing graph arrive
 * as extra inputs of the node) run through the engine's own planner: an
 * op's prepared state holds plans of its subgraph, one per shape signature
 * of the subgraph's inputs, and an executor that runs them, iteration after
 * iteration. The node's output shapes are fixed when the enclosing plan is
 * built: If's condition known then (or both branches giving one shape),
 * Loop's trip count known then (or loop-carried values of one shape and no
 * scan outputs), Scan's from its inputs' shapes. Anything else fails with a
 * message naming the node; the model API then retries with small inputs
 * bound, so a condition or trip count fed by the caller plans per value.
 *
 * These ops live here, above kernels/, because they call the planner; the
 * loader looks them up before the kernels' op table. */
#ifndef KILN_CONTROL_H
#define KILN_CONTROL_H

#include "kernels/ops.h"

/* If, Loop or Scan of the default domain; NULL for any other op. */
const struct op_def *control_op_find(const char *domain, const char *op_type);

#endif
