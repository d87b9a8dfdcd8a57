/* onnx_load.h - ONNX files (ModelProto, TensorProto) to kiln's graph IR.
 *
 * The loader treats every file as hostile: a truncated or garbage protobuf,
 * a cyclic graph, an unknown operator, absurd dims or a tensor that claims
 * more data than it holds all fail with a message naming the node or tensor.
 * Allocation is bounded by the bytes actually present: nothing is sized from
 * a declared shape before the data backing it has been checked.
 *
 * Limits: rank <= TENSOR_MAX_DIMS, at most ONNX_MAX_ELEMENTS elements per
 * tensor, nested messages at most ONNX_MAX_DEPTH deep.
 * Thread-safety: every function is reentrant; nothing global is kept. */
#ifndef KILN_ONNX_LOAD_H
#define KILN_ONNX_LOAD_H

#include <stddef.h>

#include "common/tensor.h"
#include "graph/graph.h"

#define ONNX_MAX_ELEMENTS (INT64_C(1) << 31)
#define ONNX_MAX_DEPTH 64
#define ONNX_MAX_MESSAGES (1 << 22) /* total protobuf messages in one file */

struct Onnx__TensorProto;

/* Loads model.onnx into a graph: initializers become constant values,
 * graph inputs that are not initializers become VALUE_INPUT values (dims
 * -1 with dim_param set where symbolic), every node's op is resolved with
 * op_find() and its opset recorded, and nodes are topologically sorted.
 * External data files are read from the model's folder. Returns NULL with
 * err set on any problem. */
struct graph *onnx_load_file(const char *path, char *err, size_t err_len);

/* Same from bytes in memory; base_dir is the folder for external data
 * (NULL: external data is refused). The buffer is not kept. */
struct graph *onnx_load_buffer(const void *buf, size_t len, const char *base_dir, char *err, size_t err_len);

/* Converts a TensorProto to a tensor whose data is malloc'd (owned by the
 * caller; one block in common/tensor.h's layout, strings included: see
 * onnx_tensor_clear). An empty tensor still gets a non-NULL data pointer so
 * that it reads as a constant. base_dir as for onnx_load_buffer. Returns 0
 * or a negative status with err naming the tensor. */
int onnx_tensor_from_proto(const struct Onnx__TensorProto *tp, const char *base_dir, struct tensor *out,
                           char *err, size_t err_len);

/* Reads a serialized TensorProto file (.pb), as ONNX's test data and
 * `kiln run --input` use. *name (if name non-NULL) gets a malloc'd copy of
 * the tensor's name ("" if none). Returns 0 or a negative status. */
int onnx_load_tensor_file(const char *pb_path, struct tensor *out, char **name, char *err, size_t err_len);

/* Frees a tensor's data made by the functions above (tensor_free_data) and
 * sets data to NULL; NULL t is a no-op. */
void onnx_tensor_clear(struct tensor *t);

#endif
